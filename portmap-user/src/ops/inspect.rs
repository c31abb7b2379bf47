//! What the operator verbs show, read from the kernel: every mapping with
//! its owner, traffic counters and live flows (`list`), and the state of the
//! dataplane on this node (`status`). Read-only; nothing here changes a map
//! or an attachment.

use std::{
    collections::HashMap as StdHashMap,
    fs,
    net::IpAddr,
    os::fd::AsFd as _,
    path::PathBuf,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use aya::{
    maps::{MapError, MapInfo, MapType},
    programs::{
        ProgramInfo,
        links::{FdLink, PinnedLink},
    },
};
use portmap_common::{
    CtEntry, CtKey, FAMILY_V4, MappingCounters, MappingKey, MappingValue, OwnerRecord, TraceFilter,
    ct_kind, ct_timeout, local::SockCounters, map_names, stat,
};

use crate::model::{Liveness, PodIdentity, Sandbox};
use crate::{
    dataplane::attach,
    dataplane::counters,
    dataplane::features::AttachMode,
    dataplane::key_notes::{self, KeyNote},
    dataplane::maps::{self, Maps, MapsError},
    dataplane::node_state,
    dataplane::object::build_id,
    dataplane::ownership::{KeyDisplay, addr_from_words, protocol_name, record_strings},
    dataplane::pin::{Direction, PinLayout, parse_link_name},
    dataplane::trace,
    node::netlink,
};

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

fn read_error(map: &'static str) -> impl FnOnce(MapError) -> InspectError {
    move |source| InspectError::Read { map, source }
}

/// `CLOCK_MONOTONIC` in nanoseconds: the clock of the flows' `last_seen_ns` (`bpf_ktime_get_coarse_ns`, the same clock at tick resolution).
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Which (mapping, container address, container port) a live flow was
/// translated to.
pub type FlowTarget = (MappingKey, [u32; 4], u16);

/// Live translated flows by target: DNAT entries of the open-flow tables
/// (`conntrack`, `conntrack_other`) that have not idled past their timeout
/// at `now_ns`. A TCP flow that closed (FIN both ways, or RST) has left
/// those tables for `conntrack_close` and no longer counts; one that saw
/// only its SYN counts for a minute.
pub fn live_flows(
    entries: impl IntoIterator<Item = (CtKey, CtEntry)>,
    now_ns: u64,
) -> StdHashMap<FlowTarget, u64> {
    let mut flows = StdHashMap::new();
    for (key, entry) in entries {
        if entry.kind != ct_kind::DNAT
            || now_ns.saturating_sub(entry.last_seen_ns)
                > ct_timeout::for_entry(key.proto, entry.tcp_state)
        {
            continue;
        }
        *flows
            .entry((entry.mapping, entry.nat_addr_be, entry.nat_port_be))
            .or_insert(0) += 1;
    }
    flows
}

/// One mapping as `list` shows it.
#[derive(Debug, Clone)]
pub struct MappingRow {
    pub key: MappingKey,
    pub value: MappingValue,
    /// `None` while the owner is being removed (or its record is lost).
    pub owner: Option<OwnerRecord>,
    /// The owner's pod, from CNI_ARGS at ADD (empty when the runtime named
    /// none, or the owner was added by a build that did not record it).
    pub pod: PodIdentity,
    pub counters: MappingCounters,
    /// What the socket hooks translated for it: node processes dialling
    /// the host port, whose connections cross no tc hook and so are not
    /// in `counters`.
    pub sock: SockCounters,
    pub active_flows: u64,
    /// What ADD recorded of the owner's sandbox (`None`: nothing, e.g.
    /// added by an older build).
    pub sandbox: Option<Sandbox>,
    /// Whether the owner's container is still there, as far as can be
    /// proven from here (see `node::sandbox`).
    pub liveness: Liveness,
}

impl MappingRow {
    /// "container namespace gone since 2026-12-03T19:04:33Z (first seen
    /// by GC)" for a mapping whose container is gone; `None` otherwise.
    pub fn gone_marker(&self) -> Option<String> {
        if self.liveness != Liveness::Gone {
            return None;
        }
        Some(
            match self.sandbox.as_ref().and_then(|sandbox| sandbox.gone_since) {
                Some(since) => format!(
                    "container namespace gone since {}",
                    crate::logging::utc_timestamp(UNIX_EPOCH + Duration::from_secs(since))
                ),
                None => "container namespace gone (not yet seen by GC)".into(),
            },
        )
    }

    /// `198.18.0.1:8080/tcp`, `0.0.0.0:8080/udp`, `[::]:80/sctp`.
    pub fn host(&self) -> String {
        KeyDisplay(self.key).to_string()
    }

    /// The host address as `list` shows it: the family's wildcard
    /// (`0.0.0.0`, `::`) for a mapping on every node address.
    pub fn host_addr(&self) -> IpAddr {
        addr_from_words(self.key.family, &self.key.host_addr_be)
    }

    /// The host address, `None` for the family's wildcard.
    pub fn host_ip(&self) -> Option<IpAddr> {
        (self.key.host_addr_be != [0; 4])
            .then(|| addr_from_words(self.key.family, &self.key.host_addr_be))
    }

    pub fn host_port(&self) -> u16 {
        u16::from_be(self.key.host_port_be)
    }

    pub fn protocol(&self) -> &'static str {
        protocol_name(self.key.proto)
    }

    pub fn family(&self) -> &'static str {
        if self.key.family == FAMILY_V4 {
            "ipv4"
        } else {
            "ipv6"
        }
    }

    pub fn container_ip(&self) -> IpAddr {
        addr_from_words(self.key.family, &self.value.container_addr_be)
    }

    pub fn container_port(&self) -> u16 {
        u16::from_be(self.value.container_port_be)
    }

    /// `10.244.0.5:80`, `[fd44::5]:80`.
    pub fn container(&self) -> String {
        match self.container_ip() {
            IpAddr::V4(a) => format!("{a}:{}", self.container_port()),
            IpAddr::V6(a) => format!("[{a}]:{}", self.container_port()),
        }
    }

    /// (network, container ID, ifname); the owner ID in hex when the record
    /// is missing.
    pub fn owner_strings(&self) -> (String, String, String) {
        self.owner.as_ref().map_or_else(
            || {
                (
                    "?".into(),
                    format!("{:016x}", self.value.owner_id),
                    "?".into(),
                )
            },
            record_strings,
        )
    }

    pub fn created(&self) -> Option<SystemTime> {
        self.owner
            .as_ref()
            .filter(|o| o.created_unix != 0)
            .map(|o| UNIX_EPOCH + Duration::from_secs(o.created_unix))
    }

    /// Sort order of `list`: port, protocol, family, address.
    pub fn sort_key(&self) -> (u16, u8, u8, [u8; 16]) {
        let mut addr = [0u8; 16];
        for (i, word) in self.key.host_addr_be.iter().enumerate() {
            addr[i * 4..i * 4 + 4].copy_from_slice(&word.to_ne_bytes());
        }
        (self.host_port(), self.key.proto, self.key.family, addr)
    }
}

fn require_installed(layout: &PinLayout) -> Result<(), InspectError> {
    if layout.map(map_names::MAPPINGS).exists() {
        Ok(())
    } else {
        Err(InspectError::NotInstalled {
            root: layout.root().to_path_buf(),
        })
    }
}

/// Every mapping with owner, counters and live flows, sorted by port,
/// protocol, family and address. Counters and flows read as zero when
/// their maps are missing (pins of an older build).
pub fn mapping_rows(layout: &PinLayout) -> Result<Vec<MappingRow>, InspectError> {
    require_installed(layout)?;
    let maps = Maps::open(layout)?;
    let counters_map = maps::counters(layout).ok();
    let sock_map = maps::sock_counters(layout).ok();
    // A table missing (pins of an older build) has no flows.
    let mut entries: Vec<(CtKey, CtEntry)> = Vec::new();
    for table in [map_names::CONNTRACK, map_names::CONNTRACK_OTHER] {
        if let Ok(conntrack) = maps::conntrack(layout, table) {
            for entry in &conntrack {
                entries.push(entry.map_err(read_error(table))?);
            }
        }
    }
    let flows = live_flows(entries, monotonic_ns());
    let mut rows = Vec::new();
    let mut judge = crate::node::sandbox::Judge::new();
    let mut judged: StdHashMap<u64, Liveness> = StdHashMap::new();
    for entry in &maps.mappings {
        let (key, value) = entry.map_err(read_error("mappings"))?;
        let owner = maps.owners.get(&value.owner_id, 0).ok();
        let pod = maps.pod_of(value.owner_id);
        let sandbox = maps.sandbox_of(value.owner_id);
        let liveness = judged
            .entry(value.owner_id)
            .or_insert_with(|| match &sandbox {
                Some(sandbox) => judge.judge(sandbox),
                None => Liveness::Unknown("no sandbox recorded (added by an older build)".into()),
            })
            .clone();
        let counters = match &counters_map {
            Some(map) => counters::read(map, &key, value.owner_id)?,
            None => MappingCounters::default(),
        };
        let sock = match &sock_map {
            Some(map) => counters::read_sock(map, &key, value.owner_id)?,
            None => SockCounters::default(),
        };
        let active_flows = flows
            .get(&(key, value.container_addr_be, value.container_port_be))
            .copied()
            .unwrap_or(0);
        rows.push(MappingRow {
            key,
            value,
            owner,
            pod,
            counters,
            sock,
            active_flows,
            sandbox,
            liveness,
        });
    }
    rows.sort_by_key(MappingRow::sort_key);
    Ok(rows)
}

/// What differs between the owners' indexes (`owner_slots`) and the
/// mappings map: what `status` reports as lost or stuck.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ownership {
    /// Mappings whose owner record is gone, by owner ID: nobody's DEL
    /// removes them, and ADDs of their ports fail.
    pub orphans: Vec<(u64, Vec<MappingKey>)>,
    /// Mappings an owner's index names that the mappings map lacks (deleted
    /// behind the plugin's back) or that another owner holds: (owner, key,
    /// holder).
    pub missing: Vec<(String, MappingKey, Option<String>)>,
    /// Mappings of an owner that its index does not name, so its DEL would
    /// leave them behind: (owner, key).
    pub unindexed: Vec<(String, MappingKey)>,
}

impl Ownership {
    pub fn is_consistent(&self) -> bool {
        self.orphans.is_empty() && self.missing.is_empty() && self.unindexed.is_empty()
    }
}

/// `container/ifname (network N)` of an owner record.
fn owner_label(record: &OwnerRecord) -> String {
    let (network, container_id, ifname) = record_strings(record);
    format!("{container_id}/{ifname} (network {network})")
}

/// Compares every owner's index with the mappings map: one walk of each
/// owner's slots and one of the mappings. Read-only. An ADD or DEL running
/// meanwhile can show up for a moment (a slot is written just before its
/// mapping, and removed just after).
pub fn ownership(layout: &PinLayout) -> Result<Ownership, InspectError> {
    require_installed(layout)?;
    let maps = Maps::open(layout)?;
    let store_error = |source| InspectError::Store(Box::new(source));
    let mut report = Ownership {
        orphans: maps.orphans().map_err(store_error)?.into_iter().collect(),
        ..Ownership::default()
    };
    let owners = maps.owners().map_err(store_error)?;
    let labels: StdHashMap<u64, String> = owners
        .iter()
        .map(|(id, record)| (*id, owner_label(record)))
        .collect();
    let mut indexed = std::collections::HashSet::new();
    for (id, _) in &owners {
        for key in maps.owner_index(*id).map_err(store_error)? {
            indexed.insert((*id, key));
            match maps.mappings.get(&key, 0) {
                Ok(value) if value.owner_id == *id => {}
                Ok(value) => report.missing.push((
                    labels[id].clone(),
                    key,
                    Some(
                        labels
                            .get(&value.owner_id)
                            .cloned()
                            .unwrap_or_else(|| format!("owner {:016x}", value.owner_id)),
                    ),
                )),
                Err(_) => report.missing.push((labels[id].clone(), key, None)),
            }
        }
    }
    for entry in &maps.mappings {
        let (key, value) = entry.map_err(read_error("mappings"))?;
        if let Some(label) = labels.get(&value.owner_id)
            && !indexed.contains(&(value.owner_id, key))
        {
            report.unindexed.push((label.clone(), key));
        }
    }
    report
        .missing
        .sort_by_key(|(owner, key, _)| (owner.clone(), *key));
    report.unindexed.sort();
    Ok(report)
}

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

/// Entries of a hash-type map, counted by walking its keys with
/// `BPF_MAP_GET_NEXT_KEY` (one syscall per entry: about a second for a
/// quarter million conntrack entries). Works for any key type, so maps
/// this module does not know are counted too.
fn count_keys(fd: std::os::fd::BorrowedFd<'_>, key_size: u32) -> Option<u64> {
    use std::os::fd::AsRawFd;
    const BPF_MAP_GET_NEXT_KEY: libc::c_long = 4;
    #[repr(C)]
    struct Attr {
        map_fd: u32,
        _pad: u32,
        key: u64,
        next_key: u64,
        flags: u64,
    }
    let mut key = vec![0u8; key_size as usize];
    let mut next = vec![0u8; key_size as usize];
    let mut count = 0u64;
    let mut first = true;
    loop {
        let mut attr = Attr {
            map_fd: fd.as_raw_fd() as u32,
            _pad: 0,
            key: if first { 0 } else { key.as_ptr() as u64 },
            next_key: next.as_mut_ptr() as u64,
            flags: 0,
        };
        // SAFETY: attr points at buffers of the map's key size that live
        // across the call; the kernel reads `key` and writes `next_key`.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_MAP_GET_NEXT_KEY,
                &raw mut attr,
                std::mem::size_of::<Attr>() as u32,
            )
        };
        if rc != 0 {
            return (std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOENT))
                .then_some(count);
        }
        count += 1;
        std::mem::swap(&mut key, &mut next);
        first = false;
    }
}

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
                .and_then(|fd| count_keys(fd.as_fd(), info.key_size()))
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

/// A pinned program.
#[derive(Debug, Clone)]
pub struct PinnedProgram {
    pub name: String,
    /// Build ID (hash of the object) the pin name carries.
    pub build: String,
    pub id: Option<u32>,
    pub loaded_at: Option<SystemTime>,
    /// Whether it is the build embedded in this binary.
    pub current: bool,
}

pub fn pinned_programs(layout: &PinLayout) -> Vec<PinnedProgram> {
    let current = format!("{:016x}", build_id());
    let mut programs = Vec::new();
    let Ok(entries) = fs::read_dir(layout.progs_dir()) else {
        return programs;
    };
    for entry in entries.flatten() {
        let file = entry.file_name().to_string_lossy().into_owned();
        let (build, name) = file.split_once('_').unwrap_or(("?", file.as_str()));
        let info = ProgramInfo::from_pin(entry.path()).ok();
        programs.push(PinnedProgram {
            name: name.to_owned(),
            build: build.to_owned(),
            id: info.as_ref().map(ProgramInfo::id),
            loaded_at: info.as_ref().and_then(ProgramInfo::loaded_at),
            current: build == current,
        });
    }
    programs.sort_by(|a, b| (&a.build, &a.name).cmp(&(&b.build, &b.name)));
    programs
}

/// One tc attachment we made (a `links/` pin).
#[derive(Debug, Clone)]
pub struct TcAttachment {
    pub ifindex: u32,
    /// `None` when the interface is gone.
    pub interface: Option<String>,
    pub direction: Direction,
    pub mode: AttachMode,
    pub link_id: Option<u32>,
    pub program_id: Option<u32>,
    /// Whether the kernel runs the program on the interface: for tcx, the
    /// interface's tcx program list has it; for clsact, our marker pin is
    /// there and the interface exists.
    pub attached: bool,
}

/// Any other link we pinned (cgroup socket hooks, ...).
#[derive(Debug, Clone)]
pub struct OtherLink {
    pub pin: String,
    pub link_type: String,
    pub link_id: Option<u32>,
    pub program_id: Option<u32>,
}

pub fn attachments(layout: &PinLayout) -> (Vec<TcAttachment>, Vec<OtherLink>) {
    let mut tc = Vec::new();
    let mut other = Vec::new();
    let Ok(entries) = fs::read_dir(layout.links_dir()) else {
        return (tc, other);
    };
    for entry in entries.flatten() {
        let file = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        match parse_link_name(&file) {
            Some((ifindex, direction, clsact)) => {
                let interface = netlink::interface_name(ifindex);
                let (mode, link_id, program_id) = if clsact {
                    let id = ProgramInfo::from_pin(&path).ok().map(|info| info.id());
                    (AttachMode::Clsact, None, id)
                } else {
                    let info = PinnedLink::from_pin(&path)
                        .ok()
                        .and_then(|link| FdLink::from(link).info().ok());
                    (
                        AttachMode::Tcx,
                        info.as_ref().map(aya::programs::links::LinkInfo::id),
                        info.as_ref()
                            .map(aya::programs::links::LinkInfo::program_id),
                    )
                };
                let attached = match (&interface, program_id, mode) {
                    // By ID only: opening the programs (aya's query_tcx)
                    // needs CAP_SYS_ADMIN, which the agent lacks.
                    (Some(_), Some(id), AttachMode::Tcx) => {
                        attach::tcx_program_ids(ifindex, direction)
                            .is_ok_and(|ids| ids.contains(&id))
                    }
                    (Some(_), Some(_), AttachMode::Clsact) => true,
                    _ => false,
                };
                tc.push(TcAttachment {
                    ifindex,
                    interface,
                    direction,
                    mode,
                    link_id,
                    program_id,
                    attached,
                });
            }
            None => {
                let info = PinnedLink::from_pin(&path)
                    .ok()
                    .and_then(|link| FdLink::from(link).info().ok());
                other.push(OtherLink {
                    pin: file,
                    link_type: info
                        .as_ref()
                        .and_then(|i| i.link_type().ok())
                        .map_or_else(|| "unknown".into(), |t| format!("{t:?}").to_lowercase()),
                    link_id: info.as_ref().map(aya::programs::links::LinkInfo::id),
                    program_id: info
                        .as_ref()
                        .map(aya::programs::links::LinkInfo::program_id),
                });
            }
        }
    }
    tc.sort_by_key(|a| (a.ifindex, a.direction == Direction::Egress));
    other.sort_by(|a, b| a.pin.cmp(&b.pin));
    (tc, other)
}

/// The `stats` counters summed over CPUs, by reason (all zero when the map
/// is missing).
pub fn stats(layout: &PinLayout) -> Vec<(&'static str, u64)> {
    let map = maps::stats(layout).ok();
    (0..stat::COUNT)
        .map(|reason| {
            let value = map
                .as_ref()
                .and_then(|m| m.get(&reason, 0).ok())
                .map_or(0, |values| values.iter().sum());
            (stat::NAMES[reason as usize], value)
        })
        .collect()
}

/// The state `status` reports.
#[derive(Debug, Clone)]
pub struct Status {
    pub root: PathBuf,
    pub installed: bool,
    pub kernel: String,
    pub build: String,
    pub mode: Option<AttachMode>,
    pub programs: Vec<PinnedProgram>,
    pub tc: Vec<TcAttachment>,
    /// How the node differs from what the plugin's runs set up.
    pub drift: NodeDrift,
    pub other_links: Vec<OtherLink>,
    pub maps: Vec<MapFill>,
    pub missing_maps: Vec<&'static str>,
    pub stats: Vec<(&'static str, u64)>,
    pub tracing: Option<TraceFilter>,
    /// Where the owners' indexes and the mappings disagree (empty when
    /// nothing is installed or the maps cannot be read).
    pub ownership: Ownership,
    /// What is missing or degraded; `status` exits non-zero when not empty.
    pub problems: Vec<String>,
    /// Worth knowing, not a failure.
    pub notes: Vec<String>,
    /// Pin roots on this machine whose node's network namespace is gone
    /// (see `dataplane::stale`): left until a plugin run, the agent or
    /// `uninstall --stale` removes them.
    pub stale_roots: Vec<PathBuf>,
    /// Records in /run/ebpf-portmap of pin roots that no longer exist
    /// (removed without `uninstall`; see `dataplane::stale`): left until a
    /// plugin run, the agent or `uninstall --stale` removes them.
    pub orphan_records: Vec<crate::dataplane::stale::OrphanRecords>,
    /// Keys of a network's configuration that its last ADD took for typos
    /// of ours, and ignored.
    pub misspelt_keys: Vec<KeyNote>,
    /// The cgroup the socket hooks are attached to, as the last run that
    /// found them in place recorded it.
    pub hooks_cgroup: Option<PathBuf>,
}

/// The cgroup named in the hooks record of `layout` (its `cgroup PATH`
/// line), if a run recorded one.
pub fn hooks_cgroup(layout: &PinLayout) -> Option<PathBuf> {
    let text = std::fs::read_to_string(crate::dataplane::cgroup::hooks_record(layout)).ok()?;
    text.lines()
        .find_map(|line| line.strip_prefix("cgroup "))
        .map(PathBuf::from)
}

/// Where the node has moved on since the plugin's last run: between runs
/// nobody follows it (the node agent's job), and the next ADD, DEL, CHECK
/// or GC converges.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeDrift {
    /// Interfaces that should carry the programs and have no attachment at
    /// all: (name, index).
    pub unattached: Vec<(String, u32)>,
    /// Entries of the recorded `interfaces` that match no interface.
    pub unmatched: Vec<String>,
    /// The node's interfaces but loopback, named beside `unmatched`.
    pub interfaces: Vec<String>,
    /// Node addresses the socket hooks do not know as the node's.
    pub unsynced: Vec<IpAddr>,
    /// Addresses the socket hooks take for the node's that it no longer has.
    pub stale: Vec<IpAddr>,
    /// Mappings whose hostIP is no address of the node (`198.18.0.9:80/tcp`).
    pub absent_host_ips: Vec<String>,
    /// Why the node's interfaces and addresses could not be read.
    pub unreadable: Option<String>,
}

/// Compares the node's interfaces and addresses (one link and one address
/// dump) with the attachments `tc`, the synced addresses and the mappings.
/// The interfaces that should carry the programs follow the plugin's rule
/// ([`netlink::select_uplinks`] with the recorded `interfaces`) plus the
/// live interfaces recorded as container-facing.
pub fn node_drift(layout: &PinLayout, tc: &[TcAttachment]) -> NodeDrift {
    let mut drift = NodeDrift::default();
    let read = netlink::Rtnl::open().and_then(|mut rtnl| Ok((rtnl.links()?, rtnl.addresses()?)));
    let (links, addresses) = match read {
        Ok(found) => found,
        Err(error) => {
            drift.unreadable = Some(error.to_string());
            return drift;
        }
    };
    let patterns = node_state::recorded_interfaces(layout);
    let selection = netlink::select_uplinks(&links, patterns.as_deref());
    drift.unmatched = selection.unmatched;
    drift.interfaces = netlink::interface_names(&links);
    let mut wanted = selection.uplinks;
    wanted.extend(node_state::container_side_indexes(layout));
    // An interface with pins but a direction missing or inactive is judged
    // by its attachments (see `judge`): here only those without any.
    let recorded = |index: u32| tc.iter().any(|a| a.ifindex == index);
    for link in links.iter().filter(|l| wanted.contains(&l.index)) {
        if !recorded(link.index) {
            drift.unattached.push((link.name.clone(), link.index));
        }
    }
    let own: std::collections::BTreeSet<IpAddr> = addresses
        .iter()
        .filter_map(netlink::NodeAddress::own)
        .collect();
    // Link-local addresses come and go with every veth (and no hostIP can
    // name one): not worth a report.
    let routable = |addr: &&IpAddr| match addr {
        IpAddr::V4(v4) => !v4.is_link_local(),
        IpAddr::V6(v6) => !v6.is_unicast_link_local(),
    };
    if let Some(synced) = node_state::synced_addresses(layout) {
        let own: std::collections::BTreeSet<IpAddr> =
            own.iter().filter(routable).copied().collect();
        let synced: std::collections::BTreeSet<IpAddr> =
            synced.iter().filter(routable).copied().collect();
        drift.unsynced = own.difference(&synced).copied().collect();
        drift.stale = synced.difference(&own).copied().collect();
    }
    if let Ok(mappings) = maps::open::<
        aya::maps::HashMap<aya::maps::MapData, MappingKey, MappingValue>,
    >(layout, map_names::MAPPINGS)
    {
        for key in mappings.keys().filter_map(Result::ok) {
            if key.host_addr_be == [0; 4] {
                continue;
            }
            let addr = addr_from_words(key.family, &key.host_addr_be);
            if !own.contains(&addr) {
                drift.absent_host_ips.push(KeyDisplay(key).to_string());
            }
        }
        drift.absent_host_ips.sort();
        drift.absent_host_ips.dedup();
    }
    drift
}

/// `uname -r`.
pub fn kernel_release() -> String {
    // SAFETY: an all-zero utsname is valid; uname fills it.
    let mut uts: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: valid out pointer.
    if unsafe { libc::uname(&raw mut uts) } != 0 {
        return "unknown".into();
    }
    // SAFETY: uname NUL-terminates the field.
    unsafe { std::ffi::CStr::from_ptr(uts.release.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

/// Reads everything `status` shows and judges it.
pub fn status(layout: &PinLayout) -> Status {
    let installed = layout.versioned().exists();
    let (maps, missing_maps) = if installed {
        map_fills(layout)
    } else {
        (Vec::new(), Vec::new())
    };
    let programs = pinned_programs(layout);
    let (tc, other_links) = attachments(layout);
    let drift = if installed {
        node_drift(layout, &tc)
    } else {
        NodeDrift::default()
    };
    let tracing = trace::current_filter(layout).ok();
    let mut status = Status {
        root: layout.root().to_path_buf(),
        installed,
        kernel: kernel_release(),
        build: format!("{:016x}", build_id()),
        mode: attach::attach_mode(layout),
        programs,
        tc,
        drift,
        other_links,
        maps,
        missing_maps,
        stats: stats(layout),
        tracing,
        ownership: if installed {
            ownership(layout).unwrap_or_else(|error| {
                log::warn!("ownership not checked: {error}");
                Ownership::default()
            })
        } else {
            Ownership::default()
        },
        problems: Vec::new(),
        notes: Vec::new(),
        stale_roots: crate::dataplane::stale::find(layout)
            .into_iter()
            .map(|stale| stale.root().to_path_buf())
            .collect(),
        orphan_records: crate::dataplane::stale::orphan_records()
            .into_iter()
            .filter(|orphan| orphan.root != layout.root())
            .collect(),
        misspelt_keys: key_notes::recorded(layout),
        hooks_cgroup: hooks_cgroup(layout),
    };
    judge(&mut status);
    if installed {
        judge_gone_containers(layout, &mut status.problems, &mut status.notes);
    }
    status
}

/// `status` on containers whose network namespace is gone: a note while
/// a GC may still be within its grace period (the default one), a problem
/// once past it (no agent runs, or it cannot see the runtime's paths).
pub fn judge_gone_containers(
    layout: &PinLayout,
    problems: &mut Vec<String>,
    notes: &mut Vec<String>,
) {
    let Ok(rows) = mapping_rows(layout) else {
        return;
    };
    let now = crate::dataplane::ownership::now_unix();
    let mut seen = std::collections::BTreeSet::new();
    for row in &rows {
        let Some(marker) = row.gone_marker() else {
            continue;
        };
        let (_, container_id, _) = row.owner_strings();
        if !seen.insert(container_id.clone()) {
            continue;
        }
        let mappings = rows
            .iter()
            .filter(|other| other.value.owner_id == row.value.owner_id)
            .count();
        let pod = match (row.pod.label(), &row.pod.pod_uid) {
            (Some(label), Some(uid)) => format!(" (pod {label}, UID {uid})"),
            (Some(label), None) => format!(" (pod {label})"),
            (None, Some(uid)) => format!(" (pod UID {uid})"),
            (None, None) => String::new(),
        };
        let line = format!(
            "container {container_id}{pod} holds {mappings} mapping(s) but its {marker}: they send traffic nowhere"
        );
        let since = row.sandbox.as_ref().and_then(|sandbox| sandbox.gone_since);
        match since {
            Some(since)
                if now.saturating_sub(since) >= crate::dataplane::ownership::GONE_GRACE_SECS =>
            {
                problems.push(format!(
                    "{line}; past the grace period: run `ebpf-portmap gc --gone`, or the agent (it removes them on its GC timer)"
                ));
            }
            _ => notes.push(format!(
                "{line}; the agent's GC (or `ebpf-portmap gc --gone`) removes them after the grace period"
            )),
        }
    }
}

/// Fills `problems` and `notes`. Pure, so the rules are unit-tested.
pub fn judge(status: &mut Status) {
    let mut problems = Vec::new();
    let mut notes = Vec::new();
    if !status.installed {
        problems.push(format!(
            "nothing is installed under {} (no ADD has run with this pinRoot, or it was uninstalled)",
            status.root.display()
        ));
    } else {
        for name in &status.missing_maps {
            problems.push(format!("map {name} is not pinned"));
        }
        for direction in Direction::BOTH {
            let name = match direction {
                Direction::Ingress => portmap_common::program_names::TC_INGRESS,
                Direction::Egress => portmap_common::program_names::TC_EGRESS,
            };
            if !status.programs.iter().any(|p| p.name == name) {
                problems.push(format!("program {name} is not pinned"));
            }
        }
        if status.programs.iter().any(|p| p.id.is_none()) {
            problems.push("a pinned program cannot be read".into());
        }
        if !status.programs.is_empty() && !status.programs.iter().any(|p| p.current) {
            notes.push(format!(
                "the loaded programs are of another build than this binary ({}); the next ADD replaces them",
                status.build
            ));
        }
        if status.tc.is_empty() {
            problems.push("the programs are attached to no interface".into());
        }
    }
    let mut interfaces: Vec<u32> = status.tc.iter().map(|a| a.ifindex).collect();
    interfaces.dedup();
    let mut gone = 0;
    for ifindex in interfaces {
        let on_interface: Vec<&TcAttachment> =
            status.tc.iter().filter(|a| a.ifindex == ifindex).collect();
        let Some(label) = on_interface[0].interface.clone() else {
            // The host end of a removed container's veth, typically: the
            // kernel detached it with the interface, only the pin is left.
            gone += 1;
            continue;
        };
        for direction in Direction::BOTH {
            match on_interface.iter().find(|a| a.direction == direction) {
                None => problems.push(format!(
                    "{label}: no {} program attached",
                    direction.as_str()
                )),
                Some(a) if !a.attached => problems.push(format!(
                    "{label}: the pinned {} attachment is not active in the kernel",
                    direction.as_str()
                )),
                Some(_) => {}
            }
        }
    }
    if gone > 0 {
        notes.push(format!(
            "{gone} interface(s) with pinned attachments no longer exist (removed containers, re-created interfaces): harmless; `ebpf-portmap gc --stale-links` removes the pins"
        ));
    }
    judge_drift(&status.drift, &mut problems, &mut notes);
    for map in &status.maps {
        if let Some(percent) = map.percent()
            && percent >= FILL_WARNING_PERCENT
        {
            let fill = format!(
                "map {} is {percent:.0}% full ({} of {})",
                map.name,
                map.entries.unwrap_or(0),
                map.max_entries
            );
            if map.recycles() {
                notes.push(format!(
                    "{fill}: it drops its least recently used entries to make room, by design; a table this full under steady load may be worth a larger conntrackSize"
                ));
            } else {
                problems.push(fill);
            }
        }
    }
    if let Some(filter) = &status.tracing
        && filter.enabled != 0
    {
        if trace::tracer_alive(filter.tracer_pid) {
            notes.push(format!(
                "tracing is on (ebpf-portmap trace, pid {})",
                filter.tracer_pid
            ));
        } else {
            problems.push(format!(
                "tracing was left on by a trace (pid {}) that is gone; every packet pays for it: run `ebpf-portmap trace --stop`",
                filter.tracer_pid
            ));
        }
    }
    for (id, keys) in &status.ownership.orphans {
        problems.push(format!(
            "{} mapping(s) of owner {id:016x} ({}) have no owner record: no DEL removes them and every ADD of these ports fails; `ebpf-portmap gc --orphans` reclaims them (CNI GC does {}s after first seeing them)",
            keys.len(),
            key_list(keys),
            crate::dataplane::ownership::ORPHAN_GRACE_SECS
        ));
    }
    for (owner, key, holder) in &status.ownership.missing {
        problems.push(match holder {
            None => format!(
                "mapping {} of {owner} is missing from the mappings map (deleted behind the plugin's back): its traffic is not forwarded; ADD the container again",
                KeyDisplay(*key)
            ),
            Some(holder) => format!(
                "mapping {} of {owner} is held by {holder}: its traffic goes there; DEL one of them and ADD the other again",
                KeyDisplay(*key)
            ),
        });
    }
    for (owner, key) in &status.ownership.unindexed {
        problems.push(format!(
            "mapping {} of {owner} is not in its owner's index: a DEL of the owner leaves it behind; after that DEL, `ebpf-portmap gc --orphans` removes it",
            KeyDisplay(*key)
        ));
    }
    for (name, value) in &status.stats {
        if *value > 0 && matches!(*name, "rewrite_failed" | "ct_insert_failed") {
            notes.push(format!(
                "{value} packet(s) counted as {name} since the maps were created"
            ));
        }
    }
    for root in &status.stale_roots {
        notes.push(format!(
            "{} is the state of a node whose network namespace is gone: its socket hooks still run (and exit at once) on every connect() in their cgroup until the next plugin run or agent pass removes it, or `ebpf-portmap uninstall --stale` now",
            root.display()
        ));
    }
    for orphan in &status.orphan_records {
        notes.push(format!(
            "pin root {} no longer exists (removed without `ebpf-portmap uninstall`), but {} record(s) of it are left in /run/ebpf-portmap ({}): the next plugin run or agent pass removes them, or `ebpf-portmap uninstall --stale` now",
            orphan.root.display(),
            orphan.records.len(),
            orphan
                .records
                .iter()
                .filter_map(|r| r.file_name().map(|n| n.to_string_lossy().into_owned()))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    for note in &status.misspelt_keys {
        notes.push(format!(
            "network {}: key {:?} of its configuration is not one ebpf-portmap knows and was ignored by the last ADD; did you mean {:?}? Fix the conflist (the next ADD clears this note)",
            note.network, note.key, note.meant
        ));
    }
    status.problems = problems;
    status.notes = notes;
}

/// Up to three keys, then how many more: for one-line problems.
fn key_list(keys: &[MappingKey]) -> String {
    let mut shown: Vec<String> = keys
        .iter()
        .take(3)
        .map(|k| KeyDisplay(*k).to_string())
        .collect();
    if keys.len() > 3 {
        shown.push(format!("and {} more", keys.len() - 3));
    }
    shown.join(", ")
}

/// The problems and notes of [`NodeDrift`]: each problem with its fix.
fn judge_drift(drift: &NodeDrift, problems: &mut Vec<String>, notes: &mut Vec<String>) {
    const NEXT_RUN: &str = "run `ebpf-portmap reconcile` (the next CNI ADD, DEL, CHECK or GC, or the node agent's pass, does it too)";
    for (name, index) in &drift.unattached {
        problems.push(format!(
            "{name} (index {index}) does not carry the programs (added or re-created since the last plugin run), so host ports get no traffic there: {NEXT_RUN}"
        ));
    }
    for entry in &drift.unmatched {
        notes.push(format!(
            "`interfaces` entry {entry:?} matches no interface of this node (it has {}); skipped",
            drift.interfaces.join(", ")
        ));
    }
    for addr in &drift.unsynced {
        problems.push(format!(
            "node address {addr} is not known to the socket hooks (added since the last plugin run), so node connections to it are not translated: {NEXT_RUN}"
        ));
    }
    for addr in &drift.stale {
        notes.push(format!(
            "{addr} is still taken for a node address but the node no longer has it (node connections to it are translated as if it were): {NEXT_RUN}"
        ));
    }
    for mapping in &drift.absent_host_ips {
        notes.push(format!(
            "mapping {mapping}: its hostIP is not an address of this node (yet), so it sees no traffic until the address exists here"
        ));
    }
    if let Some(error) = &drift.unreadable {
        problems.push(format!(
            "cannot read the node's interfaces and addresses ({error}); run status as root in the node's network namespace"
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ct_entry(kind: u8, port: u16, last_seen_ns: u64) -> CtEntry {
        CtEntry {
            kind,
            nat_addr_be: [1, 0, 0, 0],
            nat_port_be: port.to_be(),
            mapping: MappingKey {
                host_port_be: 8080u16.to_be(),
                proto: 6,
                family: 4,
                ..MappingKey::default()
            },
            last_seen_ns,
            ..CtEntry::default()
        }
    }

    fn ct_key(proto: u8, sport: u16) -> CtKey {
        CtKey {
            src_port_be: sport.to_be(),
            proto,
            family: 4,
            ..CtKey::default()
        }
    }

    #[test]
    fn live_flows_count_fresh_dnat_entries_by_target() {
        let hour = 3_600_000_000_000u64;
        let now = 10 * hour;
        let entries = vec![
            (ct_key(6, 1), ct_entry(ct_kind::DNAT, 80, now - 1)),
            (ct_key(6, 2), ct_entry(ct_kind::DNAT, 80, now - hour)),
            // The reply half of a flow is not a second flow.
            (ct_key(6, 3), ct_entry(ct_kind::REPLY, 80, now)),
            (ct_key(6, 4), ct_entry(ct_kind::PASS, 80, now)),
            // Idle past the TCP timeout.
            (ct_key(6, 5), ct_entry(ct_kind::DNAT, 80, now - 7 * hour)),
            // UDP idles out after two minutes.
            (ct_key(17, 6), ct_entry(ct_kind::DNAT, 53, now - hour)),
            // A TCP flow with only its SYN, after a minute.
            (
                ct_key(6, 8),
                CtEntry {
                    tcp_state: portmap_common::tcp_state::SYN_ONLY,
                    ..ct_entry(ct_kind::DNAT, 80, now - 61_000_000_000)
                },
            ),
            // Another container port: another target.
            (ct_key(6, 7), ct_entry(ct_kind::DNAT, 81, now)),
        ];
        let flows = live_flows(entries, now);
        let target = |port: u16| (ct_entry(0, port, 0).mapping, [1, 0, 0, 0], port.to_be());
        assert_eq!(flows.get(&target(80)), Some(&2));
        assert_eq!(flows.get(&target(81)), Some(&1));
        assert_eq!(flows.get(&target(53)), None);
        assert_eq!(flows.len(), 2);
    }

    fn healthy() -> Status {
        let tc = |direction| TcAttachment {
            ifindex: 2,
            interface: Some("eth0".into()),
            direction,
            mode: AttachMode::Tcx,
            link_id: Some(1),
            program_id: Some(10),
            attached: true,
        };
        let program = |name: &str| PinnedProgram {
            name: name.into(),
            build: "b".into(),
            id: Some(10),
            loaded_at: None,
            current: true,
        };
        Status {
            root: "/sys/fs/bpf/x".into(),
            installed: true,
            kernel: "6.18".into(),
            build: "b".into(),
            mode: Some(AttachMode::Tcx),
            programs: vec![program("portmap_ingress"), program("portmap_egress")],
            tc: vec![tc(Direction::Ingress), tc(Direction::Egress)],
            drift: NodeDrift::default(),
            other_links: Vec::new(),
            maps: vec![MapFill {
                name: "mappings".into(),
                map_type: "hash".into(),
                entries: Some(10),
                max_entries: 100,
                id: 1,
            }],
            missing_maps: Vec::new(),
            stats: Vec::new(),
            tracing: Some(TraceFilter::default()),
            ownership: Ownership::default(),
            problems: Vec::new(),
            notes: Vec::new(),
            stale_roots: Vec::new(),
            orphan_records: Vec::new(),
            misspelt_keys: Vec::new(),
            hooks_cgroup: None,
        }
    }

    fn judged(mut status: Status) -> Status {
        judge(&mut status);
        status
    }

    #[test]
    fn a_healthy_node_has_no_problems() {
        let status = judged(healthy());
        assert!(status.problems.is_empty(), "{:?}", status.problems);
        assert!(status.notes.is_empty(), "{:?}", status.notes);
    }

    #[test]
    fn every_missing_or_degraded_part_is_a_problem() {
        let mut missing_direction = healthy();
        missing_direction.tc.pop();
        assert_eq!(
            judged(missing_direction).problems,
            ["eth0: no egress program attached"]
        );

        let mut detached = healthy();
        detached.tc[0].attached = false;
        assert_eq!(
            judged(detached).problems,
            ["eth0: the pinned ingress attachment is not active in the kernel"]
        );

        let mut gone = healthy();
        for a in &mut gone.tc {
            a.interface = None;
        }
        let gone = judged(gone);
        // Only the pins are left: not a problem, but worth a note.
        assert_eq!(gone.problems, Vec::<String>::new());
        assert!(
            gone.notes[0].starts_with("1 interface(s) with pinned attachments no longer exist")
        );

        let mut full = healthy();
        full.maps[0].entries = Some(95);
        assert_eq!(
            judged(full).problems,
            ["map mappings is 95% full (95 of 100)"]
        );

        // A conntrack table full of flows is what churn leaves: the kernel
        // recycles it. Said, but the node stays healthy.
        let mut churned = healthy();
        churned.maps.push(MapFill {
            name: "conntrack_close".into(),
            map_type: "lru_hash".into(),
            entries: Some(4028),
            max_entries: 4096,
            id: 2,
        });
        let churned = judged(churned);
        assert_eq!(churned.problems, Vec::<String>::new());
        assert!(
            churned
                .notes
                .iter()
                .any(|n| n.starts_with("map conntrack_close is 98% full (4028 of 4096): it drops")),
            "{:?}",
            churned.notes
        );

        let mut no_program = healthy();
        no_program.programs.remove(1);
        no_program.missing_maps.push("counters");
        assert_eq!(
            judged(no_program).problems,
            [
                "map counters is not pinned",
                "program portmap_egress is not pinned"
            ]
        );

        let mut nothing = healthy();
        nothing.tc.clear();
        assert_eq!(
            judged(nothing).problems,
            ["the programs are attached to no interface"]
        );

        let mut stale_trace = healthy();
        stale_trace.tracing = Some(TraceFilter {
            enabled: 1,
            tracer_pid: u32::MAX,
            ..TraceFilter::default()
        });
        assert!(judged(stale_trace).problems[0].contains("tracing was left on"));

        let mut uninstalled = healthy();
        uninstalled.installed = false;
        uninstalled.tc.clear();
        assert!(judged(uninstalled).problems[0].starts_with("nothing is installed"));
    }

    #[test]
    fn ownership_differences_are_problems() {
        let key = |port: u16| MappingKey {
            host_port_be: port.to_be(),
            proto: 6,
            family: 4,
            ..MappingKey::default()
        };
        let mut status = healthy();
        status.ownership = Ownership {
            orphans: vec![(0xab, vec![key(1), key(2), key(3), key(4)])],
            missing: vec![
                ("c/eth0 (network n)".into(), key(5), None),
                (
                    "c/eth0 (network n)".into(),
                    key(6),
                    Some("d/eth0 (network n)".into()),
                ),
            ],
            unindexed: vec![("d/eth0 (network n)".into(), key(7))],
        };
        let problems = judged(status).problems;
        assert_eq!(problems.len(), 4, "{problems:#?}");
        assert!(
            problems[0].starts_with(
                "4 mapping(s) of owner 00000000000000ab (0.0.0.0:1/tcp, 0.0.0.0:2/tcp, 0.0.0.0:3/tcp, and 1 more) have no owner record"
            ),
            "{problems:#?}"
        );
        assert!(problems[0].contains("gc --orphans"));
        assert!(
            problems[1].starts_with("mapping 0.0.0.0:5/tcp of c/eth0 (network n) is missing"),
            "{problems:#?}"
        );
        assert!(problems[2].contains("is held by d/eth0 (network n)"));
        assert!(
            problems[3].contains("0.0.0.0:7/tcp of d/eth0 (network n) is not in its owner's index")
        );
    }

    #[test]
    fn the_node_moving_on_is_a_problem_with_its_fix() {
        let mut drifted = healthy();
        drifted.drift = NodeDrift {
            unattached: vec![("eth2".into(), 9)],
            unmatched: vec!["bond0.*".into()],
            interfaces: vec!["eth0".into(), "eth2".into()],
            unsynced: vec!["198.18.0.77".parse().unwrap()],
            stale: vec!["198.18.0.66".parse().unwrap()],
            absent_host_ips: vec!["198.18.0.99:8080/tcp".into()],
            unreadable: None,
        };
        let drifted = judged(drifted);
        assert_eq!(drifted.problems.len(), 2, "{:?}", drifted.problems);
        assert!(drifted.problems[0].starts_with("eth2 (index 9) does not carry the programs"));
        assert!(drifted.problems[1].starts_with("node address 198.18.0.77 is not known"));
        for problem in &drifted.problems {
            assert!(
                problem.contains("run `ebpf-portmap reconcile`"),
                "{problem}"
            );
        }
        // A pattern for other nodes, an address gone (harmless until the
        // next run) and a VIP not here (yet) are expected.
        assert_eq!(drifted.notes.len(), 3, "{:?}", drifted.notes);
        assert!(drifted.notes[0].contains("\"bond0.*\" matches no interface"));
        assert!(drifted.notes[1].starts_with("198.18.0.66 is still taken"));
        assert!(drifted.notes[2].starts_with("mapping 198.18.0.99:8080/tcp: its hostIP"));
    }

    #[test]
    fn another_build_is_a_note_not_a_problem() {
        let mut old = healthy();
        for p in &mut old.programs {
            p.current = false;
        }
        let old = judged(old);
        assert!(old.problems.is_empty());
        assert!(old.notes[0].contains("another build"), "{:?}", old.notes);
    }
}
