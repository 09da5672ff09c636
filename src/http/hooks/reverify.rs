//! A kept refused request verified again (`idemhook reingest`): the same
//! pipeline as a delivery's (`receive`), with the source's current
//! secrets and rules, and a timestamp's tolerance judged against the time
//! the request was received. Handshakes are not taken in again.

use serde_json::Value;

use super::{event_id_of, event_type_of, form_of, kept_headers, providers, read_json};
use crate::config::Source;
use crate::ops::reingest::Passed;
use crate::receive::ingest::{Claim, hash_of};
use crate::receive::key::{Input, Json, RawDoc};
use crate::store::rejected::KeptRequest;
use crate::verify::Request;

/// Verifies `k` again for `source`; the reason when it still fails (an
/// `ops::reingest::Reverify`).
pub fn reverify(
    source: &Source,
    max_batch_items: usize,
    k: &KeptRequest,
) -> Result<Passed, String> {
    let received_at = k.kept.received_at;
    let body = k.body.as_slice();
    let headers = &k.headers;
    let request = Request {
        method: "POST",
        query: &k.query,
        headers,
        body,
    };
    let verdict = source
        .verifier
        .verify_request(&request, received_at / 1000)
        .map_err(|e| e.to_string())?;
    let content_type = crate::verify::headers::header_values(headers, "content-type").next();
    let kept = kept_headers(source, headers);
    let claim = |event_id, event_type, body: Vec<u8>, json, hash, batch| Claim {
        event_id,
        event_type,
        body,
        json,
        content_type: content_type.map(str::to_string),
        headers: headers.clone(),
        kept_headers: kept.clone(),
        payload_hash: hash,
        verified_with: verdict.secret_index,
        signed_at: verdict.timestamp,
        received_at,
        remote: k.kept.remote.clone(),
        batch,
        reingest: true,
        catchup: false,
    };
    if let Some(batch) = source.batch() {
        let (items, delivery) =
            providers::items(batch, body, max_batch_items).map_err(|r| r.message)?;
        let n = items.len();
        let mut claims = Vec::with_capacity(n);
        for (i, item) in items.iter().enumerate() {
            let text = item.text.get();
            let json: Option<Value> = if source.binds_json() {
                serde_json::from_str(text).ok()
            } else {
                None
            };
            let doc = RawDoc::parse(text).map_err(|e| format!("batch item {i}: {e}"))?;
            let input = Input {
                headers,
                json: Some(json.as_ref().map_or(Json::Raw(&doc), Json::Parsed)),
                form: None,
                body: text.as_bytes(),
            };
            let event_id = event_id_of(source, &input)
                .map_err(|r| format!("batch item {i} of {n}: {}", r.message))?;
            let event_type = event_type_of(source, headers, &input).map_err(|r| r.message)?;
            let hash = hash_of(source, text.as_bytes(), &input);
            let mut c = claim(
                event_id,
                event_type,
                text.as_bytes().to_vec(),
                json,
                hash,
                Some(format!("{delivery} (event {} of {n})", i + 1)),
            );
            c.content_type = Some("application/json".to_string());
            claims.push(c);
        }
        return Ok(Passed {
            secret: verdict.secret_index,
            claims,
        });
    }
    let (json, doc) = read_json(source, content_type, body).map_err(|r| r.message)?;
    let form = form_of(source, content_type, body);
    let input = Input {
        headers,
        json: json
            .as_ref()
            .map(Json::Parsed)
            .or(doc.as_ref().map(Json::Raw)),
        form: form.as_deref(),
        body,
    };
    let event_id = event_id_of(source, &input).map_err(|r| r.message)?;
    let event_type = event_type_of(source, headers, &input).map_err(|r| r.message)?;
    let hash = hash_of(source, body, &input);
    drop(doc);
    Ok(Passed {
        secret: verdict.secret_index,
        claims: vec![claim(event_id, event_type, body.to_vec(), json, hash, None)],
    })
}
