//! The PostgreSQL backend ([`Postgres`], `store::backend`'s seam), that
//! `serve` runs on: the claimers (a few threads, each with its own
//! connection, taking every claim waiting in the queue into one group
//! commit, `group::run_group`; the readiness probe is a write through
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
use crate::config::{ActionKind, Config};
use crate::store::backend::{Backend, Claims, Guard, JobCounts, Refusal, StorageGauges};
use crate::store::db::{Db, TxError};
use crate::store::postgres::group::{Op, run_group};
use crate::store::postgres::tx::{EventRow, PgTx, Session, Statements};
use crate::store::postgres::{Settings, Tls};
use crate::store::prune::Batch;
use crate::store::tx::{
    ActionError, Arg, JobTallies, NewAttempt, NewEvent, NewJob, ParamValue, Tx,
};
use crate::store::{StoreError, StoreErrorKind};

/// Claimer threads per instance: one group commits while the next forms.
const CLAIMERS: usize = 2;
/// Claims in one group at most.
const MAX_GROUP: usize = 256;

/// A claim's key: (source, event id).
type Key = (String, String);

/// A delivery's claims waiting for a claimer, with its caller's
/// continuation, as one type for the queue (the claims' own type is the
/// caller's). Answered once: by the claimer after the commit, or by the
/// reaper with a 503 once `busy_timeout` has passed (a hung server). A 503
/// for a claim that then commits is safe: the provider delivers again and
/// gets "duplicate".
trait Waiting: Send + Sync {
    /// The keys the claims insert.
    fn keys(&self) -> Vec<Key>;
    /// What the group needs to know of the claims before they run.
    fn op_shape(&self) -> (Key, usize, Vec<EventRow>);
    /// Runs the claims in `tx`, keeping their outcomes for the answer (a
    /// group run again after a serialization failure runs them again).
    fn run(&self, tx: &mut PgTx<'_>) -> Result<(), StoreError>;
    /// Answers the caller: the kept outcomes after `Ok` (the commit), or
    /// the error; nothing when answered already.
    fn answer(&self, result: Result<(), StoreError>);
    fn answered(&self) -> bool;
    fn deadline(&self) -> Instant;
}

/// The [`Waiting`] of claims of type `C` and a continuation `F`.
struct Queued<C: Claims, F> {
    claims: Arc<C>,
    outcomes: Mutex<Option<Vec<C::Outcome>>>,
    then: Mutex<Option<F>>,
    deadline: Instant,
}

impl<C, F> Waiting for Queued<C, F>
where
    C: Claims,
    F: FnOnce(Result<Vec<C::Outcome>, StoreError>) + Send,
{
    fn keys(&self) -> Vec<Key> {
        let source = self.claims.source();
        (0..self.claims.len())
            .map(|i| (source.to_string(), self.claims.event_id(i).to_string()))
            .collect()
    }

    fn op_shape(&self) -> (Key, usize, Vec<EventRow>) {
        let c = &*self.claims;
        let first = (0..c.len()).map(|i| c.event_id(i)).min().unwrap_or("");
        let rows = (0..c.len()).filter_map(|i| event_row(c, i)).collect();
        (
            (c.source().to_string(), first.to_string()),
            c.savepoints(),
            rows,
        )
    }

    fn run(&self, tx: &mut PgTx<'_>) -> Result<(), StoreError> {
        if self.claims.is_empty() {
            // The readiness probe: a write through a claimer, in its group.
            return tx.probe(crate::time::now_ms());
        }
        let outcomes = self.claims.claim_all(tx)?;
        *self.outcomes.lock().unwrap_or_else(|p| p.into_inner()) = Some(outcomes);
        Ok(())
    }

    fn answer(&self, result: Result<(), StoreError>) {
        let then = self.then.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(then) = then {
            let outcomes = self
                .outcomes
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take();
            then(result.map(|()| outcomes.unwrap_or_default()));
        }
    }

    fn answered(&self) -> bool {
        self.then
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_none()
    }

    fn deadline(&self) -> Instant {
        self.deadline
    }
}

/// No claims: what the readiness probe queues.
struct Probe;

impl Claims for Probe {
    type Outcome = ();
    fn source(&self) -> &str {
        ""
    }
    fn len(&self) -> usize {
        0
    }
    fn event_id(&self, _: usize) -> &str {
        ""
    }
    fn savepoints(&self) -> usize {
        0
    }
    fn claim<T: Tx>(&self, _: usize, _: &mut T) -> Result<(), StoreError> {
        Ok(())
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
    Claim(Arc<dyn Waiting>),
    Refusal(Refusal),
}

/// The claims (and refusal records) waiting for a claimer, and the keys
/// of the claims a claimer is committing now. A claim whose key is being
/// committed by one claimer waits for that commit instead of joining the
/// other claimer's group: there its insert would wait on the first
/// group's transaction, and stall every other claim of its group with it.
#[derive(Default)]
struct Lined {
    jobs: VecDeque<Job>,
    in_flight: HashSet<Key>,
}

impl Job {
    fn keys(&self) -> Vec<Key> {
        match self {
            Job::Claim(waiting) => waiting.keys(),
            Job::Refusal(_) => Vec::new(),
        }
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
struct InFlight<'q> {
    queue: &'q Queue,
    keys: Vec<Key>,
}

impl Drop for InFlight<'_> {
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
    waiting: Mutex<Vec<Arc<dyn Waiting>>>,
}

/// A refusal's record is dropped rather than queued behind this many jobs
/// (SQLite's writer queue holds as many).
const REFUSALS_QUEUED_AT_MOST: usize = 4096;

/// `serve` on PostgreSQL: the claimers, a small pool for reads and the
/// admin API's writes, the LISTEN thread, and (when serve started on a
/// host that refused writes) the migrator waiting for a writable one.
pub struct Postgres {
    /// The URL as the start line names it (no password).
    database: String,
    settings: Settings,
    queue: Arc<Queue>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    pool: Arc<Pool>,
    busy_timeout: Duration,
    commits: Arc<AtomicU64>,
    grouped: Arc<AtomicU64>,
    /// The LISTEN thread and the flag that stops it.
    listener: Mutex<Option<(Arc<AtomicBool>, JoinHandle<()>)>>,
    migrator: Mutex<Option<Migrator>>,
}

/// The thread that migrates once a writable host answers (serve started
/// on a standby or mid-failover), and its flag: set while it waits,
/// cleared to stop it.
pub struct Migrator {
    pub waiting: Arc<AtomicBool>,
    pub thread: JoinHandle<()>,
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
    prepare_actions(&mut tx, config)?;
    Ok((settings, created))
}

/// `check` on PostgreSQL: the migrations, `setup_sql` and every SQL
/// action, in one transaction that is rolled back, so the database is
/// left as it was.
pub fn trial(config: &Config, url: &PostgresUrl) -> Result<(), String> {
    let settings = Settings::from_url(url, config.durability, config.busy_timeout)?;
    let mut client = settings
        .connect()
        .map_err(|e| format!("cannot connect to {url}: {e}"))?;
    let mut tx = client
        .transaction()
        .map_err(|e| format!("{url}: {}", StoreError::from(e)))?;
    migrate_and_set_up(&mut tx, config, url)?;
    prepare_actions(&mut tx, config)
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
fn prepare_actions(client: &mut postgres::Transaction<'_>, config: &Config) -> Result<(), String> {
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

impl Postgres {
    /// Starts the claimers, the reaper and the pool; `migrator` is stopped
    /// with them.
    pub fn start(
        config: Arc<Config>,
        url: &PostgresUrl,
        settings: Settings,
        migrator: Option<Migrator>,
    ) -> Result<Postgres, StoreError> {
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
        Ok(Postgres {
            database: url.to_string(),
            settings,
            queue,
            threads: Mutex::new(threads),
            pool,
            busy_timeout: config.busy_timeout,
            commits,
            grouped,
            listener: Mutex::new(None),
            migrator: Mutex::new(migrator),
        })
    }

    fn push(&self, job: Job) {
        let mut jobs = self.queue.jobs.lock().unwrap_or_else(|p| p.into_inner());
        jobs.jobs.push_back(job);
        drop(jobs);
        self.queue.ready.notify_one();
    }

    fn queued(&self) -> usize {
        self.queue
            .jobs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .jobs
            .len()
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Stops the migrator, the listener, then the claimers once the queue
    /// is empty.
    fn stop_threads(&self) {
        let migrator = self
            .migrator
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(m) = migrator {
            m.waiting.store(false, Ordering::SeqCst);
            let _ = m.thread.join();
        }
        let listener = self
            .listener
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some((stop, thread)) = listener {
            stop.store(true, Ordering::SeqCst);
            let _ = thread.join();
        }
        self.queue.stop.store(true, Ordering::SeqCst);
        self.queue.ready.notify_all();
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|p| p.into_inner()));
        for t in threads {
            let _ = t.join();
        }
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        self.stop_threads();
    }
}

impl Backend for Postgres {
    type Tx<'t> = PgTx<'t>;
    type Session = Session;

    fn describe(&self) -> String {
        self.database.clone()
    }

    fn session(&self) -> Session {
        Session::new(self.settings.clone())
    }

    fn read<T, E: TxError>(&self, f: impl FnOnce(&Db<'_>) -> Result<T, E>) -> Result<T, E> {
        self.pool.with(|client| Ok(super::db::pg_read(client, f)))?
    }

    fn write<T, E>(
        &self,
        mut f: impl FnMut(&Db<'_>) -> Result<T, E> + Send + 'static,
    ) -> Result<T, E>
    where
        T: Send + 'static,
        E: TxError + Send + 'static,
    {
        self.pool
            .with(|client| Ok(super::db::pg_write(client, &mut f)))?
    }

    fn claim_then<C: Claims>(
        &self,
        claims: Arc<C>,
        then: impl FnOnce(Result<Vec<C::Outcome>, StoreError>) + Send + 'static,
    ) {
        let waiting: Arc<dyn Waiting> = Arc::new(Queued {
            claims,
            outcomes: Mutex::new(None),
            then: Mutex::new(Some(then)),
            deadline: Instant::now() + self.busy_timeout,
        });
        self.queue
            .waiting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(waiting.clone());
        self.push(Job::Claim(waiting));
    }

    /// Dropped (false) while the claimers' queue holds
    /// [`REFUSALS_QUEUED_AT_MOST`] jobs or more: a flood of refused requests
    /// (kept ones carry their bodies) never grows it without bound nor
    /// holds back the claims, as SQLite's bounded writer queue does.
    fn record_refusal(&self, refusal: Refusal) -> bool {
        if self.queued() >= REFUSALS_QUEUED_AT_MOST {
            return false;
        }
        self.push(Job::Refusal(refusal));
        true
    }

    /// Ready when the database takes a write now through the claim path: a
    /// probe row written and committed by a claimer, in its next group. A
    /// refused connection answers at once (the claimer cannot connect); a
    /// hung server after `busy_timeout` (the reaper).
    fn ready(&self) -> Result<(), StoreError> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.claim_then(Arc::new(Probe), move |result| {
            let _ = tx.send(result.map(|_| ()));
        });
        rx.recv_timeout(self.busy_timeout + Duration::from_secs(1))
            .unwrap_or_else(|_| Err(timed_out()))
    }

    /// No file sizes (the server owns its storage); the commit groups are
    /// the claimers'.
    fn gauges(&self) -> (Result<JobCounts, StoreError>, StorageGauges) {
        let storage = StorageGauges {
            database_bytes: None,
            wal_bytes: None,
            writer_commits: self.commits.load(Ordering::Relaxed),
            writer_grouped: self.grouped.load(Ordering::Relaxed),
            writer_queue: self.queued(),
        };
        (self.read(crate::store::jobs::gauges), storage)
    }

    fn jobs<T: Send + 'static>(
        &self,
        session: &mut Session,
        _: Guard,
        body: impl for<'t> FnMut(&mut PgTx<'t>) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        session.transaction(body)
    }

    fn jobs_queued(
        &self,
        session: &mut Session,
        _: Guard,
        body: impl for<'t> FnMut(&mut PgTx<'t>) -> Result<(), StoreError> + Send + 'static,
    ) -> Result<(), StoreError> {
        session.transaction(body)
    }

    fn prune(&self, session: &mut Session, batch: Batch) -> Result<(u64, u64), StoreError> {
        session.transaction(|tx| batch.run_postgres(tx.client()))
    }

    fn vacuum_step(&self) -> Result<(i64, i64), StoreError> {
        Ok((-1, 0))
    }

    fn listen(&self, wake: impl Fn() + Send + 'static) {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = listen(self.settings.clone(), wake, stop.clone());
        *self.listener.lock().unwrap_or_else(|p| p.into_inner()) = Some((stop, thread));
    }

    fn stop_bound(&self) -> Option<Duration> {
        Some(self.busy_timeout + Duration::from_secs(5))
    }

    fn stop(&self) {
        self.stop_threads();
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
        let keys: Vec<Key> = batch.iter().flat_map(Job::keys).collect();
        // Held until the group is answered: its keys are free again then.
        let _done = InFlight { queue, keys };
        // Claims already answered 503 (they waited past busy_timeout) are
        // not tried: their callers were told nothing was stored.
        let live: Vec<Job> = batch
            .into_iter()
            .filter(|job| match job {
                Job::Claim(waiting) => !waiting.answered(),
                Job::Refusal(_) => true,
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
type GroupRun = std::thread::Result<Vec<Result<(), StoreError>>>;

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
        run_batch(c, statements, live)
    }));
    if ran
        .as_ref()
        .is_ok_and(|r| crate::store::postgres::group::never_began(r))
    {
        *statements = Statements::default();
        *client = connect_claimer(settings, config).ok();
        if let Some(fresh) = client.as_mut() {
            ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                run_batch(fresh, statements, live)
            }));
        }
    }
    Some(ran)
}

/// Answers each claim of the group its result, after the COMMIT. True when
/// a result failed other than by an SQL error: the connection is not to be
/// trusted and is made again.
fn answer_all(live: Vec<Job>, results: Vec<Result<(), StoreError>>) -> bool {
    let mut broken = false;
    for (job, result) in live.into_iter().zip(results) {
        if let Err(e) = &result
            && e.kind != StoreErrorKind::Other
        {
            broken = true;
        }
        if let Job::Claim(waiting) = job {
            waiting.answer(result);
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
        if let Job::Claim(waiting) = job {
            waiting.answer(Err(e.clone()));
        }
    }
}

/// Answers 503 to every claim still waiting past its deadline, every
/// 50 ms, and forgets the answered ones.
fn reaper(queue: &Queue) {
    while !queue.stop.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(50));
        let now = Instant::now();
        let expired: Vec<Arc<dyn Waiting>> = {
            let mut waiting = queue.waiting.lock().unwrap_or_else(|p| p.into_inner());
            waiting.retain(|p| !p.answered());
            waiting
                .iter()
                .filter(|p| p.deadline() <= now)
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
    jobs: &[Job],
) -> Vec<Result<(), StoreError>> {
    let mut ops: Vec<Op<'_, ()>> = jobs
        .iter()
        .map(|job| match job {
            Job::Claim(waiting) => {
                let (key, savepoints, events) = waiting.op_shape();
                Op {
                    key,
                    savepoints,
                    events,
                    run: Box::new(move |tx: &mut PgTx<'_>| waiting.run(tx)),
                }
            }
            Job::Refusal(r) => Op {
                key: (r.source.clone(), String::new()),
                savepoints: 0,
                events: Vec::new(),
                run: Box::new(move |tx: &mut PgTx<'_>| {
                    tx.insert_delivery(
                        &r.source,
                        None,
                        r.at,
                        r.outcome.as_str(),
                        &r.remote,
                        Some(&r.detail),
                    )?;
                    r.keep(&crate::store::db::Db::postgres(tx.client()))
                }),
            },
        })
        .collect();
    run_group(client, statements, &mut ops)
}

/// The channel forward workers are woken on when jobs were written (by
/// the NOTIFY of the commit that wrote them, `PgTx::commit`).
pub use crate::store::postgres::tx::JOBS_CHANNEL;

/// The event row claim `i` of `claims` inserts, as the claim itself makes
/// it: asked of the claim with a transaction that records its first step
/// (always the insert: the claim never reads first) and stops it there.
/// The group inserts every claim's row with one statement before the
/// claims run.
pub fn event_row<C: Claims>(claims: &C, i: usize) -> Option<EventRow> {
    event_row_of(|tx| claims.claim(i, tx))
}

/// The event row `claim` inserts first, when given a [`FirstStep`].
pub fn event_row_of<R>(claim: impl FnOnce(&mut FirstStep) -> R) -> Option<EventRow> {
    let mut first = FirstStep(None);
    let _ = claim(&mut first);
    first.0
}

/// A [`Tx`] that records the event a claim inserts and fails every step,
/// so the claim stops at its first.
pub struct FirstStep(Option<EventRow>);

fn stopped() -> StoreError {
    StoreError::other("stopped after the claim's first step")
}

impl Tx for FirstStep {
    fn run(&mut self, _: &'static str, _: &[Arg<'_>]) -> Result<u64, StoreError> {
        Err(stopped())
    }
    fn read_i64(&mut self, _: &'static str, _: &[Arg<'_>]) -> Result<Option<i64>, StoreError> {
        Err(stopped())
    }
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
    fn write_attempt(&mut self, _: &NewAttempt<'_>, _: bool) -> Result<(), StoreError> {
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
    fn shared_db(&mut self) -> Option<crate::store::db::Db<'_>> {
        None
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
