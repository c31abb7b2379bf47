//! The operator library behind the CLI verbs: reading the installed state
//! ([`inspect`]), removing it ([`uninstall`]) and putting the plugin into a
//! node's CNI configuration ([`chain`]); finding the network namespace a
//! pin root belongs to ([`namespace`]); upstream `portmap`'s leftovers of
//! containers that are gone ([`migrate`]). `cli/` only prints what these
//! return.

pub mod chain;
pub mod inspect;
pub mod migrate;
pub mod namespace;
pub mod uninstall;
