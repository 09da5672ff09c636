//! What some providers need beyond "verify, claim, answer": the
//! verification handshakes (answered as each provider requires, stored
//! nowhere), batch deliveries (one request, several events, each claimed
//! under its own key in one transaction), and the answers a provider
//! expects instead of idemhook's JSON (Adyen's `[accepted]`, Discord's
//! deferred response).

use std::borrow::Cow;
use std::sync::Arc;

use serde_json::Value;
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};

use super::{Refused, refused};
use crate::config::Source;
use crate::config::presets::{Ack, Answer, BatchShape, Echo, Field, Handshake};
use crate::http::Incoming;
use crate::http::app::App;
use crate::http::reply::Reply;
use crate::receive::ingest::Decision;
use crate::receive::key::Input;
use crate::state::Delivery;
use crate::store::backend::Backend;
use crate::verify::{Request, Secret, VerifyError};

/// Longest challenge echoed back (they are short tokens).
const MAX_CHALLENGE: usize = 1024;

fn query_value(query: &str, name: &str) -> Option<String> {
    form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
}

fn challenge_text(value: String) -> Result<String, Refused> {
    if value.len() > MAX_CHALLENGE || value.chars().any(char::is_control) {
        return Err(refused(
            Delivery::BadRequest,
            400,
            "the handshake's challenge is too long or has control characters",
        ));
    }
    Ok(value)
}

fn logged(source: &Source, handshake: &str) {
    crate::log::info(
        "handshake",
        &[
            ("source", &source.name),
            ("kind", &source.kind.name()),
            ("answered", &handshake),
        ],
    );
}

fn bad_token(what: &str) -> Refused {
    refused(
        Delivery::BadSignature,
        403,
        format!("{what} does not match"),
    )
}

/// The handshakes that come before (or without) a signature, and
/// requests other than POST: answered here, or None for the usual path.
pub(super) fn unsigned<B: Backend>(
    app: &Arc<App<B>>,
    source: &Source,
    rq: &Incoming<'_>,
    now: i64,
) -> Option<Result<Reply, Refused>> {
    let handshake = source.kind.preset().map(|p| p.handshake)?;
    match handshake {
        Handshake::Meta if rq.method == "GET" => Some(meta(source, rq)),
        Handshake::Echo(e) if e.unsigned => {
            let json_at = |pointer: &str| {
                let mut body: Value = serde_json::from_slice(&rq.body).ok()?;
                body.pointer_mut(pointer).map(Value::take)
            };
            echo(source, rq, e, &json_at)
        }
        Handshake::Okta if rq.method == "GET" => {
            let challenge = rq.header("x-okta-verification-challenge")?.to_owned();
            let request = Request {
                method: rq.method,
                query: rq.query,
                headers: &rq.headers,
                body: &[],
            };
            Some(match source.verifier.verify_request(&request, now) {
                Err(e) => Err(refused(Delivery::BadSignature, 401, e.to_string())),
                Ok(_) => {
                    logged(source, "verification");
                    Ok(Reply::json(
                        200,
                        &serde_json::json!({ "verification": challenge }),
                    ))
                }
            })
        }
        Handshake::Asana if rq.method == "POST" => {
            let secret = rq.header("x-hook-secret")?.trim().to_owned();
            Some(
                hand_over_secret(app, source, &secret, "X-Hook-Secret").map(|()| {
                    Reply::text(200, "text/plain", String::new())
                        .with_header("X-Hook-Secret", secret)
                }),
            )
        }
        Handshake::Notion if rq.method == "POST" && rq.header("x-notion-signature").is_none() => {
            let body: Value = serde_json::from_slice(&rq.body).ok()?;
            let token = body.get("verification_token")?.as_str()?.to_owned();
            Some(
                hand_over_secret(app, source, &token, "verification_token").map(|()| {
                    Reply::json(
                        200,
                        &serde_json::json!({ "status": "verification_token kept" }),
                    )
                }),
            )
        }
        _ => None,
    }
}

/// A handshake that echoes a field or answers a constant ([`Echo`]): its
/// answer, or None when the request is not one. `json_at` reads the
/// body's JSON at a pointer.
fn echo(
    source: &Source,
    rq: &Incoming<'_>,
    e: Echo,
    json_at: &dyn Fn(&str) -> Option<Value>,
) -> Option<Result<Reply, Refused>> {
    if !e.methods.is_empty() && !e.methods.contains(&rq.method) {
        return None;
    }
    let read = |field: Field| match field {
        Field::Query(name) => query_value(rq.query, name),
        Field::Json(pointer) => json_at(pointer)?.as_str().map(str::to_owned),
        Field::JsonInt(pointer) => json_at(pointer)?.as_i64().map(|n| n.to_string()),
        Field::Header(name) => rq.header(name).map(str::to_owned),
    };
    if let Some((field, value)) = e.when
        && read(field).as_deref() != Some(value)
    {
        return None;
    }
    let (challenge, what) = match e.answer {
        Answer::Fixed { what, body } => (Ok(body.to_owned()), what),
        Answer::Challenge(field) => {
            let (text, what) = match e.when {
                Some((_, value)) => (read(field).unwrap_or_default(), value),
                None => (read(field)?, field.name()),
            };
            let text = if e.as_sent {
                Ok(text)
            } else {
                challenge_text(text)
            };
            (text, what)
        }
    };
    Some(challenge.map(|c| {
        logged(source, what);
        let reply = Reply::text(200, e.content_type, c);
        if e.nosniff {
            reply.with_header("X-Content-Type-Options", "nosniff")
        } else {
            reply
        }
    }))
}

/// Meta's subscription check: `hub.verify_token` must be the source's.
fn meta(source: &Source, rq: &Incoming<'_>) -> Result<Reply, Refused> {
    let mode = query_value(rq.query, "hub.mode");
    let challenge = query_value(rq.query, "hub.challenge");
    let (Some("subscribe"), Some(challenge)) = (mode.as_deref(), challenge) else {
        return Err(refused(
            Delivery::BadRequest,
            400,
            "a GET is Meta's subscription check: hub.mode=subscribe&hub.verify_token=..&hub.challenge=..",
        ));
    };
    let token = query_value(rq.query, "hub.verify_token").unwrap_or_default();
    let expected = source.verify_token.as_ref().map_or("", Secret::expose);
    if expected.is_empty() || !crate::verify::same_secret(token.as_bytes(), expected.as_bytes()) {
        return Err(bad_token("hub.verify_token"));
    }
    let challenge = challenge_text(challenge)?;
    logged(source, "hub.challenge");
    Ok(Reply::text(200, "text/plain", challenge))
}

static HANDING_OVER: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// When the secrets kept by handshakes were last read again for a failed
/// verification: at most once a second, so bad requests cannot make every
/// delivery a database read.
static REREAD: std::sync::Mutex<Option<std::time::Instant>> = std::sync::Mutex::new(None);

/// After a verification failed for a source whose secret comes from a
/// handshake: whether another instance has kept one since (read again
/// at most once a second); true when a new secret was learned.
pub(super) fn reread_handed_over<B: Backend>(app: &App<B>, source: &Source) -> bool {
    if source.secret_count > 0
        || !matches!(
            source.kind.preset().map(|p| p.handshake),
            Some(Handshake::Asana | Handshake::Notion)
        )
    {
        return false;
    }
    {
        let mut last = REREAD.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_some_and(|t| t.elapsed() < std::time::Duration::from_secs(1)) {
            return false;
        }
        *last = Some(std::time::Instant::now());
    }
    app.learn_handshake_secret(source).unwrap_or(false)
}

/// Asana's and Notion's secret, handed over at subscription: kept in the
/// database and verified with from then on, while the source has none
/// yet; a known one is accepted again; another is refused (a stranger
/// must not replace the secret that verifies the source's events).
fn hand_over_secret<B: Backend>(
    app: &Arc<App<B>>,
    source: &Source,
    secret: &str,
    what: &str,
) -> Result<(), Refused> {
    if secret.is_empty() || secret.len() > MAX_CHALLENGE {
        return Err(refused(
            Delivery::BadRequest,
            400,
            format!("{what} is empty or too long"),
        ));
    }
    // One handshake at a time decides and keeps; and what another
    // instance kept first counts as known.
    let _one = HANDING_OVER.lock().unwrap_or_else(|p| p.into_inner());
    let _ = app.learn_handshake_secret(source);
    if !source.verifier.knows_or_lacks(secret) {
        return Err(refused(
            Delivery::BadSignature,
            403,
            format!(
                "{what} differs from the secret this source already verifies with; to re-register, put the new one in secrets"
            ),
        ));
    }
    if source.verifier.key_count() == 0 {
        let (name, value) = (source.name.clone(), secret.to_owned());
        app.write(move |db| crate::store::meta::keep_handed_over(db, &name, &value))
            .map_err(|e| {
                refused(
                    Delivery::Unavailable,
                    503,
                    format!("cannot keep the secret: {}", e.message),
                )
            })?;
        source
            .verifier
            .learn(&Secret::new(secret.to_owned()))
            .map_err(|e| refused(Delivery::BadRequest, 400, e))?;
        crate::log::info(
            "handshake",
            &[
                ("source", &source.name),
                ("kept", &what),
                ("note", &"the source verifies with it from now on"),
            ],
        );
    } else {
        logged(source, what);
    }
    Ok(())
}

/// The handshakes that come signed, answered after the signature verified.
pub(super) fn signed(
    source: &Source,
    rq: &Incoming<'_>,
    input: &Input<'_>,
    secret_index: Option<usize>,
) -> Option<Result<Reply, Refused>> {
    let handshake = source.kind.preset().map(|p| p.handshake)?;
    let json = input.json.as_ref();
    let text_at = |p: &str| {
        json.and_then(|j| j.pointer(p))
            .and_then(|v| v.as_str().map(str::to_owned))
    };
    match handshake {
        Handshake::Echo(e) if !e.unsigned => {
            let json_at = |p: &str| json.and_then(|j| j.pointer(p)).map(Cow::into_owned);
            echo(source, rq, e, &json_at)
        }
        Handshake::Zoom if text_at("/event").as_deref() == Some("endpoint.url_validation") => {
            let plain = text_at("/payload/plainToken").unwrap_or_default();
            let encrypted = source
                .verifier
                .hmac_hex_with(secret_index.unwrap_or(0), plain.as_bytes());
            Some(match encrypted {
                Some(encrypted) => {
                    logged(source, "endpoint.url_validation");
                    Ok(Reply::json(
                        200,
                        &serde_json::json!({ "plainToken": plain, "encryptedToken": encrypted }),
                    ))
                }
                None => Err(refused(
                    Delivery::BadSignature,
                    401,
                    "no secret to answer with",
                )),
            })
        }
        Handshake::Twitch => match rq.header("twitch-eventsub-message-type") {
            Some("webhook_callback_verification") => {
                let challenge = text_at("/challenge").unwrap_or_default();
                Some(challenge_text(challenge).map(|c| {
                    logged(source, "webhook_callback_verification");
                    Reply::text(200, "text/plain", c)
                }))
            }
            Some("revocation") => {
                logged(source, "revocation");
                Some(Ok(Reply::text(200, "text/plain", String::new())))
            }
            _ => None,
        },
        _ => None,
    }
}

/// One event of a batch: its JSON text as sent.
pub(super) struct Item {
    pub text: Box<RawValue>,
}

/// The events of a batch delivery, in order; refused when the body is
/// not the provider's shape or has more than `max` items.
pub(super) fn items(
    batch: BatchShape<'_>,
    body: &[u8],
    max: usize,
) -> Result<(Vec<Item>, String), Refused> {
    let bad = |m: String| refused(Delivery::BadRequest, 400, m);
    let value: Value =
        serde_json::from_slice(body).map_err(|e| bad(format!("body is not valid JSON: {e}")))?;
    let array = value
        .pointer(batch.items)
        .and_then(Value::as_array)
        .ok_or_else(|| {
            bad(format!(
                "a batch has its events in an array at {:?}",
                batch.items
            ))
        })?;
    if array.len() > max {
        return Err(refused(
            Delivery::TooLarge,
            413,
            format!(
                "the batch has {} events, more than max_batch_items ({max})",
                array.len()
            ),
        ));
    }
    // The items' own text, as sent: found again in the raw body.
    let raw: Box<RawValue> = serde_json::from_slice(body).map_err(|e| bad(e.to_string()))?;
    let raw_items = raw_array(&raw, batch.items)
        .ok_or_else(|| bad("the batch array cannot be read".to_owned()))?;
    let mut out = Vec::with_capacity(raw_items.len());
    for item in raw_items {
        let inner = if batch.inner.is_empty() {
            Some(item)
        } else {
            raw_member(&item, batch.inner.trim_start_matches('/'))
        };
        let text = inner.ok_or_else(|| bad(format!("a batch item has no {}", batch.inner)))?;
        out.push(Item { text });
    }
    let delivery = batch
        .delivery_id
        .and_then(|p| value.pointer(p))
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_else(|| hex::encode(Sha256::digest(body)).chars().take(16).collect());
    Ok((out, delivery))
}

/// The member `name` of a raw object, as sent (the last of duplicates).
fn raw_member(raw: &RawValue, name: &str) -> Option<Box<RawValue>> {
    let mut members: std::collections::HashMap<String, Box<RawValue>> =
        serde_json::from_str(raw.get()).ok()?;
    members.remove(name)
}

/// The raw elements of the array at `pointer` (one level of object
/// members per token), each as sent.
fn raw_array(raw: &RawValue, pointer: &str) -> Option<Vec<Box<RawValue>>> {
    let mut current: Box<RawValue> = RawValue::from_string(raw.get().to_owned()).ok()?;
    for token in pointer.split('/').filter(|t| !t.is_empty()) {
        current = raw_member(&current, token)?;
    }
    serde_json::from_str(current.get()).ok()
}

/// The answer to a stored (or duplicate) delivery, when the provider
/// expects its own instead of idemhook's JSON.
pub(super) fn provider_answer(source: &Source) -> Option<Reply> {
    if source.answer == crate::config::generic::Answer::Empty {
        return Some(Reply::text(200, "text/plain", String::new()));
    }
    match source.kind.preset().map(|p| p.ack)? {
        Ack::Json => None,
        Ack::Accepted => Some(Reply::text(200, "text/plain", "[accepted]".to_owned())),
        Ack::DiscordDeferred => Some(Reply::json(200, &serde_json::json!({ "type": 5 }))),
    }
}

/// The answer to a committed batch: the provider's own, or every
/// event's outcome; 409 when one was a mismatch the source rejects.
pub(super) fn batch_answer(source: &Source, ids: &[String], outcomes: &[Decision]) -> (u16, Reply) {
    let reject = source.on_mismatch == crate::config::OnMismatch::Reject
        && outcomes
            .iter()
            .any(|o| matches!(o, Decision::Mismatch { .. }));
    let events: Vec<Value> = ids
        .iter()
        .zip(outcomes)
        .map(|(id, o)| {
            let state = match o {
                Decision::Accepted { state, .. }
                | Decision::Duplicate { state }
                | Decision::Mismatch { state } => state,
            };
            serde_json::json!({ "event_id": id, "status": o.delivery(), "state": state })
        })
        .collect();
    let any_new = outcomes
        .iter()
        .any(|o| matches!(o, Decision::Accepted { .. }));
    let status = if any_new { "accepted" } else { "duplicate" };
    if reject {
        let body = serde_json::json!({
            "error": "an event of this batch was stored with a different payload; the stored one is kept and an incident recorded",
            "status": "mismatch", "source": source.name, "events": events,
        });
        return (409, Reply::json(409, &body));
    }
    if let Some(reply) = provider_answer(source) {
        return (200, reply);
    }
    let body = serde_json::json!({ "status": status, "source": source.name, "events": events });
    (200, Reply::json(200, &body))
}

/// A verification failure as the log line names it.
pub(super) fn failed_part(e: &VerifyError) -> &'static str {
    match e {
        VerifyError::MissingHeader(_) | VerifyError::MissingEventId(_) => "header missing",
        VerifyError::TimestampTooOld { .. } | VerifyError::TimestampInFuture { .. } => {
            "timestamp outside tolerance"
        }
        VerifyError::NoSignatureMatched => "no secret matched",
        VerifyError::NoSignatureMatchedUrl => "no secret matched the body and public_url",
        VerifyError::DuplicateHeader(_) | VerifyError::MalformedHeader { .. } => "header malformed",
        VerifyError::InvalidBody(_) => "body",
    }
}
