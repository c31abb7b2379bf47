//! The confirmed-flow fast path (`fastPath` unset, the default): a
//! translated flow's packets are handed over only once the kernel's
//! conntrack holds the flow as confirmed, i.e. its first packet passed
//! every netfilter hook (PREROUTING, FORWARD, POSTROUTING), so the node's
//! firewall decided the flow as it does any other. nftables' flowtables
//! work the same way.
//!
//! The kernel is asked once per flow and direction (`bpf_skb_ct_lookup`),
//! and the answer kept in that direction's own conntrack entry
//! ([`ct_flags::CONFIRMED`], [`CtEntry::verdict_at`](portmap_common::CtEntry)),
//! then asked again every [`ct_timeout::VERDICT_UNITS`] while the flow
//! lives. Each time it is found, its kernel entry's timeout is set anew
//! (`bpf_ct_change_timeout`): netfilter sees none of the flow's packets
//! on the fast path, and without it the entry would expire under a live
//! flow (30-120 s for UDP) and its next packet through netfilter would be
//! a new flow, or an invalid one. A flow whose kernel entry is gone (deleted
//! after a firewall change, expired, flushed) is back on the normal path
//! at its next question, where the firewall decides it again.
//!
//! TCP: the handshake takes the normal path, all three packets, so the
//! kernel's entry is ESTABLISHED before the hand-over. From then on the
//! flow stays on the fast path to its end, FIN and RST included: netfilter
//! tracks TCP windows, and a segment after a stretch it did not see (a
//! FIN acknowledging data it never saw) is INVALID to it, which a
//! `ct state invalid drop` rule drops. At a FIN or RST the kernel's entry
//! is given our closed-flow linger instead ([`ct_timeout::TCP_CLOSED`]).
//!
//! A flow netfilter translates (`knat`) is confirmed by more: its kernel
//! entry is ours, made before its first packet met the firewall, so the
//! container's answer through netfilter is what tells (see [`confirmed`]).
//!
//! The kfuncs are called through raw call instructions that userspace
//! links before loading (see [`portmap_common::kfunc`]); on a kernel
//! without them each call is `r0 = 0`: no flow is ever found confirmed.

use aya_ebpf::{bindings::BPF_F_CURRENT_NETNS, programs::TcContext};
use portmap_common::{CtKey, PROTO_TCP, PROTO_UDP, ct_flags, ct_kind, ct_timeout, stat, tcp_state};

use crate::{
    ct, kfunc,
    maps::{self, CtOpts},
    parse::{TCP_FIN, TCP_RST},
};

/// Notes the entry a flow decision found for this packet (`key`, as it
/// was before the packet), for [`confirmed`]; `kernel_dst` is where
/// netfilter sees the flow go (see [`maps::ConfirmPending::kernel_dst_be`]).
#[inline(always)]
pub fn note(
    key: &CtKey,
    entry: &portmap_common::CtEntry,
    kernel_dst: (&[u32; 4], u16),
    tcp_flags: u8,
) {
    if let Some(scratch) = maps::scratch() {
        let pending = &mut scratch.confirm;
        pending.key = *key;
        pending.kernel_dst_be = *kernel_dst.0;
        pending.kernel_dport_be = kernel_dst.1;
        pending.tcp_state = entry.tcp_state;
        pending.closing = key.proto == PROTO_TCP && tcp_flags & (TCP_FIN | TCP_RST) != 0;
        pending.flags = entry.flags;
        pending.verdict_at = entry.verdict_at;
        pending.kind = entry.kind;
        pending.armed = true;
    }
}

/// Whether the packet whose entry [`note`] left in scratch may take the
/// fast path in the confirmed-flow mode: its flow past the TCP handshake
/// and held as confirmed by the kernel, as recently asked, or as asked
/// now when the last answer is due ([`ask_kernel`]). The caller checked
/// and cleared `armed` (a packet of a new flow leaves none: its first
/// packet takes the normal path).
#[inline(always)]
pub fn confirmed(ctx: &TcContext) -> bool {
    let Some(scratch) = maps::scratch() else {
        return false;
    };
    let pending = &scratch.confirm;
    // SCTP: the kfunc answers for TCP and UDP only.
    if pending.key.proto != PROTO_TCP && pending.key.proto != PROTO_UDP {
        return false;
    }
    // The whole handshake through netfilter (see the module docs).
    if pending.tcp_state & tcp_state::SYN_ONLY != 0 {
        return false;
    }
    // A flow netfilter translates: its kernel entry is ours, made before
    // its first packet met the firewall, so the kernel holding it says
    // nothing of the firewall's verdict. The container's answer does: it
    // answered a packet the firewall let through (TCP: the handshake, as
    // above; UDP: an answer before this packet, which also went through
    // netfilter, so the kernel counts the flow's answers as replies).
    if pending.kind & ct_kind::NETFILTER != 0
        && pending.key.proto == PROTO_UDP
        && pending.flags & ct_flags::REPLIED == 0
    {
        return false;
    }
    let now = verdict_now();
    let fresh = fresh_at(pending.verdict_at, now);
    let held = pending.flags & ct_flags::CONFIRMED != 0;
    // A FIN or RST of a flow on the fast path asks again, to shorten the
    // kernel entry's life to the close's.
    if fresh && !(held && pending.closing) {
        return held;
    }
    ask_kernel(ctx, now)
}

/// With `fastPath: true`, where every flow is handed over whatever the
/// kernel holds: whether the flow [`note`] left in scratch has a question
/// due (never asked, the last answer older than
/// [`ct_timeout::VERDICT_UNITS`], or a TCP FIN or RST, which shortens the
/// kernel entry's life). The question then only keeps the kernel's entry
/// alive under the flow ([`ask`]).
#[inline(always)]
pub fn due() -> bool {
    maps::scratch().is_some_and(|scratch| {
        let pending = &scratch.confirm;
        pending.closing || !fresh_at(pending.verdict_at, verdict_now())
    })
}

/// Whether a verdict asked at `verdict_at` (0: never) still holds at `now`.
#[inline(always)]
fn fresh_at(verdict_at: u32, now: u32) -> bool {
    verdict_at != 0 && now.wrapping_sub(verdict_at) < ct_timeout::VERDICT_UNITS
}

/// Asks the kernel about the flow [`note`] left in scratch now (see
/// [`ask_kernel`]): whether its entry is there.
#[inline(always)]
pub fn ask(ctx: &TcContext) -> bool {
    ask_kernel(ctx, verdict_now())
}

/// Asks the kernel's conntrack about the flow [`note`] left in scratch,
/// gives its kernel entry a new timeout if it is there, and keeps the
/// answer (and `now`) in our entry. Not inlined, one call site: the lookup
/// and its reference are walked once by the verifier, and cost a packet
/// only at a flow's first question and then once per interval.
#[inline(never)]
fn ask_kernel(ctx: &TcContext, now: u32) -> bool {
    let Some(scratch) = maps::scratch() else {
        return false;
    };
    let pending = &scratch.confirm;
    let (family, proto) = (pending.key.family, pending.key.proto);
    // The tuple as netfilter sees it.
    let tuple = &mut scratch.kernel_tuple;
    let size = ct::fill_sock_tuple(
        tuple,
        family,
        (&pending.key.src_addr_be, pending.key.src_port_be),
        (&pending.kernel_dst_be, pending.kernel_dport_be),
    );
    scratch.kernel_opts = CtOpts {
        // The namespace of the skb's device: the node's.
        netns_id: BPF_F_CURRENT_NETNS,
        error: 0,
        l4proto: proto,
        dir: 0,
        reserved: [0; 2],
    };
    let timeout_ms = ct_timeout::kernel_refresh_ms(proto, pending.tcp_state, pending.closing);
    // SAFETY: the context is the program's skb; the tuple is `size`
    // readable bytes and the options CT_OPTS_LEN writable ones, both in a
    // map value; a connection found is released below, once.
    let conn = unsafe {
        kfunc::skb_ct_lookup(
            ctx.skb.skb.cast(),
            tuple.as_mut_ptr(),
            size,
            &raw mut scratch.kernel_opts,
        )
    };
    let found = refresh_and_release(conn, timeout_ms);
    maps::count(if found {
        stat::CT_CONFIRMED
    } else {
        stat::CT_UNCONFIRMED
    });
    let go = found || answer_of_lost_entry();
    keep_verdict(go, now);
    go
}

/// Whether the container's answer whose question found no kernel entry
/// (in scratch) answers a flow netfilter translates, whose entry was
/// lost (`conntrack -D`, a flush) while the flow was on the fast path:
/// then it is handed over still (egress translates it back), and the
/// flow's other direction asks at its next packet. On the normal path the
/// answer would make the kernel an entry of its own, the pod to the
/// client without any DNAT, which the client's next packet could never
/// match (its entry, made again by `knat`, would clash with that one),
/// and the answer would leave from the pod's address. The client's side
/// makes the entry again, in the direction the kernel needs (netfilter
/// takes a mid-flow segment in the reply direction of an entry that saw
/// nothing as INVALID), and then sends the answers through netfilter for
/// a while (see `forget_verdict`). Not inlined: off every other path.
#[inline(never)]
fn answer_of_lost_entry() -> bool {
    let Some(scratch) = maps::scratch() else {
        return false;
    };
    let pending = &scratch.confirm;
    if pending.kind != ct_kind::NETFILTER_REPLY {
        return false;
    }
    let Some((entry, _)) = maps::ct_get_any(&pending.key) else {
        return false;
    };
    // SAFETY: fields of a live map value, read once.
    let (host_be, host_port_be) = unsafe { ((*entry).nat_addr_be, (*entry).nat_port_be) };
    // The flow's tuple from the client (its DNAT entry's key).
    let original = CtKey {
        src_addr_be: pending.key.dst_addr_be,
        dst_addr_be: host_be,
        src_port_be: pending.key.dst_port_be,
        dst_port_be: host_port_be,
        ..pending.key
    };
    forget_verdict(&original, 0);
    true
}

/// Takes the verdict of the entry of `key` (in any table) back: not held,
/// asked at `at` ([`ct_timeout::VERDICT_UNIT_SHIFT`] units; 0: never, so
/// its next packet asks). `knat` calls it for a flow's answers when it
/// made the flow's kernel entry again: they take the normal path for one
/// interval, so that netfilter sees the flow both ways before it is
/// handed over again (it tracks TCP windows, and a client's
/// acknowledgement of answers it never saw is INVALID to it).
#[inline(never)]
pub fn forget_verdict(key: &CtKey, at: u32) {
    if let Some((entry, _)) = maps::ct_get_any(key) {
        // SAFETY: a live map value; two aligned 4-byte stores (see
        // `keep_verdict`).
        unsafe {
            (*entry).flags &= !ct_flags::CONFIRMED;
            (*entry).verdict_at = at;
        }
    }
}

/// Now, in the units of [`CtEntry::verdict_at`](portmap_common::CtEntry).
#[inline(always)]
pub fn verdict_now() -> u32 {
    (ct::now() >> ct_timeout::VERDICT_UNIT_SHIFT) as u32
}

/// Gives the connection the lookup found (`conn`, or null) a new timeout
/// and releases it; whether it was found. Its own function, so that the
/// pointer is tested against null once, with the release on one side:
/// inlined, the compiler tested it twice (once for the answer, once for the
/// release), and Debian 6.1's verifier, which does not take a non-null
/// `PTR_TO_BTF_ID` for one at the second test, walked the impossible side
/// and refused the program ("Unreleased reference").
#[inline(never)]
fn refresh_and_release(conn: *mut core::ffi::c_void, timeout_ms: u32) -> bool {
    if conn.is_null() {
        return false;
    }
    // SAFETY: the reference the lookup returned, released once and not
    // used after (the verifier checks it).
    unsafe {
        kfunc::ct_change_timeout(conn, timeout_ms);
        kfunc::ct_release(conn);
    }
    true
}

/// Writes the kernel's answer into the entry [`note`] named, in whichever
/// table it is (assured, not yet assured, closed).
#[inline(always)]
fn keep_verdict(found: bool, now: u32) {
    let Some(scratch) = maps::scratch() else {
        return;
    };
    let Some((entry, _)) = maps::ct_get_any(&scratch.confirm.key) else {
        return;
    };
    // SAFETY: a live map value; two aligned 4-byte stores. Only the flow's
    // creation writes `flags` otherwise, before any question.
    unsafe {
        let flags = (*entry).flags;
        (*entry).flags = if found {
            flags | ct_flags::CONFIRMED
        } else {
            flags & !ct_flags::CONFIRMED
        };
        (*entry).verdict_at = now;
    }
}
