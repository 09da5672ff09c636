//! `idemhook replay` and the admin API's replay routes: re-open an event's
//! failed or paused jobs (or, with `--force`, done ones), one event or a
//! batch, always from the stored body and never re-checking signatures.
//!
//! A replay is planned first ([`plan`], read-only: what is there and what
//! would be done) and then applied ([`apply`], in the caller's write
//! transaction). Apply re-reads each job's status and skips one that moved
//! on since the plan, so a replay racing the server never runs a job twice.
//! History is never rewritten: every replay gets a row in `replays`, a
//! forward job is re-queued so the forward workers record the next attempt,
//! and an SQL job is run again at once, recorded as attempt n+1.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use serde::Serialize;
use serde_json::{Value, json};

use super::command::{CommandError, Outcome};
use super::error::{OpError, not_found};
use super::open::{open_db_read, open_db_write};
use super::text::{cell, clean, fmt_json_time, fmt_time};
use crate::args;
use crate::config::{ActionKind, Config, Source, parse_duration};
use crate::ingest::{self, Claim};
use crate::store::db::{self, Db, Row};
use crate::store::{StoreError, ms_to_secs, now_ms};

/// How many jobs one write transaction of a batch replay re-opens.
pub const APPLY_CHUNK: usize = 100;

/// Who asked for the replay, recorded in `replays.origin`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Cli,
    Api,
}

impl Origin {
    pub fn name(self) -> &'static str {
        match self {
            Origin::Cli => "cli",
            Origin::Api => "api",
        }
    }
}

/// What to replay.
#[derive(Debug, Clone)]
pub enum Target {
    Event {
        source: String,
        event_id: String,
        action: Option<String>,
        force: bool,
    },
    Batch {
        source: Option<String>,
        /// Job status: failed or paused.
        status: String,
        action: Option<String>,
        /// Only events received at or after this time (ms).
        since_ms: Option<i64>,
    },
}

impl Target {
    /// A batch target from its optional parts, checked.
    pub fn batch(
        source: Option<String>,
        status: Option<String>,
        action: Option<String>,
        since: Option<&str>,
        now: i64,
    ) -> Result<Target, OpError> {
        let status = status.unwrap_or_else(|| "failed".to_string());
        if status != "failed" && status != "paused" {
            return Err(OpError::Invalid(format!(
                "a batch replay takes --status failed or --status paused, not {status:?} \
                 (a done job is re-run only one event at a time, with --force)"
            )));
        }
        let since_ms = match since {
            Some(text) => {
                let d =
                    parse_duration(text).map_err(|e| OpError::Invalid(format!("since: {e}")))?;
                Some(now.saturating_sub(i64::try_from(d.as_millis()).unwrap_or(i64::MAX)))
            }
            None => None,
        };
        Ok(Target::Batch {
            source,
            status,
            action,
            since_ms,
        })
    }
}

/// One job the replay re-opens.
#[derive(Debug, Clone, Serialize)]
pub struct Step {
    #[serde(skip)]
    pub job_id: i64,
    pub source: String,
    pub event_id: String,
    pub action: String,
    pub kind: String,
    pub from_status: String,
    /// The number the replayed run will have.
    pub attempt: i64,
    pub forced: bool,
    /// What will be done, in words.
    pub what: String,
}

/// A job the replay leaves alone, and why.
#[derive(Debug, Clone, Serialize)]
pub struct LeftAlone {
    pub source: String,
    pub event_id: String,
    pub action: String,
    pub kind: String,
    pub status: String,
    pub reason: String,
}

/// What a replay would do.
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    /// One event's summary (source, event_id, type, state, received_at,
    /// payload_erased); None for a batch.
    pub event: Option<Value>,
    pub steps: Vec<Step>,
    pub left_alone: Vec<LeftAlone>,
    /// Advice for the operator (how to force, what a forced run means).
    pub notes: Vec<String>,
}

/// What happened to one planned job.
#[derive(Debug, Clone, Serialize)]
pub struct Done {
    pub source: String,
    pub event_id: String,
    pub action: String,
    pub kind: String,
    pub from_status: String,
    pub attempt: i64,
    pub forced: bool,
    /// requeued (forward), ok or failed (sql, run now), skipped (the job
    /// moved on since the plan).
    pub result: String,
    pub error: Option<String>,
    /// The job's status afterwards (None when skipped). A forced SQL run
    /// that failed leaves it `done`.
    pub status: Option<String>,
}

struct JobRow {
    id: i64,
    source: String,
    event_id: String,
    action: String,
    kind: String,
    status: String,
    n_attempts: i64,
    next_attempt_at: Option<i64>,
    lease_until: Option<i64>,
}

fn job_row(r: &Row) -> Result<JobRow, StoreError> {
    Ok(JobRow {
        id: r.i64(0)?,
        source: r.string(1)?,
        event_id: r.string(2)?,
        action: r.string(3)?,
        kind: r.string(4)?,
        status: r.string(5)?,
        n_attempts: r.i64(6)?,
        next_attempt_at: r.opt_i64(7)?,
        lease_until: r.opt_i64(8)?,
    })
}

const JOB_COLUMNS: &str = "j.id, j.source, j.event_id, j.action, j.kind, j.status, j.n_attempts, \
                           j.next_attempt_at, j.lease_until";

fn idempotency_key(source: &str, event_id: &str, action: &str) -> String {
    format!("{source}:{event_id}:{action}")
}

fn step(job: &JobRow, forced: bool) -> Step {
    let attempt = job.n_attempts + 1;
    let what = if job.kind == "sql" {
        if forced {
            format!(
                "run the sql statement again now on the stored body, as attempt {attempt}: \
                 its effect happens a second time (if the statement fails, the job stays done)"
            )
        } else {
            format!("run the sql statement again now on the stored body, as attempt {attempt}")
        }
    } else {
        format!(
            "re-queue for the forward workers as attempt {attempt}, with the same Idempotency-Key {}",
            idempotency_key(&job.source, &job.event_id, &job.action)
        )
    };
    Step {
        job_id: job.id,
        source: job.source.clone(),
        event_id: job.event_id.clone(),
        action: job.action.clone(),
        kind: job.kind.clone(),
        from_status: job.status.clone(),
        attempt,
        forced,
        what,
    }
}

fn left(job: &JobRow, reason: String) -> LeftAlone {
    LeftAlone {
        source: job.source.clone(),
        event_id: job.event_id.clone(),
        action: job.action.clone(),
        kind: job.kind.clone(),
        status: job.status.clone(),
        reason,
    }
}

/// Reads what is stored and decides what the replay would do. Writes
/// nothing, so it runs on a read-only connection, on either backend.
pub fn plan(conn: &Db<'_>, config: &Config, target: &Target) -> Result<Plan, OpError> {
    match target {
        Target::Event {
            source,
            event_id,
            action,
            force,
        } => plan_event(conn, config, source, event_id, action.as_deref(), *force),
        Target::Batch {
            source,
            status,
            action,
            since_ms,
        } => plan_batch(
            conn,
            config,
            source.as_deref(),
            status,
            action.as_deref(),
            *since_ms,
        ),
    }
}

/// The stored event a one-event replay starts from.
struct EventRow {
    event_type: Option<String>,
    state: String,
    received_at: i64,
    erased: bool,
}

fn plan_event(
    conn: &Db<'_>,
    config: &Config,
    source_name: &str,
    event_id: &str,
    action: Option<&str>,
    force: bool,
) -> Result<Plan, OpError> {
    let event = read_event(conn, source_name, event_id)?;
    let source = config.source(source_name);
    if let Some(a) = action {
        check_action_configured(source, source_name, a)?;
    }
    let jobs = event_jobs(conn, source_name, event_id)?;
    if let Some(a) = action
        && !jobs.iter().any(|j| j.action == a)
    {
        return Err(OpError::NotFound(format!(
            "event {}/{} has no job for action {} (the action does not take type {})",
            clean(source_name),
            clean(event_id),
            clean(a),
            clean(event.event_type.as_deref().unwrap_or("(none)"))
        )));
    }
    let paused = paused_actions(conn, source_name)?;

    let mut plan = Plan {
        event: Some(event_summary(source_name, event_id, &event, &jobs)),
        steps: Vec::new(),
        left_alone: Vec::new(),
        notes: Vec::new(),
    };
    let mut done_jobs = Vec::new();
    for job in jobs.iter().filter(|j| action.is_none_or(|a| j.action == a)) {
        let in_config = source.and_then(|s| s.action(&job.action)).is_some();
        match left_alone_because(job, force, in_config) {
            Some(reason) => {
                if job.status == "done" && !force {
                    done_jobs.push(job);
                }
                plan.left_alone.push(left(job, reason));
            }
            None => {
                if job.status == "paused" && paused.contains(&job.action) {
                    plan.notes.push(format!(
                        "action {} is paused: this job runs anyway; `idemhook resume {}/{}` releases the others",
                        clean(&job.action),
                        clean(source_name),
                        clean(&job.action)
                    ));
                }
                plan.steps.push(step(job, job.status == "done"));
            }
        }
    }
    if !plan.steps.is_empty() && event.erased {
        return Err(OpError::Invalid(format!(
            "the stored body of {}/{} was erased, and a replay runs only from the stored body",
            clean(source_name),
            clean(event_id)
        )));
    }
    if plan.steps.is_empty() {
        explain_nothing_to_do(&mut plan, &event, &jobs, &done_jobs, action.is_some());
        for job in done_jobs {
            plan.notes.push(how_to_force(source_name, event_id, job));
        }
    }
    Ok(plan)
}

fn read_event(conn: &Db<'_>, source: &str, event_id: &str) -> Result<EventRow, OpError> {
    let event = conn
        .query_opt(
            "SELECT type, state, received_at, payload IS NULL FROM events
             WHERE source = ?1 AND event_id = ?2",
            args![source, event_id],
        )?
        .map(|r| -> Result<_, StoreError> {
            Ok(EventRow {
                event_type: r.opt_string(0)?,
                state: r.string(1)?,
                received_at: r.i64(2)?,
                erased: r.bool(3)?,
            })
        })
        .transpose()?;
    event.ok_or_else(|| not_found(source, event_id))
}

/// The event's jobs, in the order they were written.
fn event_jobs(conn: &Db<'_>, source: &str, event_id: &str) -> Result<Vec<JobRow>, StoreError> {
    conn.query(
        &format!(
            "SELECT {JOB_COLUMNS} FROM jobs j WHERE j.source = ?1 AND j.event_id = ?2 ORDER BY j.id"
        ),
        args![source, event_id],
    )?
    .iter()
    .map(job_row)
    .collect()
}

/// The source's paused actions.
fn paused_actions(conn: &Db<'_>, source: &str) -> Result<Vec<String>, StoreError> {
    conn.query(
        "SELECT action FROM paused_actions WHERE source = ?1",
        args![source],
    )?
    .iter()
    .map(|r| r.string(0))
    .collect()
}

/// `--action` must name an action of the source in the config.
fn check_action_configured(
    source: Option<&Source>,
    source_name: &str,
    action: &str,
) -> Result<(), OpError> {
    match source {
        None => Err(OpError::Invalid(format!(
            "source {} is not in the config, so its actions cannot run",
            clean(source_name)
        ))),
        Some(s) if s.action(action).is_none() => Err(OpError::NotFound(format!(
            "source {} has no action {} in the config",
            clean(source_name),
            clean(action)
        ))),
        Some(_) => Ok(()),
    }
}

/// The plan's `event`: the event's summary and each job's status.
fn event_summary(source: &str, event_id: &str, event: &EventRow, jobs: &[JobRow]) -> Value {
    json!({
        "source": source,
        "event_id": event_id,
        "type": event.event_type,
        "state": event.state,
        "received_at": ms_to_secs(event.received_at),
        "payload_erased": event.erased,
        "jobs": jobs.iter().map(|j| json!({
            "action": j.action, "kind": j.kind, "status": j.status, "attempts": j.n_attempts,
        })).collect::<Vec<_>>(),
    })
}

/// Why a one-event replay leaves `job` alone, or None when it re-opens it:
/// failed and paused jobs are re-opened, done ones only with `force`, and
/// none whose action left the config.
fn left_alone_because(job: &JobRow, force: bool, in_config: bool) -> Option<String> {
    let reason = match job.status.as_str() {
        "failed" | "paused" => None,
        "done" if force => None,
        "done" => Some("already done (--force re-runs it)".to_string()),
        "pending" => Some(format!(
            "already queued{}",
            job.next_attempt_at
                .map(|at| format!(", due at {}", fmt_time(ms_to_secs(at))))
                .unwrap_or_default()
        )),
        "processing" => Some(format!(
            "in flight: a worker holds it{}",
            job.lease_until
                .map(|at| format!(" until {}", fmt_time(ms_to_secs(at))))
                .unwrap_or_default()
        )),
        other => Some(format!("status {other}")),
    };
    match reason {
        None if !in_config => {
            Some("the action is no longer in the config, so it cannot run".to_string())
        }
        other => other,
    }
}

/// The note of a plan with no step: why there is nothing to do.
fn explain_nothing_to_do(
    plan: &mut Plan,
    event: &EventRow,
    jobs: &[JobRow],
    done_jobs: &[&JobRow],
    one_action: bool,
) {
    let note = if jobs.is_empty() {
        format!(
            "nothing to do: no action takes this event (type {})",
            clean(event.event_type.as_deref().unwrap_or("(none)"))
        )
    } else if !done_jobs.is_empty() && plan.left_alone.len() == done_jobs.len() {
        format!(
            "nothing to do: {} done",
            if one_action {
                "the job is"
            } else {
                "every job is"
            }
        )
    } else {
        "nothing to do: no failed or paused job to re-open".to_string()
    };
    plan.notes.push(note);
}

/// How to re-run a done job anyway, and what that means for its kind.
fn how_to_force(source: &str, event_id: &str, job: &JobRow) -> String {
    let how = format!(
        "to run {} again anyway: idemhook replay {} {} --force --action {} --yes",
        clean(&job.action),
        clean(source),
        clean(event_id),
        clean(&job.action)
    );
    let consequence = if job.kind == "sql" {
        "it is an sql action: the statement runs again and its effect happens a second time"
            .to_string()
    } else {
        format!(
            "it is a forward action: it is sent again with the same Idempotency-Key {}, \
             so an idempotent downstream ignores the repeat",
            idempotency_key(source, event_id, &job.action)
        )
    };
    format!("{how}\n  ({consequence})")
}

fn plan_batch(
    conn: &Db<'_>,
    config: &Config,
    source: Option<&str>,
    status: &str,
    action: Option<&str>,
    since_ms: Option<i64>,
) -> Result<Plan, OpError> {
    if let Some(s) = source {
        let Some(src) = config.source(s) else {
            return Err(OpError::NotFound(format!(
                "source {} is not in the config",
                clean(s)
            )));
        };
        if let Some(a) = action
            && src.action(a).is_none()
        {
            return Err(OpError::NotFound(format!(
                "source {} has no action {} in the config",
                clean(s),
                clean(a)
            )));
        }
    }
    let mut sql = format!(
        "SELECT {JOB_COLUMNS}, e.payload IS NULL FROM jobs j
         JOIN events e ON e.source = j.source AND e.event_id = j.event_id
         WHERE j.status = ?1"
    );
    let mut args: Vec<db::Value> = vec![status.into()];
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
    let rows = conn
        .query(&sql, &args)?
        .iter()
        .map(|r| Ok((job_row(r)?, r.bool(9)?)))
        .collect::<Result<Vec<_>, StoreError>>()?;
    let mut plan = Plan {
        event: None,
        steps: Vec::new(),
        left_alone: Vec::new(),
        notes: Vec::new(),
    };
    for (job, erased) in rows {
        let in_config = config
            .source(&job.source)
            .and_then(|s| s.action(&job.action))
            .is_some();
        if !in_config {
            plan.left_alone.push(left(
                &job,
                "the action is no longer in the config, so it cannot run".to_string(),
            ));
        } else if erased {
            plan.left_alone.push(left(
                &job,
                "the stored body was erased; a replay runs only from the stored body".to_string(),
            ));
        } else {
            plan.steps.push(step(&job, false));
        }
    }
    Ok(plan)
}

/// Re-opens the planned jobs in the caller's write transaction. A job whose
/// status moved on since the plan is skipped. Afterwards each touched
/// event's state is recomputed.
///
/// On PostgreSQL each job's row is locked before its status is read
/// again (a worker's take holding it is waited for), and the re-open is
/// an UPDATE conditional on that status: of replays racing each other
/// (or a resolve) on any instances, one re-opens the job and the others
/// skip it, and a worker's fenced completion (owner + attempt) of an
/// earlier lease can no longer match a re-opened job.
pub fn apply(
    conn: &Db<'_>,
    config: &Config,
    steps: &[Step],
    origin: Origin,
    now: i64,
) -> Result<Vec<Done>, StoreError> {
    let mut out = Vec::with_capacity(steps.len());
    let mut events = BTreeSet::new();
    for s in steps {
        let done = apply_step(conn, config, s, origin, now)?;
        if done.result != "skipped" {
            events.insert((s.source.clone(), s.event_id.clone()));
        }
        out.push(done);
    }
    for (source, event_id) in events {
        crate::with_tx!(conn, |tx| ingest::refresh_event_state_in(
            tx, &source, &event_id, now
        ))?;
    }
    // Re-opened forward jobs (or jobs waiting on an SQL job done now):
    // every instance's workers are woken at the commit (they poll too).
    if requeued_forward(&out) || out.iter().any(|d| d.kind == "sql" && d.result == "ok") {
        notify_workers(conn)?;
    }
    Ok(out)
}

/// One planned job: locked and read again, skipped when it moved on,
/// else recorded in `replays` and re-queued (forward) or run now (SQL).
fn apply_step(
    conn: &Db<'_>,
    config: &Config,
    s: &Step,
    origin: Origin,
    now: i64,
) -> Result<Done, StoreError> {
    let mut done = Done {
        source: s.source.clone(),
        event_id: s.event_id.clone(),
        action: s.action.clone(),
        kind: s.kind.clone(),
        from_status: s.from_status.clone(),
        attempt: s.attempt,
        forced: s.forced,
        result: "skipped".to_string(),
        error: None,
        status: None,
    };
    let current = conn
        .query_opt(
            &format!(
                "SELECT status, n_attempts FROM jobs WHERE id = ?1{}",
                conn.dialect().for_update()
            ),
            args![s.job_id],
        )?
        .map(|r| -> Result<_, StoreError> { Ok((r.string(0)?, r.i64(1)?)) })
        .transpose()?;
    let Some((status, n_attempts)) = current else {
        done.error = Some("the job is gone (pruned)".to_string());
        return Ok(done);
    };
    if status != s.from_status {
        done.error = Some(format!("the job is now {status}; left alone"));
        return Ok(done);
    }
    conn.execute(
        "INSERT INTO replays (job_id, replayed_at, from_status, forced, origin)
         VALUES (?1, ?2, ?3, ?4, ?5)",
        args![s.job_id, now, &s.from_status, s.forced, origin.name()],
    )?;
    if s.kind == "sql" {
        rerun_sql(conn, config, s, n_attempts, origin, now, &mut done)?;
        return Ok(done);
    }
    let reopened = conn.execute(
        "UPDATE jobs SET status = 'pending', next_attempt_at = ?2, lease_owner = NULL,
                lease_until = NULL, updated_at = ?2
         WHERE id = ?1 AND status = ?3",
        args![s.job_id, now, &s.from_status],
    )?;
    if reopened != 1 {
        return Err(StoreError::other(format!(
            "job {} changed while it was locked for the replay",
            s.job_id
        )));
    }
    done.attempt = n_attempts + 1;
    done.result = "requeued".to_string();
    done.status = Some("pending".to_string());
    Ok(done)
}

/// On PostgreSQL, wakes the forward workers of every instance when the
/// caller's transaction commits (`NOTIFY` is delivered then, or never).
/// Nothing on SQLite: the server's own wake-up is the caller's.
pub fn notify_workers(conn: &Db<'_>) -> Result<(), StoreError> {
    if conn.dialect() == db::Dialect::Postgres {
        conn.execute(
            &format!("NOTIFY {}", crate::store::pg_serve::JOBS_CHANNEL),
            &[],
        )?;
    }
    Ok(())
}

/// Runs an SQL job's statement again on the stored event and records the
/// run as the job's next attempt.
fn rerun_sql(
    conn: &Db<'_>,
    config: &Config,
    s: &Step,
    n_attempts: i64,
    origin: Origin,
    now: i64,
    done: &mut Done,
) -> Result<(), StoreError> {
    let action = config
        .source(&s.source)
        .and_then(|src| src.action(&s.action).map(|a| (src, a)));
    let result = match action {
        Some((source, action)) if matches!(action.kind, ActionKind::Sql { .. }) => {
            match stored_claim(conn, &s.source, &s.event_id)? {
                Some(claim) => crate::with_tx!(conn, |tx| ingest::rerun_sql_action_in(
                    tx, source, action, &claim
                ))?,
                None => Err("the stored body was erased".to_string()),
            }
        }
        _ => Err("the action is no longer an sql action in the config".to_string()),
    };
    let max_n = conn
        .query_one(
            "SELECT coalesce(max(n), 0) FROM attempts WHERE job_id = ?1",
            args![s.job_id],
        )?
        .i64(0)?;
    let n = n_attempts.max(max_n) + 1;
    let finished = now_ms().max(now);
    // A forced re-run of a done job that fails leaves the job done: its
    // effect already happened once. The failed attempt
    // is recorded and reported all the same.
    let (status, outcome, error) = match &result {
        Ok(()) => ("done", "ok", None),
        Err(e) if s.from_status == "done" => ("done", "failed", Some(e.as_str())),
        Err(e) => ("failed", "failed", Some(e.as_str())),
    };
    conn.execute(
        "INSERT INTO attempts (job_id, n, started_at, finished_at, outcome, error, error_kind, worker)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        args![
            s.job_id,
            n,
            now,
            finished,
            outcome,
            error,
            error.map(|_| "sql"),
            format!("replay:{}", origin.name()),
        ],
    )?;
    let last_error = if status == "failed" {
        error.map(str::to_string)
    } else {
        None
    };
    conn.execute(
        "UPDATE jobs SET status = ?2, n_attempts = ?3, next_attempt_at = NULL,
                last_error = coalesce(?4, last_error), updated_at = ?5
         WHERE id = ?1",
        args![s.job_id, status, n, last_error, finished],
    )?;
    done.attempt = n;
    done.result = outcome.to_string();
    done.error = error.map(str::to_string);
    done.status = Some(status.to_string());
    Ok(())
}

/// The stored event as a claim, so an SQL action binds exactly what it
/// bound the first time. None when the body was erased.
fn stored_claim(conn: &Db<'_>, source: &str, event_id: &str) -> Result<Option<Claim>, StoreError> {
    let Some(r) = conn.query_opt(
        "SELECT type, payload, content_type, headers, payload_hash, verified_with, signed_at,
                received_at
         FROM events WHERE source = ?1 AND event_id = ?2",
        args![source, event_id],
    )?
    else {
        return Ok(None);
    };
    let Some(body) = r.opt_bytes(1)?.map(<[u8]>::to_vec) else {
        return Ok(None);
    };
    let (event_type, content_type, kept, hash, verified_with, signed_at, at) = (
        r.opt_string(0)?,
        r.opt_string(2)?,
        r.opt_string(3)?,
        r.string(4)?,
        r.opt_i64(5)?,
        r.opt_i64(6)?,
        r.i64(7)?,
    );
    let headers: Vec<(String, String)> = kept
        .as_deref()
        .and_then(|h| serde_json::from_str::<serde_json::Map<String, Value>>(h).ok())
        .map(|m| {
            m.into_iter()
                .filter_map(|(k, v)| v.as_str().map(|v| (k, v.to_string())))
                .collect()
        })
        .unwrap_or_default();
    Ok(Some(Claim {
        event_id: event_id.to_string(),
        event_type,
        json: serde_json::from_slice(&body).ok(),
        body,
        content_type,
        headers,
        kept_headers: kept.unwrap_or_default(),
        payload_hash: hash,
        verified_with: verified_with.and_then(|i| usize::try_from(i).ok()),
        signed_at,
        received_at: at,
        remote: "replay".to_string(),
    }))
}

/// The current state of one event (after a replay).
pub fn event_state(
    conn: &Db<'_>,
    source: &str,
    event_id: &str,
) -> Result<Option<String>, StoreError> {
    conn.query_opt(
        "SELECT state FROM events WHERE source = ?1 AND event_id = ?2",
        args![source, event_id],
    )?
    .map(|r| r.string(0))
    .transpose()
}

/// The JSON answer: the plan, and what was done when it was applied.
pub fn report(plan: &Plan, done: Option<&[Done]>, state_after: Option<String>) -> Value {
    let mut out = json!({
        "dry_run": done.is_none(),
        "count": plan.steps.len(),
        "left_alone": plan.left_alone,
        "notes": plan.notes,
    });
    if let Some(event) = &plan.event {
        out["source"] = event["source"].clone();
        out["event_id"] = event["event_id"].clone();
        out["state_before"] = event["state"].clone();
    }
    match done {
        None => {
            out["would"] = json!(plan.steps);
        }
        Some(done) => {
            out["replayed"] = json!(done.iter().filter(|d| d.result != "skipped").count());
            out["jobs"] = json!(done);
            if let Some(state) = state_after {
                out["state"] = json!(state);
            }
        }
    }
    out
}

/// Whether any forward job was re-queued (the outbox should wake).
pub fn requeued_forward(done: &[Done]) -> bool {
    done.iter().any(|d| d.result == "requeued")
}

// ---------------------------------------------------------------------------
// The command line.

/// `idemhook replay`: prints the plan, and without `yes` stops there;
/// with it, applies the plan and prints what was done.
pub fn cmd(config: &Config, target: &Target, yes: bool) -> Result<Outcome, CommandError> {
    if !yes {
        let mut handle = open_db_read(config)?;
        let plan = plan(&handle.db(), config, target)?;
        print!("{}", render_plan(&plan));
        if !plan.steps.is_empty() {
            println!("nothing changed: run again with --yes to do this");
        }
        return Ok(Outcome::Done);
    }
    let mut handle = open_db_write(config)?;
    let outcome = match target {
        Target::Event { .. } => replay_event_cli(&mut handle, config, target)?,
        Target::Batch { .. } => replay_batch_cli(&mut handle, config, target)?,
    };
    Ok(outcome)
}

/// One event: planned and applied in one write transaction.
fn replay_event_cli(
    handle: &mut db::Handle,
    config: &Config,
    target: &Target,
) -> Result<Outcome, OpError> {
    let (plan, applied) = handle.write(|db| {
        let plan = plan(db, config, target)?;
        if plan.steps.is_empty() {
            return Ok((plan, None));
        }
        let done = apply(db, config, &plan.steps, Origin::Cli, now_ms())?;
        let state = match &plan.event {
            Some(e) => event_state(
                db,
                e["source"].as_str().unwrap_or_default(),
                e["event_id"].as_str().unwrap_or_default(),
            )?,
            None => None,
        };
        Ok::<_, OpError>((plan, Some((done, state))))
    })?;
    print!("{}", render_plan(&plan));
    let Some((done, state)) = applied else {
        return Ok(Outcome::Done);
    };
    print!("{}", render_done(&done));
    if let Some(state) = state {
        println!("event state now: {state}");
    }
    Ok(exit_for(&done))
}

/// A batch: planned once, applied [`APPLY_CHUNK`] jobs per write
/// transaction (each job checked again there).
fn replay_batch_cli(
    handle: &mut db::Handle,
    config: &Config,
    target: &Target,
) -> Result<Outcome, OpError> {
    let plan = plan(&handle.db(), config, target)?;
    print!("{}", render_plan(&plan));
    let mut all = Vec::with_capacity(plan.steps.len());
    for chunk in plan.steps.chunks(APPLY_CHUNK) {
        let done = handle.write(|db| apply(db, config, chunk, Origin::Cli, now_ms()))?;
        all.extend(done);
    }
    print!("{}", render_done(&all));
    Ok(exit_for(&all))
}

/// Attention (exit 1) when an SQL job was run again and failed again.
fn exit_for(done: &[Done]) -> Outcome {
    if done.iter().any(|d| d.result == "failed") {
        Outcome::Attention
    } else {
        Outcome::Done
    }
}

fn render_plan(plan: &Plan) -> String {
    let mut out = String::new();
    match &plan.event {
        Some(e) => {
            let _ = writeln!(
                out,
                "event {}/{}: state {}, type {}, received {}{}",
                cell(&e["source"]),
                cell(&e["event_id"]),
                cell(&e["state"]),
                cell(&e["type"]),
                fmt_json_time(&e["received_at"]),
                if e["payload_erased"].as_bool() == Some(true) {
                    ", body erased"
                } else {
                    ""
                }
            );
            for j in e["jobs"].as_array().map(Vec::as_slice).unwrap_or_default() {
                let _ = writeln!(
                    out,
                    "  job {} ({}): {}, {} attempt(s)",
                    cell(&j["action"]),
                    cell(&j["kind"]),
                    cell(&j["status"]),
                    cell(&j["attempts"]),
                );
            }
        }
        None => {
            let _ = writeln!(out, "{} jobs to replay", plan.steps.len());
        }
    }
    if !plan.steps.is_empty() {
        let _ = writeln!(out, "replay will:");
        for s in &plan.steps {
            let _ = writeln!(
                out,
                "  {}/{} {} ({}, {}): {}",
                clean(&s.source),
                clean(&s.event_id),
                clean(&s.action),
                s.kind,
                s.from_status,
                s.what
            );
        }
    }
    for l in &plan.left_alone {
        if plan.event.is_some() && l.status == "done" && plan.steps.is_empty() {
            continue; // the notes explain done jobs
        }
        let _ = writeln!(
            out,
            "  left alone: {}/{} {} ({}): {}",
            clean(&l.source),
            clean(&l.event_id),
            clean(&l.action),
            l.status,
            l.reason
        );
    }
    for n in &plan.notes {
        let _ = writeln!(out, "{n}");
    }
    out
}

fn render_done(done: &[Done]) -> String {
    let mut out = String::new();
    let replayed = done.iter().filter(|d| d.result != "skipped").count();
    let _ = writeln!(out, "replayed {replayed} of {} job(s)", done.len());
    for d in done {
        let what = match d.result.as_str() {
            "requeued" => format!(
                "re-queued as attempt {}; the forward workers pick it up when they next poll",
                d.attempt
            ),
            "ok" => format!("ran again as attempt {}: ok", d.attempt),
            "failed" if d.status.as_deref() == Some("done") => format!(
                "ran again as attempt {}: failed: {}; the job stays done (its effect happened once already; the failed attempt is recorded)",
                d.attempt,
                clean(d.error.as_deref().unwrap_or(""))
            ),
            "failed" => format!(
                "ran again as attempt {}: failed: {}",
                d.attempt,
                clean(d.error.as_deref().unwrap_or(""))
            ),
            _ => format!("skipped: {}", clean(d.error.as_deref().unwrap_or(""))),
        };
        let _ = writeln!(
            out,
            "  {}/{} {}: {what}",
            clean(&d.source),
            clean(&d.event_id),
            clean(&d.action)
        );
    }
    out
}
