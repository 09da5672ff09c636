//! The `standard` row's rule (Standard Webhooks, and Svix's headers),
//! checked against the reference vectors, its `whsec_`/`whpk_` secrets,
//! its `v1`/`v1a` entries and its malformed headers (the row is in
//! `config::presets`).

use std::time::Duration;

use ed25519_dalek::{Signer, SigningKey};
use proptest::prelude::*;

use super::super::test_support::*;
use super::super::{Encoding, MalformedReason, Secret, Verdict, Verifier, VerifyError};

// The Standard Webhooks reference test vector.
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
const TS: i64 = 1_614_265_330;
const BODY: &[u8] = br#"{"test": 2432232314}"#;
const SIG: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

// ed25519 over the same content with the key whose seed is bytes 0..32,
// computed independently with python3's `cryptography` package.
const PUBLIC_KEY: &str = "whpk_A6EHv/POEL4dcN0Y50vAmWfk1jCbpQ1fHdyGZBJVMbg=";
const ED_SIG: &str =
    "v1a,yoUrgEkc12aGqm0n4Sydmdz55xJfTz4AsAgieHFjmkR7LJtqVCZOQYzvvHjI5kAey+r4iaBGxTFRrl2iBQxtDQ==";

fn signed(signature: &str) -> Vec<(String, String)> {
    headers(&[
        ("webhook-id", ID),
        ("webhook-timestamp", "1614265330"),
        ("webhook-signature", signature),
    ])
}

fn malformed(header: &str, reason: MalformedReason) -> VerifyError {
    VerifyError::MalformedHeader {
        header: header.to_owned(),
        reason,
    }
}

fn new(secrets: &[&str]) -> Result<Verifier, String> {
    let secrets = secrets
        .iter()
        .map(|s| Secret::new((*s).to_owned()))
        .collect();
    Verifier::new(scheme("standard"), secrets, Duration::from_secs(300))
}

#[test]
fn reference_vectors_verify_and_sign() {
    let v = verifier(scheme("standard"), &[SECRET]);
    let verdict = v.verify(&signed(SIG), BODY, TS);
    assert_eq!(
        verdict,
        Ok(Verdict {
            secret_index: Some(0),
            timestamp: Some(TS)
        })
    );
    assert_eq!(v.sign(BODY, TS, ID).unwrap(), signed(SIG));

    // The reference Rust library's own test_sign vector.
    let v = verifier(
        scheme("standard"),
        &["whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD"],
    );
    let body = br#"{"email":"test@example.com","username":"test_user"}"#;
    let headers = v
        .sign(body, 1_649_367_553, "msg_27UH4WbU6Z5A5EzD8u03UvzRbpk")
        .unwrap();
    assert_eq!(
        value_of(&headers, "webhook-signature"),
        "v1,tZ1I4/hDygAJgO5TYxiSd6Sd0kDW6hPenDe+bTa3Kkw="
    );
}

#[test]
fn a_secret_without_prefix_is_base64_too() {
    let v = verifier(scheme("standard"), &["MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]);
    assert!(v.verify(&signed(SIG), BODY, TS).is_ok());
}

#[test]
fn svix_headers_are_read_and_webhook_headers_win() {
    let v = verifier(scheme("standard"), &[SECRET]);
    let svix = headers(&[
        ("Svix-Id", ID),
        ("Svix-Timestamp", "1614265330"),
        ("Svix-Signature", SIG),
    ]);
    assert!(v.verify(&svix, BODY, TS).is_ok());
    // Both families: webhook-* is used, so a bad svix-* does not matter...
    let mut both = signed(SIG);
    both.extend(headers(&[
        ("svix-id", "other"),
        ("svix-signature", "v1,AAAA"),
    ]));
    assert!(v.verify(&both, BODY, TS).is_ok());
    // ...and a good svix-* does not rescue a bad webhook-*.
    let mut both = signed("v1,AAAA");
    both.extend(svix);
    assert_eq!(
        v.verify(&both, BODY, TS),
        Err(VerifyError::NoSignatureMatched)
    );
}

#[test]
fn ed25519_public_key_verifies_v1a_and_cannot_sign() {
    let v = verifier(scheme("standard"), &[PUBLIC_KEY]);
    let verdict = v.verify(&signed(ED_SIG), BODY, TS);
    assert_eq!(
        verdict,
        Ok(Verdict {
            secret_index: Some(0),
            timestamp: Some(TS)
        })
    );
    assert_eq!(
        v.verify(&signed(ED_SIG), b"{}", TS),
        Err(VerifyError::NoSignatureMatched)
    );
    // A v1 entry is nothing to a public key, and the reverse.
    assert_eq!(
        v.verify(&signed(SIG), BODY, TS),
        Err(VerifyError::NoSignatureMatched)
    );
    let hmac = verifier(scheme("standard"), &[SECRET]);
    assert_eq!(
        hmac.verify(&signed(ED_SIG), BODY, TS),
        Err(VerifyError::NoSignatureMatched)
    );
    let err = v.sign(BODY, TS, ID).unwrap_err();
    assert!(err.contains("whpk_"), "{err}");
}

#[test]
fn any_entry_may_match_any_secret() {
    let v = verifier(
        scheme("standard"),
        &["whsec_AAAAAAAAAAAAAAAAAAAAAAAA", PUBLIC_KEY, SECRET],
    );
    let noise = "v1,Mm7xgUVICxZfQ3bgf0h0Dof65L/IFx+PnZvnDWPCX6Q=";
    let header = format!("v2,whatever {noise}  {SIG} {ED_SIG}");
    // The public key (index 1) is tried before the matching whsec_ (index 2).
    assert_eq!(
        v.verify(&signed(&header), BODY, TS).unwrap().secret_index,
        Some(1)
    );
    let header = format!("{noise} {SIG}");
    assert_eq!(
        v.verify(&signed(&header), BODY, TS).unwrap().secret_index,
        Some(2)
    );
}

#[test]
fn rotation_reports_the_secret_that_matched() {
    let v = verifier(
        scheme("standard"),
        &["whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD", SECRET],
    );
    assert_eq!(
        v.verify(&signed(SIG), BODY, TS).unwrap().secret_index,
        Some(1)
    );
}

#[test]
fn bad_secrets_are_refused_by_index_without_quoting_them() {
    assert_eq!(
        new(&[SECRET, "whsec_not base64!"]).unwrap_err(),
        "secret 1: not a whsec_ or whpk_ base64 key"
    );
    assert_eq!(
        new(&["whsec_"]).unwrap_err(),
        "secret 0: not a whsec_ or whpk_ base64 key"
    );
    assert_eq!(
        new(&["whpk_%%"]).unwrap_err(),
        "secret 0: whpk_ key is not base64"
    );
    assert_eq!(
        new(&["whpk_AAAA"]).unwrap_err(),
        "secret 0: whpk_ key is not 32 bytes"
    );
    assert_eq!(new(&[""]).unwrap_err(), "secret 0: empty");
}

#[test]
fn missing_and_duplicate_headers() {
    let v = verifier(scheme("standard"), &[SECRET]);
    let no_id = v
        .verify(&without_header(&signed(SIG), "webhook-id"), BODY, TS)
        .unwrap_err();
    assert_eq!(no_id, VerifyError::MissingEventId("webhook-id".to_owned()));
    assert!(no_id.is_bad_request());
    for name in ["webhook-timestamp", "webhook-signature"] {
        assert_eq!(
            v.verify(&without_header(&signed(SIG), name), BODY, TS),
            Err(VerifyError::MissingHeader(name.to_owned()))
        );
    }
    for name in ["webhook-id", "webhook-timestamp", "webhook-signature"] {
        let err = v
            .verify(&doubled(&signed(SIG), name), BODY, TS)
            .unwrap_err();
        assert_eq!(err, VerifyError::DuplicateHeader(name.to_owned()));
        assert!(err.is_bad_request());
    }
    // Unsigned altogether: 401, whatever else is missing.
    let unsigned = v.verify(&[], BODY, TS).unwrap_err();
    assert_eq!(
        unsigned,
        VerifyError::MissingHeader("webhook-timestamp".to_owned())
    );
    assert!(!unsigned.is_bad_request());
    let svix_only = headers(&[("svix-id", ID), ("svix-signature", SIG)]);
    assert_eq!(
        v.verify(&svix_only, BODY, TS),
        Err(VerifyError::MissingHeader("svix-timestamp".to_owned()))
    );
}

#[test]
fn malformed_headers() {
    let v = verifier(scheme("standard"), &[SECRET]);
    let sig = "webhook-signature";
    let ts = "webhook-timestamp";
    let many = vec![SIG; 33].join(" ");
    let cases = [
        (
            sig,
            "g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
            MalformedReason::BadEntry("version,signature"),
        ),
        (
            sig,
            "v1,AAAA garbage",
            MalformedReason::BadEntry("version,signature"),
        ),
        (sig, "v1,not_base64", MalformedReason::BadBase64),
        (sig, "v1,", MalformedReason::NoSignature),
        (
            sig,
            many.as_str(),
            MalformedReason::TooManyEntries { max: 32 },
        ),
        (ts, "1614265330.0", MalformedReason::BadTimestamp),
        (ts, "-1", MalformedReason::BadTimestamp),
        ("webhook-id", "msg\0", MalformedReason::ContainsNul),
    ];
    for (name, value, reason) in cases {
        let err = v
            .verify(&with_header(&signed(SIG), name, value), BODY, TS)
            .unwrap_err();
        assert_eq!(err, malformed(name, reason.clone()), "{name}: {value:?}");
        assert_eq!(err.is_bad_request(), reason == MalformedReason::ContainsNul);
    }
}

#[test]
fn wrong_secret_tampered_body_and_changed_id_match_nothing() {
    let wrong = verifier(
        scheme("standard"),
        &["whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD"],
    );
    assert_eq!(
        wrong.verify(&signed(SIG), BODY, TS),
        Err(VerifyError::NoSignatureMatched)
    );
    let v = verifier(scheme("standard"), &[SECRET]);
    assert_eq!(
        v.verify(&signed(SIG), br#"{"test": 2432232315}"#, TS),
        Err(VerifyError::NoSignatureMatched)
    );
    let other_id = with_header(&signed(SIG), "webhook-id", "msg_other");
    assert_eq!(
        v.verify(&other_id, BODY, TS),
        Err(VerifyError::NoSignatureMatched)
    );
    // An ed25519 signature of the wrong length is no match, not a panic.
    assert_eq!(
        v.verify(&signed("v1a,AAAA"), BODY, TS),
        Err(VerifyError::NoSignatureMatched)
    );
}

#[test]
fn stale_and_future_timestamps_are_refused() {
    let v = verifier(scheme("standard"), &[SECRET]);
    assert_eq!(
        v.verify(&signed(SIG), BODY, TS + 301),
        Err(VerifyError::TimestampTooOld { age_secs: 301 })
    );
    assert_eq!(
        v.verify(&signed(SIG), BODY, TS - 301),
        Err(VerifyError::TimestampInFuture { ahead_secs: 301 })
    );
}

#[test]
fn sign_refuses_an_unsendable_id() {
    let v = verifier(scheme("standard"), &[SECRET]);
    for id in ["", " msg", "msg\n", "m\0"] {
        assert!(v.sign(BODY, TS, id).is_err(), "{id:?}");
    }
}

/// Signs like a Standard Webhooks sender holding the ed25519 secret key.
fn sign_v1a(key: &SigningKey, id: &str, now: i64, body: &[u8]) -> Vec<(String, String)> {
    let mut content = format!("{id}.{now}.").into_bytes();
    content.extend_from_slice(body);
    let encoded = super::super::encode_signature(&key.sign(&content).to_bytes(), Encoding::Base64);
    headers(&[
        ("webhook-id", id),
        ("webhook-timestamp", &now.to_string()),
        ("webhook-signature", &format!("v1a,{encoded}")),
    ])
}

#[test]
fn dalek_signing_agrees_with_the_independent_vector() {
    let key = SigningKey::from_bytes(&core::array::from_fn(|i| i as u8));
    assert_eq!(sign_v1a(&key, ID, TS, BODY), signed(ED_SIG));
}

proptest! {
    #[test]
    fn sign_then_verify(body in prop::collection::vec(any::<u8>(), 1..256),
                        now in 1_000_000_000i64..4_000_000_000,
                        id in "msg_[A-Za-z0-9]{1,24}", flip in flip()) {
        let v = verifier(scheme("standard"), &[SECRET, PUBLIC_KEY]);
        check_round_trip(&v, &body, now, &id, &flip)?;
    }

    #[test]
    fn ed25519_sign_then_verify(body in prop::collection::vec(any::<u8>(), 1..256),
                                now in 1_000_000_000i64..4_000_000_000,
                                at in any::<usize>(), mask in 1..=255u8) {
        let key = SigningKey::from_bytes(&core::array::from_fn(|i| i as u8));
        let v = verifier(scheme("standard"), &[SECRET, PUBLIC_KEY]);
        let signed = sign_v1a(&key, "msg_1", now, &body);
        prop_assert_eq!(v.verify(&signed, &body, now).unwrap().secret_index, Some(1));
        let mut tampered = body.clone();
        tampered[at % body.len()] ^= mask;
        prop_assert_eq!(v.verify(&signed, &tampered, now), Err(VerifyError::NoSignatureMatched));
    }
}
