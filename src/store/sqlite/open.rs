//! SQLite's files: opened with the right pragmas (WAL, durability, the
//! busy timeout), the read-only pool, `schema.sql` and the version steps
//! of `migrations/sqlite/` applied, and the incremental vacuum's step.

use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags, OptionalExtension};

use crate::config::Durability;
use crate::store::{StoreError, StoreErrorKind};

/// The whole schema, applied on every start (every statement is idempotent).
pub const SCHEMA: &str = include_str!("../../../schema.sql");

/// The schema version this build writes. A database with a higher version
/// was written by a newer idemhook and is refused.
pub const SCHEMA_VERSION: i64 = 4;

/// A pool of read-only connections (the admin API's reads, the gauges).
pub type ReadPool = r2d2::Pool<r2d2_sqlite::SqliteConnectionManager>;

/// At most four read-only connections to the database at `path`, opened
/// when needed, each with the busy timeout.
pub fn read_pool(path: &Path, busy: Duration) -> Result<ReadPool, StoreError> {
    let manager = r2d2_sqlite::SqliteConnectionManager::file(path)
        .with_flags(OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX)
        .with_init(move |c| c.busy_timeout(busy));
    r2d2::Pool::builder()
        .max_size(4)
        .min_idle(Some(0))
        .build(manager)
        .map_err(|e| StoreError::other(format!("cannot open the read pool: {e}")))
}

/// Creates the database file, when it does not exist yet, readable and
/// writable by its owner only (0600) before SQLite writes a byte: it holds
/// payloads and the secrets Asana and Notion hand over. SQLite creates the
/// `-wal` and `-shm` files with the database file's mode, so they are
/// 0600 too. An existing file keeps its mode.
pub fn create_private(path: &Path) -> Result<(), StoreError> {
    use std::os::unix::fs::OpenOptionsExt as _;
    if path.to_str().is_some_and(|p| p.starts_with("file:")) {
        // A URI SQLite resolves itself.
        return Ok(());
    }
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(StoreError::other(format!(
            "cannot create the database {}: {e}",
            path.display()
        ))),
    }
}

/// Opens a read-write connection: WAL, the durability's synchronous level,
/// a busy timeout, foreign keys on. Creates the database file when it is
/// missing, but never a missing folder: a mistyped `database` path must
/// fail, not start an empty database (and process every old event again).
pub fn open(
    path: &Path,
    durability: Durability,
    busy_timeout: Duration,
) -> Result<Connection, StoreError> {
    if let Some(dir) = missing_folder(path) {
        return Err(StoreError {
            kind: StoreErrorKind::ReadOnly,
            message: format!(
                "database {}: the folder {} does not exist (idemhook never creates folders: \
                 create it, or correct `database`)",
                path.display(),
                dir.display()
            ),
        });
    }
    create_private(path)?;
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX
            | OpenFlags::SQLITE_OPEN_URI,
    )?;
    conn.busy_timeout(busy_timeout)?;
    // A new file first gets incremental auto-vacuum, so that pruning can
    // give space back (`vacuum_step`). SQLite allows that only before the
    // first page is written, which switching to WAL already does.
    let pages: i64 = conn.query_row("PRAGMA page_count", [], |r| r.get(0))?;
    if pages == 0 {
        conn.execute_batch("PRAGMA auto_vacuum = INCREMENTAL")?;
    }
    let journal: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
    if !journal.eq_ignore_ascii_case("wal") {
        return Err(StoreError::other(format!(
            "{}: cannot switch to WAL mode (journal_mode is {journal})",
            path.display()
        )));
    }
    let sync = match durability {
        Durability::Full => "FULL",
        Durability::Normal => "NORMAL",
    };
    conn.execute_batch(&format!(
        "PRAGMA synchronous = {sync};
         PRAGMA foreign_keys = ON;
         PRAGMA journal_size_limit = 67108864;
         PRAGMA temp_store = MEMORY;"
    ))?;
    Ok(conn)
}

/// The folder `path` would be created in, when that folder does not exist.
pub fn missing_folder(path: &Path) -> Option<&Path> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty())?;
    (!dir.is_dir()).then_some(dir)
}

/// Opens a connection for reading (operator commands that only look).
pub fn open_read(path: &Path, busy_timeout: Duration) -> Result<Connection, StoreError> {
    if !path.exists() {
        return Err(StoreError {
            kind: StoreErrorKind::ReadOnly,
            message: format!("{}: no such database (has serve run yet?)", path.display()),
        });
    }
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(busy_timeout)?;
    Ok(conn)
}

/// Applies the schema and checks the version, in one transaction.
///
/// Version 2 added
/// `attempts.note` (an operator's note on a `resolve`); older databases get
/// the column here.
pub fn migrate(conn: &mut Connection) -> Result<(), StoreError> {
    rebuild_jobs_if_old(conn)?;
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    tx.execute_batch(SCHEMA)?;
    let stored: Option<String> = tx
        .query_row(
            "SELECT value FROM meta WHERE key = 'schema_version'",
            [],
            |r| r.get(0),
        )
        .optional()?;
    let stored: i64 = match stored {
        Some(v) => v.parse().map_err(|_| {
            StoreError::other(format!("meta.schema_version is not a number: {v:?}"))
        })?,
        None => 0,
    };
    if stored > SCHEMA_VERSION {
        return Err(StoreError::other(format!(
            "the database has schema version {stored}, newer than this idemhook's {SCHEMA_VERSION}: \
             refusing to downgrade; run the newer idemhook"
        )));
    }
    if stored < SCHEMA_VERSION {
        // The column schema.sql's CREATE TABLE has, added to a table
        // created by an older version.
        let has_note: bool = tx.query_row(
            "SELECT count(*) > 0 FROM pragma_table_info('attempts') WHERE name = 'note'",
            [],
            |r| r.get(0),
        )?;
        if !has_note {
            tx.execute_batch(ATTEMPTS_NOTE)?;
        }
        let has_failing_since: bool = tx.query_row(
            "SELECT count(*) > 0 FROM pragma_table_info('jobs') WHERE name = 'failing_since'",
            [],
            |r| r.get(0),
        )?;
        if !has_failing_since {
            tx.execute_batch(JOBS_CIRCUIT)?;
        }
        tx.execute(
            "INSERT OR REPLACE INTO meta(key, value) VALUES ('schema_version', ?1)",
            [SCHEMA_VERSION.to_string()],
        )?;
    }
    tx.commit()?;
    Ok(())
}

/// Version 3 gave `jobs` the status `superseded` (its CHECK) and the
/// columns of delivery control. SQLite cannot change a CHECK in place, so
/// a `jobs` table of an older version is copied into a new one, with
/// foreign keys off so that dropping the old table cascades nothing (the
/// attempts, checks and replays keep their job ids); schema.sql then
/// recreates its indexes and triggers. One transaction: all or nothing.
fn rebuild_jobs_if_old(conn: &mut Connection) -> Result<(), StoreError> {
    let old: bool = conn.query_row(
        "SELECT count(*) > 0 FROM sqlite_master
          WHERE type = 'table' AND name = 'jobs' AND sql NOT LIKE '%superseded%'",
        [],
        |r| r.get(0),
    )?;
    if !old {
        return Ok(());
    }
    conn.execute_batch("PRAGMA foreign_keys = OFF")?;
    let rebuilt = (|| -> Result<(), StoreError> {
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        tx.execute_batch(JOBS_V3)?;
        let broken: i64 =
            tx.query_row("SELECT count(*) FROM pragma_foreign_key_check", [], |r| {
                r.get(0)
            })?;
        if broken > 0 {
            return Err(StoreError::other(format!(
                "rebuilding jobs for schema version 3 left {broken} rows without their job"
            )));
        }
        tx.commit()?;
        Ok(())
    })();
    conn.execute_batch("PRAGMA foreign_keys = ON")?;
    rebuilt
}

/// (table, column, declaration) added after version 1, in order.
/// The steps from older versions (`migrations/sqlite/`): schema.sql is the
/// whole schema of this version, and a file there is what an older
/// database needs that `CREATE ... IF NOT EXISTS` cannot do. A test checks
/// that a migrated database has the schema of a new one.
const ATTEMPTS_NOTE: &str = include_str!("../../../migrations/sqlite/0002_attempts_note.sql");
const JOBS_V3: &str = include_str!("../../../migrations/sqlite/0003_jobs_superseded.sql");
const JOBS_CIRCUIT: &str = include_str!("../../../migrations/sqlite/0004_circuit.sql");

/// One step of giving the pages that deletes freed back to the file
/// system: frees up to [`INCREMENTAL_PAGES`] of them, in the caller's
/// transaction (or its own, in autocommit mode). Returns the free pages
/// left; 0 also for a database without incremental auto-vacuum (one
/// created before it was the default; VACUUM converts it while serve is
/// stopped, docs/runbook.md "Reclaiming disk space"). Callers repeat it
/// while pages are left and each step made progress.
pub fn vacuum_step(conn: &Connection) -> Result<i64, StoreError> {
    let mode: i64 = conn.query_row("PRAGMA auto_vacuum", [], |r| r.get(0))?;
    if mode != 2 {
        return Ok(0);
    }
    let mut stmt =
        conn.prepare_cached(&format!("PRAGMA incremental_vacuum({INCREMENTAL_PAGES})"))?;
    let mut rows = stmt.query([])?;
    while rows.next()?.is_some() {}
    drop(rows);
    Ok(conn.query_row("PRAGMA freelist_count", [], |r| r.get(0))?)
}

/// Pages one incremental vacuum step frees at most (4 MiB of 4 KiB pages),
/// so that it holds the write lock only briefly.
pub const INCREMENTAL_PAGES: i64 = 1024;

/// Runs `body` inside a savepoint: released on Ok, rolled back on Err, so a
/// failure undoes only what `body` did.
pub fn in_savepoint<T, E: From<rusqlite::Error>>(
    conn: &Connection,
    name: &str,
    body: impl FnOnce(&Connection) -> Result<T, E>,
) -> Result<T, E> {
    // Cached statements: every claim opens and releases at least one
    // savepoint on the writer thread, and parsing them each time showed.
    conn.prepare_cached(&format!("SAVEPOINT {name}"))?
        .execute([])?;
    match body(conn) {
        Ok(v) => {
            conn.prepare_cached(&format!("RELEASE {name}"))?
                .execute([])?;
            Ok(v)
        }
        Err(e) => {
            // If SQLite already rolled the whole transaction back (disk full,
            // I/O error), there is no savepoint left; the writer notices.
            let _ = conn.execute_batch(&format!("ROLLBACK TO {name}; RELEASE {name}"));
            Err(e)
        }
    }
}

/// Test helper: SQLite's query plan for `sql` with `params`, one line per
/// step, to check that a query uses the index it was written for.
#[cfg(test)]
pub(crate) fn query_plan(conn: &Connection, sql: &str, params: impl rusqlite::Params) -> String {
    let mut stmt = conn
        .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
        .expect("the query prepares");
    let rows = stmt
        .query_map(params, |r| r.get::<_, String>(3))
        .expect("the plan is readable");
    rows.collect::<Result<Vec<_>, _>>()
        .expect("the plan is readable")
        .join("\n")
}

#[cfg(test)]
mod migration_tests {
    use super::*;

    /// Tables with their columns, indexes with theirs, and triggers: the
    /// shape of a database's schema, to compare.
    fn schema_shape(conn: &Connection) -> Vec<String> {
        let mut shape: Vec<String> = Vec::new();
        let objects: Vec<(String, String, String)> = conn
            .prepare(
                "SELECT type, name, tbl_name FROM sqlite_master
                  WHERE name NOT LIKE 'sqlite_%' ORDER BY type, name",
            )
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        for (kind, name, table) in objects {
            let columns = match kind.as_str() {
                "table" => format!(
                    "SELECT name, type, \"notnull\", dflt_value, pk FROM pragma_table_info('{name}')"
                ),
                "index" => {
                    format!("SELECT name, desc, coll, key FROM pragma_index_xinfo('{name}')")
                }
                _ => "SELECT ''".to_string(),
            };
            let cols: Vec<String> = conn
                .prepare(&columns)
                .unwrap()
                .query_map([], |r| {
                    let n = r.as_ref().column_count();
                    (0..n)
                        .map(|i| {
                            r.get::<_, rusqlite::types::Value>(i)
                                .map(|v| format!("{v:?}"))
                        })
                        .collect::<Result<Vec<_>, _>>()
                        .map(|v| v.join(" "))
                })
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap();
            shape.push(format!("{kind} {name} on {table}: {}", cols.join("; ")));
        }
        shape
    }

    /// schema.sql checked against the steps of `migrations/sqlite/`: a
    /// database of version 2 migrated has the tables, columns, indexes
    /// and triggers of a new one.
    #[test]
    fn a_migrated_database_has_the_schema_of_a_new_one() {
        let dir = tempfile::tempdir().unwrap();
        let old = dir.path().join("v2.db");
        {
            let conn = Connection::open(&old).unwrap();
            conn.execute_batch(include_str!("../../../tests/fixtures/schema_v2.sql"))
                .unwrap();
            conn.execute_batch("INSERT INTO meta (key, value) VALUES ('schema_version', '2')")
                .unwrap();
        }
        let mut migrated = open(&old, Durability::Full, Duration::from_secs(5)).unwrap();
        migrate(&mut migrated).unwrap();
        let mut new = open(
            &dir.path().join("new.db"),
            Durability::Full,
            Duration::from_secs(5),
        )
        .unwrap();
        migrate(&mut new).unwrap();
        assert_eq!(schema_shape(&migrated), schema_shape(&new));
    }

    /// A database made by the schema of version 2 (`tests/fixtures/`,
    /// the schema.sql of that release), with jobs, their attempts, a
    /// parked job and the job counts, migrated to version 3: every row
    /// and id is kept (nothing cascades from rebuilding `jobs`), the
    /// parked job says it waits for `after`, and the new status and
    /// columns work.
    #[test]
    fn a_version_2_database_keeps_every_job_and_attempt() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v2.db");
        {
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch("PRAGMA foreign_keys = ON").unwrap();
            conn.execute_batch(include_str!("../../../tests/fixtures/schema_v2.sql"))
                .unwrap();
            conn.execute_batch(
                "INSERT INTO meta (key, value) VALUES ('schema_version', '2');
                 INSERT INTO events (source, event_id, state, received_at, payload_hash, headers)
                      VALUES ('s', 'e1', 'processing', 1, 'h', '{}');
                 INSERT INTO jobs (id, source, event_id, action, kind, status, n_attempts, created_at, updated_at)
                      VALUES (7, 's', 'e1', 'a', 'forward', 'done', 1, 1, 2);
                 INSERT INTO jobs (id, source, event_id, action, kind, status, n_attempts,
                                   next_attempt_at, last_error, created_at, updated_at)
                      VALUES (9, 's', 'e1', 'b', 'forward', 'pending', 0, NULL, 'waiting for a', 1, 2);
                 INSERT INTO attempts (job_id, n, started_at, finished_at, outcome)
                      VALUES (7, 1, 1, 2, 'ok');",
            )
            .unwrap();
        }
        let mut conn = open(&path, Durability::Full, Duration::from_secs(5)).unwrap();
        migrate(&mut conn).unwrap();
        let count = |conn: &Connection, sql: &str| -> i64 {
            conn.query_row(sql, [], |r| r.get(0)).unwrap()
        };
        assert_eq!(count(&conn, "SELECT count(*) FROM jobs"), 2);
        assert_eq!(
            count(&conn, "SELECT count(*) FROM attempts WHERE job_id = 7"),
            1
        );
        assert_eq!(
            count(
                &conn,
                "SELECT count(*) FROM jobs WHERE id = 9 AND waiting = 'after'"
            ),
            1
        );
        assert_eq!(
            count(
                &conn,
                "SELECT CAST(value AS INTEGER) FROM meta WHERE key = 'schema_version'"
            ),
            SCHEMA_VERSION
        );
        assert_eq!(
            count(&conn, "SELECT count(*) FROM pragma_foreign_key_check"),
            0
        );
        conn.execute("UPDATE jobs SET status = 'superseded' WHERE id = 9", [])
            .unwrap();
        assert_eq!(
            count(
                &conn,
                "SELECT n FROM job_counts WHERE status = 'superseded'"
            ),
            1
        );
        // The trigger of version 3 replaced version 2's.
        let trigger: String = conn
            .query_row(
                "SELECT sql FROM sqlite_master WHERE name = 'jobs_release_waiting'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert!(trigger.contains("waiting IS NOT 'order'"), "{trigger}");
        // Migrating again changes nothing.
        migrate(&mut conn).unwrap();
        assert_eq!(count(&conn, "SELECT count(*) FROM jobs"), 2);
    }
}
