//! The `attempts` table (and `checks`, the questions asked for an
//! attempt) on the operator side, on both backends: the one insert every
//! operator command records an attempt with ([`insert`]: resolve, a
//! replayed SQL job's run, reconcile's confirmation and the cut-short
//! attempt before it), the next number, and a job's attempts and checks
//! as `events show` prints them. Outcomes and answers cross as the
//! `state.rs` enums. The claim and the outbox record theirs through
//! `store::Tx` / `store::OutboxTx`.

use crate::args;
use crate::state::{Answer, AttemptOutcome};
use crate::store::StoreError;
use crate::store::db::Db;

/// One attempt of a job, as stored.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AttemptRow {
    pub job_id: i64,
    /// Numbered from 1 per job.
    pub n: i64,
    pub started_at: i64,
    pub finished_at: Option<i64>,
    /// None while the attempt is in flight.
    pub outcome: Option<AttemptOutcome>,
    pub http_status: Option<i64>,
    pub error: Option<String>,
    pub error_kind: Option<String>,
    pub request_id: Option<String>,
    pub response_head: Option<String>,
    /// The worker, or `replay:cli`, `resolve:api` and the like.
    pub worker: Option<String>,
    /// The operator's note on a resolve.
    pub note: Option<String>,
}

/// The one statement that writes an attempt, on both backends (`?N`;
/// PostgreSQL's copy is rewritten to `$N` once): a new attempt number is
/// inserted; one the job has already is replaced when `?13` is true (a
/// worker's completion over the cut-short record of a takeover) and kept
/// when it is false (the number is then reported as not written).
pub const PUT: &str = "INSERT INTO attempts (job_id, n, started_at, finished_at, outcome,
                          http_status, error, error_kind, request_id, response_head, worker, note)
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)
     ON CONFLICT (job_id, n) DO UPDATE SET
         started_at = excluded.started_at, finished_at = excluded.finished_at,
         outcome = excluded.outcome, http_status = excluded.http_status,
         error = excluded.error, error_kind = excluded.error_kind,
         request_id = excluded.request_id, response_head = excluded.response_head,
         worker = excluded.worker, note = excluded.note
     WHERE ?13";

/// The outbox's reads of `attempts`, on both backends (`?N`): the
/// attempts made up to the job's last operator replay (?1 job id).
pub const REPLAY_BUDGET_BASE: &str = "SELECT coalesce(max(n), 0) FROM attempts WHERE job_id = ?1
       AND started_at <= (SELECT max(replayed_at) FROM replays WHERE job_id = ?1)";

/// Whether attempt ?2 of job ?1 was recorded.
pub const EXISTS: &str = "SELECT EXISTS (SELECT 1 FROM attempts WHERE job_id = ?1 AND n = ?2)";

/// Whether an attempt of job ?1 since its last success may have reached
/// the downstream (anything but a refused connection).
pub const MAY_HAVE_REACHED: &str = "SELECT EXISTS (SELECT 1 FROM attempts WHERE job_id = ?1
       AND n > (SELECT coalesce(max(n), 0) FROM attempts
                 WHERE job_id = ?1 AND outcome = 'ok')
       AND coalesce(error_kind, '') <> 'connect')";

/// A question asked of a `check` URL, as a worker records it.
pub const CHECK_INSERT: &str =
    "INSERT INTO checks (job_id, n, asked_at, finished_at, answer, http_status, error, worker)
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)";

/// Writes `a` unless the job already has an attempt of its number; true
/// when written.
fn put_if_new(db: &Db<'_>, a: &AttemptRow) -> Result<bool, StoreError> {
    let written = db.execute(
        PUT,
        args![
            a.job_id,
            a.n,
            a.started_at,
            a.finished_at,
            a.outcome,
            a.http_status,
            &a.error,
            &a.error_kind,
            &a.request_id,
            &a.response_head,
            &a.worker,
            &a.note,
            false,
        ],
    )?;
    Ok(written == 1)
}

/// Records `a`. Its number must be new for the job (the caller read the
/// last one under the job's lock): a repeated one is a storage error.
pub fn insert(db: &Db<'_>, a: &AttemptRow) -> Result<(), StoreError> {
    if put_if_new(db, a)? {
        Ok(())
    } else {
        Err(StoreError::other(format!(
            "job {} already has an attempt {}",
            a.job_id, a.n
        )))
    }
}

/// Records `a` unless the job already has an attempt of its number (one
/// a worker recorded meanwhile stays as it is). True when written.
pub fn insert_if_new(db: &Db<'_>, a: &AttemptRow) -> Result<bool, StoreError> {
    put_if_new(db, a)
}

/// The highest attempt number recorded for the job, 0 for none.
pub fn last_n(db: &Db<'_>, job_id: i64) -> Result<i64, StoreError> {
    db.query_one(
        "SELECT coalesce(max(n), 0) FROM attempts WHERE job_id = ?1",
        args![job_id],
    )?
    .i64(0)
}

/// A job's attempts, by number.
pub fn of_job(db: &Db<'_>, job_id: i64) -> Result<Vec<AttemptRow>, StoreError> {
    db.query(
        "SELECT n, started_at, finished_at, outcome, http_status, error, error_kind,
                response_head, request_id, note, worker
         FROM attempts WHERE job_id = ?1 ORDER BY n",
        args![job_id],
    )?
    .iter()
    .map(|a| {
        Ok(AttemptRow {
            job_id,
            n: a.i64(0)?,
            started_at: a.i64(1)?,
            finished_at: a.opt_i64(2)?,
            outcome: a.opt_word(3)?,
            http_status: a.opt_i64(4)?,
            error: a.opt_string(5)?,
            error_kind: a.opt_string(6)?,
            response_head: a.opt_string(7)?,
            request_id: a.opt_string(8)?,
            note: a.opt_string(9)?,
            worker: a.opt_string(10)?,
        })
    })
    .collect()
}

/// One question asked of a forward job's `check` URL.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckRow {
    /// The attempt it was asked for.
    pub n: i64,
    pub asked_at: i64,
    pub answer: Answer,
    pub http_status: Option<i64>,
    pub error: Option<String>,
}

/// The questions asked for a job, oldest first.
pub fn checks_of_job(db: &Db<'_>, job_id: i64) -> Result<Vec<CheckRow>, StoreError> {
    db.query(
        "SELECT n, asked_at, answer, http_status, error FROM checks WHERE job_id = ?1 ORDER BY id",
        args![job_id],
    )?
    .iter()
    .map(|r| {
        Ok(CheckRow {
            n: r.i64(0)?,
            asked_at: r.i64(1)?,
            answer: r.word(2)?,
            http_status: r.opt_i64(3)?,
            error: r.opt_string(4)?,
        })
    })
    .collect()
}

/// When each attempt of the event's jobs started (ms): (action, n,
/// started_at).
pub fn starts_of_event(
    db: &Db<'_>,
    source: &str,
    event_id: &str,
) -> Result<Vec<(String, i64, i64)>, StoreError> {
    db.query(
        "SELECT j.action, a.n, a.started_at FROM attempts a JOIN jobs j ON j.id = a.job_id
         WHERE j.source = ?1 AND j.event_id = ?2",
        args![source, event_id],
    )?
    .iter()
    .map(|r| Ok((r.string(0)?, r.i64(1)?, r.i64(2)?)))
    .collect()
}
