//! The wall clock jumping under a running serve (Debian's libfaketime,
//! preloaded into the real binary, its offset read from a file the test
//! rewrites; the monotonic clock left alone, as a real jump leaves it):
//! a forward jump of 30 days never lets the pruner delete a key before its
//! retention has passed, nor a second worker take over a job whose lease
//! is still held.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::downstream::Downstream;
use crate::harness::{Server, toml_str, wait_until};
use crate::helpers::{StripeHook, event_state, job_status, stripe_config};

const SECRET: &str = "whsec_it_clock_0123456789";
const STRIPE: StripeHook = StripeHook::new("stripe", SECRET);

/// libfaketime's multi-threaded library, where Debian's package puts it;
/// None (with a loud SKIPPED, or a failure under CI=true) when missing.
pub(crate) fn libfaketime(test: &str) -> Option<PathBuf> {
    let lib = Path::new("/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1");
    if lib.exists() {
        return Some(lib.to_path_buf());
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{test}: libfaketime is missing under CI=true (.ci/run installs Debian's faketime)"
    );
    eprintln!("*** SKIPPED (no libfaketime; apt-get install faketime): {test} ***");
    None
}

fn body(id: &str) -> Vec<u8> {
    serde_json::json!({"id": id, "type": "charge.succeeded", "data": {"object": {}}})
        .to_string()
        .into_bytes()
}

/// The environment that preloads libfaketime with its offset read from
/// `offset` at every clock read (the monotonic clock left alone).
fn faked(lib: &Path, offset: &Path) -> Vec<(&'static str, String)> {
    let mut env = vec![("STRIPE_SECRET", SECRET.to_string())];
    env.extend(faked_clock(lib, offset));
    env
}

/// What preloads libfaketime, its offset read from `offset` at every
/// clock read, the monotonic clock left alone.
pub(crate) fn faked_clock(lib: &Path, offset: &Path) -> Vec<(&'static str, String)> {
    vec![
        ("LD_PRELOAD", lib.display().to_string()),
        ("FAKETIME_TIMESTAMP_FILE", offset.display().to_string()),
        ("FAKETIME_NO_CACHE", "1".to_string()),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1".to_string()),
    ]
}

#[test]
fn a_wall_clock_jumping_30_days_forward_prunes_no_key_before_its_retention() {
    let test = "a_wall_clock_jumping_30_days_forward_prunes_no_key_before_its_retention";
    let Some(lib) = libfaketime(test) else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let offset = dir.path().join("faketime");
    std::fs::write(&offset, "+0\n").expect("write the clock offset");
    let lib = lib.display().to_string();
    let offset_path = offset.display().to_string();
    let server = Server::start(
        &stripe_config("retention = \"1h\"\npayload_retention = \"1h\"")
            .set("prune_interval", &toml_str("200ms")),
        &[
            ("STRIPE_SECRET", SECRET),
            ("LD_PRELOAD", &lib),
            ("FAKETIME_TIMESTAMP_FILE", &offset_path),
            ("FAKETIME_NO_CACHE", "1"),
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
        ],
    );
    STRIPE.deliver_ok(&server, &body("evt_young"));
    STRIPE.deliver_ok(&server, &body("evt_marker"));

    // The wall clock jumps 30 days ahead of the monotonic one.
    std::fs::write(&offset, "+30d\n").expect("jump the clock");
    // A marker truly past its retention (two hours old by the clock serve
    // started with): once it is pruned, the pruner has run with the
    // jumped clock in view.
    server.exec(
        "UPDATE events SET received_at = received_at - 7200000 WHERE event_id = 'evt_marker'",
        &[],
    );
    wait_until(
        Duration::from_secs(15),
        "the pruner deletes the marker past its retention",
        || event_state(&server, "stripe", "evt_marker").is_none(),
    );
    assert_eq!(
        event_state(&server, "stripe", "evt_young").as_deref(),
        Some("completed"),
        "a key received seconds ago outlives a 30-day jump of the wall clock\n{}",
        server.logs()
    );
}

/// A job in flight (its request held at the downstream) when the wall
/// clock jumps 30 days forward: its lease looks run out, yet no other
/// worker takes it over and sends it again; a job delivered after the
/// jump (signed at the jumped time) proves the workers took after it.
#[test]
fn a_wall_clock_jumping_30_days_forward_lets_no_worker_take_over_a_held_lease() {
    let test = "a_wall_clock_jumping_30_days_forward_lets_no_worker_take_over_a_held_lease";
    let Some(lib) = libfaketime(test) else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let offset = dir.path().join("faketime");
    std::fs::write(&offset, "+0\n").expect("write the clock offset");
    let ds = Downstream::start();
    ds.close_gate();
    let action = format!(
        "[[sources.stripe.actions]]\nname = \"app\"\nforward = {}\ntimeout = \"10s\"\nlease = \"20s\"\n\
         retry_initial = \"100ms\"\nretry_max = \"1s\"\ncircuit_failures = 0\n",
        toml_str(&format!("{}/in", ds.url()))
    );
    let env = faked(&lib, &offset);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let server = Server::start(&stripe_config(&action), &env);
    STRIPE.deliver_ok(&server, &body("evt_in_flight"));
    wait_until(
        Duration::from_secs(15),
        "the first job held at the downstream",
        || ds.held() == 1,
    );

    std::fs::write(&offset, "+30d\n").expect("jump the clock");
    let jumped = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
        + 30 * 86_400;
    let later = body("evt_after_jump");
    let r = server.post(
        "/hooks/stripe",
        &crate::sign::stripe(SECRET, &later, jumped),
        &later,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    // The take that leased the later job had the first one's lapsed-looking
    // lease in view (lapsed leases are taken first).
    wait_until(
        Duration::from_secs(15),
        "the later job held at the downstream",
        || ds.held() >= 2,
    );
    ds.open_gate();
    wait_until(Duration::from_secs(15), "both jobs done", || {
        ["evt_in_flight", "evt_after_jump"]
            .iter()
            .all(|id| job_status(&server, "stripe", id, "app").as_deref() == Some("done"))
    });
    assert_eq!(
        ds.requests_for("stripe:evt_in_flight:app").len(),
        1,
        "the job in flight was sent once, not taken over after the jump\n{}",
        server.logs()
    );
}
