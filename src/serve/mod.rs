//! `idemhook serve`: open and migrate the database, run `setup_sql`, check
//! the SQL actions, record the key rules, start the writer, the forward workers and
//! the HTTP server, and stop them in order on SIGTERM or SIGINT.

use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result, anyhow, bail};

use crate::config::database_url::{DatabaseUrl, PostgresUrl};
use crate::config::{ActionKind, Config, format_duration};
use crate::http::HttpServer;
use crate::http::app::App;
use crate::metrics::Metrics;
use crate::store;
use crate::store::backend::Backend;
use crate::store::postgres::Settings;
use crate::store::postgres::backend::{Migrator, Postgres};
use crate::store::sqlite::{Opened, Sqlite};
use crate::time::now_ms;

/// `idemhook serve`: on the configured backend until SIGTERM or SIGINT.
/// The one place the backend is chosen: the storage opened and made ready
/// as its type, then [`launch`] runs it.
pub fn run(mut config: Config) -> Result<()> {
    // Info lines in batches while serving; dropped last, so every line is
    // out before run returns.
    let _log = crate::log::buffer_lines();
    crate::failpoint::warn_if_armed();
    let dev_default = config.file.is_none();
    let run_token = run_token(&mut config, dev_default);
    let start = Start {
        run_token: run_token.as_deref(),
        dev_default,
    };
    match config.database.clone() {
        DatabaseUrl::Sqlite(path) => {
            // Held while serving, so `migrate` refuses to copy under us.
            let (opened, _serving) = open_sqlite(&config, &path)?;
            let sqlite = Sqlite::start(opened, &path, config.durability, config.busy_timeout)
                .context("cannot start the writer")?;
            launch(Arc::new(config), sqlite, start, false)
        }
        DatabaseUrl::Postgres(url) => {
            let config = Arc::new(config);
            let (settings, migrator) = prepare_postgres(&config, &url)?;
            let migrating = migrator.is_some();
            let postgres = Postgres::start(config.clone(), &url, settings, migrator)
                .context("cannot start the claimers")?;
            launch(config, postgres, start, migrating)
        }
    }
}

/// What the start line and the stdout lines need beside the storage.
#[derive(Clone, Copy)]
struct Start<'a> {
    run_token: Option<&'a str>,
    dev_default: bool,
}

/// The development default on loopback gets an admin token for this run
/// (set in `config`), printed with the inspector's address for a
/// one-click sign-in.
fn run_token(config: &mut Config, dev_default: bool) -> Option<String> {
    let token = if dev_default && config.admin_token.is_none() && loopback_only(&config.listen) {
        crate::http::auth::random_token()
    } else {
        None
    };
    if let Some(token) = &token {
        config.admin_token = Some(crate::verify::Secret::new(token.clone()));
    }
    token
}

/// The SQLite file ready to serve: opened (created when new, said
/// loudly), `schema.sql` applied, refused when `migrate` moved it, its
/// shared lock taken (returned: held while serving, so `migrate` refuses
/// to copy under a running serve), `setup_sql` run, the SQL actions
/// prepared and the key rules recorded.
fn open_sqlite(config: &Config, path: &Path) -> Result<(Opened, std::fs::File)> {
    let new_database = !path.exists();
    let mut opened = Opened::open(path, config.durability, config.busy_timeout)
        .with_context(|| format!("cannot open the database {}", path.display()))?;
    opened.migrate().context("cannot apply schema.sql")?;
    if let Some(to) = store::meta::moved_to(&opened.db())? {
        bail!(
            "{}: migrate moved this installation to {to}: set database to that URL. (To serve this file anyway, which reopens the duplicate window for every event received there since: sqlite3 {} \"DELETE FROM meta WHERE key = 'moved_to'\")",
            path.display(),
            path.display()
        );
    }
    let serving = crate::ops::migrate::lock_shared(path)?;
    if new_database {
        let path = std::path::absolute(path).unwrap_or(path.to_path_buf());
        new_database_notice(&path.display());
    }
    if let Some(sql) = &config.setup_sql {
        opened.run(sql).context("setup_sql failed")?;
    }
    crate::store::sqlite::prepare_actions(&opened, &config.sources).map_err(|e| anyhow!(e))?;
    record_key_rules(&opened.db(), config)?;
    Ok((opened, serving))
}

/// What every backend runs alike: the forward workers, the `App`, the
/// pruner and the HTTP server started, the start announced; on SIGTERM or
/// SIGINT the `stopping` line, then the stop in order (HTTP, pruner,
/// forward attempts in flight, the storage). `migrating`: the database
/// refused writes at start, so what it keeps may not be there yet.
fn launch<B: Backend>(
    config: Arc<Config>,
    backend: B,
    start: Start<'_>,
    migrating: bool,
) -> Result<()> {
    let backend = Arc::new(backend);
    let metrics = Arc::new(Metrics::new(&config));
    let outbox = crate::outbox::Outbox::start(config.clone(), backend.clone(), metrics.clone())
        .context("cannot start the forward workers")?;
    {
        let waker = outbox.waker();
        backend.listen(move || waker.wake());
    }
    let waker = outbox.waker();
    let app = Arc::new(App {
        config: config.clone(),
        backend: backend.clone(),
        metrics,
        wake_outbox: Box::new(move || waker.wake()),
        admin_limiter: Default::default(),
        ui_sign_ins: Default::default(),
        overview_cache: Default::default(),
        readiness: Default::default(),
    });
    if let Err(e) = app.learn_handshake_secrets()
        && !migrating
    {
        return Err(anyhow!(e)).context("cannot read the secrets kept from handshakes");
    }
    let pruner = crate::ops::prune::Background::start(config.clone(), backend.clone());
    let catchup = {
        let app = app.clone();
        crate::catchup::Background::start(
            config.clone(),
            backend.clone(),
            Box::new(move |report| {
                app.metrics.catchup.add(
                    &report.source,
                    [
                        report.claimed.len(),
                        report.redelivery_requested.len(),
                        report.already_stored,
                    ],
                );
                if !report.claimed.is_empty() {
                    (app.wake_outbox)();
                }
            }),
        )
    };
    let notifier =
        crate::notify::Notifier::start(config.clone(), backend.clone(), app.metrics.clone())
            .context("cannot start the notifier")?;
    let http = HttpServer::start(app.clone()).map_err(|e| anyhow!(e))?;
    let mut signals = stop_signals()?;
    announce_start(&config, &http, &backend.describe(), start);
    let _ = signals.forever().next();
    announce_stopping(&config, &outbox);
    catchup.stop();
    if let Some(notifier) = notifier {
        notifier.stop();
    }
    stop(&config, http, pruner, outbox, app, backend);
    Ok(())
}

/// Stops a `serve` in order: the HTTP server (requests under way get
/// their grace), the pruner after its batch, the forward attempts in
/// flight (each up to its timeout), then the storage after its last
/// commits. On a server that can hang (PostgreSQL: stopped processes, or
/// a peer whose kernel still acknowledges) a claimer, a worker or the
/// listener can sit inside a call no timeout of ours ends; the stop then
/// waits only as long as a live server could need (`Backend::stop_bound`)
/// and exits as a crash would: nothing uncommitted was answered 2xx, and a
/// cut-short attempt is taken over after its lease.
fn stop<B: Backend>(
    config: &Config,
    http: HttpServer,
    pruner: crate::ops::prune::Background,
    outbox: crate::outbox::Outbox,
    app: Arc<App<B>>,
    backend: Arc<B>,
) {
    let longest = longest_forward_timeout(config);
    let bound = backend
        .stop_bound()
        .map(|b| crate::http::STOP_GRACE + longest.unwrap_or_default() + b);
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        http.stop();
        pruner.stop();
        let in_flight = outbox.in_flight();
        if in_flight > 0 {
            crate::log::info(
                "waiting for forward attempts in flight",
                &[
                    ("forward_in_flight", &in_flight),
                    ("up_to", &longest.map_or("-".into(), format_duration)),
                ],
            );
        }
        outbox.stop();
        drop(app);
        backend.stop();
        let _ = done_tx.send(());
    });
    let stopped = match bound {
        Some(bound) => done_rx.recv_timeout(bound).map_err(|_| bound),
        None => done_rx.recv().map_err(|_| std::time::Duration::ZERO),
    };
    match stopped {
        Ok(()) => crate::log::info("stopped", &[]),
        Err(waited) => crate::log::warn(
            "stopped without waiting for PostgreSQL",
            &[("waited", &format_duration(waited))],
        ),
    }
}

/// The PostgreSQL database made ready (`store::postgres::backend::prepare`: migrations,
/// `setup_sql`, the SQL actions) and the key rules recorded. A host that
/// answers but refuses writes (a standby, a failover under way) does not
/// stop serve: serve starts with a migrator that tries again every 2 s,
/// answers 503 until a writable host answers, and migrates then.
fn prepare_postgres(
    config: &Arc<Config>,
    url: &PostgresUrl,
) -> Result<(Settings, Option<Migrator>)> {
    match crate::store::postgres::backend::prepare(config, url) {
        Ok((settings, created)) => {
            if created {
                new_database_notice(&format!("{url} (schema {})", url.schema()));
            }
            record_key_rules_postgres(&settings, config)?;
            Ok((settings, None))
        }
        Err(e)
            if e.contains("(25006)")
                || e.contains("read-only")
                || e.contains("does not allow writes") =>
        {
            crate::log::warn(
                "database refuses writes",
                &[
                    ("error", &e),
                    (
                        "effect",
                        &"deliveries are answered 503 until a host that accepts writes answers; serve migrates then",
                    ),
                ],
            );
            let settings = Settings::from_url(url, config.durability, config.busy_timeout)
                .map_err(|e| anyhow!(e))?;
            Ok((settings, Some(migrate_when_writable(config, url.clone()))))
        }
        Err(e) => Err(anyhow!(e)),
    }
}

/// Loud: a mistyped `database` starts an empty database, and every event
/// the providers send again would be processed again.
fn new_database_notice(database: &dyn std::fmt::Display) {
    crate::log::warn(
        "NEW DATABASE created",
        &[
            ("database", &database),
            (
                "note",
                &"no event is stored yet, so none is recognised as a duplicate: if this installation has history, stop and correct `database`",
            ),
        ],
    );
}

/// What serve says once it accepts connections, alike on both backends:
/// the config's warnings, an admin API that is off and why, the `started`
/// log line; then on stdout the admin address, the inspector's, and
/// "listening on" last (written without print!: a closed stdout must not
/// stop a running server).
fn announce_start(config: &Config, http: &HttpServer, database: &str, start: Start<'_>) {
    let Start {
        run_token,
        dev_default,
    } = start;
    for warning in &config.warnings {
        crate::log::warn("config", &[("warning", warning)]);
    }
    if let Some(name) = &config.admin_token_unset {
        crate::log::warn(
            "admin API off",
            &[(
                "reason",
                &format!("admin_token names {name}, which is not set"),
            )],
        );
    }
    let mode = match config.durability {
        crate::config::Durability::Full => "full",
        crate::config::Durability::Normal => "normal",
    };
    crate::log::info(
        "started",
        &[
            ("listen", &http.addr),
            ("database", &database),
            ("durability", &mode),
            ("sources", &config.sources.len()),
        ],
    );
    let scheme = if config.tls.is_some() {
        "https"
    } else {
        "http"
    };
    let mut lines = String::new();
    if let Some(admin) = http.admin_addr {
        let _ = writeln!(
            lines,
            "idemhook admin API and metrics on {scheme}://{admin}"
        );
    }
    if config.admin_token.is_some() {
        let at = http.admin_addr.unwrap_or(http.addr);
        let _ = match run_token {
            Some(token) => writeln!(
                lines,
                "idemhook inspector on {scheme}://{at}/ui/#token={token} (a token for this run only)"
            ),
            None => writeln!(lines, "idemhook inspector on {scheme}://{at}/ui/"),
        };
    }
    let _ = writeln!(lines, "idemhook listening on {scheme}://{}", http.addr);
    if dev_default {
        let _ = writeln!(
            lines,
            "no config file found: running the development default (database {database}, one source \"demo\" of kind standard)"
        );
        let _ = writeln!(
            lines,
            "try it:  idemhook send demo --url http://{}/hooks/demo",
            http.addr
        );
    }
    use std::io::Write as _;
    let mut stdout = std::io::stdout().lock();
    let _ = stdout.write_all(lines.as_bytes());
    let _ = stdout.flush();
}

/// The `stopping` line: what the stop waits for, requests under way (up
/// to the HTTP grace), then the forward attempts in flight, each up to
/// its timeout.
fn announce_stopping(config: &Config, outbox: &crate::outbox::Outbox) {
    let longest = longest_forward_timeout(config);
    crate::log::info(
        "stopping",
        &[
            ("reason", &"signal"),
            ("requests_grace", &format_duration(crate::http::STOP_GRACE)),
            ("forward_in_flight", &outbox.in_flight()),
            (
                "forward_timeout_max",
                &longest.map_or("-".into(), format_duration),
            ),
        ],
    );
}

/// Serve started on a database that refused writes: every 2 s, the
/// migrations and the key-rule record again, until they go through (a
/// writable host answered) or serve stops (`waiting` cleared).
fn migrate_when_writable(config: &Arc<Config>, url: PostgresUrl) -> Migrator {
    let waiting = Arc::new(AtomicBool::new(true));
    let config = config.clone();
    let flag = waiting.clone();
    let thread = std::thread::spawn(move || {
        while flag.load(Ordering::SeqCst) {
            let slept = std::time::Instant::now();
            while slept.elapsed() < std::time::Duration::from_secs(2) {
                if !flag.load(Ordering::SeqCst) {
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            if let Ok((settings, created)) = crate::store::postgres::backend::prepare(&config, &url)
            {
                if created {
                    new_database_notice(&format!("{url} (schema {})", url.schema()));
                }
                let _ = record_key_rules_postgres(&settings, &config);
                crate::log::info(
                    "database accepts writes",
                    &[("effect", &"migrated; deliveries are accepted")],
                );
                flag.store(false, Ordering::SeqCst);
                return;
            }
        }
    });
    Migrator { waiting, thread }
}

/// The longest `timeout` of any forward action: how long the stop may wait
/// for an attempt in flight. None when nothing forwards.
fn longest_forward_timeout(config: &Config) -> Option<std::time::Duration> {
    config
        .sources
        .iter()
        .flat_map(|s| &s.actions)
        .filter_map(|a| match &a.kind {
            ActionKind::Forward(f) => Some(f.timeout),
            ActionKind::Sql { .. } => None,
        })
        .max()
}

/// Whether every address `listen` names is a loopback one.
fn loopback_only(listen: &str) -> bool {
    use std::net::ToSocketAddrs;
    listen
        .to_socket_addrs()
        .map(|addrs| {
            let addrs: Vec<_> = addrs.collect();
            !addrs.is_empty() && addrs.iter().all(|a| a.ip().is_loopback())
        })
        .unwrap_or(false)
}

/// SIGTERM and SIGINT, caught from before serve says it listens: a stop
/// asked for as soon as "listening on" is read is a graceful one.
fn stop_signals() -> Result<signal_hook::iterator::Signals> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    signal_hook::iterator::Signals::new([SIGTERM, SIGINT]).context("cannot install signal handlers")
}

/// Records each source's key rule in PostgreSQL (see [`record_key_rules`]).
fn record_key_rules_postgres(settings: &Settings, config: &Config) -> Result<()> {
    let mut client = settings
        .connect()
        .context("cannot connect to record the key rules")?;
    record_key_rules(&store::db::Db::postgres(&mut client), config)
}

/// Records each source's key rule and hash rule. A changed rule for a
/// source that already has events is warned about loudly: events stored
/// under the old rule will not be recognised as duplicates of deliveries
/// keyed by the new one.
fn record_key_rules(db: &store::db::Db<'_>, config: &Config) -> Result<()> {
    for source in &config.sources {
        let rule = source.key.to_string();
        let hash_rule = source.hash_rule();
        let recorded = store::rules::recorded(db, &source.name)?;
        if let Some((old_rule, old_hash, has_events)) = &recorded {
            if old_rule != &rule && *has_events {
                crate::log::warn(
                    "KEY RULE CHANGED",
                    &[
                        ("source", &source.name),
                        ("was", old_rule),
                        ("now", &rule),
                        (
                            "risk",
                            &"events stored under the old rule will not match redeliveries keyed by the new one: old events could be processed again",
                        ),
                    ],
                );
            }
            if old_hash != &hash_rule && *has_events {
                crate::log::warn(
                    "hash rule changed",
                    &[
                        ("source", &source.name),
                        ("was", old_hash),
                        ("now", &hash_rule),
                        (
                            "risk",
                            &"redeliveries of stored events will be reported as payload mismatches",
                        ),
                    ],
                );
            }
        }
        let unchanged = recorded
            .as_ref()
            .is_some_and(|(k, h, _)| k == &rule && h == &hash_rule);
        if !unchanged {
            store::rules::record(db, &source.name, &rule, &hash_rule, now_ms())?;
        }
    }
    Ok(())
}

/// `check`'s tests of what `serve` would refuse at start: a database whose
/// folder does not exist, and the SQL actions, which `serve` prepares
/// against an empty database with idemhook's schema and `setup_sql`, and,
/// if that fails, against the configured database as it is (read-only;
/// its tables may come from elsewhere). Changes nothing on disk.
pub fn trial(config: &Config) -> Result<(), String> {
    let path = match &config.database {
        DatabaseUrl::Postgres(url) => return crate::store::postgres::backend::trial(config, url),
        DatabaseUrl::Sqlite(path) => path,
    };
    if let Some(dir) = store::sqlite::missing_folder(path) {
        return Err(format!(
            "database {}: the folder {} does not exist (serve never creates folders: create it, or correct `database`)",
            path.display(),
            dir.display()
        ));
    }
    let has_sql = config
        .sources
        .iter()
        .flat_map(|s| &s.actions)
        .any(|a| matches!(a.kind, ActionKind::Sql { .. }));
    if !has_sql {
        return Ok(());
    }
    crate::store::sqlite::trial(config, path)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::config::Config;

    fn with_sql(sql: &str, setup: Option<&str>, database: &Path) -> Config {
        let setup = setup.map_or(String::new(), |s| format!("setup_sql = \"{s}\"\n"));
        Config::parse(
            &format!(
                "database = \"{}\"\n{setup}[sources.st]\nkind = \"stripe\"\nsecrets = [\"s\"]\n\
                 [[sources.st.actions]]\nname = \"book\"\nsql = \"{sql}\"\n",
                database.display()
            ),
            "test.toml",
            Path::new("/tmp"),
            Some("test.toml".into()),
        )
        .expect("config")
    }

    /// What serve would refuse at start, check refuses too, without
    /// writing anything.
    #[test]
    fn check_prepares_the_sql_actions() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = dir.path().join("none.db");
        let insert = "INSERT INTO ledgr (id) VALUES (:event_id)";
        let e = super::trial(&with_sql(insert, None, &db)).unwrap_err();
        assert!(e.contains("no such table: ledgr"), "{e}");
        assert!(!db.exists(), "check created the database");
        // setup_sql makes the table: fine.
        let setup = "CREATE TABLE ledgr (id TEXT)";
        assert_eq!(super::trial(&with_sql(insert, Some(setup), &db)), Ok(()));
        // The table exists only in the configured database: fine too.
        let existing = dir.path().join("existing.db");
        rusqlite::Connection::open(&existing)
            .and_then(|c| c.execute_batch(setup))
            .expect("a database with the table");
        assert_eq!(super::trial(&with_sql(insert, None, &existing)), Ok(()));
    }
}
