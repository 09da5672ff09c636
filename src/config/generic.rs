//! The generic kinds, for a provider that is not a kind of its own: `hmac`
//! (any HMAC, Ed25519 or ECDSA P-256 rule over a template of the request),
//! `basic` (HTTP Basic authentication) and `token` (a header that holds a
//! secret); and the settings any kind takes: `batch`, `item_key`,
//! `item_type`, `empty_batch` and `answer`.

use super::kind::Kind;
use super::raw::RawSource;
use crate::verify::rule::{
    Alg, Carrier, Piece, SecretEncoding, SignedRule, TimeFormat, TimeFrom, Timestamp, Window,
};
use crate::verify::{Encoding, HmacAlgorithm, HmacParams, Scheme};

/// What a correctly signed batch without events is answered (`empty_batch`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EmptyBatch {
    /// 200, nothing stored (a provider's "intent to receive" check).
    Ack,
    /// 400.
    Reject,
}

/// What a stored or duplicate delivery is answered (`answer`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// idemhook's JSON.
    Json,
    /// 200 with no body.
    Empty,
}

/// A source's batch and answer settings.
pub(super) struct Shape {
    pub batch_items: Option<String>,
    pub empty_batch: EmptyBatch,
    pub answer: Answer,
}

/// `batch`, `empty_batch` and `answer`; with `batch`, `item_key` and
/// `item_type` take the places of `key` and `type` in `rs` (they are read
/// inside each item).
pub(super) fn shape_of(kind: Kind, rs: &mut RawSource) -> Result<Shape, String> {
    let own_batch = kind.preset().and_then(|p| p.batch).is_some();
    let batch_items = match rs.batch.as_deref() {
        None => None,
        Some(_) if own_batch => {
            return Err(format!(
                "batch: kind \"{}\" has its own batch shape",
                kind.name()
            ));
        }
        Some(spec) => Some(batch_pointer(spec)?),
    };
    if batch_items.is_none() {
        for (key, set) in [
            ("item_key", rs.item_key.is_some()),
            ("item_type", rs.item_type.is_some()),
        ] {
            if set {
                return Err(format!(
                    "{key}: only a source with batch = \"json:/...\" reads parts inside items; without batch, use {}",
                    if key == "item_key" { "key" } else { "type" }
                ));
            }
        }
        if rs.empty_batch.is_some() && !own_batch {
            return Err(
                "empty_batch: only a source whose deliveries are batches (batch = \"json:/...\") takes this key"
                    .to_string(),
            );
        }
    } else {
        if rs.key.is_some() {
            return Err(
                "key: with batch, item_key takes the place of key (its parts are read inside each item)"
                    .to_string(),
            );
        }
        if rs.event_type.is_some() {
            return Err(
                "type: with batch, item_type takes the place of type (it is read inside each item)"
                    .to_string(),
            );
        }
        rs.key = Some(rs.item_key.take().ok_or(
            "item_key: with batch, name the parts that identify an item, e.g. item_key = [\"json:/id\"]",
        )?);
        rs.event_type = rs.item_type.take();
    }
    let empty_batch = match rs.empty_batch.as_deref() {
        None | Some("ack") => EmptyBatch::Ack,
        Some("reject") => EmptyBatch::Reject,
        Some(other) => {
            return Err(format!(
                "empty_batch: expected ack or reject, got {other:?}"
            ));
        }
    };
    let answer = match rs.answer.as_deref() {
        None | Some("json") => Answer::Json,
        Some("empty") => Answer::Empty,
        Some(other) => return Err(format!("answer: expected json or empty, got {other:?}")),
    };
    let own_answer = kind
        .preset()
        .is_some_and(|p| p.ack != super::presets::Ack::Json);
    if answer == Answer::Empty && own_answer {
        return Err(format!(
            "answer: kind \"{}\" answers as its provider requires",
            kind.name()
        ));
    }
    Ok(Shape {
        batch_items,
        empty_batch,
        answer,
    })
}

/// `batch = "json:/events"`: the pointer (`json:` alone: the body is the array).
fn batch_pointer(spec: &str) -> Result<String, String> {
    match spec.strip_prefix("json:") {
        Some(pointer) if pointer.is_empty() || pointer.starts_with('/') => Ok(pointer.to_string()),
        _ => Err(format!(
            "batch: {spec:?} is not json:/pointer (e.g. \"json:/events\", or \"json:\" for a body that is an array)"
        )),
    }
}

/// A configured secret the kind cannot use: `basic` takes `user:password`.
pub(super) fn check_secret(kind: Kind, secret: &str) -> Result<(), String> {
    if kind == Kind::Basic && !secret.contains(':') {
        return Err(
            "kind \"basic\" takes user:password (the user name, a colon, the password)".to_string(),
        );
    }
    Ok(())
}

/// Kind `basic`: `Authorization: Basic base64(user:password)`.
pub(super) fn basic_scheme() -> Scheme {
    Scheme::Rule {
        kind: "basic",
        rule: Box::new(SignedRule {
            alg: Alg::Token,
            encoding: Encoding::Base64,
            message: Vec::new(),
            carrier: Carrier::Header {
                name: "Authorization".to_string(),
                prefix: "Basic ".to_string(),
                list: None,
            },
            timestamp: None,
            secret_encoding: SecretEncoding::Text,
            secret_nfkd: false,
            secret_prefixes: &[],
            escaped_body: false,
            require: Vec::new(),
            strict: false,
            summary: None,
        }),
    }
}

/// Kind `token`: `header` holds `prefix` and one of the secrets.
pub(super) fn token_scheme(rs: &RawSource) -> Result<Scheme, String> {
    let header = header_of(rs, "token")?;
    // A token's prefix may end in a blank (`Bearer `): the token follows it.
    let prefix = rs.prefix.clone().unwrap_or_default();
    if prefix.starts_with(' ') || !prefix.bytes().all(|b| b.is_ascii_graphic() || b == b' ') {
        return Err(format!(
            "prefix: {prefix:?} must be visible ASCII, blanks only after the first character, e.g. \"Bearer \""
        ));
    }
    Ok(Scheme::Rule {
        kind: "token",
        rule: Box::new(SignedRule {
            alg: Alg::Token,
            encoding: Encoding::Text,
            message: Vec::new(),
            carrier: Carrier::Header {
                name: header,
                prefix,
                list: None,
            },
            timestamp: None,
            secret_encoding: SecretEncoding::Text,
            secret_nfkd: false,
            secret_prefixes: &[],
            escaped_body: false,
            require: Vec::new(),
            strict: false,
            summary: None,
        }),
    })
}

/// Kind `hmac`: the plain HMAC of the body in one header, or with any of
/// `template`, an asymmetric `algorithm`, `base64url`, `secret_encoding`
/// or `secret_normalize`, a rule of the engine.
pub(super) fn hmac_scheme(rs: &RawSource) -> Result<Scheme, String> {
    let header = header_of(rs, "hmac")?;
    let alg = match rs.algorithm.as_deref().unwrap_or("sha256") {
        "sha1" => Alg::Hmac(HmacAlgorithm::Sha1),
        "sha256" => Alg::Hmac(HmacAlgorithm::Sha256),
        "sha512" => Alg::Hmac(HmacAlgorithm::Sha512),
        "ed25519" => Alg::Ed25519,
        "ecdsa-p256" => Alg::EcdsaP256,
        other => {
            return Err(format!(
                "algorithm: expected sha1, sha256, sha512, ed25519 or ecdsa-p256, got {other:?}"
            ));
        }
    };
    let encoding = match rs.encoding.as_deref().unwrap_or("hex") {
        "hex" => Encoding::Hex,
        "base64" => Encoding::Base64,
        "base64url" => Encoding::Base64Url,
        other => {
            return Err(format!(
                "encoding: expected hex, base64 or base64url, got {other:?}"
            ));
        }
    };
    let prefix = prefix_of(rs)?;
    let asymmetric = matches!(alg, Alg::Ed25519 | Alg::EcdsaP256);
    let secret_encoding = match rs.secret_encoding.as_deref() {
        Some(_) if asymmetric => {
            return Err(
                "secret_encoding: an ed25519 or ecdsa-p256 public key is read as base64, hex or PEM by itself; remove secret_encoding"
                    .to_string(),
            );
        }
        None | Some("text") => SecretEncoding::Text,
        Some("base64") => SecretEncoding::Base64,
        Some("hex") => SecretEncoding::Hex,
        Some(other) => {
            return Err(format!(
                "secret_encoding: expected text, base64 or hex, got {other:?}"
            ));
        }
    };
    let secret_nfkd = match rs.secret_normalize.as_deref() {
        Some(_) if asymmetric => {
            return Err(
                "secret_normalize: an ed25519 or ecdsa-p256 public key is not normalised; only a shared secret is"
                    .to_string(),
            );
        }
        None => false,
        Some("nfkd") => true,
        Some(other) => return Err(format!("secret_normalize: expected nfkd, got {other:?}")),
    };
    let plain = rs.template.is_none()
        && rs.timestamp_header.is_none()
        && encoding != Encoding::Base64Url
        && secret_encoding == SecretEncoding::Text
        && !secret_nfkd;
    if let (Alg::Hmac(algorithm), true) = (alg, plain) {
        return Ok(Scheme::Hmac(HmacParams {
            header,
            algorithm,
            encoding,
            prefix,
        }));
    }
    let (message, timestamp) = template_of(rs)?;
    Ok(Scheme::Rule {
        kind: "hmac",
        rule: Box::new(SignedRule {
            alg,
            encoding,
            message,
            carrier: Carrier::Header {
                name: header,
                prefix,
                list: None,
            },
            timestamp,
            secret_encoding,
            secret_nfkd,
            secret_prefixes: &[],
            escaped_body: false,
            require: Vec::new(),
            strict: false,
            summary: None,
        }),
    })
}

/// `header`: required, a valid header name.
fn header_of(rs: &RawSource, kind: &str) -> Result<String, String> {
    let header = rs
        .header
        .clone()
        .filter(|h| !h.trim().is_empty())
        .ok_or_else(|| format!("header: kind \"{kind}\" needs the name of the header"))?;
    let is_token_char = |b: u8| b.is_ascii_graphic() && !b"\"(),/:;<=>?@[\\]{}".contains(&b);
    if !header.bytes().all(is_token_char) {
        return Err(format!("header: {header:?} is not a valid header name"));
    }
    Ok(header)
}

/// `prefix`: visible ASCII without spaces (header values are trimmed, so
/// a prefix with blanks could never match).
fn prefix_of(rs: &RawSource) -> Result<String, String> {
    let prefix = rs.prefix.clone().unwrap_or_default();
    if !prefix.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!(
            "prefix: {prefix:?} must be visible ASCII without spaces, e.g. \"sha256=\""
        ));
    }
    Ok(prefix)
}

/// The signed content of `template` (default `{body}`): `{body}`,
/// `{timestamp}` (from `timestamp_header`, checked against `tolerance`),
/// `{url}` (`public_url`), `{method}`, `{header:Name}` and literal text.
fn template_of(rs: &RawSource) -> Result<(Vec<Piece>, Option<Timestamp>), String> {
    let template = rs.template.as_deref().unwrap_or("{body}");
    let mut message = Vec::new();
    let mut rest = template;
    while !rest.is_empty() {
        match rest.find('{') {
            Some(0) => {
                let end = rest
                    .find('}')
                    .ok_or_else(|| format!("template: {template:?} has a {{ without its }}"))?;
                let name = &rest[1..end];
                message.push(match name {
                    "body" => Piece::Body,
                    "timestamp" => Piece::Timestamp,
                    "url" => Piece::Url,
                    "method" => Piece::Method,
                    other => match other.strip_prefix("header:") {
                        Some(h) if !h.is_empty() => Piece::Header(h.to_string()),
                        _ => {
                            return Err(format!(
                                "template: unknown placeholder {{{other}}}; use {{body}}, {{timestamp}}, {{url}}, {{method}} or {{header:Name}}"
                            ));
                        }
                    },
                });
                rest = &rest[end + 1..];
            }
            Some(i) => {
                message.push(Piece::Text(rest[..i].to_string()));
                rest = &rest[i..];
            }
            None => {
                message.push(Piece::Text(rest.to_string()));
                rest = "";
            }
        }
    }
    if !message.contains(&Piece::Body) {
        return Err(format!("template: {template:?} does not sign {{body}}"));
    }
    let format: TimeFormat = match &rs.timestamp_format {
        Some(f) => f.parse().map_err(|e| format!("timestamp_format: {e}"))?,
        None => TimeFormat::Unix,
    };
    let timestamp = match (&rs.timestamp_header, message.contains(&Piece::Timestamp)) {
        (Some(h), true) => Some(Timestamp {
            from: TimeFrom::Header(h.clone()),
            format,
            window: Window::Both,
        }),
        (None, true) => {
            return Err(
                "timestamp_header: the template signs {timestamp}; name the header it comes in"
                    .to_string(),
            );
        }
        (Some(_), false) => {
            return Err("timestamp_header: the template does not sign {timestamp}, so a timestamp header would not be verified".to_string());
        }
        (None, false) => None,
    };
    Ok((message, timestamp))
}

#[cfg(test)]
mod tests {
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD as B64;
    use hmac::{KeyInit, Mac};

    use crate::config::{Config, ConfigError, Source};
    use crate::receive::key::{Input, Json};
    use crate::verify::{Request, VerifyError};

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(
            &format!("database = \"unused.db\"\n{text}"),
            "test.toml",
            std::path::Path::new("/tmp"),
            None,
        )
    }

    fn error_of(text: &str) -> String {
        match parse(text) {
            Ok(_) => panic!("accepted:\n{text}"),
            Err(e) => e.to_string(),
        }
    }

    fn hmac256(key: &[u8], message: &[u8]) -> Vec<u8> {
        let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(key).expect("any key");
        mac.update(message);
        mac.finalize().into_bytes().to_vec()
    }

    fn hmac512(key: &[u8], message: &[u8]) -> Vec<u8> {
        let mut mac = hmac::Hmac::<sha2::Sha512>::new_from_slice(key).expect("any key");
        mac.update(message);
        mac.finalize().into_bytes().to_vec()
    }

    fn ed25519() -> ed25519_dalek::SigningKey {
        ed25519_dalek::SigningKey::from_bytes(&[0x11; 32])
    }

    fn p256() -> p256::ecdsa::SigningKey {
        p256::ecdsa::SigningKey::from_slice(&[0x22; 32]).expect("a P-256 scalar")
    }

    fn source(text: &str) -> Source {
        parse(text)
            .unwrap_or_else(|e| panic!("{e}"))
            .sources
            .remove(0)
    }

    const HMAC: &str = "[sources.s]\nkind = \"hmac\"\nheader = \"X-Sig\"\nkey = [\"json:/id\"]\n";

    #[test]
    fn bad_input_is_a_config_error_naming_the_key() {
        let ed_pub = B64.encode(ed25519().verifying_key().to_bytes());
        let cases: Vec<(String, &str)> = vec![
            (
                format!("{HMAC}algorithm = \"ed25519\"\nsecrets = [\"not-a-public-key\"]"),
                "secrets: secret 0: not an Ed25519 public key",
            ),
            (
                format!("{HMAC}algorithm = \"ed25519\"\nsecrets = [\"{}\"]", "ab".repeat(31)),
                "secrets: secret 0: not an Ed25519 public key",
            ),
            (
                format!("{HMAC}algorithm = \"ecdsa-p256\"\nsecrets = [\"{ed_pub}\"]"),
                "secrets: secret 0: not a P-256 public key",
            ),
            (
                format!(
                    "{HMAC}algorithm = \"ed25519\"\nsecret_normalize = \"nfkd\"\nsecrets = [\"{ed_pub}\"]"
                ),
                "secret_normalize: ",
            ),
            (
                format!(
                    "{HMAC}algorithm = \"ed25519\"\nsecret_encoding = \"hex\"\nsecrets = [\"{ed_pub}\"]"
                ),
                "secret_encoding: ",
            ),
            (
                format!("{HMAC}secret_encoding = \"base64\"\nsecrets = [\"%%%\"]"),
                "secrets: secret 0: secret_encoding is base64",
            ),
            (
                format!("{HMAC}secret_normalize = \"nfc\"\nsecrets = [\"s\"]"),
                "secret_normalize: expected nfkd",
            ),
            (
                format!("{HMAC}algorithm = \"rsa\"\nsecrets = [\"s\"]"),
                "algorithm: expected sha1, sha256, sha512, ed25519 or ecdsa-p256",
            ),
            (
                format!("{HMAC}encoding = \"base32\"\nsecrets = [\"s\"]"),
                "encoding: expected hex, base64 or base64url",
            ),
            (
                "[sources.s]\nkind = \"hmac\"\nheader = \"X-Sig\"\nsecrets = [\"s\"]\nitem_key = [\"json:/id\"]".to_string(),
                "item_key: only a source with batch",
            ),
            (
                format!("{HMAC}secrets = [\"s\"]\nitem_type = \"json:/t\""),
                "item_type: only a source with batch",
            ),
            (
                format!("{HMAC}secrets = [\"s\"]\nempty_batch = \"ack\""),
                "empty_batch: only a source whose deliveries are batches",
            ),
            (
                "[sources.s]\nkind = \"hmac\"\nheader = \"X-Sig\"\nsecrets = [\"s\"]\nbatch = \"json:/events\"".to_string(),
                "item_key: with batch, name the parts",
            ),
            (
                format!("{HMAC}secrets = [\"s\"]\nbatch = \"json:/events\"\nitem_key = [\"json:/id\"]"),
                "key: with batch, item_key takes the place of key",
            ),
            (
                "[sources.s]\nkind = \"hmac\"\nheader = \"X-Sig\"\nsecrets = [\"s\"]\nbatch = \"/events\"\nitem_key = [\"json:/id\"]".to_string(),
                "batch: \"/events\" is not json:/pointer",
            ),
            (
                "[sources.s]\nkind = \"gocardless\"\nsecrets = [\"s\"]\nbatch = \"json:/events\"".to_string(),
                "batch: kind \"gocardless\" has its own batch shape",
            ),
            (
                format!("{HMAC}secrets = [\"s\"]\nanswer = \"none\""),
                "answer: expected json or empty",
            ),
            (
                "[sources.s]\nkind = \"adyen\"\nsecrets = [\"00\"]\nanswer = \"empty\"".to_string(),
                "answer: kind \"adyen\" answers as its provider requires",
            ),
            (
                "[sources.s]\nkind = \"basic\"\nsecrets = [\"user:pw\", \"hunter2-no-colon\"]\nkey = [\"json:/id\"]".to_string(),
                "secrets[1]: kind \"basic\" takes user:password",
            ),
            (
                "[sources.s]\nkind = \"basic\"\nsecrets = [\"u:p\"]\nheader = \"X\"\nkey = [\"json:/id\"]".to_string(),
                "header: only sources of kind \"hmac\" take this key",
            ),
            (
                "[sources.s]\nkind = \"token\"\nsecrets = [\"t\"]\nkey = [\"json:/id\"]".to_string(),
                "header: kind \"token\" needs the name of the header",
            ),
            (
                "[sources.s]\nkind = \"token\"\nheader = \"X-T\"\nsecrets = [\"t\"]\nalgorithm = \"sha1\"\nkey = [\"json:/id\"]".to_string(),
                "algorithm: only sources of kind \"hmac\" take this key",
            ),
            (
                "[sources.s]\nkind = \"stripe\"\nsecrets = [\"s\"]\nsecret_normalize = \"nfkd\"".to_string(),
                "secret_normalize: only sources of kind \"hmac\" take this key",
            ),
        ];
        for (text, expected) in cases {
            let e = error_of(&text);
            assert!(
                e.contains(expected),
                "{e}\n  expected {expected:?} for\n{text}"
            );
            assert!(!e.contains("hunter2"), "a secret in an error: {e}");
        }
    }

    /// Ed25519 and P-256 public keys read as base64, hex or PEM; what one
    /// of them verifies, the others do, and `sign` with the private key
    /// makes what they verify.
    #[test]
    fn public_keys_in_every_spelling_verify() {
        use ed25519_dalek::pkcs8::EncodePublicKey as _;
        let ed = ed25519().verifying_key();
        let ed_pem = ed
            .to_public_key_pem(ed25519_dalek::pkcs8::spki::der::pem::LineEnding::LF)
            .expect("pem");
        let ed_der = ed.to_public_key_der().expect("der");
        let ec = *p256().verifying_key();
        let ec_pem = ec
            .to_public_key_pem(p256::pkcs8::LineEnding::LF)
            .expect("pem");
        let ec_der = ec.to_public_key_der().expect("der");
        let ec_point = ec.to_sec1_point(false);
        let spellings = [
            ("ed25519", B64.encode(ed.to_bytes())),
            ("ed25519", hex::encode(ed.to_bytes())),
            ("ed25519", ed_pem),
            ("ed25519", B64.encode(ed_der.as_bytes())),
            ("ecdsa-p256", ec_pem),
            ("ecdsa-p256", B64.encode(ec_der.as_bytes())),
            ("ecdsa-p256", hex::encode(ec_point.as_bytes())),
        ];
        let body = br#"{"id":"evt_1"}"#;
        let ed_sig = {
            use ed25519_dalek::Signer as _;
            B64.encode(ed25519().sign(body).to_bytes())
        };
        let ec_sig = {
            use p256::ecdsa::signature::Signer as _;
            let sig: p256::ecdsa::Signature = p256().sign(body);
            B64.encode(sig.to_der().as_bytes())
        };
        for (alg, key) in spellings {
            let s = source(&format!(
                "{HMAC}algorithm = \"{alg}\"\nencoding = \"base64\"\nsecrets = [{}]",
                serde_json::to_string(&key).expect("a string")
            ));
            let sig = if alg == "ed25519" { &ed_sig } else { &ec_sig };
            let headers = vec![("X-Sig".to_string(), sig.clone())];
            let rq = Request::post(&headers, body);
            assert!(s.verifier.verify_request(&rq, 0).is_ok(), "{alg} {key}");
            let tampered = Request::post(&headers, br#"{"id":"evt_2"}"#);
            assert_eq!(
                s.verifier.verify_request(&tampered, 0),
                Err(VerifyError::NoSignatureMatched)
            );
        }
    }

    #[test]
    fn shared_secrets_decode_and_normalise_as_configured() {
        let body = b"{\"id\":\"1\"}";
        let raw: &[u8] = b"\x00\xffkey";
        let cases = [
            (
                format!(
                    "secret_encoding = \"base64\"\nsecrets = [\"{}\"]",
                    B64.encode(raw)
                ),
                raw.to_vec(),
            ),
            (
                format!(
                    "secret_encoding = \"hex\"\nsecrets = [\"{}\"]",
                    hex::encode(raw)
                ),
                raw.to_vec(),
            ),
            (
                "secret_normalize = \"nfkd\"\nsecrets = [\"\u{fb01}\u{c5}\"]".to_string(),
                "fiA\u{30a}".as_bytes().to_vec(),
            ),
            (
                "encoding = \"base64url\"\nsecrets = [\"k\"]".to_string(),
                b"k".to_vec(),
            ),
        ];
        for (extra, key) in cases {
            let s = source(&format!("{HMAC}{extra}"));
            let tag = hmac256(&key, body);
            let encoded = if extra.contains("base64url") {
                base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&tag)
            } else {
                hex::encode(&tag)
            };
            let headers = vec![("X-Sig".to_string(), encoded)];
            assert!(
                s.verifier
                    .verify_request(&Request::post(&headers, body), 0)
                    .is_ok(),
                "{extra}"
            );
            // The secret's text as the key (not decoded, not normalised) fails.
            let secret_text = extra
                .split('"')
                .nth(extra.matches('"').count() - 1)
                .unwrap_or("");
            if key != secret_text.as_bytes() {
                let wrong = vec![(
                    "X-Sig".to_string(),
                    hex::encode(hmac256(secret_text.as_bytes(), body)),
                )];
                assert!(
                    s.verifier
                        .verify_request(&Request::post(&wrong, body), 0)
                        .is_err()
                );
            }
            // `send` signs with the same key bytes.
            let signed = s
                .verifier
                .sign_request(&Request::post(&[], body), 0, "", None)
                .expect("signs");
            assert_eq!(signed, headers, "{extra}");
        }
    }

    #[test]
    fn basic_and_token_compare_whole_values() {
        let basic = source(
            "[sources.s]\nkind = \"basic\"\nsecrets = [\"u:new\", \"u:old\"]\nkey = [\"json:/id\"]",
        );
        let auth = |pair: &str| {
            vec![(
                "Authorization".to_string(),
                format!("Basic {}", B64.encode(pair)),
            )]
        };
        let verdict = basic
            .verifier
            .verify_request(&Request::post(&auth("u:old"), b"{}"), 0);
        assert_eq!(verdict.map(|v| v.secret_index), Ok(Some(1)));
        for bad in ["u:ol", "u:oldd", "u:", "", "v:old", "u:new\0"] {
            assert!(
                basic
                    .verifier
                    .verify_request(&Request::post(&auth(bad), b"{}"), 0)
                    .is_err(),
                "{bad:?}"
            );
        }
        let bearer = vec![("Authorization".to_string(), "Bearer dTpvbGQ=".to_string())];
        assert!(
            basic
                .verifier
                .verify_request(&Request::post(&bearer, b"{}"), 0)
                .is_err()
        );
        let bearer = source(
            "[sources.s]\nkind = \"token\"\nheader = \"Authorization\"\nprefix = \"Bearer \"\nsecrets = [\"tok-1\"]\nkey = [\"json:/id\"]",
        );
        let auth = |v: &str| vec![("Authorization".to_string(), v.to_string())];
        assert!(
            bearer
                .verifier
                .verify_request(&Request::post(&auth("Bearer tok-1"), b"{}"), 0)
                .is_ok()
        );
        assert!(
            bearer
                .verifier
                .verify_request(&Request::post(&auth("bearer tok-1"), b"{}"), 0)
                .is_ok()
        );
        for bad in ["tok-1", "Bearer tok-2", "Bearer  tok-1", "Basic tok-1"] {
            assert!(
                bearer
                    .verifier
                    .verify_request(&Request::post(&auth(bad), b"{}"), 0)
                    .is_err(),
                "{bad:?}"
            );
        }
        assert!(
            error_of("[sources.s]\nkind = \"token\"\nheader = \"X\"\nprefix = \" x\"\nsecrets = [\"t\"]\nkey = [\"json:/id\"]")
                .contains("prefix: ")
        );
        let token = source(
            "[sources.s]\nkind = \"token\"\nheader = \"verif-hash\"\nsecrets = [\"flw-1\"]\nkey = [\"json:/id\"]",
        );
        let sent = |v: &str| vec![("verif-hash".to_string(), v.to_string())];
        assert!(
            token
                .verifier
                .verify_request(&Request::post(&sent("flw-1"), b"{}"), 0)
                .is_ok()
        );
        for bad in ["flw-", "flw-12", "FLW-1", "x"] {
            assert_eq!(
                token
                    .verifier
                    .verify_request(&Request::post(&sent(bad), b"{}"), 0),
                Err(VerifyError::NoSignatureMatched),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn check_prints_each_generic_rule_on_one_line() {
        let ed_pub = B64.encode(ed25519().verifying_key().to_bytes());
        let cases = [
            (
                "[sources.s]\nkind = \"basic\"\nsecrets = [\"u:p\"]\nkey = [\"json:/id\"]".to_string(),
                "Authorization Basic: user:password, one of the secrets, compared in constant time",
            ),
            (
                "[sources.s]\nkind = \"token\"\nheader = \"verif-hash\"\nsecrets = [\"t\"]\nkey = [\"json:/id\"]".to_string(),
                "verif-hash: one of the secrets, compared in constant time",
            ),
            (
                format!(
                    "{HMAC}algorithm = \"ed25519\"\nencoding = \"base64\"\nsecrets = [\"{ed_pub}\"]\ntemplate = \"{{timestamp}}|{{body}}\"\ntimestamp_header = \"T\""
                ),
                "X-Sig: base64 Ed25519 signature (public key) of timestamp + \"|\" + body; timestamp (unix seconds) within tolerance",
            ),
            (
                format!("{HMAC}secrets = [\"s\"]\nprefix = \"hmac-sha256-hex=\"\nsecret_normalize = \"nfkd\""),
                "X-Sig hmac-sha256-hex=: hex HMAC-SHA256 of body; secret NFKD-normalised",
            ),
            (
                format!("{HMAC}secrets = [\"AA==\"]\nencoding = \"base64url\"\nsecret_encoding = \"base64\""),
                "X-Sig: base64url HMAC-SHA256 of body; secret base64-decoded",
            ),
        ];
        for (text, line) in cases {
            assert_eq!(source(&text).verifier.scheme().describe(), line);
        }
    }

    // ---- the worked configs of docs/configuration.md

    const DOCS: &str = include_str!("../../docs/configuration.md");

    /// The TOML blocks of "Configuring a provider by hand", by source name.
    fn worked_configs() -> Vec<(String, String)> {
        let start = DOCS
            .find("### Configuring a provider by hand")
            .expect("the section");
        let section = &DOCS[start..];
        let end = section[4..].find("\n## ").map_or(section.len(), |i| i + 4);
        section[..end]
            .split("```toml\n")
            .skip(1)
            .map(|b| {
                let block = b.split("```").next().unwrap_or_default();
                let name = block
                    .lines()
                    .next()
                    .and_then(|l| l.strip_prefix("[sources."))
                    .and_then(|l| l.split(']').next())
                    .unwrap_or_default()
                    .to_string();
                (name, block.to_string())
            })
            .collect()
    }

    /// Test values for the secrets the docs read from the environment.
    fn with_test_secrets(block: &str) -> String {
        let telnyx = B64.encode(ed25519().verifying_key().to_bytes());
        block
            .replace("env:PAYSTACK_SECRET_KEY", "sk_test_paystack")
            .replace("env:EASYPOST_WEBHOOK_SECRET", "\u{fb01}le-secret")
            .replace("env:CHARGEBEE_WEBHOOK_AUTH", "cb_user:cb-pass")
            .replace("env:XERO_WEBHOOK_KEY", "xero-key")
            .replace("env:TELNYX_PUBLIC_KEY", &telnyx)
    }

    /// A request as each provider documents signing it, written here from
    /// their docs (not with idemhook's signer), and the event ids in it.
    fn provider_request(name: &str, now: i64) -> (Vec<(String, String)>, Vec<u8>) {
        let h = |n: &str, v: String| (n.to_string(), v);
        match name {
            "paystack" => {
                let body = br#"{"event":"charge.success","data":{"id":302961,"reference":"qTPrJoy9Bx","amount":10000}}"#.to_vec();
                let sig = hex::encode(hmac512(b"sk_test_paystack", &body));
                (vec![h("x-paystack-signature", sig)], body)
            }
            "easypost" => {
                let body = br#"{"id":"evt_1a2b","object":"Event","description":"tracker.updated"}"#
                    .to_vec();
                // EasyPost's validate_webhook: NFKD("ﬁle-secret") is "file-secret".
                let sig = hex::encode(hmac256(b"file-secret", &body));
                (
                    vec![h("X-Hmac-Signature", format!("hmac-sha256-hex={sig}"))],
                    body,
                )
            }
            "chargebee" => {
                let body =
                    br#"{"id":"ev_16BHbhF4s42tO2lK","event_type":"subscription_created"}"#.to_vec();
                (
                    vec![h(
                        "Authorization",
                        format!("Basic {}", B64.encode("cb_user:cb-pass")),
                    )],
                    body,
                )
            }
            "xero" => {
                let body = br#"{"events":[{"resourceUrl":"https://api.xero.com/api.xro/2.0/Invoices/i-1","resourceId":"i-1","eventDateUtc":"2026-01-01T10:00:00.000","eventType":"UPDATE","eventCategory":"INVOICE","tenantId":"t-1","tenantType":"ORGANISATION"},{"resourceUrl":"https://api.xero.com/api.xro/2.0/Contacts/c-1","resourceId":"c-1","eventDateUtc":"2026-01-01T10:00:01.000","eventType":"CREATE","eventCategory":"CONTACT","tenantId":"t-1","tenantType":"ORGANISATION"}],"firstEventSequence":1,"lastEventSequence":2,"entropy":"S0M3"}"#.to_vec();
                let sig = B64.encode(hmac256(b"xero-key", &body));
                (vec![h("x-xero-signature", sig)], body)
            }
            "telnyx" => {
                use ed25519_dalek::Signer as _;
                let body = br#"{"data":{"event_type":"call.initiated","id":"0ccc7b54-4df3-4bca-a65a-3da1ecc777f0","record_type":"event"}}"#.to_vec();
                let mut signed = format!("{now}|").into_bytes();
                signed.extend_from_slice(&body);
                let sig = B64.encode(ed25519().sign(&signed).to_bytes());
                (
                    vec![
                        h("telnyx-signature-ed25519", sig),
                        h("telnyx-timestamp", now.to_string()),
                    ],
                    body,
                )
            }
            other => panic!("no worked config expected for {other}"),
        }
    }

    #[test]
    fn the_worked_configs_in_the_docs_verify_what_each_provider_sends() {
        let configs = worked_configs();
        let names: Vec<&str> = configs.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            ["paystack", "easypost", "chargebee", "xero", "telnyx"]
        );
        let now = 1_764_460_800;
        for (name, block) in &configs {
            let s = source(&with_test_secrets(block));
            let (headers, body) = provider_request(name, now);
            let rq = Request::post(&headers, &body);
            assert!(s.verifier.verify_request(&rq, now).is_ok(), "{name}");
            // Tampered (or, for Basic, another password): refused.
            let mut tampered = body.clone();
            tampered.insert(1, b' ');
            let forged: Vec<(String, String)> = if *name == "chargebee" {
                vec![(
                    "Authorization".into(),
                    format!("Basic {}", B64.encode("cb_user:x")),
                )]
            } else {
                headers.clone()
            };
            assert!(
                s.verifier
                    .verify_request(&Request::post(&forged, &tampered), now)
                    .is_err(),
                "{name}: tampered"
            );
            // idemhook's own signer (`send`) agrees with the provider's.
            let private = if *name == "telnyx" {
                use ed25519_dalek::pkcs8::EncodePrivateKey as _;
                Some(
                    ed25519()
                        .to_pkcs8_pem(ed25519_dalek::pkcs8::spki::der::pem::LineEnding::LF)
                        .expect("pem")
                        .to_string(),
                )
            } else {
                None
            };
            let mut ours = s
                .verifier
                .sign_request(&Request::post(&[], &body), now, "", private.as_deref())
                .expect("signs");
            let mut theirs = headers.clone();
            ours.sort();
            theirs.sort();
            assert_eq!(ours, theirs, "{name}");
            // The event ids the key rule reads: one per item of a batch.
            let json: serde_json::Value = serde_json::from_slice(&body).expect("json");
            let items: Vec<serde_json::Value> = match s.batch() {
                Some(b) => json
                    .pointer(b.items)
                    .and_then(|v| v.as_array())
                    .cloned()
                    .expect("an array"),
                None => vec![json],
            };
            let mut ids = Vec::new();
            for item in &items {
                let text = item.to_string();
                let input = Input {
                    headers: &headers,
                    json: Some(Json::Parsed(item)),
                    form: None,
                    body: text.as_bytes(),
                };
                ids.push(
                    s.key
                        .extract(&input)
                        .unwrap_or_else(|e| panic!("{name}: {e}")),
                );
                assert!(s.type_of(&input).is_some(), "{name}: no type");
            }
            let expected = match name.as_str() {
                "easypost" => vec!["evt_1a2b".to_string()],
                "chargebee" => vec!["ev_16BHbhF4s42tO2lK".to_string()],
                "telnyx" => vec!["0ccc7b54-4df3-4bca-a65a-3da1ecc777f0".to_string()],
                _ => ids.clone(),
            };
            assert_eq!(ids, expected, "{name}");
            let unique: std::collections::BTreeSet<&String> = ids.iter().collect();
            assert_eq!(unique.len(), items.len(), "{name}: items share a key");
        }
        // Telnyx's window: five minutes.
        let (name, block) = &configs[4];
        let s = source(&with_test_secrets(block));
        let (headers, body) = provider_request(name, now - 360);
        assert!(matches!(
            s.verifier
                .verify_request(&Request::post(&headers, &body), now),
            Err(VerifyError::TimestampTooOld { .. })
        ));
        // Xero's intent to receive is acknowledged with an empty body.
        let xero = source(&with_test_secrets(&configs[3].1));
        assert_eq!(xero.answer, super::Answer::Empty);
        assert_eq!(xero.empty_batch, super::EmptyBatch::Ack);
    }
}
