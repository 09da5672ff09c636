//! Slack: `X-Slack-Signature: v0=<hex>`, an HMAC-SHA256 of
//! `"v0:{ts}:{body}"` keyed with the signing secret's text, where `ts` is
//! `X-Slack-Request-Timestamp` and must be within the tolerance.
//! The `url_verification` challenge is the receiver's business, not this file's.

use super::{Encoding, HmacAlgorithm, MalformedReason, Verdict, Verifier, VerifyError};

const SIGNATURE_HEADER: &str = "X-Slack-Signature";
const TIMESTAMP_HEADER: &str = "X-Slack-Request-Timestamp";
const VERSION: &str = "v0";

pub(super) fn verify(
    verifier: &Verifier,
    headers: &[(String, String)],
    body: &[u8],
    now: i64,
) -> Result<Verdict, VerifyError> {
    let signature = super::required_header(headers, SIGNATURE_HEADER)?;
    let timestamp_raw = super::required_header(headers, TIMESTAMP_HEADER)?;
    let timestamp = super::parse_timestamp(TIMESTAMP_HEADER, timestamp_raw)?;
    let hex = signature.strip_prefix("v0=").ok_or_else(|| {
        super::malformed(
            SIGNATURE_HEADER,
            MalformedReason::MissingPrefix("v0=".to_owned()),
        )
    })?;
    let tag = super::decode_signature(SIGNATURE_HEADER, hex, Encoding::Hex)?;
    let message: [&[u8]; 5] = [
        VERSION.as_bytes(),
        b":",
        timestamp_raw.as_bytes(),
        b":",
        body,
    ];
    let index = verifier.match_hmac(HmacAlgorithm::Sha256, &message, &[tag])?;
    verifier.check_freshness(timestamp, now)?;
    Ok(Verdict {
        secret_index: Some(index),
        timestamp: Some(timestamp),
    })
}

pub(super) fn sign(
    verifier: &Verifier,
    body: &[u8],
    now: i64,
) -> Result<Vec<(String, String)>, String> {
    let timestamp = now.to_string();
    let message: [&[u8]; 5] = [VERSION.as_bytes(), b":", timestamp.as_bytes(), b":", body];
    let tag = verifier.sign_hmac(HmacAlgorithm::Sha256, &message)?;
    Ok(vec![
        (TIMESTAMP_HEADER.to_owned(), timestamp),
        (
            SIGNATURE_HEADER.to_owned(),
            format!("{VERSION}={}", hex::encode(tag)),
        ),
    ])
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::super::test_support::*;
    use super::super::{MalformedReason, Scheme, Verdict, VerifyError};

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
        let v = verifier(Scheme::Slack, &[SECRET]);
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
        let v = verifier(Scheme::Slack, &["new-signing-secret", SECRET]);
        assert_eq!(v.verify(&signed(), BODY, TS).unwrap().secret_index, Some(1));
    }

    #[test]
    fn missing_and_duplicate_headers() {
        let v = verifier(Scheme::Slack, &[SECRET]);
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
        let v = verifier(Scheme::Slack, &[SECRET]);
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
        let wrong = verifier(Scheme::Slack, &["8f742231b10e8888abcd99yyyzzz85a6"]);
        assert_eq!(
            wrong.verify(&signed(), BODY, TS),
            Err(VerifyError::NoSignatureMatched)
        );
        let v = verifier(Scheme::Slack, &[SECRET]);
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
        let v = verifier(Scheme::Slack, &[SECRET]);
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
            let v = verifier(Scheme::Slack, &[SECRET, "old"]);
            check_round_trip(&v, &body, now, "", &flip)?;
        }
    }
}
