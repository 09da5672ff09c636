//! (in progress)
use anyhow::{Result, bail};
pub fn cmd(_config: &crate::config::Config, _t: &str, _p: bool) -> Result<std::process::ExitCode> {
    bail!("not built yet")
}
