//! Stopping what a test started: child processes (SIGTERM, then SIGKILL
//! after a grace period: [`terminate`]), and stop flags for threads that
//! loop until told to stop.
//!
//! A test that runs such a loop beside its own steps inside
//! `std::thread::scope` must raise the flag even when one of those steps
//! panics: the scope joins every thread before it lets the panic through,
//! so a flag raised only on the success path turns a failed assertion into
//! a test that never ends (and a CI run that times out without saying why).

use std::process::{Child, ExitStatus};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Stops `child` (`name` for messages): SIGTERM, then SIGKILL if it has
/// not exited within `grace`. Its exit status, if it could be read.
pub fn terminate(child: &mut Child, name: &str, grace: Duration) -> Option<ExitStatus> {
    let pid = i32::try_from(child.id()).unwrap_or_default();
    // SAFETY: signalling the child we started; no memory involved.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!("harness: {name} did not stop on SIGTERM within {grace:?}; killing it");
    let _ = child.kill();
    child.wait().ok()
}

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
