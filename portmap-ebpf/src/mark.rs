//! The mark ingress leaves on a packet it translated, for the egress hook
//! the packet crosses next (see [`TRANSLATED_MARK`]).

use aya_ebpf::programs::TcContext;

/// The mark of a packet ingress translated and did not masquerade, for the
/// egress hook it crosses next (the bridge's, or the host end of a ptp
/// veth), which would only miss in conntrack and the mappings: a DNATed
/// packet's tuple (client to container) is the key of no entry but a
/// masqueraded flow's, and masqueraded packets are never marked. In
/// `tc_index`, which survives routing and the bridge to the egress hook.
/// Under tcx (6.6+) the program's write stays; under clsact, cls_bpf
/// overwrites `tc_index` after the program with the minor of
/// `tc_classid`, so both are written. A 16-bit value no qdisc of ours
/// uses, so another user's `tc_index` is not taken for ours.
const TRANSLATED_MARK: u32 = 0x504d;

/// Marks a packet ingress translated and did not masquerade (see
/// [`TRANSLATED_MARK`]).
#[inline(always)]
pub fn mark_translated(ctx: &TcContext) {
    // SAFETY: both fields are writable by tc programs; plain stores to the
    // context the program was handed.
    unsafe {
        (*ctx.skb.skb).tc_index = TRANSLATED_MARK;
        (*ctx.skb.skb).tc_classid = TRANSLATED_MARK;
    }
}

#[inline(always)]
pub fn is_marked(ctx: &TcContext) -> bool {
    // SAFETY: reading a field of the context the program was handed.
    unsafe { (*ctx.skb.skb).tc_index == TRANSLATED_MARK }
}

/// A mark that arrives on ingress is not about this hop (a packet a nested
/// node translated, or one that came round again): under tcx it would
/// stay and send an untranslated packet past the next egress hook, so it
/// is cleared. (Under clsact the kernel resets `tc_index` itself.)
#[inline(always)]
pub fn clear_stale_mark(ctx: &TcContext) {
    if is_marked(ctx) {
        // SAFETY: as in `mark_translated`.
        unsafe { (*ctx.skb.skb).tc_index = 0 };
    }
}
