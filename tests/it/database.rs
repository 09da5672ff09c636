//! The `database` setting through the binary: which backend it names is
//! decided once, `env:NAME` reads it from the environment, other schemes
//! are refused by name, and a PostgreSQL URL's password never shows.

use std::collections::BTreeMap;
use std::path::Path;

use crate::harness::{CLI_TIMEOUT, CliOutput, ServerConfig, run_binary, toml_str};

const SOURCE: &str = "[sources.gh]\nkind = \"github\"\nsecrets = [\"s3cret-for-tests\"]\n";

fn check_with(dir: &Path, database: &str, env: &[(&str, &str)]) -> CliOutput {
    let path = dir.join("idemhook.toml");
    std::fs::write(
        &path,
        ServerConfig::new()
            .set("database", &toml_str(database))
            .tables(SOURCE)
            .render(),
    )
    .expect("write config");
    let env: BTreeMap<String, String> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let args = vec![
        "check".to_string(),
        "--config".to_string(),
        path.display().to_string(),
    ];
    run_binary(dir, &env, &args, CLI_TIMEOUT)
}

fn show(out: &CliOutput) -> String {
    format!(
        "exit {:?}\n----- stdout -----\n{}\n----- stderr -----\n{}",
        out.status.code(),
        out.stdout,
        out.stderr
    )
}

#[test]
fn database_from_the_environment_and_with_the_sqlite_prefix() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("from-env.db");
    let out = check_with(
        dir.path(),
        "env:IDEMHOOK_IT_DATABASE",
        &[(
            "IDEMHOOK_IT_DATABASE",
            &format!("sqlite:{}", file.display()),
        )],
    );
    assert!(
        out.success() && out.stdout.contains(&file.display().to_string()),
        "expected: check passes and names {}\n{}",
        file.display(),
        show(&out)
    );

    let out = check_with(dir.path(), "env:IDEMHOOK_IT_DATABASE_UNSET", &[]);
    assert!(
        out.status.code() == Some(2)
            && out.stderr.contains("IDEMHOOK_IT_DATABASE_UNSET (database)"),
        "expected: exit 2 naming the unset variable and the key\n{}",
        show(&out)
    );
}

#[test]
fn other_schemes_are_refused_and_passwords_never_show() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = check_with(dir.path(), "mysql://root:hunter2@db/app", &[]);
    assert!(
        out.status.code() == Some(2)
            && out.stderr.contains("database: unknown scheme \"mysql\"")
            && !out.stderr.contains("hunter2")
            && !out.stdout.contains("hunter2"),
        "expected: exit 2 naming database and the scheme, no password\n{}",
        show(&out)
    );
    // A PostgreSQL URL is accepted; `check` connects (refused here) and
    // the error shows the URL with its password redacted.
    for url in [
        "postgres://idemhook:hunter2@127.0.0.1:1/app",
        "postgresql://idemhook@127.0.0.1:1/app?password=hunter2",
    ] {
        let out = check_with(dir.path(), url, &[]);
        assert!(
            out.status.code() == Some(2)
                && out.stderr.contains("[REDACTED]")
                && !out.stderr.contains("hunter2")
                && !out.stdout.contains("hunter2"),
            "expected: exit 2, the URL shown with [REDACTED], no password\n{}",
            show(&out)
        );
    }
    // The same URL from the environment: still no password.
    let out = check_with(
        dir.path(),
        "env:IDEMHOOK_IT_DATABASE_URL",
        &[("IDEMHOOK_IT_DATABASE_URL", "postgres://u:hunter2@h/d")],
    );
    assert!(
        out.status.code() == Some(2) && !out.stderr.contains("hunter2"),
        "expected: exit 2 without the password\n{}",
        show(&out)
    );
}

/// `database = "env:NAME"` naming a PostgreSQL URL: serve runs on that
/// database (the event lands there, not in a SQLite file beside the
/// config), and the URL is shown without its password.
#[test]
fn serve_on_a_postgres_url_read_from_the_environment() {
    if !crate::backend::Backend::Postgres
        .available("serve_on_a_postgres_url_read_from_the_environment")
    {
        return;
    }
    let url = crate::backend::fresh_database();
    // The throwaway cluster trusts local connections, so a password in
    // its URL is carried but not needed: it must not show anywhere.
    let local = crate::pg_cluster::cluster().is_some_and(|c| c.data_dir.is_some());
    let url = if local {
        url.replacen(
            "postgresql://postgres@",
            "postgresql://postgres:hunter2@",
            1,
        )
    } else {
        url
    };
    let config = ServerConfig::new()
        .set("database", &toml_str("env:IDEMHOOK_IT_DATABASE_URL"))
        .tables("[sources.gh]\nkind = \"github\"\nsecrets = [\"env:GH_SECRET\"]\n");
    let server = crate::harness::Server::start(
        &config,
        &[
            ("IDEMHOOK_IT_DATABASE_URL", url.as_str()),
            ("GH_SECRET", "s3cret-for-tests"),
        ],
    );
    let body = br#"{"action":"opened"}"#;
    let r = server.post(
        "/hooks/gh",
        &crate::sign::github("s3cret-for-tests", body, "delivery-env-1", "push"),
        body,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let mut db = crate::backend::Db::postgres(&url);
    assert_eq!(
        db.count(
            "SELECT count(*) FROM events WHERE source = ?1 AND event_id = ?2",
            &[&"gh", &"delivery-env-1"]
        ),
        1,
        "the event is in the PostgreSQL database"
    );
    assert!(
        !server.dir().join("idemhook.db").exists(),
        "no SQLite file beside the config"
    );
    let checked = server.run_cli(&["check"]);
    assert!(checked.success(), "{}", checked.stderr);
    if local {
        assert!(
            checked.stdout.contains("[REDACTED]"),
            "check shows the URL with its password redacted\n{}",
            checked.stdout
        );
    }
    for (what, text) in [
        ("serve's output", server.logs()),
        (
            "check's output",
            format!("{}{}", checked.stdout, checked.stderr),
        ),
    ] {
        assert!(
            !text.contains("hunter2"),
            "the password reached {what}\n{text}"
        );
    }
}
