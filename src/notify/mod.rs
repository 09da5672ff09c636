//! Notifications: telling people through `[[notify]]` targets (Slack,
//! a JSON webhook, email) when something needs them, without Prometheus.
//!
//! Raising a condition is one call at its cause:
//! - in a transaction of the claim or the outbox (any `store::Tx`):
//!   [`raise`]`(tx, &config.notify, &Occurrence::new(..), now)`;
//! - on a `store::db::Db` (an operator write, the notifier's own):
//!   [`raise_db`].
//!
//! Either writes, in that same transaction, a row per target that wants
//! the condition (`store::notifications`, coalesced there), and nothing
//! at all when no target wants it. The [`Notifier`] thread sends the rows
//! afterwards, retried with backoff; a rolled-back cause leaves no row.
//! What is counted in memory (bad signatures, storage refusals) is the
//! [`Watch`]'s, which the notifier turns into rows (or, for storage that is
//! down, into messages sent from memory and recorded once it is back).
//!
//! Owns: raising the conditions, the messages' text and shapes
//! (`message.rs`), the senders (`send.rs`) and the notifier thread
//! (`notifier.rs`). Not the conditions' words (`config/notify.rs`), the
//! rows' SQL (`store/notifications.rs`) nor the `notify` commands
//! (`ops/notify.rs`).

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use serde_json::Value as Json;

use crate::config::Config;
use crate::config::notify::NotifySettings;
use crate::store::StoreError;
use crate::store::db::Db;
use crate::store::notifications::{self, NewRow};
use crate::store::tx::Tx;

pub mod message;
mod notifier;
pub mod send;

pub use notifier::Notifier;

pub use crate::config::notify::Condition;

/// One occurrence of a condition.
#[derive(Debug, Clone)]
pub struct Occurrence {
    pub condition: Condition,
    /// '' where the condition has none.
    pub source: String,
    pub action: String,
    pub event_id: Option<String>,
    /// One line for people.
    pub summary: String,
    /// The condition's facts (a JSON object).
    pub details: Json,
}

impl Occurrence {
    pub fn new(
        condition: Condition,
        source: &str,
        action: Option<&str>,
        event_id: Option<&str>,
        summary: String,
        details: Json,
    ) -> Occurrence {
        Occurrence {
            condition,
            source: source.to_string(),
            action: action.unwrap_or("").to_string(),
            event_id: event_id.map(str::to_string),
            summary,
            details,
        }
    }
}

/// Raises `o` in the open transaction `tx` of its cause: a row per target
/// that wants it, committed with the cause or not at all. Costs nothing
/// when no target wants the condition.
pub fn raise<T: Tx>(
    tx: &mut T,
    settings: &NotifySettings,
    o: &Occurrence,
    now: i64,
) -> Result<(), StoreError> {
    if !settings.wants(o.condition) {
        return Ok(());
    }
    match tx.shared_db() {
        Some(db) => raise_db(&db, settings, o, now),
        None => Ok(()),
    }
}

/// [`raise`] on a `Db` in its caller's transaction.
pub fn raise_db(
    db: &Db<'_>,
    settings: &NotifySettings,
    o: &Occurrence,
    now: i64,
) -> Result<(), StoreError> {
    let details = o.details.to_string();
    let coalesce_ms = i64::try_from(settings.coalesce.as_millis()).unwrap_or(i64::MAX / 4);
    for t in settings
        .targets
        .iter()
        .filter(|t| t.on.contains(&o.condition))
    {
        notifications::put(
            db,
            &NewRow {
                notify: &t.name,
                condition: o.condition.as_str(),
                source: &o.source,
                action: &o.action,
                event_id: o.event_id.as_deref(),
                summary: &o.summary,
                details: &details,
            },
            now,
            coalesce_ms,
        )?;
    }
    Ok(())
}

/// A forward job failed for good: `dead_letter`, with its last attempt's
/// error kind, HTTP status and error.
#[allow(clippy::too_many_arguments)]
pub fn dead_letter<T: Tx>(
    tx: &mut T,
    config: &Config,
    source: &str,
    action: &str,
    event_id: &str,
    error_kind: Option<&str>,
    http_status: Option<u16>,
    error: Option<&str>,
    now: i64,
) -> Result<(), StoreError> {
    if !config.notify.wants(Condition::DeadLetter) {
        return Ok(());
    }
    let why = error.unwrap_or("no error recorded");
    let o = Occurrence::new(
        Condition::DeadLetter,
        source,
        Some(action),
        Some(event_id),
        format!("dead letter on {source}/{action}: event {event_id} failed for good ({why})"),
        serde_json::json!({
            "error_kind": error_kind,
            "http_status": http_status,
            "error": error,
        }),
    );
    raise(tx, &config.notify, &o, now)
}

/// An SQL action's job failed in the claim (its statement's error):
/// `dead_letter` too, a job failed for good until replayed.
pub fn sql_failed<T: Tx>(
    tx: &mut T,
    config: &Config,
    source: &str,
    action: &str,
    event_id: &str,
    now: i64,
) -> Result<(), StoreError> {
    if !config.notify.wants(Condition::DeadLetter) {
        return Ok(());
    }
    let error = match tx.shared_db() {
        Some(db) => notifications::job_error(&db, source, event_id, action)?,
        None => return Ok(()),
    };
    dead_letter(
        tx,
        config,
        source,
        action,
        event_id,
        Some("sql"),
        None,
        error.as_deref(),
        now,
    )
}

/// A duplicate came with a different payload: `mismatch`.
pub fn mismatch<T: Tx>(
    tx: &mut T,
    config: &Config,
    source: &str,
    event_id: &str,
    now: i64,
) -> Result<(), StoreError> {
    if !config.notify.wants(Condition::Mismatch) {
        return Ok(());
    }
    let o = Occurrence::new(
        Condition::Mismatch,
        source,
        None,
        Some(event_id),
        format!(
            "payload mismatch on {source}: event {event_id} came again with a different payload (incident recorded)"
        ),
        serde_json::json!({ "incident": "payload_mismatch" }),
    );
    raise(tx, &config.notify, &o, now)
}

/// Counts one more occurrence for source `index` at `now` in its sliding
/// window of [`SIGNATURE_WINDOW_MS`]; true (and the count starts over)
/// once `threshold` are in the window.
fn crossed(queues: &Mutex<Vec<VecDeque<i64>>>, index: usize, now: i64, threshold: usize) -> bool {
    let Ok(mut all) = queues.lock() else {
        return false;
    };
    let Some(q) = all.get_mut(index) else {
        return false;
    };
    q.push_back(now);
    while q.front().is_some_and(|t| *t <= now - SIGNATURE_WINDOW_MS) {
        q.pop_front();
    }
    let crossed = q.len() >= threshold;
    if crossed {
        q.clear();
    }
    crossed
}

/// Bad signatures to one source that make a `signature_failures`.
pub const SIGNATURE_FAILURES: usize = 10;
/// Within this window (ms).
pub const SIGNATURE_WINDOW_MS: i64 = 5 * 60 * 1000;
/// Refused deliveries kept for one source that make a `rejected`, within
/// [`SIGNATURE_WINDOW_MS`] too.
pub const REJECTED_KEPT: usize = 10;
/// Deliveries refused for storage this long in a row make a
/// `storage_unavailable` (ms).
pub const STORAGE_DOWN_MS: i64 = 60_000;

/// What notifications count in memory, shared by the request threads and
/// the notifier: bad signatures per source, storage refusals in a row,
/// and the occurrences waiting for the notifier to write them. Each call
/// is nothing but a flag test when no target wants its condition.
pub struct Watch {
    sources: Vec<String>,
    wants_signatures: bool,
    wants_storage: bool,
    wants_rejected: bool,
    signatures: Mutex<Vec<VecDeque<i64>>>,
    rejected: Mutex<Vec<VecDeque<i64>>>,
    /// When deliveries began to be refused for storage (0: they are not).
    pub(crate) unavailable_since: AtomicI64,
    pending: Mutex<Vec<Occurrence>>,
    /// [target][condition][outcome: sent, failed, coalesced]
    counts: Vec<[[AtomicU64; 3]; 8]>,
    targets: Vec<String>,
    /// Each target's conditions, for the metric's series.
    target_on: Vec<Vec<Condition>>,
}

impl Watch {
    pub fn new(config: &Config) -> Watch {
        let n = config.sources.len();
        Watch {
            sources: config.sources.iter().map(|s| s.name.clone()).collect(),
            wants_signatures: config.notify.wants(Condition::SignatureFailures),
            wants_storage: config.notify.wants(Condition::StorageUnavailable),
            wants_rejected: config.notify.wants(Condition::Rejected),
            signatures: Mutex::new(vec![VecDeque::new(); n]),
            rejected: Mutex::new(vec![VecDeque::new(); n]),
            unavailable_since: AtomicI64::new(0),
            pending: Mutex::new(Vec::new()),
            counts: config
                .notify
                .targets
                .iter()
                .map(|_| std::array::from_fn(|_| std::array::from_fn(|_| AtomicU64::new(0))))
                .collect(),
            targets: config
                .notify
                .targets
                .iter()
                .map(|t| t.name.clone())
                .collect(),
            target_on: config.notify.targets.iter().map(|t| t.on.clone()).collect(),
        }
    }

    /// A delivery to source `index` was refused for its signature.
    pub fn bad_signature(&self, index: usize, now: i64) {
        if !self.wants_signatures || !crossed(&self.signatures, index, now, SIGNATURE_FAILURES) {
            return;
        }
        if let Some(source) = self.sources.get(index) {
            let o = Occurrence::new(
                Condition::SignatureFailures,
                source,
                None,
                None,
                format!(
                    "{SIGNATURE_FAILURES} deliveries to {source} failed signature verification within 5 minutes (a rotated or mistyped secret?)"
                ),
                serde_json::json!({
                    "bad_signatures": SIGNATURE_FAILURES,
                    "within_seconds": SIGNATURE_WINDOW_MS / 1000,
                }),
            );
            if let Ok(mut p) = self.pending.lock() {
                p.push(o);
            }
        }
    }

    /// A refused delivery to source `index` was kept (for `reingest`).
    pub fn kept_refusal(&self, index: usize, now: i64) {
        if !self.wants_rejected || !crossed(&self.rejected, index, now, REJECTED_KEPT) {
            return;
        }
        if let Some(source) = self.sources.get(index) {
            let o = Occurrence::new(
                Condition::Rejected,
                source,
                None,
                None,
                format!(
                    "{REJECTED_KEPT} refused deliveries to {source} were kept within 5 minutes: \
                     fix the secret or the rule, then `idemhook reingest --source {source}`"
                ),
                serde_json::json!({
                    "kept": REJECTED_KEPT,
                    "within_seconds": SIGNATURE_WINDOW_MS / 1000,
                }),
            );
            if let Ok(mut p) = self.pending.lock() {
                p.push(o);
            }
        }
    }

    /// A delivery was refused because storage failed.
    pub fn storage_failed(&self, now: i64) {
        if self.wants_storage {
            let _ = self.unavailable_since.compare_exchange(
                0,
                now.max(1),
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        }
    }

    /// A delivery was stored (one atomic load when storage was fine).
    pub fn storage_ok(&self) {
        if self.wants_storage && self.unavailable_since.load(Ordering::Relaxed) != 0 {
            self.unavailable_since.store(0, Ordering::Relaxed);
        }
    }

    pub(crate) fn take_pending(&self) -> Vec<Occurrence> {
        self.pending
            .lock()
            .map(|mut p| std::mem::take(&mut *p))
            .unwrap_or_default()
    }

    /// Counts a message's outcome for `idemhook_notifications_total`.
    pub fn count(&self, target: &str, condition: &str, outcome: usize, n: u64) {
        let (Some(t), Some(c)) = (
            self.targets.iter().position(|x| x == target),
            Condition::ALL.iter().position(|x| x.as_str() == condition),
        ) else {
            return;
        };
        if let Some(slot) = self.counts.get(t).and_then(|row| row[c].get(outcome)) {
            slot.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// `idemhook_notifications_total{notify,condition,outcome}`, for the
    /// targets' conditions.
    pub fn render(&self, out: &mut String) {
        use std::fmt::Write as _;
        if self.targets.is_empty() {
            return;
        }
        out.push_str(
            "# HELP idemhook_notifications_total Notification messages by target, condition and outcome (sent, failed; coalesced: occurrences folded into a window's message).\n",
        );
        out.push_str("# TYPE idemhook_notifications_total counter\n");
        for (t, (name, on)) in self.targets.iter().zip(&self.target_on).enumerate() {
            for (c, condition) in Condition::ALL.iter().enumerate() {
                if !on.contains(condition) {
                    continue;
                }
                for (o, outcome) in ["sent", "failed", "coalesced"].iter().enumerate() {
                    let n = self
                        .counts
                        .get(t)
                        .map_or(0, |row| row[c][o].load(Ordering::Relaxed));
                    let _ = writeln!(
                        out,
                        "idemhook_notifications_total{{notify=\"{}\",condition=\"{}\",outcome=\"{outcome}\"}} {n}",
                        name,
                        condition.as_str()
                    );
                }
            }
        }
    }
}

/// The outcomes counted, by position.
pub const SENT: usize = 0;
pub const FAILED: usize = 1;
pub const COALESCED: usize = 2;

#[cfg(test)]
mod tests {
    use super::*;

    fn config(on: &str) -> Config {
        let text = format!(
            "[[notify]]\nname = \"a\"\nwebhook = \"http://127.0.0.1:9/x\"\non = {on}\n\n[sources.s]\nkind = \"none\"\nallow_unsigned = true\nkey = [\"json:/id\"]\n"
        );
        Config::parse(&text, "t", std::path::Path::new("."), None).unwrap()
    }

    #[test]
    fn ten_bad_signatures_within_five_minutes_make_one_occurrence() {
        let w = Watch::new(&config("[\"signature_failures\"]"));
        for i in 0..9 {
            w.bad_signature(0, 1_000 + i);
        }
        assert!(w.take_pending().is_empty());
        // The first ones age out of the window: still nine within it.
        w.bad_signature(0, 1_000 + SIGNATURE_WINDOW_MS);
        assert!(w.take_pending().is_empty());
        for i in 0..9 {
            w.bad_signature(0, 2_000 + SIGNATURE_WINDOW_MS + i);
        }
        let raised = w.take_pending();
        assert_eq!(raised.len(), 1);
        assert_eq!(raised[0].condition, Condition::SignatureFailures);
        assert_eq!(raised[0].source, "s");
        // Counted afresh after it was raised.
        w.bad_signature(0, 3_000 + SIGNATURE_WINDOW_MS);
        assert!(w.take_pending().is_empty());
    }

    #[test]
    fn storage_refusals_in_a_row_are_timed_from_the_first() {
        let w = Watch::new(&config("[\"storage_unavailable\"]"));
        w.storage_failed(5_000);
        w.storage_failed(9_000);
        assert_eq!(w.unavailable_since.load(Ordering::Relaxed), 5_000);
        w.storage_ok();
        assert_eq!(w.unavailable_since.load(Ordering::Relaxed), 0);
        // Not wanted: nothing is counted.
        let off = Watch::new(&config("[\"dead_letter\"]"));
        off.storage_failed(5_000);
        off.bad_signature(0, 1);
        assert_eq!(off.unavailable_since.load(Ordering::Relaxed), 0);
        assert!(off.signatures.lock().unwrap()[0].is_empty());
    }
}
