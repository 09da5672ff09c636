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

use super::command::{CommandError, Outcome};
use super::text::{Unwritten, stdout};
use crate::config::Config;
use crate::config::database_url::{DatabaseUrl, PostgresUrl};
use crate::store;
use crate::store::postgres::Settings;
use crate::store::postgres::copy::{self, Copying, Mismatch, TableCount, Target};

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
    let mut sqlite = store::sqlite::open(source_path, config.durability, config.busy_timeout)
        .with_context(|| format!("cannot open {}", source_path.display()))?;
    store::sqlite::migrate(&mut sqlite).context("cannot bring the SQLite schema up to date")?;

    let counts = copy::source_counts(&sqlite)?;
    let mut pg = open_target(config, &url)?;

    // With --yes the copy does not depend on its output being read: a
    // reader that went away (`| head`) or a full disk leaves the lines
    // unwritten, never the copy half done or undone.
    let mut out = stdout();
    let _ = writeln!(out, "from {}", source_path.display());
    let _ = writeln!(out, "to   {url}");
    for TableCount { table, rows } in &counts {
        let _ = writeln!(out, "  {table:<18} {rows}");
    }

    let mut tx = pg.begin(&sqlite)?;
    copy_tables(&mut tx, &mut out)?;
    // Verified before the commit: a short copy commits nothing.
    verify_counts(&mut tx, &counts)?;
    tx.commit()?;
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

/// A session on the target at `url`, with `config`'s settings.
fn connect(config: &Config, url: &PostgresUrl) -> Result<Target> {
    let settings =
        Settings::from_url(url, config.durability, config.busy_timeout).map_err(|e| anyhow!(e))?;
    Target::connect(&settings).map_err(|e| anyhow!("cannot connect to {url}: {e}"))
}

/// A session on the target without timeouts, its schema migrated, refused
/// when it already holds events.
fn open_target(config: &Config, url: &PostgresUrl) -> Result<Target> {
    let mut pg = connect(config, url)?;
    // No timeout of busy_timeout's: the copy may take minutes, and waiting
    // for the migration lock (an instance migrating) is right.
    pg.without_timeouts()?;
    pg.migrate(url.schema())
        .map_err(|e| anyhow!("{url}: cannot migrate: {e}"))?;
    refuse_held_events(&mut pg, url)?;
    Ok(pg)
}

/// Every table copied in `tx`, a line each as it is done, then the
/// identity sequences set past the copied ids.
fn copy_tables(tx: &mut Copying<'_, '_>, out: &mut impl std::io::Write) -> Result<()> {
    for table in copy::TABLES {
        let started = std::time::Instant::now();
        tx.table(table)
            .with_context(|| format!("copying {}", table.name))?;
        let _ = writeln!(
            out,
            "  copied {:<11} in {:.1} s",
            table.name,
            started.elapsed().as_secs_f64()
        );
    }
    tx.move_sequences()?;
    Ok(())
}

/// Each table's rows in the target equal to the source's `counts` (less
/// the SQLite-only `meta` rows), or an error: nothing is committed.
fn verify_counts(tx: &mut Copying<'_, '_>, counts: &[TableCount]) -> Result<()> {
    if let Some(Mismatch {
        table,
        copied,
        expected,
    }) = tx.mismatch(counts)?
    {
        bail!("{table}: {copied} row(s) in the target, {expected} expected; nothing was committed");
    }
    Ok(())
}

/// An error when the target already holds events: migrate copies into an
/// empty idemhook database only.
fn refuse_held_events(pg: &mut Target, url: &PostgresUrl) -> Result<()> {
    let target_events = pg.events()?;
    if target_events > 0 {
        bail!(
            "{url} already holds {target_events} event(s): migrate copies into an empty idemhook database only"
        );
    }
    Ok(())
}

/// `migrate` without `--yes`: what would be copied, read without writing
/// anything on either side, so it runs while serve runs.
fn dry_run(config: &Config, url: &PostgresUrl) -> Result<Outcome> {
    let mut out = stdout();
    let source_path = super::open::sqlite_file(config)?;
    let sqlite = store::sqlite::open_read(source_path, config.busy_timeout)
        .with_context(|| format!("cannot open {}", source_path.display()))?;
    let counts = copy::present_counts(&sqlite)?;
    let mut pg = connect(config, url)?;
    pg.read_only()?;
    if pg.has_tables()? {
        refuse_held_events(&mut pg, url)?;
    }
    writeln!(out, "from {}", source_path.display()).map_err(Unwritten)?;
    writeln!(out, "to   {url} (schema {})", url.schema()).map_err(Unwritten)?;
    for TableCount { table, rows } in &counts {
        writeln!(out, "  {table:<18} {rows}").map_err(Unwritten)?;
    }
    writeln!(
        out,
        "nothing copied, nothing written: run again with --yes to copy (stop serve first; it stays refused while this runs)"
    ).map_err(Unwritten)?;
    Ok(Outcome::Done)
}
