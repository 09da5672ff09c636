//! A failover under load, on a real primary and a streaming standby made
//! by `pg_basebackup -R`, with synchronous replication: the primary is
//! killed with SIGKILL while deliveries stream in, the standby is
//! promoted, and serve (never restarted) reconnects by itself through its
//! multi-host URL. Every delivery answered 2xx is in the promoted
//! database, every SQL effect is there exactly once, and every forward
//! job is done with one effect downstream (the `check` keeps a job leased
//! on the old primary from being sent twice).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::downstream::Downstream;
use crate::harness::{Client, Server, ServerConfig, toml_str, wait_until};
use crate::helpers::StripeHook;
use crate::pg_cluster::{self, Local};

const SECRET: &str = "whsec_it_pg_failover_0123456789";
const STRIPE: StripeHook = StripeHook::new("stripe", SECRET);

fn body(id: &str) -> Vec<u8> {
    serde_json::json!({"id": id, "type": "charge.succeeded"})
        .to_string()
        .into_bytes()
}

fn config(url: &str, ds: &Downstream) -> ServerConfig {
    ServerConfig::new()
        .set("database", &toml_str(url))
        .set("busy_timeout", &toml_str("2s"))
        .set(
            "setup_sql",
            &toml_str("CREATE TABLE IF NOT EXISTS ledger (event_id text NOT NULL)"),
        )
        .tables(&format!(
            "[sources.stripe]\nkind = \"stripe\"\nsecrets = [\"{SECRET}\"]\n\
             [[sources.stripe.actions]]\nname = \"book\"\n\
             sql = \"INSERT INTO ledger (event_id) VALUES (:event_id)\"\n\
             [[sources.stripe.actions]]\nname = \"notify\"\nforward = {}\ncheck = {}\n\
             timeout = \"1s\"\nlease = \"3s\"\nretry_initial = \"100ms\"\nretry_max = \"500ms\"\n\
             max_attempts = 50\n",
            toml_str(&format!("{}/in/notify", ds.url())),
            toml_str(&ds.check_template()),
        ))
}

#[test]
fn a_failover_under_load_loses_no_acknowledged_event_and_sends_nothing_twice() {
    let port = format!("port={}", pg_cluster::free_port());
    let Some(primary) = pg_cluster::private_with(&[
        "listen_addresses=127.0.0.1",
        &port,
        "wal_level=replica",
        "max_wal_senders=5",
        "hot_standby=on",
        "synchronous_standby_names=*",
    ]) else {
        pg_cluster::skipped("a_failover_under_load_loses_no_acknowledged_event");
        return;
    };
    let standby = Local::standby_of(&primary).expect("a streaming standby");
    // Synchronous: a commit returns once the standby has it.
    let mut watch = postgres::Client::connect(&primary.cluster().url("postgres"), postgres::NoTls)
        .expect("connect to the primary");
    wait_until(
        Duration::from_secs(30),
        "the standby streams in sync",
        || {
            watch
                .query(
                    "SELECT 1 FROM pg_stat_replication WHERE sync_state = 'sync'",
                    &[],
                )
                .is_ok_and(|rows| !rows.is_empty())
        },
    );
    drop(watch);

    let ds = Downstream::start();
    let url = format!(
        "postgresql://postgres@127.0.0.1:{},127.0.0.1:{}/postgres",
        primary.port(),
        standby.port()
    );
    let server = Arc::new(Server::start(&config(&url, &ds), &[]));

    // Deliveries stream in from one provider thread; each id that is not
    // answered 2xx is sent again later, as a provider would.
    let stop = Arc::new(AtomicBool::new(false));
    let accepted: Arc<Mutex<Vec<String>>> = Arc::default();
    let refused: Arc<Mutex<Vec<String>>> = Arc::default();
    let load = {
        let (server, stop) = (server.clone(), stop.clone());
        let (accepted, refused) = (accepted.clone(), refused.clone());
        std::thread::spawn(move || {
            let client = Client::new(Duration::from_secs(5));
            for n in 0..3000 {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let id = format!("evt_fo_{n}");
                let into = if STRIPE
                    .try_deliver(&client, &server, &body(&id))
                    .is_ok_and(|r| (200..300).contains(&r.status))
                {
                    &accepted
                } else {
                    &refused
                };
                into.lock().expect("lock").push(id);
            }
        })
    };
    let accepted_now = || accepted.lock().expect("lock").len();
    wait_until(
        Duration::from_secs(60),
        "deliveries before the crash",
        || accepted_now() >= 40,
    );
    let before_crash = accepted_now();
    primary.kill9();
    standby.promote().expect("promote the standby");
    let promoted = Instant::now();
    wait_until(
        Duration::from_secs(15),
        "/readyz 200 within 15 s of the promotion",
        || server.get("/readyz").status == 200,
    );
    let ready_after = promoted.elapsed();
    wait_until(
        Duration::from_secs(60),
        "deliveries after the promotion",
        || accepted_now() >= before_crash + 40,
    );
    stop.store(true, Ordering::SeqCst);
    load.join().expect("the load thread");

    // The provider's retries of whatever was refused during the failover.
    let client = Client::new(Duration::from_secs(5));
    let retried: Vec<String> = refused.lock().expect("lock").clone();
    for id in &retried {
        wait_until(
            Duration::from_secs(30),
            "a retried delivery accepted",
            || {
                STRIPE
                    .try_deliver(&client, &server, &body(id))
                    .is_ok_and(|r| (200..300).contains(&r.status))
            },
        );
    }
    let accepted: Vec<String> = accepted.lock().expect("lock").clone();
    let all = accepted.len() + retried.len();
    eprintln!(
        "failover: {} accepted, {} refused then retried, /readyz 200 {ready_after:?} after the promotion",
        accepted.len(),
        retried.len()
    );

    // Every 2xx is in the promoted database, each SQL effect once.
    let events = server.count("SELECT count(*) FROM events", &[]);
    assert_eq!(events, all as i64, "every event sent is stored once");
    for id in &accepted {
        assert_eq!(
            server.count(
                "SELECT count(*) FROM events WHERE source = 'stripe' AND event_id = $1",
                &[id]
            ),
            1,
            "{id} was answered 2xx"
        );
    }
    assert_eq!(
        server.count("SELECT count(*) FROM ledger", &[]),
        all as i64,
        "one ledger row per event"
    );
    assert_eq!(
        server.count("SELECT count(DISTINCT event_id) FROM ledger", &[]),
        all as i64,
        "no event booked twice"
    );
    // A redelivery of an event acknowledged before the crash is a
    // duplicate on the new primary.
    let again = STRIPE
        .try_deliver(&client, &server, &body(&accepted[0]))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(again.text().contains("duplicate"), "{}", again.text());

    // Every forward job is done, each with one effect downstream.
    wait_until(Duration::from_secs(90), "every forward job done", || {
        server.count(
            "SELECT count(*) FROM jobs WHERE action = 'notify' AND status = 'done'",
            &[],
        ) == all as i64
    });
    for id in accepted.iter().chain(&retried) {
        assert_eq!(
            ds.effects(&format!("stripe:{id}:notify")),
            1,
            "effects for {id}"
        );
    }
    assert_eq!(ds.total_effects(), all as u64);
}
