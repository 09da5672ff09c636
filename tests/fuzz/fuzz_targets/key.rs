//! Fuzz target `key`: the key extractor. Arbitrary part specs go through
//! `Part::parse`; the parts that parse make a key rule, a type and a hash
//! rule, applied with `Rule::extract`, `Part::text` and `payload_hash` to
//! arbitrary headers and an arbitrary body (as JSON when it parses). Never
//! panics; an extracted key is non-empty, at most 512 bytes (one part) or a
//! 64-digit hex digest (several), and the same input gives the same key.

#![no_main]

use arbitrary::Arbitrary;
use idemhook::receive::key::{Input, Json, MAX_EVENT_ID_BYTES, Part, RawDoc, Rule, payload_hash};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Case {
    key_specs: Vec<String>,
    type_spec: String,
    hash_specs: Vec<String>,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

fn parse_all(specs: &[String]) -> Vec<Part> {
    specs.iter().filter_map(|s| Part::parse(s).ok()).collect()
}

fuzz_target!(|case: Case| {
    let key = Rule {
        parts: parse_all(&case.key_specs),
    };
    let event_type = Part::parse(&case.type_spec).ok();
    let hash = parse_all(&case.hash_specs);
    let json: Option<serde_json::Value> = serde_json::from_slice(&case.body).ok();
    let input = Input {
        headers: &case.headers,
        json: json.as_ref().map(Json::Parsed),
        ..Default::default()
    };
    // The raw walk (what the receiver uses when no SQL action binds JSON)
    // must agree with the parsed tree on every rule.
    let text = std::str::from_utf8(&case.body).ok();
    let doc = text.and_then(|t| RawDoc::parse(t).ok());
    if let Some(doc) = &doc {
        let raw_input = Input {
            headers: &case.headers,
            json: Some(Json::Raw(doc)),
            ..Default::default()
        };
        assert_eq!(key.extract(&raw_input).ok(), key.extract(&input).ok(), "raw and parsed keys differ");
        assert_eq!(
            payload_hash(&hash, &case.body, &raw_input),
            payload_hash(&hash, &case.body, &input),
            "raw and parsed hashes differ"
        );
    }

    // Display is what error messages and `check` print: must not panic.
    for part in key.parts.iter().chain(&hash) {
        let _ = part.to_string();
    }
    if let Ok(id) = key.extract(&input) {
        assert!(!id.is_empty(), "an empty key was extracted");
        if key.parts.len() == 1 {
            assert!(id.len() <= MAX_EVENT_ID_BYTES, "key of {} bytes", id.len());
        } else {
            assert!(
                id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit()),
                "derived key is not a SHA-256 hex digest: {id:?}"
            );
        }
        assert_eq!(key.extract(&input).ok(), Some(id), "extract is not stable");
    }
    if let Some(t) = &event_type {
        let _ = t.text(&input);
    }
    let first = payload_hash(&hash, &case.body, &input);
    assert_eq!(first.len(), 64, "payload hash is not a SHA-256 hex digest");
    assert_eq!(first, payload_hash(&hash, &case.body, &input));
});
