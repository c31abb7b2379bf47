//! Translation by the node's netfilter (the default where the kernel can):
//! a new TCP or UDP flow from outside gets the kernel's conntrack entry
//! that upstream's DNAT rule would make, original tuple `client -> host
//! address:hostPort`, NAT to `container:port`, status DNAT, and its
//! packets are left as they are both ways: netfilter's NAT translates
//! them, and everything on the node that reasons about DNAT sees one
//! (firewalld's `ct status dnat`, `--ctorigdst`, `conntrack -L`, `-D`).
//! Our maps still decide which container owns a port, with the same O(1)
//! lookup and no rule.
//!
//! The entry is made on the flow's first packet at tc ingress, before
//! netfilter's PREROUTING finds it (`bpf_skb_ct_alloc`, then
//! `bpf_ct_set_nat_info` with `NF_NAT_MANIP_DST`, then
//! `bpf_ct_insert_entry`); netfilter then takes the packet as the first
//! of a flow it has already NATed (`ct state new`, `ct status dnat`).
//! Later packets look the kernel's entry up and make it again when it is
//! gone (`conntrack -D`, a flush, an expiry), as upstream's rule makes it
//! again for the flow's next packet; a TCP SYN whose tuple still has an
//! entry (a closed flow's, in TIME_WAIT) expires that one first, as the
//! kernel does for a SYN on a closed flow, so that the new flow gets its
//! DNAT.
//!
//! When, per family, the node's settings say so (`node_flags::KERNEL_NAT4`,
//! `KERNEL_NAT6`: userspace sets them where the kfuncs linked and
//! netfilter applies an entry's NAT, i.e. a nat chain and a rule that uses
//! conntrack exist, see `node::nft_tables::nat_hooked` in portmap-user;
//! without them the node answers the untranslated packet with a RST),
//! for TCP and UDP (the kernel allocates no SCTP entry),
//! for flows that are not masqueraded (their masquerade is tc's). Once
//! confirmed (see `confirm`), such a flow is translated in tc and handed
//! to the fast path as any other ([`hand_over_confirmed`]), its kernel
//! entry kept alive by the questions and made again when a packet from
//! the client finds it gone. With `fastPath: true` the entry is made the
//! same way and the flow handed over from its first packet
//! ([`hand_over_first`]), past netfilter, so that `conntrack -L` shows it.
//! Everything
//! else is translated in tc, as before; a flow keeps the translation it
//! started with (`ct_kind::NETFILTER` in its entries' kinds, so that the
//! code walking a tc flow's entries meets no new branch: a netfilter
//! flow's kinds fall to the arms that leave a packet alone).

use aya_ebpf::{bindings::BPF_F_CURRENT_NETNS, programs::TcContext};
use portmap_common::{
    CtKey, FAMILY_V4, PROTO_TCP, PROTO_UDP, ct_flags, ct_kind, local::node_flags, stat, tcp_state,
};

use crate::{
    confirm,
    counters::{self, Way},
    ct, kfunc,
    maps::{self, CtOpts, Offer, Table},
    nat::{self, Side},
    parse::{Packet, TCP_ACK, TCP_SYN},
};

/// Which flows netfilter translates the fast path takes, as the node's
/// fast-path mode says (read by `fast`, which the caller asks).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum HandOver {
    /// None (`fastPath: false`, masqAll, no kfuncs).
    Never,
    /// Confirmed ones (the default).
    Confirmed,
    /// Every one, from its first packet (`fastPath: true`).
    Always,
}

/// `enum nf_nat_manip_type`'s `NF_NAT_MANIP_DST`.
const NF_NAT_MANIP_DST: u32 = 1;

/// What [`ensure`] found or did.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kernel {
    /// The kernel's entry was there.
    Found,
    /// Made now.
    Made,
    /// Gone, and could not be made.
    Failed,
}

/// Whether the node's netfilter translates a new flow of `packet`'s
/// family and protocol (see the module). The caller has ruled out
/// masquerade.
#[inline(always)]
pub fn wanted(packet: &Packet) -> bool {
    if packet.proto != PROTO_TCP && packet.proto != PROTO_UDP {
        return false;
    }
    let flag = if packet.family == FAMILY_V4 {
        node_flags::KERNEL_NAT4
    } else {
        node_flags::KERNEL_NAT6
    };
    maps::node_config().is_some_and(|node| node.flags & flag != 0)
}

/// Marks the new flow new_flow is building in scratch as netfilter's
/// (both directions' entries, before they are recorded: a packet of the
/// flow on another CPU never finds them unmarked).
#[inline(always)]
pub fn choose(scratch: &mut maps::Scratch) {
    scratch.forward.kind = ct_kind::NETFILTER_DNAT;
    scratch.forward.flags = ct_flags::DIRECT;
    scratch.reply.kind = ct_kind::NETFILTER_REPLY;
}

/// Whether the new flow in scratch is netfilter's (see [`choose`]).
#[inline(always)]
pub fn chosen() -> bool {
    maps::scratch().is_some_and(|scratch| scratch.forward.kind == ct_kind::NETFILTER_DNAT)
}

/// The first packet of a flow new_flow recorded for netfilter (or a
/// recovered one's): makes the kernel's entry and leaves the packet as it
/// is. Counts what it did. Not inlined: the kfunc calls and their
/// references are walked once, off every other path.
#[inline(never)]
pub fn hand_over_new(ctx: &TcContext, packet: &Packet) {
    let Some(scratch) = maps::scratch() else {
        return;
    };
    scratch.kernel_addr = scratch.forward.nat_addr_be;
    let port_be = scratch.forward.nat_port_be;
    // A SYN alone opens a flow whose tuple may still hold a closed flow's
    // entry, which it replaces. Not over an established flow of ours that
    // no FIN closes: the kernel ignores a SYN there, and so does this (a
    // spoofed SYN on a live tuple ends no flow). A TCP flow recovered
    // mid-flow (no SYN) replaces the kernel's entry too: a flow that was
    // on the fast path left it behind the flow's sequence numbers, and
    // netfilter would take this packet as INVALID (then not translate it:
    // the node itself answered with a RST), where an entry made now
    // picks the flow up from this packet, as after a `conntrack -D`. A UDP
    // packet follows whatever entry the kernel has.
    let fresh = packet.proto == PROTO_TCP
        && (packet.flags & TCP_SYN == 0
            || (packet.flags & TCP_ACK == 0 && !established(&scratch.forward_key)));
    maps::count(match ensure(ctx, packet, port_be, fresh) {
        Kernel::Made => stat::KNAT_NEW,
        Kernel::Found => stat::KNAT,
        Kernel::Failed => stat::KNAT_FAILED,
    });
}

/// Whether our assured entry of `key` is an established TCP flow's, no FIN
/// seen.
#[inline(always)]
fn established(key: &CtKey) -> bool {
    // SAFETY: one byte of a live map value, read once.
    maps::ct_get(Table::Open, key)
        .is_some_and(|entry| unsafe { (*entry).tcp_state } & tcp_state::FIN == 0)
}

/// Notes that the packet `existing_flow` looked up follows a flow
/// netfilter translates, for [`follow_noted`].
#[inline(always)]
pub fn note() {
    if let Some(scratch) = maps::scratch() {
        scratch.knat_follow = true;
    }
}

/// A later packet of a flow netfilter translates (see [`note`]), whose
/// DNAT entry `ct::lookup` left in scratch (`found`): its mapping checked
/// (a stale flow is left to the kernel's entry, as upstream leaves its
/// conntrack entries past a rule's removal), its TCP state noted, then
/// either handed to the fast path, confirmed ([`hand_over_confirmed`]), or
/// left to netfilter with the kernel's entry made again if it is gone; and
/// the packet counted on its mapping. Not inlined: as [`hand_over_new`];
/// the caller sees no value out of it.
#[inline(never)]
pub fn follow_noted(ctx: &mut TcContext, packet: &Packet, how: HandOver) {
    let Some(scratch) = maps::scratch() else {
        return;
    };
    if !scratch.knat_follow {
        return;
    }
    scratch.knat_follow = false;
    let Some(owner_id) = ct::still_mapped(
        &scratch.found.mapping,
        &scratch.found.nat_addr_be,
        scratch.found.nat_port_be,
    ) else {
        maps::count(stat::STALE_FLOW);
        return;
    };
    ct::note_tcp_change(packet, scratch.found.tcp_state);
    // Decided and translated in two calls, each on top of this frame
    // only: stacked, they took 6.1 past BPF's 512 bytes.
    let handed = how != HandOver::Never
        && hand_over_confirmed(ctx, packet, owner_id, how == HandOver::Always)
        && translate_handed(ctx, packet);
    // Taken whatever happened after it was set, never left for the next
    // packet.
    let lost = take_lost();
    if !handed || lost {
        let Some(scratch) = maps::scratch() else {
            return;
        };
        scratch.kernel_addr = scratch.found.nat_addr_be;
        let port_be = scratch.found.nat_port_be;
        match ensure(ctx, packet, port_be, false) {
            Kernel::Found => maps::count(stat::KNAT),
            Kernel::Made => {
                maps::count(stat::KNAT_REMADE);
                answers_through_netfilter(packet);
            }
            Kernel::Failed => maps::count(stat::KNAT_FAILED),
        }
    }
    if let Some(scratch) = maps::scratch() {
        scratch.owner_id = owner_id;
        let mapping = scratch.found.mapping;
        counters::record(ctx, &mapping, owner_id, Way::In);
    }
}

/// After the kernel's entry of a flow was made again (a later packet
/// found it gone), sends the flow's answers through netfilter for one
/// interval of the confirmed-flow question (see `confirm::forget_verdict`):
/// the made entry saw nothing of the flow, and a flow on the fast path
/// would otherwise go on skipping it in one direction only. The answer's
/// key from the DNAT entry in scratch (`found`). Not inlined: once per
/// entry made again.
#[inline(never)]
fn answers_through_netfilter(packet: &Packet) {
    let Some(scratch) = maps::scratch() else {
        return;
    };
    let answer = CtKey {
        src_addr_be: scratch.found.nat_addr_be,
        dst_addr_be: packet.src_be,
        src_port_be: scratch.found.nat_port_be,
        dst_port_be: packet.sport_be,
        proto: packet.proto,
        family: packet.family,
        _pad0: 0,
    };
    confirm::forget_verdict(&answer, confirm::verdict_now());
}

/// Whether a packet of a flow netfilter translates, from outside (see
/// [`follow_noted`]), takes the fast path: once the flow is confirmed as
/// any other's (`confirm::confirmed`: past the TCP handshake, or a UDP
/// answer seen, both through netfilter, and the kernel's entry still
/// there, its timeout set anew). Then [`translate_handed`] translates it
/// here, as netfilter would, and offers it as [`Offer::Handed`], which
/// `fast::fast_path` hands to the container's veth without asking again.
/// Only where that veth is the owner's (`fast::fast_forward` checks the
/// same): a packet translated here and then left to the normal path would
/// reach netfilter as a flow to the pod, not the DNAT its entry holds.
/// Once handed over, a TCP flow stays on the fast path while the kernel
/// keeps its entry (see `confirm`); its answers are handed over at the
/// container's side and translated back by egress. The packet's key is
/// built in scratch (`forward_key`, where the hand-over reads its family
/// too): on this frame it took 6.1 past BPF's 512-byte stack. Not
/// inlined: off every other path.
#[inline(never)]
fn hand_over_confirmed(ctx: &TcContext, packet: &Packet, owner_id: u64, always: bool) -> bool {
    let Some(scratch) = maps::scratch() else {
        return false;
    };
    if maps::peer(packet.family, &scratch.found.nat_addr_be)
        .is_none_or(|peer| peer.owner_id != owner_id)
    {
        return false;
    }
    scratch.forward_key = ct::key_of(packet);
    // Netfilter sees this direction's packets as they arrive (its
    // entry's original tuple).
    confirm::note(
        &scratch.forward_key,
        &scratch.found,
        (&packet.dst_be, packet.dport_be),
        packet.flags,
    );
    if always {
        // `fastPath: true`: every flow from its first packet (see
        // [`hand_over_first`]); the question only keeps the kernel's entry
        // alive, and has it made again when it is gone.
        if confirm::due() && !confirm::ask(ctx) {
            scratch.knat_lost = true;
        }
    } else if !confirm::confirmed(ctx) {
        return false;
    }
    scratch.owner_id = owner_id;
    true
}

/// Whether [`hand_over_confirmed`] found the flow's kernel entry gone (and
/// forgets it).
#[inline(always)]
fn take_lost() -> bool {
    maps::scratch().is_some_and(|scratch| core::mem::replace(&mut scratch.knat_lost, false))
}

/// With `fastPath: true`, the first packet of a flow [`hand_over_new`] made
/// the kernel's entry for: translated here and handed to the container's
/// veth (`Offer::Handed`), past netfilter, as every flow of that mode, so
/// that the entry is there for the operator (`conntrack -L` shows the
/// host port) and for the flow's answers should our entries be lost
/// (netfilter then translates them by it). Only where the veth is the
/// owner's (see [`hand_over_confirmed`]); elsewhere (a container without a
/// veth) netfilter translates the flow. The caller asked for the mode
/// ([`HandOver::Always`]). Not inlined: off every other path.
#[inline(never)]
pub fn hand_over_first(ctx: &mut TcContext, packet: &Packet) {
    let Some(scratch) = maps::scratch() else {
        return;
    };
    // Where translate_handed reads the container.
    scratch.found.nat_addr_be = scratch.forward.nat_addr_be;
    scratch.found.nat_port_be = scratch.forward.nat_port_be;
    let owner_id = scratch.owner_id;
    if maps::peer(packet.family, &scratch.found.nat_addr_be)
        .is_some_and(|peer| peer.owner_id == owner_id)
    {
        let _ = translate_handed(ctx, packet);
    }
}

/// Translates a packet [`hand_over_confirmed`] took to the container of
/// its DNAT entry (`found` in scratch) and offers it as [`Offer::Handed`].
/// TCP or UDP only (the kernel translates no other): said to the verifier
/// by the test here, which then does not walk the SCTP checksum code of
/// the rewrite. Not inlined: one walk.
#[inline(never)]
fn translate_handed(ctx: &mut TcContext, packet: &Packet) -> bool {
    let Some(scratch) = maps::scratch() else {
        return false;
    };
    if !(packet.proto == PROTO_TCP || packet.proto == PROTO_UDP)
        || !nat::rewrite(
            ctx,
            packet,
            Side::Destination,
            &scratch.found.nat_addr_be,
            scratch.found.nat_port_be,
        )
    {
        return false;
    }
    let Some(scratch) = maps::scratch() else {
        return false;
    };
    scratch.forward.nat_addr_be = scratch.found.nat_addr_be;
    scratch.forward.flags = ct_flags::DIRECT;
    scratch.fast = Offer::Handed;
    true
}

/// Makes sure the kernel has an entry for `packet`'s tuple, as it
/// arrived, with its DNAT to `scratch.kernel_addr` and `port_be`; `fresh`:
/// an entry found is expired first and made anew. Not inlined: one walk.
#[inline(never)]
fn ensure(ctx: &TcContext, packet: &Packet, port_be: u16, fresh: bool) -> Kernel {
    let Some(scratch) = maps::scratch() else {
        return Kernel::Failed;
    };
    let size = ct::fill_sock_tuple(
        &mut scratch.kernel_tuple,
        packet.family,
        (&packet.src_be, packet.sport_be),
        (&packet.dst_be, packet.dport_be),
    );
    let skb = ctx.skb.skb.cast::<core::ffi::c_void>();
    let tuple = scratch.kernel_tuple.as_mut_ptr();
    reset_opts(&mut scratch.kernel_opts, packet.proto);
    // SAFETY: the context is the program's skb; the tuple is `size`
    // readable bytes and the options CT_OPTS_LEN writable ones, in a map
    // value; what the lookup finds is released in `expire_or_keep`.
    let found = unsafe { kfunc::skb_ct_lookup(skb, tuple, size, &raw mut scratch.kernel_opts) };
    let was = expire_or_keep(found, fresh);
    if was == Was::Kept {
        return Kernel::Found;
    }
    if was == Was::Expired {
        // A lookup reaps an expired entry (`nf_ct_gc_expired`): the insert
        // below would otherwise meet it. (Nothing to reap where nothing
        // was found: a new flow's SYN, most of them.)
        reset_opts(&mut scratch.kernel_opts, packet.proto);
        // SAFETY: as above.
        let stale = unsafe { kfunc::skb_ct_lookup(skb, tuple, size, &raw mut scratch.kernel_opts) };
        // Released at once (expired: nothing keeps it).
        let _ = expire_or_keep(stale, true);
    }
    reset_opts(&mut scratch.kernel_opts, packet.proto);
    // SAFETY: as above; the allocation is consumed by `insert_with_nat`.
    let new = unsafe { kfunc::skb_ct_alloc(skb, tuple, size, &raw mut scratch.kernel_opts) };
    insert_with_nat(new, scratch.kernel_addr.as_mut_ptr(), u16::from_be(port_be))
}

/// Whether `packet`, leaving the node from a mapped host port with no
/// flow of ours, answers a flow that came in: the kernel's conntrack
/// holds the reversed tuple (client to host address and port) as an
/// entry's original direction. Such a packet is netfilter's translated
/// answer of a flow whose entries of ours were evicted (a flood in
/// `conntrack_new`), never a flow the node opened, and gets no pass
/// entry: thousands of them took room among the assured flows. The
/// node's own flows, and a container's masqueraded by netfilter, hold
/// that tuple as the reply direction; no entry (nothing tracked) says
/// nothing. Not inlined: one walk of the lookup and its reference.
#[inline(never)]
pub fn answers_inbound(ctx: &TcContext, packet: &Packet) -> bool {
    let Some(scratch) = maps::scratch() else {
        return false;
    };
    let size = ct::fill_sock_tuple(
        &mut scratch.kernel_tuple,
        packet.family,
        (&packet.dst_be, packet.dport_be),
        (&packet.src_be, packet.sport_be),
    );
    reset_opts(&mut scratch.kernel_opts, packet.proto);
    // SAFETY: the context is the program's skb; the tuple is `size`
    // readable bytes and the options CT_OPTS_LEN writable ones, in a map
    // value; what the lookup finds is released in `expire_or_keep`.
    let found = unsafe {
        kfunc::skb_ct_lookup(
            ctx.skb.skb.cast(),
            scratch.kernel_tuple.as_mut_ptr(),
            size,
            &raw mut scratch.kernel_opts,
        )
    };
    expire_or_keep(found, false) == Was::Kept && scratch.kernel_opts.dir == IP_CT_DIR_ORIGINAL
}

/// `enum ip_conntrack_dir`'s `IP_CT_DIR_ORIGINAL`: what the lookup
/// writes to `bpf_ct_opts.dir` for a tuple found as an entry's original.
const IP_CT_DIR_ORIGINAL: u8 = 0;

/// `struct bpf_ct_opts` for a lookup or allocation in the namespace of
/// the skb's device (the node's): the kfuncs write `error` back.
#[inline(always)]
fn reset_opts(opts: &mut CtOpts, proto: u8) {
    *opts = CtOpts {
        netns_id: BPF_F_CURRENT_NETNS,
        error: 0,
        l4proto: proto,
        dir: 0,
        reserved: [0; 2],
    };
}

/// What [`expire_or_keep`] did with a lookup's answer.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Was {
    /// Nothing was found.
    Missing,
    /// Found and kept.
    Kept,
    /// Found and expired.
    Expired,
}

/// The lookup's answer (`conn`, or null): released; `expire` first gives
/// it a timeout of 0 (it is gone at the next lookup). Its own function,
/// so that the pointer is tested once (see `confirm::refresh_and_release`).
#[inline(never)]
fn expire_or_keep(conn: *mut core::ffi::c_void, expire: bool) -> Was {
    if conn.is_null() {
        return Was::Missing;
    }
    // SAFETY: the lookup's reference, released once and not used after.
    unsafe {
        if expire {
            kfunc::ct_change_timeout(conn, 0);
        }
        kfunc::ct_release(conn);
    }
    if expire { Was::Expired } else { Was::Kept }
}

/// Sets the DNAT of the allocation `new` (null: nothing allocated) and
/// inserts it. An insert that finds the tuple taken (another CPU's packet
/// of the flow a moment before) leaves the kernel with the flow's entry
/// too: found. Its own function: one null test for the allocation, one
/// for the insert's reference.
#[inline(never)]
fn insert_with_nat(new: *mut core::ffi::c_void, addr: *mut u32, port: u16) -> Kernel {
    if new.is_null() {
        return Kernel::Failed;
    }
    // SAFETY: an allocation, consumed by the insert whatever its outcome;
    // `addr` is 16 bytes of a map value.
    unsafe {
        kfunc::ct_set_nat_info(new, addr, port, NF_NAT_MANIP_DST);
        release_inserted(kfunc::ct_insert_entry(new))
    }
}

/// Releases the insert's reference (null: an entry of the tuple was there
/// already).
#[inline(never)]
fn release_inserted(inserted: *mut core::ffi::c_void) -> Kernel {
    if inserted.is_null() {
        return Kernel::Found;
    }
    // SAFETY: the insert's reference, released once.
    unsafe { kfunc::ct_release(inserted) };
    Kernel::Made
}
