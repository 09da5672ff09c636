//! Retention: `idemhook prune` and the pruner thread of `serve`.
//!
//! Per source, `retention` says how long an event's key is kept (after it
//! the event, its jobs, attempts, replays, deliveries and incidents are
//! deleted, and a redelivery would be accepted as new) and
//! `payload_retention` how long its body and headers are kept (after it
//! they are set NULL and `erased_at` stamped; the key stays a tombstone
//! that still catches duplicates). Refused deliveries (no event) go with
//! their source's key retention.
//!
//! Work is done in bounded batches of [`BATCH`] rows, each its own short
//! write transaction, so pruning never holds the write lock for long. An
//! event with a pending, processing, paused or failed job is never deleted
//! and keeps its body: that work still needs it.

use std::io::{self, Write};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use super::command::{CommandError, Outcome};
use super::open::{self, OnDb, open_write};
use super::text::stdout;
use crate::config::{Config, format_duration};
use crate::store::StoreError;
use crate::store::backend::Backend;
use crate::store::db::Db;
use crate::store::open::CommandDb;
use crate::store::prune;
pub use crate::store::prune::{BATCH, Batch, Counts};
use crate::time::{now_ms, steady_now_ms};

/// Refused deliveries of a source no longer in the config are kept this
/// long (the retention floor).
pub const UNKNOWN_SOURCE_RETENTION: Duration = Duration::from_secs(7 * 86_400);

/// Runs one batch in its own short write transaction, on whichever
/// backend.
type RunBatch<'a> = dyn FnMut(Batch) -> Result<(u64, u64), StoreError> + 'a;

/// The cut-off times (ms) for one source.
#[derive(Debug, Clone)]
struct Cutoffs {
    source: String,
    keys_before: i64,
    bodies_before: i64,
    /// Kept refused requests received before this go (`keep_rejected`).
    kept_before: i64,
}

fn cutoffs(config: &Config, now: i64) -> Vec<Cutoffs> {
    let ms = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
    config
        .sources
        .iter()
        .map(|s| Cutoffs {
            source: s.name.clone(),
            keys_before: now.saturating_sub(ms(s.retention)),
            bodies_before: now.saturating_sub(ms(s.payload_retention)),
            kept_before: now.saturating_sub(ms(s.keep_rejected)),
        })
        .collect()
}

fn known_sources(config: &Config) -> Vec<String> {
    config.sources.iter().map(|s| s.name.clone()).collect()
}

/// Runs one source's pruning to the end, one batch per `batch` call (each
/// call is one write transaction). `stop` is checked between batches.
fn prune_source(
    c: &Cutoffs,
    now: i64,
    stop: &dyn Fn() -> bool,
    batch: &mut RunBatch<'_>,
) -> Result<Counts, StoreError> {
    let mut counts = Counts {
        source: c.source.clone(),
        ..Counts::default()
    };
    loop {
        let (n, deliveries) = batch(Batch::Events {
            source: c.source.clone(),
            before: c.keys_before,
        })?;
        counts.events += n;
        counts.deliveries += deliveries;
        if n < BATCH as u64 || stop() {
            break;
        }
    }
    loop {
        let (n, _) = batch(Batch::Bodies {
            source: c.source.clone(),
            before: c.bodies_before,
            now,
        })?;
        counts.bodies += n;
        if n < BATCH as u64 || stop() {
            break;
        }
    }
    loop {
        let (n, _) = batch(Batch::Refused {
            source: c.source.clone(),
            before: c.keys_before,
        })?;
        counts.deliveries += n;
        if n < BATCH as u64 || stop() {
            break;
        }
    }
    loop {
        let (n, _) = batch(Batch::Kept {
            source: c.source.clone(),
            before: c.kept_before,
        })?;
        if n < BATCH as u64 || stop() {
            break;
        }
    }
    Ok(counts)
}

/// Prunes every source, each batch through `batch`. Returns the counts per
/// source (with `kept` left 0: counting it is the caller's choice).
fn prune_all(
    config: &Config,
    now: i64,
    stop: &dyn Fn() -> bool,
    batch: &mut RunBatch<'_>,
) -> Result<Vec<Counts>, StoreError> {
    let mut all = Vec::new();
    for c in cutoffs(config, now) {
        if stop() {
            break;
        }
        all.push(prune_source(&c, now, stop, batch)?);
    }
    let known = known_sources(config);
    let before = now.saturating_sub(UNKNOWN_SOURCE_RETENTION.as_millis() as i64);
    loop {
        if stop() {
            break;
        }
        let (n, _) = batch(Batch::UnknownRefused {
            known: known.clone(),
            before,
        })?;
        if n < BATCH as u64 {
            break;
        }
    }
    Ok(all)
}

/// `idemhook prune`: the counts (`--dry-run`), or the batches, what was
/// kept, and the space given back.
pub fn cmd(config: &Config, dry_run: bool) -> Result<Outcome, CommandError> {
    let now = now_ms();
    let mut out = stdout();
    if dry_run {
        let all = open::look(config, |db| {
            cutoffs(config, now)
                .iter()
                .map(|c| prune::count(db, &c.source, c.keys_before, c.bodies_before))
                .collect::<Result<Vec<_>, _>>()
        })?
        .map_err(CommandError::Storage)?;
        print_counts(&mut out, config, &all, true)?;
        writeln!(out, "dry run: nothing changed")?;
        return Ok(Outcome::Done);
    }
    if let crate::config::database_url::DatabaseUrl::Postgres(url) = &config.database {
        return cmd_postgres(config, url, now);
    }
    let conn = open_write(config)?;
    let mut first = true;
    let mut run_batch = |op: Batch| -> Result<(u64, u64), StoreError> {
        // Let the server's writer in between our short transactions.
        if !first {
            std::thread::sleep(Duration::from_millis(5));
        }
        first = false;
        op.run_sqlite_alone(&conn)
    };
    let mut all =
        prune_all(config, now, &|| false, &mut run_batch).map_err(CommandError::Storage)?;
    for (counts, c) in all.iter_mut().zip(cutoffs(config, now)) {
        counts.kept = prune::count_kept(&Db::sqlite(&conn), &c.source, c.keys_before).unwrap_or(0);
    }
    print_counts(&mut out, config, &all, false)?;
    // Each step is its own short transaction (autocommit).
    let mut first = true;
    let given = give_back(&|| false, &mut || {
        if !first {
            std::thread::sleep(Duration::from_millis(5));
        }
        first = false;
        crate::store::sqlite::prune::vacuum_once(&conn)
    });
    match given.map_err(CommandError::Storage)? {
        Some((pages, left)) => writeln!(
            out,
            "gave {} KiB back to the file system{}",
            pages * crate::store::sqlite::prune::page_size(&conn) / 1024,
            if left != 0 {
                format!(" ({left} free pages left)")
            } else {
                String::new()
            }
        )?,
        None => writeln!(
            out,
            "the database was created without incremental auto-vacuum, so freed pages stay in the file for reuse; \
             to give them back, stop serve and run VACUUM once (docs/runbook.md, \"Reclaiming disk space\")"
        )?,
    }
    Ok(Outcome::Done)
}

/// `prune` on PostgreSQL: the same batches as serve's pruner (each its own
/// short transaction, every lock `SKIP LOCKED`, so it runs beside the
/// instances' own pruners), then what was kept.
fn cmd_postgres(
    config: &Config,
    url: &crate::config::database_url::PostgresUrl,
    now: i64,
) -> Result<Outcome, CommandError> {
    // Refuses a database serve has not migrated yet.
    open::on_db_write(config, PruningPostgres { config, url, now })?
}

/// `idemhook prune` on PostgreSQL, past the command's connection's
/// opening (which refuses a database serve has not migrated yet).
struct PruningPostgres<'a> {
    config: &'a Config,
    url: &'a crate::config::database_url::PostgresUrl,
    now: i64,
}

impl OnDb for PruningPostgres<'_> {
    type Out = Result<Outcome, CommandError>;
    fn run<D: CommandDb>(self, mut handle: D) -> Self::Out {
        let (config, url, now) = (self.config, self.url, self.now);
        prune_postgres(&mut handle, config, url, now)
    }
}

fn prune_postgres(
    handle: &mut impl CommandDb,
    config: &Config,
    url: &crate::config::database_url::PostgresUrl,
    now: i64,
) -> Result<Outcome, CommandError> {
    use anyhow::Context as _;
    let settings =
        crate::store::postgres::Settings::from_url(url, config.durability, config.busy_timeout)
            .map_err(anyhow::Error::msg)?;
    let mut session = crate::store::postgres::tx::Session::new(settings);
    let pruned = prune_all(config, now, &|| false, &mut |op: Batch| {
        session.transaction(|tx| op.run_postgres(tx.client()))
    });
    let mut all = pruned.map_err(CommandError::Storage)?;
    let db = handle.db();
    for (counts, c) in all.iter_mut().zip(cutoffs(config, now)) {
        counts.kept = prune::count_kept(&db, &c.source, c.keys_before)
            .with_context(|| format!("cannot count what {url} kept"))?;
    }
    let mut out = stdout();
    print_counts(&mut out, config, &all, false)?;
    writeln!(out, "the freed rows are reused by PostgreSQL's autovacuum")?;
    Ok(Outcome::Done)
}

/// Gives the pages pruning freed back to the file system, a few MiB per
/// step. Returns (pages given back, free pages left), or None when the
/// database has no incremental auto-vacuum (created before it was the
/// default).
fn give_back(
    stop: &dyn Fn() -> bool,
    step: &mut dyn FnMut() -> Result<(i64, i64), StoreError>,
) -> Result<Option<(i64, i64)>, StoreError> {
    let mut given = 0;
    loop {
        if stop() {
            return Ok(Some((given, -1)));
        }
        let (before, left) = step()?;
        if before < 0 {
            return Ok(None);
        }
        given += (before - left).max(0);
        if left == 0 || left >= before {
            return Ok(Some((given, left)));
        }
    }
}

fn print_counts(
    out: &mut impl Write,
    config: &Config,
    all: &[Counts],
    dry_run: bool,
) -> io::Result<()> {
    let verb = if dry_run { "would delete" } else { "deleted" };
    for (counts, source) in all.iter().zip(&config.sources) {
        writeln!(
            out,
            "{}: {verb} {} event(s) older than {} and {} deliveries; {} {} bod{} older than {}; kept {} past retention for open or failed jobs",
            counts.source,
            counts.events,
            format_duration(source.retention),
            counts.deliveries,
            if dry_run { "would drop" } else { "dropped" },
            counts.bodies,
            if counts.bodies == 1 { "y" } else { "ies" },
            format_duration(source.payload_retention),
            counts.kept,
        )?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// The pruner thread of `serve`.

/// Prunes every `prune_interval`, starting right after `serve` starts (so
/// frequent restarts do not starve it): on SQLite through the server's one
/// writer, on PostgreSQL on a connection of its own (every instance
/// prunes; their batches take disjoint rows).
pub struct Background {
    inner: Option<(Arc<StopSignal>, JoinHandle<()>)>,
}

/// Set true (under the mutex) to stop the pruner; the condvar wakes it.
type StopSignal = (Mutex<bool>, Condvar);

impl Background {
    /// Starts the pruner; an interval of zero disables it.
    pub fn start<B: Backend>(config: Arc<Config>, backend: Arc<B>) -> Background {
        if config.prune_interval.is_zero() {
            return Background { inner: None };
        }
        // The pruner's clock is anchored at the start (see steady_now_ms).
        steady_now_ms();
        let signal: Arc<StopSignal> = Arc::new((Mutex::new(false), Condvar::new()));
        let thread_signal = signal.clone();
        let spawned = std::thread::Builder::new()
            .name("idemhook-prune".into())
            .spawn(move || run(&config, &*backend, &thread_signal));
        match spawned {
            Ok(handle) => Background {
                inner: Some((signal, handle)),
            },
            Err(e) => {
                crate::log::error(
                    "cannot start the pruner thread",
                    &[
                        ("error", &e),
                        ("effect", &"nothing is pruned until restart"),
                    ],
                );
                Background { inner: None }
            }
        }
    }

    /// Stops the pruner after the batch it is running.
    pub fn stop(self) {
        if let Some((signal, handle)) = self.inner {
            if let Ok(mut stopping) = signal.0.lock() {
                *stopping = true;
                signal.1.notify_all();
            }
            let _ = handle.join();
        }
    }
}

fn run<B: Backend>(config: &Config, backend: &B, signal: &StopSignal) {
    let stopping = || signal.0.lock().map(|s| *s).unwrap_or(true);
    let mut session = backend.session();
    loop {
        if stopping() {
            return;
        }
        let pruned = prune_all(config, steady_now_ms(), &stopping, &mut |op: Batch| {
            backend.prune(&mut session, op)
        });
        match pruned {
            Ok(all) => {
                if all.iter().any(|c| c.events + c.bodies + c.deliveries > 0) {
                    let mut step = || backend.vacuum_step();
                    if let Err(e) = give_back(&stopping, &mut step) {
                        crate::log::warn(
                            "giving space back failed",
                            &[
                                ("error", &e.message),
                                ("effect", &"the freed pages stay in the file for reuse"),
                            ],
                        );
                    }
                }
                for c in all
                    .iter()
                    .filter(|c| c.events + c.bodies + c.deliveries > 0)
                {
                    crate::log::info(
                        "pruned",
                        &[
                            ("source", &c.source),
                            ("events", &c.events),
                            ("bodies", &c.bodies),
                            ("deliveries", &c.deliveries),
                        ],
                    );
                }
            }
            Err(e) => crate::log::warn(
                "prune failed",
                &[
                    ("error", &e.message),
                    ("effect", &"retried at the next interval"),
                ],
            ),
        }
        let Ok(guard) = signal.0.lock() else { return };
        let waited = signal
            .1
            .wait_timeout_while(guard, config.prune_interval, |stop| !*stop);
        match waited {
            Ok((guard, _)) if *guard => return,
            Ok(_) => {}
            Err(_) => return,
        }
    }
}
