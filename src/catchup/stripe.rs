//! Stripe's events API: `GET /v1/events?created[gte]=..&limit=100`,
//! following `starting_after` while `has_more` (newest first). Each event
//! is the object a webhook delivers (less nothing the hash reads), so the
//! missing ones are claimed from the list itself.

use serde::Deserialize;

use super::api::{ApiError, Client, Found, Listing, ProviderApi, Recovery};

pub struct Stripe {
    pub client: Client,
}

#[derive(Deserialize)]
struct EventList {
    data: Vec<serde_json::Value>,
    has_more: bool,
}

/// What a query value escapes: all but RFC 3986's unreserved characters.
const QUERY_VALUE: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// A run never reads more pages than this (100 events each).
const MAX_PAGES: usize = 10_000;

impl ProviderApi for Stripe {
    fn list_since(&self, since_ms: i64) -> Listing {
        let mut listing = Listing::default();
        let mut after: Option<String> = None;
        let what = "Stripe's GET /v1/events";
        for _ in 0..MAX_PAGES {
            let mut url = format!(
                "{}/v1/events?created%5Bgte%5D={}&limit=100",
                self.client.base,
                since_ms.div_euclid(1000)
            );
            if let Some(id) = &after {
                url.push_str("&starting_after=");
                url.extend(percent_encoding::utf8_percent_encode(id, QUERY_VALUE));
            }
            let page = match self.client.call("GET", &url, &[], what) {
                Ok(page) => page,
                Err(e) => {
                    listing.error = Some(e);
                    return listing;
                }
            };
            let list: EventList = match serde_json::from_slice(&page.body) {
                Ok(list) => list,
                Err(e) => {
                    listing.error = Some(ApiError::Shape {
                        what: what.to_string(),
                        message: format!("not an event list: {e}"),
                    });
                    return listing;
                }
            };
            let mut last = None;
            for event in list.data {
                let Some(id) = event.get("id").and_then(|v| v.as_str()).map(str::to_string) else {
                    listing.error = Some(ApiError::Shape {
                        what: what.to_string(),
                        message: "an event without an id".to_string(),
                    });
                    return listing;
                };
                let created = event.get("created").and_then(serde_json::Value::as_i64);
                listing.found.push(Found {
                    event_id: id.clone(),
                    at_ms: created.unwrap_or(0).saturating_mul(1000),
                    recovery: Recovery::Claim {
                        body: event.to_string().into_bytes(),
                    },
                });
                last = Some(id);
            }
            match (list.has_more, last) {
                (true, Some(id)) => after = Some(id),
                _ => return listing,
            }
        }
        listing
    }

    fn redeliver(&self, _delivery_id: &str) -> Result<(), ApiError> {
        Err(ApiError::Shape {
            what: "Stripe".to_string(),
            message: "events are claimed from the list, never redelivered".to_string(),
        })
    }
}
