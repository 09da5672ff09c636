//! SQLite's side of the claim seam ([`Tx`]): the statements of a claim,
//! cached per connection, on the writer's connection inside its group
//! transaction.

use rusqlite::types::Value as SqlValue;
use rusqlite::{Connection, OptionalExtension, params};

use super::tx::{ActionError, JobTallies, NewEvent, NewJob, ParamValue, Tx};
use super::{StoreError, StoreErrorKind};

/// A connection with an open transaction, seen through [`Tx`].
pub struct Sqlite<'c> {
    pub conn: &'c Connection,
}

impl<'c> Sqlite<'c> {
    pub fn new(conn: &'c Connection) -> Sqlite<'c> {
        Sqlite { conn }
    }
}

/// A parameter value as SQLite stores it: booleans as 0/1, numbers that
/// are not i64 as REAL (as text when f64 cannot hold them), objects and
/// arrays as JSON text.
pub fn to_sql_value(v: ParamValue) -> SqlValue {
    match v {
        ParamValue::Null => SqlValue::Null,
        ParamValue::Bool(b) => SqlValue::Integer(i64::from(b)),
        ParamValue::Integer(i) => SqlValue::Integer(i),
        ParamValue::Number(s) => match s.parse::<f64>() {
            Ok(f) if f.is_finite() => SqlValue::Real(f),
            _ => SqlValue::Text(s),
        },
        ParamValue::Text(s) | ParamValue::Json(s) => SqlValue::Text(s),
    }
}

impl Tx for Sqlite<'_> {
    fn insert_event(&mut self, e: &NewEvent<'_>) -> Result<bool, StoreError> {
        let inserted = self
            .conn
            .prepare_cached(
                "INSERT OR IGNORE INTO events (source, event_id, type, state, received_at, completed_at,
                     payload, content_type, headers, payload_hash, verified_with, signed_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
            )?
            .execute(params![
                e.source,
                e.event_id,
                e.event_type,
                e.state,
                e.received_at,
                e.completed_at,
                e.payload,
                e.content_type,
                e.headers,
                e.payload_hash,
                e.verified_with,
                e.signed_at,
            ])?;
        Ok(inserted == 1)
    }

    fn event_state_and_hash(
        &mut self,
        source: &str,
        event_id: &str,
    ) -> Result<(String, String), StoreError> {
        Ok(self
            .conn
            .prepare_cached(
                "SELECT state, payload_hash FROM events WHERE source = ?1 AND event_id = ?2",
            )?
            .query_row(params![source, event_id], |r| Ok((r.get(0)?, r.get(1)?)))?)
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
        self.conn
            .prepare_cached(
                "INSERT INTO incidents (source, event_id, kind, created_at, payload_hash, detail)
                 VALUES (?1, ?2, 'payload_mismatch', ?3, ?4, ?5)",
            )?
            .execute(params![source, event_id, created_at, payload_hash, detail])?;
        self.conn
            .prepare_cached(
                "INSERT INTO incident_payloads (incident_id, payload) VALUES (last_insert_rowid(), ?1)",
            )?
            .execute(params![payload])?;
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
        self.conn
            .prepare_cached(
                "INSERT INTO deliveries (source, event_id, received_at, outcome, remote, detail)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )?
            .execute(params![
                source,
                event_id,
                received_at,
                outcome,
                remote,
                detail
            ])?;
        Ok(())
    }

    fn insert_job(&mut self, j: &NewJob<'_>) -> Result<i64, StoreError> {
        self.conn
            .prepare_cached(
                "INSERT INTO jobs (source, event_id, action, kind, status, n_attempts, next_attempt_at,
                                   last_error, created_at, updated_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?9)",
            )?
            .execute(params![
                j.source,
                j.event_id,
                j.action,
                j.kind,
                j.status,
                j.n_attempts,
                j.next_attempt_at,
                j.last_error,
                j.created_at,
            ])?;
        Ok(self.conn.last_insert_rowid())
    }

    fn insert_sql_attempt(
        &mut self,
        job_id: i64,
        started_at: i64,
        finished_at: i64,
        outcome: &str,
        error: Option<&str>,
    ) -> Result<(), StoreError> {
        self.conn
            .prepare_cached(
                "INSERT INTO attempts (job_id, n, started_at, finished_at, outcome, error, error_kind)
                 VALUES (?1, 1, ?2, ?3, ?4, ?5, ?6)",
            )?
            .execute(params![
                job_id,
                started_at,
                finished_at,
                outcome,
                error,
                error.map(|_| "sql"),
            ])?;
        Ok(())
    }

    fn is_paused(&mut self, source: &str, action: &str) -> Result<bool, StoreError> {
        let paused: Option<i64> = self
            .conn
            .prepare_cached("SELECT 1 FROM paused_actions WHERE source = ?1 AND action = ?2")?
            .query_row(params![source, action], |r| r.get(0))
            .optional()?;
        Ok(paused.is_some())
    }

    fn job_tallies(&mut self, source: &str, event_id: &str) -> Result<JobTallies, StoreError> {
        Ok(self
            .conn
            .prepare_cached(
                "SELECT
                     coalesce(sum(status = 'failed'), 0),
                     coalesce(sum(status IN ('pending', 'processing', 'paused')), 0),
                     coalesce(sum(status = 'processing' OR n_attempts > 0), 0)
                 FROM jobs WHERE source = ?1 AND event_id = ?2",
            )?
            .query_row(params![source, event_id], |r| {
                Ok(JobTallies {
                    failed: r.get(0)?,
                    open: r.get(1)?,
                    started: r.get(2)?,
                })
            })?)
    }

    fn set_event_state(
        &mut self,
        source: &str,
        event_id: &str,
        state: &str,
        now: i64,
    ) -> Result<(), StoreError> {
        self.conn
            .prepare_cached(
                "UPDATE events SET state = ?3,
                        completed_at = CASE WHEN ?3 = 'completed' THEN coalesce(completed_at, ?4) ELSE NULL END
                 WHERE source = ?1 AND event_id = ?2 AND state <> ?3",
            )?
            .execute(params![source, event_id, state, now])?;
        Ok(())
    }

    fn in_savepoint<T, E: From<StoreError>>(
        &mut self,
        name: &'static str,
        body: impl FnOnce(&mut Self) -> Result<T, E>,
    ) -> Result<T, E> {
        // Cached statements: every claim with an SQL action opens and
        // releases a savepoint on the writer thread.
        let conn = self.conn;
        conn.prepare_cached(&format!("SAVEPOINT {name}"))
            .and_then(|mut s| s.execute([]))
            .map_err(StoreError::from)?;
        match body(self) {
            Ok(v) => {
                conn.prepare_cached(&format!("RELEASE {name}"))
                    .and_then(|mut s| s.execute([]))
                    .map_err(StoreError::from)?;
                Ok(v)
            }
            Err(e) => {
                // If SQLite already rolled the whole transaction back (disk
                // full, I/O error), there is no savepoint left; the writer
                // notices.
                let _ = conn.execute_batch(&format!("ROLLBACK TO {name}; RELEASE {name}"));
                Err(e)
            }
        }
    }

    fn execute_action(
        &mut self,
        sql: &str,
        mut value_of: impl FnMut(&str) -> Option<ParamValue>,
    ) -> Result<(), ActionError> {
        let statement_error = |e: rusqlite::Error| {
            let store = StoreError::from(e);
            if store.kind == StoreErrorKind::Other {
                ActionError::Statement(store.message)
            } else {
                ActionError::Store(store)
            }
        };
        let mut stmt = self.conn.prepare_cached(sql).map_err(statement_error)?;
        for i in 1..=stmt.parameter_count() {
            let name = stmt
                .parameter_name(i)
                .map(|n| n.trim_start_matches([':', '@', '$']).to_string())
                .ok_or_else(|| {
                    ActionError::Statement(format!("parameter {i} has no name: use :name"))
                })?;
            let value = value_of(&name)
                .ok_or_else(|| ActionError::Statement(format!("unknown parameter :{name}")))?;
            stmt.raw_bind_parameter(i, to_sql_value(value))
                .map_err(statement_error)?;
        }
        stmt.raw_execute().map_err(statement_error)?;
        Ok(())
    }
}
