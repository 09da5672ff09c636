//! One forward worker's loop: take due jobs through the storage, ask a
//! `check` first when an earlier attempt may have reached the downstream,
//! call the downstream outside any transaction, and record the result (or
//! give the job back when its lease would not cover the call).

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;

use super::circuit::{self, Clean};
use super::dest::{Destinations, Message};
use super::steps::{CircuitNote, complete, give_back, record_check_in, take};
use super::{Attempt, HealthProbe, Leased, Taken, Waker};
use crate::config::{ActionKind, Config, Forward};
use crate::metrics::Metrics;
use crate::outbox::ask::{self, Asked};
use crate::outbox::retry::{self, Verdict};
use crate::state::{Answer, AttemptOutcome};
use crate::store::StoreError;
use crate::store::backend::{Backend, Guard};
use crate::store::tx::{OutboxTx, TAKE_BATCH};
use crate::time::now_ms;

/// The longest a worker sleeps without looking for due jobs (retries that
/// came due, jobs re-queued by the CLI, leases that expired).
const MAX_IDLE: Duration = Duration::from_millis(500);

pub(super) struct Worker<B: Backend> {
    pub(super) owner: String,
    pub(super) config: Arc<Config>,
    pub(super) backend: Arc<B>,
    /// The worker's own session of the storage (its PostgreSQL
    /// connection; nothing on SQLite).
    pub(super) session: Mutex<B::Session>,
    pub(super) metrics: Arc<Metrics>,
    /// The plain HTTP agent (health probes of actions without TLS
    /// settings of their own).
    pub(super) agent: ureq::Agent,
    /// Every forward action's destination and HTTP client.
    pub(super) dests: Arc<Destinations>,
    pub(super) waker: Waker,
    pub(super) stop: Arc<AtomicBool>,
    pub(super) in_flight: Arc<AtomicUsize>,
    /// The actions this instance knows to have no failures counted.
    pub(super) clean: Arc<Clean>,
    /// The jobs this instance's workers hold now.
    pub(super) held: Arc<Held>,
}

/// The jobs this instance's workers hold right now: leased, and not yet
/// recorded or given back. A take never takes one of them over, whatever
/// the wall clock says: a worker of this process is alive, so a lease of
/// its that looks run out (a wall clock jumped forward) is not. Another
/// process's leases are judged by the clock (the storage's on
/// PostgreSQL).
#[derive(Default)]
pub(super) struct Held(Mutex<HashSet<i64>>);

impl Held {
    fn snapshot(&self) -> HashSet<i64> {
        self.0.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Holds `job_id` until the returned guard is dropped.
    fn hold(self: &Arc<Held>, job_id: i64) -> HeldJob {
        if let Ok(mut s) = self.0.lock() {
            s.insert(job_id);
        }
        HeldJob {
            held: self.clone(),
            job_id,
        }
    }
}

/// A job held by a worker of this instance, until dropped.
pub(super) struct HeldJob {
    held: Arc<Held>,
    job_id: i64,
}

impl Drop for HeldJob {
    fn drop(&mut self) {
        if let Ok(mut s) = self.held.0.lock() {
            s.remove(&self.job_id);
        }
    }
}

/// Whether the forward workers' storage is failing now: the first worker
/// to fail says so (with the cause), the first to succeed again says it is
/// back; the others say nothing, so an outage is two lines, not one per
/// worker per second.
static STORAGE_DOWN: AtomicBool = AtomicBool::new(false);

fn storage_down(worker: &str, error: &str) {
    if !STORAGE_DOWN.swap(true, Ordering::SeqCst) {
        crate::log::warn(
            "outbox: storage unavailable",
            &[
                ("worker", &worker),
                ("error", &error),
                (
                    "effect",
                    &"forward jobs wait; every worker tries again each second",
                ),
            ],
        );
    }
}

fn storage_back() {
    if STORAGE_DOWN.swap(false, Ordering::SeqCst) {
        crate::log::info("outbox: storage available again", &[]);
    }
}

impl<B: Backend> Worker<B> {
    pub(super) fn run(self) {
        while !self.stop.load(Ordering::Relaxed) {
            let seen = self.waker.generation();
            let config = self.config.clone();
            let owner = self.owner.clone();
            // A share of a batch while other workers are free, so a
            // backlog goes out over all of them at once (16 due jobs and 4
            // free workers: 4 each, not 16 sent one after another by one
            // worker); a whole batch when the others are all sending, or
            // when every destination pipelines: a broker takes a whole
            // batch in one round trip, so shares would only mean more
            // round trips (RabbitMQ's batches averaged 7 jobs through a
            // backlog with them).
            let sending = self.in_flight.load(Ordering::Relaxed);
            let free_others = self.config.forward_workers.saturating_sub(1 + sending);
            let batch = if self.dests.all_pipeline() {
                TAKE_BATCH
            } else {
                (TAKE_BATCH / (1 + free_others)).max(1)
            };
            // Leases and completions fail only when storage does: no
            // savepoint of their own (Guard::Group).
            let held = self.held.snapshot();
            let taken = self.jobs(move |tx| take(tx, &config, &owner, now_ms(), batch, &held));
            let Taken {
                jobs,
                health,
                next_due,
            } = match taken {
                Ok(t) => {
                    storage_back();
                    t
                }
                Err(e) => {
                    storage_down(&self.owner, &e.message);
                    self.waker.wait(seen, Duration::from_secs(1));
                    continue;
                }
            };
            for probe in health {
                self.probe_health(probe);
            }
            if jobs.is_empty() {
                let max_idle = crate::failpoint::duration("outbox.idle").unwrap_or(MAX_IDLE);
                let wait = next_due
                    .map(|at| Duration::from_millis(u64::try_from(at - now_ms()).unwrap_or(0)))
                    .unwrap_or(max_idle)
                    .clamp(Duration::from_millis(1), max_idle);
                self.waker.wait(seen, wait);
                continue;
            }
            if jobs.len() == batch {
                // Likely more due than this worker took (a backlog after a
                // restart, a resume, a downstream back up): bring idle
                // workers in.
                self.waker.wake();
            }
            // Actions whose downstream failed during this batch (their
            // circuit may have opened): the rest of their jobs go back to
            // the take, which holds them while it is open.
            let mut failing: Vec<(String, String)> = Vec::new();
            // Held from here until each is recorded or given back (the
            // guard drops at the end of its turn).
            let guards: Vec<HeldJob> = jobs.iter().map(|j| self.held.hold(j.job_id)).collect();
            let mut turns: Vec<Option<(Leased, HeldJob)>> =
                jobs.into_iter().zip(guards).map(Some).collect();
            for i in 0..turns.len() {
                let Some(turn) = turns[i].take() else {
                    continue;
                };
                let Some((job, _held)) =
                    self.send_together(turn, &mut turns[i + 1..], &mut failing)
                else {
                    continue;
                };
                // A job whose lease could run out during the call is given
                // back rather than sent: once the lease ends another worker
                // may take it, and two workers would send it at once.
                // A check before the send may take a timeout of its own.
                let calls = if job.needs_check { 2 } else { 1 };
                let fwd = self.forward_of(&job.source, &job.action);
                let timeout = fwd.map_or(0, |f| {
                    i64::try_from(f.timeout.as_millis()).unwrap_or(i64::MAX / 4) * calls
                });
                let has_circuit = fwd.is_some_and(|f| f.circuit.is_some());
                let held = has_circuit
                    && failing
                        .iter()
                        .any(|(s, a)| *s == job.source && *a == job.action);
                if held || self.stop.load(Ordering::Relaxed) || now_ms() + timeout >= job.lease_ends
                {
                    self.release(&job, None);
                    continue;
                }
                let action = (job.source.clone(), job.action.clone());
                if self.deliver(job) == Some(Verdict::Retry) && has_circuit {
                    failing.push(action);
                }
            }
        }
    }

    fn forward_of(&self, source: &str, action: &str) -> Option<&Forward> {
        match &self.config.source(source)?.action(action)?.kind {
            ActionKind::Forward(f) => Some(f),
            ActionKind::Sql { .. } => None,
        }
    }

    /// Runs one attempt of a leased job and records it; its verdict, or
    /// None when it was given back unsent.
    fn deliver(&self, job: Leased) -> Option<Verdict> {
        let fwd = self.forward_of(&job.source, &job.action).cloned()?;
        let clock = Instant::now();
        let asked = match &fwd.check {
            Some(template) if job.needs_check => match self.check_first(&job, &fwd, template) {
                Some(asked) => Some(asked),
                // Given back: no time left in the lease for the send.
                None => return None,
            },
            _ => None,
        };
        let attempt = match &asked {
            Some(asked) if asked.answer != Answer::NotFound => Attempt::decided_by(asked),
            _ => {
                crate::failpoint::hit("forward.before_call");
                let clock = Instant::now();
                self.in_flight.fetch_add(1, Ordering::SeqCst);
                let attempt = self.call(&job, &fwd);
                self.in_flight.fetch_sub(1, Ordering::SeqCst);
                self.metrics.downstream_duration.observe(clock.elapsed());
                crate::failpoint::hit("forward.after_response");
                attempt
            }
        };

        Some(self.settle(job, &fwd, asked, attempt, clock))
    }

    /// The bookkeeping after an attempt: its outcome, metrics, log line,
    /// retry delay and record. Its verdict.
    fn settle(
        &self,
        job: Leased,
        fwd: &Forward,
        asked: Option<Asked>,
        attempt: Attempt,
        clock: Instant,
    ) -> Verdict {
        let outcome = outcome_of(&job, fwd, &attempt);
        self.metrics.attempt(&job.source, &job.action, outcome);
        log_attempt(&job, outcome, &attempt, clock);
        let next_attempt_at = (outcome == AttemptOutcome::Retry).then(|| {
            let delay = retry::next_delay(
                u32::try_from(job.n).unwrap_or(u32::MAX),
                fwd.retry_initial,
                fwd.retry_max,
                attempt.retry_after,
                fastrand::f64(),
            );
            attempt.finished_at + i64::try_from(delay.as_millis()).unwrap_or(i64::MAX / 2)
        });
        let verdict = attempt.verdict;
        self.record(job, asked, outcome, next_attempt_at, attempt);
        if next_attempt_at.is_some() {
            // Another worker may be asleep past this retry's due time.
            self.waker.wake();
        }
        verdict
    }

    /// Asks the downstream's `check` URL before a send. None when the
    /// answer allows the send but the lease has no time left for it: the
    /// job is given back, and the next take asks again.
    fn check_first(
        &self,
        job: &Leased,
        fwd: &Forward,
        template: &crate::config::check_template::Template,
    ) -> Option<Asked> {
        let Some(client) = self.dests.client(&job.source, &job.action) else {
            // Only HTTP forwards take a check (the config refuses others).
            self.release(job, None);
            return None;
        };
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        let asked = ask::ask(
            client,
            fwd,
            template,
            (&job.source, &job.event_id, &job.action),
            self.dests.signer(&job.source, &job.action),
        );
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        self.metrics
            .downstream_check(&job.source, &job.action, asked.answer);
        log_check(job, &asked);
        let timeout = i64::try_from(fwd.timeout.as_millis()).unwrap_or(i64::MAX / 2);
        if asked.answer == Answer::NotFound
            && (self.stop.load(Ordering::Relaxed) || now_ms() + timeout >= job.lease_ends)
        {
            self.release(job, Some(asked));
            return None;
        }
        Some(asked)
    }

    /// Records the attempt (and the check before it) through the storage,
    /// fenced by owner and attempt number.
    fn record(
        &self,
        job: Leased,
        asked: Option<Asked>,
        outcome: AttemptOutcome,
        next_attempt_at: Option<i64>,
        attempt: Attempt,
    ) {
        let owner = self.owner.clone();
        let config = self.config.clone();
        let has_circuit = self
            .forward_of(&job.source, &job.action)
            .is_some_and(|f| f.circuit.is_some());
        // A success writes nothing while this instance knows the count
        // is 0 already; a failure always does.
        let note = match attempt.verdict {
            _ if !has_circuit || job.probe => CircuitNote::Nothing,
            Verdict::Done if self.clean.contains(&job.source, &job.action) => CircuitNote::Nothing,
            Verdict::Done => CircuitNote::Success,
            Verdict::Retry => CircuitNote::Failure,
            Verdict::Fail => CircuitNote::Nothing,
        };
        if has_circuit {
            let clean = attempt.verdict == Verdict::Done
                || (attempt.verdict == Verdict::Fail
                    && self.clean.contains(&job.source, &job.action));
            self.clean.set(&job.source, &job.action, clean);
        }
        let recorded = self.jobs_queued(Guard::Group, move |tx| {
            if let Some(asked) = &asked {
                record_check_in(tx, job.job_id, job.n, &owner, asked)?;
            }
            complete(
                tx,
                &config,
                &job,
                &owner,
                outcome,
                next_attempt_at,
                &attempt,
                note,
            )
        });
        if recorded.is_err() {
            // The writer is gone (shutdown): the job stays leased and is
            // retried after its lease, with the same Idempotency-Key.
            crate::log::warn(
                "outbox",
                &[
                    ("worker", &self.owner),
                    ("error", &"completion not recorded"),
                ],
            );
        }
    }

    /// Runs an open circuit's `health` probe claimed by this worker: a GET,
    /// 2xx closes the circuit, anything else makes the next probe wait
    /// twice as long. No job is touched.
    fn probe_health(&self, probe: HealthProbe) {
        let agent = self
            .dests
            .client(&probe.source, &probe.action)
            .map_or(&self.agent, |c| &c.agent);
        let answer = agent
            .get(&probe.url)
            .config()
            .timeout_global(Some(probe.timeout))
            .timeout_connect(Some(probe.timeout.min(Duration::from_secs(5))))
            .build()
            .call();
        let (up, what) = match answer {
            Ok(mut response) => {
                let status = response.status().as_u16();
                let _ = response.body_mut().read_to_vec();
                (
                    retry::classify_status(status) == Verdict::Done,
                    format!("answered {status}"),
                )
            }
            Err(e) => (false, retry::classify_error(&e).1),
        };
        crate::log::info(
            "circuit probe",
            &[
                ("source", &probe.source),
                ("action", &probe.action),
                ("up", &up),
                ("health", &what),
            ],
        );
        let Some(fwd) = self.forward_of(&probe.source, &probe.action).cloned() else {
            return;
        };
        let Some(circuit) = fwd.circuit.clone() else {
            return;
        };
        let owner = self.owner.clone();
        let config = self.config.clone();
        let recorded = self.jobs(move |tx| {
            let now = tx.clock(now_ms())?;
            if up {
                circuit::close_circuit(tx, &config.notify, &probe.source, &probe.action, now)
                    .map(|_| ())
            } else {
                circuit::probe_failed(
                    tx,
                    &circuit,
                    fwd.retry_max,
                    (&probe.source, &probe.action),
                    &owner,
                    now,
                )
            }
        });
        if up && recorded.is_ok() {
            // Its waiting jobs are due now.
            self.waker.wake();
        }
    }

    /// One attempt through the action's destination.
    pub(super) fn call(&self, job: &Leased, _fwd: &Forward) -> Attempt {
        let Some(dest) = self.dests.get(&job.source, &job.action) else {
            let mut attempt = Attempt::started(now_ms());
            attempt.error_kind = Some("config");
            attempt.error = Some("the action has no destination".to_string());
            return attempt;
        };
        let message = message_of(job);
        // A client library's panic is this attempt's failure (a retry),
        // not the end of the worker.
        let started_at = now_ms();
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| dest.send(&message)))
            .unwrap_or_else(|_| panicked(started_at))
    }

    /// Sends `first` together with the later jobs of this take (`rest`)
    /// of the same broker action when its destination pipelines and two
    /// or more may go: none needs a check or is a circuit's probe, the
    /// action is not held by `failing`, and every one's lease covers one
    /// timeout from now. Each is recorded, in order (never given back: it
    /// was sent), and a retry among them holds the action (`failing`).
    /// None then; `first` back when it goes alone.
    fn send_together(
        &self,
        first: (Leased, HeldJob),
        rest: &mut [Option<(Leased, HeldJob)>],
        failing: &mut Vec<(String, String)>,
    ) -> Option<(Leased, HeldJob)> {
        let job = &first.0;
        let Some(fwd) = self.forward_of(&job.source, &job.action) else {
            return Some(first);
        };
        if fwd.broker.is_none() || self.stop.load(Ordering::Relaxed) {
            return Some(first);
        }
        let Some(dest) = self.dests.get(&job.source, &job.action) else {
            return Some(first);
        };
        if !dest.pipelines() {
            return Some(first);
        }
        let has_circuit = fwd.circuit.is_some();
        if has_circuit
            && failing
                .iter()
                .any(|(s, a)| *s == job.source && *a == job.action)
        {
            return Some(first);
        }
        let timeout = i64::try_from(fwd.timeout.as_millis()).unwrap_or(i64::MAX / 4);
        let now = now_ms();
        let goes = |other: &Leased| {
            other.source == job.source
                && other.action == job.action
                && !other.needs_check
                && !other.probe
                && now + timeout < other.lease_ends
        };
        let others: Vec<usize> = (0..rest.len())
            .filter(|&i| rest[i].as_ref().is_some_and(|(other, _)| goes(other)))
            .collect();
        if !goes(job) || others.is_empty() {
            return Some(first);
        }
        let action = (job.source.clone(), job.action.clone());
        let mut batch = vec![first];
        batch.extend(others.into_iter().filter_map(|i| rest[i].take()));

        let clock = Instant::now();
        let messages: Vec<Message<'_>> = batch.iter().map(|(job, _)| message_of(job)).collect();
        crate::failpoint::hit("forward.before_call");
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        let started_at = now_ms();
        let mut attempts =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| dest.send_batch(&messages)))
                .unwrap_or_else(|_| messages.iter().map(|_| panicked(started_at)).collect());
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        self.metrics.downstream_duration.observe(clock.elapsed());
        crate::failpoint::hit("forward.after_response");
        drop(messages);
        // One attempt per message; a short answer is a retry for the rest.
        attempts.resize_with(batch.len(), || {
            let mut attempt = Attempt::started(started_at);
            attempt.error_kind = Some("protocol");
            attempt.error = Some("the destination gave no answer for it".to_string());
            attempt.finished_at = now_ms();
            attempt
        });
        let mut retried = false;
        for ((job, _held), attempt) in batch.into_iter().zip(attempts) {
            retried |= self.settle(job, fwd, None, attempt, clock) == Verdict::Retry;
        }
        if retried && has_circuit {
            failing.push(action);
        }
        None
    }

    /// Gives back a job taken but not sent (shutdown, or too little of the
    /// lease left), recording the check asked for it, if any.
    pub(super) fn release(&self, job: &Leased, asked: Option<Asked>) {
        let (id, n, owner) = (job.job_id, job.n, self.owner.clone());
        let (source, action) = (job.source.clone(), job.action.clone());
        let _ = self.jobs_queued(Guard::Savepoint, move |tx| {
            give_back(tx, (id, n), &owner, &source, &action, asked.as_ref())
        });
    }

    /// Runs `body` as one outbox transaction on this worker's session and
    /// waits for its commit. No savepoint of its own (`Guard::Group`):
    /// leases and completions fail only when storage does.
    fn jobs<T: Send + 'static>(
        &self,
        body: impl for<'t> FnMut(&mut B::Tx<'t>) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let mut session = self.session.lock().unwrap_or_else(|p| p.into_inner());
        self.backend.jobs(&mut session, Guard::Group, body)
    }

    /// Like [`Worker::jobs`] under `guard`, without waiting for the commit
    /// where the storage can avoid it (`Backend::jobs_queued`).
    fn jobs_queued(
        &self,
        guard: Guard,
        body: impl for<'t> FnMut(&mut B::Tx<'t>) -> Result<(), StoreError> + Send + 'static,
    ) -> Result<(), StoreError> {
        let mut session = self.session.lock().unwrap_or_else(|p| p.into_inner());
        self.backend.jobs_queued(&mut session, guard, body)
    }
}

/// The job's message, as its destination sees it.
fn message_of(job: &Leased) -> Message<'_> {
    Message {
        source: &job.source,
        event_id: &job.event_id,
        action: &job.action,
        event_type: job.event_type.as_deref(),
        content_type: job.content_type.as_deref(),
        body: &job.body,
        n: job.n,
    }
}

/// The attempt of a destination whose client panicked: a retry, not the
/// end of the worker.
fn panicked(started_at: i64) -> Attempt {
    let mut attempt = Attempt::started(started_at);
    attempt.error_kind = Some("protocol");
    attempt.error = Some("the destination's client panicked".to_string());
    attempt.finished_at = now_ms();
    attempt
}

impl Attempt {
    /// The attempt a check decided without sending: found is done
    /// (`ok`, error kind `confirmed`), an error is a retry (`check`).
    fn decided_by(asked: &Asked) -> Attempt {
        let found = asked.answer == Answer::Found;
        Attempt {
            started_at: asked.started_at,
            finished_at: asked.finished_at,
            http_status: asked.http_status,
            error_kind: Some(if found { "confirmed" } else { "check" }),
            error: if found { None } else { asked.error.clone() },
            request_id: asked.request_id.clone(),
            response_head: asked.response_head.clone(),
            retry_after: asked.retry_after,
            verdict: if found { Verdict::Done } else { Verdict::Retry },
        }
    }
}

/// What an attempt comes to: done on a 2xx; another 4xx fails the job at
/// once; a retryable failure is retried unless the job's attempts have
/// failed for `give_up_after` (from its first failed attempt, less the
/// time it waited on an open circuit) or used up `max_attempts`. A probe's
/// failure counts toward neither.
fn outcome_of(job: &Leased, fwd: &Forward, attempt: &Attempt) -> AttemptOutcome {
    match attempt.verdict {
        Verdict::Done => AttemptOutcome::Ok,
        Verdict::Fail => AttemptOutcome::Failed,
        Verdict::Retry if job.probe => AttemptOutcome::Retry,
        Verdict::Retry => {
            let since = job.failing_since.unwrap_or(attempt.started_at);
            let give_up = i64::try_from(fwd.give_up_after.as_millis()).unwrap_or(i64::MAX);
            let counted = job.n - job.budget_base - job.probe_failures;
            let too_long = attempt.finished_at - since >= give_up;
            let used_up = fwd.max_attempts.is_some_and(|m| counted >= i64::from(m));
            if too_long || used_up {
                AttemptOutcome::Failed
            } else {
                AttemptOutcome::Retry
            }
        }
    }
}

/// The attempt's log line: a job failed for good (a dead letter: the
/// effect did not happen) is an error; a retry is the normal life of an
/// outbox.
fn log_attempt(job: &Leased, outcome: AttemptOutcome, attempt: &Attempt, clock: Instant) {
    let ms = format!("{:.1}", clock.elapsed().as_secs_f64() * 1000.0);
    let level = match outcome {
        AttemptOutcome::Failed => crate::log::Level::Error,
        AttemptOutcome::Ok | AttemptOutcome::Retry => crate::log::Level::Info,
    };
    let call = Call {
        word: ("outcome", outcome.as_str()),
        http_status: attempt.http_status,
        ms,
        error: attempt.error.as_deref(),
    };
    log_call(level, "attempt", job, &call);
}

fn log_check(job: &Leased, asked: &Asked) {
    let call = Call {
        word: ("answer", asked.answer.as_str()),
        http_status: asked.http_status,
        ms: (asked.finished_at - asked.started_at).to_string(),
        error: asked.error.as_deref(),
    };
    log_call(crate::log::Level::Info, "check", job, &call);
}

/// What an attempt's or a check's log line says of the call.
struct Call<'a> {
    /// Its outcome or answer, with the field's name.
    word: (&'static str, &'static str),
    http_status: Option<u16>,
    ms: String,
    error: Option<&'a str>,
}

/// The job's fields, then the call's; no error field for a call that had
/// none.
fn log_call(level: crate::log::Level, what: &str, job: &Leased, call: &Call<'_>) {
    let status = call.http_status.map_or("-".to_string(), |s| s.to_string());
    let mut fields: Vec<(&str, &dyn std::fmt::Display)> = vec![
        ("source", &job.source),
        ("event_id", &job.event_id),
        ("action", &job.action),
        ("n", &job.n),
        (call.word.0, &call.word.1),
        ("http_status", &status),
        ("ms", &call.ms),
    ];
    if let Some(error) = &call.error {
        fields.push(("error", error));
    }
    crate::log::write(level, what, &fields);
}
