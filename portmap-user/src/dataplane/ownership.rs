//! Ownership of port mappings in the pinned maps: claim, release, verify.
//!
//! Every step is one atomic map operation; nothing is read, modified and
//! written back. The protocol, which stays correct when any process is
//! killed at any point and when any number of plugins run at once:
//! - ADD creates the owner record (`BPF_NOEXIST`). A re-ADD first releases
//!   what the new set drops and compacts the index to what it keeps (slot
//!   `i` rewritten with a key from a slot `>= i`, the tail deleted from the
//!   end: every held mapping stays findable at every step), so the new set
//!   only has to fit on its own. Then for each mapping it first writes the
//!   owner's next index slot, then claims the mapping with `BPF_NOEXIST`.
//!   Exactly one claimant of a host port wins; a loser rolls back what it
//!   claimed in this call.
//! - A wildcard and a specific address of one port, protocol and family
//!   exclude each other. Each claim writes its mapping first and looks for
//!   the other kind second (a handshake: of two racing claims at least one
//!   sees the other and rolls back). A specific claim records its port in
//!   `specific_ports` before it writes, so a wildcard claim walks the
//!   mappings map only for ports where a specific one may exist. Those
//!   records are never removed: a remover cannot know that no specific
//!   claim is between its record and its mapping (no count survives
//!   without a lock), and a missing record would let a wildcard skip its
//!   look.
//! - ADD's last step checks that the owner record is still the one it
//!   started with. DEL and GC mark the record dying (one update) before
//!   they read the index, so either they read the ADD's complete index, or
//!   the ADD sees the mark (or no record) and removes everything it wrote,
//!   found by what it wrote, and fails with "try again". Without this a GC
//!   that did not list a container whose ADD was running removed the owner
//!   midway, and the ADD's later mappings belonged to nobody for ever.
//! - DEL walks the owner's slots from the last to the first, deleting each
//!   mapping that still names the owner and then the slot, and finally the
//!   owner record. Interrupted, it leaves a contiguous prefix of slots that
//!   the next DEL or GC finishes. Its cost depends on the owner's mappings
//!   only, never on how many mappings the node has. An ADD of an owner
//!   whose record a killed DEL left dying finishes that DEL first.
//! - Mappings whose owner record is gone all the same (older builds, hand
//!   edits) are found by one walk of the mappings map; GC reclaims them
//!   after a grace period counted from its first sighting (`orphans_seen`),
//!   `status` reports them.
//! - Pod identity (CNI_ARGS) lives in its own map, `owner_pods`, keyed by
//!   owner ID like `owners`. ADD writes it once the owner record is known
//!   to be this owner's (so an ID collision never overwrites another
//!   owner's identity); DEL removes it just before the owner record. It
//!   only labels an owner: a missing record means "no pod known", never an
//!   error.
//!
//! - What proves an owner's container alive lives in `owner_sandboxes`,
//!   keyed the same way and written like the pod record: the `CNI_NETNS`
//!   path, the namespace's (device, inode) and the mount namespace the
//!   path was resolved in, plus `K8S_POD_UID`. A GC that finds the
//!   namespace gone records when (`gone_since`, first sighting) and
//!   removes the owner after a grace period ([`Maps::reclaim_gone`]); DEL
//!   leaves the record to GC's prune (it opens only the maps it needs).
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
    collections::BTreeMap,
    fmt,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    time::{SystemTime, UNIX_EPOCH},
};

use aya::maps::MapError;
use portmap_common::{
    FAMILY_V4, FAMILY_V6, MAX_SLOTS_PER_OWNER, MappingKey, MappingValue, NETNS_PATH_LEN,
    NOMAD_FIELD_LEN, OWNER_IFNAME_LEN, OWNER_NAME_LEN, OWNER_SANDBOXES_MAP, OwnerRecord,
    OwnerSlotKey, POD_NAME_LEN, POD_NAMESPACE_LEN, POD_UID_LEN, PROTO_SCTP, PROTO_TCP, PROTO_UDP,
    PodRecord, PortKey, SPECIFIC_PORTS_MAP, SandboxRecord,
    conditions::{CONDITIONS_MAP, ConditionKey, Conditions},
    owner_flags,
};

use crate::model::{
    Attachment, ContainerAddrs, HostIp, Liveness, MAX_MAPPINGS_MAX, NsId, Owner, PodIdentity,
    PortMapping, Sandbox,
};
use crate::{
    dataplane::hash::fnv1a64,
    dataplane::maps::{Maps, is_errno},
    dataplane::pin::PinLayout,
};

// One owner may hold every entry of the largest mappings map.
const _: () = assert!(MAX_MAPPINGS_MAX <= MAX_SLOTS_PER_OWNER);

const BPF_ANY: u64 = 0;
const BPF_NOEXIST: u64 = 1;
const BPF_EXIST: u64 = 2;

/// One step of rewriting an owner's index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlotStep {
    Write(u32, MappingKey),
    Delete(u32),
}

/// The steps that turn index `index` (slot 0 first) into `keep`, an ordered
/// subsequence of it, in order: see [`Maps::compact_slots`] for why every
/// prefix of them leaves each kept key in a contiguous run of slots.
fn compaction(index: &[MappingKey], keep: &[MappingKey]) -> Vec<SlotStep> {
    let mut steps = Vec::new();
    for (slot, key) in keep.iter().enumerate() {
        if index.get(slot) != Some(key) {
            steps.push(SlotStep::Write(slot as u32, *key));
        }
    }
    for slot in (keep.len()..index.len()).rev() {
        steps.push(SlotStep::Delete(slot as u32));
    }
    steps
}

/// What [`Maps::reclaim_orphans`] did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct OrphanReclaim {
    /// (owner ID, mappings removed).
    pub reclaimed: Vec<(u64, usize)>,
    /// (owner ID, Unix time first seen) of orphans still in their grace period.
    pub waiting: Vec<(u64, u64)>,
}

/// Seconds CNI GC leaves an orphaned mapping alone after first seeing it.
/// An orphan is legitimately there for the milliseconds an ADD needs to
/// undo its writes after a concurrent GC removed its owner; a minute is
/// far beyond that and still frees a stuck port soon.
pub const ORPHAN_GRACE_SECS: u64 = 60;

/// Seconds GC leaves the mappings of a container whose network namespace
/// is gone before it removes them (the agent's `--gone-grace` and
/// `ebpf-portmap gc --gone-grace` change it). A runtime's own DEL, which
/// follows the namespace's removal within moments, comes first; a minute
/// still frees the port soon after a DEL that never comes.
pub const GONE_GRACE_SECS: u64 = 60;

/// One owner whose container's network namespace is gone (see
/// [`Maps::reclaim_gone`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GoneOwner {
    pub id: u64,
    pub network: String,
    pub container_id: String,
    pub ifname: String,
    pub pod: PodIdentity,
    pub netns: Option<std::path::PathBuf>,
    /// Unix time a GC first found the namespace gone.
    pub gone_since: u64,
    /// Mappings removed (0 while waiting).
    pub mappings: usize,
}

/// What [`Maps::reclaim_gone`] found and did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct GoneReclaim {
    /// Removed: the namespace was gone for at least the grace period.
    pub removed: Vec<GoneOwner>,
    /// Gone, still within the grace period.
    pub waiting: Vec<GoneOwner>,
    /// (container ID, why) of owners holding mappings that nothing proves
    /// alive or dead: left alone.
    pub unproven: Vec<(String, String)>,
}

/// Whether an orphan first seen at `first_seen` may be reclaimed at `now`.
pub fn orphan_due(first_seen: u64, now: u64, grace: u64) -> bool {
    now.saturating_sub(first_seen) >= grace
}

/// One entry of the `mappings` map as an owner wants it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Translation {
    pub key: MappingKey,
    pub container_addr_be: [u32; 4],
    pub container_port_be: u16,
    /// `portmap_common::conditions::HAS_CONDITIONS` when the owner's
    /// configuration has conditions for this family (see
    /// [`with_conditions`]); 0 for none.
    pub conditions: u16,
}

impl Translation {
    fn value(&self, owner_id: u64) -> MappingValue {
        MappingValue {
            container_addr_be: self.container_addr_be,
            container_port_be: self.container_port_be,
            conditions: self.conditions,
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
        source: Box<crate::dataplane::maps::MapsError>,
    },
    #[error(
        "the conditions map is not pinned under this pin root (programs of an older build?): the conditionsV4/conditionsV6 of this configuration cannot be enforced"
    )]
    NoConditionsMap,
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
            // A DEL removes the mappings before the record, so this is
            // either that moment or mappings left without an owner.
            None => write!(
                f,
                "another container whose owner record is gone (being removed right now, or left behind: `ebpf-portmap gc --orphans` frees it)"
            ),
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
                conditions: 0,
            });
        }
    }
    plan
}

/// Flags the translations of every family in `families` (those whose
/// configuration has conditions): their mappings send each new flow to the
/// owner's entry in the conditions map first.
pub fn with_conditions(mut translations: Vec<Translation>, families: &[u8]) -> Vec<Translation> {
    for translation in &mut translations {
        if families.contains(&translation.key.family) {
            translation.conditions = portmap_common::conditions::HAS_CONDITIONS;
        }
    }
    translations
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
        // Kept in the sandbox record (see `Maps::pod_of`).
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

fn same_identity(a: &OwnerRecord, b: &OwnerRecord) -> bool {
    record_strings(a) == record_strings(b)
}

pub fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn condition_key(owner_id: u64, family: u8) -> ConditionKey {
    ConditionKey {
        owner_id,
        family,
        _pad0: [0; 7],
    }
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

    /// Deletes `key` if `owner_id` holds it, and raises the mappings epoch
    /// when it did (the programs' cached copies of it go stale). Returns
    /// whether this call deleted it.
    fn remove_mapping_if_owned(
        &mut self,
        key: &MappingKey,
        owner_id: u64,
    ) -> Result<bool, StoreError> {
        if !self.owned_by(key, owner_id)? {
            return Ok(false);
        }
        match self.mappings.remove(key) {
            Ok(()) => {
                self.epoch.raise();
                Ok(true)
            }
            Err(e) if is_errno(&e, libc::ENOENT) => Ok(false),
            Err(e) => Err(map_error("mappings", "delete")(e)),
        }
    }

    /// Claims every translation for `owner`, all or nothing. Re-ADD by the
    /// same owner is idempotent; a changed set replaces the old one (what
    /// the old set held and the new one does not is released first, so the
    /// new set only has to fit on its own).
    ///
    /// `conditions` holds the owner's conditions by family (see
    /// `portmap_common::conditions`): written before any mapping that
    /// names them, and those of the other family removed once the claim
    /// holds (a re-ADD whose configuration dropped them).
    pub fn claim(
        &mut self,
        owner: &Owner,
        identity: &PodIdentity,
        translations: &[Translation],
        conditions: &[(u8, Conditions)],
    ) -> Result<(), StoreError> {
        let id = owner_id(owner);
        let (new_owner, ours) = self.claim_owner(owner, id)?;
        self.record_pod(id, identity);
        if let Err(error) = self.write_conditions(id, conditions) {
            if new_owner && let Err(rollback) = self.release_id(id) {
                log::error!(
                    "rollback after failed ADD of {} left entries behind: {rollback}",
                    owner.container_id
                );
            }
            return Err(error);
        }

        let existing = self.slots(id)?;
        let kept: Vec<MappingKey> = existing
            .iter()
            .copied()
            .filter(|key| translations.iter().any(|t| t.key == *key))
            .collect();
        if kept.len() != existing.len() {
            for key in existing.iter().filter(|key| !kept.contains(key)) {
                self.remove_mapping_if_owned(key, id)?;
            }
            self.compact_slots(id, &existing, &kept)?;
        }

        let mut claimed = Vec::new();
        let mut slots = kept.len() as u32;
        let result = self
            .mark_specific_ports(translations)
            .map(|()| self.mark_mapped_ports(id, translations))
            .and_then(|()| self.claim_all(owner, id, translations, &kept, &mut claimed, &mut slots))
            .and_then(|()| self.check_overlaps(id, translations))
            .and_then(|()| self.still_owner(owner, id, &ours));
        let Err(error) = result else {
            // Conditions of a family this configuration no longer has: no
            // mapping names them any more.
            for family in [FAMILY_V4, FAMILY_V6] {
                if !conditions.iter().any(|(with, _)| *with == family) {
                    self.remove_conditions(id, family)?;
                }
            }
            return Ok(());
        };
        // Roll back: a new owner leaves nothing behind at all; an existing
        // one loses only what this call added; an owner that a DEL or GC
        // removed meanwhile loses everything this call wrote, found by what
        // it wrote (the remover may have read the index before we did).
        let rollback = match error {
            StoreError::Removed { .. } => self.forget_written(id, translations, slots),
            _ if new_owner => self.release_id(id).map(|_| ()),
            _ => claimed
                .iter()
                .try_for_each(|key| self.remove_mapping_if_owned(key, id).map(|_| ()))
                .and_then(|()| {
                    let index = self.slots(id)?;
                    let mut held = Vec::with_capacity(index.len());
                    for key in &index {
                        if self.owned_by(key, id)? {
                            held.push(*key);
                        }
                    }
                    self.compact_slots(id, &index, &held)
                }),
        };
        if let Err(rollback_error) = rollback {
            log::error!(
                "rollback after failed ADD of {} left entries behind: {rollback_error}",
                owner.container_id
            );
        }
        Err(error)
    }

    /// Creates the owner record, or finds this owner's. Returns whether it
    /// is new and the record as it is now (for [`Self::still_owner`]).
    fn claim_owner(&mut self, owner: &Owner, id: u64) -> Result<(bool, OwnerRecord), StoreError> {
        let record = owner_record(owner, now_unix());
        // Twice at most: once more after finishing a removal that a killed
        // DEL or GC left half done.
        for _ in 0..2 {
            match self.owners.insert(id, record, BPF_NOEXIST) {
                Ok(()) => return Ok((true, record)),
                Err(e) if is_errno(&e, libc::EEXIST) => {}
                Err(e) => return Err(map_error("owners", "insert")(e)),
            }
            let existing = match self.owners.get(&id, 0) {
                Ok(existing) => existing,
                Err(e) if is_errno(&e, libc::ENOENT) => continue,
                Err(e) => return Err(map_error("owners", "lookup")(e)),
            };
            if !same_identity(&existing, &record) {
                let (network, container_id, ifname) = record_strings(&existing);
                return Err(StoreError::OwnerCollision {
                    owner_id: id,
                    owner: format!("{}/{}/{}", owner.network, owner.container_id, owner.ifname),
                    existing: format!("{network}/{container_id}/{ifname}"),
                });
            }
            if existing.flags & owner_flags::DYING == 0 {
                return Ok((false, existing));
            }
            // A DEL or GC of this very owner is running or was killed: finish
            // it (idempotent) and start afresh. Should it still be running,
            // it may delete our new record, which `still_owner` then sees.
            self.release_id(id)?;
        }
        Err(StoreError::Removed {
            container_id: owner.container_id.clone(),
        })
    }

    /// The last step of a claim: the owner record must still be the one the
    /// claim started with. A DEL or GC marks a record dying before it reads
    /// the index; so either it read our complete index (we got here first),
    /// or we see the mark or the missing record here and undo our writes.
    fn still_owner(&self, owner: &Owner, id: u64, ours: &OwnerRecord) -> Result<(), StoreError> {
        match self.owners.get(&id, 0) {
            Ok(record) if record == *ours => Ok(()),
            Ok(_) => Err(StoreError::Removed {
                container_id: owner.container_id.clone(),
            }),
            Err(e) if is_errno(&e, libc::ENOENT) => Err(StoreError::Removed {
                container_id: owner.container_id.clone(),
            }),
            Err(e) => Err(map_error("owners", "lookup")(e)),
        }
    }

    /// Undoes a claim whose owner was removed while it ran: every mapping
    /// of `translations` still naming the owner, and index slots 0 to
    /// `slots` (the remover deleted the others, maybe not these).
    fn forget_written(
        &mut self,
        id: u64,
        translations: &[Translation],
        slots: u32,
    ) -> Result<(), StoreError> {
        for translation in translations {
            self.remove_mapping_if_owned(&translation.key, id)?;
        }
        self.remove_all_conditions(id)?;
        for slot in (0..slots).rev() {
            match self.owner_slots.remove(&slot_key(id, slot)) {
                Ok(()) => {}
                Err(e) if is_errno(&e, libc::ENOENT) => {}
                Err(e) => return Err(map_error("owner_slots", "delete")(e)),
            }
        }
        Ok(())
    }

    /// Rewrites the index of `id` from `index` (what it holds now, slot 0
    /// first) to `keep`, an ordered subsequence of it. Ascending: slot `i`
    /// gets `keep[i]`, which sits at a slot `>= i` not yet overwritten, so
    /// a crash at any point leaves every held mapping in a contiguous
    /// prefix of slots (some maybe twice, which DEL tolerates). The tail is
    /// deleted from the last slot down, keeping the prefix contiguous.
    fn compact_slots(
        &mut self,
        id: u64,
        index: &[MappingKey],
        keep: &[MappingKey],
    ) -> Result<(), StoreError> {
        for step in compaction(index, keep) {
            match step {
                SlotStep::Write(slot, key) => self
                    .owner_slots
                    .insert(slot_key(id, slot), key, BPF_ANY)
                    .map_err(map_error("owner_slots", "update"))?,
                SlotStep::Delete(slot) => match self.owner_slots.remove(&slot_key(id, slot)) {
                    Ok(()) => {}
                    Err(e) if is_errno(&e, libc::ENOENT) => {}
                    Err(e) => return Err(map_error("owner_slots", "delete")(e)),
                },
            }
        }
        Ok(())
    }

    fn claim_all(
        &mut self,
        owner: &Owner,
        id: u64,
        translations: &[Translation],
        kept: &[MappingKey],
        claimed: &mut Vec<MappingKey>,
        next_slot: &mut u32,
    ) -> Result<(), StoreError> {
        for translation in translations {
            let value = translation.value(id);
            if !kept.contains(&translation.key) {
                if *next_slot >= MAX_SLOTS_PER_OWNER {
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
                        .insert(slot_key(id, *next_slot), translation.key, BPF_ANY)
                {
                    return Err(map_error("owner_slots", "insert")(e));
                }
                *next_slot += 1;
            }
            match self.claim_one(translation.key, value) {
                Ok(true) => claimed.push(translation.key),
                Ok(false) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Records `identity` for owner `id` (an empty one leaves what an earlier
    /// ADD recorded). Best effort: it only labels the owner in `list`, logs
    /// and conflict messages, so a failure is logged and the ADD goes on.
    fn record_pod(&mut self, id: u64, identity: &PodIdentity) {
        // The pod UID alone is kept in the sandbox record.
        if pod_record(identity) == PodRecord::default() {
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

    /// The pod identity recorded for owner `id` (empty when none is), with
    /// the pod UID of its sandbox record.
    pub fn pod_of(&self, id: u64) -> PodIdentity {
        let mut identity = self
            .pods
            .as_ref()
            .and_then(|pods| pods.get(&id, 0).ok())
            .map(|record| pod_identity(&record))
            .unwrap_or_default();
        identity.pod_uid = self.sandbox_of(id).and_then(|sandbox| sandbox.pod_uid);
        identity
    }

    /// Records what proves owner `id`'s container alive, and its pod UID.
    /// Call once the claim holds (the owner record is this owner's). Best
    /// effort, like the pod record: without it the owner is never judged
    /// gone, which is the safe side.
    pub fn record_sandbox(&mut self, owner: &Owner, sandbox: &Sandbox) {
        let id = owner_id(owner);
        let Some(map) = self.sandboxes.as_mut() else {
            log::warn!(
                "sandbox of {} not recorded: the sandbox map is missing",
                owner.container_id
            );
            return;
        };
        if let Err(error) = map.insert(id, sandbox_record(sandbox), BPF_ANY) {
            log::warn!("sandbox of {} not recorded: {error}", owner.container_id);
        }
    }

    /// The sandbox recorded for owner `id`, if any.
    pub fn sandbox_of(&self, id: u64) -> Option<Sandbox> {
        let record = self.sandboxes.as_ref()?.get(&id, 0).ok()?;
        Some(sandbox_of_record(&record))
    }

    /// Removes sandbox records whose owner is gone (DEL leaves them, see
    /// the module doc). Returns how many it removed.
    pub fn prune_sandboxes(&mut self) -> Result<usize, StoreError> {
        let Some(map) = self.sandboxes.as_ref() else {
            return Ok(0);
        };
        let ids = map
            .keys()
            .collect::<Result<Vec<u64>, _>>()
            .map_err(map_error(OWNER_SANDBOXES_MAP, "iterate"))?;
        let mut removed = 0;
        for id in ids {
            if self.owners.get(&id, 0).is_err() {
                let map = self.sandboxes.as_mut().expect("checked above");
                match map.remove(&id) {
                    Ok(()) => removed += 1,
                    Err(e) if is_errno(&e, libc::ENOENT) => {}
                    Err(e) => return Err(map_error(OWNER_SANDBOXES_MAP, "delete")(e)),
                }
            }
        }
        Ok(removed)
    }

    /// Removes every owner that holds mappings and whose container's
    /// network namespace `judge` finds gone for at least `grace` seconds
    /// before `now`; records the first sighting of the others
    /// (`gone_since`) and forgets it when a namespace is back. Owners that
    /// nothing proves dead (no record, no `CNI_NETNS`, a mount namespace
    /// the caller cannot see) are left and reported.
    pub fn reclaim_gone(
        &mut self,
        grace: u64,
        now: u64,
        mut judge: impl FnMut(&Sandbox) -> Liveness,
    ) -> Result<GoneReclaim, StoreError> {
        let mut outcome = GoneReclaim::default();
        let held = self.owners_with_mappings()?;
        for (id, record) in self.owners()? {
            if !held.contains(&id) || record.flags & owner_flags::DYING != 0 {
                continue;
            }
            let (network, container_id, ifname) = record_strings(&record);
            let Some(mut sandbox) = self.sandbox_of(id) else {
                outcome.unproven.push((
                    container_id,
                    "no sandbox recorded (added by an older build)".into(),
                ));
                continue;
            };
            let gone_since = match judge(&sandbox) {
                Liveness::Unknown(why) => {
                    outcome.unproven.push((container_id, why));
                    continue;
                }
                Liveness::Alive => {
                    if sandbox.gone_since.is_some() {
                        sandbox.gone_since = None;
                        self.update_sandbox(id, &sandbox);
                    }
                    continue;
                }
                Liveness::Gone => match sandbox.gone_since {
                    Some(since) => since,
                    None => {
                        sandbox.gone_since = Some(now);
                        self.update_sandbox(id, &sandbox);
                        now
                    }
                },
            };
            let mut gone = GoneOwner {
                id,
                network,
                container_id,
                ifname,
                pod: self.pod_of(id),
                netns: sandbox.netns.clone(),
                gone_since,
                mappings: 0,
            };
            if !orphan_due(gone_since, now, grace) {
                outcome.waiting.push(gone);
                continue;
            }
            // The owner may have been removed and added again meanwhile (a
            // new sandbox of the same container ID and ifname): only the
            // record judged goes.
            match self.owners.get(&id, 0) {
                Ok(current) if current.created_unix == record.created_unix => {}
                _ => continue,
            }
            gone.mappings = self.release_id(id)?;
            outcome.removed.push(gone);
        }
        Ok(outcome)
    }

    /// Rewrites an existing sandbox record (`gone_since`); an owner removed
    /// meanwhile has none to rewrite.
    fn update_sandbox(&mut self, id: u64, sandbox: &Sandbox) {
        if let Some(map) = self.sandboxes.as_mut()
            && let Err(error) = map.insert(id, sandbox_record(sandbox), BPF_EXIST)
            && !is_errno(&error, libc::ENOENT)
        {
            log::warn!("sandbox record of owner {id:016x} not updated: {error}");
        }
    }

    /// Writes the owner's conditions (whole entries: the programs read
    /// either the old or the new one). Refuses when the map is missing: a
    /// configuration with conditions must never be served without them.
    fn write_conditions(
        &mut self,
        id: u64,
        conditions: &[(u8, Conditions)],
    ) -> Result<(), StoreError> {
        if conditions.is_empty() {
            return Ok(());
        }
        let Some(map) = self.conditions.as_mut() else {
            return Err(StoreError::NoConditionsMap);
        };
        for (family, entry) in conditions {
            map.insert(condition_key(id, *family), *entry, BPF_ANY)
                .map_err(map_error(CONDITIONS_MAP, "update"))?;
        }
        Ok(())
    }

    /// Removes the owner's conditions of `family`, if any.
    fn remove_conditions(&mut self, id: u64, family: u8) -> Result<(), StoreError> {
        let Some(map) = self.conditions.as_mut() else {
            return Ok(());
        };
        match map.remove(&condition_key(id, family)) {
            Ok(()) => Ok(()),
            Err(e) if is_errno(&e, libc::ENOENT) => Ok(()),
            Err(e) => Err(map_error(CONDITIONS_MAP, "delete")(e)),
        }
    }

    fn remove_all_conditions(&mut self, id: u64) -> Result<(), StoreError> {
        self.remove_conditions(id, FAMILY_V4)?;
        self.remove_conditions(id, FAMILY_V6)
    }

    /// The owner's conditions of `family`, if any (for `list` and tests).
    pub fn conditions_of(&self, id: u64, family: u8) -> Option<Conditions> {
        self.conditions
            .as_ref()?
            .get(&condition_key(id, family), 0)
            .ok()
    }

    /// Removes conditions whose owner is gone (an ADD that raced with the
    /// DEL of the same owner, a killed DEL). Returns how many it removed.
    pub fn prune_conditions(&mut self) -> Result<usize, StoreError> {
        let Some(map) = self.conditions.as_mut() else {
            return Ok(0);
        };
        let keys = map
            .keys()
            .collect::<Result<Vec<ConditionKey>, _>>()
            .map_err(map_error(CONDITIONS_MAP, "iterate"))?;
        let mut removed = 0;
        for key in keys {
            if self.owners.get(&key.owner_id, 0).is_err() {
                let map = self.conditions.as_mut().expect("checked above");
                match map.remove(&key) {
                    Ok(()) => removed += 1,
                    Err(e) if is_errno(&e, libc::ENOENT) => {}
                    Err(e) => return Err(map_error(CONDITIONS_MAP, "delete")(e)),
                }
            }
        }
        Ok(removed)
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
                Ok(()) => {
                    self.epoch.raise();
                    return Ok(false);
                }
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
        self.mark_dying(id)?;
        let keys = self.slots(id)?;
        let mut removed = 0;
        for (slot, key) in keys.iter().enumerate().rev() {
            if self.remove_mapping_if_owned(key, id)? {
                removed += 1;
            }
            match self.owner_slots.remove(&slot_key(id, slot as u32)) {
                Ok(()) => {}
                Err(e) if is_errno(&e, libc::ENOENT) => {}
                Err(e) => return Err(map_error("owner_slots", "delete")(e)),
            }
        }
        // The conditions after the mappings that name them.
        self.remove_all_conditions(id)?;
        // The pod record before the owner record: a DEL interrupted here
        // leaves an owner without a label, never a label without an owner.
        if let Some(pods) = self.pods.as_mut() {
            match pods.remove(&id) {
                Ok(()) => {}
                Err(e) if is_errno(&e, libc::ENOENT) => {}
                Err(e) => return Err(map_error("owner_pods", "delete")(e)),
            }
        }
        if let Some(sandboxes) = self.sandboxes.as_mut() {
            match sandboxes.remove(&id) {
                Ok(()) => {}
                Err(e) if is_errno(&e, libc::ENOENT) => {}
                Err(e) => return Err(map_error(OWNER_SANDBOXES_MAP, "delete")(e)),
            }
        }
        match self.owners.remove(&id) {
            Ok(()) => {}
            Err(e) if is_errno(&e, libc::ENOENT) => {}
            Err(e) => return Err(map_error("owners", "delete")(e)),
        }
        Ok(removed)
    }

    /// Marks owner `id` dying (one atomic update) before its index is read,
    /// so a concurrent ADD of it undoes its own writes (see `still_owner`).
    fn mark_dying(&mut self, id: u64) -> Result<(), StoreError> {
        let mut record = match self.owners.get(&id, 0) {
            Ok(record) => record,
            Err(e) if is_errno(&e, libc::ENOENT) => return Ok(()),
            Err(e) => return Err(map_error("owners", "lookup")(e)),
        };
        if record.flags & owner_flags::DYING != 0 {
            return Ok(());
        }
        record.flags |= owner_flags::DYING;
        match self.owners.insert(id, record, BPF_EXIST) {
            Ok(()) => Ok(()),
            // Removed meanwhile: nothing left to mark.
            Err(e) if is_errno(&e, libc::ENOENT) => Ok(()),
            Err(e) => Err(map_error("owners", "update")(e)),
        }
    }

    /// Opens the map of ports with specific claims, creating it on the first
    /// ADD of this build. The build that creates it fills it from the
    /// mappings already there (made by an older build), so no specific
    /// mapping escapes a later wildcard's check.
    fn specific_ports(&mut self, layout: &PinLayout) -> Result<(), StoreError> {
        if self.specific_ports.is_some() {
            return Ok(());
        }
        let (mut map, created) = crate::dataplane::maps::create_user_map::<PortKey, u32>(
            layout,
            &crate::dataplane::maps::SPECIFIC_PORTS,
        )
        .map_err(|source| StoreError::UserMap {
            map: SPECIFIC_PORTS_MAP,
            source: Box::new(source),
        })?;
        if created {
            for entry in &self.mappings {
                let (key, _) = entry.map_err(map_error("mappings", "iterate"))?;
                if key.host_addr_be != [0; 4] {
                    map.insert(PortKey::of(&key), 1, BPF_ANY)
                        .map_err(map_error(SPECIFIC_PORTS_MAP, "insert"))?;
                }
            }
        }
        self.specific_ports = Some(map);
        Ok(())
    }

    /// Prepares a claim: opens (or creates) the maps it needs beyond the
    /// ones the eBPF object pins.
    pub fn prepare_claim(&mut self, layout: &PinLayout) -> Result<(), StoreError> {
        self.specific_ports(layout)
    }

    /// Records the port of every specific translation in `specific_ports`,
    /// before any is claimed (the first half of the overlap handshake, see
    /// [`Self::check_overlaps`]).
    fn mark_specific_ports(&mut self, translations: &[Translation]) -> Result<(), StoreError> {
        let Some(map) = self.specific_ports.as_mut() else {
            return Ok(());
        };
        for translation in translations {
            if translation.key.host_addr_be != [0; 4] {
                map.insert(PortKey::of(&translation.key), 1, BPF_ANY)
                    .map_err(map_error(SPECIFIC_PORTS_MAP, "insert"))?;
            }
        }
        Ok(())
    }

    /// Marks the ports of every translation in the programs' port filter,
    /// before any is claimed (see `maps::MappedPorts`).
    fn mark_mapped_ports(&self, id: u64, translations: &[Translation]) {
        if let Some(ports) = self.mapped_ports.as_ref() {
            for translation in translations {
                ports.mark(&translation.key, &translation.value(id));
            }
        }
    }

    /// A wildcard and a specific address on the same port, protocol and
    /// family exclude each other, as bind() and kube-scheduler's NodePorts
    /// filter treat them. Run after this claim's mappings are in the map:
    /// each side writes first and looks for the other second, so of two
    /// racing claims at least one sees the other (and rolls back; both may,
    /// never neither). A specific claim looks up the family's wildcard key;
    /// a wildcard claim walks the mappings map once, and only when a
    /// specific address was ever claimed on one of its ports.
    fn check_overlaps(&self, id: u64, translations: &[Translation]) -> Result<(), StoreError> {
        let mut wildcard_ports = std::collections::BTreeMap::new();
        for translation in translations {
            let key = translation.key;
            if key.host_addr_be == [0; 4] {
                wildcard_ports.insert(PortKey::of(&key), key);
                continue;
            }
            let wildcard = MappingKey {
                host_addr_be: [0; 4],
                ..key
            };
            match self.mappings.get(&wildcard, 0) {
                Ok(value) if value.owner_id != id => {
                    return Err(self.overlap(key, wildcard, value.owner_id));
                }
                Ok(_) => {}
                Err(e) if is_errno(&e, libc::ENOENT) => {}
                Err(e) => return Err(map_error("mappings", "lookup")(e)),
            }
        }
        let marked = |port: &PortKey| match &self.specific_ports {
            Some(map) => map.get(port, 0).is_ok(),
            // No map (it could not be created): look everywhere.
            None => true,
        };
        wildcard_ports.retain(|port, _| marked(port));
        if wildcard_ports.is_empty() {
            return Ok(());
        }
        for entry in &self.mappings {
            let (key, value) = entry.map_err(map_error("mappings", "iterate"))?;
            if key.host_addr_be == [0; 4] || value.owner_id == id {
                continue;
            }
            if let Some(wildcard) = wildcard_ports.get(&PortKey::of(&key)) {
                return Err(self.overlap(*wildcard, key, value.owner_id));
            }
        }
        Ok(())
    }

    fn overlap(&self, key: MappingKey, held: MappingKey, holder: u64) -> StoreError {
        StoreError::Overlap {
            key: KeyDisplay(key),
            held: KeyDisplay(held),
            holder: Box::new(HolderDisplay {
                record: self.owners.get(&holder, 0).ok().map(Box::new),
                pod: self.pod_of(holder),
            }),
        }
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

    /// The index of owner `id`: the mapping keys of its slots, slot 0 first.
    /// Read-only.
    pub fn owner_index(&self, id: u64) -> Result<Vec<MappingKey>, StoreError> {
        self.slots(id)
    }

    /// Owner IDs that hold at least one mapping. Read-only; one walk of the
    /// mappings map.
    pub fn owners_with_mappings(&self) -> Result<std::collections::HashSet<u64>, StoreError> {
        let mut held = std::collections::HashSet::new();
        for entry in &self.mappings {
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

    /// Mappings whose owner record is gone, by owner ID: nobody's DEL will
    /// ever remove them, and every ADD of their ports fails. One walk of
    /// the mappings map. Read-only.
    pub fn orphans(&self) -> Result<BTreeMap<u64, Vec<MappingKey>>, StoreError> {
        let mut known = std::collections::HashMap::new();
        let mut orphans: BTreeMap<u64, Vec<MappingKey>> = BTreeMap::new();
        for entry in &self.mappings {
            let (key, value) = entry.map_err(map_error("mappings", "iterate"))?;
            let has_record = match known.get(&value.owner_id) {
                Some(has) => *has,
                None => {
                    let has = match self.owners.get(&value.owner_id, 0) {
                        Ok(_) => true,
                        Err(e) if is_errno(&e, libc::ENOENT) => false,
                        Err(e) => return Err(map_error("owners", "lookup")(e)),
                    };
                    known.insert(value.owner_id, has);
                    has
                }
            };
            if !has_record {
                orphans.entry(value.owner_id).or_default().push(key);
            }
        }
        Ok(orphans)
    }

    /// Reclaims orphaned mappings (see [`Self::orphans`]) first seen at
    /// least `grace` seconds before `now`; records when the others were
    /// first seen, in `orphans_seen`, for a later GC. The grace covers the
    /// moments an orphan is legitimately there: an ADD undoing its writes
    /// after a concurrent GC removed its owner. Returns what it reclaimed
    /// (owner ID, mappings) and what it still waits for (owner ID, first
    /// seen).
    pub fn reclaim_orphans(
        &mut self,
        layout: &PinLayout,
        grace: u64,
        now: u64,
    ) -> Result<OrphanReclaim, StoreError> {
        let orphans = self.orphans()?;
        let mut outcome = OrphanReclaim::default();
        if orphans.is_empty() && self.orphans.is_none() {
            return Ok(outcome);
        }
        if self.orphans.is_none() {
            let (map, _) = crate::dataplane::maps::create_user_map::<u64, u64>(
                layout,
                &crate::dataplane::maps::ORPHANS,
            )
            .map_err(|source| StoreError::UserMap {
                map: portmap_common::ORPHANS_MAP,
                source: Box::new(source),
            })?;
            self.orphans = Some(map);
        }
        let seen_map = self.orphans.as_mut().expect("created above");
        // Sightings of owners that are no longer orphaned: forget them.
        let stale: Vec<u64> = seen_map
            .keys()
            .filter_map(Result::ok)
            .filter(|id| !orphans.contains_key(id))
            .collect();
        for id in stale {
            let _ = seen_map.remove(&id);
        }
        for (id, keys) in orphans {
            let seen_map = self.orphans.as_mut().expect("created above");
            let first_seen = match seen_map.get(&id, 0) {
                Ok(first_seen) => first_seen,
                Err(_) => {
                    // BPF_NOEXIST: of two GCs seeing it first, the earlier time stays.
                    let _ = seen_map.insert(id, now, BPF_NOEXIST);
                    seen_map.get(&id, 0).unwrap_or(now)
                }
            };
            if !orphan_due(first_seen, now, grace) {
                outcome.waiting.push((id, first_seen));
                continue;
            }
            let mut removed = 0;
            for key in &keys {
                // The record may be back (the container was added again):
                // then these are its mappings, not orphans.
                if self.owners.get(&id, 0).is_ok() {
                    break;
                }
                if self.remove_mapping_if_owned(key, id)? {
                    removed += 1;
                }
            }
            if self.owners.get(&id, 0).is_err() {
                // Whatever index and label the lost owner left go too.
                let slots = self.slots(id)?.len() as u32;
                for slot in (0..slots).rev() {
                    let _ = self.owner_slots.remove(&slot_key(id, slot));
                }
                if let Some(pods) = self.pods.as_mut() {
                    let _ = pods.remove(&id);
                }
                if let Some(sandboxes) = self.sandboxes.as_mut() {
                    let _ = sandboxes.remove(&id);
                }
                let _ = self.remove_all_conditions(id);
            }
            if let Some(seen_map) = self.orphans.as_mut() {
                let _ = seen_map.remove(&id);
            }
            outcome.reclaimed.push((id, removed));
        }
        Ok(outcome)
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
    use crate::model::Protocol;

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

    fn port(port: u16) -> MappingKey {
        MappingKey {
            host_port_be: port.to_be(),
            proto: PROTO_TCP,
            family: FAMILY_V4,
            ..MappingKey::default()
        }
    }

    #[test]
    fn compaction_never_loses_a_kept_key_at_any_step() {
        let index: Vec<MappingKey> = (1..=8).map(port).collect();
        // Every subsequence of the index (as kept by a re-ADD or a rollback).
        for mask in 0u32..(1 << index.len()) {
            let keep: Vec<MappingKey> = index
                .iter()
                .enumerate()
                .filter(|(i, _)| mask & (1 << i) != 0)
                .map(|(_, k)| *k)
                .collect();
            let steps = compaction(&index, &keep);
            let mut slots: Vec<Option<MappingKey>> = index.iter().copied().map(Some).collect();
            for (done, step) in steps.iter().enumerate() {
                match *step {
                    SlotStep::Write(slot, key) => slots[slot as usize] = Some(key),
                    SlotStep::Delete(slot) => slots[slot as usize] = None,
                }
                // What DEL finds after a crash here: the contiguous prefix.
                let found: Vec<MappingKey> = slots.iter().map_while(|s| *s).collect();
                for key in &keep {
                    assert!(
                        found.contains(key),
                        "keep {keep:?}: {key:?} unreachable after {} step(s)",
                        done + 1
                    );
                }
            }
            let found: Vec<MappingKey> = slots.iter().map_while(|s| *s).collect();
            assert_eq!(found, keep, "the index ends as exactly the kept keys");
            assert!(slots[keep.len()..].iter().all(Option::is_none));
        }
    }

    #[test]
    fn orphans_wait_out_the_grace_period() {
        assert!(!orphan_due(100, 100, ORPHAN_GRACE_SECS), "just seen");
        assert!(!orphan_due(
            100,
            100 + ORPHAN_GRACE_SECS - 1,
            ORPHAN_GRACE_SECS
        ));
        assert!(orphan_due(100, 100 + ORPHAN_GRACE_SECS, ORPHAN_GRACE_SECS));
        assert!(orphan_due(100, 100, 0), "--min-age 0 reclaims at once");
        assert!(!orphan_due(200, 100, 10), "a clock that went back waits");
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
