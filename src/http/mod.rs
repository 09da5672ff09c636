//! HTTP: our HTTP/1.1 server (`server/`), the routes, and the handlers.
//! Handlers take a plain [`Incoming`] and return a [`Reply`]; only
//! `server/` touches sockets. The state they share is `app::App` (with
//! `auth`, the admin token and sessions, and `readiness`, the coalesced
//! `/readyz` probe), built once by `serve`.

pub mod admin;
pub mod app;
pub mod auth;
pub mod hooks;
pub mod readiness;
pub mod reply;
pub mod server;
pub mod ui;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::http::app::App;
use crate::store::backend::Backend;
use reply::Reply;

/// A request as the handlers see it. The body has already been read whole
/// (within `max_body_bytes`) by the connection thread.
pub struct Incoming<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub query: &'a str,
    pub headers: Vec<(String, String)>,
    pub remote: String,
    /// The declared body length, if any.
    pub content_length: Option<usize>,
    /// The body, whole. (A body too large, late, short or malformed is
    /// answered by the server before any handler.)
    pub body: Vec<u8>,
    /// The processing permit, for a handler that gives it back before a
    /// long wait.
    pub permit: Option<&'a mut server::Permit>,
    /// The right to answer after returning, when the server offers it.
    pub later: Option<server::Later>,
}

impl Incoming<'_> {
    pub fn header(&self, name: &str) -> Option<&str> {
        crate::verify::headers::header_values(&self.headers, name).next()
    }
}

/// Which routes a listener serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Surface {
    /// Everything (no `admin_listen`).
    All,
    /// Hooks and health only (`admin_listen` is set).
    Public,
    /// Admin API, metrics and health (the `admin_listen` listener).
    Admin,
}

/// How long a stop waits for requests already under way to be answered.
pub const STOP_GRACE: Duration = Duration::from_secs(10);

/// The running listeners.
pub struct HttpServer {
    servers: Vec<server::Server>,
    /// The main listener's address.
    pub addr: SocketAddr,
    /// The admin listener's address, when there is one.
    pub admin_addr: Option<SocketAddr>,
}

impl HttpServer {
    /// Binds `listen` (and `admin_listen`, if set) and starts serving.
    pub fn start<B: Backend>(app: Arc<App<B>>) -> Result<HttpServer, String> {
        let config = &app.config;
        let tls = match &config.tls {
            Some(files) => Some(tls_config(files)?),
            None => None,
        };
        let listeners = 1 + usize::from(config.admin_listen.is_some());
        // Descriptors kept for the database, logs and downstream calls.
        let reserve = 64 + 2 * config.forward_workers;
        let max_connections =
            server::fit_to_descriptors(config.http.max_connections, listeners, reserve);
        let limits = server::Limits::new(
            config.http_workers,
            config.max_body_bytes,
            max_connections,
            config.http.header_timeout,
            config.http.body_timeout,
            config.http.idle_timeout,
        )
        .per_address(
            config.http.max_connections_per_address,
            config.http.min_receive_rate,
        );
        let bind = |listen: &str, surface: Surface| {
            let for_handler = app.clone();
            let listener = Arc::new(
                ui::Listener::new(listen, tls.is_some())
                    .with_public_origin(app.config.public_origin.clone()),
            );
            let for_checks = listener.clone();
            let handler = Box::new(move |rq: &mut server::Request| {
                handle(&for_handler, rq, surface, &for_checks)
            });
            let for_refused = app.clone();
            let refused = Box::new(
                move |target: &str, remote: SocketAddr, status: u16, message: &str| {
                    refused_head(&for_refused, surface, target, remote, status, message);
                },
            );
            let server =
                server::Server::bind(listen, limits.clone(), tls.clone(), handler, refused)
                    .map_err(|e| format!("cannot listen on {listen}: {e}"))?;
            listener.bound(server.addr());
            Ok::<_, String>(server)
        };
        let (main_surface, admin) = match &config.admin_listen {
            Some(admin_listen) => (Surface::Public, Some(bind(admin_listen, Surface::Admin)?)),
            None => (Surface::All, None),
        };
        let main = bind(&config.listen, main_surface)?;
        let addr = main.addr();
        let admin_addr = admin.as_ref().map(server::Server::addr);
        Ok(HttpServer {
            servers: std::iter::once(main).chain(admin).collect(),
            addr,
            admin_addr,
        })
    }

    /// Stops accepting, lets requests already read finish, and waits for
    /// their connections (at most [`STOP_GRACE`]).
    pub fn stop(self) {
        for s in self.servers {
            s.stop(STOP_GRACE);
        }
    }
}

/// A rustls server config from PEM files.
fn tls_config(files: &crate::config::TlsFiles) -> Result<Arc<rustls::ServerConfig>, String> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.cert)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("tls_cert {}: {e}", files.cert.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "tls_cert {}: no certificate found",
            files.cert.display()
        ));
    }
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .map_err(|e| format!("tls_key {}: {e}", files.key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("tls: {e}"))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| format!("tls_cert/tls_key: {e}"))?;
    Ok(Arc::new(config))
}

fn handle<B: Backend>(
    app: &Arc<App<B>>,
    rq: &mut server::Request,
    surface: Surface,
    listener: &ui::Listener,
) -> Reply {
    let target = rq.target.clone();
    let (path, query) = target.split_once('?').unwrap_or((&target, ""));
    let mut incoming = Incoming {
        method: &rq.method,
        path,
        query,
        headers: std::mem::take(&mut rq.headers),
        remote: rq.remote.to_string(),
        content_length: rq.content_length,
        body: std::mem::take(&mut rq.body),
        permit: Some(&mut rq.permit),
        later: rq.later.take(),
    };
    route(app, &mut incoming, surface, listener)
}

/// A request the server refused while reading its head: a delivery to a
/// hook route is counted and recorded like any refused delivery.
fn refused_head<B: Backend>(
    app: &App<B>,
    surface: Surface,
    target: &str,
    remote: SocketAddr,
    status: u16,
    message: &str,
) {
    let path = target.split_once('?').map_or(target, |(p, _)| p);
    if let Some(source) = path.strip_prefix("/hooks/")
        && surface != Surface::Admin
    {
        hooks::refused_head(app, source, &remote.to_string(), status, message);
    }
}

fn route<B: Backend>(
    app: &Arc<App<B>>,
    rq: &mut Incoming<'_>,
    surface: Surface,
    listener: &ui::Listener,
) -> Reply {
    let path = rq.path;
    let admin_here = surface != Surface::Public;
    if let Some(source) = path.strip_prefix("/hooks/") {
        if surface == Surface::Admin {
            return Reply::error(404, "webhooks are not received on the admin listener");
        }
        return hooks::receive(app, source, rq);
    }
    if admin_here && (path == "/api" || path.starts_with("/api/")) {
        return admin::handle(app, rq, listener);
    }
    if admin_here && (path == "/ui" || path.starts_with("/ui/")) {
        return ui::handle(app, rq, listener);
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
        "/metrics" if admin_here => match rq.method {
            "GET" | "HEAD" => {
                // On the main listener (no admin_listen), with a token set,
                // metrics take the admin token too.
                if surface == Surface::All
                    && let Err(refused) = admin::metrics_gate(app, rq)
                {
                    return refused;
                }
                Reply::text(
                    200,
                    "text/plain; version=0.0.4; charset=utf-8",
                    app.render_metrics(),
                )
            }
            _ => Reply::method_not_allowed("GET"),
        },
        _ => Reply::error(404, "no such route: webhooks are posted to /hooks/{source}"),
    }
}
