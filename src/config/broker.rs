//! A forward to a message broker, chosen by the URL's scheme: the target
//! parsed from the URL at config time (host, credentials, where to
//! publish, with `{source}`, `{type}` and `{action}` placeholders).
//! `outbox/dest/` publishes; this only parses and refuses bad input.

use percent_encoding::percent_decode_str;

use crate::verify::Secret;

/// Where a broker forward publishes.
#[derive(Debug, Clone)]
pub enum Broker {
    Redis(RedisTarget),
    Nats(NatsTarget),
    Amqp(AmqpTarget),
}

/// `amqp://user:pass@host:5672/VHOST?exchange=E&routing_key=R`.
#[derive(Debug, Clone)]
pub struct AmqpTarget {
    /// The URL without its query (credentials in it): what the client
    /// connects to.
    pub uri: Secret,
    pub host: String,
    pub port: u16,
    pub vhost: String,
    /// Empty: the default exchange.
    pub exchange: String,
    pub routing_key: Template,
}

/// `nats://[user:password@]host:4222/SUBJECT`: a JetStream publish.
#[derive(Debug, Clone)]
pub struct NatsTarget {
    pub host: String,
    pub port: u16,
    pub username: Option<String>,
    pub password: Option<Secret>,
    /// The subject, with placeholders.
    pub subject: Template,
}

/// `redis://[user:password@]host:6379/DB/STREAM`.
#[derive(Debug, Clone)]
pub struct RedisTarget {
    pub host: String,
    pub port: u16,
    pub db: i64,
    pub username: Option<String>,
    pub password: Option<Secret>,
    /// The stream's name, with placeholders.
    pub stream: Template,
}

impl Broker {
    /// What `check` and logs call it (no credentials).
    pub fn describe(&self) -> String {
        match self {
            Broker::Redis(r) => format!(
                "redis {}:{} db {}, stream {}",
                r.host, r.port, r.db, r.stream.0
            ),
            Broker::Nats(n) => format!("nats {}:{}, subject {}", n.host, n.port, n.subject.0),
            Broker::Amqp(a) => format!(
                "amqp {}:{} vhost {}, exchange {:?}, routing key {}",
                a.host, a.port, a.vhost, a.exchange, a.routing_key.0
            ),
        }
    }
}

/// A name with `{source}`, `{type}` and `{action}` placeholders.
#[derive(Debug, Clone)]
pub struct Template(pub String);

impl Template {
    fn parse(text: &str, what: &str) -> Result<Template, String> {
        let mut rest = text;
        while let Some(open) = rest.find('{') {
            let after = &rest[open + 1..];
            let close = after
                .find('}')
                .ok_or_else(|| format!("forward: the {what} has a '{{' that is not closed"))?;
            let name = &after[..close];
            if !["source", "type", "action"].contains(&name) {
                return Err(format!(
                    "forward: the {what} has the placeholder {{{name}}}; only {{source}}, {{type}} and {{action}} are known"
                ));
            }
            rest = &after[close + 1..];
        }
        if rest.contains('}') {
            return Err(format!(
                "forward: the {what} has a '}}' that was not opened"
            ));
        }
        Ok(Template(text.to_string()))
    }

    pub fn render(&self, source: &str, event_type: &str, action: &str) -> String {
        self.0
            .replace("{source}", source)
            .replace("{type}", event_type)
            .replace("{action}", action)
    }
}

/// The broker of a forward URL that is not `http(s)://`; an unknown scheme
/// or a URL without its target is an error naming `forward`.
pub fn parse(url: &str) -> Result<Broker, String> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(format!(
            "forward: expected an http://, https://, redis://, nats:// or amqp:// URL, got {:?}",
            crate::config::database_url::redact(url)
        ));
    };
    match scheme {
        "redis" => redis(rest).map(Broker::Redis),
        "nats" => nats(rest).map(Broker::Nats),
        "amqp" => amqp(rest).map(Broker::Amqp),
        other => Err(format!(
            "forward: unknown scheme {other:?} (expected http://, https://, redis://, nats:// or amqp://)"
        )),
    }
}

/// `[user:password@]host[:port]`, the credentials percent-decoded.
struct Authority {
    host: String,
    port: Option<u16>,
    username: Option<String>,
    password: Option<Secret>,
}

fn authority(text: &str) -> Result<Authority, String> {
    let (userinfo, hostport) = match text.rfind('@') {
        Some(at) => (Some(&text[..at]), &text[at + 1..]),
        None => (None, text),
    };
    let decode = |s: &str| percent_decode_str(s).decode_utf8_lossy().into_owned();
    let (username, password) = match userinfo {
        None => (None, None),
        Some(u) => match u.split_once(':') {
            Some((user, pass)) => (
                Some(decode(user)).filter(|s| !s.is_empty()),
                Some(Secret::new(decode(pass))).filter(|s| !s.expose().is_empty()),
            ),
            None => (Some(decode(u)).filter(|s| !s.is_empty()), None),
        },
    };
    let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
        let end = v6
            .find(']')
            .ok_or("forward: an IPv6 host's ']' is missing")?;
        let port = v6[end + 1..].strip_prefix(':');
        (v6[..end].to_string(), port)
    } else {
        match hostport.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), Some(p)),
            None => (hostport.to_string(), None),
        }
    };
    if host.is_empty() {
        return Err("forward: the URL has no host".to_string());
    }
    let port = match port {
        None => None,
        Some(p) => Some(
            p.parse::<u16>()
                .map_err(|_| format!("forward: the port {p:?} is not a number"))?,
        ),
    };
    Ok(Authority {
        host,
        port,
        username,
        password,
    })
}

fn redis(rest: &str) -> Result<RedisTarget, String> {
    let (auth, path) = rest.split_once('/').unwrap_or((rest, ""));
    let a = authority(auth)?;
    let needs = "forward: a redis URL is redis://[user:password@]host:6379/DB/STREAM (e.g. redis://127.0.0.1:6379/0/events)";
    let (db, stream) = path
        .split_once('/')
        .ok_or_else(|| format!("{needs}: no stream"))?;
    let db: i64 = db
        .parse()
        .ok()
        .filter(|d| *d >= 0)
        .ok_or_else(|| format!("{needs}: the database {db:?} is not a number"))?;
    if stream.is_empty() {
        return Err(format!("{needs}: no stream"));
    }
    Ok(RedisTarget {
        host: a.host,
        port: a.port.unwrap_or(6379),
        db,
        username: a.username,
        password: a.password,
        stream: Template::parse(&percent_decode_str(stream).decode_utf8_lossy(), "stream")?,
    })
}

fn nats(rest: &str) -> Result<NatsTarget, String> {
    let (auth, subject) = rest.split_once('/').unwrap_or((rest, ""));
    let a = authority(auth)?;
    let subject = percent_decode_str(subject).decode_utf8_lossy().into_owned();
    if subject.is_empty() {
        return Err("forward: a nats URL is nats://[user:password@]host:4222/SUBJECT (e.g. nats://127.0.0.1:4222/events.{source}): no subject".to_string());
    }
    if subject
        .bytes()
        .any(|b| b.is_ascii_whitespace() || b == b'*' || b == b'>')
        || subject.starts_with('.')
        || subject.ends_with('.')
        || subject.contains("..")
    {
        return Err(format!(
            "forward: the subject {subject:?} is not one a message can be published to (no spaces, wildcards or empty tokens)"
        ));
    }
    Ok(NatsTarget {
        host: a.host,
        port: a.port.unwrap_or(4222),
        username: a.username,
        password: a.password,
        subject: Template::parse(&subject, "subject")?,
    })
}

fn amqp(rest: &str) -> Result<AmqpTarget, String> {
    let needs = "forward: an amqp URL is amqp://user:pass@host:5672/VHOST?exchange=E&routing_key=R";
    let (head, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (auth, vhost) = head.split_once('/').unwrap_or((head, ""));
    let a = authority(auth)?;
    let mut exchange = None;
    let mut routing_key = String::new();
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        match k.as_ref() {
            "exchange" => exchange = Some(v.into_owned()),
            "routing_key" => routing_key = v.into_owned(),
            other => return Err(format!("{needs}: unknown parameter {other:?}")),
        }
    }
    let exchange = exchange
        .ok_or_else(|| format!("{needs}: no exchange (exchange= names the default exchange)"))?;
    let port = a.port.unwrap_or(5672);
    let host = if a.host.contains(':') {
        format!("[{}]", a.host)
    } else {
        a.host.clone()
    };
    Ok(AmqpTarget {
        uri: Secret::new(format!(
            "amqp://{auth_part}{host}:{port}/{vhost}",
            auth_part = auth.rfind('@').map_or("", |at| &auth[..=at])
        )),
        host: a.host,
        port,
        vhost: if vhost.is_empty() {
            "/".to_string()
        } else {
            percent_decode_str(vhost).decode_utf8_lossy().into_owned()
        },
        exchange,
        routing_key: Template::parse(&routing_key, "routing key")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_urls() {
        let Broker::Redis(r) =
            parse("redis://u:p%40ss@127.0.0.1:6380/2/ev-{source}-{type}").unwrap()
        else {
            panic!("redis");
        };
        assert_eq!((r.host.as_str(), r.port, r.db), ("127.0.0.1", 6380, 2));
        assert_eq!(r.username.as_deref(), Some("u"));
        assert_eq!(r.password.as_ref().map(|p| p.expose()), Some("p@ss"));
        assert_eq!(
            r.stream.render("shop", "invoice.paid", "a"),
            "ev-shop-invoice.paid"
        );
        let Broker::Redis(r) = parse("redis://localhost/0/events").unwrap() else {
            panic!("redis");
        };
        assert_eq!(
            (r.port, r.username.is_none(), r.password.is_none()),
            (6379, true, true)
        );
        for bad in [
            "redis://127.0.0.1:6379/0",
            "redis://127.0.0.1:6379/0/",
            "redis://127.0.0.1:6379",
            "redis://127.0.0.1:6379/x/events",
            "redis://127.0.0.1:6379/0/ev-{event}",
            "redis://:6379/0/events",
            "kafka://127.0.0.1:9092/topic",
            "nats://127.0.0.1:4222",
            "nats://127.0.0.1:4222/",
            "nats://127.0.0.1:4222/events.>",
            "nats://127.0.0.1:4222/events..x",
            "amqp://u:p@127.0.0.1:5672/%2f",
            "amqp://u:p@127.0.0.1:5672/%2f?routing_key=r",
            "amqp://u:p@127.0.0.1:5672/%2f?exchange=e&queue=q",
            "ftp://host/x",
        ] {
            let e = parse(bad).expect_err(bad);
            assert!(e.starts_with("forward:"), "{bad}: {e}");
        }
        let Broker::Nats(n) = parse("nats://u:pw@127.0.0.1/events.{source}.{type}").unwrap() else {
            panic!("nats");
        };
        assert_eq!((n.host.as_str(), n.port), ("127.0.0.1", 4222));
        assert_eq!(
            n.subject.render("shop", "invoice.paid", "a"),
            "events.shop.invoice.paid"
        );
        assert_eq!(n.password.as_ref().map(|p| p.expose()), Some("pw"));
        let Broker::Amqp(a) =
            parse("amqp://u:p@127.0.0.1:5673/%2f?exchange=ev&routing_key={source}.{type}").unwrap()
        else {
            panic!("amqp");
        };
        assert_eq!(
            (a.port, a.vhost.as_str(), a.exchange.as_str()),
            (5673, "/", "ev")
        );
        assert_eq!(a.uri.expose(), "amqp://u:p@127.0.0.1:5673/%2f");
        assert_eq!(a.routing_key.render("shop", "paid", "x"), "shop.paid");
        let e = parse("redis://u:hunter2@h:1/0").unwrap_err();
        assert!(!e.contains("hunter2"), "{e}");
    }
}
