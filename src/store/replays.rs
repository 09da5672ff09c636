//! The `replays` table on both backends: a replay recorded, and an
//! event's replays placed among their jobs' attempts.

use crate::args;
use crate::state::JobStatus;
use crate::store::StoreError;
use crate::store::db::Db;

/// Where a job's latest replay came from (?1 job id): the outbox's
/// lookup, on both backends.
pub const LATEST_FROM: &str =
    "SELECT from_status FROM replays WHERE job_id = ?1 ORDER BY id DESC LIMIT 1";

/// One replay of one of an event's jobs.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayRow {
    pub job_id: i64,
    pub action: String,
    pub replayed_at: i64,
    pub from_status: JobStatus,
    pub forced: bool,
    /// `cli` or `api`.
    pub origin: String,
    /// The number of the job's last attempt that started before the
    /// replay (0 for none): the replay comes after it, before the next
    /// (the run it caused, which starts in the same millisecond for an
    /// SQL job). Times shown in whole seconds could not order them.
    pub after_attempt: i64,
}

/// Records a replay of `job_id` at `at` (ms).
pub fn insert(
    db: &Db<'_>,
    job_id: i64,
    at: i64,
    from_status: JobStatus,
    forced: bool,
    origin: &str,
) -> Result<(), StoreError> {
    db.execute(
        "INSERT INTO replays (job_id, replayed_at, from_status, forced, origin)
         VALUES (?1, ?2, ?3, ?4, ?5)",
        args![job_id, at, from_status, forced, origin],
    )?;
    Ok(())
}

/// The replays of the event's jobs, in the order they were made.
pub fn of_event(db: &Db<'_>, source: &str, event_id: &str) -> Result<Vec<ReplayRow>, StoreError> {
    db.query(
        "SELECT r.job_id, j.action, r.replayed_at, r.from_status, r.forced, r.origin,
                (SELECT coalesce(max(a.n), 0) FROM attempts a
                  WHERE a.job_id = r.job_id AND a.started_at < r.replayed_at)
         FROM replays r JOIN jobs j ON j.id = r.job_id
         WHERE j.source = ?1 AND j.event_id = ?2 ORDER BY r.id",
        args![source, event_id],
    )?
    .iter()
    .map(|r| {
        Ok(ReplayRow {
            job_id: r.i64(0)?,
            action: r.string(1)?,
            replayed_at: r.i64(2)?,
            from_status: r.word(3)?,
            forced: r.bool(4)?,
            origin: r.string(5)?,
            after_attempt: r.i64(6)?,
        })
    })
    .collect()
}
