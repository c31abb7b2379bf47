//! What `list` and `status` both need: the error of a read, the check
//! that anything is installed, and the clock of the flows.

use std::path::PathBuf;

use aya::maps::MapError;
use portmap_common::map_names;

use crate::dataplane::{counters, maps::MapsError, pin::PinLayout};

#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    #[error(
        "no ebpf-portmap state under {root} (no ADD has run with this pinRoot yet, or it was uninstalled)"
    )]
    NotInstalled { root: PathBuf },
    #[error(transparent)]
    Maps(#[from] MapsError),
    #[error("reading the {map} map")]
    Read {
        map: &'static str,
        #[source]
        source: MapError,
    },
    #[error(transparent)]
    Counters(#[from] counters::CountersError),
    #[error(transparent)]
    Store(Box<crate::dataplane::ownership::StoreError>),
}

pub(super) fn read_error(map: &'static str) -> impl FnOnce(MapError) -> InspectError {
    move |source| InspectError::Read { map, source }
}

pub use crate::dataplane::ledger::monotonic_ns;

pub(super) fn require_installed(layout: &PinLayout) -> Result<(), InspectError> {
    if layout.map(map_names::MAPPINGS).exists() {
        Ok(())
    } else {
        Err(InspectError::NotInstalled {
            root: layout.root().to_path_buf(),
        })
    }
}
