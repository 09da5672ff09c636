//! A forward action's circuit, the decisions over `store::circuits`:
//!
//! - **closed**: attempts flow. Each failed attempt that says the
//!   downstream is down (connection error, timeout, 408, 429, 5xx) adds
//!   one to the action's consecutive failures, written in the transaction
//!   that records the attempt; `circuit_failures` of them open it
//!   ([`open_circuit`]). A 2xx resets the count; so that a success writes
//!   nothing while the count is already 0, each instance remembers which
//!   actions it knows clean ([`Clean`]) and writes only on a change.
//! - **open**: no job of the action is attempted. A take that meets a due
//!   job of it parks it (`waiting = 'circuit'`, no due time: it leaves the
//!   take query's index, so 100,000 waiting jobs cost the workers
//!   nothing). One probe at a time, claimed on the circuit's row by a
//!   conditional UPDATE (every worker, every instance): the `health` GET,
//!   or the job that has waited longest, as a real, recorded attempt.
//! - A probe that succeeds closes the circuit ([`close_circuit`]): the
//!   waiting jobs are due at once, their `give_up_after` clock moved on by
//!   the time they waited. A failed one keeps it open, the next probe
//!   waiting twice as long (up to `retry_max`, with jitter); its job goes
//!   behind the other waiting jobs and its failure counts toward neither
//!   `max_attempts` nor `give_up_after`. A probe refused with another 4xx
//!   fails its job, as any 4xx does, and the next probe is due at once.
//! - A paused action is not probed.
//!
//! The wait before a probe ([`probe_wait`]) is a pure function.

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Duration;

use crate::config::notify::NotifySettings;
use crate::config::{Circuit, Config};
use crate::notify::{Condition, Occurrence};
use crate::store::StoreError;
use crate::store::circuits::{self as steps, CircuitRow};
use crate::store::tx::OutboxTx;

/// The wait before the next probe after `failed_probes` failed ones: the
/// first `first`, doubling, at most `max`, then between 3/4 and all of
/// it (`jitter` in 0..1), so instances that opened together spread out.
pub fn probe_wait(first: Duration, max: Duration, failed_probes: i64, jitter: f64) -> Duration {
    let exp = u32::try_from(failed_probes.clamp(0, 31)).unwrap_or(31);
    let ceiling = first.saturating_mul(1u32 << exp).min(max.max(first));
    ceiling.mul_f64(0.75 + 0.25 * jitter.clamp(0.0, 1.0))
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX / 4)
}

/// The actions this instance knows to have no failures counted, so that
/// their successes write nothing.
#[derive(Default)]
pub(super) struct Clean(Mutex<HashSet<(String, String)>>);

impl Clean {
    pub(super) fn contains(&self, source: &str, action: &str) -> bool {
        self.0
            .lock()
            .map(|s| s.contains(&(source.to_string(), action.to_string())))
            .unwrap_or(false)
    }

    pub(super) fn set(&self, source: &str, action: &str, clean: bool) {
        if let Ok(mut s) = self.0.lock() {
            let key = (source.to_string(), action.to_string());
            if clean {
                s.insert(key);
            } else {
                s.remove(&key);
            }
        }
    }
}

/// The open circuits of the actions that have one, read once per take.
pub(super) struct OpenCircuits(Vec<CircuitRow>);

impl OpenCircuits {
    pub(super) fn load<T: OutboxTx>(tx: &mut T, config: &Config) -> Result<Self, StoreError> {
        let rows = tx.open_circuits()?;
        Ok(OpenCircuits(
            rows.into_iter()
                .filter(|r| circuit_of(config, &r.source, &r.action).is_some())
                .collect(),
        ))
    }

    pub(super) fn is_open(&self, source: &str, action: &str) -> bool {
        self.0
            .iter()
            .any(|r| r.source == source && r.action == action)
    }

    pub(super) fn rows(&self) -> &[CircuitRow] {
        &self.0
    }
}

/// The circuit of a forward action, if it has one.
pub(super) fn circuit_of<'c>(
    config: &'c Config,
    source: &str,
    action: &str,
) -> Option<&'c Circuit> {
    match &config.source(source)?.action(action)?.kind {
        crate::config::ActionKind::Forward(f) => f.circuit.as_ref(),
        crate::config::ActionKind::Sql { .. } => None,
    }
}

/// When a worker should look at an open circuit again: its next probe
/// (or the end of the probe under way).
pub(super) fn due_at(row: &CircuitRow) -> Option<i64> {
    let next = row.next_probe_at?;
    Some(next.max(row.probe_until.map_or(next, |u| u + 1)))
}

/// Opens the action's circuit, in the transaction that recorded the
/// failed attempt which made `failures` consecutive ones. The one place a
/// circuit opens (nothing is said before the commit: `reconcile`, the
/// inspector and `/metrics` read the row).
pub fn open_circuit<T: OutboxTx>(
    tx: &mut T,
    notify: &NotifySettings,
    (source, action): (&str, &str),
    failures: i64,
    first_probe_at: i64,
    now: i64,
) -> Result<(), StoreError> {
    steps::set_open(&tx.db(), source, action, failures, now, first_probe_at)?;
    let told = Occurrence::new(
        Condition::CircuitOpen,
        source,
        Some(action),
        None,
        format!(
            "circuit open on {source}/{action} after {failures} failures in a row: \
             its jobs wait, one probe at a time finds out when the downstream is back"
        ),
        serde_json::json!({
            "failures": failures,
            "next_probe_at": first_probe_at.div_euclid(1000),
        }),
    );
    crate::notify::raise(tx, notify, &told, now)
}

/// Closes the action's circuit, in the transaction that recorded the
/// successful probe (or 2xx): its waiting jobs are due now (returns how
/// many). The one place a circuit closes.
pub fn close_circuit<T: OutboxTx>(
    tx: &mut T,
    notify: &NotifySettings,
    source: &str,
    action: &str,
    now: i64,
) -> Result<u64, StoreError> {
    if !notify.wants(Condition::CircuitClosed) {
        return steps::set_closed(&tx.db(), source, action, now);
    }
    let opened_at = steps::locked(&tx.db(), source, action, now)?.opened_at;
    let waited = steps::set_closed(&tx.db(), source, action, now)?;
    let open_for = opened_at.map(|at| (now - at).max(0).div_euclid(1000));
    let told = Occurrence::new(
        Condition::CircuitClosed,
        source,
        Some(action),
        None,
        format!(
            "circuit closed on {source}/{action} after {}: {waited} waiting jobs flow again",
            open_for.map_or_else(|| "a while".to_string(), |s| format!("{s} s open"))
        ),
        serde_json::json!({ "open_for_s": open_for, "jobs_waiting": waited }),
    );
    crate::notify::raise(tx, notify, &told, now)?;
    Ok(waited)
}

/// After an attempt that says the downstream is down: one more
/// consecutive failure, which may open the circuit.
pub(super) fn count_failure<T: OutboxTx>(
    tx: &mut T,
    notify: &NotifySettings,
    circuit: &Circuit,
    source: &str,
    action: &str,
    now: i64,
) -> Result<(), StoreError> {
    let row = steps::locked(&tx.db(), source, action, now)?;
    let failures = row.failures + 1;
    if row.opened_at.is_none() && failures >= i64::from(circuit.failures) {
        let first = probe_wait(circuit.probe, circuit.probe, 0, fastrand::f64());
        open_circuit(tx, notify, (source, action), failures, now + ms(first), now)
    } else {
        steps::set_failures(&tx.db(), source, action, failures, now)
    }
}

/// After a 2xx of the action (not a probe's): no failures, and an open
/// circuit (opened by an attempt that was under way) closes.
pub(super) fn count_success<T: OutboxTx>(
    tx: &mut T,
    notify: &NotifySettings,
    source: &str,
    action: &str,
    now: i64,
) -> Result<(), StoreError> {
    let row = steps::locked(&tx.db(), source, action, now)?;
    if row.opened_at.is_some() {
        close_circuit(tx, notify, source, action, now)?;
    } else if row.failures != 0 {
        steps::set_failures(&tx.db(), source, action, 0, now)?;
    }
    Ok(())
}

/// A probe (of `owner`) failed: the next waits twice as long.
pub(super) fn probe_failed<T: OutboxTx>(
    tx: &mut T,
    circuit: &Circuit,
    retry_max: Duration,
    (source, action): (&str, &str),
    owner: &str,
    now: i64,
) -> Result<(), StoreError> {
    let row = steps::locked(&tx.db(), source, action, now)?;
    if row.opened_at.is_none() {
        return Ok(());
    }
    let wait = probe_wait(circuit.probe, retry_max, row.probes + 1, fastrand::f64());
    steps::probe_failed(&tx.db(), source, action, owner, now + ms(wait), now)
}

/// The probe of `owner` ended without a verdict on the downstream.
pub(super) fn probe_released<T: OutboxTx>(
    tx: &mut T,
    source: &str,
    action: &str,
    owner: &str,
    now: i64,
) -> Result<(), StoreError> {
    steps::probe_released(&tx.db(), source, action, owner, now)
}

/// At start: an open circuit of an action that no longer has one (or is
/// gone) closes, and jobs waiting on a circuit that is not open are due.
pub(super) fn close_unconfigured<T: OutboxTx>(
    tx: &mut T,
    config: &Config,
    now: i64,
) -> Result<(), StoreError> {
    for row in steps::open(&tx.db())? {
        if circuit_of(config, &row.source, &row.action).is_none() {
            close_circuit(tx, &config.notify, &row.source, &row.action, now)?;
        }
    }
    steps::release_orphans(&tx.db(), now)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_waits_double_up_to_the_cap_with_jitter_below() {
        let first = Duration::from_secs(30);
        let max = Duration::from_secs(300);
        assert_eq!(probe_wait(first, max, 0, 1.0), first);
        assert_eq!(probe_wait(first, max, 1, 1.0), first * 2);
        assert_eq!(probe_wait(first, max, 3, 1.0), first * 8);
        assert_eq!(probe_wait(first, max, 4, 1.0), max);
        assert_eq!(probe_wait(first, max, 40, 1.0), max);
        assert_eq!(probe_wait(first, max, 0, 0.0), first.mul_f64(0.75));
        for j in [0.0, 0.3, 0.99] {
            let w = probe_wait(first, max, 2, j);
            assert!(
                w >= Duration::from_secs(90) && w <= Duration::from_secs(120),
                "{w:?}"
            );
        }
    }
}
