//! HTTP: the tiny_http server, its worker pool and the routes. Only this
//! module knows tiny_http; handlers take a plain [`Incoming`] and return a
//! [`Reply`].

pub mod hooks;
pub mod reply;

use std::io::Read;
use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;

use crate::app::App;
use reply::Reply;

/// Longest request target we route; longer ones are answered 414.
const MAX_URL_BYTES: usize = 4096;

/// A request as the handlers see it.
pub struct Incoming<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub query: &'a str,
    pub headers: Vec<(String, String)>,
    pub remote: String,
    /// The declared body length, if any.
    pub content_length: Option<usize>,
    pub body: &'a mut dyn Read,
}

impl Incoming<'_> {
    pub fn header(&self, name: &str) -> Option<&str> {
        crate::verify::header_values(&self.headers, name).next()
    }
}

/// The running server: its address and its worker threads.
pub struct HttpServer {
    server: Arc<tiny_http::Server>,
    workers: Vec<JoinHandle<()>>,
    pub addr: SocketAddr,
}

impl HttpServer {
    /// Binds `listen` and starts `workers` threads answering requests.
    pub fn start(app: Arc<App>, listen: &str, workers: usize) -> Result<HttpServer, String> {
        let server = tiny_http::Server::http(listen)
            .map_err(|e| format!("cannot listen on {listen}: {e}"))?;
        let addr = server
            .server_addr()
            .to_ip()
            .ok_or_else(|| format!("{listen} is not an IP address"))?;
        let server = Arc::new(server);
        let mut handles = Vec::with_capacity(workers);
        for i in 0..workers {
            let (server, app) = (server.clone(), app.clone());
            let handle = std::thread::Builder::new()
                .name(format!("idemhook-http-{i}"))
                .spawn(move || worker(&server, &app))
                .map_err(|e| format!("cannot start an HTTP worker: {e}"))?;
            handles.push(handle);
        }
        Ok(HttpServer {
            server,
            workers: handles,
            addr,
        })
    }

    /// Stops accepting, lets each worker finish the request it holds, and
    /// joins them.
    pub fn stop(self) {
        for _ in &self.workers {
            self.server.unblock();
        }
        for w in self.workers {
            let _ = w.join();
        }
    }
}

fn worker(server: &tiny_http::Server, app: &App) {
    while let Ok(request) = server.recv() {
        // A panic in a handler answers 500 (tiny_http does that when a
        // request is dropped unanswered) and the worker keeps serving.
        let outcome =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| handle(app, request)));
        if outcome.is_err() {
            crate::log::error("handler panicked", &[("effect", &"answered 500")]);
        }
    }
}

fn handle(app: &App, mut request: tiny_http::Request) {
    let url = request.url().to_string();
    let method = request.method().as_str().to_string();
    let remote = request
        .remote_addr()
        .map(ToString::to_string)
        .unwrap_or_default();
    let reply = if url.len() > MAX_URL_BYTES {
        Reply::error(414, "request target too long")
    } else {
        let (path, query) = url.split_once('?').unwrap_or((&url, ""));
        let headers: Vec<(String, String)> = request
            .headers()
            .iter()
            .map(|h| {
                (
                    h.field.as_str().as_str().to_string(),
                    h.value.as_str().to_string(),
                )
            })
            .collect();
        let content_length = request.body_length();
        let mut incoming = Incoming {
            method: &method,
            path,
            query,
            headers,
            remote,
            content_length,
            body: request.as_reader(),
        };
        route(app, &mut incoming)
    };
    if let Some(fp) = reply.failpoint {
        crate::failpoint::hit(fp);
    }
    let status = reply.status;
    if let Err(e) = request.respond(reply.into_response()) {
        crate::log::debug(
            "response not delivered",
            &[("error", &e), ("status", &status)],
        );
    }
}

fn route(app: &App, rq: &mut Incoming<'_>) -> Reply {
    let path = rq.path;
    if let Some(source) = path.strip_prefix("/hooks/") {
        return hooks::receive(app, source, rq);
    }
    match path {
        "/healthz" => match rq.method {
            "GET" | "HEAD" => Reply::json(200, &serde_json::json!({"status": "ok"})),
            _ => Reply::method_not_allowed("GET"),
        },
        "/readyz" => match rq.method {
            "GET" | "HEAD" => match app.ready() {
                Ok(()) => Reply::json(200, &serde_json::json!({"status": "ready"})),
                Err(e) => Reply::error(503, &format!("storage unavailable: {e}")).retry_after(),
            },
            _ => Reply::method_not_allowed("GET"),
        },
        "/metrics" => match rq.method {
            "GET" | "HEAD" => Reply::text(
                200,
                "text/plain; version=0.0.4; charset=utf-8",
                app.render_metrics(),
            ),
            _ => Reply::method_not_allowed("GET"),
        },
        _ => Reply::error(404, "no such route: webhooks are posted to /hooks/{source}"),
    }
}

/// Reads at most `limit` bytes of body. Err(true) when there is more.
pub fn read_body(
    body: &mut dyn Read,
    expected: Option<usize>,
    limit: usize,
) -> Result<Vec<u8>, BodyError> {
    let mut buf = Vec::with_capacity(expected.unwrap_or(4096).min(limit));
    let mut limited = body.take(limit as u64 + 1);
    limited
        .read_to_end(&mut buf)
        .map_err(|e| BodyError::Io(e.to_string()))?;
    if buf.len() > limit {
        return Err(BodyError::TooLarge);
    }
    if let Some(n) = expected {
        if buf.len() != n {
            return Err(BodyError::Short {
                expected: n,
                got: buf.len(),
            });
        }
    }
    Ok(buf)
}

#[derive(Debug)]
pub enum BodyError {
    TooLarge,
    Short { expected: usize, got: usize },
    Io(String),
}
