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
