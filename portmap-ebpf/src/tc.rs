//! The two tc entry points, thin shims over `try_*`: parse, decide (see
//! `flow`), offer to the fast path, trace.

use aya_ebpf::{bindings::TC_ACT_OK, macros::classifier, programs::TcContext};
use portmap_common::trace_direction;

use crate::{counters::Way, ct, fast, flow, maps, parse, trace};

/// Translates traffic that arrives at a node interface for a mapped
/// (hostIP, hostPort, protocol) to the owning container.
#[classifier]
pub fn portmap_ingress(mut ctx: TcContext) -> i32 {
    try_ingress(&mut ctx).unwrap_or(TC_ACT_OK)
}

/// Restores the node address and hostPort on replies of translated flows,
/// and remembers flows the node opens from a mapped port.
#[classifier]
pub fn portmap_egress(mut ctx: TcContext) -> i32 {
    try_egress(&mut ctx);
    TC_ACT_OK
}

/// The tc action for an ingress packet; `None` for one it does not parse.
#[inline(always)]
fn try_ingress(ctx: &mut TcContext) -> Option<i32> {
    maps::keep_userspace_maps();
    let packet = parse::parse(ctx)?;
    // The tracing state is read again after the packet is handled, not
    // carried across it: the verifier then walks `ingress` once, not once
    // per tracing state.
    trace::begin(&packet);
    flow::ingress(ctx, &packet);
    fast::fast_path(ctx);
    trace::end_if_tracing(ctx, trace_direction::INGRESS);
    // Likewise the action: read back from scratch, one value the verifier
    // does not know, not one state per way it was decided.
    maps::scratch().map(|scratch| scratch.action)
}

/// Egress never redirects or drops: `None` only for a packet it does not
/// parse.
#[inline(always)]
fn try_egress(ctx: &mut TcContext) -> Option<()> {
    let packet = parse::parse(ctx)?;
    // As in `try_ingress`: the tracing state is read again afterwards.
    trace::begin(&packet);
    if flow::egress(ctx, &packet) {
        flow::count_from_scratch(ctx, Way::Out);
    }
    // After egress's frame is gone (see `ct::note_tcp_change`).
    ct::track_tcp(&packet, false);
    trace::end_if_tracing(ctx, trace_direction::EGRESS);
    Some(())
}
