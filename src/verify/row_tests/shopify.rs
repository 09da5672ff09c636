//! The `shopify` row's rule, checked against its published or independently
//! computed vectors and its malformed headers (the row is in
//! `config::presets`).

use proptest::prelude::*;

use super::super::test_support::*;
use super::super::{MalformedReason, Verdict, VerifyError};

const SECRET: &str = "shpss_test_secret";
const BODY: &[u8] = br#"{"id":820982911946154508}"#;
// Shopify publishes no vector; computed independently with python3:
// base64.b64encode(hmac.new(b"shpss_test_secret", BODY, sha256).digest())
const SIG: &str = "AU5n5C4JV1EbE8g4yEzV+ZHbqkXpM29HXkzNAa5zicA=";

fn header(value: &str) -> Vec<(String, String)> {
    headers(&[("X-Shopify-Hmac-Sha256", value)])
}

fn malformed(reason: MalformedReason) -> VerifyError {
    VerifyError::MalformedHeader {
        header: "x-shopify-hmac-sha256".to_owned(),
        reason,
    }
}

#[test]
fn independent_vector_verifies_and_signs() {
    let v = verifier(scheme("shopify"), &[SECRET]);
    let verdict = v.verify(&headers(&[("x-shopify-hmac-sha256", SIG)]), BODY, 0);
    assert_eq!(
        verdict,
        Ok(Verdict {
            secret_index: Some(0),
            timestamp: None
        })
    );
    assert_eq!(v.sign(BODY, 0, "").unwrap(), header(SIG));
}

#[test]
fn rotation_reports_the_secret_that_matched() {
    let v = verifier(scheme("shopify"), &["shpss_new", SECRET]);
    assert_eq!(
        v.verify(&header(SIG), BODY, 0).unwrap().secret_index,
        Some(1)
    );
}

#[test]
fn missing_duplicate_and_malformed_headers() {
    let v = verifier(scheme("shopify"), &[SECRET]);
    assert_eq!(
        v.verify(&[], BODY, 0),
        Err(VerifyError::MissingHeader(
            "x-shopify-hmac-sha256".to_owned()
        ))
    );
    let err = v
        .verify(&doubled(&header(SIG), "X-Shopify-Hmac-Sha256"), BODY, 0)
        .unwrap_err();
    assert_eq!(
        err,
        VerifyError::DuplicateHeader("x-shopify-hmac-sha256".to_owned())
    );
    assert!(err.is_bad_request());
    let url_safe = SIG.replace('+', "-");
    let space_for_pad = SIG.replace('=', " ");
    let cases = [
        ("not base64!", MalformedReason::BadBase64),
        (url_safe.as_str(), MalformedReason::BadBase64),
        // Non-zero trailing bits: a second spelling of some other tag.
        ("AB==", MalformedReason::BadBase64),
        // Unpadded: a second spelling of the same tag.
        (SIG.trim_end_matches('='), MalformedReason::BadBase64),
        // Regression (found by the round-trip property when padding was
        // optional): `=` flipped to a space was trimmed and accepted.
        (space_for_pad.as_str(), MalformedReason::BadBase64),
        ("", MalformedReason::Empty),
        ("AU5n\0", MalformedReason::ContainsNul),
    ];
    for (value, reason) in cases {
        let err = v.verify(&header(value), BODY, 0).unwrap_err();
        assert_eq!(err, malformed(reason.clone()), "{value:?}");
        assert_eq!(err.is_bad_request(), reason == MalformedReason::ContainsNul);
    }
}

#[test]
fn wrong_secret_and_tampered_body_match_nothing() {
    let wrong = verifier(scheme("shopify"), &["shpss_other"]);
    assert_eq!(
        wrong.verify(&header(SIG), BODY, 0),
        Err(VerifyError::NoSignatureMatched)
    );
    let v = verifier(scheme("shopify"), &[SECRET]);
    let tampered = br#"{"id":820982911946154509}"#;
    assert_eq!(
        v.verify(&header(SIG), tampered, 0),
        Err(VerifyError::NoSignatureMatched)
    );
    // A valid base64 tag of the wrong length.
    assert_eq!(
        v.verify(&header("AU5n"), BODY, 0),
        Err(VerifyError::NoSignatureMatched)
    );
}

proptest! {
    #[test]
    fn sign_then_verify(body in prop::collection::vec(any::<u8>(), 1..256),
                        flip in flip()) {
        let v = verifier(scheme("shopify"), &[SECRET, "old"]);
        check_round_trip(&v, &body, 0, "", &flip)?;
    }
}
