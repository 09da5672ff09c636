//! The config's unit tests: files parsed, defaults, refusals and warnings.

use std::path::Path;
use std::time::Duration;

use super::warnings::looks_like_shell_variable;
use super::*;

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(
        text,
        "test.toml",
        Path::new("/tmp"),
        Some("test.toml".into()),
    )
}

#[test]
fn durations() {
    assert_eq!(parse_duration("300ms"), Ok(Duration::from_millis(300)));
    assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
    assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86_400)));
    assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5_400)));
    assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
    for bad in ["", "5", "m", "5x", "-1s", "1.5s", "99999999999999999d"] {
        assert!(parse_duration(bad).is_err(), "{bad:?} should be refused");
    }
    assert_eq!(format_duration(Duration::from_secs(3600)), "1h");
    assert_eq!(format_duration(Duration::from_millis(1500)), "1500ms");
}

#[test]
fn per_address_cap_and_minimum_rate() {
    let src = "[sources.a]\nkind = \"github\"\nsecrets = [\"s\"]\n";
    let c = parse(src).unwrap();
    assert_eq!(c.http.max_connections, 512);
    assert_eq!(c.http.max_connections_per_address, 128);
    assert_eq!(c.http.min_receive_rate, 1024);
    let c = parse(&format!("max_connections = 16\n{src}")).unwrap();
    assert_eq!(
        c.http.max_connections_per_address, 16,
        "never above the cap"
    );
    let c = parse(&format!(
        "max_connections_per_address = 4\nmin_receive_rate = 0\n{src}"
    ))
    .unwrap();
    assert_eq!(
        (c.http.max_connections_per_address, c.http.min_receive_rate),
        (4, 0)
    );
    for (bad, key) in [
        (
            "max_connections_per_address = 0",
            "max_connections_per_address",
        ),
        (
            "max_connections = 8\nmax_connections_per_address = 9",
            "max_connections_per_address",
        ),
        ("min_receive_rate = 2000000000", "min_receive_rate"),
    ] {
        let e = parse(&format!("{bad}\n{src}")).unwrap_err().to_string();
        assert!(e.contains(key), "{bad}: {e}");
    }
}

#[test]
fn unknown_keys_name_the_key_and_file() {
    let e = parse("listen = \"x\"\nlisten_port = 1\n")
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("test.toml:"), "{e}");
    assert!(e.contains("listen_port"), "{e}");
    let e = parse("[sources.a]\nkind = \"github\"\nsecrets = [\"s\"]\nsecret = \"x\"\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("secret"), "{e}");
}

#[test]
fn bad_values_name_the_key() {
    let cases = [
        (
            "durability = \"fast\"\n[sources.a]\nkind=\"github\"\nsecrets=[\"s\"]",
            "durability",
        ),
        (
            "[sources.a]\nkind = \"gitlub\"\nsecrets = [\"s\"]",
            "sources.a.kind",
        ),
        ("[sources.a]\nkind = \"github\"", "sources.a.secrets"),
        (
            "[sources.a]\nkind = \"github\"\nsecrets = [\"\"]",
            "sources.a.secrets[0]",
        ),
        ("[sources.a]\nkind = \"none\"", "sources.a.allow_unsigned"),
        (
            "[sources.a]\nkind = \"stripe\"\nsecrets = [\"s\"]\nallow_unsigned = true",
            "sources.a.allow_unsigned",
        ),
        (
            "[sources.a]\nkind = \"hmac\"\nsecrets=[\"s\"]\nkey=[\"json:/id\"]",
            "sources.a.header",
        ),
        (
            "[sources.a]\nkind = \"stripe\"\nsecrets=[\"s\"]\ntolerance=\"5\"",
            "sources.a.tolerance",
        ),
        (
            "[sources.a]\nkind = \"hmac\"\nsecrets=[\"s\"]\nkey=[\"json:/id\"]\nheader=\"X-Sig\"\nprefix=\" sha256=\"",
            "sources.a.prefix",
        ),
        (
            "[sources.a]\nkind = \"stripe\"\nsecrets=[\"s\"]\nkey=[\"id\"]",
            "sources.a.key",
        ),
        (
            "[sources.a]\nkind = \"stripe\"\nsecrets=[\"s\"]\n[[sources.a.actions]]\nname=\"f\"\nforward=\"http://x\"\ntimeout=\"10s\"\nlease=\"10s\"",
            "lease",
        ),
        (
            "[sources.a]\nkind = \"stripe\"\nsecrets=[\"env:IDEMHOOK_TEST_SURELY_UNSET\"]",
            "IDEMHOOK_TEST_SURELY_UNSET",
        ),
    ];
    for (text, want) in cases {
        let e = parse(text).unwrap_err().to_string();
        assert!(e.contains(want), "expected {want:?} in {e:?}");
    }
}

#[test]
fn full_example_resolves() {
    let text = r#"
listen = "127.0.0.1:9999"
database = "data/x.db"
durability = "normal"
[sources.stripe]
kind = "stripe"
secrets = ["whsec_a", "whsec_b"]
tolerance = "5m"
retention = "30d"
payload_retention = "7d"
[[sources.stripe.actions]]
name = "credit"
types = ["charge.succeeded"]
sql = "INSERT INTO ledger(c) VALUES (:customer)"
params = { customer = "json:/data/object/customer" }
[[sources.stripe.actions]]
name = "notify"
forward = "http://127.0.0.1:9000/x"
timeout = "2s"
lease = "5s"
"#;
    let c = parse(text).unwrap();
    assert_eq!(c.database.sqlite_path(), Some(Path::new("/tmp/data/x.db")));
    assert_eq!(c.durability, Durability::Normal);
    let s = c.source("stripe").unwrap();
    assert_eq!(s.key.to_string(), "json:/id");
    assert_eq!(s.retention, Duration::from_secs(30 * 86_400));
    assert_eq!(s.actions.len(), 2);
    assert!(s.actions[0].takes(Some("charge.succeeded")));
    assert!(!s.actions[0].takes(Some("charge.failed")));
    assert!(!s.actions[0].takes(None));
    assert!(s.actions[1].takes(None));
}

#[test]
fn file_secret_is_trimmed_and_relative() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("s.txt"), "sekrit\n").unwrap();
    let s = resolve_secret("file:s.txt", dir.path()).unwrap();
    assert_eq!(s.expose(), "sekrit");
}

#[test]
fn an_admin_token_from_an_unset_variable_turns_the_api_off() {
    let unset = "IDEMHOOK_TEST_SURELY_UNSET_TOKEN";
    let c = parse(&format!(
        "admin_token = \"env:{unset}\"\n[sources.a]\nkind = \"github\"\nsecrets = [\"s\"]\n"
    ))
    .expect("an unset admin token variable is not an error");
    assert!(c.admin_token.is_none());
    assert_eq!(c.admin_token_unset.as_deref(), Some(unset));
    // A source secret from an unset variable still is.
    assert!(
        parse(&format!(
            "[sources.a]\nkind = \"github\"\nsecrets = [\"env:{unset}\"]\n"
        ))
        .is_err()
    );
    // A literal token is on.
    let c = parse("admin_token = \"t0k3n-0123456789abcdef0123456789abcdef\"\n[sources.a]\nkind = \"github\"\nsecrets = [\"s\"]\n")
        .expect("config");
    assert!(c.admin_token.is_some() && c.admin_token_unset.is_none());
}

fn with_actions(actions: &str) -> Result<Config, ConfigError> {
    parse(&format!(
        "[sources.s]\nkind = \"stripe\"\nsecrets = [\"whsec_x\"]\n{actions}"
    ))
}

fn sql_action(name: &str) -> String {
    format!("[[sources.s.actions]]\nname = \"{name}\"\nsql = \"SELECT 1\"\n")
}

fn forward_action(name: &str, extra: &str) -> String {
    format!(
        "[[sources.s.actions]]\nname = \"{name}\"\nforward = \"http://127.0.0.1:9/x\"\n{extra}\n"
    )
}

#[test]
fn check_and_after_resolve_on_forward_actions() {
    let c = with_actions(&format!(
        "{}{}{}",
        sql_action("credit"),
        forward_action(
            "notify",
            "check = \"http://127.0.0.1:9/e/{idempotency_key}\"\nafter = [\"credit\"]"
        ),
        forward_action("audit", "after = [\"notify\", \"credit\"]"),
    ))
    .unwrap();
    let s = c.source("s").unwrap();
    let ActionKind::Forward(f) = &s.action("notify").unwrap().kind else {
        panic!("notify is a forward action");
    };
    assert_eq!(
        f.check.as_ref().map(|t| t.render("s", "e/1", "notify")),
        Some("http://127.0.0.1:9/e/s%3Ae%2F1%3Anotify".to_string())
    );
    assert_eq!(f.after, ["credit"]);
}

#[test]
fn bad_check_or_after_is_a_config_error_naming_the_key() {
    let cases = [
        (
            forward_action("f", "check = \"http://x/{key}\""),
            "actions[0] (f).check: unknown placeholder {key}",
        ),
        (
            forward_action("f", "check = \"x/{event_id}\""),
            "actions[0] (f).check: expected an http://",
        ),
        (
            forward_action(
                "f",
                "check = \"http://x/{event_id}\"\ntimeout = \"10s\"\nlease = \"15s\"",
            ),
            "actions[0] (f).lease: must be longer than twice the timeout when check is set",
        ),
        (
            format!(
                "{}{}",
                sql_action("credit"),
                "check = \"http://x/{event_id}\"\n"
            ),
            "actions[0] (credit).check: only forward actions take this key",
        ),
        (
            format!("{}{}", sql_action("credit"), "after = [\"credit\"]\n"),
            "actions[0] (credit).after: only forward actions take this key",
        ),
        (
            forward_action("f", "after = [\"nope\"]"),
            "actions[0] (f).after: no action \"nope\" in this source",
        ),
        (
            forward_action("f", "after = [\"f\"]"),
            "actions[0] (f).after: an action cannot wait for itself",
        ),
        (
            format!(
                "{}{}",
                sql_action("c"),
                forward_action("f", "after = [\"c\", \"c\"]")
            ),
            "actions[1] (f).after: \"c\" is named twice",
        ),
        (
            format!(
                "{}{}{}",
                forward_action("a", "after = [\"b\"]"),
                forward_action("b", "after = [\"c\"]"),
                forward_action("c", "after = [\"a\"]"),
            ),
            "after: a cycle, a -> b -> c -> a",
        ),
    ];
    for (actions, want) in cases {
        let e = with_actions(&actions).unwrap_err().to_string();
        assert!(e.contains(want), "expected {want:?} in {e:?}");
        assert!(e.contains("sources.s."), "{e}");
    }
    // An action of another source is not known here.
    let e = parse(&format!(
        "[sources.t]\nkind = \"stripe\"\nsecrets = [\"whsec_x\"]\n{}\n{}",
        "[[sources.t.actions]]\nname = \"credit\"\nsql = \"SELECT 1\"",
        "[sources.s]\nkind = \"stripe\"\nsecrets = [\"whsec_x\"]\n[[sources.s.actions]]\nname = \"f\"\nforward = \"http://x\"\nafter = [\"credit\"]"
    ))
    .unwrap_err()
    .to_string();
    assert!(e.contains("no action \"credit\" in this source"), "{e}");
}

#[test]
fn every_unset_variable_is_named_at_once() {
    let e = parse(
        "[sources.a]\nkind = \"github\"\nsecrets = [\"env:IDEMHOOK_TEST_UNSET_A\", \"env:IDEMHOOK_TEST_UNSET_B\"]\n\
         [[sources.a.actions]]\nname = \"f\"\nforward = \"http://x\"\nsign_secret = \"env:IDEMHOOK_TEST_UNSET_C\"\n\
         [sources.b]\nkind = \"stripe\"\nsecrets = [\"env:IDEMHOOK_TEST_UNSET_D\"]\n",
    )
    .unwrap_err()
    .to_string();
    for (name, key) in [
        ("IDEMHOOK_TEST_UNSET_A", "sources.a.secrets[0]"),
        ("IDEMHOOK_TEST_UNSET_B", "sources.a.secrets[1]"),
        (
            "IDEMHOOK_TEST_UNSET_C",
            "sources.a.actions[0] (f).sign_secret",
        ),
        ("IDEMHOOK_TEST_UNSET_D", "sources.b.secrets[0]"),
    ] {
        assert!(e.contains(&format!("{name} ({key})")), "{name} in {e}");
    }
    assert!(e.contains("environment variables not set"), "{e}");
}

#[test]
fn check_warns_about_shell_variables_and_short_retention() {
    let c = parse(
        "admin_token = \"${IDEMHOOK_ADMIN_TOKEN_FOR_THIS_HOST}\"\n[sources.a]\nkind = \"stripe\"\nsecrets = [\"$STRIPE_SECRET\", \"whsec_$x1\"]\nretention = \"1d\"\n\
         [sources.b]\nkind = \"shopify\"\nsecrets = [\"s\"]\nretention = \"7d\"\n",
    )
    .expect("warnings are no errors");
    let all = c.warnings.join("\n");
    assert!(
        all.contains("admin_token: the literal secret looks like a shell variable"),
        "{all}"
    );
    assert!(
        all.contains("sources.a.secrets[0]: the literal secret"),
        "{all}"
    );
    assert!(
        !all.contains("secrets[1]"),
        "only a whole $NAME is a variable: {all}"
    );
    assert!(
        !all.contains("STRIPE_SECRET"),
        "a warning never shows the value: {all}"
    );
    assert!(
        all.contains("sources.a.retention: 1d is shorter than stripe's retry horizon")
            && all.contains("processed again"),
        "{all}"
    );
    assert!(!all.contains("sources.b.retention"), "{all}");
    assert_eq!(c.warnings.len(), 3, "{all}");
    // Every kind's default retention covers its horizon.
    for kind in Kind::all() {
        if let Some((horizon, _)) = kind.retry_horizon() {
            assert!(kind.default_retention() >= horizon, "{kind}");
        }
    }
    assert!(looks_like_shell_variable("$A_1"));
    assert!(looks_like_shell_variable("${A_1}"));
    assert!(!looks_like_shell_variable("$1abc"));
    assert!(!looks_like_shell_variable("${A"));
    assert!(!looks_like_shell_variable("$"));
}

#[test]
fn dev_default_is_valid() {
    let c = Config::dev_default();
    assert_eq!(c.listen, "127.0.0.1:8080");
    assert_eq!(c.sources[0].name, "demo");
    assert_eq!(c.sources[0].kind.name(), "standard");
}

#[test]
fn database_names_its_backend_once() {
    let src = "[sources.a]\nkind = \"github\"\nsecrets = [\"s\"]\n";
    let c = parse(&format!("database = \"sqlite:data/x.db\"\n{src}")).unwrap();
    assert_eq!(c.database.sqlite_path(), Some(Path::new("/tmp/data/x.db")));

    // env:NAME, with a variable every test process has (setting one
    // would need unsafe code, which the crate forbids).
    if let Ok(home) = std::env::var("HOME") {
        let c = parse(&format!("database = \"env:HOME\"\n{src}")).unwrap();
        assert_eq!(
            c.database.sqlite_path(),
            Some(Path::new("/tmp").join(home).as_path())
        );
    }

    let e = parse(&format!(
        "database = \"env:IDEMHOOK_TEST_DATABASE_UNSET\"\n{src}"
    ))
    .unwrap_err()
    .to_string();
    assert!(e.contains("IDEMHOOK_TEST_DATABASE_UNSET (database)"), "{e}");

    let e = parse(&format!("database = \"mysql://root:hunter2@h/db\"\n{src}"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("database: unknown scheme \"mysql\""), "{e}");
    assert!(!e.contains("hunter2"), "{e}");

    let c = parse(&format!(
        "database = \"postgres://idemhook:hunter2@db/app?sslmode=require\"\n{src}"
    ))
    .unwrap();
    let crate::config::database_url::DatabaseUrl::Postgres(url) = &c.database else {
        panic!("not PostgreSQL: {:?}", c.database);
    };
    assert_eq!(
        url.expose(),
        "postgres://idemhook:hunter2@db/app?sslmode=require"
    );
    assert!(
        !format!("{c:?}").contains("hunter2"),
        "the config's Debug shows no password"
    );
}

#[test]
fn provider_kinds_name_the_key_a_config_is_missing_or_has_wrong() {
    let cases = [
        (
            "[sources.a]\nkind = \"twilio\"\nsecrets = [\"t\"]",
            "sources.a.public_url: kind \"twilio\" signs the URL it calls",
        ),
        (
            "[sources.a]\nkind = \"razorpay\"\nsecrets = [\"t\"]\npublic_url = \"https://x/\"",
            "sources.a.public_url: kind \"razorpay\" does not sign the URL",
        ),
        (
            "[sources.a]\nkind = \"square\"\nsecrets = [\"t\"]\npublic_url = \"ftp://x/\"",
            "sources.a.public_url: \"ftp://x/\" is not an http:// or https:// URL",
        ),
        (
            "[sources.a]\nkind = \"meta\"\nsecrets = [\"t\"]",
            "sources.a.verify_token: kind \"meta\" needs the token",
        ),
        (
            "[sources.a]\nkind = \"stripe\"\nsecrets = [\"t\"]\nverify_token = \"x\"",
            "sources.a.verify_token: only sources of kind \"meta\"",
        ),
        (
            "[sources.a]\nkind = \"discord\"\nsecrets = [\"abcd\"]",
            "sources.a.secrets: secret 0: the public key is not 64 hex digits",
        ),
        (
            "[sources.a]\nkind = \"sendgrid\"\nsecrets = [\"bm90IGEga2V5\"]",
            "sources.a.secrets: secret 0: not a P-256 public key",
        ),
        (
            "[sources.a]\nkind = \"adyen\"\nsecrets = [\"not hex\"]",
            "sources.a.secrets: secret 0: the adyen HMAC key is written in hex",
        ),
        (
            "[sources.a]\nkind = \"gitlab\"\n",
            "sources.a.secrets: at least one secret is needed",
        ),
        (
            "[sources.a]\nkind = \"hmac\"\nsecrets = [\"s\"]\nheader = \"X-Sig\"\nkey = [\"json:/id\"]\ntemplate = \"{timestamp}.{body}\"",
            "sources.a.timestamp_header: the template signs {timestamp}",
        ),
        (
            "[sources.a]\nkind = \"hmac\"\nsecrets = [\"s\"]\nheader = \"X-Sig\"\nkey = [\"json:/id\"]\ntemplate = \"{nonce}.{body}\"",
            "sources.a.template: unknown placeholder {nonce}",
        ),
        (
            "[sources.a]\nkind = \"hmac\"\nsecrets = [\"s\"]\nheader = \"X-Sig\"\nkey = [\"json:/id\"]\ntemplate = \"{timestamp}\"\ntimestamp_header = \"X-Ts\"",
            "sources.a.template: \"{timestamp}\" does not sign {body}",
        ),
        (
            "[sources.a]\nkind = \"hmac\"\nsecrets = [\"s\"]\nheader = \"X-Sig\"\nkey = [\"json:/id\"]\ntemplate = \"{url}{body}\"",
            "sources.a.public_url: kind \"hmac\" signs the URL it calls",
        ),
        (
            "[sources.a]\nkind = \"stripe\"\nsecrets = [\"s\"]\ntemplate = \"{body}\"",
            "sources.a.template: only sources of kind \"hmac\" take this key",
        ),
        (
            "max_batch_items = 0\n[sources.a]\nkind = \"stripe\"\nsecrets = [\"s\"]",
            "max_batch_items: must be 1 to 100000",
        ),
        (
            "[sources.a]\nkind = \"stripe\"\nsecrets = [\"s\"]\nkey = [\"form:\"]",
            "sources.a.key: \"form:\": a form field needs a name",
        ),
    ];
    for (text, want) in cases {
        let e = parse(text).unwrap_err().to_string();
        assert!(e.contains(want), "expected {want:?} in {e:?}");
    }
}

#[test]
fn provider_kinds_take_their_presets_and_overrides_win() {
    let c = parse(
        "[sources.a]\nkind = \"gocardless\"\nsecrets = [\"s\"]\n\
         [sources.b]\nkind = \"svix\"\nsecrets = [\"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"]\n\
         [sources.c]\nkind = \"hubspot\"\nsecrets = [\"s\"]\npublic_url = \"https://h/x\"\nhash = [\"json:/eventId\"]\n\
         [sources.d]\nkind = \"workos\"\nsecrets = [\"s\"]\n\
         [sources.e]\nkind = \"asana\"\n",
    )
    .unwrap();
    let a = &c.sources[0];
    assert_eq!(a.retention, Duration::from_secs(14 * 86_400));
    assert_eq!(
        a.event_type.as_ref().unwrap().to_string(),
        "json:/resource_type"
    );
    assert_eq!(a.event_type_more.len(), 1);
    assert!(a.batch().is_some());
    assert_eq!(
        c.sources[1].kind.name(),
        "standard",
        "svix is a name for standard"
    );
    let hubspot = &c.sources[2];
    assert!(
        hubspot.hash_without.is_empty(),
        "a source's hash overrides the preset"
    );
    assert_eq!(hubspot.key.parts.len(), 4);
    assert_eq!(c.sources[3].tolerance, Duration::from_secs(180));
    assert_eq!(
        c.sources[4].secret_count, 0,
        "asana's secret may come from its handshake"
    );
    assert_eq!(c.max_batch_items, 1000);
    let hmac = parse(
        "[sources.a]\nkind = \"hmac\"\nsecrets = [\"s\"]\nheader = \"X-Sig\"\nkey = [\"json:/id\"]\n\
         template = \"{timestamp}:{body}\"\ntimestamp_header = \"X-Ts\"\ntimestamp_format = \"unix_ms\"\ntolerance = \"2m\"",
    )
    .unwrap();
    let verifier = &hmac.sources[0].verifier;
    assert_eq!(
        verifier.scheme().describe(),
        "X-Sig: hex HMAC-SHA256 of timestamp + \":\" + body; timestamp (unix ms) within tolerance"
    );
    let now = 1_764_460_800;
    let signed = verifier
        .sign_request(
            &crate::verify::Request::post(&[], b"{\"id\":1}"),
            now,
            "",
            None,
        )
        .unwrap();
    assert_eq!(signed[0], ("X-Ts".to_string(), "1764460800000".to_string()));
    let rq = crate::verify::Request::post(&signed, b"{\"id\":1}");
    assert!(verifier.verify_request(&rq, now + 60).is_ok());
    assert!(matches!(
        verifier.verify_request(&rq, now + 121),
        Err(crate::verify::VerifyError::TimestampTooOld { age_secs: 121 })
    ));
    let tampered = crate::verify::Request::post(&signed, b"{\"id\":2}");
    assert!(verifier.verify_request(&tampered, now).is_err());
}

/// The hand-made `hmac` configs docs/configuration.md shows parse, and
/// what each signs verifies (and a changed body does not).
#[test]
fn the_documented_hmac_template_configs_work() {
    let doc = include_str!("../../docs/configuration.md");
    let section = doc
        .split("### Kind `hmac` with a template")
        .nth(1)
        .expect("the section exists");
    let section = section.split("\n## ").next().unwrap_or(section);
    // (The providers configured by hand have a test of their own.)
    let section = section.split("\n### ").next().unwrap_or(section);
    let blocks: Vec<&str> = section
        .split("```toml")
        .skip(1)
        .filter_map(|b| b.split("```").next())
        .collect();
    assert_eq!(blocks.len(), 3, "three hand-made configs");
    for block in blocks {
        let mut text = block.to_string();
        for prefix in ["\"file:", "\"env:"] {
            while let Some(start) = text.find(prefix) {
                let end = text[start + 1..]
                    .find('"')
                    .map_or(text.len(), |e| start + e + 2);
                text.replace_range(start..end, "\"doc-secret\"");
            }
        }
        let c = parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let verifier = &c.sources[0].verifier;
        let body = br#"{"id":"evt_1","type":"t"}"#;
        let now = 1_764_460_800;
        let rq = crate::verify::Request::post(&[], body);
        let signed = verifier.sign_request(&rq, now, "", None).unwrap();
        let good = crate::verify::Request::post(&signed, body);
        assert!(verifier.verify_request(&good, now).is_ok(), "{text}");
        let bad = crate::verify::Request::post(&signed, br#"{"id":"evt_2","type":"t"}"#);
        assert!(verifier.verify_request(&bad, now).is_err(), "{text}");
    }
}

#[test]
fn an_sql_action_that_would_end_the_claims_transaction_is_refused() {
    let with = |sql: &str| {
        parse(&format!(
            "[sources.a]\nkind = \"stripe\"\nsecrets = [\"s\"]\n[[sources.a.actions]]\nname = \"x\"\nsql = {}\n",
            toml::Value::String(sql.to_string())
        ))
    };
    for sql in [
        "COMMIT",
        "insert into t values (1); commit;",
        "BEGIN; INSERT INTO t VALUES (1)",
        "  rollback",
        "INSERT INTO t VALUES (1);\n-- a note\nEND",
        "SAVEPOINT s",
        "PREPARE TRANSACTION 'x'",
        "start transaction",
    ] {
        let e = with(sql).unwrap_err().to_string();
        assert!(
            e.contains("sources.a.actions[0] (x).sql:") && e.contains("would end"),
            "{sql}: {e}"
        );
    }
    for sql in [
        "INSERT INTO t (note) VALUES ('commit; rollback')",
        "INSERT INTO \"commit\" VALUES (1)",
        "UPDATE t SET begin_at = 1 -- then commit",
        "/* begin */ INSERT INTO t VALUES ($$COMMIT$$)",
        "INSERT INTO t SELECT 1 WHERE EXISTS (SELECT 1)",
        "PREPARE p AS SELECT 1",
    ] {
        assert!(with(sql).is_ok(), "{sql}");
    }
}

#[test]
fn give_up_after_and_the_circuit_default_and_bad_values_name_the_key() {
    let c = with_actions(&forward_action("f", "")).unwrap();
    let ActionKind::Forward(f) = &c.source("s").unwrap().action("f").unwrap().kind else {
        panic!("f is a forward action");
    };
    assert_eq!(f.give_up_after, Duration::from_secs(72 * 3600));
    assert_eq!(f.max_attempts, None, "no attempt cap by default");
    let circuit = f.circuit.as_ref().expect("a circuit by default");
    assert_eq!(circuit.failures, 5);
    assert_eq!(circuit.probe, Duration::from_secs(30));
    assert_eq!(circuit.health, None);

    let c = with_actions(&forward_action(
        "f",
        "circuit_failures = 0\nmax_attempts = 12\ngive_up_after = \"2h\"",
    ))
    .unwrap();
    let ActionKind::Forward(f) = &c.source("s").unwrap().action("f").unwrap().kind else {
        panic!("f is a forward action");
    };
    assert!(f.circuit.is_none(), "0 turns the circuit off");
    assert_eq!(f.max_attempts, Some(12));
    assert_eq!(f.give_up_after, Duration::from_secs(7200));

    let cases = [
        (
            forward_action("f", "give_up_after = \"30s\""),
            "actions[0] (f).give_up_after: must not be shorter than lease",
        ),
        (
            forward_action("f", "circuit_failures = -1"),
            "actions[0] (f).circuit_failures: consecutive failed attempts",
        ),
        (
            forward_action("f", "health = \"ftp://x/healthz\""),
            "actions[0] (f).health: expected an http:// or https:// URL",
        ),
        (
            forward_action("f", "circuit_probe = \"0s\""),
            "actions[0] (f).circuit_probe: must be longer than 0s",
        ),
        (
            format!("{}{}", sql_action("c"), "give_up_after = \"1h\"\n"),
            "actions[0] (c).give_up_after: only forward actions take this key",
        ),
    ];
    for (actions, want) in cases {
        let e = with_actions(&actions).unwrap_err().to_string();
        assert!(e.contains(want), "expected {want:?} in {e:?}");
    }
}
