//! The verbs as lists of named steps: what `test`, `bench`, `dist`, ... run,
//! in order.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::rc::Rc;

use crate::background::{Job, Priority};
use crate::cmd::{cargo, cargo_workspace, run, target_dir, workspace_root};
use crate::plugin::{
    PLUGIN_BIN_ENV, build_plugin, build_plugin_step, plugin_bin, shipped_build_name,
    shipped_plugin_bin, shipped_plugin_step,
};
use crate::runtimes::{SUITES, Skips, VM};
use crate::setup::{setup_step, validator_bin};
use crate::step::Step;
use crate::{dist, image, previous, runtimes, vm};
use anyhow::{Context, Result, bail};

pub(crate) fn test_steps(cargo_test_args: &[String], skips: Skips) -> Vec<Step<'_>> {
    // Built beside the steps in front, where they leave a core idle (see
    // background.rs): the shipped plugin (its own profile), needed by the
    // tarball and the VMs.
    let shipped_build = Job::marked(shipped_build_name(), "shipped-plugin", Priority::Lowest);
    let mut steps = vec![
        setup_step(),
        Step::new("cargo fmt --all --check", || {
            run(cargo().args(["fmt", "--all", "--check"]))
        }),
        Step::start_beside(&shipped_build, || Ok(build_plugin(true))),
    ];
    // The VMs (one vCPU each, with the guests' own timeouts) start as soon
    // as the shipped plugin is built, beside whatever step runs then (the
    // end of `cargo test`, whose build their `cargo test --no-run` reuses,
    // the fastPath suites, the tarball and the runtime suites, which mostly
    // wait on traffic and runtimes), not at a fixed step: they are the
    // longest piece of work, and each second they start earlier is one less
    // at the end.
    let skips = Rc::new(skips);
    let vm = vm_job(&skips);
    if let Ok(vm) = &vm {
        let skips = Rc::clone(&skips);
        let marker = shipped_build.done_marker();
        steps.push(Step::start_beside(vm, move || {
            vm_job_command(&skips, &marker)
        }));
    }
    // Clippy of the eBPF crates (the host crates are linted in the test
    // build: see `lint_within_builds`), in a target directory of its own,
    // once the shipped plugin is built and at the lowest priority: it takes
    // the cores the tests leave idle.
    let clippy = Job::new("cargo xtask clippy --ebpf-only", "clippy", Priority::Lowest);
    // The previous release for the upgrade test, as it shipped, on the
    // shipped build's dependencies (see previous.rs), so after it, at the
    // lowest priority: the upgrade test runs near the end.
    let previous = Job::new(
        format!("build the previous release ({})", previous::COMMIT),
        "previous",
        Priority::Lowest,
    );
    for (job, verb, extra) in [
        (&clippy, "clippy", Some("--ebpf-only")),
        (&previous, "previous", None),
    ] {
        let marker = shipped_build.done_marker();
        steps.push(Step::start_beside(job, move || {
            let mut command = xtask_after(verb, &marker)?;
            command.args(extra);
            Ok(command)
        }));
    }
    steps.extend([
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
        // It builds the debug plugin the tests run (see `plugin_bin`).
        Step::new("cargo test (default members, linted by clippy -D warnings as they build)", move || {
            run(cargo()
                .arg("test")
                .args(cargo_test_args)
                .env(PLUGIN_BIN_ENV, plugin_bin()))
        }),
        Step::wait_for(&shipped_build, || Ok(())),
    ]);
    // The suites that carry traffic once more with `fastPath` on in every
    // conflist: the fast path must not lose any behaviour they check.
    steps.push(Step::new(
        "cargo test again with fastPath on (plugin, local, operator, lifecycle)",
        move || {
            run(cargo_workspace("test")
                .args(["--test", "plugin", "--test", "local"])
                .args(["--test", "operator", "--test", "lifecycle"])
                .args(cargo_test_args)
                .env(PLUGIN_BIN_ENV, plugin_bin())
                .env("EPM_TEST_FAST_PATH", "1"))
        },
    ));
    steps.push(Step::new(
        "release tarball: write it, then unpack and test it (cargo xtask dist)",
        dist_and_test,
    ));
    steps.extend(
        SUITES
            .iter()
            .map(|suite| runtimes::test_step(suite, &skips)),
    );
    steps.push(image_test_step(&skips));
    steps.push(Step::wait_for(&previous, || Ok(())));
    // `#[ignore]`d in plain `cargo test`, which has no previous release.
    steps.push(Step::new(
        "the in-place upgrade from the previous release (cargo test --test upgrade -- --ignored)",
        || {
            run(cargo_workspace("test")
                .args(["--test", "upgrade", "--", "--ignored"])
                .env(PLUGIN_BIN_ENV, plugin_bin())
                .env(previous::BIN_ENV, previous::bin())
                .env(previous::REQUIRED_ENV, "1"))
        },
    ));
    steps.push(Step::wait_for(&clippy, || Ok(())));
    steps.push(match &vm {
        Ok(vm) => Step::wait_for(vm, || Ok(())),
        Err(skipped) => skipped_vm_step(skipped),
    });
    steps
}

/// The installer image built from the tarball and run under podman (what
/// the podman suite installed), unless podman is skipped.
fn image_test_step(skips: &Skips) -> Step<'static> {
    let name = "the installer image from the tarball, under podman (cargo xtask image)";
    match skips.reason("podman") {
        Some(reason) => {
            let reason = reason.to_owned();
            Step::new(name, move || {
                println!("xtask test: the installer image skipped with podman ({reason})");
                Ok(())
            })
        }
        None => Step::new(name, || image::test(&dist::tarball_path())),
    }
}

/// The name of the VM tests in `test`'s steps.
fn vm_step_name() -> String {
    format!(
        "VM tests on Debian {} kernels (cargo xtask vm-test)",
        vm::DEFAULT_KERNELS.join(" / ")
    )
}

/// The VM tests as a job of `test`, or why they are skipped.
fn vm_job(skips: &Skips) -> Result<Rc<Job>, String> {
    match skips.reason(VM) {
        Some(reason) => Err(reason.to_owned()),
        None => Ok(Job::new(vm_step_name(), "vm-test", Priority::Same)),
    }
}

fn skipped_vm_step(reason: &str) -> Step<'static> {
    let reason = reason.to_owned();
    Step::new(vm_step_name(), move || {
        println!("xtask test: VM tests skipped ({reason})");
        Ok(())
    })
}

/// `cargo xtask vm-test` as `test` runs it beside the runtime suites: what
/// those suites and the VMs install comes first, so no two `apt-get` runs
/// meet on the dpkg lock.
fn vm_job_command(skips: &Skips, after: &std::path::Path) -> Result<Command> {
    for suite in SUITES {
        if skips.reason(suite.name).is_none() {
            runtimes::ensure(suite)?;
        }
    }
    vm::ensure_vm_packages()?;
    let mut command = xtask_after("vm-test", after)?;
    command.arg("--within-test");
    Ok(command)
}

/// `cargo xtask VERB --after MARKER`: a verb `test` runs beside its steps,
/// which waits for the build that writes MARKER.
fn xtask_after(verb: &str, after: &std::path::Path) -> Result<Command> {
    let mut command = Command::new(std::env::current_exe().context("finding xtask's own binary")?);
    command
        .current_dir(workspace_root())
        .args([verb, "--after"])
        .arg(after);
    Ok(command)
}

/// The first step of a verb run with `--after MARKER`: the wait for it.
fn wait_step(after: Option<&std::path::Path>) -> Option<Step<'_>> {
    after.map(|marker| {
        Step::new(format!("wait for {}", marker.display()), move || {
            wait_for_marker(marker)
        })
    })
}

/// The previous release's build (see previous.rs); first, with `after`,
/// the wait for that file (the shipped build's marker: the build shares
/// its dependencies).
pub(crate) fn previous_steps(after: Option<&std::path::Path>) -> Vec<Step<'_>> {
    let mut steps: Vec<Step<'_>> = wait_step(after).into_iter().collect();
    steps.push(Step::new(
        format!(
            "build the previous release ({}) as it shipped, on the shipped build's dependencies",
            previous::COMMIT
        ),
        || {
            run(&mut previous::build_command()?)?;
            previous::check_built()
        },
    ));
    steps
}

/// Both clippy runs (with `ebpf_only`, the eBPF crates'), in
/// `target/clippy`; first, with `after`, the wait for that file.
pub(crate) fn clippy_steps(after: Option<&std::path::Path>, ebpf_only: bool) -> Vec<Step<'_>> {
    let mut steps: Vec<Step<'_>> = wait_step(after).into_iter().collect();
    if !ebpf_only {
        steps.push(Step::new(
            "cargo clippy --all-targets -- -D warnings (default members, in target/clippy)",
            || {
                run(cargo()
                    .args(["clippy", "--all-targets", "--", "-D", "warnings"])
                    .env("CARGO_TARGET_DIR", clippy_target_dir()))
            },
        ));
    }
    steps.push(Step::new(
        "cargo +nightly clippy -p portmap-ebpf -p portmap-bench-floor --target bpfel-unknown-none -- -D warnings (in target/clippy)",
        clippy_ebpf,
    ));
    steps
}

/// Where clippy builds: apart from `target/`, whose builds it runs beside.
fn clippy_target_dir() -> PathBuf {
    target_dir().join("clippy")
}

/// The eBPF crates (the dataplane and the bench's floor programs) only
/// build for their own target, with nightly and
/// `build-std` (as portmap-user's build.rs builds it); clippy checks it
/// there. The stable toolchain's variables are removed so nightly's own
/// rustc and clippy-driver run.
pub(crate) fn clippy_ebpf() -> Result<()> {
    let mut command = Command::new("rustup");
    command
        .current_dir(workspace_root())
        .args(["run", "nightly", "cargo", "clippy", "-p", "portmap-ebpf"])
        .args(["-p", "portmap-bench-floor"])
        .args([
            "--target",
            "bpfel-unknown-none",
            "-Z",
            "build-std=core",
            "--release",
        ])
        .args(["--", "-D", "warnings"])
        .env("CARGO_TARGET_DIR", clippy_target_dir());
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

pub(crate) fn image_steps() -> Vec<Step<'static>> {
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

pub(crate) fn dist_steps() -> Vec<Step<'static>> {
    vec![
        setup_step(),
        shipped_plugin_step(),
        Step::new("write the release tarball", || dist::build().map(drop)),
    ]
}

/// Writes the tarball, then runs `tests/tests/dist.rs` on it (which unpacks it
/// into an empty folder and drives the unpacked binary). Those tests are
/// `#[ignore]`d in a plain `cargo test`, which has no tarball.
pub(crate) fn dist_and_test() -> Result<()> {
    let tarball = dist::build()?;
    run(cargo_workspace("test")
        .args(["--test", "dist", "--", "--ignored"])
        .env(dist::TARBALL_ENV, &tarball))
}

pub(crate) fn vm_test_steps(args: &vm::VmTestArgs) -> Vec<Step<'_>> {
    let mut steps = Vec::new();
    if !args.within_test {
        steps.push(setup_step());
        if !args.debug_plugin {
            steps.push(shipped_plugin_step());
        }
    }
    steps.extend(wait_step(args.after.as_deref()));
    steps.push(Step::new("VM tests", move || vm::vm_test(args)));
    steps
}

/// Waits until `marker` exists: a job of `cargo xtask test` that started
/// before the build it needs ended (see `background::Job::marked`). The
/// test's own wait for that build fails it, and takes this job down, if
/// the build fails; the bound only keeps a lost marker from hanging.
fn wait_for_marker(marker: &std::path::Path) -> Result<()> {
    let started = std::time::Instant::now();
    while !marker.exists() {
        if started.elapsed() > std::time::Duration::from_secs(3600) {
            bail!("{} did not appear within an hour", marker.display());
        }
        std::thread::sleep(std::time::Duration::from_secs(2));
    }
    Ok(())
}

pub(crate) fn demo_steps(demo_args: &[String]) -> Vec<Step<'_>> {
    vec![
        setup_step(),
        build_plugin_step(),
        Step::new("cargo run -p portmap-tests --bin demo", move || {
            run(cargo_workspace("run")
                .args(["--quiet", "--bin", "demo", "--"])
                .args(demo_args)
                .env(PLUGIN_BIN_ENV, plugin_bin()))
        }),
    ]
}

/// Everything is built optimised: the plugin as it ships (profile `dist`),
/// and the load generators at full speed.
pub(crate) fn bench_steps(bench_args: &[String]) -> Vec<Step<'_>> {
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
            "bench: ebpf-portmap vs iptables and nftables portmap vs the direct path",
            move || {
                run(Command::new(target_dir().join("release/bench"))
                    .current_dir(workspace_root())
                    .args(bench_args)
                    .env(PLUGIN_BIN_ENV, shipped_plugin_bin()))
            },
        ),
    ]
}

/// The Kubernetes manifests, checked against the API schemas.
pub(crate) const MANIFESTS: &[&str] = &["deploy/daemonset.yaml", "deploy/metrics-proxy.yaml"];

/// Every Kubernetes version that release bundles schemas for: the manifests
/// must be valid for all of them.
pub(crate) const KUBERNETES_VERSIONS: &[&str] = &[
    "1.25.0", "1.26.0", "1.27.0", "1.28.0", "1.29.0", "1.30.0", "1.31.0", "1.32.0", "1.33.0",
    "1.34.0", "1.35.0", "1.36.0", "1.37.0",
];

/// Validates the manifests against the schema of every Kubernetes version,
/// strictly (an unknown field is an error), after checking that the
/// validator does reject a manifest with an unknown field.
pub(crate) fn validate_manifests() -> Result<()> {
    let validator = validator_bin();
    let manifests: Vec<PathBuf> = MANIFESTS.iter().map(|m| workspace_root().join(m)).collect();
    let probe = target_dir().join("tools/invalid-manifest.yaml");
    std::fs::create_dir_all(target_dir().join("tools")).context("creating target/tools")?;
    let first = std::fs::read_to_string(&manifests[0])
        .with_context(|| format!("reading {}", manifests[0].display()))?;
    // The field itself, not a comment that names it.
    let broken: String = {
        let mut done = false;
        first
            .split_inclusive('\n')
            .map(|line| {
                if !done && line.trim_start().starts_with("hostNetwork:") {
                    done = true;
                    line.replacen("hostNetwork:", "hostNetwrk:", 1)
                } else {
                    line.to_owned()
                }
            })
            .collect()
    };
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
