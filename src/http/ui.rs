//! The web inspector under `/ui/`: the page and its assets (compiled into
//! the binary), sign-in sessions, and the checks that keep a browser's
//! session cookie from being used by anyone else's page.
//!
//! Owns: serving `/ui/...` (one HTML page for every view, ES modules and a
//! style sheet under `/ui/assets/`, with ETags), `POST`/`DELETE
//! /ui/session`, the in-memory [`SignIns`], the `Host` check against the
//! addresses a listener answers as (DNS rebinding), the same-origin check
//! for state-changing requests carried by the cookie, and the security
//! headers every inspector answer carries. Does not own what the page
//! shows: everything it reads and does goes through the admin API
//! (`admin.rs`), which accepts the session cookie through
//! [`cookie_auth`].

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::OnceLock;

use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::Incoming;
use super::reply::Reply;
use crate::http::app::App;
use crate::store::backend::Backend;
use crate::time::now_ms;

/// The session cookie's name.
pub const COOKIE: &str = "idemhook_session";

/// What every inspector answer carries: no inline script or style, nothing
/// from another origin, never framed.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
                       connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// An asset compiled into the binary.
struct Asset {
    name: &'static str,
    content_type: &'static str,
    body: &'static [u8],
}

const INDEX: Asset = Asset {
    name: "index.html",
    content_type: "text/html; charset=utf-8",
    body: include_bytes!("ui/index.html"),
};

const ASSETS: [Asset; 6] = [
    Asset {
        name: "app.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("ui/app.js"),
    },
    Asset {
        name: "views.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("ui/views.js"),
    },
    Asset {
        name: "util.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("ui/util.js"),
    },
    Asset {
        name: "icon.svg",
        content_type: "image/svg+xml",
        body: include_bytes!("ui/icon.svg"),
    },
    Asset {
        name: "style.css",
        content_type: "text/css; charset=utf-8",
        body: include_bytes!("ui/style.css"),
    },
    Asset {
        name: "refused.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("ui/refused.js"),
    },
];

/// A strong ETag of an asset's bytes, computed once per asset.
fn etag(asset: &Asset) -> &'static str {
    static TAGS: OnceLock<HashMap<&'static str, String>> = OnceLock::new();
    let tags = TAGS.get_or_init(|| {
        ASSETS
            .iter()
            .chain(std::iter::once(&INDEX))
            .map(|a| {
                let digest = Sha256::digest(a.body);
                (a.name, format!("\"{}\"", hex::encode(&digest[..12])))
            })
            .collect()
    });
    tags.get(asset.name).map_or("\"\"", String::as_str)
}

// ---------------------------------------------------------------------------
// Where a listener answers

/// One listener as the inspector's checks need it: the address as
/// configured (it may name a host) and the one it is bound to.
pub struct Listener {
    configured: String,
    bound: OnceLock<SocketAddr>,
    tls: bool,
    /// Where browsers reach it through a proxy (`public_origin`).
    public: Option<crate::config::public_origin::PublicOrigin>,
}

impl Listener {
    pub fn new(configured: &str, tls: bool) -> Listener {
        Listener {
            configured: configured.to_string(),
            bound: OnceLock::new(),
            tls,
            public: None,
        }
    }

    /// The same listener reached by browsers at `public` (a proxy in
    /// front, which may terminate TLS).
    pub fn with_public_origin(
        mut self,
        public: Option<crate::config::public_origin::PublicOrigin>,
    ) -> Listener {
        self.public = public;
        self
    }

    /// Whether the browser reaches it over TLS (here or at the proxy): the
    /// session cookie is then `Secure`.
    fn secure_cookie(&self) -> bool {
        self.tls || self.public.as_ref().is_some_and(|p| p.https)
    }

    /// Called once the socket is bound.
    pub fn bound(&self, addr: SocketAddr) {
        let _ = self.bound.set(addr);
    }

    fn scheme(&self) -> &'static str {
        if self.tls { "https" } else { "http" }
    }

    /// Whether `host` (a `Host` header) is a name this listener answers
    /// as: its IP address (any IP literal when it listens on all
    /// addresses), `localhost` when it listens on loopback, or the host
    /// named in its configured address; and its port. A name anyone could
    /// point at this machine (DNS rebinding) is refused.
    pub fn answers_as(&self, host: &str) -> bool {
        let Some(bound) = self.bound.get() else {
            return false;
        };
        let host = host.trim();
        if self
            .public
            .as_ref()
            .is_some_and(|p| p.host.eq_ignore_ascii_case(host))
        {
            return true;
        }
        let (name, port) = split_host(host);
        let port = match port {
            Some(p) => p,
            None if self.tls => 443,
            None => 80,
        };
        if port != bound.port() {
            return false;
        }
        let name = name.to_ascii_lowercase();
        let literal = name
            .strip_prefix('[')
            .and_then(|n| n.strip_suffix(']'))
            .unwrap_or(&name)
            .parse::<IpAddr>()
            .ok();
        let ip = bound.ip();
        if let Some(literal) = literal {
            return literal == ip
                || ip.is_unspecified()
                || (ip.is_loopback() && literal.is_loopback());
        }
        if name == "localhost" && (ip.is_loopback() || ip.is_unspecified()) {
            return true;
        }
        let (configured, _) = split_host(&self.configured);
        !configured.is_empty() && configured.eq_ignore_ascii_case(&name)
    }
}

/// `name:port`, `[v6]:port` or a bare name, as (name, port).
fn split_host(host: &str) -> (&str, Option<u16>) {
    if host.starts_with('[') {
        return match host.split_once("]:") {
            Some((name, port)) => (&host[..name.len() + 1], port.parse().ok()),
            None => (host, None),
        };
    }
    match host.rsplit_once(':') {
        Some((name, port)) if !name.contains(':') => match port.parse() {
            Ok(p) => (name, Some(p)),
            Err(_) => (host, Some(0)),
        },
        _ => (host, None),
    }
}

/// The session cookie's value in the request, if it sent one.
fn session_cookie<'a>(rq: &'a Incoming<'_>) -> Option<&'a str> {
    crate::verify::headers::header_values(&rq.headers, "cookie")
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value.trim())
        .filter(|v| !v.is_empty())
}

/// The verdict on an admin request that carries no `Authorization` header.
pub enum CookieAuth {
    /// No live session cookie: the bearer token rules apply.
    None,
    /// A live session, from the inspector's own page.
    Allowed,
    /// A live session, but the request cannot be trusted to come from the
    /// inspector: answer this.
    Refused(Reply),
}

/// Whether an admin API request is carried by a session cookie, and if so
/// whether it may proceed: its `Host` must be one this listener answers
/// as, and a request that changes something must say (by `Origin` or
/// `Sec-Fetch-Site`) that it came from the inspector's own origin.
pub fn cookie_auth<B: Backend>(app: &App<B>, rq: &Incoming<'_>, listener: &Listener) -> CookieAuth {
    let Some(value) = session_cookie(rq) else {
        return CookieAuth::None;
    };
    if !app.ui_sign_ins.touch(value, now_ms()) {
        return CookieAuth::None;
    }
    let refused = |why: &str, reply: Reply| {
        crate::log::warn(
            "inspector session refused",
            &[("remote", &rq.remote), ("path", &rq.path), ("why", &why)],
        );
        CookieAuth::Refused(reply)
    };
    if let Err(reply) = check_host(rq, listener) {
        return refused("host", reply);
    }
    let safe = matches!(rq.method, "GET" | "HEAD");
    if !safe && !same_origin(rq, listener) {
        return refused(
            "origin",
            Reply::error(
                403,
                "a request carried by the inspector's session cookie must come from the inspector's own page",
            ),
        );
    }
    CookieAuth::Allowed
}

fn check_host(rq: &Incoming<'_>, listener: &Listener) -> Result<(), Reply> {
    let mut hosts = crate::verify::headers::header_values(&rq.headers, "host");
    match (hosts.next(), hosts.next()) {
        (Some(host), None) if listener.answers_as(host) => Ok(()),
        _ => Err(Reply::error(
            403,
            "the Host header is not a name this server listens as",
        )),
    }
}

/// A state-changing request from the page itself: `Sec-Fetch-Site`, when
/// sent, says `same-origin`, and `Origin`, when sent, is this listener's
/// scheme and the request's own (checked) `Host`; at least one is sent.
fn same_origin(rq: &Incoming<'_>, listener: &Listener) -> bool {
    let site = rq.header("sec-fetch-site");
    if site.is_some_and(|s| !s.eq_ignore_ascii_case("same-origin")) {
        return false;
    }
    match rq.header("origin") {
        Some(origin) => {
            let host = rq.header("host").unwrap_or_default().trim();
            let origin = origin.trim();
            origin == format!("{}://{host}", listener.scheme())
                || listener
                    .public
                    .as_ref()
                    .is_some_and(|p| origin.eq_ignore_ascii_case(&p.origin))
        }
        None => site.is_some(),
    }
}

/// A sign-in (or sign-out) that a browser says came from another page: `Sec-Fetch-Site`
/// other than `same-origin`, or an `Origin` not this listener's. A request
/// with neither is not a browser's (every browser sends `Origin` on a
/// `POST`), so a script or `curl` signs in with the token alone; a page
/// elsewhere cannot, even with the token.
fn cross_origin(rq: &Incoming<'_>, listener: &Listener) -> bool {
    let told = rq.header("sec-fetch-site").is_some() || rq.header("origin").is_some();
    told && !same_origin(rq, listener)
}

// ---------------------------------------------------------------------------
// Routes

/// `/ui` and everything under it.
pub fn handle<B: Backend>(app: &App<B>, rq: &mut Incoming<'_>, listener: &Listener) -> Reply {
    let reply = route(app, rq, listener);
    secure(reply)
}

/// The headers every inspector answer carries.
pub fn secure(reply: Reply) -> Reply {
    reply
        .with_header("Content-Security-Policy", CSP)
        .with_header("X-Content-Type-Options", "nosniff")
        .with_header("Referrer-Policy", "no-referrer")
        .with_header("X-Frame-Options", "DENY")
        .with_header("Cross-Origin-Resource-Policy", "same-origin")
}

fn route<B: Backend>(app: &App<B>, rq: &mut Incoming<'_>, listener: &Listener) -> Reply {
    let Some(token) = &app.config.admin_token else {
        return Reply::error(404, "the inspector is off: set admin_token to enable it");
    };
    if let Err(reply) = check_host(rq, listener) {
        return reply;
    }
    let rest = rq.path.strip_prefix("/ui").unwrap_or_default();
    if rest == "/session" {
        return session(app, rq, listener, token.expose());
    }
    if !matches!(rq.method, "GET" | "HEAD") {
        return Reply::method_not_allowed("GET");
    }
    if let Some(name) = rest.strip_prefix("/assets/") {
        return match ASSETS.iter().find(|a| a.name == name) {
            Some(asset) => serve(rq, asset),
            None => Reply::error(404, "no such inspector asset"),
        };
    }
    // Every view is the same page; it reads its own URL.
    serve(rq, &INDEX)
}

/// An asset, or 304 when the browser already has these bytes.
fn serve(rq: &Incoming<'_>, asset: &Asset) -> Reply {
    let tag = etag(asset);
    let cached = crate::verify::headers::header_values(&rq.headers, "if-none-match")
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().trim_start_matches("W/") == tag);
    let reply = if cached {
        Reply::text(304, asset.content_type, String::new())
    } else {
        Reply {
            status: 200,
            content_type: asset.content_type,
            headers: Vec::new(),
            body: asset.body.to_vec(),
            failpoint: None,
            later: false,
        }
    };
    reply
        .with_header("ETag", tag)
        .with_header("Cache-Control", "no-cache")
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SignIn {
    token: String,
}

/// `POST /ui/session` signs in with the admin token; `DELETE` signs out;
/// `GET` answers `{"signed_in": true|false}`.
fn session<B: Backend>(
    app: &App<B>,
    rq: &mut Incoming<'_>,
    listener: &Listener,
    token: &str,
) -> Reply {
    match rq.method {
        "GET" | "HEAD" => {
            let signed_in =
                session_cookie(rq).is_some_and(|value| app.ui_sign_ins.touch(value, now_ms()));
            Reply::json(200, &serde_json::json!({ "signed_in": signed_in }))
                .with_header("Cache-Control", "no-store")
        }
        "POST" => {
            if cross_origin(rq, listener) {
                return Reply::error(403, "sign in from the inspector's own page");
            }
            let given = (rq.body.len() <= 4096)
                .then(|| serde_json::from_slice::<SignIn>(&rq.body).ok())
                .flatten();
            let Some(given) = given else {
                return Reply::error(400, "expected a JSON body {\"token\": \"...\"}");
            };
            if !crate::http::auth::same_token(&given.token, token) {
                if let Some(wait) = app.admin_limiter.blocked(&rq.remote, now_ms()) {
                    return Reply::error(429, "too many failed admin authentications; retry later")
                        .with_header("Retry-After", wait.to_string());
                }
                app.admin_limiter.failed(&rq.remote, now_ms());
                crate::log::warn(
                    "inspector sign-in failed",
                    &[("remote", &rq.remote), ("path", &rq.path)],
                );
                return Reply::error(401, "wrong admin token");
            }
            let Some(value) = app.ui_sign_ins.create(now_ms()) else {
                return Reply::error(500, "cannot make a session: no randomness available");
            };
            Reply::text(204, "text/plain", String::new())
                .with_header(
                    "Set-Cookie",
                    cookie(&value, listener.secure_cookie(), false),
                )
                .with_header("Cache-Control", "no-store")
        }
        "DELETE" => {
            // Like a sign-in: refused when a browser says another page sent
            // it; a client that is not a browser may end its own session.
            if session_cookie(rq).is_some() && cross_origin(rq, listener) {
                return Reply::error(403, "sign out from the inspector's own page");
            }
            if let Some(value) = session_cookie(rq) {
                app.ui_sign_ins.end(value);
            }
            Reply::text(204, "text/plain", String::new())
                .with_header("Set-Cookie", cookie("", listener.secure_cookie(), true))
        }
        _ => Reply::method_not_allowed("GET, POST, DELETE"),
    }
}

fn cookie(value: &str, tls: bool, expire: bool) -> String {
    let mut c = format!("{COOKIE}={value}; Path=/; HttpOnly; SameSite=Strict");
    if !expire {
        // The browser forgets it when the session's lifetime is over.
        c.push_str(&format!(
            "; Max-Age={}",
            crate::http::auth::LIFETIME_MS / 1000
        ));
    }
    if tls {
        c.push_str("; Secure");
    }
    if expire {
        c.push_str("; Max-Age=0");
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listener(configured: &str, bound: &str) -> Listener {
        let l = Listener::new(configured, false);
        l.bound(bound.parse().unwrap());
        l
    }

    #[test]
    fn host_must_be_a_name_the_listener_answers_as() {
        let l = listener("127.0.0.1:0", "127.0.0.1:8080");
        assert!(l.answers_as("127.0.0.1:8080"));
        assert!(l.answers_as("localhost:8080"));
        assert!(l.answers_as("[::1]:8080"));
        assert!(!l.answers_as("127.0.0.1:8081"));
        assert!(!l.answers_as("evil.example:8080"));
        assert!(!l.answers_as("127.0.0.1"));
        let named = listener("ops.internal:9090", "10.0.0.5:9090");
        assert!(named.answers_as("OPS.internal:9090"));
        assert!(named.answers_as("10.0.0.5:9090"));
        assert!(!named.answers_as("localhost:9090"));
        assert!(!named.answers_as("10.0.0.6:9090"));
        let all = listener("0.0.0.0:80", "0.0.0.0:80");
        assert!(all.answers_as("192.0.2.1"));
        assert!(!all.answers_as("rebound.example"));
    }

    #[test]
    fn every_asset_has_a_tag() {
        for a in ASSETS.iter().chain(std::iter::once(&INDEX)) {
            assert_eq!(etag(a).len(), 26, "{}", a.name);
        }
    }
}
