//! Comparing a value a request carries with a shared secret (a token, a
//! `verify_token`, Graph's `clientState`): the SHA-256 digests of both are
//! compared in constant time, so neither the secret's length nor a prefix
//! of it shows in how long the answer takes.

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq as _;

/// Whether `given` equals `secret`, told without leaking either's length.
pub fn same_secret(given: &[u8], secret: &[u8]) -> bool {
    let a = Sha256::digest(given);
    let b = Sha256::digest(secret);
    bool::from(a.as_slice().ct_eq(b.as_slice()))
}

#[cfg(test)]
mod tests {
    use super::same_secret;

    #[test]
    fn equal_only_when_equal_whatever_the_lengths() {
        assert!(same_secret(b"token-123", b"token-123"));
        assert!(!same_secret(b"token-12", b"token-123"));
        assert!(!same_secret(b"", b"token-123"));
        assert!(!same_secret(b"token-1234", b"token-123"));
    }
}
