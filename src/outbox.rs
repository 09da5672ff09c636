//! The outbox: forward workers that deliver `forward` jobs to downstreams.
//!
//! A job row is written by the claim transaction (status `pending`). A
//! worker takes it with one conditional `UPDATE ... WHERE` (pending and
//! due, or processing with an expired lease) decided by `changes()`, which
//! records the lease (owner, expiry) and counts the attempt. It then POSTs
//! the stored body with `Idempotency-Key: {source}:{event_id}:{action}`, and
//! records the result with an update fenced by owner and attempt number: a
//! worker whose lease expired and was taken over cannot overwrite the new
//! owner's result. A crashed worker's job is taken over after its lease
//! and a grace ([`takeover_grace`]); the cut-short attempt is then
//! recorded as a `retry` with error kind `lease`.
//!
//! Two per-action refinements. A job whose action has `after` is not taken
//! while a named job of its event is not done: the take parks it (pending,
//! no due time) and the `jobs_release_waiting` trigger (schema.sql) makes
//! it due again when one of the event's jobs becomes done. A job whose
//! action has a `check`, and one of whose attempts since its last success
//! may have reached the downstream, is asked about first (`check.rs`),
//! under the same lease: 200 is done without a send (`confirmed`), 404
//! sends, anything else is a retry (`check`) with nothing sent.
//!
//! Job life cycle:
//! ```text
//!   (claim) --> pending --take--> processing --2xx (or check 200)--> done
//!               ^  |                |  |
//!   pause/resume|  v   retryable &  |  +--4xx or attempts used up--> failed
//!             paused   attempts left|                                  |
//!               ^                   v                                  |
//!               +------------- pending (next_attempt_at = backoff) <---+ replay
//!
//!   pending (after: a named job not done) --take--> parked (pending, no
//!   due time) --any job of the event done (trigger)--> pending, due now
//! ```
//! Takes and completions go through the one writer; the HTTP call happens
//! outside any transaction.

use std::collections::HashMap;
use std::io::Read;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use rusqlite::Connection;

use crate::check::{self, Asked};
use crate::config::{ActionKind, Config, Forward};
use crate::ingest::refresh_event_state_in;
use crate::metrics::Metrics;
use crate::retry::{self, Verdict};
use crate::state::{Answer, AttemptOutcome, JobStatus};
use crate::store::pg::Settings;
use crate::store::pg_tx::{PgTx, Session};
use crate::store::sqlite::Sqlite;
use crate::store::tx::{AttemptRow, Candidate, CheckRow, ForwardEvent, OutboxTx};
use crate::store::{Guard, StoreError, Writer};
use crate::time::now_ms;
use crate::verify::{Scheme, Verifier};

use crate::store::tx::TAKE_BATCH;
/// The longest a worker sleeps without looking for due jobs (retries that
/// came due, jobs re-queued by the CLI, leases that expired).
const MAX_IDLE: Duration = Duration::from_millis(500);
/// How much of a downstream's answer is kept with the attempt.
const RESPONSE_HEAD_BYTES: usize = 1024;
/// The most of an answer read (so the connection can be reused).
const RESPONSE_READ_LIMIT: u64 = 64 * 1024;

/// Wakes idle workers when jobs are committed.
#[derive(Clone)]
pub struct Waker(Arc<WakeState>);

struct WakeState {
    generation: Mutex<u64>,
    cv: Condvar,
}

impl Waker {
    fn new() -> Waker {
        Waker(Arc::new(WakeState {
            generation: Mutex::new(0),
            cv: Condvar::new(),
        }))
    }

    pub fn wake(&self) {
        if let Ok(mut g) = self.0.generation.lock() {
            *g = g.wrapping_add(1);
            self.0.cv.notify_all();
        }
    }

    fn generation(&self) -> u64 {
        self.0.generation.lock().map(|g| *g).unwrap_or(0)
    }

    /// Sleeps until woken after `seen`, or `timeout`.
    fn wait(&self, seen: u64, timeout: Duration) {
        if let Ok(g) = self.0.generation.lock()
            && *g == seen
        {
            let _ = self.0.cv.wait_timeout(g, timeout);
        }
    }
}

pub struct Outbox {
    waker: Waker,
    stop: Arc<AtomicBool>,
    workers: Vec<JoinHandle<()>>,
    /// Attempts whose request is under way right now.
    in_flight: Arc<AtomicUsize>,
}

impl Outbox {
    /// Starts `forward_workers` threads (none when no source forwards).
    pub fn start(config: Arc<Config>, jobs: Jobs, metrics: Arc<Metrics>) -> Result<Outbox> {
        let waker = Waker::new();
        let stop = Arc::new(AtomicBool::new(false));
        let in_flight = Arc::new(AtomicUsize::new(0));
        let any_forward = config.sources.iter().any(|s| {
            s.actions
                .iter()
                .any(|a| matches!(a.kind, ActionKind::Forward(_)))
        });
        let n = if any_forward {
            config.forward_workers
        } else {
            0
        };
        let agent = http_agent(n);
        let signers = Arc::new(signers(&config)?);
        if any_forward {
            // Jobs parked waiting for an `after` action are released by a
            // trigger when that action's job is done; one parked under a
            // config that has since changed is looked at again here.
            let now = now_ms();
            match &jobs {
                Jobs::Sqlite(writer) => {
                    writer.call(move |conn| Sqlite::new(conn).release_parked(now))
                }
                Jobs::Postgres(settings) => {
                    Session::new((**settings).clone()).transaction(|tx| tx.release_parked(now))
                }
            }
            .context("cannot release the jobs waiting for other actions")?;
        }
        let nonce = fastrand::u32(..);
        let mut workers = Vec::with_capacity(n);
        for i in 0..n {
            let worker = Worker {
                owner: format!("{}-{nonce:08x}-w{i}", std::process::id()),
                config: config.clone(),
                jobs: jobs.clone(),
                session: Mutex::new(None),
                metrics: metrics.clone(),
                agent: agent.clone(),
                signers: signers.clone(),
                waker: waker.clone(),
                stop: stop.clone(),
                in_flight: in_flight.clone(),
            };
            let handle = std::thread::Builder::new()
                .name(format!("idemhook-forward-{i}"))
                .spawn(move || worker.run())
                .context("cannot start a forward worker")?;
            workers.push(handle);
        }
        Ok(Outbox {
            waker,
            stop,
            workers,
            in_flight,
        })
    }

    /// Forward attempts whose request is under way (what a stop waits for).
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    pub fn waker(&self) -> Waker {
        self.waker.clone()
    }

    /// Lets in-flight attempts finish (each is bounded by its action's
    /// timeout), releases jobs taken but not started, and joins.
    pub fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        self.waker.wake();
        for w in self.workers {
            let _ = w.join();
        }
    }
}

/// The HTTP agent of forward workers (and of `reconcile --check`), for
/// `workers` threads: no redirects, statuses as answers, the cached resolver.
pub(crate) fn http_agent(workers: usize) -> ureq::Agent {
    let agent_config = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(0)
        .max_idle_connections(64.max(workers * 2))
        .max_idle_connections_per_host(workers.max(1) * 2)
        .user_agent(concat!("idemhook/", env!("CARGO_PKG_VERSION")))
        .build();
    ureq::Agent::with_parts(
        agent_config,
        ureq::unversioned::transport::DefaultConnector::new(),
        crate::resolve::Resolver::default(),
    )
}

/// Standard Webhooks signers for actions with a `sign_secret`.
pub(crate) fn signers(config: &Config) -> Result<HashMap<(String, String), Verifier>> {
    let mut out = HashMap::new();
    for s in &config.sources {
        for a in &s.actions {
            if let ActionKind::Forward(Forward {
                sign_secret: Some(secret),
                ..
            }) = &a.kind
            {
                let v = Verifier::new(
                    Scheme::Standard,
                    vec![secret.clone()],
                    Duration::from_secs(300),
                )
                .map_err(|e| {
                    anyhow::anyhow!("sources.{}.actions ({}).sign_secret: {e}", s.name, a.name)
                })?;
                out.insert((s.name.clone(), a.name.clone()), v);
            }
        }
    }
    Ok(out)
}

/// A job this worker holds the lease on.
#[derive(Debug)]
struct Leased {
    job_id: i64,
    source: String,
    event_id: String,
    action: String,
    /// This attempt's number (1-based).
    n: i64,
    /// When this worker's lease on the job ends: no attempt starts that
    /// could run past it. (The row's `lease_until` adds the takeover grace.)
    lease_ends: i64,
    /// Attempts made before the last operator replay: a replay gives the
    /// job a fresh `max_attempts` budget.
    budget_base: i64,
    event_type: Option<String>,
    body: Vec<u8>,
    content_type: Option<String>,
    /// The action has a `check` and an earlier attempt may have had its
    /// effect: ask the downstream before sending.
    needs_check: bool,
}

/// What one attempt came to.
struct Attempt {
    started_at: i64,
    finished_at: i64,
    http_status: Option<u16>,
    error_kind: Option<&'static str>,
    error: Option<String>,
    request_id: Option<String>,
    response_head: Option<String>,
    retry_after: Option<Duration>,
    verdict: Verdict,
}

/// Where the workers take and record jobs.
#[derive(Clone)]
pub enum Jobs {
    /// Through SQLite's one writer, grouped with the claims.
    Sqlite(Writer),
    /// On PostgreSQL, each worker on a connection of its own: rows are
    /// taken with SKIP LOCKED, so the workers of every instance share the
    /// jobs, each under its lease.
    Postgres(Arc<Settings>),
}

struct Worker {
    owner: String,
    config: Arc<Config>,
    jobs: Jobs,
    /// The worker's PostgreSQL connection (unused on SQLite).
    session: Mutex<Option<Session>>,
    metrics: Arc<Metrics>,
    agent: ureq::Agent,
    signers: Arc<HashMap<(String, String), Verifier>>,
    waker: Waker,
    stop: Arc<AtomicBool>,
    in_flight: Arc<AtomicUsize>,
}

impl Worker {
    fn run(self) {
        while !self.stop.load(Ordering::Relaxed) {
            let seen = self.waker.generation();
            let config = self.config.clone();
            let owner = self.owner.clone();
            // Leases and completions fail only when storage does: no
            // savepoint of their own (Guard::Group).
            let taken = match &self.jobs {
                Jobs::Sqlite(writer) => writer.call_with(Guard::Group, move |conn| {
                    take(&mut Sqlite::new(conn), &config, &owner, now_ms())
                }),
                Jobs::Postgres(_) => self.on_postgres(|tx| take(tx, &config, &owner, now_ms())),
            };
            let (jobs, next_due) = match taken {
                Ok(t) => t,
                Err(e) => {
                    crate::log::warn("outbox", &[("worker", &self.owner), ("error", &e.message)]);
                    self.waker.wait(seen, Duration::from_secs(1));
                    continue;
                }
            };
            if jobs.is_empty() {
                let wait = next_due
                    .map(|at| Duration::from_millis(u64::try_from(at - now_ms()).unwrap_or(0)))
                    .unwrap_or(MAX_IDLE)
                    .clamp(Duration::from_millis(1), MAX_IDLE);
                self.waker.wait(seen, wait);
                continue;
            }
            if jobs.len() == TAKE_BATCH {
                // Likely more due than one batch (a backlog after a restart,
                // a resume, a downstream back up): bring idle workers in.
                self.waker.wake();
            }
            for job in jobs {
                // A job whose lease could run out during the call is given
                // back rather than sent: once the lease ends another worker
                // may take it, and two workers would send it at once.
                // A check before the send may take a timeout of its own.
                let calls = if job.needs_check { 2 } else { 1 };
                let timeout = self.forward_of(&job.source, &job.action).map_or(0, |f| {
                    i64::try_from(f.timeout.as_millis()).unwrap_or(i64::MAX / 4) * calls
                });
                if self.stop.load(Ordering::Relaxed) || now_ms() + timeout >= job.lease_ends {
                    self.release(&job, None);
                    continue;
                }
                self.deliver(job);
            }
        }
    }

    fn forward_of(&self, source: &str, action: &str) -> Option<&Forward> {
        match &self.config.source(source)?.action(action)?.kind {
            ActionKind::Forward(f) => Some(f),
            ActionKind::Sql { .. } => None,
        }
    }

    fn deliver(&self, job: Leased) {
        let Some(fwd) = self.forward_of(&job.source, &job.action).cloned() else {
            return;
        };
        let clock = Instant::now();
        let asked = match &fwd.check {
            Some(template) if job.needs_check => {
                self.in_flight.fetch_add(1, Ordering::SeqCst);
                let asked = check::ask(
                    &self.agent,
                    &fwd,
                    template,
                    (&job.source, &job.event_id, &job.action),
                    self.signers.get(&(job.source.clone(), job.action.clone())),
                );
                self.in_flight.fetch_sub(1, Ordering::SeqCst);
                self.metrics
                    .downstream_check(&job.source, &job.action, asked.answer);
                log_check(&job, &asked);
                let timeout = i64::try_from(fwd.timeout.as_millis()).unwrap_or(i64::MAX / 2);
                if asked.answer == Answer::NotFound
                    && (self.stop.load(Ordering::Relaxed) || now_ms() + timeout >= job.lease_ends)
                {
                    // No time left in the lease for the send: give the job
                    // back; the next take asks again.
                    self.release(&job, Some(asked));
                    return;
                }
                Some(asked)
            }
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

        let outcome = match attempt.verdict {
            Verdict::Done => AttemptOutcome::Ok,
            Verdict::Retry if job.n - job.budget_base < i64::from(fwd.max_attempts) => {
                AttemptOutcome::Retry
            }
            Verdict::Retry | Verdict::Fail => AttemptOutcome::Failed,
        };
        self.metrics.attempt(&job.source, &job.action, outcome);
        let ms = format!("{:.1}", clock.elapsed().as_secs_f64() * 1000.0);
        let status = attempt
            .http_status
            .map_or("-".to_string(), |s| s.to_string());
        let error = attempt.error.clone().unwrap_or_default();
        // A job failed for good (a dead letter: the effect did not happen)
        // is an error; a retry is the normal life of an outbox.
        let level = match outcome {
            AttemptOutcome::Failed => crate::log::Level::Error,
            AttemptOutcome::Ok | AttemptOutcome::Retry => crate::log::Level::Info,
        };
        crate::log::write(
            level,
            "attempt",
            &[
                ("source", &job.source),
                ("event_id", &job.event_id),
                ("action", &job.action),
                ("n", &job.n),
                ("outcome", &outcome.as_str()),
                ("http_status", &status),
                ("ms", &ms),
                ("error", &error),
            ],
        );
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
        let owner = self.owner.clone();
        let recorded = match &self.jobs {
            Jobs::Sqlite(writer) => writer
                .send_with(Guard::Group, move |conn| {
                    let mut tx = Sqlite::new(conn);
                    if let Some(asked) = &asked {
                        record_check_in(&mut tx, job.job_id, job.n, &owner, asked)?;
                    }
                    complete(&mut tx, &job, &owner, outcome, next_attempt_at, &attempt)
                })
                .map_err(|_| ()),
            Jobs::Postgres(_) => self
                .on_postgres(|tx| {
                    if let Some(asked) = &asked {
                        record_check_in(tx, job.job_id, job.n, &owner, asked)?;
                    }
                    complete(tx, &job, &owner, outcome, next_attempt_at, &attempt)
                })
                .map_err(|_| ()),
        };
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
        if next_attempt_at.is_some() {
            // Another worker may be asleep past this retry's due time.
            self.waker.wake();
        }
    }

    /// One HTTP attempt, classified.
    fn call(&self, job: &Leased, fwd: &Forward) -> Attempt {
        let started_at = now_ms();
        let key = format!("{}:{}:{}", job.source, job.event_id, job.action);
        let mut request = self
            .agent
            .post(&fwd.url)
            .config()
            .timeout_global(Some(fwd.timeout))
            .timeout_connect(Some(fwd.timeout.min(Duration::from_secs(5))))
            .build()
            .header(
                "Content-Type",
                job.content_type
                    .as_deref()
                    .unwrap_or("application/octet-stream"),
            )
            .header("Idempotency-Key", key.as_str())
            .header("X-Idemhook-Source", job.source.as_str())
            .header("X-Idemhook-Event-Id", job.event_id.as_str())
            .header(
                "X-Idemhook-Event-Type",
                job.event_type.as_deref().unwrap_or(""),
            )
            .header("X-Idemhook-Attempt", job.n.to_string());
        if let Some(signer) = self.signers.get(&(job.source.clone(), job.action.clone()))
            && let Ok(headers) = signer.sign(&job.body, started_at / 1000, &key)
        {
            for (name, value) in headers {
                request = request.header(name, value);
            }
        }
        let mut attempt = Attempt {
            started_at,
            finished_at: started_at,
            http_status: None,
            error_kind: None,
            error: None,
            request_id: None,
            response_head: None,
            retry_after: None,
            verdict: Verdict::Retry,
        };
        match request.send(&job.body[..]) {
            Ok(mut response) => {
                let status = response.status().as_u16();
                attempt.http_status = Some(status);
                attempt.verdict = retry::classify_status(status);
                let header = |name: &str| {
                    response
                        .headers()
                        .get(name)
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_string)
                };
                attempt.request_id = header(&fwd.request_id_header);
                attempt.retry_after = header("retry-after")
                    .and_then(|v| retry::parse_retry_after(&v, started_at / 1000));
                let mut head = Vec::new();
                let read = response
                    .body_mut()
                    .as_reader()
                    .take(RESPONSE_READ_LIMIT)
                    .read_to_end(&mut head);
                head.truncate(RESPONSE_HEAD_BYTES);
                attempt.response_head = Some(String::from_utf8_lossy(&head).into_owned());
                if attempt.verdict != Verdict::Done {
                    attempt.error_kind = Some("status");
                    attempt.error = Some(format!("downstream answered {status}"));
                } else if let Err(e) = read {
                    // The answer was 2xx; a broken body does not undo that.
                    crate::log::debug("outbox", &[("event_id", &job.event_id), ("body_error", &e)]);
                }
            }
            Err(e) => {
                let (kind, message) = retry::classify_error(&e);
                attempt.error_kind = Some(kind);
                attempt.error = Some(message);
            }
        }
        attempt.finished_at = now_ms();
        attempt
    }

    /// Gives back a job taken but not sent (shutdown, or too little of the
    /// lease left), recording the check asked for it, if any.
    fn release(&self, job: &Leased, asked: Option<Asked>) {
        let (id, n, owner) = (job.job_id, job.n, self.owner.clone());
        let (source, action) = (job.source.clone(), job.action.clone());
        match &self.jobs {
            Jobs::Sqlite(writer) => {
                let _ = writer.send(move |conn| {
                    give_back(
                        &mut Sqlite::new(conn),
                        (id, n),
                        &owner,
                        &source,
                        &action,
                        asked.as_ref(),
                    )
                });
            }
            Jobs::Postgres(_) => {
                let _ = self.on_postgres(|tx| {
                    give_back(tx, (id, n), &owner, &source, &action, asked.as_ref())
                });
            }
        }
    }

    /// Runs `body` in a transaction on this worker's PostgreSQL connection.
    fn on_postgres<T>(
        &self,
        body: impl FnMut(&mut PgTx<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let Jobs::Postgres(settings) = &self.jobs else {
            return Err(StoreError::other("not on PostgreSQL"));
        };
        let mut session = self.session.lock().unwrap_or_else(|p| p.into_inner());
        session
            .get_or_insert_with(|| Session::new((**settings).clone()))
            .transaction(body)
    }
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

fn log_check(job: &Leased, asked: &Asked) {
    let status = asked.http_status.map_or("-".to_string(), |s| s.to_string());
    let ms = (asked.finished_at - asked.started_at).to_string();
    crate::log::info(
        "check",
        &[
            ("source", &job.source),
            ("event_id", &job.event_id),
            ("action", &job.action),
            ("n", &job.n),
            ("answer", &asked.answer.as_str()),
            ("http_status", &status),
            ("ms", &ms),
            ("error", &asked.error.as_deref().unwrap_or_default()),
        ],
    );
}

/// Records one check (whatever it answered) in `checks`, for attempt `n`,
/// on SQLite.
pub(crate) fn record_check(
    conn: &Connection,
    job_id: i64,
    n: i64,
    worker: &str,
    asked: &Asked,
) -> Result<(), StoreError> {
    record_check_in(&mut Sqlite::new(conn), job_id, n, worker, asked)
}

/// Records one check in the open transaction `tx` of any backend.
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
fn take<T: OutboxTx>(
    tx: &mut T,
    config: &Config,
    owner: &str,
    now: i64,
) -> Result<(Vec<Leased>, Option<i64>), StoreError> {
    let mut candidates: Vec<Candidate> = tx.expired_jobs(now)?;
    candidates.extend(tx.due_jobs(now)?);
    let mut taken = Vec::new();
    for Candidate {
        job_id,
        source,
        event_id,
        action,
        n_before,
        leased_at,
        previous_owner,
        pending,
    } in candidates
    {
        if taken.len() >= TAKE_BATCH {
            break;
        }
        let Some(fwd) = config
            .source(&source)
            .and_then(|s| s.action(&action))
            .and_then(|a| match &a.kind {
                ActionKind::Forward(f) => Some(f),
                ActionKind::Sql { .. } => None,
            })
        else {
            // An action no longer in the config: left for the operator
            // (reconcile lists it as overdue).
            continue;
        };
        // A job with `after` is not due while a named job of its event is
        // not done: it is parked (no due time) until a trigger releases it
        // (schema.sql, jobs_release_waiting). A job taken over after its
        // lease was let through once already.
        if pending && !fwd.after.is_empty() {
            let waiting = waiting_for(tx, &source, &event_id, &fwd.after)?;
            if !waiting.is_empty() {
                park(tx, job_id, n_before, &waiting, now)?;
                continue;
            }
        }
        let lease_ends = now + i64::try_from(fwd.lease.as_millis()).unwrap_or(i64::MAX / 2);
        let lease_until = lease_ends
            .saturating_add(i64::try_from(takeover_grace(fwd.lease).as_millis()).unwrap_or(0));
        // The barrier: one conditional UPDATE, decided by the rows it changed.
        if !tx.lease(job_id, owner, lease_until, now, n_before)? {
            continue;
        }
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
            tx.record_cut_short(job_id, n_before, leased_at, now, previous_owner.as_deref())?;
            if n_before - budget_base >= i64::from(fwd.max_attempts) {
                fail_job(
                    tx,
                    job_id,
                    now,
                    "max_attempts reached (the last attempt was cut short)",
                )?;
                refresh_event_state_in(tx, &source, &event_id, now)?;
                continue;
            }
        }
        let Some(ForwardEvent {
            event_type,
            body: Some(body),
            content_type,
        }) = tx.forward_event(&source, &event_id)?
        else {
            fail_job(
                tx,
                job_id,
                now,
                "the stored body was erased or pruned; nothing to forward",
            )?;
            refresh_event_state_in(tx, &source, &event_id, now)?;
            continue;
        };
        // Asked only when an earlier attempt since the last success may
        // have reached the downstream: any but a refused connection.
        let needs_check = n_before > 0 && fwd.check.is_some() && tx.may_have_reached(job_id)?;
        // accepted -> processing; a cheap conditional update, not a
        // recount of the event's jobs.
        tx.mark_processing(&source, &event_id)?;
        taken.push(Leased {
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
        });
    }
    let next_due = tx.next_due()?;
    Ok((taken, next_due))
}

/// The jobs named by `after` that are not done yet, with their status.
fn waiting_for<T: OutboxTx>(
    tx: &mut T,
    source: &str,
    event_id: &str,
    after: &[String],
) -> Result<Vec<(String, String)>, StoreError> {
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
    waiting: &[(String, String)],
    now: i64,
) -> Result<(), StoreError> {
    let names: Vec<String> = waiting
        .iter()
        .map(|(action, status)| format!("{action} ({status})"))
        .collect();
    let failed = waiting
        .iter()
        .any(|(_, status)| status == JobStatus::Failed.as_str());
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
    Ok(if from.as_deref() == Some(JobStatus::Done.as_str()) {
        JobStatus::Done
    } else {
        JobStatus::Failed
    })
}

/// Records an attempt's result, if this worker still owns the job.
fn complete<T: OutboxTx>(
    tx: &mut T,
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
    tx.put_attempt(&AttemptRow {
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
        worker: owner,
    })?;
    refresh_event_state_in(tx, &job.source, &job.event_id, a.finished_at)?;
    Ok(())
}

/// Gives back a job taken but not sent, recording the check asked for
/// it, if any.
fn give_back<T: OutboxTx>(
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

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::StatementStatus;

    /// The take queries run on the writer for every batch a worker takes;
    /// SQLite re-prepares a statement whose LIMIT is a bound parameter at
    /// every run, so theirs is a literal.
    #[test]
    fn the_take_queries_are_prepared_once_not_at_every_take() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("take.db");
        let mut conn = crate::store::open(
            &path,
            crate::config::Durability::Full,
            Duration::from_secs(1),
        )
        .unwrap();
        crate::store::migrate(&mut conn).unwrap();
        let config = Config::parse(
            "[sources.s]\nkind = \"none\"\nallow_unsigned = true\nkey = [\"json:/id\"]\n",
            "unit",
            dir.path(),
            None,
        )
        .unwrap();
        for now in [1_000, 2_000, 3_000] {
            let (taken, _) = take(&mut Sqlite::new(&conn), &config, "w", now).unwrap();
            assert!(taken.is_empty());
        }
        use crate::store::sqlite::{DUE_JOBS, EXPIRED_JOBS};
        for sql in [EXPIRED_JOBS, DUE_JOBS] {
            assert!(sql.ends_with(&format!("LIMIT {TAKE_BATCH}")), "{sql}");
            let stmt = conn.prepare_cached(sql).unwrap();
            assert_eq!(stmt.get_status(StatementStatus::RePrepare), 0, "{sql}");
        }
        // What the literal avoids: the same query with `LIMIT ?`.
        let mut bound = conn
            .prepare(&DUE_JOBS.replace(&format!("LIMIT {TAKE_BATCH}"), "LIMIT ?2"))
            .unwrap();
        for now in [1_000, 2_000] {
            bound.query([now, 16]).unwrap().next().unwrap();
        }
        assert_eq!(bound.get_status(StatementStatus::RePrepare), 2);
    }
}
