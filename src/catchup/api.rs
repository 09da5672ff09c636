//! What every provider's API shares: the trait a provider module
//! implements, its error, the HTTP exchange (ureq, the outbox's client)
//! and the `Link` header's parser.

use std::time::Duration;

use crate::config::catchup::Catchup;

/// One thing the provider holds that a run may recover.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// The event's id as idemhook stores it (Stripe's `evt_...`, GitHub's
    /// delivery guid).
    pub event_id: String,
    /// When the provider created or sent it, unix ms.
    pub at_ms: i64,
    pub recovery: Recovery,
}

/// How a missing one comes back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recovery {
    /// The API handed the event itself: claimed here, as a delivery.
    Claim { body: Vec<u8> },
    /// The provider sends it again, signed, to the normal route when asked.
    Redeliver {
        delivery_id: String,
        /// This listing entry is itself a redelivery (GitHub's
        /// `redelivery: true`).
        redelivery: bool,
    },
}

/// What a listing got: what it found before any error, and the error.
#[derive(Debug, Default)]
pub struct Listing {
    pub found: Vec<Found>,
    pub error: Option<ApiError>,
}

/// A provider's API, one module each (`stripe`, `github`): a third
/// provider is one more implementation.
pub trait ProviderApi {
    /// Everything the provider holds since `since_ms` (unix ms), newest
    /// first, following the API's pagination.
    fn list_since(&self, since_ms: i64) -> Listing;
    /// Asks the provider to send one again (providers that push only).
    fn redeliver(&self, delivery_id: &str) -> Result<(), ApiError>;
}

/// Why the API did not answer as hoped. Never carries the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    /// An answer that was not 2xx, with the API's message.
    #[error("{what} answered {status}{}: {message}", retry_after.map_or(String::new(), |d| format!(" (retry after {}s)", d.as_secs())))]
    Status {
        what: String,
        status: u16,
        message: String,
        retry_after: Option<Duration>,
    },
    /// No answer: connection refused, timeout.
    #[error("{what} got no answer: {message}")]
    Transport { what: String, message: String },
    /// An answer that was not what the API's reference says.
    #[error("{what}: unexpected answer: {message}")]
    Shape { what: String, message: String },
}

impl ApiError {
    /// How long the API asked to be left alone (429's `Retry-After`).
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            ApiError::Status { retry_after, .. } => *retry_after,
            _ => None,
        }
    }
}

/// A page an API answered: its status, its `Link` and the body.
pub struct Page {
    pub link: Option<String>,
    pub body: Vec<u8>,
}

/// The client every provider module uses: ureq as the outbox has it.
pub struct Client {
    agent: ureq::Agent,
    /// The `api_url`, without a trailing slash.
    pub base: String,
    api_key: crate::verify::Secret,
}

/// The most bytes one page may have.
const MAX_PAGE_BYTES: u64 = 32 * 1024 * 1024;

impl Client {
    pub fn new(c: &Catchup) -> Client {
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .max_redirects(0)
            .timeout_global(Some(Duration::from_secs(30)))
            .user_agent(concat!("idemhook/", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        Client {
            agent,
            base: c.api_url.clone(),
            api_key: c.api_key.clone(),
        }
    }

    /// `method` on `url` (which must be under the API's base: the key never
    /// goes elsewhere, whatever a `Link` says) with the key as a bearer
    /// token and `headers`.
    pub fn call(
        &self,
        method: &str,
        url: &str,
        headers: &[(&str, &str)],
        what: &str,
    ) -> Result<Page, ApiError> {
        if !under_base(&self.base, url) {
            return Err(ApiError::Shape {
                what: what.to_string(),
                message: format!("a next page outside {} was refused", self.base),
            });
        }
        let bearer = format!("Bearer {}", self.api_key.expose());
        let started = crate::time::now_ms();
        let sent = if method == "POST" {
            let mut rq = self.agent.post(url).header("Authorization", &bearer);
            for (n, v) in headers {
                rq = rq.header(*n, *v);
            }
            rq.send_empty()
        } else {
            let mut rq = self.agent.get(url).header("Authorization", &bearer);
            for (n, v) in headers {
                rq = rq.header(*n, *v);
            }
            rq.call()
        };
        let mut response = sent.map_err(|e| ApiError::Transport {
            what: what.to_string(),
            message: crate::outbox::retry::classify_error(&e).1,
        })?;
        let status = response.status().as_u16();
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let link = header("link");
        let retry_after = header("retry-after")
            .and_then(|v| crate::outbox::retry::parse_retry_after(&v, started / 1000));
        let body = response
            .body_mut()
            .with_config()
            .limit(MAX_PAGE_BYTES)
            .read_to_vec()
            .map_err(|e| ApiError::Transport {
                what: what.to_string(),
                message: format!("reading the answer: {e}"),
            })?;
        if !(200..300).contains(&status) {
            return Err(ApiError::Status {
                what: what.to_string(),
                status,
                message: error_message(&body),
                retry_after,
            });
        }
        Ok(Page { link, body })
    }
}

/// True when `url` is `base` or below it (same scheme, host and port).
fn under_base(base: &str, url: &str) -> bool {
    url == base
        || url
            .strip_prefix(base)
            .is_some_and(|rest| rest.starts_with(['/', '?']))
}

/// The message of an API's error body: Stripe's `error.message`, GitHub's
/// `message`, else the body's first 200 characters.
fn error_message(body: &[u8]) -> String {
    let parsed: Option<serde_json::Value> = serde_json::from_slice(body).ok();
    let found = parsed.as_ref().and_then(|v| {
        v.pointer("/error/message")
            .or_else(|| v.pointer("/message"))
            .and_then(|m| m.as_str())
            .map(str::to_string)
    });
    let text = found.unwrap_or_else(|| String::from_utf8_lossy(body).into_owned());
    let text: String = text.chars().take(200).collect();
    crate::log::clean(&text)
}

/// The URL of the `rel` link in a `Link` header (RFC 8288):
/// `<https://...>; rel="next", <...>; rel="last"`. None when absent.
pub fn link_rel(header: &str, rel: &str) -> Option<String> {
    let mut rest = header;
    loop {
        let start = rest.find('<')?;
        let end = start + rest[start..].find('>')?;
        let url = &rest[start + 1..end];
        let after = &rest[end + 1..];
        let params_end = after.find('<').unwrap_or(after.len());
        // This link's parameters, up to the comma before the next one.
        let params = after[..params_end].trim_end().trim_end_matches(',');
        let matches = params.split(';').any(|p| {
            let Some((name, value)) = p.split_once('=') else {
                return false;
            };
            name.trim().eq_ignore_ascii_case("rel")
                && value
                    .trim()
                    .trim_matches('"')
                    .split_ascii_whitespace()
                    .any(|r| r.eq_ignore_ascii_case(rel))
        });
        if matches {
            return Some(url.to_string());
        }
        rest = after;
    }
}

#[cfg(test)]
mod tests {
    use super::{link_rel, under_base};

    #[test]
    fn link_headers_give_the_next_page() {
        let github = "<https://api.github.com/repos/o/r/hooks/1/deliveries?per_page=100&cursor=v1_2>; rel=\"next\", <https://api.github.com/repos/o/r/hooks/1/deliveries?per_page=100>; rel=\"first\"";
        assert_eq!(
            link_rel(github, "next").as_deref(),
            Some("https://api.github.com/repos/o/r/hooks/1/deliveries?per_page=100&cursor=v1_2")
        );
        assert_eq!(
            link_rel(github, "first").as_deref(),
            Some("https://api.github.com/repos/o/r/hooks/1/deliveries?per_page=100")
        );
        assert_eq!(link_rel(github, "prev"), None);
        // Unquoted, several relations, odd spacing and case.
        assert_eq!(
            link_rel(
                "<http://x/a?page=3>;REL=\"prev next\" , <http://x/b>; rel=last",
                "next"
            )
            .as_deref(),
            Some("http://x/a?page=3")
        );
        assert_eq!(link_rel("<http://x/b>; rel=last", "next"), None);
        assert_eq!(link_rel("", "next"), None);
        assert_eq!(link_rel("garbage <unterminated; rel=next", "next"), None);
    }

    #[test]
    fn only_urls_under_the_api_base_are_called() {
        let base = "https://api.github.com";
        assert!(under_base(
            base,
            "https://api.github.com/repos/o/r/hooks/1/deliveries"
        ));
        assert!(!under_base(base, "https://api.github.com.evil.example/x"));
        assert!(!under_base(
            base,
            "https://evil.example/https://api.github.com/x"
        ));
        let ghes = "https://ghe.example/api/v3";
        assert!(under_base(
            ghes,
            "https://ghe.example/api/v3/orgs/o/hooks/1/deliveries"
        ));
        assert!(!under_base(ghes, "https://ghe.example/api/v30/x"));
    }
}
