//! Resizing the conntrack tables in place: a changed `conntrackSize` (or,
//! without it, a node the formula now sizes otherwise) takes effect at the
//! next run that reconciles (ADD, DEL, GC, the agent's pass), with the
//! established flows carried over.
//!
//! A map's `max_entries` is fixed when it is made, so a resize makes a new
//! table and swaps it in the way an upgrade swaps programs (`attach.rs`):
//! under the pin root's lock,
//! 1. the old tables are opened (this process's fds keep them alive) and
//!    this build's program pins removed (the links keep the programs
//!    running; a concurrent run now waits for the lock);
//! 2. the object is loaded with the tables to resize pinned at staging
//!    paths (`{name}_resized`), which makes them new and of the new size,
//!    and every other map reused;
//! 3. the live entries are copied, the newest first; a table smaller than
//!    its live entries keeps the newest (by `last_seen_ns`) and the count
//!    of those dropped is logged;
//! 4. each staging pin is renamed over the old one (atomic), then the
//!    caller attaches the new programs everywhere: tcx links and clsact
//!    filters are updated in place (`BPF_LINK_UPDATE`), the socket hooks
//!    and the beacon relinked, exactly as after an upgrade;
//! 5. the entries the old programs made between the copy and their
//!    replacement (keys the copy did not see) are copied too, without
//!    overwriting the new table's.
//!
//! `maxMappings` is not resized in place: the ownership protocol's writers
//! take no lock (`ownership.rs`), so a run that opened the old mappings map
//! would go on writing it after the swap. A changed one is logged as such.
//!
//! An established flow is in the new table before any packet reaches the
//! new programs. Killed midway, a run leaves either the old tables (before
//! the rename; the next run starts again) or new tables missing some
//! entries; a TCP flow without its entries is recovered by its mapping on
//! its next packet, a UDP datagram is translated anew.

use std::path::PathBuf;

use aya::maps::{HashMap, Map, MapData, MapError};
use portmap_common::{CtEntry, CtKey, map_names};

use crate::dataplane::{
    attach::Capacities,
    object::build_id,
    pin::PinLayout,
    sizing::{NodeShape, Sizes},
};

/// `BPF_NOEXIST` (include/uapi/linux/bpf.h): never overwrite the new
/// table's entry, which the new programs keep up to date.
const BPF_NOEXIST: u64 = 1;

/// The tables a resize may replace.
const TABLES: [&str; 3] = [
    map_names::CONNTRACK,
    map_names::CONNTRACK_OTHER,
    map_names::CONNTRACK_CLOSED,
];

#[derive(Debug, thiserror::Error)]
pub enum ResizeError {
    #[error("cannot open {path} to resize it")]
    Open {
        path: PathBuf,
        #[source]
        source: MapError,
    },
    #[error("cannot replace {path} with the resized table")]
    Rename {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read the resized table {path}")]
    Staged {
        path: PathBuf,
        #[source]
        source: MapError,
    },
}

/// Where a table to resize is staged.
pub fn staging(layout: &PinLayout, name: &str) -> PathBuf {
    layout.map(&format!("{name}_resized"))
}

/// The sizes `capacities` want, when a pinned table has another size:
/// a few read-only syscalls, no lock.
pub fn needed(layout: &PinLayout, capacities: Capacities) -> Option<Sizes> {
    let pinned = |name: &str| {
        aya::maps::MapInfo::from_pin(layout.map(name))
            .ok()
            .map(|info| info.max_entries())
    };
    let open = pinned(map_names::CONNTRACK)?;
    // maxMappings is not resized in place (the ownership protocol's
    // lock-free writers would keep writing the old map): say so when it
    // was changed. Asked only when the conflist sets it.
    if let Some(wanted) = capacities.mappings
        && let Some(pinned) = pinned(map_names::MAPPINGS)
        && pinned != wanted
    {
        log::warn!(
            "maxMappings {wanted} differs from the mappings map's {pinned}: it applies only when the maps are made (`ebpf-portmap uninstall`, or a new pinRoot)"
        );
    }
    let sizes = Sizes::resolve(capacities, NodeShape::this());
    let differs = open != sizes.conntrack
        || pinned(map_names::CONNTRACK_OTHER).is_some_and(|n| n != sizes.conntrack)
        || pinned(map_names::CONNTRACK_CLOSED).is_some_and(|n| n != sizes.conntrack_closed);
    differs.then_some(sizes)
}

/// A table being resized: the old one, open, and its new size.
struct Table {
    name: &'static str,
    old: HashMap<MapData, CtKey, CtEntry>,
    size: u32,
    /// Every key the old table had at the copy, kept or dropped: the last
    /// pass carries over only the keys made since, or a shrink's dropped
    /// entries would come back and push the kept ones out.
    copied: std::cell::RefCell<std::collections::HashSet<CtKey>>,
}

/// A resize under way (see the module docs); made with the lock held.
pub struct Resize {
    tables: Vec<Table>,
    sizes: Sizes,
    /// The pins are of a build before the split conntrack (no
    /// `conntrack_other`): the UDP and SCTP entries of the old `conntrack`
    /// go to the `conntrack_other` the load creates, which `attach.rs`'s
    /// migration would otherwise fill from the (new, empty) `conntrack`.
    split: bool,
}

impl Resize {
    /// Step 1, with the pin root's lock held: `None` when nothing is to
    /// resize (any more).
    pub fn begin(
        layout: &PinLayout,
        capacities: Capacities,
    ) -> Result<Option<Resize>, ResizeError> {
        let Some(sizes) = needed(layout, capacities) else {
            return Ok(None);
        };
        let mut tables = Vec::new();
        for name in TABLES {
            let size = if name == map_names::CONNTRACK_CLOSED {
                sizes.conntrack_closed
            } else {
                sizes.conntrack
            };
            let path = layout.map(name);
            let Ok(info) = aya::maps::MapInfo::from_pin(&path) else {
                continue;
            };
            if info.max_entries() == size {
                continue;
            }
            let fail = |source| ResizeError::Open {
                path: path.clone(),
                source,
            };
            let data = MapData::from_pin(&path).map_err(fail)?;
            let old = Map::from_map_data(data)
                .and_then(HashMap::try_from)
                .map_err(fail)?;
            // A staging pin left by a run that died.
            let _ = std::fs::remove_file(staging(layout, name));
            log::info!(
                "resizing {name} from {} to {size} entries",
                info.max_entries()
            );
            tables.push(Table {
                name,
                old,
                size,
                copied: Default::default(),
            });
        }
        // The programs are loaded anew with the new tables; the links keep
        // the old ones running until they are replaced.
        if let Ok(entries) = std::fs::read_dir(layout.progs_dir()) {
            let current = format!("{:016x}_", build_id());
            for entry in entries.flatten() {
                if entry.file_name().to_string_lossy().starts_with(&current) {
                    let _ = std::fs::remove_file(entry.path());
                }
            }
        }
        let split = !layout.map(map_names::CONNTRACK_OTHER).exists();
        Ok(Some(Resize {
            tables,
            sizes,
            split,
        }))
    }

    /// The sizes the load gives the maps it creates.
    pub fn sizes(&self) -> &Sizes {
        &self.sizes
    }

    /// (map, staging path) of every table the load must create anew.
    pub fn staged(&self, layout: &PinLayout) -> Vec<(&'static str, PathBuf)> {
        self.tables
            .iter()
            .map(|table| (table.name, staging(layout, table.name)))
            .collect()
    }

    /// Steps 3 and 4, after the load: copies the live entries into the
    /// staged tables and puts them in place of the old ones.
    pub fn copy_and_swap(&self, layout: &PinLayout) -> Result<(), ResizeError> {
        for table in &self.tables {
            let path = staging(layout, table.name);
            let mut new = open_staged(&path)?;
            let mut entries: Vec<(CtKey, CtEntry)> =
                table.old.iter().filter_map(Result::ok).collect();
            table
                .copied
                .borrow_mut()
                .extend(entries.iter().map(|(key, _)| *key));
            if self.split && table.name == map_names::CONNTRACK {
                let (tcp, other): (Vec<_>, Vec<_>) = entries
                    .into_iter()
                    .partition(|(key, _)| key.proto == portmap_common::PROTO_TCP);
                entries = tcp;
                self.copy_split(layout, other);
            }
            let (kept, dropped) = copy_newest(entries, &mut new, table.size);
            if dropped > 0 {
                log::warn!(
                    "resizing {}: {dropped} of {} live entries dropped (the table holds {}; the newest were kept)",
                    table.name,
                    kept + dropped,
                    table.size
                );
            } else {
                log::info!("resizing {}: {kept} live entries carried over", table.name);
            }
            std::fs::rename(&path, layout.map(table.name)).map_err(|source| {
                ResizeError::Rename {
                    path: layout.map(table.name),
                    source,
                }
            })?;
        }
        if let Err(error) = crate::dataplane::sizing::record(layout, &self.sizes) {
            log::warn!("{error}");
        }
        Ok(())
    }

    /// The UDP and SCTP entries of a single-table conntrack, into the
    /// `conntrack_other` the load made.
    fn copy_split(&self, layout: &PinLayout, entries: Vec<(CtKey, CtEntry)>) {
        let room = self.sizes.conntrack;
        match open_staged(&layout.map(map_names::CONNTRACK_OTHER)) {
            Ok(mut other) => {
                let (kept, dropped) = copy_newest(entries, &mut other, room);
                log::info!(
                    "conntrack split: {kept} UDP/SCTP entries copied to conntrack_other ({dropped} did not fit)"
                );
            }
            Err(error) => log::warn!("conntrack split: {error}"),
        }
    }

    /// Step 5, once the new programs are attached everywhere: the entries
    /// the old programs made since the copy.
    pub fn finish(self, layout: &PinLayout) {
        for table in &self.tables {
            let Ok(mut new) = open_staged(&layout.map(table.name)) else {
                continue;
            };
            let late: Vec<(CtKey, CtEntry)> = table
                .old
                .iter()
                .filter_map(Result::ok)
                .filter(|(key, _)| !table.copied.borrow().contains(key))
                .collect();
            let mut copied = 0usize;
            for (key, entry) in &late {
                if new.insert(key, entry, BPF_NOEXIST).is_ok() {
                    copied += 1;
                }
            }
            if copied > 0 {
                log::info!(
                    "resizing {}: {copied} entries made during the swap carried over",
                    table.name
                );
            }
        }
    }
}

fn open_staged(path: &std::path::Path) -> Result<HashMap<MapData, CtKey, CtEntry>, ResizeError> {
    let fail = |source| ResizeError::Staged {
        path: path.to_path_buf(),
        source,
    };
    let data = MapData::from_pin(path).map_err(fail)?;
    Map::from_map_data(data)
        .and_then(HashMap::try_from)
        .map_err(fail)
}

/// Copies `entries` into `new`, at most `room` of them, the most recently
/// seen first; returns (kept, dropped).
fn copy_newest(
    entries: Vec<(CtKey, CtEntry)>,
    new: &mut HashMap<MapData, CtKey, CtEntry>,
    room: u32,
) -> (usize, usize) {
    let keep = newest(entries, room as usize);
    let mut kept = 0usize;
    for (key, entry) in &keep.0 {
        match new.insert(key, entry, 0) {
            Ok(()) => kept += 1,
            Err(error) => log::warn!("copying a conntrack entry: {error}"),
        }
    }
    (kept, keep.1)
}

/// The `room` most recently seen of `entries`, oldest first (so that an
/// LRU that had to evict would evict those), and how many did not fit.
fn newest(mut entries: Vec<(CtKey, CtEntry)>, room: usize) -> (Vec<(CtKey, CtEntry)>, usize) {
    entries.sort_by_key(|(_, entry)| std::cmp::Reverse(entry.last_seen_ns));
    let dropped = entries.len().saturating_sub(room);
    entries.truncate(room);
    entries.reverse();
    (entries, dropped)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(port: u16, last_seen_ns: u64) -> (CtKey, CtEntry) {
        (
            CtKey {
                src_port_be: port.to_be(),
                ..CtKey::default()
            },
            CtEntry {
                last_seen_ns,
                ..CtEntry::default()
            },
        )
    }

    #[test]
    fn a_shrink_keeps_the_newest_and_counts_the_rest() {
        let entries = vec![entry(1, 10), entry(2, 30), entry(3, 20), entry(4, 5)];
        let (kept, dropped) = newest(entries.clone(), 2);
        assert_eq!(dropped, 2);
        let seen: Vec<u64> = kept.iter().map(|(_, e)| e.last_seen_ns).collect();
        assert_eq!(seen, vec![20, 30], "the two newest, oldest first");
        let (kept, dropped) = newest(entries, 10);
        assert_eq!((kept.len(), dropped), (4, 0));
    }

    #[test]
    fn staging_pins_have_no_dots() {
        let layout = PinLayout::new("/sys/fs/bpf/x");
        let path = staging(&layout, map_names::CONNTRACK_CLOSED);
        assert!(!path.file_name().unwrap().to_string_lossy().contains('.'));
        assert_eq!(path, layout.map("conntrack_close_resized"));
    }
}
