//! What the web inspector reads beyond `events list` and `events show`:
//! each action with its job counts, deliveries per minute for the
//! overview chart, a cheap version of the event list (its ETag), incident
//! counts for list rows, and an event's kept headers and replays. The
//! admin API answers these (`GET /api/actions`, `GET /api/overview`, and
//! fields added to list and show). Nothing here writes.

use std::collections::BTreeMap;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::error::OpError;
use crate::config::Config;
use crate::state::JobStatus;
use crate::store::db::Db;
use crate::store::{attempts, deliveries, events, incidents, jobs, paused, replays};
use crate::time::ms_to_secs;

/// The job statuses an action's row counts (done jobs are the common
/// case and not counted: that would read every job).
const COUNTED: [JobStatus; 4] = [
    JobStatus::Pending,
    JobStatus::Processing,
    JobStatus::Failed,
    JobStatus::Paused,
];

/// Every configured action, in config order, with its open job counts
/// and whether it is paused:
/// `[{source, action, kind, paused, paused_at, counts: {pending, processing, failed, paused}}]`.
pub fn actions(db: &Db<'_>, config: &Config) -> Result<Value, OpError> {
    let mut counts = std::collections::HashMap::<(String, String, JobStatus), i64>::new();
    for (source, action, status, n) in jobs::counts_by_action(db, &COUNTED)? {
        counts.insert((source, action, status), n);
    }
    let mut paused_at = std::collections::HashMap::<(String, String), i64>::new();
    for p in paused::all(db)? {
        paused_at.insert((p.source, p.action), p.paused_at);
    }
    let mut circuit_rows = std::collections::HashMap::new();
    for c in crate::store::circuits::all(db)? {
        circuit_rows.insert((c.source.clone(), c.action.clone()), c);
    }
    let mut out = Vec::new();
    for source in &config.sources {
        for action in &source.actions {
            let mut c = serde_json::Map::new();
            for status in COUNTED {
                let key = (source.name.clone(), action.name.clone(), status);
                c.insert(
                    status.to_string(),
                    json!(counts.get(&key).copied().unwrap_or(0)),
                );
            }
            let paused_at = paused_at.get(&(source.name.clone(), action.name.clone()));
            out.push(json!({
                "source": source.name,
                "action": action.name,
                "kind": action.kind_name(),
                "paused": paused_at.is_some(),
                "paused_at": paused_at.map(|ms| ms_to_secs(*ms)),
                "counts": c,
                "circuit": circuit_json(
                    action,
                    circuit_rows.get(&(source.name.clone(), action.name.clone())),
                ),
            }));
        }
    }
    Ok(Value::Array(out))
}

/// A forward action's circuit: `{state: "closed" | "open", failures,
/// opened_at, next_probe_at}`; null for an action without one.
fn circuit_json(
    action: &crate::config::Action,
    row: Option<&crate::store::circuits::CircuitRow>,
) -> Value {
    let has_circuit = match &action.kind {
        crate::config::ActionKind::Forward(f) => f.circuit.is_some(),
        crate::config::ActionKind::Sql { .. } => false,
    };
    if !has_circuit {
        return Value::Null;
    }
    let opened_at = row.and_then(|r| r.opened_at);
    json!({
        "state": if opened_at.is_some() { "open" } else { "closed" },
        "failures": row.map_or(0, |r| r.failures),
        "opened_at": opened_at.map(ms_to_secs),
        "next_probe_at": row.and_then(|r| r.next_probe_at).map(ms_to_secs),
    })
}

/// Per-minute delivery counts of minutes that are over, kept between
/// overview requests: only the last minutes are read again, so an open
/// overview does not re-read an hour of deliveries every refresh.
#[derive(Default)]
pub struct OverviewCache {
    /// Minute start (ms) -> outcome -> count.
    minutes: std::sync::Mutex<BTreeMap<i64, BTreeMap<String, i64>>>,
}

/// A minute is taken as settled (no more deliveries will be recorded in
/// it) this long after it ended: refusals are recorded a moment after
/// they arrive.
const SETTLE_MS: i64 = 60_000;
const BUCKET_MS: i64 = 60_000;

/// Deliveries by outcome per minute over the `minutes` before `now`
/// (ms), oldest first, and the jobs per status:
/// `{from, to, bucket_secs, outcomes: [...], buckets: [{at, counts: {outcome: n}}], totals: {...}, jobs: {...}}`.
pub fn overview(
    db: &Db<'_>,
    cache: &OverviewCache,
    now: i64,
    minutes: i64,
) -> Result<Value, OpError> {
    let end = (now.div_euclid(BUCKET_MS) + 1) * BUCKET_MS;
    let from = end - minutes * BUCKET_MS;
    let settled_before = now - SETTLE_MS;
    let mut known = match cache.minutes.lock() {
        Ok(m) => m.clone(),
        Err(_) => BTreeMap::new(),
    };
    known.retain(|at, _| *at >= from);
    // The cache holds a run of settled minutes from `from` on; read from
    // the first minute it does not hold.
    let mut read_from = from;
    while read_from < end
        && read_from + BUCKET_MS <= settled_before
        && known.contains_key(&read_from)
    {
        read_from += BUCKET_MS;
    }
    let mut fresh: BTreeMap<i64, BTreeMap<String, i64>> = BTreeMap::new();
    for (i, outcome, n) in deliveries::per_bucket(db, read_from, BUCKET_MS, end)? {
        fresh
            .entry(read_from + i * BUCKET_MS)
            .or_default()
            .insert(outcome.as_str().to_string(), n);
    }
    let mut at = read_from;
    while at < end {
        let counts = fresh.remove(&at).unwrap_or_default();
        known.insert(at, counts);
        at += BUCKET_MS;
    }
    if let Ok(mut m) = cache.minutes.lock() {
        *m = known
            .iter()
            .filter(|(at, _)| **at + BUCKET_MS <= settled_before)
            .map(|(at, c)| (*at, c.clone()))
            .collect();
    }
    let mut totals = BTreeMap::<String, i64>::new();
    for counts in known.values() {
        for (outcome, n) in counts {
            *totals.entry(outcome.clone()).or_default() += n;
        }
    }
    let mut jobs_by_status = serde_json::Map::new();
    for (status, n) in jobs::counts(db)? {
        jobs_by_status.insert(status.as_str().to_string(), json!(n));
    }
    Ok(json!({
        "from": ms_to_secs(from),
        "to": ms_to_secs(end),
        "bucket_secs": BUCKET_MS / 1000,
        "outcomes": crate::state::Delivery::ALL.map(crate::state::Delivery::as_str),
        "buckets": known.iter().map(|(at, counts)| json!({
            "at": ms_to_secs(*at),
            "counts": counts,
        })).collect::<Vec<_>>(),
        "totals": totals,
        "jobs": jobs_by_status,
    }))
}

/// A tag that changes whenever anything an event list shows may have
/// changed (a delivery, an attempt, a replay, an incident, a job moving),
/// read in a few index look-ups so a poll that finds nothing new costs
/// almost nothing (`store::events::list_marks`, and the job counts).
pub fn list_version(db: &Db<'_>, query: &str) -> Result<String, OpError> {
    let [deliveries, attempts, replays, incidents, paused] = events::list_marks(db)?;
    let mut h = Sha256::new();
    h.update(format!(
        "{deliveries}/{attempts}/{replays}/{incidents}/{paused}/{query}"
    ));
    for (status, n) in jobs::counts(db)? {
        h.update(format!("/{status}={n}"));
    }
    Ok(format!("W/\"{}\"", hex::encode(&h.finalize()[..12])))
}

/// Adds `incidents` (how many) to each event of a list.
pub fn count_incidents(db: &Db<'_>, list: &mut Value) -> Result<(), OpError> {
    for event in list.as_array_mut().into_iter().flatten() {
        let (Some(source), Some(id)) = (event["source"].as_str(), event["event_id"].as_str())
        else {
            continue;
        };
        event["incidents"] = json!(incidents::count_of_event(db, source, id)?);
    }
    Ok(())
}

/// Adds to one event's JSON what the inspector shows beside it: the kept
/// `headers` (an object, or null once erased; unless already there),
/// `content_type`, `erased_at` and `replays`
/// (`[{action, replayed_at, from_status, forced, origin, after_attempt}]`,
/// `after_attempt` the number of the job's last attempt before it, 0 for
/// none: times are whole seconds, so this keeps the order exact).
pub fn add_event_details(db: &Db<'_>, event: &mut Value) -> Result<(), OpError> {
    let (Some(source), Some(event_id)) = (
        event["source"].as_str().map(str::to_string),
        event["event_id"].as_str().map(str::to_string),
    ) else {
        return Ok(());
    };
    let Some(events::Kept {
        content_type,
        headers,
        erased_at,
        received_at,
    }) = events::kept(db, &source, &event_id)?
    else {
        return Err(super::error::not_found(&source, &event_id));
    };
    add_milliseconds(db, event, &source, &event_id, received_at)?;
    if event.get("headers").is_none() {
        event["headers"] = headers
            .and_then(|h| serde_json::from_str::<Value>(&h).ok())
            .unwrap_or(Value::Null);
    }
    event["content_type"] = json!(content_type);
    event["erased_at"] = json!(erased_at.map(ms_to_secs));
    event["replays"] = replays::of_event(db, &source, &event_id)?
        .into_iter()
        .map(|r| {
            json!({
                "action": r.action,
                "replayed_at": ms_to_secs(r.replayed_at),
                "replayed_at_ms": r.replayed_at,
                "from_status": r.from_status,
                "forced": r.forced,
                "origin": r.origin,
                "after_attempt": r.after_attempt,
            })
        })
        .collect();
    Ok(())
}

/// The times of an event's deliveries, attempts and incidents in
/// milliseconds (`received_at_ms`, `started_at_ms`, `created_at_ms`), so
/// a timeline of things within one second keeps their real order. Matched
/// to the objects `inspect::show` built by their order there.
fn add_milliseconds(
    db: &Db<'_>,
    event: &mut Value,
    source: &str,
    event_id: &str,
    received_at: i64,
) -> Result<(), OpError> {
    let delivered = deliveries::times_of_event(db, source, event_id, received_at)?;
    if let Some(list) = event["deliveries"].as_array_mut() {
        for (d, ms) in list.iter_mut().zip(delivered) {
            d["received_at_ms"] = json!(ms);
        }
    }
    let created = incidents::times_of_event(db, source, event_id)?;
    if let Some(list) = event["incidents"].as_array_mut() {
        for (i, ms) in list.iter_mut().zip(created) {
            i["created_at_ms"] = json!(ms);
        }
    }
    let mut attempts = std::collections::HashMap::<(String, i64), i64>::new();
    for (action, n, started_at) in attempts::starts_of_event(db, source, event_id)? {
        attempts.insert((action, n), started_at);
    }
    for job in event["jobs"].as_array_mut().into_iter().flatten() {
        let action = job["action"].as_str().unwrap_or_default().to_string();
        for a in job["attempts"].as_array_mut().into_iter().flatten() {
            if let Some(ms) = a["n"]
                .as_i64()
                .and_then(|n| attempts.get(&(action.clone(), n)))
            {
                a["started_at_ms"] = json!(ms);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::{Connection, params};

    fn db() -> Connection {
        let mut conn = Connection::open_in_memory().unwrap();
        crate::store::sqlite::migrate(&mut conn).unwrap();
        conn
    }

    fn delivery(conn: &Connection, at: i64, outcome: &str) {
        conn.execute(
            "INSERT INTO deliveries (source, received_at, outcome) VALUES ('s', ?1, ?2)",
            params![at, outcome],
        )
        .unwrap();
    }

    fn counts(v: &Value, minute: usize) -> Value {
        v["buckets"][minute]["counts"].clone()
    }

    /// Minutes that are over are read once; the current ones every time.
    #[test]
    fn the_overview_reads_settled_minutes_once() {
        let conn = db();
        let cache = OverviewCache::default();
        let now = 10 * 3_600_000 + 30_000; // half a minute into a minute
        let from = (now / BUCKET_MS + 1) * BUCKET_MS - 60 * BUCKET_MS;
        delivery(&conn, from + 5, "accepted");
        delivery(&conn, from + 6, "duplicate");
        delivery(&conn, now - 1_000, "accepted");
        let first = overview(&Db::sqlite(&conn), &cache, now, 60).unwrap();
        assert_eq!(first["buckets"].as_array().map(Vec::len), Some(60));
        assert_eq!(counts(&first, 0), json!({"accepted": 1, "duplicate": 1}));
        assert_eq!(counts(&first, 59), json!({"accepted": 1}));
        assert_eq!(first["totals"], json!({"accepted": 2, "duplicate": 1}));
        // A row that appears in a settled minute is not read again (the
        // cache has that minute); one in the current minute is.
        delivery(&conn, from + 7, "accepted");
        delivery(&conn, now, "mismatch");
        let second = overview(&Db::sqlite(&conn), &cache, now, 60).unwrap();
        assert_eq!(counts(&second, 0), json!({"accepted": 1, "duplicate": 1}));
        assert_eq!(counts(&second, 59), json!({"accepted": 1, "mismatch": 1}));
        // A fresh cache reads everything.
        let cold = overview(&Db::sqlite(&conn), &OverviewCache::default(), now, 60).unwrap();
        assert_eq!(counts(&cold, 0), json!({"accepted": 2, "duplicate": 1}));
        // An hour later the old minutes have left the window and the cache.
        let later = overview(&Db::sqlite(&conn), &cache, now + 3_600_000, 60).unwrap();
        assert_eq!(later["totals"], json!({}));
        assert!(
            cache
                .minutes
                .lock()
                .unwrap()
                .keys()
                .all(|at| *at >= from + 3_600_000)
        );
    }
}
