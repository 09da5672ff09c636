//! `idemhook erase SOURCE EVENT_ID [--yes]`: drop an event's stored body
//! and headers, and the kept bodies of its mismatched duplicates (a
//! personal-data request), and keep its key and payload hash, so a
//! redelivery is still recognised as a duplicate. Without `--yes` it only
//! prints what it would do.

use std::process::ExitCode;

use anyhow::Result;
use rusqlite::{Connection, OptionalExtension, params};
use serde_json::{Value, json};

use super::inspect::{OpError, clean, finish, fmt_time, not_found, open_read, open_write};
use crate::config::Config;
use crate::store::{ms_to_secs, now_ms};

/// What is stored for the event and what erasing it would touch.
pub fn describe(conn: &Connection, source: &str, event_id: &str) -> Result<Value, OpError> {
    let row = conn
        .prepare_cached(
            "SELECT state, length(payload), headers IS NOT NULL, erased_at FROM events
             WHERE source = ?1 AND event_id = ?2",
        )?
        .query_row(params![source, event_id], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, Option<i64>>(1)?,
                r.get::<_, bool>(2)?,
                r.get::<_, Option<i64>>(3)?,
            ))
        })
        .optional()?;
    let Some((state, payload_bytes, has_headers, erased_at)) = row else {
        return Err(not_found(source, event_id));
    };
    let open_jobs: i64 = conn
        .prepare_cached(
            "SELECT count(*) FROM jobs WHERE source = ?1 AND event_id = ?2
               AND status IN ('pending', 'processing', 'paused', 'failed')",
        )?
        .query_row(params![source, event_id], |r| r.get(0))?;
    Ok(json!({
        "source": source,
        "event_id": event_id,
        "state": state,
        "payload_bytes": payload_bytes,
        "headers": has_headers,
        "erased_at": erased_at.map(ms_to_secs),
        "open_jobs": open_jobs,
    }))
}

/// Erases the body and headers in the caller's write transaction. The
/// first erasure's time is kept.
pub fn erase(conn: &Connection, source: &str, event_id: &str, now: i64) -> Result<Value, OpError> {
    let before = describe(conn, source, event_id)?;
    conn.prepare_cached(
        "UPDATE events SET payload = NULL, headers = NULL, erased_at = coalesce(erased_at, ?3)
         WHERE source = ?1 AND event_id = ?2",
    )?
    .execute(params![source, event_id, now])?;
    conn.prepare_cached(
        "DELETE FROM incident_payloads WHERE incident_id IN
             (SELECT id FROM incidents WHERE source = ?1 AND event_id = ?2)",
    )?
    .execute(params![source, event_id])?;
    let mut out = describe(conn, source, event_id)?;
    out["erased_bytes"] = before["payload_bytes"].clone();
    Ok(out)
}

pub fn cmd(config: &Config, source: &str, event_id: &str, yes: bool) -> Result<ExitCode> {
    let name = format!("{}/{}", clean(source), clean(event_id));
    if !yes {
        let conn = open_read(config)?;
        let d = match describe(&conn, source, event_id) {
            Ok(d) => d,
            Err(e) => return finish(Err(e)),
        };
        if let (Value::Null, Some(at)) = (&d["payload_bytes"], d["erased_at"].as_i64()) {
            println!(
                "{name}: the body and headers were already erased at {}; nothing to do",
                fmt_time(at)
            );
            return Ok(ExitCode::SUCCESS);
        }
        println!(
            "{name} (state {}): would drop the stored body ({} bytes) and headers",
            d["state"].as_str().unwrap_or(""),
            d["payload_bytes"].as_i64().unwrap_or(0)
        );
        println!("the key and payload hash stay, so a redelivery is still answered as a duplicate");
        warn_open_jobs(&d);
        println!("nothing changed: run again with --yes to erase");
        return Ok(ExitCode::SUCCESS);
    }
    let mut conn = open_write(config)?;
    let result = (|| -> Result<Value, OpError> {
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let out = erase(&tx, source, event_id, now_ms())?;
        tx.commit()?;
        Ok(out)
    })();
    let d = match result {
        Ok(d) => d,
        Err(e) => return finish(Err(e)),
    };
    println!(
        "erased {name}: dropped the body ({} bytes) and headers; the key and payload hash are kept",
        d["erased_bytes"].as_i64().unwrap_or(0)
    );
    warn_open_jobs(&d);
    Ok(ExitCode::SUCCESS)
}

fn warn_open_jobs(d: &Value) {
    let open = d["open_jobs"].as_i64().unwrap_or(0);
    if open > 0 {
        println!(
            "note: {open} job(s) of this event are not done; without the body they cannot be replayed or forwarded"
        );
    }
}
