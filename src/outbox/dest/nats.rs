//! A `nats://` forward: a JetStream publish to the subject with the
//! header `Nats-Msg-Id: {idempotency_key}` (and the `X-Idemhook-*`
//! headers), done when the stream's ack arrives; an ack marked duplicate
//! is done too. JetStream drops a message whose id it has seen within the
//! stream's duplicate window: exactly once per key within that window.
//!
//! The client is `async-nats` (the synchronous `nats` crate is deprecated)
//! behind a private runtime confined to this module: one thread drives the
//! connections' I/O, and a worker blocks on its own publishes with
//! `Handle::block_on`, bounded by the action's timeout (a batch's messages
//! are all published before their acks are awaited). One connection per
//! target, made at the first attempt and shared by the workers; the client
//! reconnects by itself after a server restart, and until then attempts
//! time out and are retried.

use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use async_nats::jetstream::{self, context::PublishErrorKind};

use super::{Destination, Failure, Message, attempts, send_one};
use crate::config::broker::NatsTarget;
use crate::outbox::Attempt;
use crate::outbox::retry::Verdict;
use crate::time::now_ms;

/// The private runtime (of this module and `amqp.rs`): a current-thread runtime driven forever by its
/// own thread (its I/O and timers), entered by workers to block on a
/// publish.
pub(super) fn runtime() -> Result<tokio::runtime::Handle, String> {
    static RUNTIME: OnceLock<Result<tokio::runtime::Handle, String>> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| format!("cannot start the NATS client's runtime: {e}"))?;
            let handle = rt.handle().clone();
            std::thread::Builder::new()
                .name("idemhook-nats".to_string())
                .spawn(move || rt.block_on(std::future::pending::<()>()))
                .map_err(|e| format!("cannot start the NATS client's thread: {e}"))?;
            Ok(handle)
        })
        .clone()
}

pub(super) struct NatsDest {
    target: NatsTarget,
    timeout: Duration,
    context: Mutex<Option<jetstream::Context>>,
}

impl NatsDest {
    pub fn new(target: &NatsTarget, timeout: Duration) -> NatsDest {
        NatsDest {
            target: target.clone(),
            timeout,
            context: Mutex::new(None),
        }
    }

    /// The target's JetStream context, connecting at first use.
    fn context(&self, handle: &tokio::runtime::Handle) -> Result<jetstream::Context, String> {
        let mut slot = self.context.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(js) = slot.as_ref() {
            return Ok(js.clone());
        }
        let js = connect(handle, &self.target, self.timeout)?;
        *slot = Some(js.clone());
        Ok(js)
    }
}

/// A connection to the target within `timeout`, as a JetStream context.
fn connect(
    handle: &tokio::runtime::Handle,
    target: &NatsTarget,
    timeout: Duration,
) -> Result<jetstream::Context, String> {
    let mut options = async_nats::ConnectOptions::new()
        .connection_timeout(timeout.min(Duration::from_secs(5)))
        .request_timeout(Some(timeout))
        .max_reconnects(None);
    if let Some(user) = &target.username {
        options = options.user_and_password(
            user.clone(),
            target
                .password
                .as_ref()
                .map_or(String::new(), |p| p.expose().to_string()),
        );
    }
    let addr = format!("nats://{}:{}", target.host, target.port);
    // The context spawns its acker: made inside the runtime.
    handle.block_on(async {
        let client =
            tokio::time::timeout(timeout.min(Duration::from_secs(5)), options.connect(addr))
                .await
                .map_err(|_| "cannot connect: timed out".to_string())?
                .map_err(|e| format!("cannot connect: {e}"))?;
        Ok(jetstream::new(client))
    })
}

impl Destination for NatsDest {
    fn send(&self, m: &Message<'_>) -> Attempt {
        send_one(self, m)
    }

    /// Every message published, then every ack awaited, each its own
    /// result.
    fn send_batch(&self, messages: &[Message<'_>]) -> Vec<Attempt> {
        let started_at = now_ms();
        let answers = match runtime().and_then(|handle| {
            let js = self.context(&handle)?;
            Ok((handle, js))
        }) {
            Ok((handle, js)) => self.publish(&handle, &js, messages),
            Err(e) => messages
                .iter()
                .map(|_| Err(("connect", Verdict::Retry, e.clone())))
                .collect(),
        };
        let taken = answers
            .into_iter()
            .map(|answer| {
                answer.map(|ack| {
                    let line = if ack.duplicate {
                        format!("duplicate: stream {} already has it", ack.stream)
                    } else {
                        format!("stored: stream {} seq {}", ack.stream, ack.sequence)
                    };
                    (line, Some(format!("{}:{}", ack.stream, ack.sequence)))
                })
            })
            .collect();
        attempts("nats", started_at, taken)
    }

    fn pipelines(&self) -> bool {
        true
    }
}

impl NatsDest {
    /// Publishes every message, then awaits every ack, all within the
    /// action's timeout: each message's ack or why it has none.
    fn publish(
        &self,
        handle: &tokio::runtime::Handle,
        js: &jetstream::Context,
        messages: &[Message<'_>],
    ) -> Vec<Result<jetstream::publish::PublishAck, Failure>> {
        let deadline = tokio::time::Instant::now() + self.timeout;
        let prepared: Vec<_> = messages.iter().map(|m| self.prepare(m)).collect();
        let no_ack = || {
            Err((
                "timeout",
                Verdict::Retry,
                format!("no ack from JetStream within {:?}", self.timeout),
            ))
        };
        handle.block_on(async {
            let mut sent = Vec::with_capacity(prepared.len());
            for (subject, headers, body) in prepared {
                let publish = js.publish_with_headers(subject.clone(), headers, body.into());
                sent.push((subject, tokio::time::timeout_at(deadline, publish).await));
            }
            let mut answers = Vec::with_capacity(sent.len());
            for (subject, sent) in sent {
                answers.push(match sent {
                    Err(_) => no_ack(),
                    Ok(Err(e)) => Err(classify(&e, &subject)),
                    Ok(Ok(ack)) => match tokio::time::timeout_at(deadline, ack).await {
                        Err(_) => no_ack(),
                        Ok(Err(e)) => Err(classify(&e, &subject)),
                        Ok(Ok(ack)) => Ok(ack),
                    },
                });
            }
            answers
        })
    }

    /// The message's subject, headers and payload.
    fn prepare(&self, m: &Message<'_>) -> (String, async_nats::HeaderMap, Vec<u8>) {
        let subject = self
            .target
            .subject
            .render(m.source, m.event_type.unwrap_or(""), m.action);
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(async_nats::header::NATS_MESSAGE_ID, m.key().as_str());
        headers.insert("X-Idemhook-Source", m.source);
        headers.insert("X-Idemhook-Event-Id", m.event_id);
        headers.insert("X-Idemhook-Event-Type", m.event_type.unwrap_or(""));
        headers.insert("X-Idemhook-Attempt", m.n.to_string().as_str());
        if let Some(ct) = m.content_type {
            headers.insert("Content-Type", ct);
        }
        (subject, headers, m.body.to_vec())
    }
}

/// A message too large: a failed job with the server's reason; anything
/// else (no stream for the subject, no ack, a cut connection) a retry.
fn classify(e: &jetstream::context::PublishError, subject: &str) -> Failure {
    let text = e.to_string();
    match e.kind() {
        PublishErrorKind::MaxPayloadExceeded => ("status", Verdict::Fail, text),
        PublishErrorKind::TimedOut => ("timeout", Verdict::Retry, text),
        PublishErrorKind::BrokenPipe => ("connect", Verdict::Retry, text),
        PublishErrorKind::StreamNotFound => (
            "status",
            Verdict::Retry,
            format!("no JetStream stream covers the subject {subject}"),
        ),
        _ if text.contains("maximum") && text.contains("size") => ("status", Verdict::Fail, text),
        _ => ("status", Verdict::Retry, text),
    }
}

/// What `idemhook check` says of the target: reachable, the stream that
/// covers the subject and its duplicate window; a warning when the window
/// is shorter than `min_window` (the action's lease plus retry_max).
pub(crate) fn report(
    target: &NatsTarget,
    timeout: Duration,
    min_window: Duration,
) -> (Result<String, String>, Option<String>) {
    let found = (|| {
        let handle = runtime()?;
        let js = connect(&handle, target, timeout)?;
        let subject = &target.subject.0;
        if subject.contains('{') {
            return Ok((
                format!(
                    "reachable; the subject {subject} is templated: its streams are not looked up"
                ),
                None,
            ));
        }
        handle.block_on(async {
            let look = async {
                let name = js
                    .stream_by_subject(subject.clone())
                    .await
                    .map_err(|e| format!("no JetStream stream covers {subject}: {e}"))?;
                let mut stream = js
                    .get_stream(&name)
                    .await
                    .map_err(|e| format!("stream {name}: {e}"))?;
                let window = stream
                    .info()
                    .await
                    .map_err(|e| format!("stream {name}: {e}"))?
                    .config
                    .duplicate_window;
                Ok::<_, String>((name, window))
            };
            let (name, window) = tokio::time::timeout(timeout, look)
                .await
                .map_err(|_| "JetStream did not answer in time".to_string())??;
            let warning = (window < min_window).then(|| {
                format!(
                    "stream {name}'s duplicate window ({}) is shorter than the action's lease plus retry_max ({}): a resend after a longer gap could be stored twice",
                    crate::config::format_duration(window),
                    crate::config::format_duration(min_window)
                )
            });
            Ok((
                format!(
                    "reachable; stream {name} covers {subject}, duplicate window {}",
                    crate::config::format_duration(window)
                ),
                warning,
            ))
        })
    })();
    match found {
        Ok((line, warning)) => (Ok(line), warning),
        Err(e) => (Err(e), None),
    }
}
