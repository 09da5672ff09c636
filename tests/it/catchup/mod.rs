//! Catch-up from the provider's API (`idemhook catchup`, serve's runs):
//! against local fakes of Stripe's and GitHub's APIs (`fakes`), on both
//! backends, with the real binary.

pub(crate) mod fakes;

use std::time::Duration;

use serde_json::Value;

use crate::backend::{Backend, both_backends};
use crate::downstream::Downstream;
use crate::harness::{Server, ServerConfig, now_secs, toml_str, wait_until};
use crate::helpers::{StripeHook, api};

use fakes::{GithubDelivery, HookTarget, stripe_event};

const SECRET: &str = "whsec_catchup_test";
const API_KEY: &str = "rk_test_catchup_key_do_not_print";
const ADMIN_TOKEN: &str = "catchup-admin-token-0123456789abcdef";
const STRIPE: StripeHook = StripeHook::new("stripe", SECRET);
const HOOK: &str = "repos/acme/shop/hooks/12345678";

fn env() -> Vec<(&'static str, &'static str)> {
    vec![
        ("STRIPE_SECRET", SECRET),
        ("API_KEY", API_KEY),
        ("ADMIN_TOKEN", ADMIN_TOKEN),
    ]
}

/// A stripe source catching up from `api_url`, with an SQL action
/// (`ledger`) and a forward action to `ds`.
fn stripe_config(api_url: &str, ds: &Downstream, interval: &str) -> ServerConfig {
    ServerConfig::new()
        .set("admin_token", &toml_str("env:ADMIN_TOKEN"))
        .set(
            "setup_sql",
            &toml_str("CREATE TABLE IF NOT EXISTS ledger (event_id TEXT NOT NULL)"),
        )
        .tables(&format!(
            "[sources.stripe]\nkind = \"stripe\"\nsecrets = [\"env:STRIPE_SECRET\"]\n\
             [sources.stripe.catchup]\napi_key = \"env:API_KEY\"\ninterval = \"{interval}\"\n\
             window = \"72h\"\napi_url = \"{api_url}\"\n\
             [[sources.stripe.actions]]\nname = \"ledger\"\n\
             sql = \"INSERT INTO ledger (event_id) VALUES (:event_id)\"\n\
             [[sources.stripe.actions]]\nname = \"notify\"\nforward = \"{}\"\n\
             timeout = \"2s\"\nretry_initial = \"50ms\"\nretry_max = \"200ms\"\n",
            ds.url()
        ))
}

fn events(n: usize, now: i64) -> Vec<Value> {
    (0..n)
        .map(|i| {
            stripe_event(
                &format!("evt_cu_{i:04}"),
                now - 3600 - i as i64,
                100 + i as i64,
            )
        })
        .collect()
}

/// The body Stripe would POST for `event`: the same event, its keys in
/// another order, `pending_webhooks` not 0, pretty-printed.
fn as_delivered(event: &Value) -> Vec<u8> {
    let mut e = event.clone();
    e["pending_webhooks"] = 1.into();
    let mut out = serde_json::Map::new();
    if let Value::Object(map) = e {
        for (k, v) in map.into_iter().rev() {
            out.insert(k, v);
        }
    }
    serde_json::to_vec_pretty(&Value::Object(out)).unwrap()
}

fn cli_catchup(server: &Server, args: &[&str]) -> crate::harness::CliOutput {
    let mut all = vec!["catchup", "stripe"];
    all.extend_from_slice(args);
    server.run_cli(&all)
}

/// 205 events over three pages, 3 of them delivered before: the dry run
/// changes nothing; the run claims the 202 missing ones (SQL action and
/// forward once each, deliveries recorded as `catchup`); a later real
/// delivery of a caught-up event is a plain duplicate; a second run finds
/// everything stored.
fn stripe_catchup_claims_only_the_missing_events(backend: Backend) {
    let ds = Downstream::start();
    let now = now_secs();
    let all = events(205, now);
    let fake = fakes::stripe(API_KEY, all.clone());
    let server = Server::start_on(backend, &stripe_config(&fake.url(), &ds, "0s"), &env());
    for e in &all[..3] {
        STRIPE.deliver_ok(&server, &serde_json::to_vec(e).unwrap());
    }

    let dry = cli_catchup(&server, &[]);
    assert!(dry.success(), "dry run: {}", dry.stderr);
    assert!(
        dry.stdout.contains("would claim evt_cu_0004"),
        "{}",
        dry.stdout
    );
    assert!(
        dry.stdout
            .contains("202 claimed, 0 redelivery requested, 3 already stored; nothing changed"),
        "{}",
        dry.stdout
    );
    assert_eq!(
        server.count("SELECT count(*) FROM events", &[]),
        3,
        "a dry run stored events"
    );

    let run = cli_catchup(&server, &["--yes", "--json"]);
    assert!(run.success(), "run: {}\n{}", run.stdout, run.stderr);
    let report = run.json();
    assert_eq!(
        report["claimed"].as_array().map(Vec::len),
        Some(202),
        "{report}"
    );
    assert_eq!(report["already_stored"], 3, "{report}");
    assert_eq!(report["error"], Value::Null, "{report}");
    assert_eq!(server.count("SELECT count(*) FROM events", &[]), 205);
    assert_eq!(server.count("SELECT count(*) FROM ledger", &[]), 205);
    assert_eq!(
        server.count("SELECT count(DISTINCT event_id) FROM ledger", &[]),
        205
    );
    assert_eq!(
        server.count(
            "SELECT count(*) FROM deliveries WHERE outcome = 'catchup'",
            &[]
        ),
        202
    );
    assert_eq!(
        server.count(
            "SELECT count(*) FROM events WHERE verified_with IS NULL",
            &[]
        ),
        202
    );
    wait_until(Duration::from_secs(60), "every forward done", || {
        ds.total_effects() == 205
    });
    assert_eq!(ds.effects("stripe:evt_cu_0100:notify"), 1);

    // Pagination: three pages, the second and third after the last id.
    let lists: Vec<_> = fake
        .seen()
        .into_iter()
        .filter(|s| s.method == "GET")
        .collect();
    assert_eq!(lists.len(), 6, "two runs of three pages: {lists:?}");
    assert!(
        lists[0].url.contains("limit=100") && lists[0].url.contains("created%5Bgte%5D="),
        "{:?}",
        lists[0]
    );
    assert!(
        lists[1].url.contains("starting_after=evt_cu_0099"),
        "{:?}",
        lists[1]
    );
    assert!(
        lists[2].url.contains("starting_after=evt_cu_0199"),
        "{:?}",
        lists[2]
    );
    assert!(
        lists
            .iter()
            .all(|s| s.authorization.as_deref() == Some(&format!("Bearer {API_KEY}")))
    );

    // Stripe delivers a caught-up event after all: a plain duplicate.
    let late = STRIPE.deliver_ok(&server, &as_delivered(&all[100]));
    assert_eq!(
        late.json_status().as_deref(),
        Some("duplicate"),
        "{}",
        late.text()
    );
    assert_eq!(server.count("SELECT count(*) FROM incidents", &[]), 0);
    assert_eq!(server.count("SELECT count(*) FROM ledger", &[]), 205);

    let again = cli_catchup(&server, &["--yes", "--json"]).json();
    assert_eq!(
        again["claimed"].as_array().map(Vec::len),
        Some(0),
        "{again}"
    );
    assert_eq!(again["already_stored"], 205, "{again}");

    // The last run, in reconcile; the key never printed.
    let rec = server.run_cli(&["reconcile", "--json"]);
    let rec: Value = serde_json::from_str(&rec.stdout).unwrap();
    assert_eq!(rec["catchup"][0]["already_stored"], 205, "{rec}");
    assert_eq!(rec["catchup"][0]["error"], Value::Null, "{rec}");
    for out in [&dry.stdout, &dry.stderr, &run.stdout, &run.stderr] {
        assert!(!out.contains(API_KEY), "the API key was printed");
    }
    assert!(!server.logs().contains(API_KEY), "the API key was logged");
}
both_backends!(stripe_catchup_claims_only_the_missing_events);

/// serve runs the catch-up every `interval`: its first runs meet 401, 429
/// (with Retry-After) and 500, each logged and reported, serve still up;
/// then the events are claimed, counted in the metric and shown by
/// `GET /api/reconcile`.
fn serve_catches_up_every_interval_through_api_errors(backend: Backend) {
    let ds = Downstream::start();
    let now = now_secs();
    let all = events(12, now);
    let fake = fakes::stripe(API_KEY, all);
    fake.script(
        401,
        &[],
        r#"{"error": {"type": "invalid_request_error", "message": "Invalid API Key provided: rk_****"}}"#,
    );
    fake.script(
        429,
        &[("Retry-After", "1")],
        r#"{"error": {"type": "invalid_request_error", "message": "Too many requests hit the API too quickly."}}"#,
    );
    fake.script(
        500,
        &[],
        r#"{"error": {"type": "api_error", "message": "Something went wrong on Stripe's end."}}"#,
    );
    let mut server = Server::start_on(backend, &stripe_config(&fake.url(), &ds, "300ms"), &env());
    wait_until(Duration::from_secs(60), "every event claimed", || {
        server.count("SELECT count(*) FROM events", &[]) == 12
    });
    assert!(server.is_running(), "serve stopped on an API error");
    let logs = server.logs();
    for expected in [
        "answered 401",
        "Invalid API Key provided",
        "answered 429",
        "retry after 1s",
        "answered 500",
    ] {
        assert!(
            logs.contains(expected),
            "no {expected:?} in the log:\n{logs}"
        );
    }
    assert!(!logs.contains(API_KEY), "the API key was logged");
    // Retry-After kept: the run after the 429 came no sooner than 1 s.
    let seen = fake.seen();
    assert_eq!(seen[1].status, 429);
    assert!(
        seen[2].at.duration_since(seen[1].at) >= Duration::from_millis(900),
        "asked again {:?} after a Retry-After of 1 s",
        seen[2].at.duration_since(seen[1].at)
    );
    assert_eq!(server.count("SELECT count(*) FROM ledger", &[]), 12);
    wait_until(Duration::from_secs(60), "every forward done", || {
        ds.total_effects() == 12
    });
    let (status, rec) = api(
        &server,
        "GET",
        "/api/reconcile",
        Some(ADMIN_TOKEN),
        Vec::new(),
    );
    assert_eq!(status, 200, "{rec}");
    let cu = &rec["catchup"][0];
    assert_eq!(cu["source"], "stripe", "{rec}");
    assert!(cu["last_run_at"].is_i64(), "{rec}");
    assert_eq!(cu["error"], Value::Null, "{rec}");
    let metrics = crate::harness::Client::new(Duration::from_secs(10)).get_with(
        &server.url("/metrics"),
        &[("Authorization".to_string(), format!("Bearer {ADMIN_TOKEN}"))],
    );
    let text = metrics.text();
    assert!(
        text.contains("idemhook_catchup_events_total{source=\"stripe\",outcome=\"claimed\"} 12"),
        "{text}"
    );
    server.kill9();
}
both_backends!(serve_catches_up_every_interval_through_api_errors);

fn github_delivery(id: i64, guid: &str, at: i64, redelivery: bool) -> GithubDelivery {
    GithubDelivery {
        id,
        guid: guid.to_string(),
        delivered_at: at,
        redelivery,
        event: "push".to_string(),
        body: format!(r#"{{"ref":"refs/heads/main","after":"{guid}"}}"#),
    }
}

/// GitHub: of a stored guid, a guid listed twice (its first delivery and
/// a failed redelivery), a guid older than the window and a missing one,
/// each missing guid in the window is asked for once; GitHub's redelivery
/// arrives signed and is stored; a second run asks for nothing.
fn github_redelivery_is_asked_once_per_missing_guid(backend: Backend) {
    let now = now_secs();
    let config = |api_url: &str| {
        ServerConfig::new().tables(&format!(
            "[sources.gh]\nkind = \"github\"\nsecrets = [\"env:STRIPE_SECRET\"]\n\
             [sources.gh.catchup]\napi_key = \"env:API_KEY\"\nhook = \"{HOOK}\"\n\
             interval = \"0s\"\nwindow = \"24h\"\napi_url = \"{api_url}\"\n"
        ))
    };
    let mut deliveries = vec![
        github_delivery(1, "guid-stored", now - 600, false),
        github_delivery(2, "guid-twice", now - 500, false),
        github_delivery(3, "guid-twice", now - 400, true),
        github_delivery(4, "guid-too-old", now - 2 * 86_400, false),
        github_delivery(5, "guid-missing", now - 300, false),
    ];
    // Enough to fill two pages of 100.
    for i in 0..150 {
        deliveries.push(github_delivery(
            100 + i,
            &format!("guid-bulk-{i:03}"),
            now - 1000 - i,
            false,
        ));
    }
    let target = HookTarget {
        url: Default::default(),
        secret: SECRET.to_string(),
    };
    let fake = fakes::github(API_KEY, HOOK, deliveries.clone(), target.clone());
    let mut server = Server::start_on(backend, &config(&fake.url()), &env());
    *target.url.lock().unwrap() = server.url("/hooks/gh");
    let stored = &deliveries[0];
    let r = server.post(
        "/hooks/gh",
        &crate::sign::github(SECRET, stored.body.as_bytes(), &stored.guid, "push"),
        stored.body.as_bytes(),
    );
    assert_eq!(r.status, 200, "{}", r.text());

    let dry = server.run_cli(&["catchup", "gh"]);
    assert!(dry.success(), "{}\n{}", dry.stdout, dry.stderr);
    assert!(
        dry.stdout
            .contains("would ask GitHub to redeliver guid-missing"),
        "{}",
        dry.stdout
    );
    assert!(
        fake.seen().iter().all(|s| s.method == "GET"),
        "a dry run asked for a redelivery"
    );

    let run = server.run_cli(&["catchup", "gh", "--yes", "--json"]);
    assert!(run.success(), "{}\n{}", run.stdout, run.stderr);
    let report = run.json();
    assert_eq!(
        report["redelivery_requested"].as_array().map(Vec::len),
        Some(152),
        "{report}"
    );
    assert_eq!(report["already_stored"], 1, "{report}");
    let attempts: Vec<String> = fake
        .seen()
        .into_iter()
        .filter(|s| s.method == "POST")
        .map(|s| s.url)
        .collect();
    assert_eq!(attempts.len(), 152, "{attempts:?}");
    let twice = format!("/{HOOK}/deliveries/3/attempts");
    let first_of_twice = format!("/{HOOK}/deliveries/2/attempts");
    assert_eq!(
        attempts
            .iter()
            .filter(|u| **u == twice || **u == first_of_twice)
            .count(),
        1,
        "guid-twice asked {attempts:?}"
    );
    assert!(
        !attempts
            .iter()
            .any(|u| u.contains("/deliveries/1/") || u.contains("/deliveries/4/"))
    );
    let gets: Vec<_> = fake
        .seen()
        .into_iter()
        .filter(|s| s.method == "GET")
        .collect();
    assert!(
        gets.iter()
            .all(|s| s.accept.as_deref() == Some("application/vnd.github+json"))
    );
    assert!(
        gets.iter().any(|s| s.url.contains("cursor=v1_100")),
        "the next page was not followed"
    );
    wait_until(Duration::from_secs(60), "every redelivery stored", || {
        server.count("SELECT count(*) FROM events", &[]) == 153
    });
    assert_eq!(
        server.count(
            "SELECT count(*) FROM events WHERE event_id = 'guid-too-old'",
            &[]
        ),
        0
    );
    let again = server.run_cli(&["catchup", "gh", "--yes", "--json"]).json();
    assert_eq!(
        again["redelivery_requested"].as_array().map(Vec::len),
        Some(0),
        "{again}"
    );
    assert_eq!(again["already_stored"], 153, "{again}");
    server.kill9();
}
both_backends!(github_redelivery_is_asked_once_per_missing_guid);

/// Two instances on one PostgreSQL database catching up the same window
/// every 200 ms: every event claimed once (one `catchup` delivery each,
/// the SQL action and the forward once), the two serves' metric summing
/// to the events.
#[test]
fn two_postgres_instances_catch_up_the_same_window_once() {
    if !Backend::Postgres.available("two_postgres_instances_catch_up_the_same_window_once") {
        return;
    }
    let ds = Downstream::start();
    let now = now_secs();
    let fake = fakes::stripe(API_KEY, events(300, now));
    let config = Backend::Postgres.config(stripe_config(&fake.url(), &ds, "200ms"));
    let a = Server::start(&config, &env());
    let b = Server::start(&config, &env());
    wait_until(Duration::from_secs(60), "every event claimed", || {
        a.count("SELECT count(*) FROM events", &[]) == 300
    });
    // Both have run since: their runs found everything stored.
    wait_until(Duration::from_secs(30), "both instances ran again", || {
        fake.seen().len() >= 3 * 6
    });
    assert_eq!(
        a.count(
            "SELECT count(*) FROM deliveries WHERE outcome = 'catchup'",
            &[]
        ),
        300
    );
    assert_eq!(a.count("SELECT count(*) FROM ledger", &[]), 300);
    wait_until(Duration::from_secs(60), "every forward done", || {
        ds.total_effects() == 300
    });
    let claimed = |s: &Server| -> u64 {
        let text = crate::harness::Client::new(Duration::from_secs(10))
            .get_with(
                &s.url("/metrics"),
                &[("Authorization".to_string(), format!("Bearer {ADMIN_TOKEN}"))],
            )
            .text();
        text.lines()
            .find_map(|l| {
                l.strip_prefix(
                    "idemhook_catchup_events_total{source=\"stripe\",outcome=\"claimed\"} ",
                )
            })
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no claimed count in {text}"))
    };
    assert_eq!(claimed(&a) + claimed(&b), 300);
}

/// The pinned version of Stripe's official Python library the Stripe fake
/// is proven against (`.ci/run` installs it).
const STRIPE_PYTHON: &str = "11.6.0";

/// The Stripe fake is the API Stripe's own client expects: the official
/// library, pointed at it with `stripe.api_base`, lists every event with
/// auto-pagination, newest first, and a wrong key gets its
/// AuthenticationError. Skipped loudly without the library (a failure
/// under CI=true).
#[test]
fn the_stripe_fake_satisfies_stripes_official_client() {
    let has = std::process::Command::new("python3")
        .args([
            "-c",
            "import stripe, sys; sys.exit(0 if stripe.VERSION == sys.argv[1] else 1)",
            STRIPE_PYTHON,
        ])
        .status()
        .is_ok_and(|s| s.success());
    if !has {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "Stripe's Python library {STRIPE_PYTHON} is not installed under CI=true"
        );
        eprintln!(
            "SKIPPED the_stripe_fake_satisfies_stripes_official_client: pip install stripe=={STRIPE_PYTHON} to run it"
        );
        return;
    }
    let now = now_secs();
    let all = events(230, now);
    let fake = fakes::stripe(API_KEY, all.clone());
    let script = r#"
import json, sys, stripe
stripe.api_base = sys.argv[1]
stripe.api_key = sys.argv[2]
try:
    ids = [e.id for e in stripe.Event.list(limit=100, created={"gte": int(sys.argv[3])}).auto_paging_iter()]
    print(json.dumps({"ids": ids}))
except stripe.error.AuthenticationError as e:
    print(json.dumps({"auth_error": e.user_message}))
"#;
    let run = |key: &str| -> Value {
        let out = std::process::Command::new("python3")
            .args(["-c", script, &fake.url(), key, &(now - 86_400).to_string()])
            .output()
            .expect("python3 runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("the script prints JSON")
    };
    let listed = run(API_KEY);
    let expected: Vec<&str> = all.iter().map(|e| e["id"].as_str().unwrap()).collect();
    let got: Vec<&str> = listed["ids"]
        .as_array()
        .unwrap_or_else(|| panic!("{listed}"))
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(got, expected, "the official client's auto-pagination");
    let pages: Vec<_> = fake
        .seen()
        .into_iter()
        .filter(|s| s.status == 200)
        .collect();
    assert_eq!(pages.len(), 3, "{pages:?}");
    let refused = run("rk_test_wrong");
    assert!(
        refused["auth_error"]
            .as_str()
            .is_some_and(|m| m.contains("Invalid API Key")),
        "{refused}"
    );
}

/// A delivery is stored under its whole body's hash (the claim hashes
/// nothing more); an event caught up from the API list under `listed:`
/// and its id, type and data. A later delivery of the caught-up event,
/// formatted otherwise and with another `pending_webhooks`, is a
/// duplicate; one whose data changed is a mismatch; a redelivery of a
/// delivered event with the same body is a duplicate.
fn deliveries_keep_the_whole_body_hash_and_a_caught_up_event_its_listed_parts(backend: Backend) {
    let ds = Downstream::start();
    let now = now_secs();
    let listed = stripe_event("evt_listed", now - 60, 500);
    let fake = fakes::stripe(API_KEY, vec![listed.clone()]);
    let server = Server::start_on(backend, &stripe_config(&fake.url(), &ds, "0s"), &env());
    let plain = serde_json::to_vec(&stripe_event("evt_plain", now - 30, 700)).unwrap();
    STRIPE.deliver_ok(&server, &plain);
    let placeholder = match backend {
        Backend::Sqlite => "?1",
        Backend::Postgres => "$1",
    };
    let stored_as = |id: &str, hash: &str| {
        server.count(
            &format!(
                "SELECT count(*) FROM events WHERE event_id = '{id}' AND payload_hash LIKE {placeholder}"
            ),
            &[&hash.to_string()],
        ) == 1
    };
    assert!(stored_as("evt_plain", &crate::sign::sha256_hex(&plain)));
    let again = STRIPE.deliver_ok(&server, &plain);
    assert_eq!(
        again.json_status().as_deref(),
        Some("duplicate"),
        "{}",
        again.text()
    );

    let run = cli_catchup(&server, &["--yes", "--json"]);
    assert!(run.success(), "run: {}\n{}", run.stdout, run.stderr);
    assert_eq!(run.json()["claimed"].as_array().map(Vec::len), Some(1));
    let listed_hash = crate::sign::stripe_listed_hash(&serde_json::to_vec(&listed).unwrap());
    assert!(stored_as("evt_listed", &format!("listed:{listed_hash}")));
    let late = STRIPE.deliver_ok(&server, &as_delivered(&listed));
    assert_eq!(
        late.json_status().as_deref(),
        Some("duplicate"),
        "{}",
        late.text()
    );
    assert_eq!(server.count("SELECT count(*) FROM incidents", &[]), 0);

    let mut changed = listed.clone();
    changed["data"]["object"]["amount"] = 999.into();
    STRIPE.deliver_ok(&server, &as_delivered(&changed));
    assert_eq!(
        server.count(
            "SELECT count(*) FROM deliveries WHERE outcome = 'mismatch'",
            &[]
        ),
        1
    );
}
both_backends!(deliveries_keep_the_whole_body_hash_and_a_caught_up_event_its_listed_parts);
