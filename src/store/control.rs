//! The storage steps of delivery control (`outbox::control` decides), over
//! the open transaction's `Db`, one text for both backends: an order key's
//! unfinished jobs (the `jobs_order` partial index), an action's limits row
//! (`action_limits`, locked on PostgreSQL) and attempts in flight
//! (`jobs_in_flight`), the highest `supersede` value delivered per key
//! (`order_marks`), and the job updates they lead to.

use crate::args;
use crate::store::StoreError;
use crate::store::db::{Db, Dialect, Value};
use crate::store::tx::order_open;

/// A job's order key and its place among the key's jobs.
pub struct OrderPlace {
    pub source: String,
    pub action: String,
    pub key: String,
    pub seq: i64,
}

/// The job's order key and place, when it has one.
pub fn order_place(db: &Db<'_>, job_id: i64) -> Result<Option<OrderPlace>, StoreError> {
    db.query_opt(
        "SELECT source, action, order_key, order_seq FROM jobs WHERE id = ?1 AND order_key IS NOT NULL",
        args![job_id],
    )?
    .map(|r| {
        Ok(OrderPlace {
            source: r.string(0)?,
            action: r.string(1)?,
            key: r.string(2)?,
            seq: r.opt_i64(3)?.unwrap_or(0),
        })
    })
    .transpose()
}

/// The `FOR UPDATE` of the dialect (nothing on SQLite's one writer).
fn lock(db: &Db<'_>) -> &'static str {
    match db.dialect() {
        Dialect::Sqlite => "",
        Dialect::Postgres => " FOR UPDATE",
    }
}

/// The nearest earlier unfinished job of an order key (?1 source, ?2
/// action, ?3 key) than the job at (?4 order_seq, ?5 id): one step down the
/// `jobs_order` index.
pub(crate) fn behind_sql(lock: &str) -> String {
    format!(
        "SELECT id FROM jobs WHERE {}
            AND (order_seq < ?4 OR (order_seq = ?4 AND id < ?5))
          ORDER BY order_seq DESC, id DESC LIMIT 1{lock}",
        order_open("?1", "?2", "?3")
    )
}

/// True when a job of the key earlier than `place` (job `job_id`) is
/// unfinished. On PostgreSQL the nearest one is locked: one that another
/// transaction is finishing right now is waited for and then seen
/// finished, so a job is never parked after the trigger that would have
/// made it due has already run.
pub fn earlier_unfinished(
    db: &Db<'_>,
    place: &OrderPlace,
    job_id: i64,
) -> Result<bool, StoreError> {
    Ok(db
        .query_opt(
            &behind_sql(lock(db)),
            args![
                place.source.as_str(),
                place.action.as_str(),
                place.key.as_str(),
                place.seq,
                job_id
            ],
        )?
        .is_some())
}

/// A pending job waits: for `reason`, due again at `until` (None: when a
/// trigger or a completion makes it due).
pub fn wait(
    db: &Db<'_>,
    job_id: i64,
    n_attempts: i64,
    reason: &str,
    until: Option<i64>,
    now: i64,
) -> Result<(), StoreError> {
    db.execute(
        "UPDATE jobs SET next_attempt_at = ?4, waiting = ?3, updated_at = ?5
          WHERE id = ?1 AND n_attempts = ?2 AND status = 'pending'",
        args![job_id, n_attempts, reason, until, now],
    )?;
    Ok(())
}

/// The action's limits row (made with `tokens` when missing), locked until
/// the transaction ends: its tokens and when they were last refilled.
/// Takes of the action on every instance go one at a time from here, and
/// at READ COMMITTED each statement after it sees what the one before
/// committed.
pub fn limits_locked(
    db: &Db<'_>,
    source: &str,
    action: &str,
    tokens: f64,
    now: i64,
) -> Result<(f64, i64), StoreError> {
    db.execute(
        "INSERT INTO action_limits (source, action, tokens, refilled_at) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (source, action) DO NOTHING",
        args![source, action, Value::Real(tokens), now],
    )?;
    let row = db.query_one(
        &format!(
            "SELECT tokens, refilled_at FROM action_limits WHERE source = ?1 AND action = ?2{}",
            lock(db)
        ),
        args![source, action],
    )?;
    Ok((row.f64(0)?, row.i64(1)?))
}

/// Writes the action's tokens, refilled as of `now`.
pub fn set_tokens(
    db: &Db<'_>,
    source: &str,
    action: &str,
    tokens: f64,
    now: i64,
) -> Result<(), StoreError> {
    db.execute(
        "UPDATE action_limits SET tokens = ?3, refilled_at = ?4 WHERE source = ?1 AND action = ?2",
        args![source, action, Value::Real(tokens), now],
    )?;
    Ok(())
}

/// An action's attempts in flight (?1 source, ?2 action, ?3 now).
pub(crate) const IN_FLIGHT: &str = "SELECT count(*) FROM jobs
  WHERE source = ?1 AND action = ?2 AND status = 'processing' AND lease_until >= ?3";

/// How many attempts of the action are in flight (leases still running).
pub fn in_flight(db: &Db<'_>, source: &str, action: &str, now: i64) -> Result<i64, StoreError> {
    db.query_one(IN_FLIGHT, args![source, action, now])?.i64(0)
}

/// The job of the action that has waited longest for a concurrency slot
/// is due now.
pub fn release_slot(db: &Db<'_>, source: &str, action: &str, now: i64) -> Result<(), StoreError> {
    db.execute(
        "UPDATE jobs SET next_attempt_at = ?3, waiting = NULL
          WHERE id = (SELECT id FROM jobs
                       WHERE source = ?1 AND action = ?2 AND status = 'pending'
                         AND waiting = 'concurrency'
                       ORDER BY next_attempt_at, id LIMIT 1)",
        args![source, action, now],
    )?;
    Ok(())
}

/// The highest `supersede` value delivered for the job's key, as written.
pub fn order_mark(db: &Db<'_>, place: &OrderPlace) -> Result<Option<String>, StoreError> {
    db.query_opt(
        "SELECT value FROM order_marks WHERE source = ?1 AND action = ?2 AND order_key = ?3",
        args![
            place.source.as_str(),
            place.action.as_str(),
            place.key.as_str()
        ],
    )?
    .map(|r| r.string(0))
    .transpose()
}

/// Writes the key's mark.
pub fn set_order_mark(db: &Db<'_>, place: &OrderPlace, value: &str) -> Result<(), StoreError> {
    db.execute(
        "INSERT INTO order_marks (source, action, order_key, value) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (source, action, order_key) DO UPDATE SET value = excluded.value",
        args![
            place.source.as_str(),
            place.action.as_str(),
            place.key.as_str(),
            value
        ],
    )?;
    Ok(())
}

/// Ends a job this take leased (attempt `n`) as `superseded`; false when
/// it is no longer that lease.
pub fn supersede(db: &Db<'_>, job_id: i64, n: i64, now: i64) -> Result<bool, StoreError> {
    Ok(db.execute(
        "UPDATE jobs SET status = 'superseded', next_attempt_at = NULL,
                waiting = NULL, lease_owner = NULL, lease_until = NULL, last_error = NULL,
                updated_at = ?3
          WHERE id = ?1 AND n_attempts = ?2 AND status = 'processing'",
        args![job_id, n, now],
    )? == 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::open::testing::{query_plan, sqlite_file};
    use rusqlite::params;

    /// The lookups of delivery control go down their indexes, so they
    /// cost the same with a million pending jobs of one hot key: no scan
    /// of `jobs` in any of them.
    #[test]
    fn order_and_limits_lookups_use_their_indexes() {
        let dir = tempfile::tempdir().unwrap();
        let conn = sqlite_file(&dir.path().join("plan.db"));
        let behind = query_plan(&conn, &behind_sql(""), params!["s", "a", "k", 5, 9]);
        assert!(behind.contains("INDEX jobs_order"), "{behind}");
        let insert = crate::store::tx::ordered_job_insert();
        let insert = query_plan(
            &conn,
            insert,
            params![
                "s",
                "e",
                "a",
                "forward",
                "pending",
                0,
                1,
                None::<String>,
                1,
                "k"
            ],
        );
        assert!(insert.contains("INDEX jobs_order"), "{insert}");
        let in_flight = query_plan(&conn, IN_FLIGHT, params!["s", "a", 1]);
        assert!(in_flight.contains("INDEX jobs_in_flight"), "{in_flight}");
        for plan in [behind, insert, in_flight] {
            assert!(!plan.contains("SCAN jobs"), "{plan}");
        }
    }
}
