//! The claim: the one transaction step that turns a verified delivery into
//! a stored event, exactly once.
//!
//! `INSERT OR IGNORE` into `events` and `changes()` decide who owns the
//! event; there is never a read before the insert. The owner, in the same
//! transaction, runs each matching SQL action in its own savepoint together
//! with its job row (a failing action rolls back only itself and leaves a
//! failed job), and writes a pending job row for each forward action (the
//! outbox). A loser reads the stored state and hash to answer "duplicate"
//! or records a mismatch incident. Every delivery gets a row.
//!
//! [`claim`] runs on the writer thread inside the group transaction; it
//! does no IO besides SQL and never commits.

use rusqlite::types::Value as SqlValue;
use rusqlite::{Connection, OptionalExtension, params};
use serde_json::Value;

use crate::config::{Action, ActionKind, Source};
use crate::key::{Input, Part};
use crate::metrics::Delivery;
use crate::store::{StoreError, in_savepoint};

/// A verified delivery, ready to claim.
pub struct Claim {
    pub event_id: String,
    pub event_type: Option<String>,
    pub body: Vec<u8>,
    /// The parsed body, when the source reads JSON.
    pub json: Option<Value>,
    pub content_type: Option<String>,
    /// Every request header, for SQL action parameters.
    pub headers: Vec<(String, String)>,
    /// The headers kept with the event, as a JSON object.
    pub kept_headers: String,
    pub payload_hash: String,
    pub verified_with: Option<usize>,
    pub signed_at: Option<i64>,
    /// Unix milliseconds.
    pub received_at: i64,
    pub remote: String,
}

/// What the claim decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// This delivery stored the event. `forward_jobs` new outbox rows;
    /// `sql_runs` the SQL actions that ran (by index in the source's
    /// actions) and whether each succeeded, for the attempts metric.
    Accepted {
        state: String,
        forward_jobs: usize,
        sql_runs: Vec<(usize, bool)>,
    },
    /// The event was already stored, with the same payload hash.
    Duplicate { state: String },
    /// The event was already stored with a different payload hash; an
    /// incident was recorded and the stored event left alone.
    Mismatch { state: String },
}

impl Outcome {
    pub fn delivery(&self) -> Delivery {
        match self {
            Outcome::Accepted { .. } => Delivery::Accepted,
            Outcome::Duplicate { .. } => Delivery::Duplicate,
            Outcome::Mismatch { .. } => Delivery::Mismatch,
        }
    }
}

/// Claims the event for `source`. Runs inside the caller's transaction.
pub fn claim(conn: &Connection, source: &Source, c: &Claim) -> Result<Outcome, StoreError> {
    let matching: Vec<(usize, &Action)> = source
        .actions
        .iter()
        .enumerate()
        .filter(|(_, a)| a.takes(c.event_type.as_deref()))
        .collect();
    let initial_state = if matching.is_empty() {
        "completed"
    } else {
        "accepted"
    };
    let completed_at = matching.is_empty().then_some(c.received_at);
    let inserted = conn
        .prepare_cached(
            "INSERT OR IGNORE INTO events (source, event_id, type, state, received_at, completed_at,
                 payload, content_type, headers, payload_hash, verified_with, signed_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
        )?
        .execute(params![
            source.name,
            c.event_id,
            c.event_type,
            initial_state,
            c.received_at,
            completed_at,
            c.body,
            c.content_type,
            c.kept_headers,
            c.payload_hash,
            c.verified_with.map(|i| i as i64),
            c.signed_at,
        ])?;

    let outcome = if inserted == 1 {
        let (mut forward_jobs, mut sql_runs) = (0, Vec::new());
        for &(index, action) in &matching {
            match &action.kind {
                ActionKind::Sql { sql, params } => {
                    let ok = run_sql_job(conn, source, action, sql, params, c)?;
                    sql_runs.push((index, ok));
                }
                ActionKind::Forward(_) => {
                    insert_forward_job(conn, source, action, c)?;
                    forward_jobs += 1;
                }
            }
        }
        // Only SQL actions can have finished (or failed) already; with
        // forward jobs alone the event is as inserted, 'accepted' (or
        // 'completed' with no action at all), and a recount would only
        // confirm it.
        let state = if forward_jobs == matching.len() {
            initial_state.to_string()
        } else {
            refresh_event_state(conn, &source.name, &c.event_id, c.received_at)?
        };
        Outcome::Accepted {
            state,
            forward_jobs,
            sql_runs,
        }
    } else {
        let (state, stored_hash): (String, String) = conn
            .prepare_cached(
                "SELECT state, payload_hash FROM events WHERE source = ?1 AND event_id = ?2",
            )?
            .query_row(params![source.name, c.event_id], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })?;
        if stored_hash == c.payload_hash {
            Outcome::Duplicate { state }
        } else {
            conn.prepare_cached(
                "INSERT INTO incidents (source, event_id, kind, created_at, payload_hash, detail)
                 VALUES (?1, ?2, 'payload_mismatch', ?3, ?4, ?5)",
            )?
            .execute(params![
                source.name,
                c.event_id,
                c.received_at,
                c.payload_hash,
                format!(
                    "duplicate delivery with a different payload hash (stored {}, received {}) from {}",
                    short(&stored_hash),
                    short(&c.payload_hash),
                    c.remote
                ),
            ])?;
            conn.prepare_cached(
                "INSERT INTO incident_payloads (incident_id, payload) VALUES (last_insert_rowid(), ?1)",
            )?
            .execute(params![c.body])?;
            Outcome::Mismatch { state }
        }
    };
    record_delivery(
        conn,
        &source.name,
        Some(&c.event_id),
        c.received_at,
        outcome.delivery(),
        &c.remote,
        None,
    )?;
    Ok(outcome)
}

fn short(hash: &str) -> &str {
    hash.get(..12).unwrap_or(hash)
}

/// A condition on `deliveries` that selects one event's deliveries, given
/// ?1 = source, ?2 = event_id and ?3 = the event's received_at (ms). The
/// accepted delivery is not in the (source, event_id) index (see
/// schema.sql); it has the event's received_at, so it is looked up there.
pub const DELIVERIES_OF_EVENT: &str = "id IN (
    SELECT id FROM deliveries WHERE source = ?1 AND event_id = ?2 AND outcome <> 'accepted'
    UNION ALL
    SELECT id FROM deliveries
     WHERE received_at = ?3 AND source = ?1 AND event_id = ?2 AND outcome = 'accepted')";

/// Records one delivery. `event_id` is None when the request was refused
/// before its key was known.
pub fn record_delivery(
    conn: &Connection,
    source: &str,
    event_id: Option<&str>,
    received_at: i64,
    outcome: Delivery,
    remote: &str,
    detail: Option<&str>,
) -> Result<(), StoreError> {
    conn.prepare_cached(
        "INSERT INTO deliveries (source, event_id, received_at, outcome, remote, detail)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )?
    .execute(params![
        source,
        event_id,
        received_at,
        outcome.name(),
        remote,
        detail
    ])?;
    Ok(())
}

/// Runs one SQL action with its job row in a savepoint. A failing statement
/// rolls back only itself; the job is then written as failed, with the
/// error, outside that savepoint. True when the action succeeded.
fn run_sql_job(
    conn: &Connection,
    source: &Source,
    action: &Action,
    sql: &str,
    sql_params: &[(String, Part)],
    c: &Claim,
) -> Result<bool, StoreError> {
    let started = crate::store::now_ms();
    let result = in_savepoint(conn, "action", |conn| -> Result<(), ActionError> {
        execute_action(conn, source, sql, sql_params, c)?;
        let job_id = insert_job(conn, source, action, c, "done", None)?;
        insert_sql_attempt(conn, job_id, started, "ok", None)?;
        Ok(())
    });
    match result {
        Ok(()) => Ok(true),
        Err(ActionError::Store(e)) if e.kind != crate::store::StoreErrorKind::Other => Err(e),
        Err(e) => {
            let message = e.to_string();
            let job_id = insert_job(conn, source, action, c, "failed", Some(&message))?;
            insert_sql_attempt(conn, job_id, started, "failed", Some(&message))?;
            // A dead letter: the effect did not happen (error, like a
            // forward job that failed for good).
            crate::log::error(
                "action failed",
                &[
                    ("source", &source.name),
                    ("event_id", &c.event_id),
                    ("action", &action.name),
                    ("error", &message),
                ],
            );
            Ok(false)
        }
    }
}

/// Why an SQL action failed: its own statement (the action's bug, recorded
/// on its job) or storage (the whole claim fails and is answered 503).
#[derive(Debug, thiserror::Error)]
enum ActionError {
    #[error("{0}")]
    Statement(String),
    #[error("{0}")]
    Store(StoreError),
}

impl From<rusqlite::Error> for ActionError {
    fn from(e: rusqlite::Error) -> ActionError {
        ActionError::Store(StoreError::from(e))
    }
}

impl From<StoreError> for ActionError {
    fn from(e: StoreError) -> ActionError {
        ActionError::Store(e)
    }
}

fn execute_action(
    conn: &Connection,
    source: &Source,
    sql: &str,
    sql_params: &[(String, Part)],
    c: &Claim,
) -> Result<(), ActionError> {
    let statement_error = |e: rusqlite::Error| {
        let store = StoreError::from(e);
        if store.kind == crate::store::StoreErrorKind::Other {
            ActionError::Statement(store.message)
        } else {
            ActionError::Store(store)
        }
    };
    let mut stmt = conn.prepare_cached(sql).map_err(statement_error)?;
    let input = Input {
        headers: &c.headers,
        json: c.json.as_ref().map(crate::key::Json::Parsed),
    };
    for i in 1..=stmt.parameter_count() {
        let name = stmt
            .parameter_name(i)
            .map(|n| n.trim_start_matches([':', '@', '$']).to_string())
            .ok_or_else(|| {
                ActionError::Statement(format!("parameter {i} has no name: use :name"))
            })?;
        let value = bind_value(&name, sql_params, source, &input, c)
            .ok_or_else(|| ActionError::Statement(format!("unknown parameter :{name}")))?;
        stmt.raw_bind_parameter(i, value).map_err(statement_error)?;
    }
    stmt.raw_execute().map_err(statement_error)?;
    Ok(())
}

/// The value of a named parameter: the action's `params` first, then the
/// built-ins.
fn bind_value(
    name: &str,
    sql_params: &[(String, Part)],
    source: &Source,
    input: &Input<'_>,
    c: &Claim,
) -> Option<SqlValue> {
    if let Some((_, part)) = sql_params.iter().find(|(n, _)| n == name) {
        return Some(match part.lookup(input) {
            Some(crate::key::Found::Json(v)) => json_to_sql(&v),
            Some(crate::key::Found::Header(h)) => SqlValue::Text(h.to_string()),
            None => SqlValue::Null,
        });
    }
    Some(match name {
        "source" => SqlValue::Text(source.name.clone()),
        "event_id" => SqlValue::Text(c.event_id.clone()),
        "type" => c.event_type.clone().map_or(SqlValue::Null, SqlValue::Text),
        "payload" => SqlValue::Text(String::from_utf8_lossy(&c.body).into_owned()),
        "received_at" => SqlValue::Integer(crate::store::ms_to_secs(c.received_at)),
        _ => return None,
    })
}

/// JSON values bind as their SQLite types; objects and arrays as JSON text
/// (compact, keys sorted: `key::canonical_json`).
pub fn json_to_sql(v: &Value) -> SqlValue {
    match v {
        Value::Null => SqlValue::Null,
        Value::Bool(b) => SqlValue::Integer(i64::from(*b)),
        Value::Number(n) => match n.as_i64() {
            Some(i) => SqlValue::Integer(i),
            None => n
                .as_f64()
                .map_or(SqlValue::Text(n.to_string()), SqlValue::Real),
        },
        Value::String(s) => SqlValue::Text(s.clone()),
        other => SqlValue::Text(crate::key::canonical_json(other)),
    }
}

fn insert_job(
    conn: &Connection,
    source: &Source,
    action: &Action,
    c: &Claim,
    status: &str,
    error: Option<&str>,
) -> Result<i64, StoreError> {
    conn.prepare_cached(
        "INSERT INTO jobs (source, event_id, action, kind, status, n_attempts, next_attempt_at,
                           last_error, created_at, updated_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?9)",
    )?
    .execute(params![
        source.name,
        c.event_id,
        action.name,
        action.kind_name(),
        status,
        i64::from(action.kind_name() == "sql"),
        (status == "pending").then_some(c.received_at),
        error,
        c.received_at,
    ])?;
    Ok(conn.last_insert_rowid())
}

fn insert_sql_attempt(
    conn: &Connection,
    job_id: i64,
    started: i64,
    outcome: &str,
    error: Option<&str>,
) -> Result<(), StoreError> {
    conn.prepare_cached(
        "INSERT INTO attempts (job_id, n, started_at, finished_at, outcome, error, error_kind)
         VALUES (?1, 1, ?2, ?3, ?4, ?5, ?6)",
    )?
    .execute(params![
        job_id,
        started,
        crate::store::now_ms(),
        outcome,
        error,
        error.map(|_| "sql"),
    ])?;
    Ok(())
}

fn insert_forward_job(
    conn: &Connection,
    source: &Source,
    action: &Action,
    c: &Claim,
) -> Result<(), StoreError> {
    let paused: Option<i64> = conn
        .prepare_cached("SELECT 1 FROM paused_actions WHERE source = ?1 AND action = ?2")?
        .query_row(params![source.name, action.name], |r| r.get(0))
        .optional()?;
    let status = if paused.is_some() {
        "paused"
    } else {
        "pending"
    };
    insert_job(conn, source, action, c, status, None)?;
    Ok(())
}

/// Sets an event's state from its jobs: failed when one has failed,
/// completed when all are done, processing once any attempt has started,
/// accepted before that. Returns the new state.
pub fn refresh_event_state(
    conn: &Connection,
    source: &str,
    event_id: &str,
    now: i64,
) -> Result<String, StoreError> {
    let (failed, open, started): (i64, i64, i64) = conn
        .prepare_cached(
            "SELECT
                 coalesce(sum(status = 'failed'), 0),
                 coalesce(sum(status IN ('pending', 'processing', 'paused')), 0),
                 coalesce(sum(status = 'processing' OR n_attempts > 0), 0)
             FROM jobs WHERE source = ?1 AND event_id = ?2",
        )?
        .query_row(params![source, event_id], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })?;
    let state = if failed > 0 {
        "failed"
    } else if open == 0 {
        "completed"
    } else if started > 0 {
        "processing"
    } else {
        "accepted"
    };
    conn.prepare_cached(
        "UPDATE events SET state = ?3,
                completed_at = CASE WHEN ?3 = 'completed' THEN coalesce(completed_at, ?4) ELSE NULL END
         WHERE source = ?1 AND event_id = ?2 AND state <> ?3",
    )?
    .execute(params![source, event_id, state, now])?;
    Ok(state.to_string())
}

/// Checks at start that every SQL action prepares against the database (its
/// tables exist after `setup_sql`) and names only known parameters.
pub fn validate_sql_actions(conn: &Connection, sources: &[Source]) -> Result<(), String> {
    for source in sources {
        for action in &source.actions {
            let ActionKind::Sql { sql, params } = &action.kind else {
                continue;
            };
            let where_ = format!("sources.{}.actions ({})", source.name, action.name);
            let stmt = conn
                .prepare(sql)
                .map_err(|e| format!("{where_}.sql: {e}"))?;
            for i in 1..=stmt.parameter_count() {
                let Some(name) = stmt.parameter_name(i) else {
                    return Err(format!(
                        "{where_}.sql: parameter {i} has no name; use :name parameters"
                    ));
                };
                let bare = name.trim_start_matches([':', '@', '$']);
                let known = params.iter().any(|(n, _)| n == bare)
                    || crate::config::BUILTIN_PARAMS.contains(&bare);
                if !known {
                    return Err(format!(
                        "{where_}.sql: parameter {name} is neither in params nor built in ({})",
                        crate::config::BUILTIN_PARAMS
                            .map(|p| format!(":{p}"))
                            .join(", ")
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Runs an SQL action's statement again on a stored event, for an
/// operator's replay: in its own savepoint of the caller's transaction,
/// with the parameters bound exactly as the claim binds them (`c` rebuilt
/// from the stored body and headers). `Ok(Err(message))` when the statement
/// failed (only its own writes are rolled back); `Err` when storage failed.
/// The job and attempt rows are the caller's to write.
pub fn rerun_sql_action(
    conn: &Connection,
    source: &Source,
    action: &Action,
    c: &Claim,
) -> Result<Result<(), String>, StoreError> {
    let ActionKind::Sql { sql, params } = &action.kind else {
        return Ok(Err(format!("action {} is not an sql action", action.name)));
    };
    match in_savepoint(conn, "replay_action", |conn| {
        execute_action(conn, source, sql, params, c)
    }) {
        Ok(()) => Ok(Ok(())),
        Err(ActionError::Store(e)) if e.kind != crate::store::StoreErrorKind::Other => Err(e),
        Err(e) => Ok(Err(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::config::{Config, Durability};
    use crate::store::writer::Held;
    use crate::store::{self, Writer};

    const CONFIG: &str = r#"
[sources.pay]
kind = "stripe"
secrets = ["whsec_unit"]
[[sources.pay.actions]]
name = "credit"
sql = "INSERT INTO ledger (event_id, amount) VALUES (:event_id, :amount)"
params = { amount = "json:/amount" }
"#;

    fn claim_for(id: &str, amount: i64) -> Claim {
        let json = serde_json::json!({"id": id, "amount": amount});
        Claim {
            event_id: id.to_string(),
            event_type: None,
            body: json.to_string().into_bytes(),
            json: Some(json),
            content_type: None,
            headers: Vec::new(),
            kept_headers: "{}".to_string(),
            payload_hash: format!("hash-{id}"),
            verified_with: Some(0),
            signed_at: None,
            received_at: store::now_ms(),
            remote: "test".to_string(),
        }
    }

    /// An event's deliveries are found by DELIVERIES_OF_EVENT, all of them
    /// and only them, through indexes (the accepted one is not in the
    /// (source, event_id) index), also on a database migrated from one
    /// that had every delivery in the old index.
    #[test]
    fn an_events_deliveries_are_found_through_indexes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("unit.db");
        let mut conn = store::open(&path, Durability::Full, Duration::from_secs(5)).unwrap();
        // A database from before: every delivery in deliveries_event.
        store::migrate(&mut conn).unwrap();
        conn.execute_batch(
            "DROP INDEX deliveries_event_other;
             CREATE INDEX deliveries_event ON deliveries (source, event_id);",
        )
        .unwrap();
        store::migrate(&mut conn).unwrap();
        let indexes: Vec<String> = conn
            .prepare(
                "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'deliveries'
                 AND sql IS NOT NULL ORDER BY name",
            )
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(indexes, ["deliveries_event_other", "deliveries_received"]);

        let put = |source: &str, id: Option<&str>, at: i64, outcome: Delivery| {
            record_delivery(&conn, source, id, at, outcome, "test", None).unwrap();
        };
        put("pay", Some("e1"), 1_000, Delivery::Accepted);
        put("pay", Some("e2"), 1_000, Delivery::Accepted);
        put("other", Some("e1"), 1_000, Delivery::Accepted);
        put("pay", None, 1_000, Delivery::BadSignature);
        put("pay", Some("e1"), 2_000, Delivery::Duplicate);
        put("pay", Some("e1"), 3_000, Delivery::Mismatch);
        put("pay", Some("e2"), 3_000, Delivery::Duplicate);
        let sql =
            format!("SELECT id, outcome FROM deliveries WHERE {DELIVERIES_OF_EVENT} ORDER BY id");
        let found: Vec<(i64, String)> = conn
            .prepare(&sql)
            .unwrap()
            .query_map(params!["pay", "e1", 1_000], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let want = [(1, "accepted"), (5, "duplicate"), (6, "mismatch")];
        let want: Vec<(i64, String)> = want.iter().map(|(i, o)| (*i, o.to_string())).collect();
        assert_eq!(found, want);

        // No full scan of deliveries: both halves use an index.
        let plan = store::query_plan(&conn, &sql, params!["pay", "e1", 1_000]);
        assert!(
            plan.contains("USING INDEX deliveries_event_other"),
            "{plan}"
        );
        assert!(plan.contains("USING INDEX deliveries_received"), "{plan}");
        assert!(!plan.contains("SCAN deliveries"), "{plan}");
    }

    /// Issue 6: one claim in a group whose SQL action fails rolls back only
    /// itself; the others in the same group transaction commit.
    #[test]
    fn a_failing_action_in_a_group_rolls_back_only_its_own_claim() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("unit.db");
        let config = Arc::new(Config::parse(CONFIG, "unit", Path::new("."), None).unwrap());
        let mut conn = store::open(&path, Durability::Full, Duration::from_secs(5)).unwrap();
        store::migrate(&mut conn).unwrap();
        conn.execute_batch(
            "CREATE TABLE ledger (event_id TEXT, amount INTEGER CHECK (amount >= 0))",
        )
        .unwrap();
        let (writer, threads) =
            Writer::start(conn, path.clone(), Durability::Full, Duration::from_secs(5)).unwrap();

        // Hold the writer busy so the claims below queue up and commit as
        // one group.
        let held = Held::start(&writer);
        let (commits_before, _) = writer.group_stats();
        let handles: Vec<_> = [("e1", 10), ("e2", -5), ("e3", 30)]
            .into_iter()
            .map(|(id, amount)| {
                let (w, config) = (writer.clone(), config.clone());
                std::thread::spawn(move || {
                    w.call(move |conn| claim(conn, &config.sources[0], &claim_for(id, amount)))
                })
            })
            .collect();
        Held::wait_queued(&writer, 3);
        held.release();
        let outcomes: Vec<Outcome> = handles
            .into_iter()
            .map(|h| h.join().unwrap().unwrap())
            .collect();
        let (commits_after, _) = writer.group_stats();
        // The blocker's group, then one group for all three claims.
        assert_eq!(
            commits_after - commits_before,
            2,
            "the claims were not grouped"
        );
        assert!(
            outcomes
                .iter()
                .all(|o| matches!(o, Outcome::Accepted { .. })),
            "{outcomes:?}"
        );
        drop(writer);
        threads.stop();

        let db = store::open_read(&path, Duration::from_secs(5)).unwrap();
        let rows: Vec<(String, String, String)> = db
            .prepare(
                "SELECT e.event_id, e.state, j.status FROM events e
                 JOIN jobs j USING (source, event_id) ORDER BY e.event_id",
            )
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let want = [
            ("e1", "completed", "done"),
            ("e2", "failed", "failed"),
            ("e3", "completed", "done"),
        ];
        let want: Vec<(String, String, String)> = want
            .iter()
            .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()))
            .collect();
        assert_eq!(rows, want);
        let ledger: Vec<String> = db
            .prepare("SELECT event_id FROM ledger ORDER BY event_id")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(ledger, vec!["e1".to_string(), "e3".to_string()]);
    }
}
