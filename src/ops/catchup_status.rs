//! The catch-up part of `reconcile` (`catchup` in its JSON, and
//! `GET /api/reconcile`): per source with a catchup table, its settings
//! and what its last run found.

use std::fmt::Write as _;

use serde_json::{Value, json};

use super::error::OpError;
use super::text::{clean, fmt_json_time};
use crate::config::Config;
use crate::config::catchup::Provider;
use crate::store::catchup::last_runs;
use crate::store::db::Db;
use crate::time::ms_to_secs;

/// `[{source, provider, interval, window, last_run_at, window_from,
/// claimed, redelivery_requested, already_stored, error, next_run_after}]`
/// (times in unix seconds; null before a first run).
pub fn status(db: &Db<'_>, config: &Config) -> Result<Value, OpError> {
    let runs = last_runs(db)?;
    let secs = |ms: Option<i64>| ms.map_or(Value::Null, |ms| json!(ms_to_secs(ms)));
    let items = config
        .sources
        .iter()
        .filter_map(|s| Some((s, s.catchup.as_ref()?)))
        .map(|(s, c)| {
            let run = runs.iter().find(|r| r.source == s.name);
            json!({
                "source": s.name,
                "provider": match c.provider {
                    Provider::Stripe => "stripe",
                    Provider::Github => "github",
                },
                "interval": crate::config::format_duration(c.interval),
                "window": crate::config::format_duration(c.window),
                "last_run_at": secs(run.and_then(|r| r.last_run_at)),
                "window_from": secs(run.and_then(|r| r.window_from)),
                "claimed": run.map_or(0, |r| r.claimed),
                "redelivery_requested": run.map_or(0, |r| r.redelivery_requested),
                "already_stored": run.map_or(0, |r| r.already_stored),
                "error": run.and_then(|r| r.error.clone()),
                "next_run_after": secs(run.and_then(|r| r.next_run_after)),
            })
        })
        .collect();
    Ok(Value::Array(items))
}

/// The text lines of `idemhook reconcile` (nothing without a catchup
/// table).
pub fn render(status: &Value) -> String {
    let mut out = String::new();
    for s in status.as_array().map(Vec::as_slice).unwrap_or_default() {
        let source = clean(s["source"].as_str().unwrap_or(""));
        if s["last_run_at"].is_null() {
            let _ = writeln!(out, "catchup {source}: no run yet");
            continue;
        }
        let _ = write!(
            out,
            "catchup {source}: last run {}: {} claimed, {} redelivery requested, {} already stored",
            fmt_json_time(&s["last_run_at"]),
            s["claimed"],
            s["redelivery_requested"],
            s["already_stored"]
        );
        match s["error"].as_str() {
            Some(e) => {
                let _ = writeln!(out, "; error: {}", clean(e));
            }
            None => out.push('\n'),
        }
    }
    out
}
