//! The notifier: one thread of its own (a target that is down never slows
//! deliveries or forward jobs) that writes what the [`Watch`] counted,
//! takes the due rows, sends each, records the result, and retries a
//! failed send with backoff until [`GIVE_UP_MS`] after it was due.
//! Storage that is down is told from memory and recorded once it is back.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use super::message::Message;
use super::send::send;
use super::{COALESCED, Condition, FAILED, Occurrence, SENT, STORAGE_DOWN_MS, Watch, raise_db};
use crate::config::Config;
use crate::store::StoreError;
use crate::store::backend::Backend;
use crate::store::notifications::{self, Ended, NewRow, Taken};
use crate::time::now_ms;

/// How often the notifier looks for due rows.
const TICK: Duration = Duration::from_millis(250);
/// A taken row is due again after this if its send was never recorded.
const LEASE_MS: i64 = 60_000;
/// The first retry's delay; doubled per attempt up to [`RETRY_MAX_MS`].
const RETRY_INITIAL_MS: i64 = 1_000;
const RETRY_MAX_MS: i64 = 10 * 60_000;
/// A message still not accepted this long after it was due has failed.
const GIVE_UP_MS: i64 = 24 * 3_600_000;
/// Sent and failed notifications are kept this long, then deleted.
pub const KEEP_MS: i64 = 30 * 24 * 3_600_000;
/// How often the old ones are looked for.
const PRUNE_EVERY_MS: i64 = 3_600_000;

pub struct Notifier {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<()>,
}

impl Notifier {
    /// Starts the thread; None when no target is configured. `metrics`
    /// is serve's `Metrics`, of which the notifier reads only the
    /// [`Watch`] (so `notify/` does not import `metrics.rs`).
    pub fn start<B: Backend, M: AsRef<Watch> + Send + Sync + 'static>(
        config: Arc<Config>,
        backend: Arc<B>,
        metrics: Arc<M>,
    ) -> std::io::Result<Option<Notifier>> {
        if config.notify.targets.is_empty() {
            return Ok(None);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::Builder::new()
            .name("idemhook-notify".to_string())
            .spawn(move || {
                let mut down = StorageDown::default();
                let mut pruned_at = 0;
                while !flag.load(Ordering::Relaxed) {
                    let now = now_ms();
                    if now - pruned_at >= PRUNE_EVERY_MS {
                        pruned_at = now;
                        prune_old(&*backend, now);
                    }
                    let watch: &Watch = (*metrics).as_ref();
                    write_watched(&config, &*backend, watch);
                    storage_watch(&config, &*backend, watch, &mut down, now);
                    if let Err(e) = round(&config, &*backend, watch, &flag) {
                        crate::log::warn("notify", &[("error", &e.message)]);
                    }
                    std::thread::sleep(TICK);
                }
            })?;
        Ok(Some(Notifier { stop, handle }))
    }

    /// Stops after the send under way, if any (each is bounded).
    pub fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.handle.join();
    }
}

/// Deletes sent and failed notifications older than [`KEEP_MS`], in
/// batches of 500 (each its own short write).
fn prune_old<B: Backend>(backend: &B, now: i64) {
    loop {
        match backend.write(move |db| notifications::prune(db, now - KEEP_MS, 500)) {
            Ok(500) => continue,
            Ok(_) => break,
            Err(e) => {
                crate::log::warn("notify", &[("error", &e.message)]);
                break;
            }
        }
    }
}

/// Writes the occurrences counted in memory (bad signatures).
fn write_watched<B: Backend>(config: &Arc<Config>, backend: &B, watch: &Watch) {
    for o in watch.take_pending() {
        let c = config.clone();
        let now = now_ms();
        if let Err(e) = backend.write(move |db| raise_db(db, &c.notify, &o, now)) {
            crate::log::warn("notify", &[("error", &e.message)]);
        }
    }
}

/// One round: the due rows taken, sent, recorded.
fn round<B: Backend>(
    config: &Arc<Config>,
    backend: &B,
    watch: &Watch,
    stop: &AtomicBool,
) -> Result<(), StoreError> {
    let now = now_ms();
    if !backend.read(|db| notifications::any_due(db, now))? {
        return Ok(());
    }
    let taken = backend.write(move |db| notifications::take(db, now, LEASE_MS, 8))?;
    for t in taken {
        if stop.load(Ordering::Relaxed) {
            // Left due again after its lease.
            break;
        }
        deliver(config, backend, watch, t)?;
    }
    Ok(())
}

/// Sends one row and records the result.
fn deliver<B: Backend>(
    config: &Arc<Config>,
    backend: &B,
    watch: &Watch,
    t: Taken,
) -> Result<(), StoreError> {
    let Some(target) = config.notify.target(&t.notify) else {
        let ended = Ended::Failed {
            error: "the target is no longer in the config".to_string(),
        };
        let now = now_ms();
        backend.write(move |db| notifications::record(db, &t, &ended, now))?;
        return Ok(());
    };
    let message = Message::of_row(&t, config.notify.ui_url.as_deref());
    let result = send(target, &message, &format!("ntf_{}", t.id), now_ms());
    let now = now_ms();
    let ended = match &result {
        Ok(()) => Ended::Sent,
        Err(error) if now - t.due_at >= GIVE_UP_MS => Ended::Failed {
            error: error.clone(),
        },
        Err(error) => Ended::Retry {
            next: now + backoff(t.attempt),
            error: error.clone(),
        },
    };
    match &ended {
        Ended::Sent => {
            watch.count(&t.notify, &t.condition, SENT, 1);
            if t.due_at > t.created_at {
                let n = u64::try_from(t.count).unwrap_or(0);
                watch.count(&t.notify, &t.condition, COALESCED, n);
            }
        }
        Ended::Retry { error, .. } | Ended::Failed { error } => {
            watch.count(&t.notify, &t.condition, FAILED, 1);
            crate::log::warn(
                "notify",
                &[
                    ("notify", &t.notify),
                    ("condition", &t.condition),
                    ("attempt", &t.attempt),
                    ("error", error),
                ],
            );
        }
    }
    let row = t.clone();
    backend.write(move |db| notifications::record(db, &row, &ended, now))?;
    Ok(())
}

/// The delay before attempt `attempt + 1`: doubling, capped, with jitter
/// (between half and all of it).
fn backoff(attempt: i64) -> i64 {
    let exp = u32::try_from(attempt.clamp(1, 30) - 1).unwrap_or(0);
    let full = RETRY_INITIAL_MS
        .saturating_mul(1i64 << exp.min(20))
        .min(RETRY_MAX_MS);
    full / 2 + fastrand::i64(0..=full / 2)
}

/// Storage that refused deliveries: when it was told (from memory).
#[derive(Default)]
struct StorageDown {
    told: Option<Told>,
}

/// A `storage_unavailable` message sent from memory, to record later.
struct Told {
    at: i64,
    /// Each target's name and whether it accepted the message.
    outcomes: Vec<(String, bool)>,
    summary: String,
}

/// `storage_unavailable`: deliveries refused for storage for 60 s in a
/// row are told at once from memory (nothing can be written); once a
/// delivery is stored again, that message is recorded and a "writable
/// again" one raised like any other.
fn storage_watch<B: Backend>(
    config: &Arc<Config>,
    backend: &B,
    watch: &Watch,
    down: &mut StorageDown,
    now: i64,
) {
    if !config.notify.wants(Condition::StorageUnavailable) {
        return;
    }
    let since = watch.unavailable_since.load(Ordering::Relaxed);
    if since != 0 && down.told.is_none() && now - since >= STORAGE_DOWN_MS {
        let summary = format!(
            "storage unavailable: deliveries have been refused (503) for {} s in a row",
            (now - since) / 1000
        );
        let o = Occurrence::new(
            Condition::StorageUnavailable,
            "",
            None,
            None,
            summary.clone(),
            serde_json::json!({ "refused_since": since / 1000 }),
        );
        let mut outcomes = Vec::new();
        for target in config
            .notify
            .targets
            .iter()
            .filter(|t| t.on.contains(&Condition::StorageUnavailable))
        {
            let m = Message {
                condition: o.condition.as_str().to_string(),
                source: None,
                action: None,
                event_id: None,
                count: 1,
                at: now / 1000,
                summary: summary.clone(),
                details: o.details.clone(),
                link: config.notify.ui_url.as_ref().map(|u| format!("{u}/ui/")),
            };
            let ok = send(target, &m, &format!("ntf_storage_{since}"), now).is_ok();
            watch.count(
                &target.name,
                o.condition.as_str(),
                if ok { SENT } else { FAILED },
                1,
            );
            outcomes.push((target.name.clone(), ok));
        }
        down.told = Some(Told {
            at: now,
            outcomes,
            summary,
        });
    }
    if since == 0
        && let Some(Told {
            at,
            outcomes,
            summary,
        }) = down.told.take()
    {
        let c = config.clone();
        let recorded = backend.write(move |db| {
            for (name, ok) in &outcomes {
                notifications::put_sent(
                    db,
                    &NewRow {
                        notify: name,
                        condition: Condition::StorageUnavailable.as_str(),
                        source: "",
                        action: "",
                        event_id: None,
                        summary: &summary,
                        details: "{}",
                    },
                    if *ok { "sent" } else { "failed" },
                    at,
                    at,
                )?;
            }
            let back = Occurrence::new(
                Condition::StorageUnavailable,
                "",
                None,
                None,
                "storage is writable again: deliveries are being stored".to_string(),
                serde_json::json!({ "writable": true }),
            );
            raise_db(db, &c.notify, &back, now_ms())
        });
        if let Err(e) = recorded {
            crate::log::warn("notify", &[("error", &e.message)]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_within_its_cap() {
        for attempt in 1..40 {
            let d = backoff(attempt);
            let full = (RETRY_INITIAL_MS << (attempt - 1).min(20)).min(RETRY_MAX_MS);
            assert!(d >= full / 2 && d <= full, "attempt {attempt}: {d}");
        }
    }
}
