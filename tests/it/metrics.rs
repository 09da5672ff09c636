//! Observability: `/metrics` after a scripted mix of deliveries, parsed
//! with a real Prometheus text parser; log lines free of secrets and
//! signatures; JSON log lines; `/readyz` following the database.

use std::collections::HashMap;
use std::time::Duration;

use prometheus_parse::{Scrape, Value};

use crate::backend::{Backend, both_backends};
use crate::downstream::{Behavior, Downstream};
use crate::harness::{Client, Server, ServerConfig, headers, toml_str, wait_until};
use crate::sign;

const SECRET: &str = "whsec_metrics_test_secret_abcdef";
const FORWARD_SECRET: &str = "whsec_Zm9yd2FyZC1zaWduaW5nLXNlY3JldC10ZXN0";
const ADMIN_TOKEN: &str = "admin-token-never-logged-123-0123456789abcdef0123456789abcdef";

fn event(id: &str, amount: i64) -> Vec<u8> {
    serde_json::json!({"id": id, "type": "charge.succeeded",
                       "data": {"object": {"amount": amount}}})
    .to_string()
    .into_bytes()
}

fn scrape(server: &Server) -> Scrape {
    // With admin_token set and no admin_listen, metrics take the token.
    let resp = Client::new(Duration::from_secs(10)).get_with(
        &server.url("/metrics"),
        &headers(&[("Authorization", &format!("Bearer {ADMIN_TOKEN}"))]),
    );
    assert_eq!(resp.status, 200, "GET /metrics: {}", resp.text());
    let ct = resp.header("content-type").unwrap_or_default().to_string();
    assert!(ct.starts_with("text/plain"), "content type {ct}");
    let text = resp.text();
    Scrape::parse(text.lines().map(|l| Ok(l.to_string())))
        .unwrap_or_else(|e| panic!("the exposition does not parse: {e}\n{text}"))
}

/// The value of a counter or gauge with exactly these labels (others ignored).
fn value(scrape: &Scrape, metric: &str, labels: &[(&str, &str)]) -> f64 {
    let found: Vec<f64> = scrape
        .samples
        .iter()
        .filter(|s| s.metric == metric)
        .filter(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| match s.value {
            Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => v,
            _ => f64::NAN,
        })
        .collect();
    assert_eq!(
        found.len(),
        1,
        "expected one sample {metric}{labels:?}, got {found:?}"
    );
    found[0]
}

/// The count of a histogram (its +Inf bucket).
fn histogram_count(scrape: &Scrape, metric: &str) -> f64 {
    let sample = scrape
        .samples
        .iter()
        .find(|s| s.metric == metric)
        .unwrap_or_else(|| panic!("no histogram {metric}"));
    match &sample.value {
        Value::Histogram(buckets) => buckets
            .iter()
            .find(|b| b.less_than.is_infinite())
            .map(|b| b.count)
            .unwrap_or(f64::NAN),
        other => panic!("{metric} is not a histogram: {other:?}"),
    }
}

fn config(downstream: &Downstream) -> ServerConfig {
    ServerConfig::new()
        .set("admin_token", &toml_str("env:ADMIN_TOKEN"))
        .tables(&format!(
            r#"
[sources.pay]
kind = "stripe"
secrets = ["env:PAY_SECRET"]

[[sources.pay.actions]]
name = "notify"
forward = "{url}"
timeout = "2s"
lease = "5s"
retry_initial = "50ms"
retry_max = "200ms"
sign_secret = "env:FORWARD_SECRET"

[sources.other]
kind = "github"
secrets = ["env:PAY_SECRET"]
"#,
            url = downstream.url()
        ))
}

fn env() -> Vec<(&'static str, &'static str)> {
    vec![
        ("PAY_SECRET", SECRET),
        ("FORWARD_SECRET", FORWARD_SECRET),
        ("ADMIN_TOKEN", ADMIN_TOKEN),
    ]
}

fn metrics_count_a_scripted_mix_exactly(backend: Backend) {
    let downstream = Downstream::start();
    // The first accepted event's forward fails twice, then succeeds.
    downstream.script("pay:evt_m0:notify", Behavior::Fail500(2));
    let server = Server::start_on(backend, &config(&downstream), &env());

    // 5 accepted events, 3 duplicates of evt_m0, 1 mismatch.
    for i in 0..5 {
        let body = event(&format!("evt_m{i}"), 100 + i);
        let r = server.post("/hooks/pay", &sign::stripe_now(SECRET, &body), &body);
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let body0 = event("evt_m0", 100);
    for _ in 0..3 {
        let r = server.post("/hooks/pay", &sign::stripe_now(SECRET, &body0), &body0);
        assert_eq!(r.json_status().as_deref(), Some("duplicate"));
    }
    let changed = event("evt_m0", 999);
    let r = server.post("/hooks/pay", &sign::stripe_now(SECRET, &changed), &changed);
    assert_eq!(r.status, 200);
    // 2 bad signatures, 1 bad request (no id), 2 unknown sources, 1 wrong method.
    for _ in 0..2 {
        let r = server.post(
            "/hooks/pay",
            &sign::stripe_now("wrong-secret", &body0),
            &body0,
        );
        assert_eq!(r.status, 401);
    }
    let no_id = br#"{"type":"charge.succeeded"}"#;
    let r = server.post("/hooks/pay", &sign::stripe_now(SECRET, no_id), no_id);
    assert_eq!(r.status, 400);
    for name in ["nope", "x-y-z"] {
        let r = server.post(&format!("/hooks/{name}"), &headers(&[]), b"{}");
        assert_eq!(r.status, 404);
    }

    // Wait for the forwards: 5 effects, evt_m0 after two 500s.
    wait_until(Duration::from_secs(20), "all 5 forwards to succeed", || {
        downstream.total_effects() == 5
    });
    wait_until(Duration::from_secs(10), "all jobs done", || {
        server.count("SELECT count(*) FROM jobs WHERE status = 'done'", &[]) == 5
    });

    let s = scrape(&server);
    let d = |source: &str, outcome: &str| {
        value(
            &s,
            "idemhook_deliveries_total",
            &[("source", source), ("outcome", outcome)],
        )
    };
    assert_eq!(d("pay", "accepted"), 5.0);
    assert_eq!(d("pay", "duplicate"), 3.0);
    assert_eq!(d("pay", "mismatch"), 1.0);
    assert_eq!(d("pay", "bad_signature"), 2.0);
    assert_eq!(d("pay", "bad_request"), 1.0);
    assert_eq!(d("pay", "too_large"), 0.0);
    assert_eq!(d("pay", "unavailable"), 0.0);
    assert_eq!(d("other", "accepted"), 0.0);
    // Unknown sources are counted without their names as label values.
    let unknown: f64 = s
        .samples
        .iter()
        .filter(|x| x.metric == "idemhook_deliveries_total")
        .filter(|x| x.labels.get("outcome") == Some("unknown_source"))
        .map(|x| match x.value {
            Value::Counter(v) | Value::Untyped(v) => v,
            _ => 0.0,
        })
        .sum();
    assert_eq!(unknown, 2.0);
    assert!(
        !s.samples
            .iter()
            .any(|x| x.metric == "idemhook_deliveries_total"
                && x.labels.get("outcome") == Some("unknown_source")
                && x.labels.get("source") != Some("unknown")),
        "a configured source has no unknown_source series"
    );
    assert!(
        !s.samples
            .iter()
            .any(|x| x.labels.get("source") == Some("nope")),
        "request data became a label value"
    );

    // One claim per verified delivery with an id: 5 + 3 + 1.
    assert_eq!(histogram_count(&s, "idemhook_claim_duration_seconds"), 9.0);
    let a = |outcome: &str| {
        value(
            &s,
            "idemhook_action_attempts_total",
            &[
                ("source", "pay"),
                ("action", "notify"),
                ("outcome", outcome),
            ],
        )
    };
    assert_eq!(a("ok"), 5.0);
    assert_eq!(a("retry"), 2.0);
    assert_eq!(a("failed"), 0.0);
    assert_eq!(
        histogram_count(&s, "idemhook_downstream_duration_seconds"),
        7.0
    );
    assert_eq!(value(&s, "idemhook_jobs", &[("status", "done")]), 5.0);
    assert_eq!(value(&s, "idemhook_jobs", &[("status", "pending")]), 0.0);
    assert_eq!(value(&s, "idemhook_jobs", &[("status", "failed")]), 0.0);
    assert_eq!(value(&s, "idemhook_oldest_pending_age_seconds", &[]), 0.0);
    if backend == Backend::Sqlite {
        // The file's size; PostgreSQL has no file of idemhook's to measure.
        assert!(value(&s, "idemhook_database_bytes", &[]) > 0.0);
    }
    assert!(value(&s, "idemhook_uptime_seconds", &[]) > 0.0);

    // Logs: one line per delivery and per attempt, and no secret or
    // signature anywhere in them. Info lines are written out in batches
    // (every 10 ms), so wait for the last ones first.
    wait_until(
        Duration::from_secs(10),
        "the delivery and attempt log lines",
        || {
            let logs = server.logs();
            // (Requests to unknown sources are summarised apart.)
            logs.lines().filter(|l| l.contains(" delivery ")).count() >= 12
                && logs.lines().any(|l| l.contains(" unknown source "))
                && logs.lines().filter(|l| l.contains(" attempt ")).count() >= 7
        },
    );
    let logs = server.logs();
    let delivery_lines = logs.lines().filter(|l| l.contains(" delivery ")).count();
    // The two to unknown sources are one summary line, not a line each.
    assert_eq!(delivery_lines, 5 + 3 + 1 + 2 + 1, "{logs}");
    let unknown_lines = logs
        .lines()
        .filter(|l| l.contains(" unknown source "))
        .count();
    assert_eq!(unknown_lines, 1, "{logs}");
    let attempt_lines = logs.lines().filter(|l| l.contains(" attempt ")).count();
    assert_eq!(attempt_lines, 7, "{logs}");
    let mut forbidden = vec![
        SECRET.to_string(),
        FORWARD_SECRET.to_string(),
        ADMIN_TOKEN.to_string(),
    ];
    for body in [&body0, &changed] {
        let sig = sign::stripe_now(SECRET, body);
        for (_, v) in sig {
            if let Some(v1) = v.split(',').find_map(|p| p.strip_prefix("v1=")) {
                forbidden.push(v1.to_string());
            }
        }
    }
    for request in downstream.requests() {
        if let Some(sig) = request.header("webhook-signature") {
            forbidden.push(sig.trim_start_matches("v1,").to_string());
        }
    }
    for needle in &forbidden {
        assert!(
            !logs.contains(needle.as_str()),
            "a secret or signature reached the logs: {needle}"
        );
    }
}
both_backends!(metrics_count_a_scripted_mix_exactly);

/// SQL actions run in the claim; each run is an attempt and is counted
/// like a forward attempt, ok or failed, once per event (a duplicate runs
/// nothing), and again when an operator replays it through the API.
fn sql_action_attempts_are_counted(backend: Backend) {
    let server = Server::start_on(backend,
        &ServerConfig::new()
            .set("admin_token", &toml_str("env:ADMIN_TOKEN"))
            .set(
                "setup_sql",
                &toml_str("CREATE TABLE IF NOT EXISTS book (id TEXT PRIMARY KEY, amount INTEGER CHECK (amount < 103));"),
            )
            .tables(
                r#"
[sources.pay]
kind = "stripe"
secrets = ["env:PAY_SECRET"]

[[sources.pay.actions]]
name = "book"
sql = "INSERT INTO book (id, amount) VALUES (:event_id, :amount)"
params = { amount = "json:/data/object/amount" }

[[sources.pay.actions]]
name = "refunds-only"
types = ["charge.refunded"]
sql = "SELECT 1"
"#,
            ),
        &env(),
    );
    // Amounts 100 to 104: the CHECK fails the last two.
    for i in 0..5 {
        let body = event(&format!("evt_s{i}"), 100 + i);
        let r = server.post("/hooks/pay", &sign::stripe_now(SECRET, &body), &body);
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let body = event("evt_s0", 100);
    let r = server.post("/hooks/pay", &sign::stripe_now(SECRET, &body), &body);
    assert_eq!(r.json_status().as_deref(), Some("duplicate"));

    // An operator's replay through the admin API runs the action again
    // (still failing its CHECK): one more attempt.
    let r = server.post(
        "/api/events/pay/evt_s3/replay",
        &headers(&[("Authorization", &format!("Bearer {ADMIN_TOKEN}"))]),
        b"",
    );
    assert_eq!(r.status, 200, "{}", r.text());

    let s = scrape(&server);
    let a = |action: &str, outcome: &str| {
        value(
            &s,
            "idemhook_action_attempts_total",
            &[("source", "pay"), ("action", action), ("outcome", outcome)],
        )
    };
    assert_eq!(a("book", "ok"), 3.0);
    assert_eq!(a("book", "failed"), 3.0);
    assert_eq!(a("book", "retry"), 0.0);
    assert_eq!(a("refunds-only", "ok"), 0.0, "an action the type skips");
    assert_eq!(value(&s, "idemhook_jobs", &[("status", "done")]), 3.0);
    assert_eq!(value(&s, "idemhook_jobs", &[("status", "failed")]), 2.0);
}
both_backends!(sql_action_attempts_are_counted);

#[test]
fn json_log_lines_parse_and_carry_the_delivery_fields() {
    let downstream = Downstream::start();
    let mut server_env = env();
    server_env.push(("IDEMHOOK_LOG", "info"));
    let cfg = config(&downstream);
    let server = Server::start_with_args(&cfg, &server_env, &["--log-format", "json"]);
    let body = event("evt_json", 1);
    let r = server.post("/hooks/pay", &sign::stripe_now(SECRET, &body), &body);
    assert_eq!(r.status, 200);
    wait_until(Duration::from_secs(10), "the delivery log line", || {
        server.stderr().contains("evt_json")
    });
    let mut seen: HashMap<String, serde_json::Value> = HashMap::new();
    for line in server.stderr().lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not a JSON log line ({e}): {line}"));
        if let Some(msg) = v.get("msg").and_then(|m| m.as_str()) {
            seen.insert(msg.to_string(), v.clone());
        }
    }
    let delivery = seen.get("delivery").expect("a delivery line");
    assert_eq!(delivery["source"], "pay");
    assert_eq!(delivery["event_id"], "evt_json");
    assert_eq!(delivery["outcome"], "accepted");
    assert!(delivery.get("ms").is_some());
}

/// The development default makes an admin token for its inspector sign-in
/// only; `/metrics` on its loopback listener stays open, as it is where no
/// token is configured, while the admin API takes that token.
#[test]
fn the_development_default_serves_metrics_without_a_token() {
    let server = Server::start_zero_config(&[]);
    let resp = crate::harness::get(&server.url("/metrics"));
    assert_eq!(resp.status, 200, "GET /metrics: {}", resp.text());
    assert!(
        resp.text()
            .contains("idemhook_deliveries_total{source=\"demo\",outcome=\"accepted\"} 0"),
        "{}",
        resp.text()
    );
    let api = crate::harness::get(&server.url("/api/events"));
    assert_eq!(
        api.status,
        401,
        "the admin API takes the run's token: {}",
        api.text()
    );
}
