//! The fast path: hands a translated packet straight to the container's
//! interface, or a container's answer straight to the interface towards
//! its client, skipping the node's routing, netfilter and bridge (a
//! hairpin flow's packets, from a container to a container, go to the
//! egress of the interface towards the other end, which masquerades or
//! translates them back as on the normal path). For
//! every translated flow (`fastPath: true`), or, the default, only for
//! flows the kernel's conntrack holds as confirmed (see `confirm`).

use aya_ebpf::{
    bindings::{TC_ACT_OK, TC_ACT_REDIRECT, TC_ACT_SHOT, bpf_fib_lookup},
    helpers::{bpf_redirect, bpf_redirect_peer},
    programs::TcContext,
};
use portmap_common::{
    CtKey, FAMILY_V4, FAMILY_V6, ct_flags,
    local::{iface_flags, node_flags},
    stat,
};

use crate::{
    confirm, events,
    fib::fib_lookup_as_received,
    knat,
    maps::{self, Offer},
    mark,
    masq::wants_masquerade,
    parse::{ETH_HLEN, read},
};

/// The fast path, for what the handling code left in scratch: sets
/// `scratch.action` (OK, or REDIRECT when the packet was handed over) and
/// clears the offer. One call site, after the handling frames are gone,
/// so the verifier walks it once; and in it one call of each hand-over and
/// of the confirmed-flow question, whatever the mode.
#[inline(never)]
pub fn fast_path(ctx: &TcContext) {
    let Some(scratch) = maps::scratch() else {
        return;
    };
    let offer = scratch.fast;
    let flow_flags = scratch.forward.flags;
    // Set only by a known flow's decision for this very packet.
    let armed = scratch.confirm.armed;
    scratch.confirm.armed = false;
    scratch.fast = Offer::Nothing;
    scratch.action = TC_ACT_OK;
    let offered = matches!(offer, Offer::Forward | Offer::Reply);
    // Without the fast path, not even a call: a call and its return cost
    // 10-15 ns (program_cost.rs).
    let go = offered
        && match mode() {
            Mode::Always => true,
            Mode::Confirmed => armed && confirm::confirmed(ctx),
            Mode::Never => false,
        };
    let taken = match offer {
        Offer::Forward | Offer::Handed => {
            let action = if go || offer == Offer::Handed {
                fast_forward(ctx, armed)
            } else {
                TC_ACT_OK
            };
            // On the normal path, unmasqueraded: the next egress hook
            // has nothing to do.
            if action != TC_ACT_REDIRECT && not_masqueraded(ctx, flow_flags) {
                mark::mark_translated(ctx);
            }
            action
        }
        Offer::Reply if go => fast_reply(ctx),
        Offer::Reply => TC_ACT_OK,
        Offer::Drop => TC_ACT_SHOT,
        Offer::Nothing => return,
    };
    // Taken again: both hand-overs read scratch themselves.
    if let Some(scratch) = maps::scratch() {
        scratch.action = taken;
    }
}

/// Which flows the fast path takes on this node (`node_flags`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Every translated flow (`fastPath: true`).
    Always,
    /// Flows the kernel's conntrack holds as confirmed (the default).
    Confirmed,
    /// None (`fastPath: false`, masqAll, or a kernel without the
    /// conntrack kfuncs and something at FORWARD).
    Never,
}

/// The node's fast-path mode. masqAll keeps every packet on the normal
/// path: it rewrites the source on the way to the container, in egress of
/// the container's interface, which the hand-over would skip.
#[inline(always)]
fn mode() -> Mode {
    let Some(node) = maps::node_config() else {
        return Mode::Never;
    };
    if node.flags & node_flags::MASQ_ALL != 0 {
        Mode::Never
    } else if node.flags & node_flags::FAST_PATH != 0 {
        Mode::Always
    } else if node.flags & node_flags::FAST_CONFIRMED != 0 {
        Mode::Confirmed
    } else {
        Mode::Never
    }
}

/// Whether the flow of the translated packet is not masqueraded: as its
/// DNAT entry recorded (`flags`, left in scratch by the flow decision), or,
/// for an entry of an earlier build, as the node's settings say now
/// (masquerade leaves no offer for a new flow, so this is a known flow's).
#[inline(always)]
fn not_masqueraded(ctx: &TcContext, flags: u32) -> bool {
    if flags & ct_flags::DIRECT != 0 {
        true
    } else if flags & ct_flags::MASQUERADED != 0 {
        false
    } else {
        !wants_masquerade(ctx)
    }
}

/// Whether a fast path is on (either mode) and the packet arrived from
/// the containers' side (`true`) or from elsewhere (`false`); `None`
/// without a fast path (see [`mode`]).
#[inline(always)]
pub fn fast_path_from_containers(ctx: &TcContext) -> Option<bool> {
    if mode() == Mode::Never {
        return None;
    }
    // SAFETY: reading a field of the context the program was handed.
    let ifindex = unsafe { (*ctx.skb.skb).ingress_ifindex };
    Some(maps::iface(ifindex).is_some_and(|i| i.flags & iface_flags::CONTAINER_SIDE != 0))
}

/// Which flows netfilter translates the fast path takes on this node
/// (see `knat::follow_noted`).
#[inline(always)]
pub fn knat_hand_over() -> knat::HandOver {
    match mode() {
        Mode::Always => knat::HandOver::Always,
        Mode::Confirmed => knat::HandOver::Confirmed,
        Mode::Never => knat::HandOver::Never,
    }
}

/// Whether a fast path is on, in either mode (see [`mode`]).
#[inline(always)]
pub fn fast_path_on() -> bool {
    mode() != Mode::Never
}

/// The fast path towards a container: a packet from outside, translated,
/// goes straight into the container's interface (`bpf_redirect_peer`),
/// skipping the node's routing, netfilter and bridge. Only when the
/// hand-over entry belongs to the owner of the mapping that translated it.
/// Reads what existing_flow or new_flow left in scratch; `known`: a known
/// flow's packet (see `confirm::note`).
#[inline(never)]
pub fn fast_forward(ctx: &TcContext, known: bool) -> i32 {
    let pass = TC_ACT_OK;
    match fast_path_from_containers(ctx) {
        Some(false) => {}
        Some(true) => return hairpin_forward(ctx, known),
        None => return pass,
    }
    let Some(scratch) = maps::scratch() else {
        return pass;
    };
    let (family, container_be, owner_id) = (
        scratch.forward_key.family,
        scratch.forward.nat_addr_be,
        scratch.owner_id,
    );
    let Some(peer) = maps::peer(family, &container_be) else {
        return pass;
    };
    if peer.owner_id != owner_id {
        return pass;
    }
    // The frame as the node's side of the link would send it: to the
    // container's MAC, from the gateway's (adjacent fields, in this order).
    // SAFETY: both MACs lie within `peer`, 12 bytes from offset 12.
    let macs: [u8; 12] =
        unsafe { core::ptr::read_unaligned((&raw const peer.container_mac).cast::<[u8; 12]>()) };
    if ctx.store(0, &macs, 0).is_err() {
        return pass;
    }
    // SAFETY: plain helper call; it only records where the skb goes.
    let action = unsafe { bpf_redirect_peer(peer.ifindex, 0) } as i32;
    if action == TC_ACT_REDIRECT {
        events::note_first(stat::FAST_FORWARD);
    }
    action
}

/// The fast path of a hairpin flow (a container dialling a host port
/// through a node address, translated to a container of this node): the
/// translated packet goes straight to the egress of the interface towards
/// that container, as the node's FIB says, where egress masquerades it as
/// usual (the source a node address and a masquerade port, see `masq`).
/// It skips the bridge's netfilter (br_netfilter), the node's routing and
/// its FORWARD and POSTROUTING hooks; the container's answer comes back
/// the same way (see [`fast_reply`]). Only to an interface on the
/// containers' side whose egress program masquerades. Reads the tuple
/// the flow decision left in scratch: a `known` flow's in what it noted
/// for the confirmed-flow question (its key as it arrived, and the
/// container's end), a new one's (`fastPath: true`) in its entries.
#[inline(never)]
fn hairpin_forward(ctx: &TcContext, known: bool) -> i32 {
    let pass = TC_ACT_OK;
    let Some(scratch) = maps::scratch() else {
        return pass;
    };
    let (client, container, container_port) = if known {
        let pending = &scratch.confirm;
        (pending.key, pending.kernel_dst_be, pending.kernel_dport_be)
    } else {
        (
            scratch.forward_key,
            scratch.forward.nat_addr_be,
            scratch.forward.nat_port_be,
        )
    };
    // Only to an interface on the containers' side: its egress masquerades.
    redirect_as_routed(
        ctx,
        &mut scratch.fib,
        (&client, (&container, container_port)),
        iface_flags::CONTAINER_SIDE,
        stat::FAST_FORWARD,
    )
}

/// The fast path back: a container's answer goes straight to the egress of
/// the interface towards its client (as the node's FIB says, with the
/// neighbour it knows), where egress translates it back as usual. It skips
/// the node's routing, netfilter and, on a bridge, nothing more; a hairpin
/// flow's answer (its destination restored to the client by ingress, on
/// the answering container's bridge port) also skips the bridge's
/// netfilter. Anything
/// the FIB does not answer plainly (no neighbour yet, too big, not
/// forwarded) takes the normal path. Reads the tuple the flow decision
/// noted for the confirmed-flow question (the answer as it arrived, the
/// client's end in `kernel_dst`: for a masqueraded flow's answer, where
/// ingress restored it).
#[inline(never)]
pub fn fast_reply(ctx: &TcContext) -> i32 {
    let pass = TC_ACT_OK;
    if fast_path_from_containers(ctx) != Some(true) {
        return pass;
    }
    let Some(scratch) = maps::scratch() else {
        return pass;
    };
    let pending = &scratch.confirm;
    let (key, client, client_port) = (pending.key, pending.kernel_dst_be, pending.kernel_dport_be);
    // Only to an interface whose egress program translates the answer.
    redirect_as_routed(
        ctx,
        &mut scratch.fib,
        (&key, (&client, client_port)),
        0,
        stat::FAST_REPLY,
    )
}

/// Hands a container's ICMP error about a translated flow, met at the
/// container's port untranslated (see `icmp::translate_error`), to the
/// egress of the interface towards its client, where egress translates it
/// as it does the flow's answers. Only with `fastPath: true`: the flow's
/// packets skipped netfilter, whose conntrack then has nothing to relate
/// the error to (kube-proxy's `ct state invalid drop` drops it); in the
/// confirmed mode the kernel's entry relates it, and the error takes the
/// normal path. Reads the error's ends from its IP header. Not inlined:
/// off every other path.
#[inline(never)]
pub fn hand_error_to_client(ctx: &TcContext) -> i32 {
    if mode() != Mode::Always || fast_path_from_containers(ctx) != Some(true) {
        return TC_ACT_OK;
    }
    let Some(key) = error_ends(ctx) else {
        return TC_ACT_OK;
    };
    let Some(scratch) = maps::scratch() else {
        return TC_ACT_OK;
    };
    redirect_as_routed(
        ctx,
        &mut scratch.fib,
        (&key, (&key.dst_addr_be, 0)),
        0,
        stat::FAST_REPLY,
    )
}

/// The ends of an ICMP (IPv4) or ICMPv6 packet as a conntrack key (no
/// ports), from its IP header.
#[inline(always)]
fn error_ends(ctx: &TcContext) -> Option<CtKey> {
    const ETH_P_IP: u16 = 0x0800;
    let v4 = u16::from_be(read::<u16>(ctx, 12)?) == ETH_P_IP;
    let (src_addr_be, dst_addr_be, proto, family) = if v4 {
        (
            [read::<u32>(ctx, ETH_HLEN + 12)?, 0, 0, 0],
            [read::<u32>(ctx, ETH_HLEN + 16)?, 0, 0, 0],
            1,
            FAMILY_V4,
        )
    } else {
        (
            read::<[u32; 4]>(ctx, ETH_HLEN + 8)?,
            read::<[u32; 4]>(ctx, ETH_HLEN + 24)?,
            58,
            FAMILY_V6,
        )
    };
    Some(CtKey {
        src_addr_be,
        dst_addr_be,
        src_port_be: 0,
        dst_port_be: 0,
        proto,
        family,
        _pad0: 0,
    })
}

/// Hands the packet to the egress of the interface the node's FIB routes
/// it to, as if received here, from the source end of `key` (with its
/// family and protocol) to `dst`, rewriting the frame's MACs as that hop
/// would: only to an interface that carries our programs and has every
/// bit of `flags`, and only when the FIB answers plainly (a neighbour
/// known, not too big, forwarded). Counts `stat` when handed over; the
/// normal path (`TC_ACT_OK`) otherwise.
#[inline(always)]
fn redirect_as_routed(
    ctx: &TcContext,
    params: &mut bpf_fib_lookup,
    (key, dst): (&CtKey, (&[u32; 4], u16)),
    flags: u32,
    stat: u32,
) -> i32 {
    let pass = TC_ACT_OK;
    let ret = fib_lookup_as_received(
        ctx,
        params,
        key.family,
        key.proto,
        (&key.src_addr_be, key.src_port_be),
        dst,
    );
    let ours = maps::iface(params.ifindex).is_some_and(|iface| iface.flags & flags == flags);
    if ret != 0 || !ours {
        return pass;
    }
    if ctx.store(0, &params.dmac, 0).is_err() || ctx.store(6, &params.smac, 0).is_err() {
        return pass;
    }
    // SAFETY: plain helper call; it only records where the skb goes.
    let action = unsafe { bpf_redirect(params.ifindex, 0) } as i32;
    if action == TC_ACT_REDIRECT {
        events::note_first(stat);
    }
    action
}
