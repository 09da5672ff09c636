//! Keys of the generic kinds (`hmac`, `basic`, `token`): a provider's
//! public key written as base64, hex or PEM (Ed25519 raw or
//! SubjectPublicKeyInfo, P-256 SubjectPublicKeyInfo or a SEC1 point), and a
//! shared secret's text turned into key bytes as `secret_encoding` and
//! `secret_normalize` say; and the keys of a rule whose secrets say by a
//! prefix what they are (Standard Webhooks' `whsec_` and `whpk_`). Errors
//! say what is wrong, never the secret.

use base64::Engine as _;
use unicode_normalization::UnicodeNormalization as _;

use super::Key;
use super::rule::{Alg, SecretEncoding, SignedRule};

/// The key a generic rule verifies with.
pub(super) fn decode_key(rule: &SignedRule, secret: &str) -> Result<Key, String> {
    match rule.alg {
        Alg::Ed25519 => ed25519_key(secret).map(Key::Ed25519),
        Alg::EcdsaP256 => p256_key(secret).map(Key::P256),
        Alg::Hmac(_) | Alg::Token => shared_key(rule, secret).map(Key::Hmac),
    }
}

/// A shared secret's key bytes: its text (NFKD-normalised first when the
/// rule says so), or the bytes it encodes.
pub(super) fn shared_key(rule: &SignedRule, secret: &str) -> Result<Vec<u8>, String> {
    let text: String = if rule.secret_nfkd {
        secret.nfkd().collect()
    } else {
        secret.to_owned()
    };
    match rule.secret_encoding {
        SecretEncoding::Text => Ok(text.into_bytes()),
        SecretEncoding::Base64 => base64::engine::general_purpose::STANDARD_PAD_INDIFFERENT
            .decode(text.trim())
            .map_err(|_| "secret_encoding is base64, and the secret is not base64".to_owned()),
        SecretEncoding::Hex => hex::decode(text.trim())
            .map_err(|_| "secret_encoding is hex, and the secret is not hex".to_owned()),
    }
}

/// A secret of a rule with `secret_prefixes`: the prefix (if any) says
/// what it is, the rest is the key written in `secret_encoding`, as is
/// (nothing trimmed); a shared secret may not be empty.
pub(super) fn prefixed_key(rule: &SignedRule, secret: &str) -> Result<Key, String> {
    let prefixed = rule
        .secret_prefixes
        .iter()
        .find_map(|(prefix, alg)| Some((*prefix, *alg, secret.strip_prefix(prefix)?)));
    let (prefix, alg, written) = prefixed.unwrap_or(("", rule.alg, secret));
    let name = if prefix.is_empty() { "the" } else { prefix };
    let bytes = match rule.secret_encoding {
        SecretEncoding::Text => Some(written.as_bytes().to_vec()),
        SecretEncoding::Base64 => base64::engine::general_purpose::STANDARD_PAD_INDIFFERENT
            .decode(written)
            .ok(),
        SecretEncoding::Hex => hex::decode(written).ok(),
    };
    let encoding = match rule.secret_encoding {
        SecretEncoding::Text => "text",
        SecretEncoding::Base64 => "base64",
        SecretEncoding::Hex => "hex",
    };
    match alg {
        Alg::Hmac(_) | Alg::Token => match bytes {
            Some(bytes) if !bytes.is_empty() => Ok(Key::Hmac(bytes)),
            _ => {
                let prefixes: Vec<&str> = rule.secret_prefixes.iter().map(|(p, _)| *p).collect();
                Err(format!("not a {} {encoding} key", prefixes.join(" or ")))
            }
        },
        Alg::Ed25519 => {
            let bytes = bytes.ok_or_else(|| format!("{name} key is not {encoding}"))?;
            let bytes: [u8; 32] = bytes
                .try_into()
                .map_err(|_| format!("{name} key is not 32 bytes"))?;
            ed25519_dalek::VerifyingKey::from_bytes(&bytes)
                .map(Key::Ed25519)
                .map_err(|_| format!("{name} key is not an ed25519 public key"))
        }
        Alg::EcdsaP256 => {
            use p256::pkcs8::DecodePublicKey as _;
            let bytes = bytes.ok_or_else(|| format!("{name} key is not {encoding}"))?;
            p256::ecdsa::VerifyingKey::from_public_key_der(&bytes)
                .or_else(|_| p256::ecdsa::VerifyingKey::from_sec1_bytes(&bytes))
                .map(Key::P256)
                .map_err(|_| format!("{name} key is not a P-256 public key"))
        }
    }
}

/// The bytes a public key's text holds: the DER of a PEM block, or hex,
/// or base64 (standard or URL-safe alphabet).
fn key_bytes(secret: &str) -> Option<Vec<u8>> {
    let text = secret.trim();
    if text.starts_with("-----BEGIN") {
        let body: String = text
            .lines()
            .filter(|l| !l.starts_with("-----"))
            .flat_map(|l| l.chars().filter(|c| !c.is_whitespace()))
            .collect();
        return base64::engine::general_purpose::STANDARD_PAD_INDIFFERENT
            .decode(body)
            .ok();
    }
    // Hex first: a hex text is also base64 (of other bytes).
    if let Ok(bytes) = hex::decode(text) {
        return Some(bytes);
    }
    base64::engine::general_purpose::STANDARD_PAD_INDIFFERENT
        .decode(text)
        .or_else(|_| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(text.trim_end_matches('='))
        })
        .ok()
}

fn ed25519_key(secret: &str) -> Result<ed25519_dalek::VerifyingKey, String> {
    use ed25519_dalek::pkcs8::DecodePublicKey as _;
    const WHAT: &str =
        "not an Ed25519 public key (32 bytes, or a SubjectPublicKeyInfo, as base64, hex or PEM)";
    let bytes = key_bytes(secret).ok_or(WHAT)?;
    let key = match <[u8; 32]>::try_from(bytes.as_slice()) {
        Ok(raw) => ed25519_dalek::VerifyingKey::from_bytes(&raw).ok(),
        Err(_) => ed25519_dalek::VerifyingKey::from_public_key_der(&bytes).ok(),
    };
    key.ok_or_else(|| WHAT.to_owned())
}

fn p256_key(secret: &str) -> Result<p256::ecdsa::VerifyingKey, String> {
    use p256::pkcs8::DecodePublicKey as _;
    const WHAT: &str =
        "not a P-256 public key (a SubjectPublicKeyInfo or a SEC1 point, as base64, hex or PEM)";
    let bytes = key_bytes(secret).ok_or(WHAT)?;
    p256::ecdsa::VerifyingKey::from_public_key_der(&bytes)
        .or_else(|_| p256::ecdsa::VerifyingKey::from_sec1_bytes(&bytes))
        .map_err(|_| WHAT.to_owned())
}

/// Wycheproof's HMAC, Ed25519 and ECDSA P-256 vectors through the generic
/// `hmac` rule, as a source configured by hand would check them: the key
/// as its configured text (hex for HMAC keys, PEM for public keys), the
/// message as the body, the tag or signature in a header. Every `valid`
/// vector verifies and every `invalid` one (malleable, malformed,
/// truncated signatures, edge-case keys) is refused.
#[cfg(test)]
mod wycheproof_vectors {
    use std::time::Duration;

    use base64::Engine as _;
    use wycheproof::TestResult;

    use super::super::rule::{Alg, Carrier, Piece, SecretEncoding, SignedRule};
    use super::super::{Encoding, HmacAlgorithm, Request, Scheme, Secret, Verifier};

    fn verifier(alg: Alg, secret_encoding: SecretEncoding, secret: String) -> Option<Verifier> {
        let scheme = Scheme::Rule {
            kind: "hmac",
            rule: Box::new(SignedRule {
                alg,
                encoding: Encoding::Base64,
                message: vec![Piece::Body],
                carrier: Carrier::Header {
                    name: "X-Sig".to_owned(),
                    prefix: String::new(),
                    list: None,
                },
                timestamp: None,
                secret_encoding,
                secret_nfkd: false,
                secret_prefixes: &[],
                escaped_body: false,
                require: Vec::new(),
                strict: false,
                summary: None,
            }),
        };
        Verifier::new(scheme, vec![Secret::new(secret)], Duration::ZERO).ok()
    }

    fn verifies(v: &Verifier, msg: &[u8], sig: &[u8]) -> bool {
        let headers = vec![(
            "X-Sig".to_owned(),
            base64::engine::general_purpose::STANDARD.encode(sig),
        )];
        v.verify_request(&Request::post(&headers, msg), 0).is_ok()
    }

    /// Runs one set; the number of vectors checked.
    fn check(
        label: &str,
        cases: impl Iterator<Item = (Option<Verifier>, Vec<u8>, Vec<u8>, TestResult, usize)>,
    ) -> usize {
        let mut checked = 0;
        let mut wrong = Vec::new();
        for (v, msg, sig, result, id) in cases {
            let expected = match result {
                TestResult::Valid => true,
                TestResult::Invalid => false,
                TestResult::Acceptable => continue,
            };
            // A key the config refuses verifies nothing: right for an
            // invalid vector, wrong for a valid one.
            let got = v.as_ref().is_some_and(|v| verifies(v, &msg, &sig));
            if got != expected {
                wrong.push(format!("{label} tcId {id}: expected {expected}, got {got}"));
            }
            checked += 1;
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
        checked
    }

    #[test]
    fn hmac_vectors() {
        use wycheproof::mac::{TestName, TestSet};
        let sets = [
            (TestName::HmacSha1, HmacAlgorithm::Sha1, 160),
            (TestName::HmacSha256, HmacAlgorithm::Sha256, 256),
            (TestName::HmacSha512, HmacAlgorithm::Sha512, 512),
        ];
        for (name, alg, full) in sets {
            let set = TestSet::load(name).expect("the set loads");
            let cases = set
                .test_groups
                .into_iter()
                // A truncated tag is not what a provider sends: full tags only.
                .filter(|g| g.tag_size == full)
                .flat_map(|g| g.tests)
                // An empty key is refused by the config ("empty").
                .filter(|t| !t.key.is_empty())
                .map(move |t| {
                    let v = verifier(Alg::Hmac(alg), SecretEncoding::Hex, hex::encode(&*t.key));
                    (v, t.msg.to_vec(), t.tag.to_vec(), t.result, t.tc_id)
                });
            let n = check(&format!("{name:?}"), cases);
            assert!(n > 50, "{name:?}: only {n} vectors");
        }
    }

    #[test]
    fn ed25519_vectors() {
        use wycheproof::eddsa::{TestName, TestSet};
        let set = TestSet::load(TestName::Ed25519).expect("the set loads");
        let cases = set.test_groups.into_iter().flat_map(|g| {
            let pem = g.pem.clone();
            g.tests.into_iter().map(move |t| {
                let v = verifier(Alg::Ed25519, SecretEncoding::Text, pem.clone());
                (v, t.msg.to_vec(), t.sig.to_vec(), t.result, t.tc_id)
            })
        });
        let n = check("ed25519", cases);
        assert!(n > 100, "only {n} vectors");
    }

    #[test]
    fn ecdsa_p256_vectors() {
        use wycheproof::ecdsa::{TestGroupTypeId, TestName, TestSet};
        let set = TestSet::load(TestName::EcdsaSecp256r1Sha256).expect("the set loads");
        let cases = set
            .test_groups
            .into_iter()
            .filter(|g| g.test_type == TestGroupTypeId::Ecdsa)
            .flat_map(|g| {
                let pem = g.pem.clone();
                g.tests.into_iter().map(move |t| {
                    let v = verifier(Alg::EcdsaP256, SecretEncoding::Text, pem.clone());
                    (v, t.msg.to_vec(), t.sig.to_vec(), t.result, t.tc_id)
                })
            });
        let n = check("ecdsa-p256", cases);
        assert!(n > 100, "only {n} vectors");
    }
}
