//! What data cannot say: a provider whose signature no [`SignedRule`]
//! describes is code behind the small [`Code`] trait, one file each
//! (Twilio's sorted form parameters, HubSpot's v1/v2, Adyen's per-item
//! HMAC, Graph's `clientState`). Every other provider is a rule, as data
//! (`super::rule`).
//!
//! [`SignedRule`]: super::rule::SignedRule

mod adyen;
mod hubspot;
mod msgraph;
mod twilio;

use std::fmt;

use super::{Key, Request, Verdict, Verifier, VerifyError};

/// A provider's signature scheme as code: verifying, signing for `send`,
/// and what `check` says of it.
pub trait Code: Sync {
    /// The config `kind` it is the scheme of.
    fn kind(&self) -> &'static str;
    /// The rule in one line, for `check`.
    fn describe(&self) -> &'static str;
    fn verify(
        &self,
        verifier: &Verifier,
        rq: &Request<'_>,
        now: i64,
    ) -> Result<Verdict, VerifyError>;
    /// The signature headers the provider would send (none when it signs
    /// inside the body or not at all).
    fn sign(
        &self,
        _verifier: &Verifier,
        _rq: &Request<'_>,
        _now: i64,
        _id: &str,
    ) -> Result<Vec<(String, String)>, String> {
        Ok(Vec::new())
    }
    /// The body as the provider would send it (Adyen signs inside it).
    fn sign_body(&self, _verifier: &Verifier, body: &[u8], _now: i64) -> Result<Vec<u8>, String> {
        Ok(body.to_vec())
    }
    /// One configured secret as a key: its text, unless the provider says
    /// otherwise.
    fn decode_key(&self, secret: &str) -> Result<Key, String> {
        Ok(Key::Hmac(secret.as_bytes().to_vec()))
    }
    fn signs_timestamp(&self) -> bool {
        false
    }
    /// True when the signature covers the URL the provider called.
    fn covers_url(&self) -> bool {
        false
    }
}

impl fmt::Debug for dyn Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Code({})", self.kind())
    }
}

impl PartialEq for dyn Code {
    fn eq(&self, other: &dyn Code) -> bool {
        self.kind() == other.kind()
    }
}

impl Eq for dyn Code {}

pub static TWILIO: &dyn Code = &twilio::Twilio;
pub static HUBSPOT: &dyn Code = &hubspot::Hubspot;
pub static ADYEN: &dyn Code = &adyen::Adyen;
pub static MSGRAPH: &dyn Code = &msgraph::Msgraph;
