//! The acceptor: taking connections off the listener, the caps on open
//! connections (in all and per address) and who is let go to make room,
//! the tarpit for connections past their address's cap (bounded, in all
//! and per address: past it, closed at once), and the 503s written when
//! there is no room.

use std::io::{self, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::connection::serve_connection;
use super::response::serialize;
use super::wire::{ConnState, Io, Wire};
use super::{
    ADDRESS_SHARES, EVICTABLE_AFTER_MS, IDLE, LINGER, Limits, MAX_REFUSING, Open, READING,
    REFUSE_WITHIN, Registered, Shared, address_key, drain, dropped, lock, mono_ms,
};
use crate::http::reply::Reply;

/// Why a new connection is not admitted.
#[derive(Clone, Copy)]
enum Full {
    /// Its address holds `max_connections_per_address` already.
    Address,
    /// `max_connections` are open and none may be let go.
    Server,
}

pub(super) fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>) {
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
            // Gives the slot back however the thread ends, panics included,
            // unless the lingering thread took it with the socket.
            let mut slot = Slot(&s, Some(id));
            if serve_connection(socket, remote, &s, &state, id) {
                slot.1 = None;
            }
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
        let address = address_key(remote.ip());
        let (place, victim) = hold(shared, address, remote, &socket);
        if let Some(v) = victim {
            close_at_once(shared, &v.socket, v.remote, v.address);
        }
        let Some((id, cancelled)) = place else {
            close_at_once(shared, &socket, remote, address);
            return;
        };
        let held = Held {
            socket,
            remote,
            until: Instant::now() + TARPIT_HOLD,
            id,
            cancelled,
        };
        match shared.tarpit.try_send(held) {
            // Logged when it is answered 503, if no room was made by then.
            Ok(()) => return,
            Err(e) => {
                let held = match e {
                    std::sync::mpsc::TrySendError::Full(h)
                    | std::sync::mpsc::TrySendError::Disconnected(h) => h,
                };
                unhold(shared, held.id);
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
pub(super) struct Held {
    pub(super) socket: Arc<TcpStream>,
    pub(super) remote: SocketAddr,
    pub(super) until: Instant,
    /// Its place in [`Open::held`].
    id: u64,
    /// Closed to make room for another address's: forget it.
    cancelled: Arc<AtomicBool>,
}

/// A connection held in the tarpit, as the acceptor sees it (to close it
/// when another address needs its place).
pub(super) struct HeldPlace {
    address: IpAddr,
    remote: SocketAddr,
    socket: Arc<TcpStream>,
    cancelled: Arc<AtomicBool>,
}

/// How many connections the tarpit holds at most (each a descriptor).
pub(super) fn tarpit_size(limits: &Limits) -> usize {
    limits.max_connections.clamp(1, 1024)
}

/// How many of them one address (an IPv6 /64) is sure of: its per-address
/// cap, at most 1/[`ADDRESS_SHARES`] of the tarpit. An address may hold
/// more while there is room, and its newest ones beyond its share are
/// closed when an address within its share needs the room.
fn held_share(limits: &Limits) -> usize {
    limits
        .max_connections_per_address
        .min(tarpit_size(limits) / ADDRESS_SHARES)
        .max(1)
}

/// Takes a place in the tarpit for a connection from `address`: when the
/// tarpit is full and the address is within its share, the place of the
/// newest connection of the address furthest past its share, which is
/// returned to be closed. No place when the tarpit is full and the
/// address has its share (or no one is past theirs).
fn hold(
    shared: &Shared,
    address: IpAddr,
    remote: SocketAddr,
    socket: &Arc<TcpStream>,
) -> (Option<(u64, Arc<AtomicBool>)>, Option<HeldPlace>) {
    let share = held_share(&shared.limits);
    let mut open = lock(&shared.open);
    let mut victim = None;
    if open.held.len() >= tarpit_size(&shared.limits) {
        let mine = open.held_per_address.get(&address).copied().unwrap_or(0);
        let furthest = open
            .held_per_address
            .iter()
            .filter(|(_, n)| **n > share)
            .max_by_key(|(_, n)| **n)
            .map(|(a, _)| *a);
        let newest = furthest.and_then(|a| {
            open.held
                .iter()
                .filter(|(_, h)| h.address == a)
                .map(|(id, _)| *id)
                .max()
        });
        let Some(newest) = newest.filter(|_| mine < share) else {
            return (None, None);
        };
        victim = take_place(&mut open, newest);
        if let Some(v) = &victim {
            v.cancelled.store(true, Ordering::SeqCst);
        }
    }
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    let cancelled = Arc::new(AtomicBool::new(false));
    open.held.insert(
        id,
        HeldPlace {
            address,
            remote,
            socket: socket.clone(),
            cancelled: cancelled.clone(),
        },
    );
    *open.held_per_address.entry(address).or_insert(0) += 1;
    (Some((id, cancelled)), victim)
}

fn take_place(open: &mut Open, id: u64) -> Option<HeldPlace> {
    let place = open.held.remove(&id)?;
    if let Some(n) = open.held_per_address.get_mut(&place.address) {
        *n = n.saturating_sub(1);
        if *n == 0 {
            open.held_per_address.remove(&place.address);
        }
    }
    Some(place)
}

/// Gives back a place in the tarpit (its connection admitted or answered;
/// nothing when it was closed for another address's).
fn unhold(shared: &Shared, id: u64) {
    take_place(&mut lock(&shared.open), id);
}

/// How often closing at once is logged for one address, at most.
const CLOSED_AT_ONCE_LOG_MS: i64 = 10_000;

/// Closes a connection at once, its address's share of the tarpit being
/// full (on a plain listener, after a 503 written without waiting). Logged
/// once per address every [`CLOSED_AT_ONCE_LOG_MS`] with a count, never
/// once per connection.
fn close_at_once(shared: &Shared, socket: &TcpStream, remote: SocketAddr, address: IpAddr) {
    if shared.tls.is_none() {
        use rustix::net::{SendFlags, send};
        let bytes = serialize(
            Reply::error(503, "too many connections from this address, retry later").retry_after(),
            false,
            true,
        );
        let _ = send(socket, &bytes, SendFlags::DONTWAIT | SendFlags::NOSIGNAL);
    }
    let _ = socket.shutdown(Shutdown::Both);
    let now = mono_ms();
    let closed = {
        let mut open = lock(&shared.open);
        if open.closed_at_once.len() >= 4096 {
            open.closed_at_once
                .retain(|_, (at, _)| now - *at < CLOSED_AT_ONCE_LOG_MS);
        }
        let (at, count) = open.closed_at_once.entry(address).or_insert((i64::MIN, 0));
        *count += 1;
        if *at == i64::MIN || now - *at >= CLOSED_AT_ONCE_LOG_MS {
            let closed = *count;
            (*at, *count) = (now, 0);
            Some(closed)
        } else {
            None
        }
    };
    if let Some(closed) = closed {
        crate::log::warn(
            "held-back queue full for this address: new connections closed at once",
            &[
                ("address", &address),
                ("remote", &remote),
                ("reason", &"max_connections_per_address reached"),
                ("closed", &closed),
                ("next_line_within", &"10s"),
            ],
        );
    }
}

/// How often the tarpit tries again to admit the connections it holds.
const TARPIT_RETRY: Duration = Duration::from_millis(100);

/// Holds connections past a per-address cap for up to [`TARPIT_HOLD`]
/// (nothing read, nothing written). Every [`TARPIT_RETRY`] each is offered
/// a slot again, so one gets in as soon as its address has room (a
/// connection closed, or an idle one has waited long enough to be let
/// go): idle connections from an address never keep its next delivery
/// out. Those still held at the end are answered 503. Ends with the server.
pub(super) fn tarpit_loop(
    held: &std::sync::mpsc::Receiver<Held>,
    shared: &std::sync::Weak<Shared>,
) {
    let mut waiting: std::collections::VecDeque<Held> = std::collections::VecDeque::new();
    loop {
        // Those closed for another address's place are gone.
        waiting.retain(|h| !h.cancelled.load(Ordering::SeqCst));
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
                admit_waiting(&shared, &mut waiting);
            }
        }
        let now = Instant::now();
        while waiting.front().is_some_and(|h| h.until <= now) {
            let Some(h) = waiting.pop_front() else { break };
            let Some(shared) = shared.upgrade() else {
                return;
            };
            if h.cancelled.load(Ordering::SeqCst) {
                continue;
            }
            unhold(&shared, h.id);
            answer_held_503(&shared, h);
        }
    }
}

/// Offers each waiting connection a slot, keeping those still without
/// room in the tarpit.
fn admit_waiting(shared: &Arc<Shared>, waiting: &mut std::collections::VecDeque<Held>) {
    // One try per address and round: under a flood from one
    // address, a round costs one scan of the connections.
    let mut full = std::collections::HashSet::new();
    waiting.retain(|h| {
        let address = address_key(h.remote.ip());
        if full.contains(&address) {
            return true;
        }
        let admitted = admit_held(shared, h);
        if admitted {
            unhold(shared, h.id);
        } else {
            full.insert(address);
        }
        !admitted
    });
}

/// Answers 503 to a connection held until its time ran out with no room
/// made: written without waiting on a plain listener, by [`answer_503`]
/// (in TLS) on a TLS one.
fn answer_held_503(shared: &Arc<Shared>, h: Held) {
    let bytes = serialize(
        Reply::error(503, "too many connections from this address, retry later").retry_after(),
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
            shared,
            h.socket,
            h.remote,
            "held past max_connections_per_address",
            "too many connections from this address, retry later",
        );
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
pub(super) fn listen_on(listen: &str) -> io::Result<TcpListener> {
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

/// A connection's place under the caps, given back when it goes.
struct Slot<'a>(&'a Shared, Option<u64>);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.1 {
            finish(self.0, id);
        }
    }
}

/// Gives connection `id`'s place under the caps back.
pub(super) fn finish(shared: &Shared, id: u64) {
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
