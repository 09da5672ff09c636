//! `idemhook send SOURCE --handshake`: the verification request the
//! source's provider sends before its first event, signed where the
//! provider signs it, so a team can check its endpoint answers it.

use std::io::Write as _;
use std::process::ExitCode;

use anyhow::{Result, anyhow, bail};
use serde_json::json;

use super::{Exchanged, exchange};
use crate::config::presets::{Answer, Echo, Field, Handshake};
use crate::config::{Config, Source};
use crate::ops::text::{Unwritten, stdout};
use crate::verify::Request;

/// Secret 0 as text, for the samples and handshakes that carry it in the
/// clear (Graph's `clientState`, Okta's and GitLab's header); empty when
/// the source has none.
pub(super) fn first_secret(source: &Source) -> String {
    source.verifier.first_secret_text().unwrap_or_default()
}

/// A random token for a challenge.
fn token() -> String {
    format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..))
}

/// `idemhook send SOURCE --handshake`: the kind's verification request
/// (Slack's `url_verification` for Slack), signed where the provider
/// signs it, sent, and its answer printed; exit 0 when it was 2xx.
pub(super) fn run(
    config: &Config,
    source: &Source,
    url: &str,
    now: i64,
    private_key: Option<&str>,
) -> Result<ExitCode> {
    let handshake = source
        .kind
        .preset()
        .map_or(Handshake::None, |p| p.handshake);
    let challenge = token();
    let Outgoing {
        method,
        url,
        mut headers,
        body,
    } = match handshake {
        Handshake::Echo(e) => echo_request(e, url, &challenge),
        Handshake::Zoom | Handshake::Twitch => challenge_request(handshake, url, now, &challenge),
        handshake => plain_request(source, handshake, url, &challenge)?,
    };
    let signed = match handshake {
        Handshake::Echo(e) => !e.unsigned,
        other => matches!(other, Handshake::Zoom | Handshake::Twitch),
    };
    // Okta's check carries the event hook's auth header.
    if signed || handshake == Handshake::Okta {
        let request = Request::post(&headers, &body);
        let signature = source
            .verifier
            .sign_request(&request, now, &challenge, private_key)
            .map_err(|e| anyhow!("cannot sign for source {}: {e}", source.name))?;
        headers.extend(signature);
    }
    let answer = exchange(config, method, &url, &headers, &body)?;
    print_answer(source, handshake, (method, &url), &headers, &answer)?;
    Ok(if (200..300).contains(&answer.status) {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// A handshake request as sent.
struct Outgoing {
    method: &'static str,
    url: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

/// The handshakes the provider signs that are more than an echo, a JSON
/// POST carrying the challenge or computed from it: Zoom's, Twitch's.
fn challenge_request(handshake: Handshake, url: &str, now: i64, challenge: &str) -> Outgoing {
    let mut headers = vec![("Content-Type".to_owned(), "application/json".to_owned())];
    let body = match handshake {
        Handshake::Zoom => json!({"event": "endpoint.url_validation", "payload": {"plainToken": challenge}, "event_ts": now * 1000}).to_string().into_bytes(),
        _ => {
            headers.push(("Twitch-Eventsub-Message-Id".to_owned(), token()));
            headers.push((
                "Twitch-Eventsub-Message-Type".to_owned(),
                "webhook_callback_verification".to_owned(),
            ));
            headers.push((
                "Twitch-Eventsub-Subscription-Type".to_owned(),
                "channel.follow".to_owned(),
            ));
            json!({"challenge": challenge, "subscription": {"id": "sub1", "type": "channel.follow", "version": "1", "status": "webhook_callback_verification_pending"}}).to_string().into_bytes()
        }
    };
    Outgoing {
        method: "POST",
        url: url.to_owned(),
        headers,
        body,
    }
}

/// A handshake that echoes a field or answers a constant, as its row
/// describes it: the challenge in a query parameter (a GET, or a POST of
/// plain text), a header, or a JSON body (with the field that says what
/// it is), or only what says what it is (Discord's PING, Trello's HEAD).
fn echo_request(e: Echo, url: &str, challenge: &str) -> Outgoing {
    let method = e.methods.first().copied().unwrap_or("POST");
    let mut out = Outgoing {
        method,
        url: url.to_owned(),
        headers: Vec::new(),
        body: Vec::new(),
    };
    let mut body = json!({});
    let mut put = |field: Field, value: &str, out: &mut Outgoing| match field {
        Field::Query(name) => {
            let query: String = form_urlencoded::Serializer::new(String::new())
                .append_pair(name, value)
                .finish();
            out.url = format!("{}?{query}", out.url);
        }
        Field::Header(name) => out.headers.push((name.to_owned(), value.to_owned())),
        Field::Json(pointer) => super::set_pointer(&mut body, pointer, json!(value)),
        Field::JsonInt(pointer) => {
            let number = value
                .parse::<i64>()
                .map_or_else(|_| json!(value), |n| json!(n));
            super::set_pointer(&mut body, pointer, number)
        }
    };
    if let Some((field, value)) = e.when {
        put(field, value, &mut out);
    }
    if let Answer::Challenge(field) = e.answer {
        put(field, challenge, &mut out);
    }
    let in_json = |field: Field| matches!(field, Field::Json(_) | Field::JsonInt(_));
    let json_body = e.when.is_some_and(|(field, _)| in_json(field))
        || matches!(e.answer, Answer::Challenge(field) if in_json(field));
    if json_body {
        out.headers
            .push(("Content-Type".to_owned(), "application/json".to_owned()));
        out.body = body.to_string().into_bytes();
    } else if method == "POST" {
        out.headers
            .push(("Content-Type".to_owned(), "text/plain".to_owned()));
    }
    out
}

/// The handshakes sent unsigned that are more than an echo (Okta's is
/// signed as its events are): Meta's, Okta's, Asana's, Notion's. A kind
/// without a handshake is an error.
fn plain_request(
    source: &Source,
    handshake: Handshake,
    url: &str,
    challenge: &str,
) -> Result<Outgoing> {
    let get = |url: String| Outgoing {
        method: "GET",
        url,
        headers: Vec::new(),
        body: Vec::new(),
    };
    let post = |headers: Vec<(String, String)>, body: Vec<u8>| Outgoing {
        method: "POST",
        url: url.to_owned(),
        headers,
        body,
    };
    Ok(match handshake {
        Handshake::Meta => {
            let verify_token = source
                .verify_token
                .as_ref()
                .map(|t| t.expose().to_owned())
                .unwrap_or_default();
            let query: String = form_urlencoded::Serializer::new(String::new())
                .append_pair("hub.mode", "subscribe")
                .append_pair("hub.verify_token", &verify_token)
                .append_pair("hub.challenge", challenge)
                .finish();
            get(format!("{url}?{query}"))
        }
        Handshake::Okta => Outgoing {
            headers: vec![(
                "X-Okta-Verification-Challenge".to_owned(),
                challenge.to_owned(),
            )],
            ..get(url.to_owned())
        },
        Handshake::Asana => {
            let secret = Some(first_secret(source))
                .filter(|s| !s.is_empty())
                .unwrap_or_else(token);
            post(vec![("X-Hook-Secret".to_owned(), secret)], Vec::new())
        }
        Handshake::Notion => {
            let secret = Some(first_secret(source))
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| format!("secret_{}", token()));
            let body = json!({"verification_token": secret}).to_string();
            post(
                vec![("Content-Type".to_owned(), "application/json".to_owned())],
                body.into_bytes(),
            )
        }
        Handshake::None => bail!(
            "kind {} has no verification handshake; send an event instead",
            source.kind
        ),
        Handshake::Zoom | Handshake::Twitch => {
            bail!("the {handshake:?} handshake is a signed challenge")
        }
        Handshake::Echo(e) => bail!("the {} handshake is an echo", e.name),
    })
}

/// What `send --handshake` prints: the request and its status, for Asana
/// whether the secret came back, then the answer's body.
fn print_answer(
    source: &Source,
    handshake: Handshake,
    (method, url): (&str, &str),
    headers: &[(String, String)],
    answer: &Exchanged,
) -> Result<()> {
    let mut out = stdout();
    writeln!(
        out,
        "{method} {url} (handshake of kind {}) -> {}",
        source.kind, answer.status
    )
    .map_err(Unwritten)?;
    if handshake == Handshake::Asana {
        let echoed = headers
            .iter()
            .find(|(n, _)| n == "X-Hook-Secret")
            .map(|(_, v)| v);
        let back = answer
            .headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case("x-hook-secret"))
            .map(|(_, v)| v);
        writeln!(
            out,
            "X-Hook-Secret echoed: {}",
            if back.is_some() && back == echoed {
                "yes"
            } else {
                "no"
            }
        )
        .map_err(Unwritten)?;
    }
    writeln!(out, "{}", answer.text).map_err(Unwritten)?;
    Ok(())
}
