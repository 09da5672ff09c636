//! The real idemhook: a `serve` process, its config, its /metrics.

use super::*;

pub(crate) struct Idemhook {
    pub(crate) child: Child,
    pub(crate) addr: SocketAddr,
    pub(crate) stderr_path: PathBuf,
}

impl Idemhook {
    pub(crate) fn start(dir: &Path, config: &str, opts: &Opts) -> Result<Idemhook, String> {
        let config_path = dir.join("idemhook.toml");
        std::fs::write(&config_path, config).map_err(|e| format!("write config: {e}"))?;
        let stderr_path = dir.join("serve.stderr");
        let stderr = std::fs::File::create(&stderr_path).map_err(|e| e.to_string())?;
        let mut cmd = Command::new(idemhook_binary());
        cmd.arg("serve").arg("--config").arg(&config_path);
        if let Some(level) = &opts.log_level {
            cmd.arg("--log-level").arg(level);
        }
        let mut child = cmd
            .current_dir(dir)
            .env_remove("IDEMHOOK_LOG")
            .env_remove("IDEMHOOK_FAILPOINTS")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(stderr))
            .spawn()
            .map_err(|e| format!("cannot start idemhook: {e}"))?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(rest) = line.strip_prefix("idemhook listening on http://")
                    && let Some(tx) = tx.take()
                {
                    let _ = tx.send(rest.trim().to_string());
                }
            }
        });
        let addr = match rx.recv_timeout(STARTUP_TIMEOUT) {
            Ok(a) => a.parse::<SocketAddr>().map_err(|e| format!("{a:?}: {e}")),
            Err(_) => Err("no listening line".to_string()),
        };
        match addr {
            Ok(addr) => Ok(Idemhook {
                child,
                addr,
                stderr_path,
            }),
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                Err(format!(
                    "idemhook serve did not start ({e}); stderr:\n{}",
                    tail(&stderr_path, 2000)
                ))
            }
        }
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGTERM, then SIGKILL after STOP_TIMEOUT. True when it stopped by itself.
    pub(crate) fn stop(mut self) -> (bool, String) {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.pid().to_string())
            .status();
        let deadline = Instant::now() + STOP_TIMEOUT;
        let graceful = loop {
            match self.child.try_wait() {
                Ok(Some(s)) => break s.success(),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                _ => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    break false;
                }
            }
        };
        (graceful, tail(&self.stderr_path, 1500))
    }

    /// The writer's (commits, operations) from /metrics.
    pub(crate) fn group_stats(&self) -> Option<(f64, f64)> {
        let mut c = Conn::connect(self.addr).ok()?;
        let req = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
        c.stream.write_all(req).ok()?;
        // /metrics is larger than the 4 KiB kept by take_body: read it raw.
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut text = Vec::new();
        while let Ok(()) = c.fill(deadline) {
            text.extend_from_slice(&c.buf[c.pos..c.len]);
            c.pos = c.len;
        }
        let text = String::from_utf8_lossy(&text);
        let value = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        };
        Some((
            value("idemhook_commits_total")?,
            value("idemhook_committed_operations_total")?,
        ))
    }
}

pub(crate) fn tail(path: &Path, max: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let start = text.len().saturating_sub(max);
    let start = (start..text.len())
        .find(|i| text.is_char_boundary(*i))
        .unwrap_or(text.len());
    text[start..].to_string()
}

/// The idemhook binary under test: this build's, or IDEMHOOK_BENCH_BINARY
/// (to compare two builds in one sitting: alternate runs of each).
pub(crate) fn idemhook_binary() -> PathBuf {
    std::env::var_os("IDEMHOOK_BENCH_BINARY")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_idemhook")))
}

pub(crate) fn idemhook_config(
    workers: usize,
    forward_url: Option<&str>,
    retention: Option<&str>,
) -> String {
    let mut c = format!(
        "listen = \"127.0.0.1:0\"\ndatabase = \"idemhook.db\"\ndurability = \"full\"\n\
         http_workers = {workers}\nprune_interval = \"0s\"\n\n\
         [sources.stripe]\nkind = \"stripe\"\nsecrets = [\"{SECRET}\"]\n"
    );
    if let Some(r) = retention {
        let _ = writeln!(c, "retention = \"{r}\"\npayload_retention = \"{r}\"");
    }
    if let Some(url) = forward_url {
        let _ = write!(
            c,
            "\n[[sources.stripe.actions]]\nname = \"notify-app\"\nforward = \"{url}\"\ntimeout = \"10s\"\n"
        );
    }
    c
}
