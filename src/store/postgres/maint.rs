//! PostgreSQL's SQL for housekeeping: retention pruning in short batches,
//! the key-rule record (`source_rules`) and what `check` reads of it. The
//! decisions (what a batch is, when to stop, which changes of a rule are
//! warned about) are `ops/prune.rs`'s and `serve.rs`'s, shared with
//! SQLite; only the statements are here.
//!
//! Each prune batch runs in its caller's transaction (one short
//! transaction per batch, `tx::Session`), and every lock it takes is
//! `SKIP LOCKED`: rows another instance's pruner, a replay, a resolve or a
//! worker holds are left for a later batch, so instances pruning at once
//! take disjoint rows, a prune never waits on anyone (so it is never part
//! of a deadlock), and a claim waits at most for one batch (a duplicate of
//! an event being deleted waits for that commit and is then new).

use postgres::Client;

use crate::store::StoreError;
use crate::store::db::Db;
use crate::store::prune::{BATCH, Batch, NO_OPEN_JOB};

impl Batch {
    /// Runs the batch on PostgreSQL, in the caller's transaction (every
    /// lock is SKIP LOCKED, so several instances prune at once on disjoint
    /// rows).
    pub fn run_postgres(&self, client: &mut Client) -> Result<(u64, u64), StoreError> {
        match self {
            Batch::Events { source, before } => delete_events_batch(client, source, *before, BATCH),
            Batch::Bodies {
                source,
                before,
                now,
            } => Ok((erase_bodies_batch(client, source, *before, *now, BATCH)?, 0)),
            Batch::Refused { source, before } => {
                Ok((delete_refused_batch(client, source, *before, BATCH)?, 0))
            }
            Batch::UnknownRefused { known, before } => Ok((
                delete_unknown_refused_batch(client, known, *before, BATCH)?,
                0,
            )),
            Batch::Kept { source, before } => Ok((
                crate::store::rejected::prune_batch(&Db::postgres(client), source, *before, BATCH)?,
                0,
            )),
        }
    }
}

/// Job statuses that keep an event and its body.
const OPEN: [&str; 4] = ["pending", "processing", "paused", "failed"];

/// Of `candidates` (event ids of `source`, their rows already locked by
/// this transaction), those whose every job this transaction could lock
/// too and none of which is open or failed as it is now: a job locked by
/// someone else (a replay re-opening it, a worker) keeps its event for a
/// later batch.
fn settled(
    client: &mut Client,
    source: &str,
    candidates: Vec<String>,
) -> Result<Vec<String>, StoreError> {
    if candidates.is_empty() {
        return Ok(candidates);
    }
    let locked = client.query(
        "SELECT event_id, status FROM jobs WHERE source = $1 AND event_id = ANY($2)
         FOR UPDATE SKIP LOCKED",
        &[&source, &candidates],
    )?;
    let all = client.query(
        "SELECT event_id, count(*) FROM jobs WHERE source = $1 AND event_id = ANY($2)
         GROUP BY event_id",
        &[&source, &candidates],
    )?;
    Ok(candidates
        .into_iter()
        .filter(|id| {
            let mine: Vec<String> = locked
                .iter()
                .filter(|r| r.get::<_, &str>(0) == id.as_str())
                .map(|r| r.get(1))
                .collect();
            let total: i64 = all
                .iter()
                .find(|r| r.get::<_, &str>(0) == id.as_str())
                .map_or(0, |r| r.get(1));
            mine.len() as i64 == total && !mine.iter().any(|s| OPEN.contains(&s.as_str()))
        })
        .collect())
}

/// Deletes up to `limit` events of `source` received before `before` that
/// no open or failed job holds, with their jobs (and, by cascade, their
/// attempts, checks and replays), deliveries, incidents and kept
/// mismatched bodies. Returns (events, deliveries) deleted.
pub fn delete_events_batch(
    client: &mut Client,
    source: &str,
    before: i64,
    limit: usize,
) -> Result<(u64, u64), StoreError> {
    let rows = client.query(
        &format!(
            "SELECT e.event_id, e.received_at FROM events e
             WHERE e.source = $1 AND e.received_at < $2 AND {NO_OPEN_JOB}
             ORDER BY e.received_at LIMIT $3
             FOR UPDATE OF e SKIP LOCKED"
        ),
        &[&source, &before, &(limit as i64)],
    )?;
    let received: Vec<(String, i64)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    let ids = settled(
        client,
        source,
        received.iter().map(|(id, _)| id.clone()).collect(),
    )?;
    if ids.is_empty() {
        return Ok((0, 0));
    }
    let at: Vec<i64> = ids
        .iter()
        .filter_map(|id| received.iter().find(|(r, _)| r == id).map(|(_, at)| *at))
        .collect();
    client.execute(
        "DELETE FROM jobs WHERE source = $1 AND event_id = ANY($2)",
        &[&source, &ids],
    )?;
    // The accepted delivery is not in the (source, event_id) index; it is
    // found by its event's received_at, as on SQLite.
    let mut deliveries = client.execute(
        "DELETE FROM deliveries WHERE source = $1 AND event_id = ANY($2) AND outcome <> 'accepted'",
        &[&source, &ids],
    )?;
    deliveries += client.execute(
        "DELETE FROM deliveries d USING unnest($2::text[], $3::bigint[]) AS u(event_id, received_at)
         WHERE d.received_at = u.received_at AND d.source = $1 AND d.event_id = u.event_id
           AND d.outcome = 'accepted'",
        &[&source, &ids, &at],
    )?;
    client.execute(
        "DELETE FROM incidents WHERE source = $1 AND event_id = ANY($2)",
        &[&source, &ids],
    )?;
    let events = client.execute(
        "DELETE FROM events WHERE source = $1 AND event_id = ANY($2)",
        &[&source, &ids],
    )?;
    Ok((events, deliveries))
}

/// Drops the body and headers of up to `limit` events of `source`
/// received before `before` that no open or failed job holds, and up to
/// `limit` kept bodies of mismatched duplicates that arrived before then.
pub fn erase_bodies_batch(
    client: &mut Client,
    source: &str,
    before: i64,
    now: i64,
    limit: usize,
) -> Result<u64, StoreError> {
    let rows = client.query(
        &format!(
            "SELECT e.event_id FROM events e
             WHERE e.source = $1 AND e.received_at < $2 AND e.erased_at IS NULL AND {NO_OPEN_JOB}
             ORDER BY e.received_at LIMIT $3
             FOR UPDATE OF e SKIP LOCKED"
        ),
        &[&source, &before, &(limit as i64)],
    )?;
    let ids = settled(client, source, rows.iter().map(|r| r.get(0)).collect())?;
    let mut n = 0;
    if !ids.is_empty() {
        n += client.execute(
            "UPDATE events SET payload = NULL, headers = NULL, erased_at = $3
             WHERE source = $1 AND event_id = ANY($2)",
            &[&source, &ids, &now],
        )?;
    }
    n += client.execute(
        "DELETE FROM incident_payloads WHERE incident_id IN (
             SELECT p.incident_id FROM incident_payloads p JOIN incidents i ON i.id = p.incident_id
             WHERE i.source = $1 AND i.created_at < $2 LIMIT $3
             FOR UPDATE OF p SKIP LOCKED)",
        &[&source, &before, &(limit as i64)],
    )?;
    Ok(n)
}

/// Deletes up to `limit` refused deliveries (no event) of `source`
/// received before `before` (through the partial (source, event_id)
/// index: a refused delivery is never 'accepted').
pub fn delete_refused_batch(
    client: &mut Client,
    source: &str,
    before: i64,
    limit: usize,
) -> Result<u64, StoreError> {
    Ok(client.execute(
        "DELETE FROM deliveries WHERE id IN (
             SELECT id FROM deliveries
             WHERE source = $1 AND event_id IS NULL AND outcome <> 'accepted' AND received_at < $2
             LIMIT $3 FOR UPDATE SKIP LOCKED)",
        &[&source, &before, &(limit as i64)],
    )?)
}

/// Deletes up to `limit` refused deliveries of sources not in `known`
/// received before `before`.
pub fn delete_unknown_refused_batch(
    client: &mut Client,
    known: &[String],
    before: i64,
    limit: usize,
) -> Result<u64, StoreError> {
    Ok(client.execute(
        "DELETE FROM deliveries WHERE id IN (
             SELECT id FROM deliveries
             WHERE event_id IS NULL AND received_at < $2 AND source <> ALL($1)
             LIMIT $3 FOR UPDATE SKIP LOCKED)",
        &[&known, &before, &(limit as i64)],
    )?)
}

/// The server a connection reached, for `check`: its address (or "a unix
/// socket"), its port (0 for a socket) and whether it refuses writes.
pub fn reached(client: &mut Client) -> Result<(String, i32, bool), StoreError> {
    let r = client.query_one(
        "SELECT coalesce(host(inet_server_addr()), 'a unix socket'),
                coalesce(inet_server_port(), 0),
                current_setting('transaction_read_only') = 'on'",
        &[],
    )?;
    Ok((r.get(0), r.get(1), r.get(2)))
}
