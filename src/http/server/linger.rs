//! Lingering after a refusal without a thread each: a refused request's
//! answer is written and its connection half-closed by its own thread,
//! which then hands the socket to the one lingering thread and ends. That
//! thread reads and discards what the clients still send (so that closing
//! with unread bytes does not reset a connection before its client has
//! read the answer), and closes each socket at its deadline, its byte
//! limit or the client's close. A thousand refused senders then cost a
//! descriptor each for the linger, not a thread with its stack, read
//! buffer and allocator pages.

use std::io::{self, Read};
use std::net::TcpStream;
use std::sync::mpsc::{Receiver, RecvTimeoutError, TrySendError};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec, poll};

use super::{Shared, drain};

/// A socket being drained, and the connection slot it keeps until closed.
pub(super) struct Lingering {
    socket: Arc<TcpStream>,
    until: Instant,
    left: u64,
    /// The connection's place under the caps, given back when it closes.
    slot: u64,
}

/// Hands `socket` (answered and half-closed) to the lingering thread, to
/// drain for up to `within` and `max` bytes; its connection `slot` stays
/// taken until then (so the caps count its descriptor). When that
/// thread's queue is full, drains on the calling thread instead. Returns
/// the slot when it was not handed over (the caller gives it back).
pub(super) fn linger(
    shared: &Shared,
    socket: Arc<TcpStream>,
    within: Duration,
    max: u64,
    slot: u64,
) -> Option<u64> {
    let handed = Lingering {
        socket,
        until: Instant::now() + within,
        left: max,
        slot,
    };
    match shared.lingering.try_send(handed) {
        Ok(()) => None,
        Err(TrySendError::Full(back) | TrySendError::Disconnected(back)) => {
            drain(&back.socket, within, max);
            Some(back.slot)
        }
    }
}

/// How long a poll waits before new sockets are taken in.
const ROUND: Duration = Duration::from_millis(20);

/// The lingering thread, until the server is gone: drains at most
/// `most` sockets at once (past it, the queue fills and a connection's
/// thread drains its own).
pub(super) fn linger_loop(incoming: &Receiver<Lingering>, shared: &Weak<Shared>, most: usize) {
    let mut draining: Vec<Lingering> = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        if draining.is_empty() {
            match incoming.recv_timeout(Duration::from_secs(1)) {
                Ok(l) => take_in(&mut draining, l, shared),
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => return,
            }
        }
        while draining.len() < most {
            let Ok(l) = incoming.try_recv() else { break };
            take_in(&mut draining, l, shared);
        }
        let now = Instant::now();
        let wait = draining
            .iter()
            .map(|l| l.until.saturating_duration_since(now))
            .min()
            .unwrap_or(ROUND)
            .min(ROUND);
        let ready: Vec<bool> = {
            let mut fds: Vec<PollFd<'_>> = draining
                .iter()
                .map(|l| PollFd::new(&*l.socket, PollFlags::IN))
                .collect();
            let timeout = Timespec::try_from(wait).unwrap_or(Timespec {
                tv_sec: 0,
                tv_nsec: 20_000_000,
            });
            match poll(&mut fds, Some(&timeout)) {
                Ok(_) => fds.iter().map(|f| !f.revents().is_empty()).collect(),
                Err(_) => vec![false; fds.len()],
            }
        };
        let now = Instant::now();
        let mut index = 0;
        draining.retain_mut(|l| {
            let readable = ready.get(index).copied().unwrap_or(false);
            index += 1;
            let open = now < l.until && (!readable || read_some(l, &mut buf));
            if !open {
                give_back(shared, l);
            }
            open
        });
    }
}

fn take_in(draining: &mut Vec<Lingering>, l: Lingering, shared: &Weak<Shared>) {
    if l.socket.set_nonblocking(true).is_ok() {
        draining.push(l);
    } else {
        // It cannot be read without blocking: it closes at once.
        give_back(shared, &l);
    }
}

/// Reads what is there; false when the socket is done (closed by the
/// client, failed, or its byte limit reached).
fn read_some(l: &mut Lingering, buf: &mut [u8]) -> bool {
    loop {
        match (&*l.socket).read(buf) {
            Ok(0) => return false,
            Ok(n) => {
                l.left = l.left.saturating_sub(n as u64);
                if l.left == 0 {
                    return false;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
}

/// Gives a drained socket's connection slot back; the socket closes when
/// `l` goes (the last reference to it).
fn give_back(shared: &Weak<Shared>, l: &Lingering) {
    if let Some(shared) = shared.upgrade() {
        super::accept::finish(&shared, l.slot);
    }
}
