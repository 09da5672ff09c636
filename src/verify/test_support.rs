//! Test helpers shared by the scheme files: building headers and verifiers,
//! and the sign/verify round-trip property every scheme must hold.

use std::time::Duration;

use proptest::prelude::*;

use super::{Scheme, Secret, Verdict, Verifier};

/// The tolerance of verifiers made by [`verifier`].
pub const TOLERANCE_SECS: i64 = 300;

pub fn headers(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
        .collect()
}

/// The scheme of a provider's row.
pub fn scheme(kind: &str) -> Scheme {
    let row = crate::config::presets::find(kind).unwrap_or_else(|| panic!("no row {kind}"));
    (row.scheme)()
}

/// A verifier with a 5 minute tolerance.
pub fn verifier(scheme: Scheme, secrets: &[&str]) -> Verifier {
    let secrets = secrets
        .iter()
        .map(|s| Secret::new((*s).to_owned()))
        .collect();
    Verifier::new(scheme, secrets, Duration::from_secs(TOLERANCE_SECS as u64)).unwrap()
}

/// `headers` with every header called `name` replaced by one with `value`.
pub fn with_header(headers: &[(String, String)], name: &str, value: &str) -> Vec<(String, String)> {
    let mut out = without_header(headers, name);
    out.push((name.to_owned(), value.to_owned()));
    out
}

pub fn without_header(headers: &[(String, String)], name: &str) -> Vec<(String, String)> {
    headers
        .iter()
        .filter(|(n, _)| !n.eq_ignore_ascii_case(name))
        .cloned()
        .collect()
}

/// `headers` with the header called `name` sent a second time, unchanged.
pub fn doubled(headers: &[(String, String)], name: &str) -> Vec<(String, String)> {
    let mut out = headers.to_vec();
    let copy = headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .cloned()
        .unwrap();
    out.push(copy);
    out
}

/// The value of the header called `name`.
pub fn value_of<'a>(headers: &'a [(String, String)], name: &str) -> &'a str {
    crate::verify::headers::header_values(headers, name)
        .next()
        .unwrap()
}

/// One random change to a request, for the round-trip property.
#[derive(Debug, Clone)]
pub struct Flip {
    /// Which byte (modulo the length) and the non-zero XOR mask.
    pub body_at: usize,
    pub body_mask: u8,
    /// Which header, which character (both modulo) and the ASCII XOR mask (1..128).
    pub header_at: usize,
    pub char_at: usize,
    pub char_mask: u8,
}

pub fn flip() -> impl Strategy<Value = Flip> {
    (
        any::<usize>(),
        1..=255u8,
        any::<usize>(),
        any::<usize>(),
        1..128u8,
    )
        .prop_map(|(body_at, body_mask, header_at, char_at, char_mask)| Flip {
            body_at,
            body_mask,
            header_at,
            char_at,
            char_mask,
        })
}

/// verify(sign(body)) passes with secret 0; flipping a body byte fails; so
/// does flipping one character of any signed header, unless that only
/// changed the case of a letter that is compared ignoring case (hex digits,
/// prefixes), which is skipped.
pub fn check_round_trip(
    verifier: &Verifier,
    body: &[u8],
    now: i64,
    id: &str,
    flip: &Flip,
) -> Result<(), TestCaseError> {
    let signed = verifier.sign(body, now, id).map_err(TestCaseError::fail)?;
    let verdict = verifier.verify(&signed, body, now);
    prop_assert!(
        matches!(
            verdict,
            Ok(Verdict {
                secret_index: Some(0),
                ..
            })
        ),
        "{verdict:?} for {signed:?}"
    );

    if !body.is_empty() {
        let mut tampered = body.to_vec();
        tampered[flip.body_at % body.len()] ^= flip.body_mask;
        let verdict = verifier.verify(&signed, &tampered, now);
        prop_assert!(verdict.is_err(), "tampered body accepted: {verdict:?}");
    }

    let mut tampered = signed.clone();
    let header = flip.header_at % tampered.len();
    let original = tampered[header].1.clone();
    let mut bytes = original.clone().into_bytes();
    let at = flip.char_at % bytes.len();
    bytes[at] ^= flip.char_mask;
    // ASCII XOR a mask below 128 stays ASCII, hence valid UTF-8.
    let changed = String::from_utf8(bytes).map_err(|e| TestCaseError::fail(e.to_string()))?;
    if changed.eq_ignore_ascii_case(&original) {
        return Ok(());
    }
    tampered[header].1 = changed;
    let verdict = verifier.verify(&tampered, body, now);
    prop_assert!(
        verdict.is_err(),
        "tampered {tampered:?} accepted: {verdict:?}"
    );
    Ok(())
}
