//! idemhook: receive webhooks, verify them, and turn at-least-once delivery
//! into exactly-once effects, on one SQLite file in WAL mode or one
//! PostgreSQL database shared by several instances.
//!
//! See ARCHITECTURE.md for the map of modules and how a request flows.

// Tests may unwrap: a panic there is the failure report.
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

pub mod catchup;
pub mod cli;
pub mod config;
pub mod failpoint;
pub mod http;
pub mod log;
pub mod metrics;
pub mod notify;
pub mod ops;
pub mod outbox;
pub mod receive;
pub mod send;
pub mod serve;
pub mod state;
pub mod store;
pub mod time;
pub mod verify;
