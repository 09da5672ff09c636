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

/// A `nats-server` with JetStream, its store in a temp dir (kept across a
/// restart), and a stream `EVENTS` on `events.>` with a 10-minute
/// duplicate window.
pub struct Nats {
    program: PathBuf,
    dir: tempfile::TempDir,
    pub port: u16,
    child: Option<Child>,
    rt: tokio::runtime::Runtime,
}

impl Nats {
    pub fn start(test: &str) -> Option<Nats> {
        Nats::start_with(test, "")
    }

    /// With `conf` as the server's config file (e.g. `max_payload: 512`).
    pub fn start_with(test: &str, conf: &str) -> Option<Nats> {
        let program = program("nats-server", "nats-server", test)?;
        let mut nats = Nats {
            program,
            dir: tempfile::tempdir().expect("a temp dir"),
            port: free_port(),
            child: None,
            rt: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime"),
        };
        std::fs::write(nats.dir.path().join("nats.conf"), conf).expect("write nats.conf");
        nats.spawn();
        nats.rt.block_on(async {
            let js = async_nats::jetstream::new(
                async_nats::connect(format!("127.0.0.1:{}", nats.port))
                    .await
                    .expect("connect to nats"),
            );
            js.create_stream(async_nats::jetstream::stream::Config {
                name: "EVENTS".to_string(),
                subjects: vec!["events.>".to_string()],
                duplicate_window: Duration::from_secs(600),
                ..Default::default()
            })
            .await
            .expect("create the stream");
        });
        Some(nats)
    }

    pub fn url(&self, subject: &str) -> String {
        format!("nats://127.0.0.1:{}/{subject}", self.port)
    }

    fn spawn(&mut self) {
        let child = Command::new(&self.program)
            .args(["-a", "127.0.0.1", "-p", &self.port.to_string(), "-js"])
            .args(["-sd", &self.dir.path().display().to_string()])
            .args([
                "-c",
                &self.dir.path().join("nats.conf").display().to_string(),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start nats-server");
        self.child = Some(child);
        let port = self.port;
        wait_until(Duration::from_secs(20), "nats-server listens", || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
    }

    /// The stream's message count and the ids (`Nats-Msg-Id`) of its messages.
    pub fn messages(&self) -> (u64, Vec<String>) {
        self.rt.block_on(async {
            let js = async_nats::jetstream::new(
                async_nats::connect(format!("127.0.0.1:{}", self.port))
                    .await
                    .expect("connect to nats"),
            );
            let mut stream = js.get_stream("EVENTS").await.expect("the stream");
            let info = stream.info().await.expect("stream info").clone();
            let mut ids = Vec::new();
            for seq in info.state.first_sequence..=info.state.last_sequence {
                if let Ok(m) = stream.get_raw_message(seq).await
                    && let Some(id) = m.headers.get("Nats-Msg-Id")
                {
                    ids.push(id.to_string());
                }
            }
            (info.state.messages, ids)
        })
    }

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

impl Drop for Nats {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A `rabbitmq-server` node of its own (name, ports, epmd, data dir), with
/// a durable direct exchange `events` and a durable queue `q` bound to it
/// with the routing key `shop`.
pub struct Rabbit {
    program: PathBuf,
    dir: tempfile::TempDir,
    pub port: u16,
    /// Erlang distribution's port and the node's own epmd's.
    dist_port: u16,
    epmd_port: u16,
    child: Option<Child>,
    rt: tokio::runtime::Runtime,
}

impl Rabbit {
    pub fn start(test: &str) -> Option<Rabbit> {
        Rabbit::start_with(test, "")
    }

    /// With `conf` as the server's `rabbitmq.conf` (e.g.
    /// `max_message_size = 4096`).
    pub fn start_with(test: &str, conf: &str) -> Option<Rabbit> {
        let program = program("rabbitmq-server", "rabbitmq-server", test)?;
        // The wrapper in /usr/sbin switches user; the server script itself
        // runs as whoever starts it.
        let program = Some(PathBuf::from("/usr/lib/rabbitmq/bin/rabbitmq-server"))
            .filter(|p| p.is_file())
            .unwrap_or(program);
        // Three distinct free ports (held until all are chosen).
        let held: Vec<TcpListener> = (0..3)
            .map(|_| TcpListener::bind("127.0.0.1:0").expect("a free port"))
            .collect();
        let ports: Vec<u16> = held
            .iter()
            .map(|l| l.local_addr().expect("its address").port())
            .collect();
        drop(held);
        let mut rabbit = Rabbit {
            program,
            dir: tempfile::tempdir().expect("a temp dir"),
            port: ports[0],
            dist_port: ports[1],
            epmd_port: ports[2],
            child: None,
            rt: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime"),
        };
        if !conf.is_empty() {
            std::fs::write(rabbit.dir.path().join("rabbitmq.conf"), conf)
                .expect("write rabbitmq.conf");
        }
        rabbit.spawn();
        let url = rabbit.amqp_url();
        rabbit.rt.block_on(async {
            use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
            use lapin::types::FieldTable;
            let conn = lapin::Connection::connect(&url, lapin::ConnectionProperties::default())
                .await
                .expect("connect to rabbitmq");
            let ch = conn.create_channel().await.expect("a channel");
            ch.exchange_declare(
                "events".into(),
                lapin::ExchangeKind::Direct,
                ExchangeDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .expect("declare the exchange");
            ch.queue_declare(
                "q".into(),
                QueueDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .expect("declare the queue");
            ch.queue_bind(
                "q".into(),
                "events".into(),
                "shop".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("bind the queue");
        });
        Some(rabbit)
    }

    fn amqp_url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.port)
    }

    /// The forward URL: exchange `events`, the routing key given.
    pub fn url(&self, routing_key: &str) -> String {
        format!(
            "{}?exchange=events&routing_key={routing_key}",
            self.amqp_url()
        )
    }

    fn spawn(&mut self) {
        use std::os::unix::process::CommandExt as _;
        let dir = self.dir.path();
        let port = self.port;
        let child = Command::new(&self.program)
            .env("HOME", dir)
            .env("RABBITMQ_NODE_PORT", port.to_string())
            .env("RABBITMQ_DIST_PORT", self.dist_port.to_string())
            .env("ERL_EPMD_PORT", self.epmd_port.to_string())
            .env("RABBITMQ_NODENAME", format!("it{port}@localhost"))
            .env("RABBITMQ_MNESIA_BASE", dir.join("mnesia"))
            .env("RABBITMQ_LOG_BASE", dir.join("log"))
            .env("RABBITMQ_ENABLED_PLUGINS_FILE", dir.join("plugins"))
            .env("RABBITMQ_CONFIG_FILE", dir.join("rabbitmq"))
            .current_dir(dir)
            .process_group(0)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start rabbitmq-server");
        self.child = Some(child);
        let url = self.amqp_url();
        wait_until(
            Duration::from_secs(60),
            "rabbitmq accepts a connection",
            || {
                self.rt.block_on(async {
                    lapin::Connection::connect(&url, lapin::ConnectionProperties::default())
                        .await
                        .is_ok()
                })
            },
        );
    }

    /// The `message_id` of every message in `q` (taken off the queue).
    pub fn drain(&self) -> Vec<String> {
        let url = self.amqp_url();
        self.rt.block_on(async {
            let conn = lapin::Connection::connect(&url, lapin::ConnectionProperties::default())
                .await
                .expect("connect to rabbitmq");
            let ch = conn.create_channel().await.expect("a channel");
            let mut ids = Vec::new();
            while let Some(m) = ch
                .basic_get("q".into(), lapin::options::BasicGetOptions { no_ack: true })
                .await
                .expect("basic_get")
            {
                ids.push(
                    m.delivery
                        .properties
                        .message_id()
                        .as_ref()
                        .map(|s| s.to_string())
                        .unwrap_or_default(),
                );
            }
            ids
        })
    }

    /// SIGKILL the node's whole process group.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            if let Some(pid) = rustix::process::Pid::from_raw(c.id() as i32) {
                let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn start_again(&mut self) {
        self.kill();
        self.spawn();
    }
}

impl Drop for Rabbit {
    fn drop(&mut self) {
        self.kill();
        // The node's own epmd, on its own port (it refuses while it still
        // lists the killed node).
        for _ in 0..20 {
            let killed = Command::new("epmd")
                .args(["-port", &self.epmd_port.to_string(), "-kill"])
                .output()
                .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("Killed"));
            if killed {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}
