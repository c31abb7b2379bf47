//! The node's liveness beacon: a socket-lookup program attached to the
//! node's network namespace through a pinned bpf link, for one reason: the
//! kernel detaches such a link when its namespace goes away, and its link
//! info then names no namespace. Userspace reads that to tell a pin root
//! whose node is gone (its socket hooks would otherwise stay attached to a
//! shared cgroup for good) from a live one. The program decides nothing:
//! every lookup goes on as if it were not there.

use aya_ebpf::{macros::sk_lookup, programs::SkLookupContext};

/// `SK_PASS`: the kernel's own lookup goes on.
const SK_PASS: u32 = 1;

#[sk_lookup]
pub fn portmap_netns_beacon(_ctx: SkLookupContext) -> u32 {
    SK_PASS
}
