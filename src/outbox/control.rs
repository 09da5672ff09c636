//! Delivery control, the decisions the take makes for a forward action
//! with `concurrency`, `rate`, `order` or `supersede`, written once over
//! the open transaction's `store::db::Db` (the same SQL on both backends):
//!
//! - **order**: a job of an order key is taken only when no earlier job of
//!   its key is unfinished (pending, processing, failed, paused); else it
//!   waits with no due time (`waiting = 'order'`) until the trigger
//!   `jobs_release_order` makes the next one due as one finishes. A failed
//!   job releases nothing: it holds its key.
//! - **concurrency**: the action's leases still running are counted, under
//!   the lock of its `action_limits` row, so instances that take at once
//!   take one after another; at the limit the job waits (`concurrency`)
//!   until a completion of the action makes the longest-waiting one due.
//! - **rate**: a bucket of attempt starts in that row holding one start,
//!   refilled at the rate: starts are at least 1/N of the period apart, so
//!   no period (a second, a minute) ever holds more than N of them, not
//!   even the first; empty, the job waits (`rate`) until it refills.
//! - **supersede**: before a job of an order key is sent, its value is
//!   compared with the highest delivered for its key (`order_marks`,
//!   written with each completion); a lower one ends `superseded`.
//!
//! Waiting is not an attempt: none of these counts against `max_attempts`.

use crate::args;
use crate::config::{Control, Forward};
use crate::state::AttemptOutcome;
use crate::store::StoreError;
use crate::store::db::Dialect;
use crate::store::tx::{AttemptRow, OutboxTx, order_open};

/// What the limits let a take do now.
pub(super) enum Slot {
    Go,
    /// Wait for `reason` ("concurrency" or "rate") until `until`.
    Wait {
        reason: &'static str,
        until: i64,
    },
}

/// How long a job waiting for a concurrency slot waits at most before it
/// is looked at again (a completion of its action makes it due sooner).
const SLOT_RECHECK_MS: i64 = 1_000;

/// The job's order key and place, when it has one.
fn order_place<T: OutboxTx>(
    tx: &mut T,
    job_id: i64,
) -> Result<Option<(String, String, String, i64)>, StoreError> {
    let row = tx.db().query_opt(
        "SELECT source, action, order_key, order_seq FROM jobs WHERE id = ?1 AND order_key IS NOT NULL",
        args![job_id],
    )?;
    row.map(|r| {
        Ok((
            r.string(0)?,
            r.string(1)?,
            r.string(2)?,
            r.opt_i64(3)?.unwrap_or(0),
        ))
    })
    .transpose()
}

/// True when an earlier job of this job's order key is unfinished.
pub(super) fn behind_in_order<T: OutboxTx>(tx: &mut T, job_id: i64) -> Result<bool, StoreError> {
    let Some((source, action, key, seq)) = order_place(tx, job_id)? else {
        return Ok(false);
    };
    // The nearest earlier unfinished job, locked on PostgreSQL: one that a
    // transaction is finishing right now is waited for and then seen
    // finished, so this job is never parked after the trigger that would
    // have made it due has already run.
    let db = tx.db();
    let lock = match db.dialect() {
        Dialect::Sqlite => "",
        Dialect::Postgres => " FOR UPDATE",
    };
    Ok(db
        .query_opt(
            &behind_sql(lock),
            args![source.as_str(), action.as_str(), key.as_str(), seq, job_id],
        )?
        .is_some())
}

/// The nearest earlier unfinished job of an order key (?1 source, ?2
/// action, ?3 key) than the job at (?4 order_seq, ?5 id): one step down the
/// `jobs_order` index.
fn behind_sql(lock: &str) -> String {
    format!(
        "SELECT id FROM jobs WHERE {}
            AND (order_seq < ?4 OR (order_seq = ?4 AND id < ?5))
          ORDER BY order_seq DESC, id DESC LIMIT 1{lock}",
        order_open("?1", "?2", "?3")
    )
}

/// An action's attempts in flight (?1 source, ?2 action, ?3 now).
const IN_FLIGHT: &str = "SELECT count(*) FROM jobs
  WHERE source = ?1 AND action = ?2 AND status = 'processing' AND lease_until >= ?3";

/// A pending job waits: for `reason`, due again at `until` (None: when a
/// trigger or a completion makes it due).
pub(super) fn wait<T: OutboxTx>(
    tx: &mut T,
    job_id: i64,
    n_attempts: i64,
    reason: &str,
    until: Option<i64>,
    now: i64,
) -> Result<(), StoreError> {
    tx.db().execute(
        "UPDATE jobs SET next_attempt_at = ?4, waiting = ?3, updated_at = ?5
          WHERE id = ?1 AND n_attempts = ?2 AND status = 'pending'",
        args![job_id, n_attempts, reason, until, now],
    )?;
    Ok(())
}

/// Asks the action's limits for one attempt start now; a `Go` has taken
/// its rate token.
pub(super) fn take_slot<T: OutboxTx>(
    tx: &mut T,
    source: &str,
    action: &str,
    control: &Control,
    now: i64,
) -> Result<Slot, StoreError> {
    let db = tx.db();
    let full = 1.0;
    db.execute(
        "INSERT INTO action_limits (source, action, tokens, refilled_at) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (source, action) DO NOTHING",
        args![source, action, crate::store::db::Value::Real(full), now],
    )?;
    // The row's lock, until this take commits: takes of the action on
    // every instance go one at a time from here (and, at READ COMMITTED,
    // each statement below sees what the one before committed).
    let lock = match db.dialect() {
        Dialect::Sqlite => "",
        Dialect::Postgres => " FOR UPDATE",
    };
    let row = db.query_one(
        &format!(
            "SELECT tokens, refilled_at FROM action_limits WHERE source = ?1 AND action = ?2{lock}"
        ),
        args![source, action],
    )?;
    let (tokens, refilled_at) = (row.f64(0)?, row.i64(1)?);
    if let Some(limit) = control.concurrency {
        let in_flight = db
            .query_one(IN_FLIGHT, args![source, action, now])?
            .i64(0)?;
        if in_flight >= i64::from(limit) {
            return Ok(Slot::Wait {
                reason: "concurrency",
                until: now + SLOT_RECHECK_MS,
            });
        }
    }
    if let Some(rate) = control.rate {
        // A little longer than N per period: an attempt starts a moment
        // after its take, and not always the same moment after.
        let interval = rate.interval_ms() * 1.02;
        let elapsed = (now - refilled_at).max(0) as f64;
        let tokens = (tokens + elapsed / interval).min(full);
        if tokens < 1.0 {
            let until = now + ((1.0 - tokens) * interval).ceil() as i64;
            db.execute(
                "UPDATE action_limits SET tokens = ?3, refilled_at = ?4 WHERE source = ?1 AND action = ?2",
                args![source, action, crate::store::db::Value::Real(tokens), now],
            )?;
            return Ok(Slot::Wait {
                reason: "rate",
                until: until.max(now + 1),
            });
        }
        db.execute(
            "UPDATE action_limits SET tokens = ?3, refilled_at = ?4 WHERE source = ?1 AND action = ?2",
            args![source, action, crate::store::db::Value::Real(tokens - 1.0), now],
        )?;
    }
    Ok(Slot::Go)
}

/// After an attempt of a concurrency-limited action ended: the job that
/// has waited longest for a slot of it is due now.
pub(super) fn release_slot<T: OutboxTx>(
    tx: &mut T,
    source: &str,
    action: &str,
    now: i64,
) -> Result<(), StoreError> {
    tx.db().execute(
        "UPDATE jobs SET next_attempt_at = ?3, waiting = NULL
          WHERE id = (SELECT id FROM jobs
                       WHERE source = ?1 AND action = ?2 AND status = 'pending'
                         AND waiting = 'concurrency'
                       ORDER BY next_attempt_at, id LIMIT 1)",
        args![source, action, now],
    )?;
    Ok(())
}

/// A `supersede` value as compared: a number, or an RFC 3339 / ISO 8601
/// time (as unix seconds with a fraction), else not comparable.
fn comparable(text: &str) -> Option<f64> {
    if let Ok(n) = text.trim().parse::<f64>() {
        return n.is_finite().then_some(n);
    }
    let secs = crate::time::parse_rfc3339(text.trim())?;
    let fraction = text
        .split_once('.')
        .map(|(_, f)| {
            let digits: String = f.chars().take_while(char::is_ascii_digit).collect();
            format!("0.{digits}").parse::<f64>().unwrap_or(0.0)
        })
        .unwrap_or(0.0);
    Some(secs as f64 + fraction)
}

/// The job's `supersede` value in its event's body.
fn supersede_value(fwd: &Forward, body: &[u8]) -> Option<String> {
    let part = fwd.control.supersede.as_ref()?;
    let doc = crate::key::RawDoc::parse(std::str::from_utf8(body).ok()?).ok()?;
    let input = crate::key::Input {
        json: Some(crate::key::Json::Raw(&doc)),
        body,
        ..Default::default()
    };
    part.text(&input)
}

/// True when a job of an order key, just leased (attempt `n_before + 1`),
/// carries a `supersede` value lower than the highest already delivered
/// for its key: it is ended `superseded`,
/// with an attempt (ok, error kind `superseded`), and not sent. A job an
/// operator replayed is sent anyway.
pub(super) fn supersede_if_older<T: OutboxTx>(
    tx: &mut T,
    fwd: &Forward,
    job_id: i64,
    n_before: i64,
    body: &[u8],
    now: i64,
) -> Result<bool, StoreError> {
    if fwd.control.supersede.is_none() || tx.latest_replay_from(job_id)?.is_some() {
        return Ok(false);
    }
    let Some((source, action, key, _)) = order_place(tx, job_id)? else {
        return Ok(false);
    };
    let Some(value) = supersede_value(fwd, body) else {
        return Ok(false);
    };
    let mark = tx
        .db()
        .query_opt(
            "SELECT value FROM order_marks WHERE source = ?1 AND action = ?2 AND order_key = ?3",
            args![source.as_str(), action.as_str(), key.as_str()],
        )?
        .map(|r| r.string(0))
        .transpose()?;
    let older = match (comparable(&value), mark.as_deref().and_then(comparable)) {
        (Some(v), Some(m)) => v < m,
        _ => false,
    };
    if !older {
        return Ok(false);
    }
    let changed = tx.db().execute(
        "UPDATE jobs SET status = 'superseded', next_attempt_at = NULL,
                waiting = NULL, lease_owner = NULL, lease_until = NULL, last_error = NULL,
                updated_at = ?3
          WHERE id = ?1 AND n_attempts = ?2 AND status = 'processing'",
        args![job_id, n_before + 1, now],
    )?;
    if changed == 0 {
        return Ok(false);
    }
    let detail = format!(
        "superseded: its value {value} is lower than {} already delivered for its order key",
        mark.unwrap_or_default()
    );
    tx.put_attempt(&AttemptRow {
        job_id,
        n: n_before + 1,
        started_at: now,
        finished_at: now,
        outcome: AttemptOutcome::Ok.as_str(),
        http_status: None,
        error: Some(&detail),
        error_kind: Some("superseded"),
        request_id: None,
        response_head: None,
        worker: "take",
    })?;
    Ok(true)
}

/// After a job of an order key was delivered: its `supersede` value is
/// the key's mark when higher than the one there.
pub(super) fn mark_delivered<T: OutboxTx>(
    tx: &mut T,
    fwd: &Forward,
    job_id: i64,
    body: &[u8],
) -> Result<(), StoreError> {
    if fwd.control.supersede.is_none() {
        return Ok(());
    }
    let Some((source, action, key, _)) = order_place(tx, job_id)? else {
        return Ok(());
    };
    let Some(value) = supersede_value(fwd, body) else {
        return Ok(());
    };
    let Some(new) = comparable(&value) else {
        return Ok(());
    };
    let db = tx.db();
    let mark = db
        .query_opt(
            "SELECT value FROM order_marks WHERE source = ?1 AND action = ?2 AND order_key = ?3",
            args![source.as_str(), action.as_str(), key.as_str()],
        )?
        .map(|r| r.string(0))
        .transpose()?;
    if mark
        .as_deref()
        .and_then(comparable)
        .is_some_and(|m| m >= new)
    {
        return Ok(());
    }
    db.execute(
        "INSERT INTO order_marks (source, action, order_key, value) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (source, action, order_key) DO UPDATE SET value = excluded.value",
        args![
            source.as_str(),
            action.as_str(),
            key.as_str(),
            value.as_str()
        ],
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{self, query_plan};
    use rusqlite::params;

    /// The lookups of delivery control go down their indexes, so they
    /// cost the same with a million pending jobs of one hot key: no scan
    /// of `jobs` in any of them.
    #[test]
    fn order_and_limits_lookups_use_their_indexes() {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = store::open(
            &dir.path().join("plan.db"),
            crate::config::Durability::Normal,
            std::time::Duration::from_secs(5),
        )
        .unwrap();
        store::migrate(&mut conn).unwrap();
        let behind = query_plan(&conn, &behind_sql(""), params!["s", "a", "k", 5, 9]);
        assert!(behind.contains("INDEX jobs_order"), "{behind}");
        let insert = crate::store::tx::ordered_job_insert();
        let insert = query_plan(
            &conn,
            &insert,
            params![
                "s",
                "e",
                "a",
                "forward",
                "pending",
                0,
                1,
                None::<String>,
                1,
                "k"
            ],
        );
        assert!(insert.contains("INDEX jobs_order"), "{insert}");
        let in_flight = query_plan(&conn, IN_FLIGHT, params!["s", "a", 1]);
        assert!(in_flight.contains("INDEX jobs_in_flight"), "{in_flight}");
        for plan in [behind, insert, in_flight] {
            assert!(!plan.contains("SCAN jobs"), "{plan}");
        }
    }

    #[test]
    fn supersede_values_compare_as_numbers_or_times() {
        assert!(comparable("2").unwrap() < comparable("10").unwrap());
        assert!(
            comparable("2026-01-01T00:00:00Z").unwrap()
                < comparable("2026-01-01T00:00:00.5Z").unwrap()
        );
        assert!(
            comparable("2026-01-01T01:00:00+02:00").unwrap()
                < comparable("2026-01-01T00:00:00Z").unwrap()
        );
        assert_eq!(comparable("soon"), None);
    }
}
