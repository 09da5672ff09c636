//! The operator's side: `events list/show`, `replay`, `pause` and
//! `resume`, `prune`, `reconcile`, `erase`, `backup` and the admin API,
//! each run against a database written by the real server.
//!
//! The SQL action `ledger` fails while the `switch` table says the ledger
//! is broken and the amount is negative (a trigger raises), so a test can
//! make failed jobs, "fix the bug" with one UPDATE, and replay them.

use std::time::{Duration, Instant};

use rusqlite::OptionalExtension;
use serde_json::Value;

use crate::downstream::{Behavior, Downstream};
use crate::harness::{
    Server, ServerConfig, bytes_of, count, dump, now_secs, text_of, toml_str, wait_for, wait_until,
};
use crate::helpers::{StripeHook, api, event_state, job_status, stripe_config};
use crate::sign;

const SECRET: &str = "whsec_it_ops_secret_0123456789";
const STRIPE: StripeHook = StripeHook::new("stripe", SECRET);
const ADMIN_TOKEN: &str = "it-admin-token-7f3a9c-0123456789abcdef0123456789abcdef";

fn env() -> Vec<(&'static str, &'static str)> {
    vec![
        ("STRIPE_SECRET", SECRET),
        ("IDEMHOOK_ADMIN_TOKEN", ADMIN_TOKEN),
    ]
}

const SETUP_SQL: &str = "CREATE TABLE IF NOT EXISTS ledger(event_id TEXT, amount INTEGER);\n\
     CREATE TABLE IF NOT EXISTS switch(broken INTEGER NOT NULL);\n\
     INSERT INTO switch(broken) SELECT 1 WHERE NOT EXISTS (SELECT 1 FROM switch);\n\
     CREATE TRIGGER IF NOT EXISTS ledger_guard BEFORE INSERT ON ledger\n\
       WHEN NEW.amount < 0 AND (SELECT broken FROM switch) = 1\n\
       BEGIN SELECT RAISE(ABORT, 'ledger rejects negative amounts'); END;";

/// A stripe source `stripe` with the SQL action `ledger` (charge.succeeded)
/// and `extra` appended (more actions, retention keys).
fn config(source_extra: &str, actions_extra: &str) -> ServerConfig {
    stripe_config(&format!(
        "{source_extra}\n\
             [[sources.stripe.actions]]\nname = \"ledger\"\ntypes = [\"charge.succeeded\"]\n\
             sql = \"INSERT INTO ledger(event_id, amount) VALUES (:event_id, :amount)\"\n\
             params = {{ amount = \"json:/data/object/amount\" }}\n{actions_extra}"
    ))
    .set("setup_sql", &toml_str(SETUP_SQL))
}

fn body(id: &str, event_type: &str, amount: i64) -> Vec<u8> {
    serde_json::json!({
        "id": id,
        "object": "event",
        "type": event_type,
        "data": {"object": {"id": format!("ch_{id}"), "amount": amount}}
    })
    .to_string()
    .into_bytes()
}

fn fix_the_ledger(server: &Server) {
    server
        .db_rw()
        .execute("UPDATE switch SET broken = 0", [])
        .expect("fix the ledger");
}

fn exit_code(out: &crate::harness::CliOutput) -> Option<i32> {
    out.status.code()
}

fn keys(v: &Value) -> Vec<String> {
    let mut k: Vec<String> = v
        .as_object()
        .unwrap_or_else(|| panic!("expected a JSON object, got {v}"))
        .keys()
        .cloned()
        .collect();
    k.sort();
    k
}

fn sorted(names: &[&str]) -> Vec<String> {
    let mut k: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    k.sort();
    k
}

/// The database file and its WAL, byte for byte.
fn snapshot(server: &Server) -> (Vec<u8>, Option<Vec<u8>>) {
    let db = std::fs::read(server.db_path()).expect("read the database file");
    let mut wal = server.db_path().into_os_string();
    wal.push("-wal");
    (db, std::fs::read(wal).ok())
}

// ---------------------------------------------------------------------------

#[test]
fn events_list_and_show_print_the_contract_json() {
    let server = Server::start(&config("", ""), &env());
    let first = body("evt_list_1", "charge.succeeded", 100);
    STRIPE.deliver_ok(&server, &first);
    std::thread::sleep(Duration::from_millis(1100)); // distinct received_at seconds
    STRIPE.deliver_ok(&server, &body("evt_list_2", "charge.succeeded", -5));
    STRIPE.deliver_ok(&server, &body("evt_list_3", "customer.created", 0));
    STRIPE.deliver_ok(&server, &first); // a duplicate: one more delivery, no new event

    let out = server.run_cli(&["events", "list", "--json"]);
    out.assert_success();
    let list = out.json();
    let ids: Vec<&str> = list
        .as_array()
        .expect("an array")
        .iter()
        .map(|e| e["event_id"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(ids.len(), 3, "three events, duplicates excluded: {list}");
    assert_eq!(
        ids[2], "evt_list_1",
        "newest first: the oldest event comes last\n  got: {ids:?}"
    );
    for e in list.as_array().unwrap() {
        assert_eq!(
            keys(e),
            sorted(&["source", "event_id", "type", "state", "received_at"]),
            "events list --json item shape"
        );
        let at = e["received_at"]
            .as_i64()
            .expect("received_at is an integer");
        assert!(
            (at - now_secs()).abs() < 120,
            "received_at is unix seconds, got {at}"
        );
    }

    let failed = server
        .run_cli(&["events", "list", "--status", "failed", "--json"])
        .json();
    assert_eq!(
        failed.as_array().map(Vec::len),
        Some(1),
        "--status failed selects the event whose action failed: {failed}"
    );
    assert_eq!(failed[0]["event_id"], "evt_list_2");
    assert_eq!(failed[0]["state"], "failed");
    let typed = server
        .run_cli(&["events", "list", "--type", "customer.created", "--json"])
        .json();
    assert_eq!(typed.as_array().map(Vec::len), Some(1), "{typed}");
    let limited = server
        .run_cli(&["events", "list", "--limit", "1", "--json"])
        .json();
    assert_eq!(limited.as_array().map(Vec::len), Some(1), "{limited}");
    let bad = server.run_cli(&["events", "list", "--status", "done"]);
    assert_eq!(
        exit_code(&bad),
        Some(1),
        "an unknown event status is refused: {bad:?}"
    );

    let show = server.run_cli(&["events", "show", "stripe", "evt_list_1", "--json"]);
    show.assert_success();
    let e = show.json();
    assert_eq!(
        keys(&e),
        sorted(&[
            "source",
            "event_id",
            "type",
            "state",
            "received_at",
            "completed_at",
            "payload_hash",
            "verified_with",
            "payload",
            "headers",
            "jobs",
            "deliveries",
            "incidents",
        ]),
        "events show --json shape"
    );
    assert_eq!(e["source"], "stripe");
    assert_eq!(e["type"], "charge.succeeded");
    assert_eq!(e["state"], "completed");
    assert!(e["completed_at"].is_i64(), "completed_at set: {e}");
    assert_eq!(e["payload_hash"], sign::sha256_hex(&first));
    assert_eq!(e["verified_with"], 0);
    let sent: Value = serde_json::from_slice(&first).unwrap();
    assert_eq!(e["payload"], sent, "the payload is the body, as JSON");
    let jobs = e["jobs"].as_array().expect("jobs array");
    assert_eq!(jobs.len(), 1, "{e}");
    assert_eq!(
        keys(&jobs[0]),
        sorted(&[
            "action",
            "kind",
            "status",
            "attempts",
            "next_attempt_at",
            "last_error"
        ])
    );
    assert_eq!(jobs[0]["action"], "ledger");
    assert_eq!(jobs[0]["kind"], "sql");
    assert_eq!(jobs[0]["status"], "done");
    let attempt = &jobs[0]["attempts"][0];
    assert_eq!(
        keys(attempt),
        sorted(&[
            "n",
            "started_at",
            "finished_at",
            "outcome",
            "http_status",
            "error",
            "error_kind",
            "response",
            "request_id",
            "note"
        ])
    );
    assert_eq!(attempt["n"], 1);
    assert_eq!(attempt["outcome"], "ok");
    let outcomes: Vec<&str> = e["deliveries"]
        .as_array()
        .expect("deliveries array")
        .iter()
        .map(|d| d["outcome"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(
        outcomes,
        ["accepted", "duplicate"],
        "every delivery of the event is shown, so the duplicate is visible"
    );
    assert_eq!(
        keys(&e["deliveries"][0]),
        sorted(&["received_at", "outcome", "remote"])
    );
    assert_eq!(e["incidents"], Value::Array(vec![]));

    let failed = server
        .run_cli(&["events", "show", "stripe", "evt_list_2", "--json"])
        .json();
    assert_eq!(failed["jobs"][0]["status"], "failed");
    assert_eq!(failed["jobs"][0]["attempts"][0]["outcome"], "failed");
    assert!(
        failed["jobs"][0]["last_error"]
            .as_str()
            .is_some_and(|m| m.contains("negative")),
        "the action's error is kept: {failed}"
    );

    let human = server.run_cli(&["events", "show", "stripe", "evt_list_1"]);
    human.assert_success();
    assert!(
        human.stdout.contains("evt_list_1") && human.stdout.contains("duplicate"),
        "the human view names the event and its deliveries:\n{}",
        human.stdout
    );
    let missing = server.run_cli(&["events", "show", "stripe", "evt_nope"]);
    assert_eq!(
        exit_code(&missing),
        Some(1),
        "a missing event exits 1: {missing:?}"
    );
    assert!(
        missing.stderr.contains("evt_nope"),
        "the error names the event: {}",
        missing.stderr
    );
}

/// Regression: a replayed SQL job's run starts in the replay's own
/// millisecond, and the replay was placed after that run (in the
/// inspector's `after_attempt`, and after every attempt in `events show`).
/// It comes between the failed attempt and the run it caused.
#[test]
fn a_replayed_sql_job_shows_the_replay_before_the_run_it_caused() {
    let server = Server::start(
        &config("", "").set("admin_token", &toml_str("env:IDEMHOOK_ADMIN_TOKEN")),
        &env(),
    );
    STRIPE.deliver_ok(&server, &body("evt_rerun_order", "charge.succeeded", -3));
    fix_the_ledger(&server);
    server
        .run_cli(&["replay", "stripe", "evt_rerun_order", "--yes"])
        .assert_success();
    assert_eq!(
        job_status(&server, "stripe", "evt_rerun_order", "ledger").as_deref(),
        Some("done")
    );

    let shown = server.run_cli(&["events", "show", "stripe", "evt_rerun_order"]);
    shown.assert_success();
    let history: Vec<&str> = shown
        .stdout
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with('#') || l.starts_with("replayed "))
        .map(|l| l.split_whitespace().next().unwrap_or_default())
        .collect();
    assert_eq!(
        history,
        vec!["#1", "replayed", "#2"],
        "the failed attempt, the replay, its run\n{}",
        shown.stdout
    );
    let (status, event) = api(
        &server,
        "GET",
        "/api/events/stripe/evt_rerun_order?details=true",
        Some(ADMIN_TOKEN),
        b"",
    );
    assert_eq!(status, 200, "{event}");
    assert_eq!(
        event["replays"][0]["after_attempt"], 1,
        "the replay comes after attempt 1, before its run (2): {event}"
    );
}

#[test]
fn replay_without_yes_changes_nothing_then_reruns_a_failed_sql_job_once() {
    let mut server = Server::start(&config("", ""), &env());
    STRIPE.deliver_ok(&server, &body("evt_replay", "charge.succeeded", -7));
    assert_eq!(
        event_state(&server, "stripe", "evt_replay").as_deref(),
        Some("failed")
    );
    fix_the_ledger(&server);

    // Stop the server so nothing else writes, then look without --yes.
    server.kill9();
    let before = snapshot(&server);
    let look = server.run_cli(&["replay", "stripe", "evt_replay"]);
    look.assert_success();
    assert!(
        look.stdout.contains("failed") && look.stdout.contains("attempt 2"),
        "replay prints the state and what it would do:\n{}",
        look.stdout
    );
    assert!(
        look.stdout.contains("--yes"),
        "and how to do it:\n{}",
        look.stdout
    );
    assert!(
        snapshot(&server) == before,
        "replay without --yes must leave the database and WAL byte-identical"
    );

    server.restart();
    let run = server.run_cli(&["replay", "stripe", "evt_replay", "--yes"]);
    run.assert_success();
    let db = server.db();
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM ledger WHERE event_id = 'evt_replay'",
            []
        ),
        1,
        "the replayed SQL action ran once"
    );
    assert_eq!(
        job_status(&server, "stripe", "evt_replay", "ledger").as_deref(),
        Some("done")
    );
    assert_eq!(
        event_state(&server, "stripe", "evt_replay").as_deref(),
        Some("completed")
    );
    let attempts: Vec<(i64, String)> = db
        .prepare(
            "SELECT a.n, a.outcome FROM attempts a JOIN jobs j ON j.id = a.job_id
             WHERE j.event_id = 'evt_replay' ORDER BY a.n",
        )
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(
        attempts,
        vec![(1, "failed".to_string()), (2, "ok".to_string())],
        "the first attempt is kept and the replay is attempt 2"
    );
    let replay: (String, i64, String) = db
        .query_row("SELECT from_status, forced, origin FROM replays", [], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .unwrap_or_else(|e| {
            panic!(
                "one replay row: {e}\n{}",
                dump(&db, "SELECT * FROM replays")
            )
        });
    assert_eq!(replay, ("failed".to_string(), 0, "cli".to_string()));

    // Done now: nothing to do, and the text says how to force and what it means.
    let again = server.run_cli(&["replay", "stripe", "evt_replay", "--yes"]);
    again.assert_success();
    assert!(
        again.stdout.contains("nothing to do")
            && again.stdout.contains("--force --action ledger")
            && again.stdout.contains("second time"),
        "a completed event: nothing to do, how to force, and that SQL runs again:\n{}",
        again.stdout
    );
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM ledger WHERE event_id = 'evt_replay'",
            []
        ),
        1
    );
    let forced = server.run_cli(&[
        "replay",
        "stripe",
        "evt_replay",
        "--force",
        "--action",
        "ledger",
        "--yes",
    ]);
    forced.assert_success();
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM ledger WHERE event_id = 'evt_replay'",
            []
        ),
        2,
        "a forced SQL replay runs the statement again, as the text warned"
    );
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM replays WHERE forced = 1 AND from_status = 'done'",
            []
        ),
        1
    );
    let missing = server.run_cli(&["replay", "stripe", "evt_nope"]);
    assert_eq!(exit_code(&missing), Some(1), "{missing:?}");
}

#[test]
fn batch_replay_prints_the_count_first_and_replays_every_failed_job() {
    let server = Server::start(&config("", ""), &env());
    for i in 0..3 {
        STRIPE.deliver_ok(
            &server,
            &body(&format!("evt_batch_{i}"), "charge.succeeded", -1),
        );
    }
    STRIPE.deliver_ok(&server, &body("evt_batch_ok", "charge.succeeded", 1));
    let failed = |server: &Server| {
        count(
            &server.db(),
            "SELECT count(*) FROM jobs WHERE status = 'failed'",
            [],
        )
    };
    assert_eq!(failed(&server), 3);

    let look = server.run_cli(&["replay", "--source", "stripe", "--status", "failed"]);
    look.assert_success();
    assert!(
        look.stdout.starts_with("3 jobs to replay"),
        "the count comes first:\n{}",
        look.stdout
    );
    assert_eq!(failed(&server), 3, "without --yes nothing changed");

    fix_the_ledger(&server);
    let run = server.run_cli(&[
        "replay", "--source", "stripe", "--status", "failed", "--since", "1h", "--yes",
    ]);
    run.assert_success();
    assert!(run.stdout.starts_with("3 jobs to replay"), "{}", run.stdout);
    assert_eq!(failed(&server), 0);
    assert_eq!(
        count(
            &server.db(),
            "SELECT count(*) FROM ledger WHERE amount < 0",
            []
        ),
        3,
        "each failed job ran once"
    );
    assert_eq!(count(&server.db(), "SELECT count(*) FROM replays", []), 3);
    let none = server.run_cli(&[
        "replay", "--source", "stripe", "--status", "failed", "--yes",
    ]);
    none.assert_success();
    assert!(
        none.stdout.starts_with("0 jobs to replay"),
        "{}",
        none.stdout
    );
    let bad = server.run_cli(&["replay", "--source", "stripe", "--status", "done"]);
    assert_eq!(exit_code(&bad), Some(1), "{bad:?}");
    let unknown = server.run_cli(&["replay", "--source", "nope", "--status", "failed"]);
    assert_eq!(exit_code(&unknown), Some(1), "{unknown:?}");
}

#[test]
fn replay_of_a_failed_forward_job_completes_it_once_downstream() {
    let downstream = Downstream::start();
    let key = "stripe:evt_fwd:notify";
    downstream.script(key, Behavior::Reject400);
    let server = Server::start(
        &config(
            "",
            &format!(
                "[[sources.stripe.actions]]\nname = \"notify\"\ntypes = [\"charge.refunded\"]\n\
                 forward = \"{}/hook\"\ntimeout = \"2s\"\nlease = \"10s\"\nretry_initial = \"100ms\"\n",
                downstream.url()
            ),
        ),
        &env(),
    );
    STRIPE.deliver_ok(&server, &body("evt_fwd", "charge.refunded", 3));
    wait_until(
        Duration::from_secs(15),
        "the forward job fails on the downstream's 400",
        || job_status(&server, "stripe", "evt_fwd", "notify").as_deref() == Some("failed"),
    );
    assert_eq!(downstream.effects(key), 0);
    downstream.clear_script(key);

    let look = server.run_cli(&["replay", "stripe", "evt_fwd"]);
    look.assert_success();
    assert!(
        look.stdout.contains(key),
        "names the Idempotency-Key:\n{}",
        look.stdout
    );
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(
        job_status(&server, "stripe", "evt_fwd", "notify").as_deref(),
        Some("failed"),
        "without --yes the job stays failed"
    );

    server
        .run_cli(&["replay", "stripe", "evt_fwd", "--yes"])
        .assert_success();
    wait_until(
        Duration::from_secs(15),
        "the replayed forward job is delivered",
        || job_status(&server, "stripe", "evt_fwd", "notify").as_deref() == Some("done"),
    );
    assert_eq!(downstream.effects(key), 1, "one effect downstream");
    assert_eq!(
        event_state(&server, "stripe", "evt_fwd").as_deref(),
        Some("completed")
    );
    let attempts = count(
        &server.db(),
        "SELECT count(*) FROM attempts a JOIN jobs j ON j.id = a.job_id WHERE j.event_id = 'evt_fwd'",
        [],
    );
    assert_eq!(
        attempts, 2,
        "the failed attempt is kept; the replay is attempt 2"
    );

    // Forced: sent again with the same key, and the idempotent downstream
    // does not repeat the effect.
    server
        .run_cli(&[
            "replay", "stripe", "evt_fwd", "--force", "--action", "notify", "--yes",
        ])
        .assert_success();
    wait_for(
        Duration::from_secs(15),
        "the forced run reaches the downstream",
        || {
            let n = downstream.requests_for(key).len();
            if n >= 3
                && job_status(&server, "stripe", "evt_fwd", "notify").as_deref() == Some("done")
            {
                Ok(())
            } else {
                Err(format!("{n} requests"))
            }
        },
    );
    assert_eq!(
        downstream.effects(key),
        1,
        "still one effect after a forced replay"
    );

    // A forced re-run that fails for good leaves the done job done: its
    // effect happened once already. The failed attempt is recorded.
    downstream.script(key, Behavior::Reject400);
    server
        .run_cli(&[
            "replay", "stripe", "evt_fwd", "--force", "--action", "notify", "--yes",
        ])
        .assert_success();
    wait_for(
        Duration::from_secs(15),
        "the failing forced run is recorded",
        || {
            let failed = count(
                &server.db(),
                "SELECT count(*) FROM attempts a JOIN jobs j ON j.id = a.job_id
                 WHERE j.event_id = 'evt_fwd' AND a.n = 4 AND a.outcome = 'failed' AND a.http_status = 400",
                [],
            );
            let status = job_status(&server, "stripe", "evt_fwd", "notify");
            if failed == 1
                && status.as_deref() != Some("processing")
                && status.as_deref() != Some("pending")
            {
                Ok(())
            } else {
                Err(format!(
                    "attempt 4 failed with 400: {failed}, job {status:?}"
                ))
            }
        },
    );
    assert_eq!(
        job_status(&server, "stripe", "evt_fwd", "notify").as_deref(),
        Some("done"),
        "a failed forced re-run leaves the job done"
    );
    assert_eq!(
        event_state(&server, "stripe", "evt_fwd").as_deref(),
        Some("completed")
    );
    server.run_cli(&["reconcile"]).assert_success();
}

#[test]
fn prune_removes_only_what_retention_allows_and_never_open_or_failed_work() {
    // forward_workers = 0: the forward job stays pending.
    let server = Server::start(
        &config(
            "retention = \"8s\"\npayload_retention = \"2s\"",
            "[[sources.stripe.actions]]\nname = \"notify\"\ntypes = [\"charge.pending\"]\n\
             forward = \"http://127.0.0.1:9/never\"\n",
        )
        .set("forward_workers", "0"),
        &env(),
    );
    let started = Instant::now();
    STRIPE.deliver_ok(&server, &body("evt_old_ok", "charge.succeeded", 1));
    STRIPE.deliver_ok(&server, &body("evt_old_failed", "charge.succeeded", -1));
    STRIPE.deliver_ok(&server, &body("evt_old_pending", "charge.pending", 1));
    // Margins of 2 s on each side of both retentions: a loaded machine
    // may take a second to start each CLI run.
    std::thread::sleep(Duration::from_millis(2500));
    STRIPE.deliver_ok(&server, &body("evt_new", "charge.succeeded", 2));

    let payload = |id: &str| -> Option<Vec<u8>> {
        server
            .db()
            .query_row(
                "SELECT payload FROM events WHERE source = 'stripe' AND event_id = ?1",
                [id],
                |r| bytes_of(r, 0),
            )
            .optional()
            .expect("read payload")
            .flatten()
    };
    let exists = |id: &str| event_state(&server, "stripe", id).is_some();

    let dry = server.run_cli(&["prune", "--dry-run"]);
    dry.assert_success();
    assert!(
        dry.stdout.contains("would delete 0 event") && dry.stdout.contains("would drop 1 body"),
        "dry run counts: one body past payload_retention, no key past retention:\n{}",
        dry.stdout
    );
    assert!(payload("evt_old_ok").is_some(), "--dry-run changes nothing");

    server.run_cli(&["prune"]).assert_success();
    assert!(
        payload("evt_old_ok").is_none(),
        "body past payload_retention dropped"
    );
    let erased: Option<i64> = server
        .db()
        .query_row(
            "SELECT erased_at FROM events WHERE event_id = 'evt_old_ok'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert!(erased.is_some(), "erased_at stamped");
    assert!(
        payload("evt_old_failed").is_some(),
        "a failed job keeps its body"
    );
    assert!(
        payload("evt_old_pending").is_some(),
        "a pending job keeps its body"
    );
    assert!(payload("evt_new").is_some(), "a new body is kept");

    let wait = Duration::from_millis(8500).saturating_sub(started.elapsed());
    std::thread::sleep(wait);
    let pruned = server.run_cli(&["prune"]);
    pruned.assert_success();
    let db = server.db();
    assert!(!exists("evt_old_ok"), "key past retention deleted");
    for table in ["jobs", "deliveries", "incidents"] {
        assert_eq!(
            count(
                &db,
                &format!("SELECT count(*) FROM {table} WHERE event_id = 'evt_old_ok'"),
                []
            ),
            0,
            "{table} rows of a pruned event go with it"
        );
    }
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM attempts WHERE job_id NOT IN (SELECT id FROM jobs)",
            []
        ),
        0,
        "no orphaned attempts"
    );
    assert!(
        exists("evt_old_failed"),
        "never deletes an event with a failed job"
    );
    assert!(
        exists("evt_old_pending"),
        "never deletes an event with a pending job"
    );
    assert!(exists("evt_new"), "an event within retention stays");
    assert!(
        payload("evt_new").is_none(),
        "but its body past payload_retention goes"
    );
    assert!(
        pruned.stdout.contains("kept 2"),
        "the report says what was kept for open or failed work:\n{}",
        pruned.stdout
    );
    // The key is gone, so a redelivery is new: retention is that promise.
    let resp = STRIPE.deliver_ok(&server, &body("evt_old_ok", "charge.succeeded", 1));
    assert_eq!(resp.json_status().as_deref(), Some("accepted"));
}

#[test]
fn pause_resume_and_reconcile_report_what_needs_attention() {
    let server = Server::start(
        &config(
            "",
            "[[sources.stripe.actions]]\nname = \"notify\"\ntypes = [\"charge.pending\"]\n\
             forward = \"http://127.0.0.1:9/never\"\n",
        )
        .set("forward_workers", "0"),
        &env(),
    );
    STRIPE.deliver_ok(&server, &body("evt_rc_ok", "charge.succeeded", 1));
    let clean = server.run_cli(&["reconcile", "--json"]);
    assert_eq!(exit_code(&clean), Some(0), "clean exits 0: {clean:?}");
    let report = clean.json();
    assert_eq!(report["clean"], true);
    for k in ["stuck", "overdue", "failed", "paused"] {
        assert!(report[k].is_array(), "{k} is a list: {report}");
    }
    assert_eq!(exit_code(&server.run_cli(&["reconcile"])), Some(0));

    server.run_cli(&["pause", "stripe/notify"]).assert_success();
    STRIPE.deliver_ok(&server, &body("evt_rc_paused", "charge.pending", 1));
    assert_eq!(
        job_status(&server, "stripe", "evt_rc_paused", "notify").as_deref(),
        Some("paused"),
        "a paused action's new jobs wait as paused"
    );
    let paused = server.run_cli(&["reconcile", "--json"]);
    assert_eq!(exit_code(&paused), Some(1), "{paused:?}");
    let report = paused.json();
    assert_eq!(report["clean"], false);
    assert_eq!(report["paused"][0]["action"], "notify");
    assert_eq!(report["paused"][0]["waiting"], 1);

    server
        .run_cli(&["resume", "stripe/notify"])
        .assert_success();
    assert_eq!(
        job_status(&server, "stripe", "evt_rc_paused", "notify").as_deref(),
        Some("pending")
    );
    server.run_cli(&["pause", "stripe/notify"]).assert_success();
    assert_eq!(
        job_status(&server, "stripe", "evt_rc_paused", "notify").as_deref(),
        Some("paused"),
        "pausing turns pending jobs to paused"
    );
    server
        .run_cli(&["resume", "stripe/notify"])
        .assert_success();
    for bad in ["stripe/ledger", "stripe/nope", "nope/notify", "stripe"] {
        let out = server.run_cli(&["pause", bad]);
        assert_eq!(exit_code(&out), Some(1), "pause {bad} is refused: {out:?}");
    }

    STRIPE.deliver_ok(&server, &body("evt_rc_failed", "charge.succeeded", -1));
    let failed = server.run_cli(&["reconcile", "--json"]);
    assert_eq!(exit_code(&failed), Some(1), "{failed:?}");
    let report = failed.json();
    let ids: Vec<&str> = report["failed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["event_id"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(ids, ["evt_rc_failed"], "{report}");
    let human = server.run_cli(&["reconcile"]);
    assert_eq!(exit_code(&human), Some(1));
    assert!(human.stdout.contains("evt_rc_failed"), "{}", human.stdout);
    // A reconcile that could not look (a bad argument) exits 2, never the
    // 1 that says something needs attention.
    let misused = server.run_cli(&["reconcile", "--yes"]);
    assert_eq!(exit_code(&misused), Some(2), "{misused:?}");
    assert!(
        misused.stdout.is_empty() && misused.stderr.contains("--check --yes"),
        "{misused:?}"
    );
}

#[test]
fn erase_drops_the_body_and_keeps_duplicate_detection() {
    let server = Server::start(&config("", ""), &env());
    let b = body("evt_erase", "charge.succeeded", 5);
    STRIPE.deliver_ok(&server, &b);
    let row = |server: &Server| -> (Option<Vec<u8>>, Option<String>, Option<i64>, String) {
        server
            .db()
            .query_row(
                "SELECT payload, headers, erased_at, payload_hash FROM events WHERE event_id = 'evt_erase'",
                [],
                |r| Ok((bytes_of(r, 0)?, text_of(r, 1)?, r.get(2)?, r.get(3)?)),
            )
            .expect("the event row")
    };
    let look = server.run_cli(&["erase", "stripe", "evt_erase"]);
    look.assert_success();
    assert!(look.stdout.contains("--yes"), "{}", look.stdout);
    assert!(row(&server).0.is_some(), "without --yes nothing is erased");

    server
        .run_cli(&["erase", "stripe", "evt_erase", "--yes"])
        .assert_success();
    let (payload, headers, erased_at, hash) = row(&server);
    assert!(
        payload.is_none() && headers.is_none(),
        "body and headers dropped"
    );
    assert!(erased_at.is_some(), "erased_at stamped");
    assert_eq!(hash, sign::sha256_hex(&b), "the payload hash is kept");
    let show = server
        .run_cli(&["events", "show", "stripe", "evt_erase", "--json"])
        .json();
    assert_eq!(show["payload"], Value::Null, "show prints null once erased");

    let resp = STRIPE.deliver_ok(&server, &b);
    assert_eq!(
        resp.json_status().as_deref(),
        Some("duplicate"),
        "an erased event still catches its redelivery: {}",
        resp.text()
    );
    assert_eq!(
        count(
            &server.db(),
            "SELECT count(*) FROM ledger WHERE event_id = 'evt_erase'",
            []
        ),
        1
    );
    let missing = server.run_cli(&["erase", "stripe", "evt_nope", "--yes"]);
    assert_eq!(exit_code(&missing), Some(1), "{missing:?}");
}

#[test]
fn backup_is_a_consistent_copy_taken_while_serving() {
    let server = Server::start(&config("", ""), &env());
    for i in 0..10 {
        STRIPE.deliver_ok(
            &server,
            &body(&format!("evt_bk_{i}"), "charge.succeeded", i),
        );
    }
    // Keep writing while the backup runs.
    let url = server.url("/hooks/stripe");
    let writer = std::thread::spawn(move || {
        for i in 0..30 {
            let b = body(&format!("evt_bk_live_{i}"), "charge.succeeded", 1);
            let _ = crate::harness::try_post(&url, &sign::stripe_now(SECRET, &b), &b);
        }
    });
    let target = server.dir().join("copy.db");
    let target_arg = target.display().to_string();
    let out = server.run_cli(&["backup", &target_arg]);
    out.assert_success();
    writer.join().expect("writer thread");

    let copy = crate::harness::open_db_read_only(&target);
    let check: String = copy
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .expect("integrity_check");
    assert_eq!(check, "ok");
    let events = count(&copy, "SELECT count(*) FROM events", []);
    assert!(events >= 10, "the copy holds the events: {events}");
    let ledger = count(&copy, "SELECT count(*) FROM ledger", []);
    assert_eq!(
        ledger,
        count(
            &copy,
            "SELECT count(*) FROM jobs WHERE action = 'ledger' AND status = 'done'",
            []
        ),
        "a consistent snapshot: every done ledger job has its row"
    );

    let before = std::fs::read(&target).unwrap();
    let again = server.run_cli(&["backup", &target_arg]);
    assert!(!again.success(), "an existing path is refused: {again:?}");
    assert_eq!(std::fs::read(&target).unwrap(), before, "and left alone");
}

#[test]
fn admin_api_is_off_without_a_token_and_checks_it_when_set() {
    let off = Server::start(&config("", ""), &env());
    let (status, _) = api(&off, "GET", "/api/events", Some(ADMIN_TOKEN), b"");
    assert_eq!(status, 404, "no admin_token: the API does not exist");
    drop(off);

    let server = Server::start(
        &config("", "").set("admin_token", &toml_str("env:IDEMHOOK_ADMIN_TOKEN")),
        &env(),
    );
    STRIPE.deliver_ok(&server, &body("evt_api_ok", "charge.succeeded", 1));
    STRIPE.deliver_ok(&server, &body("evt_api_failed", "charge.succeeded", -1));

    assert_eq!(api(&server, "GET", "/api/events", None, b"").0, 401);
    assert_eq!(
        api(&server, "GET", "/api/events", Some("wrong-token"), b"").0,
        401
    );
    assert_eq!(
        api(&server, "POST", "/api/replay", Some("wrong-token"), b"{}").0,
        401,
        "a wrong token changes nothing"
    );
    wait_until(
        Duration::from_secs(5),
        "the failed authentications are logged (a request without a token is no guess)",
        || server.logs().matches("admin authentication failed").count() == 2,
    );
    assert!(
        !server.logs().contains("wrong-token"),
        "a token sent is never logged"
    );

    let (status, list) = api(&server, "GET", "/api/events", Some(ADMIN_TOKEN), b"");
    assert_eq!(status, 200);
    assert_eq!(
        list,
        server.run_cli(&["events", "list", "--json"]).json(),
        "the API answers the CLI's JSON"
    );
    let (status, failed) = api(
        &server,
        "GET",
        "/api/events?source=stripe&status=failed&limit=10",
        Some(ADMIN_TOKEN),
        b"",
    );
    assert_eq!(status, 200);
    assert_eq!(failed.as_array().map(Vec::len), Some(1), "{failed}");
    let (status, shown) = api(
        &server,
        "GET",
        "/api/events/stripe/evt_api_ok",
        Some(ADMIN_TOKEN),
        b"",
    );
    assert_eq!(status, 200);
    assert_eq!(
        shown,
        server
            .run_cli(&["events", "show", "stripe", "evt_api_ok", "--json"])
            .json()
    );
    let (status, err) = api(
        &server,
        "GET",
        "/api/events/stripe/evt_nope",
        Some(ADMIN_TOKEN),
        b"",
    );
    assert_eq!(status, 404);
    assert!(err["error"].is_string(), "{err}");
    assert_eq!(
        api(
            &server,
            "GET",
            "/api/events?status=done",
            Some(ADMIN_TOKEN),
            b""
        )
        .0,
        400
    );
    assert_eq!(
        api(
            &server,
            "GET",
            "/api/events/stripe/evt_api_failed/replay",
            Some(ADMIN_TOKEN),
            b""
        )
        .0,
        405
    );

    let (status, rc) = api(&server, "GET", "/api/reconcile", Some(ADMIN_TOKEN), b"");
    assert_eq!(status, 200);
    assert_eq!(rc["clean"], false);
    assert_eq!(rc["failed"][0]["event_id"], "evt_api_failed");

    fix_the_ledger(&server);
    let (status, done) = api(
        &server,
        "POST",
        "/api/events/stripe/evt_api_failed/replay",
        Some(ADMIN_TOKEN),
        b"",
    );
    assert_eq!(status, 200, "{done}");
    assert_eq!(done["replayed"], 1, "{done}");
    assert_eq!(done["state"], "completed", "{done}");
    assert_eq!(
        count(
            &server.db(),
            "SELECT count(*) FROM replays WHERE origin = 'api'",
            []
        ),
        1
    );
    let (status, batch) = api(
        &server,
        "POST",
        "/api/replay",
        Some(ADMIN_TOKEN),
        br#"{"source":"stripe","status":"failed"}"#,
    );
    assert_eq!(status, 200);
    assert_eq!(batch["count"], 0, "nothing failed any more: {batch}");
    assert_eq!(
        api(
            &server,
            "POST",
            "/api/replay",
            Some(ADMIN_TOKEN),
            br#"{"sauce":"stripe"}"#
        )
        .0,
        400,
        "unknown fields are refused"
    );

    let (status, paused) = api(
        &server,
        "POST",
        "/api/actions/stripe/ledger/pause",
        Some(ADMIN_TOKEN),
        b"",
    );
    assert_eq!(status, 400, "an sql action cannot be paused: {paused}");
    let (status, _) = api(
        &server,
        "POST",
        "/api/actions/stripe/nope/pause",
        Some(ADMIN_TOKEN),
        b"",
    );
    assert_eq!(status, 404);
    let (status, rc) = api(&server, "GET", "/api/reconcile", Some(ADMIN_TOKEN), b"");
    assert_eq!(status, 200);
    assert_eq!(rc["clean"], true, "{rc}");
}

/// An admin body over max_body_bytes is 413, as for a hook; it was
/// answered 400 "invalid JSON" (the server hands an over-limit body on as
/// the limit plus one byte, unread).
#[test]
fn an_admin_body_over_the_limit_is_413() {
    let server = Server::start(
        &config("", "")
            .set("admin_token", &toml_str("env:IDEMHOOK_ADMIN_TOKEN"))
            .set("max_body_bytes", "1024"),
        &env(),
    );
    let big = format!(
        r#"{{"source":"stripe","status":"failed","pad":"{}"}}"#,
        "x".repeat(2000)
    );
    let (status, answer) = api(
        &server,
        "POST",
        "/api/replay",
        Some(ADMIN_TOKEN),
        big.as_bytes(),
    );
    assert_eq!(status, 413, "{answer}");
}

#[test]
fn admin_api_pauses_and_resumes_a_forward_action() {
    let server = Server::start(
        &config(
            "",
            "[[sources.stripe.actions]]\nname = \"notify\"\ntypes = [\"charge.pending\"]\n\
             forward = \"http://127.0.0.1:9/never\"\n",
        )
        .set("forward_workers", "0")
        .set("admin_token", &toml_str("env:IDEMHOOK_ADMIN_TOKEN")),
        &env(),
    );
    STRIPE.deliver_ok(&server, &body("evt_api_pause", "charge.pending", 1));
    let (status, paused) = api(
        &server,
        "POST",
        "/api/actions/stripe/notify/pause",
        Some(ADMIN_TOKEN),
        b"",
    );
    assert_eq!(status, 200, "{paused}");
    assert_eq!(paused["paused"], true);
    assert_eq!(paused["jobs_paused"], 1);
    assert_eq!(
        job_status(&server, "stripe", "evt_api_pause", "notify").as_deref(),
        Some("paused")
    );
    let (status, resumed) = api(
        &server,
        "POST",
        "/api/actions/stripe/notify/resume",
        Some(ADMIN_TOKEN),
        b"",
    );
    assert_eq!(status, 200, "{resumed}");
    assert_eq!(resumed["jobs_resumed"], 1);
    assert_eq!(
        job_status(&server, "stripe", "evt_api_pause", "notify").as_deref(),
        Some("pending")
    );
}

#[test]
fn serve_prunes_every_prune_interval_and_keeps_failed_work() {
    let server = Server::start(
        &config("retention = \"1s\"\npayload_retention = \"1s\"", "")
            .set("prune_interval", &toml_str("300ms")),
        &env(),
    );
    STRIPE.deliver_ok(&server, &body("evt_bg_ok", "charge.succeeded", 1));
    STRIPE.deliver_ok(&server, &body("evt_bg_failed", "charge.succeeded", -1));
    wait_until(
        Duration::from_secs(15),
        "serve's pruner deletes the done event past its 1s retention",
        || event_state(&server, "stripe", "evt_bg_ok").is_none(),
    );
    assert_eq!(
        event_state(&server, "stripe", "evt_bg_failed").as_deref(),
        Some("failed"),
        "the event with a failed job is kept"
    );
    let body_kept: bool = server
        .db()
        .query_row(
            "SELECT payload IS NOT NULL FROM events WHERE event_id = 'evt_bg_failed'",
            [],
            |r| r.get(0),
        )
        .expect("the failed event's row");
    assert!(body_kept, "and keeps its body for the replay");
}
