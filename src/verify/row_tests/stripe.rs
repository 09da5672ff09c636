//! The `stripe` row's rule, checked against its published or independently
//! computed vectors and its malformed headers (the row is in
//! `config::presets`).

use proptest::prelude::*;

use super::super::test_support::*;
use super::super::{MalformedReason, Verdict, VerifyError};

const SECRET: &str = "whsec_test_secret";
const BODY: &[u8] = br#"{"id":"evt_test_webhook","object":"event"}"#;
const T: i64 = 1_700_000_000;
// Stripe publishes no test vector; this one was computed independently with
// python3: hmac.new(b"whsec_test_secret", b"1700000000." + BODY, sha256).hexdigest()
const SIG: &str = "d95c6b7477fbd7e9f90b1b0ef5f9c7ac25abca5382460e0d988c2b2a5b71b990";

fn header(value: &str) -> Vec<(String, String)> {
    headers(&[("Stripe-Signature", value)])
}

fn malformed(reason: MalformedReason) -> VerifyError {
    VerifyError::MalformedHeader {
        header: "stripe-signature".to_owned(),
        reason,
    }
}

#[test]
fn independent_vector_verifies_and_signs() {
    let v = verifier(scheme("stripe"), &[SECRET]);
    let lowercase = headers(&[("stripe-signature", &format!("t={T},v1={SIG}"))]);
    let verdict = v.verify(&lowercase, BODY, T + 10);
    assert_eq!(
        verdict,
        Ok(Verdict {
            secret_index: Some(0),
            timestamp: Some(T)
        })
    );
    let signed = v.sign(BODY, T, "ignored").unwrap();
    assert_eq!(signed, header(&format!("t={T},v1={SIG}")));
}

#[test]
fn any_v1_of_several_may_match_and_v0_is_ignored() {
    let v = verifier(scheme("stripe"), &[SECRET]);
    let other = "0".repeat(64);
    let value = format!("t={T}, v1={other},v1={SIG},v0={other}");
    assert!(v.verify(&header(&value), BODY, T).is_ok());
    let value = format!("t={T},v1={other},v0={SIG}");
    assert_eq!(
        v.verify(&header(&value), BODY, T),
        Err(VerifyError::NoSignatureMatched)
    );
}

#[test]
fn rotation_reports_the_secret_that_matched() {
    let v = verifier(scheme("stripe"), &["whsec_new", SECRET]);
    let verdict = v
        .verify(&header(&format!("t={T},v1={SIG}")), BODY, T)
        .unwrap();
    assert_eq!(verdict.secret_index, Some(1));
}

#[test]
fn missing_duplicate_and_malformed_headers() {
    let v = verifier(scheme("stripe"), &[SECRET]);
    assert_eq!(
        v.verify(&[], BODY, T),
        Err(VerifyError::MissingHeader("stripe-signature".to_owned()))
    );
    let signed = header(&format!("t={T},v1={SIG}"));
    let err = v
        .verify(&doubled(&signed, "Stripe-Signature"), BODY, T)
        .unwrap_err();
    assert_eq!(
        err,
        VerifyError::DuplicateHeader("stripe-signature".to_owned())
    );
    assert!(err.is_bad_request());

    let cases = [
        (format!("v1={SIG}"), MalformedReason::NoTimestamp),
        (format!("t={T}"), MalformedReason::NoSignature),
        (format!("t={T},v0={SIG}"), MalformedReason::NoSignature),
        (format!("t=soon,v1={SIG}"), MalformedReason::BadTimestamp),
        (format!("t=-{T},v1={SIG}"), MalformedReason::BadTimestamp),
        (
            format!("t={T},t={T},v1={SIG}"),
            MalformedReason::RepeatedField("t"),
        ),
        (format!("t={T},v1={}", &SIG[1..]), MalformedReason::BadHex),
        (format!("t={T},v1=zz{}", &SIG[2..]), MalformedReason::BadHex),
        (format!("t={T};v1={SIG}"), MalformedReason::BadTimestamp),
        (
            format!("t={T},{SIG}"),
            MalformedReason::BadEntry("key=value"),
        ),
        (format!("t={T},v1={SIG}\0"), MalformedReason::ContainsNul),
    ];
    for (value, reason) in cases {
        let err = v.verify(&header(&value), BODY, T).unwrap_err();
        assert_eq!(err, malformed(reason.clone()), "{value:?}");
        assert_eq!(err.is_bad_request(), reason == MalformedReason::ContainsNul);
    }
    let many = format!("t={T},{}", vec!["v1=00"; 40].join(","));
    assert!(matches!(
        v.verify(&header(&many), BODY, T),
        Err(VerifyError::MalformedHeader {
            reason: MalformedReason::TooManyEntries { .. },
            ..
        })
    ));
}

#[test]
fn wrong_secret_and_tampered_body_match_nothing() {
    let signed = header(&format!("t={T},v1={SIG}"));
    let wrong = verifier(scheme("stripe"), &["whsec_other"]);
    assert_eq!(
        wrong.verify(&signed, BODY, T),
        Err(VerifyError::NoSignatureMatched)
    );
    let v = verifier(scheme("stripe"), &[SECRET]);
    let tampered = br#"{"id":"evt_test_webhook","object":"evenT"}"#;
    assert_eq!(
        v.verify(&signed, tampered, T),
        Err(VerifyError::NoSignatureMatched)
    );
    // The timestamp is signed too.
    let moved = header(&format!("t={},v1={SIG}", T + 1));
    assert_eq!(
        v.verify(&moved, BODY, T),
        Err(VerifyError::NoSignatureMatched)
    );
}

#[test]
fn stale_and_future_timestamps_are_refused() {
    let v = verifier(scheme("stripe"), &[SECRET]);
    let signed = header(&format!("t={T},v1={SIG}"));
    assert!(v.verify(&signed, BODY, T + TOLERANCE_SECS).is_ok());
    assert_eq!(
        v.verify(&signed, BODY, T + TOLERANCE_SECS + 1),
        Err(VerifyError::TimestampTooOld { age_secs: 301 })
    );
    assert!(v.verify(&signed, BODY, T - TOLERANCE_SECS).is_ok());
    assert_eq!(
        v.verify(&signed, BODY, T - TOLERANCE_SECS - 1),
        Err(VerifyError::TimestampInFuture { ahead_secs: 301 })
    );
}

proptest! {
    #[test]
    fn sign_then_verify(body in prop::collection::vec(any::<u8>(), 1..256),
                        now in 1_000_000_000i64..4_000_000_000, flip in flip()) {
        let v = verifier(scheme("stripe"), &[SECRET, "whsec_old"]);
        check_round_trip(&v, &body, now, "", &flip)?;
    }
}
