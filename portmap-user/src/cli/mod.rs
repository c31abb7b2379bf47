//! Operator verbs, one module each.

pub mod chain;
pub mod completions;
pub mod gc;
pub mod list;
pub mod man;
pub mod output;
pub mod status;
pub mod trace;
pub mod uninstall;
pub mod version;
