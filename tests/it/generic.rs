//! The generic kinds, configured by hand as a user would for a provider
//! idemhook does not name: each setting of `hmac` (Ed25519, ECDSA P-256,
//! base64url, secret_encoding, secret_normalize), `basic` and `token`
//! accepts a correctly signed delivery and stores it, and refuses forged,
//! tampered and stale ones with 401, storing nothing; batches on a generic
//! kind claim each item once; `answer = "empty"` answers without a body;
//! `send` signs for every setting. Signatures here are made independently
//! (HMAC by `sign`, Ed25519 and P-256 with the crates directly).

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD as B64, URL_SAFE_NO_PAD as B64URL};

use crate::backend::{Backend, both_backends};
use crate::harness::{HttpResponse, Server, ServerConfig, toml_str};
use crate::sign::{hmac_sha256, hmac_sha512};

type Headers = Vec<(String, String)>;

fn h(name: &str, value: impl Into<String>) -> (String, String) {
    (name.to_string(), value.into())
}

fn json_ct() -> (String, String) {
    h("Content-Type", "application/json")
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(0))
}

fn ed25519_key() -> ed25519_dalek::SigningKey {
    ed25519_dalek::SigningKey::from_bytes(&[0x11; 32])
}

fn ed25519_public_b64() -> String {
    B64.encode(ed25519_key().verifying_key().to_bytes())
}

fn ed25519_private_pem() -> String {
    use ed25519_dalek::pkcs8::EncodePrivateKey as _;
    ed25519_key()
        .to_pkcs8_pem(ed25519_dalek::pkcs8::spki::der::pem::LineEnding::LF)
        .expect("pem")
        .to_string()
}

fn p256_key() -> p256::ecdsa::SigningKey {
    p256::ecdsa::SigningKey::from_slice(&[0x22; 32]).expect("a P-256 scalar")
}

fn p256_public_pem() -> String {
    use p256::pkcs8::EncodePublicKey as _;
    p256_key()
        .verifying_key()
        .to_public_key_pem(p256::pkcs8::LineEnding::LF)
        .expect("pem")
}

fn p256_private_pem() -> String {
    use p256::pkcs8::EncodePrivateKey as _;
    p256_key()
        .to_pkcs8_pem(p256::pkcs8::LineEnding::LF)
        .expect("pem")
        .to_string()
}

const EASYPOST_SECRET: &str = "\u{fb01}le-secret-\u{c5}";
/// What EasyPost signs with: the secret NFKD-normalised ("ﬁ" is "fi", "Å" is
/// "A" and a combining ring).
const EASYPOST_NFKD: &str = "file-secret-A\u{30a}";
const B64URL_KEY: &[u8] = b"\x00\x01binary\xffkey\xfe";

fn tables() -> String {
    format!(
        r#"
[sources.paystack]
kind = "hmac"
secrets = ["sk_test_paystack"]
header = "x-paystack-signature"
algorithm = "sha512"
key = ["json:/event", "json:/data/id"]
type = "json:/event"

[sources.easypost]
kind = "hmac"
secrets = [{easypost}]
header = "X-Hmac-Signature"
prefix = "hmac-sha256-hex="
secret_normalize = "nfkd"
key = ["json:/id"]
type = "json:/description"

[sources.telnyx]
kind = "hmac"
secrets = [{telnyx}]
algorithm = "ed25519"
encoding = "base64"
header = "telnyx-signature-ed25519"
template = "{{timestamp}}|{{body}}"
timestamp_header = "telnyx-timestamp"
key = ["json:/data/id"]
type = "json:/data/event_type"

[sources.p256]
kind = "hmac"
secrets = [{p256}]
algorithm = "ecdsa-p256"
encoding = "base64"
header = "X-Signature"
key = ["json:/id"]
type = "json:/type"

[sources.b64url]
kind = "hmac"
secrets = [{b64url}]
secret_encoding = "base64"
encoding = "base64url"
header = "X-Sig"
key = ["json:/id"]
type = "json:/type"

[sources.chargebee]
kind = "basic"
secrets = ["cb_user:cb-pass-new", "cb_user:cb-pass-old"]
key = ["json:/id"]
type = "json:/event_type"

[sources.flutter]
kind = "token"
header = "verif-hash"
secrets = ["flw-hash-1"]
key = ["json:/data/id"]
type = "json:/event"

[sources.xero]
kind = "hmac"
secrets = ["xero-key"]
header = "x-xero-signature"
encoding = "base64"
batch = "json:/events"
item_key = ["json:/resourceId", "json:/eventDateUtc"]
item_type = "json:/eventType"
answer = "empty"

[sources.quiet]
kind = "token"
header = "Authorization"
prefix = "Bearer "
secrets = ["quiet-token"]
key = ["json:/id"]
answer = "empty"

[sources.strict]
kind = "token"
header = "X-Token"
secrets = ["strict-token"]
batch = "json:/items"
item_key = ["json:/id"]
empty_batch = "reject"
"#,
        easypost = toml_str(EASYPOST_SECRET),
        telnyx = toml_str(&ed25519_public_b64()),
        p256 = toml_str(&p256_public_pem()),
        b64url = toml_str(&B64.encode(B64URL_KEY)),
    )
}

/// How each source's provider signs `body` at `ts`; `forged` signs with
/// another key (or sends another password or token).
fn sign(source: &str, body: &[u8], ts: i64, forged: bool) -> Headers {
    use ed25519_dalek::Signer as _;
    let mut headers = vec![json_ct()];
    match source {
        "paystack" => {
            let key: &[u8] = if forged {
                b"sk_other"
            } else {
                b"sk_test_paystack"
            };
            headers.push(h(
                "x-paystack-signature",
                hex::encode(hmac_sha512(key, &[body])),
            ));
        }
        "easypost" => {
            // Forged: signed with the secret as written, not normalised.
            let key = if forged {
                EASYPOST_SECRET
            } else {
                EASYPOST_NFKD
            };
            let sig = hex::encode(hmac_sha256(key.as_bytes(), &[body]));
            headers.push(h("X-Hmac-Signature", format!("hmac-sha256-hex={sig}")));
        }
        "telnyx" => {
            let key = if forged {
                ed25519_dalek::SigningKey::from_bytes(&[0x12; 32])
            } else {
                ed25519_key()
            };
            let mut signed = format!("{ts}|").into_bytes();
            signed.extend_from_slice(body);
            headers.push(h("telnyx-timestamp", ts.to_string()));
            headers.push(h(
                "telnyx-signature-ed25519",
                B64.encode(key.sign(&signed).to_bytes()),
            ));
        }
        "p256" => {
            use p256::ecdsa::signature::Signer as _;
            let key = if forged {
                p256::ecdsa::SigningKey::from_slice(&[0x23; 32]).expect("scalar")
            } else {
                p256_key()
            };
            let sig: p256::ecdsa::Signature = key.sign(body);
            headers.push(h("X-Signature", B64.encode(sig.to_der().as_bytes())));
        }
        "b64url" => {
            let key: &[u8] = if forged { b"other" } else { B64URL_KEY };
            headers.push(h("X-Sig", B64URL.encode(hmac_sha256(key, &[body]))));
        }
        "chargebee" => {
            let pair = if forged {
                "cb_user:cb-pass-wrong"
            } else {
                "cb_user:cb-pass-old"
            };
            headers.push(h("Authorization", format!("Basic {}", B64.encode(pair))));
        }
        "flutter" => {
            headers.push(h(
                "verif-hash",
                if forged { "flw-hash-2" } else { "flw-hash-1" },
            ));
        }
        other => panic!("no signer for {other}"),
    }
    headers
}

/// A body each source's key and type rules read.
fn body_for(source: &str, id: &str) -> Vec<u8> {
    let v = match source {
        "paystack" => {
            serde_json::json!({"event": "charge.success", "data": {"id": id, "amount": 5000}})
        }
        "easypost" => {
            serde_json::json!({"id": id, "description": "tracker.updated", "object": "Event"})
        }
        "telnyx" => {
            serde_json::json!({"data": {"id": id, "event_type": "call.initiated", "record_type": "event"}})
        }
        "chargebee" => serde_json::json!({"id": id, "event_type": "subscription_created"}),
        "flutter" => serde_json::json!({"event": "charge.completed", "data": {"id": id}}),
        _ => serde_json::json!({"id": id, "type": "thing.happened"}),
    };
    serde_json::to_vec(&v).expect("json")
}

/// How many events `source` has stored.
fn events_of(server: &Server, source: &str) -> i64 {
    server.count(
        "SELECT count(*) FROM events WHERE source = ?1",
        &[&source.to_string()],
    )
}

fn post(server: &Server, source: &str, headers: &Headers, body: &[u8]) -> HttpResponse {
    server.post(&format!("/hooks/{source}"), headers, body)
}

const SETTINGS: [&str; 7] = [
    "paystack",
    "easypost",
    "telnyx",
    "p256",
    "b64url",
    "chargebee",
    "flutter",
];

fn each_generic_setting_stores_signed_and_refuses_forged_tampered_and_stale(backend: Backend) {
    let server = Server::start_on(
        backend,
        &backend.config(ServerConfig::new().tables(&tables())),
        &[],
    );
    for source in SETTINGS {
        let id = format!("{source}-1");
        let body = body_for(source, &id);

        // Forged (another key, password or token): 401, nothing stored.
        let forged = post(&server, source, &sign(source, &body, now(), true), &body);
        assert_eq!(forged.status, 401, "{source} forged: {}", forged.text());
        assert_eq!(
            events_of(&server, source),
            0,
            "{source}: a forged delivery was stored"
        );

        // Tampered: signed for one body, another sent. (A token or a
        // password signs no body: those kinds verify who sends, not what.)
        if source != "chargebee" && source != "flutter" {
            let tampered = body_for(source, &format!("{source}-evil"));
            let r = post(
                &server,
                source,
                &sign(source, &body, now(), false),
                &tampered,
            );
            assert_eq!(r.status, 401, "{source} tampered: {}", r.text());
            assert_eq!(
                events_of(&server, source),
                0,
                "{source}: a tampered body was stored"
            );
        }

        // Unsigned: 401.
        let r = post(&server, source, &vec![json_ct()], &body);
        assert_eq!(r.status, 401, "{source} unsigned: {}", r.text());

        // Genuine: stored under its id, with its type.
        let ok = post(&server, source, &sign(source, &body, now(), false), &body);
        assert_eq!(ok.status, 200, "{source}: {}", ok.text());
        assert_eq!(ok.json_status().as_deref(), Some("accepted"), "{source}");
        assert_eq!(events_of(&server, source), 1, "{source}");
        let again = post(&server, source, &sign(source, &body, now(), false), &body);
        assert_eq!(
            again.json_status().as_deref(),
            Some("duplicate"),
            "{source}"
        );
        assert_eq!(events_of(&server, source), 1, "{source}");
    }
    // Telnyx signs a timestamp: one older than the tolerance (5 min) is 401.
    let body = body_for("telnyx", "telnyx-stale");
    let stale = post(
        &server,
        "telnyx",
        &sign("telnyx", &body, now() - 400, false),
        &body,
    );
    assert_eq!(stale.status, 401, "{}", stale.text());
    assert!(stale.text().contains("timestamp"), "{}", stale.text());
    assert_eq!(events_of(&server, "telnyx"), 1);

    // Basic: a refusal says how to authenticate.
    let body = body_for("chargebee", "cb-2");
    for headers in [vec![json_ct()], sign("chargebee", &body, 0, true)] {
        let r = post(&server, "chargebee", &headers, &body);
        assert_eq!(r.status, 401);
        let challenge = r.header("www-authenticate").unwrap_or_default();
        assert!(challenge.starts_with("Basic"), "{:?}", r.headers);
    }
    // The key rotated: the new password verifies as the old one does.
    let mut headers = vec![json_ct()];
    headers.push(h(
        "Authorization",
        format!("Basic {}", B64.encode("cb_user:cb-pass-new")),
    ));
    assert_eq!(post(&server, "chargebee", &headers, &body).status, 200);
    assert_eq!(events_of(&server, "chargebee"), 2);
    // Other kinds send no challenge.
    let r = post(&server, "flutter", &vec![json_ct()], &body);
    assert_eq!(r.status, 401);
    assert!(r.header("www-authenticate").is_none());
}
both_backends!(each_generic_setting_stores_signed_and_refuses_forged_tampered_and_stale);

fn xero(events: &[(&str, &str)]) -> Vec<u8> {
    let items: Vec<serde_json::Value> = events
        .iter()
        .map(|(id, date)| {
            serde_json::json!({
                "resourceUrl": format!("https://api.xero.com/api.xro/2.0/Invoices/{id}"),
                "resourceId": id, "eventDateUtc": date, "eventType": "UPDATE",
                "eventCategory": "INVOICE", "tenantId": "t-1", "tenantType": "ORGANISATION"
            })
        })
        .collect();
    serde_json::to_vec(&serde_json::json!({
        "events": items, "firstEventSequence": 1, "lastEventSequence": items.len(), "entropy": "X"
    }))
    .expect("json")
}

fn xero_signed(body: &[u8], key: &[u8]) -> Headers {
    vec![
        json_ct(),
        h("x-xero-signature", B64.encode(hmac_sha256(key, &[body]))),
    ]
}

fn batches_on_a_generic_kind_claim_each_item_once(backend: Backend) {
    let server = Server::start_on(
        backend,
        &backend.config(ServerConfig::new().tables(&tables())),
        &[],
    );
    let d1 = "2026-01-01T10:00:00.000";
    let first = xero(&[("INV-1", d1), ("INV-2", d1), ("INV-3", d1)]);
    let r = post(&server, "xero", &xero_signed(&first, b"xero-key"), &first);
    assert_eq!(r.status, 200, "{}", r.text());
    // answer = "empty": no body.
    assert!(r.body.is_empty(), "{}", r.text());
    assert_eq!(events_of(&server, "xero"), 3);
    assert_eq!(
        server.count(
            "SELECT count(*) FROM events WHERE source = 'xero' AND type = 'UPDATE'",
            &[]
        ),
        3
    );

    // Redelivered with one new item (INV-1 updated again, a later date):
    // only that one is claimed.
    let again = xero(&[
        ("INV-1", d1),
        ("INV-2", d1),
        ("INV-3", d1),
        ("INV-1", "2026-01-01T11:00:00.000"),
    ]);
    let r = post(&server, "xero", &xero_signed(&again, b"xero-key"), &again);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(events_of(&server, "xero"), 4);

    // A tampered batch, or one signed with another key: 401, nothing stored.
    let more = xero(&[("INV-9", d1)]);
    let r = post(&server, "xero", &xero_signed(&first, b"xero-key"), &more);
    assert_eq!(r.status, 401);
    let r = post(&server, "xero", &xero_signed(&more, b"other"), &more);
    assert_eq!(r.status, 401);
    assert_eq!(events_of(&server, "xero"), 4);

    // Xero's "intent to receive": an empty batch, signed: 200, empty
    // body, nothing stored; the same unsigned or badly signed: 401.
    let empty = xero(&[]);
    let r = post(&server, "xero", &xero_signed(&empty, b"xero-key"), &empty);
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.body.is_empty(), "{}", r.text());
    let r = post(&server, "xero", &xero_signed(&empty, b"wrong"), &empty);
    assert_eq!(r.status, 401);
    let r = post(&server, "xero", &vec![json_ct()], &empty);
    assert_eq!(r.status, 401);
    assert_eq!(events_of(&server, "xero"), 4);

    // A signed body whose batch path is not an array: 400, nothing stored.
    let not_array = br#"{"events":{"resourceId":"INV-7"}}"#;
    let r = post(
        &server,
        "xero",
        &xero_signed(not_array, b"xero-key"),
        not_array,
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("array"), "{}", r.text());
    assert_eq!(events_of(&server, "xero"), 4);

    // empty_batch = "reject": 400; a batch with items is stored, each
    // item's key read inside it; the JSON answer lists the events.
    let token = vec![json_ct(), h("X-Token", "strict-token")];
    let r = post(&server, "strict", &token, br#"{"items":[]}"#);
    assert_eq!(r.status, 400, "{}", r.text());
    let r = post(
        &server,
        "strict",
        &token,
        br#"{"items":[{"id":"a"},{"id":"b"}]}"#,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let ids: Vec<String> = r.json()["events"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|e| e["event_id"].as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(ids, ["a", "b"]);
    assert_eq!(events_of(&server, "strict"), 2);

    // answer = "empty" on a single event: stored, then a duplicate, both
    // 200 without a body; a refusal keeps its JSON error.
    let bearer = vec![json_ct(), h("Authorization", "Bearer quiet-token")];
    for _ in 0..2 {
        let r = post(&server, "quiet", &bearer, br#"{"id":"q1"}"#);
        assert_eq!(r.status, 200, "{}", r.text());
        assert!(r.body.is_empty(), "{}", r.text());
    }
    assert_eq!(events_of(&server, "quiet"), 1);
    let wrong = vec![json_ct(), h("Authorization", "Bearer quiet-tokem")];
    let r = post(&server, "quiet", &wrong, br#"{"id":"q2"}"#);
    assert_eq!(r.status, 401);
    assert!(r.json()["error"].is_string(), "{}", r.text());
    assert_eq!(events_of(&server, "quiet"), 1);
}
both_backends!(batches_on_a_generic_kind_claim_each_item_once);

#[test]
fn send_signs_for_every_generic_setting() {
    let server = Server::start(&ServerConfig::new().tables(&tables()), &[]);
    let ed = server.dir().join("ed25519.pem");
    std::fs::write(&ed, ed25519_private_pem()).expect("write key");
    let ec = server.dir().join("p256.pem");
    std::fs::write(&ec, p256_private_pem()).expect("write key");
    for source in SETTINGS.iter().chain(&["xero", "strict"]) {
        let id = format!("send-{source}");
        let mut args = vec![
            "send".to_string(),
            source.to_string(),
            "--url".to_string(),
            server.base_url().to_string(),
            "--id".to_string(),
            id.clone(),
        ];
        match *source {
            "telnyx" => args.extend(["--private-key".to_string(), ed.display().to_string()]),
            "p256" => args.extend(["--private-key".to_string(), ec.display().to_string()]),
            _ => {}
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = server.run_cli(&args);
        assert!(out.success(), "{source}: {out:?}\n{}", server.logs());
        assert!(out.stdout.contains("-> 200"), "{source}: {}", out.stdout);
        assert_eq!(events_of(&server, source), 1, "{source}: {}", out.stdout);
        // The key the sample was built from: the source's own rule.
        if !matches!(*source, "paystack" | "xero") {
            assert_eq!(
                server.count(
                    "SELECT count(*) FROM events WHERE source = ?1 AND event_id = ?2",
                    &[&source.to_string(), &id]
                ),
                1,
                "{source}: {}",
                out.stdout
            );
        }
        // Again: a duplicate, still one.
        let out = server.run_cli(&args);
        assert!(out.success(), "{source}: {out:?}");
        assert_eq!(events_of(&server, source), 1, "{source}");
    }
    // Without the private key, send says what it needs.
    let out = server.run_cli(&["send", "telnyx", "--url", server.base_url()]);
    assert!(!out.success());
    assert!(out.stderr.contains("--private-key"), "{}", out.stderr);
}

/// `send` builds its sample from the source's own key and type, also
/// over a provider kind's: a Postmark source keyed on a field of its own.
#[test]
fn send_writes_an_overridden_key_where_the_source_reads_it() {
    let tables = r#"
[sources.pm]
kind = "postmark"
secrets = ["pm_user:pm-pass"]
key = ["json:/Metadata/order"]
type = "json:/Metadata/kind"
"#;
    let server = Server::start(&ServerConfig::new().tables(tables), &[]);
    let out = server.run_cli(&[
        "send",
        "pm",
        "--url",
        server.base_url(),
        "--id",
        "order-77",
        "--type",
        "refund",
    ]);
    assert!(out.success(), "{out:?}\n{}", server.logs());
    assert_eq!(
        server.count(
            "SELECT count(*) FROM events WHERE source = 'pm' AND event_id = 'order-77' AND type = 'refund'",
            &[]
        ),
        1,
        "{}",
        out.stdout
    );
}

/// `check` prints each generic source's rule on one line, and its batch
/// and answer.
#[test]
fn check_prints_each_generic_rule() {
    let out = crate::harness::check_config(&ServerConfig::new().tables(&tables()));
    assert!(out.success(), "{out:?}");
    for line in [
        "verify     x-paystack-signature: hex HMAC-SHA512 of the body",
        "verify     X-Hmac-Signature hmac-sha256-hex=: hex HMAC-SHA256 of body; secret NFKD-normalised",
        "verify     telnyx-signature-ed25519: base64 Ed25519 signature (public key) of timestamp + \"|\" + body; timestamp (unix seconds) within tolerance",
        "verify     X-Signature: base64 ECDSA P-256 signature (public key) of body",
        "verify     X-Sig: base64url HMAC-SHA256 of body; secret base64-decoded",
        "verify     Authorization Basic: user:password, one of the secrets, compared in constant time",
        "verify     verif-hash: one of the secrets, compared in constant time",
        "batch      events at /events, each claimed under its own key, at most 1000 a delivery; an empty batch: 200, nothing stored",
        "batch      events at /items, each claimed under its own key, at most 1000 a delivery; an empty batch: 400",
        "answer     200 with no body",
    ] {
        assert!(out.stdout.contains(line), "no {line:?} in\n{}", out.stdout);
    }
    // The public keys and secrets are not printed.
    assert!(
        !out.stdout.contains(&ed25519_public_b64()),
        "{}",
        out.stdout
    );
    assert!(!out.stdout.contains("flw-hash-1"), "{}", out.stdout);
}
