//! The provider kinds through the real binary: what `idemhook send` signs
//! for every kind is accepted (and again a duplicate), every handshake is
//! answered as its provider requires and stores nothing, and batch
//! deliveries claim each of their events once, in one transaction, on
//! both backends. The signature rules themselves are checked against the
//! providers' own libraries by the unit tests (`tests/vectors/`).

use crate::backend::{Backend, both_backends};
use crate::harness::{Server, ServerConfig, raw_exchange, raw_request, toml_str};
use crate::sign;

/// The vectors' fixed test keys: (public key for `secrets`, PKCS#8 PEM).
fn vector_keys(kind: &str) -> (String, String) {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/vectors/providers.json"
    ))
    .expect("providers.json");
    let file: serde_json::Value = serde_json::from_str(&text).expect("providers.json parses");
    let v = file["vectors"]
        .as_array()
        .expect("vectors")
        .iter()
        .find(|v| v["kind"] == kind && v["private_key_pem"].is_string())
        .expect("a vector with a private key");
    (
        v["secrets"][0].as_str().expect("secret").to_string(),
        v["private_key_pem"].as_str().expect("pem").to_string(),
    )
}

/// Every kind of the table and its secret (and extra keys).
fn kinds() -> Vec<(&'static str, String, &'static str)> {
    let url = "public_url = \"https://hooks.example.com/in\"";
    let mut out = vec![
        ("twilio", "auth-token".to_string(), url),
        ("square", "sq-key".to_string(), url),
        ("hubspot", "hs-secret".to_string(), url),
        ("trello", "trello-secret".to_string(), url),
        ("meta", "app-secret".to_string(), "verify_token = \"vt-1\""),
        (
            "adyen",
            "44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056".to_string(),
            "",
        ),
        ("postmark", "user:pass".to_string(), ""),
    ];
    for kind in [
        "razorpay",
        "gocardless",
        "box",
        "mailgun",
        "gitlab",
        "bitbucket",
        "zoom",
        "twitch",
        "dropbox",
        "intercom",
        "typeform",
        "calendly",
        "coinbase",
        "lemonsqueezy",
        "vercel",
        "sentry",
        "pagerduty",
        "msgraph",
        "okta",
        "docusign",
        "mux",
        "workos",
        "asana",
        "notion",
        "webflow",
        "launchdarkly",
        "persona",
        "recurly",
    ] {
        out.push((kind, format!("{kind}-secret"), ""));
    }
    out.push(("discord", vector_keys("discord").0, ""));
    out.push(("sendgrid", vector_keys("sendgrid").0, ""));
    out
}

fn tables() -> String {
    let mut toml = String::new();
    for (kind, secret, extra) in kinds() {
        toml.push_str(&format!(
            "[sources.{kind}]\nkind = \"{kind}\"\nsecrets = [{}]\n{extra}\n",
            toml_str(&secret)
        ));
    }
    toml
}

fn key_file(server: &Server, kind: &str) -> String {
    let path = server.dir().join(format!("{kind}.pem"));
    std::fs::write(&path, vector_keys(kind).1).expect("write key");
    path.display().to_string()
}

#[test]
fn what_send_signs_for_every_kind_is_accepted_then_a_duplicate() {
    let config = ServerConfig::new().tables(&tables());
    let server = Server::start(&config, &[]);
    let names: Vec<&str> = kinds().iter().map(|(k, ..)| *k).collect();
    assert_eq!(names.len(), 37);
    for kind in names {
        let id = format!("evt_{kind}_1");
        let mut args = vec![
            "send".to_string(),
            kind.to_string(),
            "--url".to_string(),
            server.base_url().to_string(),
            "--id".to_string(),
            id.clone(),
        ];
        if kind == "discord" || kind == "sendgrid" {
            args.push("--private-key".to_string());
            args.push(key_file(&server, kind));
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let first = server.run_cli(&args);
        assert!(first.success(), "{kind}: {first:?}\n{}", server.logs());
        assert!(
            !first.stdout.contains("-> 4") && !first.stdout.contains("-> 5"),
            "{kind}: {}",
            first.stdout
        );
        let again = server.run_cli(&args);
        assert!(again.success(), "{kind}: {again:?}");
        // Discord and Adyen answer their own way; the others say duplicate.
        match kind {
            "discord" => assert!(first.stdout.contains(r#"{"type":5}"#), "{}", first.stdout),
            "adyen" => assert!(first.stdout.contains("[accepted]"), "{}", first.stdout),
            _ => {}
        }
        if !matches!(kind, "discord" | "adyen") {
            assert!(
                again.stdout.contains("duplicate"),
                "{kind}: {}",
                again.stdout
            );
        }
        assert_eq!(
            server.count("SELECT count(*) FROM events WHERE source = ?1", &[&kind]),
            1,
            "{kind}: one event stored"
        );
        assert_eq!(
            server.count(
                "SELECT count(*) FROM deliveries WHERE source = ?1 AND outcome = 'duplicate'",
                &[&kind]
            ),
            1,
            "{kind}: the second send is a duplicate delivery"
        );
    }
    let check = server.run_cli(&["check"]);
    check.assert_success();
    assert!(
        check.stdout.contains("verify     X-Twilio-Signature"),
        "{}",
        check.stdout
    );
}

/// A source table for one kind with a secret.
fn one(kind: &str, secret: &str, extra: &str) -> String {
    format!(
        "[sources.{kind}]\nkind = \"{kind}\"\nsecrets = [{}]\n{extra}\n",
        toml_str(secret)
    )
}

fn events(server: &Server) -> i64 {
    server.count("SELECT count(*) FROM events", &[])
}

fn handshakes_are_answered_as_each_provider_requires_and_store_nothing(backend: Backend) {
    let mut toml = String::new();
    for kind in ["zoom", "twitch", "dropbox", "msgraph", "okta", "trello"] {
        let extra = if kind == "trello" {
            "public_url = \"https://hooks.example.com/t\""
        } else {
            ""
        };
        toml.push_str(&one(kind, &format!("{kind}-secret"), extra));
    }
    toml.push_str(&one("meta", "app-secret", "verify_token = \"vt-1\""));
    toml.push_str(&one("discord", &vector_keys("discord").0, ""));
    toml.push_str("[sources.asana]\nkind = \"asana\"\n\n[sources.notion]\nkind = \"notion\"\n");
    let config = backend.config(ServerConfig::new().tables(&toml));
    let mut server = Server::start_on(backend, &config, &[]);
    let no_headers: Vec<(String, String)> = Vec::new();

    // Meta: the right token is answered with the challenge, a wrong one 403.
    let ok = server.get("/hooks/meta?hub.mode=subscribe&hub.verify_token=vt-1&hub.challenge=c-42");
    assert_eq!((ok.status, ok.text()), (200, "c-42".to_string()));
    let wrong =
        server.get("/hooks/meta?hub.mode=subscribe&hub.verify_token=nope&hub.challenge=c-42");
    assert_eq!(wrong.status, 403, "{}", wrong.text());
    // Dropbox: the challenge back as text, not sniffed.
    let dropbox = server.get("/hooks/dropbox?challenge=abc123");
    assert_eq!(
        (dropbox.status, dropbox.text()),
        (200, "abc123".to_string())
    );
    assert_eq!(dropbox.header("x-content-type-options"), Some("nosniff"));
    assert!(
        dropbox
            .header("content-type")
            .is_some_and(|c| c.starts_with("text/plain"))
    );
    // Graph: the token, URL-decoded.
    let graph = server.post("/hooks/msgraph?validationToken=a%20b%3Dc", &no_headers, b"");
    assert_eq!((graph.status, graph.text()), (200, "a b=c".to_string()));
    // Trello checks the callback URL with HEAD.
    let head = raw_exchange(
        server.addr(),
        &raw_request("HEAD", "/hooks/trello", &[], b""),
        std::time::Duration::from_secs(5),
    );
    assert_eq!(head.status, Some(200));

    // The signed ones, through `send --handshake` (which signs as the provider).
    for kind in [
        "zoom", "twitch", "okta", "discord", "meta", "dropbox", "msgraph",
    ] {
        let key = key_file(&server, "discord");
        let mut args = vec!["send", kind, "--handshake", "--url", server.base_url()];
        if kind == "discord" {
            args.extend(["--private-key", key.as_str()]);
        }
        let out = server.run_cli(&args);
        assert!(out.success(), "{kind}: {out:?}\n{}", server.logs());
    }
    // Zoom's answer is the token and its HMAC with the source's secret.
    let body =
        br#"{"event":"endpoint.url_validation","payload":{"plainToken":"pt-1"},"event_ts":1}"#;
    let now = crate::harness::now_secs();
    let mut headers = vec![("Content-Type".to_string(), "application/json".to_string())];
    let ts = now.to_string();
    let tag = sign::hmac_sha256(b"zoom-secret", &[b"v0:", ts.as_bytes(), b":", body]);
    headers.push(("x-zm-request-timestamp".to_string(), ts));
    headers.push((
        "x-zm-signature".to_string(),
        format!("v0={}", hex::encode(tag)),
    ));
    let zoom = server.post("/hooks/zoom", &headers, body);
    assert_eq!(zoom.status, 200, "{}", zoom.text());
    let answer: serde_json::Value = serde_json::from_str(&zoom.text()).expect("json");
    assert_eq!(answer["plainToken"], "pt-1");
    assert_eq!(
        answer["encryptedToken"],
        hex::encode(sign::hmac_sha256(b"zoom-secret", &[b"pt-1"]))
    );
    // A handshake whose signature is bad is refused and counted as one.
    let mut bad = headers.clone();
    bad.retain(|(n, _)| n != "x-zm-signature");
    bad.push((
        "x-zm-signature".to_string(),
        format!("v0={}", "0".repeat(64)),
    ));
    assert_eq!(server.post("/hooks/zoom", &bad, body).status, 401);
    let discord_bad = server.post(
        "/hooks/discord",
        &[
            ("X-Signature-Ed25519".to_string(), "00".repeat(64)),
            ("X-Signature-Timestamp".to_string(), now.to_string()),
        ],
        br#"{"type":1}"#,
    );
    assert_eq!(
        discord_bad.status, 401,
        "Discord probes that a bad PING is refused"
    );
    // Okta's check carries the hook's auth header; a wrong one is 401.
    let okta_bad = server.post("/hooks/okta", &no_headers, b"");
    assert_ne!(okta_bad.status, 200);

    // Asana hands its secret over once; it is echoed, kept, and verifies
    // the events after a restart. Another secret later is refused.
    let asana = server.post(
        "/hooks/asana",
        &[("X-Hook-Secret".to_string(), "hs-1".to_string())],
        b"",
    );
    assert_eq!(asana.status, 200, "{}", asana.text());
    assert_eq!(asana.header("x-hook-secret"), Some("hs-1"));
    let other = server.post(
        "/hooks/asana",
        &[("X-Hook-Secret".to_string(), "hs-2".to_string())],
        b"",
    );
    assert_eq!(other.status, 403, "{}", other.text());
    // Notion's token, the same way; `check` prints it for the operator.
    let notion = server.post(
        "/hooks/notion",
        &no_headers,
        br#"{"verification_token":"secret_n1"}"#,
    );
    assert_eq!(notion.status, 200, "{}", notion.text());
    assert_eq!(events(&server), 0, "no handshake is stored");

    server.restart();
    let heartbeat = br#"{"events":[]}"#;
    let sig = hex::encode(sign::hmac_sha256(b"hs-1", &[heartbeat]));
    let beat = server.post(
        "/hooks/asana",
        &[("X-Hook-Signature".to_string(), sig)],
        heartbeat,
    );
    assert_eq!(beat.status, 200, "{}", beat.text());
    let item = br#"{"events":[{"action":"changed","created_at":"2026-01-01T00:00:00Z","resource":{"gid":"1","resource_type":"task"}}]}"#;
    let sig = hex::encode(sign::hmac_sha256(b"hs-1", &[item]));
    let stored = server.post(
        "/hooks/asana",
        &[("X-Hook-Signature".to_string(), sig)],
        item,
    );
    assert_eq!(stored.status, 200, "{}", stored.text());
    let sig = hex::encode(sign::hmac_sha256(
        b"secret_n1",
        &[br#"{"id":"n-1","type":"page.created"}"#],
    ));
    let notion_event = server.post(
        "/hooks/notion",
        &[("X-Notion-Signature".to_string(), format!("sha256={sig}"))],
        br#"{"id":"n-1","type":"page.created"}"#,
    );
    assert_eq!(notion_event.status, 200, "{}", notion_event.text());
    assert_eq!(
        events(&server),
        2,
        "the heartbeat stores nothing, the two events are stored"
    );
    assert_eq!(
        server.texts("SELECT type FROM events WHERE source = 'asana'", &[]),
        vec!["task.changed".to_string()]
    );
    let check = server.run_cli(&["check"]);
    check.assert_success();
    assert!(
        check.stdout.contains("secret_n1"),
        "check prints Notion's token: {}",
        check.stdout
    );
    // The refused handshakes were recorded as refusals, with the part named.
    let logs = server.logs();
    assert!(
        logs.contains("failed=\"no secret matched\"") || logs.contains("failed=no secret matched"),
        "{logs}"
    );
    assert!(
        !logs.contains("hs-1") && !logs.contains("secret_n1"),
        "a handed-over secret reached the log"
    );
}

both_backends!(handshakes_are_answered_as_each_provider_requires_and_store_nothing);

fn gocardless(events: &[(&str, &str)], webhook: &str) -> Vec<u8> {
    let items: Vec<serde_json::Value> = events
        .iter()
        .map(|(id, action)| serde_json::json!({"id": id, "resource_type": "payments", "action": action, "links": {"payment": format!("PM{id}")}}))
        .collect();
    serde_json::json!({"events": items, "meta": {"webhook_id": webhook}})
        .to_string()
        .into_bytes()
}

fn post_gocardless(server: &Server, body: &[u8]) -> crate::harness::HttpResponse {
    let sig = hex::encode(sign::hmac_sha256(b"gc-secret", &[body]));
    server.post(
        "/hooks/gc",
        &[
            ("Content-Type".to_string(), "application/json".to_string()),
            ("Webhook-Signature".to_string(), sig),
        ],
        body,
    )
}

fn batches_claim_each_event_once_and_answer_after_the_commit(backend: Backend) {
    let toml = format!(
        "[sources.gc]\nkind = \"gocardless\"\nsecrets = [\"gc-secret\"]\n\
         [[sources.gc.actions]]\nname = \"ledger\"\nsql = \"INSERT INTO ledger (event_id, type) VALUES (:event_id, :type)\"\n\n\
         [sources.adyen]\nkind = \"adyen\"\nsecrets = [{}]\n",
        toml_str("44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056")
    );
    let config = backend.config(
        ServerConfig::new()
            .set("max_batch_items", "5")
            .set(
                "setup_sql",
                &toml_str(
                    "CREATE TABLE IF NOT EXISTS ledger (event_id TEXT PRIMARY KEY, type TEXT)",
                ),
            )
            .tables(&toml),
    );
    let server = Server::start_on(backend, &config, &[]);

    let first = post_gocardless(
        &server,
        &gocardless(
            &[
                ("EV1", "created"),
                ("EV2", "confirmed"),
                ("EV3", "paid_out"),
            ],
            "WB1",
        ),
    );
    assert_eq!(first.status, 200, "{}", first.text());
    let answer: serde_json::Value = serde_json::from_str(&first.text()).expect("json");
    assert_eq!(answer["status"], "accepted");
    let statuses: Vec<&str> = answer["events"]
        .as_array()
        .expect("events")
        .iter()
        .map(|e| e["status"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(statuses, ["accepted", "accepted", "accepted"]);
    assert_eq!(
        server.count("SELECT count(*) FROM events WHERE source = 'gc'", &[]),
        3
    );
    assert_eq!(
        server.texts("SELECT type FROM ledger ORDER BY event_id", &[]),
        [
            "payments.created",
            "payments.confirmed",
            "payments.paid_out"
        ]
        .map(String::from)
        .to_vec()
    );

    // Redelivered with one new event: only that one is claimed.
    let again = post_gocardless(
        &server,
        &gocardless(
            &[
                ("EV1", "created"),
                ("EV2", "confirmed"),
                ("EV3", "paid_out"),
                ("EV4", "failed"),
            ],
            "WB2",
        ),
    );
    assert_eq!(again.status, 200, "{}", again.text());
    let answer: serde_json::Value = serde_json::from_str(&again.text()).expect("json");
    let statuses: Vec<&str> = answer["events"]
        .as_array()
        .expect("events")
        .iter()
        .map(|e| e["status"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(
        statuses,
        ["duplicate", "duplicate", "duplicate", "accepted"]
    );
    assert_eq!(
        server.count("SELECT count(*) FROM events WHERE source = 'gc'", &[]),
        4
    );
    assert_eq!(
        server.count("SELECT count(*) FROM ledger", &[]),
        4,
        "one effect per event"
    );

    // An event without an id refuses the whole batch; nothing is stored.
    let no_id = br#"{"events":[{"id":"EV9","resource_type":"payments","action":"created"},{"resource_type":"payments","action":"x"}],"meta":{"webhook_id":"WB3"}}"#;
    let refused = post_gocardless(&server, no_id);
    assert_eq!(refused.status, 400, "{}", refused.text());
    assert_eq!(
        server.count("SELECT count(*) FROM events WHERE event_id = 'EV9'", &[]),
        0
    );
    // Over max_batch_items: 413, nothing stored.
    let many: Vec<(String, &str)> = (10..16).map(|i| (format!("EV{i}"), "created")).collect();
    let many: Vec<(&str, &str)> = many.iter().map(|(a, b)| (a.as_str(), *b)).collect();
    let too_many = post_gocardless(&server, &gocardless(&many, "WB4"));
    assert_eq!(too_many.status, 413, "{}", too_many.text());
    assert_eq!(
        server.count("SELECT count(*) FROM events WHERE source = 'gc'", &[]),
        4
    );

    // `events show` says which delivery each event came in.
    let show = server.run_cli(&["events", "show", "gc", "EV4", "--json"]);
    show.assert_success();
    let shown = show.json();
    assert_eq!(
        shown["deliveries"][0]["batch"], "WB2 (event 4 of 4)",
        "{shown}"
    );
    let show = server.run_cli(&["events", "show", "gc", "EV1", "--json"]);
    let batches: Vec<String> = show.json()["deliveries"]
        .as_array()
        .expect("deliveries")
        .iter()
        .map(|d| d["batch"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(batches, ["WB1 (event 1 of 3)", "WB2 (event 1 of 4)"]);

    // Adyen: answered [accepted] after the commit, each item its own event.
    let out = server.run_cli(&["send", "adyen", "--url", server.base_url(), "--id", "PSP1"]);
    assert!(out.success(), "{out:?}");
    assert!(out.stdout.contains("[accepted]"), "{}", out.stdout);
    assert_eq!(
        server.count("SELECT count(*) FROM events WHERE source = 'adyen'", &[]),
        1
    );
}

both_backends!(batches_claim_each_event_once_and_answer_after_the_commit);

/// Batches from many senders at once, sharing events: every event stored
/// once and one ledger row each, whatever batch claimed it.
fn concurrent_overlapping_batches_store_each_event_once(backend: Backend) {
    let config = backend.config(
        ServerConfig::new()
            .set("setup_sql", &toml_str("CREATE TABLE IF NOT EXISTS ledger (event_id TEXT PRIMARY KEY)"))
            .tables(
                "[sources.gc]\nkind = \"gocardless\"\nsecrets = [\"gc-secret\"]\n\
                 [[sources.gc.actions]]\nname = \"ledger\"\nsql = \"INSERT INTO ledger (event_id) VALUES (:event_id)\"\n",
            ),
    );
    let server = Server::start_on(backend, &config, &[]);
    let statuses: Vec<u16> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|t| {
                let server = &server;
                s.spawn(move || {
                    (0..10)
                        .map(|b| {
                            // Overlapping windows of ids: batch b of thread t.
                            let ids: Vec<String> =
                                (0..4).map(|k| format!("EV{}", (t + b + k) % 20)).collect();
                            let events: Vec<(&str, &str)> =
                                ids.iter().map(|i| (i.as_str(), "created")).collect();
                            post_gocardless(server, &gocardless(&events, &format!("WB{t}-{b}")))
                                .status
                        })
                        .collect::<Vec<u16>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("sender"))
            .collect()
    });
    assert!(statuses.iter().all(|&s| s == 200), "{statuses:?}");
    assert_eq!(server.count("SELECT count(*) FROM events", &[]), 20);
    assert_eq!(server.count("SELECT count(*) FROM ledger", &[]), 20);
    let accepted = server.count(
        "SELECT count(*) FROM deliveries WHERE outcome = 'accepted'",
        &[],
    );
    assert_eq!(accepted, 20, "each event accepted once");
}

both_backends!(concurrent_overlapping_batches_store_each_event_once);

/// Two instances on one PostgreSQL database: Asana's handshake reaches
/// one, its events the other, which verifies them with the secret the
/// first kept (read again when a signature fails, at most once a second).
#[test]
fn a_secret_handed_to_one_instance_verifies_at_the_other() {
    let backend = Backend::Postgres;
    if !backend.available("a_secret_handed_to_one_instance_verifies_at_the_other") {
        return;
    }
    let config = backend.config(ServerConfig::new().tables("[sources.asana]\nkind = \"asana\"\n"));
    let a = Server::start(&config, &[]);
    let b = Server::start(&config, &[]);
    let asana = a.post(
        "/hooks/asana",
        &[("X-Hook-Secret".to_string(), "hs-shared".to_string())],
        b"",
    );
    assert_eq!(asana.status, 200, "{}", asana.text());
    let item = br#"{"events":[{"action":"added","created_at":"2026-01-01T00:00:00Z","resource":{"gid":"7","resource_type":"task"}}]}"#;
    let sig = hex::encode(sign::hmac_sha256(b"hs-shared", &[item]));
    let at_b = b.post(
        "/hooks/asana",
        &[("X-Hook-Signature".to_string(), sig)],
        item,
    );
    assert_eq!(at_b.status, 200, "{}\n{}", at_b.text(), b.logs());
    assert_eq!(
        b.count("SELECT count(*) FROM events WHERE source = 'asana'", &[]),
        1
    );
    // The other instance refuses another secret too: one was kept.
    let other = b.post(
        "/hooks/asana",
        &[("X-Hook-Secret".to_string(), "hs-other".to_string())],
        b"",
    );
    assert_eq!(other.status, 403, "{}", other.text());
}

/// A Mailgun delivery and its retry: Mailgun signs every attempt afresh
/// inside the body (a new `signature.timestamp`, `token` and `signature`)
/// and leaves `event-data` as it was, so the retry is a plain duplicate,
/// never a payload mismatch (the hash covers `event-data` alone).
#[test]
fn a_mailgun_retry_signed_afresh_is_a_duplicate() {
    const KEY: &str = "mailgun-secret";
    let config = ServerConfig::new().tables(&format!(
        "[sources.mailgun]\nkind = \"mailgun\"\nsecrets = [{}]\n",
        toml_str(KEY)
    ));
    let server = Server::start(&config, &[]);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs();
    let attempt = |timestamp: u64, token: &str| -> Vec<u8> {
        let signature = hex::encode(sign::hmac_sha256(
            KEY.as_bytes(),
            &[timestamp.to_string().as_bytes(), token.as_bytes()],
        ));
        serde_json::json!({
            "signature": {"timestamp": timestamp.to_string(), "token": token, "signature": signature},
            "event-data": {"id": "evt_mg_retry", "event": "delivered", "timestamp": 1767225600},
        })
        .to_string()
        .into_bytes()
    };
    let headers = [sign::json_content_type()];
    let first = server.post("/hooks/mailgun", &headers, &attempt(now - 60, "token-one"));
    assert_eq!(first.status, 200, "{}", first.text());
    assert!(first.text().contains("\"accepted\""), "{}", first.text());
    let retry = server.post("/hooks/mailgun", &headers, &attempt(now, "token-two"));
    assert_eq!(retry.status, 200, "{}", retry.text());
    assert!(
        retry.text().contains("\"duplicate\"") && !retry.text().contains("mismatch"),
        "a re-signed retry is a plain duplicate: {}",
        retry.text()
    );
    assert_eq!(
        server.count(
            "SELECT count(*) FROM deliveries WHERE source = 'mailgun' AND outcome = 'duplicate'",
            &[]
        ),
        1
    );
    assert_eq!(server.count("SELECT count(*) FROM incidents", &[]), 0);
}
