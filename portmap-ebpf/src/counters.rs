//! Per-mapping traffic counters: what `ebpf-portmap list` shows as packets
//! and bytes, and as the socket hooks' translations. Per-CPU, so counting
//! is a plain add on this CPU's copy.

use aya_ebpf::{bindings::BPF_NOEXIST, programs::TcContext};
use portmap_common::{CounterKey, MappingCounters, MappingKey, local::SockCounters};

use crate::maps::{self, COUNTERS, SOCK_COUNTERS};

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
    let bytes = u64::from(ctx.len());
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
        .insert(&scratch.key, &scratch.first, u64::from(BPF_NOEXIST))
        .is_err()
        && let Some(counters) = COUNTERS.get_ptr_mut(&scratch.key)
    {
        // Another CPU created it in the meantime.
        // SAFETY: as above.
        add(unsafe { &mut *counters }, way, bytes);
    }
}

/// Which socket hook translated.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    Connect,
    Sendmsg,
}

#[inline(always)]
fn add_sock(counters: &mut SockCounters, hook: Hook) {
    match hook {
        Hook::Connect => counters.connects += 1,
        Hook::Sendmsg => counters.sendmsgs += 1,
    }
}

/// Counts one socket-hook translation of `mapping` (held by `owner_id`):
/// the node's own connections cross no tc hook, so this is the only
/// per-mapping trace they leave. On the hook's stack (48 bytes): the
/// socket hooks are shallow, and their programs may be preempted, so they
/// take no per-CPU scratch.
#[inline(always)]
pub fn record_sock(mapping: &MappingKey, owner_id: u64, hook: Hook) {
    let key = CounterKey {
        mapping: *mapping,
        _pad0: 0,
        owner_id,
    };
    if let Some(counters) = SOCK_COUNTERS.get_ptr_mut(key) {
        // SAFETY: this CPU's copy. A hook preempted by another on this CPU
        // may lose one increment; a counter, not state.
        add_sock(unsafe { &mut *counters }, hook);
        return;
    }
    // First translation: the kernel zeroes the other CPUs' copies.
    let mut first = SockCounters {
        connects: 0,
        sendmsgs: 0,
    };
    add_sock(&mut first, hook);
    if SOCK_COUNTERS
        .insert(key, first, u64::from(BPF_NOEXIST))
        .is_err()
        && let Some(counters) = SOCK_COUNTERS.get_ptr_mut(key)
    {
        // Another CPU created it in the meantime.
        // SAFETY: as above.
        add_sock(unsafe { &mut *counters }, hook);
    }
}
