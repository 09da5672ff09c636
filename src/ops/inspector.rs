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
use crate::args;
use crate::config::Config;
use crate::ingest::DELIVERIES_OF_EVENT;
use crate::state::JobStatus;
use crate::store::db::{Db, Dialect};
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
    let mut counts = std::collections::HashMap::<(String, String, String), i64>::new();
    for r in db.query(
        "SELECT source, action, status, count(*) FROM jobs
         WHERE status IN ('pending', 'processing', 'failed', 'paused')
         GROUP BY source, action, status",
        &[],
    )? {
        counts.insert((r.string(0)?, r.string(1)?, r.string(2)?), r.i64(3)?);
    }
    let mut paused = std::collections::HashMap::<(String, String), i64>::new();
    for r in db.query("SELECT source, action, paused_at FROM paused_actions", &[])? {
        paused.insert((r.string(0)?, r.string(1)?), r.i64(2)?);
    }
    let mut out = Vec::new();
    for source in &config.sources {
        for action in &source.actions {
            let mut c = serde_json::Map::new();
            for status in COUNTED.map(JobStatus::as_str) {
                let key = (source.name.clone(), action.name.clone(), status.to_string());
                c.insert(
                    status.to_string(),
                    json!(counts.get(&key).copied().unwrap_or(0)),
                );
            }
            let paused_at = paused.get(&(source.name.clone(), action.name.clone()));
            out.push(json!({
                "source": source.name,
                "action": action.name,
                "kind": action.kind_name(),
                "paused": paused_at.is_some(),
                "paused_at": paused_at.map(|ms| ms_to_secs(*ms)),
                "counts": c,
            }));
        }
    }
    Ok(Value::Array(out))
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
    for r in db.query(
        "SELECT (received_at - ?1) / ?2, outcome, count(*) FROM deliveries
         WHERE received_at >= ?1 AND received_at < ?3 GROUP BY 1, 2",
        args![read_from, BUCKET_MS, end],
    )? {
        let (i, outcome, n) = (r.i64(0)?, r.string(1)?, r.i64(2)?);
        fresh
            .entry(read_from + i * BUCKET_MS)
            .or_default()
            .insert(outcome, n);
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
    let mut jobs = serde_json::Map::new();
    for r in db.query(job_counts(db.dialect()), &[])? {
        jobs.insert(r.string(0)?, json!(r.i64(1)?));
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
        "jobs": jobs,
    }))
}

/// Jobs per status: SQLite keeps them in `job_counts`
/// (triggers; a status once seen keeps its row, at 0 when it has no jobs
/// now); PostgreSQL counts the statuses that have jobs (no counter rows,
/// which every instance's every job would contend on).
fn job_counts(dialect: Dialect) -> &'static str {
    match dialect {
        Dialect::Sqlite => "SELECT status, n FROM job_counts ORDER BY status",
        Dialect::Postgres => "SELECT status, count(*) FROM jobs GROUP BY status ORDER BY status",
    }
}

/// A tag that changes whenever anything an event list shows may have
/// changed (a delivery, an attempt, a replay, an incident, a job moving),
/// read in a few index look-ups so a poll that finds nothing new costs
/// almost nothing. On PostgreSQL (attempts have no rowid) a job's latest
/// change stands for its attempts: recording one updates the job, and
/// the job counts are a count of the jobs table.
pub fn list_version(db: &Db<'_>, query: &str) -> Result<String, OpError> {
    let attempts = match db.dialect() {
        Dialect::Sqlite => "(SELECT coalesce(max(rowid), 0) FROM attempts)",
        Dialect::Postgres => "(SELECT coalesce(max(updated_at), 0) FROM jobs)",
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
    let (deliveries, attempts, replays, incidents, erased) =
        (r.i64(0)?, r.i64(1)?, r.i64(2)?, r.i64(3)?, r.i64(4)?);
    let mut h = Sha256::new();
    h.update(format!(
        "{deliveries}/{attempts}/{replays}/{incidents}/{erased}/{query}"
    ));
    for r in db.query(job_counts(db.dialect()), &[])? {
        h.update(format!("/{}={}", r.string(0)?, r.i64(1)?));
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
        let n = db
            .query_one(
                "SELECT count(*) FROM incidents WHERE source = ?1 AND event_id = ?2",
                args![source, id],
            )?
            .i64(0)?;
        event["incidents"] = json!(n);
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
    let r = db.query_one(
        "SELECT content_type, headers, erased_at, received_at FROM events
         WHERE source = ?1 AND event_id = ?2",
        args![&source, &event_id],
    )?;
    let (content_type, headers, erased_at, received_at) =
        (r.opt_string(0)?, r.opt_string(1)?, r.opt_i64(2)?, r.i64(3)?);
    add_milliseconds(db, event, &source, &event_id, received_at)?;
    if event.get("headers").is_none() {
        event["headers"] = headers
            .and_then(|h| serde_json::from_str::<Value>(&h).ok())
            .unwrap_or(Value::Null);
    }
    event["content_type"] = json!(content_type);
    event["erased_at"] = json!(erased_at.map(ms_to_secs));
    let mut replays = Vec::new();
    for r in db.query(
        "SELECT j.action, r.replayed_at, r.from_status, r.forced, r.origin,
                (SELECT coalesce(max(a.n), 0) FROM attempts a
                 WHERE a.job_id = r.job_id AND a.started_at <= r.replayed_at)
         FROM replays r JOIN jobs j ON j.id = r.job_id
         WHERE j.source = ?1 AND j.event_id = ?2 ORDER BY r.id",
        args![&source, &event_id],
    )? {
        replays.push(json!({
            "action": r.string(0)?,
            "replayed_at": ms_to_secs(r.i64(1)?),
            "replayed_at_ms": r.i64(1)?,
            "from_status": r.string(2)?,
            "forced": r.bool(3)?,
            "origin": r.string(4)?,
            "after_attempt": r.i64(5)?,
        }));
    }
    event["replays"] = Value::Array(replays);
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
    let deliveries = db
        .query(
            &format!("SELECT received_at FROM deliveries WHERE {DELIVERIES_OF_EVENT} ORDER BY id"),
            args![source, event_id, received_at],
        )?
        .iter()
        .map(|r| r.i64(0))
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(list) = event["deliveries"].as_array_mut() {
        for (d, ms) in list.iter_mut().zip(deliveries) {
            d["received_at_ms"] = json!(ms);
        }
    }
    let incidents = db
        .query(
            "SELECT created_at FROM incidents WHERE source = ?1 AND event_id = ?2 ORDER BY id",
            args![source, event_id],
        )?
        .iter()
        .map(|r| r.i64(0))
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(list) = event["incidents"].as_array_mut() {
        for (i, ms) in list.iter_mut().zip(incidents) {
            i["created_at_ms"] = json!(ms);
        }
    }
    let mut attempts = std::collections::HashMap::<(String, i64), i64>::new();
    for r in db.query(
        "SELECT j.action, a.n, a.started_at FROM attempts a JOIN jobs j ON j.id = a.job_id
         WHERE j.source = ?1 AND j.event_id = ?2",
        args![source, event_id],
    )? {
        attempts.insert((r.string(0)?, r.i64(1)?), r.i64(2)?);
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
        crate::store::migrate(&mut conn).unwrap();
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
