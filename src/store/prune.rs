//! Retention's storage: a prune batch as data ([`Batch`]), which each
//! wing runs with statements of its own (`sqlite/prune.rs`;
//! `postgres/maint.rs`, every lock `SKIP LOCKED`), and what a prune would
//! delete, counted on either backend. `ops::prune` decides the cut-offs,
//! the order and when to stop.
//!
//! An event with a pending, processing, paused or failed job is never
//! deleted and keeps its body ([`NO_OPEN_JOB`]).

use serde::Serialize;

use crate::args;
use crate::store::StoreError;
use crate::store::db::{Db, Value};

/// Rows one batch (one write transaction) touches at most.
pub const BATCH: usize = 500;

/// The condition that holds an event back: work that still needs it.
pub const NO_OPEN_JOB: &str = "NOT EXISTS (SELECT 1 FROM jobs j
        WHERE j.source = e.source AND j.event_id = e.event_id
          AND j.status IN ('pending', 'processing', 'paused', 'failed'))";

/// One batch of pruning, as data: each backend runs it in one short
/// write transaction of its own (`Batch::run_sqlite`, `Batch::run_postgres`,
/// in the wings).
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
    /// Kept refused requests past `keep_rejected`.
    Kept { source: String, before: i64 },
}

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

/// What a prune would do, counted on a read-only connection of either
/// backend.
pub fn count(
    conn: &Db<'_>,
    source: &str,
    keys_before: i64,
    bodies_before: i64,
) -> Result<Counts, StoreError> {
    let one = |sql: &str, p: &[Value]| -> Result<u64, StoreError> {
        let n = conn.query_one(sql, p)?.i64(0)?;
        Ok(n.max(0) as u64)
    };
    let events = one(
        &format!(
            "SELECT count(*) FROM events e WHERE e.source = ?1 AND e.received_at < ?2 AND {NO_OPEN_JOB}"
        ),
        args![source, keys_before],
    )?;
    let kept = one(
        &format!(
            "SELECT count(*) FROM events e WHERE e.source = ?1 AND e.received_at < ?2 AND NOT {NO_OPEN_JOB}"
        ),
        args![source, keys_before],
    )?;
    // Events deleted first do not have their bodies dropped as well.
    let bodies = one(
        &format!(
            "SELECT count(*) FROM events e WHERE e.source = ?1 AND e.received_at < ?2
               AND e.erased_at IS NULL AND {NO_OPEN_JOB}
               AND NOT (e.received_at < ?3)"
        ),
        args![source, bodies_before, keys_before],
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
        args![source, bodies_before, keys_before],
    )?;
    let deliveries = one(
        &format!(
            "SELECT count(*) FROM deliveries d WHERE d.source = ?1 AND (
                 (d.event_id IS NULL AND d.received_at < ?2)
                 OR d.event_id IN (SELECT e.event_id FROM events e
                     WHERE e.source = ?1 AND e.received_at < ?2 AND {NO_OPEN_JOB}))"
        ),
        args![source, keys_before],
    )?;
    Ok(Counts {
        source: source.to_string(),
        events,
        bodies,
        deliveries,
        kept,
    })
}

/// Events of `source` received before `keys_before` that a job still needs.
pub fn count_kept(conn: &Db<'_>, source: &str, keys_before: i64) -> Result<u64, StoreError> {
    let n = conn
        .query_one(
            &format!(
                "SELECT count(*) FROM events e WHERE e.source = ?1 AND e.received_at < ?2 AND NOT {NO_OPEN_JOB}"
            ),
            args![source, keys_before],
        )?
        .i64(0)?;
    Ok(n.max(0) as u64)
}
