//! Answers promised for later ([`Later`], [`Promise`]) and what a
//! connection has still to send ([`Outbound`]): the answer thread writes
//! without blocking, and the connection's thread sends what is left, in
//! order, before anything else.

use std::net::TcpStream;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use super::Conn;
use super::read::{Budget, write_out};
use super::response::serialize;
use super::wire::ConnState;
use crate::http::reply::Reply;

/// A connection's answers written by another thread, kept in order with
/// the ones its own thread writes.
pub(super) struct Outbound {
    /// The connection's socket: its shutdown, and the answer thread's
    /// writes.
    pub(super) socket: Arc<TcpStream>,
    pub(super) state: Mutex<OutState>,
    pub(super) settled: Condvar,
    /// The deadline of writing what an answer left unsent.
    pub(super) answer_timeout: Duration,
    pub(super) conn: Arc<ConnState>,
}

#[derive(Default)]
pub(super) struct OutState {
    /// An answer was promised and is not written yet.
    pub(super) promised: bool,
    /// Promises made on this connection so far.
    pub(super) promises: u64,
    /// What a non-blocking write left unsent: the client has not read a
    /// socket buffer's worth of answers (only a pipelining client can get
    /// there). The connection's thread sends it, within its deadline,
    /// when it next wakes: at the next request, or at the end of the
    /// connection (its idle timeout at the latest).
    pub(super) rest: Vec<u8>,
    /// The write failed: the connection is done.
    broken: bool,
    /// The memory of the promised request's body, counted until its
    /// answer is written (the handler has handed the body on with its
    /// claim).
    body: Option<Budget>,
}

pub(super) fn locked(m: &Mutex<OutState>) -> std::sync::MutexGuard<'_, OutState> {
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
        let body = state.body.take();
        drop(state);
        self.settled.notify_all();
        drop(body);
    }

    /// Keeps the memory of a request's body counted until its promised
    /// answer is written (at once if it already is).
    pub(super) fn count_until_answered(&self, body: Budget) {
        let mut state = locked(&self.state);
        if state.promised {
            state.body = Some(body);
        }
    }

    /// Waits until a promised answer is written and sends what it left
    /// unsent. False when the connection is done.
    pub(super) fn settle(&self, reader: &mut Conn) -> bool {
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
    pub(super) out: Arc<Outbound>,
}

impl Later {
    /// Promises an answer: returns who gives it, and the reply the handler
    /// returns now, for which the server writes nothing.
    pub fn promise(self) -> (Promise, Reply) {
        {
            let mut state = locked(&self.out.state);
            state.promised = true;
            state.promises += 1;
        }
        (
            Promise {
                out: Some(self.out),
            },
            Later::promised(),
        )
    }

    /// The reply that stands for a promised answer.
    pub(super) fn promised() -> Reply {
        let mut reply = Reply::text(0, "", String::new());
        reply.later = true;
        reply
    }
}

/// A promised answer. Dropped unsent, it answers 503 (the work behind it
/// was lost: the writer stopped), or 500 while a panic unwinds.
pub struct Promise {
    pub(super) out: Option<Arc<Outbound>>,
}

impl Promise {
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

impl Drop for Promise {
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

#[cfg(test)]
mod tests {
    use std::io::{BufReader, Read, Write};
    use std::net::{Shutdown, TcpListener};

    use super::super::wire::{ConnState, Io, Wire};
    use super::super::{Conn, Handler, Limits, Request, Server};
    use super::*;

    fn limits() -> Limits {
        let t = Duration::from_secs(10);
        Limits::new(2, 1024, 16, t, t, t)
    }

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
}
