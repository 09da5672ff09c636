//! `idemhook pause SOURCE/ACTION` and `resume`, and the admin API's pause
//! and resume routes: a paused forward action keeps accepting events, and
//! its jobs wait as 'paused' (the claim writes new ones that way) until it
//! is resumed. Decides what may pause; the rows are `store::paused`'s.

use std::io::Write as _;

use serde_json::{Value, json};

use super::command::{CommandError, Outcome};
use super::error::OpError;
use super::open;
use super::text::{clean, stdout};
use crate::config::{ActionKind, Config};
use crate::store::db::Db;
use crate::store::paused;
use crate::time::now_ms;

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
fn known_action(config: &Config, source: &str, action: &str) -> Result<(), OpError> {
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
    known_action(config, source, action)?;
    paused::hold_back_claims(db)?;
    let (was_paused, jobs) = paused::pause(db, source, action, now)?;
    Ok(json!({
        "source": source,
        "action": action,
        "paused": true,
        "was_paused": was_paused,
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
    paused::hold_back_claims(db)?;
    let was_paused = paused::is_paused(db, source, action)?;
    // An action paused and then removed from the config can still be resumed.
    if !was_paused {
        known_action(config, source, action)?;
    }
    let jobs = paused::resume(db, source, action, now)?;
    Ok(json!({
        "source": source,
        "action": action,
        "paused": false,
        "was_paused": was_paused,
        "jobs_resumed": jobs,
    }))
}

/// `idemhook pause` (`pausing`) and `idemhook resume`.
pub fn cmd(config: &Config, target: &str, pausing: bool) -> Result<Outcome, CommandError> {
    let (source, action) = parse_target(target)?;
    let changed = open::write(config, |db| {
        if pausing {
            pause(db, config, &source, &action, now_ms())
        } else {
            resume(db, config, &source, &action, now_ms())
        }
    })??;
    let name = format!("{}/{}", clean(&source), clean(&action));
    let mut out = stdout();
    if pausing {
        let already = if changed["was_paused"].as_bool() == Some(true) {
            " (it already was)"
        } else {
            ""
        };
        writeln!(
            out,
            "paused {name}{already}: {} pending job(s) now wait; events are still accepted and their jobs wait too",
            changed["jobs_paused"]
        )?;
        writeln!(out, "resume with: idemhook resume {name}")?;
    } else if changed["was_paused"].as_bool() == Some(true) {
        writeln!(
            out,
            "resumed {name}: {} job(s) due now; the forward workers pick them up when they next poll",
            changed["jobs_resumed"]
        )?;
    } else {
        writeln!(
            out,
            "{name} was not paused; {} waiting job(s) made due",
            changed["jobs_resumed"]
        )?;
    }
    Ok(Outcome::Done)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::pg_cluster;
    use crate::store::postgres::db::pg_write;
    use std::path::Path;
    use std::time::{Duration, Instant};

    const CONFIG: &str = r#"
[sources.s]
kind = "none"
allow_unsigned = true
key = ["json:/id"]
[[sources.s.actions]]
name = "notify"
forward = "http://127.0.0.1:9/"
"#;

    /// On PostgreSQL, a claim that read `paused_actions` before a pause and
    /// commits its pending job after it: the pause waits for it and pauses
    /// that job too (and new claims wait for the pause).
    #[test]
    fn a_pause_waits_for_claims_that_read_it_was_not_paused() {
        let Some(cluster) = pg_cluster::cluster() else {
            pg_cluster::skipped("a_pause_waits_for_claims_that_read_it_was_not_paused");
            return;
        };
        let url = cluster.create_database("pause_waits_for_claims");
        let config = Config::parse(CONFIG, "unit", Path::new("/"), None).unwrap();
        let mut watcher = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        crate::store::postgres::migrate(&mut watcher, crate::config::database_url::DEFAULT_SCHEMA)
            .unwrap();
        // A claim half done: it has read that the action is not paused.
        let mut claim = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        claim
            .batch_execute(
                "BEGIN;
                 SELECT 1 FROM paused_actions WHERE source = 's' AND action = 'notify'",
            )
            .unwrap();
        let pausing = std::thread::spawn(move || {
            let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
            pg_write(&mut c, |db| pause(db, &config, "s", "notify", 10)).unwrap()
        });
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let waiting: i64 = watcher
                .query_one("SELECT count(*) FROM pg_locks WHERE NOT granted", &[])
                .unwrap()
                .get(0);
            if waiting > 0 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the pause did not wait for the claim"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        // The claim writes its job as pending, as it decided, and commits.
        claim
            .batch_execute(
                "INSERT INTO jobs (source, event_id, action, kind, status, next_attempt_at, created_at, updated_at)
                 VALUES ('s', 'e', 'notify', 'forward', 'pending', 1, 1, 1);
                 COMMIT",
            )
            .unwrap();
        let out = pausing.join().unwrap();
        assert_eq!(out["jobs_paused"], 1, "{out}");
        let status: String = watcher
            .query_one("SELECT status FROM jobs", &[])
            .unwrap()
            .get(0);
        assert_eq!(status, "paused");
    }
}
