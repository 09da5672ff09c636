//! `/readyz` probes coalesced: at most one probe write in flight. A
//! request answers from a probe that started after it arrived (a commit
//! that started before never answers for it): with none running it starts
//! one; while one runs it waits for the next, which one of the waiting
//! requests starts and all of them share. So a burst of probes costs two
//! writes, not one each. Owned by `App`; the probe itself is the backend's
//! (`Backend::ready`).

use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

use crate::store::StoreError;

/// The probes started and finished, and the last one's result.
#[derive(Default)]
struct State {
    running: bool,
    /// Probes started since start; the running one, if any, is this one.
    started: u64,
    /// The last probe finished, and its result.
    finished: u64,
    result: Option<Result<(), StoreError>>,
}

#[derive(Default)]
pub struct Coalesced {
    state: Mutex<State>,
    done: Condvar,
}

impl Coalesced {
    /// The result of a `probe` that started after this call: this thread's
    /// own, or one shared with the requests that waited with it.
    pub fn ready(&self, probe: impl FnOnce() -> Result<(), StoreError>) -> Result<(), StoreError> {
        let mut state = self.lock();
        // Whether one runs or not, the next to start is the first that
        // started after this call.
        let needed = state.started + 1;
        loop {
            if state.finished >= needed
                && let Some(result) = &state.result
            {
                return result.clone();
            }
            if !state.running {
                state.running = true;
                state.started += 1;
                let number = state.started;
                drop(state);
                return self.run(number, probe);
            }
            state = self
                .done
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Runs probe `number` and hands its result to those waiting; a probe
    /// that panics still ends (its waiters then start the next one).
    fn run(
        &self,
        number: u64,
        probe: impl FnOnce() -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        struct Ending<'a>(&'a Coalesced);
        impl Drop for Ending<'_> {
            fn drop(&mut self) {
                self.0.lock().running = false;
                self.0.done.notify_all();
            }
        }
        let ending = Ending(self);
        let result = probe();
        {
            let mut state = self.lock();
            state.finished = number;
            state.result = Some(result.clone());
        }
        drop(ending);
        result
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    #[test]
    fn a_burst_shares_probes_and_none_answers_from_an_older_one() {
        let gate = Arc::new(Coalesced::default());
        let probes = Arc::new(AtomicU32::new(0));
        let in_flight = Arc::new(AtomicU32::new(0));
        let threads: Vec<_> = (0..32)
            .map(|_| {
                let (gate, probes, in_flight) = (gate.clone(), probes.clone(), in_flight.clone());
                std::thread::spawn(move || {
                    gate.ready(|| {
                        assert_eq!(in_flight.fetch_add(1, Ordering::SeqCst), 0, "two in flight");
                        probes.fetch_add(1, Ordering::SeqCst);
                        std::thread::sleep(Duration::from_millis(20));
                        in_flight.fetch_sub(1, Ordering::SeqCst);
                        Ok(())
                    })
                })
            })
            .collect();
        for t in threads {
            assert!(t.join().expect("thread").is_ok());
        }
        let n = probes.load(Ordering::SeqCst);
        assert!((1..32).contains(&n), "{n} probes for 32 requests");
    }

    #[test]
    fn a_failed_probe_is_the_answer_of_those_that_shared_it() {
        let gate = Coalesced::default();
        let failed = gate.ready(|| Err(StoreError::other("disk full")));
        assert!(failed.is_err());
        assert!(
            gate.ready(|| Ok(())).is_ok(),
            "the next request probes again"
        );
    }
}
