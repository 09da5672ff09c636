//! The wall clock jumping under a running serve (Debian's libfaketime,
//! preloaded into the real binary, its offset read from a file the test
//! rewrites; the monotonic clock left alone, as a real jump leaves it):
//! a forward jump of 30 days never lets the pruner delete a key before its
//! retention has passed.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::harness::{Server, toml_str, wait_until};
use crate::helpers::{StripeHook, event_state, stripe_config};

const SECRET: &str = "whsec_it_clock_0123456789";
const STRIPE: StripeHook = StripeHook::new("stripe", SECRET);

/// libfaketime's multi-threaded library, where Debian's package puts it;
/// None (with a loud SKIPPED, or a failure under CI=true) when missing.
fn libfaketime(test: &str) -> Option<PathBuf> {
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
