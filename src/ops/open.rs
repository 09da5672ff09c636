//! Opening the database for an operator command, on either backend:
//! read-only for a command that only looks, read-write (and never
//! creating an empty database) for one that changes something.

use anyhow::{Context, Result};

use std::path::Path;

use crate::config::Config;
use crate::config::database_url::DatabaseUrl;
use crate::store::open::Handle;
use crate::store::postgres::db;
use crate::store::sqlite::Opened;

/// The SQLite file `config` names, for the steps only SQLite has; an
/// error naming the URL when `database` is PostgreSQL.
pub fn sqlite_file(config: &Config) -> Result<&Path> {
    match &config.database {
        DatabaseUrl::Sqlite(path) => Ok(path),
        DatabaseUrl::Postgres(url) => {
            anyhow::bail!("database is {url}: this works on a SQLite file only")
        }
    }
}

/// A read-only connection for a command that only looks; it never changes
/// the database file.
pub fn open_read(config: &Config) -> Result<Opened> {
    let path = sqlite_file(config)?;
    Opened::open_read(path, config.busy_timeout)
        .with_context(|| format!("cannot open the database {}", path.display()))
}

/// A read-write connection for a command that changes something. Refuses a
/// database that does not exist yet rather than creating an empty one.
pub fn open_write(config: &Config) -> Result<Opened> {
    let path = sqlite_file(config)?;
    if !path.exists() {
        anyhow::bail!("{}: no such database (has serve run yet?)", path.display());
    }
    Opened::open(path, config.durability, config.busy_timeout)
        .with_context(|| format!("cannot open the database {}", path.display()))
}

/// The database of `config` on either backend, for a command that only
/// looks: a read-only SQLite connection, or a PostgreSQL session whose
/// transactions are read-only.
pub fn open_db_read(config: &Config) -> Result<Handle> {
    match &config.database {
        DatabaseUrl::Postgres(url) => {
            db::connect_postgres(url, config.durability, config.busy_timeout, true)
                .map(Handle::Postgres)
                .with_context(|| format!("cannot open the database {url}"))
        }
        DatabaseUrl::Sqlite(_) => open_read(config).map(|o| Handle::Sqlite(o.into_connection())),
    }
}

/// The database of `config` on either backend, for a command that
/// changes something (in [`Handle::write`]'s transaction).
pub fn open_db_write(config: &Config) -> Result<Handle> {
    match &config.database {
        DatabaseUrl::Postgres(url) => {
            db::connect_postgres(url, config.durability, config.busy_timeout, false)
                .map(Handle::Postgres)
                .with_context(|| format!("cannot open the database {url}"))
        }
        DatabaseUrl::Sqlite(_) => open_write(config).map(|o| Handle::Sqlite(o.into_connection())),
    }
}
