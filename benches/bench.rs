//! idemhook's throughput benchmark (issue 6): the real binary against a
//! no-op tiny_http server, driven by one load generator.
//!
//! ```text
//! cargo bench --bench bench                       # W1..W4, 3 runs each
//! cargo bench --bench bench -- --runs 5
//! cargo bench --bench bench -- --growth           # + W1 on 1,000,000 stored events, W1 during prune
//! cargo bench --bench bench -- --growth-10m       # + W1 on 10,000,000 stored events (slow)
//! cargo bench --bench bench -- --only W1,W4 --scale 0.25 --log-level warn --perf /tmp/perf
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

/// The whole schema, to create a database for prefilling.
#[path = "support/pg_mode.rs"]
mod bench_pg;
#[path = "../tests/support/pg_cluster.rs"]
mod pg_cluster;

const SCHEMA: &str = include_str!("../schema.sql");
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
    only: Option<Vec<String>>,
    scale: f64,
    log_level: Option<String>,
    perf_dir: Option<PathBuf>,
    /// idemhook's http_workers (the spec's is 8, like the no-op server).
    idem_workers: usize,
    /// idemhook's forward_workers; None keeps its default (4).
    forward_workers: Option<usize>,
    /// idemhook's durability: "full" (the issue's setup) or "normal".
    durability: String,
    /// cargo bench passes `--bench`; `cargo test --all-targets` does not.
    bench_flag: bool,
    force: bool,
    /// W1 and W2 on PostgreSQL (one and two instances, and the classic
    /// design) instead of the SQLite workloads.
    postgres: bool,
}

const USAGE: &str = "usage: cargo bench --bench bench [-- OPTIONS]
  --runs N          repeat each workload N times, report medians and min-max (default 3)
  --growth          also W1 on 1,000,000 stored events and W1 during a 1,000,000-event prune
  --growth-10m      also W1 on 10,000,000 stored events (implies --growth; slow)
  --only W1,W2,..   run only these workloads (W1 W2 W3 W4; G1M G10M GPRUNE with --growth)
  --scale F         multiply every event count by F (quick checks; default 1)
  --log-level L     pass --log-level L to idemhook serve (default: its own, info)
  --perf DIR        record `perf record` of idemhook during each load into DIR
  --idemhook-workers N   idemhook's http_workers (default 8, as the spec says; for experiments)
  --forward-workers N    idemhook's forward_workers (default: idemhook's own, 4; for experiments)
  --durability D    idemhook's durability, full (default, as the issue says) or normal (no fsync
                    before answering; for experiments: what the fsync costs)
  --postgres        W1 and W2 on a local PostgreSQL cluster: the classic one-transaction-per-event
                    design, one idemhook instance and two (needs initdb and postgres)
  --force           run even without cargo bench's --bench flag";

impl Opts {
    fn parse(args: &[String]) -> Result<Opts, String> {
        let mut o = Opts {
            runs: 3,
            growth: false,
            growth_10m: false,
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
                "--growth" => o.growth = true,
                "--growth-10m" => {
                    o.growth = true;
                    o.growth_10m = true;
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
// Workloads and requests

#[derive(Debug, Clone)]
struct Workload {
    name: &'static str,
    what: String,
    events: usize,
    copies: usize,
    conns: usize,
    forward: bool,
}

impl Workload {
    fn requests(&self) -> usize {
        self.events * self.copies
    }
}

fn workloads(o: &Opts) -> Vec<Workload> {
    let w = |name, events: usize, copies, conns: usize, forward, what: &str| Workload {
        name,
        what: what
            .replace("{n}", &fmt_int(o.scaled(events) as f64))
            .replace("{c}", &conns.to_string()),
        events: o.scaled(events),
        copies,
        conns,
        forward,
    };
    vec![
        w("W1", 20_000, 1, 64, false, "{n} unique events, {c} conns"),
        w(
            "W2",
            2_000,
            8,
            64,
            false,
            "{n} events x8, dups concurrent, {c} conns",
        ),
        w("W3", 5_000, 1, 4, false, "{n} unique events, {c} conns"),
        w("W4", 10_000, 1, 64, true, "{n} events forwarded, {c} conns"),
    ]
}

/// splitmix64: a bijection on u64, so distinct inputs give distinct ids.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn base62(mut v: u64, width: usize, out: &mut String) {
    let mut digits = [b'0'; 16];
    for d in digits.iter_mut().take(width).rev() {
        *d = BASE62[(v % 62) as usize];
        v /= 62;
    }
    out.push_str(std::str::from_utf8(&digits[..width]).unwrap_or(""));
}

/// A Stripe-like event id, random-looking and unique per (seed, i): 11
/// base62 digits of a bijection of the index, then 13 of noise.
fn event_id(seed: u64, i: u64, prefix: &str) -> String {
    let mut s = String::with_capacity(4 + ID_CHARS);
    s.push_str(prefix);
    base62(mix(seed.wrapping_mul(0x1_0000_0000) ^ i), 11, &mut s);
    base62(mix(i ^ 0xA5A5_5A5A ^ seed.rotate_left(17)), 13, &mut s);
    s
}

fn noise(seed: u64, n: usize) -> String {
    let mut s = String::with_capacity(n);
    let mut k = 0;
    while s.len() < n {
        base62(mix(seed ^ k), 10, &mut s);
        k += 1;
    }
    s.truncate(n);
    s
}

/// A realistic `charge.succeeded` event, about 1.5 KiB, compact as sent.
fn stripe_event(id: &str, i: u64, created: i64) -> String {
    let n = |tag: u64, len: usize| noise(mix(i ^ (tag << 56)), len);
    let amount = 500 + (mix(i) % 50_000) as i64;
    format!(
        concat!(
            r#"{{"id":"{id}","object":"event","api_version":"2024-06-20","created":{created},"#,
            r#""data":{{"object":{{"id":"ch_3{ch}","object":"charge","amount":{amount},"amount_captured":{amount},"#,
            r#""amount_refunded":0,"application_fee_amount":null,"#,
            r#""balance_transaction":"txn_3{txn}","billing_details":{{"address":{{"city":"Berlin","country":"DE","#,
            r#""line1":"Torstrasse 1","line2":null,"postal_code":"10119","state":null}},"email":"jenny.rosen@example.com","#,
            r#""name":"Jenny Rosen","phone":null}},"calculated_statement_descriptor":"IDEMHOOK BENCH","captured":true,"#,
            r#""created":{created},"currency":"eur","customer":"cus_{cus}","description":"Order #{order}","#,
            r#""failure_code":null,"failure_message":null,"#,
            r#""livemode":false,"metadata":{{"order_id":"{order}"}},"#,
            r#""outcome":{{"risk_level":"normal","risk_score":{risk},"#,
            r#""seller_message":"Payment complete.","type":"authorized"}},"paid":true,"payment_intent":"pi_3{pi}","#,
            r#""payment_method":"pm_1{pm}","payment_method_details":{{"card":{{"brand":"visa","#,
            r#""checks":{{"cvc_check":"pass"}},"#,
            r#""country":"US","exp_month":8,"exp_year":2027,"fingerprint":"{fp}","funding":"credit","#,
            r#""last4":"4242","network":"visa","wallet":null}},"type":"card"}},"#,
            r#""receipt_email":null,"receipt_url":"https://pay.stripe.com/receipts/payment/{receipt}","#,
            r#""refunded":false,"shipping":null,"status":"succeeded"}}}},"#,
            r#""livemode":false,"pending_webhooks":1,"request":{{"id":"req_{req}","idempotency_key":"{idem}"}},"#,
            r#""type":"charge.succeeded"}}"#
        ),
        id = id,
        created = created,
        amount = amount,
        ch = n(1, 23),
        txn = n(2, 23),
        cus = n(3, 14),
        order = 100_000 + i,
        risk = mix(i) % 60,
        pi = n(4, 23),
        pm = n(5, 23),
        fp = n(6, 16),
        receipt = n(7, 56),
        req = n(8, 14),
        idem = format!(
            "{}-{}-{}-{}-{}",
            n(9, 8),
            n(10, 4),
            n(11, 4),
            n(12, 4),
            n(13, 12)
        ),
    )
}

fn sign(body: &[u8], t: i64) -> String {
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(SECRET.as_bytes())
        .expect("hmac takes any key length");
    mac.update(t.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("t={t},v1={}", hex::encode(mac.finalize().into_bytes()))
}

fn request_bytes(body: &[u8], t: i64) -> Vec<u8> {
    let mut r = Vec::with_capacity(body.len() + 400);
    let _ = write!(
        r,
        "POST /hooks/stripe HTTP/1.1\r\nHost: 127.0.0.1\r\n\
         User-Agent: Stripe/1.0 (+https://stripe.com/docs/webhooks)\r\n\
         Accept: */*; q=0.5, application/xml\r\nCache-Control: no-cache\r\n\
         Content-Type: application/json; charset=utf-8\r\n\
         Stripe-Signature: {}\r\nContent-Length: {}\r\n\r\n",
        sign(body, t),
        body.len()
    );
    r.extend_from_slice(body);
    r
}

/// The requests of one workload, in send order: each event's copies are
/// adjacent, so they go out on different connections at the same time.
struct Requests {
    bytes: Vec<Vec<u8>>,
    /// The event index of each request.
    event_of: Vec<u32>,
    body_bytes: usize,
}

fn build_requests(w: &Workload, seed: u64) -> Requests {
    let t = unix_secs();
    let mut bytes = Vec::with_capacity(w.requests());
    let mut event_of = Vec::with_capacity(w.requests());
    let mut body_bytes = 0;
    for e in 0..w.events {
        let id = event_id(seed, e as u64, "evt_");
        let body = stripe_event(&id, e as u64, t - 2);
        body_bytes += body.len();
        for k in 0..w.copies {
            // A provider signs every attempt afresh; the body is the same.
            bytes.push(request_bytes(body.as_bytes(), t + (k as i64 % 3)));
            event_of.push(e as u32);
        }
    }
    Requests {
        bytes,
        event_of,
        body_bytes: body_bytes / w.events.max(1),
    }
}

// ---------------------------------------------------------------------------
// The load generator

#[derive(Debug)]
enum Fail {
    Timeout,
    Closed,
    Io(String),
    Protocol(String),
}

impl std::fmt::Display for Fail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fail::Timeout => write!(f, "no answer"),
            Fail::Closed => write!(f, "connection closed"),
            Fail::Io(e) => write!(f, "i/o error: {e}"),
            Fail::Protocol(e) => write!(f, "bad response: {e}"),
        }
    }
}

struct Response {
    status: u16,
    /// The body, kept only when it is short (all our answers are).
    body: Vec<u8>,
    close: bool,
}

/// One keep-alive HTTP/1.1 connection with its own read buffer.
struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
    pos: usize,
    len: usize,
}

impl Conn {
    fn connect(addr: SocketAddr) -> std::io::Result<Conn> {
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
        stream.set_nodelay(true)?;
        // Reads wake up this often to check the request's deadline.
        stream.set_read_timeout(Some(Duration::from_millis(250)))?;
        stream.set_write_timeout(Some(ANSWER_TIMEOUT))?;
        Ok(Conn {
            stream,
            buf: vec![0; 16 * 1024],
            pos: 0,
            len: 0,
        })
    }

    fn fill(&mut self, deadline: Instant) -> Result<(), Fail> {
        if self.pos == self.len {
            self.pos = 0;
            self.len = 0;
        } else if self.len == self.buf.len() {
            self.buf.copy_within(self.pos..self.len, 0);
            self.len -= self.pos;
            self.pos = 0;
            if self.len == self.buf.len() {
                self.buf.resize(self.buf.len() * 2, 0);
            }
        }
        loop {
            match self.stream.read(&mut self.buf[self.len..]) {
                Ok(0) => return Err(Fail::Closed),
                Ok(n) => {
                    self.len += n;
                    return Ok(());
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    if Instant::now() >= deadline {
                        return Err(Fail::Timeout);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Fail::Io(e.to_string())),
            }
        }
    }

    fn find(&self, pat: &[u8]) -> Option<usize> {
        self.buf[self.pos..self.len]
            .windows(pat.len())
            .position(|w| w == pat)
    }

    /// Ensures `n` unread bytes are buffered.
    fn need(&mut self, n: usize, deadline: Instant) -> Result<(), Fail> {
        while self.len - self.pos < n {
            if self.pos + n > self.buf.len() {
                self.buf.copy_within(self.pos..self.len, 0);
                self.len -= self.pos;
                self.pos = 0;
                if n > self.buf.len() {
                    self.buf.resize(n.next_power_of_two(), 0);
                }
            }
            self.fill(deadline)?;
        }
        Ok(())
    }

    fn line(&mut self, deadline: Instant) -> Result<String, Fail> {
        loop {
            if let Some(i) = self.find(b"\r\n") {
                let s = String::from_utf8_lossy(&self.buf[self.pos..self.pos + i]).into_owned();
                self.pos += i + 2;
                return Ok(s);
            }
            if self.len - self.pos > 64 * 1024 {
                return Err(Fail::Protocol("line longer than 64 KiB".into()));
            }
            self.fill(deadline)?;
        }
    }

    fn take_body(&mut self, n: usize, out: &mut Vec<u8>, deadline: Instant) -> Result<(), Fail> {
        self.need(n, deadline)?;
        if out.len() < 4096 {
            out.extend_from_slice(&self.buf[self.pos..self.pos + n.min(4096)]);
        }
        self.pos += n;
        Ok(())
    }

    /// Writes one request and reads its whole response.
    fn exchange(&mut self, request: &[u8], deadline: Instant) -> Result<Response, Fail> {
        self.stream.write_all(request).map_err(|e| match e.kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => Fail::Timeout,
            _ => Fail::Io(e.to_string()),
        })?;
        self.read_response(deadline)
    }

    fn read_response(&mut self, deadline: Instant) -> Result<Response, Fail> {
        let status_line = self.line(deadline)?;
        let mut parts = status_line.splitn(3, ' ');
        let version = parts.next().unwrap_or("");
        let status: u16 = parts
            .next()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| Fail::Protocol(format!("bad status line {status_line:?}")))?;
        let mut content_length = None;
        let mut chunked = false;
        let mut close = version == "HTTP/1.0";
        loop {
            let line = self.line(deadline)?;
            if line.is_empty() {
                break;
            }
            let Some((name, value)) = line.split_once(':') else {
                return Err(Fail::Protocol(format!("bad header {line:?}")));
            };
            let value = value.trim();
            if name.eq_ignore_ascii_case("content-length") {
                content_length = value.parse::<usize>().ok();
            } else if name.eq_ignore_ascii_case("transfer-encoding") {
                chunked = value.to_ascii_lowercase().contains("chunked");
            } else if name.eq_ignore_ascii_case("connection") {
                close = value.eq_ignore_ascii_case("close");
            }
        }
        let mut body = Vec::new();
        if chunked {
            loop {
                let size_line = self.line(deadline)?;
                let size =
                    usize::from_str_radix(size_line.split(';').next().unwrap_or("").trim(), 16)
                        .map_err(|_| Fail::Protocol(format!("bad chunk size {size_line:?}")))?;
                if size == 0 {
                    // Trailers, then the empty line.
                    while !self.line(deadline)?.is_empty() {}
                    break;
                }
                self.take_body(size, &mut body, deadline)?;
                if !self.line(deadline)?.is_empty() {
                    return Err(Fail::Protocol("chunk not followed by CRLF".into()));
                }
            }
        } else if let Some(n) = content_length {
            self.take_body(n, &mut body, deadline)?;
        } else if status >= 200 && status != 204 && status != 304 {
            return Err(Fail::Protocol("response without a length".into()));
        }
        Ok(Response {
            status,
            body,
            close,
        })
    }
}

#[derive(Default)]
struct LoadResult {
    wall: Duration,
    /// Requests written (answered or not).
    sent: usize,
    ok: usize,
    /// Latency of every request that got an answer or timed out, in µs.
    latencies_us: Vec<u64>,
    statuses: BTreeMap<u16, usize>,
    /// Body `"status"` words of 200 answers (accepted, duplicate, ...).
    words: BTreeMap<String, usize>,
    errors: usize,
    unanswered: usize,
    slow: usize,
    reconnects: usize,
    connect_failures: usize,
    samples: Vec<String>,
    aborted: bool,
    /// Per request: 0 not sent, 1 sent but not 200, 2 answered 200.
    fate: Vec<u8>,
    /// A load thread's (request, fate) pairs, merged into `fate`.
    sparse: Vec<(u32, u8)>,
}

impl LoadResult {
    fn rps(&self) -> f64 {
        self.ok as f64 / self.wall.as_secs_f64().max(1e-9)
    }

    fn p(&self, pct: f64) -> f64 {
        percentile(&self.latencies_us, pct)
    }

    fn problems(&self) -> String {
        let mut out = Vec::new();
        let non200: usize = self
            .statuses
            .iter()
            .filter(|(s, _)| **s != 200)
            .map(|(_, n)| n)
            .sum();
        if non200 > 0 {
            out.push(format!("{non200} non-200 {:?}", self.statuses));
        }
        if self.unanswered > 0 {
            out.push(format!("{} unanswered >5 s", self.unanswered));
        }
        if self.slow > 0 {
            out.push(format!("{} answered after >1 s", self.slow));
        }
        if self.errors > 0 {
            out.push(format!("{} connection errors", self.errors));
        }
        if self.connect_failures > 0 {
            out.push(format!("{} failed connects", self.connect_failures));
        }
        let unsent = self.fate.iter().filter(|f| **f == 0).count();
        if unsent > 0 {
            out.push(format!("{unsent} never sent"));
        }
        if self.aborted {
            out.push(format!("ABORTED after {} s", WORKLOAD_LIMIT.as_secs()));
        }
        if out.is_empty() {
            "none".into()
        } else {
            out.join(", ")
        }
    }

    fn clean(&self) -> bool {
        self.problems() == "none"
    }
}

fn percentile(sorted: &[u64], pct: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((pct / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1] as f64 / 1000.0
}

/// Sends every request once over `conns` keep-alive connections. Each
/// thread takes the next request from a shared counter, so the copies of
/// an event (adjacent) are in flight on different connections at once.
fn run_load(addr: SocketAddr, requests: &[Vec<u8>], conns: usize) -> LoadResult {
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let barrier = Barrier::new(conns + 1);
    let n = requests.len();
    let (wall, parts) = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..conns)
            .map(|_| {
                let (next, stop, barrier) = (&next, &stop, &barrier);
                scope.spawn(move || load_thread(addr, requests, next, stop, barrier))
            })
            .collect();
        barrier.wait();
        let start = Instant::now();
        // The cut-off: threads stop taking requests past the limit.
        let limit = start + WORKLOAD_LIMIT;
        while !handles.iter().all(|h| h.is_finished()) {
            if Instant::now() >= limit {
                stop.store(true, Ordering::Relaxed);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let wall_end = Instant::now();
        let parts: Vec<LoadResult> = handles
            .into_iter()
            .map(|h| h.join().unwrap_or_default())
            .collect();
        (wall_end.duration_since(start), parts)
    });
    let mut r = LoadResult {
        wall,
        fate: vec![0; n],
        aborted: stop.load(Ordering::Relaxed),
        ..LoadResult::default()
    };
    for p in parts {
        r.sent += p.sent;
        r.ok += p.ok;
        r.latencies_us.extend(p.latencies_us);
        for (s, c) in p.statuses {
            *r.statuses.entry(s).or_default() += c;
        }
        for (w, c) in p.words {
            *r.words.entry(w).or_default() += c;
        }
        r.errors += p.errors;
        r.unanswered += p.unanswered;
        r.slow += p.slow;
        r.reconnects += p.reconnects;
        r.connect_failures += p.connect_failures;
        for s in p.samples {
            if r.samples.len() < 8 {
                r.samples.push(s);
            }
        }
        for (i, f) in p.sparse {
            r.fate[i as usize] = f;
        }
    }
    r.latencies_us.sort_unstable();
    r
}

fn status_word(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    text.split_once(r#""status":""#)
        .and_then(|(_, rest)| rest.split_once('"'))
        .map_or("-".to_string(), |(w, _)| w.to_string())
}

fn load_thread(
    addr: SocketAddr,
    requests: &[Vec<u8>],
    next: &AtomicUsize,
    stop: &AtomicBool,
    barrier: &Barrier,
) -> LoadResult {
    let mut r = LoadResult::default();
    let mut conn = Conn::connect(addr).ok();
    if conn.is_none() {
        r.connect_failures += 1;
    }
    barrier.wait();
    let record_fate = |r: &mut LoadResult, i: usize, f: u8| r.sparse.push((i as u32, f));
    loop {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        if conn.is_none() {
            // Reconnect, a few times, before taking a request.
            for attempt in 0..3 {
                match Conn::connect(addr) {
                    Ok(c) => {
                        conn = Some(c);
                        r.reconnects += 1;
                        break;
                    }
                    Err(_) => {
                        r.connect_failures += 1;
                        std::thread::sleep(Duration::from_millis(100 * (attempt + 1)));
                    }
                }
            }
            if conn.is_none() {
                break;
            }
        }
        let i = next.fetch_add(1, Ordering::Relaxed);
        if i >= requests.len() {
            break;
        }
        let Some(c) = conn.as_mut() else { break };
        let t = Instant::now();
        let result = c.exchange(&requests[i], t + ANSWER_TIMEOUT);
        let took = t.elapsed();
        r.sent += 1;
        match result {
            Ok(resp) => {
                r.latencies_us.push(took.as_micros() as u64);
                if took > SLOW {
                    r.slow += 1;
                }
                *r.statuses.entry(resp.status).or_default() += 1;
                if resp.status == 200 {
                    r.ok += 1;
                    *r.words.entry(status_word(&resp.body)).or_default() += 1;
                    record_fate(&mut r, i, 2);
                } else {
                    record_fate(&mut r, i, 1);
                    if r.samples.len() < 4 {
                        r.samples.push(format!(
                            "request {i}: {} {}",
                            resp.status,
                            String::from_utf8_lossy(&resp.body[..resp.body.len().min(200)])
                        ));
                    }
                }
                if resp.close {
                    conn = None;
                }
            }
            Err(fail) => {
                record_fate(&mut r, i, 1);
                if matches!(fail, Fail::Timeout) {
                    r.unanswered += 1;
                    r.latencies_us.push(took.as_micros() as u64);
                } else {
                    r.errors += 1;
                }
                if r.samples.len() < 4 {
                    r.samples.push(format!(
                        "request {i}: {fail} after {:.1} s",
                        took.as_secs_f64()
                    ));
                }
                // The connection's state is unknown: start a new one. The
                // request is not sent again (a provider would retry later).
                conn = None;
            }
        }
    }
    r
}

// ---------------------------------------------------------------------------
// The no-op server (and the W4 downstream)

/// What the W4 downstream saw.
struct Seen {
    keys: Mutex<HashSet<String>>,
    /// Client addresses: how many connections the forwarder used.
    peers: Mutex<HashSet<SocketAddr>>,
    total: AtomicUsize,
    target: usize,
    done_at: Mutex<Option<Instant>>,
    cv: Condvar,
}

struct NoopServer {
    server: Arc<tiny_http::Server>,
    workers: Vec<JoinHandle<()>>,
    addr: SocketAddr,
    seen: Option<Arc<Seen>>,
}

impl NoopServer {
    /// Reads the body, answers 200 with a small JSON body; with `target`,
    /// also records each request's Idempotency-Key.
    fn start(target: Option<usize>) -> Result<NoopServer, String> {
        let server = tiny_http::Server::http("127.0.0.1:0").map_err(|e| e.to_string())?;
        let addr = server
            .server_addr()
            .to_ip()
            .ok_or("no-op server has no IP address")?;
        let server = Arc::new(server);
        let seen = target.map(|target| {
            Arc::new(Seen {
                keys: Mutex::new(HashSet::with_capacity(target)),
                peers: Mutex::new(HashSet::new()),
                total: AtomicUsize::new(0),
                target,
                done_at: Mutex::new(None),
                cv: Condvar::new(),
            })
        });
        let content_type =
            tiny_http::Header::from_bytes(&b"Content-Type"[..], &b"application/json"[..])
                .map_err(|()| "bad header".to_string())?;
        let workers = (0..HTTP_WORKERS)
            .map(|i| {
                let (server, seen, ct) = (server.clone(), seen.clone(), content_type.clone());
                std::thread::Builder::new()
                    .name(format!("noop-{i}"))
                    .spawn(move || noop_worker(&server, seen.as_deref(), &ct))
                    .map_err(|e| e.to_string())
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(NoopServer {
            server,
            workers,
            addr,
            seen,
        })
    }

    fn stop(self) {
        for _ in &self.workers {
            self.server.unblock();
        }
        for w in self.workers {
            let _ = w.join();
        }
    }
}

fn noop_worker(server: &tiny_http::Server, seen: Option<&Seen>, ct: &tiny_http::Header) {
    let mut body = Vec::with_capacity(4096);
    while let Ok(mut rq) = server.recv() {
        body.clear();
        let _ = rq.as_reader().read_to_end(&mut body);
        if let Some(seen) = seen {
            seen.total.fetch_add(1, Ordering::Relaxed);
            if let Some(peer) = rq.remote_addr() {
                let mut peers = seen.peers.lock().unwrap_or_else(|e| e.into_inner());
                peers.insert(*peer);
            }
            let key = rq
                .headers()
                .iter()
                .find(|h| h.field.equiv("Idempotency-Key"))
                .map(|h| h.value.as_str().to_string());
            if let Some(key) = key {
                let distinct = {
                    let mut keys = seen.keys.lock().unwrap_or_else(|e| e.into_inner());
                    keys.insert(key);
                    keys.len()
                };
                if distinct == seen.target {
                    let mut d = seen.done_at.lock().unwrap_or_else(|e| e.into_inner());
                    d.get_or_insert_with(Instant::now);
                    seen.cv.notify_all();
                }
            }
        }
        let response = tiny_http::Response::from_data(&br#"{"status":"ok"}"#[..])
            .with_status_code(200)
            .with_header(ct.clone());
        let _ = rq.respond(response);
    }
}

// ---------------------------------------------------------------------------
// The real idemhook

struct Idemhook {
    child: Child,
    addr: SocketAddr,
    stderr_path: PathBuf,
}

impl Idemhook {
    fn start(dir: &Path, config: &str, opts: &Opts) -> Result<Idemhook, String> {
        let config_path = dir.join("idemhook.toml");
        std::fs::write(&config_path, config).map_err(|e| format!("write config: {e}"))?;
        let stderr_path = dir.join("serve.stderr");
        let stderr = std::fs::File::create(&stderr_path).map_err(|e| e.to_string())?;
        let mut cmd = Command::new(idemhook_binary());
        cmd.arg("serve").arg("--config").arg(&config_path);
        if let Some(level) = &opts.log_level {
            cmd.arg("--log-level").arg(level);
        }
        let mut child = cmd
            .current_dir(dir)
            .env_remove("IDEMHOOK_LOG")
            .env_remove("IDEMHOOK_FAILPOINTS")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(stderr))
            .spawn()
            .map_err(|e| format!("cannot start idemhook: {e}"))?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(rest) = line.strip_prefix("idemhook listening on http://")
                    && let Some(tx) = tx.take()
                {
                    let _ = tx.send(rest.trim().to_string());
                }
            }
        });
        let addr = match rx.recv_timeout(STARTUP_TIMEOUT) {
            Ok(a) => a.parse::<SocketAddr>().map_err(|e| format!("{a:?}: {e}")),
            Err(_) => Err("no listening line".to_string()),
        };
        match addr {
            Ok(addr) => Ok(Idemhook {
                child,
                addr,
                stderr_path,
            }),
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                Err(format!(
                    "idemhook serve did not start ({e}); stderr:\n{}",
                    tail(&stderr_path, 2000)
                ))
            }
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGTERM, then SIGKILL after STOP_TIMEOUT. True when it stopped by itself.
    fn stop(mut self) -> (bool, String) {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.pid().to_string())
            .status();
        let deadline = Instant::now() + STOP_TIMEOUT;
        let graceful = loop {
            match self.child.try_wait() {
                Ok(Some(s)) => break s.success(),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                _ => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    break false;
                }
            }
        };
        (graceful, tail(&self.stderr_path, 1500))
    }

    /// The writer's (commits, operations) from /metrics.
    fn group_stats(&self) -> Option<(f64, f64)> {
        let mut c = Conn::connect(self.addr).ok()?;
        let req = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
        c.stream.write_all(req).ok()?;
        // /metrics is larger than the 4 KiB kept by take_body: read it raw.
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut text = Vec::new();
        while let Ok(()) = c.fill(deadline) {
            text.extend_from_slice(&c.buf[c.pos..c.len]);
            c.pos = c.len;
        }
        let text = String::from_utf8_lossy(&text);
        let value = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        };
        Some((
            value("idemhook_commits_total")?,
            value("idemhook_committed_operations_total")?,
        ))
    }
}

fn tail(path: &Path, max: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let start = text.len().saturating_sub(max);
    let start = (start..text.len())
        .find(|i| text.is_char_boundary(*i))
        .unwrap_or(text.len());
    text[start..].to_string()
}

/// The idemhook binary under test: this build's, or IDEMHOOK_BENCH_BINARY
/// (to compare two builds in one sitting: alternate runs of each).
fn idemhook_binary() -> PathBuf {
    std::env::var_os("IDEMHOOK_BENCH_BINARY")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_idemhook")))
}

fn idemhook_config(workers: usize, forward_url: Option<&str>, retention: Option<&str>) -> String {
    let mut c = format!(
        "listen = \"127.0.0.1:0\"\ndatabase = \"idemhook.db\"\ndurability = \"full\"\n\
         http_workers = {workers}\nprune_interval = \"0s\"\n\n\
         [sources.stripe]\nkind = \"stripe\"\nsecrets = [\"{SECRET}\"]\n"
    );
    if let Some(r) = retention {
        let _ = writeln!(c, "retention = \"{r}\"\npayload_retention = \"{r}\"");
    }
    if let Some(url) = forward_url {
        let _ = write!(
            c,
            "\n[[sources.stripe.actions]]\nname = \"notify-app\"\nforward = \"{url}\"\ntimeout = \"10s\"\n"
        );
    }
    c
}

// ---------------------------------------------------------------------------
// /proc

fn proc_status_kib(pid: u32, key: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix(key))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

/// utime + stime of a process, in clock ticks.
fn proc_cpu_ticks(pid: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = s.rsplit_once(')')?.1.split_whitespace().collect();
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

/// (busy, total) ticks of the whole machine.
fn machine_ticks() -> Option<(u64, u64)> {
    let s = std::fs::read_to_string("/proc/stat").ok()?;
    let v: Vec<u64> = s
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3)? + v.get(4)?;
    Some((total - idle, total))
}

fn clock_ticks_per_sec() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

/// On-CPU and run-queue nanoseconds of each long-lived idemhook thread
/// (writer, checkpointer), by thread name, from /proc/PID/task/*/schedstat.
fn thread_sched_ns(pid: &str) -> BTreeMap<String, (u64, u64)> {
    let mut out = BTreeMap::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for t in tasks.flatten() {
        let dir = t.path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        let comm = comm.trim();
        if !(comm.starts_with("idemhook-write") || comm.starts_with("idemhook-check")) {
            continue;
        }
        let stat = std::fs::read_to_string(dir.join("schedstat")).unwrap_or_default();
        let mut f = stat
            .split_whitespace()
            .map(|x| x.parse::<u64>().unwrap_or(0));
        let (run, wait) = (f.next().unwrap_or(0), f.next().unwrap_or(0));
        let e = out.entry(comm.to_string()).or_insert((0, 0));
        e.0 += run;
        e.1 += wait;
    }
    out
}

/// CPU used during a span: ours, the child's, and everyone else's.
struct CpuProbe {
    at: Instant,
    machine: Option<(u64, u64)>,
    me: Option<u64>,
    child: Option<(String, u64)>,
    threads: BTreeMap<String, (u64, u64)>,
}

struct CpuUse {
    /// Cores busy with other processes (the noise), on average.
    others_cores: f64,
    /// The bench process (load generator, no-op server) in seconds.
    bench_s: f64,
    /// The idemhook process in seconds.
    child_s: Option<f64>,
    /// Per long-lived idemhook thread: (on-CPU, waiting for a CPU) seconds.
    threads: BTreeMap<String, (f64, f64)>,
}

impl CpuProbe {
    fn start(child: Option<u32>) -> CpuProbe {
        let child = child.and_then(|p| {
            let p = p.to_string();
            proc_cpu_ticks(&p).map(|t| (p, t))
        });
        let threads = child
            .as_ref()
            .map(|(p, _)| thread_sched_ns(p))
            .unwrap_or_default();
        CpuProbe {
            at: Instant::now(),
            machine: machine_ticks(),
            me: proc_cpu_ticks("self"),
            child,
            threads,
        }
    }

    fn finish(&self, hz: f64) -> CpuUse {
        let wall = self.at.elapsed().as_secs_f64().max(1e-6);
        let me = proc_cpu_ticks("self")
            .zip(self.me)
            .map_or(0, |(b, a)| b.saturating_sub(a));
        let child = self
            .child
            .as_ref()
            .and_then(|(p, a)| proc_cpu_ticks(p).map(|b| b.saturating_sub(*a)));
        let busy = machine_ticks()
            .zip(self.machine)
            .map_or(0, |((b1, _), (b0, _))| b1.saturating_sub(b0));
        let ours = me + child.unwrap_or(0);
        let threads = self
            .child
            .as_ref()
            .map(|(p, _)| thread_sched_ns(p))
            .unwrap_or_default()
            .into_iter()
            .filter_map(|(name, (run, wait))| {
                let (run0, wait0) = self.threads.get(&name)?;
                Some((
                    name,
                    (
                        run.saturating_sub(*run0) as f64 / 1e9,
                        wait.saturating_sub(*wait0) as f64 / 1e9,
                    ),
                ))
            })
            .collect();
        CpuUse {
            others_cores: busy.saturating_sub(ours) as f64 / hz / wall,
            bench_s: me as f64 / hz,
            child_s: child.map(|c| c as f64 / hz),
            threads,
        }
    }
}

// ---------------------------------------------------------------------------
// Runs

struct NoopRun {
    load: LoadResult,
    cpu: CpuUse,
}

#[derive(Default)]
struct ForwardStats {
    per_sec: f64,
    connections: usize,
    distinct: usize,
    total: usize,
    jobs: BTreeMap<String, i64>,
}

struct IdemRun {
    load: LoadResult,
    cpu: CpuUse,
    rss_kib: Option<u64>,
    db_bytes: u64,
    wal_bytes: u64,
    rows: i64,
    distinct_sent: usize,
    distinct_acked: usize,
    incidents: i64,
    group: Option<(f64, f64)>,
    forward: Option<ForwardStats>,
    prune: Option<String>,
    graceful: bool,
    stderr_tail: String,
}

impl IdemRun {
    /// Rows stored equal distinct events (or, when some requests went
    /// unanswered, lie between the acked and the sent).
    fn rows_ok(&self) -> bool {
        if self.load.clean() {
            self.rows == self.distinct_sent as i64
        } else {
            self.rows >= self.distinct_acked as i64 && self.rows <= self.distinct_sent as i64
        }
    }

    fn rows_text(&self) -> String {
        format!(
            "{}/{} {}",
            self.rows,
            self.distinct_sent,
            if self.rows_ok() { "ok" } else { "MISMATCH" }
        )
    }
}

fn run_noop(reqs: &Requests, w: &Workload, hz: f64) -> Result<NoopRun, String> {
    let server = NoopServer::start(None)?;
    let probe = CpuProbe::start(None);
    let load = run_load(server.addr, &reqs.bytes, w.conns);
    let cpu = probe.finish(hz);
    server.stop();
    Ok(NoopRun { load, cpu })
}

fn file_len(p: &Path) -> u64 {
    std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)
}

fn with_suffix(p: &Path, suffix: &str) -> PathBuf {
    let mut s = p.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// Extra setup of an idemhook run.
#[derive(Default)]
struct Setup {
    /// Copy this database in first (growth).
    template: Option<PathBuf>,
    /// Key retention for the source (the prune case).
    retention: Option<&'static str>,
    /// Run `idemhook prune` concurrently with the load.
    prune: bool,
}

fn run_idemhook(
    reqs: &Requests,
    w: &Workload,
    setup: &Setup,
    opts: &Opts,
    hz: f64,
    label: &str,
) -> Result<IdemRun, String> {
    let dir = tempfile::Builder::new()
        .prefix("idemhook-bench-")
        .tempdir()
        .map_err(|e| e.to_string())?;
    let db = dir.path().join("idemhook.db");
    if let Some(t) = &setup.template {
        std::fs::copy(t, &db).map_err(|e| format!("copy {}: {e}", t.display()))?;
    }
    let downstream = if w.forward {
        Some(NoopServer::start(Some(w.events))?)
    } else {
        None
    };
    let url = downstream
        .as_ref()
        .map(|d| format!("http://{}/stripe", d.addr));
    let mut config = idemhook_config(opts.idem_workers, url.as_deref(), setup.retention).replace(
        "durability = \"full\"",
        &format!("durability = \"{}\"", opts.durability),
    );
    if let Some(n) = opts.forward_workers {
        config.insert_str(0, &format!("forward_workers = {n}\n"));
    }
    let server = match Idemhook::start(dir.path(), &config, opts) {
        Ok(s) => s,
        Err(e) => {
            if let Some(d) = downstream {
                d.stop();
            }
            return Err(e);
        }
    };
    let perf = opts
        .perf_dir
        .as_ref()
        .and_then(|d| start_perf(d, server.pid(), label));

    let mut prune_child = None;
    if setup.prune {
        let child = Command::new(idemhook_binary())
            .arg("prune")
            .arg("--config")
            .arg(dir.path().join("idemhook.toml"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start prune: {e}"))?;
        prune_child = Some((child, Instant::now()));
        // Let it get going, so the load runs inside the prune.
        std::thread::sleep(Duration::from_millis(300));
    }

    let t0_ms = now_ms() - 1;
    let probe = CpuProbe::start(Some(server.pid()));
    let load_started = Instant::now();
    let load = run_load(server.addr, &reqs.bytes, w.conns);
    let load_done = Instant::now();

    let forward = downstream
        .as_ref()
        .and_then(|d| d.seen.clone())
        .map(|seen| {
            // Until the downstream has seen every distinct key, bounded.
            let deadline = load_started + WORKLOAD_LIMIT;
            let mut done = seen.done_at.lock().unwrap_or_else(|e| e.into_inner());
            while done.is_none() && Instant::now() < deadline {
                let wait = deadline.saturating_duration_since(Instant::now());
                done = seen
                    .cv
                    .wait_timeout(done, wait.min(Duration::from_millis(200)))
                    .map(|(g, _)| g)
                    .unwrap_or_else(|e| e.into_inner().0);
            }
            let elapsed = done.map_or(WORKLOAD_LIMIT, |d| d.duration_since(load_started));
            drop(done);
            let distinct = seen.keys.lock().map(|k| k.len()).unwrap_or(0);
            ForwardStats {
                per_sec: distinct as f64 / elapsed.as_secs_f64().max(1e-9),
                distinct,
                total: seen.total.load(Ordering::Relaxed),
                connections: seen.peers.lock().map(|p| p.len()).unwrap_or(0),
                jobs: BTreeMap::new(),
            }
        });
    let cpu = probe.finish(hz);
    if let Some(p) = perf {
        stop_perf(p);
    }
    let rss_kib = proc_status_kib(server.pid(), "VmHWM:");
    let group = server.group_stats();
    let (db_bytes, wal_bytes) = (file_len(&db), file_len(&with_suffix(&db, "-wal")));

    // W4: the completions are recorded after the downstream answered;
    // wait (bounded) until every job reads done.
    let mut forward = forward;
    if let Some(f) = forward.as_mut() {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            f.jobs = job_counts(&db).unwrap_or_default();
            let done = f.jobs.get("done").copied().unwrap_or(0);
            if done as usize >= w.events || Instant::now() >= deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    let prune = prune_child.map(|(mut child, started)| {
        let overlapped = child.try_wait().ok().flatten().is_none();
        let deadline = started + PRUNE_LIMIT;
        let status: Option<ExitStatus> = loop {
            match child.try_wait() {
                Ok(Some(s)) => break Some(s),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50));
                }
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    break None;
                }
            }
        };
        let took = started.elapsed();
        let mut out = String::new();
        if let Some(mut e) = child.stderr.take() {
            let _ = e.read_to_string(&mut out);
        }
        if let Some(mut o) = child.stdout.take() {
            let _ = o.read_to_string(&mut out);
        }
        let load_s = load_done.duration_since(load_started).as_secs_f64();
        format!(
            "prune {} in {:.1} s ({}; the load took {:.1} s); output: {}",
            match status {
                Some(s) if s.success() => "finished".to_string(),
                Some(s) => format!("FAILED ({s})"),
                None => "KILLED after the limit".to_string(),
            },
            took.as_secs_f64(),
            if overlapped {
                "still running when the load ended"
            } else {
                "ended before the load did"
            },
            load_s,
            out.trim().lines().last().unwrap_or("")
        )
    });

    let (graceful, stderr_tail) = server.stop();
    if let Some(d) = downstream {
        d.stop();
    }
    let (rows, incidents) = count_rows(&db, t0_ms).map_err(|e| format!("count rows: {e}"))?;
    if let Some(f) = forward.as_mut() {
        f.jobs = job_counts(&db).unwrap_or_default();
    }
    let mut sent_events = HashSet::new();
    let mut acked_events = HashSet::new();
    for (i, fate) in load.fate.iter().enumerate() {
        if *fate >= 1 {
            sent_events.insert(reqs.event_of[i]);
        }
        if *fate == 2 {
            acked_events.insert(reqs.event_of[i]);
        }
    }
    Ok(IdemRun {
        cpu,
        rss_kib,
        db_bytes,
        wal_bytes,
        rows,
        distinct_sent: sent_events.len(),
        distinct_acked: acked_events.len(),
        incidents,
        group,
        forward,
        prune,
        graceful,
        stderr_tail,
        load,
    })
}

fn open_ro(db: &Path) -> rusqlite::Result<Connection> {
    let c = Connection::open_with_flags(db, OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    c.busy_timeout(Duration::from_secs(5))?;
    Ok(c)
}

/// Events stored by this run (received since `t0_ms`), and incidents.
fn count_rows(db: &Path, t0_ms: i64) -> rusqlite::Result<(i64, i64)> {
    let c = open_ro(db)?;
    let rows = c.query_row(
        "SELECT count(*) FROM events WHERE source = 'stripe' AND received_at >= ?1",
        params![t0_ms],
        |r| r.get(0),
    )?;
    let incidents = c.query_row("SELECT count(*) FROM incidents", [], |r| r.get(0))?;
    Ok((rows, incidents))
}

fn job_counts(db: &Path) -> rusqlite::Result<BTreeMap<String, i64>> {
    let c = open_ro(db)?;
    let mut stmt = c.prepare("SELECT status, count(*) FROM jobs GROUP BY status")?;
    let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?;
    rows.collect()
}

struct Perf {
    child: Child,
}

fn start_perf(dir: &Path, pid: u32, label: &str) -> Option<Perf> {
    std::fs::create_dir_all(dir).ok()?;
    let out = dir.join(format!("perf-{label}.data"));
    let child = Command::new("perf")
        .args([
            "record",
            "-e",
            "cpu-clock",
            "-F",
            "999",
            "--call-graph",
            "dwarf,16384",
            "-p",
        ])
        .arg(pid.to_string())
        .arg("-o")
        .arg(&out)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    // perf needs a moment to attach.
    std::thread::sleep(Duration::from_millis(500));
    println!(
        "    perf: recording idemhook pid {pid} into {}",
        out.display()
    );
    Some(Perf { child })
}

fn stop_perf(mut p: Perf) {
    let _ = Command::new("kill")
        .arg("-INT")
        .arg(p.child.id().to_string())
        .status();
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = p.child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = p.child.kill();
    let _ = p.child.wait();
}

// ---------------------------------------------------------------------------
// Prefill (growth)

/// Creates `db` with `n` stored events received between `from_ms` and
/// `to_ms`, each with one delivery record, their bodies NULL as if
/// payload_retention had pruned them. Ids are spread uniformly over the id
/// space (the bench's own ids interleave with them) and inserted in order.
fn prefill(db: &Path, n: u64, from_ms: i64, to_ms: i64, seed: u64) -> rusqlite::Result<()> {
    let mut c = Connection::open(db)?;
    c.execute_batch(
        "PRAGMA journal_mode = OFF; PRAGMA synchronous = OFF; PRAGMA cache_size = -1048576;",
    )?;
    c.execute_batch(SCHEMA)?;
    c.execute(
        "INSERT OR REPLACE INTO meta(key, value) VALUES ('schema_version', '1')",
        [],
    )?;
    // The first 11 characters encode a u64 (as in `event_id`); the u64
    // range is sliced into n strides, one id in each.
    let stride = ((1u128 << 64) / u128::from(n.max(1))).min(u128::from(u64::MAX)) as u64;
    let span = (to_ms - from_ms).max(1) as u64;
    let batch = 250_000;
    let mut i = 0u64;
    let started = Instant::now();
    while i < n {
        let tx = c.transaction()?;
        {
            let mut ev = tx.prepare_cached(
                "INSERT INTO events (source, event_id, type, state, received_at, completed_at,
                     payload, content_type, headers, payload_hash, verified_with, signed_at, erased_at)
                 VALUES ('stripe', ?1, 'charge.succeeded', 'completed', ?2, ?2, NULL,
                         'application/json; charset=utf-8', NULL, ?3, 0, ?4, ?5)",
            )?;
            let mut dl = tx.prepare_cached(
                "INSERT INTO deliveries (source, event_id, received_at, outcome, remote)
                 VALUES ('stripe', ?1, ?2, 'accepted', '127.0.0.1:50000')",
            )?;
            let end = (i + batch).min(n);
            while i < end {
                let r = mix(seed ^ i);
                let mut id = String::with_capacity(28);
                id.push_str("evt_");
                base62(i * stride + r % stride.max(1), 11, &mut id);
                base62(mix(r), 13, &mut id);
                let at = from_ms + ((u128::from(i) * u128::from(span)) / u128::from(n)) as i64;
                let hash = hex::encode(Sha256::digest(id.as_bytes()));
                ev.execute(params![id, at, hash, at / 1000 - 1, at + 7 * 86_400_000])?;
                dl.execute(params![id, at])?;
                i += 1;
            }
        }
        tx.commit()?;
        if n >= 100_000 && (i.is_multiple_of(1_000_000) || i == n) {
            println!(
                "    prefill: {} of {} events ({:.0} s)",
                fmt_int(i as f64),
                fmt_int(n as f64),
                started.elapsed().as_secs_f64()
            );
        }
    }
    c.execute_batch("PRAGMA journal_mode = WAL;")?;
    Ok(())
}

// ---------------------------------------------------------------------------
// Reporting

fn fmt_int(v: f64) -> String {
    if !v.is_finite() {
        return "-".into();
    }
    let s = format!("{:.0}", v.abs());
    let mut out = String::new();
    for (k, ch) in s.chars().enumerate() {
        if k > 0 && (s.len() - k) % 3 == 0 {
            out.push(',');
        }
        out.push(ch);
    }
    if v < 0.0 { format!("-{out}") } else { out }
}

fn median(v: &[f64]) -> f64 {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if s.is_empty() {
        return f64::NAN;
    }
    s.sort_by(|a, b| a.total_cmp(b));
    let m = s.len() / 2;
    if s.len() % 2 == 1 {
        s[m]
    } else {
        (s[m - 1] + s[m]) / 2.0
    }
}

fn spread(v: &[f64]) -> (f64, f64) {
    let s = v.iter().copied().filter(|x| x.is_finite());
    (
        s.clone().fold(f64::INFINITY, f64::min),
        s.fold(f64::NEG_INFINITY, f64::max),
    )
}

/// "median (min–max)" with a formatter.
fn mm(v: &[f64], f: impl Fn(f64) -> String) -> String {
    if v.len() <= 1 {
        return f(median(v));
    }
    let (lo, hi) = spread(v);
    format!("{} ({}–{})", f(median(v)), f(lo), f(hi))
}

fn ms(v: f64) -> String {
    if !v.is_finite() {
        "-".into()
    } else if v < 10.0 {
        format!("{v:.2}")
    } else if v < 100.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.0}")
    }
}

fn ratio(v: f64) -> String {
    format!("{v:.2}")
}

fn mib(kib: f64) -> String {
    format!("{:.1}", kib / 1024.0)
}

struct Row {
    w: Workload,
    noop: Vec<NoopRun>,
    idem: Vec<IdemRun>,
}

impl Row {
    fn idem_rps(&self) -> Vec<f64> {
        self.idem
            .iter()
            .map(|r| match &r.forward {
                Some(f) => f.per_sec,
                None => r.load.rps(),
            })
            .collect()
    }
    fn noop_rps(&self) -> Vec<f64> {
        self.noop.iter().map(|r| r.load.rps()).collect()
    }
    fn ratios(&self) -> Vec<f64> {
        self.idem_rps()
            .iter()
            .zip(self.noop_rps())
            .map(|(a, b)| a / b)
            .collect()
    }
}

fn print_table(rows: &[Row]) {
    println!();
    println!(
        "| workload | idemhook req/s | no-op req/s | ratio | idemhook p50 / p99 ms | no-op p50 / p99 ms | idemhook peak RSS MiB | DB bytes/event (db + wal) | rows stored = distinct events |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for row in rows {
        let idem_p50: Vec<f64> = row.idem.iter().map(|r| r.load.p(50.0)).collect();
        let idem_p99: Vec<f64> = row.idem.iter().map(|r| r.load.p(99.0)).collect();
        let noop_p50: Vec<f64> = row.noop.iter().map(|r| r.load.p(50.0)).collect();
        let noop_p99: Vec<f64> = row.noop.iter().map(|r| r.load.p(99.0)).collect();
        let rss: Vec<f64> = row
            .idem
            .iter()
            .filter_map(|r| r.rss_kib.map(|k| k as f64))
            .collect();
        let bpe: Vec<f64> = row
            .idem
            .iter()
            .map(|r| (r.db_bytes + r.wal_bytes) as f64 / r.rows.max(1) as f64)
            .collect();
        let bpe_db: Vec<f64> = row
            .idem
            .iter()
            .map(|r| r.db_bytes as f64 / r.rows.max(1) as f64)
            .collect();
        let rows_ok = row.idem.iter().filter(|r| r.rows_ok()).count();
        let texts: Vec<String> = row.idem.iter().map(IdemRun::rows_text).collect();
        let rows_cell = if texts.iter().all(|t| Some(t) == texts.first()) {
            format!(
                "{rows_ok}/{} runs ok: {}",
                row.idem.len(),
                texts.first().map_or("-", String::as_str)
            )
        } else {
            format!("{rows_ok}/{} runs ok: {}", row.idem.len(), texts.join("; "))
        };
        let name = if row.w.forward {
            format!("{} {} (idemhook: forwarded/s)", row.w.name, row.w.what)
        } else {
            format!("{} {}", row.w.name, row.w.what)
        };
        println!(
            "| {name} | {} | {} | {} | {} / {} | {} / {} | {} | {} (db file alone {}) | {} |",
            mm(&row.idem_rps(), fmt_int),
            mm(&row.noop_rps(), fmt_int),
            mm(&row.ratios(), ratio),
            ms(median(&idem_p50)),
            mm(&idem_p99, ms),
            ms(median(&noop_p50)),
            mm(&noop_p99, ms),
            mm(&rss, mib),
            fmt_int(median(&bpe)),
            fmt_int(median(&bpe_db)),
            rows_cell,
        );
    }
}

/// One line about an idemhook run: CPU per request, group size, files.
fn idem_detail(i: &IdemRun) -> String {
    let reqs = i.load.sent.max(1) as f64;
    let group = i
        .group
        .map_or("-".to_string(), |(c, o)| format!("{:.1}", o / c.max(1.0)));
    let wall = i.load.wall.as_secs_f64().max(1e-6);
    let threads: Vec<String> = i
        .cpu
        .threads
        .iter()
        .map(|(name, (run, wait))| {
            format!(
                "{} {:.0} µs/req on CPU ({:.0}% of the time), {:.0}% waiting for a CPU",
                name.trim_start_matches("idemhook-"),
                run * 1e6 / reqs,
                100.0 * run / wall,
                100.0 * wait / wall
            )
        })
        .collect();
    format!(
        "idemhook {} req/s in {:.2} s, CPU {:.0} µs/req in idemhook + {:.0} µs/req in the bench, {:.0}% of CPU time, others {:.2} cores; \
         {}; avg group {group} ops/commit; db {} + wal {} bytes; answers {:?}; incidents {}; stopped {}",
        fmt_int(i.load.rps()),
        i.load.wall.as_secs_f64(),
        i.cpu.child_s.unwrap_or(f64::NAN) * 1e6 / reqs,
        i.cpu.bench_s * 1e6 / reqs,
        100.0 * (i.cpu.child_s.unwrap_or(0.0) + i.cpu.bench_s) / (i.load.wall.as_secs_f64() * 2.0),
        i.cpu.others_cores,
        threads.join("; "),
        fmt_int(i.db_bytes as f64),
        fmt_int(i.wal_bytes as f64),
        i.load.words,
        i.incidents,
        if i.graceful { "cleanly" } else { "BY SIGKILL" },
    )
}

fn print_details(rows: &[Row]) {
    println!();
    println!(
        "Details per run (CPU is user+sys; 'others' = cores busy with other processes during the load):"
    );
    for row in rows {
        for (k, (n, i)) in row.noop.iter().zip(&row.idem).enumerate() {
            println!("  {} run {}: {}", row.w.name, k + 1, idem_detail(i));
            println!(
                "  {} run {}: no-op {} req/s in {:.2} s, CPU {:.0} µs/req in the bench (load generator + no-op server), others {:.2} cores",
                row.w.name,
                k + 1,
                fmt_int(n.load.rps()),
                n.load.wall.as_secs_f64(),
                n.cpu.bench_s * 1e6 / n.load.sent.max(1) as f64,
                n.cpu.others_cores,
            );
            if let Some(f) = &i.forward {
                println!(
                    "  {} run {}: downstream saw {} distinct keys in {} requests over {} connections; {:.0} forwarded/s; jobs {:?}{}",
                    row.w.name,
                    k + 1,
                    fmt_int(f.distinct as f64),
                    fmt_int(f.total as f64),
                    f.connections,
                    f.per_sec,
                    f.jobs,
                    if f.jobs.len() == 1 && f.jobs.get("done").copied() == Some(row.w.events as i64)
                    {
                        " (all done)"
                    } else {
                        " (NOT all done)"
                    }
                );
            }
        }
    }
}

fn print_problems(rows: &[Row]) -> bool {
    println!();
    println!(
        "Answers (every request must be answered 200 within {} s; stalls > {} s are reported):",
        ANSWER_TIMEOUT.as_secs(),
        SLOW.as_secs()
    );
    let mut all_clean = true;
    for row in rows {
        for (k, (n, i)) in row.noop.iter().zip(&row.idem).enumerate() {
            for (who, load) in [("no-op", &n.load), ("idemhook", &i.load)] {
                let p = load.problems();
                all_clean &= p == "none";
                println!("  {} run {} {who}: {p}", row.w.name, k + 1);
                for s in &load.samples {
                    println!("      {s}");
                }
            }
            if !i.graceful {
                println!("      idemhook stderr tail:\n{}", i.stderr_tail);
            }
        }
    }
    all_clean
}

fn print_targets(rows: &[Row]) {
    println!();
    println!("Targets (issue 6), on medians:");
    let find = |n: &str| rows.iter().find(|r| r.w.name == n);
    let verdict = |ok: bool| if ok { "met" } else { "NOT met" };
    if let Some(r) = find("W1") {
        let ratio = median(&r.ratios());
        let p99 = median(&r.idem.iter().map(|i| i.load.p(99.0)).collect::<Vec<_>>());
        let rss = median(
            &r.idem
                .iter()
                .filter_map(|i| i.rss_kib.map(|k| k as f64))
                .collect::<Vec<_>>(),
        ) / 1024.0;
        println!(
            "  W1 ratio >= 0.5 (aim 0.6): {ratio:.2} {}",
            verdict(ratio >= 0.5)
        );
        println!("  W1 p99 < 20 ms: {} ms {}", ms(p99), verdict(p99 < 20.0));
        println!(
            "  W1 peak RSS < 64 MiB: {rss:.1} MiB {}",
            verdict(rss < 64.0)
        );
    }
    if let Some(r) = find("W2") {
        let ratio = median(&r.ratios());
        println!("  W2 ratio >= 0.7: {ratio:.2} {}", verdict(ratio >= 0.7));
    }
    if let Some(r) = find("W3") {
        println!(
            "  W3 (report; bounded by fsync latency): {} req/s, ratio {:.2}",
            fmt_int(median(&r.idem_rps())),
            median(&r.ratios())
        );
    }
    if let Some(r) = find("W4") {
        let f = median(&r.idem_rps());
        println!(
            "  W4 >= 5,000 forwarded/s: {} {}",
            fmt_int(f),
            verdict(f >= 5000.0)
        );
    }
}

// ---------------------------------------------------------------------------
// Growth

struct GrowthResult {
    name: String,
    runs: Vec<IdemRun>,
    note: String,
}

fn run_growth(
    opts: &Opts,
    w1: &Workload,
    empty_w1: &[f64],
    hz: f64,
    seed: u64,
) -> Vec<GrowthResult> {
    let mut out = Vec::new();
    let work = match tempfile::Builder::new()
        .prefix("idemhook-bench-growth-")
        .tempdir()
    {
        Ok(d) => d,
        Err(e) => {
            println!("growth: cannot create a temp dir: {e}");
            return out;
        }
    };
    let day = 86_400_000;
    let now = now_ms();
    let mut cases: Vec<(&str, u64, bool)> = Vec::new();
    if opts.wants("G1M") {
        cases.push(("G1M", 1_000_000, false));
    }
    if opts.growth_10m && opts.wants("G10M") {
        cases.push(("G10M", 10_000_000, false));
    }
    if opts.wants("GPRUNE") {
        cases.push(("GPRUNE", 1_000_000, true));
    }
    for (name, n, prune) in cases {
        let n = opts.scaled(n as usize) as u64;
        let template = work.path().join(format!("{name}.db"));
        // Stored events: within the key retention (7 d for stripe), so
        // nothing of them is due for pruning; for the prune case, far past
        // a 7 d retention, so all of them are.
        let (from, to) = if prune {
            (now - 60 * day, now - 30 * day)
        } else {
            (now - 6 * day - day / 2, now - day / 12)
        };
        println!(
            "  {name}: prefilling {} events (payload NULL, as if payload_retention had pruned them)",
            fmt_int(n as f64)
        );
        let t = Instant::now();
        if let Err(e) = prefill(&template, n, from, to, seed ^ 0x5EED) {
            println!("  {name}: prefill failed: {e}");
            continue;
        }
        let size = file_len(&template);
        println!(
            "  {name}: prefilled in {:.0} s, {} bytes ({:.0} bytes/event)",
            t.elapsed().as_secs_f64(),
            fmt_int(size as f64),
            size as f64 / n as f64
        );
        let setup = Setup {
            template: Some(template.clone()),
            retention: prune.then_some("7d"),
            prune,
        };
        if prune && let Err(why) = prune_available(work.path()) {
            println!("  {name}: skipped: prune not available ({why})");
            out.push(GrowthResult {
                name: format!("W1 during prune of {} events", fmt_int(n as f64)),
                runs: Vec::new(),
                note: format!("skipped: prune not available ({why})"),
            });
            let _ = std::fs::remove_file(&template);
            continue;
        }
        let mut runs = Vec::new();
        for run in 1..=opts.runs {
            let reqs = build_requests(w1, seed ^ (run as u64 * 7919) ^ n);
            let label = format!("{name}-run{run}");
            match run_idemhook(&reqs, w1, &setup, opts, hz, &label) {
                Ok(r) => {
                    println!(
                        "    {name} run {run}: {} req/s, p50 {} ms, p99 {} ms, rows {}, problems: {}{}",
                        fmt_int(r.load.rps()),
                        ms(r.load.p(50.0)),
                        ms(r.load.p(99.0)),
                        r.rows_text(),
                        r.load.problems(),
                        r.prune.as_ref().map_or(String::new(), |p| format!("; {p}"))
                    );
                    println!("      {}", idem_detail(&r));
                    runs.push(r);
                }
                Err(e) => println!("    {name} run {run}: FAILED: {e}"),
            }
        }
        let _ = std::fs::remove_file(&template);
        let rps: Vec<f64> = runs.iter().map(|r| r.load.rps()).collect();
        let vs_empty = median(&rps) / median(empty_w1);
        out.push(GrowthResult {
            name: if prune {
                format!(
                    "W1 during `idemhook prune` of {} events (retention 7d)",
                    fmt_int(n as f64)
                )
            } else {
                format!("W1 on {} stored events", fmt_int(n as f64))
            },
            runs,
            note: format!("{vs_empty:.2} of W1 on an empty database"),
        });
    }
    out
}

/// `prune --dry-run` against a copy of the prefilled database: Err when the
/// verb is not built yet (or fails).
fn prune_available(work: &Path) -> Result<(), String> {
    let dir = work.join("prune-check");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    // An empty database with the schema is enough to ask the verb.
    let db = dir.join("idemhook.db");
    prefill(
        &db,
        10,
        now_ms() - 40 * 86_400_000,
        now_ms() - 35 * 86_400_000,
        1,
    )
    .map_err(|e| e.to_string())?;
    std::fs::write(
        dir.join("idemhook.toml"),
        idemhook_config(HTTP_WORKERS, None, Some("7d")),
    )
    .map_err(|e| e.to_string())?;
    let mut child = Command::new(idemhook_binary())
        .arg("prune")
        .arg("--dry-run")
        .arg("--config")
        .arg(dir.join("idemhook.toml"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err("prune --dry-run did not finish in 60 s".into());
            }
        }
    };
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    let _ = std::fs::remove_dir_all(&dir);
    if status.success() {
        Ok(())
    } else {
        Err(format!(
            "`idemhook prune --dry-run` exited {status}: {}",
            err.trim().lines().last().unwrap_or("")
        ))
    }
}

fn print_growth(results: &[GrowthResult], empty_w1: &[f64]) {
    println!();
    println!(
        "Growth (W1 against a pre-filled database; prefilled events have payload NULL, as if payload_retention had pruned them; W1 on an empty database: {} req/s):",
        fmt_int(median(empty_w1))
    );
    println!(
        "| case | idemhook req/s | vs empty | p50 / p99 ms | peak RSS MiB | DB bytes after | rows = distinct events |"
    );
    println!("|---|---|---|---|---|---|---|");
    for g in results {
        if g.runs.is_empty() {
            println!("| {} | {} | | | | | |", g.name, g.note);
            continue;
        }
        let rps: Vec<f64> = g.runs.iter().map(|r| r.load.rps()).collect();
        let p50: Vec<f64> = g.runs.iter().map(|r| r.load.p(50.0)).collect();
        let p99: Vec<f64> = g.runs.iter().map(|r| r.load.p(99.0)).collect();
        let rss: Vec<f64> = g
            .runs
            .iter()
            .filter_map(|r| r.rss_kib.map(|k| k as f64))
            .collect();
        let size: Vec<f64> = g
            .runs
            .iter()
            .map(|r| (r.db_bytes + r.wal_bytes) as f64)
            .collect();
        println!(
            "| {} | {} | {} | {} / {} | {} | {} | {} |",
            g.name,
            mm(&rps, fmt_int),
            g.note,
            ms(median(&p50)),
            mm(&p99, ms),
            mm(&rss, mib),
            fmt_int(median(&size)),
            g.runs
                .iter()
                .map(IdemRun::rows_text)
                .collect::<Vec<_>>()
                .join("; ")
        );
    }
    for g in results {
        for (k, r) in g.runs.iter().enumerate() {
            if let Some(p) = &r.prune {
                println!("  {} run {}: {p}", g.name, k + 1);
            }
            if !r.load.clean() {
                println!("  {} run {}: answers: {}", g.name, k + 1, r.load.problems());
            }
        }
    }
}

// ---------------------------------------------------------------------------

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

    println!("idemhook throughput benchmark (issue 6)");
    println!(
        "command:  cargo bench --bench bench{}{}",
        if user_args.is_empty() { "" } else { " -- " },
        user_args.join(" ")
    );
    println!("date:     {}", date());
    println!("machine:  {}", machine());
    println!("load avg: {} (1/5/15 min) at the start", loadavg());
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
        return bench_pg::run(&opts);
    }

    let mut rows = Vec::new();
    for w in workloads(&opts) {
        if !opts.wants(w.name) {
            continue;
        }
        let mut row = Row {
            w: w.clone(),
            noop: Vec::new(),
            idem: Vec::new(),
        };
        for run in 1..=opts.runs {
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
            let noop = match run_noop(&reqs, &w, hz) {
                Ok(n) => n,
                Err(e) => {
                    println!("  run {run}: no-op server failed: {e}");
                    continue;
                }
            };
            let label = format!("{}-run{run}", w.name);
            let idem = match run_idemhook(&reqs, &w, &Setup::default(), &opts, hz, &label) {
                Ok(i) => i,
                Err(e) => {
                    println!("  run {run}: idemhook failed: {e}");
                    continue;
                }
            };
            let fwd = idem
                .forward
                .as_ref()
                .map_or(String::new(), |f| format!(", {:.0} forwarded/s", f.per_sec));
            println!(
                "  run {run}: no-op {} req/s (p50 {} p99 {} ms) | idemhook {} req/s{fwd} (p50 {} p99 {} ms), rows {} | problems: no-op {}; idemhook {}",
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
        rows.push(row);
    }

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
        let w1 = workloads(&opts)
            .into_iter()
            .find(|w| w.name == "W1")
            .expect("W1 exists");
        let mut empty: Vec<f64> = rows
            .iter()
            .find(|r| r.w.name == "W1")
            .map(|r| r.idem_rps())
            .unwrap_or_default();
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
