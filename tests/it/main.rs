//! The one integration test binary: it runs the real `idemhook` binary
//! (found through `CARGO_BIN_EXE_idemhook`) and checks its external contract
//! (routes, status codes, JSON shapes, config keys, commands, metric names)
//! by HTTP, the CLI and the database. One module per area;
//! shared fixtures in `harness`, the steps several modules take (a signed
//! delivery, a job's status, an admin call) in `helpers`, independent
//! signers in `sign`, a fake downstream in `downstream`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod backend;
mod brokers;
mod catchup;
mod check;
mod circuit;
mod cli;
mod clock;
mod control;
mod database;
mod dest;
mod dest_brokers;
mod downstream;
mod edge;
mod first_hour;
mod generic;
mod harden;
mod harness;
mod helpers;
mod hostile;
mod inspector;
mod metrics;
mod notifications;
mod ops;
mod outbox;
mod pg;
#[path = "../support/pg_cluster.rs"]
mod pg_cluster;
mod powerloss;
mod providers;
mod receiver;
mod rejected;
mod send;
mod sign;
mod store;
mod tls;
mod tooling;
