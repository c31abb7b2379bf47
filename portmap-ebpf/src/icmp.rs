//! ICMP errors about translated flows, translated as netfilter's NAT
//! translates them for upstream's DNAT (`nf_nat_icmp_reply_translation`).
//!
//! An error quotes the packet it is about, as that packet was where the
//! error was made: with the container's address and port when it was made
//! on the container's side of the translation, with the host's when it was
//! made on the client's. Left as it is, the quote matches no socket at the
//! other end:
//!
//! - **Towards a client** (an `ICMP`/`ICMPv6` error about a packet the
//!   client sent to a host port: a container's "port unreachable" for a UDP
//!   port nothing listens on, the node's own reject from a firewall rule, a
//!   "fragmentation needed" for a bridge of smaller MTU): the quoted
//!   destination goes back to the host address and port, and a container's
//!   own source address to the host address. Without it the client's
//!   socket never learns (a UDP client waits for an answer, a TCP client
//!   for its connect to time out, a path MTU is never lowered), and the
//!   container's error leaves the node from the pod's address.
//! - **Towards a container** (an error about a container's answer, which
//!   left the node from the host port: a router's "fragmentation needed"
//!   or "packet too big" on the way to the client, the client's "port
//!   unreachable"): the outer destination (the host address the answer
//!   came from) and the quoted source go to the container's address and
//!   port. Without it the node drops the error (no socket of its own owns
//!   the quote), and a container sending large answers through a host port
//!   to a client behind a smaller MTU never lowers its path MTU.
//!
//! Which way is the flow's entry's kind, looked up by the quote's tuple
//! reversed: `REPLY` (the container's answer to the quoted packet) or
//! `DNAT` (the client's packet the quote answers). With `fastPath: true`
//! a container's error goes to the interface towards its client directly,
//! as the flow's answers do: netfilter saw none of the flow, so its
//! conntrack has nothing to relate the error to, and kube-proxy's `ct
//! state invalid drop` would drop it. Masqueraded flows
//! (hairpin, `masqAll`) keep their errors as they are. The quoted packet's
//! own transport checksum is left as it is (no receiver checks it); the
//! error's checksum and a quoted IPv4 header's checksum are kept right.

use aya_ebpf::{bindings::BPF_F_PSEUDO_HDR, programs::TcContext};
use portmap_common::{
    CtKey, FAMILY_V4, FAMILY_V6, PROTO_SCTP, PROTO_TCP, PROTO_UDP, PortRole, ct_kind, stat,
};

use crate::{
    ct, maps,
    nat::{csum_diff16, csum_replace4},
    parse::ETH_HLEN,
};

const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86DD;
const IPPROTO_ICMP: u8 = 1;
const IPPROTO_ICMPV6: u8 = 58;

/// A `T` at `offset` of the packet, read by `bpf_skb_load_bytes`: the
/// quote's offsets add two variable header lengths, which direct packet
/// access cannot prove in bounds to the verifier (it refused the load),
/// and an error is rare enough for a helper call per field.
#[inline(always)]
fn load<T: Copy>(ctx: &TcContext, offset: usize) -> Option<T> {
    ctx.load::<T>(offset).ok()
}

/// Where the parts of an ICMP error are, and what it quotes.
struct Quote {
    family: u8,
    proto: u8,
    /// Offset of the error's own checksum.
    csum_off: usize,
    /// Offset of the quoted packet's source address (its destination
    /// follows, 4 or 16 bytes on).
    inner_addr_off: usize,
    /// Offset of the quoted packet's ports.
    inner_l4_off: usize,
    /// Offset of the quoted IPv4 header's checksum (IPv4 only).
    inner_csum_off: usize,
    outer_src: [u32; 4],
    outer_dst: [u32; 4],
    inner_src: [u32; 4],
    inner_dst: [u32; 4],
    sport_be: u16,
    dport_be: u16,
}

/// Where an error is met, which says which errors are translated there:
/// those towards a container at ingress, those towards a client at
/// egress, where the flow's own packets are translated those ways.
/// (Translated at the container's port, an error towards the client
/// would reach the node's routing from a node address, a martian source.)
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    Ingress,
    Egress,
}

/// Translates an ICMP or ICMPv6 error about a translated flow, if the
/// packet is one going the way `hook` translates (see the module docs);
/// anything else passes untouched. Returns whether the packet is a
/// container's error met at ingress, on its way to the client, which the
/// caller may hand to the fast path (`fast::hand_error_to_client`, called
/// after this frame is gone: stacked, the two took ingress past BPF's
/// 512-byte stack). Called for the packets `parse` does not take (no TCP,
/// UDP or SCTP). Not inlined: one walk, off the path of every translated
/// packet.
#[inline(never)]
pub fn translate_error(ctx: &mut TcContext, hook: Hook) -> bool {
    try_translate(ctx, hook).unwrap_or(false)
}

#[inline(always)]
fn try_translate(ctx: &mut TcContext, hook: Hook) -> Option<bool> {
    let quote = quote_of(ctx)?;
    // Only errors about a mapped port can be about a translated flow: a
    // container port quoted as the destination (towards the client), a
    // host port as the source (towards the container, met at ingress,
    // where a container's own error is met too). Array loads before any
    // hash lookup.
    let towards_client = maps::port_is(PortRole::Container, quote.proto, quote.dport_be);
    if !towards_client
        && (hook == Hook::Egress || !maps::port_is(PortRole::Host, quote.proto, quote.sport_be))
    {
        return None;
    }
    // The entry of the packet that would answer the quoted one.
    let key = CtKey {
        src_addr_be: quote.inner_dst,
        dst_addr_be: quote.inner_src,
        src_port_be: quote.dport_be,
        dst_port_be: quote.sport_be,
        proto: quote.proto,
        family: quote.family,
        _pad0: 0,
    };
    let entry = ct::lookup(&key)?;
    // A flow the node's netfilter translates (`ct_kind::NETFILTER`) falls
    // through: its NAT translates the flow's errors too (they are related
    // to its kernel entry).
    let (addr, port) = (entry.nat_addr_be, entry.nat_port_be);
    match (entry.kind, hook) {
        (ct_kind::REPLY, Hook::Egress) => {
            rewrite(ctx, &quote, Quoted::Destination, &addr, port)?;
            maps::count(stat::ICMP_REPLY);
        }
        (ct_kind::DNAT, Hook::Ingress) => {
            rewrite(ctx, &quote, Quoted::Source, &addr, port)?;
            maps::count(stat::ICMP_DNAT);
        }
        // Towards the client, met where the container sent it: egress
        // translates it; with `fastPath: true` it goes there directly.
        (ct_kind::REPLY, Hook::Ingress) => return Some(true),
        _ => {}
    }
    Some(false)
}

/// The error in the packet, if it is an ICMP or ICMPv6 error that quotes a
/// TCP, UDP or SCTP packet of the same family with its ports.
#[inline(always)]
fn quote_of(ctx: &TcContext) -> Option<Quote> {
    match u16::from_be(load::<u16>(ctx, 12)?) {
        ETH_P_IP => quote_v4(ctx),
        ETH_P_IPV6 => quote_v6(ctx),
        _ => None,
    }
}

#[inline(always)]
fn quoted_proto(proto: u8) -> bool {
    matches!(proto, PROTO_TCP | PROTO_UDP | PROTO_SCTP)
}

#[inline(always)]
fn quote_v4(ctx: &TcContext) -> Option<Quote> {
    let l3 = ETH_HLEN;
    let version_ihl = load::<u8>(ctx, l3)?;
    let header_len = usize::from(version_ihl & 0x0f) * 4;
    if version_ihl >> 4 != 4 || header_len < 20 || load::<u8>(ctx, l3 + 9)? != IPPROTO_ICMP {
        return None;
    }
    // A fragment of an error: no whole quote to read.
    if u16::from_be(load::<u16>(ctx, l3 + 6)?) & 0x3fff != 0 {
        return None;
    }
    let icmp = l3 + header_len;
    // Destination unreachable, time exceeded, parameter problem.
    if !matches!(load::<u8>(ctx, icmp)?, 3 | 11 | 12) {
        return None;
    }
    let inner = icmp + 8;
    let inner_version_ihl = load::<u8>(ctx, inner)?;
    let inner_len = usize::from(inner_version_ihl & 0x0f) * 4;
    let proto = load::<u8>(ctx, inner + 9)?;
    if inner_version_ihl >> 4 != 4 || inner_len < 20 || !quoted_proto(proto) {
        return None;
    }
    let inner_l4_off = inner + inner_len;
    let ports = load::<[u16; 2]>(ctx, inner_l4_off)?;
    Some(Quote {
        family: FAMILY_V4,
        proto,
        csum_off: icmp + 2,
        inner_addr_off: inner + 12,
        inner_l4_off,
        inner_csum_off: inner + 10,
        outer_src: [load::<u32>(ctx, l3 + 12)?, 0, 0, 0],
        outer_dst: [load::<u32>(ctx, l3 + 16)?, 0, 0, 0],
        inner_src: [load::<u32>(ctx, inner + 12)?, 0, 0, 0],
        inner_dst: [load::<u32>(ctx, inner + 16)?, 0, 0, 0],
        sport_be: ports[0],
        dport_be: ports[1],
    })
}

#[inline(always)]
fn quote_v6(ctx: &TcContext) -> Option<Quote> {
    let l3 = ETH_HLEN;
    // An error right after the fixed header: errors carry no extension
    // headers of their own in practice (the kernel's never do).
    if load::<u8>(ctx, l3 + 6)? != IPPROTO_ICMPV6 {
        return None;
    }
    let icmp = l3 + 40;
    // Destination unreachable, packet too big, time exceeded, parameter
    // problem.
    if !matches!(load::<u8>(ctx, icmp)?, 1..=4) {
        return None;
    }
    let inner = icmp + 8;
    let proto = load::<u8>(ctx, inner + 6)?;
    if load::<u8>(ctx, inner)? >> 4 != 6 || !quoted_proto(proto) {
        return None;
    }
    let inner_l4_off = inner + 40;
    let ports = load::<[u16; 2]>(ctx, inner_l4_off)?;
    Some(Quote {
        family: FAMILY_V6,
        proto,
        csum_off: icmp + 2,
        inner_addr_off: inner + 8,
        inner_l4_off,
        inner_csum_off: 0,
        outer_src: load::<[u32; 4]>(ctx, l3 + 8)?,
        outer_dst: load::<[u32; 4]>(ctx, l3 + 24)?,
        inner_src: load::<[u32; 4]>(ctx, inner + 8)?,
        inner_dst: load::<[u32; 4]>(ctx, inner + 24)?,
        sport_be: ports[0],
        dport_be: ports[1],
    })
}

/// Which end of the quoted packet a rewrite changes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Quoted {
    /// Towards a client: the quoted destination, and the outer source
    /// where it is the same address (the container's own error).
    Destination,
    /// Towards a container: the quoted source, and the outer destination
    /// where it is the same address (always, for an error that reached
    /// the host address it is about).
    Source,
}

/// Rewrites the quoted `end` to `addr_be:port_be`, and the outer address
/// on the other side where it is the quoted one, keeping the error's
/// checksum (and a quoted IPv4 header's) right.
#[inline(always)]
fn rewrite(
    ctx: &mut TcContext,
    quote: &Quote,
    end: Quoted,
    addr_be: &[u32; 4],
    port_be: u16,
) -> Option<()> {
    let v4 = quote.family == FAMILY_V4;
    let addr_len = if v4 { 4 } else { 16 };
    let (old_addr, addr_off, old_port, port_off, outer_old, outer_off) = match end {
        Quoted::Destination => (
            quote.inner_dst,
            quote.inner_addr_off + addr_len,
            quote.dport_be,
            quote.inner_l4_off + 2,
            quote.outer_src,
            ETH_HLEN + if v4 { 12 } else { 8 },
        ),
        Quoted::Source => (
            quote.inner_src,
            quote.inner_addr_off,
            quote.sport_be,
            quote.inner_l4_off,
            quote.outer_dst,
            ETH_HLEN + if v4 { 16 } else { 24 },
        ),
    };
    let outer_too = outer_old == old_addr;
    if v4 {
        // The quoted header's checksum follows its address, so the error's
        // checksum, over both, does not change.
        let inner_csum = load::<u16>(ctx, quote.inner_csum_off)?;
        let inner_csum = csum_replace4(inner_csum, old_addr[0], addr_be[0]);
        ctx.store(addr_off, &addr_be[0], 0).ok()?;
        ctx.store(quote.inner_csum_off, &inner_csum, 0).ok()?;
        if outer_too {
            ctx.store(outer_off, &addr_be[0], 0).ok()?;
            ctx.l3_csum_replace(
                ETH_HLEN + 10,
                u64::from(old_addr[0]),
                u64::from(addr_be[0]),
                4,
            )
            .ok()?;
        }
    } else {
        // ICMPv6's checksum covers the quote and, through its
        // pseudo-header, the outer addresses.
        let diff = u64::from(csum_diff16(&old_addr, addr_be));
        ctx.store(addr_off, addr_be, 0).ok()?;
        ctx.l4_csum_replace(quote.csum_off, 0, diff, 0).ok()?;
        if outer_too {
            ctx.store(outer_off, addr_be, 0).ok()?;
            ctx.l4_csum_replace(quote.csum_off, 0, diff, u64::from(BPF_F_PSEUDO_HDR))
                .ok()?;
        }
    }
    if port_be != old_port {
        ctx.store(port_off, &port_be, 0).ok()?;
        ctx.l4_csum_replace(quote.csum_off, u64::from(old_port), u64::from(port_be), 2)
            .ok()?;
    }
    Some(())
}
