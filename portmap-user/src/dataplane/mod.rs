//! Every read or write of the pinned BPF state: where it is pinned ([`pin`],
//! [`scope`]), loading and attaching the programs ([`attach`], [`cgroup`],
//! [`features`]), the maps ([`maps`]) and what is kept in them: which
//! container owns which port ([`ownership`]), the node's own addresses
//! ([`node_state`]), where containers hand packets over ([`peers`]), traffic
//! counters ([`counters`]) and the trace ring ([`trace`]).

pub mod attach;
pub mod cgroup;
pub mod counters;
pub mod features;
pub mod hash;
pub mod maps;
pub mod node_state;
pub mod ownership;
pub mod peers;
pub mod pin;
pub mod scope;
pub mod trace;
