//! The `catchup_runs` table, on both backends: the lease one catch-up run
//! of a source holds (taken with the database's clock, so two instances
//! on one PostgreSQL database never run the same source's catch-up at
//! once), what the last run found, and the few reads a run makes
//! (`catchup/`).

use crate::args;
use crate::store::StoreError;
use crate::store::db::{Db, Dialect, Value};

/// The database's clock in unix milliseconds, as SQL.
fn db_now(db: &Db<'_>) -> &'static str {
    match db.dialect() {
        Dialect::Sqlite => "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)",
        Dialect::Postgres => "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)",
    }
}

/// Takes the source's lease for `ttl_ms` unless another owner holds one
/// that has not run out, or an API's `Retry-After` is still running (with
/// `honour_retry_after`). True when `owner` holds it now.
pub fn take_lease(
    db: &Db<'_>,
    source: &str,
    owner: &str,
    ttl_ms: i64,
    honour_retry_after: bool,
) -> Result<bool, StoreError> {
    db.execute(
        "INSERT INTO catchup_runs (source) VALUES (?1) ON CONFLICT DO NOTHING",
        args![source],
    )?;
    let now = db_now(db);
    let taken = db.execute(
        &format!(
            "UPDATE catchup_runs SET lease_owner = ?2, lease_until = {now} + ?3
             WHERE source = ?1
               AND (lease_until IS NULL OR lease_until < {now} OR lease_owner = ?2)
               AND (?4 = 0 OR next_run_after IS NULL OR next_run_after <= {now})"
        ),
        args![source, owner, ttl_ms, i64::from(honour_retry_after)],
    )?;
    Ok(taken == 1)
}

/// What one run found, as recorded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunRecord {
    pub source: String,
    pub last_run_at: Option<i64>,
    pub window_from: Option<i64>,
    pub claimed: i64,
    pub redelivery_requested: i64,
    pub already_stored: i64,
    pub error: Option<String>,
    pub next_run_after: Option<i64>,
}

/// Records the run and gives the lease back (only `owner`'s).
pub fn finish(db: &Db<'_>, owner: &str, r: &RunRecord) -> Result<(), StoreError> {
    db.execute(
        "UPDATE catchup_runs SET lease_owner = NULL, lease_until = NULL,
             last_run_at = ?3, window_from = ?4, claimed = ?5,
             redelivery_requested = ?6, already_stored = ?7, error = ?8,
             next_run_after = ?9
         WHERE source = ?1 AND lease_owner = ?2",
        args![
            r.source.as_str(),
            owner,
            int(r.last_run_at),
            int(r.window_from),
            r.claimed,
            r.redelivery_requested,
            r.already_stored,
            &r.error,
            int(r.next_run_after)
        ],
    )?;
    Ok(())
}

fn int(v: Option<i64>) -> Value {
    v.map_or(Value::Null, Value::Int)
}

/// Every source's last run, by source name.
pub fn last_runs(db: &Db<'_>) -> Result<Vec<RunRecord>, StoreError> {
    db.query(
        "SELECT source, last_run_at, window_from, claimed, redelivery_requested,
                already_stored, error, next_run_after
         FROM catchup_runs ORDER BY source",
        &[],
    )?
    .iter()
    .map(|r| {
        Ok(RunRecord {
            source: r.string(0)?,
            last_run_at: r.opt_i64(1)?,
            window_from: r.opt_i64(2)?,
            claimed: r.i64(3)?,
            redelivery_requested: r.i64(4)?,
            already_stored: r.i64(5)?,
            error: r.opt_string(6)?,
            next_run_after: r.opt_i64(7)?,
        })
    })
    .collect()
}

/// Which of `event_ids` the source has stored.
pub fn stored_ids(
    db: &Db<'_>,
    source: &str,
    event_ids: &[String],
) -> Result<std::collections::HashSet<String>, StoreError> {
    let mut out = std::collections::HashSet::new();
    for chunk in event_ids.chunks(100) {
        let marks: Vec<String> = (0..chunk.len()).map(|i| format!("?{}", i + 2)).collect();
        let mut values = vec![Value::from(source)];
        values.extend(chunk.iter().map(|id| Value::from(id.as_str())));
        for row in db.query(
            &format!(
                "SELECT event_id FROM events WHERE source = ?1 AND event_id IN ({})",
                marks.join(", ")
            ),
            &values,
        )? {
            out.insert(row.string(0)?);
        }
    }
    Ok(out)
}
