//! What a handler answers: status, headers and body, turned into a
//! tiny_http response at the last moment.

use serde_json::{Value, json};

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
}

impl Reply {
    pub fn json(status: u16, body: &Value) -> Reply {
        Reply {
            status,
            content_type: "application/json",
            headers: Vec::new(),
            body: body.to_string().into_bytes(),
            failpoint: None,
        }
    }

    pub fn text(status: u16, content_type: &'static str, body: String) -> Reply {
        Reply {
            status,
            content_type,
            headers: Vec::new(),
            body: body.into_bytes(),
            failpoint: None,
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

    pub fn into_response(self) -> tiny_http::Response<std::io::Cursor<Vec<u8>>> {
        let mut response = tiny_http::Response::from_data(self.body).with_status_code(self.status);
        let mut headers = vec![("Content-Type", self.content_type.to_string())];
        headers.extend(self.headers.into_iter().map(|(n, v)| (n, v)));
        for (name, value) in headers {
            if let Ok(h) = tiny_http::Header::from_bytes(name.as_bytes(), value.as_bytes()) {
                response.add_header(h);
            }
        }
        response
    }
}
