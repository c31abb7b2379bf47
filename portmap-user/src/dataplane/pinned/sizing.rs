//! How big the maps are, and why: the sizes a load or a resize gives the
//! maps, from the conflist (`conntrackSize`, `maxMappings`) or, without
//! `conntrackSize`, from the node's memory and CPUs; the record of that
//! choice for `status` and `version`; and what the maps cost the kernel.
//!
//! # The conntrack formula
//! The four conntrack tables are LRU hashes, which the kernel always
//! preallocates (`BPF_F_NO_PREALLOC` is refused for them: `-ENOTSUPP` in
//! `htab_map_alloc_check`), so their whole size is charged from the first
//! ADD on, to the memory cgroup of the process that made them (the
//! container runtime's). Without `conntrackSize`:
//!
//! ```text
//! conntrack = conntrack_other = conntrack_new
//!           = clamp(pow2_floor(node memory in MiB),
//!                   pow2_ceil(max(4096, 512 x CPUs)),
//!                   262144)
//! conntrack_close             = max(conntrack / 4, 1024, 512 x CPUs)
//! ```
//!
//! One entry per MiB of RAM: 16 384 entries (8 192 translated flows) per
//! open table on a 24 GiB node, about 0.02% of its memory for all three.
//! The CPU floor is for the LRU's per-CPU free lists: each CPU may hold up
//! to 128 free entries (`LOCAL_FREE_TARGET` in `kernel/bpf/bpf_lru_list.c`)
//! that other CPUs only take after evicting, so a table of at least 512
//! entries per CPU never has more than a quarter of itself stranded there.
//! CPUs are the possible ones, which the kernel sizes per-CPU memory by.
//! An explicit `conntrackSize` sets the two tables of assured flows and
//! `conntrack_new` (flows not yet assured, where a flood's entries evict
//! each other: as big as the others, so a burst of honest new flows as
//! large as the assured table can be made assured before it is evicted);
//! the closed one is a quarter of it, with the same floors.

use std::path::PathBuf;

use aya::maps::{Array, MapData};
use portmap_common::{capacity, map_names};

use crate::dataplane::pinned::pin::PinLayout;

/// Map sizes chosen by configuration (`None`: the default, see the module
/// docs); they apply when the maps are created, and a change resizes them
/// in place (see `resize`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Capacities {
    pub mappings: Option<u32>,
    pub conntrack: Option<u32>,
}

/// Smallest default open table (entries), whatever the node.
pub const CONNTRACK_FLOOR: u32 = 4096;
/// Largest default open table: the size of every build before the formula.
pub const CONNTRACK_CEILING: u32 = capacity::CONNTRACK;
/// Entries per CPU an LRU table has at least (see the module docs).
pub const LRU_ENTRIES_PER_CPU: u32 = 512;

/// What the formula reads of the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeShape {
    pub memory_bytes: u64,
    /// Possible CPUs (`/sys/devices/system/cpu/possible`).
    pub cpus: u32,
}

impl NodeShape {
    /// This node: total RAM from `sysinfo(2)`, the possible CPUs from sysfs
    /// (the online count when sysfs cannot be read).
    pub fn this() -> NodeShape {
        // SAFETY: sysinfo fills the struct we own.
        let memory_bytes = unsafe {
            let mut info: libc::sysinfo = std::mem::zeroed();
            if libc::sysinfo(&raw mut info) == 0 {
                (info.totalram as u64).saturating_mul(u64::from(info.mem_unit.max(1)))
            } else {
                0
            }
        };
        let cpus = std::fs::read_to_string("/sys/devices/system/cpu/possible")
            .ok()
            .and_then(|text| portmap_common::cpus::count_cpu_list(&text))
            .or_else(|| {
                std::thread::available_parallelism()
                    .ok()
                    .map(|n| n.get() as u32)
            })
            .unwrap_or(1);
        NodeShape { memory_bytes, cpus }
    }

    pub fn memory_mib(self) -> u64 {
        self.memory_bytes >> 20
    }
}

/// The default open conntrack table for `node` (see the module docs).
pub fn conntrack_for(node: NodeShape) -> u32 {
    let by_memory = u32::try_from(node.memory_mib()).unwrap_or(u32::MAX);
    let by_memory = if by_memory == 0 {
        0
    } else {
        1 << (31 - by_memory.leading_zeros())
    };
    let floor = CONNTRACK_FLOOR
        .max(node.cpus.saturating_mul(LRU_ENTRIES_PER_CPU))
        .checked_next_power_of_two()
        .unwrap_or(CONNTRACK_CEILING);
    by_memory.max(floor).min(CONNTRACK_CEILING.max(floor))
}

/// The closed-flow table beside an open table of `size` entries.
pub fn closed_for(size: u32, cpus: u32) -> u32 {
    capacity::conntrack_closed(size).max(cpus.saturating_mul(LRU_ENTRIES_PER_CPU))
}

/// Where a size comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Computed: the node formula (conntrack) or the build's default (mappings).
    Default,
    /// Set in the conflist.
    Conflist,
}

impl Source {
    fn code(self) -> u32 {
        match self {
            Source::Default => 1,
            Source::Conflist => 2,
        }
    }

    fn from_code(code: u32) -> Option<Source> {
        match code {
            1 => Some(Source::Default),
            2 => Some(Source::Conflist),
            _ => None,
        }
    }
}

/// Every size a load gives the maps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sizes {
    /// `conntrack` and `conntrack_other`.
    pub conntrack: u32,
    pub conntrack_closed: u32,
    pub conntrack_source: Source,
    pub mappings: u32,
    /// Two index slots per mapping leave room for re-ADDs.
    pub owner_slots: u32,
    /// At most one counter entry per mapping is live.
    pub counters: u32,
    pub mappings_source: Source,
    pub node: NodeShape,
}

impl Sizes {
    /// The sizes for `capacities` (the conflist's) on `node`.
    pub fn resolve(capacities: Capacities, node: NodeShape) -> Sizes {
        let (conntrack, conntrack_source) = match capacities.conntrack {
            Some(size) => (size, Source::Conflist),
            None => (conntrack_for(node), Source::Default),
        };
        let (mappings, mappings_source) = match capacities.mappings {
            Some(size) => (size, Source::Conflist),
            None => (capacity::MAPPINGS, Source::Default),
        };
        Sizes {
            conntrack,
            conntrack_closed: closed_for(conntrack, node.cpus),
            conntrack_source,
            mappings,
            owner_slots: mappings.saturating_mul(2).max(capacity::OWNER_SLOTS),
            counters: if capacities.mappings.is_some() {
                mappings
            } else {
                capacity::COUNTERS
            },
            mappings_source,
            node,
        }
    }

    /// (map, max_entries) of every map whose size these are.
    pub fn entries(&self) -> [(&'static str, u32); 7] {
        [
            (map_names::CONNTRACK, self.conntrack),
            (map_names::CONNTRACK_OTHER, self.conntrack),
            (map_names::CONNTRACK_NEW, self.conntrack),
            (map_names::CONNTRACK_CLOSED, self.conntrack_closed),
            (map_names::MAPPINGS, self.mappings),
            (map_names::OWNER_SLOTS, self.owner_slots),
            (map_names::COUNTERS, self.counters),
        ]
    }

    /// Gives the loader these sizes (they apply to the maps it creates).
    pub fn apply(&self, loader: &mut aya::EbpfLoader<'_>) {
        for (name, size) in self.entries() {
            loader.map_max_entries(name, size);
        }
    }
}

// ---- the record -------------------------------------------------------------

/// Pinned under `maps/` as `sizing`: an array of `u32` that says where the
/// sizes in force come from, written whenever a load or a resize sets them.
pub const RECORD: &str = "sizing";
const RECORD_ENTRIES: u32 = 8;
const CONNTRACK_SOURCE: u32 = 0;
const MAPPINGS_SOURCE: u32 = 1;
const MEMORY_MIB: u32 = 2;
const CPUS: u32 = 3;

/// What the record says: where each size came from, and the node the
/// formula read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recorded {
    pub conntrack_source: Option<Source>,
    pub mappings_source: Option<Source>,
    pub node: NodeShape,
}

#[derive(Debug, thiserror::Error)]
#[error("cannot record the map sizes in {path}")]
pub struct RecordError {
    path: PathBuf,
    #[source]
    source: aya::maps::MapError,
}

/// Records where `sizes` come from (replacing an earlier record).
pub fn record(layout: &PinLayout, sizes: &Sizes) -> Result<(), RecordError> {
    let path = layout.map(RECORD);
    let fail = |source| RecordError {
        path: path.clone(),
        source,
    };
    let mib = u32::try_from(sizes.node.memory_mib()).unwrap_or(u32::MAX);
    let values = [
        (CONNTRACK_SOURCE, sizes.conntrack_source.code()),
        (MAPPINGS_SOURCE, sizes.mappings_source.code()),
        (MEMORY_MIB, mib),
        (CPUS, sizes.node.cpus),
    ];
    let write = |record: &mut Array<MapData, u32>| {
        values
            .iter()
            .try_for_each(|&(index, value)| record.set(index, value, 0))
    };
    if let Ok(data) = MapData::from_pin(&path) {
        let mut record = Array::try_from(aya::maps::Map::Array(data)).map_err(fail)?;
        return write(&mut record).map_err(fail);
    }
    let mut record = Array::<MapData, u32>::create(RECORD_ENTRIES, 0).map_err(fail)?;
    write(&mut record).map_err(fail)?;
    if let Err(error) = record.pin(&path) {
        // Another run pinned one first: write there.
        log::debug!("pinning {}: {error}", path.display());
        let data = MapData::from_pin(&path).map_err(fail)?;
        let mut record = Array::try_from(aya::maps::Map::Array(data)).map_err(fail)?;
        write(&mut record).map_err(fail)?;
    }
    Ok(())
}

/// The record under `layout`, if a load of this build or later wrote one.
pub fn recorded(layout: &PinLayout) -> Option<Recorded> {
    let data = MapData::from_pin(layout.map(RECORD)).ok()?;
    let record: Array<MapData, u32> = Array::try_from(aya::maps::Map::Array(data)).ok()?;
    let get = |index| record.get(&index, 0).unwrap_or(0);
    Some(Recorded {
        conntrack_source: Source::from_code(get(CONNTRACK_SOURCE)),
        mappings_source: Source::from_code(get(MAPPINGS_SOURCE)),
        node: NodeShape {
            memory_bytes: u64::from(get(MEMORY_MIB)) << 20,
            cpus: get(CPUS),
        },
    })
}

/// Why the conntrack tables have the size they have, in words.
pub fn conntrack_reason(recorded: Option<&Recorded>) -> String {
    match recorded {
        Some(Recorded {
            conntrack_source: Some(Source::Conflist),
            ..
        }) => "conntrackSize in the conflist".into(),
        Some(Recorded {
            conntrack_source: Some(Source::Default),
            node,
            ..
        }) => format!(
            "node formula: {} MiB of memory, {} CPUs",
            node.memory_mib(),
            node.cpus
        ),
        _ => "set when the maps were made (no record: a build before the formula)".into(),
    }
}

/// Why the mappings map has the size it has, in words.
pub fn mappings_reason(recorded: Option<&Recorded>) -> String {
    match recorded.and_then(|r| r.mappings_source) {
        Some(Source::Conflist) => "maxMappings in the conflist".into(),
        Some(Source::Default) => "the default".into(),
        None => "set when the maps were made (no record: a build before the formula)".into(),
    }
}

// ---- what is in force --------------------------------------------------------

/// The sizes of the pinned maps, where they come from, and what the kernel
/// charges for each pinned map now.
#[derive(Debug, Clone, Default)]
pub struct InForce {
    /// max_entries of `conntrack`, `conntrack_other`, `conntrack_new`,
    /// `conntrack_close`.
    pub conntrack: Option<u32>,
    pub conntrack_other: Option<u32>,
    pub conntrack_new: Option<u32>,
    pub conntrack_closed: Option<u32>,
    pub mappings: Option<u32>,
    pub recorded: Option<Recorded>,
    /// `memlock` of every pinned map, by pin name (`bytes_memlock` in
    /// bpftool: what the kernel charges the map, which grows with the
    /// entries of a non-preallocated hash on Linux 6.4 and later).
    pub memory: Vec<(String, u64)>,
}

impl InForce {
    /// Reads the pinned maps under `layout` (nothing when none are pinned).
    pub fn read(layout: &PinLayout) -> InForce {
        let max = |name: &str| {
            aya::maps::MapInfo::from_pin(layout.map(name))
                .ok()
                .map(|info| info.max_entries())
        };
        let mut memory = Vec::new();
        if let Ok(entries) = std::fs::read_dir(layout.maps_dir()) {
            for entry in entries.flatten() {
                if let Some(bytes) = pinned_memlock(&entry.path()) {
                    memory.push((entry.file_name().to_string_lossy().into_owned(), bytes));
                }
            }
        }
        memory.sort();
        InForce {
            conntrack: max(map_names::CONNTRACK),
            conntrack_other: max(map_names::CONNTRACK_OTHER),
            conntrack_new: max(map_names::CONNTRACK_NEW),
            conntrack_closed: max(map_names::CONNTRACK_CLOSED),
            mappings: max(map_names::MAPPINGS),
            recorded: recorded(layout),
            memory,
        }
    }

    /// What the kernel charges for the pinned maps, in all.
    pub fn memory_bytes(&self) -> u64 {
        self.memory.iter().map(|(_, bytes)| bytes).sum()
    }
}

/// The kernel's `memlock` of the map pinned at `path`: the line of that
/// name in the fdinfo of an fd of it.
pub fn pinned_memlock(path: &std::path::Path) -> Option<u64> {
    use std::os::fd::{AsFd as _, AsRawFd as _};
    let data = MapData::from_pin(path).ok()?;
    let fd = data.fd().as_fd().as_raw_fd();
    let text = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).ok()?;
    memlock_in_fdinfo(&text)
}

fn memlock_in_fdinfo(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|line| line.strip_prefix("memlock:"))
        .and_then(|value| value.trim().parse().ok())
}

// ---- what the maps cost -----------------------------------------------------

/// Memory the kernel charges for the maps, as `bytes_memlock` reports it
/// (`htab_map_mem_usage`, `array_map_mem_usage` in kernel/bpf, Linux 6.4
/// and later), for `cpus` possible CPUs. Sizes of the kernel's structures
/// are those of x86_64 without lock debugging.
pub mod cost {
    /// `struct bucket`: an hlist head and a raw spinlock.
    const BUCKET: u64 = 16;
    /// `struct htab_elem` up to its key.
    const HTAB_ELEM: u64 = 48;
    /// `struct llist_node`, per entry of a non-preallocated hash.
    const LLIST_NODE: u64 = 8;
    /// `struct bpf_htab` (measured: 960 bytes beside the buckets and
    /// elements on 6.18 with 2 CPUs, 64 of them the locks).
    const HTAB: u64 = 896;
    /// `HASHTAB_MAP_LOCK_COUNT` ints per possible CPU.
    const LOCKS_PER_CPU: u64 = 8 * 4;

    fn round8(n: u64) -> u64 {
        n.div_ceil(8) * 8
    }

    fn buckets(max_entries: u32) -> u64 {
        u64::from(max_entries.max(1).next_power_of_two()) * BUCKET
    }

    /// A preallocated hash or LRU hash: every element from the start.
    pub fn prealloc_hash(max_entries: u32, key: u64, value: u64, cpus: u32) -> u64 {
        let elem = HTAB_ELEM + round8(key) + round8(value);
        HTAB + LOCKS_PER_CPU * u64::from(cpus)
            + buckets(max_entries)
            + elem * u64::from(max_entries)
    }

    /// A `BPF_F_NO_PREALLOC` hash holding `entries`.
    pub fn lazy_hash(max_entries: u32, key: u64, value: u64, entries: u64, cpus: u32) -> u64 {
        let elem = HTAB_ELEM + round8(key) + round8(value);
        HTAB + LOCKS_PER_CPU * u64::from(cpus)
            + buckets(max_entries)
            + (elem + LLIST_NODE) * entries
    }

    /// A `BPF_F_NO_PREALLOC` per-CPU hash holding `entries`.
    pub fn lazy_percpu_hash(
        max_entries: u32,
        key: u64,
        value: u64,
        entries: u64,
        cpus: u32,
    ) -> u64 {
        // The element holds a pointer to the per-CPU values.
        let elem = HTAB_ELEM + round8(key) + 8;
        HTAB + LOCKS_PER_CPU * u64::from(cpus)
            + buckets(max_entries)
            + (elem + LLIST_NODE) * entries
            + (LLIST_NODE + 8) * entries
            + round8(value) * u64::from(cpus) * entries
    }

    /// An array (not per CPU).
    pub fn array(max_entries: u32, value: u64) -> u64 {
        // `struct bpf_array`, then the values back to back.
        320 + u64::from(max_entries) * round8(value)
    }

    /// A per-CPU array.
    pub fn percpu_array(max_entries: u32, value: u64, cpus: u32) -> u64 {
        let entries = u64::from(max_entries);
        // `struct bpf_array` and the per-entry pointer.
        320 + entries * 8 + entries * round8(value) * u64::from(cpus)
    }
}

/// What the pinned maps cost, by part, for `sizes` with `cpus` possible
/// CPUs and `mappings` port mappings (each its own owner, each with
/// traffic): the conntrack tables (fixed), the other tables, and the
/// per-CPU maps. Open flows cost nothing more: their tables are
/// preallocated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Footprint {
    pub conntrack: u64,
    pub tables: u64,
    pub per_cpu: u64,
}

impl Footprint {
    pub fn total(&self) -> u64 {
        self.conntrack + self.tables + self.per_cpu
    }
}

/// `bytes_memlock` of the programs' log ring buffer
/// (`portmap_common::datapath_log`, 128 KiB of data), as bpftool reported
/// it on Linux 6.18: the pages and the kernel's bookkeeping of them.
const DATAPATH_LOG_MEMLOCK: u64 = 144_200;

/// The pinned maps' `bytes_memlock` for `sizes` on `cpus` CPUs with
/// `mappings` mappings (see [`Footprint`]).
pub fn footprint(sizes: &Sizes, cpus: u32, mappings: u64) -> Footprint {
    use portmap_common::{
        CounterKey, CtEntry, CtKey, MappingCounters, MappingKey, MappingValue, OwnerRecord,
        OwnerSlotKey, PodRecord, PortKey, SPECIFIC_PORTS_CAPACITY, SandboxRecord, local, stat,
    };
    let size = |n: usize| n as u64;
    let (ct_key, ct_value) = (size(size_of::<CtKey>()), size(size_of::<CtEntry>()));
    let conntrack = 3 * cost::prealloc_hash(sizes.conntrack, ct_key, ct_value, cpus)
        + cost::prealloc_hash(sizes.conntrack_closed, ct_key, ct_value, cpus);
    let lazy = |max, key, value, entries| cost::lazy_hash(max, key, value, entries, cpus);
    let tables = lazy(
        sizes.mappings,
        size(size_of::<MappingKey>()),
        size(size_of::<MappingValue>()),
        mappings,
    ) + lazy(
        capacity::OWNERS,
        8,
        size(size_of::<OwnerRecord>()),
        mappings,
    ) + lazy(
        sizes.owner_slots,
        size(size_of::<OwnerSlotKey>()),
        size(size_of::<MappingKey>()),
        mappings,
    ) + lazy(capacity::OWNERS, 8, size(size_of::<PodRecord>()), mappings)
        + lazy(capacity::OWNERS, 8, size(size_of::<SandboxRecord>()), mappings)
        + lazy(SPECIFIC_PORTS_CAPACITY, size(size_of::<PortKey>()), 4, 0)
        + lazy(
            capacity::LOCAL_ADDRS,
            size(size_of::<local::LocalAddrKey>()),
            1,
            8,
        )
        + lazy(capacity::IFACES, 4, size(size_of::<local::IfaceConfig>()), 4)
        + lazy(
            capacity::PEERS,
            size(size_of::<local::PeerKey>()),
            size(size_of::<local::Peer>()),
            mappings,
        )
        // container_netns, pinned with the programs: one entry per
        // container only with `containerSockets` (off by default), so none
        // here; its userspace twin `owner_netns` is made by the first ADD
        // with the option, so it is not here either.
        + lazy(capacity::CONTAINER_NETNS, 8, 8, 0)
        // mapped_ports (48 KiB), the epoch, verb_stats: mmapable arrays,
        // page-rounded; the small records.
        + 53_248 + 2 * 8_192 + 4 * 400
        // masq_owners: the last client of each masquerade tuple.
        + cost::array(
            portmap_common::capacity::MASQ_OWNERS,
            size(size_of::<local::MasqOwner>()),
        )
        // The programs' log (AYA_LOGS, a 128 KiB ring buffer): what bpftool
        // reported for it on 6.18.
        + DATAPATH_LOG_MEMLOCK;
    let per_cpu = cost::lazy_percpu_hash(
        sizes.counters,
        size(size_of::<CounterKey>()),
        size(size_of::<MappingCounters>()),
        mappings,
        cpus,
    )
        // sock_counters: only mappings node processes dial, so none here.
        + cost::lazy_percpu_hash(
            capacity::SOCK_COUNTERS,
            size(size_of::<CounterKey>()),
            size(size_of::<local::SockCounters>()),
            0,
            cpus,
        )
        + cost::percpu_array(stat::COUNT, 8, cpus)
        + cost::percpu_array(1, 8, cpus);
    Footprint {
        conntrack,
        tables,
        per_cpu,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn node(gib: u64, cpus: u32) -> NodeShape {
        NodeShape {
            memory_bytes: gib * GIB,
            cpus,
        }
    }

    #[test]
    fn the_formula_gives_one_entry_per_mib_between_its_floors_and_ceiling() {
        assert_eq!(conntrack_for(node(24, 2)), 16384, "24 GiB, 2 CPUs");
        assert_eq!(
            conntrack_for(node(2, 2)),
            CONNTRACK_FLOOR,
            "2 GiB: the floor"
        );
        assert_eq!(conntrack_for(node(512, 64)), CONNTRACK_CEILING, "512 GiB");
        assert_eq!(conntrack_for(node(24, 64)), 32768, "64 CPUs: 512 per CPU");
        assert_eq!(
            conntrack_for(node(24, 256)),
            131072,
            "256 CPUs: 512 per CPU"
        );
        assert_eq!(
            conntrack_for(node(4096, 1024)),
            524288,
            "more CPUs than the ceiling allows: the CPU floor wins"
        );
        assert_eq!(conntrack_for(node(0, 1)), CONNTRACK_FLOOR);
    }

    #[test]
    fn the_closed_table_is_a_quarter_with_the_cpu_floor() {
        assert_eq!(closed_for(16384, 2), 4096);
        assert_eq!(closed_for(1024, 2), 1024, "conntrackSize 1024 as before");
        assert_eq!(closed_for(131072, 256), 131072, "512 per CPU");
    }

    #[test]
    fn explicit_sizes_win_and_say_so() {
        let sizes = Sizes::resolve(
            Capacities {
                mappings: Some(1000),
                conntrack: Some(2048),
            },
            node(24, 2),
        );
        assert_eq!(sizes.conntrack, 2048);
        assert_eq!(sizes.conntrack_closed, 1024);
        assert_eq!(sizes.conntrack_source, Source::Conflist);
        assert_eq!(sizes.mappings, 1000);
        assert_eq!(sizes.owner_slots, capacity::OWNER_SLOTS);
        assert_eq!(sizes.counters, 1000);
        let default = Sizes::resolve(Capacities::default(), node(24, 2));
        assert_eq!(default.conntrack_source, Source::Default);
        assert_eq!(default.mappings, capacity::MAPPINGS);
        assert_eq!(default.counters, capacity::COUNTERS);
    }

    #[test]
    fn memlock_is_read_from_fdinfo() {
        let text = "pos:\t0\nflags:\t02000002\nmap_type:\t9\nmemlock:\t2622400\nmap_id:\t7\n";
        assert_eq!(memlock_in_fdinfo(text), Some(2_622_400));
        assert_eq!(memlock_in_fdinfo("pos:\t0\n"), None);
    }

    /// README's footprint table is what [`footprint`] computes for those
    /// nodes with the default conflist: change one, and this says which
    /// row to change in the other.
    #[test]
    fn the_readme_footprint_table_is_the_model() {
        let readme = include_str!("../../../../README.md");
        let rows = [
            ("2 GiB, 2 CPUs", 2, 2),
            ("24 GiB, 2 CPUs", 24, 2),
            ("24 GiB, 64 CPUs", 24, 64),
            ("256 GiB, 64 CPUs", 256, 64),
            ("24 GiB, 256 CPUs", 24, 256),
            ("1 TiB, 256 CPUs", 1024, 256),
        ];
        for (label, gib, cpus) in rows {
            let sizes = Sizes::resolve(Capacities::default(), node(gib, cpus));
            let mib = |mappings| {
                format!(
                    "{:.1}",
                    footprint(&sizes, cpus, mappings).total() as f64 / (1u64 << 20) as f64
                )
            };
            let cells: Vec<String> = vec![
                label.to_owned(),
                format!("{} / {}", sizes.conntrack, sizes.conntrack_closed),
                mib(0),
                mib(1000),
                mib(10_000),
            ];
            let line = readme
                .lines()
                .find(|line| line.starts_with(&format!("| {label} |")))
                .unwrap_or_else(|| panic!("README has no footprint row for {label}"));
            let found: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
            for (i, cell) in cells.iter().enumerate() {
                assert!(
                    found.get(i).is_some_and(|f| f.starts_with(cell.as_str())),
                    "README's row {line:?}: column {} should read {cell} (computed: {cells:?})",
                    i + 1
                );
            }
        }
    }

    /// The model against what the kernel reported for one map of each kind
    /// (bpftool, Linux 6.18, 2 CPUs): a 262 144-entry conntrack LRU, the
    /// 65 536-entry mappings hash with two entries (IPv4 and IPv6).
    #[test]
    fn the_cost_model_matches_the_kernels_accounting() {
        assert_eq!(cost::prealloc_hash(262144, 40, 56, 2), 41_944_000);
        assert_eq!(cost::prealloc_hash(65536, 40, 56, 2), 10_486_720);
        assert_eq!(cost::lazy_hash(65536, 20, 32, 2, 2), 1_049_760);
    }
}
