//! Ownership of port mappings in the pinned maps: claim, release, verify.
//!
//! Every step is one atomic map operation; nothing is read, modified and
//! written back. The protocol, which stays correct when any process is
//! killed at any point and when any number of plugins run at once:
//! - ADD creates the owner record (`BPF_NOEXIST`), then for each mapping
//!   first writes the owner's next index slot, then claims the mapping with
//!   `BPF_NOEXIST`. Exactly one claimant of a host port wins; a loser rolls
//!   back what it claimed in this call.
//! - DEL walks the owner's slots from the last to the first, deleting each
//!   mapping that still names the owner and then the slot, and finally the
//!   owner record. Interrupted, it leaves a contiguous prefix of slots that
//!   the next DEL or GC finishes. Its cost depends on the owner's mappings
//!   only, never on how many mappings the node has.
//! - Pod identity (CNI_ARGS) lives in its own map, `owner_pods`, keyed by
//!   owner ID like `owners`. ADD writes it once the owner record is known
//!   to be this owner's (so an ID collision never overwrites another
//!   owner's identity); DEL removes it just before the owner record. It
//!   only labels an owner: a missing record means "no pod known", never an
//!   error.
//!
//! Why a separate map rather than a longer `OwnerRecord`: the pinned maps
//! of a node outlive the binary that made them. A new `owners` layout would
//! need a new layout version (new pins: the running mappings would lose
//! their owners until migrated) or an in-place migration racing with
//! plugins of the old build still running during the upgrade. The eBPF
//! programs never read either map, so a new map costs nothing on the data
//! path, leaves every existing pin byte for byte as the old build wrote it
//! (upgrade and downgrade both keep working), and is created by the first
//! ADD that has an identity to record (`maps::create_pods`).

use std::{
    fmt,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    time::{SystemTime, UNIX_EPOCH},
};

use aya::maps::MapError;
use portmap_common::{
    FAMILY_V4, FAMILY_V6, MAX_SLOTS_PER_OWNER, MappingKey, MappingValue, NOMAD_FIELD_LEN,
    OWNER_IFNAME_LEN, OWNER_NAME_LEN, OwnerRecord, OwnerSlotKey, POD_NAME_LEN, POD_NAMESPACE_LEN,
    PROTO_SCTP, PROTO_TCP, PROTO_UDP, PodRecord,
};

use crate::{
    config::{Attachment, ContainerAddrs, HostIp, Owner, PodIdentity, PortMapping},
    hash::fnv1a64,
    maps::{Maps, is_errno},
};

const BPF_ANY: u64 = 0;
const BPF_NOEXIST: u64 = 1;
const BPF_EXIST: u64 = 2;

/// One entry of the `mappings` map as an owner wants it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Translation {
    pub key: MappingKey,
    pub container_addr_be: [u32; 4],
    pub container_port_be: u16,
}

impl Translation {
    fn value(&self, owner_id: u64) -> MappingValue {
        MappingValue {
            container_addr_be: self.container_addr_be,
            container_port_be: self.container_port_be,
            owner_id,
            ..MappingValue::default()
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("host port {key} is already mapped by {holder}")]
    Conflict {
        key: KeyDisplay,
        /// Boxed: the holder's strings would make every Result of the plugin large.
        holder: Box<HolderDisplay>,
    },
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
    #[error("mapping {key} is missing or not owned by {container_id}")]
    Missing {
        key: KeyDisplay,
        container_id: String,
    },
}

fn map_error(map: &'static str, operation: &'static str) -> impl FnOnce(MapError) -> StoreError {
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

/// The mapping key shown to people: `198.18.0.1:8080/tcp`, `0.0.0.0:8080/udp`, `[::]:80/sctp`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyDisplay(pub MappingKey);

impl fmt::Display for KeyDisplay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let key = &self.0;
        let port = u16::from_be(key.host_port_be);
        match addr_from_words(key.family, &key.host_addr_be) {
            IpAddr::V4(a) => write!(f, "{a}:{port}/{}", protocol_name(key.proto)),
            IpAddr::V6(a) => write!(f, "[{a}]:{port}/{}", protocol_name(key.proto)),
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

/// Container IDs are 64 hex digits; the first 12 tell them apart (docker's
/// and crictl's short form).
const SHORT_ID_LEN: usize = 12;

fn short_id(id: &str) -> String {
    match id.char_indices().nth(SHORT_ID_LEN) {
        Some((end, _)) => format!("{}…", &id[..end]),
        None => id.to_owned(),
    }
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
            None => write!(f, "another container (being removed right now)"),
        }
    }
}

pub fn protocol_name(proto: u8) -> &'static str {
    match proto {
        PROTO_TCP => "tcp",
        PROTO_UDP => "udp",
        PROTO_SCTP => "sctp",
        _ => "?",
    }
}

pub fn words_from_addr(addr: IpAddr) -> [u32; 4] {
    match addr {
        IpAddr::V4(a) => [u32::from_ne_bytes(a.octets()), 0, 0, 0],
        IpAddr::V6(a) => {
            let o = a.octets();
            let word = |i: usize| u32::from_ne_bytes([o[i], o[i + 1], o[i + 2], o[i + 3]]);
            [word(0), word(4), word(8), word(12)]
        }
    }
}

pub fn addr_from_words(family: u8, words: &[u32; 4]) -> IpAddr {
    if family == FAMILY_V4 {
        IpAddr::V4(Ipv4Addr::from(words[0].to_ne_bytes()))
    } else {
        let mut octets = [0u8; 16];
        for (i, word) in words.iter().enumerate() {
            octets[i * 4..i * 4 + 4].copy_from_slice(&word.to_ne_bytes());
        }
        IpAddr::V6(Ipv6Addr::from(octets))
    }
}

/// The map entries a request asks for: one per mapping and per address
/// family that both the container has and `hostIP` allows.
pub fn plan(mappings: &[PortMapping], container: &ContainerAddrs) -> Vec<Translation> {
    let mut plan = Vec::new();
    for mapping in mappings {
        let families: [(u8, Option<IpAddr>, bool); 2] = [
            (
                FAMILY_V4,
                container.v4.map(IpAddr::V4),
                mapping.host_ip.allows_v4(),
            ),
            (
                FAMILY_V6,
                container.v6.map(IpAddr::V6),
                mapping.host_ip.allows_v6(),
            ),
        ];
        for (family, container_addr, allowed) in families {
            let Some(container_addr) = container_addr else {
                continue;
            };
            if !allowed {
                continue;
            }
            let host_addr_be = match mapping.host_ip {
                HostIp::Addr(addr) => words_from_addr(addr),
                HostIp::Any | HostIp::AnyV4 | HostIp::AnyV6 => [0; 4],
            };
            plan.push(Translation {
                key: MappingKey {
                    host_addr_be,
                    host_port_be: mapping.host_port.to_be(),
                    proto: mapping.protocol.number(),
                    family,
                },
                container_addr_be: words_from_addr(container_addr),
                container_port_be: mapping.container_port.to_be(),
            });
        }
    }
    plan
}

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
        _pad0: 0,
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

fn same_identity(a: &OwnerRecord, b: &OwnerRecord) -> bool {
    record_strings(a) == record_strings(b)
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn slot_key(owner_id: u64, slot: u32) -> OwnerSlotKey {
    OwnerSlotKey {
        owner_id,
        slot,
        _pad0: 0,
    }
}

impl Maps {
    /// The mapping keys in an owner's index, slot 0 first.
    fn slots(&self, owner_id: u64) -> Result<Vec<MappingKey>, StoreError> {
        let mut keys = Vec::new();
        for slot in 0..MAX_SLOTS_PER_OWNER {
            match self.owner_slots.get(&slot_key(owner_id, slot), 0) {
                Ok(key) => keys.push(key),
                Err(e) if is_errno(&e, libc::ENOENT) => break,
                Err(e) => return Err(map_error("owner_slots", "lookup")(e)),
            }
        }
        Ok(keys)
    }

    fn owned_by(&self, key: &MappingKey, owner_id: u64) -> Result<bool, StoreError> {
        match self.mappings.get(key, 0) {
            Ok(value) => Ok(value.owner_id == owner_id),
            Err(e) if is_errno(&e, libc::ENOENT) => Ok(false),
            Err(e) => Err(map_error("mappings", "lookup")(e)),
        }
    }

    fn remove_mapping_if_owned(
        &mut self,
        key: &MappingKey,
        owner_id: u64,
    ) -> Result<(), StoreError> {
        if self.owned_by(key, owner_id)? {
            match self.mappings.remove(key) {
                Ok(()) => {}
                Err(e) if is_errno(&e, libc::ENOENT) => {}
                Err(e) => return Err(map_error("mappings", "delete")(e)),
            }
        }
        Ok(())
    }

    /// Claims every translation for `owner`, all or nothing. Re-ADD by the
    /// same owner is idempotent; a changed set replaces the old one.
    pub fn claim(
        &mut self,
        owner: &Owner,
        identity: &PodIdentity,
        translations: &[Translation],
    ) -> Result<(), StoreError> {
        let id = owner_id(owner);
        let record = owner_record(owner, now_unix());
        let new_owner = match self.owners.insert(id, record, BPF_NOEXIST) {
            Ok(()) => true,
            Err(e) if is_errno(&e, libc::EEXIST) => {
                let existing = self
                    .owners
                    .get(&id, 0)
                    .map_err(map_error("owners", "lookup"))?;
                if !same_identity(&existing, &record) {
                    let (network, container_id, ifname) = record_strings(&existing);
                    return Err(StoreError::OwnerCollision {
                        owner_id: id,
                        owner: format!("{}/{}/{}", owner.network, owner.container_id, owner.ifname),
                        existing: format!("{network}/{container_id}/{ifname}"),
                    });
                }
                false
            }
            Err(e) => return Err(map_error("owners", "insert")(e)),
        };
        self.record_pod(id, identity);

        let mut claimed = Vec::new();
        match self.claim_all(owner, id, translations, &mut claimed) {
            Ok(()) => Ok(()),
            Err(error) => {
                // Roll back: a new owner leaves nothing behind at all; an
                // existing one loses only what this call added.
                let rollback = if new_owner {
                    self.release_id(id).map(|_| ())
                } else {
                    claimed
                        .iter()
                        .try_for_each(|key| self.remove_mapping_if_owned(key, id))
                };
                if let Err(rollback_error) = rollback {
                    log::error!(
                        "rollback after failed ADD of {} left entries behind: {rollback_error}",
                        owner.container_id
                    );
                }
                Err(error)
            }
        }
    }

    fn claim_all(
        &mut self,
        owner: &Owner,
        id: u64,
        translations: &[Translation],
        claimed: &mut Vec<MappingKey>,
    ) -> Result<(), StoreError> {
        let existing = self.slots(id)?;
        let mut next_slot = existing.len() as u32;
        for translation in translations {
            let value = translation.value(id);
            if !existing.contains(&translation.key) {
                if next_slot >= MAX_SLOTS_PER_OWNER {
                    let error = StoreError::TooManySlots {
                        container_id: owner.container_id.clone(),
                        max: MAX_SLOTS_PER_OWNER,
                    };
                    return Err(error);
                }
                // The slot first: a mapping must never exist that its owner
                // cannot find again after a crash.
                if let Err(e) =
                    self.owner_slots
                        .insert(slot_key(id, next_slot), translation.key, BPF_ANY)
                {
                    return Err(map_error("owner_slots", "insert")(e));
                }
                next_slot += 1;
            }
            match self.claim_one(translation.key, value) {
                Ok(true) => claimed.push(translation.key),
                Ok(false) => {}
                Err(e) => return Err(e),
            }
        }
        // What an earlier ADD of this owner mapped and this one no longer asks for.
        for key in existing {
            if !translations.iter().any(|t| t.key == key)
                && let Err(e) = self.remove_mapping_if_owned(&key, id)
            {
                return Err(e);
            }
        }
        Ok(())
    }

    /// Records `identity` for owner `id` (an empty one leaves what an earlier
    /// ADD recorded). Best effort: it only labels the owner in `list`, logs
    /// and conflict messages, so a failure is logged and the ADD goes on.
    fn record_pod(&mut self, id: u64, identity: &PodIdentity) {
        if identity.is_empty() {
            return;
        }
        let Some(pods) = self.pods.as_mut() else {
            log::warn!("pod identity of owner {id:016x} not recorded: the pod map is missing");
            return;
        };
        if let Err(error) = pods.insert(id, pod_record(identity), BPF_ANY) {
            log::warn!("pod identity of owner {id:016x} not recorded: {error}");
        }
    }

    /// The pod identity recorded for owner `id` (empty when none is).
    pub fn pod_of(&self, id: u64) -> PodIdentity {
        self.pods
            .as_ref()
            .and_then(|pods| pods.get(&id, 0).ok())
            .map(|record| pod_identity(&record))
            .unwrap_or_default()
    }

    /// Removes pod records whose owner is gone (left by an ADD that raced
    /// with the DEL of the same owner). Returns how many it removed.
    pub fn prune_pods(&mut self) -> Result<usize, StoreError> {
        let Some(pods) = self.pods.as_mut() else {
            return Ok(0);
        };
        let ids = pods
            .keys()
            .collect::<Result<Vec<u64>, _>>()
            .map_err(map_error("owner_pods", "iterate"))?;
        let mut removed = 0;
        for id in ids {
            if self.owners.get(&id, 0).is_err() {
                let pods = self.pods.as_mut().expect("checked above");
                match pods.remove(&id) {
                    Ok(()) => removed += 1,
                    Err(e) if is_errno(&e, libc::ENOENT) => {}
                    Err(e) => return Err(map_error("owner_pods", "delete")(e)),
                }
            }
        }
        Ok(removed)
    }

    /// Claims one key; `Ok(true)` when this call created the entry.
    fn claim_one(&mut self, key: MappingKey, value: MappingValue) -> Result<bool, StoreError> {
        // A holder may vanish between our insert and our lookup: retry a few times.
        for _ in 0..3 {
            match self.mappings.insert(key, value, BPF_NOEXIST) {
                Ok(()) => return Ok(true),
                Err(e) if is_errno(&e, libc::EEXIST) => {}
                Err(e) => return Err(map_error("mappings", "insert")(e)),
            }
            let current = match self.mappings.get(&key, 0) {
                Ok(current) => current,
                Err(e) if is_errno(&e, libc::ENOENT) => continue,
                Err(e) => return Err(map_error("mappings", "lookup")(e)),
            };
            if current.owner_id != value.owner_id {
                let record = self.owners.get(&current.owner_id, 0).ok().map(Box::new);
                return Err(StoreError::Conflict {
                    key: KeyDisplay(key),
                    holder: Box::new(HolderDisplay {
                        record,
                        pod: self.pod_of(current.owner_id),
                    }),
                });
            }
            if current == value {
                return Ok(false);
            }
            // Our own entry, pointing elsewhere (e.g. the container got a new
            // address): re-point it in place.
            match self.mappings.insert(key, value, BPF_EXIST) {
                Ok(()) => return Ok(false),
                Err(e) if is_errno(&e, libc::ENOENT) => continue,
                Err(e) => return Err(map_error("mappings", "update")(e)),
            }
        }
        Err(StoreError::Conflict {
            key: KeyDisplay(key),
            holder: Box::new(HolderDisplay {
                record: None,
                pod: PodIdentity::default(),
            }),
        })
    }

    /// Removes everything `owner` holds. Idempotent; returns how many
    /// mappings it removed.
    pub fn release(&mut self, owner: &Owner) -> Result<usize, StoreError> {
        self.release_id(owner_id(owner))
    }

    fn release_id(&mut self, id: u64) -> Result<usize, StoreError> {
        let keys = self.slots(id)?;
        let mut removed = 0;
        for (slot, key) in keys.iter().enumerate().rev() {
            if self.owned_by(key, id)? {
                match self.mappings.remove(key) {
                    Ok(()) => removed += 1,
                    Err(e) if is_errno(&e, libc::ENOENT) => {}
                    Err(e) => return Err(map_error("mappings", "delete")(e)),
                }
            }
            match self.owner_slots.remove(&slot_key(id, slot as u32)) {
                Ok(()) => {}
                Err(e) if is_errno(&e, libc::ENOENT) => {}
                Err(e) => return Err(map_error("owner_slots", "delete")(e)),
            }
        }
        // The pod record before the owner record: a DEL interrupted here
        // leaves an owner without a label, never a label without an owner.
        if let Some(pods) = self.pods.as_mut() {
            match pods.remove(&id) {
                Ok(()) => {}
                Err(e) if is_errno(&e, libc::ENOENT) => {}
                Err(e) => return Err(map_error("owner_pods", "delete")(e)),
            }
        }
        match self.owners.remove(&id) {
            Ok(()) => {}
            Err(e) if is_errno(&e, libc::ENOENT) => {}
            Err(e) => return Err(map_error("owners", "delete")(e)),
        }
        Ok(removed)
    }

    /// Checks that `owner` holds exactly the entries `translations` describe.
    pub fn verify(&self, owner: &Owner, translations: &[Translation]) -> Result<(), StoreError> {
        let id = owner_id(owner);
        for translation in translations {
            let ok = match self.mappings.get(&translation.key, 0) {
                Ok(value) => value == translation.value(id),
                Err(e) if is_errno(&e, libc::ENOENT) => false,
                Err(e) => return Err(map_error("mappings", "lookup")(e)),
            };
            if !ok {
                return Err(StoreError::Missing {
                    key: KeyDisplay(translation.key),
                    container_id: owner.container_id.clone(),
                });
            }
        }
        Ok(())
    }

    /// Every owner with its record.
    pub fn owners(&self) -> Result<Vec<(u64, OwnerRecord)>, StoreError> {
        self.owners
            .iter()
            .collect::<Result<Vec<_>, _>>()
            .map_err(map_error("owners", "iterate"))
    }

    /// The mapping keys `owner` has claimed (from its index; some may since
    /// have been released). Read-only.
    pub fn owned_keys(&self, owner: &Owner) -> Result<Vec<MappingKey>, StoreError> {
        self.slots(owner_id(owner))
    }

    /// Owner IDs that hold at least one mapping. Read-only; one walk of the
    /// mappings map.
    pub fn owners_with_mappings(&self) -> Result<std::collections::HashSet<u64>, StoreError> {
        let mut held = std::collections::HashSet::new();
        for entry in self.mappings.iter() {
            let (_, value) = entry.map_err(map_error("mappings", "iterate"))?;
            held.insert(value.owner_id);
        }
        Ok(held)
    }

    /// Removes everything owner `id` holds, like DEL of that owner (for the
    /// operator's `gc`, which knows owners by ID). Returns how many mappings
    /// it removed.
    pub fn remove_owner(&mut self, id: u64) -> Result<usize, StoreError> {
        self.release_id(id)
    }

    /// GC (CNI 1.1): removes every owner of `network` that is not in `valid`.
    /// Returns the container IDs it removed.
    pub fn collect_garbage(
        &mut self,
        network: &str,
        valid: &[Attachment],
    ) -> Result<Vec<String>, StoreError> {
        let mut removed = Vec::new();
        for (id, record) in self.owners()? {
            let (owner_network, container_id, ifname) = record_strings(&record);
            if owner_network != network {
                continue;
            }
            let keep = valid
                .iter()
                .any(|a| a.container_id == container_id && a.ifname == ifname);
            if !keep {
                self.release_id(id)?;
                removed.push(container_id);
            }
        }
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Protocol;

    fn mapping(
        host_ip: HostIp,
        host_port: u16,
        container_port: u16,
        protocol: Protocol,
    ) -> PortMapping {
        PortMapping {
            host_ip,
            host_port,
            container_port,
            protocol,
        }
    }

    #[test]
    fn plan_maps_each_family_the_container_has_and_host_ip_allows() {
        let dual = ContainerAddrs {
            v4: Some("10.244.0.5".parse().unwrap()),
            v6: Some("fd44::5".parse().unwrap()),
        };
        let both = plan(&[mapping(HostIp::Any, 8080, 80, Protocol::Tcp)], &dual);
        assert_eq!(
            both.len(),
            2,
            "wildcard on a dual-stack container maps both families"
        );
        assert_eq!(both[0].key.family, FAMILY_V4);
        assert_eq!(
            both[0].key.host_addr_be, [0; 4],
            "wildcard key has a zero address"
        );
        assert_eq!(both[0].key.host_port_be, 8080u16.to_be());
        assert_eq!(both[0].key.proto, 6);
        assert_eq!(
            both[0].container_addr_be,
            words_from_addr("10.244.0.5".parse().unwrap())
        );
        assert_eq!(both[0].container_port_be, 80u16.to_be());
        assert_eq!(both[1].key.family, FAMILY_V6);

        let v4_only = plan_for(&dual, HostIp::AnyV4);
        assert_eq!(v4_only.len(), 1);
        assert_eq!(v4_only[0].key.family, FAMILY_V4, "0.0.0.0 maps IPv4 only");
        let v6_only = plan_for(&dual, HostIp::AnyV6);
        assert_eq!(v6_only.len(), 1);
        assert_eq!(v6_only[0].key.family, FAMILY_V6, ":: maps IPv6 only");

        let specific = plan_for(&dual, HostIp::Addr("198.18.0.11".parse().unwrap()));
        assert_eq!(specific.len(), 1);
        assert_eq!(
            addr_from_words(FAMILY_V4, &specific[0].key.host_addr_be),
            "198.18.0.11".parse::<IpAddr>().unwrap()
        );

        let v6_container = ContainerAddrs {
            v4: None,
            v6: dual.v6,
        };
        assert!(
            plan(
                &[mapping(HostIp::AnyV4, 1, 1, Protocol::Udp)],
                &v6_container
            )
            .is_empty(),
            "no IPv4 address, nothing to map for 0.0.0.0"
        );
    }

    fn plan_for(container: &ContainerAddrs, host_ip: HostIp) -> Vec<Translation> {
        plan(&[mapping(host_ip, 8080, 80, Protocol::Tcp)], container)
    }

    #[test]
    fn addresses_round_trip_through_map_words() {
        for text in ["10.1.2.3", "255.0.0.1", "fd18::1", "2001:db8::dead:beef"] {
            let addr: IpAddr = text.parse().unwrap();
            let family = if addr.is_ipv4() { FAMILY_V4 } else { FAMILY_V6 };
            assert_eq!(
                addr_from_words(family, &words_from_addr(addr)),
                addr,
                "{text}"
            );
        }
        // Network order in memory: the first octet is the first byte.
        let words = words_from_addr("10.1.2.3".parse().unwrap());
        assert_eq!(words[0].to_ne_bytes(), [10, 1, 2, 3]);
    }

    #[test]
    fn key_display_is_readable() {
        let key = plan_for(
            &ContainerAddrs {
                v4: Some("10.0.0.2".parse().unwrap()),
                v6: Some("fd00::2".parse().unwrap()),
            },
            HostIp::Any,
        );
        assert_eq!(KeyDisplay(key[0].key).to_string(), "0.0.0.0:8080/tcp");
        assert_eq!(KeyDisplay(key[1].key).to_string(), "[::]:8080/tcp");
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
