//! The seam between the claim's decisions (`ingest.rs`: who owns an event,
//! which actions run, the event's state) and a backend's SQL. [`Tx`] is
//! one open transaction of a backend; each method is one storage step.
//! A step whose statement both backends run as written is written here
//! once, over the table module's statement (`?N`) and the two primitives
//! each wing implements ([`Tx::run`], [`Tx::read_i64`]); a wing writes
//! only the steps whose SQL or reading differs (the event insert, the
//! tallies, the takes, SQL actions). The claim is generic over it, so each
//! backend gets its own compiled claim: no dynamic dispatch and no
//! allocation per step on the hot path.

use super::StoreError;
use crate::state::{JobKind, JobStatus};
use crate::store::{attempts, deliveries, events, jobs, paused};

/// A parameter of a statement written once for both backends, borrowed:
/// each wing binds it as its driver's type, with no allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arg<'a> {
    Null,
    Int(i64),
    Text(&'a str),
}

impl From<i64> for Arg<'_> {
    fn from(v: i64) -> Self {
        Arg::Int(v)
    }
}

impl<'a> From<&'a str> for Arg<'a> {
    fn from(v: &'a str) -> Self {
        Arg::Text(v)
    }
}

impl<'a, T: Into<Arg<'a>>> From<Option<T>> for Arg<'a> {
    fn from(v: Option<T>) -> Self {
        v.map_or(Arg::Null, Into::into)
    }
}

/// A new event row, as the claim inserts it.
pub struct NewEvent<'a> {
    pub source: &'a str,
    pub event_id: &'a str,
    pub event_type: Option<&'a str>,
    pub state: &'a str,
    pub received_at: i64,
    pub completed_at: Option<i64>,
    pub payload: &'a [u8],
    pub content_type: Option<&'a str>,
    pub headers: &'a str,
    pub payload_hash: &'a str,
    pub verified_with: Option<i64>,
    pub signed_at: Option<i64>,
}

/// A new job row.
pub struct NewJob<'a> {
    pub source: &'a str,
    pub event_id: &'a str,
    pub action: &'a str,
    pub kind: JobKind,
    pub status: JobStatus,
    pub n_attempts: i64,
    pub next_attempt_at: Option<i64>,
    pub last_error: Option<&'a str>,
    pub created_at: i64,
    /// A forward job of an action with `order`: its order key. It goes
    /// to the end of its key's unfinished jobs, and waits (no due time,
    /// `waiting = 'order'`) while one of them is there.
    pub order_key: Option<&'a str>,
}

/// The unfinished jobs of one order key: the WHERE of the `jobs_order`
/// partial index, repeated so that a query can use it, with the given
/// placeholders for the source, the action and the order key.
pub fn order_open(source: &str, action: &str, key: &str) -> String {
    format!(
        "source = {source} AND action = {action} AND order_key = {key}
         AND order_key IS NOT NULL AND status IN ('pending', 'processing', 'failed', 'paused')"
    )
}

/// Inserts a job of no order key (?10, NULL here, keeps the parameters
/// those of [`ordered_job_insert`]).
pub const JOB_INSERT: &str =
    "INSERT INTO jobs (source, event_id, action, kind, status, n_attempts, next_attempt_at,
                       last_error, created_at, updated_at, order_key)
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?9, ?10)";

/// Inserts a job of an order key (?10) at the end of its key's unfinished
/// jobs, due at ?7 unless one of them is there (then it waits for
/// `order`). Both lookups are one step down the `jobs_order` index.
pub fn ordered_job_insert() -> &'static str {
    static SQL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SQL.get_or_init(|| {
        let open = order_open("?1", "?3", "?10");
        format!(
            "INSERT INTO jobs (source, event_id, action, kind, status, n_attempts, next_attempt_at,
                           last_error, created_at, updated_at, order_key, order_seq, waiting)
         SELECT CAST(?1 AS TEXT), CAST(?2 AS TEXT), CAST(?3 AS TEXT), CAST(?4 AS TEXT),
                CAST(?5 AS TEXT), CAST(?6 AS BIGINT),
                CASE WHEN o.seq IS NULL THEN CAST(?7 AS BIGINT) END, CAST(?8 AS TEXT),
                CAST(?9 AS BIGINT), CAST(?9 AS BIGINT), CAST(?10 AS TEXT),
                coalesce(o.seq, 0) + 1, CASE WHEN o.seq IS NOT NULL THEN 'order' END
           FROM (SELECT max(order_seq) AS seq FROM jobs WHERE {open}) AS o"
        )
    })
}

/// An event's jobs, counted for its state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobTallies {
    pub failed: i64,
    /// Pending, processing or paused.
    pub open: i64,
    /// Processing, or with an attempt.
    pub started: i64,
}

/// A value bound to an SQL action's `:name` parameter, before a backend
/// turns it into its own type.
#[derive(Debug, Clone, PartialEq)]
pub enum ParamValue {
    Null,
    Bool(bool),
    Integer(i64),
    /// Any other JSON number, as written (digits kept: serde_json is built
    /// with arbitrary_precision). SQLite stores it as a REAL, PostgreSQL
    /// as the parameter's type (numeric exactly).
    Number(String),
    Text(String),
    /// A JSON object or array, as compact JSON text.
    Json(String),
    /// The raw body (`:payload`): text, except into a json or jsonb
    /// parameter, which gets the body itself as JSON (not a JSON string).
    Document(String),
}

/// Why an SQL action failed: its own statement (the action's bug, recorded
/// on its job) or storage (the whole claim fails and is answered 503).
#[derive(Debug, thiserror::Error)]
pub enum ActionError {
    #[error("{0}")]
    Statement(String),
    #[error("{0}")]
    Store(StoreError),
}

impl From<StoreError> for ActionError {
    fn from(e: StoreError) -> ActionError {
        ActionError::Store(e)
    }
}

/// One open transaction of a backend: the storage steps of a claim.
pub trait Tx {
    /// Inserts the event unless its (source, event_id) is stored; true
    /// when this call inserted it (the claim is won). Never reads first.
    fn insert_event(&mut self, e: &NewEvent<'_>) -> Result<bool, StoreError>;

    /// The stored event's state and payload hash.
    fn event_state_and_hash(
        &mut self,
        source: &str,
        event_id: &str,
    ) -> Result<(String, String), StoreError>;

    /// Records a payload mismatch incident, with the body that did not
    /// match.
    #[allow(clippy::too_many_arguments)]
    fn insert_mismatch(
        &mut self,
        source: &str,
        event_id: &str,
        created_at: i64,
        payload_hash: &str,
        detail: &str,
        payload: &[u8],
    ) -> Result<(), StoreError>;

    /// Records one delivery.
    #[allow(clippy::too_many_arguments)]
    fn insert_delivery(
        &mut self,
        source: &str,
        event_id: Option<&str>,
        received_at: i64,
        outcome: &str,
        remote: &str,
        detail: Option<&str>,
    ) -> Result<(), StoreError> {
        insert_delivery_now(self, source, event_id, received_at, outcome, remote, detail)
    }

    /// Inserts a job and returns its id.
    fn insert_job(&mut self, j: &NewJob<'_>) -> Result<i64, StoreError>;

    /// Runs a statement the root writes once for both backends (a table
    /// module's, `?N`): how many rows it changed.
    fn run(&mut self, sql: &'static str, args: &[Arg<'_>]) -> Result<u64, StoreError>;

    /// The first column of the first row of such a statement, as an
    /// integer (a boolean as 0 or 1); None for no row or NULL.
    fn read_i64(&mut self, sql: &'static str, args: &[Arg<'_>]) -> Result<Option<i64>, StoreError>;

    /// Writes an attempt's row (`store::attempts::PUT`): over the job's
    /// attempt of the same number when `replace`, else not at all if
    /// there is one.
    fn write_attempt(&mut self, a: &NewAttempt<'_>, replace: bool) -> Result<(), StoreError>;

    /// Records an SQL action's one attempt.
    fn insert_sql_attempt(
        &mut self,
        job_id: i64,
        started_at: i64,
        finished_at: i64,
        outcome: &str,
        error: Option<&str>,
    ) -> Result<(), StoreError> {
        self.write_attempt(
            &NewAttempt::of_sql(job_id, started_at, finished_at, outcome, error),
            false,
        )
    }

    /// Whether an operator paused this action.
    fn is_paused(&mut self, source: &str, action: &str) -> Result<bool, StoreError> {
        let paused = self.read_i64(paused::IS_PAUSED, &[source.into(), action.into()])?;
        Ok(paused.is_some())
    }

    /// The event's jobs, counted by what decides its state.
    fn job_tallies(&mut self, source: &str, event_id: &str) -> Result<JobTallies, StoreError>;

    /// Sets the event's state (and completed_at when it becomes completed,
    /// cleared otherwise), unless it is that state already.
    fn set_event_state(
        &mut self,
        source: &str,
        event_id: &str,
        state: &str,
        now: i64,
    ) -> Result<(), StoreError>;

    /// Runs `body`, one SQL action, inside a savepoint: released on Ok,
    /// rolled back on Err, so a failure undoes only what `body` did. On
    /// PostgreSQL `body` runs in the team's search_path, so it runs the
    /// action's statement and nothing of idemhook's.
    fn in_savepoint<T, E: From<StoreError>>(
        &mut self,
        name: &'static str,
        body: impl FnOnce(&mut Self) -> Result<T, E>,
    ) -> Result<T, E>;

    /// Runs an SQL action's statement, each `:name` parameter bound to
    /// `value_of(name)` (None: an unknown parameter, a statement error).
    fn execute_action(
        &mut self,
        sql: &str,
        value_of: impl FnMut(&str) -> Option<ParamValue>,
    ) -> Result<(), ActionError>;

    /// The open transaction as the shared query layer, for the steps
    /// written once for both backends that ride along a claim or an
    /// outbox step (`notify::raise`); None where no database is behind it.
    fn shared_db(&mut self) -> Option<crate::store::db::Db<'_>>;
}

/// Jobs one worker takes at once: enough to spread the cost of a take over
/// several sends (W4: 8 gave ~3,500-4,000 forwarded/s, 16 ~4,000, 32
/// ~4,200), few enough that a slow downstream does not sit on many leases.
/// Written into the take queries as a literal: SQLite re-prepares a
/// statement whose `LIMIT` is a bound parameter at every run (the planner
/// uses the value), which was 1.5% of the writer's time in W4.
pub const TAKE_BATCH: usize = 16;

/// A forward job that looks takeable, before the conditional UPDATE
/// decides.
#[derive(Debug, Clone)]
pub struct Candidate {
    pub job_id: i64,
    pub source: String,
    pub event_id: String,
    pub action: String,
    pub n_before: i64,
    /// When the job was last leased or changed.
    pub leased_at: i64,
    pub previous_owner: Option<String>,
    /// Pending and due (not a lease that ran out).
    pub pending: bool,
    /// When its attempts started failing (`give_up_after`'s clock).
    pub failing_since: Option<i64>,
    /// Its failed attempts that were a circuit's probe.
    pub probe_failures: i64,
}

/// What a forward needs of its event.
pub struct ForwardEvent {
    pub event_type: Option<String>,
    /// None once erased or pruned.
    pub body: Option<Vec<u8>>,
    pub content_type: Option<String>,
}

/// One attempt's row, as the claim (an SQL action's) or a worker records
/// it (`store::attempts::PUT`).
pub struct NewAttempt<'a> {
    pub job_id: i64,
    pub n: i64,
    pub started_at: i64,
    pub finished_at: i64,
    pub outcome: &'a str,
    pub http_status: Option<i64>,
    pub error: Option<&'a str>,
    pub error_kind: Option<&'a str>,
    pub request_id: Option<&'a str>,
    pub response_head: Option<&'a str>,
    pub worker: Option<&'a str>,
}

impl<'a> NewAttempt<'a> {
    /// An SQL action's one attempt, run inside the claim: `error` when its
    /// statement failed (kind `sql`).
    pub fn of_sql(
        job_id: i64,
        started_at: i64,
        finished_at: i64,
        outcome: &'a str,
        error: Option<&'a str>,
    ) -> NewAttempt<'a> {
        NewAttempt {
            job_id,
            n: 1,
            started_at,
            finished_at,
            outcome,
            http_status: None,
            error,
            error_kind: error.map(|_| "sql"),
            request_id: None,
            response_head: None,
            worker: None,
        }
    }

    /// The record of an attempt cut short (its worker crashed or hung), as
    /// the takeover after its lease writes it.
    pub fn cut_short(
        job_id: i64,
        n: i64,
        started_at: i64,
        now: i64,
        worker: Option<&'a str>,
    ) -> NewAttempt<'a> {
        NewAttempt {
            job_id,
            n,
            started_at,
            finished_at: now,
            outcome: "retry",
            http_status: None,
            error: Some(
                "the lease expired before the attempt was recorded (worker crashed or hung)",
            ),
            error_kind: Some("lease"),
            request_id: None,
            response_head: None,
            worker,
        }
    }
}

/// One question to a `check` URL, as recorded.
pub struct CheckRow<'a> {
    pub job_id: i64,
    pub n: i64,
    pub asked_at: i64,
    pub finished_at: i64,
    pub answer: &'a str,
    pub http_status: Option<i64>,
    pub error: Option<&'a str>,
    pub worker: &'a str,
}

/// The storage steps of the outbox (take, complete, release), in an open
/// transaction of a backend. The decisions are `outbox/`'s.
/// Writes a delivery row at once: [`Tx::insert_delivery`]'s default, and
/// what a backend that gathers rows for a group does outside one.
#[allow(clippy::too_many_arguments)]
pub fn insert_delivery_now<T: Tx + ?Sized>(
    tx: &mut T,
    source: &str,
    event_id: Option<&str>,
    received_at: i64,
    outcome: &str,
    remote: &str,
    detail: Option<&str>,
) -> Result<(), StoreError> {
    tx.run(
        deliveries::INSERT,
        &[
            source.into(),
            event_id.into(),
            received_at.into(),
            outcome.into(),
            remote.into(),
            detail.into(),
        ],
    )?;
    Ok(())
}

pub trait OutboxTx: Tx {
    /// The open transaction as the operator side's query layer, for the
    /// steps written once for both backends (`outbox::control`).
    fn db(&mut self) -> crate::store::db::Db<'_>;
    /// The time a take decides by (leases, due times), in unix ms: the
    /// database's clock where several machines share the jobs, so that a
    /// skewed clock on one instance cannot take a job whose lease another
    /// still holds; `local` (this process's) where there is one writer.
    fn clock(&mut self, local: i64) -> Result<i64, StoreError> {
        Ok(local)
    }
    /// The open circuits, read once per take (a handful of rows at most).
    fn open_circuits(&mut self) -> Result<Vec<crate::store::circuits::CircuitRow>, StoreError> {
        crate::store::circuits::open(&self.db())
    }
    /// Forward jobs whose lease ran out, at most [`TAKE_BATCH`].
    fn expired_jobs(&mut self, now: i64) -> Result<Vec<Candidate>, StoreError>;
    /// Pending forward jobs that are due, the longest-due first, at most
    /// [`TAKE_BATCH`] (on PostgreSQL, rows another instance is taking are
    /// skipped).
    fn due_jobs(&mut self, now: i64) -> Result<Vec<Candidate>, StoreError>;
    /// The actions of an event whose jobs are not done, with their status.
    fn open_jobs_of_event(
        &mut self,
        source: &str,
        event_id: &str,
    ) -> Result<Vec<(String, JobStatus)>, StoreError>;
    /// Parks a pending job: no due time, the reason in last_error.
    fn park(
        &mut self,
        job_id: i64,
        n_attempts: i64,
        reason: &str,
        now: i64,
    ) -> Result<(), StoreError> {
        self.run(
            jobs::PARK,
            &[job_id.into(), n_attempts.into(), reason.into(), now.into()],
        )?;
        Ok(())
    }
    /// The lease, decided by a conditional UPDATE: true when this worker
    /// took the job.
    fn lease(
        &mut self,
        job_id: i64,
        owner: &str,
        lease_until: i64,
        now: i64,
        n_before: i64,
    ) -> Result<bool, StoreError> {
        let won = self.run(
            jobs::LEASE,
            &[
                job_id.into(),
                owner.into(),
                lease_until.into(),
                now.into(),
                n_before.into(),
            ],
        )?;
        Ok(won == 1)
    }
    /// Attempts made up to the job's last operator replay.
    fn replay_budget_base(&mut self, job_id: i64) -> Result<i64, StoreError> {
        let n = self.read_i64(attempts::REPLAY_BUDGET_BASE, &[job_id.into()])?;
        Ok(n.unwrap_or(0))
    }
    /// Whether attempt `n` of the job was recorded.
    fn attempt_exists(&mut self, job_id: i64, n: i64) -> Result<bool, StoreError> {
        let exists = self.read_i64(attempts::EXISTS, &[job_id.into(), n.into()])?;
        Ok(exists.is_some_and(|v| v != 0))
    }
    /// Records an attempt cut short by a lost lease (unless recorded).
    fn record_cut_short(
        &mut self,
        job_id: i64,
        n: i64,
        started_at: i64,
        now: i64,
        worker: Option<&str>,
    ) -> Result<(), StoreError> {
        self.write_attempt(
            &NewAttempt::cut_short(job_id, n, started_at, now, worker),
            false,
        )
    }
    /// Where the job's latest replay came from, if it was replayed.
    fn latest_replay_from(&mut self, job_id: i64) -> Result<Option<JobStatus>, StoreError>;
    /// Ends a job as `status` (failed, or done for a forced re-run).
    fn end_job(
        &mut self,
        job_id: i64,
        now: i64,
        error: &str,
        status: &str,
    ) -> Result<(), StoreError> {
        self.run(
            jobs::END,
            &[job_id.into(), now.into(), error.into(), status.into()],
        )?;
        Ok(())
    }
    /// The event a forward sends.
    fn forward_event(
        &mut self,
        source: &str,
        event_id: &str,
    ) -> Result<Option<ForwardEvent>, StoreError>;
    /// Whether an attempt since the job's last success may have reached
    /// the downstream (anything but a refused connection).
    fn may_have_reached(&mut self, job_id: i64) -> Result<bool, StoreError> {
        let reached = self.read_i64(attempts::MAY_HAVE_REACHED, &[job_id.into()])?;
        Ok(reached.is_some_and(|v| v != 0))
    }
    /// accepted -> processing.
    fn mark_processing(&mut self, source: &str, event_id: &str) -> Result<(), StoreError> {
        self.run(events::MARK_PROCESSING, &[source.into(), event_id.into()])?;
        Ok(())
    }
    /// When the next job falls due (pending) or its lease ends.
    fn next_due(&mut self) -> Result<Option<i64>, StoreError> {
        self.read_i64(jobs::NEXT_DUE, &[])
    }
    /// Records an attempt's result, fenced by owner and attempt number:
    /// false when this worker no longer holds the job.
    #[allow(clippy::too_many_arguments)]
    fn finish_job(
        &mut self,
        job_id: i64,
        owner: &str,
        n: i64,
        status: &str,
        next_attempt_at: Option<i64>,
        last_error: Option<&str>,
        now: i64,
    ) -> Result<bool, StoreError> {
        let changed = self.run(
            jobs::FINISH,
            &[
                job_id.into(),
                owner.into(),
                n.into(),
                status.into(),
                next_attempt_at.into(),
                last_error.into(),
                now.into(),
            ],
        )?;
        Ok(changed == 1)
    }
    /// Writes (or rewrites) an attempt's row.
    fn put_attempt(&mut self, a: &NewAttempt<'_>) -> Result<(), StoreError> {
        self.write_attempt(a, true)
    }
    /// Records a check.
    fn insert_check(&mut self, c: &CheckRow<'_>) -> Result<(), StoreError> {
        self.run(
            attempts::CHECK_INSERT,
            &[
                c.job_id.into(),
                c.n.into(),
                c.asked_at.into(),
                c.finished_at.into(),
                c.answer.into(),
                c.http_status.into(),
                c.error.into(),
                c.worker.into(),
            ],
        )?;
        Ok(())
    }
    /// Gives a job taken but not sent back, fenced like `finish_job`.
    fn give_back(
        &mut self,
        job_id: i64,
        owner: &str,
        n: i64,
        status: &str,
    ) -> Result<(), StoreError> {
        self.run(
            jobs::GIVE_BACK,
            &[job_id.into(), owner.into(), n.into(), status.into()],
        )?;
        Ok(())
    }
    /// Makes every parked job due now (at start: the config may have
    /// changed what they wait for).
    fn release_parked(&mut self, now: i64) -> Result<(), StoreError> {
        self.run(jobs::RELEASE_PARKED, &[now.into()])?;
        Ok(())
    }
}
