//! The operator commands and the admin API on PostgreSQL answer the same
//! JSON as on SQLite: one scenario (events stored by the real server, a
//! failed SQL action, forward jobs failed, done downstream or paused, a
//! mismatched duplicate) runs on both backends, and every answer of
//! `events list/show`, the inspector's routes, `reconcile` (with
//! `--check`, `--yes` and the API's POST), `pause`/`resume` and `erase`
//! is compared, times and addresses aside. Without PostgreSQL the test
//! says SKIPPED.

use std::time::Duration;

use serde_json::{Value, json};

use crate::backend::Backend;
use crate::downstream::{Behavior, Downstream};
use crate::harness::{CliOutput, HTTP_TIMEOUT, Server, ServerConfig, toml_str, wait_for};
use crate::helpers::{StripeHook, api, job_status};

const SECRET: &str = "whsec_it_pg_ops_0123456789";
const STRIPE: StripeHook = StripeHook::new("stripe", SECRET);
const TOKEN: &str = "it-pg-ops-token-5e1d-0123456789abcdef0123456789abcdef";
const JOBS_TIMEOUT: Duration = Duration::from_secs(60);

/// Written once for both backends: the types and the CHECK are both
/// SQLite's and PostgreSQL's.
const SETUP_SQL: &str = "CREATE TABLE IF NOT EXISTS ledger (event_id text PRIMARY KEY, \
                         amount bigint NOT NULL CHECK (amount >= 0))";

/// `notify` has no circuit: its count of consecutive failures (shown by
/// `GET /api/actions`) would depend on which worker finished first.
fn config(ds: &Downstream) -> ServerConfig {
    ServerConfig::new()
        .set("setup_sql", &toml_str(SETUP_SQL))
        .set("admin_token", &toml_str("env:IDEMHOOK_ADMIN_TOKEN"))
        .tables(&format!(
            "[sources.stripe]\nkind = \"stripe\"\nsecrets = [\"env:STRIPE_SECRET\"]\n\
             [[sources.stripe.actions]]\nname = \"ledger\"\n\
             sql = \"INSERT INTO ledger (event_id, amount) VALUES (:event_id, :amount)\"\n\
             params = {{ amount = \"json:/data/object/amount\" }}\n\
             [[sources.stripe.actions]]\nname = \"notify\"\nforward = \"{url}/notify\"\n\
             max_attempts = 1\ntimeout = \"5s\"\nlease = \"15s\"\ncheck = \"{check}\"\n\
             circuit_failures = 0\n\
             [[sources.stripe.actions]]\nname = \"later\"\nforward = \"{url}/later\"\n",
            url = ds.url(),
            check = ds.check_template(),
        ))
}

fn env() -> Vec<(&'static str, &'static str)> {
    vec![("STRIPE_SECRET", SECRET), ("IDEMHOOK_ADMIN_TOKEN", TOKEN)]
}

fn body(id: &str, amount: i64) -> Vec<u8> {
    json!({
        "id": id, "object": "event", "type": "charge.succeeded",
        "data": {"object": {"amount": amount}}
    })
    .to_string()
    .into_bytes()
}

fn key(id: &str, action: &str) -> String {
    format!("stripe:{id}:{action}")
}

/// `GET /api/events` with `If-None-Match: known`: (status, ETag).
fn list_tag(server: &Server, known: &str) -> (u16, String) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(HTTP_TIMEOUT))
        .build()
        .into();
    let resp = agent
        .get(&server.url("/api/events?details=true"))
        .header("Authorization", &format!("Bearer {TOKEN}"))
        .header("If-None-Match", known)
        .call()
        .unwrap_or_else(|e| panic!("GET /api/events: {e}"));
    let tag = resp
        .headers()
        .get("etag")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    (resp.status().as_u16(), tag)
}

fn get_ok(server: &Server, path: &str) -> Value {
    let (status, v) = api(server, "GET", path, Some(TOKEN), b"");
    assert_eq!(status, 200, "GET {path}: {v}\n{}", server.logs());
    v
}

fn post_ok(server: &Server, path: &str, body: &str) -> Value {
    let (status, v) = api(server, "POST", path, Some(TOKEN), body);
    assert_eq!(status, 200, "POST {path}: {v}\n{}", server.logs());
    v
}

fn wait_job(server: &Server, id: &str, action: &str, status: &str) {
    wait_for(
        JOBS_TIMEOUT,
        &format!("{id}/{action} {status}"),
        || match job_status(server, "stripe", id, action) {
            Some(s) if s == status => Ok(()),
            other => Err(format!("{other:?}")),
        },
    );
}

fn cli(server: &Server, args: &[&str], code: i32) -> CliOutput {
    let out = server.run_cli(args);
    assert_eq!(
        out.status.code(),
        Some(code),
        "idemhook {args:?}\n{}\n{}",
        out.stdout,
        out.stderr
    );
    out
}

/// Times, addresses, lease holders, downstream request ids and the
/// database's own error text differ from run to run (and backend to
/// backend); everything else must not.
fn normalise(v: &mut Value) {
    match v {
        Value::Object(map) => {
            for (k, item) in map.iter_mut() {
                let varies = k.ends_with("_at")
                    || k.ends_with("_ms")
                    || k.ends_with("_until")
                    || [
                        "from",
                        "to",
                        "remote",
                        "lease_owner",
                        "request_id",
                        "stripe-signature",
                    ]
                    .contains(&k.as_str());
                if varies && !item.is_null() {
                    *item = json!("*");
                } else {
                    normalise(item);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(normalise),
        // Each database words its own errors.
        Value::String(text) if text.to_lowercase().contains("check constraint") => {
            *text = "the database's CHECK error".to_string();
        }
        Value::String(text) => *text = without_ports(text),
        _ => {}
    }
}

/// `127.0.0.1:PORT` in a text (an incident's detail) as `127.0.0.1:*`.
fn without_ports(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("127.0.0.1:") {
        let (head, tail) = rest.split_at(at + "127.0.0.1:".len());
        out.push_str(head);
        out.push('*');
        rest = tail.trim_start_matches(|c: char| c.is_ascii_digit());
    }
    out.push_str(rest);
    out
}

/// The overview without its per-minute buckets (their times move), and
/// the job counts without zeros (SQLite keeps a row for a status once
/// seen; PostgreSQL counts the statuses that have jobs).
fn overview_summary(mut v: Value) -> Value {
    if let Some(jobs) = v["jobs"].as_object_mut() {
        jobs.retain(|_, n| n != 0);
    }
    json!({"totals": v["totals"], "jobs": v["jobs"], "outcomes": v["outcomes"]})
}

/// The scenario on `backend`: every answer, labelled.
fn scenario(backend: Backend) -> Vec<(String, Value)> {
    let ds = Downstream::start_without_dedupe();
    // evt_c's and evt_f's forward reaches the downstream but the answer
    // is cut off (done there, failed here); evt_d's is refused (not done).
    ds.script(&key("evt_c", "notify"), Behavior::ProcessThenDrop(1));
    ds.script(&key("evt_f", "notify"), Behavior::ProcessThenDrop(1));
    ds.script(&key("evt_d", "notify"), Behavior::Reject400);
    let server = Server::start_on(backend, &config(&ds), &env());
    let mut out: Vec<(String, Value)> = Vec::new();
    let mut record = |label: &str, mut v: Value| {
        normalise(&mut v);
        out.push((label.to_string(), v));
    };

    let paused = cli(&server, &["pause", "stripe/later"], 0);
    assert!(paused.stdout.contains("paused stripe/later"), "{paused:?}");
    STRIPE.deliver_ok(&server, &body("evt_a", 10));
    STRIPE.deliver_ok(&server, &body("evt_b", -5)); // the ledger's CHECK fails the SQL job
    STRIPE.deliver_ok(&server, &body("evt_c", 7));
    // One failure after the other: reconcile lists the latest first.
    wait_job(&server, "evt_c", "notify", "failed");
    STRIPE.deliver_ok(&server, &body("evt_d", 8));
    STRIPE.deliver_ok(&server, &body("evt_a", 10)); // a duplicate
    STRIPE.deliver_ok(&server, &body("evt_a", 11)); // a mismatched duplicate: an incident
    for (id, status) in [
        ("evt_a", "done"),
        ("evt_b", "done"),
        ("evt_c", "failed"),
        ("evt_d", "failed"),
    ] {
        wait_job(&server, id, "notify", status);
    }

    record(
        "events list --json",
        cli(&server, &["events", "list", "--json"], 0).json(),
    );
    record(
        "events list --status failed --limit 1 --json",
        cli(
            &server,
            &[
                "events", "list", "--status", "failed", "--limit", "1", "--json",
            ],
            0,
        )
        .json(),
    );
    for id in ["evt_a", "evt_b", "evt_c"] {
        record(
            &format!("events show {id} --json"),
            cli(&server, &["events", "show", "stripe", id, "--json"], 0).json(),
        );
    }
    let missing = cli(&server, &["events", "show", "stripe", "evt_none"], 1);
    assert!(missing.stderr.contains("no event"), "{missing:?}");
    let shown = cli(&server, &["events", "show", "stripe", "evt_a"], 0);
    assert!(
        shown.stdout.contains("payload_mismatch") && shown.stdout.contains("\"amount\": 10"),
        "{}",
        shown.stdout
    );
    record("GET /api/events", get_ok(&server, "/api/events"));
    record(
        "GET /api/events?details=true",
        get_ok(&server, "/api/events?details=true&limit=10"),
    );
    record(
        "GET /api/events?id=evt_&type=charge.succeeded&status=failed",
        get_ok(
            &server,
            "/api/events?id=evt_&type=charge.succeeded&status=failed",
        ),
    );
    for id in ["evt_a", "evt_c"] {
        record(
            &format!("GET /api/events/stripe/{id}?details=true"),
            get_ok(&server, &format!("/api/events/stripe/{id}?details=true")),
        );
    }
    let (status, v) = api(
        &server,
        "GET",
        "/api/events/stripe/evt_none",
        Some(TOKEN),
        b"",
    );
    assert_eq!(status, 404, "{v}");
    // The inspector's poll: the same list is a 304 from its tag, a new
    // delivery (or a job that moves) a new tag.
    let (status, tag) = list_tag(&server, "");
    assert_eq!(status, 200);
    assert_eq!(list_tag(&server, &tag), (304, tag.clone()));
    STRIPE.deliver_ok(&server, &body("evt_a", 10));
    let (status, newer) = list_tag(&server, &tag);
    assert!(status == 200 && newer != tag, "{status} {newer} {tag}");
    let page = server.get("/ui/");
    assert_eq!(page.status, 200, "the inspector's page");
    record("GET /api/actions", get_ok(&server, "/api/actions"));
    record(
        "GET /api/overview",
        overview_summary(get_ok(&server, "/api/overview")),
    );

    record(
        "reconcile --json",
        cli(&server, &["reconcile", "--json"], 1).json(),
    );
    record("GET /api/reconcile", get_ok(&server, "/api/reconcile"));
    record(
        "GET /api/reconcile?check=1",
        get_ok(&server, "/api/reconcile?check=1"),
    );
    record(
        "reconcile --check --json",
        cli(&server, &["reconcile", "--check", "--json"], 1).json(),
    );
    // Marks evt_c's job done (a new attempt, ok/confirmed); evt_d's stays.
    record(
        "reconcile --check --yes --json",
        cli(&server, &["reconcile", "--check", "--yes", "--json"], 1).json(),
    );
    assert_eq!(
        job_status(&server, "stripe", "evt_c", "notify").as_deref(),
        Some("done")
    );
    STRIPE.deliver_ok(&server, &body("evt_f", 9));
    wait_job(&server, "evt_f", "notify", "failed");
    // The API's POST marks evt_f's done the same way.
    record(
        "POST /api/reconcile",
        post_ok(&server, "/api/reconcile", r#"{"check": true}"#),
    );
    record(
        "GET /api/events/stripe/evt_f",
        get_ok(&server, "/api/events/stripe/evt_f"),
    );

    record(
        "POST /api/actions/stripe/later/resume",
        post_ok(&server, "/api/actions/stripe/later/resume", ""),
    );
    for id in ["evt_a", "evt_b", "evt_c", "evt_d", "evt_f"] {
        wait_job(&server, id, "later", "done");
    }
    record(
        "POST /api/actions/stripe/notify/pause",
        post_ok(&server, "/api/actions/stripe/notify/pause", ""),
    );
    record(
        "POST /api/actions/stripe/notify/pause (again)",
        post_ok(&server, "/api/actions/stripe/notify/pause", ""),
    );
    let (status, v) = api(
        &server,
        "POST",
        "/api/actions/stripe/ledger/pause",
        Some(TOKEN),
        b"",
    );
    assert_eq!(status, 400, "an sql action cannot be paused: {v}");
    record("GET /api/actions (paused)", get_ok(&server, "/api/actions"));
    let resumed = cli(&server, &["resume", "stripe/notify"], 0);
    assert!(
        resumed.stdout.contains("resumed stripe/notify"),
        "{resumed:?}"
    );

    let dry = cli(&server, &["erase", "stripe", "evt_a"], 0);
    assert!(
        dry.stdout.contains("would drop the stored body") && dry.stdout.contains("nothing changed"),
        "{dry:?}"
    );
    let erased = cli(&server, &["erase", "stripe", "evt_a", "--yes"], 0);
    assert!(erased.stdout.contains("erased stripe/evt_a"), "{erased:?}");
    record(
        "events show evt_a --json (erased)",
        cli(&server, &["events", "show", "stripe", "evt_a", "--json"], 0).json(),
    );
    let again = cli(&server, &["erase", "stripe", "evt_a"], 0);
    assert!(again.stdout.contains("already erased"), "{again:?}");
    record(
        "reconcile --json (after)",
        cli(&server, &["reconcile", "--json"], 1).json(),
    );
    out
}

/// Every operator answer of the scenario is the same JSON on PostgreSQL
/// as on SQLite.
#[test]
fn operator_commands_and_the_admin_api_answer_alike_on_both_backends() {
    if !Backend::Postgres
        .available("pg::commands::operator_commands_and_the_admin_api_answer_alike")
    {
        return;
    }
    let on_sqlite = scenario(Backend::Sqlite);
    let on_pg = scenario(Backend::Postgres);
    assert_eq!(on_sqlite.len(), on_pg.len());
    for ((label, sqlite), (_, pg)) in on_sqlite.iter().zip(&on_pg) {
        assert_eq!(
            pg, sqlite,
            "{label}: PostgreSQL answered\n{pg:#}\nSQLite answered\n{sqlite:#}"
        );
    }
    // The scenario did what it says (so equal answers are not both empty).
    let list = &on_pg[0].1;
    assert_eq!(list.as_array().map(Vec::len), Some(4), "{list:#}");
    let failed = on_pg
        .iter()
        .find(|(l, _)| l == "reconcile --json")
        .map(|(_, v)| v["counts"].clone());
    assert_eq!(
        failed,
        Some(
            json!({"stuck": 0, "overdue": 0, "failed": 3, "held": 0, "waiting": 0, "paused": 1, "circuits": 0})
        ),
    );
}

/// On PostgreSQL the commands that do not run there refuse with exit 2:
/// `backup` points at pg_dump.
#[test]
fn backup_on_postgres_points_at_pg_dump() {
    if !Backend::Postgres.available("pg::commands::backup_on_postgres_points_at_pg_dump") {
        return;
    }
    let ds = Downstream::start();
    let server = Server::start_on(Backend::Postgres, &config(&ds), &env());
    let copy = server.dir().join("copy.db");
    let out = server.run_cli(&["backup", &copy.display().to_string()]);
    assert!(
        out.status.code() == Some(2) && out.stderr.contains("pg_dump") && !copy.exists(),
        "{out:?}"
    );
    // A working command on the same config, for contrast.
    let list = cli(&server, &["events", "list"], 0);
    assert!(list.stdout.contains("no events match"), "{list:?}");
}

/// PostgreSQL stopped: the admin API answers 503 (reads and a write) and
/// an operator command exits 2; once it is back,
/// the API answers again without a restart of idemhook.
#[test]
fn the_admin_api_answers_503_and_the_cli_exits_2_while_postgres_is_stopped() {
    let Some(local) = crate::pg_cluster::private() else {
        crate::pg_cluster::skipped(
            "pg::commands::the_admin_api_answers_503_and_the_cli_exits_2_while_postgres_is_stopped",
        );
        return;
    };
    let url = local.cluster().create_database("it_pg_ops_down");
    let ds = Downstream::start();
    let server = Server::start(
        &config(&ds)
            .set("database", &toml_str(&url))
            .set("busy_timeout", &toml_str("2s")),
        &env(),
    );
    STRIPE.deliver_ok(&server, &body("evt_a", 1));
    assert_eq!(
        get_ok(&server, "/api/events").as_array().map(Vec::len),
        Some(1)
    );

    local.stop();
    for (method, path) in [
        ("GET", "/api/events"),
        ("GET", "/api/reconcile"),
        ("POST", "/api/actions/stripe/later/pause"),
    ] {
        let (status, v) = api(&server, method, path, Some(TOKEN), b"");
        assert_eq!(status, 503, "{method} {path}: {v}");
        assert!(
            v["error"]
                .as_str()
                .is_some_and(|e| e.contains("retry later")),
            "{v}"
        );
    }
    let out = server.run_cli(&["events", "list", "--json"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");

    local.spawn().expect("PostgreSQL starts again");
    local.wait_ready().expect("PostgreSQL is ready again");
    wait_for(JOBS_TIMEOUT, "the admin API answers again", || {
        match api(&server, "GET", "/api/events", Some(TOKEN), b"") {
            (200, v) => Ok(v),
            (status, v) => Err(format!("{status} {v}")),
        }
    });
    let out = cli(&server, &["events", "list", "--json"], 0);
    assert_eq!(out.json().as_array().map(Vec::len), Some(1));
}

/// Two instances on one PostgreSQL database: a pause through one
/// instance's API holds the jobs of events the other one claims, either
/// instance's API reports them, a resume through the other one releases
/// them, and the workers of both deliver each once; `reconcile` from the
/// command line is clean after.
#[test]
fn operator_changes_through_one_instance_hold_for_the_other() {
    if !Backend::Postgres
        .available("pg::commands::operator_changes_through_one_instance_hold_for_the_other")
    {
        return;
    }
    let ds = Downstream::start();
    let config = Backend::Postgres.config(config(&ds));
    let a = Server::start(&config, &env());
    let b = Server::start(&config, &env());
    let paused = post_ok(&a, "/api/actions/stripe/later/pause", "");
    assert_eq!(paused["paused"], true, "{paused}");
    let ids = ["evt_m1", "evt_m2", "evt_m3", "evt_m4"];
    for id in ids {
        STRIPE.deliver_ok(&b, &body(id, 3));
    }
    for id in ids {
        wait_job(&a, id, "notify", "done");
        assert_eq!(
            job_status(&a, "stripe", id, "later").as_deref(),
            Some("paused")
        );
    }
    let actions = get_ok(&a, "/api/actions");
    let later = actions
        .as_array()
        .and_then(|all| all.iter().find(|x| x["action"] == "later"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        (&later["paused"], &later["counts"]["paused"]),
        (&json!(true), &json!(4)),
        "{actions:#}"
    );
    let report = get_ok(&b, "/api/reconcile");
    assert_eq!(report["paused"][0]["waiting"], 4, "{report:#}");
    let resumed = post_ok(&b, "/api/actions/stripe/later/resume", "");
    assert_eq!(resumed["jobs_resumed"], 4, "{resumed}");
    for id in ids {
        wait_job(&b, id, "later", "done");
        assert_eq!(ds.effects(&key(id, "later")), 1, "{id}");
        assert_eq!(ds.effects(&key(id, "notify")), 1, "{id}");
    }
    let clean = cli(&a, &["reconcile", "--json"], 0).json();
    assert_eq!(clean["clean"], true, "{clean:#}");
    let list = cli(&b, &["events", "list", "--json"], 0).json();
    assert_eq!(list.as_array().map(Vec::len), Some(4), "{list:#}");
}
