//! `idemhook notify test NAME` (a test message now, nothing recorded;
//! serve need not run) and `idemhook notify list [--json]` (the recent
//! notifications, newest first).

use std::io::Write as _;

use super::command::{CommandError, Outcome};
use super::error::OpError;
use super::open;
use super::text::{clean, fmt_json_time, stdout};
use crate::config::Config;
use crate::notify::message::Message;
use crate::notify::send::send;
use crate::store::notifications;
use crate::time::now_ms;

/// How many `notify list` and `GET /api/notifications` show.
pub const LIST_LIMIT: i64 = 100;

/// Sends a test message to target `name`: exit 0 when it was accepted,
/// 1 when the target refused it or could not be reached.
pub fn test_cmd(config: &Config, name: &str) -> Result<Outcome, CommandError> {
    let Some(target) = config.notify.target(name) else {
        let known: Vec<&str> = config
            .notify
            .targets
            .iter()
            .map(|t| t.name.as_str())
            .collect();
        return Err(CommandError::NotFound(format!(
            "no [[notify]] named {}: the config has {}",
            clean(name),
            if known.is_empty() {
                "none".to_string()
            } else {
                known.join(", ")
            }
        )));
    };
    let now = now_ms();
    let m = Message::test(&target.name, now, config.notify.ui_url.as_deref());
    let mut out = stdout();
    match send(target, &m, &format!("ntf_test_{now}"), now) {
        Ok(()) => {
            writeln!(
                out,
                "{}: the test message was accepted ({})",
                target.name,
                target.kind.describe()
            )?;
            Ok(Outcome::Done)
        }
        Err(e) => {
            writeln!(
                out,
                "{}: the test message was not accepted: {}",
                target.name,
                clean(&e)
            )?;
            Ok(Outcome::Attention)
        }
    }
}

/// The recent notifications, newest first.
pub fn list_cmd(config: &Config, json: bool) -> Result<Outcome, CommandError> {
    let list = open::read(config, |db| {
        notifications::list(db, LIST_LIMIT).map_err(OpError::Store)
    })?
    .map_err(CommandError::from)?;
    let mut out = stdout();
    if json {
        let shaped: Vec<serde_json::Value> = list.iter().map(contract_shape).collect();
        writeln!(
            out,
            "{}",
            serde_json::to_string_pretty(&shaped).map_err(anyhow::Error::from)?
        )?;
        return Ok(Outcome::Done);
    }
    if list.is_empty() {
        writeln!(out, "no notifications")?;
        return Ok(Outcome::Done);
    }
    for n in &list {
        let s = |k: &str| n[k].as_str().map(clean).unwrap_or_else(|| "-".to_string());
        writeln!(
            out,
            "{}  {}  {}  {}  {}  {}  x{}  {} ({} attempts)  {}",
            n["id"],
            fmt_json_time(&n["created_at"]),
            s("notify"),
            s("condition"),
            s("source"),
            s("action"),
            n["count"],
            s("status"),
            n["attempts"],
            s("summary"),
        )?;
    }
    Ok(Outcome::Done)
}

/// A row as the contract shows it (`notify list --json`,
/// `GET /api/notifications`).
pub fn contract_shape(n: &serde_json::Value) -> serde_json::Value {
    serde_json::json!({
        "id": n["id"],
        "notify": n["notify"],
        "condition": n["condition"],
        "source": n["source"],
        "action": n["action"],
        "event_id": n["event_id"],
        "count": n["count"],
        "status": n["status"],
        "attempts": n["attempts"],
        "created_at": n["created_at"],
        "sent_at": n["sent_at"],
    })
}
