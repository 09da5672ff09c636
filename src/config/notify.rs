//! `[[notify]]` targets, `coalesce` and `ui_url`, resolved: each target's
//! one kind (slack, webhook, email), its secret URL read, the conditions
//! it wants ([`Condition`], the words of `on = [...]`). Sending is
//! `notify/`'s.

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use super::raw::{RawConfig, RawNotify};
use super::values::{opt_duration, resolve_secret};
use crate::verify::{Secret, Verifier};

/// What a target can be told about (`on = [...]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Condition {
    DeadLetter,
    CircuitOpen,
    CircuitClosed,
    SignatureFailures,
    Mismatch,
    StorageUnavailable,
    Catchup,
    Rejected,
}

impl Condition {
    pub const ALL: [Condition; 8] = [
        Condition::DeadLetter,
        Condition::CircuitOpen,
        Condition::CircuitClosed,
        Condition::SignatureFailures,
        Condition::Mismatch,
        Condition::StorageUnavailable,
        Condition::Catchup,
        Condition::Rejected,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Condition::DeadLetter => "dead_letter",
            Condition::CircuitOpen => "circuit_open",
            Condition::CircuitClosed => "circuit_closed",
            Condition::SignatureFailures => "signature_failures",
            Condition::Mismatch => "mismatch",
            Condition::StorageUnavailable => "storage_unavailable",
            Condition::Catchup => "catchup",
            Condition::Rejected => "rejected",
        }
    }

    /// How a window's message names several of them ("3 more dead letters").
    pub fn plural(self) -> &'static str {
        match self {
            Condition::DeadLetter => "dead letters",
            Condition::CircuitOpen => "circuit openings",
            Condition::CircuitClosed => "circuit closings",
            Condition::SignatureFailures => "signature failure alerts",
            Condition::Mismatch => "payload mismatches",
            Condition::StorageUnavailable => "storage alerts",
            Condition::Catchup => "catch-up findings",
            Condition::Rejected => "rejected delivery alerts",
        }
    }
}

impl FromStr for Condition {
    type Err = ();
    fn from_str(s: &str) -> Result<Condition, ()> {
        Condition::ALL
            .into_iter()
            .find(|c| c.as_str() == s)
            .ok_or(())
    }
}

/// The Standard Webhooks signer of a `sign_secret` (also how the config
/// checks it; `notify/send.rs` signs with it).
pub fn signer(secret: &Secret) -> Result<Verifier, String> {
    Verifier::new(
        crate::config::presets::standard(),
        vec![secret.clone()],
        Duration::from_secs(300),
    )
    .map_err(|e| e.to_string())
}

/// Everything about notifications: no targets means none are ever written.
#[derive(Debug, Default)]
pub struct NotifySettings {
    pub targets: Vec<NotifyTarget>,
    /// At most one message per (target, condition, source, action) per
    /// this window; what happens later in it goes as one message at its end.
    pub coalesce: Duration,
    /// The inspector's address, for links in messages.
    pub ui_url: Option<String>,
}

impl NotifySettings {
    /// True when some target wants `condition` (nothing else to do when
    /// none does).
    pub fn wants(&self, condition: Condition) -> bool {
        self.targets.iter().any(|t| t.on.contains(&condition))
    }

    pub fn target(&self, name: &str) -> Option<&NotifyTarget> {
        self.targets.iter().find(|t| t.name == name)
    }
}

#[derive(Debug)]
pub struct NotifyTarget {
    pub name: String,
    pub kind: TargetKind,
    pub on: Vec<Condition>,
}

/// Where a target's messages go. The URLs hold credentials: they are
/// [`Secret`]s, printed only through [`redact_url`].
#[derive(Debug)]
pub enum TargetKind {
    Slack(Secret),
    Webhook {
        url: Secret,
        sign_secret: Option<Secret>,
    },
    Email {
        smtp: Secret,
        from: String,
        to: Vec<String>,
    },
}

impl TargetKind {
    pub fn name(&self) -> &'static str {
        match self {
            TargetKind::Slack(_) => "slack",
            TargetKind::Webhook { .. } => "webhook",
            TargetKind::Email { .. } => "email",
        }
    }

    /// What `check` prints: the kind and its URL's scheme and host only.
    pub fn describe(&self) -> String {
        match self {
            TargetKind::Slack(url) => format!("slack {}", redact_url(url.expose())),
            TargetKind::Webhook { url, sign_secret } => format!(
                "webhook {}{}",
                redact_url(url.expose()),
                if sign_secret.is_some() {
                    " (signed)"
                } else {
                    ""
                }
            ),
            TargetKind::Email { smtp, from, to } => format!(
                "email {} from {from} to {}",
                redact_url(smtp.expose()),
                to.join(", ")
            ),
        }
    }
}

/// A URL as `scheme://host[:port]/[REDACTED]`: its credentials, path and
/// query (a Slack webhook's secret is its path) never printed.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "[REDACTED]".to_string();
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host = authority.rsplit('@').next().unwrap_or("");
    format!("{scheme}://{host}/[REDACTED]")
}

pub(super) fn notify_of(raw: &RawConfig, base: &Path) -> Result<NotifySettings, String> {
    let coalesce = opt_duration(&raw.coalesce, "coalesce", "5m")?;
    if let Some(ui) = &raw.ui_url
        && !(ui.starts_with("http://") || ui.starts_with("https://"))
    {
        return Err(format!("ui_url: expected an http(s) URL, got {ui:?}"));
    }
    let mut targets: Vec<NotifyTarget> = Vec::new();
    for (i, rn) in raw.notify.iter().enumerate() {
        let at = match &rn.name {
            Some(name) => format!("notify[{i}] ({name})"),
            None => format!("notify[{i}]"),
        };
        let target = target_of(rn, base).map_err(|m| format!("{at}.{m}"))?;
        if targets.iter().any(|t| t.name == target.name) {
            return Err(format!("{at}.name: another [[notify]] has this name"));
        }
        targets.push(target);
    }
    Ok(NotifySettings {
        targets,
        coalesce,
        ui_url: raw
            .ui_url
            .as_ref()
            .map(|u| u.trim_end_matches('/').to_string()),
    })
}

fn target_of(rn: &RawNotify, base: &Path) -> Result<NotifyTarget, String> {
    let name = rn
        .name
        .clone()
        .ok_or("name: each [[notify]] needs a name")?;
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    {
        return Err(format!(
            "name: letters, digits, '-', '_' and '.' only, got {name:?}"
        ));
    }
    let given = [rn.slack.is_some(), rn.webhook.is_some(), rn.email.is_some()];
    match given.iter().filter(|g| **g).count() {
        0 => {
            return Err("slack, webhook or email: each [[notify]] needs exactly one target".into());
        }
        1 => {}
        _ => {
            return Err(
                "slack, webhook, email: give exactly one target per [[notify]] (make another [[notify]] for the second)"
                    .into(),
            );
        }
    }
    if rn.sign_secret.is_some() && rn.webhook.is_none() {
        return Err("sign_secret: only a webhook target is signed".into());
    }
    let url = |key: &str, spec: &str, schemes: &[&str]| -> Result<Secret, String> {
        let secret = resolve_secret(spec, base).map_err(|e| format!("{key}: {e}"))?;
        let ok = schemes
            .iter()
            .any(|s| secret.expose().starts_with(&format!("{s}://")));
        if !ok {
            // The value may be a secret: named by its scheme only.
            return Err(format!("{key}: expected a {} URL", schemes.join(" or ")));
        }
        Ok(secret)
    };
    let kind = if let Some(spec) = &rn.slack {
        TargetKind::Slack(url("slack", spec, &["https", "http"])?)
    } else if let Some(spec) = &rn.webhook {
        let sign_secret = match &rn.sign_secret {
            Some(s) => {
                let secret = resolve_secret(s, base).map_err(|e| format!("sign_secret: {e}"))?;
                signer(&secret).map_err(|e| format!("sign_secret: {e}"))?;
                Some(secret)
            }
            None => None,
        };
        TargetKind::Webhook {
            url: url("webhook", spec, &["https", "http"])?,
            sign_secret,
        }
    } else if let Some(email) = &rn.email {
        let smtp = email
            .smtp
            .as_deref()
            .ok_or("email.smtp: the SMTP server's URL is needed")?;
        let from = email
            .from
            .clone()
            .ok_or("email.from: the sender's address is needed")?;
        let to = email.to.clone().unwrap_or_default();
        if to.is_empty() {
            return Err("email.to: at least one recipient is needed".into());
        }
        for addr in std::iter::once(&from).chain(&to) {
            if addr.parse::<lettre::Address>().is_err() {
                return Err(format!("email: {addr:?} is not an email address"));
            }
        }
        let smtp = url("email.smtp", smtp, &["smtp", "smtps"])?;
        super::smtp_url::parse_smtp(smtp.expose()).map_err(|e| format!("email.smtp: {e}"))?;
        TargetKind::Email { smtp, from, to }
    } else {
        return Err("slack, webhook or email: each [[notify]] needs exactly one target".into());
    };
    let on = match &rn.on {
        None => Condition::ALL.to_vec(),
        Some(words) => {
            let mut on = Vec::new();
            for w in words {
                let c = w.parse::<Condition>().map_err(|_| {
                    format!(
                        "on: unknown condition {w:?}: expected one of {}",
                        Condition::ALL
                            .iter()
                            .map(|c| c.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                })?;
                if !on.contains(&c) {
                    on.push(c);
                }
            }
            on
        }
    };
    Ok(NotifyTarget { name, kind, on })
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::config::Config;

    fn parse(notify: &str) -> Result<Config, String> {
        let text = format!(
            "{notify}\n[sources.s]\nkind = \"none\"\nallow_unsigned = true\nkey = [\"json:/id\"]\n"
        );
        Config::parse(&text, "t.toml", Path::new("."), None).map_err(|e| e.to_string())
    }

    #[test]
    fn bad_targets_are_config_errors_naming_the_key() {
        let cases = [
            (
                "[[notify]]\nname = \"a\"\n",
                "notify[0] (a).slack, webhook or email",
            ),
            (
                "[[notify]]\nname = \"a\"\nslack = \"https://x/1\"\nwebhook = \"https://x/2\"\n",
                "exactly one target",
            ),
            (
                "[[notify]]\nname = \"a\"\nslack = \"https://x/1\"\non = [\"dead_leter\"]\n",
                "notify[0] (a).on: unknown condition \"dead_leter\"",
            ),
            (
                "[[notify]]\nname = \"a\"\nemail = { smtp = \"smtp://h\", from = \"a@b.c\" }\n",
                "notify[0] (a).email.to",
            ),
            (
                "[[notify]]\nname = \"a\"\nwebhook = \"ftp://user:SECRET@h/p\"\n",
                "notify[0] (a).webhook: expected a https or http URL",
            ),
            (
                "[[notify]]\nname = \"a\"\nemail = { smtp = \"http://h\", from = \"a@b.c\", to = [\"o@b.c\"] }\n",
                "notify[0] (a).email.smtp: expected a smtp or smtps URL",
            ),
            ("coalesce = \"soon\"\n", "coalesce"),
        ];
        for (text, want) in cases {
            let err = parse(text)
                .err()
                .unwrap_or_else(|| panic!("accepted: {text}"));
            assert!(err.contains(want), "{text}\nwanted {want:?}\ngot {err}");
            assert!(!err.contains("SECRET"), "{err}");
        }
    }

    #[test]
    fn a_target_wants_every_condition_unless_told() {
        let c = parse(
            "coalesce = \"1m\"\n[[notify]]\nname = \"a\"\nslack = \"https://x/1\"\n\n[[notify]]\nname = \"b\"\nwebhook = \"http://x/2\"\non = [\"mismatch\"]\n",
        )
        .unwrap();
        assert_eq!(c.notify.coalesce, Duration::from_secs(60));
        assert_eq!(c.notify.targets[0].on.len(), Condition::ALL.len());
        assert_eq!(c.notify.targets[1].on, vec![Condition::Mismatch]);
        assert!(c.notify.wants(Condition::DeadLetter));
    }

    #[test]
    fn a_redacted_url_keeps_scheme_and_host_only() {
        assert_eq!(
            redact_url("https://hooks.slack.com/services/T0/B0/secret"),
            "https://hooks.slack.com/[REDACTED]"
        );
        assert_eq!(
            redact_url("smtp://user:pw@mail.example.com:587?starttls=required"),
            "smtp://mail.example.com:587/[REDACTED]"
        );
        assert_eq!(redact_url("nonsense"), "[REDACTED]");
    }
}
