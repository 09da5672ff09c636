//! An `http://` or `https://` forward: a POST of the captured body with
//! the `Idempotency-Key`, the `X-Idemhook-*` headers, the action's
//! signature, headers and auth. 2xx is done, another 4xx fails the job,
//! the rest is retried. A 401 to an OAuth2 token renews the token once and
//! resends within the same attempt (same `X-Idemhook-Attempt`).

use std::sync::Arc;
use std::time::Duration;

use super::{Destination, HttpClient, Message};
use crate::outbox::Attempt;
use crate::outbox::ask;
use crate::outbox::retry::{self, Verdict};
use crate::time::now_ms;
use crate::verify::Verifier;

pub(super) struct HttpDest {
    pub url: String,
    pub timeout: Duration,
    pub request_id_header: String,
    pub client: Arc<HttpClient>,
    pub signer: Option<Verifier>,
}

impl Destination for HttpDest {
    fn send(&self, m: &Message<'_>) -> Attempt {
        let started_at = now_ms();
        let key = m.key();
        let mut attempt = Attempt::started(started_at);
        let mut renewed = false;
        loop {
            let mut request = self
                .client
                .agent
                .post(&self.url)
                .config()
                .timeout_global(Some(self.timeout))
                .timeout_connect(Some(self.timeout.min(Duration::from_secs(5))))
                .build()
                .header(
                    "Content-Type",
                    m.content_type.unwrap_or("application/octet-stream"),
                )
                .header("Idempotency-Key", key.as_str())
                .header("X-Idemhook-Source", m.source)
                .header("X-Idemhook-Event-Id", m.event_id)
                .header("X-Idemhook-Event-Type", m.event_type.unwrap_or(""))
                .header("X-Idemhook-Attempt", m.n.to_string());
            if let Some(signer) = &self.signer
                && let Ok(headers) = signer.sign(m.body, started_at / 1000, &key)
            {
                for (name, value) in headers {
                    request = request.header(name, value);
                }
            }
            let (request, used) = match self.client.prepare(request) {
                Ok(prepared) => prepared,
                Err(e) => {
                    attempt.error_kind = Some("auth");
                    attempt.error = Some(e.0);
                    break;
                }
            };
            match request.send(m.body) {
                Ok(mut response) => {
                    let status = response.status().as_u16();
                    if status == 401 && used.is_some() && !renewed {
                        let _ = response
                            .body_mut()
                            .with_config()
                            .limit(64 * 1024)
                            .read_to_vec();
                        self.client.renew(used);
                        renewed = true;
                        continue;
                    }
                    attempt.http_status = Some(status);
                    attempt.verdict = retry::classify_status(status);
                    let read = ask::read_answer(&mut response, &self.request_id_header, started_at);
                    attempt.request_id = read.request_id;
                    attempt.retry_after = read.retry_after;
                    attempt.response_head = Some(read.head);
                    if attempt.verdict != Verdict::Done {
                        attempt.error_kind = Some("status");
                        attempt.error = Some(format!("downstream answered {status}"));
                    } else if let Some(e) = read.body_error {
                        // The answer was 2xx; a broken body does not undo that.
                        crate::log::debug(
                            "outbox",
                            &[("event_id", &m.event_id), ("body_error", &e)],
                        );
                    }
                }
                Err(e) => {
                    let (kind, message) = retry::classify_error(&e);
                    attempt.error_kind = Some(kind);
                    attempt.error = Some(message);
                }
            }
            break;
        }
        attempt.finished_at = now_ms();
        attempt
    }
}
