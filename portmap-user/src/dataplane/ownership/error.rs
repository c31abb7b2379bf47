//! What can go wrong with ownership ([`StoreError`]), and the holder of a
//! host port as a conflict names it ([`HolderDisplay`]).

use std::fmt;

use aya::maps::MapError;
use portmap_common::OwnerRecord;

use super::records::record_strings;
use super::translation::KeyDisplay;
use crate::dataplane::pinned::maps::is_errno;
use crate::model::PodIdentity;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("host port {key} is already mapped by {holder}")]
    Conflict {
        key: KeyDisplay,
        /// Boxed: the holder's strings would make every Result of the plugin large.
        holder: Box<HolderDisplay>,
    },
    #[error(
        "host port {key} overlaps {held}, already mapped by {holder}: a wildcard hostIP takes the port on every address of its family"
    )]
    Overlap {
        key: KeyDisplay,
        held: KeyDisplay,
        holder: Box<HolderDisplay>,
    },
    #[error(
        "container {container_id} was removed by a concurrent DEL or GC while this ADD ran; nothing of this ADD is left, try again"
    )]
    Removed { container_id: String },
    #[error("the {map} map is full ({operation}); raise its capacity or remove unused containers")]
    Capacity {
        map: &'static str,
        operation: &'static str,
    },
    #[error("container {container_id} would need more than {max} mapping slots")]
    TooManySlots { container_id: String, max: u32 },
    #[error("owner ID {owner_id:016x} of {owner} collides with the different owner {existing}")]
    OwnerCollision {
        owner_id: u64,
        owner: String,
        existing: String,
    },
    #[error("{operation} on the {map} map failed")]
    Map {
        map: &'static str,
        operation: &'static str,
        #[source]
        source: MapError,
    },
    #[error("cannot open or create the {map} map")]
    UserMap {
        map: &'static str,
        #[source]
        source: Box<crate::dataplane::pinned::maps::MapsError>,
    },
    #[error(
        "the conditions map is not pinned under this pin root (programs of an older build?): the conditionsV4/conditionsV6 of this configuration cannot be enforced"
    )]
    NoConditionsMap,
    #[error(
        "container {container_id} has no port mappings under pin root {}: {}; ADD it again",
        pin_root.display(),
        if *dataplane {
            "they were removed (by a GC, `ebpf-portmap gc` or a DEL), or lost with a reboot after which the dataplane was set up again"
        } else {
            "no ebpf-portmap dataplane is there (bpffs keeps no pins across a reboot; an uninstall removes them)"
        }
    )]
    NotAdded {
        container_id: String,
        pin_root: std::path::PathBuf,
        /// Whether the pin root holds a dataplane (its owners map).
        dataplane: bool,
    },
    #[error("mapping {key} is missing or not owned by {container_id}")]
    Missing {
        key: KeyDisplay,
        container_id: String,
    },
}

pub(super) fn map_error(
    map: &'static str,
    operation: &'static str,
) -> impl FnOnce(MapError) -> StoreError {
    move |source| {
        if is_errno(&source, libc::E2BIG) || is_errno(&source, libc::ENOMEM) {
            StoreError::Capacity { map, operation }
        } else {
            StoreError::Map {
                map,
                operation,
                source,
            }
        }
    }
}

/// The owner holding a host port, as a conflict names it: its record (if it
/// is still there) and its pod identity (if one was recorded).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HolderDisplay {
    pub record: Option<Box<OwnerRecord>>,
    pub pod: PodIdentity,
}

impl fmt::Display for HolderDisplay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.record {
            Some(record) if !self.pod.is_empty() => {
                let (network, container_id, ifname) = record_strings(record);
                write!(
                    f,
                    "{} (container {}, network {network}, interface {ifname})",
                    self.pod,
                    short_id(&container_id)
                )
            }
            Some(record) => {
                let (network, container_id, ifname) = record_strings(record);
                write!(
                    f,
                    "container {container_id} (network {network}, interface {ifname})"
                )
            }
            // A DEL removes the mappings before the record, so this is
            // either that moment or mappings left without an owner.
            None => write!(
                f,
                "another container whose owner record is gone (being removed right now, or left behind: `ebpf-portmap gc --orphans` frees it)"
            ),
        }
    }
}

/// Container IDs are 64 hex digits; the first 12 tell them apart (docker's
/// and crictl's short form).
const SHORT_ID_LEN: usize = 12;

fn short_id(id: &str) -> String {
    match id.char_indices().nth(SHORT_ID_LEN) {
        Some((end, _)) => format!("{}…", &id[..end]),
        None => id.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use portmap_common::{FAMILY_V4, MappingKey, PROTO_TCP};

    use super::super::records::owner_record;
    use super::super::translation::words_from_addr;
    use crate::model::Owner;

    #[test]
    fn conflicts_name_the_holding_pod() {
        let owner = Owner {
            network: "k8s-pod-network".into(),
            container_id: "3a1b2c3d4e5f6a7b8c9d".into(),
            ifname: "eth0".into(),
        };
        let record = Some(Box::new(owner_record(&owner, 0)));
        let with_pod = HolderDisplay {
            record: record.clone(),
            pod: PodIdentity {
                pod_namespace: Some("default".into()),
                pod_name: Some("web-7f9c".into()),
                ..Default::default()
            },
        };
        assert_eq!(
            with_pod.to_string(),
            "pod default/web-7f9c (container 3a1b2c3d4e5f…, network k8s-pod-network, interface eth0)"
        );
        let without = HolderDisplay {
            record,
            pod: PodIdentity::default(),
        };
        assert_eq!(
            without.to_string(),
            "container 3a1b2c3d4e5f6a7b8c9d (network k8s-pod-network, interface eth0)",
            "no pod identity: the form from before"
        );
        assert_eq!(short_id("abc"), "abc");
    }

    fn port(port: u16) -> MappingKey {
        MappingKey {
            host_port_be: port.to_be(),
            proto: PROTO_TCP,
            family: FAMILY_V4,
            ..MappingKey::default()
        }
    }

    #[test]
    fn overlaps_name_both_keys_and_the_holder() {
        let holder = Owner {
            network: "podman".into(),
            container_id: "c".into(),
            ifname: "eth0".into(),
        };
        let specific = MappingKey {
            host_addr_be: words_from_addr("10.78.0.1".parse().unwrap()),
            ..port(8083)
        };
        let error = StoreError::Overlap {
            key: KeyDisplay(specific),
            held: KeyDisplay(port(8083)),
            holder: Box::new(HolderDisplay {
                record: Some(Box::new(owner_record(&holder, 0))),
                pod: PodIdentity::default(),
            }),
        };
        assert_eq!(
            error.to_string(),
            "host port 10.78.0.1:8083/tcp overlaps 0.0.0.0:8083/tcp, already mapped by container c (network podman, interface eth0): a wildcard hostIP takes the port on every address of its family"
        );
    }
}
