//! `POST /hooks/{source}`: read the body (bounded), verify the signature
//! over the raw bytes, extract the key, claim through the writer, answer.
//! Nothing in the body is trusted before the signature has been checked,
//! and nothing is acknowledged before the commit that stores it.

use std::sync::Arc;
use std::time::Instant;

use serde_json::Value;

mod providers;
pub mod reverify;
mod unknown;
#[cfg(test)]
mod vectors;

use super::Incoming;
use super::reply::Reply;
use crate::config::{Kind, OnMismatch, Source};
use crate::http::app::App;
use crate::receive::ingest::{Claim, Decision, hash_of};
use crate::receive::key::{Input, Json, RawDoc};
use crate::state::Delivery;
use crate::store::backend::Backend;
use crate::time::now_ms;
use crate::verify::Request;

/// JSON nested deeper than this is refused (serde_json stops at 128 too).
const MAX_JSON_DEPTH: usize = 64;

/// Why a delivery is refused: the metric outcome, the status, the message,
/// and for a bad signature which part of the check failed (for the log).
struct Refused {
    outcome: Delivery,
    status: u16,
    message: String,
    failed: Option<&'static str>,
    /// The body, for a refusal after it was read (kept when it is a 401
    /// or 400 and the source keeps its refusals).
    body: Option<Vec<u8>>,
}

fn refused(outcome: Delivery, status: u16, message: impl Into<String>) -> Refused {
    Refused {
        outcome,
        status,
        message: message.into(),
        failed: None,
        body: None,
    }
}

impl Refused {
    fn failed(mut self, part: &'static str) -> Refused {
        self.failed = Some(part);
        self
    }

    /// The refusal with the request's body, to be kept.
    fn keeping(mut self, body: &[u8]) -> Refused {
        self.body = Some(body.to_vec());
        self
    }
}

pub fn receive<B: Backend>(app: &Arc<App<B>>, source_name: &str, rq: &mut Incoming<'_>) -> Reply {
    let received_at = now_ms();
    let started = Instant::now();
    let found = app.source(source_name);
    let index = found.map(|(i, _)| i);
    let result = match found {
        None => Err(refused(Delivery::UnknownSource, 404, "unknown source")),
        Some((i, source)) => accept(app, i, source, rq, received_at, started),
    };
    match result {
        Ok(reply) => reply,
        Err(mut r) => {
            let kept = kept_refusal(app, index, rq, &mut r);
            let reply = refuse(app, index, source_name, &rq.remote, &r, received_at, kept);
            // (After a 413 the server closes the connection itself: the
            // rest of the body was never read.)
            if r.status == 405 {
                reply.with_header("Allow", "POST")
            } else if r.status == 401 && found.is_some_and(|(_, s)| s.kind == Kind::Basic) {
                reply.with_header("WWW-Authenticate", "Basic realm=\"idemhook\"")
            } else if r.status == 503 {
                reply.retry_after()
            } else {
                reply
            }
        }
    }
}

/// The pipeline for a known source: everything before the claim may refuse.
fn accept<B: Backend>(
    app: &Arc<App<B>>,
    index: usize,
    source: &Source,
    rq: &mut Incoming<'_>,
    received_at: i64,
    started: Instant,
) -> Result<Reply, Refused> {
    // Handshakes that come unsigned or not as a POST (Meta's GET, ...).
    if let Some(answer) = providers::unsigned(app, source, rq, received_at / 1000) {
        return answer;
    }
    if rq.method != "POST" {
        return Err(refused(
            Delivery::BadRequest,
            405,
            "method not allowed: use POST",
        ));
    }
    // (A header with a NUL byte never gets here: `server::parse_head`
    // refuses it, and `refused_head` records it.)
    let body = take_body(rq, app.config.max_body_bytes)?;

    // 1. The signature, over the raw bytes (and, for the kinds that sign
    // them, the URL and method).
    let request = Request {
        method: rq.method,
        query: rq.query,
        headers: &rq.headers,
        body: &body,
    };
    let verdict = source
        .verifier
        .verify_request(&request, received_at / 1000)
        .or_else(|e| {
            // A secret another instance was handed since: then once more.
            if providers::reread_handed_over(app, source) {
                source.verifier.verify_request(&request, received_at / 1000)
            } else {
                Err(e)
            }
        })
        .map_err(|e| {
            let part = providers::failed_part(&e);
            if e.is_bad_request() {
                refused(Delivery::BadRequest, 400, e.to_string())
            } else {
                app.metrics.notify.bad_signature(index, received_at);
                refused(Delivery::BadSignature, 401, e.to_string()).failed(part)
            }
            .keeping(&body)
        })?;

    // 2. Only now, the body, and what the source's rules read in it.
    let (json, doc) =
        read_json(source, rq.header("content-type"), &body).map_err(|r| r.keeping(&body))?;
    let form = form_of(source, rq.header("content-type"), &body);
    let input = Input {
        headers: &rq.headers,
        json: json
            .as_ref()
            .map(Json::Parsed)
            .or(doc.as_ref().map(Json::Raw)),
        form: form.as_deref(),
        body: &body,
    };
    if let Some(answer) = providers::signed(source, rq, &input, verdict.secret_index) {
        return answer;
    }
    if let Some(batch) = source.batch() {
        return accept_batch(
            app,
            index,
            source,
            rq,
            batch,
            body,
            verdict,
            received_at,
            started,
        );
    }
    let event_id = event_id_of(source, &input).map_err(|r| r.keeping(&body))?;
    let event_type = event_type_of(source, &rq.headers, &input).map_err(|r| r.keeping(&body))?;
    let hash = hash_of(source, &body, &input);
    let kept_headers = kept_headers(source, &rq.headers);
    let content_type = rq.header("content-type").map(str::to_string);
    let claim = Claim {
        event_id: event_id.clone(),
        event_type,
        body,
        json,
        content_type,
        headers: std::mem::take(&mut rq.headers),
        kept_headers,
        payload_hash: hash,
        verified_with: verdict.secret_index,
        signed_at: verdict.timestamp,
        received_at,
        remote: rq.remote.clone(),
        batch: None,
        reingest: false,
        catchup: false,
    };

    // 3. The claim, committed before we answer.
    Ok(hand_over(app, rq, index, claim, event_id, started))
}

/// The event id: the key rule's, or its fallback's when the rule's parts
/// are missing (Graph's optional `id`).
fn event_id_of(source: &Source, input: &Input<'_>) -> Result<String, Refused> {
    match (source.key.extract(input), &source.key_fallback) {
        (Ok(id), _) => Ok(id),
        (Err(crate::receive::key::KeyError::Missing(_)), Some(fallback)) => fallback.extract(input),
        (Err(e), _) => Err(e),
    }
    .map_err(|e| refused(Delivery::BadRequest, 400, e.to_string()))
}

/// The body's form fields, when a rule reads them and it is form-encoded.
fn form_of(
    source: &Source,
    content_type: Option<&str>,
    body: &[u8],
) -> Option<Vec<(String, String)>> {
    let form = content_type
        .and_then(|c| c.split(';').next())
        .is_some_and(|m| {
            m.trim()
                .eq_ignore_ascii_case("application/x-www-form-urlencoded")
        });
    (form && source.reads_form()).then(|| form_urlencoded::parse(body).into_owned().collect())
}

/// A batch delivery: every event its own claim under its own key, all in
/// one transaction, answered once it committed. An event without an id
/// refuses the whole batch (nothing stored).
#[allow(clippy::too_many_arguments)]
fn accept_batch<B: Backend>(
    app: &Arc<App<B>>,
    index: usize,
    source: &Source,
    rq: &mut Incoming<'_>,
    batch: crate::config::presets::BatchShape<'_>,
    body: Vec<u8>,
    verdict: crate::verify::Verdict,
    received_at: i64,
    started: Instant,
) -> Result<Reply, Refused> {
    let (items, delivery) =
        providers::items(batch, &body, app.config.max_batch_items).map_err(|r| r.keeping(&body))?;
    if items.is_empty() {
        if source.empty_batch == crate::config::generic::EmptyBatch::Reject {
            return Err(refused(
                Delivery::BadRequest,
                400,
                "the batch has no events (empty_batch = \"reject\")",
            ));
        }
        // A heartbeat (Asana's `{"events":[]}`, Xero's "intent to
        // receive"): nothing to store.
        return Ok(providers::batch_answer(source, &[], &[]).1);
    }
    let kept_headers = kept_headers(source, &rq.headers);
    let content_type = Some("application/json".to_string());
    let n = items.len();
    let mut claims = Vec::with_capacity(n);
    let mut ids = Vec::with_capacity(n);
    for (i, item) in items.iter().enumerate() {
        let text = item.text.get();
        let json: Option<Value> = if source.binds_json() {
            serde_json::from_str(text).ok()
        } else {
            None
        };
        let doc = RawDoc::parse(text).map_err(|e| {
            refused(Delivery::BadRequest, 400, format!("batch item {i}: {e}")).keeping(&body)
        })?;
        let input = Input {
            headers: &rq.headers,
            json: Some(json.as_ref().map_or(Json::Raw(&doc), Json::Parsed)),
            form: None,
            body: text.as_bytes(),
        };
        let event_id = event_id_of(source, &input).map_err(|mut r| {
            r.message = format!(
                "batch item {i} of {n}: {}; nothing of the batch was stored",
                r.message
            );
            r.keeping(&body)
        })?;
        let event_type =
            event_type_of(source, &rq.headers, &input).map_err(|r| r.keeping(&body))?;
        let hash = hash_of(source, text.as_bytes(), &input);
        ids.push(event_id.clone());
        claims.push(Claim {
            event_id,
            event_type,
            body: text.as_bytes().to_vec(),
            json,
            content_type: content_type.clone(),
            headers: rq.headers.clone(),
            kept_headers: kept_headers.clone(),
            payload_hash: hash,
            verified_with: verdict.secret_index,
            signed_at: verdict.timestamp,
            received_at,
            remote: rq.remote.clone(),
            batch: Some(format!("{delivery} (event {} of {n})", i + 1)),
            reingest: false,
            catchup: false,
        });
    }
    if let Some(permit) = rq.permit.as_mut() {
        permit.release();
    }
    let claim_started = Instant::now();
    let answer = {
        let app = app.clone();
        move |result: Result<Vec<crate::receive::ingest::Decision>, crate::store::StoreError>| {
            batch_reply(&app, index, &ids, result, started, claim_started)
        }
    };
    Ok(match rq.later.take() {
        Some(later) => {
            let (sender, promised) = later.promise();
            app.claim_batch_then(index, claims, move |result| sender.send(answer(result)));
            promised
        }
        None => answer(app.claim_batch(index, claims)),
    })
}

/// What a claim's commit gave, with its source; or, when it failed, the
/// 503 (counted and logged; not a refusal: nothing can be recorded while
/// storage is down). `what` names the delivery in the log line.
fn committed<'a, T, B: Backend>(
    app: &'a App<B>,
    index: usize,
    result: Result<T, crate::store::StoreError>,
    claim_started: Instant,
    what: (&str, &dyn std::fmt::Display),
) -> Result<(&'a Source, T), Reply> {
    app.metrics.claim_duration.observe(claim_started.elapsed());
    let Some(source) = app.config.sources.get(index) else {
        return Err(Reply::error(
            500,
            "internal error: source index out of range",
        ));
    };
    if result.is_ok() {
        app.metrics.notify.storage_ok();
    }
    result.map(|outcome| (source, outcome)).map_err(|e| {
        app.metrics.delivery(Some(index), Delivery::Unavailable);
        app.metrics.notify.storage_failed(crate::time::now_ms());
        crate::log::warn(
            "delivery",
            &[
                ("source", &source.name),
                what,
                ("outcome", &"unavailable"),
                ("status", &503),
                ("error", &e.message),
            ],
        );
        // Never "not stored": a commit whose answer was lost may have
        // stored it. A retry is decided by the barrier either way.
        Reply::unavailable(if what.0 == "events" {
            "the batch's events may not have been stored; deliver it again (the stored ones are answered duplicate)"
        } else {
            "the event may not have been stored; deliver it again (if it was, the answer is duplicate)"
        })
    })
}

/// The answer to a committed (or failed) batch: counted and logged per event.
fn batch_reply<B: Backend>(
    app: &App<B>,
    index: usize,
    ids: &[String],
    result: Result<Vec<Decision>, crate::store::StoreError>,
    started: Instant,
    claim_started: Instant,
) -> Reply {
    let (source, outcomes) =
        match committed(app, index, result, claim_started, ("events", &ids.len())) {
            Ok(committed) => committed,
            Err(reply) => return reply,
        };
    let (status, reply) = providers::batch_answer(source, ids, &outcomes);
    for (id, outcome) in ids.iter().zip(&outcomes) {
        let delivery = match (outcome, status) {
            (Decision::Mismatch { .. }, 409) => Delivery::Mismatch,
            (Decision::Mismatch { .. }, _) => Delivery::Duplicate,
            (o, _) => o.delivery(),
        };
        app.metrics.delivery(Some(index), delivery);
        crate::log::write(
            incident_level(delivery),
            "delivery",
            &[
                ("source", &source.name),
                ("event_id", id),
                ("outcome", &delivery.as_str()),
                ("status", &status),
                ("batch", &ids.len()),
                (
                    "ms",
                    &format_args!("{:.2}", started.elapsed().as_secs_f64() * 1000.0),
                ),
            ],
        );
    }
    reply.with_failpoint("claim.after_commit")
}

/// The body checked as JSON when the source reads it (or it says it is
/// JSON), in one pass: parsed into a tree only when an SQL action binds
/// its values; otherwise left as text with its top-level members noted.
fn read_json<'b>(
    source: &Source,
    content_type: Option<&str>,
    body: &'b [u8],
) -> Result<(Option<Value>, Option<RawDoc<'b>>), Refused> {
    let text = if source.needs_json() || declares_json(content_type) {
        Some(json_text(body).map_err(|m| refused(Delivery::BadRequest, 400, m))?)
    } else {
        None
    };
    let bad_json = |e: serde_json::Error| {
        refused(
            Delivery::BadRequest,
            400,
            format!("body is not valid JSON: {e}"),
        )
    };
    Ok(match text {
        Some(text) if source.binds_json() => {
            (Some(serde_json::from_str(text).map_err(bad_json)?), None)
        }
        Some(text) => (None, Some(RawDoc::parse(text).map_err(bad_json)?)),
        None => (None, None),
    })
}

/// The event type, when the source has a type rule: refused when the
/// header it reads is repeated, or when it holds a control character (it
/// travels in forwarded requests' headers, like the id).
fn event_type_of(
    source: &Source,
    headers: &[(String, String)],
    input: &Input<'_>,
) -> Result<Option<String>, Refused> {
    let event_type = match &source.event_type {
        Some(part) => {
            if let Some(name) = part.repeated_header(headers) {
                return Err(refused(
                    Delivery::BadRequest,
                    400,
                    format!("duplicate header {name}: the event type is ambiguous"),
                ));
            }
            source.type_of(input)
        }
        None => None,
    };
    if event_type
        .as_deref()
        .is_some_and(|t| t.chars().any(|c| c.is_ascii_control()))
    {
        return Err(refused(
            Delivery::BadRequest,
            400,
            "event type contains a control character",
        ));
    }
    Ok(event_type)
}

/// Hands the claim to the storage. Waiting for the commit is not work: the
/// permit goes back first so more claims can join the group. With a
/// [`super::server::Later`], the connection thread goes back to reading and
/// the answer thread answers after the commit; without, this thread waits.
fn hand_over<B: Backend>(
    app: &Arc<App<B>>,
    rq: &mut Incoming<'_>,
    index: usize,
    claim: Claim,
    event_id: String,
    started: Instant,
) -> Reply {
    if let Some(permit) = rq.permit.as_mut() {
        permit.release();
    }
    let claimed = Claimed {
        index,
        event_id,
        started,
        claim_started: Instant::now(),
    };
    match rq.later.take() {
        Some(later) => {
            let (answer, promised) = later.promise();
            let for_answer = app.clone();
            app.claim_then(index, claim, move |result| {
                answer.send(claimed.reply(&for_answer, result));
            });
            promised
        }
        None => {
            let result = app.claim(index, claim);
            claimed.reply(app, result)
        }
    }
}

/// A claim handed to the writer, and what its answer needs.
struct Claimed {
    index: usize,
    event_id: String,
    started: Instant,
    claim_started: Instant,
}

impl Claimed {
    /// The answer to a claim once its commit is known: counted, logged.
    fn reply<B: Backend>(
        self,
        app: &App<B>,
        result: Result<Decision, crate::store::StoreError>,
    ) -> Reply {
        let Claimed {
            index,
            event_id,
            started,
            claim_started,
        } = self;
        let (source, outcome) =
            match committed(app, index, result, claim_started, ("event_id", &event_id)) {
                Ok(committed) => committed,
                Err(reply) => return reply,
            };
        let delivery = outcome.delivery();
        app.metrics.delivery(Some(index), delivery);
        let name = &source.name;
        const MISMATCH: &str = "an event with this id was stored with a different payload; the stored one is kept and an incident recorded";
        let answered = |status, state| Answered {
            error: None,
            status,
            source: name,
            event_id: &event_id,
            state,
            mismatch: false,
            detail: None,
        };
        let (status, body) = match &outcome {
            Decision::Accepted { state, .. } => (200, answered(Delivery::Accepted, state)),
            Decision::Duplicate { state } => (200, answered(Delivery::Duplicate, state)),
            Decision::Mismatch { state } => match source.on_mismatch {
                OnMismatch::Ack => (
                    200,
                    Answered {
                        mismatch: true,
                        detail: Some(MISMATCH),
                        ..answered(Delivery::Duplicate, state)
                    },
                ),
                OnMismatch::Reject => (
                    409,
                    Answered {
                        error: Some(MISMATCH),
                        ..answered(Delivery::Mismatch, state)
                    },
                ),
            },
        };
        crate::log::write(
            incident_level(delivery),
            "delivery",
            &[
                ("source", name),
                ("event_id", &event_id),
                ("outcome", &delivery.as_str()),
                ("status", &status),
                (
                    "ms",
                    &format_args!("{:.2}", started.elapsed().as_secs_f64() * 1000.0),
                ),
            ],
        );
        let reply = match providers::provider_answer(source) {
            Some(own) if status == 200 => own,
            _ => Reply::json(status, &body),
        };
        reply.with_failpoint("claim.after_commit")
    }
}

/// A delivery's log level: the outcomes the alert rules call incidents (a
/// bad signature, a payload mismatch; storage trouble is logged apart) are
/// warnings, so `--log-level warn` shows them and only them; the normal
/// flow and a sender's malformed requests are info.
fn incident_level(delivery: Delivery) -> crate::log::Level {
    match delivery {
        Delivery::BadSignature | Delivery::Mismatch | Delivery::Unavailable => {
            crate::log::Level::Warn
        }
        Delivery::Accepted
        | Delivery::Duplicate
        | Delivery::BadRequest
        | Delivery::UnknownSource
        | Delivery::TooLarge
        | Delivery::Reingested
        | Delivery::Catchup => crate::log::Level::Info,
    }
}

/// The JSON answer to a claimed delivery (docs/configuration.md, "HTTP").
#[derive(serde::Serialize)]
struct Answered<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a str>,
    /// The delivery's outcome word: accepted, duplicate or mismatch.
    status: Delivery,
    source: &'a str,
    event_id: &'a str,
    state: &'a str,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    mismatch: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    detail: Option<&'a str>,
}

/// The body the connection read, or 413 when it is over `limit` (also
/// when only declared). The server itself answers bodies that are too
/// large for it, short, late or malformed, so only the size is left here.
fn take_body(rq: &mut Incoming<'_>, limit: usize) -> Result<Vec<u8>, Refused> {
    let body = std::mem::take(&mut rq.body);
    if rq.content_length.is_some_and(|n| n > limit) || body.len() > limit {
        return Err(refused(
            Delivery::TooLarge,
            413,
            format!("body larger than max_body_bytes ({limit})"),
        ));
    }
    Ok(body)
}

/// What of a refused request is kept (`keep_rejected`): the request
/// whole for a 401 or 400 to a configured source that keeps its
/// refusals, refused once its body was read; nothing otherwise (413, 405,
/// unknown sources, a malformed head).
fn kept_refusal<B: Backend>(
    app: &App<B>,
    index: Option<usize>,
    rq: &Incoming<'_>,
    r: &mut Refused,
) -> Option<crate::store::backend::KeptRefusal> {
    let body = r.body.take()?;
    let source = app.config.sources.get(index?)?;
    if !matches!(r.status, 400 | 401) || source.keep_rejected.is_zero() {
        return None;
    }
    let kept = crate::store::backend::KeptRefusal::new(
        rq.query.to_string(),
        serde_json::to_string(&rq.headers).ok()?,
        body,
        source.keep_rejected_bytes,
    );
    match &kept {
        // Too much waits for the disk already: recorded without it.
        None => {
            app.metrics
                .dropped_records
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        Some(_) => app
            .metrics
            .notify
            .kept_refusal(index?, crate::time::now_ms()),
    }
    kept
}

/// Answers a refused delivery: counts it, records it (without waiting for
/// the disk; the request whole when `kept`), logs it. A request to an
/// unknown source is counted and summarised in the log, never recorded.
fn refuse<B: Backend>(
    app: &App<B>,
    index: Option<usize>,
    source_name: &str,
    remote: &str,
    r: &Refused,
    received_at: i64,
    kept: Option<crate::store::backend::KeptRefusal>,
) -> Reply {
    let (outcome, status, message) = (r.outcome, r.status, r.message.as_str());
    app.metrics.delivery(index, outcome);
    if index.is_none() {
        // Whatever the number of names asked for, nothing is stored and
        // one line a minute is logged (request data never becomes a label).
        unknown::note(source_name, remote, received_at);
        return Reply::error(status, message);
    }
    app.record_refusal(source_name, outcome, remote, message, received_at, kept);
    let outcome_word = outcome.as_str();
    let mut fields: Vec<(&str, &dyn std::fmt::Display)> = vec![
        ("source", &source_name),
        ("outcome", &outcome_word),
        ("status", &status),
    ];
    if let Some(part) = &r.failed {
        fields.push(("failed", part));
    }
    fields.push(("reason", &message));
    fields.push(("remote", &remote));
    crate::log::write(incident_level(outcome), "delivery", &fields);
    Reply::error(status, message)
}

/// A delivery the server refused while reading its head (malformed
/// framing, a head over a limit): counted, recorded and logged like any
/// refused delivery when its source is known. The server answers it.
pub fn refused_head<B: Backend>(
    app: &App<B>,
    source_name: &str,
    remote: &str,
    status: u16,
    message: &str,
) {
    let Some((index, _)) = app.source(source_name) else {
        return;
    };
    let outcome = if status == 413 {
        Delivery::TooLarge
    } else {
        Delivery::BadRequest
    };
    let r = refused(outcome, status, message);
    let _ = refuse(app, Some(index), source_name, remote, &r, now_ms(), None);
}

/// True for a JSON media type (`application/json`, `*/*+json`): such a
/// body must be JSON even where no rule reads it (GitHub, for one, may
/// also send form-encoded bodies, which are not checked).
fn declares_json(content_type: Option<&str>) -> bool {
    let Some(media) = content_type.and_then(|c| c.split(';').next()) else {
        return false;
    };
    let media = media.trim().to_ascii_lowercase();
    media == "application/json" || (media.starts_with("application/") && media.ends_with("+json"))
}

/// The body as text for a JSON parser: UTF-8 and not nested too deep.
fn json_text(body: &[u8]) -> Result<&str, String> {
    let text = std::str::from_utf8(body).map_err(|_| "body is not valid UTF-8 JSON".to_string())?;
    if too_deep(text.as_bytes()) {
        return Err(format!(
            "body JSON is nested deeper than {MAX_JSON_DEPTH} levels"
        ));
    }
    Ok(text)
}

/// True when arrays and objects nest deeper than [`MAX_JSON_DEPTH`]: a
/// cheap check that refuses hostile nesting before the parser recurses.
/// A body with no more opening brackets than that cannot nest deeper, and
/// counting them is one vectorised pass; only a body with more is walked
/// byte by byte.
fn too_deep(bytes: &[u8]) -> bool {
    let opening = bytes.iter().filter(|&&b| b == b'[' || b == b'{').count();
    opening > MAX_JSON_DEPTH && nesting_depth(bytes) > MAX_JSON_DEPTH
}

/// The deepest nesting of arrays and objects, skipping strings.
fn nesting_depth(bytes: &[u8]) -> usize {
    let (mut depth, mut max, mut in_string, mut escaped) = (0usize, 0usize, false, false);
    for &b in bytes {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                max = max.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    max
}

/// The headers stored with the event: Content-Type, the kind's own, and
/// the headers the key and type rules read.
fn kept_headers(source: &Source, headers: &[(String, String)]) -> String {
    // SQL action params that read headers need them again on replay.
    let param_parts = source.actions.iter().flat_map(|a| match &a.kind {
        crate::config::ActionKind::Sql { params, .. } => params.as_slice(),
        crate::config::ActionKind::Forward(_) => &[],
    });
    let rule_headers = source
        .key
        .parts
        .iter()
        .chain(source.event_type.iter())
        .chain(param_parts.map(|(_, p)| p))
        .flat_map(|p| p.alternatives.iter())
        .filter_map(|a| match a {
            crate::receive::key::Atom::Header(h) => Some(h.as_str()),
            _ => None,
        });
    let keep = |name: &str| {
        let is = |k: &str| name.eq_ignore_ascii_case(k);
        is("content-type")
            || is("user-agent")
            || source.kind.kept_headers().iter().any(|k| is(k))
            || rule_headers.clone().any(is)
    };
    // Written straight out (this runs for every delivery): names
    // lowercased, and of a repeated header the last one, as a map would.
    let mut out = Vec::with_capacity(256);
    out.push(b'{');
    for (i, (name, value)) in headers.iter().enumerate() {
        let later = &headers[i + 1..];
        if !keep(name) || later.iter().any(|(n, _)| n.eq_ignore_ascii_case(name)) {
            continue;
        }
        if out.len() > 1 {
            out.push(b',');
        }
        let start = out.len();
        push_json_string(&mut out, name);
        out[start..].make_ascii_lowercase();
        out.push(b':');
        push_json_string(&mut out, value);
    }
    out.push(b'}');
    String::from_utf8(out).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// Appends `s` as a JSON string, quoted and escaped.
fn push_json_string(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    for &b in s.as_bytes() {
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            0..=0x1f => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                out.extend_from_slice(b"\\u00");
                out.push(HEX[usize::from(b >> 4)]);
                out.push(HEX[usize::from(b & 0xf)]);
            }
            _ => out.push(b),
        }
    }
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The headers kept with an event: content type, user agent, the
    /// provider's own, and those a key, type or action param rule reads;
    /// names lowercased, values escaped, a repeated header by its last
    /// value; nothing else.
    #[test]
    fn kept_headers_are_the_ones_rules_and_replays_need() {
        let toml = r#"
[sources.pay]
kind = "stripe"
secrets = ["whsec_unit"]
key = ["header:X-Tenant", "json:/id"]
[[sources.pay.actions]]
name = "credit"
sql = "SELECT :region"
params = { region = "header:x-region" }
"#;
        let config =
            crate::config::Config::parse(toml, "unit", std::path::Path::new("."), None).unwrap();
        let headers: Vec<(String, String)> = [
            ("Host", "example.test"),
            ("Content-Type", "application/json"),
            ("User-Agent", "Stripe/1.0"),
            ("Stripe-Signature", "t=1,v1=ab"),
            ("x-tenant", "acme"),
            ("X-Region", "eu"),
            ("Authorization", "Bearer secret"),
            ("user-agent", "Stripe/1.0 \"quoted\" back\\slash\ttab"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let kept: Value =
            serde_json::from_str(&kept_headers(&config.sources[0], &headers)).unwrap();
        assert_eq!(
            kept,
            json!({
                "content-type": "application/json",
                "user-agent": "Stripe/1.0 \"quoted\" back\\slash\ttab",
                "stripe-signature": "t=1,v1=ab",
                "x-tenant": "acme",
                "x-region": "eu",
            })
        );
    }

    #[test]
    fn json_media_types() {
        for yes in [
            "application/json",
            "Application/JSON; charset=utf-8",
            "application/cloudevents+json",
        ] {
            assert!(declares_json(Some(yes)), "{yes}");
        }
        for no in [
            "application/x-www-form-urlencoded",
            "text/json-ish",
            "application/jsonx",
            "",
        ] {
            assert!(!declares_json(Some(no)), "{no}");
        }
        assert!(!declares_json(None));
    }

    #[test]
    fn many_brackets_are_not_deep_nesting() {
        let flat = format!("[{}]", vec!["[]"; 200].join(","));
        assert!(!too_deep(flat.as_bytes()));
        let deep = "[".repeat(MAX_JSON_DEPTH + 1) + &"]".repeat(MAX_JSON_DEPTH + 1);
        assert!(too_deep(deep.as_bytes()));
        let limit = "[".repeat(MAX_JSON_DEPTH) + &"]".repeat(MAX_JSON_DEPTH);
        assert!(!too_deep(limit.as_bytes()));
        // Brackets inside strings count toward the quick bound only.
        let quoted = format!(r#"["{}"]"#, "[".repeat(500));
        assert!(!too_deep(quoted.as_bytes()));
    }

    #[test]
    fn depth_scan_skips_strings() {
        assert_eq!(nesting_depth(br#"{"a":[1,{"b":"[[[["}]}"#), 3);
        assert_eq!(nesting_depth(br#""\"[""#), 0);
        assert_eq!(nesting_depth(&[b'['; 1000]), 1000);
    }

    #[test]
    fn deep_json_is_refused_not_parsed() {
        let deep = "[".repeat(10_000) + &"]".repeat(10_000);
        assert!(json_text(deep.as_bytes()).unwrap_err().contains("nested"));
        assert!(json_text(b"\xff").unwrap_err().contains("UTF-8"));
    }
}
