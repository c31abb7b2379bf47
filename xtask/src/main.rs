//! Build, test, demo and bench driver: `cargo xtask <setup|test|demo|bench>`.
//!
//! Depends on pure-Rust crates only (anyhow, clap, serde_json), so it builds on a fresh machine
//! before LLVM and bpf-linker are installed (`setup` installs them).
//!
//! - `setup`: idempotently installs the Debian packages, the nightly toolchain
//!   with rust-src, bpf-linker, the musl target the plugin ships for and
//!   kubernetes-validate, and mounts bpffs; one line per step.
//! - `test [-- <cargo test args>]`: setup, build `ebpf-portmap`, validate the
//!   Kubernetes manifests, run the tests (the traffic suites twice, the second
//!   time with `fastPath`), then the podman end-to-end tests
//!   (`--skip-podman`), the containerd ones (`--skip-containerd`) and the
//!   VM tests (`--skip-vm`).
//! - `e2e-podman [-- <test args>]`: setup, build `ebpf-portmap`, install
//!   podman, run podman with `ebpf-portmap` and with upstream `portmap`.
//! - `e2e-containerd [-- <test args>]`: the same with containerd's CRI.
//! - `bench [-- <bench args>]`: setup, build `ebpf-portmap` as it ships and
//!   the bench in release, run the benchmark against iptables portmap and the
//!   direct path.
//! - `dist`: setup, build the plugin as it ships, write the release tarball
//!   `target/dist/ebpf-portmap-<version>-x86_64-linux.tar.gz` (see `dist.rs`).
//! - `image`: `dist`, then the installer image built from the tarball with
//!   podman, saved as an OCI archive (see `image.rs`).
//! - `demo [-- <demo args>]`: setup, build `ebpf-portmap`, run the demo
//!   (`cargo xtask demo -- --plugin portmap` runs it against upstream portmap).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};

mod containerd;
mod dist;
mod image;
mod podman;
mod previous;
mod vm;

/// Debian packages the build and the tests need: LLVM 22 for bpf-linker
/// (and the libraries it links), the reference CNI plugins, and the tools the
/// harness and the iptables-based reference plugin call.
const APT_PACKAGES: &[&str] = &[
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
];

/// bpf-linker must match rustc's LLVM major (22). Pinned: 0.13 is the
/// release known to build with `--features llvm-22` on this toolchain.
const BPF_LINKER_VERSION: &str = "0.13.0";
const LLVM_BIN_DIR: &str = "/usr/lib/llvm-22/bin";
const BPFFS_MOUNT: &str = "/sys/fs/bpf";
/// The package that builds the `ebpf-portmap` binary (its build.rs builds the eBPF crate).
const PLUGIN_PACKAGE: &str = "portmap-user";
/// The plugin ships as a static musl binary: a container runtime starts it
/// for every ADD and DEL, and glibc's start-up (the dynamic loader, and
/// CPU-feature probing whose `cpuid` instructions trap to the hypervisor on
/// a VM) cost about 0.9 ms of every run on these machines, more than the
/// plugin's own work. Where the target cannot be installed, the plugin is
/// built for the host instead (see [`plugin_target`]).
const PLUGIN_TARGET: &str = "x86_64-unknown-linux-musl";
const PLUGIN_BIN: &str = "ebpf-portmap";
const PLUGIN_BIN_ENV: &str = "EBPF_PORTMAP_BIN";

/// The Kubernetes manifests, checked against the API schemas.
const MANIFESTS: &[&str] = &["deploy/daemonset.yaml"];
/// kubernetes-validate (PyPI) bundles the Kubernetes OpenAPI schemas, so it
/// validates offline. Installed into a venv under the target directory.
const KUBERNETES_VALIDATE: &str = "kubernetes-validate";
const KUBERNETES_VALIDATE_VERSION: &str = "1.37.0";
/// Every Kubernetes version that release bundles schemas for: the manifests
/// must be valid for all of them.
const KUBERNETES_VERSIONS: &[&str] = &[
    "1.25.0", "1.26.0", "1.27.0", "1.28.0", "1.29.0", "1.30.0", "1.31.0", "1.32.0", "1.33.0",
    "1.34.0", "1.35.0", "1.36.0", "1.37.0",
];

#[derive(Debug, Parser)]
#[command(
    name = "xtask",
    bin_name = "cargo xtask",
    about = "Build, test and demo driver for ebpf-portmap"
)]
struct Cli {
    #[command(subcommand)]
    command: Verb,
}

#[derive(Debug, Subcommand)]
enum Verb {
    /// Install what is missing: Debian packages, nightly + rust-src, bpf-linker, bpffs mount,
    /// kubernetes-validate.
    Setup,
    /// Setup, build ebpf-portmap, validate deploy/*.yaml against the Kubernetes
    /// API schemas, then `cargo test` with EBPF_PORTMAP_BIN set.
    /// Arguments after `--` go to `cargo test` (e.g. `-- -p portmap-tests -- --nocapture`).
    /// Then podman end to end (`e2e-podman`) unless `--skip-podman` or
    /// EPM_SKIP_PODMAN=1, containerd end to end (`e2e-containerd`) unless
    /// `--skip-containerd` or EPM_SKIP_CONTAINERD=1, and the VM tests on Debian 6.1 and 6.12 kernels
    /// (`vm-test`) unless `--skip-vm` or EPM_SKIP_VM=1.
    Test {
        /// Skip the VM tests on older kernels (also: EPM_SKIP_VM=1).
        #[arg(long)]
        skip_vm: bool,
        /// Skip the podman end-to-end tests (also: EPM_SKIP_PODMAN=1).
        #[arg(long)]
        skip_podman: bool,
        /// Skip the containerd end-to-end tests (also: EPM_SKIP_CONTAINERD=1).
        #[arg(long)]
        skip_containerd: bool,
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        cargo_test_args: Vec<String>,
    },
    /// Setup, build ebpf-portmap, install Debian's podman 4.3, then run podman
    /// (CNI backend, in a test-owned network namespace) publishing ports
    /// through ebpf-portmap and through upstream portmap. Arguments after
    /// `--` go to the test binary (e.g. `-- --nocapture`).
    E2ePodman {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        test_args: Vec<String>,
    },
    /// Setup, build ebpf-portmap, install Debian's containerd and runc, then
    /// drive containerd's CRI (in a test-owned network namespace) to run pods
    /// with hostPorts through ebpf-portmap and through upstream portmap.
    /// Arguments after `--` go to the test binary (e.g. `-- --nocapture`).
    E2eContainerd {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        test_args: Vec<String>,
    },
    /// Setup, build ebpf-portmap as it ships (profile dist, static musl), then write the
    /// release tarball target/dist/ebpf-portmap-<version>-x86_64-linux.tar.gz: the binary,
    /// shell completions, man pages, deploy/ with the image tag set to the version, LICENSE
    /// and SHA256SUMS.
    Dist,
    /// `dist`, then build the node installer image from the tarball with podman (a busybox
    /// base made locally, no registry) and save it as target/dist/ebpf-portmap-<version>-image.tar
    /// (an OCI archive for `podman load -i`, `docker load -i`, `kind load image-archive`).
    Image,
    /// Boot Debian kernels in QEMU (TCG) and run the integration tests inside:
    /// `cargo xtask vm-test [--kernel 6.1] [--kernel 6.12]`.
    VmTest(vm::VmTestArgs),
    /// Setup, build ebpf-portmap, then run the demo. Arguments after `--` go to
    /// the demo (e.g. `-- --plugin portmap` for the upstream plugin).
    Demo {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        demo_args: Vec<String>,
    },
    /// Setup, build ebpf-portmap as it ships and the bench in release, then benchmark it
    /// against iptables portmap and the direct path (6-9 minutes; writes
    /// bench/results/<date>.{json,md,*.svg}). Arguments after `--` go to the
    /// bench (e.g. `-- --quick`, `-- --help`).
    Bench {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        bench_args: Vec<String>,
    },
}

/// One named step of a verb. Verbs are plain lists of steps, so adding one
/// (eBPF clippy, VM tests on older kernels, ...) is adding an entry.
struct Step<'a> {
    name: String,
    run: Box<dyn Fn() -> Result<()> + 'a>,
}

impl<'a> Step<'a> {
    fn new(name: impl Into<String>, run: impl Fn() -> Result<()> + 'a) -> Step<'a> {
        Step {
            name: name.into(),
            run: Box::new(run),
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let outcome = match &cli.command {
        Verb::Setup => setup(),
        Verb::Test {
            skip_vm,
            skip_podman,
            skip_containerd,
            cargo_test_args,
        } => run_steps(
            "test",
            test_steps(cargo_test_args, *skip_vm, *skip_podman, *skip_containerd),
        ),
        Verb::E2ePodman { test_args } => run_steps("e2e-podman", e2e_podman_steps(test_args)),
        Verb::E2eContainerd { test_args } => {
            run_steps("e2e-containerd", containerd::steps(test_args))
        }
        Verb::Dist => run_steps("dist", dist_steps()),
        Verb::Image => run_steps("image", image_steps()),
        Verb::VmTest(args) => run_steps("vm-test", vm_test_steps(args)),
        Verb::Demo { demo_args } => run_steps("demo", demo_steps(demo_args)),
        Verb::Bench { bench_args } => run_steps("bench", bench_steps(bench_args)),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run_steps(verb: &str, steps: Vec<Step<'_>>) -> Result<()> {
    let total = steps.len();
    let started = Instant::now();
    for (index, step) in steps.iter().enumerate() {
        let number = index + 1;
        println!("xtask {verb}: step {number}/{total}: {}", step.name);
        let step_started = Instant::now();
        (step.run)()
            .with_context(|| format!("{verb} step {number}/{total} ({}) failed", step.name))?;
        println!(
            "xtask {verb}: step {number}/{total} done in {:.1}s",
            step_started.elapsed().as_secs_f64()
        );
    }
    println!(
        "xtask {verb}: all {total} steps passed in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn setup_steps() -> Vec<Step<'static>> {
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
fn setup() -> Result<()> {
    for step in setup_steps() {
        (step.run)().with_context(|| format!("setup: {}", step.name))?;
    }
    Ok(())
}

/// `setup` as one step of another verb.
fn setup_step() -> Step<'static> {
    Step::new("setup", setup)
}

fn build_plugin_step() -> Step<'static> {
    Step::new(
        format!("cargo build -p {PLUGIN_PACKAGE} (builds {PLUGIN_BIN} with the eBPF object)"),
        || run(&mut build_plugin(false)),
    )
}

/// Cargo profile of the plugin as it ships (see the workspace Cargo.toml).
const SHIPPED_PROFILE: &str = "dist";

/// `cargo build [--profile dist] -p portmap-user`, for the plugin's target:
/// the debug build, or with `shipped` the one that ships.
fn build_plugin(shipped: bool) -> Command {
    let mut command = cargo();
    command.args(["build", "-p", PLUGIN_PACKAGE]);
    if shipped {
        command.args(["--profile", SHIPPED_PROFILE]);
    }
    if let Some(target) = plugin_target() {
        command.args(["--target", target]);
    }
    command
}

fn test_steps(
    cargo_test_args: &[String],
    skip_vm: bool,
    skip_podman: bool,
    skip_containerd: bool,
) -> Vec<Step<'_>> {
    vec![
        setup_step(),
        Step::new("cargo fmt --all --check", || {
            run(cargo().args(["fmt", "--all", "--check"]))
        }),
        Step::new(
            "cargo clippy --all-targets -- -D warnings (default members)",
            || run(cargo().args(["clippy", "--all-targets", "--", "-D", "warnings"])),
        ),
        Step::new(
            "cargo +nightly clippy -p portmap-ebpf --target bpfel-unknown-none -- -D warnings",
            clippy_ebpf,
        ),
        build_plugin_step(),
        Step::new(
            format!(
                "Kubernetes manifests against the API schemas of {} to {} (kubernetes-validate --strict)",
                KUBERNETES_VERSIONS[0],
                KUBERNETES_VERSIONS[KUBERNETES_VERSIONS.len() - 1]
            ),
            validate_manifests,
        ),
        // Plain `cargo test` runs the workspace's default-members: everything
        // but portmap-ebpf, which only builds for the BPF target (portmap-user's
        // build.rs builds it). `--workspace` would compile it for the host.
        Step::new(
            format!(
                "build the previous release ({}) for the upgrade test",
                previous::COMMIT
            ),
            previous::build,
        ),
        Step::new("cargo test (default members)", move || {
            run(cargo()
                .arg("test")
                .args(cargo_test_args)
                .env(PLUGIN_BIN_ENV, plugin_bin())
                .env(previous::BIN_ENV, previous::bin())
                .env(previous::REQUIRED_ENV, "1"))
        }),
        // The suites that carry traffic once more with `fastPath` on in every
        // conflist: the fast path must not lose any behaviour they check.
        Step::new(
            "cargo test again with fastPath on (plugin, local, operator, lifecycle)",
            move || {
                run(cargo()
                    .args(["test", "-p", "portmap-tests"])
                    .args(["--test", "plugin", "--test", "local"])
                    .args(["--test", "operator", "--test", "lifecycle"])
                    .args(cargo_test_args)
                    .env(PLUGIN_BIN_ENV, plugin_bin())
                    .env("EPM_TEST_FAST_PATH", "1"))
            },
        ),
        shipped_plugin_step(),
        Step::new(
            "release tarball: write it, then unpack and test it (cargo xtask dist)",
            dist_and_test,
        ),
        podman_step(skip_podman),
        containerd::test_step(skip_containerd),
        vm_step(skip_vm),
    ]
}

/// The eBPF crate only builds for its own target, with nightly and
/// `build-std` (as portmap-user's build.rs builds it); clippy checks it
/// there. The stable toolchain's variables are removed so nightly's own
/// rustc and clippy-driver run.
fn clippy_ebpf() -> Result<()> {
    let mut command = Command::new("rustup");
    command
        .current_dir(workspace_root())
        .args(["run", "nightly", "cargo", "clippy", "-p", "portmap-ebpf"])
        .args([
            "--target",
            "bpfel-unknown-none",
            "-Z",
            "build-std=core",
            "--release",
        ])
        .args(["--", "-D", "warnings"]);
    for variable in [
        "RUSTC",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "RUSTUP_TOOLCHAIN",
        "CARGO",
    ] {
        command.env_remove(variable);
    }
    run(&mut command)
}

fn shipped_plugin_step() -> Step<'static> {
    Step::new(
        format!(
            "cargo build --profile {SHIPPED_PROFILE} -p {PLUGIN_PACKAGE} (the plugin as it ships)"
        ),
        || run(&mut build_plugin(true)),
    )
}

fn image_steps() -> Vec<Step<'static>> {
    vec![
        setup_step(),
        shipped_plugin_step(),
        Step::new("release tarball, then the image from it (podman)", || {
            let tarball = dist::build()?;
            let archive = image::build(&tarball)?;
            println!("image: wrote {}", archive.display());
            Ok(())
        }),
    ]
}

fn dist_steps() -> Vec<Step<'static>> {
    vec![
        setup_step(),
        shipped_plugin_step(),
        Step::new("write the release tarball", || dist::build().map(drop)),
    ]
}

/// Writes the tarball, then runs `tests/tests/dist.rs` on it (which unpacks it
/// into an empty folder and drives the unpacked binary). Those tests are
/// `#[ignore]`d in a plain `cargo test`, which has no tarball.
fn dist_and_test() -> Result<()> {
    let tarball = dist::build()?;
    run(cargo()
        .args([
            "test",
            "-p",
            "portmap-tests",
            "--test",
            "dist",
            "--",
            "--ignored",
        ])
        .env(dist::TARBALL_ENV, &tarball))
}

/// The podman end-to-end tests as a step of `test`, or a step saying why
/// they are skipped.
fn podman_step(skip_podman: bool) -> Step<'static> {
    let name = "podman end to end, ebpf-portmap and upstream portmap (cargo xtask e2e-podman), then the installer image";
    let reason = if skip_podman {
        Some("--skip-podman")
    } else if podman::skip_requested_by_env() {
        Some("EPM_SKIP_PODMAN is set")
    } else {
        None
    };
    match reason {
        Some(reason) => Step::new(name, move || {
            println!("xtask test: podman tests skipped ({reason})");
            Ok(())
        }),
        None => Step::new(name, || {
            podman::e2e_podman(&[])?;
            // The installer image runs under the same podman.
            image::test(&dist::tarball_path())
        }),
    }
}

fn e2e_podman_steps(test_args: &[String]) -> Vec<Step<'_>> {
    vec![
        setup_step(),
        build_plugin_step(),
        Step::new(
            "podman end to end: ebpf-portmap, then upstream portmap",
            move || podman::e2e_podman(test_args),
        ),
    ]
}

/// The VM tests as a step of `test`, or a step saying why they are skipped.
fn vm_step(skip_vm: bool) -> Step<'static> {
    let name = format!(
        "VM tests on Debian {} kernels (cargo xtask vm-test)",
        vm::DEFAULT_KERNELS.join(" / ")
    );
    let reason = if skip_vm {
        Some("--skip-vm")
    } else if vm::skip_requested_by_env() {
        Some("EPM_SKIP_VM is set")
    } else {
        None
    };
    match reason {
        Some(reason) => Step::new(name, move || {
            println!("xtask test: VM tests skipped ({reason})");
            Ok(())
        }),
        None => Step::new(name, || vm::vm_test(&vm::VmTestArgs::default())),
    }
}

fn vm_test_steps(args: &vm::VmTestArgs) -> Vec<Step<'_>> {
    vec![
        setup_step(),
        Step::new("VM tests", move || vm::vm_test(args)),
    ]
}

fn demo_steps(demo_args: &[String]) -> Vec<Step<'_>> {
    vec![
        setup_step(),
        build_plugin_step(),
        Step::new("cargo run -p portmap-tests --bin demo", move || {
            run(cargo()
                .args([
                    "run",
                    "--quiet",
                    "-p",
                    "portmap-tests",
                    "--bin",
                    "demo",
                    "--",
                ])
                .args(demo_args)
                .env(PLUGIN_BIN_ENV, plugin_bin()))
        }),
    ]
}

/// Everything is built optimised: the plugin as it ships (profile `dist`),
/// and the load generators at full speed.
fn bench_steps(bench_args: &[String]) -> Vec<Step<'_>> {
    vec![
        setup_step(),
        shipped_plugin_step(),
        Step::new("cargo build --release -p portmap-bench --bin bench", || {
            run(cargo().args([
                "build",
                "--release",
                "-p",
                "portmap-bench",
                "--bin",
                "bench",
            ]))
        }),
        Step::new(
            "bench: ebpf-portmap vs iptables portmap vs the direct path",
            move || {
                run(Command::new(target_dir().join("release/bench"))
                    .current_dir(workspace_root())
                    .args(bench_args)
                    .env(PLUGIN_BIN_ENV, shipped_plugin_bin()))
            },
        ),
    ]
}

// ---- setup -----------------------------------------------------------------

fn ensure_apt_packages() -> Result<()> {
    ensure_packages("setup", APT_PACKAGES)
}

/// Installs whichever of `packages` dpkg does not list as installed
/// (`apt-get update` first), one line when there is nothing to do; `label`
/// starts each line.
fn ensure_packages(label: &str, packages: &[&str]) -> Result<()> {
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

fn apt_get() -> Command {
    let mut command = Command::new("apt-get");
    command.env("DEBIAN_FRONTEND", "noninteractive");
    command
}

fn dpkg_installed(package: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", package])
        .stderr(Stdio::null())
        .output()
        .is_ok_and(|out| {
            out.status.success()
                && String::from_utf8_lossy(&out.stdout).trim() == "install ok installed"
        })
}

fn ensure_nightly() -> Result<()> {
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

fn ensure_rust_src() -> Result<()> {
    ensure_component(
        "nightly",
        "rust-src",
        "the eBPF build uses -Z build-std=core",
    )
}

/// The lint steps of `test`: clippy and rustfmt on the default toolchain,
/// clippy on nightly for the eBPF crate (a minimal nightly has none).
fn ensure_lint_components() -> Result<()> {
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
fn ensure_component(toolchain: &str, component: &str, why: &str) -> Result<()> {
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

fn ensure_bpf_linker() -> Result<()> {
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

fn ensure_plugin_target() -> Result<()> {
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

fn plugin_target_installed() -> bool {
    capture(Command::new("rustup").args(["target", "list", "--installed"]))
        .is_ok_and(|installed| installed.lines().any(|line| line.trim() == PLUGIN_TARGET))
}

/// [`PLUGIN_TARGET`] if its standard library is installed (setup adds it),
/// else `None`: the host's target. Asked once per xtask run, so the build
/// and the binary's path agree.
fn plugin_target() -> Option<&'static str> {
    static INSTALLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    INSTALLED
        .get_or_init(plugin_target_installed)
        .then_some(PLUGIN_TARGET)
}

fn ensure_bpffs() -> Result<()> {
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

fn validator_venv() -> PathBuf {
    target_dir().join("tools").join(KUBERNETES_VALIDATE)
}

fn validator_bin() -> PathBuf {
    validator_venv().join("bin").join(KUBERNETES_VALIDATE)
}

fn ensure_kubernetes_validate() -> Result<()> {
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

/// Validates the manifests against the schema of every Kubernetes version,
/// strictly (an unknown field is an error), after checking that the
/// validator does reject a manifest with an unknown field.
fn validate_manifests() -> Result<()> {
    let validator = validator_bin();
    let manifests: Vec<PathBuf> = MANIFESTS.iter().map(|m| workspace_root().join(m)).collect();
    let probe = target_dir().join("tools/invalid-manifest.yaml");
    std::fs::create_dir_all(target_dir().join("tools")).context("creating target/tools")?;
    let first = std::fs::read_to_string(&manifests[0])
        .with_context(|| format!("reading {}", manifests[0].display()))?;
    let broken = first.replacen("hostNetwork:", "hostNetwrk:", 1);
    if broken == first {
        bail!(
            "{} has no hostNetwork to misspell for the probe",
            MANIFESTS[0]
        );
    }
    std::fs::write(&probe, broken).with_context(|| format!("writing {}", probe.display()))?;
    let rejected = Command::new(&validator)
        .args(["--strict", "--quiet", "-k", KUBERNETES_VERSIONS[0]])
        .arg(&probe)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .with_context(|| format!("could not start {}", validator.display()))?;
    if rejected.success() {
        bail!("kubernetes-validate accepted a DaemonSet with an unknown field: it checks nothing");
    }
    for version in KUBERNETES_VERSIONS {
        run(Command::new(&validator)
            .args(["--strict", "--quiet", "-k", version])
            .args(&manifests))?;
    }
    println!(
        "xtask test: {} valid for Kubernetes {} to {}",
        MANIFESTS.join(" "),
        KUBERNETES_VERSIONS[0],
        KUBERNETES_VERSIONS[KUBERNETES_VERSIONS.len() - 1]
    );
    Ok(())
}

// ---- helpers ---------------------------------------------------------------

/// The workspace root (xtask lives one level below it).
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask/ has a parent")
        .to_path_buf()
}

fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) if !dir.is_empty() => workspace_root().join(dir),
        _ => workspace_root().join("target"),
    }
}

/// The binary [`build_plugin`] produces in `profile` (its directory name).
fn plugin_bin_of(profile: &str) -> PathBuf {
    let mut dir = target_dir();
    if let Some(target) = plugin_target() {
        dir.push(target);
    }
    dir.join(profile).join(PLUGIN_BIN)
}

/// The binary `build_plugin(false)` produces.
fn plugin_bin() -> PathBuf {
    plugin_bin_of("debug")
}

/// The binary `build_plugin(true)` produces: the plugin as it ships.
fn shipped_plugin_bin() -> PathBuf {
    plugin_bin_of(SHIPPED_PROFILE)
}

fn cargo_home() -> PathBuf {
    match std::env::var_os("CARGO_HOME") {
        Some(home) if !home.is_empty() => PathBuf::from(home),
        _ => {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into())).join(".cargo")
        }
    }
}

/// A `cargo` command run from the workspace root (the cargo that runs xtask).
fn cargo() -> Command {
    let mut command = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    command.current_dir(workspace_root());
    command
}

fn path_with_first(dir: &Path) -> Result<OsString> {
    let current = std::env::var_os("PATH").unwrap_or_default();
    let paths = std::iter::once(dir.to_path_buf()).chain(std::env::split_paths(&current));
    std::env::join_paths(paths).context("building PATH")
}

/// Runs a command with inherited stdio; an error if it cannot start or fails.
fn run(command: &mut Command) -> Result<()> {
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
fn capture(command: &mut Command) -> Result<String> {
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

fn show(command: &Command) -> String {
    std::iter::once(command.get_program())
        .chain(command.get_args())
        .map(|part| part.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn parse(args: &[&str]) -> Verb {
        Cli::try_parse_from(std::iter::once("xtask").chain(args.iter().copied()))
            .unwrap_or_else(|e| panic!("{args:?}: {e}"))
            .command
    }

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn arguments_after_the_separator_reach_cargo_test() {
        // `cargo xtask test -- -p portmap-tests -- --nocapture` arrives as:
        let Verb::Test {
            cargo_test_args,
            skip_vm: false,
            skip_podman: false,
            skip_containerd: false,
        } = parse(&["test", "--", "-p", "portmap-tests", "--", "--nocapture"])
        else {
            panic!("not the test verb")
        };
        assert_eq!(
            cargo_test_args,
            ["-p", "portmap-tests", "--", "--nocapture"]
        );
        let Verb::Test {
            cargo_test_args, ..
        } = parse(&["test"])
        else {
            panic!("not the test verb")
        };
        assert!(cargo_test_args.is_empty());
    }

    #[test]
    fn skip_vm_is_a_flag_before_the_cargo_arguments() {
        let Verb::Test {
            skip_vm,
            cargo_test_args,
            ..
        } = parse(&["test", "--skip-vm", "--", "-p", "portmap-tests"])
        else {
            panic!("not the test verb")
        };
        assert!(skip_vm);
        assert_eq!(cargo_test_args, ["-p", "portmap-tests"]);
        // After the separator it belongs to cargo test.
        let Verb::Test {
            skip_vm,
            cargo_test_args,
            ..
        } = parse(&["test", "--", "--skip-vm"])
        else {
            panic!("not the test verb")
        };
        assert!(!skip_vm);
        assert_eq!(cargo_test_args, ["--skip-vm"]);
    }

    #[test]
    fn skip_podman_is_a_flag_before_the_cargo_arguments() {
        let Verb::Test {
            skip_vm,
            skip_podman,
            cargo_test_args,
            ..
        } = parse(&["test", "--skip-podman", "--skip-vm", "--", "-p", "x"])
        else {
            panic!("not the test verb")
        };
        assert!(skip_podman && skip_vm);
        assert_eq!(cargo_test_args, ["-p", "x"]);
        let Verb::Test {
            skip_podman,
            cargo_test_args,
            ..
        } = parse(&["test", "--", "--skip-podman"])
        else {
            panic!("not the test verb")
        };
        assert!(!skip_podman);
        assert_eq!(cargo_test_args, ["--skip-podman"]);
    }

    #[test]
    fn skip_containerd_is_a_flag_before_the_cargo_arguments() {
        let Verb::Test {
            skip_containerd,
            skip_podman,
            cargo_test_args,
            ..
        } = parse(&["test", "--skip-containerd", "--", "-p", "x"])
        else {
            panic!("not the test verb")
        };
        assert!(skip_containerd && !skip_podman);
        assert_eq!(cargo_test_args, ["-p", "x"]);
        let Verb::Test {
            skip_containerd,
            cargo_test_args,
            ..
        } = parse(&["test", "--", "--skip-containerd"])
        else {
            panic!("not the test verb")
        };
        assert!(!skip_containerd);
        assert_eq!(cargo_test_args, ["--skip-containerd"]);
    }

    #[test]
    fn e2e_containerd_arguments_pass_through() {
        let Verb::E2eContainerd { test_args } =
            parse(&["e2e-containerd", "--", "--nocapture", "pods_are_named"])
        else {
            panic!("not the e2e-containerd verb")
        };
        assert_eq!(test_args, ["--nocapture", "pods_are_named"]);
    }

    #[test]
    fn e2e_podman_arguments_pass_through() {
        let Verb::E2ePodman { test_args } = parse(&["e2e-podman", "--", "--nocapture"]) else {
            panic!("not the e2e-podman verb")
        };
        assert_eq!(test_args, ["--nocapture"]);
        let Verb::E2ePodman { test_args } = parse(&["e2e-podman"]) else {
            panic!("not the e2e-podman verb")
        };
        assert!(test_args.is_empty());
    }

    #[test]
    fn vm_test_takes_repeated_kernels() {
        let Verb::VmTest(args) = parse(&["vm-test", "--kernel", "6.1", "--kernel", "6.12"]) else {
            panic!("not the vm-test verb")
        };
        assert_eq!(args.kernels, ["6.1", "6.12"]);
        let Verb::VmTest(args) = parse(&["vm-test"]) else {
            panic!("not the vm-test verb")
        };
        assert!(args.kernels.is_empty(), "empty means the defaults");
        assert_eq!(args.timeout, vm::VmTestArgs::default().timeout);
    }

    #[test]
    fn bench_arguments_pass_through() {
        let Verb::Bench { bench_args } = parse(&["bench", "--", "--quick", "--reps", "5"]) else {
            panic!("not the bench verb")
        };
        assert_eq!(bench_args, ["--quick", "--reps", "5"]);
        let Verb::Bench { bench_args } = parse(&["bench"]) else {
            panic!("not the bench verb")
        };
        assert!(bench_args.is_empty());
    }

    #[test]
    fn demo_arguments_pass_through() {
        for args in [
            &["demo", "--", "--plugin", "portmap"][..],
            &["demo", "--plugin", "portmap"][..],
        ] {
            let Verb::Demo { demo_args } = parse(args) else {
                panic!("not the demo verb")
            };
            assert_eq!(demo_args, ["--plugin", "portmap"], "{args:?}");
        }
    }
}
