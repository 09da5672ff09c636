//! `--split-cores`: idemhook and the load generator on one half of the
//! machine's CPUs (one CPU of two), the forward's downstream (W4's no-op
//! server, W4R/W4N/W4A's broker) on the other half. On shared CPUs a
//! broker's own work per message (RabbitMQ's is several times the no-op
//! server's) is taken from idemhook's CPU, so W4's variants compare the
//! brokers' cost rather than idemhook's forwarding; split, every
//! destination has the same CPUs of its own and idemhook the same others.
//!
//! Threads and processes inherit the CPUs of the thread that starts them:
//! the main thread is pinned to idemhook's half once, and switches to the
//! downstream's half only while it starts a downstream.

use std::sync::OnceLock;

use rustix::thread::{CpuSet, sched_getaffinity, sched_setaffinity};

/// (idemhook's and the load's CPUs, the downstream's), once split.
static SPLIT: OnceLock<(CpuSet, CpuSet)> = OnceLock::new();

/// Splits the CPUs this process may use in two halves and pins the calling
/// thread (the main one) to the first. Returns what it did, for the report.
pub(crate) fn split() -> Result<String, String> {
    let all = sched_getaffinity(None).map_err(|e| format!("--split-cores: {e}"))?;
    let cpus: Vec<usize> = (0..CpuSet::MAX_CPU).filter(|&i| all.is_set(i)).collect();
    if cpus.len() < 2 {
        return Err(format!(
            "--split-cores needs two CPUs; this process may use {}",
            cpus.len()
        ));
    }
    let (first, second) = cpus.split_at(cpus.len() / 2);
    let set = |cpus: &[usize]| {
        let mut s = CpuSet::new();
        for &c in cpus {
            s.set(c);
        }
        s
    };
    let (own, downstream) = (set(first), set(second));
    sched_setaffinity(None, &own).map_err(|e| format!("--split-cores: {e}"))?;
    let _ = SPLIT.set((own, downstream));
    Ok(format!(
        "idemhook and the load generator on CPU {first:?}, the downstream (no-op server or broker) on CPU {second:?}"
    ))
}

/// Runs `start` (which starts a downstream's threads or processes) on the
/// downstream's CPUs when split, so that what it starts stays there; the
/// calling thread is back on its own CPUs afterwards.
pub(crate) fn for_downstream<T>(start: impl FnOnce() -> T) -> T {
    let Some((own, downstream)) = SPLIT.get() else {
        return start();
    };
    if let Err(e) = sched_setaffinity(None, downstream) {
        println!("  --split-cores: cannot move to the downstream's CPUs: {e}");
    }
    let started = start();
    if let Err(e) = sched_setaffinity(None, own) {
        println!("  --split-cores: cannot move back to idemhook's CPUs: {e}");
    }
    started
}
