//! The conntrack ledger (see [`portmap_common::ct_ledger`]): how many
//! entries the tables evicted, the flood's unreplied ones and live flows'
//! apart, and the sweep of expired entries that keeps the second count
//! honest.
//!
//! An LRU table keeps an idled-out entry until it evicts it: without a
//! sweep, a table full of flows that ended long ago would count every one
//! of them as a live flow evicted. The sweep (the agent's GC timer,
//! `ebpf-portmap gc --expired-flows`) removes what the programs would no
//! longer use (past its timeout, as the programs judge it) and books it in
//! the ledger, so that what the ledger calls evicted from the assured
//! tables was alive within the last sweep's interval.

use std::io;
use std::os::fd::AsFd as _;
use std::sync::atomic::Ordering;

use aya::maps::{HashMap, MapData};
use portmap_common::{CtEntry, CtKey, ct_ledger, ct_timeout, map_names, stat};

use crate::dataplane::pinned::{
    bpf_call,
    maps::{self, MappedArray},
    pin::PinLayout,
};

/// `CLOCK_MONOTONIC` in nanoseconds: the clock of the flows'
/// `last_seen_ns` (`bpf_ktime_get_coarse_ns`, the same clock at tick
/// resolution).
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A group of tables with one ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Group {
    /// `conntrack_new`: flows not yet assured (a flood's, scans, one-shot
    /// datagrams).
    Unreplied,
    /// `conntrack` and `conntrack_other`: assured (live) flows, and the
    /// node's own flows' pass entries.
    Live,
}

impl Group {
    pub const ALL: [Group; 2] = [Group::Unreplied, Group::Live];

    pub fn tables(self) -> &'static [&'static str] {
        match self {
            Group::Unreplied => &[map_names::CONNTRACK_NEW],
            Group::Live => &[map_names::CONNTRACK, map_names::CONNTRACK_OTHER],
        }
    }

    /// The index of userspace's part in the `ct_ledger` map.
    fn adjust_index(self) -> usize {
        match self {
            Group::Unreplied => ct_ledger::NEW_ADJUST as usize,
            Group::Live => ct_ledger::LIVE_ADJUST as usize,
        }
    }

    /// The programs' counters of entries written to and taken from it.
    fn reasons(self) -> (u32, u32) {
        match self {
            Group::Unreplied => (stat::CT_NEW_IN, stat::CT_NEW_OUT),
            Group::Live => (stat::CT_LIVE_IN, stat::CT_LIVE_OUT),
        }
    }

    /// Its name in `status -o json` and the metrics' label.
    pub fn name(self) -> &'static str {
        match self {
            Group::Unreplied => "unreplied",
            Group::Live => "live",
        }
    }
}

/// The pinned `ct_ledger` map, mapped into this process.
pub struct Ledger {
    words: MappedArray,
}

impl Ledger {
    /// The ledger of `layout`; `None` when it is not pinned (nothing
    /// installed, or pins of a build before it).
    pub fn open(layout: &PinLayout) -> io::Result<Option<Ledger>> {
        let path = layout.map(map_names::CT_LEDGER);
        if !path.exists() {
            return Ok(None);
        }
        let data = MapData::from_pin(&path).map_err(io::Error::other)?;
        let words = MappedArray::of(&data, ct_ledger::LEN as usize)?;
        Ok(Some(Ledger { words }))
    }

    pub fn value(&self, index: u32) -> u64 {
        self.words.word(index as usize).load(Ordering::SeqCst)
    }

    pub fn store(&self, index: u32, value: u64) {
        self.words
            .word(index as usize)
            .store(value, Ordering::SeqCst);
    }

    /// Books `count` entries userspace took out of `group`'s tables.
    fn took(&self, group: Group, count: u64) {
        if count > 0 {
            self.words
                .word(group.adjust_index())
                .fetch_sub(count, Ordering::SeqCst);
        }
    }

    fn adjust(&self, group: Group) -> u64 {
        self.words.word(group.adjust_index()).load(Ordering::SeqCst)
    }
}

/// The programs' side of both groups' ledgers: (written, taken) by group,
/// summed over CPUs; `None` when the stats map is missing or of a build
/// before the ledger.
fn program_side(layout: &PinLayout) -> Option<[(u64, u64); 2]> {
    let stats = maps::stats(layout).ok()?;
    let sum = |reason: u32| -> Option<u64> {
        stats
            .get(&reason, 0)
            .ok()
            .map(|values| values.iter().copied().fold(0u64, u64::wrapping_add))
    };
    let mut side = [(0, 0); 2];
    for (slot, group) in side.iter_mut().zip(Group::ALL) {
        let (written, taken) = group.reasons();
        *slot = (sum(written)?, sum(taken)?);
    }
    Some(side)
}

/// Entries of a pinned hash table, by walking its keys (0 when it is not
/// there).
fn present(layout: &PinLayout, table: &'static str) -> u64 {
    aya::maps::MapInfo::from_pin(layout.map(table))
        .ok()
        .and_then(|info| maps::count_keys(info.fd().ok()?.as_fd(), info.key_size()))
        .unwrap_or(0)
}

/// What the tables evicted since they were made (or the ledger began),
/// entries by group.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Evictions {
    /// Entries of flows never assured, evicted from `conntrack_new`: a
    /// flood's, by design.
    pub unreplied: u64,
    /// Entries of assured flows evicted from `conntrack` or
    /// `conntrack_other` before they idled out (as of the last sweep): live
    /// flows that lost their translation.
    pub live: u64,
}

/// The ledger's count of evictions, given the entries present in each
/// group now (`present(group)`, e.g. from the fill levels `status` reads
/// anyway); `None` without a ledger (nothing installed, or pins of a build
/// before it).
pub fn evictions(layout: &PinLayout, present: impl Fn(Group) -> u64) -> Option<Evictions> {
    let ledger = Ledger::open(layout).ok()??;
    let side = program_side(layout)?;
    let count = |group: Group, (written, taken): (u64, u64)| {
        ct_ledger::evicted(written, taken, present(group), ledger.adjust(group))
    };
    Some(Evictions {
        unreplied: count(Group::Unreplied, side[0]),
        live: count(Group::Live, side[1]),
    })
}

/// [`evictions`], counting the entries present itself.
pub fn evictions_now(layout: &PinLayout) -> Option<Evictions> {
    evictions(layout, |group| {
        group.tables().iter().map(|t| present(layout, t)).sum()
    })
}

/// Starts both ledgers over from the tables as they are: nothing counts
/// as evicted now. For tables the ledger did not see filled (an upgrade
/// from a build before it) or that were made anew with copied entries (a
/// resize).
pub fn rebase(layout: &PinLayout) {
    let (Ok(Some(ledger)), Some(side)) = (Ledger::open(layout), program_side(layout)) else {
        return;
    };
    for (group, (written, taken)) in Group::ALL.into_iter().zip(side) {
        let here: u64 = group.tables().iter().map(|t| present(layout, t)).sum();
        // evicted = written - taken - present + adjust = 0
        ledger.store(
            group.adjust_index() as u32,
            here.wrapping_add(taken).wrapping_sub(written),
        );
    }
}

/// Notes the live evictions as they are now in the ledger (the agent's GC
/// does, after its sweep): when the count grew since the last note, when
/// (so that `status` can tell a node evicting live flows now from one
/// that did once). Returns the evictions.
pub fn note_live(layout: &PinLayout) -> Option<Evictions> {
    let evictions = evictions_now(layout)?;
    let ledger = Ledger::open(layout).ok()??;
    let seen = ledger.value(ct_ledger::LIVE_SEEN);
    if evictions.live != seen {
        if evictions.live > seen {
            ledger.store(ct_ledger::LIVE_GREW_AT, monotonic_ns());
        }
        ledger.store(ct_ledger::LIVE_SEEN, evictions.live);
    }
    Some(evictions)
}

/// Free entries the kernel's LRU keeps per CPU (`LOCAL_FREE_TARGET` in
/// kernel/bpf/bpf_lru_list.c): a table starts evicting when the others are
/// used, up to this many per CPU short of full.
const LRU_LOCAL_FREE: u64 = 128;

/// Whether a sweep is worth its walk (the agent's GC asks before each):
/// some group may hold enough entries for its tables to evict, which is
/// when an idled-out entry would be counted as a live flow's. The ledger
/// bounds what a group holds from above without a walk (written, less
/// taken, plus userspace's part: what is there plus what was evicted);
/// below half the group's room, and below where the LRU's per-CPU free
/// lists let it start evicting, nothing it holds is near eviction.
pub fn sweep_due(layout: &PinLayout) -> bool {
    let (Ok(Some(ledger)), Some(side)) = (Ledger::open(layout), program_side(layout)) else {
        return false;
    };
    let cpus = u64::from(crate::dataplane::pinned::sizing::NodeShape::this().cpus);
    Group::ALL
        .into_iter()
        .zip(side)
        .any(|(group, (written, taken))| {
            let tables = group.tables();
            let room: u64 = tables
                .iter()
                .filter_map(|t| aya::maps::MapInfo::from_pin(layout.map(t)).ok())
                .map(|info| u64::from(info.max_entries()))
                .sum();
            let held = ct_ledger::evicted(written, taken, 0, ledger.adjust(group));
            near_eviction(held, room, cpus, tables.len() as u64)
        })
}

/// Whether a group of `tables` LRU tables with `room` entries in all, on
/// a node of `cpus` possible CPUs, holding at most `held`, may be evicting.
fn near_eviction(held: u64, room: u64, cpus: u64, tables: u64) -> bool {
    let free_elsewhere = LRU_LOCAL_FREE * cpus * tables;
    held >= (room / 2).min(room.saturating_sub(free_elsewhere))
}

/// What a sweep removed: expired entries by group, and of the closed
/// table.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Swept {
    pub unreplied: u64,
    pub live: u64,
    pub closed: u64,
}

impl Swept {
    pub fn total(&self) -> u64 {
        self.unreplied + self.live + self.closed
    }
}

/// Whether the programs no longer use `entry` of `table` at `now_ns`: the
/// judgement of the eBPF crate's `ct::lookup`.
pub fn expired(table: &str, key: &CtKey, entry: &CtEntry, now_ns: u64) -> bool {
    let closed = table == map_names::CONNTRACK_CLOSED;
    now_ns.saturating_sub(entry.last_seen_ns)
        > ct_timeout::for_table(key.proto, entry.tcp_state, closed)
}

/// Removes the expired entries of every conntrack table and books them
/// in the ledger. Each one is taken with `BPF_MAP_LOOKUP_AND_DELETE_ELEM`
/// (Linux 5.14 for hash maps; a plain delete before), and put back if a
/// packet refreshed it since it was judged, or a new flow wrote its
/// tuple: a sweep never costs a live flow its entry. With `dry_run`,
/// only counts them.
pub fn sweep_expired(layout: &PinLayout, dry_run: bool) -> io::Result<Swept> {
    let mut swept = Swept::default();
    let ledger = Ledger::open(layout)?;
    for table in [
        map_names::CONNTRACK_NEW,
        map_names::CONNTRACK,
        map_names::CONNTRACK_OTHER,
        map_names::CONNTRACK_CLOSED,
    ] {
        let (Ok(mut map), Ok(data)) = (
            maps::conntrack(layout, table),
            MapData::from_pin(layout.map(table)),
        ) else {
            continue;
        };
        let fd = data.fd().as_fd();
        let now = monotonic_ns();
        // Judged first, then taken: deleting while walking the keys makes
        // the kernel restart the walk from the first key.
        let stale: Vec<CtKey> = map
            .iter()
            .filter_map(Result::ok)
            .filter(|(key, entry)| expired(table, key, entry, now))
            .map(|(key, _)| key)
            .collect();
        let mut taken = 0;
        for key in stale {
            if dry_run || take_if_expired(fd, &mut map, table, &key)? {
                taken += 1;
            }
        }
        let group = match table {
            map_names::CONNTRACK_NEW => Some(Group::Unreplied),
            map_names::CONNTRACK_CLOSED => None,
            _ => Some(Group::Live),
        };
        match group {
            Some(Group::Unreplied) => swept.unreplied += taken,
            Some(Group::Live) => swept.live += taken,
            None => swept.closed += taken,
        }
        if let (Some(group), Some(ledger), false) = (group, &ledger, dry_run) {
            ledger.took(group, taken);
        }
    }
    Ok(swept)
}

/// The kernel's `ENOTSUPP` (not the `ENOTSUP` of userspace), which a
/// map type without the command answers.
const ENOTSUPP: i32 = 524;

/// `BPF_MAP_LOOKUP_AND_DELETE_ELEM`.
const BPF_MAP_LOOKUP_AND_DELETE_ELEM: libc::c_long = 21;

/// Takes the entry of `key` from the table `fd` (`map`) if it is still
/// expired: whether it was taken.
fn take_if_expired(
    fd: std::os::fd::BorrowedFd<'_>,
    map: &mut HashMap<MapData, CtKey, CtEntry>,
    table: &str,
    key: &CtKey,
) -> io::Result<bool> {
    let mut entry = CtEntry::default();
    // SAFETY: the key and the entry are the table's key and value, live
    // across the call.
    let taken = unsafe {
        bpf_call::map_elem(
            BPF_MAP_LOOKUP_AND_DELETE_ELEM,
            fd,
            std::ptr::from_ref(key).cast(),
            std::ptr::from_mut(&mut entry).cast(),
        )
    };
    match taken {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(false),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | ENOTSUPP)) => {
            // A kernel before 5.14: judged again and deleted, with a
            // window of a syscall for a packet to refresh it unseen.
            return Ok(delete_if_expired(map, table, key));
        }
        Err(e) => return Err(e),
    }
    if !expired(table, key, &entry, monotonic_ns()) {
        // Refreshed since it was judged: put back, unless a packet already
        // wrote the tuple again.
        let _ = map.insert(*key, entry, bpf_call::BPF_NOEXIST);
        return Ok(false);
    }
    Ok(true)
}

fn delete_if_expired(map: &mut HashMap<MapData, CtKey, CtEntry>, table: &str, key: &CtKey) -> bool {
    match map.get(key, 0) {
        Ok(entry) if expired(table, key, &entry, monotonic_ns()) => map.remove(key).is_ok(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::near_eviction;

    #[test]
    fn a_sweep_is_due_from_half_full_or_where_per_cpu_free_lists_start_evicting() {
        // A default table on 2 CPUs: from half full.
        assert!(!near_eviction(131_071, 262_144, 2, 1));
        assert!(near_eviction(131_072, 262_144, 2, 1));
        // 1 024 entries on 2 CPUs: half full comes first.
        assert!(near_eviction(512, 1024, 2, 1));
        // 1 024 entries on 64 CPUs: other CPUs' free lists may hold it all.
        assert!(near_eviction(0, 1024, 64, 1));
        // Two tables of 1 024 on 2 CPUs.
        assert!(!near_eviction(1023, 2048, 2, 2));
        assert!(near_eviction(1024, 2048, 2, 2));
    }
}
