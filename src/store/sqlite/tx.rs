//! SQLite's side of the claim seam ([`Tx`]): the primitives the shared
//! steps run on and the steps SQLite writes its own way, each statement
//! cached per connection, on the writer's connection inside its group
//! transaction.

use rusqlite::types::Value as SqlValue;
use rusqlite::{Connection, OptionalExtension, params};

use crate::state::{JobStatus, open_job_statuses_sql};
use crate::store::tx::{
    ActionError, Arg, JobTallies, NewAttempt, NewEvent, NewJob, ParamValue, Tx,
};
use crate::store::{StoreError, StoreErrorKind};

/// A connection with an open transaction, seen through [`Tx`].
pub struct SqliteTx<'c> {
    pub conn: &'c Connection,
}

impl<'c> SqliteTx<'c> {
    pub fn new(conn: &'c Connection) -> SqliteTx<'c> {
        SqliteTx { conn }
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
        ParamValue::Text(s) | ParamValue::Json(s) | ParamValue::Document(s) => SqlValue::Text(s),
    }
}

/// A shared statement's parameter, bound as SQLite's value.
impl rusqlite::ToSql for Arg<'_> {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        use rusqlite::types::ToSqlOutput::Borrowed;
        use rusqlite::types::ValueRef;
        Ok(Borrowed(match *self {
            Arg::Null => ValueRef::Null,
            Arg::Int(i) => ValueRef::Integer(i),
            Arg::Text(s) => ValueRef::Text(s.as_bytes()),
        }))
    }
}

impl Tx for SqliteTx<'_> {
    fn run(&mut self, sql: &'static str, args: &[Arg<'_>]) -> Result<u64, StoreError> {
        let n = self
            .conn
            .prepare_cached(sql)?
            .execute(rusqlite::params_from_iter(args))?;
        Ok(n as u64)
    }

    fn read_i64(&mut self, sql: &'static str, args: &[Arg<'_>]) -> Result<Option<i64>, StoreError> {
        Ok(self
            .conn
            .prepare_cached(sql)?
            .query_row(rusqlite::params_from_iter(args), |r| r.get(0))
            .optional()?
            .flatten())
    }

    fn write_attempt(&mut self, a: &NewAttempt<'_>, replace: bool) -> Result<(), StoreError> {
        self.conn
            .prepare_cached(crate::store::attempts::PUT)?
            .execute(params![
                a.job_id,
                a.n,
                a.started_at,
                a.finished_at,
                a.outcome,
                a.http_status,
                a.error,
                a.error_kind,
                a.request_id,
                a.response_head,
                a.worker,
                None::<&str>,
                replace,
            ])?;
        Ok(())
    }
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
            .prepare_cached(crate::store::events::STATE_AND_HASH)?
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

    fn insert_job(&mut self, j: &NewJob<'_>) -> Result<i64, StoreError> {
        let sql = if j.order_key.is_some() {
            crate::store::tx::ordered_job_insert()
        } else {
            crate::store::tx::JOB_INSERT
        };
        self.conn.prepare_cached(sql)?.execute(params![
            j.source,
            j.event_id,
            j.action,
            j.kind,
            j.status,
            j.n_attempts,
            j.next_attempt_at,
            j.last_error,
            j.created_at,
            j.order_key,
        ])?;
        Ok(self.conn.last_insert_rowid())
    }

    fn job_tallies(&mut self, source: &str, event_id: &str) -> Result<JobTallies, StoreError> {
        Ok(self
            .conn
            .prepare_cached(concat!(
                "SELECT
                     coalesce(sum(status = 'failed'), 0),
                     coalesce(sum(status IN (",
                open_job_statuses_sql!(),
                ")), 0),
                     coalesce(sum(status = 'processing' OR n_attempts > 0), 0)
                 FROM jobs WHERE source = ?1 AND event_id = ?2"
            ))?
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

    fn shared_db(&mut self) -> Option<crate::store::db::Db<'_>> {
        Some(crate::store::db::Db::sqlite(self.conn))
    }
}

use crate::store::tx::{Candidate, ForwardEvent, OutboxTx};

fn candidate(r: &rusqlite::Row<'_>) -> rusqlite::Result<Candidate> {
    Ok(Candidate {
        job_id: r.get(0)?,
        source: r.get(1)?,
        event_id: r.get(2)?,
        action: r.get(3)?,
        n_before: r.get(4)?,
        leased_at: r.get(5)?,
        previous_owner: r.get(6)?,
        pending: true,
        failing_since: r.get(7)?,
        probe_failures: r.get(8)?,
    })
}

/// Forward jobs whose lease ran out (their worker crashed or hung). The
/// LIMIT is `TAKE_BATCH` as a literal (a test checks they agree).
pub const EXPIRED_JOBS: &str =
    "SELECT id, source, event_id, action, n_attempts, updated_at, lease_owner, failing_since,
            probe_failures FROM jobs
     WHERE status = 'processing' AND kind = 'forward' AND lease_until < ?1
     LIMIT 16";
/// Pending forward jobs that are due, the longest-due first.
pub const DUE_JOBS: &str =
    "SELECT id, source, event_id, action, n_attempts, updated_at, lease_owner, failing_since,
            probe_failures FROM jobs
     WHERE status = 'pending' AND next_attempt_at <= ?1 AND kind = 'forward'
     ORDER BY next_attempt_at LIMIT 16";

impl OutboxTx for SqliteTx<'_> {
    fn db(&mut self) -> crate::store::db::Db<'_> {
        crate::store::db::Db::sqlite(self.conn)
    }

    fn expired_jobs(&mut self, now: i64) -> Result<Vec<Candidate>, StoreError> {
        let mut stmt = self.conn.prepare_cached(EXPIRED_JOBS)?;
        let rows = stmt.query_map(params![now], candidate)?;
        let mut out = Vec::new();
        for row in rows {
            out.push(Candidate {
                pending: false,
                ..row?
            });
        }
        Ok(out)
    }

    fn due_jobs(&mut self, now: i64) -> Result<Vec<Candidate>, StoreError> {
        let mut stmt = self.conn.prepare_cached(DUE_JOBS)?;
        let rows = stmt.query_map(params![now], candidate)?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }

    fn open_jobs_of_event(
        &mut self,
        source: &str,
        event_id: &str,
    ) -> Result<Vec<(String, JobStatus)>, StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached(crate::store::jobs::OPEN_OF_EVENT)?;
        let rows = stmt.query_map(params![source, event_id], |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, JobStatus>(1)?))
        })?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }

    fn latest_replay_from(&mut self, job_id: i64) -> Result<Option<JobStatus>, StoreError> {
        Ok(self
            .conn
            .prepare_cached(crate::store::replays::LATEST_FROM)?
            .query_row([job_id], |r| r.get(0))
            .optional()?)
    }

    fn forward_event(
        &mut self,
        source: &str,
        event_id: &str,
    ) -> Result<Option<ForwardEvent>, StoreError> {
        Ok(self
            .conn
            .prepare_cached(crate::store::events::FORWARDED)?
            .query_row(params![source, event_id], |r| {
                Ok(ForwardEvent {
                    event_type: r.get(0)?,
                    body: r.get(1)?,
                    content_type: r.get(2)?,
                })
            })
            .optional()?)
    }
}
