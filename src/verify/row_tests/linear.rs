//! The `linear` row's rule, checked against its independently computed
//! vector, its malformed headers and the timestamp its body carries (the
//! row is in `config::presets`).

use proptest::prelude::*;

use super::super::test_support::*;
use super::super::{MalformedReason, Verdict, VerifyError};

const SECRET: &str = "lin_wh_test_secret";
const BODY: &[u8] = br#"{"action":"create","webhookTimestamp":1700000000123}"#;
const NOW: i64 = 1_700_000_000;
// Linear publishes no vector; computed independently with python3:
// hmac.new(b"lin_wh_test_secret", BODY, sha256).hexdigest()
const SIG: &str = "48637a17b6f6c81b79e06e51408878e0fcba6c95fb174e2d126e8dba5f6b961c";

fn header(value: &str) -> Vec<(String, String)> {
    headers(&[("Linear-Signature", value)])
}

fn signed_body(body: &[u8]) -> (Vec<(String, String)>, Vec<u8>) {
    let v = verifier(scheme("linear"), &[SECRET]);
    (v.sign(body, 0, "").unwrap(), body.to_vec())
}

#[test]
fn independent_vector_verifies_and_signs() {
    let v = verifier(scheme("linear"), &[SECRET]);
    let verdict = v.verify(&headers(&[("linear-signature", SIG)]), BODY, NOW);
    assert_eq!(
        verdict,
        Ok(Verdict {
            secret_index: Some(0),
            timestamp: Some(NOW)
        })
    );
    assert_eq!(v.sign(BODY, NOW, "").unwrap(), header(SIG));
}

#[test]
fn rotation_reports_the_secret_that_matched() {
    let v = verifier(scheme("linear"), &["lin_wh_new", SECRET]);
    assert_eq!(
        v.verify(&header(SIG), BODY, NOW).unwrap().secret_index,
        Some(1)
    );
}

#[test]
fn missing_duplicate_and_malformed_headers() {
    let v = verifier(scheme("linear"), &[SECRET]);
    assert_eq!(
        v.verify(&[], BODY, NOW),
        Err(VerifyError::MissingHeader("linear-signature".to_owned()))
    );
    let err = v
        .verify(&doubled(&header(SIG), "Linear-Signature"), BODY, NOW)
        .unwrap_err();
    assert_eq!(
        err,
        VerifyError::DuplicateHeader("linear-signature".to_owned())
    );
    assert!(err.is_bad_request());
    for (value, reason) in [
        ("sha256=00", MalformedReason::BadHex),
        (&SIG[1..], MalformedReason::BadHex),
        ("\0", MalformedReason::ContainsNul),
    ] {
        let err = v.verify(&header(value), BODY, NOW).unwrap_err();
        let expected = VerifyError::MalformedHeader {
            header: "linear-signature".to_owned(),
            reason: reason.clone(),
        };
        assert_eq!(err, expected, "{value:?}");
        assert_eq!(err.is_bad_request(), reason == MalformedReason::ContainsNul);
    }
}

#[test]
fn wrong_secret_and_tampered_body_match_nothing() {
    let wrong = verifier(scheme("linear"), &["lin_wh_other"]);
    assert_eq!(
        wrong.verify(&header(SIG), BODY, NOW),
        Err(VerifyError::NoSignatureMatched)
    );
    let v = verifier(scheme("linear"), &[SECRET]);
    // Moving the timestamp is tampering: the signature fails before the clock is read.
    let tampered = br#"{"action":"create","webhookTimestamp":1800000000123}"#;
    assert_eq!(
        v.verify(&header(SIG), tampered, 1_800_000_000),
        Err(VerifyError::NoSignatureMatched)
    );
}

#[test]
fn stale_and_future_body_timestamps_are_refused() {
    let v = verifier(scheme("linear"), &[SECRET]);
    assert_eq!(
        v.verify(&header(SIG), BODY, NOW + 301),
        Err(VerifyError::TimestampTooOld { age_secs: 301 })
    );
    assert_eq!(
        v.verify(&header(SIG), BODY, NOW - 301),
        Err(VerifyError::TimestampInFuture { ahead_secs: 301 })
    );
}

#[test]
fn signed_bodies_without_a_usable_timestamp_are_bad_requests() {
    let v = verifier(scheme("linear"), &[SECRET]);
    for (body, why) in [
        (&b"not json"[..], "not json"),
        (br#"{"action":"create"}"#, "no webhookTimestamp"),
        (
            br#"{"webhookTimestamp":"1700000000123"}"#,
            "webhookTimestamp is not an integer",
        ),
        (
            br#"{"webhookTimestamp":1.7e12}"#,
            "webhookTimestamp is not an integer",
        ),
        (br#"[1700000000123]"#, "no webhookTimestamp"),
    ] {
        let (headers, body) = signed_body(body);
        let err = v.verify(&headers, &body, NOW).unwrap_err();
        assert_eq!(err, VerifyError::InvalidBody(why.to_owned()));
        assert!(err.is_bad_request());
    }
    // Unsigned garbage is a signature failure, not a body complaint.
    assert_eq!(
        v.verify(&header(SIG), b"not json", NOW),
        Err(VerifyError::NoSignatureMatched)
    );
}

#[test]
fn a_null_or_repeated_timestamp_and_an_escaped_name() {
    let v = verifier(scheme("linear"), &[SECRET]);
    for (body, why) in [
        (&br#"{"webhookTimestamp":null}"#[..], "no webhookTimestamp"),
        (
            br#"{"webhookTimestamp":1700000000123,"webhookTimestamp":1700000000123}"#,
            "not json",
        ),
        (br#"{"webhookTimestamp":1700000000123} x"#, "not json"),
    ] {
        let (headers, body) = signed_body(body);
        assert_eq!(
            v.verify(&headers, &body, NOW),
            Err(VerifyError::InvalidBody(why.to_owned()))
        );
    }
    let (headers, body) =
        signed_body(br#"{"a":[{"webhookTimestamp":1},{}],"webhook\u0054imestamp":1700000000123}"#);
    assert_eq!(v.verify(&headers, &body, NOW).unwrap().timestamp, Some(NOW));
}

#[test]
fn deeply_nested_json_is_refused_without_overflowing_the_stack() {
    let v = verifier(scheme("linear"), &[SECRET]);
    let (headers, body) = signed_body("[".repeat(100_000).as_bytes());
    assert_eq!(
        v.verify(&headers, &body, NOW),
        Err(VerifyError::InvalidBody("not json".to_owned()))
    );
}

proptest! {
    #[test]
    fn sign_then_verify(text in "[ -~]{0,64}", now in 1_000_000_000i64..4_000_000_000,
                        flip in flip()) {
        let v = verifier(scheme("linear"), &[SECRET, "old"]);
        let body = serde_json::json!({ "webhookTimestamp": now * 1000 + 999, "data": text });
        let body = serde_json::to_vec(&body).unwrap();
        check_round_trip(&v, &body, now, "", &flip)?;
    }
}
