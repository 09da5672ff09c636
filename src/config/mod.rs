//! The configuration file: parsed once, validated, resolved (secrets read,
//! durations parsed, relative paths anchored at the file's folder) and then
//! passed down as plain structs. Nothing else reads the TOML or the
//! environment for settings.
//!
//! This file holds the resolved types ([`Config`], [`Source`], [`Action`]).
//! The files: `raw.rs` (the TOML as written), `parse.rs` (`Config::parse`),
//! `source.rs` and `action.rs` (one source, one action resolved),
//! `kind.rs` (the kinds of source and their defaults), `values.rs`
//! (secret specs, durations), `warnings.rs` (what `check` warns about).

use std::path::PathBuf;
use std::time::Duration;

use crate::config::key_rule::{Part, Rule};
use crate::state::JobKind;
use crate::verify::{Secret, Verifier};
use database_url::DatabaseUrl;

mod action;
pub mod broker;
pub mod catchup;
pub mod check_template;
pub mod database_url;
pub mod dest;
pub mod generic;
pub mod key_rule;
mod kind;
pub mod notify;
mod parse;
pub mod presets;
pub mod public_origin;
mod raw;
pub mod rejected;
pub mod smtp_url;
mod source;
#[cfg(test)]
mod tests;
mod toml_error;
mod values;
mod warnings;

pub use kind::Kind;
pub use values::{format_duration, parse_duration, resolve_secret, without_secrets};

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
            // Whatever produced it, a config error never shows a URL's
            // password.
            message: toml_error::redact_urls(&message.into()),
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

/// The resolved configuration.
#[derive(Debug)]
pub struct Config {
    /// The file it came from; None for the development default.
    pub file: Option<PathBuf>,
    pub listen: String,
    /// The database: a SQLite file or a PostgreSQL URL, decided once.
    pub database: DatabaseUrl,
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
    /// On PostgreSQL, how long one SQL action's statement may run before
    /// it is a failed action (its event is stored all the same).
    pub sql_timeout: Duration,
    /// The PostgreSQL schema of idemhook's own tables.
    pub pg_schema: String,
    pub setup_sql: Option<String>,
    /// PEM certificate chain and private key: when both are set, the
    /// listeners speak TLS only.
    pub tls: Option<TlsFiles>,
    /// A second listener for the admin API and /metrics; when set, the main
    /// listener does not serve them.
    pub admin_listen: Option<String>,
    pub http: HttpLimits,
    /// Events one batch delivery may carry; more is refused (413).
    pub max_batch_items: usize,
    pub sources: Vec<Source>,
    /// Where browsers reach idemhook behind a TLS-terminating proxy
    /// (`public_origin`): the inspector's cookie is `Secure` when it is
    /// https, and its same-origin check accepts it.
    pub public_origin: Option<public_origin::PublicOrigin>,
    /// What is valid but will likely misbehave (a secret that looks like a
    /// shell variable, a retention shorter than the provider retries):
    /// `check` prints these and `serve` logs them at start.
    pub warnings: Vec<String>,
    /// `[[notify]]` targets, `coalesce`, `ui_url`.
    pub notify: notify::NotifySettings,
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
    /// More parts of the type, each joined with `.` when present
    /// (GoCardless's `resource_type` + `action`).
    pub event_type_more: Vec<Part>,
    /// The key when the rule's parts are missing (Graph's optional `id`).
    pub key_fallback: Option<Rule>,
    /// What a duplicate must match; empty means the whole body.
    pub hash: Vec<Part>,
    /// With an empty `hash`: members left out of the body's hash (a
    /// provider's attempt counter).
    pub hash_without: Vec<&'static str>,
    /// The hash of an event claimed from the provider's API list (the
    /// kind's `listed_hash`); empty for kinds catch-up does not list.
    pub listed_hash: Vec<Part>,
    pub on_mismatch: OnMismatch,
    pub actions: Vec<Action>,
    /// The URL the provider calls, for kinds that sign it.
    pub public_url: Option<String>,
    /// Meta's subscription handshake token.
    pub verify_token: Option<Secret>,
    /// `batch`: the JSON pointer of the array whose items are the events
    /// (the built-in batch kinds have their own shape instead).
    pub batch_items: Option<String>,
    /// What a correctly signed batch without events is answered.
    pub empty_batch: generic::EmptyBatch,
    /// What a stored (or duplicate) delivery is answered.
    pub answer: generic::Answer,
    /// How long refused deliveries are kept (zero: none are).
    pub keep_rejected: Duration,
    /// The bytes of refused deliveries kept at most (the oldest go first).
    pub keep_rejected_bytes: u64,
    /// Asking the provider's API what was missed (`[sources.NAME.catchup]`).
    pub catchup: Option<catchup::Catchup>,
}

impl Source {
    /// True when anything about this source reads the body as JSON, so the
    /// body must parse.
    pub fn needs_json(&self) -> bool {
        self.kind.name() == "linear"
            || self
                .kind
                .preset()
                .is_some_and(|p| p.batch.is_some() || p.handshake != presets::Handshake::None)
            || self.batch_items.is_some()
            || !self.hash_without.is_empty()
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

    /// The type rule as text, for `check`.
    pub fn type_rule(&self) -> String {
        match &self.event_type {
            None => "(none)".to_string(),
            Some(first) => std::iter::once(first)
                .chain(&self.event_type_more)
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(" + \".\" + "),
        }
    }

    /// True when a rule reads form fields, so a form body is parsed.
    pub fn reads_form(&self) -> bool {
        self.key.parts.iter().any(Part::reads_form)
            || self.event_type.as_ref().is_some_and(Part::reads_form)
            || self.hash.iter().any(Part::reads_form)
    }

    /// The batch shape of this source's kind, if its deliveries are batches.
    pub fn batch(&self) -> Option<presets::BatchShape<'_>> {
        self.kind.preset().and_then(|p| p.batch).or_else(|| {
            self.batch_items
                .as_deref()
                .map(|items| presets::BatchShape {
                    items,
                    inner: "",
                    delivery_id: None,
                })
        })
    }

    pub fn action(&self, name: &str) -> Option<&Action> {
        self.actions.iter().find(|a| a.name == name)
    }

    /// The hash rule as text, recorded with the key rule.
    pub fn hash_rule(&self) -> String {
        if self.hash.is_empty() && !self.hash_without.is_empty() {
            format!("body without {}", self.hash_without.join(", "))
        } else if self.hash.is_empty() {
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
    Forward(Box<Forward>),
}

#[derive(Debug, Clone)]
pub struct Forward {
    pub url: String,
    pub timeout: Duration,
    /// An optional cap on attempts (no default); `give_up_after` is the
    /// main end of a failing job.
    pub max_attempts: Option<u32>,
    /// A job fails for good once its attempts have failed this long (from
    /// its first failed attempt, less the time it waited on an open
    /// circuit).
    pub give_up_after: Duration,
    /// The action's circuit; None with `circuit_failures = 0`.
    pub circuit: Option<Circuit>,
    pub retry_initial: Duration,
    pub retry_max: Duration,
    pub lease: Duration,
    pub sign_secret: Option<Secret>,
    /// The downstream header recorded as the attempt's request id.
    pub request_id_header: String,
    /// Asked before an attempt whose predecessor's outcome is unknown
    /// (`outbox/ask.rs`).
    pub check: Option<check_template::Template>,
    /// Actions of the same event that must be done before this one is sent.
    pub after: Vec<String>,
    /// Pacing and order of its deliveries.
    pub control: Control,
    /// Headers, auth and TLS of an HTTP forward (and its check).
    pub http: dest::HttpOptions,
    /// Where a broker forward publishes (None: HTTP).
    pub broker: Option<broker::Broker>,
}

impl Forward {
    /// True for an `http://` or `https://` forward (not a broker).
    pub fn is_http(&self) -> bool {
        self.broker.is_none()
    }

    /// The URL as printed: a password in it `[REDACTED]`.
    pub fn url_redacted(&self) -> String {
        database_url::redact(&self.url)
    }
}

/// A forward action's circuit: `failures` consecutive failed attempts
/// open it; while open, one probe at a time, the first `probe` after it
/// opened, doubling up to `retry_max`; `health` is what a probe GETs
/// (None: the oldest waiting job is the probe).
#[derive(Debug, Clone)]
pub struct Circuit {
    pub failures: u32,
    pub probe: Duration,
    pub health: Option<String>,
}

/// A forward action's delivery control: at most `concurrency` attempts in
/// flight, at most `rate` attempt starts per period, jobs of one `order`
/// key one after another, and a job whose `supersede` value is lower than
/// one already delivered for its key not sent.
#[derive(Debug, Clone, Default)]
pub struct Control {
    pub concurrency: Option<u32>,
    pub rate: Option<Rate>,
    pub order: Option<Rule>,
    pub supersede: Option<Part>,
}

impl Control {
    /// True when takes of the action go through its limits row.
    pub fn limited(&self) -> bool {
        self.concurrency.is_some() || self.rate.is_some()
    }
}

/// At most `n` attempt starts per `per` (a second or a minute).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    pub n: u32,
    pub per_ms: i64,
}

impl Rate {
    /// `"N/s"` or `"N/m"`, N at least 1.
    pub fn parse(text: &str) -> Result<Rate, String> {
        let bad = || format!("expected \"N/s\" or \"N/m\" with N at least 1, got {text:?}");
        let (n, unit) = text.trim().split_once('/').ok_or_else(bad)?;
        let n: u32 = n.trim().parse().map_err(|_| bad())?;
        let per_ms = match unit.trim() {
            "s" => 1_000,
            "m" => 60_000,
            _ => return Err(bad()),
        };
        if n == 0 {
            return Err(bad());
        }
        Ok(Rate { n, per_ms })
    }

    /// Milliseconds one attempt start's token takes to come back.
    pub fn interval_ms(&self) -> f64 {
        self.per_ms as f64 / f64::from(self.n)
    }
}
/// The development default that `serve` runs when there is no config file.
pub const DEV_DEFAULT_SECRET: &str = "whsec_ZGV2LXNlY3JldC1mb3ItaWRlbWhvb2stZGVtbw==";

impl Config {
    pub fn source(&self, name: &str) -> Option<&Source> {
        self.sources.iter().find(|s| s.name == name)
    }
}

/// Built-in SQL action parameters.
pub const BUILTIN_PARAMS: [&str; 5] = ["source", "event_id", "type", "payload", "received_at"];

fn is_builtin_param(name: &str) -> bool {
    BUILTIN_PARAMS.contains(&name)
}
