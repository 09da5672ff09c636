//! `serve` on PostgreSQL, through the binary, against the throwaway test
//! cluster (`tests/support/pg_cluster.rs`; SKIPPED loudly without one):
//! several instances on one database claim each event exactly once and
//! write the team's own table once per event.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::harness::{Client, Server, ServerConfig, toml_str};
use crate::pg_cluster;
use crate::sign;

use super::count;

const SECRET: &str = "whsec_pg_instances";

fn config(url: &str) -> ServerConfig {
    ServerConfig::new()
        .set("database", &toml_str(url))
        .set(
            "setup_sql",
            &toml_str(
                "CREATE TABLE IF NOT EXISTS ledger (event_id text PRIMARY KEY, amount bigint NOT NULL, \
                 received_at bigint NOT NULL)",
            ),
        )
        .tables(&format!(
            "[sources.stripe]\nkind = \"stripe\"\nsecrets = [\"{SECRET}\"]\n\
             [[sources.stripe.actions]]\nname = \"credit\"\n\
             sql = \"INSERT INTO ledger (event_id, amount, received_at) VALUES (:event_id, :amount, :received_at)\"\n\
             params = {{ amount = \"json:/data/object/amount\" }}\n"
        ))
}

fn event(i: usize) -> Vec<u8> {
    serde_json::json!({
        "id": format!("evt_{i:04}"), "object": "event", "type": "charge.succeeded",
        "data": {"object": {"amount": 100 + i}}
    })
    .to_string()
    .into_bytes()
}

/// Three instances on one database receive 300 events, each delivered 6
/// times, spread over the instances concurrently and in different orders:
/// every answer 200, exactly 300 events and exactly 300 rows written by
/// the SQL action into the team's table.
#[test]
fn three_instances_on_one_database_store_each_event_once() {
    let Some(cluster) = pg_cluster::cluster() else {
        pg_cluster::skipped("three_instances_on_one_database_store_each_event_once");
        return;
    };
    let url = cluster.create_database("it_three_instances");
    // A loaded machine may keep a claim waiting longer than the default
    // 5 s (then the answer is a 503, as it should be); this test is
    // about exactly-once, so it gives them time.
    let config = config(&url).set("busy_timeout", &toml_str("30s"));
    // Started at once: they migrate under the advisory lock, one by one.
    let starting: Vec<_> = (0..3)
        .map(|_| {
            let config = config.clone();
            std::thread::spawn(move || Server::start(&config, &[]))
        })
        .collect();
    let servers: Vec<Arc<Server>> = starting
        .into_iter()
        .map(|t| Arc::new(t.join().expect("an instance started")))
        .collect();

    // Six senders, two per instance; delivery j of event i goes to
    // instance (i + j) % 3, each sender in its own shuffled order.
    let deadline = Instant::now() + Duration::from_secs(120);
    let senders: Vec<_> = (0..6)
        .map(|sender| {
            let servers = servers.clone();
            std::thread::spawn(move || {
                let instance = sender % 3;
                let mut work: Vec<usize> = (0..300)
                    .flat_map(|i| (0..6).map(move |j| (i, j)))
                    .filter(|(i, j)| (i + j) % 3 == instance && (i + j + sender / 3) % 2 == 0)
                    .map(|(i, _)| i)
                    .collect();
                fastrand::Rng::with_seed(sender as u64).shuffle(&mut work);
                let client = Client::new(Duration::from_secs(60));
                let mut statuses = Vec::new();
                for i in work {
                    assert!(Instant::now() < deadline, "the deliveries took over 120 s");
                    let body = event(i);
                    let url = servers[instance].url("/hooks/stripe");
                    let r = client.post(&url, &sign::stripe_now(SECRET, &body), &body);
                    statuses.push((i, r.status));
                }
                statuses
            })
        })
        .collect();
    let mut answered = 0;
    let mut per_event = vec![0; 300];
    for t in senders {
        for (i, status) in t.join().expect("a sender finished") {
            assert_eq!(status, 200, "event {i}: every delivery answers 200");
            answered += 1;
            per_event[i] += 1;
        }
    }
    assert_eq!(answered, 1800);
    assert!(per_event.iter().all(|&n| n == 6), "{per_event:?}");

    let mut db = postgres::Client::connect(&url, postgres::NoTls).expect("connect");
    assert_eq!(count(&mut db, "SELECT count(*) FROM events", &[]), 300);
    assert_eq!(count(&mut db, "SELECT count(*) FROM ledger", &[]), 300);
    assert_eq!(
        count(
            &mut db,
            "SELECT count(*) FROM ledger WHERE amount = 100 + substr(event_id, 5)::int",
            &[]
        ),
        300,
        "each row has its own event's amount"
    );
    assert_eq!(count(&mut db, "SELECT count(*) FROM deliveries", &[]), 1800);
    assert_eq!(
        count(
            &mut db,
            "SELECT count(*) FROM deliveries WHERE outcome = 'accepted'",
            &[]
        ),
        300
    );
    assert_eq!(
        count(&mut db, "SELECT count(*) FROM idemhook_migrations", &[]),
        std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations/postgres"))
            .expect("the migrations")
            .count() as i64,
        "each migration applied once"
    );
    drop(servers);
}

/// `check` against PostgreSQL: the migrations, setup_sql and the SQL
/// actions are tried in a transaction that is rolled back, and the URL is
/// shown without its password.
#[test]
fn check_on_postgres_leaves_the_database_as_it_was() {
    let Some(cluster) = pg_cluster::cluster() else {
        pg_cluster::skipped("check_on_postgres_leaves_the_database_as_it_was");
        return;
    };
    let url = cluster.create_database("it_check");
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("idemhook.toml");
    std::fs::write(&path, config(&url).render()).expect("write config");
    let out = crate::harness::run_binary(
        dir.path(),
        &Default::default(),
        &[
            "check".to_string(),
            "--config".to_string(),
            path.display().to_string(),
        ],
        crate::harness::CLI_TIMEOUT,
    );
    assert!(
        out.success() && out.stdout.contains("(PostgreSQL)"),
        "check passes\n{}\n{}",
        out.stdout,
        out.stderr
    );
    let mut db = postgres::Client::connect(&url, postgres::NoTls).expect("connect");
    assert_eq!(
        count(
            &mut db,
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'",
            &[]
        ),
        0,
        "nothing was created"
    );
    // An operator command on a database serve never migrated says so.
    let out = crate::harness::run_binary(
        dir.path(),
        &Default::default(),
        &[
            "events".to_string(),
            "list".to_string(),
            "--config".to_string(),
            path.display().to_string(),
        ],
        crate::harness::CLI_TIMEOUT,
    );
    assert!(
        out.status.code() == Some(2) && out.stderr.contains("has serve run yet?"),
        "{}",
        out.stderr
    );
    // backup refuses with a pointer to pg_dump.
    let out = crate::harness::run_binary(
        dir.path(),
        &Default::default(),
        &[
            "backup".to_string(),
            "--config".to_string(),
            path.display().to_string(),
            dir.path().join("copy.db").display().to_string(),
        ],
        crate::harness::CLI_TIMEOUT,
    );
    assert!(
        out.status.code() == Some(2) && out.stderr.contains("pg_dump"),
        "{}",
        out.stderr
    );
}

/// PostgreSQL stopped, started again, then hung (every server process
/// frozen) under a steady stream of deliveries: no 2xx for anything not
/// stored, 503 with Retry-After within busy_timeout meanwhile, /readyz
/// 503, and service back each time without restarting idemhook.
#[test]
fn postgres_stopped_restarted_and_hung_under_load() {
    let Some(local) = pg_cluster::private() else {
        pg_cluster::skipped("postgres_stopped_restarted_and_hung_under_load");
        return;
    };
    let url = local.cluster().create_database("it_faults");
    let server = Arc::new(Server::start(
        &config(&url).set("busy_timeout", &toml_str("2s")),
        &[],
    ));

    type Seen = Vec<(usize, u16, bool, Duration)>;
    let seen: Arc<std::sync::Mutex<Seen>> = Arc::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = {
        let (server, seen, stop) = (server.clone(), seen.clone(), stop.clone());
        std::thread::spawn(move || {
            let client = Client::new(Duration::from_secs(15));
            let deadline = Instant::now() + Duration::from_secs(150);
            let mut i = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) && Instant::now() < deadline {
                let body = event(i);
                let started = Instant::now();
                let r = client.post(
                    &server.url("/hooks/stripe"),
                    &sign::stripe_now(SECRET, &body),
                    &body,
                );
                let retry_after = r.header("retry-after").is_some();
                seen.lock()
                    .unwrap()
                    .push((i, r.status, retry_after, started.elapsed()));
                i += 1;
                if r.status != 200 {
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        })
    };
    let count_since = |from: usize, status: u16| {
        seen.lock().unwrap()[from..]
            .iter()
            .filter(|s| s.1 == status)
            .count()
    };
    let mark = || seen.lock().unwrap().len();
    let wait = |what: &str, cond: &dyn Fn() -> bool| {
        crate::harness::wait_until(Duration::from_secs(60), what, cond);
    };

    wait("20 events stored", &|| count_since(0, 200) >= 20);

    local.stop();
    let stopped = mark();
    wait("503s while PostgreSQL is stopped", &|| {
        count_since(stopped, 503) >= 3
    });
    assert_eq!(server.get("/readyz").status, 503, "not ready while stopped");

    local.spawn().expect("restart PostgreSQL");
    local.wait_ready().expect("PostgreSQL is back");
    let restarted = mark();
    wait("service back after the restart", &|| {
        count_since(restarted, 200) >= 20
    });
    assert_eq!(server.get("/readyz").status, 200, "ready again");

    local.freeze();
    let frozen = mark();
    wait("503s while PostgreSQL hangs", &|| {
        count_since(frozen, 503) >= 2
    });
    let started = Instant::now();
    assert_eq!(server.get("/readyz").status, 503, "not ready while hung");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "/readyz answered within busy_timeout: {:?}",
        started.elapsed()
    );
    local.thaw();
    let thawed = mark();
    wait("service back after the hang", &|| {
        count_since(thawed, 200) >= 10
    });
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    load.join().expect("the load finished");

    let seen = seen.lock().unwrap().clone();
    for (i, status, retry_after, took) in &seen {
        assert!(
            *status == 200 || *status == 503,
            "event {i}: only 200 or 503, got {status}"
        );
        if *status == 503 {
            assert!(*retry_after, "event {i}: a 503 carries Retry-After");
            assert!(
                *took < Duration::from_secs(5),
                "event {i}: the 503 came within busy_timeout (2 s) plus slack: {took:?}"
            );
        }
    }
    // Every 2xx is stored; then every event is delivered again: all 200,
    // and each is stored, with its effect, exactly once.
    let mut db = postgres::Client::connect(&url, postgres::NoTls).expect("connect");
    for (i, status, _, _) in &seen {
        if *status == 200 {
            let n: i64 = db
                .query_one(
                    "SELECT count(*) FROM events WHERE event_id = $1",
                    &[&format!("evt_{i:04}")],
                )
                .unwrap()
                .get(0);
            assert_eq!(n, 1, "event {i} was answered 200 and is stored");
        }
    }
    let client = Client::new(Duration::from_secs(15));
    for (i, _, _, _) in &seen {
        let body = event(*i);
        let r = client.post(
            &server.url("/hooks/stripe"),
            &sign::stripe_now(SECRET, &body),
            &body,
        );
        assert_eq!(r.status, 200, "event {i} delivered again");
    }
    let sent = seen.len() as i64;
    assert_eq!(count(&mut db, "SELECT count(*) FROM events", &[]), sent);
    assert_eq!(count(&mut db, "SELECT count(*) FROM ledger", &[]), sent);
}

/// Two instances share the forward jobs of one database; one is killed
/// with kill -9 while the downstream is slow; the other takes its jobs
/// over after the lease: every job done, exactly one effect per key at
/// the downstream, the cut-short attempts recorded as such.
#[test]
fn two_instances_share_forward_jobs_and_one_takes_over_after_kill_9() {
    use crate::downstream::Downstream;
    let Some(cluster) = pg_cluster::cluster() else {
        pg_cluster::skipped("two_instances_share_forward_jobs_and_one_takes_over_after_kill_9");
        return;
    };
    let url = cluster.create_database("it_takeover");
    let ds = Downstream::start();
    ds.set_delay(Duration::from_millis(700));
    let config = ServerConfig::new()
        .set("database", &toml_str(&url))
        .set("forward_workers", "2")
        .tables(&format!(
            "[sources.stripe]\nkind = \"stripe\"\nsecrets = [\"{SECRET}\"]\n\
             [[sources.stripe.actions]]\nname = \"notify\"\nforward = \"{}/notify\"\n\
             timeout = \"1s\"\nlease = \"2s\"\nretry_initial = \"100ms\"\nretry_max = \"500ms\"\n",
            ds.url()
        ));
    let mut a = Server::start(&config, &[]);
    let b = Server::start(&config, &[]);
    let client = Client::new(Duration::from_secs(20));
    let n = 30;
    for i in 0..n {
        let body = event(i);
        let target = if i % 2 == 0 { &a } else { &b };
        let r = client.post(
            &target.url("/hooks/stripe"),
            &sign::stripe_now(SECRET, &body),
            &body,
        );
        assert_eq!(r.status, 200, "event {i}");
    }
    let mut db = postgres::Client::connect(&url, postgres::NoTls).expect("connect");
    let (a_pid, b_pid) = (a.pid().to_string(), b.pid().to_string());
    let a_owner = format!("{a_pid}-%");
    let held_by_a = |db: &mut postgres::Client| -> i64 {
        db.query_one(
            "SELECT count(*) FROM jobs WHERE status = 'processing' AND lease_owner LIKE $1",
            &[&a_owner],
        )
        .unwrap()
        .get(0)
    };
    crate::harness::wait_until(Duration::from_secs(30), "instance A holds jobs", || {
        held_by_a(&mut db) >= 1
    });
    a.kill9();

    crate::harness::wait_until(Duration::from_secs(90), "every job done", || {
        count(
            &mut db,
            "SELECT count(*) FROM jobs WHERE status = 'done'",
            &[],
        ) == n as i64
    });
    for i in 0..n {
        let key = format!("stripe:evt_{i:04}:notify");
        assert_eq!(ds.effects(&key), 1, "exactly one effect for {key}");
    }
    let workers: Vec<String> = db
        .query(
            "SELECT DISTINCT split_part(worker, '-', 1) FROM attempts",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(
        workers.contains(&a_pid) && workers.contains(&b_pid),
        "both instances' workers made attempts (the jobs are shared): {workers:?}"
    );
    assert!(
        count(
            &mut db,
            "SELECT count(*) FROM attempts WHERE error_kind = 'lease'",
            &[]
        ) >= 1,
        "the takeover recorded the attempt cut short by kill -9"
    );
    assert_eq!(
        count(
            &mut db,
            "SELECT count(*) FROM events WHERE state = 'completed'",
            &[]
        ),
        n as i64
    );
    // reconcile against the shared database: nothing stuck, overdue or
    // failed after the takeover (exit 0).
    let report = b.run_cli(&["reconcile", "--json"]);
    assert_eq!(
        report.status.code(),
        Some(0),
        "reconcile is clean after the takeover\n{}\n{}",
        report.stdout,
        report.stderr
    );
    drop(b);
}

/// `sslmode=require` connects over TLS and verifies the server against
/// `sslrootcert`; a server whose certificate the client does not trust is
/// refused rather than used unverified.
#[test]
fn sslmode_require_verifies_the_server_certificate() {
    let certified =
        rcgen::generate_simple_self_signed(vec!["localhost".to_string(), "127.0.0.1".to_string()])
            .expect("generate a certificate");
    let cert_pem = certified.cert.pem();
    let key_pem = certified.signing_key.serialize_pem();
    let Some((local, port)) = pg_cluster::private_tls(&cert_pem, &key_pem) else {
        pg_cluster::skipped("sslmode_require_verifies_the_server_certificate");
        return;
    };
    // The database, made over the unix socket.
    let socket_url = local.cluster().create_database("it_tls");
    let db = socket_url
        .split('/')
        .nth(3)
        .and_then(|p| p.split('?').next())
        .expect("database name")
        .to_string();
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("ca.pem"), &cert_pem).expect("write ca.pem");
    let tls_url = format!(
        "postgres://postgres@localhost:{port}/{db}?sslmode=require&sslrootcert={}",
        dir.path().join("ca.pem").display()
    );
    let server = Server::start(&config(&tls_url), &[]);
    let body = event(1);
    let r = Client::new(Duration::from_secs(10)).post(
        &server.url("/hooks/stripe"),
        &sign::stripe_now(SECRET, &body),
        &body,
    );
    assert_eq!(r.status, 200, "stored over TLS");
    let mut check = postgres::Client::connect(&socket_url, postgres::NoTls).expect("connect");
    let tls_sessions: i64 = check
        .query_one(
            "SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)
             WHERE s.ssl AND a.application_name = 'idemhook'",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(tls_sessions >= 1, "idemhook's sessions use TLS");
    drop(server);

    // Without the CA, the public roots do not vouch for this server:
    // serve refuses to start rather than connect unverified.
    let untrusted = format!("postgres://postgres@localhost:{port}/{db}?sslmode=require");
    let path = dir.path().join("untrusted.toml");
    std::fs::write(&path, config(&untrusted).render()).expect("write config");
    let out = crate::harness::run_binary(
        dir.path(),
        &Default::default(),
        &[
            "check".to_string(),
            "--config".to_string(),
            path.display().to_string(),
        ],
        crate::harness::CLI_TIMEOUT,
    );
    assert_eq!(out.status.code(), Some(2), "{}", out.stderr);
}

/// `migrate` from a populated SQLite installation: refused while serve
/// runs, a plan without --yes, every row copied and verified with --yes,
/// refused into a target that has events; then every old event delivered
/// again to serve on PostgreSQL is a duplicate, with no new effect.
#[test]
fn migrate_then_every_old_event_is_a_duplicate() {
    use crate::downstream::Downstream;
    let Some(cluster) = pg_cluster::cluster() else {
        pg_cluster::skipped("migrate_then_every_old_event_is_a_duplicate");
        return;
    };
    let url = cluster.create_database("it_migrate");
    let ds = Downstream::start();
    let sources = format!(
        "[[sources.stripe.actions]]\nname = \"notify\"\nforward = \"{}/notify\"\n\
         timeout = \"2s\"\nlease = \"4s\"\n",
        ds.url()
    );
    let sqlite_config = config("idemhook.db").unset("database").tables(&sources);
    let mut server = Server::start(&sqlite_config, &[]);
    let client = Client::new(Duration::from_secs(10));
    let n = 20;
    let post = |server: &Server, body: &[u8]| {
        client.post(
            &server.url("/hooks/stripe"),
            &sign::stripe_now(SECRET, body),
            body,
        )
    };
    for i in 0..n {
        assert_eq!(post(&server, &event(i)).status, 200, "event {i}");
        assert_eq!(post(&server, &event(i)).status, 200, "event {i} again");
    }
    // A mismatched duplicate: an incident with its body.
    let mut changed: serde_json::Value = serde_json::from_slice(&event(0)).unwrap();
    changed["data"]["object"]["amount"] = serde_json::json!(999);
    let changed = changed.to_string().into_bytes();
    post(&server, &changed);
    crate::harness::wait_until(Duration::from_secs(60), "every forward done", || {
        ds.total_effects() == n as u64
    });

    // The plan runs while serve runs, and writes nothing on either side.
    let mut db = postgres::Client::connect(&url, postgres::NoTls).expect("connect");
    let plan = server.run_cli(&["migrate", "--to", &url]);
    assert!(plan.success(), "{}", plan.stderr);
    assert!(plan.stdout.contains("nothing copied"), "{}", plan.stdout);
    assert_eq!(
        count(
            &mut db,
            "SELECT count(*) FROM pg_namespace WHERE nspname = 'idemhook'",
            &[]
        ),
        0,
        "the plan writes nothing into the target"
    );
    // Refused while serve runs on the file.
    let out = server.run_cli(&["migrate", "--to", &url, "--yes"]);
    assert!(
        out.status.code() == Some(2) && out.stderr.contains("running"),
        "refused while serve runs\n{}",
        out.stderr
    );
    server.terminate();
    server.wait_exit(Duration::from_secs(30));

    let sqlite_counts = |table: &str| -> i64 {
        crate::harness::count(&server.db(), &format!("SELECT count(*) FROM {table}"), [])
    };
    let done = server.run_cli(&["migrate", "--to", &url, "--yes"]);
    assert!(done.success(), "{}\n{}", done.stdout, done.stderr);
    assert!(
        done.stdout.contains("copied events"),
        "a line per table: {}",
        done.stdout
    );
    // The file records the move: serve refuses it from now on.
    let refused = server.run_cli(&["serve", "--listen", "127.0.0.1:0"]);
    assert_eq!(refused.status.code(), Some(2), "{refused:?}");
    assert!(refused.stderr.contains("moved"), "{}", refused.stderr);
    for table in [
        "events",
        "jobs",
        "attempts",
        "deliveries",
        "incidents",
        "incident_payloads",
        "replays",
        "source_rules",
    ] {
        assert_eq!(
            count(&mut db, &format!("SELECT count(*) FROM {table}"), &[]),
            sqlite_counts(table),
            "{table} copied row for row"
        );
    }
    assert_eq!(count(&mut db, "SELECT count(*) FROM incidents", &[]), 1);
    let again = server.run_cli(&["migrate", "--to", &url, "--yes"]);
    assert!(
        again.status.code() == Some(2) && again.stderr.contains("already holds"),
        "{}",
        again.stderr
    );

    // serve on PostgreSQL now: every old event is a duplicate.
    let jobs_before = count(&mut db, "SELECT count(*) FROM jobs", &[]);
    let pg_server = Server::start(&config(&url).tables(&sources), &[]);
    // The team's table in the SQLite file is not idemhook's to move: on
    // PostgreSQL setup_sql makes it, empty.
    let ledger_before = count(&mut db, "SELECT count(*) FROM ledger", &[]);
    for i in 0..n {
        let r = post(&pg_server, &event(i));
        assert_eq!(r.status, 200, "event {i}");
        assert_eq!(r.json_status().as_deref(), Some("duplicate"), "event {i}");
    }
    // A new event still works, and its jobs get new ids past the copied ones.
    assert_eq!(post(&pg_server, &event(n)).status, 200);
    crate::harness::wait_until(Duration::from_secs(60), "the new event forwarded", || {
        ds.total_effects() == n as u64 + 1
    });
    assert_eq!(
        count(&mut db, "SELECT count(*) FROM jobs", &[]),
        jobs_before + 2
    );
    assert_eq!(
        count(&mut db, "SELECT count(*) FROM ledger", &[]),
        ledger_before + 1
    );
    assert_eq!(
        ds.total_effects(),
        n as u64 + 1,
        "no old event forwarded again"
    );
}

/// A config whose SQL action writes a table without a key: a doubled
/// effect would be a second row, not a failed action.
fn unkeyed_config(url: &str) -> ServerConfig {
    ServerConfig::new()
        .set("database", &toml_str(url))
        .set("busy_timeout", &toml_str("30s"))
        .set(
            "setup_sql",
            &toml_str(
                "CREATE TABLE IF NOT EXISTS effects (event_id text NOT NULL, amount bigint NOT NULL)",
            ),
        )
        .tables(&format!(
            "[sources.stripe]\nkind = \"stripe\"\nsecrets = [\"{SECRET}\"]\n\
             [[sources.stripe.actions]]\nname = \"credit\"\n\
             sql = \"INSERT INTO effects (event_id, amount) VALUES (:event_id, :amount)\"\n\
             params = {{ amount = \"json:/data/object/amount\" }}\n"
        ))
}

/// kill -9 in the middle of a group of claims (every statement run, the
/// row locks held, COMMIT not sent): no 2xx, nothing stored, and after a
/// restart the provider's retry is accepted and its action runs once.
#[test]
fn kill9_before_the_group_commits_stores_nothing_and_the_retry_is_accepted() {
    let Some(cluster) = pg_cluster::cluster() else {
        pg_cluster::skipped(
            "kill9_before_the_group_commits_stores_nothing_and_the_retry_is_accepted",
        );
        return;
    };
    let url = cluster.create_database("it_kill_group");
    let mut server = Server::start(
        &unkeyed_config(&url),
        &[("IDEMHOOK_FAILPOINTS", "pg.group.before_commit=kill")],
    );
    let body = event(7);
    let answer = crate::harness::try_post(
        &server.url("/hooks/stripe"),
        &sign::stripe_now(SECRET, &body),
        &body,
    );
    if let Ok(resp) = &answer {
        assert!(
            !(200..300).contains(&resp.status),
            "no 2xx for a claim that was never committed: {} {}",
            resp.status,
            resp.text()
        );
    }
    let status = server.wait_exit(Duration::from_secs(20));
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9),
        "the failpoint killed the process: {status:?}"
    );
    assert_eq!(server.count("SELECT count(*) FROM events", &[]), 0);
    assert_eq!(server.count("SELECT count(*) FROM effects", &[]), 0);

    server.remove_env("IDEMHOOK_FAILPOINTS");
    server.restart();
    let r = Client::new(Duration::from_secs(30)).post(
        &server.url("/hooks/stripe"),
        &sign::stripe_now(SECRET, &body),
        &body,
    );
    assert_eq!(
        (r.status, r.json_status().as_deref()),
        (200, Some("accepted")),
        "{}",
        r.text()
    );
    assert_eq!(server.count("SELECT count(*) FROM events", &[]), 1);
    assert_eq!(
        server.count(
            "SELECT count(*) FROM effects WHERE event_id = 'evt_0007'",
            &[]
        ),
        1
    );
}

/// Two instances receive the same burst, every event sent to both at
/// once, and one of them is killed with kill -9 in the middle of a group
/// of claims (its groups wait 300 ms before COMMIT, holding the row locks
/// the other instance's claims of the same keys wait on): every 2xx
/// either gave is stored, the survivor answers every delivery 200 (its
/// waiting claims go on once the dead one's transaction is gone), at most
/// one answer per event says accepted, and each event is stored once
/// with exactly one row of its SQL action.
#[test]
fn two_instances_take_the_same_burst_while_one_is_killed_mid_group() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let Some(cluster) = pg_cluster::cluster() else {
        pg_cluster::skipped("two_instances_take_the_same_burst_while_one_is_killed_mid_group");
        return;
    };
    let url = cluster.create_database("it_burst_kill");
    let config = unkeyed_config(&url);
    let mut a = Server::start(
        &config,
        &[("IDEMHOOK_FAILPOINTS", "pg.group.before_commit=sleep(300)")],
    );
    let b = Server::start(&config, &[]);
    const N: usize = 160;
    const PER_INSTANCE: usize = 4;
    let acked_by_a = Arc::new(AtomicUsize::new(0));
    let urls = [a.url("/hooks/stripe"), b.url("/hooks/stripe")];
    type Answer = (usize, usize, Result<(u16, Option<String>), String>);
    let senders: Vec<std::thread::JoinHandle<Vec<Answer>>> = (0..2 * PER_INSTANCE)
        .map(|t| {
            let instance = t / PER_INSTANCE;
            let url = urls[instance].clone();
            let acked_by_a = acked_by_a.clone();
            std::thread::spawn(move || {
                let mut work: Vec<usize> = (0..N)
                    .filter(|i| i % PER_INSTANCE == t % PER_INSTANCE)
                    .collect();
                fastrand::Rng::with_seed(t as u64).shuffle(&mut work);
                let client = Client::new(Duration::from_secs(60));
                let mut out = Vec::new();
                for i in work {
                    let body = event(i);
                    let answer = client
                        .try_post(&url, &sign::stripe_now(SECRET, &body), &body)
                        .map(|r| (r.status, r.json_status()));
                    if instance == 0 && matches!(&answer, Ok((s, _)) if (200..300).contains(s)) {
                        acked_by_a.fetch_add(1, Ordering::SeqCst);
                    }
                    out.push((i, instance, answer));
                }
                out
            })
        })
        .collect();

    // Kill A once it has acked some events and has a group waiting to
    // commit (its session idle in transaction, locks held).
    let mut db = postgres::Client::connect(&url, postgres::NoTls).expect("connect");
    crate::harness::wait_until(
        Duration::from_secs(90),
        "A acked 10 events and holds an open group",
        || {
            acked_by_a.load(Ordering::SeqCst) >= 10
                && count(
                    &mut db,
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                     AND state = 'idle in transaction'",
                    &[],
                ) >= 1
        },
    );
    assert!(
        a.stderr().contains("failpoint pg.group.before_commit"),
        "A's groups went through the failpoint\n{}",
        a.logs()
    );
    a.kill9();
    let answers: Vec<Answer> = senders
        .into_iter()
        .flat_map(|t| t.join().expect("a sender finished"))
        .collect();
    assert_eq!(answers.len(), 2 * N);

    let stored: std::collections::HashSet<String> = db
        .query("SELECT event_id FROM events", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut accepted = vec![0; N];
    for (i, instance, answer) in &answers {
        let id = format!("evt_{i:04}");
        match answer {
            Ok((status, json)) if (200..300).contains(status) => {
                assert!(
                    stored.contains(&id),
                    "{id} was answered {status} by instance {instance} and is stored"
                );
                if json.as_deref() == Some("accepted") {
                    accepted[*i] += 1;
                }
            }
            Ok((status, _)) if *instance == 1 => {
                panic!("{id}: the surviving instance answered {status}, not 200")
            }
            Err(e) if *instance == 1 => panic!("{id}: the surviving instance failed: {e}"),
            _ => {} // A's answers cut short by the kill
        }
    }
    assert!(
        accepted.iter().all(|&n| n <= 1),
        "at most one accepted answer per event: {accepted:?}"
    );
    assert_eq!(stored.len(), N, "every event stored (all were sent to B)");
    assert_eq!(
        count(&mut db, "SELECT count(*) FROM effects", &[]),
        N as i64,
        "one effect per event"
    );
    assert_eq!(
        count(&mut db, "SELECT count(DISTINCT event_id) FROM effects", &[]),
        N as i64
    );
    assert_eq!(
        count(
            &mut db,
            "SELECT count(*) FROM deliveries WHERE outcome = 'accepted'",
            &[]
        ),
        N as i64,
        "one claim per event"
    );

    // The provider retries everything once more: all duplicates.
    let client = Client::new(Duration::from_secs(30));
    for i in 0..N {
        let body = event(i);
        let r = client.post(
            &b.url("/hooks/stripe"),
            &sign::stripe_now(SECRET, &body),
            &body,
        );
        assert_eq!(
            (r.status, r.json_status().as_deref()),
            (200, Some("duplicate")),
            "event {i} again"
        );
    }
    assert_eq!(
        count(&mut db, "SELECT count(*) FROM effects", &[]),
        N as i64
    );
}

/// Another session holds a lock on the events table (a long maintenance
/// statement, a migration by hand) past busy_timeout: the delivery is
/// answered 503 with Retry-After within busy_timeout plus slack, never a
/// 2xx; once the lock is gone the same delivery is answered 200 and the
/// event and its effect are stored once.
#[test]
fn a_locked_events_table_answers_503_within_busy_timeout_then_recovers() {
    let Some(cluster) = pg_cluster::cluster() else {
        pg_cluster::skipped("a_locked_events_table_answers_503_within_busy_timeout_then_recovers");
        return;
    };
    let url = cluster.create_database("it_locked_table");
    let server = Server::start(
        &unkeyed_config(&url).set("busy_timeout", &toml_str("2s")),
        &[],
    );
    let client = Client::new(Duration::from_secs(30));
    let post = |i: usize| {
        let body = event(i);
        let started = Instant::now();
        let r = client.post(
            &server.url("/hooks/stripe"),
            &sign::stripe_now(SECRET, &body),
            &body,
        );
        (r, started.elapsed())
    };
    assert_eq!(post(1).0.status, 200, "stored before the lock");

    let mut locker = postgres::Client::connect(&url, postgres::NoTls).expect("connect");
    locker
        .batch_execute("BEGIN; LOCK TABLE events IN ACCESS EXCLUSIVE MODE")
        .expect("lock events");
    let (r, took) = post(2);
    assert_eq!(r.status, 503, "a claim that cannot commit: {}", r.text());
    assert!(r.header("retry-after").is_some(), "503 carries Retry-After");
    assert!(
        took < Duration::from_secs(8),
        "answered within busy_timeout (2 s) plus slack: {took:?}"
    );
    locker.batch_execute("ROLLBACK").expect("release the lock");

    let answered = crate::harness::wait_for(
        Duration::from_secs(30),
        "the retry after the lock is answered 200",
        || {
            let (r, _) = post(2);
            match r.status {
                200 => Ok(r.json_status()),
                503 => Err("503 again".to_string()),
                other => panic!("only 200 or 503, got {other}: {}", r.text()),
            }
        },
    );
    assert!(
        matches!(answered.as_deref(), Some("accepted" | "duplicate")),
        "{answered:?}"
    );
    assert_eq!(server.count("SELECT count(*) FROM events", &[]), 2);
    assert_eq!(
        server.count("SELECT count(*) FROM effects", &[]),
        2,
        "one effect each"
    );
    assert_eq!(post(3).0.status, 200, "service goes on");
}

/// Two instances whose SQL action updates shared rows of the team's table
/// (a balance per customer, in whatever order the events come): their
/// groups lock those rows in different orders and deadlock, and a
/// deadlock is run again as a whole group. Every delivery is answered
/// 200, every event is stored once, and every balance is the exact sum
/// of its events: nothing doubled by a retried group, nothing lost.
#[test]
fn two_instances_updating_shared_rows_survive_deadlocks_without_doubling() {
    let Some(cluster) = pg_cluster::cluster() else {
        pg_cluster::skipped(
            "two_instances_updating_shared_rows_survive_deadlocks_without_doubling",
        );
        return;
    };
    let url = cluster.create_database("it_deadlocks");
    // Deadlocks found in 100 ms rather than 1 s, so the test is quick.
    postgres::Client::connect(&url, postgres::NoTls)
        .and_then(|mut c| {
            c.batch_execute(
                "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET deadlock_timeout = ''100ms''', \
                 current_database()); END $$",
            )
        })
        .expect("set deadlock_timeout");
    const CUSTOMERS: usize = 4;
    const N: usize = 120;
    let seed: String = (0..CUSTOMERS)
        .map(|c| format!("INSERT INTO balances VALUES ('c{c}', 0) ON CONFLICT DO NOTHING;"))
        .collect();
    let config = ServerConfig::new()
        .set("database", &toml_str(&url))
        .set("busy_timeout", &toml_str("60s"))
        .set(
            "setup_sql",
            &toml_str(&format!(
                "CREATE TABLE IF NOT EXISTS balances (customer text PRIMARY KEY, total bigint NOT NULL);{seed}"
            )),
        )
        .tables(&format!(
            "[sources.stripe]\nkind = \"stripe\"\nsecrets = [\"{SECRET}\"]\n\
             [[sources.stripe.actions]]\nname = \"first\"\n\
             sql = \"UPDATE balances SET total = total + :amount WHERE customer = :first\"\n\
             params = {{ amount = \"json:/data/object/amount\", first = \"json:/data/object/first\" }}\n\
             [[sources.stripe.actions]]\nname = \"second\"\n\
             sql = \"UPDATE balances SET total = total + :amount WHERE customer = :second\"\n\
             params = {{ amount = \"json:/data/object/amount\", second = \"json:/data/object/second\" }}\n"
        ));
    // Each event touches two customers, in an order of its own.
    let body = |i: usize| {
        let (a, b) = (i % CUSTOMERS, (i / CUSTOMERS + i + 1) % CUSTOMERS);
        let b = if a == b { (b + 1) % CUSTOMERS } else { b };
        serde_json::json!({
            "id": format!("evt_{i:04}"), "object": "event", "type": "charge.succeeded",
            "data": {"object": {"amount": i + 1, "first": format!("c{a}"), "second": format!("c{b}")}}
        })
        .to_string()
        .into_bytes()
    };
    let mut expected = vec![0i64; CUSTOMERS];
    for i in 0..N {
        let v: serde_json::Value = serde_json::from_slice(&body(i)).unwrap();
        for k in ["first", "second"] {
            let c: usize = v["data"]["object"][k].as_str().unwrap()[1..]
                .parse()
                .unwrap();
            expected[c] += i as i64 + 1;
        }
    }
    let servers: Vec<Arc<Server>> = (0..2)
        .map(|_| Arc::new(Server::start(&config, &[])))
        .collect();
    let senders: Vec<_> = (0..6)
        .map(|t| {
            let server = servers[t % 2].clone();
            std::thread::spawn(move || {
                let mut work: Vec<usize> = (0..N).filter(|i| i % 3 == t / 2).collect();
                fastrand::Rng::with_seed(t as u64).shuffle(&mut work);
                let client = Client::new(Duration::from_secs(90));
                work.into_iter()
                    .map(|i| {
                        let b = body(i);
                        let r = client.post(
                            &server.url("/hooks/stripe"),
                            &sign::stripe_now(SECRET, &b),
                            &b,
                        );
                        (i, r.status, r.text())
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    for t in senders {
        for (i, status, text) in t.join().expect("a sender finished") {
            assert_eq!(status, 200, "event {i}: {text}");
        }
    }
    let mut db = postgres::Client::connect(&url, postgres::NoTls).expect("connect");
    assert_eq!(count(&mut db, "SELECT count(*) FROM events", &[]), N as i64);
    assert_eq!(
        count(
            &mut db,
            "SELECT count(*) FROM jobs WHERE status = 'done'",
            &[]
        ),
        2 * N as i64,
        "every action ran and committed"
    );
    let totals: Vec<i64> = db
        .query("SELECT total FROM balances ORDER BY customer", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        totals, expected,
        "each balance is the exact sum of its events"
    );
    let deadlocks = count(
        &mut db,
        "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()",
        &[],
    );
    eprintln!("deadlocks detected (and their groups run again): {deadlocks}");
}

/// SIGTERM while PostgreSQL hangs (every server process stopped) with a
/// delivery waiting on it: the delivery is answered 503 within
/// busy_timeout, and serve still exits within its grace instead of
/// waiting for the database forever; once PostgreSQL is back a new serve
/// stores the retry.
#[test]
fn sigterm_while_postgres_hangs_exits_within_the_grace() {
    let Some(local) = pg_cluster::private() else {
        pg_cluster::skipped("sigterm_while_postgres_hangs_exits_within_the_grace");
        return;
    };
    let url = local.cluster().create_database("it_sigterm_hung");
    let mut server = Server::start(&config(&url).set("busy_timeout", &toml_str("2s")), &[]);
    let client = Client::new(Duration::from_secs(30));
    let post = |server: &Server, i: usize| {
        let body = event(i);
        client.try_post(
            &server.url("/hooks/stripe"),
            &sign::stripe_now(SECRET, &body),
            &body,
        )
    };
    assert_eq!(post(&server, 1).map(|r| r.status), Ok(200));
    local.freeze();
    let r = post(&server, 2).expect("an answer while PostgreSQL hangs");
    assert_eq!(r.status, 503, "{}", r.text());
    let started = Instant::now();
    server.terminate();
    // Before: the stop joined a claimer stuck in the handshake of a new
    // connection to the hung server, until PostgreSQL came back.
    let status = server.wait_exit(Duration::from_secs(60));
    let took = started.elapsed();
    local.thaw();
    assert!(
        status.success()
            && server
                .stderr()
                .contains("stopped without waiting for PostgreSQL"),
        "serve exited 0 on its own after SIGTERM, saying it did not wait: {status:?}\n{}",
        server.logs()
    );
    eprintln!("serve exited {took:?} after SIGTERM with PostgreSQL hung");
    local.wait_ready().expect("PostgreSQL is back");
    server.restart();
    assert_eq!(post(&server, 2).map(|r| r.status), Ok(200), "the retry");
    assert_eq!(server.count("SELECT count(*) FROM events", &[]), 2);
    assert_eq!(server.count("SELECT count(*) FROM ledger", &[]), 2);
}

/// A panic inside a group of claims (a bug; the failpoint stands in for
/// it, in every group): each delivery is answered 503 at once, nothing is
/// stored, and the claimers live on to take the next delivery. Before,
/// each panic ended a claimer, and once both were gone every delivery
/// waited out busy_timeout for a 503, for as long as the process ran.
#[test]
fn a_panic_in_a_group_of_claims_answers_503_and_the_claimers_go_on() {
    let Some(cluster) = pg_cluster::cluster() else {
        pg_cluster::skipped("a_panic_in_a_group_of_claims_answers_503_and_the_claimers_go_on");
        return;
    };
    let url = cluster.create_database("it_claimer_panic");
    // A busy_timeout far past the client's patience: a 503 from the
    // reaper would come too late to count.
    let config = unkeyed_config(&url).set("busy_timeout", &toml_str("120s"));
    let mut server = Server::start(
        &config,
        &[("IDEMHOOK_FAILPOINTS", "pg.group.before_commit=panic")],
    );
    let client = Client::new(Duration::from_secs(30));
    for i in 0..5 {
        let body = event(i);
        let r = client
            .try_post(
                &server.url("/hooks/stripe"),
                &sign::stripe_now(SECRET, &body),
                &body,
            )
            .unwrap_or_else(|e| panic!("delivery {i} answered: {e}\n{}", server.logs()));
        assert_eq!(r.status, 503, "delivery {i}: {}", r.text());
        assert!(r.header("retry-after").is_some());
    }
    // Each delivery's claim, and the record of its 503, are groups of
    // their own: at least one panic per delivery, none of them fatal. The
    // server's stderr is collected by a reader thread, so the last line may
    // arrive after the last answer: wait for it.
    let panics = || {
        server
            .stderr()
            .matches("failpoint pg.group.before_commit: Panic")
            .count()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while panics() < 5 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        panics() >= 5,
        "every delivery reached a live claimer ({} panics)\n{}",
        panics(),
        server.logs()
    );
    assert_eq!(server.count("SELECT count(*) FROM events", &[]), 0);
    assert_eq!(server.count("SELECT count(*) FROM effects", &[]), 0);
    server.remove_env("IDEMHOOK_FAILPOINTS");
    server.restart();
    let body = event(0);
    let r = client.post(
        &server.url("/hooks/stripe"),
        &sign::stripe_now(SECRET, &body),
        &body,
    );
    assert_eq!(
        (r.status, r.json_status().as_deref()),
        (200, Some("accepted"))
    );
    assert_eq!(server.count("SELECT count(*) FROM effects", &[]), 1);
}
