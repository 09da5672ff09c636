//! The outbox's transaction steps, generic over `store::OutboxTx` so each
//! backend runs the same decisions: take (lease, park for `after`, take
//! over a lapsed lease), complete fenced by owner and attempt, give back,
//! record a check.

use std::time::Duration;

use anyhow::Result;

use super::control::{self, Slot};
use super::{Attempt, Leased};
use crate::check::Asked;
use crate::config::{ActionKind, Config, Forward};
use crate::ingest::refresh_event_state_in;
use crate::state::{AttemptOutcome, JobStatus};
use crate::store::StoreError;
use crate::store::tx::TAKE_BATCH;
use crate::store::tx::{Candidate, CheckRow, ForwardEvent, NewAttempt, OutboxTx};

/// Records one check (whatever it answered) in `checks`, for attempt `n`,
/// in the open transaction `tx` of any backend.
pub(crate) fn record_check_in<T: OutboxTx>(
    tx: &mut T,
    job_id: i64,
    n: i64,
    worker: &str,
    asked: &Asked,
) -> Result<(), StoreError> {
    tx.insert_check(&CheckRow {
        job_id,
        n,
        asked_at: asked.started_at,
        finished_at: asked.finished_at,
        answer: asked.answer.as_str(),
        http_status: asked.http_status.map(i64::from),
        error: asked.error.as_deref(),
        worker,
    })
}

/// How long after a lease ends another worker may take the job over
/// (the row's `lease_until` includes it). An attempt can end a little
/// after its timeout: the HTTP client's deadline is not exact, and the
/// result waits for a commit. With a lease only just longer than the
/// timeout, a takeover at the lease's end could send the job while the
/// first worker is still finishing it (seen from outside: a 5 s timeout
/// with a 5.01 s lease, the first attempt ending at 5.05-5.23 s, the
/// second sent at 5.01 s). A tenth of the lease, at least 2 s.
fn takeover_grace(lease: Duration) -> Duration {
    (lease / 10).max(Duration::from_secs(2))
}

/// Takes up to `TAKE_BATCH` due jobs for `owner`: expired leases first, then
/// pending jobs in due order. Returns them with the earliest time another
/// job falls due, for the worker's sleep.
/// Leases at most `batch` jobs (at most [`TAKE_BATCH`]).
pub(super) fn take<T: OutboxTx>(
    tx: &mut T,
    config: &Config,
    owner: &str,
    local_now: i64,
    batch: usize,
) -> Result<(Vec<Leased>, Option<i64>), StoreError> {
    // Decided by the storage's clock; what goes back to the worker (when
    // its lease ends, when to look again) by its own.
    let now = tx.clock(local_now)?;
    let skew = now - local_now;
    let mut candidates: Vec<Candidate> = tx.expired_jobs(now)?;
    candidates.extend(tx.due_jobs(now)?);
    let mut taken = Vec::new();
    for candidate in candidates {
        if taken.len() >= batch.min(TAKE_BATCH) {
            break;
        }
        if let Some(job) = take_one(tx, config, owner, now, candidate)? {
            taken.push(job);
        }
    }
    for job in &mut taken {
        job.lease_ends -= skew;
    }
    let next_due = tx.next_due()?.map(|at| at - skew);
    Ok((taken, next_due))
}

/// Leases one candidate, unless its action is gone, it waits for an
/// `after`, another worker leased it first, it has used up its attempts,
/// or its body is gone (the last two fail it).
fn take_one<T: OutboxTx>(
    tx: &mut T,
    config: &Config,
    owner: &str,
    now: i64,
    candidate: Candidate,
) -> Result<Option<Leased>, StoreError> {
    let Some(fwd) = forward_action(config, &candidate.source, &candidate.action) else {
        // An action no longer in the config: left for the operator
        // (reconcile lists it as overdue).
        return Ok(None);
    };
    if held_back(tx, fwd, &candidate, now)? {
        return Ok(None);
    }
    let Some(lease_ends) = lease_job(tx, fwd, &candidate, owner, now)? else {
        return Ok(None);
    };
    let Some(budget_base) = budget_after_takeover(tx, fwd, &candidate, now)? else {
        return Ok(None);
    };
    let Candidate {
        job_id,
        source,
        event_id,
        action,
        n_before,
        ..
    } = candidate;
    let Some(ForwardEvent {
        event_type,
        body: Some(body),
        content_type,
    }) = tx.forward_event(&source, &event_id)?
    else {
        fail_and_refresh(
            tx,
            job_id,
            &source,
            &event_id,
            now,
            "the stored body was erased or pruned; nothing to forward",
        )?;
        return Ok(None);
    };
    if control::supersede_if_older(tx, fwd, job_id, n_before, &body, now)? {
        refresh_event_state_in(tx, &source, &event_id, now)?;
        return Ok(None);
    }
    // Asked only when an earlier attempt since the last success may
    // have reached the downstream: any but a refused connection.
    let needs_check = n_before > 0 && fwd.check.is_some() && tx.may_have_reached(job_id)?;
    // accepted -> processing; a cheap conditional update, not a
    // recount of the event's jobs.
    tx.mark_processing(&source, &event_id)?;
    Ok(Some(Leased {
        job_id,
        source,
        event_id,
        action,
        n: n_before + 1,
        lease_ends,
        budget_base,
        event_type,
        body,
        content_type,
        needs_check,
    }))
}

/// Whether a candidate is not to be taken now: parked for its `after`,
/// or waiting for its turn in order or for a delivery slot.
fn held_back<T: OutboxTx>(
    tx: &mut T,
    fwd: &Forward,
    candidate: &Candidate,
    now: i64,
) -> Result<bool, StoreError> {
    let (job_id, n_before, pending) = (candidate.job_id, candidate.n_before, candidate.pending);
    let (source, action) = (&candidate.source, &candidate.action);
    // A job with `after` is not due while a named job of its event is
    // not done: it is parked (no due time) until a trigger releases it
    // (schema.sql, jobs_release_waiting). A job taken over after its
    // lease was let through once already.
    if pending && !fwd.after.is_empty() {
        let waiting = waiting_for(tx, source, &candidate.event_id, &fwd.after)?;
        if !waiting.is_empty() {
            park(tx, job_id, n_before, &waiting, now)?;
            return Ok(true);
        }
    }
    // Delivery control: an earlier job of its order key first, then a
    // slot of the action's concurrency and rate. Waiting is no attempt.
    if pending && fwd.control.order.is_some() && control::behind_in_order(tx, job_id)? {
        control::wait(tx, job_id, n_before, "order", None, now)?;
        return Ok(true);
    }
    if fwd.control.limited() {
        match control::take_slot(tx, source, action, &fwd.control, now)? {
            Slot::Go => {}
            Slot::Wait { reason, until } => {
                if pending {
                    control::wait(tx, job_id, n_before, reason, Some(until), now)?;
                }
                return Ok(true);
            }
        }
    }
    Ok(false)
}

/// Leases the job to `owner` from `now`: when the lease ends for the
/// worker, or None when another worker leased it first.
fn lease_job<T: OutboxTx>(
    tx: &mut T,
    fwd: &Forward,
    candidate: &Candidate,
    owner: &str,
    now: i64,
) -> Result<Option<i64>, StoreError> {
    let lease_ends = now + i64::try_from(fwd.lease.as_millis()).unwrap_or(i64::MAX / 2);
    let lease_until = lease_ends
        .saturating_add(i64::try_from(takeover_grace(fwd.lease).as_millis()).unwrap_or(0));
    // The barrier: one conditional UPDATE, decided by the rows it changed.
    let (job_id, n_before) = (candidate.job_id, candidate.n_before);
    let leased = tx.lease(job_id, owner, lease_until, now, n_before)?;
    Ok(leased.then_some(lease_ends))
}

/// The job's replay budget base, once a lapsed lease's attempt is recorded
/// as cut short; None when that used up its attempts (the job failed).
fn budget_after_takeover<T: OutboxTx>(
    tx: &mut T,
    fwd: &Forward,
    candidate: &Candidate,
    now: i64,
) -> Result<Option<i64>, StoreError> {
    let (job_id, n_before) = (candidate.job_id, candidate.n_before);
    // A job's first lease (the common case) has no attempts behind it:
    // no replay budget to look up and no cut-short attempt to record.
    let budget_base: i64 = if n_before == 0 {
        0
    } else {
        tx.replay_budget_base(job_id)?
    };
    let took_over = n_before > 0 && !tx.attempt_exists(job_id, n_before)?;
    if took_over {
        // The previous owner's attempt never recorded an end: its lease
        // ran out (crash, or a hang past the lease).
        let previous_owner = candidate.previous_owner.as_deref();
        tx.record_cut_short(job_id, n_before, candidate.leased_at, now, previous_owner)?;
        if n_before - budget_base >= i64::from(fwd.max_attempts) {
            fail_and_refresh(
                tx,
                job_id,
                &candidate.source,
                &candidate.event_id,
                now,
                "max_attempts reached (the last attempt was cut short)",
            )?;
            return Ok(None);
        }
    }
    Ok(Some(budget_base))
}

/// Fails a job with `error` and brings its event's state up to date.
fn fail_and_refresh<T: OutboxTx>(
    tx: &mut T,
    job_id: i64,
    source: &str,
    event_id: &str,
    now: i64,
    error: &str,
) -> Result<(), StoreError> {
    fail_job(tx, job_id, now, error)?;
    refresh_event_state_in(tx, source, event_id, now)?;
    Ok(())
}

/// The forward action a job belongs to, if the config still has it.
fn forward_action<'c>(config: &'c Config, source: &str, action: &str) -> Option<&'c Forward> {
    config
        .source(source)
        .and_then(|s| s.action(action))
        .and_then(|a| match &a.kind {
            ActionKind::Forward(f) => Some(&**f),
            ActionKind::Sql { .. } => None,
        })
}

/// The jobs named by `after` that are not done yet, with their status.
fn waiting_for<T: OutboxTx>(
    tx: &mut T,
    source: &str,
    event_id: &str,
    after: &[String],
) -> Result<Vec<(String, JobStatus)>, StoreError> {
    Ok(tx
        .open_jobs_of_event(source, event_id)?
        .into_iter()
        .filter(|(action, _)| after.contains(action))
        .collect())
}

/// Parks a pending job that waits for other actions: no due time, and the
/// reason in `last_error` (shown by `events show`).
fn park<T: OutboxTx>(
    tx: &mut T,
    job_id: i64,
    n_attempts: i64,
    waiting: &[(String, JobStatus)],
    now: i64,
) -> Result<(), StoreError> {
    let names: Vec<String> = waiting
        .iter()
        .map(|(action, status)| format!("{action} ({status})"))
        .collect();
    let failed = waiting
        .iter()
        .any(|(_, status)| *status == JobStatus::Failed);
    let reason = format!(
        "waiting for {} of the same event{}",
        names.join(", "),
        if failed {
            ": a successful replay or a resolve of it releases this job"
        } else {
            ": sent once done"
        }
    );
    tx.park(job_id, n_attempts, &reason, now)
}

fn fail_job<T: OutboxTx>(tx: &mut T, job_id: i64, now: i64, error: &str) -> Result<(), StoreError> {
    let status = failed_status(tx, job_id)?;
    tx.end_job(job_id, now, error, status.as_str())
}

/// The status a job takes when an attempt fails for good: `failed`, except
/// in a forced re-run of a done job (its latest replay came from `done`),
/// which stays done: its effect already happened once.
/// The failed attempt is recorded all the same.
fn failed_status<T: OutboxTx>(tx: &mut T, job_id: i64) -> Result<JobStatus, StoreError> {
    let from = tx.latest_replay_from(job_id)?;
    Ok(if from == Some(JobStatus::Done) {
        JobStatus::Done
    } else {
        JobStatus::Failed
    })
}

/// Records an attempt's result, if this worker still owns the job.
pub(super) fn complete<T: OutboxTx>(
    tx: &mut T,
    config: &Config,
    job: &Leased,
    owner: &str,
    outcome: AttemptOutcome,
    next_attempt_at: Option<i64>,
    a: &Attempt,
) -> Result<(), StoreError> {
    let status = match outcome {
        AttemptOutcome::Ok => JobStatus::Done,
        // An action paused while this attempt was in flight waits for resume.
        AttemptOutcome::Retry if tx.is_paused(&job.source, &job.action)? => JobStatus::Paused,
        AttemptOutcome::Retry => JobStatus::Pending,
        AttemptOutcome::Failed => failed_status(tx, job.job_id)?,
    };
    // Fenced by owner and attempt number: a worker that lost its lease
    // to another cannot overwrite the new owner's result.
    let last_error = if outcome == AttemptOutcome::Ok {
        None
    } else {
        a.error.as_deref()
    };
    let changed = tx.finish_job(
        job.job_id,
        owner,
        job.n,
        status.as_str(),
        next_attempt_at,
        last_error,
        a.finished_at,
    )?;
    if !changed {
        crate::log::warn(
            "lease lost",
            &[
                ("source", &job.source),
                ("event_id", &job.event_id),
                ("action", &job.action),
                ("n", &job.n),
                (
                    "effect",
                    &"result not recorded; the job's new owner decides",
                ),
            ],
        );
        return Ok(());
    }
    tx.put_attempt(&NewAttempt {
        job_id: job.job_id,
        n: job.n,
        started_at: a.started_at,
        finished_at: a.finished_at,
        outcome: outcome.as_str(),
        http_status: a.http_status.map(i64::from),
        error: a.error.as_deref(),
        error_kind: a.error_kind,
        request_id: a.request_id.as_deref(),
        response_head: a.response_head.as_deref(),
        worker: Some(owner),
    })?;
    if status == JobStatus::Failed {
        let (kind, error) = (a.error_kind, a.error.as_deref());
        let (source, action, event_id) = (&job.source, &job.action, &job.event_id);
        let now = a.finished_at;
        crate::notify::dead_letter(
            tx,
            config,
            source,
            action,
            event_id,
            kind,
            a.http_status,
            error,
            now,
        )?;
    }
    refresh_event_state_in(tx, &job.source, &job.event_id, a.finished_at)?;
    if let Some(fwd) = forward_action(config, &job.source, &job.action) {
        if status == JobStatus::Done {
            control::mark_delivered(tx, fwd, job.job_id, &job.body)?;
        }
        if fwd.control.concurrency.is_some() {
            control::release_slot(tx, &job.source, &job.action, a.finished_at)?;
        }
    }
    Ok(())
}

/// Gives back a job taken but not sent, recording the check asked for
/// it, if any.
pub(super) fn give_back<T: OutboxTx>(
    tx: &mut T,
    job: (i64, i64),
    owner: &str,
    source: &str,
    action: &str,
    asked: Option<&Asked>,
) -> Result<(), StoreError> {
    let (id, n) = job;
    if let Some(asked) = asked {
        record_check_in(tx, id, n, owner, asked)?;
    }
    let status = if tx.is_paused(source, action)? {
        JobStatus::Paused
    } else {
        JobStatus::Pending
    };
    tx.give_back(id, owner, n, status.as_str())
}
