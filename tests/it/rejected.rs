//! Refused deliveries kept, and re-ingest: a 401 or 400 to a configured
//! source is kept whole (per source within `keep_rejected` and
//! `keep_rejected_bytes`), `idemhook reingest` and `POST /api/reingest`
//! take them in with the current secrets through the normal barrier, and
//! what is never kept (413, 405, unknown sources) leaves no row: a
//! stranger trying names cannot fill the disk.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::{Value, json};

use crate::backend::{Backend, both_backends};
use crate::downstream::Downstream;
use crate::harness::{Server, ServerConfig, now_secs, toml_str, wait_until};
use crate::helpers::{StripeHook, api, stripe_source};
use crate::sign;

const RIGHT: &str = "whsec_the_right_one";
const WRONG: &str = "whsec_mistyped_one";
const TOKEN: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
const WAIT: Duration = Duration::from_secs(20);

fn event(id: &str) -> Vec<u8> {
    json!({"id": id, "object": "event", "type": "charge.succeeded", "data": {"n": id}})
        .to_string()
        .into_bytes()
}

fn kept(server: &Server) -> i64 {
    server.count("SELECT count(*) FROM rejected", &[])
}

/// The team's table the SQL action writes (in the team's schema on
/// PostgreSQL).
fn effects_table(backend: Backend) -> &'static str {
    if backend.is_postgres() {
        "public.effects"
    } else {
        "effects"
    }
}

fn story_config(backend: Backend, downstream: &Downstream, extra: &str) -> ServerConfig {
    backend.config(
        ServerConfig::new()
            .set(
                "setup_sql",
                &toml_str("CREATE TABLE IF NOT EXISTS effects (id TEXT NOT NULL)"),
            )
            .set("admin_token", &toml_str(TOKEN))
            .tables(&stripe_source(
                "stripe",
                &format!(
                    "{extra}\n[[sources.stripe.actions]]\nname = \"book\"\n\
                     sql = \"INSERT INTO effects (id) VALUES (:event_id)\"\n\
                     [[sources.stripe.actions]]\nname = \"notify\"\nforward = {}\n",
                    toml_str(&downstream.url())
                ),
            )),
    )
}

/// The mistyped secret: three deliveries refused 401 and kept; the secret
/// fixed; one of them redelivered by the provider meanwhile; reingest
/// without --yes changes nothing; with --yes every event is claimed once
/// (the redelivered one a duplicate), its SQL action and forward run
/// once, the kept requests go; a second reingest claims nothing.
fn mistyped_secret_fixed_and_reingested(backend: Backend) {
    let downstream = Downstream::start();
    let config = story_config(backend, &downstream, "");
    let mut server = Server::start_on(backend, &config, &[("STRIPE_SECRET", WRONG)]);
    let hook = StripeHook::new("stripe", RIGHT);
    for id in ["evt_a", "evt_b", "evt_c"] {
        let r = hook.deliver(&server, &event(id));
        assert_eq!(r.status, 401, "{}", r.text());
    }
    wait_until(WAIT, "three refusals kept", || kept(&server) == 3);
    assert_eq!(server.count("SELECT count(*) FROM events", &[]), 0);

    let listed = server
        .run_cli(&["rejected", "list", "--source", "stripe", "--json"])
        .assert_success()
        .json();
    let rows = listed.as_array().expect("a list");
    assert_eq!(rows.len(), 3, "{listed}");
    let first = &rows[0];
    let mut keys: Vec<&str> = first
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        ["bytes", "id", "reason", "received_at", "remote", "source"]
    );
    assert_eq!(first["bytes"], event("evt_a").len());
    assert!(
        first["reason"].as_str().unwrap().contains("signature"),
        "the verifier's diagnosis: {first}"
    );
    let id = first["id"].to_string();
    let shown = server
        .run_cli(&["rejected", "show", &id, "--json"])
        .assert_success()
        .json();
    let shown_id =
        serde_json::from_str::<Value>(shown["body"].as_str().unwrap()).unwrap()["id"].clone();
    assert!(
        ["evt_a", "evt_b", "evt_c"].contains(&shown_id.as_str().unwrap()),
        "{shown}"
    );
    assert_eq!(shown["id"], first["id"]);
    assert!(
        shown["headers"].as_array().unwrap().iter().any(|h| h[0]
            .as_str()
            .unwrap()
            .eq_ignore_ascii_case("stripe-signature")),
        "{shown}"
    );

    // The secret is fixed; the provider's retry of evt_b gets in first.
    server.set_env("STRIPE_SECRET", RIGHT);
    server.restart();
    hook.deliver_ok(&server, &event("evt_b"));

    let plan = server
        .run_cli(&["reingest", "--source", "stripe"])
        .assert_success()
        .stdout
        .clone();
    assert_eq!(
        plan.matches("would pass, with secret #0").count(),
        3,
        "{plan}"
    );
    assert_eq!(kept(&server), 3, "a dry run changes nothing");
    assert_eq!(server.count("SELECT count(*) FROM events", &[]), 1);

    let done = server
        .run_cli(&["reingest", "--source", "stripe", "--yes"])
        .assert_success()
        .stdout
        .clone();
    assert!(done.contains("2 new, 1 duplicate"), "{done}");
    assert!(done.contains("evt_b duplicate"), "{done}");
    assert_eq!(kept(&server), 0);
    assert_eq!(server.count("SELECT count(*) FROM events", &[]), 3);
    let table = effects_table(backend);
    assert_eq!(
        server.count(&format!("SELECT count(*) FROM {table}"), &[]),
        3,
        "each SQL action's effect once"
    );
    assert_eq!(
        server.count(
            "SELECT count(*) FROM deliveries WHERE outcome = 'reingested'",
            &[]
        ),
        3
    );
    // serve's workers take the jobs the command wrote.
    wait_until(WAIT, "three forwards, once each", || {
        downstream.total_effects() == 3
    });
    wait_until(WAIT, "the three events completed", || {
        ["evt_a", "evt_b", "evt_c"].iter().all(|id| {
            crate::helpers::event_state(&server, "stripe", id).as_deref() == Some("completed")
        })
    });

    let again = server
        .run_cli(&["reingest", "--source", "stripe", "--yes"])
        .assert_success()
        .stdout
        .clone();
    assert!(again.contains("no kept refused requests"), "{again}");
    assert_eq!(
        server.count(&format!("SELECT count(*) FROM {table}"), &[]),
        3
    );
    assert_eq!(downstream.total_effects(), 3);

    let metrics = crate::harness::Client::new(WAIT)
        .get_with(
            &server.url("/metrics"),
            &[("Authorization".to_string(), format!("Bearer {TOKEN}"))],
        )
        .text();
    assert!(
        metrics.contains("idemhook_reingested_total{source=\"stripe\",outcome=\"accepted\"} 2")
            && metrics
                .contains("idemhook_reingested_total{source=\"stripe\",outcome=\"duplicate\"} 1")
            && metrics.contains("idemhook_rejected_kept_bytes{source=\"stripe\"} 0"),
        "{metrics}"
    );
}

/// Tolerance is judged at receipt: a request signed in time but with the
/// secret mistyped passes a re-ingest run after its tolerance has passed;
/// one signed outside the tolerance already when it came stays, with its
/// new reason (the timestamp, no longer the secret).
fn tolerance_at_receipt_and_a_still_failing_request_stays(backend: Backend) {
    let downstream = Downstream::start();
    let config = story_config(backend, &downstream, "tolerance = \"2s\"");
    let mut server = Server::start_on(backend, &config, &[("STRIPE_SECRET", WRONG)]);
    let url = server.url("/hooks/stripe");
    let fresh = event("evt_fresh");
    let r = crate::harness::post(&url, &sign::stripe(RIGHT, &fresh, now_secs()), &fresh);
    assert_eq!(r.status, 401, "{}", r.text());
    let stale = event("evt_stale");
    let r = crate::harness::post(&url, &sign::stripe(RIGHT, &stale, now_secs() - 60), &stale);
    assert_eq!(r.status, 401, "{}", r.text());
    wait_until(WAIT, "two refusals kept", || kept(&server) == 2);
    let stale_reason = |server: &Server| {
        server
            // (sent second: the newest kept)
            .row("SELECT reason FROM rejected ORDER BY id DESC LIMIT 1", &[])
            .map(|r| r.text(0))
    };
    let before = stale_reason(&server).expect("the stale one is kept");

    server.set_env("STRIPE_SECRET", RIGHT);
    server.restart();
    // The fresh one's tolerance (2 s) passes before the re-ingest.
    std::thread::sleep(Duration::from_secs(3));
    let out = server
        .run_cli(&["reingest", "--source", "stripe", "--yes"])
        .assert_success()
        .stdout
        .clone();
    assert!(out.contains("1 new, 0 duplicate; 1 still refused"), "{out}");
    assert!(crate::helpers::event_state(&server, "stripe", "evt_fresh").is_some());
    assert!(crate::helpers::event_state(&server, "stripe", "evt_stale").is_none());
    assert_eq!(kept(&server), 1);
    let after = stale_reason(&server).expect("the stale one stays");
    assert_ne!(before, after, "a new reason");
    assert!(after.contains("tolerance"), "{after}");
}

/// The byte cap: the oldest kept requests go first, as each is written,
/// and the gauge says what is kept.
fn the_byte_cap_drops_the_oldest(backend: Backend) {
    let config = backend.config(
        ServerConfig::new().tables(&stripe_source("stripe", "keep_rejected_bytes = \"4KiB\"")),
    );
    let server = Server::start_on(backend, &config, &[("STRIPE_SECRET", WRONG)]);
    let hook = StripeHook::new("stripe", RIGHT);
    let pad = "x".repeat(600);
    let ids: Vec<String> = (0..12).map(|i| format!("evt_cap_{i:02}")).collect();
    for id in &ids {
        let body = json!({"id": id, "type": "t", "pad": pad}).to_string();
        // One after another: each is kept before the next is sent.
        let r = hook.deliver(&server, body.as_bytes());
        assert_eq!(r.status, 401);
        wait_until(WAIT, "the refusal recorded", || {
            server.count(
                "SELECT count(*) FROM deliveries WHERE outcome = 'bad_signature'",
                &[],
            ) == (ids.iter().position(|x| x == id).unwrap() + 1) as i64
        });
    }
    let stored = server.count("SELECT CAST(SUM(stored) AS BIGINT) FROM rejected", &[]);
    assert!(stored <= 4096, "kept {stored} bytes over the 4 KiB cap");
    let n = kept(&server);
    assert!((3..12).contains(&n), "{n} kept");
    let kept_ids: Vec<String> = server
        .rows("SELECT body FROM rejected ORDER BY id", &[])
        .iter()
        .map(|r| {
            let body = r.bytes(0).expect("a body");
            serde_json::from_slice::<Value>(&body).unwrap()["id"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(kept_ids, ids[12 - n as usize..].to_vec(), "the newest stay");
    let metrics = server.get("/metrics").text();
    assert!(
        metrics.contains(&format!(
            "idemhook_rejected_kept_bytes{{source=\"stripe\"}} {stored}"
        )),
        "{metrics}"
    );
}

/// 413, 405 and unknown sources are never kept, nor is anything of a
/// source with `keep_rejected = "0s"`; a 400 (no event id) is.
fn never_kept_413_405_unknown(backend: Backend) {
    let config = backend.config(
        ServerConfig::new()
            .set("max_body_bytes", "1024")
            .tables(&stripe_source("stripe", ""))
            .tables(&stripe_source("nokeep", "keep_rejected = \"0s\"")),
    );
    let server = Server::start_on(backend, &config, &[("STRIPE_SECRET", RIGHT)]);
    let hook = StripeHook::new("stripe", RIGHT);
    let big = json!({"id": "evt_big", "pad": "y".repeat(2000)}).to_string();
    assert_eq!(hook.deliver(&server, big.as_bytes()).status, 413);
    assert_eq!(server.get("/hooks/stripe").status, 405);
    assert_eq!(
        hook.at("nope").deliver(&server, &event("evt_u")).status,
        404
    );
    assert_eq!(
        StripeHook::new("nokeep", WRONG)
            .deliver(&server, &event("evt_n"))
            .status,
        401
    );
    // Last, a 400 that is kept: once it is, everything before was handled.
    let no_id = br#"{"type":"charge.succeeded"}"#;
    assert_eq!(hook.deliver(&server, no_id).status, 400);
    wait_until(WAIT, "the 400 kept", || kept(&server) >= 1);
    assert_eq!(kept(&server), 1);
    assert_eq!(
        server.count("SELECT count(*) FROM rejected WHERE source = 'stripe'", &[]),
        1
    );
    assert_eq!(
        server.count("SELECT count(*) FROM deliveries WHERE source = 'nope'", &[]),
        0,
        "an unknown source leaves no row"
    );
}

/// The admin routes' JSON, and a re-ingest through the API: its plan
/// first, then the change.
fn admin_routes_list_show_and_reingest(backend: Backend) {
    let downstream = Downstream::start();
    let config = story_config(backend, &downstream, "");
    let mut server = Server::start_on(backend, &config, &[("STRIPE_SECRET", WRONG)]);
    let hook = StripeHook::new("stripe", RIGHT);
    assert_eq!(hook.deliver(&server, &event("evt_api")).status, 401);
    wait_until(WAIT, "kept", || kept(&server) == 1);

    let (status, list) = api(
        &server,
        "GET",
        "/api/rejected?source=stripe&since=1h",
        Some(TOKEN),
        "",
    );
    assert_eq!(status, 200, "{list}");
    let row = &list[0];
    assert_eq!(row.as_object().unwrap().len(), 6, "{row}");
    for k in ["id", "source", "received_at", "reason", "remote", "bytes"] {
        assert!(row.get(k).is_some(), "{k} in {row}");
    }
    let id = row["id"].as_i64().unwrap();
    let (status, one) = api(
        &server,
        "GET",
        &format!("/api/rejected/{id}"),
        Some(TOKEN),
        "",
    );
    assert_eq!(status, 200, "{one}");
    assert_eq!(one.as_object().unwrap().len(), 8, "{one}");
    assert!(
        one["headers"].is_array() && one["body"].is_string(),
        "{one}"
    );
    let (status, _) = api(&server, "GET", "/api/rejected/999999", Some(TOKEN), "");
    assert_eq!(status, 404);
    let (status, _) = api(&server, "GET", "/api/rejected?color=red", Some(TOKEN), "");
    assert_eq!(status, 400);

    server.set_env("STRIPE_SECRET", RIGHT);
    server.restart();
    let (status, plan) = api(
        &server,
        "POST",
        "/api/reingest",
        Some(TOKEN),
        json!({"source": "stripe", "dry_run": true}).to_string(),
    );
    assert_eq!(status, 200, "{plan}");
    assert_eq!(plan["requests"][0]["passes"], true, "{plan}");
    assert_eq!(plan["requests"][0]["secret"], 0, "{plan}");
    assert_eq!(kept(&server), 1, "the plan changes nothing");
    let (status, done) = api(
        &server,
        "POST",
        "/api/reingest",
        Some(TOKEN),
        json!({"source": "stripe", "id": id, "dry_run": false}).to_string(),
    );
    assert_eq!(status, 200, "{done}");
    assert_eq!(
        done["totals"],
        json!({"accepted": 1, "duplicate": 0, "failed": 0})
    );
    assert_eq!(done["requests"][0]["events"][0]["event_id"], "evt_api");
    assert_eq!(kept(&server), 0);
    wait_until(WAIT, "forwarded once", || downstream.total_effects() == 1);
    let (status, _) = api(
        &server,
        "POST",
        "/api/reingest",
        Some(TOKEN),
        json!({"source": "nope"}).to_string(),
    );
    assert_eq!(status, 404);
}

both_backends!(
    mistyped_secret_fixed_and_reingested,
    tolerance_at_receipt_and_a_still_failing_request_stays,
    the_byte_cap_drops_the_oldest,
    never_kept_413_405_unknown,
    admin_routes_list_show_and_reingest,
);

/// One request on a kept-alive connection; the status.
fn exchange(stream: &mut TcpStream, path: &str, buf: &mut Vec<u8>) -> u16 {
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{{}}"
    );
    stream.write_all(request.as_bytes()).unwrap();
    buf.clear();
    let mut chunk = [0u8; 4096];
    loop {
        let n = stream.read(&mut chunk).unwrap();
        assert!(n > 0, "the server closed the connection");
        buf.extend_from_slice(&chunk[..n]);
        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .map_or(0, |v| v.trim().parse().unwrap());
        if buf.len() >= end + 4 + length {
            return head[9..12].parse().unwrap();
        }
    }
}

/// 10,000 requests to distinct unknown names, each a long one: all 404,
/// all counted, a summarised log line or two, and the database and its
/// WAL grow by under 1 MiB.
#[test]
fn strangers_cannot_fill_the_disk() {
    let config = ServerConfig::new().tables(&stripe_source("stripe", ""));
    let server = Server::start(&config, &[("STRIPE_SECRET", RIGHT)]);
    let size = |server: &Server| -> u64 {
        let db = server.db_path();
        let wal = db.with_extension("db-wal");
        [db, wal]
            .iter()
            .map(|p| std::fs::metadata(p).map_or(0, |m| m.len()))
            .sum()
    };
    let before = size(&server);
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let addr = server.addr();
            std::thread::spawn(move || {
                let mut stream = TcpStream::connect(addr).unwrap();
                stream
                    .set_read_timeout(Some(Duration::from_secs(10)))
                    .unwrap();
                let mut buf = Vec::new();
                let pad = "n".repeat(1000);
                for i in 0..2_500 {
                    let path = format!("/hooks/{pad}-{t}-{i}");
                    assert_eq!(exchange(&mut stream, &path, &mut buf), 404);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let metrics = server.get("/metrics").text();
    let counted: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("idemhook_deliveries_total{") && l.contains("unknown_source"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(counted, 10_000.0, "every request counted");
    // A delivery after them, so anything they queued was written.
    StripeHook::new("stripe", RIGHT).deliver_ok(&server, &event("evt_after"));
    let after = size(&server);
    let grown = after.saturating_sub(before);
    eprintln!("unknown-source probe: db + wal grew by {grown} bytes ({before} -> {after})");
    assert!(grown < 1024 * 1024, "grew by {grown} bytes");
    assert_eq!(
        server.count(
            "SELECT count(*) FROM deliveries WHERE outcome = 'unknown_source'",
            &[]
        ),
        0
    );
    let lines = server.logs().matches("unknown source").count();
    assert!(
        (1..=3).contains(&lines),
        "{lines} log lines for 10,000 requests"
    );
}

/// `keep_rejected` is enforced by the pruner (here `idemhook prune`), and
/// the gauge follows; `keep_rejected_bytes` that is not a size is a
/// config error naming the key.
fn the_pruner_drops_what_is_past_keep_rejected(backend: Backend) {
    let config = backend.config(
        ServerConfig::new()
            .set("admin_token", &toml_str(TOKEN))
            .tables(&stripe_source("stripe", "keep_rejected = \"1s\"")),
    );
    let server = Server::start_on(backend, &config, &[("STRIPE_SECRET", WRONG)]);
    let hook = StripeHook::new("stripe", RIGHT);
    assert_eq!(hook.deliver(&server, &event("evt_old")).status, 401);
    wait_until(WAIT, "kept", || kept(&server) == 1);
    // Past keep_rejected (1 s).
    std::thread::sleep(Duration::from_millis(1_500));
    server.run_cli(&["prune"]).assert_success();
    assert_eq!(kept(&server), 0);
    let metrics = crate::harness::Client::new(WAIT)
        .get_with(
            &server.url("/metrics"),
            &[("Authorization".to_string(), format!("Bearer {TOKEN}"))],
        )
        .text();
    assert!(
        metrics.contains("idemhook_rejected_kept_bytes{source=\"stripe\"} 0"),
        "{metrics}"
    );

    let bad = crate::harness::check_config(&ServerConfig::new().tables(
        "[sources.stripe]\nkind = \"stripe\"\nsecrets = [\"whsec_literal\"]\n\
             keep_rejected_bytes = \"lots\"\n",
    ));
    assert!(!bad.success(), "{bad:?}");
    assert!(bad.stderr.contains("keep_rejected_bytes"), "{}", bad.stderr);
}
both_backends!(the_pruner_drops_what_is_past_keep_rejected);

/// A batch delivery (GoCardless: several events in one signed body) kept
/// and re-ingested: every event of it claimed, as the delivery would have.
fn a_kept_batch_is_reingested_event_by_event(backend: Backend) {
    let config = backend.config(
        ServerConfig::new()
            .tables("[sources.gc]\nkind = \"gocardless\"\nsecrets = [\"env:GC_SECRET\"]\n"),
    );
    let mut server = Server::start_on(backend, &config, &[("GC_SECRET", WRONG)]);
    let body = json!({
        "events": [
            {"id": "EV1", "resource_type": "payments", "action": "confirmed"},
            {"id": "EV2", "resource_type": "payments", "action": "paid_out"},
        ],
        "meta": {"webhook_id": "WB1"},
    })
    .to_string();
    let signature = hex::encode(sign::hmac_sha256(RIGHT.as_bytes(), &[body.as_bytes()]));
    let headers = vec![
        ("Webhook-Signature".to_string(), signature),
        sign::json_content_type(),
    ];
    assert_eq!(
        server.post("/hooks/gc", &headers, body.as_bytes()).status,
        401
    );
    wait_until(WAIT, "the batch kept", || kept(&server) == 1);
    server.set_env("GC_SECRET", RIGHT);
    server.restart();
    let out = server
        .run_cli(&["reingest", "--source", "gc", "--yes"])
        .assert_success()
        .stdout
        .clone();
    assert!(out.contains("EV1 accepted, EV2 accepted"), "{out}");
    assert_eq!(kept(&server), 0);
    assert_eq!(
        server.texts("SELECT event_id FROM events ORDER BY event_id", &[]),
        ["EV1", "EV2"]
    );
}
both_backends!(a_kept_batch_is_reingested_event_by_event);

/// Events that came before Asana's handshake handed its secret over are
/// refused and kept; `reingest` (another process) verifies them with the
/// secret the handshake left in the database.
fn events_before_a_handshake_are_reingested_with_the_handed_over_secret(backend: Backend) {
    let config = backend.config(ServerConfig::new().tables("[sources.asana]\nkind = \"asana\"\n"));
    let server = Server::start_on(backend, &config, &[]);
    let item = br#"{"events":[{"action":"changed","created_at":"2026-01-01T00:00:00Z","resource":{"gid":"7","resource_type":"task"}}]}"#;
    let sig = hex::encode(sign::hmac_sha256(b"hs-early", &[item]));
    let early = server.post(
        "/hooks/asana",
        &[("X-Hook-Signature".to_string(), sig)],
        item,
    );
    assert_eq!(early.status, 401, "{}", early.text());
    wait_until(WAIT, "the early event kept", || kept(&server) == 1);
    let handshake = server.post(
        "/hooks/asana",
        &[("X-Hook-Secret".to_string(), "hs-early".to_string())],
        b"",
    );
    assert_eq!(handshake.status, 200, "{}", handshake.text());
    let plan = server
        .run_cli(&["reingest", "--source", "asana"])
        .assert_success()
        .stdout
        .clone();
    assert!(plan.contains("would pass, with secret #0"), "{plan}");
    server
        .run_cli(&["reingest", "--source", "asana", "--yes"])
        .assert_success();
    assert_eq!(kept(&server), 0);
    assert_eq!(
        server.count("SELECT count(*) FROM events WHERE source = 'asana'", &[]),
        1
    );
}
both_backends!(events_before_a_handshake_are_reingested_with_the_handed_over_secret);
