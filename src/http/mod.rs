//! HTTP: our HTTP/1.1 server (`server.rs`), the routes, and the handlers.
//! Handlers take a plain [`Incoming`] and return a [`Reply`]; only
//! `server.rs` touches sockets.

pub mod admin;
pub mod hooks;
pub mod reply;
pub mod server;

use std::io::Read;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::app::App;
use reply::Reply;
pub use server::BodyProblem;

/// A request as the handlers see it. The body has already been read (up to
/// `max_body_bytes` + 1 bytes) by the connection thread.
pub struct Incoming<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub query: &'a str,
    pub headers: Vec<(String, String)>,
    pub remote: String,
    /// The declared body length, if any.
    pub content_length: Option<usize>,
    pub body: &'a mut dyn Read,
    /// Why the body could not be read whole, if it could not.
    pub body_problem: Option<BodyProblem>,
}

impl Incoming<'_> {
    pub fn header(&self, name: &str) -> Option<&str> {
        crate::verify::header_values(&self.headers, name).next()
    }
}

/// The running server.
pub struct HttpServer {
    server: server::Server,
    pub addr: SocketAddr,
}

impl HttpServer {
    /// Binds `listen` and starts serving with `workers` processing permits.
    pub fn start(app: Arc<App>, listen: &str, workers: usize) -> Result<HttpServer, String> {
        let limits = server::Limits::new(workers, app.config.max_body_bytes);
        let handler = Box::new(move |rq: &mut server::Request| handle(&app, rq));
        let server = server::Server::bind(listen, limits, handler)
            .map_err(|e| format!("cannot listen on {listen}: {e}"))?;
        let addr = server.addr();
        Ok(HttpServer { server, addr })
    }

    /// Stops accepting, lets requests already read finish, and waits for
    /// their connections (at most 10 s).
    pub fn stop(self) {
        self.server.stop(Duration::from_secs(10));
    }
}

fn handle(app: &App, rq: &mut server::Request) -> Reply {
    let target = rq.target.clone();
    let (path, query) = target.split_once('?').unwrap_or((&target, ""));
    let (bytes, problem) = match std::mem::replace(&mut rq.body, Ok(Vec::new())) {
        Ok(b) => (b, None),
        Err(p) => (Vec::new(), Some(p)),
    };
    let mut cursor = std::io::Cursor::new(bytes);
    let mut incoming = Incoming {
        method: &rq.method,
        path,
        query,
        headers: std::mem::take(&mut rq.headers),
        remote: rq.remote.to_string(),
        content_length: rq.content_length,
        body: &mut cursor,
        body_problem: problem,
    };
    route(app, &mut incoming)
}

fn route(app: &App, rq: &mut Incoming<'_>) -> Reply {
    let path = rq.path;
    if let Some(source) = path.strip_prefix("/hooks/") {
        return hooks::receive(app, source, rq);
    }
    if path == "/api" || path.starts_with("/api/") {
        return admin::handle(app, rq);
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
    if let Some(n) = expected
        && buf.len() != n
    {
        return Err(BodyError::Short {
            expected: n,
            got: buf.len(),
        });
    }
    Ok(buf)
}

#[derive(Debug)]
pub enum BodyError {
    TooLarge,
    Short { expected: usize, got: usize },
    Io(String),
}
