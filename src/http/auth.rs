//! Who may use the admin API and the inspector, as state and checks that
//! do not touch HTTP: the admin token compared in constant time, the
//! throttle on wrong tokens per client address, and the inspector's
//! signed-in sessions. Owned by `App`; asked by `http::admin` and
//! `http::ui`, which read the request and shape the answer.

use std::collections::HashMap;
use std::sync::Mutex;

use sha2::{Digest, Sha256};

/// A session unused this long ends (milliseconds).
const IDLE_MS: i64 = 2 * 3600 * 1000;
/// A session ends this long after its sign-in, however used (milliseconds).
pub const LIFETIME_MS: i64 = 12 * 3600 * 1000;
/// The most sessions kept; the least recently used goes first.
const MAX_SESSIONS: usize = 1000;

/// Limits failed admin authentications per client address (an IPv4
/// address, an IPv6 /64: one host usually holds a whole /64): after
/// `MAX_FAILURES` within a window, further failures from that address get
/// 429 until the window ends (the right token still passes). Bounded in
/// memory: the table is cleared when it grows too large. What it refuses is
/// counted (`idemhook_admin_throttled_total`) and summarised in the log,
/// a line at most every `SUMMARY_MS`, never a line per refusal.
pub struct AuthLimiter {
    failures: std::sync::Mutex<std::collections::HashMap<String, (u32, i64)>>,
    throttled: std::sync::atomic::AtomicU64,
    /// When the last summary line was written, and the refusals since.
    summary: Mutex<(i64, u64)>,
}

/// The shortest time between two summary lines of throttled requests.
const SUMMARY_MS: i64 = 10_000;

/// The throttle's key for a client (`ip:port` or `[ipv6]:port`): the IPv4
/// address, or the IPv6 /64 (an IPv4-mapped IPv6 address as IPv4).
pub fn client_key(remote: &str) -> String {
    use std::net::{IpAddr, SocketAddr};
    let ip = match remote.parse::<SocketAddr>() {
        Ok(addr) => addr.ip(),
        Err(_) => match remote.parse::<IpAddr>() {
            Ok(ip) => ip,
            Err(_) => return remote.to_string(),
        },
    };
    match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => v4.to_string(),
            None => {
                let s = v6.segments();
                format!(
                    "{}/64",
                    std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0)
                )
            }
        },
    }
}

const MAX_FAILURES: u32 = 10;
const WINDOW_MS: i64 = 60_000;
const MAX_TRACKED: usize = 10_000;

impl Default for AuthLimiter {
    fn default() -> AuthLimiter {
        AuthLimiter {
            failures: std::sync::Mutex::new(std::collections::HashMap::new()),
            throttled: std::sync::atomic::AtomicU64::new(0),
            summary: Mutex::new((i64::MIN, 0)),
        }
    }
}

impl AuthLimiter {
    /// Seconds to wait, when the client at `remote` is blocked: a refusal,
    /// counted and summarised.
    pub fn blocked(&self, remote: &str, now: i64) -> Option<i64> {
        let key = client_key(remote);
        let wait = {
            let map = self.failures.lock().ok()?;
            let (count, since) = map.get(&key)?;
            let left = since + WINDOW_MS - now;
            (*count >= MAX_FAILURES && left > 0).then(|| (left + 999) / 1000)
        }?;
        self.throttled
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.summarise(&key, now);
        Some(wait)
    }

    /// One line for the refusals since the last line, when that is
    /// `SUMMARY_MS` ago (the first refusal is told at once).
    fn summarise(&self, key: &str, now: i64) {
        let refused = {
            let Ok(mut s) = self.summary.lock() else {
                return;
            };
            s.1 += 1;
            if s.0 != i64::MIN && now - s.0 < SUMMARY_MS {
                return;
            }
            let refused = s.1;
            *s = (now, 0);
            refused
        };
        crate::log::warn(
            "admin authentications throttled",
            &[
                ("refused", &refused),
                ("last_client", &key),
                (
                    "note",
                    &"429 after repeated failed admin authentications from one address; the count is idemhook_admin_throttled_total",
                ),
            ],
        );
    }

    /// Requests refused by the throttle since start.
    pub fn throttled(&self) -> u64 {
        self.throttled.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The throttle's counter, in Prometheus text format.
    pub fn render_metrics(&self, out: &mut String) {
        out.push_str("# HELP idemhook_admin_throttled_total Admin and inspector authentications refused (429) by the throttle on repeated wrong tokens.\n");
        out.push_str("# TYPE idemhook_admin_throttled_total counter\n");
        out.push_str(&format!(
            "idemhook_admin_throttled_total {}\n",
            self.throttled()
        ));
    }

    /// A wrong token from the client at `remote`.
    pub fn failed(&self, remote: &str, now: i64) {
        let ip = client_key(remote);
        let ip = ip.as_str();
        if let Ok(mut map) = self.failures.lock() {
            if map.len() >= MAX_TRACKED {
                map.retain(|_, (_, since)| now - *since < WINDOW_MS);
                if map.len() >= MAX_TRACKED {
                    map.clear();
                }
            }
            let entry = map.entry(ip.to_string()).or_insert((0, now));
            if now - entry.1 >= WINDOW_MS {
                *entry = (0, now);
            }
            entry.0 += 1;
        }
    }
}

/// Whether `given` is the admin token, in constant time: both are hashed
/// first, so neither the length nor a prefix leaks through timing.
pub fn same_token(given: &str, token: &str) -> bool {
    let a = Sha256::digest(given.as_bytes());
    let b = Sha256::digest(token.as_bytes());
    let diff = a
        .iter()
        .zip(b.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y));
    diff == 0
}

/// Signed-in browsers, in memory: a restart signs everyone out. Keyed by
/// the SHA-256 of the cookie's value, so the table holds no usable secret.
#[derive(Default)]
pub struct SignIns {
    /// Sign-in time and last use, by the cookie's digest.
    map: Mutex<HashMap<[u8; 32], (i64, i64)>>,
}

/// Whether a session signed in at `created` and last used at `seen` is
/// still alive at `now`.
fn alive((created, seen): (i64, i64), now: i64) -> bool {
    now - seen < IDLE_MS && now - created < LIFETIME_MS
}

impl SignIns {
    /// A new session; returns the cookie's value.
    pub fn create(&self, now: i64) -> Option<String> {
        let value = random_token()?;
        let mut map = self.map.lock().ok()?;
        map.retain(|_, times| alive(*times, now));
        if map.len() >= MAX_SESSIONS
            && let Some(oldest) = map
                .iter()
                .min_by_key(|(_, (_, seen))| *seen)
                .map(|(k, _)| *k)
        {
            map.remove(&oldest);
        }
        map.insert(Sha256::digest(value.as_bytes()).into(), (now, now));
        Some(value)
    }

    /// Whether `value` is a live session; using it keeps it alive.
    pub fn touch(&self, value: &str, now: i64) -> bool {
        let key: [u8; 32] = Sha256::digest(value.as_bytes()).into();
        let Ok(mut map) = self.map.lock() else {
            return false;
        };
        match map.get_mut(&key) {
            Some(times) if alive(*times, now) => {
                times.1 = now;
                true
            }
            Some(_) => {
                map.remove(&key);
                false
            }
            None => false,
        }
    }

    pub fn end(&self, value: &str) {
        let key: [u8; 32] = Sha256::digest(value.as_bytes()).into();
        if let Ok(mut map) = self.map.lock() {
            map.remove(&key);
        }
    }
}

/// 32 random bytes from the kernel, as hex.
pub fn random_token() -> Option<String> {
    use std::io::Read;
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .ok()?;
    Some(hex::encode(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_authentications_are_limited_per_address() {
        let l = AuthLimiter::default();
        for _ in 0..MAX_FAILURES {
            assert_eq!(l.blocked("1.2.3.4:5", 1_000), None);
            l.failed("1.2.3.4:5", 1_000);
        }
        assert_eq!(l.blocked("1.2.3.4:6", 1_000), Some(60));
        assert_eq!(l.blocked("5.6.7.8:5", 1_000), None);
        assert_eq!(l.blocked("1.2.3.4:5", 1_000 + WINDOW_MS), None);
        assert_eq!(l.throttled(), 1);
    }

    #[test]
    fn ipv6_clients_are_keyed_by_their_64() {
        assert_eq!(
            client_key("[2001:db8:1:2:aaaa::1]:443"),
            "2001:db8:1:2::/64"
        );
        assert_eq!(
            client_key("[2001:db8:1:2:bbbb::9]:80"),
            client_key("[2001:db8:1:2::7]:1")
        );
        assert_ne!(
            client_key("[2001:db8:1:3::1]:1"),
            client_key("[2001:db8:1:2::1]:1")
        );
        assert_eq!(client_key("[::ffff:10.0.0.1]:1"), "10.0.0.1");
        assert_eq!(client_key("127.0.0.1:9"), "127.0.0.1");
    }

    #[test]
    fn sessions_end_when_idle_or_signed_out() {
        let s = SignIns::default();
        let v = s.create(0).unwrap();
        assert!(s.touch(&v, 1000));
        assert!(!s.touch("other", 1000));
        assert!(s.touch(&v, 1000 + IDLE_MS - 1));
        assert!(!s.touch(&v, 1000 + 3 * IDLE_MS));
        // Used all along, a session still ends LIFETIME_MS after sign-in.
        let u = s.create(0).unwrap();
        let mut t = 0;
        while t + IDLE_MS / 2 < LIFETIME_MS {
            t += IDLE_MS / 2;
            assert!(s.touch(&u, t), "alive at {t}");
        }
        assert!(!s.touch(&u, LIFETIME_MS));
        let w = s.create(0).unwrap();
        s.end(&w);
        assert!(!s.touch(&w, 1));
    }
}
