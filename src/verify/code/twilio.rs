//! Twilio: its URL with the sorted form parameters (or `bodySHA256`),
//! which no rule can say.

use base64::Engine as _;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq as _;

use super::super::{
    Encoding, HmacAlgorithm, MalformedReason, Request, Verdict, Verifier, VerifyError, malformed,
};
use super::Code;

pub(super) struct Twilio;

impl Code for Twilio {
    fn kind(&self) -> &'static str {
        "twilio"
    }
    fn describe(&self) -> &'static str {
        "X-Twilio-Signature: base64 HMAC-SHA1 (SHA-256 with the signature settings) of public_url + query + sorted form fields, or of the URL with bodySHA256"
    }
    fn verify(
        &self,
        verifier: &Verifier,
        rq: &Request<'_>,
        _now: i64,
    ) -> Result<Verdict, VerifyError> {
        twilio_verify(verifier, rq)
    }
    fn sign(
        &self,
        verifier: &Verifier,
        rq: &Request<'_>,
        _now: i64,
        _id: &str,
    ) -> Result<Vec<(String, String)>, String> {
        twilio_sign(verifier, rq)
    }
    fn covers_url(&self) -> bool {
        true
    }
}

const TWILIO_SIGNATURE: &str = "X-Twilio-Signature";
const TWILIO_SETTINGS: &str = "X-Twilio-Webhooks-Signature-Settings";

/// Twilio (`RequestValidator`): base64 HMAC-SHA1 (or SHA-256, with the
/// signature settings header) of the URL followed by every POST
/// parameter, names sorted, each name's distinct values sorted, as
/// name+value. A JSON body is signed through the URL's `bodySHA256`
/// (hex SHA-256 of the body), which must match. Twilio signs the URL
/// with or without the default port; both are tried.
fn twilio_verify(verifier: &Verifier, rq: &Request<'_>) -> Result<Verdict, VerifyError> {
    let value = super::super::required_header(rq.headers, TWILIO_SIGNATURE)?;
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

fn twilio_sign(verifier: &Verifier, rq: &Request<'_>) -> Result<Vec<(String, String)>, String> {
    let url = verifier.url_of(rq.query);
    let params = twilio_params(rq, &url).map_err(|e| e.to_string())?;
    let content = twilio_content(&url, &params);
    let tag = verifier.sign_hmac(HmacAlgorithm::Sha1, &[content.as_bytes()])?;
    Ok(vec![(
        TWILIO_SIGNATURE.to_owned(),
        super::super::encode_signature(&tag, Encoding::Base64),
    )])
}

fn twilio_algorithm(headers: &[(String, String)]) -> Result<HmacAlgorithm, VerifyError> {
    Ok(
        match super::super::optional_header(headers, TWILIO_SETTINGS)? {
            Some(settings) if settings.to_ascii_uppercase().contains("HMAC_SHA256") => {
                HmacAlgorithm::Sha256
            }
            _ => HmacAlgorithm::Sha1,
        },
    )
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
}
