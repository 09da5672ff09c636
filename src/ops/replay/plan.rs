//! Planning a replay, read-only: one event (what each of its jobs would
//! get, and why the others are left alone) or a batch of jobs by status.

use serde_json::{Value, json};

use super::{Plan, idempotency_key, left, step};
use crate::config::{Config, Source};
use crate::ops::error::{OpError, not_found};
use crate::ops::text::{clean, fmt_time};
use crate::state::{JobKind, JobStatus};
use crate::store::StoreError;
use crate::store::db::Db;
use crate::store::{events, jobs};
use crate::time::ms_to_secs;

/// The stored event a one-event replay starts from.
type EventRow = events::Planned;

pub(super) fn plan_event(
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
                if job.status == JobStatus::Done && !force {
                    done_jobs.push(job);
                }
                plan.left_alone.push(left(job, reason));
            }
            None => {
                if job.status == JobStatus::Paused && paused.contains(&job.action) {
                    plan.notes.push(format!(
                        "action {} is paused: this job waits for the resume with the others (`idemhook resume {}/{}`)",
                        clean(&job.action),
                        clean(source_name),
                        clean(&job.action)
                    ));
                }
                plan.steps.push(step(job, job.status == JobStatus::Done));
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
    events::planned(conn, source, event_id)?.ok_or_else(|| not_found(source, event_id))
}

/// The event's jobs, in the order they were written.
fn event_jobs(conn: &Db<'_>, source: &str, event_id: &str) -> Result<Vec<jobs::Job>, StoreError> {
    jobs::all_of_event(conn, source, event_id)
}

/// The source's paused actions.
fn paused_actions(conn: &Db<'_>, source: &str) -> Result<Vec<String>, StoreError> {
    crate::store::paused::of_source(conn, source)
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
fn event_summary(source: &str, event_id: &str, event: &EventRow, jobs: &[jobs::Job]) -> Value {
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
/// failed, paused and superseded jobs are re-opened, done ones only with
/// `force`, and
/// none whose action left the config.
fn left_alone_because(job: &jobs::Job, force: bool, in_config: bool) -> Option<String> {
    let reason = match job.status {
        // A superseded job was never sent: a replay sends it.
        JobStatus::Failed | JobStatus::Paused | JobStatus::Superseded => None,
        JobStatus::Done if force => None,
        JobStatus::Done => Some("already done (--force re-runs it)".to_string()),
        JobStatus::Pending => Some(format!(
            "already queued{}",
            job.next_attempt_at
                .map(|at| format!(", due at {}", fmt_time(ms_to_secs(at))))
                .unwrap_or_default()
        )),
        JobStatus::Processing => Some(format!(
            "in flight: a worker holds it{}",
            job.lease_until
                .map(|at| format!(" until {}", fmt_time(ms_to_secs(at))))
                .unwrap_or_default()
        )),
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
    jobs: &[jobs::Job],
    done_jobs: &[&jobs::Job],
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
fn how_to_force(source: &str, event_id: &str, job: &jobs::Job) -> String {
    let how = format!(
        "to run {} again anyway: idemhook replay {} {} --force --action {} --yes",
        clean(&job.action),
        clean(source),
        clean(event_id),
        clean(&job.action)
    );
    let consequence = match job.kind {
        JobKind::Sql => {
            "it is an sql action: the statement runs again and its effect happens a second time"
                .to_string()
        }
        JobKind::Forward => format!(
            "it is a forward action: it is sent again with the same Idempotency-Key {}, \
             so an idempotent downstream ignores the repeat",
            idempotency_key(source, event_id, &job.action)
        ),
    };
    format!("{how}\n  ({consequence})")
}

pub(super) fn plan_batch(
    conn: &Db<'_>,
    config: &Config,
    source: Option<&str>,
    status: JobStatus,
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
    let rows = jobs::with_status(conn, status, source, action, since_ms)?;
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
