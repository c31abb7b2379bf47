//! Where the node has moved on since the plugin's last run: interfaces
//! without the programs, addresses the socket hooks do not know, hostIPs
//! the node lacks.

use std::net::IpAddr;

use portmap_common::{MappingKey, MappingValue, map_names};

use super::attachments::TcAttachment;
use crate::dataplane::{
    maps, node_state,
    ownership::{KeyDisplay, addr_from_words},
    pin::PinLayout,
};
use crate::node::netlink;

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
    /// Node addresses the dataplane does not know as the node's: host ports
    /// do not answer on them yet.
    pub unsynced: Vec<IpAddr>,
    /// Addresses the dataplane takes for the node's that it no longer has.
    pub stale: Vec<IpAddr>,
    /// The addresses a wildcard host port answers on (the last sync's,
    /// sorted; empty when they cannot be read).
    pub covered: Vec<IpAddr>,
    /// Addresses of the node that host ports never answer on, each with
    /// its interface: those of a Service VIP device (`serviceVipDevices`).
    pub vip_excluded: Vec<(IpAddr, String)>,
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
    let vip_devices = node_state::recorded_vip_devices(layout);
    let vip: std::collections::BTreeMap<u32, &str> = links
        .iter()
        .filter(|l| netlink::name_matches(&vip_devices, &l.name))
        .map(|l| (l.index, l.name.as_str()))
        .collect();
    for address in &addresses {
        if let (Some(name), Some(addr)) = (vip.get(&address.index), address.own()) {
            drift.vip_excluded.push((addr, (*name).to_owned()));
        }
    }
    drift.vip_excluded.sort();
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
        drift.covered = synced.iter().copied().collect();
        // A Service VIP's address is the node's and never a host port's.
        let own: std::collections::BTreeSet<IpAddr> = own
            .iter()
            .filter(routable)
            .filter(|addr| !drift.vip_excluded.iter().any(|(vip, _)| vip == *addr))
            .copied()
            .collect();
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
