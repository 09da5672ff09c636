//! [`PgTx`]'s claim steps ([`Tx`]) in PostgreSQL's dialect.

use postgres::fallible_iterator::FallibleIterator as _;
use postgres::types::{ToSql, Type};

use crate::state::{JobKind, JobStatus, open_job_statuses_sql};
use crate::store::tx::{
    ActionError, Arg, JobTallies, NewAttempt, NewEvent, NewJob, ParamValue, Tx,
};
use crate::store::{StoreError, StoreErrorKind, named};

use super::{DeliveryRow, PgParam, PgTx, key};

/// The last unfinished job of an order key ($1 source, $2 action, $3 key),
/// locked. A claim that inserts a job of the key takes it
/// first: a transaction that is finishing that job (whose trigger makes
/// the next waiting job due) commits before the insert looks, so the new
/// job is never parked behind a job that was finishing unseen, with no one
/// left to make it due.
fn order_last_locked() -> String {
    format!(
        "SELECT id FROM jobs WHERE {} ORDER BY order_seq DESC, id DESC LIMIT 1 FOR UPDATE",
        crate::store::tx::order_open("$1", "$2", "$3")
    )
}

/// The job inserts in PostgreSQL's dialect, made once.
static PLAIN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
static ORDERED: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// `sql` (the shared `?N` text) with `$N` and `RETURNING id`, made once into `cell`.
fn pg_sql(
    cell: &'static std::sync::OnceLock<String>,
    sql: &str,
) -> Result<&'static str, StoreError> {
    if let Some(done) = cell.get() {
        return Ok(done);
    }
    let made = format!("{} RETURNING id", crate::store::db::to_dollars(sql)?);
    Ok(cell.get_or_init(|| made))
}

impl Tx for PgTx<'_> {
    fn run(&mut self, sql: &'static str, args: &[Arg<'_>]) -> Result<u64, StoreError> {
        let s = self.shared(sql)?;
        let mut rows = self.client.query_raw(&s, args)?;
        while rows.next()?.is_some() {}
        Ok(rows.rows_affected().unwrap_or(0))
    }

    fn read_i64(&mut self, sql: &'static str, args: &[Arg<'_>]) -> Result<Option<i64>, StoreError> {
        let s = self.shared(sql)?;
        let mut rows = self.client.query_raw(&s, args)?;
        let Some(row) = rows.next()? else {
            return Ok(None);
        };
        let ty = row.columns().first().map(|c| c.type_().clone());
        Ok(match ty {
            Some(Type::BOOL) => row.try_get::<_, Option<bool>>(0)?.map(i64::from),
            Some(Type::INT4) => row.try_get::<_, Option<i32>>(0)?.map(i64::from),
            _ => row.try_get::<_, Option<i64>>(0)?,
        })
    }

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
        let s = self.shared(crate::store::events::STATE_AND_HASH)?;
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
        crate::store::tx::insert_delivery_now(
            self,
            source,
            event_id,
            received_at,
            outcome,
            remote,
            detail,
        )
    }

    fn insert_job(&mut self, j: &NewJob<'_>) -> Result<i64, StoreError> {
        if let Some(g) = &mut self.group {
            // Only a job a worker could take now wakes the workers: one
            // parked for `after` (no due time) or for a paused action
            // waits for the change that makes it due, which wakes them.
            g.forward_jobs |= j.kind == JobKind::Forward
                && j.status == JobStatus::Pending
                && j.next_attempt_at.is_some();
        }
        let sql = match j.order_key {
            Some(order_key) => {
                // The key's last unfinished job first (see `order_last_locked`).
                let lock = self.prepared(&order_last_locked())?;
                self.client
                    .query(&lock, &[&j.source, &j.action, &order_key])?;
                pg_sql(&ORDERED, crate::store::tx::ordered_job_insert())?
            }
            None => pg_sql(&PLAIN, crate::store::tx::JOB_INSERT)?,
        };
        let s = self.prepared(sql)?;
        let row = self.client.query_one(
            &s,
            &[
                &j.source,
                &j.event_id,
                &j.action,
                &j.kind.as_str(),
                &j.status.as_str(),
                &j.n_attempts,
                &j.next_attempt_at,
                &j.last_error,
                &j.created_at,
                &j.order_key,
            ],
        )?;
        Ok(row.get(0))
    }

    fn write_attempt(&mut self, a: &NewAttempt<'_>, replace: bool) -> Result<(), StoreError> {
        self.put(a, replace)
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
        let s = self.prepared(concat!(
            "SELECT
                 count(*) FILTER (WHERE status = 'failed'),
                 count(*) FILTER (WHERE status IN (",
            open_job_statuses_sql!(),
            ")),
                 count(*) FILTER (WHERE status = 'processing' OR n_attempts > 0)
             FROM jobs WHERE source = $1 AND event_id = $2",
        ))?;
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
        // The action (the savepoint's only statement) runs in the team's
        // search_path (its tables, not idemhook's), and a deferred
        // constraint it breaks is checked now,
        // inside its savepoint, not at the group's COMMIT: the action
        // fails, the group commits. Both go with the savepoint's own
        // statements, so they cost no round trip.
        self.client
            .batch_execute(&format!(
                "SAVEPOINT {name}; {}; SET CONSTRAINTS ALL IMMEDIATE",
                crate::store::postgres::TEAM_PATH
            ))
            .map_err(StoreError::from)?;
        let held_back = self.group.as_ref().map_or(0, |g| g.deliveries.len());
        match body(self) {
            Ok(v) => {
                self.client
                    .batch_execute(&format!(
                        "{}; RELEASE SAVEPOINT {name}",
                        crate::store::postgres::OUR_PATH
                    ))
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

    fn shared_db(&mut self) -> Option<crate::store::db::Db<'_>> {
        Some(crate::store::db::Db::postgres(self.client))
    }
}

/// An SQL action's failure: the statement's own (a constraint, a syntax
/// error, a value that does not fit its parameter) is the action's; a
/// connection or server failure is storage's.
fn action_error(e: postgres::Error) -> ActionError {
    // The action's own statement ran past statement_timeout (sql_timeout)
    // or waited past lock_timeout: the action failed (rolled back to its
    // savepoint, recorded on its job), the event is stored all the same.
    let own_timeout = e.code().is_some_and(|c| {
        *c == postgres::error::SqlState::QUERY_CANCELED
            || *c == postgres::error::SqlState::LOCK_NOT_AVAILABLE
    });
    let store = StoreError::from(e);
    if own_timeout {
        return ActionError::Statement(format!("{} (the SQL action's timeout)", store.message));
    }
    if store.kind == StoreErrorKind::Other {
        ActionError::Statement(store.message)
    } else {
        ActionError::Store(store)
    }
}
