//! Where a forward job goes: one [`Destination`] per forward action, a
//! module per kind (the URL's scheme chooses it). `http.rs` POSTs to an
//! `http://` or `https://` URL, `redis.rs` adds to a Redis stream, `nats.rs`
//! publishes to JetStream, `amqp.rs` to a RabbitMQ exchange. A destination only sends and classifies:
//! leases, retries, `give_up_after`, the circuit, pacing, order, `after`,
//! pause and replay are the worker's and the take's, the same for every
//! kind. A new kind is a module here with a [`Destination`] and a line in
//! [`Destinations::new`]; a destination keeps its connections pooled per
//! target and re-establishes them itself after a failure.

use std::collections::HashMap;
use std::sync::Arc;

use anyhow::Result;

use super::Attempt;
use crate::config::broker::Broker;
use crate::config::{ActionKind, Config};
use crate::verify::Verifier;

mod amqp;
pub(crate) mod client;
mod http;
mod nats;
mod redis;

pub(crate) use client::HttpClient;

/// One job's message, as every destination sees it.
pub(crate) struct Message<'a> {
    pub source: &'a str,
    pub event_id: &'a str,
    pub action: &'a str,
    pub event_type: Option<&'a str>,
    pub content_type: Option<&'a str>,
    pub body: &'a [u8],
    /// The attempt's number (1-based): `X-Idemhook-Attempt`.
    pub n: i64,
}

impl Message<'_> {
    /// `{source}:{event_id}:{action}`: the downstream's deduplication key.
    pub fn key(&self) -> String {
        format!("{}:{}:{}", self.source, self.event_id, self.action)
    }
}

/// A forward action's target. `send` makes one attempt, within the
/// action's timeout, and says what it came to; it never panics and never
/// blocks past the timeout.
pub(crate) trait Destination: Send + Sync {
    fn send(&self, message: &Message<'_>) -> Attempt;

    /// One attempt per message, in order, each with its own verdict, all
    /// within the action's one timeout. A destination that pipelines
    /// (the brokers) sends every message before it reads the first
    /// acknowledgement; the default sends them one after another.
    fn send_batch(&self, messages: &[Message<'_>]) -> Vec<Attempt> {
        messages.iter().map(|m| self.send(m)).collect()
    }

    /// Whether `send_batch` pipelines: the worker sends a batch only then.
    fn pipelines(&self) -> bool {
        false
    }
}

/// Why a broker did not take a message: the attempt's error kind, its
/// verdict and the broker's words.
pub(super) type Failure = (&'static str, crate::outbox::retry::Verdict, String);

/// What a broker said of one message: taken (the attempt's response line
/// and the broker's id for it, if any), or why not.
pub(super) type Taken = Result<(String, Option<String>), Failure>;

/// The attempts of a batch sent from `started_at` (ms), one per broker
/// answer and in the same order; `broker` prefixes each error.
pub(super) fn attempts(broker: &str, started_at: i64, answers: Vec<Taken>) -> Vec<Attempt> {
    let finished_at = crate::time::now_ms();
    answers
        .into_iter()
        .map(|answer| {
            let mut attempt = Attempt::started(started_at);
            match answer {
                Ok((line, id)) => {
                    attempt.verdict = crate::outbox::retry::Verdict::Done;
                    attempt.request_id = id;
                    attempt.response_head = Some(line);
                }
                Err((kind, verdict, message)) => {
                    attempt.error_kind = Some(kind);
                    attempt.verdict = verdict;
                    attempt.error = Some(format!("{broker}: {message}"));
                }
            }
            attempt.finished_at = finished_at;
            attempt
        })
        .collect()
}

/// One message sent as a batch of one (the brokers' `send`).
pub(super) fn send_one(dest: &dyn Destination, m: &Message<'_>) -> Attempt {
    let started_at = crate::time::now_ms();
    dest.send_batch(std::slice::from_ref(m))
        .pop()
        .unwrap_or_else(|| Attempt::started(started_at))
}

/// The destinations of every forward action, by (source, action), and the
/// HTTP clients (for `check` requests and health probes).
pub(crate) struct Destinations {
    by_action: HashMap<(String, String), Arc<dyn Destination>>,
    clients: HashMap<(String, String), Arc<HttpClient>>,
    signers: HashMap<(String, String), Verifier>,
    /// Every forward action's destination pipelines (brokers only).
    all_pipeline: bool,
}

impl Destinations {
    pub fn new(
        config: &Config,
        workers: usize,
        signers: &HashMap<(String, String), Verifier>,
    ) -> Result<Destinations> {
        let clients = client::clients(config, workers);
        let mut by_action: HashMap<(String, String), Arc<dyn Destination>> = HashMap::new();
        for s in &config.sources {
            for a in &s.actions {
                let ActionKind::Forward(f) = &a.kind else {
                    continue;
                };
                let key = (s.name.clone(), a.name.clone());
                if let Some(broker) = &f.broker {
                    let dest: Arc<dyn Destination> = match broker {
                        Broker::Redis(target) => Arc::new(redis::RedisDest::new(
                            target,
                            f.timeout,
                            s.retention,
                            workers,
                        )?),
                        Broker::Nats(target) => Arc::new(nats::NatsDest::new(target, f.timeout)),
                        Broker::Amqp(target) => Arc::new(amqp::AmqpDest::new(target, f.timeout)),
                    };
                    by_action.insert(key, dest);
                } else if let Some(client) = clients.get(&key) {
                    by_action.insert(
                        key.clone(),
                        Arc::new(http::HttpDest {
                            url: f.url.clone(),
                            timeout: f.timeout,
                            request_id_header: f.request_id_header.clone(),
                            client: client.clone(),
                            signer: signers.get(&key).cloned(),
                        }),
                    );
                }
            }
        }
        let all_pipeline = !by_action.is_empty() && by_action.values().all(|d| d.pipelines());
        Ok(Destinations {
            by_action,
            clients,
            signers: signers.clone(),
            all_pipeline,
        })
    }

    /// Whether every forward action's destination sends a batch in one
    /// round trip: then a worker's whole take goes out at once, and
    /// sharing a backlog out over the workers gains nothing.
    pub fn all_pipeline(&self) -> bool {
        self.all_pipeline
    }

    pub fn get(&self, source: &str, action: &str) -> Option<&Arc<dyn Destination>> {
        self.by_action
            .get(&(source.to_string(), action.to_string()))
    }

    pub fn signer(&self, source: &str, action: &str) -> Option<&Verifier> {
        self.signers.get(&(source.to_string(), action.to_string()))
    }

    pub fn client(&self, source: &str, action: &str) -> Option<&Arc<HttpClient>> {
        self.clients.get(&(source.to_string(), action.to_string()))
    }
}

/// `idemhook check`'s look at each broker target: connects and says what
/// it found, one line per action (`Ok`), or why it cannot be used (`Err`).
/// With a warning, if any (a JetStream duplicate window shorter than the
/// action's lease plus retry_max).
pub(crate) fn report(config: &Config) -> Vec<(String, Result<String, String>, Option<String>)> {
    let mut out = Vec::new();
    for s in &config.sources {
        for a in &s.actions {
            let ActionKind::Forward(f) = &a.kind else {
                continue;
            };
            let Some(broker) = &f.broker else {
                continue;
            };
            let (found, warning) = match broker {
                Broker::Redis(target) => (redis::report(target, f.timeout), None),
                Broker::Nats(target) => nats::report(target, f.timeout, f.lease + f.retry_max),
                Broker::Amqp(target) => (amqp::report(target, f.timeout), None),
            };
            out.push((
                format!("{}/{} ({})", s.name, a.name, broker.describe()),
                found,
                warning,
            ));
        }
    }
    out
}
