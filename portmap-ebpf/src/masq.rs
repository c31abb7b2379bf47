//! Masquerade: the extra directions of a flow whose source becomes the
//! node's address (hairpin with `snat`, every flow with `masqAll`).

use aya_ebpf::{bindings::bpf_fib_lookup, helpers::bpf_get_prandom_u32, programs::TcContext};
use portmap_common::{
    CtEntry, CtKey, FAMILY_V4, PROTO_TCP, PortRole, ct_kind,
    local::{
        MASQ_OWNER_HOLD, MASQ_PORT_COUNT, MASQ_PORT_MIN, MASQ_PORT_RESET_HOLD_NS,
        MASQ_PORT_TIME_WAIT_NS, MASQ_PORT_TRIES, iface_flags, masq_client_tag, masq_owner_slot,
        masq_owner_time, masq_probe_port, node_flags,
    },
    stat, tcp_state,
};

use crate::{
    ct, events, fib,
    maps::{self, Insert, Offer, PairFailed},
    nat::{self, Side},
    parse::{Packet, TCP_ACK, TCP_SYN},
};

/// Whether a new flow arriving on this interface is masqueraded: every flow
/// with `masqAll`; with `snat`, flows from containers (hairpin), whose
/// answer would otherwise go straight back to the client, bypassing the
/// node and its translation.
#[inline(always)]
pub fn wants_masquerade(ctx: &TcContext) -> bool {
    let Some(node) = maps::node_config() else {
        return false;
    };
    if node.flags & node_flags::MASQ_ALL != 0 {
        return true;
    }
    // SAFETY: reading a field of the context the program was handed.
    let ifindex = unsafe { (*ctx.skb.skb).ingress_ifindex };
    node.flags & node_flags::SNAT != 0
        && maps::iface(ifindex).is_some_and(|i| i.flags & iface_flags::CONTAINER_SIDE != 0)
}

/// Records the two extra directions of a masqueraded flow (the forward
/// entries are in `scratch` already): towards the container the source
/// becomes the node's address on the container's network and a free port;
/// the container's answer to that port goes back to the client. Only the
/// destination is rewritten on ingress and only the source on egress, so the
/// kernel never sees one of its own addresses arrive from outside.
#[inline(never)]
pub fn masquerade(ctx: &TcContext) {
    let Some(scratch) = maps::scratch() else {
        return;
    };
    // A masqueraded flow's source is rewritten on the way to the container,
    // by egress of its interface: the fast path would skip that.
    scratch.fast = Offer::Nothing;
    // Everything comes from the entries new_flow left in scratch, nothing
    // from the caller's stack: the verifier then walks this function once,
    // not once per path through new_flow. Nor is any of it copied onto this
    // frame: with the node-socket check below, the copies took 6.1 past
    // BPF's 512-byte stack (every frame rounded up to 32 bytes). The
    // client's end of `forward_key` stays as it is throughout.
    let family = scratch.forward_key.family;
    let Some(node_addr) =
        masquerade_source(ctx, &mut scratch.fib, family, &scratch.forward.nat_addr_be)
    else {
        events::note(stat::MASQ_NO_ADDR);
        return;
    };
    // Towards the container: after DNAT the packet is client -> container.
    scratch.forward_key.dst_addr_be = scratch.forward.nat_addr_be;
    scratch.forward_key.dst_port_be = scratch.forward.nat_port_be;
    scratch.reply_key = CtKey {
        src_addr_be: scratch.forward.nat_addr_be,
        dst_addr_be: node_addr,
        src_port_be: scratch.forward.nat_port_be,
        dst_port_be: 0,
        proto: scratch.forward_key.proto,
        family,
        _pad0: 0,
    };
    // Both masquerade directions start in the handshake state of the DNAT
    // entry (a new TCP flow's SYN_ONLY): the client's first segment without
    // SYN, rewritten by egress, clears it on both (see `ct::track_tcp`). Until
    // then the container's answers stay off the fast path, so netfilter sees
    // the whole handshake (see `confirm`).
    scratch.reply = CtEntry {
        nat_addr_be: scratch.forward_key.src_addr_be,
        nat_port_be: scratch.forward_key.src_port_be,
        kind: ct_kind::UNMASQ,
        tcp_state: scratch.forward.tcp_state,
        mapping: scratch.forward.mapping,
        last_seen_ns: scratch.forward.last_seen_ns,
        ..CtEntry::default()
    };
    // Towards the container the source becomes node_addr and the port
    // tried (filled in below); the mapping, the time and the handshake
    // state stay.
    scratch.forward.nat_addr_be = node_addr;
    scratch.forward.nat_port_be = 0;
    scratch.forward.kind = ct_kind::SNAT;
    scratch.forward.flags = 0;
    let table = maps::Table::for_proto(scratch.forward_key.proto);
    // The first candidate is the port this client tuple had last, if
    // any, else the client's own port (see `first_port`); then random
    // ones.
    let mut kept_be = first_port(&scratch.forward_key);
    let client = masq_client_tag(
        family,
        &scratch.forward_key.src_addr_be,
        scratch.forward_key.src_port_be,
    );
    let mut tries = 0;
    while tries < MASQ_PORT_TRIES {
        let kept = kept_be != 0;
        let port_be = if kept {
            kept_be
        } else if table == maps::Table::Open {
            // TCP: the client tuple's own sequence of ports (see
            // `masq_probe_port`), where its next flow finds this one's.
            masq_probe_port(client, tries).to_be()
        } else {
            // SAFETY: no arguments.
            let random = unsafe { bpf_get_prandom_u32() };
            (MASQ_PORT_MIN + (random % u32::from(MASQ_PORT_COUNT)) as u16).to_be()
        };
        kept_be = 0;
        scratch.reply_key.dst_port_be = port_be;
        scratch.forward.nat_port_be = port_be;
        // A node connection on the tuple (the node dialled the container
        // from its own address and this port) keeps it: the container's
        // answers to that port are the node's.
        if table != maps::Table::Other && ct::node_socket_owns_tuple(ctx, &scratch.reply_key) {
            maps::count(stat::MASQ_PORT_NODE_HELD);
            tries += 1;
            continue;
        }
        // A tuple another client had less than a TIME_WAIT ago may still
        // be held by the container, with that client's clock: passed over
        // by every try but the last (see `MasqOwner`).
        if table == maps::Table::Open
            && tries + 1 < MASQ_PORT_TRIES
            && owned_by_other(&scratch.reply_key, client, scratch.reply.last_seen_ns)
        {
            tries += 1;
            continue;
        }
        // Another client's flow that closed there lately outranks this
        // client's earlier use of the port too: the container's
        // TIME_WAIT, if any, is that flow's now.
        if table == maps::Table::Open
            && held_for_other(
                &scratch.reply_key,
                &scratch.forward_key,
                scratch.reply.last_seen_ns,
                tries < MASQ_PORT_TRIES / 2,
            )
        {
            tries += 1;
            continue;
        }
        // A port an assured flow of another client holds is not taken
        // over (the new flow is written to `conntrack_new`, where IfFree
        // does not see it).
        if other_clients(table, &scratch.reply_key, &scratch.forward_key).is_some() {
            tries += 1;
            continue;
        }
        // The client's own tuple is written over its own entries (its SYN
        // sent again while they are still open), never over another's.
        let how = if kept
            && other_clients(maps::Table::New, &scratch.reply_key, &scratch.forward_key).is_none()
        {
            Insert::Any
        } else {
            Insert::IfFree
        };
        // IfFree: a port in use by another masqueraded flow to the same
        // container port is not taken over. Written with the flow's other
        // entries, among the flows not yet assured.
        match maps::ct_put_pair(
            maps::Table::New,
            (&scratch.reply_key, &scratch.reply),
            how,
            (&scratch.forward_key, &scratch.forward),
        ) {
            Ok(()) => {
                if table == maps::Table::Open {
                    claim(&scratch.reply_key, client, scratch.reply.last_seen_ns);
                }
                maps::count(stat::MASQ);
                return;
            }
            Err(PairFailed::Second) => {
                events::note(stat::CT_INSERT_FAILED);
                return;
            }
            Err(PairFailed::First) => tries += 1,
        }
    }
    events::note(stat::MASQ_NO_PORT);
}

/// The first masquerade port to try (network order) for the client tuple
/// `forward_key` (client to container): the one its last flow had (see
/// `earlier_port`), else, for TCP, the client's own source port, as
/// netfilter's masquerade keeps it when the tuple is free. A container
/// holds a closed flow's tuple in TIME_WAIT and takes a new SYN there only
/// if its timestamps (or sequence) are later than the last ones it saw;
/// Linux gives every tuple its own timestamp offset, so a port last used
/// by another client tuple is refused half the time (an ACK, then the
/// client's RST and its second SYN: a round trip and two jiffies lost).
/// The client's own port makes the masqueraded tuple one to one with the
/// client's, whose kernel keeps its own clocks monotonic per tuple and
/// picks its ports far apart. Ports below 1024 are never kept: they may
/// be a node service's. A port whose tuple a node connection holds is
/// passed over (see `masquerade`).
#[inline(always)]
fn first_port(forward_key: &CtKey) -> u16 {
    let earlier = earlier_port(forward_key);
    if earlier != 0 || forward_key.proto != PROTO_TCP {
        return earlier;
    }
    if u16::from_be(forward_key.src_port_be) >= 1024 {
        forward_key.src_port_be
    } else {
        0
    }
}

/// The masquerade port (network order) of the last flow of the client
/// tuple `forward_key` (client to container), open or closed; 0 if none.
///
/// A flow keeps its masquerade tuple when its SYN comes again, as the
/// client's kernel relies on: a container holding a tuple in TIME_WAIT
/// refuses a SYN whose timestamps are older (another client's clock), with
/// an ACK; the client answers it with a RST, which ends the TIME_WAIT,
/// and sends its SYN again at once, for the same tuple. Given a new random
/// port instead, that SYN may meet another TIME_WAIT, and the next try
/// comes only after the full retransmission timeout (one second).
/// Netfilter does the same: a SYN that reopens a closed flow's tuple gets
/// the same source port again if it is free.
#[inline(always)]
fn earlier_port(forward_key: &CtKey) -> u16 {
    let Some((entry, _)) = maps::ct_get_any(forward_key) else {
        return 0;
    };
    // SAFETY: fields of a live map value, read once.
    let (kind, port_be) = unsafe { ((*entry).kind, (*entry).nat_port_be) };
    if kind == ct_kind::SNAT { port_be } else { 0 }
}

/// The answer entry `reply_key` (container to node, masquerade port) in
/// `table`, if it is another client's than `client` (the client tuple of
/// the flow being masqueraded).
#[inline(always)]
fn other_clients(table: maps::Table, reply_key: &CtKey, client: &CtKey) -> Option<*mut CtEntry> {
    let entry = maps::ct_get(table, reply_key)?;
    // SAFETY: fields of a live map value, read once each.
    let same = unsafe {
        (*entry).nat_port_be == client.src_port_be
            && (*entry).nat_addr_be[0] == client.src_addr_be[0]
            && (*entry).nat_addr_be[1] == client.src_addr_be[1]
            && (*entry).nat_addr_be[2] == client.src_addr_be[2]
            && (*entry).nat_addr_be[3] == client.src_addr_be[3]
    };
    (!same).then_some(entry)
}

/// Whether the masquerade port of `reply_key` is to be passed over for a
/// new flow of `client` because another client's flow closed there
/// lately: reset less than [`MASQ_PORT_RESET_HOLD_NS`] ago (kept for that
/// client's next SYN), or, while `choosy`, closed by FIN less than
/// [`MASQ_PORT_TIME_WAIT_NS`] ago (the container may still hold it in
/// TIME_WAIT). The later tries are not choosy: under churn every port has
/// closed lately, and such a port is better than none. If the container
/// refuses the SYN there, the client's reset and second SYN, which keeps
/// the port (see `earlier_port`), get through.
#[inline(always)]
fn held_for_other(reply_key: &CtKey, client: &CtKey, now: u64, choosy: bool) -> bool {
    let Some(entry) = other_clients(maps::Table::Closed, reply_key, client) else {
        return false;
    };
    // SAFETY: fields of a live map value, read once each.
    let (state, closed_at) = unsafe { ((*entry).tcp_state, (*entry).last_seen_ns) };
    let age = now.saturating_sub(closed_at);
    if state & tcp_state::FIN == 0 {
        age < MASQ_PORT_RESET_HOLD_NS
    } else {
        choosy && age < MASQ_PORT_TIME_WAIT_NS
    }
}

/// Whether the masquerade tuple `reply_key` (container to node) was given
/// to a client other than the one tagged `client` less than a TIME_WAIT
/// before `now`.
#[inline(always)]
fn owned_by_other(reply_key: &CtKey, client: u32, now: u64) -> bool {
    let Some(owner) = maps::masq_owner(owner_slot(reply_key)) else {
        return false;
    };
    // SAFETY: fields of a live map value, read once each.
    let (owner, since) = unsafe { ((*owner).client, (*owner).since) };
    owner != 0 && owner != client && masq_owner_time(now).wrapping_sub(since) < MASQ_OWNER_HOLD
}

/// Records the client tagged `client` as the last one of the masquerade
/// tuple `reply_key`, at `now`.
#[inline(always)]
fn claim(reply_key: &CtKey, client: u32, now: u64) {
    if let Some(owner) = maps::masq_owner(owner_slot(reply_key)) {
        // SAFETY: a live map value; a racing writer leaves one of the two
        // whole claims or a mix of both, either a client's tag.
        unsafe {
            (*owner).client = client;
            (*owner).since = masq_owner_time(now);
        }
    }
}

/// The `masq_owners` slot of the masquerade tuple `reply_key`.
#[inline(always)]
fn owner_slot(reply_key: &CtKey) -> u32 {
    masq_owner_slot(
        reply_key.family,
        &reply_key.src_addr_be,
        reply_key.src_port_be,
        u16::from_be(reply_key.dst_port_be),
    )
}

/// The node's address on the interface the kernel will send `container_be`
/// out of: where the container's answer must come back to.
/// `params` is the caller's scratch space for the lookup.
#[inline(always)]
fn masquerade_source(
    ctx: &TcContext,
    params: &mut bpf_fib_lookup,
    family: u8,
    container_be: &[u32; 4],
) -> Option<[u32; 4]> {
    let iface = maps::iface(fib::output_interface(ctx, params, family, container_be)?)?;
    if family == FAMILY_V4 {
        (iface.addr4_be != 0).then_some([iface.addr4_be, 0, 0, 0])
    } else {
        (iface.addr6_be != [0; 4]).then_some(iface.addr6_be)
    }
}

/// A TCP SYN the node sends to a container (egress, not translated): if a
/// masqueraded flow holds its tuple (a hairpin client's port kept, see
/// `first_port`, that the node picked too), the container's answers would
/// go to that flow's client. A closed flow's lingering entries give the
/// tuple up; an open flow keeps it and the node's connection gets another
/// source port (from the masquerade range, which the node's own ports
/// never use), as netfilter remaps a clashing local connection. A SYN of a
/// flow egress knows (a masqueraded one, or the node's own, remapped
/// already and translated by egress) is left alone. Not inlined: egress's
/// frame has no room for it, and most SYNs never get past the first
/// lookups.
#[inline(never)]
pub fn node_flow_on_masq_tuple(ctx: &mut TcContext, packet: &Packet) {
    // Decided here, not by the caller: the entry point's frame has no room
    // for the test (6.1 rounds it up past 512 bytes with egress's).
    if packet.proto != PROTO_TCP
        || packet.flags & (TCP_SYN | TCP_ACK) != TCP_SYN
        || !maps::port_is(PortRole::Container, packet.proto, packet.dport_be)
    {
        return;
    }
    let Some(scratch) = maps::scratch() else {
        return;
    };
    scratch.forward_key = ct::key_of(packet);
    if maps::ct_get_live(&scratch.forward_key).is_some() {
        return;
    }
    scratch.reply_key = ct::reversed(&scratch.forward_key);
    if let Some(entry) = maps::ct_get(maps::Table::Closed, &scratch.reply_key) {
        // SAFETY: fields of a live map value, read once each.
        let (kind, client_be, client_port_be) =
            unsafe { ((*entry).kind, (*entry).nat_addr_be, (*entry).nat_port_be) };
        if kind == ct_kind::UNMASQ {
            maps::ct_remove(maps::Table::Closed, &scratch.reply_key);
            // The client's side of it: its tuple towards the container.
            scratch.forward_key.src_addr_be = client_be;
            scratch.forward_key.src_port_be = client_port_be;
            maps::ct_remove(maps::Table::Closed, &scratch.forward_key);
            maps::count(stat::MASQ_TUPLE_RELEASED);
        }
        node_claims(packet, &scratch.reply_key);
        return;
    }
    let Some((entry, _)) = maps::ct_get_live(&scratch.reply_key) else {
        // The node's own connection on a tuple no flow of ours holds: the
        // container's TIME_WAIT there will be the node's.
        node_claims(packet, &scratch.reply_key);
        return;
    };
    // SAFETY: one byte of a live map value.
    if unsafe { (*entry).kind } != ct_kind::UNMASQ {
        return;
    }
    // Built in scratch, nothing copied onto this frame (6.1's 512 bytes:
    // see `masquerade`).
    scratch.reply = CtEntry {
        nat_addr_be: packet.src_be,
        nat_port_be: packet.sport_be,
        kind: ct_kind::UNMASQ,
        tcp_state: tcp_state::SYN_ONLY,
        // SAFETY: a field of a live map value, copied at once.
        mapping: unsafe { (*entry).mapping },
        last_seen_ns: ct::now(),
        ..CtEntry::default()
    };
    scratch.forward = CtEntry {
        nat_addr_be: packet.src_be,
        kind: ct_kind::SNAT,
        tcp_state: tcp_state::SYN_ONLY,
        mapping: scratch.reply.mapping,
        last_seen_ns: scratch.reply.last_seen_ns,
        ..CtEntry::default()
    };
    let mut tries = 0;
    while tries < MASQ_PORT_TRIES {
        tries += 1;
        // SAFETY: no arguments.
        let random = unsafe { bpf_get_prandom_u32() };
        let port_be = (MASQ_PORT_MIN + (random % u32::from(MASQ_PORT_COUNT)) as u16).to_be();
        scratch.reply_key.dst_port_be = port_be;
        scratch.forward.nat_port_be = port_be;
        match maps::ct_put_pair(
            maps::Table::New,
            (&scratch.reply_key, &scratch.reply),
            Insert::IfFree,
            (&scratch.forward_key, &scratch.forward),
        ) {
            Ok(()) => {
                node_claims(packet, &scratch.reply_key);
                if nat::rewrite(ctx, packet, Side::Source, &packet.src_be, port_be) {
                    maps::count(stat::NODE_FLOW_REMAPPED);
                } else {
                    events::note(stat::REWRITE_FAILED);
                }
                return;
            }
            Err(PairFailed::Second) => {
                events::note(stat::CT_INSERT_FAILED);
                return;
            }
            Err(PairFailed::First) => {}
        }
    }
    events::note(stat::MASQ_NO_PORT);
}

/// Records the node's connection of the SYN `packet` (its own address and
/// port, whose timestamps the container sees) as the last client of the
/// masquerade tuple `reply_key`.
#[inline(always)]
fn node_claims(packet: &Packet, reply_key: &CtKey) {
    claim(
        reply_key,
        masq_client_tag(reply_key.family, &packet.src_be, packet.sport_be),
        ct::now(),
    );
}
