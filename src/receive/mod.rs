//! A delivery's path from its verified request to its stored event: what
//! identifies the event and what a duplicate must match (`key`: ids,
//! types, payload hashes, pure), and the claim (`ingest`: the one
//! transaction step that stores it, exactly once).
//!
//! Verifying the signature and reading the request's headers are
//! `verify/`'s, the HTTP pipeline that calls
//! these `http/hooks/`'s, the SQL of each step `store/`'s.

pub mod ingest;
pub mod key;
