//! Asking the downstream before sending again (`check`), reconciling
//! against its records (`reconcile --check`), and sending only after the
//! database effect (`after`).
//!
//! The downstream here cannot dedupe (`Downstream::start_without_dedupe`):
//! every forward it processes is an effect, repeats of a key too, so its
//! own count per key shows whether idemhook sent twice. Its check endpoint
//! (`GET /effects/{key}`) answers from those effects, or as scripted.

use std::time::Duration;

use serde_json::Value;

use crate::backend::{Backend, both_backends};
use crate::downstream::{Behavior, CheckBehavior, Downstream, Outcome, RecordedRequest};
use crate::harness::{CliOutput, HTTP_TIMEOUT, Server, ServerConfig, toml_str, wait_for};
use crate::helpers::{StripeHook, api, assert_accepted, job_status, stripe_source};

const SECRET: &str = "whsec_it_check_secret_0123456789";
const STRIPE: StripeHook = StripeHook::new(SOURCE, SECRET);
const ADMIN_TOKEN: &str = "it-check-admin-token-51c2-0123456789abcdef0123456789abcdef";
const SOURCE: &str = "stripe";
const ACTION: &str = "notify";
const JOBS_TIMEOUT: Duration = Duration::from_secs(40);

fn env() -> Vec<(&'static str, &'static str)> {
    vec![
        ("STRIPE_SECRET", SECRET),
        ("IDEMHOOK_ADMIN_TOKEN", ADMIN_TOKEN),
    ]
}

/// The forward action `notify` to `ds` with a check, small retry timings,
/// and `extra` raw TOML lines (which may set max_attempts or after).
fn notify(ds: &Downstream, timeout: &str, lease: &str, extra: &str) -> String {
    let max_attempts = if extra.contains("max_attempts") {
        String::new()
    } else {
        "max_attempts = 6\n".to_string()
    };
    format!(
        "[[sources.{SOURCE}.actions]]\nname = \"{ACTION}\"\nforward = {}\ncheck = {}\n\
         timeout = {}\nlease = {}\nretry_initial = \"100ms\"\nretry_max = \"300ms\"\n\
         {max_attempts}{extra}\n",
        toml_str(&format!("{}/in/{ACTION}", ds.url())),
        toml_str(&ds.check_template()),
        toml_str(timeout),
        toml_str(lease),
    )
}

fn config(ds: &Downstream, extra: &str) -> ServerConfig {
    ServerConfig::new()
        .set("admin_token", &toml_str("env:IDEMHOOK_ADMIN_TOKEN"))
        .tables(&stripe_source(SOURCE, ""))
        .tables(&notify(ds, "1s", "3s", extra))
}

fn key(event_id: &str) -> String {
    format!("{SOURCE}:{event_id}:{ACTION}")
}

fn body(id: &str) -> Vec<u8> {
    serde_json::json!({
        "id": id,
        "object": "event",
        "type": "charge.succeeded",
        "data": {"object": {"id": format!("ch_{id}"), "amount": 4200}}
    })
    .to_string()
    .into_bytes()
}

#[derive(Debug, Clone, PartialEq)]
struct Attempt {
    n: i64,
    outcome: String,
    http_status: Option<i64>,
    error_kind: Option<String>,
    worker: Option<String>,
    started_at: i64,
    finished_at: i64,
}

fn attempts(db: &Server, event_id: &str, action: &str) -> Vec<Attempt> {
    db.rows(
        "SELECT a.n, a.outcome, a.http_status, a.error_kind, a.worker, a.started_at, a.finished_at
         FROM attempts a JOIN jobs j ON j.id = a.job_id
         WHERE j.source = ?1 AND j.event_id = ?2 AND j.action = ?3 ORDER BY a.n",
        &[&SOURCE, &event_id, &action],
    )
    .iter()
    .map(|r| Attempt {
        n: r.int(0),
        outcome: r.text(1),
        http_status: r.opt_int(2),
        error_kind: r.opt_text(3),
        worker: r.opt_text(4),
        started_at: r.int(5),
        finished_at: r.int(6),
    })
    .collect()
}

/// (outcome, error_kind) of each attempt, for short assertions.
fn kinds(rows: &[Attempt]) -> Vec<(String, Option<String>)> {
    rows.iter()
        .map(|a| (a.outcome.clone(), a.error_kind.clone()))
        .collect()
}

fn kind(outcome: &str, error_kind: Option<&str>) -> (String, Option<String>) {
    (outcome.to_string(), error_kind.map(str::to_string))
}

/// The `checks` rows of a job: (n, answer, http_status).
fn recorded_checks(db: &Server, event_id: &str) -> Vec<(i64, String, Option<i64>)> {
    db.rows(
        "SELECT c.n, c.answer, c.http_status FROM checks c JOIN jobs j ON j.id = c.job_id
         WHERE j.source = ?1 AND j.event_id = ?2 AND j.action = ?3 ORDER BY c.id",
        &[&SOURCE, &event_id, &ACTION],
    )
    .iter()
    .map(|r| (r.int(0), r.text(1), r.opt_int(2)))
    .collect()
}

fn dump_jobs(db: &Server) -> String {
    format!(
        "----- jobs -----\n{}----- attempts -----\n{}----- checks -----\n{}",
        db.dump(
            "SELECT id, event_id, action, status, n_attempts, next_attempt_at, last_error FROM jobs ORDER BY id"
        ),
        db.dump(
            "SELECT job_id, n, outcome, http_status, error_kind, error, worker FROM attempts ORDER BY job_id, n"
        ),
        db.dump("SELECT job_id, n, answer, http_status, error FROM checks ORDER BY id")
    )
}

/// Waits until the job reaches `status`, failing at once if it settles in
/// the other final status.
fn wait_job(db: &Server, event_id: &str, action: &str, status: &str) {
    wait_for(
        JOBS_TIMEOUT,
        &format!("job {event_id}/{action} reaches {status}"),
        || match job_status(db, SOURCE, event_id, action) {
            Some(s) if s == status => Ok(()),
            Some(s) if s == "done" || s == "failed" => panic!(
                "job {event_id}/{action}\n  expected: {status}\n  got: {s}\n{}",
                dump_jobs(db)
            ),
            other => Err(format!("{other:?}")),
        },
    );
}

fn sequence(requests: &[RecordedRequest]) -> Vec<(String, Outcome)> {
    requests
        .iter()
        .map(|r| (r.method.clone(), r.outcome.clone()))
        .collect()
}

fn get(method_outcome: Outcome) -> (String, Outcome) {
    ("GET".to_string(), method_outcome)
}

fn post(method_outcome: Outcome) -> (String, Outcome) {
    ("POST".to_string(), method_outcome)
}

fn exit_code(out: &CliOutput) -> Option<i32> {
    out.status.code()
}

fn metrics_line(server: &Server, prefix: &str) -> Option<String> {
    // (admin_token is set and there is no admin_listen: /metrics takes it.)
    crate::harness::Client::new(HTTP_TIMEOUT)
        .get_with(
            &server.url("/metrics"),
            &[("Authorization".to_string(), format!("Bearer {ADMIN_TOKEN}"))],
        )
        .text()
        .lines()
        .find(|l| l.starts_with(prefix))
        .map(str::to_string)
}

// ---------------------------------------------------------------------------
// The worker asks before sending again
// ---------------------------------------------------------------------------

/// The downstream processes the first POST and cuts the connection before
/// answering: the retry asks, hears 200, and marks the job done without a
/// second POST. One effect.
fn a_connection_cut_after_the_request_is_checked_and_not_sent_again(backend: Backend) {
    let ds = Downstream::start_without_dedupe();
    ds.script(&key("evt_cut"), Behavior::ProcessThenDrop(1));
    let server = Server::start_on(backend, &config(&ds, ""), &env());
    assert_accepted(
        &STRIPE.deliver(&server, &body("evt_cut")),
        "evt_cut",
        "delivery",
    );
    let db = &server;
    wait_job(db, "evt_cut", ACTION, "done");

    assert_eq!(ds.effects(&key("evt_cut")), 1, "{}", dump_jobs(db));
    assert_eq!(
        sequence(&ds.requests_for(&key("evt_cut"))),
        vec![
            post(Outcome::ProcessedThenDropped { new_effect: true }),
            get(Outcome::Checked { found: true }),
        ],
        "one POST, then the check; no second POST"
    );
    let check = &ds.checks_for(&key("evt_cut"))[0];
    assert_eq!(check.path, "/effects/stripe%3Aevt_cut%3Anotify");
    assert_eq!(check.header("X-Idemhook-Event-Id"), Some("evt_cut"));
    let rows = attempts(db, "evt_cut", ACTION);
    assert_eq!(
        kinds(&rows),
        vec![
            kind("retry", Some("protocol")),
            kind("ok", Some("confirmed"))
        ],
        "{}",
        dump_jobs(db)
    );
    assert_eq!(rows[1].http_status, Some(200));
    assert_eq!(
        recorded_checks(db, "evt_cut"),
        vec![(2, "found".to_string(), Some(200))]
    );
    let state: String = db
        .one("SELECT state FROM events WHERE event_id = 'evt_cut'", &[])
        .text(0);
    assert_eq!(state, "completed");

    let found = metrics_line(
        &server,
        "idemhook_downstream_checks_total{source=\"stripe\",action=\"notify\",answer=\"found\"}",
    );
    assert_eq!(
        found.as_deref().map(|l| l.ends_with(" 1")),
        Some(true),
        "{found:?}"
    );
    let ok = metrics_line(
        &server,
        "idemhook_action_attempts_total{source=\"stripe\",action=\"notify\",outcome=\"ok\"}",
    );
    assert_eq!(
        ok.as_deref().map(|l| l.ends_with(" 1")),
        Some(true),
        "{ok:?}"
    );
}
both_backends!(a_connection_cut_after_the_request_is_checked_and_not_sent_again);

/// A 500 leaves no effect; the retry asks, hears 404, and sends once.
#[test]
fn a_404_check_sends_once() {
    let ds = Downstream::start_without_dedupe();
    ds.script(&key("evt_404"), Behavior::Fail500(1));
    let server = Server::start(&config(&ds, ""), &env());
    assert_accepted(
        &STRIPE.deliver(&server, &body("evt_404")),
        "evt_404",
        "delivery",
    );
    let db = &server;
    wait_job(db, "evt_404", ACTION, "done");

    assert_eq!(ds.effects(&key("evt_404")), 1, "{}", dump_jobs(db));
    assert_eq!(
        sequence(&ds.requests_for(&key("evt_404"))),
        vec![
            post(Outcome::Failed500),
            get(Outcome::Checked { found: false }),
            post(Outcome::Effect),
        ]
    );
    assert_eq!(
        kinds(&attempts(db, "evt_404", ACTION)),
        vec![kind("retry", Some("status")), kind("ok", None)]
    );
    assert_eq!(
        recorded_checks(db, "evt_404"),
        vec![(2, "not_found".to_string(), Some(404))]
    );
    // events show has every check, the ones that sent too.
    let shown = server
        .run_cli(&["events", "show", SOURCE, "evt_404", "--json"])
        .json();
    let checks = &shown["jobs"][0]["checks"];
    assert_eq!(
        (
            &checks[0]["n"],
            &checks[0]["answer"],
            &checks[0]["http_status"]
        ),
        (
            &Value::from(2),
            &Value::from("not_found"),
            &Value::from(404)
        ),
        "{shown:#}"
    );
    let text = server
        .run_cli(&["events", "show", SOURCE, "evt_404"])
        .stdout;
    assert!(
        text.contains("    check for #2 ") && text.contains(": not_found (http 404)"),
        "{text}"
    );
}

/// A check that answers 500, then one that hangs past the timeout: each is
/// a retry with error kind `check` after the usual backoff, and nothing is
/// sent until a check answers 404.
#[test]
fn a_failing_check_sends_nothing_and_is_retried_later() {
    let ds = Downstream::start_without_dedupe();
    let k = key("evt_500");
    ds.script(&k, Behavior::Fail500(1));
    ds.script_check(&k, CheckBehavior::Fail500(1));
    ds.script_check(&k, CheckBehavior::Hang(Duration::from_secs(5)));
    let server = Server::start(&config(&ds, ""), &env());
    assert_accepted(
        &STRIPE.deliver(&server, &body("evt_500")),
        "evt_500",
        "delivery",
    );
    let db = &server;
    wait_job(db, "evt_500", ACTION, "done");

    assert_eq!(ds.effects(&k), 1, "{}", dump_jobs(db));
    assert_eq!(
        sequence(&ds.requests_for(&k)),
        vec![
            post(Outcome::Failed500),
            get(Outcome::CheckFailed500),
            get(Outcome::CheckHung),
            get(Outcome::Checked { found: false }),
            post(Outcome::Effect),
        ],
        "nothing sent while the check fails"
    );
    let rows = attempts(db, "evt_500", ACTION);
    assert_eq!(
        kinds(&rows),
        vec![
            kind("retry", Some("status")),
            kind("retry", Some("check")),
            kind("retry", Some("check")),
            kind("ok", None),
        ],
        "{}",
        dump_jobs(db)
    );
    assert_eq!(rows[1].http_status, Some(500));
    for pair in rows.windows(2) {
        assert!(
            pair[1].started_at - pair[0].finished_at >= 100,
            "a retry waits retry_initial (100ms) at least: {rows:#?}"
        );
    }
    let answers: Vec<String> = recorded_checks(db, "evt_500")
        .into_iter()
        .map(|(n, a, _)| format!("{n}:{a}"))
        .collect();
    assert_eq!(answers, ["2:error", "3:error", "4:not_found"]);
    let errors = metrics_line(
        &server,
        "idemhook_downstream_checks_total{source=\"stripe\",action=\"notify\",answer=\"error\"}",
    );
    assert_eq!(
        errors.as_deref().map(|l| l.ends_with(" 2")),
        Some(true),
        "{errors:?}"
    );
}

/// kill -9 while the downstream holds a call it has already processed;
/// after the restart and the lease, the new worker asks before anything
/// is sent again, hears 200, and marks the job done. One POST, one effect.
fn kill9_during_a_slow_call_then_the_check_is_asked_before_any_resend(backend: Backend) {
    let ds = Downstream::start_without_dedupe();
    let k = key("evt_kill");
    ds.script(&k, Behavior::ProcessThenHang(Duration::from_secs(60)));
    // A longer timeout, so the kill lands while the call is held.
    let tables = ServerConfig::new()
        .tables(&stripe_source(SOURCE, ""))
        .tables(&notify(&ds, "3s", "7s", ""));
    let mut server = Server::start_on(backend, &tables, &env());
    assert_accepted(
        &STRIPE.deliver(&server, &body("evt_kill")),
        "evt_kill",
        "delivery",
    );
    wait_for(
        JOBS_TIMEOUT,
        "the POST reaches the downstream",
        || match ds.posts_for(&k).len() {
            0 => Err("no POST yet".to_string()),
            _ => Ok(()),
        },
    );
    server.kill9();
    server.restart();
    let db = &server;
    wait_job(db, "evt_kill", ACTION, "done");

    assert_eq!(ds.effects(&k), 1, "{}", dump_jobs(db));
    let requests = ds.requests_for(&k);
    assert_eq!(
        sequence(&requests),
        vec![
            post(Outcome::ProcessedThenHung { new_effect: true }),
            get(Outcome::Checked { found: true }),
        ],
        "after the takeover the check comes first, and nothing is resent"
    );
    assert!(
        requests[1].at - requests[0].at >= Duration::from_secs(7),
        "the check waited for the lease (7s): POST at {:?}, check at {:?}",
        requests[0].at,
        requests[1].at
    );
    assert_eq!(
        kinds(&attempts(db, "evt_kill", ACTION)),
        vec![kind("retry", Some("lease")), kind("ok", Some("confirmed"))],
        "{}",
        dump_jobs(db)
    );
}
both_backends!(kill9_during_a_slow_call_then_the_check_is_asked_before_any_resend);

// ---------------------------------------------------------------------------
// reconcile --check
// ---------------------------------------------------------------------------

fn checks_of(report: &Value) -> Vec<Value> {
    report["checks"].as_array().cloned().unwrap_or_default()
}

fn check_for<'a>(checks: &'a [Value], event_id: &str) -> &'a Value {
    checks
        .iter()
        .find(|c| c["event_id"] == event_id)
        .unwrap_or_else(|| panic!("no check for {event_id} in {checks:#?}"))
}

/// Failed jobs (one attempt allowed): one whose request was processed and
/// cut off (its effect exists), one the downstream refused (no effect).
/// `reconcile --check` says which is done downstream and changes nothing;
/// with `--yes` it marks that one done as a new attempt; the admin API
/// does the same for a third, failed later.
#[test]
fn reconcile_check_yes_marks_a_failed_job_done_when_its_effect_exists() {
    let ds = Downstream::start_without_dedupe();
    for id in ["evt_r_done", "evt_r_api"] {
        ds.script(&key(id), Behavior::ProcessThenDrop(1));
    }
    ds.script(&key("evt_r_none"), Behavior::Reject400);
    let server = Server::start(&config(&ds, "max_attempts = 1"), &env());
    let db = &server;
    for id in ["evt_r_done", "evt_r_none"] {
        assert_accepted(&STRIPE.deliver(&server, &body(id)), id, "delivery");
        wait_job(db, id, ACTION, "failed");
    }
    assert_eq!(ds.effects(&key("evt_r_done")), 1);
    assert_eq!(ds.effects(&key("evt_r_none")), 0);

    // Asking changes nothing.
    let asked = server.run_cli(&["reconcile", "--check", "--json"]);
    assert_eq!(exit_code(&asked), Some(1), "{asked:?}");
    let report = asked.json();
    assert_eq!(report["applied"], false);
    let checks = checks_of(&report);
    assert_eq!(checks.len(), 2, "{report:#}");
    let done = check_for(&checks, "evt_r_done");
    assert_eq!(
        (
            &done["answer"],
            &done["http_status"],
            &done["marked_done"],
            &done["status"]
        ),
        (
            &Value::from("found"),
            &Value::from(200),
            &Value::from(false),
            &Value::from("failed")
        )
    );
    assert_eq!(check_for(&checks, "evt_r_none")["answer"], "not_found");
    assert_eq!(
        job_status(db, SOURCE, "evt_r_done", ACTION).as_deref(),
        Some("failed")
    );
    let text = server.run_cli(&["reconcile", "--check"]);
    assert!(
        text.stdout
            .contains("stripe/evt_r_done  notify (failed, 1 attempt(s))  found (200)")
            && text
                .stdout
                .contains("next: idemhook reconcile --check --yes"),
        "{}",
        text.stdout
    );

    // --yes alone is a usage error (exit 2), not a report (exit 1).
    let alone = server.run_cli(&["reconcile", "--yes"]);
    assert_eq!(exit_code(&alone), Some(2), "{alone:?}");
    assert!(alone.stderr.contains("give --check --yes"), "{alone:?}");
    assert_eq!(
        job_status(db, SOURCE, "evt_r_done", ACTION).as_deref(),
        Some("failed")
    );

    // The CLI marks the found one done; the API is asked about the rest.
    let applied = server.run_cli(&["reconcile", "--check", "--yes", "--json"]);
    let report = applied.json();
    assert_eq!(report["applied"], true);
    let checks = checks_of(&report);
    let done = check_for(&checks, "evt_r_done");
    assert_eq!(
        (&done["marked_done"], &done["attempt"]),
        (&Value::from(true), &Value::from(2))
    );
    assert_eq!(check_for(&checks, "evt_r_none")["marked_done"], false);
    assert_eq!(
        job_status(db, SOURCE, "evt_r_done", ACTION).as_deref(),
        Some("done")
    );
    let rows = attempts(db, "evt_r_done", ACTION);
    assert_eq!(
        kinds(&rows),
        vec![
            kind("failed", Some("protocol")),
            kind("ok", Some("confirmed"))
        ]
    );
    assert_eq!(rows[1].worker.as_deref(), Some("reconcile:cli"));
    assert_eq!(
        recorded_checks(db, "evt_r_done"),
        vec![(2, "found".to_string(), Some(200))]
    );
    let state: String = db
        .one(
            "SELECT state FROM events WHERE event_id = 'evt_r_done'",
            &[],
        )
        .text(0);
    assert_eq!(state, "completed");
    assert_eq!(
        job_status(db, SOURCE, "evt_r_none", ACTION).as_deref(),
        Some("failed")
    );

    // The admin API: ?check=1 asks, a POST marks done.
    assert_accepted(
        &STRIPE.deliver(&server, &body("evt_r_api")),
        "evt_r_api",
        "delivery",
    );
    wait_job(db, "evt_r_api", ACTION, "failed");
    let (status, asked) = api(
        &server,
        "GET",
        "/api/reconcile?check=1",
        Some(ADMIN_TOKEN),
        b"",
    );
    assert_eq!(status, 200, "{asked:#}");
    assert_eq!(asked["applied"], false);
    assert_eq!(
        check_for(&checks_of(&asked), "evt_r_api")["answer"],
        "found"
    );
    assert_eq!(
        job_status(db, SOURCE, "evt_r_api", ACTION).as_deref(),
        Some("failed")
    );
    let (status, refused) = api(&server, "POST", "/api/reconcile", Some(ADMIN_TOKEN), b"{}");
    assert_eq!(status, 400, "{refused:#}");
    let (status, applied) = api(
        &server,
        "POST",
        "/api/reconcile",
        Some(ADMIN_TOKEN),
        br#"{"check":true}"#,
    );
    assert_eq!(status, 200, "{applied:#}");
    assert_eq!(applied["applied"], true);
    assert_eq!(
        check_for(&checks_of(&applied), "evt_r_api")["marked_done"],
        true
    );
    assert_eq!(
        job_status(db, SOURCE, "evt_r_api", ACTION).as_deref(),
        Some("done")
    );
    assert_eq!(
        attempts(db, "evt_r_api", ACTION)[1].worker.as_deref(),
        Some("reconcile:api")
    );
    assert_eq!(
        applied["counts"]["failed"], 1,
        "only the refused one is left"
    );

    // Nothing was sent again by any of it.
    for id in ["evt_r_done", "evt_r_none", "evt_r_api"] {
        assert_eq!(ds.posts_for(&key(id)).len(), 1, "{id}");
    }
    assert_eq!(ds.effects(&key("evt_r_done")), 1);
    assert_eq!(ds.effects(&key("evt_r_api")), 1);
}

// ---------------------------------------------------------------------------
// after: send only after the database effect
// ---------------------------------------------------------------------------

const SETUP_SQL: &str = "CREATE TABLE IF NOT EXISTS wallet(event_id TEXT PRIMARY KEY);\n\
     CREATE TABLE IF NOT EXISTS wallet_down(down INTEGER);\n\
     CREATE TRIGGER IF NOT EXISTS wallet_guard BEFORE INSERT ON wallet\n\
       WHEN EXISTS (SELECT 1 FROM wallet_down)\n\
       BEGIN SELECT RAISE(ABORT, 'the wallet is down'); END;";

/// SETUP_SQL in PostgreSQL's dialect.
const SETUP_SQL_PG: &str = "CREATE TABLE IF NOT EXISTS wallet(event_id TEXT PRIMARY KEY);\n\
     CREATE TABLE IF NOT EXISTS wallet_down(down INTEGER);\n\
     CREATE OR REPLACE FUNCTION wallet_guard() RETURNS trigger LANGUAGE plpgsql AS $$\n\
       BEGIN IF EXISTS (SELECT 1 FROM wallet_down) THEN RAISE EXCEPTION 'the wallet is down'; END IF;\n\
       RETURN NEW; END $$;\n\
     CREATE OR REPLACE TRIGGER wallet_guard BEFORE INSERT ON wallet\n\
       FOR EACH ROW EXECUTE FUNCTION wallet_guard();";

/// The SQL action `credit` fails while the wallet is down; `notify`, with
/// `after = ["credit"]`, sends nothing meanwhile (parked, listed by
/// reconcile, its reason shown by events show) and is sent once, after
/// the replay of `credit` succeeds.
fn a_forward_after_a_failed_sql_action_waits_until_its_replay_then_sends_once(backend: Backend) {
    let ds = Downstream::start_without_dedupe();
    let tables = ServerConfig::new()
        .set(
            "setup_sql",
            &toml_str(match backend {
                Backend::Sqlite => SETUP_SQL,
                Backend::Postgres => SETUP_SQL_PG,
            }),
        )
        .tables(&stripe_source(SOURCE, ""))
        .tables(&format!(
            "[[sources.{SOURCE}.actions]]\nname = \"credit\"\n\
             sql = \"INSERT INTO wallet(event_id) VALUES (:event_id)\"\n"
        ))
        .tables(&notify(&ds, "1s", "3s", "after = [\"credit\"]"));
    let server = Server::start_on(backend, &tables, &env());
    let db = &server;

    // While the wallet works, the forward follows the credit.
    assert_accepted(
        &STRIPE.deliver(&server, &body("evt_a_ok")),
        "evt_a_ok",
        "delivery",
    );
    wait_job(db, "evt_a_ok", ACTION, "done");
    assert_eq!(ds.effects(&key("evt_a_ok")), 1);

    server.exec("INSERT INTO wallet_down(down) VALUES (1)", &[]);
    assert_accepted(
        &STRIPE.deliver(&server, &body("evt_a_wait")),
        "evt_a_wait",
        "delivery",
    );
    assert_eq!(
        job_status(db, SOURCE, "evt_a_wait", "credit").as_deref(),
        Some("failed")
    );
    // The worker looked at the job and parked it rather than send it.
    wait_for(JOBS_TIMEOUT, "the forward job is parked", || {
        let parked: Option<(Option<i64>, Option<String>)> = db
            .row(
                "SELECT next_attempt_at, last_error FROM jobs WHERE event_id = 'evt_a_wait' AND action = ?1",
                &[&ACTION],
            )
            .map(|r| (r.opt_int(0), r.opt_text(1)));
        match parked {
            Some((None, Some(e))) if e.contains("waiting for credit (failed)") => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
    assert_eq!(
        job_status(db, SOURCE, "evt_a_wait", ACTION).as_deref(),
        Some("pending")
    );
    assert!(
        ds.requests_for(&key("evt_a_wait")).is_empty(),
        "nothing sent"
    );

    let shown = server.run_cli(&["events", "show", SOURCE, "evt_a_wait", "--json"]);
    let shown = shown.json();
    let job = shown["jobs"]
        .as_array()
        .and_then(|jobs| jobs.iter().find(|j| j["action"] == ACTION))
        .cloned()
        .unwrap_or_else(|| panic!("{shown:#}"));
    assert_eq!(job["status"], "pending", "{job:#}");
    assert!(
        job["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("waiting for credit (failed)")),
        "{job:#}"
    );
    let rc = server.run_cli(&["reconcile", "--json"]);
    assert_eq!(exit_code(&rc), Some(1));
    let rc = rc.json();
    assert_eq!(rc["counts"]["waiting"], 1, "{rc:#}");
    assert_eq!(
        rc["counts"]["overdue"], 0,
        "a waiting job is not overdue: {rc:#}"
    );
    assert_eq!(rc["waiting"][0]["event_id"], "evt_a_wait");
    assert_eq!(
        rc["waiting"][0]["waiting_for"],
        serde_json::json!([{"action": "credit", "status": "failed"}])
    );
    let human = server.run_cli(&["reconcile"]);
    assert!(
        human
            .stdout
            .contains("notify (forward)  0 attempt(s)  waiting for credit (failed)"),
        "{}",
        human.stdout
    );

    // Fix the wallet, replay the credit: the forward is released and sent once.
    server.exec("DELETE FROM wallet_down", &[]);
    server
        .run_cli(&[
            "replay",
            SOURCE,
            "evt_a_wait",
            "--action",
            "credit",
            "--yes",
        ])
        .assert_success();
    wait_job(db, "evt_a_wait", ACTION, "done");
    assert_eq!(ds.effects(&key("evt_a_wait")), 1, "{}", dump_jobs(db));
    assert_eq!(ds.posts_for(&key("evt_a_wait")).len(), 1);
    assert!(
        ds.checks_for(&key("evt_a_wait")).is_empty(),
        "a first send is not checked"
    );
    let credited: i64 = db.count(
        "SELECT count(*) FROM wallet WHERE event_id = 'evt_a_wait'",
        &[],
    );
    assert_eq!(credited, 1);
    let state: String = db
        .one(
            "SELECT state FROM events WHERE event_id = 'evt_a_wait'",
            &[],
        )
        .text(0);
    assert_eq!(state, "completed");
    assert_eq!(
        kinds(&attempts(db, "evt_a_wait", ACTION)),
        vec![kind("ok", None)],
        "one attempt: parking is not an attempt"
    );
}
both_backends!(a_forward_after_a_failed_sql_action_waits_until_its_replay_then_sends_once);

// ---------------------------------------------------------------------------
// Configuration
// ---------------------------------------------------------------------------

/// `idemhook check` prints each forward action's check and after; a bad
/// template or a cycle is refused by check and by serve.
#[test]
fn check_prints_the_check_and_after_and_refuses_bad_ones() {
    let ds = Downstream::start();
    let tables = ServerConfig::new()
        .tables(&stripe_source(SOURCE, ""))
        .tables(&format!(
            "[[sources.{SOURCE}.actions]]\nname = \"credit\"\nsql = \"SELECT :event_id\"\n"
        ))
        .tables(&notify(&ds, "1s", "3s", "after = [\"credit\"]"));
    let server = Server::start(&tables, &env());
    let out = server.run_cli(&["check"]);
    out.assert_success();
    assert!(
        out.stdout.contains(&format!(
            "    check before a resend: GET {}/effects/{{idempotency_key}}\n",
            ds.url()
        )) && out
            .stdout
            .contains("    after: sent once credit of the same event are done\n"),
        "{}",
        out.stdout
    );
    drop(server);

    for (extra, want) in [
        (
            "after = [\"nope\"]",
            "sources.stripe.actions[0] (notify).after: no action \"nope\" in this source",
        ),
        (
            "after = [\"notify\"]",
            "sources.stripe.actions[0] (notify).after: an action cannot wait for itself",
        ),
    ] {
        let bad = ServerConfig::new()
            .tables(&stripe_source(SOURCE, ""))
            .tables(&notify(&ds, "1s", "3s", extra));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("idemhook.toml");
        std::fs::write(&path, bad.render()).unwrap();
        let env: std::collections::BTreeMap<String, String> = env()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        for verb in ["check", "serve"] {
            let out = crate::harness::run_binary(
                dir.path(),
                &env,
                &[
                    verb.to_string(),
                    "--config".to_string(),
                    path.display().to_string(),
                ],
                Duration::from_secs(30),
            );
            assert!(
                !out.success() && out.stderr.contains(want),
                "{verb} with {extra}\n  expected: refused with {want:?}\n  got: {out:?}"
            );
        }
    }
    let template = ServerConfig::new()
        .tables(&stripe_source(SOURCE, ""))
        .tables(
            &notify(&ds, "1s", "3s", "").replace("/effects/{idempotency_key}", "/effects/{key}"),
        );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idemhook.toml");
    std::fs::write(&path, template.render()).unwrap();
    let env: std::collections::BTreeMap<String, String> = env()
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let out = crate::harness::run_binary(
        dir.path(),
        &env,
        &[
            "check".to_string(),
            "--config".to_string(),
            path.display().to_string(),
        ],
        Duration::from_secs(30),
    );
    assert!(
        !out.success()
            && out
                .stderr
                .contains("(notify).check: unknown placeholder {key}"),
        "{out:?}"
    );
}

/// `after` naming another forward action: the second is sent only once
/// the first is done (here after two 500s), released by the completion.
fn a_forward_after_another_forward_is_sent_once_that_one_is_done(backend: Backend) {
    let ds = Downstream::start_without_dedupe();
    let first = format!("{SOURCE}:evt_ff:first");
    ds.script(&first, Behavior::Fail500(2));
    let tables = ServerConfig::new()
        .tables(&stripe_source(SOURCE, ""))
        .tables(&format!(
            "[[sources.{SOURCE}.actions]]\nname = \"first\"\nforward = {}\n\
             retry_initial = \"100ms\"\nretry_max = \"300ms\"\n",
            toml_str(&format!("{}/in/first", ds.url()))
        ))
        .tables(&notify(&ds, "1s", "3s", "after = [\"first\"]"));
    let server = Server::start_on(backend, &tables, &env());
    assert_accepted(
        &STRIPE.deliver(&server, &body("evt_ff")),
        "evt_ff",
        "delivery",
    );
    let db = &server;
    wait_job(db, "evt_ff", ACTION, "done");

    let firsts = ds.posts_for(&first);
    let seconds = ds.posts_for(&key("evt_ff"));
    assert_eq!(
        (
            ds.effects(&first),
            ds.effects(&key("evt_ff")),
            seconds.len()
        ),
        (1, 1, 1),
        "{}",
        dump_jobs(db)
    );
    let first_done = firsts
        .iter()
        .find(|r| r.outcome == Outcome::Effect)
        .map(|r| r.at)
        .unwrap_or_else(|| panic!("no effect for {first}: {firsts:?}"));
    assert!(
        seconds[0].at >= first_done,
        "notify was sent at {:?}, before first was done at {first_done:?}",
        seconds[0].at
    );
    assert_eq!(
        kinds(&attempts(db, "evt_ff", ACTION)),
        vec![kind("ok", None)]
    );
}
both_backends!(a_forward_after_another_forward_is_sent_once_that_one_is_done);

/// A job held by `after` while the action it waits for is still being
/// retried leaves the report clean (exit 0), and the human report lists it
/// all the same, as the JSON does.
#[test]
fn a_clean_reconcile_still_lists_the_jobs_waiting_for_other_actions() {
    let ds = Downstream::start_without_dedupe();
    let first = format!("{SOURCE}:evt_wait:first");
    ds.script(&first, Behavior::Fail500(5));
    let tables = ServerConfig::new()
        .tables(&stripe_source(SOURCE, ""))
        .tables(&format!(
            "[[sources.{SOURCE}.actions]]\nname = \"first\"\nforward = {}\n\
             retry_initial = \"1h\"\nretry_max = \"1h\"\n",
            toml_str(&format!("{}/in/first", ds.url()))
        ))
        .tables(&notify(&ds, "1s", "3s", "after = [\"first\"]"));
    let server = Server::start(&tables, &env());
    assert_accepted(
        &STRIPE.deliver(&server, &body("evt_wait")),
        "evt_wait",
        "delivery",
    );
    let db = &server;
    wait_for(JOBS_TIMEOUT, "first's 500 recorded, notify parked", || {
        let first_tried: i64 = db.count(
            "SELECT count(*) FROM attempts a JOIN jobs j ON j.id = a.job_id
                 WHERE j.event_id = 'evt_wait' AND j.action = 'first'",
            &[],
        );
        let parked: i64 = db.count(
            "SELECT count(*) FROM jobs WHERE event_id = 'evt_wait' AND action = ?1
                   AND status = 'pending' AND next_attempt_at IS NULL",
            &[&ACTION],
        );
        if first_tried >= 1 && parked == 1 {
            Ok(())
        } else {
            Err(dump_jobs(db))
        }
    });
    let human = server.run_cli(&["reconcile"]);
    assert_eq!(exit_code(&human), Some(0), "{human:?}");
    assert!(
        human.stdout.starts_with("clean: ")
            && human.stdout.contains(
                "stripe/evt_wait  notify (forward)  0 attempt(s)  waiting for first (pending)"
            ),
        "{}",
        human.stdout
    );
    assert_eq!(ds.posts_for(&key("evt_wait")).len(), 0);
}
