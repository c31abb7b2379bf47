//! Progress of a run: the lines that show the time used against the
//! budget, and Ctrl-C / SIGTERM, which stop the run at its next step.

use std::io::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::bail;

use crate::load::RunResult;
use crate::svg;

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Ctrl-C / SIGTERM only set a flag: the bench stops at the next step and
/// the guards remove every namespace, pin root and temp dir.
pub fn install_signal_handlers() {
    let handler: extern "C" fn(libc::c_int) = on_signal;
    for signal in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe { libc::signal(signal, handler as libc::sighandler_t) };
    }
}

/// Progress lines with the time used against the budget.
pub struct Progress {
    pub started: Instant,
    pub budget: Duration,
}

impl Progress {
    pub fn say(&self, text: &str) {
        let used = self.started.elapsed().as_secs();
        println!(
            "[{:02}:{:02} / {:02}:{:02}] {text}",
            used / 60,
            used % 60,
            self.budget.as_secs() / 60,
            self.budget.as_secs() % 60
        );
        let _ = std::io::stdout().flush();
    }

    /// Errors out if the user interrupted the run.
    pub fn check(&self) -> anyhow::Result<()> {
        if INTERRUPTED.load(Ordering::SeqCst) {
            bail!("interrupted");
        }
        Ok(())
    }

    pub fn left(&self) -> Duration {
        self.budget.saturating_sub(self.started.elapsed())
    }
}

/// One run for a progress line: its rate and, in brackets, its errors.
pub fn short_measurement(run: &RunResult) -> String {
    format!("{}[{}]", svg::short(run.rate), run.errors)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_lines_show_every_rate_with_its_errors() {
        let run = RunResult {
            rate: 7111.0,
            errors: 3,
            connect_errors: 3,
            amount: 7111.0,
            seconds: 1.0,
        };
        assert_eq!(short_measurement(&run), "7.11k[3]");
    }
}
