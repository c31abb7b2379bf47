//! FIB lookups: is a packet for the node, and where would routing send it.

use aya_ebpf::{
    bindings::{
        BPF_FIB_LKUP_RET_FWD_DISABLED, BPF_FIB_LKUP_RET_NO_NEIGH, BPF_FIB_LKUP_RET_NOT_FWDED,
        bpf_fib_lookup,
    },
    helpers::bpf_fib_lookup as fib_lookup,
    programs::TcContext,
};
use portmap_common::FAMILY_V4;

use crate::{maps, parse::Packet};

pub enum Locality {
    Local,
    NotLocal,
    /// The node would deliver it locally, but to none of the addresses a
    /// hostPort answers on (`local_addrs`): a broadcast or multicast
    /// destination, one the node has no route to, or an address of a
    /// Service VIP device (`serviceVipDevices`).
    NotNodeAddress,
    ForwardingDisabled,
}

/// Whether the packet is addressed to the node itself (iptables'
/// `--dst-type LOCAL`): transit traffic is never captured. The FIB answers
/// "not forwarded" for the node's addresses, and as well for broadcast and
/// multicast destinations and for destinations without a route. For a
/// `wildcard` mapping only the node's addresses as the last sync wrote
/// them (`local_addrs`, the socket hooks' list too) are local: never a
/// broadcast, a destination without a route or a Service VIP, also one
/// made since. A specific hostIP is the operator's own choice of address:
/// local as soon as the FIB says so (a VIP that keepalived moves here
/// answers at once, as upstream's does).
#[inline(never)]
pub fn local_destination(ctx: &TcContext, packet: &Packet, wildcard: bool) -> Locality {
    // The 64-byte lookup struct lives in per-CPU scratch, not on the stack.
    let Some(scratch) = maps::scratch() else {
        return Locality::NotLocal;
    };
    let params = &mut scratch.fib;
    let ret = fib_lookup_as_received(
        ctx,
        params,
        packet.family,
        packet.proto,
        (&packet.src_be, packet.sport_be),
        (&packet.dst_be, packet.dport_be),
    );
    match ret as u32 {
        BPF_FIB_LKUP_RET_NOT_FWDED if !wildcard => Locality::Local,
        BPF_FIB_LKUP_RET_NOT_FWDED => {
            let key = &mut scratch.local_key;
            key.addr_be = packet.dst_be;
            key.family = packet.family;
            // Byte by byte: an array store of the unaligned padding
            // became a call to the byte-loop `memset`.
            for byte in &mut key._pad0 {
                // SAFETY: a byte of this CPU's scratch value.
                unsafe { core::ptr::write_volatile(byte, 0) };
            }
            if maps::is_local_addr_key(key) {
                Locality::Local
            } else {
                Locality::NotNodeAddress
            }
        }
        BPF_FIB_LKUP_RET_FWD_DISABLED => Locality::ForwardingDisabled,
        _ => Locality::NotLocal,
    }
}

/// The FIB's answer for a packet `src` -> `dst` (address, port) as if
/// received on the ingress interface: what routing would do with it.
/// `tot_len` stays 0, so the kernel checks the MTU itself, GSO aware.
#[inline(always)]
pub fn fib_lookup_as_received(
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

/// Whether `addr_be` is one of the node's addresses, as the FIB knows them
/// now (not as the last plugin run recorded them): a route lookup for it,
/// as if a packet for it arrived on the interface the packet is leaving
/// by, answers "not forwarded" for a local address. `None` when the FIB
/// cannot tell (forwarding disabled on that interface, no such interface).
#[inline(always)]
pub fn is_node_address(ctx: &TcContext, family: u8, addr_be: &[u32; 4]) -> Option<bool> {
    // The 64-byte lookup struct lives in per-CPU scratch, not on the stack.
    let params = &mut maps::scratch()?.fib;
    // SAFETY: reading a field of the context the program was handed.
    let leaving_by = unsafe { (*ctx.skb.skb).ifindex };
    match route_to(ctx, params, family, leaving_by, addr_be) {
        r if r == i64::from(BPF_FIB_LKUP_RET_NOT_FWDED) => Some(true),
        r if r < 0 || r == i64::from(BPF_FIB_LKUP_RET_FWD_DISABLED) => None,
        _ => Some(false),
    }
}

/// The interface the kernel would send a packet for `dst_be` out of, as if
/// it had arrived on the ingress interface; also when it does not know the
/// neighbour yet. `None` without a route.
#[inline(always)]
pub fn output_interface(
    ctx: &TcContext,
    params: &mut bpf_fib_lookup,
    family: u8,
    dst_be: &[u32; 4],
) -> Option<u32> {
    // SAFETY: reading a field of the context the program was handed.
    let arrived_on = unsafe { (*ctx.skb.skb).ingress_ifindex };
    let ret = route_to(ctx, params, family, arrived_on, dst_be);
    (ret == 0 || ret as u32 == BPF_FIB_LKUP_RET_NO_NEIGH).then_some(params.ifindex)
}

/// The FIB's answer for a packet to `dst_be` (no source, no ports) as if
/// received on interface `ifindex`; `params` holds the rest of the answer.
#[inline(always)]
fn route_to(
    ctx: &TcContext,
    params: &mut bpf_fib_lookup,
    family: u8,
    ifindex: u32,
    dst_be: &[u32; 4],
) -> i64 {
    zero_fib_params(params);
    params.family = if family == FAMILY_V4 { 2 } else { 10 };
    params.ifindex = ifindex;
    if family == FAMILY_V4 {
        params.__bindgen_anon_4.ipv4_dst = dst_be[0];
    } else {
        params.__bindgen_anon_4.ipv6_dst = *dst_be;
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
