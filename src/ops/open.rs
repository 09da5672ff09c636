//! Opening the database for an operator command, on either backend:
//! read-only for a command that only looks, read-write (and never
//! creating an empty database) for one that changes something.

use anyhow::{Context, Result};
use rusqlite::Connection;

use crate::config::Config;
use crate::store::db::Handle;
use crate::store::{self, db};

/// A read-only connection for a command that only looks; it never changes
/// the database file.
pub fn open_read(config: &Config) -> Result<Connection> {
    store::open_read(&config.database, config.busy_timeout)
        .with_context(|| format!("cannot open the database {}", config.database.display()))
}

/// A read-write connection for a command that changes something. Refuses a
/// database that does not exist yet rather than creating an empty one.
pub fn open_write(config: &Config) -> Result<Connection> {
    if !config.database.exists() {
        anyhow::bail!(
            "{}: no such database (has serve run yet?)",
            config.database.display()
        );
    }
    store::open(&config.database, config.durability, config.busy_timeout)
        .with_context(|| format!("cannot open the database {}", config.database.display()))
}

/// The database of `config` on either backend, for a command that only
/// looks: a read-only SQLite connection, or a PostgreSQL session whose
/// transactions are read-only.
pub fn open_db_read(config: &Config) -> Result<Handle> {
    match &config.postgres {
        Some(url) => db::connect_postgres(url, config.durability, config.busy_timeout, true)
            .map(Handle::Postgres)
            .with_context(|| format!("cannot open the database {url}")),
        None => open_read(config).map(Handle::Sqlite),
    }
}

/// The database of `config` on either backend, for a command that
/// changes something (in [`Handle::write`]'s transaction).
pub fn open_db_write(config: &Config) -> Result<Handle> {
    match &config.postgres {
        Some(url) => db::connect_postgres(url, config.durability, config.busy_timeout, false)
            .map(Handle::Postgres)
            .with_context(|| format!("cannot open the database {url}")),
        None => open_write(config).map(Handle::Sqlite),
    }
}
