//! Build, test, demo and bench driver: `cargo xtask <setup|test|demo|bench>`.
//!
//! Depends on std, anyhow and clap only, so it builds on a fresh machine
//! before LLVM and bpf-linker are installed (`setup` installs them).
//!
//! - `setup`: idempotently installs the Debian packages, the nightly toolchain
//!   with rust-src, bpf-linker, the musl target the plugin ships for, and
//!   mounts bpffs; one line per step.
//! - `test [-- <cargo test args>]`: setup, build `ebpf-portmap`, run the tests.
//! - `bench [-- <bench args>]`: setup, build `ebpf-portmap` as it ships and
//!   the bench in release, run the benchmark against iptables portmap and the
//!   direct path.
//! - `demo [-- <demo args>]`: setup, build `ebpf-portmap`, run the demo
//!   (`cargo xtask demo -- --plugin portmap` runs it against upstream portmap).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};

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
    /// Install what is missing: Debian packages, nightly + rust-src, bpf-linker, bpffs mount.
    Setup,
    /// Setup, build ebpf-portmap, then `cargo test` with EBPF_PORTMAP_BIN set.
    /// Arguments after `--` go to `cargo test` (e.g. `-- -p portmap-tests -- --nocapture`).
    /// Then the VM tests on Debian 6.1 and 6.12 kernels (`vm-test`) unless
    /// `--skip-vm` or EPM_SKIP_VM=1.
    Test {
        /// Skip the VM tests on older kernels (also: EPM_SKIP_VM=1).
        #[arg(long)]
        skip_vm: bool,
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        cargo_test_args: Vec<String>,
    },
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
            cargo_test_args,
        } => run_steps("test", test_steps(cargo_test_args, *skip_vm)),
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
        Step::new("bpf-linker", ensure_bpf_linker),
        Step::new("musl target for the plugin", ensure_plugin_target),
        Step::new("bpffs mount", ensure_bpffs),
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

fn test_steps(cargo_test_args: &[String], skip_vm: bool) -> Vec<Step<'_>> {
    vec![
        setup_step(),
        build_plugin_step(),
        // Plain `cargo test` runs the workspace's default-members: everything
        // but portmap-ebpf, which only builds for the BPF target (portmap-user's
        // build.rs builds it). `--workspace` would compile it for the host.
        Step::new("cargo test (default members)", move || {
            run(cargo()
                .arg("test")
                .args(cargo_test_args)
                .env(PLUGIN_BIN_ENV, plugin_bin()))
        }),
        // Add further steps here, for example:
        // Step::new("clippy for the eBPF crate (nightly, bpfel-unknown-none)", ...),
        vm_step(skip_vm),
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
        Step::new(
            format!(
                "cargo build --profile {SHIPPED_PROFILE} -p {PLUGIN_PACKAGE} (the plugin as it ships)"
            ),
            || run(&mut build_plugin(true)),
        ),
        Step::new("cargo build --release -p portmap-tests --bin bench", || {
            run(cargo().args([
                "build",
                "--release",
                "-p",
                "portmap-tests",
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
    let missing: Vec<&str> = APT_PACKAGES
        .iter()
        .copied()
        .filter(|p| !dpkg_installed(p))
        .collect();
    if missing.is_empty() {
        println!(
            "setup: Debian packages present ({}), skipping",
            APT_PACKAGES.join(" ")
        );
        return Ok(());
    }
    println!("setup: apt-get update (missing: {}) ...", missing.join(" "));
    run(apt_get().arg("update"))?;
    println!("setup: installing {} ...", missing.join(" "));
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
    let installed = capture(Command::new("rustup").args([
        "component",
        "list",
        "--toolchain",
        "nightly",
        "--installed",
    ]))?;
    if installed.lines().any(|line| line.trim() == "rust-src") {
        println!("setup: rust-src for nightly present, skipping");
        return Ok(());
    }
    println!("setup: adding rust-src to nightly (the eBPF build uses -Z build-std=core) ...");
    run(Command::new("rustup").args(["component", "add", "rust-src", "--toolchain", "nightly"]))
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
        } = parse(&["test", "--", "--skip-vm"])
        else {
            panic!("not the test verb")
        };
        assert!(!skip_vm);
        assert_eq!(cargo_test_args, ["--skip-vm"]);
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
