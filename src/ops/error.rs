//! [`OpError`]: why an operation could not do what it was asked, sorted
//! by who should fix it. The admin API answers it as an HTTP status; the
//! CLI's commands turn it into a `CommandError`.

use crate::catchup::RunError;
use crate::ops::text::clean;
use crate::store::StoreError;
use crate::store::db::TxError;

/// Why an operator command could not do what it was asked.
#[derive(Debug, thiserror::Error)]
pub enum OpError {
    /// The event, source or action named does not exist (CLI exit 1, API 404).
    #[error("{0}")]
    NotFound(String),
    /// The request does not make sense (CLI exit 1, API 400).
    #[error("{0}")]
    Invalid(String),
    /// Storage failed (CLI exit 2, API 503).
    #[error("{0}")]
    Store(#[from] StoreError),
}

impl TxError for OpError {
    fn as_store(&self) -> Option<&StoreError> {
        match self {
            OpError::Store(e) => Some(e),
            OpError::NotFound(_) | OpError::Invalid(_) => None,
        }
    }
}

/// A catch-up run's error, as the command and the admin API sort it.
impl From<RunError> for OpError {
    fn from(e: RunError) -> OpError {
        match e {
            RunError::NotFound(m) => OpError::NotFound(m),
            RunError::Invalid(m) => OpError::Invalid(m),
            RunError::Store(e) => OpError::Store(e),
        }
    }
}

/// The error for an event that is not stored.
pub fn not_found(source: &str, event_id: &str) -> OpError {
    OpError::NotFound(format!(
        "no event {}/{} (never received, or pruned past its retention)",
        clean(source),
        clean(event_id)
    ))
}
