//! W4R, W4N, W4A: forwarding to the real brokers of the forward tests
//! (their servers are `tests/it/brokers.rs`, shared), each started once
//! per bench on first use, a stream (Redis) or subject (NATS) per run;
//! afterwards each run's messages are counted at the broker.

use super::*;

#[path = "../../tests/it/brokers.rs"]
mod servers;

use servers::{Nats, Rabbit, Redis};

#[derive(Default)]
pub(crate) struct Brokers {
    redis: Option<Redis>,
    nats: Option<Nats>,
    rabbit: Option<Rabbit>,
    /// NATS: the message ids seen in earlier runs (one stream holds all).
    nats_seen: HashSet<String>,
}

const WHY: &str = "the bench's broker workloads";

impl Brokers {
    /// The forward URL of `dest` for run `run`, its broker started first.
    pub(crate) fn url(&mut self, dest: Dest, run: usize) -> Result<String, String> {
        let missing = |p: &str| format!("{p} is not installed (apt-get install -y {p})");
        Ok(match dest {
            Dest::Http => return Err("an HTTP forward has no broker".into()),
            Dest::Redis => {
                if self.redis.is_none() {
                    self.redis = Some(
                        cores::for_downstream(|| Redis::start(WHY))
                            .ok_or_else(|| missing("redis-server"))?,
                    );
                }
                self.redis
                    .as_ref()
                    .map(|r| r.url(&format!("0/bench-{run}")))
                    .unwrap_or_default()
            }
            Dest::Nats => {
                if self.nats.is_none() {
                    self.nats = Some(
                        cores::for_downstream(|| Nats::start(WHY))
                            .ok_or_else(|| missing("nats-server"))?,
                    );
                }
                self.nats
                    .as_ref()
                    .map(|n| n.url(&format!("events.bench{run}")))
                    .unwrap_or_default()
            }
            Dest::Amqp => {
                if self.rabbit.is_none() {
                    self.rabbit = Some(
                        cores::for_downstream(|| Rabbit::start(WHY))
                            .ok_or_else(|| missing("rabbitmq-server"))?,
                    );
                }
                self.rabbit
                    .as_ref()
                    .map(|r| r.url("shop"))
                    .unwrap_or_default()
            }
        })
    }

    /// What the broker holds from run `run`: (messages, distinct ids).
    pub(crate) fn delivered(&mut self, dest: Dest, run: usize) -> Result<(usize, usize), String> {
        match dest {
            Dest::Http => Err("an HTTP forward has no broker".into()),
            Dest::Redis => {
                let mut c = self
                    .redis
                    .as_ref()
                    .and_then(Redis::connection)
                    .ok_or("redis is not answering")?;
                let n: usize = redis::cmd("XLEN")
                    .arg(format!("bench-{run}"))
                    .query(&mut c)
                    .map_err(|e| e.to_string())?;
                // Each entry's guard key is its idempotency key: the
                // entries are distinct when the guards number as many.
                let guards: Vec<String> = redis::cmd("KEYS")
                    .arg("idemhook:*")
                    .query(&mut c)
                    .map_err(|e| e.to_string())?;
                let _: () = redis::cmd("DEL")
                    .arg(format!("bench-{run}"))
                    .query(&mut c)
                    .map_err(|e| e.to_string())?;
                for chunk in guards.chunks(1_000) {
                    let _: () = redis::cmd("DEL")
                        .arg(chunk)
                        .query(&mut c)
                        .map_err(|e| e.to_string())?;
                }
                Ok((n, guards.len()))
            }
            Dest::Nats => {
                let nats = self.nats.as_ref().ok_or("nats is not running")?;
                let (_, ids) = nats.messages();
                let new: Vec<String> = ids
                    .into_iter()
                    .filter(|id| !self.nats_seen.contains(id))
                    .collect();
                let n = new.len();
                let distinct: HashSet<String> = new.into_iter().collect();
                let d = distinct.len();
                self.nats_seen.extend(distinct);
                Ok((n, d))
            }
            Dest::Amqp => {
                let rabbit = self.rabbit.as_ref().ok_or("rabbitmq is not running")?;
                let ids = rabbit.drain();
                let distinct: HashSet<&String> = ids.iter().collect();
                Ok((ids.len(), distinct.len()))
            }
        }
    }
}
