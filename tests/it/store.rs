//! Storage and the operator's last resorts, against the real binary: what
//! `/readyz` proves, what durability normal costs at low load, a database
//! path that does not exist, a forced re-run that fails, `resolve`, what
//! `events show` tells about the downstream's answers, and space given
//! back by `prune`.

use std::time::Duration;

use serde_json::{Value, json};

use crate::downstream::{Behavior, Downstream};
use crate::harness::{CLI_TIMEOUT, Server, count, dump, run_binary, toml_str, wait_until};
use crate::helpers::{StripeHook, api, event_state, job_status, stripe_config};

const SECRET: &str = "whsec_it_store_secret_0123456789";
const STRIPE: StripeHook = StripeHook::new("stripe", SECRET);
const ADMIN_TOKEN: &str = "it-store-admin-token-51c2-0123456789abcdef0123456789abcdef";

fn env() -> Vec<(&'static str, &'static str)> {
    vec![
        ("STRIPE_SECRET", SECRET),
        ("IDEMHOOK_ADMIN_TOKEN", ADMIN_TOKEN),
    ]
}

fn body(id: &str) -> Vec<u8> {
    json!({"id": id, "object": "event", "type": "charge.succeeded",
           "data": {"object": {"id": format!("ch_{id}"), "amount": 100}}})
    .to_string()
    .into_bytes()
}

/// (n, outcome, error_kind, note) of a job's attempts.
fn attempts(server: &Server, event_id: &str) -> Vec<(i64, String, Option<String>, Option<String>)> {
    server
        .db()
        .prepare(
            "SELECT a.n, a.outcome, a.error_kind, a.note FROM attempts a JOIN jobs j ON j.id = a.job_id
             WHERE j.source = 'stripe' AND j.event_id = ?1 ORDER BY a.n",
        )
        .unwrap()
        .query_map([event_id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

// ---------------------------------------------------------------------------

/// Regression: /readyz took any commit of the last 2 s as proof, so right
/// after a burst it answered 200 while another process held the write
/// lock. Each request now gets its own probe.
#[test]
fn readyz_is_503_while_another_process_holds_the_write_lock_even_right_after_commits() {
    let server = Server::start(
        &stripe_config("").set("busy_timeout", &toml_str("300ms")),
        &env(),
    );
    for i in 0..5 {
        STRIPE.deliver_ok(&server, &body(&format!("evt_burst_{i}")));
    }
    let holder = server.db_rw();
    holder
        .execute_batch("BEGIN IMMEDIATE")
        .expect("take the write lock");
    let held = server.get("/readyz");
    assert_eq!(
        held.status,
        503,
        "another process holds the write lock, commits a moment ago prove nothing\n  got: {} {}",
        held.status,
        held.text()
    );
    assert!(
        held.header("Retry-After").is_some(),
        "503 carries Retry-After"
    );
    holder.execute_batch("ROLLBACK").expect("release the lock");
    wait_until(
        Duration::from_secs(10),
        "/readyz 200 once the lock is gone",
        || server.get("/readyz").status == 200,
    );
}

/// The checkpoint sequence number in the WAL header (bytes 12..16): SQLite
/// adds one each time a completed checkpoint lets the WAL start over.
fn wal_restarts(server: &Server) -> u32 {
    let mut wal = server.db_path().into_os_string();
    wal.push("-wal");
    let bytes = std::fs::read(&wal).expect("read the WAL");
    assert!(bytes.len() >= 32, "the WAL has a header");
    u32::from_be_bytes([bytes[12], bytes[13], bytes[14], bytes[15]])
}

/// Regression: with durability normal the checkpointer ran after nearly
/// every commit, so a lone delivery cost a checkpoint's fsyncs (about three
/// per delivery measured with strace) though normal promises to spare
/// them. At low load the WAL is now checkpointed on its size or a timer.
#[test]
fn durability_normal_does_not_checkpoint_after_every_delivery_at_low_load() {
    let server = Server::start(
        &stripe_config("").set("durability", &toml_str("normal")),
        &env(),
    );
    STRIPE.deliver_ok(&server, &body("evt_first"));
    let before = wal_restarts(&server);
    let n = 20;
    for i in 0..n {
        // Low load: one delivery at a time, a little apart.
        std::thread::sleep(Duration::from_millis(50));
        STRIPE.deliver_ok(&server, &body(&format!("evt_low_{i}")));
    }
    let restarts = wal_restarts(&server).wrapping_sub(before);
    assert!(
        restarts <= 3,
        "{n} single deliveries restarted the WAL {restarts} times: a checkpoint ran after nearly each one"
    );
    assert_eq!(
        count(&server.db(), "SELECT count(*) FROM events", []),
        i64::from(n) + 1
    );
}

/// Regression: a mistyped `database` path silently created the folders
/// and an empty database. Now serve refuses a missing folder, says loudly
/// when it creates a new database file, and `check` reports the database.
#[test]
fn a_database_in_a_missing_folder_is_refused_and_a_new_database_is_announced() {
    // Refused: the folder does not exist, and is not created.
    let dir = tempfile::tempdir().expect("tempdir");
    let config_path = dir.path().join("idemhook.toml");
    std::fs::write(
        &config_path,
        stripe_config("")
            .set("database", &toml_str("data/typo/idemhook.db"))
            .render(),
    )
    .unwrap();
    let env: std::collections::BTreeMap<String, String> = env()
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let args = |verb: &str| -> Vec<String> {
        vec![
            verb.to_string(),
            "--config".to_string(),
            config_path.display().to_string(),
        ]
    };
    let serve = run_binary(dir.path(), &env, &args("serve"), CLI_TIMEOUT);
    assert!(!serve.success(), "serve must refuse: {serve:?}");
    assert!(
        serve.stderr.contains("database")
            && serve.stderr.contains("data/typo")
            && serve.stderr.contains("does not exist"),
        "the error names `database` and the folder:\n{}",
        serve.stderr
    );
    assert!(!dir.path().join("data").exists(), "no folder was created");
    let check = run_binary(dir.path(), &env, &args("check"), CLI_TIMEOUT);
    assert!(!check.success(), "check fails as serve would: {check:?}");
    assert!(check.stderr.contains("data/typo"), "{}", check.stderr);

    // A fresh database: check says it does not exist yet; serve says loudly
    // that it created it, once.
    let fresh = tempfile::tempdir().expect("tempdir");
    let fresh_config = fresh.path().join("idemhook.toml");
    std::fs::write(&fresh_config, stripe_config("").render()).unwrap();
    let check_args = vec![
        "check".to_string(),
        "--config".to_string(),
        fresh_config.display().to_string(),
    ];
    let check = run_binary(fresh.path(), &env, &check_args, CLI_TIMEOUT);
    assert!(check.success(), "{check:?}");
    assert!(
        check.stdout.contains("does not exist yet"),
        "{}",
        check.stdout
    );
    assert!(
        !fresh.path().join("idemhook.db").exists(),
        "check created nothing"
    );

    let mut server = Server::start(&stripe_config(""), &self::env());
    wait_until(
        Duration::from_secs(10),
        "the new database announced",
        || server.stderr().contains("NEW DATABASE"),
    );
    STRIPE.deliver_ok(&server, &body("evt_a"));
    STRIPE.deliver_ok(&server, &body("evt_b"));
    server.restart();
    let logs = server.stderr();
    let after_restart = logs.split("restart #1").nth(1).unwrap_or_default();
    assert!(
        !after_restart.contains("NEW DATABASE"),
        "an existing database is not announced as new:\n{logs}"
    );
    let check = server.run_cli(&["check"]);
    check.assert_success();
    assert!(
        check.stdout.contains("exists, 2 events stored"),
        "{}",
        check.stdout
    );
    assert!(!check.stdout.contains("warning"), "{}", check.stdout);

    // The key rule in the config differs from the recorded one: warned.
    let changed = server.dir().join("changed.toml");
    std::fs::write(
        &changed,
        stripe_config("").tables("").render().replace(
            "kind = \"stripe\"",
            "kind = \"stripe\"\nkey = [\"json:/data/object/id\"]",
        ),
    )
    .unwrap();
    let changed_path = changed.display().to_string();
    let check = server.run_cli_raw(&["check", "--config", &changed_path]);
    check.assert_success();
    assert!(
        check.stdout.contains(
            "warning: source stripe: the key rule differs from the one recorded in the database"
        ),
        "{}",
        check.stdout
    );
}

/// Regression: `replay --force` of a done SQL action whose statement fails
/// (the README's UNIQUE ledger) turned a completed event into failed for
/// good. The job stays done; the failed attempt is recorded and reported.
#[test]
fn a_forced_rerun_that_fails_leaves_the_done_job_done() {
    let server = Server::start(
        &stripe_config(
            "[[sources.stripe.actions]]\nname = \"credit\"\n\
             sql = \"INSERT INTO ledger(event_id, amount) VALUES (:event_id, :amount)\"\n\
             params = { amount = \"json:/data/object/amount\" }\n",
        )
        .set(
            "setup_sql",
            &toml_str("CREATE TABLE IF NOT EXISTS ledger(event_id TEXT UNIQUE, amount INTEGER);"),
        ),
        &env(),
    );
    STRIPE.deliver_ok(&server, &body("evt_once"));
    assert_eq!(
        event_state(&server, "stripe", "evt_once").as_deref(),
        Some("completed")
    );
    let forced = server.run_cli(&[
        "replay", "stripe", "evt_once", "--force", "--action", "credit", "--yes",
    ]);
    assert_eq!(
        forced.status.code(),
        Some(1),
        "the forced run failed: {forced:?}"
    );
    assert!(
        forced.stdout.contains("UNIQUE") && forced.stdout.contains("stays done"),
        "the failure is reported, and that the job stays done:\n{}",
        forced.stdout
    );
    assert_eq!(
        job_status(&server, "stripe", "evt_once", "credit").as_deref(),
        Some("done")
    );
    assert_eq!(
        event_state(&server, "stripe", "evt_once").as_deref(),
        Some("completed")
    );
    assert_eq!(
        attempts(&server, "evt_once"),
        vec![
            (1, "ok".to_string(), None, None),
            (2, "failed".to_string(), Some("sql".to_string()), None)
        ]
    );
    assert_eq!(
        count(&server.db(), "SELECT count(*) FROM ledger", []),
        1,
        "the effect happened once"
    );
    let reconcile = server.run_cli(&["reconcile"]);
    assert_eq!(
        reconcile.status.code(),
        Some(0),
        "reconcile stays clean: {reconcile:?}"
    );
}

/// `events show` tells what the downstream answered; `resolve` closes a
/// failed job by hand as a new operator attempt, on the CLI and the API.
#[test]
fn resolve_closes_a_failed_job_as_an_operator_attempt_and_show_has_the_answers() {
    let downstream = Downstream::start();
    let server = Server::start(
        &stripe_config(&format!(
            "[[sources.stripe.actions]]\nname = \"notify\"\nforward = {}\nmax_attempts = 1\n",
            toml_str(&downstream.url())
        ))
        .set("admin_token", &toml_str("env:IDEMHOOK_ADMIN_TOKEN")),
        &env(),
    );
    for id in ["evt_cli", "evt_api"] {
        downstream.script(&format!("stripe:{id}:notify"), Behavior::Reject400);
    }
    // Keys in an order of their own: shown as received.
    let raw =
        br#"{"zulu":1,"id":"evt_cli","type":"charge.succeeded","alpha":{"yankee":2,"bravo":3}}"#;
    STRIPE.deliver_ok(&server, raw);
    STRIPE.deliver_ok(&server, &body("evt_api"));
    for id in ["evt_cli", "evt_api"] {
        wait_until(Duration::from_secs(20), "the 400 fails the job", || {
            job_status(&server, "stripe", id, "notify").as_deref() == Some("failed")
        });
    }

    let show = server.run_cli(&["events", "show", "stripe", "evt_cli", "--json"]);
    show.assert_success();
    let event = show.json();
    let attempt = &event["jobs"][0]["attempts"][0];
    let mut keys: Vec<&str> = attempt
        .as_object()
        .expect("an attempt object")
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "error",
            "error_kind",
            "finished_at",
            "http_status",
            "n",
            "note",
            "outcome",
            "request_id",
            "response",
            "started_at"
        ]
    );
    assert_eq!(attempt["http_status"], json!(400));
    assert_eq!(attempt["error_kind"], json!("status"));
    assert_eq!(attempt["response"], json!(r#"{"error":"scripted 400"}"#));
    assert!(
        attempt["request_id"]
            .as_str()
            .is_some_and(|r| r.starts_with("ds-")),
        "{attempt}"
    );
    assert!(event["headers"].is_object(), "the kept headers: {event}");
    let at = |s: &str| {
        show.stdout
            .find(s)
            .unwrap_or_else(|| panic!("{s} in {}", show.stdout))
    };
    assert!(
        at("zulu") < at("\"id\"") && at("yankee") < at("bravo"),
        "{}",
        show.stdout
    );
    let text = server.run_cli(&["events", "show", "stripe", "evt_cli"]);
    text.assert_success();
    assert!(
        text.stdout.contains("(status)")
            && text.stdout.contains("http 400")
            && text.stdout.contains(r#"answer: {"error":"scripted 400"}"#),
        "{}",
        text.stdout
    );
    let at = |s: &str| {
        text.stdout
            .find(s)
            .unwrap_or_else(|| panic!("{s} in {}", text.stdout))
    };
    assert!(at("zulu") < at("alpha"), "{}", text.stdout);

    // CLI: a dry run first, then the close.
    let note = "refunded by hand, ticket 4711";
    let dry = server.run_cli(&[
        "resolve", "stripe", "evt_cli", "--action", "notify", "--note", note,
    ]);
    dry.assert_success();
    assert!(
        dry.stdout.contains("--yes") && dry.stdout.contains("attempt 2"),
        "{}",
        dry.stdout
    );
    assert_eq!(
        job_status(&server, "stripe", "evt_cli", "notify").as_deref(),
        Some("failed")
    );
    let run = server.run_cli(&[
        "resolve", "stripe", "evt_cli", "--action", "notify", "--note", note, "--yes",
    ]);
    run.assert_success();
    assert_eq!(
        job_status(&server, "stripe", "evt_cli", "notify").as_deref(),
        Some("done")
    );
    // A done job has no last error, however it was done; the failure
    // stays in its attempts.
    let closed = server
        .run_cli(&["events", "show", "stripe", "evt_cli", "--json"])
        .json();
    assert_eq!(closed["jobs"][0]["last_error"], Value::Null, "{closed:#}");
    assert_eq!(
        event_state(&server, "stripe", "evt_cli").as_deref(),
        Some("completed")
    );
    assert_eq!(
        attempts(&server, "evt_cli"),
        vec![
            (1, "failed".to_string(), Some("status".to_string()), None),
            (
                2,
                "ok".to_string(),
                Some("operator".to_string()),
                Some(note.to_string())
            )
        ],
        "the failed attempt is kept; the close is attempt 2\n{}",
        dump(&server.db(), "SELECT * FROM attempts")
    );
    let again = server.run_cli(&[
        "resolve", "stripe", "evt_cli", "--action", "notify", "--note", note, "--yes",
    ]);
    assert_eq!(again.status.code(), Some(2), "{again:?}");
    assert!(again.stderr.contains("not failed"), "{}", again.stderr);
    let shown = server.run_cli(&["events", "show", "stripe", "evt_cli"]);
    assert!(
        shown.stdout.contains("(operator)") && shown.stdout.contains(note),
        "{}",
        shown.stdout
    );

    // The admin API: the plan, the close, then 409.
    let path = "/api/events/stripe/evt_api/resolve";
    let (status, plan) = api(
        &server,
        "POST",
        path,
        Some(ADMIN_TOKEN),
        json!({"action": "notify", "note": "voided", "dry_run": true}).to_string(),
    );
    assert_eq!((status, &plan["dry_run"]), (200, &json!(true)), "{plan}");
    assert_eq!(
        job_status(&server, "stripe", "evt_api", "notify").as_deref(),
        Some("failed")
    );
    let (status, missing) = api(
        &server,
        "POST",
        path,
        Some(ADMIN_TOKEN),
        json!({"action": "notify"}).to_string(),
    );
    assert_eq!(status, 400, "{missing}");
    // An empty note is refused in the API's words, not the CLI's.
    let (status, empty) = api(
        &server,
        "POST",
        path,
        Some(ADMIN_TOKEN),
        json!({"action": "notify", "note": " "}).to_string(),
    );
    assert_eq!(status, 400, "{empty}");
    let said = empty["error"].as_str().unwrap_or_default();
    assert!(
        said.contains("\"note\"") && !said.contains("--note"),
        "{empty}"
    );
    let (status, done) = api(
        &server,
        "POST",
        path,
        Some(ADMIN_TOKEN),
        json!({"action": "notify", "note": "voided"}).to_string(),
    );
    assert_eq!(status, 200, "{done}");
    assert_eq!(done["state"], json!("completed"), "{done}");
    assert_eq!(
        job_status(&server, "stripe", "evt_api", "notify").as_deref(),
        Some("done")
    );
    let (status, refused) = api(
        &server,
        "POST",
        path,
        Some(ADMIN_TOKEN),
        json!({"action": "notify", "note": "voided"}).to_string(),
    );
    assert_eq!(status, 409, "{refused}");
    let reconcile = server.run_cli(&["reconcile"]);
    assert_eq!(reconcile.status.code(), Some(0), "{reconcile:?}");
}

/// Regression: prune deleted rows but the file never shrank. A new
/// database uses incremental auto-vacuum and prune gives the pages back.
#[test]
fn prune_gives_the_freed_space_back_to_the_file_system() {
    let server = Server::start(&stripe_config("retention = \"1h\"\n"), &env());
    let auto_vacuum: i64 = server
        .db()
        .query_row("PRAGMA auto_vacuum", [], |r| r.get(0))
        .unwrap();
    assert_eq!(
        auto_vacuum, 2,
        "a new database uses incremental auto-vacuum"
    );
    let padding = "x".repeat(4000);
    for i in 0..150 {
        let body =
            json!({"id": format!("evt_big_{i}"), "type": "charge.succeeded", "padding": padding})
                .to_string()
                .into_bytes();
        STRIPE.deliver_ok(&server, &body);
    }
    // Two hours old: past the one-hour retention.
    server
        .db_rw()
        .execute_batch(
            "UPDATE events SET received_at = received_at - 7200000;
             UPDATE deliveries SET received_at = received_at - 7200000;",
        )
        .unwrap();
    let pages = |server: &Server| -> (i64, i64) {
        let db = server.db();
        (
            db.query_row("PRAGMA page_count", [], |r| r.get(0)).unwrap(),
            db.query_row("PRAGMA freelist_count", [], |r| r.get(0))
                .unwrap(),
        )
    };
    let (before, _) = pages(&server);
    let prune = server.run_cli(&["prune"]);
    prune.assert_success();
    assert!(prune.stdout.contains("gave"), "{}", prune.stdout);
    assert_eq!(count(&server.db(), "SELECT count(*) FROM events", []), 0);
    let (after, free) = pages(&server);
    assert!(
        after * 2 < before && free == 0,
        "pages before {before}, after {after} with {free} free: the space was not given back"
    );
}

/// Regression: `backup` into a missing folder said "(it must not exist
/// yet)", which is about the file.
#[test]
fn backup_into_a_missing_folder_says_the_folder_is_missing() {
    let server = Server::start(&stripe_config(""), &env());
    STRIPE.deliver_ok(&server, &body("evt_backup"));
    let target = server.dir().join("no-such-folder").join("copy.db");
    let out = server.run_cli(&["backup", &target.display().to_string()]);
    assert!(!out.success(), "{out:?}");
    assert!(
        out.stderr.contains("no-such-folder") && out.stderr.contains("does not exist"),
        "{}",
        out.stderr
    );
    assert!(!out.stderr.contains("must not exist yet"), "{}", out.stderr);
}
