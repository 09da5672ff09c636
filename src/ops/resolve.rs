//! `idemhook resolve` and `POST /api/events/{source}/{event_id}/resolve`:
//! close a failed job by hand, once the operator has compensated for it
//! (made the effect happen some other way, or decided it must not).
//!
//! History is never rewritten: the close is a new attempt, numbered after
//! the last, with outcome `ok`, error kind `operator` and the operator's
//! note; the job becomes `done` and the event's state follows its jobs
//! (completed when all are done). Only a failed job is closed this way:
//! any other status is refused, so a resolve can never hide work that is
//! still under way. Like `replay`, it is planned first ([`plan`],
//! read-only) and applied only when asked ([`apply`], which checks the
//! job again in the write transaction).

use std::fmt::Write as _;
use std::io::Write as _;

use serde::Serialize;
use serde_json::{Value, json};

use super::command::{CommandError, Outcome};
use super::error::{OpError, not_found};
use super::open;
use super::replay::Origin;
use super::text::{clean, stdout};
use crate::config::Config;
use crate::state::{AttemptOutcome, EventState, JobKind, JobStatus};
use crate::store::attempts::{self, AttemptRow};
use crate::store::db::Db;
use crate::store::{StoreError, events, jobs};
use crate::time::now_ms;

/// The longest note kept, in bytes; longer ones are refused.
pub const MAX_NOTE: usize = 4096;

/// What a resolve would do, or why it cannot.
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    pub source: String,
    pub event_id: String,
    pub action: String,
    pub kind: JobKind,
    /// The job's status now.
    pub status: JobStatus,
    /// The event's state now.
    pub state_before: EventState,
    /// The number the closing attempt will have.
    pub attempt: i64,
    pub note: String,
    /// Set when the job cannot be resolved (it is not failed): the reason.
    pub refused: Option<String>,
    #[serde(skip)]
    job_id: i64,
}

/// What a resolve did.
#[derive(Debug, Clone, Serialize)]
pub struct Resolved {
    pub attempt: i64,
    /// The event's state afterwards.
    pub state: EventState,
}

/// Reads the event and its job and decides. A job that is not failed is a
/// plan with `refused` set; a missing event or job is `NotFound`; an empty
/// or overlong note is `Invalid`.
pub fn plan(
    conn: &Db<'_>,
    source: &str,
    event_id: &str,
    action: &str,
    note: &str,
) -> Result<Plan, OpError> {
    let note = note.trim();
    if note.is_empty() {
        return Err(OpError::Invalid(
            "--note is required: say what was done instead (it is kept with the attempt)"
                .to_string(),
        ));
    }
    if note.len() > MAX_NOTE {
        return Err(OpError::Invalid(format!(
            "the note is {} bytes; at most {MAX_NOTE} are kept",
            note.len()
        )));
    }
    let Some(state_before) = events::state(conn, source, event_id)? else {
        return Err(not_found(source, event_id));
    };
    let job = jobs::of_action(conn, source, event_id, action)?
        .map(|(j, max_n)| (j.id, j.kind, j.status, j.n_attempts, max_n));
    let Some((job_id, kind, status, n_attempts, max_n)) = job else {
        return Err(OpError::NotFound(format!(
            "event {}/{} has no job for action {}",
            clean(source),
            clean(event_id),
            clean(action)
        )));
    };
    let why = match status {
        JobStatus::Failed => None,
        JobStatus::Done => Some("it is already done"),
        JobStatus::Paused => Some("it is paused, waiting to run (resume its action instead)"),
        JobStatus::Pending => Some("it is queued to run"),
        JobStatus::Processing => Some("a worker is running it now"),
        JobStatus::Superseded => Some("only a failed job can be resolved"),
    };
    let refused = why.map(|why| {
        format!(
            "job {}/{} {} is {status}, not failed: resolve closes only a failed job ({why})",
            clean(source),
            clean(event_id),
            clean(action)
        )
    });
    Ok(Plan {
        source: source.to_string(),
        event_id: event_id.to_string(),
        action: action.to_string(),
        kind,
        status,
        state_before,
        attempt: n_attempts.max(max_n) + 1,
        note: note.to_string(),
        refused,
        job_id,
    })
}

/// Closes the planned job in the caller's write transaction: a new attempt
/// (outcome ok, error kind operator, the note), the job done, the event's
/// state recomputed. `Ok(Err(reason))` when the job is no longer failed.
///
/// On PostgreSQL the job's row is locked before its status is read again,
/// so of resolves (or a resolve and a replay) racing on any instances one
/// closes the job and the others find it done.
pub fn apply(
    conn: &Db<'_>,
    plan: &Plan,
    origin: Origin,
    now: i64,
) -> Result<Result<Resolved, String>, StoreError> {
    let Some((status, n_attempts)) = jobs::lock_status(conn, plan.job_id)? else {
        return Ok(Err("the job is gone (pruned)".to_string()));
    };
    let last_n = n_attempts.max(attempts::last_n(conn, plan.job_id)?);
    if status != JobStatus::Failed {
        return Ok(Err(format!(
            "the job is now {status}, not failed: left alone"
        )));
    }
    let n = last_n + 1;
    attempts::insert(
        conn,
        &AttemptRow {
            job_id: plan.job_id,
            n,
            started_at: now,
            finished_at: Some(now),
            outcome: Some(AttemptOutcome::Ok),
            error_kind: Some("operator".to_string()),
            worker: Some(format!("resolve:{}", origin.name())),
            note: Some(plan.note.clone()),
            ..AttemptRow::default()
        },
    )?;
    jobs::close_done(conn, plan.job_id, n, (status, n_attempts), now)?;
    let state = crate::with_tx!(conn, |tx| crate::receive::ingest::refresh_event_state_in(
        tx,
        &plan.source,
        &plan.event_id,
        now
    ))?;
    // A forward job waiting on this action (`after`) may be due now.
    jobs::wake_workers(conn)?;
    Ok(Ok(Resolved { attempt: n, state }))
}

/// The JSON answer of the admin API (and of nothing else: the CLI prints
/// text).
pub fn report(plan: &Plan, done: Option<&Resolved>) -> Value {
    let mut out = json!({
        "dry_run": done.is_none(),
        "source": plan.source,
        "event_id": plan.event_id,
        "action": plan.action,
        "kind": plan.kind,
        "from_status": plan.status,
        "state_before": plan.state_before,
        "attempt": plan.attempt,
        "note": plan.note,
    });
    match done {
        None => {
            out["would"] = json!(what(plan));
        }
        Some(done) => {
            out["resolved"] = json!(true);
            out["attempt"] = json!(done.attempt);
            out["state"] = json!(done.state);
        }
    }
    out
}

fn what(plan: &Plan) -> String {
    format!(
        "record attempt {} as ok (error kind operator, with the note) and mark the job done; \
         earlier attempts stay as they are",
        plan.attempt
    )
}

// ---------------------------------------------------------------------------
// The command line.

/// What `idemhook resolve` is asked to close.
#[derive(Debug, Clone)]
pub struct Request {
    pub source: String,
    pub event_id: String,
    pub action: String,
    pub note: String,
}

/// `idemhook resolve`: prints the plan, and without `yes` stops there.
/// A bad note and a job that is not failed are usage errors (exit 2); a
/// missing event or job is not found (exit 1).
pub fn cmd(config: &Config, request: &Request, yes: bool) -> Result<Outcome, CommandError> {
    let Request {
        source,
        event_id,
        action,
        note,
    } = request;
    let mut out = stdout();
    if !yes {
        let plan = open::look(config, |db| plan(db, source, event_id, action, note))?
            .map_err(CommandError::invalid_as_usage)?;
        if let Some(reason) = plan.refused {
            return Err(CommandError::Usage(reason));
        }
        write!(out, "{}", render_plan(&plan))?;
        writeln!(out, "nothing changed: run again with --yes to do this")?;
        return Ok(Outcome::Done);
    }
    let (plan, done) = open::write(config, |db| {
        let plan = plan(db, source, event_id, action, note)?;
        let done = match &plan.refused {
            Some(reason) => Err(reason.clone()),
            None => apply(db, &plan, Origin::Cli, now_ms())?,
        };
        Ok::<_, OpError>((plan, done))
    })?
    .map_err(CommandError::invalid_as_usage)?;
    if let Some(reason) = plan.refused {
        return Err(CommandError::Usage(reason));
    }
    write!(out, "{}", render_plan(&plan))?;
    // The job moved on since the plan: said after the plan.
    let done = done.map_err(CommandError::Usage)?;
    writeln!(
        out,
        "resolved: attempt {} recorded as ok (operator); the job is done",
        done.attempt
    )?;
    writeln!(out, "event state now: {}", done.state)?;
    Ok(Outcome::Done)
}

fn render_plan(plan: &Plan) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "event {}/{}: state {}",
        clean(&plan.source),
        clean(&plan.event_id),
        plan.state_before
    );
    let _ = writeln!(
        out,
        "  job {} ({}): {}, {} attempt(s)",
        clean(&plan.action),
        plan.kind,
        plan.status,
        plan.attempt - 1
    );
    let _ = writeln!(out, "resolve will: {}", what(plan));
    let _ = writeln!(out, "  note: {}", clean(&plan.note));
    out
}
