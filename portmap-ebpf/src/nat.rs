//! Address and port rewrites with checksum fix-ups. Header fields and the
//! IPv4 header checksum are written in place; the L4 checksum goes through
//! the kernel's helper, which keeps `CHECKSUM_PARTIAL` and
//! `CHECKSUM_COMPLETE` packets right (see `try_rewrite`).

use aya_ebpf::{
    bindings::{BPF_F_MARK_MANGLED_0, BPF_F_PSEUDO_HDR},
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
    let addr_changed = *addr_be != old_addr;
    let port_changed = port_be != old_port;

    // The header fields are written in place, with no helper: parse read
    // them from the linear part of the packet, and the IPv4 header
    // checksum is always complete (never offloaded), so it is adjusted
    // here. Only the L4 checksum needs the kernel's helper, which alone
    // knows whether the packet is CHECKSUM_PARTIAL (the field then holds
    // the pseudo-header sum and only address changes enter it) or
    // COMPLETE (`skb->csum` must follow the address change). Five helper
    // calls per rewrite were about 200 ns of a 650 ns established packet
    // (program_cost.rs); these two remain. All writes come before the
    // helpers, which invalidate packet pointers.
    if addr_changed {
        if packet.family == FAMILY_V4 {
            let off = if side == Side::Source {
                IPV4_SRC_OFF
            } else {
                IPV4_DST_OFF
            };
            let header = packet_mut(ctx, ETH_HLEN, 20)?;
            // SAFETY: within the 20 bytes of IPv4 header just checked;
            // packet memory may be written at any alignment (the verifier
            // allows it on the architectures we run on).
            unsafe {
                let check = header.add(IPV4_CSUM_OFF - ETH_HLEN).cast::<u16>();
                let new_check = csum_replace4(check.read_volatile(), old_addr[0], addr_be[0]);
                header
                    .add(off - ETH_HLEN)
                    .cast::<u32>()
                    .write_volatile(addr_be[0]);
                check.write_volatile(new_check);
            }
        } else {
            let off = if side == Side::Source {
                IPV6_SRC_OFF
            } else {
                IPV6_DST_OFF
            };
            let words = packet_mut(ctx, off, 16)?.cast::<u32>();
            let mut i = 0;
            while i < 4 {
                // SAFETY: within the 16 address bytes just checked (as above).
                unsafe { words.add(i).write_volatile(addr_be[i]) };
                i += 1;
            }
        }
    }
    if port_changed {
        let port_off = packet.l4_off + if side == Side::Source { 0 } else { 2 };
        let port = packet_mut(ctx, port_off, 2)?.cast::<u16>();
        // SAFETY: the two port bytes just checked (as above).
        unsafe { port.write_volatile(port_be) };
    }

    if let Some((csum_off, flags)) = csum {
        if addr_changed {
            // The address words' checksum difference, summed here rather
            // than by bpf_csum_diff (a helper call).
            let diff = csum_diff4(&old_addr, addr_be, packet.family);
            ctx.l4_csum_replace(csum_off, 0, diff as u64, flags | BPF_F_PSEUDO_HDR as u64)?;
        }
        if port_changed {
            ctx.l4_csum_replace(csum_off, old_port as u64, port_be as u64, flags | 2)?;
        }
    } else if port_changed
        && packet.proto == PROTO_SCTP
        // Zero: the CRC is left to offload (CHECKSUM_PARTIAL) and
        // will be computed over the rewritten packet; do not touch it.
        && sctp_csum != 0
    {
        let old_ports = ports_bytes(packet.sport_be, packet.dport_be);
        let new_ports = match side {
            Side::Source => ports_bytes(port_be, packet.dport_be),
            Side::Destination => ports_bytes(packet.sport_be, port_be),
        };
        let new_csum = crc32c::sctp_adjust(sctp_csum, old_ports, new_ports, packet.l4_len);
        ctx.store(packet.l4_off + 8, &new_csum, 0)?;
    }
    Ok(())
}

/// `len` bytes of the packet at `off`, writable in place, or an error if
/// they are not in its linear part.
#[inline(always)]
fn packet_mut(ctx: &TcContext, off: usize, len: usize) -> Result<*mut u8, i64> {
    let start = ctx.data();
    if start + off + len > ctx.data_end() {
        return Err(-1);
    }
    Ok((start + off) as *mut u8)
}

/// Folds a one's-complement sum of 32-bit words to 16 bits.
#[inline(always)]
fn fold16(sum: u64) -> u16 {
    let sum = (sum & 0xffff_ffff) + (sum >> 32);
    let sum = (sum & 0xffff) + (sum >> 16);
    let sum = (sum & 0xffff) + (sum >> 16);
    ((sum & 0xffff) + (sum >> 16)) as u16
}

/// The IPv4 header checksum `check` after a 32-bit word changed from
/// `from` to `to` (RFC 1624, eqn. 3, as the kernel's `csum_replace4`).
/// One's-complement sums are byte-order independent, so the words are
/// taken as they lie in memory.
#[inline(always)]
pub fn csum_replace4(check: u16, from: u32, to: u32) -> u16 {
    !fold16(u64::from(!check) + u64::from(!from) + u64::from(to))
}

/// The checksum difference of an address changed from `from` to `to` (one
/// word for IPv4, four for IPv6), as `bpf_csum_diff` gives it (a 32-bit
/// partial sum; only its value modulo 0xffff matters to the helpers).
#[inline(always)]
pub fn csum_diff4(from: &[u32; 4], to: &[u32; 4], family: u8) -> u32 {
    let words = if family == FAMILY_V4 { 1 } else { 4 };
    let mut sum: u64 = 0;
    let mut i = 0;
    while i < 4 {
        if i < words {
            sum += u64::from(!from[i]) + u64::from(to[i]);
        }
        i += 1;
    }
    u32::from(fold16(sum))
}

/// The four port bytes as they are on the wire.
#[inline(always)]
fn ports_bytes(sport_be: u16, dport_be: u16) -> [u8; 4] {
    let s = sport_be.to_ne_bytes();
    let d = dport_be.to_ne_bytes();
    [s[0], s[1], d[0], d[1]]
}
