//! ebpf-portmap userspace: the CNI plugin, the operator CLI and the code that
//! loads, attaches and updates the eBPF dataplane.
//!
//! Layers, with dependencies running one way (see ARCHITECTURE.md):
//! - [`cni`]: the CNI protocol only (environment, network configuration,
//!   port mappings, prevResult, error codes); no BPF, no netlink.
//! - [`verbs`]: what ADD, DEL, CHECK, GC and STATUS do (the `cni::Plugin`
//!   implementation), on top of `dataplane` and `node`.
//! - [`dataplane`]: every read or write of pinned BPF state: pin layout, load,
//!   attach, features, maps, ownership of ports.
//! - [`node`]: read-only facts about the host: links and addresses, listening
//!   sockets, privileges.
//! - [`ops`]: the operator library that `cli/` prints: inspect, gc,
//!   uninstall, chain, conf, migrate, namespace.
//! - [`upstream`]: upstream `portmap`'s live iptables/nftables state, read
//!   so ADD never takes its ports, removed when its containers' DEL comes here.

pub mod agent;
pub mod cni;
pub mod dataplane;
pub mod logging;
pub mod model;
pub mod node;
pub mod ops;
pub mod upstream;
pub mod verbs;
