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
/// node translated, or one that came round again; a bridge port's mark
/// anywhere but at its bridge, see [`take_port_mark`]): under tcx it would
/// stay and send an untranslated packet past the next egress hook, or
/// past the next bridge's ingress, so it is cleared. (Under clsact the
/// kernel resets `tc_index` itself.)
#[inline(always)]
pub fn clear_stale_mark(ctx: &TcContext) {
    if is_marked(ctx) || has_port_mark(ctx) {
        // SAFETY: as in `mark_translated`.
        unsafe { (*ctx.skb.skb).tc_index = 0 };
    }
}

/// The mark a bridge port's ingress leaves on a packet it handled, for the
/// bridge's own ingress hook, which the packet crosses next (passed up by
/// the bridge: it is for a node address or was translated to a container
/// behind the bridge's MAC): the port's program decided it with the same
/// maps and the port's settings are the bridge's (see
/// `verbs::interfaces::bridge_ports` in the user-space crate), so the
/// bridge's hook would only do it again, and a second translation of a
/// translated packet is wrong (an answer to the node's remapped connection
/// would be taken for a hairpin flow's). `PORT_TRANSLATED` also carries
/// [`TRANSLATED_MARK`] on to the bridge's egress.
const PORT_HANDLED: u32 = 0x504e;
const PORT_TRANSLATED: u32 = 0x504f;

/// Marks a packet a bridge port's ingress handled (see [`PORT_HANDLED`]).
#[inline(always)]
pub fn mark_port_handled(ctx: &TcContext) {
    let mark = if is_marked(ctx) {
        PORT_TRANSLATED
    } else {
        PORT_HANDLED
    };
    // SAFETY: as in `mark_translated`.
    unsafe {
        (*ctx.skb.skb).tc_index = mark;
        (*ctx.skb.skb).tc_classid = mark;
    }
}

/// Whether the packet carries a bridge port's mark (see [`PORT_HANDLED`]).
#[inline(always)]
pub fn has_port_mark(ctx: &TcContext) -> bool {
    // SAFETY: reading a field of the context the program was handed.
    let mark = unsafe { (*ctx.skb.skb).tc_index };
    mark == PORT_HANDLED || mark == PORT_TRANSLATED
}

/// Takes a bridge port's mark off a packet at its bridge's ingress (the
/// caller checked both), leaving [`TRANSLATED_MARK`] for the egress hook
/// when the port translated it.
#[inline(always)]
pub fn take_port_mark(ctx: &TcContext) {
    // SAFETY: as in `mark_translated`.
    unsafe {
        let skb = ctx.skb.skb;
        let mark = if (*skb).tc_index == PORT_TRANSLATED {
            TRANSLATED_MARK
        } else {
            0
        };
        (*skb).tc_index = mark;
        (*skb).tc_classid = mark;
    }
}
