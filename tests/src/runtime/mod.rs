//! One harness for every container runtime the end-to-end tests drive
//! (podman, containerd through the CRI): what confining a runtime to a
//! test's node takes, and what a test checks through it, written once.
//!
//! - [`holder`]: the node's mount-namespace holder, the private `/run`,
//!   `/var/lib`, ... every runtime process enters, and finding (and
//!   killing) what a runtime leaves there;
//! - [`daemon`]: a long-running runtime process (start in its cgroup with
//!   its log, readiness, stop: SIGTERM then SIGKILL, death with the test);
//! - [`conf_dir`]: the CNI configuration directory and its conflist,
//!   replaced atomically;
//! - [`rootfs`]: the workloads' image, built without a registry;
//! - [`firewall`]: the translations each plugin holds on the node, the
//!   node's nat tables, and the machine outside the test ([`firewall::RootState`]);
//! - [`recorder`]: the one CNI call recorder, shims in the runtime's CNI
//!   bin directory that record every plugin execution and its answer;
//! - [`e2e`]: the [`e2e::Driver`] trait, the table of what differs between
//!   runtimes (with [`e2e::Capability`]: what a runtime cannot do, so a
//!   scenario skips with a printed reason), the checks a test makes
//!   through any driver, and the scenarios run for each runtime.
//!
//! Nothing here imports a driver: the drivers ([`crate::podman::PodmanDriver`],
//! [`crate::containerd::Containerd`]) import this. Adding a runtime
//! (CRI-O, ...) is its driver, `tests/src/<runtime>/`: confine it with a
//! [`holder::MountNsHolder`] (and a [`daemon::Daemon`] if it has one), give
//! it a [`conf_dir::CniConfDir`], the [`rootfs`] image and a
//! [`recorder::Recorder`] as its CNI bin directory, implement
//! [`e2e::Driver`]; then a test file `tests/tests/<runtime>.rs` that runs
//! the scenarios of [`e2e`] with it, and a row in xtask's runtime table
//! (`xtask/src/runtimes.rs`).

pub mod conf_dir;
pub mod daemon;
pub mod e2e;
pub mod firewall;
pub mod holder;
pub mod recorder;
pub mod rootfs;

pub use e2e::{Capability, Driver, E2e, PortPlugin, Workload};
pub use recorder::{CniCall, Recorder};
