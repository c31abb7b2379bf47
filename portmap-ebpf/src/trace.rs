//! `ebpf-portmap trace`: one event per packet while someone traces.
//!
//! The programs read one array entry (`trace_filter`) per packet; while
//! nobody traces, that is all they do. While a tracer runs, this CPU's
//! `stats` counters are copied before the packet is handled and compared
//! after: every reason the dataplane counted is a decision about this packet.
//! So the decision logic carries no tracing code, and a reason added later is
//! traced as soon as it is counted.
//!
//! The socket hooks handle no packet: a translation there is emitted as one
//! event of its own ([`sock_translated`]), with the dialled and the
//! container's address and no interface.
//!
//! Stack: the egress program already uses most of BPF's 512 bytes, so the
//! functions here keep their data in maps (per-CPU scratch, the reserved
//! ring-buffer record) and their own frames a few bytes deep.

use aya_ebpf::{
    bindings::{__sk_buff, BPF_RB_NO_WAKEUP},
    btf_maps::PerCpuArray,
    helpers::bpf_skb_load_bytes,
    macros::btf_map,
    programs::TcContext,
};
use portmap_common::{FAMILY_V4, TraceEvent, local::SockOrigin, stat, trace_direction};

use crate::{
    ct,
    maps::{self, TRACE_EVENTS, TRACE_FILTER},
    parse,
};

/// Events that found the ring buffer full (`portmap_common::TRACE_LOST_MAP`).
#[btf_map(name = "trace_lost")]
static TRACE_LOST: PerCpuArray<u64, 1> = PerCpuArray::new();

/// If someone traces, remembers this CPU's counters and the packet as it
/// arrives. Call before the programs parse the packet, and
/// [`end_if_tracing`] after the packet is handled.
///
/// Before the parse, not with what it found: the verifier walks a call
/// again for every state that makes it, and after the parse those were one
/// per packet shape it tells apart (family, protocol, header length...).
/// With the parsed packet handed in, the tracing branch and its copy were
/// a fifth of what it processed for the tc programs; here the programs
/// have one or two states, and a traced packet is parsed twice.
#[inline(always)]
pub fn before_parse(ctx: &TcContext) {
    if tracing() {
        snapshot(ctx);
    }
}

#[inline(always)]
fn tracing() -> bool {
    TRACE_FILTER
        .get(0)
        .is_some_and(|filter| filter.enabled != 0)
}

#[inline(never)]
fn snapshot(ctx: &TcContext) {
    let Some(scratch) = maps::trace_scratch() else {
        return;
    };
    // A packet the programs do not parse emits no event either.
    if let Some(packet) = parse::parse(ctx) {
        ct::copy_words(&mut scratch.packet, &packet);
    }
    let mut reason = 0;
    while reason < stat::COUNT {
        // Never missing. Were it, the copy would stop here: a step whose
        // missing counter read as 0 joined the other path with a different
        // value, and the verifier, which cannot prune a loop step still
        // being walked unless the states match exactly, walked every
        // remaining step again for each (this loop and the one in
        // `decisions` were over a quarter of what it processed for egress).
        let Some(count) = maps::stat(reason) else {
            return;
        };
        scratch.before[reason as usize] = count;
        reason += 1;
    }
}

/// Emits the event of a packet handled since [`before_parse`], if someone
/// traces (checked again here; a tracer that starts between the two calls
/// gets one event with imprecise decisions) and the filter wants it.
#[inline(always)]
pub fn end_if_tracing(ctx: &TcContext, direction: u8) {
    if !tracing() {
        return;
    }
    decisions();
    emit(ctx, direction);
}

/// Records the reasons counted since [`snapshot`] in the scratch space.
#[inline(never)]
fn decisions() {
    let Some(scratch) = maps::trace_scratch() else {
        return;
    };
    let mut decisions: u64 = 0;
    let mut reason = 0;
    while reason < stat::COUNT {
        // As in `snapshot`: one path through each step.
        let Some(count) = maps::stat(reason) else {
            break;
        };
        if count != scratch.before[reason as usize] {
            decisions |= 1 << reason;
        }
        reason += 1;
    }
    scratch.decisions = decisions & !stat::LEDGER_BITS;
}

#[inline(never)]
fn emit(ctx: &TcContext, direction: u8) {
    let (Some(filter), Some(scratch)) = (TRACE_FILTER.get_ptr(0), maps::trace_scratch()) else {
        return;
    };
    // The packet as `snapshot` saw it, read from scratch, not the caller's
    // stack: with nothing of the handling path live at the call, the
    // verifier walks this once, not once per path.
    let packet = &scratch.packet;
    let decisions = scratch.decisions;
    // SAFETY: pointer from a successful lookup of an array entry.
    let (port, proto) = unsafe { ((*filter).port_be, (*filter).proto) };
    // Without a port filter, only what the dataplane acted on; with one,
    // also inbound packets nothing was counted for (no mapping).
    if decisions == 0 && (port == 0 || direction != trace_direction::INGRESS) {
        return;
    }
    if proto != 0 && proto != packet.proto {
        return;
    }
    // The ports as the packet leaves, to match the filter before anything
    // is reserved (the rewrite invalidated what was read before).
    scratch.after_ports_be = [packet.sport_be, packet.dport_be];
    if !packet.fragment {
        // SAFETY: the destination is 4 bytes long.
        unsafe {
            bpf_skb_load_bytes(
                ctx.skb.skb as *const _,
                packet.l4_off as u32,
                (&raw mut scratch.after_ports_be).cast(),
                4,
            );
        }
    }
    let [after_sport, after_dport] = scratch.after_ports_be;
    if port != 0
        && packet.sport_be != port
        && packet.dport_be != port
        && after_sport != port
        && after_dport != port
    {
        return;
    }
    let Some(mut entry) = TRACE_EVENTS.reserve(0) else {
        // Counted, so `trace` can say events were lost (as `cilium
        // monitor` does) instead of a silent gap.
        if let Some(lost) = TRACE_LOST.get_ptr_mut(0) {
            // SAFETY: this CPU's copy; no other writer while we run.
            unsafe { *lost += 1 };
        }
        return;
    };
    let event = entry.as_mut_ptr();
    // SAFETY: `event` points at a reserved record of the right size; every
    // field is written before it is submitted.
    unsafe {
        // The precise clock: events microseconds apart stay in order.
        (*event).ts_ns = aya_ebpf::helpers::bpf_ktime_get_ns();
        (*event).src_addr_be = packet.src_be;
        (*event).dst_addr_be = packet.dst_be;
        (*event).sport_be = packet.sport_be;
        (*event).dport_be = packet.dport_be;
        (*event).decisions = decisions;
        (*event).ifindex = (*ctx.skb.skb).ifindex;
        (*event).len = ctx.len();
        (*event).direction = direction;
        (*event).family = packet.family;
        (*event).proto = packet.proto;
        (*event).flags = packet.flags;
        (*event)._pad0 = [0; 4];
        // The packet as it leaves, read straight into the record.
        (*event).new_src_addr_be = packet.src_be;
        (*event).new_dst_addr_be = packet.dst_be;
        (*event).new_sport_be = after_sport;
        (*event).new_dport_be = after_dport;
        read_addresses(ctx.skb.skb, packet, event);
    }
    entry.submit(u64::from(BPF_RB_NO_WAKEUP));
}

/// Overwrites the `new_*_addr_be` fields of `event` with the packet's
/// current addresses (unchanged where a read fails).
///
/// # Safety
/// `event` must point at a writable `TraceEvent`.
#[inline(always)]
unsafe fn read_addresses(skb: *mut __sk_buff, packet: &parse::Packet, event: *mut TraceEvent) {
    let (src_off, dst_off, len) = if packet.family == FAMILY_V4 {
        (parse::ETH_HLEN + 12, parse::ETH_HLEN + 16, 4)
    } else {
        (parse::ETH_HLEN + 8, parse::ETH_HLEN + 24, 16)
    };
    // SAFETY: each destination is a field of `event` at least `len` bytes long.
    unsafe {
        bpf_skb_load_bytes(
            skb as *const _,
            src_off as u32,
            (&raw mut (*event).new_src_addr_be).cast(),
            len,
        );
        bpf_skb_load_bytes(
            skb as *const _,
            dst_off as u32,
            (&raw mut (*event).new_dst_addr_be).cast(),
            len,
        );
    }
}

/// If someone traces and the filter wants it (protocol; port dialled or
/// the container's), emits a socket hook's translation: `direction` is
/// `trace_direction::SOCK_CONNECT` or `SOCK_SENDMSG`, `origin` what the
/// hook remembered for the socket. The source is not known yet (the
/// kernel picks it after the hook), so it is left zero.
#[inline(always)]
pub fn sock_translated(direction: u8, proto: u8, origin: &SockOrigin) {
    let Some(filter) = TRACE_FILTER.get_ptr(0) else {
        return;
    };
    // SAFETY: pointer from a successful lookup of an array entry.
    let (enabled, port, wanted_proto) =
        unsafe { ((*filter).enabled, (*filter).port_be, (*filter).proto) };
    if enabled == 0
        || (wanted_proto != 0 && wanted_proto != proto)
        || (port != 0 && port != origin.dialled_port_be && port != origin.backend_port_be)
    {
        return;
    }
    let Some(mut entry) = TRACE_EVENTS.reserve(0) else {
        if let Some(lost) = TRACE_LOST.get_ptr_mut(0) {
            // SAFETY: this CPU's copy; a preempted hook may lose one count.
            unsafe { *lost += 1 };
        }
        return;
    };
    let event = entry.as_mut_ptr();
    // SAFETY: `event` points at a reserved record of the right size; every
    // field is written before it is submitted.
    unsafe {
        (*event).ts_ns = aya_ebpf::helpers::bpf_ktime_get_ns();
        // Word by word: `= [0; 4]` becomes a call to a byte-loop memset.
        let mut i = 0;
        while i < 4 {
            (&raw mut (*event).src_addr_be[i]).write_volatile(0);
            (&raw mut (*event).new_src_addr_be[i]).write_volatile(0);
            i += 1;
        }
        (*event).dst_addr_be = origin.dialled_addr_be;
        (*event).new_dst_addr_be = origin.backend_addr_be;
        (*event).sport_be = 0;
        (*event).new_sport_be = 0;
        (*event).dport_be = origin.dialled_port_be;
        (*event).new_dport_be = origin.backend_port_be;
        (*event).decisions = 1 << stat::SOCK_TRANSLATED;
        (*event)._pad0 = [0; 4];
        (*event).ifindex = 0;
        (*event).len = 0;
        (*event).direction = direction;
        (*event).family = origin.family;
        (*event).proto = proto;
        (*event).flags = 0;
    }
    entry.submit(u64::from(BPF_RB_NO_WAKEUP));
}
