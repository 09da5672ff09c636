//! The original kinds' rows, as rules: each one's vectors and malformed
//! headers, as they were checked when each kind was code of its own.

mod github;
mod linear;
mod paddle;
mod shopify;
mod slack;
mod standard;
mod stripe;
