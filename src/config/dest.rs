//! What an HTTP forward carries besides its body: `headers` (secret
//! values), `auth` (Basic or OAuth2 client credentials) and TLS (`tls_ca`,
//! `tls_client_cert` + `tls_client_key`). Every value is a secret spec
//! (literal, `env:`, `file:`); none of them is ever printed.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use ureq::tls::{Certificate, PrivateKey};

use super::raw::RawAction;
use super::values::resolve_secret;
use crate::verify::Secret;

/// Headers, auth and TLS of one HTTP forward action.
#[derive(Debug, Clone, Default)]
pub struct HttpOptions {
    /// Sent with every attempt and check, after the action's own headers.
    pub headers: Vec<(String, Secret)>,
    pub auth: Option<HttpAuth>,
    pub tls: Option<Arc<TlsSettings>>,
}

impl HttpOptions {
    /// True when nothing is set (the action shares the default client).
    pub fn is_plain(&self) -> bool {
        self.headers.is_empty() && self.auth.is_none() && self.tls.is_none()
    }
}

#[derive(Debug, Clone)]
pub enum HttpAuth {
    /// `user:password`, sent as `Authorization: Basic ..`.
    Basic(Secret),
    OAuth2(OAuth2),
}

/// OAuth2 client credentials (RFC 6749 4.4).
#[derive(Debug, Clone)]
pub struct OAuth2 {
    pub token_url: String,
    pub client_id: String,
    pub client_secret: Secret,
    pub scope: Option<String>,
}

/// Parsed TLS material of an action (its CA, its client certificate and
/// key). `Debug` prints no key.
pub struct TlsSettings {
    pub ca: Vec<Certificate<'static>>,
    pub client: Option<(Vec<Certificate<'static>>, PrivateKey<'static>)>,
}

impl fmt::Debug for TlsSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsSettings")
            .field("ca", &self.ca.len())
            .field("client", &self.client.as_ref().map(|_| "[REDACTED]"))
            .finish()
    }
}

/// Whether `name` is a header an action may not set: the key and our own.
pub fn reserved_header(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    lower == "idempotency-key" || lower.starts_with("x-idemhook-")
}

/// `headers`, `auth`, `tls_ca`, `tls_client_cert`, `tls_client_key` of a
/// forward action; errors name the key and never contain a value.
pub(super) fn http_options(ra: &mut RawAction, base: &Path) -> Result<HttpOptions, String> {
    let mut headers = Vec::new();
    for (name, spec) in ra.headers.take().unwrap_or_default() {
        if name.is_empty() || !name.bytes().all(is_token_byte) {
            return Err(format!(
                "headers.{name}: not a valid HTTP header name (letters, digits and !#$%&'*+-.^_`|~)"
            ));
        }
        if reserved_header(&name) {
            return Err(format!(
                "headers.{name}: Idempotency-Key and the X-Idemhook-* headers are idemhook's own and cannot be set"
            ));
        }
        let value = resolve_secret(&spec, base).map_err(|e| format!("headers.{name}: {e}"))?;
        if value
            .expose()
            .bytes()
            .any(|b| b == b'\r' || b == b'\n' || b == 0)
        {
            return Err(format!(
                "headers.{name}: the value contains a line break or NUL"
            ));
        }
        headers.push((name, value));
    }
    let auth = match ra.auth.take() {
        None => None,
        Some(raw) => Some(auth_of(raw, base)?),
    };
    if auth.is_some()
        && let Some((name, _)) = headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case("authorization"))
    {
        return Err(format!(
            "headers.{name}: auth sets the Authorization header; set one or the other"
        ));
    }
    let tls = tls_of(ra, base)?;
    Ok(HttpOptions { headers, auth, tls })
}

fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

fn auth_of(raw: super::raw::RawAuth, base: &Path) -> Result<HttpAuth, String> {
    match (raw.basic, raw.oauth2) {
        (Some(_), Some(_)) => Err("auth: either basic or oauth2, not both".to_string()),
        (None, None) => Err(
            "auth: expected { basic = \"user:password\" } or { oauth2 = { token_url, client_id, client_secret, scope } }"
                .to_string(),
        ),
        (Some(spec), None) => {
            let value = resolve_secret(&spec, base).map_err(|e| format!("auth.basic: {e}"))?;
            if !value.expose().contains(':') {
                return Err("auth.basic: expected \"user:password\" (no ':' found)".to_string());
            }
            Ok(HttpAuth::Basic(value))
        }
        (None, Some(o)) => {
            if !(o.token_url.starts_with("http://") || o.token_url.starts_with("https://")) {
                return Err(format!(
                    "auth.oauth2.token_url: expected an http:// or https:// URL, got {:?}",
                    o.token_url
                ));
            }
            if o.client_id.is_empty() {
                return Err("auth.oauth2.client_id: empty".to_string());
            }
            let client_secret = resolve_secret(&o.client_secret, base)
                .map_err(|e| format!("auth.oauth2.client_secret: {e}"))?;
            Ok(HttpAuth::OAuth2(OAuth2 {
                token_url: o.token_url,
                client_id: o.client_id,
                client_secret,
                scope: o.scope.filter(|s| !s.is_empty()),
            }))
        }
    }
}

fn tls_of(ra: &mut RawAction, base: &Path) -> Result<Option<Arc<TlsSettings>>, String> {
    let ca = match ra.tls_ca.take() {
        None => Vec::new(),
        Some(spec) => {
            let pem = resolve_secret(&spec, base).map_err(|e| format!("tls_ca: {e}"))?;
            let certs = certificates(pem.expose()).map_err(|e| format!("tls_ca: {e}"))?;
            if certs.is_empty() {
                return Err("tls_ca: no PEM certificate found".to_string());
            }
            certs
        }
    };
    let client = match (ra.tls_client_cert.take(), ra.tls_client_key.take()) {
        (None, None) => None,
        (Some(_), None) => {
            return Err(
                "tls_client_cert: needs tls_client_key (the certificate's private key)".to_string(),
            );
        }
        (None, Some(_)) => {
            return Err(
                "tls_client_key: needs tls_client_cert (the certificate it is the key of)"
                    .to_string(),
            );
        }
        (Some(cert), Some(key)) => {
            let pem = resolve_secret(&cert, base).map_err(|e| format!("tls_client_cert: {e}"))?;
            let chain = certificates(pem.expose()).map_err(|e| format!("tls_client_cert: {e}"))?;
            if chain.is_empty() {
                return Err("tls_client_cert: no PEM certificate found".to_string());
            }
            let key = resolve_secret(&key, base).map_err(|e| format!("tls_client_key: {e}"))?;
            let key = PrivateKey::from_pem(key.expose().as_bytes()).map_err(|_| {
                "tls_client_key: no PEM private key found (PKCS#8, PKCS#1 or SEC1)".to_string()
            })?;
            Some((chain, key))
        }
    };
    if ca.is_empty() && client.is_none() {
        return Ok(None);
    }
    Ok(Some(Arc::new(TlsSettings { ca, client })))
}

/// The certificates of a PEM text (other items skipped).
fn certificates(pem: &str) -> Result<Vec<Certificate<'static>>, String> {
    let mut out = Vec::new();
    for item in ureq::tls::parse_pem(pem.as_bytes()) {
        match item {
            Ok(ureq::tls::PemItem::Certificate(c)) => out.push(c),
            Ok(_) => {}
            Err(e) => return Err(format!("not valid PEM: {e}")),
        }
    }
    Ok(out)
}

/// One line for `idemhook check`: header names, the auth's kind and TLS,
/// every value `[REDACTED]`; None when nothing is set.
pub fn describe(http: &HttpOptions) -> Option<String> {
    if http.is_plain() {
        return None;
    }
    let mut parts = Vec::new();
    if !http.headers.is_empty() {
        let names: Vec<String> = http
            .headers
            .iter()
            .map(|(n, v)| format!("{n}: {v}"))
            .collect();
        parts.push(format!("headers {}", names.join(", ")));
    }
    match &http.auth {
        None => {}
        Some(HttpAuth::Basic(v)) => parts.push(format!("auth basic {v}")),
        Some(HttpAuth::OAuth2(o)) => parts.push(format!(
            "auth oauth2 (token_url {}, client_id {}, client_secret {}{})",
            super::database_url::redact(&o.token_url),
            o.client_id,
            o.client_secret,
            o.scope
                .as_ref()
                .map_or(String::new(), |s| format!(", scope {s}"))
        )),
    }
    if let Some(tls) = &http.tls {
        if !tls.ca.is_empty() {
            parts.push(format!(
                "tls_ca {} certificate(s) besides the system's",
                tls.ca.len()
            ));
        }
        if tls.client.is_some() {
            parts.push("client certificate (key [REDACTED])".to_string());
        }
    }
    Some(parts.join("; "))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::super::{ActionKind, Config, Forward};
    use super::*;

    fn forward(extra: &str) -> Result<Forward, String> {
        let text = format!(
            "[sources.s]\nkind = \"none\"\nallow_unsigned = true\nkey = [\"json:/id\"]\n\
             [[sources.s.actions]]\nname = \"a\"\nforward = \"http://127.0.0.1:9/x\"\n{extra}\n"
        );
        let config =
            Config::parse(&text, "t.toml", Path::new("/tmp"), None).map_err(|e| e.to_string())?;
        match &config.sources[0].actions[0].kind {
            ActionKind::Forward(f) => Ok((**f).clone()),
            ActionKind::Sql { .. } => Err("not a forward".to_string()),
        }
    }

    #[test]
    fn headers_and_basic_auth_resolve_and_never_print() {
        let f = forward(
            "headers = { \"X-Tenant\" = \"acme-secret-value\" }\nauth = { basic = \"user:pw-secret\" }",
        )
        .unwrap();
        assert_eq!(f.http.headers.len(), 1);
        assert_eq!(f.http.headers[0].0, "X-Tenant");
        assert_eq!(f.http.headers[0].1.expose(), "acme-secret-value");
        let line = describe(&f.http).unwrap();
        assert!(line.contains("X-Tenant: [REDACTED]"), "{line}");
        assert!(line.contains("auth basic [REDACTED]"), "{line}");
        let debug = format!("{f:?}");
        for secret in ["acme-secret-value", "pw-secret"] {
            assert!(
                !line.contains(secret) && !debug.contains(secret),
                "{line} {debug}"
            );
        }
        assert!(describe(&forward("").unwrap().http).is_none());
    }

    #[test]
    fn bad_input_names_the_key() {
        for (extra, key) in [
            (
                "headers = { \"Idempotency-Key\" = \"x\" }",
                "headers.Idempotency-Key",
            ),
            (
                "headers = { \"x-idemhook-attempt\" = \"1\" }",
                "headers.x-idemhook-attempt",
            ),
            ("headers = { \"Bad Name\" = \"x\" }", "headers.Bad Name"),
            ("headers = { \"X-A\" = \"\" }", "headers.X-A"),
            ("tls_client_cert = \"file:c.pem\"", "tls_client_cert"),
            ("tls_client_key = \"file:c.key\"", "tls_client_key"),
            ("tls_ca = \"not a pem\"", "tls_ca"),
            ("auth = { basic = \"nocolon\" }", "auth.basic"),
            ("auth = {}", "auth"),
            (
                "auth = { oauth2 = { token_url = \"ftp://x\", client_id = \"i\", client_secret = \"s\" } }",
                "auth.oauth2.token_url",
            ),
            (
                "auth = { basic = \"u:p\" }\nheaders = { Authorization = \"Bearer x\" }",
                "headers.Authorization",
            ),
        ] {
            let err = forward(extra).expect_err(extra);
            assert!(err.contains(key), "{extra}: {err}");
        }
        // Only forward actions take them.
        let text = "[sources.s]\nkind = \"none\"\nallow_unsigned = true\nkey = [\"json:/id\"]\n\
             [[sources.s.actions]]\nname = \"a\"\nsql = \"SELECT 1\"\nheaders = { A = \"b\" }\n";
        let err = Config::parse(text, "t.toml", Path::new("/tmp"), None)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("headers: only forward actions"), "{err}");
    }

    #[test]
    fn a_token_is_renewed_in_the_last_tenth_of_its_life_at_most_a_minute_early() {
        use crate::outbox::dest::client::renew_margin;
        use std::time::Duration;
        assert_eq!(
            renew_margin(Duration::from_secs(100)),
            Duration::from_secs(10)
        );
        assert_eq!(
            renew_margin(Duration::from_secs(3600)),
            Duration::from_secs(60)
        );
        assert_eq!(renew_margin(Duration::ZERO), Duration::ZERO);
    }
}
