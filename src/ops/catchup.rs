//! `idemhook catchup SOURCE [--since DURATION] [--yes]`: one catch-up run
//! (`crate::catchup::run`) from the command line, under the source's
//! lease like serve's. Without `--yes` it lists what it would claim or
//! ask to be redelivered and changes nothing. It prints its own counts
//! (serve's metric counts serve's runs only).

use std::collections::HashSet;
use std::io::Write as _;
use std::sync::Arc;
use std::time::Duration;

use super::command::{CommandError, Outcome};
use super::error::OpError;
use super::open::{OnDb, on_db_read, on_db_write};
use super::text::{clean, stdout};
use crate::catchup::{
    ProviderApi, Report, RunDb, RunError, RunNotice, claim_of, claim_write, conclude, owner_name,
    run,
};
use crate::config::{Config, Source, parse_duration};
use crate::receive::ingest::Decision;
use crate::store::catchup::{self, RunRecord};
use crate::store::open::CommandDb;

/// The command's connection, either backend, as a run's storage.
struct CommandRunDb<D: CommandDb>(D);

impl<D: CommandDb> RunDb for CommandRunDb<D> {
    fn stored(&mut self, source: &str, ids: &[String]) -> Result<HashSet<String>, RunError> {
        self.0
            .read(|db| catchup::stored_ids(db, source, ids).map_err(RunError::from))
    }

    fn claim(
        &mut self,
        config: &Arc<Config>,
        source: &str,
        body: Vec<u8>,
    ) -> Result<Decision, RunError> {
        let (s, claim) = claim_of(config, source, body)?;
        self.0.write(|db| claim_write(db, s, &claim))
    }

    fn lease(&mut self, source: &str, owner: &str, honour: bool) -> Result<bool, RunError> {
        self.0.write(|db| {
            catchup::take_lease(db, source, owner, crate::catchup::LEASE_MS, honour)
                .map_err(RunError::from)
        })
    }

    fn finish(
        &mut self,
        owner: &str,
        record: RunRecord,
        told: RunNotice<'_>,
    ) -> Result<(), RunError> {
        self.0
            .write(|db| crate::catchup::finish_in(db, owner, &record, told))
    }
}

/// `idemhook catchup`.
pub fn cmd(
    config: Arc<Config>,
    source_name: &str,
    since: Option<&str>,
    yes: bool,
    as_json: bool,
) -> Result<Outcome, CommandError> {
    let source = config.source(source_name).ok_or_else(|| {
        CommandError::NotFound(format!(
            "source {} is not in the config",
            clean(source_name)
        ))
    })?;
    let Some(c) = &source.catchup else {
        return Err(CommandError::Invalid(format!(
            "source {} has no [sources.{}.catchup] table",
            clean(source_name),
            clean(source_name)
        )));
    };
    let window = match since {
        Some(s) => parse_duration(s).map_err(|e| CommandError::Usage(format!("--since: {e}")))?,
        None => c.window,
    };
    if let Some((max, why)) = c.provider.max_window()
        && window > max
    {
        return Err(CommandError::Usage(format!(
            "--since: over the limit: {why}"
        )));
    }
    let api = crate::catchup::api_for(c);
    let work = CatchingUp {
        config: &config,
        source,
        window,
        yes,
        api: api.as_ref(),
    };
    let report = if yes {
        on_db_write(&config, work)?
    } else {
        on_db_read(&config, work)?
    }?;
    print(&report, as_json)?;
    Ok(if report.error.is_some() || !report.failed.is_empty() {
        Outcome::Attention
    } else {
        Outcome::Done
    })
}

/// One run of `idemhook catchup` on the command's connection, either
/// backend: under the source's lease with `yes`, a dry run without.
struct CatchingUp<'a> {
    config: &'a Arc<Config>,
    source: &'a Source,
    window: Duration,
    yes: bool,
    api: &'a dyn ProviderApi,
}

impl OnDb for CatchingUp<'_> {
    type Out = Result<Report, CommandError>;
    fn run<D: CommandDb>(self, db: D) -> Self::Out {
        let (config, source, window, api) = (self.config, self.source, self.window, self.api);
        let mut db = CommandRunDb(db);
        let report = if self.yes {
            let owner = owner_name();
            if !db
                .lease(&source.name, &owner, false)
                .map_err(OpError::from)?
            {
                return Err(CommandError::Invalid(format!(
                    "another catch-up of {} is running (serve's, or another command's); try again when it ends",
                    clean(&source.name)
                )));
            }
            let result = run(&mut db, config, source, window, false, api);
            conclude(&mut db, config, &owner, &source.name, &result).map_err(OpError::from)?;
            result.map_err(OpError::from)?
        } else {
            run(&mut db, config, source, window, true, api).map_err(OpError::from)?
        };
        Ok(report)
    }
}

fn print(r: &Report, as_json: bool) -> Result<(), CommandError> {
    let mut out = stdout();
    if as_json {
        writeln!(out, "{}", r.to_json())?;
        return Ok(());
    }
    let (claim, ask) = if r.dry_run {
        ("would claim", "would ask GitHub to redeliver")
    } else {
        ("claimed", "asked to redeliver")
    };
    for id in &r.claimed {
        writeln!(out, "{claim} {}", clean(id))?;
    }
    for id in &r.redelivery_requested {
        writeln!(out, "{ask} {}", clean(id))?;
    }
    for (id, why) in &r.failed {
        writeln!(out, "could not take {}: {}", clean(id), clean(why))?;
    }
    if let Some(e) = &r.error {
        writeln!(out, "error: {}", clean(&e.to_string()))?;
    }
    writeln!(
        out,
        "{}{}: {} claimed, {} redelivery requested, {} already stored{}",
        if r.dry_run { "dry run of " } else { "" },
        clean(&r.source),
        r.claimed.len(),
        r.redelivery_requested.len(),
        r.already_stored,
        if r.dry_run {
            "; nothing changed (run again with --yes)"
        } else {
            ""
        }
    )?;
    Ok(())
}
