//! Everything one bench run measured, and the targets judged from it.
//! Pure data and pure functions: the orchestration fills it, the report
//! renders it.
//!
//! `model` holds the data (`hairpin_rows` the keys of the hairpin rows),
//! `compare` finds cells and pairs their repetitions into ratios,
//! `verdict` is what a judged target is, and `judge` (with `pods` and
//! `hairpin` for those sections' rows) judges them. None of them imports
//! this file. Below the sections and the report: it imports only the
//! shared parts its data is made of (`load`, `world`, `control`, `memory`,
//! `stats`), never a section.

mod compare;
mod hairpin;
pub mod hairpin_rows;
mod judge;
mod model;
mod pods;
#[cfg(test)]
mod tests;
mod verdict;

pub use judge::judge;
pub use model::{
    CallAccount, ConnectRep, ControlCell, CostLoad, DataCell, Evicted, FloodRow, HairpinCell,
    LoadProfile, MemoryRow, POD_SHAPES, PodCell, PodPrefill, Prefill, ProgramCost, Results,
    ScaleCell, Scope, Shape, StatusRow, UPSTREAM_REAL_PODS, Verb, cpu_per_rep, error_count,
    errors_of, failures, ops_per_s_per_rep, pct_per_rep, size_label,
};
pub use verdict::{REPORTED, Status, TargetRow};
