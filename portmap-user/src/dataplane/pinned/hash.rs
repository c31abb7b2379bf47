//! The plugin's stable hash. Owner IDs are stored in pinned maps and must be
//! the same for every build of the plugin, so no `std` hasher (randomised)
//! will do: 64-bit FNV-1a, shared with the test harness through
//! `portmap-common`, which names the plugin's files the same way.

pub use portmap_common::fnv::fnv1a64;
