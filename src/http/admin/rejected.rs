//! The admin routes of refused deliveries kept, and re-ingest:
//! `GET /api/rejected`, `GET /api/rejected/{id}` and `POST /api/reingest`
//! (`ops::rejected`, `ops::reingest`).

use super::{body, op_error, query_pairs, read, write};
use crate::http::Incoming;
use crate::http::app::App;
use crate::http::reply::Reply;
use crate::store::backend::Backend;

/// `GET /api/rejected?source=&since=`: the kept refused requests.
pub(super) fn list<B: Backend>(app: &App<B>, rq: &Incoming<'_>) -> Reply {
    let pairs = match query_pairs(rq.query) {
        Ok(p) => p,
        Err(m) => return Reply::error(400, &m),
    };
    let (mut source, mut since) = (None, None);
    for (k, v) in pairs {
        let v = Some(v).filter(|v| !v.is_empty());
        match k.as_str() {
            "source" => source = v,
            "since" => since = v,
            other => {
                return Reply::error(
                    400,
                    &format!("unknown query parameter {other:?}: use source, since"),
                );
            }
        }
    }
    match read(app, |db| {
        crate::ops::rejected::list(db, source.as_deref(), since.as_deref())
    }) {
        Ok(list) => Reply::json(200, &list),
        Err(e) => op_error(e),
    }
}

/// `GET /api/rejected/{id}`: one kept request with its headers and body.
pub(super) fn show<B: Backend>(app: &App<B>, id: &str) -> Reply {
    let Ok(id) = id.parse::<i64>() else {
        return Reply::error(400, "the id of a kept request is a number");
    };
    match read(app, |db| crate::ops::rejected::show(db, id)) {
        Ok(shown) => Reply::json(200, &shown),
        Err(e) => op_error(e),
    }
}

/// `POST /api/reingest` with `{"source", "since", "id", "dry_run"}`:
/// as `idemhook reingest` (`dry_run` as without `--yes`), each kept
/// request in a write of its own. Answers `{source, dry_run, requests,
/// totals}`.
pub(super) fn reingest<B: Backend>(app: &App<B>, rq: &mut Incoming<'_>) -> Reply {
    use crate::http::hooks::reverify::reverify;
    use crate::ops::reingest;
    let request: reingest::Request = match body(app, rq) {
        Ok(r) => r,
        Err(reply) => return reply,
    };
    if request.source.is_empty() {
        return Reply::error(
            400,
            "source: name the source whose kept requests to re-ingest",
        );
    }
    let config = app.config.clone();
    let ids = match read(app, |db| reingest::plan_ids(db, &config, &request)) {
        Ok(ids) => ids,
        Err(e) => return op_error(e),
    };
    let mut requests = Vec::with_capacity(ids.len());
    for id in ids {
        let (config, source, dry_run) =
            (app.config.clone(), request.source.clone(), request.dry_run);
        let one = if dry_run {
            read(app, |db| {
                reingest::one(db, &config, &source, id, true, reverify)
            })
        } else {
            write(app, move |db| {
                reingest::one(db, &config, &source, id, false, reverify)
            })
        };
        match one {
            Ok(v) if v.is_null() => {}
            Ok(v) => requests.push(v),
            Err(e) => return op_error(e),
        }
    }
    let totals = reingest::summary(&requests, request.dry_run);
    Reply::json(
        200,
        &serde_json::json!({
            "source": request.source,
            "dry_run": request.dry_run,
            "requests": requests,
            "totals": totals,
        }),
    )
}
