//! `idemhook reconcile` and `/api/reconcile`: what needs an operator.
//! Jobs processing past their lease (a worker died holding them), pending
//! jobs overdue by more than [`OVERDUE_AFTER_MS`] (no worker is taking
//! them), failed jobs (dead letters waiting for a replay), jobs waiting
//! for other actions of their event (`after`) and paused actions with
//! waiting jobs. Exit 0 when clean, 1 when anything needs attention, so
//! cron or a monitor can run it. Reads only, unless `--check --yes`.
//!
//! With `--check` it also asks the downstream about every stuck and failed
//! job whose action has a `check` ([`ask_downstream`], outside any
//! transaction); with `--yes` it marks those the downstream has done as
//! done ([`mark_done`], in the caller's write transaction): a new attempt
//! `ok` with error kind `confirmed`, nothing rewritten.

use std::fmt::Write as _;
use std::io::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::{Value, json};

use super::command::{CommandError, Outcome};
use super::error::OpError;
use super::open;
use super::text::{cell, clean, fmt_json_time, stdout};
use crate::config::{ActionKind, Config, Forward};
use crate::outbox::ask::Asked;
use crate::state::Answer;
use crate::state::AttemptOutcome;
use crate::state::JobStatus;
use crate::store::attempts::{self, AttemptRow};
use crate::store::db::Db;
use crate::store::jobs::{self, Attention};
use crate::store::{StoreError, paused};
use crate::time::{ms_to_secs, now_ms};

/// A pending job this far past its due time counts as overdue.
pub const OVERDUE_AFTER_MS: i64 = 60_000;
/// The most items listed per kind; the counts are always complete.
pub const LIST_LIMIT: i64 = 500;

fn secs(ms: Option<i64>) -> Value {
    ms.map_or(Value::Null, |ms| json!(ms_to_secs(ms)))
}

/// How many checks `--check` asks at once.
const CHECKS_AT_ONCE: usize = 8;

/// The report: `{"clean", "stuck", "overdue", "failed", "waiting",
/// "paused", "counts"}`. Waiting jobs (parked by `after`) do not make it
/// unclean by themselves: what they wait for is listed in its own right.
pub fn reconcile(db: &Db<'_>, config: &Config, now: i64) -> Result<Value, OpError> {
    let mut lists = Vec::new();
    let mut counts = Vec::new();
    for (name, what, at) in [
        ("stuck", Attention::Stuck, now),
        ("overdue", Attention::Overdue, now - OVERDUE_AFTER_MS),
        ("failed", Attention::Failed, now),
        ("held", Attention::Held, now),
        ("waiting", Attention::Waiting, now),
    ] {
        let (mut items, n) = jobs_where(db, what, at)?;
        if name == "waiting" {
            for item in &mut items {
                item["waiting_for"] = waiting_for(db, config, item)?;
            }
        }
        lists.push((name, Value::Array(items)));
        counts.push((name, n));
    }
    let paused = paused_actions(db)?;
    counts.push(("paused", paused.len() as i64));
    lists.push(("paused", Value::Array(paused)));
    let circuits = open_circuits(db)?;
    counts.push(("circuits", circuits.len() as i64));
    lists.push(("circuits", Value::Array(circuits)));

    let clean = counts.iter().all(|(name, n)| *n == 0 || *name == "waiting");
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
    out["catchup"] = super::catchup_status::status(db, config)?;
    Ok(out)
}

/// The first [`LIST_LIMIT`] jobs of `what` (compared with `at` where it
/// compares a time) as JSON, and how many there are.
fn jobs_where(db: &Db<'_>, what: Attention, at: i64) -> Result<(Vec<Value>, i64), OpError> {
    let (listed, n) = jobs::listed(db, what, at, LIST_LIMIT)?;
    let items = listed
        .into_iter()
        .map(|j| {
            json!({
                "source": j.source,
                "event_id": j.event_id,
                "action": j.action,
                "kind": j.kind,
                "status": j.status,
                "attempts": j.n_attempts,
                "lease_owner": j.lease_owner,
                "lease_until": secs(j.lease_until),
                "next_attempt_at": secs(j.next_attempt_at),
                "last_error": j.last_error,
                "updated_at": secs(j.updated_at),
                "order_key": j.order_key,
            })
        })
        .collect();
    Ok((items, n))
}

/// The paused actions that hold jobs, with how many each holds.
fn paused_actions(db: &Db<'_>) -> Result<Vec<Value>, OpError> {
    Ok(paused::holding(db)?
        .into_iter()
        .map(|p| {
            json!({
                "source": p.source,
                "action": p.action,
                "paused_at": ms_to_secs(p.paused_at),
                "waiting": p.waiting,
            })
        })
        .collect())
}

/// The open circuits: when each opened, its consecutive failures, when
/// its next probe is due and how many jobs wait on it.
fn open_circuits(db: &Db<'_>) -> Result<Vec<Value>, OpError> {
    let mut out = Vec::new();
    for c in crate::store::circuits::open(db)? {
        let waiting = crate::store::circuits::waiting_count(db, &c.source, &c.action)?;
        out.push(json!({
            "source": c.source,
            "action": c.action,
            "opened_at": secs(c.opened_at),
            "failures": c.failures,
            "next_probe_at": secs(c.next_probe_at),
            "waiting": waiting,
        }));
    }
    Ok(out)
}

/// The jobs a parked job waits for: the actions its `after` names that are
/// not done for its event, with their status (every job of the event that
/// is not done when the action is no longer in the config).
fn waiting_for(db: &Db<'_>, config: &Config, item: &Value) -> Result<Value, OpError> {
    let (source, event_id, action) = (
        item["source"].as_str().unwrap_or_default(),
        item["event_id"].as_str().unwrap_or_default(),
        item["action"].as_str().unwrap_or_default(),
    );
    let after = forward_of(config, source, action).map(|f| f.after.as_slice());
    let mut out = Vec::new();
    for (name, status) in jobs::not_done_besides(db, source, event_id, action)? {
        if after.is_none_or(|a| a.contains(&name)) {
            out.push(json!({"action": name, "status": status}));
        }
    }
    Ok(Value::Array(out))
}

fn forward_of<'a>(config: &'a Config, source: &str, action: &str) -> Option<&'a Forward> {
    match &config.source(source)?.action(action)?.kind {
        ActionKind::Forward(f) => Some(f),
        ActionKind::Sql { .. } => None,
    }
}

/// One stuck or failed job asked about, and what the downstream answered.
#[derive(Debug, Clone)]
pub struct Checked {
    pub source: String,
    pub event_id: String,
    pub action: String,
    /// The job's status and attempt count when it was asked about.
    pub status: JobStatus,
    pub attempts: i64,
    pub asked: Asked,
    /// Set by [`mark_done`]: the confirmed attempt's number, or why the
    /// job was left alone.
    pub marked_done: Option<i64>,
    pub left_alone: Option<String>,
}

impl Checked {
    pub fn to_json(&self) -> Value {
        let note = match (self.asked.answer, self.marked_done, &self.left_alone) {
            (_, Some(n), _) => format!("done downstream: marked done as attempt {n}"),
            (_, None, Some(why)) => why.clone(),
            (Answer::Found, None, None) => {
                "done downstream: reconcile --check --yes marks it done".to_string()
            }
            (Answer::NotFound, ..) => {
                "not done downstream: a replay sends it (once it is failed)".to_string()
            }
            (Answer::Error, ..) => "the downstream did not say; nothing decided".to_string(),
        };
        json!({
            "source": self.source,
            "event_id": self.event_id,
            "action": self.action,
            "status": self.status,
            "attempts": self.attempts,
            "answer": self.asked.answer.as_str(),
            "http_status": self.asked.http_status,
            "error": self.asked.error,
            "marked_done": self.marked_done.is_some(),
            "attempt": self.marked_done,
            "note": note,
        })
    }
}

/// A job to ask about: (source, event id, action, status, attempts).
type Target = (String, String, String, JobStatus, i64);

/// The report's stuck and failed jobs whose action has a `check`.
fn check_targets(config: &Config, report: &Value) -> Vec<Target> {
    let mut targets = Vec::new();
    for list in ["stuck", "failed"] {
        for j in report[list]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
        {
            let (source, event_id, action) = (
                j["source"].as_str().unwrap_or_default(),
                j["event_id"].as_str().unwrap_or_default(),
                j["action"].as_str().unwrap_or_default(),
            );
            // The report's status is a JobStatus's word (`jobs_where`).
            let status = j["status"]
                .as_str()
                .unwrap_or_default()
                .parse::<JobStatus>();
            if let Ok(status) = status
                && forward_of(config, source, action).is_some_and(|f| f.check.is_some())
            {
                targets.push((
                    source.to_string(),
                    event_id.to_string(),
                    action.to_string(),
                    status,
                    j["attempts"].as_i64().unwrap_or(0),
                ));
            }
        }
    }
    targets
}

/// Asks the downstream about every stuck and failed job in `report` whose
/// action has a `check`, a few at a time, each within its action's
/// timeout. No transaction is open meanwhile.
pub fn ask_downstream(config: &Config, report: &Value) -> Result<Vec<Checked>, OpError> {
    let targets = check_targets(config, report);
    if targets.is_empty() {
        return Ok(Vec::new());
    }
    let signers = crate::outbox::signers(config).map_err(|e| OpError::Invalid(format!("{e:#}")))?;
    let clients = crate::outbox::dest::client::clients(config, CHECKS_AT_ONCE);
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Asked>>> = Mutex::new(vec![None; targets.len()]);
    std::thread::scope(|scope| {
        for _ in 0..CHECKS_AT_ONCE.min(targets.len()) {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some((source, event_id, action, _, _)) = targets.get(i) else {
                        break;
                    };
                    let Some(fwd) = forward_of(config, source, action) else {
                        continue;
                    };
                    let Some(template) = &fwd.check else {
                        continue;
                    };
                    let Some(client) = clients.get(&(source.clone(), action.clone())) else {
                        continue;
                    };
                    let asked = crate::outbox::ask::ask(
                        client,
                        fwd,
                        template,
                        (source, event_id, action),
                        signers.get(&(source.clone(), action.clone())),
                    );
                    if let Ok(mut r) = results.lock() {
                        r[i] = Some(asked);
                    }
                }
            });
        }
    });
    let results = results
        .into_inner()
        .map_err(|_| OpError::Store(StoreError::other("a check thread panicked")))?;
    Ok(targets
        .into_iter()
        .zip(results)
        .filter_map(|((source, event_id, action, status, attempts), asked)| {
            Some(Checked {
                source,
                event_id,
                action,
                status,
                attempts,
                asked: asked?,
                marked_done: None,
                left_alone: None,
            })
        })
        .collect())
}

/// Marks done, in the caller's write transaction, every checked job the
/// downstream has done and that has not moved on since it was asked
/// about (same status and attempt count; a stuck one still past its
/// lease): a new attempt `ok` with error kind `confirmed` (a stuck job's
/// cut-short attempt is first recorded as `retry`, `lease`, as a takeover
/// would), the check in `checks`, the event's state recomputed. Returns
/// how many were marked.
///
/// On PostgreSQL the job's row is read `FOR UPDATE`: a worker of any
/// instance that holds it is waited for (and then seen to have moved it
/// on), one that would take it passes it by (`SKIP LOCKED`), and the
/// final UPDATE is conditional on the status and attempt count read, so a
/// worker's fenced completion and this mark never both win.
pub fn mark_done(
    db: &Db<'_>,
    checked: &mut [Checked],
    worker: &str,
    now: i64,
) -> Result<usize, StoreError> {
    let mut marked = 0;
    for c in checked.iter_mut() {
        if c.asked.answer == Answer::Found && mark_one(db, c, worker, now)? {
            marked += 1;
        }
    }
    Ok(marked)
}

/// A job as [`mark_one`] reads it under its lock.
struct Locked {
    job_id: i64,
    status: JobStatus,
    n_attempts: i64,
    processing: bool,
    updated_at: i64,
    owner: Option<String>,
}

/// One job the downstream has done: marked done (true), or left alone
/// with the reason in `c.left_alone` when it is gone or moved on.
fn mark_one(db: &Db<'_>, c: &mut Checked, worker: &str, now: i64) -> Result<bool, StoreError> {
    let Some(r) = jobs::lock_leased(db, &c.source, &c.event_id, &c.action)? else {
        c.left_alone = Some("the job is gone (pruned); left alone".to_string());
        return Ok(false);
    };
    let lease_until = r.lease_until;
    let job = Locked {
        job_id: r.id,
        processing: r.status == JobStatus::Processing,
        status: r.status,
        n_attempts: r.n_attempts,
        updated_at: r.updated_at,
        owner: r.lease_owner,
    };
    let lease_ran_out = lease_until.is_none_or(|at| at < now);
    if job.status != c.status || job.n_attempts != c.attempts || (job.processing && !lease_ran_out)
    {
        c.left_alone = Some(format!(
            "the job moved on since it was asked about (now {}, {} attempt(s)); left alone",
            job.status, job.n_attempts
        ));
        return Ok(false);
    }
    c.marked_done = Some(confirm(db, &job, c, worker, now)?);
    Ok(true)
}

/// Records the confirmation as the job's next attempt (after the cut
/// short attempt of a stuck job), marks the job done, records the check
/// and the event's state. Returns the attempt's number.
fn confirm(
    db: &Db<'_>,
    job: &Locked,
    c: &Checked,
    worker: &str,
    now: i64,
) -> Result<i64, StoreError> {
    let job_id = job.job_id;
    let last_recorded = attempts::last_n(db, job_id)?;
    if job.processing && last_recorded < job.n_attempts {
        attempts::insert_if_new(
            db,
            &AttemptRow {
                job_id,
                n: job.n_attempts,
                started_at: job.updated_at,
                finished_at: Some(now),
                outcome: Some(AttemptOutcome::Retry),
                error: Some(
                    "the lease expired before the attempt was recorded (worker crashed or hung)"
                        .to_string(),
                ),
                error_kind: Some("lease".to_string()),
                worker: job.owner.clone(),
                ..AttemptRow::default()
            },
        )?;
    }
    let n = job.n_attempts.max(last_recorded) + 1;
    let a = &c.asked;
    attempts::insert(
        db,
        &AttemptRow {
            job_id,
            n,
            started_at: a.started_at,
            finished_at: Some(a.finished_at),
            outcome: Some(AttemptOutcome::Ok),
            http_status: a.http_status.map(i64::from),
            error_kind: Some("confirmed".to_string()),
            request_id: a.request_id.clone(),
            response_head: a.response_head.clone(),
            worker: Some(worker.to_string()),
            ..AttemptRow::default()
        },
    )?;
    let changed = jobs::close_done(db, job_id, n, (job.status, job.n_attempts), now)?;
    if changed != 1 {
        // Cannot happen under the lock above; never mark what moved.
        return Err(StoreError::other(format!(
            "job {job_id} changed while it was being marked done"
        )));
    }
    crate::with_tx!(db, |tx| {
        crate::outbox::record_check_in(tx, job_id, n, worker, a)?;
        crate::receive::ingest::refresh_event_state_in(tx, &c.source, &c.event_id, now)
    })?;
    Ok(n)
}

/// The report with what was asked: `checks` (one object per job asked
/// about) and `applied` (whether found jobs were marked done).
pub fn with_checks(mut report: Value, checked: &[Checked], applied: bool) -> Value {
    report["checks"] = Value::Array(checked.iter().map(Checked::to_json).collect());
    report["applied"] = json!(applied);
    report
}

fn render(report: &Value) -> String {
    let mut out = String::new();
    let counts = &report["counts"];
    let checks = report["checks"].as_array().map(Vec::as_slice);
    let clean = report["clean"].as_bool() == Some(true);
    if clean {
        let _ = writeln!(
            out,
            "clean: no stuck, overdue or failed jobs, no paused action has waiting jobs, no circuit is open"
        );
        // Jobs held by `after` do not make the report unclean, but are
        // listed, as in the JSON.
        if checks.is_none_or(<[Value]>::is_empty) && counts["waiting"].as_i64().unwrap_or(0) == 0 {
            return out;
        }
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
        (
            "held",
            "failed and holding the later jobs of their order key: a replay to done or a resolve releases them, in order",
        ),
        (
            "waiting",
            "waiting for other actions of their event (after): sent once those are done",
        ),
    ];
    for (name, what) in sections {
        let _ = writeln!(out, "{name}: {} {what}", counts[name]);
        for j in list(&report[name]) {
            let _ = writeln!(out, "{}", job_line(name, j));
        }
    }
    let _ = writeln!(
        out,
        "paused: {} action(s) with waiting jobs",
        counts["paused"]
    );
    for p in list(&report["paused"]) {
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
    let _ = writeln!(
        out,
        "circuits: {} open (the downstream is failing; one probe at a time, jobs wait without spending attempts)",
        counts["circuits"]
    );
    for c in list(&report["circuits"]) {
        let _ = writeln!(
            out,
            "  {}/{}  open since {}  {} failure(s)  next probe {}  {} job(s) waiting: idemhook probe {}/{} to probe now",
            cell(&c["source"]),
            cell(&c["action"]),
            fmt_json_time(&c["opened_at"]),
            cell(&c["failures"]),
            fmt_json_time(&c["next_probe_at"]),
            cell(&c["waiting"]),
            cell(&c["source"]),
            cell(&c["action"]),
        );
    }
    if let Some(checks) = checks {
        render_checks(&mut out, checks, report["applied"].as_bool() == Some(true));
    }
    if counts["failed"].as_i64().unwrap_or(0) > 0 {
        let _ = writeln!(
            out,
            "next: idemhook events show SOURCE EVENT_ID; after the fix, idemhook replay --source S --status failed --yes"
        );
    }
    out
}

/// A JSON array's items; none for anything else.
fn list(value: &Value) -> &[Value] {
    value.as_array().map(Vec::as_slice).unwrap_or_default()
}

/// One job of the report's section `name`, with what that section says
/// about it.
fn job_line(name: &str, j: &Value) -> String {
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
        "held" => {
            let _ = write!(line, "  holds order key {}", cell(&j["order_key"]));
        }
        "waiting" => {
            let names: Vec<String> = list(&j["waiting_for"])
                .iter()
                .map(|w| format!("{} ({})", cell(&w["action"]), cell(&w["status"])))
                .collect();
            let _ = write!(line, "  waiting for {}", names.join(", "));
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
    line
}

fn render_checks(out: &mut String, checks: &[Value], applied: bool) {
    let count = |answer: &str| checks.iter().filter(|c| c["answer"] == answer).count();
    let _ = writeln!(
        out,
        "asked the downstream about {} stuck or failed job(s) with a check: {} done there, {} not, {} no answer",
        checks.len(),
        count("found"),
        count("not_found"),
        count("error"),
    );
    for c in checks {
        let status = c["http_status"]
            .as_u64()
            .map_or_else(String::new, |s| format!(" ({s})"));
        let error = c["error"]
            .as_str()
            .map_or_else(String::new, |e| format!(": {}", clean(e)));
        let _ = writeln!(
            out,
            "  {}/{}  {} ({}, {} attempt(s))  {}{status}{error}; {}",
            cell(&c["source"]),
            cell(&c["event_id"]),
            cell(&c["action"]),
            cell(&c["status"]),
            cell(&c["attempts"]),
            cell(&c["answer"]),
            cell(&c["note"]),
        );
    }
    let found_unmarked = checks
        .iter()
        .filter(|c| c["answer"] == "found" && c["marked_done"] != true)
        .count();
    if !applied && found_unmarked > 0 {
        let _ = writeln!(
            out,
            "next: idemhook reconcile --check --yes marks the {found_unmarked} done downstream as done"
        );
    }
}

/// Exit 1 says that something needs attention; a command that could not
/// look at all (a bad argument, no database) exits 2, so that a monitor
/// never mistakes one for the other.
pub fn cmd(config: &Config, json: bool, check: bool, yes: bool) -> Result<Outcome, CommandError> {
    // Whatever keeps it from looking is a usage error here (exit 2).
    fn failed(e: OpError) -> CommandError {
        match e {
            OpError::NotFound(m) | OpError::Invalid(m) => CommandError::Usage(m),
            store => store.into(),
        }
    }
    if yes && !check {
        return Err(CommandError::Usage(
            "--yes marks done what --check finds done downstream: give --check --yes".to_string(),
        ));
    }
    let report = open::read(config, |db| reconcile(db, config, now_ms()))?.map_err(failed)?;
    let report = if check {
        check_and_apply(config, report, yes).map_err(failed)?
    } else {
        report
    };
    let mut out = stdout();
    if json {
        writeln!(
            out,
            "{}",
            serde_json::to_string_pretty(&report).map_err(anyhow::Error::from)?
        )?;
    } else {
        write!(out, "{}", render(&report))?;
        write!(out, "{}", super::catchup_status::render(&report["catchup"]))?;
    }
    Ok(if report["clean"].as_bool() == Some(true) {
        Outcome::Done
    } else {
        Outcome::Attention
    })
}

/// `--check` (and `--yes`): asks, marks the found ones done in one write
/// transaction when `yes`, and reports the state after.
fn check_and_apply(config: &Config, report: Value, yes: bool) -> Result<Value, OpError> {
    let checked = ask_downstream(config, &report)?;
    if !yes || !checked.iter().any(|c| c.asked.answer == Answer::Found) {
        return Ok(with_checks(report, &checked, false));
    }
    let (checked, after) = open::write(config, |db| {
        // A copy per run: on PostgreSQL the transaction may run again.
        let mut checked = checked.clone();
        let now = now_ms();
        mark_done(db, &mut checked, "reconcile:cli", now)?;
        let after = reconcile(db, config, now)?;
        Ok::<_, OpError>((checked, after))
    })
    .map_err(|e| OpError::Invalid(format!("{e:#}")))??;
    Ok(with_checks(after, &checked, true))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::pg_cluster;
    use crate::store::postgres::db::pg_write;
    use std::time::{Duration, Instant};

    /// A migrated database of the test cluster with one failed forward
    /// job (one attempt made) of event s/e, and its URL.
    fn failed_job(test: &str) -> Option<(String, postgres::Client)> {
        let Some(cluster) = pg_cluster::cluster() else {
            pg_cluster::skipped(test);
            return None;
        };
        let url = cluster.create_database(test);
        let mut client = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        crate::store::postgres::migrate(&mut client, crate::config::database_url::DEFAULT_SCHEMA)
            .unwrap();
        client
            .batch_execute(
                "INSERT INTO events (source, event_id, state, received_at, payload_hash)
                 VALUES ('s', 'e', 'failed', 1, 'h');
                 INSERT INTO jobs (source, event_id, action, kind, status, n_attempts, created_at, updated_at)
                 VALUES ('s', 'e', 'notify', 'forward', 'failed', 1, 1, 1);
                 INSERT INTO attempts (job_id, n, started_at, finished_at, outcome, error_kind)
                 SELECT id, 1, 1, 2, 'failed', 'status' FROM jobs",
            )
            .unwrap();
        Some((url, client))
    }

    fn found_downstream() -> Checked {
        Checked {
            source: "s".into(),
            event_id: "e".into(),
            action: "notify".into(),
            status: JobStatus::Failed,
            attempts: 1,
            asked: Asked {
                answer: Answer::Found,
                started_at: 10,
                finished_at: 11,
                http_status: Some(200),
                cause: None,
                error: None,
                request_id: None,
                response_head: None,
                retry_after: None,
            },
            marked_done: None,
            left_alone: None,
        }
    }

    fn one(client: &mut postgres::Client, sql: &str) -> String {
        client.query_one(sql, &[]).unwrap().get(0)
    }

    /// On PostgreSQL, with nobody else on the job: marked done as attempt
    /// 2 (ok, confirmed), the check recorded, the event completed.
    #[test]
    fn marks_a_failed_job_done_on_postgres() {
        let Some((url, mut client)) = failed_job("reconcile_marks_done") else {
            return;
        };
        let mut other = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        let mut checked = vec![found_downstream()];
        let n = pg_write(&mut other, |db| mark_done(db, &mut checked, "test", 20)).unwrap();
        assert_eq!((n, checked[0].marked_done), (1, Some(2)));
        assert_eq!(
            one(
                &mut client,
                "SELECT status || '/' || n_attempts || '/' || \
                 (SELECT string_agg(outcome || ':' || coalesce(error_kind, '-'), ',' ORDER BY n) FROM attempts) || '/' || \
                 (SELECT answer FROM checks) || '/' || (SELECT state FROM events) FROM jobs"
            ),
            "done/2/failed:status,ok:confirmed/found/completed"
        );
    }

    /// On PostgreSQL, a transaction of another process that holds the job
    /// (a worker of another instance, a replay) is waited for, and once it
    /// has moved the job on, the job is left alone: never marked done over
    /// what the other one decided.
    #[test]
    fn marking_done_waits_for_whoever_holds_the_job_and_leaves_it_if_it_moved() {
        let Some((url, mut client)) = failed_job("reconcile_waits_for_holder") else {
            return;
        };
        let mut holder = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        holder
            .batch_execute("BEGIN; SELECT 1 FROM jobs FOR UPDATE")
            .unwrap();
        let marker = std::thread::spawn(move || {
            let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
            let mut checked = vec![found_downstream()];
            let n = pg_write(&mut c, |db| mark_done(db, &mut checked, "test", 20)).unwrap();
            (n, checked)
        });
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let waiting: i64 = client
                .query_one("SELECT count(*) FROM pg_locks WHERE NOT granted", &[])
                .unwrap()
                .get(0);
            if waiting > 0 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "mark_done never waited for the lock"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        // The holder re-opens the job (as a replay would) and commits.
        holder
            .batch_execute(
                "UPDATE jobs SET status = 'pending', next_attempt_at = 5, updated_at = 5; COMMIT",
            )
            .unwrap();
        let (n, checked) = marker.join().unwrap();
        assert_eq!(n, 0);
        assert!(
            checked[0]
                .left_alone
                .as_deref()
                .is_some_and(|w| w.contains("moved on")),
            "{:?}",
            checked[0].left_alone
        );
        assert_eq!(
            one(
                &mut client,
                "SELECT status || '/' || (SELECT count(*) FROM attempts) || '/' || \
                 (SELECT count(*) FROM checks) FROM jobs"
            ),
            "pending/1/0"
        );
    }
}
