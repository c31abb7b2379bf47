//! Build, test, demo and bench driver: `cargo xtask <setup|test|demo|bench>`.
//!
//! Depends on pure-Rust crates only (anyhow, clap, serde_json), so it builds on a fresh machine
//! before LLVM and bpf-linker are installed (`setup` installs them).
//!
//! - `setup`: idempotently installs the Debian packages, the nightly toolchain
//!   with rust-src, bpf-linker, the musl target the plugin ships for and
//!   kubernetes-validate, and mounts bpffs; one line per step.
//! - `test [-- <cargo test args>]`: setup, validate the Kubernetes
//!   manifests, run the tests on the debug `ebpf-portmap` that `cargo test`
//!   builds (the traffic suites twice, the second time with `fastPath`),
//!   then, on `ebpf-portmap` as it ships, each runtime's end-to-end suite
//!   (the table in `runtimes.rs`: podman, containerd) and the VM tests; `--skip NAME`
//!   (repeatable; also `--skip-podman`, `--skip-containerd`, `--skip-vm`
//!   and `EPM_SKIP_<NAME>=1`) leaves one out.
//! - `e2e-<runtime> [-- <test args>]` (`e2e-podman`, `e2e-containerd`):
//!   setup, build `ebpf-portmap` as it ships, install the runtime, run its
//!   suite with `ebpf-portmap` and with upstream `portmap`.
//! - `bench [-- <bench args>]`: setup, build `ebpf-portmap` as it ships and
//!   the bench in release, run the benchmark against iptables portmap and the
//!   direct path.
//! - `dist`: setup, build the plugin as it ships, write the release tarball
//!   `target/dist/ebpf-portmap-<version>-x86_64-linux.tar.gz` (see `dist.rs`).
//! - `image`: `dist`, then the installer image built from the tarball with
//!   podman, saved as an OCI archive (see `image.rs`).
//! - `demo [-- <demo args>]`: setup, build `ebpf-portmap`, run the demo
//!   (`cargo xtask demo -- --plugin portmap` runs it against upstream portmap).

use std::process::ExitCode;

use crate::plan::{
    bench_steps, clippy_steps, demo_steps, dist_steps, image_steps, previous_steps, test_steps,
    vm_test_steps,
};
use crate::runtimes::Skips;
use crate::setup::setup;
use crate::step::run_steps;
use clap::{Parser, Subcommand};

mod background;
mod cmd;
mod dist;
mod image;
mod plan;
mod plugin;
mod previous;
mod runtimes;
mod setup;
mod step;
mod vm;

#[derive(Debug, Parser)]
#[command(
    name = "xtask",
    bin_name = "cargo xtask",
    about = "Build, test and demo driver for ebpf-portmap",
    after_help = "Each runtime of the table in xtask/src/runtimes.rs has its verb: \
                  `cargo xtask e2e-<runtime> [-- <test args>]` (e.g. e2e-podman, e2e-containerd) \
                  installs the runtime and runs tests/tests/<runtime>.rs (an unknown \
                  e2e-<name> lists them)."
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
    /// Then each runtime's end-to-end suite (`e2e-<runtime>`: podman,
    /// containerd) and the VM tests on Debian 6.1 and 6.12 kernels
    /// (`vm-test`), but those `--skip NAME` or EPM_SKIP_<NAME>=1 names.
    Test {
        /// Leave out a runtime suite (its name in xtask/src/runtimes.rs:
        /// `podman`, `containerd`, ...) or the VM tests (`vm`); repeatable;
        /// also EPM_SKIP_<NAME>=1.
        #[arg(long, value_name = "NAME")]
        skip: Vec<String>,
        /// The same as `--skip vm` (also: EPM_SKIP_VM=1).
        #[arg(long)]
        skip_vm: bool,
        /// The same as `--skip podman` (also: EPM_SKIP_PODMAN=1).
        #[arg(long)]
        skip_podman: bool,
        /// The same as `--skip containerd` (also: EPM_SKIP_CONTAINERD=1).
        #[arg(long)]
        skip_containerd: bool,
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        cargo_test_args: Vec<String>,
    },
    /// `e2e-<runtime> [-- <test args>]`: a runtime suite of the table (see
    /// below).
    #[command(external_subcommand)]
    E2e(Vec<String>),
    /// Setup, build ebpf-portmap as it ships (profile dist, static musl), then write the
    /// release tarball target/dist/ebpf-portmap-<version>-x86_64-linux.tar.gz: the binary,
    /// shell completions, man pages, deploy/ with the image tag set to the version, LICENSE
    /// and SHA256SUMS.
    Dist,
    /// `dist`, then build the node installer image from the tarball with podman (a busybox
    /// base made locally, no registry) and save it as target/dist/ebpf-portmap-<version>-image.tar
    /// (an OCI archive for `podman load -i`, `docker load -i`, `kind load image-archive`).
    Image,
    /// Lint every crate: `cargo clippy --all-targets -- -D warnings` over the
    /// default members, and the eBPF crates with nightly for their own
    /// target, both in target/clippy (so that they run beside builds of
    /// target/ without waiting on its lock). `test` lints the default
    /// members in its own build (see `cmd::lint_within_builds`) and runs
    /// this for the eBPF crates only (`--ebpf-only`), beside its steps once
    /// the shipped plugin is built (`--after MARKER`).
    Clippy {
        /// Wait until this file exists first.
        #[arg(long, value_name = "MARKER")]
        after: Option<std::path::PathBuf>,
        /// Only the eBPF crates.
        #[arg(long)]
        ebpf_only: bool,
    },
    /// Build the previous release's plugin for the upgrade test, as it shipped
    /// (profile dist, static musl), on the shipped build's dependencies (see
    /// previous.rs). `test` runs it beside its steps once the shipped plugin
    /// is built (`--after MARKER`).
    Previous {
        /// Wait until this file exists first.
        #[arg(long, value_name = "MARKER")]
        after: Option<std::path::PathBuf>,
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    let outcome = match &cli.command {
        Verb::Setup => setup(),
        Verb::Test {
            skip,
            skip_vm,
            skip_podman,
            skip_containerd,
            cargo_test_args,
        } => {
            cmd::lint_within_builds();
            Skips::new(&skip_names(skip, *skip_vm, *skip_podman, *skip_containerd))
                .and_then(|skips| run_steps("test", test_steps(cargo_test_args, skips)))
        }
        Verb::E2e(words) => match e2e_verb(words) {
            Ok((suite, test_args)) => run_steps(
                &format!("e2e-{}", suite.name),
                runtimes::e2e_steps(suite, test_args),
            ),
            Err(e) => Err(e),
        },
        Verb::Dist => run_steps("dist", dist_steps()),
        Verb::Image => run_steps("image", image_steps()),
        Verb::VmTest(args) => run_steps("vm-test", vm_test_steps(args)),
        Verb::Clippy { after, ebpf_only } => {
            run_steps("clippy", clippy_steps(after.as_deref(), *ebpf_only))
        }
        Verb::Previous { after } => run_steps("previous", previous_steps(after.as_deref())),
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

/// `--skip NAME`s with the old flags as names.
fn skip_names(skip: &[String], vm: bool, podman: bool, containerd: bool) -> Vec<String> {
    let mut names = skip.to_vec();
    for (flag, name) in [
        (vm, runtimes::VM),
        (podman, "podman"),
        (containerd, "containerd"),
    ] {
        if flag {
            names.push(name.to_owned());
        }
    }
    names
}

/// `e2e-<runtime> [--] [test args]` as clap hands an unknown verb over: the
/// runtime's row and the test binary's arguments.
fn e2e_verb(words: &[String]) -> anyhow::Result<(&'static runtimes::Suite, &[String])> {
    let (verb, rest) = words.split_first().expect("clap names the verb");
    let known: Vec<String> = runtimes::SUITES
        .iter()
        .map(|suite| format!("e2e-{}", suite.name))
        .collect();
    let Some(suite) = verb.strip_prefix("e2e-").and_then(runtimes::suite) else {
        anyhow::bail!(
            "unknown verb `{verb}` (`cargo xtask --help` lists the verbs; the runtime suites: {})",
            known.join(", ")
        );
    };
    let test_args = match rest.split_first() {
        Some((separator, after)) if separator == "--" => after,
        _ => rest,
    };
    Ok((suite, test_args))
}

// ---- setup -----------------------------------------------------------------

// ---- helpers ---------------------------------------------------------------

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
            ..
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

    /// `e2e-<runtime>` as clap hands it over.
    fn e2e(args: &[&str]) -> anyhow::Result<(&'static str, Vec<String>)> {
        let Verb::E2e(words) = parse(args) else {
            panic!("not an e2e verb: {args:?}")
        };
        e2e_verb(&words).map(|(suite, test_args)| (suite.name, test_args.to_vec()))
    }

    #[test]
    fn e2e_containerd_arguments_pass_through() {
        let (suite, test_args) =
            e2e(&["e2e-containerd", "--", "--nocapture", "pods_are_named"]).unwrap();
        assert_eq!(suite, "containerd");
        assert_eq!(test_args, ["--nocapture", "pods_are_named"]);
    }

    #[test]
    fn e2e_podman_arguments_pass_through() {
        assert_eq!(
            e2e(&["e2e-podman", "--", "--nocapture"]).unwrap(),
            ("podman", vec!["--nocapture".to_owned()])
        );
        assert_eq!(e2e(&["e2e-podman"]).unwrap(), ("podman", vec![]));
    }

    #[test]
    fn every_runtime_suite_is_a_verb_and_others_are_refused() {
        for suite in runtimes::SUITES {
            assert_eq!(
                e2e(&[&format!("e2e-{}", suite.name)]).unwrap().0,
                suite.name
            );
        }
        let error = e2e(&["e2e-crio"]).unwrap_err().to_string();
        assert!(
            error.contains("unknown verb `e2e-crio`")
                && error.contains("e2e-podman, e2e-containerd"),
            "{error}"
        );
    }

    #[test]
    fn skip_takes_names_and_the_old_flags_are_its_aliases() {
        let Verb::Test {
            skip,
            skip_vm,
            skip_podman,
            skip_containerd,
            cargo_test_args,
        } = parse(&[
            "test",
            "--skip",
            "podman",
            "--skip-vm",
            "--skip",
            "containerd",
            "--",
            "-p",
            "x",
        ])
        else {
            panic!("not the test verb")
        };
        assert_eq!(cargo_test_args, ["-p", "x"]);
        assert_eq!(
            skip_names(&skip, skip_vm, skip_podman, skip_containerd),
            ["podman", "containerd", "vm"]
        );
        assert_eq!(skip_names(&[], false, true, true), ["podman", "containerd"]);
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
        assert_eq!(args.stage_timeout, vm::VmTestArgs::default().stage_timeout);
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
