//! One connection's shared state (its phase, its deadlines, the bytes it
//! has received) and its socket below TLS ([`Wire`]), where every deadline
//! and the minimum receive rate are kept, inside a TLS record too.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU8, AtomicU64, Ordering};
use std::time::Duration;

use super::{IDLE, NEVER, RATE_GRACE_US, RATE_WINDOW_US, READING, mono_ms, mono_us};

/// What a connection's thread, its [`Wire`], the acceptor and `stop`
/// share about it. Times are [`mono_ms`].
pub(super) struct ConnState {
    pub(super) phase: AtomicU8,
    /// When it started waiting for a request, or receiving one.
    pub(super) since: AtomicI64,
    /// Bytes read off the socket so far.
    pub(super) received: AtomicU64,
    /// `received` when the current request started.
    received_at_start: AtomicU64,
    /// Reads fail with `TimedOut` from then.
    read_deadline: AtomicI64,
    /// Writes fail with `TimedOut` from then.
    write_deadline: AtomicI64,
    /// `min_rate` applies now (while a request is received).
    metered: AtomicBool,
    /// While metered, until when ([`mono_us`]) the bytes received keep the
    /// request at `min_rate`: each byte buys 1/`min_rate` of a second, and
    /// no more than [`RATE_WINDOW_US`] ahead of its arrival can be banked.
    paid_until: AtomicI64,
    min_rate: u64,
    /// Let go at the connection cap.
    pub(super) evicted: AtomicBool,
    /// A read failed because the request was under `min_rate`.
    pub(super) too_slow: AtomicBool,
}

impl ConnState {
    pub(super) fn new(min_rate: u64) -> ConnState {
        ConnState {
            phase: AtomicU8::new(IDLE),
            since: AtomicI64::new(mono_ms()),
            received: AtomicU64::new(0),
            received_at_start: AtomicU64::new(0),
            read_deadline: AtomicI64::new(NEVER),
            write_deadline: AtomicI64::new(NEVER),
            metered: AtomicBool::new(false),
            paid_until: AtomicI64::new(NEVER),
            min_rate,
            evicted: AtomicBool::new(false),
            too_slow: AtomicBool::new(false),
        }
    }

    /// Reads and writes fail from `within` from now.
    pub(super) fn deadlines(&self, within: Duration) {
        let at = mono_ms().saturating_add(i64::try_from(within.as_millis()).unwrap_or(NEVER));
        self.read_deadline.store(at, Ordering::SeqCst);
        self.write_deadline.store(at, Ordering::SeqCst);
    }

    pub(super) fn write_within(&self, within: Duration) {
        let at = mono_ms().saturating_add(i64::try_from(within.as_millis()).unwrap_or(NEVER));
        self.write_deadline.store(at, Ordering::SeqCst);
    }

    pub(super) fn set_phase(&self, phase: u8) {
        self.phase.store(phase, Ordering::SeqCst);
        if phase != READING {
            self.metered.store(false, Ordering::SeqCst);
        }
        if phase == IDLE {
            self.since.store(mono_ms(), Ordering::SeqCst);
        }
    }

    /// A request starts: its first `buffered` bytes were already read.
    pub(super) fn start_request(&self, buffered: usize) {
        let received = self.received.load(Ordering::SeqCst);
        self.received_at_start
            .store(received.saturating_sub(buffered as u64), Ordering::SeqCst);
        self.since.store(mono_ms(), Ordering::SeqCst);
        self.paid_until
            .store(mono_us().saturating_add(RATE_GRACE_US), Ordering::SeqCst);
        self.phase.store(READING, Ordering::SeqCst);
        self.metered.store(self.min_rate > 0, Ordering::SeqCst);
    }

    /// `n` bytes arrived: while metered, they keep the request going
    /// `n`/`min_rate` seconds longer, up to [`RATE_WINDOW_US`] from now.
    fn received(&self, n: usize) {
        self.received.fetch_add(n as u64, Ordering::SeqCst);
        if !self.metered.load(Ordering::SeqCst) || self.min_rate == 0 {
            return;
        }
        let bought =
            i64::try_from((n as u64).saturating_mul(1_000_000) / self.min_rate).unwrap_or(NEVER);
        let cap = mono_us().saturating_add(RATE_WINDOW_US);
        // (Only this connection's reader updates it.)
        let paid = self.paid_until.load(Ordering::SeqCst);
        self.paid_until.store(
            paid.saturating_add(bought).min(cap).max(paid),
            Ordering::SeqCst,
        );
    }

    /// Bytes a second the current request has averaged (for picking the
    /// slowest one at the cap).
    pub(super) fn rate(&self, now: i64) -> f64 {
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
            // The bytes received so far keep the request going until then.
            let paid_until = self.paid_until.load(Ordering::SeqCst);
            let enough_until = paid_until.div_euclid(1000).saturating_add(1);
            if mono_us() >= paid_until {
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
pub(super) struct Wire {
    pub(super) socket: Arc<TcpStream>,
    pub(super) state: Arc<ConnState>,
}

impl Read for Wire {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let wait = self.state.read_wait()?;
            self.socket.set_read_timeout(Some(wait))?;
            match (&*self.socket).read(buf) {
                Ok(n) => {
                    self.state.received(n);
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
pub(super) fn retry(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    )
}

/// What a connection reads and writes: plain TCP or TLS over it.
pub(super) enum Io {
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
    pub(super) fn close_notify(&mut self) {
        if let Io::Tls(t) = self {
            t.conn.send_close_notify();
            let _ = t.flush();
        }
    }
}
