//! Who may open a flow through a mapping: upstream portmap's
//! `conditionsV4`/`conditionsV6` (iptables match arguments it appends to
//! every DNAT rule of a configuration), as the programs check them.
//!
//! A mapping whose [`MappingValue::conditions`](crate::MappingValue) is
//! [`HAS_CONDITIONS`] is followed by a new flow only when the entry of
//! [`CONDITIONS_MAP`] for its owner and family admits the packet
//! ([`Conditions::admits`]). A mapping without conditions (the field is 0,
//! as every build before this one wrote it) costs nothing more than the
//! test of that field, once per new flow. Established flows are never
//! judged again.
//!
//! Each owner keeps its own copy, written by its ADD before its mappings
//! and removed by its DEL (or GC) after them, so several containers of one
//! configuration share nothing that one of them could remove under the
//! others, and a mapping never outlives the entry it names by more than
//! the moments a removal takes. A mapping whose entry is missing admits
//! nothing: an unreadable restriction fails closed.

/// Name of the map of [`Conditions`] by [`ConditionKey`]. Declared in the
/// object beside the others and pinned with them, but kept out of
/// [`crate::maps::PINNED`] like [`crate::TRACE_LOST_MAP`], so that `status`
/// does not call the pins of a build without it incomplete.
pub const CONDITIONS_MAP: &str = "conditions";

/// Entries of [`CONDITIONS_MAP`]: one per owner and family at most.
pub const CAPACITY: u32 = crate::capacity::OWNERS * 2;

/// Value of `MappingValue::conditions` for a mapping whose owner has
/// conditions for the mapping's family.
pub const HAS_CONDITIONS: u16 = 1;

/// Most CIDRs in one `-s` or `-d` list (iptables takes a comma-separated
/// list and adds one rule per address: any of them matches).
pub const MAX_CIDRS: usize = 8;

/// Key of [`CONDITIONS_MAP`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ConditionKey {
    pub owner_id: u64,
    /// [`crate::FAMILY_V4`] or [`crate::FAMILY_V6`].
    pub family: u8,
    pub _pad0: [u8; 7],
}

/// One address range, in the four-word form of every address here: an
/// address matches when `address & mask == net`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cidr {
    pub net_be: [u32; 4],
    pub mask_be: [u32; 4],
}

impl Cidr {
    #[inline(always)]
    pub fn contains(&self, addr_be: &[u32; 4]) -> bool {
        let mut i = 0;
        while i < 4 {
            if addr_be[i] & self.mask_be[i] != self.net_be[i] {
                return false;
            }
            i += 1;
        }
        true
    }
}

/// Bits of [`Conditions::negated`]: which condition is written with `!`.
pub mod negated {
    pub const SOURCE: u8 = 1;
    pub const DESTINATION: u8 = 2;
    pub const PROTOCOL: u8 = 4;
    pub const IN_INTERFACE: u8 = 8;
}

/// Bits of [`Conditions::protocols`].
pub mod protocol_bits {
    pub const TCP: u8 = 1;
    pub const UDP: u8 = 2;
    pub const SCTP: u8 = 4;
}

/// The conditions of one configuration for one family; every condition
/// given must hold (iptables ANDs the matches of a rule). An absent
/// condition (length 0, protocols 0, `in_ifindex` 0 without
/// [`Conditions::has_in_interface`]) holds for every packet.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Conditions {
    /// `-s`: the packet's source is in one of the first `source_len`.
    pub source: [Cidr; MAX_CIDRS],
    /// `-d`: the packet's destination (the host address it was sent to) is
    /// in one of the first `destination_len`.
    pub destination: [Cidr; MAX_CIDRS],
    pub source_len: u8,
    pub destination_len: u8,
    /// [`negated`] bits.
    pub negated: u8,
    /// `-p`: [`protocol_bits`] of the protocols that match; 0 for no
    /// protocol condition.
    pub protocols: u8,
    /// `-i`: the interface the packet arrived on, by index: the index the
    /// interface named by [`Conditions::in_interface_id`] has now (0 when
    /// the node has no interface of that name, which no packet arrives
    /// on). User space writes it at ADD and rewrites it whenever that
    /// name's interface changes, before any program is attached to the
    /// new one (`portmap-user`'s `interface_conditions`). Only read when
    /// `has_in_interface` is 1.
    pub in_ifindex: u32,
    pub has_in_interface: u8,
    pub _pad0: [u8; 3],
    /// Which name `in_ifindex` was resolved from, for user space only
    /// ([`interface_id`] of it; the programs never read it). 0 in an entry
    /// of a build before names were kept (those were padding bytes).
    pub in_interface_id: u32,
}

/// The [`Conditions::in_interface_id`] of interface name `name`: its
/// 32-bit FNV-1a hash, 0 never (0 means "no name kept"). User space
/// refuses a second name with the id of one it keeps already.
pub const fn interface_id(name: &[u8]) -> u32 {
    let mut hash: u32 = 0x811c_9dc5;
    let mut i = 0;
    while i < name.len() {
        hash ^= name[i] as u32;
        hash = hash.wrapping_mul(0x0100_0193);
        i += 1;
    }
    if hash == 0 { 1 } else { hash }
}

/// The [`protocol_bits`] bit of IP protocol `proto`; 0 for another.
#[inline(always)]
pub const fn protocol_bit(proto: u8) -> u8 {
    match proto {
        crate::PROTO_TCP => protocol_bits::TCP,
        crate::PROTO_UDP => protocol_bits::UDP,
        crate::PROTO_SCTP => protocol_bits::SCTP,
        _ => 0,
    }
}

impl Conditions {
    /// Whether a packet of IP protocol `proto` from `src_be` to `dst_be`
    /// that arrived on interface `ifindex` (0: none, as for the node's own
    /// connections, which upstream's `OUTPUT` sees without an input
    /// interface) meets every condition. Bounded loops of [`MAX_CIDRS`]
    /// steps, so the programs can call it.
    #[inline(always)]
    pub fn admits(&self, proto: u8, src_be: &[u32; 4], dst_be: &[u32; 4], ifindex: u32) -> bool {
        if self.protocols != 0
            && ((self.protocols & protocol_bit(proto) != 0)
                == (self.negated & negated::PROTOCOL != 0))
        {
            return false;
        }
        if self.has_in_interface != 0
            && ((self.in_ifindex == ifindex && ifindex != 0)
                == (self.negated & negated::IN_INTERFACE != 0))
        {
            return false;
        }
        if self.source_len != 0
            && (any_contains(&self.source, self.source_len, src_be)
                == (self.negated & negated::SOURCE != 0))
        {
            return false;
        }
        if self.destination_len != 0
            && (any_contains(&self.destination, self.destination_len, dst_be)
                == (self.negated & negated::DESTINATION != 0))
        {
            return false;
        }
        true
    }
}

/// Whether one of the first `len` of `cidrs` contains `addr_be`.
#[inline(always)]
fn any_contains(cidrs: &[Cidr; MAX_CIDRS], len: u8, addr_be: &[u32; 4]) -> bool {
    let mut i = 0;
    while i < MAX_CIDRS {
        if i >= len as usize {
            return false;
        }
        if cidrs[i].contains(addr_be) {
            return true;
        }
        i += 1;
    }
    false
}

const _: () = {
    assert!(core::mem::size_of::<ConditionKey>() == 16);
    assert!(core::mem::size_of::<Cidr>() == 32);
    assert!(core::mem::size_of::<Conditions>() == 2 * MAX_CIDRS * 32 + 16);
    // The name's id took bytes that were padding: the layout is unchanged.
    assert!(core::mem::offset_of!(Conditions, in_interface_id) == 2 * MAX_CIDRS * 32 + 12);
};

#[cfg(feature = "user")]
mod pod {
    use super::*;

    // SAFETY: repr(C), integers and integer arrays, every padding byte an
    // explicit field.
    unsafe impl aya::Pod for ConditionKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for Conditions {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{PROTO_TCP, PROTO_UDP};

    fn v4(a: [u8; 4]) -> [u32; 4] {
        [u32::from_ne_bytes(a), 0, 0, 0]
    }

    fn cidr_v4(a: [u8; 4], prefix: u32) -> Cidr {
        let mask = if prefix == 0 {
            0
        } else {
            u32::MAX << (32 - prefix)
        };
        let mask_be = mask.to_be();
        Cidr {
            net_be: [u32::from_ne_bytes(a) & mask_be, 0, 0, 0],
            mask_be: [mask_be, 0, 0, 0],
        }
    }

    const NODE: [u8; 4] = [198, 18, 0, 1];

    #[test]
    fn no_condition_admits_everything() {
        let none = Conditions::default();
        assert!(none.admits(PROTO_TCP, &v4([1, 2, 3, 4]), &v4(NODE), 0));
        assert!(none.admits(PROTO_UDP, &v4([10, 0, 0, 1]), &v4(NODE), 7));
    }

    #[test]
    fn sources_match_any_listed_range_and_negation_inverts() {
        let mut c = Conditions::default();
        c.source[0] = cidr_v4([10, 0, 0, 0], 8);
        c.source[1] = cidr_v4([192, 168, 1, 7], 32);
        c.source_len = 2;
        assert!(c.admits(PROTO_TCP, &v4([10, 9, 8, 7]), &v4(NODE), 0));
        assert!(c.admits(PROTO_TCP, &v4([192, 168, 1, 7]), &v4(NODE), 0));
        assert!(!c.admits(PROTO_TCP, &v4([192, 168, 1, 8]), &v4(NODE), 0));
        assert!(!c.admits(PROTO_TCP, &v4([11, 0, 0, 1]), &v4(NODE), 0));
        c.negated = negated::SOURCE;
        assert!(!c.admits(PROTO_TCP, &v4([10, 9, 8, 7]), &v4(NODE), 0));
        assert!(c.admits(PROTO_TCP, &v4([11, 0, 0, 1]), &v4(NODE), 0));
    }

    #[test]
    fn entries_past_the_length_are_not_read() {
        let mut c = Conditions::default();
        c.source[0] = cidr_v4([10, 0, 0, 0], 8);
        c.source[1] = cidr_v4([0, 0, 0, 0], 0);
        c.source_len = 1;
        assert!(!c.admits(PROTO_TCP, &v4([11, 0, 0, 1]), &v4(NODE), 0));
    }

    #[test]
    fn every_condition_must_hold() {
        let mut c = Conditions::default();
        c.source[0] = cidr_v4([10, 0, 0, 0], 8);
        c.source_len = 1;
        c.destination[0] = cidr_v4(NODE, 32);
        c.destination_len = 1;
        c.protocols = protocol_bits::TCP;
        assert!(c.admits(PROTO_TCP, &v4([10, 0, 0, 1]), &v4(NODE), 0));
        assert!(!c.admits(PROTO_UDP, &v4([10, 0, 0, 1]), &v4(NODE), 0));
        assert!(!c.admits(PROTO_TCP, &v4([10, 0, 0, 1]), &v4([198, 18, 0, 9]), 0));
        c.negated = negated::PROTOCOL | negated::DESTINATION;
        assert!(c.admits(PROTO_UDP, &v4([10, 0, 0, 1]), &v4([198, 18, 0, 9]), 0));
        assert!(!c.admits(PROTO_TCP, &v4([10, 0, 0, 1]), &v4([198, 18, 0, 9]), 0));
    }

    #[test]
    fn interface_ids_are_fnv1a_and_never_zero() {
        // FNV-1a's published test vectors.
        assert_eq!(interface_id(b""), 0x811c_9dc5);
        assert_eq!(interface_id(b"a"), 0xe40c_292c);
        assert_eq!(interface_id(b"foobar"), 0xbf9c_f968);
        assert_ne!(interface_id(b"eth0"), interface_id(b"eth1"));
    }

    #[test]
    fn in_interface_matches_by_index_and_never_for_the_nodes_own_traffic() {
        let mut c = Conditions {
            has_in_interface: 1,
            in_ifindex: 3,
            ..Conditions::default()
        };
        assert!(c.admits(PROTO_TCP, &v4([1, 1, 1, 1]), &v4(NODE), 3));
        assert!(!c.admits(PROTO_TCP, &v4([1, 1, 1, 1]), &v4(NODE), 4));
        assert!(!c.admits(PROTO_TCP, &v4([1, 1, 1, 1]), &v4(NODE), 0));
        c.negated = negated::IN_INTERFACE;
        assert!(!c.admits(PROTO_TCP, &v4([1, 1, 1, 1]), &v4(NODE), 3));
        assert!(c.admits(PROTO_TCP, &v4([1, 1, 1, 1]), &v4(NODE), 4));
        assert!(c.admits(PROTO_TCP, &v4([1, 1, 1, 1]), &v4(NODE), 0));
        // A name no interface has (index 0) matches nothing.
        c.in_ifindex = 0;
        c.negated = 0;
        assert!(!c.admits(PROTO_TCP, &v4([1, 1, 1, 1]), &v4(NODE), 0));
    }
}
