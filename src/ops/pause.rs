//! `idemhook pause SOURCE/ACTION` and `resume`, and the admin API's pause
//! and resume routes: a paused forward action keeps accepting events, and
//! its jobs wait as 'paused' (the claim writes new ones that way) until it
//! is resumed. Owns the `paused_actions` table's writes.

use std::process::ExitCode;

use anyhow::Result;
use serde_json::{Value, json};

use super::inspect::{OpError, finish, open_db_write};
use super::text::clean;
use crate::args;
use crate::config::{ActionKind, Config};
use crate::store::db::Db;
use crate::store::now_ms;

/// Splits `SOURCE/ACTION`; [`pause`] and [`resume`] check it against the config.
pub fn parse_target(target: &str) -> Result<(String, String), OpError> {
    let Some((source, action)) = target.split_once('/') else {
        return Err(OpError::Invalid(format!(
            "expected SOURCE/ACTION, e.g. stripe/notify-app, got {}",
            clean(target)
        )));
    };
    Ok((source.to_string(), action.to_string()))
}

/// The action must be a forward action of a configured source: SQL actions
/// run inside the claim transaction, so there is nothing to hold back.
fn check(config: &Config, source: &str, action: &str) -> Result<(), OpError> {
    let Some(src) = config.source(source) else {
        return Err(OpError::NotFound(format!(
            "source {} is not in the config",
            clean(source)
        )));
    };
    let Some(a) = src.action(action) else {
        return Err(OpError::NotFound(format!(
            "source {} has no action {} in the config",
            clean(source),
            clean(action)
        )));
    };
    if matches!(a.kind, ActionKind::Sql { .. }) {
        return Err(OpError::Invalid(format!(
            "{}/{} is an sql action: it runs inside the claim transaction and cannot be paused",
            clean(source),
            clean(action)
        )));
    }
    Ok(())
}

/// Pauses an action in the caller's write transaction: records it and
/// turns its pending jobs to 'paused'. Jobs in flight finish their attempt.
pub fn pause(
    db: &Db<'_>,
    config: &Config,
    source: &str,
    action: &str,
    now: i64,
) -> Result<Value, OpError> {
    check(config, source, action)?;
    let inserted = db.execute(
        "INSERT INTO paused_actions (source, action, paused_at) VALUES (?1, ?2, ?3)
         ON CONFLICT DO NOTHING",
        args![source, action, now],
    )?;
    // Conditional on the status, so a job a worker of any instance holds
    // (processing) is left to finish its attempt.
    let jobs = db.execute(
        "UPDATE jobs SET status = 'paused', updated_at = ?3
         WHERE source = ?1 AND action = ?2 AND status = 'pending'",
        args![source, action, now],
    )?;
    Ok(json!({
        "source": source,
        "action": action,
        "paused": true,
        "was_paused": inserted == 0,
        "jobs_paused": jobs,
    }))
}

/// Resumes an action in the caller's write transaction: forgets the pause
/// and makes its paused jobs due now.
pub fn resume(
    db: &Db<'_>,
    config: &Config,
    source: &str,
    action: &str,
    now: i64,
) -> Result<Value, OpError> {
    let was_paused = db
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM paused_actions WHERE source = ?1 AND action = ?2)",
            args![source, action],
        )?
        .bool(0)?;
    // An action paused and then removed from the config can still be resumed.
    if !was_paused {
        check(config, source, action)?;
    }
    db.execute(
        "DELETE FROM paused_actions WHERE source = ?1 AND action = ?2",
        args![source, action],
    )?;
    let jobs = db.execute(
        "UPDATE jobs SET status = 'pending', next_attempt_at = ?3, updated_at = ?3
         WHERE source = ?1 AND action = ?2 AND status = 'paused'",
        args![source, action, now],
    )?;
    Ok(json!({
        "source": source,
        "action": action,
        "paused": false,
        "was_paused": was_paused,
        "jobs_resumed": jobs,
    }))
}

pub fn cmd(config: &Config, target: &str, pausing: bool) -> Result<ExitCode> {
    let (source, action) = match parse_target(target) {
        Ok(t) => t,
        Err(e) => return finish(Err(e)),
    };
    let mut handle = open_db_write(config)?;
    let result = handle.write(|db| {
        if pausing {
            pause(db, config, &source, &action, now_ms())
        } else {
            resume(db, config, &source, &action, now_ms())
        }
    });
    let out = match result {
        Ok(v) => v,
        Err(e) => return finish(Err(e)),
    };
    let name = format!("{}/{}", clean(&source), clean(&action));
    if pausing {
        let already = if out["was_paused"].as_bool() == Some(true) {
            " (it already was)"
        } else {
            ""
        };
        println!(
            "paused {name}{already}: {} pending job(s) now wait; events are still accepted and their jobs wait too",
            out["jobs_paused"]
        );
        println!("resume with: idemhook resume {name}");
    } else if out["was_paused"].as_bool() == Some(true) {
        println!(
            "resumed {name}: {} job(s) due now; the forward workers pick them up when they next poll",
            out["jobs_resumed"]
        );
    } else {
        println!(
            "{name} was not paused; {} waiting job(s) made due",
            out["jobs_resumed"]
        );
    }
    Ok(ExitCode::SUCCESS)
}
