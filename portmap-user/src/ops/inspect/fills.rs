//! How full each pinned map is, for `status` (and the agent's metrics).

use std::{fs, os::fd::AsFd as _};

use aya::maps::{MapError, MapInfo, MapType};
use portmap_common::map_names;

use crate::dataplane::{
    ledger::{self, Evictions, Group, Ledger},
    maps,
    pin::PinLayout,
};

/// How full one pinned map is.
#[derive(Debug, Clone)]
pub struct MapFill {
    pub name: String,
    pub map_type: String,
    /// Entries in use; `None` for arrays (always full by construction).
    pub entries: Option<u64>,
    pub max_entries: u32,
    pub id: u32,
}

impl MapFill {
    /// Percentage in use, for hash maps.
    /// Whether the kernel makes room in this map by dropping its least
    /// recently used entries (the conntrack tables): full is its steady
    /// state under churn, not a fault. Other maps refuse the next insert.
    pub fn recycles(&self) -> bool {
        self.map_type.starts_with("lru_")
    }

    pub fn percent(&self) -> Option<f64> {
        self.entries
            .map(|n| n as f64 * 100.0 / f64::from(self.max_entries.max(1)))
    }
}

/// A map at or above this fill is reported as a problem by `status`.
pub const FILL_WARNING_PERCENT: f64 = 90.0;

fn map_type_name(map_type: Result<MapType, MapError>) -> String {
    match map_type {
        Ok(MapType::Hash) => "hash".into(),
        Ok(MapType::LruHash) => "lru_hash".into(),
        Ok(MapType::LruPerCpuHash) => "lru_percpu_hash".into(),
        Ok(MapType::PerCpuHash) => "percpu_hash".into(),
        Ok(MapType::PerCpuArray) => "percpu_array".into(),
        Ok(MapType::Array) => "array".into(),
        Ok(MapType::RingBuf) => "ringbuf".into(),
        Ok(other) => format!("{other:?}").to_lowercase(),
        Err(_) => "unknown".into(),
    }
}

fn has_keys(map_type: &Result<MapType, MapError>) -> bool {
    matches!(
        map_type,
        Ok(MapType::Hash
            | MapType::LruHash
            | MapType::PerCpuHash
            | MapType::LruPerCpuHash
            | MapType::LpmTrie)
    )
}

/// Fill levels of every map pinned under `maps/` (ours and any added by
/// other parts of the dataplane), and the names of [`map_names::ALL`] that
/// are missing.
pub fn map_fills(layout: &PinLayout) -> (Vec<MapFill>, Vec<&'static str>) {
    let mut fills = Vec::new();
    let missing = map_names::ALL
        .into_iter()
        .filter(|name| !layout.map(name).exists())
        .collect();
    let Ok(entries) = fs::read_dir(layout.maps_dir()) else {
        return (fills, missing);
    };
    for entry in entries.flatten() {
        let Ok(info) = MapInfo::from_pin(entry.path()) else {
            continue;
        };
        let map_type = info.map_type();
        let entries = if has_keys(&map_type) {
            info.fd()
                .ok()
                .and_then(|fd| maps::count_keys(fd.as_fd(), info.key_size()))
        } else {
            None
        };
        fills.push(MapFill {
            name: entry.file_name().to_string_lossy().into_owned(),
            map_type: map_type_name(map_type),
            entries,
            max_entries: info.max_entries(),
            id: info.id(),
        });
    }
    // Ours in schema order first, then the rest by name.
    let rank = |name: &str| {
        map_names::ALL
            .iter()
            .position(|n| *n == name)
            .unwrap_or(usize::MAX)
    };
    fills.sort_by(|a, b| (rank(&a.name), &a.name).cmp(&(rank(&b.name), &b.name)));
    (fills, missing)
}

/// What the conntrack tables evicted (see `dataplane::ledger`), as
/// `status` and the metrics report it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EvictionReport {
    pub counts: Evictions,
    /// How long the count of live evictions has not grown, as far as the
    /// agent saw (it notes the count at every GC run): `None` when no
    /// agent noted it, or it grew since the agent last looked.
    pub live_quiet_for: Option<std::time::Duration>,
}

/// [`EvictionReport`] of `layout`, the entries present read from `fills`
/// (the walk `status` and the metrics make anyway); `None` without a
/// ledger (nothing installed, or pins of a build before it).
pub fn evictions(layout: &PinLayout, fills: &[MapFill]) -> Option<EvictionReport> {
    let present = |group: Group| {
        group
            .tables()
            .iter()
            .filter_map(|table| fills.iter().find(|f| f.name == *table)?.entries)
            .sum()
    };
    let counts = ledger::evictions(layout, present)?;
    let live_quiet_for = Ledger::open(layout).ok().flatten().and_then(|ledger| {
        let seen = ledger.value(portmap_common::ct_ledger::LIVE_SEEN);
        let grew_at = ledger.value(portmap_common::ct_ledger::LIVE_GREW_AT);
        (grew_at != 0 && counts.live <= seen).then(|| {
            std::time::Duration::from_nanos(ledger::monotonic_ns().saturating_sub(grew_at))
        })
    });
    Some(EvictionReport {
        counts,
        live_quiet_for,
    })
}
