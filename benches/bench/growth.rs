//! Growth: W1 on a prefilled database, and W1 during a prune.

use super::*;

/// Creates `db` with `n` stored events received between `from_ms` and
/// `to_ms`, each with one delivery record, their bodies NULL as if
/// payload_retention had pruned them. Ids are spread uniformly over the id
/// space (the bench's own ids interleave with them) and inserted in order.
pub(crate) fn prefill(
    db: &Path,
    n: u64,
    from_ms: i64,
    to_ms: i64,
    seed: u64,
) -> rusqlite::Result<()> {
    let mut c = Connection::open(db)?;
    c.execute_batch(
        "PRAGMA journal_mode = OFF; PRAGMA synchronous = OFF; PRAGMA cache_size = -1048576;",
    )?;
    c.execute_batch(SCHEMA)?;
    c.execute(
        "INSERT OR REPLACE INTO meta(key, value) VALUES ('schema_version', '1')",
        [],
    )?;
    // The first 11 characters encode a u64 (as in `event_id`); the u64
    // range is sliced into n strides, one id in each.
    let stride = ((1u128 << 64) / u128::from(n.max(1))).min(u128::from(u64::MAX)) as u64;
    let span = (to_ms - from_ms).max(1) as u64;
    let batch = 250_000;
    let mut i = 0u64;
    let started = Instant::now();
    while i < n {
        let tx = c.transaction()?;
        {
            let mut ev = tx.prepare_cached(
                "INSERT INTO events (source, event_id, type, state, received_at, completed_at,
                     payload, content_type, headers, payload_hash, verified_with, signed_at, erased_at)
                 VALUES ('stripe', ?1, 'charge.succeeded', 'completed', ?2, ?2, NULL,
                         'application/json; charset=utf-8', NULL, ?3, 0, ?4, ?5)",
            )?;
            let mut dl = tx.prepare_cached(
                "INSERT INTO deliveries (source, event_id, received_at, outcome, remote)
                 VALUES ('stripe', ?1, ?2, 'accepted', '127.0.0.1:50000')",
            )?;
            let end = (i + batch).min(n);
            while i < end {
                let r = mix(seed ^ i);
                let mut id = String::with_capacity(28);
                id.push_str("evt_");
                base62(i * stride + r % stride.max(1), 11, &mut id);
                base62(mix(r), 13, &mut id);
                let at = from_ms + ((u128::from(i) * u128::from(span)) / u128::from(n)) as i64;
                let hash = hex::encode(Sha256::digest(id.as_bytes()));
                ev.execute(params![id, at, hash, at / 1000 - 1, at + 7 * 86_400_000])?;
                dl.execute(params![id, at])?;
                i += 1;
            }
        }
        tx.commit()?;
        if n >= 100_000 && (i.is_multiple_of(1_000_000) || i == n) {
            println!(
                "    prefill: {} of {} events ({:.0} s)",
                fmt_int(i as f64),
                fmt_int(n as f64),
                started.elapsed().as_secs_f64()
            );
        }
    }
    c.execute_batch("PRAGMA journal_mode = WAL;")?;
    Ok(())
}

pub(crate) struct GrowthResult {
    pub(crate) name: String,
    pub(crate) runs: Vec<IdemRun>,
    pub(crate) note: String,
}

pub(crate) fn run_growth(
    opts: &Opts,
    w1: &Workload,
    empty_w1: &[f64],
    hz: f64,
    seed: u64,
) -> Vec<GrowthResult> {
    let mut out = Vec::new();
    let work = match tempfile::Builder::new()
        .prefix("idemhook-bench-growth-")
        .tempdir()
    {
        Ok(d) => d,
        Err(e) => {
            println!("growth: cannot create a temp dir: {e}");
            return out;
        }
    };
    let day = 86_400_000;
    let now = now_ms();
    let mut cases: Vec<(&str, u64, bool)> = Vec::new();
    if opts.wants("G1M") {
        cases.push(("G1M", 1_000_000, false));
    }
    if opts.growth_10m && opts.wants("G10M") {
        cases.push(("G10M", 10_000_000, false));
    }
    if opts.wants("GPRUNE") {
        cases.push(("GPRUNE", 1_000_000, true));
    }
    for (name, n, prune) in cases {
        let n = opts.scaled(n as usize) as u64;
        let template = work.path().join(format!("{name}.db"));
        // Stored events: within the key retention (7 d for stripe), so
        // nothing of them is due for pruning; for the prune case, far past
        // a 7 d retention, so all of them are.
        let (from, to) = if prune {
            (now - 60 * day, now - 30 * day)
        } else {
            (now - 6 * day - day / 2, now - day / 12)
        };
        println!(
            "  {name}: prefilling {} events (payload NULL, as if payload_retention had pruned them)",
            fmt_int(n as f64)
        );
        let t = Instant::now();
        if let Err(e) = prefill(&template, n, from, to, seed ^ 0x5EED) {
            println!("  {name}: prefill failed: {e}");
            continue;
        }
        // Written back now, not during the runs (see `run_idemhook`).
        if let Err(e) = std::fs::File::open(&template).and_then(|f| f.sync_all()) {
            println!("  {name}: cannot sync the prefilled file: {e}");
            continue;
        }
        let size = file_len(&template);
        println!(
            "  {name}: prefilled in {:.0} s, {} bytes ({:.0} bytes/event)",
            t.elapsed().as_secs_f64(),
            fmt_int(size as f64),
            size as f64 / n as f64
        );
        let setup = Setup {
            template: Some(template.clone()),
            retention: prune.then_some("7d"),
            prune,
            forward_url: None,
        };
        if prune && let Err(why) = prune_available(work.path()) {
            println!("  {name}: skipped: prune not available ({why})");
            out.push(GrowthResult {
                name: format!("W1 during prune of {} events", fmt_int(n as f64)),
                runs: Vec::new(),
                note: format!("skipped: prune not available ({why})"),
            });
            let _ = std::fs::remove_file(&template);
            continue;
        }
        let mut runs = Vec::new();
        for run in 1..=opts.runs {
            let reqs = build_requests(w1, seed ^ (run as u64 * 7919) ^ n);
            let label = format!("{name}-run{run}");
            match run_idemhook(&reqs, w1, &setup, opts, hz, &label) {
                Ok(r) => {
                    println!(
                        "    {name} run {run}: {} req/s, p50 {} ms, p99 {} ms, rows {}, problems: {}{}",
                        fmt_int(r.load.rps()),
                        ms(r.load.p(50.0)),
                        ms(r.load.p(99.0)),
                        r.rows_text(),
                        r.load.problems(),
                        r.prune.as_ref().map_or(String::new(), |p| format!("; {p}"))
                    );
                    println!("      {}", idem_detail(&r));
                    runs.push(r);
                }
                Err(e) => println!("    {name} run {run}: FAILED: {e}"),
            }
        }
        let _ = std::fs::remove_file(&template);
        let rps: Vec<f64> = runs.iter().map(|r| r.load.rps()).collect();
        let vs_empty = median(&rps) / median(empty_w1);
        out.push(GrowthResult {
            name: if prune {
                format!(
                    "W1 during `idemhook prune` of {} events (retention 7d)",
                    fmt_int(n as f64)
                )
            } else {
                format!("W1 on {} stored events", fmt_int(n as f64))
            },
            runs,
            note: format!("{vs_empty:.2} of W1 on an empty database"),
        });
    }
    out
}

/// `prune --dry-run` against a copy of the prefilled database: Err when the
/// verb is not built yet (or fails).
pub(crate) fn prune_available(work: &Path) -> Result<(), String> {
    let dir = work.join("prune-check");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    // An empty database with the schema is enough to ask the verb.
    let db = dir.join("idemhook.db");
    prefill(
        &db,
        10,
        now_ms() - 40 * 86_400_000,
        now_ms() - 35 * 86_400_000,
        1,
    )
    .map_err(|e| e.to_string())?;
    std::fs::write(
        dir.join("idemhook.toml"),
        idemhook_config(HTTP_WORKERS, None, Some("7d")),
    )
    .map_err(|e| e.to_string())?;
    let mut child = Command::new(idemhook_binary())
        .arg("prune")
        .arg("--dry-run")
        .arg("--config")
        .arg(dir.join("idemhook.toml"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err("prune --dry-run did not finish in 60 s".into());
            }
        }
    };
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    let _ = std::fs::remove_dir_all(&dir);
    if status.success() {
        Ok(())
    } else {
        Err(format!(
            "`idemhook prune --dry-run` exited {status}: {}",
            err.trim().lines().last().unwrap_or("")
        ))
    }
}

pub(crate) fn print_growth(results: &[GrowthResult], empty_w1: &[f64]) {
    println!();
    println!(
        "Growth (W1 against a pre-filled database; prefilled events have payload NULL, as if payload_retention had pruned them; W1 on an empty database: {} req/s):",
        fmt_int(median(empty_w1))
    );
    println!(
        "| case | idemhook req/s | vs empty | p50 / p99 ms | peak RSS MiB | DB bytes after | rows = distinct events |"
    );
    println!("|---|---|---|---|---|---|---|");
    for g in results {
        if g.runs.is_empty() {
            println!("| {} | {} | | | | | |", g.name, g.note);
            continue;
        }
        let rps: Vec<f64> = g.runs.iter().map(|r| r.load.rps()).collect();
        let p50: Vec<f64> = g.runs.iter().map(|r| r.load.p(50.0)).collect();
        let p99: Vec<f64> = g.runs.iter().map(|r| r.load.p(99.0)).collect();
        let rss: Vec<f64> = g
            .runs
            .iter()
            .filter_map(|r| r.rss_kib.map(|k| k as f64))
            .collect();
        let size: Vec<f64> = g
            .runs
            .iter()
            .map(|r| (r.db_bytes + r.wal_bytes) as f64)
            .collect();
        println!(
            "| {} | {} | {} | {} / {} | {} | {} | {} |",
            g.name,
            mm(&rps, fmt_int),
            g.note,
            ms(median(&p50)),
            mm(&p99, ms),
            mm(&rss, mib),
            fmt_int(median(&size)),
            g.runs
                .iter()
                .map(IdemRun::rows_text)
                .collect::<Vec<_>>()
                .join("; ")
        );
    }
    for g in results {
        for (k, r) in g.runs.iter().enumerate() {
            if let Some(p) = &r.prune {
                println!("  {} run {}: {p}", g.name, k + 1);
            }
            if !r.load.clean() {
                println!("  {} run {}: answers: {}", g.name, k + 1, r.load.problems());
            }
        }
    }
}
