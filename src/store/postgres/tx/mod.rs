//! PostgreSQL's side of the claim seam ([`Tx`]): the claim's statements in
//! PostgreSQL's dialect, prepared once per connection, and SQL actions
//! rewritten from `:name` to `$n` with each value bound as the type the
//! server inferred for its parameter.
//!
//! A [`PgTx`] is a connection with a transaction its caller opened
//! (`BEGIN`, READ COMMITTED) and will end. It counts the savepoints it
//! opened, because more than 64 subtransactions in one transaction
//! overflow PostgreSQL's per-backend cache and slow every session: the
//! caller bounds a group by that count.
//!
//! A group commit's `PgTx` ([`PgTx::grouped`]) saves round trips, each a
//! wait on the server: the group's events are inserted by one statement
//! before its claims run ([`PgTx::insert_events`]; each claim's
//! `insert_event` is then answered from what that statement decided), the
//! stored state of the events it lost is read by one more, and its
//! delivery rows are written by one statement at the end
//! ([`PgTx::commit`]), together with the NOTIFY for new forward jobs.

use std::collections::{HashMap, HashSet};

use postgres::{Client, Statement};

use crate::store::StoreError;
use crate::store::tx::{NewAttempt, NewEvent};

mod claim;
mod outbox;
mod params;
mod session;
#[cfg(test)]
mod tests;

pub use params::PgParam;
pub use session::Session;

/// Prepared statements of one connection, by their text as written (for an
/// SQL action: with its `$n` names).
#[derive(Default)]
pub struct Statements {
    cache: HashMap<String, (Statement, Vec<String>)>,
}

/// An event row as a claim inserts it, owned: a group's rows are
/// inserted by one statement before its claims run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventRow {
    pub source: String,
    pub event_id: String,
    pub event_type: Option<String>,
    pub state: String,
    pub received_at: i64,
    pub completed_at: Option<i64>,
    pub payload: Vec<u8>,
    pub content_type: Option<String>,
    pub headers: String,
    pub payload_hash: String,
    pub verified_with: Option<i64>,
    pub signed_at: Option<i64>,
}

impl EventRow {
    pub fn of(e: &NewEvent<'_>) -> EventRow {
        EventRow {
            source: e.source.to_string(),
            event_id: e.event_id.to_string(),
            event_type: e.event_type.map(str::to_string),
            state: e.state.to_string(),
            received_at: e.received_at,
            completed_at: e.completed_at,
            payload: e.payload.to_vec(),
            content_type: e.content_type.map(str::to_string),
            headers: e.headers.to_string(),
            payload_hash: e.payload_hash.to_string(),
            verified_with: e.verified_with,
            signed_at: e.signed_at,
        }
    }

    fn key(&self) -> Key {
        (self.source.clone(), self.event_id.clone())
    }
}

/// (source, event_id).
type Key = (String, String);

fn key(source: &str, event_id: &str) -> Key {
    (source.to_string(), event_id.to_string())
}

/// A delivery row waiting for the group's one insert.
struct DeliveryRow {
    source: String,
    event_id: Option<String>,
    received_at: i64,
    outcome: String,
    remote: String,
    detail: Option<String>,
}

/// What a group's `PgTx` holds back or already knows.
#[derive(Default)]
struct Group {
    /// Keys inserted by [`PgTx::insert_events`]: true until the first
    /// claim of the key takes the win it decided (a later claim of the
    /// same key in this transaction is a duplicate).
    claims: HashMap<Key, bool>,
    /// Stored (state, payload hash) of events, as of this transaction:
    /// the ones it inserted and the ones it lost, read once. A state this
    /// transaction sets, or anything an SQL action may have written,
    /// removes what is known (asked again when needed).
    known: HashMap<Key, (String, String)>,
    deliveries: Vec<DeliveryRow>,
    /// A forward job was written: its workers are woken at the commit.
    forward_jobs: bool,
}

/// A connection inside an open transaction.
pub struct PgTx<'a> {
    client: &'a mut Client,
    statements: &'a mut Statements,
    /// Savepoints opened in this transaction so far.
    pub savepoints: usize,
    /// Set for a group commit's transaction.
    group: Option<Group>,
}

/// The group's events, inserted in the order given (the group's key
/// order) by one statement; the keys it inserted come back.
const INSERT_EVENTS: &str =
    "INSERT INTO events (source, event_id, type, state, received_at, completed_at,
                         payload, content_type, headers, payload_hash, verified_with, signed_at)
     SELECT source, event_id, type, state, received_at, completed_at,
            payload, content_type, headers, payload_hash, verified_with, signed_at
       FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::int8[], $6::int8[],
                   $7::bytea[], $8::text[], $9::text[], $10::text[], $11::int8[], $12::int8[])
            WITH ORDINALITY AS r (source, event_id, type, state, received_at, completed_at,
                                  payload, content_type, headers, payload_hash, verified_with,
                                  signed_at, n)
      ORDER BY n
     ON CONFLICT (source, event_id) DO NOTHING
     RETURNING source, event_id";

/// The stored state and hash of events the group lost (a plain read: no
/// lock, so another instance's claims never wait on it).
const LOST_EVENTS: &str = "SELECT e.source, e.event_id, e.state, e.payload_hash
       FROM unnest($1::text[], $2::text[]) AS k (source, event_id)
       JOIN events e ON e.source = k.source AND e.event_id = k.event_id";

const INSERT_DELIVERIES: &str =
    "INSERT INTO deliveries (source, event_id, received_at, outcome, remote, detail)
     SELECT source, event_id, received_at, outcome, remote, detail
       FROM unnest($1::text[], $2::text[], $3::int8[], $4::text[], $5::text[], $6::text[])
            WITH ORDINALITY AS r (source, event_id, received_at, outcome, remote, detail, n)
      ORDER BY n";

impl<'a> PgTx<'a> {
    pub fn new(client: &'a mut Client, statements: &'a mut Statements) -> PgTx<'a> {
        PgTx {
            client,
            statements,
            savepoints: 0,
            group: None,
        }
    }

    /// The readiness probe's write (a `meta` row), in this transaction.
    pub fn probe(&mut self, now: i64) -> Result<(), StoreError> {
        let s = self.prepared(
            "INSERT INTO meta (key, value) VALUES ('ready_probe', $1)
             ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
        )?;
        self.client.execute(&s, &[&now.to_string()])?;
        Ok(())
    }

    /// A group commit's transaction: delivery rows are written at
    /// [`PgTx::commit`], which must end it.
    pub fn grouped(client: &'a mut Client, statements: &'a mut Statements) -> PgTx<'a> {
        PgTx {
            group: Some(Group::default()),
            ..PgTx::new(client, statements)
        }
    }

    /// Inserts the events of a group's claims with one statement, in the
    /// order given (the group's key order, so two instances take the keys
    /// they share in one order and cannot deadlock on them), and reads the
    /// stored state of the ones it lost with one more. Each claim's
    /// `insert_event` is then answered from this: the first claim of a key
    /// inserted here wins it, every other claim of a key is a duplicate.
    /// Of several rows for one key, the first is inserted.
    pub fn insert_events(&mut self, rows: &[&EventRow]) -> Result<(), StoreError> {
        let mut seen = HashSet::with_capacity(rows.len());
        let rows: Vec<&EventRow> = rows
            .iter()
            .copied()
            .filter(|r| seen.insert((r.source.as_str(), r.event_id.as_str())))
            .collect();
        if rows.is_empty() {
            return Ok(());
        }
        let s = self.prepared(INSERT_EVENTS)?;
        let column = |f: fn(&EventRow) -> Option<&str>| -> Vec<Option<&str>> {
            rows.iter().map(|r| f(r)).collect()
        };
        let int = |f: fn(&EventRow) -> Option<i64>| -> Vec<Option<i64>> {
            rows.iter().map(|r| f(r)).collect()
        };
        let sources = column(|r| Some(r.source.as_str()));
        let ids = column(|r| Some(r.event_id.as_str()));
        let types = column(|r| r.event_type.as_deref());
        let states = column(|r| Some(r.state.as_str()));
        let received = int(|r| Some(r.received_at));
        let completed = int(|r| r.completed_at);
        let payloads: Vec<&[u8]> = rows.iter().map(|r| r.payload.as_slice()).collect();
        let content_types = column(|r| r.content_type.as_deref());
        let headers = column(|r| Some(r.headers.as_str()));
        let hashes = column(|r| Some(r.payload_hash.as_str()));
        let verified = int(|r| r.verified_with);
        let signed = int(|r| r.signed_at);
        let inserted: HashSet<Key> = self
            .client
            .query(
                &s,
                &[
                    &sources,
                    &ids,
                    &types,
                    &states,
                    &received,
                    &completed,
                    &payloads,
                    &content_types,
                    &headers,
                    &hashes,
                    &verified,
                    &signed,
                ],
            )?
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        let group = self.group.get_or_insert_with(Group::default);
        let mut lost = Vec::new();
        for r in rows {
            let k = r.key();
            let won = inserted.contains(&k);
            if won {
                group
                    .known
                    .insert(k.clone(), (r.state.clone(), r.payload_hash.clone()));
            } else {
                lost.push(r);
            }
            group.claims.insert(k, won);
        }
        if lost.is_empty() {
            return Ok(());
        }
        let s = self.prepared(LOST_EVENTS)?;
        let sources: Vec<&str> = lost.iter().map(|r| r.source.as_str()).collect();
        let ids: Vec<&str> = lost.iter().map(|r| r.event_id.as_str()).collect();
        let stored = self.client.query(&s, &[&sources, &ids])?;
        let group = self.group.get_or_insert_with(Group::default);
        for row in stored {
            group
                .known
                .insert((row.get(0), row.get(1)), (row.get(2), row.get(3)));
        }
        Ok(())
    }

    /// Ends a group's transaction: its delivery rows in one statement,
    /// then COMMIT, with a NOTIFY to every instance's workers when it wrote
    /// forward jobs (sent by the server only if the commit succeeds).
    pub fn commit(mut self) -> Result<(), postgres::Error> {
        let group = self.group.take().unwrap_or_default();
        if !group.deliveries.is_empty() {
            let s = self.prepared(INSERT_DELIVERIES)?;
            let d = &group.deliveries;
            let sources: Vec<&str> = d.iter().map(|r| r.source.as_str()).collect();
            let ids: Vec<Option<&str>> = d.iter().map(|r| r.event_id.as_deref()).collect();
            let received: Vec<i64> = d.iter().map(|r| r.received_at).collect();
            let outcomes: Vec<&str> = d.iter().map(|r| r.outcome.as_str()).collect();
            let remotes: Vec<&str> = d.iter().map(|r| r.remote.as_str()).collect();
            let details: Vec<Option<&str>> = d.iter().map(|r| r.detail.as_deref()).collect();
            self.client.execute(
                &s,
                &[&sources, &ids, &received, &outcomes, &remotes, &details],
            )?;
        }
        // Every statement ran and holds its locks (crash tests stop here).
        crate::failpoint::hit("pg.group.before_commit");
        if group.forward_jobs {
            self.client
                .batch_execute(&format!("NOTIFY {JOBS_CHANNEL}; COMMIT"))
        } else {
            self.client.batch_execute("COMMIT")
        }
    }

    fn forget_state(&mut self, source: &str, event_id: &str) {
        if let Some(g) = &mut self.group {
            g.known.remove(&key(source, event_id));
        }
    }

    pub fn client(&mut self) -> &mut Client {
        self.client
    }

    /// Writes `a` (`store::attempts::PUT`): over the job's attempt of the
    /// same number when `replace`, else not at all if there is one.
    fn put(&mut self, a: &NewAttempt<'_>, replace: bool) -> Result<(), StoreError> {
        let s = self.shared(crate::store::attempts::PUT)?;
        let note: Option<&str> = None;
        self.client.execute(
            &s,
            &[
                &a.job_id,
                &a.n,
                &a.started_at,
                &a.finished_at,
                &a.outcome,
                &a.http_status,
                &a.error,
                &a.error_kind,
                &a.request_id,
                &a.response_head,
                &a.worker,
                &note,
                &replace,
            ],
        )?;
        Ok(())
    }

    /// A statement the root writes once for both backends (`?N`, in a
    /// table's module), prepared in PostgreSQL's dialect once per
    /// connection: cached under its text as written, so a call after the
    /// first costs what [`PgTx::prepared`]'s does.
    fn shared(&mut self, sql: &str) -> Result<Statement, StoreError> {
        if let Some((s, _)) = self.statements.cache.get(sql) {
            return Ok(s.clone());
        }
        let s = self.client.prepare(&crate::store::db::to_dollars(sql)?)?;
        self.statements
            .cache
            .insert(sql.to_string(), (s.clone(), Vec::new()));
        Ok(s)
    }

    fn prepared(&mut self, sql: &str) -> Result<Statement, postgres::Error> {
        if let Some((s, _)) = self.statements.cache.get(sql) {
            return Ok(s.clone());
        }
        let s = self.client.prepare(sql)?;
        self.statements
            .cache
            .insert(sql.to_string(), (s.clone(), Vec::new()));
        Ok(s)
    }
}

pub use crate::store::jobs::JOBS_CHANNEL;
