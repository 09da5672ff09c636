//! One `[sources.NAME]` table resolved into a [`Source`]: its kind, secrets,
//! key, type and hash rules, retention and actions.

use std::path::Path;
use std::time::Duration;

use super::action::{check_after, resolve_action};
use super::generic;
use super::kind::Kind;
use super::presets::Handshake;
use super::raw::{RawAction, RawSource};
use super::values::{opt_duration, parse_duration, resolve_secret, valid_name};
use super::{Action, OnMismatch, Source};
use crate::config::key_rule::{Part, Rule};
use crate::verify::{Scheme, Verifier};

/// Resolves one source, step by step in the file's order of keys, so the
/// first error named is the one a reader meets first.
pub(super) fn resolve_source(name: &str, mut rs: RawSource, base: &Path) -> Result<Source, String> {
    if !valid_name(name) {
        return Err(
            "name: a source name is 1 to 64 of A-Z a-z 0-9 _ - . (it is a URL path segment)"
                .to_string(),
        );
    }
    let kind = kind_of(&rs)?;
    let scheme = scheme_of(kind, &rs)?;
    let public_url = public_url_of(&scheme, &rs)?;
    let verify_token = verify_token_of(kind, &rs, base)?;
    let mut signing = signing_of(kind, scheme, &rs, base)?;
    signing.verifier = signing.verifier.with_public_url(public_url.clone());
    let (retention, payload_retention) = retentions_of(kind, &rs)?;
    let shape = generic::shape_of(kind, &mut rs)?;
    let (key_parts, event_type, hash) = rules_of(kind, &rs)?;
    let preset = kind.preset();
    let parse_all = |specs: &[&str]| -> Vec<Part> {
        specs.iter().filter_map(|s| Part::parse(s).ok()).collect()
    };
    let event_type_more = match preset {
        Some(p) if rs.event_type.is_none() => parse_all(p.event_type.get(1..).unwrap_or(&[])),
        _ => Vec::new(),
    };
    let key_fallback = match preset {
        Some(p) if rs.key.is_none() && !p.key_fallback.is_empty() => Some(Rule {
            parts: parse_all(p.key_fallback),
        }),
        _ => None,
    };
    let hash_without = match preset {
        Some(p) if rs.hash.is_none() => p.hash_without.to_vec(),
        _ => Vec::new(),
    };
    let listed_hash = preset.map_or_else(Vec::new, |p| {
        p.listed_hash
            .iter()
            .filter_map(|s| Part::parse(s).ok())
            .collect()
    });
    let on_mismatch = on_mismatch_of(&rs)?;
    let (keep_rejected, keep_rejected_bytes) = super::rejected::keep_of(&rs)?;
    let catchup = super::catchup::catchup_of(kind, rs.catchup, base)?;
    let actions = actions_of(rs.actions, base)?;

    Ok(Source {
        name: name.to_string(),
        kind,
        verifier: signing.verifier,
        secret_count: signing.secret_count,
        allow_unsigned: signing.allow_unsigned,
        tolerance: signing.tolerance,
        retention,
        payload_retention,
        key: Rule { parts: key_parts },
        event_type,
        event_type_more,
        key_fallback,
        hash,
        hash_without,
        listed_hash,
        on_mismatch,
        actions,
        public_url,
        verify_token,
        batch_items: shape.batch_items,
        empty_batch: shape.empty_batch,
        answer: shape.answer,
        keep_rejected,
        keep_rejected_bytes,
        catchup,
    })
}

/// `kind`: a built-in kind, or an error listing them (and the names the
/// `standard` kind answers to).
fn kind_of(rs: &RawSource) -> Result<Kind, String> {
    Kind::parse(&rs.kind).ok_or_else(|| {
        let mut names: Vec<&str> = Kind::all().map(|k| k.name()).collect();
        names.extend(["clerk", "resend", "svix"]);
        format!(
            "kind: unknown kind {:?}, expected one of {}",
            rs.kind,
            names.join(", ")
        )
    })
}

/// `verify_token`: required by Meta's GET handshake, refused elsewhere.
fn verify_token_of(
    kind: Kind,
    rs: &RawSource,
    base: &Path,
) -> Result<Option<crate::verify::Secret>, String> {
    match (&rs.verify_token, kind.preset().map(|p| p.handshake)) {
        (Some(spec), Some(Handshake::Meta)) => Ok(Some(
            resolve_secret(spec, base).map_err(|e| format!("verify_token: {e}"))?,
        )),
        (Some(_), _) => Err("verify_token: only sources of kind \"meta\" take this key".to_string()),
        (None, Some(Handshake::Meta)) => Err("verify_token: kind \"meta\" needs the token its GET handshake carries (hub.verify_token)".to_string()),
        (None, _) => Ok(None),
    }
}

/// `on_mismatch`: ack (the default) or reject.
fn on_mismatch_of(rs: &RawSource) -> Result<OnMismatch, String> {
    match rs.on_mismatch.as_deref().unwrap_or("ack") {
        "ack" => Ok(OnMismatch::Ack),
        "reject" => Ok(OnMismatch::Reject),
        other => Err(format!(
            "on_mismatch: expected ack or reject, got {other:?}"
        )),
    }
}

/// `public_url`, required by the kinds whose signature covers the URL.
fn public_url_of(scheme: &Scheme, rs: &RawSource) -> Result<Option<String>, String> {
    match (&rs.public_url, scheme.covers_url()) {
        (None, true) => Err(format!(
            "public_url: kind \"{}\" signs the URL it calls; set public_url to that URL as configured at the provider (https://...)",
            scheme.kind()
        )),
        (Some(_), false) => Err(format!(
            "public_url: kind \"{}\" does not sign the URL, so it takes no public_url",
            scheme.kind()
        )),
        (Some(url), true) => {
            let ok = (url.starts_with("https://") || url.starts_with("http://"))
                && url.len() > "https://".len()
                && !url.contains(char::is_whitespace)
                && !url.contains('#');
            if ok {
                Ok(Some(url.clone()))
            } else {
                Err(format!(
                    "public_url: {url:?} is not an http:// or https:// URL without spaces or #fragment"
                ))
            }
        }
        (None, false) => Ok(None),
    }
}

/// The signature scheme of `kind`; for kind `hmac`, its header, algorithm,
/// encoding and prefix (keys no other kind takes).
fn scheme_of(kind: Kind, rs: &RawSource) -> Result<Scheme, String> {
    let hmac_keys = [
        ("header", rs.header.is_some()),
        ("algorithm", rs.algorithm.is_some()),
        ("encoding", rs.encoding.is_some()),
        ("prefix", rs.prefix.is_some()),
        ("template", rs.template.is_some()),
        ("timestamp_header", rs.timestamp_header.is_some()),
        ("timestamp_format", rs.timestamp_format.is_some()),
        ("secret_encoding", rs.secret_encoding.is_some()),
        ("secret_normalize", rs.secret_normalize.is_some()),
    ];
    // `token` names its header (and a prefix) too.
    let taken = |key: &str| kind == Kind::Token && (key == "header" || key == "prefix");
    if kind != Kind::Hmac
        && let Some((key, _)) = hmac_keys.iter().find(|(key, set)| *set && !taken(key))
    {
        return Err(format!(
            "{key}: only sources of kind \"hmac\" take this key"
        ));
    }
    Ok(match kind {
        Kind::None => Scheme::None,
        Kind::Preset(p) => (p.scheme)(),
        Kind::Hmac => generic::hmac_scheme(rs)?,
        Kind::Basic => generic::basic_scheme(),
        Kind::Token => generic::token_scheme(rs)?,
    })
}

/// How a source's requests are verified.
struct Signing {
    verifier: Verifier,
    secret_count: usize,
    allow_unsigned: bool,
    tolerance: Duration,
}

/// The secrets (none and `allow_unsigned` for kind `none`, at least one
/// otherwise), the timestamp tolerance and the verifier they make.
fn signing_of(kind: Kind, scheme: Scheme, rs: &RawSource, base: &Path) -> Result<Signing, String> {
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
    } else if rs.secrets.is_empty()
        && !matches!(
            kind.preset().map(|p| p.handshake),
            Some(Handshake::Asana | Handshake::Notion)
        )
    {
        return Err("secrets: at least one secret is needed".to_string());
    }
    let mut secrets = Vec::new();
    for (i, spec) in rs.secrets.iter().enumerate() {
        let secret = resolve_secret(spec, base).map_err(|e| format!("secrets[{i}]: {e}"))?;
        generic::check_secret(kind, secret.expose()).map_err(|e| format!("secrets[{i}]: {e}"))?;
        secrets.push(secret);
    }
    let secret_count = secrets.len();
    let default_tolerance = kind
        .preset()
        .and_then(|p| p.tolerance_secs)
        .map_or_else(|| "5m".to_string(), |s| format!("{s}s"));
    let tolerance = opt_duration(&rs.tolerance, "tolerance", &default_tolerance)?;
    // An operator command's load resolves no secret: its sources verify
    // nothing (it never receives a delivery).
    let verifier = if super::values::secrets_needed() {
        Verifier::new(scheme, secrets, tolerance)
    } else {
        Verifier::new(crate::verify::Scheme::None, Vec::new(), tolerance)
    }
    .map_err(|e| format!("secrets: {e}"))?;
    Ok(Signing {
        verifier,
        secret_count,
        allow_unsigned,
        tolerance,
    })
}

/// How long the key is kept, and the body (never longer than the key).
fn retentions_of(kind: Kind, rs: &RawSource) -> Result<(Duration, Duration), String> {
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
    Ok((retention, payload_retention))
}

/// The key's parts, the event type's part and the hash's parts, each the
/// kind's default unless the source sets it.
type Rules = (Vec<Part>, Option<Part>, Vec<Part>);

fn rules_of(kind: Kind, rs: &RawSource) -> Result<Rules, String> {
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
        None => kind.default_hash(),
    };
    Ok((key_parts, event_type, hash))
}

/// The source's actions, names unique, and `after` checked across them.
fn actions_of(raw: Vec<RawAction>, base: &Path) -> Result<Vec<Action>, String> {
    let mut actions: Vec<Action> = Vec::new();
    for (i, ra) in raw.into_iter().enumerate() {
        let action_name = ra.name.clone();
        if actions.iter().any(|a| a.name == action_name) {
            return Err(format!("actions[{i}].name: {action_name:?} is used twice"));
        }
        actions.push(
            resolve_action(ra, base).map_err(|e| format!("actions[{i}] ({action_name}).{e}"))?,
        );
    }
    check_after(&actions)?;
    Ok(actions)
}

fn parse_parts(specs: &[String]) -> Result<Vec<Part>, String> {
    specs.iter().map(|s| Part::parse(s)).collect()
}
