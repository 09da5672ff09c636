//! Address resolution for the forward workers' HTTP agent.
//!
//! ureq 3's default resolver looks a downstream's host up on every request,
//! before it even checks its pool of open connections, and when a timeout
//! applies (every forward has one) it does so on a thread it spawns for the
//! lookup: a new thread per forwarded event, about a tenth of a forward
//! worker's time in the W4 profile. [`Resolver`] answers an IP address
//! without any lookup, and looks a name up (with ureq's own resolver,
//! timeout and all) at most once per [`NAME_TTL`].

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ureq::http::Uri;
use ureq::unversioned::resolver::{DefaultResolver, ResolvedSocketAddrs, Resolver as Resolve};
use ureq::unversioned::transport::NextTimeout;

/// How long a looked-up name's addresses are reused.
pub const NAME_TTL: Duration = Duration::from_secs(10);

#[derive(Debug, Default)]
pub struct Resolver {
    lookup: DefaultResolver,
    /// "scheme://host:port" -> when it was looked up, and its addresses.
    names: Mutex<HashMap<String, (Instant, ResolvedSocketAddrs)>>,
}

impl Resolve for Resolver {
    fn resolve(
        &self,
        uri: &Uri,
        config: &ureq::config::Config,
        timeout: NextTimeout,
    ) -> Result<ResolvedSocketAddrs, ureq::Error> {
        let Some(authority) = uri.authority() else {
            // Not a full URL: ureq's resolver says why.
            return self.lookup.resolve(uri, config, timeout);
        };
        let port = authority.port_u16().or(match uri.scheme_str() {
            Some("http") => Some(80),
            Some("https") => Some(443),
            _ => None,
        });
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']');
        if let (Ok(ip), Some(port)) = (host.parse::<IpAddr>(), port) {
            let mut addrs = self.empty();
            addrs.push(SocketAddr::new(ip, port));
            return Ok(addrs);
        }
        let key = format!("{}://{authority}", uri.scheme_str().unwrap_or(""));
        if let Ok(names) = self.names.lock()
            && let Some((at, addrs)) = names.get(&key)
            && at.elapsed() < NAME_TTL
        {
            return Ok(addrs.clone());
        }
        let addrs = self.lookup.resolve(uri, config, timeout)?;
        if let Ok(mut names) = self.names.lock() {
            names.insert(key, (Instant::now(), addrs.clone()));
        }
        Ok(addrs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(r: &Resolver, url: &str) -> Vec<SocketAddr> {
        let uri: Uri = url.parse().unwrap();
        let config = ureq::config::Config::default();
        let timeout = NextTimeout {
            after: Duration::from_secs(5).into(),
            reason: ureq::Timeout::Resolve,
            per_read: None,
            per_write: None,
        };
        r.resolve(&uri, &config, timeout).unwrap().to_vec()
    }

    #[test]
    fn addresses_need_no_lookup_and_names_are_looked_up_once() {
        let r = Resolver::default();
        assert_eq!(
            resolve(&r, "http://127.0.0.1:8080/hook"),
            vec!["127.0.0.1:8080".parse::<SocketAddr>().unwrap()]
        );
        assert_eq!(
            resolve(&r, "https://[::1]/hook"),
            vec!["[::1]:443".parse::<SocketAddr>().unwrap()]
        );
        assert!(r.names.lock().unwrap().is_empty());

        let first = resolve(&r, "http://localhost:9/");
        assert!(!first.is_empty() && first.iter().all(|a| a.ip().is_loopback() && a.port() == 9));
        assert_eq!(resolve(&r, "http://localhost:9/other"), first);
        assert_eq!(r.names.lock().unwrap().len(), 1);
    }
}
