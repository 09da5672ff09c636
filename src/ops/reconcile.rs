//! (in progress)
use anyhow::{Result, bail};
pub fn cmd(_config: &crate::config::Config, _j: bool) -> Result<std::process::ExitCode> {
    bail!("not built yet")
}
