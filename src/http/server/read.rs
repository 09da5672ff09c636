//! Reading off a connection: lines and bodies under their limits, bodies
//! reserving memory from the shared budget as their bytes arrive, never
//! from a declared length.

use std::io::{self, BufRead, Write};
use std::sync::atomic::{AtomicUsize, Ordering};

use super::{BodyProblem, Conn};

/// Bytes of request bodies reserved from the shared budget, given back
/// when dropped.
pub(super) struct Budget<'a> {
    pub(super) pool: &'a AtomicUsize,
    pub(super) limit: usize,
    pub(super) held: usize,
}

impl Budget<'_> {
    /// Reserves `n` more bytes; false when the budget has no room.
    pub(super) fn take(&mut self, n: usize) -> bool {
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
pub(super) enum BodyError {
    /// Over `max_body_bytes`, declared or chunked.
    TooLarge,
    /// The bodies in flight would pass their memory budget.
    Busy,
    Problem(BodyProblem),
}

/// Writes bytes within the connection's write deadline.
pub(super) fn write_out(conn: &mut Conn, bytes: &[u8]) -> io::Result<()> {
    let w = conn.get_mut();
    w.write_all(bytes)?;
    w.flush()
}

/// Why a read stopped.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Stop {
    /// The peer closed the connection (or it broke).
    Eof,
    /// A deadline passed, or the request fell under the minimum rate.
    TimedOut,
    /// The line went past its byte budget.
    TooLong,
    /// The body would pass the budget of bodies in flight.
    Busy,
}

pub(super) fn stop_of(e: &io::Error) -> Option<Stop> {
    match e.kind() {
        io::ErrorKind::Interrupted => None,
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => Some(Stop::TimedOut),
        _ => Some(Stop::Eof),
    }
}

/// Appends bytes up to and including the next `\n` to `out`, keeping `out`
/// within `max` bytes. (Deadlines are the socket's: [`Wire`].)
pub(super) fn read_line<R: BufRead>(
    reader: &mut R,
    out: &mut Vec<u8>,
    max: usize,
) -> Result<(), Stop> {
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
pub(super) fn read_into<R: BufRead>(
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

/// A byte of an RFC 9110 token (`tchar`): method names, field names,
/// chunk extension names.
pub(super) fn is_token(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}
