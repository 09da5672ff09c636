//! SQLite: the claim's and the outbox's statements ([`SqliteTx`]), the one
//! writer that commits them in groups (`writer/`), and the [`Sqlite`]
//! backend a `serve` on a file runs on.

mod tx;
pub mod writer;

pub use tx::{DUE_JOBS, EXPIRED_JOBS, SqliteTx, to_sql_value};
