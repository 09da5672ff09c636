//! `idemhook events list` and `idemhook events show`: the queries that read
//! an event's whole story (state, payload, jobs, attempts, deliveries,
//! incidents) and build the JSON that both the CLI's `--json` and the admin
//! API answer, plus the human-readable rendering of the same values.
//! Nothing here writes.

use std::fmt::Write as _;
use std::io::Write as _;

use serde_json::{Value, json};

use super::command::{CommandError, Outcome};
use super::error::{OpError, not_found};
use super::open::open_db_read;
use super::text::{cell, clean, fmt_json_time, fmt_time, stdout, table};
use crate::args;
use crate::config::{Config, parse_duration};
use crate::ingest::DELIVERIES_OF_EVENT;
use crate::state::{EventState, JobKind, JobStatus};
use crate::store::db::{self, Db, Dialect};
use crate::time::{ms_to_secs, now_ms};

/// A nullable millisecond column as JSON unix seconds.
fn secs(ms: Option<i64>) -> Value {
    ms.map_or(Value::Null, |ms| json!(ms_to_secs(ms)))
}

// ---------------------------------------------------------------------------
// events list

/// What `events list` and `GET /api/events` select.
#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    pub source: Option<String>,
    /// An event state.
    pub state: Option<String>,
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

impl ListFilter {
    /// Checks the state and parses `since` (a duration back from `now`).
    pub fn new(
        source: Option<String>,
        state: Option<String>,
        event_type: Option<String>,
        since: Option<&str>,
        limit: u32,
        now: i64,
    ) -> Result<ListFilter, OpError> {
        if let Some(s) = &state
            && s.parse::<EventState>().is_err()
        {
            return Err(OpError::Invalid(format!(
                "unknown status {s:?}: an event's status is one of {}",
                EventState::ALL.map(EventState::as_str).join(", ")
            )));
        }
        let since_ms = match since {
            Some(text) => {
                let d =
                    parse_duration(text).map_err(|e| OpError::Invalid(format!("since: {e}")))?;
                Some(now.saturating_sub(i64::try_from(d.as_millis()).unwrap_or(i64::MAX)))
            }
            None => None,
        };
        Ok(ListFilter {
            source,
            state,
            event_type,
            since_ms,
            limit,
            ..ListFilter::default()
        })
    }
}

/// Events, newest first, as `[{source, event_id, type, state, received_at}]`.
pub fn list(db: &Db<'_>, filter: &ListFilter) -> Result<Value, OpError> {
    let mut sql =
        String::from("SELECT source, event_id, type, state, received_at FROM events WHERE 1 = 1");
    let mut args: Vec<db::Value> = Vec::new();
    let dialect = db.dialect();
    let mut add = |clause: &str, value: db::Value| {
        args.push(value);
        let _ = write!(sql, " AND {clause} ?{}", args.len());
    };
    if let Some(s) = &filter.source {
        add("source =", s.clone().into());
    }
    if let Some(s) = &filter.state {
        add("state =", s.clone().into());
    }
    if let Some(t) = &filter.event_type {
        add("type =", t.clone().into());
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
        add(&format!("{id} >="), prefix.clone().into());
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
    let mut out = Vec::new();
    for r in db.query(&sql, &args)? {
        out.push(json!({
            "source": r.string(0)?,
            "event_id": r.string(1)?,
            "type": r.opt_string(2)?,
            "state": r.string(3)?,
            "received_at": ms_to_secs(r.i64(4)?),
        }));
    }
    Ok(Value::Array(out))
}

/// `idemhook events list`.
pub fn list_cmd(
    config: &Config,
    source: Option<String>,
    status: Option<String>,
    event_type: Option<String>,
    since: Option<String>,
    limit: u32,
    json: bool,
) -> Result<Outcome, CommandError> {
    let filter = ListFilter::new(
        source,
        status,
        event_type,
        since.as_deref(),
        limit,
        now_ms(),
    )?;
    let mut handle = open_db_read(config)?;
    let events = handle.read(|db| list(db, &filter))?;
    let mut out = stdout();
    if json {
        writeln!(
            out,
            "{}",
            serde_json::to_string_pretty(&events).map_err(anyhow::Error::from)?
        )?;
        return Ok(Outcome::Done);
    }
    let rows: Vec<Vec<String>> = events
        .as_array()
        .map(|a| a.as_slice())
        .unwrap_or_default()
        .iter()
        .map(|e| {
            vec![
                fmt_json_time(&e["received_at"]),
                cell(&e["source"]),
                cell(&e["event_id"]),
                cell(&e["type"]),
                cell(&e["state"]),
            ]
        })
        .collect();
    if rows.is_empty() {
        writeln!(out, "no events match")?;
    } else {
        write!(
            out,
            "{}",
            table(&["RECEIVED", "SOURCE", "EVENT_ID", "TYPE", "STATE"], &rows)
        )?;
    }
    Ok(Outcome::Done)
}

// ---------------------------------------------------------------------------
// events show

/// The stored body as JSON output: the JSON itself when it parses, else the
/// text (invalid UTF-8 replaced), null once erased.
fn payload_value(raw: &db::Value) -> Value {
    let bytes = match raw {
        db::Value::Null => return Value::Null,
        db::Value::Bytes(b) => b.as_slice(),
        db::Value::Text(t) => t.as_bytes(),
        db::Value::Int(i) => return json!(i),
        db::Value::Real(f) => return json!(f),
    };
    let as_text = || Value::String(String::from_utf8_lossy(bytes).into_owned());
    // A body no JSON kind took (a `none` or `hmac` source, another media
    // type) may nest deeper than receipt allows; building its tree could
    // overflow a request thread's stack, so it is shown as text.
    if nesting(bytes) > MAX_SHOWN_NESTING {
        return as_text();
    }
    serde_json::from_slice(bytes).unwrap_or_else(|_| as_text())
}

/// Deeper than this, a stored body is shown as text, not as JSON (receipt
/// refuses JSON nested deeper than 64 for the kinds that read it).
const MAX_SHOWN_NESTING: usize = 64;

/// How deep brackets nest in `bytes`, outside strings.
fn nesting(bytes: &[u8]) -> usize {
    let (mut depth, mut deepest, mut in_string, mut escaped) = (0usize, 0usize, false, false);
    for &b in bytes {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// The kept headers as JSON: the stored object (in the order received),
/// null once erased.
fn headers_value(stored: Option<&str>) -> Value {
    stored
        .and_then(|h| serde_json::from_str::<Value>(h).ok())
        .filter(Value::is_object)
        .unwrap_or(Value::Null)
}

/// One event, the object `events show --json` and the admin API print:
/// its fields, payload, jobs with their attempts, deliveries and
/// incidents, plus the kept `headers` and each attempt's operator `note`.
pub fn show(db: &Db<'_>, source: &str, event_id: &str) -> Result<Value, OpError> {
    let Some(r) = db.query_opt(
        "SELECT type, state, received_at, completed_at, payload, payload_hash, verified_with,
                headers
         FROM events WHERE source = ?1 AND event_id = ?2",
        args![source, event_id],
    )?
    else {
        return Err(not_found(source, event_id));
    };
    let received_at = r.i64(2)?;
    let mut event = json!({
        "source": source,
        "event_id": event_id,
        "type": r.opt_string(0)?,
        "state": r.string(1)?,
        "received_at": ms_to_secs(received_at),
        "completed_at": secs(r.opt_i64(3)?),
        "payload_hash": r.string(5)?,
        "verified_with": r.opt_i64(6)?,
        "payload": payload_value(r.get(4)),
        "headers": headers_value(r.opt_string(7)?.as_deref()),
    });

    event["jobs"] = jobs(db, source, event_id)?;
    event["deliveries"] = deliveries(db, source, event_id, received_at)?;
    event["incidents"] = incidents(db, source, event_id)?;
    Ok(event)
}

/// An event's jobs, in the order they were written, each with its
/// attempts (and a forward job with its checks).
fn jobs(db: &Db<'_>, source: &str, event_id: &str) -> Result<Value, OpError> {
    let mut jobs = Vec::new();
    for r in db.query(
        "SELECT id, action, kind, status, next_attempt_at, last_error, waiting
         FROM jobs WHERE source = ?1 AND event_id = ?2 ORDER BY id",
        args![source, event_id],
    )? {
        let job_id = r.i64(0)?;
        let status = r.string(3)?;
        let mut job = json!({
            "action": r.string(1)?,
            "kind": r.string(2)?,
            "next_attempt_at": if status == JobStatus::Pending.as_str() {
                secs(r.opt_i64(4)?)
            } else {
                Value::Null
            },
            "status": status,
            "last_error": r.opt_string(5)?,
        });
        if job["kind"] == JobKind::Forward.as_str() {
            job["waiting_for"] = waiting_for(&job["status"], r.opt_string(6)?, r.opt_i64(4)?);
        }
        job["attempts"] = job_attempts(db, job_id)?;
        if job["kind"] == JobKind::Forward.as_str() {
            job["checks"] = job_checks(db, job_id)?;
        }
        jobs.push(job);
    }
    Ok(Value::Array(jobs))
}

/// Why a forward job that has not run yet waits, if it does: `paused`,
/// `after` (another action of its event), `order` (an earlier job of its
/// order key), `concurrency` or `rate` (its action's limits); null when
/// it is due (or only waits for its retry's time), or not pending.
fn waiting_for(status: &Value, waiting: Option<String>, next_attempt_at: Option<i64>) -> Value {
    match status.as_str() {
        Some("paused") => Value::String("paused".to_string()),
        Some("pending") => match waiting {
            Some(w) => Value::String(w),
            // Parked before the reason was kept: only `after` parked then.
            None if next_attempt_at.is_none() => Value::String("after".to_string()),
            None => Value::Null,
        },
        _ => Value::Null,
    }
}

/// A job's attempts, by number.
fn job_attempts(db: &Db<'_>, job_id: i64) -> Result<Value, OpError> {
    let mut attempts = Vec::new();
    for a in db.query(
        "SELECT n, started_at, finished_at, outcome, http_status, error, error_kind,
                response_head, request_id, note
         FROM attempts WHERE job_id = ?1 ORDER BY n",
        args![job_id],
    )? {
        attempts.push(json!({
            "n": a.i64(0)?,
            "started_at": ms_to_secs(a.i64(1)?),
            "finished_at": secs(a.opt_i64(2)?),
            "outcome": a.opt_string(3)?,
            "http_status": a.opt_i64(4)?,
            "error": a.opt_string(5)?,
            "error_kind": a.opt_string(6)?,
            "response": a.opt_string(7)?,
            "request_id": a.opt_string(8)?,
            "note": a.opt_string(9)?,
        }));
    }
    Ok(Value::Array(attempts))
}

/// Every delivery of the event (the accepted one and the redeliveries).
fn deliveries(
    db: &Db<'_>,
    source: &str,
    event_id: &str,
    received_at: i64,
) -> Result<Value, OpError> {
    let mut deliveries = Vec::new();
    for r in db.query(
        &format!(
            "SELECT received_at, outcome, remote, detail FROM deliveries
             WHERE {DELIVERIES_OF_EVENT} ORDER BY id"
        ),
        args![source, event_id, received_at],
    )? {
        let mut delivery = json!({
            "received_at": ms_to_secs(r.i64(0)?),
            "outcome": r.string(1)?,
            "remote": r.opt_string(2)?,
        });
        // A claim's delivery row has a detail only when it came in a batch.
        if let Some(batch) = r.opt_string(3)? {
            delivery["batch"] = Value::String(batch);
        }
        deliveries.push(delivery);
    }
    Ok(Value::Array(deliveries))
}

/// The event's incidents, each with the body it came with when kept.
fn incidents(db: &Db<'_>, source: &str, event_id: &str) -> Result<Value, OpError> {
    let mut incidents = Vec::new();
    for r in db.query(
        "SELECT i.kind, i.created_at, i.detail, p.payload FROM incidents i
         LEFT JOIN incident_payloads p ON p.incident_id = i.id
         WHERE i.source = ?1 AND i.event_id = ?2 ORDER BY i.id",
        args![source, event_id],
    )? {
        incidents.push(json!({
            "kind": r.string(0)?,
            "created_at": ms_to_secs(r.i64(1)?),
            "detail": r.opt_string(2)?,
            "payload": payload_value(r.get(3)),
        }));
    }
    Ok(Value::Array(incidents))
}

/// What the human view adds to the JSON: erasure, stored headers, replays.
struct Extras {
    erased_at: Option<i64>,
    content_type: Option<String>,
    headers: Option<String>,
    replays: Vec<Replayed>,
}

/// A replay of one of the event's jobs: (action, replayed_at ms,
/// from_status, forced, origin).
type Replayed = (String, i64, String, bool, String);

fn extras(db: &Db<'_>, source: &str, event_id: &str) -> Result<Extras, OpError> {
    let r = db.query_one(
        "SELECT erased_at, content_type, headers FROM events WHERE source = ?1 AND event_id = ?2",
        args![source, event_id],
    )?;
    let (erased_at, content_type, headers) = (r.opt_i64(0)?, r.opt_string(1)?, r.opt_string(2)?);
    let mut replays = Vec::new();
    for r in db.query(
        "SELECT j.action, r.replayed_at, r.from_status, r.forced, r.origin
         FROM replays r JOIN jobs j ON j.id = r.job_id
         WHERE j.source = ?1 AND j.event_id = ?2 ORDER BY r.id",
        args![source, event_id],
    )? {
        replays.push((
            r.string(0)?,
            r.i64(1)?,
            r.string(2)?,
            r.bool(3)?,
            r.string(4)?,
        ));
    }
    Ok(Extras {
        erased_at,
        content_type,
        headers,
        replays,
    })
}

/// The human view of one event: its fields, the payload, the kept
/// headers, the jobs with their attempts, checks and replays, the
/// deliveries, the incidents.
fn render(event: &Value, extras: &Extras) -> String {
    let mut out = String::new();
    render_fields(&mut out, event);
    render_payload(&mut out, event, extras);
    render_headers(&mut out, extras);
    let jobs = array(&event["jobs"]);
    if jobs.is_empty() {
        let _ = writeln!(out, "\njobs: none (no action takes this event's type)");
    } else {
        let _ = writeln!(out, "\njobs:");
    }
    for job in jobs {
        render_job(&mut out, job, &extras.replays);
    }
    render_deliveries(&mut out, array(&event["deliveries"]));
    render_incidents(&mut out, array(&event["incidents"]));
    out
}

/// A JSON array's items; none for anything else.
fn array(value: &Value) -> &[Value] {
    value.as_array().map(Vec::as_slice).unwrap_or_default()
}

fn render_fields(out: &mut String, event: &Value) {
    let _ = writeln!(
        out,
        "event {}/{}",
        cell(&event["source"]),
        cell(&event["event_id"])
    );
    let verified = match event["verified_with"].as_i64() {
        Some(i) => format!("signature matched secret #{i} (0-based), checked once at receipt"),
        None => "unsigned source (kind none)".to_string(),
    };
    for (label, value) in [
        ("type", cell(&event["type"])),
        ("state", cell(&event["state"])),
        ("received", fmt_json_time(&event["received_at"])),
        ("completed", fmt_json_time(&event["completed_at"])),
        ("verified", verified),
        ("payload hash", cell(&event["payload_hash"])),
    ] {
        let _ = writeln!(out, "  {label:<13} {value}");
    }
}

fn render_payload(out: &mut String, event: &Value, extras: &Extras) {
    match (&event["payload"], extras.erased_at) {
        (Value::Null, Some(at)) => {
            let _ = writeln!(
                out,
                "\npayload: erased at {} (the key and payload hash are kept)",
                fmt_time(ms_to_secs(at))
            );
        }
        (Value::Null, None) => {
            let _ = writeln!(out, "\npayload: none stored");
        }
        (payload, _) => {
            let ct = extras
                .content_type
                .as_deref()
                .map(clean)
                .unwrap_or_default();
            let _ = writeln!(out, "\npayload ({ct}):");
            let text = match payload {
                Value::String(s) => clean(s),
                other => serde_json::to_string_pretty(other).unwrap_or_default(),
            };
            for line in text.lines() {
                let _ = writeln!(out, "  {}", clean(line));
            }
        }
    }
}

fn render_headers(out: &mut String, extras: &Extras) {
    if let Some(headers) = &extras.headers
        && let Ok(Value::Object(map)) = serde_json::from_str::<Value>(headers)
        && !map.is_empty()
    {
        let _ = writeln!(out, "\nheaders kept:");
        for (k, v) in map {
            let _ = writeln!(out, "  {}: {}", clean(&k), cell(&v));
        }
    }
}

/// One job: its line, its attempts, the checks asked for it, its last
/// error when no attempt says it, and the replays of its action.
fn render_job(out: &mut String, job: &Value, replays: &[Replayed]) {
    let attempts = array(&job["attempts"]);
    let mut line = format!(
        "  {} ({})  {}  {} attempt{}",
        cell(&job["action"]),
        cell(&job["kind"]),
        cell(&job["status"]),
        attempts.len(),
        if attempts.len() == 1 { "" } else { "s" }
    );
    if !job["next_attempt_at"].is_null() {
        let _ = write!(line, ", next at {}", fmt_json_time(&job["next_attempt_at"]));
    }
    if let Some(w) = job["waiting_for"].as_str() {
        let _ = write!(line, ", waiting for {w}");
    }
    let _ = writeln!(out, "{line}");
    for a in attempts {
        render_attempt(out, a);
    }
    for c in array(&job["checks"]) {
        let _ = writeln!(
            out,
            "    check for #{} {}: {}{}{}",
            cell(&c["n"]),
            fmt_json_time(&c["asked_at"]),
            cell(&c["answer"]),
            c["http_status"]
                .as_i64()
                .map_or_else(String::new, |s| format!(" (http {s})")),
            c["error"]
                .as_str()
                .map_or_else(String::new, |e| format!("  error: {}", clean(e))),
        );
    }
    if !job["last_error"].is_null() && attempts.is_empty() {
        let _ = writeln!(out, "    last error: {}", cell(&job["last_error"]));
    }
    for (action, at, from, forced, origin) in replays {
        if Some(action.as_str()) == job["action"].as_str() {
            let _ = writeln!(
                out,
                "    replayed {} from {}{} by {}",
                fmt_time(ms_to_secs(*at)),
                clean(from),
                if *forced { " (forced)" } else { "" },
                clean(origin)
            );
        }
    }
}

fn render_attempt(out: &mut String, a: &Value) {
    let mut line = format!(
        "    #{} {} -> {}  {}",
        cell(&a["n"]),
        fmt_json_time(&a["started_at"]),
        fmt_json_time(&a["finished_at"]),
        cell(&a["outcome"]),
    );
    if !a["error_kind"].is_null() {
        let _ = write!(line, " ({})", cell(&a["error_kind"]));
    }
    if !a["http_status"].is_null() {
        let _ = write!(line, "  http {}", cell(&a["http_status"]));
    }
    if !a["request_id"].is_null() {
        let _ = write!(line, "  request id {}", cell(&a["request_id"]));
    }
    if !a["error"].is_null() {
        let _ = write!(line, "  error: {}", cell(&a["error"]));
    }
    let _ = writeln!(out, "{line}");
    if let Some(response) = a["response"].as_str().filter(|r| !r.is_empty()) {
        let _ = writeln!(out, "       answer: {}", clean(response));
    }
    if !a["note"].is_null() {
        let _ = writeln!(out, "       note: {}", cell(&a["note"]));
    }
}

fn render_deliveries(out: &mut String, deliveries: &[Value]) {
    let _ = writeln!(out, "\ndeliveries ({}):", deliveries.len());
    for d in deliveries {
        let _ = writeln!(
            out,
            "  {}  {:<10} {}{}",
            fmt_json_time(&d["received_at"]),
            cell(&d["outcome"]),
            cell(&d["remote"]),
            d.get("batch")
                .and_then(Value::as_str)
                .map(|b| format!("  batch {b}"))
                .unwrap_or_default()
        );
    }
}

fn render_incidents(out: &mut String, incidents: &[Value]) {
    if incidents.is_empty() {
        let _ = writeln!(out, "\nincidents: none");
        return;
    }
    let _ = writeln!(out, "\nincidents ({}):", incidents.len());
    for i in incidents {
        let _ = writeln!(
            out,
            "  {}  {}  {}",
            fmt_json_time(&i["created_at"]),
            cell(&i["kind"]),
            cell(&i["detail"])
        );
    }
}

/// `idemhook events show`.
pub fn show_cmd(
    config: &Config,
    source: &str,
    event_id: &str,
    json: bool,
) -> Result<Outcome, CommandError> {
    let mut handle = open_db_read(config)?;
    let (event, extras) = handle.read(|db| {
        let event = show(db, source, event_id)?;
        let extras = if json {
            None
        } else {
            Some(extras(db, source, event_id)?)
        };
        Ok::<_, OpError>((event, extras))
    })?;
    let mut out = stdout();
    match extras {
        None => writeln!(
            out,
            "{}",
            serde_json::to_string_pretty(&event).map_err(anyhow::Error::from)?
        )?,
        Some(extras) => write!(out, "{}", render(&event, &extras))?,
    }
    Ok(Outcome::Done)
}

/// The questions asked of a forward job's `check` URL (`checks`), oldest
/// first: `[{"n", "asked_at", "answer", "http_status", "error"}]`; `n` is
/// the attempt each was asked for.
fn job_checks(db: &Db<'_>, job_id: i64) -> Result<Value, OpError> {
    let mut checks = Vec::new();
    for r in db.query(
        "SELECT n, asked_at, answer, http_status, error FROM checks WHERE job_id = ?1 ORDER BY id",
        args![job_id],
    )? {
        checks.push(json!({
            "n": r.i64(0)?,
            "asked_at": ms_to_secs(r.i64(1)?),
            "answer": r.string(2)?,
            "http_status": r.opt_i64(3)?,
            "error": r.opt_string(4)?,
        }));
    }
    Ok(Value::Array(checks))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_is_json_text_or_null() {
        let blob = |b: &[u8]| db::Value::Bytes(b.to_vec());
        assert_eq!(payload_value(&blob(b"{\"a\":1}")), json!({"a": 1}));
        assert_eq!(payload_value(&blob(b"a=1&b=2")), json!("a=1&b=2"));
        assert_eq!(payload_value(&db::Value::Null), Value::Null);
        let deep = format!("{}1{}", "[".repeat(65), "]".repeat(65));
        assert_eq!(payload_value(&blob(deep.as_bytes())), json!(deep));
        assert_eq!(nesting(br#"{"a":"[[[[","b":[{"c":"\"]"}]}"#), 3);
    }

    #[test]
    fn list_filter_checks_state_and_since() {
        assert!(ListFilter::new(None, Some("done".into()), None, None, 10, 0).is_err());
        assert!(ListFilter::new(None, None, None, Some("soon"), 10, 0).is_err());
        let f =
            ListFilter::new(None, Some("failed".into()), None, Some("1m"), 10, 100_000).unwrap();
        assert_eq!(f.since_ms, Some(40_000));
    }
}
