//! Address and port rewrites with checksum fix-ups. The kernel's csum helpers
//! are used rather than our own arithmetic because they also keep
//! `CHECKSUM_PARTIAL` and `CHECKSUM_COMPLETE` packets right.

use aya_ebpf::{
    bindings::{BPF_F_MARK_MANGLED_0, BPF_F_PSEUDO_HDR},
    helpers::bpf_csum_diff,
    programs::TcContext,
};
use portmap_common::{FAMILY_V4, PROTO_SCTP, PROTO_TCP, PROTO_UDP, crc32c};

use crate::parse::{ETH_HLEN, Packet};

const IPV4_CSUM_OFF: usize = ETH_HLEN + 10;
const IPV4_SRC_OFF: usize = ETH_HLEN + 12;
const IPV4_DST_OFF: usize = ETH_HLEN + 16;
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
        PROTO_UDP => Some((packet.l4_off + 6, BPF_F_MARK_MANGLED_0 as u64)),
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

    if *addr_be != old_addr {
        if packet.family == FAMILY_V4 {
            let off = if side == Side::Source {
                IPV4_SRC_OFF
            } else {
                IPV4_DST_OFF
            };
            ctx.store(off, &addr_be[0], 0)?;
            ctx.l3_csum_replace(IPV4_CSUM_OFF, old_addr[0] as u64, addr_be[0] as u64, 4)?;
            if let Some((csum_off, flags)) = csum {
                ctx.l4_csum_replace(
                    csum_off,
                    old_addr[0] as u64,
                    addr_be[0] as u64,
                    flags | BPF_F_PSEUDO_HDR as u64 | 4,
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
                let mut from = old_addr;
                let mut to = *addr_be;
                // SAFETY: both buffers are 16 bytes on our stack.
                let diff = unsafe { bpf_csum_diff(from.as_mut_ptr(), 16, to.as_mut_ptr(), 16, 0) };
                if diff < 0 {
                    return Err(diff);
                }
                ctx.l4_csum_replace(csum_off, 0, diff as u64, flags | BPF_F_PSEUDO_HDR as u64)?;
            }
        }
    }

    if port_be != old_port {
        let port_off = packet.l4_off + if side == Side::Source { 0 } else { 2 };
        ctx.store(port_off, &port_be, 0)?;
        if let Some((csum_off, flags)) = csum {
            ctx.l4_csum_replace(csum_off, old_port as u64, port_be as u64, flags | 2)?;
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

/// The four port bytes as they are on the wire.
#[inline(always)]
fn ports_bytes(sport_be: u16, dport_be: u16) -> [u8; 4] {
    let s = sport_be.to_ne_bytes();
    let d = dport_be.to_ne_bytes();
    [s[0], s[1], d[0], d[1]]
}
