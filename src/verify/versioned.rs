//! The path of [`Carrier::Versioned`](super::rule::Carrier::Versioned):
//! Standard Webhooks' (and Svix's) three headers, an event id, a
//! timestamp and blank-separated `<version>,<signature>` entries, read
//! from the first family of header names the request uses. The headers
//! are read in a fixed order: the id (its copies and bytes), the
//! timestamp, the signatures, then a signed request without its id is a
//! malformed delivery (400), not a bad signature. Each entry's version
//! names its algorithm (`v1` an HMAC, `v1a` an Ed25519 signature); any
//! entry may match any key of its algorithm, the first key that matches
//! wins, and the timestamp must then be within the tolerance.

use super::rule::{Alg, Family, Piece, SignedRule, TimeFormat, Window};
use super::{MalformedReason, Request, Verdict, Verifier, VerifyError, malformed};

pub(super) fn verify(
    verifier: &Verifier,
    rule: &SignedRule,
    rq: &Request<'_>,
    now: i64,
    families: &'static [Family],
    versions: &'static [(&'static str, Alg)],
) -> Result<Verdict, VerifyError> {
    let headers = rq.headers;
    let Some(first) = families.first() else {
        return Err(VerifyError::NoSignatureMatched);
    };
    let family = families
        .iter()
        .find(|f| is_sent(headers, f))
        .unwrap_or(first);
    let id = super::optional_header(headers, family.id)?;
    let timestamp_raw = super::required_header(headers, family.timestamp)?;
    let value = super::required_header(headers, family.signature)?;
    // Signed, but without the id the signature covers: a malformed
    // delivery with no event id (400), not a bad signature.
    let id = id.ok_or_else(|| VerifyError::MissingEventId(family.id.to_owned()))?;
    let (format, window) = rule
        .timestamp
        .as_ref()
        .map_or((TimeFormat::Unix, Window::Both), |t| (t.format, t.window));
    let timestamp = super::rule::parse_time_as(family.timestamp, format, timestamp_raw)?;

    // The signatures of each version, in the order of `versions`.
    let mut signatures: Vec<Vec<Vec<u8>>> = vec![Vec::new(); versions.len()];
    for entry in super::split_entries(family.signature, value, ' ')? {
        let (version, encoded) = entry.split_once(',').ok_or_else(|| {
            malformed(
                family.signature,
                MalformedReason::BadEntry("version,signature"),
            )
        })?;
        if let Some(at) = versions.iter().position(|(v, _)| *v == version) {
            signatures[at].push(super::decode_signature(
                family.signature,
                encoded,
                rule.encoding,
            )?);
        }
    }

    let content: Vec<&[u8]> = rule
        .message
        .iter()
        .map(|piece| match piece {
            Piece::Header(name) if name.eq_ignore_ascii_case(first.id) => id.as_bytes(),
            Piece::Timestamp => timestamp_raw.as_bytes(),
            Piece::Body => rq.body,
            Piece::Text(text) => text.as_bytes(),
            Piece::Method => rq.method.as_bytes(),
            // A versioned carrier's providers sign none of these (a preset
            // test keeps it so); signing nothing matches no real signature.
            Piece::Header(_) | Piece::Url | Piece::Json(_) => b"",
        })
        .collect();
    let mut joined = None;
    let index = verifier
        .keys
        .iter()
        .position(|key| {
            versions
                .iter()
                .zip(&signatures)
                .any(|((_, alg), of_version)| {
                    !of_version.is_empty()
                        && super::rule::key_matches(*alg, key, &content, of_version, &mut joined)
                })
        })
        .ok_or(VerifyError::NoSignatureMatched)?;
    verifier.check_window(timestamp, now, window)?;
    Ok(Verdict {
        secret_index: Some(index),
        timestamp: Some(timestamp),
    })
}

/// True when any header of the family is sent.
fn is_sent(headers: &[(String, String)], family: &Family) -> bool {
    [family.id, family.timestamp, family.signature]
        .iter()
        .any(|name| {
            crate::verify::headers::header_values(headers, name)
                .next()
                .is_some()
        })
}
