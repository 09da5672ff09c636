//! The command line and what a new user meets first: config discovery
//! (`--config`, `IDEMHOOK_CONFIG`, `./idemhook.toml`, the development
//! default), a closed pipe, log levels, `check`'s warnings, help texts, the
//! admin throttle, what shutdown says it waits for, and the example
//! systemd unit. Each runs the real binary.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::downstream::{Behavior, Downstream};
use crate::harness::{
    CLI_TIMEOUT, CliOutput, HTTP_TIMEOUT, Server, ServerConfig, binary, raw_exchange, raw_request,
    run_binary, toml_str, wait_for, wait_until,
};
use crate::helpers::{StripeHook, stripe_config};
use crate::sign;

const SECRET: &str = "whsec_it_cli_secret_0123456789";
const STRIPE: StripeHook = StripeHook::new("stripe", SECRET);
const ADMIN_TOKEN: &str = "it-cli-admin-token-5d1e-0123456789abcdef0123456789abcdef";

fn env() -> Vec<(&'static str, &'static str)> {
    vec![
        ("STRIPE_SECRET", SECRET),
        ("IDEMHOOK_ADMIN_TOKEN", ADMIN_TOKEN),
    ]
}

fn event(id: &str) -> Vec<u8> {
    serde_json::json!({"id": id, "object": "event", "type": "charge.succeeded", "data": {"object": {"amount": 1}}})
        .to_string()
        .into_bytes()
}

/// Runs the binary in `dir` with exactly `env` (plus PATH).
fn run_in(dir: &Path, env: &[(&str, &str)], args: &[&str]) -> CliOutput {
    let env: BTreeMap<String, String> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    run_binary(dir, &env, &args, CLI_TIMEOUT)
}

fn show(out: &CliOutput) -> String {
    format!(
        "`idemhook {}` exited {}\n----- stdout -----\n{}\n----- stderr -----\n{}",
        out.args.join(" "),
        out.status,
        out.stdout,
        out.stderr
    )
}

// ---------------------------------------------------------------------------
// Config discovery
// ---------------------------------------------------------------------------

/// Regression: without `./idemhook.toml` the operator commands silently
/// used the development default (`reconcile` said "clean" about the wrong
/// database), and `--config ./idemhook.toml` naming a missing file fell
/// back to it too.
#[test]
fn config_comes_from_the_flag_then_idemhook_config_and_a_named_file_must_exist() {
    let empty = tempfile::tempdir().expect("tempdir");
    let elsewhere = tempfile::tempdir().expect("tempdir");
    let config_path = elsewhere.path().join("prod.toml");
    std::fs::write(&config_path, stripe_config("").render()).expect("write config");
    let config_arg = config_path.display().to_string();
    let secret = [("STRIPE_SECRET", SECRET)];

    // The development default, from a command other than serve: one line
    // on stderr naming the database it uses.
    let out = run_in(empty.path(), &secret, &["check"]);
    assert!(out.success(), "{}", show(&out));
    let expected_db = empty.path().join("idemhook.db");
    let notes: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.contains("development default"))
        .collect();
    assert!(
        notes.len() == 1 && notes[0].contains(&expected_db.display().to_string()),
        "expected: one stderr line naming the development default and its database {}\n{}",
        expected_db.display(),
        show(&out)
    );

    // IDEMHOOK_CONFIG names the file when --config does not.
    let with_env = [("STRIPE_SECRET", SECRET), ("IDEMHOOK_CONFIG", &config_arg)];
    let out = run_in(empty.path(), &with_env, &["check"]);
    assert!(
        out.success()
            && out.stdout.starts_with(&format!("config {config_arg}: ok"))
            && !out.stderr.contains("development default"),
        "expected: check describes {config_arg}, from IDEMHOOK_CONFIG\n{}",
        show(&out)
    );
    // --config wins over IDEMHOOK_CONFIG.
    let other = elsewhere.path().join("other.toml");
    std::fs::write(
        &other,
        stripe_config("")
            .set("listen", &toml_str("127.0.0.1:9"))
            .render(),
    )
    .expect("write config");
    let out = run_in(
        empty.path(),
        &with_env,
        &["check", "--config", &other.display().to_string()],
    );
    assert!(
        out.success() && out.stdout.contains("listen      127.0.0.1:9"),
        "expected: --config over IDEMHOOK_CONFIG\n{}",
        show(&out)
    );

    // A named file that is missing is an error naming it, from either.
    for (env, args, named) in [
        (
            vec![("STRIPE_SECRET", SECRET)],
            vec!["reconcile", "--config", "./idemhook.toml"],
            "./idemhook.toml",
        ),
        (
            vec![
                ("STRIPE_SECRET", SECRET),
                ("IDEMHOOK_CONFIG", "nowhere.toml"),
            ],
            vec!["reconcile"],
            "nowhere.toml",
        ),
        (
            vec![
                ("STRIPE_SECRET", SECRET),
                ("IDEMHOOK_CONFIG", "nowhere.toml"),
            ],
            vec!["serve", "--listen", "127.0.0.1:0"],
            "nowhere.toml",
        ),
    ] {
        let out = run_in(empty.path(), &env, &args);
        assert!(
            out.status.code() == Some(2)
                && out.stderr.contains(named)
                && out.stderr.contains("does not exist")
                && !out.stdout.contains("clean"),
            "expected: exit 2 naming the missing {named}\n{}",
            show(&out)
        );
    }
    assert!(
        !empty.path().join("idemhook.db").exists(),
        "no command created the development database"
    );
}

// ---------------------------------------------------------------------------
// A closed pipe
// ---------------------------------------------------------------------------

/// Regression: `idemhook events list | head` panicked (exit 101) when
/// `head` had gone. Now every printing command stops quietly with exit 0.
#[test]
fn a_closed_pipe_ends_every_printing_command_quietly_with_exit_0() {
    let server = Server::start(&stripe_config(""), &env());
    assert_eq!(STRIPE.deliver(&server, &event("evt_pipe")).status, 200);
    let config = server
        .config_path()
        .expect("a config file")
        .display()
        .to_string();
    let hooks = server.url("/hooks/stripe");
    let commands: &[&[&str]] = &[
        &["events", "list"],
        &["events", "list", "--json"],
        &["events", "show", "stripe", "evt_pipe"],
        &["events", "show", "stripe", "evt_pipe", "--json"],
        &["check"],
        &["reconcile"],
        &["reconcile", "--json"],
        &["prune", "--dry-run"],
        &["replay", "stripe", "evt_pipe"],
        &["erase", "stripe", "evt_pipe"],
        &["help", "events"],
        &["man"],
        &["completions", "bash"],
        &["send", "stripe", "--id", "evt_pipe_send", "--url", &hooks],
        &["backup", "pipe-backup.db"],
    ];
    for args in commands {
        // A pipe whose reader is gone before the command writes: its first
        // write fails with EPIPE, deterministically.
        let (reader, writer) = std::io::pipe().expect("pipe");
        drop(reader);
        let mut cmd = Command::new(binary());
        cmd.env_clear();
        if let Some(path) = std::env::var_os("PATH") {
            cmd.env("PATH", path);
        }
        let out = cmd
            .envs(env())
            .args(["--config", &config])
            .args(*args)
            .current_dir(server.dir())
            .stdin(Stdio::null())
            .stdout(writer)
            .stderr(Stdio::piped())
            .output()
            .expect("run idemhook");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.code() == Some(0) && stderr.is_empty(),
            "`idemhook {}` into a closed pipe\n  expected: exit 0, nothing on stderr\n  got: {} with stderr:\n{stderr}",
            args.join(" "),
            out.status
        );
    }
}

/// The stored events of a list long enough (about 200 KiB of table) that
/// a reader which stops after one line leaves the command writing into a
/// closed pipe, whatever the pipe's buffer holds.
fn store_many_events(server: &Server, n: usize) {
    let mut conn = server.db_rw();
    let tx = conn.transaction().expect("begin");
    for i in 0..n {
        tx.execute(
            "INSERT INTO events (source, event_id, type, state, received_at, payload_hash, headers)
             VALUES ('stripe', ?1, 'charge.succeeded', 'completed', ?2, 'h', '{}')",
            rusqlite::params![
                format!("evt_many_{i:05}_{}", "x".repeat(40)),
                1_764_460_800_000_i64 + i as i64
            ],
        )
        .expect("insert an event");
    }
    tx.commit().expect("commit");
}

/// The command line of `idemhook --config CONFIG ARGS...` for `server`.
fn idemhook(server: &Server, args: &[&str]) -> Command {
    let config = server
        .config_path()
        .expect("a config file")
        .display()
        .to_string();
    let mut cmd = Command::new(binary());
    cmd.env_clear();
    if let Some(path) = std::env::var_os("PATH") {
        cmd.env("PATH", path);
    }
    cmd.envs(env())
        .args(["--config", &config])
        .args(args)
        .current_dir(server.dir())
        .stdin(Stdio::null());
    cmd
}

/// `idemhook ARGS | head -1`: head reads one line and goes; the command's
/// next writes fail with EPIPE, and it stops quietly with exit 0 (not a
/// panic, not an error line). Returns the line head printed.
fn into_head_1(server: &Server, args: &[&str]) -> String {
    let mut command = idemhook(server, args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run idemhook");
    let head = Command::new("head")
        .arg("-1")
        .stdin(command.stdout.take().expect("the command's stdout"))
        .stdout(Stdio::piped())
        .output()
        .expect("run head");
    let what = format!("idemhook {}", args.join(" "));
    let status = wait_for(
        CLI_TIMEOUT,
        &format!("`{what}` to end once head has gone"),
        || match command.try_wait() {
            Ok(Some(status)) => Ok(status),
            Ok(None) => Err("still running".to_string()),
            Err(e) => Err(e.to_string()),
        },
    );
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut command.stderr.take().expect("stderr"), &mut stderr)
        .expect("read stderr");
    assert!(
        status.code() == Some(0) && stderr.is_empty(),
        "`{what} | head -1`\n  expected: exit 0, nothing on stderr\n  got: {status} with stderr:\n{stderr}"
    );
    String::from_utf8_lossy(&head.stdout).to_string()
}

/// `idemhook ARGS > /dev/full`: the write fails with ENOSPC. The command
/// ends with exit 2 and one error line that says what failed (it used to
/// panic, exit 101, with a backtrace hint).
fn into_a_full_device(server: &Server, args: &[&str]) {
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .expect("open /dev/full");
    let out = idemhook(server, args)
        .stdout(full)
        .stderr(Stdio::piped())
        .output()
        .expect("run idemhook");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert!(
        out.status.code() == Some(2)
            && lines.len() == 1
            && lines[0].starts_with("idemhook: cannot write the output: ")
            && lines[0].contains("No space left on device")
            && !stderr.contains("panicked"),
        "`idemhook {} > /dev/full`\n  expected: exit 2 and one line naming the failed write\n  got: {} with stderr:\n{stderr}",
        args.join(" "),
        out.status
    );
}

#[test]
fn events_list_into_head_1_exits_0_quietly() {
    let server = Server::start(&stripe_config(""), &env());
    store_many_events(&server, 2_000);
    let first = into_head_1(&server, &["events", "list"]);
    assert!(
        first.starts_with("RECEIVED") && first.lines().count() == 1,
        "head printed the table's first line: {first:?}"
    );
}

#[test]
fn events_list_into_a_full_device_is_one_error_line_and_exit_2() {
    let server = Server::start(&stripe_config(""), &env());
    assert_eq!(STRIPE.deliver(&server, &event("evt_full")).status, 200);
    into_a_full_device(&server, &["events", "list"]);
}

/// `check` and `man` (a page of tens of KiB) print as every command does:
/// through one writer whose errors `cli` judges, quiet into `head -1`, one
/// line into a full device.
#[test]
fn check_and_man_into_head_1_exit_0_and_into_a_full_device_exit_2() {
    let server = Server::start(&stripe_config(""), &env());
    let first = into_head_1(&server, &["check"]);
    assert!(first.starts_with("config "), "head printed: {first:?}");
    let first = into_head_1(&server, &["man"]);
    assert!(first.lines().count() == 1, "head printed: {first:?}");
    into_a_full_device(&server, &["check"]);
    into_a_full_device(&server, &["man"]);
}

// ---------------------------------------------------------------------------
// Log levels
// ---------------------------------------------------------------------------

/// Regression: a dead letter, a mismatch and a bad signature were logged at
/// INFO, so `--log-level warn` hid exactly what the alert rules call
/// incidents. Now they are warnings (a dead letter an error) and the
/// normal flow stays info.
#[test]
fn log_level_warn_shows_the_incidents_and_nothing_else() {
    let downstream = Downstream::start();
    downstream.script("stripe:evt_dead:notify", Behavior::Reject400);
    let config = stripe_config(&format!(
        "[[sources.stripe.actions]]\nname = \"notify\"\nforward = \"{}\"\n\
         [[sources.stripe.actions]]\nname = \"ledger\"\nsql = \"INSERT INTO ledger(event_id) VALUES (:event_id)\"\n",
        downstream.url()
    ))
    .set(
        "setup_sql",
        &toml_str("CREATE TABLE IF NOT EXISTS ledger(event_id TEXT CHECK (event_id <> 'evt_sql_dead'))"),
    );
    let server = Server::start_with_args(&config, &env(), &["--log-level", "warn"]);

    assert_eq!(STRIPE.deliver(&server, &event("evt_fine")).status, 200);
    assert_eq!(
        STRIPE.deliver(&server, &event("evt_fine")).status,
        200,
        "a duplicate"
    );
    assert_eq!(STRIPE.deliver(&server, &event("evt_dead")).status, 200);
    assert_eq!(STRIPE.deliver(&server, &event("evt_sql_dead")).status, 200);
    let changed =
        serde_json::json!({"id": "evt_fine", "type": "charge.succeeded", "changed": true})
            .to_string()
            .into_bytes();
    assert_eq!(
        STRIPE.deliver(&server, &changed).status,
        200,
        "a mismatch is acked"
    );
    let forged = server.post(
        "/hooks/stripe",
        &sign::stripe_now("whsec_not_the_secret", &event("evt_forged")),
        &event("evt_forged"),
    );
    assert_eq!(forged.status, 401);

    let wanted = [
        ("WARN delivery", "outcome=bad_signature"),
        ("WARN delivery", "outcome=mismatch"),
        ("ERROR attempt", "event_id=evt_dead"),
        ("ERROR action failed", "event_id=evt_sql_dead"),
    ];
    wait_until(
        Duration::from_secs(20),
        "the four incidents in the log at warn",
        || {
            let logs = server.stderr();
            wanted
                .iter()
                .all(|(what, field)| logs.lines().any(|l| l.contains(what) && l.contains(field)))
        },
    );
    // evt_fine's forward went out fine: wait for it, then nothing of the
    // normal flow may be in the log.
    wait_until(Duration::from_secs(20), "evt_fine forwarded", || {
        downstream.effects("stripe:evt_fine:notify") == 1
    });
    // Let a second go by for anything the server would still write.
    wait_until(Duration::from_secs(5), "the log to settle", || {
        let before = server.stderr().len();
        std::thread::sleep(Duration::from_millis(300));
        server.stderr().len() == before
    });
    let logs = server.stderr();
    for normal in [
        " INFO ",
        "outcome=accepted",
        "outcome=duplicate",
        "outcome=ok",
    ] {
        assert!(
            !logs.contains(normal),
            "expected: no {normal:?} at --log-level warn\n{logs}"
        );
    }
    drop(server);

    // An unknown level is an error naming the valid ones.
    let dir = tempfile::tempdir().expect("tempdir");
    for (env, args) in [
        (vec![], vec!["--log-level", "verbose", "check"]),
        (vec![("IDEMHOOK_LOG", "verbose")], vec!["check"]),
    ] {
        let out = run_in(dir.path(), &env, &args);
        assert!(
            out.status.code() == Some(2)
                && out.stderr.contains("verbose")
                && out.stderr.contains("debug")
                && out.stderr.contains("error"),
            "expected: exit 2 listing the valid levels\n{}",
            show(&out)
        );
    }
}

// ---------------------------------------------------------------------------
// check's warnings
// ---------------------------------------------------------------------------

#[test]
fn check_warns_about_shell_variables_and_short_retention_and_names_every_unset_variable() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("idemhook.toml");
    let path_arg = path.display().to_string();

    std::fs::write(
        &path,
        ServerConfig::new()
            .tables(
                "[sources.stripe]\nkind = \"stripe\"\nsecrets = [\"$STRIPE_SECRET\"]\nretention = \"1d\"\n\
                 [sources.gh]\nkind = \"github\"\nsecrets = [\"${GITHUB_SECRET}\"]\n",
            )
            .render(),
    )
    .expect("write config");
    let out = run_in(dir.path(), &[], &["check", "--config", &path_arg]);
    assert!(out.success(), "warnings do not fail check\n{}", show(&out));
    let warnings: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.starts_with("warning: "))
        .collect();
    let has = |needle: &str| warnings.iter().any(|w| w.contains(needle));
    assert!(
        warnings.len() == 3
            && has("sources.stripe.secrets[0]: the literal secret looks like a shell variable")
            && has("sources.gh.secrets[0]: the literal secret looks like a shell variable")
            && has("sources.stripe.retention: 1d is shorter than stripe's retry horizon")
            && has("processed again")
            && !out.stderr.contains("STRIPE_SECRET"),
        "expected: three warnings (two shell variables, one short retention), no secret shown\n{}",
        show(&out)
    );
    // serve logs the same warnings at start.
    let mut config = ServerConfig::new().tables(
        "[sources.stripe]\nkind = \"stripe\"\nsecrets = [\"$STRIPE_SECRET\"]\nretention = \"1d\"\n",
    );
    config = config.set("admin_token", &toml_str("env:IDEMHOOK_ADMIN_TOKEN"));
    let server = Server::start(&config, &env());
    wait_until(HTTP_TIMEOUT, "serve logs the config warnings", || {
        let logs = server.stderr();
        logs.contains("WARN config") && logs.contains("retry horizon")
    });
    drop(server);

    // Every unset variable at once, in one error.
    std::fs::write(
        &path,
        ServerConfig::new()
            .tables(
                "[sources.stripe]\nkind = \"stripe\"\nsecrets = [\"env:IT_UNSET_STRIPE\", \"env:IT_UNSET_STRIPE_OLD\"]\n\
                 [[sources.stripe.actions]]\nname = \"notify\"\nforward = \"http://127.0.0.1:9/x\"\nsign_secret = \"env:IT_UNSET_FORWARD\"\n\
                 [sources.gh]\nkind = \"github\"\nsecrets = [\"env:IT_UNSET_GITHUB\"]\n",
            )
            .render(),
    )
    .expect("write config");
    let out = run_in(dir.path(), &[], &["check", "--config", &path_arg]);
    let errors: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.starts_with("idemhook:"))
        .collect();
    assert!(
        out.status.code() == Some(2)
            && errors.len() == 1
            && [
                "IT_UNSET_STRIPE (sources.stripe.secrets[0])",
                "IT_UNSET_STRIPE_OLD (sources.stripe.secrets[1])",
                "IT_UNSET_FORWARD (sources.stripe.actions[0] (notify).sign_secret)",
                "IT_UNSET_GITHUB (sources.gh.secrets[0])",
            ]
            .iter()
            .all(|n| errors[0].contains(n)),
        "expected: one error naming all four unset variables\n{}",
        show(&out)
    );
}

// ---------------------------------------------------------------------------
// Help
// ---------------------------------------------------------------------------

#[test]
fn help_explains_every_flag() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (args, texts) in [
        (
            vec!["help", "events", "list"],
            vec![
                "Only events of this source",
                "Only events in this state",
                "Print the events as JSON",
                "$IDEMHOOK_CONFIG",
            ],
        ),
        (
            vec!["help", "events", "show"],
            vec!["The event's source", "The event id"],
        ),
        (vec!["help", "reconcile"], vec!["Print the report as JSON"]),
        (vec!["help", "backup"], vec!["it must not exist yet"]),
        (
            vec!["help", "send"],
            vec!["The configured source to sign for"],
        ),
    ] {
        let out = run_in(dir.path(), &[], &args);
        assert!(out.success(), "{}", show(&out));
        for text in texts {
            assert!(
                out.stdout.contains(text),
                "expected {text:?}\n{}",
                show(&out)
            );
        }
    }
}

// ---------------------------------------------------------------------------
// The admin throttle
// ---------------------------------------------------------------------------

/// An admin request over a fresh connection; `auth` is the whole
/// Authorization header value, when one is sent.
fn admin(
    server: &Server,
    method: &str,
    auth: Option<&str>,
    extra: &[(&str, &str)],
) -> (u16, Option<String>) {
    let mut headers: Vec<(String, String)> = extra
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    if let Some(a) = auth {
        headers.push(("Authorization".into(), a.into()));
    }
    let resp = raw_exchange(
        server.addr(),
        &raw_request(method, "/api/reconcile", &headers, b""),
        HTTP_TIMEOUT,
    );
    let status = resp
        .status
        .unwrap_or_else(|| panic!("no answer to {method} /api/reconcile: {}", resp.text()));
    (status, resp.header("Retry-After"))
}

/// Regression: after 10 failed admin authentications from one address the
/// right token was refused too (429 for 60 s), and requests without any
/// Authorization (a CORS preflight) counted as failed guesses.
#[test]
fn the_admin_throttle_holds_back_wrong_tokens_and_never_the_right_one() {
    let server = Server::start(
        &stripe_config("").set("admin_token", &toml_str("env:IDEMHOOK_ADMIN_TOKEN")),
        &env(),
    );
    let right = format!("Bearer {ADMIN_TOKEN}");
    // No Authorization at all is no guess: 401, however many.
    for _ in 0..12 {
        assert_eq!(admin(&server, "GET", None, &[]).0, 401);
        let preflight = [
            ("Origin", "https://example.test"),
            ("Access-Control-Request-Method", "GET"),
        ];
        assert_eq!(admin(&server, "OPTIONS", None, &preflight).0, 401);
    }
    // So ten wrong tokens are still answered 401...
    for i in 0..10 {
        assert_eq!(
            admin(&server, "GET", Some("Bearer wrong"), &[]).0,
            401,
            "wrong token #{}: requests without a token did not count",
            i + 1
        );
    }
    // ... and the eleventh is throttled, with Retry-After in seconds.
    let (status, retry_after) = admin(&server, "GET", Some("Bearer wrong"), &[]);
    assert!(
        status == 429
            && retry_after
                .as_deref()
                .and_then(|s| s.parse::<u64>().ok())
                .is_some_and(|s| (1..=60).contains(&s)),
        "expected: 429 with Retry-After 1..60\n  got: {status} {retry_after:?}"
    );
    // The right token passes while the address is throttled.
    assert_eq!(
        admin(&server, "GET", Some(&right), &[]).0,
        200,
        "the right token is never refused by the throttle"
    );
    assert_eq!(
        admin(&server, "GET", None, &[]).0,
        401,
        "no token: still 401"
    );
    assert_eq!(admin(&server, "GET", Some("Bearer wrong"), &[]).0, 429);
    let logs = server.stderr();
    assert!(
        !logs.contains("wrong") && !logs.contains(ADMIN_TOKEN),
        "no token sent reaches the log\n{logs}"
    );
}

// ---------------------------------------------------------------------------
// Shutdown
// ---------------------------------------------------------------------------

/// Regression: a stop waited up to a forward timeout without saying what
/// it waited for.
#[test]
fn shutdown_names_the_forward_attempts_it_waits_for() {
    let downstream = Downstream::start();
    let config = stripe_config(&format!(
        "[[sources.stripe.actions]]\nname = \"notify\"\nforward = \"{}\"\ntimeout = \"7s\"\n",
        downstream.url()
    ));
    let mut server = Server::start(&config, &env());
    downstream.close_gate();
    assert_eq!(STRIPE.deliver(&server, &event("evt_in_flight")).status, 200);
    wait_until(
        Duration::from_secs(20),
        "the attempt held at the downstream",
        || downstream.held() == 1,
    );
    server.terminate();
    let line = wait_for(
        Duration::from_secs(20),
        "a log line naming the attempt in flight",
        || {
            let logs = server.stderr();
            logs.lines()
                .find(|l| l.contains("waiting for forward attempts in flight"))
                .map(str::to_string)
                .ok_or(logs)
        },
    );
    assert!(
        line.contains("forward_in_flight=1") && line.contains("up_to=7s"),
        "expected: one attempt in flight, up to the 7s timeout\n  got: {line}"
    );
    let stopping = server
        .stderr()
        .lines()
        .find(|l| l.contains(" stopping "))
        .map(str::to_string)
        .unwrap_or_default();
    assert!(
        stopping.contains("requests_grace=10s") && stopping.contains("forward_timeout_max=7s"),
        "expected: the stopping line says what the stop waits for\n  got: {stopping:?}"
    );
    downstream.open_gate();
    let status = server.wait_exit(Duration::from_secs(20));
    assert!(status.success(), "exit {status}");
}

// ---------------------------------------------------------------------------
// The example systemd unit
// ---------------------------------------------------------------------------

#[test]
fn the_example_systemd_unit_verifies() {
    let unit_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/idemhook.service");
    let unit = std::fs::read_to_string(&unit_path).expect("examples/idemhook.service");
    for key in [
        "ExecStart=/usr/local/bin/idemhook serve --config ",
        "DynamicUser=yes",
        "StateDirectory=idemhook",
        "ProtectSystem=strict",
        "ReadWritePaths=/var/lib/idemhook",
        "NoNewPrivileges=yes",
        "PrivateTmp=yes",
        "RestrictAddressFamilies=",
        "CapabilityBoundingSet=",
        "LimitCORE=0",
        "LoadCredential=",
    ] {
        assert!(unit.contains(key), "the example unit lacks {key:?}");
    }
    let found = Command::new("systemd-analyze")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        eprintln!(
            "\n*** SKIPPED the_example_systemd_unit_verifies: systemd-analyze is not installed; \
             only the unit's keys were checked, not `systemd-analyze verify` ***\n"
        );
        return;
    }
    // `verify` checks that ExecStart's binary exists: point it at the one
    // under test. It warns about unknown keys and bad values on stderr and
    // still exits 0, so any output at all is a failure.
    let dir = tempfile::tempdir().expect("tempdir");
    let copy = dir.path().join("idemhook.service");
    std::fs::write(&copy, unit.replace("/usr/local/bin/idemhook", binary())).expect("write unit");
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&copy)
        .output()
        .expect("run systemd-analyze verify");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && text.trim().is_empty(),
        "systemd-analyze verify examples/idemhook.service\n  expected: exit 0, no output\n  got: {}\n{text}",
        out.status
    );
}

// ---------------------------------------------------------------------------
// The documents
// ---------------------------------------------------------------------------

/// The documents a reader meets: README.md, ARCHITECTURE.md, every page of
/// docs/, the fuzzing notes and the example unit.
fn documents(root: &Path) -> Vec<std::path::PathBuf> {
    let mut docs = vec![
        root.join("README.md"),
        root.join("ARCHITECTURE.md"),
        root.join("tests/fuzz/README.md"),
    ];
    for dir in ["docs", "examples"] {
        let mut pages: Vec<_> = std::fs::read_dir(root.join(dir))
            .unwrap_or_else(|e| panic!("read {dir}/: {e}"))
            .map(|entry| entry.expect("a directory entry").path())
            .filter(|path| path.is_file())
            .filter(|path| {
                let ext = path.extension().and_then(|e| e.to_str());
                ext == Some("md") || (dir == "examples" && ext != Some("png"))
            })
            .collect();
        pages.sort();
        docs.extend(pages);
    }
    docs
}

/// Whether `name`, read from the document at `doc`, is a file of the
/// repository: relative to the document's folder, to the root or to
/// `src/` (the code map names modules so), and inside the repository
/// either way (`../shared/X.md` is not).
fn in_repository(root: &Path, doc: &Path, name: &str) -> bool {
    let root = root.canonicalize().expect("the repository root");
    let folder = doc.parent().expect("a document's folder");
    [
        folder.join(name),
        root.join(name),
        root.join("src").join(name),
    ]
    .iter()
    .filter_map(|candidate| candidate.canonicalize().ok())
    .any(|found| found.starts_with(&root))
}

/// The anchor GitHub gives a heading: lowercased, punctuation dropped,
/// spaces as dashes.
fn heading_anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_' || *c == ' ')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a Markdown text's headings, outside code blocks.
fn anchors(text: &str) -> Vec<String> {
    let mut in_code = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
        } else if !in_code && line.starts_with('#') {
            out.push(heading_anchor(line.trim_start_matches('#')));
        }
    }
    out
}

/// The targets of a Markdown text's inline links, `[text](target)`.
fn link_targets(text: &str) -> Vec<&str> {
    text.match_indices("](")
        .filter_map(|(at, _)| {
            let rest = &text[at + 2..];
            rest.find(')').map(|end| &rest[..end])
        })
        .collect()
}

/// The documents speak of the project only: no issue numbers, and every
/// file they name (`*.md`, paths to `.rs`, `.sh` or `.service` files) is in
/// the repository; every relative link resolves to a file of the
/// repository (and a `#fragment` into a Markdown file to one of its
/// headings); and every page of docs/ is linked from the README.
#[test]
fn the_documents_cite_only_files_in_the_repository_and_no_issues() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut problems = Vec::new();
    for doc in documents(root) {
        let shown = doc.strip_prefix(root).unwrap_or(&doc).display().to_string();
        let text = std::fs::read_to_string(&doc).unwrap_or_else(|e| panic!("read {shown}: {e}"));
        let words: Vec<&str> = text
            .split(|c: char| !(c.is_ascii_alphanumeric() || "_./-".contains(c)))
            .filter(|w| !w.is_empty())
            .collect();
        for pair in words.windows(2) {
            let issue = pair[0].trim_start_matches('#');
            if issue.eq_ignore_ascii_case("issue") && pair[1].bytes().all(|b| b.is_ascii_digit()) {
                problems.push(format!("{shown} cites an issue: {} {}", pair[0], pair[1]));
            }
        }
        for word in &words {
            let word = word.trim_end_matches('.');
            let is_doc = word.ends_with(".md");
            let is_repo_path = word.contains('/')
                && !word.starts_with('/')
                && [".rs", ".sh", ".service"].iter().any(|e| word.ends_with(e));
            if (is_doc || is_repo_path) && !in_repository(root, &doc, word) {
                problems.push(format!(
                    "{shown} names {word}, which is not in the repository"
                ));
            }
        }
        for target in link_targets(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, fragment) = target.split_once('#').unwrap_or((target, ""));
            let file = if path.is_empty() {
                doc.clone()
            } else {
                doc.parent().expect("a document's folder").join(path)
            };
            let inside = file
                .canonicalize()
                .is_ok_and(|f| f.starts_with(root.canonicalize().expect("the root")));
            if !inside {
                problems.push(format!(
                    "{shown} links to {target}, which is not a file of the repository"
                ));
                continue;
            }
            if !fragment.is_empty() && file.extension().is_some_and(|e| e == "md") {
                let linked = std::fs::read_to_string(&file).unwrap_or_default();
                if !anchors(&linked).iter().any(|a| a == fragment) {
                    problems.push(format!(
                        "{shown} links to {target}, which has no heading #{fragment}"
                    ));
                }
            }
        }
    }
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let linked = link_targets(&readme);
    for doc in documents(root) {
        let Ok(page) = doc.strip_prefix(root.join("docs")) else {
            continue;
        };
        if doc.extension().is_some_and(|e| e == "md") {
            let page = format!("docs/{}", page.display());
            if !linked
                .iter()
                .any(|t| t.split('#').next() == Some(page.as_str()))
            {
                problems.push(format!("README.md does not link to {page}"));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "the documents\n  expected: no issue numbers, no files outside the repository, every link resolving, every docs/ page linked from the README\n  got:\n    {}",
        problems.join("\n    ")
    );
}
