//! What is pinned under a pin root and how it is reached: the layout
//! ([`pin`], [`scope`]) on [`bpffs`], the root's [`lock`], the maps
//! ([`maps`], sized by [`sizing`], resized in place by [`resize`]), and the
//! small records kept beside them ([`agent_record`], [`key_notes`]); the
//! raw `bpf()` calls that pin and open them ([`bpf_call`]).

pub mod agent_record;
pub mod bpf_call;
pub mod bpffs;
pub mod hash;
pub mod key_notes;
pub mod ledger;
pub mod lock;
pub mod maps;
pub mod pin;
pub mod resize;
pub mod scope;
pub mod sizing;
