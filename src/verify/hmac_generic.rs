//! Kind `hmac`, for any sender not built in: one configured header holding
//! `prefix` + the HMAC (SHA-1, SHA-256 or SHA-512) of the raw body, hex or
//! base64, keyed with the secret's text. No timestamp is signed.

use super::{HmacParams, MalformedReason, Verdict, Verifier, VerifyError};

pub(super) fn verify(
    verifier: &Verifier,
    params: &HmacParams,
    headers: &[(String, String)],
    body: &[u8],
) -> Result<Verdict, VerifyError> {
    let value = super::required_header(headers, &params.header)?;
    let encoded = super::strip_prefix_ignore_case(value, &params.prefix).ok_or_else(|| {
        super::malformed(
            &params.header,
            MalformedReason::MissingPrefix(params.prefix.clone()),
        )
    })?;
    let tag = super::decode_signature(&params.header, encoded, params.encoding)?;
    let index = verifier.match_hmac(params.algorithm, &[body], &[tag])?;
    Ok(Verdict {
        secret_index: Some(index),
        timestamp: None,
    })
}

pub(super) fn sign(
    verifier: &Verifier,
    params: &HmacParams,
    body: &[u8],
) -> Result<Vec<(String, String)>, String> {
    let tag = verifier.sign_hmac(params.algorithm, &[body])?;
    let value = format!(
        "{}{}",
        params.prefix,
        super::encode_signature(&tag, params.encoding)
    );
    Ok(vec![(params.header.clone(), value)])
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use proptest::prelude::*;

    use super::super::test_support::*;
    use super::super::{
        Encoding, HmacAlgorithm, HmacParams, MalformedReason, Scheme, Secret, Verdict, Verifier,
        VerifyError,
    };

    const SECRET: &str = "generic-secret";
    const BODY: &[u8] = b"hello";
    // Computed independently with python3's hmac module over b"hello".
    const SHA1_HEX: &str = "0954c560cc9251237e1d2dd63d667284b523401f";
    const SHA512_BASE64: &str =
        "0MGnbRiABH8kSRCOU/QLcWMSD+Cyrnzbnm8USVa0KuyybzcI1dVGhxfVKfOIjMB+wyPmNsQVsOHdz+T9ZecaRw==";

    fn scheme(algorithm: HmacAlgorithm, encoding: Encoding, prefix: &str) -> Scheme {
        Scheme::Hmac(HmacParams {
            header: "X-Signature".to_owned(),
            algorithm,
            encoding,
            prefix: prefix.to_owned(),
        })
    }

    fn sha1_hex() -> Scheme {
        scheme(HmacAlgorithm::Sha1, Encoding::Hex, "sha1=")
    }

    fn header(value: &str) -> Vec<(String, String)> {
        headers(&[("x-signature", value)])
    }

    fn malformed(reason: MalformedReason) -> VerifyError {
        VerifyError::MalformedHeader {
            header: "x-signature".to_owned(),
            reason,
        }
    }

    #[test]
    fn independent_vectors_verify_and_sign() {
        let v = verifier(sha1_hex(), &[SECRET]);
        let value = format!("sha1={SHA1_HEX}");
        let verdict = v.verify(&header(&value), BODY, 0);
        assert_eq!(
            verdict,
            Ok(Verdict {
                secret_index: Some(0),
                timestamp: None
            })
        );
        assert_eq!(
            v.sign(BODY, 0, "").unwrap(),
            headers(&[("X-Signature", &value)])
        );

        let v = verifier(
            scheme(HmacAlgorithm::Sha512, Encoding::Base64, ""),
            &[SECRET],
        );
        assert!(v.verify(&header(SHA512_BASE64), BODY, 0).is_ok());
        assert_eq!(
            v.sign(BODY, 0, "").unwrap(),
            headers(&[("X-Signature", SHA512_BASE64)])
        );

        // SHA-256 hex with GitHub's prefix is GitHub's scheme under another name.
        let v = verifier(
            scheme(HmacAlgorithm::Sha256, Encoding::Hex, "sha256="),
            &["It's a Secret to Everybody"],
        );
        let github = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";
        assert!(v.verify(&header(github), b"Hello, World!", 0).is_ok());
    }

    #[test]
    fn the_algorithm_is_part_of_the_check() {
        let v = verifier(
            scheme(HmacAlgorithm::Sha256, Encoding::Hex, "sha1="),
            &[SECRET],
        );
        let value = format!("sha1={SHA1_HEX}");
        assert_eq!(
            v.verify(&header(&value), BODY, 0),
            Err(VerifyError::NoSignatureMatched)
        );
    }

    #[test]
    fn rotation_reports_the_secret_that_matched() {
        let v = verifier(sha1_hex(), &["new-secret", SECRET]);
        let verdict = v
            .verify(&header(&format!("sha1={SHA1_HEX}")), BODY, 0)
            .unwrap();
        assert_eq!(verdict.secret_index, Some(1));
    }

    #[test]
    fn missing_duplicate_and_malformed_headers() {
        let v = verifier(sha1_hex(), &[SECRET]);
        assert_eq!(
            v.verify(&[], BODY, 0),
            Err(VerifyError::MissingHeader("x-signature".to_owned()))
        );
        let signed = header(&format!("sha1={SHA1_HEX}"));
        let err = v
            .verify(&doubled(&signed, "X-Signature"), BODY, 0)
            .unwrap_err();
        assert_eq!(err, VerifyError::DuplicateHeader("x-signature".to_owned()));
        assert!(err.is_bad_request());
        let cases = [
            (
                SHA1_HEX.to_owned(),
                MalformedReason::MissingPrefix("sha1=".to_owned()),
            ),
            (format!("sha1={}", &SHA1_HEX[1..]), MalformedReason::BadHex),
            ("sha1=".to_owned(), MalformedReason::NoSignature),
            ("sha1=\0".to_owned(), MalformedReason::ContainsNul),
        ];
        for (value, reason) in cases {
            let err = v.verify(&header(&value), BODY, 0).unwrap_err();
            assert_eq!(err, malformed(reason.clone()), "{value:?}");
            assert_eq!(err.is_bad_request(), reason == MalformedReason::ContainsNul);
        }
        let b64 = verifier(
            scheme(HmacAlgorithm::Sha512, Encoding::Base64, ""),
            &[SECRET],
        );
        assert_eq!(
            b64.verify(&header("%%%%"), BODY, 0),
            Err(malformed(MalformedReason::BadBase64))
        );
    }

    #[test]
    fn wrong_secret_and_tampered_body_match_nothing() {
        let signed = header(&format!("sha1={SHA1_HEX}"));
        let wrong = verifier(sha1_hex(), &["other"]);
        assert_eq!(
            wrong.verify(&signed, BODY, 0),
            Err(VerifyError::NoSignatureMatched)
        );
        let v = verifier(sha1_hex(), &[SECRET]);
        assert_eq!(
            v.verify(&signed, b"hellO", 0),
            Err(VerifyError::NoSignatureMatched)
        );
    }

    #[test]
    fn a_bad_header_name_is_a_config_error() {
        for name in ["", "X Sig", "X-Sig:", "Ünïcode"] {
            let params = HmacParams {
                header: name.to_owned(),
                algorithm: HmacAlgorithm::Sha256,
                encoding: Encoding::Hex,
                prefix: String::new(),
            };
            let secrets = vec![Secret::new(SECRET.to_owned())];
            assert!(
                Verifier::new(Scheme::Hmac(params), secrets, Duration::ZERO).is_err(),
                "{name:?}"
            );
        }
    }

    fn any_scheme() -> impl Strategy<Value = Scheme> {
        let algorithm = prop_oneof![
            Just(HmacAlgorithm::Sha1),
            Just(HmacAlgorithm::Sha256),
            Just(HmacAlgorithm::Sha512)
        ];
        let encoding = prop_oneof![Just(Encoding::Hex), Just(Encoding::Base64)];
        let prefix = prop_oneof![Just(""), Just("sha256="), Just("v1:")];
        (algorithm, encoding, prefix).prop_map(|(a, e, p)| scheme(a, e, p))
    }

    proptest! {
        #[test]
        fn sign_then_verify(scheme in any_scheme(), body in prop::collection::vec(any::<u8>(), 1..256),
                            flip in flip()) {
            let v = verifier(scheme, &[SECRET, "old"]);
            check_round_trip(&v, &body, 0, "", &flip)?;
        }
    }
}
