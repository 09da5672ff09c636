//! The `deliveries` table's reads for the operator side: an event's
//! deliveries, found through indexes by [`OF_EVENT`].

use crate::args;
use crate::state::Delivery;
use crate::store::StoreError;
use crate::store::db::Db;

/// A delivery row, as the claim (one at a time) and a refusal's record
/// write it, on both backends (`?N`).
pub const INSERT: &str =
    "INSERT INTO deliveries (source, event_id, received_at, outcome, remote, detail)
     VALUES (?1, ?2, ?3, ?4, ?5, ?6)";

/// The condition that selects one event's delivery rows by id, for
/// `SELECT ... FROM deliveries WHERE {OF_EVENT}` and `DELETE ...`, with
/// ?1 = source, ?2 = event_id and ?3 = the event's received_at (ms). The
/// accepted delivery is not in the (source, event_id) index (see
/// schema.sql); it has the event's received_at, so it is looked up there.
pub const OF_EVENT: &str = "id IN (
    SELECT id FROM deliveries WHERE source = ?1 AND event_id = ?2 AND outcome <> 'accepted'
    UNION ALL
    SELECT id FROM deliveries
     WHERE received_at = ?3 AND source = ?1 AND event_id = ?2 AND outcome = 'accepted')";

/// One delivery of an event.
#[derive(Debug, Clone, PartialEq)]
pub struct DeliveryRow {
    pub received_at: i64,
    pub outcome: Delivery,
    pub remote: Option<String>,
    /// The batch it came in; a claim's delivery row has a detail only then.
    pub batch: Option<String>,
}

/// Every delivery of the event (the accepted one and the redeliveries),
/// in the order they were recorded.
pub fn of_event(
    db: &Db<'_>,
    source: &str,
    event_id: &str,
    received_at: i64,
) -> Result<Vec<DeliveryRow>, StoreError> {
    db.query(
        &format!(
            "SELECT received_at, outcome, remote, detail FROM deliveries
             WHERE {OF_EVENT} ORDER BY id"
        ),
        args![source, event_id, received_at],
    )?
    .iter()
    .map(|r| {
        Ok(DeliveryRow {
            received_at: r.i64(0)?,
            outcome: r.word(1)?,
            remote: r.opt_string(2)?,
            batch: r.opt_string(3)?,
        })
    })
    .collect()
}

/// The times (ms) of the event's deliveries, in the order of [`of_event`].
pub fn times_of_event(
    db: &Db<'_>,
    source: &str,
    event_id: &str,
    received_at: i64,
) -> Result<Vec<i64>, StoreError> {
    db.query(
        &format!("SELECT received_at FROM deliveries WHERE {OF_EVENT} ORDER BY id"),
        args![source, event_id, received_at],
    )?
    .iter()
    .map(|r| r.i64(0))
    .collect()
}

/// Deliveries by outcome per bucket of `bucket_ms` from `from` (ms) up to
/// `end`: (the bucket's index from `from`, outcome, count).
pub fn per_bucket(
    db: &Db<'_>,
    from: i64,
    bucket_ms: i64,
    end: i64,
) -> Result<Vec<(i64, Delivery, i64)>, StoreError> {
    db.query(
        "SELECT (received_at - ?1) / ?2, outcome, count(*) FROM deliveries
         WHERE received_at >= ?1 AND received_at < ?3 GROUP BY 1, 2",
        args![from, bucket_ms, end],
    )?
    .iter()
    .map(|r| Ok((r.i64(0)?, r.word(1)?, r.i64(2)?)))
    .collect()
}
