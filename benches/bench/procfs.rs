//! /proc: memory, CPU ticks and per-thread scheduler times.

use super::*;

pub(crate) fn proc_status_kib(pid: u32, key: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix(key))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

/// utime + stime of a process, in clock ticks.
pub(crate) fn proc_cpu_ticks(pid: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = s.rsplit_once(')')?.1.split_whitespace().collect();
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

/// (busy, total) ticks of the whole machine.
pub(crate) fn machine_ticks() -> Option<(u64, u64)> {
    let s = std::fs::read_to_string("/proc/stat").ok()?;
    let v: Vec<u64> = s
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3)? + v.get(4)?;
    Some((total - idle, total))
}

pub(crate) fn clock_ticks_per_sec() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

/// On-CPU and run-queue nanoseconds of each long-lived idemhook thread
/// (writer, checkpointer), by thread name, from /proc/PID/task/*/schedstat.
pub(crate) fn thread_sched_ns(pid: &str) -> BTreeMap<String, (u64, u64)> {
    let mut out = BTreeMap::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for t in tasks.flatten() {
        let dir = t.path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        let comm = comm.trim();
        if !(comm.starts_with("idemhook-write") || comm.starts_with("idemhook-check")) {
            continue;
        }
        let stat = std::fs::read_to_string(dir.join("schedstat")).unwrap_or_default();
        let mut f = stat
            .split_whitespace()
            .map(|x| x.parse::<u64>().unwrap_or(0));
        let (run, wait) = (f.next().unwrap_or(0), f.next().unwrap_or(0));
        let e = out.entry(comm.to_string()).or_insert((0, 0));
        e.0 += run;
        e.1 += wait;
    }
    out
}

/// CPU used during a span: ours, the child's, and everyone else's.
pub(crate) struct CpuProbe {
    pub(crate) at: Instant,
    pub(crate) machine: Option<(u64, u64)>,
    pub(crate) me: Option<u64>,
    pub(crate) child: Option<(String, u64)>,
    pub(crate) threads: BTreeMap<String, (u64, u64)>,
}

pub(crate) struct CpuUse {
    /// Cores busy with other processes (the noise), on average.
    pub(crate) others_cores: f64,
    /// The bench process (load generator, no-op server) in seconds.
    pub(crate) bench_s: f64,
    /// The idemhook process in seconds.
    pub(crate) child_s: Option<f64>,
    /// Per long-lived idemhook thread: (on-CPU, waiting for a CPU) seconds.
    pub(crate) threads: BTreeMap<String, (f64, f64)>,
}

impl CpuProbe {
    pub(crate) fn start(child: Option<u32>) -> CpuProbe {
        let child = child.and_then(|p| {
            let p = p.to_string();
            proc_cpu_ticks(&p).map(|t| (p, t))
        });
        let threads = child
            .as_ref()
            .map(|(p, _)| thread_sched_ns(p))
            .unwrap_or_default();
        CpuProbe {
            at: Instant::now(),
            machine: machine_ticks(),
            me: proc_cpu_ticks("self"),
            child,
            threads,
        }
    }

    pub(crate) fn finish(&self, hz: f64) -> CpuUse {
        let wall = self.at.elapsed().as_secs_f64().max(1e-6);
        let me = proc_cpu_ticks("self")
            .zip(self.me)
            .map_or(0, |(b, a)| b.saturating_sub(a));
        let child = self
            .child
            .as_ref()
            .and_then(|(p, a)| proc_cpu_ticks(p).map(|b| b.saturating_sub(*a)));
        let busy = machine_ticks()
            .zip(self.machine)
            .map_or(0, |((b1, _), (b0, _))| b1.saturating_sub(b0));
        let ours = me + child.unwrap_or(0);
        let threads = self
            .child
            .as_ref()
            .map(|(p, _)| thread_sched_ns(p))
            .unwrap_or_default()
            .into_iter()
            .filter_map(|(name, (run, wait))| {
                let (run0, wait0) = self.threads.get(&name)?;
                Some((
                    name,
                    (
                        run.saturating_sub(*run0) as f64 / 1e9,
                        wait.saturating_sub(*wait0) as f64 / 1e9,
                    ),
                ))
            })
            .collect();
        CpuUse {
            others_cores: busy.saturating_sub(ours) as f64 / hz / wall,
            bench_s: me as f64 / hz,
            child_s: child.map(|c| c as f64 / hz),
            threads,
        }
    }
}
