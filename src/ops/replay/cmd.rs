//! `idemhook replay`: the plan printed, applied with `--yes` (one event in
//! one transaction, a batch in chunks), and what was done printed.

use std::fmt::Write as _;
use std::io::Write as _;

use super::{APPLY_CHUNK, Origin, Plan, Replayed, Target, apply, event_state, plan};
use crate::config::Config;
use crate::ops::command::{CommandError, Outcome};
use crate::ops::error::OpError;
use crate::ops::open::{self, OnDb};
use crate::ops::text::{cell, clean, fmt_json_time, stdout};
use crate::state::{JobStatus, ReplayResult};
use crate::store::open::CommandDb;
use crate::time::now_ms;

/// `idemhook replay`: prints the plan, and without `yes` stops there;
/// with it, applies the plan and prints what was done.
pub fn cmd(config: &Config, target: &Target, yes: bool) -> Result<Outcome, CommandError> {
    if !yes {
        let plan = open::look(config, |db| plan(db, config, target))??;
        let mut out = stdout();
        write!(out, "{}", render_plan(&plan))?;
        if !plan.steps.is_empty() {
            writeln!(out, "nothing changed: run again with --yes to do this")?;
        }
        return Ok(Outcome::Done);
    }
    open::on_db_write(config, Replaying { config, target })?
}

/// `idemhook replay --yes` on the command's connection, either backend.
struct Replaying<'a> {
    config: &'a Config,
    target: &'a Target,
}

impl OnDb for Replaying<'_> {
    type Out = Result<Outcome, CommandError>;
    fn run<D: CommandDb>(self, mut db: D) -> Self::Out {
        match self.target {
            Target::Event { .. } => replay_event_cli(&mut db, self.config, self.target),
            Target::Batch { .. } => replay_batch_cli(&mut db, self.config, self.target),
        }
    }
}

/// One event: planned and applied in one write transaction.
fn replay_event_cli(
    handle: &mut impl CommandDb,
    config: &Config,
    target: &Target,
) -> Result<Outcome, CommandError> {
    let (plan, applied) = handle.write(|db| {
        let plan = plan(db, config, target)?;
        if plan.steps.is_empty() {
            return Ok((plan, None));
        }
        let done = apply(db, config, &plan.steps, Origin::Cli, now_ms())?;
        let state = match &plan.event {
            Some(e) => event_state(
                db,
                e["source"].as_str().unwrap_or_default(),
                e["event_id"].as_str().unwrap_or_default(),
            )?,
            None => None,
        };
        Ok::<_, OpError>((plan, Some((done, state))))
    })?;
    let mut out = stdout();
    write!(out, "{}", render_plan(&plan))?;
    let Some((done, state)) = applied else {
        return Ok(Outcome::Done);
    };
    write!(out, "{}", render_done(&done))?;
    if let Some(state) = state {
        writeln!(out, "event state now: {state}")?;
    }
    Ok(exit_for(&done))
}

/// A batch: planned once, applied [`APPLY_CHUNK`] jobs per write
/// transaction (each job checked again there).
fn replay_batch_cli(
    handle: &mut impl CommandDb,
    config: &Config,
    target: &Target,
) -> Result<Outcome, CommandError> {
    let plan = plan(&handle.db(), config, target)?;
    let mut out = stdout();
    write!(out, "{}", render_plan(&plan))?;
    let mut all = Vec::with_capacity(plan.steps.len());
    for chunk in plan.steps.chunks(APPLY_CHUNK) {
        let done = handle.write(|db| apply(db, config, chunk, Origin::Cli, now_ms()))?;
        all.extend(done);
    }
    write!(out, "{}", render_done(&all))?;
    Ok(exit_for(&all))
}

/// Attention (exit 1) when an SQL job was run again and failed again.
fn exit_for(done: &[Replayed]) -> Outcome {
    if done.iter().any(|d| d.result == ReplayResult::Failed) {
        Outcome::Attention
    } else {
        Outcome::Done
    }
}

fn render_plan(plan: &Plan) -> String {
    let mut out = String::new();
    match &plan.event {
        Some(e) => {
            let _ = writeln!(
                out,
                "event {}/{}: state {}, type {}, received {}{}",
                cell(&e["source"]),
                cell(&e["event_id"]),
                cell(&e["state"]),
                cell(&e["type"]),
                fmt_json_time(&e["received_at"]),
                if e["payload_erased"].as_bool() == Some(true) {
                    ", body erased"
                } else {
                    ""
                }
            );
            for j in e["jobs"].as_array().map(Vec::as_slice).unwrap_or_default() {
                let _ = writeln!(
                    out,
                    "  job {} ({}): {}, {} attempt(s)",
                    cell(&j["action"]),
                    cell(&j["kind"]),
                    cell(&j["status"]),
                    cell(&j["attempts"]),
                );
            }
        }
        None => {
            let _ = writeln!(out, "{} jobs to replay", plan.steps.len());
        }
    }
    if !plan.steps.is_empty() {
        let _ = writeln!(out, "replay will:");
        for s in &plan.steps {
            let _ = writeln!(
                out,
                "  {}/{} {} ({}, {}): {}",
                clean(&s.source),
                clean(&s.event_id),
                clean(&s.action),
                s.kind,
                s.from_status,
                s.what
            );
        }
    }
    for l in &plan.left_alone {
        if plan.event.is_some() && l.status == JobStatus::Done && plan.steps.is_empty() {
            continue; // the notes explain done jobs
        }
        let _ = writeln!(
            out,
            "  left alone: {}/{} {} ({}): {}",
            clean(&l.source),
            clean(&l.event_id),
            clean(&l.action),
            l.status,
            l.reason
        );
    }
    for n in &plan.notes {
        let _ = writeln!(out, "{n}");
    }
    out
}

fn render_done(done: &[Replayed]) -> String {
    let mut out = String::new();
    let replayed = done
        .iter()
        .filter(|d| d.result != ReplayResult::Skipped)
        .count();
    let _ = writeln!(out, "replayed {replayed} of {} job(s)", done.len());
    for d in done {
        let what = match d.result {
            ReplayResult::Requeued => format!(
                "re-queued as attempt {}; the forward workers pick it up when they next poll",
                d.attempt
            ),
            ReplayResult::Ok => format!("ran again as attempt {}: ok", d.attempt),
            ReplayResult::Failed if d.status == Some(JobStatus::Done) => format!(
                "ran again as attempt {}: failed: {}; the job stays done (its effect happened once already; the failed attempt is recorded)",
                d.attempt,
                clean(d.error.as_deref().unwrap_or(""))
            ),
            ReplayResult::Failed => format!(
                "ran again as attempt {}: failed: {}",
                d.attempt,
                clean(d.error.as_deref().unwrap_or(""))
            ),
            ReplayResult::Skipped => {
                format!("skipped: {}", clean(d.error.as_deref().unwrap_or("")))
            }
        };
        let _ = writeln!(
            out,
            "  {}/{} {}: {what}",
            clean(&d.source),
            clean(&d.event_id),
            clean(&d.action)
        );
    }
    out
}
