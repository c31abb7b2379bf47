//! ebpf-portmap userspace: the CNI plugin, the operator CLI and the code that
//! loads, attaches and updates the eBPF dataplane.

pub mod attach;
pub mod cni;
pub mod config;
pub mod hash;
pub mod listeners;
pub mod maps;
pub mod netlink;
pub mod pin;
pub mod plugin;
pub mod privilege;
pub mod store;
