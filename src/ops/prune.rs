//! (in progress)
use anyhow::{Result, bail};
use std::sync::Arc;
pub fn cmd(_config: &crate::config::Config, _d: bool) -> Result<std::process::ExitCode> {
    bail!("not built yet")
}
pub struct Background;
impl Background {
    pub fn start(_c: Arc<crate::config::Config>, _w: crate::store::Writer) -> Background {
        Background
    }
    pub fn stop(self) {}
}
