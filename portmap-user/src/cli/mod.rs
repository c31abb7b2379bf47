//! Operator verbs, one module each.

pub mod chain;
pub mod gc;
pub mod list;
pub mod output;
pub mod status;
pub mod trace;
pub mod uninstall;
