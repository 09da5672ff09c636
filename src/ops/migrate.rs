//! `idemhook migrate --to URL [--yes]`: moves a SQLite installation to
//! PostgreSQL without reopening the duplicate window. Refuses while a
//! `serve` runs on the file (serve holds a shared lock on it; this takes
//! an exclusive one for the whole copy, so no serve starts meanwhile) and
//! refuses a target that already holds events. Copies every table row for
//! row with COPY, ids included (jobs with their attempts, checks and replays,
//! deliveries, incidents and their bodies, paused actions, key rules), in
//! one PostgreSQL transaction that also verifies the counts before it
//! commits, with no statement or lock timeout (a copy of a few hundred MB
//! takes what it takes; it prints a line per table as it goes). Without
//! `--yes` it only prints what it would copy: it writes nothing anywhere
//! (a read-only look at both sides) and runs while serve runs. After the
//! copy the SQLite file records where it moved, and serve refuses it.

use std::fs::File;
use std::io::Write as _;
use std::path::Path;

use anyhow::{Context, Result, anyhow, bail};
use postgres::binary_copy::BinaryCopyInWriter;
use postgres::types::{ToSql, Type};
use rusqlite::types::Value;

use super::command::{CommandError, Outcome};
use super::text::{Unwritten, stdout};
use crate::config::Config;
use crate::config::database_url::{DatabaseUrl, PostgresUrl};
use crate::store::postgres::{Settings, migrate};
use crate::store::{self, StoreError};

/// Each table in the order its rows can be inserted (referenced rows
/// first), with its columns and their kinds: i integer, t text, b blob.
const TABLES: &[(&str, &[(&str, char)])] = &[
    ("meta", &[("key", 't'), ("value", 't')]),
    (
        "source_rules",
        &[
            ("source", 't'),
            ("key_rule", 't'),
            ("hash_rule", 't'),
            ("updated_at", 'i'),
        ],
    ),
    (
        "events",
        &[
            ("source", 't'),
            ("event_id", 't'),
            ("type", 't'),
            ("state", 't'),
            ("received_at", 'i'),
            ("completed_at", 'i'),
            ("payload", 'b'),
            ("content_type", 't'),
            ("headers", 't'),
            ("payload_hash", 't'),
            ("verified_with", 'i'),
            ("signed_at", 'i'),
            ("erased_at", 'i'),
        ],
    ),
    (
        "jobs",
        &[
            ("id", 'i'),
            ("source", 't'),
            ("event_id", 't'),
            ("action", 't'),
            ("kind", 't'),
            ("status", 't'),
            ("n_attempts", 'i'),
            ("next_attempt_at", 'i'),
            ("lease_owner", 't'),
            ("lease_until", 'i'),
            ("last_error", 't'),
            ("created_at", 'i'),
            ("updated_at", 'i'),
            ("order_key", 't'),
            ("order_seq", 'i'),
            ("waiting", 't'),
        ],
    ),
    (
        "attempts",
        &[
            ("job_id", 'i'),
            ("n", 'i'),
            ("started_at", 'i'),
            ("finished_at", 'i'),
            ("outcome", 't'),
            ("http_status", 'i'),
            ("error", 't'),
            ("error_kind", 't'),
            ("request_id", 't'),
            ("response_head", 't'),
            ("worker", 't'),
            ("note", 't'),
        ],
    ),
    (
        "checks",
        &[
            ("id", 'i'),
            ("job_id", 'i'),
            ("n", 'i'),
            ("asked_at", 'i'),
            ("finished_at", 'i'),
            ("answer", 't'),
            ("http_status", 'i'),
            ("error", 't'),
            ("worker", 't'),
        ],
    ),
    (
        "deliveries",
        &[
            ("id", 'i'),
            ("source", 't'),
            ("event_id", 't'),
            ("received_at", 'i'),
            ("outcome", 't'),
            ("remote", 't'),
            ("detail", 't'),
        ],
    ),
    (
        "incidents",
        &[
            ("id", 'i'),
            ("source", 't'),
            ("event_id", 't'),
            ("kind", 't'),
            ("created_at", 'i'),
            ("payload_hash", 't'),
            ("detail", 't'),
        ],
    ),
    (
        "incident_payloads",
        &[("incident_id", 'i'), ("payload", 'b')],
    ),
    (
        "paused_actions",
        &[("source", 't'), ("action", 't'), ("paused_at", 'i')],
    ),
    (
        "replays",
        &[
            ("id", 'i'),
            ("job_id", 'i'),
            ("replayed_at", 'i'),
            ("from_status", 't'),
            ("forced", 'i'),
            ("origin", 't'),
        ],
    ),
    (
        "order_marks",
        &[
            ("source", 't'),
            ("action", 't'),
            ("order_key", 't'),
            ("value", 't'),
        ],
    ),
];

/// Tables whose ids come from an identity column: its sequence is moved
/// past the copied ids.
const IDENTITY: &[&str] = &["jobs", "checks", "deliveries", "incidents", "replays"];

/// meta rows that belong to one backend (SQLite's schema version; the
/// readiness probe's row).
const META_SKIPPED: &[&str] = &["schema_version", "ready_probe"];

/// Takes the exclusive lock on the SQLite file: fails while a serve holds
/// its shared one.
pub fn lock_exclusive(path: &Path) -> Result<File> {
    let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive).map_err(
        |_| {
            anyhow!(
                "{}: a serve (or another migrate) is running on this database; stop it first",
                path.display()
            )
        },
    )?;
    Ok(file)
}

/// The shared lock serve holds on its SQLite file while it runs, so that
/// a migrate cannot copy under it. None when the file cannot be locked
/// because a migrate holds it.
pub fn lock_shared(path: &Path) -> Result<File> {
    let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockShared).map_err(|_| {
        anyhow!(
            "{}: a migrate is copying this database; wait for it (then point database at its target)",
            path.display()
        )
    })?;
    Ok(file)
}

/// `idemhook migrate`: every error is one that kept it from running or
/// from committing (exit 2).
pub fn cmd(config: &Config, to: &str, yes: bool) -> Result<Outcome, CommandError> {
    Ok(run(config, to, yes)?)
}

/// `migrate --to URL [--yes]`: the target checked, then the dry run, or
/// the copy under the file's exclusive lock, verified before its commit.
fn run(config: &Config, to: &str, yes: bool) -> Result<Outcome> {
    let DatabaseUrl::Sqlite(source_path) = &config.database else {
        bail!("database is already a PostgreSQL URL: migrate copies a SQLite file to PostgreSQL");
    };
    let url = target(to)?;
    if !source_path.exists() {
        bail!("{}: no such database", source_path.display());
    }
    if !yes {
        return dry_run(config, &url);
    }
    let _lock = lock_exclusive(source_path)?;
    let mut sqlite = store::open(source_path, config.durability, config.busy_timeout)
        .with_context(|| format!("cannot open {}", source_path.display()))?;
    store::migrate(&mut sqlite).context("cannot bring the SQLite schema up to date")?;

    let mut counts = Vec::new();
    for (table, _) in TABLES {
        let n: i64 =
            sqlite.query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))?;
        counts.push((*table, n));
    }
    let mut pg = open_target(config, &url)?;

    // With --yes the copy does not depend on its output being read: a
    // reader that went away (`| head`) or a full disk leaves the lines
    // unwritten, never the copy half done or undone.
    let mut out = stdout();
    let _ = writeln!(out, "from {}", source_path.display());
    let _ = writeln!(out, "to   {url}");
    for (table, n) in &counts {
        let _ = writeln!(out, "  {table:<18} {n}");
    }

    let mut tx = pg.transaction().map_err(StoreError::from)?;
    copy_tables(&sqlite, &mut tx, &mut out)?;
    // Verified before the commit: a short copy commits nothing.
    verify_counts(&sqlite, &mut tx, &counts)?;
    tx.commit().map_err(StoreError::from)?;
    // The file is no longer the installation: serve refuses it from now on.
    store::meta::record_moved(&store::db::Db::sqlite(&sqlite), &url.to_string())
        .context("copied, but cannot record the move in the SQLite file")?;
    let _ = writeln!(
        out,
        "copied and verified; now set database = \"{url}\" and start serve"
    );
    Ok(Outcome::Done)
}

/// `--to`: a postgres:// URL, or `env:NAME` to read it from the
/// environment.
fn target(to: &str) -> Result<PostgresUrl> {
    let to = match to.strip_prefix("env:") {
        Some(name) => std::env::var(name)
            .map_err(|_| anyhow!("--to: environment variable {name} is not set"))?,
        None => to.to_string(),
    };
    match DatabaseUrl::parse(&to, Path::new(".")).map_err(|e| anyhow!("--to: {e}"))? {
        DatabaseUrl::Postgres(url) => Ok(url),
        DatabaseUrl::Sqlite(_) => bail!("--to: expected a postgres:// URL"),
    }
}

/// A session on the target without timeouts, its schema migrated, refused
/// when it already holds events.
fn open_target(config: &Config, url: &PostgresUrl) -> Result<postgres::Client> {
    let settings =
        Settings::from_url(url, config.durability, config.busy_timeout).map_err(|e| anyhow!(e))?;
    let mut pg = settings
        .connect()
        .map_err(|e| anyhow!("cannot connect to {url}: {e}"))?;
    // No timeout of busy_timeout's: the copy may take minutes, and waiting
    // for the migration lock (an instance migrating) is right.
    pg.batch_execute(NO_TIMEOUTS).map_err(StoreError::from)?;
    migrate(&mut pg, url.schema()).map_err(|e| anyhow!("{url}: cannot migrate: {e}"))?;
    refuse_held_events(&mut pg, url)?;
    Ok(pg)
}

/// Every table copied in `tx`, a line each as it is done, then the
/// identity sequences set past the copied ids.
fn copy_tables(
    sqlite: &rusqlite::Connection,
    tx: &mut postgres::Transaction<'_>,
    out: &mut impl std::io::Write,
) -> Result<()> {
    for (table, columns) in TABLES {
        let started = std::time::Instant::now();
        copy_table(sqlite, tx, table, columns).with_context(|| format!("copying {table}"))?;
        let _ = writeln!(
            out,
            "  copied {table:<11} in {:.1} s",
            started.elapsed().as_secs_f64()
        );
    }
    for table in IDENTITY {
        tx.execute(
            &format!(
                "SELECT setval(pg_get_serial_sequence('{table}', 'id'), coalesce(max(id), 0) + 1, false) FROM {table}"
            ),
            &[],
        )
        .map_err(StoreError::from)?;
    }
    Ok(())
}

/// Each table's rows in the target equal to the source's `counts` (less
/// the SQLite-only `meta` rows), or an error: nothing is committed.
fn verify_counts(
    sqlite: &rusqlite::Connection,
    tx: &mut postgres::Transaction<'_>,
    counts: &[(&str, i64)],
) -> Result<()> {
    for (table, n) in counts {
        let skipped = if *table == "meta" {
            sqlite.query_row(
                "SELECT count(*) FROM meta WHERE key IN ('schema_version', 'ready_probe')",
                [],
                |r| r.get::<_, i64>(0),
            )?
        } else {
            0
        };
        let copied: i64 = tx
            .query_one(&format!("SELECT count(*) FROM {table}"), &[])
            .map_err(StoreError::from)?
            .get(0);
        if copied != n - skipped {
            bail!(
                "{table}: {copied} row(s) in the target, {} expected; nothing was committed",
                n - skipped
            );
        }
    }
    Ok(())
}

/// An error when the target already holds events: migrate copies into an
/// empty idemhook database only.
fn refuse_held_events(pg: &mut postgres::Client, url: &PostgresUrl) -> Result<()> {
    let target_events: i64 = pg
        .query_one("SELECT count(*) FROM events", &[])
        .map_err(StoreError::from)?
        .get(0);
    if target_events > 0 {
        bail!(
            "{url} already holds {target_events} event(s): migrate copies into an empty idemhook database only"
        );
    }
    Ok(())
}

/// What a session of migrate sets: no statement, lock or idle timeout.
const NO_TIMEOUTS: &str =
    "SET statement_timeout = 0; SET lock_timeout = 0; SET idle_in_transaction_session_timeout = 0";

/// `migrate` without `--yes`: what would be copied, read without writing
/// anything on either side, so it runs while serve runs.
fn dry_run(config: &Config, url: &PostgresUrl) -> Result<Outcome> {
    let mut out = stdout();
    let source_path = super::open::sqlite_file(config)?;
    let sqlite = store::open_read(source_path, config.busy_timeout)
        .with_context(|| format!("cannot open {}", source_path.display()))?;
    let mut counts = Vec::new();
    for (table, _) in TABLES {
        let present: bool = sqlite.query_row(
            "SELECT count(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = ?1",
            [table],
            |r| r.get(0),
        )?;
        let n: i64 = if present {
            sqlite.query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))?
        } else {
            0
        };
        counts.push((*table, n));
    }
    let settings =
        Settings::from_url(url, config.durability, config.busy_timeout).map_err(|e| anyhow!(e))?;
    let mut pg = settings
        .connect()
        .map_err(|e| anyhow!("cannot connect to {url}: {e}"))?;
    pg.batch_execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")
        .map_err(StoreError::from)?;
    let has_tables: bool = pg
        .query_one("SELECT to_regclass('events') IS NOT NULL", &[])
        .map_err(StoreError::from)?
        .get(0);
    if has_tables {
        refuse_held_events(&mut pg, url)?;
    }
    writeln!(out, "from {}", source_path.display()).map_err(Unwritten)?;
    writeln!(out, "to   {url} (schema {})", url.schema()).map_err(Unwritten)?;
    for (table, n) in &counts {
        writeln!(out, "  {table:<18} {n}").map_err(Unwritten)?;
    }
    writeln!(
        out,
        "nothing copied, nothing written: run again with --yes to copy (stop serve first; it stays refused while this runs)"
    ).map_err(Unwritten)?;
    Ok(Outcome::Done)
}

/// Copies one table row for row with one `COPY ... FROM STDIN BINARY`
/// (a stream, not a round trip per row).
fn copy_table(
    sqlite: &rusqlite::Connection,
    tx: &mut postgres::Transaction<'_>,
    table: &str,
    columns: &[(&str, char)],
) -> Result<()> {
    let names: Vec<&str> = columns.iter().map(|(n, _)| *n).collect();
    let types: Vec<Type> = columns
        .iter()
        .map(|(_, kind)| match kind {
            'i' => Type::INT8,
            'b' => Type::BYTEA,
            _ => Type::TEXT,
        })
        .collect();
    let sink = tx
        .copy_in(&format!(
            "COPY {table} ({}) FROM STDIN (FORMAT binary)",
            names.join(", ")
        ))
        .map_err(StoreError::from)?;
    let mut writer = BinaryCopyInWriter::new(sink, &types);
    let mut select = sqlite.prepare(&format!("SELECT {} FROM {table}", names.join(", ")))?;
    let mut rows = select.query([])?;
    while let Some(row) = rows.next()? {
        if table == "meta" {
            let key: String = row.get(0)?;
            if META_SKIPPED.contains(&key.as_str()) {
                continue;
            }
        }
        let mut values: Vec<Box<dyn ToSql + Sync>> = Vec::with_capacity(columns.len());
        for (i, (name, kind)) in columns.iter().enumerate() {
            let v: Value = row.get(i)?;
            values.push(match (kind, v) {
                ('i', Value::Integer(n)) => Box::new(Some(n)),
                ('i', Value::Null) => Box::new(None::<i64>),
                ('t', Value::Text(s)) => Box::new(Some(s)),
                ('t', Value::Null) => Box::new(None::<String>),
                ('b', Value::Blob(b)) => Box::new(Some(b)),
                ('b', Value::Text(s)) => Box::new(Some(s.into_bytes())),
                ('b', Value::Null) => Box::new(None::<Vec<u8>>),
                (_, other) => bail!("{table}.{name}: unexpected value {other:?}"),
            });
        }
        let refs: Vec<&(dyn ToSql + Sync)> = values.iter().map(|v| v.as_ref()).collect();
        writer.write(&refs).map_err(StoreError::from)?;
    }
    writer.finish().map_err(StoreError::from)?;
    Ok(())
}
