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

use rusqlite::{Connection, params};
use serde::Serialize;

use super::command::{CommandError, Outcome};
use super::open::{open_db_read, open_db_write, open_write};
use super::text::stdout;
use crate::args;
use crate::config::{Config, format_duration};
use crate::store::db::{Db, Value};
use crate::store::deliveries::OF_EVENT;
use crate::store::{StoreError, Writer};
use crate::time::now_ms;

/// Rows one batch (one write transaction) touches at most.
pub const BATCH: usize = 500;

/// Refused deliveries of a source no longer in the config are kept this
/// long (the retention floor).
pub const UNKNOWN_SOURCE_RETENTION: Duration = Duration::from_secs(7 * 86_400);

/// The condition that holds an event back: work that still needs it.
const NO_OPEN_JOB: &str = "NOT EXISTS (SELECT 1 FROM jobs j
        WHERE j.source = e.source AND j.event_id = e.event_id
          AND j.status IN ('pending', 'processing', 'paused', 'failed'))";

/// One batch of pruning, as data: each backend runs it in one short
/// write transaction of its own ([`Batch::run_sqlite`], [`Batch::run_postgres`]).
/// The decisions (cut-offs, order, when to stop) are shared.
#[derive(Debug, Clone)]
pub enum Batch {
    /// Events past their key retention, with everything of theirs.
    Events { source: String, before: i64 },
    /// Bodies past their payload retention.
    Bodies {
        source: String,
        before: i64,
        now: i64,
    },
    /// Refused deliveries (no event) past the key retention.
    Refused { source: String, before: i64 },
    /// Refused deliveries of sources no longer in the config.
    UnknownRefused { known: Vec<String>, before: i64 },
}

impl Batch {
    /// Runs the batch on SQLite, in the caller's transaction. Returns
    /// (rows of its kind, deliveries deleted along).
    pub fn run_sqlite(&self, conn: &Connection) -> Result<(u64, u64), StoreError> {
        match self {
            Batch::Events { source, before } => delete_events_batch(conn, source, *before, BATCH),
            Batch::Bodies {
                source,
                before,
                now,
            } => Ok((erase_bodies_batch(conn, source, *before, *now, BATCH)?, 0)),
            Batch::Refused { source, before } => {
                Ok((delete_refused_batch(conn, source, *before, BATCH)?, 0))
            }
            Batch::UnknownRefused { known, before } => Ok((
                delete_unknown_refused_batch(
                    conn,
                    &serde_json::Value::from(known.clone()).to_string(),
                    *before,
                    BATCH,
                )?,
                0,
            )),
        }
    }

    /// Runs the batch on PostgreSQL, in the caller's transaction (see
    /// `store::pg_maint`: every lock is SKIP LOCKED, so several instances
    /// prune at once on disjoint rows).
    pub fn run_postgres(&self, client: &mut postgres::Client) -> Result<(u64, u64), StoreError> {
        use crate::store::pg_maint;
        match self {
            Batch::Events { source, before } => {
                pg_maint::delete_events_batch(client, source, *before, BATCH)
            }
            Batch::Bodies {
                source,
                before,
                now,
            } => Ok((
                pg_maint::erase_bodies_batch(client, source, *before, *now, BATCH)?,
                0,
            )),
            Batch::Refused { source, before } => Ok((
                pg_maint::delete_refused_batch(client, source, *before, BATCH)?,
                0,
            )),
            Batch::UnknownRefused { known, before } => Ok((
                pg_maint::delete_unknown_refused_batch(client, known, *before, BATCH)?,
                0,
            )),
        }
    }
}

/// Runs one batch in its own short write transaction, on whichever
/// backend.
type RunBatch<'a> = dyn FnMut(Batch) -> Result<(u64, u64), StoreError> + 'a;

/// What pruning did (or, for a dry run, would do) for one source.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct Counts {
    pub source: String,
    /// Events (keys) deleted with their jobs, attempts and incidents.
    pub events: u64,
    /// Bodies and headers dropped from events that stay.
    pub bodies: u64,
    /// Deliveries deleted: those of deleted events and old refused ones.
    pub deliveries: u64,
    /// Events past retention kept because a job still needs them.
    pub kept: u64,
}

/// The cut-off times (ms) for one source.
#[derive(Debug, Clone)]
struct Cutoffs {
    source: String,
    keys_before: i64,
    bodies_before: i64,
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
        })
        .collect()
}

/// Deletes up to `limit` events of `source` received before `before` that
/// no open or failed job holds, with everything that belongs to them.
/// Returns (events, deliveries) deleted. Runs in the caller's transaction.
pub fn delete_events_batch(
    conn: &Connection,
    source: &str,
    before: i64,
    limit: usize,
) -> Result<(u64, u64), StoreError> {
    let ids: Vec<(String, i64)> = conn
        .prepare_cached(&format!(
            "SELECT e.event_id, e.received_at FROM events e
             WHERE e.source = ?1 AND e.received_at < ?2 AND {NO_OPEN_JOB}
             ORDER BY e.received_at LIMIT ?3"
        ))?
        .query_map(params![source, before, limit as i64], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })?
        .collect::<Result<_, _>>()?;
    let mut deliveries = 0u64;
    for (id, received_at) in &ids {
        let key = params![source, id];
        conn.prepare_cached(
            "DELETE FROM attempts WHERE job_id IN
                 (SELECT id FROM jobs WHERE source = ?1 AND event_id = ?2)",
        )?
        .execute(key)?;
        conn.prepare_cached(
            "DELETE FROM replays WHERE job_id IN
                 (SELECT id FROM jobs WHERE source = ?1 AND event_id = ?2)",
        )?
        .execute(key)?;
        conn.prepare_cached("DELETE FROM jobs WHERE source = ?1 AND event_id = ?2")?
            .execute(key)?;
        deliveries += conn
            .prepare_cached(&format!("DELETE FROM deliveries WHERE {OF_EVENT}"))?
            .execute(params![source, id, received_at])? as u64;
        conn.prepare_cached(
            "DELETE FROM incident_payloads WHERE incident_id IN
                 (SELECT id FROM incidents WHERE source = ?1 AND event_id = ?2)",
        )?
        .execute(key)?;
        conn.prepare_cached("DELETE FROM incidents WHERE source = ?1 AND event_id = ?2")?
            .execute(key)?;
        conn.prepare_cached("DELETE FROM events WHERE source = ?1 AND event_id = ?2")?
            .execute(key)?;
    }
    Ok((ids.len() as u64, deliveries))
}

/// Drops the body and headers of up to `limit` events of `source`
/// received before `before` that no open or failed job holds, and up to
/// `limit` kept bodies of mismatched duplicates received before then.
/// Runs in the caller's transaction.
pub fn erase_bodies_batch(
    conn: &Connection,
    source: &str,
    before: i64,
    now: i64,
    limit: usize,
) -> Result<u64, StoreError> {
    let n = conn
        .prepare_cached(&format!(
            "UPDATE events SET payload = NULL, headers = NULL, erased_at = ?3
             WHERE rowid IN (SELECT e.rowid FROM events e
                 WHERE e.source = ?1 AND e.received_at < ?2 AND e.erased_at IS NULL
                   AND {NO_OPEN_JOB}
                 LIMIT ?4)"
        ))?
        .execute(params![source, before, now, limit as i64])?;
    // Bodies of mismatched duplicates go by the same rule, by the time
    // they arrived (no job reads them).
    let mismatched = conn
        .prepare_cached(
            "DELETE FROM incident_payloads WHERE incident_id IN
                 (SELECT p.incident_id FROM incident_payloads p JOIN incidents i ON i.id = p.incident_id
                  WHERE i.source = ?1 AND i.created_at < ?2 LIMIT ?3)",
        )?
        .execute(params![source, before, limit as i64])?;
    Ok((n + mismatched) as u64)
}

/// Up to ?3 refused deliveries (no event) of source ?1 received before ?2.
/// A refused delivery is never 'accepted'; saying so lets SQLite use the
/// partial (source, event_id) index instead of walking every delivery
/// since the oldest.
const REFUSED_BATCH: &str = "SELECT id FROM deliveries
     WHERE source = ?1 AND event_id IS NULL AND outcome <> 'accepted' AND received_at < ?2
     LIMIT ?3";

/// Deletes up to `limit` refused deliveries (no event) of `source`
/// received before `before`. Runs in the caller's transaction.
pub fn delete_refused_batch(
    conn: &Connection,
    source: &str,
    before: i64,
    limit: usize,
) -> Result<u64, StoreError> {
    let n = conn
        .prepare_cached(&format!(
            "DELETE FROM deliveries WHERE id IN ({REFUSED_BATCH})"
        ))?
        .execute(params![source, before, limit as i64])?;
    Ok(n as u64)
}

/// Deletes up to `limit` refused deliveries of sources not in the config
/// (`known` is a JSON array of the configured names).
pub fn delete_unknown_refused_batch(
    conn: &Connection,
    known: &str,
    before: i64,
    limit: usize,
) -> Result<u64, StoreError> {
    let n = conn
        .prepare_cached(
            "DELETE FROM deliveries WHERE id IN (SELECT id FROM deliveries
                 WHERE event_id IS NULL AND received_at < ?2
                   AND source NOT IN (SELECT value FROM json_each(?1)) LIMIT ?3)",
        )?
        .execute(params![known, before, limit as i64])?;
    Ok(n as u64)
}

/// What a prune would do, counted on a read-only connection of either
/// backend.
fn count(conn: &Db<'_>, c: &Cutoffs) -> Result<Counts, StoreError> {
    let one = |sql: &str, p: &[Value]| -> Result<u64, StoreError> {
        let n = conn.query_one(sql, p)?.i64(0)?;
        Ok(n.max(0) as u64)
    };
    let events = one(
        &format!(
            "SELECT count(*) FROM events e WHERE e.source = ?1 AND e.received_at < ?2 AND {NO_OPEN_JOB}"
        ),
        args![&c.source, c.keys_before],
    )?;
    let kept = one(
        &format!(
            "SELECT count(*) FROM events e WHERE e.source = ?1 AND e.received_at < ?2 AND NOT {NO_OPEN_JOB}"
        ),
        args![&c.source, c.keys_before],
    )?;
    // Events deleted first do not have their bodies dropped as well.
    let bodies = one(
        &format!(
            "SELECT count(*) FROM events e WHERE e.source = ?1 AND e.received_at < ?2
               AND e.erased_at IS NULL AND {NO_OPEN_JOB}
               AND NOT (e.received_at < ?3)"
        ),
        args![&c.source, c.bodies_before, c.keys_before],
    )? + one(
        // Kept bodies of mismatched duplicates, as a prune drops them
        // (those of events deleted first go with their event).
        &format!(
            "SELECT count(*) FROM incident_payloads p JOIN incidents i ON i.id = p.incident_id
             WHERE i.source = ?1 AND i.created_at < ?2
               AND NOT EXISTS (SELECT 1 FROM events e
                   WHERE e.source = i.source AND e.event_id = i.event_id
                     AND e.received_at < ?3 AND {NO_OPEN_JOB})"
        ),
        args![&c.source, c.bodies_before, c.keys_before],
    )?;
    let deliveries = one(
        &format!(
            "SELECT count(*) FROM deliveries d WHERE d.source = ?1 AND (
                 (d.event_id IS NULL AND d.received_at < ?2)
                 OR d.event_id IN (SELECT e.event_id FROM events e
                     WHERE e.source = ?1 AND e.received_at < ?2 AND {NO_OPEN_JOB}))"
        ),
        args![&c.source, c.keys_before],
    )?;
    Ok(Counts {
        source: c.source.clone(),
        events,
        bodies,
        deliveries,
        kept,
    })
}

fn count_kept(conn: &Db<'_>, c: &Cutoffs) -> Result<u64, StoreError> {
    let n = conn
        .query_one(
            &format!(
                "SELECT count(*) FROM events e WHERE e.source = ?1 AND e.received_at < ?2 AND NOT {NO_OPEN_JOB}"
            ),
            args![&c.source, c.keys_before],
        )?
        .i64(0)?;
    Ok(n.max(0) as u64)
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
        let mut handle = open_db_read(config)?;
        let db = handle.db();
        let mut all = Vec::new();
        for c in cutoffs(config, now) {
            all.push(count(&db, &c).map_err(CommandError::Storage)?);
        }
        print_counts(&mut out, config, &all, true)?;
        writeln!(out, "dry run: nothing changed")?;
        return Ok(Outcome::Done);
    }
    if let Some(url) = &config.postgres {
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
        conn.execute_batch("BEGIN IMMEDIATE")?;
        match op.run_sqlite(&conn) {
            Ok(n) => {
                conn.execute_batch("COMMIT")?;
                Ok(n)
            }
            Err(e) => {
                let _ = conn.execute_batch("ROLLBACK");
                Err(e)
            }
        }
    };
    let mut all =
        prune_all(config, now, &|| false, &mut run_batch).map_err(CommandError::Storage)?;
    for (counts, c) in all.iter_mut().zip(cutoffs(config, now)) {
        counts.kept = count_kept(&Db::sqlite(&conn), &c).unwrap_or(0);
    }
    print_counts(&mut out, config, &all, false)?;
    // Each step is its own short transaction (autocommit).
    let mut first = true;
    let given = give_back(&|| false, &mut |op| {
        if !first {
            std::thread::sleep(Duration::from_millis(5));
        }
        first = false;
        op(&conn)
    });
    match given.map_err(CommandError::Storage)? {
        Some((pages, left)) => writeln!(
            out,
            "gave {} KiB back to the file system{}",
            pages * page_size(&conn) / 1024,
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
    use anyhow::Context as _;
    // Refuses a database serve has not migrated yet.
    let mut handle = open_db_write(config)?;
    let settings =
        crate::store::pg::Settings::from_url(url, config.durability, config.busy_timeout)
            .map_err(anyhow::Error::msg)?;
    let mut session = crate::store::pg_tx::Session::new(settings);
    let pruned = prune_all(config, now, &|| false, &mut |op: Batch| {
        session.transaction(|tx| op.run_postgres(tx.client()))
    });
    let mut all = pruned.map_err(CommandError::Storage)?;
    let db = handle.db();
    for (counts, c) in all.iter_mut().zip(cutoffs(config, now)) {
        counts.kept =
            count_kept(&db, &c).with_context(|| format!("cannot count what {url} kept"))?;
    }
    let mut out = stdout();
    print_counts(&mut out, config, &all, false)?;
    writeln!(out, "the freed rows are reused by PostgreSQL's autovacuum")?;
    Ok(Outcome::Done)
}

fn page_size(conn: &Connection) -> i64 {
    conn.query_row("PRAGMA page_size", [], |r| r.get(0))
        .unwrap_or(4096)
}

/// One step of giving space back, run through `step` (a short write
/// transaction each): (free pages before, free pages left).
type VacuumOp = Box<dyn FnOnce(&Connection) -> Result<(i64, i64), StoreError> + Send>;

/// Gives the pages pruning freed back to the file system, a few MiB per
/// step. Returns (pages given back, free pages left), or None when the
/// database has no incremental auto-vacuum (created before it was the
/// default).
fn give_back(
    stop: &dyn Fn() -> bool,
    step: &mut dyn FnMut(VacuumOp) -> Result<(i64, i64), StoreError>,
) -> Result<Option<(i64, i64)>, StoreError> {
    let mut given = 0;
    loop {
        if stop() {
            return Ok(Some((given, -1)));
        }
        let (before, left) = step(Box::new(|conn: &Connection| {
            let mode: i64 = conn.query_row("PRAGMA auto_vacuum", [], |r| r.get(0))?;
            if mode != 2 {
                return Ok((-1, 0));
            }
            let before: i64 = conn.query_row("PRAGMA freelist_count", [], |r| r.get(0))?;
            if before == 0 {
                return Ok((0, 0));
            }
            Ok((before, crate::store::vacuum_step(conn)?))
        }))?;
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

/// Where the pruner's batches run.
pub enum Storage {
    Sqlite(Writer),
    Postgres(Box<crate::store::pg::Settings>),
}

impl Background {
    /// Starts the pruner; an interval of zero disables it.
    pub fn start(config: Arc<Config>, storage: Storage) -> Background {
        if config.prune_interval.is_zero() {
            return Background { inner: None };
        }
        let signal: Arc<StopSignal> = Arc::new((Mutex::new(false), Condvar::new()));
        let thread_signal = signal.clone();
        let spawned = std::thread::Builder::new()
            .name("idemhook-prune".into())
            .spawn(move || run(&config, storage, &thread_signal));
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

fn run(config: &Config, storage: Storage, signal: &StopSignal) {
    let stopping = || signal.0.lock().map(|s| *s).unwrap_or(true);
    let (writer, mut session) = match storage {
        Storage::Sqlite(writer) => (Some(writer), None),
        Storage::Postgres(settings) => (None, Some(crate::store::pg_tx::Session::new(*settings))),
    };
    loop {
        if stopping() {
            return;
        }
        let pruned = match (&writer, &mut session) {
            (Some(writer), _) => prune_all(config, now_ms(), &stopping, &mut |op: Batch| {
                writer.call(move |conn| op.run_sqlite(conn))
            }),
            (None, Some(session)) => prune_all(config, now_ms(), &stopping, &mut |op: Batch| {
                session.transaction(|tx| op.run_postgres(tx.client()))
            }),
            (None, None) => return,
        };
        match pruned {
            Ok(all) => {
                if let Some(writer) = &writer
                    && all.iter().any(|c| c.events + c.bodies + c.deliveries > 0)
                {
                    let mut step = |op: VacuumOp| writer.call(op);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Refused deliveries are found through the (source, event_id) index,
    /// not by walking deliveries from the oldest.
    #[test]
    fn refused_deliveries_are_found_through_an_index() {
        let conn = db();
        let plan = crate::store::query_plan(&conn, REFUSED_BATCH, params!["pay", 1_000, 500]);
        assert!(
            plan.contains("USING INDEX deliveries_event_other"),
            "{plan}"
        );
    }

    fn db() -> Connection {
        let mut conn = Connection::open_in_memory().unwrap();
        crate::store::migrate(&mut conn).unwrap();
        conn
    }

    fn event(conn: &Connection, id: &str, at: i64, job_status: Option<&str>) {
        conn.execute(
            "INSERT INTO events (source, event_id, state, received_at, payload, headers, payload_hash)
             VALUES ('s', ?1, 'completed', ?2, x'7b7d', '{}', 'h')",
            params![id, at],
        )
        .unwrap();
        conn.execute(
            "INSERT INTO deliveries (source, event_id, received_at, outcome) VALUES ('s', ?1, ?2, 'accepted')",
            params![id, at],
        )
        .unwrap();
        if let Some(status) = job_status {
            conn.execute(
                "INSERT INTO jobs (source, event_id, action, kind, status, created_at, updated_at)
                 VALUES ('s', ?1, 'a', 'forward', ?2, ?3, ?3)",
                params![id, status, at],
            )
            .unwrap();
        }
    }

    fn n(conn: &Connection, sql: &str) -> i64 {
        conn.query_row(sql, [], |r| r.get(0)).unwrap()
    }

    #[test]
    fn keeps_what_open_or_failed_jobs_need() {
        let conn = db();
        event(&conn, "old-done", 100, Some("done"));
        event(&conn, "old-none", 100, None);
        for status in ["pending", "processing", "paused", "failed"] {
            event(&conn, &format!("old-{status}"), 100, Some(status));
        }
        event(&conn, "new", 10_000, Some("done"));
        let (events, deliveries) = delete_events_batch(&conn, "s", 5_000, BATCH).unwrap();
        assert_eq!((events, deliveries), (2, 2));
        assert_eq!(n(&conn, "SELECT count(*) FROM events"), 5);
        assert_eq!(
            n(&conn, "SELECT count(*) FROM jobs WHERE status = 'done'"),
            1
        );
        let erased = erase_bodies_batch(&conn, "s", 20_000, 30_000, BATCH).unwrap();
        assert_eq!(erased, 1, "only the new done event loses its body");
        assert_eq!(
            n(&conn, "SELECT count(*) FROM events WHERE payload IS NULL"),
            1
        );
    }

    /// A mismatched duplicate's kept body goes with payload_retention (by
    /// when it arrived), and with its event.
    #[test]
    fn mismatched_bodies_follow_payload_retention() {
        let conn = db();
        event(&conn, "e", 100, None);
        for at in [200, 9_000] {
            conn.execute(
                "INSERT INTO incidents (source, event_id, kind, created_at) VALUES ('s', 'e', 'payload_mismatch', ?1)",
                [at],
            )
            .unwrap();
            conn.execute(
                "INSERT INTO incident_payloads (incident_id, payload) VALUES (last_insert_rowid(), x'7b7d')",
                [],
            )
            .unwrap();
        }
        let planned = count(
            &Db::sqlite(&conn),
            &Cutoffs {
                source: "s".to_string(),
                keys_before: 50,
                bodies_before: 5_000,
            },
        )
        .unwrap();
        assert_eq!(planned.bodies, 2, "the dry run counts what the prune drops");
        let dropped = erase_bodies_batch(&conn, "s", 5_000, 6_000, BATCH).unwrap();
        assert_eq!(dropped, 2, "the event's body and the older mismatched one");
        assert_eq!(n(&conn, "SELECT count(*) FROM incident_payloads"), 1);
        assert_eq!(
            n(&conn, "SELECT count(*) FROM incidents"),
            2,
            "the incidents stay"
        );
        assert_eq!(delete_events_batch(&conn, "s", 5_000, BATCH).unwrap().0, 1);
        assert_eq!(n(&conn, "SELECT count(*) FROM incident_payloads"), 0);
    }

    #[test]
    fn batches_are_bounded() {
        let conn = db();
        for i in 0..7 {
            event(&conn, &format!("e{i}"), 100, None);
        }
        assert_eq!(delete_events_batch(&conn, "s", 5_000, 3).unwrap().0, 3);
        assert_eq!(delete_events_batch(&conn, "s", 5_000, 3).unwrap().0, 3);
        assert_eq!(delete_events_batch(&conn, "s", 5_000, 3).unwrap().0, 1);
    }
}
