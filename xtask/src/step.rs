//! A verb is a list of named steps run in order, each timed; the table of
//! their times ends the log.

use std::process::{Command, Stdio};
use std::rc::Rc;
use std::time::Instant;

use anyhow::{Context, Result};

use crate::background::{self, Job};
use crate::cmd::{target_dir, workspace_root};

/// One named step of a verb. Verbs are plain lists of steps, so adding one
/// (eBPF clippy, VM tests on older kernels, ...) is adding an entry.
pub(crate) struct Step<'a> {
    pub(crate) name: String,
    pub(crate) run: Box<dyn Fn() -> Result<()> + 'a>,
}

impl<'a> Step<'a> {
    pub(crate) fn new(name: impl Into<String>, run: impl Fn() -> Result<()> + 'a) -> Step<'a> {
        Step {
            name: name.into(),
            run: Box::new(run),
        }
    }

    /// The step that starts `job` with the command `command` makes (which
    /// may do quick preparation of its own first, such as installing what
    /// the job would otherwise install beside other steps).
    pub(crate) fn start_beside(
        job: &Rc<Job>,
        command: impl Fn() -> Result<Command> + 'a,
    ) -> Step<'a> {
        let job = Rc::clone(job);
        Step::new(
            format!("start beside the next steps: {}", job.name()),
            move || job.start(&command()?),
        )
    }

    /// The step that waits for `job`, then runs `check` on what it left; it
    /// fails if either does.
    pub(crate) fn wait_for(job: &Rc<Job>, check: impl Fn() -> Result<()> + 'a) -> Step<'a> {
        let job = Rc::clone(job);
        Step::new(format!("wait for: {}", job.name()), move || {
            job.wait()?;
            check()
        })
    }
}

pub(crate) fn run_steps(verb: &str, steps: Vec<Step<'_>>) -> Result<()> {
    let total = steps.len();
    let started = Instant::now();
    let mut timings: Vec<(String, f64, &str)> = Vec::new();
    for (index, step) in steps.iter().enumerate() {
        let number = index + 1;
        println!("xtask {verb}: step {number}/{total}: {}", step.name);
        let step_started = Instant::now();
        let outcome = (step.run)();
        let took = step_started.elapsed().as_secs_f64();
        timings.push((
            step.name.clone(),
            took,
            if outcome.is_ok() { "ok" } else { "FAILED" },
        ));
        if let Err(error) = outcome {
            print_stage_table(verb, &timings, started.elapsed().as_secs_f64());
            return Err(error)
                .with_context(|| format!("{verb} step {number}/{total} ({}) failed", step.name));
        }
        println!(
            "xtask {verb}: step {number}/{total} done in {took:.1}s{}",
            free_space_note()
        );
    }
    print_stage_table(verb, &timings, started.elapsed().as_secs_f64());
    println!(
        "xtask {verb}: all {total} steps passed in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The time of every step that ran, in one table at the end of the log
/// (where CI's truncated output still shows it).
fn print_stage_table(verb: &str, timings: &[(String, f64, &str)], total: f64) {
    println!("xtask {verb}: stage times");
    for (number, (name, took, outcome)) in timings.iter().enumerate() {
        println!(
            "  {:>2}  {took:>7.1}s  {:>5.1}%  {outcome:<6}  {name}",
            number + 1,
            took * 100.0 / total.max(f64::EPSILON),
        );
    }
    let beside = background::finished();
    if !beside.is_empty() {
        println!("      beside the steps (their time is in no row above but the wait):");
        for (name, took, outcome) in beside {
            println!("      {took:>7.1}s          {outcome:<6}  {name}");
        }
    }
    println!("      {total:>7.1}s  in all");
}

/// ", N MiB free for target/", from `df`, or nothing if it cannot say: a
/// CI log then shows which step filled a small disk.
fn free_space_note() -> String {
    let target = target_dir();
    let Ok(out) = Command::new("df")
        .args(["--output=avail", "-B1M"])
        .arg(if target.exists() {
            target
        } else {
            workspace_root()
        })
        .stderr(Stdio::null())
        .output()
    else {
        return String::new();
    };
    match String::from_utf8_lossy(&out.stdout).lines().nth(1) {
        Some(mib) if out.status.success() => format!(", {} MiB free for target/", mib.trim()),
        _ => String::new(),
    }
}
