//! One action of a source resolved into an [`Action`] (SQL or forward,
//! with its retry, lease, check and `after`), and the check that `after`
//! never names itself around a cycle.

use std::path::Path;
use std::time::Duration;

use super::raw::RawAction;
use super::values::{format_duration, opt_duration, parse_duration, resolve_secret, valid_name};
use super::{Action, ActionKind, Circuit, Control, Forward, Rate, is_builtin_param};
use crate::config::key_rule::{Part, Rule};

pub(super) fn resolve_action(mut ra: RawAction, base: &Path) -> Result<Action, String> {
    if !valid_name(&ra.name) {
        return Err("name: an action name is 1 to 64 of A-Z a-z 0-9 _ - .".to_string());
    }
    let types = ra.types.take().unwrap_or_default();
    let kind = match (ra.sql.take(), ra.forward.take()) {
        (Some(_), Some(_)) => {
            return Err("sql: an action has either sql or forward, not both".to_string());
        }
        (None, None) => {
            return Err(
                "sql: an action needs sql = \"...\" or forward = \"http://...\"".to_string(),
            );
        }
        (Some(sql), None) => sql_action(sql, &mut ra)?,
        (None, Some(url)) => forward_action(url, &mut ra, base)?,
    };
    Ok(Action {
        name: ra.name,
        types,
        kind,
    })
}

/// An SQL action: its statement and `params`; no forward action's keys.
fn sql_action(sql: String, ra: &mut RawAction) -> Result<ActionKind, String> {
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
        ("concurrency", ra.concurrency.is_some()),
        ("rate", ra.rate.is_some()),
        ("order", ra.order.is_some()),
        ("supersede", ra.supersede.is_some()),
        ("give_up_after", ra.give_up_after.is_some()),
        ("circuit_failures", ra.circuit_failures.is_some()),
        ("circuit_probe", ra.circuit_probe.is_some()),
        ("health", ra.health.is_some()),
        ("headers", ra.headers.is_some()),
        ("auth", ra.auth.is_some()),
        ("tls_ca", ra.tls_ca.is_some()),
        ("tls_client_cert", ra.tls_client_cert.is_some()),
        ("tls_client_key", ra.tls_client_key.is_some()),
    ];
    if let Some((key, _)) = forward_only.iter().find(|(_, set)| *set) {
        return Err(format!("{key}: only forward actions take this key"));
    }
    if sql.trim().is_empty() {
        return Err("sql: the statement is empty".to_string());
    }
    if let Some(word) = ends_transaction(&sql) {
        return Err(format!(
            "sql: {word} would end or cut the claim's transaction, which the action runs inside (with the claim's other steps): an action is plain statements"
        ));
    }
    let mut params = Vec::new();
    for (name, spec) in ra.params.take().unwrap_or_default() {
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
    Ok(ActionKind::Sql { sql, params })
}

/// Words that start a statement of transaction control.
const CONTROL: [&str; 9] = [
    "BEGIN",
    "COMMIT",
    "ROLLBACK",
    "END",
    "START",
    "ABORT",
    "SAVEPOINT",
    "RELEASE",
    "PREPARE",
];

/// The transaction control a statement of `sql` starts with, if any
/// (`BEGIN`, `COMMIT`, `ROLLBACK`, ...): the first word of each statement,
/// string literals, quoted names, dollar-quoted bodies and comments
/// skipped, so a `;` or a word inside them does not count.
fn ends_transaction(sql: &str) -> Option<String> {
    let b = sql.as_bytes();
    let mut i = 0;
    let mut at_start = true;
    while i < b.len() {
        let c = b[i];
        match c {
            b'\'' | b'"' => {
                i += 1;
                while i < b.len() && b[i] != c {
                    i += 1;
                }
                i += 1;
                at_start = false;
            }
            b'-' if b.get(i + 1) == Some(&b'-') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                i += 2;
                while i + 1 < b.len() && !(b[i] == b'*' && b[i + 1] == b'/') {
                    i += 1;
                }
                i += 2;
            }
            b'$' => {
                i = past_dollar(sql, i);
                at_start = false;
            }
            b';' => {
                at_start = true;
                i += 1;
            }
            c if c.is_ascii_whitespace() || c == b'(' => i += 1,
            c if at_start && c.is_ascii_alphabetic() => {
                let end = sql[i..]
                    .find(|ch: char| !ch.is_ascii_alphabetic())
                    .map_or(sql.len(), |e| i + e);
                if let Some(word) = control_word(sql, i, end) {
                    return Some(word);
                }
                at_start = false;
                i = end;
            }
            _ => {
                at_start = false;
                i += 1;
            }
        }
    }
    None
}

/// The index just past what a `$` at `i` starts: a `$tag$ ... $tag$`
/// body (PostgreSQL; to the end when it is not closed), or the `$` alone.
fn past_dollar(sql: &str, i: usize) -> usize {
    let tag_end = sql[i + 1..].find('$').map(|e| i + 1 + e);
    match tag_end {
        Some(e)
            if sql[i + 1..e]
                .bytes()
                .all(|t| t.is_ascii_alphanumeric() || t == b'_') =>
        {
            let tag = &sql[i..=e];
            sql[e + 1..]
                .find(tag)
                .map_or(sql.len(), |f| e + 1 + f + tag.len())
        }
        _ => i + 1,
    }
}

/// The statement's first word, `sql[start..end]`, in capitals, when it is
/// transaction control.
fn control_word(sql: &str, start: usize, end: usize) -> Option<String> {
    let word = sql[start..end].to_ascii_uppercase();
    if !CONTROL.contains(&word.as_str()) {
        return None;
    }
    // PREPARE name AS ... is a prepared statement; PREPARE
    // TRANSACTION ends the transaction.
    let next = sql[end..].trim_start().to_ascii_uppercase();
    (word != "PREPARE" || next.starts_with("TRANSACTION")).then_some(word)
}

/// A forward action: its URL, timeout and lease (the lease outlasts an
/// attempt, twice over with a `check`), retries, signing, check and
/// `after`.
fn forward_action(url: String, ra: &mut RawAction, base: &Path) -> Result<ActionKind, String> {
    if ra.params.is_some() {
        return Err("params: only sql actions take params".to_string());
    }
    let broker = if url.starts_with("http://") || url.starts_with("https://") {
        None
    } else {
        let broker = super::broker::parse(&url)?;
        let http_only = [
            ("check", ra.check.is_some()),
            ("health", ra.health.is_some()),
            ("sign_secret", ra.sign_secret.is_some()),
            ("headers", ra.headers.is_some()),
            ("auth", ra.auth.is_some()),
            ("tls_ca", ra.tls_ca.is_some()),
            ("tls_client_cert", ra.tls_client_cert.is_some()),
            ("tls_client_key", ra.tls_client_key.is_some()),
        ];
        if let Some((key, _)) = http_only.iter().find(|(_, set)| *set) {
            return Err(format!(
                "{key}: only http:// and https:// forwards take this key (this one publishes to a broker)"
            ));
        }
        Some(broker)
    };
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
            Some(super::check_template::Template::parse(text).map_err(|e| format!("check: {e}"))?)
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
    if ra.max_attempts == Some(0) {
        return Err("max_attempts: must be at least 1".to_string());
    }
    let max_attempts = ra.max_attempts;
    let give_up_after = opt_duration(&ra.give_up_after, "give_up_after", "72h")?;
    if give_up_after < lease {
        return Err(format!(
            "give_up_after: must not be shorter than lease ({} < {}): a job would fail for good within one attempt's hold",
            format_duration(give_up_after),
            format_duration(lease)
        ));
    }
    let circuit = circuit_of(ra, retry_max)?;
    let sign_secret = match &ra.sign_secret {
        Some(spec) => Some(resolve_secret(spec, base).map_err(|e| format!("sign_secret: {e}"))?),
        None => None,
    };
    Ok(ActionKind::Forward(Box::new(Forward {
        url,
        timeout,
        max_attempts,
        give_up_after,
        circuit,
        retry_initial,
        retry_max,
        lease,
        sign_secret,
        request_id_header: ra
            .request_id_header
            .take()
            .unwrap_or_else(|| "X-Request-Id".to_string()),
        check,
        after: ra.after.take().unwrap_or_default(),
        control: control_of(ra)?,
        http: super::dest::http_options(ra, base)?,
        broker,
    })))
}

/// `circuit_failures`, `circuit_probe` and `health`: the action's circuit
/// (None with `circuit_failures = 0`).
fn circuit_of(ra: &RawAction, retry_max: Duration) -> Result<Option<Circuit>, String> {
    let failures = match ra.circuit_failures {
        None => 5,
        Some(n) if n < 0 => {
            return Err(format!(
                "circuit_failures: consecutive failed attempts that open the circuit, 0 for no circuit; got {n}"
            ));
        }
        Some(n) => u32::try_from(n)
            .map_err(|_| format!("circuit_failures: at most {}, got {n}", u32::MAX))?,
    };
    let probe = opt_duration(&ra.circuit_probe, "circuit_probe", "30s")?;
    if probe.is_zero() {
        return Err("circuit_probe: must be longer than 0s".to_string());
    }
    let health = match &ra.health {
        None => None,
        Some(url) if url.starts_with("http://") || url.starts_with("https://") => Some(url.clone()),
        Some(url) => {
            return Err(format!(
                "health: expected an http:// or https:// URL, got {url:?}"
            ));
        }
    };
    if failures == 0 {
        return Ok(None);
    }
    Ok(Some(Circuit {
        failures,
        probe: probe.min(retry_max),
        health,
    }))
}

/// `concurrency`, `rate`, `order` and `supersede`: how a forward action's
/// deliveries are paced and ordered.
fn control_of(ra: &RawAction) -> Result<Control, String> {
    let concurrency = match ra.concurrency {
        None => None,
        Some(n) if (1..=10_000).contains(&n) => Some(n as u32),
        Some(n) => {
            return Err(format!(
                "concurrency: at least 1 attempt in flight at once (at most 10000), got {n}"
            ));
        }
    };
    let rate = match &ra.rate {
        None => None,
        Some(text) => Some(Rate::parse(text).map_err(|e| format!("rate: {e}"))?),
    };
    let order = match &ra.order {
        None => None,
        Some(parts) if parts.is_empty() => {
            return Err(
                "order: needs at least one part, e.g. [\"json:/data/object/id\"]".to_string(),
            );
        }
        Some(parts) => Some(Rule {
            parts: parts
                .iter()
                .map(|p| Part::parse(p))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("order: {e}"))?,
        }),
    };
    let supersede = match (&ra.supersede, &order) {
        (None, _) => None,
        (Some(_), None) => {
            return Err(
                "supersede: only with order (a job is superseded by a later one of its order key)"
                    .to_string(),
            );
        }
        (Some(spec), Some(_)) => Some(Part::parse(spec).map_err(|e| format!("supersede: {e}"))?),
    };
    Ok(Control {
        concurrency,
        rate,
        order,
        supersede,
    })
}

/// Checks every forward action's `after`: it names other actions of the
/// same source, each once, and following the names never comes back to
/// where it started (a cycle would wait forever).
pub(super) fn check_after(actions: &[Action]) -> Result<(), String> {
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
