//! `serve` on PostgreSQL: the claimers (a few threads, each with its own
//! connection, taking every claim waiting in the queue into one group
//! commit, `pg_group::run_group`; the readiness probe is a write through
//! them), a small pool of connections for the gauges and the admin API,
//! the LISTEN thread (which also folds the job counters), and start-up
//! (migrations, `setup_sql`, the SQL actions prepared once to check them).
//!
//! A caller is answered only after its group committed, or with the
//! error (503) when it could not; a claim that waited in the queue longer
//! than `busy_timeout` (the server unreachable meanwhile) is answered 503
//! without being tried. A connection that failed is dropped and made
//! again for the next group, so a restarted server is used again without
//! restarting idemhook.

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use postgres::Client;

use crate::config::database_url::PostgresUrl;
use crate::config::{ActionKind, Config, Source};
use crate::ingest::{Claim, Outcome, claim_in};
use crate::state::Delivery;
use crate::store::postgres::group::{Op, run_group};
use crate::store::postgres::tx::{EventRow, PgTx, Statements};
use crate::store::postgres::{Settings, Tls};
use crate::store::tx::{ActionError, JobTallies, NewEvent, NewJob, ParamValue, Tx};
use crate::store::{StoreError, StoreErrorKind};

/// Claimer threads per instance: one group commits while the next forms.
const CLAIMERS: usize = 2;
/// Claims in one group at most.
const MAX_GROUP: usize = 256;

/// A caller's continuation: the outcome of each claim it queued, in order.
type Then = Box<dyn FnOnce(Result<Vec<Outcome>, StoreError>) + Send>;

/// Jobs per status, and when the oldest pending job was created.
pub type JobCounts = (Vec<(String, i64)>, Option<i64>);

/// A caller waiting for its claim: answered once, by the claimer after
/// the commit, or by the reaper with a 503 once `busy_timeout` has passed
/// (a hung server). A 503 for a claim that then commits is safe: the
/// provider delivers again and gets "duplicate".
struct Pending {
    then: Mutex<Option<Then>>,
    deadline: Instant,
}

impl Pending {
    fn answer(&self, result: Result<Vec<Outcome>, StoreError>) {
        let then = self.then.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(then) = then {
            then(result);
        }
    }

    fn answered(&self) -> bool {
        self.then
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_none()
    }
}

fn timed_out() -> StoreError {
    StoreError {
        kind: StoreErrorKind::Busy,
        message: "postgres: no commit within busy_timeout".to_string(),
    }
}

enum Job {
    /// One delivery's claims: one event, or every event of a batch (they
    /// commit in one transaction, or fail together).
    Claim {
        source_index: usize,
        claims: Vec<Arc<Claim>>,
        pending: Arc<Pending>,
    },
    Refusal {
        source: String,
        outcome: Delivery,
        remote: String,
        detail: String,
        at: i64,
    },
}

/// The claims (and refusal records) waiting for a claimer, and the keys
/// of the claims a claimer is committing now. A claim whose key is being
/// committed by one claimer waits for that commit instead of joining the
/// other claimer's group: there its insert would wait on the first
/// group's transaction, and stall every other claim of its group with it.
#[derive(Default)]
struct Lined {
    jobs: VecDeque<Job>,
    in_flight: HashSet<(usize, String)>,
}

impl Job {
    fn keys(&self) -> Vec<(usize, String)> {
        match self {
            Job::Claim {
                source_index,
                claims,
                ..
            } => claims
                .iter()
                .map(|c| (*source_index, c.event_id.clone()))
                .collect(),
            Job::Refusal { .. } => Vec::new(),
        }
    }

    /// The savepoints the job's SQL actions may open.
    fn savepoints(&self, config: &Config) -> usize {
        let Job::Claim {
            source_index,
            claims,
            ..
        } = self
        else {
            return 0;
        };
        let Some(source) = config.sources.get(*source_index) else {
            return 0;
        };
        claims
            .iter()
            .map(|claim| {
                source
                    .actions
                    .iter()
                    .filter(|a| {
                        matches!(a.kind, ActionKind::Sql { .. })
                            && a.takes(claim.event_type.as_deref())
                    })
                    .count()
            })
            .sum()
    }
}

impl Lined {
    fn takeable(&self, job: &Job) -> bool {
        job.keys().iter().all(|k| !self.in_flight.contains(k))
    }

    /// Up to `MAX_GROUP` jobs whose keys no claimer is committing, in
    /// queue order; their keys are then in flight.
    fn take_group(&mut self) -> Vec<Job> {
        let mut group = Vec::new();
        let mut held = VecDeque::new();
        while group.len() < MAX_GROUP {
            let Some(job) = self.jobs.pop_front() else {
                break;
            };
            if self.takeable(&job) {
                group.push(job);
            } else {
                held.push_back(job);
            }
        }
        for job in &group {
            self.in_flight.extend(job.keys());
        }
        while let Some(job) = held.pop_back() {
            self.jobs.push_front(job);
        }
        group
    }
}

/// A group's keys, in flight until its claimer is done with it (committed
/// or failed); then a claimer that held claims back for them is woken.
struct Done<'q> {
    queue: &'q Queue,
    keys: Vec<(usize, String)>,
}

impl Drop for Done<'_> {
    fn drop(&mut self) {
        if self.keys.is_empty() {
            return;
        }
        let mut lined = self.queue.jobs.lock().unwrap_or_else(|p| p.into_inner());
        for k in self.keys.drain(..) {
            lined.in_flight.remove(&k);
        }
        drop(lined);
        self.queue.ready.notify_all();
    }
}

struct Queue {
    jobs: Mutex<Lined>,
    ready: Condvar,
    stop: AtomicBool,
    /// Claims not answered yet, for the reaper.
    waiting: Mutex<Vec<Arc<Pending>>>,
}

/// The PostgreSQL storage of a running `serve`.
pub struct PgStore {
    settings: Settings,
    queue: Arc<Queue>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    pool: Arc<Pool>,
    busy_timeout: Duration,
    pub commits: Arc<AtomicU64>,
    pub grouped: Arc<AtomicU64>,
}

/// Pooled connections, with or without TLS (two driver types).
enum Pool {
    Plain(r2d2::Pool<r2d2_postgres::PostgresConnectionManager<postgres::NoTls>>),
    Tls(
        r2d2::Pool<
            r2d2_postgres::PostgresConnectionManager<tokio_postgres_rustls::MakeRustlsConnect>,
        >,
    ),
}

impl Pool {
    fn new(settings: &Settings, timeout: Duration) -> Result<Pool, StoreError> {
        fn build<M: r2d2::ManageConnection<Connection = Client, Error = postgres::Error>>(
            manager: M,
            timeout: Duration,
            setup: String,
        ) -> r2d2::Pool<M> {
            r2d2::Pool::builder()
                .max_size(4)
                .min_idle(Some(0))
                .connection_timeout(timeout.max(Duration::from_millis(500)))
                .connection_customizer(Box::new(crate::store::postgres::SessionSetup(setup)))
                .build_unchecked(manager)
        }
        let setup = settings.session_sql();
        let config = settings.config.clone();
        let pool = match &settings.tls {
            Tls::Plain => Pool::Plain(build(
                r2d2_postgres::PostgresConnectionManager::new(config, postgres::NoTls),
                timeout,
                setup,
            )),
            Tls::Verified(tls) => Pool::Tls(build(
                r2d2_postgres::PostgresConnectionManager::new(config, tls.clone()),
                timeout,
                setup,
            )),
        };
        Ok(pool)
    }

    /// Runs `f` on a pooled connection.
    pub fn with<T>(
        &self,
        f: impl FnOnce(&mut Client) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let unavailable = |e: r2d2::Error| StoreError {
            kind: StoreErrorKind::Io,
            message: format!("postgres: no connection: {e}"),
        };
        match self {
            Pool::Plain(p) => f(&mut *p.get().map_err(unavailable)?),
            Pool::Tls(p) => f(&mut *p.get().map_err(unavailable)?),
        }
    }
}

/// Prepares the database for `serve`: migrations (under their advisory
/// lock), `setup_sql`, and every SQL action prepared once after the
/// rewrite of its parameters, so a typo fails the start, not a delivery.
/// True beside the settings when it made idemhook's tables.
pub fn prepare(config: &Config, url: &PostgresUrl) -> Result<(Settings, bool), String> {
    let settings = Settings::from_url(url, config.durability, config.busy_timeout)?;
    let mut client = settings
        .connect()
        .map_err(|e| format!("cannot connect to {url}: {e}"))?;
    // The migrations and setup_sql in one transaction under the migration
    // lock: instances that start at once take turns (CREATE TABLE IF NOT
    // EXISTS is not safe against a concurrent one in PostgreSQL).
    let mut tx = client
        .transaction()
        .map_err(|e| format!("{url}: {}", StoreError::from(e)))?;
    let created = migrate_and_set_up(&mut tx, config, url)?;
    tx.commit()
        .map_err(|e| format!("{url}: cannot migrate: {}", StoreError::from(e)))?;
    let mut tx = client
        .transaction()
        .map_err(|e| format!("{url}: {}", StoreError::from(e)))?;
    check_actions(&mut tx, config)?;
    Ok((settings, created))
}

/// `check` on PostgreSQL: the migrations, `setup_sql` and every SQL
/// action, in one transaction that is rolled back, so the database is
/// left as it was.
pub fn check(config: &Config, url: &PostgresUrl) -> Result<(), String> {
    let settings = Settings::from_url(url, config.durability, config.busy_timeout)?;
    let mut client = settings
        .connect()
        .map_err(|e| format!("cannot connect to {url}: {e}"))?;
    let mut tx = client
        .transaction()
        .map_err(|e| format!("{url}: {}", StoreError::from(e)))?;
    migrate_and_set_up(&mut tx, config, url)?;
    check_actions(&mut tx, config)
    // Dropped without commit: rolled back.
}

/// The migrations, then `setup_sql`, in the caller's transaction; true
/// when the migrations made idemhook's tables.
fn migrate_and_set_up(
    tx: &mut postgres::Transaction<'_>,
    config: &Config,
    url: &PostgresUrl,
) -> Result<bool, String> {
    // No timeout of busy_timeout's here: waiting for the migration lock (an
    // instance migrating) and a long migration are right; a dead server
    // is still bounded by the connection's TCP timeouts.
    tx.batch_execute("SET LOCAL statement_timeout = 0; SET LOCAL lock_timeout = 0")
        .map_err(|e| format!("{url}: {}", StoreError::from(e)))?;
    let created = crate::store::postgres::migrate_in(tx, url.schema())
        .map_err(|e| format!("{url}: cannot migrate: {e}"))?;
    if let Some(sql) = &config.setup_sql {
        // In the team's search_path: setup_sql makes the team's tables.
        tx.batch_execute(crate::store::postgres::TEAM_PATH)
            .and_then(|()| tx.batch_execute(sql))
            .and_then(|()| tx.batch_execute(crate::store::postgres::OUR_PATH))
            .map_err(|e| format!("setup_sql failed: {}", StoreError::from(e)))?;
    }
    Ok(created)
}

/// Every SQL action rewritten to `$n` and prepared, in the team's
/// search_path as it runs, inside the caller's transaction.
fn check_actions(client: &mut postgres::Transaction<'_>, config: &Config) -> Result<(), String> {
    client
        .batch_execute(crate::store::postgres::TEAM_PATH)
        .map_err(|e| StoreError::from(e).to_string())?;
    for source in &config.sources {
        for action in &source.actions {
            let where_ = format!("sources.{}.actions ({})", source.name, action.name);
            match &action.kind {
                ActionKind::Sql { sql, params } => {
                    let p = crate::store::named::to_positional(sql)
                        .map_err(|e| format!("{where_}.sql: {e}"))?;
                    for name in &p.names {
                        let known = params.iter().any(|(n, _)| n == name)
                            || crate::config::BUILTIN_PARAMS.contains(&name.as_str());
                        if !known {
                            return Err(format!(
                                "{where_}.sql: parameter :{name} is neither in params nor built in"
                            ));
                        }
                    }
                    client
                        .prepare(&p.sql)
                        .map_err(|e| format!("{where_}.sql: {}", StoreError::from(e)))?;
                }
                ActionKind::Forward(_) => {}
            }
        }
    }
    Ok(())
}

impl PgStore {
    pub fn start(config: Arc<Config>, settings: Settings) -> Result<PgStore, StoreError> {
        let queue = Arc::new(Queue {
            jobs: Mutex::new(Lined::default()),
            ready: Condvar::new(),
            stop: AtomicBool::new(false),
            waiting: Mutex::new(Vec::new()),
        });
        let commits = Arc::new(AtomicU64::new(0));
        let grouped = Arc::new(AtomicU64::new(0));
        let mut threads = Vec::new();
        for i in 0..CLAIMERS {
            let (queue, settings, config) = (queue.clone(), settings.clone(), config.clone());
            let (commits, grouped) = (commits.clone(), grouped.clone());
            threads.push(
                std::thread::Builder::new()
                    .name(format!("pg-claimer-{i}"))
                    .spawn(move || claimer(&queue, &settings, &config, &commits, &grouped))
                    .map_err(|e| StoreError::other(format!("cannot start a claimer: {e}")))?,
            );
        }
        {
            let queue = queue.clone();
            threads.push(
                std::thread::Builder::new()
                    .name("pg-reaper".to_string())
                    .spawn(move || reaper(&queue))
                    .map_err(|e| StoreError::other(format!("cannot start the reaper: {e}")))?,
            );
        }
        let pool = Arc::new(Pool::new(&settings, config.busy_timeout)?);
        Ok(PgStore {
            settings,
            queue,
            threads: Mutex::new(threads),
            pool,
            busy_timeout: config.busy_timeout,
            commits,
            grouped,
        })
    }

    /// Queues a claim; `then` gets its outcome after the commit.
    /// Queues a delivery's claims (one event, or a batch's, which commit
    /// together); `then` gets their outcomes after the commit.
    pub fn claim_then(&self, source_index: usize, claims: Vec<Arc<Claim>>, then: Then) {
        let pending = Arc::new(Pending {
            then: Mutex::new(Some(then)),
            deadline: Instant::now() + self.busy_timeout,
        });
        self.queue
            .waiting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(pending.clone());
        self.push(Job::Claim {
            source_index,
            claims,
            pending,
        });
    }

    /// Queues the record of a refused delivery; nobody waits for it.
    pub fn record_refusal(
        &self,
        source: &str,
        outcome: Delivery,
        remote: &str,
        detail: &str,
        at: i64,
    ) {
        self.push(Job::Refusal {
            source: source.to_string(),
            outcome,
            remote: remote.to_string(),
            detail: detail.to_string(),
            at,
        });
    }

    fn push(&self, job: Job) {
        let mut jobs = self.queue.jobs.lock().unwrap_or_else(|p| p.into_inner());
        jobs.jobs.push_back(job);
        drop(jobs);
        self.queue.ready.notify_one();
    }

    pub fn queued(&self) -> usize {
        self.queue
            .jobs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .jobs
            .len()
    }

    /// Ready when the database takes a write now through the claim path: a
    /// probe row written and committed by a claimer, in its next group. A
    /// refused connection answers at once (the claimer cannot connect); a
    /// hung server after `busy_timeout` (the reaper).
    pub fn ready(&self) -> Result<(), StoreError> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.claim_then(
            usize::MAX,
            Vec::new(),
            Box::new(move |result| {
                let _ = tx.send(result.map(|_| ()));
            }),
        );
        rx.recv_timeout(self.busy_timeout + Duration::from_secs(1))
            .unwrap_or_else(|_| Err(timed_out()))
    }

    /// Jobs per status (from the counters the job triggers keep, never a
    /// count over `jobs`) and the oldest pending job's creation (the first
    /// entry of an index), for the gauges.
    pub fn job_counts(&self) -> Result<JobCounts, StoreError> {
        self.pool.with(|c| {
            let rows = c.query("SELECT status, n FROM job_counts", &[])?;
            let counts = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
            let oldest: Option<i64> = c
                .query_one(
                    "SELECT min(created_at) FROM jobs WHERE status = 'pending'",
                    &[],
                )?
                .get(0);
            Ok((counts, oldest))
        })
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Runs `f` on a pooled connection (the admin API's reads and writes).
    pub fn with_client<T>(
        &self,
        f: impl FnOnce(&mut Client) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.pool.with(f)
    }

    /// Stops the claimers once the queue is empty.
    pub fn stop(&self) {
        self.queue.stop.store(true, Ordering::SeqCst);
        self.queue.ready.notify_all();
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|p| p.into_inner()));
        for t in threads {
            let _ = t.join();
        }
    }
}

impl Drop for PgStore {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A claimer thread: takes the next group from the queue, runs the claims
/// still waiting in it as one transaction on its own connection (made
/// again when it broke), and answers each after the COMMIT.
fn claimer(
    queue: &Queue,
    settings: &Settings,
    config: &Config,
    commits: &AtomicU64,
    grouped: &AtomicU64,
) {
    let mut client: Option<Client> = None;
    let mut statements = Statements::default();
    while let Some(batch) = next_group(queue) {
        let keys: Vec<(usize, String)> = batch.iter().flat_map(Job::keys).collect();
        // Held until the group is answered: its keys are free again then.
        let _done = Done { queue, keys };
        // Claims already answered 503 (they waited past busy_timeout) are
        // not tried: their callers were told nothing was stored.
        let live: Vec<Job> = batch
            .into_iter()
            .filter(|job| match job {
                Job::Claim { pending, .. } => !pending.answered(),
                Job::Refusal { .. } => true,
            })
            .collect();
        if live.is_empty() {
            continue;
        }
        if client.is_none() {
            match connect_claimer(settings, config) {
                Ok(c) => {
                    client = Some(c);
                    statements = Statements::default();
                }
                Err(e) => {
                    fail_all(live, &e);
                    // Not a busy loop while the server is down.
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
            }
        }
        let Some(ran) =
            run_group_once_more_if_unbegun(&mut client, &mut statements, settings, config, &live)
        else {
            continue;
        };
        let Ok(results) = ran else {
            crate::log::error("storage operation panicked", &[("effect", &"rolled back")]);
            client = None;
            fail_all(live, &StoreError::other("storage operation panicked"));
            continue;
        };
        commits.fetch_add(1, Ordering::Relaxed);
        grouped.fetch_add(live.len() as u64, Ordering::Relaxed);
        let broken = answer_all(live, results);
        if broken || client.as_ref().is_some_and(Client::is_closed) {
            client = None;
        }
    }
}

/// The next group a claimer takes, waiting until one is takeable; None
/// once the claimers stop and nothing is left in the queue.
fn next_group(queue: &Queue) -> Option<Vec<Job>> {
    let mut lined = queue.jobs.lock().unwrap_or_else(|p| p.into_inner());
    while !lined.jobs.iter().any(|j| lined.takeable(j)) {
        if queue.stop.load(Ordering::SeqCst) && lined.jobs.is_empty() {
            return None;
        }
        lined = queue
            .ready
            .wait_timeout(lined, Duration::from_millis(200))
            .map(|(g, _)| g)
            .unwrap_or_else(|p| p.into_inner().0);
    }
    Some(lined.take_group())
}

/// The outcome of a group, or the panic that ended it.
type GroupRun = std::thread::Result<Vec<Result<Vec<Outcome>, StoreError>>>;

/// Runs the group on the claimer's connection (None when there is none).
/// A panic in a group (a bug) must not end the claimer, or each one would
/// take a claimer with it until every delivery waits out busy_timeout: it
/// comes back as the `Err` of the result, for the group's callers to be
/// answered 503 at once and the connection dropped (rolling back what it
/// had open). A connection that died while idle (a restart, a failover)
/// fails the group at its BEGIN, before anything was sent: the claims are
/// run once more on a fresh connection, so nobody gets a 503 for it.
fn run_group_once_more_if_unbegun(
    client: &mut Option<Client>,
    statements: &mut Statements,
    settings: &Settings,
    config: &Config,
    live: &[Job],
) -> Option<GroupRun> {
    let c = client.as_mut()?;
    let mut ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        run_batch(c, statements, config, live)
    }));
    if ran
        .as_ref()
        .is_ok_and(|r| crate::store::postgres::group::never_began(r))
    {
        *statements = Statements::default();
        *client = connect_claimer(settings, config).ok();
        if let Some(fresh) = client.as_mut() {
            ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                run_batch(fresh, statements, config, live)
            }));
        }
    }
    Some(ran)
}

/// Answers each claim of the group its result, after the COMMIT. True when
/// a result failed other than by an SQL error: the connection is not to be
/// trusted and is made again.
fn answer_all(live: Vec<Job>, results: Vec<Result<Vec<Outcome>, StoreError>>) -> bool {
    let mut broken = false;
    for (job, result) in live.into_iter().zip(results) {
        if let Err(e) = &result
            && e.kind != StoreErrorKind::Other
        {
            broken = true;
        }
        if let Job::Claim { pending, .. } = job {
            pending.answer(result);
        }
    }
    broken
}

/// A claimer's connection: its statements (SQL actions') end at
/// `sql_timeout`, a failed action then, not a failed claim.
fn connect_claimer(settings: &Settings, config: &Config) -> Result<Client, StoreError> {
    let mut client = settings.connect()?;
    if config.sql_timeout != config.busy_timeout {
        client.batch_execute(&format!(
            "SET statement_timeout = {}",
            config.sql_timeout.as_millis().max(1)
        ))?;
    }
    Ok(client)
}

fn fail_all(jobs: Vec<Job>, e: &StoreError) {
    for job in jobs {
        if let Job::Claim { pending, .. } = job {
            pending.answer(Err(e.clone()));
        }
    }
}

/// Answers 503 to every claim still waiting past its deadline, every
/// 50 ms, and forgets the answered ones.
fn reaper(queue: &Queue) {
    while !queue.stop.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(50));
        let now = Instant::now();
        let expired: Vec<Arc<Pending>> = {
            let mut waiting = queue.waiting.lock().unwrap_or_else(|p| p.into_inner());
            waiting.retain(|p| !p.answered());
            waiting
                .iter()
                .filter(|p| p.deadline <= now)
                .cloned()
                .collect()
        };
        for p in expired {
            p.answer(Err(timed_out()));
        }
    }
}

/// One group: the claims and refusal records of `jobs`, in key order.
fn run_batch(
    client: &mut Client,
    statements: &mut Statements,
    config: &Config,
    jobs: &[Job],
) -> Vec<Result<Vec<Outcome>, StoreError>> {
    let mut ops: Vec<Op<'_, Vec<Outcome>>> = jobs
        .iter()
        .map(|job| match job {
            // The readiness probe: a write through a claimer, in its group.
            Job::Claim { claims, .. } if claims.is_empty() => Op {
                key: (String::new(), String::new()),
                savepoints: 0,
                events: Vec::new(),
                run: Box::new(|tx: &mut PgTx<'_>| {
                    tx.probe(crate::time::now_ms())?;
                    Ok(Vec::new())
                }),
            },
            Job::Claim {
                source_index,
                claims,
                ..
            } => {
                let source = config.sources.get(*source_index);
                let first = claims
                    .iter()
                    .map(|c| c.event_id.as_str())
                    .min()
                    .unwrap_or("");
                Op {
                    key: (
                        source.map_or(String::new(), |s| s.name.clone()),
                        first.to_string(),
                    ),
                    savepoints: job.savepoints(config),
                    events: source.map_or_else(Vec::new, |s| {
                        claims.iter().filter_map(|c| event_row(s, c)).collect()
                    }),
                    run: Box::new(move |tx: &mut PgTx<'_>| {
                        let source =
                            source.ok_or_else(|| StoreError::other("source index out of range"))?;
                        claims
                            .iter()
                            .map(|claim| claim_in(tx, source, claim))
                            .collect()
                    }),
                }
            }
            Job::Refusal {
                source,
                outcome,
                remote,
                detail,
                at,
            } => Op {
                key: (source.clone(), String::new()),
                savepoints: 0,
                events: Vec::new(),
                run: Box::new(move |tx: &mut PgTx<'_>| {
                    tx.insert_delivery(source, None, *at, outcome.as_str(), remote, Some(detail))?;
                    // Not a claim: nobody reads its outcome.
                    Ok(Vec::new())
                }),
            },
        })
        .collect();
    run_group(client, statements, &mut ops)
}

/// The channel forward workers are woken on when jobs were written (by
/// the NOTIFY of the commit that wrote them, `PgTx::commit`).
pub use crate::store::postgres::tx::JOBS_CHANNEL;

/// The event row the claim of `c` inserts, as `claim_in` itself makes it:
/// asked of the claim with a transaction that records its first step
/// (always the insert: the claim never reads first) and stops it there.
/// The group inserts every claim's row with one statement before the
/// claims run.
pub fn event_row(source: &Source, c: &Claim) -> Option<EventRow> {
    let mut first = FirstStep(None);
    let _ = claim_in(&mut first, source, c);
    first.0
}

/// A [`Tx`] that records the event a claim inserts and fails every step,
/// so the claim stops at its first.
struct FirstStep(Option<EventRow>);

fn stopped() -> StoreError {
    StoreError::other("stopped after the claim's first step")
}

impl Tx for FirstStep {
    fn insert_event(&mut self, e: &NewEvent<'_>) -> Result<bool, StoreError> {
        self.0 = Some(EventRow::of(e));
        Err(stopped())
    }
    fn event_state_and_hash(&mut self, _: &str, _: &str) -> Result<(String, String), StoreError> {
        Err(stopped())
    }
    fn insert_mismatch(
        &mut self,
        _: &str,
        _: &str,
        _: i64,
        _: &str,
        _: &str,
        _: &[u8],
    ) -> Result<(), StoreError> {
        Err(stopped())
    }
    fn insert_delivery(
        &mut self,
        _: &str,
        _: Option<&str>,
        _: i64,
        _: &str,
        _: &str,
        _: Option<&str>,
    ) -> Result<(), StoreError> {
        Err(stopped())
    }
    fn insert_job(&mut self, _: &NewJob<'_>) -> Result<i64, StoreError> {
        Err(stopped())
    }
    fn insert_sql_attempt(
        &mut self,
        _: i64,
        _: i64,
        _: i64,
        _: &str,
        _: Option<&str>,
    ) -> Result<(), StoreError> {
        Err(stopped())
    }
    fn is_paused(&mut self, _: &str, _: &str) -> Result<bool, StoreError> {
        Err(stopped())
    }
    fn job_tallies(&mut self, _: &str, _: &str) -> Result<JobTallies, StoreError> {
        Err(stopped())
    }
    fn set_event_state(&mut self, _: &str, _: &str, _: &str, _: i64) -> Result<(), StoreError> {
        Err(stopped())
    }
    fn in_savepoint<T, E: From<StoreError>>(
        &mut self,
        _: &'static str,
        _: impl FnOnce(&mut Self) -> Result<T, E>,
    ) -> Result<T, E> {
        Err(stopped().into())
    }
    fn execute_action(
        &mut self,
        _: &str,
        _: impl FnMut(&str) -> Option<ParamValue>,
    ) -> Result<(), ActionError> {
        Err(ActionError::Store(stopped()))
    }
}

/// How often each instance folds the job counters' changes.
const FOLD_EVERY: Duration = Duration::from_secs(2);

/// One fold of the job counters on `folder`, connected when needed and
/// dropped when it fails (a read-only host, a restart): the next fold
/// connects again.
fn fold_job_counts(settings: &Settings, folder: &mut Option<Client>) {
    if folder.is_none() {
        *folder = settings.connect().ok();
    }
    if let Some(c) = folder
        && c.batch_execute(crate::store::postgres::FOLD_JOB_COUNTS)
            .is_err()
    {
        *folder = None;
    }
}

/// Listens for new forward jobs written by any instance and wakes this
/// instance's workers; connects again after a failure. Never needed for
/// correctness: the workers poll as well. Beside it, on a connection of
/// its own, it folds the job counters' changes every [`FOLD_EVERY`].
pub fn listen(
    settings: Settings,
    wake: impl Fn() + Send + 'static,
    stop: Arc<AtomicBool>,
) -> JoinHandle<()> {
    std::thread::Builder::new()
        .name("pg-listen".to_string())
        .spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                let mut client = match settings.connect() {
                    Ok(c) => c,
                    Err(_) => {
                        std::thread::sleep(Duration::from_millis(500));
                        continue;
                    }
                };
                if client
                    .batch_execute(&format!("LISTEN {JOBS_CHANNEL}"))
                    .is_err()
                {
                    continue;
                }
                // Anything missed while not listening is found by polling.
                wake();
                let mut folded = std::time::Instant::now();
                let mut folder: Option<Client> = None;
                loop {
                    if stop.load(Ordering::SeqCst) {
                        return;
                    }
                    // The job counters' appended changes, folded now and
                    // then (on a connection of its own: this one only
                    // listens), so reading the counts stays a few rows.
                    if folded.elapsed() >= FOLD_EVERY {
                        folded = std::time::Instant::now();
                        fold_job_counts(&settings, &mut folder);
                    }
                    let next = {
                        let mut notifications = client.notifications();
                        let mut iter = notifications.timeout_iter(Duration::from_millis(250));
                        fallible_iterator::FallibleIterator::next(&mut iter).map(|n| n.is_some())
                    };
                    match next {
                        Ok(true) => wake(),
                        Ok(false) => {}
                        Err(_) => break,
                    }
                    if client.is_closed() {
                        break;
                    }
                }
            }
        })
        .unwrap_or_else(|_| std::thread::spawn(|| {}))
}
