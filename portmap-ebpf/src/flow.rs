//! Flow decisions: whether a packet follows a known flow, opens a new one
//! by a mapping, or is left alone; and what egress restores or remembers.

use aya_ebpf::programs::TcContext;
use portmap_common::{
    CtEntry, CtKey, PROTO_TCP, PortRole, ct_flags, ct_kind, local::iface_flags, stat, tcp_state,
};

use crate::{
    confirm,
    counters::{self, Way},
    ct, events, fast,
    fib::{self, Locality, local_destination},
    knat,
    maps::{self, Insert, Offer, Table, find_mapping},
    masq::{masquerade, wants_masquerade},
    nat::{self, Side},
    parse::{Packet, TCP_ACK, TCP_RST, TCP_SYN},
};

/// Decides an inbound packet: its known flow first, else a new flow by the
/// mappings, then what follows a new flow (counting, masquerade, the
/// fast-path offer).
#[inline(always)]
pub fn ingress(ctx: &mut TcContext, packet: &Packet) {
    if packet.fragment {
        maps::count(stat::SKIP_FRAGMENT);
        return;
    }
    // A loopback address at either end of a packet from a link (see
    // `Packet::touches_loopback`) is a crafted one: translated, it would
    // reach a host port the operator bound to 127.0.0.1 or ::1 from the
    // link, or any host port past rules keyed on the node's addresses.
    // Dropped, not left to the kernel: with `route_localnet` set (as
    // kube-proxy sets it) IPv4 would deliver it to the node.
    if packet.touches_loopback() {
        drop_crafted();
        return;
    }
    let opens = packet.opens_flow();
    // A TCP SYN or SCTP INIT always starts over from the mappings; anything
    // else follows its flow first.
    if (!opens || packet.proto == portmap_common::PROTO_UDP) && existing_flow(ctx, packet) {
        // After existing_flow's frame is gone: in it, the kfunc calls took
        // 6.1 past BPF's 512-byte stack.
        knat::follow_noted(ctx, packet, fast::knat_hand_over());
        ct::track_tcp(packet, true);
        // After existing_flow's frame is gone: in it, any more code took
        // 6.1 past BPF's 512-byte stack.
        if fast::fast_path_on() {
            offer_unmasqueraded(packet);
        }
        return;
    }
    // Only a packet for a host port opens a flow (ingress also takes in
    // the answers of containers, for their known flows only).
    if !maps::port_is(PortRole::Host, packet.proto, packet.dport_be) {
        return;
    }
    // Masquerading is decided after new_flow returns, not inside it: its
    // frame would not fit on BPF's stack below new_flow's.
    // What follows a new flow reads its state from scratch, after
    // new_flow's frame is gone: stacked, the frames do not fit in 512 bytes.
    if new_flow(ctx, packet, opens) {
        // Netfilter's to translate: the kernel's entry, nothing in tc (and
        // nothing for the confirmed-flow fast path, which waits for the
        // flow's answer through netfilter); with `fastPath: true`,
        // translated here and handed over still.
        if knat::chosen() {
            knat::hand_over_new(ctx, packet);
            count_from_scratch(ctx, Way::In);
            if fast::knat_hand_over() == knat::HandOver::Always {
                knat::hand_over_first(ctx, packet);
            }
            return;
        }
        translated_new_flow(ctx);
        if wants_masquerade(ctx) {
            remember_masquerade(ct_flags::MASQUERADED);
            masquerade(ctx);
        } else {
            remember_masquerade(ct_flags::DIRECT);
        }
    }
}

/// Drops the packet being handled (see `fast::fast_path`, which turns the
/// verdict into the tc action) and counts it. Not inlined: one frame the
/// verifier walks once, off the path of every other packet.
#[inline(never)]
fn drop_crafted() {
    maps::count(stat::DROP_LOOPBACK);
    if let Some(scratch) = maps::scratch() {
        scratch.fast = Offer::Drop;
    }
}

/// Translates a packet of a known flow. Returns whether the packet is dealt
/// with; `false` sends a UDP datagram of a stale flow on to `new_flow`.
/// Not inlined: the hot path and `new_flow` get separate stack frames, which
/// keeps the deepest call chain within BPF's 512-byte stack.
#[inline(never)]
pub fn existing_flow(ctx: &mut TcContext, packet: &Packet) -> bool {
    let key = ct::key_of(packet);
    let Some(entry) = ct::lookup(&key) else {
        return false;
    };
    // The container end of the flow, to check its mapping still holds: the
    // new destination of a translated packet, the source of an answer to a
    // masqueraded one.
    let (container_be, container_port_be, done) = match entry.kind {
        ct_kind::DNAT => (entry.nat_addr_be, entry.nat_port_be, stat::DNAT),
        ct_kind::UNMASQ => (packet.src_be, packet.sport_be, stat::UNMASQ),
        ct_kind::PASS => {
            maps::count(stat::SKIP_LOCAL_ORIGIN);
            return true;
        }
        // A flow netfilter translates: its kernel entry kept, the packet
        // left as it is, or, once confirmed, translated here and handed
        // over (see `knat::follow_noted`).
        ct_kind::NETFILTER_DNAT => {
            knat::note();
            return true;
        }
        ct_kind::REPLY | ct_kind::NETFILTER_REPLY => {
            // A container answering a translated flow: egress translates
            // it back; the fast path may take it there directly (its tuple
            // in what `confirm::note` writes). Netfilter sees the answer as
            // it is (egress translates it after). The answer of a flow
            // netfilter translates is followed here (see `ct::track_tcp`),
            // and translated back by netfilter on the normal path, by
            // egress when handed over.
            if entry.kind == ct_kind::NETFILTER_REPLY {
                ct::note_tcp_change(packet, entry.tcp_state);
            }
            if let Some(scratch) = maps::scratch() {
                scratch.fast = Offer::Reply;
            }
            confirm::note(
                &key,
                entry,
                (&key.dst_addr_be, key.dst_port_be),
                packet.flags,
            );
            return true;
        }
        _ => return true,
    };
    let Some(owner_id) = ct::still_mapped(&entry.mapping, &container_be, container_port_be) else {
        maps::count(stat::STALE_FLOW);
        // A UDP datagram is translated anew by the mapping as it is now;
        // the rest of a stale TCP/SCTP flow passes untouched.
        return entry.kind != ct_kind::DNAT || !packet.opens_flow();
    };
    ct::note_tcp_change(packet, entry.tcp_state);
    // One rewrite call site for both kinds: each inlined copy costs the
    // verifier a full walk of the checksum code.
    if nat::rewrite(
        ctx,
        packet,
        Side::Destination,
        &entry.nat_addr_be,
        entry.nat_port_be,
    ) {
        maps::count(done);
        if entry.kind == ct_kind::DNAT {
            // Scratch first: what it takes of the entry is then not kept
            // on this frame across the call (6.1's 512-byte stack has no
            // room for it: existing_flow's frame would round up to 288).
            if let Some(scratch) = maps::scratch() {
                scratch.forward_key.family = packet.family;
                ct::copy_words(&mut scratch.forward.nat_addr_be, &entry.nat_addr_be);
                scratch.forward.flags = entry.flags;
                scratch.owner_id = owner_id;
                scratch.fast = Offer::Forward;
            }
            // Netfilter sees the packet as translated: tc ingress runs
            // before its PREROUTING.
            confirm::note(
                &key,
                entry,
                (&entry.nat_addr_be, entry.nat_port_be),
                packet.flags,
            );
            counters::record(ctx, &entry.mapping, owner_id, Way::In);
        }
    } else {
        events::note(stat::REWRITE_FAILED);
    }
    true
}

/// Offers a container's answer to a masqueraded flow (a hairpin flow's,
/// to the node's address), whose destination existing_flow restored to
/// the client, to the fast path: egress of the interface towards the
/// client translates it back, as any answer (see `fast::fast_reply`).
/// Netfilter sees the answer so restored: the reply of its entry for the
/// flow (client to container). The entry is looked up again (`packet`
/// holds the tuple as it arrived), only for a known flow's packet from a
/// container port that existing_flow offered nothing: existing_flow's
/// frame has no room for one more line on 6.1. Not inlined: off every
/// other path.
#[inline(never)]
fn offer_unmasqueraded(packet: &Packet) {
    if maps::scratch().is_none_or(|scratch| scratch.fast != Offer::Nothing)
        || !maps::port_is(PortRole::Container, packet.proto, packet.sport_be)
    {
        return;
    }
    let key = ct::key_of(packet);
    let Some(entry) = ct::lookup(&key) else {
        return;
    };
    if entry.kind != ct_kind::UNMASQ {
        return;
    }
    if let Some(scratch) = maps::scratch() {
        scratch.fast = Offer::Reply;
    }
    confirm::note(
        &key,
        entry,
        (&entry.nat_addr_be, entry.nat_port_be),
        packet.flags,
    );
}

/// Whether a packet that does not open a flow, has no entry and is for a
/// mapped port may be translated as the rest of a translated flow whose
/// entries were lost (see `new_flow`): a plain mid-flow TCP segment (ACK
/// set, neither SYN nor RST: a SYN-ACK answers a SYN someone on the node
/// sent, a RST ends a flow) whose tuple no node socket owns. Counts why
/// not. Not inlined: new_flow's frame has no byte to spare (the 6.1
/// verifier's 512-byte limit on the stacked frames).
#[inline(never)]
fn may_recover(ctx: &TcContext, packet: &Packet) -> bool {
    if packet.proto != PROTO_TCP || packet.flags & (TCP_SYN | TCP_RST | TCP_ACK) != TCP_ACK {
        maps::count(stat::SKIP_NOT_SYN);
        return false;
    }
    if ct::node_socket_owns(ctx, packet) {
        maps::count(stat::SKIP_NODE_SOCKET);
        return false;
    }
    true
}

/// Whether a packet that would open a flow by a mapping of `owner_id` with
/// conditions meets them (see `portmap_common::conditions`): judged by the
/// interface it arrived on, as upstream's `PREROUTING` rule. A missing
/// entry admits nothing. Counts a refusal. Not inlined: new_flow's frame
/// has no room for the checks (see may_recover), and the verifier walks
/// the bounded loops once, off the path of mappings without conditions.
#[inline(never)]
fn meets_conditions(ctx: &TcContext, packet: &Packet, owner_id: u64) -> bool {
    // SAFETY: reading a field of the context the program was handed.
    let mut ifindex = unsafe { (*ctx.skb.skb).ifindex };
    // On a pod's bridge port, the bridge's: netfilter's `-i` names it.
    if let Some(iface) = maps::iface(ifindex)
        && iface.flags & iface_flags::BRIDGE_PORT != 0
    {
        ifindex = iface_flags::bridge_of(iface.flags);
    }
    let admitted = maps::conditions_of(owner_id, packet.family).is_some_and(|conditions| {
        conditions.admits(packet.proto, &packet.src_be, &packet.dst_be, ifindex)
    });
    if !admitted {
        maps::count(stat::SKIP_CONDITIONS);
    }
    admitted
}

/// A packet that may open a translated flow: find its mapping, check it is
/// for the node, record both directions and translate. Not inlined: it has
/// its own stack frame, so its buffers do not add to the hot path's.
///
/// Recovery: a mid-flow TCP packet to a mapped port with no entry (its
/// flow was evicted from a full table, or is older than the pins) is
/// translated by the mapping as it is now, and its flow recorded again, if
/// no socket of the node owns its tuple. A host port has one backend, so
/// the mapping names the container the flow was translated to, unless the
/// mapping changed since, and then that container answers with a RST, as
/// the node would have. Flows the node opened from a mapped port are
/// never taken: their sockets own their tuples (and their pass entries
/// come first). A recovered flow that was masqueraded gets a new
/// masquerade port, which its container does not know: it is reset, as
/// before.
///
/// Returns whether it translated a flow (its entries are left in
/// `scratch` for the counters and `masquerade`).
#[inline(never)]
pub fn new_flow(ctx: &mut TcContext, packet: &Packet, opens: bool) -> bool {
    let Some((mapping_key, mapping)) =
        find_mapping(packet.family, packet.proto, &packet.dst_be, packet.dport_be)
    else {
        return false;
    };
    // 0 for every mapping without conditions: one test, no lookup.
    if mapping.conditions != 0 && !meets_conditions(ctx, packet, mapping.owner_id) {
        return false;
    }
    if !opens && !may_recover(ctx, packet) {
        return false;
    }
    match local_destination(ctx, packet, mapping_key.host_addr_be == [0; 4]) {
        Locality::Local => {}
        Locality::NotLocal => {
            maps::count(stat::SKIP_NOT_LOCAL);
            return false;
        }
        Locality::NotNodeAddress => {
            maps::count(stat::SKIP_NOT_NODE_ADDRESS);
            return false;
        }
        Locality::ForwardingDisabled => {
            maps::count(stat::FWD_DISABLED);
            return false;
        }
    }
    // A new TCP flow has only its SYN; a recovered one is established
    // (ACK set). Read from the packet, not from `opens`: keeping that alive
    // to here costs a stack slot new_flow does not have.
    let syn_only = if packet.proto == PROTO_TCP && packet.flags & TCP_ACK == 0 {
        tcp_state::SYN_ONLY
    } else {
        0
    };
    // Both directions are built in per-CPU scratch space: on the stack
    // they would not fit BPF's 512 bytes together with the caller's frame.
    let Some(scratch) = maps::scratch() else {
        return false;
    };
    // Read here, where a flow is known to start, not for every packet.
    let now = ct::now();
    // Built in place: a copy on this frame would not fit (see may_recover).
    scratch.forward_key = ct::key_of(packet);
    scratch.forward = CtEntry {
        nat_addr_be: mapping.container_addr_be,
        nat_port_be: mapping.container_port_be,
        kind: ct_kind::DNAT,
        tcp_state: syn_only,
        mapping: mapping_key,
        last_seen_ns: now,
        ..CtEntry::default()
    };
    scratch.reply = CtEntry {
        nat_addr_be: packet.dst_be,
        nat_port_be: packet.dport_be,
        kind: ct_kind::REPLY,
        tcp_state: syn_only,
        mapping: mapping_key,
        last_seen_ns: now,
        ..CtEntry::default()
    };
    // The answer comes from the container to the client.
    scratch.reply_key = CtKey {
        src_addr_be: mapping.container_addr_be,
        dst_addr_be: packet.src_be,
        src_port_be: mapping.container_port_be,
        dst_port_be: packet.sport_be,
        proto: packet.proto,
        family: packet.family,
        _pad0: 0,
    };
    choose_translation(ctx, packet);
    if !record_new_flow() {
        return false;
    }
    scratch.owner_id = mapping.owner_id;
    if knat::chosen() {
        return true;
    }
    if nat::rewrite(
        ctx,
        packet,
        Side::Destination,
        &mapping.container_addr_be,
        mapping.container_port_be,
    ) {
        true
    } else {
        events::note(stat::REWRITE_FAILED);
        false
    }
}

/// Marks the new flow new_flow is building in scratch as netfilter's to
/// translate where the node's settings ask for it (see `knat`): never a
/// masqueraded one, whose masquerade is tc's. Before the entries are
/// recorded. Not inlined: new_flow's frame has no room for it.
#[inline(never)]
fn choose_translation(ctx: &TcContext, packet: &Packet) {
    if !wants_masquerade(ctx)
        && knat::wanted(packet)
        && let Some(scratch) = maps::scratch()
    {
        knat::choose(scratch);
    }
}

/// Records the two directions of the new flow new_flow built in scratch,
/// reply state first: a translated packet whose answer cannot be
/// translated back would only confuse the client. In the table of flows
/// not yet assured, whatever the protocol: new flows evict only each
/// other (see `ct::track_tcp`). Not inlined: in new_flow, whose frame has
/// no byte to spare, the inserts took it from 256 to 264 bytes, which 6.1
/// rounds up past BPF's 512-byte stack under the entry point.
#[inline(never)]
fn record_new_flow() -> bool {
    let Some(scratch) = maps::scratch() else {
        return false;
    };
    if maps::ct_put_pair(
        Table::New,
        (&scratch.reply_key, &scratch.reply),
        Insert::Any,
        (&scratch.forward_key, &scratch.forward),
    )
    .is_err()
    {
        events::note(stat::CT_INSERT_FAILED);
        return false;
    }
    true
}

/// Not inlined: with its frame inside the entry point's, the trace call
/// after it does not fit BPF's stack (and bpf-linker crashes on it).
#[inline(never)]
pub fn egress(ctx: &mut TcContext, packet: &Packet) -> bool {
    if packet.fragment {
        return false;
    }
    let key = ct::key_of(packet);
    if let Some(entry) = ct::lookup(&key) {
        // The container end of the flow: the destination of a masqueraded
        // flow on its way to the container, the source of an answer.
        // The answer of a flow netfilter translates reaches egress as it
        // left the container only where netfilter did not translate it:
        // handed over by the fast path, or with the kernel's entry gone
        // (`conntrack -D`, expired under a flow it no longer saw), where it
        // would leave from the pod's address. Translated as any answer.
        let (container_be, container_port_be) = match entry.kind {
            ct_kind::SNAT => (packet.dst_be, packet.dport_be),
            ct_kind::REPLY | ct_kind::NETFILTER_REPLY => (packet.src_be, packet.sport_be),
            _ => return false,
        };
        let Some(owner_id) = ct::still_mapped(&entry.mapping, &container_be, container_port_be)
        else {
            maps::count(stat::STALE_FLOW);
            return false;
        };
        ct::note_tcp_change(packet, entry.tcp_state);
        // One rewrite call site for both kinds (see existing_flow).
        if nat::rewrite(
            ctx,
            packet,
            Side::Source,
            &entry.nat_addr_be,
            entry.nat_port_be,
        ) {
            if entry.kind != ct_kind::SNAT {
                maps::count(stat::REPLY);
                // Counted by the caller from scratch, after this frame is
                // gone: stacked, the frames exceed 512 bytes on 6.1.
                if let Some(scratch) = maps::scratch() {
                    ct::copy_words(&mut scratch.forward.mapping, &entry.mapping);
                    scratch.owner_id = owner_id;
                    return true;
                }
            }
        } else {
            events::note(stat::REWRITE_FAILED);
        }
        return false;
    }
    // A flow leaving from a mapped host port that we did not translate: the
    // node (or a masqueraded container) opened it. Remember it so its
    // answers are never taken for new inbound traffic.
    //
    // From a wildcard mapping's port only from a node address: a routed
    // packet that merely has a mapped port as its source (a host behind
    // the node talking to a client, a client talking straight to a pod)
    // is no flow of the node's, and recording it would take a conntrack
    // entry per transit flow. The FIB says what is a node address (as
    // ingress asks it whether a destination is one), not `local_addrs`,
    // which lags an address added since the last plugin run; when it
    // cannot tell, the flow is recorded, as before.
    //
    // Only from a host port: the port filter let this packet in for a
    // container port at either end too (a pod's answer from a far host's
    // port 80 while a container serves on 80), and a source port that is
    // no mapping's host port has no mapping to find. The bit is set before
    // a mapping is written and never cleared, so no mapping is missed (the
    // filter in front of egress relies on the same bit).
    //
    // First whether a flow we know owns the answer tuple: the answer of a
    // flow netfilter translates leaves here from the host port, translated
    // back by netfilter, and is its flow's, not the node's (one lookup,
    // where the mapping's and the FIB's took two and a route lookup on
    // every such answer). Where netfilter translates the family, last,
    // whether the kernel holds the flow as one that came in: the answer of
    // a flow whose entries a flood evicted (see `knat::answers_inbound`).
    if maps::port_is(PortRole::Host, packet.proto, packet.sport_be)
        && !answer_known(&key)
        && find_mapping(packet.family, packet.proto, &packet.src_be, packet.sport_be).is_some_and(
            |(key, _)| {
                key.host_addr_be == packet.src_be
                    || fib::is_node_address(ctx, packet.family, &packet.src_be) != Some(false)
            },
        )
        && !(knat::wanted(packet) && knat::answers_inbound(ctx, packet))
    {
        record_pass(&key);
    }
    false
}

/// Records a pass entry for the answers of a flow the node opened from a
/// mapped port, whose packet has tuple `key` (see egress), keyed by the
/// answer tuple [`answer_known`] left in scratch, after it found no flow
/// of ours there in any table. Never over a translation: on a bridge the
/// reply of a translated flow crosses a second egress hook (the bridge
/// port) after the first rewrote it to the host port, and must stay
/// translated; a closed translated flow is in the closed table, and one
/// not yet assured in `conntrack_new`, not here.
/// Built in scratch, and not inlined: egress's frame with the answer's
/// key and the search of three tables on it was 280 bytes, past BPF's
/// 512-byte stack under the entry point and `ct::lookup`.
#[inline(never)]
fn record_pass(key: &CtKey) {
    // The clock first: read after the scratch lookup, its cache's lookup
    // spilled a register, a frame of 40 bytes, 64 on 6.1: past the 512
    // bytes under egress.
    let now = ct::now();
    let Some(scratch) = maps::scratch() else {
        return;
    };
    let pass = &mut scratch.reply;
    for word in &mut pass.nat_addr_be {
        // SAFETY: a word of this CPU's scratch value.
        unsafe { core::ptr::write_volatile(word, 0) };
    }
    pass.nat_port_be = 0;
    pass.kind = ct_kind::PASS;
    pass.tcp_state = 0;
    pass.flags = 0;
    pass.mapping = portmap_common::MappingKey::default();
    pass.verdict_at = 0;
    pass.last_seen_ns = now;
    let table = Table::for_proto(key.proto);
    if maps::ct_put_new(table, &scratch.reply_key, &scratch.reply) {
        maps::ledger(table, maps::Ledger::In);
        maps::count(stat::PASS_RECORDED);
    }
}

/// Whether a flow we know (in any table) owns the answer tuple of `key`.
/// The tuple is built in scratch's `reply_key`, where [`record_pass`]
/// finds it (nothing between the two calls writes it). Field by field:
/// the reversed key or a whole entry built on egress's frames first took
/// its call chain past 6.1's 512 bytes. Not inlined: as record_pass, off
/// egress's frame.
#[inline(never)]
fn answer_known(key: &CtKey) -> bool {
    let Some(scratch) = maps::scratch() else {
        return true;
    };
    let answer = &mut scratch.reply_key;
    for i in 0..4 {
        // SAFETY: words of this CPU's scratch value and of the caller's key.
        unsafe {
            core::ptr::write_volatile(&raw mut answer.src_addr_be[i], key.dst_addr_be[i]);
            core::ptr::write_volatile(&raw mut answer.dst_addr_be[i], key.src_addr_be[i]);
        }
    }
    answer.src_port_be = key.dst_port_be;
    answer.dst_port_be = key.src_port_be;
    answer.proto = key.proto;
    answer.family = key.family;
    answer._pad0 = 0;
    maps::ct_get_any(&scratch.reply_key).is_some()
}

/// After new_flow translated a flow (a new one, or a recovered one, see
/// new_flow): counts it, and offers the packet to the fast path (masquerade
/// withdraws the offer). Not inlined: in the entry point's frame these few
/// lines cost stack the 6.1 verifier lacks. The reason is counted here, not
/// in new_flow, whose frame has no room left for it on 6.1 (which rounds
/// every frame up to 32 bytes); which one, from the entry new_flow left in
/// scratch: a recovered flow is a TCP flow past its SYN. (Passing the
/// caller's `opens` down as an argument counted recoveries for new flows
/// on 6.1, correct on 6.12.)
#[inline(never)]
pub fn translated_new_flow(ctx: &TcContext) {
    if let Some(scratch) = maps::scratch() {
        let recovered = scratch.forward_key.proto == PROTO_TCP
            && scratch.forward.tcp_state & tcp_state::SYN_ONLY == 0;
        maps::count(if recovered {
            stat::CT_RECOVERED
        } else {
            stat::DNAT_NEW
        });
    }
    count_from_scratch(ctx, Way::In);
    if let Some(scratch) = maps::scratch() {
        scratch.fast = Offer::Forward;
    }
}

/// Records in the DNAT entry of the new flow in scratch whether it is
/// masqueraded (`flag`, one of [`ct_flags`]), so that its later packets
/// know without the node's settings and the interface (see
/// `fast::fast_path`); and in scratch, for this packet. Not inlined: one
/// walk for both call sites.
#[inline(never)]
fn remember_masquerade(flag: u32) {
    let Some(scratch) = maps::scratch() else {
        return;
    };
    scratch.forward.flags = flag;
    // A new flow's entries are in `conntrack_new`.
    if let Some(entry) = maps::ct_get(Table::New, &scratch.forward_key) {
        // SAFETY: a live map value; one word, one store.
        unsafe { (*entry).flags = flag };
    }
}

/// Counts a translated packet on its mapping: the first of a new flow
/// (`In`) or an answer (`Out`); new_flow or egress left the mapping and its
/// owner in scratch.
#[inline(always)]
pub fn count_from_scratch(ctx: &TcContext, way: Way) {
    let Some(scratch) = maps::scratch() else {
        return;
    };
    let (mapping, owner_id) = (scratch.forward.mapping, scratch.owner_id);
    counters::record(ctx, &mapping, owner_id, way);
}
