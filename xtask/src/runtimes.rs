//! The container-runtime suites, as one table ([`SUITES`]): each row names
//! a runtime's end-to-end test file (`tests/tests/<name>.rs`, every test
//! `#[ignore]`d), the Debian packages it needs, and its passes (the test
//! file once per containerd version, ...). `cargo xtask e2e-<name>` and the
//! runtime steps of `cargo xtask test` are built from the table; adding a
//! runtime is adding a row.
//!
//! Every runtime runs inside a test-owned network namespace with its own
//! configuration, state, CNI directories and private mount namespace;
//! nothing of the machine's runtime state is used.
//!
//! [`Skips`] is what `test` leaves out: `--skip NAME` (a suite's name or
//! `vm`), its old spellings `--skip-podman`, `--skip-containerd`,
//! `--skip-vm`, and `EPM_SKIP_<NAME>=1` (`1`, `true`, `yes`), read in one
//! place.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::process::Command;
use std::time::Instant;

use anyhow::{Result, bail};

use crate::step::Step;

/// One runtime's end-to-end suite.
pub struct Suite {
    /// `e2e-<name>`, `--skip <name>`, `EPM_SKIP_<NAME>`, and the test file
    /// `tests/tests/<name>.rs`.
    pub name: &'static str,
    /// What it runs, for the step names.
    pub title: &'static str,
    /// Debian packages the tests need on top of `setup`'s.
    pub apt_packages: &'static [&'static str],
    /// After the packages: checks what they installed (e.g. the version
    /// the tests need) and prints it.
    pub check: fn() -> Result<()>,
    /// The passes of the test file (at least one).
    pub passes: fn() -> Vec<Pass>,
}

/// One run of a suite's test file.
pub struct Pass {
    /// The runtime it drives, for the summary.
    pub label: String,
    /// Environment for the test binary (`None`: removed).
    pub env: Vec<(&'static str, Option<OsString>)>,
    /// Why the pass cannot run here (it is reported as skipped).
    pub skipped: Option<String>,
}

impl Pass {
    fn run(label: impl Into<String>) -> Pass {
        Pass {
            label: label.into(),
            env: Vec::new(),
            skipped: None,
        }
    }
}

/// The runtime suites, in the order `test` runs them.
pub const SUITES: &[Suite] = &[
    Suite {
        name: "podman",
        title: "podman (CNI backend) end to end, ebpf-portmap and upstream portmap",
        // podman and its runtime (runc: crun refuses hybrid cgroup hosts),
        // conmon, the reference plugins, busybox-static for the image,
        // iptables for the upstream plugin, util-linux for nsenter/unshare,
        // curl for the Kubernetes conformance checks.
        apt_packages: &[
            "podman",
            "runc",
            "conmon",
            "containernetworking-plugins",
            "busybox-static",
            "iptables",
            "util-linux",
            "curl",
        ],
        check: check_podman,
        passes: || vec![Pass::run("podman")],
    },
    Suite {
        name: "containerd",
        title: "containerd (CRI) end to end on 1.6 and 2.x, ebpf-portmap and upstream portmap",
        // containerd and runc, the reference plugins, busybox-static for
        // the image, gcc and libc6-dev for the static `pause`, iptables for
        // the upstream plugin, util-linux for nsenter/unshare, curl for the
        // Kubernetes conformance checks.
        apt_packages: &[
            "containerd",
            "runc",
            "containernetworking-plugins",
            "busybox-static",
            "gcc",
            "libc6-dev",
            "iptables",
            "util-linux",
            "curl",
        ],
        check: || {
            let version = crate::cmd::capture(Command::new("containerd").arg("--version"))?;
            println!("containerd: {}", version.trim());
            Ok(())
        },
        passes: containerd_passes,
    },
];

/// The row named `name`.
pub fn suite(name: &str) -> Option<&'static Suite> {
    SUITES.iter().find(|suite| suite.name == name)
}

/// Names the unpacked containerd 2.x for the tests (see
/// `portmap_tests::containerd::Runtime`).
const CONTAINERD_ROOT_ENV: &str = "EPM_CONTAINERD_ROOT";

/// Debian 12's containerd 1.6 with the plugins 1.1, then the containerd
/// 2.x with the plugins 1.9 that `setup` unpacked from Debian unstable
/// (`cniVersion` 1.1.0, so STATUS too), or why not.
fn containerd_passes() -> Vec<Pass> {
    let system = crate::cmd::capture(Command::new("containerd").arg("--version")).map_or_else(
        |e| format!("containerd (--version: {e})"),
        |version| version.trim().to_owned(),
    );
    let mut passes = vec![Pass {
        env: vec![(CONTAINERD_ROOT_ENV, None)],
        ..Pass::run(system)
    }];
    let root = crate::setup::unstable_root();
    passes.push(match crate::setup::unstable_root_ready(&root) {
        Some(found) => Pass {
            env: vec![(CONTAINERD_ROOT_ENV, Some(root.into_os_string()))],
            ..Pass::run(format!("{found} (Debian unstable)"))
        },
        None => Pass {
            skipped: Some(format!(
                "nothing usable in {} (`cargo xtask setup` says why)",
                root.display()
            )),
            ..Pass::run("containerd 2.x")
        },
    });
    passes
}

/// podman 4 (its CNI backend; podman 5 has only netavark).
fn check_podman() -> Result<()> {
    let version = crate::cmd::capture(Command::new("podman").arg("--version"))?;
    println!("podman: {}", version.trim());
    if !version.contains("version 4.") {
        bail!(
            "the podman tests need podman 4 (its CNI backend; podman 5 has only netavark), found `{}`",
            version.trim()
        );
    }
    Ok(())
}

/// Installs Debian's podman 4 and what runs with it, if missing (also for
/// the installer image).
pub fn ensure_podman() -> Result<()> {
    ensure(suite("podman").expect("podman is a suite"))
}

/// Installs what `suite` needs, if missing, and checks it.
pub fn ensure(suite: &Suite) -> Result<()> {
    crate::setup::ensure_packages(suite.name, suite.apt_packages)?;
    (suite.check)()
}

/// Installs what is missing, then runs the suite's test file once per pass
/// with the debug `ebpf-portmap` (built by the step before). `test_args` go
/// to the test binary after `--ignored --test-threads=1` (e.g.
/// `--nocapture`, a filter). Every pass runs; the first failure is
/// returned, after a summary of all.
pub fn e2e(suite: &Suite, test_args: &[String]) -> Result<()> {
    ensure(suite)?;
    let mut outcomes = Vec::new();
    let mut first_failure = Ok(());
    for pass in (suite.passes)() {
        if let Some(reason) = &pass.skipped {
            outcomes.push(format!("{}: SKIPPED, {reason}", pass.label));
            continue;
        }
        let started = Instant::now();
        let mut command = crate::cmd::cargo_workspace("test");
        command
            .args([
                "--test",
                suite.name,
                "--",
                "--ignored",
                // One test at a time: each starts eight workloads at once,
                // which is load enough for 2 cores.
                "--test-threads=1",
            ])
            .args(test_args)
            // What ships: runtimes start it as they start it on a node.
            .env(
                crate::plugin::PLUGIN_BIN_ENV,
                crate::plugin::shipped_plugin_bin(),
            );
        for (key, value) in &pass.env {
            match value {
                Some(value) => command.env(key, value),
                None => command.env_remove(key),
            };
        }
        let outcome = crate::cmd::run(&mut command);
        outcomes.push(format!(
            "{}: {} in {:.0}s",
            pass.label,
            if outcome.is_ok() { "passed" } else { "FAILED" },
            started.elapsed().as_secs_f64()
        ));
        if first_failure.is_ok() {
            first_failure = outcome;
        }
    }
    println!("{} passes:\n  {}", suite.name, outcomes.join("\n  "));
    first_failure
}

/// The suite as a step of `test`, or a step saying why it is skipped.
pub fn test_step(suite: &'static Suite, skips: &Skips) -> Step<'static> {
    let name = format!("{} (cargo xtask e2e-{})", suite.title, suite.name);
    match skips.reason(suite.name) {
        Some(reason) => {
            let reason = reason.to_owned();
            Step::new(name, move || {
                println!("xtask test: {} tests skipped ({reason})", suite.name);
                Ok(())
            })
        }
        None => Step::new(name, move || e2e(suite, &[])),
    }
}

/// The steps of `cargo xtask e2e-<name>`.
pub fn e2e_steps<'a>(suite: &'static Suite, test_args: &'a [String]) -> Vec<Step<'a>> {
    vec![
        crate::setup::setup_step(),
        crate::plugin::shipped_plugin_step(),
        Step::new(suite.title, move || e2e(suite, test_args)),
    ]
}

/// What `test` leaves out, and why: the suites (and `vm`) named by
/// `--skip`, by an old `--skip-<name>` flag, or by `EPM_SKIP_<NAME>`.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Skips {
    reasons: BTreeMap<String, String>,
}

/// What `--skip` takes besides the suites' names: the VM tests.
pub const VM: &str = "vm";

impl Skips {
    /// From the command line's `names` (`--skip NAME` and the old flags,
    /// as names) and the process environment.
    pub fn new(names: &[String]) -> Result<Skips> {
        Skips::from(names, |key| std::env::var(key).ok())
    }

    /// [`Skips::new`] with the environment given.
    pub fn from(names: &[String], env: impl Fn(&str) -> Option<String>) -> Result<Skips> {
        let known: Vec<&str> = SUITES.iter().map(|s| s.name).chain([VM]).collect();
        let mut reasons = BTreeMap::new();
        for name in names {
            if !known.contains(&name.as_str()) {
                bail!("--skip {name}: no such suite (known: {})", known.join(", "));
            }
            reasons.insert(name.clone(), format!("--skip {name}"));
        }
        for name in known {
            let key = skip_env(name);
            if let Some(value) = env(&key)
                && matches!(value.trim(), "1" | "true" | "yes")
            {
                reasons
                    .entry(name.to_owned())
                    .or_insert(format!("{key} is set"));
            }
        }
        Ok(Skips { reasons })
    }

    /// Why `name` is skipped, if it is.
    pub fn reason(&self, name: &str) -> Option<&str> {
        self.reasons.get(name).map(String::as_str)
    }
}

/// `EPM_SKIP_<NAME>`.
pub fn skip_env(name: &str) -> String {
    format!("EPM_SKIP_{}", name.to_ascii_uppercase().replace('-', "_"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn every_suite_has_a_test_file_and_packages() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        for suite in SUITES {
            let file = root.join("tests/tests").join(format!("{}.rs", suite.name));
            assert!(file.exists(), "{} has no {}", suite.name, file.display());
            assert!(!suite.apt_packages.is_empty(), "{}", suite.name);
            assert_ne!(suite.name, VM);
        }
    }

    #[test]
    fn skips_come_from_the_flags_and_the_environment() {
        let none = Skips::from(&[], |_| None).unwrap();
        assert_eq!(none, Skips::default());
        let flags = Skips::from(&names(&["podman", "vm"]), |_| None).unwrap();
        assert_eq!(flags.reason("podman"), Some("--skip podman"));
        assert_eq!(flags.reason("vm"), Some("--skip vm"));
        assert_eq!(flags.reason("containerd"), None);
        let env = Skips::from(&[], |key| {
            (key == "EPM_SKIP_CONTAINERD").then(|| " yes\n".to_owned())
        })
        .unwrap();
        assert_eq!(env.reason("containerd"), Some("EPM_SKIP_CONTAINERD is set"));
        let off = Skips::from(&[], |key| (key == "EPM_SKIP_VM").then(|| "0".to_owned())).unwrap();
        assert_eq!(off.reason("vm"), None);
    }

    #[test]
    fn an_unknown_name_is_refused_with_the_known_ones() {
        let error = Skips::from(&names(&["crio"]), |_| None).unwrap_err();
        assert_eq!(
            error.to_string(),
            "--skip crio: no such suite (known: podman, containerd, vm)"
        );
    }

    #[test]
    fn skip_variables_are_named_after_the_suites() {
        assert_eq!(skip_env("podman"), "EPM_SKIP_PODMAN");
        assert_eq!(skip_env(VM), "EPM_SKIP_VM");
    }
}
