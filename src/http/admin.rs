//! The admin API under `/api/`: list, show, replay, pause, resume and
//! reconcile over HTTP, answering the same JSON as the CLI's `--json` (the
//! same `ops` functions build it).
//!
//! Off (404) when no `admin_token` is set; otherwise every request needs
//! `Authorization: Bearer <token>`, compared in constant time (401 on a
//! missing or wrong one). On either backend (`App::read`, `App::write`
//! hand the routes a `store::db::Db`): on SQLite reads use the read-only
//! pool and writes go through the one writer, each in its own savepoint;
//! on PostgreSQL each runs on a pooled connection, a write in its own
//! transaction. Either way a refused request leaves nothing behind.

use serde::Deserialize;
use sha2::{Digest, Sha256};

mod rejected;

use super::Incoming;
use super::reply::Reply;
use crate::http::app::App;
use crate::http::auth::same_token;
use crate::ops::OpError;
use crate::ops::inspect::{self, ListFilter};
use crate::ops::inspector;
use crate::ops::{pause, reconcile, replay, resolve};
use crate::state::{AttemptOutcome, JobKind, ReplayResult};
use crate::store::StoreError;
use crate::store::backend::Backend;
use crate::store::db::Db;
use crate::time::now_ms;

/// The largest admin request body we read.
const MAX_ADMIN_BODY: usize = 64 * 1024;
/// The most events one list answers.
const MAX_LIST: u32 = 10_000;

pub fn handle<B: Backend>(
    app: &App<B>,
    rq: &mut Incoming<'_>,
    listener: &super::ui::Listener,
) -> Reply {
    let Some(token) = &app.config.admin_token else {
        return Reply::error(404, "the admin API is off: set admin_token to enable it");
    };
    // The inspector's session cookie stands in for the token when no
    // Authorization header is sent (ui.rs checks Host and origin).
    let by_cookie = if rq.header("authorization").is_none() {
        match super::ui::cookie_auth(app, rq, listener) {
            super::ui::CookieAuth::Allowed => true,
            super::ui::CookieAuth::Refused(reply) => return super::ui::secure(reply),
            super::ui::CookieAuth::None => false,
        }
    } else {
        false
    };
    let reply = route(app, rq, token.expose(), by_cookie);
    // Answers carry payloads and headers: never cached, never sniffed, and
    // (the inspector reads them; a browser may open one) under the same
    // strict policy as the inspector's own answers.
    super::ui::secure(reply.with_header("Cache-Control", "no-store"))
}

fn route<B: Backend>(app: &App<B>, rq: &mut Incoming<'_>, token: &str, by_cookie: bool) -> Reply {
    if !by_cookie && let Err(refused) = check_token(app, rq, token) {
        return refused;
    }
    let Some(segments) = segments(rq.path) else {
        return Reply::error(400, "the path is not valid percent-encoded UTF-8");
    };
    let parts: Vec<&str> = segments.iter().map(String::as_str).collect();
    match parts.as_slice() {
        ["api", "events"] => only(rq, "GET", |rq| list(app, rq)),
        ["api", "events", source, event_id] => {
            only(rq, "GET", |rq| show(app, rq, source, event_id))
        }
        ["api", "events", source, event_id, "replay"] => {
            only(rq, "POST", |rq| replay_event(app, rq, source, event_id))
        }
        ["api", "events", source, event_id, "resolve"] => {
            only(rq, "POST", |rq| resolve_event(app, rq, source, event_id))
        }
        ["api", "replay"] => only(rq, "POST", |rq| replay_batch(app, rq)),
        [
            "api",
            "actions",
            source,
            action,
            verb @ ("pause" | "resume"),
        ] => {
            let pausing = *verb == "pause";
            only(rq, "POST", |_| {
                pause_or_resume(app, source, action, pausing)
            })
        }
        ["api", "actions", source, action, "probe"] => {
            only(rq, "POST", |_| probe_route(app, source, action))
        }
        ["api", "reconcile"] => match rq.method {
            "GET" | "HEAD" => reconcile_route(app, rq),
            "POST" => reconcile_apply(app, rq),
            _ => Reply::method_not_allowed("GET, POST"),
        },
        ["api", "actions"] => only(rq, "GET", |_| actions_route(app)),
        ["api", "overview"] => only(rq, "GET", |_| overview_route(app)),
        ["api", "rejected"] => only(rq, "GET", |rq| rejected::list(app, rq)),
        ["api", "rejected", id] => only(rq, "GET", |_| rejected::show(app, id)),
        ["api", "reingest"] => only(rq, "POST", |rq| rejected::reingest(app, rq)),
        ["api", "notifications"] => only(rq, "GET", |_| notifications_route(app)),
        _ => Reply::error(404, "no such admin route"),
    }
}

/// Answers 405 unless the method is `method` (HEAD counts as GET).
fn only(
    rq: &mut Incoming<'_>,
    method: &'static str,
    f: impl FnOnce(&mut Incoming<'_>) -> Reply,
) -> Reply {
    if rq.method == method || (method == "GET" && rq.method == "HEAD") {
        f(rq)
    } else {
        Reply::method_not_allowed(method)
    }
}

/// Compares the bearer token with the configured one in constant time: both
/// are hashed first, so neither the length nor a prefix leaks through
/// timing.
/// The bearer token, with the throttle on wrong ones: `Err` is the answer
/// (401, or 429 while the address is throttled).
fn check_token<B: Backend>(app: &App<B>, rq: &Incoming<'_>, token: &str) -> Result<(), Reply> {
    // The throttle holds back guesses only: the right token always passes,
    // and a request with no Authorization at all (a CORS preflight, a
    // browser's first GET) is no guess, so it is answered 401 uncounted.
    if !authorized(rq, token) {
        let unauthorized = || {
            Reply::error(
                401,
                "missing or wrong admin token: send Authorization: Bearer <admin_token>",
            )
            .with_header("WWW-Authenticate", "Bearer")
        };
        if crate::verify::headers::header_values(&rq.headers, "authorization")
            .next()
            .is_none()
        {
            return Err(unauthorized());
        }
        if let Some(wait) = app.admin_limiter.blocked(&rq.remote, now_ms()) {
            return Err(
                Reply::error(429, "too many failed admin authentications; retry later")
                    .with_header("Retry-After", wait.to_string()),
            );
        }
        app.admin_limiter.failed(&rq.remote, now_ms());
        // The address and path only: never what was sent as a token.
        crate::log::warn(
            "admin authentication failed",
            &[("remote", &rq.remote), ("path", &rq.path)],
        );
        return Err(unauthorized());
    }
    Ok(())
}

/// Whether `/metrics` may be answered on the main listener when there is
/// no `admin_listen`: always without an admin token, else only with it
/// (under the same throttle as the admin API). `Err` is the answer.
pub fn metrics_gate<B: Backend>(app: &App<B>, rq: &Incoming<'_>) -> Result<(), Reply> {
    match &app.config.admin_token {
        // The development default (no config file) has a token only for
        // this run's inspector sign-in, on a loopback listener: its metrics
        // stay open, as they are where no token is configured.
        _ if app.config.file.is_none() => Ok(()),
        None => Ok(()),
        Some(token) => check_token(app, rq, token.expose()),
    }
}

fn authorized(rq: &Incoming<'_>, token: &str) -> bool {
    let mut values = crate::verify::headers::header_values(&rq.headers, "authorization");
    let (Some(value), None) = (values.next(), values.next()) else {
        return false;
    };
    let Some((scheme, given)) = value.trim().split_once(' ') else {
        return false;
    };
    if !scheme.eq_ignore_ascii_case("bearer") {
        return false;
    }
    same_token(given.trim(), token)
}

/// The path's segments, percent-decoded; None when one does not decode.
fn segments(path: &str) -> Option<Vec<String>> {
    path.trim_start_matches('/')
        .trim_end_matches('/')
        .split('/')
        .map(percent_decode)
        .collect()
}

/// `%XX` decoded (and `+` as a space when `plus` for query strings).
fn decode(s: &str, plus: bool) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = bytes.get(i + 1..i + 3)?;
                let text = std::str::from_utf8(hex).ok()?;
                out.push(u8::from_str_radix(text, 16).ok()?);
                i += 3;
            }
            b'+' if plus => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

fn percent_decode(s: &str) -> Option<String> {
    decode(s, false)
}

/// The query string as (name, value) pairs, decoded.
fn query_pairs(query: &str) -> Result<Vec<(String, String)>, String> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            match (decode(k, true), decode(v, true)) {
                (Some(k), Some(v)) => Ok((k, v)),
                _ => Err("the query string is not valid percent-encoded UTF-8".to_string()),
            }
        })
        .collect()
}

fn op_error(e: OpError) -> Reply {
    match e {
        OpError::NotFound(m) => Reply::error(404, &m),
        OpError::Invalid(m) => Reply::error(400, &m),
        OpError::Store(e) => store_error(&e),
    }
}

fn store_error(e: &StoreError) -> Reply {
    crate::log::warn("admin api storage error", &[("error", &e.message)]);
    Reply::unavailable(&e.message)
}

/// Runs `f` on a connection for reading (either backend: `App::read`).
fn read<T, B: Backend>(
    app: &App<B>,
    f: impl FnOnce(&Db<'_>) -> Result<T, OpError>,
) -> Result<T, OpError> {
    app.read(f)
}

/// Runs `f` as one write of its own (`App::write`): a refusal (not
/// found, invalid) rolls back whatever `f` wrote and comes back as
/// itself; a storage failure fails the call. On PostgreSQL `f` may run
/// again after a deadlock.
fn write<T: Send + 'static, B: Backend>(
    app: &App<B>,
    f: impl FnMut(&Db<'_>) -> Result<T, OpError> + Send + 'static,
) -> Result<T, OpError> {
    app.write(f)
}

/// The request's JSON body as `T`; an empty body is `T::default()`. (A
/// body over `max_body_bytes` never reaches here: the server answers 413.)
fn body<T: for<'de> Deserialize<'de> + Default, B: Backend>(
    app: &App<B>,
    rq: &mut Incoming<'_>,
) -> Result<T, Reply> {
    let bytes = &rq.body;
    if bytes.len() > MAX_ADMIN_BODY.min(app.config.max_body_bytes) {
        return Err(Reply::error(413, "admin request body too large"));
    }
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(bytes).map_err(|e| Reply::error(400, &format!("invalid JSON body: {e}")))
}

fn list<B: Backend>(app: &App<B>, rq: &Incoming<'_>) -> Reply {
    let pairs = match query_pairs(rq.query) {
        Ok(p) => p,
        Err(m) => return Reply::error(400, &m),
    };
    let details = match wants_details(&pairs) {
        Ok(d) => d,
        Err(reply) => return reply,
    };
    let filter = match list_filter(pairs) {
        Ok(f) => f,
        Err(reply) => return reply,
    };
    // A poll that finds nothing new since its last answer gets a 304 from
    // a few index look-ups. `since` moves with the clock, so it is left
    // out of the tag only when absent.
    let query = rq.query.to_string();
    let known: Vec<String> = crate::verify::headers::header_values(&rq.headers, "if-none-match")
        .flat_map(|v| v.split(','))
        .map(|t| t.trim().to_string())
        .collect();
    let result = read(app, |db| {
        let tag = inspector::list_version(db, &query)?;
        if filter.since_ms.is_none() && known.contains(&tag) {
            return Ok((tag, None));
        }
        let mut list = inspect::list(db, &filter)?;
        if details {
            inspector::count_incidents(db, &mut list)?;
        }
        Ok((tag, Some(list)))
    });
    match result {
        Ok((tag, Some(list))) => Reply::json(200, &list).with_header("ETag", tag),
        Ok((tag, None)) => {
            Reply::text(304, "application/json", String::new()).with_header("ETag", tag)
        }
        Err(e) => op_error(e),
    }
}

/// The list's filter from its query (`details` read already): source,
/// status, type, since, until (unix seconds), id (a prefix), limit; an
/// unknown or malformed parameter is answered 400.
fn list_filter(pairs: Vec<(String, String)>) -> Result<ListFilter, Reply> {
    let (mut source, mut status, mut event_type, mut since, mut limit) =
        (None, None, None, None, 50u32);
    let (mut until, mut id_prefix) = (None, None);
    for (k, v) in pairs {
        let v = Some(v).filter(|v| !v.is_empty());
        match k.as_str() {
            "source" => source = v,
            "status" => status = v,
            "type" => event_type = v,
            "since" => since = v,
            "id" => id_prefix = v,
            "details" => {}
            "until" => match v.map(|v| v.parse::<i64>()) {
                Some(Ok(secs)) => until = Some(secs.saturating_mul(1000)),
                None => {}
                Some(Err(_)) => return Err(Reply::error(400, "until: expected unix seconds")),
            },
            "limit" => match v.map(|v| v.parse::<u32>()) {
                Some(Ok(n)) if (1..=MAX_LIST).contains(&n) => limit = n,
                None => {}
                _ => {
                    return Err(Reply::error(
                        400,
                        &format!("limit: expected a number from 1 to {MAX_LIST}"),
                    ));
                }
            },
            other => {
                return Err(Reply::error(
                    400,
                    &format!(
                        "unknown query parameter {other:?}: use source, status, type, since, until, id, limit, details"
                    ),
                ));
            }
        }
    }
    let mut filter = ListFilter::new(
        source,
        status,
        event_type,
        since.as_deref(),
        limit,
        now_ms(),
    )
    .map_err(op_error)?;
    filter.until_ms = until;
    filter.event_id_prefix = id_prefix;
    Ok(filter)
}

/// Whether the query asks for `details=true`: what the inspector shows
/// beyond the CLI's JSON (which the answer is otherwise exactly).
fn wants_details(pairs: &[(String, String)]) -> Result<bool, Reply> {
    match pairs
        .iter()
        .find(|(k, _)| k == "details")
        .map(|(_, v)| v.as_str())
    {
        None | Some("false") => Ok(false),
        Some("true" | "") => Ok(true),
        Some(_) => Err(Reply::error(400, "details: expected true or false")),
    }
}

fn show<B: Backend>(app: &App<B>, rq: &Incoming<'_>, source: &str, event_id: &str) -> Reply {
    let details = match query_pairs(rq.query).map_err(|m| Reply::error(400, &m)) {
        Ok(pairs) if pairs.iter().any(|(k, _)| k != "details") => {
            return Reply::error(400, "unknown query parameter: use details=true");
        }
        Ok(pairs) => match wants_details(&pairs) {
            Ok(d) => d,
            Err(reply) => return reply,
        },
        Err(reply) => return reply,
    };
    let shown = read(app, |db| {
        let mut event = inspect::show(db, source, event_id)?;
        if details {
            inspector::add_event_details(db, &mut event)?;
        }
        Ok(event)
    });
    match shown {
        Ok(v) => {
            // A tag of the answer itself: a page that polls one event gets
            // a 304 instead of the same payload again.
            let reply = Reply::json(200, &v);
            let tag = format!("\"{}\"", hex::encode(&Sha256::digest(&reply.body)[..12]));
            let known = crate::verify::headers::header_values(&rq.headers, "if-none-match")
                .flat_map(|v| v.split(','))
                .any(|t| t.trim() == tag);
            if known {
                Reply::text(304, "application/json", String::new()).with_header("ETag", tag)
            } else {
                reply.with_header("ETag", tag)
            }
        }
        Err(e) => op_error(e),
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct EventReplayBody {
    action: Option<String>,
    #[serde(default)]
    force: bool,
    #[serde(default)]
    dry_run: bool,
}

fn replay_event<B: Backend>(
    app: &App<B>,
    rq: &mut Incoming<'_>,
    source: &str,
    event_id: &str,
) -> Reply {
    let b: EventReplayBody = match body(app, rq) {
        Ok(b) => b,
        Err(reply) => return reply,
    };
    let target = replay::Target::Event {
        source: source.to_string(),
        event_id: event_id.to_string(),
        action: b.action,
        force: b.force,
    };
    if b.dry_run {
        return match read(app, |db| replay::plan(db, &app.config, &target)) {
            Ok(plan) => Reply::json(200, &replay::report(&plan, None, None)),
            Err(e) => op_error(e),
        };
    }
    let config = app.config.clone();
    let (source, event_id) = (source.to_string(), event_id.to_string());
    let result = write(app, move |db| {
        let conn = db;
        let plan = replay::plan(conn, &config, &target)?;
        let done = replay::apply(conn, &config, &plan.steps, replay::Origin::Api, now_ms())?;
        let state = replay::event_state(conn, &source, &event_id)?;
        Ok((plan, done, state))
    });
    match result {
        Ok((plan, done, state)) => {
            replayed(app, &done);
            Reply::json(200, &replay::report(&plan, Some(&done), state))
        }
        Err(e) => op_error(e),
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct BatchReplayBody {
    source: Option<String>,
    status: Option<String>,
    action: Option<String>,
    since: Option<String>,
    #[serde(default)]
    dry_run: bool,
}

fn replay_batch<B: Backend>(app: &App<B>, rq: &mut Incoming<'_>) -> Reply {
    let b: BatchReplayBody = match body(app, rq) {
        Ok(b) => b,
        Err(reply) => return reply,
    };
    let target =
        match replay::Target::batch(b.source, b.status, b.action, b.since.as_deref(), now_ms()) {
            Ok(t) => t,
            Err(e) => return op_error(e),
        };
    let plan = match read(app, |db| replay::plan(db, &app.config, &target)) {
        Ok(p) => p,
        Err(e) => return op_error(e),
    };
    if b.dry_run {
        return Reply::json(200, &replay::report(&plan, None, None));
    }
    let mut all = Vec::with_capacity(plan.steps.len());
    for chunk in plan.steps.chunks(replay::APPLY_CHUNK) {
        let (config, steps) = (app.config.clone(), chunk.to_vec());
        let done =
            app.write(move |db| replay::apply(db, &config, &steps, replay::Origin::Api, now_ms()));
        match done {
            Ok(done) => all.extend(done),
            Err(e) => return store_error(&e),
        }
    }
    replayed(app, &all);
    Reply::json(200, &replay::report(&plan, Some(&all), None))
}

/// After a replay's commit: SQL jobs ran again now, and are counted as
/// attempts; re-opened forward jobs wake the outbox.
fn replayed<B: Backend>(app: &App<B>, done: &[replay::Replayed]) {
    for d in done.iter().filter(|d| d.kind == JobKind::Sql) {
        let outcome = match d.result {
            ReplayResult::Ok => AttemptOutcome::Ok,
            ReplayResult::Failed => AttemptOutcome::Failed,
            ReplayResult::Requeued | ReplayResult::Skipped => continue,
        };
        app.metrics.attempt(&d.source, &d.action, outcome);
    }
    // A forward job re-opened, or an SQL job done now that forward jobs
    // of its event may wait for (after): wake the outbox.
    if replay::requeued_forward(done)
        || done
            .iter()
            .any(|d| d.kind == JobKind::Sql && d.result == ReplayResult::Ok)
    {
        (app.wake_outbox)();
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ResolveBody {
    action: Option<String>,
    note: Option<String>,
    #[serde(default)]
    dry_run: bool,
}

/// Closes a failed job by hand (`idemhook resolve`): 409 when the job is
/// not failed, 400 without an action or a note.
fn resolve_event<B: Backend>(
    app: &App<B>,
    rq: &mut Incoming<'_>,
    source: &str,
    event_id: &str,
) -> Reply {
    let b: ResolveBody = match body(app, rq) {
        Ok(b) => b,
        Err(reply) => return reply,
    };
    // An empty note is no note: the same answer (not the CLI's flag name).
    let note = b.note.filter(|n| !n.trim().is_empty());
    let (Some(action), Some(note)) = (b.action, note) else {
        return Reply::error(
            400,
            "a resolve needs {\"action\": ..., \"note\": ...}: the failed job's action, and what was done instead",
        );
    };
    let (source, event_id) = (source.to_string(), event_id.to_string());
    if b.dry_run {
        return match read(app, |db| {
            resolve::plan(db, &source, &event_id, &action, &note)
        }) {
            Ok(plan) => match &plan.refused {
                Some(reason) => Reply::error(409, reason),
                None => Reply::json(200, &resolve::report(&plan, None)),
            },
            Err(e) => op_error(e),
        };
    }
    let result = write(app, move |db| {
        let conn = db;
        let plan = resolve::plan(conn, &source, &event_id, &action, &note)?;
        if plan.refused.is_some() {
            return Ok((plan, None));
        }
        let done = resolve::apply(conn, &plan, replay::Origin::Api, now_ms())?;
        Ok((plan, Some(done)))
    });
    match result {
        Ok((plan, None)) => Reply::error(409, plan.refused.as_deref().unwrap_or("not failed")),
        Ok((_, Some(Err(reason)))) => Reply::error(409, &reason),
        Ok((plan, Some(Ok(done)))) => {
            // A forward job waiting on this action (`after`) may be due now.
            (app.wake_outbox)();
            Reply::json(200, &resolve::report(&plan, Some(&done)))
        }
        Err(e) => op_error(e),
    }
}

fn pause_or_resume<B: Backend>(app: &App<B>, source: &str, action: &str, pausing: bool) -> Reply {
    let config = app.config.clone();
    let (source, action) = (source.to_string(), action.to_string());
    let result = write(app, move |db| {
        if pausing {
            pause::pause(db, &config, &source, &action, now_ms())
        } else {
            pause::resume(db, &config, &source, &action, now_ms())
        }
    });
    match result {
        Ok(v) => {
            if !pausing && v["jobs_resumed"].as_u64().unwrap_or(0) > 0 {
                (app.wake_outbox)();
            }
            Reply::json(200, &v)
        }
        Err(e) => op_error(e),
    }
}

fn probe_route<B: Backend>(app: &App<B>, source: &str, action: &str) -> Reply {
    let config = app.config.clone();
    let (source, action) = (source.to_string(), action.to_string());
    match write(app, move |db| {
        crate::ops::probe::probe(db, &config, &source, &action, now_ms())
    }) {
        Ok(v) => {
            if v["probe_due"].as_bool() == Some(true) {
                (app.wake_outbox)();
            }
            Reply::json(200, &v)
        }
        Err(e) => op_error(e),
    }
}

fn actions_route<B: Backend>(app: &App<B>) -> Reply {
    match read(app, |db| inspector::actions(db, &app.config)) {
        Ok(v) => Reply::json(200, &v),
        Err(e) => op_error(e),
    }
}

/// `GET /api/notifications`: the recent notifications, newest first, as
/// `notify list --json` prints them.
fn notifications_route<B: Backend>(app: &App<B>) -> Reply {
    match read(app, |db| {
        crate::store::notifications::list(db, crate::ops::notify::LIST_LIMIT)
            .map_err(OpError::Store)
    }) {
        Ok(list) => {
            let shaped: Vec<serde_json::Value> = list
                .iter()
                .map(crate::ops::notify::contract_shape)
                .collect();
            Reply::json(200, &shaped)
        }
        Err(e) => op_error(e),
    }
}

fn overview_route<B: Backend>(app: &App<B>) -> Reply {
    match read(app, |db| {
        inspector::overview(db, &app.overview_cache, now_ms(), 60)
    }) {
        Ok(v) => Reply::json(200, &v),
        Err(e) => op_error(e),
    }
}

/// `GET /api/reconcile`, and with `?check=1` what the downstream says
/// about each stuck and failed job with a check (nothing is changed).
fn reconcile_route<B: Backend>(app: &App<B>, rq: &Incoming<'_>) -> Reply {
    let mut check = false;
    match query_pairs(rq.query) {
        Ok(pairs) => {
            for (k, v) in pairs {
                match (k.as_str(), v.as_str()) {
                    ("check", "1" | "true") => check = true,
                    ("check", "0" | "false" | "") => check = false,
                    ("check", other) => {
                        return Reply::error(
                            400,
                            &format!("check: expected 1 or 0, got {other:?}"),
                        );
                    }
                    (other, _) => {
                        return Reply::error(
                            400,
                            &format!("unknown query parameter {other:?}: use check"),
                        );
                    }
                }
            }
        }
        Err(m) => return Reply::error(400, &m),
    }
    let report = match read(app, |db| reconcile::reconcile(db, &app.config, now_ms())) {
        Ok(v) => v,
        Err(e) => return op_error(e),
    };
    if !check {
        return Reply::json(200, &report);
    }
    match reconcile::ask_downstream(&app.config, &report) {
        Ok(checked) => {
            count_checks(app, &checked);
            Reply::json(200, &reconcile::with_checks(report, &checked, false))
        }
        Err(e) => op_error(e),
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ReconcileBody {
    #[serde(default)]
    check: bool,
}

/// `POST /api/reconcile` with `{"check": true}`: asks the downstream like
/// `?check=1`, then marks done the jobs it has done (`reconcile --check
/// --yes`), and answers the report after.
fn reconcile_apply<B: Backend>(app: &App<B>, rq: &mut Incoming<'_>) -> Reply {
    let b: ReconcileBody = match body(app, rq) {
        Ok(b) => b,
        Err(reply) => return reply,
    };
    if !b.check {
        return Reply::error(
            400,
            "POST /api/reconcile marks done what a check finds done downstream: send {\"check\": true}",
        );
    }
    let report = match read(app, |db| reconcile::reconcile(db, &app.config, now_ms())) {
        Ok(v) => v,
        Err(e) => return op_error(e),
    };
    let checked = match reconcile::ask_downstream(&app.config, &report) {
        Ok(c) => c,
        Err(e) => return op_error(e),
    };
    count_checks(app, &checked);
    let config = app.config.clone();
    let result = write(app, move |db| {
        // A copy per run: on PostgreSQL the transaction may run again.
        let mut checked = checked.clone();
        let now = now_ms();
        reconcile::mark_done(db, &mut checked, "reconcile:api", now)?;
        let after = reconcile::reconcile(db, &config, now)?;
        Ok((checked, after))
    });
    match result {
        Ok((checked, after)) => {
            let marked: Vec<&reconcile::Checked> =
                checked.iter().filter(|c| c.marked_done.is_some()).collect();
            for c in &marked {
                app.metrics
                    .attempt(&c.source, &c.action, AttemptOutcome::Ok);
            }
            if !marked.is_empty() {
                // Jobs waiting for these (after) are due now.
                (app.wake_outbox)();
            }
            Reply::json(200, &reconcile::with_checks(after, &checked, true))
        }
        Err(e) => op_error(e),
    }
}

fn count_checks<B: Backend>(app: &App<B>, checked: &[reconcile::Checked]) {
    for c in checked {
        app.metrics
            .downstream_check(&c.source, &c.action, c.asked.answer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_paths_and_queries() {
        assert_eq!(
            segments("/api/events/stripe/evt%2F1").unwrap(),
            vec!["api", "events", "stripe", "evt/1"]
        );
        assert!(segments("/api/events/%ff").is_none());
        assert!(segments("/api/events/%4").is_none());
        assert_eq!(
            query_pairs("source=a+b&limit=5&").unwrap(),
            vec![
                ("source".into(), "a b".into()),
                ("limit".into(), "5".into())
            ]
        );
    }

    fn incoming_with(headers: Vec<(String, String)>) -> Incoming<'static> {
        Incoming {
            method: "GET",
            path: "/api/reconcile",
            query: "",
            headers,
            remote: String::new(),
            content_length: None,
            body: Vec::new(),
            permit: None,
            later: None,
        }
    }

    #[test]
    fn bearer_token_must_match_exactly() {
        let h = |v: &str| vec![("Authorization".to_string(), v.to_string())];
        assert!(authorized(&incoming_with(h("Bearer s3cret")), "s3cret"));
        assert!(authorized(&incoming_with(h("bearer s3cret")), "s3cret"));
        assert!(!authorized(&incoming_with(h("Bearer s3cre")), "s3cret"));
        assert!(!authorized(&incoming_with(h("Basic s3cret")), "s3cret"));
        assert!(!authorized(&incoming_with(Vec::new()), "s3cret"));
        let twice = vec![
            ("Authorization".to_string(), "Bearer s3cret".to_string()),
            ("Authorization".to_string(), "Bearer s3cret".to_string()),
        ];
        assert!(!authorized(&incoming_with(twice), "s3cret"));
    }
}
