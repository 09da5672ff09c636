//! The running service's shared state: the resolved config, the storage
//! (SQLite's writer and read pool, or PostgreSQL's claimers and pool),
//! the metrics, plus the few operations the HTTP layer asks of them
//! (`read` and `write` give the admin API a `store::db::Db` on either
//! backend). Built once by `serve` and shared by reference.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::config::{Config, Source};
use crate::ingest::{self, Claim, Outcome};
use crate::metrics::{JobGauges, Metrics, StorageGauges};
use crate::state::{AttemptOutcome, Delivery};
use crate::store::db::{Db, TxError};
use crate::store::postgres::claimers::PgStore;
use crate::store::{Guard, StoreError, Writer};

pub use crate::store::ReadPool;

pub struct App {
    pub config: Arc<Config>,
    pub storage: Storage,
    pub metrics: Arc<Metrics>,
    /// Wakes the forward workers when new jobs were committed.
    pub wake_outbox: Box<dyn Fn() + Send + Sync>,
    pub admin_limiter: crate::auth::AuthLimiter,
    /// The inspector's signed-in browsers (in memory: a restart ends them).
    pub ui_sessions: crate::auth::Sessions,
    /// The inspector's overview: delivery counts of minutes that are over.
    pub overview_cache: crate::ops::inspector::OverviewCache,
}

/// Where the service stores events, chosen once at start by `database`.
pub enum Storage {
    /// One SQLite file: the one writer and a read pool.
    Sqlite { writer: Writer, readers: ReadPool },
    /// One PostgreSQL database shared by any number of instances.
    Postgres(Arc<PgStore>),
}

impl App {
    /// Runs `f` on a connection for reading: one of the SQLite read pool
    /// (read-only), or a pooled PostgreSQL connection (in one read-only
    /// snapshot). A connection that cannot be had is a storage error (the
    /// API answers 503).
    pub fn read<T, E: TxError>(&self, f: impl FnOnce(&Db<'_>) -> Result<T, E>) -> Result<T, E> {
        match &self.storage {
            Storage::Sqlite { readers, .. } => {
                let conn = readers
                    .get()
                    .map_err(|e| StoreError::other(format!("no read connection: {e}")))?;
                f(&Db::sqlite(&conn))
            }
            Storage::Postgres(pg) => {
                pg.with_client(|client| Ok(crate::store::db::pg_read(client, f)))?
            }
        }
    }

    /// Runs `f` as one write: on SQLite through the one writer, in a
    /// savepoint of its own; on PostgreSQL in a transaction of its own on
    /// a pooled connection (`store::db::pg_write`: run again after a
    /// deadlock or serialization failure, so `f` may run more than once).
    /// Either way an error of `f` undoes what it wrote: a refusal comes
    /// back as itself, a storage failure fails the call.
    pub fn write<T, E>(
        &self,
        mut f: impl FnMut(&Db<'_>) -> Result<T, E> + Send + 'static,
    ) -> Result<T, E>
    where
        T: Send + 'static,
        E: TxError + Send + 'static,
    {
        match &self.storage {
            Storage::Sqlite { writer, .. } => {
                writer.call(move |conn| crate::store::db::sqlite_savepoint(conn, &mut f))?
            }
            Storage::Postgres(pg) => {
                pg.with_client(|client| Ok(crate::store::db::pg_write(client, &mut f)))?
            }
        }
    }

    /// Gives the sources whose provider hands its secret over in a
    /// handshake (Asana, Notion) the one kept in the database, if any.
    pub fn learn_handshake_secrets(&self) -> Result<(), StoreError> {
        for source in &self.config.sources {
            self.learn_handshake_secret(source)?;
        }
        Ok(())
    }

    /// The secret kept for `source` from its provider's handshake, learned
    /// unless known already (another instance may have kept it since);
    /// true when it was new.
    pub fn learn_handshake_secret(&self, source: &Source) -> Result<bool, StoreError> {
        let hands_over = source.kind.preset().is_some_and(|p| {
            matches!(
                p.handshake,
                crate::config::presets::Handshake::Asana
                    | crate::config::presets::Handshake::Notion
            )
        });
        if !hands_over || source.secret_count > 0 {
            return Ok(false);
        }
        let kept = self.read(|db| crate::store::meta::handed_over(db, &source.name))?;
        match kept {
            Some(secret) if !source.verifier.knows(&secret) => {
                source
                    .verifier
                    .learn(&crate::verify::Secret::new(secret))
                    .map_err(StoreError::other)?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    pub fn source(&self, name: &str) -> Option<(usize, &Source)> {
        self.config
            .sources
            .iter()
            .enumerate()
            .find(|(_, s)| s.name == name)
    }

    /// Claims an event through the writer; returns once it is committed.
    pub fn claim(&self, source_index: usize, claim: Claim) -> Result<Outcome, StoreError> {
        self.claim_batch(source_index, vec![claim])
            .and_then(|mut outcomes| {
                outcomes
                    .pop()
                    .ok_or_else(|| StoreError::other("no outcome"))
            })
    }

    /// Claims every event of one delivery (a batch's) in one transaction;
    /// returns once it is committed, with each event's outcome in order.
    pub fn claim_batch(
        &self,
        source_index: usize,
        claims: Vec<Claim>,
    ) -> Result<Vec<Outcome>, StoreError> {
        let claims: Vec<Arc<Claim>> = claims.into_iter().map(Arc::new).collect();
        let outcomes = match &self.storage {
            Storage::Sqlite { writer, .. } => {
                writer.call_with(Guard::Group, self.claim_op(source_index, claims.clone()))
            }
            Storage::Postgres(pg) => {
                let (tx, rx) = std::sync::mpsc::sync_channel(1);
                pg.claim_then(
                    source_index,
                    claims.clone(),
                    Box::new(move |outcome| {
                        let _ = tx.send(outcome);
                    }),
                );
                rx.recv().unwrap_or_else(|_| Err(StoreError::closed()))
            }
        };
        drop(claims);
        self.claimed(source_index, &outcomes);
        outcomes
    }

    /// Like [`App::claim`] but returns at once; `then` gets the outcome on
    /// the answer thread after the commit (see `Writer::call_then`; it is
    /// dropped uncalled if the writer is gone).
    pub fn claim_then(
        self: &Arc<Self>,
        source_index: usize,
        claim: Claim,
        then: impl FnOnce(Result<Outcome, StoreError>) + Send + 'static,
    ) {
        self.claim_batch_then(source_index, vec![claim], move |outcomes| {
            then(outcomes.and_then(|mut o| o.pop().ok_or_else(|| StoreError::other("no outcome"))));
        });
    }

    /// Like [`App::claim_batch`] but returns at once, as [`App::claim_then`].
    pub fn claim_batch_then(
        self: &Arc<Self>,
        source_index: usize,
        claims: Vec<Claim>,
        then: impl FnOnce(Result<Vec<Outcome>, StoreError>) + Send + 'static,
    ) {
        let claims: Vec<Arc<Claim>> = claims.into_iter().map(Arc::new).collect();
        let app = self.clone();
        match &self.storage {
            Storage::Sqlite { writer, .. } => {
                let op = self.claim_op(source_index, claims.clone());
                writer.call_then(Guard::Group, op, move |outcomes| {
                    drop(claims);
                    app.claimed(source_index, &outcomes);
                    then(outcomes);
                });
            }
            Storage::Postgres(pg) => pg.claim_then(
                source_index,
                claims,
                Box::new(move |outcomes| {
                    app.claimed(source_index, &outcomes);
                    then(outcomes);
                }),
            ),
        }
    }

    /// The claims as the writer runs them, in the group's transaction. No
    /// savepoint of their own: a claim fails only when storage does (its
    /// SQL actions have savepoints of their own inside it), and then the
    /// group, a batch's every event with it, is rolled back. The claims
    /// (bodies, parsed JSON, headers) are shared so that they are freed off
    /// the one writer thread: by the caller, or by the continuation on the
    /// answer thread.
    fn claim_op(
        &self,
        source_index: usize,
        claims: Vec<Arc<Claim>>,
    ) -> impl FnOnce(&rusqlite::Connection) -> Result<Vec<Outcome>, StoreError> + Send + 'static
    {
        let config = self.config.clone();
        move |conn| {
            let source = config
                .sources
                .get(source_index)
                .ok_or_else(|| StoreError::other("source index out of range"))?;
            claims
                .iter()
                .map(|c| ingest::claim(conn, source, c))
                .collect()
        }
    }

    /// After a claim's commit: counts the SQL actions' attempts and wakes
    /// the outbox if it wrote forward jobs.
    fn claimed(&self, source_index: usize, outcomes: &Result<Vec<Outcome>, StoreError>) {
        let Ok(outcomes) = outcomes else { return };
        let mut wake = false;
        for outcome in outcomes {
            let Outcome::Accepted {
                forward_jobs,
                sql_runs,
                ..
            } = outcome
            else {
                continue;
            };
            self.count_sql_runs(source_index, sql_runs);
            wake |= *forward_jobs > 0;
        }
        if wake {
            (self.wake_outbox)();
        }
    }

    fn count_sql_runs(&self, source_index: usize, sql_runs: &[(usize, bool)]) {
        if let Some(source) = self.config.sources.get(source_index) {
            for &(index, ok) in sql_runs {
                if let Some(action) = source.actions.get(index) {
                    let outcome = if ok {
                        AttemptOutcome::Ok
                    } else {
                        AttemptOutcome::Failed
                    };
                    self.metrics.attempt(&source.name, &action.name, outcome);
                }
            }
        }
    }

    /// Records a refused delivery without waiting for it to commit.
    pub fn record_refusal(
        &self,
        source: &str,
        outcome: Delivery,
        remote: &str,
        detail: &str,
        at: i64,
    ) {
        let writer = match &self.storage {
            Storage::Sqlite { writer, .. } => writer,
            Storage::Postgres(pg) => {
                pg.record_refusal(source, outcome, remote, detail, at);
                return;
            }
        };
        let (source, remote, detail) = (source.to_string(), remote.to_string(), detail.to_string());
        let queued = writer.submit(move |conn| {
            ingest::record_delivery(conn, &source, None, at, outcome, &remote, Some(&detail))
        });
        if !queued {
            self.metrics.dropped_records.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Ready when the database takes a write, as a probe made for this
    /// call shows (it rides with the next group commit, which starts after
    /// the call: a commit that started before never answers for it). Not
    /// ready while a commit failed in the last 2 s either: with the disk
    /// nearly full, a small probe can pass while the groups that carry
    /// events fail.
    pub fn ready(&self) -> Result<(), StoreError> {
        let writer = match &self.storage {
            Storage::Sqlite { writer, .. } => writer,
            Storage::Postgres(pg) => return pg.ready(),
        };
        if let Some(e) = writer.recent_failure(Duration::from_secs(2)) {
            return Err(e);
        }
        writer.probe()
    }

    pub fn render_metrics(&self) -> String {
        let (writer, readers) = match &self.storage {
            Storage::Sqlite { writer, readers } => (writer, readers),
            Storage::Postgres(pg) => return self.render_metrics_postgres(pg),
        };
        let jobs = load_job_gauges(readers).ok();
        let size = |p: &std::path::Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
        let db = self.config.database.sqlite_path();
        let wal = db.map(|db| {
            let mut wal = db.as_os_str().to_owned();
            wal.push("-wal");
            std::path::PathBuf::from(wal)
        });
        let (commits, grouped) = writer.group_stats();
        let storage = StorageGauges {
            database_bytes: db.map(size),
            wal_bytes: wal.as_deref().map(size),
            writer_commits: commits,
            writer_grouped: grouped,
            writer_queue: writer.queued(),
        };
        self.metrics.render(jobs.as_ref(), &storage)
    }

    /// The same metrics on PostgreSQL: no file sizes (the server owns its
    /// storage); the commit groups are the claimers'.
    fn render_metrics_postgres(&self, pg: &PgStore) -> String {
        let jobs = pg.job_counts().ok().map(|(counts, oldest)| {
            let mut g = JobGauges::default();
            for (status, n) in counts {
                g.set(&status, n);
            }
            g.oldest_pending_age_secs = oldest
                .map(|at| ((crate::time::now_ms() - at).max(0) as f64) / 1000.0)
                .unwrap_or(0.0);
            g
        });
        let storage = StorageGauges {
            database_bytes: None,
            wal_bytes: None,
            writer_commits: pg.commits.load(Ordering::Relaxed),
            writer_grouped: pg.grouped.load(Ordering::Relaxed),
            writer_queue: pg.queued(),
        };
        self.metrics.render(jobs.as_ref(), &storage)
    }
}

fn load_job_gauges(readers: &ReadPool) -> Result<JobGauges, StoreError> {
    {
        let conn = readers
            .get()
            .map_err(|e| StoreError::other(e.to_string()))?;
        let mut g = JobGauges::default();
        let (counts, oldest) = crate::store::jobs::sqlite_gauges(&conn)?;
        for (status, n) in counts {
            g.set(status.as_str(), n);
        }
        g.oldest_pending_age_secs = oldest
            .map(|at| ((crate::time::now_ms() - at).max(0) as f64) / 1000.0)
            .unwrap_or(0.0);
        Ok(g)
    }
}

/// A pool of read-only connections for the admin API and metrics.
pub fn read_pool(config: &Config, path: &std::path::Path) -> Result<ReadPool, StoreError> {
    crate::store::read_pool(path, config.busy_timeout)
}
