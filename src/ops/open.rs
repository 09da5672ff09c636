//! Opening the database for an operator command, on either backend:
//! read-only for a command that only looks, read-write (and never
//! creating an empty database) for one that changes something. Every
//! command is written once against the connection ([`OnDb`]; a look, one
//! read or one write is [`look`], [`read`] or [`write`]) and has its
//! backend chosen here, once (`on_db`).

use anyhow::{Context, Result};

use std::path::Path;

use crate::config::Config;
use crate::config::database_url::DatabaseUrl;
use crate::store::db::{Db, TxError};
use crate::store::open::CommandDb;
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

/// A command's work on its own connection, written once against
/// [`CommandDb`] and compiled for each backend.
pub trait OnDb {
    type Out;
    fn run<D: CommandDb>(self, db: D) -> Self::Out;
}

/// Opens `config`'s database for a command that only looks (a read-only
/// SQLite connection, or a PostgreSQL session whose transactions are
/// read-only) and runs `work` on it.
pub fn on_db_read<W: OnDb>(config: &Config, work: W) -> Result<W::Out> {
    on_db(config, true, work)
}

/// Opens `config`'s database for a command that changes something (never
/// creating an empty SQLite file) and runs `work` on it.
pub fn on_db_write<W: OnDb>(config: &Config, work: W) -> Result<W::Out> {
    on_db(config, false, work)
}

/// A command's one read: `body` on `config`'s database, opened read-only
/// on the backend `database` names. The outer error is opening's.
pub fn read<T, E: TxError>(
    config: &Config,
    body: impl FnOnce(&Db<'_>) -> Result<T, E>,
) -> Result<Result<T, E>> {
    struct Read<F>(F);
    impl<T, E: TxError, F: FnOnce(&Db<'_>) -> Result<T, E>> OnDb for Read<F> {
        type Out = Result<T, E>;
        fn run<D: CommandDb>(self, mut db: D) -> Self::Out {
            db.read(self.0)
        }
    }
    on_db_read(config, Read(body))
}

/// A command's look at `config`'s database outside any transaction (the
/// connection as it is, opened read-only), for a plan or counts shown
/// before anything changes. The outer error is opening's.
pub fn look<T>(config: &Config, body: impl FnOnce(&Db<'_>) -> T) -> Result<T> {
    struct Look<F>(F);
    impl<T, F: FnOnce(&Db<'_>) -> T> OnDb for Look<F> {
        type Out = T;
        fn run<D: CommandDb>(self, mut db: D) -> Self::Out {
            (self.0)(&db.db())
        }
    }
    on_db_read(config, Look(body))
}

/// A command's one write transaction: `body` on `config`'s database,
/// opened read-write. The outer error is opening's.
pub fn write<T, E: TxError>(
    config: &Config,
    body: impl FnMut(&Db<'_>) -> Result<T, E>,
) -> Result<Result<T, E>> {
    struct Write<F>(F);
    impl<T, E: TxError, F: FnMut(&Db<'_>) -> Result<T, E>> OnDb for Write<F> {
        type Out = Result<T, E>;
        fn run<D: CommandDb>(self, mut db: D) -> Self::Out {
            db.write(self.0)
        }
    }
    on_db_write(config, Write(body))
}

/// The one choice of a generic command's backend.
fn on_db<W: OnDb>(config: &Config, read_only: bool, work: W) -> Result<W::Out> {
    match &config.database {
        DatabaseUrl::Postgres(url) => {
            let client =
                db::connect_postgres(url, config.durability, config.busy_timeout, read_only)
                    .with_context(|| format!("cannot open the database {url}"))?;
            Ok(work.run(client))
        }
        DatabaseUrl::Sqlite(_) => {
            let opened = if read_only {
                open_read(config)?
            } else {
                open_write(config)?
            };
            Ok(work.run(opened.into_connection()))
        }
    }
}
