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
//! may have reached the downstream, is asked about first (`ask.rs`),
//! under the same lease: 200 is done without a send (`confirmed`), 404
//! sends, anything else is a retry (`check`) with nothing sent.
//!
//! A job fails for good once its attempts have failed for its action's
//! `give_up_after` (or used up an optional `max_attempts`). An action whose
//! downstream keeps failing opens its circuit (`circuit.rs`): its jobs
//! wait (pending, `waiting = 'circuit'`) while one probe at a time finds
//! out when the downstream is back.
//!
//! Job life cycle:
//! ```text
//!   (claim) --> pending --take--> processing --2xx (or check 200)--> done
//!               ^  |                |  |
//!   pause/resume|  v   retryable &  |  +--4xx or give_up_after-----> failed
//!             paused   time left    |                                  |
//!               ^                   v                                  |
//!               +------------- pending (next_attempt_at = backoff) <---+ replay
//!
//!   pending (after: a named job not done) --take--> parked (pending, no
//!   due time) --any job of the event done (trigger)--> pending, due now
//! ```
//! Takes and completions go through the storage (`store::backend`: on
//! SQLite the one writer, on PostgreSQL each worker's own connection); the
//! HTTP call happens outside any transaction.
//!
//! This file starts and stops the workers and holds what they share;
//! `worker.rs` is one worker's loop (take, check, call, record) and
//! `steps.rs` the transaction steps it runs through the storage.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::config::{ActionKind, Config};
use crate::metrics::Metrics;
use crate::outbox::retry::Verdict;
use crate::store::backend::{Backend, Guard};
use crate::store::tx::OutboxTx;
use crate::time::now_ms;
use crate::verify::Verifier;

pub mod ask;
pub mod circuit;
mod control;
pub(crate) mod dest;
pub mod dns;
pub mod retry;
mod steps;
mod worker;

pub(crate) use steps::record_check_in;
use worker::Worker;

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

    /// Wakes one sleeping worker (new jobs were committed): it takes its
    /// share and, when that was a full share, wakes the next, so a wake-up
    /// costs one worker's look at the jobs, not every worker's.
    pub fn wake(&self) {
        if let Ok(mut g) = self.0.generation.lock() {
            *g = g.wrapping_add(1);
            self.0.cv.notify_one();
        }
    }

    /// Wakes every sleeping worker (the outbox stops).
    fn wake_all(&self) {
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
    pub fn start<B: Backend>(
        config: Arc<Config>,
        backend: Arc<B>,
        metrics: Arc<Metrics>,
    ) -> Result<Outbox> {
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
        let signers = signers(&config)?;
        let dests = Arc::new(dest::Destinations::new(&config, n, &signers)?);
        let agent = http_agent(n);
        if any_forward {
            // Jobs parked waiting for an `after` action are released by a
            // trigger when that action's job is done; one parked under a
            // config that has since changed is looked at again here.
            let now = now_ms();
            backend
                .jobs(&mut backend.session(), Guard::Savepoint, move |tx| {
                    tx.release_parked(now)
                })
                .context("cannot release the jobs waiting for other actions")?;
            // Circuits of actions that no longer have one close; jobs
            // waiting on a circuit that is not open are due.
            let config = config.clone();
            backend
                .jobs(&mut backend.session(), Guard::Savepoint, move |tx| {
                    circuit::close_unconfigured(tx, &config, now)
                })
                .context("cannot close the circuits of actions without one")?;
        }
        let clean = Arc::new(circuit::Clean::default());
        let held = Arc::new(worker::Held::default());
        let nonce = fastrand::u32(..);
        let mut workers = Vec::with_capacity(n);
        for i in 0..n {
            let worker = Worker {
                owner: format!("{}-{nonce:08x}-w{i}", std::process::id()),
                config: config.clone(),
                session: Mutex::new(backend.session()),
                backend: backend.clone(),
                metrics: metrics.clone(),
                agent: agent.clone(),
                dests: dests.clone(),
                waker: waker.clone(),
                stop: stop.clone(),
                in_flight: in_flight.clone(),
                clean: clean.clone(),
                held: held.clone(),
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
        self.waker.wake_all();
        for w in self.workers {
            let _ = w.join();
        }
    }
}

/// The HTTP agent of forward workers (and of `reconcile --check`), for
/// `workers` threads: no redirects, statuses as answers, the cached resolver.
pub(crate) fn http_agent(workers: usize) -> ureq::Agent {
    agent_with_tls(workers, None)
}

/// [`http_agent`] with an action's own TLS settings (`dest::client`).
pub(crate) fn agent_with_tls(workers: usize, tls: Option<ureq::tls::TlsConfig>) -> ureq::Agent {
    let mut builder = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(0)
        .max_idle_connections(64.max(workers * 2))
        .max_idle_connections_per_host(workers.max(1) * 2)
        .user_agent(concat!("idemhook/", env!("CARGO_PKG_VERSION")));
    if let Some(tls) = tls {
        builder = builder.tls_config(tls);
    }
    ureq::Agent::with_parts(
        builder.build(),
        ureq::unversioned::transport::DefaultConnector::new(),
        crate::outbox::dns::Resolver::default(),
    )
}

/// Standard Webhooks signers for actions with a `sign_secret`.
pub(crate) fn signers(config: &Config) -> Result<HashMap<(String, String), Verifier>> {
    let mut out = HashMap::new();
    for s in &config.sources {
        for a in &s.actions {
            if let ActionKind::Forward(f) = &a.kind
                && let Some(secret) = &f.sign_secret
            {
                let v = Verifier::new(
                    crate::config::presets::standard(),
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
    /// When its attempts started failing (`give_up_after`'s clock).
    failing_since: Option<i64>,
    /// Its failed attempts that were a probe (not counted).
    probe_failures: i64,
    /// This attempt is its action's circuit probe.
    probe: bool,
}

/// An open circuit's probe by its `health` GET, claimed by this worker.
#[derive(Debug)]
struct HealthProbe {
    source: String,
    action: String,
    url: String,
    timeout: Duration,
}

/// What one take leased: jobs, health probes, and when to look again.
struct Taken {
    jobs: Vec<Leased>,
    health: Vec<HealthProbe>,
    next_due: Option<i64>,
}

/// What one attempt came to.
pub(crate) struct Attempt {
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

impl Attempt {
    /// An attempt started at `started_at` that has come to nothing yet: a
    /// retry unless the destination says otherwise.
    pub(crate) fn started(started_at: i64) -> Attempt {
        Attempt {
            started_at,
            finished_at: started_at,
            http_status: None,
            error_kind: None,
            error: None,
            request_id: None,
            response_head: None,
            retry_after: None,
            verdict: Verdict::Retry,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::steps::take;
    use super::*;
    use crate::store::sqlite::SqliteTx;
    use crate::store::tx::TAKE_BATCH;
    use rusqlite::StatementStatus;

    /// The take queries run on the writer for every batch a worker takes;
    /// SQLite re-prepares a statement whose LIMIT is a bound parameter at
    /// every run, so theirs is a literal.
    #[test]
    fn the_take_queries_are_prepared_once_not_at_every_take() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("take.db");
        let mut conn = crate::store::sqlite::open(
            &path,
            crate::config::Durability::Full,
            Duration::from_secs(1),
        )
        .unwrap();
        crate::store::sqlite::migrate(&mut conn).unwrap();
        let config = Config::parse(
            "[sources.s]\nkind = \"none\"\nallow_unsigned = true\nkey = [\"json:/id\"]\n",
            "unit",
            dir.path(),
            None,
        )
        .unwrap();
        for now in [1_000, 2_000, 3_000] {
            let taken = take(
                &mut SqliteTx::new(&conn),
                &config,
                "w",
                now,
                TAKE_BATCH,
                &Default::default(),
            )
            .unwrap();
            assert!(taken.jobs.is_empty());
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

    /// An open circuit with 100,000 jobs waiting on it costs a take what
    /// one with 10 does: the waiting jobs are out of the take query's way
    /// and the probe's pick is one step down `jobs_circuit` (counted in
    /// SQLite VM steps, so the test does not depend on the machine).
    #[test]
    fn an_open_circuit_with_100000_waiting_jobs_costs_a_take_nothing_more() {
        use std::sync::atomic::{AtomicU64, Ordering};
        let config = Config::parse(
            "[sources.s]\nkind = \"none\"\nallow_unsigned = true\nkey = [\"json:/id\"]\n\
             [[sources.s.actions]]\nname = \"a\"\nforward = \"http://127.0.0.1:9/\"\n",
            "unit",
            std::path::Path::new("/"),
            None,
        )
        .unwrap();
        let steps_of_a_take = |waiting: i64| -> (u64, Duration) {
            let dir = tempfile::tempdir().unwrap();
            let mut conn = crate::store::sqlite::open(
                &dir.path().join("waiting.db"),
                crate::config::Durability::Normal,
                Duration::from_secs(5),
            )
            .unwrap();
            crate::store::sqlite::migrate(&mut conn).unwrap();
            conn.execute_batch(&format!(
                "INSERT INTO circuits (source, action, failures, opened_at, next_probe_at, probes,
                                       opened_count, updated_at)
                 VALUES ('s', 'a', 5, 1000, 2000, 0, 1, 1000);
                 WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {waiting})
                 INSERT INTO jobs (source, event_id, action, kind, status, next_attempt_at,
                                   created_at, updated_at, waiting)
                 SELECT 's', 'e' || i, 'a', 'forward', 'pending', NULL, i, i, 'circuit' FROM n;
                 ANALYZE;"
            ))
            .unwrap();
            // Warm the statement cache, then count one take's steps.
            take(
                &mut SqliteTx::new(&conn),
                &config,
                "w",
                1_500,
                TAKE_BATCH,
                &Default::default(),
            )
            .unwrap();
            let steps = std::sync::Arc::new(AtomicU64::new(0));
            let counter = steps.clone();
            conn.progress_handler(
                1,
                Some(move || {
                    counter.fetch_add(1, Ordering::Relaxed);
                    false
                }),
            )
            .unwrap();
            let clock = std::time::Instant::now();
            let taken = take(
                &mut SqliteTx::new(&conn),
                &config,
                "w",
                1_500,
                TAKE_BATCH,
                &Default::default(),
            )
            .unwrap();
            let took = clock.elapsed();
            assert!(taken.jobs.is_empty(), "the probe is not due yet");
            assert_eq!(taken.next_due, Some(2_000), "the next look is the probe's");
            (steps.load(Ordering::Relaxed), took)
        };
        let (few, _) = steps_of_a_take(10);
        let (many, took) = steps_of_a_take(100_000);
        assert!(
            few > 0 && many <= few + few / 2,
            "a take with 100,000 jobs waiting ran {many} VM steps, with 10 {few}"
        );
        eprintln!("take with 100,000 jobs waiting on an open circuit: {many} VM steps, {took:?}");
    }
}
