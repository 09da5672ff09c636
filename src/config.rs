//! The configuration file: parsed once, validated, resolved (secrets read,
//! durations parsed, relative paths anchored at the file's folder) and then
//! passed down as plain structs. Nothing else reads the TOML or the
//! environment for settings.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::key::{Part, Rule};
use crate::state::JobKind;
use crate::store::{DatabaseUrl, PostgresUrl};
use crate::verify::{Encoding, HmacAlgorithm, HmacParams, Scheme, Secret, Verifier};

/// A configuration problem, with the file it came from when there was one.
#[derive(Debug, thiserror::Error)]
#[error("{origin}: {message}")]
pub struct ConfigError {
    origin: String,
    message: String,
}

impl ConfigError {
    fn new(origin: &str, message: impl Into<String>) -> ConfigError {
        ConfigError {
            origin: origin.to_string(),
            message: message.into(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// synchronous=FULL: every acknowledged event has been fsynced.
    Full,
    /// synchronous=NORMAL: survives a crash of the process, not of the machine.
    Normal,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnMismatch {
    Ack,
    Reject,
}

/// The kinds of source, each with its signature scheme and key rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Stripe,
    Github,
    Shopify,
    Slack,
    Paddle,
    Linear,
    Standard,
    Hmac,
    None,
}

impl Kind {
    pub const ALL: [Kind; 9] = [
        Kind::Stripe,
        Kind::Github,
        Kind::Shopify,
        Kind::Slack,
        Kind::Paddle,
        Kind::Linear,
        Kind::Standard,
        Kind::Hmac,
        Kind::None,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Stripe => "stripe",
            Kind::Github => "github",
            Kind::Shopify => "shopify",
            Kind::Slack => "slack",
            Kind::Paddle => "paddle",
            Kind::Linear => "linear",
            Kind::Standard => "standard",
            Kind::Hmac => "hmac",
            Kind::None => "none",
        }
    }

    fn parse(s: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == s)
    }

    /// True for the schemes whose signature covers a timestamp, which
    /// `tolerance` bounds.
    pub fn signs_timestamp(self) -> bool {
        matches!(
            self,
            Kind::Stripe | Kind::Slack | Kind::Paddle | Kind::Linear | Kind::Standard
        )
    }

    /// How long keys are kept by default: the provider's documented retry or
    /// redelivery horizon plus a margin, never under 7 days. The README's
    /// retention table gives the reason for each.
    pub fn default_retention(self) -> Duration {
        let days = match self {
            // retries for up to 3 days
            Kind::Stripe | Kind::Paddle => 7,
            // manual redelivery for 3 days (7 on Enterprise Server)
            Kind::Github => 14,
            // retries 8 times over 4 hours
            Kind::Shopify => 7,
            // Svix ~28 h, the spec's example schedule ~76 h
            Kind::Standard => 7,
            // Slack retries 3 times within an hour, Linear within hours
            Kind::Slack | Kind::Linear => 7,
            // unknown senders: a conservative month
            Kind::Hmac | Kind::None => 30,
        };
        Duration::from_secs(days * 86_400)
    }

    /// The provider's documented retry (or redelivery) horizon, and how it
    /// is documented: a key pruned sooner lets a redelivery through as a
    /// new event. None for senders idemhook knows nothing about.
    pub fn retry_horizon(self) -> Option<(Duration, &'static str)> {
        let (secs, what) = match self {
            Kind::Stripe => (3 * 86_400, "Stripe retries for up to 3 days"),
            Kind::Paddle => (3 * 86_400, "Paddle retries for up to 3 days"),
            Kind::Github => (
                3 * 86_400,
                "GitHub redelivers on request for 3 days (7 on Enterprise Server)",
            ),
            Kind::Shopify => (4 * 3600, "Shopify retries 8 times over 4 hours"),
            Kind::Standard => (
                76 * 3600,
                "Svix retries for about 28 hours, the Standard Webhooks example schedule for about 76",
            ),
            Kind::Slack => (3600, "Slack retries 3 times within the hour"),
            Kind::Linear => (86_400, "Linear retries a few times, backing off over hours"),
            Kind::Hmac | Kind::None => return None,
        };
        Some((Duration::from_secs(secs), what))
    }

    /// The key rule each kind uses unless the source overrides `key`.
    fn default_key(self) -> Option<Vec<Part>> {
        let rule = match self {
            Kind::Stripe => "json:/id",
            Kind::Github => "header:X-GitHub-Delivery",
            Kind::Shopify => "header:X-Shopify-Event-Id|header:X-Shopify-Webhook-Id",
            Kind::Slack => "json:/event_id",
            Kind::Paddle => "json:/event_id",
            Kind::Linear => "header:Linear-Delivery",
            Kind::Standard => "header:webhook-id|header:svix-id",
            Kind::Hmac | Kind::None => return None,
        };
        Part::parse(rule).ok().map(|p| vec![p])
    }

    fn default_type(self) -> Option<Part> {
        let rule = match self {
            Kind::Stripe => "json:/type",
            Kind::Github => "header:X-GitHub-Event",
            Kind::Shopify => "header:X-Shopify-Topic",
            Kind::Slack => "json:/event/type|json:/type",
            Kind::Paddle => "json:/event_type",
            Kind::Linear => "header:Linear-Event",
            Kind::Standard => "json:/type",
            Kind::Hmac | Kind::None => return None,
        };
        Part::parse(rule).ok()
    }

    /// Headers worth keeping with the stored event (besides Content-Type):
    /// the ones the key and type come from and the signature headers, so an
    /// operator can see what was verified.
    pub fn kept_headers(self) -> &'static [&'static str] {
        match self {
            Kind::Stripe => &["stripe-signature"],
            Kind::Github => &[
                "x-github-delivery",
                "x-github-event",
                "x-github-hook-id",
                "x-hub-signature-256",
            ],
            Kind::Shopify => &[
                "x-shopify-event-id",
                "x-shopify-webhook-id",
                "x-shopify-topic",
                "x-shopify-shop-domain",
                "x-shopify-hmac-sha256",
            ],
            Kind::Slack => &["x-slack-request-timestamp", "x-slack-signature"],
            Kind::Paddle => &["paddle-signature"],
            Kind::Linear => &["linear-delivery", "linear-event", "linear-signature"],
            Kind::Standard => &[
                "webhook-id",
                "webhook-timestamp",
                "webhook-signature",
                "svix-id",
                "svix-timestamp",
                "svix-signature",
            ],
            Kind::Hmac | Kind::None => &[],
        }
    }
}

/// The resolved configuration.
#[derive(Debug)]
pub struct Config {
    /// The file it came from; None for the development default.
    pub file: Option<PathBuf>,
    pub listen: String,
    /// The SQLite file; empty when `postgres` is set.
    pub database: PathBuf,
    /// The PostgreSQL database, when `database` is a postgres:// URL.
    pub postgres: Option<PostgresUrl>,
    pub durability: Durability,
    pub admin_token: Option<Secret>,
    /// The environment variable `admin_token` names when it is not set:
    /// the admin API is then off, and serve and check say why.
    pub admin_token_unset: Option<String>,
    pub max_body_bytes: usize,
    pub http_workers: usize,
    pub forward_workers: usize,
    pub prune_interval: Duration,
    /// How long a write waits for a lock held by another process before the
    /// delivery is answered 503.
    pub busy_timeout: Duration,
    pub setup_sql: Option<String>,
    /// PEM certificate chain and private key: when both are set, the
    /// listeners speak TLS only.
    pub tls: Option<TlsFiles>,
    /// A second listener for the admin API and /metrics; when set, the main
    /// listener does not serve them.
    pub admin_listen: Option<String>,
    pub http: HttpLimits,
    pub sources: Vec<Source>,
    /// What is valid but will likely misbehave (a secret that looks like a
    /// shell variable, a retention shorter than the provider retries):
    /// `check` prints these and `serve` logs them at start.
    pub warnings: Vec<String>,
}

#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Connection limits of the HTTP server.
#[derive(Debug, Clone)]
pub struct HttpLimits {
    pub max_connections: usize,
    /// Open connections from one address (an IPv6 /64).
    pub max_connections_per_address: usize,
    /// Bytes a second a request must average after its first 2 s; 0: none.
    pub min_receive_rate: u64,
    pub header_timeout: Duration,
    pub body_timeout: Duration,
    pub idle_timeout: Duration,
}

#[derive(Debug)]
pub struct Source {
    pub name: String,
    pub kind: Kind,
    pub verifier: Verifier,
    pub secret_count: usize,
    pub allow_unsigned: bool,
    pub tolerance: Duration,
    pub retention: Duration,
    pub payload_retention: Duration,
    pub key: Rule,
    pub event_type: Option<Part>,
    /// What a duplicate must match; empty means the whole body.
    pub hash: Vec<Part>,
    pub on_mismatch: OnMismatch,
    pub actions: Vec<Action>,
}

impl Source {
    /// True when anything about this source reads the body as JSON, so the
    /// body must parse.
    pub fn needs_json(&self) -> bool {
        self.kind == Kind::Linear
            || self.kind == Kind::Slack
            || self.key.parts.iter().any(Part::reads_json)
            || self.event_type.as_ref().is_some_and(Part::reads_json)
            || self.hash.iter().any(Part::reads_json)
            || self.binds_json()
    }

    /// True when an SQL action binds values from the body, so the claim
    /// needs the parsed JSON tree (not just a few values from it).
    pub fn binds_json(&self) -> bool {
        self.actions.iter().any(|a| match &a.kind {
            ActionKind::Sql { params, .. } => params.iter().any(|(_, p)| p.reads_json()),
            ActionKind::Forward(_) => false,
        })
    }

    pub fn action(&self, name: &str) -> Option<&Action> {
        self.actions.iter().find(|a| a.name == name)
    }

    /// The hash rule as text, recorded with the key rule.
    pub fn hash_rule(&self) -> String {
        if self.hash.is_empty() {
            "body".to_string()
        } else {
            self.hash
                .iter()
                .map(|p| p.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        }
    }
}

#[derive(Debug)]
pub struct Action {
    pub name: String,
    /// Event types this action takes; empty means all.
    pub types: Vec<String>,
    pub kind: ActionKind,
}

impl Action {
    pub fn takes(&self, event_type: Option<&str>) -> bool {
        self.types.is_empty() || event_type.is_some_and(|t| self.types.iter().any(|want| want == t))
    }

    /// The `kind` its jobs are stored with.
    pub fn job_kind(&self) -> JobKind {
        match self.kind {
            ActionKind::Sql { .. } => JobKind::Sql,
            ActionKind::Forward(_) => JobKind::Forward,
        }
    }

    pub fn kind_name(&self) -> &'static str {
        self.job_kind().as_str()
    }
}

#[derive(Debug)]
pub enum ActionKind {
    /// A database-only effect, run in the claim transaction.
    Sql {
        sql: String,
        params: Vec<(String, Part)>,
    },
    /// An external effect, delivered through the outbox.
    Forward(Forward),
}

#[derive(Debug, Clone)]
pub struct Forward {
    pub url: String,
    pub timeout: Duration,
    pub max_attempts: u32,
    pub retry_initial: Duration,
    pub retry_max: Duration,
    pub lease: Duration,
    pub sign_secret: Option<Secret>,
    /// The downstream header recorded as the attempt's request id.
    pub request_id_header: String,
    /// Asked before an attempt whose predecessor's outcome is unknown
    /// (`check.rs`).
    pub check: Option<crate::check::Template>,
    /// Actions of the same event that must be done before this one is sent.
    pub after: Vec<String>,
}

// ---------------------------------------------------------------------------
// The file as written.

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    listen: Option<String>,
    database: Option<String>,
    durability: Option<String>,
    admin_token: Option<String>,
    max_body_bytes: Option<u64>,
    http_workers: Option<usize>,
    forward_workers: Option<usize>,
    prune_interval: Option<String>,
    busy_timeout: Option<String>,
    setup_sql: Option<String>,
    tls_cert: Option<String>,
    tls_key: Option<String>,
    admin_listen: Option<String>,
    max_connections: Option<usize>,
    max_connections_per_address: Option<usize>,
    min_receive_rate: Option<u64>,
    header_timeout: Option<String>,
    body_timeout: Option<String>,
    idle_timeout: Option<String>,
    #[serde(default)]
    sources: BTreeMap<String, RawSource>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSource {
    kind: String,
    #[serde(default)]
    secrets: Vec<String>,
    tolerance: Option<String>,
    retention: Option<String>,
    payload_retention: Option<String>,
    key: Option<Vec<String>>,
    #[serde(rename = "type")]
    event_type: Option<String>,
    hash: Option<Vec<String>>,
    on_mismatch: Option<String>,
    allow_unsigned: Option<bool>,
    // kind = "hmac"
    header: Option<String>,
    algorithm: Option<String>,
    encoding: Option<String>,
    prefix: Option<String>,
    #[serde(default)]
    actions: Vec<RawAction>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAction {
    name: String,
    types: Option<Vec<String>>,
    sql: Option<String>,
    params: Option<BTreeMap<String, String>>,
    forward: Option<String>,
    timeout: Option<String>,
    max_attempts: Option<u32>,
    retry_initial: Option<String>,
    retry_max: Option<String>,
    lease: Option<String>,
    sign_secret: Option<String>,
    request_id_header: Option<String>,
    check: Option<String>,
    after: Option<Vec<String>>,
}

/// The development default that `serve` runs when there is no config file.
pub const DEV_DEFAULT_SECRET: &str = "whsec_ZGV2LXNlY3JldC1mb3ItaWRlbWhvb2stZGVtbw==";

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
        let raw: RawConfig =
            toml::from_str(text).map_err(|e| ConfigError::new(origin, e.to_string()))?;
        let err = |msg: String| ConfigError::new(origin, msg);
        let missing = unset_variables(&raw);
        if !missing.is_empty() {
            let list: Vec<String> = missing
                .iter()
                .map(|(name, key)| format!("{name} ({key})"))
                .collect();
            return Err(err(format!(
                "environment variable{} not set: {}",
                if list.len() == 1 { "" } else { "s" },
                list.join(", ")
            )));
        }
        let mut warnings = shell_variable_warnings(&raw);

        let durability = match raw.durability.as_deref().unwrap_or("full") {
            "full" => Durability::Full,
            "normal" => Durability::Normal,
            other => {
                return Err(err(format!(
                    "durability: expected \"full\" or \"normal\", got {other:?}"
                )));
            }
        };
        // An `env:` token whose variable is not set turns the admin API off
        // (as PRODUCT.md's example config reads), unlike a source secret,
        // without which nothing could be verified.
        let admin_token_unset = raw
            .admin_token
            .as_deref()
            .and_then(|spec| spec.strip_prefix("env:"))
            .filter(|name| std::env::var_os(name).is_none())
            .map(str::to_string);
        let admin_token = match &raw.admin_token {
            Some(_) if admin_token_unset.is_some() => None,
            Some(spec) => {
                let token =
                    resolve_secret(spec, base).map_err(|e| err(format!("admin_token: {e}")))?;
                if token.expose().is_empty() {
                    return Err(err("admin_token: the token is empty".into()));
                }
                Some(token)
            }
            None => None,
        };
        let max_body_bytes = raw.max_body_bytes.unwrap_or(1_048_576);
        if max_body_bytes == 0 || max_body_bytes > 64 * 1024 * 1024 {
            return Err(err(format!(
                "max_body_bytes: must be between 1 and 67108864, got {max_body_bytes}"
            )));
        }
        let http_workers = raw.http_workers.unwrap_or(8);
        if !(1..=256).contains(&http_workers) {
            return Err(err(format!(
                "http_workers: must be 1 to 256, got {http_workers}"
            )));
        }
        let forward_workers = raw.forward_workers.unwrap_or(4);
        if forward_workers > 256 {
            return Err(err(format!(
                "forward_workers: must be 0 to 256, got {forward_workers}"
            )));
        }
        let prune_interval =
            opt_duration(&raw.prune_interval, "prune_interval", "1h").map_err(err)?;
        let busy_timeout = opt_duration(&raw.busy_timeout, "busy_timeout", "5s").map_err(err)?;
        let (database, postgres) = resolve_database(raw.database.as_deref(), base).map_err(err)?;

        let tls = match (&raw.tls_cert, &raw.tls_key) {
            (Some(cert), Some(key)) => Some(TlsFiles {
                cert: base.join(cert),
                key: base.join(key),
            }),
            (None, None) => None,
            _ => return Err(err("tls_cert and tls_key: set both or neither".into())),
        };
        let max_connections = raw.max_connections.unwrap_or(1024);
        if !(1..=65_536).contains(&max_connections) {
            return Err(err(format!(
                "max_connections: must be 1 to 65536, got {max_connections}"
            )));
        }
        // A cap per address that defaults to 128, never above the cap in
        // all.
        let max_connections_per_address = match raw.max_connections_per_address {
            None => max_connections.min(128),
            Some(n) if (1..=max_connections).contains(&n) => n,
            Some(n) => {
                return Err(err(format!(
                    "max_connections_per_address: must be 1 to max_connections ({max_connections}), got {n}"
                )));
            }
        };
        let min_receive_rate = raw.min_receive_rate.unwrap_or(1024);
        if min_receive_rate > 1 << 30 {
            return Err(err(format!(
                "min_receive_rate: must be 0 (no minimum) to 1073741824 bytes a second, got {min_receive_rate}"
            )));
        }
        let http = HttpLimits {
            max_connections,
            max_connections_per_address,
            min_receive_rate,
            header_timeout: nonzero(
                opt_duration(&raw.header_timeout, "header_timeout", "10s"),
                "header_timeout",
            )
            .map_err(err)?,
            body_timeout: nonzero(
                opt_duration(&raw.body_timeout, "body_timeout", "30s"),
                "body_timeout",
            )
            .map_err(err)?,
            idle_timeout: nonzero(
                opt_duration(&raw.idle_timeout, "idle_timeout", "60s"),
                "idle_timeout",
            )
            .map_err(err)?,
        };

        if raw.sources.is_empty() && file.is_some() {
            return Err(err(
                "no [sources.NAME] table: at least one source is needed".into(),
            ));
        }
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
            postgres,
            durability,
            admin_token,
            admin_token_unset,
            max_body_bytes: max_body_bytes as usize,
            http_workers,
            forward_workers,
            prune_interval,
            busy_timeout,
            setup_sql: raw.setup_sql,
            tls,
            admin_listen: raw.admin_listen,
            http,
            sources,
            warnings,
        })
    }

    pub fn source(&self, name: &str) -> Option<&Source> {
        self.sources.iter().find(|s| s.name == name)
    }
}

/// Every secret spec in the file with the key it sits under, except
/// `admin_token` (whose unset variable turns the admin API off); `database`
/// counts too, for its `env:NAME` form.
fn secret_specs(raw: &RawConfig) -> Vec<(String, &str)> {
    let mut out = Vec::new();
    if let Some(spec) = &raw.database {
        out.push(("database".to_string(), spec.as_str()));
    }
    for (name, rs) in &raw.sources {
        for (i, spec) in rs.secrets.iter().enumerate() {
            out.push((format!("sources.{name}.secrets[{i}]"), spec.as_str()));
        }
        for (i, ra) in rs.actions.iter().enumerate() {
            if let Some(spec) = &ra.sign_secret {
                out.push((
                    format!("sources.{name}.actions[{i}] ({}).sign_secret", ra.name),
                    spec.as_str(),
                ));
            }
        }
    }
    out
}

/// The `env:` variables that are not set, each with its key: all of them
/// at once, so one run of `check` lists everything to export.
fn unset_variables(raw: &RawConfig) -> Vec<(String, String)> {
    secret_specs(raw)
        .into_iter()
        .filter_map(|(key, spec)| {
            let name = spec.strip_prefix("env:")?;
            std::env::var_os(name)
                .is_none()
                .then(|| (name.to_string(), key))
        })
        .collect()
}

/// A literal secret written like a shell variable (`$NAME`, `${NAME}`) is
/// almost surely meant to be read from the environment: a TOML file is not
/// expanded by a shell, so the secret would be those characters. The
/// warning names the key, never the value.
fn shell_variable_warnings(raw: &RawConfig) -> Vec<String> {
    let admin = raw
        .admin_token
        .as_deref()
        .map(|spec| ("admin_token".to_string(), spec));
    admin
        .into_iter()
        .chain(secret_specs(raw))
        .filter(|(_, spec)| looks_like_shell_variable(spec))
        .map(|(key, _)| {
            format!(
                "{key}: the literal secret looks like a shell variable ($NAME or ${{NAME}}); the file is not expanded, so the secret is those characters: write \"env:NAME\" to read it from the environment"
            )
        })
        .collect()
}

fn looks_like_shell_variable(spec: &str) -> bool {
    let Some(rest) = spec.strip_prefix('$') else {
        return false;
    };
    let name = rest
        .strip_prefix('{')
        .and_then(|r| r.strip_suffix('}'))
        .unwrap_or(rest);
    let mut bytes = name.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// A `retention` shorter than the provider's retry horizon: a key pruned
/// before the provider stops retrying lets a redelivery in as a new event.
fn retention_warning(source: &Source) -> Option<String> {
    let (horizon, what) = source.kind.retry_horizon()?;
    (source.retention < horizon).then(|| {
        format!(
            "sources.{}.retention: {} is shorter than {}'s retry horizon ({what}): a redelivery that comes after its key is pruned is processed again, as a new event",
            source.name,
            format_duration(source.retention),
            source.kind
        )
    })
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
}

fn resolve_source(name: &str, rs: RawSource, base: &Path) -> Result<Source, String> {
    if !valid_name(name) {
        return Err(
            "name: a source name is 1 to 64 of A-Z a-z 0-9 _ - . (it is a URL path segment)"
                .to_string(),
        );
    }
    let kind = Kind::parse(&rs.kind).ok_or_else(|| {
        let names: Vec<&str> = Kind::ALL.iter().map(|k| k.name()).collect();
        format!(
            "kind: unknown kind {:?}, expected one of {}",
            rs.kind,
            names.join(", ")
        )
    })?;

    let hmac_keys = [
        ("header", rs.header.is_some()),
        ("algorithm", rs.algorithm.is_some()),
        ("encoding", rs.encoding.is_some()),
        ("prefix", rs.prefix.is_some()),
    ];
    if kind != Kind::Hmac
        && let Some((key, _)) = hmac_keys.iter().find(|(_, set)| *set)
    {
        return Err(format!(
            "{key}: only sources of kind \"hmac\" take this key"
        ));
    }
    let scheme = match kind {
        Kind::Stripe => Scheme::Stripe,
        Kind::Github => Scheme::Github,
        Kind::Shopify => Scheme::Shopify,
        Kind::Slack => Scheme::Slack,
        Kind::Paddle => Scheme::Paddle,
        Kind::Linear => Scheme::Linear,
        Kind::Standard => Scheme::Standard,
        Kind::None => Scheme::None,
        Kind::Hmac => {
            let header = rs
                .header
                .clone()
                .filter(|h| !h.trim().is_empty())
                .ok_or("header: kind \"hmac\" needs the name of the signature header")?;
            let algorithm = match rs.algorithm.as_deref().unwrap_or("sha256") {
                "sha1" => HmacAlgorithm::Sha1,
                "sha256" => HmacAlgorithm::Sha256,
                "sha512" => HmacAlgorithm::Sha512,
                other => {
                    return Err(format!(
                        "algorithm: expected sha1, sha256 or sha512, got {other:?}"
                    ));
                }
            };
            let encoding = match rs.encoding.as_deref().unwrap_or("hex") {
                "hex" => Encoding::Hex,
                "base64" => Encoding::Base64,
                other => return Err(format!("encoding: expected hex or base64, got {other:?}")),
            };
            let prefix = rs.prefix.clone().unwrap_or_default();
            // Header values are trimmed, so a prefix with blanks or control
            // characters could never match.
            if !prefix.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(format!(
                    "prefix: {prefix:?} must be visible ASCII without spaces, e.g. \"sha256=\""
                ));
            }
            Scheme::Hmac(HmacParams {
                header,
                algorithm,
                encoding,
                prefix,
            })
        }
    };

    let allow_unsigned = rs.allow_unsigned.unwrap_or(false);
    if kind == Kind::None {
        if !allow_unsigned {
            return Err(
                "allow_unsigned: kind \"none\" accepts unsigned requests only with allow_unsigned = true"
                    .to_string(),
            );
        }
        if !rs.secrets.is_empty() {
            return Err("secrets: kind \"none\" takes no secrets".to_string());
        }
    } else if allow_unsigned {
        return Err(
            "allow_unsigned: only sources of kind \"none\" take this key; other kinds always verify"
                .to_string(),
        );
    } else if rs.secrets.is_empty() {
        return Err("secrets: at least one secret is needed".to_string());
    }
    let mut secrets = Vec::new();
    for (i, spec) in rs.secrets.iter().enumerate() {
        secrets.push(resolve_secret(spec, base).map_err(|e| format!("secrets[{i}]: {e}"))?);
    }
    let secret_count = secrets.len();
    let tolerance = opt_duration(&rs.tolerance, "tolerance", "5m")?;
    let verifier =
        Verifier::new(scheme, secrets, tolerance).map_err(|e| format!("secrets: {e}"))?;

    let retention = match &rs.retention {
        Some(s) => parse_duration(s).map_err(|e| format!("retention: {e}"))?,
        None => kind.default_retention(),
    };
    let payload_retention = match &rs.payload_retention {
        Some(s) => parse_duration(s).map_err(|e| format!("payload_retention: {e}"))?,
        None => retention.min(Duration::from_secs(7 * 86_400)),
    };
    if payload_retention > retention {
        return Err(
            "payload_retention: cannot exceed retention (the body is kept with its key)"
                .to_string(),
        );
    }

    let key_parts = match &rs.key {
        Some(parts) => {
            if parts.is_empty() {
                return Err("key: needs at least one part".to_string());
            }
            parse_parts(parts).map_err(|e| format!("key: {e}"))?
        }
        None => kind.default_key().ok_or_else(|| {
            format!(
                "key: kind \"{}\" has no event id of its own; set key = [\"json:/id\"] or [\"header:Name\"]",
                kind.name()
            )
        })?,
    };
    let event_type = match &rs.event_type {
        Some(t) => Some(Part::parse(t).map_err(|e| format!("type: {e}"))?),
        None => kind.default_type(),
    };
    let hash = match &rs.hash {
        Some(parts) => parse_parts(parts).map_err(|e| format!("hash: {e}"))?,
        None => Vec::new(),
    };
    let on_mismatch = match rs.on_mismatch.as_deref().unwrap_or("ack") {
        "ack" => OnMismatch::Ack,
        "reject" => OnMismatch::Reject,
        other => {
            return Err(format!(
                "on_mismatch: expected ack or reject, got {other:?}"
            ));
        }
    };

    let mut actions: Vec<Action> = Vec::new();
    for (i, ra) in rs.actions.into_iter().enumerate() {
        let action_name = ra.name.clone();
        if actions.iter().any(|a| a.name == action_name) {
            return Err(format!("actions[{i}].name: {action_name:?} is used twice"));
        }
        actions.push(
            resolve_action(ra, base).map_err(|e| format!("actions[{i}] ({action_name}).{e}"))?,
        );
    }
    check_after(&actions)?;

    Ok(Source {
        name: name.to_string(),
        kind,
        verifier,
        secret_count,
        allow_unsigned,
        tolerance,
        retention,
        payload_retention,
        key: Rule { parts: key_parts },
        event_type,
        hash,
        on_mismatch,
        actions,
    })
}

fn resolve_action(ra: RawAction, base: &Path) -> Result<Action, String> {
    if !valid_name(&ra.name) {
        return Err("name: an action name is 1 to 64 of A-Z a-z 0-9 _ - .".to_string());
    }
    let types = ra.types.unwrap_or_default();
    let forward_only = [
        ("timeout", ra.timeout.is_some()),
        ("max_attempts", ra.max_attempts.is_some()),
        ("retry_initial", ra.retry_initial.is_some()),
        ("retry_max", ra.retry_max.is_some()),
        ("lease", ra.lease.is_some()),
        ("sign_secret", ra.sign_secret.is_some()),
        ("request_id_header", ra.request_id_header.is_some()),
        ("check", ra.check.is_some()),
        ("after", ra.after.is_some()),
    ];
    let kind = match (ra.sql, ra.forward) {
        (Some(_), Some(_)) => {
            return Err("sql: an action has either sql or forward, not both".to_string());
        }
        (None, None) => {
            return Err(
                "sql: an action needs sql = \"...\" or forward = \"http://...\"".to_string(),
            );
        }
        (Some(sql), None) => {
            if let Some((key, _)) = forward_only.iter().find(|(_, set)| *set) {
                return Err(format!("{key}: only forward actions take this key"));
            }
            if sql.trim().is_empty() {
                return Err("sql: the statement is empty".to_string());
            }
            let mut params = Vec::new();
            for (name, spec) in ra.params.unwrap_or_default() {
                if is_builtin_param(&name) {
                    return Err(format!(
                        "params.{name}: :{name} is a built-in parameter and cannot be redefined"
                    ));
                }
                params.push((
                    name.clone(),
                    Part::parse(&spec).map_err(|e| format!("params.{name}: {e}"))?,
                ));
            }
            ActionKind::Sql { sql, params }
        }
        (None, Some(url)) => {
            if ra.params.is_some() {
                return Err("params: only sql actions take params".to_string());
            }
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(format!(
                    "forward: expected an http:// or https:// URL, got {url:?}"
                ));
            }
            let timeout = opt_duration(&ra.timeout, "timeout", "10s")?;
            let lease = match &ra.lease {
                Some(s) => parse_duration(s).map_err(|e| format!("lease: {e}"))?,
                None => (timeout * 6).max(Duration::from_secs(60)),
            };
            if lease <= timeout {
                return Err(format!(
                    "lease: must be longer than timeout ({} <= {}), or a slow attempt could run twice",
                    format_duration(lease),
                    format_duration(timeout)
                ));
            }
            let check = match &ra.check {
                Some(text) => {
                    Some(crate::check::Template::parse(text).map_err(|e| format!("check: {e}"))?)
                }
                None => None,
            };
            if check.is_some() && lease <= timeout * 2 {
                return Err(format!(
                    "lease: must be longer than twice the timeout when check is set ({} <= 2 x {}): a check and then a send each take up to timeout",
                    format_duration(lease),
                    format_duration(timeout)
                ));
            }
            let retry_initial = opt_duration(&ra.retry_initial, "retry_initial", "1s")?;
            let retry_max = opt_duration(&ra.retry_max, "retry_max", "1h")?;
            if retry_max < retry_initial {
                return Err("retry_max: must not be shorter than retry_initial".to_string());
            }
            let max_attempts = ra.max_attempts.unwrap_or(12);
            if max_attempts == 0 {
                return Err("max_attempts: must be at least 1".to_string());
            }
            let sign_secret = match &ra.sign_secret {
                Some(spec) => {
                    Some(resolve_secret(spec, base).map_err(|e| format!("sign_secret: {e}"))?)
                }
                None => None,
            };
            ActionKind::Forward(Forward {
                url,
                timeout,
                max_attempts,
                retry_initial,
                retry_max,
                lease,
                sign_secret,
                request_id_header: ra
                    .request_id_header
                    .unwrap_or_else(|| "X-Request-Id".to_string()),
                check,
                after: ra.after.unwrap_or_default(),
            })
        }
    };
    Ok(Action {
        name: ra.name,
        types,
        kind,
    })
}

/// Checks every forward action's `after`: it names other actions of the
/// same source, each once, and following the names never comes back to
/// where it started (a cycle would wait forever).
fn check_after(actions: &[Action]) -> Result<(), String> {
    fn after_of(a: &Action) -> &[String] {
        match &a.kind {
            ActionKind::Forward(f) => f.after.as_slice(),
            ActionKind::Sql { .. } => &[],
        }
    }
    for (i, a) in actions.iter().enumerate() {
        let names = after_of(a);
        for (j, name) in names.iter().enumerate() {
            let at = format!("actions[{i}] ({}).after", a.name);
            if name == &a.name {
                return Err(format!("{at}: an action cannot wait for itself"));
            }
            if !actions.iter().any(|b| &b.name == name) {
                let known: Vec<&str> = actions.iter().map(|b| b.name.as_str()).collect();
                return Err(format!(
                    "{at}: no action {name:?} in this source (after names actions of the same source: {})",
                    known.join(", ")
                ));
            }
            if names[..j].contains(name) {
                return Err(format!("{at}: {name:?} is named twice"));
            }
        }
    }
    // Depth-first, from each action: a name met again on the current
    // path closes a cycle.
    fn visit<'a>(
        actions: &'a [Action],
        name: &'a str,
        path: &mut Vec<&'a str>,
        finished: &mut Vec<&'a str>,
    ) -> Result<(), String> {
        if finished.contains(&name) {
            return Ok(());
        }
        if let Some(start) = path.iter().position(|n| *n == name) {
            let mut cycle: Vec<&str> = path[start..].to_vec();
            cycle.push(name);
            return Err(format!(
                "actions ({}).after: a cycle, {}: each would wait for the other forever",
                path[start],
                cycle.join(" -> ")
            ));
        }
        path.push(name);
        if let Some(ActionKind::Forward(f)) =
            actions.iter().find(|a| a.name == name).map(|a| &a.kind)
        {
            for next in &f.after {
                visit(actions, next, path, finished)?;
            }
        }
        path.pop();
        finished.push(name);
        Ok(())
    }
    let mut finished = Vec::new();
    for a in actions {
        visit(actions, &a.name, &mut Vec::new(), &mut finished)?;
    }
    Ok(())
}

/// Built-in SQL action parameters.
pub const BUILTIN_PARAMS: [&str; 5] = ["source", "event_id", "type", "payload", "received_at"];

fn is_builtin_param(name: &str) -> bool {
    BUILTIN_PARAMS.contains(&name)
}

fn parse_parts(specs: &[String]) -> Result<Vec<Part>, String> {
    specs.iter().map(|s| Part::parse(s)).collect()
}

fn nonzero(d: Result<Duration, String>, key: &str) -> Result<Duration, String> {
    match d {
        Ok(d) if d.is_zero() => Err(format!("{key}: must be longer than 0s")),
        other => other,
    }
}

fn opt_duration(value: &Option<String>, key: &str, default: &str) -> Result<Duration, String> {
    parse_duration(value.as_deref().unwrap_or(default)).map_err(|e| format!("{key}: {e}"))
}

/// The `database` value: a path, `sqlite:PATH`, or a PostgreSQL URL,
/// directly or through `env:NAME` (an unset variable is reported with the
/// others before this runs). The backend is decided here, once.
fn resolve_database(
    spec: Option<&str>,
    base: &Path,
) -> Result<(PathBuf, Option<PostgresUrl>), String> {
    let spec = spec.unwrap_or("idemhook.db");
    let value = match spec.strip_prefix("env:") {
        Some(name) => std::env::var(name)
            .map_err(|_| format!("database: environment variable {name} is not set"))?,
        None => spec.to_string(),
    };
    match DatabaseUrl::parse(&value, base).map_err(|e| format!("database: {e}"))? {
        DatabaseUrl::Sqlite(path) => Ok((path, None)),
        DatabaseUrl::Postgres(url) => Ok((PathBuf::new(), Some(url))),
    }
}

/// Resolves a secret spec: a literal, `env:NAME` or `file:PATH` (relative to
/// `base`, trailing newline trimmed). Errors never contain the secret.
pub fn resolve_secret(spec: &str, base: &Path) -> Result<Secret, String> {
    let value = if let Some(name) = spec.strip_prefix("env:") {
        std::env::var(name).map_err(|_| format!("environment variable {name} is not set"))?
    } else if let Some(path) = spec.strip_prefix("file:") {
        let path = base.join(path);
        let text = std::fs::read_to_string(&path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        text.strip_suffix("\r\n")
            .or_else(|| text.strip_suffix('\n'))
            .unwrap_or(&text)
            .to_string()
    } else {
        spec.to_string()
    };
    if value.is_empty() {
        return Err("the secret is empty".to_string());
    }
    Ok(Secret::new(value))
}

/// Parses `300ms`, `5s`, `5m`, `2h`, `7d`, or a sum like `1h30m`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let s = text.trim();
    if s.is_empty() {
        return Err("empty duration: expected e.g. 300ms, 5s, 5m, 2h, 7d".to_string());
    }
    let mut total: u128 = 0;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 || digits > 12 {
            return Err(format!(
                "invalid duration {text:?}: expected e.g. 300ms, 5s, 5m, 2h, 7d"
            ));
        }
        let number: u128 = rest[..digits]
            .parse()
            .map_err(|_| format!("invalid duration {text:?}"))?;
        rest = &rest[digits..];
        let unit_len = rest.bytes().take_while(u8::is_ascii_alphabetic).count();
        let unit_ms: u128 = match &rest[..unit_len] {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            "" => {
                return Err(format!(
                    "invalid duration {text:?}: a unit is needed (ms, s, m, h, d)"
                ));
            }
            other => return Err(format!("invalid duration {text:?}: unknown unit {other:?}")),
        };
        rest = &rest[unit_len..];
        total = total.saturating_add(number.saturating_mul(unit_ms));
    }
    let ms = u64::try_from(total).map_err(|_| format!("duration {text:?} is too long"))?;
    Ok(Duration::from_millis(ms))
}

/// The shortest exact text for a duration, e.g. `90s` -> `90s`, `3600s` -> `1h`.
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    for (unit, size) in [
        ("d", 86_400_000u128),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
    ] {
        if ms >= size && ms.is_multiple_of(size) {
            return format!("{}{unit}", ms / size);
        }
    }
    format!("{ms}ms")
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
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
                "[sources.a]\nkind = \"gitlab\"\nsecrets = [\"s\"]",
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
        assert_eq!(c.database, Path::new("/tmp/data/x.db"));
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
        let c =
            parse("admin_token = \"t0k3n\"\n[sources.a]\nkind = \"github\"\nsecrets = [\"s\"]\n")
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
            "admin_token = \"${ADMIN}\"\n[sources.a]\nkind = \"stripe\"\nsecrets = [\"$STRIPE_SECRET\", \"whsec_$x1\"]\nretention = \"1d\"\n\
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
        for kind in Kind::ALL {
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
        assert_eq!(c.sources[0].kind, Kind::Standard);
    }

    #[test]
    fn database_names_its_backend_once() {
        let src = "[sources.a]\nkind = \"github\"\nsecrets = [\"s\"]\n";
        let c = parse(&format!("database = \"sqlite:data/x.db\"\n{src}")).unwrap();
        assert_eq!(c.database, Path::new("/tmp/data/x.db"));

        // env:NAME, with a variable every test process has (setting one
        // would need unsafe code, which the crate forbids).
        if let Ok(home) = std::env::var("HOME") {
            let c = parse(&format!("database = \"env:HOME\"\n{src}")).unwrap();
            assert_eq!(c.database, Path::new("/tmp").join(home));
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
        let url = c.postgres.as_ref().unwrap();
        assert_eq!(
            url.expose(),
            "postgres://idemhook:hunter2@db/app?sslmode=require"
        );
        assert!(
            !format!("{c:?}").contains("hunter2"),
            "the config's Debug shows no password"
        );
    }
}
