//! The HTTP/1.1 server: one thread per connection, with deadlines, limits
//! and caps on connections, so slow or idle clients cannot starve
//! deliveries (tiny_http 0.12 has no socket timeouts and can leave a new
//! connection queued behind long-lived ones; see NOTES.md).
//!
//! A connection thread reads a request's head and whole body itself,
//! under deadlines, before it asks for one of `http_workers` processing
//! permits; so a slow sender holds only its own thread, never a worker.
//! Every deadline is kept below TLS, on the socket's own reads and writes
//! ([`Wire`]): a deadline holds inside a TLS record and through the
//! handshake, and a request that sends less than `min_receive_rate` bytes
//! a second (after its first two seconds) is let go. Each connection holds
//! one file descriptor. Heads are parsed with `httparse`, with our own
//! framing rules on top; bodies are read as their bytes arrive, never
//! allocated from a declared size, and the bodies being received share one
//! memory budget. A body over `max_body_bytes` is answered 413 without
//! being read, and the rest of it is drained for a moment so that a
//! sender that writes before it reads still gets the answer.
//!
//! Caps: `max_connections` open connections in all, and
//! `max_connections_per_address` from one address (an IPv6 /64). Past the
//! first, the oldest connection idle for a second or more, else the
//! slowest request still being received, is let go to make room; past
//! the second, or when there is no one to let go, a new connection is
//! answered 503 (in TLS on a TLS listener). Every connection dropped
//! without its answer is logged.
//!
//! A handler may answer after it returns ([`Later`]): a webhook's answer
//! waits for a group commit, and instead of sleeping until then and again
//! until the next request, the connection thread goes straight back to
//! reading while the answer thread writes the answer. Answers stay in
//! order: the thread waits for a promised answer before it handles the
//! next request on the same connection, and before it closes.

use std::collections::HashMap;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::reply::Reply;

type Conn = BufReader<Io>;

/// Limits of the HTTP server.
#[derive(Debug, Clone)]
pub struct Limits {
    /// The most open connections; past it, an idle or the slowest
    /// connection is let go, or a new one answered 503.
    pub max_connections: usize,
    /// The most open connections from one address (an IPv6 /64); more are
    /// answered 503.
    pub max_connections_per_address: usize,
    /// Bytes a second a request must average, head and body together,
    /// once it has been sending for [`RATE_GRACE`]; 0: no minimum.
    pub min_receive_rate: u64,
    /// Requests processed at once (verify, claim); reading is not counted.
    pub workers: usize,
    /// Time to receive a whole request head once its first byte arrived.
    pub header_timeout: Duration,
    /// Time a keep-alive connection may sit idle between requests.
    pub idle_timeout: Duration,
    /// Time to receive a whole body, and to write one answer.
    pub body_timeout: Duration,
    pub max_head_bytes: usize,
    pub max_headers: usize,
    pub max_target_bytes: usize,
    pub max_body_bytes: usize,
    /// The memory bodies being received may take together; past it, 503.
    pub max_body_bytes_in_flight: usize,
}

/// How long a request may send at any rate before `min_receive_rate`
/// applies: its first packets, and a client's slow start.
pub const RATE_GRACE: Duration = Duration::from_secs(2);
const RATE_GRACE_MS: i64 = 2_000;

/// How many bodies of `max_body_bytes` may be in flight at once, at most.
pub const BODIES_IN_FLIGHT: usize = 64;

impl Limits {
    /// The fixed parse limits with the configurable ones given: the
    /// defaults of those live in one place, `config.rs`. No per-address
    /// cap and no minimum rate until [`Limits::per_address`].
    pub fn new(
        workers: usize,
        max_body_bytes: usize,
        max_connections: usize,
        header_timeout: Duration,
        body_timeout: Duration,
        idle_timeout: Duration,
    ) -> Limits {
        Limits {
            max_connections,
            max_connections_per_address: max_connections,
            min_receive_rate: 0,
            workers,
            header_timeout,
            idle_timeout,
            body_timeout,
            max_head_bytes: 32 * 1024,
            max_headers: 100,
            max_target_bytes: 4096,
            max_body_bytes,
            max_body_bytes_in_flight: max_body_bytes.saturating_mul(BODIES_IN_FLIGHT),
        }
    }

    /// With a cap on connections from one address and a minimum rate.
    pub fn per_address(mut self, max_connections: usize, min_receive_rate: u64) -> Limits {
        self.max_connections_per_address = max_connections.max(1);
        self.min_receive_rate = min_receive_rate;
        self
    }
}

/// A request read off the wire, body included.
pub struct Request {
    pub method: String,
    pub target: String,
    pub headers: Vec<(String, String)>,
    pub remote: SocketAddr,
    pub content_length: Option<usize>,
    /// The body, read whole and within `max_body_bytes`: a body that is
    /// too large, malformed, short or late is answered by the server
    /// itself (and told to the [`RefusedHook`]), so a handler never sees
    /// one.
    pub body: Vec<u8>,
    /// The processing permit this request holds.
    pub permit: Permit,
    /// The right to answer after the handler returns; offered on plain
    /// (not TLS) keep-alive connections.
    pub later: Option<Later>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum BodyProblem {
    /// The connection ended or stalled before the declared length arrived.
    Short {
        expected: usize,
        got: usize,
    },
    /// Malformed chunked encoding.
    BadChunk(String),
    TimedOut,
}

/// What handles a request. Runs on the connection's thread, holding a
/// processing permit.
pub type Handler = dyn Fn(&mut Request) -> Reply + Send + Sync;

/// Told of a request the server refused itself before the handler could
/// see it (malformed framing, a head or body over a limit, a body late,
/// short or malformed, an unsupported version, method or encoding): its
/// target when the request line was read, the client's address, and the
/// status and message it is answered with.
pub type RefusedHook = dyn Fn(&str, SocketAddr, u16, &str) + Send + Sync;

pub struct Server {
    addr: SocketAddr,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

struct Shared {
    stop: AtomicBool,
    tls: Option<Arc<rustls::ServerConfig>>,
    limits: Limits,
    handler: Box<Handler>,
    refused: Box<RefusedHook>,
    permits: Arc<Semaphore>,
    next_id: AtomicU64,
    open: Mutex<Open>,
    drained: Condvar,
    /// Bytes reserved by bodies being received, together.
    body_bytes: AtomicUsize,
    /// Threads answering 503 at a cap.
    refusing: AtomicUsize,
    /// Connections past a per-address cap, held a while before their 503.
    tarpit: std::sync::mpsc::SyncSender<Held>,
}

/// The open connections, as the acceptor and `stop` see them.
#[derive(Default)]
struct Open {
    /// Each open connection, by the order it was accepted.
    conns: HashMap<u64, Registered>,
    /// Open connections by address (IPv6: by /64), not counting those
    /// let go.
    per_address: HashMap<IpAddr, usize>,
    /// How many of `conns` were let go and are ending.
    evicted: usize,
}

/// An open connection as the acceptor and `stop` see it.
struct Registered {
    /// The connection's socket (the one descriptor it holds).
    socket: Arc<TcpStream>,
    state: Arc<ConnState>,
    remote: SocketAddr,
    address: IpAddr,
}

/// A connection waits for a request.
const IDLE: u8 = 0;
/// A connection receives a request (from its first byte to its body's end).
const READING: u8 = 1;
/// A request is handled or its answer written; or an answer is awaited.
const BUSY: u8 = 2;

/// Deadlines never set.
const NEVER: i64 = i64::MAX;

/// What a connection's thread, its [`Wire`], the acceptor and `stop`
/// share about it. Times are [`mono_ms`].
struct ConnState {
    phase: AtomicU8,
    /// When it started waiting for a request, or receiving one.
    since: AtomicI64,
    /// Bytes read off the socket so far.
    received: AtomicU64,
    /// `received` when the current request started.
    received_at_start: AtomicU64,
    /// Reads fail with `TimedOut` from then.
    read_deadline: AtomicI64,
    /// Writes fail with `TimedOut` from then.
    write_deadline: AtomicI64,
    /// `min_rate` applies now (while a request is received).
    metered: AtomicBool,
    min_rate: u64,
    /// Let go at the connection cap.
    evicted: AtomicBool,
    /// A read failed because the request was under `min_rate`.
    too_slow: AtomicBool,
}

impl ConnState {
    fn new(min_rate: u64) -> ConnState {
        ConnState {
            phase: AtomicU8::new(IDLE),
            since: AtomicI64::new(mono_ms()),
            received: AtomicU64::new(0),
            received_at_start: AtomicU64::new(0),
            read_deadline: AtomicI64::new(NEVER),
            write_deadline: AtomicI64::new(NEVER),
            metered: AtomicBool::new(false),
            min_rate,
            evicted: AtomicBool::new(false),
            too_slow: AtomicBool::new(false),
        }
    }

    /// Reads and writes fail from `within` from now.
    fn deadlines(&self, within: Duration) {
        let at = mono_ms().saturating_add(i64::try_from(within.as_millis()).unwrap_or(NEVER));
        self.read_deadline.store(at, Ordering::SeqCst);
        self.write_deadline.store(at, Ordering::SeqCst);
    }

    fn write_within(&self, within: Duration) {
        let at = mono_ms().saturating_add(i64::try_from(within.as_millis()).unwrap_or(NEVER));
        self.write_deadline.store(at, Ordering::SeqCst);
    }

    fn set_phase(&self, phase: u8) {
        self.phase.store(phase, Ordering::SeqCst);
        if phase != READING {
            self.metered.store(false, Ordering::SeqCst);
        }
        if phase == IDLE {
            self.since.store(mono_ms(), Ordering::SeqCst);
        }
    }

    /// A request starts: its first `buffered` bytes were already read.
    fn start_request(&self, buffered: usize) {
        let received = self.received.load(Ordering::SeqCst);
        self.received_at_start
            .store(received.saturating_sub(buffered as u64), Ordering::SeqCst);
        self.since.store(mono_ms(), Ordering::SeqCst);
        self.phase.store(READING, Ordering::SeqCst);
        self.metered.store(self.min_rate > 0, Ordering::SeqCst);
    }

    /// Bytes a second the current request has averaged (for picking the
    /// slowest one at the cap).
    fn rate(&self, now: i64) -> f64 {
        let got = self
            .received
            .load(Ordering::SeqCst)
            .saturating_sub(self.received_at_start.load(Ordering::SeqCst));
        let elapsed = (now - self.since.load(Ordering::SeqCst)).max(1);
        got as f64 * 1000.0 / elapsed as f64
    }

    /// How long the next read may wait: up to the read deadline, and up to
    /// when the request would fall under the minimum rate. `TimedOut` when
    /// either has passed.
    fn read_wait(&self) -> io::Result<Duration> {
        let now = mono_ms();
        let deadline = self.read_deadline.load(Ordering::SeqCst);
        if now >= deadline {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "deadline passed"));
        }
        let mut until = deadline;
        if self.metered.load(Ordering::SeqCst) && self.min_rate > 0 {
            let started = self.since.load(Ordering::SeqCst);
            let got = self
                .received
                .load(Ordering::SeqCst)
                .saturating_sub(self.received_at_start.load(Ordering::SeqCst));
            // `got` bytes keep the average up until this long after the start.
            let enough_for = i64::try_from(got.saturating_mul(1000) / self.min_rate)
                .unwrap_or(NEVER)
                .max(RATE_GRACE_MS);
            let enough_until = started.saturating_add(enough_for);
            if now >= enough_until {
                self.too_slow.store(true, Ordering::SeqCst);
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "under the minimum rate",
                ));
            }
            until = until.min(enough_until);
        }
        Ok(Duration::from_millis(
            u64::try_from(until - now).unwrap_or(1).max(1),
        ))
    }
}

/// The socket under a connection (under TLS too): every read and write
/// waits at most until the connection's deadlines, so a deadline holds
/// however the bytes are cut, inside a TLS record or a handshake.
struct Wire {
    socket: Arc<TcpStream>,
    state: Arc<ConnState>,
}

impl Read for Wire {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let wait = self.state.read_wait()?;
            self.socket.set_read_timeout(Some(wait))?;
            match (&*self.socket).read(buf) {
                Ok(n) => {
                    self.state.received.fetch_add(n as u64, Ordering::SeqCst);
                    return Ok(n);
                }
                Err(e) if retry(&e) => {}
                Err(e) => return Err(e),
            }
        }
    }
}

impl Write for Wire {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        loop {
            let now = mono_ms();
            let deadline = self.state.write_deadline.load(Ordering::SeqCst);
            if now >= deadline {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "not taken in time"));
            }
            let wait = u64::try_from(deadline - now).unwrap_or(1).max(1);
            self.socket
                .set_write_timeout(Some(Duration::from_millis(wait)))?;
            match (&*self.socket).write(buf) {
                Ok(n) => return Ok(n),
                Err(e) if retry(&e) => {}
                Err(e) => return Err(e),
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A socket read or write to try again (after the deadlines are checked).
fn retry(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    )
}

/// What a connection reads and writes: plain TCP or TLS over it.
enum Io {
    Plain(Wire),
    Tls(Box<rustls::StreamOwned<rustls::ServerConnection, Wire>>),
}

impl Read for Io {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Io::Plain(w) => w.read(buf),
            Io::Tls(t) => t.read(buf),
        }
    }
}

impl Write for Io {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Io::Plain(w) => w.write(buf),
            Io::Tls(t) => t.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Io::Plain(w) => w.flush(),
            Io::Tls(t) => t.flush(),
        }
    }
}

impl Io {
    /// Ends the TLS session cleanly (a plain connection has nothing to say).
    fn close_notify(&mut self) {
        if let Io::Tls(t) = self {
            t.conn.send_close_notify();
            let _ = t.flush();
        }
    }
}

/// How long a connection must have waited for a request before it may be
/// let go to make room: a client that just connected gets time to send.
const EVICTABLE_AFTER_MS: i64 = 1_000;

/// Threads answering 503 at a cap at once; past it, a plain connection
/// gets the 503 without waiting and a TLS one is closed.
const MAX_REFUSING: usize = 16;
/// How long a 503 at a cap may take (TLS handshake included).
const REFUSE_WITHIN: Duration = Duration::from_secs(2);
/// After a refusal, how long the rest of the request is read and
/// discarded, so the client reads the answer instead of a reset.
const LINGER: Duration = Duration::from_secs(2);
/// After a 413, how long the rest of the body is drained, at most.
const DRAIN_413: Duration = Duration::from_secs(5);
/// The most bytes drained after a refusal.
const DRAIN_MAX_BYTES: u64 = 64 * 1024 * 1024;

/// Milliseconds on a monotonic clock (from the first call).
fn mono_ms() -> i64 {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    i64::try_from(START.get_or_init(Instant::now).elapsed().as_millis()).unwrap_or(i64::MAX)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The address a per-address cap counts by: an IPv4 address, an IPv6 /64
/// (one host usually holds a whole /64).
fn address_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}

/// Logs a connection dropped without its answer. Under a flood, at most
/// [`DROP_LINES_PER_SECOND`] lines a second name one; the rest are
/// counted in one line a second.
fn dropped(remote: Option<SocketAddr>, why: &str, detail: &dyn std::fmt::Display) {
    static THROTTLE: Mutex<(i64, u64, u64)> = Mutex::new((0, 0, 0));
    let second = mono_ms() / 1000;
    let (log_it, suppressed) = {
        let mut t = lock(&THROTTLE);
        let mut suppressed = 0;
        if t.0 != second {
            suppressed = t.2;
            *t = (second, 0, 0);
        }
        t.1 += 1;
        let log_it = t.1 <= DROP_LINES_PER_SECOND;
        if !log_it {
            t.2 += 1;
        }
        (log_it, suppressed)
    };
    if suppressed > 0 {
        crate::log::warn(
            "connections dropped (not logged one by one)",
            &[("count", &suppressed)],
        );
    }
    if log_it {
        let remote = remote.map_or_else(|| "-".to_string(), |r| r.to_string());
        crate::log::warn(
            "connection dropped",
            &[("remote", &remote), ("reason", &why), ("detail", detail)],
        );
    }
}

const DROP_LINES_PER_SECOND: u64 = 20;

/// Raises the soft limit on open files to the hard limit, and returns
/// `wanted` open connections per listener lowered (with a warning) to what
/// the limit leaves once `reserve` descriptors are kept for the database,
/// logs and downstream calls. Each connection holds one descriptor, and
/// so does each connection waiting in the tarpit.
pub fn fit_to_descriptors(wanted: usize, listeners: usize, reserve: usize) -> usize {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current != limit.maximum {
        let before = limit.current;
        limit.current = limit.maximum;
        match setrlimit(Resource::Nofile, limit) {
            Ok(()) => crate::log::info(
                "open files limit raised",
                &[
                    (
                        "from",
                        &before.map_or("unlimited".into(), |n| n.to_string()),
                    ),
                    (
                        "to",
                        &limit.current.map_or("unlimited".into(), |n| n.to_string()),
                    ),
                ],
            ),
            Err(e) => {
                limit = getrlimit(Resource::Nofile);
                crate::log::warn("cannot raise the open files limit", &[("error", &e)]);
            }
        }
    }
    let Some(files) = limit.current else {
        return wanted;
    };
    let open_now = std::fs::read_dir("/proc/self/fd").map_or(16, Iterator::count);
    let free = usize::try_from(files)
        .unwrap_or(usize::MAX)
        .saturating_sub(open_now + reserve);
    // Each listener holds up to max_connections connections, and as many
    // again (at most 1024) in its tarpit.
    let per_listener = free / listeners.max(1);
    let fits = if per_listener >= 2048 {
        per_listener - 1024
    } else {
        per_listener / 2
    }
    .max(1);
    if wanted > fits {
        crate::log::warn(
            "max_connections lowered to fit the open files limit",
            &[
                ("max_connections", &wanted),
                ("lowered_to", &fits),
                ("open_files_limit", &files),
                (
                    "fix",
                    &"raise the hard limit (LimitNOFILE= in systemd, ulimit -Hn) or lower max_connections",
                ),
            ],
        );
        return fits;
    }
    wanted
}

impl Server {
    /// Binds `listen`; with `tls`, every connection is TLS.
    pub fn bind(
        listen: &str,
        limits: Limits,
        tls: Option<Arc<rustls::ServerConfig>>,
        handler: Box<Handler>,
        refused: Box<RefusedHook>,
    ) -> io::Result<Server> {
        let listener = listen_on(listen)?;
        let addr = listener.local_addr()?;
        let (tarpit, held) = std::sync::mpsc::sync_channel(tarpit_size(&limits));
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            tls,
            permits: Arc::new(Semaphore::new(limits.workers.max(1))),
            limits,
            handler,
            refused,
            next_id: AtomicU64::new(0),
            open: Mutex::new(Open::default()),
            drained: Condvar::new(),
            body_bytes: AtomicUsize::new(0),
            refusing: AtomicUsize::new(0),
            tarpit,
        });
        let weak = Arc::downgrade(&shared);
        std::thread::Builder::new()
            .name("idemhook-tarpit".into())
            .stack_size(128 * 1024)
            .spawn(move || tarpit_loop(&held, &weak))?;
        let s = shared.clone();
        let acceptor = std::thread::Builder::new()
            .name("idemhook-accept".into())
            .spawn(move || accept_loop(&listener, &s))?;
        Ok(Server {
            addr,
            shared,
            acceptor: Some(acceptor),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting, lets requests already read finish and answer, ends
    /// idle connections, and waits up to `grace` for them all.
    pub fn stop(mut self, grace: Duration) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // Wake the acceptor with a connection of our own.
        let wake = if self.addr.ip().is_unspecified() {
            SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), self.addr.port())
        } else {
            self.addr
        };
        let _ = TcpStream::connect_timeout(&wake, Duration::from_secs(1));
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
        // Idle connections wait in a read: end it. A connection in the
        // middle of a request reads the rest of it and answers; it ends at
        // the top of its loop, where it sees the stop.
        {
            let open = lock(&self.shared.open);
            for r in open.conns.values() {
                if r.state.phase.load(Ordering::SeqCst) == IDLE {
                    let _ = r.socket.shutdown(Shutdown::Read);
                }
            }
        }
        let deadline = Instant::now() + grace;
        let mut open = lock(&self.shared.open);
        while !open.conns.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            open = match self.shared.drained.wait_timeout(open, left) {
                Ok((o, _)) => o,
                Err(_) => break,
            };
        }
    }
}

/// Why a new connection is not admitted.
#[derive(Clone, Copy)]
enum Full {
    /// Its address holds `max_connections_per_address` already.
    Address,
    /// `max_connections` are open and none may be let go.
    Server,
}

fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>) {
    for stream in listener.incoming() {
        if shared.stop.load(Ordering::SeqCst) {
            break;
        }
        let stream = match stream {
            Ok(s) => s,
            Err(e) => {
                // EMFILE and friends: the client is dropped unanswered;
                // back off instead of spinning.
                dropped(None, "accept failed", &e);
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        let Ok(remote) = stream.peer_addr() else {
            continue;
        };
        let socket = Arc::new(stream);
        let state = Arc::new(ConnState::new(shared.limits.min_receive_rate));
        let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
        if let Err(full) = admit(shared, id, remote, &socket, &state) {
            refuse(shared, socket, remote, full);
            continue;
        }
        start_connection(shared, id, socket, remote, state);
    }
}

/// Runs an admitted connection on its own thread.
fn start_connection(
    shared: &Arc<Shared>,
    id: u64,
    socket: Arc<TcpStream>,
    remote: SocketAddr,
    state: Arc<ConnState>,
) {
    let s = shared.clone();
    let spawned = std::thread::Builder::new()
        .name("idemhook-conn".into())
        .stack_size(256 * 1024)
        .spawn(move || {
            // Gives the slot back however the thread ends, panics included.
            let _slot = Slot(&s, id);
            serve_connection(socket, remote, &s, &state);
        });
    if let Err(e) = spawned {
        finish(shared, id);
        dropped(Some(remote), "no thread for the connection", &e);
    }
}

/// Registers a new connection under the caps, letting another go when
/// the server is full.
fn admit(
    shared: &Shared,
    id: u64,
    remote: SocketAddr,
    socket: &Arc<TcpStream>,
    state: &Arc<ConnState>,
) -> Result<(), Full> {
    let limits = &shared.limits;
    let address = address_key(remote.ip());
    let mut open = lock(&shared.open);
    let from_there = open.per_address.get(&address).copied().unwrap_or(0);
    if limits.max_connections_per_address < limits.max_connections
        && from_there >= limits.max_connections_per_address
        && !evict_one(&mut open, Some(address))
    {
        return Err(Full::Address);
    }
    if open.conns.len().saturating_sub(open.evicted) >= limits.max_connections
        && !evict_one(&mut open, None)
    {
        return Err(Full::Server);
    }
    open.conns.insert(
        id,
        Registered {
            socket: socket.clone(),
            state: state.clone(),
            remote,
            address,
        },
    );
    *open.per_address.entry(address).or_insert(0) += 1;
    Ok(())
}

/// At a cap, makes room: ends the read of the oldest connection that has
/// waited a second or more for a request (one that never sent a byte, or
/// a keep-alive connection between requests); at the server's cap (no
/// `address`), else of the request being received at the lowest rate. At
/// a per-address cap only that address's idle connections may go: its
/// requests in progress keep their slots, and the new one waits in the
/// tarpit for its 503. A request being handled, or an answer being
/// written, is never cut. False when there is no one to let go.
fn evict_one(open: &mut Open, address: Option<IpAddr>) -> bool {
    let now = mono_ms();
    let live = || {
        open.conns.iter().filter(|(_, r)| {
            !r.state.evicted.load(Ordering::SeqCst) && address.is_none_or(|a| r.address == a)
        })
    };
    let oldest_idle = live()
        .filter(|(_, r)| {
            r.state.phase.load(Ordering::SeqCst) == IDLE
                && now - r.state.since.load(Ordering::SeqCst) >= EVICTABLE_AFTER_MS
        })
        .map(|(id, _)| *id)
        .min();
    let (chosen, why) = match oldest_idle {
        Some(id) => (Some(id), "idle, let go at the connection cap"),
        None if address.is_some() => (None, ""),
        None => (
            live()
                .filter(|(_, r)| r.state.phase.load(Ordering::SeqCst) == READING)
                .min_by(|a, b| a.1.state.rate(now).total_cmp(&b.1.state.rate(now)))
                .map(|(id, _)| *id),
            "the slowest request, let go at the connection cap",
        ),
    };
    let Some(r) = chosen.and_then(|id| open.conns.get(&id)) else {
        return false;
    };
    r.state.evicted.store(true, Ordering::SeqCst);
    let _ = r.socket.shutdown(Shutdown::Read);
    let (remote, rate, from) = (r.remote, r.state.rate(now), r.address);
    open.evicted += 1;
    // Counted by address while live only.
    release_address(open, from);
    dropped(Some(remote), why, &format_args!("{rate:.0} bytes/s"));
    true
}

/// Answers 503 to a connection past a cap, in TLS on a TLS listener, from
/// a short-lived thread (at most [`MAX_REFUSING`] at once) so that the
/// acceptor never waits on the client.
fn refuse(shared: &Arc<Shared>, socket: Arc<TcpStream>, remote: SocketAddr, full: Full) {
    let (why, message) = match full {
        Full::Address => (
            "refused: max_connections_per_address reached",
            "too many connections from this address, retry later",
        ),
        Full::Server => (
            "refused: max_connections reached",
            "too many connections, retry later",
        ),
    };
    if let Full::Address = full {
        let held = Held {
            socket,
            remote,
            until: Instant::now() + TARPIT_HOLD,
        };
        match shared.tarpit.try_send(held) {
            // Logged when it is answered 503, if no room was made by then.
            Ok(()) => return,
            Err(e) => {
                let held = match e {
                    std::sync::mpsc::TrySendError::Full(h)
                    | std::sync::mpsc::TrySendError::Disconnected(h) => h,
                };
                answer_503(shared, held.socket, remote, why, message);
                return;
            }
        }
    }
    answer_503(shared, socket, remote, why, message);
}

/// Answers 503 now.
fn answer_503(
    shared: &Arc<Shared>,
    socket: Arc<TcpStream>,
    remote: SocketAddr,
    why: &str,
    message: &str,
) {
    dropped(Some(remote), why, &"answered 503");
    let bytes = serialize(Reply::error(503, message).retry_after(), false, true);
    if shared.refusing.fetch_add(1, Ordering::SeqCst) < MAX_REFUSING {
        let s = shared.clone();
        let for_thread = socket.clone();
        let answer = bytes.clone();
        let spawned = std::thread::Builder::new()
            .name("idemhook-refuse".into())
            .stack_size(128 * 1024)
            .spawn(move || {
                refuse_in_thread(&s, for_thread, &answer);
                s.refusing.fetch_sub(1, Ordering::SeqCst);
            });
        if spawned.is_ok() {
            return;
        }
    }
    shared.refusing.fetch_sub(1, Ordering::SeqCst);
    if shared.tls.is_none() {
        use rustix::net::{SendFlags, send};
        let _ = send(&*socket, &bytes, SendFlags::DONTWAIT | SendFlags::NOSIGNAL);
        let _ = socket.shutdown(Shutdown::Write);
    }
}

/// How long a connection past its address's cap waits for its 503: a
/// client that reconnects at once then costs a connection every few
/// seconds, not a busy loop.
const TARPIT_HOLD: Duration = Duration::from_secs(5);

/// A connection held in the tarpit.
struct Held {
    socket: Arc<TcpStream>,
    remote: SocketAddr,
    until: Instant,
}

/// How many connections the tarpit holds at most (each a descriptor).
fn tarpit_size(limits: &Limits) -> usize {
    limits.max_connections.clamp(1, 1024)
}

/// How often the tarpit tries again to admit the connections it holds.
const TARPIT_RETRY: Duration = Duration::from_millis(100);

/// Holds connections past a per-address cap for up to [`TARPIT_HOLD`]
/// (nothing read, nothing written). Every [`TARPIT_RETRY`] each is offered
/// a slot again, so one gets in as soon as its address has room (a
/// connection closed, or an idle one has waited long enough to be let
/// go): idle connections from an address never keep its next delivery
/// out. Those still held at the end are answered 503. Ends with the server.
fn tarpit_loop(held: &std::sync::mpsc::Receiver<Held>, shared: &std::sync::Weak<Shared>) {
    let mut waiting: std::collections::VecDeque<Held> = std::collections::VecDeque::new();
    loop {
        let wait = waiting.front().map_or(Duration::from_secs(1), |h| {
            h.until
                .saturating_duration_since(Instant::now())
                .min(TARPIT_RETRY)
        });
        match held.recv_timeout(wait.max(Duration::from_millis(10))) {
            Ok(h) => waiting.push_back(h),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return,
        }
        if !waiting.is_empty() {
            let Some(shared) = shared.upgrade() else {
                return;
            };
            if !shared.stop.load(Ordering::SeqCst) {
                // One try per address and round: under a flood from one
                // address, a round costs one scan of the connections.
                let mut full = std::collections::HashSet::new();
                waiting.retain(|h| {
                    let address = address_key(h.remote.ip());
                    if full.contains(&address) {
                        return true;
                    }
                    let admitted = admit_held(&shared, h);
                    if !admitted {
                        full.insert(address);
                    }
                    !admitted
                });
            }
        }
        let now = Instant::now();
        while waiting.front().is_some_and(|h| h.until <= now) {
            let Some(h) = waiting.pop_front() else { break };
            let Some(shared) = shared.upgrade() else {
                return;
            };
            let bytes = serialize(
                Reply::error(503, "too many connections from this address, retry later")
                    .retry_after(),
                false,
                true,
            );
            if shared.tls.is_none() {
                use rustix::net::{SendFlags, send};
                dropped(
                    Some(h.remote),
                    "refused: max_connections_per_address reached",
                    &"held, no room made, answered 503",
                );
                let _ = send(
                    &*h.socket,
                    &bytes,
                    SendFlags::DONTWAIT | SendFlags::NOSIGNAL,
                );
                let _ = h.socket.shutdown(Shutdown::Write);
            } else {
                answer_503(
                    &shared,
                    h.socket,
                    h.remote,
                    "held past max_connections_per_address",
                    "too many connections from this address, retry later",
                );
            }
        }
    }
}

/// Admits a held connection when its address has room now, and starts
/// it; false when it must wait on.
fn admit_held(shared: &Arc<Shared>, h: &Held) -> bool {
    let state = Arc::new(ConnState::new(shared.limits.min_receive_rate));
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    if admit(shared, id, h.remote, &h.socket, &state).is_err() {
        return false;
    }
    start_connection(shared, id, h.socket.clone(), h.remote, state);
    true
}

/// A listener with a long accept queue (4096, as the kernel allows), so a
/// burst of connections is queued rather than dropped.
fn listen_on(listen: &str) -> io::Result<TcpListener> {
    use rustix::net::{
        AddressFamily, SocketFlags, SocketType, bind, listen as listen_fd, socket_with, sockopt,
    };
    use std::net::ToSocketAddrs;
    let mut last = None;
    for addr in listen.to_socket_addrs()? {
        let family = if addr.is_ipv4() {
            AddressFamily::INET
        } else {
            AddressFamily::INET6
        };
        let bound =
            socket_with(family, SocketType::STREAM, SocketFlags::CLOEXEC, None).and_then(|fd| {
                sockopt::set_socket_reuseaddr(&fd, true)?;
                bind(&fd, &addr)?;
                listen_fd(&fd, 4096)?;
                Ok(fd)
            });
        match bound {
            Ok(fd) => return Ok(TcpListener::from(fd)),
            Err(e) => last = Some(io::Error::from(e)),
        }
    }
    Err(last
        .unwrap_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no address to listen on")))
}

fn refuse_in_thread(shared: &Shared, socket: Arc<TcpStream>, answer: &[u8]) {
    let state = Arc::new(ConnState::new(0));
    state.deadlines(REFUSE_WITHIN);
    let wire = Wire {
        socket: socket.clone(),
        state,
    };
    let mut io = match &shared.tls {
        Some(config) => match rustls::ServerConnection::new(config.clone()) {
            Ok(tls) => Io::Tls(Box::new(rustls::StreamOwned::new(tls, wire))),
            Err(_) => return,
        },
        None => Io::Plain(wire),
    };
    if io.write_all(answer).and_then(|()| io.flush()).is_err() {
        return;
    }
    io.close_notify();
    let _ = socket.shutdown(Shutdown::Write);
    drain(&socket, LINGER.min(REFUSE_WITHIN), 64 * 1024);
}

/// Reads and discards what the client still sends, for up to `within`
/// and `max` bytes, until it closes: after a half-close, so that closing
/// with unread bytes does not reset the connection before the client has
/// read its answer.
fn drain(socket: &TcpStream, within: Duration, max: u64) {
    let until = Instant::now() + within;
    let mut buf = [0u8; 8192];
    let mut total = 0u64;
    while total < max {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() || socket.set_read_timeout(Some(left)).is_err() {
            return;
        }
        match (&*socket).read(&mut buf) {
            Ok(0) => return,
            Ok(n) => total += n as u64,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

struct Slot<'a>(&'a Shared, u64);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        finish(self.0, self.1);
    }
}

fn finish(shared: &Shared, id: u64) {
    let mut open = lock(&shared.open);
    if let Some(r) = open.conns.remove(&id) {
        if r.state.evicted.load(Ordering::SeqCst) {
            open.evicted = open.evicted.saturating_sub(1);
        } else {
            release_address(&mut open, r.address);
        }
    }
    if open.conns.is_empty() {
        shared.drained.notify_all();
    }
}

fn release_address(open: &mut Open, address: IpAddr) {
    if let Some(n) = open.per_address.get_mut(&address) {
        *n = n.saturating_sub(1);
        if *n == 0 {
            open.per_address.remove(&address);
        }
    }
}

fn serve_connection(
    socket: Arc<TcpStream>,
    remote: SocketAddr,
    shared: &Shared,
    state: &Arc<ConnState>,
) {
    let _ = socket.set_nodelay(true);
    let limits = &shared.limits;
    // The first byte (after the TLS handshake, on a TLS listener) within
    // the header timeout: a connection that says nothing is not kept for
    // the keep-alive idle timeout.
    state.deadlines(limits.header_timeout.min(limits.idle_timeout));
    let out = Arc::new(Outbound {
        socket: socket.clone(),
        state: Mutex::new(OutState::default()),
        settled: Condvar::new(),
        answer_timeout: limits.body_timeout,
        conn: state.clone(),
    });
    let wire = Wire {
        socket: socket.clone(),
        state: state.clone(),
    };
    let io = match &shared.tls {
        Some(config) => match rustls::ServerConnection::new(config.clone()) {
            Ok(tls) => Io::Tls(Box::new(rustls::StreamOwned::new(tls, wire))),
            Err(e) => {
                dropped(Some(remote), "tls setup failed", &e);
                return;
            }
        },
        None => Io::Plain(wire),
    };
    let mut reader: Conn = BufReader::with_capacity(16 * 1024, io);
    let end = serve_requests(&mut reader, &out, remote, shared, state);
    // A promised answer is written before the connection closes.
    let settled = out.settle(&mut reader);
    match end {
        End::Quietly => {}
        End::Dropped(why) => dropped(Some(remote), why, &"closed"),
        End::Answered => {
            if settled {
                reader.get_mut().close_notify();
            }
            let _ = socket.shutdown(Shutdown::Write);
        }
        End::Refused(linger) => {
            reader.get_mut().close_notify();
            let _ = socket.shutdown(Shutdown::Write);
            drain(&socket, linger, DRAIN_MAX_BYTES);
        }
    }
}

/// How a connection ends.
enum End {
    /// The client closed, or went idle past a timeout: nothing to say.
    Quietly,
    /// The last request was answered and the connection is to close.
    Answered,
    /// A request was refused and answered: half-close, then read and
    /// discard what the client still sends for up to this long.
    Refused(Duration),
    /// Cut without an answer (let go at the cap, a write that timed out):
    /// logged.
    Dropped(&'static str),
}

/// Why a request could not be read to its end, as the connection answers it.
enum Cut {
    /// Answer this, tell the refused hook, and close (lingering this long).
    Refuse(u16, String, Duration),
    /// Close without an answer.
    End(End),
}

/// Serves requests until the connection is to close.
fn serve_requests(
    reader: &mut Conn,
    out: &Arc<Outbound>,
    remote: SocketAddr,
    shared: &Shared,
    state: &Arc<ConnState>,
) -> End {
    let limits = &shared.limits;
    let mut first = true;
    loop {
        // Idle from here, then the stop is checked: a stop that comes
        // later sees this connection idle and ends its read (`stop`).
        state.set_phase(IDLE);
        if shared.stop.load(Ordering::SeqCst) {
            return End::Quietly;
        }
        // Wait for the next request's first byte (a TLS handshake first,
        // on a new TLS connection; its deadline was set at the start).
        if !first {
            state.deadlines(limits.idle_timeout);
        }
        first = false;
        match reader.fill_buf() {
            Ok([]) | Err(_) => {
                // (One let go at the cap was logged then.)
                return End::Quietly;
            }
            Ok(_) => {}
        }
        state.set_phase(BUSY);
        // The previous request's answer goes out before anything of this
        // one (only a pipelining client ever waits here).
        if !out.settle(reader) {
            return End::Dropped("a previous answer was not taken in time");
        }
        state.start_request(reader.buffer().len());
        state.deadlines(limits.header_timeout);
        let (head, raw_target) = match read_head(reader, limits) {
            Ok(h) => h,
            Err(HeadError::Closed) => {
                // (One let go at the cap was logged then.)
                return End::Quietly;
            }
            Err(HeadError::Refused {
                status,
                message,
                target,
            }) => {
                let cut = if state.evicted.load(Ordering::SeqCst) {
                    Cut::End(End::Quietly)
                } else if state.too_slow.load(Ordering::SeqCst) {
                    Cut::Refuse(408, too_slow_message(limits), Duration::ZERO)
                } else {
                    let linger = if status == 408 {
                        Duration::ZERO
                    } else {
                        LINGER
                    };
                    Cut::Refuse(status, message, linger)
                };
                return refuse_request(reader, state, shared, target.as_deref(), remote, cut);
            }
        };
        let declared_too_large = head
            .content_length
            .is_some_and(|n| n > limits.max_body_bytes);
        // Expect: 100-continue (HTTP/1.1 only), unless the answer is known.
        if head.expect_continue && !declared_too_large {
            let _ = write_out(reader, b"HTTP/1.1 100 Continue\r\n\r\n");
        }
        state.deadlines(limits.body_timeout);
        let mut budget = Budget {
            pool: &shared.body_bytes,
            limit: limits.max_body_bytes_in_flight,
            held: 0,
        };
        let body = if declared_too_large {
            // Not read at all: the answer is 413, the rest is drained.
            Err(BodyError::TooLarge)
        } else {
            read_body(reader, &head, limits.max_body_bytes, &mut budget)
        };
        let body = match body {
            Ok(b) => b,
            Err(e) => {
                let cut = body_cut(e, state, shared);
                return refuse_request(reader, state, shared, Some(&raw_target), remote, cut);
            }
        };
        state.set_phase(BUSY);
        let later = (shared.tls.is_none() && head.keep_alive && head.method == "POST")
            .then(|| Later { out: out.clone() });
        let mut request = Request {
            method: head.method,
            target: head.target,
            headers: head.headers,
            remote,
            content_length: head.content_length,
            body,
            permit: Permit(None),
            later,
        };
        let promises = locked(&out.state).promises;
        let reply = {
            request.permit = shared.permits.acquire();
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let reply = (shared.handler)(&mut request);
                if let Some(fp) = reply.failpoint {
                    crate::failpoint::hit(fp);
                }
                reply
            })) {
                Ok(r) => r,
                // A promise made before the panic answers by itself (its
                // `Answer` writes a 500 when dropped): one answer only.
                Err(_) if locked(&out.state).promises != promises => Later::promised(),
                Err(_) => {
                    crate::log::error("handler panicked", &[("effect", &"answered 500")]);
                    Reply::error(500, "internal error")
                }
            }
        };
        request.permit.release();
        drop(budget);
        if reply.later {
            // Promised: the answer thread writes it.
            continue;
        }
        let close = !head.keep_alive || shared.stop.load(Ordering::SeqCst);
        let is_head = request.method == "HEAD";
        state.write_within(limits.body_timeout);
        if write_out(reader, &serialize(reply, is_head, close)).is_err() {
            return End::Dropped("the answer was not taken in time");
        }
        if close {
            return End::Answered;
        }
    }
}

fn too_slow_message(limits: &Limits) -> String {
    format!(
        "request too slow: under min_receive_rate ({} bytes a second)",
        limits.min_receive_rate
    )
}

/// How a body that could not be read is answered.
fn body_cut(e: BodyError, state: &ConnState, shared: &Shared) -> Cut {
    let limits = &shared.limits;
    if state.evicted.load(Ordering::SeqCst) {
        return Cut::End(End::Quietly);
    }
    if state.too_slow.load(Ordering::SeqCst) {
        return Cut::Refuse(408, too_slow_message(limits), Duration::ZERO);
    }
    if shared.stop.load(Ordering::SeqCst) && !matches!(e, BodyError::TooLarge) {
        // The stop ended the body's read (this connection looked idle
        // to it a moment before its first byte): the request was cut
        // by the shutdown, not malformed. The sender retries.
        return Cut::Refuse(
            503,
            "the server is shutting down; retry later".into(),
            Duration::ZERO,
        );
    }
    match e {
        BodyError::TooLarge => Cut::Refuse(
            413,
            format!(
                "body larger than max_body_bytes ({})",
                limits.max_body_bytes
            ),
            DRAIN_413.min(limits.body_timeout),
        ),
        BodyError::Busy => Cut::Refuse(
            503,
            "too many request bodies in flight, retry later".into(),
            LINGER,
        ),
        BodyError::Problem(BodyProblem::TimedOut) => {
            Cut::Refuse(408, "body not received in time".into(), Duration::ZERO)
        }
        BodyError::Problem(BodyProblem::Short { expected, got }) => Cut::Refuse(
            400,
            format!("body shorter than its Content-Length ({got} of {expected} bytes)"),
            Duration::ZERO,
        ),
        BodyError::Problem(BodyProblem::BadChunk(m)) => {
            Cut::Refuse(400, format!("malformed chunked body: {m}"), LINGER)
        }
    }
}

/// Answers a request the server refuses itself, tells the refused hook,
/// and says how the connection ends.
fn refuse_request(
    reader: &mut Conn,
    state: &ConnState,
    shared: &Shared,
    target: Option<&str>,
    remote: SocketAddr,
    cut: Cut,
) -> End {
    let (status, message, linger) = match cut {
        Cut::End(end) => return end,
        Cut::Refuse(status, message, linger) => (status, message, linger),
    };
    if let Some(target) = target {
        (shared.refused)(target, remote, status, &message);
    }
    state.set_phase(BUSY);
    let mut reply = Reply::error(status, &message);
    if status == 503 {
        reply = reply.retry_after();
    }
    state.write_within(REFUSE_WITHIN);
    if write_out(reader, &serialize(reply, false, true)).is_err() {
        return End::Dropped("the refusal was not taken in time");
    }
    if linger.is_zero() {
        End::Answered
    } else {
        End::Refused(linger)
    }
}

/// Bytes of request bodies reserved from the shared budget, given back
/// when dropped.
struct Budget<'a> {
    pool: &'a AtomicUsize,
    limit: usize,
    held: usize,
}

impl Budget<'_> {
    /// Reserves `n` more bytes; false when the budget has no room.
    fn take(&mut self, n: usize) -> bool {
        let before = self.pool.fetch_add(n, Ordering::SeqCst);
        if before.saturating_add(n) > self.limit {
            self.pool.fetch_sub(n, Ordering::SeqCst);
            return false;
        }
        self.held += n;
        true
    }
}

impl Drop for Budget<'_> {
    fn drop(&mut self) {
        self.pool.fetch_sub(self.held, Ordering::SeqCst);
    }
}

/// Why a body was not read.
#[derive(Debug)]
enum BodyError {
    /// Over `max_body_bytes`, declared or chunked.
    TooLarge,
    /// The bodies in flight would pass their memory budget.
    Busy,
    Problem(BodyProblem),
}

/// A connection's answers written by another thread, kept in order with
/// the ones its own thread writes.
struct Outbound {
    /// The connection's socket: its shutdown, and the answer thread's
    /// writes.
    socket: Arc<TcpStream>,
    state: Mutex<OutState>,
    settled: Condvar,
    /// The deadline of writing what an answer left unsent.
    answer_timeout: Duration,
    conn: Arc<ConnState>,
}

#[derive(Default)]
struct OutState {
    /// An answer was promised and is not written yet.
    promised: bool,
    /// Promises made on this connection so far.
    promises: u64,
    /// What a non-blocking write left unsent: the client has not read a
    /// socket buffer's worth of answers (only a pipelining client can get
    /// there). The connection's thread sends it, within its deadline,
    /// when it next wakes: at the next request, or at the end of the
    /// connection (its idle timeout at the latest).
    rest: Vec<u8>,
    /// The write failed: the connection is done.
    broken: bool,
}

fn locked(m: &Mutex<OutState>) -> std::sync::MutexGuard<'_, OutState> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Outbound {
    /// Writes an answer from another thread without ever blocking on the
    /// client: what the socket does not take at once is left for the
    /// connection's thread.
    fn write_answer(&self, bytes: &[u8]) {
        use rustix::io::Errno;
        use rustix::net::{SendFlags, send};
        let mut state = locked(&self.state);
        let mut sent = 0;
        while sent < bytes.len() {
            match send(
                &*self.socket,
                &bytes[sent..],
                SendFlags::DONTWAIT | SendFlags::NOSIGNAL,
            ) {
                Ok(0) => {
                    state.broken = true;
                    break;
                }
                Ok(n) => sent += n,
                Err(Errno::INTR) => {}
                Err(Errno::AGAIN) => {
                    state.rest = bytes[sent..].to_vec();
                    break;
                }
                Err(_) => {
                    state.broken = true;
                    break;
                }
            }
        }
        state.promised = false;
        drop(state);
        self.settled.notify_all();
    }

    /// Waits until a promised answer is written and sends what it left
    /// unsent. False when the connection is done.
    fn settle(&self, reader: &mut Conn) -> bool {
        let mut state = locked(&self.state);
        while state.promised {
            state = self
                .settled
                .wait(state)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        let rest = std::mem::take(&mut state.rest);
        let broken = state.broken;
        drop(state);
        if broken {
            return false;
        }
        if rest.is_empty() {
            return true;
        }
        self.conn.write_within(self.answer_timeout);
        write_out(reader, &rest).is_ok()
    }
}

/// The right to answer a request after its handler has returned.
pub struct Later {
    out: Arc<Outbound>,
}

impl Later {
    /// Promises an answer: returns who gives it, and the reply the handler
    /// returns now, for which the server writes nothing.
    pub fn promise(self) -> (Answer, Reply) {
        {
            let mut state = locked(&self.out.state);
            state.promised = true;
            state.promises += 1;
        }
        (
            Answer {
                out: Some(self.out),
            },
            Later::promised(),
        )
    }

    /// The reply that stands for a promised answer.
    fn promised() -> Reply {
        let mut reply = Reply::text(0, "", String::new());
        reply.later = true;
        reply
    }
}

/// A promised answer. Dropped unsent, it answers 503 (the work behind it
/// was lost: the writer stopped), or 500 while a panic unwinds.
pub struct Answer {
    out: Option<Arc<Outbound>>,
}

impl Answer {
    /// Writes the answer (keep-alive; only `POST`s are answered later).
    pub fn send(mut self, reply: Reply) {
        if let Some(fp) = reply.failpoint {
            crate::failpoint::hit(fp);
        }
        if let Some(out) = self.out.take() {
            out.write_answer(&serialize(reply, false, false));
        }
    }
}

impl Drop for Answer {
    fn drop(&mut self) {
        let Some(out) = self.out.take() else {
            return;
        };
        let reply = if std::thread::panicking() {
            crate::log::error("handler panicked", &[("effect", &"answered 500")]);
            Reply::error(500, "internal error")
        } else {
            Reply::unavailable("the request was not completed")
        };
        out.write_answer(&serialize(reply, false, false));
    }
}

struct Head {
    method: String,
    /// The target in origin form (an absolute-form target's path and query).
    target: String,
    headers: Vec<(String, String)>,
    content_length: Option<usize>,
    chunked: bool,
    keep_alive: bool,
    expect_continue: bool,
}

enum HeadError {
    /// The client went away or stalled before a whole request line.
    Closed,
    /// Answer this status and message, and close. `target` is the request
    /// line's target when that was read.
    Refused {
        status: u16,
        message: String,
        target: Option<String>,
    },
}

/// The target of a request head's first line, once that line is whole, in
/// origin form.
fn target_of(raw: &[u8]) -> Option<String> {
    let line = &raw[..raw.iter().position(|&b| b == b'\n')?];
    let line = std::str::from_utf8(line).ok()?;
    let target = line.split(' ').nth(1)?;
    origin_form(target)
}

/// An origin-form target as is; an absolute-form one (`http://host/path`)
/// as its path and query. None for anything else.
fn origin_form(target: &str) -> Option<String> {
    if target.starts_with('/') {
        return Some(target.to_string());
    }
    let (scheme, rest) = target.split_once("://")?;
    if !(scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https")) {
        return None;
    }
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(end);
    if authority.is_empty() || authority.contains('@') || !valid_host(authority) {
        return None;
    }
    if path.starts_with('#') {
        return None;
    }
    Some(if path.starts_with('/') {
        path.to_string()
    } else {
        format!("/{path}")
    })
}

/// `uri-host [ ":" port ]` (RFC 9110 7.2), or empty.
fn valid_host(v: &str) -> bool {
    let (host, port) = if let Some(rest) = v.strip_prefix('[') {
        let Some((inside, after)) = rest.split_once(']') else {
            return false;
        };
        if inside.is_empty()
            || !inside
                .bytes()
                .all(|b| b.is_ascii_hexdigit() || b == b':' || b == b'.')
        {
            return false;
        }
        match after.strip_prefix(':') {
            Some(port) => ("x", Some(port)),
            None if after.is_empty() => ("x", None),
            None => return false,
        }
    } else {
        match v.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (v, None),
        }
    };
    let reg_name = host
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=%".contains(&b));
    reg_name && port.is_none_or(|p| p.bytes().all(|b| b.is_ascii_digit()))
}

/// Writes bytes within the connection's write deadline.
fn write_out(conn: &mut Conn, bytes: &[u8]) -> io::Result<()> {
    let w = conn.get_mut();
    w.write_all(bytes)?;
    w.flush()
}

/// Why a read stopped.
#[derive(Debug, PartialEq, Eq)]
enum Stop {
    /// The peer closed the connection (or it broke).
    Eof,
    /// A deadline passed, or the request fell under the minimum rate.
    TimedOut,
    /// The line went past its byte budget.
    TooLong,
    /// The body would pass the budget of bodies in flight.
    Busy,
}

fn stop_of(e: &io::Error) -> Option<Stop> {
    match e.kind() {
        io::ErrorKind::Interrupted => None,
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => Some(Stop::TimedOut),
        _ => Some(Stop::Eof),
    }
}

/// Appends bytes up to and including the next `\n` to `out`, keeping `out`
/// within `max` bytes. (Deadlines are the socket's: [`Wire`].)
fn read_line<R: BufRead>(reader: &mut R, out: &mut Vec<u8>, max: usize) -> Result<(), Stop> {
    loop {
        let buf = match reader.fill_buf() {
            Ok([]) => return Err(Stop::Eof),
            Ok(b) => b,
            Err(e) => match stop_of(&e) {
                Some(stop) => return Err(stop),
                None => continue,
            },
        };
        let (take, done) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (buf.len(), false),
        };
        let room = max.saturating_sub(out.len());
        if take > room {
            out.extend_from_slice(&buf[..room]);
            reader.consume(room);
            return Err(Stop::TooLong);
        }
        out.extend_from_slice(&buf[..take]);
        reader.consume(take);
        if done {
            return Ok(());
        }
    }
}

/// The first allocation of a body, and its growth step: a body takes
/// memory as its bytes arrive, never its declared length up front.
const BODY_STEP: usize = 16 * 1024;

/// Appends exactly `n` bytes to `out`, copying out of the connection's
/// buffer and growing `out` as bytes arrive, each growth taken from
/// `budget`; on a stop, also says how many of the `n` arrived.
fn read_into<R: BufRead>(
    reader: &mut R,
    n: usize,
    out: &mut Vec<u8>,
    budget: &mut Budget<'_>,
) -> Result<(), (Stop, usize)> {
    let mut got = 0;
    while got < n {
        let buf = match reader.fill_buf() {
            Ok([]) => return Err((Stop::Eof, got)),
            Ok(b) => b,
            Err(e) => match stop_of(&e) {
                Some(stop) => return Err((stop, got)),
                None => continue,
            },
        };
        let take = buf.len().min(n - got);
        let needed = out.len() + take;
        if needed > out.capacity() {
            // Double, at least a step, at most what is still to come.
            let target = (out.capacity() * 2)
                .max(BODY_STEP)
                .min(out.len() + (n - got))
                .max(needed);
            let more = target - out.capacity();
            if !budget.take(more) {
                return Err((Stop::Busy, got));
            }
            out.reserve_exact(target - out.len());
        }
        out.extend_from_slice(&buf[..take]);
        reader.consume(take);
        got += take;
    }
    Ok(())
}

/// Reads and parses a request head, within the head size limit (and the
/// deadlines of the socket). Also returns the target as the request line
/// gave it... in origin form.
fn read_head<R: BufRead>(reader: &mut R, limits: &Limits) -> Result<(Head, String), HeadError> {
    let mut raw: Vec<u8> = Vec::with_capacity(1024);
    // Read lines until the empty line, bounded in bytes.
    loop {
        let before = raw.len();
        match read_line(reader, &mut raw, limits.max_head_bytes) {
            Ok(()) => {}
            Err(Stop::Eof | Stop::Busy) => return Err(HeadError::Closed),
            Err(Stop::TimedOut) if raw.is_empty() => return Err(HeadError::Closed),
            Err(Stop::TimedOut) => {
                return Err(HeadError::Refused {
                    status: 408,
                    message: "request head not received in time".into(),
                    target: target_of(&raw),
                });
            }
            Err(Stop::TooLong) => {
                let first_line_done = raw[..before].contains(&b'\n');
                let (status, message) = if first_line_done {
                    (431, "request headers too large")
                } else {
                    (414, "request target too long")
                };
                return Err(HeadError::Refused {
                    status,
                    message: message.into(),
                    target: target_of(&raw[..before]),
                });
            }
        }
        let line = &raw[before..];
        let is_blank = line == b"\r\n" || line == b"\n";
        if is_blank && before == 0 {
            // Stray CRLF between requests (RFC 9112 2.2): skip.
            raw.clear();
            continue;
        }
        if is_blank {
            break;
        }
    }
    let target = target_of(&raw);
    match parse_head(&raw, limits) {
        Ok(head) => {
            let target = head.target.clone();
            Ok((head, target))
        }
        Err((status, message)) => Err(HeadError::Refused {
            status,
            message,
            target,
        }),
    }
}

/// Methods the routes know (each answers 405 where it is not allowed);
/// any other method token is 501.
const KNOWN_METHODS: [&str; 8] = [
    "GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "TRACE", "PATCH",
];

/// The head (a request line, field lines and the blank line, as
/// `read_head` gathered it), or the status and message it is refused with.
/// `httparse` parses it; our rules on top: one space between the parts of
/// the request line, HTTP/1.0 or 1.1, a known method, an origin- or
/// absolute-form target, UTF-8 values, one valid `Host` (required on
/// HTTP/1.1), and unambiguous framing.
fn parse_head(raw: &[u8], limits: &Limits) -> Result<Head, (u16, String)> {
    let bad = |m: &str| (400, m.to_string());
    let line_end = raw.iter().position(|&b| b == b'\n').unwrap_or(raw.len());
    let request_line = &raw[..line_end];
    let request_line = request_line.strip_suffix(b"\r").unwrap_or(request_line);
    let request_line =
        std::str::from_utf8(request_line).map_err(|_| bad("request line is not UTF-8"))?;
    let mut parts = request_line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad("malformed request line"));
    };
    if method.is_empty() || !method.bytes().all(is_token) {
        return Err(bad("malformed method"));
    }
    let http11 = match version {
        "HTTP/1.1" => true,
        "HTTP/1.0" => false,
        v if v.strip_prefix("HTTP/").is_some_and(|n| {
            n.starts_with(|c: char| c.is_ascii_digit())
                && n.bytes().all(|b| b.is_ascii_digit() || b == b'.')
        }) =>
        {
            return Err((505, "only HTTP/1.0 and HTTP/1.1 are supported".into()));
        }
        _ => return Err(bad("malformed request line")),
    };
    if !KNOWN_METHODS.contains(&method) {
        return Err((501, format!("method {method} is not implemented")));
    }
    if target.len() > limits.max_target_bytes {
        return Err((414, "request target too long".into()));
    }
    if target.bytes().any(|b| b <= b' ' || b == 0x7f) {
        return Err(bad("malformed request target"));
    }
    let origin = if target == "*" && method == "OPTIONS" {
        "*".to_string()
    } else {
        origin_form(target).ok_or_else(|| bad("malformed request target"))?
    };

    let mut fields = vec![httparse::EMPTY_HEADER; limits.max_headers];
    let mut parsed = httparse::Request::new(&mut fields);
    match parsed.parse(raw) {
        Ok(httparse::Status::Complete(n)) if n == raw.len() => {}
        Ok(_) => return Err(bad("malformed request head")),
        Err(httparse::Error::TooManyHeaders) => {
            return Err((431, "too many request headers".into()));
        }
        Err(httparse::Error::HeaderValue) => {
            return Err(bad(
                "a header value contains a control character (NUL, CR, LF or another)",
            ));
        }
        Err(httparse::Error::HeaderName) => {
            return Err(bad(
                "malformed header name (folded header lines are not accepted)",
            ));
        }
        Err(httparse::Error::NewLine) => return Err(bad("malformed line ending in the head")),
        Err(e) => return Err(bad(&format!("malformed request head: {e}"))),
    }
    if parsed.method != Some(method) || parsed.path != Some(target) {
        return Err(bad("malformed request line"));
    }
    let mut headers: Vec<(String, String)> = Vec::with_capacity(parsed.headers.len());
    for field in parsed.headers.iter() {
        let value = std::str::from_utf8(field.value)
            .map_err(|_| bad(&format!("header {} is not valid UTF-8", field.name)))?;
        headers.push((
            field.name.to_string(),
            value.trim_matches([' ', '\t']).to_string(),
        ));
    }
    fn all<'h>(headers: &'h [(String, String)], name: &'h str) -> impl Iterator<Item = &'h str> {
        headers
            .iter()
            .filter(move |(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    let hosts: Vec<&str> = all(&headers, "host").collect();
    match hosts.as_slice() {
        [] if http11 => return Err(bad("missing Host header")),
        [] => {}
        [host] if valid_host(host) => {}
        [_] => return Err(bad("malformed Host header")),
        _ => return Err(bad("more than one Host header")),
    }
    let lengths: Vec<&str> = all(&headers, "content-length").collect();
    let content_length = match lengths.first() {
        None => None,
        Some(v) => {
            // 1*DIGIT (RFC 9110 8.6): no sign, no spaces, no hex.
            if v.is_empty() || v.len() > 19 || !v.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad("malformed Content-Length"));
            }
            let n: usize = v.parse().map_err(|_| bad("malformed Content-Length"))?;
            if lengths.iter().any(|other| other != v) {
                return Err(bad("conflicting Content-Length headers"));
            }
            Some(n)
        }
    };
    let te: Vec<&str> = all(&headers, "transfer-encoding").collect();
    let chunked = match te.as_slice() {
        [] => false,
        [one] if one.eq_ignore_ascii_case("chunked") => true,
        _ => {
            return Err((501, "only Transfer-Encoding: chunked is supported".into()));
        }
    };
    if chunked && content_length.is_some() {
        return Err(bad("both Content-Length and Transfer-Encoding"));
    }
    let connection = all(&headers, "connection")
        .collect::<Vec<_>>()
        .join(",")
        .to_ascii_lowercase();
    // An HTTP/1.0 message with Transfer-Encoding has faulty framing: the
    // connection closes after it (RFC 9112 6.1).
    let keep_alive = if http11 {
        !connection.split(',').any(|t| t.trim() == "close")
    } else {
        !chunked && connection.split(',').any(|t| t.trim() == "keep-alive")
    };
    // No 100 Continue to an HTTP/1.0 client (RFC 9110 10.1.1).
    let expect_continue =
        http11 && all(&headers, "expect").any(|v| v.eq_ignore_ascii_case("100-continue"));
    Ok(Head {
        method: method.to_string(),
        target: origin,
        content_length,
        chunked,
        keep_alive,
        expect_continue,
        headers,
    })
}

fn is_token(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Reads the body, up to `max` bytes.
fn read_body<R: BufRead>(
    reader: &mut R,
    head: &Head,
    max: usize,
    budget: &mut Budget<'_>,
) -> Result<Vec<u8>, BodyError> {
    if head.chunked {
        return read_chunked(reader, max, budget);
    }
    let Some(expected) = head.content_length else {
        return Ok(Vec::new());
    };
    if expected > max {
        return Err(BodyError::TooLarge);
    }
    let mut body = Vec::new();
    match read_into(reader, expected, &mut body, budget) {
        Ok(()) => Ok(body),
        Err((Stop::TimedOut, _)) => Err(BodyError::Problem(BodyProblem::TimedOut)),
        Err((Stop::Busy, _)) => Err(BodyError::Busy),
        Err((_, got)) => Err(BodyError::Problem(BodyProblem::Short { expected, got })),
    }
}

/// Most trailer lines accepted after a chunked body.
const MAX_TRAILERS: usize = 32;

/// A chunked body (RFC 9112 7.1), up to `max` bytes. Strict: every line
/// ends with CRLF; a size is hex digits only; whitespace only around the
/// `;` and `=` of extensions, which are tokens or quoted strings (no
/// control characters); trailers are field lines.
fn read_chunked<R: BufRead>(
    reader: &mut R,
    max: usize,
    budget: &mut Budget<'_>,
) -> Result<Vec<u8>, BodyError> {
    let bad = |m: String| BodyError::Problem(BodyProblem::BadChunk(m));
    let stopped = |stop: Stop, got: usize, what: &str| match stop {
        Stop::TimedOut => BodyError::Problem(BodyProblem::TimedOut),
        Stop::Eof => BodyError::Problem(BodyProblem::Short {
            expected: got + 1,
            got,
        }),
        Stop::TooLong => bad(format!("{what} too long")),
        Stop::Busy => BodyError::Busy,
    };
    let mut body = Vec::new();
    loop {
        let mut size_line = Vec::new();
        read_line(reader, &mut size_line, 1024)
            .map_err(|s| stopped(s, body.len(), "chunk size line"))?;
        let size = chunk_size(&size_line).map_err(bad)?;
        if size == 0 {
            read_trailers(reader).map_err(|e| match e {
                Ok(stop) => stopped(stop, body.len(), "trailer line"),
                Err(m) => bad(m),
            })?;
            return Ok(body);
        }
        if size > max - body.len().min(max) {
            // This chunk takes the body past the limit: 413 now, without
            // waiting for (or reading) its bytes.
            return Err(BodyError::TooLarge);
        }
        let start = body.len();
        read_into(reader, size, &mut body, budget)
            .map_err(|(s, got)| stopped(s, start + got, "chunk"))?;
        let mut crlf = [0u8; 2];
        for b in &mut crlf {
            *b = read_byte(reader).map_err(|s| stopped(s, body.len(), "chunk"))?;
        }
        if &crlf != b"\r\n" {
            return Err(bad("chunk not followed by CRLF".into()));
        }
    }
}

fn read_byte<R: BufRead>(reader: &mut R) -> Result<u8, Stop> {
    loop {
        match reader.fill_buf() {
            Ok([]) => return Err(Stop::Eof),
            Ok(b) => {
                let byte = b[0];
                reader.consume(1);
                return Ok(byte);
            }
            Err(e) => {
                if let Some(stop) = stop_of(&e) {
                    return Err(stop);
                }
            }
        }
    }
}

/// The size of a chunk from its size line (CRLF included):
/// `1*HEXDIG *( BWS ";" BWS token [ BWS "=" BWS ( token / quoted-string ) ] ) CRLF`.
fn chunk_size(line: &[u8]) -> Result<usize, String> {
    let line = line
        .strip_suffix(b"\r\n")
        .ok_or_else(|| "chunk size line not ended by CRLF".to_string())?;
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 {
        return Err(format!(
            "bad chunk size {:?}",
            String::from_utf8_lossy(&line[..line.len().min(32)])
        ));
    }
    let mut size: usize = 0;
    for &d in &line[..digits] {
        let v = (d as char).to_digit(16).unwrap_or(0) as usize;
        size = size
            .checked_mul(16)
            .and_then(|s| s.checked_add(v))
            .ok_or_else(|| "chunk size too large".to_string())?;
    }
    chunk_extensions(&line[digits..])?;
    Ok(size)
}

fn skip_ws(s: &[u8], mut i: usize) -> usize {
    while i < s.len() && (s[i] == b' ' || s[i] == b'\t') {
        i += 1;
    }
    i
}

fn token_end(s: &[u8], mut i: usize) -> usize {
    while i < s.len() && is_token(s[i]) {
        i += 1;
    }
    i
}

/// Checks `*( BWS ";" BWS name [ BWS "=" BWS value ] )`.
fn chunk_extensions(s: &[u8]) -> Result<(), String> {
    let bad = || "malformed chunk extension".to_string();
    let mut i = 0;
    loop {
        let j = skip_ws(s, i);
        if j == s.len() {
            // Whitespace only before a `;`.
            return if j == i { Ok(()) } else { Err(bad()) };
        }
        if s[j] != b';' {
            return Err(bad());
        }
        let name_start = skip_ws(s, j + 1);
        let name_end = token_end(s, name_start);
        if name_end == name_start {
            return Err(bad());
        }
        i = name_end;
        let k = skip_ws(s, i);
        if k < s.len() && s[k] == b'=' {
            let v = skip_ws(s, k + 1);
            if v < s.len() && s[v] == b'"' {
                i = quoted_string_end(s, v).ok_or_else(bad)?;
            } else {
                let e = token_end(s, v);
                if e == v {
                    return Err(bad());
                }
                i = e;
            }
        }
    }
}

/// The index just past the quoted string that starts at `s[start]`.
fn quoted_string_end(s: &[u8], start: usize) -> Option<usize> {
    let qdtext = |b: u8| {
        b == b'\t'
            || b == b' '
            || b == 0x21
            || (0x23..=0x7e).contains(&b) && b != b'\\'
            || b >= 0x80
    };
    let mut i = start + 1;
    while i < s.len() {
        match s[i] {
            b'"' => return Some(i + 1),
            b'\\' => {
                let escaped = *s.get(i + 1)?;
                if !(escaped == b'\t' || (0x20..=0x7e).contains(&escaped) || escaped >= 0x80) {
                    return None;
                }
                i += 2;
            }
            b if qdtext(b) => i += 1,
            _ => return None,
        }
    }
    None
}

/// The trailer section: field lines ended by CRLF, up to a blank line.
/// `Err(Ok(stop))` when the read stopped, `Err(Err(why))` when malformed.
fn read_trailers<R: BufRead>(reader: &mut R) -> Result<(), Result<Stop, String>> {
    for _ in 0..=MAX_TRAILERS {
        let mut t = Vec::new();
        read_line(reader, &mut t, 8 * 1024).map_err(Ok)?;
        let line = t
            .strip_suffix(b"\r\n")
            .ok_or_else(|| Err("trailer line not ended by CRLF".to_string()))?;
        if line.is_empty() {
            return Ok(());
        }
        if !field_line(line) {
            return Err(Err("malformed trailer line".into()));
        }
    }
    Err(Err(format!("more than {MAX_TRAILERS} trailer lines")))
}

/// `field-name ":" OWS field-value OWS` (RFC 9112 5), without its CRLF.
fn field_line(line: &[u8]) -> bool {
    let name_end = token_end(line, 0);
    name_end > 0
        && line.get(name_end) == Some(&b':')
        && line[name_end + 1..]
            .iter()
            .all(|&b| b == b'\t' || (0x20..=0x7e).contains(&b) || b >= 0x80)
}

/// The head parser and the chunked decoder on bytes, for the fuzz target
/// (not part of the API).
#[doc(hidden)]
pub mod fuzzing {
    use super::*;

    /// A parsed head: the method, the target as sent and in origin form,
    /// the fields, and how many bytes of `input` the head took.
    pub struct ParsedHead {
        pub method: String,
        pub raw_target: String,
        pub target: String,
        pub headers: Vec<(String, String)>,
        pub consumed: usize,
        pub chunked: bool,
        pub content_length: Option<usize>,
    }

    /// Reads one head off `input` as a connection would; the status it
    /// would be refused with otherwise (0: the input ended first).
    pub fn parse_head(input: &[u8], limits: &Limits) -> Result<ParsedHead, u16> {
        let mut reader = input;
        let (head, _) = match read_head(&mut reader, limits) {
            Ok(h) => h,
            Err(HeadError::Closed) => return Err(0),
            Err(HeadError::Refused { status, .. }) => return Err(status),
        };
        let consumed = input.len() - reader.len();
        let first = input[..consumed]
            .split(|&b| b == b'\n')
            .find(|l| !l.is_empty() && *l != b"\r")
            .unwrap_or_default();
        let raw_target = String::from_utf8_lossy(first)
            .split(' ')
            .nth(1)
            .unwrap_or_default()
            .to_string();
        Ok(ParsedHead {
            method: head.method,
            raw_target,
            target: head.target,
            headers: head.headers,
            consumed,
            chunked: head.chunked,
            content_length: head.content_length,
        })
    }

    /// Decodes a chunked body off `input`: the body and how many bytes it
    /// took, or why it is refused ("too large" past `max`).
    pub fn decode_chunked(input: &[u8], max: usize) -> Result<(Vec<u8>, usize), String> {
        let pool = AtomicUsize::new(0);
        let mut budget = Budget {
            pool: &pool,
            limit: usize::MAX,
            held: 0,
        };
        let mut reader = input;
        match read_chunked(&mut reader, max, &mut budget) {
            Ok(body) => Ok((body, input.len() - reader.len())),
            Err(e) => Err(format!("{e:?}")),
        }
    }
}

/// The response bytes: status line, headers, body.
fn serialize(reply: Reply, head_only: bool, close: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(256 + reply.body.len());
    let _ = write!(
        out,
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\n",
        reply.status,
        reason(reply.status),
        reply.content_type,
        reply.body.len()
    );
    for (name, value) in &reply.headers {
        if name.eq_ignore_ascii_case("connection") {
            continue;
        }
        if value.bytes().any(|b| b == b'\r' || b == b'\n') {
            continue;
        }
        let _ = write!(out, "{name}: {value}\r\n");
    }
    out.extend_from_slice(if close {
        b"Connection: close\r\n\r\n"
    } else {
        b"Connection: keep-alive\r\n\r\n"
    });
    if !head_only {
        out.extend_from_slice(&reply.body);
    }
    out
}

fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        204 => "No Content",
        301 => "Moved Permanently",
        302 => "Found",
        304 => "Not Modified",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        410 => "Gone",
        411 => "Length Required",
        413 => "Content Too Large",
        414 => "URI Too Long",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        505 => "HTTP Version Not Supported",
        _ => "",
    }
}

/// A counting semaphore for processing permits.
struct Semaphore {
    free: Mutex<usize>,
    cv: Condvar,
}

/// One of `http_workers` processing permits, held while a request is
/// verified and parsed. A handler that then only waits (for the writer's
/// commit) gives it back early with [`Permit::release`], so waiting requests
/// do not cap how many claims share one group commit.
pub struct Permit(Option<Arc<Semaphore>>);

impl Semaphore {
    fn new(n: usize) -> Semaphore {
        Semaphore {
            free: Mutex::new(n),
            cv: Condvar::new(),
        }
    }

    fn acquire(self: &Arc<Self>) -> Permit {
        let mut free = match self.free.lock() {
            Ok(f) => f,
            Err(p) => p.into_inner(),
        };
        while *free == 0 {
            free = match self.cv.wait(free) {
                Ok(f) => f,
                Err(p) => p.into_inner(),
            };
        }
        *free -= 1;
        Permit(Some(self.clone()))
    }
}

impl Permit {
    /// Gives the permit back now rather than when the request is answered.
    pub fn release(&mut self) {
        if let Some(sem) = self.0.take() {
            let mut free = match sem.free.lock() {
                Ok(f) => f,
                Err(p) => p.into_inner(),
            };
            *free += 1;
            sem.cv.notify_one();
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connected pair on 127.0.0.1: the server side as a connection's
    /// `Outbound` and reader, and the client.
    fn connected() -> (Arc<Outbound>, Conn, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        let socket = Arc::new(server);
        let conn = Arc::new(ConnState::new(0));
        let out = Arc::new(Outbound {
            socket: socket.clone(),
            state: Mutex::new(OutState::default()),
            settled: Condvar::new(),
            answer_timeout: Duration::from_secs(10),
            conn: conn.clone(),
        });
        let reader: Conn = BufReader::new(Io::Plain(Wire {
            socket,
            state: conn,
        }));
        (out, reader, client)
    }

    /// The answer thread never blocks on a client that does not read: what
    /// the socket cannot take at once is left, and the connection's thread
    /// sends it before anything else, so the client gets every answer, in
    /// order.
    #[test]
    fn what_a_non_blocking_answer_leaves_is_sent_in_order_by_the_connection_thread() {
        let (out, mut reader, client) = connected();
        rustix::net::sockopt::set_socket_send_buffer_size(&out.socket, 4096).unwrap();
        const CHUNK: usize = 16 * 1024;
        let mut chunks = 0;
        while locked(&out.state).rest.is_empty() {
            assert!(chunks < 4096, "the socket never pushed back");
            let (answer, promised) = Later { out: out.clone() }.promise();
            assert!(promised.later && locked(&out.state).promised);
            let mut reply = Reply::text(200, "text/plain", String::new());
            reply.body = vec![b'a' + (chunks % 26) as u8; CHUNK];
            answer.send(reply);
            chunks += 1;
        }
        assert!(!locked(&out.state).promised, "written (in part): settled");
        let reading = std::thread::spawn(move || {
            let mut all = Vec::new();
            (&client).read_to_end(&mut all).map(|_| all)
        });
        assert!(out.settle(&mut reader), "the rest was sent");
        assert!(locked(&out.state).rest.is_empty());
        let _ = out.socket.shutdown(Shutdown::Write);
        let all = reading.join().unwrap().unwrap();
        let bodies: Vec<u8> = all
            .split(|&b| b == b'\n')
            .filter(|line| line.len() >= CHUNK)
            .map(|line| line[0])
            .collect();
        let expected: Vec<u8> = (0..chunks).map(|i| b'a' + (i % 26) as u8).collect();
        assert_eq!(bodies.len(), chunks, "every answer arrived whole");
        assert_eq!(bodies, expected, "in order");
    }

    /// A handler that panics after promising an answer: the promise answers
    /// 500 as it unwinds and the server writes nothing more, so the next
    /// request on the connection gets its own answer.
    #[test]
    fn a_panic_after_a_promise_is_answered_once() {
        let handler: Box<Handler> = Box::new(|rq: &mut Request| {
            if rq.method == "POST" {
                let promise = rq.later.take().map(Later::promise);
                assert!(promise.is_some(), "a keep-alive POST is offered a promise");
                panic!("a bug after the promise");
            }
            Reply::text(200, "text/plain", "second".into())
        });
        let server = Server::bind(
            "127.0.0.1:0",
            limits(),
            None,
            handler,
            Box::new(|_, _, _, _| {}),
        )
        .unwrap();
        let mut client = TcpStream::connect(server.addr()).unwrap();
        client
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        client
            .write_all(b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\n{}")
            .unwrap();
        let mut first = vec![0u8; 4096];
        let n = client.read(&mut first).unwrap();
        let first = String::from_utf8_lossy(&first[..n]).into_owned();
        client
            .write_all(b"GET /y HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut rest = String::new();
        client.read_to_string(&mut rest).unwrap();
        server.stop(Duration::from_secs(1));
        let all = first + &rest;
        assert!(
            all.starts_with("HTTP/1.1 500 ")
                && all.matches("HTTP/1.1 ").count() == 2
                && all.ends_with("second"),
            "a 500, then the GET's own answer, and nothing else: {all}"
        );
    }

    /// A promise dropped unkept (the writer stopped) still answers: 503.
    #[test]
    fn a_promised_answer_dropped_unsent_answers_503() {
        let (out, mut reader, client) = connected();
        let (answer, _) = Later { out: out.clone() }.promise();
        drop(answer);
        assert!(out.settle(&mut reader));
        let _ = out.socket.shutdown(Shutdown::Write);
        let mut got = String::new();
        (&client).read_to_string(&mut got).unwrap();
        assert!(
            got.starts_with("HTTP/1.1 503 ") && got.contains("Retry-After: 1"),
            "{got}"
        );
    }

    fn limits() -> Limits {
        let t = Duration::from_secs(10);
        Limits::new(2, 1024, 16, t, t, t)
    }

    /// The head with a `Host` field after its request line, unless it
    /// has one.
    fn with_host(raw: &str) -> String {
        if raw.to_ascii_lowercase().contains("\nhost:") {
            return raw.to_string();
        }
        match raw.split_once("\r\n") {
            Some((line, rest)) => format!("{line}\r\nHost: x\r\n{rest}"),
            None => raw.to_string(),
        }
    }

    fn parse(raw: &str) -> Result<Head, u16> {
        parse_head(with_host(raw).as_bytes(), &limits()).map_err(|(status, _)| status)
    }

    #[test]
    fn parses_a_plain_request() {
        let h =
            parse("POST /hooks/a?x=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n").unwrap();
        assert_eq!(h.method, "POST");
        assert_eq!(h.target, "/hooks/a?x=1");
        assert_eq!(h.content_length, Some(5));
        assert!(h.keep_alive);
        assert!(!h.chunked);
    }

    #[test]
    fn refuses_ambiguous_framing() {
        assert_eq!(
            parse("POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n").err(),
            Some(400)
        );
        assert_eq!(
            parse("POST / HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n")
                .err(),
            Some(400)
        );
        assert_eq!(
            parse("POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n").err(),
            Some(501)
        );
        assert_eq!(
            parse("POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n").err(),
            Some(400)
        );
    }

    #[test]
    fn refuses_bad_heads() {
        assert_eq!(parse("POST / HTTP/2.0\r\n\r\n").err(), Some(505));
        assert_eq!(parse("POST /\r\n\r\n").err(), Some(400));
        assert_eq!(
            parse("POST / HTTP/1.1\r\nBad Name: x\r\n\r\n").err(),
            Some(400)
        );
        assert_eq!(parse("POST / HTTP/1.1\r\nX: a\0b\r\n\r\n").err(), Some(400));
        assert_eq!(parse("POST / HTTP/1.1\r\n folded\r\n\r\n").err(), Some(400));
        let long = format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(5000));
        assert_eq!(parse(&long).err(), Some(414));
        let many: String = (0..200).map(|i| format!("X-{i}: v\r\n")).collect();
        assert_eq!(
            parse(&format!("GET / HTTP/1.1\r\n{many}\r\n")).err(),
            Some(431)
        );
    }

    #[test]
    fn chunk_size_lines_are_strict() {
        assert_eq!(chunk_size(b"1a\r\n"), Ok(26));
        assert_eq!(chunk_size(b"5 ;a=b ; c = \"d\\\"e\"\r\n"), Ok(5));
        for bad in [
            &b"5\n"[..],
            b"5 \r\n",
            b"\r\n",
            b"5;\r\n",
            b"5;a=\x01\r\n",
            b"5;a=\"x\r\n",
            b"5\x0b\r\n",
            b"\x0c5\r\n",
            b"5\r;a\r\n",
            b"fffffffffffffffffffff\r\n",
        ] {
            assert!(
                chunk_size(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn control_characters_in_values_are_refused() {
        for c in ["\r", "\x01", "\x0b", "\x1b", "\x7f"] {
            assert_eq!(
                parse(&format!("GET / HTTP/1.1\r\nX: a{c}b\r\n\r\n")).err(),
                Some(400),
                "{c:?}"
            );
        }
        assert!(parse("GET / HTTP/1.1\r\nX: a\tb \r\n\r\n").is_ok());
    }

    #[test]
    fn connection_semantics() {
        assert!(
            !parse("GET / HTTP/1.1\r\nConnection: close\r\n\r\n")
                .unwrap()
                .keep_alive
        );
        assert!(!parse("GET / HTTP/1.0\r\n\r\n").unwrap().keep_alive);
        assert!(
            parse("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
                .unwrap()
                .keep_alive
        );
    }
}
