//! The operator library behind the CLI verbs: reading the installed state
//! ([`inspect`]), collecting what gone containers left ([`gc`]), removing
//! it all ([`uninstall`]) and putting the plugin into a node's CNI
//! configuration ([`chain`]); reading the plugin's entry of it as a
//! runtime would ([`conf`], for the agent and `reconcile`); finding the
//! network namespace a pin root belongs to ([`namespace`]); upstream
//! `portmap`'s leftovers of containers that are gone ([`migrate`]).
//! `cli/` only prints what these return, and reaches the layers below only
//! through this module (`tests/tests/layers.rs` checks it).

pub mod chain;
pub mod conf;
pub mod gc;
pub mod inspect;
pub mod migrate;
pub mod namespace;
pub mod uninstall;

// The parts of the layers below that the verbs print or drive as they
// are (the pin layout and its scope, sizes, kernel features, the build,
// the trace session, stale pin roots, the node's links and hooks,
// upstream's state, the reconciliation the plugin runs): named here so
// that `cli/` imports `ops` alone.
pub use crate::dataplane::{
    bpffs, features, kfunc, ledger, object, pin, scope, sizing, stale, trace,
};
pub use crate::node::{forward_hooks, netlink, nft_tables, privilege};
pub use crate::upstream;
pub use crate::verbs::interfaces;
