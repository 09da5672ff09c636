//! The command line: parses arguments with clap, loads the config, and
//! hands each verb to the module that owns it. Errors come back here and
//! are printed once, with their context chain.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Result, bail};
use clap::{CommandFactory, Parser, Subcommand};

use crate::config::Config;
use crate::log::{Format, Level};
use crate::ops::{self, CommandError, Outcome, replay::Target, resolve};
use crate::time::now_ms;

#[derive(Parser, Debug)]
#[command(
    name = "idemhook",
    version,
    about = "Receive webhooks, verify them, and turn at-least-once delivery into exactly-once effects, on one SQLite file or a PostgreSQL database."
)]
pub struct Cli {
    /// The config file [default: $IDEMHOOK_CONFIG, else ./idemhook.toml].
    /// A file named here or by IDEMHOOK_CONFIG must exist; without either
    /// and without ./idemhook.toml, the development default is used.
    #[arg(long, global = true, value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// Log format (logs go to stderr).
    #[arg(long, global = true, value_parser = ["text", "json"])]
    pub log_format: Option<String>,
    /// Log level [default: $IDEMHOOK_LOG, else info]; warn shows the
    /// incidents only (dead letters, mismatches, bad signatures, storage errors).
    #[arg(long, global = true, value_parser = Level::NAMES, ignore_case = true)]
    pub log_level: Option<String>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the receiver (HTTP server, writer, forward workers).
    Serve {
        /// Address to listen on, overriding the config's `listen`.
        #[arg(long, value_name = "ADDR")]
        listen: Option<String>,
        /// Database, overriding the config's `database`: a file path,
        /// sqlite:PATH, a postgres:// URL, or env:NAME.
        #[arg(long, value_name = "PATH|URL")]
        database: Option<String>,
    },
    /// Validate the config and print its sources, actions and key rules.
    Check,
    /// Sign a sample (or given) body as SOURCE's provider would and POST it.
    Send {
        /// The configured source to sign for (its kind and first secret).
        source: String,
        /// Where to post; default http://{listen}/hooks/{source}.
        #[arg(long)]
        url: Option<String>,
        /// The body to send, as it is: a file, or - for standard input. Its
        /// own id and type are kept unless --id or --type is given.
        #[arg(long, value_name = "BODY")]
        file: Option<String>,
        /// The event id, set wherever the kind carries it. The sample sent with a given id is the same body every time, so a second send is a redelivery
        #[arg(long)]
        id: Option<String>,
        /// The event type, set wherever the kind carries it.
        #[arg(long = "type", value_name = "TYPE")]
        event_type: Option<String>,
        /// For kinds that sign with a private key (discord, sendgrid): the
        /// key to sign with, a PKCS#8 PEM file.
        #[arg(long, value_name = "FILE")]
        private_key: Option<String>,
        /// Send the kind's verification handshake instead of an event.
        #[arg(long)]
        handshake: bool,
    },
    /// List and inspect stored events.
    Events {
        #[command(subcommand)]
        command: EventsCommand,
    },
    /// Re-open failed (or, with --force, done) jobs of an event, or in batch.
    Replay(ReplayArgs),
    /// Close a failed job by hand, after a compensation: recorded as a new
    /// attempt (ok, error kind operator) with the note; dry run without --yes.
    Resolve(ResolveArgs),
    /// Pause an action: its jobs wait, events keep being accepted.
    Pause {
        /// The forward action to pause, as SOURCE/ACTION.
        #[arg(value_name = "SOURCE/ACTION")]
        target: String,
    },
    /// Resume a paused action.
    Resume {
        /// The action to resume, as SOURCE/ACTION; its waiting jobs are due at once.
        #[arg(value_name = "SOURCE/ACTION")]
        target: String,
    },
    /// Make an open circuit's next probe due now (the downstream is back).
    Probe {
        /// The forward action whose circuit to probe, as SOURCE/ACTION.
        #[arg(value_name = "SOURCE/ACTION")]
        target: String,
    },
    /// Delete keys and bodies past their retention.
    Prune {
        /// Print what would be deleted; change nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Report stuck, overdue and failed jobs; exit 1 when any need attention.
    Reconcile {
        /// Print the report as JSON (clean, stuck, overdue, failed, waiting, paused, counts).
        #[arg(long)]
        json: bool,
        /// Also ask the downstream about stuck and failed jobs whose action has a check.
        #[arg(long)]
        check: bool,
        /// With --check: mark done the jobs the downstream has done.
        #[arg(long)]
        yes: bool,
    },
    /// Drop an event's stored body and headers, keep its key.
    Erase {
        /// The event's source.
        source: String,
        /// The event id.
        event_id: String,
        /// Do it; without this only print what would happen.
        #[arg(long)]
        yes: bool,
    },
    /// Write a consistent copy of the database to PATH.
    Backup {
        /// Where to write the copy: a new file (it must not exist yet).
        path: PathBuf,
    },
    /// Copy this SQLite installation into an empty PostgreSQL database.
    Migrate {
        /// The target: a postgres:// URL, or env:NAME to read it from the environment.
        #[arg(long)]
        to: String,
        /// Copy; without this only print what would be copied.
        #[arg(long)]
        yes: bool,
    },
    /// Show the refused deliveries kept for reingest (401s and 400s).
    Rejected {
        #[command(subcommand)]
        command: RejectedCommand,
    },
    /// Verify kept refused deliveries again with the current secrets and
    /// take in those that pass; dry run without --yes.
    Reingest(ReingestArgs),
    /// Ask the source's provider API what idemhook missed (Stripe: claim
    /// the events not stored; GitHub: ask for their redelivery); dry run
    /// without --yes.
    Catchup(CatchupArgs),
    /// Print the shell completion script for bash, zsh or fish.
    Completions {
        /// The shell to complete in.
        #[arg(value_name = "SHELL", value_parser = crate::ops::tooling::ShellName)]
        shell: String,
    },
    /// Print the man page idemhook(1), or write it and one page per command into a folder.
    Man {
        /// Write idemhook.1 and a page per command (idemhook-serve.1, ...) into
        /// this existing folder, and print their paths.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
    /// Notifications to the [[notify]] targets: send a test, list the recent ones.
    Notify {
        #[command(subcommand)]
        command: NotifyCommand,
    },
}

#[derive(Subcommand, Debug)]
pub enum NotifyCommand {
    /// Send a test message to the [[notify]] target NAME now (serve need not
    /// run; nothing is recorded); exit 0 only when it was accepted.
    Test {
        /// The target's name.
        name: String,
    },
    /// The recent notifications, newest first.
    List {
        /// Print them as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// `idemhook replay`'s arguments: one event (SOURCE EVENT_ID) or a batch
/// (--source/--status/--since); `ReplayArgs::target` checks them.
#[derive(clap::Args, Debug)]
pub struct ReplayArgs {
    /// The event's source (with EVENT_ID: replay one event).
    pub source: Option<String>,
    /// The event id.
    pub event_id: Option<String>,
    /// Batch: only jobs of this source.
    #[arg(long = "source", id = "batch_source")]
    pub batch_source: Option<String>,
    /// Batch: the job status to replay, failed (default) or paused.
    #[arg(long)]
    pub status: Option<String>,
    /// Only this action's job.
    #[arg(long)]
    pub action: Option<String>,
    /// Batch: only events received within this duration, e.g. 2h.
    #[arg(long)]
    pub since: Option<String>,
    /// Also re-run jobs that are done (one event only).
    #[arg(long)]
    pub force: bool,
    /// Do it; without this only print what would be done.
    #[arg(long)]
    pub yes: bool,
}

impl ReplayArgs {
    /// One event or a batch, checked: a mix of the two, or neither, is
    /// refused (exit 1, as a bad filter is).
    fn target(&self, now: i64) -> Result<Target, CommandError> {
        const ONE_OR_BATCH: &str =
            "replay one event with SOURCE EVENT_ID, or a batch with --source S --status failed";
        let batch_flags =
            self.batch_source.is_some() || self.status.is_some() || self.since.is_some();
        match (&self.source, &self.event_id) {
            (Some(source), Some(event_id)) => {
                if batch_flags {
                    return Err(CommandError::Invalid(
                        "give either SOURCE EVENT_ID (one event) or --source/--status/--since \
                         (a batch), not both"
                            .to_string(),
                    ));
                }
                Ok(Target::Event {
                    source: source.clone(),
                    event_id: event_id.clone(),
                    action: self.action.clone(),
                    force: self.force,
                })
            }
            (Some(_), None) => Err(CommandError::Invalid(ONE_OR_BATCH.to_string())),
            (None, _) if self.force => Err(CommandError::Invalid(
                "--force re-runs a done job of one event: give SOURCE EVENT_ID --action A"
                    .to_string(),
            )),
            (None, _) if !batch_flags => Err(CommandError::Invalid(ONE_OR_BATCH.to_string())),
            (None, _) => Target::batch(
                self.batch_source.clone(),
                self.status.clone(),
                self.action.clone(),
                self.since.as_deref(),
                now,
            )
            .map_err(CommandError::from),
        }
    }
}

/// `idemhook resolve`'s arguments; `ops::resolve` gets them as a
/// [`resolve::Request`].
#[derive(clap::Args, Debug)]
pub struct ResolveArgs {
    /// The event's source.
    pub source: String,
    /// The event id.
    pub event_id: String,
    /// The action whose failed job to close.
    #[arg(long)]
    pub action: String,
    /// What was done instead (the compensation), kept with the attempt.
    #[arg(long)]
    pub note: String,
    /// Do it; without this only print what would be done.
    #[arg(long)]
    pub yes: bool,
}

/// `idemhook catchup`'s arguments (`ops::catchup`).
#[derive(clap::Args, Debug)]
pub struct CatchupArgs {
    /// The source whose provider to ask (it needs a catchup table).
    pub source: String,
    /// Look this far back instead of the table's window, e.g. 96h.
    #[arg(long, value_name = "DURATION")]
    pub since: Option<String>,
    /// Do it; without this only print what would be claimed or asked for.
    #[arg(long)]
    pub yes: bool,
    /// Print the run as JSON.
    #[arg(long)]
    pub json: bool,
}

/// `idemhook reingest`'s arguments (`ops::reingest::Request`).
#[derive(clap::Args, Debug)]
pub struct ReingestArgs {
    /// The source whose kept refused deliveries to verify again.
    #[arg(long)]
    pub source: String,
    /// Only those received within this duration, e.g. 2h.
    #[arg(long, value_name = "DURATION")]
    pub since: Option<String>,
    /// Only this kept request (its id in `idemhook rejected list`).
    #[arg(long)]
    pub id: Option<i64>,
    /// Do it; without this only print, per request, whether it would pass.
    #[arg(long)]
    pub yes: bool,
}

#[derive(Subcommand, Debug)]
pub enum RejectedCommand {
    /// Oldest first: id, source, received, bytes, remote, reason.
    List {
        /// Only those of this source.
        #[arg(long)]
        source: Option<String>,
        /// Only those received within this duration, e.g. 2h.
        #[arg(long, value_name = "DURATION")]
        since: Option<String>,
        /// Print them as JSON.
        #[arg(long)]
        json: bool,
    },
    /// One kept request with its headers and body.
    Show {
        /// Its id (from `idemhook rejected list`).
        id: i64,
        /// Print it as JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand, Debug)]
pub enum EventsCommand {
    /// Newest first.
    List {
        /// Only events of this source.
        #[arg(long)]
        source: Option<String>,
        /// Only events in this state: accepted, processing, completed or failed.
        #[arg(long)]
        status: Option<String>,
        /// Only events of this type.
        #[arg(long = "type", value_name = "TYPE")]
        event_type: Option<String>,
        /// Only events received within this duration, e.g. 1h.
        #[arg(long, value_name = "DURATION")]
        since: Option<String>,
        /// The most events to print; 0 means all.
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// Print the events as JSON.
        #[arg(long)]
        json: bool,
    },
    /// One event: state, payload, jobs, attempts, deliveries, incidents.
    Show {
        /// The event's source.
        source: String,
        /// The event id.
        event_id: String,
        /// Print the event as JSON.
        #[arg(long)]
        json: bool,
    },
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let level = match log_level(cli.log_level.as_deref(), std::env::var("IDEMHOOK_LOG").ok()) {
        Ok(level) => level,
        Err(e) => return exit(Err(CommandError::Failed(e))),
    };
    let format = match cli.log_format.as_deref() {
        Some("json") => Format::Json,
        _ => Format::Text,
    };
    crate::log::init(level, format);
    exit(run(cli))
}

/// The one place a command's result becomes the process's exit code, and
/// its error a line on stderr: 1 for something named that does not exist
/// or a request that does not fit what is stored (and for an outcome that
/// needs attention), 2 for a command that could not run (usage, config,
/// database, storage).
fn exit(result: Result<Outcome, CommandError>) -> ExitCode {
    let (code, message) = verdict(result);
    if let Some(message) = message {
        report(&message);
    }
    ExitCode::from(code)
}

/// The exit code of a command's result, and the error line to print.
fn verdict(result: Result<Outcome, CommandError>) -> (u8, Option<String>) {
    match result {
        Ok(Outcome::Done) => (0, None),
        Ok(Outcome::Attention) => (1, None),
        // The reader of our output went away (`idemhook events list | head`):
        // stop, quietly and successfully, as ripgrep does.
        Err(e) if e.is_closed_pipe() => (0, None),
        Err(CommandError::NotFound(m) | CommandError::Invalid(m)) => (1, Some(m)),
        Err(CommandError::Usage(m)) => (2, Some(m)),
        Err(CommandError::Storage(e)) => (
            2,
            Some(format!(
                "{:#}",
                anyhow::Error::new(e).context("storage error")
            )),
        ),
        Err(CommandError::Failed(e)) => (2, Some(format!("{e:#}"))),
        Err(e @ CommandError::Output(_)) => (2, Some(e.to_string())),
    }
}

/// Prints an error's line (see [`to_stderr`]).
fn report(message: &str) {
    to_stderr(&format!("idemhook: {message}"));
}

/// Writes a line to stderr. Not with eprintln!, which panics when stderr
/// is a closed pipe: a line nobody can read is dropped, and the exit code
/// still says what happened.
fn to_stderr(line: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// The level from `--log-level`, else `IDEMHOOK_LOG` (empty counts as
/// unset), else info. An unknown value is an error that lists the valid ones.
fn log_level(flag: Option<&str>, env: Option<String>) -> Result<Level> {
    let (value, from) = match (flag, env.as_deref()) {
        (Some(v), _) => (v, "--log-level"),
        (None, Some(v)) if !v.is_empty() => (v, "IDEMHOOK_LOG"),
        _ => return Ok(Level::Info),
    };
    Level::parse(value).ok_or_else(|| {
        anyhow::anyhow!(
            "unknown log level {value:?} (from {from}): expected one of {}",
            Level::NAMES.join(", ")
        )
    })
}

/// Where the config comes from: `--config`, else `$IDEMHOOK_CONFIG`, else
/// `./idemhook.toml` when it exists, else the development default.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigSource {
    /// Named by `--config` or `IDEMHOOK_CONFIG` (the `&str` says which):
    /// it must exist.
    Named(PathBuf, &'static str),
    /// `./idemhook.toml`, which exists.
    Discovered(PathBuf),
    /// No file: the development default.
    DevDefault,
}

pub const DEFAULT_CONFIG: &str = "./idemhook.toml";

impl ConfigSource {
    pub fn find(flag: Option<&Path>, env: Option<std::ffi::OsString>) -> ConfigSource {
        if let Some(path) = flag {
            return ConfigSource::Named(path.to_path_buf(), "--config");
        }
        if let Some(path) = env.filter(|p| !p.is_empty()) {
            return ConfigSource::Named(PathBuf::from(path), "IDEMHOOK_CONFIG");
        }
        let default = PathBuf::from(DEFAULT_CONFIG);
        if default.exists() {
            ConfigSource::Discovered(default)
        } else {
            ConfigSource::DevDefault
        }
    }

    pub fn load(&self) -> Result<Config> {
        match self {
            ConfigSource::Named(path, by) => {
                if !path.exists() {
                    bail!(
                        "config file {} (named by {by}) does not exist",
                        path.display()
                    );
                }
                Ok(Config::load(path)?)
            }
            ConfigSource::Discovered(path) => Ok(Config::load(path)?),
            ConfigSource::DevDefault => Ok(Config::dev_default()),
        }
    }
}

/// The config for a command other than `serve`: the same discovery, and a
/// note on stderr when it is the development default, so that an operator
/// command run in the wrong folder does not quietly report on another
/// database.
pub fn load_config(flag: Option<&Path>) -> Result<Config> {
    let found = ConfigSource::find(flag, std::env::var_os("IDEMHOOK_CONFIG"));
    let config = found.load()?;
    if found == ConfigSource::DevDefault {
        let database = match &config.database {
            crate::config::database_url::DatabaseUrl::Sqlite(path) => std::path::absolute(path)
                .unwrap_or(path.clone())
                .display()
                .to_string(),
            other => other.to_string(),
        };
        report(&format!(
            "no config file (no --config, no IDEMHOOK_CONFIG, no {DEFAULT_CONFIG}): using the development default, database {database}"
        ));
    }
    Ok(config)
}

/// Why `command` does not run against PostgreSQL, when it does not.
/// Every other command works on either backend.
fn postgres_refusal(
    command: &Command,
    url: &crate::config::database_url::PostgresUrl,
) -> Option<String> {
    match command {
        Command::Backup { .. } => Some(format!(
            "database is {url}: idemhook does not back up PostgreSQL; use pg_dump (pg_dump --format=custom --file=idemhook.dump URL), which takes a consistent copy while serve runs"
        )),
        Command::Migrate { .. } => Some(format!(
            "database is {url}: migrate copies a SQLite database into PostgreSQL; run it with the config that names the SQLite file"
        )),
        _ => None,
    }
}

/// Loads the config once and hands the verb to the module that owns it.
fn run(cli: Cli) -> Result<Outcome, CommandError> {
    let config = match cli.command {
        // serve does not say where its config came from: its own log
        // lines name the database.
        Command::Serve { .. } => {
            ConfigSource::find(cli.config.as_deref(), std::env::var_os("IDEMHOOK_CONFIG")).load()?
        }
        // Made from the definitions above: no config, no database.
        Command::Completions { shell } => {
            return crate::ops::tooling::completions(&shell, Cli::command());
        }
        Command::Man { dir } => return crate::ops::tooling::man(dir.as_deref(), Cli::command()),
        // The operator commands verify and sign nothing: they need no
        // webhook, forward or notify secret set (a cron `reconcile` on a
        // host that holds none).
        Command::Events { .. }
        | Command::Replay(_)
        | Command::Resolve(_)
        | Command::Reconcile { .. }
        | Command::Pause { .. }
        | Command::Resume { .. }
        | Command::Prune { .. }
        | Command::Erase { .. }
        | Command::Backup { .. }
        | Command::Rejected { .. } => {
            crate::config::without_secrets(|| load_config(cli.config.as_deref()))?
        }
        _ => load_config(cli.config.as_deref())?,
    };
    if let crate::config::database_url::DatabaseUrl::Postgres(url) = &config.database
        && let Some(why) = postgres_refusal(&cli.command, url)
    {
        return Err(CommandError::Usage(why));
    }
    match cli.command {
        Command::Serve { listen, database } => serve(config, listen, database),
        Command::Check => check(&config),
        Command::Send {
            source,
            url,
            file,
            id,
            event_type,
            private_key,
            handshake,
        } => send_outcome(crate::send::run(
            &config,
            &source,
            crate::send::Options {
                url,
                file,
                id,
                event_type,
                private_key,
                handshake,
            },
        )),
        Command::Events { command } => events(&config, command),
        Command::Replay(args) => {
            let target = args.target(now_ms())?;
            ops::replay::cmd(&config, &target, args.yes)
        }
        Command::Resolve(args) => {
            let request = resolve::Request {
                source: args.source,
                event_id: args.event_id,
                action: args.action,
                note: args.note,
            };
            ops::resolve::cmd(&config, &request, args.yes)
        }
        Command::Pause { target } => ops::pause::cmd(&config, &target, true),
        Command::Resume { target } => ops::pause::cmd(&config, &target, false),
        Command::Probe { target } => ops::probe::cmd(&config, &target),
        Command::Prune { dry_run } => ops::prune::cmd(&config, dry_run),
        Command::Reconcile { json, check, yes } => ops::reconcile::cmd(&config, json, check, yes),
        Command::Erase {
            source,
            event_id,
            yes,
        } => ops::erase::cmd(&config, &source, &event_id, yes),
        Command::Migrate { to, yes } => ops::migrate::cmd(&config, &to, yes),
        Command::Backup { path } => ops::backup::cmd(&config, &path),
        Command::Rejected { command } => match command {
            RejectedCommand::List {
                source,
                since,
                json,
            } => ops::rejected::list_cmd(&config, source.as_deref(), since.as_deref(), json),
            RejectedCommand::Show { id, json } => ops::rejected::show_cmd(&config, id, json),
        },
        Command::Reingest(args) => ops::reingest::cmd(
            &config,
            &ops::reingest::Request {
                source: args.source,
                since: args.since,
                id: args.id,
                dry_run: !args.yes,
            },
            crate::http::hooks::reverify::reverify,
        ),
        Command::Catchup(args) => ops::catchup::cmd(
            std::sync::Arc::new(config),
            &args.source,
            args.since.as_deref(),
            args.yes,
            args.json,
        ),
        Command::Notify { command } => match command {
            NotifyCommand::Test { name } => crate::ops::notify::test_cmd(&config, &name),
            NotifyCommand::List { json } => crate::ops::notify::list_cmd(&config, json),
        },
        // Answered before the config is loaded.
        Command::Completions { .. } | Command::Man { .. } => Ok(Outcome::Done),
    }
}

/// `idemhook serve`: the flags override the config's `listen` and
/// `database`; it runs until SIGTERM or SIGINT.
fn serve(
    mut config: Config,
    listen: Option<String>,
    database: Option<String>,
) -> Result<Outcome, CommandError> {
    if let Some(l) = listen {
        config.listen = l;
    }
    if let Some(d) = database {
        config.set_database(&d).map_err(CommandError::Usage)?;
    }
    crate::serve::run(config)?;
    Ok(Outcome::Done)
}

/// `idemhook check`: like every command, with no ./idemhook.toml it checks
/// the development default (what `serve` would run here).
fn check(config: &Config) -> Result<Outcome, CommandError> {
    use std::io::Write as _;
    crate::serve::trial(config).map_err(|e| anyhow::anyhow!(e))?;
    let mut out = ops::text::stdout();
    out.write_all(crate::ops::check::describe(config).as_bytes())?;
    for (target, found, warning) in crate::outbox::dest::report(config) {
        if let Some(warning) = warning {
            to_stderr(&format!("warning: destination {target}: {warning}"));
        }
        match found {
            Ok(line) => writeln!(out, "destination {target}: {line}")?,
            Err(why) => {
                writeln!(out, "destination {target}: NOT USABLE: {why}")?;
                to_stderr(&format!("warning: destination {target}: {why}"));
            }
        }
    }
    out.flush()?;
    // Warnings do not fail the check: the config works as written.
    for warning in &config.warnings {
        to_stderr(&format!("warning: {warning}"));
    }
    Ok(Outcome::Done)
}

fn events(config: &Config, command: EventsCommand) -> Result<Outcome, CommandError> {
    match command {
        EventsCommand::List {
            source,
            status,
            event_type,
            since,
            limit,
            json,
        } => ops::inspect::list_cmd(config, source, status, event_type, since, limit, json),
        EventsCommand::Show {
            source,
            event_id,
            json,
        } => ops::inspect::show_cmd(config, &source, &event_id, json),
    }
}

/// `send` decides its own exit code: 0 when the answer was 2xx, else 1
/// (an outcome that needs attention).
fn send_outcome(result: Result<ExitCode>) -> Result<Outcome, CommandError> {
    Ok(if result? == ExitCode::SUCCESS {
        Outcome::Done
    } else {
        Outcome::Attention
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `idemhook help CMD` explains every argument of every command.
    #[test]
    fn every_argument_has_help_text() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in cmd.get_arguments() {
                let id = arg.get_id().as_str();
                if id == "help" || id == "version" {
                    continue;
                }
                let text = arg.get_help().map(ToString::to_string).unwrap_or_default();
                if text.trim().is_empty() {
                    missing.push(format!("{path} {id}"));
                }
            }
            for sub in cmd.get_subcommands() {
                if sub.get_name() == "help" {
                    continue;
                }
                if sub.get_about().is_none() {
                    missing.push(format!("{path} {} (the command)", sub.get_name()));
                }
                walk(sub, &format!("{path} {}", sub.get_name()), missing);
            }
        }
        let mut missing = Vec::new();
        walk(&Cli::command(), "idemhook", &mut missing);
        assert!(
            missing.is_empty(),
            "arguments without help text: {missing:?}"
        );
    }

    #[test]
    fn an_unknown_log_level_is_an_error_naming_the_valid_ones() {
        assert_eq!(log_level(None, None).unwrap(), Level::Info);
        assert_eq!(log_level(None, Some(String::new())).unwrap(), Level::Info);
        assert_eq!(log_level(None, Some("WARN".into())).unwrap(), Level::Warn);
        assert_eq!(
            log_level(Some("error"), Some("debug".into())).unwrap(),
            Level::Error
        );
        let e = log_level(None, Some("verbose".into()))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"verbose\"")
                && e.contains("IDEMHOOK_LOG")
                && e.contains("debug, info, warn, error"),
            "{e}"
        );
    }

    #[test]
    fn every_command_result_has_one_exit_code_and_line() {
        use crate::store::StoreError;
        use std::io::{Error, ErrorKind};
        let cases: [(Result<Outcome, CommandError>, u8, Option<&str>); 9] = [
            (Ok(Outcome::Done), 0, None),
            (Ok(Outcome::Attention), 1, None),
            (
                Err(CommandError::NotFound("no event a/b".into())),
                1,
                Some("no event a/b"),
            ),
            (
                Err(CommandError::Invalid("since: bad".into())),
                1,
                Some("since: bad"),
            ),
            (
                Err(CommandError::Usage("--note is required".into())),
                2,
                Some("--note is required"),
            ),
            (
                Err(CommandError::Storage(StoreError::other("disk I/O error"))),
                2,
                Some("storage error: disk I/O error"),
            ),
            (
                Err(CommandError::Failed(
                    anyhow::anyhow!("no such file").context("cannot open the database x.db"),
                )),
                2,
                Some("cannot open the database x.db: no such file"),
            ),
            (
                Err(CommandError::Output(Error::from(ErrorKind::BrokenPipe))),
                0,
                None,
            ),
            (
                Err(CommandError::Output(Error::other("no space left"))),
                2,
                Some("cannot write the output: no space left"),
            ),
        ];
        for (result, code, line) in cases {
            let shown = format!("{result:?}");
            assert_eq!(verdict(result), (code, line.map(String::from)), "{shown}");
        }
    }

    #[test]
    fn config_discovery_order() {
        let flag = Path::new("a.toml");
        assert_eq!(
            ConfigSource::find(Some(flag), Some("b.toml".into())),
            ConfigSource::Named("a.toml".into(), "--config")
        );
        assert_eq!(
            ConfigSource::find(None, Some("b.toml".into())),
            ConfigSource::Named("b.toml".into(), "IDEMHOOK_CONFIG")
        );
        let e = ConfigSource::Named("surely/missing.toml".into(), "IDEMHOOK_CONFIG")
            .load()
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("surely/missing.toml") && e.contains("IDEMHOOK_CONFIG"),
            "{e}"
        );
    }

    /// A write of the output that failed inside a command whose errors are
    /// `anyhow` ones (`migrate`, `send`) is judged as any failed write:
    /// a closed pipe quiet, a full disk one line, even under a context.
    #[test]
    fn a_failed_write_through_anyhow_is_an_output_error() {
        use anyhow::Context as _;
        let failed = |kind: std::io::ErrorKind| -> CommandError {
            let e: Result<()> = Err(ops::text::Unwritten(kind.into()).into());
            e.context("sending")
                .map_err(CommandError::from)
                .unwrap_err()
        };
        assert_eq!(
            verdict(Err(failed(std::io::ErrorKind::BrokenPipe))),
            (0, None)
        );
        let (code, line) = verdict(Err(failed(std::io::ErrorKind::StorageFull)));
        assert_eq!(code, 2);
        assert!(line.is_some_and(|l| l.starts_with("cannot write the output: ")));
    }
}
