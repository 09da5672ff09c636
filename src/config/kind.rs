//! The kinds of source: each one's signature scheme, key and type rules,
//! and its default key retention (the provider's retry horizon plus a
//! margin).

use std::fmt;
use std::time::Duration;

use super::presets::{self, Preset};
use crate::key::Part;

/// The kinds of source, each with its signature scheme and key rule: the
/// six built in with code of their own, `standard`, the generic `hmac`,
/// `basic` and `token`, `none`, and every provider of the table in
/// `presets`.
#[derive(Debug, Clone, Copy)]
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
    /// HTTP Basic authentication, `user:password` secrets.
    Basic,
    /// A header that holds one of the secrets.
    Token,
    Preset(&'static Preset),
}

impl PartialEq for Kind {
    fn eq(&self, other: &Kind) -> bool {
        self.name() == other.name()
    }
}

impl Eq for Kind {}

impl Kind {
    pub const BUILT_IN: [Kind; 11] = [
        Kind::Stripe,
        Kind::Github,
        Kind::Shopify,
        Kind::Slack,
        Kind::Paddle,
        Kind::Linear,
        Kind::Standard,
        Kind::Hmac,
        Kind::None,
        Kind::Basic,
        Kind::Token,
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
            Kind::Basic => "basic",
            Kind::Token => "token",
            Kind::Preset(p) => p.name,
        }
    }

    /// Every kind: the built-in ones, then the providers' table.
    pub fn all() -> impl Iterator<Item = Kind> {
        Kind::BUILT_IN
            .into_iter()
            .chain(presets::PRESETS.iter().map(Kind::Preset))
    }

    pub(super) fn parse(s: &str) -> Option<Kind> {
        let s = presets::alias(s).unwrap_or(s);
        Kind::all().find(|k| k.name() == s)
    }

    /// The provider's row, for the kinds of the table.
    pub fn preset(self) -> Option<&'static Preset> {
        match self {
            Kind::Preset(p) => Some(p),
            _ => None,
        }
    }

    /// True for the schemes whose signature covers a timestamp, which
    /// `tolerance` bounds.
    pub fn signs_timestamp(self) -> bool {
        if let Kind::Preset(p) = self {
            return p.tolerance_secs.is_some();
        }
        matches!(
            self,
            Kind::Stripe | Kind::Slack | Kind::Paddle | Kind::Linear | Kind::Standard
        )
    }

    /// How long keys are kept by default: the provider's documented retry or
    /// redelivery horizon plus a margin, never under 7 days. The table of
    /// kinds in docs/configuration.md gives the reason for each.
    pub fn default_retention(self) -> Duration {
        let days = match self {
            Kind::Preset(p) => p.retention_days,
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
            Kind::Hmac | Kind::None | Kind::Basic | Kind::Token => 30,
        };
        Duration::from_secs(days * 86_400)
    }

    /// The provider's documented retry (or redelivery) horizon, and how it
    /// is documented: a key pruned sooner lets a redelivery through as a
    /// new event. None for senders idemhook knows nothing about.
    pub fn retry_horizon(self) -> Option<(Duration, &'static str)> {
        let (secs, what) = match self {
            Kind::Preset(p) => p.horizon?,
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
            Kind::Hmac | Kind::None | Kind::Basic | Kind::Token => return None,
        };
        Some((Duration::from_secs(secs), what))
    }

    /// The key rule each kind uses unless the source overrides `key`.
    pub(super) fn default_key(self) -> Option<Vec<Part>> {
        if let Kind::Preset(p) = self {
            return p.key.iter().map(|s| Part::parse(s).ok()).collect();
        }
        let rule = match self {
            Kind::Stripe => "json:/id",
            Kind::Github => "header:X-GitHub-Delivery",
            Kind::Shopify => "header:X-Shopify-Event-Id|header:X-Shopify-Webhook-Id",
            Kind::Slack => "json:/event_id",
            Kind::Paddle => "json:/event_id",
            Kind::Linear => "header:Linear-Delivery",
            Kind::Standard => "header:webhook-id|header:svix-id",
            Kind::Hmac | Kind::None | Kind::Basic | Kind::Token | Kind::Preset(_) => return None,
        };
        Part::parse(rule).ok().map(|p| vec![p])
    }

    /// The parts the payload hash covers by default: the kind's own
    /// (Mailgun re-signs every attempt inside the body, so only
    /// `event-data`), else none, which hashes the whole body.
    pub(super) fn default_hash(self) -> Vec<Part> {
        match self {
            Kind::Preset(p) => p.hash.iter().filter_map(|s| Part::parse(s).ok()).collect(),
            // The event's id, type and data, canonicalised: the same for a
            // delivery and for the event as the API lists it (which differ
            // in `pending_webhooks` and formatting), so an event claimed by
            // catch-up and delivered later is a duplicate.
            Kind::Stripe => STRIPE_HASH
                .iter()
                .filter_map(|s| Part::parse(s).ok())
                .collect(),
            _ => Vec::new(),
        }
    }

    pub(super) fn default_type(self) -> Option<Part> {
        if let Kind::Preset(p) = self {
            return p.event_type.first().and_then(|s| Part::parse(s).ok());
        }
        let rule = match self {
            Kind::Stripe => "json:/type",
            Kind::Github => "header:X-GitHub-Event",
            Kind::Shopify => "header:X-Shopify-Topic",
            Kind::Slack => "json:/event/type|json:/type",
            Kind::Paddle => "json:/event_type",
            Kind::Linear => "header:Linear-Event",
            Kind::Standard => "json:/type",
            Kind::Hmac | Kind::None | Kind::Basic | Kind::Token | Kind::Preset(_) => return None,
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
            Kind::Hmac | Kind::None | Kind::Basic | Kind::Token => &[],
            Kind::Preset(p) => p.kept_headers,
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The `stripe` kind's default payload hash.
pub const STRIPE_HASH: [&str; 3] = ["json:/id", "json:/type", "json:/data"];
