//! The HTTP/1.1 server: one thread per connection, with deadlines, limits
//! and caps on connections, so slow or idle clients cannot starve
//! deliveries (tiny_http 0.12 has no socket timeouts and can leave a new
//! connection queued behind long-lived ones, so a provider that opens
//! several connections at once would see timeouts).
//!
//! A connection thread reads a request's head and whole body itself,
//! under deadlines, before it asks for one of `http_workers` processing
//! permits; so a slow sender holds only its own thread, never a worker.
//! Every deadline is kept below TLS, on the socket's own reads and writes
//! ([`Wire`]): a deadline holds inside a TLS record and through the
//! handshake, and a request that falls under `min_receive_rate` bytes a
//! second over the last two seconds (after its first two) is let go. Each
//! connection holds one file descriptor. Heads are parsed with `httparse`,
//! with our own framing rules on top; bodies are read as their bytes
//! arrive, never allocated from a declared size, and the bodies being
//! received share one memory budget, of which one address may take only
//! its share; a body's memory is counted before it is allocated and a
//! while after it is freed. A body over `max_body_bytes` is answered 413 without
//! being read, and the rest of it is drained for a moment so that a
//! sender that writes before it reads still gets the answer.
//!
//! Caps: `max_connections` open connections in all, and
//! `max_connections_per_address` from one address (an IPv6 /64). Past the
//! first, the oldest connection idle for a second or more, else the
//! slowest request still being received, is let go to make room; past
//! the second, or when there is no one to let go, a new connection is
//! answered 503 (in TLS on a TLS listener), past the second after being
//! held a while in a bounded queue, of which each address is sure of its
//! share (past it: closed at once). Every connection dropped
//! without its answer is logged.
//!
//! A handler may answer after it returns ([`Later`]): a webhook's answer
//! waits for a group commit, and instead of sleeping until then and again
//! until the next request, the connection thread goes straight back to
//! reading while the answer thread writes the answer. Answers stay in
//! order: the thread waits for a promised answer before it handles the
//! next request on the same connection, and before it closes.
//!
//! A refused request's connection is answered, half-closed and handed to
//! the one lingering thread, which drains what the client still sends for
//! a moment; its own thread ends at once, so a flood of refused senders
//! does not hold a thread each.
//!
//! The files: `accept.rs` (the acceptor, the caps, eviction, the tarpit),
//! `connection.rs` (a connection's thread: requests one after another),
//! `linger.rs` (the lingering thread),
//! `wire.rs` (a connection's state and deadlines, its socket below TLS),
//! `head.rs` (request heads), `body.rs` (bodies: Content-Length or the
//! chunked coding), `read.rs` (reading lines and bytes under the limits,
//! the body budget), `later.rs` (answers written by the answer thread),
//! `response.rs` (an answer's bytes), `permit.rs` (processing permits),
//! `fuzzing.rs` (the parsers on bytes, for the fuzz target).

use std::collections::HashMap;
use std::io::{self, BufReader, Read};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::reply::Reply;

mod accept;
mod body;
mod connection;
#[doc(hidden)]
pub mod fuzzing;
mod head;
mod later;
mod linger;
mod permit;
mod read;
mod response;
mod wire;

use accept::{Held, HeldPlace, accept_loop, listen_on, tarpit_loop, tarpit_size};
pub use later::{Later, Promise};
pub use permit::Permit;
use permit::Semaphore;
use read::BodyPool;
use wire::{ConnState, Io};

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
    /// Bytes a second a request must keep up, head and body together,
    /// once it has been sending for [`RATE_GRACE`], judged over the last
    /// [`RATE_WINDOW`]; 0: no minimum.
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
    /// The part of it the bodies from one address (an IPv6 /64) may take;
    /// past it, that address's bodies are answered 503.
    pub max_body_bytes_per_address: usize,
}

/// How long a request may send at any rate before `min_receive_rate`
/// applies: its first packets, and a client's slow start.
pub const RATE_GRACE: Duration = Duration::from_secs(2);
const RATE_GRACE_US: i64 = 2_000_000;

/// The window `min_receive_rate` is judged over: bytes received keep a
/// request going for at most this long ahead, so one that stalls after a
/// fast start is let go this long after its last byte (not once its
/// average from the start has fallen under the rate).
pub const RATE_WINDOW: Duration = Duration::from_secs(2);
const RATE_WINDOW_US: i64 = 2_000_000;

/// How many bodies of `max_body_bytes` may be in flight at once, at most.
pub const BODIES_IN_FLIGHT: usize = 64;

/// One address (an IPv6 /64) may hold at most 1/`ADDRESS_SHARES` of the
/// bodies' budget, and of the queue of connections held back at their
/// address's cap (when there is a per-address cap).
pub const ADDRESS_SHARES: usize = 4;

impl Limits {
    /// The fixed parse limits with the configurable ones given: the
    /// defaults of those live in one place, `config/parse.rs`. No per-address
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
            max_body_bytes_per_address: max_body_bytes.saturating_mul(BODIES_IN_FLIGHT),
        }
    }

    /// With a cap on connections from one address and a minimum rate.
    /// With a cap below `max_connections`, one address also gets only its
    /// share of the bodies' budget ([`ADDRESS_SHARES`]); without one (all
    /// clients behind one proxy), the whole of it.
    pub fn per_address(mut self, max_connections: usize, min_receive_rate: u64) -> Limits {
        self.max_connections_per_address = max_connections.max(1);
        self.min_receive_rate = min_receive_rate;
        self.max_body_bytes_per_address = if self.max_connections_per_address < self.max_connections
        {
            (self.max_body_bytes_in_flight / ADDRESS_SHARES).max(self.max_body_bytes)
        } else {
            self.max_body_bytes_in_flight
        };
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
    /// The memory of bodies being received, in all and by address.
    bodies: Arc<BodyPool>,
    /// Threads answering 503 at a cap.
    refusing: AtomicUsize,
    /// Connections past a per-address cap, held a while before their 503.
    tarpit: std::sync::mpsc::SyncSender<Held>,
    /// Refused connections handed to the lingering thread.
    lingering: std::sync::mpsc::SyncSender<linger::Lingering>,
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
    /// Connections held back at their address's cap (in the tarpit), by
    /// their place, and how many by address.
    held: HashMap<u64, HeldPlace>,
    held_per_address: HashMap<IpAddr, usize>,
    /// By address, connections closed at once because the address had
    /// its share of the held queue: when that was last logged, and how
    /// many since.
    closed_at_once: HashMap<IpAddr, (i64, u64)>,
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

static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

/// Milliseconds on a monotonic clock (from the first call).
fn mono_ms() -> i64 {
    i64::try_from(START.get_or_init(Instant::now).elapsed().as_millis()).unwrap_or(i64::MAX)
}

/// Microseconds on the same clock as [`mono_ms`].
fn mono_us() -> i64 {
    i64::try_from(START.get_or_init(Instant::now).elapsed().as_micros()).unwrap_or(i64::MAX)
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
    // Each listener holds up to max_connections connections, as many
    // again (at most 1024) in its tarpit, and those being refused and the
    // one being accepted.
    let per_listener = (free / listeners.max(1)).saturating_sub(MAX_REFUSING + 1);
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
        // Each socket handed over keeps its connection's slot.
        let most_lingering = limits.max_connections;
        let (lingering, to_drain) = std::sync::mpsc::sync_channel(most_lingering);
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            tls,
            permits: Arc::new(Semaphore::new(limits.workers.max(1))),
            bodies: Arc::new(BodyPool::new(
                limits.max_body_bytes_in_flight,
                limits.max_body_bytes_per_address,
            )),
            limits,
            handler,
            refused,
            next_id: AtomicU64::new(0),
            open: Mutex::new(Open::default()),
            drained: Condvar::new(),
            refusing: AtomicUsize::new(0),
            tarpit,
            lingering,
        });
        let weak = Arc::downgrade(&shared);
        std::thread::Builder::new()
            .name("idemhook-tarpit".into())
            .stack_size(128 * 1024)
            .spawn(move || tarpit_loop(&held, &weak))?;
        let weak = Arc::downgrade(&shared);
        std::thread::Builder::new()
            .name("idemhook-linger".into())
            .stack_size(256 * 1024)
            .spawn(move || linger::linger_loop(&to_drain, &weak, most_lingering))?;
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
