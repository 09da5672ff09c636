//! SQLite's statements of a prune batch ([`Batch`], whose cut-offs and
//! order `ops::prune` decides) and the space given back by the
//! incremental vacuum.
//!
//! An event with a pending, processing, paused or failed job is never
//! deleted and keeps its body ([`NO_OPEN_JOB`]).

use rusqlite::{Connection, params};

use crate::store::StoreError;
use crate::store::db::Db;
use crate::store::deliveries::OF_EVENT;
use crate::store::prune::{BATCH, Batch, NO_OPEN_JOB};

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
            Batch::Kept { source, before } => Ok((
                crate::store::rejected::prune_batch(&Db::sqlite(conn), source, *before, BATCH)?,
                0,
            )),
        }
    }

    /// Runs the batch on SQLite in a `BEGIN IMMEDIATE` transaction of its
    /// own on `conn` (an operator command's connection).
    pub fn run_sqlite_alone(&self, conn: &Connection) -> Result<(u64, u64), StoreError> {
        conn.execute_batch("BEGIN IMMEDIATE")?;
        match self.run_sqlite(conn) {
            Ok(n) => {
                conn.execute_batch("COMMIT")?;
                Ok(n)
            }
            Err(e) => {
                let _ = conn.execute_batch("ROLLBACK");
                Err(e)
            }
        }
    }
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

/// One step of the incremental vacuum: (free pages before, free pages
/// left); (-1, 0) when the database has no incremental auto-vacuum.
pub fn vacuum_once(conn: &Connection) -> Result<(i64, i64), StoreError> {
    let mode: i64 = conn.query_row("PRAGMA auto_vacuum", [], |r| r.get(0))?;
    if mode != 2 {
        return Ok((-1, 0));
    }
    let before: i64 = conn.query_row("PRAGMA freelist_count", [], |r| r.get(0))?;
    if before == 0 {
        return Ok((0, 0));
    }
    Ok((before, super::vacuum_step(conn)?))
}

/// The database's page size in bytes (4096 when it cannot be read).
pub fn page_size(conn: &Connection) -> i64 {
    conn.query_row("PRAGMA page_size", [], |r| r.get(0))
        .unwrap_or(4096)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::prune::count;

    /// Refused deliveries are found through the (source, event_id) index,
    /// not by walking deliveries from the oldest.
    #[test]
    fn refused_deliveries_are_found_through_an_index() {
        let conn = db();
        let plan = super::super::query_plan(&conn, REFUSED_BATCH, params!["pay", 1_000, 500]);
        assert!(
            plan.contains("USING INDEX deliveries_event_other"),
            "{plan}"
        );
    }

    fn db() -> Connection {
        let mut conn = Connection::open_in_memory().unwrap();
        super::super::migrate(&mut conn).unwrap();
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
        let planned = count(&Db::sqlite(&conn), "s", 50, 5_000).unwrap();
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
