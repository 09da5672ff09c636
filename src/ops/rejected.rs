//! `idemhook rejected list|show` and `GET /api/rejected`,
//! `GET /api/rejected/{id}`: the refused deliveries kept for `reingest`
//! (`store::rejected`), as JSON `{id, source, received_at, reason, remote,
//! bytes}` (`show` adds `headers` and `body`).

use std::io::Write as _;

use serde_json::{Value, json};

use super::command::{CommandError, Outcome};
use super::error::OpError;
use super::open;
use super::text::{clean, fmt_time, stdout};
use crate::config::{Config, parse_duration};
use crate::store::db::Db;
use crate::store::rejected::{self, Kept, KeptRequest};
use crate::time::{ms_to_secs, now_ms};

/// The most kept requests one list answers.
pub const MAX_LIST: i64 = 10_000;

/// Headers whose values are credentials a provider sends (a shared
/// token, a session): shown as `[REDACTED]`, kept as they came for
/// `reingest`.
fn is_credential(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    n == "authorization"
        || n == "proxy-authorization"
        || n == "cookie"
        || n.contains("token")
        || n.contains("secret")
        || n.contains("api-key")
        || n.contains("password")
}

/// `since` (a duration back from `now`) as a time in ms; 0 when absent.
pub fn since_ms(since: Option<&str>, now: i64) -> Result<i64, OpError> {
    match since {
        Some(text) => {
            let d = parse_duration(text).map_err(|e| OpError::Invalid(format!("since: {e}")))?;
            Ok(now.saturating_sub(i64::try_from(d.as_millis()).unwrap_or(i64::MAX)))
        }
        None => Ok(0),
    }
}

fn kept_json(k: &Kept) -> Value {
    json!({
        "id": k.id,
        "source": k.source,
        "received_at": ms_to_secs(k.received_at),
        "reason": k.reason,
        "remote": k.remote,
        "bytes": k.bytes,
    })
}

/// The kept requests (of `source`, received within `since`), oldest first.
pub fn list(db: &Db<'_>, source: Option<&str>, since: Option<&str>) -> Result<Value, OpError> {
    let from = since_ms(since, now_ms())?;
    let kept = rejected::list(db, source, from, MAX_LIST)?;
    Ok(Value::Array(kept.iter().map(kept_json).collect()))
}

/// One kept request with its headers (credentials redacted) and body (as
/// text, invalid UTF-8 replaced).
pub fn show(db: &Db<'_>, id: i64) -> Result<Value, OpError> {
    let Some(k) = rejected::get(db, id)? else {
        return Err(not_found(id));
    };
    Ok(request_json(&k))
}

fn request_json(k: &KeptRequest) -> Value {
    let mut v = kept_json(&k.kept);
    v["headers"] = Value::Array(
        k.headers
            .iter()
            .map(|(name, value)| {
                let shown = if is_credential(name) {
                    "[REDACTED]"
                } else {
                    value.as_str()
                };
                json!([name, shown])
            })
            .collect(),
    );
    v["body"] = Value::String(String::from_utf8_lossy(&k.body).into_owned());
    v
}

pub fn not_found(id: i64) -> OpError {
    OpError::NotFound(format!(
        "no kept refused request {id} (re-ingested, or dropped past keep_rejected or keep_rejected_bytes)"
    ))
}

/// `idemhook rejected list`.
pub fn list_cmd(
    config: &Config,
    source: Option<&str>,
    since: Option<&str>,
    as_json: bool,
) -> Result<Outcome, CommandError> {
    let listed = open::read(config, |db| list(db, source, since))??;
    let mut out = stdout();
    if as_json {
        writeln!(out, "{listed}")?;
        return Ok(Outcome::Done);
    }
    let rows = listed.as_array().map(Vec::as_slice).unwrap_or_default();
    if rows.is_empty() {
        writeln!(out, "no kept refused requests")?;
        return Ok(Outcome::Done);
    }
    writeln!(
        out,
        "{:<8} {:<16} {:<20} {:>8}  {:<22} REASON",
        "ID", "SOURCE", "RECEIVED", "BYTES", "REMOTE"
    )?;
    for r in rows {
        writeln!(
            out,
            "{:<8} {:<16} {:<20} {:>8}  {:<22} {}",
            r["id"],
            clean(r["source"].as_str().unwrap_or("")),
            r["received_at"].as_i64().map_or("-".to_string(), fmt_time),
            r["bytes"],
            clean(r["remote"].as_str().unwrap_or("")),
            clean(r["reason"].as_str().unwrap_or("")),
        )?;
    }
    Ok(Outcome::Done)
}

/// `idemhook rejected show ID`.
pub fn show_cmd(config: &Config, id: i64, as_json: bool) -> Result<Outcome, CommandError> {
    let shown = open::read(config, |db| show(db, id))??;
    let mut out = stdout();
    if as_json {
        writeln!(out, "{shown}")?;
        return Ok(Outcome::Done);
    }
    let field = |k: &str| clean(shown[k].as_str().unwrap_or(""));
    writeln!(out, "id:       {}", shown["id"])?;
    writeln!(out, "source:   {}", field("source"))?;
    writeln!(
        out,
        "received: {}",
        shown["received_at"]
            .as_i64()
            .map_or("-".to_string(), fmt_time)
    )?;
    writeln!(out, "remote:   {}", field("remote"))?;
    writeln!(out, "reason:   {}", field("reason"))?;
    writeln!(out, "bytes:    {}", shown["bytes"])?;
    writeln!(out, "\nheaders:")?;
    for h in shown["headers"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        writeln!(
            out,
            "  {}: {}",
            clean(h[0].as_str().unwrap_or("")),
            clean(h[1].as_str().unwrap_or(""))
        )?;
    }
    writeln!(out, "\nbody:")?;
    for line in shown["body"].as_str().unwrap_or("").lines() {
        writeln!(out, "{}", clean(line))?;
    }
    Ok(Outcome::Done)
}
