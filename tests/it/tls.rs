//! TLS on the listener (`tls_cert` / `tls_key`) with a real TLS client, and
//! the separate admin listener (`admin_listen`).

use std::time::Duration;

use crate::harness::{Server, ServerConfig, count, toml_str};
use crate::sign;

const SECRET: &str = "whsec_tls_test_secret";

fn stripe_table() -> &'static str {
    "[sources.pay]\nkind = \"stripe\"\nsecrets = [\"env:PAY_SECRET\"]\n"
}

/// A server with TLS on, its certificate self-signed for 127.0.0.1 and
/// localhost; and that certificate, PEM.
fn tls_server() -> (Server, String) {
    let certified =
        rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string(), "localhost".to_string()])
            .expect("generate a self-signed certificate");
    let cert_pem = certified.cert.pem();
    let key_pem = certified.signing_key.serialize_pem();
    let config = ServerConfig::new()
        .set("tls_cert", &toml_str("cert.pem"))
        .set("tls_key", &toml_str("key.pem"))
        .tables(stripe_table());
    let server = Server::start_with_files(
        &config,
        &[("PAY_SECRET", SECRET)],
        &[
            ("cert.pem", cert_pem.as_bytes()),
            ("key.pem", key_pem.as_bytes()),
        ],
    );
    (server, cert_pem)
}

#[test]
fn deliveries_over_tls_are_verified_and_stored() {
    let (server, cert_pem) = tls_server();
    assert!(
        server.base_url().starts_with("https://"),
        "{}",
        server.base_url()
    );

    let root =
        ureq::tls::Certificate::from_pem(cert_pem.as_bytes()).expect("parse our certificate");
    let tls = ureq::tls::TlsConfig::builder()
        .root_certs(ureq::tls::RootCerts::new_with_certs(&[root]))
        .build();
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .tls_config(tls)
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into();

    let body = br#"{"id":"evt_tls_1","type":"charge.succeeded"}"#;
    let mut request = agent.post(format!("{}/hooks/pay", server.base_url()));
    for (name, value) in sign::stripe_now(SECRET, body) {
        request = request.header(name, value);
    }
    let mut response = request.send(&body[..]).expect("POST over TLS");
    let status = response.status().as_u16();
    let text = response.body_mut().read_to_string().unwrap_or_default();
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("\"accepted\""), "{text}");
    assert_eq!(
        count(
            &server.db(),
            "SELECT count(*) FROM events WHERE event_id = 'evt_tls_1'",
            []
        ),
        1
    );

    // A second request on the same TLS connection (keep-alive) is a duplicate.
    let mut request = agent.post(format!("{}/hooks/pay", server.base_url()));
    for (name, value) in sign::stripe_now(SECRET, body) {
        request = request.header(name, value);
    }
    let mut response = request.send(&body[..]).expect("second POST over TLS");
    let text = response.body_mut().read_to_string().unwrap_or_default();
    assert!(text.contains("\"duplicate\""), "{text}");

    // Plain HTTP to the TLS port gets no HTTP answer.
    let plain = server.base_url().replacen("https://", "http://", 1);
    let result =
        crate::harness::Client::new(Duration::from_secs(3)).try_get(&format!("{plain}/healthz"));
    assert!(
        result.as_ref().map_or(true, |r| r.status != 200),
        "plain HTTP was answered on the TLS listener: {:?}",
        result.map(|r| r.status)
    );
}

/// `send` to the server's own TLS listener trusts the config's tls_cert
/// (here self-signed), so the development loop works with TLS on.
#[test]
fn send_trusts_the_configured_certificate_on_its_own_listener() {
    let (server, _) = tls_server();
    let base = server.base_url().to_string();
    let out = server.run_cli(&["send", "pay", "--url", &base, "--id", "evt_tls_send"]);
    assert!(out.success(), "{}\n{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("\"accepted\""), "{}", out.stdout);
    assert_eq!(
        count(
            &server.db(),
            "SELECT count(*) FROM events WHERE event_id = 'evt_tls_send'",
            []
        ),
        1
    );
}

#[test]
fn tls_config_needs_both_files() {
    let config = ServerConfig::new()
        .set("tls_cert", &toml_str("cert.pem"))
        .tables(stripe_table());
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("idemhook.toml");
    std::fs::write(&path, config.render()).expect("write config");
    let env = [("PAY_SECRET".to_string(), SECRET.to_string())]
        .into_iter()
        .collect();
    let args = [
        "check".to_string(),
        "--config".to_string(),
        path.display().to_string(),
    ];
    let out = crate::harness::run_binary(dir.path(), &env, &args, Duration::from_secs(30));
    assert!(!out.success(), "check accepted tls_cert without tls_key");
    assert!(out.stderr.contains("tls_key"), "{}", out.stderr);
}

#[test]
fn admin_listen_serves_the_admin_api_and_metrics_apart() {
    let config = ServerConfig::new()
        .set("admin_listen", &toml_str("127.0.0.1:0"))
        .set("admin_token", &toml_str("env:ADMIN_TOKEN"))
        .tables(stripe_table());
    let server = Server::start(
        &config,
        &[
            ("PAY_SECRET", SECRET),
            ("ADMIN_TOKEN", "t0ken-0123456789abcdef0123456789abcdef"),
        ],
    );
    let admin_line = server
        .stdout()
        .lines()
        .find(|l| l.contains("admin API and metrics on "))
        .map(str::to_string)
        .expect("the admin listener's address is printed");
    let admin = admin_line
        .split_whitespace()
        .last()
        .unwrap_or_default()
        .trim_end_matches('/')
        .to_string();
    let client = crate::harness::Client::new(Duration::from_secs(5));

    // The public listener takes hooks but not the admin surface.
    assert_eq!(server.get("/metrics").status, 404);
    assert_eq!(server.get("/api/reconcile").status, 404);
    assert_eq!(server.get("/healthz").status, 200);
    let body = br#"{"id":"evt_admin_1","type":"t"}"#;
    let r = server.post("/hooks/pay", &sign::stripe_now(SECRET, body), body);
    assert_eq!(r.status, 200, "{}", r.text());

    // The admin listener has metrics and the API, not hooks.
    let metrics = client.get(&format!("{admin}/metrics"));
    assert_eq!(metrics.status, 200);
    assert!(
        metrics
            .text()
            .contains("idemhook_deliveries_total{source=\"pay\",outcome=\"accepted\"} 1")
    );
    let unauth = client.get(&format!("{admin}/api/reconcile"));
    assert_eq!(unauth.status, 401);
    let r = client.post(
        &format!("{admin}/hooks/pay"),
        &sign::stripe_now(SECRET, body),
        body,
    );
    assert_eq!(r.status, 404);
}
