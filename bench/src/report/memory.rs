//! The memory section's table: kernel-charged memory and entries of
//! ebpf-portmap's pinned maps in each measured state.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::memory::{self, MapInfo};
use crate::results::Results;

/// One row per state of the node, one column per map.
pub(super) fn memory_section(md: &mut String, results: &Results) {
    let _ = writeln!(md, "## Memory\n");
    let _ = writeln!(
        md,
        "Kernel-charged memory (`bytes_memlock`) of ebpf-portmap's pinned maps, and their entry counts. \
         Mappings are stored once per address family (the container is dual-stack), so N requested \
         mappings are 2N `mappings` entries.\n"
    );
    let names: Vec<String> = results
        .memory
        .iter()
        .flat_map(|m| m.maps.keys().cloned())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let _ = write!(
        md,
        "| state | requested mappings | mappings entries | conntrack entries |"
    );
    for name in &names {
        let _ = write!(md, " {name} |");
    }
    let _ = writeln!(md, " total |");
    let _ = write!(md, "| --- | --- | --- | --- |");
    for _ in &names {
        let _ = write!(md, " --- |");
    }
    let _ = writeln!(md, " --- |");
    for row in &results.memory {
        let _ = write!(
            md,
            "| {} | {} | {} | {} |",
            row.state,
            row.requested_mappings,
            total_entries(&row.maps, "mappings"),
            conntrack_entries(&row.maps)
        );
        for name in &names {
            let _ = write!(
                md,
                " {} |",
                row.maps
                    .get(name)
                    .map_or("n/a".into(), |m| mib(m.bytes_memlock))
            );
        }
        let _ = writeln!(md, " {} |", mib(memory::total_memlock(&row.maps)));
    }
}

fn total_entries(maps: &BTreeMap<String, MapInfo>, name: &str) -> String {
    maps.get(name)
        .and_then(|m| m.entries)
        .map_or("n/a".into(), |e| e.to_string())
}

/// Entries of the conntrack tables together (see
/// `memory::CONNTRACK_TABLES`), `n/a` when none is pinned.
fn conntrack_entries(maps: &BTreeMap<String, MapInfo>) -> String {
    let counts: Vec<u64> = memory::CONNTRACK_TABLES
        .iter()
        .filter_map(|name| maps.get(*name).and_then(|m| m.entries))
        .collect();
    if counts.is_empty() {
        "n/a".into()
    } else {
        counts.iter().sum::<u64>().to_string()
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.2} MiB", bytes as f64 / (1024.0 * 1024.0))
}
