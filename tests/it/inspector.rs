//! The web inspector (`/ui/`): HTTP checks of sign-in, sessions, the
//! origin and Host rules and the security headers, which always run; and
//! checks in a real headless Chromium driven over WebDriver
//! (`chromedriver`), which run when Debian's `chromium` and
//! `chromium-driver` are installed (`.ci/run` installs them) and say
//! loudly that they were skipped otherwise. The browser tests share one
//! browser, one at a time, and save a screenshot of each view under
//! `target/inspector-screenshots/`.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{Value, json};

use crate::backend::{Backend, both_backends};
use crate::downstream::{Behavior, Downstream};
use crate::harness::{Server, ServerConfig, count, toml_str, wait_for, wait_until};
use crate::sign;

const TOKEN: &str = "inspector-test-token-0123456789abcdef0123456789abcdef";
const SECRET: &str = "gh-secret";
/// Bound on waiting for something the page should show.
const PAGE_TIMEOUT: Duration = Duration::from_secs(20);

// ---------------------------------------------------------------------------
// Fixtures

fn config_with(tables: &str) -> ServerConfig {
    ServerConfig::new()
        .set("admin_token", &toml_str(TOKEN))
        .tables(&format!(
            "[sources.gh]\nkind = \"github\"\nsecrets = [{}]\n{tables}",
            toml_str(SECRET)
        ))
}

fn forward_action(downstream: &Downstream, max_attempts: u32) -> String {
    format!(
        "[[sources.gh.actions]]\nname = \"notify\"\nforward = {}\ntimeout = \"2s\"\nlease = \"5s\"\n\
         max_attempts = {max_attempts}\nretry_initial = \"50ms\"\nretry_max = \"100ms\"\n",
        toml_str(&format!("{}/hook", downstream.url()))
    )
}

/// Posts a GitHub-signed event; panics unless it is accepted.
fn send(server: &Server, id: &str, body: &[u8], extra: &[(&str, &str)]) {
    let mut headers = sign::github(SECRET, body, id, "issues");
    headers.push(("Content-Type".to_string(), "application/json".to_string()));
    for (k, v) in extra {
        headers.push((k.to_string(), v.to_string()));
    }
    let r = server.post("/hooks/gh", &headers, body);
    assert_eq!(r.status, 200, "delivery of {id}: {}", r.text());
}

/// One HTTP/1.1 exchange with every header as given (Host included).
fn exchange(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Answer {
    let mut request = format!("{method} {path} HTTP/1.1\r\n");
    for (k, v) in headers {
        request.push_str(&format!("{k}: {v}\r\n"));
    }
    request.push_str(&format!(
        "Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    ));
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    stream.write_all(request.as_bytes()).expect("write head");
    stream.write_all(body).expect("write body");
    let mut raw = Vec::new();
    let _ = stream.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let headers = head
        .lines()
        .skip(1)
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Answer {
        status,
        status_line: head.lines().next().unwrap_or_default().to_string(),
        headers,
        body: body.to_string(),
    }
}

struct Answer {
    status: u16,
    status_line: String,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Signs in over HTTP as the page would; returns the `Cookie` header value.
fn sign_in(server: &Server) -> String {
    let host = server.addr().to_string();
    let origin = format!("http://{host}");
    let body = json!({ "token": TOKEN }).to_string();
    let r = exchange(
        server.addr(),
        "POST",
        "/ui/session",
        &[
            ("Host", &host),
            ("Origin", &origin),
            ("Content-Type", "application/json"),
        ],
        body.as_bytes(),
    );
    assert_eq!(r.status, 204, "sign-in: {}", r.body);
    let set = r.header("set-cookie").expect("a session cookie");
    assert!(
        set.contains("HttpOnly") && set.contains("SameSite=Strict"),
        "{set}"
    );
    set.split(';').next().expect("name=value").to_string()
}

// ---------------------------------------------------------------------------
// Over HTTP (always run)

#[test]
fn the_inspector_is_off_without_an_admin_token() {
    let server = Server::start(
        &ServerConfig::new().tables("[sources.gh]\nkind = \"github\"\nsecrets = [\"s\"]\n"),
        &[],
    );
    let host = server.addr().to_string();
    for path in ["/ui/", "/ui/assets/app.js", "/ui/session"] {
        let r = exchange(server.addr(), "GET", path, &[("Host", &host)], b"");
        assert_eq!(r.status, 404, "{path}: {}", r.body);
    }
}

#[test]
fn sessions_headers_and_the_origin_rule_over_http() {
    let downstream = Downstream::start();
    let server = Server::start(&config_with(&forward_action(&downstream, 3)), &[]);
    let addr = server.addr();
    let host = addr.to_string();
    let origin = format!("http://{host}");

    // The page: strict headers, an ETag, and a 304 for a reload.
    let page = exchange(addr, "GET", "/ui/", &[("Host", &host)], b"");
    assert_eq!(page.status, 200);
    let csp = page.header("content-security-policy").expect("a CSP");
    for part in [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "frame-ancestors 'none'",
    ] {
        assert!(csp.contains(part), "CSP lacks {part}: {csp}");
    }
    assert!(!csp.contains("unsafe-inline"), "{csp}");
    assert_eq!(page.header("x-content-type-options"), Some("nosniff"));
    assert_eq!(page.header("referrer-policy"), Some("no-referrer"));
    for path in [
        "/ui/",
        "/ui/events/gh/x",
        "/ui/assets/app.js",
        "/ui/assets/style.css",
    ] {
        let first = exchange(addr, "GET", path, &[("Host", &host)], b"");
        assert_eq!(first.status, 200, "{path}");
        let tag = first.header("etag").expect("an ETag").to_string();
        let again = exchange(
            addr,
            "GET",
            path,
            &[("Host", &host), ("If-None-Match", &tag)],
            b"",
        );
        assert_eq!(again.status, 304, "{path} reloaded");
        assert!(again.body.is_empty());
        assert!(again.header("content-security-policy").is_some());
    }
    // A name the server does not listen as (DNS rebinding) is refused.
    let rebound = exchange(
        addr,
        "GET",
        "/ui/",
        &[("Host", &format!("evil.example:{}", addr.port()))],
        b"",
    );
    assert_eq!(rebound.status, 403);

    // A wrong token is 401 and sets nothing.
    let wrong = exchange(
        addr,
        "POST",
        "/ui/session",
        &[("Host", &host), ("Origin", &origin)],
        br#"{"token":"nope"}"#,
    );
    assert_eq!(wrong.status, 401);
    assert!(wrong.header("set-cookie").is_none());
    let cookie = sign_in(&server);
    let state = exchange(
        addr,
        "GET",
        "/ui/session",
        &[("Host", &host), ("Cookie", &cookie)],
        b"",
    );
    assert_eq!(state.body, r#"{"signed_in":true}"#);

    // The cookie reads the admin API; answers with payloads are not stored.
    let list = exchange(
        addr,
        "GET",
        "/api/events",
        &[("Host", &host), ("Cookie", &cookie)],
        b"",
    );
    assert_eq!(list.status, 200, "{}", list.body);
    assert_eq!(list.header("cache-control"), Some("no-store"));
    let tag = list.header("etag").expect("the list's tag").to_string();
    let unchanged = exchange(
        addr,
        "GET",
        "/api/events",
        &[
            ("Host", &host),
            ("Cookie", &cookie),
            ("If-None-Match", &tag),
        ],
        b"",
    );
    assert_eq!(unchanged.status, 304, "a poll with nothing new");
    send(&server, "evt-http-1", br#"{"n":1}"#, &[]);
    let changed = exchange(
        addr,
        "GET",
        "/api/events",
        &[
            ("Host", &host),
            ("Cookie", &cookie),
            ("If-None-Match", &tag),
        ],
        b"",
    );
    assert_eq!(changed.status, 200, "a poll after a new event");
    assert!(changed.body.contains("evt-http-1"), "{}", changed.body);

    // A cookie-carried POST from another origin, or that says nothing of
    // where it came from, is 403 and changes nothing.
    let pause = "/api/actions/gh/notify/pause";
    for headers in [
        vec![("Origin", "http://127.0.0.1:1")],
        vec![("Origin", "null")],
        vec![("Sec-Fetch-Site", "cross-site")],
        vec![("Sec-Fetch-Site", "same-site"), ("Origin", origin.as_str())],
        vec![],
    ] {
        let mut all = vec![("Host", host.as_str()), ("Cookie", cookie.as_str())];
        all.extend(headers.iter().copied());
        let r = exchange(addr, "POST", pause, &all, b"");
        assert_eq!(r.status, 403, "{headers:?}: {}", r.body);
    }
    // A cookie with a Host this server does not listen as is refused too.
    let rebound_host = format!("rebound.example:{}", addr.port());
    let rebound_origin = format!("http://{rebound_host}");
    let r = exchange(
        addr,
        "POST",
        pause,
        &[
            ("Host", &rebound_host),
            ("Cookie", &cookie),
            ("Origin", &rebound_origin),
        ],
        b"",
    );
    assert_eq!(r.status, 403);
    assert_eq!(
        count(&server.db(), "SELECT count(*) FROM paused_actions", []),
        0
    );
    // From the inspector's own origin it works.
    let r = exchange(
        addr,
        "POST",
        pause,
        &[
            ("Host", &host),
            ("Cookie", &cookie),
            ("Origin", &origin),
            ("Sec-Fetch-Site", "same-origin"),
        ],
        b"",
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        count(&server.db(), "SELECT count(*) FROM paused_actions", []),
        1
    );

    // Signing out ends the session: the cookie no longer reads anything.
    let out = exchange(
        addr,
        "DELETE",
        "/ui/session",
        &[("Host", &host), ("Cookie", &cookie), ("Origin", &origin)],
        b"",
    );
    assert_eq!(out.status, 204);
    let state = exchange(
        addr,
        "GET",
        "/ui/session",
        &[("Host", &host), ("Cookie", &cookie)],
        b"",
    );
    assert_eq!(state.body, r#"{"signed_in":false}"#);
    let after = exchange(
        addr,
        "GET",
        "/api/events",
        &[("Host", &host), ("Cookie", &cookie)],
        b"",
    );
    assert_eq!(after.status, 401);
    // The bearer token works as before, from anywhere.
    let bearer = format!("Bearer {TOKEN}");
    let r = exchange(
        addr,
        "GET",
        "/api/actions",
        &[("Host", "anything"), ("Authorization", &bearer)],
        b"",
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let actions: Value = serde_json::from_str(&r.body).expect("json");
    assert_eq!(actions[0]["action"], "notify");
    assert_eq!(actions[0]["paused"], true);
}

#[test]
fn a_client_that_is_not_a_browser_signs_in_with_the_token_alone() {
    let server = Server::start(&config_with(""), &[]);
    let addr = server.addr();
    let host = addr.to_string();
    let sign_in = |token: &str, extra: &[(&str, &str)]| {
        let mut headers = vec![("Host", host.as_str())];
        headers.extend_from_slice(extra);
        let body = json!({ "token": token }).to_string();
        exchange(addr, "POST", "/ui/session", &headers, body.as_bytes())
    };
    // No Origin and no Sec-Fetch-Site (curl, a script): the token decides.
    let wrong = sign_in("nope", &[]);
    assert_eq!(wrong.status, 401, "{}", wrong.body);
    assert!(wrong.header("set-cookie").is_none());
    let ok = sign_in(TOKEN, &[("Content-Type", "application/json")]);
    assert_eq!(ok.status, 204, "{}", ok.body);
    assert_eq!(ok.status_line, "HTTP/1.1 204 No Content");
    let set = ok.header("set-cookie").expect("a session cookie");
    assert!(
        set.contains("HttpOnly") && set.contains("SameSite=Strict"),
        "{set}"
    );
    let cookie = set.split(';').next().expect("name=value");
    let list = exchange(
        addr,
        "GET",
        "/api/events",
        &[("Host", &host), ("Cookie", cookie)],
        b"",
    );
    assert_eq!(list.status, 200, "{}", list.body);
    // What the inspector reads from the admin API is under the same policy.
    assert!(
        list.header("content-security-policy").is_some_and(|csp| csp
            .contains("default-src 'none'")
            && csp.contains("frame-ancestors 'none'")),
        "{:?}",
        list.headers
    );
    assert_eq!(list.header("x-content-type-options"), Some("nosniff"));
    assert_eq!(list.header("referrer-policy"), Some("no-referrer"));
    // Signing out from another page is refused; without a browser's
    // headers it ends the session.
    let out = exchange(
        addr,
        "DELETE",
        "/ui/session",
        &[
            ("Host", &host),
            ("Cookie", cookie),
            ("Origin", "http://evil.example"),
        ],
        b"",
    );
    assert_eq!(out.status, 403, "{}", out.body);
    let out = exchange(
        addr,
        "DELETE",
        "/ui/session",
        &[("Host", &host), ("Cookie", cookie)],
        b"",
    );
    assert_eq!(out.status, 204, "{}", out.body);
    let after = exchange(
        addr,
        "GET",
        "/api/events",
        &[("Host", &host), ("Cookie", cookie)],
        b"",
    );
    assert_eq!(after.status, 401, "signed out: {}", after.body);
    // A browser that says the sign-in comes from another page is refused,
    // even with the right token.
    for extra in [
        vec![("Origin", "http://evil.example")],
        vec![("Sec-Fetch-Site", "cross-site")],
        vec![("Sec-Fetch-Site", "same-site")],
    ] {
        let r = sign_in(TOKEN, &extra);
        assert_eq!(r.status, 403, "{extra:?}: {}", r.body);
        assert!(r.header("set-cookie").is_none(), "{extra:?}");
    }
}

#[test]
fn behind_admin_listen_the_inspector_is_on_the_admin_listener_only() {
    let server = Server::start(
        &config_with("").set("admin_listen", &toml_str("127.0.0.1:0")),
        &[],
    );
    let line = server
        .stdout()
        .lines()
        .find(|l| l.starts_with("idemhook inspector on "))
        .map(str::to_string)
        .expect("the inspector's address is printed");
    let admin: SocketAddr = line
        .trim_start_matches("idemhook inspector on http://")
        .trim_end_matches("/ui/")
        .parse()
        .unwrap_or_else(|e| panic!("{line}: {e}"));
    let main = server.addr().to_string();
    let r = exchange(server.addr(), "GET", "/ui/", &[("Host", &main)], b"");
    assert_eq!(r.status, 404, "the public listener has no inspector");
    let host = admin.to_string();
    let r = exchange(admin, "GET", "/ui/", &[("Host", &host)], b"");
    assert_eq!(r.status, 200);
    assert!(r.body.contains("/ui/assets/app.js"));
    // The admin listener's Host, not the main one's, is what it answers as.
    let r = exchange(admin, "GET", "/ui/", &[("Host", &main)], b"");
    assert_eq!(r.status, 403);
}

#[test]
fn sessions_end_on_restart() {
    let mut server = Server::start(&config_with(""), &[]);
    let cookie = sign_in(&server);
    server.restart();
    let host = server.addr().to_string();
    let r = exchange(
        server.addr(),
        "GET",
        "/api/events",
        &[("Host", &host), ("Cookie", &cookie)],
        b"",
    );
    assert_eq!(r.status, 401);
}

/// A mismatched duplicate's kept body goes with `payload_retention`, and
/// `prune --dry-run` counts it as the prune then drops it.
#[test]
fn a_mismatched_body_is_pruned_with_the_payload_and_the_dry_run_counts_it() {
    let server = Server::start(&config_with("payload_retention = \"1s\"\n"), &[]);
    send(&server, "evt-pr", br#"{"amount":1}"#, &[]);
    send(&server, "evt-pr", br#"{"amount":2}"#, &[]);
    let planned = wait_for(Duration::from_secs(20), "both bodies past 1s", || {
        let out = server.run_cli(&["prune", "--dry-run"]);
        out.assert_success();
        if out.stdout.contains("would drop 2 bodies") {
            Ok(out.stdout)
        } else {
            Err(out.stdout)
        }
    });
    assert!(planned.contains("dry run: nothing changed"), "{planned}");
    assert_eq!(
        count(&server.db(), "SELECT count(*) FROM incident_payloads", []),
        1
    );
    let pruned = server.run_cli(&["prune"]);
    pruned.assert_success();
    assert!(
        pruned.stdout.contains("dropped 2 bodies"),
        "{}",
        pruned.stdout
    );
    let shown = server
        .run_cli(&["events", "show", "gh", "evt-pr", "--json"])
        .assert_success()
        .json();
    assert_eq!(shown["payload"], Value::Null);
    assert_eq!(shown["incidents"][0]["payload"], Value::Null);
    assert_eq!(shown["incidents"][0]["kind"], "payload_mismatch");
}

#[test]
fn a_mismatched_duplicate_keeps_its_body_until_erased() {
    let server = Server::start(&config_with(""), &[]);
    send(
        &server,
        "evt-mm",
        br#"{"amount":100,"currency":"eur"}"#,
        &[],
    );
    send(
        &server,
        "evt-mm",
        br#"{"amount":999,"currency":"eur","extra":true}"#,
        &[],
    );
    let shown = server
        .run_cli(&["events", "show", "gh", "evt-mm", "--json"])
        .assert_success()
        .json();
    let incident = &shown["incidents"][0];
    assert_eq!(incident["kind"], "payload_mismatch");
    assert_eq!(
        incident["payload"],
        json!({"amount": 999, "currency": "eur", "extra": true})
    );
    assert_eq!(
        shown["payload"]["amount"], 100,
        "the stored event is unchanged"
    );
    // The API answers the CLI's JSON, and with details=true what the
    // inspector shows besides.
    let host = server.addr().to_string();
    let bearer = format!("Bearer {TOKEN}");
    let get = |path: &str| {
        let r = exchange(
            server.addr(),
            "GET",
            path,
            &[("Host", &host), ("Authorization", &bearer)],
            b"",
        );
        assert_eq!(r.status, 200, "{path}: {}", r.body);
        serde_json::from_str::<Value>(&r.body).expect("json")
    };
    assert_eq!(get("/api/events/gh/evt-mm"), shown);
    // One event polled again unchanged is a 304.
    let first = exchange(
        server.addr(),
        "GET",
        "/api/events/gh/evt-mm?details=true",
        &[("Host", &host), ("Authorization", &bearer)],
        b"",
    );
    let tag = first.header("etag").expect("an event's tag").to_string();
    let again = exchange(
        server.addr(),
        "GET",
        "/api/events/gh/evt-mm?details=true",
        &[
            ("Host", &host),
            ("Authorization", &bearer),
            ("If-None-Match", &tag),
        ],
        b"",
    );
    assert_eq!(again.status, 304);
    let detailed = get("/api/events/gh/evt-mm?details=true");
    assert_eq!(detailed["headers"]["x-github-event"], "issues");
    assert_eq!(detailed["replays"], json!([]));
    assert!(
        detailed["deliveries"][1]["received_at_ms"].is_i64(),
        "{detailed}"
    );
    assert_eq!(get("/api/events")[0].get("incidents"), None);
    assert_eq!(get("/api/events?details=true")[0]["incidents"], 1);
    assert_eq!(get("/api/events?id=evt-m")[0]["event_id"], "evt-mm");
    assert_eq!(get("/api/events?id=evt-x"), json!([]));
    server
        .run_cli(&["erase", "gh", "evt-mm", "--yes"])
        .assert_success();
    let erased = server
        .run_cli(&["events", "show", "gh", "evt-mm", "--json"])
        .assert_success()
        .json();
    assert_eq!(
        erased["incidents"][0]["payload"],
        Value::Null,
        "erase drops it"
    );
    assert_eq!(
        count(&server.db(), "SELECT count(*) FROM incident_payloads", []),
        0
    );
}

#[test]
fn zero_config_prints_a_one_click_inspector_link() {
    let server = Server::start_zero_config(&[]);
    let mut line = String::new();
    wait_until(
        PAGE_TIMEOUT,
        "the inspector line in serve's stdout",
        || match server
            .stdout()
            .lines()
            .find(|l| l.starts_with("idemhook inspector on "))
        {
            Some(l) => {
                line = l.to_string();
                true
            }
            None => false,
        },
    );
    let url = line["idemhook inspector on ".len()..]
        .split_whitespace()
        .next()
        .unwrap_or("");
    let expected = format!("{}/ui/#token=", server.base_url());
    assert!(url.starts_with(&expected), "{line}");
    let token = &url[expected.len()..];
    assert!(token.len() >= 32, "{token}");
    let r = exchange(
        server.addr(),
        "GET",
        "/api/events",
        &[
            ("Host", &server.addr().to_string()),
            ("Authorization", &format!("Bearer {token}")),
        ],
        b"",
    );
    assert_eq!(r.status, 200, "the printed token is this run's admin token");
    // Printed after the listening line, so it may come a moment later.
    wait_until(
        Duration::from_secs(10),
        "the `idemhook send demo` hint on stdout",
        || server.stdout().contains("idemhook send demo"),
    );
    if let Some(browser) = browser() {
        browser.go(url);
        browser.wait_for("the events list after a one-click sign-in", "#events");
        assert_eq!(
            browser.eval("return location.hash"),
            json!(""),
            "the token left the URL"
        );
    }
}

// ---------------------------------------------------------------------------
// In a real browser

/// `chromedriver` and a Chromium session, shared by the tests of this
/// file one at a time. A watchdog ends both when the test process ends.
struct Browser {
    base: String,
    session: String,
    agent: ureq::Agent,
    _driver: Child,
}

static BROWSER: OnceLock<Option<Mutex<Browser>>> = OnceLock::new();

/// The shared browser, or None (after a loud SKIPPED line) without one.
fn browser() -> Option<MutexGuard<'static, Browser>> {
    let shared = BROWSER.get_or_init(|| {
        let chromium = find_program("chromium", &["/usr/lib/chromium/chromium"]);
        let driver = find_program("chromedriver", &["/usr/lib/chromium/chromedriver"]);
        let (Some(chromium), Some(driver)) = (chromium, driver) else {
            eprintln!(
                "\n*** SKIPPED: inspector browser tests: no chromium or chromedriver on this machine (install Debian's chromium and chromium-driver; .ci/run does) ***\n"
            );
            return None;
        };
        // Installed but not working is a failure, not a skip.
        match Browser::launch(&chromium, &driver) {
            Ok(b) => Some(Mutex::new(b)),
            Err(why) => panic!("cannot drive chromium: {why}"),
        }
    });
    let browser = shared
        .as_ref()
        .map(|m| m.lock().unwrap_or_else(|poisoned| poisoned.into_inner()))?;
    // What the console holds belongs to the test before.
    let _ = browser.console();
    Some(browser)
}

fn find_program(name: &str, fallbacks: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .chain(fallbacks.iter().map(PathBuf::from))
        .find(|p| p.is_file())
}

impl Browser {
    fn launch(chromium: &std::path::Path, driver: &std::path::Path) -> Result<Browser, String> {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("no free port: {e}"))?
            .port();
        // setsid: chromedriver leads a process group that also holds the
        // browser, so the watchdog can end them together.
        let child = Command::new("setsid")
            .arg(driver)
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", driver.display()))?;
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(60)))
            .build()
            .into();
        let mut browser = Browser {
            base: format!("http://127.0.0.1:{port}"),
            session: String::new(),
            agent,
            _driver: child,
        };
        if let Err(e) = browser.start_session(chromium) {
            let _ = browser._driver.kill();
            let _ = browser._driver.wait();
            return Err(e);
        }
        // When this test process ends, end the session (Chromium quits)
        // and then chromedriver's whole process group.
        let watchdog = format!(
            "while kill -0 {me} 2>/dev/null; do sleep 1; done; \
             if exec 3<>/dev/tcp/127.0.0.1/{port}; then \
               printf 'DELETE /session/{session} HTTP/1.1\\r\\nHost: 127.0.0.1\\r\\nContent-Length: 0\\r\\nConnection: close\\r\\n\\r\\n' >&3; \
               timeout 10 cat <&3 >/dev/null; fi; \
             kill -TERM -- -{pg} 2>/dev/null; sleep 2; kill -KILL -- -{pg} 2>/dev/null",
            me = std::process::id(),
            session = browser.session,
            pg = browser._driver.id()
        );
        Command::new("bash")
            .args(["-c", &watchdog])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start the watchdog: {e}"))?;
        Ok(browser)
    }

    fn start_session(&mut self, chromium: &std::path::Path) -> Result<(), String> {
        let started = Instant::now();
        loop {
            let ready = self
                .agent
                .get(&format!("{}/status", self.base))
                .call()
                .ok()
                .and_then(|mut r| r.body_mut().read_to_string().ok())
                .and_then(|text| serde_json::from_str::<Value>(&text).ok())
                .is_some_and(|v| v["value"]["ready"] == true);
            if ready {
                break;
            }
            if started.elapsed() > Duration::from_secs(20) {
                return Err("chromedriver did not become ready".into());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:loggingPrefs": {"browser": "ALL"},
            "goog:chromeOptions": {
                "binary": chromium,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                         "--window-size=1280,900", "--no-first-run", "--disable-extensions",
                         "--disable-background-networking", "--disable-sync",
                         "--disable-crash-reporter", "--disable-breakpad"],
            },
        }}});
        let created = self.call("POST", "/session", Some(caps))?;
        self.session = created["value"]["sessionId"]
            .as_str()
            .ok_or_else(|| format!("no session: {created}"))?
            .to_string();
        Ok(())
    }

    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value, String> {
        let url = format!("{}{path}", self.base);
        let response = match method {
            "GET" => self.agent.get(&url).call(),
            "DELETE" => self.agent.delete(&url).call(),
            _ => self
                .agent
                .post(&url)
                .header("Content-Type", "application/json")
                .send(body.unwrap_or_else(|| json!({})).to_string()),
        };
        let mut response = response.map_err(|e| format!("{method} {path}: {e}"))?;
        let text = response
            .body_mut()
            .with_config()
            .limit(64 * 1024 * 1024)
            .read_to_string()
            .map_err(|e| format!("{method} {path}: {e}"))?;
        let value: Value =
            serde_json::from_str(&text).map_err(|e| format!("{method} {path}: {e}"))?;
        if response.status().as_u16() != 200 {
            return Err(format!("{method} {path}: {}", value["value"]));
        }
        Ok(value)
    }

    fn command(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let path = format!("/session/{}{path}", self.session);
        match self.call(method, &path, body) {
            Ok(v) => v["value"].clone(),
            Err(e) => panic!("webdriver: {e}"),
        }
    }

    fn go(&self, url: &str) {
        self.command("POST", "/url", Some(json!({ "url": url })));
    }

    fn eval(&self, script: &str) -> Value {
        self.command(
            "POST",
            "/execute/sync",
            Some(json!({ "script": script, "args": [] })),
        )
    }

    /// Runs an async script; it calls `done(value)` (the last argument).
    fn eval_async(&self, script: &str) -> Value {
        let script = format!("const done = arguments[arguments.length - 1]; {script}");
        self.command(
            "POST",
            "/execute/async",
            Some(json!({ "script": script, "args": [] })),
        )
    }

    /// Waits until `selector` matches an element; panics with `what`.
    fn wait_for(&self, what: &str, selector: &str) {
        let script = format!(
            "return document.querySelector({}) !== null",
            json!(selector)
        );
        self.wait_js(what, &script);
    }

    fn wait_js(&self, what: &str, script: &str) {
        let started = Instant::now();
        loop {
            if self.eval(script) == json!(true) {
                return;
            }
            if started.elapsed() > PAGE_TIMEOUT {
                let text = self.eval("return document.body ? document.body.innerText : ''");
                panic!(
                    "the page did not show {what} within {PAGE_TIMEOUT:?}\npage text:\n{}",
                    text.as_str().unwrap_or("")
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn text(&self, selector: &str) -> String {
        let script = format!(
            "const e = document.querySelector({}); return e ? e.textContent : null",
            json!(selector)
        );
        self.eval(&script).as_str().unwrap_or_default().to_string()
    }

    fn click(&self, selector: &str) {
        let script = format!(
            "const e = document.querySelector({}); if (!e) return false; e.click(); return true",
            json!(selector)
        );
        assert_eq!(
            self.eval(&script),
            json!(true),
            "nothing to click at {selector}"
        );
    }

    fn type_into(&self, selector: &str, text: &str) {
        let found = self.command(
            "POST",
            "/element",
            Some(json!({"using": "css selector", "value": selector})),
        );
        let id = found
            .as_object()
            .and_then(|o| o.values().next())
            .and_then(Value::as_str)
            .unwrap_or_else(|| panic!("no element {selector}"))
            .to_string();
        self.command("POST", &format!("/element/{id}/clear"), Some(json!({})));
        self.command(
            "POST",
            &format!("/element/{id}/value"),
            Some(json!({ "text": text })),
        );
    }

    fn resize(&self, width: u32, height: u32) {
        self.command(
            "POST",
            "/window/rect",
            Some(json!({"width": width, "height": height})),
        );
    }

    /// Saves a PNG of the window as target/inspector-screenshots/NAME.png.
    fn screenshot(&self, name: &str) -> PathBuf {
        let data = self.command("GET", "/screenshot", None);
        let png = base64::engine::general_purpose::STANDARD
            .decode(data.as_str().unwrap_or_default())
            .expect("a base64 PNG");
        let dir = screenshot_dir();
        std::fs::create_dir_all(&dir).expect("screenshot dir");
        let path = dir.join(format!("{name}.png"));
        std::fs::write(&path, png).expect("write screenshot");
        path
    }

    /// The browser's console holds no Content-Security-Policy violation
    /// (and no other error) since the last look.
    fn assert_no_policy_violations(&self) {
        let logs = self.console();
        let bad: Vec<&Value> = logs
            .iter()
            .filter(|e| {
                let m = e["message"].as_str().unwrap_or_default();
                e["level"] == "SEVERE" && !m.contains("favicon")
            })
            .collect();
        assert!(bad.is_empty(), "console errors: {bad:#?}");
    }

    /// The console's entries since the last call.
    fn console(&self) -> Vec<Value> {
        let logs = self.call(
            "POST",
            &format!("/session/{}/se/log", self.session),
            Some(json!({"type": "browser"})),
        );
        match logs {
            Ok(v) => v["value"].as_array().cloned().unwrap_or_default(),
            Err(e) => panic!("the browser's console: {e}"),
        }
    }

    /// Every resource the page loaded came from its own origin.
    fn assert_only_own_origin(&self) {
        let foreign = self.eval(
            "return performance.getEntriesByType('resource').map(e => e.name).filter(n => !n.startsWith(location.origin + '/'))",
        );
        assert_eq!(
            foreign,
            json!([]),
            "the page loaded something from another origin"
        );
    }
}

fn screenshot_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .map(|p| p.join("inspector-screenshots"))
        .unwrap_or_else(|| PathBuf::from("target/inspector-screenshots"))
}

/// Signs in through the page's own form.
fn sign_in_in_browser(browser: &Browser, server: &Server, token: &str) {
    browser.go(&format!("{}/ui/", server.base_url()));
    browser.wait_for("the sign-in form", "#signin");
    browser.type_into("#token", token);
    browser.click("#signin button[type=submit]");
}

/// On both backends: the page reads only the admin API.
fn browser_sign_in_and_a_list_that_updates_itself(backend: Backend) {
    let server = Server::start_on(backend, &config_with(""), &[]);
    send(&server, "evt-list-1", br#"{"n":1}"#, &[]);
    send(&server, "evt-list-2", br#"{"n":2}"#, &[]);
    let Some(browser) = browser() else { return };
    browser.resize(1280, 900);

    sign_in_in_browser(&browser, &server, "not-the-token");
    browser.wait_js("the wrong-token message", "return document.querySelector('#signin-error').textContent.includes('not the admin token')");
    assert!(browser.eval("return document.querySelector('#events') === null") == json!(true));
    browser.screenshot("signin-wrong-token");

    browser.type_into("#token", TOKEN);
    browser.click("#signin button[type=submit]");
    browser.wait_for(
        "the second event in the list",
        "#events a[href='/ui/events/gh/evt-list-2']",
    );
    let rows = browser
        .eval("return [...document.querySelectorAll('#events tr a')].map(a => a.textContent)");
    assert_eq!(rows, json!(["evt-list-2", "evt-list-1"]), "newest first");

    // A new event appears without a reload: a marker on the window survives.
    browser.eval("window.__no_reload = 'still here'; return true");
    send(&server, "evt-list-3", br#"{"n":3}"#, &[]);
    browser.wait_for(
        "the new event, without a reload",
        "#events a[href='/ui/events/gh/evt-list-3']",
    );
    assert_eq!(
        browser.eval("return window.__no_reload"),
        json!("still here")
    );

    // Keyboard: j moves down, Enter opens the event.
    browser.eval("document.activeElement.blur(); return true");
    browser.command(
        "POST",
        "/actions",
        Some(json!({"actions": [{"type": "key", "id": "kb", "actions": [
        {"type": "keyDown", "value": "j"}, {"type": "keyUp", "value": "j"},
        {"type": "keyDown", "value": "\u{E007}"}, {"type": "keyUp", "value": "\u{E007}"}]}]})),
    );
    browser.wait_js(
        "the second row's event page",
        "return location.pathname === '/ui/events/gh/evt-list-2'",
    );
    browser.go(&format!("{}/ui/", server.base_url()));
    browser.wait_for("the list", "#events a[href='/ui/events/gh/evt-list-3']");
    browser.screenshot("events");
    browser.resize(400, 860);
    browser.screenshot("events-phone");
    browser.resize(1280, 900);
    browser.assert_only_own_origin();
}
both_backends!(browser_sign_in_and_a_list_that_updates_itself);

#[test]
fn browser_hostile_payloads_are_shown_as_text_and_run_nothing() {
    // A canary: anything the page loads from here would be another origin.
    let canary = TcpListener::bind("127.0.0.1:0").expect("canary");
    canary.set_nonblocking(true).expect("nonblocking");
    let canary_url = format!("http://{}/probe.png", canary.local_addr().expect("addr"));
    let server = Server::start(&config_with(""), &[]);
    let probe = format!(
        "<script>window.__pwned = 'script'</script><img src=x onerror=\"window.__pwned = 'img'\"><img src=\"{canary_url}\">"
    );
    let body = json!({"action": "opened", "issue": {"title": probe, "number": 7}}).to_string();
    send(
        &server,
        "evt-hostile",
        body.as_bytes(),
        &[("User-Agent", &probe)],
    );
    // And a mismatched duplicate, for the diff.
    let changed = json!({"action": "edited", "issue": {"title": probe, "number": 8}}).to_string();
    send(&server, "evt-hostile", changed.as_bytes(), &[]);

    let Some(browser) = browser() else { return };
    browser.resize(1280, 900);
    sign_in_in_browser(&browser, &server, TOKEN);
    browser.wait_for("the list", "#events");
    browser.go(&format!("{}/ui/events/gh/evt-hostile", server.base_url()));
    browser.wait_for("the payload", "#payload");
    let payload = browser.text("#payload");
    assert!(
        payload.contains("<script>window.__pwned = 'script'</script>"),
        "{payload}"
    );
    assert!(payload.contains("onerror="), "{payload}");
    let headers = browser.text("#headers");
    assert!(
        headers.contains("<img src=x onerror="),
        "the kept User-Agent as text: {headers}"
    );
    browser.wait_for("the field-by-field diff", "#mismatch table.diff");
    let diff = browser.text("#mismatch");
    assert!(
        diff.contains("/action") && diff.contains("/issue/number"),
        "{diff}"
    );
    assert_eq!(
        browser
            .eval("return document.querySelectorAll('main script, main img, main iframe').length"),
        json!(0),
        "no element was made from the payload"
    );
    assert_eq!(
        browser.eval("return window.__pwned === undefined"),
        json!(true),
        "a probe ran"
    );
    assert!(canary.accept().is_err(), "the page fetched the canary");
    browser.assert_only_own_origin();
    browser.assert_no_policy_violations();
    browser.screenshot("event");
    browser.eval("document.querySelector('#mismatch').scrollIntoView(); return true");
    browser.screenshot("mismatch-diff");
    browser.eval("window.scrollTo(0, 0); return true");
    browser.resize(400, 860);
    browser.screenshot("event-phone");
    browser.resize(1280, 900);
}

#[test]
fn browser_replay_shows_its_plan_and_waits_for_the_confirming_click() {
    let downstream = Downstream::start();
    let server = Server::start(&config_with(&forward_action(&downstream, 1)), &[]);
    let key = "gh:evt-replay:notify";
    downstream.script(key, Behavior::Fail500(1));
    send(&server, "evt-replay", br#"{"replay":"me"}"#, &[]);
    let failed = || {
        count(
            &server.db(),
            "SELECT count(*) FROM jobs WHERE event_id = 'evt-replay' AND status = 'failed'",
            [],
        ) == 1
    };
    wait_until(PAGE_TIMEOUT, "the forward job to fail", failed);
    assert_eq!(downstream.request_count(), 1);
    // The provider's retry: a duplicate delivery, in the timeline too.
    send(&server, "evt-replay", br#"{"replay":"me"}"#, &[]);

    let Some(browser) = browser() else { return };
    browser.resize(1280, 900);
    sign_in_in_browser(&browser, &server, TOKEN);
    browser.wait_for("the list", "#events");
    browser.go(&format!("{}/ui/events/gh/evt-replay", server.base_url()));
    browser.wait_for("the replay button", "button.replay[data-action='notify']");
    browser.click("button.replay[data-action='notify']");
    browser.wait_for("the plan", "#replay-plan #confirm-replay");
    assert!(
        browser.text("#replay-plan").contains("dry run"),
        "{}",
        browser.text("#replay-plan")
    );
    browser.screenshot("replay-plan");
    // The plan changed nothing.
    assert!(failed(), "the plan re-opened the job");
    assert_eq!(count(&server.db(), "SELECT count(*) FROM replays", []), 0);
    assert_eq!(downstream.request_count(), 1);

    browser.click("#confirm-replay");
    browser.wait_for("the replay's result", "#replay-result a.attempt-link");
    wait_until(PAGE_TIMEOUT, "the replay at the downstream", || {
        downstream.effects(key) == 1
    });
    let requests = downstream.requests_for(key);
    assert_eq!(requests.len(), 2, "the first attempt and the replay");
    assert!(requests.iter().all(|r| r.idempotency_key() == Some(key)));
    let link = browser.eval(
        "return document.querySelector('#replay-result a.attempt-link').getAttribute('href')",
    );
    assert_eq!(link, json!("/ui/events/gh/evt-replay#attempt-notify-2"));
    // The result stays while the page redraws with the new attempt.
    browser.wait_for("the new attempt in the timeline", "#attempt-notify-2");
    browser.click("#replay-result a.attempt-link");
    browser.wait_for("the new attempt, highlighted", "#attempt-notify-2.target");
    let order = browser
        .eval("return [...document.querySelectorAll('#timeline .t-kind')].map(e => e.textContent)");
    assert_eq!(
        order,
        json!(["delivery", "attempt", "delivery", "replay", "attempt"])
    );
    browser.screenshot("event-after-replay");
    // The picture in docs/runbook.md (docs/inspector.png): the whole event
    // page after the replay.
    browser.eval("window.scrollTo(0, 0); return true");
    browser.resize(1280, 1300);
    browser.eval("window.scrollTo(0, 0); return true");
    let shot = browser.screenshot("event-replayed");
    let _ = std::fs::copy(&shot, screenshot_dir().join("docs-inspector.png"));
    browser.resize(1280, 900);
    browser.assert_no_policy_violations();

    // A batch from the filtered list: the plan first, then the click.
    let batch_key = "gh:evt-batch:notify";
    downstream.script(batch_key, Behavior::Fail500(1));
    send(&server, "evt-batch", br#"{"batch":1}"#, &[]);
    wait_until(PAGE_TIMEOUT, "the second job to fail", || {
        count(
            &server.db(),
            "SELECT count(*) FROM jobs WHERE status = 'failed'",
            [],
        ) == 1
    });
    browser.go(&format!("{}/ui/?source=gh", server.base_url()));
    browser.wait_for(
        "the failed event in the list",
        "#events tr.s-failed a[href='/ui/events/gh/evt-batch']",
    );
    browser.click("#batch-replay");
    browser.wait_for("the batch plan", "#replay-plan #confirm-replay");
    assert!(
        browser.text("#replay-plan").contains("gh/evt-batch"),
        "{}",
        browser.text("#replay-plan")
    );
    assert_eq!(browser.text("#confirm-replay"), "Confirm: replay 1 job");
    browser.screenshot("batch-plan");
    assert_eq!(
        downstream.requests_for(batch_key).len(),
        1,
        "the plan sent nothing"
    );
    browser.click("#confirm-replay");
    wait_until(PAGE_TIMEOUT, "the batch replay at the downstream", || {
        downstream.effects(batch_key) == 1
    });
    browser.wait_for(
        "the batch result",
        "#replay-result a.attempt-link[href='/ui/events/gh/evt-batch#attempt-notify-2']",
    );
}

/// On both backends.
fn browser_pause_and_resume_change_what_the_outbox_does(backend: Backend) {
    let downstream = Downstream::start();
    let server = Server::start_on(backend, &config_with(&forward_action(&downstream, 3)), &[]);
    let Some(browser) = browser() else { return };
    browser.resize(1280, 900);
    sign_in_in_browser(&browser, &server, TOKEN);
    browser.wait_for("the list", "#events");
    browser.go(&format!("{}/ui/actions", server.base_url()));
    browser.wait_for("the pause button", "#actions button[data-action='notify']");
    assert_eq!(
        browser.text("#actions button[data-action='notify']"),
        "Pause"
    );
    browser.click("#actions button[data-action='notify']");
    wait_until(PAGE_TIMEOUT, "the action to be paused", || {
        server.count("SELECT count(*) FROM paused_actions", &[]) == 1
    });
    send(&server, "evt-paused", br#"{"p":1}"#, &[]);
    wait_until(PAGE_TIMEOUT, "the job to wait as paused", || {
        server.count("SELECT count(*) FROM jobs WHERE status = 'paused'", &[]) == 1
    });
    browser.wait_js(
        "the paused count and the resume button",
        "const b = document.querySelector(\"#actions button[data-action='notify']\"); return b !== null && b.textContent === 'Resume' && b.closest('tr').children[6].textContent === '1'",
    );
    assert_eq!(
        downstream.request_count(),
        0,
        "a paused action sends nothing"
    );
    browser.screenshot("actions-paused");

    // The cross-origin POST of a page on another port of the same host
    // (same site, so the cookie goes along) is refused.
    browser.go(&downstream.url());
    let resume_url = format!("{}/api/actions/gh/notify/resume", server.base_url());
    // (The refusal carries Cross-Origin-Resource-Policy, so the fetch
    // itself may fail in the page: what counts is what the server did.)
    browser.eval_async(&format!(
        "fetch({}, {{method: 'POST', credentials: 'include', mode: 'no-cors'}}).then(() => done('sent'), e => done(String(e)))",
        json!(resume_url)
    ));
    wait_until(
        PAGE_TIMEOUT,
        "the server's refusal of the cross-origin POST",
        || server.logs().contains("inspector session refused"),
    );
    assert!(server.logs().contains("why=origin"), "{}", server.logs());
    assert_eq!(
        server.count("SELECT count(*) FROM paused_actions", &[]),
        1,
        "another origin resumed it"
    );
    assert_eq!(downstream.effects("gh:evt-paused:notify"), 0);

    browser.go(&format!("{}/ui/actions", server.base_url()));
    browser.wait_for(
        "the resume button",
        "#actions button[data-action='notify'].primary",
    );
    browser.click("#actions button[data-action='notify']");
    wait_until(PAGE_TIMEOUT, "the resumed job at the downstream", || {
        downstream.effects("gh:evt-paused:notify") == 1
    });
    assert_eq!(server.count("SELECT count(*) FROM paused_actions", &[]), 0);

    browser.go(&format!("{}/ui/reconcile", server.base_url()));
    browser.wait_for("the reconcile report", "#reconcile section");
    browser.screenshot("reconcile");
    browser.go(&format!("{}/ui/overview", server.base_url()));
    browser.wait_for("the chart's bars", "#chart svg rect");
    browser.screenshot("overview");
    browser.assert_only_own_origin();
}
both_backends!(browser_pause_and_resume_change_what_the_outbox_does);

#[test]
fn browser_a_check_and_the_attempt_it_confirmed_are_in_the_timeline() {
    let downstream = Downstream::start();
    let action = format!(
        "{}check = {}\n",
        forward_action(&downstream, 4),
        toml_str(&downstream.check_template())
    );
    let server = Server::start(&config_with(&action), &[]);
    let key = "gh:evt-check:notify";
    // The downstream does the work but the answer is lost: the retry asks
    // first, and the check says it is done.
    downstream.script(key, Behavior::ProcessThenDrop(1));
    send(&server, "evt-check", br#"{"check":"me"}"#, &[]);
    wait_until(PAGE_TIMEOUT, "the job to be confirmed done", || {
        count(
            &server.db(),
            "SELECT count(*) FROM jobs WHERE event_id = 'evt-check' AND status = 'done'",
            [],
        ) == 1
    });
    assert_eq!(downstream.effects(key), 1);

    let Some(browser) = browser() else { return };
    browser.resize(1280, 900);
    sign_in_in_browser(&browser, &server, TOKEN);
    browser.wait_for("the list", "#events");
    browser.go(&format!("{}/ui/events/gh/evt-check", server.base_url()));
    browser.wait_for("the timeline", "#timeline");
    let kinds = browser
        .eval("return [...document.querySelectorAll('#timeline .t-kind')].map(e => e.textContent)");
    // The attempt the check confirmed is labelled a check once the event
    // JSON carries its error kind ("confirmed").
    let shown = server
        .run_cli(&["events", "show", "gh", "evt-check", "--json"])
        .assert_success()
        .json();
    let confirmed = shown["jobs"][0]["attempts"][1]["error_kind"] == "confirmed";
    let last = if confirmed { "check" } else { "attempt" };
    assert_eq!(
        kinds,
        json!(["delivery", "attempt", "check", last]),
        "{}",
        browser.text("#timeline")
    );
    let timeline = browser.text("#timeline");
    assert!(
        timeline.contains("asked before #2") && timeline.contains("found"),
        "{timeline}"
    );
    assert_eq!(timeline.contains("confirmed"), confirmed, "{timeline}");
    browser.assert_no_policy_violations();
    browser.eval("document.querySelector('#timeline').scrollIntoView(); return true");
    browser.screenshot("event-check");
}

/// Every marker in a timeline, with the badge its item shows: `kind`
/// (delivery, attempt, ...), the badge's `word`, the marker's colour and
/// the badge's text colour.
fn timeline_markers(browser: &Browser) -> Vec<Value> {
    let found = browser.eval(
        "return [...document.querySelectorAll('#timeline li')].map(li => {
           const b = li.querySelector('.t-what .badge');
           return { kind: li.querySelector('.t-kind').textContent,
                    word: b ? b.textContent : null,
                    marker: getComputedStyle(li, '::before').backgroundColor,
                    badge: b ? getComputedStyle(b).color : null };
         })",
    );
    found.as_array().cloned().unwrap_or_default()
}

/// The colour a CSS variable of the page's style sheet resolves to.
fn css_colour(browser: &Browser, variable: &str) -> Value {
    browser.eval(&format!(
        "const p = document.createElement('span'); p.style.color = 'var({variable})';
         document.body.append(p); const c = getComputedStyle(p).color; p.remove(); return c"
    ))
}

#[test]
fn browser_timeline_markers_take_their_outcomes_colour() {
    let downstream = Downstream::start();
    let server = Server::start(&config_with(&forward_action(&downstream, 2)), &[]);
    let key = "gh:evt-colours:notify";
    // Attempt #1 is retried, #2 fails for good.
    downstream.script(key, Behavior::Fail500(2));
    send(&server, "evt-colours", br#"{"n":1}"#, &[]);
    wait_until(PAGE_TIMEOUT, "the forward job to fail", || {
        server.count(
            "SELECT count(*) FROM jobs WHERE event_id = 'evt-colours' AND status = 'failed'",
            &[],
        ) == 1
    });
    send(&server, "evt-colours", br#"{"n":1}"#, &[]);

    let Some(browser) = browser() else { return };
    browser.resize(1280, 900);
    sign_in_in_browser(&browser, &server, TOKEN);
    browser.wait_for("the list", "#events");
    browser.go(&format!("{}/ui/events/gh/evt-colours", server.base_url()));
    browser.wait_for("the failed attempt", "#attempt-notify-2");
    let markers = timeline_markers(&browser);
    let words: Vec<&str> = markers.iter().filter_map(|m| m["word"].as_str()).collect();
    assert_eq!(
        words,
        ["accepted", "retry", "failed", "duplicate"],
        "{markers:#?}"
    );
    // Each marker has its outcome's colour, the one its badge shows.
    for m in &markers {
        assert_eq!(
            m["marker"], m["badge"],
            "a marker not in its badge's colour: {m}"
        );
    }
    let by_word = |word: &str| {
        markers
            .iter()
            .find(|m| m["word"] == word)
            .map(|m| m["marker"].clone())
    };
    assert_eq!(
        by_word("failed"),
        Some(css_colour(&browser, "--bad")),
        "{markers:#?}"
    );
    assert_eq!(
        by_word("retry"),
        Some(css_colour(&browser, "--warn")),
        "{markers:#?}"
    );
    assert_eq!(
        by_word("accepted"),
        Some(css_colour(&browser, "--ok")),
        "{markers:#?}"
    );
    assert_ne!(
        by_word("failed"),
        by_word("accepted"),
        "a failed attempt is green"
    );
    browser.assert_no_policy_violations();
    browser.eval("document.querySelector('#timeline').scrollIntoView(); return true");
    browser.screenshot("timeline-outcome-colours");
}

#[test]
fn browser_a_mismatched_events_page_opens_with_a_banner() {
    let server = Server::start(&config_with(""), &[]);
    send(&server, "evt-banner", br#"{"amount":100}"#, &[]);
    send(&server, "evt-banner", br#"{"amount":999}"#, &[]);
    send(&server, "evt-banner", br#"{"amount":998}"#, &[]);
    send(&server, "evt-no-banner", br#"{"amount":1}"#, &[]);
    send(&server, "evt-no-banner", br#"{"amount":1}"#, &[]);

    let Some(browser) = browser() else { return };
    browser.resize(1280, 900);
    sign_in_in_browser(&browser, &server, TOKEN);
    browser.wait_for("the list", "#events");
    browser.go(&format!("{}/ui/events/gh/evt-banner", server.base_url()));
    browser.wait_for("the mismatch banner", "#mismatch-banner");
    let banner = browser.text("#mismatch-banner");
    assert!(
        banner.contains("2 deliveries of this event id came with a different payload"),
        "{banner}"
    );
    // It sits above everything else the page shows of the event, and
    // links to the comparison.
    assert_eq!(
        browser.eval(
            "const b = document.querySelector('#mismatch-banner');
             return b.compareDocumentPosition(document.querySelector('#timeline')) === Node.DOCUMENT_POSITION_FOLLOWING
               && b.querySelector('a').getAttribute('href') === '#mismatch'"
        ),
        json!(true)
    );
    browser.screenshot("event-mismatch-banner");
    browser.click("#mismatch-banner a");
    browser.wait_for("the comparison, highlighted", "#mismatch.target");

    // A plain duplicate is no mismatch: no banner.
    browser.go(&format!("{}/ui/events/gh/evt-no-banner", server.base_url()));
    browser.wait_for("the timeline", "#timeline");
    assert_eq!(
        browser.eval("return document.querySelector('#mismatch-banner') === null"),
        json!(true),
        "{}",
        browser.text("main")
    );
    browser.assert_no_policy_violations();
}

#[test]
fn browser_the_overviews_axis_labels_are_inside_the_chart() {
    let server = Server::start(&config_with(""), &[]);
    for i in 0..3 {
        send(&server, &format!("evt-axis-{i}"), br#"{"n":1}"#, &[]);
    }
    let Some(browser) = browser() else { return };
    browser.resize(1280, 900);
    sign_in_in_browser(&browser, &server, TOKEN);
    browser.wait_for("the list", "#events");
    browser.go(&format!("{}/ui/overview", server.base_url()));
    browser.wait_for("the chart's bars", "#chart svg rect");
    let outside = "const s = document.querySelector('#chart svg').getBoundingClientRect();
        return [...document.querySelectorAll('#chart svg text')]
          .map(t => ({ text: t.textContent, r: t.getBoundingClientRect() }))
          .filter(({ r }) => r.left < s.left - 0.5 || r.right > s.right + 0.5 || r.top < s.top - 0.5 || r.bottom > s.bottom + 0.5)
          .map(({ text, r }) => `${text}: ${r.left.toFixed(1)}..${r.right.toFixed(1)} in ${s.left.toFixed(1)}..${s.right.toFixed(1)}`)";
    let labels = browser.eval("return document.querySelectorAll('#chart svg text').length");
    assert!(
        labels.as_u64().is_some_and(|n| n >= 6),
        "axis labels: {labels}"
    );
    assert_eq!(
        browser.eval(outside),
        json!([]),
        "labels cut off at 1280 px"
    );
    browser.screenshot("overview-axis");
    browser.resize(400, 860);
    browser.wait_for("the chart's bars", "#chart svg rect");
    assert_eq!(browser.eval(outside), json!([]), "labels cut off at 400 px");
    browser.screenshot("overview-axis-phone");
    browser.resize(1280, 900);
}

#[test]
fn browser_a_token_link_opened_on_the_sign_in_page_signs_in() {
    let server = Server::start(&config_with(""), &[]);
    send(&server, "evt-link", br#"{"n":1}"#, &[]);
    let Some(browser) = browser() else { return };
    browser.resize(1280, 900);
    let base = server.base_url();
    browser.go(&format!("{base}/ui/"));
    browser.wait_for("the sign-in form", "#signin");
    assert_eq!(
        browser.eval("return document.querySelector('#nav').offsetParent === null"),
        json!(true),
        "the views' links show on the sign-in page"
    );
    // The same page takes the link: only its fragment changes.
    browser.eval("window.__same_page = 'yes'; return true");
    browser.go(&format!("{base}/ui/#token={TOKEN}"));
    browser.wait_for(
        "the events, signed in by the link",
        "#events a[href='/ui/events/gh/evt-link']",
    );
    assert_eq!(
        browser.eval("return window.__same_page"),
        json!("yes"),
        "the page was reloaded"
    );
    assert_eq!(
        browser.eval("return location.href"),
        json!(format!("{base}/ui/")),
        "the token stays in the address bar"
    );
    assert_eq!(
        browser.eval("return document.querySelector('#nav').offsetParent !== null"),
        json!(true),
        "signed in, the views' links do not show"
    );
    browser.screenshot("token-link-signed-in");
    browser.assert_no_policy_violations();

    // Signed out, a link with a wrong token says so, and is dropped too.
    browser.click("#signout");
    browser.wait_for("the sign-in form", "#signin");
    browser.go(&format!("{base}/ui/#token=not-the-token"));
    browser.wait_js(
        "the wrong-token message",
        "return document.querySelector('#signin-error')?.textContent.includes('not the admin token') === true",
    );
    assert_eq!(
        browser.eval("return location.href"),
        json!(format!("{base}/ui/"))
    );
    assert_eq!(browser.eval("return window.__same_page"), json!("yes"));
    browser.screenshot("token-link-wrong-token");
}

/// The Refused view: kept refusals listed and opened, and a re-ingest
/// whose plan changes nothing until the confirming click.
#[test]
fn browser_refused_view_reingests_after_a_confirming_click() {
    const RIGHT: &str = "whsec_inspector_right";
    let config = ServerConfig::new()
        .set("admin_token", &toml_str(TOKEN))
        .tables("[sources.pay]\nkind = \"stripe\"\nsecrets = [\"env:PAY_SECRET\"]\n");
    let mut server = Server::start(&config, &[("PAY_SECRET", "whsec_mistyped")]);
    for id in ["evt_r1", "evt_r2"] {
        let body = json!({"id": id, "type": "charge.succeeded"}).to_string();
        let r = server.post(
            "/hooks/pay",
            &sign::stripe_now(RIGHT, body.as_bytes()),
            body.as_bytes(),
        );
        assert_eq!(r.status, 401, "{}", r.text());
    }
    let kept = |server: &Server| count(&server.db(), "SELECT count(*) FROM rejected", []);
    wait_until(PAGE_TIMEOUT, "two refusals kept", || kept(&server) == 2);
    server.set_env("PAY_SECRET", RIGHT);
    server.restart();

    let Some(browser) = browser() else { return };
    browser.resize(1280, 900);
    sign_in_in_browser(&browser, &server, TOKEN);
    browser.wait_for("the list", "#events");
    browser.go(&format!("{}/ui/refused", server.base_url()));
    browser.wait_for("the kept refusals", "#refused tr[data-id]");
    browser.click("#refused a[data-id]");
    browser.wait_for("one opened", "#refused-detail section pre.payload");
    assert!(
        browser
            .text("#refused-detail")
            .contains("no signature matched"),
        "{}",
        browser.text("#refused-detail")
    );
    browser.click("#reingest-sources button.reingest[data-source='pay']");
    browser.wait_for("the plan", "#reingest-plan #confirm-reingest");
    let plan = browser.text("#reingest-plan");
    assert!(
        plan.contains("dry run") && plan.matches("would pass").count() == 2,
        "{plan}"
    );
    browser.screenshot("refused-plan");
    assert_eq!(kept(&server), 2, "the plan changed nothing");
    assert_eq!(count(&server.db(), "SELECT count(*) FROM events", []), 0);

    browser.click("#confirm-reingest");
    browser.wait_for(
        "the result",
        "#reingest-result a[href='/ui/events/pay/evt_r1']",
    );
    assert_eq!(kept(&server), 0);
    assert_eq!(count(&server.db(), "SELECT count(*) FROM events", []), 2);
    browser.wait_for("the emptied list", "#refused td.empty");
    browser.screenshot("refused-done");
    browser.assert_no_policy_violations();
}

/// The reconcile view shows each source's last catch-up, its API error as
/// text.
#[test]
fn browser_reconcile_shows_the_last_catch_up_and_its_error() {
    use crate::catchup::fakes::{self, HookTarget};
    let fake = fakes::github(
        "the-right-token",
        "repos/acme/shop/hooks/1",
        Vec::new(),
        HookTarget {
            url: Default::default(),
            secret: SECRET.to_string(),
        },
    );
    let server = Server::start(
        &config_with(&format!(
            "[sources.gh.catchup]\napi_key = \"a-wrong-token\"\nhook = \"repos/acme/shop/hooks/1\"\n\
             interval = \"0s\"\napi_url = {}\n",
            toml_str(&fake.url())
        )),
        &[],
    );
    let run = server.run_cli(&["catchup", "gh", "--yes"]);
    assert_eq!(run.status.code(), Some(1), "{}\n{}", run.stdout, run.stderr);
    assert!(
        run.stdout.contains("answered 401: Bad credentials"),
        "{}",
        run.stdout
    );

    let Some(browser) = browser() else { return };
    sign_in_in_browser(&browser, &server, TOKEN);
    browser.wait_for("the list", "#events");
    browser.go(&format!("{}/ui/reconcile", server.base_url()));
    browser.wait_for("the catch-up card", "#reconcile li.catchup");
    let text = browser.text("#reconcile li.catchup");
    assert!(text.contains("gh") && text.contains("0 claimed"), "{text}");
    assert!(text.contains("answered 401: Bad credentials"), "{text}");
    assert!(!text.contains("a-wrong-token"), "{text}");
}
