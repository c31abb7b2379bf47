//! Why the dataplane did what it did: every reason the programs count, in
//! one table.
//!
//! A reason is a per-CPU counter in the `stats` map (its index is the ID)
//! and a bit in [`TraceEvent::decisions`](crate::TraceEvent::decisions).
//! `status` shows the counters by [`Reason::name`], `trace` shows
//! [`Reason::label`] and [`Reason::meaning`], and both colour by
//! [`Reason::kind`].
//!
//! Adding a reason: a constant in [`stat`] with the next ID, [`stat::COUNT`]
//! one up, and its entry at the end of [`REASONS`]; then count it in the
//! eBPF code (`maps::count(stat::...)`). The table's type and the checks
//! below (at compile time and in the tests) refuse a table that misses a
//! reason, lists one out of order or repeats a name or label.

/// The reason IDs: the index of a counter in the `stats` map and of a bit
/// in [`crate::TraceEvent::decisions`]. What each means is its entry in
/// [`REASONS`](super::REASONS).
pub mod stat {
    pub const DNAT_NEW: u32 = 0;
    pub const DNAT: u32 = 1;
    pub const REPLY: u32 = 2;
    pub const SKIP_NOT_LOCAL: u32 = 3;
    pub const SKIP_NOT_SYN: u32 = 4;
    pub const SKIP_FRAGMENT: u32 = 5;
    pub const SKIP_LOCAL_ORIGIN: u32 = 6;
    pub const STALE_FLOW: u32 = 7;
    pub const PASS_RECORDED: u32 = 8;
    pub const REWRITE_FAILED: u32 = 9;
    pub const CT_INSERT_FAILED: u32 = 10;
    pub const FWD_DISABLED: u32 = 11;
    /// A socket hook pointed connect()/sendmsg() at a container.
    pub const SOCK_TRANSLATED: u32 = 12;
    /// A socket of another network namespace than the node's (a container
    /// not registered with `containerSockets`, another node sharing the
    /// cgroup) dialling a mapped port, or a registered container's socket
    /// dialling a mapping with conditions: left alone, it reaches the host
    /// port by the packet path as any client does.
    pub const SOCK_OTHER_NETNS: u32 = 13;
    /// A wildcard mapping's port on an address that is not the node's, or a
    /// registered container dialling its own loopback.
    pub const SOCK_NOT_LOCAL: u32 = 14;
    /// No socket storage for the translation: left alone.
    pub const SOCK_NO_STORAGE: u32 = 15;
    /// A new flow was masqueraded (hairpin, masqAll).
    pub const MASQ: u32 = 16;
    /// No free masquerade source port: translated without masquerade.
    pub const MASQ_NO_PORT: u32 = 17;
    /// The interface towards the container has no address to masquerade to.
    pub const MASQ_NO_ADDR: u32 = 18;
    /// Answer of a masqueraded flow sent back to its client.
    pub const UNMASQ: u32 = 19;
    /// A translated packet handed straight to the container (`fastPath`).
    pub const FAST_FORWARD: u32 = 20;
    /// An answer handed straight to the interface towards its client
    /// (`fastPath`), where egress translates it back.
    pub const FAST_REPLY: u32 = 21;
    /// A TCP flow closed (FIN both ways, or RST): its entries moved to the
    /// closed-flow table, out of the way of live flows.
    pub const CT_CLOSED: u32 = 22;
    /// A mid-flow TCP packet to a mapped port whose flow entry was lost
    /// (evicted), and whose tuple no node socket owns: translated again by
    /// the mapping, and its flow recorded anew.
    pub const CT_RECOVERED: u32 = 23;
    /// A mid-flow TCP packet to a mapped port with no flow entry whose
    /// tuple a node socket owns: the node's, left alone.
    pub const SKIP_NODE_SOCKET: u32 = 24;
    /// A packet for a host port that arrived from a link with a loopback
    /// destination or source (127.0.0.0/8, ::1, ::ffff:127.0.0.0/104):
    /// never a node's own traffic, so dropped rather than translated.
    pub const DROP_LOOPBACK: u32 = 25;
    /// A hairpin flow's own client port passed over as its masquerade
    /// port: a node connection holds that tuple with the container.
    pub const MASQ_PORT_NODE_HELD: u32 = 26;
    /// A connection the node opened to a container on a tuple a
    /// masqueraded flow holds: its source port remapped, as netfilter
    /// does, so the container's answers reach the node.
    pub const NODE_FLOW_REMAPPED: u32 = 27;
    /// A connection the node opened to a container on the tuple of a
    /// closed masqueraded flow: that flow's lingering entries removed, so
    /// the container's answers reach the node.
    pub const MASQ_TUPLE_RELEASED: u32 = 28;
    /// A packet (or a node socket) that would open a flow by a mapping
    /// whose configuration has `conditionsV4`/`conditionsV6` it does not
    /// meet: left untranslated, as if no mapping existed.
    pub const SKIP_CONDITIONS: u32 = 29;
    /// The confirmed-flow fast path asked the kernel's conntrack about a
    /// flow (its first eligible packet, or a refresh) and found it
    /// confirmed: the flow's packets in this direction are handed over.
    pub const CT_CONFIRMED: u32 = 30;
    /// The same question, and the kernel's conntrack holds no confirmed
    /// entry for the flow (the firewall dropped its first packet, the entry
    /// was deleted or expired, or nothing on the node uses conntrack): the
    /// flow stays on the normal path until it is asked about again.
    pub const CT_UNCONFIRMED: u32 = 31;
    /// A flow became assured (a TCP handshake completed, a recovered TCP
    /// flow's container answered, a UDP or SCTP flow answered and still
    /// talking 2 s after its first packet): its entries moved from
    /// `conntrack_new`, where new flows evict each other, to the table of
    /// assured flows. New flows less assured ones are the flows that were
    /// never assured: a flood's, scans, one-shot datagrams.
    pub const CT_ASSURED: u32 = 32;
    /// A packet for a mapped port that the node would deliver locally, to
    /// none of the addresses a hostPort answers on (`local_addrs`): a
    /// broadcast or multicast destination, one without a route, or an
    /// address of a Service VIP device. Left to the node.
    pub const SKIP_NOT_NODE_ADDRESS: u32 = 33;
    /// An ICMP or ICMPv6 error about a client's packet to a container (the
    /// container's "port unreachable", the node's reject, "fragmentation
    /// needed" on the container's side), on its way to the client: the
    /// quoted destination, and a container's own source, restored to the
    /// host address and port, as netfilter's NAT restores them.
    pub const ICMP_REPLY: u32 = 34;
    /// An ICMP or ICMPv6 error about a container's answer (a router's
    /// "fragmentation needed" or "packet too big" on the way to the
    /// client, the client's "port unreachable"), which reached the host
    /// address: sent on to the container, its quote translated as the
    /// flow's packets are.
    pub const ICMP_DNAT: u32 = 35;
    /// A new TCP or UDP flow from outside handed to the node's netfilter
    /// (the default where the kernel can, see `knat`): the kernel's
    /// conntrack entry made for the packet as it arrived (client to host
    /// address and port), with its DNAT to the container, and the packet
    /// left as it is for netfilter's NAT to translate.
    pub const KNAT_NEW: u32 = 36;
    /// A later packet of a flow netfilter translates: left as it is (the
    /// kernel's entry holds its DNAT).
    pub const KNAT: u32 = 37;
    /// A packet of a flow netfilter translates whose kernel entry was gone
    /// (`conntrack -D`, a flush, an expiry, or our entries rebuilt after
    /// theirs were lost): the kernel's entry made again with its DNAT, as
    /// upstream's DNAT rule makes it again for the flow's next packet.
    pub const KNAT_REMADE: u32 = 38;
    /// The kernel's conntrack entry of a flow could not be made (its table
    /// full, or memory short): the packet left to netfilter as it is,
    /// which delivers it to the node, as under upstream's DNAT when the
    /// kernel's table is full.
    pub const KNAT_FAILED: u32 = 39;
    /// Entries written to `conntrack_new` (two per new flow): the ledger
    /// that, with [`CT_NEW_OUT`], the entries userspace swept and the
    /// entries present, tells how many the table evicted (see
    /// `portmap_common::ct_ledger`).
    pub const CT_NEW_IN: u32 = 40;
    /// Entries the programs moved or removed from `conntrack_new` (the
    /// flow assured, closed, or half-recorded).
    pub const CT_NEW_OUT: u32 = 41;
    /// Entries written to the assured tables (`conntrack`,
    /// `conntrack_other`): an assured flow's, or a node flow's pass entry.
    pub const CT_LIVE_IN: u32 = 42;
    /// Entries the programs moved or removed from the assured tables (the
    /// flow closed), or wrote over (a new flow on an idled-out tuple).
    pub const CT_LIVE_OUT: u32 = 43;
    pub const COUNT: u32 = 44;
    /// The bits of the conntrack ledger's counters ([`CT_NEW_IN`] to
    /// [`CT_LIVE_OUT`]): bookkeeping, not a decision about a packet, so
    /// left out of trace events (their sum is what `status` and `trace`
    /// report as evictions).
    pub const LEDGER_BITS: u64 =
        (1 << CT_NEW_IN) | (1 << CT_NEW_OUT) | (1 << CT_LIVE_IN) | (1 << CT_LIVE_OUT);

    /// Every reason's counter name, in ID order (from [`REASONS`](super::REASONS)).
    pub const NAMES: [&str; COUNT as usize] = {
        let mut names = [""; COUNT as usize];
        let mut id = 0;
        while id < names.len() {
            names[id] = super::TABLE[id].name;
            id += 1;
        }
        names
    };
}

/// What a reason says about the packet, for colours and for a reader
/// deciding whether to worry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Translated or handed on as its mapping asks.
    Translated,
    /// State recorded for the packets that follow; this one passes as it is.
    Recorded,
    /// Left alone on purpose: not traffic the mappings are for.
    Skipped,
    /// Not handled as its flow or mapping asks: something is missing, stale
    /// or full. Worth a look.
    Problem,
}

/// One reason: its ID and how people see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reason {
    /// Index of its counter and of its bit in a trace event ([`stat`]).
    pub id: u32,
    /// Counter name (`status`, and the keys of its JSON `counters`):
    /// snake_case, stable.
    pub name: &'static str,
    /// Tag in `trace` lines and JSON `decisions`: kebab-case, stable.
    pub label: &'static str,
    /// What it means, for people.
    pub meaning: &'static str,
    pub kind: Kind,
}

/// Every reason, in ID order.
pub static REASONS: [Reason; stat::COUNT as usize] = TABLE;

/// [`REASONS`] as a constant, for the compile-time checks.
const TABLE: [Reason; stat::COUNT as usize] = [
    Reason {
        id: stat::DNAT_NEW,
        name: "dnat_new",
        label: "translated-new",
        meaning: "new flow translated to the container",
        kind: Kind::Translated,
    },
    Reason {
        id: stat::DNAT,
        name: "dnat",
        label: "translated",
        meaning: "translated to the container",
        kind: Kind::Translated,
    },
    Reason {
        id: stat::REPLY,
        name: "reply",
        label: "reply",
        meaning: "reply translated back to the host port",
        kind: Kind::Translated,
    },
    Reason {
        id: stat::SKIP_NOT_LOCAL,
        name: "skip_not_local",
        label: "skipped-not-local",
        meaning: "mapped port, but the destination is not an address of this node (transit traffic)",
        kind: Kind::Skipped,
    },
    Reason {
        id: stat::SKIP_NOT_SYN,
        name: "skip_not_syn",
        label: "skipped-not-syn",
        meaning: "mapped port, but not a flow start and no known flow, and not recoverable (e.g. a SYN-ACK, a RST)",
        kind: Kind::Skipped,
    },
    Reason {
        id: stat::SKIP_FRAGMENT,
        name: "skip_fragment",
        label: "skipped-fragment",
        meaning: "IP fragment, not translated",
        kind: Kind::Skipped,
    },
    Reason {
        id: stat::SKIP_LOCAL_ORIGIN,
        name: "skip_local_origin",
        label: "skipped-local-origin",
        meaning: "reply to a flow the node itself opened from this port",
        kind: Kind::Skipped,
    },
    Reason {
        id: stat::STALE_FLOW,
        name: "stale_flow",
        label: "no-backend",
        meaning: "the flow's mapping was deleted or now points elsewhere",
        kind: Kind::Problem,
    },
    Reason {
        id: stat::PASS_RECORDED,
        name: "pass_recorded",
        label: "local-origin",
        meaning: "the node opened a flow from a mapped port; its replies will pass",
        kind: Kind::Recorded,
    },
    Reason {
        id: stat::REWRITE_FAILED,
        name: "rewrite_failed",
        label: "rewrite-failed",
        meaning: "the packet could not be rewritten",
        kind: Kind::Problem,
    },
    Reason {
        id: stat::CT_INSERT_FAILED,
        name: "ct_insert_failed",
        label: "conntrack-full",
        meaning: "the flow could not be recorded (conntrack map full?)",
        kind: Kind::Problem,
    },
    Reason {
        id: stat::FWD_DISABLED,
        name: "fwd_disabled",
        label: "forwarding-disabled",
        meaning: "mapped port, but IP forwarding is off on the node",
        kind: Kind::Skipped,
    },
    Reason {
        id: stat::SOCK_TRANSLATED,
        name: "sock_translated",
        label: "socket-translated",
        meaning: "a connect()/sendmsg() on the node was pointed at the container",
        kind: Kind::Translated,
    },
    Reason {
        id: stat::SOCK_OTHER_NETNS,
        name: "sock_other_netns",
        label: "socket-other-netns",
        meaning: "socket of another network namespace (a container without containerSockets, another node) dialling a mapped port, or a container's to a mapping with conditions: left alone, served by the packet path",
        kind: Kind::Skipped,
    },
    Reason {
        id: stat::SOCK_NOT_LOCAL,
        name: "sock_not_local",
        label: "socket-not-local",
        meaning: "a wildcard mapping's port on an address that is not the node's, or a container's own loopback: left alone",
        kind: Kind::Skipped,
    },
    Reason {
        id: stat::SOCK_NO_STORAGE,
        name: "sock_no_storage",
        label: "socket-no-storage",
        meaning: "no socket storage for the translation: left alone",
        kind: Kind::Problem,
    },
    Reason {
        id: stat::MASQ,
        name: "masq",
        label: "masqueraded",
        meaning: "source set to the node, so the answer comes back through it (hairpin, masqAll)",
        kind: Kind::Translated,
    },
    Reason {
        id: stat::MASQ_NO_PORT,
        name: "masq_no_port",
        label: "masq-no-port",
        meaning: "no free masquerade source port: translated without masquerade",
        kind: Kind::Problem,
    },
    Reason {
        id: stat::MASQ_NO_ADDR,
        name: "masq_no_addr",
        label: "masq-no-address",
        meaning: "the interface towards the container has no address to masquerade to",
        kind: Kind::Problem,
    },
    Reason {
        id: stat::UNMASQ,
        name: "unmasq",
        label: "unmasqueraded",
        meaning: "answer of a masqueraded flow sent back to its client",
        kind: Kind::Translated,
    },
    Reason {
        id: stat::FAST_FORWARD,
        name: "fast_forward",
        label: "fast-forward",
        meaning: "fast path: handed straight to the container's interface",
        kind: Kind::Translated,
    },
    Reason {
        id: stat::FAST_REPLY,
        name: "fast_reply",
        label: "fast-reply",
        meaning: "fast path: answer handed straight to the interface towards its client",
        kind: Kind::Translated,
    },
    Reason {
        id: stat::CT_CLOSED,
        name: "ct_closed",
        label: "flow-closed",
        meaning: "TCP flow closed (FIN both ways or RST): moved to the closed-flow table",
        kind: Kind::Recorded,
    },
    Reason {
        id: stat::CT_RECOVERED,
        name: "ct_recovered",
        label: "translated-recovered",
        meaning: "mid-flow packet of a flow whose entry was lost, no node socket owns it: translated by the mapping again",
        kind: Kind::Translated,
    },
    Reason {
        id: stat::SKIP_NODE_SOCKET,
        name: "skip_node_socket",
        label: "skipped-node-socket",
        meaning: "mid-flow packet to a mapped port with no flow entry, owned by a node socket: left to the node",
        kind: Kind::Skipped,
    },
    Reason {
        id: stat::DROP_LOOPBACK,
        name: "drop_loopback",
        label: "dropped-loopback",
        meaning: "loopback destination or source (127.0.0.0/8, ::1) arriving from a link: dropped, never translated",
        kind: Kind::Problem,
    },
    Reason {
        id: stat::MASQ_PORT_NODE_HELD,
        name: "masq_port_node_held",
        label: "masq-port-node-held",
        meaning: "hairpin client's own port not kept as masquerade port: a node connection holds that tuple",
        kind: Kind::Recorded,
    },
    Reason {
        id: stat::NODE_FLOW_REMAPPED,
        name: "node_flow_remapped",
        label: "node-flow-remapped",
        meaning: "node connection to a container on a tuple a masqueraded flow holds: its source port remapped",
        kind: Kind::Translated,
    },
    Reason {
        id: stat::MASQ_TUPLE_RELEASED,
        name: "masq_tuple_released",
        label: "masq-tuple-released",
        meaning: "node connection to a container on a closed masqueraded flow's tuple: the lingering entries removed",
        kind: Kind::Recorded,
    },
    Reason {
        id: stat::SKIP_CONDITIONS,
        name: "skip_conditions",
        label: "skipped-conditions",
        meaning: "new flow that does not meet its mapping's conditionsV4/conditionsV6: left to the node untranslated",
        kind: Kind::Skipped,
    },
    Reason {
        id: stat::CT_CONFIRMED,
        name: "ct_confirmed",
        label: "kernel-confirmed",
        meaning: "the kernel's conntrack holds the flow as confirmed (the firewall let it through): its packets this way take the fast path",
        kind: Kind::Recorded,
    },
    Reason {
        id: stat::CT_UNCONFIRMED,
        name: "ct_unconfirmed",
        label: "kernel-unconfirmed",
        meaning: "the kernel's conntrack holds no confirmed entry for the flow (dropped by the firewall, deleted, expired, or conntrack unused): it stays on the normal path",
        kind: Kind::Skipped,
    },
    Reason {
        id: stat::CT_ASSURED,
        name: "ct_assured",
        label: "flow-assured",
        meaning: "flow assured (handshake done, or answered and alive 2 s): moved out of conntrack_new, where new flows evict each other",
        kind: Kind::Recorded,
    },
    Reason {
        id: stat::SKIP_NOT_NODE_ADDRESS,
        name: "skip_not_node_address",
        label: "skipped-not-node-address",
        meaning: "mapped port, but the destination is none of the addresses a hostPort answers on: broadcast, multicast, without a route, or on a Service VIP device (serviceVipDevices)",
        kind: Kind::Skipped,
    },
    Reason {
        id: stat::ICMP_REPLY,
        name: "icmp_reply",
        label: "icmp-error-to-client",
        meaning: "ICMP error about a client's packet to a container, on its way to the client: the quote (and a container's own source) restored to the host address and port",
        kind: Kind::Translated,
    },
    Reason {
        id: stat::ICMP_DNAT,
        name: "icmp_dnat",
        label: "icmp-error-to-container",
        meaning: "ICMP error about a container's answer, sent to the host address: passed on to the container with its quote translated (path MTU, port unreachable)",
        kind: Kind::Translated,
    },
    Reason {
        id: stat::KNAT_NEW,
        name: "knat_new",
        label: "netfilter-dnat-new",
        meaning: "new flow handed to the node's netfilter: the kernel's conntrack entry made with its DNAT to the container (as upstream's DNAT rule makes it), netfilter's NAT translates",
        kind: Kind::Translated,
    },
    Reason {
        id: stat::KNAT,
        name: "knat",
        label: "netfilter-dnat",
        meaning: "packet of a flow the node's netfilter translates by its conntrack entry: left as it is",
        kind: Kind::Translated,
    },
    Reason {
        id: stat::KNAT_REMADE,
        name: "knat_remade",
        label: "netfilter-dnat-remade",
        meaning: "packet of a flow netfilter translates whose kernel conntrack entry was gone (conntrack -D, flush, expiry): the entry made again with its DNAT, as upstream's rule would",
        kind: Kind::Recorded,
    },
    Reason {
        id: stat::KNAT_FAILED,
        name: "knat_failed",
        label: "netfilter-dnat-failed",
        meaning: "the kernel's conntrack entry of a flow could not be made (its table full, memory short): the packet left untranslated, the node answers it as under upstream with a full table",
        kind: Kind::Problem,
    },
    Reason {
        id: stat::CT_NEW_IN,
        name: "ct_new_in",
        label: "entries-new-written",
        meaning: "entries written to conntrack_new (a new flow's): with what left it, what was swept and what is there, the count of what the table evicted",
        kind: Kind::Recorded,
    },
    Reason {
        id: stat::CT_NEW_OUT,
        name: "ct_new_out",
        label: "entries-new-left",
        meaning: "entries that left conntrack_new by the programs' hand (the flow assured or closed)",
        kind: Kind::Recorded,
    },
    Reason {
        id: stat::CT_LIVE_IN,
        name: "ct_live_in",
        label: "entries-live-written",
        meaning: "entries written to the assured tables (conntrack, conntrack_other): an assured flow's, or a node flow's pass entry",
        kind: Kind::Recorded,
    },
    Reason {
        id: stat::CT_LIVE_OUT,
        name: "ct_live_out",
        label: "entries-live-left",
        meaning: "entries that left the assured tables by the programs' hand (the flow closed), or an idled-out entry written over",
        kind: Kind::Recorded,
    },
];

/// What `trace` shows for an event that counted nothing: an inbound packet
/// for a port (the traced one) that no mapping publishes. Not a counter,
/// so not in [`REASONS`]; its ID is [`stat::COUNT`], past every counter.
pub static NO_MAPPING: Reason = Reason {
    id: stat::COUNT,
    name: "no_mapping",
    label: "no-mapping",
    meaning: "no mapping for this address, port and protocol: passed to the node untouched",
    kind: Kind::Problem,
};

/// The reason with this ID, if there is one.
pub fn reason(id: u32) -> Option<&'static Reason> {
    REASONS.get(id as usize)
}

/// The reason with this counter name, if there is one.
pub fn by_name(name: &str) -> Option<&'static Reason> {
    REASONS.iter().find(|reason| reason.name == name)
}

const fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

// The table in ID order, with no name or label twice (nor NO_MAPPING's
// label): checked when the
// crate is built, so neither side of the kernel boundary gets a broken one.
const _: () = {
    let mut i = 0;
    while i < TABLE.len() {
        assert!(
            TABLE[i].id as usize == i,
            "REASONS must list the reasons in ID order"
        );
        let mut j = i + 1;
        while j < TABLE.len() {
            assert!(
                !same(TABLE[i].name, TABLE[j].name),
                "two reasons with one name"
            );
            assert!(
                !same(TABLE[i].label, TABLE[j].label),
                "two reasons with one label"
            );
            j += 1;
        }
        assert!(
            !same(TABLE[i].label, NO_MAPPING.label),
            "a reason with the label of NO_MAPPING"
        );
        i += 1;
    }
};

#[cfg(test)]
mod tests {
    extern crate std;
    use std::{collections::BTreeSet, vec::Vec};

    use super::*;

    /// The `pub const NAME: u32 = ID;` lines of `mod stat` in this file,
    /// COUNT left out: the IDs the eBPF code can count.
    fn declared_ids() -> Vec<(&'static str, u32)> {
        let source = include_str!("reason.rs");
        let body = &source[source.find("pub mod stat {").expect("mod stat")..];
        let body = &body[..body.find("\n}").expect("end of mod stat")];
        body.lines()
            .filter_map(|line| {
                let rest = line.trim().strip_prefix("pub const ")?;
                let (name, id) = rest.split_once(": u32 = ")?;
                let id = id.strip_suffix(';')?.parse().ok()?;
                (name != "COUNT").then_some((name, id))
            })
            .collect()
    }

    #[test]
    fn every_declared_reason_has_its_table_entry() {
        let declared = declared_ids();
        assert_eq!(
            declared.len(),
            stat::COUNT as usize,
            "stat declares {} reasons but COUNT is {}: bump COUNT and add the entry to REASONS",
            declared.len(),
            stat::COUNT
        );
        assert_eq!(REASONS.len(), stat::COUNT as usize);
        for (name, id) in declared {
            let entry =
                reason(id).unwrap_or_else(|| panic!("stat::{name} = {id} has no entry in REASONS"));
            assert_eq!(entry.id, id, "entry {id} of REASONS is for another reason");
            assert_eq!(
                entry.name.to_ascii_uppercase(),
                name,
                "stat::{name} and the name of entry {id} differ"
            );
        }
    }

    #[test]
    fn ids_are_dense_and_names_and_labels_unique() {
        let ids: Vec<u32> = REASONS.iter().map(|r| r.id).collect();
        assert_eq!(
            ids,
            (0..stat::COUNT).collect::<Vec<_>>(),
            "IDs in order, no gap"
        );
        let names: BTreeSet<_> = REASONS.iter().map(|r| r.name).collect();
        let labels: BTreeSet<_> = REASONS.iter().map(|r| r.label).collect();
        assert_eq!(names.len(), REASONS.len(), "a counter name repeats");
        assert_eq!(labels.len(), REASONS.len(), "a trace label repeats");
    }

    #[test]
    fn every_reason_reads_as_documented() {
        for r in &REASONS {
            assert!(
                !r.name.is_empty() && r.name.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                "name of {r:?}: snake_case"
            );
            assert!(
                !r.label.is_empty() && r.label.bytes().all(|b| b.is_ascii_lowercase() || b == b'-'),
                "label of {r:?}: kebab-case"
            );
            assert!(!r.meaning.is_empty(), "meaning of {r:?}");
            assert_eq!(by_name(r.name), Some(r));
            assert_eq!(stat::NAMES[r.id as usize], r.name);
        }
        assert_eq!(reason(stat::COUNT), None);
    }
}
