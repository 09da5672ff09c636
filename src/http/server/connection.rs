//! A connection's thread: reading requests one after another under their
//! deadlines, taking a processing permit, calling the handler, and
//! answering what the server refuses itself (a body cut short, late or
//! over a limit).

use std::io::{BufRead, BufReader};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use super::body::read_body;
use super::head::{Head, HeadError, read_head};
use super::later::{Later, OutState, Outbound, locked};
use super::linger::linger;
use super::permit::Permit;
use super::read::{BodyError, Budget, Over, write_out};
use super::response::serialize;
use super::wire::{ConnState, Io, Wire};
use super::{
    BUSY, BodyProblem, Conn, DRAIN_413, DRAIN_MAX_BYTES, IDLE, LINGER, Limits, REFUSE_WITHIN,
    Request, Shared, address_key, dropped,
};
use crate::http::reply::Reply;

/// Serves connection `id` until it closes; true when its socket and
/// place under the caps were handed to the lingering thread.
pub(super) fn serve_connection(
    socket: Arc<TcpStream>,
    remote: SocketAddr,
    shared: &Shared,
    state: &Arc<ConnState>,
    id: u64,
) -> bool {
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
                return false;
            }
        },
        None => Io::Plain(wire),
    };
    let mut reader: Conn = BufReader::with_capacity(16 * 1024, io);
    let end = serve_requests(&mut reader, &out, remote, shared, state);
    // A promised answer is written before the connection closes.
    let settled = out.settle(&mut reader);
    match end {
        End::Quietly => false,
        End::Dropped(why) => {
            dropped(Some(remote), why, &"closed");
            false
        }
        End::Answered => {
            if settled {
                reader.get_mut().close_notify();
            }
            let _ = socket.shutdown(Shutdown::Write);
            false
        }
        End::Refused(within) => {
            reader.get_mut().close_notify();
            let _ = socket.shutdown(Shutdown::Write);
            linger(shared, socket, within, DRAIN_MAX_BYTES, id).is_none()
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
        if let Some(end) = await_request(reader, out, shared, state, first) {
            return end;
        }
        first = false;
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
                let cut = head_cut(state, limits, status, message);
                return refuse_request(reader, state, shared, target.as_deref(), remote, cut);
            }
        };
        let mut budget = Budget::new(&shared.bodies, address_key(remote.ip()));
        let body = match receive_body(reader, &head, limits, state, &mut budget) {
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
        let reply = handle(shared, out, &mut request);
        request.permit.release();
        // The body's memory stays counted until it is freed: here, or
        // when the handler took it on with its claim, until the answer.
        drop(std::mem::take(&mut request.body));
        if reply.later {
            // Promised: the answer thread writes it.
            out.count_until_answered(budget);
            continue;
        }
        drop(budget);
        let is_head = request.method == "HEAD";
        if let Some(end) = write_reply(reader, state, shared, reply, head.keep_alive, is_head) {
            return end;
        }
    }
}

/// Reads the request's body, after a 100 Continue when the client waits
/// for one; a body declared over the limit is refused unread.
fn receive_body(
    reader: &mut Conn,
    head: &Head,
    limits: &Limits,
    state: &ConnState,
    budget: &mut Budget,
) -> Result<Vec<u8>, BodyError> {
    let declared_too_large = head
        .content_length
        .is_some_and(|n| n > limits.max_body_bytes);
    // Expect: 100-continue (HTTP/1.1 only), unless the answer is known.
    if head.expect_continue && !declared_too_large {
        let _ = write_out(reader, b"HTTP/1.1 100 Continue\r\n\r\n");
    }
    state.deadlines(limits.body_timeout);
    if declared_too_large {
        // Not read at all: the answer is 413, the rest is drained.
        Err(BodyError::TooLarge)
    } else {
        read_body(reader, head, limits.max_body_bytes, budget)
    }
}

/// Writes the handler's reply, closing after it when the request or a
/// stop says so. `Some` ends the connection.
fn write_reply(
    reader: &mut Conn,
    state: &ConnState,
    shared: &Shared,
    reply: Reply,
    keep_alive: bool,
    is_head: bool,
) -> Option<End> {
    let close = !keep_alive || shared.stop.load(Ordering::SeqCst);
    state.write_within(shared.limits.body_timeout);
    if write_out(reader, &serialize(reply, is_head, close)).is_err() {
        return Some(End::Dropped("the answer was not taken in time"));
    }
    close.then_some(End::Answered)
}

/// Waits, idle, for the next request's first byte (a TLS handshake first,
/// on a new TLS connection: its deadline was set at the start), then sends
/// what is left of the previous answer. `Some` ends the connection.
fn await_request(
    reader: &mut Conn,
    out: &Arc<Outbound>,
    shared: &Shared,
    state: &Arc<ConnState>,
    first: bool,
) -> Option<End> {
    // Idle from here, then the stop is checked: a stop that comes
    // later sees this connection idle and ends its read (`stop`).
    state.set_phase(IDLE);
    if shared.stop.load(Ordering::SeqCst) {
        return Some(End::Quietly);
    }
    if !first {
        state.deadlines(shared.limits.idle_timeout);
    }
    match reader.fill_buf() {
        Ok([]) | Err(_) => {
            // (One let go at the cap was logged then.)
            return Some(End::Quietly);
        }
        Ok(_) => {}
    }
    state.set_phase(BUSY);
    // The previous request's answer goes out before anything of this
    // one (only a pipelining client ever waits here).
    if !out.settle(reader) {
        return Some(End::Dropped("a previous answer was not taken in time"));
    }
    None
}

/// How a head the reader refused is answered: not at all for a
/// connection let go, 408 for one under the minimum rate, else as refused
/// (lingering so the client reads it, except after a 408).
fn head_cut(state: &ConnState, limits: &Limits, status: u16, message: String) -> Cut {
    if state.evicted.load(Ordering::SeqCst) {
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
    }
}

/// Runs the handler holding a processing permit. A panic is answered 500,
/// unless the handler promised an answer first (the `Promise`
/// writes a 500 when dropped): one answer only.
fn handle(shared: &Shared, out: &Arc<Outbound>, request: &mut Request) -> Reply {
    let promises = locked(&out.state).promises;
    request.permit = shared.permits.acquire();
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let reply = (shared.handler)(request);
        if let Some(fp) = reply.failpoint {
            crate::failpoint::hit(fp);
        }
        reply
    })) {
        Ok(r) => r,
        Err(_) if locked(&out.state).promises != promises => Later::promised(),
        Err(_) => {
            crate::log::error("handler panicked", &[("effect", &"answered 500")]);
            Reply::error(500, "internal error")
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
        BodyError::Busy(Over::Server) => Cut::Refuse(
            503,
            "too many request bodies in flight, retry later".into(),
            LINGER,
        ),
        BodyError::Busy(Over::Address) => Cut::Refuse(
            503,
            "too many request bodies in flight from this address, retry later".into(),
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
