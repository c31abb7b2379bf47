//! Every map of the dataplane, declared once, and the small accessors the
//! programs use. Names and capacities are `portmap_common::maps`' (the
//! `btf_map` attribute takes the name as a literal: keep the two equal,
//! `portmap-user/tests/object_maps.rs` checks). Userspace pins the tables
//! under `{pinRoot}/v1/maps/`; the scratch maps and the trace ring buffer
//! are not pinned.
//!
//! Scratch space: BPF's stack is 512 bytes along the whole call chain, and
//! the programs need more (conntrack entries of both directions, the FIB
//! lookup struct, trace snapshots). That state lives in one-entry per-CPU
//! arrays, reached through [`scratch`], [`counter_scratch`] and
//! [`trace_scratch`]; what one function leaves there for another is
//! documented on the struct fields.

use aya_ebpf::{
    bindings::BPF_F_NO_PREALLOC,
    btf_maps::{Array, HashMap, LruHashMap, PerCpuArray, PerCpuHashMap, RingBuf},
    macros::btf_map,
};
use portmap_common::{
    CounterKey, CtEntry, CtKey, MappingCounters, MappingKey, MappingValue, OwnerRecord,
    OwnerSlotKey, PROTO_TCP, PortRole, TraceEvent, TraceFilter, capacity,
    conditions::{self, ConditionKey, Conditions},
    local::SockCounters,
    stat,
};

use crate::parse;

const NO_PREALLOC: usize = BPF_F_NO_PREALLOC as usize;

/// Port mappings, written only by userspace.
#[btf_map(name = "mappings")]
static MAPPINGS: HashMap<MappingKey, MappingValue, { capacity::MAPPINGS as usize }, NO_PREALLOC> =
    HashMap::new();

/// Owner identities (userspace only; declared here so the pinned map has BTF).
#[btf_map(name = "owners")]
pub static OWNERS: HashMap<u64, OwnerRecord, { capacity::OWNERS as usize }, NO_PREALLOC> =
    HashMap::new();

/// Owner -> mapping index (userspace only; declared here for BTF).
#[btf_map(name = "owner_slots")]
pub static OWNER_SLOTS: HashMap<
    OwnerSlotKey,
    MappingKey,
    { capacity::OWNER_SLOTS as usize },
    NO_PREALLOC,
> = HashMap::new();

/// Our own connection tracking: two entries per translated flow (four
/// when masqueraded), plus pass entries for flows opened from a mapped
/// port by the node or a container. Four LRU tables (see
/// `portmap_common::maps::CONNTRACK`): assured open TCP flows, closed TCP
/// flows, assured flows of other protocols, and flows not yet assured
/// (`conntrack_new`). An LRU evicts what was used least recently whatever
/// our timestamps say, so dead flows must not stay in the table of live
/// ones: a flow that closes is moved to `CONNTRACK_CLOSED`, where only
/// other closed flows compete with it, and UDP churn has its own table.
#[btf_map(name = "conntrack")]
static CONNTRACK: LruHashMap<CtKey, CtEntry, { capacity::CONNTRACK as usize }> = LruHashMap::new();

#[btf_map(name = "conntrack_close")]
static CONNTRACK_CLOSED: LruHashMap<CtKey, CtEntry, { capacity::CONNTRACK_CLOSED as usize }> =
    LruHashMap::new();

#[btf_map(name = "conntrack_other")]
static CONNTRACK_OTHER: LruHashMap<CtKey, CtEntry, { capacity::CONNTRACK as usize }> =
    LruHashMap::new();

/// Every entry of a flow not yet assured (see
/// `portmap_common::maps::CONNTRACK_NEW`): new flows compete for room here
/// only, so a flood evicts the flood's own entries and never an assured
/// flow's in `conntrack` or `conntrack_other`.
#[btf_map(name = "conntrack_new")]
static CONNTRACK_NEW: LruHashMap<CtKey, CtEntry, { capacity::CONNTRACK as usize }> =
    LruHashMap::new();

/// Ports the mappings use, by role (see `portmap_common::maps::MAPPED_PORTS`).
#[btf_map(name = "mapped_ports")]
static MAPPED_PORTS: Array<u64, { capacity::MAPPED_PORTS as usize }, MMAPABLE> = Array::new();

const MMAPABLE: usize = aya_ebpf::bindings::BPF_F_MMAPABLE as usize;

/// Whether a mapping uses `port_be` of `proto` in `role`. An array load
/// (the verifier inlines it) and a bit test, no hash: the question every
/// packet and socket asks first.
#[inline(always)]
pub fn port_is(role: PortRole, proto: u8, port_be: u16) -> bool {
    let Some((word, bit)) = portmap_common::mapped_port_bit(role, proto, port_be) else {
        return false;
    };
    MAPPED_PORTS.get(word).is_some_and(|bits| *bits & bit != 0)
}

/// Which conntrack table an entry lives in.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Table {
    /// TCP flows that have not closed.
    Open,
    /// TCP flows that closed, for their last packets.
    Closed,
    /// UDP and SCTP flows.
    Other,
    /// Flows of any protocol not yet assured: every new flow starts here.
    New,
}

impl Table {
    /// Where an assured flow of IP protocol `proto` is recorded (a new
    /// one starts in [`Table::New`]).
    #[inline(always)]
    pub fn for_proto(proto: u8) -> Table {
        if proto == PROTO_TCP {
            Table::Open
        } else {
            Table::Other
        }
    }
}

/// Counters by reason, see `portmap_common::stat`.
#[btf_map(name = "stats")]
static STATS: PerCpuArray<u64, { stat::COUNT as usize }> = PerCpuArray::new();

/// Userspace's side of the conntrack ledger (see `portmap_common::ct_ledger`);
/// the programs count theirs in [`STATS`].
#[btf_map(name = "ct_ledger")]
static CT_LEDGER: Array<u64, { portmap_common::ct_ledger::LEN as usize }, MMAPABLE> = Array::new();

// ---- per-mapping traffic counters (see `counters`) ----

/// Keyed by (mapping, owner). Entries are created here on a mapping's first
/// packet (memory is used only for mappings that see traffic) and removed by
/// userspace when the owner is deleted or by `ebpf-portmap gc`.
#[btf_map(name = "counters")]
pub static COUNTERS: PerCpuHashMap<
    CounterKey,
    MappingCounters,
    { capacity::COUNTERS as usize },
    NO_PREALLOC,
> = PerCpuHashMap::new();

/// Room for the key and first value of `counters::record`: on its stack they would
/// not fit under the callers' frames (BPF's 512 bytes are shared along the
/// call chain, and the egress path uses most of them).
#[repr(C)]
pub struct CounterScratch {
    pub key: CounterKey,
    pub first: MappingCounters,
}

/// What the socket hooks translated per mapping (see
/// `counters::record_sock`), keyed as `counters`. Created on a mapping's
/// first translation from the node, removed by userspace with the traffic
/// counters.
#[btf_map(name = "sock_counters")]
pub static SOCK_COUNTERS: PerCpuHashMap<
    CounterKey,
    SockCounters,
    { capacity::SOCK_COUNTERS as usize },
    NO_PREALLOC,
> = PerCpuHashMap::new();

#[btf_map(name = "counter_scratch")]
static COUNTER_SCRATCH: PerCpuArray<CounterScratch, 1> = PerCpuArray::new();

// ---- tracing (see `trace`) ----

/// Written by the tracer, read by every packet.
#[btf_map(name = "trace_filter")]
pub static TRACE_FILTER: Array<TraceFilter, 1> = Array::new();

/// Events for the tracer.
#[btf_map(name = "trace_events")]
pub static TRACE_EVENTS: RingBuf<TraceEvent, { capacity::TRACE_EVENTS_BYTES as usize }> =
    RingBuf::new();

/// Per-CPU state of one traced packet (see `trace`).
#[repr(C)]
pub struct TraceScratch {
    /// This CPU's `stats` as they were before the packet was handled.
    pub before: [u64; stat::COUNT as usize],
    /// The reasons counted since, one bit each. Kept here rather than passed
    /// on: read back from a map, the value is unknown to the verifier, which
    /// would otherwise follow each of the 2^COUNT combinations separately.
    pub decisions: u64,
    /// Source and destination port of the packet as it leaves.
    pub after_ports_be: [u16; 2],
    /// The packet as it arrived.
    pub packet: parse::Packet,
}

#[btf_map(name = "trace_scratch")]
static TRACE_SCRATCH: PerCpuArray<TraceScratch, 1> = PerCpuArray::new();

// ---- the clock (see `ct::now`) ----

/// The coarse clock as this CPU last read it, and the jiffy it read it at.
#[repr(C)]
pub struct ClockCache {
    pub jiffies: u64,
    pub now_ns: u64,
}

#[btf_map(name = "clock_cache")]
static CLOCK_CACHE: PerCpuArray<ClockCache, 1> = PerCpuArray::new();

/// This CPU's memory of the clock. Taken only by `ct::now`, which calls
/// nothing that takes it too.
#[inline(always)]
pub fn clock_cache() -> Option<&'static mut ClockCache> {
    this_cpu(&CLOCK_CACHE)
}

// ---- per-CPU scratch of the tc programs ----

/// Room for what one new flow writes to conntrack (see `flow::new_flow`),
/// and what the flow decisions leave for the code that runs after their
/// frames are gone (counting, masquerade, the fast path).
#[repr(C)]
pub struct Scratch {
    pub forward_key: CtKey,
    pub reply_key: CtKey,
    pub forward: CtEntry,
    pub reply: CtEntry,
    pub fib: aya_ebpf::bindings::bpf_fib_lookup,
    /// Owner of the mapping a new flow was translated by.
    pub owner_id: u64,
    /// What the fast path may do with this packet.
    pub fast: Offer,
    /// The ingress program's tc action for this packet.
    pub action: i32,
    /// What `ct::track_tcp` has to do for this packet, `ct::follow` bits:
    /// `TCP_CHANGE` set by `ct::note_tcp_change` when the packet may change
    /// the TCP state of its flow, `UNASSURED` by `ct::lookup` when the
    /// packet's entry is in `conntrack_new`. One byte, so the entry points
    /// test it with one load and one branch (each more one multiplied the
    /// states 6.1's verifier walks in egress past its limit).
    pub follow: u8,
    /// Whether `ct::track_tcp` changed the entries of the last packet's
    /// flow (see `ct::track_noted` for why it is kept).
    pub tracked: bool,
    /// Set by `existing_flow` for a packet of a flow netfilter translates,
    /// taken by `knat::follow_noted` once existing_flow's frame is gone.
    pub knat_follow: bool,
    /// Set by `knat::hand_over_confirmed` with `fastPath: true` when the
    /// question found the flow's kernel entry gone; `knat::follow_noted`
    /// makes it again.
    pub knat_lost: bool,
    /// `ct::track_tcp`'s room for an entry on its way to another table.
    pub moved: CtEntry,
    /// The copy of the entry `ct::lookup` found, which it hands back.
    pub found: CtEntry,
    /// `ct::node_socket_owns`'s `bpf_sock_tuple` (the IPv6 layout holds
    /// either family).
    pub sock_tuple: [u32; 9],
    /// What the flow decision found for the confirmed-flow fast path.
    pub confirm: ConfirmPending,
    /// `confirm::ask_kernel`'s `bpf_sock_tuple` and options: the kfunc
    /// takes them as memory the verifier can bound, a map value's.
    pub kernel_tuple: [u32; 9],
    pub kernel_opts: CtOpts,
    /// `knat`'s `union nf_inet_addr` of the container, for
    /// `bpf_ct_set_nat_info` (memory the verifier can bound too).
    pub kernel_addr: [u32; 4],
    /// `fib::local_destination`'s key of `local_addrs`: on its frame it
    /// would add to the deepest call chain under ingress.
    pub local_key: portmap_common::local::LocalAddrKey,
}

/// What the flow decision leaves in scratch for `confirm::confirmed`: this
/// direction's entry as it was before the packet, and where the kernel
/// sees the flow.
#[repr(C)]
pub struct ConfirmPending {
    /// Our conntrack key of this direction's entry.
    pub key: CtKey,
    /// The destination of the flow's tuple as netfilter sees it at this
    /// hook: towards the container, the translated one (tc ingress runs
    /// before netfilter's PREROUTING), the answer's own otherwise.
    pub kernel_dst_be: [u32; 4],
    pub kernel_dport_be: u16,
    /// The entry's `tcp_state` before this packet.
    pub tcp_state: u8,
    /// This packet is a TCP FIN or RST.
    pub closing: bool,
    /// The entry's `flags` and `verdict_at`.
    pub flags: u32,
    pub verdict_at: u32,
    /// Set by `confirm::note` for this packet; `fast::fast_path` clears it.
    pub armed: bool,
    /// The entry's `kind` (a flow netfilter translates is judged by more,
    /// see `confirm::confirmed`).
    pub kind: u8,
}

/// `struct bpf_ct_opts`, the part Linux 5.18 defined
/// ([`portmap_common::kfunc::CT_OPTS_LEN`]), for `confirm::ask_kernel`.
#[repr(C)]
pub struct CtOpts {
    pub netns_id: i32,
    pub error: i32,
    pub l4proto: u8,
    pub dir: u8,
    pub reserved: [u8; 2],
}

const _: () =
    assert!(core::mem::size_of::<CtOpts>() == portmap_common::kfunc::CT_OPTS_LEN as usize);

/// What the fast path may do with the packet being handled: left in
/// scratch by the flow decisions, taken by `fast::fast_path` once their frames
/// are gone.
#[repr(u8)]
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Offer {
    /// The normal path. Zero, so a fresh scratch entry holds a valid offer.
    Nothing = 0,
    /// Translated towards the container (its address in
    /// `scratch.forward.nat_addr_be`, the owner in `scratch.owner_id`).
    Forward = 1,
    /// A container's answer that egress translates back: to a translated
    /// flow, or to a masqueraded one (a hairpin flow's) whose destination
    /// ingress restored to the client. Its tuple is in `scratch.confirm`
    /// (the key as it arrived, the client's end in `kernel_dst`), which
    /// the flow decision writes for the confirmed-flow question anyway.
    Reply = 2,
    /// Not an offer but the flow decision's verdict: the packet is
    /// dropped (a crafted one, see `flow::ingress`). Carried here, the one
    /// value `fast::fast_path` turns into the action, so the entry point keeps
    /// one state for every way a packet was decided.
    Drop = 3,
    /// A packet of a flow netfilter translates that the flow decision
    /// already found confirmed and translated in tc (see
    /// `knat::follow_noted`): handed to the container as [`Forward`]
    /// would be, without asking again.
    Handed = 4,
}

#[btf_map(name = "scratch")]
static SCRATCH: PerCpuArray<Scratch, 1> = PerCpuArray::new();

/// This CPU's entry of a one-entry scratch map.
///
/// Callers hold one reference to an entry at a time: a function that calls
/// another that takes the same scratch passes down the fields it needs
/// instead, or takes it again afterwards.
#[inline(always)]
#[allow(
    clippy::mut_from_ref,
    reason = "a map is shared by design: the entry is exclusive because it is this CPU's and by the one-at-a-time rule above"
)]
fn this_cpu<T>(map: &'static PerCpuArray<T, 1>) -> Option<&'static mut T> {
    // SAFETY: the entry belongs to this CPU, and a program runs on its CPU
    // to completion with no other of ours in between (tc egress runs with
    // bottom halves off, so ingress cannot interrupt it; the socket hooks
    // use no scratch). Every value is plain integers or an enum whose zero
    // is a variant, so a fresh, zeroed entry is valid.
    map.get_ptr_mut(0).map(|entry| unsafe { &mut *entry })
}

/// The tc programs' scratch space.
#[inline(always)]
pub fn scratch() -> Option<&'static mut Scratch> {
    this_cpu(&SCRATCH)
}

/// `counters::record`'s scratch space.
#[inline(always)]
pub fn counter_scratch() -> Option<&'static mut CounterScratch> {
    this_cpu(&COUNTER_SCRATCH)
}

/// The tracer's per-packet scratch space.
#[inline(always)]
pub fn trace_scratch() -> Option<&'static mut TraceScratch> {
    this_cpu(&TRACE_SCRATCH)
}

#[inline(always)]
pub fn mapping(key: &MappingKey) -> Option<MappingValue> {
    // SAFETY: the value is copied out at once; userspace may replace it
    // concurrently, and a copy is all we need.
    unsafe { MAPPINGS.get(key).copied() }
}

// ---- who may open a flow (see `portmap_common::conditions`) ----

/// Each owner's conditions per family, written only by userspace; read
/// only for a new flow by a mapping whose `conditions` field is set.
#[btf_map(name = "conditions")]
static CONDITIONS: HashMap<
    ConditionKey,
    Conditions,
    { conditions::CAPACITY as usize },
    NO_PREALLOC,
> = HashMap::new();

/// The conditions of `owner_id` for `family`, in place (the value is
/// larger than a frame may hold); `None` when the entry is missing.
#[inline(always)]
pub fn conditions_of(owner_id: u64, family: u8) -> Option<&'static Conditions> {
    let key = ConditionKey {
        owner_id,
        family,
        _pad0: [0; 7],
    };
    // SAFETY: a live map value, read field by field by the caller; userspace
    // replaces whole entries, so a read racing an update sees either.
    unsafe { CONDITIONS.get(key) }
}

// ---- the mappings' cache for established flows (see `cached_mapping`) ----

/// Raised by userspace after every change that can make a key of `mappings`
/// answer otherwise (see `portmap_common::maps::MAPPINGS_EPOCH`).
#[btf_map(name = "mappings_epoch")]
static MAPPINGS_EPOCH: Array<u64, 1, MMAPABLE> = Array::new();

/// One mapping as this CPU last looked it up, and when.
#[repr(C)]
pub struct CachedMapping {
    /// The key's five words (see [`key_word`]).
    key: [u32; 5],
    _pad0: u32,
    value: MappingValue,
    /// `mappings_epoch` as it was read before the lookup.
    epoch: u64,
    /// `jiffies` at the lookup.
    jiffies: u64,
}

/// Slots of the cache per CPU (a power of two), each 72 bytes.
const MAPPING_CACHE_SLOTS: u32 = 64;

/// Ticks a cached mapping holds at most, whatever the epoch says: 64 ms at
/// HZ 1000, 640 ms at HZ 100. The bound for what the epoch cannot see: a
/// build before the epoch deleting a mapping while this build's programs
/// run (an upgrade under way), or a plugin killed between its delete and
/// its raise of the epoch.
const MAPPING_CACHE_TICKS: u64 = 64;

#[btf_map(name = "mapping_cache")]
static MAPPING_CACHE: PerCpuArray<CachedMapping, { MAPPING_CACHE_SLOTS as usize }> =
    PerCpuArray::new();

/// Word `i` of a mapping key, read from memory each time: kept in
/// registers across `cached_mapping`'s calls, the five words would be
/// spilled to a frame that has no room for them.
#[inline(always)]
fn key_word(key: &MappingKey, i: usize) -> u32 {
    const _: () = assert!(core::mem::size_of::<MappingKey>() == 20);
    // SAFETY: MappingKey is repr(C), 20 bytes of plain integers, aligned
    // to 4; `i` < 5 at every call site.
    unsafe { core::ptr::read_volatile((key as *const MappingKey).cast::<u32>().add(i)) }
}

/// `mappings[key]`, from this CPU's cache when the cache is known to be
/// current: filled at the epoch userspace has now, less than
/// [`MAPPING_CACHE_TICKS`] ago. The flows' re-check on every packet (see
/// `ct::still_mapped`) then costs array loads instead of a hash lookup.
///
/// Why a hit is never stale: userspace raises the epoch *after* a delete
/// or re-point is in the map, and the epoch is read here *before* the
/// lookup that fills the slot. A slot filled at epoch E holds what the map
/// held at some moment after E was current; any change since raises the
/// epoch past E, and the slot no longer matches. A change racing the
/// packet is as if the packet came first. Only what is found is kept: a
/// new mapping cannot make a kept one wrong.
///
/// Not inlined, and the value is handed back in place (this CPU's slot),
/// not copied: the frames of `existing_flow` and `egress` have no room for
/// a copy (the verifier's 512 bytes along a call chain), and a pointer is
/// one register.
#[inline(never)]
pub fn cached_mapping(key: &MappingKey) -> Option<&'static MappingValue> {
    let mut hash = 0;
    for i in 0..5 {
        hash ^= key_word(key, i);
    }
    let slot = hash.wrapping_mul(0x9e37_79b1) >> (32 - MAPPING_CACHE_SLOTS.trailing_zeros());
    let cached = MAPPING_CACHE.get_ptr_mut(slot)?;
    // SAFETY: this CPU's slot, and no other program of ours runs on this
    // CPU until this one is done (see `this_cpu`); the caller reads the
    // value before anything else can take the slot.
    let cached = unsafe { &mut *cached };
    // Read after the slot's lookup, so that neither is held across it.
    let epoch = MAPPINGS_EPOCH.get_ptr(0)?;
    // SAFETY: a live map value; userspace writes it with atomics, and a
    // volatile load keeps this read before the lookup of the mapping.
    let epoch = unsafe { core::ptr::read_volatile(epoch) };
    // SAFETY: no arguments; the verifier turns it into a load.
    let jiffies = unsafe { aya_ebpf::helpers::bpf_jiffies64() };
    if cached.epoch == epoch
        && jiffies.wrapping_sub(cached.jiffies) < MAPPING_CACHE_TICKS
        && same_key(&cached.key, key)
    {
        return Some(&cached.value);
    }
    // The slot is made to match no key before it takes the new epoch and
    // time (family 0 is no family), so that a failed lookup leaves nothing
    // behind.
    cached.key[4] = 0;
    cached.epoch = epoch;
    cached.jiffies = jiffies;
    // SAFETY: a live map value, copied into the slot at once; userspace
    // may replace it concurrently, and a copy is all we need.
    let value = unsafe { MAPPINGS.get(key)? };
    // Field by field: a copy of the address array becomes a `memcpy` call.
    for i in 0..4 {
        // SAFETY: a word of a live map value.
        cached.value.container_addr_be[i] =
            unsafe { core::ptr::read_volatile(&raw const value.container_addr_be[i]) };
    }
    cached.value.container_port_be = value.container_port_be;
    cached.value.owner_id = value.owner_id;
    for i in 0..5 {
        cached.key[i] = key_word(key, i);
    }
    Some(&cached.value)
}

/// Whether a slot holds `key`: word by word, each pair read in order and
/// compared before the next is read (volatile), so that no `bcmp` call is
/// made (BPF makes it a byte loop) and no ten words are held at once, which
/// `cached_mapping`'s frame has no room to spill.
#[inline(always)]
fn same_key(words: &[u32; 5], key: &MappingKey) -> bool {
    for (i, word) in words.iter().enumerate() {
        // SAFETY: a word of this CPU's slot.
        if unsafe { core::ptr::read_volatile(word) } != key_word(key, i) {
            return false;
        }
    }
    true
}

/// The mapping for `addr:port`: one for exactly that host address first,
/// else the wildcard of the family. O(1) whatever the number of mappings.
/// The key says which matched. The one lookup of the tc programs and the
/// socket hooks.
#[inline(always)]
pub fn find_mapping(
    family: u8,
    proto: u8,
    addr_be: &[u32; 4],
    port_be: u16,
) -> Option<(MappingKey, MappingValue)> {
    let mut key = MappingKey {
        host_addr_be: *addr_be,
        host_port_be: port_be,
        proto,
        family,
    };
    if let Some(value) = mapping(&key) {
        return Some((key, value));
    }
    // Word by word: `= [0; 4]` becomes a call to a byte-loop memset (83
    // instructions) on every fallback lookup.
    let words = key.host_addr_be.as_mut_ptr();
    let mut i = 0;
    while i < 4 {
        // SAFETY: within the key's four address words.
        unsafe { core::ptr::write_volatile(words.add(i), 0) };
        i += 1;
    }
    mapping(&key).map(|value| (key, value))
}

/// `$map.$call` on the map of `$table` (the three differ in capacity, so
/// in type).
macro_rules! on_table {
    ($table:expr, $map:ident => $call:expr) => {
        match $table {
            Table::Open => {
                let $map = &CONNTRACK;
                $call
            }
            Table::Closed => {
                let $map = &CONNTRACK_CLOSED;
                $call
            }
            Table::Other => {
                let $map = &CONNTRACK_OTHER;
                $call
            }
            Table::New => {
                let $map = &CONNTRACK_NEW;
                $call
            }
        }
    };
}

#[inline(always)]
pub fn ct_get(table: Table, key: &CtKey) -> Option<*mut CtEntry> {
    on_table!(table, map => map.get_ptr_mut(key))
}

/// The entry of `key` among the flows that have not closed, and the table
/// it is in: the assured flows' table first, then `conntrack_new`.
#[inline(always)]
pub fn ct_get_live(key: &CtKey) -> Option<(*mut CtEntry, Table)> {
    let table = Table::for_proto(key.proto);
    if let Some(entry) = ct_get(table, key) {
        return Some((entry, table));
    }
    ct_get(Table::New, key).map(|entry| (entry, Table::New))
}

/// [`ct_get_live`], else a closed TCP flow's entry. A flow not yet
/// assured comes before a closed one: a SYN that reopens a tuple whose
/// old flow lingers among the closed ones starts in `conntrack_new`.
#[inline(always)]
pub fn ct_get_any(key: &CtKey) -> Option<(*mut CtEntry, Table)> {
    if let Some(found) = ct_get_live(key) {
        return Some(found);
    }
    if key.proto != PROTO_TCP {
        return None;
    }
    ct_get(Table::Closed, key).map(|entry| (entry, Table::Closed))
}

#[inline(always)]
pub fn ct_put(table: Table, key: &CtKey, entry: &CtEntry) -> bool {
    on_table!(table, map => map.insert(key, entry, 0).is_ok())
}

/// Inserts only if `key` is free (BPF_NOEXIST).
#[inline(always)]
pub fn ct_put_new(table: Table, key: &CtKey, entry: &CtEntry) -> bool {
    let flags = u64::from(aya_ebpf::bindings::BPF_NOEXIST);
    on_table!(table, map => map.insert(key, entry, flags).is_ok())
}

/// Removes the entry of `key`; whether there was one to remove (a failed
/// removal means the entry is gone already).
#[inline(always)]
pub fn ct_remove(table: Table, key: &CtKey) -> bool {
    on_table!(table, map => map.remove(key).is_ok())
}

/// How the first entry of [`ct_put_pair`] is written.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Insert {
    /// Over whatever is there ([`ct_put`]).
    Any,
    /// Only if its key is free ([`ct_put_new`]).
    IfFree,
}

/// Which entry of a pair was not written.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum PairFailed {
    /// Nothing was written.
    First,
    /// The first entry was written and removed again.
    Second,
}

/// Records two directions of a flow in `table`, or neither: `first` as
/// `how` says, then `second` over whatever is there. When `second` fails,
/// `first` is removed again, so no half-recorded flow matches later
/// packets (or holds a masquerade port) until it idles out. An entry that
/// `first` replaced is not brought back: it was this same tuple's, and the
/// packet at hand starts its flow over.
#[inline(always)]
pub fn ct_put_pair(
    table: Table,
    first: (&CtKey, &CtEntry),
    how: Insert,
    second: (&CtKey, &CtEntry),
) -> Result<(), PairFailed> {
    let written = match how {
        Insert::Any => ct_put(table, first.0, first.1),
        Insert::IfFree => ct_put_new(table, first.0, first.1),
    };
    if !written {
        return Err(PairFailed::First);
    }
    if ct_put(table, second.0, second.1) {
        ledger_n(table, Ledger::In, 2);
        return Ok(());
    }
    // A failed removal leaves what was there before this change: the entry
    // idles out, or the LRU evicts it.
    ct_remove(table, first.0);
    Err(PairFailed::Second)
}

/// Which side of a table's ledger an entry goes to (see
/// `portmap_common::ct_ledger`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Ledger {
    /// Written by the programs.
    In,
    /// Moved or removed by the programs.
    Out,
}

/// Counts one entry written to (or taken from) `table` in its group's
/// ledger: `conntrack_new`, or the assured tables. The closed table holds
/// dead flows only and keeps none.
#[inline(always)]
pub fn ledger(table: Table, side: Ledger) {
    ledger_n(table, side, 1);
}

/// [`ledger`] of `n` entries at once (one counter update).
#[inline(always)]
pub fn ledger_n(table: Table, side: Ledger, n: u64) {
    let reason = match (table, side) {
        (Table::New, Ledger::In) => stat::CT_NEW_IN,
        (Table::New, Ledger::Out) => stat::CT_NEW_OUT,
        (Table::Open | Table::Other, Ledger::In) => stat::CT_LIVE_IN,
        (Table::Open | Table::Other, Ledger::Out) => stat::CT_LIVE_OUT,
        (Table::Closed, _) => return,
    };
    count_n(reason, n);
}

#[inline(always)]
pub fn count(reason: u32) {
    count_n(reason, 1);
}

/// Adds `n` to the counter of `reason`.
#[inline(always)]
pub fn count_n(reason: u32, n: u64) {
    if let Some(counter) = STATS.get_ptr_mut(reason) {
        // SAFETY: per-CPU slot, no other writer while this program runs.
        unsafe { *counter += n };
    }
}

/// This CPU's value of the counter for `reason`, if there is one (always,
/// for a reason below `stat::COUNT`).
#[inline(always)]
pub fn stat(reason: u32) -> Option<u64> {
    STATS.get(reason).copied()
}

/// Keeps the userspace-only maps in the object so they are created, pinned
/// and described by BTF together with the others.
#[inline(always)]
pub fn keep_userspace_maps() {
    let _ = core::hint::black_box(&CT_LEDGER);
    let _ = core::hint::black_box(&OWNERS);
    let _ = core::hint::black_box(&OWNER_SLOTS);
}

// ---- node-local traffic: socket hooks and hairpin (portmap_common::local) ----

use aya_ebpf::{btf_maps::SkStorage, programs::SockAddrContext};
use portmap_common::local::{
    IfaceConfig, LocalAddrKey, MasqOwner, NodeConfig, Peer, PeerKey, SockOrigin,
};

#[btf_map(name = "node")]
static NODE: Array<NodeConfig, 1> = Array::new();

#[btf_map(name = "local_addrs")]
static LOCAL_ADDRS: HashMap<LocalAddrKey, u8, { capacity::LOCAL_ADDRS as usize }, NO_PREALLOC> =
    HashMap::new();

#[btf_map(name = "ifaces")]
static IFACES: HashMap<u32, IfaceConfig, { capacity::IFACES as usize }, NO_PREALLOC> =
    HashMap::new();

/// Containers' veths by address, for the fast path (written by ADD).
#[btf_map(name = "peers")]
static PEERS: HashMap<PeerKey, Peer, { capacity::PEERS as usize }, NO_PREALLOC> = HashMap::new();

#[btf_map(name = "sock_origin")]
static SOCK_ORIGIN: SkStorage<SockOrigin> = SkStorage::new();

#[btf_map(name = "masq_owners")]
static MASQ_OWNERS: Array<MasqOwner, { capacity::MASQ_OWNERS as usize }> = Array::new();

/// The slot of `masq_owners` (see `portmap_common::local::masq_owner_slot`).
#[inline(always)]
pub fn masq_owner(slot: u32) -> Option<*mut MasqOwner> {
    MASQ_OWNERS.get_ptr_mut(slot)
}

#[inline(always)]
pub fn node_config() -> Option<NodeConfig> {
    NODE.get(0).copied()
}

#[inline(always)]
pub fn is_local_addr(family: u8, addr_be: &[u32; 4]) -> bool {
    is_local_addr_key(&LocalAddrKey {
        addr_be: *addr_be,
        family,
        _pad0: [0; 3],
    })
}

/// Whether `key` is one of the node's addresses (a key built in scratch
/// by tc, on the stack by [`is_local_addr`]).
#[inline(always)]
pub fn is_local_addr_key(key: &LocalAddrKey) -> bool {
    LOCAL_ADDRS.get_ptr(key).is_some()
}

#[inline(always)]
pub fn peer(family: u8, addr_be: &[u32; 4]) -> Option<Peer> {
    let key = PeerKey {
        addr_be: *addr_be,
        family,
        _pad0: [0; 3],
    };
    // SAFETY: copied out at once.
    unsafe { PEERS.get(key).copied() }
}

#[inline(always)]
pub fn iface(ifindex: u32) -> Option<IfaceConfig> {
    // SAFETY: copied out at once.
    unsafe { IFACES.get(ifindex).copied() }
}

/// Stores what the socket hook translated for this socket.
#[inline(always)]
pub fn remember_origin(ctx: &SockAddrContext, origin: &SockOrigin) -> bool {
    // SAFETY: the context's socket is valid for the hook's duration.
    let slot = unsafe { SOCK_ORIGIN.get_or_insert_ptr_mut(ctx, None) };
    if slot.is_null() {
        return false;
    }
    // SAFETY: non-null storage of this socket.
    unsafe { *slot = *origin };
    true
}

#[inline(always)]
pub fn origin(ctx: &SockAddrContext) -> Option<SockOrigin> {
    // SAFETY: as above; no creation.
    let slot = unsafe { SOCK_ORIGIN.get_ptr_mut(ctx) };
    if slot.is_null() {
        None
    } else {
        // SAFETY: non-null storage of this socket.
        Some(unsafe { *slot })
    }
}

/// Network namespaces of this node's containers whose sockets the hooks
/// translate (`containerSockets`): netns cookie -> the registering owner's
/// ID. Only membership is read here; userspace writes and removes entries.
#[btf_map(name = "container_netns")]
static CONTAINER_NETNS: HashMap<u64, u64, { capacity::CONTAINER_NETNS as usize }, NO_PREALLOC> =
    HashMap::new();

/// Whether the network namespace of `netns_cookie` is a container's this
/// node registered for socket translation.
#[inline(always)]
pub fn is_container_netns(netns_cookie: u64) -> bool {
    CONTAINER_NETNS.get_ptr(netns_cookie).is_some()
}
