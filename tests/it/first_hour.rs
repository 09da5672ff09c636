//! The first hour with a database, as a new user meets it: `--database`
//! reads its value as the `database` key does, no password ever reaches
//! output (malformed URLs included), the password may come from
//! `PGPASSWORD` or the password file, connection errors say why, and
//! `serve` says the same start-up and stop lines on both backends.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use crate::backend::{Backend, both_backends};
use crate::harness::{CliOutput, Server, ServerConfig, run_binary, toml_str, wait_until};
use crate::pg_cluster;

const PASSWORD: &str = "hunter2-sEcReT";

const SOURCE: &str = "[sources.stripe]\nkind = \"stripe\"\nsecrets = [\"whsec_first_hour\"]\n";

/// The binary in `dir`, with `env` and these arguments.
fn run(dir: &Path, env: &[(&str, &str)], args: &[&str]) -> CliOutput {
    let env: BTreeMap<String, String> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    run_binary(dir, &env, &args, Duration::from_secs(30))
}

fn write_config(dir: &Path, database: &str) {
    std::fs::write(
        dir.join("idemhook.toml"),
        format!("database = {}\n{SOURCE}", toml_str(database)),
    )
    .expect("write config");
}

fn files_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("read dir")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn no_malformed_database_value_prints_its_password_or_makes_a_file() {
    let malformed = [
        format!("postgresql:/idemhook:{PASSWORD}@db.internal/app"),
        format!("postgres:idemhook:{PASSWORD}@db.internal/app"),
        format!("postgres//idemhook:{PASSWORD}@db.internal/app"),
        format!("mysql://idemhook:{PASSWORD}@db.internal/app"),
        format!("postgres://idemhook:{PASSWORD}@127.0.0.1:1/app?sslmod=require"),
        format!("postgres://idemhook:{PASSWORD}@127.0.0.1:1/app?sslmode=sometimes"),
        format!("postgres://idemhook@127.0.0.1:1/app?password={PASSWORD}"),
        format!("postgres://idemhook:{PASSWORD}@127.0.0.1:1/app"),
    ];
    for value in &malformed {
        // As the key, through check and serve.
        let dir = tempfile::tempdir().expect("tempdir");
        write_config(dir.path(), value);
        for args in [&["check"][..], &["serve", "--listen", "127.0.0.1:0"][..]] {
            let out = run(dir.path(), &[], args);
            assert_eq!(out.status.code(), Some(2), "{value} {args:?}: {out:?}");
            assert!(
                !out.stderr.contains(PASSWORD) && !out.stdout.contains(PASSWORD),
                "{value} {args:?}: {out:?}"
            );
            assert!(
                out.stderr.trim().lines().count() == 1,
                "one line: {value} {args:?}: {}",
                out.stderr
            );
        }
        assert_eq!(files_in(dir.path()), vec!["idemhook.toml".to_string()]);
        // As the flag, without a config file.
        let bare = tempfile::tempdir().expect("tempdir");
        let out = run(
            bare.path(),
            &[],
            &["serve", "--listen", "127.0.0.1:0", "--database", value],
        );
        assert_eq!(out.status.code(), Some(2), "--database {value}: {out:?}");
        assert!(
            !out.stderr.contains(PASSWORD) && !out.stdout.contains(PASSWORD),
            "--database {value}: {out:?}"
        );
        assert!(files_in(bare.path()).is_empty(), "--database {value}");
    }
    // The cause is named: the parameter the URL misspelled.
    let dir = tempfile::tempdir().expect("tempdir");
    write_config(dir.path(), &malformed[4]);
    let out = run(dir.path(), &[], &["check"]);
    assert!(out.stderr.contains("sslmod"), "{}", out.stderr);
}

#[test]
fn the_database_flag_reads_like_the_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("idemhook.toml"), SOURCE).expect("write config");
    // sqlite:PATH names the file PATH; env:NAME reads the variable.
    for (value, env, file) in [
        ("sqlite:flag.db", None, "flag.db"),
        (
            "env:IDEMHOOK_DATABASE_URL",
            Some(("IDEMHOOK_DATABASE_URL", "from-env.db")),
            "from-env.db",
        ),
    ] {
        let mut cmd = std::process::Command::new(crate::harness::binary());
        cmd.env_clear()
            .current_dir(dir.path())
            .args(["serve", "--listen", "127.0.0.1:0", "--database", value])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        if let Some((k, v)) = env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn serve");
        wait_until(Duration::from_secs(30), file, || {
            dir.path().join(file).exists()
        });
        let _ = child.kill();
        let _ = child.wait();
        assert!(!dir.path().join(value).exists(), "{value}");
    }
    let out = run(
        dir.path(),
        &[],
        &["serve", "--database", "env:IDEMHOOK_NOT_SET_ANYWHERE"],
    );
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        out.stderr.contains("--database") && out.stderr.contains("IDEMHOOK_NOT_SET_ANYWHERE"),
        "{}",
        out.stderr
    );
    assert!(!dir.path().join("env:IDEMHOOK_NOT_SET_ANYWHERE").exists());
}

#[test]
fn the_password_comes_from_pgpassword_or_the_password_file() {
    let Some((local, port)) = pg_cluster::private_with_passwords() else {
        pg_cluster::skipped("the_password_comes_from_pgpassword_or_the_password_file");
        return;
    };
    let mut admin = postgres::Client::connect(&local.cluster().url("postgres"), postgres::NoTls)
        .expect("connect");
    admin
        .batch_execute(&format!("CREATE ROLE idemhook LOGIN PASSWORD '{PASSWORD}'"))
        .expect("the docs' setup");
    admin
        .batch_execute("CREATE DATABASE app OWNER idemhook")
        .expect("the docs' setup");
    let dir = tempfile::tempdir().expect("tempdir");
    write_config(
        dir.path(),
        &format!("postgres://idemhook@127.0.0.1:{port}/app"),
    );

    // None given: the server asks for one, and the error says where it goes.
    let out = run(dir.path(), &[], &["check"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(out.stderr.contains("PGPASSWORD"), "{}", out.stderr);

    let ok = run(dir.path(), &[("PGPASSWORD", PASSWORD)], &["check"]);
    assert!(ok.success(), "{ok:?}");
    assert!(ok.stdout.contains("accepts writes"), "{}", ok.stdout);
    assert!(!ok.stdout.contains(PASSWORD));

    // The password file, owner-only; a line per host with `*` wildcards.
    let pgpass = dir.path().join("pgpass");
    std::fs::write(
        &pgpass,
        format!("# idemhook\nother:5432:*:*:nope\n127.0.0.1:{port}:app:idemhook:{PASSWORD}\n"),
    )
    .expect("write pgpass");
    let file = pgpass.display().to_string();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&pgpass, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        let ok = run(dir.path(), &[("PGPASSFILE", &file)], &["check"]);
        assert!(ok.success(), "{ok:?}");
        // Readable by others: ignored, as libpq ignores it.
        std::fs::set_permissions(&pgpass, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let out = run(dir.path(), &[("PGPASSFILE", &file)], &["check"]);
        assert_eq!(out.status.code(), Some(2), "{out:?}");
    }

    // The docs' setup with a role named idemhook, as its schema is: the
    // team's `events` table made by setup_sql and written by an action is
    // the team's, in public, not idemhook's.
    let secret = "whsec_first_hour";
    let config = ServerConfig::new()
        .set(
            "database",
            &toml_str(&format!(
                "postgres://idemhook:{PASSWORD}@127.0.0.1:{port}/app"
            )),
        )
        .set(
            "setup_sql",
            &toml_str("CREATE TABLE IF NOT EXISTS events (event_id text PRIMARY KEY)"),
        )
        .tables(&format!(
            "{SOURCE}[[sources.stripe.actions]]\nname = \"book\"\n\
             sql = \"INSERT INTO events (event_id) VALUES (:event_id)\"\n"
        ));
    let server = Server::start(&config, &[]);
    let body = serde_json::json!({"id": "evt_fh_1", "type": "charge.succeeded"})
        .to_string()
        .into_bytes();
    let r = server.post(
        "/hooks/stripe",
        &crate::sign::stripe_now(secret, &body),
        &body,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let mut app = postgres::Client::connect(&local.cluster().url("app"), postgres::NoTls)
        .expect("connect to app");
    let count =
        |c: &mut postgres::Client, sql: &str| -> i64 { c.query_one(sql, &[]).expect(sql).get(0) };
    assert_eq!(count(&mut app, "SELECT count(*) FROM public.events"), 1);
    assert_eq!(
        count(
            &mut app,
            "SELECT count(*) FROM idemhook.jobs WHERE action = 'book' AND status = 'done'"
        ),
        1
    );
    drop(server);

    // A database another role owns, with GRANT ALL ON DATABASE: idemhook
    // makes its own schema there, but since PostgreSQL 15 the team's
    // tables in `public` need a grant, and the error names it.
    admin
        .batch_execute("CREATE DATABASE shared")
        .expect("create shared");
    admin
        .batch_execute("GRANT ALL ON DATABASE shared TO idemhook")
        .expect("grant");
    let shared = format!("postgres://idemhook:{PASSWORD}@127.0.0.1:{port}/shared");
    write_config(dir.path(), &shared);
    let ok = run(dir.path(), &[], &["check"]);
    assert!(
        ok.success(),
        "its own schema needs only CREATE on the database: {ok:?}"
    );
    std::fs::write(
        dir.path().join("idemhook.toml"),
        format!(
            "database = {}\nsetup_sql = \"CREATE TABLE IF NOT EXISTS orders (id text)\"\n{SOURCE}",
            toml_str(&shared)
        ),
    )
    .expect("write config");
    let out = run(dir.path(), &[], &["check"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        out.stderr.contains("42501") && out.stderr.contains("GRANT USAGE, CREATE ON SCHEMA public"),
        "{}",
        out.stderr
    );

    // A wrong password says so, without printing it.
    write_config(
        dir.path(),
        &format!("postgres://idemhook:wrong-{PASSWORD}@127.0.0.1:{port}/app"),
    );
    let out = run(dir.path(), &[], &["check"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        out.stderr.contains("password authentication failed"),
        "{}",
        out.stderr
    );
    assert!(!out.stderr.contains(PASSWORD), "{}", out.stderr);

    // A server without TLS, asked for it: the cause is TLS.
    write_config(
        dir.path(),
        &format!("postgres://idemhook:{PASSWORD}@127.0.0.1:{port}/app?sslmode=require"),
    );
    let out = run(dir.path(), &[], &["check"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(out.stderr.contains("TLS"), "{}", out.stderr);
    assert!(!out.stderr.contains(PASSWORD), "{}", out.stderr);

    // A refused port and an unknown host name their cause.
    for (url, cause) in [
        ("postgres://idemhook@127.0.0.1:1/app", "refused"),
        ("postgres://idemhook@no-such-host.invalid/app", "lookup"),
    ] {
        write_config(dir.path(), url);
        let out = run(dir.path(), &[], &["check"]);
        assert_eq!(out.status.code(), Some(2), "{out:?}");
        assert!(out.stderr.contains(cause), "{url}: {}", out.stderr);
    }
}

/// The lines a new user reads at start and stop, alike on both backends.
fn start_and_stop_lines_match(backend: Backend) {
    let config = ServerConfig::new()
        .set("admin_token", &toml_str("env:IDEMHOOK_ADMIN_TOKEN"))
        .tables(SOURCE);
    let mut server = Server::start_on(backend, &config, &[]);
    wait_until(Duration::from_secs(10), "the start-up lines", || {
        let logs = server.logs();
        logs.contains("NEW DATABASE created") && logs.contains("admin API off")
    });
    server.terminate();
    server.wait_exit(Duration::from_secs(60));
    wait_until(Duration::from_secs(10), "the stopped line", || {
        server.logs().contains("INFO stopped")
    });
    let logs = server.logs();
    for field in [
        "requests_grace=",
        "forward_in_flight=",
        "forward_timeout_max=",
    ] {
        assert!(logs.contains(field), "{field}: {logs}");
    }

    // Started again with the token: the inspector's address, and no notice
    // of a new database.
    server.set_env(
        "IDEMHOOK_ADMIN_TOKEN",
        "first-hour-token-0123456789-0123456789abcdef0123456789abcdef",
    );
    server.restart();
    wait_until(Duration::from_secs(30), "the inspector line", || {
        server.stdout().contains("idemhook inspector on")
    });
    let logs = server.logs();
    assert_eq!(logs.matches("NEW DATABASE created").count(), 1, "{logs}");
}

both_backends!(start_and_stop_lines_match);
