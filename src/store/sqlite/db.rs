//! SQLite's side of the query layer ([`Driver`] for a connection, the
//! stored words bound as text) and its operator transactions.

use std::any::Any;

use rusqlite::Connection;
use rusqlite::types::ValueRef;

use crate::state::{
    Answer, AttemptOutcome, Delivery, EventState, JobKind, JobStatus, ReplayResult, UnknownWord,
};
use crate::store::StoreError;
use crate::store::db::{Db, Dialect, Driver, Row, TxError, Value, for_each_word};

/// The `state.rs` enums bind as their stored words in SQLite's own
/// statements (the claim's and the outbox's), and read back from them (a
/// word this build does not know is an error naming it).
macro_rules! words_bind_as_text {
    ($($t:ty),+) => {$(
        impl rusqlite::types::ToSql for $t {
            fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
                Ok(rusqlite::types::ToSqlOutput::Borrowed(ValueRef::Text(
                    self.as_str().as_bytes(),
                )))
            }
        }

        impl rusqlite::types::FromSql for $t {
            fn column_result(v: ValueRef<'_>) -> rusqlite::types::FromSqlResult<$t> {
                v.as_str()?
                    .parse()
                    .map_err(|e: UnknownWord| rusqlite::types::FromSqlError::Other(Box::new(e)))
            }
        }
    )+};
}
for_each_word!(words_bind_as_text);

impl<'c> Db<'c> {
    pub fn sqlite(conn: &'c Connection) -> Db<'c> {
        Db::shared(conn)
    }
}

impl Driver for Connection {
    fn dialect(&self) -> Dialect {
        Dialect::Sqlite
    }

    fn query(&self, sql: &str, args: &[Value]) -> Result<Vec<Row>, StoreError> {
        let mut stmt = self.prepare_cached(sql)?;
        let width = stmt.column_count();
        let mut rows = stmt.query(rusqlite::params_from_iter(args.iter().map(SqliteArg)))?;
        let mut out = Vec::new();
        while let Some(r) = rows.next()? {
            let mut row = Vec::with_capacity(width);
            for i in 0..width {
                row.push(from_sqlite(r.get_ref(i)?));
            }
            out.push(Row(row));
        }
        Ok(out)
    }

    fn execute(&self, sql: &str, args: &[Value]) -> Result<u64, StoreError> {
        let n = self
            .prepare_cached(sql)?
            .execute(rusqlite::params_from_iter(args.iter().map(SqliteArg)))?;
        Ok(n as u64)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Runs `body` in a savepoint of its own inside the writer's open
/// transaction on `conn`: released on Ok; rolled back to on Err, which
/// comes back as `Ok(Err(refusal))`, or as the storage error that fails
/// the writer's call.
pub fn sqlite_savepoint<T, E: TxError>(
    conn: &Connection,
    body: &mut impl FnMut(&Db<'_>) -> Result<T, E>,
) -> Result<Result<T, E>, StoreError> {
    conn.prepare_cached("SAVEPOINT admin")?.execute([])?;
    match body(&Db::sqlite(conn)) {
        Ok(v) => {
            conn.prepare_cached("RELEASE admin")?.execute([])?;
            Ok(Ok(v))
        }
        Err(e) => {
            // Gone already when SQLite rolled the whole transaction back
            // (disk full); the writer notices.
            let _ = conn.execute_batch("ROLLBACK TO admin; RELEASE admin");
            match e.as_store() {
                Some(store) => Err(store.clone()),
                None => Ok(Err(e)),
            }
        }
    }
}

/// Runs `body` in one `BEGIN IMMEDIATE` transaction on `conn`.
pub fn sqlite_write<T, E: TxError>(
    conn: &Connection,
    body: impl FnOnce(&Db<'_>) -> Result<T, E>,
) -> Result<T, E> {
    conn.execute_batch("BEGIN IMMEDIATE")
        .map_err(StoreError::from)?;
    let result = body(&Db::sqlite(conn)).and_then(|v| {
        conn.execute_batch("COMMIT").map_err(StoreError::from)?;
        Ok(v)
    });
    if result.is_err() {
        let _ = conn.execute_batch("ROLLBACK");
    }
    result
}

/// A [`Value`] bound to a SQLite statement.
struct SqliteArg<'a>(&'a Value);

impl rusqlite::ToSql for SqliteArg<'_> {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        use rusqlite::types::ToSqlOutput::Borrowed;
        Ok(Borrowed(match self.0 {
            Value::Null => ValueRef::Null,
            Value::Int(i) => ValueRef::Integer(*i),
            Value::Real(f) => ValueRef::Real(*f),
            Value::Text(s) => ValueRef::Text(s.as_bytes()),
            Value::Bytes(b) => ValueRef::Blob(b),
        }))
    }
}

fn from_sqlite(v: ValueRef<'_>) -> Value {
    match v {
        ValueRef::Null => Value::Null,
        ValueRef::Integer(i) => Value::Int(i),
        ValueRef::Real(f) => Value::Real(f),
        ValueRef::Text(t) => Value::Text(String::from_utf8_lossy(t).into_owned()),
        ValueRef::Blob(b) => Value::Bytes(b.to_vec()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlite_reads_and_writes_the_words() {
        let conn = Connection::open_in_memory().unwrap();
        let s: JobStatus = conn
            .query_row("SELECT ?1", [JobStatus::Paused], |r| r.get(0))
            .unwrap();
        assert_eq!(s, JobStatus::Paused);
        let bad = conn.query_row("SELECT 'lost'", [], |r| r.get::<_, JobStatus>(0));
        assert!(bad.is_err());
    }
}
