//! The eBPF object declares exactly the maps `portmap_common::maps` names,
//! with its capacities: the `#[btf_map]` attribute takes names and sizes as
//! written in `portmap-ebpf/src/maps.rs`, and nothing else ties the two.
//! Needs root (loading the object creates its maps; nothing is pinned).

use std::collections::BTreeSet;

use aya::{EbpfLoader, maps::Map};
use portmap_common::{
    maps::{self, capacity},
    stat,
};
use portmap_user::dataplane::object::OBJECT;

/// The kernel's `max_entries` of a map of the loaded object.
fn max_entries(map: &Map) -> u32 {
    let (Map::Array(data)
    | Map::HashMap(data)
    | Map::LruHashMap(data)
    | Map::PerCpuArray(data)
    | Map::PerCpuHashMap(data)
    | Map::RingBuf(data)
    | Map::SkStorage(data)) = map
    else {
        panic!("a map type the object does not use")
    };
    data.info().expect("map info").max_entries()
}

#[test]
fn the_object_declares_exactly_the_named_maps_with_their_capacities() {
    let ebpf = EbpfLoader::new()
        .load(OBJECT)
        .expect("load the eBPF object");
    // Sections aya turns into maps of their own (.rodata, .bss) are not ours.
    let declared: BTreeSet<&str> = ebpf
        .maps()
        .map(|(name, _)| name)
        .filter(|name| !name.starts_with('.'))
        .collect();
    let named: BTreeSet<&str> = maps::PINNED
        .iter()
        .chain(&maps::PINNED_LOCAL)
        .chain(&maps::UNPINNED)
        .chain(&[portmap_common::TRACE_LOST_MAP])
        .chain(&[portmap_common::conditions::CONDITIONS_MAP])
        .chain(&[
            portmap_common::datapath_log::MAP,
            portmap_common::datapath_log::PENDING_MAP,
        ])
        .copied()
        .collect();
    assert_eq!(
        declared, named,
        "the maps of portmap-ebpf/src/maps.rs and portmap_common::maps differ"
    );

    for (name, expected) in [
        (maps::MAPPINGS, capacity::MAPPINGS),
        (maps::OWNERS, capacity::OWNERS),
        (maps::OWNER_SLOTS, capacity::OWNER_SLOTS),
        (maps::CONNTRACK, capacity::CONNTRACK),
        (maps::STATS, stat::COUNT),
        (maps::COUNTERS, capacity::COUNTERS),
        (maps::SOCK_COUNTERS, capacity::SOCK_COUNTERS),
        (maps::TRACE_EVENTS, capacity::TRACE_EVENTS_BYTES),
        (maps::LOCAL_ADDRS, capacity::LOCAL_ADDRS),
        (maps::IFACES, capacity::IFACES),
        (maps::PEERS, capacity::PEERS),
        (
            portmap_common::datapath_log::MAP,
            portmap_common::datapath_log::BYTES,
        ),
    ] {
        let map = ebpf.map(name).unwrap_or_else(|| panic!("map {name}"));
        assert_eq!(max_entries(map), expected, "capacity of {name}");
    }
}
