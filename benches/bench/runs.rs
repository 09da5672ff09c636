//! One run of a workload against the no-op server or idemhook.

use super::*;

pub(crate) struct NoopRun {
    pub(crate) load: LoadResult,
    pub(crate) cpu: CpuUse,
}

#[derive(Default)]
pub(crate) struct ForwardStats {
    /// Distinct events the downstream saw per second of the run (a
    /// broker: `done_per_sec`).
    pub(crate) per_sec: f64,
    /// Events whose job reads done, per second from the load's start to
    /// the last one done (the same measure for every destination).
    pub(crate) done_per_sec: f64,
    pub(crate) connections: usize,
    pub(crate) distinct: usize,
    pub(crate) total: usize,
    pub(crate) jobs: BTreeMap<String, i64>,
}

pub(crate) struct IdemRun {
    pub(crate) load: LoadResult,
    pub(crate) cpu: CpuUse,
    pub(crate) rss_kib: Option<u64>,
    pub(crate) db_bytes: u64,
    pub(crate) wal_bytes: u64,
    pub(crate) rows: i64,
    pub(crate) distinct_sent: usize,
    pub(crate) distinct_acked: usize,
    pub(crate) incidents: i64,
    pub(crate) group: Option<(f64, f64)>,
    pub(crate) forward: Option<ForwardStats>,
    pub(crate) prune: Option<String>,
    pub(crate) graceful: bool,
    pub(crate) stderr_tail: String,
}

impl IdemRun {
    /// Rows stored equal distinct events (or, when some requests went
    /// unanswered, lie between the acked and the sent).
    pub(crate) fn rows_ok(&self) -> bool {
        if self.load.clean() {
            self.rows == self.distinct_sent as i64
        } else {
            self.rows >= self.distinct_acked as i64 && self.rows <= self.distinct_sent as i64
        }
    }

    pub(crate) fn rows_text(&self) -> String {
        format!(
            "{}/{} {}",
            self.rows,
            self.distinct_sent,
            if self.rows_ok() { "ok" } else { "MISMATCH" }
        )
    }
}

pub(crate) fn run_noop(reqs: &Requests, w: &Workload, hz: f64) -> Result<NoopRun, String> {
    let server = cores::for_downstream(|| NoopServer::start(None))?;
    let probe = CpuProbe::start(None);
    let load = run_load(server.addr, &reqs.bytes, w.conns);
    let cpu = probe.finish(hz);
    server.stop();
    Ok(NoopRun { load, cpu })
}

pub(crate) fn file_len(p: &Path) -> u64 {
    std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)
}

pub(crate) fn with_suffix(p: &Path, suffix: &str) -> PathBuf {
    let mut s = p.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// Extra setup of an idemhook run.
#[derive(Default)]
pub(crate) struct Setup {
    /// Copy this database in first (growth).
    pub(crate) template: Option<PathBuf>,
    /// Key retention for the source (the prune case).
    pub(crate) retention: Option<&'static str>,
    /// Run `idemhook prune` concurrently with the load.
    pub(crate) prune: bool,
    /// The forward action's URL (a broker's); None: a no-op HTTP server.
    pub(crate) forward_url: Option<String>,
}

pub(crate) fn run_idemhook(
    reqs: &Requests,
    w: &Workload,
    setup: &Setup,
    opts: &Opts,
    hz: f64,
    label: &str,
) -> Result<IdemRun, String> {
    let dir = tempfile::Builder::new()
        .prefix("idemhook-bench-")
        .tempdir()
        .map_err(|e| e.to_string())?;
    let db = dir.path().join("idemhook.db");
    if let Some(t) = &setup.template {
        std::fs::copy(t, &db).map_err(|e| format!("copy {}: {e}", t.display()))?;
        // On disk before the load starts: otherwise the kernel writes the
        // copy's gigabytes back during the run, and every fsync of the
        // server's waits behind that writeback, which an installation
        // that grew to this size over months does not have.
        std::fs::File::open(&db)
            .and_then(|f| f.sync_all())
            .map_err(|e| format!("sync {}: {e}", db.display()))?;
    }
    let downstream = if w.forward && setup.forward_url.is_none() {
        Some(cores::for_downstream(|| NoopServer::start(Some(w.events)))?)
    } else {
        None
    };
    let url = setup.forward_url.clone().or_else(|| {
        downstream
            .as_ref()
            .map(|d| format!("http://{}/stripe", d.addr))
    });
    let mut config = idemhook_config(opts.idem_workers, url.as_deref(), setup.retention).replace(
        "durability = \"full\"",
        &format!("durability = \"{}\"", opts.durability),
    );
    if let Some(n) = opts.forward_workers {
        config.insert_str(0, &format!("forward_workers = {n}\n"));
    }
    if let Some(rule) = w.order {
        // The forward action is the config's last table.
        config.push_str(&format!("order = [\"{rule}\"]\n"));
    }
    if !w.circuit {
        config.push_str("circuit_failures = 0\n");
    }
    let server = match Idemhook::start(dir.path(), &config, opts) {
        Ok(s) => s,
        Err(e) => {
            if let Some(d) = downstream {
                d.stop();
            }
            return Err(e);
        }
    };
    let perf = opts
        .perf_dir
        .as_ref()
        .and_then(|d| start_perf(d, server.pid(), label));

    let mut prune_child = None;
    if setup.prune {
        let child = Command::new(idemhook_binary())
            .arg("prune")
            .arg("--config")
            .arg(dir.path().join("idemhook.toml"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start prune: {e}"))?;
        prune_child = Some((child, Instant::now()));
        // Let it get going, so the load runs inside the prune.
        std::thread::sleep(Duration::from_millis(300));
    }

    let t0_ms = now_ms() - 1;
    let probe = CpuProbe::start(Some(server.pid()));
    let load_started = Instant::now();
    let load = run_load(server.addr, &reqs.bytes, w.conns);
    let load_done = Instant::now();

    let forward = downstream
        .as_ref()
        .and_then(|d| d.seen.clone())
        .map(|seen| {
            // Until the downstream has seen every distinct key, bounded.
            let deadline = load_started + WORKLOAD_LIMIT;
            let mut done = seen.done_at.lock().unwrap_or_else(|e| e.into_inner());
            while done.is_none() && Instant::now() < deadline {
                let wait = deadline.saturating_duration_since(Instant::now());
                done = seen
                    .cv
                    .wait_timeout(done, wait.min(Duration::from_millis(200)))
                    .map(|(g, _)| g)
                    .unwrap_or_else(|e| e.into_inner().0);
            }
            let elapsed = done.map_or(WORKLOAD_LIMIT, |d| d.duration_since(load_started));
            drop(done);
            let distinct = seen.keys.lock().map(|k| k.len()).unwrap_or(0);
            ForwardStats {
                per_sec: distinct as f64 / elapsed.as_secs_f64().max(1e-9),
                distinct,
                total: seen.total.load(Ordering::Relaxed),
                connections: seen.peers.lock().map(|p| p.len()).unwrap_or(0),
                ..ForwardStats::default()
            }
        });
    // Every forward: the completions are recorded after the downstream
    // (or broker) answered; wait (bounded) until every job reads done.
    let mut forward = forward;
    if w.forward {
        let f = forward.get_or_insert_with(ForwardStats::default);
        let deadline = load_started + WORKLOAD_LIMIT;
        loop {
            f.jobs = job_counts(&db).unwrap_or_default();
            let done = f.jobs.get("done").copied().unwrap_or(0);
            if done as usize >= w.events {
                f.done_per_sec = done as f64 / load_started.elapsed().as_secs_f64().max(1e-9);
                break;
            }
            if Instant::now() >= deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        if downstream.is_none() {
            f.per_sec = f.done_per_sec;
        }
    }
    let cpu = probe.finish(hz);
    if let Some(p) = perf {
        stop_perf(p);
    }
    let rss_kib = proc_status_kib(server.pid(), "VmHWM:");
    let group = server.group_stats();
    let (db_bytes, wal_bytes) = (file_len(&db), file_len(&with_suffix(&db, "-wal")));

    let prune = prune_child.map(|(mut child, started)| {
        let overlapped = child.try_wait().ok().flatten().is_none();
        let deadline = started + PRUNE_LIMIT;
        let status: Option<ExitStatus> = loop {
            match child.try_wait() {
                Ok(Some(s)) => break Some(s),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50));
                }
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    break None;
                }
            }
        };
        let took = started.elapsed();
        let mut out = String::new();
        if let Some(mut e) = child.stderr.take() {
            let _ = e.read_to_string(&mut out);
        }
        if let Some(mut o) = child.stdout.take() {
            let _ = o.read_to_string(&mut out);
        }
        let load_s = load_done.duration_since(load_started).as_secs_f64();
        format!(
            "prune {} in {:.1} s ({}; the load took {:.1} s); output: {}",
            match status {
                Some(s) if s.success() => "finished".to_string(),
                Some(s) => format!("FAILED ({s})"),
                None => "KILLED after the limit".to_string(),
            },
            took.as_secs_f64(),
            if overlapped {
                "still running when the load ended"
            } else {
                "ended before the load did"
            },
            load_s,
            out.trim().lines().last().unwrap_or("")
        )
    });

    let (graceful, stderr_tail) = server.stop();
    if let Some(d) = downstream {
        d.stop();
    }
    let (rows, incidents) = count_rows(&db, t0_ms).map_err(|e| format!("count rows: {e}"))?;
    if let Some(f) = forward.as_mut() {
        f.jobs = job_counts(&db).unwrap_or_default();
    }
    let mut sent_events = HashSet::new();
    let mut acked_events = HashSet::new();
    for (i, fate) in load.fate.iter().enumerate() {
        if *fate >= 1 {
            sent_events.insert(reqs.event_of[i]);
        }
        if *fate == 2 {
            acked_events.insert(reqs.event_of[i]);
        }
    }
    Ok(IdemRun {
        cpu,
        rss_kib,
        db_bytes,
        wal_bytes,
        rows,
        distinct_sent: sent_events.len(),
        distinct_acked: acked_events.len(),
        incidents,
        group,
        forward,
        prune,
        graceful,
        stderr_tail,
        load,
    })
}

pub(crate) fn open_ro(db: &Path) -> rusqlite::Result<Connection> {
    let c = Connection::open_with_flags(db, OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    c.busy_timeout(Duration::from_secs(5))?;
    Ok(c)
}

/// Events stored by this run (received since `t0_ms`), and incidents.
pub(crate) fn count_rows(db: &Path, t0_ms: i64) -> rusqlite::Result<(i64, i64)> {
    let c = open_ro(db)?;
    let rows = c.query_row(
        "SELECT count(*) FROM events WHERE source = 'stripe' AND received_at >= ?1",
        params![t0_ms],
        |r| r.get(0),
    )?;
    let incidents = c.query_row("SELECT count(*) FROM incidents", [], |r| r.get(0))?;
    Ok((rows, incidents))
}

pub(crate) fn job_counts(db: &Path) -> rusqlite::Result<BTreeMap<String, i64>> {
    let c = open_ro(db)?;
    let mut stmt = c.prepare("SELECT status, count(*) FROM jobs GROUP BY status")?;
    let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?;
    rows.collect()
}

pub(crate) struct Perf {
    pub(crate) child: Child,
}

pub(crate) fn start_perf(dir: &Path, pid: u32, label: &str) -> Option<Perf> {
    std::fs::create_dir_all(dir).ok()?;
    let out = dir.join(format!("perf-{label}.data"));
    let child = Command::new("perf")
        .args([
            "record",
            "-e",
            "cpu-clock",
            "-F",
            "999",
            "--call-graph",
            "dwarf,16384",
            "-p",
        ])
        .arg(pid.to_string())
        .arg("-o")
        .arg(&out)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    // perf needs a moment to attach.
    std::thread::sleep(Duration::from_millis(500));
    println!(
        "    perf: recording idemhook pid {pid} into {}",
        out.display()
    );
    Some(Perf { child })
}

pub(crate) fn stop_perf(mut p: Perf) {
    let _ = Command::new("kill")
        .arg("-INT")
        .arg(p.child.id().to_string())
        .status();
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = p.child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = p.child.kill();
    let _ = p.child.wait();
}
