//! What an operator command returns to `cli`: an [`Outcome`] when it ran,
//! a [`CommandError`] when it stopped. `cli` alone turns either into the
//! process's exit code and prints the error, once; the commands only say
//! which kind of failure it was.
//!
//! The admin API does not use these: it answers [`OpError`] as HTTP.

use crate::ops::error::OpError;
use crate::ops::text::Unwritten;
use crate::store::StoreError;

/// How a command that ran to its end ends.
#[must_use]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Exit 0.
    Done,
    /// Exit 1: the command ran, and what it reports needs the operator
    /// (an SQL job that failed again, jobs `reconcile` found stuck or
    /// failed, an answer that was not 2xx).
    Attention,
}

/// Why a command stopped. Each variant is one exit code and one stderr
/// line (`idemhook: ...`), both decided in `cli`.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    /// The event, source, action or job named does not exist (exit 1).
    #[error("{0}")]
    NotFound(String),
    /// What was asked does not make sense for what is stored, or a filter
    /// is malformed (exit 1).
    #[error("{0}")]
    Invalid(String),
    /// The command cannot run as given: a bad argument, a refused target
    /// or backend (exit 2).
    #[error("{0}")]
    Usage(String),
    /// Storage failed (exit 2), printed as `storage error: ...`.
    #[error("storage error")]
    Storage(#[source] StoreError),
    /// Anything else that kept the command from running: the config, the
    /// database could not be opened, a file, the network (exit 2), printed
    /// with its context chain.
    #[error(transparent)]
    Failed(anyhow::Error),
    /// Writing the command's output failed. A reader that went away
    /// (`BrokenPipe`: `idemhook events list | head -1`) ends the command
    /// quietly with exit 0; anything else (a full disk) is exit 2.
    #[error("cannot write the output: {0}")]
    Output(#[from] std::io::Error),
}

impl CommandError {
    /// True for output into a pipe whose reader has gone: not a failure.
    pub fn is_closed_pipe(&self) -> bool {
        matches!(self, CommandError::Output(e) if e.kind() == std::io::ErrorKind::BrokenPipe)
    }
}

impl From<OpError> for CommandError {
    fn from(e: OpError) -> CommandError {
        match e {
            OpError::NotFound(m) => CommandError::NotFound(m),
            OpError::Invalid(m) => CommandError::Invalid(m),
            OpError::Store(e) => CommandError::Storage(e),
        }
    }
}

/// An `anyhow::Error` is `Failed`, but for a failed write of the output
/// ([`Unwritten`]), which is `Output` as a plain `io::Error` is.
impl From<anyhow::Error> for CommandError {
    fn from(e: anyhow::Error) -> CommandError {
        match e.downcast::<Unwritten>() {
            Ok(Unwritten(io)) => CommandError::Output(io),
            Err(e) => CommandError::Failed(e),
        }
    }
}

impl From<StoreError> for CommandError {
    fn from(e: StoreError) -> CommandError {
        CommandError::Storage(e)
    }
}

impl CommandError {
    /// `OpError` for a command whose bad arguments exit 2: `Invalid`
    /// becomes `Usage`; the rest as [`From`] has them.
    pub fn invalid_as_usage(e: OpError) -> CommandError {
        match e {
            OpError::Invalid(m) => CommandError::Usage(m),
            other => other.into(),
        }
    }
}
