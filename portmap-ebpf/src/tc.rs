//! The two tc entry points: parse, handle, offer to the fast path, trace.

use aya_ebpf::{bindings::TC_ACT_OK, macros::classifier, programs::TcContext};
use portmap_common::trace_direction;

use crate::{counters::Way, fast::fast_path, flow, maps, parse, trace};

/// Translates traffic that arrives at a node interface for a mapped
/// (hostIP, hostPort, protocol) to the owning container.
#[classifier]
pub fn portmap_ingress(mut ctx: TcContext) -> i32 {
    maps::keep_userspace_maps();
    if let Some(packet) = parse::parse(&ctx) {
        // The tracing state is read again after the packet is handled, not
        // carried across it: the verifier then walks `ingress` once, not once
        // per tracing state.
        trace::begin(&packet);
        flow::ingress(&mut ctx, &packet);
        fast_path(&ctx);
        trace::end_if_tracing(&ctx, trace_direction::INGRESS);
        // Likewise the action: read back from scratch, one value the
        // verifier does not know, not one state per way it was decided.
        if let Some(scratch) = maps::scratch() {
            // SAFETY: per-CPU scratch, written by fast_path for this packet.
            return unsafe { (*scratch).action };
        }
    }
    TC_ACT_OK as i32
}

/// Restores the node address and hostPort on replies of translated flows,
/// and remembers flows the node opens from a mapped port.
#[classifier]
pub fn portmap_egress(mut ctx: TcContext) -> i32 {
    if let Some(packet) = parse::parse(&ctx) {
        // The tracing state is read again after the packet is handled, not
        // carried across it: the verifier then walks `egress` once, not once
        // per tracing state.
        trace::begin(&packet);
        if flow::egress(&mut ctx, &packet) {
            flow::count_from_scratch(&ctx, Way::Out);
        }
        trace::end_if_tracing(&ctx, trace_direction::EGRESS);
    }
    TC_ACT_OK as i32
}
