//! What the dataplane counts and shows: traffic [`counters`], the
//! [`trace`] ring, and the plugin's record of its own runs
//! ([`verb_stats`]).

pub mod counters;
pub mod trace;
pub mod verb_stats;
