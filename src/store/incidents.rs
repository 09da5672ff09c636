//! The `incidents` table's reads for the operator side: an event's
//! incidents with the bodies they came with, and how many an event has.

use crate::args;
use crate::store::StoreError;
use crate::store::db::{self, Db};

/// One incident of an event.
#[derive(Debug, Clone, PartialEq)]
pub struct IncidentRow {
    pub kind: String,
    pub created_at: i64,
    pub detail: Option<String>,
    /// The body it came with, when kept (`incident_payloads`).
    pub payload: db::Value,
}

/// The event's incidents, oldest first.
pub fn of_event(db: &Db<'_>, source: &str, event_id: &str) -> Result<Vec<IncidentRow>, StoreError> {
    db.query(
        "SELECT i.kind, i.created_at, i.detail, p.payload FROM incidents i
         LEFT JOIN incident_payloads p ON p.incident_id = i.id
         WHERE i.source = ?1 AND i.event_id = ?2 ORDER BY i.id",
        args![source, event_id],
    )?
    .iter()
    .map(|r| {
        Ok(IncidentRow {
            kind: r.string(0)?,
            created_at: r.i64(1)?,
            detail: r.opt_string(2)?,
            payload: r.get(3).clone(),
        })
    })
    .collect()
}

/// How many incidents the event has.
pub fn count_of_event(db: &Db<'_>, source: &str, event_id: &str) -> Result<i64, StoreError> {
    db.query_one(
        "SELECT count(*) FROM incidents WHERE source = ?1 AND event_id = ?2",
        args![source, event_id],
    )?
    .i64(0)
}

/// The times (ms) of the event's incidents, in the order of [`of_event`].
pub fn times_of_event(db: &Db<'_>, source: &str, event_id: &str) -> Result<Vec<i64>, StoreError> {
    db.query(
        "SELECT created_at FROM incidents WHERE source = ?1 AND event_id = ?2 ORDER BY id",
        args![source, event_id],
    )?
    .iter()
    .map(|r| r.i64(0))
    .collect()
}

/// Drops the bodies kept with the event's incidents (its mismatched
/// duplicates); the incidents stay.
pub fn drop_payloads(db: &Db<'_>, source: &str, event_id: &str) -> Result<(), StoreError> {
    db.execute(
        "DELETE FROM incident_payloads WHERE incident_id IN
             (SELECT id FROM incidents WHERE source = ?1 AND event_id = ?2)",
        args![source, event_id],
    )?;
    Ok(())
}
