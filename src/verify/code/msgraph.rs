//! Microsoft Graph: no signature, the subscription's `clientState` in
//! every item, which no rule can say.

use serde_json::Value;

use super::super::{Key, Request, Verdict, Verifier, VerifyError};
use super::Code;

pub(super) struct Msgraph;

impl Code for Msgraph {
    fn kind(&self) -> &'static str {
        "msgraph"
    }
    fn describe(&self) -> &'static str {
        "no signature: each item's clientState equals a secret"
    }
    fn verify(
        &self,
        verifier: &Verifier,
        rq: &Request<'_>,
        _now: i64,
    ) -> Result<Verdict, VerifyError> {
        msgraph_verify(verifier, rq)
    }
}

/// Microsoft Graph: no signature; every item of `value[]` carries the
/// subscription's `clientState`, which must equal a secret.
fn msgraph_verify(verifier: &Verifier, rq: &Request<'_>) -> Result<Verdict, VerifyError> {
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
            .position(
                |k| matches!(k, Key::Hmac(k) if super::super::same_secret(state.as_bytes(), k)),
            )
            .ok_or(VerifyError::NoSignatureMatched)?;
        first.get_or_insert(index);
    }
    Ok(Verdict {
        secret_index: first.or(Some(0)),
        timestamp: None,
    })
}
