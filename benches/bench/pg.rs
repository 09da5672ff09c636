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

/// One workload's runs of each setup.
struct PgRow {
    name: &'static str,
    what: String,
    classic: Vec<f64>,
    one: Vec<f64>,
    two: Vec<f64>,
    /// Per run: one instance / classic and two / one, each from one run.
    one_vs_classic: Vec<f64>,
    two_vs_one: Vec<f64>,
    problems: Vec<String>,
}

/// One run of one setup.
struct PgRun {
    rps: f64,
    stored: i64,
    problems: String,
    /// Claims per commit (idemhook only).
    group: Option<f64>,
    /// CPU per answered request, µs: idemhook's processes (None for the
    /// classic server, which runs in the bench) and PostgreSQL's.
    idem_us: Option<f64>,
    pg_us: f64,
    /// What the database's client backends were doing, sampled.
    waits: String,
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
    let postmaster = local.pid();
    println!(
        "setup:    one local PostgreSQL cluster (unix socket, fsync on, synchronous_commit on); \
         idemhook serve durability full; {} run(s) each, medians (min–max); the setups \
         alternate within each run",
        opts.runs
    );
    let mut rows = Vec::new();
    for w in workloads(opts) {
        if !(w.name == "W1" || w.name == "W2") || !opts.wants(w.name) {
            continue;
        }
        let mut row = PgRow {
            name: w.name,
            what: w.what.clone(),
            classic: Vec::new(),
            one: Vec::new(),
            two: Vec::new(),
            one_vs_classic: Vec::new(),
            two_vs_one: Vec::new(),
            problems: Vec::new(),
        };
        for run in 0..opts.runs {
            let seed = now_ms() as u64 ^ run as u64;
            let reqs = build_requests(&w, seed);
            let mut rps = [None; 3];
            for (k, label) in ["classic", "one", "two"].into_iter().enumerate() {
                let url = cluster.create_database(&format!("bench_{}_{label}_{run}", w.name));
                let probe = PgProbe::start(&url, postmaster);
                let result = match label {
                    "classic" => run_classic(&url, &reqs, w.conns, probe),
                    "one" => run_instances(&url, &reqs, w.conns, 1, opts, probe),
                    _ => run_instances(&url, &reqs, w.conns, 2, opts, probe),
                };
                match result {
                    Ok(r) => {
                        if r.stored != w.events as i64 {
                            row.problems.push(format!(
                                "{label}: {} events stored, {} sent",
                                r.stored, w.events
                            ));
                        }
                        if r.problems != "none" {
                            row.problems.push(format!("{label}: {}", r.problems));
                        }
                        println!(
                            "  {} run {} {label}: {} req/s{}; CPU per request: {}PostgreSQL {:.0} µs; backends: {}",
                            w.name,
                            run + 1,
                            fmt_int(r.rps),
                            r.group
                                .map_or(String::new(), |g| format!(", {g:.1} claims per commit")),
                            r.idem_us
                                .map_or(String::new(), |u| format!("idemhook {u:.0} µs, ")),
                            r.pg_us,
                            r.waits
                        );
                        rps[k] = Some(r.rps);
                    }
                    Err(e) => row.problems.push(format!("{label}: {e}")),
                }
            }
            if let [Some(c), Some(o), Some(t)] = rps {
                row.classic.push(c);
                row.one.push(o);
                row.two.push(t);
                row.one_vs_classic.push(o / c.max(1e-9));
                row.two_vs_one.push(t / o.max(1e-9));
            }
        }
        rows.push(row);
    }
    println!();
    println!(
        "| workload | classic (tx per event) | idemhook, 1 instance | idemhook, 2 instances | 1 / classic | 2 / 1 | problems |"
    );
    println!("|---|---|---|---|---|---|---|");
    let many = opts.runs > 1;
    let with_spread = |v: &[f64], f: &dyn Fn(f64) -> String| {
        if many { mm(v, f) } else { f(median(v)) }
    };
    for r in &rows {
        println!(
            "| {} {} | {} req/s | {} | {} | {} | {} | {} |",
            r.name,
            r.what,
            with_spread(&r.classic, &fmt_int),
            with_spread(&r.one, &fmt_int),
            with_spread(&r.two, &fmt_int),
            with_spread(&r.one_vs_classic, &|v| format!("{v:.2}")),
            with_spread(&r.two_vs_one, &|v| format!("{v:.2}")),
            if r.problems.is_empty() {
                "none".to_string()
            } else {
                r.problems.join("; ")
            }
        );
    }
    println!("(ratios: the median of each run's own ratio)");
    drop(local);
    ExitCode::SUCCESS
}

/// Watches the cluster during a load: CPU ticks of every PostgreSQL
/// process (the postmaster's children), and every 10 ms what the
/// database's client backends are doing (`pg_stat_activity`: the wait
/// event of an active one, "running" when it has none; else its state:
/// "idle" or "idle in transaction" wait for their client).
struct PgProbe {
    postmaster: Option<u32>,
    ticks: u64,
    stop: Arc<AtomicBool>,
    sampler: Option<JoinHandle<BTreeMap<String, u64>>>,
}

fn pg_ticks(postmaster: Option<u32>) -> u64 {
    let Some(pm) = postmaster else { return 0 };
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let pm = pm.to_string();
    let mut sum = proc_cpu_ticks(&pm).unwrap_or(0);
    for e in dir.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if !name.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let stat = std::fs::read_to_string(format!("/proc/{name}/stat")).unwrap_or_default();
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1).map(str::to_string));
        if ppid.as_deref() == Some(pm.as_str()) {
            sum += proc_cpu_ticks(&name).unwrap_or(0);
        }
    }
    sum
}

impl PgProbe {
    fn start(url: &str, postmaster: Option<u32>) -> PgProbe {
        let stop = Arc::new(AtomicBool::new(false));
        let sampler = postgres::Client::connect(url, postgres::NoTls)
            .ok()
            .map(|mut c| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut seen: BTreeMap<String, u64> = BTreeMap::new();
                    let sql = "SELECT CASE WHEN state = 'active'
                                          THEN coalesce(wait_event_type || ':' || wait_event, 'running')
                                          ELSE state END
                                 FROM pg_stat_activity
                                WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()
                                  AND datname = current_database() AND state IS NOT NULL";
                    while !stop.load(Ordering::Relaxed) {
                        if let Ok(rows) = c.query(sql, &[]) {
                            for r in rows {
                                *seen.entry(r.get(0)).or_default() += 1;
                            }
                        }
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    seen
                })
            });
        PgProbe {
            postmaster,
            ticks: pg_ticks(postmaster),
            stop,
            sampler,
        }
    }

    /// (PostgreSQL's CPU seconds, the backends' states as percentages).
    fn finish(self, hz: f64) -> (f64, String) {
        let cpu = pg_ticks(self.postmaster).saturating_sub(self.ticks) as f64 / hz;
        self.stop.store(true, Ordering::Relaxed);
        let seen = self.sampler.and_then(|h| h.join().ok()).unwrap_or_default();
        let total: u64 = seen.values().sum();
        let mut by_count: Vec<(&String, &u64)> = seen.iter().collect();
        by_count.sort_by(|a, b| b.1.cmp(a.1));
        let waits = by_count
            .iter()
            .take(6)
            .map(|(k, n)| format!("{k} {:.0}%", **n as f64 * 100.0 / total.max(1) as f64))
            .collect::<Vec<_>>()
            .join(", ");
        (cpu, if waits.is_empty() { "-".into() } else { waits })
    }
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
    probe: PgProbe,
) -> Result<PgRun, String> {
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
    let hz = clock_ticks_per_sec();
    let ticks0: Vec<u64> = servers
        .iter()
        .map(|s| proc_cpu_ticks(&s.pid().to_string()).unwrap_or(0))
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
    let (pg_cpu, waits) = probe.finish(hz);
    let idem_ticks: u64 = servers
        .iter()
        .zip(&ticks0)
        .map(|(s, t0)| {
            proc_cpu_ticks(&s.pid().to_string())
                .unwrap_or(0)
                .saturating_sub(*t0)
        })
        .sum();
    let (commits, ops) = servers
        .iter()
        .filter_map(Idemhook::group_stats)
        .fold((0.0, 0.0), |(c, o), (c1, o1)| (c + c1, o + o1));
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
    let per_request = |secs: f64| secs * 1e6 / (ok.max(1) as f64);
    Ok(PgRun {
        rps: ok as f64 / wall.max(1e-9),
        stored,
        problems: if problems.is_empty() {
            "none".into()
        } else {
            problems.join(", ")
        },
        group: (commits > 0.0).then(|| ops / commits),
        idem_us: Some(per_request(idem_ticks as f64 / hz)),
        pg_us: per_request(pg_cpu),
        waits,
    })
}

fn count_events(url: &str) -> Result<i64, String> {
    let mut c = postgres::Client::connect(url, postgres::NoTls).map_err(|e| e.to_string())?;
    c.query_one("SELECT count(*) FROM events", &[])
        .map(|r| r.get(0))
        .map_err(|e| e.to_string())
}

/// The classic design on `url`: a transaction per request.
fn run_classic(url: &str, reqs: &Requests, conns: usize, probe: PgProbe) -> Result<PgRun, String> {
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
    let (pg_cpu, waits) = probe.finish(clock_ticks_per_sec());
    stop.store(true, Ordering::SeqCst);
    server.unblock();
    for w in workers {
        let _ = w.join();
    }
    let stored = count_events(url)?;
    Ok(PgRun {
        rps: result.rps(),
        stored,
        problems: result.problems(),
        group: None,
        idem_us: None,
        pg_us: pg_cpu * 1e6 / (result.ok.max(1) as f64),
        waits,
    })
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
