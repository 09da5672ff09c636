//! `replay`, `resolve` and `prune` on PostgreSQL: the same answers as on
//! SQLite (one scenario run on both backends, its JSON compared), and
//! correct across instances (replays and resolves racing each other and
//! the forward workers of every instance: each job re-opened once, each
//! effect once at the downstream).

use std::time::Duration;

use serde_json::{Value, json};

use crate::backend::{Backend, backends};
use crate::downstream::{Behavior, Downstream};
use crate::harness::{Server, ServerConfig, toml_str, wait_until};
use crate::helpers::{StripeHook, api, job_status};

const SECRET: &str = "whsec_it_replay_pg_0123456789";
const STRIPE: StripeHook = StripeHook::new("stripe", SECRET);
const ADMIN_TOKEN: &str = "it-admin-token-replay-pg-0123456789abcdef0123456789abcdef";

fn env() -> Vec<(&'static str, &'static str)> {
    vec![
        ("STRIPE_SECRET", SECRET),
        ("IDEMHOOK_ADMIN_TOKEN", ADMIN_TOKEN),
    ]
}

/// The same on both dialects: the SQL action fails while its customer is
/// missing from `accounts` (a foreign key), and "the fix" inserts it.
const SETUP_SQL: &str = "CREATE TABLE IF NOT EXISTS accounts (id TEXT PRIMARY KEY);\n\
     CREATE TABLE IF NOT EXISTS ledger (event_id TEXT PRIMARY KEY, \
     customer TEXT NOT NULL REFERENCES accounts (id), amount BIGINT NOT NULL);";

/// A stripe source with the SQL action `credit` and, when `forward` is
/// set, the forward action `notify` to it (one attempt: a 500 fails it).
fn config(forward: Option<&str>) -> ServerConfig {
    // No circuit: the jobs are to fail once each, not wait on it.
    let notify = forward.map_or(String::new(), |url| {
        format!(
            "[[sources.stripe.actions]]\nname = \"notify\"\nforward = \"{url}/notify\"\n\
             max_attempts = 1\ntimeout = \"2s\"\nlease = \"5s\"\ncircuit_failures = 0\n"
        )
    });
    ServerConfig::new()
        .set("setup_sql", &toml_str(SETUP_SQL))
        .set("admin_token", &toml_str("env:IDEMHOOK_ADMIN_TOKEN"))
        .tables(&format!(
            "[sources.stripe]\nkind = \"stripe\"\nsecrets = [\"env:STRIPE_SECRET\"]\n\
             retention = \"1s\"\npayload_retention = \"1s\"\n\
             [[sources.stripe.actions]]\nname = \"credit\"\n\
             sql = \"INSERT INTO ledger (event_id, customer, amount) VALUES (:event_id, :customer, :amount)\"\n\
             params = {{ customer = \"json:/data/object/customer\", amount = \"json:/data/object/amount\" }}\n\
             {notify}"
        ))
}

fn body(id: &str, customer: &str) -> Vec<u8> {
    json!({
        "id": id, "object": "event", "type": "charge.succeeded",
        "data": {"object": {"customer": customer, "amount": 100}}
    })
    .to_string()
    .into_bytes()
}

fn add_account(server: &Server, id: &str) {
    server.exec("INSERT INTO accounts (id) VALUES (?1)", &[&id]);
}

/// Times differ by run, and the database's words for a duplicate key by
/// backend; everything else must be the same.
fn normalized(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, v)| {
                    let v = if k.ends_with("_at") && v.is_number() {
                        json!(0)
                    } else if k == "error"
                        && v.as_str().is_some_and(|e| {
                            e.contains("UNIQUE constraint failed") || e.contains("duplicate key")
                        })
                    {
                        // The database's own words for the same refusal.
                        json!("<duplicate key>")
                    } else {
                        normalized(v)
                    };
                    (k.clone(), v)
                })
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(normalized).collect()),
        other => other.clone(),
    }
}

/// One operator scenario, its every admin answer recorded: replays of
/// one event (a dry run, for real, nothing left, forced), of a batch
/// (dry run, for real), resolves (dry run, for real, refused); the CLI
/// forms beside them; a replayed forward job delivered exactly once.
fn scenario(backend: Backend) -> Vec<(String, u16, Value)> {
    let ds = Downstream::start_without_dedupe();
    ds.script("stripe:evt_a:notify", Behavior::Fail500(1));
    let server = Server::start_on(backend, &config(Some(&ds.url())), &env());
    let mut answers = Vec::new();
    let mut record = |label: &str, (status, json): (u16, Value)| {
        answers.push((label.to_string(), status, normalized(&json)));
        json
    };

    STRIPE.deliver_ok(&server, &body("evt_a", "cus_a"));
    wait_until(Duration::from_secs(30), "notify of evt_a failed", || {
        job_status(&server, "stripe", "evt_a", "notify").as_deref() == Some("failed")
    });
    assert_eq!(
        job_status(&server, "stripe", "evt_a", "credit").as_deref(),
        Some("failed")
    );
    let plan = record(
        "event dry run",
        api(
            &server,
            "POST",
            "/api/events/stripe/evt_a/replay",
            Some(ADMIN_TOKEN),
            json!({"dry_run": true}).to_string(),
        ),
    );
    assert_eq!(plan["count"], 2, "{plan}");
    assert_eq!(
        job_status(&server, "stripe", "evt_a", "notify").as_deref(),
        Some("failed"),
        "a dry run changes nothing"
    );

    add_account(&server, "cus_a");
    let done = record(
        "event replay",
        api(
            &server,
            "POST",
            "/api/events/stripe/evt_a/replay",
            Some(ADMIN_TOKEN),
            json!({}).to_string(),
        ),
    );
    assert_eq!(done["replayed"], 2, "{done}");
    wait_until(
        Duration::from_secs(30),
        "the replayed notify is delivered",
        || job_status(&server, "stripe", "evt_a", "notify").as_deref() == Some("done"),
    );
    assert_eq!(ds.effects("stripe:evt_a:notify"), 1, "exactly one effect");
    assert_eq!(
        job_status(&server, "stripe", "evt_a", "credit").as_deref(),
        Some("done")
    );
    assert_eq!(server.count("SELECT count(*) FROM ledger", &[]), 1);
    record(
        "event replay, nothing left",
        api(
            &server,
            "POST",
            "/api/events/stripe/evt_a/replay",
            Some(ADMIN_TOKEN),
            json!({}).to_string(),
        ),
    );
    // Forced: the statement runs again and fails (the ledger row is
    // there): the job stays done.
    let forced = record(
        "forced sql replay",
        api(
            &server,
            "POST",
            "/api/events/stripe/evt_a/replay",
            Some(ADMIN_TOKEN),
            json!({"action": "credit", "force": true}).to_string(),
        ),
    );
    assert_eq!(forced["jobs"][0]["result"], "failed", "{forced}");
    assert_eq!(forced["jobs"][0]["status"], "done", "{forced}");

    STRIPE.deliver_ok(&server, &body("evt_b", "cus_b"));
    STRIPE.deliver_ok(&server, &body("evt_c", "cus_b"));
    wait_until(Duration::from_secs(30), "the notify jobs are done", || {
        server.count(
            "SELECT count(*) FROM jobs WHERE action = 'notify' AND status <> 'done'",
            &[],
        ) == 0
    });
    record(
        "batch dry run",
        api(
            &server,
            "POST",
            "/api/replay",
            Some(ADMIN_TOKEN),
            json!({"source": "stripe", "status": "failed", "since": "1h", "dry_run": true})
                .to_string(),
        ),
    );
    add_account(&server, "cus_b");
    let batch = record(
        "batch replay",
        api(
            &server,
            "POST",
            "/api/replay",
            Some(ADMIN_TOKEN),
            json!({"source": "stripe", "status": "failed"}).to_string(),
        ),
    );
    assert_eq!(batch["replayed"], 2, "{batch}");
    assert_eq!(
        job_status(&server, "stripe", "evt_b", "credit").as_deref(),
        Some("done")
    );

    STRIPE.deliver_ok(&server, &body("evt_d", "cus_d"));
    wait_until(Duration::from_secs(30), "evt_d's notify is done", || {
        job_status(&server, "stripe", "evt_d", "notify").as_deref() == Some("done")
    });
    record(
        "resolve dry run",
        api(
            &server,
            "POST",
            "/api/events/stripe/evt_d/resolve",
            Some(ADMIN_TOKEN),
            json!({"action": "credit", "note": "credited by hand", "dry_run": true}).to_string(),
        ),
    );
    let resolved = record(
        "resolve",
        api(
            &server,
            "POST",
            "/api/events/stripe/evt_d/resolve",
            Some(ADMIN_TOKEN),
            json!({"action": "credit", "note": "credited by hand"}).to_string(),
        ),
    );
    assert_eq!(resolved["state"], "completed", "{resolved}");
    record(
        "resolve again",
        api(
            &server,
            "POST",
            "/api/events/stripe/evt_d/resolve",
            Some(ADMIN_TOKEN),
            json!({"action": "credit", "note": "again"}).to_string(),
        ),
    );
    let closing = server.one(
        "SELECT a.outcome, a.error_kind, a.note FROM attempts a JOIN jobs j ON j.id = a.job_id
         WHERE j.event_id = 'evt_d' AND j.action = 'credit' ORDER BY a.n DESC",
        &[],
    );
    assert_eq!(
        (closing.text(0), closing.text(1), closing.text(2)),
        (
            "ok".to_string(),
            "operator".to_string(),
            "credited by hand".to_string()
        )
    );

    // The CLI forms: a plan without --yes, then --yes.
    STRIPE.deliver_ok(&server, &body("evt_e", "cus_e"));
    STRIPE.deliver_ok(&server, &body("evt_f", "cus_f"));
    let plan = server.run_cli(&["replay", "stripe", "evt_e"]);
    plan.assert_success();
    assert!(plan.stdout.contains("nothing changed"), "{}", plan.stdout);
    add_account(&server, "cus_e");
    server
        .run_cli(&["replay", "stripe", "evt_e", "--action", "credit", "--yes"])
        .assert_success();
    assert_eq!(
        job_status(&server, "stripe", "evt_e", "credit").as_deref(),
        Some("done")
    );
    let batch = server.run_cli(&[
        "replay", "--source", "stripe", "--status", "failed", "--since", "1h",
    ]);
    batch.assert_success();
    assert!(batch.stdout.contains("evt_f"), "{}", batch.stdout);
    let out = server.run_cli(&[
        "resolve", "stripe", "evt_f", "--action", "credit", "--note", "refunded", "--yes",
    ]);
    out.assert_success();
    assert_eq!(
        job_status(&server, "stripe", "evt_f", "credit").as_deref(),
        Some("done")
    );
    let again = server.run_cli(&[
        "resolve", "stripe", "evt_f", "--action", "credit", "--note", "refunded", "--yes",
    ]);
    assert!(!again.success(), "a done job is not resolved again");

    // prune: a dry run counts, then the done events go (1 s retention).
    wait_until(Duration::from_secs(30), "every job is done", || {
        server.count("SELECT count(*) FROM jobs WHERE status <> 'done'", &[]) == 0
    });
    std::thread::sleep(Duration::from_millis(1500));
    let dry = server.run_cli(&["prune", "--dry-run"]);
    dry.assert_success();
    assert!(
        dry.stdout.contains("would delete 6 event(s)"),
        "{}",
        dry.stdout
    );
    assert_eq!(server.count("SELECT count(*) FROM events", &[]), 6);
    let pruned = server.run_cli(&["prune"]);
    pruned.assert_success();
    assert!(
        pruned.stdout.contains("deleted 6 event(s)"),
        "{}",
        pruned.stdout
    );
    assert_eq!(server.count("SELECT count(*) FROM events", &[]), 0);
    assert_eq!(server.count("SELECT count(*) FROM jobs", &[]), 0);
    assert_eq!(server.count("SELECT count(*) FROM attempts", &[]), 0);
    answers
}

/// Replay, resolve and prune answer the same JSON on PostgreSQL as on
/// SQLite, step for step.
#[test]
fn replay_resolve_and_prune_answer_the_same_on_both_backends() {
    let mut runs = Vec::new();
    for backend in backends("replay_resolve_and_prune_answer_the_same_on_both_backends") {
        runs.push((backend, scenario(backend)));
    }
    if let [(_, sqlite), (_, postgres)] = &runs[..] {
        assert_eq!(sqlite.len(), postgres.len());
        for (s, p) in sqlite.iter().zip(postgres) {
            assert_eq!(s, p, "{}: SQLite and PostgreSQL differ", s.0);
        }
    }
}

/// Three batch replays at once (the API of two instances and the CLI)
/// while both instances' forward workers take and deliver the jobs they
/// re-open: each failed job is re-opened once and delivered once, at a
/// downstream that counts every request that reaches it as an effect.
/// Two resolves of one job at once: one closes it, the other is refused.
#[test]
fn replays_across_instances_deliver_each_job_once() {
    let backend = Backend::Postgres;
    if !backend.available("replays_across_instances_deliver_each_job_once") {
        return;
    }
    let ds = Downstream::start_without_dedupe();
    let n = 24;
    for i in 0..n {
        ds.script(&format!("stripe:evt_{i}:notify"), Behavior::Fail500(1));
    }
    let config = backend
        .config(config(Some(&ds.url())))
        .set("forward_workers", "3");
    let a = Server::start(&config, &env());
    let b = Server::start(&config, &env());
    add_account(&a, "cus");
    for i in 0..n {
        STRIPE.deliver_ok(
            if i % 2 == 0 { &a } else { &b },
            &body(&format!("evt_{i}"), "cus"),
        );
    }
    wait_until(Duration::from_secs(60), "every notify failed once", || {
        a.count(
            "SELECT count(*) FROM jobs WHERE action = 'notify' AND status = 'failed'",
            &[],
        ) == n as i64
    });
    ds.set_delay(Duration::from_millis(50));
    let a = std::sync::Arc::new(a);
    let b = std::sync::Arc::new(b);
    let racers: Vec<_> = (0..3)
        .map(|k| {
            let (a, b) = (a.clone(), b.clone());
            std::thread::spawn(move || match k {
                0 => {
                    api(
                        &a,
                        "POST",
                        "/api/replay",
                        Some(ADMIN_TOKEN),
                        json!({"source": "stripe", "status": "failed"}).to_string(),
                    )
                    .0
                }
                1 => {
                    api(
                        &b,
                        "POST",
                        "/api/replay",
                        Some(ADMIN_TOKEN),
                        json!({"source": "stripe", "status": "failed"}).to_string(),
                    )
                    .0
                }
                _ => {
                    let out = a.run_cli(&[
                        "replay", "--source", "stripe", "--status", "failed", "--yes",
                    ]);
                    if out.success() { 200 } else { 500 }
                }
            })
        })
        .collect();
    for r in racers {
        assert_eq!(r.join().expect("a replay finished"), 200);
    }
    wait_until(
        Duration::from_secs(60),
        "every replayed notify is done",
        || {
            a.count(
                "SELECT count(*) FROM jobs WHERE action = 'notify' AND status = 'done'",
                &[],
            ) == n as i64
        },
    );
    for i in 0..n {
        let key = format!("stripe:evt_{i}:notify");
        assert_eq!(ds.effects(&key), 1, "exactly one effect for {key}");
    }
    assert_eq!(
        a.count("SELECT count(*) FROM replays", &[]),
        n as i64,
        "each failed job re-opened once\n{}",
        a.dump("SELECT job_id, origin FROM replays ORDER BY job_id")
    );
    assert_eq!(
        a.count("SELECT count(*) FROM events WHERE state = 'completed'", &[]),
        n as i64
    );

    // Two resolves of one failed job at once, on two instances.
    ds.script("stripe:evt_r:notify", Behavior::Fail500(1));
    STRIPE.deliver_ok(&a, &body("evt_r", "cus"));
    wait_until(Duration::from_secs(30), "notify of evt_r failed", || {
        job_status(&a, "stripe", "evt_r", "notify").as_deref() == Some("failed")
    });
    let resolvers: Vec<_> = [a.clone(), b.clone()]
        .into_iter()
        .map(|s| {
            std::thread::spawn(move || {
                api(
                    &s,
                    "POST",
                    "/api/events/stripe/evt_r/resolve",
                    Some(ADMIN_TOKEN),
                    json!({"action": "notify", "note": "sent by hand"}).to_string(),
                )
                .0
            })
        })
        .collect();
    let mut statuses: Vec<u16> = resolvers
        .into_iter()
        .map(|t| t.join().expect("a resolve finished"))
        .collect();
    statuses.sort_unstable();
    assert_eq!(
        statuses,
        [200, 409],
        "one resolve closes the job, the other is refused"
    );
    assert_eq!(
        a.count(
            "SELECT count(*) FROM attempts WHERE error_kind = 'operator'",
            &[]
        ),
        1
    );
    assert_eq!(
        job_status(&a, "stripe", "evt_r", "notify").as_deref(),
        Some("done")
    );
}
