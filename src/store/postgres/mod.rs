//! PostgreSQL: connection settings from the `database` URL (TLS, timeouts,
//! durability), the numbered migrations under `migrations/postgres/`
//! applied under an advisory lock, and classifying the server's errors
//! into `StoreErrorKind`. Nothing here knows HTTP or the claim.
//!
//! TLS: `sslmode=disable` and `prefer` (the default) connect without TLS;
//! `require`, `verify-ca` and `verify-full` require TLS and verify the
//! server's certificate chain and host name, against the public roots or
//! the CA file named by `sslrootcert=PATH`. (libpq's `require` encrypts
//! without verifying; idemhook does not offer an unverified connection.)

pub mod backend;
pub mod copy;
pub mod db;
mod grant;
pub mod group;
pub mod maint;
mod pass;
pub mod tx;

use std::sync::Arc;
use std::time::Duration;

use postgres::error::SqlState;
use postgres::{Client, NoTls};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::config::Durability;
use crate::config::database_url::PostgresUrl;
use crate::store::{StoreError, StoreErrorKind};

/// The numbered migrations, in order: (version, name, SQL). A migration
/// is never edited once released; a change is a new file.
pub const MIGRATIONS: &[(i32, &str, &str)] = &[
    (
        1,
        "init",
        include_str!("../../../migrations/postgres/0001_init.sql"),
    ),
    (
        2,
        "delivery control",
        include_str!("../../../migrations/postgres/0002_delivery_control.sql"),
    ),
    (
        3,
        "bytewise keys",
        include_str!("../../../migrations/postgres/0003_bytewise_keys.sql"),
    ),
    (
        4,
        "job counters",
        include_str!("../../../migrations/postgres/0004_job_counters.sql"),
    ),
    (
        5,
        "partial job indexes",
        include_str!("../../../migrations/postgres/0005_partial_job_indexes.sql"),
    ),
    (
        6,
        "circuits",
        include_str!("../../../migrations/postgres/0006_circuits.sql"),
    ),
    (
        7,
        "notifications",
        include_str!("../../../migrations/postgres/0007_notifications.sql"),
    ),
    (
        8,
        "rejected",
        include_str!("../../../migrations/postgres/0008_rejected.sql"),
    ),
    (
        9,
        "catchup",
        include_str!("../../../migrations/postgres/0009_catchup.sql"),
    ),
];

/// Moves the appended job-count changes into their base rows, in one
/// transaction (a reader sees the counts before or after, never half). Any
/// instance may run it at any time; two at once take turns on the rows.
pub const FOLD_JOB_COUNTS: &str =
    "WITH moved AS (DELETE FROM job_count_deltas RETURNING status, delta)
     INSERT INTO job_count_base (status, n)
     SELECT status, sum(delta)::bigint FROM moved GROUP BY status
     ON CONFLICT (status) DO UPDATE SET n = job_count_base.n + excluded.n";

/// idemhook's tables, as the migrations make them: moved together when an
/// installation from before the schema of its own is found elsewhere.
const TABLES: &[&str] = &[
    "idemhook_migrations",
    "meta",
    "source_rules",
    "events",
    "jobs",
    "job_counts",
    "job_count_base",
    "job_count_deltas",
    "attempts",
    "checks",
    "deliveries",
    "incidents",
    "incident_payloads",
    "paused_actions",
    "replays",
    "action_limits",
    "order_marks",
    "rejected",
    "rejected_totals",
    "catchup_runs",
    "circuits",
    "notifications",
];

/// The key of the advisory lock held while migrating, so instances that
/// start at once migrate one after another ("idemhook" in ASCII).
pub const MIGRATION_LOCK: i64 = 0x6964_656d_686f_6f6b;

/// How to reach the server: the driver's settings and the TLS to use.
#[derive(Clone)]
pub struct Settings {
    pub config: postgres::Config,
    pub tls: Tls,
    /// The schema of idemhook's tables (`pg_schema`), a plain name.
    pub schema: String,
}

/// The TLS a connection uses, from `sslmode`.
#[derive(Clone)]
pub enum Tls {
    Plain,
    Verified(MakeRustlsConnect),
}

/// What the URL may say that the driver does not parse itself.
const OWN_PARAMS: &[&str] = &["sslmode", "sslrootcert"];

impl Settings {
    /// Settings from the URL. A statement or a connection attempt that
    /// takes longer than `busy_timeout` fails (and the caller answers
    /// 503); `durability` sets `synchronous_commit`.
    pub fn from_url(
        url: &PostgresUrl,
        durability: Durability,
        busy_timeout: Duration,
    ) -> Result<Settings, String> {
        let (rest, own) = split_own_params(url.expose());
        let mut config: postgres::Config = rest
            .parse()
            .map_err(|e| format!("{url}: {}", with_cause(&e)))?;
        pass::fill(&mut config);
        let sslmode = own
            .iter()
            .find(|(k, _)| k == "sslmode")
            .map_or("prefer", |(_, v)| v.as_str());
        let rootcert = own
            .iter()
            .find(|(k, _)| k == "sslrootcert")
            .map(|(_, v)| v.clone());
        let tls = match sslmode {
            "disable" | "prefer" | "allow" => {
                config.ssl_mode(postgres::config::SslMode::Disable);
                Tls::Plain
            }
            "require" | "verify-ca" | "verify-full" => {
                config.ssl_mode(postgres::config::SslMode::Require);
                Tls::Verified(
                    tls_connector(rootcert.as_deref()).map_err(|e| format!("{url}: {e}"))?,
                )
            }
            other => {
                return Err(format!(
                    "{url}: sslmode={other} is not one of disable, prefer, require, verify-ca, verify-full"
                ));
            }
        };
        // With several hosts, the one that accepts writes (as libpq's
        // target_session_attrs=read-write), unless the URL says otherwise.
        if config.get_hosts().len() > 1 && !url.expose().contains("target_session_attrs") {
            config.target_session_attrs(postgres::config::TargetSessionAttrs::ReadWrite);
        }
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(busy_timeout.max(Duration::from_secs(1)));
        }
        // A hung server (a stopped process, a dead peer) shows as unacked
        // data; without this a write to it could wait for minutes.
        if config.get_tcp_user_timeout().is_none() {
            config.tcp_user_timeout(busy_timeout.max(Duration::from_secs(1)));
        }
        config.keepalives(true);
        if config.get_application_name().is_none() {
            config.application_name("idemhook");
        }
        let sync = match durability {
            Durability::Full => "on",
            Durability::Normal => "off",
        };
        let timeout_ms = busy_timeout.as_millis().max(1);
        let ours = format!(
            "-c synchronous_commit={sync} -c statement_timeout={timeout_ms} \
             -c lock_timeout={timeout_ms} -c idle_in_transaction_session_timeout={}",
            timeout_ms.saturating_mul(4).max(10_000)
        );
        let options = match config.get_options() {
            Some(theirs) if !theirs.is_empty() => format!("{theirs} {ours}"),
            _ => ours,
        };
        config.options(&options);
        Ok(Settings {
            config,
            tls,
            schema: url.schema().to_string(),
        })
    }

    /// Opens one connection, its statements resolved in idemhook's schema.
    pub fn connect(&self) -> Result<Client, StoreError> {
        let mut client = match &self.tls {
            Tls::Plain => self.config.connect(NoTls),
            Tls::Verified(tls) => self.config.connect(tls.clone()),
        }?;
        client.batch_execute(&self.session_sql())?;
        Ok(client)
    }

    /// What a new connection runs first: idemhook's statements name its
    /// tables unqualified, so the session's `search_path` is idemhook's
    /// schema alone (set after login, so `SET search_path TO DEFAULT`
    /// still gives the team's usual one, for SQL actions and `setup_sql`:
    /// see [`TEAM_PATH`]). The schema is also kept in `idemhook.schema`,
    /// which [`OUR_PATH`] reads back.
    pub fn session_sql(&self) -> String {
        format!(
            "SET search_path TO \"{s}\"; SET idemhook.schema TO '{s}'",
            s = self.schema
        )
    }
}

/// Switches the transaction to the team's usual `search_path` (the role's,
/// the database's or the server's), where SQL actions and `setup_sql` run,
/// less idemhook's own schema: a role named like it (`idemhook`, as the
/// docs suggest) would otherwise find it through `"$user"`, and the team's
/// `CREATE TABLE orders` or `INSERT INTO events` would land among
/// idemhook's tables. With no schema of the team's left, creating a table
/// fails as it should ("no schema has been selected").
pub const TEAM_PATH: &str = "SET LOCAL search_path TO DEFAULT; \
     SELECT set_config('search_path', coalesce((SELECT string_agg(quote_ident(s), ', ') \
       FROM unnest(current_schemas(false)) AS s \
       WHERE s <> current_setting('idemhook.schema')), ''), true)";

/// Switches the transaction back to idemhook's schema.
pub const OUR_PATH: &str =
    "SELECT set_config('search_path', quote_ident(current_setting('idemhook.schema')), true)";

/// Runs [`Settings::session_sql`] on every connection a pool opens.
#[derive(Debug)]
pub struct SessionSetup(pub String);

impl r2d2::CustomizeConnection<Client, postgres::Error> for SessionSetup {
    fn on_acquire(&self, conn: &mut Client) -> Result<(), postgres::Error> {
        conn.batch_execute(&self.0)
    }
}

/// Removes the parameters idemhook reads itself from the query string.
fn split_own_params(url: &str) -> (String, Vec<(String, String)>) {
    let Some((head, query)) = url.split_once('?') else {
        return (url.to_string(), Vec::new());
    };
    let mut own = Vec::new();
    let mut kept = Vec::new();
    for part in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = part.split_once('=').unwrap_or((part, ""));
        if OWN_PARAMS.contains(&k) {
            own.push((
                k.to_string(),
                percent_encoding::percent_decode_str(v)
                    .decode_utf8_lossy()
                    .into_owned(),
            ));
        } else {
            kept.push(part);
        }
    }
    if kept.is_empty() {
        (head.to_string(), own)
    } else {
        (format!("{head}?{}", kept.join("&")), own)
    }
}

/// rustls with the ring provider, verifying against the public roots, or
/// only against the PEM CA file `rootcert` when one is named.
fn tls_connector(rootcert: Option<&str>) -> Result<MakeRustlsConnect, String> {
    let mut roots = rustls::RootCertStore::empty();
    match rootcert {
        Some(path) => {
            let mut n = 0;
            for cert in CertificateDer::pem_file_iter(path)
                .map_err(|e| format!("sslrootcert {path}: {e}"))?
            {
                let cert = cert.map_err(|e| format!("sslrootcert {path}: {e}"))?;
                roots
                    .add(cert)
                    .map_err(|e| format!("sslrootcert {path}: {e}"))?;
                n += 1;
            }
            if n == 0 {
                return Err(format!("sslrootcert {path}: no certificate in the file"));
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(MakeRustlsConnect::new(config))
}

/// Applies every migration newer than the database's version, each in the
/// transaction that records it, all under the migration advisory lock. A
/// database of a newer version than this build is refused.
pub fn migrate(client: &mut Client, schema: &str) -> Result<(), StoreError> {
    let mut tx = client.transaction()?;
    migrate_in(&mut tx, schema)?;
    tx.commit()?;
    Ok(())
}

/// [`migrate`] inside a transaction the caller ends: `check` rolls it
/// back after preparing the SQL actions against the result.
/// True when it made idemhook's tables (the database held none).
pub fn migrate_in(tx: &mut postgres::Transaction<'_>, schema: &str) -> Result<bool, StoreError> {
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])?;
    // `schema` is a plain name (config::database_url::valid_schema).
    grant::create_schema(tx, schema)?;
    move_into_own_schema(tx, schema)?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS idemhook_migrations (
             version    integer PRIMARY KEY,
             name       text NOT NULL,
             applied_at bigint NOT NULL
         )",
    )?;
    let current: i32 = tx
        .query_one(
            "SELECT COALESCE(MAX(version), 0) FROM idemhook_migrations",
            &[],
        )?
        .get(0);
    let latest = MIGRATIONS.last().map_or(0, |m| m.0);
    if current > latest {
        return Err(StoreError::other(format!(
            "the database has schema version {current}, newer than this idemhook's {latest}: \
             refusing to downgrade; run the newer idemhook"
        )));
    }
    for (version, name, sql) in MIGRATIONS.iter().filter(|m| m.0 > current) {
        tx.batch_execute(sql).map_err(|e| {
            StoreError::other(format!(
                "migration {version} ({name}): {}",
                StoreError::from(e)
            ))
        })?;
        tx.execute(
            "INSERT INTO idemhook_migrations (version, name, applied_at) VALUES ($1, $2, $3)",
            &[version, name, &crate::time::now_ms()],
        )?;
    }
    Ok(current == 0)
}

/// An installation from before idemhook had a schema of its own keeps its
/// tables where the connection's search_path put them (`public`, mostly):
/// they move into `schema`, with their indexes, sequences and trigger
/// functions, in the migration's transaction. Where the tables sit in
/// several schemas besides, the choice is the operator's.
fn move_into_own_schema(
    tx: &mut postgres::Transaction<'_>,
    schema: &str,
) -> Result<(), StoreError> {
    let found = tx.query(
        "SELECT n.nspname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE c.relname = 'idemhook_migrations' AND c.relkind = 'r'",
        &[],
    )?;
    let places: Vec<String> = found.iter().map(|r| r.get(0)).collect();
    if places.iter().any(|p| p == schema) {
        return Ok(());
    }
    let old = match places.as_slice() {
        [] => return Ok(()),
        [one] => one,
        several => {
            return Err(StoreError::other(format!(
                "idemhook's tables are in several schemas ({}): move the one in use into \"{schema}\" \
                 (ALTER TABLE ... SET SCHEMA) or name it with pg_schema",
                several.join(", ")
            )));
        }
    };
    let quoted = |n: &str| format!("\"{}\"", n.replace('"', "\"\""));
    let tables: Vec<String> = tx
        .query(
            "SELECT c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = $1 AND c.relkind IN ('r', 'v') AND c.relname = ANY($2)",
            &[old, &TABLES],
        )?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let functions: Vec<String> = tx
        .query(
            "SELECT p.oid::regprocedure::text FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
             WHERE n.nspname = $1 AND p.proname LIKE 'idemhook\\_%'",
            &[old],
        )?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut sql = String::new();
    for t in &tables {
        sql.push_str(&format!(
            "ALTER TABLE {}.{} SET SCHEMA \"{schema}\";\n",
            quoted(old),
            quoted(t)
        ));
    }
    for f in &functions {
        // regprocedure's text is already qualified where it needs to be.
        sql.push_str(&format!("ALTER FUNCTION {f} SET SCHEMA \"{schema}\";\n"));
    }
    tx.batch_execute(&sql)?;
    Ok(())
}

impl From<postgres::Error> for StoreError {
    fn from(e: postgres::Error) -> StoreError {
        let kind = match e.code() {
            Some(code) => kind_of(code),
            // No SQLSTATE: a value that does not convert is the caller's
            // bug; anything else is the connection (refused, reset, timed
            // out, closed, the server went away), which is transient.
            None if is_conversion(&e) => StoreErrorKind::Other,
            None => StoreErrorKind::Io,
        };
        let message = match e.as_db_error() {
            // PostgreSQL 15 took CREATE on `public` from other roles.
            Some(db)
                if *db.code() == SqlState::INSUFFICIENT_PRIVILEGE
                    && db.message().contains("schema") =>
            {
                format!(
                    "postgres: {} ({}): the role needs to own the database (CREATE DATABASE app OWNER idemhook) or GRANT USAGE, CREATE ON SCHEMA public TO idemhook",
                    db.message(),
                    db.code().code()
                )
            }
            Some(db) => format!("postgres: {} ({})", db.message(), db.code().code()),
            None => format!("postgres: {}", with_cause(&e)),
        };
        StoreError { kind, message }
    }
}

/// The driver's words with their cause: alone they name only the kind
/// ("error connecting to server", "invalid connection string"); the cause
/// (refused, no such host, timed out, TLS, an unknown parameter by name)
/// is the source.
fn with_cause(e: &postgres::Error) -> String {
    let text = match std::error::Error::source(e) {
        Some(cause) => format!("{e}: {cause}"),
        None => e.to_string(),
    };
    if text.ends_with("password missing") {
        return format!(
            "{text}: the server asks for a password; put it in the URL, in PGPASSWORD or in ~/.pgpass"
        );
    }
    text
}

/// A client-side conversion failure (binding a parameter, reading a
/// column), told from connection failures by the driver's words.
fn is_conversion(e: &postgres::Error) -> bool {
    let text = e.to_string();
    [
        "error serializing parameter",
        "error deserializing column",
        "invalid column",
        "query returned an unexpected number of rows",
        "invalid configuration",
    ]
    .iter()
    .any(|p| text.starts_with(p))
}

/// What a SQLSTATE means for the caller.
fn kind_of(code: &SqlState) -> StoreErrorKind {
    let c = code.code();
    if *code == SqlState::T_R_DEADLOCK_DETECTED
        || *code == SqlState::T_R_SERIALIZATION_FAILURE
        || *code == SqlState::LOCK_NOT_AVAILABLE
        || *code == SqlState::QUERY_CANCELED
    {
        StoreErrorKind::Busy
    } else if *code == SqlState::DISK_FULL || *code == SqlState::OUT_OF_MEMORY {
        StoreErrorKind::Full
    } else if *code == SqlState::READ_ONLY_SQL_TRANSACTION {
        StoreErrorKind::ReadOnly
    } else if c.starts_with("08") || c.starts_with("57P") || c.starts_with("53") || c == "58030" {
        // Connection exceptions, the server shutting down or not yet
        // accepting connections, insufficient resources, an I/O error.
        StoreErrorKind::Io
    } else {
        StoreErrorKind::Other
    }
}

/// Whether the whole transaction should simply be run again (a deadlock or
/// a serialization failure: nothing of it was committed).
pub fn is_retryable(e: &postgres::Error) -> bool {
    e.code().is_some_and(|c| {
        *c == SqlState::T_R_DEADLOCK_DETECTED || *c == SqlState::T_R_SERIALIZATION_FAILURE
    })
}

/// Whether a transaction failed only because another one ran at the same
/// time (a deadlock or a serialization failure): nothing of it was
/// committed and it may simply run again.
pub fn is_retryable_store(e: &StoreError) -> bool {
    e.kind == StoreErrorKind::Busy
        && (e.message.contains("(40P01)") || e.message.contains("(40001)"))
}

/// The pause before a write transaction runs again (`store::db::pg_write`,
/// a worker's `Session`): 1 to 19 ms, whichever retry it is.
pub fn short_pause(_retry: u32) -> Duration {
    Duration::from_millis(fastrand::u64(1..20))
}

/// The one retry loop of PostgreSQL transactions: runs `attempt` (a whole
/// transaction: BEGIN ... COMMIT, rolled back when it fails) until it
/// succeeds, fails with an error `retryable` refuses, or has been run
/// again `retries` times; before run again number n (from 1) it sleeps
/// `pause(n)`, so that the two sides of a deadlock do not meet again at
/// once. Returns the last error. A deadlock (40P01) or a serialization
/// failure (40001) is what callers retry: nothing of it was committed.
pub fn retrying<T, E>(
    retries: u32,
    pause: impl Fn(u32) -> Duration,
    retryable: impl Fn(&E) -> bool,
    mut attempt: impl FnMut() -> Result<T, E>,
) -> Result<T, E> {
    let mut retry = 0;
    loop {
        match attempt() {
            Ok(v) => return Ok(v),
            Err(e) if retry < retries && retryable(&e) => {
                retry += 1;
                std::thread::sleep(pause(retry));
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::database_url::DatabaseUrl;
    use std::path::Path;

    fn settings(url: &str) -> Result<Settings, String> {
        let DatabaseUrl::Postgres(url) = DatabaseUrl::parse(url, Path::new("/")).unwrap() else {
            panic!("{url} is not a PostgreSQL URL")
        };
        Settings::from_url(&url, Durability::Full, Duration::from_secs(5))
    }

    #[test]
    fn sslmode_and_rootcert_are_read_here_and_not_passed_on() {
        let (rest, own) = split_own_params(
            "postgres://u@h/d?sslmode=require&application_name=x&sslrootcert=%2Fetc%2Fca.pem",
        );
        assert_eq!(rest, "postgres://u@h/d?application_name=x");
        assert_eq!(
            own,
            vec![
                ("sslmode".to_string(), "require".to_string()),
                ("sslrootcert".to_string(), "/etc/ca.pem".to_string())
            ]
        );
        assert!(matches!(
            settings("postgres://u@h/d").unwrap().tls,
            Tls::Plain
        ));
        assert!(matches!(
            settings("postgres://u@h/d?sslmode=require").unwrap().tls,
            Tls::Verified(_)
        ));
        let e = settings("postgres://u:pw@h/d?sslmode=sometimes")
            .err()
            .unwrap();
        assert!(e.contains("sslmode=sometimes"), "{e}");
        assert!(!e.contains("pw@"), "{e}");
        let e = settings("postgres://u@h/d?sslmode=require&sslrootcert=/nonexistent/ca.pem")
            .err()
            .unwrap();
        assert!(e.contains("sslrootcert /nonexistent/ca.pem"), "{e}");
    }

    #[test]
    fn timeouts_and_durability_become_session_settings() {
        let s = settings("postgres://u@h/d?options=-c%20search_path%3Dapp").unwrap();
        assert_eq!(
            s.config.get_connect_timeout(),
            Some(&Duration::from_secs(5))
        );
        let options = s.config.get_options().unwrap();
        assert!(options.starts_with("-c search_path=app "), "{options}");
        assert!(options.contains("synchronous_commit=on"), "{options}");
        assert!(options.contains("statement_timeout=5000"), "{options}");
        assert_eq!(s.config.get_application_name(), Some("idemhook"));
    }

    #[test]
    fn sqlstates_sort_into_kinds() {
        assert_eq!(
            kind_of(&SqlState::T_R_DEADLOCK_DETECTED),
            StoreErrorKind::Busy
        );
        assert_eq!(kind_of(&SqlState::QUERY_CANCELED), StoreErrorKind::Busy);
        assert_eq!(kind_of(&SqlState::ADMIN_SHUTDOWN), StoreErrorKind::Io);
        assert_eq!(kind_of(&SqlState::CANNOT_CONNECT_NOW), StoreErrorKind::Io);
        assert_eq!(kind_of(&SqlState::DISK_FULL), StoreErrorKind::Full);
        assert_eq!(kind_of(&SqlState::UNIQUE_VIOLATION), StoreErrorKind::Other);
    }

    // Against a real server (the shared test cluster).

    fn database(test: &str) -> Option<(Settings, String)> {
        let Some(cluster) = crate::store::pg_cluster::cluster() else {
            crate::store::pg_cluster::skipped(test);
            return None;
        };
        let url = cluster.create_database(test);
        Some((settings(&url).unwrap(), url))
    }

    #[test]
    fn job_counters_follow_inserts_updates_and_deletes_with_or_without_a_fold() {
        let Some((s, _)) = database("job_counters") else {
            return;
        };
        let mut c = s.connect().unwrap();
        migrate(&mut c, crate::config::database_url::DEFAULT_SCHEMA).unwrap();
        let counted = |c: &mut Client| -> Vec<(String, i64)> {
            c.query(
                "SELECT status, count(*) FROM jobs GROUP BY status ORDER BY status",
                &[],
            )
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect()
        };
        let kept = |c: &mut Client| -> Vec<(String, i64)> {
            c.query(
                "SELECT status, n FROM job_counts WHERE n <> 0 ORDER BY status",
                &[],
            )
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect()
        };
        c.batch_execute(
            "INSERT INTO jobs (source, event_id, action, kind, status, n_attempts, created_at, updated_at)
             SELECT 'pay', 'e' || i, 'a', 'forward', 'pending', 0, i, i FROM generate_series(1, 50) i",
        )
        .unwrap();
        assert_eq!(kept(&mut c), counted(&mut c));
        c.batch_execute(
            "UPDATE jobs SET status = 'processing' WHERE id % 3 = 0;
             UPDATE jobs SET next_attempt_at = 5 WHERE id % 2 = 0;",
        )
        .unwrap();
        c.batch_execute(FOLD_JOB_COUNTS).unwrap();
        assert_eq!(kept(&mut c), counted(&mut c));
        c.batch_execute(
            "UPDATE jobs SET status = 'done' WHERE status = 'processing' AND id % 2 = 0;
             DELETE FROM jobs WHERE id % 5 = 0;
             BEGIN; UPDATE jobs SET status = 'failed' WHERE id < 10; ROLLBACK;",
        )
        .unwrap();
        assert_eq!(kept(&mut c), counted(&mut c));
        c.batch_execute(FOLD_JOB_COUNTS).unwrap();
        c.batch_execute(FOLD_JOB_COUNTS).unwrap();
        assert_eq!(kept(&mut c), counted(&mut c));
        let deltas: i64 = c
            .query_one("SELECT count(*) FROM job_count_deltas", &[])
            .unwrap()
            .get(0);
        assert_eq!(deltas, 0, "folded");
    }

    #[test]
    fn migrations_run_once_even_when_instances_start_together() {
        let Some((s, _)) = database("migrations_once") else {
            return;
        };
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let s = s.clone();
                std::thread::spawn(move || {
                    let mut c = s.connect()?;
                    migrate(&mut c, crate::config::database_url::DEFAULT_SCHEMA)
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap().unwrap();
        }
        let mut c = s.connect().unwrap();
        migrate(&mut c, crate::config::database_url::DEFAULT_SCHEMA).unwrap();
        let versions: Vec<i32> = c
            .query(
                "SELECT version FROM idemhook_migrations ORDER BY version",
                &[],
            )
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert_eq!(versions, MIGRATIONS.iter().map(|m| m.0).collect::<Vec<_>>());
        let tables: i64 = c
            .query_one(
                "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'idemhook' \
                 AND table_name IN ('meta','source_rules','events','jobs','job_counts','attempts', \
                 'checks','deliveries','incidents','incident_payloads','paused_actions','replays')",
                &[],
            )
            .unwrap()
            .get(0);
        assert_eq!(tables, 12);

        // A database migrated by a newer idemhook is refused.
        c.execute(
            "INSERT INTO idemhook_migrations VALUES (999, 'future', 0)",
            &[],
        )
        .unwrap();
        let e = migrate(&mut c, crate::config::database_url::DEFAULT_SCHEMA).unwrap_err();
        assert!(e.message.contains("refusing to downgrade"), "{e}");
    }

    #[test]
    fn the_claim_insert_owns_exactly_once() {
        let Some((s, _)) = database("claim_once") else {
            return;
        };
        let mut c = s.connect().unwrap();
        migrate(&mut c, crate::config::database_url::DEFAULT_SCHEMA).unwrap();
        let claim = "INSERT INTO events (source, event_id, state, received_at, payload_hash) \
                     VALUES ($1, $2, 'accepted', $3, 'h') \
                     ON CONFLICT (source, event_id) DO NOTHING RETURNING received_at";
        let first = c.query(claim, &[&"a", &"e1", &1i64]).unwrap();
        let second = c.query(claim, &[&"a", &"e1", &2i64]).unwrap();
        assert_eq!(first.len(), 1);
        assert_eq!(second.len(), 0);
    }

    #[test]
    fn named_parameters_run_on_the_server_after_the_rewrite() {
        let Some((s, _)) = database("named_params") else {
            return;
        };
        let mut c = s.connect().unwrap();
        let p = crate::store::named::to_positional(
            "SELECT :a::int + 1, ':a', $$ :a $$, \"col\" FROM (SELECT :b::text AS \"col\") t -- :c",
        )
        .unwrap();
        assert_eq!(p.names, ["a", "b"]);
        let row = c
            .query_one(&p.sql, &[&41i32, &"x"])
            .unwrap_or_else(|e| panic!("{}: {e}", p.sql));
        assert_eq!(row.get::<_, i32>(0), 42);
        assert_eq!(row.get::<_, String>(1), ":a");
        assert_eq!(row.get::<_, String>(2), " :a ");
        assert_eq!(row.get::<_, String>(3), "x");
    }

    #[test]
    fn a_server_that_is_not_there_is_a_transient_error() {
        let s = settings("postgres://u@localhost/d?host=/nonexistent&port=1").unwrap();
        let e = s.connect().err().unwrap();
        assert_eq!(e.kind, StoreErrorKind::Io, "{e}");
    }
}
