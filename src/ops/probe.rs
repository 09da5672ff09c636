//! `idemhook probe SOURCE/ACTION` and the admin API's
//! `POST /api/actions/{source}/{action}/probe`: an open circuit's next
//! probe is due now (the operator knows the downstream is back). The forward
//! workers run it at their next look; nothing is sent from here.

use std::io::Write as _;

use serde_json::{Value, json};

use super::command::{CommandError, Outcome};
use super::error::OpError;
use super::open;
use super::pause::parse_target;
use super::text::{clean, stdout};
use crate::config::{ActionKind, Config};
use crate::store::circuits;
use crate::store::db::Db;
use crate::time::now_ms;

/// Makes the action's next probe due at `now`, in the caller's write
/// transaction. `probe_due` is false when its circuit is not open.
pub fn probe(
    db: &Db<'_>,
    config: &Config,
    source: &str,
    action: &str,
    now: i64,
) -> Result<Value, OpError> {
    let kind = config
        .source(source)
        .and_then(|s| s.action(action))
        .map(|a| &a.kind);
    match kind {
        None => {
            return Err(OpError::NotFound(format!(
                "{}/{} is not a forward action in the config",
                clean(source),
                clean(action)
            )));
        }
        Some(ActionKind::Sql { .. }) => {
            return Err(OpError::Invalid(format!(
                "{}/{} is an sql action: it has no circuit",
                clean(source),
                clean(action)
            )));
        }
        Some(ActionKind::Forward(_)) => {}
    }
    let due = circuits::probe_now(db, source, action, now)?;
    Ok(json!({
        "source": source,
        "action": action,
        "open": due,
        "probe_due": due,
    }))
}

/// `idemhook probe`.
pub fn cmd(config: &Config, target: &str) -> Result<Outcome, CommandError> {
    let (source, action) = parse_target(target)?;
    let changed = open::write(config, |db| probe(db, config, &source, &action, now_ms()))??;
    let name = format!("{}/{}", clean(&source), clean(&action));
    let mut out = stdout();
    if changed["probe_due"].as_bool() == Some(true) {
        writeln!(
            out,
            "{name}: the circuit's next probe is due now; a forward worker runs it when it next looks (within a second)"
        )?;
    } else {
        writeln!(out, "{name}: the circuit is not open; nothing to probe")?;
    }
    Ok(Outcome::Done)
}
