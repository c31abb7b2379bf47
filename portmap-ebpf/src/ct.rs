//! Tuples, timeouts and the checks that decide whether a conntrack entry
//! still holds; the TCP states that move a closed flow out of the way of
//! live ones; and whether a node socket owns a tuple.

use aya_ebpf::{
    bindings::{BPF_F_CURRENT_NETNS, bpf_sock_tuple},
    helpers::{bpf_jiffies64, bpf_ktime_get_coarse_ns, bpf_sk_release, bpf_skc_lookup_tcp},
    programs::TcContext,
};
use portmap_common::{
    CtEntry, CtKey, FAMILY_V4, MappingKey, PROTO_TCP, ct_flags, ct_kind, ct_timeout, stat,
    tcp_state,
};

use crate::{
    maps::{self, Ledger, Table},
    parse::{Packet, TCP_FIN, TCP_RST, TCP_SYN},
};

/// CLOCK_MONOTONIC at tick resolution: what flow ages need (timeouts of
/// seconds to hours, a refresh every second), and far cheaper per packet
/// than the precise clock, which reads the TSC (slow under some
/// hypervisors). The coarse clock moves only at a tick, as `jiffies`
/// does, so each CPU keeps the value it read at the current jiffy and
/// calls the helper again only when `jiffies` has moved on: the verifier
/// turns `bpf_jiffies64` into one load (64-bit JITs), where the helper
/// call costs 20-30 ns a packet. The kept value may lag by a tick (the
/// tick moves `jiffies` just before the clock), a few milliseconds on
/// ages judged in seconds.
#[inline(always)]
pub fn now() -> u64 {
    // SAFETY: no arguments, always safe to call.
    let jiffies = unsafe { bpf_jiffies64() };
    let Some(cache) = maps::clock_cache() else {
        return coarse_ns();
    };
    if cache.jiffies != jiffies {
        cache.jiffies = jiffies;
        cache.now_ns = coarse_ns();
    }
    cache.now_ns
}

#[inline(always)]
fn coarse_ns() -> u64 {
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

/// A live entry for `key`, copied out (into this CPU's scratch, see
/// `maps::Scratch::found`) and refreshed if it is due. Looked for among
/// the assured flows first, then the flows not yet assured
/// (`conntrack_new`), then, for TCP, the closed ones. The clock is read
/// only once an entry is found: a miss (most packets of the default path)
/// needs no time. An entry found in `conntrack_new` is noted in scratch
/// for [`track_tcp`], which asks whether its flow is assured now.
///
/// The copy is handed back in place, not on the caller's frame: with the
/// search of three tables, existing_flow's and egress's frames grew past
/// what 6.1 (which rounds each frame up to 32 bytes) leaves them under
/// the entry point in BPF's 512 bytes. It holds until the next lookup on
/// this CPU; no caller looks up twice while it reads it.
#[inline(always)]
pub fn lookup(key: &CtKey) -> Option<&'static CtEntry> {
    let (entry, table) = maps::ct_get_any(key)?;
    let scratch = maps::scratch()?;
    // SAFETY: pointer from a successful lookup; the LRU may recycle it at
    // any time, so it is read once and written with a single store.
    copy_words(&mut scratch.found, unsafe { &*entry });
    let copy = &scratch.found;
    let now = now();
    let age = now.saturating_sub(copy.last_seen_ns);
    // A closed flow is never refreshed: it lingers for its last packets
    // only, counted from the close. Nor is a flow not yet assured: its
    // time is that of its first packet (see `ct_timeout::UDP_STREAM`).
    let closed = table == Table::Closed;
    if age > ct_timeout::for_table(key.proto, copy.tcp_state, closed) {
        return None;
    }
    if table == Table::New {
        scratch.follow |= follow::UNASSURED;
    } else if !closed && age > ct_timeout::REFRESH {
        // SAFETY: the same live entry; one aligned 8-byte store, so a
        // concurrent reader sees the old or the new time, and a recycled
        // entry only gets a fresher time (it is read back and judged anew).
        unsafe { (*entry).last_seen_ns = now };
    }
    Some(copy)
}

/// Copies `from` into `to` a word at a time (volatile): 64-bit words for
/// an 8-aligned `T` of whole 64-bit words (a conntrack entry), 32-bit ones
/// otherwise. A plain copy compiles to a call of the byte-loop `memmove`,
/// which runs on every packet that makes it and which the verifier walks
/// byte by byte at each call, from every state that reaches it: the copies
/// of conntrack entries alone were a third of what it processed for
/// egress.
#[inline(always)]
pub fn copy_words<T: Copy>(to: &mut T, from: &T) {
    const {
        assert!(core::mem::size_of::<T>().is_multiple_of(4));
        assert!(core::mem::align_of::<T>() >= 4);
    };
    let size = core::mem::size_of::<T>();
    // SAFETY: `T` is aligned for the word type and a whole number of its
    // words long (tested here and asserted above).
    unsafe {
        if core::mem::align_of::<T>() >= 8 && size.is_multiple_of(8) {
            copy_as::<T, u64>(to, from, size / 8);
        } else {
            copy_as::<T, u32>(to, from, size / 4);
        }
    }
}

/// [`copy_words`] in `words` words of type `W`.
///
/// # Safety
/// `T` is aligned for `W` and exactly `words` `W`s long.
#[inline(always)]
unsafe fn copy_as<T, W>(to: &mut T, from: &T, words: usize) {
    let to = core::ptr::from_mut(to).cast::<W>();
    let from = core::ptr::from_ref(from).cast::<W>();
    let mut word = 0;
    while word < words {
        // SAFETY: the caller's promise; volatile, so the words are not
        // merged back into a memmove call.
        unsafe { to.add(word).write_volatile(from.add(word).read_volatile()) };
        word += 1;
    }
}

/// The owner of the mapping a flow was translated by, if that mapping still
/// sends it to the same container address and port: a deleted or re-pointed
/// mapping must never keep forwarding, e.g. to an address later given to
/// another container. (The owner is what the traffic counters are kept by.)
/// On every translated packet, so mostly answered from a per-CPU cache
/// (see `maps::cached_mapping`).
#[inline(always)]
pub fn still_mapped(
    mapping: &MappingKey,
    container_be: &[u32; 4],
    container_port_be: u16,
) -> Option<u64> {
    match maps::cached_mapping(mapping) {
        Some(value)
            if value.container_addr_be == *container_be
                && value.container_port_be == container_port_be =>
        {
            Some(value.owner_id)
        }
        _ => None,
    }
}

/// Whether a TCP packet of a flow whose entry has `tcp_state` may change
/// that state (so [`track_tcp`] has something to do): a FIN or RST, or the
/// first packet without SYN. The flow decision only notes it
/// (`scratch.follow`); the entry point calls [`track_tcp`] once that
/// decision's frame is gone: stacked on it, the state tracking does not
/// fit BPF's 512 bytes (6.1 rounds every frame up to 32 bytes).
#[inline(always)]
pub fn note_tcp_change(packet: &Packet, tcp_state: u8) {
    if packet.proto == PROTO_TCP
        && (packet.flags & (TCP_FIN | TCP_RST) != 0
            || (tcp_state & tcp_state::SYN_ONLY != 0 && packet.flags & TCP_SYN == 0))
        && let Some(scratch) = maps::scratch()
    {
        scratch.follow |= follow::TCP_CHANGE;
    }
}

/// Follows a flow's state on the packet the flow decision noted, if any:
/// a TCP packet that may change its state (see [`note_tcp_change`]), or
/// any packet whose entry is in `conntrack_new` (see [`lookup`]), whose
/// flow may be assured now.
///
/// TCP: the end of the handshake, a FIN, a RST. A flow closed by FIN both
/// ways or by RST leaves the open table for the closed one, both
/// directions at once; there it lingers for its last ACK and
/// retransmissions and is the first to go when space runs short, instead
/// of pushing an idle live flow out of the open table (an LRU evicts by
/// use, not by our timestamps). A flow already closed has no open entry
/// and is left as it is.
///
/// Assured (nf_conntrack's word): a TCP flow once its handshake completes
/// (the client's first packet without SYN), or, recovered mid-flow (see
/// `flow::new_flow`), once its container answers; a UDP or SCTP flow once
/// it had an answer and still has packets [`ct_timeout::UDP_STREAM`]
/// after its first. An assured flow's entries move from `conntrack_new` to
/// the table of its protocol, where new flows never evict them.
///
/// The other direction's entry is keyed by the reversed tuple of the
/// packet as translated: `rewrites_destination` says which end the
/// entry's `nat_addr`/`nat_port` replace (DNAT and UNMASQ entries, on
/// ingress: the destination; REPLY and SNAT, on egress: the source).
///
/// The call is made only when there is something to do: most packets
/// change nothing, and a call and its return cost 10-15 ns
/// (program_cost.rs).
#[inline(always)]
pub fn track_tcp(packet: &Packet, rewrites_destination: bool) {
    if let Some(scratch) = maps::scratch()
        && scratch.follow != 0
    {
        scratch.tracked = track_noted(packet, rewrites_destination);
    }
}

/// [`track_tcp`] of a packet whose change was noted. Not inlined: one walk
/// of it per entry point, on top of the entry point's frame only. Returns
/// whether the flow's entries changed, which the caller keeps in scratch:
/// a result that is used, so that every exit sets r0 (the verifier refuses
/// a subprogram that leaves a stack pointer there, as one path did when
/// the function returned nothing, or a result the compiler could drop).
#[inline(never)]
fn track_noted(packet: &Packet, rewrites_destination: bool) -> bool {
    let Some(scratch) = maps::scratch() else {
        return false;
    };
    let track = scratch.follow & follow::TCP_CHANGE != 0;
    scratch.follow = 0;
    let key = key_of(packet);
    let Some((entry, table)) = maps::ct_get_live(&key) else {
        return false;
    };
    // SAFETY: fields of a live map value, read once.
    // Followed whatever translates the flow (see `ct_kind::NETFILTER`).
    let (nat_addr_be, nat_port_be, raw_kind, state, flags, first_seen) = unsafe {
        (
            (*entry).nat_addr_be,
            (*entry).nat_port_be,
            (*entry).kind,
            (*entry).tcp_state,
            (*entry).flags,
            (*entry).last_seen_ns,
        )
    };
    let kind = raw_kind & ct_kind::BASE;
    // A flow netfilter translates is followed where tc sees both its
    // directions as they travel, untranslated: at ingress, from the
    // client on the uplink and from the container on its side (its
    // answer is translated back before any egress sees it). Without the
    // answer's FIN, such a flow never closed and held its two entries
    // among the live ones for the 6 h of an established flow.
    let netfilter = raw_kind & ct_kind::NETFILTER != 0;
    // An entry this hook does not translate (a container's answer that
    // ingress hands to the fast path, egress translates it): its packet
    // is followed where it is translated.
    let answer = kind == ct_kind::REPLY || kind == ct_kind::UNMASQ;
    let (followed_here, destination) = if netfilter {
        (rewrites_destination, kind == ct_kind::DNAT)
    } else {
        (
            rewrites_destination == (kind == ct_kind::DNAT || kind == ct_kind::UNMASQ),
            rewrites_destination,
        )
    };
    if !followed_here || !(answer || kind == ct_kind::DNAT || kind == ct_kind::SNAT) {
        return false;
    }
    let pair = if destination {
        CtKey {
            src_addr_be: nat_addr_be,
            dst_addr_be: key.src_addr_be,
            src_port_be: nat_port_be,
            dst_port_be: key.src_port_be,
            ..key
        }
    } else {
        CtKey {
            src_addr_be: key.dst_addr_be,
            dst_addr_be: nat_addr_be,
            src_port_be: key.dst_port_be,
            dst_port_be: nat_port_be,
            ..key
        }
    };
    let tcp_flags = packet.flags;
    if packet.proto != PROTO_TCP {
        if table != Table::New {
            return false;
        }
        // On both entries: the answer's own says, to the confirmed-flow
        // question, that an answer went by before (see `confirm`).
        if answer {
            set_flag(&pair, ct_flags::REPLIED);
            set_flag(&key, ct_flags::REPLIED);
        }
        if (answer || flags & ct_flags::REPLIED != 0)
            && now().saturating_sub(first_seen) >= ct_timeout::UDP_STREAM
        {
            assure(&key, &pair);
            return true;
        }
        return false;
    }
    if !track {
        // A recovered TCP flow (no SYN_ONLY) that its container answers
        // with anything but a RST.
        if table == Table::New
            && answer
            && state & tcp_state::SYN_ONLY == 0
            && tcp_flags & TCP_RST == 0
        {
            assure(&key, &pair);
            return true;
        }
        return false;
    }
    let closes = if tcp_flags & TCP_RST != 0 {
        true
    } else if tcp_flags & TCP_FIN != 0 {
        set_state(&key, tcp_state::FIN, tcp_state::SYN_ONLY);
        // SAFETY: one byte of a map value, read once (see `lookup`).
        maps::ct_get_live(&pair)
            .is_some_and(|(entry, _)| unsafe { (*entry).tcp_state } & tcp_state::FIN != 0)
    } else {
        // The first packet without SYN: the handshake is done, both ways.
        set_state(&key, 0, tcp_state::SYN_ONLY);
        set_state(&pair, 0, tcp_state::SYN_ONLY);
        if table == Table::New {
            assure(&key, &pair);
        }
        false
    };
    if closes {
        let now = now();
        if move_to_closed(&key, now) | move_to_closed(&pair, now) {
            maps::count(stat::CT_CLOSED);
        }
    }
    true
}

/// Sets `set` and clears `clear` in the state of the live entry of `key`.
#[inline(always)]
fn set_state(key: &CtKey, set: u8, clear: u8) {
    if let Some((entry, _)) = maps::ct_get_live(key) {
        // SAFETY: a live map value; one byte, one store.
        unsafe { (*entry).tcp_state = ((*entry).tcp_state & !clear) | set };
    }
}

/// Sets `flag` in the entry of `key` in `conntrack_new`.
#[inline(always)]
fn set_flag(key: &CtKey, flag: u32) {
    if let Some(entry) = maps::ct_get(Table::New, key) {
        // SAFETY: a live map value; one word, one store.
        unsafe { (*entry).flags |= flag };
    }
}

/// Moves both directions of an assured flow from `conntrack_new` to the
/// table of its protocol (see [`track_tcp`]).
#[inline(always)]
fn assure(key: &CtKey, pair: &CtKey) {
    let now = now();
    let to = Table::for_proto(key.proto);
    if move_entry(key, Table::New, to, now) | move_entry(pair, Table::New, to, now) {
        maps::count(stat::CT_ASSURED);
    }
}

/// Moves the live entry of `key` to the closed table, stamped `now` (the
/// start of its linger). Whether it was there to move.
#[inline(always)]
fn move_to_closed(key: &CtKey, now: u64) -> bool {
    let Some((_, table)) = maps::ct_get_live(key) else {
        return false;
    };
    move_entry(key, table, Table::Closed, now)
}

/// Moves the entry of `key` from one table to another, stamped `now`. A
/// closed flow leaves the live tables even if the closed one refuses it:
/// it must not hold a place among the live ones. An assured flow the
/// established table refuses stays where it is. Whether the entry moved.
///
/// Not inlined: each of track_noted's four moves inlined the three
/// operations on any of the four tables, and the paths through them took
/// 6.1's verifier past its million instructions in egress.
#[inline(never)]
fn move_entry(key: &CtKey, from: Table, to: Table, now: u64) -> bool {
    let Some(scratch) = maps::scratch() else {
        return false;
    };
    let Some(entry) = maps::ct_get(from, key) else {
        return false;
    };
    // SAFETY: a live map value, copied out at once (see `lookup`).
    copy_words(&mut scratch.moved, unsafe { &*entry });
    scratch.moved.last_seen_ns = now;
    // An entry there already (an idled-out flow on the same tuple) is
    // written over: it leaves the ledger of its table, not evicted.
    if maps::ct_get(to, key).is_some() {
        maps::ledger(to, Ledger::Out);
    }
    let moved = maps::ct_put(to, key, &scratch.moved);
    if moved {
        maps::ledger(to, Ledger::In);
    }
    if (moved || to == Table::Closed) && maps::ct_remove(from, key) {
        maps::ledger(from, Ledger::Out);
    }
    moved
}

/// Whether a socket of the node owns the tuple of this TCP packet: an
/// established, request or time-wait socket for exactly it. Such a packet
/// is the node's (a flow the node opened from a mapped port) and is never
/// re-translated. A listener on the port owns no tuple (a runtime's port
/// holder, or a node service the mapping shadows: its SYNs went to the
/// container, so it has no flow a mid-flow segment could belong to).
/// Looked up in the network namespace of the interface the packet arrived
/// on, the node's.
///
/// Inlined: on 6.1, which rounds every frame up to 32 bytes, one more call
/// level under new_flow does not fit the 512-byte stack.
#[inline(always)]
pub fn node_socket_owns(ctx: &TcContext, packet: &Packet) -> bool {
    // The fields by reference, no key built: a 40-byte copy on the
    // caller's frame takes 6.1 past BPF's 512-byte stack under new_flow.
    socket_owns(
        ctx,
        packet.family,
        (&packet.src_be, packet.sport_be),
        (&packet.dst_be, packet.dport_be),
    )
}

/// [`node_socket_owns`] for the TCP tuple `key` as a packet arriving at
/// the node would carry it (source: the remote end).
#[inline(always)]
pub fn node_socket_owns_tuple(ctx: &TcContext, key: &CtKey) -> bool {
    socket_owns(
        ctx,
        key.family,
        (&key.src_addr_be, key.src_port_be),
        (&key.dst_addr_be, key.dst_port_be),
    )
}

/// [`node_socket_owns`] of the tuple from `src` (address, port) to `dst`.
#[inline(always)]
fn socket_owns(ctx: &TcContext, family: u8, src: (&[u32; 4], u16), dst: (&[u32; 4], u16)) -> bool {
    let Some(scratch) = maps::scratch() else {
        // Without room for the tuple, the safe answer: the node's.
        return true;
    };
    let tuple = &mut scratch.sock_tuple;
    let size = fill_sock_tuple(tuple, family, src, dst);
    // SAFETY: the context is the program's skb; the tuple is `size`
    // readable bytes of a map value; a socket found is released below.
    let sock = unsafe {
        bpf_skc_lookup_tcp(
            ctx.skb.skb.cast(),
            tuple.as_mut_ptr().cast::<bpf_sock_tuple>(),
            size,
            i64::from(BPF_F_CURRENT_NETNS) as u64,
            0,
        )
    };
    if sock.is_null() {
        return false;
    }
    // SAFETY: a socket the lookup returned (its common part: `state` may be
    // read), released once.
    let listening = unsafe { (*sock).state } == TCP_LISTEN;
    // SAFETY: the non-null socket the lookup returned, released exactly
    // once and not used after (the verifier checks the reference).
    unsafe { bpf_sk_release(sock.cast()) };
    !listening
}

/// Writes `struct bpf_sock_tuple` for the tuple from `src` (address,
/// port) to `dst` into `tuple` (addresses, then source and destination
/// port, network order, in that order in memory); its size. What the
/// socket lookups and the conntrack kfuncs take.
#[inline(always)]
pub fn fill_sock_tuple(
    tuple: &mut [u32; 9],
    family: u8,
    src: (&[u32; 4], u16),
    dst: (&[u32; 4], u16),
) -> u32 {
    let ports = u32::from(src.1) | (u32::from(dst.1) << 16);
    if family == FAMILY_V4 {
        tuple[0] = src.0[0];
        tuple[1] = dst.0[0];
        tuple[2] = ports;
        12
    } else {
        tuple[..4].copy_from_slice(src.0);
        tuple[4..8].copy_from_slice(dst.0);
        tuple[8] = ports;
        36
    }
}

/// Bits of `maps::Scratch::follow`: what [`track_tcp`] has to do.
pub mod follow {
    /// The packet may change its TCP flow's state (see [`super::note_tcp_change`]).
    pub const TCP_CHANGE: u8 = 1;
    /// The packet's entry is in `conntrack_new` (see [`super::lookup`]).
    pub const UNASSURED: u8 = 2;
}

/// `TCP_LISTEN` of the kernel's TCP states.
const TCP_LISTEN: u32 = 10;
