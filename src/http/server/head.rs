//! Request heads: read under their limits, parsed by `httparse`, with our
//! framing rules on top (one Content-Length or chunked, never both; a
//! Host; origin-form targets; no control characters in values).

use std::io::BufRead;

use super::Limits;
use super::read::{Stop, is_token, read_line};

pub(super) struct Head {
    pub(super) method: String,
    /// The target in origin form (an absolute-form target's path and query).
    pub(super) target: String,
    pub(super) headers: Vec<(String, String)>,
    pub(super) content_length: Option<usize>,
    pub(super) chunked: bool,
    pub(super) keep_alive: bool,
    pub(super) expect_continue: bool,
}

pub(super) enum HeadError {
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

/// The target of a request head's first line, once that line is whole, in
/// origin form.
fn target_of(raw: &[u8]) -> Option<String> {
    let line = &raw[..raw.iter().position(|&b| b == b'\n')?];
    let line = std::str::from_utf8(line).ok()?;
    let target = line.split(' ').nth(1)?;
    origin_form(target)
}

/// An origin-form target as is; an absolute-form one (`http://host/path`)
/// as its path and query. None for anything else.
fn origin_form(target: &str) -> Option<String> {
    if target.starts_with('/') {
        return Some(target.to_string());
    }
    let (scheme, rest) = target.split_once("://")?;
    if !(scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https")) {
        return None;
    }
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(end);
    if authority.is_empty() || authority.contains('@') || !valid_host(authority) {
        return None;
    }
    if path.starts_with('#') {
        return None;
    }
    Some(if path.starts_with('/') {
        path.to_string()
    } else {
        format!("/{path}")
    })
}

/// `uri-host [ ":" port ]` (RFC 9110 7.2), or empty.
fn valid_host(v: &str) -> bool {
    let (host, port) = if let Some(rest) = v.strip_prefix('[') {
        let Some((inside, after)) = rest.split_once(']') else {
            return false;
        };
        if inside.is_empty()
            || !inside
                .bytes()
                .all(|b| b.is_ascii_hexdigit() || b == b':' || b == b'.')
        {
            return false;
        }
        match after.strip_prefix(':') {
            Some(port) => ("x", Some(port)),
            None if after.is_empty() => ("x", None),
            None => return false,
        }
    } else {
        match v.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (v, None),
        }
    };
    let reg_name = host
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=%".contains(&b));
    reg_name && port.is_none_or(|p| p.bytes().all(|b| b.is_ascii_digit()))
}

/// Reads and parses a request head, within the head size limit (and the
/// deadlines of the socket). Also returns the target as the request line
/// gave it... in origin form.
pub(super) fn read_head<R: BufRead>(
    reader: &mut R,
    limits: &Limits,
) -> Result<(Head, String), HeadError> {
    let mut raw: Vec<u8> = Vec::with_capacity(1024);
    // Read lines until the empty line, bounded in bytes.
    loop {
        let before = raw.len();
        match read_line(reader, &mut raw, limits.max_head_bytes) {
            Ok(()) => {}
            Err(Stop::Eof | Stop::Busy(_)) => return Err(HeadError::Closed),
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
    let target = target_of(&raw);
    match parse_head(&raw, limits) {
        Ok(head) => {
            let target = head.target.clone();
            Ok((head, target))
        }
        Err((status, message)) => Err(HeadError::Refused {
            status,
            message,
            target,
        }),
    }
}

/// Methods the routes know (each answers 405 where it is not allowed);
/// any other method token is 501.
const KNOWN_METHODS: [&str; 8] = [
    "GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "TRACE", "PATCH",
];

/// A bad head: the status and the message it is answered with.
type BadHead = (u16, String);

/// A 400 with this message.
fn bad(message: &str) -> BadHead {
    (400, message.to_string())
}

/// The head (a request line, field lines and the blank line, as
/// `read_head` gathered it), or the status and message it is refused with.
/// `httparse` parses it; our rules on top: one space between the parts of
/// the request line, HTTP/1.0 or 1.1, a known method, an origin- or
/// absolute-form target, UTF-8 values, one valid `Host` (required on
/// HTTP/1.1), and unambiguous framing.
pub(super) fn parse_head(raw: &[u8], limits: &Limits) -> Result<Head, BadHead> {
    let line = request_line(raw, limits)?;
    let headers = field_lines(raw, &line, limits)?;
    check_host(&headers, line.http11)?;
    let content_length = content_length_of(&headers)?;
    let chunked = is_chunked(&headers)?;
    if chunked && content_length.is_some() {
        return Err(bad("both Content-Length and Transfer-Encoding"));
    }
    let keep_alive = keeps_alive(&headers, line.http11, chunked);
    // No 100 Continue to an HTTP/1.0 client (RFC 9110 10.1.1).
    let expect_continue = line.http11
        && field_values(&headers, "expect").any(|v| v.eq_ignore_ascii_case("100-continue"));
    Ok(Head {
        method: line.method.to_string(),
        target: line.origin,
        content_length,
        chunked,
        keep_alive,
        expect_continue,
        headers,
    })
}

/// A request line, checked.
struct RequestLine<'a> {
    method: &'a str,
    /// The target as sent.
    target: &'a str,
    /// The target in origin form (`*` for `OPTIONS *`).
    origin: String,
    /// HTTP/1.1, not 1.0.
    http11: bool,
}

/// The head's first line: one space between method, target and version,
/// HTTP/1.0 or 1.1, a known method, and a target within its limit in
/// origin or absolute form.
fn request_line<'a>(raw: &'a [u8], limits: &Limits) -> Result<RequestLine<'a>, BadHead> {
    let line_end = raw.iter().position(|&b| b == b'\n').unwrap_or(raw.len());
    let request_line = &raw[..line_end];
    let request_line = request_line.strip_suffix(b"\r").unwrap_or(request_line);
    let request_line =
        std::str::from_utf8(request_line).map_err(|_| bad("request line is not UTF-8"))?;
    let mut parts = request_line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad("malformed request line"));
    };
    if method.is_empty() || !method.bytes().all(is_token) {
        return Err(bad("malformed method"));
    }
    let http11 = is_http11(version)?;
    if !KNOWN_METHODS.contains(&method) {
        return Err((501, format!("method {method} is not implemented")));
    }
    if target.len() > limits.max_target_bytes {
        return Err((414, "request target too long".into()));
    }
    if target.bytes().any(|b| b <= b' ' || b == 0x7f) {
        return Err(bad("malformed request target"));
    }
    let origin = if target == "*" && method == "OPTIONS" {
        "*".to_string()
    } else {
        origin_form(target).ok_or_else(|| bad("malformed request target"))?
    };
    Ok(RequestLine {
        method,
        target,
        origin,
        http11,
    })
}

/// Whether the request line's version is HTTP/1.1 (else 1.0); any other
/// version is 505, anything not a version 400.
fn is_http11(version: &str) -> Result<bool, BadHead> {
    match version {
        "HTTP/1.1" => Ok(true),
        "HTTP/1.0" => Ok(false),
        v if v.strip_prefix("HTTP/").is_some_and(|n| {
            n.starts_with(|c: char| c.is_ascii_digit())
                && n.bytes().all(|b| b.is_ascii_digit() || b == b'.')
        }) =>
        {
            Err((505, "only HTTP/1.0 and HTTP/1.1 are supported".into()))
        }
        _ => Err(bad("malformed request line")),
    }
}

/// The head's field lines as `httparse` reads them, within the limit on
/// their number, the request line agreeing with ours; values UTF-8, their
/// surrounding blanks trimmed.
fn field_lines(
    raw: &[u8],
    line: &RequestLine<'_>,
    limits: &Limits,
) -> Result<Vec<(String, String)>, BadHead> {
    let mut fields = vec![httparse::EMPTY_HEADER; limits.max_headers];
    let mut parsed = httparse::Request::new(&mut fields);
    match parsed.parse(raw) {
        Ok(httparse::Status::Complete(n)) if n == raw.len() => {}
        Ok(_) => return Err(bad("malformed request head")),
        Err(httparse::Error::TooManyHeaders) => {
            return Err((431, "too many request headers".into()));
        }
        Err(httparse::Error::HeaderValue) => {
            return Err(bad(
                "a header value contains a control character (NUL, CR, LF or another)",
            ));
        }
        Err(httparse::Error::HeaderName) => {
            return Err(bad(
                "malformed header name (folded header lines are not accepted)",
            ));
        }
        Err(httparse::Error::NewLine) => return Err(bad("malformed line ending in the head")),
        Err(e) => return Err(bad(&format!("malformed request head: {e}"))),
    }
    if parsed.method != Some(line.method) || parsed.path != Some(line.target) {
        return Err(bad("malformed request line"));
    }
    let mut headers: Vec<(String, String)> = Vec::with_capacity(parsed.headers.len());
    for field in parsed.headers.iter() {
        let value = std::str::from_utf8(field.value)
            .map_err(|_| bad(&format!("header {} is not valid UTF-8", field.name)))?;
        headers.push((
            field.name.to_string(),
            value.trim_matches([' ', '\t']).to_string(),
        ));
    }
    Ok(headers)
}

/// The values of every field named `name` (ignoring ASCII case), in order.
fn field_values<'h>(
    headers: &'h [(String, String)],
    name: &'h str,
) -> impl Iterator<Item = &'h str> {
    headers
        .iter()
        .filter(move |(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// One valid `Host`, or none on HTTP/1.0.
fn check_host(headers: &[(String, String)], http11: bool) -> Result<(), BadHead> {
    let hosts: Vec<&str> = field_values(headers, "host").collect();
    match hosts.as_slice() {
        [] if http11 => Err(bad("missing Host header")),
        [] => Ok(()),
        [host] if valid_host(host) => Ok(()),
        [_] => Err(bad("malformed Host header")),
        _ => Err(bad("more than one Host header")),
    }
}

/// The `Content-Length`, if any: digits only, every copy the same.
fn content_length_of(headers: &[(String, String)]) -> Result<Option<usize>, BadHead> {
    let lengths: Vec<&str> = field_values(headers, "content-length").collect();
    let Some(v) = lengths.first() else {
        return Ok(None);
    };
    // 1*DIGIT (RFC 9110 8.6): no sign, no spaces, no hex.
    if v.is_empty() || v.len() > 19 || !v.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad("malformed Content-Length"));
    }
    let n: usize = v.parse().map_err(|_| bad("malformed Content-Length"))?;
    if lengths.iter().any(|other| other != v) {
        return Err(bad("conflicting Content-Length headers"));
    }
    Ok(Some(n))
}

/// Whether the body is chunked: `Transfer-Encoding: chunked` alone, any
/// other transfer coding 501.
fn is_chunked(headers: &[(String, String)]) -> Result<bool, BadHead> {
    let te: Vec<&str> = field_values(headers, "transfer-encoding").collect();
    match te.as_slice() {
        [] => Ok(false),
        [one] if one.eq_ignore_ascii_case("chunked") => Ok(true),
        _ => Err((501, "only Transfer-Encoding: chunked is supported".into())),
    }
}

/// Whether the connection stays open after this request, by its version
/// and `Connection` fields.
fn keeps_alive(headers: &[(String, String)], http11: bool, chunked: bool) -> bool {
    let connection = field_values(headers, "connection")
        .collect::<Vec<_>>()
        .join(",")
        .to_ascii_lowercase();
    // An HTTP/1.0 message with Transfer-Encoding has faulty framing: the
    // connection closes after it (RFC 9112 6.1).
    if http11 {
        !connection.split(',').any(|t| t.trim() == "close")
    } else {
        !chunked && connection.split(',').any(|t| t.trim() == "keep-alive")
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn limits() -> Limits {
        let t = Duration::from_secs(10);
        Limits::new(2, 1024, 16, t, t, t)
    }

    /// The head with a `Host` field after its request line, unless it
    /// has one.
    fn with_host(raw: &str) -> String {
        if raw.to_ascii_lowercase().contains("\nhost:") {
            return raw.to_string();
        }
        match raw.split_once("\r\n") {
            Some((line, rest)) => format!("{line}\r\nHost: x\r\n{rest}"),
            None => raw.to_string(),
        }
    }

    fn parse(raw: &str) -> Result<Head, u16> {
        parse_head(with_host(raw).as_bytes(), &limits()).map_err(|(status, _)| status)
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
    fn control_characters_in_values_are_refused() {
        for c in ["\r", "\x01", "\x0b", "\x1b", "\x7f"] {
            assert_eq!(
                parse(&format!("GET / HTTP/1.1\r\nX: a{c}b\r\n\r\n")).err(),
                Some(400),
                "{c:?}"
            );
        }
        assert!(parse("GET / HTTP/1.1\r\nX: a\tb \r\n\r\n").is_ok());
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
