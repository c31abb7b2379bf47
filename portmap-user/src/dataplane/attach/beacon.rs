//! The namespace beacon (see `stale.rs`), kept attached beside the
//! programs.

use std::ffi::OsString;

use portmap_common::program_names;

use crate::dataplane::{
    attach::hook::pinned_id, attach::stale, load::object::build_id, pinned::pin::PinLayout,
};

/// Whether the namespace beacon's link is among `listed` (see
/// `stale.rs`).
pub(super) fn has_beacon(listed: &[(OsString, u64)]) -> bool {
    listed.iter().any(|(name, _)| name == stale::BEACON_LINK)
}

/// Attaches the namespace beacon unless its link is pinned with this
/// build's program (an upgrade replaces it, like every other link); under
/// the root's lock. A failure only costs the root its stale-state detection
/// (it is logged, and tried again by the next run): ADD goes on.
pub(super) fn attach_beacon_if_missing(layout: &PinLayout) {
    let program = layout.program(build_id(), program_names::NETNS_BEACON);
    let current = pinned_id(&program);
    if let Ok(info) = stale::beacon(layout)
        && Some(info.program_id) == current
    {
        crate::dataplane::pinned::lock::register(layout);
        return;
    }
    if let Err(error) = stale::attach_beacon(layout, &program) {
        log::warn!(
            "this node's state will not be removed automatically if its network namespace goes away: {error}"
        );
    }
}
