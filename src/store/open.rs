//! The one place the store's root names its wings: an operator
//! command's connection to either backend (each wing's connection as a
//! [`CommandDb`], which the commands are generic over), and a body run
//! with the open transaction as either wing's storage steps
//! ([`Db::steps`], behind `with_tx!`). Everything else in
//! the root is written against the seam (`db.rs`, `tx.rs`, `backend.rs`).

use postgres::Client;
use rusqlite::Connection;

use super::StoreError;
use super::db::{Behind, Db, TxError};
use super::postgres::db::{pg_read, pg_write};
use super::postgres::tx::{PgTx, Statements};
use super::sqlite::SqliteTx;
use super::sqlite::db::sqlite_write;

/// An operator command's own connection to one backend: SQLite's
/// `Connection` or PostgreSQL's `Client`, chosen once when the command
/// opens it (`ops::open::on_db`); a command generic over it is compiled
/// for each.
pub trait CommandDb {
    /// The connection, outside any transaction.
    fn db(&mut self) -> Db<'_>;

    /// Runs `body` to read: on PostgreSQL in one snapshot ([`pg_read`]);
    /// on SQLite on the read-only connection as it is.
    fn read<T, E: TxError>(&mut self, body: impl FnOnce(&Db<'_>) -> Result<T, E>) -> Result<T, E>;

    /// Runs `body` in one write transaction: on SQLite `BEGIN IMMEDIATE`
    /// ([`sqlite_write`]); on PostgreSQL one transaction, run again after
    /// a deadlock or serialization failure ([`pg_write`]).
    fn write<T, E: TxError>(&mut self, body: impl FnMut(&Db<'_>) -> Result<T, E>) -> Result<T, E>;
}

impl CommandDb for Connection {
    fn db(&mut self) -> Db<'_> {
        Db::sqlite(self)
    }

    fn read<T, E: TxError>(&mut self, body: impl FnOnce(&Db<'_>) -> Result<T, E>) -> Result<T, E> {
        body(&Db::sqlite(self))
    }

    fn write<T, E: TxError>(&mut self, body: impl FnMut(&Db<'_>) -> Result<T, E>) -> Result<T, E> {
        sqlite_write(self, body)
    }
}

impl CommandDb for Client {
    fn db(&mut self) -> Db<'_> {
        Db::postgres(self)
    }

    fn read<T, E: TxError>(&mut self, body: impl FnOnce(&Db<'_>) -> Result<T, E>) -> Result<T, E> {
        pg_read(self, body)
    }

    fn write<T, E: TxError>(
        &mut self,
        mut body: impl FnMut(&Db<'_>) -> Result<T, E>,
    ) -> Result<T, E> {
        pg_write(self, &mut body)
    }
}

impl Db<'_> {
    /// Runs `sqlite` or `pg` with the open transaction as the claim's and
    /// outbox's storage steps (`store::Tx`, `store::OutboxTx`), for the
    /// shared decisions written against them (an event's state, a check's
    /// record). See [`with_tx!`](crate::with_tx) for one body for both.
    pub fn steps<T, E: From<StoreError>>(
        &self,
        sqlite: impl FnOnce(&mut SqliteTx<'_>) -> Result<T, E>,
        pg: impl FnOnce(&mut PgTx<'_>) -> Result<T, E>,
    ) -> Result<T, E> {
        self.behind(|conn| match conn {
            Behind::Shared(any) => match any.downcast_ref::<Connection>() {
                Some(c) => sqlite(&mut SqliteTx::new(c)),
                None => Err(unknown().into()),
            },
            Behind::Held(any) => match any.downcast_mut::<Client>() {
                Some(client) => {
                    let mut statements = Statements::default();
                    pg(&mut PgTx::new(client, &mut statements))
                }
                None => Err(unknown().into()),
            },
        })
    }
}

/// A connection of neither wing (none is made outside them).
fn unknown() -> StoreError {
    StoreError::other("a connection of no known backend")
}

/// SQLite databases for the root's own tests (its statements' plans and
/// results checked on SQLite).
#[cfg(test)]
pub(crate) mod testing {
    use std::path::Path;

    use rusqlite::Connection;

    pub(crate) use crate::store::sqlite::query_plan;

    /// A database file at `path`, opened as serve opens it and migrated.
    pub(crate) fn sqlite_file(path: &Path) -> Connection {
        let mut conn = crate::store::sqlite::open(
            path,
            crate::config::Durability::Normal,
            std::time::Duration::from_secs(5),
        )
        .unwrap();
        crate::store::sqlite::migrate(&mut conn).unwrap();
        conn
    }

    /// An in-memory database with the schema.
    pub(crate) fn sqlite_memory() -> Connection {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(crate::store::sqlite::SCHEMA).unwrap();
        conn
    }
}
