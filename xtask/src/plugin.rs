//! The plugin binary: its package, target and profiles, where each build
//! lands, and the steps that build it.

use std::path::PathBuf;
use std::process::Command;

use crate::cmd::{capture, cargo, run, target_dir};
use crate::step::Step;

/// The package that builds the `ebpf-portmap` binary (its build.rs builds the eBPF crate).
pub(crate) const PLUGIN_PACKAGE: &str = "portmap-user";
/// The plugin ships as a static musl binary: a container runtime starts it
/// for every ADD and DEL, and glibc's start-up (the dynamic loader, and
/// CPU-feature probing whose `cpuid` instructions trap to the hypervisor on
/// a VM) cost about 0.9 ms of every run on these machines, more than the
/// plugin's own work. Where the target cannot be installed, the plugin is
/// built for the host instead (see [`plugin_target`]).
pub(crate) const PLUGIN_TARGET: &str = "x86_64-unknown-linux-musl";
pub(crate) const PLUGIN_BIN: &str = "ebpf-portmap";
pub(crate) const PLUGIN_BIN_ENV: &str = "EBPF_PORTMAP_BIN";

pub(crate) fn plugin_target_installed() -> bool {
    capture(Command::new("rustup").args(["target", "list", "--installed"]))
        .is_ok_and(|installed| installed.lines().any(|line| line.trim() == PLUGIN_TARGET))
}

/// [`PLUGIN_TARGET`] if its standard library is installed (setup adds it),
/// else `None`: the host's target. Asked once per xtask run, so the build
/// and the binary's path agree.
pub(crate) fn plugin_target() -> Option<&'static str> {
    static INSTALLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    INSTALLED
        .get_or_init(plugin_target_installed)
        .then_some(PLUGIN_TARGET)
}

/// The binary `build_plugin(false)` produces: the debug build, for the
/// host. `cargo test` builds the same binary with the test binaries
/// (portmap-user has integration tests), on the dependencies they share,
/// so `test` builds no debug plugin of its own: a debug build for the
/// shipped target compiled every dependency a second time (75 s of the
/// critical path in a fresh-clone CI run). What ships (static musl,
/// dlmalloc) is what the VM guests, the runtime suites, the tarball and the
/// image run.
pub(crate) fn plugin_bin() -> PathBuf {
    target_dir().join("debug").join(PLUGIN_BIN)
}

/// The binary `build_plugin(true)` produces: the plugin as it ships.
pub(crate) fn shipped_plugin_bin() -> PathBuf {
    shipped_bin_in(target_dir())
}

/// Where a build with [`shipped_build_args`] leaves the plugin in the
/// target directory `dir`.
pub(crate) fn shipped_bin_in(mut dir: PathBuf) -> PathBuf {
    if let Some(target) = plugin_target() {
        dir.push(target);
    }
    dir.join(SHIPPED_PROFILE).join(PLUGIN_BIN)
}

/// How the plugin is built to ship: profile `dist`, for the plugin's
/// target.
pub(crate) fn shipped_build_args(command: &mut Command) {
    command.args(["--profile", SHIPPED_PROFILE]);
    if let Some(target) = plugin_target() {
        command.args(["--target", target]);
    }
}

pub(crate) fn build_plugin_step() -> Step<'static> {
    Step::new(
        format!("cargo build -p {PLUGIN_PACKAGE} (builds {PLUGIN_BIN} with the eBPF object)"),
        || run(&mut build_plugin(false)),
    )
}

/// Cargo profile of the plugin as it ships (see the workspace Cargo.toml).
pub(crate) const SHIPPED_PROFILE: &str = "dist";

/// `cargo build -p portmap-user`: the debug build for the host, or with
/// `shipped` the one that ships (`--profile dist`, for the plugin's target).
pub(crate) fn build_plugin(shipped: bool) -> Command {
    let mut command = cargo();
    command.args(["build", "-p", PLUGIN_PACKAGE]);
    if shipped {
        shipped_build_args(&mut command);
        crate::cmd::without_lints_in_build(&mut command);
    }
    command
}

pub(crate) fn shipped_plugin_step() -> Step<'static> {
    Step::new(shipped_build_name(), || run(&mut build_plugin(true)))
}

/// What the shipped build is called in a verb's steps (a step of its own,
/// or a job beside the steps of `test`).
pub(crate) fn shipped_build_name() -> String {
    format!("cargo build --profile {SHIPPED_PROFILE} -p {PLUGIN_PACKAGE} (the plugin as it ships)")
}
