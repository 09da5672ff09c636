//! `serve` on PostgreSQL, through the binary, against the throwaway test
//! cluster (`tests/support/pg_cluster.rs`; SKIPPED loudly without one):
//! several instances on one database claim each event exactly once and
//! write the team's own table once per event.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::harness::{Client, Server, ServerConfig, toml_str};
use crate::pg_cluster;
use crate::sign;

const SECRET: &str = "whsec_pg_instances";

fn config(url: &str) -> ServerConfig {
    ServerConfig::new()
        .set("database", &toml_str(url))
        .set(
            "setup_sql",
            &toml_str(
                "CREATE TABLE IF NOT EXISTS ledger (event_id text PRIMARY KEY, amount bigint NOT NULL, \
                 received_at bigint NOT NULL)",
            ),
        )
        .tables(&format!(
            "[sources.stripe]\nkind = \"stripe\"\nsecrets = [\"{SECRET}\"]\n\
             [[sources.stripe.actions]]\nname = \"credit\"\n\
             sql = \"INSERT INTO ledger (event_id, amount, received_at) VALUES (:event_id, :amount, :received_at)\"\n\
             params = {{ amount = \"json:/data/object/amount\" }}\n"
        ))
}

fn event(i: usize) -> Vec<u8> {
    serde_json::json!({
        "id": format!("evt_{i:04}"), "object": "event", "type": "charge.succeeded",
        "data": {"object": {"amount": 100 + i}}
    })
    .to_string()
    .into_bytes()
}

fn count(client: &mut postgres::Client, sql: &str) -> i64 {
    client
        .query_one(sql, &[])
        .unwrap_or_else(|e| panic!("{sql}: {e:?}"))
        .get(0)
}

/// Three instances on one database receive 300 events, each delivered 6
/// times, spread over the instances concurrently and in different orders:
/// every answer 200, exactly 300 events and exactly 300 rows written by
/// the SQL action into the team's table.
#[test]
fn three_instances_on_one_database_store_each_event_once() {
    let Some(cluster) = pg_cluster::cluster() else {
        pg_cluster::skipped("three_instances_on_one_database_store_each_event_once");
        return;
    };
    let url = cluster.create_database("it_three_instances");
    let config = config(&url);
    // Started at once: they migrate under the advisory lock, one by one.
    let starting: Vec<_> = (0..3)
        .map(|_| {
            let config = config.clone();
            std::thread::spawn(move || Server::start(&config, &[]))
        })
        .collect();
    let servers: Vec<Arc<Server>> = starting
        .into_iter()
        .map(|t| Arc::new(t.join().expect("an instance started")))
        .collect();

    // Six senders, two per instance; delivery j of event i goes to
    // instance (i + j) % 3, each sender in its own shuffled order.
    let deadline = Instant::now() + Duration::from_secs(120);
    let senders: Vec<_> = (0..6)
        .map(|sender| {
            let servers = servers.clone();
            std::thread::spawn(move || {
                let instance = sender % 3;
                let mut work: Vec<usize> = (0..300)
                    .flat_map(|i| (0..6).map(move |j| (i, j)))
                    .filter(|(i, j)| (i + j) % 3 == instance && (i + j + sender / 3) % 2 == 0)
                    .map(|(i, _)| i)
                    .collect();
                fastrand::Rng::with_seed(sender as u64).shuffle(&mut work);
                let client = Client::new(Duration::from_secs(20));
                let mut statuses = Vec::new();
                for i in work {
                    assert!(Instant::now() < deadline, "the deliveries took over 120 s");
                    let body = event(i);
                    let url = servers[instance].url("/hooks/stripe");
                    let r = client.post(&url, &sign::stripe_now(SECRET, &body), &body);
                    statuses.push((i, r.status));
                }
                statuses
            })
        })
        .collect();
    let mut answered = 0;
    let mut per_event = vec![0; 300];
    for t in senders {
        for (i, status) in t.join().expect("a sender finished") {
            assert_eq!(status, 200, "event {i}: every delivery answers 200");
            answered += 1;
            per_event[i] += 1;
        }
    }
    assert_eq!(answered, 1800);
    assert!(per_event.iter().all(|&n| n == 6), "{per_event:?}");

    let mut db = postgres::Client::connect(&url, postgres::NoTls).expect("connect");
    assert_eq!(count(&mut db, "SELECT count(*) FROM events"), 300);
    assert_eq!(count(&mut db, "SELECT count(*) FROM ledger"), 300);
    assert_eq!(
        count(
            &mut db,
            "SELECT count(*) FROM ledger WHERE amount = 100 + substr(event_id, 5)::int"
        ),
        300,
        "each row has its own event's amount"
    );
    assert_eq!(count(&mut db, "SELECT count(*) FROM deliveries"), 1800);
    assert_eq!(
        count(
            &mut db,
            "SELECT count(*) FROM deliveries WHERE outcome = 'accepted'"
        ),
        300
    );
    assert_eq!(
        count(&mut db, "SELECT count(*) FROM idemhook_migrations"),
        1,
        "migrated once"
    );
    drop(servers);
}

/// `check` against PostgreSQL: the migrations, setup_sql and the SQL
/// actions are tried in a transaction that is rolled back, and the URL is
/// shown without its password.
#[test]
fn check_on_postgres_leaves_the_database_as_it_was() {
    let Some(cluster) = pg_cluster::cluster() else {
        pg_cluster::skipped("check_on_postgres_leaves_the_database_as_it_was");
        return;
    };
    let url = cluster.create_database("it_check");
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("idemhook.toml");
    std::fs::write(&path, config(&url).render()).expect("write config");
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
    assert!(
        out.success() && out.stdout.contains("(PostgreSQL)"),
        "check passes\n{}\n{}",
        out.stdout,
        out.stderr
    );
    let mut db = postgres::Client::connect(&url, postgres::NoTls).expect("connect");
    assert_eq!(
        count(
            &mut db,
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'"
        ),
        0,
        "nothing was created"
    );
    // An operator command that does not run on PostgreSQL yet says so.
    let out = crate::harness::run_binary(
        dir.path(),
        &Default::default(),
        &[
            "events".to_string(),
            "list".to_string(),
            "--config".to_string(),
            path.display().to_string(),
        ],
        crate::harness::CLI_TIMEOUT,
    );
    assert!(
        out.status.code() == Some(2) && out.stderr.contains("does not run on PostgreSQL"),
        "{}",
        out.stderr
    );
}
