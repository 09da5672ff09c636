//! Operator commands: they work on the database directly and are safe
//! while `serve` runs (WAL, busy timeout; the claim's PRIMARY KEY stays the
//! final barrier). The admin API calls the same functions.
//!
//! Each command's module plans, applies and reports (the JSON the API
//! answers too); its `cmd` prints the human view and returns an
//! [`Outcome`] or a [`CommandError`], which `cli` alone turns into an exit
//! code. Shared by all of them: [`OpError`] (`error`), opening the
//! database (`open`), terminal output (`text`).

pub mod backup;
pub mod catchup;
pub mod catchup_status;
pub mod check;
pub mod command;
pub mod erase;
pub mod error;
pub mod inspect;
pub mod inspector;
pub mod migrate;
pub mod notify;
pub mod open;
pub mod pause;
pub mod probe;
pub mod prune;
pub mod reconcile;
pub mod reingest;
pub mod rejected;
pub mod replay;
pub mod resolve;
pub mod text;
pub mod tooling;

pub use command::{CommandError, Outcome};
pub use error::OpError;
