//! Helpers the test modules share on top of `harness`, one copy each
//! where every module used to write its own: a stripe source's config, a
//! Stripe-signed delivery ([`StripeHook`]), what a delivery answered, a
//! job's status and an event's state on either backend, and a call of the
//! admin API.
//!
//! Owns: the steps tests repeat with different constants (a secret, a
//! source name, a token), which each module passes in.
//! Does not own: the `Server` fixture and HTTP plumbing (`harness.rs`),
//! signing itself (`sign.rs`), or a config built for one test area's
//! actions (those stay in their module).

#![allow(dead_code)] // not every test module uses every helper

use std::time::Duration;

use serde_json::Value;

use crate::harness::{Client, HTTP_TIMEOUT, HttpResponse, Server, ServerConfig};
use crate::sign;

// ---------------------------------------------------------------------------
// Config
// ---------------------------------------------------------------------------

/// A `[sources.NAME]` table of kind stripe whose secret is read from the
/// `STRIPE_SECRET` variable, with `extra` (raw TOML: more keys of the
/// table, `[[sources.NAME.actions]]`) right after it.
pub fn stripe_source(name: &str, extra: &str) -> String {
    format!("[sources.{name}]\nkind = \"stripe\"\nsecrets = [\"env:STRIPE_SECRET\"]\n{extra}")
}

/// The harness defaults with one such source, `stripe`, and `extra`.
pub fn stripe_config(extra: &str) -> ServerConfig {
    ServerConfig::new().tables(&stripe_source("stripe", extra))
}

// ---------------------------------------------------------------------------
// Deliveries
// ---------------------------------------------------------------------------

/// How long [`StripeHook::deliver_ok`] waits for its answer: a claim on
/// PostgreSQL may queue behind instances pruning the same database.
pub const DELIVERY_TIMEOUT: Duration = Duration::from_secs(30);

/// Where a module's test deliveries go and how they are signed, as
/// Stripe sends them: POSTed to `/hooks/{source}` with a
/// `Stripe-Signature` of now under `secret` and a JSON content type. A
/// module names its own once (`const STRIPE: StripeHook =
/// StripeHook::new("stripe", SECRET);`) and delivers through it.
#[derive(Clone, Copy, Debug)]
pub struct StripeHook<'a> {
    pub source: &'a str,
    pub secret: &'a str,
}

impl<'a> StripeHook<'a> {
    pub const fn new(source: &'a str, secret: &'a str) -> StripeHook<'a> {
        StripeHook { source, secret }
    }

    /// The same secret for another source (a second `[sources.NAME]`
    /// reading the same variable).
    pub const fn at<'b>(self, source: &'b str) -> StripeHook<'b>
    where
        'a: 'b,
    {
        StripeHook {
            source,
            secret: self.secret,
        }
    }

    /// `body` delivered through `client`; `Err` only for transport
    /// failures (refused, reset, timeout).
    pub fn try_deliver(
        &self,
        client: &Client,
        server: &Server,
        body: &[u8],
    ) -> Result<HttpResponse, String> {
        client.try_post(
            &server.url(&format!("/hooks/{}", self.source)),
            &sign::stripe_now(self.secret, body),
            body,
        )
    }

    /// `body` delivered on a fresh connection with the harness's HTTP
    /// timeout (as [`Server::post`]), whatever the answer; panics on
    /// transport failures.
    pub fn deliver(&self, server: &Server, body: &[u8]) -> HttpResponse {
        self.try_deliver(&Client::new(HTTP_TIMEOUT), server, body)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// `body` delivered, and it must be acknowledged: panics unless the
    /// answer is 200 (accepted or duplicate), naming the body and the
    /// answer. Waits up to [`DELIVERY_TIMEOUT`].
    pub fn deliver_ok(&self, server: &Server, body: &[u8]) -> HttpResponse {
        let resp = self
            .try_deliver(&Client::new(DELIVERY_TIMEOUT), server, body)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            resp.status,
            200,
            "delivery to /hooks/{} should be acknowledged\n  body: {}\n  got: {}",
            self.source,
            String::from_utf8_lossy(body),
            describe(&resp)
        );
        resp
    }
}

/// Status and body of an answer, for messages.
pub fn describe(resp: &HttpResponse) -> String {
    format!("{} {}", resp.status, resp.text())
}

/// Panics unless `resp` is `200 {"status":"accepted","event_id":EVENT_ID}`
/// (a new event), with `context` in the message.
pub fn assert_accepted(resp: &HttpResponse, event_id: &str, context: &str) {
    let ok = resp.status == 200
        && resp.json_status().as_deref() == Some("accepted")
        && resp.json().get("event_id").and_then(|v| v.as_str()) == Some(event_id);
    assert!(
        ok,
        "{context}\n  expected: 200 {{\"status\":\"accepted\",\"event_id\":\"{event_id}\"}}\n  got: {}",
        describe(resp)
    );
}

// ---------------------------------------------------------------------------
// The store
// ---------------------------------------------------------------------------

/// The status of the job of `action` for `source`/`event_id`, read from
/// the server's store on either backend; `None` when there is no such job.
pub fn job_status(server: &Server, source: &str, event_id: &str, action: &str) -> Option<String> {
    server
        .row(
            "SELECT status FROM jobs WHERE source = ?1 AND event_id = ?2 AND action = ?3",
            &[&source, &event_id, &action],
        )
        .map(|r| r.text(0))
}

/// The state of the event `source`/`event_id`, read from the server's
/// store on either backend; `None` when it is not stored (or was pruned).
pub fn event_state(server: &Server, source: &str, event_id: &str) -> Option<String> {
    server
        .row(
            "SELECT state FROM events WHERE source = ?1 AND event_id = ?2",
            &[&source, &event_id],
        )
        .map(|r| r.text(0))
}

// ---------------------------------------------------------------------------
// The admin API
// ---------------------------------------------------------------------------

/// An admin API call: `method` (`GET`, or any other as a POST with
/// `body` as JSON) to `path`, with `Authorization: Bearer TOKEN` when a
/// token is given. Returns the status and the JSON answer; panics on
/// transport failures or an answer that is not JSON. Waits up to four
/// times the HTTP timeout (a `?check=1` asks the downstream first).
pub fn api(
    server: &Server,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: impl Into<Vec<u8>>,
) -> (u16, Value) {
    let client = Client::new(HTTP_TIMEOUT * 4);
    let url = server.url(path);
    let mut headers = Vec::new();
    if let Some(token) = token {
        headers.push(("Authorization".to_string(), format!("Bearer {token}")));
    }
    let resp = if method == "GET" {
        client.get_with(&url, &headers)
    } else {
        headers.push(("Content-Type".to_string(), "application/json".to_string()));
        client.post(&url, &headers, &body.into())
    };
    let json = serde_json::from_slice(&resp.body).unwrap_or_else(|e| {
        panic!(
            "{method} {path} answered {} without JSON ({e}): {}",
            resp.status,
            resp.text()
        )
    });
    (resp.status, json)
}
