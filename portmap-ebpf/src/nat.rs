//! Address and port rewrites with checksum fix-ups.
//!
//! Packet memory is written only through helpers (`bpf_skb_store_bytes`):
//! a tc program with a single direct packet write gets the kernel's
//! unclone prologue, which pulls every cloned skb entering the program
//! (every TCP data segment a pod or the node sends) and drops it if that
//! fails, translated or not. The helpers make writable only the packets
//! they rewrite. The L4 checksum goes through `l4_csum_replace`, the only
//! code that knows a `CHECKSUM_PARTIAL` packet (the field holds the
//! pseudo-header sum: an address change enters it, a port change does
//! not) from a `COMPLETE` one (`skb->csum` follows the address change).
//! The IPv4 header checksum, never offloaded, and the IPv6 address
//! difference are summed here: fewer helper calls, each of which costs
//! 40-55 ns on the development VM (docs/dataplane.md).

use aya_ebpf::{
    bindings::{BPF_F_MARK_MANGLED_0, BPF_F_PSEUDO_HDR},
    helpers::bpf_skb_store_bytes,
    programs::TcContext,
};
use portmap_common::{FAMILY_V4, PROTO_SCTP, PROTO_TCP, PROTO_UDP, crc32c};

use crate::parse::{ETH_HLEN, Packet, read};

const IPV4_CSUM_OFF: usize = ETH_HLEN + 10;
const IPV6_SRC_OFF: usize = ETH_HLEN + 8;
const IPV6_DST_OFF: usize = ETH_HLEN + 24;

/// Which end of the packet a rewrite changes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Source,
    Destination,
}

/// Offset of the L4 checksum and the csum-helper flags it needs, or `None`
/// for SCTP (CRC32c, handled separately).
#[inline(always)]
fn l4_csum(packet: &Packet) -> Option<(usize, u64)> {
    match packet.proto {
        PROTO_TCP => Some((packet.l4_off + 16, 0)),
        // A zero UDP checksum (IPv4 only) means "none": keep it zero.
        PROTO_UDP => Some((packet.l4_off + 6, u64::from(BPF_F_MARK_MANGLED_0))),
        _ => None,
    }
}

/// Rewrites one end of `packet` to `addr_be:port_be`, fixing every checksum.
#[inline(always)]
pub fn rewrite(
    ctx: &mut TcContext,
    packet: &Packet,
    side: Side,
    addr_be: &[u32; 4],
    port_be: u16,
) -> bool {
    // A plain bool keeps the call within BPF's five register arguments
    // (a Result would be returned through a hidden sixth pointer).
    try_rewrite(ctx, packet, side, addr_be, port_be).is_ok()
}

#[inline(always)]
fn try_rewrite(
    ctx: &mut TcContext,
    packet: &Packet,
    side: Side,
    addr_be: &[u32; 4],
    port_be: u16,
) -> Result<(), i64> {
    let (old_addr, old_port) = match side {
        Side::Source => (packet.src_be, packet.sport_be),
        Side::Destination => (packet.dst_be, packet.dport_be),
    };
    // SCTP checksum must be read before anything changes. A plain value,
    // zero when there is none, not an Option: LLVM tests an Option's tag
    // by re-reading the protocol, which the verifier cannot tie to this
    // test, so it walks the "SCTP" branch with the value never written
    // (whatever the stack slot held before: a pointer, which it rejects).
    let sctp_csum = if packet.proto == PROTO_SCTP {
        ctx.load::<u32>(packet.l4_off + 8)?
    } else {
        0
    };
    let csum = l4_csum(packet);

    // Whether the port is written by the address's store (below).
    let mut port_stored = false;
    if *addr_be != old_addr {
        if packet.family == FAMILY_V4 {
            // The checksum and both addresses, read as they are now and
            // written back in one store: one helper call for what the
            // address store and l3_csum_replace did in two. Without IP
            // options the ports follow the addresses, and a port that
            // changes too goes in the same store: one call fewer again.
            // (The 14 bytes are there either way: a TCP, UDP or SCTP header
            // without options, options of at least 4 bytes with them.)
            let mut tail: Ipv4Tail = read(ctx, IPV4_CSUM_OFF).ok_or(-1i64)?;
            let before = if side == Side::Source {
                tail.src
            } else {
                tail.dst
            };
            tail.check = csum_replace4(tail.check, before, addr_be[0]);
            if side == Side::Source {
                tail.src = addr_be[0];
            } else {
                tail.dst = addr_be[0];
            }
            port_stored = port_be != old_port && packet.l4_off == IPV4_PORTS_OFF && csum.is_some();
            if port_stored {
                if side == Side::Source {
                    tail.sport = port_be;
                } else {
                    tail.dport = port_be;
                }
                store_prefix(ctx, IPV4_CSUM_OFF, &tail, IPV4_TAIL_LEN)?;
            } else {
                store_prefix(ctx, IPV4_CSUM_OFF, &tail, IPV4_TAIL_LEN - 4)?;
            }
            if let Some((csum_off, flags)) = csum {
                ctx.l4_csum_replace(
                    csum_off,
                    u64::from(before),
                    u64::from(addr_be[0]),
                    flags | u64::from(BPF_F_PSEUDO_HDR) | 4,
                )?;
            }
        } else {
            let off = if side == Side::Source {
                IPV6_SRC_OFF
            } else {
                IPV6_DST_OFF
            };
            ctx.store(off, addr_be, 0)?;
            if let Some((csum_off, flags)) = csum {
                let diff = csum_diff16(&old_addr, addr_be);
                ctx.l4_csum_replace(
                    csum_off,
                    0,
                    u64::from(diff),
                    flags | u64::from(BPF_F_PSEUDO_HDR),
                )?;
            }
        }
    }

    if port_be != old_port {
        let port_off = packet.l4_off + if side == Side::Source { 0 } else { 2 };
        if !port_stored {
            ctx.store(port_off, &port_be, 0)?;
        }
        if let Some((csum_off, flags)) = csum {
            ctx.l4_csum_replace(csum_off, u64::from(old_port), u64::from(port_be), flags | 2)?;
        } else if packet.proto == PROTO_SCTP
            // Zero: the CRC is left to offload (CHECKSUM_PARTIAL) and
            // will be computed over the rewritten packet; do not touch it.
            && sctp_csum != 0
        {
            let old_csum = sctp_csum;
            let old_ports = ports_bytes(packet.sport_be, packet.dport_be);
            let new_ports = match side {
                Side::Source => ports_bytes(port_be, packet.dport_be),
                Side::Destination => ports_bytes(packet.sport_be, port_be),
            };
            let new_csum = crc32c::sctp_adjust(old_csum, old_ports, new_ports, packet.l4_len);
            ctx.store(packet.l4_off + 8, &new_csum, 0)?;
        }
    }
    Ok(())
}

/// Bytes 10..24 of an IPv4 packet as on the wire: the header checksum,
/// the source and the destination address, and (without IP options) the
/// source and the destination port.
#[repr(C, packed)]
#[derive(Clone, Copy)]
struct Ipv4Tail {
    check: u16,
    src: u32,
    dst: u32,
    sport: u16,
    dport: u16,
}

const IPV4_TAIL_LEN: u32 = core::mem::size_of::<Ipv4Tail>() as u32;

/// Where the ports of an IPv4 packet without options start.
const IPV4_PORTS_OFF: usize = ETH_HLEN + 20;

/// Writes the first `len` bytes of `value` at `offset` of the packet.
#[inline(always)]
fn store_prefix<T>(ctx: &mut TcContext, offset: usize, value: &T, len: u32) -> Result<(), i64> {
    // SAFETY: the helper reads `len` bytes of `value`, no more than its
    // size (the callers pass at most `size_of::<T>()`).
    let ret = unsafe {
        bpf_skb_store_bytes(
            ctx.skb.skb,
            offset as u32,
            core::ptr::from_ref(value).cast(),
            len,
            0,
        )
    };
    if ret == 0 { Ok(()) } else { Err(ret) }
}

/// Folds a ones'-complement sum to 16 bits (end-around carries).
#[inline(always)]
fn fold16(sum: u64) -> u16 {
    let sum = (sum & 0xffff) + (sum >> 16);
    let sum = (sum & 0xffff) + (sum >> 16);
    ((sum & 0xffff) + (sum >> 16)) as u16
}

/// The checksum `check` after one 32-bit word of what it covers changed
/// from `from` to `to` (RFC 1624, eqn. 3: HC' = ~(~HC + ~m + m')). All in
/// wire order: a ones'-complement sum does not depend on byte order.
#[inline(always)]
pub fn csum_replace4(check: u16, from: u32, to: u32) -> u16 {
    let sum = u64::from(!check)
        + u64::from(!from & 0xffff)
        + u64::from(!from >> 16)
        + u64::from(to & 0xffff)
        + u64::from(to >> 16);
    !fold16(sum)
}

/// What `bpf_csum_diff(from, 16, to, 16, 0)` returns: the 32-bit
/// ones'-complement sum of `~from` and `to`, for `l4_csum_replace`.
#[inline(always)]
pub fn csum_diff16(from: &[u32; 4], to: &[u32; 4]) -> u32 {
    let sum = u64::from(!from[0])
        + u64::from(!from[1])
        + u64::from(!from[2])
        + u64::from(!from[3])
        + u64::from(to[0])
        + u64::from(to[1])
        + u64::from(to[2])
        + u64::from(to[3]);
    let sum = (sum & 0xffff_ffff) + (sum >> 32);
    ((sum & 0xffff_ffff) + (sum >> 32)) as u32
}

/// The four port bytes as they are on the wire.
#[inline(always)]
fn ports_bytes(sport_be: u16, dport_be: u16) -> [u8; 4] {
    let s = sport_be.to_ne_bytes();
    let d = dport_be.to_ne_bytes();
    [s[0], s[1], d[0], d[1]]
}
