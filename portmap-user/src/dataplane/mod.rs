//! Every read or write of the pinned BPF state, in rooms by lifecycle:
//! - [`load`]: the eBPF object, its kfunc calls and the kernel's features;
//! - [`attach`]: putting the programs on the tc hooks, bridge ports and
//!   socket hooks, replacing older builds, the namespace beacon and the
//!   state of nodes whose namespace is gone;
//! - [`pinned`]: the pin layout on bpffs, the pin root's lock, the maps,
//!   their sizes and resizing;
//! - [`ownership`]: which container owns which port;
//! - [`node_maps`]: what the programs are told about the node;
//! - [`observe`]: counters, the trace ring and the plugin's own runs.
//!
//! The modules of each room are also named here (`dataplane::pin`,
//! `dataplane::maps`, ...), the paths the rest of the crate uses. Inside
//! `dataplane`, a module names another by its room's path, so that no
//! room imports this file and back.

pub mod attach;
pub mod load;
pub mod node_maps;
pub mod observe;
pub mod ownership;
pub mod pinned;

pub use attach::{cgroup, crash, pass, stale, tcx};
pub use load::{features, kfunc, object};
pub use node_maps::{container_netns, interface_conditions, node_state, peers};
pub use observe::{counters, trace, verb_stats};
pub use pinned::{
    agent_record, bpf_call, bpffs, hash, key_notes, ledger, lock, maps, pin, resize, scope, sizing,
};
