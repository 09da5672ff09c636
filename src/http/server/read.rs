//! Reading off a connection: lines and bodies under their limits, bodies
//! reserving memory from the shared budget as their bytes arrive, never
//! from a declared length.

use std::collections::{HashMap, VecDeque};
use std::io::{self, BufRead, Write};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{BodyProblem, Conn, lock};

/// The memory of the bodies being received: one budget for all of them
/// (`max_body_bytes_in_flight`) and, within it, each address's share (an
/// IPv6 /64, as the connection caps count), so that one address cannot
/// take the budget from the others.
///
/// A body's memory is counted from before it is allocated until
/// [`FREED_HOLD`] after it is freed: the allocator (mimalloc) gives freed
/// pages back to the system only after its purge delay (1 s), and cannot
/// reuse the pages of small blocks for large ones, so memory freed and
/// taken again at once would add up past the budget.
pub(super) struct BodyPool {
    limit: usize,
    share: usize,
    held: Mutex<Held>,
}

#[derive(Default)]
struct Held {
    total: usize,
    by_address: HashMap<IpAddr, usize>,
    /// Blocks freed and still counted: when they stop being, their
    /// address, their size; in the order they were freed.
    freed: VecDeque<(Instant, IpAddr, usize)>,
}

/// How long a freed block of a body stays counted (mimalloc's purge delay
/// is 1 s). Blocks of at most [`BODY_STEP`] (every body's first, and the
/// whole of most bodies) are given back at once: the next bodies' first
/// blocks reuse them.
pub(super) const FREED_HOLD: Duration = Duration::from_millis(1500);

/// Which budget a body would pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Over {
    /// The bodies from every address together.
    Server,
    /// Its address's share.
    Address,
}

impl Held {
    fn release(&mut self, address: IpAddr, n: usize) {
        self.total = self.total.saturating_sub(n);
        if let Some(mine) = self.by_address.get_mut(&address) {
            *mine = mine.saturating_sub(n);
            if *mine == 0 {
                self.by_address.remove(&address);
            }
        }
    }

    /// Stops counting the freed blocks whose hold is over.
    fn expire(&mut self, now: Instant) {
        while let Some(&(until, address, n)) = self.freed.front() {
            if until > now {
                break;
            }
            self.freed.pop_front();
            self.release(address, n);
        }
    }
}

impl BodyPool {
    pub(super) fn new(limit: usize, share: usize) -> BodyPool {
        BodyPool {
            limit,
            share: share.min(limit),
            held: Mutex::new(Held::default()),
        }
    }

    /// Bytes counted now, in all and for `address`.
    #[cfg(test)]
    fn held(&self, address: IpAddr, now: Instant) -> (usize, usize) {
        let mut held = lock(&self.held);
        held.expire(now);
        let mine = held.by_address.get(&address).copied().unwrap_or(0);
        (held.total, mine)
    }

    fn take(&self, address: IpAddr, n: usize, now: Instant) -> Result<(), Over> {
        let mut held = lock(&self.held);
        held.expire(now);
        let mine = held.by_address.get(&address).copied().unwrap_or(0);
        if mine.saturating_add(n) > self.share {
            return Err(Over::Address);
        }
        if held.total.saturating_add(n) > self.limit {
            return Err(Over::Server);
        }
        held.total += n;
        *held.by_address.entry(address).or_insert(0) += n;
        Ok(())
    }

    /// A block of `n` bytes was freed.
    fn freed(&self, address: IpAddr, n: usize, now: Instant) {
        if n == 0 {
            return;
        }
        let mut held = lock(&self.held);
        if n <= BODY_STEP {
            held.release(address, n);
        } else {
            held.freed.push_back((now + FREED_HOLD, address, n));
        }
    }
}

/// The bytes of one body counted in the [`BodyPool`]; dropped once the
/// body is freed (they stay counted a while longer: [`FREED_HOLD`]).
pub(super) struct Budget {
    pool: Arc<BodyPool>,
    address: IpAddr,
    held: usize,
}

impl Budget {
    pub(super) fn new(pool: &Arc<BodyPool>, address: IpAddr) -> Budget {
        Budget {
            pool: pool.clone(),
            address,
            held: 0,
        }
    }

    /// Counts `n` more bytes about to be allocated, or says which budget
    /// has no room.
    pub(super) fn take(&mut self, n: usize) -> Result<(), Over> {
        self.pool.take(self.address, n, Instant::now())?;
        self.held += n;
        Ok(())
    }

    /// A block of `n` of the bytes held was freed.
    fn freed(&mut self, n: usize) {
        let n = n.min(self.held);
        self.pool.freed(self.address, n, Instant::now());
        self.held -= n;
    }
}

impl Drop for Budget {
    fn drop(&mut self) {
        self.pool.freed(self.address, self.held, Instant::now());
    }
}

/// Why a body was not read.
#[derive(Debug)]
pub(super) enum BodyError {
    /// Over `max_body_bytes`, declared or chunked.
    TooLarge,
    /// The bodies in flight would pass their memory budget, or their
    /// address's share of it.
    Busy(Over),
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
    /// The body would pass the budget of bodies in flight (or its
    /// address's share).
    Busy(Over),
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
/// `budget` before it is allocated (the old block counted until freed),
/// so that `budget` holds `out`'s capacity at least; on a stop, also says
/// how many of the `n` arrived.
pub(super) fn read_into<R: BufRead>(
    reader: &mut R,
    n: usize,
    out: &mut Vec<u8>,
    budget: &mut Budget,
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
            // The new block is allocated while the old one still holds
            // the bytes so far: both are counted until the old is freed.
            let old = out.capacity();
            if let Err(over) = budget.take(target) {
                return Err((Stop::Busy(over), got));
            }
            out.reserve_exact(target - out.len());
            budget.freed(old);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_holds_at_most_its_share_and_freed_blocks_count_a_while() {
        let now = Instant::now();
        let pool = Arc::new(BodyPool::new(4096, 1024));
        let (a, b): (IpAddr, IpAddr) = ([127, 0, 0, 1].into(), [127, 0, 0, 2].into());
        let mut first = Budget::new(&pool, a);
        assert_eq!(first.take(1000), Ok(()));
        assert_eq!(first.take(24), Ok(()));
        let mut second = Budget::new(&pool, a);
        assert_eq!(second.take(100), Err(Over::Address));
        let mut other = Budget::new(&pool, b);
        assert_eq!(other.take(1024), Ok(()));
        let mut third = Budget::new(&pool, [127, 0, 0, 3].into());
        assert_eq!(third.take(1024), Ok(()));
        assert_eq!(third.take(1024), Err(Over::Address));
        let mut fourth = Budget::new(&pool, [127, 0, 0, 4].into());
        assert_eq!(fourth.take(1024), Ok(()), "4,096 held in all");
        let mut fifth = Budget::new(&pool, [127, 0, 0, 5].into());
        assert_eq!(fifth.take(1), Err(Over::Server));
        drop((first, second, other, third, fourth, fifth));
        assert_eq!(
            pool.held(a, now),
            (0, 0),
            "small blocks: given back at once"
        );

        // A body read in pieces: counted before each growth, the old
        // block too; a freed block over 16 KiB stays counted a while.
        let pool = Arc::new(BodyPool::new(1 << 20, 40 * 1024));
        let mut budget = Budget::new(&pool, a);
        let bytes = vec![b'x'; 30 * 1024];
        let mut out = Vec::new();
        let mut reader = io::BufReader::with_capacity(8192, &bytes[..]);
        assert_eq!(
            read_into(&mut reader, bytes.len(), &mut out, &mut budget).map_err(|e| e.0),
            Err(Stop::Busy(Over::Address)),
            "16 KiB held and 30 KiB more asked: past a 40 KiB share"
        );
        drop(out);
        drop(budget);
        let pool = Arc::new(BodyPool::new(1 << 20, 1 << 20));
        let mut budget = Budget::new(&pool, a);
        let mut out = Vec::new();
        let mut reader = io::BufReader::with_capacity(8192, &bytes[..]);
        assert!(read_into(&mut reader, bytes.len(), &mut out, &mut budget).is_ok());
        let now = Instant::now();
        assert_eq!(
            pool.held(a, now).1,
            out.capacity(),
            "the first block, freed"
        );
        drop(out);
        drop(budget);
        assert_eq!(pool.held(a, now).1, 30 * 1024, "freed, still counted");
        assert_eq!(
            pool.held(a, Instant::now() + FREED_HOLD),
            (0, 0),
            "then given back"
        );
    }
}
