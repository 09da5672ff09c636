//! The file as written: the TOML's tables and keys, deserialized with
//! unknown keys refused, before anything is resolved.

use std::collections::BTreeMap;

use serde::Deserialize;

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    pub(super) listen: Option<String>,
    pub(super) database: Option<String>,
    pub(super) durability: Option<String>,
    pub(super) admin_token: Option<String>,
    pub(super) max_body_bytes: Option<u64>,
    pub(super) http_workers: Option<usize>,
    pub(super) forward_workers: Option<usize>,
    pub(super) prune_interval: Option<String>,
    pub(super) busy_timeout: Option<String>,
    pub(super) sql_timeout: Option<String>,
    pub(super) pg_schema: Option<String>,
    pub(super) setup_sql: Option<String>,
    pub(super) tls_cert: Option<String>,
    pub(super) tls_key: Option<String>,
    pub(super) admin_listen: Option<String>,
    pub(super) max_connections: Option<usize>,
    pub(super) max_connections_per_address: Option<usize>,
    pub(super) min_receive_rate: Option<u64>,
    pub(super) header_timeout: Option<String>,
    pub(super) body_timeout: Option<String>,
    pub(super) idle_timeout: Option<String>,
    pub(super) max_batch_items: Option<usize>,
    pub(super) public_origin: Option<String>,
    #[serde(default)]
    pub(super) sources: BTreeMap<String, RawSource>,
    pub(super) coalesce: Option<String>,
    pub(super) ui_url: Option<String>,
    #[serde(default)]
    pub(super) notify: Vec<RawNotify>,
}

/// One `[[notify]]` target as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawNotify {
    pub(super) name: Option<String>,
    pub(super) slack: Option<String>,
    pub(super) webhook: Option<String>,
    pub(super) sign_secret: Option<String>,
    pub(super) email: Option<RawEmail>,
    pub(super) on: Option<Vec<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawEmail {
    pub(super) smtp: Option<String>,
    pub(super) from: Option<String>,
    pub(super) to: Option<Vec<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSource {
    pub(super) kind: String,
    #[serde(default)]
    pub(super) secrets: Vec<String>,
    pub(super) tolerance: Option<String>,
    pub(super) retention: Option<String>,
    pub(super) payload_retention: Option<String>,
    pub(super) key: Option<Vec<String>>,
    #[serde(rename = "type")]
    pub(super) event_type: Option<String>,
    pub(super) hash: Option<Vec<String>>,
    pub(super) on_mismatch: Option<String>,
    pub(super) allow_unsigned: Option<bool>,
    // kind = "hmac"
    pub(super) header: Option<String>,
    pub(super) algorithm: Option<String>,
    pub(super) encoding: Option<String>,
    pub(super) prefix: Option<String>,
    pub(super) template: Option<String>,
    pub(super) timestamp_header: Option<String>,
    pub(super) timestamp_format: Option<String>,
    // kinds that sign the URL (and `hmac` with {url})
    pub(super) public_url: Option<String>,
    // kind = "meta"
    pub(super) verify_token: Option<String>,
    // kind = "hmac": how a secret's text becomes key bytes
    pub(super) secret_encoding: Option<String>,
    pub(super) secret_normalize: Option<String>,
    // batches and answers, on any kind
    pub(super) batch: Option<String>,
    pub(super) item_key: Option<Vec<String>>,
    pub(super) item_type: Option<String>,
    pub(super) empty_batch: Option<String>,
    pub(super) answer: Option<String>,
    #[serde(default)]
    pub(super) actions: Vec<RawAction>,
    // refused deliveries kept for `reingest`
    pub(super) keep_rejected: Option<String>,
    pub(super) keep_rejected_bytes: Option<String>,
    // asking the provider's API what was missed
    pub(super) catchup: Option<super::catchup::RawCatchup>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAction {
    pub(super) name: String,
    pub(super) types: Option<Vec<String>>,
    pub(super) sql: Option<String>,
    pub(super) params: Option<BTreeMap<String, String>>,
    pub(super) forward: Option<String>,
    pub(super) timeout: Option<String>,
    pub(super) max_attempts: Option<u32>,
    pub(super) retry_initial: Option<String>,
    pub(super) retry_max: Option<String>,
    pub(super) lease: Option<String>,
    pub(super) sign_secret: Option<String>,
    pub(super) request_id_header: Option<String>,
    pub(super) check: Option<String>,
    pub(super) after: Option<Vec<String>>,
    pub(super) concurrency: Option<i64>,
    pub(super) rate: Option<String>,
    pub(super) order: Option<Vec<String>>,
    pub(super) supersede: Option<String>,
    pub(super) give_up_after: Option<String>,
    pub(super) circuit_failures: Option<i64>,
    pub(super) circuit_probe: Option<String>,
    pub(super) health: Option<String>,
    // forward destinations: HTTP headers, auth and TLS (`dest.rs`)
    pub(super) headers: Option<BTreeMap<String, String>>,
    pub(super) auth: Option<RawAuth>,
    pub(super) tls_ca: Option<String>,
    pub(super) tls_client_cert: Option<String>,
    pub(super) tls_client_key: Option<String>,
}

/// `auth = { basic = ".." }` or `auth = { oauth2 = { .. } }`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAuth {
    pub(super) basic: Option<String>,
    pub(super) oauth2: Option<RawOAuth2>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawOAuth2 {
    pub(super) token_url: String,
    pub(super) client_id: String,
    pub(super) client_secret: String,
    pub(super) scope: Option<String>,
}
