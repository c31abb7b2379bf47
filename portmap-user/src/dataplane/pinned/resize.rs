//! Resizing in place: a changed `conntrackSize` (or, without it, a node
//! the formula now sizes otherwise) or `maxMappings` takes effect at the
//! next run that reconciles (ADD, the agent's pass; DEL and GC for the
//! conntrack tables), with the established flows and the live mappings
//! carried over.
//!
//! A map's `max_entries` is fixed when it is made, so a resize makes a new
//! table and swaps it in the way an upgrade swaps programs (`attach/upgrade.rs`):
//! under the pin root's lock,
//! 1. for `maxMappings`, the writers' lock is taken exclusive (see below)
//!    and the live entries counted: a map smaller than its live entries is
//!    refused, with nothing changed. Then the old tables are opened (this
//!    process's fds keep them alive) and this build's program pins removed
//!    (the links keep the programs running; a concurrent run now waits for
//!    the lock);
//! 2. the object is loaded with the tables to resize pinned at staging
//!    paths (`{name}_resized`), which makes them new and of the new size,
//!    and every other map reused;
//! 3. the live entries are copied. A conntrack table smaller than its live
//!    entries keeps the newest (by `last_seen_ns`) and the count of those
//!    dropped is logged; the mappings and their owners' index are copied
//!    whole; the traffic counters of live mappings go first;
//! 4. each staging pin is renamed over the old one (atomic), then the
//!    caller attaches the new programs everywhere: tcx links and clsact
//!    filters are updated in place (`BPF_LINK_UPDATE`), the socket hooks
//!    and the beacon relinked, exactly as after an upgrade;
//! 5. the entries the old programs made between the copy and their
//!    replacement (conntrack entries, counters of keys the copy did not
//!    see) are copied too, without overwriting the new table's; then the
//!    writers' lock is released.
//!
//! # maxMappings
//! `mappings`, `owner_slots` (twice `maxMappings`, at least the default)
//! and `counters` (`maxMappings`) are resized when the conflist sets
//! `maxMappings` and a pinned one has another size; without it they keep
//! the size they have (so a network without the key, sharing the pin root
//! with one that sets it, never sizes them back and forth).
//!
//! The ownership protocol's writers take no lock of each other
//! (`ownership/`), but every process that opens those maps holds the
//! writers' lock shared while it does (`lock::writers_shared`, taken by
//! `ownership::Store`): plugin runs never wait for each other, and a resize, which
//! takes it exclusive, copies maps nobody writes, and no run goes on
//! writing the old map after the swap (a run that starts meanwhile waits,
//! then opens the new one). A run that holds it itself (DEL and GC keep
//! their maps open while they reconcile) leaves `maxMappings` to the next
//! ADD or agent pass; a resize that cannot have it within
//! [`WRITERS_WAIT`] (a writer waiting for the pin root's lock this run
//! holds) leaves it to the next run, and says so.
//!
//! A `maxMappings` below the live mappings is refused: dropping a mapping
//! would cut a running container off its host port. The run fails with
//! the key, the live count and the size kept, and nothing is changed (the
//! conntrack tables are not resized either); an ADD fails, so the new pod
//! does not start until the conflist is fixed or containers are removed.
//! The programs only read the mappings and the index, so the old programs
//! see every mapping in the old map until they are replaced, and the new
//! ones every mapping in the new map: no packet misses its mapping.
//! Counter increments the old programs make between the copy and their
//! replacement, on keys the copy saw, are not carried (a few packets'
//! worth of statistics; no packet is affected).
//!
//! An established flow is in the new table before any packet reaches the
//! new programs. Killed midway, a run leaves either the old tables (before
//! the rename; the next run starts again) or new tables missing some
//! entries; a TCP flow without its entries is recovered by its mapping on
//! its next packet, a UDP datagram is translated anew. The mappings are
//! renamed into place only once copied whole.

use std::{path::PathBuf, time::Duration};

use aya::maps::{HashMap, Map, MapData, MapError, PerCpuHashMap};
use portmap_common::{
    CounterKey, CtEntry, CtKey, MappingCounters, MappingKey, MappingValue, OwnerSlotKey, map_names,
};

// BPF_NOEXIST: never overwrite the new table's entry, which the new
// programs keep up to date.
use crate::dataplane::{
    load::object::build_id,
    pinned::bpf_call::BPF_NOEXIST,
    pinned::lock,
    pinned::pin::PinLayout,
    pinned::sizing::{Capacities, NodeShape, Sizes},
};

/// How long a resize of the mappings waits for the runs that hold them
/// open (see the module docs): an ADD holds them for milliseconds; a run
/// still holding them after this waits for the pin root's lock, which the
/// resize holds.
pub const WRITERS_WAIT: Duration = Duration::from_secs(3);

/// The tables a resize may replace.
const TABLES: [&str; 4] = [
    map_names::CONNTRACK,
    map_names::CONNTRACK_OTHER,
    map_names::CONNTRACK_NEW,
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
    #[error("cannot copy an entry into the resized table {path}")]
    Copy {
        path: PathBuf,
        #[source]
        source: MapError,
    },
    #[error(transparent)]
    Pass(#[from] crate::dataplane::attach::pass::PassError),
    #[error(
        "maxMappings {wanted} is too small: the {map} map holds {live} live entries, and would have room for {room}; nothing was resized (it keeps its {size} entries). Set maxMappings to at least {at_least}, or remove containers first"
    )]
    TooSmall {
        wanted: u32,
        map: &'static str,
        live: usize,
        room: u32,
        size: u32,
        at_least: u32,
    },
}

/// Where a table to resize is staged.
pub fn staging(layout: &PinLayout, name: &str) -> PathBuf {
    layout.map(&format!("{name}_resized"))
}

fn pinned_size(layout: &PinLayout, name: &str) -> Option<u32> {
    aya::maps::MapInfo::from_pin(layout.map(name))
        .ok()
        .map(|info| info.max_entries())
}

/// (map, size) of the maps `maxMappings` sizes, when the conflist sets it
/// and this process may resize them (it holds none of them open).
fn mapping_tables(capacities: Capacities, sizes: &Sizes) -> Vec<(&'static str, u32)> {
    if capacities.mappings.is_none() || lock::holds_writers_shared() {
        return Vec::new();
    }
    vec![
        (map_names::MAPPINGS, sizes.mappings),
        (map_names::OWNER_SLOTS, sizes.owner_slots),
        (map_names::COUNTERS, sizes.counters),
    ]
}

/// The sizes `capacities` want, when a pinned table has another size:
/// a few read-only syscalls, no lock.
pub fn needed(layout: &PinLayout, capacities: Capacities) -> Option<Sizes> {
    let pinned = |name: &str| pinned_size(layout, name);
    let open = pinned(map_names::CONNTRACK)?;
    let sizes = Sizes::resolve(capacities, NodeShape::this());
    let differs = open != sizes.conntrack
        || pinned(map_names::CONNTRACK_OTHER).is_some_and(|n| n != sizes.conntrack)
        || pinned(map_names::CONNTRACK_NEW).is_some_and(|n| n != sizes.conntrack)
        || pinned(map_names::CONNTRACK_CLOSED).is_some_and(|n| n != sizes.conntrack_closed)
        || mapping_tables(capacities, &sizes)
            .iter()
            .any(|&(name, size)| pinned(name).is_some_and(|n| n != size));
    differs.then_some(sizes)
}

/// Removes the staging pins a run that died mid-resize left, and with
/// them this build's program pins, which may be of programs made with
/// those staged tables: the next load makes them again with the tables in
/// place. Under the pin root's lock.
fn recover(layout: &PinLayout) {
    let mut left = false;
    for name in TABLES.iter().chain(&[
        map_names::MAPPINGS,
        map_names::OWNER_SLOTS,
        map_names::COUNTERS,
    ]) {
        let path = staging(layout, name);
        if path.exists() {
            log::warn!(
                "{}: left by a resize that did not finish; removed",
                path.display()
            );
            let _ = std::fs::remove_file(path);
            left = true;
        }
    }
    if left {
        // The run that died removed the records before its first step; a
        // removal that fails here is tried again by the load.
        if let Err(error) = crate::dataplane::attach::pass::invalidate_pass(layout) {
            log::warn!("{error}");
        }
        remove_program_pins(layout);
    }
}

/// This build's program pins (the links keep the programs running).
fn remove_program_pins(layout: &PinLayout) {
    if let Ok(entries) = std::fs::read_dir(layout.progs_dir()) {
        let current = format!("{:016x}_", build_id());
        for entry in entries.flatten() {
            if entry.file_name().to_string_lossy().starts_with(&current) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
}

/// A conntrack table being resized: the old one, open, and its new size.
struct Table {
    name: &'static str,
    old: HashMap<MapData, CtKey, CtEntry>,
    size: u32,
    /// Every key the old table had at the copy, kept or dropped: the last
    /// pass carries over only the keys made since, or a shrink's dropped
    /// entries would come back and push the kept ones out.
    copied: std::cell::RefCell<std::collections::HashSet<CtKey>>,
}

/// A map `maxMappings` sizes, being resized: the old one, open.
enum Old {
    Mappings(HashMap<MapData, MappingKey, MappingValue>),
    Slots(HashMap<MapData, OwnerSlotKey, MappingKey>),
    Counters(PerCpuHashMap<MapData, CounterKey, MappingCounters>),
}

struct MappingTable {
    name: &'static str,
    old: Old,
    size: u32,
    /// The counters' keys at the copy (see [`Table::copied`]).
    copied: std::cell::RefCell<std::collections::HashSet<CounterKey>>,
}

/// A resize under way (see the module docs); made with the lock held.
pub struct Resize {
    tables: Vec<Table>,
    mapping_tables: Vec<MappingTable>,
    sizes: Sizes,
    /// The pins are of a build before the split conntrack (no
    /// `conntrack_other`): the UDP and SCTP entries of the old `conntrack`
    /// go to the `conntrack_other` the load creates, which `attach/upgrade.rs`'s
    /// migration would otherwise fill from the (new, empty) `conntrack`.
    split: bool,
    /// The writers' lock, exclusive, while the mappings are resized.
    _writers: Option<std::fs::File>,
}

fn open_old<T: TryFrom<Map, Error = MapError>>(path: &std::path::Path) -> Result<T, ResizeError> {
    let fail = |source| ResizeError::Open {
        path: path.to_path_buf(),
        source,
    };
    let data = MapData::from_pin(path).map_err(fail)?;
    Map::from_map_data(data).and_then(T::try_from).map_err(fail)
}

fn open_new<T: TryFrom<Map, Error = MapError>>(path: &std::path::Path) -> Result<T, ResizeError> {
    let fail = |source| ResizeError::Staged {
        path: path.to_path_buf(),
        source,
    };
    let data = MapData::from_pin(path).map_err(fail)?;
    Map::from_map_data(data).and_then(T::try_from).map_err(fail)
}

/// Every entry of `old` into the staged map at `path`; how many.
fn copy_whole<K: aya::Pod, V: aya::Pod>(
    old: &HashMap<MapData, K, V>,
    path: &std::path::Path,
) -> Result<usize, ResizeError> {
    let mut new: HashMap<MapData, K, V> = open_new(path)?;
    let mut n = 0usize;
    for (key, value) in old.iter().filter_map(Result::ok) {
        new.insert(key, value, 0)
            .map_err(|source| ResizeError::Copy {
                path: path.to_path_buf(),
                source,
            })?;
        n += 1;
    }
    Ok(n)
}

/// The smallest `maxMappings` whose `map` has room for `live` entries.
fn at_least(map: &str, live: usize) -> u32 {
    let live = u32::try_from(live).unwrap_or(u32::MAX);
    if map == map_names::OWNER_SLOTS {
        live.div_ceil(2)
    } else {
        live
    }
}

impl Resize {
    /// Step 1, with the pin root's lock held: `None` when nothing is to
    /// resize (any more).
    pub fn begin(
        layout: &PinLayout,
        capacities: Capacities,
    ) -> Result<Option<Resize>, ResizeError> {
        recover(layout);
        let Some(sizes) = needed(layout, capacities) else {
            return Ok(None);
        };
        let (mapping_tables, writers) = Self::begin_mappings(layout, capacities, &sizes)?;
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
            let old = open_old(&path)?;
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
        if tables.is_empty() && mapping_tables.is_empty() {
            return Ok(None);
        }
        // The first destructive step: from here on, until the attach pass
        // of the new programs is done, no run trusts the attachments.
        crate::dataplane::attach::pass::invalidate_pass(layout)?;
        // The programs are loaded anew with the new tables; the links keep
        // the old ones running until they are replaced.
        remove_program_pins(layout);
        crate::dataplane::attach::crash::point("resize-begun");
        let split = !layout.map(map_names::CONNTRACK_OTHER).exists();
        Ok(Some(Resize {
            tables,
            mapping_tables,
            sizes,
            split,
            _writers: writers,
        }))
    }

    /// The maps `maxMappings` sizes that are to resize, opened with the
    /// writers' lock held exclusive; refused when one is smaller than its
    /// live entries.
    #[allow(clippy::type_complexity)]
    fn begin_mappings(
        layout: &PinLayout,
        capacities: Capacities,
        sizes: &Sizes,
    ) -> Result<(Vec<MappingTable>, Option<std::fs::File>), ResizeError> {
        let wanted: Vec<(&'static str, u32, u32)> = mapping_tables(capacities, sizes)
            .into_iter()
            .filter_map(|(name, size)| {
                let pinned = pinned_size(layout, name)?;
                (pinned != size).then_some((name, size, pinned))
            })
            .collect();
        if wanted.is_empty() {
            return Ok((Vec::new(), None));
        }
        let writers = match lock::writers_exclusive(layout, WRITERS_WAIT) {
            Ok(file) => file,
            Err(error) => {
                log::warn!(
                    "maxMappings {}: not resized by this run ({error}); the next ADD or agent pass does it",
                    sizes.mappings
                );
                return Ok((Vec::new(), None));
            }
        };
        let mut tables = Vec::new();
        for (name, size, pinned) in wanted {
            let path = layout.map(name);
            let (old, live) = match name {
                map_names::MAPPINGS => {
                    let map: HashMap<MapData, MappingKey, MappingValue> = open_old(&path)?;
                    let live = map.keys().filter(Result::is_ok).count();
                    (Old::Mappings(map), live)
                }
                map_names::OWNER_SLOTS => {
                    let map: HashMap<MapData, OwnerSlotKey, MappingKey> = open_old(&path)?;
                    let live = map.keys().filter(Result::is_ok).count();
                    (Old::Slots(map), live)
                }
                _ => (Old::Counters(open_old(&path)?), 0),
            };
            if live > size as usize {
                return Err(ResizeError::TooSmall {
                    wanted: capacities.mappings.unwrap_or(sizes.mappings),
                    map: name,
                    live,
                    room: size,
                    size: pinned,
                    at_least: at_least(name, live),
                });
            }
            log::info!("resizing {name} from {pinned} to {size} entries (maxMappings)");
            tables.push(MappingTable {
                name,
                old,
                size,
                copied: Default::default(),
            });
        }
        Ok((tables, Some(writers)))
    }

    /// The sizes the load gives the maps it creates.
    pub fn sizes(&self) -> &Sizes {
        &self.sizes
    }

    /// (map, staging path) of every table the load must create anew.
    pub fn staged(&self, layout: &PinLayout) -> Vec<(&'static str, PathBuf)> {
        self.tables
            .iter()
            .map(|table| table.name)
            .chain(self.mapping_tables.iter().map(|table| table.name))
            .map(|name| (name, staging(layout, name)))
            .collect()
    }

    /// Steps 3 and 4, after the load: copies the live entries into the
    /// staged tables and puts them in place of the old ones. On a failure
    /// the staged tables and the programs made with them are removed, so
    /// that no run attaches programs that use them.
    pub fn copy_and_swap(&self, layout: &PinLayout) -> Result<(), ResizeError> {
        let copied = self.copy_mappings(layout).and_then(|()| {
            // Everything copied before anything is renamed.
            let mut renames: Vec<&'static str> =
                self.mapping_tables.iter().map(|table| table.name).collect();
            for table in &self.tables {
                self.copy_conntrack(layout, table)?;
                renames.push(table.name);
            }
            crate::dataplane::attach::crash::point("resize-copied");
            for name in renames {
                std::fs::rename(staging(layout, name), layout.map(name)).map_err(|source| {
                    ResizeError::Rename {
                        path: layout.map(name),
                        source,
                    }
                })?;
                crate::dataplane::attach::crash::point(&format!("resize-renamed-{name}"));
            }
            Ok(())
        });
        if let Err(error) = copied {
            for (_, path) in self.staged(layout) {
                let _ = std::fs::remove_file(path);
            }
            remove_program_pins(layout);
            return Err(error);
        }
        if let Err(error) = crate::dataplane::pinned::sizing::record(layout, &self.sizes) {
            log::warn!("{error}");
        }
        Ok(())
    }

    fn copy_conntrack(&self, layout: &PinLayout, table: &Table) -> Result<(), ResizeError> {
        let path = staging(layout, table.name);
        let mut new = open_staged(&path)?;
        let mut entries: Vec<(CtKey, CtEntry)> = table.old.iter().filter_map(Result::ok).collect();
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
        Ok(())
    }

    /// The maps `maxMappings` sizes, into their staged tables: the
    /// mappings and the index whole (no run writes them meanwhile: the
    /// writers' lock is held), the counters of live mappings first.
    fn copy_mappings(&self, layout: &PinLayout) -> Result<(), ResizeError> {
        for table in &self.mapping_tables {
            let path = staging(layout, table.name);
            let copied = match &table.old {
                Old::Mappings(old) => copy_whole(old, &path)?,
                Old::Slots(old) => copy_whole(old, &path)?,
                Old::Counters(old) => {
                    let mut new: PerCpuHashMap<MapData, CounterKey, MappingCounters> =
                        open_new(&path)?;
                    let live = live_mapping_owners(layout);
                    let (mut first, rest): (Vec<_>, Vec<_>) = old
                        .iter()
                        .filter_map(Result::ok)
                        .partition(|(key, _)| live.contains(&(key.mapping, key.owner_id)));
                    first.extend(rest);
                    let all = first.len();
                    table
                        .copied
                        .borrow_mut()
                        .extend(first.iter().map(|(key, _)| *key));
                    first.truncate(table.size as usize);
                    let mut n = 0usize;
                    for (key, values) in first {
                        match new.insert(key, values, 0) {
                            Ok(()) => n += 1,
                            Err(error) => log::warn!("copying a traffic counter: {error}"),
                        }
                    }
                    if n < all {
                        log::warn!(
                            "resizing counters: {} of {all} traffic counters dropped (of mappings gone first)",
                            all - n
                        );
                    }
                    n
                }
            };
            log::info!(
                "resizing {}: {copied} live entries carried over",
                table.name
            );
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
    /// the old programs made since the copy. Releases the writers' lock.
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
        for table in &self.mapping_tables {
            let Old::Counters(old) = &table.old else {
                continue;
            };
            let Ok(mut new) = open_new::<PerCpuHashMap<MapData, CounterKey, MappingCounters>>(
                &layout.map(table.name),
            ) else {
                continue;
            };
            for (key, values) in old
                .iter()
                .filter_map(Result::ok)
                .filter(|(key, _)| !table.copied.borrow().contains(key))
            {
                let _ = new.insert(key, values, BPF_NOEXIST);
            }
        }
        if !self.tables.is_empty() {
            // New tables with the entries copied: their ledger starts here
            // (the entries a shrink left behind were logged above).
            crate::dataplane::pinned::ledger::rebase(layout);
        }
    }
}

/// (mapping, owner) of every mapping in place.
fn live_mapping_owners(layout: &PinLayout) -> std::collections::HashSet<(MappingKey, u64)> {
    open_old::<HashMap<MapData, MappingKey, MappingValue>>(&layout.map(map_names::MAPPINGS))
        .map(|map| {
            map.iter()
                .filter_map(Result::ok)
                .map(|(key, value)| (key, value.owner_id))
                .collect()
        })
        .unwrap_or_default()
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
