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
/// Our connection tracking ([`crate::CtKey`] -> [`crate::CtEntry`]).
pub const CONNTRACK: &str = "conntrack";
/// Per-CPU counters by reason (see [`crate::reason`]).
pub const STATS: &str = "stats";
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
/// Where a container's packets are handed over on the fast path
/// ([`crate::local::PeerKey`] -> [`crate::local::Peer`]).
pub const PEERS: &str = "peers";

/// Per-CPU scratch space of the tc programs (not pinned; the eBPF crate's
/// own layout, never read by userspace).
pub const SCRATCH: &str = "scratch";
/// Per-CPU scratch space of the traffic counters (not pinned).
pub const COUNTER_SCRATCH: &str = "counter_scratch";
/// Per-CPU scratch space of tracing (not pinned).
pub const TRACE_SCRATCH: &str = "trace_scratch";

/// Every pinned map of the translation itself.
pub const PINNED: [&str; 7] = [
    MAPPINGS,
    OWNERS,
    OWNER_SLOTS,
    CONNTRACK,
    STATS,
    COUNTERS,
    TRACE_FILTER,
];
/// Every pinned map of node-local traffic (socket hooks, hairpin, fast path).
pub const PINNED_LOCAL: [&str; 5] = [NODE, LOCAL_ADDRS, IFACES, SOCK_ORIGIN, PEERS];
/// The maps of the object that are never pinned.
pub const UNPINNED: [&str; 4] = [TRACE_EVENTS, SCRATCH, COUNTER_SCRATCH, TRACE_SCRATCH];

/// Default capacities (`max_entries`); userspace may override some of them
/// at load time (`conntrackSize`, `maxMappings`).
pub mod capacity {
    /// Port mappings (one per host address/port/protocol/family).
    pub const MAPPINGS: u32 = 65536;
    /// Distinct owners (network, container ID, ifname).
    pub const OWNERS: u32 = 16384;
    /// Index slots that point from an owner to its mappings.
    pub const OWNER_SLOTS: u32 = 131072;
    /// Conntrack entries (two per translated flow).
    pub const CONNTRACK: u32 = 262144;
    /// Per-mapping traffic counters: one per (mapping, owner), so as many as
    /// there are mappings. Allocated on first use, not up front.
    pub const COUNTERS: u32 = MAPPINGS;
    /// Bytes of the trace ring buffer (a power of two, a multiple of the page
    /// size): about 2700 events between two reads of the tracer.
    pub const TRACE_EVENTS_BYTES: u32 = 256 * 1024;
    /// The node's own addresses.
    pub const LOCAL_ADDRS: u32 = 4096;
    /// Interfaces the tc programs are attached to.
    pub const IFACES: u32 = 4096;
    /// Fast-path hand-over entries: one per container address, so bounded
    /// like the owners.
    pub const PEERS: u32 = OWNERS;
}
