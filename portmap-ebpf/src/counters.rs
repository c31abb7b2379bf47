//! Per-mapping traffic counters: what `ebpf-portmap list` shows as packets
//! and bytes. Per-CPU, so counting is a plain add on this CPU's copy.

use aya_ebpf::{bindings::BPF_NOEXIST, programs::TcContext};
use portmap_common::{MappingCounters, MappingKey};

use crate::maps::{self, COUNTERS};

/// Which way a counted packet went.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Way {
    /// Towards the container (DNAT).
    In,
    /// A reply, back to the client.
    Out,
}

#[inline(always)]
fn add(counters: &mut MappingCounters, way: Way, bytes: u64) {
    match way {
        Way::In => {
            counters.packets_in += 1;
            counters.bytes_in += bytes;
        }
        Way::Out => {
            counters.packets_out += 1;
            counters.bytes_out += bytes;
        }
    }
}

/// Counts one translated packet of `mapping` (held by `owner_id`). Not
/// inlined, and with its data in per-CPU scratch space, so it adds almost
/// nothing to the callers' stack.
#[inline(never)]
#[allow(
    clippy::needless_borrows_for_generic_args,
    reason = "the key must be passed as a pointer into the scratch map, not copied to the stack"
)]
pub fn record(ctx: &TcContext, mapping: &MappingKey, owner_id: u64, way: Way) {
    let Some(scratch) = maps::counter_scratch() else {
        return;
    };
    scratch.key.mapping = *mapping;
    scratch.key._pad0 = 0;
    scratch.key.owner_id = owner_id;
    let bytes = ctx.len() as u64;
    if let Some(counters) = COUNTERS.get_ptr_mut(&scratch.key) {
        // SAFETY: this CPU's copy; no other writer while this program runs.
        add(unsafe { &mut *counters }, way, bytes);
        return;
    }
    // First packet: the kernel zeroes the other CPUs' copies of a new entry.
    // Zeroed word by word: `= MappingCounters::default()` becomes a call
    // to memset, one call level more under existing_flow than 6.1's 512
    // bytes of stacked frames leave room for (each frame counts at least
    // 32 bytes there).
    let first = &raw mut scratch.first;
    // SAFETY: the four fields of this CPU's scratch value.
    unsafe {
        (&raw mut (*first).packets_in).write_volatile(0);
        (&raw mut (*first).bytes_in).write_volatile(0);
        (&raw mut (*first).packets_out).write_volatile(0);
        (&raw mut (*first).bytes_out).write_volatile(0);
    }
    add(&mut scratch.first, way, bytes);
    if COUNTERS
        .insert(&scratch.key, &scratch.first, BPF_NOEXIST as u64)
        .is_err()
        && let Some(counters) = COUNTERS.get_ptr_mut(&scratch.key)
    {
        // Another CPU created it in the meantime.
        // SAFETY: as above.
        add(unsafe { &mut *counters }, way, bytes);
    }
}
