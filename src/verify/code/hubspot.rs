//! HubSpot: v3 over the percent-decoded URI, and the legacy v1/v2 plain
//! hashes, which no rule can say.

use base64::Engine as _;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq as _;

use super::super::{
    Encoding, HmacAlgorithm, Key, MalformedReason, Request, Verdict, Verifier, VerifyError,
    malformed,
};
use super::Code;

pub(super) struct Hubspot;

impl Code for Hubspot {
    fn kind(&self) -> &'static str {
        "hubspot"
    }
    fn describe(&self) -> &'static str {
        "X-HubSpot-Signature-v3: base64 HMAC-SHA256 of method + public_url + body + X-HubSpot-Request-Timestamp (ms, not older than tolerance); legacy v1/v2 hex SHA-256"
    }
    fn verify(
        &self,
        verifier: &Verifier,
        rq: &Request<'_>,
        now: i64,
    ) -> Result<Verdict, VerifyError> {
        hubspot_verify(verifier, rq, now)
    }
    fn sign(
        &self,
        verifier: &Verifier,
        rq: &Request<'_>,
        now: i64,
        _id: &str,
    ) -> Result<Vec<(String, String)>, String> {
        hubspot_sign(verifier, rq, now)
    }
    fn signs_timestamp(&self) -> bool {
        true
    }
    fn covers_url(&self) -> bool {
        true
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
fn hubspot_verify(verifier: &Verifier, rq: &Request<'_>, now: i64) -> Result<Verdict, VerifyError> {
    if let Some(value) = super::super::optional_header(rq.headers, HUBSPOT_V3)? {
        let tag = base64::engine::general_purpose::STANDARD_PAD_INDIFFERENT
            .decode(value)
            .map_err(|_| malformed(HUBSPOT_V3, MalformedReason::BadBase64))?;
        let raw = super::super::required_header(rq.headers, HUBSPOT_TIMESTAMP)?;
        let ms = super::super::parse_timestamp(HUBSPOT_TIMESTAMP, raw)?;
        let uri = super::super::percent_decode(&verifier.url_of(rq.query));
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
        verifier.check_window(secs, now, super::super::rule::Window::PastOnly)?;
        return Ok(Verdict {
            secret_index: Some(index),
            timestamp: Some(secs),
        });
    }
    let value = super::super::required_header(rq.headers, HUBSPOT_LEGACY)?;
    let tag = super::super::decode_signature(HUBSPOT_LEGACY, value, Encoding::Hex)?;
    let version = super::super::optional_header(rq.headers, HUBSPOT_VERSION)?.unwrap_or("v1");
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

fn hubspot_sign(
    verifier: &Verifier,
    rq: &Request<'_>,
    now: i64,
) -> Result<Vec<(String, String)>, String> {
    let ms = (now * 1000).to_string();
    let uri = super::super::percent_decode(&verifier.url_of(rq.query));
    let tag = verifier.sign_hmac(
        HmacAlgorithm::Sha256,
        &[rq.method.as_bytes(), uri.as_bytes(), rq.body, ms.as_bytes()],
    )?;
    Ok(vec![
        (HUBSPOT_TIMESTAMP.to_owned(), ms),
        (
            HUBSPOT_V3.to_owned(),
            super::super::encode_signature(&tag, Encoding::Base64),
        ),
    ])
}

#[cfg(test)]
mod tests {
    #[test]
    fn percent_decoding_keeps_bad_escapes() {
        assert_eq!(
            super::super::super::percent_decode("a%20b%zz%4"),
            "a b%zz%4"
        );
    }
}
