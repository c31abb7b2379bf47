//! ebpf-portmap userspace: the CNI plugin, the operator CLI and the code that
//! loads, attaches and updates the eBPF dataplane.

pub mod attach;
pub mod cgroup;
pub mod chain;
pub mod cni;
pub mod config;
pub mod counters;
pub mod features;
pub mod hash;
pub mod inspect;
pub mod json_keys;
pub mod listeners;
pub mod local;
pub mod logging;
pub mod maps;
pub mod netlink;
pub mod peers;
pub mod pin;
pub mod plugin;
pub mod privilege;
pub mod scope;
pub mod store;
pub mod trace;
pub mod uninstall;
