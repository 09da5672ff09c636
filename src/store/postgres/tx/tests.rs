use std::path::Path;
use std::time::Duration;

use super::params::numeric_binary;
use super::*;
use crate::config::database_url::DatabaseUrl;
use crate::config::{Config, Durability};
use crate::receive::ingest::{Claim, Decision, claim_in};
use crate::state::EventState;
use crate::store::pg_cluster;
use crate::store::postgres::{Settings, migrate};
use crate::store::tx::ParamValue;
use crate::time::now_ms;

const CONFIG: &str = r#"
[sources.pay]
kind = "stripe"
secrets = ["whsec_unit"]
[[sources.pay.actions]]
name = "broken"
sql = "INSERT INTO ledger (event_id, amount) VALUES ('same-for-all', 0)"
[[sources.pay.actions]]
name = "credit"
sql = "INSERT INTO ledger (event_id, amount, at, meta, big, note) VALUES (:event_id, :amount, :received_at, :meta, :big, :note::text || '!')"
params = { amount = "json:/amount", meta = "json:/meta", big = "json:/big", note = "json:/note" }
[[sources.pay.actions]]
name = "notify"
forward = "http://127.0.0.1:9/"
"#;

fn connect(test: &str) -> Option<Client> {
    let Some(cluster) = pg_cluster::cluster() else {
        pg_cluster::skipped(test);
        return None;
    };
    let url = cluster.create_database(test);
    let DatabaseUrl::Postgres(url) = DatabaseUrl::parse(&url, Path::new("/")).unwrap() else {
        panic!("not a PostgreSQL URL")
    };
    let settings = Settings::from_url(&url, Durability::Full, Duration::from_secs(5)).unwrap();
    let mut client = settings.connect().unwrap();
    migrate(&mut client, crate::config::database_url::DEFAULT_SCHEMA).unwrap();
    Some(client)
}

/// Two transactions each finishing a different job of one event: the
/// second counts only once the first has committed, so the event ends
/// completed. Without the event row's lock both counted one job still
/// open, both wrote `processing`, and it stayed so with every job done.
#[test]
fn jobs_of_one_event_finished_at_once_leave_it_completed() {
    let Some(mut a) = connect("jobs_of_one_event_finished_at_once") else {
        return;
    };
    let mut b = Client::connect(&url_of(&mut a), postgres::NoTls).unwrap();
    a.batch_execute(
        "INSERT INTO events (source, event_id, state, received_at, payload, headers, payload_hash)
             VALUES ('pay', 'e1', 'processing', 1, '\\x7b7d', '{}', 'h');
         INSERT INTO jobs (source, event_id, action, kind, status, n_attempts, created_at, updated_at)
             VALUES ('pay', 'e1', 'one', 'forward', 'processing', 1, 1, 1),
                    ('pay', 'e1', 'two', 'forward', 'processing', 1, 1, 1);",
    )
    .unwrap();
    let finish = |client: &mut Client, action: &str| -> EventState {
        client
            .execute(
                "UPDATE jobs SET status = 'done' WHERE event_id = 'e1' AND action = $1",
                &[&action],
            )
            .unwrap();
        let mut st = Statements::default();
        let mut tx = PgTx::new(client, &mut st);
        crate::receive::ingest::refresh_event_state_in(&mut tx, "pay", "e1", 2).unwrap()
    };
    a.batch_execute("BEGIN").unwrap();
    assert_eq!(finish(&mut a, "one"), EventState::Processing);
    let other = std::thread::spawn(move || {
        b.batch_execute("BEGIN").unwrap();
        let state = finish(&mut b, "two");
        b.batch_execute("COMMIT").unwrap();
        state
    });
    // Commit the first only once the second is waiting for it, or has
    // already counted (which is the bug).
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut probe = Client::connect(&url_of(&mut a), postgres::NoTls).unwrap();
    while !other.is_finished() {
        let waiting: i64 = probe
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                  WHERE datname = current_database() AND wait_event_type = 'Lock'",
                &[],
            )
            .unwrap()
            .get(0);
        if waiting > 0 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the second never ran");
        std::thread::sleep(Duration::from_millis(20));
    }
    a.batch_execute("COMMIT").unwrap();
    assert_eq!(other.join().unwrap(), EventState::Completed);
    let stored: String = a
        .query_one("SELECT state FROM events WHERE event_id = 'e1'", &[])
        .unwrap()
        .get(0);
    assert_eq!(stored, "completed");
}

/// The URL of the database `client` is connected to, for a second
/// connection to it.
fn url_of(client: &mut Client) -> String {
    let db: String = client
        .query_one("SELECT current_database()", &[])
        .unwrap()
        .get(0);
    pg_cluster::cluster().unwrap().url(&db)
}

fn claim_for(id: &str, hash: &str) -> Claim {
    let json = serde_json::json!({
        "id": id, "amount": 12.5, "meta": {"k": [1, 2]},
        "big": 123456789012345678901234567890u128, "note": "hi"
    });
    Claim {
        event_id: id.to_string(),
        event_type: None,
        body: json.to_string().into_bytes(),
        json: Some(json),
        content_type: None,
        headers: Vec::new(),
        kept_headers: "{}".to_string(),
        payload_hash: hash.to_string(),
        verified_with: Some(0),
        signed_at: None,
        received_at: now_ms(),
        remote: "test".to_string(),
        batch: None,
        reingest: false,
        catchup: false,
    }
}

fn run(client: &mut Client, st: &mut Statements, c: &Claim) -> (Decision, usize) {
    let config = Config::parse(CONFIG, "unit", Path::new("/"), None).unwrap();
    client.batch_execute("BEGIN").unwrap();
    let mut tx = PgTx::new(client, st);
    let outcome = claim_in(&mut tx, &config.sources[0], c).unwrap();
    let savepoints = tx.savepoints;
    client.batch_execute("COMMIT").unwrap();
    (outcome, savepoints)
}

/// The shared claim on PostgreSQL: one owner, the business row written
/// once with typed values, a failing action rolled back alone, a
/// duplicate and a mismatch told apart.
#[test]
fn the_claim_runs_on_postgres_with_typed_business_writes() {
    let Some(mut client) = connect("claim_typed") else {
        return;
    };
    client
        .batch_execute(
            "CREATE TABLE public.ledger (event_id text PRIMARY KEY, amount numeric NOT NULL,
                                  at bigint, meta jsonb, big numeric, note text);
             INSERT INTO public.ledger (event_id, amount) VALUES ('same-for-all', 0);",
        )
        .unwrap();
    let mut st = Statements::default();
    let (first, savepoints) = run(&mut client, &mut st, &claim_for("e1", "h1"));
    assert_eq!(
        first,
        Decision::Accepted {
            state: "failed".to_string(),
            forward_jobs: 1,
            sql_runs: vec![(0, false), (1, true)],
        }
    );
    assert_eq!(savepoints, 2);
    let (again, _) = run(&mut client, &mut st, &claim_for("e1", "h1"));
    assert_eq!(
        again,
        Decision::Duplicate {
            state: "failed".to_string()
        }
    );
    let (other, _) = run(&mut client, &mut st, &claim_for("e1", "h2"));
    assert_eq!(
        other,
        Decision::Mismatch {
            state: "failed".to_string()
        }
    );

    let row = client
        .query_one(
            "SELECT amount::text, at, meta::text, big::text, note FROM public.ledger WHERE event_id = 'e1'",
            &[],
        )
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "12.5");
    assert!(row.get::<_, i64>(1) > 1_600_000_000);
    assert_eq!(row.get::<_, String>(2), r#"{"k": [1, 2]}"#);
    assert_eq!(row.get::<_, String>(3), "123456789012345678901234567890");
    assert_eq!(row.get::<_, String>(4), "hi!");
    let mut count = |sql: &str| -> i64 { client.query_one(sql, &[]).unwrap().get(0) };
    assert_eq!(count("SELECT count(*) FROM public.ledger"), 2);
    assert_eq!(count("SELECT count(*) FROM events"), 1);
    assert_eq!(count("SELECT count(*) FROM deliveries"), 3);
    assert_eq!(count("SELECT count(*) FROM incidents"), 1);
    assert_eq!(count("SELECT count(*) FROM incident_payloads"), 1);
    assert_eq!(
        count("SELECT count(*) FROM jobs WHERE status = 'failed' AND action = 'broken'"),
        1
    );
    assert_eq!(
        count("SELECT count(*) FROM jobs WHERE status = 'pending' AND kind = 'forward'"),
        1
    );
    assert_eq!(
        count("SELECT count(*) FROM attempts WHERE error_kind = 'sql'"),
        1
    );
}

#[test]
fn numbers_bind_into_numeric_exactly() {
    let Some(mut client) = connect("numeric_binary") else {
        return;
    };
    for n in [
        "0",
        "1",
        "-1",
        "12.5",
        "-0.001",
        "10000",
        "9999.9999",
        "1e30",
        "1.5E-7",
        "123456789012345678901234567890.25",
        "100",
        "0.0001",
        "-5e3",
    ] {
        let row = client
            .query_one(
                "SELECT $1::numeric::text",
                &[&PgParam(ParamValue::Number(n.to_string()))],
            )
            .unwrap_or_else(|e| panic!("{n}: {e:?}"));
        let back: String = row.get(0);
        let want: String = client
            .query_one(&format!("SELECT ('{n}'::numeric)::text"), &[])
            .unwrap()
            .get(0);
        assert_eq!(back, want, "{n}");
    }
    assert!(numeric_binary("1.2.3").is_none());
    assert!(numeric_binary("abc").is_none());
}
