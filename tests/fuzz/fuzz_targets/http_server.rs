//! Fuzz target `http_server`: our HTTP/1.1 server's head parser and
//! chunked decoder, on bytes and through the public `http::server::Server`
//! on 127.0.0.1.
//!
//! For each input:
//! 1. Heads, differentially: whenever our head reader accepts a head
//!    (`http::server::fuzzing::parse_head`), `httparse` parses the same
//!    bytes to the same method, target and fields.
//! 2. Chunked bodies: whenever our decoder accepts a chunked body
//!    (`fuzzing::decode_chunked`), it is valid by RFC 9112 section 7.1 as
//!    checked by the strict decoder below (written apart from ours, from
//!    the grammar), which decodes it to the same bytes.
//! 3. The server: the input is written to a new connection, the write side
//!    is closed, and whatever comes back is read to the end. Never panics
//!    (libFuzzer's panic hook aborts on a panic in any thread, connection
//!    threads included), and the server answers only with well-formed
//!    status lines it knows.
//!
//! The limits are small so that short inputs reach them: head 2 KiB,
//! target 256 bytes, 16 headers, body 512 bytes.

#![no_main]

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::OnceLock;
use std::time::Duration;

use idemhook::http::reply::Reply;
use idemhook::http::server::{Limits, Request, Server, fuzzing};
use libfuzzer_sys::fuzz_target;

const KNOWN: [u16; 12] = [100, 200, 400, 405, 408, 413, 414, 431, 500, 501, 503, 505];
const MAX_BODY: usize = 512;

fn limits() -> Limits {
    let t = Duration::from_secs(2);
    let mut limits = Limits::new(2, MAX_BODY, 64, t, t, t).per_address(64, 0);
    limits.max_head_bytes = 2048;
    limits.max_headers = 16;
    limits.max_target_bytes = 256;
    limits
}

fn server() -> SocketAddr {
    static ADDR: OnceLock<SocketAddr> = OnceLock::new();
    *ADDR.get_or_init(|| {
        let handler = Box::new(|rq: &mut Request| {
            let body = serde_json::json!(rq.body.len());
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
        let server = Server::bind("127.0.0.1:0", limits(), None, handler, Box::new(|_, _, _, _| {}))
            .expect("bind 127.0.0.1:0");
        let addr = server.addr();
        // Serves for the life of the fuzzing process.
        std::mem::forget(server);
        addr
    })
}

/// Our head reader against httparse.
fn check_head(data: &[u8]) {
    let Ok(ours) = fuzzing::parse_head(data, &limits()) else {
        return;
    };
    let head = &data[..ours.consumed];
    let mut fields = [httparse::EMPTY_HEADER; 64];
    let mut theirs = httparse::Request::new(&mut fields);
    let parsed = theirs.parse(head);
    assert_eq!(
        parsed,
        Ok(httparse::Status::Complete(head.len())),
        "we accepted a head httparse does not: {:?}",
        String::from_utf8_lossy(head)
    );
    assert_eq!(theirs.method, Some(ours.method.as_str()), "method");
    assert_eq!(theirs.path, Some(ours.raw_target.as_str()), "target");
    let trim = |v: &[u8]| {
        let v = String::from_utf8_lossy(v).into_owned();
        v.trim_matches([' ', '\t']).to_string()
    };
    let theirs: Vec<(String, String)> = theirs
        .headers
        .iter()
        .map(|h| (h.name.to_string(), trim(h.value)))
        .collect();
    let ours: Vec<(String, String)> = ours
        .headers
        .iter()
        .map(|(n, v)| (n.clone(), trim(v.as_bytes())))
        .collect();
    assert_eq!(theirs, ours, "fields of {:?}", String::from_utf8_lossy(head));
}

/// Our chunked decoder against the strict one.
fn check_chunked(data: &[u8]) {
    let Ok((body, used)) = fuzzing::decode_chunked(data, MAX_BODY) else {
        return;
    };
    assert_eq!(
        strict::chunked_body(&data[..used]).as_deref(),
        Some(body.as_slice()),
        "we accepted a chunked body RFC 9112 7.1 does not (or decoded it otherwise): {:?}",
        String::from_utf8_lossy(&data[..used])
    );
}

/// A strict decoder of `chunked-body` (RFC 9112 7.1), from the grammar:
///
/// ```text
/// chunked-body   = *chunk last-chunk trailer-section CRLF
/// chunk          = chunk-size [ chunk-ext ] CRLF chunk-data CRLF
/// chunk-size     = 1*HEXDIG
/// last-chunk     = 1*("0") [ chunk-ext ] CRLF
/// chunk-ext      = *( BWS ";" BWS chunk-ext-name [ BWS "=" BWS chunk-ext-val ] )
/// chunk-ext-name = token
/// chunk-ext-val  = token / quoted-string
/// trailer-section = *( field-line CRLF )
/// field-line     = field-name ":" OWS field-value OWS
/// ```
mod strict {
    fn tchar(b: u8) -> bool {
        matches!(b, b'!' | b'#' | b'$' | b'%' | b'&' | b'\'' | b'*' | b'+' | b'-' | b'.'
            | b'^' | b'_' | b'`' | b'|' | b'~')
            || b.is_ascii_digit()
            || b.is_ascii_alphabetic()
    }

    /// A cursor over bytes.
    struct P<'a> {
        s: &'a [u8],
        i: usize,
    }

    impl P<'_> {
        fn peek(&self) -> Option<u8> {
            self.s.get(self.i).copied()
        }
        fn bws(&mut self) {
            while matches!(self.peek(), Some(b' ' | b'\t')) {
                self.i += 1;
            }
        }
        fn token(&mut self) -> bool {
            let start = self.i;
            while self.peek().is_some_and(tchar) {
                self.i += 1;
            }
            self.i > start
        }
        fn quoted_string(&mut self) -> bool {
            if self.peek() != Some(b'"') {
                return false;
            }
            self.i += 1;
            loop {
                match self.peek() {
                    None => return false,
                    Some(b'"') => {
                        self.i += 1;
                        return true;
                    }
                    Some(b'\\') => {
                        self.i += 1;
                        match self.peek() {
                            Some(b'\t' | b' ' | 0x21..=0x7e | 0x80..=0xff) => self.i += 1,
                            _ => return false,
                        }
                    }
                    Some(b'\t' | b' ' | 0x21 | 0x23..=0x5b | 0x5d..=0x7e | 0x80..=0xff) => {
                        self.i += 1
                    }
                    Some(_) => return false,
                }
            }
        }
        /// `chunk-ext`, to the end of the slice.
        fn chunk_ext(&mut self) -> bool {
            loop {
                if self.i == self.s.len() {
                    return true;
                }
                self.bws();
                if self.peek() != Some(b';') {
                    return false;
                }
                self.i += 1;
                self.bws();
                if !self.token() {
                    return false;
                }
                let save = self.i;
                self.bws();
                if self.peek() == Some(b'=') {
                    self.i += 1;
                    self.bws();
                    if !(self.token() || self.quoted_string()) {
                        return false;
                    }
                } else {
                    self.i = save;
                }
            }
        }
    }

    /// Splits off one line ended by CRLF.
    fn line(s: &[u8]) -> Option<(&[u8], &[u8])> {
        let at = s.windows(2).position(|w| w == b"\r\n")?;
        Some((&s[..at], &s[at + 2..]))
    }

    fn field_line(l: &[u8]) -> bool {
        let mut p = P { s: l, i: 0 };
        if !p.token() || p.peek() != Some(b':') {
            return false;
        }
        l[p.i + 1..]
            .iter()
            .all(|&b| matches!(b, b' ' | b'\t' | 0x21..=0x7e | 0x80..=0xff))
    }

    /// The body, when `s` is exactly one valid chunked body.
    pub fn chunked_body(mut s: &[u8]) -> Option<Vec<u8>> {
        let mut body = Vec::new();
        loop {
            let (l, rest) = line(s)?;
            let digits = l.iter().take_while(|b| b.is_ascii_hexdigit()).count();
            if digits == 0 {
                return None;
            }
            let mut size: u128 = 0;
            for &d in &l[..digits] {
                size = size.checked_mul(16)?.checked_add(u128::from((d as char).to_digit(16)?))?;
            }
            let mut ext = P { s: &l[digits..], i: 0 };
            if !ext.chunk_ext() {
                return None;
            }
            s = rest;
            if size == 0 {
                break;
            }
            let size = usize::try_from(size).ok()?;
            if s.len() < size.checked_add(2)? || &s[size..size + 2] != b"\r\n" {
                return None;
            }
            body.extend_from_slice(&s[..size]);
            s = &s[size + 2..];
        }
        loop {
            let (l, rest) = line(s)?;
            s = rest;
            if l.is_empty() {
                break;
            }
            if !field_line(l) {
                return None;
            }
        }
        s.is_empty().then_some(body)
    }
}

fuzz_target!(|data: &[u8]| {
    check_head(data);
    check_chunked(data);

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
