//! Reporting: medians, the tables, the per-run details and the targets.

use super::*;

pub(crate) fn fmt_int(v: f64) -> String {
    if !v.is_finite() {
        return "-".into();
    }
    let s = format!("{:.0}", v.abs());
    let mut out = String::new();
    for (k, ch) in s.chars().enumerate() {
        if k > 0 && (s.len() - k) % 3 == 0 {
            out.push(',');
        }
        out.push(ch);
    }
    if v < 0.0 { format!("-{out}") } else { out }
}

pub(crate) fn median(v: &[f64]) -> f64 {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if s.is_empty() {
        return f64::NAN;
    }
    s.sort_by(|a, b| a.total_cmp(b));
    let m = s.len() / 2;
    if s.len() % 2 == 1 {
        s[m]
    } else {
        (s[m - 1] + s[m]) / 2.0
    }
}

pub(crate) fn spread(v: &[f64]) -> (f64, f64) {
    let s = v.iter().copied().filter(|x| x.is_finite());
    (
        s.clone().fold(f64::INFINITY, f64::min),
        s.fold(f64::NEG_INFINITY, f64::max),
    )
}

/// "median (min–max)" with a formatter.
pub(crate) fn mm(v: &[f64], f: impl Fn(f64) -> String) -> String {
    if v.len() <= 1 {
        return f(median(v));
    }
    let (lo, hi) = spread(v);
    format!("{} ({}–{})", f(median(v)), f(lo), f(hi))
}

pub(crate) fn ms(v: f64) -> String {
    if !v.is_finite() {
        "-".into()
    } else if v < 10.0 {
        format!("{v:.2}")
    } else if v < 100.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.0}")
    }
}

pub(crate) fn ratio(v: f64) -> String {
    format!("{v:.2}")
}

pub(crate) fn mib(kib: f64) -> String {
    format!("{:.1}", kib / 1024.0)
}

pub(crate) struct Row {
    pub(crate) w: Workload,
    pub(crate) noop: Vec<NoopRun>,
    pub(crate) idem: Vec<IdemRun>,
}

impl Row {
    pub(crate) fn idem_rps(&self) -> Vec<f64> {
        self.idem
            .iter()
            .map(|r| match &r.forward {
                Some(f) => f.per_sec,
                None => r.load.rps(),
            })
            .collect()
    }
    pub(crate) fn noop_rps(&self) -> Vec<f64> {
        self.noop.iter().map(|r| r.load.rps()).collect()
    }
    pub(crate) fn ratios(&self) -> Vec<f64> {
        self.idem_rps()
            .iter()
            .zip(self.noop_rps())
            .map(|(a, b)| a / b)
            .collect()
    }
}

pub(crate) fn print_table(rows: &[Row]) {
    println!();
    println!(
        "| workload | idemhook req/s | no-op req/s | ratio | idemhook p50 / p99 ms | no-op p50 / p99 ms | idemhook peak RSS MiB | DB bytes/event (db + wal) | rows stored = distinct events |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for row in rows {
        let idem_p50: Vec<f64> = row.idem.iter().map(|r| r.load.p(50.0)).collect();
        let idem_p99: Vec<f64> = row.idem.iter().map(|r| r.load.p(99.0)).collect();
        let noop_p50: Vec<f64> = row.noop.iter().map(|r| r.load.p(50.0)).collect();
        let noop_p99: Vec<f64> = row.noop.iter().map(|r| r.load.p(99.0)).collect();
        let rss: Vec<f64> = row
            .idem
            .iter()
            .filter_map(|r| r.rss_kib.map(|k| k as f64))
            .collect();
        let bpe: Vec<f64> = row
            .idem
            .iter()
            .map(|r| (r.db_bytes + r.wal_bytes) as f64 / r.rows.max(1) as f64)
            .collect();
        let bpe_db: Vec<f64> = row
            .idem
            .iter()
            .map(|r| r.db_bytes as f64 / r.rows.max(1) as f64)
            .collect();
        let rows_ok = row.idem.iter().filter(|r| r.rows_ok()).count();
        let texts: Vec<String> = row.idem.iter().map(IdemRun::rows_text).collect();
        let rows_cell = if texts.iter().all(|t| Some(t) == texts.first()) {
            format!(
                "{rows_ok}/{} runs ok: {}",
                row.idem.len(),
                texts.first().map_or("-", String::as_str)
            )
        } else {
            format!("{rows_ok}/{} runs ok: {}", row.idem.len(), texts.join("; "))
        };
        let name = if row.w.forward {
            format!("{} {} (idemhook: forwarded/s)", row.w.name, row.w.what)
        } else {
            format!("{} {}", row.w.name, row.w.what)
        };
        println!(
            "| {name} | {} | {} | {} | {} / {} | {} / {} | {} | {} (db file alone {}) | {} |",
            mm(&row.idem_rps(), fmt_int),
            mm(&row.noop_rps(), fmt_int),
            mm(&row.ratios(), ratio),
            ms(median(&idem_p50)),
            mm(&idem_p99, ms),
            ms(median(&noop_p50)),
            mm(&noop_p99, ms),
            mm(&rss, mib),
            fmt_int(median(&bpe)),
            fmt_int(median(&bpe_db)),
            rows_cell,
        );
    }
}

/// One line about an idemhook run: CPU per request, group size, files.
pub(crate) fn idem_detail(i: &IdemRun) -> String {
    let reqs = i.load.sent.max(1) as f64;
    let group = i
        .group
        .map_or("-".to_string(), |(c, o)| format!("{:.1}", o / c.max(1.0)));
    let wall = i.load.wall.as_secs_f64().max(1e-6);
    let threads: Vec<String> = i
        .cpu
        .threads
        .iter()
        .map(|(name, (run, wait))| {
            format!(
                "{} {:.0} µs/req on CPU ({:.0}% of the time), {:.0}% waiting for a CPU",
                name.trim_start_matches("idemhook-"),
                run * 1e6 / reqs,
                100.0 * run / wall,
                100.0 * wait / wall
            )
        })
        .collect();
    format!(
        "idemhook {} req/s in {:.2} s, CPU {:.0} µs/req in idemhook + {:.0} µs/req in the bench, {:.0}% of CPU time, others {:.2} cores; \
         {}; avg group {group} ops/commit; db {} + wal {} bytes; answers {:?}; incidents {}; stopped {}",
        fmt_int(i.load.rps()),
        i.load.wall.as_secs_f64(),
        i.cpu.child_s.unwrap_or(f64::NAN) * 1e6 / reqs,
        i.cpu.bench_s * 1e6 / reqs,
        100.0 * (i.cpu.child_s.unwrap_or(0.0) + i.cpu.bench_s) / (i.load.wall.as_secs_f64() * 2.0),
        i.cpu.others_cores,
        threads.join("; "),
        fmt_int(i.db_bytes as f64),
        fmt_int(i.wal_bytes as f64),
        i.load.words,
        i.incidents,
        if i.graceful { "cleanly" } else { "BY SIGKILL" },
    )
}

pub(crate) fn print_details(rows: &[Row]) {
    println!();
    println!(
        "Details per run (CPU is user+sys; 'others' = cores busy with other processes during the load):"
    );
    for row in rows {
        for (k, (n, i)) in row.noop.iter().zip(&row.idem).enumerate() {
            println!("  {} run {}: {}", row.w.name, k + 1, idem_detail(i));
            println!(
                "  {} run {}: no-op {} req/s in {:.2} s, CPU {:.0} µs/req in the bench (load generator + no-op server), others {:.2} cores",
                row.w.name,
                k + 1,
                fmt_int(n.load.rps()),
                n.load.wall.as_secs_f64(),
                n.cpu.bench_s * 1e6 / n.load.sent.max(1) as f64,
                n.cpu.others_cores,
            );
            if let Some(f) = &i.forward {
                println!(
                    "  {} run {}: {} saw {} distinct keys in {} {} over {} connections; {:.0} forwarded/s, {:.0} jobs done/s; jobs {:?}{}",
                    row.w.name,
                    k + 1,
                    if row.w.dest == Dest::Http {
                        "downstream"
                    } else {
                        "broker"
                    },
                    fmt_int(f.distinct as f64),
                    fmt_int(f.total as f64),
                    if row.w.dest == Dest::Http {
                        "requests"
                    } else {
                        "messages"
                    },
                    f.connections,
                    f.per_sec,
                    f.done_per_sec,
                    f.jobs,
                    if f.jobs.len() == 1 && f.jobs.get("done").copied() == Some(row.w.events as i64)
                    {
                        " (all done)"
                    } else {
                        " (NOT all done)"
                    }
                );
            }
        }
    }
}

pub(crate) fn print_problems(rows: &[Row]) -> bool {
    println!();
    println!(
        "Answers (every request must be answered 200 within {} s; stalls > {} s are reported):",
        ANSWER_TIMEOUT.as_secs(),
        SLOW.as_secs()
    );
    let mut all_clean = true;
    for row in rows {
        for (k, (n, i)) in row.noop.iter().zip(&row.idem).enumerate() {
            for (who, load) in [("no-op", &n.load), ("idemhook", &i.load)] {
                let p = load.problems();
                all_clean &= p == "none";
                println!("  {} run {} {who}: {p}", row.w.name, k + 1);
                for s in &load.samples {
                    println!("      {s}");
                }
            }
            if !i.graceful {
                println!("      idemhook stderr tail:\n{}", i.stderr_tail);
            }
        }
    }
    all_clean
}

pub(crate) fn print_targets(rows: &[Row]) {
    println!();
    println!("Targets, on medians:");
    let find = |n: &str| rows.iter().find(|r| r.w.name == n);
    let verdict = |ok: bool| if ok { "met" } else { "NOT met" };
    if let Some(r) = find("W1") {
        let ratio = median(&r.ratios());
        let p99 = median(&r.idem.iter().map(|i| i.load.p(99.0)).collect::<Vec<_>>());
        let rss = median(
            &r.idem
                .iter()
                .filter_map(|i| i.rss_kib.map(|k| k as f64))
                .collect::<Vec<_>>(),
        ) / 1024.0;
        println!(
            "  W1 ratio >= 0.5 (aim 0.6): {ratio:.2} {}",
            verdict(ratio >= 0.5)
        );
        println!("  W1 p99 < 20 ms: {} ms {}", ms(p99), verdict(p99 < 20.0));
        println!(
            "  W1 peak RSS < 64 MiB: {rss:.1} MiB {}",
            verdict(rss < 64.0)
        );
    }
    if let Some(r) = find("W2") {
        let ratio = median(&r.ratios());
        println!("  W2 ratio >= 0.7: {ratio:.2} {}", verdict(ratio >= 0.7));
    }
    if let Some(r) = find("W3") {
        println!(
            "  W3 (report; bounded by fsync latency): {} req/s, ratio {:.2}",
            fmt_int(median(&r.idem_rps())),
            median(&r.ratios())
        );
    }
    if let Some(r) = find("W4") {
        let f = median(&r.idem_rps());
        println!(
            "  W4 >= 5,000 forwarded/s: {} {}",
            fmt_int(f),
            verdict(f >= 5000.0)
        );
        // The variants against W4 in the same runs (run-major, so each
        // pair shares the machine's drift), on jobs done per second.
        let done = |r: &Row| -> Vec<f64> {
            r.idem
                .iter()
                .map(|i| i.forward.as_ref().map_or(0.0, |f| f.done_per_sec))
                .collect()
        };
        let against = |v: &Row| -> f64 {
            let pairs: Vec<f64> = done(v)
                .iter()
                .zip(done(r))
                .map(|(a, b)| a / b.max(1e-9))
                .collect();
            median(&pairs)
        };
        if let Some(c0) = find("W4C0") {
            let ratio = 1.0 / against(c0);
            println!(
                "  W4 (circuit on) >= 0.95 of W4C0 (circuit_failures = 0), jobs done/s: {ratio:.2} {}",
                verdict(ratio >= 0.95)
            );
        }
        for name in ["W4R", "W4N", "W4A"] {
            if let Some(b) = find(name) {
                let ratio = against(b);
                let exact = b.idem.iter().all(|i| {
                    i.forward
                        .as_ref()
                        .is_some_and(|f| f.total == b.w.events && f.distinct == b.w.events)
                });
                println!(
                    "  {name} >= W4 (HTTP) in jobs done/s: {} vs {} = {ratio:.2} {}; each event once at the broker: {}",
                    fmt_int(median(&done(b))),
                    fmt_int(median(&done(r))),
                    verdict(ratio >= 1.0),
                    verdict(exact)
                );
            }
        }
    }
}
