//! Webhook signature verification: the rule engine (`rule.rs`, with the
//! direct paths of `stamped.rs` and `versioned.rs`) that verifies the
//! providers whose schemes are data, one file per provider whose scheme data cannot say (`code/`),
//! the generic kinds, and the pieces they share (keys, HMAC, header
//! reading, timestamp tolerance) here.
//!
//! This module owns turning configured secrets into keys, checking a request's
//! signature headers against its raw body, and producing those headers for
//! `idemhook send`. It does no IO and reads no clock: `now` is a parameter.
//! It does not decide what an unsigned request means (the caller applies
//! `allow_unsigned`), and it does not extract event ids or types.
//!
//! The module is self-contained: outside itself it uses only `time.rs`
//! (dates in the signed formats); its `headers.rs` (reading a request's
//! headers) serves the key extractor, the receiver and the admin API too;
//! its tests build the providers' schemes from their rows
//! (`config::presets`).
//!
//! Invariants: comparisons of signatures are constant-time
//! (`Mac::verify_slice`, or ed25519 verification); no error message and no
//! `Debug` output contains a secret or an expected signature; nothing on an
//! input-driven path panics.

pub mod code;
mod generic;
pub mod headers;
mod hmac_generic;
#[cfg(test)]
mod row_tests;
pub mod rule;
mod same;
mod stamped;
#[cfg(test)]
mod test_support;
mod versioned;
pub use same::same_secret;

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use base64::Engine as _;
use hmac::{Hmac, KeyInit, Mac};

use headers::header_values;

/// Longest signature, timestamp or id header value that is parsed at all.
pub const MAX_HEADER_LEN: usize = 8 * 1024;

/// Most entries (`k=v` parts, space-separated signatures) parsed from one header.
pub const MAX_ENTRIES: usize = 32;

/// A secret from config. `Debug` and `Display` print `[REDACTED]`.
#[derive(Clone)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: String) -> Secret {
        Secret(value)
    }

    /// The secret itself. Call sites are the places a secret can leak: keep them few.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[REDACTED]")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[REDACTED]")
    }
}

/// Hash function of an HMAC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HmacAlgorithm {
    Sha1,
    Sha256,
    Sha512,
}

impl FromStr for HmacAlgorithm {
    type Err = String;

    /// The config spelling: `sha1`, `sha256` or `sha512`.
    fn from_str(name: &str) -> Result<Self, Self::Err> {
        match name {
            "sha1" => Ok(HmacAlgorithm::Sha1),
            "sha256" => Ok(HmacAlgorithm::Sha256),
            "sha512" => Ok(HmacAlgorithm::Sha512),
            other => Err(format!(
                "unknown algorithm {other:?}, expected sha1, sha256 or sha512"
            )),
        }
    }
}

/// How a signature is written into its header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// Lowercase when signing; either case accepted when verifying.
    Hex,
    /// Standard alphabet with padding, both ways.
    Base64,
    /// URL-safe alphabet (`-` and `_`); padding optional when verifying,
    /// none when signing.
    Base64Url,
    /// The value as sent: a shared secret in a header, not a signature.
    Text,
}

impl FromStr for Encoding {
    type Err = String;

    /// The config spelling: `hex` or `base64`.
    fn from_str(name: &str) -> Result<Self, Self::Err> {
        match name {
            "hex" => Ok(Encoding::Hex),
            "base64" => Ok(Encoding::Base64),
            other => Err(format!(
                "unknown encoding {other:?}, expected hex or base64"
            )),
        }
    }
}

fn encoding_name(encoding: Encoding) -> &'static str {
    match encoding {
        Encoding::Hex => "hex",
        Encoding::Base64 => "base64",
        Encoding::Base64Url => "base64url",
        Encoding::Text => "plain",
    }
}

fn algorithm_name(algorithm: HmacAlgorithm) -> &'static str {
    match algorithm {
        HmacAlgorithm::Sha1 => "SHA1",
        HmacAlgorithm::Sha256 => "SHA256",
        HmacAlgorithm::Sha512 => "SHA512",
    }
}

/// The settings of kind `hmac`: an HMAC of the raw body in one header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HmacParams {
    pub header: String,
    pub algorithm: HmacAlgorithm,
    pub encoding: Encoding,
    /// Stripped before decoding (compared ignoring ASCII case), e.g. `sha256=`; may be empty.
    pub prefix: String,
}

/// What a verifier sees of a request: the method, the raw query (without
/// `?`), the headers as received and the raw body.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    pub method: &'a str,
    pub query: &'a str,
    pub headers: &'a [(String, String)],
    pub body: &'a [u8],
}

impl<'a> Request<'a> {
    /// A POST without a query.
    pub fn post(headers: &'a [(String, String)], body: &'a [u8]) -> Request<'a> {
        Request {
            method: "POST",
            query: "",
            headers,
            body,
        }
    }
}

/// A signature scheme, one per source `kind`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scheme {
    Hmac(HmacParams),
    /// A provider's rule as data (`rule.rs`), or the generic kind's template.
    Rule {
        kind: &'static str,
        rule: Box<rule::SignedRule>,
    },
    /// What data cannot say: a provider's code (`code/`).
    Code(&'static dyn code::Code),
    None,
}

impl Scheme {
    /// The config `kind` that names this scheme.
    pub fn kind(&self) -> &'static str {
        match self {
            Scheme::Hmac(_) => "hmac",
            Scheme::Rule { kind, .. } => kind,
            Scheme::Code(code) => code.kind(),
            Scheme::None => "none",
        }
    }

    /// The rule in one line, for `check`.
    pub fn describe(&self) -> String {
        match self {
            Scheme::Hmac(p) => format!(
                "{}{}: {} HMAC-{} of the body",
                p.header,
                if p.prefix.is_empty() {
                    String::new()
                } else {
                    format!(" {}", p.prefix)
                },
                encoding_name(p.encoding),
                algorithm_name(p.algorithm)
            ),
            Scheme::Rule { kind: "basic", .. } => {
                "Authorization Basic: user:password, one of the secrets, compared in constant time"
                    .into()
            }
            Scheme::Rule {
                kind: "token",
                rule,
            } => format!(
                "{}: one of the secrets, compared in constant time",
                rule.carrier_text()
            ),
            Scheme::Rule { rule, .. } => rule.describe(),
            Scheme::Code(code) => code.describe().into(),
            Scheme::None => "none (unsigned)".into(),
        }
    }

    /// True for a rule that signs a timestamp (which `tolerance` bounds).
    pub fn signs_timestamp(&self) -> bool {
        match self {
            Scheme::Rule { rule, .. } => rule.timestamp.is_some(),
            Scheme::Code(code) => code.signs_timestamp(),
            _ => false,
        }
    }

    /// True when the signature covers the URL the provider called, so the
    /// source needs `public_url`.
    pub fn covers_url(&self) -> bool {
        match self {
            Scheme::Code(code) => code.covers_url(),
            Scheme::Rule { rule, .. } => rule.covers(&rule::Piece::Url),
            _ => false,
        }
    }
}

/// What a successful verification established.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// 0-based index of the secret that matched; `None` only for `Scheme::None`.
    pub secret_index: Option<usize>,
    /// The signed timestamp in unix seconds, for schemes that sign one.
    pub timestamp: Option<i64>,
}

/// Why a request failed verification. Messages are lowercase, have no
/// trailing period, and never contain a secret or an expected signature.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    #[error("missing header {0}")]
    MissingHeader(String),
    /// The scheme's event id header is absent from an otherwise signed request.
    #[error("no event id: missing header {0}")]
    MissingEventId(String),
    /// A signature, timestamp or id header of the scheme was sent more than once.
    #[error("duplicate header {0}")]
    DuplicateHeader(String),
    #[error("malformed header {header}: {reason}")]
    MalformedHeader {
        header: String,
        reason: MalformedReason,
    },
    /// Well-formed, but no signature matched any secret: wrong secret or tampered body.
    #[error("no signature matched")]
    NoSignatureMatched,
    /// As `NoSignatureMatched`, for a scheme that signs the URL too.
    #[error(
        "no signature matched the body and public_url (a wrong secret, or not the URL the provider called)"
    )]
    NoSignatureMatchedUrl,
    #[error("timestamp is {age_secs}s old, beyond the tolerance")]
    TimestampTooOld { age_secs: u64 },
    #[error("timestamp is {ahead_secs}s in the future, beyond the tolerance")]
    TimestampInFuture { ahead_secs: u64 },
    /// The body lacks what the scheme needs from it (Linear's `webhookTimestamp`).
    #[error("invalid body: {0}")]
    InvalidBody(String),
}

impl VerifyError {
    /// True when the request is malformed (HTTP 400) rather than
    /// unauthenticated (401): a duplicated header, a signed request without
    /// its id header, a header value with a NUL byte or invalid UTF-8, and
    /// a correctly signed body that is not what the scheme promises
    /// (invalid JSON for Linear).
    pub fn is_bad_request(&self) -> bool {
        match self {
            VerifyError::DuplicateHeader(_)
            | VerifyError::MissingEventId(_)
            | VerifyError::InvalidBody(_) => true,
            VerifyError::MalformedHeader { reason, .. } => reason.is_bad_request(),
            _ => false,
        }
    }
}

/// What is wrong with a header value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MalformedReason {
    #[error("contains a nul byte")]
    ContainsNul,
    /// For the receiver, which sees header bytes before they become `String`s.
    #[error("is not valid utf-8")]
    NotUtf8,
    #[error("is longer than {max} bytes")]
    TooLong { max: usize },
    #[error("has more than {max} entries")]
    TooManyEntries { max: usize },
    #[error("is empty")]
    Empty,
    #[error("has an entry that is not {0}")]
    BadEntry(&'static str),
    #[error("has more than one {0}")]
    RepeatedField(&'static str),
    #[error("has no timestamp")]
    NoTimestamp,
    #[error("has no signature")]
    NoSignature,
    #[error("does not start with {0:?}")]
    MissingPrefix(String),
    #[error("timestamp is not a number of seconds")]
    BadTimestamp,
    #[error("signature is not hex")]
    BadHex,
    #[error("signature is not base64")]
    BadBase64,
    #[error("is not {0:?}, the only one supported")]
    Unsupported(String),
}

impl MalformedReason {
    fn is_bad_request(&self) -> bool {
        matches!(
            self,
            MalformedReason::ContainsNul | MalformedReason::NotUtf8
        )
    }
}

/// A decoded secret.
#[derive(Clone)]
pub enum Key {
    /// HMAC key bytes: the secret as written, or base64-decoded for `whsec_`.
    Hmac(Vec<u8>),
    /// A Standard Webhooks `whpk_` public key (verifies `v1a` entries), or
    /// Discord's application key: verifies, cannot sign.
    Ed25519(ed25519_dalek::VerifyingKey),
    /// SendGrid's verification key.
    P256(p256::ecdsa::VerifyingKey),
}

/// Verifies (and, for `idemhook send`, produces) one source's signatures.
/// `Debug` shows the scheme, how many keys and the tolerance, never a key.
#[derive(Clone)]
pub struct Verifier {
    scheme: Scheme,
    keys: Vec<Key>,
    tolerance: Duration,
    /// The URL the provider calls, for schemes that sign it.
    public_url: Option<String>,
    /// Secrets a handshake handed over (Asana, Notion), after the configured ones.
    learned: Arc<RwLock<Vec<Key>>>,
}

impl fmt::Debug for Verifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Verifier")
            .field("scheme", &self.scheme)
            .field("keys", &format_args!("[{} REDACTED]", self.keys.len()))
            .field("tolerance", &self.tolerance)
            .field("public_url", &self.public_url)
            .finish()
    }
}

impl Verifier {
    /// Decodes secrets up front (`whsec_`/`whpk_` for Standard). The error is
    /// a human message naming the 0-based secret index and what is wrong, never
    /// the secret. Kind `none` takes zero secrets; every other kind at least one.
    pub fn new(
        scheme: Scheme,
        secrets: Vec<Secret>,
        tolerance: Duration,
    ) -> Result<Verifier, String> {
        if let Scheme::Hmac(params) = &scheme {
            check_header_name(&params.header)?;
        }
        match (&scheme, secrets.len()) {
            (Scheme::None, 0) => {}
            // Asana and Notion hand their secret over in a handshake.
            (
                Scheme::Rule {
                    kind: "asana" | "notion",
                    ..
                },
                0,
            ) => {}
            (Scheme::None, n) => return Err(format!("kind none takes no secrets, got {n}")),
            (scheme, 0) => {
                return Err(format!("kind {} needs at least one secret", scheme.kind()));
            }
            _ => {}
        }
        let keys = secrets
            .iter()
            .enumerate()
            .map(|(index, secret)| {
                decode_key(&scheme, secret.expose()).map_err(|why| format!("secret {index}: {why}"))
            })
            .collect::<Result<Vec<Key>, String>>()?;
        Ok(Verifier {
            scheme,
            keys,
            tolerance,
            public_url: None,
            learned: Arc::default(),
        })
    }

    /// The URL the provider calls (`public_url`), for schemes that sign it.
    pub fn with_public_url(mut self, url: Option<String>) -> Verifier {
        self.public_url = url;
        self
    }

    /// Adds a secret handed over by a handshake (kept in the database by
    /// the caller); it matches after the configured ones.
    pub fn learn(&self, secret: &Secret) -> Result<(), String> {
        let key = decode_key(&self.scheme, secret.expose())?;
        self.learned
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .push(key);
        Ok(())
    }

    /// True when a handshake's secret would be a known one, or there is
    /// none yet (so it may be learned).
    pub fn knows_or_lacks(&self, secret: &str) -> bool {
        self.key_count() == 0 || self.knows(secret)
    }

    /// True when `secret` is one this verifier verifies with.
    pub fn knows(&self, secret: &str) -> bool {
        self.keys_now()
            .iter()
            .any(|k| matches!(k, Key::Hmac(k) if same_secret(secret.as_bytes(), k)))
    }

    /// How many secrets verify now (configured and learned).
    pub fn key_count(&self) -> usize {
        self.keys.len() + self.learned.read().map_or(0, |l| l.len())
    }

    /// The configured keys, then the learned ones.
    fn keys_now(&self) -> Cow<'_, [Key]> {
        let learned = self.learned.read().unwrap_or_else(|p| p.into_inner());
        if learned.is_empty() {
            Cow::Borrowed(&self.keys)
        } else {
            Cow::Owned(self.keys.iter().chain(learned.iter()).cloned().collect())
        }
    }

    /// The URL the provider signed: `public_url`, with the request's query
    /// appended unless `public_url` has one of its own.
    pub fn url_of(&self, query: &str) -> String {
        let base = self.public_url.as_deref().unwrap_or("");
        if query.is_empty() || base.contains('?') {
            base.to_owned()
        } else {
            format!("{base}?{query}")
        }
    }

    pub fn scheme(&self) -> &Scheme {
        &self.scheme
    }

    pub fn tolerance(&self) -> Duration {
        self.tolerance
    }

    /// Checks the signature over the raw `body`. `headers` are as received,
    /// names in any case; `now` is unix seconds.
    pub fn verify(
        &self,
        headers: &[(String, String)],
        body: &[u8],
        now: i64,
    ) -> Result<Verdict, VerifyError> {
        self.verify_request(&Request::post(headers, body), now)
    }

    /// Checks the signature of a request: over its raw body, and for the
    /// schemes that sign them, its method, URL and query.
    pub fn verify_request(&self, rq: &Request<'_>, now: i64) -> Result<Verdict, VerifyError> {
        let (headers, body) = (rq.headers, rq.body);
        match &self.scheme {
            Scheme::Hmac(params) => hmac_generic::verify(self, params, headers, body),
            Scheme::Rule { rule, .. } => rule::verify(self, rule, rq, now),
            Scheme::Code(code) => code.verify(self, rq, now),
            Scheme::None => Ok(Verdict {
                secret_index: None,
                timestamp: None,
            }),
        }
    }

    /// The signature headers the provider would send for `body`, signed with
    /// secret 0 at time `now`. `id` is the message id for schemes that sign
    /// one (Standard's `webhook-id`) and ignored by the others. Fails for kind
    /// `none` and for a `whpk_` public key.
    pub fn sign(&self, body: &[u8], now: i64, id: &str) -> Result<Vec<(String, String)>, String> {
        self.sign_request(&Request::post(&[], body), now, id, None)
    }

    /// The signature headers for `rq` (whose headers are the ones already
    /// set, such as the id a rule signs), at `now`; the asymmetric kinds
    /// sign with `private_key`, a PKCS#8 PEM text.
    pub fn sign_request(
        &self,
        rq: &Request<'_>,
        now: i64,
        id: &str,
        private_key: Option<&str>,
    ) -> Result<Vec<(String, String)>, String> {
        let body = rq.body;
        match &self.scheme {
            Scheme::Hmac(params) => hmac_generic::sign(self, params, body),
            Scheme::Rule { rule, .. } => rule::sign(self, rule, rq, (now, id), private_key),
            Scheme::Code(code) => code.sign(self, rq, now, id),
            Scheme::None => Err("kind none does not sign".to_owned()),
        }
    }

    /// Hex HMAC-SHA256 of `message` with secret `index` (Zoom's handshake
    /// answer); None when that secret is not an HMAC key.
    pub fn hmac_hex_with(&self, index: usize, message: &[u8]) -> Option<String> {
        match self.keys_now().get(index)? {
            Key::Hmac(key) => hmac_tag(HmacAlgorithm::Sha256, key, &[message])
                .ok()
                .map(hex::encode),
            _ => None,
        }
    }

    /// The body as the provider would send it at `now`: Adyen and Mailgun
    /// sign inside it.
    pub fn sign_body(&self, body: &[u8], now: i64) -> Result<Vec<u8>, String> {
        match &self.scheme {
            Scheme::Code(code) => code.sign_body(self, body, now),
            Scheme::Rule { rule, .. } if matches!(rule.carrier, rule::Carrier::Json(_)) => {
                rule::sign_into_body(self, rule, body, now)
            }
            _ => Ok(body.to_vec()),
        }
    }

    /// Secret 0 as text, when it is a shared secret (not a public key).
    pub fn first_secret_text(&self) -> Option<String> {
        match self.keys_now().first()? {
            Key::Hmac(bytes) => String::from_utf8(bytes.clone()).ok(),
            _ => None,
        }
    }

    /// Index of the first HMAC key whose MAC over the concatenated `message`
    /// parts equals one of `tags`, compared in constant time.
    fn match_hmac(
        &self,
        algorithm: HmacAlgorithm,
        message: &[&[u8]],
        tags: &[Vec<u8>],
    ) -> Result<usize, VerifyError> {
        self.keys
            .iter()
            .position(|key| match key {
                Key::Hmac(key) => hmac_matches(algorithm, key, message, tags),
                Key::Ed25519(_) | Key::P256(_) => false,
            })
            .ok_or(VerifyError::NoSignatureMatched)
    }

    /// HMAC of the concatenated `message` parts with secret 0.
    fn sign_hmac(&self, algorithm: HmacAlgorithm, message: &[&[u8]]) -> Result<Vec<u8>, String> {
        match self.keys.first() {
            Some(Key::Hmac(key)) => hmac_tag(algorithm, key, message),
            Some(Key::Ed25519(_) | Key::P256(_)) => Err(
                "secret 0 is a public key (whpk_, or a provider's), which verifies but cannot sign"
                    .to_owned(),
            ),
            None => Err("no secret to sign with".to_owned()),
        }
    }

    /// Accepts `timestamp` within the tolerance of `now` on the side(s) the
    /// window bounds.
    fn check_window(
        &self,
        timestamp: i64,
        now: i64,
        window: rule::Window,
    ) -> Result<(), VerifyError> {
        match window {
            rule::Window::Both => self.check_freshness(timestamp, now),
            rule::Window::PastOnly => match self.check_freshness(timestamp, now) {
                Err(VerifyError::TimestampInFuture { .. }) => Ok(()),
                other => other,
            },
            rule::Window::NoFuture if timestamp > now => Err(VerifyError::TimestampInFuture {
                ahead_secs: u64::try_from(i128::from(timestamp) - i128::from(now))
                    .unwrap_or(u64::MAX),
            }),
            rule::Window::NoFuture => self.check_freshness(timestamp, now),
        }
    }

    /// Accepts `timestamp` when it is within the tolerance of `now`, either way.
    fn check_freshness(&self, timestamp: i64, now: i64) -> Result<(), VerifyError> {
        let tolerance = i128::from(self.tolerance.as_secs());
        let age = i128::from(now) - i128::from(timestamp);
        let saturate = |secs: i128| u64::try_from(secs).unwrap_or(u64::MAX);
        if age > tolerance {
            Err(VerifyError::TimestampTooOld {
                age_secs: saturate(age),
            })
        } else if -age > tolerance {
            Err(VerifyError::TimestampInFuture {
                ahead_secs: saturate(-age),
            })
        } else {
            Ok(())
        }
    }
}

/// `%XX` decoded, invalid escapes left as written (as Python's
/// `unquote`, which HubSpot's library applies to the URI it signs).
fn percent_decode(text: &str) -> String {
    percent_encoding::percent_decode_str(text)
        .decode_utf8_lossy()
        .into_owned()
}

fn check_header_name(name: &str) -> Result<(), String> {
    let is_token_char = |b: u8| b.is_ascii_graphic() && !b"\"(),/:;<=>?@[\\]{}".contains(&b);
    if name.is_empty() {
        Err("hmac: header name is empty".to_owned())
    } else if !name.bytes().all(is_token_char) {
        Err(format!("hmac: {name:?} is not a valid header name"))
    } else {
        Ok(())
    }
}

/// Turns one configured secret into a key; the error says what is wrong without quoting it.
fn decode_key(scheme: &Scheme, secret: &str) -> Result<Key, String> {
    if secret.is_empty() {
        return Err("empty".to_owned());
    }
    match scheme {
        Scheme::Code(code) => code.decode_key(secret),
        // A prefix says what the secret is (Standard's `whsec_`, `whpk_`).
        Scheme::Rule { rule, .. } if !rule.secret_prefixes.is_empty() => {
            generic::prefixed_key(rule, secret)
        }
        // The generic kinds: public keys as base64, hex or PEM, and a
        // shared secret's text turned into key bytes as configured.
        Scheme::Rule {
            kind: "hmac" | "basic" | "token",
            rule,
        } => generic::decode_key(rule, secret),
        Scheme::Rule { rule, .. } => match rule.alg {
            rule::Alg::Ed25519 => {
                let bytes: [u8; 32] = hex::decode(secret)
                    .ok()
                    .and_then(|b| b.try_into().ok())
                    .ok_or("the public key is not 64 hex digits (32 bytes)")?;
                ed25519_dalek::VerifyingKey::from_bytes(&bytes)
                    .map(Key::Ed25519)
                    .map_err(|_| "not an ed25519 public key".to_owned())
            }
            rule::Alg::EcdsaP256 => {
                use p256::pkcs8::DecodePublicKey as _;
                let der = base64::engine::general_purpose::STANDARD_PAD_INDIFFERENT
                    .decode(secret.trim())
                    .map_err(|_| "the verification key is not base64")?;
                p256::ecdsa::VerifyingKey::from_public_key_der(&der)
                    .map(Key::P256)
                    .map_err(|_| {
                        "not a P-256 public key (base64 DER SubjectPublicKeyInfo)".to_owned()
                    })
            }
            _ => generic::shared_key(rule, secret).map(Key::Hmac),
        },
        // Every other provider uses the secret's text as the HMAC key, prefix
        // and all (Stripe's `whsec_` included).
        _ => Ok(Key::Hmac(secret.as_bytes().to_vec())),
    }
}

// ---------------------------------------------------------------------------
// HMAC

fn hmac_matches(algorithm: HmacAlgorithm, key: &[u8], message: &[&[u8]], tags: &[Vec<u8>]) -> bool {
    match algorithm {
        HmacAlgorithm::Sha1 => mac_matches::<Hmac<sha1::Sha1>>(key, message, tags),
        HmacAlgorithm::Sha256 => mac_matches::<Hmac<sha2::Sha256>>(key, message, tags),
        HmacAlgorithm::Sha512 => mac_matches::<Hmac<sha2::Sha512>>(key, message, tags),
    }
}

fn hmac_tag(algorithm: HmacAlgorithm, key: &[u8], message: &[&[u8]]) -> Result<Vec<u8>, String> {
    match algorithm {
        HmacAlgorithm::Sha1 => mac_tag::<Hmac<sha1::Sha1>>(key, message),
        HmacAlgorithm::Sha256 => mac_tag::<Hmac<sha2::Sha256>>(key, message),
        HmacAlgorithm::Sha512 => mac_tag::<Hmac<sha2::Sha512>>(key, message),
    }
}

/// The MAC is computed once per key; each candidate tag is checked against a
/// clone with `verify_slice`, which compares in constant time.
fn mac_matches<M: Mac + KeyInit + Clone>(key: &[u8], message: &[&[u8]], tags: &[Vec<u8>]) -> bool {
    // HMAC takes keys of any length, so this never fails; no match if it did.
    let Ok(mut mac) = <M as KeyInit>::new_from_slice(key) else {
        return false;
    };
    for part in message {
        mac.update(part);
    }
    tags.iter().any(|tag| mac.clone().verify_slice(tag).is_ok())
}

fn mac_tag<M: Mac + KeyInit>(key: &[u8], message: &[&[u8]]) -> Result<Vec<u8>, String> {
    let mut mac = <M as KeyInit>::new_from_slice(key).map_err(|_| "hmac rejected the key")?;
    for part in message {
        mac.update(part);
    }
    Ok(mac.finalize().into_bytes().to_vec())
}

// ---------------------------------------------------------------------------
// Headers

fn malformed(header: &str, reason: MalformedReason) -> VerifyError {
    VerifyError::MalformedHeader {
        header: header.to_ascii_lowercase(),
        reason,
    }
}

/// The one value of a signature, timestamp or id header, trimmed of
/// surrounding spaces and tabs; `None` when absent. Sent twice, with a NUL,
/// overlong or blank is an error.
fn optional_header<'a>(
    headers: &'a [(String, String)],
    name: &str,
) -> Result<Option<&'a str>, VerifyError> {
    let mut values = header_values(headers, name);
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(VerifyError::DuplicateHeader(name.to_ascii_lowercase()));
    }
    if value.contains('\0') {
        return Err(malformed(name, MalformedReason::ContainsNul));
    }
    if value.len() > MAX_HEADER_LEN {
        return Err(malformed(
            name,
            MalformedReason::TooLong {
                max: MAX_HEADER_LEN,
            },
        ));
    }
    let value = value.trim_matches([' ', '\t']);
    if value.is_empty() {
        return Err(malformed(name, MalformedReason::Empty));
    }
    Ok(Some(value))
}

/// Like [`optional_header`], with absence an error.
fn required_header<'a>(
    headers: &'a [(String, String)],
    name: &str,
) -> Result<&'a str, VerifyError> {
    optional_header(headers, name)?
        .ok_or_else(|| VerifyError::MissingHeader(name.to_ascii_lowercase()))
}

/// Splits a header value into at most [`MAX_ENTRIES`] entries, trimmed, blank ones dropped.
fn split_entries<'a>(
    header: &str,
    value: &'a str,
    separator: char,
) -> Result<Vec<&'a str>, VerifyError> {
    let entries: Vec<&str> = value
        .split(separator)
        .map(|entry| entry.trim_matches([' ', '\t']))
        .filter(|entry| !entry.is_empty())
        .take(MAX_ENTRIES + 1)
        .collect();
    if entries.len() > MAX_ENTRIES {
        return Err(malformed(
            header,
            MalformedReason::TooManyEntries { max: MAX_ENTRIES },
        ));
    }
    Ok(entries)
}

/// `value` without `prefix`, the prefix compared ignoring ASCII case.
fn strip_prefix_ignore_case<'a>(value: &'a str, prefix: &str) -> Option<&'a str> {
    let head = value.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &value[prefix.len()..])
}

/// A unix time in seconds: ASCII digits only (no sign, no fraction), at most 18 of them.
fn parse_timestamp(header: &str, raw: &str) -> Result<i64, VerifyError> {
    let is_plain_number =
        !raw.is_empty() && raw.len() <= 18 && raw.bytes().all(|b| b.is_ascii_digit());
    raw.parse()
        .ok()
        .filter(|_| is_plain_number)
        .ok_or_else(|| malformed(header, MalformedReason::BadTimestamp))
}

/// The bytes of an encoded signature. Base64 is canonical (standard alphabet,
/// padding required, no stray trailing bits), so that one tag has one
/// spelling, short of hex letter case.
fn decode_signature(header: &str, raw: &str, encoding: Encoding) -> Result<Vec<u8>, VerifyError> {
    if raw.is_empty() {
        return Err(malformed(header, MalformedReason::NoSignature));
    }
    match encoding {
        Encoding::Hex => hex::decode(raw).map_err(|_| malformed(header, MalformedReason::BadHex)),
        Encoding::Base64 => base64::engine::general_purpose::STANDARD
            .decode(raw)
            .map_err(|_| malformed(header, MalformedReason::BadBase64)),
        Encoding::Base64Url => base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(raw.trim_end_matches('='))
            .map_err(|_| malformed(header, MalformedReason::BadBase64)),
        Encoding::Text => Ok(raw.as_bytes().to_vec()),
    }
}

fn encode_signature(bytes: &[u8], encoding: Encoding) -> String {
    match encoding {
        Encoding::Hex => hex::encode(bytes),
        Encoding::Base64 => base64::engine::general_purpose::STANDARD.encode(bytes),
        Encoding::Base64Url => base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes),
        Encoding::Text => String::from_utf8_lossy(bytes).into_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::*;
    use super::*;

    #[test]
    fn secret_debug_and_display_are_redacted() {
        let secret = Secret::new("hunter2-very-secret".to_owned());
        assert_eq!(format!("{secret:?}"), "[REDACTED]");
        assert_eq!(format!("{secret}"), "[REDACTED]");
        assert_eq!(secret.expose(), "hunter2-very-secret");
    }

    #[test]
    fn verifier_debug_never_shows_a_secret() {
        for (scheme, secret) in [
            (scheme("stripe"), "whsec_hunter2hunter2"),
            (scheme("github"), "hunter2hunter2"),
            (scheme("standard"), "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
        ] {
            let verifier = verifier(scheme, &[secret, secret]);
            let debug = format!("{verifier:?}");
            assert!(!debug.contains(secret), "{debug}");
            assert!(!debug.contains("hunter2"), "{debug}");
            assert!(!debug.contains("MfKQ9r8"), "{debug}");
            assert!(debug.contains("[2 REDACTED]"), "{debug}");
        }
    }

    #[test]
    fn new_rejects_missing_empty_and_extra_secrets() {
        let tolerance = Duration::from_secs(300);
        let err = Verifier::new(scheme("stripe"), vec![], tolerance).unwrap_err();
        assert_eq!(err, "kind stripe needs at least one secret");
        let secrets = vec![Secret::new("good".to_owned()), Secret::new(String::new())];
        let err = Verifier::new(scheme("github"), secrets, tolerance).unwrap_err();
        assert_eq!(err, "secret 1: empty");
        let err =
            Verifier::new(Scheme::None, vec![Secret::new("x".to_owned())], tolerance).unwrap_err();
        assert_eq!(err, "kind none takes no secrets, got 1");
        assert!(Verifier::new(Scheme::None, vec![], tolerance).is_ok());
    }

    #[test]
    fn none_accepts_anything_and_cannot_sign() {
        let verifier = Verifier::new(Scheme::None, vec![], Duration::ZERO).unwrap();
        let verdict = verifier.verify(&[], b"anything", 0).unwrap();
        assert_eq!(
            verdict,
            Verdict {
                secret_index: None,
                timestamp: None
            }
        );
        assert!(verifier.sign(b"x", 0, "id").is_err());
    }

    #[test]
    fn optional_header_rejects_duplicate_nul_overlong_and_blank() {
        let check = |pairs: &[(&str, &str)]| {
            optional_header(&headers(pairs), "X-Sig").map(|value| value.map(str::to_owned))
        };
        assert_eq!(check(&[]), Ok(None));
        assert_eq!(check(&[("x-sig", " \tabc ")]), Ok(Some("abc".to_owned())));
        let duplicate = check(&[("X-Sig", "a"), ("x-sig", "a")]).unwrap_err();
        assert_eq!(duplicate, VerifyError::DuplicateHeader("x-sig".to_owned()));
        assert!(duplicate.is_bad_request());
        let nul = check(&[("x-sig", "a\0b")]).unwrap_err();
        assert_eq!(nul, malformed("x-sig", MalformedReason::ContainsNul));
        assert!(nul.is_bad_request());
        let long = "a".repeat(MAX_HEADER_LEN + 1);
        let too_long = check(&[("x-sig", &long)]).unwrap_err();
        assert_eq!(
            too_long,
            malformed(
                "x-sig",
                MalformedReason::TooLong {
                    max: MAX_HEADER_LEN
                }
            )
        );
        assert!(!too_long.is_bad_request());
        assert_eq!(
            check(&[("x-sig", "  ")]),
            Err(malformed("x-sig", MalformedReason::Empty))
        );
    }

    #[test]
    fn timestamps_are_plain_digits() {
        assert_eq!(parse_timestamp("h", "1700000000"), Ok(1_700_000_000));
        for bad in [
            "",
            "+1",
            "-1",
            "1.5",
            "1e9",
            " 1",
            "abc",
            "9999999999999999999",
            "0x10",
        ] {
            assert_eq!(
                parse_timestamp("h", bad),
                Err(malformed("h", MalformedReason::BadTimestamp)),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn freshness_is_inclusive_both_ways_and_never_overflows() {
        let verifier = verifier(scheme("github"), &["k"]);
        let now = 1_700_000_000;
        assert_eq!(verifier.check_freshness(now - 300, now), Ok(()));
        assert_eq!(verifier.check_freshness(now + 300, now), Ok(()));
        assert_eq!(
            verifier.check_freshness(now - 301, now),
            Err(VerifyError::TimestampTooOld { age_secs: 301 })
        );
        assert_eq!(
            verifier.check_freshness(now + 301, now),
            Err(VerifyError::TimestampInFuture { ahead_secs: 301 })
        );
        assert!(verifier.check_freshness(i64::MIN, i64::MAX).is_err());
        assert!(verifier.check_freshness(i64::MAX, i64::MIN).is_err());
    }

    #[test]
    fn split_entries_caps_the_count() {
        let many = vec!["v1=00"; MAX_ENTRIES + 1].join(",");
        assert_eq!(
            split_entries("h", &many, ','),
            Err(malformed(
                "h",
                MalformedReason::TooManyEntries { max: MAX_ENTRIES }
            ))
        );
        let just_enough = vec!["v1=00"; MAX_ENTRIES].join(", ");
        assert_eq!(
            split_entries("h", &just_enough, ',').unwrap().len(),
            MAX_ENTRIES
        );
    }

    #[test]
    fn prefix_strip_ignores_case_and_char_boundaries() {
        assert_eq!(strip_prefix_ignore_case("SHA256=ab", "sha256="), Some("ab"));
        assert_eq!(strip_prefix_ignore_case("sha1=ab", "sha256="), None);
        assert_eq!(strip_prefix_ignore_case("é", "a"), None);
        assert_eq!(strip_prefix_ignore_case("ab", ""), Some("ab"));
    }

    #[test]
    fn hmac_config_parsing() {
        assert_eq!("sha512".parse(), Ok(HmacAlgorithm::Sha512));
        assert!("md5".parse::<HmacAlgorithm>().is_err());
        assert_eq!("base64".parse(), Ok(Encoding::Base64));
        assert!("b64".parse::<Encoding>().is_err());
    }

    #[test]
    fn error_messages_are_lowercase_without_period() {
        let errors = [
            VerifyError::MissingHeader("stripe-signature".to_owned()),
            VerifyError::DuplicateHeader("webhook-id".to_owned()),
            malformed("Paddle-Signature", MalformedReason::NoTimestamp),
            VerifyError::NoSignatureMatched,
            VerifyError::TimestampTooOld { age_secs: 3 },
            VerifyError::TimestampInFuture { ahead_secs: 4 },
            VerifyError::InvalidBody("not json".to_owned()),
        ];
        for error in errors {
            let message = error.to_string();
            assert_eq!(message, message.to_lowercase());
            assert!(!message.ends_with('.'), "{message}");
        }
        assert_eq!(
            VerifyError::MissingHeader("stripe-signature".to_owned()).to_string(),
            "missing header stripe-signature"
        );
        assert_eq!(
            malformed("Paddle-Signature", MalformedReason::NoTimestamp).to_string(),
            "malformed header paddle-signature: has no timestamp"
        );
    }
}
