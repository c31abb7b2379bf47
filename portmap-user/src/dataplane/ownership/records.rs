//! The pinned forms of an owner and of what labels it: the owner ID and
//! record (`owners`), the pod identity (`owner_pods`) and the sandbox
//! (`owner_sandboxes`). Pure: no map is read or written here.

use std::time::{SystemTime, UNIX_EPOCH};

use portmap_common::{
    NETNS_PATH_LEN, NOMAD_FIELD_LEN, OWNER_IFNAME_LEN, OWNER_NAME_LEN, OwnerRecord, POD_NAME_LEN,
    POD_NAMESPACE_LEN, POD_UID_LEN, PodRecord, SandboxRecord,
};

use crate::dataplane::pinned::hash::fnv1a64;
use crate::model::{NsId, Owner, PodIdentity, Sandbox};

/// Stable ID of an owner: hash of network, container ID and interface name.
pub fn owner_id(owner: &Owner) -> u64 {
    let mut bytes =
        Vec::with_capacity(owner.network.len() + owner.container_id.len() + owner.ifname.len() + 2);
    bytes.extend_from_slice(owner.network.as_bytes());
    bytes.push(0);
    bytes.extend_from_slice(owner.container_id.as_bytes());
    bytes.push(0);
    bytes.extend_from_slice(owner.ifname.as_bytes());
    fnv1a64(&bytes)
}

fn fill<const N: usize>(text: &str) -> ([u8; N], u16) {
    let mut out = [0u8; N];
    let len = text.len().min(N);
    out[..len].copy_from_slice(&text.as_bytes()[..len]);
    (out, len as u16)
}

pub fn owner_record(owner: &Owner, created_unix: u64) -> OwnerRecord {
    let (network, network_len) = fill::<OWNER_NAME_LEN>(&owner.network);
    let (container_id, container_id_len) = fill::<OWNER_NAME_LEN>(&owner.container_id);
    let (ifname, ifname_len) = fill::<OWNER_IFNAME_LEN>(&owner.ifname);
    OwnerRecord {
        network,
        container_id,
        ifname,
        network_len,
        container_id_len,
        ifname_len,
        flags: 0,
        created_unix,
    }
}

/// The pinned form of a pod identity. Parts too long for the record were
/// refused when CNI_ARGS was parsed; `fill` still bounds them.
pub fn pod_record(identity: &PodIdentity) -> PodRecord {
    fn text(value: &Option<String>) -> &str {
        value.as_deref().unwrap_or("")
    }
    let (pod_namespace, pod_namespace_len) =
        fill::<POD_NAMESPACE_LEN>(text(&identity.pod_namespace));
    let (pod_name, pod_name_len) = fill::<POD_NAME_LEN>(text(&identity.pod_name));
    let (nomad_alloc_id, nomad_alloc_id_len) =
        fill::<NOMAD_FIELD_LEN>(text(&identity.nomad_alloc_id));
    let (nomad_namespace, nomad_namespace_len) =
        fill::<NOMAD_FIELD_LEN>(text(&identity.nomad_namespace));
    let (nomad_job, nomad_job_len) = fill::<NOMAD_FIELD_LEN>(text(&identity.nomad_job));
    let (nomad_group, nomad_group_len) = fill::<NOMAD_FIELD_LEN>(text(&identity.nomad_group));
    PodRecord {
        pod_namespace,
        pod_name,
        nomad_alloc_id,
        nomad_namespace,
        nomad_job,
        nomad_group,
        pod_namespace_len,
        pod_name_len,
        nomad_alloc_id_len,
        nomad_namespace_len,
        nomad_job_len,
        nomad_group_len,
        _pad0: 0,
    }
}

/// The identity a [`PodRecord`] holds.
pub fn pod_identity(record: &PodRecord) -> PodIdentity {
    let text = |bytes: &[u8], len: u16| {
        let bytes = &bytes[..(len as usize).min(bytes.len())];
        (!bytes.is_empty()).then(|| String::from_utf8_lossy(bytes).into_owned())
    };
    PodIdentity {
        pod_namespace: text(&record.pod_namespace, record.pod_namespace_len),
        pod_name: text(&record.pod_name, record.pod_name_len),
        nomad_alloc_id: text(&record.nomad_alloc_id, record.nomad_alloc_id_len),
        nomad_namespace: text(&record.nomad_namespace, record.nomad_namespace_len),
        nomad_job: text(&record.nomad_job, record.nomad_job_len),
        nomad_group: text(&record.nomad_group, record.nomad_group_len),
        // Kept in the sandbox record (see `Store::pod_of`).
        pod_uid: None,
    }
}

/// The pinned form of a sandbox. A path or UID too long for the record is
/// left out (no proof is better than a cut one).
pub fn sandbox_record(sandbox: &Sandbox) -> SandboxRecord {
    let mut record = SandboxRecord::default();
    if let Some(path) = &sandbox.netns {
        let bytes = std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str());
        if !bytes.is_empty() && bytes.len() <= NETNS_PATH_LEN {
            record.netns_path[..bytes.len()].copy_from_slice(bytes);
            record.netns_path_len = bytes.len() as u16;
        }
    }
    if let Some(uid) = &sandbox.pod_uid
        && uid.len() <= POD_UID_LEN
    {
        record.pod_uid[..uid.len()].copy_from_slice(uid.as_bytes());
        record.pod_uid_len = uid.len() as u16;
    }
    if let Some(id) = sandbox.netns_id {
        (record.netns_dev, record.netns_ino) = (id.dev, id.ino);
    }
    if let Some(id) = sandbox.mntns_id {
        (record.mntns_dev, record.mntns_ino) = (id.dev, id.ino);
    }
    record.gone_since = sandbox.gone_since.unwrap_or(0);
    record
}

/// The sandbox a [`SandboxRecord`] holds.
pub fn sandbox_of_record(record: &SandboxRecord) -> Sandbox {
    let path = &record.netns_path[..(record.netns_path_len as usize).min(NETNS_PATH_LEN)];
    let uid = &record.pod_uid[..(record.pod_uid_len as usize).min(POD_UID_LEN)];
    let id = |dev: u64, ino: u64| (ino != 0).then_some(NsId { dev, ino });
    Sandbox {
        netns: (!path.is_empty()).then(|| {
            std::path::PathBuf::from(
                <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(path),
            )
        }),
        netns_id: id(record.netns_dev, record.netns_ino),
        mntns_id: id(record.mntns_dev, record.mntns_ino),
        pod_uid: (!uid.is_empty()).then(|| String::from_utf8_lossy(uid).into_owned()),
        gone_since: (record.gone_since != 0).then_some(record.gone_since),
    }
}

/// (network, container ID, ifname) of a record.
pub fn record_strings(record: &OwnerRecord) -> (String, String, String) {
    let text = |bytes: &[u8], len: u16| {
        String::from_utf8_lossy(&bytes[..(len as usize).min(bytes.len())]).into_owned()
    };
    (
        text(&record.network, record.network_len),
        text(&record.container_id, record.container_id_len),
        text(&record.ifname, record.ifname_len),
    )
}

pub(super) fn same_identity(a: &OwnerRecord, b: &OwnerRecord) -> bool {
    record_strings(a) == record_strings(b)
}

/// The first [`OWNER_NAME_LEN`] bytes of `name`: what a record keeps of it.
fn recorded_part(name: &str) -> &[u8] {
    &name.as_bytes()[..name.len().min(OWNER_NAME_LEN)]
}

fn recorded<const N: usize>(bytes: &[u8; N], len: u16) -> &[u8] {
    &bytes[..(len as usize).min(N)]
}

/// Whether owner `id`, whose record is `record`, is exactly `owner`. ADD
/// refuses names longer than a record holds, but an older build recorded
/// them cut; the ID hashes the full names, so comparing it too tells a
/// cut name from another sharing its first [`OWNER_NAME_LEN`] bytes.
pub fn record_is(id: u64, record: &OwnerRecord, owner: &Owner) -> bool {
    recorded(&record.network, record.network_len) == recorded_part(&owner.network)
        && recorded(&record.container_id, record.container_id_len)
            == recorded_part(&owner.container_id)
        && recorded(&record.ifname, record.ifname_len) == owner.ifname.as_bytes()
        && owner_id(owner) == id
}

/// Whether owner `id` (record `record`) belongs to network `network`:
/// `Some` when the record tells, `None` when it cannot (an older build cut
/// both its network name and its container ID, so neither the name nor
/// the ID can be checked whole).
pub fn record_network_is(id: u64, record: &OwnerRecord, network: &str) -> Option<bool> {
    if recorded(&record.network, record.network_len) != recorded_part(network) {
        return Some(false);
    }
    if usize::from(record.network_len) < OWNER_NAME_LEN {
        // Not cut: the names are equal.
        return Some(true);
    }
    if usize::from(record.container_id_len) >= OWNER_NAME_LEN {
        return None;
    }
    // The container ID is whole: the owner ID tells whether the network is.
    let (_, container_id, ifname) = record_strings(record);
    Some(
        owner_id(&Owner {
            network: network.to_owned(),
            container_id,
            ifname,
        }) == id,
    )
}

pub fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sandbox_records_round_trip_and_refuse_what_does_not_fit() {
        let sandbox = Sandbox {
            netns: Some("/var/run/netns/cni-5c9e8a4e-7d6b-4c1a-9a53-0f2f4e6b8c10".into()),
            netns_id: Some(NsId {
                dev: 4,
                ino: 4026532281,
            }),
            mntns_id: Some(NsId {
                dev: 4,
                ino: 4026531841,
            }),
            pod_uid: Some("5c9e8a4e-7d6b-4c1a-9a53-0f2f4e6b8c10".into()),
            gone_since: Some(1_796_326_055),
        };
        assert_eq!(sandbox_of_record(&sandbox_record(&sandbox)), sandbox);
        assert_eq!(
            sandbox_of_record(&SandboxRecord::default()),
            Sandbox::default(),
            "an empty record proves nothing"
        );
        let long = Sandbox {
            netns: Some(format!("/{}", "n".repeat(NETNS_PATH_LEN)).into()),
            pod_uid: Some("u".repeat(POD_UID_LEN + 1)),
            ..sandbox.clone()
        };
        let kept = sandbox_of_record(&sandbox_record(&long));
        assert_eq!(
            (kept.netns, kept.pod_uid),
            (None, None),
            "a cut path would name another file: left out"
        );
    }

    #[test]
    fn owner_ids_separate_every_part_of_the_identity() {
        let owner = |n: &str, c: &str, i: &str| Owner {
            network: n.into(),
            container_id: c.into(),
            ifname: i.into(),
        };
        let a = owner_id(&owner("net", "abc", "eth0"));
        assert_eq!(a, owner_id(&owner("net", "abc", "eth0")), "stable");
        assert_ne!(a, owner_id(&owner("net", "abc", "eth1")));
        assert_ne!(a, owner_id(&owner("net2", "abc", "eth0")));
        assert_ne!(
            owner_id(&owner("ab", "c", "x")),
            owner_id(&owner("a", "bc", "x"))
        );
    }

    /// What an older build recorded for a name longer than a record: its
    /// first bytes, under the ID of the full names.
    fn cut_record(owner: &Owner) -> (u64, OwnerRecord) {
        (owner_id(owner), owner_record(owner, 0))
    }

    #[test]
    fn cut_names_are_told_apart_by_the_owner_id() {
        let owner = |network: &str, container_id: &str| Owner {
            network: network.into(),
            container_id: container_id.into(),
            ifname: "eth0".into(),
        };
        let long_id = "c".repeat(200);
        let sharing_prefix = format!("{}d", "c".repeat(199));
        let (id, record) = cut_record(&owner("net", &long_id));
        assert!(record_is(id, &record, &owner("net", &long_id)));
        assert!(
            !record_is(id, &record, &owner("net", &sharing_prefix)),
            "an ID sharing the first 128 bytes is another owner"
        );
        assert!(!record_is(id, &record, &owner("net", &"c".repeat(128))));
        assert!(!record_is(id, &record, &owner("net", &long_id[..12])));
        assert_eq!(record_network_is(id, &record, "net"), Some(true));
        assert_eq!(record_network_is(id, &record, "net2"), Some(false));

        let net_a = format!("{}a", "n".repeat(150));
        let net_b = format!("{}b", "n".repeat(150));
        let (id, record) = cut_record(&owner(&net_a, "abc"));
        assert_eq!(record_network_is(id, &record, &net_a), Some(true));
        assert_eq!(
            record_network_is(id, &record, &net_b),
            Some(false),
            "a network sharing the first 128 bytes is another network"
        );
        assert_eq!(record_network_is(id, &record, &net_a[..128]), Some(false));
        let (id, record) = cut_record(&owner(&net_a, &long_id));
        assert_eq!(
            record_network_is(id, &record, &net_b),
            None,
            "both cut: the record cannot tell"
        );
        assert!(record_is(id, &record, &owner(&net_a, &long_id)));
        assert!(!record_is(id, &record, &owner(&net_b, &long_id)));
    }

    #[test]
    fn pod_records_keep_the_identity() {
        let identities = [
            PodIdentity::default(),
            PodIdentity {
                pod_namespace: Some("kube-system".into()),
                pod_name: Some("p".repeat(253)),
                ..Default::default()
            },
            PodIdentity {
                nomad_alloc_id: Some("5e0c1d2a-8f3b-4c6d-9e7f-0a1b2c3d4e5f".into()),
                nomad_namespace: Some("default".into()),
                nomad_job: Some("web".into()),
                nomad_group: Some("api".into()),
                ..Default::default()
            },
        ];
        for identity in identities {
            assert_eq!(pod_identity(&pod_record(&identity)), identity);
        }
    }

    #[test]
    fn owner_records_keep_the_identity() {
        let owner = Owner {
            network: "podman".into(),
            container_id: "c".repeat(64),
            ifname: "eth0".into(),
        };
        let record = owner_record(&owner, 7);
        assert_eq!(
            record_strings(&record),
            (
                owner.network.clone(),
                owner.container_id.clone(),
                owner.ifname.clone()
            )
        );
        assert_eq!(record.created_unix, 7);
    }
}
