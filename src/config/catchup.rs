//! `[sources.NAME.catchup]`: how idemhook asks the provider's API what it
//! missed (`catchup/`). Only kinds whose provider has such an API
//! take the table; the key is a secret like the others.

use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use super::kind::Kind;
use super::values::{format_duration, parse_duration, resolve_secret};
use crate::verify::Secret;

/// `interval`'s default: 15 minutes.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(15 * 60);
/// `window`'s default: 72 hours.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(72 * 3_600);

/// The table as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCatchup {
    api_key: Option<String>,
    interval: Option<String>,
    window: Option<String>,
    api_url: Option<String>,
    hook: Option<String>,
}

/// Whose API a source catches up from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provider {
    /// Lists its events; the missing ones are claimed from the list.
    Stripe,
    /// Lists a hook's deliveries; the missing ones are asked again.
    Github,
}

impl Provider {
    /// The provider of a kind, when it has an API to catch up from.
    pub fn of(kind: Kind) -> Option<Provider> {
        match kind.name() {
            "stripe" => Some(Provider::Stripe),
            "github" => Some(Provider::Github),
            _ => None,
        }
    }

    /// The kinds that take a `catchup` table, for error messages.
    pub const SUPPORTED: &'static str = "stripe, github";

    pub fn default_api_url(self) -> &'static str {
        match self {
            Provider::Stripe => "https://api.stripe.com",
            Provider::Github => "https://api.github.com",
        }
    }

    /// How far back the provider keeps what a run lists, if it says.
    pub fn max_window(self) -> Option<(Duration, &'static str)> {
        match self {
            Provider::Stripe => Some((
                Duration::from_secs(30 * 86_400),
                "Stripe lists the events of the last 30 days only",
            )),
            Provider::Github => None,
        }
    }
}

/// A resolved catchup table.
#[derive(Debug)]
pub struct Catchup {
    pub provider: Provider,
    pub api_key: Secret,
    /// How often `serve` runs it; zero: only by command.
    pub interval: Duration,
    /// How far back a run looks.
    pub window: Duration,
    /// The API's base URL, without a trailing slash.
    pub api_url: String,
    /// GitHub's `repos/OWNER/REPO/hooks/ID` or `orgs/ORG/hooks/ID`.
    pub hook: Option<String>,
}

/// The source's catchup table, if any; errors name the key.
pub(super) fn catchup_of(
    kind: Kind,
    raw: Option<RawCatchup>,
    base: &Path,
) -> Result<Option<Catchup>, String> {
    let Some(raw) = raw else {
        return Ok(None);
    };
    let provider = Provider::of(kind).ok_or_else(|| {
        format!(
            "catchup: kind {:?} has no API to catch up from; catchup is supported for {}",
            kind.name(),
            Provider::SUPPORTED
        )
    })?;
    let api_key = match &raw.api_key {
        Some(spec) => resolve_secret(spec, base).map_err(|e| format!("catchup.api_key: {e}"))?,
        None => return Err("catchup.api_key: needed (a key that may read the provider's events; env:NAME or file:PATH)".to_string()),
    };
    let interval = match &raw.interval {
        Some(s) => parse_duration(s).map_err(|e| format!("catchup.interval: {e}"))?,
        None => DEFAULT_INTERVAL,
    };
    let window = match &raw.window {
        Some(s) => parse_duration(s).map_err(|e| format!("catchup.window: {e}"))?,
        None => DEFAULT_WINDOW,
    };
    if window.is_zero() {
        return Err("catchup.window: must be more than 0s".to_string());
    }
    if let Some((max, why)) = provider.max_window()
        && window > max
    {
        return Err(format!(
            "catchup.window: {} is over {}: {why}",
            format_duration(window),
            format_duration(max)
        ));
    }
    let api_url = raw
        .api_url
        .as_deref()
        .unwrap_or(provider.default_api_url())
        .trim_end_matches('/')
        .to_string();
    if !(api_url.starts_with("https://") || api_url.starts_with("http://")) {
        return Err(format!(
            "catchup.api_url: expected an http(s) URL, got {api_url:?}"
        ));
    }
    let hook = match (provider, raw.hook) {
        (Provider::Github, Some(hook)) => Some(valid_hook(&hook).map_err(|e| format!("catchup.hook: {e}"))?),
        (Provider::Github, None) => return Err("catchup.hook: needed for github: \"repos/OWNER/REPO/hooks/ID\" or \"orgs/ORG/hooks/ID\"".to_string()),
        (_, Some(_)) => return Err("catchup.hook: only github sources take a hook".to_string()),
        (_, None) => None,
    };
    Ok(Some(Catchup {
        provider,
        api_key,
        interval,
        window,
        api_url,
        hook,
    }))
}

/// `repos/OWNER/REPO/hooks/ID` or `orgs/ORG/hooks/ID`, ID a number.
pub fn valid_hook(hook: &str) -> Result<String, String> {
    let hook = hook.trim_matches('/');
    let parts: Vec<&str> = hook.split('/').collect();
    let name_ok = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
            && !s.bytes().all(|b| b == b'.')
    };
    let id_ok = |s: &str| !s.is_empty() && s.len() <= 20 && s.bytes().all(|b| b.is_ascii_digit());
    let ok = match parts.as_slice() {
        ["repos", owner, repo, "hooks", id] => name_ok(owner) && name_ok(repo) && id_ok(id),
        ["orgs", org, "hooks", id] => name_ok(org) && id_ok(id),
        _ => false,
    };
    if ok {
        Ok(hook.to_string())
    } else {
        Err(format!(
            "{hook:?} is neither \"repos/OWNER/REPO/hooks/ID\" nor \"orgs/ORG/hooks/ID\" (ID a number)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::valid_hook;
    use crate::config::Config;

    fn parse(source: &str) -> Result<Config, String> {
        Config::parse(source, "unit", std::path::Path::new("/"), None).map_err(|e| e.to_string())
    }

    #[test]
    fn a_catchup_table_resolves_with_its_defaults() {
        let c = parse(
            "[sources.s]\nkind = \"stripe\"\nsecrets = [\"whsec_x\"]\n[sources.s.catchup]\napi_key = \"rk_live_secret\"\n",
        )
        .unwrap();
        let cu = c.sources[0].catchup.as_ref().unwrap();
        assert_eq!(cu.interval, super::DEFAULT_INTERVAL);
        assert_eq!(cu.window, super::DEFAULT_WINDOW);
        assert_eq!(cu.api_url, "https://api.stripe.com");
        assert!(
            !format!("{c:?}").contains("rk_live_secret"),
            "the key is printed"
        );
    }

    #[test]
    fn bad_catchup_tables_are_config_errors_naming_the_key() {
        for (table, expected) in [
            (
                "[sources.s]\nkind = \"shopify\"\nsecrets = [\"x\"]\n[sources.s.catchup]\napi_key = \"k\"\n",
                "sources.s.catchup: kind \"shopify\" has no API to catch up from; catchup is supported for stripe, github",
            ),
            (
                "[sources.s]\nkind = \"github\"\nsecrets = [\"x\"]\n[sources.s.catchup]\napi_key = \"k\"\nhook = \"repos/acme/hooks/1\"\n",
                "sources.s.catchup.hook: \"repos/acme/hooks/1\" is neither",
            ),
            (
                "[sources.s]\nkind = \"github\"\nsecrets = [\"x\"]\n[sources.s.catchup]\napi_key = \"k\"\n",
                "sources.s.catchup.hook: needed for github",
            ),
            (
                "[sources.s]\nkind = \"stripe\"\nsecrets = [\"x\"]\n[sources.s.catchup]\napi_key = \"k\"\nwindow = \"31d\"\n",
                "sources.s.catchup.window: 31d is over 30d: Stripe lists the events of the last 30 days only",
            ),
            (
                "[sources.s]\nkind = \"stripe\"\nsecrets = [\"x\"]\n[sources.s.catchup]\ninterval = \"5m\"\n",
                "sources.s.catchup.api_key: needed",
            ),
            (
                "[sources.s]\nkind = \"stripe\"\nsecrets = [\"x\"]\n[sources.s.catchup]\napi_key = \"k\"\nhook = \"orgs/a/hooks/1\"\n",
                "sources.s.catchup.hook: only github sources take a hook",
            ),
        ] {
            let err = parse(table).map(|_| ()).unwrap_err();
            assert!(
                err.contains(expected),
                "expected: {expected}\n     got: {err}"
            );
        }
    }

    #[test]
    fn hooks_of_repos_and_orgs_pass_and_others_are_refused() {
        assert_eq!(
            valid_hook("repos/acme/shop/hooks/12345678").as_deref(),
            Ok("repos/acme/shop/hooks/12345678")
        );
        assert!(valid_hook("orgs/acme/hooks/42").is_ok());
        for bad in [
            "",
            "repos/acme/hooks/1",
            "repos/acme/shop/hooks/abc",
            "users/acme/hooks/1",
            "orgs/acme/hooks/1/deliveries",
            "repos/a c/shop/hooks/1",
            "orgs/../hooks/1",
        ] {
            assert!(valid_hook(bad).is_err(), "{bad} was accepted");
        }
    }
}
