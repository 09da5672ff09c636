//! (in progress)
use anyhow::{Result, bail};
pub fn cmd(_config: &crate::config::Config, _path: &std::path::Path) -> Result<()> {
    bail!("backup: not built yet")
}
