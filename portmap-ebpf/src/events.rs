//! The rare events (`portmap_common::datapath_log`): what the programs
//! count and someone should hear about, logged through aya-log for the
//! node agent, which drains the pinned ring buffer into its own log.
//!
//! An aya-log call costs the verifier hundreds of instructions, so there is
//! one per program, off every ordinary packet's path: the decision code
//! only notes the reason (counted as before, and left in a per-CPU entry),
//! and the entry point, once the packet is handled and the deep frames are
//! gone, logs what was noted with the packet as it arrived (which it copied
//! into the entry before handling it). At most one
//! event per packet (the first noted), and one line per reason per CPU per
//! [`INTERVAL_NS`]; the counters count them all. Noted: a failed rewrite
//! or conntrack insert, no masquerade port or address, and a CPU's first
//! packet handed over by the fast path, each way. With nobody draining the
//! ring buffer (a node without the agent), it fills and further records
//! are dropped: the packets go on as they would.

use aya_ebpf::{
    btf_maps::PerCpuArray, helpers::bpf_ktime_get_ns, macros::btf_map, programs::TcContext,
};
use aya_log_ebpf::info;
use portmap_common::{FAMILY_V4, datapath_log::INTERVAL_NS, stat::COUNT};

use crate::{maps, parse::Packet};

/// This CPU's note of the packet being handled, and its rate limit.
#[repr(C)]
pub struct Pending {
    /// The reason noted while the packet was handled, plus one (0: none).
    reason: u32,
    /// The packet as it arrived, copied here by [`remember`] for [`log`].
    family: u8,
    proto: u8,
    sport_be: u16,
    dport_be: u16,
    _pad0: [u8; 6],
    src_be: [u32; 4],
    dst_be: [u32; 4],
    /// When each reason was last logged on this CPU (`bpf_ktime_get_ns`).
    logged_ns: [u64; COUNT as usize],
    /// The packet's addresses as logged: IPv6, or IPv4 mapped into IPv6
    /// (one format argument for both families, so one log call).
    src: [u8; 16],
    dst: [u8; 16],
}

#[btf_map(name = "log_pending")]
static PENDING: PerCpuArray<Pending, 1> = PerCpuArray::new();

/// This CPU's entry.
#[inline(always)]
fn pending() -> Option<&'static mut Pending> {
    // SAFETY: the entry belongs to this CPU, and a tc program runs on its
    // CPU to completion with no other of ours in between (see
    // `maps::this_cpu`); only the tc programs take it, one reference at a
    // time. Plain integers: a fresh, zeroed entry is valid.
    PENDING.get_ptr_mut(0).map(|entry| unsafe { &mut *entry })
}

/// Counts `reason` and notes it for the log, unless the packet has an
/// event already. Not inlined: the frames that note are among the deepest
/// of the programs, and a leaf call with an empty frame keeps their own
/// as it was (inlined, its registers could spill onto them).
#[inline(never)]
pub fn note(reason: u32) {
    maps::count(reason);
    if let Some(pending) = pending()
        && pending.reason == 0
    {
        pending.reason = reason + 1;
    }
}

/// [`note`] for the first time this CPU counts `reason`, else only counts
/// it: an event that matters once (the fast path taking its first packet),
/// not for every packet after.
#[inline(always)]
pub fn note_first(reason: u32) {
    if maps::stat(reason).unwrap_or(0) == 0 {
        note(reason);
    } else {
        maps::count(reason);
    }
}

/// Copies what the log shows of `packet` (as it arrived) into this CPU's
/// entry. Call before the packet is handled, for every packet the
/// decisions see: a dozen words, where [`log_noted`] at the end then reads
/// only the map.
///
/// Measured on 6.18 (`program_cost.rs`, processed instructions): reading
/// the caller's packet at the end, to copy or to log it, however it was
/// done (in the entry point or in a function of its own, all at once or
/// word by word), cost ingress 90 000 and egress 160 000 more than before
/// the log; copied here, ingress costs 136 000 less than before and egress
/// 5 000 more. Word by word, each read and written before the next
/// (volatile): a copy of the arrays becomes a `memcpy` call, and values
/// held at once took egress's frame past 192 bytes, where 6.1 refuses the
/// deepest call chain (512 bytes in all, frames in 32-byte steps).
#[inline(always)]
pub fn remember(packet: &Packet) {
    let Some(pending) = pending() else {
        return;
    };
    // SAFETY: fields of this CPU's entry and of the caller's packet.
    unsafe {
        copy(&raw mut pending.family, &raw const packet.family);
        copy(&raw mut pending.proto, &raw const packet.proto);
        copy(&raw mut pending.sport_be, &raw const packet.sport_be);
        copy(&raw mut pending.dport_be, &raw const packet.dport_be);
        for i in 0..4 {
            copy(&raw mut pending.src_be[i], &raw const packet.src_be[i]);
            copy(&raw mut pending.dst_be[i], &raw const packet.dst_be[i]);
        }
    }
}

/// Logs the event noted while the packet was handled, if any. Call once per
/// program, after the packet is handled: ordinary packets pay an array
/// load and a test.
#[inline(always)]
pub fn log_noted(ctx: &TcContext) {
    if pending().is_some_and(|pending| pending.reason != 0) {
        log(ctx);
    }
}

/// `*from` to `*to`, read and written as they are (volatile).
///
/// # Safety
/// Both are valid, aligned pointers.
#[inline(always)]
unsafe fn copy<T: Copy>(to: *mut T, from: *const T) {
    // SAFETY: the caller's promise.
    unsafe { core::ptr::write_volatile(to, core::ptr::read_volatile(from)) };
}

/// The one log call of a program. Not inlined: the verifier walks it on
/// the rare path only, on a shallow stack (the entry point's frame).
#[inline(never)]
fn log(ctx: &TcContext) {
    let Some(pending) = pending() else {
        return;
    };
    let reason = pending.reason.wrapping_sub(1);
    pending.reason = 0;
    let Some(logged_ns) = pending.logged_ns.get_mut(reason as usize) else {
        return;
    };
    // SAFETY: no arguments.
    let now = unsafe { bpf_ktime_get_ns() };
    if *logged_ns != 0 && now.wrapping_sub(*logged_ns) < INTERVAL_NS {
        return;
    }
    *logged_ns = now;
    as_ipv6(&mut pending.src, pending.family, &pending.src_be);
    as_ipv6(&mut pending.dst, pending.family, &pending.dst_be);
    // The interface the program runs on.
    // SAFETY: reading a field of the context the program was handed.
    let ifindex = unsafe { (*ctx.skb.skb).ifindex };
    // Starts with `portmap_common::datapath_log::PREFIX` and the reason ID.
    info!(
        ctx,
        "reason {} if {} proto {} [{:i}]:{} > [{:i}]:{}",
        reason,
        ifindex,
        pending.proto,
        pending.src,
        u16::from_be(pending.sport_be),
        pending.dst,
        u16::from_be(pending.dport_be)
    );
}

/// `addr_be` (our four-word form of `family`) as the 16 bytes of an IPv6
/// address, an IPv4 one mapped (`::ffff:a.b.c.d`). Byte by byte: a copy of
/// the array becomes a `memcpy` call.
#[inline(always)]
fn as_ipv6(out: &mut [u8; 16], family: u8, addr_be: &[u32; 4]) {
    let words = if family == FAMILY_V4 {
        [0, 0, 0xffffu32.to_be(), addr_be[0]]
    } else {
        *addr_be
    };
    for (i, word) in words.iter().enumerate() {
        let bytes = word.to_ne_bytes();
        for (j, byte) in bytes.iter().enumerate() {
            out[i * 4 + j] = *byte;
        }
    }
}
