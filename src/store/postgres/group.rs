//! Group commit on PostgreSQL: many claims of one instance in one READ
//! COMMITTED transaction, run in the order of their keys so that two
//! instances inserting overlapping keys wait on each other in one order
//! and cannot deadlock on the barrier. A deadlock or serialization failure
//! elsewhere (an SQL action's own tables) rolls the transaction back and
//! runs the whole group again: nothing of it was committed, so no caller
//! has been answered, and the retry decides every claim afresh. A group
//! is cut into several transactions when its SQL actions would open more
//! savepoints than PostgreSQL's per-backend subtransaction cache holds.
//!
//! A transaction is few round trips to the server, whatever its size:
//! BEGIN, one insert of all its events (in key order), one read of the
//! events it lost, the claims' own steps (SQL actions and jobs; answered
//! from what is known for a duplicate), one insert of all its delivery
//! rows, COMMIT (see `PgTx::grouped`).

use std::time::Duration;

use postgres::Client;

use super::tx::{EventRow, PgTx, Statements};
use crate::store::{StoreError, StoreErrorKind};

/// Savepoints one transaction may open: below the 64 subtransactions
/// PostgreSQL caches per backend (past them every snapshot gets slower, in
/// every session).
pub const MAX_SAVEPOINTS: usize = 56;

/// How an error starts when the connection failed at the group's `BEGIN`,
/// before anything of the group was sent (a connection that died while
/// idle: the server restarted, a failover).
pub const NOT_BEGUN: &str = "the connection failed before the group began";

/// True when every result failed at `BEGIN` ([`NOT_BEGUN`]).
pub fn never_began<R>(results: &[Result<R, StoreError>]) -> bool {
    !results.is_empty()
        && results
            .iter()
            .all(|r| r.as_ref().is_err_and(|e| e.message.starts_with(NOT_BEGUN)))
}

/// How many times a group is run again after a deadlock or a
/// serialization failure before its callers get the error (503).
pub const MAX_RETRIES: u32 = 8;

/// The work of an operation; it may run more than once (a retried group).
pub type Work<'f, R> = Box<dyn FnMut(&mut PgTx<'_>) -> Result<R, StoreError> + 'f>;

/// One operation of a group: its key (the order it runs in), the
/// savepoints it may open, the event row its claim inserts (inserted with
/// the rest of its transaction's before any operation runs), and the
/// work.
pub struct Op<'f, R> {
    pub key: (String, String),
    pub savepoints: usize,
    /// The event rows its claims insert (several for a batch).
    pub events: Vec<EventRow>,
    pub run: Work<'f, R>,
}

/// Runs `ops` in key order, in as few transactions as the savepoint bound
/// allows, retrying a transaction that hit a deadlock or a serialization
/// failure. The results come back in the order of `ops`; an operation's
/// result is only returned once its transaction has committed. When a
/// transaction fails for good, each of its operations gets the error.
pub fn run_group<R>(
    client: &mut Client,
    statements: &mut Statements,
    ops: &mut [Op<'_, R>],
) -> Vec<Result<R, StoreError>> {
    let mut order: Vec<usize> = (0..ops.len()).collect();
    order.sort_by(|&a, &b| ops[a].key.cmp(&ops[b].key));
    let mut results: Vec<Option<Result<R, StoreError>>> = (0..ops.len()).map(|_| None).collect();

    // Cut the sorted run into transactions under the savepoint bound.
    let mut start = 0;
    while start < order.len() {
        let mut end = start;
        let mut savepoints = 0;
        while end < order.len() {
            let s = ops[order[end]].savepoints;
            if end > start && savepoints + s > MAX_SAVEPOINTS {
                break;
            }
            savepoints += s;
            end += 1;
        }
        let chunk = &order[start..end];
        match run_transaction(client, statements, ops, chunk) {
            Ok(values) => {
                for (&i, v) in chunk.iter().zip(values) {
                    results[i] = Some(Ok(v));
                }
            }
            Err(e) => {
                for &i in chunk {
                    results[i] = Some(Err(e.clone()));
                }
            }
        }
        start = end;
    }
    results
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err(StoreError::other("operation did not run"))))
        .collect()
}

/// One transaction of the group, run again (up to [`MAX_RETRIES`] times)
/// after a deadlock or a serialization failure: its results are returned
/// only once it has committed, so nobody is answered twice.
fn run_transaction<R>(
    client: &mut Client,
    statements: &mut Statements,
    ops: &mut [Op<'_, R>],
    chunk: &[usize],
) -> Result<Vec<R>, StoreError> {
    super::retrying(
        MAX_RETRIES,
        // A short, growing, jittered pause.
        |retry| Duration::from_millis(fastrand::u64(1..=(2u64 << retry.min(6)))),
        |(_, retryable)| *retryable,
        || {
            try_transaction(client, statements, ops, chunk).inspect_err(|_| {
                // Whatever failed, the transaction is over for the server
                // only after a ROLLBACK (a no-op when it already ended).
                let _ = client.batch_execute("ROLLBACK");
            })
        },
    )
    .map_err(|(e, _)| e)
}

/// One try: BEGIN, every operation in order, COMMIT. The error says
/// whether running the whole transaction again may succeed.
fn try_transaction<R>(
    client: &mut Client,
    statements: &mut Statements,
    ops: &mut [Op<'_, R>],
    chunk: &[usize],
) -> Result<Vec<R>, (StoreError, bool)> {
    client
        .batch_execute("BEGIN ISOLATION LEVEL READ COMMITTED")
        .map_err(|e| {
            let e = StoreError::from(e);
            if e.kind == StoreErrorKind::Io {
                // Nothing of the group reached the server: the caller may
                // run it again on a fresh connection.
                return (
                    StoreError {
                        message: format!("{NOT_BEGUN}: {}", e.message),
                        ..e
                    },
                    false,
                );
            }
            (e, false)
        })?;
    let mut values = Vec::with_capacity(chunk.len());
    let mut tx = PgTx::grouped(client, statements);
    // In key order across the whole transaction (a batch's rows among
    // the others'), so that two instances take shared keys in one order.
    let mut rows: Vec<&EventRow> = chunk.iter().flat_map(|&i| ops[i].events.iter()).collect();
    rows.sort_by(|a, b| (&a.source, &a.event_id).cmp(&(&b.source, &b.event_id)));
    if let Err(e) = tx.insert_events(&rows) {
        let retryable = super::is_retryable_store(&e);
        return Err((e, retryable));
    }
    for &i in chunk {
        match (ops[i].run)(&mut tx) {
            Ok(v) => values.push(v),
            Err(e) => {
                let retryable = super::is_retryable_store(&e);
                return Err((e, retryable));
            }
        }
    }
    match tx.commit() {
        Ok(()) => Ok(values),
        Err(e) => {
            let retryable = super::is_retryable(&e);
            Err((StoreError::from(e), retryable))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::config::database_url::DatabaseUrl;
    use crate::config::{Config, Durability};
    use crate::receive::ingest::{Claim, Decision, claim_in};
    use crate::store::pg_cluster;
    use crate::store::postgres::backend::event_row_of;
    use crate::store::postgres::{Settings, migrate};
    use crate::time::now_ms;

    const CONFIG: &str = r#"
[sources.pay]
kind = "stripe"
secrets = ["whsec_unit"]
[[sources.pay.actions]]
name = "credit"
sql = "INSERT INTO ledger (event_id, instance) VALUES (:event_id, :instance)"
params = { instance = "header:x-instance" }
"#;

    fn settings(test: &str) -> Option<Settings> {
        let Some(cluster) = pg_cluster::cluster() else {
            pg_cluster::skipped(test);
            return None;
        };
        let url = cluster.create_database(test);
        let DatabaseUrl::Postgres(url) = DatabaseUrl::parse(&url, Path::new("/")).unwrap() else {
            panic!("not a PostgreSQL URL")
        };
        Some(Settings::from_url(&url, Durability::Full, Duration::from_secs(10)).unwrap())
    }

    fn claim_for(id: &str, instance: usize) -> Claim {
        Claim {
            event_id: id.to_string(),
            event_type: None,
            body: format!("{{\"id\":\"{id}\"}}").into_bytes(),
            json: None,
            content_type: None,
            headers: vec![("x-instance".to_string(), instance.to_string())],
            kept_headers: "{}".to_string(),
            payload_hash: format!("hash-{id}"),
            verified_with: Some(0),
            signed_at: None,
            received_at: now_ms(),
            remote: "test".to_string(),
            batch: None,
            reingest: false,
            catchup: false,
        }
    }

    /// Three instances on one database get 300 events, each delivered 6
    /// times, in different orders and groups at once: every claim answers,
    /// exactly one per event wins, and the business table has exactly one
    /// row per event.
    #[test]
    fn three_instances_claim_each_event_exactly_once() {
        let Some(settings) = settings("three_instances") else {
            return;
        };
        let mut admin = settings.connect().unwrap();
        migrate(&mut admin, crate::config::database_url::DEFAULT_SCHEMA).unwrap();
        admin
            .batch_execute("CREATE TABLE public.ledger (event_id text PRIMARY KEY, instance text)")
            .unwrap();
        let config = Arc::new(Config::parse(CONFIG, "unit", Path::new("/"), None).unwrap());

        let instances: Vec<_> = (0..3)
            .map(|instance| {
                let settings = settings.clone();
                let config = Arc::clone(&config);
                std::thread::spawn(move || {
                    let mut client = settings.connect().unwrap();
                    let mut statements = Statements::default();
                    // Each instance sees every event twice, in its own order.
                    let mut ids: Vec<usize> = (0..300).chain(0..300).collect();
                    fastrand::Rng::with_seed(instance as u64).shuffle(&mut ids);
                    let mut outcomes = Vec::new();
                    for group in ids.chunks(37) {
                        let claims: Vec<Claim> = group
                            .iter()
                            .map(|i| claim_for(&format!("evt_{i:03}"), instance))
                            .collect();
                        let source = &config.sources[0];
                        let mut ops: Vec<Op<'_, Decision>> = claims
                            .iter()
                            .map(|c| Op {
                                key: (source.name.clone(), c.event_id.clone()),
                                savepoints: 1,
                                events: event_row_of(|tx| claim_in(tx, source, c))
                                    .into_iter()
                                    .collect(),
                                run: Box::new(move |tx: &mut PgTx<'_>| claim_in(tx, source, c)),
                            })
                            .collect();
                        for r in run_group(&mut client, &mut statements, &mut ops) {
                            outcomes.push(r.expect("every claim is answered without an error"));
                        }
                    }
                    outcomes
                })
            })
            .collect();
        let mut accepted = 0;
        let mut answered = 0;
        for t in instances {
            for o in t.join().unwrap() {
                answered += 1;
                if matches!(o, Decision::Accepted { .. }) {
                    accepted += 1;
                }
            }
        }
        let count = |c: &mut Client, sql: &str| -> i64 { c.query_one(sql, &[]).unwrap().get(0) };
        assert_eq!(answered, 1800);
        assert_eq!(accepted, 300);
        assert_eq!(count(&mut admin, "SELECT count(*) FROM events"), 300);
        assert_eq!(count(&mut admin, "SELECT count(*) FROM public.ledger"), 300);
        assert_eq!(count(&mut admin, "SELECT count(*) FROM deliveries"), 1800);
        assert_eq!(
            count(
                &mut admin,
                "SELECT count(*) FROM jobs WHERE status = 'done'"
            ),
            300
        );
    }

    /// One group's claims, decided by one insert of its events: the first
    /// claim of a key wins, a later one in the same group is a duplicate
    /// (or a mismatch), a key another transaction stored is a duplicate
    /// with that event's state, and every delivery gets its row; a claim
    /// without a prepared row is claimed on its own.
    #[test]
    fn a_groups_claims_are_decided_by_one_insert() {
        let Some(settings) = settings("group_insert") else {
            return;
        };
        let mut admin = settings.connect().unwrap();
        migrate(&mut admin, crate::config::database_url::DEFAULT_SCHEMA).unwrap();
        admin
            .batch_execute("CREATE TABLE public.ledger (event_id text PRIMARY KEY, instance text)")
            .unwrap();
        let config = Config::parse(CONFIG, "unit", Path::new("/"), None).unwrap();
        let source = &config.sources[0];
        let mut client = settings.connect().unwrap();
        let mut statements = Statements::default();
        // e0 is stored first, by another transaction.
        let stored = claim_for("e0", 9);
        let mut first = vec![Op {
            key: (source.name.clone(), "e0".to_string()),
            savepoints: 1,
            events: event_row_of(|tx| claim_in(tx, source, &stored))
                .into_iter()
                .collect(),
            run: Box::new(|tx: &mut PgTx<'_>| claim_in(tx, source, &stored)),
        }];
        let r = run_group(&mut client, &mut statements, &mut first);
        assert!(matches!(r[0], Ok(Decision::Accepted { .. })), "{r:?}");
        drop(first);

        let mut other = claim_for("e1", 2);
        other.payload_hash = "hash-other".to_string();
        let claims = [
            claim_for("e2", 1),
            claim_for("e1", 1),
            claim_for("e0", 1),
            claim_for("e1", 1),
            other,
            claim_for("e3", 1),
        ];
        let mut ops: Vec<Op<'_, Decision>> = claims
            .iter()
            .enumerate()
            .map(|(i, c)| Op {
                key: (source.name.clone(), c.event_id.clone()),
                savepoints: 1,
                // e3 has no row: its claim inserts it on its own.
                events: (i != 5)
                    .then(|| event_row_of(|tx| claim_in(tx, source, c)))
                    .flatten()
                    .into_iter()
                    .collect(),
                run: Box::new(move |tx: &mut PgTx<'_>| claim_in(tx, source, c)),
            })
            .collect();
        let outcomes: Vec<Decision> = run_group(&mut client, &mut statements, &mut ops)
            .into_iter()
            .map(Result::unwrap)
            .collect();
        drop(ops);
        let accepted =
            |o: &Decision| matches!(o, Decision::Accepted { state, .. } if state == "completed");
        assert!(accepted(&outcomes[0]), "{outcomes:?}");
        assert!(accepted(&outcomes[1]), "{outcomes:?}");
        let completed = "completed".to_string();
        assert_eq!(
            outcomes[2],
            Decision::Duplicate {
                state: completed.clone()
            }
        );
        assert_eq!(
            outcomes[3],
            Decision::Duplicate {
                state: completed.clone()
            }
        );
        assert_eq!(outcomes[4], Decision::Mismatch { state: completed });
        assert!(accepted(&outcomes[5]), "{outcomes:?}");

        let count = |c: &mut Client, sql: &str| -> i64 { c.query_one(sql, &[]).unwrap().get(0) };
        assert_eq!(count(&mut admin, "SELECT count(*) FROM events"), 4);
        assert_eq!(count(&mut admin, "SELECT count(*) FROM public.ledger"), 4);
        assert_eq!(count(&mut admin, "SELECT count(*) FROM incidents"), 1);
        let deliveries: Vec<(String, String)> = admin
            .query("SELECT event_id, outcome FROM deliveries ORDER BY id", &[])
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        let want = [
            ("e0", "accepted"),
            // The group's, in key order.
            ("e0", "duplicate"),
            ("e1", "accepted"),
            ("e1", "duplicate"),
            ("e1", "mismatch"),
            ("e2", "accepted"),
            ("e3", "accepted"),
        ];
        let want: Vec<(String, String)> = want
            .iter()
            .map(|(e, o)| (e.to_string(), o.to_string()))
            .collect();
        assert_eq!(deliveries, want);
    }

    /// Two transactions that lock the same business rows in opposite
    /// orders deadlock; the loser's group is run again and both succeed.
    #[test]
    fn a_deadlocked_group_is_run_again() {
        let Some(settings) = settings("deadlock_retry") else {
            return;
        };
        let mut admin = settings.connect().unwrap();
        admin
            .batch_execute(
                "CREATE TABLE public.counters (id int PRIMARY KEY, n int NOT NULL);
                 INSERT INTO public.counters VALUES (1, 0), (2, 0);",
            )
            .unwrap();
        let barrier = Arc::new(std::sync::Barrier::new(2));
        let sides: Vec<_> = [(1, 2), (2, 1)]
            .into_iter()
            .map(|(first, second)| {
                let settings = settings.clone();
                let barrier = Arc::clone(&barrier);
                std::thread::spawn(move || {
                    let mut client = settings.connect().unwrap();
                    let mut statements = Statements::default();
                    let mut tries = 0;
                    let mut ops = vec![Op {
                        key: ("k".to_string(), first.to_string()),
                        savepoints: 0,
                        events: Vec::new(),
                        run: Box::new(|tx: &mut PgTx<'_>| {
                            tries += 1;
                            let c = tx.client();
                            c.execute(
                                "UPDATE public.counters SET n = n + 1 WHERE id = $1",
                                &[&first],
                            )?;
                            if tries == 1 {
                                barrier.wait();
                            }
                            c.execute(
                                "UPDATE public.counters SET n = n + 1 WHERE id = $1",
                                &[&second],
                            )?;
                            Ok(())
                        }),
                    }];
                    let results = run_group(&mut client, &mut statements, &mut ops);
                    drop(ops);
                    (results.into_iter().all(|r| r.is_ok()), tries)
                })
            })
            .collect();
        let outcomes: Vec<(bool, i32)> = sides.into_iter().map(|t| t.join().unwrap()).collect();
        assert!(outcomes.iter().all(|(ok, _)| *ok), "{outcomes:?}");
        assert!(
            outcomes.iter().any(|(_, tries)| *tries > 1),
            "one side was run again: {outcomes:?}"
        );
        let total: i64 = admin
            .query_one("SELECT sum(n)::bigint FROM public.counters", &[])
            .unwrap()
            .get(0);
        assert_eq!(total, 4, "each side's two updates committed once");
    }

    /// A group whose SQL actions need more savepoints than the bound is
    /// cut into several transactions, each under it.
    #[test]
    fn groups_are_cut_under_the_savepoint_bound() {
        let Some(settings) = settings("savepoint_bound") else {
            return;
        };
        let mut client = settings.connect().unwrap();
        let mut statements = Statements::default();
        let mut seen: Vec<(i64, usize)> = Vec::new();
        {
            let mut ops: Vec<Op<'_, (i64, usize)>> = (0..100)
                .map(|i| Op {
                    key: ("k".to_string(), format!("{i:03}")),
                    savepoints: 2,
                    events: Vec::new(),
                    run: Box::new(move |tx: &mut PgTx<'_>| {
                        let xid: i64 = tx.client().query_one("SELECT txid_current()", &[])?.get(0);
                        Ok((xid, i))
                    }),
                })
                .collect();
            for r in run_group(&mut client, &mut statements, &mut ops) {
                seen.push(r.unwrap());
            }
        }
        let mut per_tx: std::collections::BTreeMap<i64, usize> = Default::default();
        for (xid, _) in &seen {
            *per_tx.entry(*xid).or_default() += 1;
        }
        assert_eq!(seen.len(), 100);
        assert!(per_tx.len() >= 4, "{per_tx:?}");
        assert!(
            per_tx.values().all(|n| n * 2 <= MAX_SAVEPOINTS),
            "{per_tx:?}"
        );
        // Results come back in the order of the operations.
        assert!(seen.iter().enumerate().all(|(i, (_, j))| i == *j));
    }
}
