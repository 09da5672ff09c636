//! SQLite: the claim's and the outbox's statements ([`SqliteTx`]), the one
//! writer that commits them in groups (`writer/`), the [`Sqlite`] backend a
//! `serve` on a file runs on, a file opened on one connection before that
//! ([`Opened`]: `serve`'s start, the operator commands), the SQL actions
//! prepared against it, and `backup`'s online copy (`backup.rs`).

pub mod backup;
pub mod db;
mod open;
pub mod prune;
mod tx;
pub mod writer;

#[cfg(test)]
pub(crate) use open::query_plan;
pub use open::{
    INCREMENTAL_PAGES, ReadPool, SCHEMA, SCHEMA_VERSION, in_savepoint, migrate, missing_folder,
    open, open_read, read_pool, vacuum_step,
};
pub use tx::{DUE_JOBS, EXPIRED_JOBS, SqliteTx, to_sql_value};

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::Connection;

use crate::config::{ActionKind, Config, Durability, Source};
use crate::store::StoreError;
use crate::store::backend::{Backend, Claims, Guard, JobCounts, Refusal, StorageGauges};
use crate::store::db::{Db, TxError};
use crate::store::prune::Batch;
use writer::{Writer, WriterThreads};

/// `serve` on one SQLite file: every write through the one writer (claims,
/// refusals, the outbox's steps, the pruner's batches, grouped into shared
/// commits), every read on a pool of read-only connections.
pub struct Sqlite {
    path: PathBuf,
    writer: Writer,
    threads: Mutex<Option<WriterThreads>>,
    readers: ReadPool,
}

/// A SQLite file open on one connection: `serve`'s before its writer
/// starts (migrated, `setup_sql` run on it), or an operator command's.
pub struct Opened(Connection);

impl Opened {
    /// Opens (creating it when new) for writing.
    pub fn open(path: &Path, durability: Durability, busy: Duration) -> Result<Opened, StoreError> {
        crate::store::sqlite::open(path, durability, busy).map(Opened)
    }

    /// Opens an existing file read-only.
    pub fn open_read(path: &Path, busy: Duration) -> Result<Opened, StoreError> {
        crate::store::sqlite::open_read(path, busy).map(Opened)
    }

    /// `schema.sql` applied.
    pub fn migrate(&mut self) -> Result<(), StoreError> {
        crate::store::sqlite::migrate(&mut self.0)
    }

    /// Runs `sql` (`setup_sql`) as it is.
    pub fn run(&self, sql: &str) -> Result<(), StoreError> {
        Ok(self.0.execute_batch(sql)?)
    }

    pub fn db(&self) -> Db<'_> {
        Db::sqlite(&self.0)
    }

    pub fn into_connection(self) -> Connection {
        self.0
    }
}

impl std::ops::Deref for Opened {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        &self.0
    }
}

/// `check`'s test of the SQL actions on SQLite, as `serve` prepares them:
/// against an empty database with idemhook's schema and `setup_sql`, and,
/// if that fails, against the configured database as it is (read-only; its
/// tables may come from elsewhere). Changes nothing on disk.
pub fn trial(config: &Config, path: &Path) -> Result<(), String> {
    let fresh = (|| {
        let mut conn = Connection::open_in_memory().map_err(|e| e.to_string())?;
        crate::store::sqlite::migrate(&mut conn).map_err(|e| e.to_string())?;
        if let Some(sql) = &config.setup_sql {
            conn.execute_batch(sql)
                .map_err(|e| format!("setup_sql: {e}"))?;
        }
        prepare_actions(&conn, &config.sources)
    })();
    match fresh {
        Err(e) if path.exists() => {
            let conn = crate::store::sqlite::open_read(path, Duration::from_secs(5))
                .map_err(|_| e.clone())?;
            prepare_actions(&conn, &config.sources).map_err(|_| e)
        }
        other => other,
    }
}

impl Sqlite {
    /// Starts the writer on the opened file and the read pool on the same
    /// file.
    pub fn start(
        Opened(conn): Opened,
        path: &Path,
        durability: Durability,
        busy_timeout: Duration,
    ) -> Result<Sqlite, StoreError> {
        let (writer, threads) = Writer::start(conn, path.to_path_buf(), durability, busy_timeout)?;
        Ok(Sqlite {
            path: path.to_path_buf(),
            writer,
            threads: Mutex::new(Some(threads)),
            readers: crate::store::sqlite::read_pool(path, busy_timeout)?,
        })
    }
}

/// The size of a file, 0 when it is not there.
fn file_size(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

impl Backend for Sqlite {
    type Tx<'t> = SqliteTx<'t>;
    type Session = ();

    fn describe(&self) -> String {
        self.path.display().to_string()
    }

    fn session(&self) {}

    fn read<T, E: TxError>(&self, f: impl FnOnce(&Db<'_>) -> Result<T, E>) -> Result<T, E> {
        let conn = self
            .readers
            .get()
            .map_err(|e| StoreError::other(format!("no read connection: {e}")))?;
        f(&Db::sqlite(&conn))
    }

    fn write<T, E>(
        &self,
        mut f: impl FnMut(&Db<'_>) -> Result<T, E> + Send + 'static,
    ) -> Result<T, E>
    where
        T: Send + 'static,
        E: TxError + Send + 'static,
    {
        self.writer
            .call(move |conn| db::sqlite_savepoint(conn, &mut f))?
    }

    /// No savepoint of their own: a claim fails only when storage does (its
    /// SQL actions have savepoints of their own inside it), and then the
    /// group, a batch's every event with it, is rolled back. The claims are
    /// shared so that they are freed off the one writer thread, by the
    /// continuation on the answer thread.
    fn claim_then<C: Claims>(
        &self,
        claims: Arc<C>,
        then: impl FnOnce(Result<Vec<C::Outcome>, StoreError>) + Send + 'static,
    ) {
        let op = {
            let claims = claims.clone();
            move |conn: &Connection| claims.claim_all(&mut SqliteTx::new(conn))
        };
        self.writer.call_then(Guard::Group, op, move |outcomes| {
            drop(claims);
            then(outcomes);
        });
    }

    fn record_refusal(&self, r: Refusal) -> bool {
        self.writer.submit(move |conn| {
            use crate::store::tx::Tx as _;
            SqliteTx::new(conn).insert_delivery(
                &r.source,
                None,
                r.at,
                r.outcome.as_str(),
                &r.remote,
                Some(&r.detail),
            )?;
            r.keep(&crate::store::db::Db::sqlite(conn))
        })
    }

    /// Ready when a probe made for this call commits (it rides with the
    /// next group commit, which starts after the call: a commit that
    /// started before never answers for it). Not ready while a commit
    /// failed in the last 2 s either: with the disk nearly full, a small
    /// probe can pass while the groups that carry events fail.
    fn ready(&self) -> Result<(), StoreError> {
        if let Some(e) = self.writer.recent_failure(Duration::from_secs(2)) {
            return Err(e);
        }
        self.writer.probe()
    }

    fn gauges(&self) -> (Result<JobCounts, StoreError>, StorageGauges) {
        let mut wal = self.path.as_os_str().to_owned();
        wal.push("-wal");
        let (commits, grouped) = self.writer.group_stats();
        let storage = StorageGauges {
            database_bytes: Some(file_size(&self.path)),
            wal_bytes: Some(file_size(Path::new(&wal))),
            writer_commits: commits,
            writer_grouped: grouped,
            writer_queue: self.writer.queued(),
        };
        (self.read(crate::store::jobs::gauges), storage)
    }

    fn jobs<T: Send + 'static>(
        &self,
        _: &mut (),
        guard: Guard,
        mut body: impl for<'t> FnMut(&mut SqliteTx<'t>) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        self.writer
            .call_with(guard, move |conn| body(&mut SqliteTx::new(conn)))
    }

    fn jobs_queued(
        &self,
        _: &mut (),
        guard: Guard,
        mut body: impl for<'t> FnMut(&mut SqliteTx<'t>) -> Result<(), StoreError> + Send + 'static,
    ) -> Result<(), StoreError> {
        self.writer
            .send_with(guard, move |conn| body(&mut SqliteTx::new(conn)))
    }

    fn prune(&self, _: &mut (), batch: Batch) -> Result<(u64, u64), StoreError> {
        self.writer.call(move |conn| batch.run_sqlite(conn))
    }

    fn vacuum_step(&self) -> Result<(i64, i64), StoreError> {
        self.writer.call(prune::vacuum_once)
    }

    fn listen(&self, _: impl Fn() + Send + 'static) {}

    fn stop_bound(&self) -> Option<Duration> {
        None
    }

    /// Lets the writer finish what is queued, then stops its threads.
    fn stop(&self) {
        let threads = self
            .threads
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(threads) = threads {
            threads.stop();
        }
    }
}

/// Checks at start that every SQL action prepares against the database (its
/// tables exist after `setup_sql`) and names only known parameters.
pub fn prepare_actions(conn: &Connection, sources: &[Source]) -> Result<(), String> {
    for source in sources {
        for action in &source.actions {
            let ActionKind::Sql { sql, params } = &action.kind else {
                continue;
            };
            let where_ = format!("sources.{}.actions ({})", source.name, action.name);
            let stmt = conn
                .prepare(sql)
                .map_err(|e| format!("{where_}.sql: {e}"))?;
            for i in 1..=stmt.parameter_count() {
                let Some(name) = stmt.parameter_name(i) else {
                    return Err(format!(
                        "{where_}.sql: parameter {i} has no name; use :name parameters"
                    ));
                };
                let bare = name.trim_start_matches([':', '@', '$']);
                let known = params.iter().any(|(n, _)| n == bare)
                    || crate::config::BUILTIN_PARAMS.contains(&bare);
                if !known {
                    return Err(format!(
                        "{where_}.sql: parameter {name} is neither in params nor built in ({})",
                        crate::config::BUILTIN_PARAMS
                            .map(|p| format!(":{p}"))
                            .join(", ")
                    ));
                }
            }
        }
    }
    Ok(())
}
