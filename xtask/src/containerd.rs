//! `cargo xtask e2e-containerd`: ebpf-portmap on Kubernetes' own path.
//!
//! Installs Debian's containerd (1.6 on Debian 12, with its CRI plugin) and
//! runc, the reference CNI plugins, busybox-static and a C compiler for the
//! static `pause`, then runs the `#[ignore]`d tests of
//! `tests/tests/containerd.rs` one after the other, twice: on that
//! containerd 1.6 with the plugins 1.1, then on containerd 2.x with the
//! plugins 1.9 that `setup` unpacked from Debian unstable (the same binary,
//! `EPM_CONTAINERD_ROOT` naming them; `cniVersion` 1.1.0, so STATUS too,
//! with Debian 12's runc). Pods with hostPorts,
//! driven through the CRI gRPC API as a kubelet drives them, through a
//! minimal drop-in conflist with `ebpf-portmap`, then with the upstream
//! `portmap` as the reference (see that file for what is checked).
//! containerd runs inside a test-owned network namespace with its own root,
//! state, socket, CNI directories, private mount namespace and bpffs;
//! nothing of the machine's containerd state is used.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use anyhow::Result;

use crate::step::Step;

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

/// Names the unpacked containerd 2.x for the tests (see
/// `portmap_tests::containerd::Runtime`).
pub const RUNTIME_ROOT_ENV: &str = "EPM_CONTAINERD_ROOT";

/// Installs Debian's containerd and runc and what the tests run with them,
/// if missing.
pub fn ensure_packages() -> Result<()> {
    crate::setup::ensure_packages("containerd", CONTAINERD_APT_PACKAGES)
}

/// Installs what is missing, then runs the containerd tests with the debug
/// `ebpf-portmap` (built by the step before): on the machine's containerd,
/// then on the unpacked containerd 2.x (or says why not). `test_args` go to
/// the test binary after `--ignored --test-threads=1` (e.g. `--nocapture`,
/// a filter). Both passes run; the first failure is returned.
pub fn e2e_containerd(test_args: &[String]) -> Result<()> {
    ensure_packages()?;
    let version = crate::cmd::capture(Command::new("containerd").arg("--version"))?;
    let mut outcomes = Vec::new();
    let started = Instant::now();
    let system = run_suite(test_args, None);
    outcomes.push(format!(
        "{}: {} in {:.0}s",
        version.trim(),
        verdict(&system),
        started.elapsed().as_secs_f64()
    ));
    let root = crate::setup::unstable_root();
    let unstable = match crate::setup::unstable_root_ready(&root) {
        Some(found) => {
            let started = Instant::now();
            let outcome = run_suite(test_args, Some(&root));
            outcomes.push(format!(
                "{found} (Debian unstable): {} in {:.0}s",
                verdict(&outcome),
                started.elapsed().as_secs_f64()
            ));
            outcome
        }
        None => {
            outcomes.push(format!(
                "containerd 2.x: SKIPPED, nothing usable in {} (`cargo xtask setup` says why)",
                root.display()
            ));
            Ok(())
        }
    };
    println!("containerd passes:\n  {}", outcomes.join("\n  "));
    system.and(unstable)
}

fn verdict(outcome: &Result<()>) -> &'static str {
    if outcome.is_ok() { "passed" } else { "FAILED" }
}

/// The containerd test binary once, on the unpacked containerd under
/// `root` if given.
fn run_suite(test_args: &[String], root: Option<&Path>) -> Result<()> {
    let mut command = crate::cmd::cargo_workspace("test");
    command
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
        .env(crate::plugin::PLUGIN_BIN_ENV, crate::plugin::plugin_bin());
    match root {
        Some(root) => command.env(RUNTIME_ROOT_ENV, root),
        None => command.env_remove(RUNTIME_ROOT_ENV),
    };
    crate::cmd::run(&mut command)
}

/// The containerd tests as a step of `test`, or a step saying why they are
/// skipped.
pub fn test_step(skip: bool) -> Step<'static> {
    let name = "containerd (CRI) end to end on 1.6 and 2.x, ebpf-portmap and upstream portmap (cargo xtask e2e-containerd)";
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
        crate::plugin::build_plugin_step(),
        Step::new(
            "containerd end to end on 1.6 and 2.x: ebpf-portmap, then upstream portmap",
            move || e2e_containerd(test_args),
        ),
    ]
}
