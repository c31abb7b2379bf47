//! Masquerade: the extra directions of a flow whose source becomes the
//! node's address (hairpin with `snat`, every flow with `masqAll`).

use aya_ebpf::{bindings::bpf_fib_lookup, helpers::bpf_get_prandom_u32, programs::TcContext};
use portmap_common::{
    CtEntry, CtKey, FAMILY_V4, ct_kind,
    local::{MASQ_PORT_COUNT, MASQ_PORT_MIN, MASQ_PORT_TRIES, iface_flags, node_flags},
    stat,
};

use crate::{
    fast::Offer,
    fib,
    maps::{self, Insert, PairFailed},
};

/// Whether a new flow arriving on this interface is masqueraded: every flow
/// with `masqAll`; with `snat`, flows from containers (hairpin), whose
/// answer would otherwise go straight back to the client, bypassing the
/// node and its translation.
#[inline(always)]
pub fn wants_masquerade(ctx: &TcContext) -> bool {
    let Some(node) = maps::node_config() else {
        return false;
    };
    if node.flags & node_flags::MASQ_ALL != 0 {
        return true;
    }
    // SAFETY: reading a field of the context the program was handed.
    let ifindex = unsafe { (*ctx.skb.skb).ingress_ifindex };
    node.flags & node_flags::SNAT != 0
        && maps::iface(ifindex).is_some_and(|i| i.flags & iface_flags::CONTAINER_SIDE != 0)
}

/// Records the two extra directions of a masqueraded flow (the forward
/// entries are in `scratch` already): towards the container the source
/// becomes the node's address on the container's network and a free port;
/// the container's answer to that port goes back to the client. Only the
/// destination is rewritten on ingress and only the source on egress, so the
/// kernel never sees one of its own addresses arrive from outside.
#[inline(never)]
pub fn masquerade(ctx: &TcContext) {
    let Some(scratch) = maps::scratch() else {
        return;
    };
    // A masqueraded flow's source is rewritten on the way to the container,
    // by egress of its interface: the fast path would skip that.
    scratch.fast = Offer::Nothing;
    // Everything comes from the entries new_flow left in scratch, nothing
    // from the caller's stack: the verifier then walks this function once,
    // not once per path through new_flow.
    let client = scratch.forward_key;
    let now = scratch.forward.last_seen_ns;
    let container_be = scratch.forward.nat_addr_be;
    let container_port_be = scratch.forward.nat_port_be;
    let mapping = scratch.forward.mapping;
    let Some(node_addr) = masquerade_source(ctx, &mut scratch.fib, client.family, &container_be)
    else {
        maps::count(stat::MASQ_NO_ADDR);
        return;
    };
    // Towards the container: after DNAT the packet is client -> container.
    scratch.forward_key.dst_addr_be = container_be;
    scratch.forward_key.dst_port_be = container_port_be;
    scratch.reply_key = CtKey {
        src_addr_be: container_be,
        dst_addr_be: node_addr,
        src_port_be: container_port_be,
        dst_port_be: 0,
        proto: client.proto,
        family: client.family,
        _pad0: 0,
    };
    scratch.reply = CtEntry {
        nat_addr_be: client.src_addr_be,
        nat_port_be: client.src_port_be,
        kind: ct_kind::UNMASQ,
        mapping,
        last_seen_ns: now,
        ..CtEntry::default()
    };
    // Towards the container the source becomes node_addr and the port
    // tried (filled in below).
    scratch.forward = CtEntry {
        nat_addr_be: node_addr,
        kind: ct_kind::SNAT,
        mapping,
        last_seen_ns: now,
        ..CtEntry::default()
    };
    let mut tries = 0;
    while tries < MASQ_PORT_TRIES {
        // SAFETY: no arguments.
        let random = unsafe { bpf_get_prandom_u32() };
        let port = MASQ_PORT_MIN + (random % MASQ_PORT_COUNT as u32) as u16;
        scratch.reply_key.dst_port_be = port.to_be();
        scratch.forward.nat_port_be = port.to_be();
        // IfFree: a port in use by another masqueraded flow to the same
        // container port is not taken over.
        match maps::ct_put_pair(
            maps::Table::for_proto(client.proto),
            (&scratch.reply_key, &scratch.reply),
            Insert::IfFree,
            (&scratch.forward_key, &scratch.forward),
        ) {
            Ok(()) => {
                maps::count(stat::MASQ);
                return;
            }
            Err(PairFailed::Second) => {
                maps::count(stat::CT_INSERT_FAILED);
                return;
            }
            Err(PairFailed::First) => tries += 1,
        }
    }
    maps::count(stat::MASQ_NO_PORT);
}

/// The node's address on the interface the kernel will send `container_be`
/// out of: where the container's answer must come back to.
/// `params` is the caller's scratch space for the lookup.
#[inline(always)]
fn masquerade_source(
    ctx: &TcContext,
    params: &mut bpf_fib_lookup,
    family: u8,
    container_be: &[u32; 4],
) -> Option<[u32; 4]> {
    let iface = maps::iface(fib::output_interface(ctx, params, family, container_be)?)?;
    if family == FAMILY_V4 {
        (iface.addr4_be != 0).then_some([iface.addr4_be, 0, 0, 0])
    } else {
        (iface.addr6_be != [0; 4]).then_some(iface.addr6_be)
    }
}
