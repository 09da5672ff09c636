//! Shopify: `X-Shopify-Hmac-Sha256: <base64>`, an HMAC-SHA256 of the raw body
//! keyed with the app's client secret text. No timestamp is signed.

use super::{Encoding, HmacAlgorithm, Verdict, Verifier, VerifyError};

const SIGNATURE_HEADER: &str = "X-Shopify-Hmac-Sha256";

pub(super) fn verify(
    verifier: &Verifier,
    headers: &[(String, String)],
    body: &[u8],
) -> Result<Verdict, VerifyError> {
    let value = super::required_header(headers, SIGNATURE_HEADER)?;
    let tag = super::decode_signature(SIGNATURE_HEADER, value, Encoding::Base64)?;
    let index = verifier.match_hmac(HmacAlgorithm::Sha256, &[body], &[tag])?;
    Ok(Verdict {
        secret_index: Some(index),
        timestamp: None,
    })
}

pub(super) fn sign(verifier: &Verifier, body: &[u8]) -> Result<Vec<(String, String)>, String> {
    let tag = verifier.sign_hmac(HmacAlgorithm::Sha256, &[body])?;
    let value = super::encode_signature(&tag, Encoding::Base64);
    Ok(vec![(SIGNATURE_HEADER.to_owned(), value)])
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::super::test_support::*;
    use super::super::{MalformedReason, Scheme, Verdict, VerifyError};

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
        let v = verifier(Scheme::Shopify, &[SECRET]);
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
        let v = verifier(Scheme::Shopify, &["shpss_new", SECRET]);
        assert_eq!(
            v.verify(&header(SIG), BODY, 0).unwrap().secret_index,
            Some(1)
        );
    }

    #[test]
    fn missing_duplicate_and_malformed_headers() {
        let v = verifier(Scheme::Shopify, &[SECRET]);
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
        let wrong = verifier(Scheme::Shopify, &["shpss_other"]);
        assert_eq!(
            wrong.verify(&header(SIG), BODY, 0),
            Err(VerifyError::NoSignatureMatched)
        );
        let v = verifier(Scheme::Shopify, &[SECRET]);
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
            let v = verifier(Scheme::Shopify, &[SECRET, "old"]);
            check_round_trip(&v, &body, 0, "", &flip)?;
        }
    }
}
