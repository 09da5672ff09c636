//! (in progress)
use anyhow::{Result, bail};
pub fn cmd(
    _config: &crate::config::Config,
    _s: &str,
    _e: &str,
    _yes: bool,
) -> Result<std::process::ExitCode> {
    bail!("erase: not built yet")
}
