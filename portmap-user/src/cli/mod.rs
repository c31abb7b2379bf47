//! Operator verbs, one module each.

pub mod list;
