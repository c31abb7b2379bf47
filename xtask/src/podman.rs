//! `cargo xtask e2e-podman`: ebpf-portmap under a real container runtime.
//!
//! Installs Debian's podman (4.3 on Debian 12, the last series with the CNI
//! backend) with runc, conmon, the reference CNI plugins and busybox-static,
//! then runs the `#[ignore]`d tests of `tests/tests/podman.rs` one after the
//! other: podman publishes ports through a bridge conflist with
//! `ebpf-portmap`, then with the upstream `portmap` as the reference (see
//! that file for what is checked). podman runs inside a test-owned network
//! namespace with its own configuration, storage and CNI directories and a
//! private mount namespace; nothing of the machine's podman state is used.

use std::process::Command;

use anyhow::{Result, bail};

/// Debian packages the podman tests need on top of `setup`'s: podman and
/// its runtime (runc: crun refuses hybrid cgroup hosts), conmon, the
/// reference plugins (bridge, host-local, portmap), busybox-static for the
/// image, iptables for the upstream plugin, util-linux for nsenter/unshare.
pub const PODMAN_APT_PACKAGES: &[&str] = &[
    "podman",
    "runc",
    "conmon",
    "containernetworking-plugins",
    "busybox-static",
    "iptables",
    "util-linux",
];

/// `EPM_SKIP_PODMAN=1` skips the podman step of `cargo xtask test`, like `--skip-podman`.
pub const SKIP_ENV: &str = "EPM_SKIP_PODMAN";

/// Whether `EPM_SKIP_PODMAN` asks to skip the podman tests (`1`, `true`, `yes`).
pub fn skip_requested_by_env() -> bool {
    std::env::var(SKIP_ENV).is_ok_and(|v| matches!(v.trim(), "1" | "true" | "yes"))
}

/// Installs what is missing, then runs the podman tests with the debug
/// `ebpf-portmap` (built by the step before). `test_args` go to the test
/// binary after `--ignored --test-threads=1` (e.g. `--nocapture`, a filter).
/// Installs Debian's podman 4 and what the tests run with it, if missing.
pub fn ensure_podman() -> Result<()> {
    crate::setup::ensure_packages("podman", PODMAN_APT_PACKAGES)?;
    let version = crate::cmd::capture(Command::new("podman").arg("--version"))?;
    println!("podman: {}", version.trim());
    if !version.contains("version 4.") {
        bail!(
            "the podman tests need podman 4 (its CNI backend; podman 5 has only netavark), found `{}`",
            version.trim()
        );
    }
    Ok(())
}

pub fn e2e_podman(test_args: &[String]) -> Result<()> {
    ensure_podman()?;
    crate::cmd::run(
        crate::cmd::cargo_workspace("test")
            .args([
                "--test",
                "podman",
                "--",
                "--ignored",
                // The two plugin variants one after the other: each starts
                // eight containers at once, which is load enough for 2 cores.
                "--test-threads=1",
            ])
            .args(test_args)
            .env(crate::plugin::PLUGIN_BIN_ENV, crate::plugin::plugin_bin()),
    )
}
