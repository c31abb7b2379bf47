//! `cargo xtask e2e-containerd`: ebpf-portmap on Kubernetes' own path.
//!
//! Installs Debian's containerd (1.6 on Debian 12, with its CRI plugin) and
//! runc, the reference CNI plugins, busybox-static and a C compiler for the
//! static `pause`, then runs the `#[ignore]`d tests of
//! `tests/tests/containerd.rs` one after the other: pods with hostPorts,
//! driven through the CRI gRPC API as a kubelet drives them, through a
//! minimal drop-in conflist with `ebpf-portmap`, then with the upstream
//! `portmap` as the reference (see that file for what is checked).
//! containerd runs inside a test-owned network namespace with its own root,
//! state, socket, CNI directories, private mount namespace and bpffs;
//! nothing of the machine's containerd state is used.

use std::process::Command;

use anyhow::Result;

use crate::plan::Step;

/// Debian packages the containerd tests need on top of `setup`'s:
/// containerd and runc, the reference plugins (bridge, host-local,
/// loopback, portmap), busybox-static for the image, gcc and libc6-dev for
/// the static `pause`, iptables for the upstream plugin, util-linux for
/// nsenter/unshare, curl for the Kubernetes conformance checks (run from
/// the node with `curl`, as that test runs them).
pub const CONTAINERD_APT_PACKAGES: &[&str] = &[
    "containerd",
    "runc",
    "containernetworking-plugins",
    "busybox-static",
    "gcc",
    "libc6-dev",
    "iptables",
    "util-linux",
    "curl",
];

/// `EPM_SKIP_CONTAINERD=1` skips the containerd step of `cargo xtask test`,
/// like `--skip-containerd`.
pub const SKIP_ENV: &str = "EPM_SKIP_CONTAINERD";

/// Whether `EPM_SKIP_CONTAINERD` asks to skip the containerd tests (`1`, `true`, `yes`).
pub fn skip_requested_by_env() -> bool {
    std::env::var(SKIP_ENV).is_ok_and(|v| matches!(v.trim(), "1" | "true" | "yes"))
}

/// Installs what is missing, then runs the containerd tests with the debug
/// `ebpf-portmap` (built by the step before). `test_args` go to the test
/// binary after `--ignored --test-threads=1` (e.g. `--nocapture`, a filter).
pub fn e2e_containerd(test_args: &[String]) -> Result<()> {
    crate::setup::ensure_packages("containerd", CONTAINERD_APT_PACKAGES)?;
    let version = crate::cmd::capture(Command::new("containerd").arg("--version"))?;
    println!("containerd: {}", version.trim());
    crate::cmd::run(
        crate::cmd::cargo_workspace("test")
            .args([
                "--test",
                "containerd",
                "--",
                "--ignored",
                // One containerd at a time: each test starts eight pods at
                // once, which is load enough for 2 cores.
                "--test-threads=1",
            ])
            .args(test_args)
            .env(crate::PLUGIN_BIN_ENV, crate::cmd::plugin_bin()),
    )
}

/// The containerd tests as a step of `test`, or a step saying why they are
/// skipped.
pub fn test_step(skip: bool) -> Step<'static> {
    let name = "containerd (CRI) end to end, ebpf-portmap and upstream portmap (cargo xtask e2e-containerd)";
    let reason = if skip {
        Some("--skip-containerd")
    } else if skip_requested_by_env() {
        Some("EPM_SKIP_CONTAINERD is set")
    } else {
        None
    };
    match reason {
        Some(reason) => Step::new(name, move || {
            println!("xtask test: containerd tests skipped ({reason})");
            Ok(())
        }),
        None => Step::new(name, || e2e_containerd(&[])),
    }
}

/// The steps of `cargo xtask e2e-containerd`.
pub fn steps(test_args: &[String]) -> Vec<Step<'_>> {
    vec![
        crate::setup::setup_step(),
        crate::plan::build_plugin_step(),
        Step::new(
            "containerd end to end: ebpf-portmap, then upstream portmap",
            move || e2e_containerd(test_args),
        ),
    ]
}
