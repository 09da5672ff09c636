//! `idemhook send SOURCE`: build a sample body (or take one), put the event
//! id and type where the source's rules read them (in a given body, only
//! when `--id` or `--type` asks), sign it as the provider would, POST it
//! and print the answer. For local development and smoke tests; exits
//! non-zero unless the answer is 2xx.

mod handshake;

use std::io::{Read, Write as _};
use std::process::ExitCode;

use anyhow::{Context, Result, anyhow, bail};
use serde_json::{Value, json};

use crate::config::{Config, Kind, Source};
use crate::ops::text::{Unwritten, stdout};
use crate::receive::key::{Atom, Input, Json, Part};

/// What the command line asked of `send`.
#[derive(Debug, Default)]
pub struct Options {
    pub url: Option<String>,
    pub file: Option<String>,
    pub id: Option<String>,
    pub event_type: Option<String>,
    /// A PKCS#8 PEM file, for the kinds that sign with a private key.
    pub private_key: Option<String>,
    /// Send the kind's verification handshake instead of an event.
    pub handshake: bool,
}

/// `idemhook send SOURCE`: a signed sample (or the given body) POSTed, or
/// with `--handshake` the kind's verification handshake; the answer
/// printed; exit 0 when it was 2xx, else 1.
pub fn run(config: &Config, source_name: &str, options: Options) -> Result<ExitCode> {
    let Options {
        url,
        file,
        id,
        event_type,
        private_key,
        handshake,
    } = options;
    let source = find_source(config, source_name)?;
    let now_ms = crate::time::now_ms();
    let private_key = match &private_key {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .with_context(|| format!("cannot read the private key {path}"))?,
        ),
        None => None,
    };
    let url = target_url(config, source, url);
    if handshake {
        return handshake::run(config, source, &url, now_ms / 1000, private_key.as_deref());
    }
    // A given body keeps its own id and type unless --id or --type asks
    // otherwise; headers that carry them get these values.
    let asked = Asked {
        id: id.is_some(),
        event_type: event_type.is_some(),
    };
    let id = id.unwrap_or_else(|| format!("evt_{:016x}", fastrand::u64(..)));
    let event_type = event_type.unwrap_or_else(|| default_type(source.kind).to_string());
    let (mut headers, body) =
        unsigned_request(source, (&id, &event_type), asked, file.as_deref(), now_ms)?;
    let body = sign(
        source,
        &mut headers,
        &body,
        (now_ms / 1000, &id),
        private_key.as_deref(),
    )?;
    let (status, text) = post(config, &url, &headers, &body)?;
    let (shown_id, shown_type) = id_and_type_read(source, &headers, &body);
    let mut out = stdout();
    writeln!(
        out,
        "POST {url} (event id {shown_id}, type {shown_type}) -> {status}"
    )
    .map_err(Unwritten)?;
    writeln!(out, "{text}").map_err(Unwritten)?;
    if (200..300).contains(&status) {
        Ok(ExitCode::SUCCESS)
    } else {
        Ok(ExitCode::from(1))
    }
}

/// The configured source named `name`, or an error listing the sources.
fn find_source<'c>(config: &'c Config, name: &str) -> Result<&'c Source> {
    config.source(name).ok_or_else(|| {
        let names: Vec<&str> = config.sources.iter().map(|s| s.name.as_str()).collect();
        anyhow!(
            "no source {name:?} in the config (sources: {})",
            names.join(", ")
        )
    })
}

/// Where to post: `--url` (a bare base URL means this source's hook route
/// on it), else this source's route on our own `listen`.
fn target_url(config: &Config, source: &Source, url: Option<String>) -> String {
    match url {
        Some(u) if u.trim_end_matches('/').matches('/').count() <= 2 => {
            format!("{}/hooks/{}", u.trim_end_matches('/'), source.name)
        }
        Some(u) => u,
        None => default_url(config, source),
    }
}

/// A request's headers, in order.
type Headers = Vec<(String, String)>;

/// The request before it is signed: its headers and body, the given one
/// (`--file`) or a sample, with the id and type put where the source's
/// rules read them.
fn unsigned_request(
    source: &Source,
    (id, event_type): (&str, &str),
    asked: Asked,
    file: Option<&str>,
    now_ms: i64,
) -> Result<(Headers, Vec<u8>)> {
    let given = read_given(file)?;
    // A row without a text sample sends idemhook's JSON one.
    let preset = source.kind.preset().filter(|p| !p.sample.is_empty());
    let content_type = preset.map_or("application/json", |p| p.content_type);
    let mut headers: Vec<(String, String)> = vec![("Content-Type".into(), content_type.into())];
    // A sample for a given --id is the same body every time (its creation
    // time is fixed), so sending it again is a redelivery, answered as a
    // plain duplicate, never a payload mismatch.
    let created = if asked.id {
        SAMPLE_CREATED
    } else {
        now_ms / 1000
    };
    // A provider's sample is text with the id and type written in.
    let preset_sample = match (&given, preset) {
        (None, Some(p)) => Some(
            p.sample
                .replace("{id}", id)
                .replace("{type}", event_type)
                .replace("{now}", &created.to_string())
                .replace("{secret}", &handshake::first_secret(source)),
        ),
        _ => None,
    };
    let given = given.or_else(|| preset_sample.map(String::into_bytes));
    let from_sample = preset.is_some() && file.is_none();
    let mut body_json = match &given {
        Some(bytes) => serde_json::from_slice::<Value>(bytes).ok(),
        None => Some(sample(source.kind, id, event_type, created)),
    };
    // With `batch`, the id and type go into the item (a given body's first).
    let batch_items = source.batch_items.as_deref();
    let target = match (batch_items, body_json.as_mut()) {
        (Some(pointer), Some(v)) if given.is_some() => v
            .pointer_mut(pointer)
            .and_then(Value::as_array_mut)
            .and_then(|items| items.first_mut()),
        (_, v) => v,
    };
    put_id_and_type(
        source,
        (id, event_type),
        asked,
        given.is_some() && !from_sample,
        &mut headers,
        target.filter(|_| !from_sample),
    )?;
    // A provider's sample has its kind's id and type written in; a key or
    // type the source sets itself is written where it reads them.
    if from_sample
        && source.batch().is_none()
        && let Some(v) = body_json.as_mut()
    {
        put_own_parts(source, (id, event_type), v);
    }
    // A sample of a batch source: the item, in a batch of one.
    if let (Some(pointer), None) = (batch_items, &given)
        && let Some(item) = body_json.take()
    {
        let mut root = json!({});
        set_pointer(&mut root, pointer, Value::Array(vec![item]));
        body_json = Some(root);
    }
    if let Some(p) = preset {
        extra_headers(p.name, id, &mut headers);
    }
    if source.kind.name() == "linear"
        && let Some(v) = body_json.as_mut()
    {
        set_pointer(v, "/webhookTimestamp", json!(now_ms));
    }
    let body = body_bytes(given.as_deref(), body_json.as_ref())?;
    Ok((headers, body))
}

/// Signs the request as the source's provider would (`now` in unix
/// seconds): the body the signer may rewrite, returned, and its signature
/// headers added to `headers`, replacing any of the same name.
fn sign(
    source: &Source,
    headers: &mut Vec<(String, String)>,
    body: &[u8],
    (now, id): (i64, &str),
    private_key: Option<&str>,
) -> Result<Vec<u8>> {
    let body = source
        .verifier
        .sign_body(body, now)
        .map_err(|e| anyhow!("cannot sign for source {}: {e}", source.name))?;
    let signature = if source.kind == Kind::None {
        Vec::new()
    } else {
        let request = crate::verify::Request::post(headers, &body);
        source
            .verifier
            .sign_request(&request, now, id, private_key)
            .map_err(|e| anyhow!("cannot sign for source {}: {e}", source.name))?
    };
    // The signer may set the id header itself (Standard Webhooks' webhook-id).
    headers.retain(|(name, _)| !signature.iter().any(|(n, _)| n.eq_ignore_ascii_case(name)));
    headers.extend(signature);
    Ok(body)
}

/// What the receiver reads as the event id and type, wherever they came
/// from (a batch: its first item's); `?` for what it cannot read.
fn id_and_type_read(
    source: &Source,
    headers: &[(String, String)],
    body: &[u8],
) -> (String, String) {
    let form: Vec<(String, String)> = form_urlencoded::parse(body).into_owned().collect();
    let body_json = serde_json::from_slice::<Value>(body).ok();
    let first_item = source.batch().and_then(|b| {
        let items = body_json.as_ref()?.pointer(b.items)?.as_array()?;
        let item = items.first()?;
        Some(if b.inner.is_empty() {
            item.clone()
        } else {
            item.pointer(b.inner)?.clone()
        })
    });
    let item_text = first_item.as_ref().map(Value::to_string);
    let input = Input {
        headers,
        json: first_item.as_ref().or(body_json.as_ref()).map(Json::Parsed),
        form: Some(&form),
        body: item_text.as_deref().map_or(body, str::as_bytes),
    };
    let shown_id = source
        .key
        .extract(&input)
        .unwrap_or_else(|_| "?".to_string());
    let shown_type = source.type_of(&input).unwrap_or_else(|| "?".to_string());
    (shown_id, shown_type)
}

/// Which of the id and the type the command line set.
#[derive(Clone, Copy)]
struct Asked {
    id: bool,
    event_type: bool,
}

/// The body given with `--file` (`-`: standard input), if any.
fn read_given(file: Option<&str>) -> Result<Option<Vec<u8>>> {
    Ok(match file {
        Some("-") => {
            let mut buf = Vec::new();
            std::io::stdin()
                .read_to_end(&mut buf)
                .context("cannot read standard input")?;
            Some(buf)
        }
        Some(path) => Some(std::fs::read(path).with_context(|| format!("cannot read {path}"))?),
        None => None,
    })
}

/// Puts the id and type where this source reads them: every key part gets
/// the id (a derived key then hashes them), and the type goes where the
/// type rule reads it. In a given body, JSON places change only when asked.
fn put_id_and_type(
    source: &Source,
    (id, event_type): (&str, &str),
    asked: Asked,
    given: bool,
    headers: &mut Vec<(String, String)>,
    mut body_json: Option<&mut Value>,
) -> Result<()> {
    let mut places: Vec<(Option<&Part>, &str, bool)> = source
        .key
        .parts
        .iter()
        .map(|p| (Some(p), id, asked.id))
        .collect();
    places.push((source.event_type.as_ref(), event_type, asked.event_type));
    for (part, value, asked) in places {
        let Some(atom) = part.and_then(|p| p.alternatives.first()) else {
            continue;
        };
        match atom {
            Atom::Header(name) => headers.push((name.clone(), value.to_string())),
            // In the sample already, or computed from the body.
            Atom::Form(_) | Atom::BodySha256 => {}
            Atom::Json(_) if given && !asked => {}
            // A provider's sample has the id and type written in already.
            Atom::Json(_) if body_json.is_none() && !given => {}
            Atom::Json(ptr) => match body_json.as_deref_mut() {
                Some(v) => set_pointer(v, ptr, Value::String(value.to_string())),
                None => {
                    bail!("the body is not JSON, so the id or type cannot be set at json:{ptr}")
                }
            },
        }
    }
    Ok(())
}

/// Writes the id (and type) at the `json:` places of a key (and type)
/// rule the source sets over its provider's kind.
fn put_own_parts(source: &Source, (id, event_type): (&str, &str), sample: &mut Value) {
    let Some(preset) = source.kind.preset() else {
        return;
    };
    let parse = |specs: &[&str]| -> Option<Vec<Part>> {
        specs.iter().map(|s| Part::parse(s).ok()).collect()
    };
    let mut places: Vec<(&Part, &str)> = Vec::new();
    if parse(preset.key).as_ref() != Some(&source.key.parts) {
        places.extend(source.key.parts.iter().map(|p| (p, id)));
    }
    if let Some(own) = &source.event_type
        && parse(preset.event_type.get(..1).unwrap_or(&[])).as_deref()
            != Some(std::slice::from_ref(own))
    {
        places.push((own, event_type));
    }
    for (part, value) in places {
        if let Some(Atom::Json(pointer)) = part.alternatives.first() {
            set_pointer(sample, pointer, Value::String(value.to_string()));
        }
    }
}

/// The bytes sent: a given body as it is unless something had to be set
/// in it, else the JSON written out.
fn body_bytes(given: Option<&[u8]>, body_json: Option<&Value>) -> Result<Vec<u8>> {
    Ok(match (given, body_json) {
        // A given non-JSON body is sent as is.
        (Some(bytes), None) => bytes.to_vec(),
        // A given JSON body keeps its bytes unless something had to be set.
        (Some(bytes), Some(v))
            if serde_json::from_slice::<Value>(bytes).ok().as_ref() == Some(v) =>
        {
            bytes.to_vec()
        }
        (_, Some(v)) => serde_json::to_vec(v)?,
        (None, None) => Vec::new(),
    })
}

/// POSTs the request; the answer's status and body.
fn post(
    config: &Config,
    url: &str,
    headers: &[(String, String)],
    body: &[u8],
) -> Result<(u16, String)> {
    let answer = exchange(config, "POST", url, headers, body)?;
    Ok((answer.status, answer.text))
}

/// What a request was answered.
struct Exchanged {
    status: u16,
    headers: Vec<(String, String)>,
    text: String,
}

/// Sends one request with `method`; the answer's status, headers and body.
fn exchange(
    config: &Config,
    method: &str,
    url: &str,
    headers: &[(String, String)],
    body: &[u8],
) -> Result<Exchanged> {
    let mut agent_config = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(std::time::Duration::from_secs(30)));
    if let Some(tls) = tls_for(config, url)? {
        agent_config = agent_config.tls_config(tls);
    }
    let agent: ureq::Agent = agent_config.build().into();
    let mut request = ureq::http::Request::builder().method(method).uri(url);
    for (name, value) in headers {
        request = request.header(name.as_str(), value.as_str());
    }
    let invalid = || format!("{method} {url}: not a valid request");
    let sent = if matches!(method, "GET" | "HEAD") {
        agent.run(request.body(()).with_context(invalid)?)
    } else {
        agent.run(request.body(body.to_vec()).with_context(invalid)?)
    };
    let mut response = sent.with_context(|| format!("{method} {url} failed"))?;
    let status = response.status().as_u16();
    let headers = response
        .headers()
        .iter()
        .map(|(n, v)| (n.as_str().to_owned(), v.to_str().unwrap_or("").to_owned()))
        .collect();
    let text = response.body_mut().read_to_string().unwrap_or_default();
    Ok(Exchanged {
        status,
        headers,
        text,
    })
}

/// The config's own listener, as a base URL (https with TLS).
fn own_base(config: &Config) -> String {
    let listen = config
        .listen
        .replace("0.0.0.0", "127.0.0.1")
        .replace("[::]", "[::1]");
    let scheme = if config.tls.is_some() {
        "https"
    } else {
        "http"
    };
    format!("{scheme}://{listen}")
}

fn default_url(config: &Config, source: &Source) -> String {
    format!("{}/hooks/{}", own_base(config), source.name)
}

/// The TLS settings for posting to `url`: to this machine's own TLS
/// listener (https on a loopback address or the configured listen host),
/// the config's `tls_cert` is the certificate to trust (it is often
/// self-signed); anywhere else, the public roots.
fn tls_for(config: &Config, url: &str) -> Result<Option<ureq::tls::TlsConfig>> {
    let Some(files) = &config.tls else {
        return Ok(None);
    };
    let Ok(uri) = url.parse::<ureq::http::Uri>() else {
        return Ok(None);
    };
    let host = uri.host().unwrap_or_default().trim_matches(['[', ']']);
    let listen_host = config
        .listen
        .rsplit_once(':')
        .map_or("", |(h, _)| h)
        .trim_matches(['[', ']']);
    let own = uri.scheme_str() == Some("https")
        && (host == "localhost"
            || host == listen_host
            || host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback()));
    if !own {
        return Ok(None);
    }
    let pem = std::fs::read(&files.cert)
        .with_context(|| format!("cannot read tls_cert {}", files.cert.display()))?;
    let certs = ureq::tls::parse_pem(&pem)
        .filter_map(|item| match item {
            Ok(ureq::tls::PemItem::Certificate(c)) => Some(c),
            _ => None,
        })
        .collect::<Vec<_>>();
    if certs.is_empty() {
        bail!("tls_cert {} holds no certificate", files.cert.display());
    }
    Ok(Some(
        ureq::tls::TlsConfig::builder()
            .root_certs(ureq::tls::RootCerts::new_with_certs(&certs))
            .build(),
    ))
}

fn default_type(kind: Kind) -> &'static str {
    kind.preset().map_or("test.event", |p| p.sample_type)
}

/// Headers a provider sends with every event besides its id and type.
fn extra_headers(kind: &str, id: &str, headers: &mut Vec<(String, String)>) {
    let set = |headers: &mut Vec<(String, String)>, name: &str, value: String| {
        if !headers.iter().any(|(n, _)| n.eq_ignore_ascii_case(name)) {
            headers.push((name.to_owned(), value));
        }
    };
    match kind {
        "twitch" => set(
            headers,
            "Twitch-Eventsub-Message-Type",
            "notification".to_owned(),
        ),
        "box" => set(headers, "box-delivery-id", format!("d{id}")),
        "gitlab" => set(headers, "X-Gitlab-Event-UUID", id.to_owned()),
        _ => {}
    }
}

/// The creation time written into a sample sent with `--id`:
/// 2026-01-01T00:00:00Z. A provider's redelivery carries the same body
/// (only the signature's timestamp is new), and so does a repeated send.
const SAMPLE_CREATED: i64 = 1_767_225_600;

/// A plausible body for each kind, created at `now` (unix seconds).
fn sample(kind: Kind, id: &str, event_type: &str, now: i64) -> Value {
    match kind.name() {
        "stripe" => json!({
            "id": id, "object": "event", "type": event_type, "created": now, "livemode": false,
            "data": {"object": {"id": "ch_demo", "object": "charge", "amount": 2000,
                                "currency": "usd", "customer": "cus_demo"}}
        }),
        "slack" => json!({
            "type": "event_callback", "event_id": id, "event_time": now, "team_id": "T0DEMO",
            "event": {"type": event_type, "text": "hello from idemhook send", "user": "U0DEMO"}
        }),
        "paddle" => json!({
            "event_id": id, "event_type": event_type, "occurred_at": now,
            "data": {"id": "txn_demo", "amount": "2000", "currency_code": "USD"}
        }),
        _ => json!({
            "id": id, "type": event_type, "created_at": now,
            "data": {"amount": 2000, "currency": "usd", "customer": "cus_demo"}
        }),
    }
}

/// Sets `ptr` (RFC 6901) in `root`, creating objects along the way.
pub fn set_pointer(root: &mut Value, ptr: &str, new: Value) {
    if ptr.is_empty() {
        *root = new;
        return;
    }
    let mut cur = root;
    let tokens: Vec<String> = ptr
        .split('/')
        .skip(1)
        .map(|t| t.replace("~1", "/").replace("~0", "~"))
        .collect();
    for (i, token) in tokens.iter().enumerate() {
        if !cur.is_object() {
            *cur = Value::Object(serde_json::Map::new());
        }
        let Value::Object(map) = cur else { return };
        if i + 1 == tokens.len() {
            map.insert(token.clone(), new);
            return;
        }
        cur = map
            .entry(token.clone())
            .or_insert_with(|| Value::Object(serde_json::Map::new()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sets_nested_pointers() {
        let mut v = json!({"a": 1});
        set_pointer(&mut v, "/event/type", json!("x"));
        set_pointer(&mut v, "/a~1b", json!(2));
        assert_eq!(v, json!({"a": 1, "event": {"type": "x"}, "a/b": 2}));
    }
}
