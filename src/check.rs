//! Asking a downstream whether an effect already exists: a forward
//! action's `check` URL template, and the GET that asks it.
//!
//! A forward worker asks before an attempt whose predecessor's outcome is
//! unknown (a timeout, a cut connection, a 5xx, a lease takeover, a
//! replay); `reconcile --check` asks about stuck and failed jobs. The
//! downstream answers 200 when it has processed the `Idempotency-Key`
//! (found), 404 when it has not (not found); anything else, or no answer,
//! is an error and decides nothing. This module does the HTTP and the
//! classification; what to record is the caller's (`outbox/`,
//! `ops/reconcile.rs`). It runs no SQL.

use std::fmt;
use std::io::Read;
use std::time::Duration;

use crate::config::Forward;
use crate::time::now_ms;
use crate::verify::Verifier;

/// How much of a check's answer is kept with the attempt it decides.
const RESPONSE_HEAD_BYTES: usize = 1024;
/// The most of an answer read (so the connection can be reused).
const RESPONSE_READ_LIMIT: u64 = 64 * 1024;

/// A `check` URL template: literal text and placeholders, each filled in
/// URL-encoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    text: String,
    pieces: Vec<Piece>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Literal(String),
    IdempotencyKey,
    Source,
    EventId,
    Action,
}

/// The placeholders a template may use.
pub const PLACEHOLDERS: [&str; 4] = ["idempotency_key", "source", "event_id", "action"];

impl Template {
    /// Parses `http://host/path/{idempotency_key}`-style text. Refused: not
    /// http(s), an unknown placeholder, a brace without its pair.
    pub fn parse(text: &str) -> Result<Template, String> {
        if !(text.starts_with("http://") || text.starts_with("https://")) {
            return Err(format!(
                "expected an http:// or https:// URL template, got {text:?}"
            ));
        }
        let mut pieces = Vec::new();
        let mut literal = String::new();
        let mut rest = text;
        while let Some(i) = rest.find(['{', '}']) {
            literal.push_str(&rest[..i]);
            if rest[i..].starts_with('}') {
                return Err(format!(
                    "a '}}' without its '{{' in {text:?} (placeholders: {})",
                    placeholder_list()
                ));
            }
            let Some(end) = rest[i + 1..].find('}') else {
                return Err(format!("a '{{' without its '}}' in {text:?}"));
            };
            let name = &rest[i + 1..i + 1 + end];
            let piece = match name {
                "idempotency_key" => Piece::IdempotencyKey,
                "source" => Piece::Source,
                "event_id" => Piece::EventId,
                "action" => Piece::Action,
                other => {
                    return Err(format!(
                        "unknown placeholder {{{other}}} in {text:?} (placeholders: {})",
                        placeholder_list()
                    ));
                }
            };
            if !literal.is_empty() {
                pieces.push(Piece::Literal(std::mem::take(&mut literal)));
            }
            pieces.push(piece);
            rest = &rest[i + 1 + end + 1..];
        }
        literal.push_str(rest);
        if !literal.is_empty() {
            pieces.push(Piece::Literal(literal));
        }
        Ok(Template {
            text: text.to_string(),
            pieces,
        })
    }

    /// The URL for one job, each placeholder URL-encoded.
    pub fn render(&self, source: &str, event_id: &str, action: &str) -> String {
        let mut out = String::with_capacity(self.text.len() + 64);
        for piece in &self.pieces {
            match piece {
                Piece::Literal(s) => out.push_str(s),
                Piece::IdempotencyKey => {
                    encode_into(&mut out, &idempotency_key(source, event_id, action));
                }
                Piece::Source => encode_into(&mut out, source),
                Piece::EventId => encode_into(&mut out, event_id),
                Piece::Action => encode_into(&mut out, action),
            }
        }
        out
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl fmt::Display for Template {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

fn placeholder_list() -> String {
    PLACEHOLDERS.map(|p| format!("{{{p}}}")).join(", ")
}

/// The key a forwarded request carries: `{source}:{event_id}:{action}`.
pub fn idempotency_key(source: &str, event_id: &str, action: &str) -> String {
    format!("{source}:{event_id}:{action}")
}

/// Percent-encodes every byte but the unreserved characters of RFC 3986
/// (`A-Z a-z 0-9 - . _ ~`), so a value cannot add a path segment, a query
/// or a fragment.
fn encode_into(out: &mut String, value: &str) {
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push('%');
            out.push(char::from(b"0123456789ABCDEF"[usize::from(b >> 4)]));
            out.push(char::from(b"0123456789ABCDEF"[usize::from(b & 15)]));
        }
    }
}

pub use crate::state::Answer;

/// One check, asked and classified.
#[derive(Debug, Clone)]
pub struct Asked {
    pub answer: Answer,
    pub started_at: i64,
    pub finished_at: i64,
    pub http_status: Option<u16>,
    /// Why it is an error: connect, timeout, protocol or status.
    pub cause: Option<&'static str>,
    pub error: Option<String>,
    pub request_id: Option<String>,
    pub response_head: Option<String>,
    pub retry_after: Option<Duration>,
}

/// GETs the check URL of one job with its `Idempotency-Key` (and the
/// `X-Idemhook-*` headers; signed like a forward when the action has a
/// `sign_secret`, over an empty body), within the action's timeout.
pub fn ask(
    agent: &ureq::Agent,
    fwd: &Forward,
    template: &Template,
    job: (&str, &str, &str),
    signer: Option<&Verifier>,
) -> Asked {
    let (source, event_id, action) = job;
    let started_at = now_ms();
    let key = idempotency_key(source, event_id, action);
    let url = template.render(source, event_id, action);
    let mut request = agent
        .get(&url)
        .config()
        .timeout_global(Some(fwd.timeout))
        .timeout_connect(Some(fwd.timeout.min(Duration::from_secs(5))))
        .build()
        .header("Idempotency-Key", key.as_str())
        .header("X-Idemhook-Source", source)
        .header("X-Idemhook-Event-Id", event_id)
        .header("X-Idemhook-Check", "1");
    if let Some(signer) = signer
        && let Ok(headers) = signer.sign(b"", started_at / 1000, &key)
    {
        for (name, value) in headers {
            request = request.header(name, value);
        }
    }
    let mut asked = Asked {
        answer: Answer::Error,
        started_at,
        finished_at: started_at,
        http_status: None,
        cause: None,
        error: None,
        request_id: None,
        response_head: None,
        retry_after: None,
    };
    match request.call() {
        Ok(mut response) => {
            let status = response.status().as_u16();
            asked.http_status = Some(status);
            asked.answer = Answer::of_status(status);
            let header = |name: &str| {
                response
                    .headers()
                    .get(name)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string)
            };
            asked.request_id = header(&fwd.request_id_header);
            asked.retry_after = header("retry-after")
                .and_then(|v| crate::retry::parse_retry_after(&v, started_at / 1000));
            let mut head = Vec::new();
            let _ = response
                .body_mut()
                .as_reader()
                .take(RESPONSE_READ_LIMIT)
                .read_to_end(&mut head);
            head.truncate(RESPONSE_HEAD_BYTES);
            asked.response_head = Some(String::from_utf8_lossy(&head).into_owned());
            if asked.answer == Answer::Error {
                asked.cause = Some("status");
                asked.error = Some(format!(
                    "the check answered {status} (200: done, 404: not done)"
                ));
            }
        }
        Err(e) => {
            let (kind, message) = crate::retry::classify_error(&e);
            asked.cause = Some(kind);
            asked.error = Some(format!("the check got no answer: {message}"));
        }
    }
    asked.finished_at = now_ms();
    asked
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_filled_in_url_encoded() {
        let t = Template::parse(
            "http://127.0.0.1:9000/effects/{idempotency_key}?s={source}&e={event_id}&a={action}",
        )
        .unwrap();
        assert_eq!(
            t.render("stripe", "evt/1 ?#&%", "notify-app"),
            "http://127.0.0.1:9000/effects/stripe%3Aevt%2F1%20%3F%23%26%25%3Anotify-app\
             ?s=stripe&e=evt%2F1%20%3F%23%26%25&a=notify-app"
        );
        assert_eq!(
            Template::parse("https://x/{event_id}")
                .unwrap()
                .render("s", "é~._-", "a"),
            "https://x/%C3%A9~._-"
        );
        let plain = Template::parse("http://x/exists").unwrap();
        assert_eq!(plain.render("s", "e", "a"), "http://x/exists");
        assert_eq!(plain.to_string(), "http://x/exists");
    }

    #[test]
    fn bad_templates_say_what_is_wrong() {
        for (text, want) in [
            ("ftp://x/{event_id}", "http:// or https://"),
            ("/effects/{event_id}", "http:// or https://"),
            ("http://x/{key}", "unknown placeholder {key}"),
            ("http://x/{event_id", "without its '}'"),
            ("http://x/event_id}", "without its '{'"),
            ("http://x/{}", "unknown placeholder {}"),
        ] {
            let e = Template::parse(text).unwrap_err();
            assert!(e.contains(want), "{text}: expected {want:?} in {e:?}");
        }
    }

    #[test]
    fn only_200_and_404_decide() {
        assert_eq!(Answer::of_status(200), Answer::Found);
        assert_eq!(Answer::of_status(404), Answer::NotFound);
        for s in [201, 204, 301, 400, 410, 429, 500, 503] {
            assert_eq!(Answer::of_status(s), Answer::Error, "{s}");
        }
    }
}
