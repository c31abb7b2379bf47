//! ebpf-portmap dataplane: hostPort DNAT for traffic arriving at the node
//! (tc ingress) and reverse NAT of the replies (tc egress).
#![no_std]
#![no_main]

mod ct;
mod maps;
mod nat;
mod parse;

use aya_ebpf::{
    bindings::{
        BPF_FIB_LKUP_RET_FWD_DISABLED, BPF_FIB_LKUP_RET_NOT_FWDED, TC_ACT_OK, bpf_fib_lookup,
    },
    helpers::bpf_fib_lookup as fib_lookup,
    macros::classifier,
    programs::TcContext,
};
use portmap_common::{CtEntry, CtKey, FAMILY_V4, MappingKey, MappingValue, ct_kind, stat};

use crate::{nat::Side, parse::Packet};

/// Translates traffic that arrives at a node interface for a mapped
/// (hostIP, hostPort, protocol) to the owning container.
#[classifier]
pub fn portmap_ingress(mut ctx: TcContext) -> i32 {
    maps::keep_userspace_maps();
    if let Some(packet) = parse::parse(&ctx) {
        ingress(&mut ctx, &packet);
    }
    TC_ACT_OK as i32
}

/// Restores the node address and hostPort on replies of translated flows,
/// and remembers flows the node opens from a mapped port.
#[classifier]
pub fn portmap_egress(mut ctx: TcContext) -> i32 {
    if let Some(packet) = parse::parse(&ctx) {
        egress(&mut ctx, &packet);
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
    new_flow(ctx, packet, opens, now);
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
    match entry.kind {
        ct_kind::DNAT => {
            if ct::still_mapped(&entry.mapping, &entry.nat_addr_be, entry.nat_port_be) {
                if nat::rewrite(
                    ctx,
                    packet,
                    Side::Destination,
                    &entry.nat_addr_be,
                    entry.nat_port_be,
                ) {
                    maps::count(stat::DNAT);
                } else {
                    maps::count(stat::REWRITE_FAILED);
                }
                return true;
            }
            maps::count(stat::STALE_FLOW);
            // A UDP datagram is translated anew by the mapping as it is now;
            // the rest of a stale TCP/SCTP flow passes untouched.
            !packet.opens_flow()
        }
        ct_kind::PASS => {
            maps::count(stat::SKIP_LOCAL_ORIGIN);
            true
        }
        _ => true,
    }
}

/// A packet that may open a translated flow: find its mapping, check it is
/// for the node, record both directions and translate. Not inlined: it has
/// its own stack frame, so its buffers do not add to the hot path's.
#[inline(never)]
fn new_flow(ctx: &mut TcContext, packet: &Packet, opens: bool, now: u64) {
    let key = ct::key_of(packet);
    let Some((mapping_key, mapping)) =
        find_mapping(packet.family, packet.proto, &packet.dst_be, packet.dport_be)
    else {
        return;
    };
    if !opens {
        maps::count(stat::SKIP_NOT_SYN);
        return;
    }
    match local_destination(ctx, packet) {
        Locality::Local => {}
        Locality::NotLocal => {
            maps::count(stat::SKIP_NOT_LOCAL);
            return;
        }
        Locality::ForwardingDisabled => {
            maps::count(stat::FWD_DISABLED);
            return;
        }
    }
    // Both directions are built in per-CPU scratch space: on the stack
    // they would not fit BPF's 512 bytes together with the caller's frame.
    let Some(scratch) = maps::scratch() else {
        return;
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
        return;
    }
    if nat::rewrite(
        ctx,
        packet,
        Side::Destination,
        &mapping.container_addr_be,
        mapping.container_port_be,
    ) {
        maps::count(stat::DNAT_NEW);
    } else {
        maps::count(stat::REWRITE_FAILED);
    }
}

#[inline(always)]
fn egress(ctx: &mut TcContext, packet: &Packet) {
    if packet.fragment {
        return;
    }
    let now = ct::now();
    let key = ct::key_of(packet);
    if let Some(entry) = ct::lookup(&key, now) {
        if entry.kind == ct_kind::REPLY {
            if ct::still_mapped(&entry.mapping, &packet.src_be, packet.sport_be) {
                if nat::rewrite(
                    ctx,
                    packet,
                    Side::Source,
                    &entry.nat_addr_be,
                    entry.nat_port_be,
                ) {
                    maps::count(stat::REPLY);
                } else {
                    maps::count(stat::REWRITE_FAILED);
                }
            } else {
                maps::count(stat::STALE_FLOW);
            }
        }
        return;
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
        if maps::ct_put(&ct::reversed(&key), &pass) {
            maps::count(stat::PASS_RECORDED);
        } else {
            maps::count(stat::CT_INSERT_FAILED);
        }
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
    // SAFETY: zeroed plain-old-data struct.
    *params = unsafe { core::mem::zeroed() };
    params.family = if packet.family == FAMILY_V4 { 2 } else { 10 };
    params.l4_protocol = packet.proto;
    params.sport = packet.sport_be;
    params.dport = packet.dport_be;
    // SAFETY: reading a field of the context the program was handed.
    params.ifindex = unsafe { (*ctx.skb.skb).ingress_ifindex };
    if packet.family == FAMILY_V4 {
        params.__bindgen_anon_3.ipv4_src = packet.src_be[0];
        params.__bindgen_anon_4.ipv4_dst = packet.dst_be[0];
    } else {
        params.__bindgen_anon_3.ipv6_src = packet.src_be;
        params.__bindgen_anon_4.ipv6_dst = packet.dst_be;
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
    match ret as u32 {
        BPF_FIB_LKUP_RET_NOT_FWDED => Locality::Local,
        BPF_FIB_LKUP_RET_FWD_DISABLED => Locality::ForwardingDisabled,
        _ => Locality::NotLocal,
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
