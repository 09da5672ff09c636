//! Values written the same way under many keys: secret specs (`env:`,
//! `file:`, literal), durations (`30d`, `500ms`) and names.

use std::path::Path;
use std::time::Duration;

use crate::verify::Secret;

thread_local! {
    /// Whether the config being loaded on this thread resolves its
    /// secrets: off for the operator commands (`events`, `reconcile`, ...),
    /// which verify nothing and send nothing signed.
    static SECRETS_NEEDED: std::cell::Cell<bool> = const { std::cell::Cell::new(true) };
}

/// Runs `load` (a config load) with its webhook, forward and notify
/// secrets left unresolved: an `env:` variable may be unset and a `file:`
/// unreadable, and no source verifies anything. Only `serve`, `check`,
/// `send` (and the commands that verify or send) resolve secrets.
pub fn without_secrets<T>(load: impl FnOnce() -> T) -> T {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            SECRETS_NEEDED.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(SECRETS_NEEDED.with(|c| c.replace(false)));
    load()
}

/// Whether secrets are resolved by the load under way (see
/// [`without_secrets`]).
pub(super) fn secrets_needed() -> bool {
    SECRETS_NEEDED.with(std::cell::Cell::get)
}

/// What an unresolved secret holds in a load [`without_secrets`]: never
/// used, as such a config verifies and signs nothing.
const UNRESOLVED: &str = "(not resolved: this command uses no secret)";

/// Resolves a secret spec: a literal, `env:NAME` or `file:PATH` (relative to
/// `base`, trailing newline trimmed). Errors never contain the secret.
pub fn resolve_secret(spec: &str, base: &Path) -> Result<Secret, String> {
    if !secrets_needed() && (spec.starts_with("env:") || spec.starts_with("file:")) {
        return Ok(Secret::new(UNRESOLVED.to_string()));
    }
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

/// A source or action name: 1 to 64 of `A-Z a-z 0-9 _ - .`.
pub(super) fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
}

pub(super) fn nonzero(d: Result<Duration, String>, key: &str) -> Result<Duration, String> {
    match d {
        Ok(d) if d.is_zero() => Err(format!("{key}: must be longer than 0s")),
        other => other,
    }
}

pub(super) fn opt_duration(
    value: &Option<String>,
    key: &str,
    default: &str,
) -> Result<Duration, String> {
    parse_duration(value.as_deref().unwrap_or(default)).map_err(|e| format!("{key}: {e}"))
}
