//! One query layer for the operator side on both backends: the operator
//! commands and the admin API (`ops/`, `http/admin.rs`) write each query
//! once, with SQLite's `?1` placeholders, and [`Db`] runs it on a SQLite
//! connection or a PostgreSQL client (rewritten to `$1` there). The
//! decisions (plans, state rules, the JSON) stay in `ops/`; only the
//! connection differs.
//!
//! Rows come back as [`Row`]s of [`Value`]s with typed getters, so a
//! caller reads a column in one line on either backend. Where the SQL must
//! differ, [`Db::dialect`] says which one runs ([`Dialect::for_update`]).
//! Write it portable: `INSERT ... ON CONFLICT DO NOTHING` (not `INSERT OR
//! IGNORE`), `CAST(.. AS BIGINT)` around a `SUM()` (numeric on
//! PostgreSQL), no `rowid`, and a parameter whose type nothing else fixes
//! (one used only in `?1 IS NULL`) inside a `CAST`. Every integer column
//! is a bigint on PostgreSQL and bodies are bytea, so an integer binds as
//! i64 and a body as bytes.
//!
//! Write transactions (`open::CommandDb::write`, the wing's `pg_write`) on PostgreSQL run
//! at READ COMMITTED, as the forward workers of every instance do: a
//! decision that reads a row it then changes takes that row with
//! [`Dialect::for_update`] (a worker holding it is waited for, and a
//! worker's `FOR UPDATE SKIP LOCKED` take passes it by), and its UPDATEs
//! stay conditional on what was read, so a worker's fenced completion
//! (owner + attempt) and an operator's change never both win. SERIALIZABLE
//! was not chosen: the workers do not run at it, so it would not protect
//! against them, and it would turn every worker's completion nearby into
//! a retry of a whole operator batch. A deadlock (40P01) or a
//! serialization failure (40001) still runs the whole transaction again,
//! a few times. Connection failures are [`StoreError`]s of a transient
//! kind, so the API answers 503 and the CLI exits 2, as on SQLite.
//!
//! Owns: the placeholder rewrite, values and rows, and [`Db`] over a
//! wing's [`Driver`]. Each wing implements the driver and its own
//! transactions (`sqlite/db.rs`, `postgres/db.rs`); the one place that
//! names both is `open.rs`. Not the hot paths: the claim's and the
//! outbox's steps (`tx.rs`) run on each wing's cached prepared statements.

use std::any::Any;
use std::cell::RefCell;
use std::str::FromStr;

use super::StoreError;
use crate::state::{
    Answer, AttemptOutcome, Delivery, EventState, JobKind, JobStatus, ReplayResult, UnknownWord,
};

/// Which SQL a [`Db`] speaks, for the few places the text must differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Sqlite,
    Postgres,
}

impl Dialect {
    /// ` FOR UPDATE` on PostgreSQL (lock the rows a decision reads); empty
    /// on SQLite, where a write transaction holds the whole database.
    pub fn for_update(self) -> &'static str {
        match self {
            Dialect::Sqlite => "",
            Dialect::Postgres => " FOR UPDATE",
        }
    }
}

/// A parameter or a column value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Int(i64),
    Real(f64),
    Text(String),
    Bytes(Vec<u8>),
}

impl From<i64> for Value {
    fn from(v: i64) -> Value {
        Value::Int(v)
    }
}

impl From<u32> for Value {
    fn from(v: u32) -> Value {
        Value::Int(i64::from(v))
    }
}

impl From<bool> for Value {
    fn from(v: bool) -> Value {
        Value::Int(i64::from(v))
    }
}

impl From<&str> for Value {
    fn from(v: &str) -> Value {
        Value::Text(v.to_string())
    }
}

impl From<String> for Value {
    fn from(v: String) -> Value {
        Value::Text(v)
    }
}

impl From<&String> for Value {
    fn from(v: &String) -> Value {
        Value::Text(v.clone())
    }
}

impl From<&[u8]> for Value {
    fn from(v: &[u8]) -> Value {
        Value::Bytes(v.to_vec())
    }
}

impl<T: Into<Value>> From<Option<T>> for Value {
    fn from(v: Option<T>) -> Value {
        v.map_or(Value::Null, Into::into)
    }
}

impl From<&Option<String>> for Value {
    fn from(v: &Option<String>) -> Value {
        v.as_deref().into()
    }
}

/// `args![a, b]`: the parameters of a query, each turned into a [`Value`].
#[macro_export]
macro_rules! args {
    ($($v:expr),* $(,)?) => {
        &[$($crate::store::db::Value::from($v)),*][..]
    };
}

/// One result row. The getters name the column by position and fail
/// (as a storage error naming the column) when its value is not of the
/// type asked for.
#[derive(Debug, Clone, PartialEq)]
pub struct Row(pub Vec<Value>);

impl Row {
    pub fn get(&self, i: usize) -> &Value {
        self.0.get(i).unwrap_or(&Value::Null)
    }

    fn wrong(&self, i: usize, wanted: &str) -> StoreError {
        StoreError::other(format!(
            "column {i}: expected {wanted}, found {:?}",
            self.get(i)
        ))
    }

    pub fn opt_i64(&self, i: usize) -> Result<Option<i64>, StoreError> {
        match self.get(i) {
            Value::Null => Ok(None),
            Value::Int(v) => Ok(Some(*v)),
            _ => Err(self.wrong(i, "an integer")),
        }
    }

    pub fn i64(&self, i: usize) -> Result<i64, StoreError> {
        self.opt_i64(i)?.ok_or_else(|| self.wrong(i, "an integer"))
    }

    /// An integer column read as a flag (SQLite has no booleans; a
    /// PostgreSQL bool arrives as 0 or 1).
    /// A number (REAL or an integer) as f64.
    pub fn f64(&self, i: usize) -> Result<f64, StoreError> {
        match self.get(i) {
            Value::Real(f) => Ok(*f),
            Value::Int(n) => Ok(*n as f64),
            other => Err(StoreError::other(format!(
                "column {i}: expected a number, got {other:?}"
            ))),
        }
    }

    pub fn bool(&self, i: usize) -> Result<bool, StoreError> {
        Ok(self.i64(i)? != 0)
    }

    pub fn opt_string(&self, i: usize) -> Result<Option<String>, StoreError> {
        match self.get(i) {
            Value::Null => Ok(None),
            Value::Text(s) => Ok(Some(s.clone())),
            _ => Err(self.wrong(i, "text")),
        }
    }

    pub fn string(&self, i: usize) -> Result<String, StoreError> {
        self.opt_string(i)?.ok_or_else(|| self.wrong(i, "text"))
    }

    /// A body: bytes (text too, as SQLite may hold either); None for NULL.
    pub fn opt_bytes(&self, i: usize) -> Result<Option<&[u8]>, StoreError> {
        match self.get(i) {
            Value::Null => Ok(None),
            Value::Bytes(b) => Ok(Some(b)),
            Value::Text(s) => Ok(Some(s.as_bytes())),
            _ => Err(self.wrong(i, "bytes")),
        }
    }

    /// A stored word read back as its `state.rs` enum; a word this build
    /// does not know is a storage error naming it.
    pub fn word<T: FromStr<Err = UnknownWord>>(&self, i: usize) -> Result<T, StoreError> {
        self.opt_word(i)?.ok_or_else(|| self.wrong(i, "a word"))
    }

    /// [`Row::word`] of a nullable column.
    pub fn opt_word<T: FromStr<Err = UnknownWord>>(
        &self,
        i: usize,
    ) -> Result<Option<T>, StoreError> {
        self.opt_string(i)?
            .map(|w| {
                w.parse()
                    .map_err(|e: UnknownWord| StoreError::other(format!("column {i}: {e}")))
            })
            .transpose()
    }
}

/// The `state.rs` enums bind as their stored words (SQLite's own
/// statements bind them too: `sqlite/db.rs`).
macro_rules! words_bind_as_text {
    ($($t:ty),+) => {$(
        impl From<$t> for Value {
            fn from(v: $t) -> Value {
                Value::Text(v.as_str().to_string())
            }
        }
    )+};
}

/// Calls `$m!` with every `state.rs` enum that is stored as a word, so
/// each driver's bindings (here, `sqlite/db.rs`) cover the same list.
macro_rules! for_each_word {
    ($m:ident) => {
        $m!(
            JobStatus,
            JobKind,
            EventState,
            AttemptOutcome,
            Delivery,
            ReplayResult,
            Answer
        );
    };
}
pub(crate) use for_each_word;

for_each_word!(words_bind_as_text);

/// A connection a wing lends to the query layer through a shared
/// reference (SQLite's, whose calls take `&self`).
pub trait Driver {
    fn dialect(&self) -> Dialect;
    /// Every row of `sql` (written with `?N` placeholders).
    fn query(&self, sql: &str, args: &[Value]) -> Result<Vec<Row>, StoreError>;
    /// Runs a statement; how many rows it changed.
    fn execute(&self, sql: &str, args: &[Value]) -> Result<u64, StoreError>;
    /// The connection itself, for the one place that runs a wing's steps
    /// on it (`open.rs`).
    fn as_any(&self) -> &dyn Any;
}

/// A connection a wing lends to the query layer exclusively (PostgreSQL's
/// client, whose calls take `&mut self`).
pub trait DriverMut {
    fn dialect(&self) -> Dialect;
    /// Every row of `sql` (written with `?N` placeholders).
    fn query(&mut self, sql: &str, args: &[Value]) -> Result<Vec<Row>, StoreError>;
    /// Runs a statement; how many rows it changed.
    fn execute(&mut self, sql: &str, args: &[Value]) -> Result<u64, StoreError>;
    /// The connection itself (see [`Driver::as_any`]).
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

/// A connection of either backend, with or without an open transaction
/// (its owner opened it). Calls take `&self`: an exclusive connection sits
/// in a `RefCell` (a [`Db`] is used by one thread, one call at a time).
/// The wings make it (`Db::sqlite`, `Db::postgres`).
pub struct Db<'c> {
    conn: Conn<'c>,
}

enum Conn<'c> {
    Shared(&'c dyn Driver),
    Held(RefCell<&'c mut dyn DriverMut>),
}

/// The connection behind a [`Db`], as the one place that runs a wing's
/// steps on it sees it (`open.rs`).
pub(crate) enum Behind<'a> {
    Shared(&'a dyn Any),
    Held(&'a mut dyn Any),
}

impl<'c> Db<'c> {
    pub fn shared(conn: &'c dyn Driver) -> Db<'c> {
        Db {
            conn: Conn::Shared(conn),
        }
    }

    pub fn held(conn: &'c mut dyn DriverMut) -> Db<'c> {
        Db {
            conn: Conn::Held(RefCell::new(conn)),
        }
    }

    pub fn dialect(&self) -> Dialect {
        match &self.conn {
            Conn::Shared(d) => d.dialect(),
            Conn::Held(cell) => cell.borrow().dialect(),
        }
    }

    /// Runs `f` on the connection behind.
    pub(crate) fn behind<R>(&self, f: impl FnOnce(Behind<'_>) -> R) -> R {
        match &self.conn {
            Conn::Shared(d) => f(Behind::Shared(d.as_any())),
            Conn::Held(cell) => f(Behind::Held(cell.borrow_mut().as_any_mut())),
        }
    }

    /// Every row of `sql`.
    pub fn query(&self, sql: &str, args: &[Value]) -> Result<Vec<Row>, StoreError> {
        match &self.conn {
            Conn::Shared(d) => d.query(sql, args),
            Conn::Held(cell) => cell.borrow_mut().query(sql, args),
        }
    }

    /// The first row of `sql`, if any.
    pub fn query_opt(&self, sql: &str, args: &[Value]) -> Result<Option<Row>, StoreError> {
        Ok(self.query(sql, args)?.into_iter().next())
    }

    /// The first row of `sql`; an error when there is none.
    pub fn query_one(&self, sql: &str, args: &[Value]) -> Result<Row, StoreError> {
        self.query_opt(sql, args)?
            .ok_or_else(|| StoreError::other("the query returned no row"))
    }

    /// Runs a statement; returns how many rows it changed.
    pub fn execute(&self, sql: &str, args: &[Value]) -> Result<u64, StoreError> {
        match &self.conn {
            Conn::Shared(d) => d.execute(sql, args),
            Conn::Held(cell) => cell.borrow_mut().execute(sql, args),
        }
    }
}

/// One body for both backends' storage steps: `with_tx!(db, |tx| ...)`
/// compiles `...` once for SQLite's and once for PostgreSQL's
/// `store::OutboxTx` (`Db::steps`, in `open.rs`).
#[macro_export]
macro_rules! with_tx {
    ($db:expr, |$tx:ident| $body:expr) => {
        $db.steps(|$tx| $body, |$tx| $body)
    };
}

/// The error of a transaction body: storage's (which may be run again, or
/// fails the call) or the caller's own (a refusal, which rolls back).
pub trait TxError: From<StoreError> {
    fn as_store(&self) -> Option<&StoreError>;
}

impl TxError for StoreError {
    fn as_store(&self) -> Option<&StoreError> {
        Some(self)
    }
}

/// SQLite's `?N` placeholders as PostgreSQL's `$N`, leaving string
/// literals, quoted identifiers and comments alone. A bare `?` (no
/// number) is refused: the numbers are what both backends agree on.
pub fn to_dollars(sql: &str) -> Result<String, StoreError> {
    let bytes = sql.as_bytes();
    let mut out = String::with_capacity(sql.len());
    let (mut i, mut copied) = (0, 0);
    let unterminated = |what: &str| StoreError::other(format!("unterminated {what} in: {sql}"));
    while i < bytes.len() {
        match bytes[i] {
            q @ (b'\'' | b'"') => {
                let mut j = i + 1;
                loop {
                    match bytes.get(j) {
                        None => return Err(unterminated("quote")),
                        Some(&b) if b == q && bytes.get(j + 1) == Some(&q) => j += 2,
                        Some(&b) if b == q => break,
                        Some(_) => j += 1,
                    }
                }
                i = j + 1;
            }
            b'-' if bytes.get(i + 1) == Some(&b'-') => {
                i = sql[i..].find('\n').map_or(bytes.len(), |n| i + n + 1);
            }
            b'/' if bytes.get(i + 1) == Some(&b'*') => {
                i = sql[i + 2..]
                    .find("*/")
                    .map(|n| i + 2 + n + 2)
                    .ok_or_else(|| unterminated("comment"))?;
            }
            b'?' => {
                let mut end = i + 1;
                while end < bytes.len() && bytes[end].is_ascii_digit() {
                    end += 1;
                }
                if end == i + 1 {
                    return Err(StoreError::other(format!(
                        "a ? without its number in: {sql}"
                    )));
                }
                out.push_str(&sql[copied..i]);
                out.push('$');
                out.push_str(&sql[i + 1..end]);
                i = end;
                copied = end;
            }
            _ => i += 1,
        }
    }
    out.push_str(&sql[copied..]);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use rusqlite::Connection;

    use super::*;
    use crate::store::open::CommandDb;
    use crate::store::pg_cluster;

    #[test]
    fn unknown_words_are_errors() {
        let row = Row(vec![Value::Text("lost".into())]);
        assert!(
            row.word::<JobStatus>(0).is_err(),
            "an unknown word is an error"
        );
        assert_eq!(
            Row(vec![Value::Null]).opt_word::<JobStatus>(0).unwrap(),
            None
        );
    }

    #[test]
    fn placeholders_become_dollars_outside_literals_and_comments() {
        assert_eq!(
            to_dollars("SELECT a FROM t WHERE b = ?1 AND c IN (?2, ?12) -- ?3\n AND d = '?4'")
                .unwrap(),
            "SELECT a FROM t WHERE b = $1 AND c IN ($2, $12) -- ?3\n AND d = '?4'"
        );
        assert_eq!(
            to_dollars("SELECT \"odd?1\", 'it''s ?1', /* ?1 */ ?1").unwrap(),
            "SELECT \"odd?1\", 'it''s ?1', /* ?1 */ $1"
        );
        assert!(to_dollars("SELECT ?").is_err());
        assert!(to_dollars("SELECT 'open").is_err());
    }

    fn round_trip(db: &Db<'_>) -> Vec<Row> {
        // SQLite takes PostgreSQL's type names (by its affinity rules).
        db.execute(
            "CREATE TEMPORARY TABLE t (n BIGINT, s TEXT, b BYTEA, f BIGINT)",
            &[],
        )
        .unwrap();
        let body: &[u8] = b"\x00{\"a\":1}";
        assert_eq!(
            db.execute(
                "INSERT INTO t (n, s, b, f) VALUES (?1, ?2, ?3, ?4), (?5, ?6, ?7, ?8)",
                args![
                    7i64,
                    "x",
                    body,
                    true,
                    None::<i64>,
                    None::<String>,
                    None::<&[u8]>,
                    false
                ],
            )
            .unwrap(),
            2
        );
        db.query(
            "SELECT n, s, b, f, count(*) OVER (), CAST(sum(n) OVER () AS BIGINT), n IS NULL
             FROM t WHERE CAST(?1 AS TEXT) IS NULL OR s = ?1 ORDER BY coalesce(n, -1) DESC",
            args![None::<String>],
        )
        .unwrap()
    }

    /// The same statements give the same rows on both backends.
    #[test]
    fn values_round_trip_alike_on_both_backends() {
        let conn = Connection::open_in_memory().unwrap();
        let on_sqlite = round_trip(&Db::sqlite(&conn));
        assert_eq!(on_sqlite.len(), 2);
        assert_eq!(on_sqlite[0].i64(0).unwrap(), 7);
        assert_eq!(
            on_sqlite[0].opt_bytes(2).unwrap(),
            Some(&b"\x00{\"a\":1}"[..])
        );
        assert!(on_sqlite[0].bool(3).unwrap());
        assert_eq!(on_sqlite[1].opt_string(1).unwrap(), None);
        assert!(on_sqlite[0].string(0).is_err(), "an integer is not text");
        let Some(cluster) = pg_cluster::cluster() else {
            pg_cluster::skipped("values_round_trip_alike_on_both_backends");
            return;
        };
        let url = cluster.create_database("db_round_trip");
        let mut client = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        let on_pg = round_trip(&Db::postgres(&mut client));
        assert_eq!(on_pg, on_sqlite);
    }

    /// A write transaction commits on Ok and rolls back on Err.
    #[test]
    fn write_transactions_commit_or_roll_back() {
        let Some(cluster) = pg_cluster::cluster() else {
            pg_cluster::skipped("write_transactions_commit_or_roll_back");
            return;
        };
        let url = cluster.create_database("db_write_tx");
        let mut client = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        client.batch_execute("CREATE TABLE t (n bigint)").unwrap();
        let mut handle = client;
        handle
            .write(|db| db.execute("INSERT INTO t VALUES (?1)", args![1i64]))
            .unwrap();
        let refused: Result<(), StoreError> = handle.write(|db| {
            db.execute("INSERT INTO t VALUES (?1)", args![2i64])?;
            Err(StoreError::other("refused"))
        });
        assert!(refused.is_err());
        let n = handle
            .db()
            .query_one("SELECT CAST(sum(n) AS BIGINT) FROM t", &[])
            .unwrap();
        assert_eq!(n.i64(0).unwrap(), 1);
    }
}
