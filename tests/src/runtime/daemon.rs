//! A long-running runtime process (containerd): started in its own cgroup
//! with its output in a log file, killed with the thread that started it
//! (`PR_SET_PDEATHSIG`), stopped with SIGTERM then SIGKILL; and the
//! bounded polling every readiness wait uses.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

use super::holder::die_with_parent;

/// A supervised process (see the module docs); stopped on drop.
#[derive(Debug)]
pub struct Daemon {
    child: Option<Child>,
    name: String,
    log: PathBuf,
}

impl Daemon {
    /// Spawns `command` (`name` for messages) with stdout and stderr in
    /// `log`, moved into the cgroup whose `cgroup.procs` is `procs` before
    /// it runs.
    ///
    /// # Panics
    /// If the log cannot be created or the process cannot start.
    pub fn spawn(name: &str, mut command: Command, log: &Path, procs: PathBuf) -> Daemon {
        use std::os::unix::process::CommandExt;
        let file = std::fs::File::create(log)
            .unwrap_or_else(|e| panic!("creating {}: {e}", log.display()));
        let file_err = file.try_clone().expect("cloning a file handle");
        command.stdout(file).stderr(file_err);
        // SAFETY: between fork and exec only prctl and std's open/write/close
        // on a path built before the fork.
        unsafe {
            command.pre_exec(move || {
                std::fs::write(&procs, b"0")?;
                die_with_parent()
            });
        }
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name}: {e}"));
        Daemon {
            child: Some(child),
            name: name.to_owned(),
            log: log.to_path_buf(),
        }
    }

    /// Its exit status if it has exited (or was stopped).
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// The last `lines` lines of its log.
    pub fn log_tail(&self, lines: usize) -> Vec<String> {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..]
            .iter()
            .map(|l| (*l).to_owned())
            .collect()
    }

    /// Stops it: SIGTERM, then SIGKILL after `grace`. Its exit status
    /// (`None` if it was stopped before).
    pub fn stop(&mut self, grace: Duration) -> Option<ExitStatus> {
        let mut child = self.child.take()?;
        crate::stop::terminate(&mut child, &self.name, grace)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(10));
    }
}

/// Calls `poll` every `every` until it returns `Ok`, for at most `within`;
/// the last `Err` after that.
pub fn wait_until<T>(
    within: Duration,
    every: Duration,
    mut poll: impl FnMut() -> Result<T, String>,
) -> Result<T, String> {
    let deadline = Instant::now() + within;
    loop {
        match poll() {
            Ok(value) => return Ok(value),
            Err(last) if Instant::now() >= deadline => return Err(last),
            Err(_) => std::thread::sleep(every),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_are_bounded_and_return_the_last_error() {
        let mut polls = 0;
        let outcome: Result<(), String> =
            wait_until(Duration::from_millis(50), Duration::from_millis(10), || {
                polls += 1;
                Err(format!("poll {polls}"))
            });
        let last = outcome.unwrap_err();
        assert!(polls >= 2, "{polls}");
        assert_eq!(last, format!("poll {polls}"));
        assert_eq!(
            wait_until(Duration::ZERO, Duration::ZERO, || Ok::<_, String>(7)),
            Ok(7)
        );
    }
}
