//! Stop flags for threads that loop until told to stop.
//!
//! A test that runs such a loop beside its own steps inside
//! `std::thread::scope` must raise the flag even when one of those steps
//! panics: the scope joins every thread before it lets the panic through,
//! so a flag raised only on the success path turns a failed assertion into
//! a test that never ends (and a CI run that times out without saying why).

use std::sync::atomic::{AtomicBool, Ordering};

/// Raises its flag when dropped, on success and while unwinding alike.
#[must_use = "the flag is raised when the guard drops: bind it to a named variable"]
pub struct RaiseOnDrop<'a>(&'a AtomicBool);

impl<'a> RaiseOnDrop<'a> {
    pub fn new(flag: &'a AtomicBool) -> Self {
        RaiseOnDrop(flag)
    }
}

impl Drop for RaiseOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn a_panic_in_the_scope_still_stops_the_loop() {
        let stop = AtomicBool::new(false);
        let stopped_by_the_flag = AtomicBool::new(false);
        let outcome = std::panic::catch_unwind(|| {
            std::thread::scope(|scope| {
                let _raise = RaiseOnDrop::new(&stop);
                scope.spawn(|| {
                    // Bounded, so that this test fails rather than hangs
                    // when the guard does not do its job.
                    let deadline = Instant::now() + Duration::from_secs(10);
                    while Instant::now() < deadline {
                        if stop.load(Ordering::Relaxed) {
                            stopped_by_the_flag.store(true, Ordering::Relaxed);
                            return;
                        }
                        std::thread::sleep(Duration::from_millis(1));
                    }
                });
                panic!("a step beside the loop fails");
            })
        });
        assert!(outcome.is_err(), "the panic is let through");
        assert!(stopped_by_the_flag.load(Ordering::Relaxed));
    }
}
