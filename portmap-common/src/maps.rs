//! Every map of the dataplane: its name (the ELF symbol in the object and
//! the pin file name) and its default capacity.
//!
//! The eBPF crate declares the maps (`portmap-ebpf/src/maps.rs`) with these
//! capacities; its `#[btf_map(name = ...)]` attribute takes a literal, so
//! `portmap-user/tests/object_maps.rs` checks the object's maps against
//! this list, name by name.

/// Port mappings ([`crate::MappingKey`] -> [`crate::MappingValue`]).
pub const MAPPINGS: &str = "mappings";
/// Owner identities ([`crate::OwnerRecord`] by owner ID).
pub const OWNERS: &str = "owners";
/// Owner -> the mappings it claimed ([`crate::OwnerSlotKey`] -> [`crate::MappingKey`]).
pub const OWNER_SLOTS: &str = "owner_slots";
/// Our connection tracking of open TCP flows ([`crate::CtKey`] ->
/// [`crate::CtEntry`]). Three LRU tables, so that no churn of one kind can
/// evict the flows of another: open TCP flows here (the name of the one
/// table of earlier builds, whose TCP entries carry on), closed TCP flows
/// in [`CONNTRACK_CLOSED`] for their last packets, every other protocol in
/// [`CONNTRACK_OTHER`].
pub const CONNTRACK: &str = "conntrack";
/// TCP flows that closed (FIN both ways, or RST), moved out of
/// [`CONNTRACK`] so that dead flows never push live ones out of it; kept
/// for [`crate::ct_timeout::TCP_CLOSED`] or until newer closed flows evict
/// them.
pub const CONNTRACK_CLOSED: &str = "conntrack_close";
/// UDP and SCTP flows (same key and value as [`CONNTRACK`]).
pub const CONNTRACK_OTHER: &str = "conntrack_other";
/// Every entry of a flow that is not yet assured, of any protocol (same
/// key and value as [`CONNTRACK`]): a TCP flow until its handshake
/// completes (or, recovered mid-flow, until its container answers); a UDP
/// or SCTP flow until it has an answer and still has packets
/// [`crate::ct_timeout::UDP_STREAM`] after its first. Its entries then
/// move to [`CONNTRACK`] or [`CONNTRACK_OTHER`], which hold assured flows
/// only, so a flood of new flows (spoofed SYNs, datagrams from many
/// ports) evicts only unassured entries, never a live flow's: the idea of
/// nf_conntrack's `early_drop`.
pub const CONNTRACK_NEW: &str = "conntrack_new";
/// The ports the mappings use, per protocol, in two roles: host ports
/// (what a client dials) and container ports (what the container answers
/// from). A bit array of `u64` words ([`crate::mapped_port_bit`]), mapped
/// into userspace (`BPF_F_MMAPABLE`). The tc programs and the socket hooks
/// leave a packet or socket with no port in the role that concerns it
/// before any hash lookup, so traffic no mapping concerns costs a few
/// instructions. Userspace sets the bits of a mapping before it writes the
/// mapping, with an atomic OR on the mapped memory (concurrent ADDs never
/// undo each other's bits), and never clears them: a stale bit costs only
/// the lookups it would have saved, and clearing one safely would need a
/// count of its users that a lock-free ADD cannot keep.
pub const MAPPED_PORTS: &str = "mapped_ports";
/// The mappings' epoch: one `u64` that userspace raises, with an atomic
/// add on the array mapped into the process (`BPF_F_MMAPABLE`), after
/// every change that can make a mapping key answer otherwise than before
/// (a mapping deleted or re-pointed). The tc programs keep the mappings
/// their flows re-check in a per-CPU cache ([`MAPPING_CACHE`]) that holds
/// only while the epoch is the one it was filled at.
pub const MAPPINGS_EPOCH: &str = "mappings_epoch";
/// Per-CPU counters by reason (see [`crate::reason`]).
pub const STATS: &str = "stats";
/// What userspace adds to the conntrack ledger (see [`crate::ct_ledger`]):
/// `u64` values by [`crate::ct_ledger`] index, mapped into userspace
/// (`BPF_F_MMAPABLE`) and changed there with atomics only. The programs
/// never touch it: they count their side per CPU in [`STATS`].
pub const CT_LEDGER: &str = "ct_ledger";
/// Per-mapping traffic counters ([`crate::CounterKey`] -> [`crate::MappingCounters`]).
pub const COUNTERS: &str = "counters";
/// What `trace` wants to see ([`crate::TraceFilter`]).
pub const TRACE_FILTER: &str = "trace_filter";
/// The trace ring buffer. Not pinned: it is a stream, not a table
/// (`bpftool map dump` cannot show it), and `trace` finds it through the
/// map IDs of the pinned programs.
pub const TRACE_EVENTS: &str = "trace_events";

/// Array of one [`crate::local::NodeConfig`].
pub const NODE: &str = "node";
/// The node's own addresses ([`crate::local::LocalAddrKey`] -> 1).
pub const LOCAL_ADDRS: &str = "local_addrs";
/// Per-interface settings ([`crate::local::IfaceConfig`] by ifindex).
pub const IFACES: &str = "ifaces";
/// Per-socket memory of a translated destination ([`crate::local::SockOrigin`]).
pub const SOCK_ORIGIN: &str = "sock_origin";
/// What the socket hooks translated per mapping ([`crate::CounterKey`] ->
/// [`crate::local::SockCounters`], per CPU): `list`'s SOCK column. Entries
/// are created by the hooks on a mapping's first translation and removed
/// with the traffic counters (DEL, GC).
pub const SOCK_COUNTERS: &str = "sock_counters";
/// Where a container's packets are handed over on the fast path
/// ([`crate::local::PeerKey`] -> [`crate::local::Peer`]).
pub const PEERS: &str = "peers";
/// Which client last had each masquerade tuple, and when
/// ([`crate::local::MasqOwner`] by [`crate::local::masq_owner_slot`]): the
/// container may hold that tuple in TIME_WAIT for a minute, longer than
/// the closed conntrack table remembers flows under churn.
pub const MASQ_OWNERS: &str = "masq_owners";
/// The network namespaces of this node's containers whose sockets the
/// socket hooks translate (`containerSockets`): netns cookie (`u64`) ->
/// the owner ID of the attachment that registered it (`u64`). Written by
/// ADD, removed by DEL and GC; the hooks only ask whether a cookie is in
/// it. Its userspace twin, [`crate::local::OWNER_NETNS_MAP`], finds the
/// cookie again by owner when the namespace is gone.
pub const CONTAINER_NETNS: &str = "container_netns";

/// Per-CPU scratch space of the tc programs (not pinned; the eBPF crate's
/// own layout, never read by userspace).
pub const SCRATCH: &str = "scratch";
/// Per-CPU scratch space of the traffic counters (not pinned).
pub const COUNTER_SCRATCH: &str = "counter_scratch";
/// Per-CPU scratch space of tracing (not pinned).
pub const TRACE_SCRATCH: &str = "trace_scratch";
/// Per-CPU memory of the clock: the coarse time read at the current jiffy
/// (not pinned; see `ct::now` in the eBPF crate).
pub const CLOCK_CACHE: &str = "clock_cache";
/// Per-CPU cache of the mappings that established flows re-check (not
/// pinned; see [`MAPPINGS_EPOCH`]).
pub const MAPPING_CACHE: &str = "mapping_cache";

/// Every pinned map of the translation itself.
pub const PINNED: [&str; 13] = [
    MAPPINGS,
    MAPPINGS_EPOCH,
    OWNERS,
    OWNER_SLOTS,
    CONNTRACK,
    CONNTRACK_CLOSED,
    CONNTRACK_OTHER,
    CONNTRACK_NEW,
    MAPPED_PORTS,
    STATS,
    CT_LEDGER,
    COUNTERS,
    TRACE_FILTER,
];
/// Every pinned map of node-local traffic (socket hooks, hairpin, fast path).
pub const PINNED_LOCAL: [&str; 8] = [
    NODE,
    LOCAL_ADDRS,
    IFACES,
    SOCK_ORIGIN,
    SOCK_COUNTERS,
    PEERS,
    MASQ_OWNERS,
    CONTAINER_NETNS,
];
/// The maps of the object that are never pinned.
pub const UNPINNED: [&str; 6] = [
    TRACE_EVENTS,
    SCRATCH,
    COUNTER_SCRATCH,
    TRACE_SCRATCH,
    CLOCK_CACHE,
    MAPPING_CACHE,
];

/// Default capacities (`max_entries`); userspace may override some of them
/// at load time (`conntrackSize`, `maxMappings`).
pub mod capacity {
    /// Port mappings (one per host address/port/protocol/family).
    pub const MAPPINGS: u32 = 65536;
    /// Distinct owners (network, container ID, ifname).
    pub const OWNERS: u32 = 16384;
    /// Index slots that point from an owner to its mappings.
    pub const OWNER_SLOTS: u32 = 131072;
    /// Conntrack entries (two per translated flow), of open TCP flows; as
    /// many again for other protocols (`conntrack_other`).
    pub const CONNTRACK: u32 = 262144;
    /// Entries of closed TCP flows: a quarter of [`CONNTRACK`], at least
    /// [`CONNTRACK_CLOSED_MIN`] (see [`conntrack_closed`]).
    pub const CONNTRACK_CLOSED: u32 = conntrack_closed(CONNTRACK);
    pub const CONNTRACK_CLOSED_MIN: u32 = 1024;

    /// Size of `conntrack_close` for a `conntrack` of `size` entries: closed
    /// flows are needed for seconds only, and evicting an old one costs at
    /// most a retransmitted FIN (which recovery translates anyway).
    pub const fn conntrack_closed(size: u32) -> u32 {
        let quarter = size / 4;
        if quarter < CONNTRACK_CLOSED_MIN {
            CONNTRACK_CLOSED_MIN
        } else {
            quarter
        }
    }
    /// `u64` words of `mapped_ports`: one bit per port of TCP, UDP and
    /// SCTP in each of the two roles (48 KiB).
    pub const MAPPED_PORTS: u32 = 2 * 3 * 65536 / 64;
    /// Per-mapping traffic counters: one per (mapping, owner), so as many as
    /// there are mappings. Allocated on first use, not up front.
    pub const COUNTERS: u32 = MAPPINGS;
    /// Per-mapping socket-hook counters: as many as the traffic counters'
    /// default (only mappings a node process dials use one). Not resized
    /// with `maxMappings`: past this many mappings dialled from the node,
    /// further ones go uncounted (their connections are still translated).
    pub const SOCK_COUNTERS: u32 = COUNTERS;
    /// Bytes of the trace ring buffer (a power of two, a multiple of the page
    /// size): about 2700 events between two reads of the tracer.
    pub const TRACE_EVENTS_BYTES: u32 = 256 * 1024;
    /// The node's own addresses.
    pub const LOCAL_ADDRS: u32 = 4096;
    /// Interfaces the tc programs are attached to.
    pub const IFACES: u32 = 4096;
    /// Slots of `masq_owners` (8 bytes each, 2 MiB): four times the 65 536
    /// ports, so that the ports of one container port never share a slot
    /// (see [`crate::local::masq_owner_slot`]).
    pub const MASQ_OWNERS: u32 = 1 << 18;
    /// Fast-path hand-over entries: one per container address, so bounded
    /// like the owners.
    pub const PEERS: u32 = OWNERS;
    /// Registered container namespaces (`containerSockets`): one per
    /// container attachment, so bounded like the owners (16 bytes each,
    /// allocated on use).
    pub const CONTAINER_NETNS: u32 = OWNERS;
}
