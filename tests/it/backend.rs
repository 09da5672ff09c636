//! One test body, both backends: which backend a `Server` runs on, and a
//! backend-neutral way to read (and, for a test's own setup, write) its
//! rows.
//!
//! - [`Backend`]: SQLite (a file in the server's temp dir, the default) or
//!   PostgreSQL (a fresh database of the shared per-binary test cluster of
//!   `tests/support/pg_cluster.rs`, or of `IDEMHOOK_TEST_PG_URL`).
//!   `Server::start_on(backend, &config, env)` starts on either;
//!   `backend.config(config)` points a config at a fresh database (two
//!   instances on one PostgreSQL database share it).
//! - [`both_backends!`]: a test written once as `fn name(backend: Backend)`
//!   becomes two, `name::sqlite` and `name::postgres`; the
//!   PostgreSQL half says SKIPPED loudly and passes when there is no
//!   PostgreSQL (and fails under `CI=true`: CI always has it).
//! - [`Db`]: `count`, `rows`, `row`, `exec` and `dump` with SQLite's `?1`
//!   placeholders, rewritten to `$1` on PostgreSQL; values come back as
//!   [`Val`] whatever the backend's types (bytea and BLOB are both bytes,
//!   bigint and INTEGER both integers, numeric a number).
//!
//! The SQL a shared test writes must mean the same on both: plain
//! SELECT/COUNT/JOIN, `CAST(x AS BIGINT)`, no `typeof`, `json_extract`,
//! `INSERT OR ...` or `::casts` (branch on `backend` where it must differ).

#![allow(dead_code)] // not every test module uses every helper

use std::time::Duration;

use crate::pg_cluster;

/// Where a test's server keeps its state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgres",
        }
    }

    pub fn is_postgres(self) -> bool {
        self == Backend::Postgres
    }

    /// Whether this backend can run here. PostgreSQL without a cluster:
    /// false, after a loud SKIPPED line naming `test` (a panic instead when
    /// `CI=true`, where a skip would hide that the tests did not run).
    pub fn available(self, test: &str) -> bool {
        match self {
            Backend::Sqlite => true,
            Backend::Postgres => {
                // Panics under CI=true instead (see pg_cluster::cluster).
                if pg_cluster::cluster().is_some() {
                    return true;
                }
                pg_cluster::skipped(test);
                false
            }
        }
    }

    /// `config` pointed at a fresh store of this backend: unchanged for
    /// SQLite (the file beside the config), a new database of the test
    /// cluster for PostgreSQL. Several servers started with the returned
    /// config share that database.
    pub fn config(self, config: crate::harness::ServerConfig) -> crate::harness::ServerConfig {
        match self {
            Backend::Sqlite => config,
            Backend::Postgres => {
                let url = fresh_database();
                config.set("database", &crate::harness::toml_str(&url))
            }
        }
    }
}

/// The backends a shared test runs on, for a loop in one test: SQLite,
/// then PostgreSQL when available (SKIPPED loudly otherwise).
pub fn backends(test: &str) -> Vec<Backend> {
    let mut out = vec![Backend::Sqlite];
    if Backend::Postgres.available(test) {
        out.push(Backend::Postgres);
    }
    out
}

/// A fresh database of the shared test cluster, named after the running
/// test (libtest names its thread after it). Panics without a cluster:
/// ask [`Backend::available`] first.
pub fn fresh_database() -> String {
    let cluster = pg_cluster::cluster().expect("fresh_database: no PostgreSQL (ask available())");
    let thread = std::thread::current();
    let name = thread.name().unwrap_or("test");
    // The tail names the test best (`receiver::x::postgres` -> `x`).
    let name = name.trim_end_matches("::postgres");
    let tail: String = {
        let chars: Vec<char> = name.chars().collect();
        chars[chars.len().saturating_sub(40)..].iter().collect()
    };
    cluster.create_database(&tail)
}

/// Makes a test of shared behaviour run on both backends: for each
/// `fn name(backend: Backend)` named, a module `name` with the tests
/// `name::sqlite` and `name::postgres` (filter with `::postgres` to run
/// one half; the PostgreSQL half says SKIPPED loudly without a cluster).
///
/// ```ignore
/// /// What it shows.
/// fn duplicates_are_stored_once(backend: Backend) {
///     let server = Server::start_on(backend, &config, &env);
///     assert_eq!(server.count("SELECT count(*) FROM events", &[]), 1);
/// }
/// both_backends!(duplicates_are_stored_once);
/// ```
///
/// (A module and a function may share a name: they live in different
/// namespaces.)
macro_rules! both_backends {
    ($($name:ident),+ $(,)?) => {$(
        mod $name {
            #[test]
            fn sqlite() {
                super::$name($crate::backend::Backend::Sqlite);
            }

            #[test]
            fn postgres() {
                if $crate::backend::Backend::Postgres.available(module_path!()) {
                    super::$name($crate::backend::Backend::Postgres);
                }
            }
        }
    )+};
}
pub(crate) use both_backends;

// ---------------------------------------------------------------------------
// Values and parameters
// ---------------------------------------------------------------------------

/// One value of a row or a parameter, the same on both backends.
#[derive(Clone, Debug, PartialEq)]
pub enum Val {
    Null,
    Int(i64),
    Real(f64),
    Text(String),
    Bytes(Vec<u8>),
}

impl Val {
    pub fn is_null(&self) -> bool {
        matches!(self, Val::Null)
    }

    /// As an integer (text that parses as one too); None for NULL.
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Val::Null => None,
            Val::Int(i) => Some(*i),
            Val::Real(r) if r.fract() == 0.0 => Some(*r as i64),
            Val::Text(t) => t.trim().parse().ok(),
            other => panic!("not an integer: {other:?}"),
        }
    }

    /// As text (bytes as lossy UTF-8, numbers printed); None for NULL.
    pub fn as_text(&self) -> Option<String> {
        match self {
            Val::Null => None,
            Val::Int(i) => Some(i.to_string()),
            Val::Real(r) => Some(r.to_string()),
            Val::Text(t) => Some(t.clone()),
            Val::Bytes(b) => Some(String::from_utf8_lossy(b).into_owned()),
        }
    }

    /// As bytes (text as its UTF-8); None for NULL.
    pub fn as_bytes(&self) -> Option<Vec<u8>> {
        match self {
            Val::Null => None,
            Val::Bytes(b) => Some(b.clone()),
            other => other.as_text().map(String::into_bytes),
        }
    }

    fn display(&self) -> String {
        match self {
            Val::Null => "NULL".to_string(),
            Val::Bytes(b) => match std::str::from_utf8(b) {
                Ok(s) => s.to_string(),
                Err(_) => format!("<{} bytes>", b.len()),
            },
            other => other.as_text().unwrap_or_default(),
        }
    }
}

/// Something a test passes as a query parameter.
pub trait Param {
    fn val(&self) -> Val;
}

impl Param for Val {
    fn val(&self) -> Val {
        self.clone()
    }
}
impl Param for str {
    fn val(&self) -> Val {
        Val::Text(self.to_string())
    }
}
impl Param for &str {
    fn val(&self) -> Val {
        Val::Text(self.to_string())
    }
}
impl Param for String {
    fn val(&self) -> Val {
        Val::Text(self.clone())
    }
}
impl Param for &String {
    fn val(&self) -> Val {
        Val::Text((*self).clone())
    }
}
impl Param for [u8] {
    fn val(&self) -> Val {
        Val::Bytes(self.to_vec())
    }
}
impl Param for Vec<u8> {
    fn val(&self) -> Val {
        Val::Bytes(self.clone())
    }
}
macro_rules! int_param {
    ($($t:ty),*) => {$(
        impl Param for $t {
            fn val(&self) -> Val {
                Val::Int(i64::try_from(*self).expect("integer parameter fits i64"))
            }
        }
    )*};
}
int_param!(i64, i32, u32, u64, usize, u16, i16);
impl Param for bool {
    fn val(&self) -> Val {
        Val::Int(i64::from(*self))
    }
}
impl Param for f64 {
    fn val(&self) -> Val {
        Val::Real(*self)
    }
}
impl<T: Param> Param for Option<T> {
    fn val(&self) -> Val {
        self.as_ref().map_or(Val::Null, Param::val)
    }
}

/// One row: its values by column index.
#[derive(Clone, Debug, PartialEq)]
pub struct Row(pub Vec<Val>);

impl Row {
    pub fn get(&self, i: usize) -> &Val {
        self.0
            .get(i)
            .unwrap_or_else(|| panic!("row has {} columns, asked for {i}", self.0.len()))
    }

    /// Column `i` as an integer; panics on NULL.
    pub fn int(&self, i: usize) -> i64 {
        self.get(i)
            .as_int()
            .unwrap_or_else(|| panic!("column {i} is NULL in {self:?}"))
    }

    pub fn opt_int(&self, i: usize) -> Option<i64> {
        self.get(i).as_int()
    }

    /// Column `i` as text; panics on NULL.
    pub fn text(&self, i: usize) -> String {
        self.get(i)
            .as_text()
            .unwrap_or_else(|| panic!("column {i} is NULL in {self:?}"))
    }

    pub fn opt_text(&self, i: usize) -> Option<String> {
        self.get(i).as_text()
    }

    /// Column `i` as bytes (BLOB, bytea or text); None for NULL.
    pub fn bytes(&self, i: usize) -> Option<Vec<u8>> {
        self.get(i).as_bytes()
    }
}

// ---------------------------------------------------------------------------
// A connection to either backend
// ---------------------------------------------------------------------------

/// A connection to a server's store (read-only on SQLite: the file is the
/// server's; a test's own writes go through [`Db::exec`] on a read-write
/// connection).
pub enum Db {
    Sqlite(rusqlite::Connection),
    Postgres {
        url: String,
        client: postgres::Client,
    },
}

impl Db {
    /// A read-only connection to a SQLite file.
    pub fn sqlite(path: &std::path::Path) -> Db {
        Db::Sqlite(crate::harness::open_db_read_only(path))
    }

    /// A read-write connection to a SQLite file (a test's own setup).
    pub fn sqlite_rw(path: &std::path::Path) -> Db {
        let conn = rusqlite::Connection::open(path)
            .unwrap_or_else(|e| panic!("open {} read-write: {e}", path.display()));
        conn.busy_timeout(Duration::from_secs(10)).ok();
        Db::Sqlite(conn)
    }

    /// A connection to a PostgreSQL database.
    pub fn postgres(url: &str) -> Db {
        let client = pg_connect(url);
        Db::Postgres {
            url: url.to_string(),
            client,
        }
    }

    pub fn backend(&self) -> Backend {
        match self {
            Db::Sqlite(_) => Backend::Sqlite,
            Db::Postgres { .. } => Backend::Postgres,
        }
    }

    /// The rows of `sql` (placeholders `?1`, `?2`, ... or `?`).
    pub fn rows(&mut self, sql: &str, params: &[&dyn Param]) -> Vec<Row> {
        let vals: Vec<Val> = params.iter().map(|p| p.val()).collect();
        match self {
            Db::Sqlite(conn) => sqlite_rows(conn, sql, &vals).unwrap_or_else(|e| {
                panic!("query failed: {sql}\n  params: {vals:?}\n  error: {e}")
            }),
            Db::Postgres { url, client } => {
                let pg_sql = to_dollar_placeholders(sql);
                let result = pg_rows(client, &pg_sql, &vals);
                let result = match result {
                    Err(e) if client.is_closed() => {
                        // The server was restarted under the test: once more.
                        let _ = e;
                        *client = pg_connect(url);
                        pg_rows(client, &pg_sql, &vals)
                    }
                    other => other,
                };
                result.unwrap_or_else(|e| {
                    panic!("query failed: {pg_sql}\n  params: {vals:?}\n  error: {e:?}")
                })
            }
        }
    }

    /// The first row of `sql`, if any.
    pub fn row(&mut self, sql: &str, params: &[&dyn Param]) -> Option<Row> {
        self.rows(sql, params).into_iter().next()
    }

    /// The one row of `sql`; panics when there is none.
    pub fn one(&mut self, sql: &str, params: &[&dyn Param]) -> Row {
        self.row(sql, params)
            .unwrap_or_else(|| panic!("expected a row from: {sql}"))
    }

    /// `SELECT count(*) ...` (or any one integer) as i64.
    pub fn count(&mut self, sql: &str, params: &[&dyn Param]) -> i64 {
        self.one(sql, params).int(0)
    }

    /// The first column of every row, as text (NULL as "NULL").
    pub fn texts(&mut self, sql: &str, params: &[&dyn Param]) -> Vec<String> {
        self.rows(sql, params)
            .iter()
            .map(|r| r.opt_text(0).unwrap_or_else(|| "NULL".to_string()))
            .collect()
    }

    /// Runs a statement that returns no rows; the rows it changed.
    pub fn exec(&mut self, sql: &str, params: &[&dyn Param]) -> u64 {
        let vals: Vec<Val> = params.iter().map(|p| p.val()).collect();
        match self {
            Db::Sqlite(conn) => conn
                .execute(sql, rusqlite::params_from_iter(vals.iter().map(to_sqlite)))
                .map(|n| n as u64)
                .unwrap_or_else(|e| panic!("exec failed: {sql}\n  error: {e}")),
            Db::Postgres { client, .. } => {
                let pg_sql = to_dollar_placeholders(sql);
                let boxed: Vec<PgVal> = vals.iter().cloned().map(PgVal).collect();
                let refs: Vec<&(dyn postgres::types::ToSql + Sync)> = boxed
                    .iter()
                    .map(|v| v as &(dyn postgres::types::ToSql + Sync))
                    .collect();
                client
                    .execute(pg_sql.as_str(), &refs)
                    .unwrap_or_else(|e| panic!("exec failed: {pg_sql}\n  error: {e:?}"))
            }
        }
    }

    /// Rows of a query as text lines (header first), for failure messages;
    /// never panics.
    pub fn dump(&mut self, sql: &str) -> String {
        let result = match self {
            Db::Sqlite(conn) => {
                let names = conn
                    .prepare(sql)
                    .map(|s| s.column_names().join(" | "))
                    .unwrap_or_default();
                sqlite_rows(conn, sql, &[])
                    .map(|rows| (names, rows))
                    .map_err(|e| e.to_string())
            }
            Db::Postgres { client, .. } => {
                let names = client
                    .prepare(sql)
                    .map(|s| {
                        s.columns()
                            .iter()
                            .map(|c| c.name().to_string())
                            .collect::<Vec<_>>()
                            .join(" | ")
                    })
                    .unwrap_or_default();
                pg_rows(client, sql, &[])
                    .map(|rows| (names, rows))
                    .map_err(|e| format!("{e:?}"))
            }
        };
        match result {
            Err(e) => format!("(cannot dump `{sql}`: {e})"),
            Ok((names, rows)) => {
                let mut out = names;
                out.push('\n');
                for row in rows.iter().take(50) {
                    let cells: Vec<String> = row.0.iter().map(Val::display).collect();
                    out.push_str(&cells.join(" | "));
                    out.push('\n');
                }
                if rows.len() > 50 {
                    out.push_str(&format!("... {} rows in all\n", rows.len()));
                }
                out
            }
        }
    }
}

fn pg_connect(url: &str) -> postgres::Client {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        match postgres::Client::connect(url, postgres::NoTls) {
            // idemhook's tables are in its own schema, the team's first.
            Ok(mut c) => {
                c.batch_execute("SET search_path = \"$user\", public, idemhook")
                    .unwrap_or_else(|e| panic!("set search_path: {e:?}"));
                return c;
            }
            Err(e) if std::time::Instant::now() > deadline => {
                panic!("connect to {url}: {e:?}")
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

fn to_sqlite(v: &Val) -> rusqlite::types::Value {
    use rusqlite::types::Value;
    match v {
        Val::Null => Value::Null,
        Val::Int(i) => Value::Integer(*i),
        Val::Real(r) => Value::Real(*r),
        Val::Text(t) => Value::Text(t.clone()),
        Val::Bytes(b) => Value::Blob(b.clone()),
    }
}

fn sqlite_rows(conn: &rusqlite::Connection, sql: &str, vals: &[Val]) -> rusqlite::Result<Vec<Row>> {
    use rusqlite::types::ValueRef;
    let mut stmt = conn.prepare(sql)?;
    let n = stmt.column_count();
    let rows = stmt.query_map(
        rusqlite::params_from_iter(vals.iter().map(to_sqlite)),
        |row| {
            let mut cells = Vec::with_capacity(n);
            for i in 0..n {
                cells.push(match row.get_ref(i)? {
                    ValueRef::Null => Val::Null,
                    ValueRef::Integer(i) => Val::Int(i),
                    ValueRef::Real(r) => Val::Real(r),
                    ValueRef::Text(t) => Val::Text(String::from_utf8_lossy(t).into_owned()),
                    ValueRef::Blob(b) => Val::Bytes(b.to_vec()),
                });
            }
            Ok(Row(cells))
        },
    )?;
    rows.collect()
}

/// SQLite's `?1` / `?` placeholders as PostgreSQL's `$1`, outside string
/// literals and quoted identifiers.
pub fn to_dollar_placeholders(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len() + 8);
    let mut chars = sql.chars().peekable();
    let mut next = 1;
    let mut quote: Option<char> = None;
    while let Some(c) = chars.next() {
        if let Some(q) = quote {
            out.push(c);
            if c == q {
                quote = None;
            }
            continue;
        }
        match c {
            '\'' | '"' => {
                quote = Some(c);
                out.push(c);
            }
            '?' => {
                let mut digits = String::new();
                while let Some(d) = chars.peek().filter(|d| d.is_ascii_digit()) {
                    digits.push(*d);
                    chars.next();
                }
                if digits.is_empty() {
                    out.push_str(&format!("${next}"));
                    next += 1;
                } else {
                    out.push('$');
                    out.push_str(&digits);
                }
            }
            c => out.push(c),
        }
    }
    out
}

/// A parameter bound by the type PostgreSQL inferred for it.
#[derive(Debug)]
struct PgVal(Val);

impl postgres::types::ToSql for PgVal {
    fn to_sql(
        &self,
        ty: &postgres::types::Type,
        out: &mut postgres::types::private::BytesMut,
    ) -> Result<postgres::types::IsNull, Box<dyn std::error::Error + Sync + Send>> {
        use postgres::types::{IsNull, Type};
        let int = |v: &Val| -> Result<i64, Box<dyn std::error::Error + Sync + Send>> {
            v.as_int()
                .ok_or_else(|| format!("{v:?} is not an integer for {ty}").into())
        };
        match &self.0 {
            Val::Null => Ok(IsNull::Yes),
            v if *ty == Type::INT8 => int(v)?.to_sql(ty, out),
            v if *ty == Type::INT4 => i32::try_from(int(v)?)?.to_sql(ty, out),
            v if *ty == Type::INT2 => i16::try_from(int(v)?)?.to_sql(ty, out),
            v if *ty == Type::BOOL => (int(v)? != 0).to_sql(ty, out),
            Val::Int(i) if *ty == Type::FLOAT8 => (*i as f64).to_sql(ty, out),
            Val::Real(r) if *ty == Type::FLOAT8 => r.to_sql(ty, out),
            Val::Bytes(b) if *ty == Type::BYTEA => b.to_sql(ty, out),
            v if *ty == Type::BYTEA => v.as_bytes().unwrap_or_default().to_sql(ty, out),
            v => v.as_text().unwrap_or_default().to_sql(&Type::TEXT, out),
        }
    }

    fn accepts(_: &postgres::types::Type) -> bool {
        true
    }

    postgres::types::to_sql_checked!();
}

/// A column value of any type, decoded by its type.
struct AnyVal(Val);

impl<'a> postgres::types::FromSql<'a> for AnyVal {
    fn from_sql(
        ty: &postgres::types::Type,
        raw: &'a [u8],
    ) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        use postgres::types::Type;
        let v = match ty {
            t if *t == Type::INT8 => Val::Int(i64::from_sql(t, raw)?),
            t if *t == Type::INT4 => Val::Int(i32::from_sql(t, raw)?.into()),
            t if *t == Type::INT2 => Val::Int(i16::from_sql(t, raw)?.into()),
            t if *t == Type::OID => Val::Int(u32::from_sql(t, raw)?.into()),
            t if *t == Type::BOOL => Val::Int(bool::from_sql(t, raw)?.into()),
            t if *t == Type::FLOAT8 => Val::Real(f64::from_sql(t, raw)?),
            t if *t == Type::FLOAT4 => Val::Real(f32::from_sql(t, raw)?.into()),
            t if *t == Type::BYTEA => Val::Bytes(raw.to_vec()),
            t if *t == Type::NUMERIC => numeric(raw)?,
            t if *t == Type::JSONB => {
                Val::Text(String::from_utf8_lossy(raw.get(1..).unwrap_or_default()).into_owned())
            }
            // text, varchar, name, bpchar, json, unknown, enums: UTF-8.
            _ => Val::Text(String::from_utf8_lossy(raw).into_owned()),
        };
        Ok(AnyVal(v))
    }

    fn from_sql_null(
        _: &postgres::types::Type,
    ) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        Ok(AnyVal(Val::Null))
    }

    fn accepts(_: &postgres::types::Type) -> bool {
        true
    }
}

/// PostgreSQL's binary numeric: an integer when it has no fraction (a
/// `sum()` of bigints), else a float.
fn numeric(raw: &[u8]) -> Result<Val, Box<dyn std::error::Error + Sync + Send>> {
    let word = |i: usize| -> Result<i16, Box<dyn std::error::Error + Sync + Send>> {
        let b = raw.get(i * 2..i * 2 + 2).ok_or("short numeric")?;
        Ok(i16::from_be_bytes([b[0], b[1]]))
    };
    let ndigits = word(0)? as usize;
    let weight = i32::from(word(1)?);
    let sign = word(2)? as u16;
    if sign == 0xC000 {
        return Ok(Val::Real(f64::NAN));
    }
    let mut value = 0f64;
    let mut int: Option<i128> = Some(0);
    for k in 0..ndigits {
        let d = i32::from(word(4 + k)?);
        let power = weight - k as i32;
        value += f64::from(d) * 10000f64.powi(power);
        int = match (int, power) {
            (Some(acc), p) if p >= 0 => Some(acc + i128::from(d) * 10000i128.pow(p as u32)),
            (acc, _) if d == 0 => acc,
            _ => None,
        };
    }
    let negative = sign == 0x4000;
    Ok(match int.and_then(|i| i64::try_from(i).ok()) {
        Some(i) => Val::Int(if negative { -i } else { i }),
        None => Val::Real(if negative { -value } else { value }),
    })
}

fn pg_rows(
    client: &mut postgres::Client,
    sql: &str,
    vals: &[Val],
) -> Result<Vec<Row>, postgres::Error> {
    let boxed: Vec<PgVal> = vals.iter().cloned().map(PgVal).collect();
    let refs: Vec<&(dyn postgres::types::ToSql + Sync)> = boxed
        .iter()
        .map(|v| v as &(dyn postgres::types::ToSql + Sync))
        .collect();
    let rows = client.query(sql, &refs)?;
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        let mut cells = Vec::with_capacity(row.len());
        for i in 0..row.len() {
            let v: AnyVal = row.try_get(i)?;
            cells.push(v.0);
        }
        out.push(Row(cells));
    }
    Ok(out)
}

#[test]
fn placeholders_are_rewritten_outside_literals() {
    assert_eq!(
        to_dollar_placeholders("SELECT ?1, '?2', \"a?\", ?12 FROM t WHERE x = ?1"),
        "SELECT $1, '?2', \"a?\", $12 FROM t WHERE x = $1"
    );
    assert_eq!(
        to_dollar_placeholders("SELECT 1 FROM t WHERE a = ? AND b = '?' AND c = ?"),
        "SELECT 1 FROM t WHERE a = $1 AND b = '?' AND c = $2"
    );
}

/// The helpers read the same values from both backends: integers
/// (bigint, int4, a numeric `sum`), text, bytes and NULL, with
/// parameters bound by the type the statement wants.
fn db_helpers_read_the_same_values_on_both(backend: Backend) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut db = match backend {
        Backend::Sqlite => Db::sqlite_rw(&dir.path().join("t.db")),
        Backend::Postgres => Db::postgres(&fresh_database()),
    };
    let blob = if backend.is_postgres() {
        "bytea"
    } else {
        "BLOB"
    };
    db.exec(
        &format!("CREATE TABLE t (id INTEGER, big BIGINT, name TEXT, body {blob})"),
        &[],
    );
    for (id, name) in [(1, Some("one")), (2, None)] {
        db.exec(
            "INSERT INTO t (id, big, name, body) VALUES (?1, ?2, ?3, ?4)",
            &[
                &id,
                &(id as i64 * 10_000_000_000),
                &name,
                &b"\x00\xffraw".to_vec(),
            ],
        );
    }
    assert_eq!(db.count("SELECT count(*) FROM t WHERE id >= ?1", &[&1]), 2);
    assert_eq!(db.count("SELECT sum(big) FROM t", &[]), 30_000_000_000);
    let row = db.one(
        "SELECT id, big, name, body FROM t WHERE name = ?1",
        &[&"one"],
    );
    assert_eq!(row.int(0), 1);
    assert_eq!(row.int(1), 10_000_000_000);
    assert_eq!(row.text(2), "one");
    assert_eq!(row.bytes(3).as_deref(), Some(&b"\x00\xffraw"[..]));
    assert_eq!(
        db.one("SELECT name FROM t WHERE id = ?1", &[&2])
            .opt_text(0),
        None
    );
    assert_eq!(
        db.texts("SELECT name FROM t ORDER BY id", &[]),
        ["one", "NULL"]
    );
    assert!(db.dump("SELECT id, name FROM t").contains("2 | NULL"));
}
both_backends!(db_helpers_read_the_same_values_on_both);
