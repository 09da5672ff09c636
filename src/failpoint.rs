//! Failpoints for crash tests: named places where a test can make the
//! process die (SIGKILL, like `kill -9`), panic or stall. Inert unless the
//! environment variable `IDEMHOOK_FAILPOINTS` names them, e.g.
//! `IDEMHOOK_FAILPOINTS="claim.after_commit=kill;forward.before_call=sleep(500)"`.
//!
//! The places:
//! - `claim.after_commit`: the claim committed, the response not yet written;
//! - `forward.before_call`: a worker holds a job's lease, before the request;
//! - `forward.after_response`: the downstream answered, the completion is
//!   not yet recorded;
//! - `pg.group.before_commit`: on PostgreSQL, a group of claims has run
//!   every statement and holds its row locks, `COMMIT` not yet sent.
//!
//! And one setting: `outbox.idle=sleep(MS)` makes a forward worker with
//! nothing due sleep up to MS between looks instead of 500 ms, so a test
//! can tell a wake-up (NOTIFY, a commit) from a poll.

use std::io::Write as _;
use std::sync::OnceLock;
use std::time::Duration;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Action {
    Kill,
    Panic,
    Sleep(Duration),
}

fn configured() -> &'static [(String, Action)] {
    static POINTS: OnceLock<Vec<(String, Action)>> = OnceLock::new();
    POINTS.get_or_init(|| {
        std::env::var("IDEMHOOK_FAILPOINTS")
            .map(|spec| parse(&spec))
            .unwrap_or_default()
    })
}

fn parse(spec: &str) -> Vec<(String, Action)> {
    spec.split(';')
        .filter_map(|item| {
            let (name, action) = item.trim().split_once('=')?;
            let action = match action.trim() {
                "kill" => Action::Kill,
                "panic" => Action::Panic,
                other => {
                    let ms = other
                        .strip_prefix("sleep(")?
                        .strip_suffix(')')?
                        .parse()
                        .ok()?;
                    Action::Sleep(Duration::from_millis(ms))
                }
            };
            Some((name.trim().to_string(), action))
        })
        .collect()
}

/// At start, a loud warning when `IDEMHOOK_FAILPOINTS` is set: such a
/// process may kill itself, panic or stall on purpose, which only a test
/// wants.
pub fn warn_if_armed() {
    if let Some(spec) = std::env::var_os("IDEMHOOK_FAILPOINTS").filter(|s| !s.is_empty()) {
        crate::log::warn(
            "FAILPOINTS ARMED",
            &[
                ("IDEMHOOK_FAILPOINTS", &spec.to_string_lossy()),
                (
                    "note",
                    &"this process may kill itself, panic or stall on purpose (crash tests only): unset IDEMHOOK_FAILPOINTS outside tests",
                ),
            ],
        );
    }
}

/// Runs the action configured for `name`, if any.
pub fn hit(name: &str) {
    let points = configured();
    if points.is_empty() {
        return;
    }
    for (point, action) in points {
        if point != name {
            continue;
        }
        // Not eprintln!, which panics on a closed stderr.
        let _ = writeln!(std::io::stderr(), "failpoint {name}: {action:?}");
        match action {
            Action::Kill => {
                let _ = signal_hook::low_level::raise(signal_hook::consts::SIGKILL);
                // SIGKILL cannot be caught; should raise fail, abort hard.
                std::process::abort();
            }
            Action::Panic => panic!("failpoint {name}"),
            Action::Sleep(d) => std::thread::sleep(*d),
        }
    }
}

/// The duration a `sleep(MS)` names for `name`, if configured: a setting,
/// not a place (nothing runs).
pub fn duration(name: &str) -> Option<Duration> {
    configured()
        .iter()
        .find_map(|(point, action)| match action {
            Action::Sleep(d) if point == name => Some(*d),
            _ => None,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_spec() {
        let p = parse("a=kill; b=sleep(250);c=panic;d=bogus;e");
        assert_eq!(
            p,
            vec![
                ("a".to_string(), Action::Kill),
                ("b".to_string(), Action::Sleep(Duration::from_millis(250))),
                ("c".to_string(), Action::Panic),
            ]
        );
    }
}
