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
use std::process::ExitCode;

use anyhow::Result;
use rusqlite::{Connection, OptionalExtension, params};
use serde::Serialize;
use serde_json::{Value, json};

use super::inspect::{OpError, clean, finish, open_read, open_write};
use super::replay::Origin;
use crate::config::Config;
use crate::store::{StoreError, now_ms};

/// The longest note kept, in bytes; longer ones are refused.
pub const MAX_NOTE: usize = 4096;

#[derive(clap::Args, Debug)]
pub struct ResolveArgs {
    /// The event's source.
    pub source: String,
    /// The event id.
    pub event_id: String,
    /// The action whose failed job to close.
    #[arg(long)]
    pub action: String,
    /// What was done instead (the compensation), kept with the attempt.
    #[arg(long)]
    pub note: String,
    /// Do it; without this only print what would be done.
    #[arg(long)]
    pub yes: bool,
}

/// What a resolve would do, or why it cannot.
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    pub source: String,
    pub event_id: String,
    pub action: String,
    pub kind: String,
    /// The job's status now.
    pub status: String,
    /// The event's state now.
    pub state_before: String,
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
pub struct Done {
    pub attempt: i64,
    /// The event's state afterwards.
    pub state: String,
}

/// Reads the event and its job and decides. A job that is not failed is a
/// plan with `refused` set; a missing event or job is `NotFound`; an empty
/// or overlong note is `Invalid`.
pub fn plan(
    conn: &Connection,
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
    let state: Option<String> = conn
        .prepare_cached("SELECT state FROM events WHERE source = ?1 AND event_id = ?2")?
        .query_row(params![source, event_id], |r| r.get(0))
        .optional()?;
    let Some(state_before) = state else {
        return Err(super::inspect::not_found(source, event_id));
    };
    let job: Option<(i64, String, String, i64, i64)> = conn
        .prepare_cached(
            "SELECT j.id, j.kind, j.status, j.n_attempts,
                    (SELECT coalesce(max(n), 0) FROM attempts a WHERE a.job_id = j.id)
             FROM jobs j WHERE j.source = ?1 AND j.event_id = ?2 AND j.action = ?3",
        )?
        .query_row(params![source, event_id, action], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
        })
        .optional()?;
    let Some((job_id, kind, status, n_attempts, max_n)) = job else {
        return Err(OpError::NotFound(format!(
            "event {}/{} has no job for action {}",
            clean(source),
            clean(event_id),
            clean(action)
        )));
    };
    let refused = (status != "failed").then(|| {
        let why = match status.as_str() {
            "done" => "it is already done",
            "paused" => "it is paused, waiting to run (resume its action instead)",
            "pending" => "it is queued to run",
            "processing" => "a worker is running it now",
            _ => "only a failed job can be resolved",
        };
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
pub fn apply(
    conn: &Connection,
    plan: &Plan,
    origin: Origin,
    now: i64,
) -> Result<Result<Done, String>, StoreError> {
    let current: Option<(String, i64)> = conn
        .prepare_cached(
            "SELECT j.status, max(j.n_attempts,
                    (SELECT coalesce(max(n), 0) FROM attempts a WHERE a.job_id = j.id))
             FROM jobs j WHERE j.id = ?1",
        )?
        .query_row([plan.job_id], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    let Some((status, last_n)) = current else {
        return Ok(Err("the job is gone (pruned)".to_string()));
    };
    if status != "failed" {
        return Ok(Err(format!(
            "the job is now {status}, not failed: left alone"
        )));
    }
    let n = last_n + 1;
    conn.prepare_cached(
        "INSERT INTO attempts (job_id, n, started_at, finished_at, outcome, error_kind, worker, note)
         VALUES (?1, ?2, ?3, ?3, 'ok', 'operator', ?4, ?5)",
    )?
    .execute(params![
        plan.job_id,
        n,
        now,
        format!("resolve:{}", origin.name()),
        plan.note
    ])?;
    conn.prepare_cached(
        "UPDATE jobs SET status = 'done', n_attempts = ?2, next_attempt_at = NULL,
                lease_owner = NULL, lease_until = NULL, last_error = NULL, updated_at = ?3
         WHERE id = ?1",
    )?
    .execute(params![plan.job_id, n, now])?;
    let state = crate::ingest::refresh_event_state(conn, &plan.source, &plan.event_id, now)?;
    Ok(Ok(Done { attempt: n, state }))
}

/// The JSON answer of the admin API (and of nothing else: the CLI prints
/// text).
pub fn report(plan: &Plan, done: Option<&Done>) -> Value {
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

pub fn cmd(config: &Config, args: &ResolveArgs) -> Result<ExitCode> {
    if !args.yes {
        let conn = open_read(config)?;
        let plan = match plan(
            &conn,
            &args.source,
            &args.event_id,
            &args.action,
            &args.note,
        ) {
            Ok(p) => p,
            Err(e) => return finish_usage(e),
        };
        if let Some(reason) = &plan.refused {
            eprintln!("idemhook: {reason}");
            return Ok(ExitCode::from(2));
        }
        print!("{}", render_plan(&plan));
        println!("nothing changed: run again with --yes to do this");
        return Ok(ExitCode::SUCCESS);
    }
    let mut conn = open_write(config)?;
    let tx = conn
        .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .map_err(StoreError::from)?;
    let plan = match plan(&tx, &args.source, &args.event_id, &args.action, &args.note) {
        Ok(p) => p,
        Err(e) => return finish_usage(e),
    };
    if let Some(reason) = &plan.refused {
        eprintln!("idemhook: {reason}");
        return Ok(ExitCode::from(2));
    }
    print!("{}", render_plan(&plan));
    let done = match apply(&tx, &plan, Origin::Cli, now_ms())? {
        Ok(done) => done,
        Err(reason) => {
            eprintln!("idemhook: {reason}");
            return Ok(ExitCode::from(2));
        }
    };
    tx.commit().map_err(StoreError::from)?;
    println!(
        "resolved: attempt {} recorded as ok (operator); the job is done",
        done.attempt
    );
    println!("event state now: {}", done.state);
    Ok(ExitCode::SUCCESS)
}

/// A bad note is a usage error (exit 2); a missing event or job is
/// reported like the other commands do (exit 1).
fn finish_usage(e: OpError) -> Result<ExitCode> {
    match e {
        OpError::Invalid(m) => {
            eprintln!("idemhook: {m}");
            Ok(ExitCode::from(2))
        }
        other => finish(Err(other)),
    }
}

fn render_plan(plan: &Plan) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "event {}/{}: state {}",
        clean(&plan.source),
        clean(&plan.event_id),
        clean(&plan.state_before)
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
