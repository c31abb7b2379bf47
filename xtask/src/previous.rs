//! The previous release's plugin, for the in-place upgrade test
//! (`tests/tests/upgrade.rs`): ADD with the old binary, then run the new one
//! against the same pins.
//!
//! The release is a commit of this repository. Its tree is exported with
//! `git archive` into `target/previous/{commit}/src` and built there, the
//! way the release itself was built and shipped (its own Cargo.lock and
//! build.rs, profile `dist`, the shipped target), with its binary in a
//! target directory of its own next to it but its dependencies built in
//! this checkout's build directory (`build.build-dir`, cargo 1.91), and its
//! eBPF programs on the `core` and aya-ebpf of this checkout's eBPF build:
//! the crates both lock files name at the same version and features are
//! the shipped build's, compiled once. After the shipped build, the build
//! compiles 8 crates and links with fat LTO (61 s on this project's 2-core
//! VM, quiet), where its own target directory compiled every dependency
//! again (847 s beside the steps, at the lowest priority, in a CI run
//! before). `cargo xtask test` runs it beside its steps (`cargo xtask
//! previous --after MARKER`) and the upgrade test near the end. Its own
//! workspace crates live at other paths, so they never overwrite this
//! checkout's. Everything stays, so a repeated run costs one no-op `cargo
//! build`.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

use crate::cmd::{cargo, run, target_dir, workspace_root};
use crate::plugin::{PLUGIN_BIN, PLUGIN_PACKAGE, shipped_bin_in, shipped_build_args};

/// The previous release: main at the last commit before the owner record
/// gained pod identity.
pub const COMMIT: &str = "df8d2050781763f11a17d004e48d2b346c1851c9";

/// Where the test finds the previous release's binary.
pub const BIN_ENV: &str = "EPM_PREVIOUS_BIN";

/// Set by `cargo xtask test`: the upgrade test must then fail, not skip,
/// when [`BIN_ENV`] is missing.
pub const REQUIRED_ENV: &str = "EPM_REQUIRE_PREVIOUS_BIN";

/// `target/previous/{commit}`: the exported tree and its build.
fn root() -> PathBuf {
    target_dir().join("previous").join(COMMIT)
}

/// The binary [`build_command`] produces.
pub fn bin() -> PathBuf {
    shipped_bin_in(root().join("target"))
}

/// Exports the previous release (once) and returns the `cargo build` of its
/// plugin. It locks the shipped build's directory in this checkout's build
/// directory (the same profile and target) while it runs, so `cargo xtask
/// test` starts it once the shipped build is done.
pub fn build_command() -> Result<Command> {
    let workspace = workspace_root();
    let present = Command::new("git")
        .args(["cat-file", "-e", &format!("{COMMIT}^{{commit}}")])
        .current_dir(&workspace)
        .stderr(Stdio::null())
        .status()
        .context("could not run git")?
        .success();
    if !present {
        bail!(
            "commit {COMMIT} (the previous release, needed by the upgrade test) is not in this \
             clone; fetch the full history (`git fetch --unshallow`, or clone without --depth)"
        );
    }
    let source = root().join("src");
    // The marker is written last: a half-exported tree is exported again.
    let marker = root().join("exported");
    if !marker.exists() {
        if source.exists() {
            std::fs::remove_dir_all(&source)
                .with_context(|| format!("removing {}", source.display()))?;
        }
        std::fs::create_dir_all(&source)
            .with_context(|| format!("creating {}", source.display()))?;
        let archive = root().join("src.tar");
        run(Command::new("git")
            .args(["archive", "--format=tar", "-o"])
            .arg(&archive)
            .arg(COMMIT)
            .current_dir(&workspace))?;
        run(Command::new("tar")
            .arg("-xf")
            .arg(&archive)
            .arg("-C")
            .arg(&source))?;
        let _ = std::fs::remove_file(&archive);
        std::fs::write(&marker, COMMIT).with_context(|| format!("writing {}", marker.display()))?;
    }
    let mut build = cargo();
    build
        .current_dir(&source)
        .args([
            "build",
            "--locked",
            "-p",
            PLUGIN_PACKAGE,
            "--bin",
            PLUGIN_BIN,
        ])
        .env("CARGO_TARGET_DIR", root().join("target"))
        // The build directory of this build on the command line, and of the
        // eBPF build its build.rs runs (aya-build's own cargo, which gets
        // the environment, not the arguments) in the environment: the one
        // this checkout's eBPF builds use (build-support/shared_ebpf.rs), so
        // `core` and aya-ebpf, built there already, are not compiled again.
        .arg("--config")
        .arg(format!(
            "build.build-dir={:?}",
            target_dir().display().to_string()
        ))
        .env("CARGO_BUILD_BUILD_DIR", ebpf_build_dir());
    shipped_build_args(&mut build);
    // An older release is not held to today's lints.
    crate::cmd::without_lints_in_build(&mut build);
    Ok(build)
}

/// The build directory every eBPF build of this checkout uses (see
/// build-support/shared_ebpf.rs).
fn ebpf_build_dir() -> PathBuf {
    target_dir().join("ebpf-build").join("build")
}

/// Fails if the build did not leave the binary where the test looks.
pub fn check_built() -> Result<()> {
    if !bin().exists() {
        bail!("building {COMMIT} did not produce {}", bin().display());
    }
    Ok(())
}
