//! Fuzz target `http_server`: our HTTP/1.1 server's head parser, framing
//! and body reader, through the public `http::server::Server` on
//! 127.0.0.1 (the parser itself, `parse_head`, is private). Each input is
//! written to a new connection as raw bytes, the write side is closed, and
//! whatever comes back is read to the end. Never panics (libFuzzer's panic
//! hook aborts on a panic in any thread, connection threads included), and
//! the server answers only with well-formed status lines it knows.
//!
//! The limits are small so that short inputs reach them: head 2 KiB,
//! target 256 bytes, 16 headers, body 512 bytes.

#![no_main]

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::OnceLock;
use std::time::Duration;

use idemhook::http::reply::Reply;
use idemhook::http::server::{Limits, Request, Server};
use libfuzzer_sys::fuzz_target;

const KNOWN: [u16; 11] = [100, 200, 400, 408, 413, 414, 431, 500, 501, 503, 505];

fn server() -> SocketAddr {
    static ADDR: OnceLock<SocketAddr> = OnceLock::new();
    *ADDR.get_or_init(|| {
        let limits = Limits {
            max_connections: 64,
            workers: 2,
            header_timeout: Duration::from_secs(2),
            idle_timeout: Duration::from_secs(2),
            body_timeout: Duration::from_secs(2),
            max_head_bytes: 2048,
            max_headers: 16,
            max_target_bytes: 256,
            max_body_bytes: 512,
        };
        let handler = Box::new(|rq: &mut Request| {
            let body = match &rq.body {
                Ok(b) => serde_json::json!(b.len()),
                Err(problem) => serde_json::json!(format!("{problem:?}")),
            };
            Reply::json(
                200,
                &serde_json::json!({
                    "method": rq.method,
                    "target": rq.target,
                    "headers": rq.headers.len(),
                    "body": body,
                }),
            )
        });
        let server = Server::bind("127.0.0.1:0", limits, None, handler).expect("bind 127.0.0.1:0");
        let addr = server.addr();
        // Serves for the life of the fuzzing process.
        std::mem::forget(server);
        addr
    })
}

fuzz_target!(|data: &[u8]| {
    let addr = server();
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_secs(5)) else {
        return;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let _ = stream.set_write_timeout(Some(Duration::from_secs(10)));
    // The server may answer and close before reading everything.
    let _ = stream.write_all(data);
    let _ = stream.shutdown(Shutdown::Write);
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    if answer.is_empty() {
        return;
    }
    let text = String::from_utf8_lossy(&answer[..answer.len().min(16)]).into_owned();
    let status = text
        .strip_prefix("HTTP/1.1 ")
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse::<u16>().ok());
    match status {
        Some(code) if KNOWN.contains(&code) => {}
        _ => panic!("not a known status line: {text:?}"),
    }
});
