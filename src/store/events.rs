//! The `events` table's reads for the operator side, on both backends
//! (one text each, over [`Db`]): the list an operator filters, and one
//! event's row. States come back as [`EventState`], never as words.

use std::fmt::Write as _;

use crate::args;
use crate::state::EventState;
use crate::store::StoreError;
use crate::store::db::{self, Db, Dialect};

/// The claim's and the outbox's statements on `events`, written once for
/// both backends (`?N`; PostgreSQL's wing rewrites them to `$N`): the
/// stored state and payload hash of an event (a duplicate's claim).
pub const STATE_AND_HASH: &str =
    "SELECT state, payload_hash FROM events WHERE source = ?1 AND event_id = ?2";

/// What a forward sends of its event.
pub const FORWARDED: &str =
    "SELECT type, payload, content_type FROM events WHERE source = ?1 AND event_id = ?2";

/// accepted -> processing, when a worker takes one of its jobs.
pub const MARK_PROCESSING: &str = "UPDATE events SET state = 'processing'
     WHERE source = ?1 AND event_id = ?2 AND state = 'accepted'";

/// What `events list` and `GET /api/events` select.
#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    pub source: Option<String>,
    pub state: Option<EventState>,
    pub event_type: Option<String>,
    /// Only events received at or after this time (ms).
    pub since_ms: Option<i64>,
    /// Only events received before this time (ms).
    pub until_ms: Option<i64>,
    /// Only events whose id starts with this.
    pub event_id_prefix: Option<String>,
    /// 0 means no limit.
    pub limit: u32,
}

/// One event of a list.
#[derive(Debug, Clone, PartialEq)]
pub struct Listed {
    pub source: String,
    pub event_id: String,
    pub event_type: Option<String>,
    pub state: EventState,
    pub received_at: i64,
    /// A job of the event is paused (its action waits for `resume`).
    pub paused: bool,
}

/// Events, newest first.
pub fn list(db: &Db<'_>, filter: &ListFilter) -> Result<Vec<Listed>, StoreError> {
    let mut sql = String::from(
        "SELECT source, event_id, type, state, received_at,
                EXISTS (SELECT 1 FROM jobs j WHERE j.source = events.source
                          AND j.event_id = events.event_id AND j.status = 'paused')
         FROM events WHERE 1 = 1",
    );
    let mut args: Vec<db::Value> = Vec::new();
    let dialect = db.dialect();
    let mut add = |clause: &str, value: db::Value| {
        args.push(value);
        let _ = write!(sql, " AND {clause} ?{}", args.len());
    };
    if let Some(s) = &filter.source {
        add("source =", s.into());
    }
    if let Some(s) = filter.state {
        add("state =", s.into());
    }
    if let Some(t) = &filter.event_type {
        add("type =", t.into());
    }
    if let Some(at) = filter.since_ms {
        add("received_at >=", at.into());
    }
    if let Some(at) = filter.until_ms {
        add("received_at <", at.into());
    }
    if let Some(prefix) = &filter.event_id_prefix {
        // Every id that starts with the prefix sorts from it up to it
        // followed by the highest character, in binary order (SQLite's
        // own; PostgreSQL's column collation may ignore punctuation).
        let id = match dialect {
            Dialect::Sqlite => "event_id",
            Dialect::Postgres => "event_id COLLATE \"C\"",
        };
        add(&format!("{id} >="), prefix.into());
        add(&format!("{id} <"), format!("{prefix}\u{10FFFF}").into());
    }
    // Events received in the same millisecond: the one stored last first
    // on SQLite (rowid); PostgreSQL has no insertion order, so by key.
    sql.push_str(match dialect {
        Dialect::Sqlite => " ORDER BY received_at DESC, rowid DESC",
        Dialect::Postgres => " ORDER BY received_at DESC, source DESC, event_id DESC",
    });
    if filter.limit > 0 {
        args.push(filter.limit.into());
        let _ = write!(sql, " LIMIT ?{}", args.len());
    }
    db.query(&sql, &args)?
        .iter()
        .map(|r| {
            Ok(Listed {
                source: r.string(0)?,
                event_id: r.string(1)?,
                event_type: r.opt_string(2)?,
                state: r.word(3)?,
                received_at: r.i64(4)?,
                paused: r.bool(5)?,
            })
        })
        .collect()
}

/// One event's row, as `events show` and the inspector read it.
#[derive(Debug, Clone, PartialEq)]
pub struct EventRow {
    pub event_type: Option<String>,
    pub state: EventState,
    pub received_at: i64,
    pub completed_at: Option<i64>,
    /// The stored body (bytes, or text on an old SQLite row); NULL once
    /// erased or pruned.
    pub payload: db::Value,
    pub payload_hash: String,
    pub verified_with: Option<i64>,
    /// The kept headers, a JSON object; None once erased.
    pub headers: Option<String>,
    pub content_type: Option<String>,
    pub erased_at: Option<i64>,
}

/// The event `source`/`event_id`, if it is stored.
pub fn get(db: &Db<'_>, source: &str, event_id: &str) -> Result<Option<EventRow>, StoreError> {
    db.query_opt(
        "SELECT type, state, received_at, completed_at, payload, payload_hash, verified_with,
                headers, content_type, erased_at
         FROM events WHERE source = ?1 AND event_id = ?2",
        args![source, event_id],
    )?
    .map(|r| {
        Ok(EventRow {
            event_type: r.opt_string(0)?,
            state: r.word(1)?,
            received_at: r.i64(2)?,
            completed_at: r.opt_i64(3)?,
            payload: r.get(4).clone(),
            payload_hash: r.string(5)?,
            verified_with: r.opt_i64(6)?,
            headers: r.opt_string(7)?,
            content_type: r.opt_string(8)?,
            erased_at: r.opt_i64(9)?,
        })
    })
    .transpose()
}

/// What the inspector shows beside an event and the JSON leaves out.
#[derive(Debug, Clone, PartialEq)]
pub struct Kept {
    pub content_type: Option<String>,
    pub headers: Option<String>,
    pub erased_at: Option<i64>,
    pub received_at: i64,
}

/// [`Kept`] of the event, without reading its body.
pub fn kept(db: &Db<'_>, source: &str, event_id: &str) -> Result<Option<Kept>, StoreError> {
    db.query_opt(
        "SELECT content_type, headers, erased_at, received_at FROM events
         WHERE source = ?1 AND event_id = ?2",
        args![source, event_id],
    )?
    .map(|r| {
        Ok(Kept {
            content_type: r.opt_string(0)?,
            headers: r.opt_string(1)?,
            erased_at: r.opt_i64(2)?,
            received_at: r.i64(3)?,
        })
    })
    .transpose()
}

/// Marks that change whenever anything an event list shows may have
/// changed: the last delivery, attempt, replay and incident, and how many
/// actions are paused; read in a few index look-ups. On PostgreSQL
/// (attempts have no rowid) a job's status moving stands for its
/// attempts (recording one moves it): the job counters' changes not yet
/// folded, counted and numbered, a small table whatever the size of jobs.
pub fn list_marks(db: &Db<'_>) -> Result<[i64; 5], StoreError> {
    let attempts = match db.dialect() {
        Dialect::Sqlite => "(SELECT coalesce(max(rowid), 0) FROM attempts)",
        Dialect::Postgres => {
            "(SELECT count(*) * 1000003 + coalesce(max(seq), 0) FROM job_count_deltas)"
        }
    };
    let r = db.query_one(
        &format!(
            "SELECT (SELECT coalesce(max(id), 0) FROM deliveries),
                    {attempts},
                    (SELECT coalesce(max(id), 0) FROM replays),
                    (SELECT coalesce(max(id), 0) FROM incidents),
                    (SELECT count(*) FROM paused_actions)"
        ),
        &[],
    )?;
    Ok([r.i64(0)?, r.i64(1)?, r.i64(2)?, r.i64(3)?, r.i64(4)?])
}

/// The event's state, if it is stored.
pub fn state(db: &Db<'_>, source: &str, event_id: &str) -> Result<Option<EventState>, StoreError> {
    db.query_opt(
        "SELECT state FROM events WHERE source = ?1 AND event_id = ?2",
        args![source, event_id],
    )?
    .map(|r| r.word(0))
    .transpose()
}

/// What a replay plan reads of its event.
#[derive(Debug, Clone, PartialEq)]
pub struct Planned {
    pub event_type: Option<String>,
    pub state: EventState,
    pub received_at: i64,
    /// The body is gone (erased or pruned): nothing can run from it.
    pub erased: bool,
}

/// [`Planned`] of the event, if it is stored.
pub fn planned(db: &Db<'_>, source: &str, event_id: &str) -> Result<Option<Planned>, StoreError> {
    db.query_opt(
        "SELECT type, state, received_at, payload IS NULL FROM events
         WHERE source = ?1 AND event_id = ?2",
        args![source, event_id],
    )?
    .map(|r| {
        Ok(Planned {
            event_type: r.opt_string(0)?,
            state: r.word(1)?,
            received_at: r.i64(2)?,
            erased: r.bool(3)?,
        })
    })
    .transpose()
}

/// The stored event as a replay of an SQL action reads it again.
#[derive(Debug, Clone, PartialEq)]
pub struct Stored {
    pub event_type: Option<String>,
    /// None once erased.
    pub payload: Option<Vec<u8>>,
    pub content_type: Option<String>,
    /// The kept headers, a JSON object.
    pub headers: Option<String>,
    pub payload_hash: String,
    pub verified_with: Option<i64>,
    pub signed_at: Option<i64>,
    pub received_at: i64,
}

/// [`Stored`] of the event, if it is stored.
pub fn stored(db: &Db<'_>, source: &str, event_id: &str) -> Result<Option<Stored>, StoreError> {
    db.query_opt(
        "SELECT type, payload, content_type, headers, payload_hash, verified_with, signed_at,
                received_at
         FROM events WHERE source = ?1 AND event_id = ?2",
        args![source, event_id],
    )?
    .map(|r| {
        Ok(Stored {
            event_type: r.opt_string(0)?,
            payload: r.opt_bytes(1)?.map(<[u8]>::to_vec),
            content_type: r.opt_string(2)?,
            headers: r.opt_string(3)?,
            payload_hash: r.string(4)?,
            verified_with: r.opt_i64(5)?,
            signed_at: r.opt_i64(6)?,
            received_at: r.i64(7)?,
        })
    })
    .transpose()
}

/// What `erase` reports of an event: its state, the body's size, whether
/// headers are kept, when it was erased.
#[derive(Debug, Clone, PartialEq)]
pub struct Size {
    pub state: EventState,
    pub payload_bytes: Option<i64>,
    pub has_headers: bool,
    pub erased_at: Option<i64>,
}

/// [`Size`] of the event, if it is stored.
pub fn size(db: &Db<'_>, source: &str, event_id: &str) -> Result<Option<Size>, StoreError> {
    db.query_opt(
        "SELECT state, length(payload), headers IS NOT NULL, erased_at FROM events
         WHERE source = ?1 AND event_id = ?2",
        args![source, event_id],
    )?
    .map(|r| {
        Ok(Size {
            state: r.word(0)?,
            payload_bytes: r.opt_i64(1)?,
            has_headers: r.bool(2)?,
            erased_at: r.opt_i64(3)?,
        })
    })
    .transpose()
}

/// Locks the event's row until the caller's transaction ends (on
/// PostgreSQL; SQLite's write transaction holds the whole database).
pub fn lock(db: &Db<'_>, source: &str, event_id: &str) -> Result<(), StoreError> {
    db.query(
        &format!(
            "SELECT 1 FROM events WHERE source = ?1 AND event_id = ?2{}",
            db.dialect().for_update()
        ),
        args![source, event_id],
    )?;
    Ok(())
}

/// Drops the event's body and headers; the first erasure's time is kept.
pub fn erase(db: &Db<'_>, source: &str, event_id: &str, now: i64) -> Result<(), StoreError> {
    db.execute(
        "UPDATE events SET payload = NULL, headers = NULL, erased_at = coalesce(erased_at, ?3)
         WHERE source = ?1 AND event_id = ?2",
        args![source, event_id, now],
    )?;
    Ok(())
}
