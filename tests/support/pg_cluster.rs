//! A throwaway PostgreSQL cluster for tests: one per test binary run,
//! shared by its tests, each of which gets a database of its own.
//!
//! `IDEMHOOK_TEST_PG_URL` (a superuser's URL) is used when set. Otherwise
//! `initdb` and `postgres` (from /usr/lib/postgresql/*/bin, or PATH) make
//! a cluster in a temp dir, listening only on a unix socket in that dir.
//! The server binaries refuse to run as root, so under root they run as
//! the `postgres` user, in a dir owned by it. A watchdog process stops the
//! server and removes the dir when the test process ends (libtest has no
//! hook for the end of a run). Without PostgreSQL, `cluster()` is None and
//! a loud SKIPPED line goes to the real stderr (not the captured one); an
//! `IDEMHOOK_TEST_PG_URL` that cannot be reached fails the tests instead,
//! and so does a missing PostgreSQL under `CI=true` (CI installs it).
//! `IDEMHOOK_TEST_NO_PG=1` takes the skip path on purpose.
//!
//! Shared by the library's unit tests and the integration tests
//! (included by `#[path]` in both).

#![allow(dead_code)] // each user takes what it needs

use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// A running server and how to reach it as a superuser.
pub struct Cluster {
    /// A URL without a database name: `{base}/dbname` reaches one.
    base: String,
    /// Query parameters after the database name (the socket dir).
    query: String,
    /// The data directory when this run made the cluster.
    pub data_dir: Option<PathBuf>,
    /// The postmaster's pid when this run started it.
    pub pid: Option<u32>,
}

static CLUSTER: OnceLock<Option<Cluster>> = OnceLock::new();
static NEXT_DB: AtomicUsize = AtomicUsize::new(0);

/// The shared cluster, started on first use; None when PostgreSQL is not
/// available (after saying so loudly, once).
pub fn cluster() -> Option<&'static Cluster> {
    CLUSTER
        .get_or_init(|| match start() {
            Ok(c) => Some(c),
            // Asked for by name: a server that cannot be reached is a
            // failure, not a skip.
            Err(why) if std::env::var_os("IDEMHOOK_TEST_PG_URL").is_some() => {
                panic!("IDEMHOOK_TEST_PG_URL is set but unusable: {why}")
            }
            // CI always has PostgreSQL (.ci/run installs it): a skip there
            // would hide that half of the tests did not run.
            Err(why) if std::env::var("CI").is_ok_and(|v| v == "true" || v == "1") => {
                panic!("CI is set but PostgreSQL is unusable: {why}")
            }
            Err(why) => {
                let _ = writeln!(
                    std::io::stderr(),
                    "\n*** SKIPPED: PostgreSQL tests did not run: {why}. \
                     Install PostgreSQL (apt-get install -y postgresql) or set \
                     IDEMHOOK_TEST_PG_URL to a superuser's URL. ***\n"
                );
                None
            }
        })
        .as_ref()
}

/// Says loudly that the calling test did not run.
pub fn skipped(test: &str) {
    let _ = writeln!(std::io::stderr(), "*** SKIPPED (no PostgreSQL): {test} ***");
}

impl Cluster {
    /// A superuser's URL for database `db`.
    pub fn url(&self, db: &str) -> String {
        format!("{}/{db}{}", self.base, self.query)
    }

    /// Creates a fresh, empty database for one test and returns its URL.
    pub fn create_database(&self, hint: &str) -> String {
        let n = NEXT_DB.fetch_add(1, Ordering::Relaxed);
        let clean: String = hint
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '_'
                }
            })
            .take(40)
            .collect();
        let name = format!("t{}_{n}_{clean}", std::process::id());
        // One at a time: CREATE DATABASE copies template1 and refuses while
        // another copy of it is under way.
        static CREATING: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _one = CREATING.lock().unwrap_or_else(|p| p.into_inner());
        let mut client = postgres::Client::connect(&self.url("postgres"), postgres::NoTls)
            .unwrap_or_else(|e| panic!("connect to the test cluster: {e:?}"));
        // idemhook's tables live in its own schema; the tests' own
        // connections find them unqualified after the team's `public`.
        for sql in [
            format!("DROP DATABASE IF EXISTS {name}"),
            format!("CREATE DATABASE {name}"),
            format!("ALTER DATABASE {name} SET search_path = \"$user\", public, idemhook"),
        ] {
            client
                .batch_execute(&sql)
                .unwrap_or_else(|e| panic!("{sql}: {e:?}"));
        }
        self.url(&name)
    }
}

fn start() -> Result<Cluster, String> {
    if let Ok(url) = std::env::var("IDEMHOOK_TEST_PG_URL")
        && !url.is_empty()
    {
        return from_url(&url);
    }
    let local = Local::create()?;
    local.spawn()?;
    local.wait_ready()?;
    let cluster = local.cluster();
    // The shared cluster lives as long as the process; the watchdog stops
    // it afterwards (Drop would stop it now).
    std::mem::forget(local);
    Ok(cluster)
}

/// A cluster this process made, which a test may stop, start, freeze and
/// thaw (`private()`), or the shared one.
pub struct Local {
    bin: PathBuf,
    dir: PathBuf,
    as_user: Option<(u32, u32)>,
    /// `-c name=value` settings beyond the defaults (TLS on TCP).
    extra: Vec<String>,
}

/// A private cluster with these `name=value` settings on top of the
/// test defaults (the benchmark turns fsync back on).
pub fn private_with(settings: &[&str]) -> Option<Local> {
    if std::env::var_os("IDEMHOOK_TEST_PG_URL").is_some() {
        return None;
    }
    let mut local = Local::create().ok()?;
    local.extra = settings.iter().map(|s| s.to_string()).collect();
    local.spawn().ok()?;
    local.wait_ready().ok()?;
    Some(local)
}

/// A private cluster that also listens on 127.0.0.1 (a free port), where
/// every TCP connection must give its password (scram-sha-256) while the
/// unix socket trusts the superuser; returns it and the port.
pub fn private_with_passwords() -> Option<(Local, u16)> {
    if std::env::var_os("IDEMHOOK_TEST_PG_URL").is_some() {
        return None;
    }
    let mut local = Local::create().ok()?;
    let hba = local.data().join("pg_hba.conf");
    std::fs::write(
        &hba,
        "local all all trust\nhost all all 127.0.0.1/32 scram-sha-256\n",
    )
    .ok()?;
    if let Some((uid, gid)) = local.as_user {
        std::os::unix::fs::chown(&hba, Some(uid), Some(gid)).ok()?;
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .ok()?
        .local_addr()
        .ok()?
        .port();
    local.extra = vec![
        "listen_addresses=127.0.0.1".to_string(),
        format!("port={port}"),
    ];
    local.spawn().ok()?;
    local.wait_ready().ok()?;
    Some((local, port))
}

/// A private cluster that also listens on 127.0.0.1 (a free port) with
/// TLS on, with this certificate and key; returns it and the port.
pub fn private_tls(cert_pem: &str, key_pem: &str) -> Option<(Local, u16)> {
    if std::env::var_os("IDEMHOOK_TEST_PG_URL").is_some() {
        return None;
    }
    let mut local = Local::create().ok()?;
    let data = local.data();
    std::fs::write(data.join("server.crt"), cert_pem).ok()?;
    std::fs::write(data.join("server.key"), key_pem).ok()?;
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(
            data.join("server.key"),
            std::fs::Permissions::from_mode(0o600),
        )
        .ok()?;
    }
    if let Some((uid, gid)) = local.as_user {
        for f in ["server.crt", "server.key"] {
            std::os::unix::fs::chown(data.join(f), Some(uid), Some(gid)).ok()?;
        }
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .ok()?
        .local_addr()
        .ok()?
        .port();
    local.extra = vec![
        "ssl=on".to_string(),
        "listen_addresses=127.0.0.1".to_string(),
        format!("port={port}"),
    ];
    local.spawn().ok()?;
    local.wait_ready().ok()?;
    Some((local, port))
}

/// A cluster of its own for a test that stops or freezes the server (the
/// shared one must stay up for the others). None without PostgreSQL.
pub fn private() -> Option<Local> {
    if std::env::var_os("IDEMHOOK_TEST_PG_URL").is_some() {
        return None; // only a local server can be stopped by the test
    }
    let local = Local::create().ok()?;
    local.spawn().ok()?;
    local.wait_ready().ok()?;
    Some(local)
}

impl Local {
    /// A cluster made by initdb (not started).
    fn create() -> Result<Local, String> {
        let local = Local::empty()?;
        local.run(
            "initdb",
            &[
                "-D",
                &local.data().display().to_string(),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
                "--no-instructions",
            ],
        )?;
        Ok(local)
    }

    /// A streaming standby of `primary` (a running cluster), made by
    /// `pg_basebackup -R` over its unix socket and started with the same
    /// settings; a hot standby, read-only until [`Local::promote`].
    pub fn standby_of(primary: &Local) -> Result<Local, String> {
        let mut local = Local::empty()?;
        // The primary's settings, but not a synchronous primary itself
        // once promoted (with no standby of its own, its commits would
        // wait forever), and a port of its own where the primary has one.
        local.extra = primary
            .extra
            .iter()
            .filter(|s| !s.starts_with("synchronous_standby_names="))
            .map(|s| match s.strip_prefix("port=") {
                Some(_) => format!("port={}", free_port()),
                None => s.clone(),
            })
            .collect();
        let primary_dir = primary.dir.display().to_string();
        local.run(
            "pg_basebackup",
            &[
                "-D",
                &local.data().display().to_string(),
                "-h",
                &primary_dir,
                "-p",
                primary.port(),
                "-U",
                "postgres",
                "-R",
                "-X",
                "stream",
                "-c",
                "fast",
            ],
        )?;
        local.spawn()?;
        local.wait_ready()?;
        Ok(local)
    }

    /// The port it listens on (TCP when `listen_addresses` is set).
    pub fn port(&self) -> &str {
        self.extra
            .iter()
            .find_map(|s| s.strip_prefix("port="))
            .unwrap_or("5432")
    }

    /// Kills the postmaster and every backend with SIGKILL: a crash of the
    /// machine, as the clients see it.
    pub fn kill9(&self) {
        let all = self.processes();
        for pid in &all {
            signal(*pid, "KILL");
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline
            && all.iter().any(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .is_ok_and(|s| !s.contains(") Z "))
            })
        {
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Promotes a standby to a primary and waits until it accepts writes.
    pub fn promote(&self) -> Result<(), String> {
        let data = self.data().display().to_string();
        self.run("pg_ctl", &["promote", "-w", "-D", &data])
    }

    /// Runs one of the server's tools as its user, and its error output
    /// when it fails.
    fn run(&self, program: &str, args: &[&str]) -> Result<(), String> {
        let out = self
            .command(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .map_err(|e| format!("run {program}: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "{program} failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(())
    }

    /// A folder for a cluster, with its watchdog, and no data yet.
    fn empty() -> Result<Local, String> {
        static N: AtomicUsize = AtomicUsize::new(0);
        // To see the skip path on a machine that has PostgreSQL (the
        // shared cluster and the private ones alike).
        if std::env::var_os("IDEMHOOK_TEST_NO_PG").is_some() {
            return Err("IDEMHOOK_TEST_NO_PG is set".to_string());
        }
        let bin = find_bin_dir().ok_or("no initdb in /usr/lib/postgresql/*/bin or on PATH")?;
        let dir = std::env::temp_dir().join(format!(
            "idemhook-pg-{}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos())
        ));
        std::fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
        let as_user = if is_root() {
            let (uid, gid) =
                postgres_user().ok_or("running as root and there is no postgres user")?;
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid))
                .map_err(|e| format!("chown {}: {e}", dir.display()))?;
            Some((uid, gid))
        } else {
            None
        };
        let local = Local {
            bin,
            dir,
            as_user,
            extra: Vec::new(),
        };
        // The watchdog: when this test process is gone, stop the server
        // (whichever postmaster runs then) and remove the dir. Its own
        // output goes nowhere, so cargo does not wait for it.
        let pidfile = local.data().join("postmaster.pid");
        let script = format!(
            "while [ -d /proc/{me} ]; do sleep 1; done; \
             pid=$(head -1 '{pidfile}' 2>/dev/null); \
             if [ -n \"$pid\" ]; then kill -CONT $pid 2>/dev/null; pkill -CONT -P $pid 2>/dev/null; \
             kill -INT $pid 2>/dev/null; \
             i=0; while [ -d /proc/$pid ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done; \
             kill -KILL $pid 2>/dev/null; fi; rm -rf '{dir}'",
            me = std::process::id(),
            pidfile = pidfile.display(),
            dir = local.dir.display()
        );
        Command::new("sh")
            .args(["-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .map_err(|e| format!("start the watchdog: {e}"))?;
        Ok(local)
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(self.bin.join(program));
        if let Some((uid, gid)) = self.as_user {
            cmd.uid(uid).gid(gid);
        }
        cmd.current_dir(&self.dir);
        cmd
    }

    /// Starts the server (again).
    pub fn spawn(&self) -> Result<(), String> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("server.log"))
            .map_err(|e| format!("open server.log: {e}"))?;
        if let Some((uid, gid)) = self.as_user {
            let _ = std::os::unix::fs::chown(self.dir.join("server.log"), Some(uid), Some(gid));
        }
        let log2 = log.try_clone().map_err(|e| e.to_string())?;
        let mut server = self.command("postgres");
        server
            .arg("-D")
            .arg(self.data())
            .arg("-k")
            .arg(&self.dir)
            .args([
                "-c",
                "listen_addresses=",
                "-c",
                "port=5432",
                "-c",
                "max_connections=300",
                "-c",
                "shared_buffers=64MB",
                "-c",
                "fsync=off",
                "-c",
                "full_page_writes=off",
                "-c",
                "max_locks_per_transaction=256",
            ])
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2);
        // Later settings win: the extra ones replace the defaults above.
        for setting in &self.extra {
            server.arg("-c").arg(setting);
        }
        let child = server.spawn().map_err(|e| format!("start postgres: {e}"))?;
        drop(child);
        Ok(())
    }

    /// Waits until the server accepts connections (60 s at most).
    pub fn wait_ready(&self) -> Result<(), String> {
        let url = self.cluster().url("postgres");
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match postgres::Client::connect(&url, postgres::NoTls) {
                Ok(_) => return Ok(()),
                Err(e) if Instant::now() > deadline => {
                    let log =
                        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default();
                    return Err(format!(
                        "postgres did not accept connections in 60 s: {e}\n{log}"
                    ));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    /// The postmaster's pid, from its pid file.
    pub fn pid(&self) -> Option<u32> {
        std::fs::read_to_string(self.data().join("postmaster.pid"))
            .ok()?
            .lines()
            .next()?
            .trim()
            .parse()
            .ok()
    }

    /// Stops the server (fast shutdown: sessions are ended) and waits.
    pub fn stop(&self) {
        let Some(pid) = self.pid() else { return };
        signal(pid, "INT");
        let deadline = Instant::now() + Duration::from_secs(30);
        while Path::new(&format!("/proc/{pid}")).exists() && Instant::now() < deadline {
            // A zombie until this process reaps it: the child was dropped,
            // so look at its state instead.
            if std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|s| s.contains(") Z "))
            {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Freezes every process of the server (SIGSTOP): a hung database.
    pub fn freeze(&self) {
        // Until no process is left running: a backend the postmaster forked
        // while the first list was read would otherwise go on serving its
        // connection. Once the postmaster is stopped it forks no more.
        let mut stopped = std::collections::HashSet::new();
        for _ in 0..10 {
            let new: Vec<u32> = self
                .processes()
                .into_iter()
                .filter(|pid| !stopped.contains(pid))
                .collect();
            if new.is_empty() {
                break;
            }
            for pid in new {
                signal(pid, "STOP");
                stopped.insert(pid);
            }
        }
    }

    /// Lets a frozen server go on.
    pub fn thaw(&self) {
        for pid in self.processes() {
            signal(pid, "CONT");
        }
    }

    /// The postmaster and its children.
    fn processes(&self) -> Vec<u32> {
        let Some(postmaster) = self.pid() else {
            return Vec::new();
        };
        let mut out = vec![postmaster];
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            // pid (comm) state ppid ...: the comm may hold spaces.
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|p| p.parse::<u32>().ok());
            if ppid == Some(postmaster) {
                out.push(pid);
            }
        }
        out
    }

    /// How to reach this cluster as a superuser.
    pub fn cluster(&self) -> Cluster {
        let port = self
            .extra
            .iter()
            .find_map(|s| s.strip_prefix("port="))
            .unwrap_or("5432");
        Cluster {
            base: "postgresql://postgres@localhost".to_string(),
            query: format!("?host={}&port={port}", self.dir.display()),
            data_dir: Some(self.data()),
            pid: self.pid(),
        }
    }
}

impl Drop for Local {
    fn drop(&mut self) {
        self.thaw();
        self.stop();
    }
}

/// A TCP port nothing listens on now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("a free port: {e}"))
}

fn signal(pid: u32, name: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// An existing server: `url` names a database the tests may create others
/// beside; they connect to the same server with the same user.
fn from_url(url: &str) -> Result<Cluster, String> {
    let (head, query) = match url.split_once('?') {
        Some((h, q)) => (h, format!("?{q}")),
        None => (url, String::new()),
    };
    let after_scheme = head.find("://").map_or(0, |i| i + 3);
    let base = match head[after_scheme..].find('/') {
        Some(slash) => head[..after_scheme + slash].to_string(),
        None => head.to_string(),
    };
    let cluster = Cluster {
        base,
        query,
        data_dir: None,
        pid: None,
    };
    postgres::Client::connect(&cluster.url("postgres"), postgres::NoTls)
        .map_err(|e| format!("IDEMHOOK_TEST_PG_URL: cannot connect: {e}"))?;
    Ok(cluster)
}

fn find_bin_dir() -> Option<PathBuf> {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v: u32 = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((v, bin))
        })
        .collect();
    versions.sort();
    if let Some((_, bin)) = versions.pop() {
        return Some(bin);
    }
    std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .find(|p| p.join("initdb").exists() && p.join("postgres").exists())
    })
}

fn is_root() -> bool {
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// The uid and gid of the `postgres` user, from /etc/passwd.
fn postgres_user() -> Option<(u32, u32)> {
    let passwd = std::fs::read_to_string(Path::new("/etc/passwd")).ok()?;
    passwd.lines().find_map(|line| {
        let f: Vec<&str> = line.split(':').collect();
        (f.first() == Some(&"postgres") && f.len() > 3)
            .then(|| Some((f[2].parse().ok()?, f[3].parse().ok()?)))
            .flatten()
    })
}
