//! Tuples, timeouts and the checks that decide whether a conntrack entry
//! still holds.

use aya_ebpf::helpers::bpf_ktime_get_coarse_ns;
use portmap_common::{CtEntry, CtKey, MappingKey, ct_timeout};

use crate::{maps, parse::Packet};

/// CLOCK_MONOTONIC at tick resolution: what flow ages need (timeouts of
/// minutes, a refresh every second), and far cheaper per packet than the
/// precise clock, which reads the TSC (slow under some hypervisors).
#[inline(always)]
pub fn now() -> u64 {
    // SAFETY: no arguments, always safe to call.
    unsafe { bpf_ktime_get_coarse_ns() }
}

/// The packet's tuple as seen on the wire.
#[inline(always)]
pub fn key_of(packet: &Packet) -> CtKey {
    CtKey {
        src_addr_be: packet.src_be,
        dst_addr_be: packet.dst_be,
        src_port_be: packet.sport_be,
        dst_port_be: packet.dport_be,
        proto: packet.proto,
        family: packet.family,
        _pad0: 0,
    }
}

/// The tuple of the answer to a packet with `key` (ends swapped).
#[inline(always)]
pub fn reversed(key: &CtKey) -> CtKey {
    CtKey {
        src_addr_be: key.dst_addr_be,
        dst_addr_be: key.src_addr_be,
        src_port_be: key.dst_port_be,
        dst_port_be: key.src_port_be,
        proto: key.proto,
        family: key.family,
        _pad0: 0,
    }
}

/// A live entry for `key`, copied out, and refreshed if it is due.
#[inline(always)]
pub fn lookup(key: &CtKey, now: u64) -> Option<CtEntry> {
    let entry = maps::ct_get(key)?;
    // SAFETY: pointer from a successful lookup; the LRU may recycle it at
    // any time, so it is read once and written with a single store.
    let copy = unsafe { *entry };
    let age = now.saturating_sub(copy.last_seen_ns);
    if age > ct_timeout::for_proto(key.proto) {
        return None;
    }
    if age > ct_timeout::REFRESH {
        unsafe { (*entry).last_seen_ns = now };
    }
    Some(copy)
}

/// The owner of the mapping a flow was translated by, if that mapping still
/// sends it to the same container address and port: a deleted or re-pointed
/// mapping must never keep forwarding, e.g. to an address later given to
/// another container. (The owner is what the traffic counters are kept by.)
#[inline(always)]
pub fn still_mapped(
    mapping: &MappingKey,
    container_be: &[u32; 4],
    container_port_be: u16,
) -> Option<u64> {
    match maps::mapping(mapping) {
        Some(value)
            if value.container_addr_be == *container_be
                && value.container_port_be == container_port_be =>
        {
            Some(value.owner_id)
        }
        _ => None,
    }
}
