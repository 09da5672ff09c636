//! A `redis://` forward: one Lua script adds the event to a stream with
//! `XADD` and sets the guard key `idemhook:{idempotency_key}` for the
//! source's `retention`, or does nothing when the guard is there already.
//! Redis runs a script whole, so a resend (a lost answer, a lease
//! takeover, a replay) never adds a second entry while the guard lives:
//! exactly once per key within `retention`.
//!
//! Connections are pooled per target; one that fails is dropped, and the
//! next attempt connects anew (a restarted Redis is reached again). The
//! script is sent by its SHA and loaded again when the server has lost it.
//! A batch's invocations are pipelined on one connection (every one
//! written, then every reply read), each reply its own job's answer.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::{Destination, Message, attempts, send_one};
use crate::config::broker::RedisTarget;
use crate::outbox::Attempt;
use crate::outbox::retry::Verdict;
use crate::time::now_ms;

/// KEYS[1] the guard, KEYS[2] the stream; ARGV[1] the guard's life (ms),
/// then the entry's fields. Checks before it writes: an `XADD` that fails
/// (a key of another type) leaves no guard behind.
const SCRIPT: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 1 then
  return {0, redis.call('GET', KEYS[1])}
end
local id = redis.call('XADD', KEYS[2], '*', 'key', ARGV[2], 'source', ARGV[3],
  'event_id', ARGV[4], 'type', ARGV[5], 'content_type', ARGV[6], 'body', ARGV[7])
redis.call('SET', KEYS[1], id, 'PX', ARGV[1])
return {1, id}
"#;

/// Server errors that pass (a retry); any other error reply fails the job.
const TRANSIENT: [&str; 9] = [
    "OOM",
    "LOADING",
    "BUSY",
    "TRYAGAIN",
    "MASTERDOWN",
    "READONLY",
    "CLUSTERDOWN",
    "NOREPLICAS",
    "NOSCRIPT",
];

pub(super) struct RedisDest {
    client: redis::Client,
    target: RedisTarget,
    script: redis::Script,
    timeout: Duration,
    /// The guard's life: the source's `retention`.
    guard_ms: u64,
    idle: Mutex<Vec<redis::Connection>>,
    max_idle: usize,
}

impl RedisDest {
    pub fn new(
        target: &RedisTarget,
        timeout: Duration,
        retention: Duration,
        workers: usize,
    ) -> anyhow::Result<RedisDest> {
        Ok(RedisDest {
            client: client(target)?,
            target: target.clone(),
            script: redis::Script::new(SCRIPT),
            timeout,
            guard_ms: u64::try_from(retention.as_millis())
                .unwrap_or(u64::MAX)
                .max(1),
            idle: Mutex::new(Vec::new()),
            max_idle: workers.max(1) * 2,
        })
    }

    fn connection(&self) -> redis::RedisResult<redis::Connection> {
        if let Some(c) = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop() {
            return Ok(c);
        }
        connect(&self.client, self.timeout)
    }

    fn give_back(&self, c: redis::Connection) {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < self.max_idle {
            idle.push(c);
        }
    }
}

/// The target's client (nothing is connected yet).
pub(crate) fn client(target: &RedisTarget) -> anyhow::Result<redis::Client> {
    use redis::IntoConnectionInfo as _;
    let mut settings = redis::RedisConnectionInfo::default().set_db(target.db);
    if let Some(user) = &target.username {
        settings = settings.set_username(user);
    }
    if let Some(password) = &target.password {
        settings = settings.set_password(password.expose());
    }
    let info = redis::ConnectionAddr::Tcp(target.host.clone(), target.port)
        .into_connection_info()
        .map_err(|e| anyhow::anyhow!("redis {}:{}: {e}", target.host, target.port))?
        .set_redis_settings(settings);
    redis::Client::open(info)
        .map_err(|e| anyhow::anyhow!("redis {}:{}: {e}", target.host, target.port))
}

/// A connection within `timeout`, its reads and writes bounded by it.
pub(crate) fn connect(
    client: &redis::Client,
    timeout: Duration,
) -> redis::RedisResult<redis::Connection> {
    let c = client.get_connection_with_timeout(timeout.min(Duration::from_secs(5)))?;
    c.set_read_timeout(Some(timeout))?;
    c.set_write_timeout(Some(timeout))?;
    Ok(c)
}

impl Destination for RedisDest {
    fn send(&self, m: &Message<'_>) -> Attempt {
        send_one(self, m)
    }

    /// One connection, the script's invocations pipelined (every one
    /// written, then every reply read), each reply classified on its own.
    fn send_batch(&self, messages: &[Message<'_>]) -> Vec<Attempt> {
        let started_at = now_ms();
        let deadline = Instant::now() + self.timeout;
        let streams: Vec<String> = messages
            .iter()
            .map(|m| {
                self.target
                    .stream
                    .render(m.source, m.event_type.unwrap_or(""), m.action)
            })
            .collect();
        let commands: Vec<redis::Cmd> = messages
            .iter()
            .zip(&streams)
            .map(|(m, stream)| self.invocation(m, stream))
            .collect();
        let answers = self.pipeline(&commands, deadline);
        let taken = answers
            .into_iter()
            .zip(&streams)
            .map(|(answer, stream)| match answer {
                Ok((added, id)) => {
                    let line = if added == 1 {
                        format!("XADD {stream} {id}")
                    } else {
                        format!("already added ({stream} {id}): the guard key is present")
                    };
                    Ok((line, Some(id)))
                }
                Err(e) => {
                    let (kind, verdict) = classify(&e);
                    Err((kind, verdict, e.to_string()))
                }
            })
            .collect();
        attempts("redis", started_at, taken)
    }

    fn pipelines(&self) -> bool {
        true
    }
}

type Answer = redis::RedisResult<(i64, String)>;

impl RedisDest {
    /// The script's invocation for `m` by its SHA (`EVALSHA`): KEYS the
    /// guard and the stream, ARGV the guard's life and the entry's fields.
    fn invocation(&self, m: &Message<'_>, stream: &str) -> redis::Cmd {
        let key = m.key();
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(self.script.get_hash())
            .arg(2)
            .arg(format!("idemhook:{key}"))
            .arg(stream)
            .arg(self.guard_ms)
            .arg(&key)
            .arg(m.source)
            .arg(m.event_id)
            .arg(m.event_type.unwrap_or(""))
            .arg(m.content_type.unwrap_or(""))
            .arg(m.body);
        cmd
    }

    /// Each command's answer, in order, on one pooled connection before
    /// `deadline`. Invocations the server answered NOSCRIPT (it lost the
    /// script: none of them ran) are sent again once the script is
    /// loaded, as `Script::invoke` does. A connection that failed makes
    /// every answer not yet read that failure (a retry), and is dropped.
    fn pipeline(&self, commands: &[redis::Cmd], deadline: Instant) -> Vec<Answer> {
        let mut c = match self.connection() {
            Ok(c) => c,
            Err(e) => return vec![Err(e); commands.len()],
        };
        let all: Vec<usize> = (0..commands.len()).collect();
        let (mut answers, mut sound) = exchange(&mut c, commands, &all, deadline);
        let lost: Vec<usize> = answers
            .iter()
            .enumerate()
            .filter(|(_, a)| a.as_ref().is_err_and(|e| e.code() == Some("NOSCRIPT")))
            .map(|(i, _)| i)
            .collect();
        if sound && !lost.is_empty() {
            match bound(&c, deadline).and_then(|()| self.script.load(&mut c)) {
                Ok(_) => {
                    let (again, still) = exchange(&mut c, commands, &lost, deadline);
                    for (i, answer) in lost.into_iter().zip(again) {
                        answers[i] = answer;
                    }
                    sound = still;
                }
                Err(e) => {
                    sound = e.code().is_some();
                    for i in lost {
                        answers[i] = Err(e.clone());
                    }
                }
            }
        }
        // A connection that answered everything (even error replies) is
        // sound.
        if sound {
            self.give_back(c);
        }
        answers
    }
}

/// Writes the commands at `which`, then reads their replies, each read
/// bounded by what is left until `deadline`. The answers, in the order of
/// `which`, and whether the connection is still sound (every reply read).
fn exchange(
    c: &mut redis::Connection,
    commands: &[redis::Cmd],
    which: &[usize],
    deadline: Instant,
) -> (Vec<Answer>, bool) {
    let mut packed = Vec::new();
    for &i in which {
        commands[i].write_packed_command(&mut packed);
    }
    if let Err(e) = bound(c, deadline).and_then(|()| c.send_packed_command(&packed)) {
        return (vec![Err(e); which.len()], false);
    }
    let mut answers = Vec::with_capacity(which.len());
    while answers.len() < which.len() {
        let reply = bound(c, deadline).and_then(|()| c.recv_response());
        match reply {
            // Out-of-band data (RESP3), not a reply.
            Ok(redis::Value::Push { .. }) => {}
            Ok(value) => answers
                .push(redis::from_redis_value::<Answer>(value).unwrap_or_else(|e| Err(e.into()))),
            Err(e) => {
                answers.resize(which.len(), Err(e));
                return (answers, false);
            }
        }
    }
    (answers, true)
}

/// Bounds the connection's next write and read by what is left until
/// `deadline` (a timeout when nothing is).
fn bound(c: &redis::Connection, deadline: Instant) -> redis::RedisResult<()> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(redis::RedisError::from(std::io::Error::from(
            std::io::ErrorKind::TimedOut,
        )));
    }
    c.set_write_timeout(Some(left))?;
    c.set_read_timeout(Some(left))
}

/// Unreachable, cut or slow: a retry; a transient error reply: a retry
/// (`status`); any other error reply (a key of another type, a message
/// the server refuses): a failed job with the server's reason.
fn classify(e: &redis::RedisError) -> (&'static str, Verdict) {
    match e.code() {
        None if e.is_timeout() => ("timeout", Verdict::Retry),
        None => ("connect", Verdict::Retry),
        Some(code) if code == "NOAUTH" || code == "WRONGPASS" || code == "NOPERM" => {
            ("auth", Verdict::Retry)
        }
        Some(code) if TRANSIENT.contains(&code) => ("status", Verdict::Retry),
        Some(_) => ("status", Verdict::Fail),
    }
}

/// What `idemhook check` says of the target: reachable or not, and
/// whether the stream exists (a stream is made by its first `XADD`).
pub(crate) fn report(target: &RedisTarget, timeout: Duration) -> Result<String, String> {
    let client = client(target).map_err(|e| format!("{e:#}"))?;
    let mut c = connect(&client, timeout).map_err(|e| format!("cannot connect: {e}"))?;
    let _: String = redis::cmd("PING")
        .query(&mut c)
        .map_err(|e| format!("PING: {e}"))?;
    let stream = &target.stream.0;
    if stream.contains('{') {
        return Ok(format!(
            "reachable; streams named by {stream} are made by their first entry"
        ));
    }
    let kind: String = redis::cmd("TYPE")
        .arg(stream)
        .query(&mut c)
        .map_err(|e| format!("TYPE: {e}"))?;
    match kind.as_str() {
        "none" => Ok(format!(
            "reachable; stream {stream} does not exist yet (its first entry makes it)"
        )),
        "stream" => {
            let n: i64 = redis::cmd("XLEN")
                .arg(stream)
                .query(&mut c)
                .map_err(|e| format!("XLEN: {e}"))?;
            Ok(format!("reachable; stream {stream} exists ({n} entries)"))
        }
        other => Err(format!(
            "the key {stream} is a {other}, not a stream: every XADD would fail"
        )),
    }
}
