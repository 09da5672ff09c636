//! Delivery control, the decisions the take makes for a forward action
//! with `concurrency`, `rate`, `order` or `supersede`, over the storage
//! steps of `store::control` (one SQL text for both backends):
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

use crate::config::{Control, Forward};
use crate::state::AttemptOutcome;
use crate::store::StoreError;
use crate::store::control as steps;
use crate::store::tx::{NewAttempt, OutboxTx};

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

/// True when an earlier job of this job's order key is unfinished.
pub(super) fn behind_in_order<T: OutboxTx>(tx: &mut T, job_id: i64) -> Result<bool, StoreError> {
    let db = tx.db();
    match steps::order_place(&db, job_id)? {
        Some(place) => steps::earlier_unfinished(&db, &place, job_id),
        None => Ok(false),
    }
}

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
    steps::wait(&tx.db(), job_id, n_attempts, reason, until, now)
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
    let (tokens, refilled_at) = steps::limits_locked(&db, source, action, full, now)?;
    if let Some(limit) = control.concurrency
        && steps::in_flight(&db, source, action, now)? >= i64::from(limit)
    {
        return Ok(Slot::Wait {
            reason: "concurrency",
            until: now + SLOT_RECHECK_MS,
        });
    }
    if let Some(rate) = control.rate {
        // A little longer than N per period: an attempt starts a moment
        // after its take, and not always the same moment after.
        let interval = rate.interval_ms() * 1.02;
        let elapsed = (now - refilled_at).max(0) as f64;
        let tokens = (tokens + elapsed / interval).min(full);
        if tokens < 1.0 {
            steps::set_tokens(&db, source, action, tokens, now)?;
            let until = now + ((1.0 - tokens) * interval).ceil() as i64;
            return Ok(Slot::Wait {
                reason: "rate",
                until: until.max(now + 1),
            });
        }
        steps::set_tokens(&db, source, action, tokens - 1.0, now)?;
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
    steps::release_slot(&tx.db(), source, action, now)
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
    let doc = crate::receive::key::RawDoc::parse(std::str::from_utf8(body).ok()?).ok()?;
    let input = crate::receive::key::Input {
        json: Some(crate::receive::key::Json::Raw(&doc)),
        body,
        ..Default::default()
    };
    part.text(&input)
}

/// True when a job of an order key, just leased (attempt `n_before + 1`),
/// carries a `supersede` value lower than the highest already delivered
/// for its key: it is ended `superseded`, with an attempt (ok, error kind
/// `superseded`), and not sent. A job an operator replayed is sent anyway.
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
    let Some(value) = supersede_value(fwd, body) else {
        return Ok(false);
    };
    let mark = {
        let db = tx.db();
        let Some(place) = steps::order_place(&db, job_id)? else {
            return Ok(false);
        };
        let mark = steps::order_mark(&db, &place)?;
        let older = match (comparable(&value), mark.as_deref().and_then(comparable)) {
            (Some(v), Some(m)) => v < m,
            _ => false,
        };
        if !older || !steps::supersede(&db, job_id, n_before + 1, now)? {
            return Ok(false);
        }
        mark.unwrap_or_default()
    };
    let detail = format!(
        "superseded: its value {value} is lower than {mark} already delivered for its order key"
    );
    tx.put_attempt(&NewAttempt {
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
        worker: Some("take"),
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
    let Some(value) = supersede_value(fwd, body) else {
        return Ok(());
    };
    let Some(new) = comparable(&value) else {
        return Ok(());
    };
    let db = tx.db();
    let Some(place) = steps::order_place(&db, job_id)? else {
        return Ok(());
    };
    let higher = steps::order_mark(&db, &place)?
        .as_deref()
        .and_then(comparable)
        .is_none_or(|m| m < new);
    if higher {
        steps::set_order_mark(&db, &place, &value)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
