//! The `jobs` table's reads for the operator side, on both backends: an
//! event's jobs as `events show` prints them. Status and kind come back
//! as the `state.rs` enums.

use crate::args;
use crate::state::{JobKind, JobStatus};
use crate::store::StoreError;
use crate::store::db::{Db, Dialect};

/// One job of an event.
#[derive(Debug, Clone, PartialEq)]
pub struct JobRow {
    pub id: i64,
    pub action: String,
    pub kind: JobKind,
    pub status: JobStatus,
    pub next_attempt_at: Option<i64>,
    pub last_error: Option<String>,
    /// Why a pending job with no due time waits (`after`, `order`,
    /// `concurrency`, `rate`), when it was kept.
    pub waiting: Option<String>,
}

/// An event's jobs, in the order they were written.
pub fn of_event(db: &Db<'_>, source: &str, event_id: &str) -> Result<Vec<JobRow>, StoreError> {
    db.query(
        "SELECT id, action, kind, status, next_attempt_at, last_error, waiting
         FROM jobs WHERE source = ?1 AND event_id = ?2 ORDER BY id",
        args![source, event_id],
    )?
    .iter()
    .map(|r| {
        Ok(JobRow {
            id: r.i64(0)?,
            action: r.string(1)?,
            kind: r.word(2)?,
            status: r.word(3)?,
            next_attempt_at: r.opt_i64(4)?,
            last_error: r.opt_string(5)?,
            waiting: r.opt_string(6)?,
        })
    })
    .collect()
}

/// How many jobs each action has per status, for the statuses asked
/// (done jobs are the common case: counting them would read every job).
pub fn counts_by_action(
    db: &Db<'_>,
    statuses: &[JobStatus],
) -> Result<Vec<(String, String, JobStatus, i64)>, StoreError> {
    let words: Vec<String> = statuses
        .iter()
        .map(|s| format!("'{}'", s.as_str()))
        .collect();
    db.query(
        &format!(
            "SELECT source, action, status, count(*) FROM jobs
             WHERE status IN ({}) GROUP BY source, action, status",
            words.join(", ")
        ),
        &[],
    )?
    .iter()
    .map(|r| Ok((r.string(0)?, r.string(1)?, r.word(2)?, r.i64(3)?)))
    .collect()
}

/// Jobs per status, by status. SQLite keeps them in `job_counts`
/// (triggers; a status once seen keeps its row, at 0 when it has no jobs
/// now); PostgreSQL counts the statuses that have jobs (no counter rows,
/// which every instance's every job would contend on).
pub fn counts(db: &Db<'_>) -> Result<Vec<(JobStatus, i64)>, StoreError> {
    let sql = match db.dialect() {
        Dialect::Sqlite => "SELECT status, n FROM job_counts ORDER BY status",
        Dialect::Postgres => "SELECT status, count(*) FROM jobs GROUP BY status ORDER BY status",
    };
    db.query(sql, &[])?
        .iter()
        .map(|r| Ok((r.word(0)?, r.i64(1)?)))
        .collect()
}
