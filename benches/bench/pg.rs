//! The benchmark's PostgreSQL mode (`-- --postgres`): W1 and W2 against
//! one and two `idemhook serve` instances on one local PostgreSQL cluster
//! (fsync and `synchronous_commit` on), beside the classic design run by
//! the same load generator against the same cluster: a server that
//! answers each request after its own transaction (claim with
//! `INSERT ... ON CONFLICT DO NOTHING RETURNING`, then mark the event
//! done, then COMMIT), 8 workers with a connection each, no signature
//! check (which only favours it).

use super::*;

use crate::pg_cluster;

/// One run's requests per second of each setup.
struct PgRow {
    name: &'static str,
    what: String,
    classic: f64,
    one: f64,
    two: f64,
    problems: Vec<String>,
}

pub fn run(opts: &Opts) -> ExitCode {
    let Some(local) = pg_cluster::private_with(&[
        "fsync=on",
        "full_page_writes=on",
        "synchronous_commit=on",
        "max_connections=300",
    ]) else {
        println!("bench --postgres: no PostgreSQL (initdb and postgres not found)");
        return ExitCode::from(2);
    };
    let cluster = local.cluster();
    println!(
        "setup:    one local PostgreSQL cluster (unix socket, fsync on, synchronous_commit on); \
         idemhook serve durability full; {} run(s) each, medians",
        opts.runs
    );
    let mut rows = Vec::new();
    for w in workloads(opts) {
        if !(w.name == "W1" || w.name == "W2") || !opts.wants(w.name) {
            continue;
        }
        let mut classic = Vec::new();
        let mut one = Vec::new();
        let mut two = Vec::new();
        let mut problems = Vec::new();
        for run in 0..opts.runs {
            let seed = now_ms() as u64 ^ run as u64;
            let reqs = build_requests(&w, seed);
            for (label, out) in [
                ("classic", &mut classic),
                ("one", &mut one),
                ("two", &mut two),
            ] {
                let url = cluster.create_database(&format!("bench_{}_{label}_{run}", w.name));
                let result = match label {
                    "classic" => run_classic(&url, &reqs, w.conns),
                    "one" => run_instances(&url, &reqs, w.conns, 1, opts),
                    _ => run_instances(&url, &reqs, w.conns, 2, opts),
                };
                match result {
                    Ok((rps, stored, note)) => {
                        if stored != w.events as i64 {
                            problems.push(format!(
                                "{label}: {stored} events stored, {} sent",
                                w.events
                            ));
                        }
                        if note != "none" {
                            problems.push(format!("{label}: {note}"));
                        }
                        out.push(rps);
                    }
                    Err(e) => problems.push(format!("{label}: {e}")),
                }
            }
        }
        rows.push(PgRow {
            name: w.name,
            what: w.what.clone(),
            classic: median(&classic),
            one: median(&one),
            two: median(&two),
            problems,
        });
    }
    println!();
    println!(
        "| workload | classic (tx per event) | idemhook, 1 instance | idemhook, 2 instances | 1 / classic | 2 / 1 | problems |"
    );
    println!("|---|---|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} {} | {} req/s | {} | {} | {:.2} | {:.2} | {} |",
            r.name,
            r.what,
            fmt_int(r.classic),
            fmt_int(r.one),
            fmt_int(r.two),
            r.one / r.classic.max(1e-9),
            r.two / r.one.max(1e-9),
            if r.problems.is_empty() {
                "none".to_string()
            } else {
                r.problems.join("; ")
            }
        );
    }
    drop(local);
    ExitCode::SUCCESS
}

/// idemhook on `url`, `n` instances; the requests split between them so
/// that an event's copies reach both. Returns (req/s, events stored,
/// problems).
fn run_instances(
    url: &str,
    reqs: &Requests,
    conns: usize,
    n: usize,
    opts: &Opts,
) -> Result<(f64, i64, String), String> {
    let config = idemhook_config(opts.idem_workers, None, None).replace(
        "database = \"idemhook.db\"",
        &format!("database = \"{url}\""),
    );
    let dirs: Vec<tempfile::TempDir> = (0..n)
        .map(|_| tempfile::tempdir().map_err(|e| e.to_string()))
        .collect::<Result<_, _>>()?;
    let servers: Vec<Idemhook> = dirs
        .iter()
        .map(|d| Idemhook::start(d.path(), &config, opts))
        .collect::<Result<_, _>>()?;
    let parts: Vec<Vec<Vec<u8>>> = (0..n)
        .map(|k| {
            reqs.bytes
                .iter()
                .enumerate()
                .filter(|(i, _)| i % n == k)
                .map(|(_, b)| b.clone())
                .collect()
        })
        .collect();
    let start = Instant::now();
    let results: Vec<LoadResult> = std::thread::scope(|scope| {
        let handles: Vec<_> = servers
            .iter()
            .zip(&parts)
            .map(|(s, part)| {
                let addr = s.addr;
                scope.spawn(move || run_load(addr, part, conns / n))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_default())
            .collect()
    });
    let wall = start.elapsed().as_secs_f64();
    let ok: usize = results.iter().map(|r| r.ok).sum();
    let problems: Vec<String> = results
        .iter()
        .map(|r| r.problems())
        .filter(|p| p != "none")
        .collect();
    for s in servers {
        s.stop();
    }
    let stored = count_events(url)?;
    Ok((
        ok as f64 / wall.max(1e-9),
        stored,
        if problems.is_empty() {
            "none".into()
        } else {
            problems.join(", ")
        },
    ))
}

fn count_events(url: &str) -> Result<i64, String> {
    let mut c = postgres::Client::connect(url, postgres::NoTls).map_err(|e| e.to_string())?;
    c.query_one("SELECT count(*) FROM events", &[])
        .map(|r| r.get(0))
        .map_err(|e| e.to_string())
}

/// The classic design on `url`: a transaction per request.
fn run_classic(url: &str, reqs: &Requests, conns: usize) -> Result<(f64, i64, String), String> {
    let mut admin = postgres::Client::connect(url, postgres::NoTls).map_err(|e| e.to_string())?;
    admin
        .batch_execute(include_str!("../../migrations/postgres/0001_init.sql"))
        .map_err(|e| e.to_string())?;
    let server = tiny_http::Server::http("127.0.0.1:0").map_err(|e| e.to_string())?;
    let addr = server
        .server_addr()
        .to_ip()
        .ok_or("the classic server has no address")?;
    let server = Arc::new(server);
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..HTTP_WORKERS)
        .map(|_| {
            let (server, stop, url) = (server.clone(), stop.clone(), url.to_string());
            std::thread::spawn(move || classic_worker(&server, &stop, &url))
        })
        .collect();
    let result = run_load(addr, &reqs.bytes, conns);
    stop.store(true, Ordering::SeqCst);
    server.unblock();
    for w in workers {
        let _ = w.join();
    }
    let stored = count_events(url)?;
    Ok((result.rps(), stored, result.problems()))
}

fn classic_worker(server: &tiny_http::Server, stop: &AtomicBool, url: &str) {
    let Ok(mut db) = postgres::Client::connect(url, postgres::NoTls) else {
        return;
    };
    let json = tiny_http::Header::from_bytes("Content-Type", "application/json").ok();
    while !stop.load(Ordering::Relaxed) {
        let Ok(Some(mut rq)) = server.recv_timeout(Duration::from_millis(100)) else {
            continue;
        };
        let mut body = Vec::new();
        let _ = rq.as_reader().read_to_end(&mut body);
        let id = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v.get("id").and_then(|i| i.as_str()).map(str::to_string))
            .unwrap_or_default();
        let word = (|| -> Result<&'static str, postgres::Error> {
            let mut tx = db.transaction()?;
            let claimed = tx.query(
                "INSERT INTO events (source, event_id, state, received_at, payload, payload_hash)
                 VALUES ('stripe', $1, 'accepted', $2, $3, 'h')
                 ON CONFLICT (source, event_id) DO NOTHING RETURNING 1",
                &[&id, &now_ms(), &body],
            )?;
            if claimed.is_empty() {
                tx.commit()?;
                return Ok("duplicate");
            }
            tx.execute(
                "UPDATE events SET state = 'completed', completed_at = $2
                 WHERE source = 'stripe' AND event_id = $1",
                &[&id, &now_ms()],
            )?;
            tx.commit()?;
            Ok("accepted")
        })();
        let (status, text) = match word {
            Ok(w) => (200, format!("{{\"status\":\"{w}\"}}")),
            Err(_) => (503, "{\"error\":\"storage\"}".to_string()),
        };
        let mut response = tiny_http::Response::from_string(text).with_status_code(status);
        if let Some(h) = &json {
            response = response.with_header(h.clone());
        }
        let _ = rq.respond(response);
    }
}
