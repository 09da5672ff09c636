//! The command line: parses arguments with clap, loads the config, and
//! hands each verb to the module that owns it. Errors come back here and
//! are printed once, with their context chain.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};

use crate::config::Config;
use crate::log::{Format, Level};

#[derive(Parser, Debug)]
#[command(
    name = "idemhook",
    version,
    about = "Receive webhooks, verify them, and turn at-least-once delivery into exactly-once effects, on one SQLite file."
)]
pub struct Cli {
    /// The config file.
    #[arg(long, global = true, default_value = "./idemhook.toml")]
    pub config: PathBuf,
    /// Log format: text or json (logs go to stderr).
    #[arg(long, global = true, value_parser = ["text", "json"])]
    pub log_format: Option<String>,
    /// Log level: debug, info, warn, error. Also IDEMHOOK_LOG.
    #[arg(long, global = true)]
    pub log_level: Option<String>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the receiver (HTTP server, writer, forward workers).
    Serve {
        /// Address to listen on, overriding the config's `listen`.
        #[arg(long)]
        listen: Option<String>,
        /// Database file, overriding the config's `database`.
        #[arg(long)]
        database: Option<PathBuf>,
    },
    /// Validate the config and print its sources, actions and key rules.
    Check,
    /// Sign a sample (or given) body as SOURCE's provider would and POST it.
    Send {
        source: String,
        /// Where to post; default http://{listen}/hooks/{source}.
        #[arg(long)]
        url: Option<String>,
        /// The body to send, as it is: a file, or - for standard input. Its
        /// own id and type are kept unless --id or --type is given.
        #[arg(long)]
        file: Option<String>,
        /// The event id, set wherever the kind carries it.
        #[arg(long)]
        id: Option<String>,
        /// The event type, set wherever the kind carries it.
        #[arg(long = "type")]
        event_type: Option<String>,
    },
    /// List and inspect stored events.
    Events {
        #[command(subcommand)]
        command: EventsCommand,
    },
    /// Re-open failed (or, with --force, done) jobs of an event, or in batch.
    Replay(crate::ops::replay::ReplayArgs),
    /// Pause an action: its jobs wait, events keep being accepted.
    Pause {
        /// SOURCE/ACTION
        target: String,
    },
    /// Resume a paused action.
    Resume {
        /// SOURCE/ACTION
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
        #[arg(long)]
        json: bool,
    },
    /// Drop an event's stored body and headers, keep its key.
    Erase {
        source: String,
        event_id: String,
        /// Do it; without this only print what would happen.
        #[arg(long)]
        yes: bool,
    },
    /// Write a consistent copy of the database to PATH.
    Backup { path: PathBuf },
}

#[derive(Subcommand, Debug)]
pub enum EventsCommand {
    /// Newest first.
    List {
        #[arg(long)]
        source: Option<String>,
        #[arg(long)]
        status: Option<String>,
        #[arg(long = "type")]
        event_type: Option<String>,
        /// Only events received within this duration, e.g. 1h.
        #[arg(long)]
        since: Option<String>,
        /// The most events to print; 0 means all.
        #[arg(long, default_value_t = 50)]
        limit: u32,
        #[arg(long)]
        json: bool,
    },
    /// One event: state, payload, jobs, attempts, deliveries, incidents.
    Show {
        source: String,
        event_id: String,
        #[arg(long)]
        json: bool,
    },
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let level = cli
        .log_level
        .clone()
        .or_else(|| std::env::var("IDEMHOOK_LOG").ok())
        .and_then(|l| Level::parse(&l))
        .unwrap_or(Level::Info);
    let format = match cli.log_format.as_deref() {
        Some("json") => Format::Json,
        _ => Format::Text,
    };
    crate::log::init(level, format);
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("idemhook: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// The config file, or the development default when the default path does
/// not exist. An explicitly named file that is missing is an error.
pub fn load_config(path: &Path) -> Result<Config> {
    if !path.exists() && path == Path::new("./idemhook.toml") {
        return Ok(Config::dev_default());
    }
    Ok(Config::load(path)?)
}

fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::Serve { listen, database } => {
            let mut config = load_config(&cli.config)?;
            if let Some(l) = listen {
                config.listen = l;
            }
            if let Some(d) = database {
                config.database = d;
            }
            crate::serve::run(config)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Check => {
            // Like every command: with no ./idemhook.toml, the development
            // default (what `serve` would run here) is what there is to check.
            let config = load_config(&cli.config)?;
            crate::serve::check_sql_actions(&config).map_err(|e| anyhow::anyhow!(e))?;
            print!("{}", crate::serve::describe(&config));
            Ok(ExitCode::SUCCESS)
        }
        Command::Send {
            source,
            url,
            file,
            id,
            event_type,
        } => {
            let config = load_config(&cli.config)?;
            crate::send::run(&config, &source, url, file, id, event_type)
        }
        Command::Events { command } => {
            let config = load_config(&cli.config)?;
            match command {
                EventsCommand::List {
                    source,
                    status,
                    event_type,
                    since,
                    limit,
                    json,
                } => crate::ops::inspect::list_cmd(
                    &config, source, status, event_type, since, limit, json,
                ),
                EventsCommand::Show {
                    source,
                    event_id,
                    json,
                } => crate::ops::inspect::show_cmd(&config, &source, &event_id, json),
            }
        }
        Command::Replay(args) => crate::ops::replay::cmd(&load_config(&cli.config)?, &args),
        Command::Pause { target } => {
            crate::ops::pause::cmd(&load_config(&cli.config)?, &target, true)
        }
        Command::Resume { target } => {
            crate::ops::pause::cmd(&load_config(&cli.config)?, &target, false)
        }
        Command::Prune { dry_run } => crate::ops::prune::cmd(&load_config(&cli.config)?, dry_run),
        Command::Reconcile { json } => crate::ops::reconcile::cmd(&load_config(&cli.config)?, json),
        Command::Erase {
            source,
            event_id,
            yes,
        } => crate::ops::erase::cmd(&load_config(&cli.config)?, &source, &event_id, yes),
        Command::Backup { path } => {
            let config = load_config(&cli.config)?;
            if path.exists() {
                bail!("{} already exists; choose a new path", path.display());
            }
            crate::ops::backup::cmd(&config, &path).context("backup failed")?;
            Ok(ExitCode::SUCCESS)
        }
    }
}
