//! PostgreSQL's side of the query layer ([`DriverMut`] for a client,
//! `?N` rewritten to `$N`, values bound as the inferred type), and an
//! operator command's connection and transactions (see `store::db` for
//! why they run at READ COMMITTED).

use std::any::Any;
use std::error::Error as StdError;

use postgres::Client;
use postgres::types::private::BytesMut;
use postgres::types::{IsNull, ToSql, Type, to_sql_checked};

use super::is_retryable_store;
use crate::store::db::{Db, Dialect, DriverMut, Row, TxError, Value, to_dollars};
use crate::store::{StoreError, StoreErrorKind};

impl<'c> Db<'c> {
    pub fn postgres(client: &'c mut Client) -> Db<'c> {
        Db::held(client)
    }
}

impl DriverMut for Client {
    fn dialect(&self) -> Dialect {
        Dialect::Postgres
    }

    fn query(&mut self, sql: &str, args: &[Value]) -> Result<Vec<Row>, StoreError> {
        let sql = to_dollars(sql)?;
        let refs: Vec<&(dyn ToSql + Sync)> =
            args.iter().map(|v| v as &(dyn ToSql + Sync)).collect();
        let rows = Client::query(self, sql.as_str(), &refs)?;
        rows.iter().map(from_postgres).collect()
    }

    fn execute(&mut self, sql: &str, args: &[Value]) -> Result<u64, StoreError> {
        let sql = to_dollars(sql)?;
        let refs: Vec<&(dyn ToSql + Sync)> =
            args.iter().map(|v| v as &(dyn ToSql + Sync)).collect();
        Ok(Client::execute(self, sql.as_str(), &refs)?)
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
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
    super::retrying(
        PG_WRITE_ATTEMPTS - 1,
        super::short_pause,
        |e: &E| e.as_store().is_some_and(is_retryable_store),
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

/// Connects an operator command to PostgreSQL. With `read_only` every
/// transaction of the session is read-only. A database `serve` never
/// migrated is refused, as SQLite refuses a missing file.
pub fn connect_postgres(
    url: &crate::config::database_url::PostgresUrl,
    durability: crate::config::Durability,
    busy_timeout: std::time::Duration,
    read_only: bool,
) -> Result<Client, StoreError> {
    let settings =
        super::Settings::from_url(url, durability, busy_timeout).map_err(StoreError::other)?;
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
    let latest = super::MIGRATIONS.last().map_or(0, |m| m.0);
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
