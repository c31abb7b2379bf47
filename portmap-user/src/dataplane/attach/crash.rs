//! Test-only fault injection: with `EPM_TEST_CRASH_AFTER` set to the name
//! of a step, the process kills itself with SIGKILL right after that step,
//! the way a node's OOM killer or a runtime's timeout would, so that the
//! tests (`tests/tests/crash.rs`) can check that every multi-step change of
//! the pinned state is left in a state the next run finishes or rolls back.
//!
//! Nothing sets it but those tests; unset (as everywhere else), [`point`]
//! reads one environment variable and returns. The steps are named where
//! [`point`] is called: `resize-*` in `pinned/resize.rs`, `load-*` in
//! `upgrade.rs`, `attach-*` in `ensure.rs`, `hook-*` in `cgroup.rs`.

/// The variable that names the step to die after. Test-only.
pub const ENV: &str = "EPM_TEST_CRASH_AFTER";

/// Dies (SIGKILL, no unwinding, no destructor) if [`ENV`] names `step`.
pub fn point(step: &str) {
    if std::env::var_os(ENV).is_some_and(|wanted| wanted == step) {
        log::warn!("{ENV}={step}: killing this process, as the test asked");
        // SAFETY: plain syscalls; SIGKILL cannot be caught, nothing after
        // it runs.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
    }
}
