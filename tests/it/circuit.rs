//! A forward action's circuit and `give_up_after` through the real binary
//! and a real downstream on 127.0.0.1 that a test takes down and brings
//! back (`Downstream::set_down`), on both backends: a downstream down
//! longer than `give_up_after` makes no dead letter and every job is
//! delivered once when it is back; at most one request in flight while
//! open (also across two PostgreSQL instances); `health` probes leave the
//! jobs alone; a job the downstream refuses while others succeed still
//! fails; a pause wins over probes; `reconcile` lists the open circuit
//! (exit 1) and `probe` makes the next probe due.

use std::time::Duration;

use serde_json::Value;

use crate::backend::{Backend, both_backends};
use crate::downstream::{Behavior, Downstream};
use crate::harness::{Client, HTTP_TIMEOUT, Server, ServerConfig, wait_until};
use crate::helpers::api;
use crate::sign;

const SECRET: &str = "whsec_it_circuit_0123456789";
const ADMIN_TOKEN: &str = "it-circuit-admin-token-5e1d-0123456789";
const WAIT: Duration = Duration::from_secs(40);

/// One forward action `shop/notify` to `ds`, a circuit after 3
/// consecutive failures (unless `extra` says), probes from 200 ms (doubling up to 1 s), and a
/// job given up after 3 s of failing; `extra` adds keys to the action.
fn config(ds: &Downstream, extra: &str) -> ServerConfig {
    let failures = if extra.contains("circuit_failures") {
        ""
    } else {
        "circuit_failures = 3\n"
    };
    ServerConfig::new()
        .set("forward_workers", "4")
        .set("admin_token", "\"env:IDEMHOOK_ADMIN_TOKEN\"")
        .tables(&format!(
            "[sources.shop]\nkind = \"stripe\"\nsecrets = [\"{SECRET}\"]\n\
             [[sources.shop.actions]]\nname = \"notify\"\nforward = \"{}/in\"\n\
             timeout = \"1s\"\nlease = \"2s\"\nretry_initial = \"100ms\"\nretry_max = \"1s\"\n\
             give_up_after = \"3s\"\n{failures}circuit_probe = \"200ms\"\n{extra}\n",
            ds.url()
        ))
}

fn start(backend: Backend, config: &ServerConfig) -> Server {
    Server::start_on(backend, config, &[("IDEMHOOK_ADMIN_TOKEN", ADMIN_TOKEN)])
}

fn event(id: &str) -> Vec<u8> {
    serde_json::json!({"id": id, "type": "invoice.paid", "data": {"object": {"id": id}}})
        .to_string()
        .into_bytes()
}

fn send(server: &Server, id: &str) {
    let body = event(id);
    let r = server.post("/hooks/shop", &sign::stripe_now(SECRET, &body), &body);
    assert_eq!(r.status, 200, "{}", r.text());
}

fn key(id: &str) -> String {
    format!("shop:{id}:notify")
}

fn jobs_with(server: &Server, status: &str) -> i64 {
    server.count("SELECT count(*) FROM jobs WHERE status = ?1", &[&status])
}

fn open_circuits(server: &Server) -> i64 {
    server.count(
        "SELECT count(*) FROM circuits WHERE opened_at IS NOT NULL",
        &[],
    )
}

fn waiting_on_circuit(server: &Server) -> i64 {
    server.count(
        "SELECT count(*) FROM jobs WHERE status = 'pending' AND waiting = 'circuit'",
        &[],
    )
}

fn metric(server: &Server, line_start: &str) -> Option<String> {
    let text = Client::new(HTTP_TIMEOUT)
        .get_with(
            &server.url("/metrics"),
            &[("Authorization".to_string(), format!("Bearer {ADMIN_TOKEN}"))],
        )
        .text();
    text.lines()
        .find(|l| l.starts_with(line_start))
        .map(|l| l[line_start.len()..].trim().to_string())
}

/// The downstream is down for twice `give_up_after`: its circuit opens,
/// the jobs wait on it with no dead letter and at most one request at
/// the downstream at a time (the probe); back up, every job is
/// delivered exactly once.
fn a_downstream_down_longer_than_give_up_after_makes_no_dead_letter(backend: Backend) {
    let ds = Downstream::start();
    ds.set_down(true);
    ds.set_delay(Duration::from_millis(30));
    let server = start(backend, &backend.config(config(&ds, "")));
    let ids: Vec<String> = (0..20).map(|i| format!("evt_down_{i}")).collect();
    for id in &ids {
        send(&server, id);
    }
    wait_until(WAIT, "the circuit opens", || open_circuits(&server) == 1);
    // Attempts already under way when it opened end within the delay.
    std::thread::sleep(Duration::from_millis(300));
    ds.reset_max_in_flight();
    let attempts_at_open = server.count("SELECT count(*) FROM attempts", &[]);
    // Down for longer than give_up_after (3 s).
    std::thread::sleep(Duration::from_secs(6));
    assert!(
        ds.max_in_flight() <= 1,
        "while open only the probe reaches the downstream: {} at once",
        ds.max_in_flight()
    );
    assert_eq!(jobs_with(&server, "failed"), 0, "no dead letter");
    assert!(waiting_on_circuit(&server) > 0, "jobs wait on the circuit");
    let probes = server.count("SELECT count(*) FROM attempts", &[]) - attempts_at_open;
    assert!(
        (1..=12).contains(&probes),
        "a few probes (200 ms doubling to 1 s), not an attempt per job: {probes}"
    );
    // What a job waiting on the circuit says, in the CLI and the API.
    let parked = server.texts(
        "SELECT event_id FROM jobs WHERE waiting = 'circuit' ORDER BY id DESC",
        &[],
    );
    let parked = parked.first().expect("a job waits on the circuit");
    let shown = server.run_cli(&["events", "show", "shop", parked, "--json"]);
    let job = &shown.json()["jobs"][0];
    assert_eq!(job["status"], "pending", "{job}");
    assert_eq!(job["waiting_for"], "circuit", "{job}");
    let (status, via_api) = api(
        &server,
        "GET",
        &format!("/api/events/shop/{parked}"),
        Some(ADMIN_TOKEN),
        b"",
    );
    assert_eq!(status, 200);
    assert_eq!(via_api["jobs"][0]["waiting_for"], "circuit", "{via_api}");
    assert_eq!(
        metric(
            &server,
            "idemhook_circuit_open{source=\"shop\",action=\"notify\"}"
        )
        .as_deref(),
        Some("1")
    );

    // A job that failed before the circuit opened, more than
    // give_up_after ago: its wait does not count, so one more failure
    // after the circuit closes is retried, not its end.
    let failing = server.texts(
        "SELECT event_id FROM jobs WHERE failing_since IS NOT NULL AND waiting = 'circuit'
          ORDER BY updated_at DESC",
        &[],
    );
    let failing = failing
        .first()
        .expect("a job that failed before the circuit opened waits on it");
    ds.script(&key(failing), Behavior::Fail500(1));
    ds.set_down(false);
    wait_until(WAIT, "every job done", || jobs_with(&server, "done") == 20);
    for id in &ids {
        assert_eq!(ds.effects(&key(id)), 1, "{id} delivered exactly once");
    }
    let refused = ds.posts_for(&key(failing));
    assert!(
        refused
            .iter()
            .any(|r| r.outcome == crate::downstream::Outcome::Failed500),
        "{failing} failed once more after the circuit closed"
    );
    assert_eq!(open_circuits(&server), 0);
    assert_eq!(
        metric(
            &server,
            "idemhook_circuit_open{source=\"shop\",action=\"notify\"}"
        )
        .as_deref(),
        Some("0")
    );
    assert_eq!(
        metric(
            &server,
            "idemhook_circuit_opened_total{source=\"shop\",action=\"notify\"}"
        )
        .as_deref(),
        Some("1")
    );
}

both_backends!(a_downstream_down_longer_than_give_up_after_makes_no_dead_letter);

/// A probe's failure counts toward neither its job's `max_attempts` nor
/// its `give_up_after`: with one failure opening the circuit and at most
/// two attempts per job, the probes go round three jobs (each failed
/// probe's job goes behind the others) for longer than `give_up_after`,
/// and none fails.
fn probes_count_toward_neither_max_attempts_nor_give_up_after(backend: Backend) {
    let ds = Downstream::start();
    ds.set_down(true);
    let extra = "circuit_failures = 1\nmax_attempts = 2";
    let server = start(backend, &backend.config(config(&ds, extra)));
    send(&server, "evt_p0");
    wait_until(WAIT, "the circuit opens", || open_circuits(&server) == 1);
    send(&server, "evt_p1");
    send(&server, "evt_p2");
    let attempts = || server.count("SELECT count(*) FROM attempts", &[]);
    // Probes 200 ms, 400 ms, 800 ms, then 1 s apart: seven take over 4 s.
    wait_until(WAIT, "seven probes", || attempts() >= 8);
    assert_eq!(jobs_with(&server, "failed"), 0, "no probe failure counted");
    let probed: Vec<i64> = ["evt_p0", "evt_p1", "evt_p2"]
        .iter()
        .map(|id| {
            server.count(
                "SELECT count(*) FROM attempts a JOIN jobs j ON j.id = a.job_id
                  WHERE j.event_id = ?1",
                &[id],
            )
        })
        .collect();
    assert!(
        probed.iter().all(|n| *n >= 2),
        "the probes went round the jobs, each past max_attempts: {probed:?}"
    );
    ds.set_down(false);
    wait_until(WAIT, "every job done", || jobs_with(&server, "done") == 3);
    assert_eq!(ds.total_effects(), 3);
}

both_backends!(probes_count_toward_neither_max_attempts_nor_give_up_after);

/// With `health`, a probe is a GET of it: no job is attempted while it
/// fails, and the jobs flow once it answers 2xx.
fn health_probes_leave_the_jobs_alone(backend: Backend) {
    let ds = Downstream::start();
    ds.set_down(true);
    let health = format!("health = \"{}/healthz\"", ds.url());
    let server = start(backend, &backend.config(config(&ds, &health)));
    let ids: Vec<String> = (0..6).map(|i| format!("evt_health_{i}")).collect();
    for id in &ids {
        send(&server, id);
    }
    wait_until(WAIT, "the circuit opens", || open_circuits(&server) == 1);
    std::thread::sleep(Duration::from_millis(300));
    let attempts = server.count("SELECT count(*) FROM attempts", &[]);
    let forwards = ds.requests().iter().filter(|r| r.method == "POST").count();
    let health_before = ds.health_checks();
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        server.count("SELECT count(*) FROM attempts", &[]),
        attempts,
        "no job attempted while health fails"
    );
    assert_eq!(
        ds.requests().iter().filter(|r| r.method == "POST").count(),
        forwards
    );
    assert!(
        ds.health_checks() > health_before,
        "the probes are GETs of health"
    );
    assert_eq!(jobs_with(&server, "failed"), 0);

    ds.set_down(false);
    wait_until(WAIT, "every job done", || jobs_with(&server, "done") == 6);
    for id in &ids {
        assert_eq!(ds.effects(&key(id)), 1, "{id} delivered exactly once");
    }
    assert_eq!(open_circuits(&server), 0);
}

both_backends!(health_probes_leave_the_jobs_alone);

/// Other jobs succeed: a job refused with 400 fails at once, and one the
/// downstream keeps answering 500 fails once it has failed for
/// `give_up_after`; neither opens the circuit.
fn a_job_the_downstream_refuses_while_others_succeed_still_fails(backend: Backend) {
    let ds = Downstream::start();
    // Ten failures in a row, not three: the broken job's quick first
    // retries must not line up between two successes.
    let server = start(
        backend,
        &backend.config(config(&ds, "circuit_failures = 10")),
    );
    ds.script(&key("evt_refused"), Behavior::Reject400);
    ds.script(&key("evt_broken"), Behavior::Fail500(10_000));
    send(&server, "evt_refused");
    send(&server, "evt_broken");
    // Other jobs keep succeeding while the broken one fails.
    let mut n = 0;
    wait_until(WAIT, "both refused jobs fail", || {
        send(&server, &format!("evt_ok_{n}"));
        n += 1;
        std::thread::sleep(Duration::from_millis(150));
        jobs_with(&server, "failed") == 2
    });
    assert_eq!(
        ds.posts_for(&key("evt_refused")).len(),
        1,
        "a 4xx fails at once"
    );
    let broken = ds.posts_for(&key("evt_broken"));
    assert!(
        broken.len() >= 3,
        "retried until give_up_after: {}",
        broken.len()
    );
    let span = broken[broken.len() - 1].at - broken[0].at;
    assert!(
        span >= Duration::from_millis(2_500),
        "given up by time, after about 3 s of failing: {span:?}"
    );
    assert_eq!(
        server.count("SELECT count(*) FROM circuits WHERE opened_count > 0", &[]),
        0,
        "the other jobs' successes kept the circuit closed"
    );
}

both_backends!(a_job_the_downstream_refuses_while_others_succeed_still_fails);

/// A paused action is not probed, even when its probe is due; resumed,
/// the probe runs and the jobs flow.
fn a_pause_wins_over_probes(backend: Backend) {
    let ds = Downstream::start();
    ds.set_down(true);
    let server = start(backend, &backend.config(config(&ds, "")));
    for i in 0..5 {
        send(&server, &format!("evt_pause_{i}"));
    }
    wait_until(WAIT, "the circuit opens", || open_circuits(&server) == 1);
    server.run_cli(&["pause", "shop/notify"]).assert_success();
    // An attempt (or probe) taken before the pause may still be on its
    // way: its result is recorded before the count is taken.
    wait_until(WAIT, "no attempt in flight", || {
        jobs_with(&server, "processing") == 0
    });
    let requests = ds.request_count();
    ds.set_down(false);
    // The probe was due long ago (200 ms to 1 s): nothing goes out.
    server.run_cli(&["probe", "shop/notify"]).assert_success();
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(ds.request_count(), requests, "no probe while paused");
    assert_eq!(open_circuits(&server), 1);

    server.run_cli(&["resume", "shop/notify"]).assert_success();
    wait_until(WAIT, "every job done", || jobs_with(&server, "done") == 5);
    assert_eq!(open_circuits(&server), 0);
    assert_eq!(ds.total_effects(), 5);
}

both_backends!(a_pause_wins_over_probes);

/// `reconcile` lists an open circuit as needing attention (exit 1, JSON
/// and admin API alike); `probe` (CLI, admin API) makes its next probe,
/// an hour away, due now.
fn reconcile_lists_an_open_circuit_and_probe_makes_it_due(backend: Backend) {
    let ds = Downstream::start();
    ds.set_down(true);
    let slow_probe = "circuit_probe = \"1h\"\nretry_max = \"2h\"";
    let config = ServerConfig::new()
        .set("forward_workers", "2")
        .set("admin_token", "\"env:IDEMHOOK_ADMIN_TOKEN\"")
        .tables(&format!(
            "[sources.shop]\nkind = \"stripe\"\nsecrets = [\"{SECRET}\"]\n\
             [[sources.shop.actions]]\nname = \"notify\"\nforward = \"{}/in\"\n\
             timeout = \"1s\"\nlease = \"2s\"\nretry_initial = \"100ms\"\n\
             give_up_after = \"3s\"\ncircuit_failures = 2\n{slow_probe}\n",
            ds.url()
        ));
    let server = start(backend, &backend.config(config));
    for i in 0..4 {
        send(&server, &format!("evt_rec_{i}"));
    }
    wait_until(WAIT, "the circuit opens", || open_circuits(&server) == 1);
    let report = server.run_cli(&["reconcile", "--json"]);
    assert_eq!(report.status.code(), Some(1), "{}", report.stdout);
    let json = report.json();
    assert_eq!(json["clean"], false);
    let circuit = &json["circuits"][0];
    assert_eq!(circuit["source"], "shop", "{json}");
    assert_eq!(circuit["action"], "notify");
    assert!(circuit["failures"].as_i64().unwrap_or(0) >= 2, "{circuit}");
    assert!(circuit["opened_at"].is_i64(), "{circuit}");
    let next = circuit["next_probe_at"].as_i64().unwrap_or(0);
    let opened = circuit["opened_at"].as_i64().unwrap_or(0);
    assert!(
        next - opened >= 2_000,
        "the first probe about 1 h away: {circuit}"
    );
    let text = server.run_cli(&["reconcile"]);
    assert!(
        text.stdout.contains("idemhook probe shop/notify"),
        "{}",
        text.stdout
    );
    let (status, via_api) = api(&server, "GET", "/api/reconcile", Some(ADMIN_TOKEN), b"");
    assert_eq!(status, 200);
    assert_eq!(via_api["circuits"][0]["action"], "notify", "{via_api}");
    let (status, actions) = api(&server, "GET", "/api/actions", Some(ADMIN_TOKEN), b"");
    assert_eq!(status, 200);
    assert_eq!(actions[0]["circuit"]["state"], "open", "{actions}");

    ds.set_down(false);
    std::thread::sleep(Duration::from_millis(1_500));
    assert_eq!(ds.total_effects(), 0, "the next probe is an hour away");
    let (status, probed) = api(
        &server,
        "POST",
        "/api/actions/shop/notify/probe",
        Some(ADMIN_TOKEN),
        b"{}".to_vec(),
    );
    assert_eq!(status, 200, "{probed}");
    assert_eq!(probed["probe_due"], true, "{probed}");
    wait_until(WAIT, "every job done", || jobs_with(&server, "done") == 4);
    assert_eq!(ds.total_effects(), 4);
    let clean = server.run_cli(&["reconcile", "--json"]);
    assert_eq!(clean.status.code(), Some(0), "{}", clean.stdout);
    assert_eq!(clean.json()["circuits"], Value::Array(vec![]));
    let closed = server.run_cli(&["probe", "shop/notify"]);
    closed.assert_success();
    assert!(closed.stdout.contains("not open"), "{}", closed.stdout);
}

both_backends!(reconcile_lists_an_open_circuit_and_probe_makes_it_due);

/// Two instances on one PostgreSQL database: one probe at a time in all.
#[test]
fn two_postgres_instances_send_one_probe_at_a_time() {
    if !Backend::Postgres.available("two_postgres_instances_send_one_probe_at_a_time") {
        return;
    }
    let ds = Downstream::start();
    ds.set_down(true);
    ds.set_delay(Duration::from_millis(30));
    let config = Backend::Postgres.config(config(&ds, ""));
    let a = start(Backend::Postgres, &config);
    let b = start(Backend::Postgres, &config);
    let ids: Vec<String> = (0..20).map(|i| format!("evt_two_{i}")).collect();
    for (i, id) in ids.iter().enumerate() {
        send(if i % 2 == 0 { &a } else { &b }, id);
    }
    wait_until(WAIT, "the circuit opens", || open_circuits(&a) == 1);
    std::thread::sleep(Duration::from_millis(300));
    ds.reset_max_in_flight();
    let before = ds.request_count();
    std::thread::sleep(Duration::from_secs(4));
    assert!(ds.request_count() > before, "the instances probe");
    assert!(
        ds.max_in_flight() <= 1,
        "one probe at a time across both instances: {} at once",
        ds.max_in_flight()
    );
    ds.set_down(false);
    wait_until(WAIT, "every job done", || jobs_with(&a, "done") == 20);
    for id in &ids {
        assert_eq!(ds.effects(&key(id)), 1, "{id} delivered exactly once");
    }
    assert_eq!(jobs_with(&a, "failed"), 0);
}
