//! Keys of the generic kinds (`hmac`, `basic`, `token`): a provider's
//! public key written as base64, hex or PEM (Ed25519 raw or
//! SubjectPublicKeyInfo, P-256 SubjectPublicKeyInfo or a SEC1 point), and a
//! shared secret's text turned into key bytes as `secret_encoding` and
//! `secret_normalize` say. Errors say what is wrong, never the secret.

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
