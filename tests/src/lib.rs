//! Integration-test harness for ebpf-portmap.
//!
//! The harness builds a private little world out of network namespaces (a node,
//! an external client, a far host behind the node, containers), runs real CNI
//! plugin chains the way libcni does, and sends real TCP/UDP/HTTP traffic with
//! hard timeouts. It drives the built `ebpf-portmap` binary (see
//! [`plugins::plugin_bin`]) and never links the plugin crate, so the tests see
//! exactly what a container runtime sees.
//!
//! Isolation rules every module follows:
//! - nothing is configured in the root network namespace: every interface,
//!   address, route and sysctl lives in a namespace the harness created;
//! - every namespace, bpffs directory and temp directory carries a name built by
//!   [`naming::unique_name`] (`<prefix>-<kind>-<pid>-<n>`) and is removed on
//!   drop, also while a test panics; whatever a killed run left behind is
//!   removed by the next run ([`naming::reap_stale`]);
//! - namespaces are entered with `setns(CLONE_NEWNET)` only, never through
//!   `ip netns exec`, which remounts `/sys` and hides bpffs.
//!
//! All of it needs root.

pub mod agent;
pub mod bpffs;
pub mod cgroup;
pub mod cni;
pub mod containerd;
pub mod crafted;
pub mod cri;
pub mod firewalld;
pub mod image;
pub mod naming;
pub mod netns;
pub mod operator;
pub mod pin_root;
pub mod plugins;
pub mod podman;
pub mod profile;
pub mod prometheus;
pub mod release;
pub mod rtnl;
pub mod runtime;
pub mod stop;
pub mod tmp;
pub mod topology;
pub mod traffic;
pub mod upstream_nft;
pub mod world;

pub use cni::{
    CniCommand, CniFailure, CniFailures, CniRunner, Conflist, GcAttachment, RuntimeAttachment,
};
pub use netns::NetNs;
pub use pin_root::PinRoot;
pub use plugins::{PluginDirs, plugin_bin, plugin_dirs};
pub use topology::{Container, Node, PortMapping, bridge_conflist, ptp_conflist};
