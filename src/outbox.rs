//! (in progress)
use anyhow::Result;
use std::sync::Arc;
pub struct Outbox;
#[derive(Clone)]
pub struct Waker;
impl Waker {
    pub fn wake(&self) {}
}
impl Outbox {
    pub fn start(
        _c: Arc<crate::config::Config>,
        _w: crate::store::Writer,
        _m: Arc<crate::metrics::Metrics>,
    ) -> Result<Outbox> {
        Ok(Outbox)
    }
    pub fn waker(&self) -> Waker {
        Waker
    }
    pub fn stop(self) {}
}
