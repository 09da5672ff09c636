//! Prometheus metrics. Counters and histograms live in memory as atomics,
//! indexed by positions fixed from the config (sources, actions), so label
//! values never come from request data and cardinality stays bounded.
//! Gauges that need the database are read at scrape time: job counts from
//! the trigger-maintained `job_counts` table, the oldest pending job
//! through an index.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::config::Config;

use crate::state::{Answer, JobStatus};
use crate::state::{AttemptOutcome, Delivery};

/// The label used for deliveries to a path that names no configured source.
pub const UNKNOWN_SOURCE_LABEL: &str = "unknown";

const LATENCY_BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// A fixed-bucket histogram of seconds.
pub struct Histogram {
    buckets: [AtomicU64; LATENCY_BUCKETS.len()],
    count: AtomicU64,
    sum_micros: AtomicU64,
}

impl Histogram {
    fn new() -> Histogram {
        Histogram {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            count: AtomicU64::new(0),
            sum_micros: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        if let Some(i) = LATENCY_BUCKETS.iter().position(|&b| secs <= b) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_micros.fetch_add(
            d.as_micros().min(u128::from(u64::MAX)) as u64,
            Ordering::Relaxed,
        );
    }

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let mut cumulative = 0;
        let sep = if labels.is_empty() { "" } else { "," };
        for (i, b) in LATENCY_BUCKETS.iter().enumerate() {
            cumulative += self.buckets[i].load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{b}\"}} {cumulative}");
        }
        let count = self.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {count}");
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        let braces = if labels.is_empty() {
            String::new()
        } else {
            format!("{{{labels}}}")
        };
        let _ = writeln!(out, "{name}_sum{braces} {sum}");
        let _ = writeln!(out, "{name}_count{braces} {count}");
    }
}

/// Job counts and the oldest pending job, read from the database.
#[derive(Debug, Default, Clone)]
pub struct JobGauges {
    pub pending: i64,
    pub processing: i64,
    pub done: i64,
    pub failed: i64,
    pub paused: i64,
    pub superseded: i64,
    pub oldest_pending_age_secs: f64,
    /// Each circuit row: (source, action, open, times it opened).
    pub circuits: Vec<(String, String, bool, i64)>,
}

impl JobGauges {
    /// Sets the count of jobs in `status`.
    pub fn set(&mut self, status: JobStatus, n: i64) {
        let gauge = match status {
            JobStatus::Pending => &mut self.pending,
            JobStatus::Processing => &mut self.processing,
            JobStatus::Done => &mut self.done,
            JobStatus::Failed => &mut self.failed,
            JobStatus::Paused => &mut self.paused,
            JobStatus::Superseded => &mut self.superseded,
        };
        *gauge = n;
    }
}

pub use crate::store::backend::StorageGauges;

/// `idemhook_catchup_events_total{source,outcome}`, per source with a
/// catchup table: [claimed, redelivery_requested, already_stored].
pub struct CatchupCounts {
    rows: Vec<(String, [AtomicU64; 3])>,
}

impl CatchupCounts {
    pub fn new(config: &Config) -> CatchupCounts {
        CatchupCounts {
            rows: config
                .sources
                .iter()
                .filter(|s| s.catchup.is_some())
                .map(|s| (s.name.clone(), Default::default()))
                .collect(),
        }
    }

    /// Adds a run's findings: [claimed, redelivery_requested,
    /// already_stored] (a `catchup::Report`'s).
    pub fn add(&self, source: &str, found: [usize; 3]) {
        if let Some((_, row)) = self.rows.iter().find(|(name, _)| *name == source) {
            for (count, n) in row.iter().zip(found) {
                count.fetch_add(n as u64, Ordering::Relaxed);
            }
        }
    }

    /// The exposition's lines (nothing without a catchup table).
    pub fn render(&self, out: &mut String, escape: impl Fn(&str) -> String) {
        use std::fmt::Write as _;
        if self.rows.is_empty() {
            return;
        }
        out.push_str("# HELP idemhook_catchup_events_total Events a catch-up run of this serve found, by source and outcome (claimed, redelivery_requested, already_stored).\n");
        out.push_str("# TYPE idemhook_catchup_events_total counter\n");
        for (name, row) in &self.rows {
            for (i, outcome) in ["claimed", "redelivery_requested", "already_stored"]
                .iter()
                .enumerate()
            {
                let _ = writeln!(
                    out,
                    "idemhook_catchup_events_total{{source=\"{}\",outcome=\"{outcome}\"}} {}",
                    escape(name),
                    row[i].load(Ordering::Relaxed)
                );
            }
        }
    }
}

pub struct Metrics {
    started: Instant,
    sources: Vec<String>,
    /// (source, action) pairs in config order.
    actions: Vec<(String, String)>,
    /// [source index (last = unknown)][outcome]
    deliveries: Vec<[AtomicU64; Delivery::ALL.len()]>,
    attempts: Vec<[AtomicU64; 3]>,
    /// [action index][answer], rendered for actions with a `check` only.
    checks: Vec<[AtomicU64; 3]>,
    has_check: Vec<bool>,
    /// [action index]: the forward action has a circuit.
    has_circuit: Vec<bool>,
    pub claim_duration: Histogram,
    pub downstream_duration: Histogram,
    /// Log lines or records dropped because a queue was full.
    pub dropped_records: AtomicU64,
    /// `idemhook_catchup_events_total`: this serve's catch-up runs.
    pub catchup: CatchupCounts,
    /// Notifications: what is counted in memory, and messages by outcome.
    pub notify: crate::notify::Watch,
}

/// What the notifier reads of the metrics (`notify::Notifier::start`).
impl AsRef<crate::notify::Watch> for Metrics {
    fn as_ref(&self) -> &crate::notify::Watch {
        &self.notify
    }
}

impl Metrics {
    pub fn new(config: &Config) -> Metrics {
        let sources: Vec<String> = config.sources.iter().map(|s| s.name.clone()).collect();
        let actions: Vec<(String, String)> = config
            .sources
            .iter()
            .flat_map(|s| s.actions.iter().map(|a| (s.name.clone(), a.name.clone())))
            .collect();
        let has_check = config
            .sources
            .iter()
            .flat_map(|s| {
                s.actions.iter().map(|a| {
                    matches!(&a.kind, crate::config::ActionKind::Forward(f) if f.check.is_some())
                })
            })
            .collect();
        let has_circuit = config
            .sources
            .iter()
            .flat_map(|s| {
                s.actions.iter().map(|a| {
                    matches!(&a.kind, crate::config::ActionKind::Forward(f) if f.circuit.is_some())
                })
            })
            .collect();
        Metrics {
            started: Instant::now(),
            has_circuit,
            checks: actions
                .iter()
                .map(|_| std::array::from_fn(|_| AtomicU64::new(0)))
                .collect(),
            has_check,
            deliveries: (0..=sources.len())
                .map(|_| std::array::from_fn(|_| AtomicU64::new(0)))
                .collect(),
            attempts: actions
                .iter()
                .map(|_| std::array::from_fn(|_| AtomicU64::new(0)))
                .collect(),
            sources,
            actions,
            claim_duration: Histogram::new(),
            downstream_duration: Histogram::new(),
            dropped_records: AtomicU64::new(0),
            catchup: CatchupCounts::new(config),
            notify: crate::notify::Watch::new(config),
        }
    }

    /// Counts one delivery. `source` is None for an unknown source.
    pub fn delivery(&self, source: Option<usize>, outcome: Delivery) {
        let i = source.unwrap_or(self.sources.len()).min(self.sources.len());
        let o = Delivery::ALL
            .iter()
            .position(|d| *d == outcome)
            .unwrap_or(0);
        self.deliveries[i][o].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one attempt of an action.
    pub fn attempt(&self, source: &str, action: &str, outcome: AttemptOutcome) {
        if let Some(i) = self
            .actions
            .iter()
            .position(|(s, a)| s == source && a == action)
        {
            let o = AttemptOutcome::ALL
                .iter()
                .position(|x| *x == outcome)
                .unwrap_or(0);
            self.attempts[i][o].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Counts one question to a downstream's `check` URL.
    pub fn downstream_check(&self, source: &str, action: &str, answer: Answer) {
        if let Some(i) = self
            .actions
            .iter()
            .position(|(s, a)| s == source && a == action)
        {
            let o = Answer::ALL.iter().position(|x| *x == answer).unwrap_or(0);
            self.checks[i][o].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The whole exposition, Prometheus text format 0.0.4.
    pub fn render(&self, jobs: Option<&JobGauges>, storage: &StorageGauges) -> String {
        let mut out = String::with_capacity(8192);
        self.render_deliveries(&mut out);
        self.render_actions(&mut out);
        if let Some(j) = jobs {
            render_jobs(&mut out, j);
            self.render_circuits(&mut out, j);
        }
        self.render_process(&mut out, storage);
        self.catchup.render(&mut out, escape);
        self.notify.render(&mut out);
        out
    }

    /// Deliveries by source and outcome, and the claims' latency.
    fn render_deliveries(&self, out: &mut String) {
        out.push_str(
            "# HELP idemhook_deliveries_total Deliveries received, by source and outcome.\n",
        );
        out.push_str("# TYPE idemhook_deliveries_total counter\n");
        for (i, row) in self.deliveries.iter().enumerate() {
            let source = self
                .sources
                .get(i)
                .map_or(UNKNOWN_SOURCE_LABEL, String::as_str);
            for (o, d) in Delivery::ALL.iter().enumerate() {
                let n = row[o].load(Ordering::Relaxed);
                // The unknown row only has unknown_source deliveries, and
                // a configured source never has them.
                if (i == self.sources.len()) != (*d == Delivery::UnknownSource) {
                    continue;
                }
                // Re-ingests are counted apart (idemhook_reingested_total).
                if *d == Delivery::Reingested {
                    continue;
                }
                let _ = writeln!(
                    out,
                    "idemhook_deliveries_total{{source=\"{}\",outcome=\"{}\"}} {n}",
                    escape(source),
                    d.as_str()
                );
            }
        }
        out.push_str("# HELP idemhook_claim_duration_seconds Time from a verified request to its committed claim.\n");
        out.push_str("# TYPE idemhook_claim_duration_seconds histogram\n");
        self.claim_duration
            .render(out, "idemhook_claim_duration_seconds", "");
    }

    /// Attempts and checks by action, and the downstreams' latency.
    fn render_actions(&self, out: &mut String) {
        out.push_str("# HELP idemhook_action_attempts_total Attempts of actions, by outcome.\n");
        out.push_str("# TYPE idemhook_action_attempts_total counter\n");
        for (i, (s, a)) in self.actions.iter().enumerate() {
            for (o, outcome) in AttemptOutcome::ALL.iter().enumerate() {
                let _ = writeln!(
                    out,
                    "idemhook_action_attempts_total{{source=\"{}\",action=\"{}\",outcome=\"{}\"}} {}",
                    escape(s),
                    escape(a),
                    outcome.as_str(),
                    self.attempts[i][o].load(Ordering::Relaxed)
                );
            }
        }
        out.push_str("# HELP idemhook_downstream_checks_total Questions to forward actions' check URLs, by answer (found: 200, not_found: 404, error: anything else or no answer).\n");
        out.push_str("# TYPE idemhook_downstream_checks_total counter\n");
        for (i, (s, a)) in self.actions.iter().enumerate() {
            if !self.has_check[i] {
                continue;
            }
            for (o, answer) in Answer::ALL.iter().enumerate() {
                let _ = writeln!(
                    out,
                    "idemhook_downstream_checks_total{{source=\"{}\",action=\"{}\",answer=\"{}\"}} {}",
                    escape(s),
                    escape(a),
                    answer.as_str(),
                    self.checks[i][o].load(Ordering::Relaxed)
                );
            }
        }
        out.push_str(
            "# HELP idemhook_downstream_duration_seconds Duration of forwarded requests.\n",
        );
        out.push_str("# TYPE idemhook_downstream_duration_seconds histogram\n");
        self.downstream_duration
            .render(out, "idemhook_downstream_duration_seconds", "");
    }

    /// Each forward action's circuit, from its row in the database (so
    /// every instance on one database says the same).
    fn render_circuits(&self, out: &mut String, j: &JobGauges) {
        let row = |s: &str, a: &str| {
            j.circuits
                .iter()
                .find(|(source, action, _, _)| source == s && action == a)
                .map_or((false, 0), |(_, _, open, n)| (*open, *n))
        };
        out.push_str("# HELP idemhook_circuit_open Whether the forward action's circuit is open (1) or closed (0).\n");
        out.push_str("# TYPE idemhook_circuit_open gauge\n");
        for (i, (s, a)) in self.actions.iter().enumerate() {
            if self.has_circuit.get(i) == Some(&true) {
                let _ = writeln!(
                    out,
                    "idemhook_circuit_open{{source=\"{}\",action=\"{}\"}} {}",
                    escape(s),
                    escape(a),
                    u8::from(row(s, a).0)
                );
            }
        }
        out.push_str(
            "# HELP idemhook_circuit_opened_total Times the forward action's circuit opened.\n",
        );
        out.push_str("# TYPE idemhook_circuit_opened_total counter\n");
        for (i, (s, a)) in self.actions.iter().enumerate() {
            if self.has_circuit.get(i) == Some(&true) {
                let _ = writeln!(
                    out,
                    "idemhook_circuit_opened_total{{source=\"{}\",action=\"{}\"}} {}",
                    escape(s),
                    escape(a),
                    row(s, a).1
                );
            }
        }
    }

    /// The process and its storage: uptime, file sizes, the writer's counters.
    fn render_process(&self, out: &mut String, storage: &StorageGauges) {
        out.push_str("# HELP idemhook_uptime_seconds Seconds since this process started.\n");
        out.push_str("# TYPE idemhook_uptime_seconds gauge\n");
        let _ = writeln!(
            out,
            "idemhook_uptime_seconds {}",
            self.started.elapsed().as_secs_f64()
        );
        if let Some(bytes) = storage.database_bytes {
            out.push_str("# HELP idemhook_database_bytes Size of the database file.\n");
            out.push_str("# TYPE idemhook_database_bytes gauge\n");
            let _ = writeln!(out, "idemhook_database_bytes {bytes}");
        }
        if let Some(bytes) = storage.wal_bytes {
            out.push_str("# HELP idemhook_wal_bytes Size of the write-ahead log file.\n");
            out.push_str("# TYPE idemhook_wal_bytes gauge\n");
            let _ = writeln!(out, "idemhook_wal_bytes {bytes}");
        }
        out.push_str("# HELP idemhook_commits_total Group commits of the writer.\n");
        out.push_str("# TYPE idemhook_commits_total counter\n");
        let _ = writeln!(out, "idemhook_commits_total {}", storage.writer_commits);
        out.push_str("# HELP idemhook_committed_operations_total Operations committed by the writer (their ratio to commits is the group size).\n");
        out.push_str("# TYPE idemhook_committed_operations_total counter\n");
        let _ = writeln!(
            out,
            "idemhook_committed_operations_total {}",
            storage.writer_grouped
        );
        out.push_str("# HELP idemhook_writer_queue Operations waiting for the writer thread.\n");
        out.push_str("# TYPE idemhook_writer_queue gauge\n");
        let _ = writeln!(out, "idemhook_writer_queue {}", storage.writer_queue);
        out.push_str("# HELP idemhook_dropped_records_total Records of refused deliveries dropped because the writer queue was full.\n");
        out.push_str("# TYPE idemhook_dropped_records_total counter\n");
        let _ = writeln!(
            out,
            "idemhook_dropped_records_total {}",
            self.dropped_records.load(Ordering::Relaxed)
        );
    }
}

/// Job counts by status and the oldest pending job's age.
fn render_jobs(out: &mut String, j: &JobGauges) {
    out.push_str("# HELP idemhook_jobs Jobs by status.\n");
    out.push_str("# TYPE idemhook_jobs gauge\n");
    for (status, n) in [
        (JobStatus::Pending, j.pending),
        (JobStatus::Processing, j.processing),
        (JobStatus::Done, j.done),
        (JobStatus::Failed, j.failed),
        (JobStatus::Paused, j.paused),
        (JobStatus::Superseded, j.superseded),
    ] {
        let _ = writeln!(out, "idemhook_jobs{{status=\"{status}\"}} {n}");
    }
    out.push_str("# HELP idemhook_oldest_pending_age_seconds Age of the oldest pending job.\n");
    out.push_str("# TYPE idemhook_oldest_pending_age_seconds gauge\n");
    let _ = writeln!(
        out,
        "idemhook_oldest_pending_age_seconds {}",
        j.oldest_pending_age_secs
    );
}

/// The kept refused deliveries' bytes and the re-ingests, per configured
/// source, from the database's `rejected_totals` (so `idemhook reingest`
/// run in another process counts too).
pub fn render_rejected(sources: &[String], totals: &[crate::store::rejected::Totals]) -> String {
    use std::fmt::Write as _;
    let of = |name: &str| totals.iter().find(|t| t.source == name);
    let mut out = String::new();
    out.push_str("# HELP idemhook_rejected_kept_bytes Bytes of refused deliveries kept for reingest (bodies and headers).\n");
    out.push_str("# TYPE idemhook_rejected_kept_bytes gauge\n");
    for s in sources {
        let _ = writeln!(
            out,
            "idemhook_rejected_kept_bytes{{source=\"{}\"}} {}",
            escape(s),
            of(s).map_or(0, |t| t.stored)
        );
    }
    out.push_str("# HELP idemhook_reingested_total Kept refused deliveries re-ingested, by outcome (accepted: a new event, duplicate, failed: still refused).\n");
    out.push_str("# TYPE idemhook_reingested_total counter\n");
    for s in sources {
        let t = of(s);
        for (outcome, n) in [
            ("accepted", t.map_or(0, |t| t.accepted)),
            ("duplicate", t.map_or(0, |t| t.duplicate)),
            ("failed", t.map_or(0, |t| t.failed)),
        ] {
            let _ = writeln!(
                out,
                "idemhook_reingested_total{{source=\"{}\",outcome=\"{outcome}\"}} {n}",
                escape(s)
            );
        }
    }
    out
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_is_cumulative() {
        let h = Histogram::new();
        h.observe(Duration::from_micros(300));
        h.observe(Duration::from_millis(3));
        h.observe(Duration::from_secs(60));
        let mut out = String::new();
        h.render(&mut out, "x", "");
        assert!(out.contains("x_bucket{le=\"0.0005\"} 1\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"0.005\"} 2\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"10\"} 2\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"+Inf\"} 3\n"), "{out}");
        assert!(out.contains("x_count 3\n"), "{out}");
    }
}
