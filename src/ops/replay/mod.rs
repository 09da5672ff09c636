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

use serde::Serialize;
use serde_json::{Value, json};

use crate::config::{Config, parse_duration};
use crate::ops::error::OpError;
use crate::state::{EventState, JobKind, JobStatus, ReplayResult};
use crate::store::StoreError;
use crate::store::db::Db;
use crate::store::{events, jobs};

mod apply;
mod cmd;
mod plan;

pub use apply::apply;
pub use cmd::cmd;

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
        /// Failed or paused.
        status: JobStatus,
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
        let status = match status.as_deref() {
            None | Some("failed") => JobStatus::Failed,
            Some("paused") => JobStatus::Paused,
            Some(other) => {
                return Err(OpError::Invalid(format!(
                    "a batch replay takes --status failed or --status paused, not {other:?} \
                     (a done job is re-run only one event at a time, with --force)"
                )));
            }
        };
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
    pub kind: JobKind,
    pub from_status: JobStatus,
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
    pub kind: JobKind,
    pub status: JobStatus,
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
pub struct Replayed {
    pub source: String,
    pub event_id: String,
    pub action: String,
    pub kind: JobKind,
    pub from_status: JobStatus,
    pub attempt: i64,
    pub forced: bool,
    /// requeued (forward), ok or failed (sql, run now), skipped (the job
    /// moved on since the plan).
    pub result: ReplayResult,
    pub error: Option<String>,
    /// The job's status afterwards (None when skipped). A forced SQL run
    /// that failed leaves it `done`.
    pub status: Option<JobStatus>,
}

fn idempotency_key(source: &str, event_id: &str, action: &str) -> String {
    format!("{source}:{event_id}:{action}")
}

fn step(job: &jobs::Job, forced: bool) -> Step {
    let attempt = job.n_attempts + 1;
    let what = match job.kind {
        JobKind::Sql if forced => format!(
            "run the sql statement again now on the stored body, as attempt {attempt}: \
             its effect happens a second time (if the statement fails, the job stays done)"
        ),
        JobKind::Sql => {
            format!("run the sql statement again now on the stored body, as attempt {attempt}")
        }
        JobKind::Forward => format!(
            "re-queue for the forward workers as attempt {attempt}, with the same Idempotency-Key {}",
            idempotency_key(&job.source, &job.event_id, &job.action)
        ),
    };
    Step {
        job_id: job.id,
        source: job.source.clone(),
        event_id: job.event_id.clone(),
        action: job.action.clone(),
        kind: job.kind,
        from_status: job.status,
        attempt,
        forced,
        what,
    }
}

fn left(job: &jobs::Job, reason: String) -> LeftAlone {
    LeftAlone {
        source: job.source.clone(),
        event_id: job.event_id.clone(),
        action: job.action.clone(),
        kind: job.kind,
        status: job.status,
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
        } => plan::plan_event(conn, config, source, event_id, action.as_deref(), *force),
        Target::Batch {
            source,
            status,
            action,
            since_ms,
        } => plan::plan_batch(
            conn,
            config,
            source.as_deref(),
            *status,
            action.as_deref(),
            *since_ms,
        ),
    }
}

/// The current state of one event (after a replay).
pub fn event_state(
    conn: &Db<'_>,
    source: &str,
    event_id: &str,
) -> Result<Option<EventState>, StoreError> {
    events::state(conn, source, event_id)
}

/// The JSON answer: the plan, and what was done when it was applied.
pub fn report(plan: &Plan, done: Option<&[Replayed]>, state_after: Option<EventState>) -> Value {
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
            out["replayed"] = json!(
                done.iter()
                    .filter(|d| d.result != ReplayResult::Skipped)
                    .count()
            );
            out["jobs"] = json!(done);
            if let Some(state) = state_after {
                out["state"] = json!(state);
            }
        }
    }
    out
}

/// Whether any forward job was re-queued (the outbox should wake).
pub fn requeued_forward(done: &[Replayed]) -> bool {
    done.iter().any(|d| d.result == ReplayResult::Requeued)
}
