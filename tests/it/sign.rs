//! Independent webhook signers, written from the providers' documentation and
//! not from the crate's code, so the tests do not trust what they test.
//!
//! Each signer returns the header list a provider would send (signature,
//! id/type headers where the scheme carries them, and `Content-Type`).
//! Known-answer tests at the bottom pin the primitives to published vectors.

#![allow(dead_code)] // not every test module uses every scheme

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use hmac::{Hmac, KeyInit, Mac};
use sha2::{Sha256, Sha512};

pub type Headers = Vec<(String, String)>;

fn h(name: &str, value: impl Into<String>) -> (String, String) {
    (name.to_string(), value.into())
}

pub fn json_content_type() -> (String, String) {
    h("Content-Type", "application/json")
}

/// HMAC-SHA256 of the concatenation of `parts`.
pub fn hmac_sha256(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    let mut mac =
        <Hmac<Sha256> as KeyInit>::new_from_slice(key).expect("hmac accepts any key length");
    for part in parts {
        mac.update(part);
    }
    mac.finalize().into_bytes().to_vec()
}

pub fn hmac_sha512(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    let mut mac =
        <Hmac<Sha512> as KeyInit>::new_from_slice(key).expect("hmac accepts any key length");
    for part in parts {
        mac.update(part);
    }
    mac.finalize().into_bytes().to_vec()
}

pub fn hmac_sha1(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    let mut mac =
        <Hmac<sha1::Sha1> as KeyInit>::new_from_slice(key).expect("hmac accepts any key length");
    for part in parts {
        mac.update(part);
    }
    mac.finalize().into_bytes().to_vec()
}

/// Hex SHA-256 of `data` (what `payload_hash` holds for a whole-body hash).
pub fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest as _;
    hex::encode(Sha256::digest(data))
}

/// The hash of a Stripe event claimed by catch-up from the API list,
/// after its `listed:` prefix, written independently of the server: over
/// `/id`, `/type` and `/data`, each as canonical JSON (keys sorted,
/// compact; `null` when absent), each prefixed with its length and a
/// colon, so a body formatted differently hashes the same.
pub fn stripe_listed_hash(body: &[u8]) -> String {
    use sha2::Digest as _;
    fn canonical(v: &serde_json::Value) -> String {
        match v {
            serde_json::Value::Object(map) => {
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort();
                let members: Vec<String> = keys
                    .into_iter()
                    .map(|k| {
                        format!(
                            "{}:{}",
                            serde_json::Value::from(k.as_str()),
                            canonical(&map[k])
                        )
                    })
                    .collect();
                format!("{{{}}}", members.join(","))
            }
            serde_json::Value::Array(items) => {
                format!(
                    "[{}]",
                    items.iter().map(canonical).collect::<Vec<_>>().join(",")
                )
            }
            other => other.to_string(),
        }
    }
    let parsed: serde_json::Value = serde_json::from_slice(body).expect("a JSON body");
    let mut hasher = Sha256::new();
    for member in ["id", "type", "data"] {
        let text = parsed
            .get(member)
            .map_or_else(|| "null".to_string(), canonical);
        hasher.update(format!("{}:{text}", text.len()).as_bytes());
    }
    hex::encode(hasher.finalize())
}

/// Stripe: `Stripe-Signature: t=<unix secs>,v1=<hex HMAC-SHA256 of "t.body">`.
pub fn stripe(secret: &str, body: &[u8], timestamp: i64) -> Headers {
    vec![
        stripe_signature_header(secret, body, timestamp),
        json_content_type(),
    ]
}

/// Just the `Stripe-Signature` header pair.
pub fn stripe_signature_header(secret: &str, body: &[u8], timestamp: i64) -> (String, String) {
    let t = timestamp.to_string();
    let sig = hmac_sha256(secret.as_bytes(), &[t.as_bytes(), b".", body]);
    h("Stripe-Signature", format!("t={t},v1={}", hex::encode(sig)))
}

/// Stripe signed now.
pub fn stripe_now(secret: &str, body: &[u8]) -> Headers {
    stripe(secret, body, super::harness::now_secs())
}

/// GitHub: `X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of body>`, with the
/// delivery id and event name headers.
pub fn github(secret: &str, body: &[u8], delivery_id: &str, event: &str) -> Headers {
    let sig = hmac_sha256(secret.as_bytes(), &[body]);
    vec![
        h(
            "X-Hub-Signature-256",
            format!("sha256={}", hex::encode(sig)),
        ),
        h("X-GitHub-Delivery", delivery_id),
        h("X-GitHub-Event", event),
        json_content_type(),
    ]
}

/// Standard Webhooks: secret `whsec_<base64 key>`; signs `id.timestamp.body`;
/// `webhook-signature: v1,<base64 HMAC-SHA256>`.
pub fn standard(secret: &str, msg_id: &str, timestamp: i64, body: &[u8]) -> Headers {
    vec![
        h("webhook-id", msg_id),
        h("webhook-timestamp", timestamp.to_string()),
        h(
            "webhook-signature",
            standard_signature(secret, msg_id, timestamp, body),
        ),
        json_content_type(),
    ]
}

/// The `v1,<base64>` value for Standard Webhooks.
pub fn standard_signature(secret: &str, msg_id: &str, timestamp: i64, body: &[u8]) -> String {
    let key_b64 = secret.strip_prefix("whsec_").unwrap_or(secret);
    let key = B64.decode(key_b64).expect("whsec_ secret must be base64");
    let ts = timestamp.to_string();
    let sig = hmac_sha256(&key, &[msg_id.as_bytes(), b".", ts.as_bytes(), b".", body]);
    format!("v1,{}", B64.encode(sig))
}

/// A `whsec_` secret from raw key bytes.
pub fn whsec(key: &[u8]) -> String {
    format!("whsec_{}", B64.encode(key))
}

/// Shopify: `X-Shopify-Hmac-Sha256: <base64 HMAC-SHA256 of body>`.
pub fn shopify(secret: &str, body: &[u8], event_id: &str, topic: &str) -> Headers {
    let sig = hmac_sha256(secret.as_bytes(), &[body]);
    vec![
        h("X-Shopify-Hmac-Sha256", B64.encode(sig)),
        h("X-Shopify-Event-Id", event_id),
        h("X-Shopify-Topic", topic),
        json_content_type(),
    ]
}

/// Slack: `X-Slack-Signature: v0=<hex HMAC-SHA256 of "v0:ts:body">`.
pub fn slack(secret: &str, body: &[u8], timestamp: i64) -> Headers {
    let ts = timestamp.to_string();
    let sig = hmac_sha256(secret.as_bytes(), &[b"v0:", ts.as_bytes(), b":", body]);
    vec![
        h("X-Slack-Request-Timestamp", ts),
        h("X-Slack-Signature", format!("v0={}", hex::encode(sig))),
        json_content_type(),
    ]
}

/// Paddle: `Paddle-Signature: ts=<secs>;h1=<hex HMAC-SHA256 of "ts:body">`.
pub fn paddle(secret: &str, body: &[u8], timestamp: i64) -> Headers {
    let ts = timestamp.to_string();
    let sig = hmac_sha256(secret.as_bytes(), &[ts.as_bytes(), b":", body]);
    vec![
        h(
            "Paddle-Signature",
            format!("ts={ts};h1={}", hex::encode(sig)),
        ),
        json_content_type(),
    ]
}

/// Linear: `Linear-Signature: <hex HMAC-SHA256 of body>` (the body carries
/// `webhookTimestamp`).
pub fn linear(secret: &str, body: &[u8], delivery_id: &str, event: &str) -> Headers {
    let sig = hmac_sha256(secret.as_bytes(), &[body]);
    vec![
        h("Linear-Signature", hex::encode(sig)),
        h("Linear-Delivery", delivery_id),
        h("Linear-Event", event),
        json_content_type(),
    ]
}

#[derive(Clone, Copy, Debug)]
pub enum Algorithm {
    Sha1,
    Sha256,
    Sha512,
}

#[derive(Clone, Copy, Debug)]
pub enum Encoding {
    Hex,
    Base64,
}

/// Generic HMAC: `header: <prefix><encoded HMAC of body>`. The caller adds
/// whatever headers carry the key and type.
pub fn generic_hmac(
    header: &str,
    algorithm: Algorithm,
    encoding: Encoding,
    prefix: &str,
    secret: &str,
    body: &[u8],
) -> Headers {
    let sig = match algorithm {
        Algorithm::Sha1 => hmac_sha1(secret.as_bytes(), &[body]),
        Algorithm::Sha256 => hmac_sha256(secret.as_bytes(), &[body]),
        Algorithm::Sha512 => hmac_sha512(secret.as_bytes(), &[body]),
    };
    let encoded = match encoding {
        Encoding::Hex => hex::encode(sig),
        Encoding::Base64 => B64.encode(sig),
    };
    vec![h(header, format!("{prefix}{encoded}")), json_content_type()]
}

// Known-answer tests: these pass without the binary.
#[test]
fn hmac_sha256_matches_rfc4231_case_2() {
    let got = hex::encode(hmac_sha256(
        b"Jefe",
        &[b"what do ya want ", b"for nothing?"],
    ));
    assert_eq!(
        got,
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
    );
}

#[test]
fn hmac_sha1_and_sha512_match_rfc_vectors() {
    // RFC 2202 case 2 and RFC 4231 case 2.
    assert_eq!(
        hex::encode(hmac_sha1(b"Jefe", &[b"what do ya want for nothing?"])),
        "effcdf6ae5eb2fa2d27416d5f184df9c259a7c79"
    );
    assert_eq!(
        hex::encode(hmac_sha512(b"Jefe", &[b"what do ya want for nothing?"])),
        "164b7a7bfcf819e2e395fbe73b56e0a387bd64222e831fd610270cd7ea2505549758bf75c05a994a6d034f65f8f0e6fdcaeab1a34d4a6b4b636e070a38bce737"
    );
}

#[test]
fn standard_webhooks_matches_published_vector() {
    // The example from the Standard Webhooks / Svix libraries' test suites.
    let got = standard_signature(
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        "msg_p5jXN8AQM9LWM0D4loKWxJek",
        1614265330,
        br#"{"test": 2432232314}"#,
    );
    assert_eq!(got, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
}

#[test]
fn stripe_header_shape() {
    let (name, value) = stripe_signature_header("whsec_test", b"{}", 1700000000);
    assert_eq!(name, "Stripe-Signature");
    let expected_sig = hex::encode(hmac_sha256(b"whsec_test", &[b"1700000000.{}"]));
    assert_eq!(value, format!("t=1700000000,v1={expected_sig}"));
}
