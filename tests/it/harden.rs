//! Hardening: config errors that never echo a secret, weak admin tokens
//! refused, libpq keyword strings refused, operator commands that need no
//! webhook secret, file modes, the admin throttle, `/readyz` coalesced,
//! the inspector behind a TLS-terminating proxy.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use crate::backend::{Backend, both_backends};
use crate::harness::{
    CLI_TIMEOUT, CliOutput, Client, HTTP_TIMEOUT, Server, ServerConfig, headers, run_binary,
    toml_str, wait_until,
};
use crate::helpers::{StripeHook, api, stripe_config, stripe_source};

/// `idemhook ARGS --config idemhook.toml` in `dir`, where the config is
/// `text`, with `env` as the whole environment.
fn run_with(dir: &Path, text: &str, args: &[&str], env: &[(&str, &str)]) -> CliOutput {
    let path = dir.join("idemhook.toml");
    std::fs::write(&path, text).expect("write config");
    let mut all: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    all.push("--config".into());
    all.push(path.display().to_string());
    let env: BTreeMap<String, String> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    run_binary(dir, &env, &all, CLI_TIMEOUT)
}

fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("idemhook-it-harden-")
        .tempdir()
        .expect("tempdir")
}

/// `check` and `serve` both refuse `text`; returns their stderr, each
/// asserted free of `secret`.
fn refused_by_check_and_serve(text: &str, env: &[(&str, &str)], secret: &str) -> Vec<String> {
    let mut said = Vec::new();
    for verb in ["check", "serve"] {
        let dir = tempdir();
        let out = run_with(dir.path(), text, &[verb], env);
        assert!(!out.success(), "`{verb}` accepted it: {out:?}");
        let all = format!("{}{}", out.stdout, out.stderr);
        assert!(!all.contains(secret), "`{verb}` printed the secret: {all}");
        said.push(out.stderr);
    }
    said
}

const LISTEN: &str = "listen = \"127.0.0.1:0\"\n";

#[test]
fn a_toml_type_error_names_file_line_column_and_key_never_the_value() {
    let secret = "whsec_typed_where_a_list_belongs_81f2";
    let text = format!("{LISTEN}[sources.stripe]\nkind = \"stripe\"\nsecrets = \"{secret}\"\n");
    for said in refused_by_check_and_serve(&text, &[], secret) {
        assert!(said.contains("idemhook.toml"), "{said}");
        assert!(said.contains("line 4, column 11"), "{said}");
        assert!(said.contains("sources.stripe.secrets"), "{said}");
        assert!(said.contains("expected a sequence"), "{said}");
    }
}

#[test]
fn a_toml_syntax_error_names_the_key_never_the_line() {
    let secret = "0123456789abcdef-unterminated-admin-token-77";
    let text = format!(
        "{LISTEN}admin_token = \"{secret}\n[sources.stripe]\nkind = \"stripe\"\nsecrets = [\"s\"]\n"
    );
    for said in refused_by_check_and_serve(&text, &[], secret) {
        assert!(said.contains("line 2, column"), "{said}");
        assert!(said.contains("key admin_token"), "{said}");
    }
}

#[test]
fn a_url_password_in_a_refused_forward_is_redacted() {
    let text = format!(
        "{LISTEN}[sources.stripe]\nkind = \"stripe\"\nsecrets = [\"s\"]\n\
         [[sources.stripe.actions]]\nname = \"q\"\nforward = \"amqp://user:broker-pw-5c1a@mq:5672/vh\"\n"
    );
    for said in refused_by_check_and_serve(&text, &[], "broker-pw-5c1a") {
        assert!(said.contains("forward"), "{said}");
        assert!(said.contains("[REDACTED]"), "{said}");
    }
}

#[test]
fn a_libpq_keyword_database_is_refused_with_a_hint_never_its_password() {
    let secret = "pg-pass-never-shown-93d1";
    let text = format!(
        "{LISTEN}database = \"host=db port=5432 dbname=app user=idemhook password={secret}\"\n\
         [sources.stripe]\nkind = \"stripe\"\nsecrets = [\"s\"]\n"
    );
    for verb in ["check", "serve"] {
        let dir = tempdir();
        let out = run_with(dir.path(), &text, &[verb], &[]);
        assert!(!out.success(), "`{verb}` accepted it: {out:?}");
        let all = format!("{}{}", out.stdout, out.stderr);
        assert!(
            !all.contains(secret),
            "`{verb}` printed the password: {all}"
        );
        assert!(all.contains("postgres://"), "{all}");
        assert!(all.contains("URL"), "{all}");
        let files: Vec<String> = std::fs::read_dir(dir.path())
            .expect("read dir")
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            files,
            vec!["idemhook.toml".to_string()],
            "{verb} created a file"
        );
    }
}

#[test]
fn an_admin_token_under_32_characters_is_refused_however_given() {
    let short = "short-admin-token-4f1";
    let source = "[sources.stripe]\nkind = \"stripe\"\nsecrets = [\"s\"]\n";
    let cases: Vec<(String, Vec<(&str, &str)>)> = vec![
        (
            format!("{LISTEN}admin_token = \"{short}\"\n{source}"),
            vec![],
        ),
        (
            format!("{LISTEN}admin_token = \"env:ADMIN_TOKEN\"\n{source}"),
            vec![("ADMIN_TOKEN", short)],
        ),
        (
            format!("{LISTEN}admin_token = \"file:admin.token\"\n{source}"),
            vec![],
        ),
    ];
    for (text, env) in cases {
        for verb in ["check", "serve"] {
            let dir = tempdir();
            std::fs::write(dir.path().join("admin.token"), format!("{short}\n")).expect("write");
            let out = run_with(dir.path(), &text, &[verb], &env);
            assert!(!out.success(), "`{verb}` accepted a short token: {out:?}");
            let all = format!("{}{}", out.stdout, out.stderr);
            assert!(!all.contains(short), "printed the token: {all}");
            assert!(all.contains("admin_token"), "{all}");
            assert!(all.contains("openssl rand -hex 32"), "{all}");
        }
    }
    // 32 characters pass.
    let dir = tempdir();
    let long = "a".repeat(32);
    let out = run_with(
        dir.path(),
        &format!("{LISTEN}admin_token = \"{long}\"\n{source}"),
        &["check"],
        &[],
    );
    out.assert_success();
}

const SECRET: &str = "whsec_it_harden_secret_0123456789";
const STRIPE: StripeHook = StripeHook::new("stripe", SECRET);

both_backends!(operator_commands_need_no_secret_set);

/// A cron-style `reconcile` and `events list`/`show` on a host that holds
/// none of the webhook or forward secrets exit 0 and see the events;
/// `check` still needs them.
fn operator_commands_need_no_secret_set(backend: Backend) {
    let config = ServerConfig::new().tables(&stripe_source(
        "stripe",
        "[[sources.stripe.actions]]\nname = \"app\"\nforward = \"http://127.0.0.1:9/in\"\n\
         sign_secret = \"env:FORWARD_SIGN_SECRET\"\n",
    ));
    let server = Server::start_on(
        backend,
        &config,
        &[
            ("STRIPE_SECRET", SECRET),
            (
                "FORWARD_SIGN_SECRET",
                "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            ),
        ],
    );
    let body = br#"{"id":"evt_cron_1","object":"event","type":"charge.succeeded"}"#;
    STRIPE.deliver_ok(&server, body);
    let config_path = server.config_path().expect("config").display().to_string();
    let bare = |args: &[&str]| {
        let mut all: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        all.push("--config".into());
        all.push(config_path.clone());
        run_binary(server.dir(), &BTreeMap::new(), &all, CLI_TIMEOUT)
    };
    bare(&["reconcile"]).assert_success();
    let list = bare(&["events", "list", "--json"]);
    list.assert_success();
    assert!(list.stdout.contains("evt_cron_1"), "{}", list.stdout);
    bare(&["events", "show", "stripe", "evt_cron_1"]).assert_success();
    bare(&["prune", "--dry-run"]).assert_success();
    bare(&["rejected", "list"]).assert_success();
    let check = bare(&["check"]);
    assert!(!check.success(), "check resolves every secret: {check:?}");
    assert!(check.stderr.contains("STRIPE_SECRET"), "{}", check.stderr);
}

const ADMIN_TOKEN: &str = "it-harden-admin-token-0123456789abcdef0123";

both_backends!(graph_client_state_is_never_shown);

/// Graph's clientState, its only verification secret, is `[REDACTED]` in
/// `events show` (text and JSON) and in the admin API the inspector reads.
fn graph_client_state_is_never_shown(backend: Backend) {
    let state = "graph-client-state-secret-6b2e";
    let config = ServerConfig::new()
        .set("admin_token", &toml_str("env:IDEMHOOK_ADMIN_TOKEN"))
        .tables("[sources.graph]\nkind = \"msgraph\"\nsecrets = [\"env:GRAPH_STATE\"]\n");
    let server = Server::start_on(
        backend,
        &config,
        &[
            ("GRAPH_STATE", state),
            ("IDEMHOOK_ADMIN_TOKEN", ADMIN_TOKEN),
        ],
    );
    let body = format!(
        r#"{{"value":[{{"id":"g-1","subscriptionId":"s1","changeType":"created","resource":"Users/1/Messages/2","clientState":"{state}","tenantId":"t1"}}]}}"#
    );
    let resp = server.post(
        "/hooks/graph",
        &[("Content-Type".to_string(), "application/json".to_string())],
        body.as_bytes(),
    );
    assert!(resp.status / 100 == 2, "{} {}", resp.status, resp.text());
    let list = server.run_cli(&["events", "list", "--json"]);
    list.assert_success();
    let listed = list.json();
    let id = listed
        .as_array()
        .and_then(|a| a.first())
        .and_then(|e| e["event_id"].as_str())
        .unwrap_or_else(|| panic!("one event: {listed}"))
        .to_string();
    for args in [
        vec!["events", "show", "graph", id.as_str()],
        vec!["events", "show", "graph", id.as_str(), "--json"],
    ] {
        let out = server.run_cli(&args);
        out.assert_success();
        assert!(
            !out.stdout.contains(state),
            "{args:?} shows it: {}",
            out.stdout
        );
        assert!(out.stdout.contains("[REDACTED]"), "{}", out.stdout);
    }
    let (status, shown) = api(
        &server,
        "GET",
        &format!("/api/events/graph/{id}?details=true"),
        Some(ADMIN_TOKEN),
        Vec::new(),
    );
    assert_eq!(status, 200, "{shown}");
    let text = shown.to_string();
    assert!(!text.contains(state), "the admin API shows it: {text}");
    assert!(text.contains("[REDACTED]"), "{text}");
    // It is stored as received: only what is shown hides it.
    assert_eq!(
        server.count(
            "SELECT count(*) FROM events WHERE source = 'graph' AND event_id = ?1",
            &[&id.as_str()]
        ),
        1
    );
}

/// A process with `IDEMHOOK_FAILPOINTS` set says so loudly at start; one
/// without says nothing of failpoints.
#[test]
fn armed_failpoints_are_a_loud_warning_at_start() {
    let config = stripe_config("");
    let armed = Server::start(
        &config,
        &[
            ("STRIPE_SECRET", SECRET),
            ("IDEMHOOK_FAILPOINTS", "outbox.idle=sleep(50)"),
        ],
    );
    wait_until(HTTP_TIMEOUT, "the failpoint warning", || {
        armed.stderr().contains("FAILPOINTS ARMED")
    });
    let line = armed
        .stderr()
        .lines()
        .find(|l| l.contains("FAILPOINTS ARMED"))
        .map(str::to_string)
        .unwrap_or_default();
    assert!(line.contains("WARN"), "{line}");
    assert!(line.contains("outbox.idle=sleep(50)"), "{line}");
    let plain = Server::start(&config, &[("STRIPE_SECRET", SECRET)]);
    assert!(!plain.stderr().contains("FAILPOINTS"), "{}", plain.stderr());
}

/// `serve` creates the database, `-wal` and `-shm` readable by their owner
/// only; an existing database keeps its mode.
#[test]
fn the_sqlite_files_are_created_owner_only() {
    use std::os::unix::fs::PermissionsExt as _;
    let mut server = Server::start(&stripe_config(""), &[("STRIPE_SECRET", SECRET)]);
    let body = br#"{"id":"evt_mode_1","object":"event","type":"charge.succeeded"}"#;
    STRIPE.deliver_ok(&server, body);
    let db = server.db_path();
    let mode = |suffix: &str| {
        let path = format!("{}{suffix}", db.display());
        std::fs::metadata(&path)
            .unwrap_or_else(|e| panic!("{path}: {e}"))
            .permissions()
            .mode()
            & 0o777
    };
    for suffix in ["", "-wal", "-shm"] {
        assert_eq!(mode(suffix), 0o600, "idemhook.db{suffix}");
    }
    // An operator's own choice on an existing file stands.
    server.kill9();
    std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o640)).expect("chmod");
    server.restart();
    STRIPE.deliver_ok(
        &server,
        br#"{"id":"evt_mode_2","object":"event","type":"x"}"#,
    );
    assert_eq!(mode(""), 0o640);
}

/// `check` warns, naming the key and the file, when a `file:` secret is
/// readable by every user; not when it is the owner's only.
#[test]
fn check_warns_about_a_secret_file_others_may_read() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempdir();
    let text = format!(
        "{LISTEN}[sources.stripe]\nkind = \"stripe\"\nsecrets = [\"file:stripe.secret\"]\n"
    );
    let secret_path = dir.path().join("stripe.secret");
    std::fs::write(&secret_path, format!("{SECRET}\n")).expect("write");
    std::fs::set_permissions(&secret_path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let loose = run_with(dir.path(), &text, &["check"], &[]);
    loose.assert_success();
    assert!(
        loose.stderr.contains("warning: sources.stripe.secrets[0]")
            && loose.stderr.contains("stripe.secret")
            && loose.stderr.contains("readable by every user"),
        "{}",
        loose.stderr
    );
    assert!(!loose.stderr.contains(SECRET), "{}", loose.stderr);
    std::fs::set_permissions(&secret_path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let tight = run_with(dir.path(), &text, &["check"], &[]);
    tight.assert_success();
    assert!(!tight.stderr.contains("readable"), "{}", tight.stderr);
}

/// The admin throttle's refusals are counted in
/// `idemhook_admin_throttled_total` and summarised in the log: one line,
/// not a line per refusal.
#[test]
fn admin_throttle_refusals_are_counted_and_summarised() {
    let server = Server::start(
        &stripe_config("").set("admin_token", &toml_str("env:IDEMHOOK_ADMIN_TOKEN")),
        &[
            ("STRIPE_SECRET", SECRET),
            ("IDEMHOOK_ADMIN_TOKEN", ADMIN_TOKEN),
        ],
    );
    let throttled = || {
        let resp = Client::new(HTTP_TIMEOUT).get_with(
            &server.url("/metrics"),
            &headers(&[("Authorization", &format!("Bearer {ADMIN_TOKEN}"))]),
        );
        assert_eq!(resp.status, 200, "{}", resp.text());
        resp.text()
            .lines()
            .find_map(|l| l.strip_prefix("idemhook_admin_throttled_total "))
            .map(|v| v.trim().to_string())
            .unwrap_or_else(|| panic!("no idemhook_admin_throttled_total:\n{}", resp.text()))
    };
    assert_eq!(throttled(), "0");
    let wrong = "wrong-token-0123456789abcdef0123456789";
    for _ in 0..10 {
        assert_eq!(
            api(&server, "GET", "/api/overview", Some(wrong), Vec::new()).0,
            401
        );
    }
    for _ in 0..7 {
        assert_eq!(
            api(&server, "GET", "/api/overview", Some(wrong), Vec::new()).0,
            429
        );
    }
    assert_eq!(throttled(), "7");
    wait_until(HTTP_TIMEOUT, "the summary line", || {
        server.stderr().contains("admin authentications throttled")
    });
    let lines = server
        .stderr()
        .lines()
        .filter(|l| l.contains("admin authentications throttled"))
        .count();
    assert_eq!(
        lines,
        1,
        "one summary, not a line per refusal:\n{}",
        server.stderr()
    );
    assert!(
        !server.stderr().contains(wrong),
        "the token sent is never logged"
    );
}

/// `/readyz` probes are coalesced: probes that arrive while one runs
/// share the next one (at most one probe write in flight) instead of a
/// write each, and every one of them is answered 200. The database's write
/// lock is held meanwhile, so that they all arrive while the first runs.
#[test]
fn concurrent_readyz_probes_share_their_writes() {
    use std::io::{Read as _, Write as _};
    use std::sync::atomic::{AtomicUsize, Ordering};
    const PROBES: usize = 40;
    // Enough workers for every probe to reach the handler at once (each
    // holds one while it waits).
    let config = stripe_config("").set("http_workers", "64");
    let server = Server::start(&config, &[("STRIPE_SECRET", SECRET)]);
    let operations = || -> u64 {
        let resp = Client::new(HTTP_TIMEOUT).get_with(&server.url("/metrics"), &[]);
        assert_eq!(resp.status, 200, "{}", resp.text());
        resp.text()
            .lines()
            .find_map(|l| l.strip_prefix("idemhook_committed_operations_total "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no idemhook_committed_operations_total:\n{}", resp.text()))
    };
    assert_eq!(server.get("/readyz").status, 200);
    let before = operations();
    let lock = server.db_rw();
    lock.execute_batch("BEGIN IMMEDIATE")
        .expect("hold the write lock");
    let sent = Arc::new(AtomicUsize::new(0));
    let addr = server.addr();
    let threads: Vec<_> = (0..PROBES)
        .map(|_| {
            let sent = sent.clone();
            std::thread::spawn(move || {
                let mut conn = std::net::TcpStream::connect(addr).expect("connect");
                conn.set_read_timeout(Some(HTTP_TIMEOUT * 4))
                    .expect("timeout");
                conn.write_all(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    .expect("send");
                sent.fetch_add(1, Ordering::SeqCst);
                let mut answer = String::new();
                let _ = conn.read_to_string(&mut answer);
                answer
            })
        })
        .collect();
    wait_until(HTTP_TIMEOUT, "every probe sent", || {
        sent.load(Ordering::SeqCst) == PROBES
    });
    lock.execute_batch("COMMIT").expect("release");
    for t in threads {
        let answer = t.join().expect("probe thread");
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }
    let writes = operations() - before;
    assert!(
        (1..=PROBES as u64 / 4).contains(&writes),
        "{PROBES} probes arriving together made {writes} probe writes"
    );
}

/// One request on its own connection: (status, head, body).
fn exchange(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, String, String) {
    use std::io::{Read as _, Write as _};
    let mut request = format!("{method} {path} HTTP/1.1\r\n");
    for (k, v) in headers {
        request.push_str(&format!("{k}: {v}\r\n"));
    }
    request.push_str(&format!(
        "Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    ));
    let mut stream = std::net::TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(HTTP_TIMEOUT * 2))
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
    (status, head.to_string(), body.to_string())
}

/// Behind a TLS-terminating proxy (`public_origin = "https://..."`), the
/// inspector's sign-in from the public origin works, its cookie is
/// `Secure` with a lifetime, and a state-changing request the cookie
/// carries from that origin passes the same-origin check; another origin
/// is still refused.
#[test]
fn the_inspector_works_behind_a_tls_terminating_proxy() {
    let public_host = "hooks.example.test";
    let public = format!("https://{public_host}");
    let config = stripe_config(
        "[[sources.stripe.actions]]\nname = \"notify\"\nforward = \"http://127.0.0.1:9/in\"\n",
    )
    .set("admin_token", &toml_str("env:IDEMHOOK_ADMIN_TOKEN"))
    .set("public_origin", &toml_str(&public));
    let server = Server::start(
        &config,
        &[
            ("STRIPE_SECRET", SECRET),
            ("IDEMHOOK_ADMIN_TOKEN", ADMIN_TOKEN),
        ],
    );
    let addr = server.addr();
    let body = format!(r#"{{"token":"{ADMIN_TOKEN}"}}"#);
    let (status, head, text) = exchange(
        addr,
        "POST",
        "/ui/session",
        &[
            ("Host", public_host),
            ("Origin", &public),
            ("Content-Type", "application/json"),
        ],
        body.as_bytes(),
    );
    assert_eq!(status, 204, "sign-in through the proxy: {head}\n{text}");
    let set = head
        .lines()
        .find_map(|l| {
            l.split_once(':')
                .filter(|(k, _)| k.eq_ignore_ascii_case("set-cookie"))
                .map(|(_, v)| v.trim().to_string())
        })
        .expect("a session cookie");
    assert!(set.contains("; Secure"), "{set}");
    assert!(set.contains("Max-Age=43200"), "{set}");
    let cookie = set.split(';').next().expect("name=value").to_string();
    let pause = "/api/actions/stripe/notify/pause";
    let (status, _, text) = exchange(
        addr,
        "POST",
        pause,
        &[
            ("Host", public_host),
            ("Cookie", &cookie),
            ("Origin", &public),
        ],
        b"",
    );
    assert_eq!(
        status, 200,
        "a state-changing request from the public origin: {text}"
    );
    assert_eq!(
        server.count(
            "SELECT count(*) FROM paused_actions WHERE source = 'stripe' AND action = 'notify'",
            &[]
        ),
        1,
        "the pause took effect"
    );
    let (status, _, text) = exchange(
        addr,
        "POST",
        "/api/actions/stripe/notify/resume",
        &[
            ("Host", public_host),
            ("Cookie", &cookie),
            ("Origin", "https://elsewhere.example.test"),
        ],
        b"",
    );
    assert_eq!(status, 403, "another origin: {text}");
}

/// A PostgreSQL role that may connect but not create idemhook's schema
/// gets from `check` and `serve` the statement to run; once run, `check`
/// passes.
#[test]
fn a_connect_only_postgres_role_is_told_the_grant_to_run() {
    let Some(cluster) = crate::pg_cluster::cluster() else {
        crate::pg_cluster::skipped("a_connect_only_postgres_role_is_told_the_grant_to_run");
        return;
    };
    let admin_url = cluster.create_database("connect_only");
    let database = admin_url
        .split('?')
        .next()
        .and_then(|head| head.rsplit('/').next())
        .expect("a database name")
        .to_string();
    let role = format!("connect_only_{}", std::process::id());
    let mut admin = postgres::Client::connect(&admin_url, postgres::NoTls).expect("connect");
    admin
        .batch_execute(&format!(
            "DROP ROLE IF EXISTS {role}; CREATE ROLE {role} LOGIN"
        ))
        .expect("create the role");
    let role_url = admin_url.replacen("postgres@", &format!("{role}@"), 1);
    assert_ne!(role_url, admin_url, "the test cluster's URL names its user");
    let text = format!(
        "{LISTEN}database = {}\n[sources.stripe]\nkind = \"stripe\"\nsecrets = [\"s\"]\n",
        toml_str(&role_url)
    );
    let grant = format!("GRANT CREATE ON DATABASE {database} TO {role};");
    for verb in ["check", "serve"] {
        let dir = tempdir();
        let out = run_with(dir.path(), &text, &[verb], &[]);
        assert!(
            !out.success(),
            "`{verb}` went on without the right: {out:?}"
        );
        assert!(out.stderr.contains(&grant), "`{verb}`: {}", out.stderr);
    }
    admin.batch_execute(&grant).expect("the grant it names");
    let dir = tempdir();
    run_with(dir.path(), &text, &["check"], &[]).assert_success();
}
