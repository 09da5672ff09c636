//! What `check` warns about in a config that loads: secrets that look
//! like shell variables, unset `env:` variables, retentions shorter than
//! a provider's retries.

use super::Source;
use super::raw::RawConfig;
use super::values::format_duration;

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
pub(super) fn unset_variables(raw: &RawConfig) -> Vec<(String, String)> {
    let needed = super::values::secrets_needed();
    secret_specs(raw)
        .into_iter()
        // Without secrets (an operator command), only `database` counts.
        .filter(|(key, _)| needed || key == "database")
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
pub(super) fn shell_variable_warnings(raw: &RawConfig) -> Vec<String> {
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

pub(super) fn looks_like_shell_variable(spec: &str) -> bool {
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
pub(super) fn retention_warning(source: &Source) -> Option<String> {
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

/// A `file:` secret (admin token, source secrets, `verify_token`,
/// `sign_secret`) that every user on the host may read: named with its
/// key and path, never its content.
pub(super) fn loose_secret_files(raw: &RawConfig, base: &std::path::Path) -> Vec<String> {
    use std::os::unix::fs::PermissionsExt as _;
    let mut specs = secret_specs(raw);
    if let Some(spec) = &raw.admin_token {
        specs.push(("admin_token".to_string(), spec.as_str()));
    }
    for (name, rs) in &raw.sources {
        if let Some(spec) = &rs.verify_token {
            specs.push((format!("sources.{name}.verify_token"), spec.as_str()));
        }
    }
    specs
        .into_iter()
        .filter_map(|(key, spec)| {
            let path = base.join(spec.strip_prefix("file:")?);
            let mode = std::fs::metadata(&path).ok()?.permissions().mode();
            (mode & 0o004 != 0).then(|| {
                format!(
                    "{key}: the secret file {} is readable by every user (mode {:o}): chmod 600 it (or 640 with the service's group)",
                    path.display(),
                    mode & 0o777
                )
            })
        })
        .collect()
}
