//! An `[[notify]]` email target's `smtp://` or `smtps://` URL, taken
//! apart: checked when the config is read, used by `notify/send.rs` when a
//! mail goes out. Pure; no IO.

/// An `smtp://` or `smtps://` URL, taken apart.
pub struct SmtpUrl {
    pub tls_wrapper: bool,
    pub starttls_required: bool,
    pub host: String,
    pub port: u16,
    pub credentials: Option<(String, String)>,
}

pub fn parse_smtp(url: &str) -> Result<SmtpUrl, String> {
    let (tls_wrapper, rest) = if let Some(r) = url.strip_prefix("smtps://") {
        (true, r)
    } else if let Some(r) = url.strip_prefix("smtp://") {
        (false, r)
    } else {
        return Err("the SMTP URL must start smtp:// or smtps://".to_string());
    };
    let (authority, query) = match rest.split_once('?') {
        Some((a, q)) => (a, q),
        None => (rest, ""),
    };
    let authority = authority.trim_end_matches('/');
    let (userinfo, hostport) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, authority),
    };
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(s)
            .decode_utf8()
            .map(|c| c.into_owned())
            .map_err(|_| "the SMTP URL's user or password is not valid UTF-8".to_string())
    };
    let credentials = match userinfo {
        Some(u) => {
            let (user, pass) = u.split_once(':').unwrap_or((u, ""));
            Some((decode(user)?, decode(pass)?))
        }
        None => None,
    };
    let (host, port) = match hostport.rsplit_once(':') {
        Some((h, p)) => (
            h,
            p.parse::<u16>()
                .map_err(|_| "the SMTP URL's port is not a number".to_string())?,
        ),
        None => (hostport, if tls_wrapper { 465 } else { 25 }),
    };
    if host.is_empty() {
        return Err("the SMTP URL has no host".to_string());
    }
    let mut starttls_required = false;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair {
            "starttls=required" => starttls_required = true,
            "starttls=opportunistic" => starttls_required = false,
            other => {
                let key = other.split('=').next().unwrap_or("");
                return Err(format!(
                    "the SMTP URL's query {key:?} is not known: use starttls=required"
                ));
            }
        }
    }
    Ok(SmtpUrl {
        tls_wrapper,
        starttls_required,
        host: host.trim_matches(['[', ']']).to_string(),
        port,
        credentials,
    })
}

/// Checks an SMTP URL as the config reads it.
pub fn check_smtp_url(url: &str) -> Result<(), String> {
    parse_smtp(url).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_smtp_url_gives_host_port_tls_and_credentials() {
        let u = parse_smtp("smtp://me%40x:p%3Aw@mail.example.com:587?starttls=required").unwrap();
        assert_eq!((u.host.as_str(), u.port), ("mail.example.com", 587));
        assert!(u.starttls_required && !u.tls_wrapper);
        assert_eq!(u.credentials, Some(("me@x".to_string(), "p:w".to_string())));
        let s = parse_smtp("smtps://mail.example.com").unwrap();
        assert_eq!((s.port, s.tls_wrapper), (465, true));
        assert!(parse_smtp("smtp://h?tls=no").is_err());
        assert!(parse_smtp("http://h").is_err());
    }
}
