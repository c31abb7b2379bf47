//! `cargo xtask setup`: every tool the build and the tests need, installed
//! idempotently (one line per step says what it found or did).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::cmd::{capture, cargo_home, path_with_first, run, target_dir};
use crate::plan::Step;
use crate::{PLUGIN_BIN, PLUGIN_TARGET};
use anyhow::{Context, Result, bail};

/// Debian packages the build and the tests need: LLVM 22 for bpf-linker
/// (and the libraries it links), the reference CNI plugins, and the tools the
/// harness and the iptables-based reference plugin call.
pub(crate) const APT_PACKAGES: &[&str] = &[
    "llvm-22-dev",
    "libpolly-22-dev",
    "libzstd-dev",
    "zlib1g-dev",
    "libxml2-dev",
    "containernetworking-plugins",
    "iproute2",
    "iptables",
    "conntrack",
    "bpftool",
    // The security tests stand in for a runtime's port holder with socat and
    // drop capabilities with setpriv (util-linux).
    "socat",
    "util-linux",
    // The deploy tests run install.sh under busybox (the image's shell) and
    // lint it with shellcheck.
    "busybox-static",
    "shellcheck",
    // The agent test scrapes the node agent with a real Prometheus (its own
    // process and config, not the package's service) and checks the
    // exposition with promtool.
    "prometheus",
    // `cargo xtask bench` and portmap-user/tests/program_profile.rs sample
    // the programs with perf to say where their time goes, line by line.
    "linux-perf",
    // tests/tests/pod_scale.rs counts a plugin run's bpf() calls with
    // `strace -c` (aya's calls are not the plugin's to count).
    "strace",
];

/// bpf-linker must match rustc's LLVM major (22). Pinned: 0.13 is the
/// release known to build with `--features llvm-22` on this toolchain.
pub(crate) const BPF_LINKER_VERSION: &str = "0.13.0";

pub(crate) const LLVM_BIN_DIR: &str = "/usr/lib/llvm-22/bin";

pub(crate) const BPFFS_MOUNT: &str = "/sys/fs/bpf";

/// kubernetes-validate (PyPI) bundles the Kubernetes OpenAPI schemas, so it
/// validates offline. Installed into a venv under the target directory.
pub(crate) const KUBERNETES_VALIDATE: &str = "kubernetes-validate";

pub(crate) const KUBERNETES_VALIDATE_VERSION: &str = "1.37.0";

pub(crate) fn setup_steps() -> Vec<Step<'static>> {
    vec![
        Step::new("Debian packages", ensure_apt_packages),
        Step::new("nightly toolchain", ensure_nightly),
        Step::new("rust-src for nightly", ensure_rust_src),
        Step::new("clippy and rustfmt", ensure_lint_components),
        Step::new("bpf-linker", ensure_bpf_linker),
        Step::new("musl target for the plugin", ensure_plugin_target),
        Step::new("bpffs mount", ensure_bpffs),
        Step::new("kubernetes-validate", ensure_kubernetes_validate),
    ]
}

/// Every setup step; each prints its own one-line outcome.
pub(crate) fn setup() -> Result<()> {
    for step in setup_steps() {
        (step.run)().with_context(|| format!("setup: {}", step.name))?;
    }
    Ok(())
}

/// `setup` as one step of another verb.
pub(crate) fn setup_step() -> Step<'static> {
    Step::new("setup", setup)
}

pub(crate) fn ensure_apt_packages() -> Result<()> {
    ensure_packages("setup", APT_PACKAGES)
}

/// Installs whichever of `packages` dpkg does not list as installed
/// (`apt-get update` first), one line when there is nothing to do; `label`
/// starts each line.
pub(crate) fn ensure_packages(label: &str, packages: &[&str]) -> Result<()> {
    let missing: Vec<&str> = packages
        .iter()
        .copied()
        .filter(|p| !dpkg_installed(p))
        .collect();
    if missing.is_empty() {
        println!(
            "{label}: Debian packages present ({}), skipping",
            packages.join(" ")
        );
        return Ok(());
    }
    println!(
        "{label}: apt-get update (missing: {}) ...",
        missing.join(" ")
    );
    run(apt_get().arg("update"))?;
    println!("{label}: installing {} ...", missing.join(" "));
    run(apt_get()
        .args(["install", "-y", "--no-install-recommends"])
        .args(&missing))?;
    let still_missing: Vec<&str> = missing.into_iter().filter(|p| !dpkg_installed(p)).collect();
    if !still_missing.is_empty() {
        bail!(
            "apt-get install did not install {}",
            still_missing.join(" ")
        );
    }
    Ok(())
}

pub(crate) fn apt_get() -> Command {
    let mut command = Command::new("apt-get");
    command.env("DEBIAN_FRONTEND", "noninteractive");
    command
}

pub(crate) fn dpkg_installed(package: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", package])
        .stderr(Stdio::null())
        .output()
        .is_ok_and(|out| {
            out.status.success()
                && String::from_utf8_lossy(&out.stdout).trim() == "install ok installed"
        })
}

pub(crate) fn ensure_nightly() -> Result<()> {
    let installed = capture(Command::new("rustup").args(["toolchain", "list"]))?;
    if installed
        .lines()
        .any(|line| line.starts_with("nightly-") || line.starts_with("nightly "))
    {
        println!("setup: nightly toolchain present, skipping");
        return Ok(());
    }
    println!("setup: installing the nightly toolchain (rustup, minimal profile) ...");
    run(Command::new("rustup").args(["toolchain", "install", "nightly", "--profile", "minimal"]))
}

pub(crate) fn ensure_rust_src() -> Result<()> {
    ensure_component(
        "nightly",
        "rust-src",
        "the eBPF build uses -Z build-std=core",
    )
}

/// The lint steps of `test`: clippy and rustfmt on the default toolchain,
/// clippy on nightly for the eBPF crate (a minimal nightly has none).
pub(crate) fn ensure_lint_components() -> Result<()> {
    let default = capture(Command::new("rustup").args(["show", "active-toolchain"]))?;
    let default = default
        .split_whitespace()
        .next()
        .unwrap_or("stable")
        .to_owned();
    ensure_component(&default, "clippy", "the lint step")?;
    ensure_component(&default, "rustfmt", "the format check")?;
    ensure_component("nightly", "clippy", "the eBPF crate's lint step")
}

/// `rustup component add COMPONENT --toolchain TOOLCHAIN` unless installed.
pub(crate) fn ensure_component(toolchain: &str, component: &str, why: &str) -> Result<()> {
    let installed = capture(Command::new("rustup").args([
        "component",
        "list",
        "--toolchain",
        toolchain,
        "--installed",
    ]))?;
    if installed
        .lines()
        .any(|line| line.trim() == component || line.starts_with(&format!("{component}-")))
    {
        println!("setup: {component} for {toolchain} present, skipping");
        return Ok(());
    }
    println!("setup: adding {component} to {toolchain} ({why}) ...");
    run(Command::new("rustup").args(["component", "add", component, "--toolchain", toolchain]))
}

pub(crate) fn ensure_bpf_linker() -> Result<()> {
    for candidate in [
        PathBuf::from("bpf-linker"),
        cargo_home().join("bin/bpf-linker"),
    ] {
        if let Ok(version) = capture(Command::new(&candidate).arg("--version")) {
            println!("setup: bpf-linker present ({}), skipping", version.trim());
            return Ok(());
        }
    }
    println!(
        "setup: installing bpf-linker {BPF_LINKER_VERSION} for LLVM 22 (cargo install, takes 1-3 min; {LLVM_BIN_DIR} first on PATH) ..."
    );
    run(Command::new("cargo")
        .args([
            "install",
            "bpf-linker",
            "--locked",
            "--version",
            BPF_LINKER_VERSION,
        ])
        .args(["--no-default-features", "--features", "llvm-22"])
        .env("PATH", path_with_first(Path::new(LLVM_BIN_DIR))?))
}

pub(crate) fn ensure_plugin_target() -> Result<()> {
    if plugin_target_installed() {
        println!("setup: Rust target {PLUGIN_TARGET} present, skipping");
        return Ok(());
    }
    println!("setup: adding the Rust target {PLUGIN_TARGET} (the plugin ships static) ...");
    if let Err(error) = run(Command::new("rustup").args(["target", "add", PLUGIN_TARGET])) {
        // Not fatal: the plugin then builds for the host, and only its
        // start-up is slower.
        println!(
            "setup: WARNING: {error:#}; {PLUGIN_BIN} is built for the host instead (dynamic glibc, about 0.9 ms slower per run)"
        );
    }
    Ok(())
}

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

pub(crate) fn ensure_bpffs() -> Result<()> {
    let mounts =
        std::fs::read_to_string("/proc/self/mounts").context("reading /proc/self/mounts")?;
    let mounted = mounts.lines().any(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        fields.get(1) == Some(&BPFFS_MOUNT) && fields.get(2) == Some(&"bpf")
    });
    if mounted {
        println!("setup: bpffs mounted at {BPFFS_MOUNT}, skipping");
        return Ok(());
    }
    println!("setup: mounting bpffs at {BPFFS_MOUNT} ...");
    run(Command::new("mount").args(["-t", "bpf", "bpf", BPFFS_MOUNT]))
}

pub(crate) fn validator_venv() -> PathBuf {
    target_dir().join("tools").join(KUBERNETES_VALIDATE)
}

pub(crate) fn validator_bin() -> PathBuf {
    validator_venv().join("bin").join(KUBERNETES_VALIDATE)
}

pub(crate) fn ensure_kubernetes_validate() -> Result<()> {
    let venv = validator_venv();
    if let Ok(version) = capture(Command::new(validator_bin()).arg("--version"))
        && version.trim() == KUBERNETES_VALIDATE_VERSION
    {
        println!(
            "setup: {KUBERNETES_VALIDATE} {KUBERNETES_VALIDATE_VERSION} present ({}), skipping",
            venv.display()
        );
        return Ok(());
    }
    println!(
        "setup: installing {KUBERNETES_VALIDATE} {KUBERNETES_VALIDATE_VERSION} into a venv at {} (pip) ...",
        venv.display()
    );
    let python = venv.join("bin/python");
    if !python.exists() {
        let create = || run(Command::new("python3").args(["-m", "venv"]).arg(&venv));
        if create().is_err() {
            // Debian's python3 makes venvs only with python3-venv.
            println!("setup: python3 -m venv failed; installing python3-venv ...");
            let _ = std::fs::remove_dir_all(&venv);
            run(apt_get().arg("update"))?;
            run(apt_get().args(["install", "-y", "--no-install-recommends", "python3-venv"]))?;
            create()?;
        }
    }
    run(Command::new(&python)
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
        ])
        .arg(format!(
            "{KUBERNETES_VALIDATE}=={KUBERNETES_VALIDATE_VERSION}"
        )))
}
