//! Notifications to `[[notify]]` targets: real capture servers on
//! 127.0.0.1 (a Slack-style one and a JSON webhook, which also play the
//! team's app that refuses forwards) and a real SMTP server (PyPI's
//! aiosmtpd, `tests/support/smtp_capture.py`). Each test checks what the
//! target received, the `notifications` rows, and that no secret of a
//! target's URL reached a message, a log line, `check` or the API.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

use crate::backend::{Backend, both_backends};
use crate::harness::{Server, ServerConfig, toml_str, wait_until};
use crate::helpers::{StripeHook, api, stripe_source};

const STRIPE_SECRET: &str = "whsec_it_notify_stripe_0123456789";
const STRIPE: StripeHook = StripeHook::new("stripe", STRIPE_SECRET);
const TOKEN: &str = "it-notify-admin-token-0123456789abcdef";
/// Parts of the targets' URLs that are secrets: never printed.
const SLACK_SECRET: &str = "T000SLACKSECRETPATH";
const HOOK_SECRET: &str = "HOOKSECRETPATH";
const SIGN_SECRET: &str = "whsec_bm90aWZ5LXNpZ24tc2VjcmV0LWZvci10ZXN0cw==";
const WAIT: Duration = Duration::from_secs(30);

/// One request a capture server received.
#[derive(Clone, Debug)]
struct Captured {
    path: String,
    headers: Vec<(String, String)>,
    body: Value,
}

/// An HTTP server on 127.0.0.1 that records every request and answers
/// `status` (settable: 503 plays a target that is down), 400 on `/app`
/// (the team's app refusing every forward: a dead letter at once).
struct Capture {
    addr: String,
    seen: Arc<Mutex<Vec<Captured>>>,
    status: Arc<AtomicU16>,
    server: Arc<tiny_http::Server>,
}

impl Capture {
    fn start() -> Capture {
        let server = Arc::new(tiny_http::Server::http("127.0.0.1:0").expect("bind capture"));
        let addr = server
            .server_addr()
            .to_ip()
            .expect("ip address")
            .to_string();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let status = Arc::new(AtomicU16::new(200));
        let (s, seen2, status2) = (server.clone(), seen.clone(), status.clone());
        std::thread::spawn(move || {
            for mut rq in s.incoming_requests() {
                let mut body = String::new();
                let _ = rq.as_reader().read_to_string(&mut body);
                let path = rq.url().to_string();
                let answer = if path == "/app" {
                    400
                } else {
                    status2.load(Ordering::SeqCst)
                };
                if path != "/app" {
                    seen2.lock().unwrap().push(Captured {
                        path,
                        headers: rq
                            .headers()
                            .iter()
                            .map(|h| (h.field.to_string().to_lowercase(), h.value.to_string()))
                            .collect(),
                        body: serde_json::from_str(&body).unwrap_or(Value::Null),
                    });
                }
                let _ = rq.respond(tiny_http::Response::from_string("ok").with_status_code(answer));
            }
        });
        Capture {
            addr,
            seen,
            status,
            server,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn on(&self, path_prefix: &str) -> Vec<Captured> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|c| c.path.starts_with(path_prefix))
            .cloned()
            .collect()
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        self.server.unblock();
    }
}

/// The stripe source forwarding to the capture's `/app` (refused: each
/// event a dead letter at its first attempt), a Slack target and a signed
/// webhook target, `coalesce` as given.
fn config(cap: &Capture, coalesce: &str, extra_targets: &str) -> ServerConfig {
    let action = format!(
        "[[sources.stripe.actions]]\nname = \"app\"\nforward = {}\ntimeout = \"2s\"\nmax_attempts = 3\nretry_initial = \"100ms\"\nretry_max = \"200ms\"\n",
        toml_str(&cap.url("/app"))
    );
    ServerConfig::new()
        .set("admin_token", &toml_str(TOKEN))
        .set("coalesce", &toml_str(coalesce))
        .set("ui_url", &toml_str("https://idemhook.example.com"))
        .tables(&stripe_source("stripe", &action))
        .tables(&format!(
            "[[notify]]\nname = \"ops-slack\"\nslack = \"env:SLACK_URL\"\non = [\"dead_letter\", \"mismatch\", \"signature_failures\"]\n\n\
             [[notify]]\nname = \"pager\"\nwebhook = \"env:HOOK_URL\"\nsign_secret = {}\n{extra_targets}",
            toml_str(SIGN_SECRET)
        ))
}

fn env(cap: &Capture) -> Vec<(String, String)> {
    vec![
        ("STRIPE_SECRET".to_string(), STRIPE_SECRET.to_string()),
        (
            "SLACK_URL".to_string(),
            cap.url(&format!("/slack/services/{SLACK_SECRET}")),
        ),
        (
            "HOOK_URL".to_string(),
            cap.url(&format!("/hook/{HOOK_SECRET}")),
        ),
    ]
}

fn start(backend: Backend, config: &ServerConfig, env: &[(String, String)]) -> Server {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    Server::start_on(backend, config, &env)
}

fn event(id: &str) -> Vec<u8> {
    format!(r#"{{"id":"{id}","type":"invoice.paid","data":{{"n":1}}}}"#).into_bytes()
}

/// The webhook messages of `kind` (`idemhook.dead_letter`, ...).
fn hooks_of(cap: &Capture, kind: &str) -> Vec<Value> {
    cap.on("/hook/")
        .into_iter()
        .filter(|c| c.body["type"] == kind)
        .map(|c| c.body)
        .collect()
}

/// No secret of a target's URL anywhere in `text`.
fn assert_no_secret(text: &str, what: &str) {
    for secret in [SLACK_SECRET, HOOK_SECRET, SIGN_SECRET, "s3cret-pw"] {
        assert!(
            !text.contains(secret),
            "{what} holds the secret {secret}:\n{text}"
        );
    }
}

fn dead_letters_reach_slack_and_a_signed_webhook_coalesced(backend: Backend) {
    let cap = Capture::start();
    let server = start(backend, &config(&cap, "8s", ""), &env(&cap));

    // The first dead letter goes at once, to both targets.
    STRIPE.deliver_ok(&server, &event("evt_1"));
    wait_until(WAIT, "the first dead letter at the webhook", || {
        !hooks_of(&cap, "idemhook.dead_letter").is_empty()
    });
    let first = &hooks_of(&cap, "idemhook.dead_letter")[0];
    assert_eq!(first["source"], "stripe");
    assert_eq!(first["action"], "app");
    assert_eq!(first["event_id"], "evt_1");
    assert_eq!(first["count"], 1);
    assert!(
        first["at"].as_i64().is_some_and(|t| t > 1_700_000_000),
        "{first}"
    );
    assert_eq!(first["details"]["http_status"], 400, "{first}");
    assert_eq!(first["details"]["error_kind"], "status", "{first}");
    assert!(
        first["details"]["error"]
            .as_str()
            .is_some_and(|e| e.contains("400")),
        "{first}"
    );
    assert!(
        first["summary"]
            .as_str()
            .is_some_and(|s| s.contains("stripe/app") && s.contains("evt_1")),
        "{first}"
    );
    let signed = cap.on("/hook/")[0].clone();
    for h in ["webhook-id", "webhook-timestamp", "webhook-signature"] {
        assert!(
            signed.headers.iter().any(|(k, _)| k == h),
            "the webhook lacks {h}: {:?}",
            signed.headers
        );
    }
    wait_until(WAIT, "the first dead letter at Slack", || {
        !cap.on("/slack/").is_empty()
    });
    let slack = cap.on("/slack/")[0].body.clone();
    let text = slack["text"].as_str().unwrap_or("").to_string();
    assert!(
        text.contains("dead letter") && text.contains("evt_1") && text.contains("400"),
        "{slack}"
    );
    assert!(text.contains("https://idemhook.example.com/ui/"), "{text}");

    // Two more within the window: one message at its end, with the count.
    STRIPE.deliver_ok(&server, &event("evt_2"));
    STRIPE.deliver_ok(&server, &event("evt_3"));
    wait_until(WAIT, "the window's message at the webhook", || {
        hooks_of(&cap, "idemhook.dead_letter").len() >= 2
    });
    let window = hooks_of(&cap, "idemhook.dead_letter")[1].clone();
    assert_eq!(window["count"], 2, "{window}");
    assert!(
        window["summary"]
            .as_str()
            .is_some_and(|s| s.starts_with("2 more dead letters on stripe/app")),
        "{window}"
    );
    // Nothing more was sent for them.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(hooks_of(&cap, "idemhook.dead_letter").len(), 2);
    assert_eq!(cap.on("/slack/").len(), 2);

    // The rows: sent, one attempt each, newest first in the list.
    assert_eq!(
        server.count(
            "SELECT count(*) FROM notifications WHERE status = 'sent' AND attempts = 1",
            &[]
        ),
        4
    );
    let listed = server.run_cli(&["notify", "list", "--json"]);
    listed.assert_success();
    let list = listed.json();
    let rows = list.as_array().expect("an array");
    assert_eq!(rows.len(), 4, "{list}");
    let keys: Vec<&str> = rows[0]
        .as_object()
        .expect("an object")
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        keys,
        [
            "id",
            "notify",
            "condition",
            "source",
            "action",
            "event_id",
            "count",
            "status",
            "attempts",
            "created_at",
            "sent_at"
        ]
    );
    assert!(rows[0]["id"].as_i64() > rows[3]["id"].as_i64(), "{list}");
    assert_eq!(rows[0]["count"], 2);
    assert_eq!(rows[0]["status"], "sent");
    assert_eq!(rows[0]["condition"], "dead_letter");
    let (status, api_list) = api(&server, "GET", "/api/notifications", Some(TOKEN), "");
    assert_eq!(status, 200, "{api_list}");
    assert_eq!(api_list, list);

    let metrics = crate::harness::Client::new(crate::harness::HTTP_TIMEOUT)
        .get_with(
            &server.url("/metrics"),
            &[("Authorization".to_string(), format!("Bearer {TOKEN}"))],
        )
        .text();
    assert!(
        metrics.contains(
            "idemhook_notifications_total{notify=\"pager\",condition=\"dead_letter\",outcome=\"sent\"} 2"
        ),
        "{metrics}"
    );
    assert!(
        metrics.contains(
            "idemhook_notifications_total{notify=\"pager\",condition=\"dead_letter\",outcome=\"coalesced\"} 2"
        ),
        "{metrics}"
    );

    // No secret in any message, log line, check's output or the API.
    let check = server.run_cli(&["check"]);
    check.assert_success();
    assert!(
        check.stdout.contains("ops-slack: slack http://127.0.0.1"),
        "{}",
        check.stdout
    );
    assert_no_secret(&check.stdout, "check's output");
    let sent: Vec<(Vec<(String, String)>, Value)> = cap
        .on("/")
        .into_iter()
        .map(|c| (c.headers, c.body))
        .collect();
    assert_no_secret(&format!("{sent:?}"), "the messages");
    assert_no_secret(&server.logs(), "the log");
    assert_no_secret(&api_list.to_string(), "the API");
}

fn mismatch_and_signature_failures_are_told(backend: Backend) {
    let cap = Capture::start();
    let server = start(backend, &config(&cap, "1m", ""), &env(&cap));

    STRIPE.deliver_ok(&server, &event("evt_m"));
    let other = br#"{"id":"evt_m","type":"invoice.paid","data":{"n":2}}"#;
    STRIPE.deliver_ok(&server, other);
    wait_until(WAIT, "the mismatch at the webhook", || {
        !hooks_of(&cap, "idemhook.mismatch").is_empty()
    });
    let m = &hooks_of(&cap, "idemhook.mismatch")[0];
    assert_eq!(m["source"], "stripe");
    assert_eq!(m["event_id"], "evt_m");
    assert_eq!(m["action"], Value::Null);
    assert_eq!(
        server.count(
            "SELECT count(*) FROM incidents WHERE event_id = 'evt_m'",
            &[]
        ),
        1
    );

    // Nine bad signatures are no alarm; the tenth is.
    let bad = StripeHook::new("stripe", "whsec_wrong_secret_0000000000");
    for i in 0..9 {
        assert_eq!(
            bad.deliver(&server, &event(&format!("evt_bad{i}"))).status,
            401
        );
    }
    std::thread::sleep(Duration::from_secs(1));
    assert!(hooks_of(&cap, "idemhook.signature_failures").is_empty());
    assert_eq!(bad.deliver(&server, &event("evt_bad9")).status, 401);
    wait_until(WAIT, "signature failures at the webhook", || {
        !hooks_of(&cap, "idemhook.signature_failures").is_empty()
    });
    let s = &hooks_of(&cap, "idemhook.signature_failures")[0];
    assert_eq!(s["source"], "stripe");
    assert_eq!(s["event_id"], Value::Null);
    assert!(
        s["summary"].as_str().is_some_and(|t| t.contains("10")),
        "{s}"
    );
    wait_until(WAIT, "signature failures at Slack", || {
        cap.on("/slack/").iter().any(|c| {
            c.body["text"]
                .as_str()
                .is_some_and(|t| t.contains("signature"))
        })
    });
}

fn a_target_down_at_first_gets_it_after_a_restart(backend: Backend) {
    let cap = Capture::start();
    cap.status.store(503, Ordering::SeqCst);
    let mut server = start(backend, &config(&cap, "1m", ""), &env(&cap));
    STRIPE.deliver_ok(&server, &event("evt_down"));
    wait_until(WAIT, "a refused attempt recorded", || {
        server.count(
            "SELECT count(*) FROM notifications WHERE notify = 'pager' AND status = 'pending' AND attempts >= 1 AND last_error LIKE '%503%'",
            &[],
        ) == 1
    });
    server.restart();
    cap.status.store(200, Ordering::SeqCst);
    // A send cut short by the restart is due again after its 60 s lease.
    wait_until(WAIT * 3, "the dead letter once the target is up", || {
        server.count(
            "SELECT count(*) FROM notifications WHERE notify = 'pager' AND status = 'sent'",
            &[],
        ) == 1
    });
    let accepted: Vec<Captured> = cap
        .on("/hook/")
        .into_iter()
        .filter(|c| c.body["event_id"] == "evt_down")
        .collect();
    // Every request but the accepted one was answered 503.
    assert!(accepted.len() >= 2, "{accepted:?}");
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        cap.on("/hook/")
            .iter()
            .filter(|c| c.body["event_id"] == "evt_down")
            .count(),
        accepted.len(),
        "nothing is sent after it was accepted"
    );
    assert_no_secret(&server.logs(), "the log");
}

fn a_failed_sql_action_is_a_dead_letter(backend: Backend) {
    let cap = Capture::start();
    let action = "[[sources.stripe.actions]]\nname = \"ledger\"\nsql = \"INSERT INTO ledger (n) VALUES (0)\"\n";
    let config = ServerConfig::new()
        .set(
            "setup_sql",
            &toml_str("CREATE TABLE IF NOT EXISTS ledger (n INTEGER CHECK (n > 0));"),
        )
        .tables(&stripe_source("stripe", action))
        .tables(
            "[[notify]]\nname = \"pager\"\nwebhook = \"env:HOOK_URL\"\non = [\"dead_letter\"]\n",
        );
    let server = start(backend, &config, &env(&cap));
    STRIPE.deliver_ok(&server, &event("evt_sql"));
    wait_until(WAIT, "the SQL action's dead letter", || {
        !hooks_of(&cap, "idemhook.dead_letter").is_empty()
    });
    let m = &hooks_of(&cap, "idemhook.dead_letter")[0];
    assert_eq!(m["action"], "ledger", "{m}");
    assert_eq!(m["event_id"], "evt_sql", "{m}");
    assert_eq!(m["details"]["error_kind"], "sql", "{m}");
    assert!(
        m["details"]["error"]
            .as_str()
            .is_some_and(|e| e.to_lowercase().contains("check")),
        "{m}"
    );
    // One failed job, one notification.
    assert_eq!(server.count("SELECT count(*) FROM notifications", &[]), 1);
}

both_backends!(
    a_failed_sql_action_is_a_dead_letter,
    dead_letters_reach_slack_and_a_signed_webhook_coalesced,
    mismatch_and_signature_failures_are_told,
    a_target_down_at_first_gets_it_after_a_restart,
);

#[test]
fn notify_test_exits_0_only_when_accepted_and_records_nothing() {
    let cap = Capture::start();
    let server = start(Backend::Sqlite, &config(&cap, "5m", ""), &env(&cap));
    let ok = server.run_cli(&["notify", "test", "pager"]);
    ok.assert_success();
    wait_until(WAIT, "the test message", || {
        cap.on("/hook/")
            .iter()
            .any(|c| c.body["type"] == "idemhook.test")
    });
    cap.status.store(500, Ordering::SeqCst);
    let refused = server.run_cli(&["notify", "test", "ops-slack"]);
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");
    assert!(refused.stdout.contains("500"), "{refused:?}");
    assert_no_secret(&refused.stdout, "notify test's output");
    assert_no_secret(&refused.stderr, "notify test's errors");
    let unknown = server.run_cli(&["notify", "test", "nobody"]);
    assert_eq!(unknown.status.code(), Some(1), "{unknown:?}");
    assert!(
        unknown.stderr.contains("no [[notify]] named nobody"),
        "{unknown:?}"
    );
    assert_eq!(server.count("SELECT count(*) FROM notifications", &[]), 0);
    let empty = server.run_cli(&["notify", "list", "--json"]);
    assert_eq!(empty.json(), serde_json::json!([]));
}

// ---------------------------------------------------------------------------
// Email through a real SMTP server (aiosmtpd)
// ---------------------------------------------------------------------------

/// aiosmtpd on 127.0.0.1, writing each message it accepts into a folder.
struct Smtp {
    child: Child,
    port: u16,
    dir: PathBuf,
    _tmp: tempfile::TempDir,
}

impl Drop for Smtp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the capture, or None (said loudly) when aiosmtpd is not
/// installed; under CI=true that is a failure.
fn smtp(credentials: Option<&str>) -> Option<Smtp> {
    let has = Command::new("python3")
        .args(["-c", "import aiosmtpd"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !has {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "aiosmtpd is not installed (pip install aiosmtpd), and CI=true"
        );
        eprintln!("SKIPPED: the email notification tests need aiosmtpd (pip install aiosmtpd)");
        return None;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("mail");
    std::fs::create_dir(&dir).expect("mail dir");
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/smtp_capture.py");
    let mut child = Command::new("python3")
        .arg(script)
        .arg(port.to_string())
        .arg(&dir)
        .args(credentials)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the SMTP capture");
    let ready = dir.join(".ready");
    let started = std::time::Instant::now();
    while !ready.exists() {
        if started.elapsed() > WAIT {
            let _ = child.kill();
            panic!("the SMTP capture did not start");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Some(Smtp {
        child,
        port,
        dir,
        _tmp: tmp,
    })
}

impl Smtp {
    fn messages(&self) -> Vec<String> {
        let mut out: Vec<String> = std::fs::read_dir(&self.dir)
            .map(|d| {
                d.filter_map(Result::ok)
                    .filter(|e| e.path().extension().is_some_and(|x| x == "eml"))
                    .filter_map(|e| std::fs::read_to_string(e.path()).ok())
                    .collect()
            })
            .unwrap_or_default();
        out.sort();
        out
    }
}

fn a_dead_letter_is_mailed(backend: Backend) {
    let Some(smtp) = smtp(None) else { return };
    let cap = Capture::start();
    let mail = "[[notify]]\nname = \"ops-mail\"\nemail = { smtp = \"env:SMTP_URL\", from = \"idemhook@example.com\", to = [\"ops@example.com\"] }\non = [\"dead_letter\"]\n";
    let mut env = env(&cap);
    env.push((
        "SMTP_URL".to_string(),
        format!("smtp://127.0.0.1:{}", smtp.port),
    ));
    let server = start(backend, &config(&cap, "5m", mail), &env);
    let test = server.run_cli(&["notify", "test", "ops-mail"]);
    test.assert_success();
    STRIPE.deliver_ok(&server, &event("evt_mail"));
    wait_until(WAIT, "the dead letter's mail", || {
        smtp.messages().iter().any(|m| m.contains("evt_mail"))
    });
    let msgs = smtp.messages();
    let dead = msgs
        .iter()
        .find(|m| m.contains("evt_mail"))
        .expect("the dead letter's mail");
    assert!(
        dead.contains("Subject: [idemhook] dead letter on stripe/app"),
        "{dead}"
    );
    assert!(dead.contains("To: ops@example.com"), "{dead}");
    assert!(dead.contains("http_status: 400"), "{dead}");
    assert!(
        msgs.iter()
            .any(|m| m.contains("Subject: [idemhook] test message")),
        "{msgs:?}"
    );
    wait_until(WAIT, "the mail recorded as sent", || {
        server.count(
            "SELECT count(*) FROM notifications WHERE notify = 'ops-mail' AND status = 'sent'",
            &[],
        ) == 1
    });
}

both_backends!(a_dead_letter_is_mailed);

#[test]
fn smtp_credentials_never_print() {
    let cap = Capture::start();
    let mail = "[[notify]]\nname = \"ops-mail\"\nemail = { smtp = \"smtp://idemhook:s3cret-pw@127.0.0.1:9\", from = \"idemhook@example.com\", to = [\"ops@example.com\"] }\n";
    let server = start(Backend::Sqlite, &config(&cap, "5m", mail), &env(&cap));
    let check = server.run_cli(&["check"]);
    check.assert_success();
    assert!(
        check
            .stdout
            .contains("ops-mail: email smtp://127.0.0.1:9/[REDACTED]"),
        "{}",
        check.stdout
    );
    let test = server.run_cli(&["notify", "test", "ops-mail"]);
    assert_eq!(test.status.code(), Some(1), "{test:?}");
    assert_no_secret(&format!("{}{}", test.stdout, test.stderr), "notify test");
    assert_no_secret(&check.stdout, "check");
}

/// A notification commits with its cause or not at all: a mismatch whose
/// claim group is killed before COMMIT (PostgreSQL's failpoint) leaves no
/// incident and no notification, and nothing is sent after the restart.
/// (`mismatch_and_signature_failures_are_told` is the control: the same
/// mismatch, committed, is told.)
#[test]
fn a_mismatch_rolled_back_is_never_told() {
    if !Backend::Postgres.available("a_mismatch_rolled_back_is_never_told") {
        return;
    }
    let cap = Capture::start();
    let mut server = start(Backend::Postgres, &config(&cap, "5m", ""), &env(&cap));
    STRIPE.deliver_ok(&server, &event("evt_rb"));
    server.set_env("IDEMHOOK_FAILPOINTS", "pg.group.before_commit=kill");
    server.restart();
    let other = br#"{"id":"evt_rb","type":"invoice.paid","data":{"n":2}}"#;
    let answer = STRIPE.try_deliver(
        &crate::harness::Client::new(crate::harness::HTTP_TIMEOUT),
        &server,
        other,
    );
    assert!(
        answer.as_ref().map_or(true, |r| r.status != 200),
        "no 2xx for a claim never committed"
    );
    let status = server.wait_exit(WAIT);
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9),
        "the failpoint killed the process before COMMIT: {status:?}"
    );
    server.remove_env("IDEMHOOK_FAILPOINTS");
    server.restart();
    // The notifier looks every 250 ms: a row would have gone by now.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(server.count("SELECT count(*) FROM incidents", &[]), 0);
    assert_eq!(
        server.count(
            "SELECT count(*) FROM notifications WHERE condition = 'mismatch'",
            &[]
        ),
        0
    );
    assert!(hooks_of(&cap, "idemhook.mismatch").is_empty());
}

/// Auth from the URL: the right user and password are accepted, a wrong
/// password refused (`notify test` exits 1), and the password is never
/// printed.
#[test]
fn smtp_auth_comes_from_the_url() {
    let Some(smtp) = smtp(Some("idemhook:s3cret-pw")) else {
        return;
    };
    let cap = Capture::start();
    let mail = "[[notify]]\nname = \"ops-mail\"\nemail = { smtp = \"env:SMTP_URL\", from = \"idemhook@example.com\", to = [\"ops@example.com\"] }\n";
    let mut env = env(&cap);
    env.push((
        "SMTP_URL".to_string(),
        format!("smtp://idemhook:s3cret-pw@127.0.0.1:{}", smtp.port),
    ));
    let server = start(Backend::Sqlite, &config(&cap, "5m", mail), &env);
    server
        .run_cli(&["notify", "test", "ops-mail"])
        .assert_success();
    wait_until(WAIT, "the test mail", || {
        smtp.messages()
            .iter()
            .any(|m| m.contains("Subject: [idemhook] test message"))
    });
    let mut wrong = ServerConfig::new()
        .set("database", &toml_str("other.db"))
        .tables(&stripe_source("stripe", ""))
        .tables(mail);
    wrong = wrong.set("coalesce", &toml_str("5m"));
    let mut bad_env = env.clone();
    bad_env.pop();
    bad_env.push((
        "SMTP_URL".to_string(),
        format!("smtp://idemhook:s3cret-pwX@127.0.0.1:{}", smtp.port),
    ));
    let other = start(Backend::Sqlite, &wrong, &bad_env);
    let refused = other.run_cli(&["notify", "test", "ops-mail"]);
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");
    assert_no_secret(
        &format!("{}{}", refused.stdout, refused.stderr),
        "notify test",
    );
    assert_no_secret(&server.logs(), "the log");
}

/// `storage_unavailable`: with the SQLite file locked by another process,
/// deliveries are refused (503); after 60 s in a row the targets are told
/// from memory (nothing can be written), and once a delivery is stored
/// again that message is recorded and a "writable again" one sent. The
/// minute passes on the wall clock, moved by libfaketime (the monotonic
/// clock, which times the HTTP deadlines, left alone).
#[test]
fn storage_refusing_deliveries_for_a_minute_is_told_and_recorded_once_back() {
    let test = "storage_refusing_deliveries_for_a_minute_is_told_and_recorded_once_back";
    let Some(lib) = crate::clock::libfaketime(test) else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let offset = dir.path().join("faketime");
    std::fs::write(&offset, "+0\n").expect("write the clock offset");
    let cap = Capture::start();
    let config = ServerConfig::new()
        .set("busy_timeout", &toml_str("200ms"))
        .tables(&stripe_source("stripe", ""))
        .tables("[[notify]]\nname = \"pager\"\nwebhook = \"env:HOOK_URL\"\non = [\"storage_unavailable\"]\n");
    let mut env = env(&cap);
    env.extend(
        crate::clock::faked_clock(&lib, &offset)
            .into_iter()
            .map(|(k, v)| (k.to_string(), v)),
    );
    let server = start(Backend::Sqlite, &config, &env);
    STRIPE.deliver_ok(&server, &event("evt_before"));
    let lock = server.db_rw();
    lock.execute_batch("BEGIN IMMEDIATE")
        .expect("take the write lock");
    assert_eq!(STRIPE.deliver(&server, &event("evt_locked")).status, 503);
    // 50 s later by the wall clock, and four of the notifier's rounds:
    // nothing yet.
    std::fs::write(&offset, "+50s\n").expect("move the clock");
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        hooks_of(&cap, "idemhook.storage_unavailable").is_empty(),
        "not before 60 s"
    );
    std::fs::write(&offset, "+61s\n").expect("move the clock");
    wait_until(WAIT, "storage_unavailable sent from memory", || {
        !hooks_of(&cap, "idemhook.storage_unavailable").is_empty()
    });
    let down = &hooks_of(&cap, "idemhook.storage_unavailable")[0];
    assert!(
        down["summary"]
            .as_str()
            .is_some_and(|s| s.contains("refused")),
        "{down}"
    );
    assert_eq!(down["source"], Value::Null);
    lock.execute_batch("ROLLBACK").expect("release the lock");
    STRIPE.deliver_ok(&server, &event("evt_after"));
    wait_until(WAIT, "the writable-again message", || {
        hooks_of(&cap, "idemhook.storage_unavailable").len() == 2
    });
    let back = &hooks_of(&cap, "idemhook.storage_unavailable")[1];
    assert!(
        back["summary"]
            .as_str()
            .is_some_and(|s| s.contains("writable again")),
        "{back}"
    );
    wait_until(WAIT, "both recorded as sent", || {
        server.count(
            "SELECT count(*) FROM notifications WHERE condition = 'storage_unavailable' AND status = 'sent'",
            &[],
        ) == 2
    });
}

/// Two instances on one database, both with the target: each notification
/// is sent by one of them, once (`coalesce = "0s"`: every dead letter a
/// message of its own, all due at once).
fn two_instances_send_each_notification_once(backend: Backend) {
    const N: usize = 20;
    let cap = Capture::start();
    let config = config(&cap, "0s", "");
    let env = env(&cap);
    let a = start(backend, &config, &env);
    let db = match a.pg_url() {
        Some(url) => url.to_string(),
        None => a.db_path().display().to_string(),
    };
    let b = start(backend, &config.set("database", &toml_str(&db)), &env);
    for i in 0..N {
        let server = if i % 2 == 0 { &a } else { &b };
        STRIPE.deliver_ok(server, &event(&format!("evt_two_{i}")));
    }
    wait_until(WAIT * 2, "every dead letter sent", || {
        a.count(
            "SELECT count(*) FROM notifications WHERE notify = 'pager' AND status = 'sent'",
            &[],
        ) == N as i64
    });
    std::thread::sleep(Duration::from_secs(1));
    let mut ids: Vec<String> = hooks_of(&cap, "idemhook.dead_letter")
        .iter()
        .map(|m| m["event_id"].as_str().unwrap_or("").to_string())
        .collect();
    ids.sort();
    let before = ids.len();
    ids.dedup();
    assert_eq!((before, ids.len()), (N, N), "each once: {ids:?}");
}

both_backends!(two_instances_send_each_notification_once);

/// A forward action's circuit opening and closing is told: the webhook
/// target gets `idemhook.circuit_open` (its failures) once the downstream
/// fails three times in a row, and `idemhook.circuit_closed` (how long it
/// was open, how many jobs waited) once a probe finds it back; the waiting
/// jobs are then delivered.
fn circuits_opening_and_closing_are_told(backend: Backend) {
    let cap = Capture::start();
    let ds = crate::downstream::Downstream::start();
    ds.set_down(true);
    let action = format!(
        "[[sources.stripe.actions]]\nname = \"app\"\nforward = {}\ntimeout = \"1s\"\nlease = \"2s\"\n\
         retry_initial = \"100ms\"\nretry_max = \"1s\"\ncircuit_failures = 3\ncircuit_probe = \"200ms\"\n",
        toml_str(&format!("{}/in", ds.url()))
    );
    let config = ServerConfig::new()
        .set("admin_token", &toml_str(TOKEN))
        .set("coalesce", &toml_str("0s"))
        .tables(&stripe_source("stripe", &action))
        .tables("[[notify]]\nname = \"pager\"\nwebhook = \"env:HOOK_URL\"\non = [\"circuit_open\", \"circuit_closed\"]\n");
    let server = start(backend, &config, &env(&cap));
    for i in 0..4 {
        STRIPE.deliver_ok(&server, &event(&format!("evt_circuit_{i}")));
    }
    wait_until(WAIT, "a circuit_open message", || {
        !hooks_of(&cap, "idemhook.circuit_open").is_empty()
    });
    let open = &hooks_of(&cap, "idemhook.circuit_open")[0];
    assert_eq!(open["source"], "stripe", "{open}");
    assert_eq!(open["action"], "app", "{open}");
    assert!(open["details"]["failures"].as_i64() >= Some(3), "{open}");
    assert!(hooks_of(&cap, "idemhook.circuit_closed").is_empty());

    ds.set_down(false);
    wait_until(WAIT, "a circuit_closed message", || {
        !hooks_of(&cap, "idemhook.circuit_closed").is_empty()
    });
    let closed = &hooks_of(&cap, "idemhook.circuit_closed")[0];
    assert_eq!(closed["action"], "app", "{closed}");
    assert!(closed["details"]["open_for_s"].is_i64(), "{closed}");
    wait_until(WAIT, "every job delivered once the circuit closed", || {
        (0..4).all(|i| ds.effects(&format!("stripe:evt_circuit_{i}:app")) == 1)
    });
    assert_eq!(
        hooks_of(&cap, "idemhook.circuit_open").len(),
        1,
        "the circuit opened once"
    );
}

both_backends!(circuits_opening_and_closing_are_told);

/// Ten refused deliveries kept for one source within five minutes (a
/// secret mistyped: each kept for `reingest`) are told as `rejected`,
/// once for the ten.
fn kept_refusals_growing_are_told(backend: Backend) {
    let cap = Capture::start();
    let config = ServerConfig::new()
        .set("admin_token", &toml_str(TOKEN))
        .set("coalesce", &toml_str("0s"))
        .tables(&stripe_source("stripe", ""))
        .tables("[[notify]]\nname = \"pager\"\nwebhook = \"env:HOOK_URL\"\non = [\"rejected\"]\n");
    let server = start(backend, &config, &env(&cap));
    for i in 0..10 {
        let body = event(&format!("evt_wrong_{i}"));
        let r = server.post(
            "/hooks/stripe",
            &crate::sign::stripe_now("whsec_not_the_secret", &body),
            &body,
        );
        assert_eq!(r.status, 401, "{}", r.text());
    }
    wait_until(WAIT, "a rejected message", || {
        !hooks_of(&cap, "idemhook.rejected").is_empty()
    });
    let told = hooks_of(&cap, "idemhook.rejected");
    assert_eq!(told.len(), 1, "{told:?}");
    assert_eq!(told[0]["source"], "stripe", "{}", told[0]);
    assert!(
        told[0]["summary"]
            .as_str()
            .is_some_and(|s| s.contains("reingest")),
        "{}",
        told[0]
    );
}

both_backends!(kept_refusals_growing_are_told);

/// A catch-up run that claims events the provider had not delivered is
/// told as `catchup` (its counts in `details`), written with the run's
/// record by the command and sent by serve's notifier; a run that finds
/// nothing new tells nothing.
fn a_catch_up_that_finds_events_is_told(backend: Backend) {
    use crate::catchup::fakes;
    let cap = Capture::start();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let missed: Vec<Value> = (0..3)
        .map(|i| fakes::stripe_event(&format!("evt_missed_{i}"), now - 60, 100))
        .collect();
    let fake = fakes::stripe("sk_test_catchup_notify", missed);
    let config = ServerConfig::new()
        .set("admin_token", &toml_str(TOKEN))
        .set("coalesce", &toml_str("0s"))
        .tables(&format!(
            "[sources.stripe]\nkind = \"stripe\"\nsecrets = [\"env:STRIPE_SECRET\"]\n\
             [sources.stripe.catchup]\napi_key = \"sk_test_catchup_notify\"\ninterval = \"0s\"\n\
             api_url = {}\n",
            toml_str(&fake.url())
        ))
        .tables("[[notify]]\nname = \"pager\"\nwebhook = \"env:HOOK_URL\"\non = [\"catchup\"]\n");
    let server = start(backend, &config, &env(&cap));
    let run = server.run_cli(&["catchup", "stripe", "--yes"]);
    assert!(run.success(), "{}\n{}", run.stdout, run.stderr);
    wait_until(WAIT, "a catchup message", || {
        !hooks_of(&cap, "idemhook.catchup").is_empty()
    });
    let told = hooks_of(&cap, "idemhook.catchup");
    assert_eq!(told[0]["source"], "stripe", "{}", told[0]);
    assert_eq!(told[0]["details"]["claimed"], 3, "{}", told[0]);

    let again = server.run_cli(&["catchup", "stripe", "--yes"]);
    assert!(again.success(), "{}\n{}", again.stdout, again.stderr);
    assert_eq!(
        server.count(
            "SELECT count(*) FROM notifications WHERE condition = 'catchup'",
            &[]
        ),
        1,
        "a run that found nothing new tells nothing"
    );
}

both_backends!(a_catch_up_that_finds_events_is_told);
