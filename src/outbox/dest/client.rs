//! The HTTP client of one forward action: its agent (with the action's
//! TLS settings), its headers and its auth, shared by every worker and by
//! the action's `check` requests. An OAuth2 token is fetched once and
//! shared until shortly before it expires (within the last 10% of its
//! life, at most 60 s before), or until a downstream's 401 renews it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;

use crate::config::dest::{HttpAuth, HttpOptions, OAuth2, TlsSettings};
use crate::config::{ActionKind, Config, Forward};
use crate::verify::Secret;

/// A token endpoint's failure: the attempt is a retry with error kind
/// `auth`. The message never contains a credential or a token.
#[derive(Debug)]
pub struct AuthFailure(pub String);

/// What a request was authorized with: the token's generation when it was
/// an OAuth2 token (a 401 renews that one, not a newer one).
pub type Used = Option<u64>;

pub struct HttpClient {
    pub agent: ureq::Agent,
    headers: Vec<(String, Secret)>,
    auth: ClientAuth,
    timeout: Duration,
}

enum ClientAuth {
    None,
    /// The whole `Authorization` value.
    Basic(Secret),
    OAuth2(Box<OAuth2>, Mutex<Slot>),
}

#[derive(Default)]
struct Slot {
    token: Option<Token>,
    generation: u64,
}

struct Token {
    value: Secret,
    renew_at: Instant,
}

/// How long before its `expires_in` a token is renewed: the last 10% of
/// its life, at most 60 s.
pub fn renew_margin(life: Duration) -> Duration {
    (life / 10).min(Duration::from_secs(60))
}

impl HttpClient {
    /// The client of `fwd`, over `shared` (the plain agent) unless the
    /// action has TLS settings of its own.
    pub fn new(fwd: &Forward, shared: &ureq::Agent, workers: usize) -> HttpClient {
        let HttpOptions { headers, auth, tls } = &fwd.http;
        let agent = match tls {
            Some(tls) => super::super::agent_with_tls(workers, Some(tls_config(tls))),
            None => shared.clone(),
        };
        let auth = match auth {
            None => ClientAuth::None,
            Some(HttpAuth::Basic(userpass)) => ClientAuth::Basic(Secret::new(format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(userpass.expose())
            ))),
            Some(HttpAuth::OAuth2(o)) => {
                ClientAuth::OAuth2(Box::new(o.clone()), Mutex::new(Slot::default()))
            }
        };
        HttpClient {
            agent,
            headers: headers.clone(),
            auth,
            timeout: fwd.timeout,
        }
    }

    /// True when a 401 may be answered by renewing the token.
    pub fn renews(&self) -> bool {
        matches!(self.auth, ClientAuth::OAuth2(..))
    }

    /// Adds the action's headers and its `Authorization` to `request`.
    pub fn prepare<B>(
        &self,
        mut request: ureq::RequestBuilder<B>,
    ) -> Result<(ureq::RequestBuilder<B>, Used), AuthFailure> {
        for (name, value) in &self.headers {
            request = request.header(name.as_str(), value.expose());
        }
        match &self.auth {
            ClientAuth::None => Ok((request, None)),
            ClientAuth::Basic(value) => Ok((request.header("Authorization", value.expose()), None)),
            ClientAuth::OAuth2(o, slot) => {
                let mut slot = slot.lock().unwrap_or_else(|p| p.into_inner());
                let fresh = slot
                    .token
                    .as_ref()
                    .is_some_and(|t| Instant::now() < t.renew_at);
                if !fresh {
                    slot.token = None;
                    let token = self.fetch(o)?;
                    slot.generation += 1;
                    slot.token = Some(token);
                }
                let generation = slot.generation;
                let value = match &slot.token {
                    Some(t) => format!("Bearer {}", t.value.expose()),
                    None => return Err(AuthFailure("no token".to_string())),
                };
                Ok((request.header("Authorization", value), Some(generation)))
            }
        }
    }

    /// The downstream answered 401 to a request made with `used`: the
    /// token is dropped (unless another worker has renewed it since), so
    /// the next [`HttpClient::prepare`] fetches a new one.
    pub fn renew(&self, used: Used) {
        if let (ClientAuth::OAuth2(_, slot), Some(used)) = (&self.auth, used) {
            let mut slot = slot.lock().unwrap_or_else(|p| p.into_inner());
            if slot.generation == used {
                slot.token = None;
            }
        }
    }

    /// RFC 6749 4.4: `grant_type=client_credentials` (and the scope),
    /// client id and secret in HTTP Basic (form-encoded, 2.3.1).
    fn fetch(&self, o: &OAuth2) -> Result<Token, AuthFailure> {
        let enc = |s: &str| form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
        let basic = base64::engine::general_purpose::STANDARD.encode(format!(
            "{}:{}",
            enc(&o.client_id),
            enc(o.client_secret.expose())
        ));
        let mut form = form_urlencoded::Serializer::new(String::new());
        form.append_pair("grant_type", "client_credentials");
        if let Some(scope) = &o.scope {
            form.append_pair("scope", scope);
        }
        let asked_at = Instant::now();
        let answer = self
            .agent
            .post(&o.token_url)
            .config()
            .timeout_global(Some(self.timeout))
            .timeout_connect(Some(self.timeout.min(Duration::from_secs(5))))
            .build()
            .header("Authorization", format!("Basic {basic}"))
            .header("Content-Type", "application/x-www-form-urlencoded")
            .header("Accept", "application/json")
            .send(form.finish().as_bytes());
        let mut response = match answer {
            Ok(r) => r,
            Err(e) => {
                let (_, message) = crate::outbox::retry::classify_error(&e);
                return Err(AuthFailure(format!("the token endpoint: {message}")));
            }
        };
        let status = response.status().as_u16();
        let body = response
            .body_mut()
            .with_config()
            .limit(64 * 1024)
            .read_to_vec()
            .unwrap_or_default();
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        if status != 200 {
            // The error code is RFC 6749 5.2's, never a credential.
            let code = json
                .get("error")
                .and_then(|v| v.as_str())
                .filter(|c| c.len() <= 64 && c.bytes().all(|b| b.is_ascii_graphic()))
                .map_or(String::new(), |c| format!(" ({c})"));
            return Err(AuthFailure(format!(
                "the token endpoint answered {status}{code}"
            )));
        }
        let Some(value) = json
            .get("access_token")
            .and_then(|v| v.as_str())
            .filter(|v| !v.is_empty())
        else {
            return Err(AuthFailure(
                "the token endpoint's answer has no access_token".to_string(),
            ));
        };
        if value.bytes().any(|b| b.is_ascii_control()) {
            return Err(AuthFailure(
                "the token endpoint's access_token is not a header value".to_string(),
            ));
        }
        // Without expires_in the token is kept for an hour (or until a 401).
        let life = json
            .get("expires_in")
            .and_then(|v| v.as_f64().or_else(|| v.as_str()?.parse().ok()))
            .filter(|s| s.is_finite() && *s >= 0.0)
            .map_or(Duration::from_secs(3600), |s| {
                Duration::from_secs_f64(s.min(1e9))
            });
        Ok(Token {
            value: Secret::new(value.to_string()),
            renew_at: asked_at + life - renew_margin(life),
        })
    }
}

/// The action's TLS: its CA trusted besides the system's bundle, its
/// client certificate presented.
fn tls_config(tls: &TlsSettings) -> ureq::tls::TlsConfig {
    let mut builder = ureq::tls::TlsConfig::builder();
    if !tls.ca.is_empty() {
        let mut roots = tls.ca.clone();
        roots.extend(system_roots());
        builder = builder.root_certs(ureq::tls::RootCerts::new_with_certs(&roots));
    }
    if let Some((chain, key)) = &tls.client {
        builder = builder.client_cert(Some(ureq::tls::ClientCert::new_with_certs(
            chain,
            key.to_owned(),
        )));
    }
    builder.build()
}

/// The system's CA bundle (Debian's, or the `SSL_CERT_FILE`), if readable.
fn system_roots() -> Vec<ureq::tls::Certificate<'static>> {
    let path = std::env::var("SSL_CERT_FILE")
        .unwrap_or_else(|_| "/etc/ssl/certs/ca-certificates.crt".to_string());
    let Ok(pem) = std::fs::read(path) else {
        return Vec::new();
    };
    ureq::tls::parse_pem(&pem)
        .filter_map(|item| match item {
            Ok(ureq::tls::PemItem::Certificate(c)) => Some(c),
            _ => None,
        })
        .collect()
}

/// The HTTP clients of every HTTP forward action, by (source, action),
/// for `workers` threads: actions without headers, auth or TLS share one
/// agent.
pub fn clients(config: &Config, workers: usize) -> HashMap<(String, String), Arc<HttpClient>> {
    let shared = super::super::http_agent(workers);
    let mut out = HashMap::new();
    for s in &config.sources {
        for a in &s.actions {
            if let ActionKind::Forward(f) = &a.kind
                && f.is_http()
            {
                out.insert(
                    (s.name.clone(), a.name.clone()),
                    Arc::new(HttpClient::new(f, &shared, workers)),
                );
            }
        }
    }
    out
}
