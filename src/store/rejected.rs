//! The `rejected` table: refused deliveries kept whole for `reingest`, and
//! `rejected_totals`, their bytes per source (kept with every write, so the
//! cap and the gauge never sum the table) and what re-ingests did.
//!
//! Every write of a source's rows first updates its `rejected_totals` row,
//! so on PostgreSQL the writers of one source (claimers of every
//! instance, the pruner, `reingest`) take their locks in one order.

use crate::args;
use crate::store::StoreError;
use crate::store::db::{Db, Row};

/// A refused delivery to keep.
pub struct NewKept<'a> {
    pub source: &'a str,
    pub received_at: i64,
    pub reason: &'a str,
    pub remote: &'a str,
    pub query: &'a str,
    /// The request's headers as a JSON array of `[name, value]`.
    pub headers: &'a str,
    pub body: &'a [u8],
}

impl NewKept<'_> {
    /// What counts against `keep_rejected_bytes`: the body and the headers.
    pub fn stored(&self) -> i64 {
        (self.body.len() + self.headers.len()) as i64
    }
}

/// One kept request as listed.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Kept {
    pub id: i64,
    pub source: String,
    pub received_at: i64,
    pub reason: String,
    pub remote: String,
    /// The body's size.
    pub bytes: i64,
}

/// One kept request whole.
#[derive(Debug, Clone)]
pub struct KeptRequest {
    pub kept: Kept,
    pub query: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

/// Per source: the bytes kept and what re-ingests did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Totals {
    pub source: String,
    pub stored: i64,
    pub accepted: i64,
    pub duplicate: i64,
    pub failed: i64,
}

/// Locks (PostgreSQL) and returns the source's totals row, made if missing.
fn lock_totals(db: &Db<'_>, source: &str) -> Result<i64, StoreError> {
    db.execute(
        "INSERT INTO rejected_totals (source) VALUES (?1) ON CONFLICT (source) DO NOTHING",
        args![source],
    )?;
    db.query_one(
        &format!(
            "SELECT stored FROM rejected_totals WHERE source = ?1{}",
            db.dialect().for_update()
        ),
        args![source],
    )?
    .i64(0)
}

fn set_stored(db: &Db<'_>, source: &str, stored: i64) -> Result<(), StoreError> {
    db.execute(
        "UPDATE rejected_totals SET stored = ?2 WHERE source = ?1",
        args![source, stored.max(0)],
    )?;
    Ok(())
}

/// Keeps `k` and drops the source's oldest kept requests until the kept
/// bytes are within `cap` again, in the caller's transaction. A request
/// larger than `cap` alone is not kept (false).
pub fn keep(db: &Db<'_>, k: &NewKept<'_>, cap: u64) -> Result<bool, StoreError> {
    let cap = i64::try_from(cap).unwrap_or(i64::MAX);
    let stored = k.stored();
    if stored > cap {
        return Ok(false);
    }
    let mut total = lock_totals(db, k.source)? + stored;
    db.execute(
        "INSERT INTO rejected (source, received_at, reason, remote, query, headers, body, bytes, stored)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
        args![
            k.source,
            k.received_at,
            k.reason,
            k.remote,
            k.query,
            k.headers,
            k.body,
            k.body.len() as i64,
            stored
        ],
    )?;
    while total > cap {
        let oldest = db.query(
            "SELECT id, stored FROM rejected WHERE source = ?1 ORDER BY id LIMIT 64",
            args![k.source],
        )?;
        if oldest.is_empty() {
            total = 0;
            break;
        }
        for row in &oldest {
            if total <= cap {
                break;
            }
            db.execute("DELETE FROM rejected WHERE id = ?1", args![row.i64(0)?])?;
            total -= row.i64(1)?;
        }
    }
    set_stored(db, k.source, total)?;
    Ok(true)
}

fn kept_of(r: &Row) -> Result<Kept, StoreError> {
    Ok(Kept {
        id: r.i64(0)?,
        source: r.string(1)?,
        received_at: r.i64(2)?,
        reason: r.string(3)?,
        remote: r.string(4)?,
        bytes: r.i64(5)?,
    })
}

const COLUMNS: &str = "id, source, received_at, reason, remote, bytes";

/// The kept requests of `source` (all sources: None) received at or after
/// `since` (ms), oldest first, at most `limit`.
pub fn list(
    db: &Db<'_>,
    source: Option<&str>,
    since: i64,
    limit: i64,
) -> Result<Vec<Kept>, StoreError> {
    let rows = match source {
        Some(s) => db.query(
            &format!(
                "SELECT {COLUMNS} FROM rejected WHERE source = ?1 AND received_at >= ?2
                 ORDER BY id LIMIT ?3"
            ),
            args![s, since, limit],
        )?,
        None => db.query(
            &format!("SELECT {COLUMNS} FROM rejected WHERE received_at >= ?1 ORDER BY id LIMIT ?2"),
            args![since, limit],
        )?,
    };
    rows.iter().map(kept_of).collect()
}

/// One kept request whole.
pub fn get(db: &Db<'_>, id: i64) -> Result<Option<KeptRequest>, StoreError> {
    let Some(r) = db.query_opt(
        &format!("SELECT {COLUMNS}, query, headers, body FROM rejected WHERE id = ?1"),
        args![id],
    )?
    else {
        return Ok(None);
    };
    let headers: Vec<(String, String)> = serde_json::from_str(&r.string(7)?)
        .map_err(|e| StoreError::other(format!("rejected {id}: headers: {e}")))?;
    Ok(Some(KeptRequest {
        kept: kept_of(&r)?,
        query: r.string(6)?,
        headers,
        body: r.opt_bytes(8)?.unwrap_or_default().to_vec(),
    }))
}

/// Removes a kept request (re-ingested); false when it was gone already.
pub fn remove(db: &Db<'_>, source: &str, id: i64) -> Result<bool, StoreError> {
    let total = lock_totals(db, source)?;
    let gone = db.query(
        "DELETE FROM rejected WHERE id = ?1 AND source = ?2 RETURNING stored",
        args![id, source],
    )?;
    let freed: i64 = gone.iter().map(|r| r.i64(0)).sum::<Result<i64, _>>()?;
    set_stored(db, source, total - freed)?;
    Ok(!gone.is_empty())
}

/// A kept request's new reason (it still fails).
pub fn set_reason(db: &Db<'_>, id: i64, reason: &str) -> Result<(), StoreError> {
    db.execute(
        "UPDATE rejected SET reason = ?2 WHERE id = ?1",
        args![id, reason],
    )?;
    Ok(())
}

/// Counts one re-ingested request's outcome (accepted, duplicate, failed).
pub fn count_reingest(db: &Db<'_>, source: &str, outcome: &str) -> Result<(), StoreError> {
    let column = match outcome {
        "accepted" => "accepted",
        "duplicate" => "duplicate",
        _ => "failed",
    };
    db.execute(
        "INSERT INTO rejected_totals (source) VALUES (?1) ON CONFLICT (source) DO NOTHING",
        args![source],
    )?;
    db.execute(
        &format!("UPDATE rejected_totals SET {column} = {column} + 1 WHERE source = ?1"),
        args![source],
    )?;
    Ok(())
}

/// Every source's totals.
pub fn totals(db: &Db<'_>) -> Result<Vec<Totals>, StoreError> {
    db.query(
        "SELECT source, stored, accepted, duplicate, failed FROM rejected_totals ORDER BY source",
        &[],
    )?
    .iter()
    .map(|r| {
        Ok(Totals {
            source: r.string(0)?,
            stored: r.i64(1)?,
            accepted: r.i64(2)?,
            duplicate: r.i64(3)?,
            failed: r.i64(4)?,
        })
    })
    .collect()
}

/// Deletes up to `limit` of `source`'s kept requests received before
/// `before` (ms), in the caller's transaction; how many.
pub fn prune_batch(
    db: &Db<'_>,
    source: &str,
    before: i64,
    limit: usize,
) -> Result<u64, StoreError> {
    let total = lock_totals(db, source)?;
    let gone = db.query(
        "DELETE FROM rejected WHERE id IN (
             SELECT id FROM rejected WHERE source = ?1 AND received_at < ?2 ORDER BY id LIMIT ?3)
         RETURNING stored",
        args![source, before, limit as i64],
    )?;
    let freed: i64 = gone.iter().map(|r| r.i64(0)).sum::<Result<i64, _>>()?;
    if freed > 0 {
        set_stored(db, source, total - freed)?;
    }
    Ok(gone.len() as u64)
}
