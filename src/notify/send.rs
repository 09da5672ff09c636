//! Sending one message to one target: an HTTP POST (Slack, webhook,
//! signed with Standard Webhooks headers when the target has a
//! `sign_secret`) or an SMTP mail (`lettre`, blocking, rustls). Every
//! call is bounded by [`TIMEOUT`]; an error never holds the target's URL
//! or credentials.

use std::time::Duration;

use lettre::Transport as _;
use lettre::message::header::ContentType;
use lettre::transport::smtp::authentication::Credentials;
use lettre::transport::smtp::client::{Tls, TlsParameters};

use super::message::Message;
use crate::config::notify::{NotifyTarget, TargetKind, signer};
use crate::config::smtp_url::parse_smtp;
use crate::verify::Secret;

/// How long one send may take, connecting included.
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// Sends `m` to `target`; `id` names the message (the webhook's
/// `webhook-id`). Ok once the target accepted it (2xx, or SMTP 250).
pub fn send(target: &NotifyTarget, m: &Message, id: &str, now_ms: i64) -> Result<(), String> {
    match &target.kind {
        TargetKind::Slack(url) => post(url, &m.slack(), None, id, now_ms),
        TargetKind::Webhook { url, sign_secret } => {
            post(url, &m.webhook(), sign_secret.as_ref(), id, now_ms)
        }
        TargetKind::Email { smtp, from, to } => {
            let (subject, body) = m.email();
            mail(smtp, from, to, &subject, body)
        }
    }
}

/// `text` with the secret URL, and its path, replaced.
fn scrub(text: &str, url: &str) -> String {
    let mut out = text.replace(url, "[REDACTED]");
    if let Some((_, rest)) = url.split_once("://")
        && let Some(i) = rest.find('/')
        && rest.len() > i + 1
    {
        out = out.replace(&rest[i..], "/[REDACTED]");
    }
    out
}

fn post(
    url: &Secret,
    body: &serde_json::Value,
    sign: Option<&Secret>,
    id: &str,
    now_ms: i64,
) -> Result<(), String> {
    let bytes = body.to_string().into_bytes();
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(0)
        .timeout_global(Some(TIMEOUT))
        .timeout_connect(Some(Duration::from_secs(5)))
        .user_agent(concat!("idemhook/", env!("CARGO_PKG_VERSION")))
        .build()
        .into();
    let mut request = agent
        .post(url.expose())
        .header("Content-Type", "application/json");
    if let Some(secret) = sign {
        let headers = signer(secret)?.sign(&bytes, now_ms / 1000, id)?;
        for (name, value) in headers {
            request = request.header(name, value);
        }
    }
    match request.send(&bytes[..]) {
        Ok(response) => {
            let status = response.status().as_u16();
            if (200..300).contains(&status) {
                Ok(())
            } else {
                Err(format!("the target answered {status}"))
            }
        }
        Err(e) => Err(scrub(
            &format!("cannot reach the target: {e}"),
            url.expose(),
        )),
    }
}

fn mail(
    smtp: &Secret,
    from: &str,
    to: &[String],
    subject: &str,
    body: String,
) -> Result<(), String> {
    let u = parse_smtp(smtp.expose())?;
    let mut builder = lettre::Message::builder()
        .from(
            from.parse()
                .map_err(|_| format!("{from:?} is not an email address"))?,
        )
        .subject(subject)
        .header(ContentType::TEXT_PLAIN);
    for addr in to {
        builder = builder.to(addr
            .parse()
            .map_err(|_| format!("{addr:?} is not an email address"))?);
    }
    let email = builder
        .body(body)
        .map_err(|e| format!("cannot build the mail: {e}"))?;
    let params = TlsParameters::new(u.host.clone())
        .map_err(|e| format!("cannot set up TLS for the SMTP server: {e}"))?;
    let tls = if u.tls_wrapper {
        Tls::Wrapper(params)
    } else if u.starttls_required {
        Tls::Required(params)
    } else {
        Tls::Opportunistic(params)
    };
    let mut transport = lettre::SmtpTransport::builder_dangerous(u.host.as_str())
        .port(u.port)
        .tls(tls)
        .timeout(Some(TIMEOUT));
    if let Some((user, pass)) = u.credentials {
        transport = transport.credentials(Credentials::new(user, pass));
    }
    let response = transport.build().send(&email).map_err(|e| {
        scrub(
            &format!("the SMTP server refused the mail: {e}"),
            smtp.expose(),
        )
    })?;
    if response.is_positive() {
        Ok(())
    } else {
        Err(format!("the SMTP server answered {}", response.code()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_send_error_holds_no_secret_path() {
        let text = scrub(
            "cannot reach the target: http://127.0.0.1:9/services/T0/SECRET failed",
            "http://127.0.0.1:9/services/T0/SECRET",
        );
        assert!(!text.contains("SECRET"), "{text}");
    }
}
