//! The `slack` row's rule, checked against its published or independently
//! computed vectors and its malformed headers (the row is in
//! `config::presets`).

use proptest::prelude::*;

use super::super::test_support::*;
use super::super::{MalformedReason, Verdict, VerifyError};

// Slack's worked example ("Verifying requests from Slack").
const SECRET: &str = "8f742231b10e8888abcd99yyyzzz85a5";
const TS: i64 = 1_531_420_618;
const BODY: &[u8] = b"token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c";
const SIG: &str = "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503";

fn signed() -> Vec<(String, String)> {
    headers(&[
        ("X-Slack-Request-Timestamp", "1531420618"),
        ("X-Slack-Signature", SIG),
    ])
}

fn malformed(header: &str, reason: MalformedReason) -> VerifyError {
    VerifyError::MalformedHeader {
        header: header.to_owned(),
        reason,
    }
}

#[test]
fn published_vector_verifies_and_signs() {
    let v = verifier(scheme("slack"), &[SECRET]);
    let verdict = v.verify(&signed(), BODY, TS + 60);
    assert_eq!(
        verdict,
        Ok(Verdict {
            secret_index: Some(0),
            timestamp: Some(TS)
        })
    );
    assert_eq!(v.sign(BODY, TS, "").unwrap(), signed());
}

#[test]
fn rotation_reports_the_secret_that_matched() {
    let v = verifier(scheme("slack"), &["new-signing-secret", SECRET]);
    assert_eq!(v.verify(&signed(), BODY, TS).unwrap().secret_index, Some(1));
}

#[test]
fn missing_and_duplicate_headers() {
    let v = verifier(scheme("slack"), &[SECRET]);
    for (name, lower) in [
        ("X-Slack-Signature", "x-slack-signature"),
        ("X-Slack-Request-Timestamp", "x-slack-request-timestamp"),
    ] {
        assert_eq!(
            v.verify(&without_header(&signed(), name), BODY, TS),
            Err(VerifyError::MissingHeader(lower.to_owned()))
        );
        let err = v.verify(&doubled(&signed(), name), BODY, TS).unwrap_err();
        assert_eq!(err, VerifyError::DuplicateHeader(lower.to_owned()));
        assert!(err.is_bad_request());
    }
}

#[test]
fn malformed_headers() {
    let v = verifier(scheme("slack"), &[SECRET]);
    let sig = "x-slack-signature";
    let ts = "x-slack-request-timestamp";
    let cases = [
        (
            sig,
            &SIG[3..],
            malformed(sig, MalformedReason::MissingPrefix("v0=".to_owned())),
        ),
        (
            sig,
            "v1=abcd",
            malformed(sig, MalformedReason::MissingPrefix("v0=".to_owned())),
        ),
        (sig, "v0=abc", malformed(sig, MalformedReason::BadHex)),
        (sig, "v0=\0", malformed(sig, MalformedReason::ContainsNul)),
        (
            ts,
            "1531420618.5",
            malformed(ts, MalformedReason::BadTimestamp),
        ),
        (
            ts,
            "yesterday",
            malformed(ts, MalformedReason::BadTimestamp),
        ),
        (
            ts,
            "15314\u{0}20618",
            malformed(ts, MalformedReason::ContainsNul),
        ),
    ];
    for (name, value, expected) in cases {
        let err = v
            .verify(&with_header(&signed(), name, value), BODY, TS)
            .unwrap_err();
        assert_eq!(err, expected, "{name}: {value:?}");
    }
}

#[test]
fn wrong_secret_tampered_body_and_moved_timestamp_match_nothing() {
    let wrong = verifier(scheme("slack"), &["8f742231b10e8888abcd99yyyzzz85a6"]);
    assert_eq!(
        wrong.verify(&signed(), BODY, TS),
        Err(VerifyError::NoSignatureMatched)
    );
    let v = verifier(scheme("slack"), &[SECRET]);
    let mut tampered = BODY.to_vec();
    tampered[6] = b'X';
    assert_eq!(
        v.verify(&signed(), &tampered, TS),
        Err(VerifyError::NoSignatureMatched)
    );
    let moved = with_header(&signed(), "X-Slack-Request-Timestamp", "1531420619");
    assert_eq!(
        v.verify(&moved, BODY, TS),
        Err(VerifyError::NoSignatureMatched)
    );
}

#[test]
fn stale_and_future_timestamps_are_refused() {
    let v = verifier(scheme("slack"), &[SECRET]);
    assert_eq!(
        v.verify(&signed(), BODY, TS + 3600),
        Err(VerifyError::TimestampTooOld { age_secs: 3600 })
    );
    assert_eq!(
        v.verify(&signed(), BODY, TS - 3600),
        Err(VerifyError::TimestampInFuture { ahead_secs: 3600 })
    );
}

proptest! {
    #[test]
    fn sign_then_verify(body in prop::collection::vec(any::<u8>(), 1..256),
                        now in 1_000_000_000i64..4_000_000_000, flip in flip()) {
        let v = verifier(scheme("slack"), &[SECRET, "old"]);
        check_round_trip(&v, &body, now, "", &flip)?;
    }
}
