//! The HTTP/1.1 server: one thread per connection, with timeouts, limits
//! and a cap on connections, so slow or idle clients cannot starve
//! deliveries (tiny_http 0.12 has no socket timeouts and can leave a new
//! connection queued behind long-lived ones; see NOTES.md).
//!
//! A connection thread reads a request's head and whole body itself, under
//! read timeouts, before it asks for one of `http_workers` processing
//! permits; so a slow sender holds only its own thread, never a worker.
//! Bodies are read up to `max_body_bytes` + 1 and no further: a larger
//! declared or chunked body is answered 413 and the connection closed.
//!
//! A handler may answer after it returns ([`Later`]): a webhook's answer
//! waits for a group commit, and instead of sleeping until then and again
//! until the next request, the connection thread goes straight back to
//! reading while the answer thread writes the answer. Answers stay in
//! order: the thread waits for a promised answer before it handles the
//! next request on the same connection, and before it closes.

use std::collections::HashMap;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::reply::Reply;

/// What a connection reads and writes: plain TCP or TLS over it.
trait Stream: Read + Write + Send {}
impl<T: Read + Write + Send> Stream for T {}

type Conn = BufReader<Box<dyn Stream>>;

/// Limits of the HTTP server.
#[derive(Debug, Clone)]
pub struct Limits {
    /// The most open connections; more are answered 503 and closed.
    pub max_connections: usize,
    /// Requests processed at once (verify, claim); reading is not counted.
    pub workers: usize,
    /// Time to receive a whole request head once its first byte arrived.
    pub header_timeout: Duration,
    /// Time a keep-alive connection may sit idle between requests.
    pub idle_timeout: Duration,
    /// Time to receive a whole body.
    pub body_timeout: Duration,
    pub max_head_bytes: usize,
    pub max_headers: usize,
    pub max_target_bytes: usize,
    pub max_body_bytes: usize,
}

impl Limits {
    /// The fixed parse limits with the configurable ones given: the
    /// defaults of those live in one place, `config.rs`.
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
            workers,
            header_timeout,
            idle_timeout,
            body_timeout,
            max_head_bytes: 32 * 1024,
            max_headers: 100,
            max_target_bytes: 4096,
            max_body_bytes,
        }
    }
}

/// A request read off the wire, body included.
pub struct Request {
    pub method: String,
    pub target: String,
    pub headers: Vec<(String, String)>,
    pub remote: SocketAddr,
    pub content_length: Option<usize>,
    /// The body, at most `max_body_bytes` + 1 bytes (one more means "too
    /// large"), or why it could not be read.
    pub body: Result<Vec<u8>, BodyProblem>,
    /// The processing permit this request holds.
    pub permit: Permit,
    /// The right to answer after the handler returns; offered on plain
    /// (not TLS) keep-alive connections whose request was read whole.
    pub later: Option<Later>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BodyProblem {
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

/// Told of a request refused while its head was read (malformed framing,
/// a head over a limit, an unsupported version or encoding), before the
/// handler could see it: its target when the request line was read, the
/// client's address, and the status and message it is answered with.
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
    active: AtomicUsize,
    next_id: AtomicU64,
    /// Each open connection, by the order it was accepted.
    open: Mutex<HashMap<u64, Registered>>,
    drained: Condvar,
}

/// An open connection as the acceptor and `stop` see it.
struct Registered {
    /// A second handle on its socket, to end its read.
    socket: TcpStream,
    /// Whether it is in the middle of a request, and since when it waits.
    state: Arc<ConnState>,
    /// Its read was ended to make room for a new connection.
    evicted: bool,
}

/// What a connection's thread tells the acceptor and `stop`.
struct ConnState {
    /// In the middle of a request (from its first byte to its answer).
    in_request: AtomicBool,
    /// When it last started waiting for a request ([`mono_ms`]).
    idle_since: AtomicI64,
}

/// How long a connection must have waited for a request before it may be
/// let go to make room: a client that just connected gets time to send.
const EVICTABLE_AFTER_MS: i64 = 1_000;

/// Milliseconds on a monotonic clock (from the first call).
fn mono_ms() -> i64 {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    i64::try_from(START.get_or_init(Instant::now).elapsed().as_millis()).unwrap_or(i64::MAX)
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
        let listener = TcpListener::bind(listen)?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            tls,
            permits: Arc::new(Semaphore::new(limits.workers.max(1))),
            limits,
            handler,
            refused,
            active: AtomicUsize::new(0),
            next_id: AtomicU64::new(0),
            open: Mutex::new(HashMap::new()),
            drained: Condvar::new(),
        });
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
        if let Ok(open) = self.shared.open.lock() {
            for r in open.values() {
                if !r.state.in_request.load(Ordering::SeqCst) {
                    let _ = r.socket.shutdown(Shutdown::Read);
                }
            }
        }
        let deadline = Instant::now() + grace;
        if let Ok(mut open) = self.shared.open.lock() {
            while !open.is_empty() {
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
}

fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>) {
    for stream in listener.incoming() {
        if shared.stop.load(Ordering::SeqCst) {
            break;
        }
        let stream = match stream {
            Ok(s) => s,
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                crate::log::warn("accept failed", &[("error", &e)]);
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        if shared.active.load(Ordering::SeqCst) >= shared.limits.max_connections
            && !evict_an_idle_connection(shared)
        {
            let mut stream = stream;
            let _ = stream.set_write_timeout(Some(Duration::from_secs(1)));
            let reply = Reply::error(503, "too many connections, retry later").retry_after();
            let _ = stream.write_all(&serialize(reply, false, true));
            continue;
        }
        let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
        let Ok(registered) = stream.try_clone() else {
            continue;
        };
        let state = Arc::new(ConnState {
            in_request: AtomicBool::new(false),
            idle_since: AtomicI64::new(mono_ms()),
        });
        if let Ok(mut open) = shared.open.lock() {
            open.insert(
                id,
                Registered {
                    socket: registered,
                    state: state.clone(),
                    evicted: false,
                },
            );
        }
        shared.active.fetch_add(1, Ordering::SeqCst);
        let s = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("idemhook-conn".into())
            .stack_size(256 * 1024)
            .spawn(move || {
                // Gives the slot back however the thread ends, panics included.
                let _slot = Slot(&s, id);
                serve_connection(stream, &s, &state);
            });
        if spawned.is_err() {
            finish(shared, id);
        }
    }
}

/// At the connection cap, makes room by ending the read of the oldest
/// connection that has waited a second or more for a request (one that
/// never sent a byte, or a keep-alive connection between requests): idle
/// sockets must not keep deliveries out. A promised answer on it is still
/// written. False when no connection has waited that long.
fn evict_an_idle_connection(shared: &Shared) -> bool {
    let Ok(mut open) = shared.open.lock() else {
        return false;
    };
    let now = mono_ms();
    let oldest_idle = open
        .iter()
        .filter(|(_, r)| {
            !r.evicted
                && !r.state.in_request.load(Ordering::SeqCst)
                && now - r.state.idle_since.load(Ordering::SeqCst) >= EVICTABLE_AFTER_MS
        })
        .map(|(id, _)| *id)
        .min();
    let Some(r) = oldest_idle.and_then(|id| open.get_mut(&id)) else {
        return false;
    };
    r.evicted = true;
    let _ = r.socket.shutdown(Shutdown::Read);
    true
}

struct Slot<'a>(&'a Shared, u64);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        finish(self.0, self.1);
    }
}

fn finish(shared: &Shared, id: u64) {
    shared.active.fetch_sub(1, Ordering::SeqCst);
    if let Ok(mut open) = shared.open.lock() {
        open.remove(&id);
        if open.is_empty() {
            shared.drained.notify_all();
        }
    }
}

fn serve_connection(stream: TcpStream, shared: &Shared, state: &ConnState) {
    let Ok(remote) = stream.peer_addr() else {
        return;
    };
    let _ = stream.set_nodelay(true);
    let _ = stream.set_write_timeout(Some(Duration::from_secs(30)));
    // A second handle on the socket, for its timeouts and shutdown, and for
    // answers written by the answer thread.
    let Ok(socket) = stream.try_clone() else {
        return;
    };
    let out = Arc::new(Outbound {
        socket,
        state: Mutex::new(OutState::default()),
        settled: Condvar::new(),
    });
    let io: Box<dyn Stream> = match &shared.tls {
        Some(config) => match rustls::ServerConnection::new(config.clone()) {
            Ok(tls) => Box::new(rustls::StreamOwned::new(tls, stream)),
            Err(_) => return,
        },
        None => Box::new(stream),
    };
    let mut reader: Conn = BufReader::with_capacity(16 * 1024, io);
    serve_requests(&mut reader, &out, remote, shared, state);
    // A promised answer is written before the connection closes.
    out.settle(&mut reader);
}

fn serve_requests(
    reader: &mut Conn,
    out: &Arc<Outbound>,
    remote: SocketAddr,
    shared: &Shared,
    state: &ConnState,
) {
    let limits = &shared.limits;
    let socket = &out.socket;
    let mut first = true;
    loop {
        // Idle from here, then the stop is checked: a stop that comes
        // later sees this connection idle and ends its read (`stop`).
        if !first {
            state.idle_since.store(mono_ms(), Ordering::SeqCst);
        }
        state.in_request.store(false, Ordering::SeqCst);
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        // Wait for the next request's first byte (a TLS handshake first,
        // on a new TLS connection), then the whole head. A new connection
        // gets the header timeout to start: one that says nothing is not
        // kept for the keep-alive idle timeout.
        let wait = if first {
            limits.header_timeout.min(limits.idle_timeout)
        } else {
            limits.idle_timeout
        };
        first = false;
        let _ = socket.set_read_timeout(Some(wait));
        match reader.fill_buf() {
            Ok([]) | Err(_) => return,
            Ok(_) => {}
        }
        state.in_request.store(true, Ordering::SeqCst);
        // The previous request's answer goes out before anything of this
        // one (only a pipelining client ever waits here).
        if !out.settle(reader) {
            return;
        }
        let head = match read_head(reader, socket, limits) {
            Ok(h) => h,
            Err(HeadError::Closed) => return,
            Err(HeadError::Refused {
                status,
                message,
                target,
            }) => {
                if let Some(target) = &target {
                    (shared.refused)(target, remote, status, &message);
                }
                let reply = Reply::error(status, &message);
                let _ = write_out(reader, &serialize(reply, false, true));
                return;
            }
        };
        // Expect: 100-continue, unless the answer is already known.
        let declared_too_large = head
            .content_length
            .is_some_and(|n| n > limits.max_body_bytes);
        if head.expect_continue && !declared_too_large {
            let _ = write_out(reader, b"HTTP/1.1 100 Continue\r\n\r\n");
        }
        let body = if declared_too_large {
            // Not read at all: the answer is 413 and the connection closes.
            Ok(vec![0; limits.max_body_bytes + 1])
        } else {
            read_body(reader, socket, &head, limits)
        };
        if body.is_err() && shared.stop.load(Ordering::SeqCst) {
            // The stop ended the body's read (this connection looked idle
            // to it a moment before its first byte): the request was cut
            // by the shutdown, not malformed. The sender retries.
            let reply = Reply::error(503, "the server is shutting down; retry later").retry_after();
            let _ = write_out(reader, &serialize(reply, false, true));
            let _ = socket.shutdown(Shutdown::Write);
            return;
        }
        let body_complete = matches!(&body, Ok(b) if b.len() <= limits.max_body_bytes);
        let later =
            (shared.tls.is_none() && head.keep_alive && body_complete && head.method == "POST")
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
        if reply.later {
            // Promised: the answer thread writes it.
            continue;
        }
        let close = !head.keep_alive || !body_complete || shared.stop.load(Ordering::SeqCst);
        let is_head = request.method == "HEAD";
        if write_out(reader, &serialize(reply, is_head, close)).is_err() || close {
            let _ = socket.shutdown(Shutdown::Write);
            return;
        }
    }
}

/// A connection's answers written by another thread, kept in order with
/// the ones its own thread writes.
struct Outbound {
    /// The connection's socket: its timeouts and shutdown, and the answer
    /// thread's writes.
    socket: TcpStream,
    state: Mutex<OutState>,
    settled: Condvar,
}

#[derive(Default)]
struct OutState {
    /// An answer was promised and is not written yet.
    promised: bool,
    /// Promises made on this connection so far.
    promises: u64,
    /// What a non-blocking write left unsent: the client has not read a
    /// socket buffer's worth of answers (only a pipelining client can get
    /// there). The connection's thread sends it, with its write timeout,
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
                &self.socket,
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
        !broken && (rest.is_empty() || write_out(reader, &rest).is_ok())
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

/// The target of a request head's first line, once that line is whole.
fn target_of(raw: &[u8]) -> Option<String> {
    let line = &raw[..raw.iter().position(|&b| b == b'\n')?];
    let line = std::str::from_utf8(line).ok()?;
    let target = line.split(' ').nth(1)?;
    target.starts_with('/').then(|| target.to_string())
}

/// Reads and parses a request head, within the head size and time limits.
fn write_out(conn: &mut Conn, bytes: &[u8]) -> io::Result<()> {
    let w = conn.get_mut();
    w.write_all(bytes)?;
    w.flush()
}

/// Why a deadline-bound read stopped.
#[derive(Debug, PartialEq, Eq)]
enum Stop {
    /// The peer closed the connection (or it broke).
    Eof,
    TimedOut,
    /// The line went past its byte budget.
    TooLong,
}

/// Re-arms the socket's read timeout to what is left before `deadline`, so
/// a deadline holds for a whole line or body however slowly the bytes come.
fn arm(socket: &TcpStream, deadline: Instant) -> Result<(), Stop> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(Stop::TimedOut);
    }
    let _ = socket.set_read_timeout(Some(left));
    Ok(())
}

fn stop_of(e: &io::Error) -> Option<Stop> {
    match e.kind() {
        io::ErrorKind::Interrupted => None,
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => Some(Stop::TimedOut),
        _ => Some(Stop::Eof),
    }
}

/// Appends bytes up to and including the next `\n` to `out`, keeping `out`
/// within `max` bytes and the read within `deadline`.
fn read_line(
    reader: &mut Conn,
    socket: &TcpStream,
    deadline: Instant,
    out: &mut Vec<u8>,
    max: usize,
) -> Result<(), Stop> {
    loop {
        // Only a read that reaches the socket needs the timeout set.
        if reader.buffer().is_empty() {
            arm(socket, deadline)?;
        } else if Instant::now() >= deadline {
            return Err(Stop::TimedOut);
        }
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

/// Appends exactly `n` bytes to `out` within `deadline`, copying out of the
/// connection's buffer (no zero-filled staging buffer); on a stop, also
/// says how many of the `n` arrived.
fn read_into(
    reader: &mut Conn,
    socket: &TcpStream,
    deadline: Instant,
    n: usize,
    out: &mut Vec<u8>,
) -> Result<(), (Stop, usize)> {
    out.reserve(n);
    let mut got = 0;
    while got < n {
        if reader.buffer().is_empty() {
            arm(socket, deadline).map_err(|s| (s, got))?;
        }
        let buf = match reader.fill_buf() {
            Ok([]) => return Err((Stop::Eof, got)),
            Ok(b) => b,
            Err(e) => match stop_of(&e) {
                Some(stop) => return Err((stop, got)),
                None => continue,
            },
        };
        let take = buf.len().min(n - got);
        out.extend_from_slice(&buf[..take]);
        reader.consume(take);
        got += take;
    }
    Ok(())
}

fn read_head(reader: &mut Conn, socket: &TcpStream, limits: &Limits) -> Result<Head, HeadError> {
    let deadline = Instant::now() + limits.header_timeout;
    let mut raw: Vec<u8> = Vec::with_capacity(1024);
    // Read lines until the empty line, bounded in bytes and time.
    loop {
        let before = raw.len();
        match read_line(reader, socket, deadline, &mut raw, limits.max_head_bytes) {
            Ok(()) => {}
            Err(Stop::Eof) => return Err(HeadError::Closed),
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
    parse_head(&raw, limits).map_err(|(status, message)| HeadError::Refused {
        status,
        message,
        target: target_of(&raw),
    })
}

/// The head, or the status and message it is refused with.
fn parse_head(raw: &[u8], limits: &Limits) -> Result<Head, (u16, String)> {
    let bad = |m: &str| (400, m.to_string());
    let mut lines = raw
        .split(|&b| b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l));
    let request_line = lines.next().unwrap_or_default();
    let request_line =
        std::str::from_utf8(request_line).map_err(|_| bad("request line is not UTF-8"))?;
    let mut parts = request_line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad("malformed request line"));
    };
    if method.is_empty() || !method.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err(bad("malformed method"));
    }
    if target.len() > limits.max_target_bytes {
        return Err((414, "request target too long".into()));
    }
    if !target.starts_with('/') || target.bytes().any(|b| b <= b' ' || b == 0x7f) {
        return Err(bad("malformed request target"));
    }
    let http11 = match version {
        "HTTP/1.1" => true,
        "HTTP/1.0" => false,
        _ => {
            return Err((505, "only HTTP/1.0 and HTTP/1.1 are supported".into()));
        }
    };
    let mut headers: Vec<(String, String)> = Vec::new();
    for line in lines {
        if line.is_empty() {
            break;
        }
        if headers.len() >= limits.max_headers {
            return Err((431, "too many request headers".into()));
        }
        if line[0] == b' ' || line[0] == b'\t' {
            return Err(bad("folded header lines are not accepted"));
        }
        let colon = line
            .iter()
            .position(|&b| b == b':')
            .ok_or_else(|| bad("header line without a colon"))?;
        let (name, value) = (&line[..colon], &line[colon + 1..]);
        if name.is_empty() || !name.iter().all(|&b| is_token(b)) {
            return Err(bad("malformed header name"));
        }
        if value.contains(&0) {
            let name = String::from_utf8_lossy(name);
            return Err(bad(&format!("header {name} contains a NUL byte")));
        }
        let value = std::str::from_utf8(value).map_err(|_| {
            bad(&format!(
                "header {} is not valid UTF-8",
                String::from_utf8_lossy(name)
            ))
        })?;
        // Names are tokens, so ASCII.
        headers.push((
            String::from_utf8_lossy(name).into_owned(),
            value.trim_matches([' ', '\t']).to_string(),
        ));
    }
    fn all<'h>(headers: &'h [(String, String)], name: &'h str) -> impl Iterator<Item = &'h str> {
        headers
            .iter()
            .filter(move |(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
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
    let keep_alive = if http11 {
        !connection.split(',').any(|t| t.trim() == "close")
    } else {
        connection.split(',').any(|t| t.trim() == "keep-alive")
    };
    let expect_continue = all(&headers, "expect").any(|v| v.eq_ignore_ascii_case("100-continue"));
    Ok(Head {
        method: method.to_string(),
        target: target.to_string(),
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

/// Reads the body: up to `max_body_bytes` + 1 bytes, within the body timeout.
fn read_body(
    reader: &mut Conn,
    socket: &TcpStream,
    head: &Head,
    limits: &Limits,
) -> Result<Vec<u8>, BodyProblem> {
    let deadline = Instant::now() + limits.body_timeout;
    let cap = limits.max_body_bytes + 1;
    if head.chunked {
        return read_chunked(reader, socket, deadline, cap);
    }
    let Some(expected) = head.content_length else {
        return Ok(Vec::new());
    };
    let mut body = Vec::new();
    match read_into(reader, socket, deadline, expected.min(cap), &mut body) {
        Ok(()) => Ok(body),
        Err((Stop::TimedOut, _)) => Err(BodyProblem::TimedOut),
        Err((_, got)) => Err(BodyProblem::Short { expected, got }),
    }
}

/// Most trailer lines accepted after a chunked body.
const MAX_TRAILERS: usize = 32;

/// A chunked body, up to `cap` bytes, within `deadline`.
fn read_chunked(
    reader: &mut Conn,
    socket: &TcpStream,
    deadline: Instant,
    cap: usize,
) -> Result<Vec<u8>, BodyProblem> {
    let stopped = |stop: Stop, got: usize| match stop {
        Stop::TimedOut => BodyProblem::TimedOut,
        Stop::Eof => BodyProblem::Short {
            expected: got + 1,
            got,
        },
        Stop::TooLong => BodyProblem::BadChunk("chunk size line too long".into()),
    };
    let mut body = Vec::new();
    loop {
        let mut size_line = Vec::new();
        read_line(reader, socket, deadline, &mut size_line, 1024)
            .map_err(|s| stopped(s, body.len()))?;
        let text = String::from_utf8_lossy(&size_line);
        let size_text = text.trim().split(';').next().unwrap_or("").trim();
        let size = (!size_text.is_empty()
            && size_text.len() <= 16
            && size_text.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| usize::from_str_radix(size_text, 16).ok())
        .flatten()
        .ok_or_else(|| BodyProblem::BadChunk(format!("bad chunk size {size_text:?}")))?;
        if size == 0 {
            // Trailers, up to the empty line: bounded in count, bytes, time.
            for _ in 0..=MAX_TRAILERS {
                let mut t = Vec::new();
                read_line(reader, socket, deadline, &mut t, 8 * 1024)
                    .map_err(|s| stopped(s, body.len()))?;
                if t == b"\r\n" || t == b"\n" {
                    return Ok(body);
                }
            }
            return Err(BodyProblem::BadChunk(format!(
                "more than {MAX_TRAILERS} trailer lines"
            )));
        }
        let start = body.len();
        if size > cap - start.min(cap) {
            // This chunk alone takes the body past the limit: the answer
            // is 413 now, without waiting for (or reading) its bytes. The
            // connection closes after it, as for a declared length.
            body.resize(cap, 0);
            return Ok(body);
        }
        let want = size;
        read_into(reader, socket, deadline, want, &mut body)
            .map_err(|(s, got)| stopped(s, start + got))?;
        if body.len() >= cap {
            return Ok(body);
        }
        let mut crlf = Vec::with_capacity(2);
        read_into(reader, socket, deadline, 2, &mut crlf)
            .map_err(|(s, _)| stopped(s, body.len()))?;
        if crlf != b"\r\n" {
            return Err(BodyProblem::BadChunk("chunk not followed by CRLF".into()));
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
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        413 => "Content Too Large",
        414 => "URI Too Long",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
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
        let out = Arc::new(Outbound {
            socket: server.try_clone().unwrap(),
            state: Mutex::new(OutState::default()),
            settled: Condvar::new(),
        });
        let reader: Conn = BufReader::new(Box::new(server));
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

    fn parse(raw: &str) -> Result<Head, u16> {
        parse_head(raw.as_bytes(), &limits()).map_err(|(status, _)| status)
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
