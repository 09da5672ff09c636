//! Broker forwards through the real binary, on both backends, against real
//! brokers started by the test (`brokers.rs`): every event published
//! exactly once per the broker's guarantee across a broker restart and an
//! idemhook kill -9 between the broker's answer and its record.

use std::collections::HashSet;
use std::time::Duration;

use crate::backend::{Backend, both_backends};
use crate::brokers::{Nats, Rabbit, Redis};
use crate::harness::{Client, HTTP_TIMEOUT, Server, ServerConfig, wait_until};
use crate::sign;

const SECRET: &str = "whsec_it_brokers_0123456789";
const WAIT: Duration = Duration::from_secs(40);

fn config(forward: &str) -> ServerConfig {
    ServerConfig::new()
        .set("forward_workers", "3")
        .tables(&format!(
            "[sources.shop]\nkind = \"stripe\"\nsecrets = [\"{SECRET}\"]\n\
         [[sources.shop.actions]]\nname = \"app\"\nforward = \"{forward}\"\n\
         timeout = \"1s\"\nlease = \"2s\"\nretry_initial = \"100ms\"\nretry_max = \"500ms\"\n"
        ))
}

fn event(id: &str) -> Vec<u8> {
    event_of(id, "invoice.paid")
}

fn event_of(id: &str, event_type: &str) -> Vec<u8> {
    serde_json::json!({"id": id, "type": event_type})
        .to_string()
        .into_bytes()
}

/// Posts the events; the ids idemhook acknowledged (it may die meanwhile).
fn post_all(server: &Server, ids: &[String]) -> usize {
    let client = Client::new(HTTP_TIMEOUT);
    let url = server.url("/hooks/shop");
    ids.iter()
        .filter(|id| {
            let body = event(id);
            client
                .try_post(&url, &sign::stripe_now(SECRET, &body), &body)
                .is_ok_and(|r| r.status == 200)
        })
        .count()
}

fn done(server: &Server) -> i64 {
    server.count("SELECT count(*) FROM jobs WHERE status = 'done'", &[])
}

/// Killed right after Redis answered (before the record), idemhook sends
/// the job again after its lease: the guard key makes that a no-op. Redis
/// killed and restarted (its append-only file fsynced): the jobs retry
/// and go out once it is back. The stream holds each event once.
fn redis_exactly_once_across_a_broker_restart_and_a_kill9(backend: Backend) {
    let Some(mut redis) = Redis::start("dest_brokers::redis_exactly_once") else {
        return;
    };
    let ids: Vec<String> = (0..30).map(|i| format!("evt_r{i:02}")).collect();
    let mut server = Server::start_on(
        backend,
        &config(&redis.url("0/events-{source}")),
        &[("IDEMHOOK_FAILPOINTS", "forward.after_response=kill")],
    );
    post_all(&server, &ids[..10]);
    let status = server.wait_exit(Duration::from_secs(10));
    assert!(
        !status.success(),
        "the failpoint kills idemhook: {status:?}"
    );
    server.remove_env("IDEMHOOK_FAILPOINTS");
    server.restart();
    // The provider sends again what may not have been acknowledged.
    assert_eq!(post_all(&server, &ids[..10]), 10);
    wait_until(WAIT, "the first ten are done", || done(&server) == 10);
    let resent = server.count(
        "SELECT count(*) FROM attempts WHERE response_head LIKE 'already added%'",
        &[],
    );
    assert!(resent >= 1, "the job cut short by the kill was sent again");

    // Redis down: retries; back: every job goes out.
    redis.kill();
    assert_eq!(post_all(&server, &ids[10..]), 20);
    wait_until(WAIT, "attempts fail while Redis is down", || {
        server.count(
            "SELECT count(*) FROM attempts WHERE error_kind = 'connect' AND outcome = 'retry'",
            &[],
        ) >= 3
    });
    assert!(done(&server) <= 10);
    redis.start_again();
    let started = std::time::Instant::now();
    while done(&server) < 30 && started.elapsed() < WAIT {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        done(&server),
        30,
        "not all done: {}\n{}\n{}",
        server.dump("SELECT event_id, status, attempts, waiting FROM jobs ORDER BY event_id"),
        server.dump("SELECT * FROM circuits"),
        server
            .logs()
            .lines()
            .rev()
            .take(30)
            .collect::<Vec<_>>()
            .join("\n")
    );

    let mut c = redis.connection().expect("redis is back");
    let seen = stream_event_ids(&mut c, "events-shop", "invoice.paid");
    assert_eq!(seen.len(), 30, "each event once: {seen:?}");
    assert_eq!(seen.iter().collect::<HashSet<_>>().len(), 30);
    let ttl: i64 = redis::cmd("PTTL")
        .arg("idemhook:shop:evt_r00:app")
        .query(&mut c)
        .expect("PTTL");
    assert!(ttl > 86_400_000, "the guard lives for the retention: {ttl}");

    let check = server.run_cli(&["check"]);
    assert!(
        check
            .stdout
            .contains("destination shop/app (redis 127.0.0.1:"),
        "{}",
        check.stdout
    );
    assert!(check.stdout.contains("reachable"), "{}", check.stdout);
}
both_backends!(redis_exactly_once_across_a_broker_restart_and_a_kill9);

/// The event ids of a stream's entries, each entry checked to hold what a
/// send writes: the key, the source, the type and the body.
fn stream_event_ids(c: &mut redis::Connection, stream: &str, event_type: &str) -> Vec<String> {
    let entries: Vec<redis::Value> = redis::cmd("XRANGE")
        .arg(stream)
        .arg("-")
        .arg("+")
        .query(c)
        .expect("XRANGE");
    let mut seen = Vec::new();
    for entry in entries {
        let (_, fields): (String, Vec<(String, Vec<u8>)>) =
            redis::from_redis_value(entry).expect("an entry");
        let get = |name: &str| {
            fields
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
                .unwrap_or_default()
        };
        assert_eq!(get("key"), format!("shop:{}:app", get("event_id")));
        assert_eq!(get("source"), "shop");
        assert_eq!(get("type"), event_type);
        assert_eq!(
            get("body").as_bytes(),
            &event_of(&get("event_id"), event_type)[..]
        );
        seen.push(get("event_id"));
    }
    seen
}

/// Posts the events while the action is paused, then resumes it: with
/// one worker, every job is due at once and taken in one take.
fn post_as_one_backlog(server: &Server, events: &[(String, &str)]) {
    server.run_cli(&["pause", "shop/app"]).assert_success();
    let client = Client::new(HTTP_TIMEOUT);
    let url = server.url("/hooks/shop");
    for (id, event_type) in events {
        let body = event_of(id, event_type);
        let r = client
            .try_post(&url, &sign::stripe_now(SECRET, &body), &body)
            .expect("posted");
        assert_eq!(r.status, 200);
    }
    server.run_cli(&["resume", "shop/app"]).assert_success();
}

/// Every job's first attempt was sent in one batch: all started at the
/// same instant by the same worker (one at a time, each would start after
/// the previous one's answer). (A slow machine may add retries after a
/// timeout: the brokers' counts say each message is there once.)
fn assert_sent_together(server: &Server, jobs: i64) {
    assert_eq!(
        server.count("SELECT count(*) FROM attempts WHERE n = 1", &[]),
        jobs,
        "{}",
        server.dump("SELECT job_id, n, started_at, outcome, error FROM attempts")
    );
    assert_eq!(
        server.count(
            "SELECT count(*) FROM (SELECT DISTINCT started_at, worker FROM attempts WHERE n = 1) t",
            &[]
        ),
        1,
        "one batch: {}",
        server.dump("SELECT job_id, n, started_at, worker FROM attempts")
    );
}

fn one_worker(forward: &str) -> ServerConfig {
    config(forward).set("forward_workers", "1")
}

fn backlog(prefix: &str, n: usize) -> Vec<(String, &'static str)> {
    (0..n)
        .map(|i| (format!("{prefix}{i:02}"), "invoice.paid"))
        .collect()
}

/// Jobs due together go to Redis as one pipelined batch: each event is in
/// the stream once, with the fields a single send writes, and each guard
/// key is set.
fn redis_batch_arrives_exactly_once(backend: Backend) {
    let Some(redis) = Redis::start("dest_brokers::redis_batch") else {
        return;
    };
    let server = Server::start_on(backend, &one_worker(&redis.url("0/events-{source}")), &[]);
    let events = backlog("evt_rb", 8);
    post_as_one_backlog(&server, &events);
    wait_until(WAIT, "all eight are done", || done(&server) == 8);
    assert_sent_together(&server, 8);
    assert_eq!(
        server.count(
            "SELECT count(*) FROM attempts WHERE response_head LIKE 'XADD events-shop %'",
            &[]
        ),
        8
    );
    let mut c = redis.connection().expect("redis");
    let seen = stream_event_ids(&mut c, "events-shop", "invoice.paid");
    let expected: HashSet<String> = events.iter().map(|(id, _)| id.clone()).collect();
    assert_eq!(seen.len(), 8, "each event once: {seen:?}");
    assert_eq!(seen.into_iter().collect::<HashSet<_>>(), expected);
    for (id, _) in &events {
        let guard: i64 = redis::cmd("EXISTS")
            .arg(format!("idemhook:shop:{id}:app"))
            .query(&mut c)
            .expect("EXISTS");
        assert_eq!(guard, 1, "{id}'s guard key");
    }

    // Redis lost the script (a restart without it, SCRIPT FLUSH): the
    // batch's NOSCRIPT answers load it and send again, each job once.
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query(&mut c)
        .expect("SCRIPT FLUSH");
    post_as_one_backlog(&server, &backlog("evt_rc", 4));
    wait_until(WAIT, "the next four are done", || done(&server) == 12);
    let seen = stream_event_ids(&mut c, "events-shop", "invoice.paid");
    assert_eq!(seen.len(), 12, "each event once: {seen:?}");
}
both_backends!(redis_batch_arrives_exactly_once);

/// A batch in which Redis refuses one message (its stream, named by the
/// event's type, is a key of another type): that job fails with the
/// server's reason, the others of the batch are done, each once.
fn redis_batch_fails_only_the_refused_job(backend: Backend) {
    let Some(redis) = Redis::start("dest_brokers::redis_batch_refused") else {
        return;
    };
    let mut c = redis.connection().expect("redis");
    let _: () = redis::cmd("SET")
        .arg("events-bad.type")
        .arg("a string")
        .query(&mut c)
        .expect("SET");
    let server = Server::start_on(backend, &one_worker(&redis.url("0/events-{type}")), &[]);
    let mut events = backlog("evt_rf", 6);
    events.insert(3, ("evt_rf_bad".to_string(), "bad.type"));
    post_as_one_backlog(&server, &events);
    wait_until(WAIT, "six done, the refused one failed", || {
        done(&server) == 6
            && crate::helpers::job_status(&server, "shop", "evt_rf_bad", "app").as_deref()
                == Some("failed")
    });
    assert_sent_together(&server, 7);
    let error = server
        .row(
            "SELECT a.error FROM attempts a JOIN jobs j ON j.id = a.job_id WHERE j.event_id = 'evt_rf_bad'",
            &[],
        )
        .map(|r| r.text(0))
        .unwrap_or_default();
    assert!(error.contains("WRONGTYPE"), "{error}");
    let seen = stream_event_ids(&mut c, "events-invoice.paid", "invoice.paid");
    assert_eq!(seen.len(), 6, "each event once: {seen:?}");
    assert!(!seen.contains(&"evt_rf_bad".to_string()));
    let guard: i64 = redis::cmd("EXISTS")
        .arg("idemhook:shop:evt_rf_bad:app")
        .query(&mut c)
        .expect("EXISTS");
    assert_eq!(guard, 0, "a refused XADD leaves no guard");
}
both_backends!(redis_batch_fails_only_the_refused_job);

/// With every destination a broker, a backlog goes out in whole batches
/// even while other workers are free (sharing it out over the three
/// would only mean more round trips): a take's sixteen jobs, one batch.
fn a_broker_backlog_goes_in_whole_batches_with_workers_free(backend: Backend) {
    let Some(redis) = Redis::start("dest_brokers::whole_batches") else {
        return;
    };
    // Three forward workers, all idle when the backlog falls due.
    let server = Server::start_on(backend, &config(&redis.url("0/events-{source}")), &[]);
    post_as_one_backlog(&server, &backlog("evt_wb", 16));
    wait_until(WAIT, "all sixteen are done", || done(&server) == 16);
    assert_sent_together(&server, 16);
}
both_backends!(a_broker_backlog_goes_in_whole_batches_with_workers_free);

/// Jobs due together go to JetStream as one batch (every message
/// published, then every ack awaited): the stream holds each once, with
/// its `Nats-Msg-Id`.
fn nats_batch_arrives_exactly_once(backend: Backend) {
    let Some(nats) = Nats::start("dest_brokers::nats_batch") else {
        return;
    };
    let server = Server::start_on(backend, &one_worker(&nats.url("events.{source}")), &[]);
    let events = backlog("evt_nb", 8);
    post_as_one_backlog(&server, &events);
    wait_until(WAIT, "all eight are done", || done(&server) == 8);
    assert_sent_together(&server, 8);
    assert_eq!(
        server.count(
            "SELECT count(*) FROM attempts WHERE response_head LIKE 'stored: stream EVENTS seq %'",
            &[]
        ),
        8
    );
    let (count, msg_ids) = nats.messages();
    assert_eq!(count, 8, "each event once: {msg_ids:?}");
    let expected: HashSet<String> = events
        .iter()
        .map(|(id, _)| format!("shop:{id}:app"))
        .collect();
    assert_eq!(msg_ids.into_iter().collect::<HashSet<_>>(), expected);
}
both_backends!(nats_batch_arrives_exactly_once);

/// A batch in which one message is larger than the NATS server takes:
/// that job fails at once with the reason, the others are done.
fn nats_batch_fails_only_the_message_too_large(backend: Backend) {
    let Some(nats) = Nats::start_with("dest_brokers::nats_batch_too_large", "max_payload: 2048\n")
    else {
        return;
    };
    let server = Server::start_on(backend, &one_worker(&nats.url("events.{source}")), &[]);
    server.run_cli(&["pause", "shop/app"]).assert_success();
    let big =
        serde_json::json!({"id": "evt_nf_big", "type": "invoice.paid", "pad": "x".repeat(4000)})
            .to_string()
            .into_bytes();
    post_all(&server, &["evt_nf0".to_string(), "evt_nf1".to_string()]);
    let r = server.post("/hooks/shop", &sign::stripe_now(SECRET, &big), &big);
    assert_eq!(r.status, 200, "{}", r.text());
    post_all(&server, &["evt_nf2".to_string(), "evt_nf3".to_string()]);
    server.run_cli(&["resume", "shop/app"]).assert_success();
    wait_until(WAIT, "four done, the big one failed", || {
        done(&server) == 4
            && crate::helpers::job_status(&server, "shop", "evt_nf_big", "app").as_deref()
                == Some("failed")
    });
    assert_sent_together(&server, 5);
    let (count, _) = nats.messages();
    assert_eq!(count, 4);
}
both_backends!(nats_batch_fails_only_the_message_too_large);

/// Jobs due together go to RabbitMQ as one batch (every message
/// published, then every confirm awaited): each is in the queue, with its
/// `message_id`.
fn amqp_batch_arrives_once_each(backend: Backend) {
    let Some(rabbit) = Rabbit::start("dest_brokers::amqp_batch") else {
        return;
    };
    let server = Server::start_on(backend, &one_worker(&rabbit.url("{source}")), &[]);
    let events = backlog("evt_ab", 8);
    post_as_one_backlog(&server, &events);
    wait_until(WAIT, "all eight are done", || done(&server) == 8);
    assert_sent_together(&server, 8);
    let got = rabbit.drain();
    let expected: HashSet<String> = events
        .iter()
        .map(|(id, _)| format!("shop:{id}:app"))
        .collect();
    assert_eq!(got.len(), 8, "{got:?}");
    assert_eq!(got.into_iter().collect::<HashSet<_>>(), expected);
}
both_backends!(amqp_batch_arrives_once_each);

/// The same with JetStream: killed after the ack, the resend carries the
/// same `Nats-Msg-Id` and is acked as a duplicate; NATS killed and
/// restarted (its store kept), the jobs retry until it is back. The stream
/// holds each event once, and `check` finds the stream and its window
/// (and warns that 10 minutes is shorter than lease + retry_max's default).
fn nats_exactly_once_across_a_broker_restart_and_a_kill9(backend: Backend) {
    let Some(mut nats) = Nats::start("dest_brokers::nats_exactly_once") else {
        return;
    };
    let ids: Vec<String> = (0..30).map(|i| format!("evt_n{i:02}")).collect();
    let mut server = Server::start_on(
        backend,
        &config(&nats.url("events.{source}")),
        &[("IDEMHOOK_FAILPOINTS", "forward.after_response=kill")],
    );
    post_all(&server, &ids[..10]);
    let status = server.wait_exit(Duration::from_secs(10));
    assert!(
        !status.success(),
        "the failpoint kills idemhook: {status:?}"
    );
    server.remove_env("IDEMHOOK_FAILPOINTS");
    server.restart();
    assert_eq!(post_all(&server, &ids[..10]), 10);
    wait_until(WAIT, "the first ten are done", || done(&server) == 10);
    let resent = server.count(
        "SELECT count(*) FROM attempts WHERE response_head LIKE 'duplicate%'",
        &[],
    );
    assert!(resent >= 1, "the job cut short by the kill was sent again");

    nats.kill();
    assert_eq!(post_all(&server, &ids[10..]), 20);
    wait_until(WAIT, "attempts fail while NATS is down", || {
        server.count(
            "SELECT count(*) FROM attempts WHERE outcome = 'retry' AND error_kind IN ('connect', 'timeout')",
            &[],
        ) >= 3
    });
    assert!(done(&server) <= 10);
    nats.start_again();
    wait_until(WAIT, "all thirty are done", || done(&server) == 30);

    let (count, msg_ids) = nats.messages();
    assert_eq!(count, 30, "each event once: {msg_ids:?}");
    let expected: HashSet<String> = ids.iter().map(|id| format!("shop:{id}:app")).collect();
    assert_eq!(msg_ids.into_iter().collect::<HashSet<_>>(), expected);

    let check = server.run_cli(&["check"]);
    assert!(
        check
            .stdout
            .contains("reachable; stream EVENTS covers events.shop")
            || check.stdout.contains("is templated"),
        "{}",
        check.stdout
    );
}
both_backends!(nats_exactly_once_across_a_broker_restart_and_a_kill9);

/// `check` on a fixed subject: finds the stream, its duplicate window, and
/// warns when it is shorter than the action's lease plus retry_max.
#[test]
fn check_reports_the_jetstream_window() {
    let Some(nats) = Nats::start("dest_brokers::check_reports_the_jetstream_window") else {
        return;
    };
    let config = config(&nats.url("events.fixed"));
    let out = crate::harness::check_config(&config);
    assert!(
        out.stdout
            .contains("reachable; stream EVENTS covers events.fixed, duplicate window 10m"),
        "{}",
        out.stdout
    );
    // lease 2s + retry_max 500ms: within the window, no warning.
    assert!(!out.stderr.contains("duplicate window"), "{}", out.stderr);
    let long = ServerConfig::new().tables(&format!(
        "[sources.shop]\nkind = \"stripe\"\nsecrets = [\"{SECRET}\"]\n\
         [[sources.shop.actions]]\nname = \"app\"\nforward = \"{}\"\n",
        nats.url("events.fixed")
    ));
    let out = crate::harness::check_config(&long);
    assert!(
        out.stderr.contains(
            "duplicate window (10m) is shorter than the action's lease plus retry_max (61m)"
        ),
        "{}",
        out.stderr
    );
}

/// RabbitMQ, at least once: killed after the confirm, idemhook publishes
/// the job again (a second message, same `message_id`); RabbitMQ killed
/// and restarted (durable queue, persistent messages): the jobs retry and
/// go out once it is back. Every event is in the queue, none lost, each
/// with its `message_id`. A routing key no queue is bound to is a failed
/// attempt with error kind `status` (mandatory, returned), retried.
fn amqp_at_least_once_across_a_broker_restart_and_a_kill9(backend: Backend) {
    let Some(mut rabbit) = Rabbit::start("dest_brokers::amqp_at_least_once") else {
        return;
    };
    let ids: Vec<String> = (0..30).map(|i| format!("evt_a{i:02}")).collect();
    let unroutable = format!(
        "\n[[sources.shop.actions]]\nname = \"lost\"\nforward = \"{}\"\ntimeout = \"1s\"\n\
         lease = \"2s\"\nretry_initial = \"100ms\"\nretry_max = \"500ms\"\ncircuit_failures = 0\n",
        rabbit.url("nowhere")
    );
    let mut server = Server::start_on(
        backend,
        &config(&rabbit.url("{source}")).tables(&unroutable),
        &[("IDEMHOOK_FAILPOINTS", "forward.after_response=kill")],
    );
    post_all(&server, &ids[..10]);
    let status = server.wait_exit(Duration::from_secs(10));
    assert!(
        !status.success(),
        "the failpoint kills idemhook: {status:?}"
    );
    server.remove_env("IDEMHOOK_FAILPOINTS");
    server.restart();
    assert_eq!(post_all(&server, &ids[..10]), 10);
    let app_done = |server: &Server| {
        server.count(
            "SELECT count(*) FROM jobs WHERE action = 'app' AND status = 'done'",
            &[],
        )
    };
    wait_until(WAIT, "the first ten are done", || app_done(&server) == 10);

    rabbit.kill();
    assert_eq!(post_all(&server, &ids[10..]), 20);
    wait_until(WAIT, "attempts fail while RabbitMQ is down", || {
        server.count(
            "SELECT count(*) FROM attempts a JOIN jobs j ON j.id = a.job_id WHERE j.action = 'app' \
             AND a.outcome = 'retry' AND a.error_kind IN ('connect', 'timeout')",
            &[],
        ) >= 3
    });
    rabbit.start_again();
    wait_until(Duration::from_secs(60), "all thirty are done", || {
        app_done(&server) == 30
    });

    let got = rabbit.drain();
    let expected: HashSet<String> = ids.iter().map(|id| format!("shop:{id}:app")).collect();
    assert_eq!(got.iter().cloned().collect::<HashSet<_>>(), expected);
    assert!(got.len() >= 30, "{got:?}");
    let unroutable_attempts = server.count(
        "SELECT count(*) FROM attempts a JOIN jobs j ON j.id = a.job_id WHERE j.action = 'lost' \
         AND a.outcome = 'retry' AND a.error_kind = 'status' AND a.error LIKE '%unroutable%'",
        &[],
    );
    assert!(unroutable_attempts >= 1, "unroutable is a failed attempt");
    assert_eq!(
        server.count(
            "SELECT count(*) FROM jobs WHERE action = 'lost' AND status = 'done'",
            &[]
        ),
        0
    );
    let check = server.run_cli(&["check"]);
    assert!(
        check.stdout.contains("reachable; exchange events exists"),
        "{}",
        check.stdout
    );
    assert!(!check.stdout.contains("guest:guest"), "{}", check.stdout);
}
both_backends!(amqp_at_least_once_across_a_broker_restart_and_a_kill9);

/// A batch in which one message is larger than RabbitMQ takes
/// (`max_message_size`): that job fails with the broker's reason; the
/// broker closes the channel, and every other job of the batch is done
/// (some after a retry on a channel opened again), each in the queue.
#[test]
fn amqp_batch_fails_only_the_message_too_large() {
    let Some(rabbit) = Rabbit::start_with(
        "dest_brokers::amqp_batch_fails_only_the_message_too_large",
        "max_message_size = 4096\n",
    ) else {
        return;
    };
    let server = Server::start(&one_worker(&rabbit.url("{source}")), &[]);
    server.run_cli(&["pause", "shop/app"]).assert_success();
    let big =
        serde_json::json!({"id": "evt_af_big", "type": "invoice.paid", "pad": "x".repeat(8000)})
            .to_string()
            .into_bytes();
    post_all(&server, &["evt_af0".to_string(), "evt_af1".to_string()]);
    let r = server.post("/hooks/shop", &sign::stripe_now(SECRET, &big), &big);
    assert_eq!(r.status, 200, "{}", r.text());
    post_all(&server, &["evt_af2".to_string(), "evt_af3".to_string()]);
    server.run_cli(&["resume", "shop/app"]).assert_success();
    wait_until(WAIT, "four done, the big one failed", || {
        done(&server) == 4
            && crate::helpers::job_status(&server, "shop", "evt_af_big", "app").as_deref()
                == Some("failed")
    });
    let error = server
        .row(
            "SELECT a.error FROM attempts a JOIN jobs j ON j.id = a.job_id \
             WHERE j.event_id = 'evt_af_big' ORDER BY a.n DESC LIMIT 1",
            &[],
        )
        .map(|r| r.text(0))
        .unwrap_or_default();
    assert!(
        error.contains("PRECONDITION_FAILED") || error.contains("max size"),
        "{error}"
    );
    assert_eq!(
        server.count(
            "SELECT count(*) FROM attempts a JOIN jobs j ON j.id = a.job_id WHERE j.event_id = 'evt_af_big'",
            &[]
        ),
        1,
        "failed at once, not retried"
    );
    let got: HashSet<String> = rabbit.drain().into_iter().collect();
    let expected: HashSet<String> = (0..4).map(|i| format!("shop:evt_af{i}:app")).collect();
    assert_eq!(got, expected);
}

/// A message larger than the NATS server takes (`max_payload`) fails the
/// job at once with the reason; a small one of the same action is done.
fn a_message_larger_than_nats_takes_fails_with_the_reason(backend: Backend) {
    let Some(nats) = Nats::start_with(
        "dest_brokers::a_message_larger_than_nats_takes",
        "max_payload: 2048\n",
    ) else {
        return;
    };
    let server = Server::start_on(backend, &config(&nats.url("events.{source}")), &[]);
    let big = serde_json::json!({"id": "evt_big", "type": "invoice.paid", "pad": "x".repeat(4000)})
        .to_string()
        .into_bytes();
    let r = server.post("/hooks/shop", &sign::stripe_now(SECRET, &big), &big);
    assert_eq!(r.status, 200, "{}", r.text());
    post_all(&server, &["evt_small".to_string()]);
    wait_until(WAIT, "the big job fails, the small one is done", || {
        crate::helpers::job_status(&server, "shop", "evt_big", "app").as_deref() == Some("failed")
            && crate::helpers::job_status(&server, "shop", "evt_small", "app").as_deref()
                == Some("done")
    });
    let error = server
        .row(
            "SELECT a.error FROM attempts a JOIN jobs j ON j.id = a.job_id WHERE j.event_id = 'evt_big'",
            &[],
        )
        .map(|r| r.text(0))
        .unwrap_or_default();
    assert!(error.contains("payload"), "{error}");
    assert_eq!(
        server.count(
            "SELECT count(*) FROM attempts a JOIN jobs j ON j.id = a.job_id WHERE j.event_id = 'evt_big'",
            &[]
        ),
        1,
        "failed at once, not retried"
    );
}
both_backends!(a_message_larger_than_nats_takes_fails_with_the_reason);

/// `check` against brokers that are not there: each target NOT USABLE
/// with the reason (a warning too), the check itself passes, and no
/// password in a URL is printed.
#[test]
fn check_says_a_broker_is_not_usable_and_prints_no_password() {
    let port = crate::brokers::free_port();
    let config = ServerConfig::new().tables(&format!(
        "[sources.shop]\nkind = \"stripe\"\nsecrets = [\"{SECRET}\"]\n\
         [[sources.shop.actions]]\nname = \"r\"\nforward = \"redis://u:hunter2secret@127.0.0.1:{port}/0/s\"\ntimeout = \"1s\"\n\
         [[sources.shop.actions]]\nname = \"n\"\nforward = \"nats://u:hunter3secret@127.0.0.1:{port}/events.x\"\ntimeout = \"1s\"\n\
         [[sources.shop.actions]]\nname = \"a\"\nforward = \"amqp://u:hunter4secret@127.0.0.1:{port}/%2f?exchange=e\"\ntimeout = \"1s\"\n"
    ));
    let out = crate::harness::check_config(&config);
    assert!(out.success(), "{}{}", out.stdout, out.stderr);
    for action in ["r", "n", "a"] {
        assert!(
            out.stdout
                .lines()
                .any(|l| l.starts_with(&format!("destination shop/{action} ("))
                    && l.contains("NOT USABLE: cannot connect")),
            "{action}: {}",
            out.stdout
        );
    }
    assert!(
        out.stdout.contains("redis://u:[REDACTED]@127.0.0.1"),
        "{}",
        out.stdout
    );
    let all = format!("{}{}", out.stdout, out.stderr);
    for secret in ["hunter2secret", "hunter3secret", "hunter4secret"] {
        assert!(!all.contains(secret), "{secret} printed:\n{all}");
    }
}
