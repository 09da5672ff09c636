//! The tests that only PostgreSQL has, against the throwaway test cluster
//! (`tests/support/pg_cluster.rs`; SKIPPED loudly without one, a failure
//! under `CI=true`). Tests that run on both backends stay with their area
//! (`backend::both_backends!`).

mod commands;
mod engine;
mod failover;
mod housekeeping;
mod listen_notify;
mod replay;
mod schema;
mod serve;

/// The one integer a query answers (a `count(*)`, a sum, a time), or a
/// panic that names the query.
pub fn count(
    db: &mut postgres::Client,
    sql: &str,
    params: &[&(dyn postgres::types::ToSql + Sync)],
) -> i64 {
    db.query_one(sql, params)
        .unwrap_or_else(|e| panic!("{sql}: {e:?}"))
        .get(0)
}
