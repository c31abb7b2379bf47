//! Every read or write of the pinned BPF state: where it is pinned ([`pin`],
//! [`scope`]), the eBPF object ([`object`], its kfunc calls linked by
//! [`kfunc`]), loading and attaching the
//! programs ([`attach`], on [`bpffs`], under the pin root's [`lock`]; [`cgroup`],
//! [`features`]; the records of its last pass, [`pass`]), the maps ([`maps`], sized by [`sizing`]) and what is kept in them: which
//! container owns which port ([`ownership`]), the containers whose own
//! sockets the hooks translate ([`container_netns`]), the node's own addresses
//! ([`node_state`]), where containers hand packets over ([`peers`]), traffic
//! counters ([`counters`]) and the trace ring ([`trace`]); the state of
//! nodes whose network namespace is gone ([`stale`]); test-only fault
//! injection at the steps of a change ([`crash`]); the keys the last ADD
//! took for typos ([`key_notes`]); which agent keeps a pin root
//! ([`agent_record`]).

pub mod agent_record;
pub mod attach;
pub mod bpffs;
pub mod cgroup;
pub mod container_netns;
pub mod counters;
pub mod crash;
pub mod features;
pub mod hash;
pub mod key_notes;
pub mod kfunc;
pub mod lock;
pub mod maps;
pub mod node_state;
pub mod object;
pub mod ownership;
pub mod pass;
pub mod peers;
pub mod pin;
pub mod resize;
pub mod scope;
pub mod sizing;
pub mod stale;
pub mod tcx;
pub mod trace;
pub mod verb_stats;
