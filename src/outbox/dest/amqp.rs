//! An `amqp://` forward: a persistent message (`delivery_mode` 2) with
//! `message_id = {idempotency_key}`, the `X-Idemhook-*` headers as AMQP
//! headers and `mandatory` set, on a channel in confirm mode; done on the
//! broker's publisher confirm. A message returned as unroutable, or
//! nacked, is a failed attempt with error kind `status` (retried). At least
//! once: a resend is a second message with the same `message_id`, for
//! consumers to deduplicate.
//!
//! A message over the broker's size limit fails with the broker's reason;
//! RabbitMQ closes the channel with it, and the other messages of the
//! batch are retried.
//!
//! The client is `lapin` on the private runtime of `nats.rs`; one
//! connection per target with a few confirm channels that batches take in
//! turn, made at the first attempt and shared; a failed connection is
//! dropped and the next attempt connects anew, a closed channel is opened
//! again.
//! A batch's messages are all published before their confirms are
//! awaited.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};

use super::nats::runtime;
use super::{Destination, Failure, Message, attempts, send_one};
use crate::config::broker::AmqpTarget;
use crate::outbox::Attempt;
use crate::outbox::retry::Verdict;
use crate::time::now_ms;

pub(super) struct AmqpDest {
    target: AmqpTarget,
    timeout: Duration,
    open: Mutex<Option<Open>>,
    /// Which channel the next batch takes.
    next: AtomicUsize,
}

/// The target's connection and its confirm channels.
struct Open {
    conn: Connection,
    channels: Vec<Channel>,
}

/// Confirm channels per target: the broker runs each channel as one
/// process, so the workers' batches on one channel would queue behind
/// each other there; one channel per default forward worker.
const CHANNELS: usize = 4;

impl AmqpDest {
    pub fn new(target: &AmqpTarget, timeout: Duration) -> AmqpDest {
        AmqpDest {
            target: target.clone(),
            timeout,
            open: Mutex::new(None),
            next: AtomicUsize::new(0),
        }
    }

    /// A confirm channel, taken in turn; connecting when there is no
    /// connection (or it closed), and opening the channel again when it
    /// alone closed (a message over the broker's size limit closes it).
    fn channel(&self, handle: &tokio::runtime::Handle) -> Result<Channel, Failure> {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % CHANNELS;
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(o) = open.as_mut()
            && o.conn.status().connected()
        {
            if let Some(channel) = o.channels.get(i)
                && channel.status().connected()
            {
                return Ok(channel.clone());
            }
            if let Ok(channel) = confirm_channel(handle, &o.conn, self.timeout) {
                if let Some(slot) = o.channels.get_mut(i) {
                    *slot = channel.clone();
                }
                return Ok(channel);
            }
        }
        *open = None;
        let (conn, channels) = connect(handle, &self.target, self.timeout, CHANNELS)
            .map_err(|e| ("connect", Verdict::Retry, e))?;
        let channel = channels
            .get(i)
            .cloned()
            .ok_or_else(|| ("connect", Verdict::Retry, "no channel".to_string()))?;
        *open = Some(Open { conn, channels });
        Ok(channel)
    }

    fn connected(&self) -> bool {
        self.open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .is_some_and(|o| o.conn.status().connected())
    }

    fn drop_connection(&self) {
        *self.open.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }
}

/// A new channel on `conn` in confirm mode, within `timeout`.
fn confirm_channel(
    handle: &tokio::runtime::Handle,
    conn: &Connection,
    timeout: Duration,
) -> Result<Channel, String> {
    handle.block_on(async {
        tokio::time::timeout(timeout.min(Duration::from_secs(5)), open_channel(conn))
            .await
            .map_err(|_| "cannot open a channel: timed out".to_string())?
    })
}

async fn open_channel(conn: &Connection) -> Result<Channel, String> {
    let channel = conn
        .create_channel()
        .await
        .map_err(|e| format!("cannot open a channel: {e}"))?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .map_err(|e| format!("cannot turn publisher confirms on: {e}"))?;
    Ok(channel)
}

/// A connection and `channels` channels in confirm mode, within `timeout`.
pub(crate) fn connect(
    handle: &tokio::runtime::Handle,
    target: &AmqpTarget,
    timeout: Duration,
    channels: usize,
) -> Result<(Connection, Vec<Channel>), String> {
    let uri = target.uri.expose().to_string();
    handle.block_on(async {
        tokio::time::timeout(timeout.min(Duration::from_secs(5)), async {
            let conn = Connection::connect(&uri, ConnectionProperties::default())
                .await
                .map_err(|e| format!("cannot connect: {e}"))?;
            let mut opened = Vec::with_capacity(channels);
            for _ in 0..channels.max(1) {
                opened.push(open_channel(&conn).await?);
            }
            Ok((conn, opened))
        })
        .await
        .map_err(|_| "cannot connect: timed out".to_string())?
    })
}

impl Destination for AmqpDest {
    fn send(&self, m: &Message<'_>) -> Attempt {
        send_one(self, m)
    }

    /// Every message published on the confirm channel, then every confirm
    /// awaited, each its own result.
    fn send_batch(&self, messages: &[Message<'_>]) -> Vec<Attempt> {
        let started_at = now_ms();
        let answers = match runtime()
            .map_err(|e| ("connect", Verdict::Retry, e))
            .and_then(|handle| Ok((self.channel(&handle)?, handle)))
        {
            Ok((channel, handle)) => {
                let answers = self.publish(&handle, &channel, messages);
                // A closed channel is opened again at the next use; a
                // connection that closed or stopped answering goes.
                if answers
                    .iter()
                    .any(|a| a.as_ref().is_err_and(|(kind, _, _)| *kind == "timeout"))
                    || !self.connected()
                {
                    self.drop_connection();
                }
                answers
            }
            Err(failure) => vec![Err(failure); messages.len()],
        };
        attempts(
            "amqp",
            started_at,
            answers
                .into_iter()
                .map(|answer| answer.map(|line| (line, None)))
                .collect(),
        )
    }

    fn pipelines(&self) -> bool {
        true
    }
}

impl AmqpDest {
    /// Publishes every message, then awaits every confirm, all within the
    /// action's timeout: each message's line or why it failed.
    fn publish(
        &self,
        handle: &tokio::runtime::Handle,
        channel: &Channel,
        messages: &[Message<'_>],
    ) -> Vec<Result<String, Failure>> {
        let deadline = tokio::time::Instant::now() + self.timeout;
        let no_confirm = || {
            Err((
                "timeout",
                Verdict::Retry,
                format!("no publisher confirm within {:?}", self.timeout),
            ))
        };
        handle.block_on(async {
            // Polled together: each publish hands its frames to lapin's
            // connection loop on its first poll, in order (so the delivery
            // tags follow the messages), and the loop writes them out
            // together; one publish awaited after another would wait for
            // a write, and the broker a read, per message.
            let sent = futures_util::future::join_all(messages.iter().map(|m| {
                let (routing_key, properties) = self.prepare(m);
                let publish = channel.basic_publish(
                    ShortString::from(self.target.exchange.clone()),
                    ShortString::from(routing_key.clone()),
                    BasicPublishOptions {
                        mandatory: true,
                        ..BasicPublishOptions::default()
                    },
                    m.body,
                    properties,
                );
                async move {
                    (
                        routing_key,
                        m.body.len(),
                        tokio::time::timeout_at(deadline, publish).await,
                    )
                }
            }))
            .await;
            let mut answers = Vec::with_capacity(sent.len());
            for (routing_key, size, sent) in sent {
                answers.push(match sent {
                    Err(_) => no_confirm(),
                    Ok(Err(e)) => Err(refused(&e, size)),
                    Ok(Ok(confirm)) => match tokio::time::timeout_at(deadline, confirm).await {
                        Err(_) => no_confirm(),
                        Ok(Err(e)) => Err(refused(&e, size)),
                        Ok(Ok(confirmation)) => self.confirmed(confirmation, &routing_key),
                    },
                });
            }
            answers
        })
    }

    /// The message's routing key and properties.
    fn prepare(&self, m: &Message<'_>) -> (String, BasicProperties) {
        let routing_key =
            self.target
                .routing_key
                .render(m.source, m.event_type.unwrap_or(""), m.action);
        let mut headers = FieldTable::default();
        let mut put = |name: &str, value: &str| {
            headers.insert(
                ShortString::from(name),
                AMQPValue::LongString(LongString::from(value.as_bytes().to_vec())),
            );
        };
        put("X-Idemhook-Source", m.source);
        put("X-Idemhook-Event-Id", m.event_id);
        put("X-Idemhook-Event-Type", m.event_type.unwrap_or(""));
        put("X-Idemhook-Attempt", &m.n.to_string());
        let properties = BasicProperties::default()
            .with_delivery_mode(2)
            .with_message_id(ShortString::from(m.key()))
            .with_content_type(ShortString::from(
                m.content_type.unwrap_or("application/octet-stream"),
            ))
            .with_headers(headers);
        (routing_key, properties)
    }

    /// What the broker's confirm says of a message.
    fn confirmed(
        &self,
        confirmation: lapin::Confirmation,
        routing_key: &str,
    ) -> Result<String, Failure> {
        match confirmation {
            lapin::Confirmation::Ack(None) => Ok(format!(
                "confirmed: exchange {:?}, routing key {routing_key}",
                self.target.exchange
            )),
            lapin::Confirmation::Ack(Some(returned)) => Err((
                "status",
                Verdict::Retry,
                format!(
                    "unroutable: the broker returned the message ({} {}): no queue is bound for routing key {routing_key}",
                    returned.reply_code, returned.reply_text
                ),
            )),
            lapin::Confirmation::Nack(_) => Err((
                "status",
                Verdict::Retry,
                "the broker nacked the message".to_string(),
            )),
            lapin::Confirmation::NotRequested => Err((
                "protocol",
                Verdict::Retry,
                "the channel is not in confirm mode".to_string(),
            )),
        }
    }
}

/// A message larger than the broker takes closes the channel with
/// PRECONDITION_FAILED, naming the message's size: the message of that
/// size (a body of `size` bytes) fails with the reason; the others
/// published on the channel lost it with the same error, and are retried
/// (as they are when the size cannot be read). Any other error is the
/// connection's (a retry).
fn refused(e: &lapin::Error, size: usize) -> Failure {
    let text = e.to_string();
    if !(text.contains("PRECONDITION_FAILED") || text.contains("max size")) {
        return ("connect", Verdict::Retry, text);
    }
    if refused_size(&text) == Some(size) {
        ("status", Verdict::Fail, text)
    } else {
        (
            "connect",
            Verdict::Retry,
            format!("the channel closed for another message: {text}"),
        )
    }
}

/// The size in RabbitMQ's refusal of a message over its limit ("message
/// size 8050 is larger than configured max size 4096").
fn refused_size(text: &str) -> Option<usize> {
    let rest = text.split("message size ").nth(1)?;
    rest.split_whitespace().next()?.parse().ok()
}

/// What `idemhook check` says of the target: reachable, and whether the
/// exchange exists (a passive declare).
pub(crate) fn report(target: &AmqpTarget, timeout: Duration) -> Result<String, String> {
    let handle = runtime()?;
    let (conn, channels) = connect(&handle, target, timeout, 1)?;
    let channel = channels
        .first()
        .ok_or_else(|| "cannot open a channel".to_string())?;
    let exchange = target.exchange.clone();
    let found = if exchange.is_empty() {
        Ok("reachable; the default exchange (routing key = queue name)".to_string())
    } else {
        handle.block_on(async {
            channel
                .exchange_declare(
                    ShortString::from(exchange.clone()),
                    lapin::ExchangeKind::Direct,
                    lapin::options::ExchangeDeclareOptions {
                        passive: true,
                        ..Default::default()
                    },
                    FieldTable::default(),
                )
                .await
                .map(|()| format!("reachable; exchange {exchange} exists"))
                .map_err(|e| format!("exchange {exchange}: {e}"))
        })
    };
    let _ = handle.block_on(async {
        tokio::time::timeout(Duration::from_secs(2), conn.close(200, "check".into())).await
    });
    found
}

#[cfg(test)]
mod tests {
    use super::refused_size;

    #[test]
    fn the_refused_size_is_read_from_rabbitmqs_words() {
        let text = "protocol error: AMQP soft error: PRECONDITION-FAILED: PRECONDITION_FAILED - \
                    message size 8050 is larger than configured max size 4096";
        assert_eq!(refused_size(text), Some(8050));
        assert_eq!(refused_size("PRECONDITION_FAILED - something else"), None);
    }
}
