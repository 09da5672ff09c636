//! Applying a plan in the caller's write transaction: each job locked and
//! read again, re-queued (forward) or run again now (SQL) as its next
//! attempt, and the touched events' states recomputed.

use std::collections::BTreeSet;

use serde_json::Value;

use super::{Origin, Replayed, Step, requeued_forward};
use crate::config::{ActionKind, Config};
use crate::receive::ingest::{self, Claim};
use crate::state::{AttemptOutcome, JobKind, JobStatus, ReplayResult};
use crate::store::attempts::{self, AttemptRow};
use crate::store::db::Db;
use crate::store::{StoreError, events, jobs, paused, replays};
use crate::time::now_ms;

/// Re-opens the planned jobs in the caller's write transaction. A job whose
/// status moved on since the plan is skipped. Afterwards each touched
/// event's state is recomputed.
///
/// On PostgreSQL each job's row is locked before its status is read
/// again (a worker's take holding it is waited for), and the re-open is
/// an UPDATE conditional on that status: of replays racing each other
/// (or a resolve) on any instances, one re-opens the job and the others
/// skip it, and a worker's fenced completion (owner + attempt) of an
/// earlier lease can no longer match a re-opened job.
pub fn apply(
    conn: &Db<'_>,
    config: &Config,
    steps: &[Step],
    origin: Origin,
    now: i64,
) -> Result<Vec<Replayed>, StoreError> {
    let mut out = Vec::with_capacity(steps.len());
    let mut events = BTreeSet::new();
    for s in steps {
        let done = apply_step(conn, config, s, origin, now)?;
        if done.result != ReplayResult::Skipped {
            events.insert((s.source.clone(), s.event_id.clone()));
        }
        out.push(done);
    }
    for (source, event_id) in events {
        crate::with_tx!(conn, |tx| ingest::refresh_event_state_in(
            tx, &source, &event_id, now
        ))?;
    }
    // Re-opened forward jobs (or jobs waiting on an SQL job done now):
    // every instance's workers are woken at the commit (they poll too).
    if requeued_forward(&out)
        || out
            .iter()
            .any(|d| d.kind == JobKind::Sql && d.result == ReplayResult::Ok)
    {
        jobs::wake_workers(conn)?;
    }
    Ok(out)
}

/// One planned job: locked and read again, skipped when it moved on,
/// else recorded in `replays` and re-queued (forward) or run now (SQL).
fn apply_step(
    conn: &Db<'_>,
    config: &Config,
    s: &Step,
    origin: Origin,
    now: i64,
) -> Result<Replayed, StoreError> {
    let mut done = Replayed {
        source: s.source.clone(),
        event_id: s.event_id.clone(),
        action: s.action.clone(),
        kind: s.kind,
        from_status: s.from_status,
        attempt: s.attempt,
        forced: s.forced,
        result: ReplayResult::Skipped,
        error: None,
        status: None,
    };
    let Some((status, n_attempts)) = jobs::lock_status(conn, s.job_id)? else {
        done.error = Some("the job is gone (pruned)".to_string());
        return Ok(done);
    };
    if status != s.from_status {
        done.error = Some(format!("the job is now {status}; left alone"));
        return Ok(done);
    }
    let from = status;
    replays::insert(conn, s.job_id, now, from, s.forced, origin.name())?;
    match s.kind {
        JobKind::Sql => {
            rerun_sql(conn, config, s, n_attempts, origin, now, &mut done)?;
            return Ok(done);
        }
        JobKind::Forward => {}
    }
    // A paused action's job waits for the resume, like its other jobs.
    let paused = paused::is_paused(conn, &s.source, &s.action)?;
    let to = if paused {
        JobStatus::Paused
    } else {
        JobStatus::Pending
    };
    let reopened = jobs::reopen(conn, s.job_id, from, to, now)?;
    if reopened != 1 {
        return Err(StoreError::other(format!(
            "job {} changed while it was locked for the replay",
            s.job_id
        )));
    }
    requeue_in_order(conn, s, now)?;
    done.attempt = n_attempts + 1;
    done.result = ReplayResult::Requeued;
    done.status = Some(to);
    Ok(done)
}

/// A replayed job of an order key that had finished (done, superseded)
/// goes to the end of its key's unfinished jobs, and waits behind them.
/// A failed one keeps its place: it held its key, and goes first.
fn requeue_in_order(conn: &Db<'_>, s: &Step, now: i64) -> Result<(), StoreError> {
    if s.from_status == JobStatus::Failed {
        return Ok(());
    }
    let Some(key) = jobs::order_key(conn, s.job_id)? else {
        return Ok(());
    };
    let last = jobs::last_order_seq(conn, &s.source, &s.action, &key, s.job_id)?;
    jobs::move_in_order(conn, s.job_id, last.unwrap_or(0) + 1, last.is_some(), now)
}

/// Runs an SQL job's statement again on the stored event and records the
/// run as the job's next attempt.
fn rerun_sql(
    conn: &Db<'_>,
    config: &Config,
    s: &Step,
    n_attempts: i64,
    origin: Origin,
    now: i64,
    done: &mut Replayed,
) -> Result<(), StoreError> {
    let action = config
        .source(&s.source)
        .and_then(|src| src.action(&s.action).map(|a| (src, a)));
    let result = match action {
        Some((source, action)) if matches!(action.kind, ActionKind::Sql { .. }) => {
            match stored_claim(conn, &s.source, &s.event_id)? {
                Some(claim) => crate::with_tx!(conn, |tx| ingest::rerun_sql_action_in(
                    tx, source, action, &claim
                ))?,
                None => Err("the stored body was erased".to_string()),
            }
        }
        _ => Err("the action is no longer an sql action in the config".to_string()),
    };
    let n = n_attempts.max(attempts::last_n(conn, s.job_id)?) + 1;
    let finished = now_ms().max(now);
    // A forced re-run of a done job that fails leaves the job done: its
    // effect already happened once. The failed attempt
    // is recorded and reported all the same.
    let (status, outcome, replayed, error) = match &result {
        Ok(()) => (JobStatus::Done, AttemptOutcome::Ok, ReplayResult::Ok, None),
        Err(e) if s.from_status == JobStatus::Done => (
            JobStatus::Done,
            AttemptOutcome::Failed,
            ReplayResult::Failed,
            Some(e.as_str()),
        ),
        Err(e) => (
            JobStatus::Failed,
            AttemptOutcome::Failed,
            ReplayResult::Failed,
            Some(e.as_str()),
        ),
    };
    attempts::insert(
        conn,
        &AttemptRow {
            job_id: s.job_id,
            n,
            started_at: now,
            finished_at: Some(finished),
            outcome: Some(outcome),
            error: error.map(str::to_string),
            error_kind: error.map(|_| "sql".to_string()),
            worker: Some(format!("replay:{}", origin.name())),
            ..AttemptRow::default()
        },
    )?;
    let last_error = if status == JobStatus::Failed {
        error
    } else {
        None
    };
    jobs::record_run(conn, s.job_id, status, n, last_error, finished)?;
    done.attempt = n;
    done.result = replayed;
    done.error = error.map(str::to_string);
    done.status = Some(status);
    Ok(())
}

/// The stored event as a claim, so an SQL action binds exactly what it
/// bound the first time. None when the body was erased.
fn stored_claim(conn: &Db<'_>, source: &str, event_id: &str) -> Result<Option<Claim>, StoreError> {
    let Some(events::Stored {
        event_type,
        payload: Some(body),
        content_type,
        headers: kept,
        payload_hash: hash,
        verified_with,
        signed_at,
        received_at: at,
    }) = events::stored(conn, source, event_id)?
    else {
        return Ok(None);
    };
    let headers: Vec<(String, String)> = kept
        .as_deref()
        .and_then(|h| serde_json::from_str::<serde_json::Map<String, Value>>(h).ok())
        .map(|m| {
            m.into_iter()
                .filter_map(|(k, v)| v.as_str().map(|v| (k, v.to_string())))
                .collect()
        })
        .unwrap_or_default();
    Ok(Some(Claim {
        event_id: event_id.to_string(),
        event_type,
        json: serde_json::from_slice(&body).ok(),
        body,
        content_type,
        headers,
        kept_headers: kept.unwrap_or_default(),
        payload_hash: hash,
        verified_with: verified_with.and_then(|i| usize::try_from(i).ok()),
        signed_at,
        received_at: at,
        remote: "replay".to_string(),
        batch: None,
        reingest: false,
        catchup: false,
    }))
}
