//! One computation at a time, its result shared by every caller that
//! asked while it ran: what keeps overlapping scrapes and probes from each
//! reading the kernel.

use std::{
    sync::{Arc, Mutex, PoisonError},
    time::Instant,
};

/// The last result of a computation and when it was done. A caller that
/// asks while it runs waits for it and gets it too (it was in progress, or
/// began later, when the caller asked: never older than the request's own
/// read would be by more than one computation); a caller that asks later
/// gets a computation of its own. So N callers at once cost one
/// computation, and callers never get a result from before they asked
/// that was already done.
#[derive(Debug)]
pub struct SingleFlight<T> {
    last: Mutex<Option<(Instant, Arc<T>)>>,
}

impl<T> Default for SingleFlight<T> {
    fn default() -> Self {
        SingleFlight {
            last: Mutex::new(None),
        }
    }
}

impl<T> SingleFlight<T> {
    /// For a request made at `asked`: the result of a computation done
    /// since (the one in progress then, or one begun later), else
    /// `compute`'s (blocking: callers wait for one another). `asked` is
    /// when the request came, not when a thread took it up, so a request
    /// queued for a thread still shares the read that was running.
    pub fn get(&self, asked: Instant, compute: impl FnOnce() -> T) -> Arc<T> {
        // Held while computing: that is what makes the others wait. A
        // computation that panicked left no result, so the next computes.
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((done, value)) = last.as_ref()
            && *done >= asked
        {
            return value.clone();
        }
        let value = Arc::new(compute());
        *last = Some((Instant::now(), value.clone()));
        value
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    #[test]
    fn callers_at_once_share_one_computation() {
        let flight = SingleFlight::default();
        let runs = AtomicU32::new(0);
        let values: Vec<u32> = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..16)
                .map(|_| {
                    scope.spawn(|| {
                        *flight.get(Instant::now(), || {
                            std::thread::sleep(Duration::from_millis(200));
                            runs.fetch_add(1, Ordering::SeqCst) + 1
                        })
                    })
                })
                .collect();
            workers.into_iter().map(|w| w.join().unwrap()).collect()
        });
        // The first computes; whoever came during it shares it; one that
        // the scheduler started only after it ended computes anew.
        let runs = runs.load(Ordering::SeqCst);
        assert!(runs < 16, "{runs} computations for 16 callers at once");
        assert!(values.iter().all(|v| *v <= runs), "{values:?}");
    }

    #[test]
    fn a_caller_after_a_computation_gets_its_own() {
        let flight = SingleFlight::default();
        let asked = Instant::now();
        assert_eq!(*flight.get(asked, || 1), 1);
        assert_eq!(
            *flight.get(Instant::now(), || 2),
            2,
            "a result done before asking is old"
        );
        assert_eq!(
            *flight.get(asked, || 3),
            2,
            "asked before the last one was done: it is new enough"
        );
    }
}
