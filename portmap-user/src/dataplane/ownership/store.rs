//! The ownership store: the pinned maps the protocol of this module works
//! on, opened together under the mappings' writers lock. Its methods are
//! in this module's files by concern (see the module doc of `ownership`):
//! opening here, claim and release in `claim`, GC in `gc`, the owners'
//! index in `index`, the maps keyed by owner ID in `owner_maps`. The typed
//! access to each pinned map is `pinned::maps`'s.

use aya::maps::{HashMap, MapData};
use portmap_common::{
    MappingKey, MappingValue, OwnerRecord, OwnerSlotKey, PodRecord, PortKey, SandboxRecord,
    conditions::{ConditionKey, Conditions},
    map_names,
};

use crate::dataplane::pinned::lock::{WritersLock, writers_shared};
use crate::dataplane::pinned::maps::{
    MappedPorts, MappingsEpoch, MapsError, ORPHANS, PODS, SANDBOXES, SPECIFIC_PORTS, open,
    open_conditions, open_user_map,
};
use crate::dataplane::pinned::pin::PinLayout;

/// The maps ADD/DEL/CHECK/GC and the CLI work on.
pub struct Store {
    /// Held for as long as the maps are open: a resize of `mappings` and
    /// `owner_slots` waits for it, so nothing is written to a map being
    /// replaced (see `pinned/resize.rs`). Taken before the maps are opened.
    pub writers: WritersLock,
    pub mappings: HashMap<MapData, MappingKey, MappingValue>,
    pub owners: HashMap<MapData, u64, OwnerRecord>,
    pub owner_slots: HashMap<MapData, OwnerSlotKey, MappingKey>,
    /// Pod identity by owner ID; `None` until an ADD created it (pins made
    /// by a build before it have none, see
    /// [`create_pods`](crate::dataplane::pinned::maps::create_pods)).
    pub pods: Option<HashMap<MapData, u64, PodRecord>>,
    /// What proves each owner's container alive (and its pod UID), by
    /// owner ID; `None` until an ADD created it (see
    /// [`create_sandboxes`](crate::dataplane::pinned::maps::create_sandboxes)).
    pub sandboxes: Option<HashMap<MapData, u64, SandboxRecord>>,
    /// Ports a specific host address was ever claimed on; `None` until the
    /// first ADD of this build created it (see `claim.rs`).
    pub specific_ports: Option<HashMap<MapData, PortKey, u32>>,
    /// When GC first saw each orphaned owner ID; `None` until a GC found one.
    pub orphans: Option<HashMap<MapData, u64, u64>>,
    /// Ports the mappings use (see [`MappedPorts`]); `None` on a pin root
    /// whose programs are of a build before the port filter, which do not
    /// read it.
    pub mapped_ports: Option<MappedPorts>,
    /// The programs' mappings epoch, raised after a mapping is deleted or
    /// re-pointed (see [`MappingsEpoch`]).
    pub epoch: MappingsEpoch,
    /// Owners' `conditionsV4`/`conditionsV6` (see
    /// `portmap_common::conditions`); `None` on a pin root whose programs
    /// are of a build before them.
    pub conditions: Option<HashMap<MapData, ConditionKey, Conditions>>,
}

impl Store {
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
            // First: the maps opened below are then the ones in place.
            writers: writers(layout)?,
            mappings: open(layout, map_names::MAPPINGS)?,
            owners: open(layout, map_names::OWNERS)?,
            owner_slots: open(layout, map_names::OWNER_SLOTS)?,
            pods: open_user_map(layout, &PODS)?,
            sandboxes: open_user_map(layout, &SANDBOXES)?,
            specific_ports: open_user_map(layout, &SPECIFIC_PORTS)?,
            orphans: open_user_map(layout, &ORPHANS)?,
            mapped_ports: if layout.map(map_names::MAPPED_PORTS).exists() {
                let path = layout.map(map_names::MAPPED_PORTS);
                let data = MapData::from_pin(&path).map_err(|source| MapsError::Open {
                    path: path.clone(),
                    source,
                })?;
                Some(MappedPorts::of(&data)?)
            } else {
                None
            },
            epoch: MappingsEpoch::at(layout.map(map_names::MAPPINGS_EPOCH)),
            conditions: open_conditions(layout)?,
        })
    }

    /// The three maps a release ([`Store::release`]) needs, and none of
    /// the others: DEL opens only these.
    pub fn open_for_release(layout: &PinLayout) -> Result<Self, MapsError> {
        Ok(Self {
            writers: writers(layout)?,
            mappings: open(layout, map_names::MAPPINGS)?,
            owners: open(layout, map_names::OWNERS)?,
            owner_slots: open(layout, map_names::OWNER_SLOTS)?,
            pods: None,
            sandboxes: None,
            specific_ports: None,
            orphans: None,
            mapped_ports: None,
            epoch: MappingsEpoch::at(layout.map(map_names::MAPPINGS_EPOCH)),
            // Best effort: a conditions entry left here is pruned by GC.
            conditions: open_conditions(layout).ok().flatten(),
        })
    }

    /// Sets the port-filter bits of every mapping in the map and returns how
    /// many had a bit missing. ADD marks a mapping's ports before writing
    /// it; a mapping written without them (by a build older than the filter,
    /// racing the first load that created it) would never be translated, so
    /// GC heals it.
    pub fn mark_every_mapping(&self) -> usize {
        let Some(ports) = self.mapped_ports.as_ref() else {
            return 0;
        };
        self.mappings
            .iter()
            .filter_map(Result::ok)
            .filter(|(key, value)| ports.mark(key, value))
            .count()
    }
}

/// The mappings' writers lock, shared (see [`Store::writers`]).
fn writers(layout: &PinLayout) -> Result<WritersLock, MapsError> {
    Ok(writers_shared(layout)?)
}
