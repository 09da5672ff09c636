//! `idemhook check`'s report: the settings, each source with its rules and
//! actions, and the warnings about key and hash rules that differ from
//! those recorded in the database. Reads the database, never writes it;
//! `cli` prints the report after `serve::trial` and before the
//! destinations' (`outbox::dest::report`).

use std::fmt::Write as _;

use crate::config::database_url::DatabaseUrl;
use crate::config::{ActionKind, Config, format_duration};
use crate::store;

/// What the configured database holds, for `check`: whether it exists,
/// its events, and the key and hash rules recorded per source.
#[derive(Debug, Default)]
struct DatabaseReport {
    /// One line after `database    PATH`.
    summary: String,
    /// (source, recorded key rule, recorded hash rule, events of the source).
    rules: Vec<(String, String, String, i64)>,
    /// (source, secret) handed over by a handshake (Asana, Notion).
    kept: Vec<(String, String)>,
}

fn database_report(config: &Config) -> DatabaseReport {
    let path = match &config.database {
        DatabaseUrl::Postgres(url) => return database_report_postgres(config, url),
        DatabaseUrl::Sqlite(path) => path,
    };
    if !path.exists() {
        return DatabaseReport {
            summary: "does not exist yet: serve will create it, empty (no event known, so none is a duplicate)".to_string(),
            ..DatabaseReport::default()
        };
    }
    let read = || -> Result<DatabaseReport, String> {
        let conn = store::sqlite::open_read(path, std::time::Duration::from_secs(5))
            .map_err(|e| e.to_string())?;
        let db = store::db::Db::sqlite(&conn);
        let Some((events, rules)) = store::rules::report(&db).map_err(|e| e.to_string())? else {
            return Ok(DatabaseReport {
                summary: "exists, but is not an idemhook database yet (no events table)"
                    .to_string(),
                ..DatabaseReport::default()
            });
        };
        let kept = store::meta::all_handed_over(&db).map_err(|e| e.to_string())?;
        Ok(DatabaseReport {
            summary: format!(
                "exists, {events} event{} stored",
                if events == 1 { "" } else { "s" }
            ),
            rules,
            kept,
        })
    };
    read().unwrap_or_else(|e| DatabaseReport {
        summary: format!("exists, but cannot be read: {e}"),
        ..DatabaseReport::default()
    })
}

/// [`database_report`] for PostgreSQL: read only, and nothing created
/// (`check` leaves the database as it was).
fn database_report_postgres(
    config: &Config,
    url: &crate::config::database_url::PostgresUrl,
) -> DatabaseReport {
    let read = || -> Result<DatabaseReport, String> {
        let settings = crate::store::postgres::Settings::from_url(
            url,
            config.durability,
            config.busy_timeout,
        )?;
        let mut client = settings.connect().map_err(|e| e.to_string())?;
        let reached = crate::store::postgres::maint::reached(&mut client)
            .map(|(host, port, read_only)| {
                format!(
                    "reached {host}{}, {}; ",
                    if port > 0 {
                        format!(":{port}")
                    } else {
                        String::new()
                    },
                    if read_only {
                        "read-only (a standby?): serve would answer 503 until a host accepts writes"
                    } else {
                        "accepts writes"
                    }
                )
            })
            .unwrap_or_default();
        let report = store::rules::report(&store::db::Db::postgres(&mut client))
            .map_err(|e| e.to_string())?;
        Ok(match report {
            None => DatabaseReport {
                summary: format!(
                    "{reached}no idemhook tables yet: serve will create them (no event known, so none is a duplicate)"
                ),
                ..DatabaseReport::default()
            },
            Some((events, rules)) => DatabaseReport {
                summary: format!(
                    "{reached}{events} event{} stored",
                    if events == 1 { "" } else { "s" }
                ),
                rules,
                kept: crate::store::meta::all_handed_over(&crate::store::db::Db::postgres(
                    &mut client,
                ))
                .map_err(|e| e.to_string())?,
            },
        })
    };
    read().unwrap_or_else(|e| DatabaseReport {
        summary: format!("cannot be read: {e}"),
        ..DatabaseReport::default()
    })
}

/// `check`'s report: the settings, then each source with its rules and
/// actions, then the warnings about key and hash rules that differ from
/// those recorded in the database.
pub fn describe(config: &Config) -> String {
    let mut out = String::new();
    let database = database_report(config);
    let mut warnings = Vec::new();
    describe_settings(&mut out, config, &database);
    for s in &config.sources {
        describe_source(&mut out, config, s, &database);
        warnings.extend(recorded_rule_warnings(s, &database));
    }
    describe_notify(&mut out, config);
    for w in warnings {
        let _ = writeln!(out, "\nwarning: {w}");
    }
    out
}

/// The `[[notify]]` targets, their URLs redacted (they hold secrets).
fn describe_notify(out: &mut String, config: &Config) {
    let n = &config.notify;
    if n.targets.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "\nnotify      coalesce {}{}",
        format_duration(n.coalesce),
        n.ui_url
            .as_ref()
            .map_or(String::new(), |u| format!(", links to {u}"))
    );
    for t in &n.targets {
        let on: Vec<&str> = t.on.iter().map(|c| c.as_str()).collect();
        let _ = writeln!(
            out,
            "  {}: {} on {}",
            t.name,
            t.kind.describe(),
            on.join(", ")
        );
    }
}

/// The lines before the sources: the config file, `listen`, the database
/// and what it holds, durability, the admin API, the workers.
fn describe_settings(out: &mut String, config: &Config, database: &DatabaseReport) {
    let origin = config.file.as_ref().map_or(
        "development default (no ./idemhook.toml; what `idemhook serve` runs here)".to_string(),
        |p| p.display().to_string(),
    );
    let _ = writeln!(out, "config {origin}: ok");
    let _ = writeln!(out, "listen      {}", config.listen);
    let _ = match &config.database {
        DatabaseUrl::Postgres(url) => {
            writeln!(out, "database    {url} (PostgreSQL): {}", database.summary)
        }
        DatabaseUrl::Sqlite(path) => {
            writeln!(out, "database    {} ({})", path.display(), database.summary)
        }
    };
    let _ = writeln!(
        out,
        "durability  {}",
        match config.durability {
            crate::config::Durability::Full => "full (fsync before every 2xx)",
            crate::config::Durability::Normal => "normal (survives a crash of the process only)",
        }
    );
    let admin = match (&config.admin_token, &config.admin_token_unset) {
        (Some(_), _) => "on (token set)".to_string(),
        (None, Some(name)) => format!("off (admin_token names {name}, which is not set)"),
        (None, None) => "off (no admin_token)".to_string(),
    };
    let _ = writeln!(out, "admin API   {admin}");
    let _ = writeln!(
        out,
        "workers     {} http, {} forward; max body {} bytes",
        config.http_workers, config.forward_workers, config.max_body_bytes
    );
}

/// One source's block: its route and verification, what its provider's
/// preset adds, a secret kept from a handshake, its key, type and hash
/// rules, secrets, retention, mismatch answer and actions.
fn describe_source(
    out: &mut String,
    config: &Config,
    s: &crate::config::Source,
    database: &DatabaseReport,
) {
    let _ = writeln!(
        out,
        "\nsource {} (kind {}) POST /hooks/{}",
        s.name, s.kind, s.name
    );
    let _ = writeln!(out, "  verify     {}", s.verifier.scheme().describe());
    if let Some(url) = &s.public_url {
        let _ = writeln!(
            out,
            "  url        {url} (public_url: what the provider signs)"
        );
    }
    describe_preset(out, config, s);
    describe_generic(out, config, s);
    if let Some((_, secret)) = database.kept.iter().find(|(name, _)| name == &s.name) {
        // The operator pastes Notion's token into Notion's form.
        let _ = match s.kind.name() {
            "notion" => writeln!(
                out,
                "  token      {secret} (Notion's verification_token, kept as this source's secret: paste it into Notion to verify the subscription)"
            ),
            _ => writeln!(out, "  secret     kept from the provider's handshake"),
        };
    }
    let _ = writeln!(out, "  key        {}", s.key);
    let _ = writeln!(out, "  type       {}", s.type_rule());
    let _ = writeln!(out, "  hash       {}", s.hash_rule());
    describe_secrets(out, s);
    let _ = writeln!(
        out,
        "  retention  keys {}, bodies {}",
        format_duration(s.retention),
        format_duration(s.payload_retention)
    );
    let _ = writeln!(
        out,
        "  mismatch   {}",
        match s.on_mismatch {
            crate::config::OnMismatch::Ack => "ack (200 + incident)",
            crate::config::OnMismatch::Reject => "reject (409 + incident)",
        }
    );
    for a in &s.actions {
        describe_action(out, a);
    }
}

/// What the source's provider preset adds: batches (where the events are,
/// how many a delivery) and a handshake.
fn describe_preset(out: &mut String, config: &Config, s: &crate::config::Source) {
    let Some(p) = s.kind.preset() else {
        return;
    };
    if let Some(b) = p.batch {
        let _ = writeln!(
            out,
            "  batch      events at {}{}, each claimed under its own key, at most {} a delivery",
            if b.items.is_empty() {
                "the body (an array)"
            } else {
                b.items
            },
            b.inner,
            config.max_batch_items
        );
    }
    if p.handshake != crate::config::presets::Handshake::None {
        let _ = writeln!(
            out,
            "  handshake  {}, answered and not stored",
            p.handshake.label()
        );
    }
}

/// A source's own batch (`batch`) and answer (`answer`), on any kind.
fn describe_generic(out: &mut String, config: &Config, s: &crate::config::Source) {
    use crate::config::generic::{Answer, EmptyBatch};
    if let Some(items) = &s.batch_items {
        let _ = writeln!(
            out,
            "  batch      events at {}, each claimed under its own key, at most {} a delivery; an empty batch: {}",
            if items.is_empty() {
                "the body (an array)"
            } else {
                items
            },
            config.max_batch_items,
            match s.empty_batch {
                EmptyBatch::Ack => "200, nothing stored",
                EmptyBatch::Reject => "400",
            }
        );
    }
    if s.answer == Answer::Empty {
        let _ = writeln!(out, "  answer     200 with no body");
    }
}

/// The `secrets` line: how many, and the tolerance when the scheme signs a
/// timestamp.
fn describe_secrets(out: &mut String, s: &crate::config::Source) {
    if s.kind == crate::config::Kind::None {
        let _ = writeln!(out, "  secrets    none (unsigned, allow_unsigned = true)");
    } else if s.kind.signs_timestamp() || s.verifier.scheme().signs_timestamp() {
        let _ = writeln!(
            out,
            "  secrets    {}; tolerance {}",
            s.secret_count,
            format_duration(s.tolerance)
        );
    } else {
        let _ = writeln!(out, "  secrets    {} (no signed timestamp)", s.secret_count);
    }
}

/// Warnings for a source whose key or hash rule differs from the one the
/// database recorded (printed after every source).
fn recorded_rule_warnings(s: &crate::config::Source, database: &DatabaseReport) -> Vec<String> {
    let mut warnings = Vec::new();
    let Some((_, key_rule, hash_rule, events)) =
        database.rules.iter().find(|(name, ..)| name == &s.name)
    else {
        return warnings;
    };
    if key_rule != &s.key.to_string() {
        warnings.push(format!(
            "source {}: the key rule differs from the one recorded in the database ({} -> {}; {events} events stored under the old one): redeliveries keyed by the new rule will not match them, so old events could be processed again",
            s.name, key_rule, s.key
        ));
    }
    if hash_rule != &s.hash_rule() {
        warnings.push(format!(
            "source {}: the hash rule differs from the one recorded in the database ({} -> {}): redeliveries of stored events will be reported as payload mismatches",
            s.name,
            hash_rule,
            s.hash_rule()
        ));
    }
    warnings
}

/// One action's lines: its kind, the types it runs on, and its SQL
/// parameters or its forward settings (check, after).
fn describe_action(out: &mut String, a: &crate::config::Action) {
    let types = if a.types.is_empty() {
        "all types".to_string()
    } else {
        a.types.join(", ")
    };
    match &a.kind {
        ActionKind::Sql { params, .. } => {
            let names: Vec<String> = params.iter().map(|(n, p)| format!(":{n}={p}")).collect();
            let _ = writeln!(
                out,
                "  action {} (sql) on {types}; {}",
                a.name,
                if names.is_empty() {
                    "built-in params only".to_string()
                } else {
                    format!("params {}", names.join(" "))
                }
            );
        }
        ActionKind::Forward(f) => {
            let _ = writeln!(
                out,
                "  action {} (forward) on {types} -> {}; timeout {}, lease {}, gives up after {}{}, retry {}..{}",
                a.name,
                f.url_redacted(),
                format_duration(f.timeout),
                format_duration(f.lease),
                format_duration(f.give_up_after),
                f.max_attempts
                    .map_or(String::new(), |n| format!(" or {n} attempts")),
                format_duration(f.retry_initial),
                format_duration(f.retry_max)
            );
            match &f.circuit {
                Some(c) => {
                    let _ = writeln!(
                        out,
                        "    circuit: opens after {} consecutive failures; probes {} from {}",
                        c.failures,
                        c.health
                            .as_ref()
                            .map_or("the oldest waiting job", |_| "a GET of health"),
                        format_duration(c.probe)
                    );
                }
                None => {
                    let _ = writeln!(out, "    circuit: none (circuit_failures = 0)");
                }
            }
            if let Some(check) = &f.check {
                let _ = writeln!(out, "    check before a resend: GET {check}");
            }
            if !f.after.is_empty() {
                let _ = writeln!(
                    out,
                    "    after: sent once {} of the same event are done",
                    f.after.join(", ")
                );
            }
            if let Some(line) = crate::config::dest::describe(&f.http) {
                let _ = writeln!(out, "    {line}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::config::Config;

    #[test]
    fn check_describes_only_what_applies_to_each_source() {
        let config = Config::parse(
            r#"
[sources.st]
kind = "stripe"
secrets = ["s"]
[[sources.st.actions]]
name = "plain"
sql = "SELECT :event_id"
[sources.gh]
kind = "github"
secrets = ["s", "t"]
[sources.open]
kind = "none"
allow_unsigned = true
key = ["header:X-Key"]
"#,
            "test.toml",
            Path::new("/tmp"),
            Some("test.toml".into()),
        )
        .expect("config");
        let text = super::describe(&config);
        assert!(text.contains("secrets    1; tolerance 5m\n"), "{text}");
        assert!(
            text.contains("secrets    2 (no signed timestamp)\n"),
            "{text}"
        );
        assert!(text.contains("secrets    none (unsigned"), "{text}");
        assert!(
            text.contains("on all types; built-in params only\n"),
            "{text}"
        );
    }
}
