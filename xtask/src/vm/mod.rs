//! `cargo xtask vm-test`: the integration tests on real Debian kernels,
//! each booted in QEMU, the way aya tests itself on older kernels.
//!
//! For each `--kernel` series (default 6.1 and 6.12):
//! 1. the newest `linux-image-<series>.*-amd64` apt knows is fetched with
//!    `apt-get download` and extracted, once, under `target/vm/`;
//! 2. the modules the tests need (veth, bridge, sch_ingress, cls_bpf,
//!    nf_tables and their dependencies) are staged in load order;
//! 3. an initramfs is written: busybox for `/init`, the host's `ip`,
//!    `bpftool`, `iptables-save`, the reference CNI plugins, `ebpf-portmap`
//!    and the test binaries, with their shared libraries;
//! 4. QEMU boots it (TCG, one vCPU, no network device; the kernels boot
//!    side by side unless `--serial`, and 6.1, the slowest, as two VMs
//!    that each run every other test binary: see [`SPLIT_KERNELS`]),
//!    `/init` runs the test binaries of
//!    `guest::GUEST_TESTS` one test at a time and prints
//!    `EPM-VM-RESULT <series> PASS|FAIL`; only that line decides, and it
//!    must come before the timeouts (each stage: the boot, then each test
//!    binary; and the whole VM). The serial log is streamed with a
//!    `[series]` prefix and kept in `target/vm/run/<series>/serial.log`.
//!
//! The guest is told which attach mode the plugin must have chosen
//! (`EPM_EXPECT_ATTACH_MODE`: clsact before 6.6, tcx from 6.6), which the
//! `kernel` test asserts.

mod cpio;
mod guest;
mod kernel;
mod qemu;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;

use kernel::Series;

/// Debian packages the VM tests need on the host.
/// (`binutils` for objcopy, `kmod` for depmod, `ipvsadm` for the guests'
/// IPVS Services.)
const VM_APT_PACKAGES: &[&str] = &[
    "qemu-system-x86",
    "busybox-static",
    "kmod",
    "xz-utils",
    "binutils",
    "ipvsadm",
];

/// The kernels `cargo xtask test` boots: Debian 12's 6.1 (no tcx, clsact
/// fallback) and 6.12 (tcx).
pub const DEFAULT_KERNELS: &[&str] = &["6.1", "6.12"];

/// The series booted as two VMs by default: 6.1 (clsact, the older
/// verifier) takes about 1.35 times as long as 6.12 under emulation, and
/// with one VM each, one of the 2 cores sat idle for 6.1's last two
/// minutes (6.12 done at 319 s, 6.1 at 429 s). Split, the three VMs end
/// within 100 s of each other; splitting 6.12 as well (four VMs) measured
/// no better (389 s against 396 s, quiet machine, debug plugin).
pub const SPLIT_KERNELS: &[&str] = &["6.1"];

#[derive(Debug, Clone, Args)]
pub struct VmTestArgs {
    /// Kernel series to boot, e.g. 6.1 (repeat for several); default 6.1 and 6.12.
    #[arg(long = "kernel", value_name = "SERIES")]
    pub kernels: Vec<String>,
    /// Seconds one VM may run in all, boot to power-off.
    #[arg(long, default_value_t = 2400)]
    pub timeout: u64,
    /// Seconds one stage may run before the VM counts as hung: the boot up
    /// to the first test binary, then each test binary.
    #[arg(long, default_value_t = 600)]
    pub stage_timeout: u64,
    /// Virtual CPUs per VM. The suite runs serially inside, and the kernels
    /// boot side by side, so one each keeps a 2-core machine busy.
    #[arg(long, default_value_t = 1)]
    pub cpus: u32,
    /// Guest memory in MiB (the initramfs lives in it).
    #[arg(long, default_value_t = 1536)]
    pub memory: u32,
    /// Boot the kernels one after the other instead of all at once.
    #[arg(long)]
    pub serial: bool,
    /// Boot this kernel series as two VMs, each running every other test
    /// binary (repeatable). Default: those of [`SPLIT_KERNELS`], unless
    /// `--serial` or `--no-split`.
    #[arg(long = "split", value_name = "SERIES")]
    pub split: Vec<String>,
    /// Boot each kernel as one VM.
    #[arg(long)]
    pub no_split: bool,
    /// Run only these test targets in the guest (repeatable): kernel,
    /// prog_test_run, local, hairpin_ports, bridge_ports, churn, flood, node_shapes,
    /// stale, plugin.
    /// Default: all of them.
    #[arg(long = "only", value_name = "TEST")]
    pub only: Vec<String>,
    /// Put the debug build of ebpf-portmap in the guest (quick to rebuild
    /// while working on a VM test) instead of the shipped one (`--profile
    /// dist`, fat LTO), which `cargo xtask test` tests on every kernel.
    #[arg(long)]
    pub debug_plugin: bool,
    /// Run as a job of `cargo xtask test`, which has done the setup and the
    /// shipped build already: only the VM tests.
    #[arg(long, hide = true)]
    pub within_test: bool,
    /// Start only once this file exists (`cargo xtask test` starts the VMs
    /// early and has them wait for the shipped build's marker).
    #[arg(long, hide = true, value_name = "PATH")]
    pub after: Option<std::path::PathBuf>,
}

impl Default for VmTestArgs {
    fn default() -> Self {
        VmTestArgs {
            kernels: Vec::new(),
            timeout: 2400,
            stage_timeout: 600,
            cpus: 1,
            memory: 1536,
            serial: false,
            split: Vec::new(),
            no_split: false,
            only: Vec::new(),
            debug_plugin: false,
            within_test: false,
            after: None,
        }
    }
}

fn vm_dir() -> PathBuf {
    crate::cmd::target_dir().join("vm")
}

pub(crate) fn ensure_vm_packages() -> Result<()> {
    let missing: Vec<&str> = VM_APT_PACKAGES
        .iter()
        .copied()
        .filter(|p| !crate::setup::dpkg_installed(p))
        .collect();
    if missing.is_empty() {
        println!(
            "vm: Debian packages present ({}), skipping",
            VM_APT_PACKAGES.join(" ")
        );
        return Ok(());
    }
    println!("vm: installing {} ...", missing.join(" "));
    if crate::cmd::run(
        crate::setup::apt_get()
            .args(["install", "-y", "--no-install-recommends"])
            .args(&missing),
    )
    .is_err()
    {
        crate::cmd::run(crate::setup::apt_get().arg("update"))?;
        crate::cmd::run(
            crate::setup::apt_get()
                .args(["install", "-y", "--no-install-recommends"])
                .args(&missing),
        )?;
    }
    Ok(())
}

/// One kernel's outcome for the summary.
struct Outcome {
    series: String,
    package: String,
    run: Option<qemu::Run>,
    error: Option<String>,
}

/// Runs the VM tests for every requested kernel; an error unless all pass.
pub fn vm_test(args: &VmTestArgs) -> Result<()> {
    let started = Instant::now();
    let kernels: Vec<String> = if args.kernels.is_empty() {
        DEFAULT_KERNELS
            .iter()
            .map(std::string::ToString::to_string)
            .collect()
    } else {
        args.kernels.clone()
    };
    let series: Vec<Series> = kernels
        .iter()
        .map(|k| Series::parse(k))
        .collect::<Result<_>>()?;
    let tests: Vec<&guest::GuestTest> = guest::GUEST_TESTS
        .iter()
        .filter(|t| args.only.is_empty() || args.only.iter().any(|o| o == t.name))
        .collect();
    if let Some(unknown) = args
        .only
        .iter()
        .find(|o| !guest::GUEST_TESTS.iter().any(|t| t.name == o.as_str()))
    {
        let names: Vec<&str> = guest::GUEST_TESTS.iter().map(|t| t.name).collect();
        bail!("--only {unknown}: the guest runs {}", names.join(", "));
    }
    ensure_vm_packages()?;
    let cache = vm_dir();
    std::fs::create_dir_all(&cache).with_context(|| format!("creating {}", cache.display()))?;

    if let Some(version) = qemu_version() {
        println!("vm: {version}");
    }
    let mut artifacts = guest::build_artifacts(&tests)?;
    if !args.debug_plugin {
        // What ships, on every kernel; it also runs a good deal faster than
        // the debug build under emulation.
        let shipped = crate::plugin::shipped_plugin_bin();
        if !shipped.exists() {
            bail!(
                "{} is missing: build the shipped plugin first (`cargo xtask test` does; by hand \
                 `cargo build --profile dist -p portmap-user --target x86_64-unknown-linux-musl`), \
                 or pass --debug-plugin",
                shipped.display()
            );
        }
        artifacts.plugin = shipped;
    }
    println!("vm: the guest runs {}", artifacts.plugin.display());
    let common = guest::common_tree(&artifacts, &cache.join("stage"))?;

    let split: Vec<String> = if args.serial || args.no_split {
        Vec::new()
    } else if args.split.is_empty() {
        SPLIT_KERNELS.iter().map(|s| (*s).to_owned()).collect()
    } else {
        args.split.clone()
    };
    let mut units = Vec::new();
    for series in &series {
        let parts = if split.iter().any(|s| *s == series.to_string()) {
            2
        } else {
            1
        };
        let dealt = guest::deal(&artifacts.tests, parts);
        let count = dealt.len();
        for (index, tests) in dealt.into_iter().enumerate() {
            units.push(Unit {
                series: series.clone(),
                label: if count == 1 {
                    series.to_string()
                } else {
                    format!("{series}/{}", index + 1)
                },
                tests,
            });
        }
    }

    let outcome = |unit: &Unit<'_>, package: String, run: Result<qemu::Run>| match run {
        Ok(run) => Outcome {
            series: unit.label.clone(),
            package,
            run: Some(run),
            error: None,
        },
        Err(error) => Outcome {
            series: unit.label.clone(),
            package,
            run: None,
            error: Some(format!("{error:#}")),
        },
    };
    let mut outcomes = Vec::new();
    if !args.serial {
        // Prepare one after the other (apt, disk), boot all at once.
        let mut prepared = Vec::new();
        for unit in &units {
            match prepare(unit, &common) {
                Ok(vm) => prepared.push((unit, vm)),
                Err(error) => outcomes.push(outcome(unit, String::new(), Err(error))),
            }
        }
        std::thread::scope(|scope| {
            let running: Vec<_> = prepared
                .iter()
                .map(|(unit, vm)| (unit, vm, scope.spawn(|| boot(unit, vm, args))))
                .collect();
            for (unit, vm, handle) in running {
                let run = handle
                    .join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("the VM thread panicked")));
                outcomes.push(outcome(unit, vm.package.clone(), run));
            }
        });
    } else {
        for unit in &units {
            let result = prepare(unit, &common);
            let package = result
                .as_ref()
                .map(|vm| vm.package.clone())
                .unwrap_or_default();
            let run = result.and_then(|vm| boot(unit, &vm, args));
            outcomes.push(outcome(unit, package, run));
        }
    }

    println!(
        "vm-test summary ({:.0}s in all):",
        started.elapsed().as_secs_f64()
    );
    let mut failed = Vec::new();
    for outcome in &outcomes {
        match (&outcome.run, &outcome.error) {
            (Some(run), _) => {
                println!(
                    "  {:<5} {:<40} {} in {:.0}s",
                    outcome.series,
                    outcome.package,
                    run.verdict.describe(),
                    run.elapsed.as_secs_f64()
                );
                for (name, status, took) in &run.tests {
                    println!("        {name:<14} {status} {took}");
                }
                if run.verdict != qemu::Verdict::Pass {
                    println!(
                        "  last lines of {} ({}):\n{}",
                        run.log.display(),
                        outcome.series,
                        qemu::tail(&run.log, 60)
                    );
                    failed.push(outcome.series.clone());
                }
            }
            (None, error) => {
                println!(
                    "  {:<5} FAIL before boot: {}",
                    outcome.series,
                    error.as_deref().unwrap_or("unknown error")
                );
                failed.push(outcome.series.clone());
            }
        }
    }
    if !failed.is_empty() {
        bail!("VM tests failed on kernel(s) {}", failed.join(", "));
    }
    Ok(())
}

/// One VM: a kernel series and the test binaries it runs (all of them, or
/// its part when the series is split).
struct Unit<'a> {
    series: Series,
    /// The series, or `<series>/<part>`: the log prefix and the run
    /// directory's name (`/` as `-`).
    label: String,
    tests: Vec<&'a (&'static str, Vec<String>, PathBuf)>,
}

/// A kernel ready to boot.
struct PreparedVm {
    package: String,
    release: String,
    vmlinuz: PathBuf,
    initramfs: PathBuf,
    log: PathBuf,
    modules: Vec<String>,
}

/// Fetches the kernel, stages its modules and writes its initramfs.
fn prepare(unit: &Unit<'_>, common: &cpio::Tree) -> Result<PreparedVm> {
    let series = &unit.series;
    let cache = vm_dir();
    let fetch = || -> Result<(String, kernel::Kernel)> {
        let package = kernel::resolve_package(series)?;
        let kernel = kernel::fetch(&package, &cache)?;
        Ok((package, kernel))
    };
    let (package, kernel) = match fetch() {
        Ok(fetched) => fetched,
        Err(error) => {
            // Stale package lists name versions the mirror no longer has.
            println!("vm: {series}: {error:#}; running apt-get update and trying again");
            crate::cmd::run(crate::setup::apt_get().arg("update"))?;
            fetch()?
        }
    };
    let work = cache.join("run").join(unit.label.replace('/', "-"));
    std::fs::create_dir_all(&work)?;
    let modules = kernel.stage_modules(&work.join("modules"))?;
    let mut tree = common.clone();
    guest::add_tests(&mut tree, &unit.tests)?;
    guest::add_kernel(
        &mut tree,
        &series.to_string(),
        &kernel.release,
        series.expected_attach_mode(),
        &work.join("modules"),
        &modules,
    )?;
    let initramfs = work.join("initramfs.cpio");
    tree.write(&initramfs)?;
    Ok(PreparedVm {
        package,
        release: kernel.release,
        vmlinuz: kernel.vmlinuz,
        initramfs,
        log: work.join("serial.log"),
        modules,
    })
}

fn boot(unit: &Unit<'_>, vm: &PreparedVm, args: &VmTestArgs) -> Result<qemu::Run> {
    let series = &unit.series;
    let label = &unit.label;
    println!(
        "vm: {label}: booting {} ({}, modules: {}), timeout {}s, {}s a stage",
        vm.release,
        vm.package,
        vm.modules.join(" "),
        args.timeout,
        args.stage_timeout
    );
    qemu::boot(&qemu::Boot {
        series: &series.to_string(),
        label,
        vmlinuz: &vm.vmlinuz,
        initramfs: &vm.initramfs,
        log: &vm.log,
        cpus: args.cpus,
        memory_mib: args.memory,
        timeout: Duration::from_secs(args.timeout),
        stage_timeout: Duration::from_secs(args.stage_timeout),
    })
}

/// `qemu-system-x86_64 --version`, for the log.
fn qemu_version() -> Option<String> {
    crate::cmd::capture(Command::new(qemu::QEMU).arg("--version"))
        .ok()
        .and_then(|v| v.lines().next().map(str::to_owned))
}
