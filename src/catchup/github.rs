//! GitHub's hook deliveries API: `GET /{hook}/deliveries?per_page=100`,
//! following `Link: rel="next"` (newest first), and
//! `POST /{hook}/deliveries/{id}/attempts`, after which GitHub sends the
//! delivery again, signed, to the normal route with the same guid.

use serde::Deserialize;

use super::api::{ApiError, Client, Found, Listing, ProviderApi, Recovery, link_rel};

pub struct Github {
    pub client: Client,
    /// `repos/OWNER/REPO/hooks/ID` or `orgs/ORG/hooks/ID`.
    pub hook: String,
}

#[derive(Deserialize)]
struct Delivery {
    id: i64,
    guid: String,
    delivered_at: String,
    #[serde(default)]
    redelivery: bool,
}

const ACCEPT: (&str, &str) = ("Accept", "application/vnd.github+json");
const VERSION: (&str, &str) = ("X-GitHub-Api-Version", "2022-11-28");
/// A run never reads more pages than this (100 deliveries each).
const MAX_PAGES: usize = 10_000;

impl ProviderApi for Github {
    fn list_since(&self, since_ms: i64) -> Listing {
        let mut listing = Listing::default();
        let what = "GitHub's GET deliveries";
        let mut url = format!("{}/{}/deliveries?per_page=100", self.client.base, self.hook);
        for _ in 0..MAX_PAGES {
            let page = match self.client.call("GET", &url, &[ACCEPT, VERSION], what) {
                Ok(page) => page,
                Err(e) => {
                    listing.error = Some(e);
                    return listing;
                }
            };
            let deliveries: Vec<Delivery> = match serde_json::from_slice(&page.body) {
                Ok(d) => d,
                Err(e) => {
                    listing.error = Some(ApiError::Shape {
                        what: what.to_string(),
                        message: format!("not a list of deliveries: {e}"),
                    });
                    return listing;
                }
            };
            let mut older = false;
            for d in deliveries {
                let Some(at) = crate::time::parse_rfc3339(&d.delivered_at) else {
                    listing.error = Some(ApiError::Shape {
                        what: what.to_string(),
                        message: format!("delivered_at {:?} is not a time", d.delivered_at),
                    });
                    return listing;
                };
                let at_ms = at.saturating_mul(1000);
                if at_ms < since_ms {
                    older = true;
                    continue;
                }
                listing.found.push(Found {
                    event_id: d.guid,
                    at_ms,
                    recovery: Recovery::Redeliver {
                        delivery_id: d.id.to_string(),
                        redelivery: d.redelivery,
                    },
                });
            }
            // Newest first: past the window, the rest is older still.
            let next = page.link.as_deref().and_then(|l| link_rel(l, "next"));
            match next {
                Some(next) if !older => url = next,
                _ => return listing,
            }
        }
        listing
    }

    fn redeliver(&self, delivery_id: &str) -> Result<(), ApiError> {
        let url = format!(
            "{}/{}/deliveries/{delivery_id}/attempts",
            self.client.base, self.hook
        );
        self.client
            .call("POST", &url, &[ACCEPT, VERSION], "GitHub's POST attempts")
            .map(|_| ())
    }
}
