//! The storage seam: what a running `serve` asks of its storage, as one
//! trait with one implementation per backend (`sqlite::Sqlite`,
//! `postgres::Postgres`). `serve` picks the type once, from `database`;
//! the HTTP layer, the forward workers and the pruner are generic over it
//! and monomorphised, so nothing on the hot path decides the backend again.
//!
//! A claim passes through as an operation ([`Claims`]): the storage knows
//! a claim's key and the event row it inserts first, never what it
//! decides; that stays in `ingest`.

use std::sync::Arc;
use std::time::Duration;

use crate::state::{Delivery, JobStatus};
use crate::store::StoreError;
use crate::store::db::{Db, TxError};
use crate::store::prune::Batch;
use crate::store::tx::{OutboxTx, Tx};

/// How an outbox step's writes are kept apart from the rest of what they
/// commit with: on SQLite the other operations of the writer's group, on
/// PostgreSQL nothing (each step is a transaction of its own).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Guard {
    /// In its own savepoint: if it fails (or panics), only its own writes
    /// are undone and the rest of the group commits.
    Savepoint,
    /// No savepoint of its own, for the hot operations that fail only when
    /// storage does (a claim, whose SQL actions have savepoints of their
    /// own; an outbox lease or completion). A savepoint makes SQLite copy
    /// every page the operation touches into the savepoint journal, which
    /// was about a tenth of the writer's time. If such an operation fails
    /// or panics, the whole group is rolled back and every caller in it
    /// gets the error.
    Group,
}

/// One delivery's claims (one event, or each event of a batch), as the
/// storage runs them in one transaction: they commit together or fail
/// together.
pub trait Claims: Send + Sync + 'static {
    /// What one claim decided.
    type Outcome: Send + 'static;
    /// The source the claims are for.
    fn source(&self) -> &str;
    /// How many claims.
    fn len(&self) -> usize;
    /// The key of claim `i` (a claimer holds back a second claim of a key
    /// while another commits it).
    fn event_id(&self, i: usize) -> &str;
    /// The savepoints the claims' SQL actions may open.
    fn savepoints(&self) -> usize;
    /// Runs claim `i` in the open transaction `tx`.
    fn claim<T: Tx>(&self, i: usize, tx: &mut T) -> Result<Self::Outcome, StoreError>;

    /// No claims (the readiness probe's).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Runs every claim in order.
    fn claim_all<T: Tx>(&self, tx: &mut T) -> Result<Vec<Self::Outcome>, StoreError> {
        (0..self.len()).map(|i| self.claim(i, tx)).collect()
    }
}

/// A refused delivery's record (nobody waits for it to commit).
pub struct Refusal {
    pub source: String,
    pub outcome: Delivery,
    pub remote: String,
    pub detail: String,
    pub at: i64,
    /// The request whole, when the source keeps its refusals (401, 400).
    pub kept: Option<KeptRefusal>,
}

/// What of a refused request is kept for `reingest` (`store::rejected`).
pub struct KeptRefusal {
    pub query: String,
    /// The headers as a JSON array of `[name, value]`.
    pub headers: String,
    pub body: Vec<u8>,
    /// The source's `keep_rejected_bytes`.
    pub cap: u64,
    /// Its share of [`KEPT_IN_FLIGHT_BYTES`], given back when it is
    /// written (or dropped).
    _held: Held,
}

/// The bytes of kept refused requests that may wait for the disk at once
/// (queued, not yet written), all sources together: a flood of refused
/// requests with large bodies holds at most this much memory; past it a
/// refusal is recorded without its request.
pub const KEPT_IN_FLIGHT_BYTES: usize = 64 * 1024 * 1024;

static KEPT_IN_FLIGHT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

struct Held(usize);

impl Drop for Held {
    fn drop(&mut self) {
        KEPT_IN_FLIGHT.fetch_sub(self.0, std::sync::atomic::Ordering::AcqRel);
    }
}

impl KeptRefusal {
    /// The request to keep, or None while [`KEPT_IN_FLIGHT_BYTES`] are
    /// waiting for the disk already.
    pub fn new(query: String, headers: String, body: Vec<u8>, cap: u64) -> Option<KeptRefusal> {
        use std::sync::atomic::Ordering;
        let n = query.len() + headers.len() + body.len();
        KEPT_IN_FLIGHT
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                held.checked_add(n).filter(|&t| t <= KEPT_IN_FLIGHT_BYTES)
            })
            .ok()?;
        Some(KeptRefusal {
            query,
            headers,
            body,
            cap,
            _held: Held(n),
        })
    }
}

impl Refusal {
    /// Keeps the request in `rejected`, when it is to be kept, in the
    /// caller's transaction (after its delivery row). This is the one
    /// place a source's kept refusals grow, on both backends (the writer
    /// on SQLite, a claimer's group on PostgreSQL): where
    /// `store::rejected::keep` answers true, something that must follow
    /// the growth (the `rejected` notification) is written in the same
    /// transaction.
    pub fn keep(&self, db: &Db<'_>) -> Result<(), StoreError> {
        let Some(k) = &self.kept else {
            return Ok(());
        };
        crate::store::rejected::keep(
            db,
            &crate::store::rejected::NewKept {
                source: &self.source,
                received_at: self.at,
                reason: &self.detail,
                remote: &self.remote,
                query: &k.query,
                headers: &k.headers,
                body: &k.body,
            },
            k.cap,
        )?;
        Ok(())
    }
}

/// Jobs per status (from counters kept in the transactions that change
/// statuses, never a count over `jobs`) and the oldest pending job's
/// creation.
#[derive(Debug, Default)]
pub struct JobCounts {
    pub by_status: Vec<(JobStatus, i64)>,
    pub oldest_pending: Option<i64>,
    /// Each circuit row: (source, action, open, times it opened).
    pub circuits: Vec<(String, String, bool, i64)>,
}

/// The storage's own gauges.
#[derive(Debug, Default, Clone)]
pub struct StorageGauges {
    /// The SQLite file's and its WAL's sizes; None on PostgreSQL, where
    /// the server owns its storage.
    pub database_bytes: Option<u64>,
    pub wal_bytes: Option<u64>,
    /// Commits of claim groups, and the operations they carried.
    pub writer_commits: u64,
    pub writer_grouped: u64,
    /// Operations waiting for a commit.
    pub writer_queue: usize,
}

/// The storage of a running `serve`.
pub trait Backend: Send + Sync + Sized + 'static {
    /// One transaction of the claim's and the outbox's steps.
    type Tx<'t>: OutboxTx;
    /// What a long-lived thread (a forward worker, the pruner) holds for
    /// its steps: nothing on SQLite, whose steps ride the one writer; a
    /// connection of its own on PostgreSQL.
    type Session: Send + 'static;

    /// The database, as the start line names it.
    fn describe(&self) -> String;

    /// A new session (it connects when first used).
    fn session(&self) -> Self::Session;

    /// Runs `f` for reading: on a read-only connection of SQLite's read
    /// pool, or on a pooled PostgreSQL connection in one read-only
    /// snapshot. A connection that cannot be had is a storage error.
    fn read<T, E: TxError>(&self, f: impl FnOnce(&Db<'_>) -> Result<T, E>) -> Result<T, E>;

    /// Runs `f` as one write of its own (on SQLite in a savepoint of the
    /// writer's group; on PostgreSQL in a transaction, run again after a
    /// deadlock or serialization failure, so `f` may run more than once).
    /// An error of `f` undoes what it wrote.
    fn write<T, E>(&self, f: impl FnMut(&Db<'_>) -> Result<T, E> + Send + 'static) -> Result<T, E>
    where
        T: Send + 'static,
        E: TxError + Send + 'static;

    /// Queues `claims` for the next group commit; `then` gets their
    /// outcomes once it committed (or the error), on another thread.
    fn claim_then<C: Claims>(
        &self,
        claims: Arc<C>,
        then: impl FnOnce(Result<Vec<C::Outcome>, StoreError>) + Send + 'static,
    );

    /// Queues the record of a refused delivery; false when it was dropped
    /// (the queue is full or stopped).
    fn record_refusal(&self, refusal: Refusal) -> bool;

    /// Ready when the database takes a write now, through the claim path.
    fn ready(&self) -> Result<(), StoreError>;

    /// The job counts and the storage's gauges, for `/metrics`.
    fn gauges(&self) -> (Result<JobCounts, StoreError>, StorageGauges);

    /// Runs `body` as one transaction of the outbox and waits for it to
    /// commit (run again on PostgreSQL after a deadlock or serialization
    /// failure).
    fn jobs<T: Send + 'static>(
        &self,
        session: &mut Self::Session,
        guard: Guard,
        body: impl for<'t> FnMut(&mut Self::Tx<'t>) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError>;

    /// Like [`Backend::jobs`], but nobody waits for the commit where the
    /// backend can avoid it (SQLite queues it to the writer); an error is
    /// logged there. Err when it could not even be queued.
    fn jobs_queued(
        &self,
        session: &mut Self::Session,
        guard: Guard,
        body: impl for<'t> FnMut(&mut Self::Tx<'t>) -> Result<(), StoreError> + Send + 'static,
    ) -> Result<(), StoreError>;

    /// Runs one prune batch: (rows deleted, deliveries deleted with them).
    fn prune(&self, session: &mut Self::Session, batch: Batch) -> Result<(u64, u64), StoreError>;

    /// One step of giving freed pages back to the file system: (free
    /// pages before, free pages left); (-1, 0) when there is nothing to
    /// give back this way (PostgreSQL, whose autovacuum reuses the rows; a
    /// SQLite file without incremental auto-vacuum).
    fn vacuum_step(&self) -> Result<(i64, i64), StoreError>;

    /// Starts what wakes `wake` when another instance wrote due forward
    /// jobs (PostgreSQL's LISTEN; nothing on SQLite, where every claim is
    /// this instance's).
    fn listen(&self, wake: impl Fn() + Send + 'static);

    /// How long the stop may wait for the storage (a hung server) before
    /// `serve` exits as a crash would; None to wait for it whatever it
    /// takes (SQLite's writer finishing its last commits).
    fn stop_bound(&self) -> Option<Duration>;

    /// Stops the storage's threads after their last commits.
    fn stop(&self);
}

#[cfg(test)]
mod tests {
    use super::{KEPT_IN_FLIGHT_BYTES, KeptRefusal};

    /// Kept requests waiting for the disk hold at most their budget; a
    /// share comes back when one is dropped (written, or its record
    /// dropped).
    #[test]
    fn kept_requests_in_flight_are_bounded() {
        let big = KeptRefusal::new(
            String::new(),
            String::new(),
            vec![0; KEPT_IN_FLIGHT_BYTES],
            1,
        )
        .expect("the first fits");
        assert!(KeptRefusal::new(String::new(), String::new(), vec![0; 1], 1).is_none());
        drop(big);
        assert!(KeptRefusal::new(String::new(), String::new(), vec![0; 1], 1).is_some());
    }
}
