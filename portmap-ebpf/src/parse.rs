//! Bounds-checked header access. Everything returns `Option`: a packet we
//! cannot parse is a packet we do not touch.

use aya_ebpf::programs::TcContext;
use portmap_common::{FAMILY_V4, FAMILY_V6, PROTO_SCTP, PROTO_TCP, PROTO_UDP};

pub const ETH_HLEN: usize = 14;
const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86DD;

pub const TCP_FIN: u8 = 0x01;
pub const TCP_SYN: u8 = 0x02;
pub const TCP_RST: u8 = 0x04;
pub const TCP_ACK: u8 = 0x10;
/// First chunk type of an SCTP packet that opens an association.
pub const SCTP_CHUNK_INIT: u8 = 1;

/// The parts of a packet the translation needs, read before any rewrite
/// (helpers that write invalidate packet pointers).
#[derive(Clone, Copy)]
pub struct Packet {
    pub family: u8,
    pub proto: u8,
    pub l4_off: usize,
    /// Length of the L4 segment (header and payload).
    pub l4_len: u16,
    pub src_be: [u32; 4],
    pub dst_be: [u32; 4],
    pub sport_be: u16,
    pub dport_be: u16,
    /// TCP flags; for SCTP the first chunk's type; 0 for UDP.
    pub flags: u8,
    /// Set when the packet is a fragment: no ports to translate by.
    pub fragment: bool,
}

impl Packet {
    /// Whether this packet opens a new flow (TCP SYN, SCTP INIT, any UDP datagram).
    #[inline(always)]
    pub fn opens_flow(&self) -> bool {
        match self.proto {
            PROTO_TCP => self.flags & (TCP_SYN | TCP_ACK | TCP_RST) == TCP_SYN,
            PROTO_SCTP => self.flags == SCTP_CHUNK_INIT,
            _ => true,
        }
    }

    /// Whether either end is a loopback address (127.0.0.0/8, ::1, or
    /// IPv4-mapped ::ffff:127.0.0.0/104). No packet a tc hook sees carries
    /// one legitimately: the programs are never on `lo`, and the node's own
    /// loopback traffic stays there.
    #[inline(always)]
    pub fn touches_loopback(&self) -> bool {
        is_loopback(self.family, &self.dst_be) || is_loopback(self.family, &self.src_be)
    }
}

/// The first byte of an IPv4 address in network order, as the word holds it.
#[inline(always)]
fn first_octet(word_be: u32) -> u8 {
    word_be.to_ne_bytes()[0]
}

/// Whether `addr_be` (of `family`, in our four-word form) is a loopback
/// address: 127.0.0.0/8, ::1, or IPv4-mapped ::ffff:127.0.0.0/104.
#[inline(always)]
pub fn is_loopback(family: u8, addr_be: &[u32; 4]) -> bool {
    if family == FAMILY_V4 {
        return first_octet(addr_be[0]) == 127;
    }
    addr_be[0] == 0
        && addr_be[1] == 0
        && (addr_be[2] == 0 && addr_be[3] == 1u32.to_be()
            || addr_be[2] == 0xffffu32.to_be() && first_octet(addr_be[3]) == 127)
}

#[inline(always)]
fn ptr_at<T>(ctx: &TcContext, offset: usize) -> Option<*const T> {
    let start = ctx.data();
    let end = ctx.data_end();
    if start + offset + core::mem::size_of::<T>() > end {
        return None;
    }
    Some((start + offset) as *const T)
}

/// A `T` at `offset` of the packet, read through direct packet access
/// (bounds-checked); `None` past the end. A read, unlike a direct write,
/// costs nothing to the packets the program leaves alone (see nat.rs).
#[inline(always)]
pub(crate) fn read<T: Copy>(ctx: &TcContext, offset: usize) -> Option<T> {
    // SAFETY: ptr_at checked the bounds; packet data has no alignment guarantee.
    ptr_at::<T>(ctx, offset).map(|p| unsafe { core::ptr::read_unaligned(p) })
}

#[inline(always)]
pub fn parse(ctx: &TcContext) -> Option<Packet> {
    let ether_type = u16::from_be(read::<u16>(ctx, 12)?);
    match ether_type {
        ETH_P_IP => parse_v4(ctx),
        ETH_P_IPV6 => parse_v6(ctx),
        _ => None,
    }
}

#[inline(always)]
fn parse_v4(ctx: &TcContext) -> Option<Packet> {
    let l3 = ETH_HLEN;
    let version_ihl = read::<u8>(ctx, l3)?;
    let header_len = ((version_ihl & 0x0f) as usize) * 4;
    if version_ihl >> 4 != 4 || header_len < 20 {
        return None;
    }
    let total_len = u16::from_be(read::<u16>(ctx, l3 + 2)?);
    let frag = u16::from_be(read::<u16>(ctx, l3 + 6)?);
    let proto = read::<u8>(ctx, l3 + 9)?;
    let src = read::<u32>(ctx, l3 + 12)?;
    let dst = read::<u32>(ctx, l3 + 16)?;
    if !is_translatable(proto) {
        return None;
    }
    let mut packet = Packet {
        family: FAMILY_V4,
        proto,
        l4_off: l3 + header_len,
        l4_len: total_len.saturating_sub(header_len as u16),
        src_be: [src, 0, 0, 0],
        dst_be: [dst, 0, 0, 0],
        sport_be: 0,
        dport_be: 0,
        flags: 0,
        // More-fragments set or a non-zero offset.
        fragment: frag & 0x3fff != 0,
    };
    if packet.fragment {
        return Some(packet);
    }
    read_l4(ctx, &mut packet)?;
    Some(packet)
}

#[inline(always)]
fn parse_v6(ctx: &TcContext) -> Option<Packet> {
    let l3 = ETH_HLEN;
    let payload_len = u16::from_be(read::<u16>(ctx, l3 + 4)?);
    let mut next = read::<u8>(ctx, l3 + 6)?;
    let src = read::<[u32; 4]>(ctx, l3 + 8)?;
    let dst = read::<[u32; 4]>(ctx, l3 + 24)?;
    let mut offset = l3 + 40;
    let mut ext_len: usize = 0;
    let mut fragment = false;
    // Skip a bounded number of extension headers.
    let mut i = 0;
    while i < 4 {
        match next {
            // Hop-by-hop, routing, destination options.
            0 | 43 | 60 => {
                let header = read::<[u8; 2]>(ctx, offset)?;
                let len = (header[1] as usize + 1) * 8;
                next = header[0];
                offset += len;
                ext_len += len;
            }
            // Fragment header: only translate unfragmented packets.
            44 => {
                fragment = true;
                break;
            }
            _ => break,
        }
        i += 1;
    }
    if !fragment && !is_translatable(next) {
        return None;
    }
    let mut packet = Packet {
        family: FAMILY_V6,
        proto: next,
        l4_off: offset,
        l4_len: payload_len.saturating_sub(ext_len as u16),
        src_be: src,
        dst_be: dst,
        sport_be: 0,
        dport_be: 0,
        flags: 0,
        fragment,
    };
    if fragment {
        return Some(packet);
    }
    read_l4(ctx, &mut packet)?;
    Some(packet)
}

#[inline(always)]
fn is_translatable(proto: u8) -> bool {
    matches!(proto, PROTO_TCP | PROTO_UDP | PROTO_SCTP)
}

#[inline(always)]
fn read_l4(ctx: &TcContext, packet: &mut Packet) -> Option<()> {
    let ports = read::<[u16; 2]>(ctx, packet.l4_off)?;
    packet.sport_be = ports[0];
    packet.dport_be = ports[1];
    packet.flags = match packet.proto {
        PROTO_TCP => read::<u8>(ctx, packet.l4_off + 13)?,
        // First chunk type follows the 12-byte common header.
        PROTO_SCTP => read::<u8>(ctx, packet.l4_off + 12)?,
        _ => 0,
    };
    Some(())
}
