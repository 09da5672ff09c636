//! Test fixtures for running the real `idemhook` binary.
//!
//! Owns: the `Server` fixture (a temp dir per test, the config file, the child
//! process, its captured stdout and stderr), running other CLI verbs against
//! the same config, HTTP helpers (ureq for ordinary requests, raw TCP for
//! hostile ones), access to the server's rows on either backend
//! (`server.count`/`rows`/`one`, through `backend.rs`; `server.db()` is the
//! SQLite file itself), and `wait_until`.
//! Does not own: signing (`sign.rs`), the fake downstream (`downstream.rs`)
//! or which backend a test runs on (`backend.rs`).
//! Nothing here links the crate under test; the binary is the boundary.

#![allow(dead_code)] // not every test module uses every helper

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rusqlite::{Connection, OpenFlags};

#[allow(unused_imports)] // re-exported for the test modules
pub use crate::backend::{Backend, Db, Param, Row, Val, backends};

/// How long `serve` may take to print its listening line.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(20);
/// Default bound on one HTTP exchange.
pub const HTTP_TIMEOUT: Duration = Duration::from_secs(5);
/// Default bound on one CLI invocation.
pub const CLI_TIMEOUT: Duration = Duration::from_secs(30);

const LISTENING_PREFIX: &str = "idemhook listening on ";

// ---------------------------------------------------------------------------
// Config
// ---------------------------------------------------------------------------

/// A config TOML built by a test: top-level keys (with harness defaults that a
/// test may override) followed by the test's `[sources...]` tables.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    top_level: BTreeMap<String, String>,
    tables: String,
}

impl ServerConfig {
    /// Harness defaults: ephemeral port on 127.0.0.1, `idemhook.db` beside the
    /// config file, fsync before every 2xx, no background pruning.
    pub fn new() -> ServerConfig {
        let mut top_level = BTreeMap::new();
        top_level.insert("listen".to_string(), toml_str("127.0.0.1:0"));
        top_level.insert("database".to_string(), toml_str("idemhook.db"));
        top_level.insert("durability".to_string(), toml_str("full"));
        top_level.insert("prune_interval".to_string(), toml_str("0s"));
        ServerConfig {
            top_level,
            tables: String::new(),
        }
    }

    /// Set (or replace) a top-level key; `value` is raw TOML (`"1024"`,
    /// `"\"full\""`). Use [`toml_str`] for strings.
    pub fn set(mut self, key: &str, raw_toml_value: &str) -> ServerConfig {
        self.top_level
            .insert(key.to_string(), raw_toml_value.to_string());
        self
    }

    /// Remove a top-level key (to test a default).
    pub fn unset(mut self, key: &str) -> ServerConfig {
        self.top_level.remove(key);
        self
    }

    /// Append raw TOML tables (`[sources.x]`, `[[sources.x.actions]]`).
    pub fn tables(mut self, toml: &str) -> ServerConfig {
        self.tables.push_str(toml);
        self.tables.push('\n');
        self
    }

    /// The PostgreSQL URL this config names as its `database`, if it does
    /// (a literal `postgres://` / `postgresql://` string).
    pub fn postgres_url(&self) -> Option<String> {
        let raw = self.top_level.get("database")?;
        let url = raw.trim().strip_prefix('"')?.strip_suffix('"')?;
        (url.starts_with("postgres://") || url.starts_with("postgresql://"))
            .then(|| url.replace("\\\\", "\\").replace("\\\"", "\""))
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        for (key, value) in &self.top_level {
            out.push_str(&format!("{key} = {value}\n"));
        }
        out.push('\n');
        out.push_str(&self.tables);
        out
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig::new()
    }
}

/// A TOML basic string literal (quoted, escaped).
pub fn toml_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

// ---------------------------------------------------------------------------
// Server fixture
// ---------------------------------------------------------------------------

/// Path of the binary under test.
pub fn binary() -> &'static str {
    env!("CARGO_BIN_EXE_idemhook")
}

/// Output captured from a child, shared with the reader threads.
type Captured = Arc<Mutex<Vec<u8>>>;

/// A running `idemhook serve` in its own temp dir. Stopped (SIGKILL) on drop;
/// when the test is panicking, the server's stdout and stderr are printed.
pub struct Server {
    dir: tempfile::TempDir,
    /// `None` for the zero-config mode (no config file, `--listen` flag).
    config_path: Option<PathBuf>,
    env: BTreeMap<String, String>,
    extra_args: Vec<String>,
    /// A command the binary runs under (`prlimit ... --`), if any.
    wrapper: Vec<String>,
    child: Option<Child>,
    base_url: String,
    stdout: Captured,
    stderr: Captured,
    /// Number of times the process was started (1 after `start`).
    generation: u32,
    /// The PostgreSQL database the config names, when it names one.
    pg_url: Option<String>,
    /// The connection `count`, `rows` and the like read through.
    store: Mutex<Option<Db>>,
}

impl Server {
    /// `start` on `backend`: SQLite as `start`; PostgreSQL on a fresh
    /// database of the test cluster (ask [`Backend::available`] first, or
    /// write the test with [`crate::backend::both_backends!`]). A config
    /// that already names a PostgreSQL database keeps it.
    pub fn start_on(backend: Backend, config: &ServerConfig, env: &[(&str, &str)]) -> Server {
        let server = if backend.is_postgres() && config.postgres_url().is_none() {
            Server::start(&backend.config(config.clone()), env)
        } else {
            Server::start(config, env)
        };
        assert_eq!(
            server.backend(),
            backend,
            "the config names another backend"
        );
        server
    }

    /// Write `config` into a fresh temp dir and start `serve --config`.
    /// `env` is the whole environment besides `PATH` (secrets, failpoints).
    pub fn start(config: &ServerConfig, env: &[(&str, &str)]) -> Server {
        Server::start_with_files(config, env, &[])
    }

    /// Like `start`, first writing `files` (relative path, contents) into the
    /// temp dir beside the config (for `file:` secrets).
    pub fn start_with_files(
        config: &ServerConfig,
        env: &[(&str, &str)],
        files: &[(&str, &[u8])],
    ) -> Server {
        let dir = tempdir();
        for (name, contents) in files {
            std::fs::write(dir.path().join(name), contents).expect("write fixture file");
        }
        let config_path = dir.path().join("idemhook.toml");
        std::fs::write(&config_path, config.render()).expect("write config");
        let mut server = Server::new_stopped(dir, Some(config_path), env, Vec::new());
        server.pg_url = config.postgres_url();
        server.spawn();
        server
    }

    /// Like `start`, the binary run under `wrapper` (a command and its
    /// arguments, such as `prlimit --nofile=256:4096 --`).
    pub fn start_wrapped(config: &ServerConfig, env: &[(&str, &str)], wrapper: &[&str]) -> Server {
        let dir = tempdir();
        let config_path = dir.path().join("idemhook.toml");
        std::fs::write(&config_path, config.render()).expect("write config");
        let mut server = Server::new_stopped(dir, Some(config_path), env, Vec::new());
        server.pg_url = config.postgres_url();
        server.wrapper = wrapper.iter().map(|a| a.to_string()).collect();
        server.spawn();
        server
    }

    /// Start `serve` with no config file in an empty temp dir (the documented
    /// development default), passing `--listen 127.0.0.1:0`.
    pub fn start_zero_config(env: &[(&str, &str)]) -> Server {
        let dir = tempdir();
        let args = vec!["--listen".to_string(), "127.0.0.1:0".to_string()];
        let mut server = Server::new_stopped(dir, None, env, args);
        server.spawn();
        server
    }

    fn new_stopped(
        dir: tempfile::TempDir,
        config_path: Option<PathBuf>,
        env: &[(&str, &str)],
        extra_args: Vec<String>,
    ) -> Server {
        Server {
            dir,
            config_path,
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            extra_args,
            wrapper: Vec::new(),
            child: None,
            base_url: String::new(),
            stdout: Arc::new(Mutex::new(Vec::new())),
            stderr: Arc::new(Mutex::new(Vec::new())),
            generation: 0,
            pg_url: None,
            store: Mutex::new(None),
        }
    }

    fn serve_args(&self) -> Vec<String> {
        let mut args = vec!["serve".to_string()];
        if let Some(path) = &self.config_path {
            args.push("--config".to_string());
            args.push(path.display().to_string());
        }
        args.extend(self.extra_args.iter().cloned());
        args
    }

    fn spawn(&mut self) {
        assert!(self.child.is_none(), "spawn while a child is running");
        self.generation += 1;
        if self.generation > 1 {
            let marker = format!("\n----- restart #{} -----\n", self.generation - 1);
            self.stdout
                .lock()
                .unwrap()
                .extend_from_slice(marker.as_bytes());
            self.stderr
                .lock()
                .unwrap()
                .extend_from_slice(marker.as_bytes());
        }
        let mut cmd = match self.wrapper.split_first() {
            None => scrubbed_command(&self.env),
            Some((program, args)) => {
                let mut cmd = scrubbed_command(&self.env);
                let mut wrapped = Command::new(program);
                wrapped
                    .env_clear()
                    .envs(cmd.get_envs().filter_map(|(k, v)| Some((k, v?))));
                wrapped.args(args).arg(cmd.get_program());
                cmd = wrapped;
                cmd
            }
        };
        cmd.args(self.serve_args())
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {} {:?}: {e}", binary(), self.serve_args()));

        // stderr: collect on a thread, for tests that grep logs.
        let stderr_pipe = child.stderr.take().unwrap();
        let stderr_buf = Arc::clone(&self.stderr);
        std::thread::spawn(move || pump(stderr_pipe, stderr_buf));

        // stdout: collect, and hand each line to the waiter below.
        let stdout_pipe = child.stdout.take().unwrap();
        let stdout_buf = Arc::clone(&self.stdout);
        let (line_tx, line_rx) = mpsc::channel::<String>();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stdout_pipe);
            let mut line = Vec::new();
            loop {
                line.clear();
                match reader.read_until(b'\n', &mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        stdout_buf.lock().unwrap().extend_from_slice(&line);
                        let _ = line_tx.send(String::from_utf8_lossy(&line).into_owned());
                    }
                }
            }
        });
        self.child = Some(child);

        let deadline = Instant::now() + STARTUP_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match line_rx.recv_timeout(left) {
                Ok(line) => {
                    if let Some(at) = line.find(LISTENING_PREFIX) {
                        let url = line[at + LISTENING_PREFIX.len()..]
                            .split_whitespace()
                            .next()
                            .unwrap_or("")
                            .trim_end_matches('/')
                            .to_string();
                        assert!(
                            url.starts_with("http://127.0.0.1:")
                                || url.starts_with("https://127.0.0.1:"),
                            "listening line has an unexpected address\n  expected: {LISTENING_PREFIX}http://127.0.0.1:PORT\n  got: {line:?}\n{}",
                            self.logs()
                        );
                        self.base_url = url;
                        break;
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    let _ = self.kill9();
                    panic!(
                        "server did not print `{LISTENING_PREFIX}http://127.0.0.1:PORT` within {STARTUP_TIMEOUT:?}\n  args: {:?}\n{}",
                        self.serve_args(),
                        self.logs()
                    );
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    // stdout closed: the process exited (or closed stdout).
                    let status = self.wait_exit_within(Duration::from_secs(5));
                    // Give the stderr pump a moment to drain.
                    std::thread::sleep(Duration::from_millis(100));
                    panic!(
                        "server exited before it was listening (status {status:?})\n  args: {:?}\n{}",
                        self.serve_args(),
                        self.logs()
                    );
                }
            }
        }
    }

    /// `http://127.0.0.1:PORT` of the current process (changes on restart).
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// `base_url` + `path`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base_url, path)
    }

    /// `127.0.0.1:PORT`, for raw TCP.
    pub fn addr(&self) -> SocketAddr {
        let hostport = self.base_url.trim_start_matches("http://");
        hostport
            .to_socket_addrs()
            .ok()
            .and_then(|mut it| it.next())
            .unwrap_or_else(|| panic!("cannot parse address from {:?}", self.base_url))
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn config_path(&self) -> Option<&Path> {
        self.config_path.as_deref()
    }

    pub fn db_path(&self) -> PathBuf {
        self.dir.path().join("idemhook.db")
    }

    /// Which backend this server's config names.
    pub fn backend(&self) -> Backend {
        match self.pg_url {
            Some(_) => Backend::Postgres,
            None => Backend::Sqlite,
        }
    }

    /// The PostgreSQL URL of its database (superuser), when on PostgreSQL.
    pub fn pg_url(&self) -> Option<&str> {
        self.pg_url.as_deref()
    }

    /// A new connection to the server's store, whichever the backend
    /// (read-only on SQLite).
    pub fn store(&self) -> Db {
        match &self.pg_url {
            Some(url) => Db::postgres(url),
            None => Db::sqlite(&self.db_path()),
        }
    }

    /// A new connection that may write (a test's own setup: an expired
    /// lease, a row to hold).
    pub fn store_rw(&self) -> Db {
        match &self.pg_url {
            Some(url) => Db::postgres(url),
            None => Db::sqlite_rw(&self.db_path()),
        }
    }

    fn with_store<T>(&self, f: impl FnOnce(&mut Db) -> T) -> T {
        let mut cached = self.store.lock().unwrap_or_else(|p| p.into_inner());
        let db = cached.get_or_insert_with(|| self.store());
        f(db)
    }

    /// The rows of `sql` on either backend (SQLite's `?1` placeholders;
    /// see `backend.rs` for the SQL both understand).
    pub fn rows(&self, sql: &str, params: &[&dyn Param]) -> Vec<Row> {
        self.with_store(|db| db.rows(sql, params))
    }

    /// The first row of `sql`, if any.
    pub fn row(&self, sql: &str, params: &[&dyn Param]) -> Option<Row> {
        self.with_store(|db| db.row(sql, params))
    }

    /// The one row of `sql`; panics when there is none.
    pub fn one(&self, sql: &str, params: &[&dyn Param]) -> Row {
        self.with_store(|db| db.one(sql, params))
    }

    /// `SELECT count(*) ...` as i64 on either backend.
    pub fn count(&self, sql: &str, params: &[&dyn Param]) -> i64 {
        self.with_store(|db| db.count(sql, params))
    }

    /// The first column of each row as text.
    pub fn texts(&self, sql: &str, params: &[&dyn Param]) -> Vec<String> {
        self.with_store(|db| db.texts(sql, params))
    }

    /// A statement that writes (a test's own setup); the rows changed.
    pub fn exec(&self, sql: &str, params: &[&dyn Param]) -> u64 {
        self.store_rw().exec(sql, params)
    }

    /// Rows of a query as text, for failure messages.
    pub fn dump(&self, sql: &str) -> String {
        self.with_store(|db| db.dump(sql))
    }

    /// A read-only connection to the server's database, with a busy timeout.
    pub fn db(&self) -> Connection {
        open_db_read_only(&self.db_path())
    }

    /// A read-write connection to the server's database (to hold locks).
    pub fn db_rw(&self) -> Connection {
        let path = self.db_path();
        let conn = Connection::open_with_flags(
            &path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .unwrap_or_else(|e| panic!("open {} read-write: {e}", path.display()));
        conn.busy_timeout(Duration::from_secs(5)).unwrap();
        conn
    }

    pub fn set_env(&mut self, key: &str, value: &str) {
        self.env.insert(key.to_string(), value.to_string());
    }

    pub fn remove_env(&mut self, key: &str) {
        self.env.remove(key);
    }

    /// Stop the current process if it still runs (SIGKILL) and start a new one
    /// on the same dir, config and database, with the current env.
    pub fn restart(&mut self) {
        if self.child.is_some() {
            let _ = self.kill9();
        }
        self.spawn();
    }

    /// SIGKILL the process (`Child::kill` is SIGKILL on unix) and reap it.
    pub fn kill9(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("kill9: no running child");
        let _ = child.kill();
        child.wait().expect("wait after kill")
    }

    /// Wait for the process to exit on its own (e.g. a `kill` failpoint),
    /// panicking with the logs after `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        match self.wait_exit_within(timeout) {
            Some(status) => status,
            None => panic!(
                "server still running after {timeout:?}\n  expected: the process exits\n{}",
                self.logs()
            ),
        }
    }

    fn wait_exit_within(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            let child = self.child.as_mut()?;
            match child.try_wait() {
                Ok(Some(status)) => {
                    self.child = None;
                    return Some(status);
                }
                Ok(None) => {}
                Err(e) => panic!("try_wait: {e}"),
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            None => false,
            Some(child) => match child.try_wait() {
                Ok(Some(_)) => {
                    self.child = None;
                    false
                }
                _ => true,
            },
        }
    }

    /// Everything the server wrote to stdout so far (all restarts).
    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.stdout.lock().unwrap()).into_owned()
    }

    /// Everything the server wrote to stderr so far (all restarts).
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.stderr.lock().unwrap()).into_owned()
    }

    /// stdout and stderr, labelled, for failure messages.
    pub fn logs(&self) -> String {
        format!(
            "----- server stdout -----\n{}\n----- server stderr -----\n{}\n-------------------------",
            self.stdout(),
            self.stderr()
        )
    }

    /// Run another verb (`events list --json`, `replay ...`) against the same
    /// config and environment, from the server's dir. `--config PATH` is
    /// appended when the server has a config file.
    pub fn run_cli(&self, args: &[&str]) -> CliOutput {
        let mut all: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        if let Some(path) = &self.config_path {
            all.push("--config".to_string());
            all.push(path.display().to_string());
        }
        run_binary(self.dir.path(), &self.env, &all, CLI_TIMEOUT)
    }

    /// Like `run_cli` but without adding `--config`.
    pub fn run_cli_raw(&self, args: &[&str]) -> CliOutput {
        let all: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        run_binary(self.dir.path(), &self.env, &all, CLI_TIMEOUT)
    }

    /// POST to `path` on this server (see [`post`]).
    pub fn post(&self, path: &str, headers: &[(String, String)], body: &[u8]) -> HttpResponse {
        post(&self.url(path), headers, body)
    }

    /// GET `path` on this server (see [`get`]).
    pub fn get(&self, path: &str) -> HttpResponse {
        get(&self.url(path))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::thread::panicking() {
            eprintln!("{}", self.logs());
        }
    }
}

fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("idemhook-it-")
        .tempdir()
        .expect("create temp dir")
}

/// A command for the binary with `env_clear()`, then `PATH`,
/// `RUST_BACKTRACE=1` and the given variables.
fn scrubbed_command(env: &BTreeMap<String, String>) -> Command {
    let mut cmd = Command::new(binary());
    cmd.env_clear();
    if let Some(path) = std::env::var_os("PATH") {
        cmd.env("PATH", path);
    }
    cmd.env("RUST_BACKTRACE", "1");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

fn pump(mut from: impl Read, into: Captured) {
    let mut buf = [0u8; 8192];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => into.lock().unwrap().extend_from_slice(&buf[..n]),
        }
    }
}

/// Output of one CLI run.
#[derive(Debug)]
pub struct CliOutput {
    pub args: Vec<String>,
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl CliOutput {
    pub fn success(&self) -> bool {
        self.status.success()
    }

    /// Panic with the full output unless the command exited 0.
    pub fn assert_success(&self) -> &CliOutput {
        assert!(
            self.status.success(),
            "`idemhook {}` failed\n  expected: exit 0\n  got: {}\n----- stdout -----\n{}\n----- stderr -----\n{}",
            self.args.join(" "),
            self.status,
            self.stdout,
            self.stderr
        );
        self
    }

    /// stdout parsed as JSON, panicking with the output otherwise.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| {
            panic!(
                "`idemhook {}` printed no JSON ({e})\n----- stdout -----\n{}\n----- stderr -----\n{}",
                self.args.join(" "),
                self.stdout,
                self.stderr
            )
        })
    }
}

/// `idemhook check --config` on `config`, written into a fresh temp dir:
/// what a config refused at start says, without starting a server.
pub fn check_config(config: &ServerConfig) -> CliOutput {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("idemhook.toml");
    std::fs::write(&path, config.render()).expect("write config");
    run_binary(
        dir.path(),
        &BTreeMap::new(),
        &[
            "check".to_string(),
            "--config".to_string(),
            path.display().to_string(),
        ],
        CLI_TIMEOUT,
    )
}

/// Run the binary with a scrubbed environment in `cwd`, killing it after
/// `timeout`.
pub fn run_binary(
    cwd: &Path,
    env: &BTreeMap<String, String>,
    args: &[String],
    timeout: Duration,
) -> CliOutput {
    let mut child = scrubbed_command(env)
        .args(args)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn idemhook {args:?}: {e}"));
    let out: Captured = Arc::new(Mutex::new(Vec::new()));
    let err: Captured = Arc::new(Mutex::new(Vec::new()));
    let out_thread = {
        let pipe = child.stdout.take().unwrap();
        let buf = Arc::clone(&out);
        std::thread::spawn(move || pump(pipe, buf))
    };
    let err_thread = {
        let pipe = child.stderr.take().unwrap();
        let buf = Arc::clone(&err);
        std::thread::spawn(move || pump(pipe, buf))
    };
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "`idemhook {}` did not finish within {timeout:?}\n----- stdout -----\n{}\n----- stderr -----\n{}",
                args.join(" "),
                String::from_utf8_lossy(&out.lock().unwrap()),
                String::from_utf8_lossy(&err.lock().unwrap())
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let _ = out_thread.join();
    let _ = err_thread.join();
    let stdout = String::from_utf8_lossy(&out.lock().unwrap()).into_owned();
    let stderr = String::from_utf8_lossy(&err.lock().unwrap()).into_owned();
    CliOutput {
        args: args.to_vec(),
        status,
        stdout,
        stderr,
    }
}

// ---------------------------------------------------------------------------
// Database
// ---------------------------------------------------------------------------

/// Open a SQLite file read-only with a 5 s busy timeout (safe while the
/// server writes: WAL mode).
pub fn open_db_read_only(path: &Path) -> Connection {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .unwrap_or_else(|e| panic!("open {} read-only: {e}", path.display()));
    conn.busy_timeout(Duration::from_secs(5)).unwrap();
    conn
}

/// `SELECT COUNT(*) ...` as i64, with the query in the panic message.
pub fn count(conn: &Connection, sql: &str, params: impl rusqlite::Params) -> i64 {
    conn.query_row(sql, params, |row| row.get::<_, i64>(0))
        .unwrap_or_else(|e| panic!("query failed: {sql}\n  error: {e}"))
}

/// Read a column that may be stored as BLOB or TEXT as bytes (NULL -> None).
pub fn bytes_of(row: &rusqlite::Row<'_>, idx: usize) -> rusqlite::Result<Option<Vec<u8>>> {
    use rusqlite::types::ValueRef;
    Ok(match row.get_ref(idx)? {
        ValueRef::Null => None,
        ValueRef::Blob(b) => Some(b.to_vec()),
        ValueRef::Text(t) => Some(t.to_vec()),
        ValueRef::Integer(i) => Some(i.to_string().into_bytes()),
        ValueRef::Real(r) => Some(r.to_string().into_bytes()),
    })
}

/// Read a column as text whatever its storage class (NULL -> None).
pub fn text_of(row: &rusqlite::Row<'_>, idx: usize) -> rusqlite::Result<Option<String>> {
    Ok(bytes_of(row, idx)?.map(|b| String::from_utf8_lossy(&b).into_owned()))
}

/// Rows of a query as strings (NULL as "NULL"), for failure messages.
pub fn dump(conn: &Connection, sql: &str) -> String {
    let mut out = String::new();
    let mut stmt = match conn.prepare(sql) {
        Ok(s) => s,
        Err(e) => return format!("(cannot dump `{sql}`: {e})"),
    };
    let n = stmt.column_count();
    let names: Vec<String> = stmt.column_names().iter().map(|s| s.to_string()).collect();
    out.push_str(&names.join(" | "));
    out.push('\n');
    let rows = stmt.query_map([], |row| {
        let mut cells = Vec::with_capacity(n);
        for i in 0..n {
            cells.push(text_of(row, i)?.unwrap_or_else(|| "NULL".to_string()));
        }
        Ok(cells.join(" | "))
    });
    match rows {
        Ok(rows) => {
            for row in rows.take(50) {
                match row {
                    Ok(line) => out.push_str(&line),
                    Err(e) => out.push_str(&format!("(error: {e})")),
                }
                out.push('\n');
            }
        }
        Err(e) => out.push_str(&format!("(error: {e})")),
    }
    out
}

// ---------------------------------------------------------------------------
// HTTP
// ---------------------------------------------------------------------------

/// A response: status, headers (names lowercased, in order) and body bytes.
#[derive(Clone, Debug)]
pub struct HttpResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl HttpResponse {
    /// First value of a header, case-insensitive.
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// Body as JSON; panics with the body when it is not JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "response body is not JSON ({e})\n  status: {}\n  body: {}",
                self.status,
                self.text()
            )
        })
    }

    /// `status` field of the JSON body, if any.
    pub fn json_status(&self) -> Option<String> {
        serde_json::from_slice::<serde_json::Value>(&self.body)
            .ok()?
            .get("status")?
            .as_str()
            .map(str::to_string)
    }
}

/// An HTTP client with keep-alive (one per thread in concurrent tests), which
/// returns non-2xx statuses as responses rather than errors.
#[derive(Clone)]
pub struct Client {
    agent: ureq::Agent,
}

impl Client {
    pub fn new(timeout: Duration) -> Client {
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(timeout))
            .max_redirects(0)
            .build();
        Client {
            agent: config.into(),
        }
    }

    /// POST; `Err` only for transport failures (refused, reset, timeout).
    pub fn try_post(
        &self,
        url: &str,
        headers: &[(String, String)],
        body: &[u8],
    ) -> Result<HttpResponse, String> {
        let mut req = self.agent.post(url);
        for (k, v) in headers {
            req = req.header(k.as_str(), v.as_str());
        }
        let resp = req.send(body).map_err(|e| format!("POST {url}: {e}"))?;
        convert(resp).map_err(|e| format!("POST {url}: reading body: {e}"))
    }

    pub fn try_get(&self, url: &str) -> Result<HttpResponse, String> {
        let resp = self
            .agent
            .get(url)
            .call()
            .map_err(|e| format!("GET {url}: {e}"))?;
        convert(resp).map_err(|e| format!("GET {url}: reading body: {e}"))
    }

    /// GET with these request headers; panics on transport failures.
    pub fn get_with(&self, url: &str, headers: &[(String, String)]) -> HttpResponse {
        let mut req = self.agent.get(url);
        for (k, v) in headers {
            req = req.header(k.as_str(), v.as_str());
        }
        let resp = req.call().unwrap_or_else(|e| panic!("GET {url}: {e}"));
        convert(resp).unwrap_or_else(|e| panic!("GET {url}: reading body: {e}"))
    }

    pub fn post(&self, url: &str, headers: &[(String, String)], body: &[u8]) -> HttpResponse {
        self.try_post(url, headers, body)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    pub fn get(&self, url: &str) -> HttpResponse {
        self.try_get(url).unwrap_or_else(|e| panic!("{e}"))
    }
}

fn convert(mut resp: ureq::http::Response<ureq::Body>) -> Result<HttpResponse, ureq::Error> {
    let status = resp.status().as_u16();
    let headers = resp
        .headers()
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_ascii_lowercase(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let body = resp.body_mut().read_to_vec()?;
    Ok(HttpResponse {
        status,
        headers,
        body,
    })
}

/// POST with a fresh connection and the default timeout; panics on transport
/// errors (use [`try_post`] when a failure is expected).
pub fn post(url: &str, headers: &[(String, String)], body: &[u8]) -> HttpResponse {
    Client::new(HTTP_TIMEOUT).post(url, headers, body)
}

pub fn try_post(
    url: &str,
    headers: &[(String, String)],
    body: &[u8],
) -> Result<HttpResponse, String> {
    Client::new(HTTP_TIMEOUT).try_post(url, headers, body)
}

pub fn get(url: &str) -> HttpResponse {
    Client::new(HTTP_TIMEOUT).get(url)
}

/// Build a header list from string pairs.
pub fn headers(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

// ---------------------------------------------------------------------------
// Raw TCP, for hostile requests
// ---------------------------------------------------------------------------

/// What came back on a raw connection.
#[derive(Debug)]
pub struct RawResponse {
    /// Every byte read.
    pub raw: Vec<u8>,
    /// Status code of the first response, when its status line arrived.
    pub status: Option<u16>,
    /// Why reading stopped: "complete", "eof", "timeout", "reset", ...
    pub ended_by: String,
    pub elapsed: Duration,
}

impl RawResponse {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.raw).into_owned()
    }

    pub fn header(&self, name: &str) -> Option<String> {
        let text = self.text();
        let head = text.split("\r\n\r\n").next()?;
        head.lines().skip(1).find_map(|line| {
            let (k, v) = line.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_string())
        })
    }
}

/// Send `request` bytes as-is and read one response until it is complete
/// (by Content-Length or chunked terminator), the peer closes, or `timeout`.
pub fn raw_exchange(addr: SocketAddr, request: &[u8], timeout: Duration) -> RawResponse {
    raw_exchange_parts(addr, &[request], Duration::ZERO, timeout)
}

/// Like [`raw_exchange`] but writes `parts` one after the other with `pause`
/// between them (slow senders, bodies that start after the headers). A
/// write error (the server closed early) stops writing and goes on to read.
pub fn raw_exchange_parts(
    addr: SocketAddr,
    parts: &[&[u8]],
    pause: Duration,
    timeout: Duration,
) -> RawResponse {
    let started = Instant::now();
    let mut stream = TcpStream::connect_timeout(&addr, timeout).expect("raw connect");
    stream.set_nodelay(true).ok();
    stream.set_write_timeout(Some(timeout)).ok();
    // Between parts, collect whatever the server already answered (an early
    // 413), and stop writing once a whole response is in.
    let mut early = Vec::new();
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            if !pause.is_zero() {
                std::thread::sleep(pause);
            }
            if drain_nonblocking(&mut stream, &mut early) || raw_response_complete(&early) {
                break;
            }
        }
        if stream.write_all(part).is_err() {
            break;
        }
    }
    let _ = stream.flush();
    read_response(&mut stream, early, started, timeout)
}

/// Read what is available without blocking into `into`; true on EOF or error.
fn drain_nonblocking(stream: &mut TcpStream, into: &mut Vec<u8>) -> bool {
    if stream.set_nonblocking(true).is_err() {
        return true;
    }
    let mut buf = [0u8; 16384];
    let closed = loop {
        match stream.read(&mut buf) {
            Ok(0) => break true,
            Ok(n) => into.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break false,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break true,
        }
    };
    let _ = stream.set_nonblocking(false);
    closed
}

fn read_response(
    stream: &mut TcpStream,
    already: Vec<u8>,
    started: Instant,
    timeout: Duration,
) -> RawResponse {
    let deadline = started + timeout;
    let mut raw = already;
    let mut buf = [0u8; 16384];
    let ended_by = loop {
        if raw_response_complete(&raw) {
            break "complete".to_string();
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break "timeout".to_string();
        }
        stream.set_read_timeout(Some(left)).ok();
        match stream.read(&mut buf) {
            Ok(0) => break "eof".to_string(),
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                break "timeout".to_string();
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => break format!("error: {e}"),
        }
    };
    let status = parse_status(&raw);
    RawResponse {
        raw,
        status,
        ended_by,
        elapsed: started.elapsed(),
    }
}

fn parse_status(raw: &[u8]) -> Option<u16> {
    let text = String::from_utf8_lossy(&raw[..raw.len().min(64)]);
    let mut it = text.split_whitespace();
    let version = it.next()?;
    if !version.starts_with("HTTP/") {
        return None;
    }
    it.next()?.parse().ok()
}

fn raw_response_complete(raw: &[u8]) -> bool {
    let Some(head_end) = find(raw, b"\r\n\r\n") else {
        return false;
    };
    let head = String::from_utf8_lossy(&raw[..head_end]).to_ascii_lowercase();
    let body = &raw[head_end + 4..];
    let mut content_length = None;
    let mut chunked = false;
    for line in head.lines().skip(1) {
        if let Some((k, v)) = line.split_once(':') {
            match k.trim() {
                "content-length" => content_length = v.trim().parse::<usize>().ok(),
                "transfer-encoding" => chunked = v.contains("chunked"),
                _ => {}
            }
        }
    }
    if chunked {
        return find(body, b"0\r\n\r\n").is_some();
    }
    match content_length {
        Some(n) => body.len() >= n,
        // No length: a bodiless status, or read-until-close. Treat 1xx/204/304
        // as complete; otherwise wait for EOF.
        None => matches!(parse_status(raw), Some(s) if s < 200 || s == 204 || s == 304),
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Build a request's bytes: request line, `Host`, the given headers in
/// order (duplicates kept), `Content-Length` unless one is given or
/// `Transfer-Encoding` is set, then the body.
pub fn raw_request(method: &str, path: &str, headers: &[(String, String)], body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n").as_bytes());
    let mut has_length = false;
    for (k, v) in headers {
        if k.eq_ignore_ascii_case("content-length") || k.eq_ignore_ascii_case("transfer-encoding") {
            has_length = true;
        }
        out.extend_from_slice(k.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(v.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if !has_length {
        out.extend_from_slice(format!("Content-Length: {}\r\n", body.len()).as_bytes());
    }
    out.extend_from_slice(b"Connection: close\r\n\r\n");
    out.extend_from_slice(body);
    out
}

// ---------------------------------------------------------------------------
// Waiting
// ---------------------------------------------------------------------------

/// Poll `condition` every 20 ms until it holds; panic after `timeout` with
/// `what` (what was being waited for).
pub fn wait_until(timeout: Duration, what: &str, mut condition: impl FnMut() -> bool) {
    let started = Instant::now();
    loop {
        if condition() {
            return;
        }
        if started.elapsed() >= timeout {
            panic!("timed out after {timeout:?}\n  waiting for: {what}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Poll `probe` until it returns `Ok(value)`; panic after `timeout` with
/// `what` and the last `Err` (which should say what was seen instead).
pub fn wait_for<T>(
    timeout: Duration,
    what: &str,
    mut probe: impl FnMut() -> Result<T, String>,
) -> T {
    let started = Instant::now();
    loop {
        let last = match probe() {
            Ok(value) => return value,
            Err(e) => e,
        };
        if started.elapsed() >= timeout {
            panic!("timed out after {timeout:?}\n  waiting for: {what}\n  last seen: {last}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Current unix time in seconds.
pub fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// Current unix time in milliseconds.
pub fn now_millis() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

impl Server {
    /// Like `start`, with extra arguments after `serve --config PATH`
    /// (e.g. `--log-format json`).
    pub fn start_with_args(config: &ServerConfig, env: &[(&str, &str)], args: &[&str]) -> Server {
        let dir = tempdir();
        let config_path = dir.path().join("idemhook.toml");
        std::fs::write(&config_path, config.render()).expect("write config");
        let args = args.iter().map(|a| a.to_string()).collect();
        let mut server = Server::new_stopped(dir, Some(config_path), env, args);
        server.pg_url = config.postgres_url();
        server.spawn();
        server
    }
}

// ---------------------------------------------------------------------------
// Signals
// ---------------------------------------------------------------------------

impl Server {
    /// The process id of the running `serve` (panics when it is not running).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("pid: no running child").id()
    }

    /// Send SIGTERM (graceful shutdown) with `kill -TERM <pid>`; the process
    /// keeps running until it exits on its own (see [`Server::wait_exit`]).
    pub fn terminate(&self) {
        let pid = self.pid().to_string();
        let status = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap_or_else(|e| panic!("run kill -TERM {pid}: {e}"));
        assert!(status.success(), "kill -TERM {pid} failed: {status}");
    }
}
