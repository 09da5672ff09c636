//! The generic kinds, for a provider that is not a kind of its own: `hmac`
//! (any HMAC, Ed25519 or ECDSA P-256 rule over a template of the request),
//! `basic` (HTTP Basic authentication) and `token` (a header that holds a
//! secret); and the settings any kind takes: `batch`, `item_key`,
//! `item_type`, `empty_batch` and `answer`.

use super::kind::Kind;
use super::raw::RawSource;
use crate::verify::rule::{
    Alg, Carrier, Piece, SecretEncoding, SignedRule, TimeFormat, TimeFrom, Timestamp, Window,
};
use crate::verify::{Encoding, HmacAlgorithm, HmacParams, Scheme};

/// What a correctly signed batch without events is answered (`empty_batch`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EmptyBatch {
    /// 200, nothing stored (a provider's "intent to receive" check).
    Ack,
    /// 400.
    Reject,
}

/// What a stored or duplicate delivery is answered (`answer`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// idemhook's JSON.
    Json,
    /// 200 with no body.
    Empty,
}

/// A source's batch and answer settings.
pub(super) struct Shape {
    pub batch_items: Option<String>,
    pub empty_batch: EmptyBatch,
    pub answer: Answer,
}

/// `batch`, `empty_batch` and `answer`; with `batch`, `item_key` and
/// `item_type` take the places of `key` and `type` in `rs` (they are read
/// inside each item).
pub(super) fn shape_of(kind: Kind, rs: &mut RawSource) -> Result<Shape, String> {
    let own_batch = kind.preset().and_then(|p| p.batch).is_some();
    let batch_items = match rs.batch.as_deref() {
        None => None,
        Some(_) if own_batch => {
            return Err(format!(
                "batch: kind \"{}\" has its own batch shape",
                kind.name()
            ));
        }
        Some(spec) => Some(batch_pointer(spec)?),
    };
    if batch_items.is_none() {
        for (key, set) in [
            ("item_key", rs.item_key.is_some()),
            ("item_type", rs.item_type.is_some()),
        ] {
            if set {
                return Err(format!(
                    "{key}: only a source with batch = \"json:/...\" reads parts inside items; without batch, use {}",
                    if key == "item_key" { "key" } else { "type" }
                ));
            }
        }
        if rs.empty_batch.is_some() && !own_batch {
            return Err(
                "empty_batch: only a source whose deliveries are batches (batch = \"json:/...\") takes this key"
                    .to_string(),
            );
        }
    } else {
        if rs.key.is_some() {
            return Err(
                "key: with batch, item_key takes the place of key (its parts are read inside each item)"
                    .to_string(),
            );
        }
        if rs.event_type.is_some() {
            return Err(
                "type: with batch, item_type takes the place of type (it is read inside each item)"
                    .to_string(),
            );
        }
        rs.key = Some(rs.item_key.take().ok_or(
            "item_key: with batch, name the parts that identify an item, e.g. item_key = [\"json:/id\"]",
        )?);
        rs.event_type = rs.item_type.take();
    }
    let empty_batch = match rs.empty_batch.as_deref() {
        None | Some("ack") => EmptyBatch::Ack,
        Some("reject") => EmptyBatch::Reject,
        Some(other) => {
            return Err(format!(
                "empty_batch: expected ack or reject, got {other:?}"
            ));
        }
    };
    let answer = match rs.answer.as_deref() {
        None | Some("json") => Answer::Json,
        Some("empty") => Answer::Empty,
        Some(other) => return Err(format!("answer: expected json or empty, got {other:?}")),
    };
    let own_answer = kind
        .preset()
        .is_some_and(|p| p.ack != super::presets::Ack::Json);
    if answer == Answer::Empty && own_answer {
        return Err(format!(
            "answer: kind \"{}\" answers as its provider requires",
            kind.name()
        ));
    }
    Ok(Shape {
        batch_items,
        empty_batch,
        answer,
    })
}

/// `batch = "json:/events"`: the pointer (`json:` alone: the body is the array).
fn batch_pointer(spec: &str) -> Result<String, String> {
    match spec.strip_prefix("json:") {
        Some(pointer) if pointer.is_empty() || pointer.starts_with('/') => Ok(pointer.to_string()),
        _ => Err(format!(
            "batch: {spec:?} is not json:/pointer (e.g. \"json:/events\", or \"json:\" for a body that is an array)"
        )),
    }
}

/// A configured secret the kind cannot use: `basic` takes `user:password`.
pub(super) fn check_secret(kind: Kind, secret: &str) -> Result<(), String> {
    if kind == Kind::Basic && !secret.contains(':') {
        return Err(
            "kind \"basic\" takes user:password (the user name, a colon, the password)"
                .to_string(),
        );
    }
    Ok(())
}

/// Kind `basic`: `Authorization: Basic base64(user:password)`.
pub(super) fn basic_scheme() -> Scheme {
    Scheme::Rule {
        kind: "basic",
        rule: Box::new(SignedRule {
            alg: Alg::Token,
            encoding: Encoding::Base64,
            message: Vec::new(),
            carrier: Carrier::Header {
                name: "Authorization".to_string(),
                prefix: "Basic ".to_string(),
                list: None,
            },
            timestamp: None,
            secret_encoding: SecretEncoding::Text,
            secret_nfkd: false,
            escaped_body: false,
            require: Vec::new(),
        }),
    }
}

/// Kind `token`: `header` holds `prefix` and one of the secrets.
pub(super) fn token_scheme(rs: &RawSource) -> Result<Scheme, String> {
    let header = header_of(rs, "token")?;
    let prefix = prefix_of(rs)?;
    Ok(Scheme::Rule {
        kind: "token",
        rule: Box::new(SignedRule {
            alg: Alg::Token,
            encoding: Encoding::Text,
            message: Vec::new(),
            carrier: Carrier::Header {
                name: header,
                prefix,
                list: None,
            },
            timestamp: None,
            secret_encoding: SecretEncoding::Text,
            secret_nfkd: false,
            escaped_body: false,
            require: Vec::new(),
        }),
    })
}

/// Kind `hmac`: the plain HMAC of the body in one header, or with any of
/// `template`, an asymmetric `algorithm`, `base64url`, `secret_encoding`
/// or `secret_normalize`, a rule of the engine.
pub(super) fn hmac_scheme(rs: &RawSource) -> Result<Scheme, String> {
    let header = header_of(rs, "hmac")?;
    let alg = match rs.algorithm.as_deref().unwrap_or("sha256") {
        "sha1" => Alg::Hmac(HmacAlgorithm::Sha1),
        "sha256" => Alg::Hmac(HmacAlgorithm::Sha256),
        "sha512" => Alg::Hmac(HmacAlgorithm::Sha512),
        "ed25519" => Alg::Ed25519,
        "ecdsa-p256" => Alg::EcdsaP256,
        other => {
            return Err(format!(
                "algorithm: expected sha1, sha256, sha512, ed25519 or ecdsa-p256, got {other:?}"
            ));
        }
    };
    let encoding = match rs.encoding.as_deref().unwrap_or("hex") {
        "hex" => Encoding::Hex,
        "base64" => Encoding::Base64,
        "base64url" => Encoding::Base64Url,
        other => {
            return Err(format!(
                "encoding: expected hex, base64 or base64url, got {other:?}"
            ));
        }
    };
    let prefix = prefix_of(rs)?;
    let asymmetric = matches!(alg, Alg::Ed25519 | Alg::EcdsaP256);
    let secret_encoding = match rs.secret_encoding.as_deref() {
        Some(_) if asymmetric => {
            return Err(
                "secret_encoding: an ed25519 or ecdsa-p256 public key is read as base64, hex or PEM by itself; remove secret_encoding"
                    .to_string(),
            );
        }
        None | Some("text") => SecretEncoding::Text,
        Some("base64") => SecretEncoding::Base64,
        Some("hex") => SecretEncoding::Hex,
        Some(other) => {
            return Err(format!(
                "secret_encoding: expected text, base64 or hex, got {other:?}"
            ));
        }
    };
    let secret_nfkd = match rs.secret_normalize.as_deref() {
        Some(_) if asymmetric => {
            return Err(
                "secret_normalize: an ed25519 or ecdsa-p256 public key is not normalised; only a shared secret is"
                    .to_string(),
            );
        }
        None => false,
        Some("nfkd") => true,
        Some(other) => return Err(format!("secret_normalize: expected nfkd, got {other:?}")),
    };
    let plain = rs.template.is_none()
        && rs.timestamp_header.is_none()
        && encoding != Encoding::Base64Url
        && secret_encoding == SecretEncoding::Text
        && !secret_nfkd;
    if let (Alg::Hmac(algorithm), true) = (alg, plain) {
        return Ok(Scheme::Hmac(HmacParams {
            header,
            algorithm,
            encoding,
            prefix,
        }));
    }
    let (message, timestamp) = template_of(rs)?;
    Ok(Scheme::Rule {
        kind: "hmac",
        rule: Box::new(SignedRule {
            alg,
            encoding,
            message,
            carrier: Carrier::Header {
                name: header,
                prefix,
                list: None,
            },
            timestamp,
            secret_encoding,
            secret_nfkd,
            escaped_body: false,
            require: Vec::new(),
        }),
    })
}

/// `header`: required, a valid header name.
fn header_of(rs: &RawSource, kind: &str) -> Result<String, String> {
    let header = rs
        .header
        .clone()
        .filter(|h| !h.trim().is_empty())
        .ok_or_else(|| format!("header: kind \"{kind}\" needs the name of the header"))?;
    let is_token_char = |b: u8| b.is_ascii_graphic() && !b"\"(),/:;<=>?@[\\]{}".contains(&b);
    if !header.bytes().all(is_token_char) {
        return Err(format!("header: {header:?} is not a valid header name"));
    }
    Ok(header)
}

/// `prefix`: visible ASCII without spaces (header values are trimmed, so
/// a prefix with blanks could never match).
fn prefix_of(rs: &RawSource) -> Result<String, String> {
    let prefix = rs.prefix.clone().unwrap_or_default();
    if !prefix.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!(
            "prefix: {prefix:?} must be visible ASCII without spaces, e.g. \"sha256=\""
        ));
    }
    Ok(prefix)
}

/// The signed content of `template` (default `{body}`): `{body}`,
/// `{timestamp}` (from `timestamp_header`, checked against `tolerance`),
/// `{url}` (`public_url`), `{method}`, `{header:Name}` and literal text.
fn template_of(rs: &RawSource) -> Result<(Vec<Piece>, Option<Timestamp>), String> {
    let template = rs.template.as_deref().unwrap_or("{body}");
    let mut message = Vec::new();
    let mut rest = template;
    while !rest.is_empty() {
        match rest.find('{') {
            Some(0) => {
                let end = rest
                    .find('}')
                    .ok_or_else(|| format!("template: {template:?} has a {{ without its }}"))?;
                let name = &rest[1..end];
                message.push(match name {
                    "body" => Piece::Body,
                    "timestamp" => Piece::Timestamp,
                    "url" => Piece::Url,
                    "method" => Piece::Method,
                    other => match other.strip_prefix("header:") {
                        Some(h) if !h.is_empty() => Piece::Header(h.to_string()),
                        _ => {
                            return Err(format!(
                                "template: unknown placeholder {{{other}}}; use {{body}}, {{timestamp}}, {{url}}, {{method}} or {{header:Name}}"
                            ));
                        }
                    },
                });
                rest = &rest[end + 1..];
            }
            Some(i) => {
                message.push(Piece::Text(rest[..i].to_string()));
                rest = &rest[i..];
            }
            None => {
                message.push(Piece::Text(rest.to_string()));
                rest = "";
            }
        }
    }
    if !message.contains(&Piece::Body) {
        return Err(format!("template: {template:?} does not sign {{body}}"));
    }
    let format: TimeFormat = match &rs.timestamp_format {
        Some(f) => f.parse().map_err(|e| format!("timestamp_format: {e}"))?,
        None => TimeFormat::Unix,
    };
    let timestamp = match (&rs.timestamp_header, message.contains(&Piece::Timestamp)) {
        (Some(h), true) => Some(Timestamp {
            from: TimeFrom::Header(h.clone()),
            format,
            window: Window::Both,
        }),
        (None, true) => {
            return Err(
                "timestamp_header: the template signs {timestamp}; name the header it comes in"
                    .to_string(),
            );
        }
        (Some(_), false) => {
            return Err("timestamp_header: the template does not sign {timestamp}, so a timestamp header would not be verified".to_string());
        }
        (None, false) => None,
    };
    Ok((message, timestamp))
}
