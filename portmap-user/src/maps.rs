//! Typed access to the pinned maps, opened by path from a short-lived plugin
//! process. Layout checks (key/value sizes) are aya's; the versioned pin path
//! keeps maps of another layout out of reach.

use std::path::PathBuf;

use aya::maps::{HashMap, Map, MapData, MapError, PerCpuArray};
use portmap_common::{
    CtEntry, CtKey, MappingKey, MappingValue, OwnerRecord, OwnerSlotKey, map_names,
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
}

/// The maps ADD/DEL/CHECK/GC and the CLI work on.
pub struct Maps {
    pub mappings: HashMap<MapData, MappingKey, MappingValue>,
    pub owners: HashMap<MapData, u64, OwnerRecord>,
    pub owner_slots: HashMap<MapData, OwnerSlotKey, MappingKey>,
}

fn open<T>(layout: &PinLayout, name: &str) -> Result<T, MapsError>
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

/// Whether the error of a map call is the kernel's errno `code`.
pub fn is_errno(error: &MapError, code: i32) -> bool {
    match error {
        MapError::SyscallError(e) => e.io_error.raw_os_error() == Some(code),
        MapError::KeyNotFound | MapError::ElementNotFound => code == libc::ENOENT,
        _ => false,
    }
}
