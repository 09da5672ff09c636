//! The claim: the one transaction step that turns a verified delivery into
//! a stored event, exactly once.
//!
//! Inserting into `events` unless the key is stored decides who owns the
//! event; there is never a read before the insert. The owner, in the same
//! transaction, runs each matching SQL action in its own savepoint together
//! with its job row (a failing action rolls back only itself and leaves a
//! failed job), and writes a pending job row for each forward action (the
//! outbox). A loser reads the stored state and hash to answer "duplicate"
//! or records a mismatch incident. Every delivery gets a row.
//!
//! These are the decisions; the SQL of each step is the backend's, behind
//! `store::Tx`. [`claim_in`] is generic over it; [`DeliveryClaims`] is how
//! a delivery's claims reach the storage, which runs them inside its group
//! transaction. It does no IO besides
//! SQL and never commits.

use serde_json::Value;

use std::sync::Arc;

use crate::config::{Action, ActionKind, Config, Source};
use crate::receive::key::{Input, Part};
use crate::state::{AttemptOutcome, Delivery, EventState, JobKind, JobStatus};
use crate::store::backend::Claims;
use crate::store::tx::{ActionError, JobTallies, NewEvent, NewJob, ParamValue, Tx};
use crate::store::{StoreError, StoreErrorKind};

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
    /// For an event of a batch delivery: which delivery, and which of its
    /// events (kept as the delivery row's detail).
    pub batch: Option<String>,
    /// A kept refused request taken in by `reingest`: its delivery row's
    /// outcome is `reingested`.
    pub reingest: bool,
    /// An event listed by the provider's API and claimed by `catchup`:
    /// its delivery row's outcome is `catchup`.
    pub catchup: bool,
}

/// What the claim decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
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

impl Decision {
    pub fn delivery(&self) -> Delivery {
        match self {
            Decision::Accepted { .. } => Delivery::Accepted,
            Decision::Duplicate { .. } => Delivery::Duplicate,
            Decision::Mismatch { .. } => Delivery::Mismatch,
        }
    }
}

/// One delivery's claims (one event, or each event of a batch) for the
/// source at `source_index`, as the storage runs them
/// (`store::backend::Claims`): in one transaction, in order.
pub struct DeliveryClaims {
    config: Arc<Config>,
    source_index: usize,
    claims: Vec<Claim>,
}

impl DeliveryClaims {
    pub fn new(config: Arc<Config>, source_index: usize, claims: Vec<Claim>) -> DeliveryClaims {
        DeliveryClaims {
            config,
            source_index,
            claims,
        }
    }

    fn the_source(&self) -> Option<&Source> {
        self.config.sources.get(self.source_index)
    }
}

impl Claims for DeliveryClaims {
    type Outcome = Decision;

    fn source(&self) -> &str {
        self.the_source().map_or("", |s| s.name.as_str())
    }

    fn len(&self) -> usize {
        self.claims.len()
    }

    fn event_id(&self, i: usize) -> &str {
        self.claims.get(i).map_or("", |c| c.event_id.as_str())
    }

    fn savepoints(&self) -> usize {
        let Some(source) = self.the_source() else {
            return 0;
        };
        self.claims
            .iter()
            .map(|claim| {
                source
                    .actions
                    .iter()
                    .filter(|a| {
                        matches!(a.kind, ActionKind::Sql { .. })
                            && a.takes(claim.event_type.as_deref())
                    })
                    .count()
            })
            .sum()
    }

    fn claim<T: Tx>(&self, i: usize, tx: &mut T) -> Result<Decision, StoreError> {
        let source = self
            .the_source()
            .ok_or_else(|| StoreError::other("source index out of range"))?;
        let claim = self
            .claims
            .get(i)
            .ok_or_else(|| StoreError::other("claim index out of range"))?;
        let decision = claim_in(tx, source, claim)?;
        if let Decision::Accepted { sql_runs, .. } = &decision {
            for (index, _) in sql_runs.iter().filter(|(_, ok)| !ok) {
                let action = source.actions.get(*index).map_or("", |a| a.name.as_str());
                let (event_id, now) = (&claim.event_id, claim.received_at);
                crate::notify::sql_failed(tx, &self.config, &source.name, action, event_id, now)?;
            }
        }
        if matches!(decision, Decision::Mismatch { .. }) {
            crate::notify::mismatch(
                tx,
                &self.config,
                &source.name,
                &claim.event_id,
                claim.received_at,
            )?;
        }
        Ok(decision)
    }
}

/// Claims the event for `source` in the open transaction `tx`.
pub fn claim_in<T: Tx>(tx: &mut T, source: &Source, c: &Claim) -> Result<Decision, StoreError> {
    let matching: Vec<(usize, &Action)> = source
        .actions
        .iter()
        .enumerate()
        .filter(|(_, a)| a.takes(c.event_type.as_deref()))
        .collect();
    let initial_state = if matching.is_empty() {
        EventState::Completed
    } else {
        EventState::Accepted
    };
    let inserted = tx.insert_event(&NewEvent {
        source: &source.name,
        event_id: &c.event_id,
        event_type: c.event_type.as_deref(),
        state: initial_state.as_str(),
        received_at: c.received_at,
        completed_at: matching.is_empty().then_some(c.received_at),
        payload: &c.body,
        content_type: c.content_type.as_deref(),
        headers: &c.kept_headers,
        payload_hash: &c.payload_hash,
        verified_with: c.verified_with.map(|i| i as i64),
        signed_at: c.signed_at,
    })?;

    let outcome = if inserted {
        run_actions(tx, source, c, &matching, initial_state)?
    } else {
        lost_claim(tx, source, c)?
    };
    tx.insert_delivery(
        &source.name,
        Some(&c.event_id),
        c.received_at,
        if c.reingest {
            Delivery::Reingested.as_str()
        } else if c.catchup {
            Delivery::Catchup.as_str()
        } else {
            outcome.delivery().as_str()
        },
        &c.remote,
        c.batch.as_deref(),
    )?;
    Ok(outcome)
}

/// The owner's part of a claim: each matching action's job, in the order
/// of the config (an SQL action run in its own savepoint; a forward
/// action's job written pending), then the event's state.
fn run_actions<T: Tx>(
    tx: &mut T,
    source: &Source,
    c: &Claim,
    matching: &[(usize, &Action)],
    initial_state: EventState,
) -> Result<Decision, StoreError> {
    let (mut forward_jobs, mut sql_runs) = (0, Vec::new());
    for &(index, action) in matching {
        match &action.kind {
            ActionKind::Sql { sql, params } => {
                let ok = run_sql_job(tx, source, action, sql, params, c)?;
                sql_runs.push((index, ok));
            }
            ActionKind::Forward(_) => {
                insert_forward_job(tx, source, action, c)?;
                forward_jobs += 1;
            }
        }
    }
    // Only SQL actions can have finished (or failed) already; with
    // forward jobs alone the event is as inserted, 'accepted' (or
    // 'completed' with no action at all), and a recount would only
    // confirm it.
    let state = if forward_jobs == matching.len() {
        initial_state
    } else {
        refresh_event_state_in(tx, &source.name, &c.event_id, c.received_at)?
    };
    Ok(Decision::Accepted {
        state: state.to_string(),
        forward_jobs,
        sql_runs,
    })
}

/// The loser's part: the stored event's state, and a mismatch incident
/// when the payload hash differs from the stored one.
fn lost_claim<T: Tx>(tx: &mut T, source: &Source, c: &Claim) -> Result<Decision, StoreError> {
    let (state, stored_hash) = tx.event_state_and_hash(&source.name, &c.event_id)?;
    if stored_hash == c.payload_hash || c.catchup || same_as_listed(source, &stored_hash, c) {
        return Ok(Decision::Duplicate { state });
    }
    tx.insert_mismatch(
        &source.name,
        &c.event_id,
        c.received_at,
        &c.payload_hash,
        &format!(
            "duplicate delivery with a different payload hash (stored {}, received {}) from {}",
            short(&stored_hash),
            short(&c.payload_hash),
            c.remote
        ),
        &c.body,
    )?;
    Ok(Decision::Mismatch { state })
}

/// The payload hash: of the `hash` parts, or of the body less the members
/// the kind's provider rewrites on every attempt, or of the whole body:
/// what a delivery's claim stores (and catch-up's, when the kind lists no
/// hash of its own).
pub fn hash_of(source: &Source, body: &[u8], input: &Input<'_>) -> String {
    if source.hash.is_empty() && !source.hash_without.is_empty() {
        super::key::payload_hash_without(&source.hash_without, body, input)
    } else {
        super::key::payload_hash(&source.hash, body, input)
    }
}

/// The hash an event listed by the provider's API is stored under, when
/// the kind has one (`listed:` and the hex SHA-256 of its `listed_hash`
/// parts): a later delivery of it, hashed by the source's own rule,
/// compares against it on the losing path ([`same_as_listed`]).
pub fn listed_hash(source: &Source, input: &Input<'_>) -> Option<String> {
    (!source.listed_hash.is_empty()).then(|| {
        format!(
            "{LISTED}{}",
            super::key::payload_hash(&source.listed_hash, input.body, input)
        )
    })
}

/// The prefix of a hash stored by [`listed_hash`].
pub const LISTED: &str = "listed:";

/// True when the event was claimed from the provider's API list (its
/// hash `listed:`, over parts the list and a delivery share) and this
/// delivery has the same parts. Only a losing claim whose hash differs
/// computes it. (A catch-up claim that loses is a duplicate outright: the
/// provider's own copy of an event already stored.)
fn same_as_listed(source: &Source, stored_hash: &str, c: &Claim) -> bool {
    if !stored_hash.starts_with(LISTED) {
        return false;
    }
    let parsed;
    let json = match &c.json {
        Some(v) => Some(super::key::Json::Parsed(v)),
        None => {
            parsed = serde_json::from_slice::<Value>(&c.body).ok();
            parsed.as_ref().map(super::key::Json::Parsed)
        }
    };
    let input = Input {
        headers: &c.headers,
        json,
        form: None,
        body: &c.body,
    };
    listed_hash(source, &input).as_deref() == Some(stored_hash)
}

fn short(hash: &str) -> &str {
    hash.get(..12).unwrap_or(hash)
}

/// Runs one SQL action in a savepoint, then writes its job row. A failing
/// statement rolls back only itself; the job is then written as failed,
/// with the error. The savepoint holds the action's statement alone: on
/// PostgreSQL it runs there in the team's search_path, idemhook's rows
/// in idemhook's.
fn run_sql_job<T: Tx>(
    tx: &mut T,
    source: &Source,
    action: &Action,
    sql: &str,
    sql_params: &[(String, Part)],
    c: &Claim,
) -> Result<bool, StoreError> {
    let started = crate::time::now_ms();
    let result = tx.in_savepoint("action", |tx| -> Result<(), ActionError> {
        execute_action(tx, source, sql, sql_params, c)
    });
    match result {
        Ok(()) => {
            let job_id = insert_job(tx, source, action, c, JobStatus::Done, None)?;
            tx.insert_sql_attempt(
                job_id,
                started,
                crate::time::now_ms(),
                AttemptOutcome::Ok.as_str(),
                None,
            )?;
            Ok(true)
        }
        Err(ActionError::Store(e)) if e.kind != StoreErrorKind::Other => Err(e),
        Err(e) => {
            let message = e.to_string();
            let job_id = insert_job(tx, source, action, c, JobStatus::Failed, Some(&message))?;
            tx.insert_sql_attempt(
                job_id,
                started,
                crate::time::now_ms(),
                AttemptOutcome::Failed.as_str(),
                Some(&message),
            )?;
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

fn execute_action<T: Tx>(
    tx: &mut T,
    source: &Source,
    sql: &str,
    sql_params: &[(String, Part)],
    c: &Claim,
) -> Result<(), ActionError> {
    let form: Vec<(String, String)> = if sql_params.iter().any(|(_, p)| p.reads_form()) {
        form_urlencoded::parse(&c.body).into_owned().collect()
    } else {
        Vec::new()
    };
    let input = Input {
        headers: &c.headers,
        json: c.json.as_ref().map(crate::receive::key::Json::Parsed),
        form: Some(&form),
        body: &c.body,
    };
    tx.execute_action(sql, |name| bind_value(name, sql_params, source, &input, c))
}

/// The value of a named parameter: the action's `params` first, then the
/// built-ins.
fn bind_value(
    name: &str,
    sql_params: &[(String, Part)],
    source: &Source,
    input: &Input<'_>,
    c: &Claim,
) -> Option<ParamValue> {
    if let Some((_, part)) = sql_params.iter().find(|(n, _)| n == name) {
        return Some(match part.lookup(input) {
            Some(crate::receive::key::Found::Json(v)) => json_to_param(&v),
            Some(crate::receive::key::Found::Header(h)) => ParamValue::Text(h.to_string()),
            Some(crate::receive::key::Found::Text(t)) => ParamValue::Text(t),
            None => ParamValue::Null,
        });
    }
    Some(match name {
        "source" => ParamValue::Text(source.name.clone()),
        "event_id" => ParamValue::Text(c.event_id.clone()),
        "type" => c
            .event_type
            .clone()
            .map_or(ParamValue::Null, ParamValue::Text),
        "payload" => ParamValue::Document(String::from_utf8_lossy(&c.body).into_owned()),
        "received_at" => ParamValue::Integer(crate::time::ms_to_secs(c.received_at)),
        _ => return None,
    })
}

/// A JSON value as a parameter: numbers as integers when they fit i64,
/// else as written; objects and arrays as JSON text (compact, keys
/// sorted: `key::canonical_json`). Each backend binds
/// these as its own types (`store::sqlite::to_sql_value`,
/// `store::postgres::tx::PgParam`).
pub fn json_to_param(v: &Value) -> ParamValue {
    match v {
        Value::Null => ParamValue::Null,
        Value::Bool(b) => ParamValue::Bool(*b),
        Value::Number(n) => match n.as_i64() {
            Some(i) => ParamValue::Integer(i),
            None => ParamValue::Number(n.to_string()),
        },
        Value::String(s) => ParamValue::Text(s.clone()),
        other => ParamValue::Json(crate::receive::key::canonical_json(other)),
    }
}

fn insert_job<T: Tx>(
    tx: &mut T,
    source: &Source,
    action: &Action,
    c: &Claim,
    status: JobStatus,
    error: Option<&str>,
) -> Result<i64, StoreError> {
    let order_key = order_key_of(action, c);
    tx.insert_job(&NewJob {
        source: &source.name,
        event_id: &c.event_id,
        action: &action.name,
        kind: action.job_kind(),
        status,
        n_attempts: i64::from(action.job_kind() == JobKind::Sql),
        next_attempt_at: (status == JobStatus::Pending).then_some(c.received_at),
        last_error: error,
        created_at: c.received_at,
        order_key: order_key.as_deref(),
    })
}

/// The order key of a forward action with `order`, read from the event as
/// the event's own key is (several parts: a derived key); None when the
/// action has none or the event lacks it (such a job is not ordered).
fn order_key_of(action: &Action, c: &Claim) -> Option<String> {
    let ActionKind::Forward(f) = &action.kind else {
        return None;
    };
    let rule = f.control.order.as_ref()?;
    let doc;
    let json = match &c.json {
        Some(v) => Some(super::key::Json::Parsed(v)),
        None => {
            doc = std::str::from_utf8(&c.body)
                .ok()
                .and_then(|t| crate::receive::key::RawDoc::parse(t).ok());
            doc.as_ref().map(crate::receive::key::Json::Raw)
        }
    };
    let input = Input {
        headers: &c.headers,
        json,
        form: None,
        body: &c.body,
    };
    rule.extract(&input).ok()
}

fn insert_forward_job<T: Tx>(
    tx: &mut T,
    source: &Source,
    action: &Action,
    c: &Claim,
) -> Result<(), StoreError> {
    let status = if tx.is_paused(&source.name, &action.name)? {
        JobStatus::Paused
    } else {
        JobStatus::Pending
    };
    insert_job(tx, source, action, c, status, None)?;
    Ok(())
}

/// Sets an event's state from its jobs: failed when one has failed,
/// completed when all are done, processing once any attempt has started,
/// accepted before that. Returns the new state.
pub fn refresh_event_state_in<T: Tx>(
    tx: &mut T,
    source: &str,
    event_id: &str,
    now: i64,
) -> Result<EventState, StoreError> {
    let state = event_state(tx.job_tallies(source, event_id)?);
    tx.set_event_state(source, event_id, state.as_str(), now)?;
    Ok(state)
}

/// An event's state from its jobs' tallies.
pub fn event_state(t: JobTallies) -> EventState {
    if t.failed > 0 {
        EventState::Failed
    } else if t.open == 0 {
        EventState::Completed
    } else if t.started > 0 {
        EventState::Processing
    } else {
        EventState::Accepted
    }
}

/// Runs an SQL action's statement again on a stored event, for an
/// operator's replay: in its own savepoint of the caller's transaction,
/// with the parameters bound exactly as the claim binds them (`c` rebuilt
/// from the stored body and headers). `Ok(Err(message))` when the statement
/// failed (only its own writes are rolled back); `Err` when storage failed.
/// The job and attempt rows are the caller's to write.
pub fn rerun_sql_action_in<T: Tx>(
    tx: &mut T,
    source: &Source,
    action: &Action,
    c: &Claim,
) -> Result<Result<(), String>, StoreError> {
    let ActionKind::Sql { sql, params } = &action.kind else {
        return Ok(Err(format!("action {} is not an sql action", action.name)));
    };
    match tx.in_savepoint("replay_action", |tx| {
        execute_action(tx, source, sql, params, c)
    }) {
        Ok(()) => Ok(Ok(())),
        Err(ActionError::Store(e)) if e.kind != StoreErrorKind::Other => Err(e),
        Err(e) => Ok(Err(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use crate::store::sqlite::SqliteTx;
    use std::path::Path;
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::config::{Config, Durability};
    use crate::store;
    use crate::store::deliveries::OF_EVENT;
    use crate::store::sqlite::writer::Held;
    use crate::store::sqlite::writer::Writer;
    use rusqlite::params;

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
            received_at: crate::time::now_ms(),
            remote: "test".to_string(),
            batch: None,
            reingest: false,
            catchup: false,
        }
    }

    /// An event's deliveries are found by `store::deliveries::OF_EVENT`, all of them
    /// and only them, through indexes (the accepted one is not in the
    /// (source, event_id) index), also on a database migrated from one
    /// that had every delivery in the old index.
    #[test]
    fn an_events_deliveries_are_found_through_indexes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("unit.db");
        let mut conn =
            store::sqlite::open(&path, Durability::Full, Duration::from_secs(5)).unwrap();
        // A database from before: every delivery in deliveries_event.
        store::sqlite::migrate(&mut conn).unwrap();
        conn.execute_batch(
            "DROP INDEX deliveries_event_other;
             CREATE INDEX deliveries_event ON deliveries (source, event_id);",
        )
        .unwrap();
        store::sqlite::migrate(&mut conn).unwrap();
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
            SqliteTx::new(&conn)
                .insert_delivery(source, id, at, outcome.as_str(), "test", None)
                .unwrap();
        };
        put("pay", Some("e1"), 1_000, Delivery::Accepted);
        put("pay", Some("e2"), 1_000, Delivery::Accepted);
        put("other", Some("e1"), 1_000, Delivery::Accepted);
        put("pay", None, 1_000, Delivery::BadSignature);
        put("pay", Some("e1"), 2_000, Delivery::Duplicate);
        put("pay", Some("e1"), 3_000, Delivery::Mismatch);
        put("pay", Some("e2"), 3_000, Delivery::Duplicate);
        let sql = format!("SELECT id, outcome FROM deliveries WHERE {OF_EVENT} ORDER BY id");
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
        let plan = store::sqlite::query_plan(&conn, &sql, params!["pay", "e1", 1_000]);
        assert!(
            plan.contains("USING INDEX deliveries_event_other"),
            "{plan}"
        );
        assert!(plan.contains("USING INDEX deliveries_received"), "{plan}");
        assert!(!plan.contains("SCAN deliveries"), "{plan}");
    }

    /// Group commit: one claim in a group whose SQL action fails rolls back
    /// only itself; the others in the same group transaction commit.
    #[test]
    fn a_failing_action_in_a_group_rolls_back_only_its_own_claim() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("unit.db");
        let config = Arc::new(Config::parse(CONFIG, "unit", Path::new("."), None).unwrap());
        let mut conn =
            store::sqlite::open(&path, Durability::Full, Duration::from_secs(5)).unwrap();
        store::sqlite::migrate(&mut conn).unwrap();
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
                    w.call(move |conn| {
                        claim_in(
                            &mut SqliteTx::new(conn),
                            &config.sources[0],
                            &claim_for(id, amount),
                        )
                    })
                })
            })
            .collect();
        Held::wait_queued(&writer, 3);
        held.release();
        let outcomes: Vec<Decision> = handles
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
                .all(|o| matches!(o, Decision::Accepted { .. })),
            "{outcomes:?}"
        );
        drop(writer);
        threads.stop();

        let db = store::sqlite::open_read(&path, Duration::from_secs(5)).unwrap();
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
