//! Catch-up from the provider's API: after an outage longer than the
//! provider retries (Stripe gives up after 3 days, GitHub never retries),
//! idemhook asks the provider what it missed. One module per provider API
//! behind [`api::ProviderApi`] (`stripe`: the events are listed and the
//! missing ones claimed here, through the same barrier as a delivery,
//! `ingest::claim_in`, outcome `catchup`; `github`: the hook's deliveries
//! are listed and each missing guid asked again once, so it arrives
//! signed on the normal route). A third provider is one more module and
//! one more arm in [`api_for`].
//!
//! [`run`] is the one run, for `idemhook catchup` (`ops::catchup`) and for
//! `serve`'s [`Background`], over [`RunDb`] (the command's connection or
//! serve's backend). API calls happen outside any transaction; each claim
//! is a write of its own. [`found_events`] is where a run that found
//! something is decided (the `catchup` notification hangs there).

pub mod api;
mod background;
pub mod github;
pub mod stripe;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

pub use api::{ApiError, Found, ProviderApi, Recovery};
pub use background::{Background, OnReport};

use crate::config::catchup::{Catchup, Provider};
use crate::config::{Config, Source};
use crate::receive::ingest::{Claim, Decision, claim_in};
use crate::receive::key::{Input, Json};
use crate::store::StoreError;
use crate::store::catchup::RunRecord;
use crate::store::db::{Db, TxError};

/// How long a run's lease lasts before another instance may take over
/// (a run that died holding it).
pub const LEASE_MS: i64 = 10 * 60 * 1000;

/// The provider's API for a source's catchup table.
pub fn api_for(c: &Catchup) -> Box<dyn ProviderApi> {
    let client = api::Client::new(c);
    match c.provider {
        Provider::Stripe => Box::new(stripe::Stripe { client }),
        Provider::Github => Box::new(github::Github {
            client,
            hook: c.hook.clone().unwrap_or_default(),
        }),
    }
}

/// Why a step of a run failed, sorted as `ops::OpError` sorts it (which
/// takes each variant as its own): the source is not in the config, the
/// event is not one the source can claim, or storage failed.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    Store(#[from] StoreError),
}

impl TxError for RunError {
    fn as_store(&self) -> Option<&StoreError> {
        match self {
            RunError::Store(e) => Some(e),
            RunError::NotFound(_) | RunError::Invalid(_) => None,
        }
    }
}

/// The storage steps of a run.
pub trait RunDb {
    /// Which of `ids` the source has stored.
    fn stored(&mut self, source: &str, ids: &[String]) -> Result<HashSet<String>, RunError>;
    /// Claims one event the API handed over, in a write of its own.
    fn claim(
        &mut self,
        config: &Arc<Config>,
        source: &str,
        body: Vec<u8>,
    ) -> Result<Decision, RunError>;
    /// Takes the source's lease (false: another run holds it).
    fn lease(
        &mut self,
        source: &str,
        owner: &str,
        honour_retry_after: bool,
    ) -> Result<bool, RunError>;
    /// Records the run and gives the lease back, writing `told` (the
    /// `catchup` notification of a run that found events) in the same
    /// transaction.
    fn finish(
        &mut self,
        owner: &str,
        record: RunRecord,
        told: RunNotice<'_>,
    ) -> Result<(), RunError>;
}

/// A notification to write with a run's record: the settings and what
/// happened.
pub type RunNotice<'a> = Option<(
    &'a crate::config::notify::NotifySettings,
    &'a crate::notify::Occurrence,
)>;

/// Records a run (and writes its notification) in the caller's write.
pub fn finish_in(
    db: &crate::store::db::Db<'_>,
    owner: &str,
    record: &RunRecord,
    told: RunNotice<'_>,
) -> Result<(), RunError> {
    crate::store::catchup::finish(db, owner, record)?;
    if let Some((settings, o)) = told {
        crate::notify::raise_db(db, settings, o, crate::time::now_ms())?;
    }
    Ok(())
}

/// What one run found and did.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub source: String,
    pub dry_run: bool,
    /// How far back it looked, unix ms.
    pub window_from: i64,
    /// Events claimed (a dry run: would be).
    pub claimed: Vec<String>,
    /// Guids asked again (a dry run: would be).
    pub redelivery_requested: Vec<String>,
    /// Events listed that were stored already.
    pub already_stored: usize,
    /// Events that could not be taken: (event id, why).
    pub failed: Vec<(String, String)>,
    /// The API's error that ended the run early, if any.
    pub error: Option<ApiError>,
}

impl Report {
    pub fn to_json(&self) -> Value {
        json!({
            "source": self.source,
            "dry_run": self.dry_run,
            "window_from": crate::time::ms_to_secs(self.window_from),
            "claimed": self.claimed,
            "redelivery_requested": self.redelivery_requested,
            "already_stored": self.already_stored,
            "failed": self.failed.iter().map(|(id, why)| json!({"event_id": id, "error": why})).collect::<Vec<_>>(),
            "error": self.error.as_ref().map(ToString::to_string),
        })
    }

    /// The run as `catchup_runs` keeps it.
    pub fn record(&self, now: i64) -> RunRecord {
        let mut error = self.error.as_ref().map(ToString::to_string);
        if error.is_none() && !self.failed.is_empty() {
            error = Some(format!(
                "{} event(s) could not be taken, the first {}: {}",
                self.failed.len(),
                self.failed[0].0,
                self.failed[0].1
            ));
        }
        RunRecord {
            source: self.source.clone(),
            last_run_at: Some(now),
            window_from: Some(self.window_from),
            claimed: self.claimed.len() as i64,
            redelivery_requested: self.redelivery_requested.len() as i64,
            already_stored: self.already_stored as i64,
            error,
            next_run_after: self
                .error
                .as_ref()
                .and_then(ApiError::retry_after)
                .map(|d| now + d.as_millis() as i64),
        }
    }
}

/// Whether a run found events idemhook had missed: the one place this is
/// decided. [`conclude`] asks it after every run (serve's and the
/// command's): the `catchup` notification is raised there.
pub fn found_events(report: &Report) -> bool {
    !report.dry_run && (!report.claimed.is_empty() || !report.redelivery_requested.is_empty())
}

/// The end of a run that held the lease (serve's and `idemhook catchup
/// --yes`): the run recorded in `catchup_runs` and the lease given back.
/// Returns whether it found events ([`found_events`]).
pub fn conclude(
    db: &mut dyn RunDb,
    config: &Config,
    owner: &str,
    source: &str,
    result: &Result<Report, RunError>,
) -> Result<bool, RunError> {
    let now = crate::time::now_ms();
    let found = result.as_ref().is_ok_and(found_events);
    let occurrence = result.as_ref().ok().filter(|_| found).map(|report| {
        crate::notify::Occurrence::new(
            crate::notify::Condition::Catchup,
            source,
            None,
            None,
            format!(
                "catch-up of {source} found {} event(s) the provider had not delivered: \
                     {} claimed, {} asked to be delivered again",
                report.claimed.len() + report.redelivery_requested.len(),
                report.claimed.len(),
                report.redelivery_requested.len()
            ),
            serde_json::json!({
                "claimed": report.claimed.len(),
                "redelivery_requested": report.redelivery_requested.len(),
                "already_stored": report.already_stored,
            }),
        )
    });
    let told = occurrence.as_ref().map(|o| (&config.notify, o));
    let record = match result {
        Ok(report) => report.record(now),
        Err(e) => RunRecord {
            source: source.to_string(),
            last_run_at: Some(now),
            error: Some(format!("storage: {e}")),
            ..RunRecord::default()
        },
    };
    db.finish(owner, record, told)?;
    Ok(found)
}

/// One run for `source` over the last `since`: lists what the provider
/// holds, then claims (or asks again for) each event not stored, each
/// event id once. A dry run only says what it would do.
pub fn run(
    db: &mut dyn RunDb,
    config: &Arc<Config>,
    source: &Source,
    since: Duration,
    dry_run: bool,
    api: &dyn ProviderApi,
) -> Result<Report, RunError> {
    let window_from = crate::time::now_ms() - since.as_millis() as i64;
    let listing = api.list_since(window_from);
    let mut report = Report {
        source: source.name.clone(),
        dry_run,
        window_from,
        error: listing.error,
        ..Report::default()
    };
    // Each event id once (the newest entry first: GitHub lists a guid's
    // redeliveries beside its first delivery).
    let mut seen = HashSet::new();
    let unique: Vec<Found> = listing
        .found
        .into_iter()
        .filter(|f| seen.insert(f.event_id.clone()))
        .collect();
    let ids: Vec<String> = unique.iter().map(|f| f.event_id.clone()).collect();
    let stored = db.stored(&source.name, &ids)?;
    for found in unique {
        if stored.contains(&found.event_id) {
            report.already_stored += 1;
            continue;
        }
        match found.recovery {
            Recovery::Claim { body } => {
                if dry_run {
                    report.claimed.push(found.event_id);
                    continue;
                }
                match db.claim(config, &source.name, body) {
                    Ok(Decision::Accepted { .. }) => report.claimed.push(found.event_id),
                    // Delivered (or caught up by another run) since the listing.
                    Ok(Decision::Duplicate { .. } | Decision::Mismatch { .. }) => {
                        report.already_stored += 1;
                    }
                    Err(RunError::Invalid(why)) => report.failed.push((found.event_id, why)),
                    Err(e) => return Err(e),
                }
            }
            Recovery::Redeliver { delivery_id, .. } => {
                if dry_run {
                    report.redelivery_requested.push(found.event_id);
                    continue;
                }
                match api.redeliver(&delivery_id) {
                    Ok(()) => report.redelivery_requested.push(found.event_id),
                    Err(
                        e @ ApiError::Status {
                            status: 404 | 422, ..
                        },
                    ) => {
                        report.failed.push((found.event_id, e.to_string()));
                    }
                    Err(e) => {
                        // Rate limited, refused or down: the rest waits
                        // for the next run.
                        report.error = Some(e);
                        break;
                    }
                }
            }
        }
    }
    Ok(report)
}

/// The claim of an event the API handed over, as a delivery of `source`
/// would make it (key, type and hash by the source's rules), with outcome
/// `catchup` and no signature, and the source it is claimed for.
pub fn claim_of<'c>(
    config: &'c Config,
    source: &str,
    body: Vec<u8>,
) -> Result<(&'c Source, Claim), RunError> {
    let Some(s) = config.source(source) else {
        return Err(RunError::NotFound(format!(
            "source {source} is not in the config"
        )));
    };
    let remote = s.catchup.as_ref().map_or("", |c| c.api_url.as_str());
    let claim = claim_for(s, body, remote).map_err(RunError::Invalid)?;
    Ok((s, claim))
}

fn claim_for(source: &Source, body: Vec<u8>, remote: &str) -> Result<Claim, String> {
    let json: Value =
        serde_json::from_slice(&body).map_err(|e| format!("the event is not JSON: {e}"))?;
    let input = Input {
        headers: &[],
        json: Some(Json::Parsed(&json)),
        form: None,
        body: &body,
    };
    let event_id = match (source.key.extract(&input), &source.key_fallback) {
        (Ok(id), _) => Ok(id),
        (Err(crate::receive::key::KeyError::Missing(_)), Some(fallback)) => {
            fallback.extract(&input)
        }
        (Err(e), _) => Err(e),
    }
    .map_err(|e| format!("the source's key: {e}"))?;
    let event_type = source.type_of(&input);
    let payload_hash = match crate::receive::ingest::listed_hash(source, &input) {
        Some(listed) => listed,
        None => crate::receive::ingest::hash_of(source, &body, &input),
    };
    Ok(Claim {
        event_id,
        event_type,
        json: Some(json.clone()),
        body,
        content_type: Some("application/json".to_string()),
        headers: Vec::new(),
        kept_headers: "{}".to_string(),
        payload_hash,
        verified_with: None,
        signed_at: None,
        received_at: crate::time::now_ms(),
        remote: remote.to_string(),
        batch: None,
        reingest: false,
        catchup: true,
    })
}

/// The claim's write: in `db`'s transaction, then a NOTIFY on PostgreSQL
/// when it wrote forward jobs (every instance's workers wake).
pub fn claim_write(db: &Db<'_>, source: &Source, claim: &Claim) -> Result<Decision, RunError> {
    let decision = crate::with_tx!(db, |tx| claim_in(tx, source, claim))?;
    if let Decision::Accepted { forward_jobs, .. } = &decision
        && *forward_jobs > 0
    {
        crate::store::jobs::wake_workers(db)?;
    }
    Ok(decision)
}

/// A run's owner name for the lease: this process, and a random part.
pub fn owner_name() -> String {
    format!("{}-{:08x}", std::process::id(), fastrand::u32(..))
}
