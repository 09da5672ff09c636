//! The signed-content engine: most providers sign some concatenation of the
//! body, a timestamp, the URL they called, the method and a header or two,
//! and send one or more encoded signatures in a header. A [`SignedRule`]
//! says which, as data; the provider table (`config::presets`) and the
//! generic `hmac` kind's `template` both build one, so a provider is a row,
//! not code. What data cannot say (Twilio's sorted form parameters,
//! HubSpot's legacy hashes, Adyen's per-item signatures, Graph's
//! `clientState`) is code behind `code::Code`, one file per provider.

use base64::Engine as _;

use super::{
    Encoding, HmacAlgorithm, Key, MalformedReason, Request, Verdict, Verifier, VerifyError,
    malformed,
};

/// One piece of the signed content, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    Body,
    /// The timestamp as sent (what was signed), from [`Timestamp::from`].
    Timestamp,
    /// The URL the provider called: `public_url`, with the request's query.
    Url,
    Method,
    Header(String),
    Text(String),
    /// A JSON string or number in the body, as text (Mailgun's token).
    Json(String),
}

/// How the signature is made and compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Alg {
    Hmac(HmacAlgorithm),
    /// With the provider's public key (Discord).
    Ed25519,
    /// ECDSA P-256 over SHA-256, a DER signature (SendGrid).
    EcdsaP256,
    /// No signature: the header holds a secret itself, compared in constant time.
    Token,
}

/// Where the signatures (and for some, the timestamp) are sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Carrier {
    /// One header, `prefix` then the signature; with `list`, several entries
    /// separated by it, each with the prefix (`v1=a,v1=b`).
    Header {
        name: String,
        prefix: String,
        list: Option<char>,
    },
    /// Any of these headers may carry one (Box's primary and secondary).
    AnyHeader(Vec<String>),
    /// Every header named this prefix and a number (`X-DocuSign-Signature-1`).
    Numbered(String),
    /// `t=<ts>,v1=<sig>,...`; a new `t=` starts another group (Persona's
    /// rotation), separators are commas and blanks.
    Pairs {
        name: String,
        timestamp_key: String,
        signature_key: String,
    },
    /// `<ts>,<sig>,<sig>` (Recurly).
    Positional(String),
    /// `t=<ts>,v1=<sig>,v1=<sig>` with exactly one timestamp, entries split
    /// at `separator` (Stripe's `t=,v1=`, Paddle's `ts=;h1=`); checked on a
    /// direct path that allocates nothing (Stripe's is the hottest).
    Stamped {
        name: &'static str,
        separator: char,
        timestamp_key: &'static str,
        signature_key: &'static str,
    },
    /// A string at a JSON pointer in the body (Mailgun).
    Json(String),
    /// Blank-separated `<version>,<signature>` entries, the version naming
    /// the signature's algorithm (Standard Webhooks' `v1,<hmac>
    /// v1a,<ed25519>`), in a family of three headers: the event id (signed
    /// as [`Piece::Header`] of the first family's id, and required of a
    /// signed request), the timestamp and the signatures. Checked on its
    /// own path (`versioned`), every signature base64 or hex as canonical.
    Versioned {
        /// The header families, by preference: the first any of whose
        /// headers is sent is read, else the first (which errors then name).
        families: &'static [Family],
        /// The versions an entry may carry and their algorithms; entries
        /// of other versions are ignored. `send` signs as the first.
        versions: &'static [(&'static str, Alg)],
    },
}

/// The names of one family of a [`Carrier::Versioned`]'s headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Family {
    pub id: &'static str,
    pub timestamp: &'static str,
    pub signature: &'static str,
}

impl Carrier {
    /// The header named in errors and logs.
    fn name(&self) -> &str {
        match self {
            Carrier::Header { name, .. }
            | Carrier::Pairs { name, .. }
            | Carrier::Positional(name) => name,
            Carrier::Stamped { name, .. } => name,
            Carrier::Versioned { families, .. } => families.first().map_or("", |f| f.signature),
            Carrier::AnyHeader(names) => names.first().map_or("", String::as_str),
            Carrier::Numbered(prefix) => prefix,
            Carrier::Json(pointer) => pointer,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeFormat {
    /// Unix seconds.
    Unix,
    /// Unix milliseconds.
    UnixMs,
    /// RFC 3339, fractions of a second allowed.
    Rfc3339,
}

impl std::str::FromStr for TimeFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "unix" => Ok(TimeFormat::Unix),
            "unix_ms" => Ok(TimeFormat::UnixMs),
            "rfc3339" => Ok(TimeFormat::Rfc3339),
            other => Err(format!("expected unix, unix_ms or rfc3339, got {other:?}")),
        }
    }
}

/// Which side of now the tolerance bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Window {
    Both,
    /// Old timestamps are refused, future ones accepted (the providers'
    /// libraries check only the past).
    PastOnly,
    /// Old ones beyond the tolerance and any in the future are refused (Box).
    NoFuture,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TimeFrom {
    Header(String),
    /// The carrier's own timestamp (`Pairs`, `Positional`).
    Carrier,
    Json(String),
    /// An integer member of the body's top-level object (unix seconds, or
    /// milliseconds for `unix_ms`), read only once the signature holds, so
    /// an unsigned body is never parsed (Linear's `webhookTimestamp`). The
    /// body signs it: the message has no [`Piece::Timestamp`] of its own.
    Member(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timestamp {
    pub from: TimeFrom,
    pub format: TimeFormat,
    pub window: Window,
}

/// How a shared secret's text is turned into key bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecretEncoding {
    Text,
    Base64,
    Hex,
}

/// A provider's signature rule, as data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedRule {
    pub alg: Alg,
    pub encoding: Encoding,
    pub message: Vec<Piece>,
    pub carrier: Carrier,
    pub timestamp: Option<Timestamp>,
    /// How a shared secret's text becomes key bytes (its text, or decoded
    /// from base64 or hex).
    pub secret_encoding: SecretEncoding,
    /// The secret's text NFKD-normalised first (EasyPost).
    pub secret_nfkd: bool,
    /// Prefixes naming what a secret is, the rest of it then written in
    /// `secret_encoding` (Standard Webhooks' `whsec_` for a shared secret
    /// and `whpk_` for an Ed25519 public key); a secret with none is a key
    /// of the rule's own algorithm, written likewise. Empty: the secret is
    /// taken as `secret_encoding` says, whole.
    pub secret_prefixes: &'static [(&'static str, Alg)],
    /// Also accept a signature over the body with non-ASCII characters
    /// written as `\uXXXX` (Box's SDKs check both).
    pub escaped_body: bool,
    /// Headers that must carry these values (Box's signature version and
    /// algorithm), compared ignoring ASCII case.
    pub require: Vec<(String, String)>,
    /// Parsed as strictly as the first kinds always were: a header's
    /// timestamp must be a number before any signature is tried, a
    /// signature's prefix matches in its case too, and base64 is canonical
    /// (padding required, no stray bits: one spelling per tag).
    pub strict: bool,
    /// How `check` words the rule, where the provider's own words say it
    /// better than [`SignedRule::describe`]'s.
    pub summary: Option<&'static str>,
}

impl SignedRule {
    pub fn covers(&self, piece: &Piece) -> bool {
        self.message.contains(piece)
    }

    /// Where the signature is sent, in a few words, for `check`.
    pub fn carrier_text(&self) -> String {
        match &self.carrier {
            Carrier::Header { name, prefix, list } => format!(
                "{name}{}{}",
                if prefix.is_empty() {
                    String::new()
                } else {
                    format!(" {prefix}")
                },
                if list.is_some() { " (several)" } else { "" }
            ),
            Carrier::AnyHeader(names) => names.join(" or "),
            Carrier::Numbered(prefix) => format!("{prefix}1..N"),
            Carrier::Pairs {
                name,
                timestamp_key,
                signature_key,
            } => {
                format!("{name} {timestamp_key}=..,{signature_key}=..")
            }
            Carrier::Positional(name) => format!("{name} ts,sig,.."),
            Carrier::Stamped {
                name,
                separator,
                timestamp_key,
                signature_key,
            } => format!("{name} {timestamp_key}=..{separator}{signature_key}=.."),
            Carrier::Json(pointer) => format!("body {pointer}"),
            Carrier::Versioned { versions, .. } => {
                let entries: Vec<String> =
                    versions.iter().map(|(v, _)| format!("{v},..")).collect();
                format!("{} {}", self.carrier.name(), entries.join(" "))
            }
        }
    }

    /// The rule in one line, for `check`.
    pub fn describe(&self) -> String {
        if let Some(summary) = self.summary {
            return summary.to_owned();
        }
        let carrier = self.carrier_text();
        let content: Vec<String> = self
            .message
            .iter()
            .map(|p| match p {
                Piece::Body => "body".to_owned(),
                Piece::Timestamp => "timestamp".to_owned(),
                Piece::Url => "public_url".to_owned(),
                Piece::Method => "method".to_owned(),
                Piece::Header(h) => h.clone(),
                Piece::Text(t) => format!("{t:?}"),
                Piece::Json(p) => format!("body {p}"),
            })
            .collect();
        let encoding = match self.encoding {
            Encoding::Hex => "hex",
            Encoding::Base64 => "base64",
            Encoding::Base64Url => "base64url",
            Encoding::Text => "plain",
        };
        let what = match self.alg {
            Alg::Hmac(HmacAlgorithm::Sha1) => {
                format!("{encoding} HMAC-SHA1 of {}", content.join(" + "))
            }
            Alg::Hmac(HmacAlgorithm::Sha256) => {
                format!("{encoding} HMAC-SHA256 of {}", content.join(" + "))
            }
            Alg::Hmac(HmacAlgorithm::Sha512) => {
                format!("{encoding} HMAC-SHA512 of {}", content.join(" + "))
            }
            Alg::Ed25519 => format!(
                "{encoding} Ed25519 signature (public key) of {}",
                content.join(" + ")
            ),
            Alg::EcdsaP256 => format!(
                "{encoding} ECDSA P-256 signature (public key) of {}",
                content.join(" + ")
            ),
            Alg::Token => format!("{encoding} shared secret, compared as is"),
        };
        let time = match &self.timestamp {
            None => String::new(),
            Some(t) => format!(
                "; timestamp ({}) {}",
                match t.format {
                    TimeFormat::Unix => "unix seconds",
                    TimeFormat::UnixMs => "unix ms",
                    TimeFormat::Rfc3339 => "RFC 3339",
                },
                match t.window {
                    Window::Both => "within tolerance",
                    Window::PastOnly => "not older than tolerance",
                    Window::NoFuture => "not older than tolerance, not in the future",
                }
            ),
        };
        let secret = match (self.secret_encoding, self.secret_nfkd) {
            (SecretEncoding::Text, false) => "",
            (SecretEncoding::Text, true) => "; secret NFKD-normalised",
            (SecretEncoding::Base64, false) => "; secret base64-decoded",
            (SecretEncoding::Base64, true) => "; secret NFKD-normalised, base64-decoded",
            (SecretEncoding::Hex, false) => "; secret hex-decoded",
            (SecretEncoding::Hex, true) => "; secret NFKD-normalised, hex-decoded",
        };
        format!("{carrier}: {what}{time}{secret}")
    }
}

/// Signatures of one group, with the timestamp that goes with them.
struct Group {
    timestamp: Option<String>,
    signatures: Vec<Vec<u8>>,
}

fn group(timestamp: Option<String>, signatures: Vec<Vec<u8>>) -> Group {
    Group {
        timestamp,
        signatures,
    }
}

/// The parsed JSON body, for rules that read it; parsed at most once.
struct Body<'a> {
    bytes: &'a [u8],
    json: Option<Option<serde_json::Value>>,
}

impl Body<'_> {
    fn text_at(&mut self, pointer: &str) -> Result<String, VerifyError> {
        let bytes = self.bytes;
        let json = self
            .json
            .get_or_insert_with(|| serde_json::from_slice(bytes).ok());
        let value = json
            .as_ref()
            .ok_or_else(|| VerifyError::InvalidBody("not JSON".to_owned()))?
            .pointer(pointer)
            .ok_or_else(|| VerifyError::InvalidBody(format!("no {pointer}")))?;
        match value {
            serde_json::Value::String(s) => Ok(s.clone()),
            serde_json::Value::Number(n) => Ok(n.to_string()),
            _ => Err(VerifyError::InvalidBody(format!(
                "{pointer} is not text or a number"
            ))),
        }
    }
}

pub(super) fn verify(
    verifier: &Verifier,
    rule: &SignedRule,
    rq: &Request<'_>,
    now: i64,
) -> Result<Verdict, VerifyError> {
    if let Carrier::Stamped {
        name,
        separator,
        timestamp_key,
        signature_key,
    } = rule.carrier
    {
        let keys = (timestamp_key, signature_key);
        return super::stamped::verify(verifier, rule, rq, now, (name, separator), keys);
    }
    if let Carrier::Versioned { families, versions } = rule.carrier {
        return super::versioned::verify(verifier, rule, rq, now, families, versions);
    }
    let mut body = Body {
        bytes: rq.body,
        json: None,
    };
    check_required(rule, rq)?;
    if rule.strict
        && let Some(
            t @ Timestamp {
                from: TimeFrom::Header(name),
                ..
            },
        ) = &rule.timestamp
    {
        // The signature header is there, and the timestamp a number,
        // before any signature is looked at.
        super::required_header(rq.headers, rule.carrier.name())?;
        parse_time(rule, t, super::required_header(rq.headers, name)?)?;
    }
    let groups = read_carrier(rule, rq, &mut body)?;
    let url = if rule.covers(&Piece::Url) {
        Some(verifier.url_of(rq.query))
    } else {
        None
    };
    for g in &groups {
        let timestamp = group_timestamp(rule, rq, g, &mut body)?;
        let parts = message_parts(rule, rq, timestamp.as_deref(), url.as_deref(), &mut body)?;
        let Some(index) = match_group(verifier, rule, rq.body, &parts, &g.signatures) else {
            continue;
        };
        let signed_at = match (&rule.timestamp, &timestamp) {
            (Some(t), Some(raw)) => {
                let secs = parse_time(rule, t, raw)?;
                verifier.check_window(secs, now, t.window)?;
                Some(secs)
            }
            (
                Some(
                    t @ Timestamp {
                        from: TimeFrom::Member(member),
                        ..
                    },
                ),
                None,
            ) => {
                let secs = member_time(rq.body, member, t.format)?;
                verifier.check_window(secs, now, t.window)?;
                Some(secs)
            }
            _ => None,
        };
        return Ok(Verdict {
            secret_index: Some(index),
            timestamp: signed_at,
        });
    }
    if url.is_some() {
        Err(VerifyError::NoSignatureMatchedUrl)
    } else {
        Err(VerifyError::NoSignatureMatched)
    }
}

/// Checks that the headers the rule requires carry their values.
fn check_required(rule: &SignedRule, rq: &Request<'_>) -> Result<(), VerifyError> {
    for (name, expected) in &rule.require {
        let value = super::required_header(rq.headers, name)?;
        if !value.eq_ignore_ascii_case(expected) {
            return Err(malformed(
                name,
                MalformedReason::Unsupported(expected.clone()),
            ));
        }
    }
    Ok(())
}

/// The timestamp signed with a group's signatures, as sent, when the rule
/// has one: from its header, the carrier or the body.
fn group_timestamp(
    rule: &SignedRule,
    rq: &Request<'_>,
    g: &Group,
    body: &mut Body<'_>,
) -> Result<Option<String>, VerifyError> {
    let Some(t) = &rule.timestamp else {
        return Ok(None);
    };
    Ok(Some(match &t.from {
        TimeFrom::Header(name) => super::required_header(rq.headers, name)?.to_owned(),
        TimeFrom::Carrier => g
            .timestamp
            .clone()
            .ok_or_else(|| malformed(rule.carrier.name(), MalformedReason::NoTimestamp))?,
        TimeFrom::Json(pointer) => body.text_at(pointer)?,
        // Read once the signature holds (`member_time`).
        TimeFrom::Member(_) => return Ok(None),
    }))
}

/// The integer `member` of the body's top-level object, in unix seconds.
/// Every other member is skipped without being built (serde_json skips
/// iteratively), so a deeply nested body costs no stack on the connection
/// thread: this runs before the receiver's nesting check.
fn member_time(body: &[u8], member: &str, format: TimeFormat) -> Result<i64, VerifyError> {
    let not_json = || VerifyError::InvalidBody("not json".to_owned());
    let absent = || VerifyError::InvalidBody(format!("no {member}"));
    // Only an object has members.
    if body.trim_ascii_start().first() != Some(&b'{') {
        serde_json::from_slice::<serde::de::IgnoredAny>(body).map_err(|_| not_json())?;
        return Err(absent());
    }
    let mut json = serde_json::Deserializer::from_slice(body);
    let value = serde::Deserializer::deserialize_map(&mut json, MemberOf(member))
        .and_then(|value| json.end().map(|()| value))
        .map_err(|_| not_json())?;
    let number = value
        .ok_or_else(absent)?
        .as_i64()
        .ok_or_else(|| VerifyError::InvalidBody(format!("{member} is not an integer")))?;
    Ok(match format {
        TimeFormat::UnixMs => number.div_euclid(1000),
        TimeFormat::Unix | TimeFormat::Rfc3339 => number,
    })
}

/// Reads one member of a JSON object (`null` counts as absent, a second
/// copy is an error), skipping the others.
struct MemberOf<'m>(&'m str);

impl<'de> serde::de::Visitor<'de> for MemberOf<'_> {
    type Value = Option<serde_json::Value>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut found: Option<Option<serde_json::Value>> = None;
        while let Some(is_member) = map.next_key_seed(IsMember(self.0))? {
            if !is_member {
                map.next_value::<serde::de::IgnoredAny>()?;
            } else if found.is_some() {
                return Err(serde::de::Error::custom("the member is there twice"));
            } else {
                found = Some(map.next_value()?);
            }
        }
        Ok(found.flatten())
    }
}

/// True for a key that is the member, compared without building it.
struct IsMember<'m>(&'m str);

impl<'de> serde::de::DeserializeSeed<'de> for IsMember<'_> {
    type Value = bool;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> serde::de::Visitor<'de> for IsMember<'_> {
    type Value = bool;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a member name")
    }

    fn visit_str<E: serde::de::Error>(self, key: &str) -> Result<bool, E> {
        Ok(key == self.0)
    }
}

/// The signed content's pieces, in order; the body's piece is left empty
/// (it is borrowed, as sent or escaped, by [`with_body`]).
fn message_parts(
    rule: &SignedRule,
    rq: &Request<'_>,
    timestamp: Option<&str>,
    url: Option<&str>,
    body: &mut Body<'_>,
) -> Result<Vec<Vec<u8>>, VerifyError> {
    let mut parts: Vec<Vec<u8>> = Vec::with_capacity(rule.message.len());
    for piece in &rule.message {
        parts.push(match piece {
            Piece::Body => Vec::new(), // placeholder: `with_body` borrows the body
            Piece::Timestamp => timestamp.unwrap_or_default().as_bytes().to_vec(),
            Piece::Url => url.unwrap_or_default().as_bytes().to_vec(),
            Piece::Method => rq.method.as_bytes().to_vec(),
            Piece::Header(name) => super::required_header(rq.headers, name)?
                .as_bytes()
                .to_vec(),
            Piece::Text(text) => text.as_bytes().to_vec(),
            Piece::Json(pointer) => body.text_at(pointer)?.into_bytes(),
        });
    }
    Ok(parts)
}

/// The signed content: `parts` with `body` in the body's place.
fn with_body<'m>(rule: &SignedRule, parts: &'m [Vec<u8>], body: &'m [u8]) -> Vec<&'m [u8]> {
    rule.message
        .iter()
        .zip(parts)
        .map(|(piece, part)| match piece {
            Piece::Body => body,
            _ => part.as_slice(),
        })
        .collect()
}

/// Index of the first key a signature of the group matches, over the body
/// as sent or, when the rule also accepts it, escaped.
fn match_group(
    verifier: &Verifier,
    rule: &SignedRule,
    body: &[u8],
    parts: &[Vec<u8>],
    signatures: &[Vec<u8>],
) -> Option<usize> {
    let mut matched = match_keys(verifier, rule, &with_body(rule, parts, body), signatures);
    if matched.is_none() && rule.escaped_body {
        let escaped = escape_unicode(body);
        if escaped.as_bytes() != body {
            let message = with_body(rule, parts, escaped.as_bytes());
            matched = match_keys(verifier, rule, &message, signatures);
        }
    }
    matched
}

/// The body as Box's SDKs escape it before their second try: every
/// backslash not before `/` doubled, `\n` `\r` `\t` written out, and every
/// other character outside printable ASCII as `\uXXXX` (UTF-16, lowercase).
fn escape_unicode(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len() + 16);
    for (i, &c) in chars.iter().enumerate() {
        match c {
            '\\' if chars.get(i + 1) != Some(&'/') => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            ' '..='~' => out.push(c),
            _ => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
        }
    }
    out
}

/// The signature groups the carrier holds; at least one signature.
fn read_carrier(
    rule: &SignedRule,
    rq: &Request<'_>,
    body: &mut Body<'_>,
) -> Result<Vec<Group>, VerifyError> {
    let (headers, encoding) = (rq.headers, rule.encoding);
    let groups = match &rule.carrier {
        Carrier::Header { name, prefix, list } => {
            let prefix = (prefix.as_str(), rule.strict);
            vec![group(
                None,
                header_signatures(headers, name, prefix, *list, encoding)?,
            )]
        }
        Carrier::AnyHeader(names) => {
            vec![group(
                None,
                any_header_signatures(headers, names, encoding)?,
            )]
        }
        Carrier::Numbered(prefix) => {
            vec![group(None, numbered_signatures(headers, prefix, encoding)?)]
        }
        Carrier::Pairs {
            name,
            timestamp_key,
            signature_key,
        } => pair_groups(headers, name, timestamp_key, signature_key, encoding)?,
        Carrier::Positional(name) => vec![positional_group(headers, name, encoding)?],
        // Verified on their own paths (`stamped`, `versioned`).
        Carrier::Stamped { .. } | Carrier::Versioned { .. } => {
            return Err(malformed(rule.carrier.name(), MalformedReason::NoSignature));
        }
        Carrier::Json(pointer) => {
            let raw = body.text_at(pointer)?;
            vec![group(None, vec![decode(pointer, &raw, encoding)?])]
        }
    };
    if groups.iter().all(|g| g.signatures.is_empty()) {
        return Err(malformed(rule.carrier.name(), MalformedReason::NoSignature));
    }
    Ok(groups)
}

/// The signatures of a [`Carrier::Header`]: its value, or each entry of
/// its list, after the prefix (compared in its case too when `strict`).
fn header_signatures(
    headers: &[(String, String)],
    name: &str,
    (prefix, strict): (&str, bool),
    list: Option<char>,
    encoding: Encoding,
) -> Result<Vec<Vec<u8>>, VerifyError> {
    let value = super::required_header(headers, name)?;
    let entries = match list {
        Some(separator) => super::split_entries(name, value, separator)?,
        None => vec![value],
    };
    let mut signatures = Vec::new();
    for entry in entries {
        let raw = if strict {
            entry.strip_prefix(prefix)
        } else {
            super::strip_prefix_ignore_case(entry, prefix)
        };
        let raw =
            raw.ok_or_else(|| malformed(name, MalformedReason::MissingPrefix(prefix.to_owned())))?;
        signatures.push(if strict {
            // Canonical: one spelling per tag.
            super::decode_signature(name, raw, encoding)?
        } else {
            decode(name, raw, encoding)?
        });
    }
    Ok(signatures)
}

/// The signatures of a [`Carrier::AnyHeader`]: one from each of its
/// headers that is set, at least one.
fn any_header_signatures(
    headers: &[(String, String)],
    names: &[String],
    encoding: Encoding,
) -> Result<Vec<Vec<u8>>, VerifyError> {
    let mut signatures = Vec::new();
    for name in names {
        if let Some(value) = super::optional_header(headers, name)? {
            signatures.push(decode(name, value, encoding)?);
        }
    }
    if signatures.is_empty() {
        // Named as the carrier is: by its first header.
        let first = names.first().map_or("", String::as_str);
        return Err(VerifyError::MissingHeader(first.to_ascii_lowercase()));
    }
    Ok(signatures)
}

/// The signatures of a [`Carrier::Numbered`]: one from each header named
/// the prefix and a number (at most [`super::MAX_ENTRIES`]), at least one.
fn numbered_signatures(
    headers: &[(String, String)],
    prefix: &str,
    encoding: Encoding,
) -> Result<Vec<Vec<u8>>, VerifyError> {
    let mut signatures = Vec::new();
    for (name, _) in headers {
        let numbered = super::strip_prefix_ignore_case(name, prefix)
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
        if numbered
            && signatures.len() < super::MAX_ENTRIES
            && let Some(value) = super::optional_header(headers, name)?
        {
            signatures.push(decode(name, value, encoding)?);
        }
    }
    if signatures.is_empty() {
        return Err(VerifyError::MissingHeader(format!(
            "{}1",
            prefix.to_ascii_lowercase()
        )));
    }
    Ok(signatures)
}

/// The groups of a [`Carrier::Pairs`] header: each timestamp key starts
/// one, the signature keys after it join it; at least one timestamp.
fn pair_groups(
    headers: &[(String, String)],
    name: &str,
    timestamp_key: &str,
    signature_key: &str,
    encoding: Encoding,
) -> Result<Vec<Group>, VerifyError> {
    let value = super::required_header(headers, name)?;
    let mut groups: Vec<Group> = Vec::new();
    let entries: Vec<&str> = value
        .split([',', ' ', '\t'])
        .filter(|e| !e.is_empty())
        .take(super::MAX_ENTRIES + 1)
        .collect();
    if entries.len() > super::MAX_ENTRIES {
        return Err(malformed(
            name,
            MalformedReason::TooManyEntries {
                max: super::MAX_ENTRIES,
            },
        ));
    }
    for entry in entries {
        let (key, raw) = entry
            .split_once('=')
            .ok_or_else(|| malformed(name, MalformedReason::BadEntry("key=value")))?;
        if key == timestamp_key {
            groups.push(group(Some(raw.to_owned()), Vec::new()));
        } else if key == signature_key {
            let signature = decode(name, raw, encoding)?;
            match groups.last_mut() {
                Some(g) => g.signatures.push(signature),
                None => groups.push(group(None, vec![signature])),
            }
        }
    }
    if groups.iter().all(|g| g.timestamp.is_none()) {
        return Err(malformed(name, MalformedReason::NoTimestamp));
    }
    Ok(groups)
}

/// The group of a [`Carrier::Positional`] header: the timestamp, then the
/// signatures.
fn positional_group(
    headers: &[(String, String)],
    name: &str,
    encoding: Encoding,
) -> Result<Group, VerifyError> {
    let value = super::required_header(headers, name)?;
    let entries = super::split_entries(name, value, ',')?;
    let (timestamp, rest) = entries
        .split_first()
        .ok_or_else(|| malformed(name, MalformedReason::NoTimestamp))?;
    let signatures = rest
        .iter()
        .map(|raw| decode(name, raw, encoding))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(group(Some((*timestamp).to_owned()), signatures))
}

fn decode(name: &str, raw: &str, encoding: Encoding) -> Result<Vec<u8>, VerifyError> {
    match encoding {
        Encoding::Text => {
            if raw.is_empty() {
                Err(malformed(name, MalformedReason::NoSignature))
            } else {
                Ok(raw.as_bytes().to_vec())
            }
        }
        // Providers that send base64 differ on padding; decode either way.
        Encoding::Base64 => base64::engine::general_purpose::STANDARD_PAD_INDIFFERENT
            .decode(raw)
            .map_err(|_| malformed(name, MalformedReason::BadBase64)),
        Encoding::Hex | Encoding::Base64Url => super::decode_signature(name, raw, encoding),
    }
}

/// Index of the first key any signature matches.
fn match_keys(
    verifier: &Verifier,
    rule: &SignedRule,
    message: &[&[u8]],
    signatures: &[Vec<u8>],
) -> Option<usize> {
    if signatures.is_empty() {
        return None;
    }
    let mut content: Option<Vec<u8>> = None;
    let keys = verifier.keys_now();
    keys.iter()
        .position(|key| key_matches(rule.alg, key, message, signatures, &mut content))
}

/// True when one of `signatures`, made by `alg`, is `key`'s over
/// `message`; `content` keeps the joined message for the public keys.
pub(super) fn key_matches(
    alg: Alg,
    key: &Key,
    message: &[&[u8]],
    signatures: &[Vec<u8>],
    content: &mut Option<Vec<u8>>,
) -> bool {
    let joined = || message.concat();
    match (alg, key) {
        (Alg::Hmac(alg), Key::Hmac(k)) => super::hmac_matches(alg, k, message, signatures),
        (Alg::Token, Key::Hmac(k)) => signatures.iter().any(|s| super::same_secret(s, k)),
        (Alg::Ed25519, Key::Ed25519(k)) => {
            let content = content.get_or_insert_with(joined);
            signatures.iter().any(|s| {
                ed25519_dalek::Signature::from_slice(s)
                    .is_ok_and(|sig| k.verify_strict(content, &sig).is_ok())
            })
        }
        (Alg::EcdsaP256, Key::P256(k)) => {
            let content = content.get_or_insert_with(joined);
            signatures.iter().any(|s| {
                p256::ecdsa::Signature::from_der(s).is_ok_and(|sig| {
                    p256::ecdsa::signature::Verifier::verify(k, content, &sig).is_ok()
                })
            })
        }
        _ => false,
    }
}

pub(super) fn parse_time(rule: &SignedRule, t: &Timestamp, raw: &str) -> Result<i64, VerifyError> {
    let name = match &t.from {
        TimeFrom::Header(name) => name.as_str(),
        _ => rule.carrier.name(),
    };
    parse_time_as(name, t.format, raw)
}

/// A timestamp sent in the header `name`, in unix seconds.
pub(super) fn parse_time_as(name: &str, format: TimeFormat, raw: &str) -> Result<i64, VerifyError> {
    match format {
        TimeFormat::Unix => super::parse_timestamp(name, raw),
        TimeFormat::UnixMs => super::parse_timestamp(name, raw).map(|ms| ms.div_euclid(1000)),
        TimeFormat::Rfc3339 => crate::time::parse_rfc3339(raw)
            .ok_or_else(|| malformed(name, MalformedReason::BadTimestamp)),
    }
}

/// The timestamp `now` written as the rule writes it.
pub(super) fn format_time(format: TimeFormat, now: i64) -> String {
    match format {
        TimeFormat::Unix => now.to_string(),
        TimeFormat::UnixMs => (now * 1000).to_string(),
        TimeFormat::Rfc3339 => crate::time::rfc3339_secs(now),
    }
}

/// The body with its signature written in at the carrier's pointer, and
/// the signed timestamp (when it is in the body too) set to `now`
/// (Mailgun's `signature` object).
pub(super) fn sign_into_body(
    verifier: &Verifier,
    rule: &SignedRule,
    body: &[u8],
    now: i64,
) -> Result<Vec<u8>, String> {
    let Carrier::Json(carrier) = &rule.carrier else {
        return Ok(body.to_vec());
    };
    let mut value: serde_json::Value =
        serde_json::from_slice(body).map_err(|_| "the body is not JSON".to_owned())?;
    if let Some(Timestamp {
        from: TimeFrom::Json(pointer),
        format,
        ..
    }) = &rule.timestamp
        && let Some(slot) = value.pointer_mut(pointer)
    {
        *slot = serde_json::Value::String(format_time(*format, now));
    }
    let mut content = Vec::new();
    for piece in &rule.message {
        match piece {
            Piece::Json(pointer) => {
                let v = value
                    .pointer(pointer)
                    .ok_or_else(|| format!("the body has no {pointer} to sign"))?;
                content.extend_from_slice(
                    v.as_str()
                        .map_or_else(|| v.to_string(), str::to_owned)
                        .as_bytes(),
                );
            }
            Piece::Text(text) => content.extend_from_slice(text.as_bytes()),
            Piece::Body => content.extend_from_slice(body),
            _ => return Err("this rule cannot be signed into the body".to_owned()),
        }
    }
    let Alg::Hmac(alg) = rule.alg else {
        return Err("only an HMAC is written into the body".to_owned());
    };
    let tag = verifier.sign_hmac(alg, &[&content])?;
    let slot = value
        .pointer_mut(carrier)
        .ok_or_else(|| format!("the body has no {carrier} to write the signature in"))?;
    *slot = serde_json::Value::String(super::encode_signature(&tag, rule.encoding));
    serde_json::to_vec(&value).map_err(|e| e.to_string())
}

/// The headers the provider would send: the signature (and timestamp)
/// headers for `rq` at `now`, signed with secret 0 or, for the asymmetric
/// kinds, with `private_key` (PKCS#8 PEM).
pub(super) fn sign(
    verifier: &Verifier,
    rule: &SignedRule,
    rq: &Request<'_>,
    (now, id): (i64, &str),
    private_key: Option<&str>,
) -> Result<Vec<(String, String)>, String> {
    let mut out: Vec<(String, String)> = rule.require.clone();
    // A versioned carrier's id header is signed: `id` is sent in it.
    if let Carrier::Versioned { families, .. } = &rule.carrier
        && let Some(family) = families.first()
    {
        if id.is_empty() || id.trim_matches([' ', '\t']) != id || id.chars().any(char::is_control) {
            return Err(format!("{id:?} cannot be a {}", family.id));
        }
        out.push((family.id.to_owned(), id.to_owned()));
    }
    let timestamp = rule.timestamp.as_ref().map(|t| format_time(t.format, now));
    if let (Some(t), Some(ts)) = (&rule.timestamp, &timestamp)
        && let TimeFrom::Header(name) = &t.from
    {
        out.push((name.clone(), ts.clone()));
    }
    let content = content_to_sign(verifier, rule, rq, timestamp.as_deref(), &out)?;
    let signature = signature_of(verifier, rule.alg, &content, private_key)?;
    let encoded = match rule.encoding {
        Encoding::Text => String::from_utf8(signature).map_err(|_| "the secret is not text")?,
        encoding => super::encode_signature(&signature, encoding),
    };
    push_signature(&mut out, &rule.carrier, encoded, timestamp.as_deref())?;
    Ok(out)
}

/// The content the rule signs for `rq`, a signed header taken from the
/// headers about to be sent (`out`) before the request's own.
fn content_to_sign(
    verifier: &Verifier,
    rule: &SignedRule,
    rq: &Request<'_>,
    timestamp: Option<&str>,
    out: &[(String, String)],
) -> Result<Vec<u8>, String> {
    let url = verifier.url_of(rq.query);
    let body_json: Option<serde_json::Value> = serde_json::from_slice(rq.body).ok();
    let mut content = Vec::new();
    for piece in &rule.message {
        match piece {
            Piece::Body => content.extend_from_slice(rq.body),
            Piece::Timestamp => content.extend_from_slice(timestamp.unwrap_or("").as_bytes()),
            Piece::Url => content.extend_from_slice(url.as_bytes()),
            Piece::Method => content.extend_from_slice(rq.method.as_bytes()),
            Piece::Header(name) => {
                let value = out
                    .iter()
                    .chain(rq.headers)
                    .find(|(n, _)| n.eq_ignore_ascii_case(name))
                    .map(|(_, v)| v.clone())
                    .ok_or_else(|| format!("the signed header {name} is not set"))?;
                content.extend_from_slice(value.as_bytes());
            }
            Piece::Text(text) => content.extend_from_slice(text.as_bytes()),
            Piece::Json(pointer) => {
                let value = body_json
                    .as_ref()
                    .and_then(|v| v.pointer(pointer))
                    .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_owned))
                    .ok_or_else(|| format!("the body has no {pointer} to sign"))?;
                content.extend_from_slice(value.as_bytes());
            }
        }
    }
    Ok(content)
}

/// The signature of `content` by `alg`: an HMAC with secret 0, the secret
/// itself for a token, else made with `private_key`.
fn signature_of(
    verifier: &Verifier,
    alg: Alg,
    content: &[u8],
    private_key: Option<&str>,
) -> Result<Vec<u8>, String> {
    Ok(match alg {
        Alg::Hmac(alg) => verifier.sign_hmac(alg, &[content])?,
        Alg::Token => match verifier.keys.first() {
            Some(Key::Hmac(k)) => k.clone(),
            _ => return Err("no secret to send".to_owned()),
        },
        Alg::Ed25519 => {
            use ed25519_dalek::Signer as _;
            use ed25519_dalek::pkcs8::DecodePrivateKey as _;
            let pem =
                private_key.ok_or("this kind signs with a private key: pass --private-key FILE")?;
            let key = ed25519_dalek::SigningKey::from_pkcs8_pem(pem)
                .map_err(|_| "--private-key is not a PKCS#8 PEM Ed25519 private key".to_owned())?;
            key.sign(content).to_bytes().to_vec()
        }
        Alg::EcdsaP256 => {
            use p256::ecdsa::signature::Signer as _;
            use p256::pkcs8::DecodePrivateKey as _;
            let pem =
                private_key.ok_or("this kind signs with a private key: pass --private-key FILE")?;
            let key = p256::ecdsa::SigningKey::from_pkcs8_pem(pem)
                .map_err(|_| "--private-key is not a PKCS#8 PEM P-256 private key".to_owned())?;
            let sig: p256::ecdsa::Signature = key.sign(content);
            sig.to_der().as_bytes().to_vec()
        }
    })
}

/// Adds the encoded signature to `out` as the carrier sends it (with the
/// timestamp, for the carriers that hold one).
fn push_signature(
    out: &mut Vec<(String, String)>,
    carrier: &Carrier,
    encoded: String,
    timestamp: Option<&str>,
) -> Result<(), String> {
    match carrier {
        Carrier::Header { name, prefix, .. } => {
            out.push((name.clone(), format!("{prefix}{encoded}")))
        }
        Carrier::AnyHeader(names) => {
            let name = names.first().ok_or("no signature header")?;
            out.push((name.clone(), encoded));
        }
        Carrier::Numbered(prefix) => out.push((format!("{prefix}1"), encoded)),
        Carrier::Pairs {
            name,
            timestamp_key,
            signature_key,
        } => out.push((
            name.clone(),
            format!(
                "{timestamp_key}={},{signature_key}={encoded}",
                timestamp.unwrap_or("")
            ),
        )),
        Carrier::Positional(name) => out.push((
            name.clone(),
            format!("{},{encoded}", timestamp.unwrap_or("")),
        )),
        Carrier::Stamped {
            name,
            separator,
            timestamp_key,
            signature_key,
        } => out.push((
            (*name).to_owned(),
            format!(
                "{timestamp_key}={}{separator}{signature_key}={encoded}",
                timestamp.unwrap_or("")
            ),
        )),
        Carrier::Versioned { families, versions } => {
            let (Some(family), Some((version, _))) = (families.first(), versions.first()) else {
                return Err("no signature header".to_owned());
            };
            out.push((
                family.timestamp.to_owned(),
                timestamp.unwrap_or("").to_owned(),
            ));
            out.push((family.signature.to_owned(), format!("{version},{encoded}")));
        }
        // In the body: `sign_into_body` writes it there.
        Carrier::Json(_) => {}
    }
    Ok(())
}
