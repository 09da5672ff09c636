//! idemhook's throughput benchmark: the real binary against a
//! no-op tiny_http server, driven by one load generator.
//!
//! ```text
//! cargo bench --bench bench                       # W1..W4, 3 runs each
//! cargo bench --bench bench -- --runs 5
//! cargo bench --bench bench -- --growth           # + W1 on 1,000,000 stored events, W1 during prune
//! cargo bench --bench bench -- --providers        # W1 per source kind, a 1,000-event Adyen batch
//! cargo bench --bench bench -- --growth-10m       # + W1 on 10,000,000 stored events (slow)
//! cargo bench --bench bench -- --only W1,W4 --scale 0.25 --log-level warn --perf /tmp/perf
//! cargo bench --bench bench -- --only W4,W4R,W4N,W4A --split-cores   # the brokers on a CPU of their own
//! ```
//!
//! What it does, per workload and run: a fresh temp dir and database, a
//! fresh `idemhook serve` (durability full, one stripe source with a real
//! secret, 8 HTTP workers) and a fresh in-process no-op tiny_http server
//! (reads the body, answers 200 with a small JSON body, 8 workers). Both get
//! the same pre-built, really signed requests from the same load generator:
//! N threads, one keep-alive connection each, raw HTTP/1.1 over
//! `std::net::TcpStream`, per-request latency recorded. Every request must
//! be answered 200 within 5 s; anything else is counted and printed
//! (tiny_http can stall connections at 64 concurrent keep-alive
//! connections; the bench reports that, it does not work around it).
//!
//! Bounded everywhere: a workload is cut off after 120 s, every wait has a
//! deadline, only 127.0.0.1 is used, temp dirs are removed on the way out.
//!
//! The parts: `workload` (the workloads and their signed requests), `load`
//! (the load generator), `noop` (the no-op server, also W4's downstream),
//! `instance` (an `idemhook serve` process), `procfs` (CPU and memory from
//! /proc), `runs` (one run against each), `growth` (prefilled databases and
//! the prune case), `report` (the tables), `pg` (the `--postgres` mode),
//! `brokers` (W4's broker variants), `cores` (`--split-cores`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Condvar, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hmac::{Hmac, KeyInit, Mac};
use rusqlite::{Connection, OpenFlags, params};
use sha2::{Digest, Sha256};

mod brokers;
mod cores;
mod growth;
mod instance;
mod load;
mod noop;
mod pg;
#[path = "../../tests/support/pg_cluster.rs"]
mod pg_cluster;
mod procfs;
mod providers;
mod report;
mod runs;
mod workload;

use brokers::*;
use growth::*;
use instance::*;
use load::*;
use noop::*;
use procfs::*;
use report::*;
use runs::*;
use workload::*;

/// The whole schema, to create a database for prefilling.
const SCHEMA: &str = include_str!("../../schema.sql");
/// The source's secret (Stripe keys HMAC with the whole `whsec_` string).
const SECRET: &str = "whsec_b3VyLWJlbmNobWFyay1zZWNyZXQtZm9yLWlkZW1ob29r";
/// idemhook's default and the no-op server's worker count.
const HTTP_WORKERS: usize = 8;
/// A request not answered within this counts as unanswered.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);
/// Answers slower than this are reported as stalls.
const SLOW: Duration = Duration::from_secs(1);
/// A workload is cut off after this.
const WORKLOAD_LIMIT: Duration = Duration::from_secs(120);
/// How long `serve` may take to print its listening line.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);
/// How long `serve` may take to stop after SIGTERM before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a concurrent `prune` may run in all.
const PRUNE_LIMIT: Duration = Duration::from_secs(600);
/// Event ids are `evt_` + this many base62 characters, like Stripe's.
const ID_CHARS: usize = 24;
const BASE62: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

// ---------------------------------------------------------------------------
// Options

#[derive(Debug, Clone)]
struct Opts {
    runs: usize,
    growth: bool,
    growth_10m: bool,
    /// W1's events in the growth runs and their empty reference.
    growth_events: Option<usize>,
    only: Option<Vec<String>>,
    scale: f64,
    log_level: Option<String>,
    perf_dir: Option<PathBuf>,
    /// idemhook's http_workers (its default is 8, like the no-op server's).
    idem_workers: usize,
    /// idemhook's forward_workers; None keeps its default (4).
    forward_workers: Option<usize>,
    /// idemhook's durability: "full" (the measured setup) or "normal".
    durability: String,
    /// cargo bench passes `--bench`; `cargo test --all-targets` does not.
    bench_flag: bool,
    force: bool,
    /// W1 and W2 on PostgreSQL (one and two instances, and the classic
    /// design) instead of the SQLite workloads.
    postgres: bool,
    /// W1 per source kind (stripe, twilio, discord) and a 1,000-event
    /// Adyen batch instead of the workloads.
    providers: bool,
    /// idemhook and the load on half the CPUs, the downstream on the
    /// other half (`cores.rs`).
    split_cores: bool,
}

const USAGE: &str = "usage: cargo bench --bench bench [-- OPTIONS]
  --runs N          repeat each workload N times, report medians and min-max (default 3)
  --growth          also W1 on 1,000,000 stored events and W1 during a 1,000,000-event prune
  --growth-10m      also W1 on 10,000,000 stored events (implies --growth; slow)
  --growth-events N W1 with N events (default 20,000) in the growth runs and their empty reference
  --only W1,W2,..   run only these workloads (W1 W2 W3 W4; when named: W4O W4S, W4 with order over 1,000 keys and
                    over one; W4C0, W4 with circuit_failures = 0; W4R W4N W4A, W4 to Redis, NATS JetStream,
                    RabbitMQ (needs redis-server, nats-server, rabbitmq-server); G1M G10M GPRUNE with --growth)
  --scale F         multiply every event count by F (quick checks; default 1)
  --log-level L     pass --log-level L to idemhook serve (default: its own, info)
  --perf DIR        record `perf record` of idemhook during each load into DIR
  --idemhook-workers N   idemhook's http_workers (default 8, as the spec says; for experiments)
  --forward-workers N    idemhook's forward_workers (default: idemhook's own, 4; for experiments)
  --durability D    idemhook's durability, full (default) or normal (no fsync
                    before answering; for experiments: what the fsync costs)
  --providers       W1 with a stripe, a twilio and a discord source in turn, and a 1,000-event Adyen batch
  --postgres        W1 and W2 on a local PostgreSQL cluster: the classic one-transaction-per-event
                    design, one idemhook instance and two (needs initdb and postgres)
  --split-cores     idemhook and the load generator on half the CPUs, the forward's downstream (W4's no-op server,
                    W4R/W4N/W4A's broker) on the other half: each destination's own work off idemhook's CPUs
  --force           run even without cargo bench's --bench flag";

impl Opts {
    fn parse(args: &[String]) -> Result<Opts, String> {
        let mut o = Opts {
            runs: 3,
            growth: false,
            growth_10m: false,
            growth_events: None,
            only: None,
            scale: 1.0,
            log_level: None,
            perf_dir: None,
            idem_workers: HTTP_WORKERS,
            forward_workers: None,
            durability: "full".to_string(),
            bench_flag: false,
            force: false,
            postgres: false,
            providers: false,
            split_cores: false,
        };
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let mut value = |name: &str| {
                it.next()
                    .cloned()
                    .ok_or_else(|| format!("{name} needs a value"))
            };
            match a.as_str() {
                "--bench" => o.bench_flag = true,
                "--force" => o.force = true,
                "--postgres" => o.postgres = true,
                "--providers" => o.providers = true,
                "--split-cores" => o.split_cores = true,
                "--growth" => o.growth = true,
                "--growth-10m" => {
                    o.growth = true;
                    o.growth_10m = true;
                }
                "--growth-events" => {
                    let n: usize = value("--growth-events")?
                        .parse()
                        .map_err(|e| format!("--growth-events: {e}"))?;
                    if !(1_000..=1_000_000).contains(&n) {
                        return Err("--growth-events: 1000 to 1000000".into());
                    }
                    o.growth_events = Some(n);
                }
                "--runs" => {
                    o.runs = value("--runs")?
                        .parse()
                        .map_err(|e| format!("--runs: {e}"))?;
                    if !(1..=50).contains(&o.runs) {
                        return Err("--runs: 1 to 50".into());
                    }
                }
                "--only" => {
                    o.only = Some(
                        value("--only")?
                            .split(',')
                            .map(|s| s.trim().to_ascii_uppercase())
                            .filter(|s| !s.is_empty())
                            .collect(),
                    );
                }
                "--scale" => {
                    o.scale = value("--scale")?
                        .parse()
                        .map_err(|e| format!("--scale: {e}"))?;
                    if !(0.001..=10.0).contains(&o.scale) {
                        return Err("--scale: 0.001 to 10".into());
                    }
                }
                "--log-level" => o.log_level = Some(value("--log-level")?),
                "--perf" => o.perf_dir = Some(PathBuf::from(value("--perf")?)),
                "--idemhook-workers" => {
                    o.idem_workers = value("--idemhook-workers")?
                        .parse()
                        .map_err(|e| format!("--idemhook-workers: {e}"))?;
                    if !(1..=256).contains(&o.idem_workers) {
                        return Err("--idemhook-workers: 1 to 256".into());
                    }
                }
                "--forward-workers" => {
                    let n: usize = value("--forward-workers")?
                        .parse()
                        .map_err(|e| format!("--forward-workers: {e}"))?;
                    if !(1..=256).contains(&n) {
                        return Err("--forward-workers: 1 to 256".into());
                    }
                    o.forward_workers = Some(n);
                }
                "--durability" => {
                    let d = value("--durability")?;
                    if d != "full" && d != "normal" {
                        return Err("--durability: full or normal".into());
                    }
                    o.durability = d.to_string();
                }
                "-h" | "--help" => return Err(String::new()),
                other => return Err(format!("unknown argument {other:?}")),
            }
        }
        Ok(o)
    }

    fn wants(&self, name: &str) -> bool {
        self.only
            .as_ref()
            .is_none_or(|only| only.iter().any(|o| o == name))
    }

    fn scaled(&self, n: usize) -> usize {
        ((n as f64 * self.scale).round() as usize).max(1)
    }
}

// ---------------------------------------------------------------------------
// Helpers

/// What the shared broker servers (`tests/it/brokers.rs`) wait with.
mod harness {
    use std::time::{Duration, Instant};

    /// Polls `condition` every 20 ms; panics after `timeout` naming `what`.
    pub fn wait_until(timeout: Duration, what: &str, mut condition: impl FnMut() -> bool) {
        let started = Instant::now();
        while !condition() {
            assert!(
                started.elapsed() < timeout,
                "timed out after {timeout:?} waiting for: {what}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

fn unix_secs() -> i64 {
    now_ms() / 1000
}

fn machine() -> String {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")?
                .split_once(':')
                .map(|x| x.1.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mem = std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .nth(1)
        .and_then(|k| k.parse::<f64>().ok())
        .map_or("?".to_string(), |k| {
            format!("{:.0} GiB", k / 1024.0 / 1024.0)
        });
    format!("nproc {cpus}, {model}, {mem} RAM, Linux {}", kernel.trim())
}

fn date() -> String {
    Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M:%S UTC"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| format!("unix {}", unix_secs()))
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opts = match Opts::parse(&args) {
        Ok(o) => o,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("bench: {e}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    if !opts.bench_flag && !opts.force {
        println!("bench: nothing run (start it with `cargo bench --bench bench`, or pass --force)");
        return ExitCode::SUCCESS;
    }
    let user_args: Vec<&str> = args
        .iter()
        .map(String::as_str)
        .filter(|a| *a != "--bench")
        .collect();
    let hz = clock_ticks_per_sec();
    let seed = now_ms() as u64;

    println!("idemhook throughput benchmark");
    println!(
        "command:  cargo bench --bench bench{}{}",
        if user_args.is_empty() { "" } else { " -- " },
        user_args.join(" ")
    );
    println!("date:     {}", date());
    println!("machine:  {}", machine());
    println!("load avg: {} (1/5/15 min) at the start", loadavg());
    if opts.split_cores {
        match cores::split() {
            Ok(how) => println!("cores:    {how}"),
            Err(e) => {
                eprintln!("bench: {e}");
                return ExitCode::from(2);
            }
        }
    }
    println!(
        "setup:    idemhook serve (durability {}, stripe source, {} http workers, prune_interval 0s) vs a no-op tiny_http 0.12 server ({HTTP_WORKERS} workers) in the bench process;",
        opts.durability, opts.idem_workers
    );
    println!(
        "          one keep-alive connection per load thread; requests pre-built and really signed; {} run(s) per workload, medians with (min–max)",
        opts.runs
    );
    if (opts.scale - 1.0).abs() > f64::EPSILON {
        println!("          SCALED: every event count x{}", opts.scale);
    }
    if opts.postgres {
        return pg::run(&opts);
    }
    if opts.providers {
        return providers::run(&opts, seed);
    }

    // Run-major: every workload's run 1, then every run 2, so workloads
    // compared with each other (W4 and its variants) share the machine's
    // drift.
    let mut rows: Vec<Row> = workloads(&opts)
        .into_iter()
        .filter(|w| opts.wants(w.name))
        .map(|w| Row {
            w,
            noop: Vec::new(),
            idem: Vec::new(),
        })
        .collect();
    let mut brokers = Brokers::default();
    for run in 1..=opts.runs {
        for row in &mut rows {
            let w = row.w.clone();
            let reqs = build_requests(&w, seed ^ ((run as u64) << 8) ^ w.events as u64);
            if run == 1 {
                println!(
                    "{} {}: {} requests, body {} bytes, request {} bytes",
                    w.name,
                    w.what,
                    fmt_int(w.requests() as f64),
                    reqs.body_bytes,
                    reqs.bytes.first().map_or(0, Vec::len)
                );
            }
            let mut setup = Setup::default();
            if w.dest != Dest::Http {
                match brokers.url(w.dest, run) {
                    Ok(url) => setup.forward_url = Some(url),
                    Err(e) => {
                        println!("  {} run {run}: no broker: {e}", w.name);
                        continue;
                    }
                }
            }
            let noop = match run_noop(&reqs, &w, hz) {
                Ok(n) => n,
                Err(e) => {
                    println!("  {} run {run}: no-op server failed: {e}", w.name);
                    continue;
                }
            };
            let label = format!("{}-run{run}", w.name);
            let mut idem = match run_idemhook(&reqs, &w, &setup, &opts, hz, &label) {
                Ok(i) => i,
                Err(e) => {
                    println!("  {} run {run}: idemhook failed: {e}", w.name);
                    continue;
                }
            };
            if w.dest != Dest::Http
                && let Some(f) = idem.forward.as_mut()
            {
                match brokers.delivered(w.dest, run) {
                    Ok((total, distinct)) => (f.total, f.distinct) = (total, distinct),
                    Err(e) => println!("  {} run {run}: counting at the broker: {e}", w.name),
                }
            }
            let fwd = idem.forward.as_ref().map_or(String::new(), |f| {
                format!(
                    ", {:.0} forwarded/s ({:.0} jobs done/s)",
                    f.per_sec, f.done_per_sec
                )
            });
            println!(
                "  {} run {run}: no-op {} req/s (p50 {} p99 {} ms) | idemhook {} req/s{fwd} (p50 {} p99 {} ms), rows {} | problems: no-op {}; idemhook {}",
                w.name,
                fmt_int(noop.load.rps()),
                ms(noop.load.p(50.0)),
                ms(noop.load.p(99.0)),
                fmt_int(idem.load.rps()),
                ms(idem.load.p(50.0)),
                ms(idem.load.p(99.0)),
                idem.rows_text(),
                noop.load.problems(),
                idem.load.problems(),
            );
            row.noop.push(noop);
            row.idem.push(idem);
        }
    }
    rows.retain(|r| !r.idem.is_empty());

    let mut failed = false;
    if !rows.is_empty() {
        print_table(&rows);
        print_details(&rows);
        let clean = print_problems(&rows);
        print_targets(&rows);
        if !clean {
            println!("\nNOTE: some requests were not answered 200 in time (see above).");
        }
        failed |= rows.iter().any(|r| r.idem.iter().any(|i| !i.rows_ok()));
    }

    if opts.growth {
        println!("\nGrowth runs:");
        let mut w1 = workloads(&opts)
            .into_iter()
            .find(|w| w.name == "W1")
            .expect("W1 exists");
        let mut empty: Vec<f64> = rows
            .iter()
            .find(|r| r.w.name == "W1" && opts.growth_events.is_none())
            .map(|r| r.idem_rps())
            .unwrap_or_default();
        if let Some(n) = opts.growth_events {
            w1.events = n;
        }
        if empty.is_empty() {
            println!("  W1 on an empty database first (the reference):");
            for run in 1..=opts.runs {
                let reqs = build_requests(&w1, seed ^ 0xE0 ^ run as u64);
                let label = format!("W1-empty-run{run}");
                match run_idemhook(&reqs, &w1, &Setup::default(), &opts, hz, &label) {
                    Ok(r) => {
                        println!("    run {run}: {} req/s", fmt_int(r.load.rps()));
                        empty.push(r.load.rps());
                    }
                    Err(e) => println!("    run {run}: FAILED: {e}"),
                }
            }
        }
        let growth = run_growth(&opts, &w1, &empty, hz, seed);
        print_growth(&growth, &empty);
        failed |= growth.iter().any(|g| g.runs.iter().any(|r| !r.rows_ok()));
    }

    println!("\nload avg: {} (1/5/15 min) at the end", loadavg());
    if failed {
        println!("FAILED: rows stored did not match the distinct events sent");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
