//! Local fakes of Stripe's and GitHub's APIs, on 127.0.0.1 port 0,
//! following the published references: Stripe's `GET /v1/events`
//! (`created[gte]`, `limit` 1..=100, `starting_after`, `has_more`, a
//! list object, `Authorization: Bearer`, errors as
//! `{"error": {"type", "message"}}`) and GitHub's
//! `GET /repos/{owner}/{repo}/hooks/{id}/deliveries` (`per_page`, a
//! `cursor` in `Link: <...>; rel="next"`, `Accept:
//! application/vnd.github+json`, errors as `{"message",
//! "documentation_url"}`) and `POST .../deliveries/{id}/attempts` (202),
//! after which the fake GitHub sends the delivery again, signed, to the
//! hook's URL, as GitHub does. A test may queue error answers first.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use serde_json::{Value, json};

/// An answer queued ahead of the normal ones: status, headers, body.
pub type Scripted = (u16, Vec<(String, String)>, String);

/// One request the fake saw.
#[derive(Clone, Debug)]
pub struct Seen {
    pub method: String,
    pub url: String,
    pub authorization: Option<String>,
    pub accept: Option<String>,
    pub status: u16,
    pub at: std::time::Instant,
}

struct Shared {
    key: String,
    script: Mutex<VecDeque<Scripted>>,
    seen: Mutex<Vec<Seen>>,
}

pub struct Fake {
    server: Arc<tiny_http::Server>,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Fake {
    pub fn url(&self) -> String {
        format!(
            "http://{}",
            self.server.server_addr().to_ip().expect("an IP address")
        )
    }

    /// Queues `status` with `headers` and `body` for the next request.
    pub fn script(&self, status: u16, headers: &[(&str, &str)], body: &str) {
        self.shared.script.lock().unwrap().push_back((
            status,
            headers
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect(),
            body.to_string(),
        ));
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.shared.seen.lock().unwrap().clone()
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        self.server.unblock();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn start(
    key: &str,
    handle: impl Fn(&tiny_http::Request, &str) -> (u16, Vec<(String, String)>, String) + Send + 'static,
    unauthorized: &'static str,
) -> Fake {
    let server = Arc::new(tiny_http::Server::http("127.0.0.1:0").expect("bind 127.0.0.1:0"));
    let shared = Arc::new(Shared {
        key: key.to_string(),
        script: Mutex::new(VecDeque::new()),
        seen: Mutex::new(Vec::new()),
    });
    let (s, sh) = (server.clone(), shared.clone());
    let thread = std::thread::spawn(move || {
        while let Ok(mut rq) = s.recv() {
            let header = |name: &str| {
                rq.headers()
                    .iter()
                    .find(|h| h.field.as_str().as_str().eq_ignore_ascii_case(name))
                    .map(|h| h.value.as_str().to_string())
            };
            let authorization = header("authorization");
            let accept = header("accept");
            let mut body = String::new();
            let _ = std::io::Read::read_to_string(rq.as_reader(), &mut body);
            let scripted = sh.script.lock().unwrap().pop_front();
            let (status, headers, text) = match scripted {
                Some(s) => s,
                None if authorization.as_deref() != Some(&format!("Bearer {}", sh.key)) => {
                    (401, Vec::new(), unauthorized.to_string())
                }
                None => handle(&rq, &body),
            };
            sh.seen.lock().unwrap().push(Seen {
                method: rq.method().as_str().to_string(),
                url: rq.url().to_string(),
                authorization,
                accept,
                status,
                at: std::time::Instant::now(),
            });
            let mut response = tiny_http::Response::from_string(text).with_status_code(status);
            response.add_header(
                tiny_http::Header::from_bytes("Content-Type", "application/json").unwrap(),
            );
            for (n, v) in headers {
                response.add_header(tiny_http::Header::from_bytes(n, v).unwrap());
            }
            let _ = rq.respond(response);
        }
    });
    Fake {
        server,
        shared,
        thread: Some(thread),
    }
}

fn query(url: &str) -> Vec<(String, String)> {
    let q = url.split_once('?').map_or("", |(_, q)| q);
    form_urlencoded::parse(q.as_bytes()).into_owned().collect()
}

/// A Stripe event object as `GET /v1/events` lists it.
pub fn stripe_event(id: &str, created: i64, amount: i64) -> Value {
    json!({
        "id": id,
        "object": "event",
        "api_version": "2024-06-20",
        "created": created,
        "data": {"object": {"id": format!("ch_{id}"), "object": "charge", "amount": amount}},
        "livemode": false,
        "pending_webhooks": 0,
        "request": {"id": null, "idempotency_key": null},
        "type": "charge.succeeded"
    })
}

/// Stripe: `events` in any order; listed newest first.
pub fn stripe(key: &str, mut events: Vec<Value>) -> Fake {
    events.sort_by_key(|e| std::cmp::Reverse(e["created"].as_i64().unwrap_or(0)));
    let error = |status: u16, message: &str| {
        (
            status,
            Vec::new(),
            json!({"error": {"type": "invalid_request_error", "message": message}}).to_string(),
        )
    };
    start(
        key,
        move |rq, _| {
            let url = rq.url().to_string();
            let path = url.split('?').next().unwrap_or("");
            if rq.method() != &tiny_http::Method::Get || path != "/v1/events" {
                return error(
                    404,
                    &format!("Unrecognized request URL ({} {path})", rq.method()),
                );
            }
            let q = query(&url);
            let get = |k: &str| q.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
            let limit = match get("limit").map(|l| l.parse::<usize>()) {
                None => 10,
                Some(Ok(l)) if (1..=100).contains(&l) => l,
                _ => return error(400, "Invalid integer: limit must be between 1 and 100"),
            };
            let gte = match get("created[gte]").map(|g| g.parse::<i64>()) {
                None => i64::MIN,
                Some(Ok(g)) => g,
                Some(Err(_)) => return error(400, "Invalid integer: created[gte]"),
            };
            let matching: Vec<&Value> = events
                .iter()
                .filter(|e| e["created"].as_i64().unwrap_or(0) >= gte)
                .collect();
            let start = match get("starting_after") {
                None => 0,
                Some(after) => match matching.iter().position(|e| e["id"] == after.as_str()) {
                    Some(i) => i + 1,
                    None => return error(400, &format!("No such event: '{after}'")),
                },
            };
            let page: Vec<Value> = matching
                .iter()
                .skip(start)
                .take(limit)
                .map(|e| (*e).clone())
                .collect();
            let has_more = start + page.len() < matching.len();
            (
                200,
                Vec::new(),
                json!({"object": "list", "url": "/v1/events", "has_more": has_more, "data": page})
                    .to_string(),
            )
        },
        r#"{"error": {"type": "invalid_request_error", "message": "Invalid API Key provided: rk_test_****"}}"#,
    )
}

/// One delivery of a GitHub hook as the deliveries API lists it.
#[derive(Clone, Debug)]
pub struct GithubDelivery {
    pub id: i64,
    pub guid: String,
    pub delivered_at: i64,
    pub redelivery: bool,
    pub event: String,
    pub body: String,
}

/// Where the fake GitHub sends a redelivery (set once the server is
/// up), and the hook's secret.
#[derive(Clone)]
pub struct HookTarget {
    pub url: Arc<Mutex<String>>,
    pub secret: String,
}

/// GitHub: `deliveries` (newest first by `delivered_at`) of `hook`
/// (`repos/OWNER/REPO/hooks/ID`); an attempt re-sends to `target`.
pub fn github(
    key: &str,
    hook: &str,
    mut deliveries: Vec<GithubDelivery>,
    target: HookTarget,
) -> Fake {
    deliveries.sort_by_key(|d| std::cmp::Reverse(d.delivered_at));
    let list_path = format!("/{hook}/deliveries");
    let not_found = || {
        (
            404,
            Vec::new(),
            json!({"message": "Not Found", "documentation_url": "https://docs.github.com/rest"})
                .to_string(),
        )
    };
    let base = Arc::new(Mutex::new(String::new()));
    let fake_base = base.clone();
    let fake = start(
        key,
        move |rq, _| {
            let url = rq.url().to_string();
            let path = url.split('?').next().unwrap_or("").to_string();
            if rq.method() == &tiny_http::Method::Get && path == list_path {
                let q = query(&url);
                let get = |k: &str| q.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
                let per_page = get("per_page")
                    .and_then(|p| p.parse::<usize>().ok())
                    .unwrap_or(30)
                    .clamp(1, 100);
                let from = get("cursor")
                    .and_then(|c| c.strip_prefix("v1_").and_then(|n| n.parse::<usize>().ok()))
                    .unwrap_or(0);
                let page: Vec<Value> = deliveries
                    .iter()
                    .skip(from)
                    .take(per_page)
                    .map(|d| {
                        json!({
                            "id": d.id, "guid": d.guid,
                            "delivered_at": rfc3339(d.delivered_at),
                            "redelivery": d.redelivery, "duration": 0.27,
                            "status": "OK", "status_code": 200,
                            "event": d.event, "action": null,
                            "installation_id": null, "repository_id": 1,
                            "throttled_at": null
                        })
                    })
                    .collect();
                let mut headers = Vec::new();
                if from + page.len() < deliveries.len() {
                    headers.push((
                        "Link".to_string(),
                        format!(
                            "<{}{list_path}?per_page={per_page}&cursor=v1_{}>; rel=\"next\"",
                            fake_base.lock().unwrap(),
                            from + page.len()
                        ),
                    ));
                }
                return (200, headers, Value::Array(page).to_string());
            }
            let attempt = path
                .strip_prefix(&format!("{list_path}/"))
                .and_then(|rest| rest.strip_suffix("/attempts"))
                .and_then(|id| id.parse::<i64>().ok());
            match (rq.method(), attempt) {
                (tiny_http::Method::Post, Some(id)) => {
                    let Some(d) = deliveries.iter().find(|d| d.id == id) else {
                        return not_found();
                    };
                    // GitHub redelivers on its own time, signed.
                    let url = target.url.lock().unwrap().clone();
                    let (secret, d) = (target.secret.clone(), d.clone());
                    std::thread::spawn(move || {
                        let headers =
                            crate::sign::github(&secret, d.body.as_bytes(), &d.guid, &d.event);
                        let _ = crate::harness::try_post(&url, &headers, d.body.as_bytes());
                    });
                    (202, Vec::new(), "{}".to_string())
                }
                _ => not_found(),
            }
        },
        r#"{"message": "Bad credentials", "documentation_url": "https://docs.github.com/rest"}"#,
    );
    *base.lock().unwrap() = fake.url();
    fake
}

fn rfc3339(secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[test]
fn rfc3339_of_known_times() {
    assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
    assert_eq!(rfc3339(1_764_460_800), "2025-11-30T00:00:00Z");
}
