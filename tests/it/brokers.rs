//! Real message brokers for the forward tests, from the machine's Debian
//! packages, each started in a temp dir on a free 127.0.0.1 port and
//! restartable on the same port with its data (`.ci/run` installs the
//! packages). A missing server is a loud SKIPPED outside CI and a failure
//! under `CI=true`.

#![allow(dead_code)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::harness::wait_until;

/// `program` on the PATH (or in /usr/sbin), or None after a SKIPPED line
/// naming `test` (a panic under `CI=true`).
pub fn program(program: &str, package: &str, test: &str) -> Option<PathBuf> {
    for dir in std::env::var("PATH").unwrap_or_default().split(':').chain([
        "/usr/sbin",
        "/usr/bin",
        "/usr/lib/rabbitmq/bin",
    ]) {
        let path = Path::new(dir).join(program);
        if path.is_file() {
            return Some(path);
        }
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{test}: {program} is not installed under CI=true (apt-get install -y {package})"
    );
    eprintln!(
        "\n*** SKIPPED {test}: {program} is not installed (apt-get install -y {package}) ***\n"
    );
    None
}

/// A free port on 127.0.0.1 (bound and released).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A `redis-server` with an append-only file fsynced at every write, so a
/// restart keeps every entry it acknowledged.
pub struct Redis {
    program: PathBuf,
    dir: tempfile::TempDir,
    pub port: u16,
    child: Option<Child>,
}

impl Redis {
    pub fn start(test: &str) -> Option<Redis> {
        let program = program("redis-server", "redis-server", test)?;
        let mut redis = Redis {
            program,
            dir: tempfile::tempdir().expect("a temp dir"),
            port: free_port(),
            child: None,
        };
        redis.spawn();
        Some(redis)
    }

    pub fn url(&self, rest: &str) -> String {
        format!("redis://127.0.0.1:{}/{rest}", self.port)
    }

    fn spawn(&mut self) {
        let child = Command::new(&self.program)
            .args(["--bind", "127.0.0.1", "--port", &self.port.to_string()])
            .args(["--dir", &self.dir.path().display().to_string()])
            .args(["--appendonly", "yes", "--appendfsync", "always"])
            .args(["--save", "", "--daemonize", "no", "--protected-mode", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server");
        self.child = Some(child);
        wait_until(Duration::from_secs(20), "redis answers PING", || {
            self.connection().is_some()
        });
    }

    pub fn connection(&self) -> Option<redis::Connection> {
        let client = redis::Client::open(self.url("0")).ok()?;
        let mut c = client
            .get_connection_with_timeout(Duration::from_secs(1))
            .ok()?;
        redis::cmd("PING").query::<String>(&mut c).ok()?;
        Some(c)
    }

    /// SIGKILL (what it acknowledged is in the fsynced file).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn start_again(&mut self) {
        self.kill();
        self.spawn();
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.kill();
    }
}
