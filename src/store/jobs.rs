//! The `jobs` table on the operator side, on both backends: an event's
//! jobs (as `events show` prints them, as a replay plans on them), counts,
//! what `reconcile` lists, and the conditional changes of a replay, a
//! resolve and a confirmation, each under the row lock its caller took
//! ([`lock_status`], [`lock_leased`]). Status and kind cross as the
//! `state.rs` enums.

use std::fmt::Write as _;

use crate::args;
use crate::state::{JobKind, JobStatus};
use crate::store::StoreError;
use crate::store::backend::JobCounts;
use crate::store::db::{Db, Dialect, Row, Value};

// The outbox's statements on `jobs` that both backends run as written
// (`?N`; PostgreSQL's wing rewrites them to `$N`). The takes (due and
// expired jobs, `SKIP LOCKED` on PostgreSQL) differ and live in the wings.

/// An event's jobs that are not done, with their status.
pub const OPEN_OF_EVENT: &str =
    "SELECT action, status FROM jobs WHERE source = ?1 AND event_id = ?2 AND status <> 'done'";

/// Parks a pending job (?1, of ?2 attempts): no due time, the reason ?3.
pub const PARK: &str =
    "UPDATE jobs SET next_attempt_at = NULL, last_error = ?3, updated_at = ?4, waiting = 'after'
     WHERE id = ?1 AND n_attempts = ?2 AND status = 'pending'";

/// The lease, decided by a conditional UPDATE: one row when ?2 took job
/// ?1 (due and pending, or a lease that ran out) until ?3.
pub const LEASE: &str =
    "UPDATE jobs SET status = 'processing', waiting = NULL, lease_owner = ?2, lease_until = ?3,
            n_attempts = n_attempts + 1, updated_at = ?4
     WHERE id = ?1 AND n_attempts = ?5
       AND ((status = 'pending' AND next_attempt_at <= ?4)
            OR (status = 'processing' AND lease_until < ?4))";

/// Ends job ?1 as ?4 with the error ?3.
pub const END: &str = "UPDATE jobs SET status = ?4, lease_owner = NULL, lease_until = NULL,
            last_error = ?3, updated_at = ?2
     WHERE id = ?1";

/// When the next job falls due (pending) or its lease ends.
pub const NEXT_DUE: &str = "SELECT min(t) FROM (
         SELECT min(next_attempt_at) AS t FROM jobs WHERE status = 'pending'
         UNION ALL
         SELECT min(lease_until) FROM jobs WHERE status = 'processing') due";

/// An attempt's result, fenced by owner (?2) and attempt number (?3).
pub const FINISH: &str =
    "UPDATE jobs SET status = ?4, next_attempt_at = ?5, lease_owner = NULL, lease_until = NULL,
            last_error = ?6, updated_at = ?7
     WHERE id = ?1 AND status = 'processing' AND lease_owner = ?2 AND n_attempts = ?3";

/// A job taken but not sent given back, fenced like [`FINISH`].
pub const GIVE_BACK: &str = "UPDATE jobs SET status = ?4, n_attempts = n_attempts - 1,
            lease_owner = NULL, lease_until = NULL
     WHERE id = ?1 AND status = 'processing' AND lease_owner = ?2 AND n_attempts = ?3";

/// Every parked job due at ?1 (but those a circuit holds).
pub const RELEASE_PARKED: &str = "UPDATE jobs SET next_attempt_at = ?1
     WHERE status = 'pending' AND next_attempt_at IS NULL
       AND coalesce(waiting, '') <> 'circuit'";

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
    db.query(
        &format!(
            "SELECT source, action, status, count(*) FROM jobs
             WHERE status IN ({}) GROUP BY source, action, status",
            status_list(statuses)
        ),
        &[],
    )?
    .iter()
    .map(|r| Ok((r.string(0)?, r.string(1)?, r.word(2)?, r.i64(3)?)))
    .collect()
}

/// Jobs per status, by status, from the counters the job triggers keep
/// on both backends (a status once seen keeps its row, at 0 when it has
/// no jobs now): SQLite's `job_counts` table, PostgreSQL's `job_counts`
/// view over its base rows and appended changes. Never a count over jobs.
pub fn counts(db: &Db<'_>) -> Result<Vec<(JobStatus, i64)>, StoreError> {
    db.query("SELECT status, n FROM job_counts ORDER BY status", &[])?
        .iter()
        .map(|r| Ok((r.word(0)?, r.i64(1)?)))
        .collect()
}

/// The words of `statuses` as an SQL list (`'pending', 'failed'`): the
/// enums' own words, never input.
fn status_list(statuses: &[JobStatus]) -> String {
    statuses
        .iter()
        .map(|s| format!("'{}'", s.as_str()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// How many of the event's jobs have one of `statuses`.
pub fn count_of_event(
    db: &Db<'_>,
    source: &str,
    event_id: &str,
    statuses: &[JobStatus],
) -> Result<i64, StoreError> {
    db.query_one(
        &format!(
            "SELECT count(*) FROM jobs WHERE source = ?1 AND event_id = ?2 AND status IN ({})",
            status_list(statuses)
        ),
        args![source, event_id],
    )?
    .i64(0)
}

/// A job as the operator commands plan on it.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    pub id: i64,
    pub source: String,
    pub event_id: String,
    pub action: String,
    pub kind: JobKind,
    pub status: JobStatus,
    pub n_attempts: i64,
    pub next_attempt_at: Option<i64>,
    pub lease_until: Option<i64>,
}

const JOB_COLUMNS: &str = "j.id, j.source, j.event_id, j.action, j.kind, j.status, j.n_attempts, \
                           j.next_attempt_at, j.lease_until";

fn job(r: &Row) -> Result<Job, StoreError> {
    Ok(Job {
        id: r.i64(0)?,
        source: r.string(1)?,
        event_id: r.string(2)?,
        action: r.string(3)?,
        kind: r.word(4)?,
        status: r.word(5)?,
        n_attempts: r.i64(6)?,
        next_attempt_at: r.opt_i64(7)?,
        lease_until: r.opt_i64(8)?,
    })
}

/// The event's jobs, in the order they were written.
pub fn all_of_event(db: &Db<'_>, source: &str, event_id: &str) -> Result<Vec<Job>, StoreError> {
    db.query(
        &format!(
            "SELECT {JOB_COLUMNS} FROM jobs j WHERE j.source = ?1 AND j.event_id = ?2 ORDER BY j.id"
        ),
        args![source, event_id],
    )?
    .iter()
    .map(job)
    .collect()
}

/// The jobs of `status`, of a source and an action when given, of events
/// received at or after `since_ms` when given, each with whether its
/// event's body is gone; by id.
pub fn with_status(
    db: &Db<'_>,
    status: JobStatus,
    source: Option<&str>,
    action: Option<&str>,
    since_ms: Option<i64>,
) -> Result<Vec<(Job, bool)>, StoreError> {
    let mut sql = format!(
        "SELECT {JOB_COLUMNS}, e.payload IS NULL FROM jobs j
         JOIN events e ON e.source = j.source AND e.event_id = j.event_id
         WHERE j.status = ?1"
    );
    let mut args: Vec<Value> = vec![status.into()];
    if let Some(s) = source {
        args.push(s.into());
        let _ = write!(sql, " AND j.source = ?{}", args.len());
    }
    if let Some(a) = action {
        args.push(a.into());
        let _ = write!(sql, " AND j.action = ?{}", args.len());
    }
    if let Some(at) = since_ms {
        args.push(at.into());
        let _ = write!(sql, " AND e.received_at >= ?{}", args.len());
    }
    sql.push_str(" ORDER BY j.id");
    db.query(&sql, &args)?
        .iter()
        .map(|r| Ok((job(r)?, r.bool(9)?)))
        .collect()
}

/// The job of `action` of the event, with the highest attempt number
/// recorded for it (0 for none).
pub fn of_action(
    db: &Db<'_>,
    source: &str,
    event_id: &str,
    action: &str,
) -> Result<Option<(Job, i64)>, StoreError> {
    db.query_opt(
        &format!(
            "SELECT {JOB_COLUMNS}, (SELECT coalesce(max(n), 0) FROM attempts a WHERE a.job_id = j.id)
             FROM jobs j WHERE j.source = ?1 AND j.event_id = ?2 AND j.action = ?3"
        ),
        args![source, event_id, action],
    )?
    .map(|r| Ok((job(&r)?, r.i64(9)?)))
    .transpose()
}

/// The job's status and attempt count, its row locked until the caller's
/// transaction ends (on PostgreSQL: a worker's take holding it is waited
/// for); None when it is gone.
pub fn lock_status(db: &Db<'_>, job_id: i64) -> Result<Option<(JobStatus, i64)>, StoreError> {
    db.query_opt(
        &format!(
            "SELECT status, n_attempts FROM jobs WHERE id = ?1{}",
            db.dialect().for_update()
        ),
        args![job_id],
    )?
    .map(|r| Ok((r.word(0)?, r.i64(1)?)))
    .transpose()
}

/// A job as `reconcile --check` decides on it, locked.
#[derive(Debug, Clone, PartialEq)]
pub struct Leased {
    pub id: i64,
    pub status: JobStatus,
    pub n_attempts: i64,
    pub lease_until: Option<i64>,
    pub updated_at: i64,
    pub lease_owner: Option<String>,
}

/// The job of `action` of the event with its lease, its row locked until
/// the caller's transaction ends; None when it is gone.
pub fn lock_leased(
    db: &Db<'_>,
    source: &str,
    event_id: &str,
    action: &str,
) -> Result<Option<Leased>, StoreError> {
    db.query_opt(
        &format!(
            "SELECT id, status, n_attempts, lease_until, updated_at, lease_owner FROM jobs
             WHERE source = ?1 AND event_id = ?2 AND action = ?3{}",
            db.dialect().for_update()
        ),
        args![source, event_id, action],
    )?
    .map(|r| {
        Ok(Leased {
            id: r.i64(0)?,
            status: r.word(1)?,
            n_attempts: r.i64(2)?,
            lease_until: r.opt_i64(3)?,
            updated_at: r.i64(4)?,
            lease_owner: r.opt_string(5)?,
        })
    })
    .transpose()
}

/// Re-opens a job for a replay: `to` (pending, or paused under a paused
/// action), due at `now`, its lease and wait reason cleared, only while
/// it still has status `from`. Returns how many rows changed (0 or 1).
pub fn reopen(
    db: &Db<'_>,
    job_id: i64,
    from: JobStatus,
    to: JobStatus,
    now: i64,
) -> Result<u64, StoreError> {
    db.execute(
        "UPDATE jobs SET status = ?4, next_attempt_at = ?2, lease_owner = NULL,
                lease_until = NULL, waiting = NULL, updated_at = ?2,
                failing_since = NULL, probe_failures = 0
         WHERE id = ?1 AND status = ?3",
        args![job_id, now, from, to],
    )
}

/// The job's order key, if its action has `order`.
pub fn order_key(db: &Db<'_>, job_id: i64) -> Result<Option<String>, StoreError> {
    db.query_opt(
        "SELECT order_key FROM jobs WHERE id = ?1 AND order_key IS NOT NULL",
        args![job_id],
    )?
    .map(|r| r.string(0))
    .transpose()
}

/// The last place among the unfinished jobs of an order key, the job
/// `except` aside; None when there are none.
pub fn last_order_seq(
    db: &Db<'_>,
    source: &str,
    action: &str,
    key: &str,
    except: i64,
) -> Result<Option<i64>, StoreError> {
    db.query_one(
        &format!(
            "SELECT max(order_seq) FROM jobs WHERE {} AND id <> ?4",
            crate::store::tx::order_open("?1", "?2", "?3")
        ),
        args![source, action, key, except],
    )?
    .opt_i64(0)
}

/// Moves the job to place `seq` of its order key; `behind` (jobs of the
/// key wait before it) parks a pending one with the reason `order`.
pub fn move_in_order(
    db: &Db<'_>,
    job_id: i64,
    seq: i64,
    behind: bool,
    now: i64,
) -> Result<(), StoreError> {
    db.execute(
        "UPDATE jobs SET order_seq = ?2,
                next_attempt_at = CASE WHEN ?3 THEN NULL ELSE next_attempt_at END,
                waiting = CASE WHEN ?3 AND status = 'pending' THEN 'order' ELSE waiting END,
                updated_at = ?4
          WHERE id = ?1",
        args![job_id, seq, behind, now],
    )?;
    Ok(())
}

/// Records an SQL job's run again by a replay: its status, `n` attempts,
/// not due, its last error when it failed (else the previous one kept).
pub fn record_run(
    db: &Db<'_>,
    job_id: i64,
    status: JobStatus,
    n: i64,
    last_error: Option<&str>,
    now: i64,
) -> Result<(), StoreError> {
    db.execute(
        "UPDATE jobs SET status = ?2, n_attempts = ?3, next_attempt_at = NULL,
                last_error = coalesce(?4, last_error), updated_at = ?5
         WHERE id = ?1",
        args![job_id, status, n, last_error, now],
    )?;
    Ok(())
}

/// Marks the job done after `n` attempts (an operator's resolve, or a
/// confirmation by its check), its lease and error cleared, only while
/// it still has the status and attempt count `from` read under its lock.
/// Returns how many rows changed (0 or 1).
pub fn close_done(
    db: &Db<'_>,
    job_id: i64,
    n: i64,
    from: (JobStatus, i64),
    now: i64,
) -> Result<u64, StoreError> {
    db.execute(
        "UPDATE jobs SET status = 'done', n_attempts = ?2, next_attempt_at = NULL,
                lease_owner = NULL, lease_until = NULL, last_error = NULL, updated_at = ?3
         WHERE id = ?1 AND status = ?4 AND n_attempts = ?5",
        args![job_id, n, now, from.0, from.1],
    )
}

/// The event's other jobs that are not done, as (action, status), by id.
pub fn not_done_besides(
    db: &Db<'_>,
    source: &str,
    event_id: &str,
    action: &str,
) -> Result<Vec<(String, JobStatus)>, StoreError> {
    db.query(
        "SELECT action, status FROM jobs
         WHERE source = ?1 AND event_id = ?2 AND action <> ?3 AND status <> 'done' ORDER BY id",
        args![source, event_id, action],
    )?
    .iter()
    .map(|r| Ok((r.string(0)?, r.word(1)?)))
    .collect()
}

/// What `reconcile` lists: jobs that need the operator, or wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attention {
    /// Processing, and the lease ran out before `at`.
    Stuck,
    /// Pending, due before `at`.
    Overdue,
    Failed,
    /// Failed, with later jobs of its order key waiting behind it.
    Held,
    /// Pending without a due time: parked by `after` (not by `order`).
    Waiting,
}

impl Attention {
    /// The condition, and the order listed in.
    fn clause(self) -> (&'static str, &'static str) {
        match self {
            Attention::Stuck => (
                "status = 'processing' AND coalesce(lease_until, 0) < ?1",
                "lease_until",
            ),
            Attention::Overdue => (
                "status = 'pending' AND next_attempt_at < ?1",
                "next_attempt_at",
            ),
            Attention::Failed => ("status = 'failed'", "updated_at DESC"),
            Attention::Held => (
                "status = 'failed' AND order_key IS NOT NULL AND EXISTS (
                 SELECT 1 FROM jobs w WHERE w.source = jobs.source AND w.action = jobs.action
                    AND w.order_key = jobs.order_key AND w.order_key IS NOT NULL
                    AND w.status IN ('pending', 'processing', 'failed', 'paused')
                    AND w.status = 'pending' AND w.waiting = 'order')",
                "updated_at DESC",
            ),
            Attention::Waiting => (
                "status = 'pending' AND next_attempt_at IS NULL \
                 AND (waiting IS NULL OR waiting NOT IN ('order', 'circuit'))",
                "created_at",
            ),
        }
    }

    /// True when the condition compares a time (`at` of [`listed`]).
    pub fn has_time(self) -> bool {
        matches!(self, Attention::Stuck | Attention::Overdue)
    }
}

/// A job `reconcile` lists.
#[derive(Debug, Clone, PartialEq)]
pub struct Listed {
    pub source: String,
    pub event_id: String,
    pub action: String,
    pub kind: JobKind,
    pub status: JobStatus,
    pub n_attempts: i64,
    pub lease_owner: Option<String>,
    pub lease_until: Option<i64>,
    pub next_attempt_at: Option<i64>,
    pub last_error: Option<String>,
    pub updated_at: Option<i64>,
    pub order_key: Option<String>,
}

/// The first `limit` jobs of `what` (compared with `at` for the kinds
/// that compare a time), and how many there are.
pub fn listed(
    db: &Db<'_>,
    what: Attention,
    at: i64,
    limit: i64,
) -> Result<(Vec<Listed>, i64), StoreError> {
    let (clause, order) = what.clause();
    let args: Vec<Value> = if what.has_time() {
        vec![at.into()]
    } else {
        Vec::new()
    };
    let items = db
        .query(
            &format!(
                "SELECT source, event_id, action, kind, status, n_attempts, lease_owner, lease_until,
                        next_attempt_at, last_error, updated_at, order_key
                 FROM jobs WHERE {clause} ORDER BY {order} LIMIT {limit}"
            ),
            &args,
        )?
        .iter()
        .map(|r| {
            Ok(Listed {
                source: r.string(0)?,
                event_id: r.string(1)?,
                action: r.string(2)?,
                kind: r.word(3)?,
                status: r.word(4)?,
                n_attempts: r.i64(5)?,
                lease_owner: r.opt_string(6)?,
                lease_until: r.opt_i64(7)?,
                next_attempt_at: r.opt_i64(8)?,
                last_error: r.opt_string(9)?,
                updated_at: r.opt_i64(10)?,
                order_key: r.opt_string(11)?,
            })
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    let n = db
        .query_one(&format!("SELECT count(*) FROM jobs WHERE {clause}"), &args)?
        .i64(0)?;
    Ok((items, n))
}

/// Forward workers on every instance are woken on this channel
/// (PostgreSQL's LISTEN and NOTIFY).
pub const JOBS_CHANNEL: &str = "idemhook_jobs";

/// On PostgreSQL, wakes the forward workers of every instance when the
/// caller's transaction commits (`NOTIFY` is delivered then, or never).
/// Nothing on SQLite: the server's own wake-up is the caller's.
pub fn wake_workers(db: &Db<'_>) -> Result<(), StoreError> {
    if db.dialect() == Dialect::Postgres {
        db.execute(&format!("NOTIFY {JOBS_CHANNEL}"), &[])?;
    }
    Ok(())
}

/// The gauges' job counts: [`counts`], and when the oldest pending job
/// was created (the first entry of an index).
pub fn gauges(db: &Db<'_>) -> Result<JobCounts, StoreError> {
    let oldest_pending = db
        .query_one(
            "SELECT min(created_at) FROM jobs WHERE status = 'pending'",
            &[],
        )?
        .opt_i64(0)?;
    Ok(JobCounts {
        by_status: counts(db)?,
        oldest_pending,
        circuits: crate::store::circuits::all(db)?
            .into_iter()
            .map(|c| (c.source, c.action, c.opened_at.is_some(), c.opened_count))
            .collect(),
    })
}
