//! The kinds of source: the generic ones (`hmac`, `basic`, `token`,
//! `none`), configured by hand, and every provider, a row of the table in
//! `presets` with its signature scheme, key and type rules and default key
//! retention (the provider's retry horizon plus a margin).

use std::fmt;
use std::time::Duration;

use super::presets::{self, Preset};
use crate::config::key_rule::Part;

/// The kinds of source: the generic `hmac`, `basic` and `token`, `none`,
/// and every provider of the table in `presets`.
#[derive(Debug, Clone, Copy)]
pub enum Kind {
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
    /// The kinds that are no provider's row.
    pub const GENERIC: [Kind; 4] = [Kind::Hmac, Kind::None, Kind::Basic, Kind::Token];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Hmac => "hmac",
            Kind::None => "none",
            Kind::Basic => "basic",
            Kind::Token => "token",
            Kind::Preset(p) => p.name,
        }
    }

    /// Every kind: the providers' table, then the generic ones.
    pub fn all() -> impl Iterator<Item = Kind> {
        presets::PRESETS
            .iter()
            .map(Kind::Preset)
            .chain(Kind::GENERIC)
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
        self.preset().is_some_and(|p| p.tolerance_secs.is_some())
    }

    /// How long keys are kept by default: the provider's documented retry or
    /// redelivery horizon plus a margin, never under 7 days; a conservative
    /// month for the generic kinds, whose senders idemhook knows nothing
    /// about. The table of kinds in docs/configuration.md gives the reason
    /// for each.
    pub fn default_retention(self) -> Duration {
        let days = self.preset().map_or(30, |p| p.retention_days);
        Duration::from_secs(days * 86_400)
    }

    /// The provider's documented retry (or redelivery) horizon, and how it
    /// is documented: a key pruned sooner lets a redelivery through as a
    /// new event. None for senders idemhook knows nothing about.
    pub fn retry_horizon(self) -> Option<(Duration, &'static str)> {
        let (secs, what) = self.preset()?.horizon?;
        Some((Duration::from_secs(secs), what))
    }

    /// The key rule each kind uses unless the source overrides `key`.
    pub(super) fn default_key(self) -> Option<Vec<Part>> {
        self.preset()?
            .key
            .iter()
            .map(|s| Part::parse(s).ok())
            .collect()
    }

    /// The parts the payload hash covers by default: the kind's own
    /// (Mailgun re-signs every attempt inside the body, so only
    /// `event-data`), else none, which hashes the whole body.
    pub(super) fn default_hash(self) -> Vec<Part> {
        self.preset().map_or_else(Vec::new, |p| {
            p.hash.iter().filter_map(|s| Part::parse(s).ok()).collect()
        })
    }

    pub(super) fn default_type(self) -> Option<Part> {
        self.preset()?
            .event_type
            .first()
            .and_then(|s| Part::parse(s).ok())
    }

    /// Headers worth keeping with the stored event (besides Content-Type):
    /// the ones the key and type come from and the signature headers, so an
    /// operator can see what was verified.
    pub fn kept_headers(self) -> &'static [&'static str] {
        self.preset().map_or(&[], |p| p.kept_headers)
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
