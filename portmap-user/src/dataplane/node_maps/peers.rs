//! The fast path's hand-over table (`peers`): for each container address,
//! the host end of the container's veth and the two MACs of the link, so
//! the ingress program can give a translated packet straight to the
//! container (`bpf_redirect_peer`) instead of routing it through the node.
//!
//! Entries are written by ADD from prevResult and removed by DEL and GC.
//! The dataplane follows one only while its owner is the owner of the
//! mapping that translated the flow, so a stale entry is never used.

use std::{collections::BTreeSet, io, net::IpAddr, os::fd::FromRawFd};

use crate::model::{ContainerAddrs, PrevInterface};
use crate::{
    dataplane::ownership::words_from_addr,
    dataplane::pinned::maps::{MapsError, open},
    dataplane::pinned::pin::PinLayout,
};
use aya::maps::{HashMap, MapData};
use portmap_common::{
    FAMILY_V4, FAMILY_V6,
    local::{Peer, PeerKey, map_names},
};

/// Where a container's packets are handed over (a [`Peer`] without owner).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Handover {
    pub ifindex: u32,
    pub container_mac: [u8; 6],
    pub gateway_mac: [u8; 6],
}

fn parse_mac(text: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = text.split(':');
    for byte in &mut mac {
        *byte = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

fn sysfs_mac(name: &str) -> Option<[u8; 6]> {
    let text = std::fs::read_to_string(format!("/sys/class/net/{name}/address")).ok()?;
    parse_mac(text.trim())
}

/// The kernel driver of interface `name` (ethtool's GDRVINFO): "veth",
/// "bridge", ...
fn driver(name: &str) -> Option<String> {
    const ETHTOOL_GDRVINFO: u32 = 0x3;
    #[repr(C)]
    struct DrvInfo {
        cmd: u32,
        driver: [u8; 32],
        rest: [u8; 164],
    }
    #[repr(C)]
    struct IfReq {
        name: [u8; libc::IFNAMSIZ],
        data: *mut DrvInfo,
        _pad: [u8; 16],
    }
    if name.len() >= libc::IFNAMSIZ {
        return None;
    }
    let mut info = DrvInfo {
        cmd: ETHTOOL_GDRVINFO,
        driver: [0; 32],
        rest: [0; 164],
    };
    let mut request = IfReq {
        name: [0; libc::IFNAMSIZ],
        data: &raw mut info,
        _pad: [0; 16],
    };
    request.name[..name.len()].copy_from_slice(name.as_bytes());
    // SAFETY: plain socket(2); the fd is owned right away.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: a fresh fd nobody else owns.
    let socket = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
    // SAFETY: SIOCETHTOOL with an ifreq whose data points at a drvinfo
    // buffer of the size the kernel writes; both outlive the call.
    let rc = unsafe {
        libc::ioctl(
            std::os::fd::AsRawFd::as_raw_fd(&socket),
            libc::SIOCETHTOOL as _,
            &mut request,
        )
    };
    if rc != 0 {
        log::debug!("ethtool driver of {name}: {}", io::Error::last_os_error());
        return None;
    }
    let len = info.driver.iter().position(|&b| b == 0).unwrap_or(32);
    Some(String::from_utf8_lossy(&info.driver[..len]).into_owned())
}

/// The hand-over of the container interface `ifname`, from prevResult's
/// interfaces (keys matched like upstream, read by `cni::prev_result`):
/// its MAC, and the host end of its veth (a bridge port, whose
/// bridge is the gateway; or the only host-side interface, ptp-style).
/// `None` when the main plugin gave the container no veth (macvlan, ipvlan,
/// ...) or left out what is needed: those containers use the normal path.
///
/// `link` answers (index, is a bridge port) for a host interface name.
pub fn handover(
    interfaces: &[PrevInterface],
    ifname: &str,
    mut link: impl FnMut(&str) -> Option<(u32, bool)>,
) -> Option<Handover> {
    let container = interfaces
        .iter()
        .find(|i| i.in_sandbox() && i.name.as_deref() == Some(ifname))?;
    let container_mac = parse_mac(container.mac.as_deref()?)?;
    // (name, index, mac as reported, is a bridge port) of the host-side
    // interfaces.
    let host: Vec<(String, u32, Option<[u8; 6]>, bool)> = interfaces
        .iter()
        .filter(|i| !i.in_sandbox())
        .filter_map(|i| {
            let name = i.name.as_deref()?;
            let (index, port) = link(name)?;
            Some((
                name.to_owned(),
                index,
                i.mac.as_deref().and_then(parse_mac),
                port,
            ))
        })
        .collect();
    let (veth, gateway) = match host.iter().find(|h| h.3) {
        Some(port) => (port, host.iter().find(|h| !h.3)?),
        None if host.len() == 1 => (&host[0], &host[0]),
        None => return None,
    };
    // bpf_redirect_peer drops what it cannot hand to a peer: only veths.
    if driver(&veth.0).as_deref() != Some("veth") {
        return None;
    }
    let gateway_mac = gateway.2.or_else(|| sysfs_mac(&gateway.0))?;
    Some(Handover {
        ifindex: veth.1,
        container_mac,
        gateway_mac,
    })
}

fn key(addr: IpAddr) -> PeerKey {
    PeerKey {
        addr_be: words_from_addr(addr),
        family: if addr.is_ipv4() { FAMILY_V4 } else { FAMILY_V6 },
        _pad0: [0; 3],
    }
}

fn addrs(container: &ContainerAddrs) -> impl Iterator<Item = IpAddr> {
    container
        .v4
        .map(IpAddr::from)
        .into_iter()
        .chain(container.v6.map(IpAddr::from))
}

fn peers_map(layout: &PinLayout) -> Result<HashMap<MapData, PeerKey, Peer>, MapsError> {
    open(layout, map_names::PEERS)
}

/// Records the hand-over of each of the container's addresses for `owner_id`.
pub fn record(
    layout: &PinLayout,
    owner_id: u64,
    container: &ContainerAddrs,
    handover: &Handover,
) -> Result<(), MapsError> {
    let mut map = peers_map(layout)?;
    let peer = Peer {
        owner_id,
        ifindex: handover.ifindex,
        container_mac: handover.container_mac,
        gateway_mac: handover.gateway_mac,
    };
    for addr in addrs(container) {
        map.insert(key(addr), peer, 0)
            .map_err(|source| MapsError::Update {
                map: map_names::PEERS,
                source,
            })?;
    }
    Ok(())
}

/// Removes the entries of `owner_id` for these container addresses (an
/// entry another owner wrote since is left alone).
pub fn forget(layout: &PinLayout, owner_id: u64, addrs: &BTreeSet<(u8, [u32; 4])>) {
    let Ok(mut map) = peers_map(layout) else {
        return;
    };
    for &(family, addr_be) in addrs {
        let key = PeerKey {
            addr_be,
            family,
            _pad0: [0; 3],
        };
        if map.get(&key, 0).is_ok_and(|p| p.owner_id == owner_id) {
            let _ = map.remove(&key);
        }
    }
}

/// Removes entries whose owner no longer exists; returns how many.
pub fn prune(layout: &PinLayout, live_owner: impl Fn(u64) -> bool) -> usize {
    let Ok(mut map) = peers_map(layout) else {
        return 0;
    };
    let stale: Vec<PeerKey> = map
        .iter()
        .filter_map(Result::ok)
        .filter(|(_, peer)| !live_owner(peer.owner_id))
        .map(|(key, _)| key)
        .collect();
    stale.iter().filter(|k| map.remove(k).is_ok()).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macs_parse_only_when_whole() {
        assert_eq!(
            parse_mac("0a:58:0a:f4:00:02"),
            Some([0x0a, 0x58, 0x0a, 0xf4, 0x00, 0x02])
        );
        assert_eq!(parse_mac("0a:58:0a:f4:00"), None);
        assert_eq!(parse_mac("0a:58:0a:f4:00:02:03"), None);
        assert_eq!(parse_mac("zz:58:0a:f4:00:02"), None);
    }

    #[test]
    fn no_handover_without_a_sandbox_interface_of_that_name() {
        let interface = |name: &str, mac: &str, sandbox: Option<&str>| PrevInterface {
            name: Some(name.into()),
            mac: Some(mac.into()),
            sandbox: sandbox.map(str::to_owned),
        };
        let interfaces = [
            interface("cni0", "0a:00:00:00:00:01", None),
            interface("eth0", "0a:00:00:00:00:02", Some("/run/netns/x")),
        ];
        assert_eq!(handover(&interfaces, "eth1", |_| Some((1, false))), None);
    }
}
