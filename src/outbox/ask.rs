//! Asking a downstream whether an effect already exists: the GET to a
//! forward action's `check` URL (its template is parsed with the config,
//! `config::check_template`).
//!
//! A forward worker asks before an attempt whose predecessor's outcome is
//! unknown (a timeout, a cut connection, a 5xx, a lease takeover, a
//! replay); `reconcile --check` asks about stuck and failed jobs. The
//! downstream answers 200 when it has processed the `Idempotency-Key`
//! (found), 404 when it has not (not found); anything else, or no answer,
//! is an error and decides nothing. This module does the HTTP and the
//! classification; what to record is the caller's (`outbox/`,
//! `ops/reconcile.rs`). It runs no SQL.
//!
//! "Ask" is the code's word for this; the config key (`check`), the
//! `checks` table, `reconcile --check` and the metrics keep the product's
//! word, and `idemhook check` is the config report (`ops/check.rs`).

use std::io::Read;
use std::time::Duration;

use crate::config::Forward;
use crate::config::check_template::{Template, idempotency_key};
use crate::state::Answer;
use crate::time::now_ms;
use crate::verify::Verifier;

/// How much of a downstream's answer (a check's or a forward attempt's)
/// is kept with the attempt.
const RESPONSE_HEAD_BYTES: usize = 1024;
/// The most of an answer read (so the connection can be reused).
const RESPONSE_READ_LIMIT: u64 = 64 * 1024;

/// One check, asked and classified.
#[derive(Debug, Clone)]
pub struct Asked {
    pub answer: Answer,
    pub started_at: i64,
    pub finished_at: i64,
    pub http_status: Option<u16>,
    /// Why it is an error: connect, timeout, protocol or status.
    pub cause: Option<&'static str>,
    pub error: Option<String>,
    pub request_id: Option<String>,
    pub response_head: Option<String>,
    pub retry_after: Option<Duration>,
}

/// GETs the check URL of one job with its `Idempotency-Key` (and the
/// `X-Idemhook-*` headers; signed like a forward when the action has a
/// `sign_secret`, over an empty body), within the action's timeout.
pub fn ask(
    client: &crate::outbox::dest::HttpClient,
    fwd: &Forward,
    template: &Template,
    job: (&str, &str, &str),
    signer: Option<&Verifier>,
) -> Asked {
    let (source, event_id, action) = job;
    let started_at = now_ms();
    let key = idempotency_key(source, event_id, action);
    let url = template.render(source, event_id, action);
    let mut asked = Asked {
        answer: Answer::Error,
        started_at,
        finished_at: started_at,
        http_status: None,
        cause: None,
        error: None,
        request_id: None,
        response_head: None,
        retry_after: None,
    };
    // A 401 to an OAuth2 token renews it and asks once more.
    let mut renewed = false;
    loop {
        let mut request = client
            .agent
            .get(&url)
            .config()
            .timeout_global(Some(fwd.timeout))
            .timeout_connect(Some(fwd.timeout.min(Duration::from_secs(5))))
            .build()
            .header("Idempotency-Key", key.as_str())
            .header("X-Idemhook-Source", source)
            .header("X-Idemhook-Event-Id", event_id)
            .header("X-Idemhook-Check", "1");
        if let Some(signer) = signer
            && let Ok(headers) = signer.sign(b"", started_at / 1000, &key)
        {
            for (name, value) in headers {
                request = request.header(name, value);
            }
        }
        let (request, used) = match client.prepare(request) {
            Ok(prepared) => prepared,
            Err(e) => {
                asked.cause = Some("auth");
                asked.error = Some(format!("the check got no answer: {}", e.0));
                break;
            }
        };
        match request.call() {
            Ok(mut response) => {
                let status = response.status().as_u16();
                if status == 401 && used.is_some() && !renewed {
                    let _ = response
                        .body_mut()
                        .with_config()
                        .limit(64 * 1024)
                        .read_to_vec();
                    client.renew(used);
                    renewed = true;
                    continue;
                }
                asked.http_status = Some(status);
                asked.answer = Answer::of_status(status);
                let read = read_answer(&mut response, &fwd.request_id_header, started_at);
                asked.request_id = read.request_id;
                asked.retry_after = read.retry_after;
                asked.response_head = Some(read.head);
                if asked.answer == Answer::Error {
                    asked.cause = Some("status");
                    asked.error = Some(format!(
                        "the check answered {status} (200: done, 404: not done)"
                    ));
                }
            }
            Err(e) => {
                let (kind, message) = crate::outbox::retry::classify_error(&e);
                asked.cause = Some(kind);
                asked.error = Some(format!("the check got no answer: {message}"));
            }
        }
        break;
    }
    asked.finished_at = now_ms();
    asked
}

/// What a downstream's answer says besides its status, read the same way
/// for a forward attempt and for a check: the request id header, a
/// `Retry-After` (relative to `started_at`, unix ms), and the head of the
/// body (at most 64 KiB read, 1 KiB kept), with the error of a body cut
/// short (only a 2xx forward attempt logs it).
pub struct AnswerRead {
    pub request_id: Option<String>,
    pub retry_after: Option<Duration>,
    pub head: String,
    pub body_error: Option<std::io::Error>,
}

pub fn read_answer(
    response: &mut ureq::http::Response<ureq::Body>,
    request_id_header: &str,
    started_at: i64,
) -> AnswerRead {
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let request_id = header(request_id_header);
    let retry_after = header("retry-after")
        .and_then(|v| crate::outbox::retry::parse_retry_after(&v, started_at / 1000));
    let mut head = Vec::new();
    let read = response
        .body_mut()
        .as_reader()
        .take(RESPONSE_READ_LIMIT)
        .read_to_end(&mut head);
    head.truncate(RESPONSE_HEAD_BYTES);
    AnswerRead {
        request_id,
        retry_after,
        head: String::from_utf8_lossy(&head).into_owned(),
        body_error: read.err(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_200_and_404_decide() {
        assert_eq!(Answer::of_status(200), Answer::Found);
        assert_eq!(Answer::of_status(404), Answer::NotFound);
        for s in [201, 204, 301, 400, 410, 429, 500, 503] {
            assert_eq!(Answer::of_status(s), Answer::Error, "{s}");
        }
    }
}
