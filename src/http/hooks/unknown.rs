//! Requests to unknown sources: counted by the metric
//! (`idemhook_deliveries_total{outcome="unknown_source"}`) and summarised
//! in the log, at most one line a minute per process, never a row each:
//! a stranger trying names grows neither the database nor the log.

use std::sync::Mutex;

/// A summary line is written at most this often (ms).
const EVERY_MS: i64 = 60_000;

/// A name asked for is logged cut to this many characters.
const NAME_CHARS: usize = 64;

struct Summary {
    /// When the last line was written (ms); 0 before the first.
    logged_at: i64,
    /// Requests since that line, not yet logged.
    count: u64,
}

static SUMMARY: Mutex<Summary> = Mutex::new(Summary {
    logged_at: 0,
    count: 0,
});

/// Notes one request to the unknown `name`; logs a line (this request's
/// name and address, and how many came since the last line) when a minute
/// has passed since the last one.
pub(super) fn note(name: &str, remote: &str, now: i64) {
    let count = {
        let mut s = SUMMARY.lock().unwrap_or_else(|p| p.into_inner());
        s.count += 1;
        if s.logged_at != 0 && now - s.logged_at < EVERY_MS {
            return;
        }
        s.logged_at = now;
        std::mem::take(&mut s.count)
    };
    let shown: String = name
        .chars()
        .take(NAME_CHARS)
        .map(|c| if c.is_control() { '?' } else { c })
        .collect();
    crate::log::info(
        "unknown source",
        &[
            ("requests", &count),
            ("last", &shown),
            ("remote", &remote),
            ("status", &404),
        ],
    );
}
