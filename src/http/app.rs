//! The running service's shared state: the resolved config, the storage
//! (a `store::backend::Backend`, SQLite or PostgreSQL, chosen once by
//! `serve` as the type `B`), the metrics, plus the few operations the HTTP
//! layer asks of them (`read` and `write` give the admin API a
//! `store::db::Db`). Built once by `serve` and shared by reference.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::config::{Config, Source};
use crate::metrics::{JobGauges, Metrics};
use crate::receive::ingest::{Claim, Decision, DeliveryClaims};
use crate::state::{AttemptOutcome, Delivery};
use crate::store::StoreError;
use crate::store::backend::{Backend, Refusal};
use crate::store::db::{Db, TxError};

pub struct App<B: Backend> {
    pub config: Arc<Config>,
    pub backend: Arc<B>,
    pub metrics: Arc<Metrics>,
    /// Wakes the forward workers when new jobs were committed.
    pub wake_outbox: Box<dyn Fn() + Send + Sync>,
    pub admin_limiter: crate::http::auth::AuthLimiter,
    /// The inspector's signed-in browsers (in memory: a restart ends them).
    pub ui_sign_ins: crate::http::auth::SignIns,
    /// The inspector's overview: delivery counts of minutes that are over.
    pub overview_cache: crate::ops::inspector::OverviewCache,
    /// `/readyz` probes, at most one in flight.
    pub readiness: crate::http::readiness::Coalesced,
}

impl<B: Backend> App<B> {
    /// Runs `f` on a connection for reading (`Backend::read`); a
    /// connection that cannot be had is a storage error (the API answers
    /// 503).
    pub fn read<T, E: TxError>(&self, f: impl FnOnce(&Db<'_>) -> Result<T, E>) -> Result<T, E> {
        self.backend.read(f)
    }

    /// Runs `f` as one write (`Backend::write`: on PostgreSQL it may run
    /// more than once). An error of `f` undoes what it wrote: a refusal
    /// comes back as itself, a storage failure fails the call.
    pub fn write<T, E>(
        &self,
        f: impl FnMut(&Db<'_>) -> Result<T, E> + Send + 'static,
    ) -> Result<T, E>
    where
        T: Send + 'static,
        E: TxError + Send + 'static,
    {
        self.backend.write(f)
    }

    /// Gives the sources whose provider hands its secret over in a
    /// handshake (Asana, Notion) the one kept in the database, if any.
    pub fn learn_handshake_secrets(&self) -> Result<(), StoreError> {
        for source in &self.config.sources {
            self.learn_handshake_secret(source)?;
        }
        Ok(())
    }

    /// The secret kept for `source` from its provider's handshake, learned
    /// unless known already (another instance may have kept it since);
    /// true when it was new.
    pub fn learn_handshake_secret(&self, source: &Source) -> Result<bool, StoreError> {
        let hands_over = source.kind.preset().is_some_and(|p| {
            matches!(
                p.handshake,
                crate::config::presets::Handshake::Asana
                    | crate::config::presets::Handshake::Notion
            )
        });
        if !hands_over || source.secret_count > 0 {
            return Ok(false);
        }
        let kept = self.read(|db| crate::store::meta::handed_over(db, &source.name))?;
        match kept {
            Some(secret) if !source.verifier.knows(&secret) => {
                source
                    .verifier
                    .learn(&crate::verify::Secret::new(secret))
                    .map_err(StoreError::other)?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    pub fn source(&self, name: &str) -> Option<(usize, &Source)> {
        self.config
            .sources
            .iter()
            .enumerate()
            .find(|(_, s)| s.name == name)
    }

    /// Claims an event; returns once it is committed.
    pub fn claim(&self, source_index: usize, claim: Claim) -> Result<Decision, StoreError> {
        self.claim_batch(source_index, vec![claim])
            .and_then(|mut outcomes| {
                outcomes
                    .pop()
                    .ok_or_else(|| StoreError::other("no outcome"))
            })
    }

    /// Claims every event of one delivery (a batch's) in one transaction;
    /// returns once it is committed, with each event's outcome in order.
    pub fn claim_batch(
        &self,
        source_index: usize,
        claims: Vec<Claim>,
    ) -> Result<Vec<Decision>, StoreError> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.backend
            .claim_then(self.delivery(source_index, claims), move |outcomes| {
                let _ = tx.send(outcomes);
            });
        let outcomes = rx.recv().unwrap_or_else(|_| Err(StoreError::closed()));
        self.claimed(source_index, &outcomes);
        outcomes
    }

    /// Like [`App::claim`] but returns at once; `then` gets the outcome on
    /// another thread after the commit (it is dropped uncalled if the
    /// storage has stopped).
    pub fn claim_then(
        self: &Arc<Self>,
        source_index: usize,
        claim: Claim,
        then: impl FnOnce(Result<Decision, StoreError>) + Send + 'static,
    ) {
        self.claim_batch_then(source_index, vec![claim], move |outcomes| {
            then(outcomes.and_then(|mut o| o.pop().ok_or_else(|| StoreError::other("no outcome"))));
        });
    }

    /// Like [`App::claim_batch`] but returns at once, as [`App::claim_then`].
    pub fn claim_batch_then(
        self: &Arc<Self>,
        source_index: usize,
        claims: Vec<Claim>,
        then: impl FnOnce(Result<Vec<Decision>, StoreError>) + Send + 'static,
    ) {
        let app = self.clone();
        self.backend
            .claim_then(self.delivery(source_index, claims), move |outcomes| {
                app.claimed(source_index, &outcomes);
                then(outcomes);
            });
    }

    /// One delivery's claims as the storage runs them.
    fn delivery(&self, source_index: usize, claims: Vec<Claim>) -> Arc<DeliveryClaims> {
        Arc::new(DeliveryClaims::new(
            self.config.clone(),
            source_index,
            claims,
        ))
    }

    /// After a claim's commit: counts the SQL actions' attempts and wakes
    /// the outbox if it wrote forward jobs.
    fn claimed(&self, source_index: usize, outcomes: &Result<Vec<Decision>, StoreError>) {
        let Ok(outcomes) = outcomes else { return };
        let mut wake = false;
        for outcome in outcomes {
            let Decision::Accepted {
                forward_jobs,
                sql_runs,
                ..
            } = outcome
            else {
                continue;
            };
            self.count_sql_runs(source_index, sql_runs);
            wake |= *forward_jobs > 0;
        }
        if wake {
            (self.wake_outbox)();
        }
    }

    fn count_sql_runs(&self, source_index: usize, sql_runs: &[(usize, bool)]) {
        if let Some(source) = self.config.sources.get(source_index) {
            for &(index, ok) in sql_runs {
                if let Some(action) = source.actions.get(index) {
                    let outcome = if ok {
                        AttemptOutcome::Ok
                    } else {
                        AttemptOutcome::Failed
                    };
                    self.metrics.attempt(&source.name, &action.name, outcome);
                }
            }
        }
    }

    /// Records a refused delivery without waiting for it to commit.
    pub fn record_refusal(
        &self,
        source: &str,
        outcome: Delivery,
        remote: &str,
        detail: &str,
        at: i64,
        kept: Option<crate::store::backend::KeptRefusal>,
    ) {
        let queued = self.backend.record_refusal(Refusal {
            source: source.to_string(),
            outcome,
            remote: remote.to_string(),
            detail: detail.to_string(),
            at,
            kept,
        });
        if !queued {
            self.metrics.dropped_records.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Ready when the database takes a write now (`Backend::ready`).
    /// Probes are coalesced: a request waits for the next one to start
    /// rather than adding a write of its own.
    pub fn ready(&self) -> Result<(), StoreError> {
        self.readiness.ready(|| self.backend.ready())
    }

    pub fn render_metrics(&self) -> String {
        let (jobs, storage) = self.backend.gauges();
        let jobs = jobs.ok().map(|counts| {
            let mut g = JobGauges::default();
            for (status, n) in counts.by_status {
                g.set(status, n);
            }
            g.oldest_pending_age_secs = counts
                .oldest_pending
                .map(|at| ((crate::time::now_ms() - at).max(0) as f64) / 1000.0)
                .unwrap_or(0.0);
            g.circuits = counts.circuits;
            g
        });
        let mut out = self.metrics.render(jobs.as_ref(), &storage);
        self.admin_limiter.render_metrics(&mut out);
        // Left out while the storage cannot be read, as the job gauges are.
        if let Ok(totals) = self.backend.read(crate::store::rejected::totals) {
            let names: Vec<String> = self.config.sources.iter().map(|s| s.name.clone()).collect();
            out.push_str(&crate::metrics::render_rejected(&names, &totals));
        }
        out
    }
}
