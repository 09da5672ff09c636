//! The rules data cannot say: Twilio's URL with its sorted form
//! parameters (or `bodySHA256`), HubSpot's v3 signature over the decoded
//! URI and its legacy plain hashes, Adyen's per-item signatures inside the
//! body, and Microsoft Graph's `clientState` in every item.

use base64::Engine as _;
use serde_json::Value;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq as _;

use super::{
    Encoding, HmacAlgorithm, Key, MalformedReason, Request, Verdict, Verifier, VerifyError,
    malformed,
};

const TWILIO_SIGNATURE: &str = "X-Twilio-Signature";
const TWILIO_SETTINGS: &str = "X-Twilio-Webhooks-Signature-Settings";

/// Twilio (`RequestValidator`): base64 HMAC-SHA1 (or SHA-256, with the
/// signature settings header) of the URL followed by every POST
/// parameter, names sorted, each name's distinct values sorted, as
/// name+value. A JSON body is signed through the URL's `bodySHA256`
/// (hex SHA-256 of the body), which must match. Twilio signs the URL
/// with or without the default port; both are tried.
pub(super) fn twilio_verify(verifier: &Verifier, rq: &Request<'_>) -> Result<Verdict, VerifyError> {
    let value = super::required_header(rq.headers, TWILIO_SIGNATURE)?;
    let tag = base64::engine::general_purpose::STANDARD_PAD_INDIFFERENT
        .decode(value)
        .map_err(|_| malformed(TWILIO_SIGNATURE, MalformedReason::BadBase64))?;
    let algorithm = twilio_algorithm(rq.headers)?;
    let url = verifier.url_of(rq.query);
    let params = twilio_params(rq, &url)?;
    for candidate in [without_port(&url), with_port(&url)] {
        let content = twilio_content(&candidate, &params);
        if let Ok(index) =
            verifier.match_hmac(algorithm, &[content.as_bytes()], std::slice::from_ref(&tag))
        {
            return Ok(Verdict {
                secret_index: Some(index),
                timestamp: None,
            });
        }
    }
    Err(VerifyError::NoSignatureMatchedUrl)
}

pub(super) fn twilio_sign(
    verifier: &Verifier,
    rq: &Request<'_>,
) -> Result<Vec<(String, String)>, String> {
    let url = verifier.url_of(rq.query);
    let params = twilio_params(rq, &url).map_err(|e| e.to_string())?;
    let content = twilio_content(&url, &params);
    let tag = verifier.sign_hmac(HmacAlgorithm::Sha1, &[content.as_bytes()])?;
    Ok(vec![(
        TWILIO_SIGNATURE.to_owned(),
        super::encode_signature(&tag, Encoding::Base64),
    )])
}

fn twilio_algorithm(headers: &[(String, String)]) -> Result<HmacAlgorithm, VerifyError> {
    Ok(match super::optional_header(headers, TWILIO_SETTINGS)? {
        Some(settings) if settings.to_ascii_uppercase().contains("HMAC_SHA256") => {
            HmacAlgorithm::Sha256
        }
        _ => HmacAlgorithm::Sha1,
    })
}

/// The signed POST parameters: the form body's, or none for a body signed
/// through `bodySHA256` (checked here).
fn twilio_params(rq: &Request<'_>, url: &str) -> Result<Vec<(String, String)>, VerifyError> {
    let query = url.split_once('?').map_or("", |(_, q)| q);
    let body_hash = form_urlencoded::parse(query.as_bytes())
        .find(|(name, _)| name == "bodySHA256")
        .map(|(_, v)| v.into_owned());
    if let Some(expected) = body_hash {
        let actual = hex::encode(Sha256::digest(rq.body));
        if !bool::from(
            actual
                .as_bytes()
                .ct_eq(expected.to_ascii_lowercase().as_bytes()),
        ) {
            return Err(VerifyError::NoSignatureMatched);
        }
        return Ok(Vec::new());
    }
    if rq.method.eq_ignore_ascii_case("GET") {
        return Ok(Vec::new());
    }
    Ok(form_urlencoded::parse(rq.body)
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect())
}

fn twilio_content(url: &str, params: &[(String, String)]) -> String {
    let mut names: Vec<&str> = params.iter().map(|(k, _)| k.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    let mut content = url.to_owned();
    for name in names {
        let mut values: Vec<&str> = params
            .iter()
            .filter(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .collect();
        values.sort_unstable();
        values.dedup();
        for value in values {
            content.push_str(name);
            content.push_str(value);
        }
    }
    content
}

/// The URL's scheme, authority and the rest.
fn split_url(url: &str) -> Option<(&str, &str, &str)> {
    let (scheme, rest) = url.split_once("://")?;
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    Some((scheme, &rest[..end], &rest[end..]))
}

fn has_port(authority: &str) -> bool {
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    host.rsplit_once(':').is_some_and(|(h, p)| {
        !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) && !h.ends_with(':')
    }) && !host.ends_with(']')
}

fn with_port(url: &str) -> String {
    match split_url(url) {
        Some((scheme, authority, rest)) if !has_port(authority) => {
            let port = if scheme.eq_ignore_ascii_case("https") {
                443
            } else {
                80
            };
            format!("{scheme}://{authority}:{port}{rest}")
        }
        _ => url.to_owned(),
    }
}

fn without_port(url: &str) -> String {
    match split_url(url) {
        Some((scheme, authority, rest)) if has_port(authority) => {
            let cut = authority.rfind(':').unwrap_or(authority.len());
            format!("{scheme}://{}{rest}", &authority[..cut])
        }
        _ => url.to_owned(),
    }
}

const HUBSPOT_V3: &str = "X-HubSpot-Signature-v3";
const HUBSPOT_TIMESTAMP: &str = "X-HubSpot-Request-Timestamp";
const HUBSPOT_LEGACY: &str = "X-HubSpot-Signature";
const HUBSPOT_VERSION: &str = "X-HubSpot-Signature-Version";

/// HubSpot (`Signature.is_valid`): v3 is the base64 HMAC-SHA256 of method,
/// the percent-decoded URI, body and the millisecond timestamp, which may
/// not be older than the tolerance (the library checks only the past).
/// Legacy apps send v1 (hex SHA-256 of secret + body) or v2 (of secret +
/// method + URI + body), which sign no time.
pub(super) fn hubspot_verify(
    verifier: &Verifier,
    rq: &Request<'_>,
    now: i64,
) -> Result<Verdict, VerifyError> {
    if let Some(value) = super::optional_header(rq.headers, HUBSPOT_V3)? {
        let tag = base64::engine::general_purpose::STANDARD_PAD_INDIFFERENT
            .decode(value)
            .map_err(|_| malformed(HUBSPOT_V3, MalformedReason::BadBase64))?;
        let raw = super::required_header(rq.headers, HUBSPOT_TIMESTAMP)?;
        let ms = super::parse_timestamp(HUBSPOT_TIMESTAMP, raw)?;
        let uri = super::percent_decode(&verifier.url_of(rq.query));
        let message: [&[u8]; 4] = [
            rq.method.as_bytes(),
            uri.as_bytes(),
            rq.body,
            raw.as_bytes(),
        ];
        let index = verifier
            .match_hmac(HmacAlgorithm::Sha256, &message, &[tag])
            .map_err(|_| VerifyError::NoSignatureMatchedUrl)?;
        let secs = ms.div_euclid(1000);
        verifier.check_window(secs, now, super::rule::Window::PastOnly)?;
        return Ok(Verdict {
            secret_index: Some(index),
            timestamp: Some(secs),
        });
    }
    let value = super::required_header(rq.headers, HUBSPOT_LEGACY)?;
    let tag = super::decode_signature(HUBSPOT_LEGACY, value, Encoding::Hex)?;
    let version = super::optional_header(rq.headers, HUBSPOT_VERSION)?.unwrap_or("v1");
    let url = verifier.url_of(rq.query);
    let index = verifier
        .keys
        .iter()
        .position(|key| {
            let Key::Hmac(secret) = key else { return false };
            let mut hash = Sha256::new();
            hash.update(secret);
            if version.eq_ignore_ascii_case("v2") {
                hash.update(rq.method.as_bytes());
                hash.update(url.as_bytes());
            }
            hash.update(rq.body);
            bool::from(hash.finalize().as_slice().ct_eq(&tag))
        })
        .ok_or(VerifyError::NoSignatureMatched)?;
    Ok(Verdict {
        secret_index: Some(index),
        timestamp: None,
    })
}

pub(super) fn hubspot_sign(
    verifier: &Verifier,
    rq: &Request<'_>,
    now: i64,
) -> Result<Vec<(String, String)>, String> {
    let ms = (now * 1000).to_string();
    let uri = super::percent_decode(&verifier.url_of(rq.query));
    let tag = verifier.sign_hmac(
        HmacAlgorithm::Sha256,
        &[rq.method.as_bytes(), uri.as_bytes(), rq.body, ms.as_bytes()],
    )?;
    Ok(vec![
        (HUBSPOT_TIMESTAMP.to_owned(), ms),
        (
            HUBSPOT_V3.to_owned(),
            super::encode_signature(&tag, Encoding::Base64),
        ),
    ])
}

/// The items of an Adyen notification (`notificationItems[].NotificationRequestItem`).
fn adyen_items(body: &Value) -> Option<Vec<&Value>> {
    body.get("notificationItems")?
        .as_array()?
        .iter()
        .map(|item| item.get("NotificationRequestItem"))
        .collect()
}

/// What Adyen signs of one item: eight fields joined by `:`, missing ones empty.
fn adyen_content(item: &Value) -> String {
    let text = |v: Option<&Value>| match v {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Bool(true)) => "True".to_owned(),
        Some(Value::Bool(false)) => "False".to_owned(),
        Some(Value::Null) | None => String::new(),
        Some(other) => other.to_string(),
    };
    let amount = item.get("amount");
    [
        text(item.get("pspReference")),
        text(item.get("originalReference")),
        text(item.get("merchantAccountCode")),
        text(item.get("merchantReference")),
        text(amount.and_then(|a| a.get("value"))),
        text(amount.and_then(|a| a.get("currency"))),
        text(item.get("eventCode")),
        text(item.get("success")),
    ]
    .join(":")
}

/// Adyen (`is_valid_hmac_notification`): every item's
/// `additionalData.hmacSignature` is the base64 HMAC-SHA256, keyed with the
/// hex-decoded HMAC key, of its eight fields; one bad item refuses the
/// whole notification.
pub(super) fn adyen_verify(verifier: &Verifier, rq: &Request<'_>) -> Result<Verdict, VerifyError> {
    let body: Value = serde_json::from_slice(rq.body)
        .map_err(|_| VerifyError::InvalidBody("not JSON".to_owned()))?;
    let items = adyen_items(&body)
        .filter(|items| !items.is_empty())
        .ok_or_else(|| VerifyError::InvalidBody("no notificationItems".to_owned()))?;
    let mut first = None;
    for item in items {
        let signature = item
            .pointer("/additionalData/hmacSignature")
            .and_then(Value::as_str)
            .ok_or(VerifyError::MissingHeader(
                "additionaldata.hmacsignature".to_owned(),
            ))?;
        let tag = base64::engine::general_purpose::STANDARD_PAD_INDIFFERENT
            .decode(signature)
            .map_err(|_| VerifyError::InvalidBody("hmacSignature is not base64".to_owned()))?;
        let content = adyen_content(item);
        let index = verifier.match_hmac(HmacAlgorithm::Sha256, &[content.as_bytes()], &[tag])?;
        first.get_or_insert(index);
    }
    Ok(Verdict {
        secret_index: first,
        timestamp: None,
    })
}

/// The body with every item's `hmacSignature` set, for `idemhook send`.
pub(super) fn adyen_sign_body(verifier: &Verifier, body: &[u8]) -> Result<Vec<u8>, String> {
    let mut value: Value = serde_json::from_slice(body).map_err(|_| "the body is not JSON")?;
    let items = value
        .get_mut("notificationItems")
        .and_then(Value::as_array_mut)
        .ok_or("the body has no notificationItems")?;
    for item in items {
        let inner = item
            .get_mut("NotificationRequestItem")
            .ok_or("an item has no NotificationRequestItem")?;
        let content = adyen_content(inner);
        let tag = verifier.sign_hmac(HmacAlgorithm::Sha256, &[content.as_bytes()])?;
        let encoded = super::encode_signature(&tag, Encoding::Base64);
        let Some(object) = inner.as_object_mut() else {
            return Err("an item is not an object".to_owned());
        };
        let additional = object
            .entry("additionalData")
            .or_insert_with(|| Value::Object(serde_json::Map::new()));
        if let Some(map) = additional.as_object_mut() {
            map.insert("hmacSignature".to_owned(), Value::String(encoded));
        }
    }
    serde_json::to_vec(&value).map_err(|e| e.to_string())
}

/// Microsoft Graph: no signature; every item of `value[]` carries the
/// subscription's `clientState`, which must equal a secret.
pub(super) fn msgraph_verify(
    verifier: &Verifier,
    rq: &Request<'_>,
) -> Result<Verdict, VerifyError> {
    let body: Value = serde_json::from_slice(rq.body)
        .map_err(|_| VerifyError::InvalidBody("not JSON".to_owned()))?;
    let items = body
        .get("value")
        .and_then(Value::as_array)
        .ok_or_else(|| VerifyError::InvalidBody("no value array".to_owned()))?;
    let mut first = None;
    for item in items {
        let state = item
            .get("clientState")
            .and_then(Value::as_str)
            .ok_or_else(|| VerifyError::MissingHeader("clientstate".to_owned()))?;
        let index = verifier
            .keys
            .iter()
            .position(|k| matches!(k, Key::Hmac(k) if super::same_secret(state.as_bytes(), k)))
            .ok_or(VerifyError::NoSignatureMatched)?;
        first.get_or_insert(index);
    }
    Ok(Verdict {
        secret_index: first.or(Some(0)),
        timestamp: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn twilio_ports_are_added_and_removed() {
        assert_eq!(
            with_port("https://a.example/x?y=1"),
            "https://a.example:443/x?y=1"
        );
        assert_eq!(with_port("http://a.example"), "http://a.example:80");
        assert_eq!(
            with_port("https://a.example:8443/x"),
            "https://a.example:8443/x"
        );
        assert_eq!(
            without_port("https://a.example:443/x"),
            "https://a.example/x"
        );
        assert_eq!(without_port("https://a.example/x"), "https://a.example/x");
    }

    #[test]
    fn twilio_content_sorts_names_and_distinct_values() {
        let params = vec![
            ("To".to_owned(), "b".to_owned()),
            ("From".to_owned(), "x".to_owned()),
            ("To".to_owned(), "a".to_owned()),
            ("To".to_owned(), "a".to_owned()),
        ];
        assert_eq!(twilio_content("U", &params), "UFromxToaTob");
    }

    #[test]
    fn percent_decoding_keeps_bad_escapes() {
        assert_eq!(super::super::percent_decode("a%20b%zz%4"), "a b%zz%4");
    }
}
