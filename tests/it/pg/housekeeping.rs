//! What `serve` does beside the claim on PostgreSQL, through the binary
//! against the throwaway test cluster (SKIPPED loudly without one):
//! retention pruning in short batches by every instance at once, the
//! key-rule record and `check`'s drift warning, and the job gauges.

use std::time::Duration;

use crate::harness::{Client, Server, ServerConfig, toml_str, wait_until};
use crate::helpers::StripeHook;
use crate::pg_cluster;
use crate::sign;

use super::count;

const SECRET: &str = "whsec_pg_serve_ops";
const STRIPE: StripeHook = StripeHook::new("stripe", SECRET);

fn event(id: &str, amount: i64) -> Vec<u8> {
    serde_json::json!({
        "id": id, "object": "event", "type": "charge.succeeded",
        "data": {"object": {"amount": amount}}
    })
    .to_string()
    .into_bytes()
}

/// A source of kind stripe with an SQL action into `ledger` (which
/// refuses amounts under 1, so a negative amount fails the job).
fn source(name: &str, retention: &str, payload_retention: &str) -> String {
    source_with(
        name,
        &format!("retention = \"{retention}\"\npayload_retention = \"{payload_retention}\"\n"),
    )
}

/// The same source with `extra` lines in its table.
fn source_with(name: &str, extra: &str) -> String {
    format!(
        "[sources.{name}]\nkind = \"stripe\"\nsecrets = [\"{SECRET}\"]\n{extra}\
         [[sources.{name}.actions]]\nname = \"credit\"\n\
         sql = \"INSERT INTO ledger (event_id, amount) VALUES (:event_id, :amount)\"\n\
         params = {{ amount = \"json:/data/object/amount\" }}\n"
    )
}

fn ledger_config(url: &str) -> ServerConfig {
    ServerConfig::new().set("database", &toml_str(url)).set(
        "setup_sql",
        &toml_str(
            "CREATE TABLE IF NOT EXISTS ledger (event_id text PRIMARY KEY, \
             amount bigint NOT NULL CHECK (amount > 0))",
        ),
    )
}

/// Two instances prune one database at once, every 200 ms: 1,200 done
/// events past retention (more than two batches) go with their jobs,
/// attempts, replays, deliveries and incidents, and claims keep being
/// answered meanwhile; an event whose job failed stays with its body; a
/// source with a long key retention loses only bodies; refused
/// deliveries go with their source's retention.
#[test]
fn instances_prune_by_retention_on_postgres_and_keep_what_work_needs() {
    let Some(cluster) = pg_cluster::cluster() else {
        pg_cluster::skipped("instances_prune_by_retention_on_postgres_and_keep_what_work_needs");
        return;
    };
    let url = cluster.create_database("it_pg_prune");
    let config = ledger_config(&url)
        .set("prune_interval", &toml_str("200ms"))
        .tables(&source("short", "1s", "1s"))
        .tables(&source("long", "30d", "1s"));
    let a = Server::start(&config, &[]);
    let b = Server::start(&config, &[]);
    let mut db = postgres::Client::connect(&url, postgres::NoTls).expect("connect");

    // 1,200 old events written the way a claim and a replay would have.
    let old = crate::harness::now_millis() - 3_600_000;
    db.batch_execute(&format!(
        "INSERT INTO events (source, event_id, type, state, received_at, payload, headers, payload_hash)
         SELECT 'short', 'old_' || i, 'charge.succeeded', 'completed', {old} + i, '\\x7b7d', '{{}}', 'h'
         FROM generate_series(1, 1200) i;
         INSERT INTO jobs (source, event_id, action, kind, status, n_attempts, created_at, updated_at)
         SELECT 'short', 'old_' || i, 'credit', 'sql', 'done', 1, {old} + i, {old} + i
         FROM generate_series(1, 1200) i;
         INSERT INTO attempts (job_id, n, started_at, finished_at, outcome)
         SELECT id, 1, created_at, created_at, 'ok' FROM jobs WHERE event_id LIKE 'old_%';
         INSERT INTO replays (job_id, replayed_at, from_status, origin)
         SELECT id, created_at, 'failed', 'cli' FROM jobs WHERE event_id LIKE 'old_%';
         INSERT INTO deliveries (source, event_id, received_at, outcome)
         SELECT 'short', 'old_' || i, {old} + i, 'accepted' FROM generate_series(1, 1200) i;
         INSERT INTO deliveries (source, event_id, received_at, outcome)
         SELECT 'short', 'old_' || i, {old} + i + 5, 'duplicate' FROM generate_series(1, 1200) i;
         INSERT INTO incidents (source, event_id, kind, created_at)
         SELECT 'short', 'old_' || i, 'payload_mismatch', {old} + i FROM generate_series(1, 10) i;
         INSERT INTO incident_payloads (incident_id, payload) SELECT id, '\\x7b7d' FROM incidents;"
    ))
    .expect("old rows");

    STRIPE.at("short").deliver_ok(&a, &event("evt_ok", 5));
    STRIPE.at("short").deliver_ok(&b, &event("evt_failed", -1));
    STRIPE.at("long").deliver_ok(&a, &event("evt_long", 7));
    // A refused delivery (bad signature): no event, a deliveries row.
    let body = event("evt_forged", 1);
    let r = Client::new(Duration::from_secs(30)).post(
        &a.url("/hooks/short"),
        &sign::stripe_now("whsec_wrong", &body),
        &body,
    );
    assert_eq!(r.status, 401);

    // Claims are answered while both instances prune.
    for i in 0..20 {
        let server = if i % 2 == 0 { &a } else { &b };
        STRIPE
            .at("long")
            .deliver_ok(server, &event(&format!("evt_during_{i}"), 1 + i));
    }

    wait_until(
        Duration::from_secs(60),
        "the old events, evt_ok and the refused delivery are pruned",
        || {
            count(
                &mut db,
                "SELECT count(*) FROM events WHERE source = 'short' AND event_id <> 'evt_failed'",
                &[],
            ) == 0
                && count(
                    &mut db,
                    "SELECT count(*) FROM deliveries WHERE source = 'short' AND event_id IS NULL",
                    &[],
                ) == 0
        },
    );
    for (table, sql) in [
        (
            "jobs",
            "SELECT count(*) FROM jobs WHERE event_id LIKE 'old_%'",
        ),
        (
            "attempts",
            "SELECT count(*) FROM attempts a JOIN jobs j ON j.id = a.job_id WHERE j.source = 'short' AND j.event_id <> 'evt_failed'",
        ),
        ("replays", "SELECT count(*) FROM replays"),
        (
            "deliveries",
            "SELECT count(*) FROM deliveries WHERE event_id LIKE 'old_%' OR event_id = 'evt_ok'",
        ),
        ("incidents", "SELECT count(*) FROM incidents"),
        (
            "incident_payloads",
            "SELECT count(*) FROM incident_payloads",
        ),
    ] {
        assert_eq!(
            count(&mut db, sql, &[]),
            0,
            "{table} rows of pruned events go with them"
        );
    }
    // The failed job's event stays, with its body, for the replay.
    let failed = db
        .query_one(
            "SELECT e.payload IS NOT NULL, j.status FROM events e JOIN jobs j USING (source, event_id)
             WHERE e.source = 'short' AND e.event_id = 'evt_failed'",
            &[],
        )
        .expect("the failed event is kept");
    assert!(failed.get::<_, bool>(0), "the failed event keeps its body");
    assert_eq!(failed.get::<_, String>(1), "failed");
    // The long source keeps every key, and loses the bodies past 1 s.
    wait_until(
        Duration::from_secs(30),
        "the long source's bodies are dropped",
        || {
            count(
                &mut db,
                "SELECT count(*) FROM events WHERE source = 'long' AND payload IS NULL AND erased_at IS NOT NULL",
                &[],
            ) == 21
        },
    );
    assert_eq!(
        count(
            &mut db,
            "SELECT count(*) FROM events WHERE source = 'long'",
            &[]
        ),
        21
    );
    assert_eq!(
        count(
            &mut db,
            "SELECT count(*) FROM deliveries WHERE source = 'long'",
            &[]
        ),
        21,
        "the long source's deliveries stay with its keys"
    );
    // The kept key still catches the duplicate.
    let body = event("evt_long", 7);
    let r = Client::new(Duration::from_secs(30)).post(
        &b.url("/hooks/long"),
        &sign::stripe_now(SECRET, &body),
        &body,
    );
    assert_eq!(
        r.json_status().as_deref(),
        Some("duplicate"),
        "{}",
        r.text()
    );
    let logs = a.logs() + &b.logs();
    assert!(logs.contains("pruned"), "a pruner said what it did\n{logs}");
    assert!(!logs.contains("prune failed"), "{logs}");
}

/// The key-rule record on PostgreSQL: serve writes it at start; `check`
/// against the database warns when the config's rule differs from it
/// (without printing the password); serve warns loudly and records the
/// new rule.
#[test]
fn key_rule_drift_is_warned_on_postgres() {
    let Some(cluster) = pg_cluster::cluster() else {
        pg_cluster::skipped("key_rule_drift_is_warned_on_postgres");
        return;
    };
    let url = cluster.create_database("it_pg_key_rules");
    // The local cluster trusts its socket, so a password in the URL is
    // ignored by the server but must never be printed.
    let url = if cluster.data_dir.is_some() {
        url.replacen("://postgres@", "://postgres:s3cr3t-pw@", 1)
    } else {
        url
    };
    let config = ledger_config(&url).tables(&source_with("stripe", ""));
    let mut server = Server::start(&config, &[]);
    STRIPE.deliver_ok(&server, &event("evt_rule", 3));
    let mut db = postgres::Client::connect(&url, postgres::NoTls).expect("connect");
    let key_rule: String = db
        .query_one(
            "SELECT key_rule FROM source_rules WHERE source = 'stripe'",
            &[],
        )
        .expect("serve recorded the key rule")
        .get(0);
    assert_eq!(key_rule, "json:/id");
    server.terminate();
    server.wait_exit(Duration::from_secs(20));

    let changed = ledger_config(&url).tables(&source_with(
        "stripe",
        "key = [\"json:/data/object/amount\"]\n",
    ));
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("idemhook.toml");
    std::fs::write(&path, changed.render()).expect("write config");
    let out = crate::harness::run_binary(
        dir.path(),
        &Default::default(),
        &[
            "check".to_string(),
            "--config".to_string(),
            path.display().to_string(),
        ],
        crate::harness::CLI_TIMEOUT,
    );
    assert!(out.success(), "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stdout
            .contains("(PostgreSQL): reached a unix socket, accepts writes; 1 event stored"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains(
            "warning: source stripe: the key rule differs from the one recorded in the database (json:/id -> json:/data/object/amount; 1 events stored under the old one)"
        ),
        "{}",
        out.stdout
    );
    assert!(
        !out.stdout.contains("s3cr3t-pw") && !out.stderr.contains("s3cr3t-pw"),
        "check printed the password\n{}\n{}",
        out.stdout,
        out.stderr
    );
    if cluster.data_dir.is_some() {
        assert!(out.stdout.contains("[REDACTED]"), "{}", out.stdout);
    }

    let server = Server::start(&changed, &[]);
    wait_until(
        Duration::from_secs(10),
        "serve warns about the changed rule",
        || server.logs().contains("KEY RULE CHANGED"),
    );
    assert!(!server.logs().contains("s3cr3t-pw"), "{}", server.logs());
    let now: String = db
        .query_one(
            "SELECT key_rule FROM source_rules WHERE source = 'stripe'",
            &[],
        )
        .expect("the rule")
        .get(0);
    assert_eq!(now, "json:/data/object/amount", "the new rule is recorded");
}

/// /metrics on PostgreSQL: the job gauges counted from the database (the
/// jobs of every instance), the oldest pending job's age; no SQLite file
/// sizes.
#[test]
fn job_gauges_come_from_the_database_on_postgres() {
    let Some(cluster) = pg_cluster::cluster() else {
        pg_cluster::skipped("job_gauges_come_from_the_database_on_postgres");
        return;
    };
    let url = cluster.create_database("it_pg_gauges");
    // forward_workers = 0: forward jobs stay pending.
    let config = ledger_config(&url)
        .set("forward_workers", "0")
        .tables(&source("stripe", "30d", "7d"))
        .tables(
            "[[sources.stripe.actions]]\nname = \"notify\"\nforward = \"http://127.0.0.1:9/never\"\n",
        );
    let server = Server::start(&config, &[]);
    STRIPE.deliver_ok(&server, &event("evt_g1", 1));
    STRIPE.deliver_ok(&server, &event("evt_g2", -1));
    let mut db = postgres::Client::connect(&url, postgres::NoTls).expect("connect");
    // A job of another instance, paused: counted too.
    db.batch_execute(
        "INSERT INTO jobs (source, event_id, action, kind, status, created_at, updated_at)
         VALUES ('other', 'e', 'a', 'forward', 'paused', 0, 0)",
    )
    .expect("a paused job");
    let oldest_ms: i64 = count(
        &mut db,
        "SELECT min(created_at) FROM jobs WHERE status = 'pending'",
        &[],
    );
    let before = crate::harness::now_millis();
    let scrape = server.get("/metrics");
    let after = crate::harness::now_millis();
    assert_eq!(scrape.status, 200);
    let text = scrape.text();
    for (status, n) in [
        ("pending", 2),
        ("processing", 0),
        ("done", 1),
        ("failed", 1),
        ("paused", 1),
    ] {
        assert!(
            text.contains(&format!("idemhook_jobs{{status=\"{status}\"}} {n}\n")),
            "{status} = {n}\n{text}"
        );
    }
    let age: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("idemhook_oldest_pending_age_seconds "))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no oldest pending age\n{text}"));
    let (low, high) = (
        (before - oldest_ms) as f64 / 1000.0 - 0.001,
        (after - oldest_ms) as f64 / 1000.0 + 0.001,
    );
    assert!(
        low <= age && age <= high,
        "age {age} s, the oldest pending job is {low}..{high} s old"
    );
    assert!(!text.contains("idemhook_database_bytes"), "{text}");
    assert!(!text.contains("idemhook_wal_bytes"), "{text}");
    assert!(
        text.contains("idemhook_deliveries_total{source=\"stripe\",outcome=\"accepted\"} 2\n"),
        "{text}"
    );
}

/// A prune batch never waits: an event whose row, or one of whose jobs'
/// rows, another transaction holds (a replay deciding on it, another
/// instance's pruner) is left for a later batch, and the prune finishes
/// (waiting would end in a lock timeout and a failed prune); the rest is
/// pruned. Once the holder commits, the next prune takes them too.
#[test]
fn prune_on_postgres_skips_rows_another_transaction_holds() {
    let Some(cluster) = pg_cluster::cluster() else {
        pg_cluster::skipped("prune_on_postgres_skips_rows_another_transaction_holds");
        return;
    };
    let url = cluster.create_database("it_pg_prune_skip");
    let config = ledger_config(&url).tables(&source("short", "1s", "1s"));
    let server = Server::start(&config, &[]);
    for (i, id) in ["evt_job_held", "evt_row_held", "evt_free"]
        .iter()
        .enumerate()
    {
        STRIPE
            .at("short")
            .deliver_ok(&server, &event(id, 1 + i as i64));
    }
    std::thread::sleep(Duration::from_millis(1500));
    let mut holder = postgres::Client::connect(&url, postgres::NoTls).expect("connect");
    let mut held = holder.transaction().expect("begin");
    held.query(
        "SELECT 1 FROM jobs WHERE event_id = 'evt_job_held' FOR UPDATE",
        &[],
    )
    .expect("hold a job row");
    held.query(
        "SELECT 1 FROM events WHERE event_id = 'evt_row_held' FOR UPDATE",
        &[],
    )
    .expect("hold an event row");

    let pruned = server.run_cli(&["prune"]);
    pruned.assert_success();
    assert!(
        pruned.stdout.contains("short: deleted 1 event(s)"),
        "{}",
        pruned.stdout
    );
    let mut db = postgres::Client::connect(&url, postgres::NoTls).expect("connect");
    let left: Vec<String> = db
        .query("SELECT event_id FROM events ORDER BY event_id", &[])
        .expect("events")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(left, ["evt_job_held", "evt_row_held"]);
    assert_eq!(
        count(&mut db, "SELECT count(*) FROM jobs", &[]),
        2,
        "the held events keep their jobs"
    );
    // Deliveries are answered meanwhile.
    STRIPE.at("short").deliver_ok(&server, &event("evt_new", 9));

    held.commit().expect("release");
    let pruned = server.run_cli(&["prune"]);
    pruned.assert_success();
    assert_eq!(
        count(
            &mut db,
            "SELECT count(*) FROM events WHERE event_id LIKE 'evt_%_held'",
            &[]
        ),
        0,
        "released, they are pruned\n{}",
        pruned.stdout
    );
}
