//! (in progress)
use anyhow::{Result, bail};
#[derive(clap::Args, Debug)]
pub struct ReplayArgs {
    pub source: Option<String>,
    pub event_id: Option<String>,
    #[arg(long = "source", id = "batch_source")]
    pub batch_source: Option<String>,
    #[arg(long)]
    pub status: Option<String>,
    #[arg(long)]
    pub action: Option<String>,
    #[arg(long)]
    pub since: Option<String>,
    #[arg(long)]
    pub force: bool,
    #[arg(long)]
    pub yes: bool,
}
pub fn cmd(_config: &crate::config::Config, _a: &ReplayArgs) -> Result<std::process::ExitCode> {
    bail!("not built yet")
}
