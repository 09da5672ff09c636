//! Fuzz target `verify`: every signature scheme's header parsing and
//! verification (the built-in ones and every provider preset's), through
//! `Verifier::verify`, with arbitrary secrets, headers, body and clock. Never panics; and for every scheme that signs,
//! what `Verifier::sign` produces verifies with secret 0, while the same
//! headers over a body with one byte changed do not.

#![no_main]

use std::time::Duration;

use arbitrary::Arbitrary;
use idemhook::config::presets::PRESETS;
use idemhook::verify::rule::{Alg, Piece};
use idemhook::verify::{
    Encoding, HmacAlgorithm, HmacParams, Request, Scheme, Secret, Verdict, Verifier,
};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Case {
    scheme: u8,
    hmac_header: String,
    hmac_algorithm: u8,
    hmac_base64: bool,
    hmac_prefix: String,
    secrets: Vec<String>,
    tolerance_secs: u16,
    /// Seconds since the epoch; a real clock, since `sign` writes it as
    /// the signed timestamp.
    now: u32,
    /// Verify's clock relative to `now`, for the arbitrary-headers check.
    skew: i32,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    id: String,
    flip_at: usize,
    flip_mask: u8,
}

fn scheme(case: &Case) -> Scheme {
    // Every provider is a row of the table; then the generic `hmac` and `none`.
    let presets = PRESETS.len();
    let pick = usize::from(case.scheme) % (2 + presets);
    if pick >= 2 {
        return (PRESETS[pick - 2].scheme)();
    }
    match pick {
        0 => Scheme::Hmac(HmacParams {
            header: case.hmac_header.clone(),
            algorithm: match case.hmac_algorithm % 3 {
                0 => HmacAlgorithm::Sha1,
                1 => HmacAlgorithm::Sha256,
                _ => HmacAlgorithm::Sha512,
            },
            encoding: if case.hmac_base64 {
                Encoding::Base64
            } else {
                Encoding::Hex
            },
            prefix: case.hmac_prefix.clone(),
        }),
        _ => Scheme::None,
    }
}

/// A verifier from the case's own secrets and settings, or else from
/// known-good ones, so that `verify` is always exercised.
fn verifier(case: &Case) -> Verifier {
    let tolerance = Duration::from_secs(u64::from(case.tolerance_secs));
    let secrets = |list: &[String]| list.iter().cloned().map(Secret::new).collect::<Vec<_>>();
    if let Ok(v) = Verifier::new(scheme(case), secrets(&case.secrets), tolerance) {
        return v;
    }
    let picked = scheme(case);
    let fallback = match picked {
        Scheme::None => return Verifier::new(Scheme::None, Vec::new(), tolerance).unwrap(),
        _ if picked.kind() == "standard" => "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        _ if picked.kind() == "adyen" => "44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056",
        // A public key (Ed25519, RFC 8032's first); P-256's is below.
        Scheme::Rule { rule, .. } if rule.alg == Alg::Ed25519 => {
            "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a"
        }
        Scheme::Rule { rule, .. } if rule.alg == Alg::EcdsaP256 => {
            "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEj/gKf+RfNUla5wdTYG+PaMWJ2AzSfP1Wr32FAwYZ2ZpLQnGhEzFKhYfe3Nx4bfJRfyMil9SoaunX6ffLLUmzRw=="
        }
        _ => "fuzz-secret",
    };
    let scheme = match scheme(case) {
        Scheme::Hmac(mut params) => {
            params.header = "X-Fuzz-Signature".to_string();
            Scheme::Hmac(params)
        }
        other => other,
    };
    Verifier::new(scheme, secrets(&[fallback.to_string()]), tolerance)
        .unwrap_or_else(|e| panic!("fallback verifier refused: {e}"))
}

fuzz_target!(|case: Case| {
    let verifier = verifier(&case);
    let now = i64::from(case.now);

    // 1. Whatever arrives: an answer, never a panic.
    let _ = verifier.verify(&case.headers, &case.body, now + i64::from(case.skew));
    let kind = verifier.scheme().kind();
    // What is signed in round trips: Linear's timestamp lives in the body.
    let body = match kind {
        "linear" => serde_json::json!({
            "webhookTimestamp": now * 1000,
            "data": String::from_utf8_lossy(&case.body),
        })
        .to_string()
        .into_bytes(),
        _ => case.body.clone(),
    };
    let presets = matches!(verifier.scheme(), Scheme::Rule { .. })
        || matches!(kind, "twilio" | "hubspot" | "adyen" | "msgraph");
    if presets {
        let request = Request {
            method: "POST",
            query: &case.id,
            headers: &case.headers,
            body: &case.body,
        };
        let _ = verifier.verify_request(&request, now + i64::from(case.skew));
        // The round trip for the rules that sign the body with a shared
        // secret in headers (a public key cannot sign here; a token or
        // a signature inside the body is not a body's signature).
        let Scheme::Rule { rule, .. } = verifier.scheme() else {
            return;
        };
        if !matches!(rule.alg, Alg::Hmac(_)) || !rule.covers(&Piece::Body) {
            return;
        }
        let Ok(signed) = verifier.sign_request(&Request::post(&[], &body), now, &case.id, None)
        else {
            return;
        };
        let verdict = verifier.verify_request(&Request::post(&signed, &body), now);
        assert!(verdict.is_ok(), "verify(sign(x)) failed: {verdict:?}\n  scheme: {:?}", verifier.scheme());
        if !body.is_empty() && case.flip_mask != 0 {
            let mut tampered = body.clone();
            let at = case.flip_at % tampered.len();
            tampered[at] ^= case.flip_mask;
            let verdict = verifier.verify_request(&Request::post(&signed, &tampered), now);
            assert!(verdict.is_err(), "a changed body verified: {verdict:?}\n  scheme: {:?}", verifier.scheme());
        }
        return;
    }

    // 2. The round trip, for schemes that sign.
    if let Scheme::Hmac(params) = verifier.scheme() {
        // Leading or trailing blanks in a prefix are trimmed off the header
        // value, and control characters cannot be sent: such a prefix can
        // never verify (reported, not a crash).
        let visible = params.prefix.bytes().all(|b| b.is_ascii_graphic());
        if !visible {
            return;
        }
    }
    let Ok(signed) = verifier.sign(&body, now, &case.id) else {
        return;
    };
    let verdict = verifier.verify(&signed, &body, now);
    assert!(
        matches!(
            verdict,
            Ok(Verdict {
                secret_index: Some(0),
                ..
            })
        ),
        "verify(sign(x)) failed: {verdict:?}\n  scheme: {:?}\n  headers: {signed:?}",
        verifier.scheme()
    );
    if !body.is_empty() && case.flip_mask != 0 {
        let mut tampered = body.clone();
        tampered[case.flip_at % body.len()] ^= case.flip_mask;
        let verdict = verifier.verify(&signed, &tampered, now);
        assert!(
            verdict.is_err(),
            "a changed body verified: {verdict:?}\n  scheme: {:?}",
            verifier.scheme()
        );
    }
});
