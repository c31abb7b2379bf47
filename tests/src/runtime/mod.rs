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
//! - [`e2e`]: the [`e2e::Driver`] trait, the table of what differs between
//!   runtimes, the checks a test makes through any driver, and the
//!   scenarios run for each runtime.
//!
//! The drivers: [`crate::podman::PodmanDriver`] and
//! [`crate::containerd::Containerd`]. Adding a runtime (CRI-O, a newer
//! containerd, ...) is one module next to them: confine it with a
//! [`holder::MountNsHolder`] (and a [`daemon::Daemon`] if it has one),
//! give it a [`conf_dir::CniConfDir`] and the [`rootfs`] image, implement
//! [`e2e::Driver`], and run the scenarios of [`e2e`] from a test file of
//! its own.

pub mod conf_dir;
pub mod daemon;
pub mod e2e;
pub mod firewall;
pub mod holder;
pub mod recorder;
pub mod rootfs;

pub use e2e::{Capability, Driver, E2e, PortPlugin, Workload};
pub use recorder::{CniCall, Recorder};
