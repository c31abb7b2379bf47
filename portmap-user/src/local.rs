//! Node state for the socket hooks and the hairpin: the node's network
//! namespace cookie and flags, the node's own addresses, and the settings of
//! each interface the tc programs run on. Written by every ADD (cheap: a few
//! map updates), so the state follows the node as containers come and go.

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
    maps::{MapsError, open},
    netlink::NodeAddress,
    pin::PinLayout,
    store::words_from_addr,
};

#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    #[error(transparent)]
    Maps(#[from] MapsError),
    #[error("cannot read the network namespace cookie (SO_NETNS_COOKIE needs Linux 5.14)")]
    Cookie(#[source] io::Error),
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
            (&mut cookie as *mut u64).cast(),
            &mut len,
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
    /// The node's addresses, as rtnetlink reported them.
    pub addresses: Vec<NodeAddress>,
    /// Interfaces containers sit behind (from prevResult's host-side
    /// interfaces), by index.
    pub container_side: BTreeSet<u32>,
    /// Every interface the tc programs run on.
    pub attached: BTreeSet<u32>,
}

/// Writes node config, local addresses and interface settings.
pub fn sync(layout: &PinLayout, state: &NodeState) -> Result<(), LocalError> {
    let mut flags = 0;
    if state.snat {
        flags |= node_flags::SNAT;
    }
    if state.masq_all {
        flags |= node_flags::MASQ_ALL;
    }
    let mut node: Array<MapData, NodeConfig> = open(layout, map_names::NODE)?;
    let config = NodeConfig {
        netns_cookie: netns_cookie()?,
        flags,
        _pad0: 0,
    };
    node.set(0, config, 0).map_err(map_error(map_names::NODE))?;

    let addresses: Vec<(u32, IpAddr)> = state
        .addresses
        .iter()
        .filter_map(|a| Some((a.index, a.own()?)))
        .collect();
    let mut local: HashMap<MapData, LocalAddrKey, u8> = open(layout, map_names::LOCAL_ADDRS)?;
    let wanted: BTreeSet<LocalAddrKey> = addresses.iter().map(|(_, a)| addr_key(*a)).collect();
    let present: Vec<LocalAddrKey> = local.keys().filter_map(Result::ok).collect();
    for key in &wanted {
        local
            .insert(key, 1, 0)
            .map_err(map_error(map_names::LOCAL_ADDRS))?;
    }
    for key in present.iter().filter(|k| !wanted.contains(k)) {
        // Gone from the node; a concurrent ADD may have removed it already.
        let _ = local.remove(key);
    }

    // First IPv4 and first global IPv6 address of each interface.
    let mut by_iface: BTreeMap<u32, IfaceConfig> = BTreeMap::new();
    for (index, addr) in &addresses {
        let entry = by_iface.entry(*index).or_default();
        match addr {
            IpAddr::V4(v4) if entry.addr4_be == 0 => {
                entry.addr4_be = u32::from_ne_bytes(v4.octets());
            }
            IpAddr::V6(v6) if entry.addr6_be == [0; 4] && (v6.segments()[0] & 0xffc0) != 0xfe80 => {
                entry.addr6_be = words_from_addr(*addr);
            }
            _ => {}
        }
    }
    let mut ifaces: HashMap<MapData, u32, IfaceConfig> = open(layout, map_names::IFACES)?;
    for &index in &state.attached {
        let mut config = by_iface.get(&index).copied().unwrap_or_default();
        let was_container_side = ifaces
            .get(&index, 0)
            .is_ok_and(|c| c.flags & iface_flags::CONTAINER_SIDE != 0);
        if was_container_side || state.container_side.contains(&index) {
            config.flags |= iface_flags::CONTAINER_SIDE;
        }
        ifaces
            .insert(index, config, 0)
            .map_err(map_error(map_names::IFACES))?;
    }
    Ok(())
}
