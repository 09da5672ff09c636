//! Forward destinations over HTTP with what the team's app expects, through
//! the real binary, on both backends: `headers` and Basic `auth` on attempts
//! and checks (never printed); OAuth2 client credentials against a real
//! token endpoint on 127.0.0.1 (one token shared, a 401 renews it and
//! resends within the same attempt, a failing endpoint is a retry with
//! error kind `auth`); mutual TLS against a TLS server on 127.0.0.1 that
//! requires a client certificate (a CA, server and client certificates
//! made at test time).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;

use crate::backend::{Backend, both_backends};
use crate::downstream::{Behavior, Downstream};
use crate::harness::{Server, ServerConfig, wait_until};
use crate::sign;

const SECRET: &str = "whsec_it_dest_0123456789";
const WAIT: Duration = Duration::from_secs(30);

fn source(action: &str) -> ServerConfig {
    ServerConfig::new()
        .set("forward_workers", "3")
        .tables(&format!(
            "[sources.shop]\nkind = \"stripe\"\nsecrets = [\"{SECRET}\"]\n\
         [[sources.shop.actions]]\n{action}\n"
        ))
}

fn send(server: &Server, id: &str) {
    let body = serde_json::json!({"id": id, "type": "invoice.paid"})
        .to_string()
        .into_bytes();
    let r = server.post("/hooks/shop", &sign::stripe_now(SECRET, &body), &body);
    assert_eq!(r.status, 200, "{}", r.text());
}

fn key(id: &str, action: &str) -> String {
    format!("shop:{id}:{action}")
}

fn job_status(server: &Server, id: &str) -> String {
    crate::helpers::job_status(server, "shop", id, "app").unwrap_or_default()
}

/// Every place a secret could show: the logs, `check`, `events show`.
fn printed(server: &Server, id: &str) -> String {
    let check = server.run_cli(&["check"]);
    let show = server.run_cli(&["events", "show", "shop", id, "--json"]);
    format!(
        "{}\n{}{}\n{}{}",
        server.logs(),
        check.stdout,
        check.stderr,
        show.stdout,
        show.stderr
    )
}

/// Headers and Basic auth reach the downstream with every attempt and
/// with the check before a resend; `check` lists them `[REDACTED]`; no
/// value reaches a log line or `events show`.
fn headers_and_basic_auth_on_attempts_and_checks(backend: Backend) {
    let ds = Downstream::start();
    let action = format!(
        "name = \"app\"\nforward = \"{}/in\"\ntimeout = \"1s\"\nlease = \"3s\"\n\
         retry_initial = \"100ms\"\nretry_max = \"200ms\"\ncheck = \"{}\"\n\
         headers = {{ \"X-Tenant\" = \"env:TENANT\", \"X-Static\" = \"static-value-77\" }}\n\
         auth = {{ basic = \"env:APP_BASIC\" }}",
        ds.url(),
        ds.check_template()
    );
    let server = Server::start_on(
        backend,
        &source(&action),
        &[
            ("TENANT", "tenant-secret-4242"),
            ("APP_BASIC", "appuser:basic-pw-9191"),
        ],
    );
    // Processed, then the connection dropped: the next attempt asks first.
    ds.script(&key("evt_h1", "app"), Behavior::ProcessThenDrop(1));
    send(&server, "evt_h1");
    wait_until(WAIT, "the job is done", || {
        job_status(&server, "evt_h1") == "done"
    });
    let basic = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode("appuser:basic-pw-9191")
    );
    let requests = ds.requests_for(&key("evt_h1", "app"));
    assert!(requests.iter().any(|r| r.is_check()), "a check was asked");
    assert!(requests.len() >= 2, "{requests:?}");
    for r in &requests {
        assert_eq!(r.header("X-Tenant"), Some("tenant-secret-4242"), "{r:?}");
        assert_eq!(r.header("X-Static"), Some("static-value-77"), "{r:?}");
        assert_eq!(r.header("Authorization"), Some(basic.as_str()), "{r:?}");
    }
    assert_eq!(ds.effects(&key("evt_h1", "app")), 1);
    let out = printed(&server, "evt_h1");
    assert!(out.contains("X-Tenant: [REDACTED]"), "{out}");
    assert!(out.contains("auth basic [REDACTED]"), "{out}");
    for secret in [
        "tenant-secret-4242",
        "static-value-77",
        "basic-pw-9191",
        &basic,
    ] {
        assert!(!out.contains(secret), "{secret} printed:\n{out}");
    }
}
both_backends!(headers_and_basic_auth_on_attempts_and_checks);

/// A token endpoint (RFC 6749 4.4) and a downstream that accepts only the
/// endpoint's latest token, both on 127.0.0.1.
struct OAuth {
    token_url: String,
    url: String,
    state: Arc<OAuthState>,
}

#[derive(Default)]
struct OAuthState {
    /// Tokens issued so far.
    issued: AtomicUsize,
    /// The token the downstream accepts (None: revoked).
    valid: Mutex<Option<String>>,
    /// The token endpoint answers 503.
    failing: AtomicBool,
    /// Token requests refused for their client credentials or grant.
    bad_token_requests: AtomicUsize,
    /// Downstream requests: (Idempotency-Key, X-Idemhook-Attempt, accepted).
    requests: Mutex<Vec<(String, String, bool)>>,
    /// The `expires_in` of the tokens issued (0: 3600).
    expires_in: std::sync::atomic::AtomicU64,
}

const CLIENT_SECRET: &str = "client-secret-5150";

impl OAuth {
    fn start() -> OAuth {
        let token = tiny_http::Server::http("127.0.0.1:0").expect("token endpoint");
        let app = tiny_http::Server::http("127.0.0.1:0").expect("downstream");
        let token_url = format!(
            "http://{}/oauth/token",
            token.server_addr().to_ip().unwrap()
        );
        let url = format!("http://{}/in", app.server_addr().to_ip().unwrap());
        let state = Arc::new(OAuthState::default());
        let s = state.clone();
        std::thread::spawn(move || {
            let expected = format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD
                    .encode(format!("idemhook:{CLIENT_SECRET}"))
            );
            for mut rq in token.incoming_requests() {
                let mut body = String::new();
                let _ = rq.as_reader().read_to_string(&mut body);
                let auth = header(&rq, "Authorization");
                if s.failing.load(Ordering::SeqCst) {
                    let _ = rq.respond(
                        tiny_http::Response::from_string(r#"{"error":"temporarily_unavailable"}"#)
                            .with_status_code(503),
                    );
                    continue;
                }
                if auth.as_deref() != Some(expected.as_str())
                    || body != "grant_type=client_credentials&scope=webhooks"
                {
                    s.bad_token_requests.fetch_add(1, Ordering::SeqCst);
                    let _ = rq.respond(
                        tiny_http::Response::from_string(r#"{"error":"invalid_client"}"#)
                            .with_status_code(401),
                    );
                    continue;
                }
                let n = s.issued.fetch_add(1, Ordering::SeqCst) + 1;
                let value = format!("tok-secret-{n}-{}", fastrand::u64(..));
                *s.valid.lock().unwrap() = Some(value.clone());
                let _ = rq.respond(tiny_http::Response::from_string(
                    serde_json::json!({"access_token": value, "token_type": "Bearer",
                        "expires_in": match s.expires_in.load(Ordering::SeqCst) { 0 => 3600, n => n }})
                        .to_string(),
                ));
            }
        });
        let s = state.clone();
        std::thread::spawn(move || {
            for mut rq in app.incoming_requests() {
                let mut body = Vec::new();
                let _ = rq.as_reader().read_to_end(&mut body);
                let valid = s.valid.lock().unwrap().clone();
                let ok = valid
                    .is_some_and(|v| header(&rq, "Authorization") == Some(format!("Bearer {v}")));
                s.requests.lock().unwrap().push((
                    header(&rq, "Idempotency-Key").unwrap_or_default(),
                    header(&rq, "X-Idemhook-Attempt").unwrap_or_default(),
                    ok,
                ));
                let _ = rq.respond(tiny_http::Response::empty(if ok { 200 } else { 401 }));
            }
        });
        OAuth {
            token_url,
            url,
            state,
        }
    }

    /// (attempt header, accepted) of each request for `key`.
    fn requests_for(&self, key: &str) -> Vec<(String, bool)> {
        self.state
            .requests
            .lock()
            .unwrap()
            .iter()
            .filter(|(k, _, _)| k == key)
            .map(|(_, n, ok)| (n.clone(), *ok))
            .collect()
    }

    fn issued(&self) -> usize {
        self.state.issued.load(Ordering::SeqCst)
    }
}

fn header(rq: &tiny_http::Request, name: &str) -> Option<String> {
    rq.headers()
        .iter()
        .find(|h| h.field.as_str().as_str().eq_ignore_ascii_case(name))
        .map(|h| h.value.as_str().to_string())
}

/// One token shared by the workers; a 401 renews it and resends within the
/// same attempt; a failing token endpoint makes the attempt a retry with
/// error kind `auth`, and the job is delivered once the endpoint is back.
fn oauth2_client_credentials(backend: Backend) {
    let oauth = OAuth::start();
    let action = format!(
        "name = \"app\"\nforward = \"{}\"\ntimeout = \"2s\"\nretry_initial = \"100ms\"\nretry_max = \"300ms\"\n\
         auth = {{ oauth2 = {{ token_url = \"{}\", client_id = \"idemhook\", client_secret = \"env:CLIENT_SECRET\", scope = \"webhooks\" }} }}",
        oauth.url, oauth.token_url
    );
    let server = Server::start_on(
        backend,
        &source(&action),
        &[("CLIENT_SECRET", CLIENT_SECRET)],
    );
    let ids: Vec<String> = (0..6).map(|i| format!("evt_o{i}")).collect();
    for id in &ids {
        send(&server, id);
    }
    wait_until(WAIT, "every job is done", || {
        ids.iter().all(|id| job_status(&server, id) == "done")
    });
    assert_eq!(oauth.issued(), 1, "one token, shared by the workers");
    assert_eq!(oauth.state.bad_token_requests.load(Ordering::SeqCst), 0);

    // Revoked: the downstream's 401 fetches a new token and resends, with
    // the same X-Idemhook-Attempt, as one attempt.
    *oauth.state.valid.lock().unwrap() = None;
    send(&server, "evt_renew");
    wait_until(WAIT, "the job is done", || {
        job_status(&server, "evt_renew") == "done"
    });
    assert_eq!(oauth.issued(), 2);
    assert_eq!(
        oauth.requests_for(&key("evt_renew", "app")),
        vec![("1".to_string(), false), ("1".to_string(), true)]
    );
    let attempts = |id: &str, extra: &str| {
        server.count(
            &format!(
                "SELECT count(*) FROM attempts a JOIN jobs j ON j.id = a.job_id \
                 WHERE j.source = 'shop' AND j.event_id = ?1{extra}"
            ),
            &[&id],
        )
    };
    assert_eq!(attempts("evt_renew", ""), 1, "the resend is not an attempt");

    // The token endpoint fails: retries with error kind auth, then done.
    oauth.state.failing.store(true, Ordering::SeqCst);
    *oauth.state.valid.lock().unwrap() = None;
    send(&server, "evt_down");
    wait_until(WAIT, "two attempts failed with auth", || {
        attempts(
            "evt_down",
            " AND a.error_kind = 'auth' AND a.outcome = 'retry'",
        ) >= 2
    });
    assert_eq!(job_status(&server, "evt_down"), "pending");
    oauth.state.failing.store(false, Ordering::SeqCst);
    wait_until(WAIT, "the job is done", || {
        job_status(&server, "evt_down") == "done"
    });
    assert_eq!(
        oauth
            .requests_for(&key("evt_down", "app"))
            .iter()
            .filter(|(_, ok)| *ok)
            .count(),
        1
    );
    let out = printed(&server, "evt_down");
    assert!(out.contains("client_secret [REDACTED]"), "{out}");
    assert!(!out.contains(CLIENT_SECRET), "{out}");
    assert!(!out.contains("tok-secret-"), "a token printed:\n{out}");
}
both_backends!(oauth2_client_credentials);

/// A CA, and a server certificate for 127.0.0.1 and a client certificate
/// it signed, PEM.
struct Pki {
    ca: String,
    server: (String, String),
    client: (String, String),
}

fn pki() -> Pki {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_key = KeyPair::generate().unwrap();
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let leaf = |names: Vec<String>| {
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(names)
            .unwrap()
            .signed_by(&key, &issuer)
            .unwrap();
        (cert.pem(), key.serialize_pem())
    };
    Pki {
        ca: ca.pem(),
        server: leaf(vec!["127.0.0.1".to_string()]),
        client: leaf(vec!["idemhook-client".to_string()]),
    }
}

/// An HTTPS server on 127.0.0.1 that requires a client certificate signed
/// by the CA; answers 200 to a POST and counts the effects per key.
struct MtlsServer {
    url: String,
    effects: Arc<Mutex<Vec<String>>>,
}

fn mtls_server(pki: &Pki) -> MtlsServer {
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
    let ca = CertificateDer::from_pem_slice(pki.ca.as_bytes()).unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca).unwrap();
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        Arc::new(rustls::crypto::ring::default_provider()),
    )
    .build()
    .unwrap();
    let chain = vec![CertificateDer::from_pem_slice(pki.server.0.as_bytes()).unwrap()];
    let key = PrivateKeyDer::from_pem_slice(pki.server.1.as_bytes()).unwrap();
    let config = Arc::new(
        rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .unwrap(),
    );
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("https://{}/in", listener.local_addr().unwrap());
    let effects = Arc::new(Mutex::new(Vec::new()));
    let recorded = effects.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let config = config.clone();
            let recorded = recorded.clone();
            std::thread::spawn(move || {
                let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
                let Ok(conn) = rustls::ServerConnection::new(config) else {
                    return;
                };
                let mut tls = rustls::StreamOwned::new(conn, stream);
                let mut reader = BufReader::new(&mut tls);
                let (mut length, mut key) = (0usize, String::new());
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 {
                        return; // handshake refused or closed
                    }
                    let line = line.trim_end();
                    if line.is_empty() {
                        break;
                    }
                    if let Some((name, value)) = line.split_once(':') {
                        match name.to_ascii_lowercase().as_str() {
                            "content-length" => length = value.trim().parse().unwrap_or(0),
                            "idempotency-key" => key = value.trim().to_string(),
                            _ => {}
                        }
                    }
                }
                let mut body = vec![0; length];
                if reader.read_exact(&mut body).is_err() {
                    return;
                }
                {
                    let mut effects = recorded.lock().unwrap();
                    if !effects.contains(&key) {
                        effects.push(key);
                    }
                }
                let _ = tls.write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                );
                let _ = tls.flush();
                tls.conn.send_close_notify();
                let _ = tls.flush();
            });
        }
    });
    MtlsServer { url, effects }
}

/// With `tls_ca` and a client certificate the job is delivered to a
/// server that requires one; an action that trusts the CA but has no
/// client certificate is refused in the handshake and retried.
fn mutual_tls(backend: Backend) {
    let pki = pki();
    let server_tls = mtls_server(&pki);
    let config = ServerConfig::new().set("forward_workers", "2").tables(&format!(
        "[sources.shop]\nkind = \"stripe\"\nsecrets = [\"{SECRET}\"]\n\
         [[sources.shop.actions]]\nname = \"app\"\nforward = \"{url}\"\ntimeout = \"2s\"\n\
         retry_initial = \"100ms\"\nretry_max = \"300ms\"\ncircuit_failures = 0\n\
         tls_ca = \"env:TLS_CA\"\ntls_client_cert = \"env:TLS_CERT\"\ntls_client_key = \"env:TLS_KEY\"\n\
         [[sources.shop.actions]]\nname = \"nocert\"\nforward = \"{url}\"\ntimeout = \"2s\"\n\
         retry_initial = \"100ms\"\nretry_max = \"300ms\"\ncircuit_failures = 0\ntls_ca = \"env:TLS_CA\"\n",
        url = server_tls.url
    ));
    let server = Server::start_on(
        backend,
        &config,
        &[
            ("TLS_CA", pki.ca.as_str()),
            ("TLS_CERT", pki.client.0.as_str()),
            ("TLS_KEY", pki.client.1.as_str()),
        ],
    );
    send(&server, "evt_tls");
    wait_until(WAIT, "the mTLS job is done", || {
        job_status(&server, "evt_tls") == "done"
    });
    assert_eq!(
        *server_tls.effects.lock().unwrap(),
        vec![key("evt_tls", "app")]
    );
    wait_until(WAIT, "the job without a certificate failed twice", || {
        server.count(
            "SELECT count(*) FROM attempts a JOIN jobs j ON j.id = a.job_id \
             WHERE j.action = 'nocert' AND a.outcome = 'retry'",
            &[],
        ) >= 2
    });
    assert_eq!(
        crate::helpers::job_status(&server, "shop", "evt_tls", "nocert").as_deref(),
        Some("pending")
    );
    let out = printed(&server, "evt_tls");
    assert!(out.contains("client certificate (key [REDACTED])"), "{out}");
    let key_body: String = pki.client.1.lines().nth(1).unwrap_or("").to_string();
    assert!(!out.contains(&key_body), "the client key printed:\n{out}");
}
both_backends!(mutual_tls);

/// A token is renewed before it expires (within the last 10% of its
/// life): with `expires_in` 2 s, a job sent after 2 s gets a new token
/// without a 401 first.
#[test]
fn an_oauth2_token_is_renewed_before_it_expires() {
    let oauth = OAuth::start();
    oauth.state.expires_in.store(2, Ordering::SeqCst);
    let action = format!(
        "name = \"app\"\nforward = \"{}\"\ntimeout = \"2s\"\nretry_initial = \"100ms\"\nretry_max = \"300ms\"\n\
         auth = {{ oauth2 = {{ token_url = \"{}\", client_id = \"idemhook\", client_secret = \"env:CLIENT_SECRET\", scope = \"webhooks\" }} }}",
        oauth.url, oauth.token_url
    );
    let server = Server::start(&source(&action), &[("CLIENT_SECRET", CLIENT_SECRET)]);
    send(&server, "evt_t1");
    wait_until(WAIT, "the first job is done", || {
        job_status(&server, "evt_t1") == "done"
    });
    assert_eq!(oauth.issued(), 1);
    // Past 90% of the token's life (1.8 s): the next request renews it.
    std::thread::sleep(Duration::from_millis(2_000));
    send(&server, "evt_t2");
    wait_until(WAIT, "the second job is done", || {
        job_status(&server, "evt_t2") == "done"
    });
    assert_eq!(oauth.issued(), 2, "renewed before it expired");
    assert_eq!(
        oauth.requests_for(&key("evt_t2", "app")),
        vec![("1".to_string(), true)],
        "no 401 first"
    );
}
