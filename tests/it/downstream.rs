//! A fake downstream for forwarded events: a real HTTP/1.1 server on
//! 127.0.0.1:0 (std `TcpListener`, one thread per connection, keep-alive).
//!
//! It behaves like a careful downstream that honours `Idempotency-Key`: the
//! first successful processing of a key is an *effect*; a repeat of a
//! processed key answers 200 without a new effect. A request without the
//! header is a new effect every time. Every request is recorded with its
//! headers and exact body bytes. Per key, a test can script misbehaviour
//! (fail with 500, process then drop the connection, hang, 400, 429).
//! Every answer carries a unique `X-Request-Id` (recorded with the request),
//! and a test can hold all requests at a gate or slow every request down.
//!
//! It also serves a check endpoint, `GET /effects/{key}` (the key
//! URL-encoded): 200 when the key has had an effect, 404 when not,
//! scriptable per key to answer 500 or hang ([`CheckBehavior`]). Started
//! with [`Downstream::start_without_dedupe`] it is a downstream that cannot
//! dedupe: every processed request is an effect, repeats of a key too, so
//! its per-key count shows a second send.
//!
//! Owns no knowledge of idemhook beyond the names of the headers a
//! forwarded request carries (`Idempotency-Key`, `X-Idemhook-*`).

#![allow(dead_code)] // not every test module uses every helper

use std::collections::{HashMap, VecDeque};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One scripted step for a key. Steps queue up in the order they were
/// scripted; each request for the key consumes one unit of the front step.
/// When the queue is empty the key is processed normally.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Behavior {
    /// Answer 500 (no effect), this many times.
    Fail500(u32),
    /// Process the request (the effect counts, if it is the first) and close
    /// the connection without answering, this many times.
    ProcessThenDrop(u32),
    /// Hold the request without answering for this long, then close the
    /// connection without processing it (no effect). One request.
    Hang(Duration),
    /// Answer 400 (no effect) to every request from now on.
    Reject400,
    /// Answer 429 with `Retry-After: retry_after_secs` (no effect), this many times.
    TooMany { retry_after_secs: u64, times: u32 },
    /// Process the request (the effect counts), then hold the answer for
    /// this long and close the connection without answering. One request.
    ProcessThenHang(Duration),
}

/// One scripted step for checks (`GET /effects/{key}`) of a key; queued
/// like [`Behavior`]. When none is left the check answers from the effects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CheckBehavior {
    /// Answer 500, this many times.
    Fail500(u32),
    /// Hold the check this long, then close without answering. One check.
    Hang(Duration),
}

/// What the downstream did with a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// First processing of the key: 200 and an effect.
    Effect,
    /// Key already processed: 200, no new effect.
    Repeat,
    /// Processed (effect if first), connection dropped without an answer.
    ProcessedThenDropped {
        new_effect: bool,
    },
    Failed500,
    Hung,
    Rejected400,
    TooMany {
        retry_after_secs: u64,
    },
    /// Processed (effect if first, or always without dedupe), then held
    /// and dropped without an answer.
    ProcessedThenHung {
        new_effect: bool,
    },
    /// A check answered 200 (found) or 404 (not found).
    Checked {
        found: bool,
    },
    CheckFailed500,
    CheckHung,
    /// The downstream was down ([`Downstream::set_down`]): 503, no effect.
    Down503,
    /// `GET /healthz` while up: 200.
    Healthy,
}

/// One request as received.
#[derive(Clone, Debug)]
pub struct RecordedRequest {
    pub method: String,
    pub path: String,
    /// Header names as sent (case kept), in order.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// When the request was fully read, relative to `Downstream::start`.
    pub at: Duration,
    pub outcome: Outcome,
    /// The `X-Request-Id` sent with the answer (`ds-N`; also set when no
    /// answer was written).
    pub request_id: String,
}

impl RecordedRequest {
    /// First value of a header, case-insensitive.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn idempotency_key(&self) -> Option<&str> {
        self.header("Idempotency-Key")
    }

    /// A request to the check endpoint (not a forward).
    pub fn is_check(&self) -> bool {
        self.method == "GET" && self.path.starts_with("/effects/")
    }
}

#[derive(Default)]
struct State {
    scripts: HashMap<String, VecDeque<Behavior>>,
    check_scripts: HashMap<String, VecDeque<CheckBehavior>>,
    /// Keys processed at least once, with the number of effects (1 unless
    /// the downstream does not dedupe).
    effects: HashMap<String, u64>,
    /// Requests without an Idempotency-Key that were processed.
    keyless_effects: u64,
    requests: Vec<RecordedRequest>,
}

struct Shared {
    state: Mutex<State>,
    shutdown: AtomicBool,
    started: Instant,
    /// While set, requests wait (read, not yet decided) until it clears.
    gate_closed: AtomicBool,
    /// Requests waiting at the gate right now.
    held: AtomicUsize,
    /// Requests that passed the gate so far (0 while none was held).
    released: AtomicUsize,
    /// Added before deciding every request, in milliseconds.
    delay_ms: AtomicU64,
    /// Source of `X-Request-Id` values.
    next_request_id: AtomicU64,
    /// Requests read and not yet answered, and the most there ever were.
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    /// False: every processed request is an effect, repeats too.
    dedupe: bool,
    /// While set, the downstream is down: every request (forwards, checks,
    /// `GET /healthz`) answers 503 with no effect.
    down: AtomicBool,
}

/// The running fake downstream. Stops accepting on drop.
pub struct Downstream {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

/// A request parsed off the wire.
struct WireRequest {
    method: String,
    path: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    keep_alive: bool,
}

impl Downstream {
    pub fn start() -> Downstream {
        Downstream::start_with(true)
    }

    /// A downstream that cannot dedupe by `Idempotency-Key`: every
    /// processed request is a new effect (`effects(key)` counts them).
    pub fn start_without_dedupe() -> Downstream {
        Downstream::start_with(false)
    }

    fn start_with(dedupe: bool) -> Downstream {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind downstream");
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            shutdown: AtomicBool::new(false),
            started: Instant::now(),
            gate_closed: AtomicBool::new(false),
            held: AtomicUsize::new(0),
            released: AtomicUsize::new(0),
            delay_ms: AtomicU64::new(0),
            next_request_id: AtomicU64::new(1),
            in_flight: AtomicUsize::new(0),
            max_in_flight: AtomicUsize::new(0),
            dedupe,
            down: AtomicBool::new(false),
        });
        let accept_shared = Arc::clone(&shared);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if accept_shared.shutdown.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(stream) = stream else { continue };
                let conn_shared = Arc::clone(&accept_shared);
                std::thread::spawn(move || serve_connection(stream, conn_shared));
            }
        });
        Downstream { addr, shared }
    }

    /// `http://127.0.0.1:PORT` (append any path: every path is served alike).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Queue a behaviour for requests carrying `Idempotency-Key: key`.
    pub fn script(&self, key: &str, behavior: Behavior) {
        let mut state = self.shared.state.lock().unwrap();
        state
            .scripts
            .entry(key.to_string())
            .or_default()
            .push_back(behavior);
    }

    /// Queue a behaviour for checks (`GET /effects/{key}`) of `key`.
    pub fn script_check(&self, key: &str, behavior: CheckBehavior) {
        let mut state = self.shared.state.lock().unwrap();
        state
            .check_scripts
            .entry(key.to_string())
            .or_default()
            .push_back(behavior);
    }

    /// `http://127.0.0.1:PORT/effects/{idempotency_key}`: a `check` template.
    pub fn check_template(&self) -> String {
        format!("{}/effects/{{idempotency_key}}", self.url())
    }

    /// Forwards (not checks) carrying `Idempotency-Key: key`.
    pub fn posts_for(&self, key: &str) -> Vec<RecordedRequest> {
        self.requests_for(key)
            .into_iter()
            .filter(|r| !r.is_check())
            .collect()
    }

    /// Checks asked for `key`.
    pub fn checks_for(&self, key: &str) -> Vec<RecordedRequest> {
        self.requests_for(key)
            .into_iter()
            .filter(RecordedRequest::is_check)
            .collect()
    }

    /// Effects for `key`: 0 or 1 (a repeat is not a new effect), or every
    /// processing of it without dedupe.
    pub fn effects(&self, key: &str) -> u64 {
        self.shared
            .state
            .lock()
            .unwrap()
            .effects
            .get(key)
            .copied()
            .unwrap_or(0)
    }

    /// All effects: keyed ones plus every processed request without a key.
    pub fn total_effects(&self) -> u64 {
        let state = self.shared.state.lock().unwrap();
        state.effects.values().sum::<u64>() + state.keyless_effects
    }

    /// Requests without an `Idempotency-Key` that were processed.
    pub fn keyless_effects(&self) -> u64 {
        self.shared.state.lock().unwrap().keyless_effects
    }

    /// Every request so far, in arrival order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.shared.state.lock().unwrap().requests.clone()
    }

    /// Requests carrying `Idempotency-Key: key`, in arrival order.
    pub fn requests_for(&self, key: &str) -> Vec<RecordedRequest> {
        self.shared
            .state
            .lock()
            .unwrap()
            .requests
            .iter()
            .filter(|r| r.idempotency_key() == Some(key))
            .cloned()
            .collect()
    }

    /// Number of requests so far.
    pub fn request_count(&self) -> usize {
        self.shared.state.lock().unwrap().requests.len()
    }

    /// Distinct keys that had an effect.
    pub fn effect_keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self
            .shared
            .state
            .lock()
            .unwrap()
            .effects
            .keys()
            .cloned()
            .collect();
        keys.sort();
        keys
    }
}

impl Downstream {
    /// Close the gate: from now on every request, once read, waits (before
    /// any decision or effect) until [`Downstream::open_gate`].
    pub fn close_gate(&self) {
        self.shared.gate_closed.store(true, Ordering::SeqCst);
    }

    /// Open the gate: held requests proceed in the normal way.
    pub fn open_gate(&self) {
        self.shared.gate_closed.store(false, Ordering::SeqCst);
    }

    /// Requests waiting at the gate right now.
    pub fn held(&self) -> usize {
        self.shared.held.load(Ordering::SeqCst)
    }

    /// Requests that waited at the gate and went on since the start.
    pub fn released(&self) -> usize {
        self.shared.released.load(Ordering::SeqCst)
    }

    /// Slow every request down by `delay` before it is decided (a slow but
    /// healthy downstream). `Duration::ZERO` turns it off.
    /// The most requests it was handling at once (read, not yet answered).
    pub fn max_in_flight(&self) -> usize {
        self.shared.max_in_flight.load(Ordering::SeqCst)
    }

    pub fn set_delay(&self, delay: Duration) {
        self.shared
            .delay_ms
            .store(delay.as_millis() as u64, Ordering::SeqCst);
    }

    /// Take the whole downstream down (`true`: every request answers 503,
    /// `GET /healthz` too) or bring it back up (`GET /healthz` answers 200).
    pub fn set_down(&self, down: bool) {
        self.shared.down.store(down, Ordering::SeqCst);
    }

    /// Start counting [`Downstream::max_in_flight`] afresh from the
    /// requests under way now.
    pub fn reset_max_in_flight(&self) {
        let now = self.shared.in_flight.load(Ordering::SeqCst);
        self.shared.max_in_flight.store(now, Ordering::SeqCst);
    }

    /// The `GET /healthz` requests received so far.
    pub fn health_checks(&self) -> usize {
        self.requests()
            .iter()
            .filter(|r| r.method == "GET" && r.path == "/healthz")
            .count()
    }

    /// Drop the remaining scripted steps for `key` (e.g. end a `Reject400`).
    pub fn clear_script(&self, key: &str) {
        self.shared.state.lock().unwrap().scripts.remove(key);
    }
}

impl Drop for Downstream {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
    }
}

/// One request between being read and being answered, counted.
struct InFlight<'s>(&'s Shared);

impl<'s> InFlight<'s> {
    fn enter(shared: &'s Shared) -> InFlight<'s> {
        let now = shared.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        shared.max_in_flight.fetch_max(now, Ordering::SeqCst);
        InFlight(shared)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

fn serve_connection(stream: TcpStream, shared: Arc<Shared>) {
    let _ = stream.set_nodelay(true);
    let mut writer = match stream.try_clone() {
        Ok(w) => w,
        Err(_) => return,
    };
    // Short read timeout so idle keep-alive connections notice shutdown.
    let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
    let mut reader = BufReader::new(stream);
    loop {
        let request = match read_request(&mut reader, &shared) {
            Some(r) => r,
            None => return,
        };
        let keep_alive = request.keep_alive;
        let _flight = InFlight::enter(&shared);
        wait_at_gate(&shared);
        let delay = shared.delay_ms.load(Ordering::SeqCst);
        if delay > 0 {
            std::thread::sleep(Duration::from_millis(delay));
        }
        let request_id = format!(
            "ds-{}",
            shared.next_request_id.fetch_add(1, Ordering::SeqCst)
        );
        let rid: &[(&str, &str)] = &[("X-Request-Id", request_id.as_str())];
        let key = request
            .headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("Idempotency-Key"))
            .map(|(_, v)| v.clone());

        // Decide and apply under one lock, so concurrent repeats of a key
        // resolve to exactly one effect.
        let (outcome, hang) = {
            let mut state = shared.state.lock().unwrap();
            let check_key = (request.method == "GET")
                .then(|| request.path.strip_prefix("/effects/"))
                .flatten()
                .map(percent_decode);
            let health = request.method == "GET" && request.path == "/healthz";
            let (outcome, hang) = if shared.down.load(Ordering::SeqCst) {
                (Outcome::Down503, None)
            } else if health {
                (Outcome::Healthy, None)
            } else if let Some(k) = check_key {
                match next_check_step(&mut state, &k) {
                    Some(CheckBehavior::Fail500(_)) => (Outcome::CheckFailed500, None),
                    Some(CheckBehavior::Hang(d)) => (Outcome::CheckHung, Some(d)),
                    None => (
                        Outcome::Checked {
                            found: state.effects.get(&k).is_some_and(|n| *n > 0),
                        },
                        None,
                    ),
                }
            } else {
                let step = key.as_ref().and_then(|k| next_step(&mut state, k));
                decide(&mut state, step, key.as_deref(), shared.dedupe)
            };
            state.requests.push(RecordedRequest {
                method: request.method.clone(),
                path: request.path.clone(),
                headers: request.headers.clone(),
                body: request.body.clone(),
                at: shared.started.elapsed(),
                outcome: outcome.clone(),
                request_id: request_id.clone(),
            });
            (outcome, hang)
        };

        let written = match outcome {
            Outcome::Effect => respond(&mut writer, 200, "OK", rid, br#"{"ok":true}"#, keep_alive),
            Outcome::Repeat => respond(
                &mut writer,
                200,
                "OK",
                rid,
                br#"{"ok":true,"repeat":true}"#,
                keep_alive,
            ),
            Outcome::Failed500 => respond(
                &mut writer,
                500,
                "Internal Server Error",
                rid,
                br#"{"error":"scripted 500"}"#,
                keep_alive,
            ),
            Outcome::Rejected400 => respond(
                &mut writer,
                400,
                "Bad Request",
                rid,
                br#"{"error":"scripted 400"}"#,
                keep_alive,
            ),
            Outcome::TooMany { retry_after_secs } => {
                let secs = retry_after_secs.to_string();
                respond(
                    &mut writer,
                    429,
                    "Too Many Requests",
                    &[("Retry-After", secs.as_str()), rid[0]],
                    br#"{"error":"scripted 429"}"#,
                    keep_alive,
                )
            }
            Outcome::Checked { found } => {
                let (code, reason, body): (u16, &str, &[u8]) = if found {
                    (200, "OK", br#"{"done":true}"#)
                } else {
                    (404, "Not Found", br#"{"done":false}"#)
                };
                respond(&mut writer, code, reason, rid, body, keep_alive)
            }
            Outcome::CheckFailed500 => respond(
                &mut writer,
                500,
                "Internal Server Error",
                rid,
                br#"{"error":"scripted check 500"}"#,
                keep_alive,
            ),
            Outcome::Down503 => respond(
                &mut writer,
                503,
                "Service Unavailable",
                rid,
                br#"{"error":"down"}"#,
                keep_alive,
            ),
            Outcome::Healthy => respond(&mut writer, 200, "OK", rid, br#"{"up":true}"#, keep_alive),
            Outcome::ProcessedThenDropped { .. } => false,
            Outcome::Hung | Outcome::CheckHung | Outcome::ProcessedThenHung { .. } => {
                let until = Instant::now() + hang.unwrap_or_default();
                while Instant::now() < until && !shared.shutdown.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(20));
                }
                false
            }
        };
        if !written || !keep_alive {
            let _ = writer.shutdown(std::net::Shutdown::Both);
            return;
        }
    }
}

/// What a forward does, given the scripted step for its key.
fn decide(
    state: &mut State,
    step: Option<Behavior>,
    key: Option<&str>,
    dedupe: bool,
) -> (Outcome, Option<Duration>) {
    match step {
        Some(Behavior::Fail500(_)) => (Outcome::Failed500, None),
        Some(Behavior::Hang(d)) => (Outcome::Hung, Some(d)),
        Some(Behavior::Reject400) => (Outcome::Rejected400, None),
        Some(Behavior::TooMany {
            retry_after_secs, ..
        }) => (Outcome::TooMany { retry_after_secs }, None),
        Some(Behavior::ProcessThenDrop(_)) => {
            let new_effect = process(state, key, dedupe);
            (Outcome::ProcessedThenDropped { new_effect }, None)
        }
        Some(Behavior::ProcessThenHang(d)) => {
            let new_effect = process(state, key, dedupe);
            (Outcome::ProcessedThenHung { new_effect }, Some(d))
        }
        None => {
            if process(state, key, dedupe) {
                (Outcome::Effect, None)
            } else {
                (Outcome::Repeat, None)
            }
        }
    }
}

/// Consume one unit of the front check step for `key`.
fn next_check_step(state: &mut State, key: &str) -> Option<CheckBehavior> {
    let queue = state.check_scripts.get_mut(key)?;
    loop {
        let front = queue.front_mut()?;
        let (apply, exhausted) = match front {
            CheckBehavior::Fail500(n) => {
                if *n == 0 {
                    (false, true)
                } else {
                    *n -= 1;
                    (true, *n == 0)
                }
            }
            CheckBehavior::Hang(_) => (true, true),
        };
        let step = front.clone();
        if exhausted {
            queue.pop_front();
        }
        if apply {
            return Some(step);
        }
    }
}

/// `%XX` decoded (the check endpoint's key); undecodable bytes kept as is.
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = (bytes[i] == b'%')
            .then(|| bytes.get(i + 1..i + 3))
            .flatten()
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match hex {
            Some(b) => {
                out.push(b);
                i += 3;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Wait while the gate is closed (or until shutdown), counting the request
/// as held meanwhile.
fn wait_at_gate(shared: &Shared) {
    if !shared.gate_closed.load(Ordering::SeqCst) {
        return;
    }
    shared.held.fetch_add(1, Ordering::SeqCst);
    while shared.gate_closed.load(Ordering::SeqCst) && !shared.shutdown.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(5));
    }
    shared.held.fetch_sub(1, Ordering::SeqCst);
    shared.released.fetch_add(1, Ordering::SeqCst);
}

/// Consume one unit of the front step for `key`, returning the behaviour to
/// apply (None: process normally).
fn next_step(state: &mut State, key: &str) -> Option<Behavior> {
    let queue = state.scripts.get_mut(key)?;
    loop {
        let front = queue.front_mut()?;
        let (apply, exhausted) = match front {
            Behavior::Fail500(n)
            | Behavior::ProcessThenDrop(n)
            | Behavior::TooMany { times: n, .. } => {
                if *n == 0 {
                    (false, true)
                } else {
                    *n -= 1;
                    (true, *n == 0)
                }
            }
            Behavior::Hang(_) | Behavior::ProcessThenHang(_) => (true, true),
            Behavior::Reject400 => (true, false),
        };
        let step = front.clone();
        if exhausted {
            queue.pop_front();
        }
        if apply {
            return Some(step);
        }
    }
}

/// Record processing; true when it is a new effect (a repeat of a key is
/// one only without dedupe).
fn process(state: &mut State, key: Option<&str>, dedupe: bool) -> bool {
    match key {
        None => {
            state.keyless_effects += 1;
            true
        }
        Some(k) => {
            let n = state.effects.entry(k.to_string()).or_insert(0);
            if *n > 0 && dedupe {
                false
            } else {
                *n += 1;
                true
            }
        }
    }
}

fn respond(
    w: &mut TcpStream,
    code: u16,
    reason: &str,
    extra: &[(&str, &str)],
    body: &[u8],
    keep_alive: bool,
) -> bool {
    let mut out = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in extra {
        out.push_str(&format!("{k}: {v}\r\n"));
    }
    out.push_str(if keep_alive {
        "Connection: keep-alive\r\n\r\n"
    } else {
        "Connection: close\r\n\r\n"
    });
    let mut bytes = out.into_bytes();
    bytes.extend_from_slice(body);
    w.write_all(&bytes).and_then(|_| w.flush()).is_ok()
}

/// Read one request; None on EOF, error, shutdown or malformed input.
fn read_request(reader: &mut BufReader<TcpStream>, shared: &Shared) -> Option<WireRequest> {
    let request_line = read_line(reader, shared)?;
    let mut parts = request_line.split_whitespace();
    let method = parts.next()?.to_string();
    let path = parts.next()?.to_string();
    let version = parts.next().unwrap_or("HTTP/1.1").to_string();
    let mut headers = Vec::new();
    loop {
        let line = read_line(reader, shared)?;
        if line.is_empty() {
            break;
        }
        let (k, v) = line.split_once(':')?;
        headers.push((k.trim().to_string(), v.trim().to_string()));
    }
    let get = |name: &str| {
        headers
            .iter()
            .find(|(k, _): &&(String, String)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
    };
    let chunked =
        get("Transfer-Encoding").is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
    let body = if chunked {
        read_chunked(reader, shared)?
    } else {
        let len: usize = get("Content-Length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        read_exact(reader, len, shared)?
    };
    let connection = get("Connection").map(|v| v.to_ascii_lowercase());
    let keep_alive = match connection.as_deref() {
        Some(v) if v.contains("close") => false,
        Some(v) if v.contains("keep-alive") => true,
        _ => version != "HTTP/1.0",
    };
    Some(WireRequest {
        method,
        path,
        headers,
        body,
        keep_alive,
    })
}

fn read_line(reader: &mut BufReader<TcpStream>, shared: &Shared) -> Option<String> {
    let mut line = Vec::new();
    loop {
        match reader.read_until(b'\n', &mut line) {
            Ok(0) => return None,
            Ok(_) => {
                if line.ends_with(b"\n") {
                    break;
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                if shared.shutdown.load(Ordering::SeqCst) {
                    return None;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
        if line.len() > 64 * 1024 {
            return None;
        }
    }
    while line.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
        line.pop();
    }
    Some(String::from_utf8_lossy(&line).into_owned())
}

fn read_exact(reader: &mut BufReader<TcpStream>, len: usize, shared: &Shared) -> Option<Vec<u8>> {
    let mut body = vec![0u8; len];
    let mut filled = 0;
    while filled < len {
        match reader.read(&mut body[filled..]) {
            Ok(0) => return None,
            Ok(n) => filled += n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                if shared.shutdown.load(Ordering::SeqCst) {
                    return None;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    Some(body)
}

fn read_chunked(reader: &mut BufReader<TcpStream>, shared: &Shared) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let size_line = read_line(reader, shared)?;
        let size_hex = size_line.split(';').next()?.trim();
        let size = usize::from_str_radix(size_hex, 16).ok()?;
        if size == 0 {
            // Trailers until an empty line.
            loop {
                if read_line(reader, shared)?.is_empty() {
                    return Some(body);
                }
            }
        }
        body.extend_from_slice(&read_exact(reader, size, shared)?);
        let _crlf = read_line(reader, shared)?;
    }
}

// Self-tests: these exercise the fake without the binary.
#[cfg(test)]
mod self_test {
    use super::*;
    use crate::harness::{Client, headers};

    fn key_headers(key: &str) -> Vec<(String, String)> {
        headers(&[
            ("Idempotency-Key", key),
            ("Content-Type", "application/json"),
        ])
    }

    #[test]
    fn repeats_of_a_key_are_one_effect_and_bodies_are_recorded_exactly() {
        let ds = Downstream::start();
        let client = Client::new(Duration::from_secs(5));
        let body = b"{\"a\":1}\n\x00\xff";
        for _ in 0..3 {
            let r = client.post(&format!("{}/hook", ds.url()), &key_headers("k1"), body);
            assert_eq!(r.status, 200, "expected 200, got {} {}", r.status, r.text());
        }
        client.post(&format!("{}/hook", ds.url()), &headers(&[]), b"x");
        assert_eq!(ds.effects("k1"), 1);
        assert_eq!(ds.total_effects(), 2, "one keyed effect plus one keyless");
        let reqs = ds.requests_for("k1");
        assert_eq!(reqs.len(), 3);
        assert_eq!(reqs[0].body, body.to_vec());
        assert_eq!(reqs[0].path, "/hook");
        assert_eq!(reqs[0].outcome, Outcome::Effect);
        assert_eq!(reqs[1].outcome, Outcome::Repeat);
    }

    #[test]
    fn scripted_steps_run_in_order_then_normal_processing() {
        let ds = Downstream::start();
        ds.script("k", Behavior::Fail500(2));
        ds.script(
            "k",
            Behavior::TooMany {
                retry_after_secs: 7,
                times: 1,
            },
        );
        ds.script("k", Behavior::ProcessThenDrop(1));
        let client = Client::new(Duration::from_secs(5));
        let url = format!("{}/x", ds.url());
        assert_eq!(client.post(&url, &key_headers("k"), b"1").status, 500);
        assert_eq!(client.post(&url, &key_headers("k"), b"1").status, 500);
        let r = client.post(&url, &key_headers("k"), b"1");
        assert_eq!((r.status, r.header("retry-after")), (429, Some("7")));
        assert_eq!(ds.effects("k"), 0, "no effect before the drop step");
        assert!(
            client.try_post(&url, &key_headers("k"), b"1").is_err(),
            "expected a dropped connection"
        );
        assert_eq!(ds.effects("k"), 1, "the dropped request was processed");
        let r = client.post(&url, &key_headers("k"), b"1");
        assert_eq!(r.status, 200);
        assert_eq!(ds.effects("k"), 1, "a repeat is not a new effect");
        assert_eq!(ds.total_effects(), 1);
        let outcomes: Vec<Outcome> = ds
            .requests_for("k")
            .into_iter()
            .map(|r| r.outcome)
            .collect();
        assert_eq!(
            outcomes,
            vec![
                Outcome::Failed500,
                Outcome::Failed500,
                Outcome::TooMany {
                    retry_after_secs: 7
                },
                Outcome::ProcessedThenDropped { new_effect: true },
                Outcome::Repeat
            ]
        );
    }

    #[test]
    fn hang_outlasts_a_client_timeout_and_reject_is_permanent() {
        let ds = Downstream::start();
        ds.script("h", Behavior::Hang(Duration::from_secs(3)));
        ds.script("r", Behavior::Reject400);
        let client = Client::new(Duration::from_millis(500));
        let url = format!("{}/x", ds.url());
        let started = Instant::now();
        assert!(
            client.try_post(&url, &key_headers("h"), b"1").is_err(),
            "expected a timeout"
        );
        assert!(started.elapsed() < Duration::from_secs(2));
        assert_eq!(ds.effects("h"), 0);
        assert_eq!(
            client.post(&url, &key_headers("h"), b"1").status,
            200,
            "hang is one request"
        );
        for _ in 0..2 {
            assert_eq!(client.post(&url, &key_headers("r"), b"1").status, 400);
        }
        assert_eq!(ds.effects("r"), 0);
    }

    #[test]
    fn the_check_endpoint_answers_from_the_effects_and_without_dedupe_every_send_counts() {
        let ds = Downstream::start_without_dedupe();
        let client = Client::new(Duration::from_secs(5));
        let key = "s:evt/1:a";
        let check_url = format!("{}/effects/s%3Aevt%2F1%3Aa", ds.url());
        let check = |client: &Client| client.get(&check_url).status;
        assert_eq!(check(&client), 404, "no effect yet");
        let url = format!("{}/x", ds.url());
        for _ in 0..2 {
            assert_eq!(client.post(&url, &key_headers(key), b"1").status, 200);
        }
        assert_eq!(ds.effects(key), 2, "without dedupe a repeat is an effect");
        assert_eq!(check(&client), 200);
        ds.script_check(key, CheckBehavior::Fail500(1));
        ds.script_check(key, CheckBehavior::Hang(Duration::from_secs(3)));
        assert_eq!(check(&client), 500);
        let short = Client::new(Duration::from_millis(300));
        assert!(short.try_get(&check_url).is_err(), "expected a hung check");
        assert_eq!(check(&client), 200, "scripts used up");
        assert_eq!(ds.posts_for(key).len(), 2);
        ds.script(key, Behavior::ProcessThenHang(Duration::from_secs(3)));
        assert!(short.try_post(&url, &key_headers(key), b"1").is_err());
        assert_eq!(ds.effects(key), 3, "processed before the hang");
        // Checks are recorded but carry no key header here: counted by path.
        let checks = ds
            .requests()
            .into_iter()
            .filter(RecordedRequest::is_check)
            .map(|r| r.outcome)
            .collect::<Vec<_>>();
        assert_eq!(
            checks,
            vec![
                Outcome::Checked { found: false },
                Outcome::Checked { found: true },
                Outcome::CheckFailed500,
                Outcome::CheckHung,
                Outcome::Checked { found: true },
            ]
        );
    }

    #[test]
    fn gate_holds_requests_and_every_answer_carries_a_request_id() {
        let ds = Downstream::start();
        ds.close_gate();
        let url = format!("{}/x", ds.url());
        let held = std::thread::spawn(move || {
            Client::new(Duration::from_secs(5)).post(&url, &key_headers("g"), b"1")
        });
        crate::harness::wait_until(Duration::from_secs(5), "a held request", || ds.held() == 1);
        assert_eq!(ds.effects("g"), 0, "nothing decided while held");
        assert_eq!(ds.released(), 0);
        ds.open_gate();
        let r = held.join().unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(ds.released(), 1);
        assert_eq!(ds.effects("g"), 1);
        ds.script("g2", Behavior::Fail500(1));
        let r2 = Client::new(Duration::from_secs(5)).post(
            &format!("{}/x", ds.url()),
            &key_headers("g2"),
            b"1",
        );
        let ids: Vec<String> = ds.requests().into_iter().map(|q| q.request_id).collect();
        assert_eq!(
            vec![r.header("x-request-id"), r2.header("x-request-id")],
            ids.iter().map(|s| Some(s.as_str())).collect::<Vec<_>>()
        );
        assert_ne!(ids[0], ids[1]);
    }
}
