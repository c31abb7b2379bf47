//! Work that runs beside the steps after it: a child process one step
//! starts and a later step waits for, its output kept in a log file (shown
//! when it is waited for) so it does not interleave with the steps in front.
//!
//! Why: CI runs `test` on 2 cores, and long stretches of it leave one idle:
//! the tests mostly wait (on namespaces, traffic, daemons), and the shipped
//! plugin's fat-LTO code generation runs on one core. A build that nothing
//! before a later step needs (the shipped plugin) runs in that idle time, at the lowest priority, so the tests in front, with
//! their bounded waits, keep the CPU they ask for. Cargo locks each build
//! directory (`target/<profile>`) for the length of a build, so only builds
//! of other profiles or target directories run beside `cargo test`.

use std::cell::RefCell;
use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::rc::Rc;
use std::sync::Mutex;
use std::time::Instant;

use anyhow::{Context, Result, bail};

use crate::cmd::{show, target_dir};

/// How a job's priority is set: `nice -n <level>` before its command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Priority {
    /// Below everything in front (`nice 19`): builds.
    Lowest,
    /// As the steps in front: work with timeouts of its own (the VMs).
    Same,
}

/// One piece of work run beside later steps (`Step::start_beside` starts
/// it, `Step::wait_for` waits for it).
pub(crate) struct Job {
    name: String,
    log: PathBuf,
    priority: Priority,
    /// Writes [`Job::done_marker`] when its command succeeds.
    marks_done: bool,
    state: RefCell<State>,
}

enum State {
    NotStarted,
    Running { child: Child, started: Instant },
    Waited,
}

/// What ran beside the steps, for the stage table: name, seconds, outcome.
static FINISHED: Mutex<Vec<(String, f64, &'static str)>> = Mutex::new(Vec::new());

/// The jobs waited for so far, in the order they ended.
pub(crate) fn finished() -> Vec<(String, f64, &'static str)> {
    FINISHED.lock().map(|done| done.clone()).unwrap_or_default()
}

impl Job {
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// A job named `name` whose output goes to `target/xtask/<slug>.log`.
    pub(crate) fn new(name: impl Into<String>, slug: &str, priority: Priority) -> Rc<Job> {
        Job::with(name.into(), slug, priority, false)
    }

    fn with(name: String, slug: &str, priority: Priority, marks_done: bool) -> Rc<Job> {
        Rc::new(Job {
            name,
            log: target_dir().join("xtask").join(format!("{slug}.log")),
            priority,
            marks_done,
            state: RefCell::new(State::NotStarted),
        })
    }

    /// A job like [`Job::new`]'s that writes [`Job::done_marker`] when its
    /// command succeeds, so that another job can start on it before this
    /// one is waited for.
    pub(crate) fn marked(name: impl Into<String>, slug: &str, priority: Priority) -> Rc<Job> {
        Job::with(name.into(), slug, priority, true)
    }

    /// `target/xtask/<slug>.done`: written by a [`Job::marked`] job's
    /// command when it succeeded, removed when it starts.
    pub(crate) fn done_marker(&self) -> PathBuf {
        self.log.with_extension("done")
    }

    /// Starts `command` in a process group of its own (so a failed step
    /// before the wait takes all of it down), its output in the log.
    pub(crate) fn start(&self, command: &Command) -> Result<()> {
        let marker = self.done_marker();
        if self.marks_done {
            match std::fs::remove_file(&marker) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(e).with_context(|| format!("removing {}", marker.display()));
                }
                _ => {}
            }
        }
        let mut launched = match self.priority {
            Priority::Lowest => {
                let mut niced = Command::new("nice");
                niced.args(["-n", "19"]);
                niced
            }
            Priority::Same => Command::new("env"),
        };
        if self.marks_done {
            // `sh -c SCRIPT MARKER PROGRAM ARGS...`: "$0" is the marker,
            // "$@" the command, run as it is, not re-parsed.
            launched
                .args(["sh", "-c", "\"$@\" && : > \"$0\""])
                .arg(&marker);
        }
        launched.arg(command.get_program());
        launched.args(command.get_args());
        for (key, value) in command.get_envs() {
            match value {
                Some(value) => launched.env(key, value),
                None => launched.env_remove(key),
            };
        }
        if let Some(dir) = command.get_current_dir() {
            launched.current_dir(dir);
        }
        if let Some(parent) = self.log.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        let log =
            File::create(&self.log).with_context(|| format!("creating {}", self.log.display()))?;
        let shown = show(command);
        let child = launched
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(0)
            .spawn()
            .with_context(|| format!("could not start `{shown}`"))?;
        println!(
            "+ {shown} (beside the next steps{}; output in {})",
            if self.priority == Priority::Lowest {
                ", at the lowest priority"
            } else {
                ""
            },
            self.log.display()
        );
        *self.state.borrow_mut() = State::Running {
            child,
            started: Instant::now(),
        };
        Ok(())
    }

    /// Waits for the job, prints its output, and fails if it failed.
    pub(crate) fn wait(&self) -> Result<()> {
        let state = std::mem::replace(&mut *self.state.borrow_mut(), State::Waited);
        let State::Running { mut child, started } = state else {
            bail!("{} was never started", self.name);
        };
        let status = child
            .wait()
            .with_context(|| format!("waiting for {}", self.name))?;
        let took = started.elapsed().as_secs_f64();
        let output = std::fs::read_to_string(&self.log).unwrap_or_default();
        println!(
            "--- output of `{}` ({took:.1}s beside the steps before), from {}:",
            self.name,
            self.log.display()
        );
        print!("{output}");
        println!("--- end of `{}`", self.name);
        if let Ok(mut done) = FINISHED.lock() {
            done.push((
                self.name.clone(),
                took,
                if status.success() { "ok" } else { "FAILED" },
            ));
        }
        if !status.success() {
            bail!("{} failed ({status})", self.name);
        }
        Ok(())
    }
}

impl Drop for Job {
    /// A step failed before the wait: the job's whole process group goes
    /// with `test` (cargo's rustc children, QEMU), not on in the background.
    fn drop(&mut self) {
        if let State::Running { child, .. } = self.state.get_mut() {
            let group = format!("-{}", child.id());
            let _ = Command::new("kill").args(["-TERM", "--", &group]).status();
            let _ = child.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_marked_job_writes_its_marker_only_when_its_command_succeeds() {
        for (program, marked) in [("true", true), ("false", false)] {
            let job = Job::marked(
                format!("marker test ({program})"),
                &format!("marker-test-{}-{program}", std::process::id()),
                Priority::Same,
            );
            let marker = job.done_marker();
            // A marker left by an earlier run is removed at the start.
            std::fs::create_dir_all(marker.parent().expect("a folder")).expect("folder");
            std::fs::write(&marker, "").expect("stale marker");
            job.start(&Command::new(program)).expect("start");
            let waited = job.wait();
            assert_eq!(waited.is_ok(), marked, "{program}: {waited:?}");
            assert_eq!(
                marker.exists(),
                marked,
                "{program}: marker at {}",
                marker.display()
            );
            let _ = std::fs::remove_file(&marker);
            let _ = std::fs::remove_file(marker.with_extension("log"));
        }
    }
}
