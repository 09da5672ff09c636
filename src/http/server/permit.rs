//! The `http_workers` processing permits.

use std::sync::{Arc, Condvar, Mutex};

/// A counting semaphore for processing permits.
pub(super) struct Semaphore {
    pub(super) free: Mutex<usize>,
    cv: Condvar,
}

/// One of `http_workers` processing permits, held while a request is
/// verified and parsed. A handler that then only waits (for the writer's
/// commit) gives it back early with [`Permit::release`], so waiting requests
/// do not cap how many claims share one group commit.
pub struct Permit(pub(super) Option<Arc<Semaphore>>);

impl Semaphore {
    pub(super) fn new(n: usize) -> Semaphore {
        Semaphore {
            free: Mutex::new(n),
            cv: Condvar::new(),
        }
    }

    pub(super) fn acquire(self: &Arc<Self>) -> Permit {
        let mut free = match self.free.lock() {
            Ok(f) => f,
            Err(p) => p.into_inner(),
        };
        while *free == 0 {
            free = match self.cv.wait(free) {
                Ok(f) => f,
                Err(p) => p.into_inner(),
            };
        }
        *free -= 1;
        Permit(Some(self.clone()))
    }
}

impl Permit {
    /// Gives the permit back now rather than when the request is answered.
    pub fn release(&mut self) {
        if let Some(sem) = self.0.take() {
            let mut free = match sem.free.lock() {
                Ok(f) => f,
                Err(p) => p.into_inner(),
            };
            *free += 1;
            sem.cv.notify_one();
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.release();
    }
}
