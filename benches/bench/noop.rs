//! The no-op server (and the W4 downstream).

use super::*;

/// What the W4 downstream saw.
pub(crate) struct Seen {
    pub(crate) keys: Mutex<HashSet<String>>,
    /// Client addresses: how many connections the forwarder used.
    pub(crate) peers: Mutex<HashSet<SocketAddr>>,
    pub(crate) total: AtomicUsize,
    pub(crate) target: usize,
    pub(crate) done_at: Mutex<Option<Instant>>,
    pub(crate) cv: Condvar,
}

pub(crate) struct NoopServer {
    pub(crate) server: Arc<tiny_http::Server>,
    pub(crate) workers: Vec<JoinHandle<()>>,
    pub(crate) addr: SocketAddr,
    pub(crate) seen: Option<Arc<Seen>>,
}

impl NoopServer {
    /// Reads the body, answers 200 with a small JSON body; with `target`,
    /// also records each request's Idempotency-Key.
    pub(crate) fn start(target: Option<usize>) -> Result<NoopServer, String> {
        let server = tiny_http::Server::http("127.0.0.1:0").map_err(|e| e.to_string())?;
        let addr = server
            .server_addr()
            .to_ip()
            .ok_or("no-op server has no IP address")?;
        let server = Arc::new(server);
        let seen = target.map(|target| {
            Arc::new(Seen {
                keys: Mutex::new(HashSet::with_capacity(target)),
                peers: Mutex::new(HashSet::new()),
                total: AtomicUsize::new(0),
                target,
                done_at: Mutex::new(None),
                cv: Condvar::new(),
            })
        });
        let content_type =
            tiny_http::Header::from_bytes(&b"Content-Type"[..], &b"application/json"[..])
                .map_err(|()| "bad header".to_string())?;
        let workers = (0..HTTP_WORKERS)
            .map(|i| {
                let (server, seen, ct) = (server.clone(), seen.clone(), content_type.clone());
                std::thread::Builder::new()
                    .name(format!("noop-{i}"))
                    .spawn(move || noop_worker(&server, seen.as_deref(), &ct))
                    .map_err(|e| e.to_string())
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(NoopServer {
            server,
            workers,
            addr,
            seen,
        })
    }

    pub(crate) fn stop(self) {
        for _ in &self.workers {
            self.server.unblock();
        }
        for w in self.workers {
            let _ = w.join();
        }
    }
}

pub(crate) fn noop_worker(server: &tiny_http::Server, seen: Option<&Seen>, ct: &tiny_http::Header) {
    let mut body = Vec::with_capacity(4096);
    while let Ok(mut rq) = server.recv() {
        body.clear();
        let _ = rq.as_reader().read_to_end(&mut body);
        if let Some(seen) = seen {
            seen.total.fetch_add(1, Ordering::Relaxed);
            if let Some(peer) = rq.remote_addr() {
                let mut peers = seen.peers.lock().unwrap_or_else(|e| e.into_inner());
                peers.insert(*peer);
            }
            let key = rq
                .headers()
                .iter()
                .find(|h| h.field.equiv("Idempotency-Key"))
                .map(|h| h.value.as_str().to_string());
            if let Some(key) = key {
                let distinct = {
                    let mut keys = seen.keys.lock().unwrap_or_else(|e| e.into_inner());
                    keys.insert(key);
                    keys.len()
                };
                if distinct == seen.target {
                    let mut d = seen.done_at.lock().unwrap_or_else(|e| e.into_inner());
                    d.get_or_insert_with(Instant::now);
                    seen.cv.notify_all();
                }
            }
        }
        let response = tiny_http::Response::from_data(&br#"{"status":"ok"}"#[..])
            .with_status_code(200)
            .with_header(ct.clone());
        let _ = rq.respond(response);
    }
}
