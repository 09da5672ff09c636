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
//! Write transactions ([`Handle::write`], [`pg_write`]) on PostgreSQL run
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
//! Owns: the placeholder rewrite, values and rows, opening a connection
//! for an operator command, write transactions. Not the hot paths (the
//! claim and the outbox have their own prepared statements in
//! `sqlite/tx.rs`, `postgres/tx/`).

use std::cell::RefCell;
use std::error::Error as StdError;
use std::str::FromStr;

use postgres::Client;
use postgres::types::private::BytesMut;
use postgres::types::{IsNull, ToSql, Type, to_sql_checked};
use rusqlite::Connection;
use rusqlite::types::ValueRef;

use super::{StoreError, StoreErrorKind};
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

/// The `state.rs` enums bind as their stored words, here and in
/// SQLite's own statements (the claim's and the outbox's), and read back
/// from them (a word this build does not know is an error naming it).
macro_rules! words_bind_as_text {
    ($($t:ty),+) => {$(
        impl From<$t> for Value {
            fn from(v: $t) -> Value {
                Value::Text(v.as_str().to_string())
            }
        }

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
words_bind_as_text!(
    JobStatus,
    JobKind,
    EventState,
    AttemptOutcome,
    Delivery,
    ReplayResult,
    Answer
);

/// A connection of either backend, with or without an open transaction
/// (its owner opened it). Calls take `&self`: the PostgreSQL client sits
/// in a `RefCell` (a [`Db`] is used by one thread, one call at a time).
pub struct Db<'c> {
    conn: Conn<'c>,
}

enum Conn<'c> {
    Sqlite(&'c Connection),
    Postgres(RefCell<&'c mut Client>),
}

impl<'c> Db<'c> {
    pub fn sqlite(conn: &'c Connection) -> Db<'c> {
        Db {
            conn: Conn::Sqlite(conn),
        }
    }

    pub fn postgres(client: &'c mut Client) -> Db<'c> {
        Db {
            conn: Conn::Postgres(RefCell::new(client)),
        }
    }

    pub fn dialect(&self) -> Dialect {
        match self.conn {
            Conn::Sqlite(_) => Dialect::Sqlite,
            Conn::Postgres(_) => Dialect::Postgres,
        }
    }

    /// Runs `sqlite` or `pg` with the open transaction as the claim's and
    /// outbox's storage steps (`store::Tx`, `store::OutboxTx`), for the
    /// shared decisions written against them (an event's state, a check's
    /// record). See [`with_tx!`](crate::with_tx) for one body for both.
    pub fn steps<R>(
        &self,
        sqlite: impl FnOnce(&mut super::sqlite::SqliteTx<'_>) -> R,
        pg: impl FnOnce(&mut super::postgres::tx::PgTx<'_>) -> R,
    ) -> R {
        match &self.conn {
            Conn::Sqlite(c) => sqlite(&mut super::sqlite::SqliteTx::new(c)),
            Conn::Postgres(cell) => {
                let mut client = cell.borrow_mut();
                let mut statements = super::postgres::tx::Statements::default();
                pg(&mut super::postgres::tx::PgTx::new(
                    &mut client,
                    &mut statements,
                ))
            }
        }
    }

    /// Every row of `sql`.
    pub fn query(&self, sql: &str, args: &[Value]) -> Result<Vec<Row>, StoreError> {
        match &self.conn {
            Conn::Sqlite(c) => {
                let mut stmt = c.prepare_cached(sql)?;
                let width = stmt.column_count();
                let mut rows =
                    stmt.query(rusqlite::params_from_iter(args.iter().map(SqliteArg)))?;
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
            Conn::Postgres(cell) => {
                let sql = to_dollars(sql)?;
                let refs: Vec<&(dyn ToSql + Sync)> =
                    args.iter().map(|v| v as &(dyn ToSql + Sync)).collect();
                let rows = cell.borrow_mut().query(sql.as_str(), &refs)?;
                rows.iter().map(from_postgres).collect()
            }
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
            Conn::Sqlite(c) => {
                let n = c
                    .prepare_cached(sql)?
                    .execute(rusqlite::params_from_iter(args.iter().map(SqliteArg)))?;
                Ok(n as u64)
            }
            Conn::Postgres(cell) => {
                let sql = to_dollars(sql)?;
                let refs: Vec<&(dyn ToSql + Sync)> =
                    args.iter().map(|v| v as &(dyn ToSql + Sync)).collect();
                Ok(cell.borrow_mut().execute(sql.as_str(), &refs)?)
            }
        }
    }
}

/// One body for both backends' storage steps: `with_tx!(db, |tx| ...)`
/// compiles `...` once for SQLite's and once for PostgreSQL's
/// `store::OutboxTx`.
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

/// Whether a transaction failed only because another one ran at the same
/// time (a deadlock or a serialization failure): nothing of it was
/// committed and it may simply run again.
pub fn is_retryable(e: &StoreError) -> bool {
    e.kind == StoreErrorKind::Busy
        && (e.message.contains("(40P01)") || e.message.contains("(40001)"))
}

/// How many times a PostgreSQL write transaction runs at most.
const PG_WRITE_ATTEMPTS: u32 = 5;

/// Runs `body` in one READ COMMITTED transaction on `client`: committed
/// on Ok, rolled back on Err; run again after a deadlock or a
/// serialization failure (`store::postgres::retrying`).
pub fn pg_write<T, E: TxError>(
    client: &mut Client,
    mut body: impl FnMut(&Db<'_>) -> Result<T, E>,
) -> Result<T, E> {
    crate::store::postgres::retrying(
        PG_WRITE_ATTEMPTS - 1,
        crate::store::postgres::short_pause,
        |e: &E| e.as_store().is_some_and(is_retryable),
        || {
            client
                .batch_execute("BEGIN ISOLATION LEVEL READ COMMITTED")
                .map_err(StoreError::from)?;
            let outcome = body(&Db::postgres(client));
            let result = outcome.and_then(|v| {
                client.batch_execute("COMMIT").map_err(StoreError::from)?;
                Ok(v)
            });
            if result.is_err() {
                let _ = client.batch_execute("ROLLBACK");
            }
            result
        },
    )
}

/// Runs `body` in one read-only REPEATABLE READ transaction on `client`,
/// so every statement of one answer (an event, its jobs, their attempts)
/// reads the same snapshot, as SQLite's single writer makes it look.
pub fn pg_read<T, E: TxError>(
    client: &mut Client,
    body: impl FnOnce(&Db<'_>) -> Result<T, E>,
) -> Result<T, E> {
    client
        .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        .map_err(StoreError::from)?;
    let outcome = body(&Db::postgres(client));
    // Nothing was written: ending it cannot lose anything.
    let _ = client.batch_execute("ROLLBACK");
    outcome
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

/// An operator command's own connection, to either backend.
pub enum Handle {
    Sqlite(Connection),
    Postgres(Client),
}

impl Handle {
    /// The connection, outside any transaction.
    pub fn db(&mut self) -> Db<'_> {
        match self {
            Handle::Sqlite(c) => Db::sqlite(c),
            Handle::Postgres(c) => Db::postgres(c),
        }
    }

    /// Runs `body` to read: on PostgreSQL in one snapshot ([`pg_read`]);
    /// on SQLite on the read-only connection as it is.
    pub fn read<T, E: TxError>(
        &mut self,
        body: impl FnOnce(&Db<'_>) -> Result<T, E>,
    ) -> Result<T, E> {
        match self {
            Handle::Sqlite(c) => body(&Db::sqlite(c)),
            Handle::Postgres(c) => pg_read(c, body),
        }
    }

    /// Runs `body` in one write transaction (see the module's note).
    pub fn write<T, E: TxError>(
        &mut self,
        mut body: impl FnMut(&Db<'_>) -> Result<T, E>,
    ) -> Result<T, E> {
        match self {
            Handle::Sqlite(c) => sqlite_write(c, body),
            Handle::Postgres(c) => pg_write(c, &mut body),
        }
    }
}

/// Connects an operator command to PostgreSQL. With `read_only` every
/// transaction of the session is read-only. A database `serve` never
/// migrated is refused, as SQLite refuses a missing file.
pub fn connect_postgres(
    url: &crate::config::database_url::PostgresUrl,
    durability: crate::config::Durability,
    busy_timeout: std::time::Duration,
    read_only: bool,
) -> Result<Client, StoreError> {
    let settings = super::postgres::Settings::from_url(url, durability, busy_timeout)
        .map_err(StoreError::other)?;
    let mut client = settings.connect()?;
    if read_only {
        client.batch_execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")?;
    }
    let migrated: bool = client
        .query_one("SELECT to_regclass('idemhook_migrations') IS NOT NULL", &[])?
        .get(0);
    if !migrated {
        return Err(StoreError {
            kind: StoreErrorKind::ReadOnly,
            message: format!(
                "no idemhook tables in schema {:?} of this database (has serve run yet?)",
                url.schema()
            ),
        });
    }
    // As serve: a schema this build does not know is refused, one that is
    // behind is migrated by serve first.
    let version: i32 = client
        .query_one(
            "SELECT COALESCE(MAX(version), 0) FROM idemhook_migrations",
            &[],
        )?
        .get(0);
    let latest = super::postgres::MIGRATIONS.last().map_or(0, |m| m.0);
    if version != latest {
        let what = if version > latest {
            "newer than this idemhook's: run the newer idemhook"
        } else {
            "older than this idemhook's: start serve once (it migrates), then run the command"
        };
        return Err(StoreError {
            kind: StoreErrorKind::Other,
            message: format!("the database has schema version {version}, {what} ({latest})"),
        });
    }
    Ok(client)
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

/// A PostgreSQL row as values. Types outside the schema's (bigint, text,
/// bytea) and what expressions over them give (int, bool, double) are an
/// error that says to cast.
fn from_postgres(r: &postgres::Row) -> Result<Row, StoreError> {
    let mut out = Vec::with_capacity(r.len());
    for (i, column) in r.columns().iter().enumerate() {
        let ty = column.type_();
        let v = if *ty == Type::INT8 {
            r.try_get::<_, Option<i64>>(i)?.map(Value::Int)
        } else if *ty == Type::INT4 {
            r.try_get::<_, Option<i32>>(i)?
                .map(|v| Value::Int(i64::from(v)))
        } else if *ty == Type::INT2 {
            r.try_get::<_, Option<i16>>(i)?
                .map(|v| Value::Int(i64::from(v)))
        } else if *ty == Type::BOOL {
            r.try_get::<_, Option<bool>>(i)?
                .map(|v| Value::Int(i64::from(v)))
        } else if *ty == Type::FLOAT8 {
            r.try_get::<_, Option<f64>>(i)?.map(Value::Real)
        } else if *ty == Type::FLOAT4 {
            r.try_get::<_, Option<f32>>(i)?
                .map(|v| Value::Real(f64::from(v)))
        } else if *ty == Type::BYTEA {
            r.try_get::<_, Option<Vec<u8>>>(i)?.map(Value::Bytes)
        } else if [Type::TEXT, Type::VARCHAR, Type::BPCHAR, Type::NAME].contains(ty) {
            r.try_get::<_, Option<String>>(i)?.map(Value::Text)
        } else {
            return Err(StoreError::other(format!(
                "column {} is of type {ty}: cast it to bigint or text in the query",
                column.name()
            )));
        };
        out.push(v.unwrap_or(Value::Null));
    }
    Ok(Row(out))
}

type BoxError = Box<dyn StdError + Sync + Send>;

/// A [`Value`] bound as the type PostgreSQL inferred for its parameter:
/// an integer into any integer, a float, text or a bool column; NULL into
/// anything. What does not fit is an error naming the type.
impl ToSql for Value {
    fn to_sql(&self, ty: &Type, out: &mut BytesMut) -> Result<IsNull, BoxError> {
        let mismatch = || -> BoxError { format!("{self:?} does not bind as {ty}").into() };
        match self {
            Value::Null => Ok(IsNull::Yes),
            Value::Int(i) => {
                if *ty == Type::INT8 {
                    i.to_sql(ty, out)
                } else if *ty == Type::INT4 {
                    i32::try_from(*i)?.to_sql(ty, out)
                } else if *ty == Type::INT2 {
                    i16::try_from(*i)?.to_sql(ty, out)
                } else if *ty == Type::BOOL {
                    (*i != 0).to_sql(ty, out)
                } else if *ty == Type::FLOAT8 {
                    (*i as f64).to_sql(ty, out)
                } else if [Type::TEXT, Type::VARCHAR, Type::UNKNOWN].contains(ty) {
                    i.to_string().to_sql(ty, out)
                } else {
                    Err(mismatch())
                }
            }
            Value::Real(f) => {
                if *ty == Type::FLOAT8 {
                    f.to_sql(ty, out)
                } else if *ty == Type::FLOAT4 {
                    (*f as f32).to_sql(ty, out)
                } else {
                    Err(mismatch())
                }
            }
            Value::Text(s) => {
                if <&str as ToSql>::accepts(ty) {
                    s.as_str().to_sql(ty, out)
                } else {
                    Err(mismatch())
                }
            }
            Value::Bytes(b) => {
                if *ty == Type::BYTEA {
                    b.as_slice().to_sql(ty, out)
                } else {
                    Err(mismatch())
                }
            }
        }
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    to_sql_checked!();
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
    use super::*;
    use crate::store::pg_cluster;

    #[test]
    fn sqlite_reads_and_writes_the_words() {
        let conn = Connection::open_in_memory().unwrap();
        let s: JobStatus = conn
            .query_row("SELECT ?1", [JobStatus::Paused], |r| r.get(0))
            .unwrap();
        assert_eq!(s, JobStatus::Paused);
        let bad = conn.query_row("SELECT 'lost'", [], |r| r.get::<_, JobStatus>(0));
        assert!(bad.is_err());
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
        let mut handle = Handle::Postgres(client);
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
