//! The parts of `cargo xtask bench` (compiled into the `bench` binary, see
//! `src/bin/bench.rs`): timed plugin runs, control-plane batches, load
//! generators, the measured worlds, map memory, upstream's iptables state,
//! statistics, the targets and the report.

pub mod control;
pub mod invoke;
pub mod iptables;
pub mod load;
pub mod memory;
pub mod report;
pub mod results;
pub mod stats;
pub mod svg;
pub mod world;
