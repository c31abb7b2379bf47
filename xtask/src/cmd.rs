//! Running commands and finding the workspace's paths: what every step uses.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

/// The workspace root (xtask lives one level below it).
pub(crate) fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask/ has a parent")
        .to_path_buf()
}

pub(crate) fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) if !dir.is_empty() => workspace_root().join(dir),
        _ => workspace_root().join("target"),
    }
}

pub(crate) fn cargo_home() -> PathBuf {
    match std::env::var_os("CARGO_HOME") {
        Some(home) if !home.is_empty() => PathBuf::from(home),
        _ => {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into())).join(".cargo")
        }
    }
}

/// A `cargo` command run from the workspace root (the cargo that runs xtask).
pub(crate) fn cargo() -> Command {
    let mut command = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    command.current_dir(workspace_root());
    command
}

/// `cargo <verb>` (`test`, `run`) over the workspace's default members, for
/// the caller to narrow with `--test`/`--bin`, never with `-p`. Cargo
/// resolves features for the packages a command selects: `-p portmap-tests`
/// alone resolves portmap-common, tokio and the rest with fewer features
/// than plain `cargo test` does, so it builds a second copy of each of them
/// and of every test binary that links them. On a CI machine with a small
/// disk those copies ran it out of space.
pub(crate) fn cargo_workspace(verb: &str) -> Command {
    let mut command = cargo();
    command.arg(verb);
    command
}

pub(crate) fn path_with_first(dir: &Path) -> Result<OsString> {
    let current = std::env::var_os("PATH").unwrap_or_default();
    let paths = std::iter::once(dir.to_path_buf()).chain(std::env::split_paths(&current));
    std::env::join_paths(paths).context("building PATH")
}

/// Runs a command with inherited stdio; an error if it cannot start or fails.
pub(crate) fn run(command: &mut Command) -> Result<()> {
    let shown = show(command);
    println!("+ {shown}");
    let status = command
        .status()
        .with_context(|| format!("could not start `{shown}`"))?;
    if !status.success() {
        bail!("`{shown}` failed ({status})");
    }
    Ok(())
}

/// Runs a command and returns its stdout; an error if it cannot start or fails.
pub(crate) fn capture(command: &mut Command) -> Result<String> {
    let shown = show(command);
    let out = command
        .stderr(Stdio::null())
        .output()
        .with_context(|| format!("could not start `{shown}`"))?;
    if !out.status.success() {
        bail!("`{shown}` failed ({})", out.status);
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

pub(crate) fn show(command: &Command) -> String {
    std::iter::once(command.get_program())
        .chain(command.get_args())
        .map(|part| part.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The variables that make cargo build the workspace's own crates with
/// clippy-driver, `cargo clippy`'s wrapper of rustc, and hand it clippy's
/// arguments: what `cargo clippy` sets for its `cargo check`.
const LINT_VARS: [&str; 2] = ["RUSTC_WORKSPACE_WRAPPER", "CLIPPY_ARGS"];

/// `cargo xtask test` lints the default members as its debug build
/// compiles them, instead of in a `cargo clippy --all-targets` of their
/// own: clippy-driver runs rustc with clippy's lints added, for the
/// workspace's crates only, so the one build both compiles and lints them
/// (`-D warnings`: a lint fails the build, as it failed the clippy step).
/// The separate check compiled every dependency once more (105 s of CPU
/// on a fresh clone, measured, in a run that is CPU-bound on 2 cores); the lints
/// add about 4 s to the build. Every debug `cargo` of the run (the tests,
/// the VMs' `cargo test --no-run`, the runtime suites) inherits the
/// variables, so their builds stay fresh; the shipped and previous
/// builds drop them ([`without_lints_in_build`]). A plain `cargo build`
/// afterwards compiles the workspace's crates again (cargo fingerprints
/// the wrapper), once. Called before any thread starts.
pub(crate) fn lint_within_builds() {
    let driver = std::env::var_os("CARGO")
        .map(PathBuf::from)
        .and_then(|cargo| cargo.parent().map(|bin| bin.join("clippy-driver")))
        .unwrap_or_else(|| PathBuf::from("clippy-driver"));
    // SAFETY: called first in `main`'s `test` arm, before xtask starts a
    // thread; nothing reads the environment meanwhile.
    unsafe {
        std::env::set_var(LINT_VARS[0], driver);
        std::env::set_var(
            LINT_VARS[1],
            "-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__",
        );
    }
}

/// `command` without [`lint_within_builds`]'s variables: builds that are
/// not the linted debug build (the shipped plugin, an older release).
pub(crate) fn without_lints_in_build(command: &mut Command) -> &mut Command {
    for variable in LINT_VARS {
        command.env_remove(variable);
    }
    command
}
