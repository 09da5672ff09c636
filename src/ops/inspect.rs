//! (in progress)
use crate::config::Config;
use anyhow::{Result, bail};
pub fn list_cmd(
    _c: &Config,
    _s: Option<String>,
    _st: Option<String>,
    _t: Option<String>,
    _since: Option<String>,
    _l: u32,
    _j: bool,
) -> Result<std::process::ExitCode> {
    bail!("not built yet")
}
pub fn show_cmd(_c: &Config, _s: &str, _e: &str, _j: bool) -> Result<std::process::ExitCode> {
    bail!("not built yet")
}
