//! One computation at a time, its result shared for a while: what keeps
//! overlapping scrapes and probes from each reading the kernel.

use std::{
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

/// The last result of a computation and when it was made. Whoever asks
/// while it is being computed waits for it and gets it too; whoever asks
/// within `every` of its end gets it as is. So N callers at once cost one
/// computation, and consecutive ones start at least `every` apart.
#[derive(Debug)]
pub struct Fresh<T> {
    last: Mutex<Option<(Instant, Arc<T>)>>,
    every: Duration,
}

impl<T> Fresh<T> {
    pub const fn new(every: Duration) -> Fresh<T> {
        Fresh {
            last: Mutex::new(None),
            every,
        }
    }

    /// The last result if younger than `every`, else `compute`'s (blocking:
    /// callers wait for one another).
    pub fn get(&self, compute: impl FnOnce() -> T) -> Arc<T> {
        // Held while computing: that is what makes the others wait. A
        // computation that panicked left no result, so the next computes.
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((made, value)) = last.as_ref()
            && made.elapsed() < self.every
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

    #[test]
    fn callers_at_once_share_one_computation() {
        let fresh = Fresh::new(Duration::from_secs(60));
        let runs = AtomicU32::new(0);
        let values: Vec<u32> = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..16)
                .map(|_| {
                    scope.spawn(|| {
                        *fresh.get(|| {
                            std::thread::sleep(Duration::from_millis(50));
                            runs.fetch_add(1, Ordering::SeqCst) + 1
                        })
                    })
                })
                .collect();
            workers.into_iter().map(|w| w.join().unwrap()).collect()
        });
        assert_eq!(runs.load(Ordering::SeqCst), 1, "computed more than once");
        assert!(values.iter().all(|v| *v == 1), "{values:?}");
    }

    #[test]
    fn a_result_older_than_its_time_is_computed_again() {
        let fresh = Fresh::new(Duration::from_millis(20));
        assert_eq!(*fresh.get(|| 1), 1);
        assert_eq!(*fresh.get(|| 2), 1, "still fresh");
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(*fresh.get(|| 3), 3);
    }
}
