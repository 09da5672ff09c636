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
use std::error::Error as StdError;

use postgres::types::private::BytesMut;
use postgres::types::{IsNull, ToSql, Type, to_sql_checked};
use postgres::{Client, Statement};

use super::tx::{
    ActionError, AttemptRow, Candidate, CheckRow, ForwardEvent, JobTallies, NewEvent, NewJob,
    OutboxTx, ParamValue, Tx,
};
use super::{StoreError, StoreErrorKind, named};

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

/// Forward workers on every instance are woken on this channel.
pub const JOBS_CHANNEL: &str = "idemhook_jobs";

impl Tx for PgTx<'_> {
    fn insert_event(&mut self, e: &NewEvent<'_>) -> Result<bool, StoreError> {
        if let Some(won) = self
            .group
            .as_mut()
            .and_then(|g| g.claims.get_mut(&key(e.source, e.event_id)))
        {
            // Decided by the group's insert; only the first claim of the
            // key takes the win.
            return Ok(std::mem::take(won));
        }
        let s = self.prepared(
            "INSERT INTO events (source, event_id, type, state, received_at, completed_at,
                 payload, content_type, headers, payload_hash, verified_with, signed_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
             ON CONFLICT (source, event_id) DO NOTHING
             RETURNING 1",
        )?;
        let rows = self.client.query(
            &s,
            &[
                &e.source,
                &e.event_id,
                &e.event_type,
                &e.state,
                &e.received_at,
                &e.completed_at,
                &e.payload,
                &e.content_type,
                &e.headers,
                &e.payload_hash,
                &e.verified_with,
                &e.signed_at,
            ],
        )?;
        Ok(!rows.is_empty())
    }

    fn event_state_and_hash(
        &mut self,
        source: &str,
        event_id: &str,
    ) -> Result<(String, String), StoreError> {
        if let Some(known) = self
            .group
            .as_ref()
            .and_then(|g| g.known.get(&key(source, event_id)))
        {
            return Ok(known.clone());
        }
        let s = self.prepared(
            "SELECT state, payload_hash FROM events WHERE source = $1 AND event_id = $2",
        )?;
        let row = self.client.query_one(&s, &[&source, &event_id])?;
        Ok((row.get(0), row.get(1)))
    }

    fn insert_mismatch(
        &mut self,
        source: &str,
        event_id: &str,
        created_at: i64,
        payload_hash: &str,
        detail: &str,
        payload: &[u8],
    ) -> Result<(), StoreError> {
        let s = self.prepared(
            "WITH incident AS (
                 INSERT INTO incidents (source, event_id, kind, created_at, payload_hash, detail)
                 VALUES ($1, $2, 'payload_mismatch', $3, $4, $5)
                 RETURNING id)
             INSERT INTO incident_payloads (incident_id, payload) SELECT id, $6 FROM incident",
        )?;
        self.client.execute(
            &s,
            &[
                &source,
                &event_id,
                &created_at,
                &payload_hash,
                &detail,
                &payload,
            ],
        )?;
        Ok(())
    }

    fn insert_delivery(
        &mut self,
        source: &str,
        event_id: Option<&str>,
        received_at: i64,
        outcome: &str,
        remote: &str,
        detail: Option<&str>,
    ) -> Result<(), StoreError> {
        if let Some(g) = &mut self.group {
            g.deliveries.push(DeliveryRow {
                source: source.to_string(),
                event_id: event_id.map(str::to_string),
                received_at,
                outcome: outcome.to_string(),
                remote: remote.to_string(),
                detail: detail.map(str::to_string),
            });
            return Ok(());
        }
        let s = self.prepared(
            "INSERT INTO deliveries (source, event_id, received_at, outcome, remote, detail)
             VALUES ($1, $2, $3, $4, $5, $6)",
        )?;
        self.client.execute(
            &s,
            &[&source, &event_id, &received_at, &outcome, &remote, &detail],
        )?;
        Ok(())
    }

    fn insert_job(&mut self, j: &NewJob<'_>) -> Result<i64, StoreError> {
        if let Some(g) = &mut self.group {
            g.forward_jobs |= j.kind == "forward";
        }
        let s = self.prepared(
            "INSERT INTO jobs (source, event_id, action, kind, status, n_attempts, next_attempt_at,
                               last_error, created_at, updated_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $9)
             RETURNING id",
        )?;
        let row = self.client.query_one(
            &s,
            &[
                &j.source,
                &j.event_id,
                &j.action,
                &j.kind,
                &j.status,
                &j.n_attempts,
                &j.next_attempt_at,
                &j.last_error,
                &j.created_at,
            ],
        )?;
        Ok(row.get(0))
    }

    fn insert_sql_attempt(
        &mut self,
        job_id: i64,
        started_at: i64,
        finished_at: i64,
        outcome: &str,
        error: Option<&str>,
    ) -> Result<(), StoreError> {
        let s = self.prepared(
            "INSERT INTO attempts (job_id, n, started_at, finished_at, outcome, error, error_kind)
             VALUES ($1, 1, $2, $3, $4, $5, $6)",
        )?;
        let kind = error.map(|_| "sql");
        self.client.execute(
            &s,
            &[&job_id, &started_at, &finished_at, &outcome, &error, &kind],
        )?;
        Ok(())
    }

    fn is_paused(&mut self, source: &str, action: &str) -> Result<bool, StoreError> {
        let s = self.prepared("SELECT 1 FROM paused_actions WHERE source = $1 AND action = $2")?;
        Ok(!self.client.query(&s, &[&source, &action])?.is_empty())
    }

    fn job_tallies(&mut self, source: &str, event_id: &str) -> Result<JobTallies, StoreError> {
        // Outside a claim, two transactions may each finish a different job
        // of one event: each count would miss the other's uncommitted job,
        // both would write `processing`, and the event would stay there with
        // every job done. The event row's lock orders them; it is its own
        // statement because at READ COMMITTED a statement keeps the snapshot
        // it started with after a lock wait, and the count must start after.
        // A claim's group inserted its events itself and already holds them.
        if self.group.is_none() {
            let lock = self
                .prepared("SELECT 1 FROM events WHERE source = $1 AND event_id = $2 FOR UPDATE")?;
            self.client.query(&lock, &[&source, &event_id])?;
        }
        let s = self.prepared(
            "SELECT
                 count(*) FILTER (WHERE status = 'failed'),
                 count(*) FILTER (WHERE status IN ('pending', 'processing', 'paused')),
                 count(*) FILTER (WHERE status = 'processing' OR n_attempts > 0)
             FROM jobs WHERE source = $1 AND event_id = $2",
        )?;
        let row = self.client.query_one(&s, &[&source, &event_id])?;
        Ok(JobTallies {
            failed: row.get(0),
            open: row.get(1),
            started: row.get(2),
        })
    }

    fn set_event_state(
        &mut self,
        source: &str,
        event_id: &str,
        state: &str,
        now: i64,
    ) -> Result<(), StoreError> {
        self.forget_state(source, event_id);
        let s = self.prepared(
            "UPDATE events SET state = $3::text,
                    completed_at = CASE WHEN $3::text = 'completed'
                                        THEN coalesce(completed_at, $4) ELSE NULL END
             WHERE source = $1 AND event_id = $2 AND state <> $3::text",
        )?;
        self.client
            .execute(&s, &[&source, &event_id, &state, &now])?;
        Ok(())
    }

    fn in_savepoint<T, E: From<StoreError>>(
        &mut self,
        name: &'static str,
        body: impl FnOnce(&mut Self) -> Result<T, E>,
    ) -> Result<T, E> {
        self.savepoints += 1;
        self.client
            .batch_execute(&format!("SAVEPOINT {name}"))
            .map_err(StoreError::from)?;
        let held_back = self.group.as_ref().map_or(0, |g| g.deliveries.len());
        match body(self) {
            Ok(v) => {
                self.client
                    .batch_execute(&format!("RELEASE SAVEPOINT {name}"))
                    .map_err(StoreError::from)?;
                Ok(v)
            }
            Err(e) => {
                // A broken connection has no savepoint left; the caller's
                // COMMIT fails and nothing of the group is acknowledged.
                let _ = self.client.batch_execute(&format!(
                    "ROLLBACK TO SAVEPOINT {name}; RELEASE SAVEPOINT {name}"
                ));
                // Rows held back inside it are rolled back with it.
                if let Some(g) = &mut self.group {
                    g.deliveries.truncate(held_back);
                }
                Err(e)
            }
        }
    }

    fn execute_action(
        &mut self,
        sql: &str,
        mut value_of: impl FnMut(&str) -> Option<ParamValue>,
    ) -> Result<(), ActionError> {
        // The action may write any table, idemhook's too.
        if let Some(g) = &mut self.group {
            g.known.clear();
        }
        let (statement, names) = match self.statements.cache.get(sql) {
            Some(found) => found.clone(),
            None => {
                let positional = named::to_positional(sql).map_err(ActionError::Statement)?;
                let statement = self.client.prepare(&positional.sql).map_err(action_error)?;
                let entry = (statement, positional.names);
                self.statements.cache.insert(sql.to_string(), entry.clone());
                entry
            }
        };
        let mut values = Vec::with_capacity(names.len());
        for name in &names {
            let v = value_of(name)
                .ok_or_else(|| ActionError::Statement(format!("unknown parameter :{name}")))?;
            values.push(PgParam(v));
        }
        let refs: Vec<&(dyn ToSql + Sync)> =
            values.iter().map(|v| v as &(dyn ToSql + Sync)).collect();
        self.client
            .execute(&statement, &refs)
            .map_err(action_error)?;
        Ok(())
    }
}

fn candidate(r: &postgres::Row, pending: bool) -> Candidate {
    Candidate {
        job_id: r.get(0),
        source: r.get(1),
        event_id: r.get(2),
        action: r.get(3),
        n_before: r.get(4),
        leased_at: r.get(5),
        previous_owner: r.get(6),
        pending,
    }
}

impl OutboxTx for PgTx<'_> {
    fn expired_jobs(&mut self, now: i64) -> Result<Vec<Candidate>, StoreError> {
        // SKIP LOCKED: a job another instance is taking right now is left
        // to it, not waited for.
        let s = self.prepared(
            "SELECT id, source, event_id, action, n_attempts, updated_at, lease_owner FROM jobs
             WHERE status = 'processing' AND kind = 'forward' AND lease_until < $1
             LIMIT 16 FOR UPDATE SKIP LOCKED",
        )?;
        Ok(self
            .client
            .query(&s, &[&now])?
            .iter()
            .map(|r| candidate(r, false))
            .collect())
    }

    fn due_jobs(&mut self, now: i64) -> Result<Vec<Candidate>, StoreError> {
        let s = self.prepared(
            "SELECT id, source, event_id, action, n_attempts, updated_at, lease_owner FROM jobs
             WHERE status = 'pending' AND next_attempt_at <= $1 AND kind = 'forward'
             ORDER BY next_attempt_at LIMIT 16 FOR UPDATE SKIP LOCKED",
        )?;
        Ok(self
            .client
            .query(&s, &[&now])?
            .iter()
            .map(|r| candidate(r, true))
            .collect())
    }

    fn open_jobs_of_event(
        &mut self,
        source: &str,
        event_id: &str,
    ) -> Result<Vec<(String, String)>, StoreError> {
        let s = self.prepared(
            "SELECT action, status FROM jobs WHERE source = $1 AND event_id = $2 AND status <> 'done'",
        )?;
        Ok(self
            .client
            .query(&s, &[&source, &event_id])?
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect())
    }

    fn park(
        &mut self,
        job_id: i64,
        n_attempts: i64,
        reason: &str,
        now: i64,
    ) -> Result<(), StoreError> {
        let s = self.prepared(
            "UPDATE jobs SET next_attempt_at = NULL, last_error = $3, updated_at = $4
             WHERE id = $1 AND n_attempts = $2 AND status = 'pending'",
        )?;
        self.client
            .execute(&s, &[&job_id, &n_attempts, &reason, &now])?;
        Ok(())
    }

    fn lease(
        &mut self,
        job_id: i64,
        owner: &str,
        lease_until: i64,
        now: i64,
        n_before: i64,
    ) -> Result<bool, StoreError> {
        let s = self.prepared(
            "UPDATE jobs SET status = 'processing', lease_owner = $2, lease_until = $3,
                    n_attempts = n_attempts + 1, updated_at = $4
             WHERE id = $1 AND n_attempts = $5
               AND ((status = 'pending' AND next_attempt_at <= $4)
                    OR (status = 'processing' AND lease_until < $4))",
        )?;
        Ok(self
            .client
            .execute(&s, &[&job_id, &owner, &lease_until, &now, &n_before])?
            == 1)
    }

    fn replay_budget_base(&mut self, job_id: i64) -> Result<i64, StoreError> {
        let s = self.prepared(
            "SELECT coalesce(max(n), 0) FROM attempts WHERE job_id = $1
               AND started_at <= (SELECT max(replayed_at) FROM replays WHERE job_id = $1)",
        )?;
        Ok(self.client.query_one(&s, &[&job_id])?.get(0))
    }

    fn attempt_exists(&mut self, job_id: i64, n: i64) -> Result<bool, StoreError> {
        let s =
            self.prepared("SELECT EXISTS (SELECT 1 FROM attempts WHERE job_id = $1 AND n = $2)")?;
        Ok(self.client.query_one(&s, &[&job_id, &n])?.get(0))
    }

    fn record_cut_short(
        &mut self,
        job_id: i64,
        n: i64,
        started_at: i64,
        now: i64,
        worker: Option<&str>,
    ) -> Result<(), StoreError> {
        let s = self.prepared(
            "INSERT INTO attempts (job_id, n, started_at, finished_at, outcome, error, error_kind, worker)
             VALUES ($1, $2, $3, $4, 'retry', 'the lease expired before the attempt was recorded (worker crashed or hung)', 'lease', $5)
             ON CONFLICT (job_id, n) DO NOTHING",
        )?;
        self.client
            .execute(&s, &[&job_id, &n, &started_at, &now, &worker])?;
        Ok(())
    }

    fn latest_replay_from(&mut self, job_id: i64) -> Result<Option<String>, StoreError> {
        let s = self.prepared(
            "SELECT from_status FROM replays WHERE job_id = $1 ORDER BY id DESC LIMIT 1",
        )?;
        Ok(self.client.query_opt(&s, &[&job_id])?.map(|r| r.get(0)))
    }

    fn end_job(
        &mut self,
        job_id: i64,
        now: i64,
        error: &str,
        status: &str,
    ) -> Result<(), StoreError> {
        let s = self.prepared(
            "UPDATE jobs SET status = $4, lease_owner = NULL, lease_until = NULL,
                    last_error = $3, updated_at = $2
             WHERE id = $1",
        )?;
        self.client.execute(&s, &[&job_id, &now, &error, &status])?;
        Ok(())
    }

    fn forward_event(
        &mut self,
        source: &str,
        event_id: &str,
    ) -> Result<Option<ForwardEvent>, StoreError> {
        let s = self.prepared(
            "SELECT type, payload, content_type FROM events WHERE source = $1 AND event_id = $2",
        )?;
        Ok(self
            .client
            .query_opt(&s, &[&source, &event_id])?
            .map(|r| ForwardEvent {
                event_type: r.get(0),
                body: r.get(1),
                content_type: r.get(2),
            }))
    }

    fn may_have_reached(&mut self, job_id: i64) -> Result<bool, StoreError> {
        let s = self.prepared(
            "SELECT EXISTS (SELECT 1 FROM attempts WHERE job_id = $1
               AND n > (SELECT coalesce(max(n), 0) FROM attempts
                         WHERE job_id = $1 AND outcome = 'ok')
               AND coalesce(error_kind, '') <> 'connect')",
        )?;
        Ok(self.client.query_one(&s, &[&job_id])?.get(0))
    }

    fn mark_processing(&mut self, source: &str, event_id: &str) -> Result<(), StoreError> {
        let s = self.prepared(
            "UPDATE events SET state = 'processing' WHERE source = $1 AND event_id = $2 AND state = 'accepted'",
        )?;
        self.client.execute(&s, &[&source, &event_id])?;
        Ok(())
    }

    fn next_due(&mut self) -> Result<Option<i64>, StoreError> {
        let s = self.prepared(
            "SELECT min(t) FROM (
                 SELECT min(next_attempt_at) AS t FROM jobs WHERE status = 'pending'
                 UNION ALL
                 SELECT min(lease_until) FROM jobs WHERE status = 'processing') due",
        )?;
        Ok(self.client.query_one(&s, &[])?.get(0))
    }

    fn finish_job(
        &mut self,
        job_id: i64,
        owner: &str,
        n: i64,
        status: &str,
        next_attempt_at: Option<i64>,
        last_error: Option<&str>,
        now: i64,
    ) -> Result<bool, StoreError> {
        let s = self.prepared(
            "UPDATE jobs SET status = $4, next_attempt_at = $5, lease_owner = NULL, lease_until = NULL,
                    last_error = $6, updated_at = $7
             WHERE id = $1 AND status = 'processing' AND lease_owner = $2 AND n_attempts = $3",
        )?;
        Ok(self.client.execute(
            &s,
            &[
                &job_id,
                &owner,
                &n,
                &status,
                &next_attempt_at,
                &last_error,
                &now,
            ],
        )? == 1)
    }

    fn put_attempt(&mut self, a: &AttemptRow<'_>) -> Result<(), StoreError> {
        let s = self.prepared(
            "INSERT INTO attempts (job_id, n, started_at, finished_at, outcome, http_status,
                                   error, error_kind, request_id, response_head, worker)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
             ON CONFLICT (job_id, n) DO UPDATE SET
                 started_at = EXCLUDED.started_at, finished_at = EXCLUDED.finished_at,
                 outcome = EXCLUDED.outcome, http_status = EXCLUDED.http_status,
                 error = EXCLUDED.error, error_kind = EXCLUDED.error_kind,
                 request_id = EXCLUDED.request_id, response_head = EXCLUDED.response_head,
                 worker = EXCLUDED.worker, note = NULL",
        )?;
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
            ],
        )?;
        Ok(())
    }

    fn insert_check(&mut self, c: &CheckRow<'_>) -> Result<(), StoreError> {
        let s = self.prepared(
            "INSERT INTO checks (job_id, n, asked_at, finished_at, answer, http_status, error, worker)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )?;
        self.client.execute(
            &s,
            &[
                &c.job_id,
                &c.n,
                &c.asked_at,
                &c.finished_at,
                &c.answer,
                &c.http_status,
                &c.error,
                &c.worker,
            ],
        )?;
        Ok(())
    }

    fn give_back(
        &mut self,
        job_id: i64,
        owner: &str,
        n: i64,
        status: &str,
    ) -> Result<(), StoreError> {
        let s = self.prepared(
            "UPDATE jobs SET status = $4, n_attempts = n_attempts - 1,
                    lease_owner = NULL, lease_until = NULL
             WHERE id = $1 AND status = 'processing' AND lease_owner = $2 AND n_attempts = $3",
        )?;
        self.client.execute(&s, &[&job_id, &owner, &n, &status])?;
        Ok(())
    }

    fn release_parked(&mut self, now: i64) -> Result<(), StoreError> {
        let s = self.prepared(
            "UPDATE jobs SET next_attempt_at = $1 WHERE status = 'pending' AND next_attempt_at IS NULL",
        )?;
        self.client.execute(&s, &[&now])?;
        Ok(())
    }
}

/// One connection of a worker: made when needed, made again after a
/// failure, each call one transaction (run again after a deadlock or a
/// serialization failure).
pub struct Session {
    settings: super::pg::Settings,
    client: Option<Client>,
    statements: Statements,
}

impl Session {
    pub fn new(settings: super::pg::Settings) -> Session {
        Session {
            settings,
            client: None,
            statements: Statements::default(),
        }
    }

    pub fn transaction<T>(
        &mut self,
        mut body: impl FnMut(&mut PgTx<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let mut attempt = 0;
        loop {
            if self.client.as_ref().is_none_or(Client::is_closed) {
                self.client = Some(self.settings.connect()?);
                self.statements = Statements::default();
            }
            let Some(client) = self.client.as_mut() else {
                return Err(StoreError::closed());
            };
            let result = client
                .batch_execute("BEGIN ISOLATION LEVEL READ COMMITTED")
                .map_err(StoreError::from)
                .and_then(|()| body(&mut PgTx::new(client, &mut self.statements)))
                .and_then(|v| {
                    client.batch_execute("COMMIT").map_err(StoreError::from)?;
                    Ok(v)
                });
            match result {
                Ok(v) => return Ok(v),
                Err(e) => {
                    let _ = client.batch_execute("ROLLBACK");
                    let retry = e.kind == StoreErrorKind::Busy
                        && (e.message.contains("(40P01)") || e.message.contains("(40001)"));
                    if retry && attempt < 4 {
                        attempt += 1;
                        std::thread::sleep(std::time::Duration::from_millis(fastrand::u64(1..20)));
                        continue;
                    }
                    if e.kind != StoreErrorKind::Other {
                        self.client = None;
                    }
                    return Err(e);
                }
            }
        }
    }
}

/// An SQL action's failure: the statement's own (a constraint, a syntax
/// error, a value that does not fit its parameter) is the action's; a
/// connection or server failure is storage's.
fn action_error(e: postgres::Error) -> ActionError {
    let store = StoreError::from(e);
    if store.kind == StoreErrorKind::Other {
        ActionError::Statement(store.message)
    } else {
        ActionError::Store(store)
    }
}

/// A parameter value bound as the type PostgreSQL inferred for it, the
/// way SQLite's affinity would store it: integers into any integer, real
/// or numeric column; other numbers into real, or into numeric with every
/// digit; numbers, booleans and text into text; any value into json and jsonb (a string as a JSON
/// string); text that reads as the target type into it. What does not fit
/// is a statement error that names the type, so the action can cast.
#[derive(Debug)]
pub struct PgParam(pub ParamValue);

type BoxError = Box<dyn StdError + Sync + Send>;

impl ToSql for PgParam {
    fn to_sql(&self, ty: &Type, out: &mut BytesMut) -> Result<IsNull, BoxError> {
        use ParamValue as P;
        let v = &self.0;
        if *v == P::Null {
            return Ok(IsNull::Yes);
        }
        match *ty {
            Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME | Type::UNKNOWN => {
                text_of(v).to_sql(&Type::TEXT, out)
            }
            Type::INT8 => int_of(v)?.to_sql(ty, out),
            Type::INT4 => i32::try_from(int_of(v)?)?.to_sql(ty, out),
            Type::INT2 => i16::try_from(int_of(v)?)?.to_sql(ty, out),
            Type::FLOAT8 => real_of(v)?.to_sql(ty, out),
            #[allow(clippy::cast_possible_truncation)]
            Type::FLOAT4 => (real_of(v)? as f32).to_sql(ty, out),
            Type::BOOL => match v {
                P::Bool(b) => b.to_sql(ty, out),
                P::Integer(0) => false.to_sql(ty, out),
                P::Integer(1) => true.to_sql(ty, out),
                P::Text(s) if s == "true" || s == "false" => (s == "true").to_sql(ty, out),
                _ => Err(mismatch(v, ty)),
            },
            Type::NUMERIC => {
                let text = match v {
                    P::Integer(_) | P::Number(_) | P::Text(_) => text_of(v),
                    _ => return Err(mismatch(v, ty)),
                };
                out.extend_from_slice(&numeric_binary(&text).ok_or_else(|| mismatch(v, ty))?);
                Ok(IsNull::No)
            }
            Type::JSON | Type::JSONB => {
                let json = match v {
                    P::Json(s) | P::Number(s) => s.clone(),
                    P::Text(s) => serde_json::Value::String(s.clone()).to_string(),
                    _ => text_of(v),
                };
                if *ty == Type::JSONB {
                    out.extend_from_slice(&[1]);
                }
                out.extend_from_slice(json.as_bytes());
                Ok(IsNull::No)
            }
            Type::BYTEA => text_of(v).as_bytes().to_sql(ty, out),
            _ => Err(mismatch(v, ty)),
        }
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    to_sql_checked!();
}

fn mismatch(v: &ParamValue, ty: &Type) -> BoxError {
    format!(
        "cannot bind {v:?} to a parameter of type {ty}: cast the parameter in the SQL (:name::text::{ty})"
    )
    .into()
}

fn text_of(v: &ParamValue) -> String {
    match v {
        ParamValue::Null => String::new(),
        ParamValue::Bool(b) => b.to_string(),
        ParamValue::Integer(i) => i.to_string(),
        ParamValue::Number(s) | ParamValue::Text(s) | ParamValue::Json(s) => s.clone(),
    }
}

fn int_of(v: &ParamValue) -> Result<i64, BoxError> {
    match v {
        ParamValue::Integer(i) => Ok(*i),
        ParamValue::Bool(b) => Ok(i64::from(*b)),
        ParamValue::Text(s) => s.trim().parse().map_err(|_| mismatch(v, &Type::INT8)),
        _ => Err(mismatch(v, &Type::INT8)),
    }
}

#[allow(clippy::cast_precision_loss)]
fn real_of(v: &ParamValue) -> Result<f64, BoxError> {
    match v {
        ParamValue::Integer(i) => Ok(*i as f64),
        ParamValue::Number(s) | ParamValue::Text(s) => {
            s.trim().parse().map_err(|_| mismatch(v, &Type::FLOAT8))
        }
        _ => Err(mismatch(v, &Type::FLOAT8)),
    }
}

/// PostgreSQL's binary NUMERIC for a decimal number as JSON writes one
/// (`-12.5`, `1e30`, `12345678901234567890.25`): base-10000 digits, a
/// weight, a sign and the display scale. None when `text` is not such a
/// number.
fn numeric_binary(text: &str) -> Option<Vec<u8>> {
    let t = text.trim();
    let (negative, t) = match t.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, t.strip_prefix('+').unwrap_or(t)),
    };
    let (mantissa, exponent) = match t.find(['e', 'E']) {
        Some(i) => (&t[..i], t[i + 1..].parse::<i32>().ok()?),
        None => (t, 0),
    };
    let (int_part, frac_part) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    if int_part.is_empty() && frac_part.is_empty() {
        return None;
    }
    if !int_part
        .bytes()
        .chain(frac_part.bytes())
        .all(|b| b.is_ascii_digit())
    {
        return None;
    }
    // All the decimal digits, and where the point falls among them.
    let digits: Vec<u8> = int_part
        .bytes()
        .chain(frac_part.bytes())
        .map(|b| b - b'0')
        .collect();
    let point = i32::try_from(int_part.len()).ok()?.checked_add(exponent)?;
    let scale = (i32::try_from(digits.len()).ok()? - point).max(0);
    if !(-16_383..=16_383).contains(&point) || scale > 16_383 {
        return None;
    }
    // Pad so the point sits on a base-10000 boundary on both sides.
    let lead = (4 - point.rem_euclid(4)) % 4;
    let mut padded: Vec<u8> = std::iter::repeat_n(0, lead as usize).collect();
    padded.extend_from_slice(&digits);
    let int_len = point + lead;
    // Make sure the integer part is covered (point beyond the digits).
    while (padded.len() as i32) < int_len {
        padded.push(0);
    }
    while !padded.len().is_multiple_of(4) {
        padded.push(0);
    }
    let mut groups: Vec<i16> = padded
        .chunks(4)
        .map(|c| c.iter().fold(0i16, |acc, &d| acc * 10 + i16::from(d)))
        .collect();
    let mut weight = int_len / 4 - 1;
    // Strip leading and trailing zero groups.
    while groups.first() == Some(&0) {
        groups.remove(0);
        weight -= 1;
    }
    while groups.last() == Some(&0) {
        groups.pop();
    }
    if groups.is_empty() {
        weight = 0;
    }
    let mut out = Vec::with_capacity(8 + groups.len() * 2);
    out.extend_from_slice(&i16::try_from(groups.len()).ok()?.to_be_bytes());
    out.extend_from_slice(&i16::try_from(weight).ok()?.to_be_bytes());
    let sign: u16 = if negative && !groups.is_empty() {
        0x4000
    } else {
        0
    };
    out.extend_from_slice(&sign.to_be_bytes());
    out.extend_from_slice(&u16::try_from(scale).ok()?.to_be_bytes());
    for g in groups {
        out.extend_from_slice(&g.to_be_bytes());
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::Duration;

    use super::*;
    use crate::config::{Config, Durability};
    use crate::ingest::{Claim, Outcome, claim_in};
    use crate::store::pg::{Settings, migrate};
    use crate::store::pg_cluster;
    use crate::store::{DatabaseUrl, now_ms};

    const CONFIG: &str = r#"
[sources.pay]
kind = "stripe"
secrets = ["whsec_unit"]
[[sources.pay.actions]]
name = "broken"
sql = "INSERT INTO ledger (event_id, amount) VALUES ('same-for-all', 0)"
[[sources.pay.actions]]
name = "credit"
sql = "INSERT INTO ledger (event_id, amount, at, meta, big, note) VALUES (:event_id, :amount, :received_at, :meta, :big, :note::text || '!')"
params = { amount = "json:/amount", meta = "json:/meta", big = "json:/big", note = "json:/note" }
[[sources.pay.actions]]
name = "notify"
forward = "http://127.0.0.1:9/"
"#;

    fn connect(test: &str) -> Option<Client> {
        let Some(cluster) = pg_cluster::cluster() else {
            pg_cluster::skipped(test);
            return None;
        };
        let url = cluster.create_database(test);
        let DatabaseUrl::Postgres(url) = DatabaseUrl::parse(&url, Path::new("/")).unwrap() else {
            panic!("not a PostgreSQL URL")
        };
        let settings = Settings::from_url(&url, Durability::Full, Duration::from_secs(5)).unwrap();
        let mut client = settings.connect().unwrap();
        migrate(&mut client).unwrap();
        Some(client)
    }

    /// Two transactions each finishing a different job of one event: the
    /// second counts only once the first has committed, so the event ends
    /// completed. Without the event row's lock both counted one job still
    /// open, both wrote `processing`, and it stayed so with every job done.
    #[test]
    fn jobs_of_one_event_finished_at_once_leave_it_completed() {
        let Some(mut a) = connect("jobs_of_one_event_finished_at_once") else {
            return;
        };
        let mut b = Client::connect(&url_of(&mut a), postgres::NoTls).unwrap();
        a.batch_execute(
            "INSERT INTO events (source, event_id, state, received_at, payload, headers, payload_hash)
                 VALUES ('pay', 'e1', 'processing', 1, '\\x7b7d', '{}', 'h');
             INSERT INTO jobs (source, event_id, action, kind, status, n_attempts, created_at, updated_at)
                 VALUES ('pay', 'e1', 'one', 'forward', 'processing', 1, 1, 1),
                        ('pay', 'e1', 'two', 'forward', 'processing', 1, 1, 1);",
        )
        .unwrap();
        let finish = |client: &mut Client, action: &str| -> String {
            client
                .execute(
                    "UPDATE jobs SET status = 'done' WHERE event_id = 'e1' AND action = $1",
                    &[&action],
                )
                .unwrap();
            let mut st = Statements::default();
            let mut tx = PgTx::new(client, &mut st);
            crate::ingest::refresh_event_state_in(&mut tx, "pay", "e1", 2).unwrap()
        };
        a.batch_execute("BEGIN").unwrap();
        assert_eq!(finish(&mut a, "one"), "processing");
        let other = std::thread::spawn(move || {
            b.batch_execute("BEGIN").unwrap();
            let state = finish(&mut b, "two");
            b.batch_execute("COMMIT").unwrap();
            state
        });
        // Commit the first only once the second is waiting for it, or has
        // already counted (which is the bug).
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let mut probe = Client::connect(&url_of(&mut a), postgres::NoTls).unwrap();
        while !other.is_finished() {
            let waiting: i64 = probe
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity
                      WHERE datname = current_database() AND wait_event_type = 'Lock'",
                    &[],
                )
                .unwrap()
                .get(0);
            if waiting > 0 {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "the second never ran");
            std::thread::sleep(Duration::from_millis(20));
        }
        a.batch_execute("COMMIT").unwrap();
        assert_eq!(other.join().unwrap(), "completed");
        let stored: String = a
            .query_one("SELECT state FROM events WHERE event_id = 'e1'", &[])
            .unwrap()
            .get(0);
        assert_eq!(stored, "completed");
    }

    /// The URL of the database `client` is connected to, for a second
    /// connection to it.
    fn url_of(client: &mut Client) -> String {
        let db: String = client
            .query_one("SELECT current_database()", &[])
            .unwrap()
            .get(0);
        pg_cluster::cluster().unwrap().url(&db)
    }

    fn claim_for(id: &str, hash: &str) -> Claim {
        let json = serde_json::json!({
            "id": id, "amount": 12.5, "meta": {"k": [1, 2]},
            "big": 123456789012345678901234567890u128, "note": "hi"
        });
        Claim {
            event_id: id.to_string(),
            event_type: None,
            body: json.to_string().into_bytes(),
            json: Some(json),
            content_type: None,
            headers: Vec::new(),
            kept_headers: "{}".to_string(),
            payload_hash: hash.to_string(),
            verified_with: Some(0),
            signed_at: None,
            received_at: now_ms(),
            remote: "test".to_string(),
        }
    }

    fn run(client: &mut Client, st: &mut Statements, c: &Claim) -> (Outcome, usize) {
        let config = Config::parse(CONFIG, "unit", Path::new("/"), None).unwrap();
        client.batch_execute("BEGIN").unwrap();
        let mut tx = PgTx::new(client, st);
        let outcome = claim_in(&mut tx, &config.sources[0], c).unwrap();
        let savepoints = tx.savepoints;
        client.batch_execute("COMMIT").unwrap();
        (outcome, savepoints)
    }

    /// The shared claim on PostgreSQL: one owner, the business row written
    /// once with typed values, a failing action rolled back alone, a
    /// duplicate and a mismatch told apart.
    #[test]
    fn the_claim_runs_on_postgres_with_typed_business_writes() {
        let Some(mut client) = connect("claim_typed") else {
            return;
        };
        client
            .batch_execute(
                "CREATE TABLE ledger (event_id text PRIMARY KEY, amount numeric NOT NULL,
                                      at bigint, meta jsonb, big numeric, note text);
                 INSERT INTO ledger (event_id, amount) VALUES ('same-for-all', 0);",
            )
            .unwrap();
        let mut st = Statements::default();
        let (first, savepoints) = run(&mut client, &mut st, &claim_for("e1", "h1"));
        assert_eq!(
            first,
            Outcome::Accepted {
                state: "failed".to_string(),
                forward_jobs: 1,
                sql_runs: vec![(0, false), (1, true)],
            }
        );
        assert_eq!(savepoints, 2);
        let (again, _) = run(&mut client, &mut st, &claim_for("e1", "h1"));
        assert_eq!(
            again,
            Outcome::Duplicate {
                state: "failed".to_string()
            }
        );
        let (other, _) = run(&mut client, &mut st, &claim_for("e1", "h2"));
        assert_eq!(
            other,
            Outcome::Mismatch {
                state: "failed".to_string()
            }
        );

        let row = client
            .query_one(
                "SELECT amount::text, at, meta::text, big::text, note FROM ledger WHERE event_id = 'e1'",
                &[],
            )
            .unwrap();
        assert_eq!(row.get::<_, String>(0), "12.5");
        assert!(row.get::<_, i64>(1) > 1_600_000_000);
        assert_eq!(row.get::<_, String>(2), r#"{"k": [1, 2]}"#);
        assert_eq!(row.get::<_, String>(3), "123456789012345678901234567890");
        assert_eq!(row.get::<_, String>(4), "hi!");
        let mut count = |sql: &str| -> i64 { client.query_one(sql, &[]).unwrap().get(0) };
        assert_eq!(count("SELECT count(*) FROM ledger"), 2);
        assert_eq!(count("SELECT count(*) FROM events"), 1);
        assert_eq!(count("SELECT count(*) FROM deliveries"), 3);
        assert_eq!(count("SELECT count(*) FROM incidents"), 1);
        assert_eq!(count("SELECT count(*) FROM incident_payloads"), 1);
        assert_eq!(
            count("SELECT count(*) FROM jobs WHERE status = 'failed' AND action = 'broken'"),
            1
        );
        assert_eq!(
            count("SELECT count(*) FROM jobs WHERE status = 'pending' AND kind = 'forward'"),
            1
        );
        assert_eq!(
            count("SELECT count(*) FROM attempts WHERE error_kind = 'sql'"),
            1
        );
    }

    #[test]
    fn numbers_bind_into_numeric_exactly() {
        let Some(mut client) = connect("numeric_binary") else {
            return;
        };
        for n in [
            "0",
            "1",
            "-1",
            "12.5",
            "-0.001",
            "10000",
            "9999.9999",
            "1e30",
            "1.5E-7",
            "123456789012345678901234567890.25",
            "100",
            "0.0001",
            "-5e3",
        ] {
            let row = client
                .query_one(
                    "SELECT $1::numeric::text",
                    &[&PgParam(ParamValue::Number(n.to_string()))],
                )
                .unwrap_or_else(|e| panic!("{n}: {e:?}"));
            let back: String = row.get(0);
            let want: String = client
                .query_one(&format!("SELECT ('{n}'::numeric)::text"), &[])
                .unwrap()
                .get(0);
            assert_eq!(back, want, "{n}");
        }
        assert!(numeric_binary("1.2.3").is_none());
        assert!(numeric_binary("abc").is_none());
    }
}
