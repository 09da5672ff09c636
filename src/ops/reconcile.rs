//! `idemhook reconcile` and `GET /api/reconcile`: what needs an operator.
//! Jobs processing past their lease (a worker died holding them), pending
//! jobs overdue by more than [`OVERDUE_AFTER_MS`] (no worker is taking
//! them), failed jobs (dead letters waiting for a replay) and paused
//! actions with waiting jobs. Exit 0 when clean, 1 when anything needs
//! attention, so cron or a monitor can run it. Reads only.

use std::fmt::Write as _;
use std::process::ExitCode;

use anyhow::Result;
use rusqlite::{Connection, params};
use serde_json::{Value, json};

use super::inspect::{OpError, cell, finish, fmt_json_time, open_read};
use crate::config::Config;
use crate::store::{ms_to_secs, now_ms};

/// A pending job this far past its due time counts as overdue.
pub const OVERDUE_AFTER_MS: i64 = 60_000;
/// The most items listed per kind; the counts are always complete.
pub const LIST_LIMIT: i64 = 500;

fn secs(ms: Option<i64>) -> Value {
    ms.map_or(Value::Null, |ms| json!(ms_to_secs(ms)))
}

/// The report: `{"clean", "stuck", "overdue", "failed", "paused", "counts"}`.
pub fn reconcile(conn: &Connection, now: i64) -> Result<Value, OpError> {
    let job = |r: &rusqlite::Row<'_>| -> rusqlite::Result<Value> {
        Ok(json!({
            "source": r.get::<_, String>(0)?,
            "event_id": r.get::<_, String>(1)?,
            "action": r.get::<_, String>(2)?,
            "kind": r.get::<_, String>(3)?,
            "status": r.get::<_, String>(4)?,
            "attempts": r.get::<_, i64>(5)?,
            "lease_owner": r.get::<_, Option<String>>(6)?,
            "lease_until": secs(r.get(7)?),
            "next_attempt_at": secs(r.get(8)?),
            "last_error": r.get::<_, Option<String>>(9)?,
            "updated_at": secs(r.get(10)?),
        }))
    };
    let columns = "source, event_id, action, kind, status, n_attempts, lease_owner, lease_until, \
                   next_attempt_at, last_error, updated_at";
    let stuck_where = "status = 'processing' AND coalesce(lease_until, 0) < ?1";
    let overdue_where = "status = 'pending' AND coalesce(next_attempt_at, created_at) < ?1";
    // Every clause takes ?1 so the three queries bind alike.
    let failed_where = "status = 'failed' AND ?1 = ?1";

    let mut lists = Vec::new();
    let mut counts = Vec::new();
    for (name, clause, order, at) in [
        ("stuck", stuck_where, "lease_until", now),
        (
            "overdue",
            overdue_where,
            "next_attempt_at",
            now - OVERDUE_AFTER_MS,
        ),
        ("failed", failed_where, "updated_at DESC", now),
    ] {
        let items = conn
            .prepare(&format!(
                "SELECT {columns} FROM jobs WHERE {clause} ORDER BY {order} LIMIT ?2"
            ))?
            .query_map(params![at, LIST_LIMIT], job)?
            .collect::<Result<Vec<_>, _>>()?;
        let n: i64 = conn
            .prepare(&format!("SELECT count(*) FROM jobs WHERE {clause}"))?
            .query_row([at], |r| r.get(0))?;
        lists.push((name, Value::Array(items)));
        counts.push((name, n));
    }
    let paused = conn
        .prepare(
            "SELECT p.source, p.action, p.paused_at, count(j.id) FROM paused_actions p
             JOIN jobs j ON j.source = p.source AND j.action = p.action AND j.status = 'paused'
             GROUP BY p.source, p.action ORDER BY p.paused_at",
        )?
        .query_map([], |r| {
            Ok(json!({
                "source": r.get::<_, String>(0)?,
                "action": r.get::<_, String>(1)?,
                "paused_at": ms_to_secs(r.get::<_, i64>(2)?),
                "waiting": r.get::<_, i64>(3)?,
            }))
        })?
        .collect::<Result<Vec<_>, _>>()?;
    counts.push(("paused", paused.len() as i64));
    lists.push(("paused", Value::Array(paused)));

    let clean = counts.iter().all(|(_, n)| *n == 0);
    let mut out = json!({ "clean": clean });
    for (name, list) in lists {
        out[name] = list;
    }
    out["counts"] = Value::Object(
        counts
            .into_iter()
            .map(|(name, n)| (name.to_string(), json!(n)))
            .collect(),
    );
    Ok(out)
}

fn render(report: &Value) -> String {
    let mut out = String::new();
    let counts = &report["counts"];
    if report["clean"].as_bool() == Some(true) {
        let _ = writeln!(
            out,
            "clean: no stuck, overdue or failed jobs and no paused action has waiting jobs"
        );
        return out;
    }
    let sections = [
        (
            "stuck",
            "processing past their lease (a worker stopped holding them; another takes them over)",
        ),
        (
            "overdue",
            "pending more than 60s past due (are the forward workers running? forward_workers > 0?)",
        ),
        ("failed", "failed: fix the cause, then replay"),
    ];
    for (name, what) in sections {
        let _ = writeln!(out, "{name}: {} {what}", counts[name]);
        for j in report[name]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
        {
            let mut line = format!(
                "  {}/{}  {} ({})  {} attempt(s)",
                cell(&j["source"]),
                cell(&j["event_id"]),
                cell(&j["action"]),
                cell(&j["kind"]),
                cell(&j["attempts"]),
            );
            match name {
                "stuck" => {
                    let _ = write!(
                        line,
                        "  lease {} until {}",
                        cell(&j["lease_owner"]),
                        fmt_json_time(&j["lease_until"])
                    );
                }
                "overdue" => {
                    let _ = write!(line, "  due {}", fmt_json_time(&j["next_attempt_at"]));
                }
                _ => {
                    let _ = write!(
                        line,
                        "  at {}  {}",
                        fmt_json_time(&j["updated_at"]),
                        cell(&j["last_error"])
                    );
                }
            }
            let _ = writeln!(out, "{line}");
        }
    }
    let _ = writeln!(
        out,
        "paused: {} action(s) with waiting jobs",
        counts["paused"]
    );
    for p in report["paused"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        let _ = writeln!(
            out,
            "  {}/{}  paused {}  {} job(s) waiting: idemhook resume {}/{}",
            cell(&p["source"]),
            cell(&p["action"]),
            fmt_json_time(&p["paused_at"]),
            cell(&p["waiting"]),
            cell(&p["source"]),
            cell(&p["action"]),
        );
    }
    if counts["failed"].as_i64().unwrap_or(0) > 0 {
        let _ = writeln!(
            out,
            "next: idemhook events show SOURCE EVENT_ID; after the fix, idemhook replay --source S --status failed --yes"
        );
    }
    out
}

pub fn cmd(config: &Config, json: bool) -> Result<ExitCode> {
    let conn = open_read(config)?;
    let report = match reconcile(&conn, now_ms()) {
        Ok(r) => r,
        Err(e) => return finish(Err(e)),
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", render(&report));
    }
    Ok(if report["clean"].as_bool() == Some(true) {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
