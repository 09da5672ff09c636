//! `public_origin`: the scheme, host and port browsers use to reach
//! idemhook when a proxy in front terminates TLS (`https://hooks.example.com`).
//! The inspector's cookie is `Secure` when its scheme is https, and the
//! inspector's same-origin checks accept it.

/// A parsed `public_origin`: `http` or `https`, a host and an optional
/// port, no path, no user info.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicOrigin {
    /// As browsers send it in `Origin`: `https://hooks.example.com`.
    pub origin: String,
    /// The `Host` a browser sends for it: `hooks.example.com`, with the
    /// port when it is not the scheme's default.
    pub host: String,
    pub https: bool,
}

impl PublicOrigin {
    pub(super) fn parse(value: &str) -> Result<PublicOrigin, String> {
        let bad = |why: &str| {
            Err(format!(
                "public_origin: {why}: write the scheme and host browsers use, such as \"https://hooks.example.com\""
            ))
        };
        let (https, rest) = if let Some(rest) = value.strip_prefix("https://") {
            (true, rest)
        } else if let Some(rest) = value.strip_prefix("http://") {
            (false, rest)
        } else {
            return bad("must start with https:// or http://");
        };
        let host = rest.strip_suffix('/').unwrap_or(rest).to_ascii_lowercase();
        if host.is_empty() {
            return bad("names no host");
        }
        if host.contains(['/', '?', '#', '@', ' ']) {
            return bad("must be a scheme and a host (and port), no path, query or user");
        }
        let default_port = if https { ":443" } else { ":80" };
        let host = host
            .strip_suffix(default_port)
            .map(str::to_string)
            .unwrap_or(host);
        let scheme = if https { "https" } else { "http" };
        Ok(PublicOrigin {
            origin: format!("{scheme}://{host}"),
            host,
            https,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::PublicOrigin;

    #[test]
    fn an_origin_is_a_scheme_and_a_host() {
        let o = PublicOrigin::parse("https://Hooks.example.com/").expect("valid");
        assert_eq!(o.origin, "https://hooks.example.com");
        assert_eq!(o.host, "hooks.example.com");
        assert!(o.https);
        let o = PublicOrigin::parse("https://h.example:443").expect("valid");
        assert_eq!(o.origin, "https://h.example");
        let o = PublicOrigin::parse("http://h.example:8443").expect("valid");
        assert_eq!((o.host.as_str(), o.https), ("h.example:8443", false));
        for bad in [
            "hooks.example.com",
            "https://",
            "https://h/ui",
            "ftp://h",
            "https://u:p@h",
        ] {
            assert!(PublicOrigin::parse(bad).is_err(), "{bad}");
        }
    }
}
