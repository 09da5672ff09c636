//! `idemhook erase SOURCE EVENT_ID [--yes]`: drop an event's stored body
//! and headers, and the kept bodies of its mismatched duplicates (a
//! personal-data request), and keep its key and payload hash, so a
//! redelivery is still recognised as a duplicate. Without `--yes` it only
//! prints what it would do.

use std::io::{self, Write};

use serde_json::{Value, json};

use super::command::{CommandError, Outcome};
use super::error::{OpError, not_found};
use super::open;
use super::text::{clean, fmt_time, stdout};
use crate::config::Config;
use crate::state::JobStatus;
use crate::store::db::Db;
use crate::store::{events, incidents, jobs};
use crate::time::{ms_to_secs, now_ms};

/// The jobs that still need the body (a failed one, to be replayed).
const NOT_DONE: [JobStatus; 4] = [
    JobStatus::Pending,
    JobStatus::Processing,
    JobStatus::Paused,
    JobStatus::Failed,
];

/// What is stored for the event and what erasing it would touch.
pub fn describe(db: &Db<'_>, source: &str, event_id: &str) -> Result<Value, OpError> {
    let Some(size) = events::size(db, source, event_id)? else {
        return Err(not_found(source, event_id));
    };
    let open_jobs = jobs::count_of_event(db, source, event_id, &NOT_DONE)?;
    Ok(json!({
        "source": source,
        "event_id": event_id,
        "state": size.state,
        "payload_bytes": size.payload_bytes,
        "headers": size.has_headers,
        "erased_at": size.erased_at.map(ms_to_secs),
        "open_jobs": open_jobs,
    }))
}

/// Erases the body and headers in the caller's write transaction. The
/// first erasure's time is kept.
pub fn erase(db: &Db<'_>, source: &str, event_id: &str, now: i64) -> Result<Value, OpError> {
    // The row is locked before it is described, so the bytes reported
    // are the bytes dropped.
    events::lock(db, source, event_id)?;
    let before = describe(db, source, event_id)?;
    events::erase(db, source, event_id, now)?;
    incidents::drop_payloads(db, source, event_id)?;
    let mut out = describe(db, source, event_id)?;
    out["erased_bytes"] = before["payload_bytes"].clone();
    Ok(out)
}

/// `idemhook erase`: what it would drop, or (`yes`) what it dropped.
pub fn cmd(
    config: &Config,
    source: &str,
    event_id: &str,
    yes: bool,
) -> Result<Outcome, CommandError> {
    let mut out = stdout();
    let name = format!("{}/{}", clean(source), clean(event_id));
    if !yes {
        let d = open::read(config, |db| describe(db, source, event_id))??;
        if let (Value::Null, Some(at)) = (&d["payload_bytes"], d["erased_at"].as_i64()) {
            writeln!(
                out,
                "{name}: the body and headers were already erased at {}; nothing to do",
                fmt_time(at)
            )?;
            return Ok(Outcome::Done);
        }
        writeln!(
            out,
            "{name} (state {}): would drop the stored body ({} bytes) and headers",
            d["state"].as_str().unwrap_or(""),
            d["payload_bytes"].as_i64().unwrap_or(0)
        )?;
        writeln!(
            out,
            "the key and payload hash stay, so a redelivery is still answered as a duplicate"
        )?;
        warn_open_jobs(&mut out, &d)?;
        writeln!(out, "nothing changed: run again with --yes to erase")?;
        return Ok(Outcome::Done);
    }
    let d = open::write(config, |db| erase(db, source, event_id, now_ms()))??;
    writeln!(
        out,
        "erased {name}: dropped the body ({} bytes) and headers; the key and payload hash are kept",
        d["erased_bytes"].as_i64().unwrap_or(0)
    )?;
    warn_open_jobs(&mut out, &d)?;
    Ok(Outcome::Done)
}

fn warn_open_jobs(out: &mut impl Write, d: &Value) -> io::Result<()> {
    let open = d["open_jobs"].as_i64().unwrap_or(0);
    if open > 0 {
        writeln!(
            out,
            "note: {open} job(s) of this event are not done; without the body they cannot be replayed or forwarded"
        )?;
    }
    Ok(())
}
