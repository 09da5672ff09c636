//! A forward action's `check` URL template, parsed with the config:
//! literal text and placeholders (`{idempotency_key}`, `{source}`,
//! `{event_id}`, `{action}`), each filled in URL-encoded. The GET that asks
//! it is `outbox/ask.rs`'s. No IO.

use std::fmt;

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
}
