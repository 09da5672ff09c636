//! The direct path of [`Carrier::Stamped`](super::rule::Carrier::Stamped):
//! one header `t=<ts>,v1=<sig>[,v1=<sig>...]` (Stripe; Paddle's
//! `ts=<ts>;h1=<sig>`) with exactly one timestamp, any signature may match
//! (one per active secret while rotating), keys other than the two named
//! are ignored. A request with hex signatures is verified without
//! allocating (only an error's message does): the header is walked twice
//! (to check it, then to compare), each signature decoded into a buffer on
//! the stack, and the MAC computed once per secret. Stripe's is the
//! hottest verification path; it stays as direct as it was when it was
//! code of its own (which collected the entries and the decoded
//! signatures into vectors).

use std::borrow::Cow;

use hmac::{Hmac, KeyInit, Mac};

use super::rule::{Alg, Piece, SignedRule, TimeFormat, TimeFrom, Timestamp, Window};
use super::{
    Encoding, HmacAlgorithm, Key, MAX_ENTRIES, MalformedReason, Request, Verdict, Verifier,
    VerifyError, malformed,
};

/// The longest tag any HMAC here makes (SHA-512), in bytes.
const MAX_TAG: usize = 64;

/// The entries of the header: trimmed of blanks, empty ones dropped.
fn entries(value: &str, separator: char) -> impl Iterator<Item = &str> {
    value
        .split(separator)
        .map(|entry| entry.trim_matches([' ', '\t']))
        .filter(|entry| !entry.is_empty())
}

pub(super) fn verify(
    verifier: &Verifier,
    rule: &SignedRule,
    rq: &Request<'_>,
    now: i64,
    (name, separator): (&'static str, char),
    (timestamp_key, signature_key): (&'static str, &'static str),
) -> Result<Verdict, VerifyError> {
    let value = super::required_header(rq.headers, name)?;
    if entries(value, separator).nth(MAX_ENTRIES).is_some() {
        return Err(malformed(
            name,
            MalformedReason::TooManyEntries { max: MAX_ENTRIES },
        ));
    }
    // First walk: the header is well formed, one timestamp, signatures
    // in the rule's encoding.
    let mut timestamp_raw = None;
    let mut signatures = 0usize;
    let mut buffer = [0u8; MAX_TAG];
    for entry in entries(value, separator) {
        let (key, raw) = entry
            .split_once('=')
            .ok_or_else(|| malformed(name, MalformedReason::BadEntry("key=value")))?;
        if key == timestamp_key {
            if timestamp_raw.replace(raw).is_some() {
                return Err(malformed(
                    name,
                    MalformedReason::RepeatedField(timestamp_key),
                ));
            }
        } else if key == signature_key {
            decode(name, raw, rule.encoding, &mut buffer)?;
            signatures += 1;
        }
    }
    let timestamp_raw =
        timestamp_raw.ok_or_else(|| malformed(name, MalformedReason::NoTimestamp))?;
    let default_time = Timestamp {
        from: TimeFrom::Carrier,
        format: TimeFormat::Unix,
        window: Window::Both,
    };
    let time = rule.timestamp.as_ref().unwrap_or(&default_time);
    let timestamp = super::rule::parse_time(rule, time, timestamp_raw)?;
    if signatures == 0 {
        return Err(malformed(name, MalformedReason::NoSignature));
    }
    // Second walk: each secret's MAC against every signature.
    let Alg::Hmac(alg) = rule.alg else {
        return Err(VerifyError::NoSignatureMatched);
    };
    let content = Content {
        timestamp: timestamp_raw,
        rq,
    };
    let index = verifier
        .keys
        .iter()
        .position(|key| match key {
            Key::Hmac(key) => {
                let signatures = entries(value, separator)
                    .filter_map(|entry| entry.split_once('='))
                    .filter(|(key, _)| *key == signature_key)
                    .map(|(_, raw)| raw);
                matches(alg, key, &rule.message, &content, signatures, rule.encoding)
            }
            Key::Ed25519(_) | Key::P256(_) => false,
        })
        .ok_or(VerifyError::NoSignatureMatched)?;
    verifier.check_window(timestamp, now, time.window)?;
    Ok(Verdict {
        secret_index: Some(index),
        timestamp: Some(timestamp),
    })
}

/// The signature's bytes, in `buffer` when it is hex (no allocation);
/// None when it is longer than any tag (it matches nothing).
fn decode<'b>(
    name: &str,
    raw: &str,
    encoding: Encoding,
    buffer: &'b mut [u8; MAX_TAG],
) -> Result<Option<Cow<'b, [u8]>>, VerifyError> {
    if raw.is_empty() {
        return Err(malformed(name, MalformedReason::NoSignature));
    }
    if encoding != Encoding::Hex {
        return super::decode_signature(name, raw, encoding).map(|b| Some(Cow::Owned(b)));
    }
    if !raw.len().is_multiple_of(2) || !raw.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(malformed(name, MalformedReason::BadHex));
    }
    let len = raw.len() / 2;
    if len > MAX_TAG {
        return Ok(None);
    }
    let out = &mut buffer[..len];
    hex::decode_to_slice(raw, out).map_err(|_| malformed(name, MalformedReason::BadHex))?;
    Ok(Some(Cow::Borrowed(out)))
}

/// What the pieces of the signed content are, for one request.
struct Content<'a> {
    timestamp: &'a str,
    rq: &'a Request<'a>,
}

impl Content<'_> {
    fn bytes<'p>(&'p self, piece: &'p Piece) -> &'p [u8] {
        match piece {
            Piece::Timestamp => self.timestamp.as_bytes(),
            Piece::Body => self.rq.body,
            Piece::Text(text) => text.as_bytes(),
            Piece::Method => self.rq.method.as_bytes(),
            // A stamped carrier's providers sign none of these (a preset
            // test keeps it so); signing nothing matches no real tag.
            Piece::Url | Piece::Header(_) | Piece::Json(_) => b"",
        }
    }
}

/// True when one of `signatures` is the MAC of the rule's content with `key`.
fn matches<'a>(
    alg: HmacAlgorithm,
    key: &[u8],
    message: &[Piece],
    content: &Content<'_>,
    signatures: impl Iterator<Item = &'a str>,
    encoding: Encoding,
) -> bool {
    match alg {
        HmacAlgorithm::Sha1 => {
            matches_with::<Hmac<sha1::Sha1>>(key, message, content, signatures, encoding)
        }
        HmacAlgorithm::Sha256 => {
            matches_with::<Hmac<sha2::Sha256>>(key, message, content, signatures, encoding)
        }
        HmacAlgorithm::Sha512 => {
            matches_with::<Hmac<sha2::Sha512>>(key, message, content, signatures, encoding)
        }
    }
}

/// The MAC is computed once; each signature is compared against a clone
/// with `verify_slice`, in constant time.
fn matches_with<'a, M: Mac + KeyInit + Clone>(
    key: &[u8],
    message: &[Piece],
    content: &Content<'_>,
    signatures: impl Iterator<Item = &'a str>,
    encoding: Encoding,
) -> bool {
    let Ok(mut mac) = <M as KeyInit>::new_from_slice(key) else {
        return false;
    };
    for piece in message {
        mac.update(content.bytes(piece));
    }
    let mut buffer = [0u8; MAX_TAG];
    for raw in signatures {
        // Every signature was decoded in the first walk.
        if let Ok(Some(tag)) = decode("", raw, encoding, &mut buffer)
            && mac.clone().verify_slice(&tag).is_ok()
        {
            return true;
        }
    }
    false
}
