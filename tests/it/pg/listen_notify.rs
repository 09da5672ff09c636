//! LISTEN/NOTIFY on PostgreSQL: a forward job committed by one instance
//! wakes the workers of another, which would otherwise find it only at
//! their next poll.

use std::time::{Duration, Instant};

use crate::downstream::Downstream;
use crate::harness::{Client, Server, ServerConfig, toml_str, wait_until};
use crate::pg_cluster;
use crate::sign;

const SECRET: &str = "whsec_pg_notify";

fn config(url: &str, downstream: &str, forward_workers: usize) -> ServerConfig {
    ServerConfig::new()
        .set("database", &toml_str(url))
        .set("forward_workers", &forward_workers.to_string())
        .set("prune_interval", &toml_str("0s"))
        .tables(&format!(
            "[sources.stripe]\nkind = \"stripe\"\nsecrets = [\"{SECRET}\"]\n\
             [[sources.stripe.actions]]\nname = \"notify\"\nforward = \"{downstream}/notify\"\n"
        ))
}

/// Instance A has no forward workers; instance B's one worker polls only
/// every 60 s (`outbox.idle`). B is listening and its worker asleep when
/// A stores an event: B's worker sends it within 30 s, so it was woken by
/// A's commit, not by its poll.
#[test]
fn a_job_committed_on_one_instance_wakes_the_workers_of_another() {
    let Some(cluster) = pg_cluster::cluster() else {
        pg_cluster::skipped("a_job_committed_on_one_instance_wakes_the_workers_of_another");
        return;
    };
    let url = cluster.create_database("it_notify_wakes");
    let ds = Downstream::start();
    let b = Server::start(
        &config(&url, &ds.url(), 1),
        &[("IDEMHOOK_FAILPOINTS", "outbox.idle=sleep(60000)")],
    );
    let a = Server::start(&config(&url, &ds.url(), 0), &[]);

    // B listens, and its worker has looked for jobs and gone to sleep:
    // its last transaction ended a second ago or more (a worker that is
    // not asleep runs one within milliseconds).
    let mut db = postgres::Client::connect(&url, postgres::NoTls).expect("connect");
    let count = |db: &mut postgres::Client, sql: &str| -> i64 {
        db.query_one(sql, &[])
            .unwrap_or_else(|e| panic!("{sql}: {e:?}"))
            .get(0)
    };
    wait_until(
        Duration::from_secs(30),
        "B listens and its worker sleeps",
        || {
            let listening = count(
                &mut db,
                "SELECT count(*) FROM pg_stat_activity WHERE query = 'LISTEN idemhook_jobs'
               AND datname = current_database()",
            );
            let asleep = count(
            &mut db,
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'idemhook' AND datname = current_database()
               AND query = 'COMMIT' AND state = 'idle'
               AND state_change < now() - interval '1 second'",
        );
            let busy = count(
            &mut db,
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'idemhook' AND datname = current_database()
               AND query = 'COMMIT' AND (state <> 'idle'
                                         OR state_change >= now() - interval '1 second')",
        );
            listening >= 2 && asleep >= 1 && busy == 0
        },
    );

    let body = serde_json::json!({
        "id": "evt_notify_1", "object": "event", "type": "charge.succeeded",
        "data": {"object": {"amount": 100}}
    })
    .to_string()
    .into_bytes();
    let stored = Instant::now();
    let r = Client::new(Duration::from_secs(20)).post(
        &a.url("/hooks/stripe"),
        &sign::stripe_now(SECRET, &body),
        &body,
    );
    assert_eq!(r.status, 200, "{}", r.text());

    let key = "stripe:evt_notify_1:notify";
    wait_until(Duration::from_secs(30), "B's worker sends the job", || {
        ds.effects(key) == 1
    });
    assert!(
        stored.elapsed() < Duration::from_secs(60),
        "sent before B's poll would have looked"
    );
    wait_until(Duration::from_secs(30), "the job is done", || {
        count(&mut db, "SELECT count(*) FROM jobs WHERE status = 'done'") == 1
    });
    let worker: String = db
        .query_one("SELECT worker FROM attempts", &[])
        .expect("one attempt")
        .get(0);
    assert!(
        worker.starts_with(&format!("{}-", b.pid())),
        "B's worker sent it (A has none): {worker}"
    );
    assert_eq!(ds.effects(key), 1);
    drop(a);
    drop(b);
}

/// A commit wakes the workers only when it wrote a job they could take
/// now: a job of a paused action (or one parked for `after`) sends no
/// NOTIFY, a due one sends one.
#[test]
fn only_a_group_that_wrote_a_due_forward_job_notifies() {
    let Some(cluster) = pg_cluster::cluster() else {
        pg_cluster::skipped("only_a_group_that_wrote_a_due_forward_job_notifies");
        return;
    };
    let url = cluster.create_database("it_notify_due_only");
    let ds = Downstream::start();
    let server = Server::start(&config(&url, &ds.url(), 0), &[]);
    let mut listener = postgres::Client::connect(&url, postgres::NoTls).expect("connect");
    listener
        .batch_execute("LISTEN idemhook_jobs")
        .expect("listen");
    let post = |id: &str| {
        let body = serde_json::json!({"id": id, "type": "charge.succeeded"})
            .to_string()
            .into_bytes();
        let r = server.post("/hooks/stripe", &sign::stripe_now(SECRET, &body), &body);
        assert_eq!(r.status, 200, "{}", r.text());
    };
    let paused = server.run_cli(&["pause", "stripe/notify"]);
    assert!(paused.success(), "{}", paused.stderr);
    // The pause itself notifies nobody's workers; drain what came before.
    let drain = |c: &mut postgres::Client, wait: Duration| -> usize {
        let mut n = 0;
        let mut notifications = c.notifications();
        let mut iter = notifications.timeout_iter(wait);
        while let Ok(Some(_)) = fallible_iterator::FallibleIterator::next(&mut iter) {
            n += 1;
        }
        n
    };
    drain(&mut listener, Duration::from_millis(300));
    post("evt_parked");
    assert_eq!(
        drain(&mut listener, Duration::from_millis(500)),
        0,
        "a job of a paused action wakes no worker"
    );
    let resumed = server.run_cli(&["resume", "stripe/notify"]);
    assert!(resumed.success(), "{}", resumed.stderr);
    drain(&mut listener, Duration::from_millis(300));
    post("evt_due");
    assert_eq!(
        drain(&mut listener, Duration::from_secs(1)),
        1,
        "a due job wakes the workers, once"
    );
}
