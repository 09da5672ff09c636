//! The outbox: `forward` actions delivered by the real binary's workers to
//! the fake downstream in `downstream.rs`.
//!
//! Every test checks both ends: what the downstream received and counted as
//! effects (one per `Idempotency-Key`), and what the store recorded
//! (`jobs`, `attempts`, `events`, `replays`). The tests of behaviour both
//! backends share run on SQLite and on PostgreSQL (`both_backends!`). Waits are for conditions, never
//! fixed sleeps for outcomes. The configs use small timings (timeout 1s,
//! lease 2s, retries from 100ms to 500ms) so takeovers finish in seconds.

use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};

use crate::backend::{Backend, both_backends};
use crate::downstream::{Behavior, Downstream, Outcome, RecordedRequest};
use crate::harness::{
    Client, HTTP_TIMEOUT, HttpResponse, Server, ServerConfig, now_millis, toml_str, wait_for,
    wait_until,
};
use crate::helpers::{StripeHook, assert_accepted, describe, event_state, stripe_source};
use crate::sign;

const STRIPE_SECRET: &str = "whsec_it_outbox_stripe_0123456789";
const STRIPE: StripeHook = StripeHook::new(SOURCE, STRIPE_SECRET);
const SOURCE: &str = "stripe";
const ACTION: &str = "notify";
/// Bound on waiting for jobs to reach their final status.
const JOBS_TIMEOUT: Duration = Duration::from_secs(30);
/// The `lease` of the default test action, in ms.
const LEASE_MS: i64 = 2000;

// ---------------------------------------------------------------------------
// Config and delivery
// ---------------------------------------------------------------------------

fn stripe_env() -> Vec<(&'static str, &'static str)> {
    vec![("STRIPE_SECRET", STRIPE_SECRET)]
}

/// A `[[sources.stripe.actions]]` forward table posting to `url`, with the
/// small test timings unless `overrides` (key, raw TOML value) replace them.
fn forward_action(name: &str, url: &str, overrides: &[(&str, &str)]) -> String {
    let mut settings: BTreeMap<&str, String> = BTreeMap::new();
    settings.insert("timeout", toml_str("1s"));
    settings.insert("lease", toml_str("2s"));
    settings.insert("retry_initial", toml_str("100ms"));
    settings.insert("retry_max", toml_str("500ms"));
    settings.insert("max_attempts", "5".to_string());
    for (k, v) in overrides {
        settings.insert(k, v.to_string());
    }
    let mut out = format!(
        "[[sources.{SOURCE}.actions]]\nname = {}\nforward = {}\n",
        toml_str(name),
        toml_str(url)
    );
    for (k, v) in settings {
        out.push_str(&format!("{k} = {v}\n"));
    }
    out
}

fn action_url(ds: &Downstream, action: &str) -> String {
    format!("{}/in/{action}", ds.url())
}

/// The stripe source with one forward action, `notify`, to `ds`.
fn one_action_config(ds: &Downstream, overrides: &[(&str, &str)]) -> ServerConfig {
    ServerConfig::new()
        .tables(&stripe_source(SOURCE, ""))
        .tables(&forward_action(ACTION, &action_url(ds, ACTION), overrides))
}

/// The Idempotency-Key of `event_id`'s `notify` job.
fn key(event_id: &str) -> String {
    key_for(event_id, ACTION)
}

fn key_for(event_id: &str, action: &str) -> String {
    format!("{SOURCE}:{event_id}:{action}")
}

/// A Stripe-shaped event body.
fn stripe_event(id: &str) -> Vec<u8> {
    serde_json::json!({
        "id": id,
        "object": "event",
        "type": "charge.succeeded",
        "data": {"object": {"id": format!("ch_{id}"), "amount": 4200, "currency": "eur"}}
    })
    .to_string()
    .into_bytes()
}

/// `n` events `evt_{prefix}_{i}`.
fn events(prefix: &str, n: usize) -> Vec<(String, Vec<u8>)> {
    (0..n)
        .map(|i| {
            let id = format!("evt_{prefix}_{i:03}");
            let body = stripe_event(&id);
            (id, body)
        })
        .collect()
}

fn hooks_url(server: &Server) -> String {
    server.url(&format!("/hooks/{SOURCE}"))
}

/// POST like a provider: a 503 (database busy) is retried, up to 40 times.
fn post_until_answered(client: &Client, url: &str, body: &[u8]) -> Result<HttpResponse, String> {
    let mut last = None;
    for _ in 0..40 {
        let resp = client.try_post(url, &sign::stripe_now(STRIPE_SECRET, body), body)?;
        if resp.status != 503 {
            return Ok(resp);
        }
        last = Some(resp);
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(last.expect("at least one answer"))
}

// ---------------------------------------------------------------------------
// Database
// ---------------------------------------------------------------------------

#[derive(Clone, Debug)]
struct JobRow {
    id: i64,
    status: String,
    n_attempts: i64,
    last_error: Option<String>,
}

fn job(db: &Server, event_id: &str, action: &str) -> Option<JobRow> {
    db.row(
        "SELECT id, status, n_attempts, last_error FROM jobs
         WHERE source = ?1 AND event_id = ?2 AND action = ?3",
        &[&SOURCE, &event_id, &action],
    )
    .map(|r| JobRow {
        id: r.int(0),
        status: r.text(1),
        n_attempts: r.int(2),
        last_error: r.opt_text(3),
    })
}

#[derive(Clone, Debug)]
struct AttemptRow {
    n: i64,
    started_at: i64,
    finished_at: Option<i64>,
    outcome: Option<String>,
    http_status: Option<i64>,
    error_kind: Option<String>,
    request_id: Option<String>,
    response_head: Option<String>,
    worker: Option<String>,
}

fn attempts(db: &Server, job_id: i64) -> Vec<AttemptRow> {
    db.rows(
        "SELECT n, started_at, finished_at, outcome, http_status, error_kind, request_id,
                response_head, worker
         FROM attempts WHERE job_id = ?1 ORDER BY n",
        &[&job_id],
    )
    .into_iter()
    .map(|r| AttemptRow {
        n: r.int(0),
        started_at: r.int(1),
        finished_at: r.opt_int(2),
        outcome: r.opt_text(3),
        http_status: r.opt_int(4),
        error_kind: r.opt_text(5),
        request_id: r.opt_text(6),
        response_head: r.opt_text(7),
        worker: r.opt_text(8),
    })
    .collect()
}

fn stored_payload(db: &Server, event_id: &str) -> Option<Vec<u8>> {
    db.row(
        "SELECT payload FROM events WHERE source = ?1 AND event_id = ?2",
        &[&SOURCE, &event_id],
    )
    .and_then(|r| r.bytes(0))
}

/// Jobs and attempts, for failure messages.
fn outbox_dump(db: &Server) -> String {
    format!(
        "----- jobs -----\n{}----- attempts -----\n{}",
        db.dump(
            "SELECT id, event_id, action, status, n_attempts, next_attempt_at, lease_owner, lease_until, last_error FROM jobs ORDER BY id"
        ),
        db.dump(
            "SELECT job_id, n, started_at, finished_at, outcome, http_status, error_kind, request_id, worker FROM attempts ORDER BY job_id, n"
        )
    )
}

/// Wait until the job reaches `status`; fails at once if it settles in the
/// other final status instead.
fn wait_job(db: &Server, event_id: &str, action: &str, status: &str) -> JobRow {
    wait_for(
        JOBS_TIMEOUT,
        &format!("job {event_id}/{action} reaches status {status:?}"),
        || match job(db, event_id, action) {
            Some(j) if j.status == status => Ok(j),
            Some(j) if ["done", "failed"].contains(&j.status.as_str()) => panic!(
                "job {event_id}/{action}\n  expected: status {status:?}\n  got: {j:?}\n{}",
                outbox_dump(db)
            ),
            other => Err(format!("{other:?}")),
        },
    )
}

/// Wait until no forward job is pending, processing or paused, then return
/// how many are in each final status.
fn wait_all_settled(db: &Server, expected_jobs: i64) -> (i64, i64) {
    wait_for(
        JOBS_TIMEOUT,
        &format!("{expected_jobs} forward jobs settle (done or failed)"),
        || {
            let r = db.one(
                "SELECT count(*),
                        coalesce(sum(CASE WHEN status = 'done' THEN 1 ELSE 0 END), 0),
                        coalesce(sum(CASE WHEN status = 'failed' THEN 1 ELSE 0 END), 0)
                 FROM jobs WHERE kind = 'forward'",
                &[],
            );
            let (total, done, failed) = (r.int(0), r.int(1), r.int(2));
            if total == expected_jobs && done + failed == total {
                Ok((done, failed))
            } else {
                Err(format!("{total} jobs, {done} done, {failed} failed"))
            }
        },
    )
}

fn outcomes(requests: &[RecordedRequest]) -> Vec<Outcome> {
    requests.iter().map(|r| r.outcome.clone()).collect()
}

fn attempt_headers(requests: &[RecordedRequest]) -> Vec<String> {
    requests
        .iter()
        .map(|r| {
            r.header("X-Idemhook-Attempt")
                .unwrap_or("<missing>")
                .to_string()
        })
        .collect()
}

fn field<T: Clone>(rows: &[AttemptRow], f: impl Fn(&AttemptRow) -> T) -> Vec<T> {
    rows.iter().map(f).collect()
}

/// Timestamps are ordered within each attempt and from one attempt to the
/// next; returns the gaps (ms) between an attempt's end and the next start.
fn assert_attempt_times(rows: &[AttemptRow], context: &str) -> Vec<i64> {
    let now = now_millis();
    let mut gaps = Vec::new();
    for (i, a) in rows.iter().enumerate() {
        let finished = a
            .finished_at
            .unwrap_or_else(|| panic!("{context}: attempt {} has no finished_at: {a:?}", a.n));
        assert!(
            a.started_at <= finished && finished <= now && a.started_at > now - 120_000,
            "{context}: attempt {} times (ms)\n  expected: recent, started_at <= finished_at\n  got: {a:?}",
            a.n
        );
        if let Some(next) = rows.get(i + 1) {
            gaps.push(next.started_at - finished);
        }
    }
    assert!(
        gaps.iter().all(|g| *g >= 0),
        "{context}: attempts overlap\n  got gaps {gaps:?} in {rows:#?}"
    );
    gaps
}

// ---------------------------------------------------------------------------
// 1 and 3. Downstream behaviours end in one effect; attempts are recorded
// ---------------------------------------------------------------------------

/// A downstream named by host name (not an IP address) is looked up and
/// reached: the forward agent's own resolver (`resolve.rs`) in use.
#[test]
fn a_downstream_named_localhost_is_resolved_and_reached() {
    let ds = Downstream::start();
    let url = format!("http://localhost:{}/{ACTION}", ds.addr().port());
    let config = ServerConfig::new()
        .tables(&stripe_source(SOURCE, ""))
        .tables(&forward_action(ACTION, &url, &[]));
    let server = Server::start(&config, &stripe_env());
    let ids = ["evt_localhost_1", "evt_localhost_2"];
    for id in ids {
        assert_accepted(&STRIPE.deliver(&server, &stripe_event(id)), id, "delivery");
    }
    let db = &server;
    for id in ids {
        wait_job(db, id, ACTION, "done");
        assert_eq!(ds.effects(&key(id)), 1, "effects for {}", key(id));
    }
    // A successful attempt's log line has no empty error field.
    wait_until(Duration::from_secs(10), "the attempt lines", || {
        server.logs().matches("INFO attempt ").count() >= ids.len()
    });
    let logs = server.logs();
    let attempts: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("INFO attempt "))
        .collect();
    assert!(
        attempts
            .iter()
            .all(|l| l.contains("outcome=ok") && !l.contains("error=")),
        "{attempts:?}"
    );
}

fn fail500_twice_then_ok_is_one_effect_with_every_attempt_recorded(backend: Backend) {
    let ds = Downstream::start();
    let id = "evt_fail500";
    ds.script(&key(id), Behavior::Fail500(2));
    let server = Server::start_on(backend, &one_action_config(&ds, &[]), &stripe_env());
    assert_accepted(&STRIPE.deliver(&server, &stripe_event(id)), id, "delivery");

    let db = &server;
    let j = wait_job(db, id, ACTION, "done");
    assert_eq!(ds.effects(&key(id)), 1, "effects for {}", key(id));
    let reqs = ds.requests_for(&key(id));
    assert_eq!(
        outcomes(&reqs),
        vec![Outcome::Failed500, Outcome::Failed500, Outcome::Effect],
        "what the downstream did with each request"
    );
    assert_eq!(
        attempt_headers(&reqs),
        vec!["1", "2", "3"],
        "X-Idemhook-Attempt is 1-based and increases"
    );

    let rows = attempts(db, j.id);
    let context = format!("attempts of {id}\n{}", outbox_dump(db));
    assert_eq!(j.n_attempts, 3, "{context}");
    assert_eq!(field(&rows, |a| a.n), vec![1, 2, 3], "{context}");
    assert_eq!(
        field(&rows, |a| a.outcome.clone()),
        vec![
            Some("retry".into()),
            Some("retry".into()),
            Some("ok".into())
        ],
        "{context}"
    );
    assert_eq!(
        field(&rows, |a| a.http_status),
        vec![Some(500), Some(500), Some(200)],
        "{context}"
    );
    assert_eq!(
        field(&rows, |a| a.error_kind.clone()),
        vec![Some("status".into()), Some("status".into()), None],
        "{context}"
    );
    // request_id is the downstream's X-Request-Id of the answer to that attempt.
    assert_eq!(
        field(&rows, |a| a.request_id.clone()),
        reqs.iter()
            .map(|r| Some(r.request_id.clone()))
            .collect::<Vec<_>>(),
        "attempts.request_id vs the downstream's X-Request-Id per request\n{context}"
    );
    let heads = field(&rows, |a| a.response_head.clone().unwrap_or_default());
    assert!(
        heads[0].contains("scripted 500")
            && heads[1].contains("scripted 500")
            && heads[2] == r#"{"ok":true}"#,
        "response_head keeps the start of each answer\n  got: {heads:?}"
    );
    assert!(
        rows.iter()
            .all(|a| a.worker.as_deref().is_some_and(|w| !w.is_empty())),
        "each attempt names its worker\n{context}"
    );
    let gaps = assert_attempt_times(&rows, &context);
    assert!(
        gaps.iter().all(|g| *g >= 100),
        "each retry waits at least retry_initial (100ms)\n  got gaps (ms): {gaps:?}"
    );
    assert_eq!(
        event_state(db, SOURCE, id).as_deref(),
        Some("completed"),
        "{context}"
    );
    assert_eq!(j.last_error, None, "a done job keeps no last_error");
}
both_backends!(fail500_twice_then_ok_is_one_effect_with_every_attempt_recorded);

#[test]
fn process_then_drop_is_retried_and_the_retry_is_absorbed_by_the_idempotency_key() {
    let ds = Downstream::start();
    let id = "evt_drop";
    ds.script(&key(id), Behavior::ProcessThenDrop(1));
    let server = Server::start(&one_action_config(&ds, &[]), &stripe_env());
    assert_accepted(&STRIPE.deliver(&server, &stripe_event(id)), id, "delivery");

    let db = &server;
    let j = wait_job(db, id, ACTION, "done");
    let reqs = ds.requests_for(&key(id));
    assert_eq!(
        outcomes(&reqs),
        vec![
            Outcome::ProcessedThenDropped { new_effect: true },
            Outcome::Repeat
        ],
        "the first request was processed (connection dropped), the retry was a repeat"
    );
    assert_eq!(ds.effects(&key(id)), 1, "one effect for {}", key(id));
    assert_eq!(ds.total_effects(), 1);
    assert_eq!(attempt_headers(&reqs), vec!["1", "2"]);

    let rows = attempts(db, j.id);
    let context = format!("attempts of {id}\n{}", outbox_dump(db));
    assert_eq!(
        field(&rows, |a| (a.n, a.outcome.clone(), a.http_status)),
        vec![
            (1, Some("retry".into()), None),
            (2, Some("ok".into()), Some(200))
        ],
        "{context}"
    );
    assert_eq!(
        rows[0].error_kind.as_deref(),
        Some("protocol"),
        "a connection closed after the request was sent is a protocol error, not a connect error\n{context}"
    );
    assert_eq!(rows[0].request_id, None, "no answer, no request id");
    assert_eq!(
        rows[1].request_id.as_deref(),
        Some(reqs[1].request_id.as_str())
    );
    assert_attempt_times(&rows, &context);
    assert_eq!(event_state(db, SOURCE, id).as_deref(), Some("completed"));
}

#[test]
fn hang_past_the_timeout_is_cut_at_the_timeout_and_retried_into_one_effect() {
    const HANG: Duration = Duration::from_secs(6);
    let ds = Downstream::start();
    let id = "evt_hang";
    ds.script(&key(id), Behavior::Hang(HANG));
    let server = Server::start(&one_action_config(&ds, &[]), &stripe_env());
    assert_accepted(&STRIPE.deliver(&server, &stripe_event(id)), id, "delivery");

    let db = &server;
    let j = wait_job(db, id, ACTION, "done");
    let reqs = ds.requests_for(&key(id));
    assert_eq!(outcomes(&reqs), vec![Outcome::Hung, Outcome::Effect]);
    assert_eq!(ds.effects(&key(id)), 1);
    // The retry arrived while the first request was still being held: the
    // worker gave up at its 1s timeout instead of waiting for the downstream.
    assert!(
        reqs[1].at - reqs[0].at < HANG,
        "expected: the retry arrives before the {HANG:?} hang ends\n  got: {:?} apart",
        reqs[1].at - reqs[0].at
    );

    let rows = attempts(db, j.id);
    let context = format!("attempts of {id}\n{}", outbox_dump(db));
    assert_eq!(
        field(&rows, |a| (
            a.n,
            a.outcome.clone(),
            a.http_status,
            a.error_kind.clone()
        )),
        vec![
            (1, Some("retry".into()), None, Some("timeout".into())),
            (2, Some("ok".into()), Some(200), None)
        ],
        "{context}"
    );
    assert_attempt_times(&rows, &context);
    assert_eq!(event_state(db, SOURCE, id).as_deref(), Some("completed"));
}

#[test]
fn too_many_requests_waits_at_least_retry_after_clamped_by_retry_max() {
    // Two actions on one event: `honour` may wait up to 5s and gets
    // Retry-After: 1; `clamp` may wait only 500ms and gets Retry-After: 30.
    let ds = Downstream::start();
    let id = "evt_429";
    let (honour, clamp) = ("honour", "clamp");
    ds.script(
        &key_for(id, honour),
        Behavior::TooMany {
            retry_after_secs: 1,
            times: 1,
        },
    );
    ds.script(
        &key_for(id, clamp),
        Behavior::TooMany {
            retry_after_secs: 30,
            times: 1,
        },
    );
    let config = ServerConfig::new()
        .tables(&stripe_source(SOURCE, ""))
        .tables(&forward_action(
            honour,
            &action_url(&ds, honour),
            &[("retry_max", &toml_str("5s"))],
        ))
        .tables(&forward_action(clamp, &action_url(&ds, clamp), &[]));
    let server = Server::start(&config, &stripe_env());
    let started = std::time::Instant::now();
    assert_accepted(&STRIPE.deliver(&server, &stripe_event(id)), id, "delivery");

    let db = &server;
    for (action, min_gap_ms) in [(honour, 1000), (clamp, 500)] {
        // Both finish well before the 30s Retry-After: `clamp` was clamped.
        let j = wait_job(db, id, action, "done");
        let rows = attempts(db, j.id);
        let context = format!("attempts of {id}/{action}\n{}", outbox_dump(db));
        assert_eq!(
            field(&rows, |a| (
                a.outcome.clone(),
                a.http_status,
                a.error_kind.clone()
            )),
            vec![
                (Some("retry".into()), Some(429), Some("status".into())),
                (Some("ok".into()), Some(200), None)
            ],
            "{context}"
        );
        let gaps = assert_attempt_times(&rows, &context);
        assert!(
            gaps[0] >= min_gap_ms,
            "{action}: the retry after a 429\n  expected: at least {min_gap_ms} ms after the first attempt ended (Retry-After, up to retry_max)\n  got: {} ms\n{context}",
            gaps[0]
        );
        assert_eq!(ds.effects(&key_for(id, action)), 1);
        assert_eq!(
            outcomes(&ds.requests_for(&key_for(id, action)))[1],
            Outcome::Effect
        );
    }
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the clamped retry did not wait for the 30s Retry-After"
    );
    assert_eq!(event_state(db, SOURCE, id).as_deref(), Some("completed"));
}

fn unreachable_downstream_is_retried_as_connect_errors_then_dead_lettered(backend: Backend) {
    // A port nothing listens on (bound, then released).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let id = "evt_unreachable";
    let config = ServerConfig::new()
        .tables(&stripe_source(SOURCE, ""))
        .tables(&forward_action(
            ACTION,
            &format!("http://127.0.0.1:{port}/in"),
            &[("max_attempts", "3")],
        ));
    let server = Server::start_on(backend, &config, &stripe_env());
    assert_accepted(&STRIPE.deliver(&server, &stripe_event(id)), id, "delivery");

    let db = &server;
    let j = wait_job(db, id, ACTION, "failed");
    let rows = attempts(db, j.id);
    let context = format!("attempts of {id}\n{}", outbox_dump(db));
    assert_eq!(j.n_attempts, 3, "{context}");
    assert_eq!(
        field(&rows, |a| (
            a.n,
            a.outcome.clone(),
            a.http_status,
            a.error_kind.clone(),
            a.request_id.clone()
        )),
        vec![
            (1, Some("retry".into()), None, Some("connect".into()), None),
            (2, Some("retry".into()), None, Some("connect".into()), None),
            (3, Some("failed".into()), None, Some("connect".into()), None),
        ],
        "{context}"
    );
    assert!(
        j.last_error.as_deref().is_some_and(|e| !e.is_empty()),
        "a dead-lettered job says why\n{context}"
    );
    assert_attempt_times(&rows, &context);
    assert_eq!(event_state(db, SOURCE, id).as_deref(), Some("failed"));
}
both_backends!(unreachable_downstream_is_retried_as_connect_errors_then_dead_lettered);

fn reject_400_fails_after_one_attempt_and_replay_delivers_it_once(backend: Backend) {
    let ds = Downstream::start();
    let id = "evt_400";
    ds.script(&key(id), Behavior::Reject400);
    let server = Server::start_on(backend, &one_action_config(&ds, &[]), &stripe_env());
    assert_accepted(&STRIPE.deliver(&server, &stripe_event(id)), id, "delivery");

    let db = &server;
    let j = wait_job(db, id, ACTION, "failed");
    let rows = attempts(db, j.id);
    let context = format!("attempts of {id}\n{}", outbox_dump(db));
    assert_eq!(j.n_attempts, 1, "a 400 fails at once\n{context}");
    assert_eq!(
        field(&rows, |a| (
            a.n,
            a.outcome.clone(),
            a.http_status,
            a.error_kind.clone()
        )),
        vec![(1, Some("failed".into()), Some(400), Some("status".into()))],
        "{context}"
    );
    assert!(
        rows[0]
            .response_head
            .as_deref()
            .is_some_and(|h| h.contains("scripted 400")),
        "{context}"
    );
    assert_eq!(event_state(db, SOURCE, id).as_deref(), Some("failed"));
    assert_eq!(ds.requests_for(&key(id)).len(), 1);
    assert_eq!(ds.effects(&key(id)), 0);

    // Without --yes, replay only tells.
    let dry = server.run_cli(&["replay", SOURCE, id]);
    dry.assert_success();
    assert_eq!(
        job(db, id, ACTION).map(|j| j.status).as_deref(),
        Some("failed"),
        "replay without --yes changes nothing\n----- replay stdout -----\n{}",
        dry.stdout
    );

    // The downstream is fixed; the operator replays.
    ds.clear_script(&key(id));
    server
        .run_cli(&["replay", SOURCE, id, "--yes"])
        .assert_success();
    let j = wait_job(db, id, ACTION, "done");
    let rows = attempts(db, j.id);
    let context = format!("attempts of {id} after replay\n{}", outbox_dump(db));
    assert_eq!(
        field(&rows, |a| (a.n, a.outcome.clone(), a.http_status)),
        vec![
            (1, Some("failed".into()), Some(400)),
            (2, Some("ok".into()), Some(200))
        ],
        "the replay is a new attempt; the failed one stays as it was\n{context}"
    );
    assert_eq!(ds.effects(&key(id)), 1);
    assert_eq!(
        outcomes(&ds.requests_for(&key(id))),
        vec![Outcome::Rejected400, Outcome::Effect]
    );
    assert_eq!(attempt_headers(&ds.requests_for(&key(id))), vec!["1", "2"]);
    assert_eq!(event_state(db, SOURCE, id).as_deref(), Some("completed"));
    let replays: Vec<(String, String)> = db
        .rows(
            "SELECT from_status, origin FROM replays WHERE job_id = ?1",
            &[&j.id],
        )
        .iter()
        .map(|r| (r.text(0), r.text(1)))
        .collect();
    assert_eq!(
        replays,
        vec![("failed".to_string(), "cli".to_string())],
        "the replay is recorded"
    );
}
both_backends!(reject_400_fails_after_one_attempt_and_replay_delivers_it_once);

/// The lines of `events show`'s human view about `action`'s job: its
/// attempts (`#n ...`) and replays (`replayed ...`), in printed order.
fn history_lines(shown: &str) -> Vec<String> {
    shown
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with('#') || l.starts_with("replayed "))
        .map(|l| l.split_whitespace().next().unwrap_or_default().to_string())
        .collect()
}

/// Regression: `events show` printed a replay after all the job's
/// attempts, also after the attempt the replay itself caused. It comes
/// in time order: after the failed attempt, before the replay's run.
fn events_show_prints_a_replay_between_the_attempts_around_it(backend: Backend) {
    let ds = Downstream::start();
    let id = "evt_replay_order";
    ds.script(&key(id), Behavior::Reject400);
    let server = Server::start_on(backend, &one_action_config(&ds, &[]), &stripe_env());
    assert_accepted(&STRIPE.deliver(&server, &stripe_event(id)), id, "delivery");
    wait_job(&server, id, ACTION, "failed");
    ds.clear_script(&key(id));
    server
        .run_cli(&["replay", SOURCE, id, "--yes"])
        .assert_success();
    wait_job(&server, id, ACTION, "done");

    let shown = server.run_cli(&["events", "show", SOURCE, id]);
    shown.assert_success();
    assert_eq!(
        history_lines(&shown.stdout),
        vec!["#1", "replayed", "#2"],
        "the failed attempt, the replay, the replay's run\n----- events show -----\n{}",
        shown.stdout
    );
}
both_backends!(events_show_prints_a_replay_between_the_attempts_around_it);

/// An event whose forward job waits for a paused action: the JSON keeps
/// the contract's event states (accepted, processing, completed, failed;
/// the job is `paused`, waiting for `paused`), and the human views say
/// that it is paused (a bare `accepted` or `processing` read as if its
/// job were on its way).
fn an_event_whose_job_is_paused_says_so_in_show_and_list(backend: Backend) {
    let ds = Downstream::start();
    let id = "evt_held";
    let server = Server::start_on(backend, &one_action_config(&ds, &[]), &stripe_env());
    server
        .run_cli(&["pause", &format!("{SOURCE}/{ACTION}")])
        .assert_success();
    assert_accepted(&STRIPE.deliver(&server, &stripe_event(id)), id, "delivery");
    wait_job(&server, id, ACTION, "paused");

    let json = server
        .run_cli(&["events", "show", SOURCE, id, "--json"])
        .json();
    let state = json["state"].as_str().unwrap_or_default().to_string();
    assert!(
        ["accepted", "processing"].contains(&state.as_str()),
        "the JSON keeps one of the contract's open event states: {json}"
    );
    assert_eq!(json["jobs"][0]["status"], "paused", "{json}");
    assert_eq!(json["jobs"][0]["waiting_for"], "paused", "{json}");
    let shown = server.run_cli(&["events", "show", SOURCE, id]);
    shown.assert_success();
    assert!(
        shown
            .stdout
            .lines()
            .any(|l| l.trim_start().starts_with("state")
                && l.contains(&format!(
                    "{state} (paused: notify; waits for `idemhook resume`)"
                ))),
        "events show says the event waits for a paused action\n{}",
        shown.stdout
    );
    let listed = server.run_cli(&["events", "list"]);
    listed.assert_success();
    let row = listed
        .stdout
        .lines()
        .find(|l| l.contains(id))
        .unwrap_or_default()
        .to_string();
    assert!(
        row.trim_end().ends_with(&format!("{state} (paused)")),
        "events list marks the paused event: {row:?}\n{}",
        listed.stdout
    );
    let list_json = server.run_cli(&["events", "list", "--json"]).json();
    assert_eq!(list_json[0]["state"], state.as_str(), "{list_json}");
    assert_eq!(
        list_json[0].as_object().map(|o| o.len()),
        Some(5),
        "the list's JSON keeps its five fields: {list_json}"
    );

    server
        .run_cli(&["resume", &format!("{SOURCE}/{ACTION}")])
        .assert_success();
    wait_job(&server, id, ACTION, "done");
    let listed = server.run_cli(&["events", "list"]);
    assert!(
        !listed.stdout.contains("paused") && listed.stdout.contains("completed"),
        "once resumed and delivered, nothing says paused\n{}",
        listed.stdout
    );
}
both_backends!(an_event_whose_job_is_paused_says_so_in_show_and_list);

// ---------------------------------------------------------------------------
// 2. What the downstream receives
// ---------------------------------------------------------------------------

fn forwarded_request_is_the_exact_body_with_its_content_type_and_idemhook_headers(
    backend: Backend,
) {
    let ds = Downstream::start();
    let id = "evt_bytes";
    // Odd whitespace, key order, escapes, non-ASCII and a CRLF at the end: a
    // re-serialised body would differ.
    let body = "{ \"type\" :\"charge.succeeded\",\n\t\"zeta\": 1.50, \"id\":\"evt_bytes\" ,\
                \"alpha\" : [ 2e3 , -0 ], \"note\": \"caf\u{e9} \u{2603} \u{1F600} \\u00e9 \\\"q\\\"\"  }\r\n"
        .as_bytes()
        .to_vec();
    let content_type = "application/json; charset=utf-8";
    ds.script(&key(id), Behavior::Fail500(1));
    let server = Server::start_on(backend, &one_action_config(&ds, &[]), &stripe_env());
    let headers = vec![
        sign::stripe_signature_header(STRIPE_SECRET, &body, crate::harness::now_secs()),
        ("Content-Type".to_string(), content_type.to_string()),
    ];
    let resp = server.post(&format!("/hooks/{SOURCE}"), &headers, &body);
    assert_accepted(&resp, id, "delivery of an oddly formatted body");

    let db = &server;
    wait_job(db, id, ACTION, "done");
    let reqs = ds.requests_for(&key(id));
    assert_eq!(reqs.len(), 2, "one 500, then the retry");
    for (i, r) in reqs.iter().enumerate() {
        let n = (i + 1).to_string();
        assert!(
            r.body == body,
            "attempt {n}: forwarded body\n  expected: {:?}\n  got: {:?}",
            String::from_utf8_lossy(&body),
            String::from_utf8_lossy(&r.body)
        );
        assert_eq!(r.method, "POST");
        assert_eq!(r.path, format!("/in/{ACTION}"));
        let expected = [
            ("Content-Type", content_type),
            ("Idempotency-Key", "stripe:evt_bytes:notify"),
            ("X-Idemhook-Source", SOURCE),
            ("X-Idemhook-Event-Id", id),
            ("X-Idemhook-Event-Type", "charge.succeeded"),
            ("X-Idemhook-Attempt", n.as_str()),
        ];
        for (name, value) in expected {
            assert_eq!(
                r.header(name),
                Some(value),
                "attempt {n}: header {name}\n  all headers: {:?}",
                r.headers
            );
        }
    }
    assert_eq!(stored_payload(db, id), Some(body), "the stored body");
}
both_backends!(forwarded_request_is_the_exact_body_with_its_content_type_and_idemhook_headers);

#[test]
fn forward_with_sign_secret_carries_valid_standard_webhooks_headers() {
    let ds = Downstream::start();
    let id = "evt_signed";
    let secret = sign::whsec(b"idemhook-outbox-forward-key-0123");
    ds.script(&key(id), Behavior::Fail500(1));
    let config = one_action_config(&ds, &[("sign_secret", &toml_str(&secret))]);
    let server = Server::start(&config, &stripe_env());
    let body = stripe_event(id);
    assert_accepted(&STRIPE.deliver(&server, &body), id, "delivery");

    wait_job(&server, id, ACTION, "done");
    let reqs = ds.requests_for(&key(id));
    assert_eq!(reqs.len(), 2, "one 500, then the retry");
    let now = crate::harness::now_secs();
    let mut msg_ids = Vec::new();
    for r in &reqs {
        let get = |name: &str| {
            r.header(name).unwrap_or_else(|| {
                panic!(
                    "expected header {name} on the signed forward\n  got: {:?}",
                    r.headers
                )
            })
        };
        let msg_id = get("webhook-id");
        let ts: i64 = get("webhook-timestamp")
            .parse()
            .unwrap_or_else(|e| panic!("webhook-timestamp: {e}"));
        assert!(
            (ts - now).abs() <= 300,
            "webhook-timestamp is now (±5 min): got {ts}, now {now}"
        );
        let expected = sign::standard_signature(&secret, msg_id, ts, &r.body);
        let got = get("webhook-signature");
        assert!(
            got.split_whitespace().any(|s| s == expected),
            "webhook-signature over id.timestamp.body with the sign_secret\n  expected (one of the list): {expected}\n  got: {got}"
        );
        let other = sign::standard_signature(&sign::whsec(b"another key"), msg_id, ts, &r.body);
        assert!(!got.split_whitespace().any(|s| s == other));
        msg_ids.push(msg_id.to_string());
    }
    assert_eq!(
        msg_ids[0], msg_ids[1],
        "webhook-id stays the same when a message is resent (Standard Webhooks)"
    );
    assert_eq!(ds.effects(&key(id)), 1);
}

// ---------------------------------------------------------------------------
// 4. The provider's 200 does not wait for the downstream
// ---------------------------------------------------------------------------

fn provider_gets_200_while_the_downstream_holds_the_forward(backend: Backend) {
    let ds = Downstream::start();
    ds.close_gate();
    // Long timeout and lease: the workers stay inside the downstream call.
    let config = one_action_config(
        &ds,
        &[("timeout", &toml_str("30s")), ("lease", &toml_str("60s"))],
    );
    let server = Server::start_on(backend, &config, &stripe_env());
    let evs = events("held", 6);

    assert_accepted(
        &STRIPE.deliver(&server, &evs[0].1),
        &evs[0].0,
        "first delivery",
    );
    wait_until(
        Duration::from_secs(10),
        "a worker's request waits at the downstream",
        || ds.held() >= 1,
    );
    for (id, body) in &evs[1..] {
        assert_accepted(
            &STRIPE.deliver(&server, body),
            id,
            "delivery while the downstream holds a forward",
        );
        assert!(
            ds.held() >= 1 && ds.released() == 0,
            "the 200 for {id} arrived while the downstream still held every forward (held {}, released {})",
            ds.held(),
            ds.released()
        );
    }
    let db = &server;
    assert_eq!(
        job(db, &evs[0].0, ACTION).map(|j| j.status).as_deref(),
        Some("processing"),
        "the first job is in flight\n{}",
        outbox_dump(db)
    );

    ds.open_gate();
    let (done, failed) = wait_all_settled(db, evs.len() as i64);
    assert_eq!((done, failed), (evs.len() as i64, 0), "{}", outbox_dump(db));
    for (id, _) in &evs {
        assert_eq!(ds.effects(&key(id)), 1, "effects for {}", key(id));
        assert_eq!(event_state(db, SOURCE, id).as_deref(), Some("completed"));
    }
}
both_backends!(provider_gets_200_while_the_downstream_holds_the_forward);

// ---------------------------------------------------------------------------
// 5. Crashes at each failpoint
// ---------------------------------------------------------------------------

/// Deliver events to a server whose `failpoint` SIGKILLs it, restart without
/// the failpoint on the same database, redeliver as the provider would, and
/// check that every acked event is stored and each key has one effect.
/// Returns the server and downstream for failpoint-specific checks.
fn crash_at(backend: Backend, failpoint: &str) -> (Server, Downstream, Vec<(String, Vec<u8>)>) {
    const N: usize = 6;
    let ds = Downstream::start();
    let spec = format!("{failpoint}=kill");
    let mut env = stripe_env();
    env.push(("IDEMHOOK_FAILPOINTS", spec.as_str()));
    let mut server = Server::start_on(backend, &one_action_config(&ds, &[]), &env);
    let evs = events("crash", N);

    let client = Client::new(HTTP_TIMEOUT);
    let url = hooks_url(&server);
    let mut acked = Vec::new();
    for (id, body) in &evs {
        let answer = client.try_post(&url, &sign::stripe_now(STRIPE_SECRET, body), body);
        if answer.is_ok_and(|resp| resp.status == 200) {
            acked.push(id.clone());
        }
    }
    let status = server.wait_exit(Duration::from_secs(10));
    assert_eq!(
        status.signal(),
        Some(9),
        "expected: the {failpoint} failpoint SIGKILLs the process\n  got: {status:?}"
    );

    server.remove_env("IDEMHOOK_FAILPOINTS");
    server.restart();
    let db = &server;
    for (id, body) in &evs {
        if acked.contains(id) {
            assert_eq!(
                stored_payload(db, id).as_deref(),
                Some(&body[..]),
                "acked event {id} survives the kill at {failpoint}"
            );
        }
    }
    // The provider retries what was not acked (and may resend the rest).
    for (id, body) in &evs {
        let resp = STRIPE.deliver(&server, body);
        let status = resp.json_status();
        let ok = resp.status == 200
            && match status.as_deref() {
                Some("duplicate") => true,
                Some("accepted") => !acked.contains(id),
                _ => false,
            };
        assert!(
            ok,
            "redelivery of {id} (acked before the crash: {})\n  expected: 200 duplicate if acked, else accepted or duplicate\n  got: {}",
            acked.contains(id),
            describe(&resp)
        );
    }
    let (done, failed) = wait_all_settled(db, N as i64);
    assert_eq!((done, failed), (N as i64, 0), "{}", outbox_dump(db));
    for (id, _) in &evs {
        assert_eq!(
            ds.effects(&key(id)),
            1,
            "effects for {} after the crash at {failpoint}\n{}",
            key(id),
            outbox_dump(db)
        );
        let outs = outcomes(&ds.requests_for(&key(id)));
        assert!(
            outs.iter()
                .all(|o| matches!(o, Outcome::Effect | Outcome::Repeat)),
            "{id}: {outs:?}"
        );
        assert_eq!(event_state(db, SOURCE, id).as_deref(), Some("completed"));
    }
    assert_eq!(ds.total_effects(), N as u64, "no effect without a key");
    (server, ds, evs)
}

/// The job cut short by the kill: its attempt is recorded by the takeover as
/// `retry` with error kind `lease`, and the next attempt started only after
/// the lease ran out. Returns the keys of the jobs cut short.
fn assert_lease_takeover_recorded(server: &Server) -> Vec<String> {
    let db = server;
    let cut: Vec<(String, i64, i64)> = db
        .rows(
            "SELECT j.event_id, j.id, a.n FROM attempts a JOIN jobs j ON j.id = a.job_id
             WHERE a.error_kind = 'lease' ORDER BY j.id",
            &[],
        )
        .iter()
        .map(|r| (r.text(0), r.int(1), r.int(2)))
        .collect();
    assert!(
        !cut.is_empty(),
        "expected: the takeover records the cut-short attempt with error_kind 'lease'\n  got none\n{}",
        outbox_dump(db)
    );
    for (event_id, job_id, n) in &cut {
        let rows = attempts(db, *job_id);
        let lease_row = rows.iter().find(|a| a.n == *n).unwrap();
        assert_eq!(lease_row.outcome.as_deref(), Some("retry"), "{rows:#?}");
        let next = rows
            .iter()
            .find(|a| a.n == n + 1)
            .unwrap_or_else(|| panic!("{event_id}: no attempt after the cut-short one: {rows:#?}"));
        assert!(
            next.started_at >= lease_row.started_at + LEASE_MS,
            "{event_id}: the takeover waited for the lease ({LEASE_MS} ms)\n  got: cut-short attempt leased at {}, next started at {}",
            lease_row.started_at,
            next.started_at
        );
        assert_eq!(rows.last().unwrap().outcome.as_deref(), Some("ok"));
    }
    cut.into_iter().map(|(e, _, _)| key(&e)).collect()
}

fn kill9_before_the_downstream_call_is_taken_over_after_the_lease_and_delivered_once(
    backend: Backend,
) {
    let (server, ds, _) = crash_at(backend, "forward.before_call");
    for k in assert_lease_takeover_recorded(&server) {
        assert_eq!(
            outcomes(&ds.requests_for(&k)),
            vec![Outcome::Effect],
            "{k}: the killed attempt never reached the downstream"
        );
    }
}
both_backends!(kill9_before_the_downstream_call_is_taken_over_after_the_lease_and_delivered_once);

fn kill9_after_the_downstream_answered_is_retried_with_the_same_key_and_absorbed(backend: Backend) {
    let (server, ds, _) = crash_at(backend, "forward.after_response");
    let cut = assert_lease_takeover_recorded(&server);
    assert!(
        cut.iter()
            .any(|k| outcomes(&ds.requests_for(k)) == vec![Outcome::Effect, Outcome::Repeat]),
        "expected: a job whose effect happened before the kill is resent with the same key (effect, then repeat)\n  got: {:?}",
        cut.iter()
            .map(|k| (k, outcomes(&ds.requests_for(k))))
            .collect::<Vec<_>>()
    );
}
both_backends!(kill9_after_the_downstream_answered_is_retried_with_the_same_key_and_absorbed);

fn kill9_after_the_claim_commit_keeps_the_event_and_its_job_delivers_once(backend: Backend) {
    let (server, _ds, evs) = crash_at(backend, "claim.after_commit");
    // The first delivery committed before the kill: it is stored although
    // it was never acked, and its job ran once.
    let db = &server;
    assert_eq!(
        stored_payload(db, &evs[0].0).as_deref(),
        Some(&evs[0].1[..])
    );
}
both_backends!(kill9_after_the_claim_commit_keeps_the_event_and_its_job_delivers_once);

// ---------------------------------------------------------------------------
// 6. Two processes, one database: the lease decides
// ---------------------------------------------------------------------------

/// A second server on `first`'s database (its SQLite file, or its
/// PostgreSQL database), with the same sources.
fn second_server(first: &Server, tables: &ServerConfig, env: &[(&str, &str)]) -> Server {
    let db = match first.pg_url() {
        Some(url) => url.to_string(),
        None => first.db_path().display().to_string(),
    };
    Server::start(&tables.clone().set("database", &toml_str(&db)), env)
}

fn two_processes_on_one_database_send_each_job_exactly_once(backend: Backend) {
    const N: usize = 200;
    let ds = Downstream::start();
    // No crash here, so a generous lease: only the take decides ownership.
    let config = one_action_config(
        &ds,
        &[("timeout", &toml_str("5s")), ("lease", &toml_str("10s"))],
    );
    let a = Server::start_on(backend, &config, &stripe_env());
    let b = second_server(&a, &config, &stripe_env());
    let evs = events("two", N);

    let urls = [hooks_url(&a), hooks_url(&b)];
    let answers: Vec<(String, Result<HttpResponse, String>)> = std::thread::scope(|s| {
        let handles: Vec<_> = urls
            .iter()
            .enumerate()
            .map(|(half, url)| {
                let evs = &evs;
                s.spawn(move || {
                    let client = Client::new(HTTP_TIMEOUT);
                    evs.iter()
                        .skip(half)
                        .step_by(2)
                        .map(|(id, body)| (id.clone(), post_until_answered(&client, url, body)))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    for (id, answer) in &answers {
        match answer {
            Ok(resp) => assert_accepted(resp, id, "delivery to one of two processes"),
            Err(e) => panic!("delivery of {id}: {e}"),
        }
    }

    let db = &a;
    let (done, failed) = wait_all_settled(db, N as i64);
    assert_eq!((done, failed), (N as i64, 0), "{}", outbox_dump(db));
    let mut resent = Vec::new();
    for (id, _) in &evs {
        assert_eq!(ds.effects(&key(id)), 1, "effects for {}", key(id));
        let reqs = ds.requests_for(&key(id));
        if reqs.len() != 1 {
            resent.push((id.clone(), outcomes(&reqs)));
        }
    }
    assert!(
        resent.is_empty(),
        "expected: each job sent exactly once (one lease holder per job)\n  got resent: {resent:?}"
    );
    let workers: Vec<(i64, String)> = db
        .rows(
            "SELECT count(*), min(worker) FROM attempts GROUP BY job_id HAVING count(*) > 0",
            &[],
        )
        .iter()
        .map(|r| (r.int(0), r.opt_text(1).unwrap_or_default()))
        .collect();
    assert_eq!(workers.len(), N, "one attempt row set per job");
    assert!(
        workers.iter().all(|(n, _)| *n == 1),
        "each job has exactly one attempt\n{}",
        outbox_dump(db)
    );
    for (name, server) in [("a", &a), ("b", &b)] {
        let prefix = format!("{}-", server.pid());
        assert!(
            workers.iter().any(|(_, w)| w.starts_with(&prefix)),
            "process {name} (pid {}) delivered some jobs (worker names start with the pid)\n  got workers: {:?}",
            server.pid(),
            workers
                .iter()
                .map(|(_, w)| w.as_str())
                .collect::<std::collections::BTreeSet<_>>()
        );
    }
    let completed = db.count("SELECT count(*) FROM events WHERE state = 'completed'", &[]);
    assert_eq!(completed, N as i64);
}
both_backends!(two_processes_on_one_database_send_each_job_exactly_once);

fn a_worker_whose_lease_was_taken_over_cannot_record_its_late_result(backend: Backend) {
    // Process a: after the downstream answers, its worker stalls 5s before
    // recording; the 2s lease runs out and process b takes the job over.
    let ds = Downstream::start();
    let config = one_action_config(&ds, &[]).set("forward_workers", "1");
    let mut env_a = stripe_env();
    env_a.push(("IDEMHOOK_FAILPOINTS", "forward.after_response=sleep(5000)"));
    let a = Server::start_on(backend, &config, &env_a);
    let id = "evt_fenced";
    assert_accepted(&STRIPE.deliver(&a, &stripe_event(id)), id, "delivery to a");
    wait_until(
        Duration::from_secs(10),
        "a's attempt reaches the downstream",
        || ds.effects(&key(id)) == 1,
    );

    let b = second_server(&a, &config, &stripe_env());
    let db = &a;
    let j = wait_job(db, id, ACTION, "done");
    wait_until(
        Duration::from_secs(15),
        "process a logs that its lease was lost",
        || a.stderr().contains("lease lost"),
    );
    let j_after = job(db, id, ACTION).unwrap();
    let rows = attempts(db, j.id);
    let context = format!("{}\n{}", outbox_dump(db), a.logs());
    assert_eq!(j_after.status, "done", "{context}");
    assert_eq!(j_after.n_attempts, 2, "{context}");
    assert_eq!(
        field(&rows, |a| (a.n, a.outcome.clone(), a.error_kind.clone())),
        vec![
            (1, Some("retry".into()), Some("lease".into())),
            (2, Some("ok".into()), None)
        ],
        "a's late 'ok' for attempt 1 is refused by the fence\n{context}"
    );
    assert!(
        rows[1]
            .worker
            .as_deref()
            .is_some_and(|w| w.starts_with(&format!("{}-", b.pid()))),
        "attempt 2 belongs to b (pid {})\n{context}",
        b.pid()
    );
    assert_eq!(
        outcomes(&ds.requests_for(&key(id))),
        vec![Outcome::Effect, Outcome::Repeat],
        "b's resend carried the same Idempotency-Key"
    );
    assert_eq!(ds.effects(&key(id)), 1);
}
both_backends!(a_worker_whose_lease_was_taken_over_cannot_record_its_late_result);

/// A lease only just longer than the timeout (which `check` accepts): an
/// attempt that ends a little after its lease must not be sent again
/// meanwhile by another worker. Process a's worker stalls 2.2 s after the
/// downstream answered, standing in for an attempt that overran its
/// timeout; process b looks for expired leases at least every 500 ms. The
/// takeover waits for the lease (1.01 s) plus its grace (2 s), by which
/// time a has recorded its result.
fn an_attempt_that_ends_just_after_its_lease_is_not_sent_twice(backend: Backend) {
    let ds = Downstream::start();
    let config =
        one_action_config(&ds, &[("lease", &toml_str("1010ms"))]).set("forward_workers", "1");
    let mut env_a = stripe_env();
    env_a.push(("IDEMHOOK_FAILPOINTS", "forward.after_response=sleep(2200)"));
    let a = Server::start_on(backend, &config, &env_a);
    let b = second_server(&a, &config, &stripe_env());
    let id = "evt_overrun";
    let sent = Instant::now();
    assert_accepted(&STRIPE.deliver(&a, &stripe_event(id)), id, "delivery to a");
    let db = &a;
    let j = wait_job(db, id, ACTION, "done");
    // Past the takeover time, had the job still been open.
    let settle = Duration::from_millis(3500).saturating_sub(sent.elapsed());
    std::thread::sleep(settle);
    let context = format!("{}\n{}\n{}", outbox_dump(db), a.logs(), b.logs());
    assert_eq!(
        attempt_headers(&ds.requests_for(&key(id))),
        vec!["1".to_string()],
        "sent once, by a\n{context}"
    );
    assert_eq!(
        field(&attempts(db, j.id), |r| (r.n, r.outcome.clone())),
        vec![(1, Some("ok".into()))],
        "{context}"
    );
}
both_backends!(an_attempt_that_ends_just_after_its_lease_is_not_sent_twice);

/// Regression guard for the batch-lease bug (fixed in b08ae99): a worker
/// took up to 8 jobs with one lease expiry for all and sent them one after
/// the other, so with a slow but healthy downstream (600 ms per answer,
/// under the 1s timeout) the later jobs went out after their 2s lease had
/// ended, while an idle worker had already taken them over: two workers sent
/// one job, and attempts that never hung were recorded as cut short.
fn jobs_taken_in_a_batch_are_not_sent_after_their_lease_ran_out(backend: Backend) {
    let ds = Downstream::start();
    let config = one_action_config(&ds, &[]).set("forward_workers", "2");
    let server = Server::start_on(backend, &config, &stripe_env());
    let evs = events("batch", 10);

    // Both workers busy at the gate with one job each...
    ds.close_gate();
    for (i, (id, body)) in evs[..2].iter().enumerate() {
        assert_accepted(&STRIPE.deliver(&server, body), id, "delivery");
        wait_until(
            Duration::from_secs(10),
            "each worker holds one request at the downstream",
            || ds.held() > i,
        );
    }
    // ...while eight more jobs fall due.
    for (id, body) in &evs[2..] {
        assert_accepted(&STRIPE.deliver(&server, body), id, "delivery");
    }
    ds.set_delay(Duration::from_millis(600));
    ds.open_gate();

    let db = &server;
    let (done, failed) = wait_all_settled(db, evs.len() as i64);
    let mut resent = Vec::new();
    for (id, _) in &evs {
        let reqs = ds.requests_for(&key(id));
        if reqs.len() != 1 {
            resent.push((id.clone(), outcomes(&reqs), attempt_headers(&reqs)));
        }
    }
    let lease_rows = db.dump(
        "SELECT j.event_id, a.n, a.started_at, a.worker FROM attempts a JOIN jobs j ON j.id = a.job_id WHERE a.error_kind = 'lease'",
    );
    assert!(
        resent.is_empty() && (done, failed) == (evs.len() as i64, 0),
        "expected: each job sent once and done: no attempt exceeded the 1s timeout, so no lease (2s) should run out\n  got: {done} done, {failed} failed; sent more than once: {resent:?}\n  attempts recorded as cut short (error_kind lease):\n{lease_rows}\n{}",
        outbox_dump(db)
    );
    for (id, _) in &evs {
        assert_eq!(ds.effects(&key(id)), 1);
    }
}
both_backends!(jobs_taken_in_a_batch_are_not_sent_after_their_lease_ran_out);

// ---------------------------------------------------------------------------
// 7. Pause and resume
// ---------------------------------------------------------------------------

fn paused_action_accepts_events_and_holds_their_jobs_until_resumed(backend: Backend) {
    let ds = Downstream::start();
    let (paused, running) = (ACTION, "audit");
    let config = ServerConfig::new()
        .tables(&stripe_source(SOURCE, ""))
        .tables(&forward_action(paused, &action_url(&ds, paused), &[]))
        .tables(&forward_action(running, &action_url(&ds, running), &[]));
    let server = Server::start_on(backend, &config, &stripe_env());
    let target = format!("{SOURCE}/{paused}");
    server.run_cli(&["pause", &target]).assert_success();

    let evs = events("paused", 3);
    for (id, body) in &evs {
        assert_accepted(&STRIPE.deliver(&server, body), id, "delivery while paused");
    }
    let db = &server;
    // The other action's jobs ran: the workers went past the paused ones.
    for (id, _) in &evs {
        wait_job(db, id, running, "done");
    }
    for (id, _) in &evs {
        assert_eq!(
            job(db, id, paused).map(|j| j.status).as_deref(),
            Some("paused"),
            "{}",
            outbox_dump(db)
        );
        assert!(
            ds.requests_for(&key_for(id, paused)).is_empty(),
            "nothing of a paused action reaches the downstream"
        );
        assert_ne!(event_state(db, SOURCE, id).as_deref(), Some("completed"));
    }

    server.run_cli(&["resume", &target]).assert_success();
    for (id, _) in &evs {
        wait_job(db, id, paused, "done");
        assert_eq!(ds.requests_for(&key_for(id, paused)).len(), 1);
        assert_eq!(ds.effects(&key_for(id, paused)), 1);
        assert_eq!(event_state(db, SOURCE, id).as_deref(), Some("completed"));
    }
}
both_backends!(paused_action_accepts_events_and_holds_their_jobs_until_resumed);

/// Regression guard for the paused-retry bug (fixed in b08ae99): an attempt
/// in flight when its action is paused ends in a retry; the job must then
/// wait as 'paused', not come back as 'pending' and be retried while the
/// action is paused.
fn attempt_in_flight_when_paused_that_needs_a_retry_waits_for_resume(backend: Backend) {
    let ds = Downstream::start();
    let id = "evt_pause_in_flight";
    ds.script(&key(id), Behavior::Fail500(1));
    ds.close_gate();
    let server = Server::start_on(backend, &one_action_config(&ds, &[]), &stripe_env());
    assert_accepted(&STRIPE.deliver(&server, &stripe_event(id)), id, "delivery");
    wait_until(
        Duration::from_secs(10),
        "the first attempt is in flight at the downstream",
        || ds.held() == 1,
    );
    let target = format!("{SOURCE}/{ACTION}");
    server.run_cli(&["pause", &target]).assert_success();
    ds.open_gate(); // the in-flight attempt gets its 500

    let db = &server;
    // Either the job settles as paused (right), or a retry reaches the
    // downstream while the action is paused (wrong).
    let seen = wait_for(
        JOBS_TIMEOUT,
        "the job waits as paused, or a retry reaches the downstream",
        || {
            let status = job(db, id, ACTION).map(|j| j.status);
            let sent = ds.requests_for(&key(id)).len();
            if status.as_deref() == Some("paused") || sent >= 2 {
                Ok((status, sent))
            } else {
                Err(format!("status {status:?}, {sent} request(s)"))
            }
        },
    );
    assert_eq!(
        seen,
        (Some("paused".to_string()), 1),
        "expected: after the in-flight attempt's 500 the job waits as paused, with 1 request sent\n  got: (status, requests) = {seen:?}; requests: {:?}\n{}",
        outcomes(&ds.requests_for(&key(id))),
        outbox_dump(db)
    );

    server.run_cli(&["resume", &target]).assert_success();
    wait_job(db, id, ACTION, "done");
    assert_eq!(
        outcomes(&ds.requests_for(&key(id))),
        vec![Outcome::Failed500, Outcome::Effect]
    );
}
both_backends!(attempt_in_flight_when_paused_that_needs_a_retry_waits_for_resume);

// ---------------------------------------------------------------------------
// 8. Graceful shutdown
// ---------------------------------------------------------------------------

fn sigterm_lets_the_in_flight_attempt_finish_then_exits_0(backend: Backend) {
    let ds = Downstream::start();
    ds.close_gate();
    let config = one_action_config(
        &ds,
        &[("timeout", &toml_str("5s")), ("lease", &toml_str("10s"))],
    );
    let mut server = Server::start_on(backend, &config, &stripe_env());
    let id = "evt_sigterm";
    assert_accepted(&STRIPE.deliver(&server, &stripe_event(id)), id, "delivery");
    wait_until(
        Duration::from_secs(10),
        "the attempt is in flight at the downstream",
        || ds.held() == 1,
    );

    server.terminate();
    wait_until(
        Duration::from_secs(10),
        "the server logs that it is stopping",
        || server.stderr().contains("stopping"),
    );
    ds.open_gate(); // the downstream answers during the grace period
    let status = server.wait_exit(Duration::from_secs(20));
    assert_eq!(
        status.code(),
        Some(0),
        "expected: exit 0 after SIGTERM\n  got: {status:?}\n{}",
        server.logs()
    );
    let db = &server;
    let j = job(db, id, ACTION).unwrap();
    assert_eq!(
        (j.status.as_str(), j.n_attempts),
        ("done", 1),
        "the in-flight attempt finished and was recorded before exit\n{}",
        outbox_dump(db)
    );

    server.restart();
    // A new event after restart: once it is delivered, the workers have
    // looked at every due job.
    let probe = "evt_after_restart";
    assert_accepted(
        &STRIPE.deliver(&server, &stripe_event(probe)),
        probe,
        "delivery",
    );
    let db = &server;
    wait_job(db, probe, ACTION, "done");
    assert_eq!(outcomes(&ds.requests_for(&key(id))), vec![Outcome::Effect]);
    assert_eq!(ds.effects(&key(id)), 1);
    assert_eq!(job(db, id, ACTION).unwrap().n_attempts, 1);
}
both_backends!(sigterm_lets_the_in_flight_attempt_finish_then_exits_0);

#[test]
fn sigterm_during_a_hang_exits_0_and_the_retry_after_restart_delivers_once() {
    let ds = Downstream::start();
    let id = "evt_sigterm_hang";
    ds.script(&key(id), Behavior::Hang(Duration::from_secs(5)));
    let mut server = Server::start(&one_action_config(&ds, &[]), &stripe_env());
    assert_accepted(&STRIPE.deliver(&server, &stripe_event(id)), id, "delivery");
    wait_until(
        Duration::from_secs(10),
        "the attempt is hanging at the downstream",
        || ds.requests_for(&key(id)).len() == 1,
    );

    server.terminate();
    let status = server.wait_exit(Duration::from_secs(20));
    assert_eq!(
        status.code(),
        Some(0),
        "expected: exit 0 after SIGTERM\n  got: {status:?}\n{}",
        server.logs()
    );
    let db = &server;
    let j = job(db, id, ACTION).unwrap();
    let rows = attempts(db, j.id);
    assert_eq!(
        field(&rows, |a| (a.n, a.outcome.clone(), a.error_kind.clone())),
        vec![(1, Some("retry".into()), Some("timeout".into()))],
        "the attempt that timed out during the grace period is recorded\n{}",
        outbox_dump(db)
    );

    server.restart();
    let db = &server;
    wait_job(db, id, ACTION, "done");
    assert_eq!(
        outcomes(&ds.requests_for(&key(id))),
        vec![Outcome::Hung, Outcome::Effect]
    );
    assert_eq!(ds.effects(&key(id)), 1);
    assert_eq!(event_state(db, SOURCE, id).as_deref(), Some("completed"));
}

/// Regression guard: a replay gives a dead-lettered job a fresh
/// `max_attempts` budget. Before, a job that had used up its attempts got a
/// single try after a replay and failed again on its first retryable error.
fn replay_of_a_dead_letter_gets_a_fresh_retry_budget(backend: Backend) {
    let ds = Downstream::start();
    let id = "evt_budget";
    // Two 500s use up max_attempts = 2; after the replay, one more 500 and
    // then success needs a second attempt within the new budget.
    ds.script(&key(id), Behavior::Fail500(3));
    let config = one_action_config(&ds, &[("max_attempts", "2")]);
    let server = Server::start_on(backend, &config, &stripe_env());
    assert_accepted(&STRIPE.deliver(&server, &stripe_event(id)), id, "delivery");
    let db = &server;
    let failed = wait_job(db, id, ACTION, "failed");
    assert_eq!(failed.n_attempts, 2, "{}", outbox_dump(db));

    server
        .run_cli(&["replay", SOURCE, id, "--yes"])
        .assert_success();
    let done = wait_job(db, id, ACTION, "done");
    assert_eq!(
        field(&attempts(db, done.id), |a| a.outcome.clone()),
        vec![
            Some("retry".to_string()),
            Some("failed".to_string()),
            Some("retry".to_string()),
            Some("ok".to_string())
        ],
        "{}",
        outbox_dump(db)
    );
    assert_eq!(ds.effects(&key(id)), 1);
}
both_backends!(replay_of_a_dead_letter_gets_a_fresh_retry_budget);

/// `after` naming an SQL action that succeeds in the claim: the forward
/// is due at once (nothing to wait for) and sent once; one whose SQL
/// action failed waits, parked, and is never sent.
fn a_forward_after_a_sql_action_is_sent_once_it_committed(backend: Backend) {
    let ds = Downstream::start();
    let config = ServerConfig::new()
        .set(
            "setup_sql",
            &toml_str("CREATE TABLE IF NOT EXISTS wallet(event_id TEXT, amount INTEGER CHECK (amount >= 0))"),
        )
        .tables(&stripe_source(SOURCE, ""))
        .tables(&format!(
            "[[sources.{SOURCE}.actions]]\nname = \"credit\"\n\
             sql = \"INSERT INTO wallet(event_id, amount) VALUES (:event_id, :amount)\"\n\
             params = {{ amount = \"json:/data/object/amount\" }}\n"
        ))
        .tables(&forward_action(
            ACTION,
            &action_url(&ds, ACTION),
            &[("after", "[\"credit\"]")],
        ));
    let server = Server::start_on(backend, &config, &stripe_env());
    let good = "evt_after_ok";
    assert_accepted(
        &STRIPE.deliver(&server, &stripe_event(good)),
        good,
        "delivery",
    );
    let bad = "evt_after_bad";
    let body = serde_json::json!({
        "id": bad, "object": "event", "type": "charge.succeeded",
        "data": {"object": {"id": "ch_bad", "amount": -1, "currency": "eur"}}
    })
    .to_string()
    .into_bytes();
    assert_accepted(&STRIPE.deliver(&server, &body), bad, "delivery");

    wait_job(&server, good, ACTION, "done");
    assert_eq!(ds.effects(&key(good)), 1);
    assert_eq!(
        event_state(&server, SOURCE, good).as_deref(),
        Some("completed")
    );
    // The bad one's forward waits for its failed SQL action: parked.
    wait_until(JOBS_TIMEOUT, "the bad event's forward is parked", || {
        server.count(
            "SELECT count(*) FROM jobs WHERE event_id = ?1 AND action = ?2
               AND status = 'pending' AND next_attempt_at IS NULL",
            &[&bad, &ACTION],
        ) == 1
    });
    // A later event goes through, so the workers have looked again.
    let later = "evt_after_later";
    assert_accepted(
        &STRIPE.deliver(&server, &stripe_event(later)),
        later,
        "delivery",
    );
    wait_job(&server, later, ACTION, "done");
    assert!(
        ds.requests_for(&key(bad)).is_empty(),
        "{}",
        outbox_dump(&server)
    );
    assert_eq!(ds.total_effects(), 2);
}
both_backends!(a_forward_after_a_sql_action_is_sent_once_it_committed);

/// A body that is not text (every byte value, NUL included), from a
/// source that reads its key from a header: stored byte for byte (a BLOB,
/// a bytea), forwarded byte for byte with its Content-Type, and the same
/// bytes again are a duplicate.
fn a_binary_body_is_stored_and_forwarded_byte_for_byte(backend: Backend) {
    let ds = Downstream::start();
    let config = ServerConfig::new()
        .tables(
            "[sources.raw]\nkind = \"none\"\nallow_unsigned = true\n\
             key = [\"header:X-Id\"]\ntype = \"header:X-Type\"\n",
        )
        .tables(
            &forward_action(ACTION, &action_url(&ds, ACTION), &[])
                .replace("sources.stripe.actions", "sources.raw.actions"),
        );
    let server = Server::start_on(backend, &config, &[]);
    let body: Vec<u8> = (0..=255u8).chain((0..=255u8).rev()).collect();
    let headers = crate::harness::headers(&[
        ("X-Id", "blob-1"),
        ("X-Type", "file.uploaded"),
        ("Content-Type", "application/octet-stream"),
    ]);
    let r = server.post("/hooks/raw", &headers, &body);
    assert_eq!(
        (r.status, r.json_status().as_deref()),
        (200, Some("accepted")),
        "{}",
        r.text()
    );
    let stored = server
        .row(
            "SELECT payload FROM events WHERE source = 'raw' AND event_id = 'blob-1'",
            &[],
        )
        .and_then(|r| r.bytes(0));
    assert_eq!(stored.as_deref(), Some(&body[..]), "stored byte for byte");
    let key = "raw:blob-1:notify";
    wait_until(JOBS_TIMEOUT, "the forward is done", || ds.effects(key) == 1);
    let reqs = ds.requests_for(key);
    assert!(reqs[0].body == body, "forwarded byte for byte");
    assert_eq!(
        reqs[0].header("Content-Type"),
        Some("application/octet-stream")
    );
    let again = server.post("/hooks/raw", &headers, &body);
    assert_eq!(
        (again.status, again.json_status().as_deref()),
        (200, Some("duplicate")),
        "{}",
        again.text()
    );
}
both_backends!(a_binary_body_is_stored_and_forwarded_byte_for_byte);
