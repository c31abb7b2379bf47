//! Typed access to the pinned maps, opened by path from a short-lived plugin
//! process. Layout checks (key/value sizes) are aya's; the versioned pin path
//! keeps maps of another layout out of reach.

use std::path::PathBuf;

use aya::maps::{Array, HashMap, Map, MapData, MapError, PerCpuArray, PerCpuHashMap};
use portmap_common::{
    CounterKey, CtEntry, CtKey, MappingCounters, MappingKey, MappingValue, OwnerRecord,
    OwnerSlotKey, TraceFilter, map_names,
};

use crate::pin::PinLayout;

#[derive(Debug, thiserror::Error)]
pub enum MapsError {
    #[error("cannot open pinned map {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: MapError,
    },
    #[error("updating the {map} map failed")]
    Update {
        map: &'static str,
        #[source]
        source: MapError,
    },
}

/// The maps ADD/DEL/CHECK/GC and the CLI work on.
pub struct Maps {
    pub mappings: HashMap<MapData, MappingKey, MappingValue>,
    pub owners: HashMap<MapData, u64, OwnerRecord>,
    pub owner_slots: HashMap<MapData, OwnerSlotKey, MappingKey>,
}

pub fn open<T>(layout: &PinLayout, name: &str) -> Result<T, MapsError>
where
    T: TryFrom<Map, Error = MapError>,
{
    let path = layout.map(name);
    let fail = |source| MapsError::Open {
        path: path.clone(),
        source,
    };
    let data = MapData::from_pin(&path).map_err(fail)?;
    let map = Map::from_map_data(data).map_err(fail)?;
    T::try_from(map).map_err(fail)
}

impl Maps {
    /// The maps, or `None` while any of them is not pinned yet: no ADD has
    /// finished on this root, so there is nothing to delete or collect. (A
    /// first ADD pins the maps one by one; a DEL running meanwhile must not
    /// fail on the ones still missing.)
    pub fn open_existing(layout: &PinLayout) -> Result<Option<Self>, MapsError> {
        let all_pinned = [
            map_names::MAPPINGS,
            map_names::OWNERS,
            map_names::OWNER_SLOTS,
        ]
        .iter()
        .all(|name| layout.map(name).exists());
        if !all_pinned {
            return Ok(None);
        }
        Self::open(layout).map(Some)
    }

    pub fn open(layout: &PinLayout) -> Result<Self, MapsError> {
        Ok(Self {
            mappings: open(layout, map_names::MAPPINGS)?,
            owners: open(layout, map_names::OWNERS)?,
            owner_slots: open(layout, map_names::OWNER_SLOTS)?,
        })
    }
}

/// Conntrack, opened only by the verbs that look at flows.
pub fn conntrack(layout: &PinLayout) -> Result<HashMap<MapData, CtKey, CtEntry>, MapsError> {
    open(layout, map_names::CONNTRACK)
}

/// Per-CPU counters by reason.
pub fn stats(layout: &PinLayout) -> Result<PerCpuArray<MapData, u64>, MapsError> {
    open(layout, map_names::STATS)
}

/// Per-mapping traffic counters, see [`crate::counters`].
pub fn counters(
    layout: &PinLayout,
) -> Result<PerCpuHashMap<MapData, CounterKey, MappingCounters>, MapsError> {
    open(layout, map_names::COUNTERS)
}

/// What `ebpf-portmap trace` asks the programs for, see [`crate::trace`].
pub fn trace_filter(layout: &PinLayout) -> Result<Array<MapData, TraceFilter>, MapsError> {
    open(layout, map_names::TRACE_FILTER)
}

/// Whether the error of a map call is the kernel's errno `code`.
pub fn is_errno(error: &MapError, code: i32) -> bool {
    match error {
        MapError::SyscallError(e) => e.io_error.raw_os_error() == Some(code),
        MapError::KeyNotFound | MapError::ElementNotFound => code == libc::ENOENT,
        _ => false,
    }
}
