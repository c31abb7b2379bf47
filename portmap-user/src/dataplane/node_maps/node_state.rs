//! Node state for the socket hooks and the hairpin: the node's network
//! namespace cookie and flags, the node's own addresses, and the settings of
//! each interface the tc programs run on. Every plugin run (ADD, DEL, CHECK,
//! GC) computes what the state should be, so it follows the node as
//! containers, interfaces and addresses come and go, but writes it only
//! when that differs from what the last write recorded:
//! [`NodeConfig::sync_hash`] holds a hash of everything the last sync wrote,
//! and is written last, in the same map update as the node's settings. A
//! sync that has to write takes the pin root's lock, so two writers never
//! interleave (which could leave one's addresses under the other's hash); an
//! interrupted one leaves the old hash, and the next run writes again.
//!
//! The `interfaces` the last run was configured with are recorded next to
//! the lock file (`{lock}.interfaces`, one entry a line; no file: the
//! default), so that `status` judges the attachments by the same rule as
//! the plugin: bpffs holds no regular files.

use std::{
    collections::{BTreeMap, BTreeSet},
    io,
    net::IpAddr,
    os::fd::{AsRawFd, FromRawFd},
};

use aya::maps::{Array, HashMap, MapData, MapError};
use portmap_common::{
    FAMILY_V4, FAMILY_V6,
    local::{IfaceConfig, LocalAddrKey, NodeConfig, iface_flags, map_names, node_flags},
};

use crate::{
    dataplane::load::kfunc::Kfuncs,
    dataplane::ownership::{addr_from_words, words_from_addr},
    dataplane::pinned::hash::fnv1a64,
    dataplane::pinned::lock::{self, LockError},
    dataplane::pinned::maps::{MapsError, open},
    dataplane::pinned::pin::PinLayout,
    model::FastPathSetting,
    node::netlink::NodeAddress,
};

#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    #[error(transparent)]
    Maps(#[from] MapsError),
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error("cannot read the network namespace cookie (SO_NETNS_COOKIE needs Linux 5.14)")]
    Cookie(#[source] io::Error),
    #[error("cannot record the configured interfaces next to the lock file")]
    Record(#[source] io::Error),
    #[error("updating the {map} map failed")]
    Map {
        map: &'static str,
        #[source]
        source: MapError,
    },
}

fn map_error(map: &'static str) -> impl FnOnce(MapError) -> LocalError {
    move |source| LocalError::Map { map, source }
}

/// Cookie of the network namespace this process runs in.
pub fn netns_cookie() -> Result<u64, LocalError> {
    const SO_NETNS_COOKIE: libc::c_int = 71;
    // Any socket will do, unbound: the cookie belongs to the namespace.
    // SAFETY: plain socket(2); the fd is owned right away.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(LocalError::Cookie(io::Error::last_os_error()));
    }
    // SAFETY: a fresh fd nobody else owns.
    let socket = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
    let mut cookie: u64 = 0;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: a valid socket and an out buffer of the size passed.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_NETNS_COOKIE,
            (&raw mut cookie).cast(),
            &raw mut len,
        )
    };
    if rc != 0 {
        return Err(LocalError::Cookie(io::Error::last_os_error()));
    }
    Ok(cookie)
}

fn addr_key(addr: IpAddr) -> LocalAddrKey {
    LocalAddrKey {
        addr_be: words_from_addr(addr),
        family: if addr.is_ipv4() { FAMILY_V4 } else { FAMILY_V6 },
        _pad0: [0; 3],
    }
}

/// What one ADD wants the node state to say.
pub struct NodeState {
    pub snat: bool,
    pub masq_all: bool,
    /// `fastPath` as configured, and what the load of the programs found
    /// of the kernel's conntrack kfuncs: together, the fast-path mode
    /// (`features::fast_path_flags`).
    pub fast_path: FastPathSetting,
    pub kfuncs: Option<Kfuncs>,
    /// Whether anything is hooked at netfilter's FORWARD, when the fallback
    /// without the kfuncs asks (`None`: not asked, or cannot tell).
    pub forward_hooked: Option<bool>,
    /// Per family (IPv4, IPv6), whether new flows are translated by the
    /// node's netfilter (`features::kernel_nat`).
    pub kernel_nat: [bool; 2],
    /// The node's addresses, as rtnetlink reported them.
    pub addresses: Vec<NodeAddress>,
    /// Interfaces containers sit behind (from prevResult's host-side
    /// interfaces), by index.
    pub container_side: BTreeSet<u32>,
    /// The request's bridge ports that carry the ingress program, each with
    /// its bridge: their settings are the bridge's addresses, container
    /// side (a hairpin flow is translated and masqueraded there first).
    pub bridge_ports: BTreeMap<u32, u32>,
    /// Every interface the tc programs run on.
    pub attached: BTreeSet<u32>,
    /// Index of every interface of the node: settings of other indexes are
    /// of interfaces that are gone.
    pub live: BTreeSet<u32>,
    /// The `interfaces` key of the configuration (`None`: the default).
    pub interfaces: Option<Vec<String>>,
    /// The `serviceVipDevices` key of the configuration (whose addresses
    /// `addresses` already leaves out), recorded for `status`.
    pub service_vip_devices: Vec<String>,
    /// Whether this run sweeps the settings of gone interfaces (a walk of
    /// the whole map, see `sweep_interfaces`): node-wide passes do, a
    /// single CNI call does not.
    pub sweep_interfaces: bool,
}

/// The node's settings flags (`node_flags`) as the last sync wrote them;
/// `None` before the first sync or without the map.
pub fn recorded_flags(layout: &PinLayout) -> Option<u32> {
    let data = MapData::from_pin(layout.map(map_names::NODE)).ok()?;
    let map: Array<MapData, NodeConfig> = Array::try_from(aya::maps::Map::Array(data)).ok()?;
    let config = map.get(&0, 0).ok()?;
    (config.sync_hash != 0).then_some(config.flags)
}

/// Where the `interfaces` of the last sync are recorded.
pub fn interfaces_record(layout: &PinLayout) -> std::path::PathBuf {
    layout.lock_file().with_extension("interfaces")
}

/// The `interfaces` the last sync recorded: `None` for the default (or a
/// node no sync of this build has run on).
pub fn recorded_interfaces(layout: &PinLayout) -> Option<Vec<String>> {
    read_list(&interfaces_record(layout))
}

/// Where the `serviceVipDevices` of the last sync are recorded, when not
/// the default.
pub fn vip_devices_record(layout: &PinLayout) -> std::path::PathBuf {
    layout.lock_file().with_extension("vip-devices")
}

/// The `serviceVipDevices` the last sync recorded (the default when it
/// recorded none, or no sync of this build ran).
pub fn recorded_vip_devices(layout: &PinLayout) -> Vec<String> {
    read_list(&vip_devices_record(layout)).unwrap_or_else(|| {
        crate::model::DEFAULT_SERVICE_VIP_DEVICES
            .map(str::to_owned)
            .to_vec()
    })
}

/// A list of names recorded by [`record_list`], one a line; `None`
/// without the record.
fn read_list(path: &std::path::Path) -> Option<Vec<String>> {
    let text = std::fs::read_to_string(path).ok()?;
    Some(text.lines().map(str::to_owned).collect())
}

/// Records `list` at `path` atomically (a whole new file renamed over the
/// old), one entry a line; `None` (the key's default) as no record.
fn record_list(path: &std::path::Path, list: Option<&[String]>) -> io::Result<()> {
    let Some(list) = list else {
        return match std::fs::remove_file(path) {
            Err(error) if error.kind() != io::ErrorKind::NotFound => Err(error),
            _ => Ok(()),
        };
    };
    crate::dataplane::pinned::lock::write_record(path, &list.join("\n"))
}

/// The records of what the last sync wrote (local addresses, interface
/// settings): an uninstall removes them with the maps they describe.
pub fn sync_records(layout: &PinLayout) -> [std::path::PathBuf; 3] {
    [
        local_addrs_record(layout),
        IfacesRecord::path(layout),
        vip_devices_record(layout),
    ]
}

/// Where the local addresses of the last sync are recorded ([`LocalRecord`]).
pub fn local_addrs_record(layout: &PinLayout) -> std::path::PathBuf {
    layout.lock_file().with_extension("local-addrs")
}

/// What the last sync wrote to the local addresses map, recorded next to
/// the lock with the inode of the map's pin (a map made anew, by a reload
/// or a new pin root, has another): while the record matches, the map
/// holds exactly these addresses. Removed before the map is changed and
/// written after, so an interrupted sync leaves no record, never a wrong
/// one.
struct LocalRecord {
    path: std::path::PathBuf,
    text: String,
}

impl LocalRecord {
    /// The record `wanted` would make; `None` when the map is not pinned.
    fn of(layout: &PinLayout, wanted: &BTreeSet<LocalAddrKey>) -> Option<LocalRecord> {
        use std::fmt::Write;
        use std::os::unix::fs::MetadataExt;
        let inode = std::fs::metadata(layout.map(map_names::LOCAL_ADDRS))
            .ok()?
            .ino();
        let mut text = format!("{inode}\n");
        for key in wanted {
            let [a, b, c, d] = key.addr_be;
            let _ = writeln!(text, "{} {a:08x}{b:08x}{c:08x}{d:08x}", key.family);
        }
        Some(LocalRecord {
            path: local_addrs_record(layout),
            text,
        })
    }

    fn is_current(&self) -> bool {
        std::fs::read_to_string(&self.path).is_ok_and(|text| text == self.text)
    }

    /// What the last sync recorded as written to this same map (its pin's
    /// inode on the first line), `None` without such a record.
    fn written(&self) -> Option<BTreeSet<LocalAddrKey>> {
        let text = std::fs::read_to_string(&self.path).ok()?;
        let (inode, rest) = text.split_once('\n')?;
        let (own_inode, _) = self.text.split_once('\n')?;
        if inode != own_inode {
            return None;
        }
        rest.lines().map(parse_addr_line).collect()
    }

    fn forget(layout: &PinLayout) {
        let _ = std::fs::remove_file(local_addrs_record(layout));
    }

    fn write(&self) -> io::Result<()> {
        crate::dataplane::pinned::lock::write_record(&self.path, &self.text)
    }
}

/// The node state an ADD wants, in the maps' terms.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Wanted {
    node: NodeConfig,
    local_addrs: BTreeSet<LocalAddrKey>,
    /// Settings of each attached interface; the container-side flag as this
    /// request sees it (a flag set earlier is kept when written).
    ifaces: BTreeMap<u32, IfaceConfig>,
    live: BTreeSet<u32>,
    interfaces: Option<Vec<String>>,
    vip_devices: Vec<String>,
}

impl Wanted {
    fn of(state: &NodeState, netns_cookie: u64) -> Wanted {
        let mut flags = 0;
        if state.snat {
            flags |= node_flags::SNAT;
        }
        if state.masq_all {
            flags |= node_flags::MASQ_ALL;
        }
        flags |= crate::dataplane::load::features::fast_path_flags(
            state.fast_path,
            state.kfuncs,
            state.forward_hooked,
        );
        if state.kernel_nat[0] {
            flags |= node_flags::KERNEL_NAT4;
        }
        if state.kernel_nat[1] {
            flags |= node_flags::KERNEL_NAT6;
        }
        let addresses: Vec<(u32, IpAddr)> = state
            .addresses
            .iter()
            .filter_map(|a| Some((a.index, a.own()?)))
            .collect();
        // First IPv4 and first global IPv6 address of each interface.
        let mut by_iface: BTreeMap<u32, IfaceConfig> = BTreeMap::new();
        for (index, addr) in &addresses {
            let entry = by_iface.entry(*index).or_default();
            match addr {
                IpAddr::V4(v4) if entry.addr4_be == 0 => {
                    entry.addr4_be = u32::from_ne_bytes(v4.octets());
                }
                IpAddr::V6(v6)
                    if entry.addr6_be == [0; 4] && (v6.segments()[0] & 0xffc0) != 0xfe80 =>
                {
                    entry.addr6_be = words_from_addr(*addr);
                }
                _ => {}
            }
        }
        let mut ifaces: BTreeMap<u32, IfaceConfig> = state
            .attached
            .iter()
            .map(|&index| {
                let mut config = by_iface.get(&index).copied().unwrap_or_default();
                if state.container_side.contains(&index) {
                    config.flags |= iface_flags::CONTAINER_SIDE;
                }
                (index, config)
            })
            .collect();
        for (&port, bridge) in &state.bridge_ports {
            let mut config = by_iface.get(bridge).copied().unwrap_or_default();
            config.flags |= iface_flags::CONTAINER_SIDE | iface_flags::with_bridge(*bridge);
            ifaces.insert(port, config);
        }
        let mut wanted = Wanted {
            node: NodeConfig {
                netns_cookie,
                flags,
                sync_hash: 0,
            },
            local_addrs: addresses.iter().map(|(_, a)| addr_key(*a)).collect(),
            ifaces,
            live: state.live.clone(),
            interfaces: state.interfaces.clone(),
            vip_devices: state.service_vip_devices.clone(),
        };
        wanted.node.sync_hash = wanted.hash();
        wanted
    }

    /// Hash of everything this state writes; never 0, the value of a node
    /// config no sync has written yet.
    fn hash(&self) -> u32 {
        let mut bytes =
            Vec::with_capacity(16 + 20 * self.local_addrs.len() + 28 * self.ifaces.len());
        bytes.extend_from_slice(&self.node.netns_cookie.to_ne_bytes());
        bytes.extend_from_slice(&self.node.flags.to_ne_bytes());
        for key in &self.local_addrs {
            for word in key.addr_be {
                bytes.extend_from_slice(&word.to_ne_bytes());
            }
            bytes.push(key.family);
        }
        for (index, config) in &self.ifaces {
            bytes.extend_from_slice(&index.to_ne_bytes());
            bytes.extend_from_slice(&config.addr4_be.to_ne_bytes());
            bytes.extend_from_slice(&config.flags.to_ne_bytes());
            for word in config.addr6_be {
                bytes.extend_from_slice(&word.to_ne_bytes());
            }
        }
        for index in &self.live {
            bytes.extend_from_slice(&index.to_ne_bytes());
        }
        // Entries are interface names or patterns: no NUL in them.
        match &self.interfaces {
            None => bytes.push(0),
            Some(list) => {
                for entry in list {
                    bytes.push(1);
                    bytes.extend_from_slice(entry.as_bytes());
                }
            }
        }
        for entry in &self.vip_devices {
            bytes.push(2);
            bytes.extend_from_slice(entry.as_bytes());
        }
        let hash = fnv1a64(&bytes);
        ((hash ^ (hash >> 32)) as u32).max(1)
    }
}

/// Makes node config, local addresses and interface settings say what
/// `state` wants; writes nothing when the last sync recorded this state.
pub fn sync(layout: &PinLayout, state: &NodeState) -> Result<(), LocalError> {
    let wanted = Wanted::of(state, netns_cookie()?);
    let mut node: Array<MapData, NodeConfig> = open(layout, map_names::NODE)?;
    if !state.sweep_interfaces && node.get(&0, 0).is_ok_and(|current| current == wanted.node) {
        return Ok(());
    }
    let _lock = lock::lock(layout)?;

    // The node hash changes with every pod (its veth is among `live`);
    // the addresses seldom do. Rewriting them only when they changed keeps
    // the walk of the map, whose length is the node's, out of each run.
    let record = LocalRecord::of(layout, &wanted.local_addrs);
    if !record.as_ref().is_some_and(LocalRecord::is_current) {
        // With a record of what the map holds, only the difference is
        // written (on a routed network every pod adds an address: a walk
        // of the map would cost a call per pod); without one, the map is
        // read whole.
        let written = record.as_ref().and_then(LocalRecord::written);
        LocalRecord::forget(layout);
        let mut local: HashMap<MapData, LocalAddrKey, u8> = open(layout, map_names::LOCAL_ADDRS)?;
        let present: BTreeSet<LocalAddrKey> = match written {
            Some(written) => written,
            None => local.keys().filter_map(Result::ok).collect(),
        };
        for key in wanted.local_addrs.difference(&present) {
            local
                .insert(key, 1, 0)
                .map_err(map_error(map_names::LOCAL_ADDRS))?;
        }
        for key in present.difference(&wanted.local_addrs) {
            // Gone from the node.
            let _ = local.remove(key);
        }
        if let Some(record) = record {
            // Not written: the next sync walks the map again.
            let _ = record.write();
        }
    }

    let mut ifaces: HashMap<MapData, u32, IfaceConfig> = open(layout, map_names::IFACES)?;
    if state.sweep_interfaces {
        sweep_interfaces(&mut ifaces, &wanted.live);
    }
    // The settings the last sync wrote: those still wanted as they are
    // cost no call (one per pod on a routed network, where every pod's veth
    // carries the programs).
    let ifaces_record = IfacesRecord::path(layout);
    let written = IfacesRecord::read(layout, &ifaces_record);
    let _ = std::fs::remove_file(&ifaces_record);
    let mut now_written = BTreeMap::new();
    for (&index, config) in &wanted.ifaces {
        let mut config = *config;
        // Once container-side, always: other containers' ADDs see only
        // their own host-side interfaces.
        let container_side = match written.as_ref() {
            Some(written) => written
                .get(&index)
                .is_some_and(|c: &IfaceConfig| c.flags & iface_flags::CONTAINER_SIDE != 0),
            None => ifaces
                .get(&index, 0)
                .is_ok_and(|c| c.flags & iface_flags::CONTAINER_SIDE != 0),
        };
        if container_side {
            config.flags |= iface_flags::CONTAINER_SIDE;
        }
        now_written.insert(index, config);
        if written
            .as_ref()
            .is_some_and(|written| written.get(&index) == Some(&config))
        {
            continue;
        }
        let inserted = ifaces.insert(index, config, 0).or_else(|error| {
            // Full of gone interfaces' settings (E2BIG), on a node where
            // neither the agent nor GC swept them: sweep here and retry.
            if state.sweep_interfaces {
                return Err(error);
            }
            sweep_interfaces(&mut ifaces, &wanted.live);
            ifaces.insert(index, config, 0)
        });
        inserted.map_err(map_error(map_names::IFACES))?;
    }
    // Settings written before and not wanted now stay in the map (a sweep
    // removes those of gone interfaces) and in the record, so that a later
    // run that wants them again knows what the map holds.
    if let Some(written) = written {
        for (index, config) in written {
            now_written.entry(index).or_insert(config);
        }
    }
    IfacesRecord::write(layout, &ifaces_record, &now_written, state.sweep_interfaces);
    record_list(&interfaces_record(layout), wanted.interfaces.as_deref())
        .map_err(LocalError::Record)?;
    let vip_devices = wanted.vip_devices.as_slice();
    record_list(
        &vip_devices_record(layout),
        (vip_devices != crate::model::DEFAULT_SERVICE_VIP_DEVICES).then_some(vip_devices),
    )
    .map_err(LocalError::Record)?;
    // Last: the hash says the state above is complete.
    node.set(0, wanted.node, 0)
        .map_err(map_error(map_names::NODE))?;
    Ok(())
}

/// The interface settings the last sync wrote (`{lock}.ifaces`): the
/// inode of the map's pin on the first line, then `index flags addr4
/// addr6` in hex, a line each. Removed before the map is changed and
/// written after, like [`LocalRecord`]; a sweep drops it (the map then
/// holds less than it says), so the next run reads the map.
struct IfacesRecord;

impl IfacesRecord {
    fn path(layout: &PinLayout) -> std::path::PathBuf {
        layout.lock_file().with_extension("ifaces")
    }

    fn inode(layout: &PinLayout) -> Option<u64> {
        use std::os::unix::fs::MetadataExt;
        Some(std::fs::metadata(layout.map(map_names::IFACES)).ok()?.ino())
    }

    fn read(layout: &PinLayout, path: &std::path::Path) -> Option<BTreeMap<u32, IfaceConfig>> {
        let text = std::fs::read_to_string(path).ok()?;
        let mut lines = text.lines();
        if lines.next()?.parse::<u64>().ok()? != Self::inode(layout)? {
            return None;
        }
        lines.map(parse_iface_line).collect()
    }

    fn write(
        layout: &PinLayout,
        path: &std::path::Path,
        written: &BTreeMap<u32, IfaceConfig>,
        swept: bool,
    ) {
        use std::fmt::Write;
        if swept {
            return;
        }
        let Some(inode) = Self::inode(layout) else {
            return;
        };
        let mut text = format!("{inode}\n");
        for (index, config) in written {
            let [a, b, c, d] = config.addr6_be;
            let _ = writeln!(
                text,
                "{index} {:x} {:08x} {a:08x}{b:08x}{c:08x}{d:08x}",
                config.flags, config.addr4_be
            );
        }
        // Best effort: without it the next run reads the map.
        let _ = crate::dataplane::pinned::lock::write_record(path, &text);
    }
}

/// One line of [`IfacesRecord`].
fn parse_iface_line(line: &str) -> Option<(u32, IfaceConfig)> {
    let mut fields = line.split(' ');
    let index = fields.next()?.parse().ok()?;
    let flags = u32::from_str_radix(fields.next()?, 16).ok()?;
    let addr4_be = u32::from_str_radix(fields.next()?, 16).ok()?;
    let addr6_be = parse_words(fields.next()?)?;
    Some((
        index,
        IfaceConfig {
            addr4_be,
            flags,
            addr6_be,
        },
    ))
}

/// One line of [`LocalRecord`]: `family words`.
fn parse_addr_line(line: &str) -> Option<LocalAddrKey> {
    let (family, words) = line.split_once(' ')?;
    Some(LocalAddrKey {
        addr_be: parse_words(words)?,
        family: family.parse().ok()?,
        _pad0: [0; 3],
    })
}

/// 32 hex digits as four words.
fn parse_words(hex: &str) -> Option<[u32; 4]> {
    if hex.len() != 32 {
        return None;
    }
    let word = |i: usize| u32::from_str_radix(hex.get(8 * i..8 * i + 8)?, 16).ok();
    Some([word(0)?, word(1)?, word(2)?, word(3)?])
}

/// Removes the settings of interfaces that are gone. The walk is as long as
/// the map (an entry per interface that ever carried the programs: one per
/// pod on a routed network), so only node-wide passes run it (the agent's,
/// GC's), and a run whose insert finds the map full; a stale entry meanwhile
/// costs a slot and nothing else (no program runs on a gone interface). An
/// index missing from this run's dump is asked about again: a run with a
/// newer dump may have recorded an interface made since.
fn sweep_interfaces(ifaces: &mut HashMap<MapData, u32, IfaceConfig>, live: &BTreeSet<u32>) {
    let stale: Vec<u32> = ifaces
        .keys()
        .filter_map(Result::ok)
        .filter(|index| {
            !live.contains(index) && crate::node::netlink::interface_name(*index).is_none()
        })
        .collect();
    for index in stale {
        let _ = ifaces.remove(&index);
    }
}

/// The addresses the last sync wrote as the node's (`None` when the map
/// cannot be read: not installed).
pub fn synced_addresses(layout: &PinLayout) -> Option<BTreeSet<IpAddr>> {
    let local: HashMap<MapData, LocalAddrKey, u8> = open(layout, map_names::LOCAL_ADDRS).ok()?;
    Some(
        local
            .keys()
            .filter_map(Result::ok)
            .map(|key| addr_from_words(key.family, &key.addr_be))
            .collect(),
    )
}

/// Interfaces recorded as container-facing by earlier runs.
pub fn container_side_indexes(layout: &PinLayout) -> BTreeSet<u32> {
    let Ok(ifaces) = open::<HashMap<MapData, u32, IfaceConfig>>(layout, map_names::IFACES) else {
        return BTreeSet::new();
    };
    ifaces
        .iter()
        .filter_map(Result::ok)
        // A bridge port carries the ingress program only, by a pin of its
        // own (see `attach::port_pins`), not the interfaces' pair.
        .filter(|(_, config)| {
            config.flags & iface_flags::CONTAINER_SIDE != 0
                && config.flags & iface_flags::BRIDGE_PORT == 0
        })
        .map(|(index, _)| index)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> NodeState {
        let address = |index, ip: &str| NodeAddress {
            index,
            local: None,
            address: Some(ip.parse().unwrap()),
        };
        NodeState {
            snat: true,
            masq_all: false,
            fast_path: FastPathSetting::Confirmed,
            kfuncs: Some(Kfuncs::Missing("bpf_skb_ct_lookup")),
            forward_hooked: None,
            kernel_nat: [false; 2],
            addresses: vec![
                address(1, "127.0.0.1"),
                address(2, "198.18.0.1"),
                address(2, "fe80::1"),
                address(2, "fd18::1"),
                address(4, "10.244.0.1"),
            ],
            container_side: BTreeSet::from([4]),
            bridge_ports: BTreeMap::from([(9, 4)]),
            attached: BTreeSet::from([2, 4]),
            live: BTreeSet::from([1, 2, 4]),
            interfaces: None,
            service_vip_devices: vec!["kube-ipvs0".to_owned()],
            sweep_interfaces: false,
        }
    }

    #[test]
    fn wanted_state_has_every_address_and_each_interfaces_first_ones() {
        let wanted = Wanted::of(&state(), 7);
        assert_eq!(wanted.node.netns_cookie, 7);
        assert_eq!(wanted.node.flags, node_flags::SNAT);
        assert_eq!(wanted.local_addrs.len(), 5, "every address, link-local too");
        let eth = wanted.ifaces[&2];
        assert_eq!(eth.addr4_be.to_ne_bytes(), [198, 18, 0, 1]);
        assert_eq!(
            eth.addr6_be,
            words_from_addr("fd18::1".parse().unwrap()),
            "the first global IPv6 address, not the link-local one"
        );
        assert_eq!(eth.flags, 0);
        assert_eq!(wanted.ifaces[&4].flags, iface_flags::CONTAINER_SIDE);
        assert!(!wanted.ifaces.contains_key(&1), "only attached interfaces");
        // A pod's bridge port: the bridge's address, container side, so
        // that a hairpin flow is masqueraded and its answer known there.
        assert_eq!(
            wanted.ifaces[&9],
            IfaceConfig {
                flags: iface_flags::CONTAINER_SIDE | iface_flags::with_bridge(4),
                ..wanted.ifaces[&4]
            }
        );
        assert_eq!(iface_flags::bridge_of(wanted.ifaces[&9].flags), 4);
        assert_ne!(wanted.ifaces[&9].flags & iface_flags::BRIDGE_PORT, 0);
        assert_eq!(iface_flags::bridge_of(iface_flags::with_bridge(1 << 24)), 0);
    }

    #[test]
    fn the_hash_changes_with_everything_that_is_written() {
        let base = Wanted::of(&state(), 7).node.sync_hash;
        assert_ne!(base, 0, "0 means never synced");
        assert_eq!(base, Wanted::of(&state(), 7).node.sync_hash, "stable");
        /// What changed, and how.
        type Change = (&'static str, fn(&mut NodeState));
        let changed: [Change; 10] = [
            ("an interface gone", |s| {
                s.live.remove(&1);
            }),
            ("interfaces configured", |s| {
                s.interfaces = Some(vec!["eth*".into()]);
            }),
            ("interfaces configured otherwise", |s| {
                s.interfaces = Some(vec!["eth".into(), "*".into()]);
            }),
            ("an address gone", |s| {
                s.addresses.pop();
            }),
            ("an address added", |s| {
                s.addresses.push(NodeAddress {
                    index: 5,
                    local: None,
                    address: Some("fe80::5".parse().unwrap()),
                });
            }),
            ("snat off", |s| s.snat = false),
            ("masqAll on", |s| s.masq_all = true),
            ("another interface attached", |s| {
                s.attached.insert(1);
            }),
            ("another bridge port", |s| {
                s.bridge_ports.insert(11, 4);
            }),
            ("another container side", |s| {
                s.container_side.insert(2);
            }),
        ];
        for (what, change) in changed {
            let mut other = state();
            change(&mut other);
            assert_ne!(Wanted::of(&other, 7).node.sync_hash, base, "{what}");
        }
        assert_ne!(
            Wanted::of(&state(), 8).node.sync_hash,
            base,
            "another netns"
        );
    }

    #[test]
    fn records_read_back_what_they_wrote() {
        use std::fmt::Write;
        let config = IfaceConfig {
            addr4_be: 0x0100_f40a,
            flags: iface_flags::CONTAINER_SIDE,
            addr6_be: [0xfd44_0000, 0, 0, 0x0100_0000],
        };
        let [a, b, c, d] = config.addr6_be;
        let mut line = String::new();
        let _ = write!(
            line,
            "7 {:x} {:08x} {a:08x}{b:08x}{c:08x}{d:08x}",
            config.flags, config.addr4_be
        );
        assert_eq!(parse_iface_line(&line), Some((7, config)));
        assert_eq!(parse_iface_line("7 1 0a00f401"), None, "a short line");
        let key = addr_key("fd44::1".parse().unwrap());
        let [a, b, c, d] = key.addr_be;
        let line = format!("{} {a:08x}{b:08x}{c:08x}{d:08x}", key.family);
        assert_eq!(parse_addr_line(&line), Some(key));
        assert_eq!(parse_addr_line("4 0a"), None, "too few digits");
    }
}
