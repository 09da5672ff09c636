//! `idemhook reingest` and `POST /api/reingest`: kept refused requests
//! (`store::rejected`) verified again with the source's current secrets
//! and rules (a timestamp's tolerance judged against the time the request
//! was received: `http::hooks::reverify`, handed in as a [`Reverify`] by
//! the caller, as `ops/` sits below `http/`), and each that passes claimed
//! through the same barrier as a delivery (`ingest::claim_in`: a
//! duplicate stays a duplicate, SQL actions run and forward jobs are
//! written as for a delivery), its delivery recorded as `reingested` and
//! the kept request removed. One that still fails stays, with its new
//! reason. A dry run only says, per request, whether it would pass.
//!
//! Each request is one write transaction of its own, so a long run never
//! holds the database, and the command is safe while `serve` runs: on
//! SQLite serve's forward workers poll for due jobs (at most every
//! 500 ms), on PostgreSQL the transaction NOTIFYs them.

use std::io::Write as _;

use serde_json::{Value, json};

use super::command::{CommandError, Outcome};
use super::error::OpError;
use super::open::{self, OnDb};
use super::rejected::{MAX_LIST, not_found, since_ms};
use super::text::{clean, fmt_time, stdout};
use crate::config::{Config, Source};
use crate::receive::ingest::{Claim, Decision, claim_in};
use crate::store::db::Db;
use crate::store::open::CommandDb;
use crate::store::rejected::{self, KeptRequest};
use crate::time::{ms_to_secs, now_ms};

/// A kept request that now passes: the secret it matched (0-based; None
/// for a source that signs nothing) and its claims (one, or each event of
/// a batch; none for a batch without events).
pub struct Passed {
    pub secret: Option<usize>,
    pub claims: Vec<Claim>,
}

/// Verifies a kept request again for its source (with the config's
/// `max_batch_items`); the reason when it still fails.
pub type Reverify = fn(&Source, usize, &KeptRequest) -> Result<Passed, String>;

/// What to re-ingest.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Request {
    pub source: String,
    /// Only requests received within this duration (e.g. `2h`).
    #[serde(default)]
    pub since: Option<String>,
    /// Only this kept request.
    #[serde(default)]
    pub id: Option<i64>,
    /// Only say what would happen.
    #[serde(default)]
    pub dry_run: bool,
}

/// The kept requests a run covers: checks the source and the filter.
pub fn plan_ids(db: &Db<'_>, config: &Config, r: &Request) -> Result<Vec<i64>, OpError> {
    if config.source(&r.source).is_none() {
        return Err(OpError::NotFound(format!(
            "source {} is not in the config",
            clean(&r.source)
        )));
    }
    let from = since_ms(r.since.as_deref(), now_ms())?;
    let kept = rejected::list(db, Some(&r.source), from, MAX_LIST)?;
    match r.id {
        Some(id) => {
            if kept.iter().any(|k| k.id == id) {
                Ok(vec![id])
            } else {
                Err(not_found(id))
            }
        }
        None => Ok(kept.iter().map(|k| k.id).collect()),
    }
}

/// One kept request verified again and, unless `dry_run`, taken in (or
/// left with its new reason), in the caller's write transaction. Its
/// JSON: `{id, received_at, passes, secret, reason, events}`; `events`
/// (unless a dry run) `[{event_id, outcome}]` with outcome accepted,
/// duplicate or mismatch. Null when the request is gone already.
pub fn one(
    db: &Db<'_>,
    config: &Config,
    source_name: &str,
    id: i64,
    dry_run: bool,
    reverify: Reverify,
) -> Result<Value, OpError> {
    let source = config.source(source_name).ok_or_else(|| {
        OpError::NotFound(format!(
            "source {} is not in the config",
            clean(source_name)
        ))
    })?;
    let Some(k) = rejected::get(db, id)? else {
        return Ok(Value::Null);
    };
    if k.kept.source != source.name {
        return Err(not_found(id));
    }
    let mut out = json!({
        "id": id,
        "received_at": ms_to_secs(k.kept.received_at),
        "passes": false,
        "secret": null,
        "reason": null,
    });
    learn_handed_over(db, source)?;
    let passed = match reverify(source, config.max_batch_items, &k) {
        Ok(passed) => passed,
        Err(reason) => {
            out["reason"] = json!(reason);
            if !dry_run {
                rejected::set_reason(db, id, &reason)?;
                rejected::count_reingest(db, &source.name, "failed")?;
            }
            return Ok(out);
        }
    };
    out["passes"] = json!(true);
    out["secret"] = json!(passed.secret);
    if dry_run {
        return Ok(out);
    }
    let mut events = Vec::with_capacity(passed.claims.len());
    let mut forward_jobs = 0;
    let mut any_new = false;
    for claim in &passed.claims {
        let decision = crate::with_tx!(db, |tx| claim_in(tx, source, claim))?;
        let outcome = match &decision {
            Decision::Accepted {
                forward_jobs: n, ..
            } => {
                forward_jobs += n;
                any_new = true;
                "accepted"
            }
            Decision::Duplicate { .. } => "duplicate",
            Decision::Mismatch { .. } => "mismatch",
        };
        events.push(json!({"event_id": claim.event_id, "outcome": outcome}));
    }
    rejected::remove(db, &source.name, id)?;
    rejected::count_reingest(
        db,
        &source.name,
        if any_new { "accepted" } else { "duplicate" },
    )?;
    if forward_jobs > 0 {
        // Delivered with the commit: every instance's workers wake.
        crate::store::jobs::wake_workers(db)?;
    }
    out["events"] = Value::Array(events);
    Ok(out)
}

/// A source whose provider hands its secret over in a handshake (Asana,
/// Notion) and that has none in the config verifies with the one kept in
/// the database, as `serve` does.
fn learn_handed_over(db: &Db<'_>, source: &crate::config::Source) -> Result<(), OpError> {
    use crate::config::presets::Handshake;
    let hands_over = matches!(
        source.kind.preset().map(|p| p.handshake),
        Some(Handshake::Asana | Handshake::Notion)
    );
    if !hands_over || source.secret_count > 0 {
        return Ok(());
    }
    if let Some(secret) = crate::store::meta::handed_over(db, &source.name)?
        && !source.verifier.knows(&secret)
    {
        source
            .verifier
            .learn(&crate::verify::Secret::new(secret))
            .map_err(|e| OpError::Store(crate::store::StoreError::other(e)))?;
    }
    Ok(())
}

/// Totals of a run's requests: (accepted, duplicate, failed) as the
/// metric counts them; for a dry run (would pass, would fail).
pub fn summary(requests: &[Value], dry_run: bool) -> Value {
    let passes = |r: &&Value| r["passes"].as_bool() == Some(true);
    let failed = requests.iter().filter(|r| !passes(r)).count();
    if dry_run {
        return json!({"would_pass": requests.len() - failed, "would_fail": failed});
    }
    let accepted = requests
        .iter()
        .filter(passes)
        .filter(|r| {
            r["events"]
                .as_array()
                .is_some_and(|e| e.iter().any(|e| e["outcome"] == "accepted"))
        })
        .count();
    let taken = requests.iter().filter(passes).count();
    json!({"accepted": accepted, "duplicate": taken - accepted, "failed": failed})
}

/// `idemhook reingest`.
pub fn cmd(config: &Config, r: &Request, reverify: Reverify) -> Result<Outcome, CommandError> {
    open::on_db_write(
        config,
        Reingesting {
            config,
            r,
            reverify,
        },
    )?
}

/// `idemhook reingest` on the command's connection, either backend.
struct Reingesting<'a> {
    config: &'a Config,
    r: &'a Request,
    reverify: Reverify,
}

impl OnDb for Reingesting<'_> {
    type Out = Result<Outcome, CommandError>;
    fn run<D: CommandDb>(self, mut handle: D) -> Self::Out {
        let (config, r, reverify) = (self.config, self.r, self.reverify);
        reingest_on(&mut handle, config, r, reverify)
    }
}

fn reingest_on(
    handle: &mut impl CommandDb,
    config: &Config,
    r: &Request,
    reverify: Reverify,
) -> Result<Outcome, CommandError> {
    let ids = handle.read(|db| plan_ids(db, config, r))?;
    let mut out = stdout();
    let mut requests = Vec::with_capacity(ids.len());
    for id in ids {
        let done = if r.dry_run {
            handle.read(|db| one(db, config, &r.source, id, true, reverify))?
        } else {
            handle.write(|db| one(db, config, &r.source, id, false, reverify))?
        };
        if done.is_null() {
            continue;
        }
        write_line(&mut out, &done, r.dry_run)?;
        requests.push(done);
    }
    let totals = summary(&requests, r.dry_run);
    if requests.is_empty() {
        writeln!(
            out,
            "no kept refused requests of {} to re-ingest",
            clean(&r.source)
        )?;
    } else if r.dry_run {
        writeln!(
            out,
            "dry run: {} would pass, {} would not; nothing changed (run again with --yes)",
            totals["would_pass"], totals["would_fail"]
        )?;
    } else {
        writeln!(
            out,
            "re-ingested: {} new, {} duplicate; {} still refused (kept with the new reason)",
            totals["accepted"], totals["duplicate"], totals["failed"]
        )?;
    }
    Ok(Outcome::Done)
}

fn write_line(out: &mut impl std::io::Write, r: &Value, dry_run: bool) -> std::io::Result<()> {
    let at = r["received_at"].as_i64().map_or("-".to_string(), fmt_time);
    let head = format!("#{} received {at}", r["id"]);
    let secret = match r["secret"].as_i64() {
        Some(i) => format!("secret #{i} (0-based)"),
        None => "no signature".to_string(),
    };
    let reason = clean(r["reason"].as_str().unwrap_or(""));
    match (r["passes"].as_bool() == Some(true), dry_run) {
        (true, true) => writeln!(out, "{head}: would pass, with {secret}"),
        (false, true) => writeln!(out, "{head}: would not pass: {reason}"),
        (false, false) => writeln!(out, "{head}: still refused: {reason}"),
        (true, false) => {
            let events: Vec<String> = r["events"]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or_default()
                .iter()
                .map(|e| {
                    format!(
                        "{} {}",
                        clean(e["event_id"].as_str().unwrap_or("")),
                        e["outcome"].as_str().unwrap_or("")
                    )
                })
                .collect();
            let events = if events.is_empty() {
                "no events".to_string()
            } else {
                events.join(", ")
            };
            writeln!(out, "{head}: passed with {secret}: {events}")
        }
    }
}
