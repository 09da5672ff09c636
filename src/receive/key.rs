//! Idempotency keys, event types and payload hashes: what identifies an
//! event and what a duplicate must match. Pure functions over an already
//! verified request; no IO.
//!
//! The rules themselves ([`Part`], [`Rule`]) are the config's
//! (`config/key_rule.rs`, re-exported here); this module is what they find
//! in a request. A key rule of one part uses that value as the event id;
//! several parts make a derived key (see [`Rule::extract`]).

use std::borrow::Cow;
use std::fmt;

use serde::Deserialize as _;
use serde::de::{Deserializer as _, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};

use crate::config::Source;
pub use crate::config::key_rule::{Atom, Part, Rule};
use crate::verify::headers::header_values;

/// Longest event id we store; longer ids are refused as malformed.
pub const MAX_EVENT_ID_BYTES: usize = 512;

/// What a request looks like to the extractors.
#[derive(Default)]
pub struct Input<'a> {
    pub headers: &'a [(String, String)],
    /// The body as JSON, when the source reads JSON.
    pub json: Option<Json<'a>>,
    /// The body's form fields, when it is form-encoded.
    pub form: Option<&'a [(String, String)]>,
    /// The raw body (of a batch's item: its JSON text as sent).
    pub body: &'a [u8],
}

/// A JSON body: parsed into a tree (when SQL actions bind its values), or
/// validated but left as text, with only the values a rule names parsed
/// out of it. The second is several times cheaper for the common rules
/// (`json:/id`, `json:/type`) on a 1.5 KiB event.
#[derive(Clone, Copy)]
pub enum Json<'a> {
    Parsed(&'a Value),
    Raw(&'a RawDoc<'a>),
}

impl Json<'_> {
    /// The value at an RFC 6901 pointer.
    pub fn pointer(&self, ptr: &str) -> Option<Cow<'_, Value>> {
        match self {
            Json::Parsed(v) => v.pointer(ptr).map(Cow::Borrowed),
            Json::Raw(doc) => doc.pointer(ptr).map(Cow::Owned),
        }
    }
}

/// A JSON text checked in one pass. When it is an object, that pass also
/// notes where each top-level member's value lies, so a pointer starts
/// there instead of scanning the body again: the key and the type rule
/// then cost a lookup each, not a pass each.
pub struct RawDoc<'a> {
    text: &'a str,
    /// The top-level members in document order, values unparsed; `None`
    /// when the text is not an object.
    members: Option<Vec<(Cow<'a, str>, &'a RawValue)>>,
}

impl<'a> RawDoc<'a> {
    /// Checks that `text` is one JSON value. Nesting is bounded by
    /// serde_json's own recursion limit; callers that want a lower one
    /// check it first.
    pub fn parse(text: &'a str) -> Result<RawDoc<'a>, serde_json::Error> {
        let mut de = serde_json::Deserializer::from_str(text);
        let members = if text.trim_start().starts_with('{') {
            Some(de.deserialize_map(Members)?)
        } else {
            IgnoredAny::deserialize(&mut de)?;
            None
        };
        de.end()?;
        Ok(RawDoc { text, members })
    }

    /// Walks `ptr` one level at a time, skipping what it does not need
    /// without building it, and parses only the value found. Agrees with
    /// `Value::pointer` (same array-index rule, last duplicate key wins);
    /// the unit test and the `key` fuzz target compare the two.
    fn pointer(&self, ptr: &str) -> Option<Value> {
        if ptr.is_empty() {
            return serde_json::from_str(self.text).ok();
        }
        let mut tokens = ptr.strip_prefix('/')?.split('/').map(unescape);
        let mut current: &RawValue = match &self.members {
            Some(members) => {
                let first = tokens.next()?;
                members.iter().rev().find(|(k, _)| *k == first)?.1
            }
            None => child(serde_json::from_str(self.text).ok()?, &tokens.next()?)?,
        };
        for token in tokens {
            current = child(current, &token)?;
        }
        serde_json::from_str(current.get()).ok()
    }
}

/// A pointer token's text (RFC 6901: `~1` is `/`, `~0` is `~`).
fn unescape(token: &str) -> Cow<'_, str> {
    if token.contains('~') {
        Cow::Owned(token.replace("~1", "/").replace("~0", "~"))
    } else {
        Cow::Borrowed(token)
    }
}

/// The member `token` of a raw object, or element `token` of a raw array.
fn child<'a>(raw: &'a RawValue, token: &str) -> Option<&'a RawValue> {
    let text = raw.get();
    let mut de = serde_json::Deserializer::from_str(text);
    match text.trim_start().as_bytes().first()? {
        b'{' => de.deserialize_map(FindMember(token)).ok()?,
        b'[' => {
            // As serde_json's pointer: no sign, no leading zeros.
            if token.starts_with('+') || (token.starts_with('0') && token.len() > 1) {
                return None;
            }
            de.deserialize_seq(FindElement(token.parse().ok()?)).ok()?
        }
        _ => None,
    }
}

/// Collects an object's members, values unparsed (but checked).
struct Members;

impl<'de> Visitor<'de> for Members {
    type Value = Vec<(Cow<'de, str>, &'de RawValue)>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut members = Vec::with_capacity(16);
        while let Some(key) = map.next_key::<Key<'de>>()? {
            members.push((key.0, map.next_value::<&'de RawValue>()?));
        }
        Ok(members)
    }
}

struct FindMember<'t>(&'t str);

impl<'de> Visitor<'de> for FindMember<'_> {
    type Value = Option<&'de RawValue>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut found = None;
        while let Some(key) = map.next_key::<Key<'de>>()? {
            if key.0 == self.0 {
                // The last of duplicate keys wins, as in a parsed Value.
                found = Some(map.next_value::<&'de RawValue>()?);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(found)
    }
}

struct FindElement(usize);

impl<'de> Visitor<'de> for FindElement {
    type Value = Option<&'de RawValue>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON array")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut found = None;
        let mut index = 0;
        loop {
            if index == self.0 {
                match seq.next_element::<&'de RawValue>()? {
                    Some(v) => found = Some(v),
                    None => break,
                }
            } else if seq.next_element::<IgnoredAny>()?.is_none() {
                break;
            }
            index += 1;
        }
        Ok(found)
    }
}

/// An object key, borrowed from the text unless it has escapes.
struct Key<'de>(Cow<'de, str>);

impl<'de> serde::Deserialize<'de> for Key<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v.to_string())))
            }
        }
        d.deserialize_str(KeyVisitor)
    }
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("no event id: {0} is missing or empty")]
    Missing(String),
    #[error("duplicate header {0}: the event id is ambiguous")]
    RepeatedHeader(String),
    #[error("event id is longer than {MAX_EVENT_ID_BYTES} bytes")]
    TooLong,
    #[error("event id contains a control character")]
    ControlCharacter,
    #[error("event id must be text or a number: {0} is an object, array, boolean or null")]
    NotScalar(String),
}

impl Part {
    /// The first alternative present in the request.
    pub fn lookup<'a>(&self, input: &'a Input<'a>) -> Option<Found<'a>> {
        for atom in &self.alternatives {
            match atom {
                Atom::Json(ptr) => {
                    if let Some(v) = input.json.as_ref().and_then(|j| j.pointer(ptr)) {
                        return Some(Found::Json(v));
                    }
                }
                Atom::Header(name) => {
                    if let Some(v) = header_values(input.headers, name).next() {
                        return Some(Found::Header(v));
                    }
                }
                Atom::Form(name) => {
                    if let Some((_, v)) = input.form.and_then(|f| f.iter().find(|(k, _)| k == name))
                    {
                        return Some(Found::Header(v));
                    }
                }
                Atom::BodySha256 => {
                    return Some(Found::Text(hex::encode(Sha256::digest(input.body))));
                }
            }
        }
        None
    }

    /// The value as text: strings as their contents, numbers as written,
    /// other JSON as compact JSON text.
    pub fn text(&self, input: &Input<'_>) -> Option<String> {
        self.lookup(input).map(|f| f.text())
    }

    /// A header this part reads that the request carries more than once
    /// (lowercased): which value was meant is ambiguous, so the key and
    /// type rules refuse it, as the schemes refuse a repeated signature.
    pub fn repeated_header(&self, headers: &[(String, String)]) -> Option<String> {
        self.alternatives.iter().find_map(|atom| match atom {
            Atom::Header(name) => {
                (header_values(headers, name).nth(1).is_some()).then(|| name.to_ascii_lowercase())
            }
            Atom::Json(_) | Atom::Form(_) | Atom::BodySha256 => None,
        })
    }
}

/// A value found in a request.
pub enum Found<'a> {
    Json(Cow<'a, Value>),
    Header(&'a str),
    /// A value computed from the request (`body:sha256`).
    Text(String),
}

impl Source {
    /// The event type of `input`: the type rule's value, and each further
    /// part joined with `.` when present (GoCardless's `resource_type` +
    /// `action`).
    pub fn type_of(&self, input: &Input<'_>) -> Option<String> {
        let first = self.event_type.as_ref()?.text(input);
        self.event_type_more
            .iter()
            .fold(first, |acc, more| match (acc, more.text(input)) {
                (Some(a), Some(m)) => Some(format!("{a}.{m}")),
                (a, m) => a.or(m),
            })
    }
}

impl Found<'_> {
    pub fn text(&self) -> String {
        match self {
            Found::Json(v) => match v.as_ref() {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            },
            Found::Header(s) => (*s).to_string(),
            Found::Text(s) => s.clone(),
        }
    }
}

impl Rule {
    /// The event id for this request.
    ///
    /// One part: its value, verbatim (a JSON string's contents or a number's
    /// digits). Several parts: the hex SHA-256 of the parts' values, each
    /// written as `<byte length>:<value>` and concatenated in rule order, so
    /// that no two different tuples share a key.
    pub fn extract(&self, input: &Input<'_>) -> Result<String, KeyError> {
        let mut values = Vec::with_capacity(self.parts.len());
        for part in &self.parts {
            if let Some(name) = part.repeated_header(input.headers) {
                return Err(KeyError::RepeatedHeader(name));
            }
            let found = part
                .lookup(input)
                .ok_or_else(|| KeyError::Missing(part.to_string()))?;
            let text = match &found {
                Found::Json(v) if !(v.is_string() || v.is_number()) => {
                    return Err(KeyError::NotScalar(part.to_string()));
                }
                other => other.text(),
            };
            if text.is_empty() {
                return Err(KeyError::Missing(part.to_string()));
            }
            values.push(text);
        }
        if values.len() == 1 {
            let id = values.pop().unwrap_or_default();
            if id.len() > MAX_EVENT_ID_BYTES {
                return Err(KeyError::TooLong);
            }
            // The id travels in forwarded requests' headers, where a
            // control character cannot go: refused now, not at every
            // forward attempt.
            if id.chars().any(|c| c.is_ascii_control()) {
                return Err(KeyError::ControlCharacter);
            }
            return Ok(id);
        }
        let mut hasher = Sha256::new();
        for v in &values {
            hasher.update(v.len().to_string().as_bytes());
            hasher.update(b":");
            hasher.update(v.as_bytes());
        }
        Ok(hex::encode(hasher.finalize()))
    }
}

/// The payload hash: hex SHA-256 of the whole body when `parts` is empty,
/// else of each part's value written as compact JSON (absent parts as
/// `null`), length-prefixed like a derived key.
pub fn payload_hash(parts: &[Part], body: &[u8], input: &Input<'_>) -> String {
    let mut hasher = Sha256::new();
    if parts.is_empty() {
        hasher.update(body);
    } else {
        for part in parts {
            let text = match part.lookup(input) {
                Some(Found::Json(v)) => canonical_json(&v),
                Some(Found::Header(h)) => Value::String(h.to_string()).to_string(),
                Some(Found::Text(t)) => Value::String(t).to_string(),
                None => "null".to_string(),
            };
            hasher.update(text.len().to_string().as_bytes());
            hasher.update(b":");
            hasher.update(text.as_bytes());
        }
    }
    hex::encode(hasher.finalize())
}

/// The payload hash of a body whose provider rewrites a few members on
/// every attempt (an attempt counter, a delivery time): the hex SHA-256 of
/// its canonical JSON (keys sorted) with the members at `without` removed.
/// A body that is not JSON is hashed whole.
pub fn payload_hash_without(without: &[&str], body: &[u8], input: &Input<'_>) -> String {
    let value = match input.json.as_ref().and_then(|j| j.pointer("")) {
        Some(v) => Some(v.into_owned()),
        None => serde_json::from_slice::<Value>(body).ok(),
    };
    let Some(mut value) = value else {
        return hex::encode(Sha256::digest(body));
    };
    for pointer in without {
        remove_pointer(&mut value, pointer);
    }
    hex::encode(Sha256::digest(canonical_json(&value).as_bytes()))
}

fn remove_pointer(value: &mut Value, pointer: &str) {
    let Some((parent, last)) = pointer.rsplit_once('/') else {
        return;
    };
    let last = unescape(last).into_owned();
    match value.pointer_mut(parent) {
        Some(Value::Object(map)) => {
            map.shift_remove(&last);
        }
        Some(Value::Array(items)) => {
            if let Ok(i) = last.parse::<usize>()
                && i < items.len()
            {
                items.remove(i);
            }
        }
        _ => {}
    }
}

/// A JSON value as compact text with every object's keys sorted and
/// numbers as written: the form hash parts (and SQL parameters bound from
/// objects) take, whatever order the body had. serde_json keeps the order
/// received (`preserve_order`, so `events show` prints a payload as it
/// came), so sorting is done here, explicitly.
pub fn canonical_json(v: &Value) -> String {
    let mut out = String::new();
    write_canonical(v, &mut out);
    out
}

fn write_canonical(v: &Value, out: &mut String) {
    match v {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                write_canonical(v, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(v, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rule(specs: &[&str]) -> Rule {
        Rule {
            parts: specs.iter().map(|s| Part::parse(s).unwrap()).collect(),
        }
    }

    /// A request with no headers and `body` as parsed JSON.
    fn parsed(body: &Value) -> Input<'_> {
        Input {
            headers: &[],
            json: Some(Json::Parsed(body)),
            ..Default::default()
        }
    }

    #[test]
    fn single_part_is_verbatim() {
        let body = json!({"id": "evt_1", "n": 42, "obj": {"a": 1}});
        let headers = vec![("X-Delivery".to_string(), "d-1".to_string())];
        let input = Input {
            headers: &headers,
            json: Some(Json::Parsed(&body)),
            ..Default::default()
        };
        assert_eq!(rule(&["json:/id"]).extract(&input), Ok("evt_1".into()));
        assert_eq!(rule(&["json:/n"]).extract(&input), Ok("42".into()));
        assert_eq!(
            rule(&["header:x-delivery"]).extract(&input),
            Ok("d-1".into())
        );
        assert_eq!(
            rule(&["header:X-Missing|json:/id"]).extract(&input),
            Ok("evt_1".into())
        );
        assert!(matches!(
            rule(&["json:/obj"]).extract(&input),
            Err(KeyError::NotScalar(_))
        ));
        assert!(matches!(
            rule(&["json:/nope"]).extract(&input),
            Err(KeyError::Missing(_))
        ));
    }

    /// Numeric ids keep the digits as sent: two ids that differ only past
    /// what an f64 or u64 holds are two events, not one. (An exponent is
    /// written `e+N` or `e-N`.)
    #[test]
    fn numeric_ids_are_kept_as_written() {
        let ids = [
            "1.50",
            "1e+3",
            "2.5e-07",
            "-9223372036854775809",
            "18446744073709551616",
            "18446744073709551617",
            "123456789012345678901234567890",
            "123456789012345678901234567891",
            "9007199254740993",
        ];
        for id in ids {
            let text = format!(r#"{{"id": {id}}}"#);
            let doc = RawDoc::parse(&text).unwrap();
            let parsed: Value = serde_json::from_str(&text).unwrap();
            for json in [Json::Raw(&doc), Json::Parsed(&parsed)] {
                let input = Input {
                    headers: &[],
                    json: Some(json),
                    ..Default::default()
                };
                assert_eq!(rule(&["json:/id"]).extract(&input), Ok(id.to_string()));
            }
        }
        let spelled: Value = serde_json::from_str(r#"{"id": 1E3}"#).unwrap();
        let input = parsed(&spelled);
        assert_eq!(rule(&["json:/id"]).extract(&input), Ok("1e+3".to_string()));
    }

    #[test]
    fn an_id_with_a_control_character_is_refused() {
        for id in ["a\nb", "a\u{0}b", "a\u{7}b", "a\u{7f}b", "a\tb"] {
            let body = json!({ "id": id });
            let input = parsed(&body);
            assert_eq!(
                rule(&["json:/id"]).extract(&input),
                Err(KeyError::ControlCharacter),
                "{id:?}"
            );
        }
        // Not ASCII, not control: fine.
        let body = json!({ "id": "évt-ü" });
        let input = parsed(&body);
        assert_eq!(rule(&["json:/id"]).extract(&input), Ok("évt-ü".into()));
    }

    #[test]
    fn a_repeated_key_header_is_ambiguous() {
        let body = json!({"id": "evt_1"});
        for second in ["d-2", "d-1"] {
            let headers = vec![
                ("X-Delivery".to_string(), "d-1".to_string()),
                ("x-delivery".to_string(), second.to_string()),
            ];
            let input = Input {
                headers: &headers,
                json: Some(Json::Parsed(&body)),
                ..Default::default()
            };
            assert_eq!(
                rule(&["header:X-Delivery"]).extract(&input),
                Err(KeyError::RepeatedHeader("x-delivery".into()))
            );
            assert_eq!(
                rule(&["json:/id", "header:X-Delivery"]).extract(&input),
                Err(KeyError::RepeatedHeader("x-delivery".into()))
            );
            // A rule that does not read the header does not care.
            assert_eq!(rule(&["json:/id"]).extract(&input), Ok("evt_1".into()));
        }
    }

    #[test]
    fn derived_key_is_unambiguous() {
        let a = json!({"x": "ab", "y": "c"});
        let b = json!({"x": "a", "y": "bc"});
        let r = rule(&["json:/x", "json:/y"]);
        let ka = r.extract(&parsed(&a)).unwrap();
        let kb = r.extract(&parsed(&b)).unwrap();
        assert_ne!(ka, kb);
        assert_eq!(ka.len(), 64);
        // The documented rule: sha256("2:ab" + "1:c").
        assert_eq!(ka, hex::encode(Sha256::digest(b"2:ab1:c")));
    }

    #[test]
    fn hash_default_is_body() {
        let input = Input {
            headers: &[],
            json: None,
            ..Default::default()
        };
        assert_eq!(
            payload_hash(&[], b"abc", &input),
            hex::encode(Sha256::digest(b"abc"))
        );
    }

    #[test]
    fn hash_fields_ignore_other_changes() {
        let a = json!({"type": "t", "data": {"x": 1}, "meta": 1});
        let b = json!({"type": "t", "data": {"x": 1}, "meta": 2});
        let c = json!({"type": "t", "data": {"x": 2}, "meta": 1});
        let parts = vec![
            Part::parse("json:/type").unwrap(),
            Part::parse("json:/data").unwrap(),
        ];
        let h = |v: &Value| payload_hash(&parts, b"", &parsed(v));
        assert_eq!(h(&a), h(&b));
        assert_ne!(h(&a), h(&c));
    }

    /// serde_json keeps the order received; a hash part is still written
    /// with its keys sorted, so a re-serialised body matches, and the hash
    /// of events stored before that order was kept does not change.
    #[test]
    fn hash_parts_sort_object_keys_whatever_order_they_came_in() {
        let parts = vec![Part::parse("json:/data").unwrap()];
        let a: Value =
            serde_json::from_str(r#"{"data": {"b": 1, "a": [{"y": 2, "x": 1}]}}"#).unwrap();
        let b: Value =
            serde_json::from_str(r#"{"data": {"a": [{"x": 1, "y": 2}], "b": 1}}"#).unwrap();
        let h = |v: &Value| payload_hash(&parts, b"", &parsed(v));
        assert_eq!(h(&a), h(&b));
        let text = r#"{"a":[{"x":1,"y":2}],"b":1}"#;
        let want = hex::encode(Sha256::digest(format!("{}:{text}", text.len()).as_bytes()));
        assert_eq!(h(&a), want);
        assert_eq!(a["data"].to_string(), r#"{"b":1,"a":[{"y":2,"x":1}]}"#);
    }

    /// The raw walk must find exactly what the parsed tree finds.
    #[test]
    fn raw_pointers_match_parsed_pointers() {
        let text = r#" {"id": "evt_1", "n": 42, "a/b": {"~x": [10, {"deep": true}]},
                        "arr": [1, [2, 3]], "dup": 1, "dup": 2, "esc": "q\"uote", "nul": null} "#;
        let parsed: Value = serde_json::from_str(text).unwrap();
        let object = RawDoc::parse(text).unwrap();
        let array_text = format!("[{text}, 7]");
        let array_parsed: Value = serde_json::from_str(&array_text).unwrap();
        let array = RawDoc::parse(&array_text).unwrap();
        for ptr in [
            "",
            "/id",
            "/n",
            "/a~1b",
            "/a~1b/~0x",
            "/a~1b/~0x/1/deep",
            "/a~1b/~0x/0",
            "/arr/1/0",
            "/arr/2",
            "/arr/x",
            "/dup",
            "/esc",
            "/nul",
            "/missing",
            "/id/0",
            "/n/x",
            "/arr/01",
            "/arr/+1",
            "/arr/-1",
            "/a~1b/~0x/1",
        ] {
            let want = parsed.pointer(ptr).cloned();
            let got = Json::Raw(&object).pointer(ptr).map(Cow::into_owned);
            assert_eq!(got, want, "pointer {ptr:?}");
            // The same walk below an array (no member list at the top).
            let ptr = format!("/0{ptr}");
            let want = array_parsed.pointer(&ptr).cloned();
            let got = Json::Raw(&array).pointer(&ptr).map(Cow::into_owned);
            assert_eq!(got, want, "pointer {ptr:?}");
        }
    }

    #[test]
    fn a_raw_doc_is_one_whole_json_value() {
        for bad in [
            "",
            "{",
            r#"{"a":}"#,
            r#"{"a":1} x"#,
            "[1,]",
            r#"{"a":[1,}"#,
            "nul",
        ] {
            assert!(RawDoc::parse(bad).is_err(), "{bad:?} was taken");
        }
        for good in [r#" {"a": [1, {}]} "#, "[]", "\"s\"", "7", "null"] {
            assert!(RawDoc::parse(good).is_ok(), "{good:?} was refused");
        }
        // A key with escapes is found by its text.
        let doc = RawDoc::parse(r#"{"a\u0062": 1, "\"q": 2}"#).unwrap();
        assert_eq!(
            Json::Raw(&doc).pointer("/ab").as_deref(),
            Some(&Value::from(1))
        );
        assert_eq!(
            Json::Raw(&doc).pointer("/\"q").as_deref(),
            Some(&Value::from(2))
        );
    }

    #[test]
    fn bad_specs() {
        assert!(Part::parse("id").is_err());
        assert!(Part::parse("json:id").is_err());
        assert!(Part::parse("header:").is_err());
    }
}
