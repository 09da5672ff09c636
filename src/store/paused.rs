//! The `paused_actions` table and the job moves a pause and a resume make,
//! on both backends: an action recorded as paused (its pending jobs turned
//! to `paused`), forgotten on resume (its paused jobs due now), and the
//! lookups the replay, reconcile and the inspector make. `ops::pause`
//! decides which actions may pause.

use crate::args;
use crate::state::JobStatus;
use crate::store::StoreError;
use crate::store::db::{Db, Dialect};

/// Whether an operator paused an action (?1 source, ?2 action): the
/// claim's lookup, on both backends.
pub const IS_PAUSED: &str = "SELECT 1 FROM paused_actions WHERE source = ?1 AND action = ?2";

/// On PostgreSQL, waits until every claim that has read whether an action
/// is paused has committed, and holds new ones back until the caller's
/// transaction ends. A claim decides a forward job's status from
/// `paused_actions` (pending or paused) before it inserts the job; without
/// this, a claim that read it just before a pause (or a resume) commits
/// its job after the UPDATE of [`pause`] has looked, and the job is left
/// pending under a paused action (or paused under a resumed one). The
/// claims hold their read lock on the table until they commit, so the
/// exclusive lock is granted only after they have. SQLite's one writer
/// already orders them.
pub fn hold_back_claims(db: &Db<'_>) -> Result<(), StoreError> {
    if db.dialect() == Dialect::Postgres {
        db.execute("LOCK TABLE paused_actions IN ACCESS EXCLUSIVE MODE", &[])?;
    }
    Ok(())
}

/// Records the action as paused at `now` and turns its pending jobs to
/// paused (one a worker holds, processing, finishes its attempt).
/// Returns (whether it was paused already, how many jobs now wait).
pub fn pause(db: &Db<'_>, source: &str, action: &str, now: i64) -> Result<(bool, u64), StoreError> {
    let inserted = db.execute(
        "INSERT INTO paused_actions (source, action, paused_at) VALUES (?1, ?2, ?3)
         ON CONFLICT DO NOTHING",
        args![source, action, now],
    )?;
    let jobs = db.execute(
        "UPDATE jobs SET status = ?4, updated_at = ?3
         WHERE source = ?1 AND action = ?2 AND status = ?5",
        args![source, action, now, JobStatus::Paused, JobStatus::Pending],
    )?;
    Ok((inserted == 0, jobs))
}

/// Forgets the action's pause and makes its paused jobs due at `now`.
/// Returns how many jobs were made due.
pub fn resume(db: &Db<'_>, source: &str, action: &str, now: i64) -> Result<u64, StoreError> {
    db.execute(
        "DELETE FROM paused_actions WHERE source = ?1 AND action = ?2",
        args![source, action],
    )?;
    db.execute(
        "UPDATE jobs SET status = ?4, next_attempt_at = ?3, waiting = NULL, updated_at = ?3
         WHERE source = ?1 AND action = ?2 AND status = ?5",
        args![source, action, now, JobStatus::Pending, JobStatus::Paused],
    )
}

/// True when the action is paused.
pub fn is_paused(db: &Db<'_>, source: &str, action: &str) -> Result<bool, StoreError> {
    db.query_one(
        "SELECT EXISTS (SELECT 1 FROM paused_actions WHERE source = ?1 AND action = ?2)",
        args![source, action],
    )?
    .bool(0)
}

/// The source's paused actions.
pub fn of_source(db: &Db<'_>, source: &str) -> Result<Vec<String>, StoreError> {
    db.query(
        "SELECT action FROM paused_actions WHERE source = ?1",
        args![source],
    )?
    .iter()
    .map(|r| r.string(0))
    .collect()
}

/// A paused action.
#[derive(Debug, Clone, PartialEq)]
pub struct Paused {
    pub source: String,
    pub action: String,
    pub paused_at: i64,
    /// How many of its jobs wait (only [`holding`] counts them).
    pub waiting: i64,
}

/// Every paused action (`waiting` left at 0).
pub fn all(db: &Db<'_>) -> Result<Vec<Paused>, StoreError> {
    db.query("SELECT source, action, paused_at FROM paused_actions", &[])?
        .iter()
        .map(|r| {
            Ok(Paused {
                source: r.string(0)?,
                action: r.string(1)?,
                paused_at: r.i64(2)?,
                waiting: 0,
            })
        })
        .collect()
}

/// The paused actions that hold jobs, with how many each holds, the
/// oldest pause first.
pub fn holding(db: &Db<'_>) -> Result<Vec<Paused>, StoreError> {
    db.query(
        "SELECT p.source, p.action, p.paused_at, count(j.id) FROM paused_actions p
         JOIN jobs j ON j.source = p.source AND j.action = p.action AND j.status = 'paused'
         GROUP BY p.source, p.action, p.paused_at ORDER BY p.paused_at",
        &[],
    )?
    .iter()
    .map(|r| {
        Ok(Paused {
            source: r.string(0)?,
            action: r.string(1)?,
            paused_at: r.i64(2)?,
            waiting: r.i64(3)?,
        })
    })
    .collect()
}
