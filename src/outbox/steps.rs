//! The outbox's transaction steps, generic over `store::OutboxTx` so each
//! backend runs the same decisions: take (lease, park for `after`, take
//! over a lapsed lease), complete fenced by owner and attempt, give back,
//! record a check.

use std::time::Duration;

use anyhow::Result;

use super::circuit;
use super::control::{self, Slot};
use super::{Attempt, HealthProbe, Leased, Taken};
use crate::config::{ActionKind, Config, Forward};
use crate::outbox::ask::Asked;
use crate::outbox::retry::Verdict;
use crate::receive::ingest::refresh_event_state_in;
use crate::state::{AttemptOutcome, JobStatus};
use crate::store::StoreError;
use crate::store::circuits;
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
/// pending jobs in due order, and the probes of open circuits that are due.
/// Returns them with the earliest time another job or probe falls due,
/// for the worker's sleep.
/// Leases at most `batch` jobs (at most [`TAKE_BATCH`]).
pub(super) fn take<T: OutboxTx>(
    tx: &mut T,
    config: &Config,
    owner: &str,
    local_now: i64,
    batch: usize,
    held_here: &std::collections::HashSet<i64>,
) -> Result<Taken, StoreError> {
    // Decided by the storage's clock; what goes back to the worker (when
    // its lease ends, when to look again) by its own.
    let now = tx.clock(local_now)?;
    let skew = now - local_now;
    let open = circuit::OpenCircuits::load(tx, config)?;
    let mut candidates: Vec<Candidate> = tx.expired_jobs(now)?;
    candidates.extend(tx.due_jobs(now)?);
    let mut taken = Vec::new();
    for candidate in candidates {
        if taken.len() >= batch.min(TAKE_BATCH) {
            break;
        }
        if !candidate.pending && held_here.contains(&candidate.job_id) {
            // Its lease looks run out, but a worker of this instance holds
            // it (the wall clock jumped): not taken over.
            continue;
        }
        if open.is_open(&candidate.source, &candidate.action) {
            // Its circuit is open: a due job waits on it, out of the take
            // query's way; so does one whose lease ran out, its cut-short
            // attempt recorded as a takeover would.
            let (id, n) = (candidate.job_id, candidate.n_before);
            if candidate.pending {
                circuits::park(&tx.db(), id, n, now)?;
            } else if circuits::park_lapsed(&tx.db(), id, n, now)? {
                let previous_owner = candidate.previous_owner.as_deref();
                tx.record_cut_short(id, n, candidate.leased_at, now, previous_owner)?;
            }
            continue;
        }
        if let Some(job) = take_one(tx, config, owner, now, candidate)? {
            taken.push(job);
        }
    }
    let mut health = Vec::new();
    let mut next_due = tx.next_due()?;
    for row in open.rows() {
        let (source, action) = (row.source.as_str(), row.action.as_str());
        // A pause wins: no probes while paused.
        if tx.is_paused(source, action)? {
            continue;
        }
        let due = circuit::due_at(row);
        if due.is_some_and(|at| at > now) {
            next_due = earliest(next_due, due);
            continue;
        }
        match probe(tx, config, owner, now, row)? {
            Probe::Job(job) => taken.push(*job),
            Probe::Health(h) => health.push(h),
            Probe::Nothing => {}
        }
    }
    for job in &mut taken {
        job.lease_ends -= skew;
    }
    Ok(Taken {
        jobs: taken,
        health,
        next_due: next_due.map(|at| at - skew),
    })
}

fn earliest(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// What a due probe of an open circuit came to in this take.
enum Probe {
    Job(Box<Leased>),
    Health(HealthProbe),
    /// Another worker claimed it, or no job waits to be the probe.
    Nothing,
}

/// Claims the due probe of an open circuit: its `health` GET, else the
/// job that has waited longest, leased as a real attempt.
fn probe<T: OutboxTx>(
    tx: &mut T,
    config: &Config,
    owner: &str,
    now: i64,
    row: &circuits::CircuitRow,
) -> Result<Probe, StoreError> {
    let (source, action) = (row.source.as_str(), row.action.as_str());
    let Some(fwd) = forward_action(config, source, action) else {
        return Ok(Probe::Nothing);
    };
    let Some(circuit) = &fwd.circuit else {
        return Ok(Probe::Nothing);
    };
    let hold =
        i64::try_from((fwd.lease + takeover_grace(fwd.lease)).as_millis()).unwrap_or(i64::MAX / 4);
    if let Some(url) = &circuit.health {
        if !circuits::claim_probe(&tx.db(), source, action, owner, now + hold, now)? {
            return Ok(Probe::Nothing);
        }
        return Ok(Probe::Health(HealthProbe {
            source: source.to_string(),
            action: action.to_string(),
            url: url.clone(),
            timeout: fwd.timeout,
        }));
    }
    let Some(waiting) = circuits::oldest_waiting(&tx.db(), source, action)? else {
        return Ok(Probe::Nothing);
    };
    if !circuits::claim_probe(&tx.db(), source, action, owner, now + hold, now)? {
        return Ok(Probe::Nothing);
    }
    if !circuits::unpark_for_probe(&tx.db(), &waiting, now)? {
        circuit::probe_released(tx, source, action, owner, now)?;
        return Ok(Probe::Nothing);
    }
    let failing_since = waiting
        .failing_since
        .map(|at| at + (now - waiting.updated_at));
    let candidate = Candidate {
        job_id: waiting.job_id,
        source: source.to_string(),
        event_id: waiting.event_id,
        action: action.to_string(),
        n_before: waiting.n_attempts,
        leased_at: now,
        previous_owner: None,
        pending: true,
        failing_since,
        probe_failures: waiting.probe_failures,
    };
    match take_one(tx, config, owner, now, candidate)? {
        Some(mut job) => {
            job.probe = true;
            Ok(Probe::Job(Box::new(job)))
        }
        None => {
            // Held back (its `after`, its order, a slot) or ended: the
            // next probe is another job, at once.
            circuit::probe_released(tx, source, action, owner, now)?;
            Ok(Probe::Nothing)
        }
    }
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
    let Some(budget_base) = budget_after_takeover(tx, config, fwd, &candidate, now)? else {
        return Ok(None);
    };
    let Candidate {
        job_id,
        source,
        event_id,
        action,
        n_before,
        failing_since,
        probe_failures,
        ..
    } = candidate;
    let Some(ForwardEvent {
        event_type,
        body: Some(body),
        content_type,
    }) = tx.forward_event(&source, &event_id)?
    else {
        let job = JobRef {
            job_id,
            source: &source,
            event_id: &event_id,
            action: &action,
        };
        fail_and_refresh(
            tx,
            config,
            job,
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
        failing_since,
        probe_failures,
        probe: false,
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
    config: &Config,
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
        let counted = n_before - budget_base - candidate.probe_failures;
        let used_up = fwd.max_attempts.is_some_and(|m| counted >= i64::from(m));
        let too_long = candidate
            .failing_since
            .is_some_and(|at| now - at >= ms(fwd.give_up_after));
        if used_up || too_long {
            let job = JobRef {
                job_id,
                source: &candidate.source,
                event_id: &candidate.event_id,
                action: &candidate.action,
            };
            fail_and_refresh(
                tx,
                config,
                job,
                now,
                if used_up {
                    "max_attempts reached (the last attempt was cut short)"
                } else {
                    "give_up_after reached (the last attempt was cut short)"
                },
            )?;
            return Ok(None);
        }
    }
    Ok(Some(budget_base))
}

/// Which job a step that ends one is about.
#[derive(Debug, Clone, Copy)]
pub struct JobRef<'a> {
    pub job_id: i64,
    pub source: &'a str,
    pub event_id: &'a str,
    pub action: &'a str,
}

/// What a dead letter's last attempt said, for its notification.
#[derive(Debug, Clone, Copy, Default)]
pub struct LastAttempt<'a> {
    pub error_kind: Option<&'a str>,
    pub http_status: Option<u16>,
    pub error: Option<&'a str>,
}

/// Fails a job with `error` and brings its event's state up to date.
fn fail_and_refresh<T: OutboxTx>(
    tx: &mut T,
    config: &Config,
    job: JobRef<'_>,
    now: i64,
    error: &str,
) -> Result<(), StoreError> {
    let status = fail_job(tx, job.job_id, now, error)?;
    if status == JobStatus::Failed {
        let last = LastAttempt {
            error: Some(error),
            ..LastAttempt::default()
        };
        dead_letter(tx, config, job, last, now)
    } else {
        refresh_event_state_in(tx, job.source, job.event_id, now).map(|_| ())
    }
}

/// A forward job failed for good (a dead letter), in the transaction that
/// wrote its status: its event's state follows (failed), and the
/// `dead_letter` notification is written with it. The one place every
/// dead letter of the outbox passes, after the job's row says so.
pub fn dead_letter<T: OutboxTx>(
    tx: &mut T,
    config: &Config,
    job: JobRef<'_>,
    last: LastAttempt<'_>,
    now: i64,
) -> Result<(), StoreError> {
    crate::notify::dead_letter(
        tx,
        config,
        job.source,
        job.action,
        job.event_id,
        last.error_kind,
        last.http_status,
        last.error,
        now,
    )?;
    refresh_event_state_in(tx, job.source, job.event_id, now).map(|_| ())
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX / 4)
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

fn fail_job<T: OutboxTx>(
    tx: &mut T,
    job_id: i64,
    now: i64,
    error: &str,
) -> Result<JobStatus, StoreError> {
    let status = failed_status(tx, job_id)?;
    tx.end_job(job_id, now, error, status.as_str())?;
    Ok(status)
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

/// What an attempt that is not a probe tells its action's circuit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum CircuitNote {
    /// Nothing to write: no circuit, another 4xx, or a 2xx while this
    /// instance knows the count is 0 already.
    Nothing,
    /// A 2xx: the count goes back to 0 (an open circuit closes).
    Success,
    /// A failure that says the downstream is down.
    Failure,
}

/// Records an attempt's result, if this worker still owns the job.
#[allow(clippy::too_many_arguments)]
pub(super) fn complete<T: OutboxTx>(
    tx: &mut T,
    config: &Config,
    job: &Leased,
    owner: &str,
    outcome: AttemptOutcome,
    next_attempt_at: Option<i64>,
    a: &Attempt,
    note: CircuitNote,
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
        let dead = JobRef {
            job_id: job.job_id,
            source: &job.source,
            event_id: &job.event_id,
            action: &job.action,
        };
        let last = LastAttempt {
            error_kind: a.error_kind,
            http_status: a.http_status,
            error: a.error.as_deref(),
        };
        dead_letter(tx, config, dead, last, a.finished_at)?;
    } else {
        refresh_event_state_in(tx, &job.source, &job.event_id, a.finished_at)?;
    }
    if outcome == AttemptOutcome::Retry && !job.probe && job.failing_since.is_none() {
        circuits::start_failing(&tx.db(), job.job_id, a.started_at)?;
    }
    if let Some(fwd) = forward_action(config, &job.source, &job.action) {
        if status == JobStatus::Done {
            control::mark_delivered(tx, fwd, job.job_id, &job.body)?;
        }
        if fwd.control.concurrency.is_some() {
            control::release_slot(tx, &job.source, &job.action, a.finished_at)?;
        }
        if let Some(c) = &fwd.circuit {
            let action = (fwd, c);
            record_in_circuit(tx, &config.notify, action, job, owner, a, note)?;
        }
    }
    Ok(())
}

/// What the attempt tells its action's circuit, in the transaction that
/// records it: a probe closes it, fails (its job goes behind the others,
/// the failure not counted) or ends without a verdict (a 4xx); another
/// attempt counts as `note` says.
fn record_in_circuit<T: OutboxTx>(
    tx: &mut T,
    notify: &crate::config::notify::NotifySettings,
    (fwd, c): (&Forward, &crate::config::Circuit),
    job: &Leased,
    owner: &str,
    a: &Attempt,
    note: CircuitNote,
) -> Result<(), StoreError> {
    let (source, action, now) = (job.source.as_str(), job.action.as_str(), a.finished_at);
    if job.probe {
        return match a.verdict {
            Verdict::Done => circuit::close_circuit(tx, notify, source, action, now).map(|_| ()),
            Verdict::Retry => {
                circuit::probe_failed(tx, c, fwd.retry_max, (source, action), owner, now)?;
                circuits::probe_job_back(&tx.db(), job.job_id, now)
            }
            Verdict::Fail => circuit::probe_released(tx, source, action, owner, now),
        };
    }
    match note {
        CircuitNote::Nothing => Ok(()),
        CircuitNote::Success => circuit::count_success(tx, notify, source, action, now),
        CircuitNote::Failure => circuit::count_failure(tx, notify, c, source, action, now),
    }
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
    tx.give_back(id, owner, n, status.as_str())?;
    // Were it the probe, the next probe may start at once (a no-op
    // otherwise: the circuit's probe is not this worker's).
    let now = now_of(tx)?;
    circuit::probe_released(tx, source, action, owner, now)
}

fn now_of<T: OutboxTx>(tx: &mut T) -> Result<i64, StoreError> {
    tx.clock(crate::time::now_ms())
}
