//! PostgreSQL's own rules, as a database engineer would check them: the
//! body bound into a `jsonb` column is JSON, an SQL action past
//! `sql_timeout` is a failed action (its event stored and acked), an
//! action that would end the claim's transaction is refused at start, a
//! multi-host URL reaches the host that accepts writes whatever the
//! order, and a 503 never says an event was not stored.

use std::time::Duration;

use crate::harness::{Server, ServerConfig, toml_str, wait_until};
use crate::helpers::StripeHook;
use crate::pg_cluster;

const SECRET: &str = "whsec_it_pg_review_0123456789";
const STRIPE: StripeHook = StripeHook::new("stripe", SECRET);

fn event(id: &str) -> Vec<u8> {
    serde_json::json!({"id": id, "type": "charge.succeeded", "data": {"object": {"amount": 5}}})
        .to_string()
        .into_bytes()
}

fn source(action: &str) -> String {
    format!(
        "[sources.stripe]\nkind = \"stripe\"\nsecrets = [\"{SECRET}\"]\n\
         [[sources.stripe.actions]]\nname = \"act\"\nsql = {}\n",
        toml_str(action)
    )
}

#[test]
fn payload_into_a_jsonb_column_is_the_bodys_json() {
    let Some(cluster) = pg_cluster::cluster() else {
        pg_cluster::skipped("payload_into_a_jsonb_column_is_the_bodys_json");
        return;
    };
    let url = cluster.create_database("it_jsonb");
    let config = ServerConfig::new()
        .set("database", &toml_str(&url))
        .set(
            "setup_sql",
            &toml_str(
                "CREATE TABLE IF NOT EXISTS docs (event_id text PRIMARY KEY, body jsonb NOT NULL)",
            ),
        )
        .tables(&source(
            "INSERT INTO docs (event_id, body) VALUES (:event_id, :payload)",
        ));
    let server = Server::start(&config, &[]);
    assert_eq!(STRIPE.deliver(&server, &event("evt_j1")).status, 200);
    assert_eq!(
        server.texts(
            "SELECT body ->> 'type' FROM docs WHERE event_id = 'evt_j1'",
            &[]
        ),
        vec!["charge.succeeded".to_string()],
        "the body is stored as a JSON object, not a JSON string"
    );
}

#[test]
fn an_sql_action_past_sql_timeout_fails_alone_and_the_event_is_stored() {
    let Some(cluster) = pg_cluster::cluster() else {
        pg_cluster::skipped("an_sql_action_past_sql_timeout_fails_alone");
        return;
    };
    let url = cluster.create_database("it_sql_timeout");
    let config = ServerConfig::new()
        .set("database", &toml_str(&url))
        .set("sql_timeout", &toml_str("300ms"))
        .set("busy_timeout", &toml_str("10s"))
        .tables(&source(
            "SELECT pg_sleep(CASE WHEN :event_id = 'evt_slow' THEN 3 ELSE 0 END)",
        ));
    let server = Server::start(&config, &[]);
    let slow = STRIPE.deliver(&server, &event("evt_slow"));
    assert_eq!(slow.status, 200, "{}", slow.text());
    assert_eq!(STRIPE.deliver(&server, &event("evt_fast")).status, 200);
    assert_eq!(
        server.texts("SELECT status FROM jobs WHERE event_id = 'evt_slow'", &[]),
        vec!["failed".to_string()]
    );
    assert_eq!(
        server.texts("SELECT status FROM jobs WHERE event_id = 'evt_fast'", &[]),
        vec!["done".to_string()]
    );
    let error = server.texts(
        "SELECT last_error FROM jobs WHERE event_id = 'evt_slow'",
        &[],
    );
    assert!(error[0].contains("timeout"), "{error:?}");
    // A redelivery is a duplicate: the event was stored.
    let again = STRIPE.deliver(&server, &event("evt_slow"));
    assert!(again.text().contains("duplicate"), "{}", again.text());
}

#[test]
fn an_action_that_would_end_the_transaction_stops_serve_at_start() {
    let out = crate::harness::check_config(
        &ServerConfig::new().tables(&source("INSERT INTO t VALUES (1); COMMIT")),
    );
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(out.stderr.contains("COMMIT would end"), "{}", out.stderr);
}

/// The `host=` list of a test cluster's URL.
fn socket_dir(url: &str) -> String {
    url.split(['?', '&'])
        .find_map(|p| p.strip_prefix("host="))
        .expect("a host= parameter")
        .to_string()
}

/// A read-only server (as a standby is) named first: serve and the
/// commands reach the writable one, without `target_session_attrs`.
#[test]
fn several_hosts_reach_the_one_that_accepts_writes_in_any_order() {
    let (Some(read_only), Some(writable)) = (
        pg_cluster::private_with(&["default_transaction_read_only=on"]),
        pg_cluster::private(),
    ) else {
        pg_cluster::skipped("several_hosts_reach_the_one_that_accepts_writes");
        return;
    };
    // The same database on both (private clusters, this test's alone), so
    // that only "accepts writes" tells them apart.
    let rw_url = writable.cluster().url("postgres");
    let ro_url = read_only.cluster().url("postgres");
    let db = "postgres";
    // As a user names two servers, the read-only one first (socket
    // folders written as hosts, percent-encoded).
    let enc = |dir: String| dir.replace('/', "%2F");
    let url = format!(
        "postgresql://postgres@{}:5432,{}:5432/{db}",
        enc(socket_dir(&ro_url)),
        enc(socket_dir(&rw_url))
    );
    let config = ServerConfig::new()
        .set("database", &toml_str(&url))
        .tables(&source("SELECT 1"));
    let server = Server::start(&config, &[]);
    assert_eq!(STRIPE.deliver(&server, &event("evt_m1")).status, 200);
    assert_eq!(server.get("/readyz").status, 200);
    let list = server.run_cli(&["events", "list", "--json"]);
    list.assert_success();
    assert_eq!(list.json().as_array().map(Vec::len), Some(1));
}

#[test]
fn a_503_never_says_the_event_was_not_stored() {
    let Some(local) = pg_cluster::private() else {
        pg_cluster::skipped("a_503_never_says_the_event_was_not_stored");
        return;
    };
    let url = local.cluster().create_database("it_maybe");
    let config = ServerConfig::new()
        .set("database", &toml_str(&url))
        .set("busy_timeout", &toml_str("1s"))
        .tables(&source("SELECT 1"));
    let server = Server::start(&config, &[]);
    assert_eq!(STRIPE.deliver(&server, &event("evt_a")).status, 200);
    local.stop();
    let mut answer = None;
    wait_until(Duration::from_secs(30), "a 503 while stopped", || {
        let r = STRIPE.deliver(&server, &event("evt_b"));
        let is_503 = r.status == 503;
        answer = Some(r.text());
        is_503
    });
    let text = answer.unwrap_or_default();
    assert!(text.contains("may not have been stored"), "{text}");
    assert!(!text.contains("was not stored"), "{text}");
}

/// A pod started mid-failover on a host that answers but refuses writes:
/// serve comes up (never exits), answers 503 with Retry-After and
/// `/readyz` 503, and once the host accepts writes it migrates and takes
/// deliveries, with no restart.
#[test]
fn serve_waits_on_a_read_only_host_then_migrates_when_it_accepts_writes() {
    let Some(local) = pg_cluster::private_with(&["default_transaction_read_only=on"]) else {
        pg_cluster::skipped("serve_waits_on_a_read_only_host");
        return;
    };
    let url = local.cluster().url("postgres");
    let config = ServerConfig::new()
        .set("database", &toml_str(&url))
        .set("busy_timeout", &toml_str("2s"))
        .tables(&source("SELECT 1"));
    let server = Server::start(&config, &[]);
    let refused = STRIPE.deliver(&server, &event("evt_ro"));
    assert_eq!(refused.status, 503, "{}", refused.text());
    assert!(refused.header("retry-after").is_some());
    assert_eq!(server.get("/readyz").status, 503);
    assert!(
        server.logs().contains("database refuses writes"),
        "{}",
        server.logs()
    );
    // `check` says it found no host that accepts writes.
    let check = server.run_cli(&["check"]);
    assert!(check.stderr.contains("does not allow writes"), "{check:?}");

    // The host is promoted: it accepts writes from now on.
    let admin = format!("{url}&options=-c%20default_transaction_read_only%3Doff");
    let mut db = postgres::Client::connect(&admin, postgres::NoTls).expect("connect");
    // (The role's setting outranks the server's command line, where the
    // read-only one was given; new sessions take it.)
    db.batch_execute("ALTER ROLE postgres SET default_transaction_read_only = off")
        .expect("make it writable");
    wait_until(
        Duration::from_secs(30),
        "ready once the host accepts writes",
        || server.get("/readyz").status == 200,
    );
    wait_until(Duration::from_secs(30), "the delivery accepted", || {
        STRIPE.deliver(&server, &event("evt_ro")).status == 200
    });
    assert_eq!(server.count("SELECT count(*) FROM events", &[]), 1);
}

/// After PostgreSQL restarts, the claimers' idle connections are dead: the
/// first delivery's group fails at its BEGIN, before anything reached the
/// server, and is run again on a fresh connection: 200, not a 503.
#[test]
fn the_first_delivery_after_a_restart_is_not_refused() {
    let Some(local) = pg_cluster::private() else {
        pg_cluster::skipped("the_first_delivery_after_a_restart_is_not_refused");
        return;
    };
    let url = local.cluster().create_database("it_restart");
    let config = ServerConfig::new()
        .set("database", &toml_str(&url))
        .tables(&source("SELECT 1"));
    let server = Server::start(&config, &[]);
    // Both claimers get a connection.
    for i in 0..20 {
        assert_eq!(
            STRIPE
                .deliver(&server, &event(&format!("evt_before_{i}")))
                .status,
            200
        );
    }
    local.stop();
    local.spawn().expect("restart PostgreSQL");
    local.wait_ready().expect("PostgreSQL is back");
    for i in 0..4 {
        let r = STRIPE.deliver(&server, &event(&format!("evt_after_{i}")));
        assert_eq!(
            r.status,
            200,
            "delivery {i} after the restart: {}",
            r.text()
        );
    }
    assert_eq!(server.count("SELECT count(*) FROM events", &[]), 24);
}

/// PostgreSQL down for a few seconds under four forward workers: one line
/// says storage is unavailable (with the cause), one says it is back; not
/// a warning per worker per second.
#[test]
fn an_outage_is_one_warning_and_one_line_when_it_ends() {
    let Some(local) = pg_cluster::private() else {
        pg_cluster::skipped("an_outage_is_one_warning_and_one_line_when_it_ends");
        return;
    };
    let url = local.cluster().create_database("it_outage");
    let config = ServerConfig::new()
        .set("database", &toml_str(&url))
        .set("forward_workers", "4")
        .tables(&format!(
            "{}[[sources.stripe.actions]]\nname = \"fwd\"\nforward = \"http://127.0.0.1:9/x\"\n",
            source("SELECT 1")
        ));
    let server = Server::start(&config, &[]);
    local.stop();
    wait_until(Duration::from_secs(20), "the outage noticed", || {
        server.logs().contains("outbox: storage unavailable")
    });
    // Four workers retrying every second, for three seconds.
    let seen = std::time::Instant::now();
    wait_until(Duration::from_secs(10), "three seconds of retries", || {
        seen.elapsed() >= Duration::from_secs(3)
    });
    local.spawn().expect("restart PostgreSQL");
    local.wait_ready().expect("PostgreSQL is back");
    wait_until(
        Duration::from_secs(20),
        "the end of the outage noticed",
        || server.logs().contains("outbox: storage available again"),
    );
    let logs = server.logs();
    assert_eq!(
        logs.matches("outbox: storage unavailable").count(),
        1,
        "{logs}"
    );
    assert_eq!(
        logs.matches("outbox: storage available again").count(),
        1,
        "{logs}"
    );
    assert!(logs.contains("error="), "the cause is named: {logs}");
}

/// `/readyz` goes through the claim path: with PostgreSQL refusing
/// connections it answers 503 at once, not after `busy_timeout`; with it
/// back, 200.
#[test]
fn readyz_answers_503_at_once_when_connections_are_refused() {
    let Some(local) = pg_cluster::private() else {
        pg_cluster::skipped("readyz_answers_503_at_once_when_connections_are_refused");
        return;
    };
    let url = local.cluster().create_database("it_readyz");
    let config = ServerConfig::new()
        .set("database", &toml_str(&url))
        .set("busy_timeout", &toml_str("10s"))
        .tables(&source("SELECT 1"));
    let server = Server::start(&config, &[]);
    assert_eq!(server.get("/readyz").status, 200);
    local.stop();
    let started = std::time::Instant::now();
    assert_eq!(server.get("/readyz").status, 503);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "503 long before busy_timeout (10 s): {:?}",
        started.elapsed()
    );
    local.spawn().expect("restart PostgreSQL");
    local.wait_ready().expect("PostgreSQL is back");
    wait_until(Duration::from_secs(20), "ready again", || {
        server.get("/readyz").status == 200
    });
}

/// The migrations wait for their lock past `busy_timeout` (another
/// instance migrating a large database), instead of exiting.
#[test]
fn serve_waits_for_the_migration_lock_past_busy_timeout() {
    let Some(cluster) = pg_cluster::cluster() else {
        pg_cluster::skipped("serve_waits_for_the_migration_lock_past_busy_timeout");
        return;
    };
    let url = cluster.create_database("it_migration_lock");
    let mut holder = postgres::Client::connect(&url, postgres::NoTls).expect("connect");
    // The key of idemhook's migration lock ("idemhook" in ASCII).
    let key = 0x6964_656d_686f_6f6bi64;
    holder
        .execute("SELECT pg_advisory_lock($1)", &[&key])
        .expect("take the migration lock");
    let config = ServerConfig::new()
        .set("database", &toml_str(&url))
        .set("busy_timeout", &toml_str("500ms"))
        .tables(&source("SELECT 1"));
    let releaser = std::thread::spawn(move || {
        wait_until(
            Duration::from_secs(30),
            "serve waiting for the lock",
            || {
                holder
                    .query_one(
                        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted",
                        &[],
                    )
                    .is_ok_and(|r| r.get::<_, i64>(0) > 0)
            },
        );
        // Held for three busy_timeouts more, as a long migration would.
        std::thread::sleep(Duration::from_millis(1500));
        holder
            .execute("SELECT pg_advisory_unlock($1)", &[&key])
            .expect("release the lock");
    });
    let server = Server::start(&config, &[]);
    releaser.join().expect("the lock holder");
    assert_eq!(
        STRIPE.deliver(&server, &event("evt_after_lock")).status,
        200
    );
}
