//! Reading the file: `Config::load` and `Config::parse`, which deserialize
//! the TOML (`raw.rs`) and resolve it into a [`Config`] once.

use std::path::{Path, PathBuf};

use super::database_url::{DEFAULT_SCHEMA, DatabaseUrl, valid_schema};
use super::raw::RawConfig;
use super::source::resolve_source;
use super::values::{nonzero, opt_duration, resolve_secret};
use super::warnings::{retention_warning, shell_variable_warnings, unset_variables};
use super::{Config, ConfigError, DEV_DEFAULT_SECRET, Durability, HttpLimits, TlsFiles};
use crate::verify::Secret;

impl Config {
    /// Reads and resolves the file at `path`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let origin = path.display().to_string();
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::new(&origin, format!("cannot read: {e}")))?;
        let base = path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."));
        Config::parse(&text, &origin, &base, Some(path.to_path_buf()))
    }

    /// The documented development default: database ./idemhook.db, listen
    /// 127.0.0.1:8080, one source `demo` of kind standard.
    pub fn dev_default() -> Config {
        let text =
            format!("[sources.demo]\nkind = \"standard\"\nsecrets = [\"{DEV_DEFAULT_SECRET}\"]\n");
        match Config::parse(&text, "development default", Path::new("."), None) {
            Ok(config) => config,
            // The text above is a constant; a failure here is a bug in this file.
            Err(e) => panic!("the development default config is invalid: {e}"),
        }
    }

    /// Parses and resolves config text. `base` anchors relative paths.
    pub fn parse(
        text: &str,
        origin: &str,
        base: &Path,
        file: Option<PathBuf>,
    ) -> Result<Config, ConfigError> {
        let raw: RawConfig = toml::from_str(text)
            .map_err(|e| ConfigError::new(origin, super::toml_error::describe(text, e)))?;
        let err = |msg: String| ConfigError::new(origin, msg);
        no_unset_variables(&raw).map_err(err)?;
        let mut warnings = shell_variable_warnings(&raw);
        warnings.extend(super::warnings::loose_secret_files(&raw, base));

        let durability = durability_of(&raw).map_err(err)?;
        let (admin_token, admin_token_unset) = admin_token_of(&raw, base).map_err(err)?;
        let (max_body_bytes, http_workers, forward_workers) = sizes_of(&raw).map_err(err)?;
        let prune_interval =
            opt_duration(&raw.prune_interval, "prune_interval", "1h").map_err(err)?;
        let busy_timeout = opt_duration(&raw.busy_timeout, "busy_timeout", "5s").map_err(err)?;
        let sql_timeout = opt_duration(&raw.sql_timeout, "sql_timeout", "5s").map_err(err)?;
        if sql_timeout.is_zero() {
            return Err(err("sql_timeout: must be longer than 0s".into()));
        }
        let database = resolve_database(raw.database.as_deref(), base).map_err(err)?;
        let pg_schema = raw
            .pg_schema
            .clone()
            .unwrap_or_else(|| DEFAULT_SCHEMA.to_string());
        valid_schema(&pg_schema).map_err(err)?;
        let database = with_schema(database, &pg_schema);
        let tls = tls_of(&raw, base).map_err(err)?;
        let http = http_limits_of(&raw).map_err(err)?;
        let public_origin = raw
            .public_origin
            .as_deref()
            .map(super::public_origin::PublicOrigin::parse)
            .transpose()
            .map_err(err)?;
        let max_batch_items = raw.max_batch_items.unwrap_or(1000);
        if !(1..=100_000).contains(&max_batch_items) {
            return Err(err(format!(
                "max_batch_items: must be 1 to 100000, got {max_batch_items}"
            )));
        }

        if raw.sources.is_empty() && file.is_some() {
            return Err(err(
                "no [sources.NAME] table: at least one source is needed".into(),
            ));
        }
        let notify = super::notify::notify_of(&raw, base).map_err(err)?;
        let mut sources = Vec::new();
        for (name, rs) in raw.sources {
            let source =
                resolve_source(&name, rs, base).map_err(|m| err(format!("sources.{name}.{m}")))?;
            warnings.extend(retention_warning(&source));
            sources.push(source);
        }

        Ok(Config {
            file,
            listen: raw.listen.unwrap_or_else(|| "127.0.0.1:8080".to_string()),
            database,
            durability,
            admin_token,
            admin_token_unset,
            max_body_bytes,
            http_workers,
            forward_workers,
            prune_interval,
            busy_timeout,
            sql_timeout,
            pg_schema,
            setup_sql: raw.setup_sql,
            tls,
            admin_listen: raw.admin_listen,
            http,
            max_batch_items,
            sources,
            public_origin,
            warnings,
            notify,
        })
    }
}

/// `durability`: full (the default) or normal.
fn durability_of(raw: &RawConfig) -> Result<Durability, String> {
    match raw.durability.as_deref().unwrap_or("full") {
        "full" => Ok(Durability::Full),
        "normal" => Ok(Durability::Normal),
        other => Err(format!(
            "durability: expected \"full\" or \"normal\", got {other:?}"
        )),
    }
}

/// `max_body_bytes`, `http_workers` and `forward_workers`, each checked
/// against its bounds, in that order.
fn sizes_of(raw: &RawConfig) -> Result<(usize, usize, usize), String> {
    let max_body_bytes = raw.max_body_bytes.unwrap_or(1_048_576);
    if max_body_bytes == 0 || max_body_bytes > 64 * 1024 * 1024 {
        return Err(format!(
            "max_body_bytes: must be between 1 and 67108864, got {max_body_bytes}"
        ));
    }
    let http_workers = raw.http_workers.unwrap_or(8);
    if !(1..=256).contains(&http_workers) {
        return Err(format!(
            "http_workers: must be 1 to 256, got {http_workers}"
        ));
    }
    let forward_workers = raw.forward_workers.unwrap_or(4);
    if forward_workers > 256 {
        return Err(format!(
            "forward_workers: must be 0 to 256, got {forward_workers}"
        ));
    }
    Ok((max_body_bytes as usize, http_workers, forward_workers))
}

/// `tls_cert` and `tls_key`, relative to `base`: both or neither.
fn tls_of(raw: &RawConfig, base: &Path) -> Result<Option<TlsFiles>, String> {
    match (&raw.tls_cert, &raw.tls_key) {
        (Some(cert), Some(key)) => Ok(Some(TlsFiles {
            cert: base.join(cert),
            key: base.join(key),
        })),
        (None, None) => Ok(None),
        _ => Err("tls_cert and tls_key: set both or neither".into()),
    }
}

impl Config {
    /// `serve --database VALUE`: the value is read exactly as the
    /// `database` key is (a path, `sqlite:PATH`, `postgres://`, `env:NAME`),
    /// a relative path taken from the current folder. The error names the
    /// flag and never holds a password.
    pub fn set_database(&mut self, spec: &str) -> Result<(), String> {
        self.database = with_schema(
            resolve_database(Some(spec), Path::new(""))
                .map_err(|e| format!("--database{}", e.trim_start_matches("database")))?,
            &self.pg_schema,
        );
        Ok(())
    }
}

/// The `database` value: a path, `sqlite:PATH`, or a PostgreSQL URL,
/// directly or through `env:NAME` (an unset variable is reported with the
/// others before this runs). The backend is decided here, once.
fn resolve_database(spec: Option<&str>, base: &Path) -> Result<DatabaseUrl, String> {
    let spec = spec.unwrap_or("idemhook.db");
    let value = match spec.strip_prefix("env:") {
        Some(name) => std::env::var(name)
            .map_err(|_| format!("database: environment variable {name} is not set"))?,
        None => spec.to_string(),
    };
    DatabaseUrl::parse(&value, base).map_err(|e| format!("database: {e}"))
}

/// A PostgreSQL database with idemhook's tables in `schema`.
fn with_schema(database: DatabaseUrl, schema: &str) -> DatabaseUrl {
    match database {
        DatabaseUrl::Postgres(url) => DatabaseUrl::Postgres(url.with_schema(schema)),
        sqlite => sqlite,
    }
}

/// Every `env:` variable the file names is set (`admin_token`'s may not be).
fn no_unset_variables(raw: &RawConfig) -> Result<(), String> {
    let missing = unset_variables(raw);
    if missing.is_empty() {
        return Ok(());
    }
    let list: Vec<String> = missing
        .iter()
        .map(|(name, key)| format!("{name} ({key})"))
        .collect();
    Err(format!(
        "environment variable{} not set: {}",
        if list.len() == 1 { "" } else { "s" },
        list.join(", ")
    ))
}

/// The shortest admin token accepted, however it is given.
const MIN_ADMIN_TOKEN: usize = 32;

/// The admin token, and the name of its `env:` variable when that is not
/// set. An unset variable turns the admin API off (a config may name
/// IDEMHOOK_ADMIN_TOKEN and leave it unset where no admin API is wanted),
/// unlike a source secret, without which nothing could be verified.
fn admin_token_of(
    raw: &RawConfig,
    base: &Path,
) -> Result<(Option<Secret>, Option<String>), String> {
    let admin_token_unset = raw
        .admin_token
        .as_deref()
        .and_then(|spec| spec.strip_prefix("env:"))
        .filter(|name| std::env::var_os(name).is_none())
        .map(str::to_string);
    let admin_token = match &raw.admin_token {
        // An operator command serves no admin API.
        Some(_) if !super::values::secrets_needed() => None,
        Some(_) if admin_token_unset.is_some() => None,
        Some(spec) => {
            let token = resolve_secret(spec, base).map_err(|e| format!("admin_token: {e}"))?;
            if token.expose().is_empty() {
                return Err("admin_token: the token is empty".into());
            }
            if token.expose().chars().count() < MIN_ADMIN_TOKEN {
                let hint = if super::warnings::looks_like_shell_variable(spec) {
                    " (the literal looks like a shell variable: write \"env:NAME\" to read it from the environment)"
                } else {
                    ""
                };
                return Err(format!(
                    "admin_token: the token is shorter than {MIN_ADMIN_TOKEN} characters: make one with `openssl rand -hex 32`{hint}"
                ));
            }
            Some(token)
        }
        None => None,
    };
    Ok((admin_token, admin_token_unset))
}

/// The HTTP server's caps and deadlines.
fn http_limits_of(raw: &RawConfig) -> Result<HttpLimits, String> {
    let max_connections = raw.max_connections.unwrap_or(512);
    if !(1..=65_536).contains(&max_connections) {
        return Err(format!(
            "max_connections: must be 1 to 65536, got {max_connections}"
        ));
    }
    // A cap per address that defaults to 128, never above the cap in
    // all.
    let max_connections_per_address = match raw.max_connections_per_address {
        None => max_connections.min(128),
        Some(n) if (1..=max_connections).contains(&n) => n,
        Some(n) => {
            return Err(format!(
                "max_connections_per_address: must be 1 to max_connections ({max_connections}), got {n}"
            ));
        }
    };
    let min_receive_rate = raw.min_receive_rate.unwrap_or(1024);
    if min_receive_rate > 1 << 30 {
        return Err(format!(
            "min_receive_rate: must be 0 (no minimum) to 1073741824 bytes a second, got {min_receive_rate}"
        ));
    }
    let http = HttpLimits {
        max_connections,
        max_connections_per_address,
        min_receive_rate,
        header_timeout: nonzero(
            opt_duration(&raw.header_timeout, "header_timeout", "10s"),
            "header_timeout",
        )?,
        body_timeout: nonzero(
            opt_duration(&raw.body_timeout, "body_timeout", "30s"),
            "body_timeout",
        )?,
        idle_timeout: nonzero(
            opt_duration(&raw.idle_timeout, "idle_timeout", "60s"),
            "idle_timeout",
        )?,
    };
    Ok(http)
}
