//! ebpf-portmap dataplane: hostPort DNAT for traffic arriving at the node
//! (tc ingress) and reverse NAT of the replies (tc egress).
#![no_std]
#![no_main]

mod counters;
mod ct;
mod maps;
mod nat;
mod parse;
mod sock;
mod trace;

use aya_ebpf::{
    bindings::{
        BPF_FIB_LKUP_RET_FWD_DISABLED, BPF_FIB_LKUP_RET_NO_NEIGH, BPF_FIB_LKUP_RET_NOT_FWDED,
        TC_ACT_OK, TC_ACT_REDIRECT, bpf_fib_lookup,
    },
    helpers::{bpf_fib_lookup as fib_lookup, bpf_get_prandom_u32, bpf_redirect, bpf_redirect_peer},
    macros::classifier,
    programs::TcContext,
};
use portmap_common::{
    CtEntry, CtKey, FAMILY_V4, MappingKey, MappingValue, ct_kind,
    local::{MASQ_PORT_COUNT, MASQ_PORT_MIN, MASQ_PORT_TRIES, iface_flags, node_flags},
    stat, trace_direction,
};

use crate::{counters::Way, nat::Side, parse::Packet};

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
        ingress(&mut ctx, &packet);
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
        if egress(&mut ctx, &packet) {
            count_from_scratch(&ctx, Way::Out);
        }
        trace::end_if_tracing(&ctx, trace_direction::EGRESS);
    }
    TC_ACT_OK as i32
}

#[inline(always)]
fn ingress(ctx: &mut TcContext, packet: &Packet) {
    if packet.fragment {
        maps::count(stat::SKIP_FRAGMENT);
        return;
    }
    let now = ct::now();
    let opens = packet.opens_flow();
    // A TCP SYN or SCTP INIT always starts over from the mappings; anything
    // else follows its flow first.
    if (!opens || packet.proto == portmap_common::PROTO_UDP) && existing_flow(ctx, packet, now) {
        return;
    }
    // Masquerading is decided after new_flow returns, not inside it: its
    // frame would not fit on BPF's stack below new_flow's.
    // What follows a new flow reads its state from scratch, after
    // new_flow's frame is gone: stacked, the frames do not fit in 512 bytes.
    if new_flow(ctx, packet, opens, now) {
        translated_new_flow(ctx);
        if wants_masquerade(ctx) {
            masquerade(ctx);
        }
    }
}

/// What the fast path may do with the packet being handled, left in
/// scratch by the handling code for [`fast_path`].
mod fast {
    pub const NONE: u8 = 0;
    /// Translated towards the container (its address in
    /// `scratch.forward.nat_addr_be`, the owner in `scratch.owner_id`).
    pub const FORWARD: u8 = 1;
    /// A container's answer that egress translates back (its tuple in
    /// `scratch.reply_key`).
    pub const REPLY: u8 = 2;
}

/// Translates a packet of a known flow. Returns whether the packet is dealt
/// with; `false` sends a UDP datagram of a stale flow on to `new_flow`.
/// Not inlined: the hot path and `new_flow` get separate stack frames, which
/// keeps the deepest call chain within BPF's 512-byte stack.
#[inline(never)]
fn existing_flow(ctx: &mut TcContext, packet: &Packet, now: u64) -> bool {
    let key = ct::key_of(packet);
    let Some(entry) = ct::lookup(&key, now) else {
        return false;
    };
    // The container end of the flow, to check its mapping still holds: the
    // new destination of a translated packet, the source of an answer to a
    // masqueraded one.
    let (container_be, container_port_be, done) = match entry.kind {
        ct_kind::DNAT => (entry.nat_addr_be, entry.nat_port_be, stat::DNAT),
        ct_kind::UNMASQ => (packet.src_be, packet.sport_be, stat::UNMASQ),
        ct_kind::PASS => {
            maps::count(stat::SKIP_LOCAL_ORIGIN);
            return true;
        }
        ct_kind::REPLY => {
            // A container answering a translated flow: egress translates
            // it back; the fast path may take it there directly.
            if let Some(scratch) = maps::scratch() {
                // SAFETY: per-CPU scratch, no other user meanwhile.
                unsafe {
                    (*scratch).reply_key = key;
                    (*scratch).fast = fast::REPLY;
                }
            }
            return true;
        }
        _ => return true,
    };
    let Some(owner_id) = ct::still_mapped(&entry.mapping, &container_be, container_port_be) else {
        maps::count(stat::STALE_FLOW);
        // A UDP datagram is translated anew by the mapping as it is now;
        // the rest of a stale TCP/SCTP flow passes untouched.
        return entry.kind != ct_kind::DNAT || !packet.opens_flow();
    };
    // One rewrite call site for both kinds: each inlined copy costs the
    // verifier a full walk of the checksum code.
    if nat::rewrite(
        ctx,
        packet,
        Side::Destination,
        &entry.nat_addr_be,
        entry.nat_port_be,
    ) {
        maps::count(done);
        if entry.kind == ct_kind::DNAT {
            counters::record(ctx, &entry.mapping, owner_id, Way::In);
            if let Some(scratch) = maps::scratch() {
                // SAFETY: per-CPU scratch, no other user meanwhile.
                unsafe {
                    (*scratch).forward_key.family = packet.family;
                    (*scratch).forward.nat_addr_be = entry.nat_addr_be;
                    (*scratch).owner_id = owner_id;
                    (*scratch).fast = fast::FORWARD;
                }
            }
        }
    } else {
        maps::count(stat::REWRITE_FAILED);
    }
    true
}

/// A packet that may open a translated flow: find its mapping, check it is
/// for the node, record both directions and translate. Not inlined: it has
/// its own stack frame, so its buffers do not add to the hot path's.
///
/// Returns whether it translated a new flow (its entries are left in
/// `scratch` for the counters and `masquerade`).
#[inline(never)]
fn new_flow(ctx: &mut TcContext, packet: &Packet, opens: bool, now: u64) -> bool {
    let key = ct::key_of(packet);
    let Some((mapping_key, mapping)) =
        find_mapping(packet.family, packet.proto, &packet.dst_be, packet.dport_be)
    else {
        return false;
    };
    if !opens {
        maps::count(stat::SKIP_NOT_SYN);
        return false;
    }
    match local_destination(ctx, packet) {
        Locality::Local => {}
        Locality::NotLocal => {
            maps::count(stat::SKIP_NOT_LOCAL);
            return false;
        }
        Locality::ForwardingDisabled => {
            maps::count(stat::FWD_DISABLED);
            return false;
        }
    }
    // Both directions are built in per-CPU scratch space: on the stack
    // they would not fit BPF's 512 bytes together with the caller's frame.
    let Some(scratch) = maps::scratch() else {
        return false;
    };
    // SAFETY: per-CPU scratch, no other user while this program runs.
    let scratch = unsafe { &mut *scratch };
    scratch.forward_key = key;
    scratch.forward = CtEntry {
        nat_addr_be: mapping.container_addr_be,
        nat_port_be: mapping.container_port_be,
        kind: ct_kind::DNAT,
        mapping: mapping_key,
        last_seen_ns: now,
        ..CtEntry::default()
    };
    scratch.reply = CtEntry {
        nat_addr_be: packet.dst_be,
        nat_port_be: packet.dport_be,
        kind: ct_kind::REPLY,
        mapping: mapping_key,
        last_seen_ns: now,
        ..CtEntry::default()
    };
    // The answer comes from the container to the client.
    scratch.reply_key = CtKey {
        src_addr_be: mapping.container_addr_be,
        dst_addr_be: packet.src_be,
        src_port_be: mapping.container_port_be,
        dst_port_be: packet.sport_be,
        proto: packet.proto,
        family: packet.family,
        _pad0: 0,
    };
    // Reply state first: a translated packet whose answer cannot be
    // translated back would only confuse the client.
    if !maps::ct_put(&scratch.reply_key, &scratch.reply)
        || !maps::ct_put(&scratch.forward_key, &scratch.forward)
    {
        maps::count(stat::CT_INSERT_FAILED);
        return false;
    }
    scratch.owner_id = mapping.owner_id;
    if nat::rewrite(
        ctx,
        packet,
        Side::Destination,
        &mapping.container_addr_be,
        mapping.container_port_be,
    ) {
        maps::count(stat::DNAT_NEW);
        true
    } else {
        maps::count(stat::REWRITE_FAILED);
        false
    }
}

/// Not inlined: with its frame inside the entry point's, the trace call
/// after it does not fit BPF's stack (and bpf-linker crashes on it).
#[inline(never)]
fn egress(ctx: &mut TcContext, packet: &Packet) -> bool {
    if packet.fragment {
        return false;
    }
    let now = ct::now();
    let key = ct::key_of(packet);
    if let Some(entry) = ct::lookup(&key, now) {
        // The container end of the flow: the destination of a masqueraded
        // flow on its way to the container, the source of an answer.
        let (container_be, container_port_be) = match entry.kind {
            ct_kind::SNAT => (packet.dst_be, packet.dport_be),
            ct_kind::REPLY => (packet.src_be, packet.sport_be),
            _ => return false,
        };
        let Some(owner_id) = ct::still_mapped(&entry.mapping, &container_be, container_port_be)
        else {
            maps::count(stat::STALE_FLOW);
            return false;
        };
        // One rewrite call site for both kinds (see existing_flow).
        if nat::rewrite(
            ctx,
            packet,
            Side::Source,
            &entry.nat_addr_be,
            entry.nat_port_be,
        ) {
            if entry.kind == ct_kind::REPLY {
                maps::count(stat::REPLY);
                // Counted by the caller from scratch, after this frame is
                // gone: stacked, the frames exceed 512 bytes on 6.1.
                if let Some(scratch) = maps::scratch() {
                    // SAFETY: per-CPU scratch, no other user meanwhile.
                    unsafe {
                        (*scratch).forward.mapping = entry.mapping;
                        (*scratch).owner_id = owner_id;
                    }
                    return true;
                }
            }
        } else {
            maps::count(stat::REWRITE_FAILED);
        }
        return false;
    }
    // A flow leaving from a mapped host port that we did not translate: the
    // node (or a masqueraded container) opened it. Remember it so its
    // answers are never taken for new inbound traffic.
    if find_mapping(packet.family, packet.proto, &packet.src_be, packet.sport_be).is_some() {
        let pass = CtEntry {
            kind: ct_kind::PASS,
            last_seen_ns: now,
            ..CtEntry::default()
        };
        // Never over a translation: on a bridge the reply of a translated
        // flow crosses a second egress hook (the bridge port) after the
        // first rewrote it to the host port, and must stay translated.
        if maps::ct_put_new(&ct::reversed(&key), &pass) {
            maps::count(stat::PASS_RECORDED);
        }
    }
    false
}

/// The fast path, for what the handling code left in scratch: sets
/// `scratch.action` (OK, or REDIRECT when the packet was handed over) and
/// clears the request. One call site, after the handling frames are gone,
/// so the verifier walks it once.
#[inline(never)]
fn fast_path(ctx: &TcContext) {
    let Some(scratch) = maps::scratch() else {
        return;
    };
    // SAFETY: per-CPU scratch, no other user while this program runs.
    let (what, action) = unsafe {
        let what = (*scratch).fast;
        (*scratch).fast = fast::NONE;
        (*scratch).action = TC_ACT_OK as i32;
        (what, &raw mut (*scratch).action)
    };
    let taken = match what {
        fast::FORWARD => fast_forward(ctx),
        fast::REPLY => fast_reply(ctx),
        _ => return,
    };
    // SAFETY: as above.
    unsafe { *action = taken };
}

/// Whether `fastPath` is on and the packet arrived from the containers'
/// side (`true`) or from elsewhere (`false`); `None` without the fast path.
#[inline(always)]
fn fast_path_from_containers(ctx: &TcContext) -> Option<bool> {
    let node = maps::node_config()?;
    // masqAll rewrites the source on the way to the container, in egress
    // of the container's interface: the hand-over would skip it.
    if node.flags & node_flags::FAST_PATH == 0 || node.flags & node_flags::MASQ_ALL != 0 {
        return None;
    }
    // SAFETY: reading a field of the context the program was handed.
    let ifindex = unsafe { (*ctx.skb.skb).ingress_ifindex };
    Some(maps::iface(ifindex).is_some_and(|i| i.flags & iface_flags::CONTAINER_SIDE != 0))
}

/// The fast path towards a container: a packet from outside, translated,
/// goes straight into the container's interface (`bpf_redirect_peer`),
/// skipping the node's routing, netfilter and bridge. Only when the
/// hand-over entry belongs to the owner of the mapping that translated it.
/// Reads what existing_flow or new_flow left in scratch.
#[inline(never)]
fn fast_forward(ctx: &TcContext) -> i32 {
    let pass = TC_ACT_OK as i32;
    // Hairpin flows (from the containers' side) stay on the normal path,
    // where their masquerade is done.
    if fast_path_from_containers(ctx) != Some(false) {
        return pass;
    }
    let Some(scratch) = maps::scratch() else {
        return pass;
    };
    // SAFETY: per-CPU scratch, filled for this packet.
    let (family, container_be, owner_id) = unsafe {
        (
            (*scratch).forward_key.family,
            (*scratch).forward.nat_addr_be,
            (*scratch).owner_id,
        )
    };
    let Some(peer) = maps::peer(family, &container_be) else {
        return pass;
    };
    if peer.owner_id != owner_id {
        return pass;
    }
    // The frame as the node's side of the link would send it: to the
    // container's MAC, from the gateway's (adjacent fields, in this order).
    // SAFETY: both MACs lie within `peer`, 12 bytes from offset 12.
    let macs: [u8; 12] =
        unsafe { core::ptr::read_unaligned((&raw const peer.container_mac).cast::<[u8; 12]>()) };
    if ctx.store(0, &macs, 0).is_err() {
        return pass;
    }
    // SAFETY: plain helper call; it only records where the skb goes.
    let action = unsafe { bpf_redirect_peer(peer.ifindex, 0) } as i32;
    if action == TC_ACT_REDIRECT as i32 {
        maps::count(stat::FAST_FORWARD);
    }
    action
}

/// The fast path back: a container's answer goes straight to the egress of
/// the interface towards its client (as the node's FIB says, with the
/// neighbour it knows), where egress translates it back as usual. It skips
/// the node's routing, netfilter and, on a bridge, nothing more. Anything
/// the FIB does not answer plainly (no neighbour yet, too big, not
/// forwarded) takes the normal path. Reads the tuple existing_flow left in
/// scratch.
#[inline(never)]
fn fast_reply(ctx: &TcContext) -> i32 {
    let pass = TC_ACT_OK as i32;
    if fast_path_from_containers(ctx) != Some(true) {
        return pass;
    }
    let Some(scratch) = maps::scratch() else {
        return pass;
    };
    // SAFETY: per-CPU scratch, no other user while this program runs.
    let scratch = unsafe { &mut *scratch };
    let key = scratch.reply_key;
    let params = &mut scratch.fib;
    let ret = fib_lookup_as_received(
        ctx,
        params,
        key.family,
        key.proto,
        (&key.src_addr_be, key.src_port_be),
        (&key.dst_addr_be, key.dst_port_be),
    );
    // Only to an interface whose egress program translates the answer.
    if ret != 0 || maps::iface(params.ifindex).is_none() {
        return pass;
    }
    if ctx.store(0, &params.dmac, 0).is_err() || ctx.store(6, &params.smac, 0).is_err() {
        return pass;
    }
    // SAFETY: plain helper call; it only records where the skb goes.
    let action = unsafe { bpf_redirect(params.ifindex, 0) } as i32;
    if action == TC_ACT_REDIRECT as i32 {
        maps::count(stat::FAST_REPLY);
    }
    action
}

/// After new_flow translated a flow: counts it, and offers the packet to
/// the fast path (masquerade withdraws the offer). Not inlined: in the
/// entry point's frame these few lines cost stack the 6.1 verifier lacks.
#[inline(never)]
fn translated_new_flow(ctx: &TcContext) {
    count_from_scratch(ctx, Way::In);
    if let Some(scratch) = maps::scratch() {
        // SAFETY: per-CPU scratch, no other user while this program runs.
        unsafe { (*scratch).fast = fast::FORWARD };
    }
}

/// Counts a translated packet on its mapping: the first of a new flow
/// (`In`) or an answer (`Out`); new_flow or egress left the mapping and its
/// owner in scratch.
#[inline(always)]
fn count_from_scratch(ctx: &TcContext, way: Way) {
    let Some(scratch) = maps::scratch() else {
        return;
    };
    // SAFETY: per-CPU scratch, filled for this packet.
    let (mapping, owner_id) = unsafe { ((*scratch).forward.mapping, (*scratch).owner_id) };
    counters::record(ctx, &mapping, owner_id, way);
}

/// Whether a new flow arriving on this interface is masqueraded: every flow
/// with `masqAll`; with `snat`, flows from containers (hairpin), whose
/// answer would otherwise go straight back to the client, bypassing the
/// node and its translation.
#[inline(always)]
fn wants_masquerade(ctx: &TcContext) -> bool {
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
fn masquerade(ctx: &TcContext) {
    let Some(scratch) = maps::scratch() else {
        return;
    };
    // SAFETY: per-CPU scratch, no other user while this program runs.
    let scratch = unsafe { &mut *scratch };
    // A masqueraded flow's source is rewritten on the way to the container,
    // by egress of its interface: the fast path would skip that.
    scratch.fast = fast::NONE;
    // Everything comes from the entries new_flow left in scratch, nothing
    // from the caller's stack: the verifier then walks this function once,
    // not once per path through new_flow.
    let client = scratch.forward_key;
    let now = scratch.forward.last_seen_ns;
    let container_be = scratch.forward.nat_addr_be;
    let container_port_be = scratch.forward.nat_port_be;
    let mapping = scratch.forward.mapping;
    let Some(node_addr) = masquerade_source(ctx, client.family, &container_be) else {
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
    let mut tries = 0;
    while tries < MASQ_PORT_TRIES {
        // SAFETY: no arguments.
        let random = unsafe { bpf_get_prandom_u32() };
        let port = MASQ_PORT_MIN + (random % MASQ_PORT_COUNT as u32) as u16;
        scratch.reply_key.dst_port_be = port.to_be();
        // NOEXIST: a port in use by another masqueraded flow to the same
        // container port is not taken over.
        if maps::ct_put_new(&scratch.reply_key, &scratch.reply) {
            scratch.forward = CtEntry {
                nat_addr_be: node_addr,
                nat_port_be: port.to_be(),
                kind: ct_kind::SNAT,
                mapping,
                last_seen_ns: now,
                ..CtEntry::default()
            };
            if maps::ct_put(&scratch.forward_key, &scratch.forward) {
                maps::count(stat::MASQ);
            } else {
                maps::count(stat::CT_INSERT_FAILED);
            }
            return;
        }
        tries += 1;
    }
    maps::count(stat::MASQ_NO_PORT);
}

/// The node's address on the interface the kernel will send `container_be`
/// out of: where the container's answer must come back to.
#[inline(always)]
fn masquerade_source(ctx: &TcContext, family: u8, container_be: &[u32; 4]) -> Option<[u32; 4]> {
    let scratch = maps::scratch()?;
    // SAFETY: per-CPU scratch, no other user while this program runs.
    let params = unsafe { &mut (*scratch).fib };
    zero_fib_params(params);
    params.family = if family == FAMILY_V4 { 2 } else { 10 };
    // SAFETY: reading a field of the context the program was handed.
    params.ifindex = unsafe { (*ctx.skb.skb).ingress_ifindex };
    if family == FAMILY_V4 {
        params.__bindgen_anon_4.ipv4_dst = container_be[0];
    } else {
        params.__bindgen_anon_4.ipv6_dst = *container_be;
    }
    // SAFETY: params is a valid, fully initialised struct of the size passed.
    let ret = unsafe {
        fib_lookup(
            ctx.skb.skb as *mut _,
            params,
            core::mem::size_of::<bpf_fib_lookup>() as i32,
            0,
        )
    };
    if ret != 0 && ret as u32 != BPF_FIB_LKUP_RET_NO_NEIGH {
        return None;
    }
    let iface = maps::iface(params.ifindex)?;
    if family == FAMILY_V4 {
        (iface.addr4_be != 0).then_some([iface.addr4_be, 0, 0, 0])
    } else {
        (iface.addr6_be != [0; 4]).then_some(iface.addr6_be)
    }
}

/// The mapping for `addr:port`: one for exactly that host address first,
/// else the wildcard of the family. O(1) whatever the number of mappings.
#[inline(always)]
fn find_mapping(
    family: u8,
    proto: u8,
    addr_be: &[u32; 4],
    port_be: u16,
) -> Option<(MappingKey, MappingValue)> {
    let mut key = MappingKey {
        host_addr_be: *addr_be,
        host_port_be: port_be,
        proto,
        family,
    };
    if let Some(value) = maps::mapping(&key) {
        return Some((key, value));
    }
    key.host_addr_be = [0; 4];
    maps::mapping(&key).map(|value| (key, value))
}

enum Locality {
    Local,
    NotLocal,
    ForwardingDisabled,
}

/// Whether the packet is addressed to the node itself (iptables'
/// `--dst-type LOCAL`): transit traffic is never captured. The FIB answers
/// "not forwarded" for local (and broadcast) destinations.
#[inline(never)]
fn local_destination(ctx: &TcContext, packet: &Packet) -> Locality {
    // The 64-byte lookup struct lives in per-CPU scratch, not on the stack.
    let Some(scratch) = maps::scratch() else {
        return Locality::NotLocal;
    };
    // SAFETY: per-CPU scratch, no other user while this program runs.
    let params = unsafe { &mut (*scratch).fib };
    let ret = fib_lookup_as_received(
        ctx,
        params,
        packet.family,
        packet.proto,
        (&packet.src_be, packet.sport_be),
        (&packet.dst_be, packet.dport_be),
    );
    match ret as u32 {
        BPF_FIB_LKUP_RET_NOT_FWDED => Locality::Local,
        BPF_FIB_LKUP_RET_FWD_DISABLED => Locality::ForwardingDisabled,
        _ => Locality::NotLocal,
    }
}

/// The FIB's answer for a packet `src` -> `dst` (address, port) as if
/// received on the ingress interface: what routing would do with it.
/// `tot_len` stays 0, so the kernel checks the MTU itself, GSO aware.
#[inline(always)]
fn fib_lookup_as_received(
    ctx: &TcContext,
    params: &mut bpf_fib_lookup,
    family: u8,
    proto: u8,
    src: (&[u32; 4], u16),
    dst: (&[u32; 4], u16),
) -> i64 {
    zero_fib_params(params);
    params.family = if family == FAMILY_V4 { 2 } else { 10 };
    params.l4_protocol = proto;
    params.sport = src.1;
    params.dport = dst.1;
    // SAFETY: reading a field of the context the program was handed.
    params.ifindex = unsafe { (*ctx.skb.skb).ingress_ifindex };
    if family == FAMILY_V4 {
        params.__bindgen_anon_3.ipv4_src = src.0[0];
        params.__bindgen_anon_4.ipv4_dst = dst.0[0];
    } else {
        params.__bindgen_anon_3.ipv6_src = *src.0;
        params.__bindgen_anon_4.ipv6_dst = *dst.0;
    }
    // SAFETY: params is a valid, fully initialised struct of the size passed.
    unsafe {
        fib_lookup(
            ctx.skb.skb as *mut _,
            params,
            core::mem::size_of::<bpf_fib_lookup>() as i32,
            0,
        )
    }
}

/// Zeroes FIB lookup parameters word by word: `mem::zeroed()` becomes a
/// call to memset, one more frame on the deepest call chain (over 512 bytes
/// on 6.1).
#[inline(always)]
fn zero_fib_params(params: &mut bpf_fib_lookup) {
    let words = params as *mut bpf_fib_lookup as *mut u64;
    let mut i = 0;
    while i < core::mem::size_of::<bpf_fib_lookup>() / 8 {
        // SAFETY: within the 64-byte struct, which is 8-byte aligned.
        unsafe { core::ptr::write_volatile(words.add(i), 0) };
        i += 1;
    }
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
