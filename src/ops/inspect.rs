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
use super::open;
use super::text::{cell, clean, fmt_json_time, fmt_time, stdout, table};
use crate::config::{Config, parse_duration};
use crate::state::{EventState, JobKind, JobStatus};
use crate::store::db::{self, Db};
use crate::store::replays::{self, ReplayRow};
use crate::store::{StoreError, attempts, deliveries, events, incidents, jobs};
use crate::time::{ms_to_secs, now_ms};

/// A nullable millisecond column as JSON unix seconds.
fn secs(ms: Option<i64>) -> Value {
    ms.map_or(Value::Null, |ms| json!(ms_to_secs(ms)))
}

// ---------------------------------------------------------------------------
// events list

/// What `events list` and `GET /api/events` select (the query is
/// `store::events`'s; checking what an operator typed is this module's).
pub use crate::store::events::ListFilter;

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
        let state = match state {
            Some(s) => Some(s.parse::<EventState>().map_err(|_| {
                OpError::Invalid(format!(
                    "unknown status {s:?}: an event's status is one of {}",
                    EventState::ALL.map(EventState::as_str).join(", ")
                ))
            })?),
            None => None,
        };
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

/// The list's JSON: `[{source, event_id, type, state, received_at}]`.
fn list_json(events: &[events::Listed]) -> Value {
    Value::Array(
        events
            .iter()
            .map(|e| {
                json!({
                    "source": e.source,
                    "event_id": e.event_id,
                    "type": e.event_type,
                    "state": e.state,
                    "received_at": ms_to_secs(e.received_at),
                })
            })
            .collect(),
    )
}

/// Events, newest first, as `[{source, event_id, type, state, received_at}]`.
pub fn list(db: &Db<'_>, filter: &ListFilter) -> Result<Value, OpError> {
    Ok(list_json(&events::list(db, filter)?))
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
    let events = open::read(config, |db| events::list(db, &filter))??;
    let mut out = stdout();
    if json {
        writeln!(
            out,
            "{}",
            serde_json::to_string_pretty(&list_json(&events)).map_err(anyhow::Error::from)?
        )?;
        return Ok(Outcome::Done);
    }
    let rows: Vec<Vec<String>> = events
        .iter()
        .map(|e| {
            vec![
                fmt_time(ms_to_secs(e.received_at)),
                clean(&e.source),
                clean(&e.event_id),
                e.event_type
                    .as_deref()
                    .map_or_else(|| "-".to_string(), clean),
                if e.paused {
                    format!("{} (paused)", e.state)
                } else {
                    e.state.to_string()
                },
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
    match serde_json::from_slice(bytes) {
        Ok(mut value) => {
            hide_client_state(&mut value);
            value
        }
        Err(_) => as_text(),
    }
}

/// Microsoft Graph's `clientState` is its only verification secret, and it
/// rides in every notification: shown as `[REDACTED]` (an item's own, and
/// each one's in a `value` batch), by `events show` and the admin API
/// alike, so the inspector never gets it either.
fn hide_client_state(value: &mut Value) {
    fn hide(item: &mut Value) {
        if let Some(state) = item.get_mut("clientState")
            && state.is_string()
        {
            *state = Value::String("[REDACTED]".to_string());
        }
    }
    hide(value);
    if let Some(items) = value.get_mut("value").and_then(Value::as_array_mut) {
        items.iter_mut().for_each(hide);
    }
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
    let Some(e) = events::get(db, source, event_id)? else {
        return Err(not_found(source, event_id));
    };
    Ok(show_json(db, source, event_id, &e)?)
}

fn show_json(
    db: &Db<'_>,
    source: &str,
    event_id: &str,
    e: &events::EventRow,
) -> Result<Value, StoreError> {
    let mut event = json!({
        "source": source,
        "event_id": event_id,
        "type": e.event_type,
        "state": e.state,
        "received_at": ms_to_secs(e.received_at),
        "completed_at": secs(e.completed_at),
        "payload_hash": e.payload_hash,
        "verified_with": e.verified_with,
        "payload": payload_value(&e.payload),
        "headers": headers_value(e.headers.as_deref()),
    });
    event["jobs"] = jobs_json(db, source, event_id)?;
    event["deliveries"] = Value::Array(
        deliveries::of_event(db, source, event_id, e.received_at)?
            .into_iter()
            .map(delivery_json)
            .collect(),
    );
    event["incidents"] = Value::Array(
        incidents::of_event(db, source, event_id)?
            .into_iter()
            .map(|i| {
                json!({
                    "kind": i.kind,
                    "created_at": ms_to_secs(i.created_at),
                    "detail": i.detail,
                    "payload": payload_value(&i.payload),
                })
            })
            .collect(),
    );
    Ok(event)
}

/// An event's jobs, in the order they were written, each with its
/// attempts (and a forward job with its checks).
fn jobs_json(db: &Db<'_>, source: &str, event_id: &str) -> Result<Value, StoreError> {
    let mut out = Vec::new();
    for j in jobs::of_event(db, source, event_id)? {
        let mut job = json!({
            "action": j.action,
            "kind": j.kind,
            "next_attempt_at": if j.status == JobStatus::Pending {
                secs(j.next_attempt_at)
            } else {
                Value::Null
            },
            "status": j.status,
            "last_error": j.last_error,
        });
        if j.kind == JobKind::Forward {
            job["waiting_for"] = waiting_for(j.status, j.waiting, j.next_attempt_at);
        }
        job["attempts"] = Value::Array(
            attempts::of_job(db, j.id)?
                .into_iter()
                .map(attempt_json)
                .collect(),
        );
        if j.kind == JobKind::Forward {
            job["checks"] = Value::Array(
                attempts::checks_of_job(db, j.id)?
                    .into_iter()
                    .map(|c| {
                        json!({
                            "n": c.n,
                            "asked_at": ms_to_secs(c.asked_at),
                            "answer": c.answer,
                            "http_status": c.http_status,
                            "error": c.error,
                        })
                    })
                    .collect(),
            );
        }
        out.push(job);
    }
    Ok(Value::Array(out))
}

/// Why a forward job that has not run yet waits, if it does: `paused`,
/// `after` (another action of its event), `order` (an earlier job of its
/// order key), `concurrency` or `rate` (its action's limits); null when
/// it is due (or only waits for its retry's time), or not pending.
fn waiting_for(status: JobStatus, waiting: Option<String>, next_attempt_at: Option<i64>) -> Value {
    match status {
        JobStatus::Paused => Value::String("paused".to_string()),
        JobStatus::Pending => match waiting {
            Some(w) => Value::String(w),
            // Parked before the reason was kept: only `after` parked then.
            None if next_attempt_at.is_none() => Value::String("after".to_string()),
            None => Value::Null,
        },
        _ => Value::Null,
    }
}

fn attempt_json(a: attempts::AttemptRow) -> Value {
    json!({
        "n": a.n,
        "started_at": ms_to_secs(a.started_at),
        "finished_at": secs(a.finished_at),
        "outcome": a.outcome,
        "http_status": a.http_status,
        "error": a.error,
        "error_kind": a.error_kind,
        "response": a.response_head,
        "request_id": a.request_id,
        "note": a.note,
    })
}

fn delivery_json(d: deliveries::DeliveryRow) -> Value {
    let mut delivery = json!({
        "received_at": ms_to_secs(d.received_at),
        "outcome": d.outcome,
        "remote": d.remote,
    });
    // A claim's delivery row has a detail only when it came in a batch.
    if let Some(batch) = d.batch {
        delivery["batch"] = Value::String(batch);
    }
    delivery
}

/// What the human view adds to the JSON: erasure, stored headers, replays.
struct Extras {
    erased_at: Option<i64>,
    content_type: Option<String>,
    headers: Option<String>,
    replays: Vec<ReplayRow>,
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
    let paused: Vec<String> = array(&event["jobs"])
        .iter()
        .filter(|j| j["status"] == JobStatus::Paused.as_str())
        .map(|j| cell(&j["action"]))
        .collect();
    let state = if paused.is_empty() {
        cell(&event["state"])
    } else {
        format!(
            "{} (paused: {}; waits for `idemhook resume`)",
            cell(&event["state"]),
            paused.join(", ")
        )
    };
    for (label, value) in [
        ("type", cell(&event["type"])),
        ("state", state),
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

/// One job: its line, its attempts with its replays among them in time
/// order, the checks asked for it, and its last error when no attempt
/// says it.
fn render_job(out: &mut String, job: &Value, replays: &[ReplayRow]) {
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
    let mut replays = replays
        .iter()
        .filter(|r| Some(r.action.as_str()) == job["action"].as_str())
        .peekable();
    for a in attempts {
        let n = a["n"].as_i64().unwrap_or(i64::MAX);
        while let Some(r) = replays.next_if(|r| r.after_attempt < n) {
            render_replay(out, r);
        }
        render_attempt(out, a);
    }
    replays.for_each(|r| render_replay(out, r));
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
}

fn render_replay(out: &mut String, r: &ReplayRow) {
    let _ = writeln!(
        out,
        "    replayed {} from {}{} by {}",
        fmt_time(ms_to_secs(r.replayed_at)),
        r.from_status,
        if r.forced { " (forced)" } else { "" },
        clean(&r.origin)
    );
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
    let (event, extras) = open::read(config, |db| {
        let Some(e) = events::get(db, source, event_id)? else {
            return Err(not_found(source, event_id));
        };
        let event = show_json(db, source, event_id, &e)?;
        let extras = if json {
            None
        } else {
            Some(Extras {
                replays: replays::of_event(db, source, event_id)?,
                erased_at: e.erased_at,
                content_type: e.content_type,
                headers: e.headers,
            })
        };
        Ok::<_, OpError>((event, extras))
    })??;
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
