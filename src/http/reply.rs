//! What a handler answers: status, headers and body; `server/` writes it.

use serde::Serialize;
use serde_json::json;

/// Seconds a sender should wait after a 503 before trying again.
pub const RETRY_AFTER_SECS: &str = "1";

pub struct Reply {
    pub status: u16,
    pub content_type: &'static str,
    pub headers: Vec<(&'static str, String)>,
    pub body: Vec<u8>,
    /// A failpoint to hit after the work is done and before the response
    /// is written (tests only; inert unless IDEMHOOK_FAILPOINTS names it).
    pub failpoint: Option<&'static str>,
    /// The answer is written later, by whoever holds the request's
    /// `server::Promise`; the server writes nothing for this reply.
    pub(super) later: bool,
}

impl Reply {
    pub fn json(status: u16, body: &impl Serialize) -> Reply {
        Reply {
            status,
            content_type: "application/json",
            headers: Vec::new(),
            // Only a map with non-string keys fails to serialize; no
            // answer has one.
            body: serde_json::to_vec(body).unwrap_or_else(|_| b"{}".to_vec()),
            failpoint: None,
            later: false,
        }
    }

    pub fn text(status: u16, content_type: &'static str, body: String) -> Reply {
        Reply {
            status,
            content_type,
            headers: Vec::new(),
            body: body.into_bytes(),
            failpoint: None,
            later: false,
        }
    }

    /// `{"error": message}`. Messages say what was wrong and never echo
    /// secrets or signatures.
    pub fn error(status: u16, message: &str) -> Reply {
        Reply::json(status, &json!({ "error": message }))
    }

    pub fn method_not_allowed(allow: &'static str) -> Reply {
        Reply::error(405, &format!("method not allowed: use {allow}")).with_header("Allow", allow)
    }

    /// A 503 for storage trouble, with Retry-After.
    pub fn unavailable(detail: &str) -> Reply {
        Reply::error(503, &format!("storage unavailable, retry later: {detail}")).retry_after()
    }

    pub fn retry_after(self) -> Reply {
        self.with_header("Retry-After", RETRY_AFTER_SECS)
    }

    pub fn with_header(mut self, name: &'static str, value: impl Into<String>) -> Reply {
        self.headers.push((name, value.into()));
        self
    }

    pub fn with_failpoint(mut self, name: &'static str) -> Reply {
        self.failpoint = Some(name);
        self
    }
}
