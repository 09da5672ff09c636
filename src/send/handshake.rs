//! `idemhook send SOURCE --handshake`: the verification request the
//! source's provider sends before its first event, signed where the
//! provider signs it, so a team can check its endpoint answers it.

use std::io::Write as _;
use std::process::ExitCode;

use anyhow::{Result, anyhow, bail};
use serde_json::json;

use super::{Exchanged, exchange};
use crate::config::presets::Handshake;
use crate::config::{Config, Kind, Source};
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

pub(super) fn run(
    config: &Config,
    source: &Source,
    url: &str,
    now: i64,
    private_key: Option<&str>,
) -> Result<ExitCode> {
    let handshake = match source.kind {
        Kind::Slack => None,
        kind => Some(kind.preset().map_or(Handshake::None, |p| p.handshake)),
    };
    let challenge = token();
    let sign = |body: &[u8], headers: &mut Vec<(String, String)>| -> Result<()> {
        let request = Request::post(headers, body);
        let signed = source
            .verifier
            .sign_request(&request, now, &challenge, private_key)
            .map_err(|e| anyhow!("cannot sign for source {}: {e}", source.name))?;
        headers.extend(signed);
        Ok(())
    };
    let json_type = vec![("Content-Type".to_owned(), "application/json".to_owned())];
    let (method, url, mut headers, body): (&str, String, Vec<(String, String)>, Vec<u8>) =
        match handshake {
            None => {
                let body =
                    json!({"type": "url_verification", "token": "t", "challenge": challenge})
                        .to_string();
                ("POST", url.to_owned(), json_type, body.into_bytes())
            }
            Some(Handshake::Zoom) => {
                let body = json!({"event": "endpoint.url_validation", "payload": {"plainToken": challenge}, "event_ts": now * 1000}).to_string();
                ("POST", url.to_owned(), json_type, body.into_bytes())
            }
            Some(Handshake::Twitch) => {
                let body = json!({"challenge": challenge, "subscription": {"id": "sub1", "type": "channel.follow", "version": "1", "status": "webhook_callback_verification_pending"}}).to_string();
                let mut headers = json_type;
                headers.push(("Twitch-Eventsub-Message-Id".to_owned(), token()));
                headers.push((
                    "Twitch-Eventsub-Message-Type".to_owned(),
                    "webhook_callback_verification".to_owned(),
                ));
                headers.push((
                    "Twitch-Eventsub-Subscription-Type".to_owned(),
                    "channel.follow".to_owned(),
                ));
                ("POST", url.to_owned(), headers, body.into_bytes())
            }
            Some(Handshake::Discord) => {
                ("POST", url.to_owned(), json_type, br#"{"type":1}"#.to_vec())
            }
            Some(Handshake::Meta) => {
                let verify_token = source
                    .verify_token
                    .as_ref()
                    .map(|t| t.expose().to_owned())
                    .unwrap_or_default();
                let query: String = form_urlencoded::Serializer::new(String::new())
                    .append_pair("hub.mode", "subscribe")
                    .append_pair("hub.verify_token", &verify_token)
                    .append_pair("hub.challenge", &challenge)
                    .finish();
                ("GET", format!("{url}?{query}"), Vec::new(), Vec::new())
            }
            Some(Handshake::Dropbox) => (
                "GET",
                format!("{url}?challenge={challenge}"),
                Vec::new(),
                Vec::new(),
            ),
            Some(Handshake::Msgraph) => (
                "POST",
                format!("{url}?validationToken={challenge}"),
                vec![("Content-Type".to_owned(), "text/plain".to_owned())],
                Vec::new(),
            ),
            Some(Handshake::Okta) => (
                "GET",
                url.to_owned(),
                vec![(
                    "X-Okta-Verification-Challenge".to_owned(),
                    challenge.clone(),
                )],
                Vec::new(),
            ),
            Some(Handshake::Asana) => {
                let secret = Some(first_secret(source))
                    .filter(|s| !s.is_empty())
                    .unwrap_or_else(token);
                (
                    "POST",
                    url.to_owned(),
                    vec![("X-Hook-Secret".to_owned(), secret)],
                    Vec::new(),
                )
            }
            Some(Handshake::Notion) => {
                let secret = Some(first_secret(source))
                    .filter(|s| !s.is_empty())
                    .unwrap_or_else(|| format!("secret_{}", token()));
                let body = json!({"verification_token": secret}).to_string();
                ("POST", url.to_owned(), json_type, body.into_bytes())
            }
            Some(Handshake::Trello) => ("HEAD", url.to_owned(), Vec::new(), Vec::new()),
            Some(Handshake::None) => bail!(
                "kind {} has no verification handshake; send an event instead",
                source.kind
            ),
        };
    let signed = matches!(
        handshake,
        None | Some(Handshake::Zoom | Handshake::Twitch | Handshake::Discord)
    );
    if signed {
        sign(&body, &mut headers)?;
    } else if handshake == Some(Handshake::Okta) {
        // Okta's check carries the event hook's auth header.
        sign(&body, &mut headers)?;
    }
    let Exchanged {
        status,
        headers: answer_headers,
        text,
    } = exchange(config, method, &url, &headers, &body)?;
    let mut out = stdout();
    writeln!(
        out,
        "{method} {url} (handshake of kind {}) -> {status}",
        source.kind
    )
    .map_err(Unwritten)?;
    if handshake == Some(Handshake::Asana) {
        let echoed = headers
            .iter()
            .find(|(n, _)| n == "X-Hook-Secret")
            .map(|(_, v)| v);
        let back = answer_headers
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
    writeln!(out, "{text}").map_err(Unwritten)?;
    Ok(if (200..300).contains(&status) {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
