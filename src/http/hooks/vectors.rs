//! The providers' own libraries as ground truth: every vector in
//! `tests/vectors/providers.json` (written by `tests/vectors/gen/`, which
//! signs and verifies with each provider's official library) is checked
//! through a source built from a config, as the receiver checks a request:
//! the verdict must be the library's, and a genuine vector's event ids and
//! types the ones the provider's rule names. A generic kind's vector
//! carries its source's settings (`config`), as a user would write them.
//! Hand-made negatives follow: a tampered body, a wrong secret, a missing
//! header, a second copy of the signature header, and a timestamp past
//! the tolerance.

use serde::Deserialize;

use super::{event_id_of, event_type_of, form_of, providers};
use crate::config::{Config, Source};
use crate::receive::key::{Input, Json, RawDoc};
use crate::verify::{Request, VerifyError};

#[derive(Deserialize)]
struct File {
    vectors: Vec<Vector>,
}

#[derive(Deserialize, Clone)]
struct Vector {
    kind: String,
    name: String,
    secrets: Vec<String>,
    public_url: Option<String>,
    method: String,
    query: String,
    headers: Vec<(String, String)>,
    body: String,
    now: i64,
    valid: bool,
    mutation: Option<String>,
    event_ids: Option<Vec<String>>,
    event_types: Option<Vec<Option<String>>>,
    /// A generic kind's source, configured by hand: its TOML lines after
    /// `kind` and `secrets`.
    #[serde(default)]
    config: Option<String>,
    /// For a public key: another one, for the wrong-secret negative.
    #[serde(default)]
    wrong_secrets: Option<Vec<String>>,
}

fn vectors() -> Vec<Vector> {
    let text = include_str!("../../../tests/vectors/providers.json");
    let file: File = serde_json::from_str(text).expect("providers.json parses");
    file.vectors
}

fn toml_string(s: &str) -> String {
    serde_json::to_string(s).expect("a string serializes")
}

/// A config with one source of the vector's kind and secrets.
fn source_for(v: &Vector, secrets: &[String]) -> Config {
    let mut toml = format!(
        "database = \"unused.db\"\n[sources.s]\nkind = {}\nsecrets = [{}]\n",
        toml_string(&v.kind),
        secrets
            .iter()
            .map(|s| toml_string(s))
            .collect::<Vec<_>>()
            .join(", ")
    );
    // (HubSpot's legacy v1 signs no URL, but the kind needs one.)
    let needs_url = matches!(v.kind.as_str(), "twilio" | "square" | "hubspot" | "trello");
    let url = v
        .public_url
        .clone()
        .filter(|_| needs_url)
        .or_else(|| needs_url.then(|| "https://example.invalid/".to_string()));
    if let Some(url) = url {
        toml.push_str(&format!("public_url = {}\n", toml_string(&url)));
    }
    if v.kind == "meta" {
        toml.push_str("verify_token = \"vt\"\n");
    }
    if let Some(config) = &v.config {
        toml.push_str(config);
    }
    Config::parse(&toml, "vector", std::path::Path::new("."), None)
        .unwrap_or_else(|e| panic!("{}: {e}", v.name))
}

fn request<'a>(v: &'a Vector, headers: &'a [(String, String)], body: &'a [u8]) -> Request<'a> {
    Request {
        method: &v.method,
        query: &v.query,
        headers,
        body,
    }
}

/// The event ids and types the receiver reads from the vector's request.
fn identify(source: &Source, v: &Vector) -> Result<Vec<(String, Option<String>)>, String> {
    let body = v.body.as_bytes();
    let content_type = crate::verify::headers::header_values(&v.headers, "content-type").next();
    let form = form_of(source, content_type, body);
    let one = |json: Option<Json<'_>>, item: &[u8]| {
        let input = Input {
            headers: &v.headers,
            json,
            form: form.as_deref(),
            body: item,
        };
        let id = event_id_of(source, &input).map_err(|e| e.message)?;
        let event_type = event_type_of(source, &v.headers, &input).map_err(|e| e.message)?;
        Ok((id, event_type))
    };
    match source.batch() {
        Some(batch) => {
            let (items, _) = providers::items(batch, body, 1000).map_err(|e| e.message)?;
            items
                .iter()
                .map(|item| {
                    let text = item.text.get();
                    let doc = RawDoc::parse(text).expect("an item is JSON");
                    one(Some(Json::Raw(&doc)), text.as_bytes())
                })
                .collect()
        }
        None => {
            let text = std::str::from_utf8(body).ok();
            let doc = text.and_then(|t| RawDoc::parse(t).ok());
            Ok(vec![one(doc.as_ref().map(Json::Raw), body)?])
        }
    }
}

#[test]
fn every_providers_library_vector_verifies_as_the_library_says() {
    let all = vectors();
    assert!(all.len() >= 200, "only {} vectors", all.len());
    let mut kinds = std::collections::BTreeSet::new();
    let mut failures = Vec::new();
    for v in &all {
        kinds.insert(v.kind.clone());
        let config = source_for(v, &v.secrets);
        let source = &config.sources[0];
        let verdict = source
            .verifier
            .verify_request(&request(v, &v.headers, v.body.as_bytes()), v.now);
        if verdict.is_ok() != v.valid {
            failures.push(format!(
                "{} / {} ({:?}): library says {}, idemhook {:?}",
                v.kind, v.name, v.mutation, v.valid, verdict
            ));
            continue;
        }
        if v.valid
            && v.mutation.is_none()
            && !is_signed_handshake(v)
            && (v.event_ids.is_some() || v.event_types.is_some())
        {
            let found = match identify(source, v) {
                Ok(found) => found,
                Err(e) => {
                    failures.push(format!("{} / {}: {e}", v.kind, v.name));
                    continue;
                }
            };
            if let Some(ids) = &v.event_ids {
                let got: Vec<&String> = found.iter().map(|(id, _)| id).collect();
                if got != ids.iter().collect::<Vec<_>>() {
                    failures.push(format!(
                        "{} / {}: ids {got:?}, expected {ids:?}",
                        v.kind, v.name
                    ));
                }
            }
            if let Some(types) = &v.event_types {
                let got: Vec<Option<String>> = found.iter().map(|(_, t)| t.clone()).collect();
                if &got != types {
                    failures.push(format!(
                        "{} / {}: types {got:?}, expected {types:?}",
                        v.kind, v.name
                    ));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {}:\n{}",
        failures.len(),
        all.len(),
        failures.join("\n")
    );
    // Every kind of the table has vectors, and the aliases of standard.
    for p in crate::config::presets::PRESETS {
        assert!(kinds.contains(p.name), "no vector for {}", p.name);
    }
    for alias in ["clerk", "resend", "svix", "standard"] {
        assert!(kinds.contains(alias), "no vector for {alias}");
    }
    // And the generic kinds, configured by hand.
    for generic in ["hmac", "basic", "token"] {
        assert!(kinds.contains(generic), "no vector for {generic}");
    }
}

/// Adding a kind is a row and its vectors: every kind that verifies
/// anything (all but `none`) has genuine and negative vectors in
/// `tests/vectors/providers.json`.
#[test]
fn every_kind_has_vectors() {
    let all = vectors();
    for kind in crate::config::Kind::all().filter(|k| *k != crate::config::Kind::None) {
        let of_kind: Vec<&Vector> = all.iter().filter(|v| v.kind == kind.name()).collect();
        assert!(
            of_kind.iter().any(|v| v.valid) && of_kind.iter().any(|v| !v.valid),
            "kind {kind} has no genuine and negative vectors in tests/vectors/providers.json"
        );
    }
}

/// Discord's PING and Zoom's URL validation are answered, not stored.
fn is_signed_handshake(v: &Vector) -> bool {
    let body: serde_json::Value = serde_json::from_str(&v.body).unwrap_or_default();
    (v.kind == "discord" && body["type"] == 1)
        || (v.kind == "zoom" && body["event"] == "endpoint.url_validation")
}

/// Kinds whose scheme does not cover the body: a changed body verifies.
fn covers_body(kind: &str) -> bool {
    !matches!(
        kind,
        "gitlab" | "okta" | "postmark" | "msgraph" | "mailgun" | "adyen" | "basic" | "token"
    )
}

#[test]
fn hand_made_negatives_fail_for_every_genuine_vector() {
    for v in vectors().iter().filter(|v| v.valid && v.mutation.is_none()) {
        let config = source_for(v, &v.secrets);
        let verifier = &config.sources[0].verifier;
        let check = |headers: &[(String, String)], body: &[u8], now: i64| {
            verifier.verify_request(&request(v, headers, body), now)
        };
        let genuine = check(&v.headers, v.body.as_bytes(), v.now)
            .unwrap_or_else(|e| panic!("{}: {e}", v.name));

        if covers_body(&v.kind) {
            let mut tampered = v.body.clone().into_bytes();
            tampered.push(b' ');
            assert!(
                check(&v.headers, &tampered, v.now).is_err(),
                "{}: tampered body verified",
                v.name
            );
        }

        // A wrong secret (asymmetric kinds: another public key).
        let wrong: Vec<String> = v
            .wrong_secrets
            .clone()
            .unwrap_or_else(|| v.secrets.iter().map(|s| wrong_secret(&v.kind, s)).collect());
        let wrong_config = source_for(v, &wrong);
        let wrong_verdict = wrong_config.sources[0]
            .verifier
            .verify_request(&request(v, &v.headers, v.body.as_bytes()), v.now);
        assert!(wrong_verdict.is_err(), "{}: wrong secret verified", v.name);

        // Every signature-bearing header missing, and each one sent twice.
        for (name, _) in &v.headers {
            let lower = name.to_ascii_lowercase();
            if lower == "content-type"
                || lower.contains("idempotency")
                || !is_signature_header(&lower)
            {
                continue;
            }
            let without: Vec<(String, String)> = v
                .headers
                .iter()
                .filter(|(n, _)| !n.eq_ignore_ascii_case(name))
                .cloned()
                .collect();
            // Box and DocuSign send several signature headers (one is
            // enough); HubSpot's version header defaults to v1.
            if v.kind != "box" && v.kind != "docusign" && lower != "x-hubspot-signature-version" {
                assert!(
                    check(&without, v.body.as_bytes(), v.now).is_err(),
                    "{}: verified without {name}",
                    v.name
                );
            }
            let mut doubled = v.headers.clone();
            doubled.extend(v.headers.iter().filter(|(n, _)| n == name).cloned());
            assert!(
                matches!(
                    check(&doubled, v.body.as_bytes(), v.now),
                    Err(VerifyError::DuplicateHeader(_))
                ),
                "{}: a doubled {name} was not refused as a duplicate",
                v.name
            );
        }

        // A timestamp beyond the tolerance, both ways where the window is.
        let source = &config.sources[0];
        if genuine.timestamp.is_some() {
            let far = i64::try_from(source.tolerance.as_secs()).unwrap_or(0) + 120;
            assert!(
                matches!(
                    check(&v.headers, v.body.as_bytes(), v.now + far),
                    Err(VerifyError::TimestampTooOld { .. })
                ),
                "{}: stale timestamp verified",
                v.name
            );
        }
    }
}

fn is_signature_header(lower: &str) -> bool {
    // Sent alongside, not signed.
    if lower == "sentry-hook-timestamp" {
        return false;
    }
    lower.contains("signature")
        || lower.starts_with("webhook-")
        || lower.starts_with("svix-")
        || lower.contains("webhook-signature")
        || lower.contains("webhooks-signature")
        || lower.contains("hmac")
        || lower.contains("token")
        || lower == "authorization"
        || lower.ends_with("-timestamp")
        || lower.starts_with("x-hub-")
        || lower.starts_with("x-signature")
        || lower == "x-trello-webhook"
        || lower == "box-delivery-timestamp"
        || lower == "verif-hash"
        || lower.starts_with("box-signature-primary")
}

/// A secret of the same shape that is not the right one.
fn wrong_secret(kind: &str, secret: &str) -> String {
    match kind {
        // Another Ed25519 public key (RFC 8032 test 2's).
        "discord" => "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c".to_string(),
        // Another P-256 public key.
        "sendgrid" => "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEYP7UuiVanTHJYet0xjVtaMBJuJI7Yfps5mliLmDyn7Z5A/4QCLi8maQa6elWKLxk8vGyDC1+n1F3o8KU1EYimQ==".to_string(),
        "adyen" => "00".repeat(32),
        _ if secret.starts_with("whsec_") => "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".to_string(),
        _ => format!("{secret}-not"),
    }
}
