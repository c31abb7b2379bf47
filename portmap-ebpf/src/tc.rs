//! The two tc entry points, thin shims over `try_*`: parse, leave what no
//! mapping concerns, decide (see `flow`), offer to the fast path, trace.

use aya_ebpf::{bindings::TC_ACT_OK, macros::classifier, programs::TcContext};
use portmap_common::{
    PROTO_TCP, PortRole,
    local::{MASQ_PORT_MIN, iface_flags},
    trace_direction,
};

use crate::{counters::Way, ct, events, fast, flow, icmp, maps, mark, masq, parse, trace};

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

/// The action for an ingress packet; `None` for one it does not parse.
#[inline(always)]
fn try_ingress(ctx: &mut TcContext) -> Option<i32> {
    maps::keep_userspace_maps();
    // Handled on the bridge port it came in by (see `mark::PORT_HANDLED`).
    if mark::has_port_mark(ctx) && at_a_bridge(ctx) {
        mark::take_port_mark(ctx);
        return Some(TC_ACT_OK);
    }
    mark::clear_stale_mark(ctx);
    // The tracing state is read again after the packet is handled, not
    // carried across it: the verifier then walks `ingress` once, not once
    // per tracing state.
    trace::before_parse(ctx);
    let Some(packet) = parse::parse(ctx) else {
        // No TCP, UDP or SCTP: an ICMP error about a translated flow is
        // translated with it (or handed over, see `icmp`); anything else
        // passes.
        if icmp::translate_error(ctx, icmp::Hook::Ingress) {
            return Some(fast::hand_error_to_client(ctx));
        }
        return Some(TC_ACT_OK);
    };
    // Inbound, a packet of ours is for a host port (a new or known
    // translated flow, the answer to a node-opened flow from a mapped port,
    // a lost flow to recover) or a container's answer that ingress has a
    // use for (see `answer_matters`). Any other has no flow of ours and
    // opens none: it leaves after two array loads (a fragment has no ports
    // to judge by and is counted in `ingress`). Still traced: a tracer
    // watching a port with no mapping sees what arrives there.
    let concerned = packet.fragment
        || maps::port_is(PortRole::Host, packet.proto, packet.dport_be)
        || (maps::port_is(PortRole::Container, packet.proto, packet.sport_be)
            && answer_matters(ctx, packet.dport_be, packet.proto, &packet.dst_be));
    if concerned {
        events::remember(&packet);
        flow::ingress(ctx, &packet);
        fast::fast_path(ctx);
        // Once the deep frames are gone (see `events`).
        events::log_noted(ctx);
        note_bridge_port(ctx);
    }
    trace::end_if_tracing(ctx, trace_direction::INGRESS);
    if !concerned {
        return Some(TC_ACT_OK);
    }
    // Likewise the action: read back from scratch, one value the verifier
    // does not know, not one state per way it was decided.
    maps::scratch().map(|scratch| scratch.action)
}

/// Whether ingress has a use for a packet from a container port: the
/// answer to a masqueraded flow, whose destination ingress restores (to a
/// masquerade port, or, for TCP, to the node's address on the interface it
/// arrived on: a hairpin client's own port kept, see `masq::first_port`),
/// or any answer when a fast path is on (ingress hands it to the client's
/// interface). Otherwise the answer of a translated flow is egress's to
/// translate back, and looking up its entry here would only find that
/// out: the bridge-side ingress hook of the default configuration skips
/// the lookup for every answer to a client elsewhere. Not inlined: a
/// call's result is one unknown value to the verifier, where the inlined
/// branches doubled the states it walks in `ingress`.
#[inline(never)]
fn answer_matters(ctx: &TcContext, dport_be: u16, proto: u8, dst_be: &[u32; 4]) -> bool {
    u16::from_be(dport_be) >= MASQ_PORT_MIN
        || fast::fast_path_on()
        || (proto == PROTO_TCP && to_arrival_address(ctx, dst_be))
}

/// On a bridge port, marks a packet handled for the bridge's ingress (see
/// `mark::PORT_HANDLED`), if it goes there: not one handed to another
/// interface by the fast path, nor one dropped. Not inlined: one lookup
/// the verifier walks once, after the handling frames are gone.
#[inline(never)]
fn note_bridge_port(ctx: &TcContext) {
    if maps::scratch().is_none_or(|scratch| scratch.action != TC_ACT_OK) {
        return;
    }
    // SAFETY: reading a field of the context the program was handed.
    let ifindex = unsafe { (*ctx.skb.skb).ifindex };
    if maps::iface(ifindex).is_some_and(|iface| iface.flags & iface_flags::BRIDGE_PORT != 0) {
        mark::mark_port_handled(ctx);
    }
}

/// Whether the program runs at a bridge's own ingress (a container-facing
/// interface that is no port): the only hook where a port's mark is this
/// node's, from the port the packet came in by. Anywhere else (an uplink
/// of a node nested in a pod, a port) it is a stale one. Not inlined: off
/// the path of every unmarked packet.
#[inline(never)]
fn at_a_bridge(ctx: &TcContext) -> bool {
    // SAFETY: reading a field of the context the program was handed.
    let ifindex = unsafe { (*ctx.skb.skb).ifindex };
    maps::iface(ifindex).is_some_and(|iface| {
        iface.flags & iface_flags::CONTAINER_SIDE != 0
            && iface.flags & iface_flags::BRIDGE_PORT == 0
    })
}

/// Whether `packet` is addressed to the node's address on the interface it
/// arrived on (the one a masquerade gives its flows, see
/// `masq::masquerade_source`).
#[inline(always)]
fn to_arrival_address(ctx: &TcContext, dst_be: &[u32; 4]) -> bool {
    // SAFETY: reading a field of the context the program was handed.
    let ifindex = unsafe { (*ctx.skb.skb).ingress_ifindex };
    // An IPv4 destination fills the first word only (see `parse`).
    maps::iface(ifindex).is_some_and(|iface| {
        (iface.addr4_be != 0 && dst_be[1..] == [0; 3] && dst_be[0] == iface.addr4_be)
            || (iface.addr6_be != [0; 4] && *dst_be == iface.addr6_be)
    })
}

/// Egress never redirects or drops: `None` only for a packet it does not
/// parse.
#[inline(always)]
fn try_egress(ctx: &mut TcContext) -> Option<()> {
    // Translated by ingress a moment ago, on its way to the container:
    // nothing for egress to do (see `mark::mark_translated`).
    if mark::is_marked(ctx) {
        return Some(());
    }
    // As in `try_ingress`: the tracing state is read again afterwards.
    trace::before_parse(ctx);
    let Some(packet) = parse::parse(ctx) else {
        // As in `try_ingress`; egress never hands anything over.
        let _ = icmp::translate_error(ctx, icmp::Hook::Egress);
        return Some(());
    };
    // As in `try_ingress`. Outbound, a packet of ours is from a container
    // port (an answer to translate back), to one (a masqueraded flow's
    // source to rewrite), or from a host port (a flow the node opens from
    // it, to remember). Egress leaves fragments alone.
    if !packet.fragment
        && (maps::port_is(PortRole::Container, packet.proto, packet.sport_be)
            || maps::port_is(PortRole::Container, packet.proto, packet.dport_be)
            || maps::port_is(PortRole::Host, packet.proto, packet.sport_be))
    {
        events::remember(&packet);
        if flow::egress(ctx, &packet) {
            flow::count_from_scratch(ctx, Way::Out);
        }
        // After egress's frame is gone (see `ct::note_tcp_change`).
        ct::track_tcp(&packet, false);
        // The node opening a connection to a container port: a
        // masqueraded flow may hold its tuple. After egress's frame is
        // gone too: stacked, the two exceed 512 bytes.
        masq::node_flow_on_masq_tuple(ctx, &packet);
        events::log_noted(ctx);
    }
    trace::end_if_tracing(ctx, trace_direction::EGRESS);
    Some(())
}
