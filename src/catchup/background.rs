//! `serve`'s catch-ups: a thread that runs each source's catch-up at
//! start and then every `interval` (sources with `interval = "0s"` only
//! by command), under the source's lease in `catchup_runs` (one instance
//! at a time on PostgreSQL; another instance's run in the meantime
//! counts as this one's). A run's errors are logged and recorded, never
//! fatal. Serve counts what the runs found (`idemhook_catchup_events_total`,
//! `metrics.rs`) in the callback it hands over.

use std::collections::HashSet;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::{
    Report, RunDb, RunError, RunNotice, claim_of, claim_write, conclude, found_events, owner_name,
    run,
};
use crate::config::Config;
use crate::receive::ingest::Decision;
use crate::store::backend::Backend;
use crate::store::catchup::{self, RunRecord};

/// What serve does with a run's report once it is recorded (counts it
/// and wakes the outbox when it claimed events).
pub type OnReport = Box<dyn Fn(&Report) + Send>;

/// The thread of `serve`'s catch-ups.
pub struct Background {
    inner: Option<(Arc<StopSignal>, JoinHandle<()>)>,
}

type StopSignal = (Mutex<bool>, Condvar);

impl Background {
    /// Starts the thread when any source catches up by itself.
    pub fn start<B: Backend>(config: Arc<Config>, backend: Arc<B>, found: OnReport) -> Background {
        let any = config
            .sources
            .iter()
            .any(|s| s.catchup.as_ref().is_some_and(|c| !c.interval.is_zero()));
        if !any {
            return Background { inner: None };
        }
        let signal: Arc<StopSignal> = Arc::new((Mutex::new(false), Condvar::new()));
        let thread_signal = signal.clone();
        let spawned = std::thread::Builder::new()
            .name("idemhook-catchup".into())
            .spawn(move || schedule(&config, &backend, &found, &thread_signal));
        match spawned {
            Ok(handle) => Background {
                inner: Some((signal, handle)),
            },
            Err(e) => {
                crate::log::error(
                    "cannot start the catch-up thread",
                    &[("error", &e), ("effect", &"no catch-up runs until restart")],
                );
                Background { inner: None }
            }
        }
    }

    /// Stops the thread after the run under way.
    pub fn stop(self) {
        if let Some((signal, handle)) = self.inner {
            if let Ok(mut stopping) = signal.0.lock() {
                *stopping = true;
                signal.1.notify_all();
            }
            let _ = handle.join();
        }
    }
}

fn schedule<B: Backend>(
    config: &Arc<Config>,
    backend: &Arc<B>,
    found: &OnReport,
    signal: &StopSignal,
) {
    let sources: Vec<(String, Duration)> = config
        .sources
        .iter()
        .filter_map(|s| {
            let c = s.catchup.as_ref()?;
            (!c.interval.is_zero()).then(|| (s.name.clone(), c.interval))
        })
        .collect();
    let started = Instant::now();
    let mut due: Vec<Instant> = sources.iter().map(|_| started).collect();
    loop {
        let now = Instant::now();
        for (i, (name, interval)) in sources.iter().enumerate() {
            if due[i] <= now {
                run_in_serve(config, backend, found, name);
                due[i] = Instant::now() + *interval;
            }
        }
        let next = due.iter().min().copied().unwrap_or(now);
        let Ok(guard) = signal.0.lock() else {
            return;
        };
        if *guard {
            return;
        }
        let wait = next.saturating_duration_since(Instant::now());
        match signal.1.wait_timeout(guard, wait) {
            Ok((guard, _)) if !*guard => {}
            _ => return,
        }
    }
}

/// One run of `name`'s catch-up inside serve, logged and counted.
fn run_in_serve<B: Backend>(config: &Arc<Config>, backend: &Arc<B>, found: &OnReport, name: &str) {
    let Some(source) = config.source(name) else {
        return;
    };
    let Some(c) = &source.catchup else {
        return;
    };
    let owner = owner_name();
    let mut db = BackendDb {
        config: config.clone(),
        backend: backend.clone(),
    };
    match db.lease(name, &owner, true) {
        Ok(true) => {}
        Ok(false) => return,
        Err(e) => {
            crate::log::warn(
                "catchup skipped",
                &[
                    ("source", &name),
                    ("error", &e),
                    ("effect", &"tried again next interval"),
                ],
            );
            return;
        }
    }
    let api = super::api_for(c);
    let result = run(&mut db, config, source, c.window, false, api.as_ref());
    if let Err(e) = conclude(&mut db, config, &owner, name, &result) {
        crate::log::warn("catchup not recorded", &[("source", &name), ("error", &e)]);
    }
    match result {
        Ok(report) => {
            found(&report);
            log_report(&report);
        }
        Err(e) => crate::log::warn(
            "catchup failed",
            &[
                ("source", &name),
                ("error", &e),
                ("effect", &"tried again next interval"),
            ],
        ),
    }
}

/// The run's log line: info, or a warning naming the API's error.
pub fn log_report(report: &Report) {
    let fields: [(&str, &dyn std::fmt::Display); 5] = [
        ("source", &report.source),
        ("claimed", &report.claimed.len()),
        ("redelivery_requested", &report.redelivery_requested.len()),
        ("already_stored", &report.already_stored),
        ("failed", &report.failed.len()),
    ];
    match &report.error {
        Some(e) => {
            let mut all = fields.to_vec();
            all.push(("error", e));
            all.push(("effect", &"the rest waits for the next run"));
            crate::log::warn("catchup incomplete", &all);
        }
        None if found_events(report) => crate::log::info("catchup found events", &fields),
        None => crate::log::info("catchup", &fields),
    }
}

/// Serve's backend as a run's storage (on SQLite, writes go through the
/// one writer).
struct BackendDb<B: Backend> {
    config: Arc<Config>,
    backend: Arc<B>,
}

impl<B: Backend> RunDb for BackendDb<B> {
    fn stored(&mut self, source: &str, ids: &[String]) -> Result<HashSet<String>, RunError> {
        self.backend
            .read(|db| catchup::stored_ids(db, source, ids).map_err(RunError::from))
    }

    fn claim(
        &mut self,
        config: &Arc<Config>,
        source: &str,
        body: Vec<u8>,
    ) -> Result<Decision, RunError> {
        let (_, claim) = claim_of(config, source, body)?;
        let (config, source) = (config.clone(), source.to_string());
        self.backend.write(move |db| {
            let s = config.source(&source).ok_or_else(|| {
                RunError::NotFound(format!("source {source} is not in the config"))
            })?;
            claim_write(db, s, &claim)
        })
    }

    fn lease(&mut self, source: &str, owner: &str, honour: bool) -> Result<bool, RunError> {
        let (source, owner) = (source.to_string(), owner.to_string());
        self.backend.write(move |db| {
            catchup::take_lease(db, &source, &owner, super::LEASE_MS, honour)
                .map_err(RunError::from)
        })
    }

    fn finish(
        &mut self,
        owner: &str,
        record: RunRecord,
        told: RunNotice<'_>,
    ) -> Result<(), RunError> {
        let owner = owner.to_string();
        // The settings are serve's own (`told` names them for the command).
        let occurrence = told.map(|(_, o)| o.clone());
        let config = self.config.clone();
        self.backend.write(move |db| {
            let told = occurrence.as_ref().map(|o| (&config.notify, o));
            super::finish_in(db, &owner, &record, told)
        })
    }
}
