//! Storage: every SQL statement of idemhook runs under here (but for
//! the tests'). The root is the seam and what both backends share:
//! `backend.rs` (what a running `serve` asks of its storage), `tx.rs`
//! (the claim's and the outbox's steps), `db.rs` (the query layer, its
//! rows and values, and the `?N` to `$N` rewrite), a module per table
//! whose statements are written once, and here the storage errors,
//! sorted by what a caller does about them. The wings implement the seam:
//! `sqlite/` (the claim's statements, the group-commit writer) and
//! `postgres/` (settings, migrations, the claimers, transactions,
//! housekeeping). The wings import the root, never the other way round,
//! but for `open.rs`, the one place that picks a backend. Nothing here
//! knows HTTP or what a claim decides.

pub mod attempts;
pub mod backend;
pub mod catchup;
pub mod circuits;
pub mod control;
pub mod db;
pub mod deliveries;
pub mod events;
pub mod incidents;
pub mod jobs;
pub mod meta;
pub mod named;
pub mod notifications;
pub mod open;
pub mod paused;
#[cfg(test)]
#[path = "../../tests/support/pg_cluster.rs"]
pub(crate) mod pg_cluster;
pub mod postgres;
pub mod prune;
pub mod rejected;
pub mod replays;
pub mod rules;
pub mod sqlite;
pub mod tx;

pub use backend::Guard;

/// Why storage failed, sorted by what the caller should do about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreErrorKind {
    /// Locked by another connection past the busy timeout.
    Busy,
    /// Disk or database full.
    Full,
    /// The file system failed a read, write or sync (EIO, or a write it
    /// refused, such as EPERM on an immutable file).
    Io,
    /// The file or its folder cannot be written.
    ReadOnly,
    /// The writer has stopped (shutdown).
    Closed,
    /// Anything else: a bug, corruption, a constraint we did not expect.
    Other,
}

/// A storage failure. Transient kinds (busy, full, I/O, read-only) are answered
/// 503 with Retry-After; the message is for the operator's log.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct StoreError {
    pub kind: StoreErrorKind,
    pub message: String,
}

impl StoreError {
    pub fn closed() -> StoreError {
        StoreError {
            kind: StoreErrorKind::Closed,
            message: "the database writer has stopped".to_string(),
        }
    }

    pub fn other(message: impl Into<String>) -> StoreError {
        StoreError {
            kind: StoreErrorKind::Other,
            message: message.into(),
        }
    }
}

/// A stored word this build does not know, read back from a row: a
/// storage error naming it (the claim's and the outbox's own reads on
/// PostgreSQL; `db::Row::word` adds the column).
impl From<crate::state::UnknownWord> for StoreError {
    fn from(e: crate::state::UnknownWord) -> StoreError {
        StoreError::other(e.to_string())
    }
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> StoreError {
        use rusqlite::ErrorCode;
        let kind = match e.sqlite_error_code() {
            Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => StoreErrorKind::Busy,
            Some(ErrorCode::DiskFull) => StoreErrorKind::Full,
            Some(ErrorCode::ReadOnly | ErrorCode::CannotOpen | ErrorCode::PermissionDenied) => {
                StoreErrorKind::ReadOnly
            }
            Some(ErrorCode::SystemIoFailure) => StoreErrorKind::Io,
            _ => StoreErrorKind::Other,
        };
        StoreError {
            kind,
            message: e.to_string(),
        }
    }
}

/// A SQLite error as a [`StoreError`] whose message carries its causes
/// too (SQLite's code beside its words): the line anyhow's `{:#}` prints
/// for the rusqlite error itself, so `migrate` and `backup` say what they
/// said before their statements moved here.
pub(crate) fn with_causes(e: rusqlite::Error) -> StoreError {
    let mut message = e.to_string();
    let mut cause = std::error::Error::source(&e);
    while let Some(c) = cause {
        message.push_str(&format!(": {c}"));
        cause = c.source();
    }
    StoreError {
        message,
        ..StoreError::from(e)
    }
}
