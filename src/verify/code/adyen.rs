//! Adyen: a signature per item inside the body, keyed with the
//! hex-decoded HMAC key, which no rule can say.

use base64::Engine as _;
use serde_json::Value;

use super::super::{Encoding, HmacAlgorithm, Key, Request, Verdict, Verifier, VerifyError};
use super::Code;

pub(super) struct Adyen;

impl Code for Adyen {
    fn kind(&self) -> &'static str {
        "adyen"
    }
    fn describe(&self) -> &'static str {
        "each item's additionalData.hmacSignature: base64 HMAC-SHA256 (hex key) of its eight fields joined by :"
    }
    fn verify(
        &self,
        verifier: &Verifier,
        rq: &Request<'_>,
        _now: i64,
    ) -> Result<Verdict, VerifyError> {
        adyen_verify(verifier, rq)
    }
    fn sign_body(&self, verifier: &Verifier, body: &[u8], _now: i64) -> Result<Vec<u8>, String> {
        adyen_sign_body(verifier, body)
    }
    fn decode_key(&self, secret: &str) -> Result<Key, String> {
        hex::decode(secret)
            .map(Key::Hmac)
            .map_err(|_| "the adyen HMAC key is written in hex".to_owned())
    }
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
fn adyen_verify(verifier: &Verifier, rq: &Request<'_>) -> Result<Verdict, VerifyError> {
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
fn adyen_sign_body(verifier: &Verifier, body: &[u8]) -> Result<Vec<u8>, String> {
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
        let encoded = super::super::encode_signature(&tag, Encoding::Base64);
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
