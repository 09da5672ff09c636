//! One `[sources.NAME]` table resolved into a [`Source`]: its kind, secrets,
//! key, type and hash rules, retention and actions.

use std::path::Path;
use std::time::Duration;

use super::action::{check_after, resolve_action};
use super::kind::Kind;
use super::presets::Handshake;
use super::raw::{RawAction, RawSource};
use super::values::{opt_duration, parse_duration, resolve_secret, valid_name};
use super::{Action, OnMismatch, Source};
use crate::key::{Part, Rule};
use crate::verify::rule::{
    Alg, Carrier, Piece, SignedRule, TimeFormat, TimeFrom, Timestamp, Window,
};
use crate::verify::{Encoding, HmacAlgorithm, HmacParams, Scheme, Verifier};

/// Resolves one source, step by step in the file's order of keys, so the
/// first error named is the one a reader meets first.
pub(super) fn resolve_source(name: &str, rs: RawSource, base: &Path) -> Result<Source, String> {
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
        on_mismatch,
        actions,
        public_url,
        verify_token,
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
    ];
    if kind != Kind::Hmac
        && let Some((key, _)) = hmac_keys.iter().find(|(_, set)| *set)
    {
        return Err(format!(
            "{key}: only sources of kind \"hmac\" take this key"
        ));
    }
    Ok(match kind {
        Kind::Stripe => Scheme::Stripe,
        Kind::Github => Scheme::Github,
        Kind::Shopify => Scheme::Shopify,
        Kind::Slack => Scheme::Slack,
        Kind::Paddle => Scheme::Paddle,
        Kind::Linear => Scheme::Linear,
        Kind::Standard => Scheme::Standard,
        Kind::None => Scheme::None,
        Kind::Preset(p) => (p.scheme)(),
        Kind::Hmac if rs.template.is_some() || rs.timestamp_header.is_some() => {
            hmac_template(hmac_params(rs)?, rs)?
        }
        Kind::Hmac => Scheme::Hmac(hmac_params(rs)?),
    })
}

/// Kind `hmac` with a `template` of the signed content: `{body}`,
/// `{timestamp}` (from `timestamp_header`, checked against `tolerance`),
/// `{url}` (`public_url`), `{method}`, `{header:Name}` and literal text.
fn hmac_template(params: HmacParams, rs: &RawSource) -> Result<Scheme, String> {
    let template = rs.template.as_deref().unwrap_or("{body}");
    let mut message = Vec::new();
    let mut rest = template;
    while !rest.is_empty() {
        match rest.find('{') {
            Some(0) => {
                let end = rest
                    .find('}')
                    .ok_or_else(|| format!("template: {template:?} has a {{ without its }}"))?;
                let name = &rest[1..end];
                message.push(match name {
                    "body" => Piece::Body,
                    "timestamp" => Piece::Timestamp,
                    "url" => Piece::Url,
                    "method" => Piece::Method,
                    other => match other.strip_prefix("header:") {
                        Some(h) if !h.is_empty() => Piece::Header(h.to_string()),
                        _ => {
                            return Err(format!(
                                "template: unknown placeholder {{{other}}}; use {{body}}, {{timestamp}}, {{url}}, {{method}} or {{header:Name}}"
                            ));
                        }
                    },
                });
                rest = &rest[end + 1..];
            }
            Some(i) => {
                message.push(Piece::Text(rest[..i].to_string()));
                rest = &rest[i..];
            }
            None => {
                message.push(Piece::Text(rest.to_string()));
                rest = "";
            }
        }
    }
    if !message.contains(&Piece::Body) {
        return Err(format!("template: {template:?} does not sign {{body}}"));
    }
    let format: TimeFormat = match &rs.timestamp_format {
        Some(f) => f.parse().map_err(|e| format!("timestamp_format: {e}"))?,
        None => TimeFormat::Unix,
    };
    let timestamp = match (&rs.timestamp_header, message.contains(&Piece::Timestamp)) {
        (Some(h), true) => Some(Timestamp {
            from: TimeFrom::Header(h.clone()),
            format,
            window: Window::Both,
        }),
        (None, true) => {
            return Err(
                "timestamp_header: the template signs {timestamp}; name the header it comes in"
                    .to_string(),
            );
        }
        (Some(_), false) => {
            return Err("timestamp_header: the template does not sign {timestamp}, so a timestamp header would not be verified".to_string());
        }
        (None, false) => None,
    };
    Ok(Scheme::Rule {
        kind: "hmac",
        rule: Box::new(SignedRule {
            alg: Alg::Hmac(params.algorithm),
            encoding: params.encoding,
            message,
            carrier: Carrier::Header {
                name: params.header,
                prefix: params.prefix,
                list: None,
            },
            timestamp,
            hex_key: false,
            escaped_body: false,
            require: Vec::new(),
        }),
    })
}

fn hmac_params(rs: &RawSource) -> Result<HmacParams, String> {
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
    Ok(HmacParams {
        header,
        algorithm,
        encoding,
        prefix,
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
        secrets.push(resolve_secret(spec, base).map_err(|e| format!("secrets[{i}]: {e}"))?);
    }
    let secret_count = secrets.len();
    let default_tolerance = kind
        .preset()
        .and_then(|p| p.tolerance_secs)
        .map_or_else(|| "5m".to_string(), |s| format!("{s}s"));
    let tolerance = opt_duration(&rs.tolerance, "tolerance", &default_tolerance)?;
    let verifier =
        Verifier::new(scheme, secrets, tolerance).map_err(|e| format!("secrets: {e}"))?;
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
