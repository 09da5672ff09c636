//! The `paddle` row's rule, checked against its published or independently
//! computed vectors and its malformed headers (the row is in
//! `config::presets`).

use proptest::prelude::*;

use super::super::test_support::*;
use super::super::{MalformedReason, Verdict, VerifyError};

const SECRET: &str = "pdl_ntfset_test_secret";
const BODY: &[u8] = br#"{"event_id":"evt_01h8","event_type":"transaction.completed"}"#;
const TS: i64 = 1_700_000_000;
// Paddle publishes no complete vector; computed independently with python3:
// hmac.new(b"pdl_ntfset_test_secret", b"1700000000:" + BODY, sha256).hexdigest()
const SIG: &str = "16977c0ccfb070ee9097dd3a4043e4a82f31bb66cb448e39f87a8f2af5060b22";

fn header(value: &str) -> Vec<(String, String)> {
    headers(&[("Paddle-Signature", value)])
}

fn malformed(reason: MalformedReason) -> VerifyError {
    VerifyError::MalformedHeader {
        header: "paddle-signature".to_owned(),
        reason,
    }
}

#[test]
fn independent_vector_verifies_and_signs() {
    let v = verifier(scheme("paddle"), &[SECRET]);
    let verdict = v.verify(
        &headers(&[("paddle-signature", &format!("ts={TS};h1={SIG}"))]),
        BODY,
        TS,
    );
    assert_eq!(
        verdict,
        Ok(Verdict {
            secret_index: Some(0),
            timestamp: Some(TS)
        })
    );
    assert_eq!(
        v.sign(BODY, TS, "").unwrap(),
        header(&format!("ts={TS};h1={SIG}"))
    );
}

#[test]
fn any_h1_of_several_may_match() {
    let v = verifier(scheme("paddle"), &[SECRET]);
    let other = "ab".repeat(32);
    assert!(
        v.verify(&header(&format!("ts={TS};h1={other};h1={SIG}")), BODY, TS)
            .is_ok()
    );
    assert!(
        v.verify(&header(&format!("h1={SIG}; ts={TS}")), BODY, TS)
            .is_ok()
    );
}

#[test]
fn rotation_reports_the_secret_that_matched() {
    let v = verifier(scheme("paddle"), &["pdl_ntfset_new", SECRET]);
    let verdict = v
        .verify(&header(&format!("ts={TS};h1={SIG}")), BODY, TS)
        .unwrap();
    assert_eq!(verdict.secret_index, Some(1));
}

#[test]
fn missing_duplicate_and_malformed_headers() {
    let v = verifier(scheme("paddle"), &[SECRET]);
    assert_eq!(
        v.verify(&[], BODY, TS),
        Err(VerifyError::MissingHeader("paddle-signature".to_owned()))
    );
    let signed = header(&format!("ts={TS};h1={SIG}"));
    let err = v
        .verify(&doubled(&signed, "paddle-signature"), BODY, TS)
        .unwrap_err();
    assert_eq!(
        err,
        VerifyError::DuplicateHeader("paddle-signature".to_owned())
    );
    assert!(err.is_bad_request());

    let cases = [
        (format!("h1={SIG}"), MalformedReason::NoTimestamp),
        (format!("ts={TS}"), MalformedReason::NoSignature),
        (format!("ts={TS};h1="), MalformedReason::NoSignature),
        (format!("ts={TS},h1={SIG}"), MalformedReason::BadTimestamp),
        (format!("ts=1e9;h1={SIG}"), MalformedReason::BadTimestamp),
        (
            format!("ts={TS};ts={TS};h1={SIG}"),
            MalformedReason::RepeatedField("ts"),
        ),
        (format!("ts={TS};h1={}", &SIG[3..]), MalformedReason::BadHex),
        (
            format!("ts={TS};h1"),
            MalformedReason::BadEntry("key=value"),
        ),
        (format!("ts={TS}\0;h1={SIG}"), MalformedReason::ContainsNul),
    ];
    for (value, reason) in cases {
        let err = v.verify(&header(&value), BODY, TS).unwrap_err();
        assert_eq!(err, malformed(reason.clone()), "{value:?}");
        assert_eq!(err.is_bad_request(), reason == MalformedReason::ContainsNul);
    }
}

#[test]
fn wrong_secret_and_tampered_body_match_nothing() {
    let signed = header(&format!("ts={TS};h1={SIG}"));
    let wrong = verifier(scheme("paddle"), &["pdl_ntfset_other"]);
    assert_eq!(
        wrong.verify(&signed, BODY, TS),
        Err(VerifyError::NoSignatureMatched)
    );
    let v = verifier(scheme("paddle"), &[SECRET]);
    let tampered = br#"{"event_id":"evt_01h9","event_type":"transaction.completed"}"#;
    assert_eq!(
        v.verify(&signed, tampered, TS),
        Err(VerifyError::NoSignatureMatched)
    );
}

#[test]
fn stale_and_future_timestamps_are_refused() {
    let v = verifier(scheme("paddle"), &[SECRET]);
    let signed = header(&format!("ts={TS};h1={SIG}"));
    assert_eq!(
        v.verify(&signed, BODY, TS + 86_400),
        Err(VerifyError::TimestampTooOld { age_secs: 86_400 })
    );
    assert_eq!(
        v.verify(&signed, BODY, TS - 400),
        Err(VerifyError::TimestampInFuture { ahead_secs: 400 })
    );
}

proptest! {
    #[test]
    fn sign_then_verify(body in prop::collection::vec(any::<u8>(), 1..256),
                        now in 1_000_000_000i64..4_000_000_000, flip in flip()) {
        let v = verifier(scheme("paddle"), &[SECRET, "old"]);
        check_round_trip(&v, &body, now, "", &flip)?;
    }
}
