//! The `github` row's rule, checked against its published or independently
//! computed vectors and its malformed headers (the row is in
//! `config::presets`).

use proptest::prelude::*;

use super::super::test_support::*;
use super::super::{MalformedReason, Verdict, VerifyError};

// GitHub's documented example ("Validating webhook deliveries").
const SECRET: &str = "It's a Secret to Everybody";
const BODY: &[u8] = b"Hello, World!";
const SIG: &str = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";

fn header(value: &str) -> Vec<(String, String)> {
    headers(&[("X-Hub-Signature-256", value)])
}

fn malformed(reason: MalformedReason) -> VerifyError {
    VerifyError::MalformedHeader {
        header: "x-hub-signature-256".to_owned(),
        reason,
    }
}

#[test]
fn published_vector_verifies_and_signs() {
    let v = verifier(scheme("github"), &[SECRET]);
    let verdict = v.verify(&headers(&[("x-hub-signature-256", SIG)]), BODY, 0);
    assert_eq!(
        verdict,
        Ok(Verdict {
            secret_index: Some(0),
            timestamp: None
        })
    );
    assert_eq!(v.sign(BODY, 0, "").unwrap(), header(SIG));
    // Upper-case hex is the same signature.
    assert!(v.verify(&header(&SIG.to_uppercase()), BODY, 0).is_ok());
}

#[test]
fn rotation_reports_the_secret_that_matched() {
    let v = verifier(scheme("github"), &["new secret", SECRET]);
    assert_eq!(
        v.verify(&header(SIG), BODY, 0).unwrap().secret_index,
        Some(1)
    );
}

#[test]
fn missing_duplicate_and_malformed_headers() {
    let v = verifier(scheme("github"), &[SECRET]);
    // The SHA-1 header alone does not count.
    let sha1_only = headers(&[("X-Hub-Signature", "sha1=01")]);
    assert_eq!(
        v.verify(&sha1_only, BODY, 0),
        Err(VerifyError::MissingHeader("x-hub-signature-256".to_owned()))
    );
    let err = v
        .verify(&doubled(&header(SIG), "x-hub-signature-256"), BODY, 0)
        .unwrap_err();
    assert_eq!(
        err,
        VerifyError::DuplicateHeader("x-hub-signature-256".to_owned())
    );
    assert!(err.is_bad_request());

    let cases = [
        (
            &SIG[7..],
            MalformedReason::MissingPrefix("sha256=".to_owned()),
        ),
        (
            "sha1=757107ea",
            MalformedReason::MissingPrefix("sha256=".to_owned()),
        ),
        (&SIG[..SIG.len() - 1], MalformedReason::BadHex),
        ("sha256=not-hex", MalformedReason::BadHex),
        ("sha256=", MalformedReason::NoSignature),
        ("sha256=ab\0", MalformedReason::ContainsNul),
    ];
    for (value, reason) in cases {
        let err = v.verify(&header(value), BODY, 0).unwrap_err();
        assert_eq!(err, malformed(reason.clone()), "{value:?}");
        assert_eq!(err.is_bad_request(), reason == MalformedReason::ContainsNul);
    }
}

#[test]
fn wrong_secret_tampered_body_and_short_signature_match_nothing() {
    let wrong = verifier(scheme("github"), &["It's a Secret to Nobody"]);
    assert_eq!(
        wrong.verify(&header(SIG), BODY, 0),
        Err(VerifyError::NoSignatureMatched)
    );
    let v = verifier(scheme("github"), &[SECRET]);
    assert_eq!(
        v.verify(&header(SIG), b"Hello, World?", 0),
        Err(VerifyError::NoSignatureMatched)
    );
    // A truncated (but well-formed) tag is no match, not a prefix match.
    assert_eq!(
        v.verify(&header(&SIG[..SIG.len() - 2]), BODY, 0),
        Err(VerifyError::NoSignatureMatched)
    );
}

#[test]
fn no_timestamp_so_any_clock_passes() {
    let v = verifier(scheme("github"), &[SECRET]);
    assert!(v.verify(&header(SIG), BODY, i64::MAX).is_ok());
    assert!(v.verify(&header(SIG), BODY, i64::MIN).is_ok());
}

proptest! {
    #[test]
    fn sign_then_verify(body in prop::collection::vec(any::<u8>(), 1..256),
                        now in any::<i64>(), flip in flip()) {
        let v = verifier(scheme("github"), &[SECRET, "old"]);
        check_round_trip(&v, &body, now, "", &flip)?;
    }
}
