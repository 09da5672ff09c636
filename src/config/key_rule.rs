//! A source's key, type and hash rules as the config states them: a
//! *part* names one value, `json:/pointer` (RFC 6901) in the body,
//! `header:Name`, `form:Name` or `body:sha256`; `a|b` means "a, or b when
//! a is absent"; a key rule of several parts makes a derived key. Parsed
//! and printed here; what a rule finds in a request is `receive/key.rs`'s
//! (`Part::lookup`, `Rule::extract`).

use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Atom {
    Json(String),
    Header(String),
    /// A field of an `application/x-www-form-urlencoded` body.
    Form(String),
    /// The hex SHA-256 of the raw body (`body:sha256`): the id of
    /// providers whose events carry none and are resent byte for byte.
    BodySha256,
}

/// One value, with fallbacks tried in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    pub alternatives: Vec<Atom>,
}

/// The idempotency key rule of a source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub parts: Vec<Part>,
}

impl Part {
    pub fn parse(spec: &str) -> Result<Part, String> {
        let mut alternatives = Vec::new();
        for alt in spec.split('|') {
            let alt = alt.trim();
            let atom = if let Some(ptr) = alt.strip_prefix("json:") {
                if !(ptr.is_empty() || ptr.starts_with('/')) {
                    return Err(format!(
                        "{alt:?}: a JSON pointer starts with / (RFC 6901), e.g. json:/id"
                    ));
                }
                Atom::Json(ptr.to_string())
            } else if let Some(name) = alt.strip_prefix("header:") {
                if name.is_empty() || !name.bytes().all(|b| b.is_ascii_graphic() && b != b':') {
                    return Err(format!("{alt:?}: not a valid header name"));
                }
                Atom::Header(name.to_string())
            } else if let Some(name) = alt.strip_prefix("form:") {
                if name.is_empty() {
                    return Err(format!(
                        "{alt:?}: a form field needs a name, e.g. form:MessageStatus"
                    ));
                }
                Atom::Form(name.to_string())
            } else if alt == "body:sha256" {
                Atom::BodySha256
            } else {
                return Err(format!(
                    "{alt:?}: expected json:/pointer, header:Name, form:Name or body:sha256"
                ));
            };
            alternatives.push(atom);
        }
        Ok(Part { alternatives })
    }

    pub fn reads_json(&self) -> bool {
        self.alternatives.iter().any(|a| matches!(a, Atom::Json(_)))
    }

    /// True when the part reads form fields.
    pub fn reads_form(&self) -> bool {
        self.alternatives.iter().any(|a| matches!(a, Atom::Form(_)))
    }
}

impl fmt::Display for Atom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Atom::Json(p) => write!(f, "json:{p}"),
            Atom::Header(h) => write!(f, "header:{h}"),
            Atom::Form(name) => write!(f, "form:{name}"),
            Atom::BodySha256 => f.write_str("body:sha256"),
        }
    }
}

impl fmt::Display for Part {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, a) in self.alternatives.iter().enumerate() {
            if i > 0 {
                f.write_str("|")?;
            }
            write!(f, "{a}")?;
        }
        Ok(())
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.parts.len() > 1 {
            f.write_str("sha256(")?;
        }
        for (i, p) in self.parts.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{p}")?;
        }
        if self.parts.len() > 1 {
            f.write_str(")")?;
        }
        Ok(())
    }
}
