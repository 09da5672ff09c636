//! The receiving side: verification, the claim, duplicates, status codes,
//! crash safety around the claim, and the zero-config start.
//!
//! Every test runs the real binary and asserts outcomes in the SQLite file
//! (tables `events`, `jobs`, `attempts`, `deliveries`, `incidents`, and the
//! tables the configured SQL actions write), not only the HTTP answers.

use std::collections::HashMap;
use std::os::unix::process::ExitStatusExt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::backend::{Backend, both_backends};
use crate::harness::{
    Client, HttpResponse, Server, ServerConfig, headers, now_secs, raw_exchange,
    raw_exchange_parts, raw_request, toml_str, wait_for, wait_until,
};
use crate::helpers::{StripeHook, assert_accepted, describe, stripe_config, stripe_source};
use crate::sign;

const STRIPE_SECRET: &str = "whsec_it_stripe_current_0123456789";
const STRIPE_SECRET_OLD: &str = "whsec_it_stripe_previous_9876543210";
const STRIPE: StripeHook = StripeHook::new("stripe", STRIPE_SECRET);

fn stripe_env() -> Vec<(&'static str, &'static str)> {
    vec![("STRIPE_SECRET", STRIPE_SECRET)]
}

/// A Stripe-shaped event body.
fn stripe_event(id: &str, amount: i64) -> Vec<u8> {
    serde_json::json!({
        "id": id,
        "object": "event",
        "type": "charge.succeeded",
        "created": 1764460800,
        "data": {"object": {"id": format!("ch_{id}"), "object": "charge", "amount": amount, "currency": "eur"}}
    })
    .to_string()
    .into_bytes()
}

const EVENT_STATES: [&str; 4] = ["accepted", "processing", "completed", "failed"];

fn assert_duplicate(resp: &HttpResponse, context: &str) {
    let json: serde_json::Value = serde_json::from_slice(&resp.body).unwrap_or_default();
    let state = json.get("state").and_then(|v| v.as_str()).unwrap_or("");
    let ok = resp.status == 200
        && json.get("status").and_then(|v| v.as_str()) == Some("duplicate")
        && EVENT_STATES.contains(&state);
    assert!(
        ok,
        "{context}\n  expected: 200 {{\"status\":\"duplicate\",\"state\":<one of {EVENT_STATES:?}>}}\n  got: {}",
        describe(resp)
    );
}

/// An error answer: the status and a JSON body `{"error": "<non-empty>"}`.
fn assert_error(resp: &HttpResponse, expected: u16, context: &str) {
    let json: Option<serde_json::Value> = serde_json::from_slice(&resp.body).ok();
    let has_error = json
        .as_ref()
        .and_then(|j| j.get("error"))
        .and_then(|e| e.as_str())
        .is_some_and(|e| !e.is_empty());
    assert!(
        resp.status == expected && has_error,
        "{context}\n  expected: {expected} with JSON {{\"error\": \"...\"}}\n  got: {}",
        describe(resp)
    );
}

struct EventRow {
    state: String,
    payload: Option<Vec<u8>>,
    payload_hash: Option<String>,
    verified_with: Option<i64>,
}

fn event_row(db: &Server, source: &str, event_id: &str) -> Option<EventRow> {
    db.row(
        "SELECT state, payload, payload_hash, verified_with FROM events WHERE source = ?1 AND event_id = ?2",
        &[&source, &event_id],
    )
    .map(|row| EventRow {
        state: row.opt_text(0).unwrap_or_default(),
        payload: row.bytes(1),
        payload_hash: row.opt_text(2),
        verified_with: row.opt_int(3),
    })
}

fn events_count(db: &Server) -> i64 {
    db.count("SELECT COUNT(*) FROM events", &[])
}

fn delivery_outcomes(db: &Server, source: &str, event_id: &str) -> Vec<String> {
    db.texts(
        "SELECT outcome FROM deliveries WHERE source = ?1 AND event_id = ?2 ORDER BY id",
        &[&source, &event_id],
    )
}

// ---------------------------------------------------------------------------
// 1. Concurrency: duplicates racing each other
// ---------------------------------------------------------------------------

fn concurrent_duplicates_resolve_to_one_event_and_one_ledger_row_each(backend: Backend) {
    const EVENTS: usize = 100;
    const COPIES: usize = 16;
    const THREADS: usize = 32;
    let config = ServerConfig::new()
        .set(
            "setup_sql",
            &toml_str("CREATE TABLE IF NOT EXISTS ledger(event_id TEXT, amount INTEGER)"),
        )
        .tables(&stripe_source("stripe", ""))
        .tables(
            r#"[[sources.stripe.actions]]
name = "ledger"
sql = "INSERT INTO ledger(event_id, amount) VALUES (:event_id, :amount)"
params = { amount = "json:/data/object/amount" }
"#,
        );
    let server = Server::start_on(backend, &config, &stripe_env());
    let url = server.url("/hooks/stripe");

    let event_id = |i: usize| format!("evt_conc_{i:03}");
    let amount = |i: usize| 1000 + i as i64;
    // Delivery j is a copy of event j / COPIES: the 16 copies of one event
    // are next to each other, so up to 16 threads race on the same key.
    let next = Arc::new(AtomicUsize::new(0));
    type Outcome = (usize, Result<HttpResponse, String>, Duration);
    let results: Arc<Mutex<Vec<Outcome>>> = Arc::new(Mutex::new(Vec::new()));
    let started = Instant::now();
    let workers: Vec<_> = (0..THREADS)
        .map(|_| {
            let next = Arc::clone(&next);
            let results = Arc::clone(&results);
            let url = url.clone();
            std::thread::spawn(move || {
                let client = Client::new(Duration::from_secs(10)); // keep-alive per thread
                loop {
                    let j = next.fetch_add(1, Ordering::SeqCst);
                    if j >= EVENTS * COPIES {
                        break;
                    }
                    let i = j / COPIES;
                    let body = stripe_event(&event_id(i), amount(i));
                    let t0 = Instant::now();
                    let resp =
                        client.try_post(&url, &sign::stripe_now(STRIPE_SECRET, &body), &body);
                    results.lock().unwrap().push((i, resp, t0.elapsed()));
                }
            })
        })
        .collect();
    for w in workers {
        w.join().expect("worker thread panicked");
    }
    let elapsed = started.elapsed();
    let results = std::mem::take(&mut *results.lock().unwrap());
    assert_eq!(results.len(), EVENTS * COPIES);

    let failures: Vec<String> = results
        .iter()
        .filter_map(|(i, r, took)| match r {
            Err(e) => Some(format!("event {i}: transport error after {took:?}: {e}")),
            Ok(resp) if resp.status != 200 => Some(format!("event {i}: {}", describe(resp))),
            Ok(_) => None,
        })
        .collect();
    assert!(
        failures.is_empty(),
        "expected: all {} deliveries answered 200 within 10 s\n  got {} failures, first ones:\n    {}",
        EVENTS * COPIES,
        failures.len(),
        failures
            .iter()
            .take(10)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n    ")
    );
    let slowest = results.iter().map(|(_, _, d)| *d).max().unwrap();
    eprintln!(
        "{} deliveries in {elapsed:?}, slowest {slowest:?}",
        results.len()
    );

    // Exactly one `accepted` answer per event, the rest `duplicate`.
    let mut accepted: HashMap<usize, usize> = HashMap::new();
    for (i, r, _) in &results {
        let resp = r.as_ref().unwrap();
        match resp.json_status().as_deref() {
            Some("accepted") => {
                assert_accepted(resp, &event_id(*i), "accepted answer names its event");
                *accepted.entry(*i).or_default() += 1;
            }
            Some("duplicate") => assert_duplicate(resp, "duplicate answer shape"),
            _ => panic!(
                "expected: status accepted or duplicate\n  got: {}",
                describe(resp)
            ),
        }
    }
    let wrong: Vec<String> = (0..EVENTS)
        .filter(|i| accepted.get(i).copied().unwrap_or(0) != 1)
        .map(|i| {
            format!(
                "{}: {} accepted",
                event_id(i),
                accepted.get(&i).copied().unwrap_or(0)
            )
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "expected: exactly one `accepted` per event\n  got: {wrong:?}"
    );

    let db = &server;
    assert_eq!(
        db.count("SELECT COUNT(*) FROM events WHERE source = 'stripe'", &[]),
        EVENTS as i64,
        "events rows"
    );
    let mut ledger: HashMap<String, Vec<i64>> = HashMap::new();
    for row in db.rows("SELECT event_id, amount FROM ledger", &[]) {
        ledger.entry(row.text(0)).or_default().push(row.int(1));
    }
    let ledger_rows: usize = ledger.values().map(Vec::len).sum();
    let bad: Vec<String> = (0..EVENTS)
        .filter(|&i| ledger.get(&event_id(i)) != Some(&vec![amount(i)]))
        .map(|i| format!("{}: {:?}", event_id(i), ledger.get(&event_id(i))))
        .collect();
    assert!(
        ledger_rows == EVENTS && bad.is_empty(),
        "expected: exactly {EVENTS} ledger rows, one per event with its amount\n  got: {ledger_rows} rows; wrong events: {:?}",
        bad.iter().take(10).collect::<Vec<_>>()
    );

    // Every delivery is recorded (allow the server to record them async).
    let total = (EVENTS * COPIES) as i64;
    wait_for(
        Duration::from_secs(10),
        "a deliveries row for each of the 1600 deliveries",
        || {
            let n = db.count(
                "SELECT COUNT(*) FROM deliveries WHERE source = 'stripe'",
                &[],
            );
            if n == total {
                Ok(())
            } else {
                Err(format!("{n} rows"))
            }
        },
    );
    let accepted_rows = db.count(
        "SELECT COUNT(*) FROM deliveries WHERE outcome = 'accepted'",
        &[],
    );
    let duplicate_rows = db.count(
        "SELECT COUNT(*) FROM deliveries WHERE outcome = 'duplicate'",
        &[],
    );
    assert_eq!(
        (accepted_rows, duplicate_rows),
        (EVENTS as i64, total - EVENTS as i64),
        "expected (accepted, duplicate) deliveries rows\n{}",
        db.dump("SELECT outcome, COUNT(*) FROM deliveries GROUP BY outcome")
    );
}
both_backends!(concurrent_duplicates_resolve_to_one_event_and_one_ledger_row_each);

// ---------------------------------------------------------------------------
// 2. A failing SQL action
// ---------------------------------------------------------------------------

fn failing_sql_action_is_rolled_back_and_marked_failed_while_a_good_action_commits(
    backend: Backend,
) {
    // On SQLite, `INSERT OR FAIL` keeps the rows a statement wrote before
    // the failing one, so the first VALUES row is a partial effect unless
    // the server rolls the action back (a savepoint per action). On
    // PostgreSQL an error aborts the whole transaction: the claim and the
    // next action commit only if the failed action is rolled back to its
    // own savepoint.
    let insert = match backend {
        Backend::Sqlite => "INSERT OR FAIL INTO",
        Backend::Postgres => "INSERT INTO",
    };
    let config = ServerConfig::new()
        .set(
            "setup_sql",
            &toml_str(
                "CREATE TABLE IF NOT EXISTS ledger(event_id TEXT, amount INTEGER CHECK (amount >= 0));\n\
                 CREATE TABLE IF NOT EXISTS audit(event_id TEXT);",
            ),
        )
        .tables(&stripe_source("stripe", ""))
        .tables(&format!(
            r#"[[sources.stripe.actions]]
name = "bad-ledger"
sql = "{insert} ledger(event_id, amount) VALUES (:event_id, 1), (:event_id, :amount)"
params = {{ amount = "json:/data/object/amount" }}

[[sources.stripe.actions]]
name = "audit"
sql = "INSERT INTO audit(event_id) VALUES (:event_id)"
"#
        ));
    let server = Server::start_on(backend, &config, &stripe_env());
    let body = stripe_event("evt_negative", -500);
    let resp = STRIPE.deliver(&server, &body);
    assert_accepted(
        &resp,
        "evt_negative",
        "a buggy action never loses the event",
    );

    let db = &server;
    let row = event_row(db, "stripe", "evt_negative")
        .expect("expected: the event is stored; got: no events row");
    assert_eq!(
        row.payload.as_deref(),
        Some(&body[..]),
        "stored payload is the exact body"
    );

    let job = |action: &str| -> Option<(String, Option<String>)> {
        db.row(
            "SELECT status, last_error FROM jobs WHERE source = 'stripe' AND event_id = 'evt_negative' AND action = ?1",
            &[&action],
        )
        .map(|row| (row.text(0), row.opt_text(1)))
    };
    let (status, last_error) = wait_for(
        Duration::from_secs(5),
        "job bad-ledger to be failed",
        || match job("bad-ledger") {
            Some((s, e)) if s == "failed" => Ok((s, e)),
            other => Err(format!("{other:?}\n{}", db.dump("SELECT * FROM jobs"))),
        },
    );
    assert_eq!(status, "failed");
    assert!(
        last_error.as_deref().is_some_and(|e| !e.trim().is_empty()),
        "expected: a non-empty last_error on the failed job\n  got: {last_error:?}"
    );
    assert_eq!(
        db.count("SELECT COUNT(*) FROM ledger", &[]),
        0,
        "expected: no partial effect of the failed action (its first VALUES row rolled back)\n{}",
        db.dump("SELECT * FROM ledger")
    );
    wait_for(
        Duration::from_secs(5),
        "job audit to be done",
        || match job("audit") {
            Some((s, _)) if s == "done" => Ok(()),
            other => Err(format!("{other:?}")),
        },
    );
    assert_eq!(
        db.count(
            "SELECT COUNT(*) FROM audit WHERE event_id = 'evt_negative'",
            &[]
        ),
        1,
        "good action committed"
    );

    let failed_attempts = db.count("SELECT COUNT(*) FROM attempts a JOIN jobs j ON a.job_id = j.id \
         WHERE j.source = 'stripe' AND j.event_id = 'evt_negative' AND j.action = 'bad-ledger' AND a.outcome = 'failed'",
        &[],
    );
    assert_eq!(
        failed_attempts,
        1,
        "expected: one recorded attempt with outcome failed\n{}",
        db.dump("SELECT * FROM attempts")
    );
    let state = event_row(db, "stripe", "evt_negative").unwrap().state;
    assert_eq!(state, "failed", "event state with a failed job");

    // A re-delivery is a duplicate and runs no action again.
    assert_duplicate(
        &STRIPE.deliver(&server, &body),
        "re-delivery after a failed action",
    );
    assert_eq!(
        db.count("SELECT COUNT(*) FROM audit", &[]),
        1,
        "duplicate must not re-run actions"
    );
    assert_eq!(db.count("SELECT COUNT(*) FROM ledger", &[]), 0);
}
both_backends!(failing_sql_action_is_rolled_back_and_marked_failed_while_a_good_action_commits);

/// Concurrent events, every fourth with an amount its SQL action's CHECK
/// refuses, each delivered twice: the claims are grouped into shared
/// transactions, and each failing action rolls back only itself. Every
/// answer is 200, every event is stored once, the good ones with their
/// ledger row, every event with its audit row, the bad ones' jobs failed.
fn failing_actions_in_concurrent_claims_roll_back_alone(backend: Backend) {
    const EVENTS: usize = 60;
    let config = ServerConfig::new()
        .set("busy_timeout", &toml_str("30s"))
        .set(
            "setup_sql",
            &toml_str(
                "CREATE TABLE IF NOT EXISTS ledger(event_id TEXT, amount INTEGER CHECK (amount >= 0));\n\
                 CREATE TABLE IF NOT EXISTS audit(event_id TEXT);",
            ),
        )
        .tables(&stripe_source("stripe", ""))
        .tables(
            r#"[[sources.stripe.actions]]
name = "ledger"
sql = "INSERT INTO ledger(event_id, amount) VALUES (:event_id, :amount)"
params = { amount = "json:/data/object/amount" }

[[sources.stripe.actions]]
name = "audit"
sql = "INSERT INTO audit(event_id) VALUES (:event_id)"
"#,
        );
    let server = Server::start_on(backend, &config, &stripe_env());
    let amount = |i: usize| if i % 4 == 3 { -1 } else { i as i64 };
    let event_id = |i: usize| format!("evt_mixed_{i:03}");
    let next = Arc::new(AtomicUsize::new(0));
    let url = server.url("/hooks/stripe");
    let workers: Vec<_> = (0..16)
        .map(|_| {
            let (next, url) = (Arc::clone(&next), url.clone());
            std::thread::spawn(move || {
                let client = Client::new(Duration::from_secs(60));
                let mut answers = Vec::new();
                loop {
                    let j = next.fetch_add(1, Ordering::SeqCst);
                    if j >= EVENTS * 2 {
                        break answers;
                    }
                    let i = j / 2;
                    let body = stripe_event(&event_id(i), amount(i));
                    let r = client.post(&url, &sign::stripe_now(STRIPE_SECRET, &body), &body);
                    answers.push((i, r.status, r.text()));
                }
            })
        })
        .collect();
    for w in workers {
        for (i, status, text) in w.join().expect("a sender finished") {
            assert_eq!(status, 200, "event {i}: {text}");
        }
    }
    let bad = (0..EVENTS).filter(|i| amount(*i) < 0).count() as i64;
    assert_eq!(
        server.count("SELECT count(*) FROM events", &[]),
        EVENTS as i64
    );
    assert_eq!(
        server.count("SELECT count(*) FROM audit", &[]),
        EVENTS as i64,
        "every event's good action committed once\n{}",
        server.dump("SELECT event_id, count(*) FROM audit GROUP BY event_id HAVING count(*) <> 1")
    );
    assert_eq!(
        server.count("SELECT count(DISTINCT event_id) FROM audit", &[]),
        EVENTS as i64
    );
    let ledger = server.rows("SELECT event_id, amount FROM ledger ORDER BY event_id", &[]);
    let expected: Vec<(String, i64)> = (0..EVENTS)
        .filter(|i| amount(*i) >= 0)
        .map(|i| (event_id(i), amount(i)))
        .collect();
    assert_eq!(
        ledger
            .iter()
            .map(|r| (r.text(0), r.int(1)))
            .collect::<Vec<_>>(),
        expected,
        "one ledger row per good event, none of a bad one"
    );
    assert_eq!(
        server.count(
            "SELECT count(*) FROM jobs WHERE action = 'ledger' AND status = 'failed'",
            &[]
        ),
        bad
    );
    assert_eq!(
        server.count("SELECT count(*) FROM events WHERE state = 'failed'", &[]),
        bad
    );
    assert_eq!(
        server.count(
            "SELECT count(*) FROM deliveries WHERE outcome = 'accepted'",
            &[]
        ),
        EVENTS as i64
    );
}
both_backends!(failing_actions_in_concurrent_claims_roll_back_alone);

// ---------------------------------------------------------------------------
// 3. Crash safety around the claim
// ---------------------------------------------------------------------------

fn kill9_after_claim_commit_keeps_the_event_and_redelivery_is_duplicate(backend: Backend) {
    let config = stripe_config("");
    let mut env = stripe_env();
    env.push(("IDEMHOOK_FAILPOINTS", "claim.after_commit=kill"));
    let mut server = Server::start_on(backend, &config, &env);
    let body = stripe_event("evt_crash_1", 4200);

    let answer = crate::harness::try_post(
        &server.url("/hooks/stripe"),
        &sign::stripe_now(STRIPE_SECRET, &body),
        &body,
    );
    if let Ok(resp) = &answer {
        assert_ne!(
            resp.status,
            200,
            "expected: no 2xx (killed before the response)\n  got: {}",
            describe(resp)
        );
    }
    let status = server.wait_exit(Duration::from_secs(10));
    assert_eq!(
        status.signal(),
        Some(9),
        "expected: the failpoint SIGKILLs the process\n  got: {status:?}"
    );

    server.remove_env("IDEMHOOK_FAILPOINTS");
    server.restart();
    let db = &server;
    let row = event_row(db, "stripe", "evt_crash_1").unwrap_or_else(|| {
        panic!(
            "expected: the committed claim survives kill -9\n  got: no row\n{}",
            db.dump("SELECT source, event_id, state FROM events")
        )
    });
    assert_eq!(
        row.payload.as_deref(),
        Some(&body[..]),
        "stored payload is the exact body"
    );

    let resp = STRIPE.deliver(&server, &body);
    assert_duplicate(&resp, "the provider's retry after the crash");
    assert_eq!(events_count(db), 1);
}
both_backends!(kill9_after_claim_commit_keeps_the_event_and_redelivery_is_duplicate);

fn kill9_right_after_200_keeps_every_acknowledged_event(backend: Backend) {
    const N: usize = 20;
    let config = stripe_config("");
    let mut server = Server::start_on(backend, &config, &stripe_env());
    let bodies: Vec<(String, Vec<u8>)> = (0..N)
        .map(|i| {
            let id = format!("evt_acked_{i:02}");
            let body = stripe_event(&id, i as i64);
            (id, body)
        })
        .collect();
    for (id, body) in &bodies {
        assert_accepted(
            &STRIPE.deliver(&server, body),
            id,
            "delivery before the crash",
        );
    }
    let status = server.kill9(); // right after the last 200
    assert_eq!(status.signal(), Some(9));

    server.restart();
    let db = &server;
    let missing: Vec<&str> = bodies
        .iter()
        .filter(|(id, body)| {
            event_row(db, "stripe", id)
                .and_then(|r| r.payload)
                .as_deref()
                != Some(&body[..])
        })
        .map(|(id, _)| id.as_str())
        .collect();
    assert!(
        missing.is_empty(),
        "expected: every acknowledged event survives kill -9 with its payload\n  got missing or changed: {missing:?}"
    );
    for (_, body) in &bodies {
        assert_duplicate(&STRIPE.deliver(&server, body), "re-delivery after restart");
    }
    assert_eq!(events_count(db), N as i64);
}
both_backends!(kill9_right_after_200_keeps_every_acknowledged_event);

/// SIGTERM while deliveries stream in on keep-alive connections (answers
/// written by the answer thread): the server exits 0 within its grace,
/// every request it read is answered or its connection closed (none is left
/// hanging until the client gives up), and every acknowledged event is
/// stored.
/// A request under way when SIGTERM comes (its head read, its body not
/// yet sent) is read to its end and answered: stored and 200, not a 400
/// for a body cut short. Only idle connections are ended at once.
fn a_request_under_way_at_sigterm_is_finished(backend: Backend) {
    use std::io::{Read, Write};
    let mut server = Server::start_on(backend, &stripe_config(""), &stripe_env());
    let body = stripe_event("evt_term_cut", 1);
    let raw = raw_request(
        "POST",
        "/hooks/stripe",
        &sign::stripe_now(STRIPE_SECRET, &body),
        &body,
    );
    let head_len = raw.len() - body.len();
    let mut stream = std::net::TcpStream::connect(server.addr()).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("read timeout");
    stream.write_all(&raw[..head_len]).expect("send the head");
    // Let the server read the head and wait for the body.
    std::thread::sleep(Duration::from_millis(500));
    server.terminate();
    std::thread::sleep(Duration::from_millis(200));
    stream.write_all(&raw[head_len..]).expect("send the body");
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer).into_owned();
    assert!(
        answer.starts_with("HTTP/1.1 200") && answer.contains("\"accepted\""),
        "expected 200 accepted, got:\n{answer}"
    );
    let status = server.wait_exit(Duration::from_secs(10));
    assert_eq!(status.code(), Some(0), "serve exits 0 after SIGTERM");
    assert_eq!(events_count(&server), 1, "the event is stored");
}
both_backends!(a_request_under_way_at_sigterm_is_finished);

fn sigterm_under_load_answers_or_closes_every_request_and_keeps_every_acknowledged_event(
    backend: Backend,
) {
    const THREADS: usize = 8;
    const BEFORE_TERM: usize = 200;
    const HUNG: Duration = Duration::from_secs(4);
    let mut server = Server::start_on(backend, &stripe_config(""), &stripe_env());
    let url = server.url("/hooks/stripe");
    let acked: Arc<Mutex<Vec<String>>> = Arc::new(Mutex::new(Vec::new()));
    let odd: Arc<Mutex<Vec<String>>> = Arc::new(Mutex::new(Vec::new()));
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let (url, acked, odd) = (url.clone(), Arc::clone(&acked), Arc::clone(&odd));
            std::thread::spawn(move || {
                let client = Client::new(Duration::from_secs(30));
                for i in 0.. {
                    let id = format!("evt_term_{t}_{i}");
                    let body = stripe_event(&id, 1);
                    let t0 = Instant::now();
                    let resp =
                        client.try_post(&url, &sign::stripe_now(STRIPE_SECRET, &body), &body);
                    let took = t0.elapsed();
                    if took >= HUNG {
                        odd.lock()
                            .unwrap()
                            .push(format!("{id}: no answer for {took:?}"));
                    }
                    match resp {
                        Ok(r) if r.status == 200 => acked.lock().unwrap().push(id),
                        // Refused while stopping: allowed, but nothing stored is promised.
                        Ok(r) if r.status == 503 => {}
                        Ok(r) => odd.lock().unwrap().push(format!("{id}: {}", describe(&r))),
                        // The server closed the connection or stopped listening.
                        Err(_) => break,
                    }
                }
            })
        })
        .collect();
    wait_until(
        Duration::from_secs(20),
        "deliveries acknowledged before SIGTERM",
        || acked.lock().unwrap().len() >= BEFORE_TERM,
    );
    server.terminate();
    let status = server.wait_exit(Duration::from_secs(20));
    for w in workers {
        w.join().expect("client thread panicked");
    }
    assert_eq!(
        status.code(),
        Some(0),
        "expected: exit 0 after SIGTERM under load\n  got: {status:?}\n{}",
        server.logs()
    );
    let odd = odd.lock().unwrap();
    assert!(
        odd.is_empty(),
        "expected: every request answered 200 or 503, or its connection closed, within {HUNG:?}\n  got: {odd:?}"
    );
    let db = &server;
    let acked = acked.lock().unwrap();
    let missing: Vec<&String> = acked
        .iter()
        .filter(|id| event_row(db, "stripe", id).is_none())
        .collect();
    assert!(
        acked.len() >= BEFORE_TERM && missing.is_empty(),
        "expected: every acknowledged event stored ({} acknowledged)\n  got missing: {missing:?}",
        acked.len()
    );
}
both_backends!(
    sigterm_under_load_answers_or_closes_every_request_and_keeps_every_acknowledged_event
);

// ---------------------------------------------------------------------------
// 4. Mismatched duplicates
// ---------------------------------------------------------------------------

fn mismatched_duplicate_keeps_the_original_and_records_an_incident(backend: Backend) {
    let config = ServerConfig::new()
        .tables(&stripe_source("stripe", ""))
        .tables(&stripe_source("strict", "on_mismatch = \"reject\""));
    let server = Server::start_on(backend, &config, &stripe_env());
    let db = &server;

    for (source, expected_status) in [("stripe", 200u16), ("strict", 409u16)] {
        let id = format!("evt_mismatch_{source}");
        let original = stripe_event(&id, 100);
        let altered = stripe_event(&id, 999);
        assert_accepted(
            &STRIPE.at(source).deliver(&server, &original),
            &id,
            "original delivery",
        );

        let resp = STRIPE.at(source).deliver(&server, &altered);
        if expected_status == 200 {
            assert_eq!(
                resp.status,
                200,
                "on_mismatch = ack (default)\n  expected: 200\n  got: {}",
                describe(&resp)
            );
        } else {
            assert_error(&resp, 409, "on_mismatch = \"reject\"");
        }

        let row = event_row(db, source, &id).expect("event row");
        assert_eq!(
            row.payload.as_deref(),
            Some(&original[..]),
            "[{source}] original payload untouched"
        );
        assert_eq!(
            row.payload_hash.as_deref(),
            Some(crate::sign::sha256_hex(&original).as_str()),
            "[{source}] payload_hash is the original body's"
        );
        let incidents = wait_for(Duration::from_secs(5), "one incidents row", || {
            let kinds = db.texts(
                "SELECT kind FROM incidents WHERE source = ?1 AND event_id = ?2",
                &[&source, &id],
            );
            if kinds.len() == 1 {
                Ok(kinds)
            } else {
                Err(format!("{kinds:?}"))
            }
        });
        assert_eq!(
            incidents,
            vec!["payload_mismatch".to_string()],
            "[{source}] incident kind"
        );

        // The identical body again is a plain duplicate: no new incident.
        assert_duplicate(
            &STRIPE.at(source).deliver(&server, &original),
            "identical re-delivery",
        );
        let outcomes = wait_for(Duration::from_secs(5), "three deliveries rows", || {
            let o = delivery_outcomes(db, source, &id);
            if o.len() == 3 {
                Ok(o)
            } else {
                Err(format!("{o:?}"))
            }
        });
        assert_eq!(
            outcomes,
            vec!["accepted", "mismatch", "duplicate"],
            "[{source}] deliveries outcomes"
        );
        assert_eq!(
            db.count(
                "SELECT COUNT(*) FROM incidents WHERE source = ?1 AND event_id = ?2",
                &[&source, &id]
            ),
            1,
            "[{source}] identical duplicate adds no incident"
        );
    }
}
both_backends!(mismatched_duplicate_keeps_the_original_and_records_an_incident);

// ---------------------------------------------------------------------------
// 5. Status codes
// ---------------------------------------------------------------------------

fn status_200_accepted_then_200_duplicate_with_state(backend: Backend) {
    let server = Server::start_on(backend, &stripe_config(""), &stripe_env());
    let body = stripe_event("evt_status_1", 1);
    assert_accepted(
        &STRIPE.deliver(&server, &body),
        "evt_status_1",
        "first delivery",
    );
    assert_duplicate(&STRIPE.deliver(&server, &body), "second delivery");
    assert_eq!(server.count("SELECT count(*) FROM events", &[]), 1);
    let row = server.one(
        "SELECT state, payload FROM events WHERE source = ?1 AND event_id = ?2",
        &[&"stripe", &"evt_status_1"],
    );
    assert_eq!(row.bytes(1).as_deref(), Some(&body[..]), "the exact body");
    assert!(EVENT_STATES.contains(&row.text(0).as_str()), "{row:?}");
}
both_backends!(status_200_accepted_then_200_duplicate_with_state);

fn status_400_for_missing_id_invalid_json_and_duplicated_signature_header(backend: Backend) {
    let server = Server::start_on(backend, &stripe_config(""), &stripe_env());

    let no_id = br#"{"object":"event","type":"charge.succeeded","data":{"object":{}}}"#;
    assert_error(
        &STRIPE.deliver(&server, no_id),
        400,
        "signed body without /id",
    );

    let invalid = br#"{"id":"evt_invalid","type":"charge.succeeded","#;
    assert_error(
        &STRIPE.deliver(&server, invalid),
        400,
        "signed invalid JSON",
    );

    // Two Stripe-Signature headers, each valid on its own.
    let body = stripe_event("evt_dup_header", 1);
    let sig = sign::stripe_signature_header(STRIPE_SECRET, &body, now_secs());
    let request = raw_request(
        "POST",
        "/hooks/stripe",
        &[
            sig.clone(),
            sig,
            ("Content-Type".to_string(), "application/json".to_string()),
        ],
        &body,
    );
    let answer = raw_exchange(server.addr(), &request, Duration::from_secs(5));
    assert_eq!(
        answer.status,
        Some(400),
        "duplicated Stripe-Signature header\n  expected: 400\n  got: {:?} ({})\n{}",
        answer.status,
        answer.ended_by,
        answer.text()
    );

    assert_eq!(events_count(&server), 0, "nothing stored for a 400");
    assert_eq!(server.get("/healthz").status, 200, "server still up");
}
both_backends!(status_400_for_missing_id_invalid_json_and_duplicated_signature_header);

/// The id and type headers of header-keyed kinds, sent twice, are as
/// ambiguous as a repeated signature: 400, nothing stored. A JSON body
/// that is not JSON is refused even where no rule reads the body; a
/// form-encoded one is not checked. A signed Standard Webhooks request
/// without its id header has no event id: 400, not 401.
#[test]
fn status_400_for_repeated_id_or_type_headers_a_false_json_body_and_no_webhook_id() {
    const GH: &str = "gh-secret-it";
    const WH: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let server = Server::start(
        &ServerConfig::new().tables(&format!(
            "[sources.gh]\nkind = \"github\"\nsecrets = [\"{GH}\"]\n\
             [sources.wh]\nkind = \"standard\"\nsecrets = [\"{WH}\"]\n"
        )),
        &[],
    );
    let send = |path: &str, hdrs: &[(String, String)], body: &[u8]| {
        raw_exchange(
            server.addr(),
            &raw_request("POST", path, hdrs, body),
            Duration::from_secs(5),
        )
    };
    let body = br#"{"action":"opened","number":1}"#;
    for (header, second) in [
        ("X-GitHub-Delivery", "d-other"),
        ("X-GitHub-Delivery", "d-1"),
        ("X-GitHub-Event", "issues"),
    ] {
        let mut hdrs = sign::github(GH, body, "d-1", "pull_request");
        hdrs.push((header.to_string(), second.to_string()));
        let answer = send("/hooks/gh", &hdrs, body);
        assert_eq!(
            answer.status,
            Some(400),
            "{header} sent twice\n{}",
            answer.text()
        );
        assert!(
            answer.text().contains(&header.to_ascii_lowercase()),
            "the answer names the header\n{}",
            answer.text()
        );
    }
    assert_eq!(events_count(&server), 0, "nothing stored for a 400");

    let not_json = b"{not json";
    let answer = send(
        "/hooks/gh",
        &sign::github(GH, not_json, "d-2", "push"),
        not_json,
    );
    assert_eq!(
        answer.status,
        Some(400),
        "application/json that is not JSON\n{}",
        answer.text()
    );
    let form = b"payload=%7B%7D";
    let mut hdrs = sign::github(GH, form, "d-3", "push");
    hdrs.retain(|(n, _)| !n.eq_ignore_ascii_case("content-type"));
    hdrs.push((
        "Content-Type".to_string(),
        "application/x-www-form-urlencoded".to_string(),
    ));
    assert_eq!(
        send("/hooks/gh", &hdrs, form).status,
        Some(200),
        "a form body"
    );

    let event = br#"{"type":"invoice.paid"}"#;
    let mut hdrs = sign::standard(WH, "msg_1", now_secs(), event);
    hdrs.retain(|(n, _)| n != "webhook-id");
    let answer = send("/hooks/wh", &hdrs, event);
    assert_eq!(
        answer.status,
        Some(400),
        "signed, no webhook-id\n{}",
        answer.text()
    );
    assert!(answer.text().contains("no event id"), "{}", answer.text());

    assert_eq!(events_count(&server), 1, "only the form body stored");
    assert_eq!(server.get("/healthz").status, 200, "server still up");
}

/// Numeric ids beyond what a u64 or an f64 holds keep their digits: two
/// events whose ids differ in the last digit are two events (they were
/// rounded to one, the second answered as a mismatched duplicate).
#[test]
fn large_numeric_ids_are_two_events_not_one() {
    let server = Server::start(
        &ServerConfig::new().tables(
            "[sources.open]\nkind = \"none\"\nallow_unsigned = true\nkey = [\"json:/id\"]\n",
        ),
        &[],
    );
    for id in [
        "18446744073709551616",
        "18446744073709551617",
        "123456789012345678901234567890",
        "123456789012345678901234567891",
        "1.50",
        "1.5",
    ] {
        let body = format!(r#"{{"id":{id},"type":"n"}}"#);
        let resp = server.post("/hooks/open", &[], body.as_bytes());
        assert_accepted(&resp, id, &format!("id {id}"));
    }
    assert_eq!(events_count(&server), 6);
}

/// An id or type with a control character could never be forwarded (it
/// goes in a header): refused at receipt, not failed at every attempt.
#[test]
fn status_400_for_a_control_character_in_the_id_or_type() {
    let server = Server::start(
        &ServerConfig::new().tables(
            "[sources.open]\nkind = \"none\"\nallow_unsigned = true\nkey = [\"json:/id\"]\ntype = \"json:/type\"\n",
        ),
        &[],
    );
    for body in [
        r#"{"id":"a\nb","type":"t"}"#,
        r#"{"id":"a\u0000b","type":"t"}"#,
        r#"{"id":"ok","type":"t\u0007"}"#,
    ] {
        let resp = server.post("/hooks/open", &[], body.as_bytes());
        assert_eq!(resp.status, 400, "{body}: {}", resp.text());
        assert!(resp.text().contains("control character"), "{}", resp.text());
    }
    assert_eq!(events_count(&server), 0);
}

#[test]
fn status_400_for_a_header_with_a_nul_byte() {
    let server = Server::start(&stripe_config(""), &stripe_env());
    let body = stripe_event("evt_nul", 1);
    let mut hdrs = sign::stripe_now(STRIPE_SECRET, &body);
    hdrs.push(("X-Note".to_string(), "a\u{0}b".to_string()));
    let answer = raw_exchange(
        server.addr(),
        &raw_request("POST", "/hooks/stripe", &hdrs, &body),
        Duration::from_secs(5),
    );
    assert_eq!(
        answer.status,
        Some(400),
        "header with NUL\n  expected: 400\n  got: {:?}\n{}",
        answer.status,
        answer.text()
    );
    assert_eq!(events_count(&server), 0, "nothing stored");
    assert_eq!(server.get("/healthz").status, 200, "server still up");
}

fn status_401_for_bad_missing_stale_or_future_signatures(backend: Backend) {
    let server = Server::start_on(backend, &stripe_config("tolerance = \"5m\""), &stripe_env());
    let url = "/hooks/stripe";
    let body = stripe_event("evt_unauth", 1);
    let json = headers(&[("Content-Type", "application/json")]);

    // (what, headers, body)
    let cases: Vec<(&str, sign::Headers, Vec<u8>)> = vec![
        (
            "wrong secret",
            sign::stripe_now("whsec_not_the_secret", &body),
            body.clone(),
        ),
        ("missing signature", json.clone(), body.clone()),
        (
            "stale timestamp (10 min old, tolerance 5m)",
            sign::stripe(STRIPE_SECRET, &body, now_secs() - 600),
            body.clone(),
        ),
        (
            "future timestamp (10 min ahead)",
            sign::stripe(STRIPE_SECRET, &body, now_secs() + 600),
            body.clone(),
        ),
        (
            "body changed after signing",
            sign::stripe_now(STRIPE_SECRET, &body),
            stripe_event("evt_unauth", 2),
        ),
    ];
    for (what, hdrs, b) in cases {
        assert_error(&server.post(url, &hdrs, &b), 401, what);
    }
    assert_eq!(events_count(&server), 0, "nothing stored for a 401");
    // The same body, correctly signed, is still new.
    assert_accepted(
        &STRIPE.deliver(&server, &body),
        "evt_unauth",
        "correct signature after the rejects",
    );
}
both_backends!(status_401_for_bad_missing_stale_or_future_signatures);

#[test]
fn status_404_unknown_source_and_405_wrong_method() {
    let server = Server::start(&stripe_config(""), &stripe_env());
    let body = stripe_event("evt_404", 1);
    assert_error(
        &server.post(
            "/hooks/no-such-source",
            &sign::stripe_now(STRIPE_SECRET, &body),
            &body,
        ),
        404,
        "POST to an unknown source",
    );
    assert_error(&server.get("/hooks/stripe"), 405, "GET on a hook route");
    assert_eq!(events_count(&server), 0);
}

#[test]
fn status_413_for_bodies_over_max_body_bytes_declared_or_chunked() {
    const LIMIT: usize = 1024;
    let config = ServerConfig::new()
        .set("max_body_bytes", &LIMIT.to_string())
        .tables(&stripe_source("stripe", ""));
    let server = Server::start(&config, &stripe_env());

    // A body of exactly the limit is fine.
    let edge = padded_event("evt_edge", LIMIT);
    assert_eq!(edge.len(), LIMIT);
    assert_accepted(
        &STRIPE.deliver(&server, &edge),
        "evt_edge",
        "body of exactly max_body_bytes",
    );

    // One byte over, sent whole.
    let over = padded_event("evt_over", LIMIT + 1);
    assert_error(
        &STRIPE.deliver(&server, &over),
        413,
        "body of max_body_bytes + 1",
    );

    // Declared 50 MB, only 2 KiB sent: answered without reading it all.
    let big = padded_event("evt_declared", 2048);
    let mut hdrs = sign::stripe_now(STRIPE_SECRET, &big);
    hdrs.push(("Content-Length".to_string(), (50 * 1024 * 1024).to_string()));
    let answer = raw_exchange(
        server.addr(),
        &raw_request("POST", "/hooks/stripe", &hdrs, &big),
        Duration::from_secs(5),
    );
    assert_eq!(
        answer.status,
        Some(413),
        "declared Content-Length 50 MiB with max_body_bytes {LIMIT}\n  expected: 413 without waiting for the body\n  got: {:?} after {:?} ({})",
        answer.status,
        answer.elapsed,
        answer.ended_by
    );

    // Chunked, 8 KiB in 1 KiB chunks, no length declared.
    let chunked_body = padded_event("evt_chunked", 8192);
    let mut hdrs = sign::stripe_now(STRIPE_SECRET, &chunked_body);
    hdrs.push(("Transfer-Encoding".to_string(), "chunked".to_string()));
    let head = raw_request("POST", "/hooks/stripe", &hdrs, b"");
    let mut parts: Vec<Vec<u8>> = vec![head];
    for chunk in chunked_body.chunks(1024) {
        let mut part = format!("{:x}\r\n", chunk.len()).into_bytes();
        part.extend_from_slice(chunk);
        part.extend_from_slice(b"\r\n");
        parts.push(part);
    }
    parts.push(b"0\r\n\r\n".to_vec());
    let part_refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
    let answer = raw_exchange_parts(
        server.addr(),
        &part_refs,
        Duration::from_millis(5),
        Duration::from_secs(5),
    );
    assert_eq!(
        answer.status,
        Some(413),
        "chunked body of 8 KiB with max_body_bytes {LIMIT}\n  expected: 413\n  got: {:?} ({})\n{}",
        answer.status,
        answer.ended_by,
        answer.text()
    );

    let db = &server;
    assert_eq!(
        db.count(
            "SELECT COUNT(*) FROM events WHERE event_id != 'evt_edge'",
            &[]
        ),
        0,
        "nothing stored for a 413\n{}",
        db.dump("SELECT source, event_id FROM events")
    );
    assert_eq!(server.get("/healthz").status, 200, "server still up");
}

/// A Stripe-shaped event whose JSON is exactly `len` bytes (padding in a
/// string field).
fn padded_event(id: &str, len: usize) -> Vec<u8> {
    let make = |pad: usize| {
        format!(
            r#"{{"id":"{id}","object":"event","type":"charge.succeeded","data":{{"object":{{"amount":1,"pad":"{}"}}}}}}"#,
            "x".repeat(pad)
        )
        .into_bytes()
    };
    let base = make(0).len();
    assert!(
        len >= base,
        "padded_event: {len} is shorter than the skeleton ({base})"
    );
    make(len - base)
}

#[test]
fn status_503_with_retry_after_while_the_database_is_locked() {
    // The config exposes no busy timeout, so hold an exclusive lock from a
    // second connection for up to HOLD and expect the server to give up
    // within it (its busy timeout plus slack).
    const HOLD: Duration = Duration::from_secs(30);
    let server = Server::start(&stripe_config(""), &stripe_env());
    assert_eq!(server.get("/readyz").status, 200, "ready before the lock");
    let body = stripe_event("evt_locked", 1);

    let locker = server.db_rw();
    locker
        .execute_batch("BEGIN EXCLUSIVE")
        .expect("take the write lock");
    let client = Client::new(HOLD);
    let started = Instant::now();
    let resp = client.try_post(
        &server.url("/hooks/stripe"),
        &sign::stripe_now(STRIPE_SECRET, &body),
        &body,
    );
    let took = started.elapsed();
    let readyz_while_locked = Client::new(HOLD).try_get(&server.url("/readyz"));
    locker.execute_batch("ROLLBACK").expect("release the lock");

    let resp = resp.unwrap_or_else(|e| {
        panic!("expected: 503 while the database is locked\n  got: {e} after {took:?}")
    });
    assert_error(
        &resp,
        503,
        &format!(
            "delivery while another connection holds BEGIN EXCLUSIVE (answered after {took:?})"
        ),
    );
    let retry_after = resp.header("retry-after").map(str::to_string);
    assert!(
        retry_after
            .as_deref()
            .is_some_and(|v| v.trim().parse::<u64>().is_ok()),
        "expected: a Retry-After header in seconds on the 503\n  got: {retry_after:?}"
    );
    match readyz_while_locked {
        Ok(r) => assert_eq!(
            r.status,
            503,
            "expected: /readyz 503 while the database is not writable\n  got: {}",
            describe(&r)
        ),
        Err(e) => panic!("expected: /readyz 503 while locked\n  got: {e}"),
    }

    wait_until(
        Duration::from_secs(10),
        "/readyz 200 after the lock is released",
        || server.get("/readyz").status == 200,
    );
    // The 503 stored nothing: the same event is new now.
    assert_accepted(
        &STRIPE.deliver(&server, &body),
        "evt_locked",
        "retry after the lock cleared",
    );
    assert_eq!(events_count(&server), 1);
}

#[test]
fn idle_and_slow_connections_do_not_starve_deliveries() {
    // Slow or idle connections never starve normal deliveries (tiny_http
    // could queue a new connection behind idle ones): 64 connections that
    // send nothing or half a request must not delay a normal delivery past
    // a bound.
    const IDLE: usize = 48;
    const HALF: usize = 16;
    const BOUND: Duration = Duration::from_secs(2);
    let server = Server::start(&stripe_config(""), &stripe_env());
    let mut held = Vec::new();
    for i in 0..IDLE + HALF {
        let mut s = std::net::TcpStream::connect(server.addr()).expect("connect idle");
        if i >= IDLE {
            use std::io::Write as _;
            let _ = s.write_all(
                b"POST /hooks/stripe HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n",
            );
        }
        held.push(s);
    }
    for i in 0..10 {
        let id = format!("evt_starve_{i}");
        let body = stripe_event(&id, i);
        let client = Client::new(BOUND);
        let started = Instant::now();
        let resp = client
            .try_post(&server.url("/hooks/stripe"), &sign::stripe_now(STRIPE_SECRET, &body), &body)
            .unwrap_or_else(|e| {
                panic!("expected: an answer within {BOUND:?} with {} idle/slow connections open\n  got: {e} after {:?}", held.len(), started.elapsed())
            });
        assert_accepted(&resp, &id, "delivery while idle connections are open");
    }
    drop(held);
    assert_eq!(events_count(&server), 10);
}

fn healthz_and_readyz_answer_200(backend: Backend) {
    let server = Server::start_on(backend, &stripe_config(""), &stripe_env());
    for path in ["/healthz", "/readyz"] {
        let resp = server.get(path);
        assert_eq!(
            resp.status,
            200,
            "GET {path}\n  expected: 200\n  got: {}",
            describe(&resp)
        );
    }
}
both_backends!(healthz_and_readyz_answer_200);

// ---------------------------------------------------------------------------
// 6. Secret rotation
// ---------------------------------------------------------------------------

fn rotated_secrets_accept_the_old_signature_and_record_which_matched(backend: Backend) {
    let svix_new = sign::whsec(b"standard-webhooks-new-key-000001");
    let svix_old = sign::whsec(b"standard-webhooks-old-key-000002");
    let config = ServerConfig::new().tables(
        r#"[sources.stripe]
kind = "stripe"
secrets = ["env:STRIPE_SECRET", "env:STRIPE_SECRET_OLD"]

[sources.svix]
kind = "standard"
secrets = ["env:SVIX_SECRET", "env:SVIX_SECRET_OLD"]

[sources.filed]
kind = "stripe"
secrets = ["file:filed-secret.txt"]
"#,
    );
    let server = Server::start_with_files(
        &backend.config(config),
        &[
            ("STRIPE_SECRET", STRIPE_SECRET),
            ("STRIPE_SECRET_OLD", STRIPE_SECRET_OLD),
            ("SVIX_SECRET", &svix_new),
            ("SVIX_SECRET_OLD", &svix_old),
        ],
        // A `file:` secret, relative to the config's folder, newline trimmed.
        &[("filed-secret.txt", b"filed_secret_value\n")],
    );
    let db = &server;

    let new_body = stripe_event("evt_rot_new", 1);
    assert_accepted(
        &STRIPE.deliver(&server, &new_body),
        "evt_rot_new",
        "signed with the current secret",
    );
    let old_body = stripe_event("evt_rot_old", 2);
    let resp = server.post(
        "/hooks/stripe",
        &sign::stripe_now(STRIPE_SECRET_OLD, &old_body),
        &old_body,
    );
    assert_accepted(&resp, "evt_rot_old", "signed with the previous secret");
    assert_eq!(
        event_row(db, "stripe", "evt_rot_new")
            .unwrap()
            .verified_with,
        Some(0),
        "verified_with for secrets[0]"
    );
    assert_eq!(
        event_row(db, "stripe", "evt_rot_old")
            .unwrap()
            .verified_with,
        Some(1),
        "verified_with for secrets[1]"
    );

    let svix_body = br#"{"type":"invoice.paid","data":{"id":"inv_1"}}"#;
    let resp = server.post(
        "/hooks/svix",
        &sign::standard(&svix_old, "msg_rot_old", now_secs(), svix_body),
        svix_body,
    );
    assert_accepted(
        &resp,
        "msg_rot_old",
        "standard webhooks signed with the previous secret",
    );
    assert_eq!(
        event_row(db, "svix", "msg_rot_old").unwrap().verified_with,
        Some(1),
        "standard: verified_with"
    );

    let filed_body = stripe_event("evt_filed", 3);
    let resp = server.post(
        "/hooks/filed",
        &sign::stripe_now("filed_secret_value", &filed_body),
        &filed_body,
    );
    assert_accepted(
        &resp,
        "evt_filed",
        "file: secret with its trailing newline trimmed",
    );
    assert_eq!(
        event_row(db, "filed", "evt_filed").unwrap().verified_with,
        Some(0)
    );

    let stranger = stripe_event("evt_rot_stranger", 4);
    assert_error(
        &server.post(
            "/hooks/stripe",
            &sign::stripe_now("whsec_neither", &stranger),
            &stranger,
        ),
        401,
        "signed with a secret that is in neither slot",
    );

    // Secrets never reach logs.
    let logs = format!("{}{}", server.stdout(), server.stderr());
    for (name, secret) in [
        ("STRIPE_SECRET", STRIPE_SECRET),
        ("STRIPE_SECRET_OLD", STRIPE_SECRET_OLD),
        ("SVIX_SECRET", svix_new.as_str()),
        ("SVIX_SECRET_OLD", svix_old.as_str()),
        ("filed secret", "filed_secret_value"),
    ] {
        assert!(
            !logs.contains(secret),
            "expected: {name} absent from the server's stdout and stderr\n  got: it is printed"
        );
    }
}
both_backends!(rotated_secrets_accept_the_old_signature_and_record_which_matched);

// ---------------------------------------------------------------------------
// 7. Zero config
// ---------------------------------------------------------------------------

#[test]
fn zero_config_serve_prints_the_send_line_and_send_demo_stores_an_event() {
    let server = Server::start_zero_config(&[]);
    let line = wait_for(
        Duration::from_secs(5),
        "a line with `idemhook send demo` in serve's stdout",
        || {
            let stdout = server.stdout();
            match stdout.lines().find(|l| l.contains("idemhook send demo")) {
                Some(l) => Ok(l.to_string()),
                None => Err(format!("stdout: {stdout:?}")),
            }
        },
    );

    // Run the printed command as a user would copy it (its `--url`, if any,
    // is in whatever form `send` expects); without one, add this server's.
    let printed = &line[line.find("idemhook send demo").unwrap()..];
    let mut args: Vec<&str> = printed.split_whitespace().skip(1).collect();
    if !args.contains(&"--url") {
        args.extend(["--url", server.base_url()]);
    }
    let url_arg = args
        .iter()
        .position(|a| *a == "--url")
        .and_then(|i| args.get(i + 1))
        .copied()
        .unwrap_or("");
    assert!(
        url_arg.starts_with(server.base_url()),
        "expected: the printed --url points at this server ({})\n  got: {line:?}",
        server.base_url()
    );
    let out = server.run_cli_raw(&args);
    out.assert_success();

    // `check` in the same folder describes that default, as `serve` runs it.
    let check = server.run_cli_raw(&["check"]);
    check.assert_success();
    assert!(
        check.stdout.starts_with("config development default")
            && check
                .stdout
                .contains("source demo (kind standard) POST /hooks/demo"),
        "expected: `idemhook check` without a config file describes the development default\n  got: {}",
        check.stdout
    );
    // A file named explicitly must exist.
    let missing = server.run_cli_raw(&["check", "--config", "missing.toml"]);
    assert!(
        !missing.success() && missing.stderr.contains("missing.toml"),
        "expected: `check --config missing.toml` fails and names the file\n  got: {} {}",
        missing.stdout,
        missing.stderr
    );

    let db_path = server.dir().join("idemhook.db");
    assert!(
        db_path.exists(),
        "expected: ./idemhook.db in serve's working directory"
    );
    let db = &server;
    wait_for(
        Duration::from_secs(5),
        "one demo event in ./idemhook.db",
        || {
            let n = db.count("SELECT COUNT(*) FROM events WHERE source = 'demo'", &[]);
            if n == 1 {
                Ok(())
            } else {
                Err(format!(
                    "{n} events\n{}",
                    db.dump("SELECT source, event_id, state FROM events")
                ))
            }
        },
    );
}
