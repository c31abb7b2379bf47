//! The few facts about the node's network the plugin needs, read over
//! rtnetlink in the namespace the plugin runs in: which interfaces carry the
//! default routes, the node's addresses, and whether an interface is a
//! bridge port.
//!
//! One [`Rtnl`] socket answers every question of a request: a CNI ADD asks
//! one route dump, one address dump (both families each) and one link
//! request per host-side interface, instead of a socket and a dump per
//! question and family.

use std::{collections::BTreeSet, io, net::IpAddr};

use netlink_packet_core::{
    NLM_F_DUMP, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload,
};
use netlink_packet_route::{
    AddressFamily, RouteNetlinkMessage,
    address::{AddressAttribute, AddressMessage},
    link::{LinkAttribute, LinkExtentMask, LinkMessage},
    route::{RouteAttribute, RouteMessage, RouteType},
};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};

#[derive(Debug, thiserror::Error)]
pub enum NetlinkError {
    #[error("netlink {call} failed")]
    Io {
        call: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("netlink answered with error {code}")]
    Kernel { code: i32 },
    #[error("cannot decode a netlink message")]
    Decode,
    #[error("a netlink message is larger than the {RECEIVE_BUFFER} byte receive buffer")]
    Truncated,
}

/// Receive buffer: the kernel fills dump datagrams up to 32 KiB, and the
/// single messages we ask for (a link without statistics) are far smaller.
const RECEIVE_BUFFER: usize = 64 * 1024;

/// An rtnetlink socket, kept for every question one request asks.
pub struct Rtnl {
    socket: Socket,
    sequence: u32,
    buffer: Vec<u8>,
}

/// One address of the node as `RTM_GETADDR` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeAddress {
    /// Index of the interface holding it.
    pub index: u32,
    /// `IFA_LOCAL`: the local address (IPv4; the peer's is in `address` on
    /// point-to-point links).
    pub local: Option<IpAddr>,
    /// `IFA_ADDRESS`: the address (IPv6 has only this one).
    pub address: Option<IpAddr>,
}

impl NodeAddress {
    /// The node's own address: the local one if reported, else the address.
    pub fn own(&self) -> Option<IpAddr> {
        self.local.or(self.address)
    }
}

/// What a link request tells about one interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkFacts {
    pub index: u32,
    /// Enslaved to a bridge (or another controller).
    pub has_controller: bool,
}

impl Rtnl {
    pub fn open() -> Result<Rtnl, NetlinkError> {
        let io = |call| move |source| NetlinkError::Io { call, source };
        let mut socket = Socket::new(NETLINK_ROUTE).map_err(io("socket"))?;
        socket.bind_auto().map_err(io("bind"))?;
        socket
            .connect(&SocketAddr::new(0, 0))
            .map_err(io("connect"))?;
        Ok(Rtnl {
            socket,
            sequence: 0,
            buffer: Vec::with_capacity(RECEIVE_BUFFER),
        })
    }

    /// Sends `request` and collects the answers: every message of a dump
    /// (`dump`), or the one answer to a plain request.
    fn exchange(
        &mut self,
        request: RouteNetlinkMessage,
        dump: bool,
    ) -> Result<Vec<RouteNetlinkMessage>, NetlinkError> {
        let io = |call| move |source| NetlinkError::Io { call, source };
        self.sequence += 1;
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | if dump { NLM_F_DUMP } else { 0 };
        header.sequence_number = self.sequence;
        let mut message = NetlinkMessage::new(header, NetlinkPayload::from(request));
        message.finalize();
        let mut bytes = vec![0; message.buffer_len()];
        message.serialize(&mut bytes);
        self.socket.send(&bytes, 0).map_err(io("send"))?;

        let mut answers = Vec::new();
        loop {
            self.buffer.clear();
            let length = self
                .socket
                .recv(&mut self.buffer, libc::MSG_TRUNC)
                .map_err(io("recv"))?;
            if length > self.buffer.len() {
                return Err(NetlinkError::Truncated);
            }
            let mut offset = 0;
            while offset < self.buffer.len() {
                let message =
                    NetlinkMessage::<RouteNetlinkMessage>::deserialize(&self.buffer[offset..])
                        .map_err(|_| NetlinkError::Decode)?;
                let length = message.header.length as usize;
                // A late answer to an earlier request of ours is not this one's.
                let ours = message.header.sequence_number == self.sequence;
                match message.payload {
                    _ if !ours => {}
                    NetlinkPayload::Done(_) => return Ok(answers),
                    NetlinkPayload::Error(error) => {
                        return Err(NetlinkError::Kernel {
                            code: error.code.map_or(0, |code| code.get()),
                        });
                    }
                    NetlinkPayload::InnerMessage(inner) => {
                        answers.push(inner);
                        if !dump {
                            return Ok(answers);
                        }
                    }
                    _ => {}
                }
                if length == 0 {
                    break;
                }
                offset += length;
            }
        }
    }

    /// Interfaces that carry a default route (IPv4 or IPv6, any table the
    /// kernel dumps), including every next hop of a multipath route.
    pub fn default_route_interfaces(&mut self) -> Result<BTreeSet<u32>, NetlinkError> {
        // AF_UNSPEC: one dump of every family's routes.
        let answers =
            self.exchange(RouteNetlinkMessage::GetRoute(RouteMessage::default()), true)?;
        Ok(default_route_interfaces_in(&answers))
    }

    /// Every address of the node, both families.
    pub fn addresses(&mut self) -> Result<Vec<NodeAddress>, NetlinkError> {
        let answers = self.exchange(
            RouteNetlinkMessage::GetAddress(AddressMessage::default()),
            true,
        )?;
        Ok(answers
            .iter()
            .filter_map(|answer| match answer {
                RouteNetlinkMessage::NewAddress(message) => Some(node_address(message)),
                _ => None,
            })
            .collect())
    }

    /// Index of interface `name` and whether it is a bridge port; `None`
    /// if there is no such interface.
    pub fn link(&mut self, name: &str) -> Result<Option<LinkFacts>, NetlinkError> {
        let mut request = LinkMessage::default();
        request.attributes = vec![
            LinkAttribute::IfName(name.to_owned()),
            // The counters are most of a link message, and none of our business.
            LinkAttribute::ExtMask(vec![LinkExtentMask::SkipStats]),
        ];
        let answers = match self.exchange(RouteNetlinkMessage::GetLink(request), false) {
            Ok(answers) => answers,
            Err(NetlinkError::Kernel { code }) if code == -libc::ENODEV => return Ok(None),
            Err(error) => return Err(error),
        };
        Ok(answers.iter().find_map(|answer| match answer {
            RouteNetlinkMessage::NewLink(link) => Some(LinkFacts {
                index: link.header.index,
                has_controller: link
                    .attributes
                    .iter()
                    .any(|a| matches!(a, LinkAttribute::Controller(index) if *index != 0)),
            }),
            _ => None,
        }))
    }
}

fn default_route_interfaces_in(answers: &[RouteNetlinkMessage]) -> BTreeSet<u32> {
    let mut interfaces = BTreeSet::new();
    for answer in answers {
        let RouteNetlinkMessage::NewRoute(route) = answer else {
            continue;
        };
        // An AF_UNSPEC dump also has the multicast routing families.
        if !matches!(
            route.header.address_family,
            AddressFamily::Inet | AddressFamily::Inet6
        ) || route.header.destination_prefix_length != 0
            || route.header.kind != RouteType::Unicast
        {
            continue;
        }
        for attribute in &route.attributes {
            match attribute {
                RouteAttribute::Oif(index) => {
                    interfaces.insert(*index);
                }
                RouteAttribute::MultiPath(hops) => {
                    interfaces.extend(hops.iter().map(|hop| hop.interface_index));
                }
                _ => {}
            }
        }
    }
    interfaces
}

fn node_address(message: &AddressMessage) -> NodeAddress {
    let mut found = NodeAddress {
        index: message.header.index,
        local: None,
        address: None,
    };
    for attribute in &message.attributes {
        match attribute {
            AddressAttribute::Local(ip) => found.local = Some(*ip),
            AddressAttribute::Address(ip) => found.address = Some(*ip),
            _ => {}
        }
    }
    found
}

/// Index of the interface that holds `address` (as its local address or
/// its address), if any does.
pub fn interface_with_address(addresses: &[NodeAddress], address: IpAddr) -> Option<u32> {
    addresses
        .iter()
        .find(|a| a.local == Some(address) || a.address == Some(address))
        .map(|a| a.index)
}

/// Name of interface `index`, if it exists.
pub fn interface_name(index: u32) -> Option<String> {
    let mut buffer = [0u8; libc::IF_NAMESIZE];
    // SAFETY: the buffer is IF_NAMESIZE bytes as if_indextoname requires.
    let name = unsafe { libc::if_indextoname(index, buffer.as_mut_ptr().cast()) };
    if name.is_null() {
        return None;
    }
    let len = buffer.iter().position(|&b| b == 0).unwrap_or(buffer.len());
    Some(String::from_utf8_lossy(&buffer[..len]).into_owned())
}

/// Index of interface `name`, if it exists.
pub fn interface_index(name: &str) -> Option<u32> {
    let name = std::ffi::CString::new(name).ok()?;
    // SAFETY: a valid NUL-terminated string.
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    (index != 0).then_some(index)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(family: AddressFamily, prefix: u8, kind: RouteType, oif: u32) -> RouteNetlinkMessage {
        let mut route = RouteMessage::default();
        route.header.address_family = family;
        route.header.destination_prefix_length = prefix;
        route.header.kind = kind;
        route.attributes.push(RouteAttribute::Oif(oif));
        RouteNetlinkMessage::NewRoute(route)
    }

    #[test]
    fn default_routes_of_both_families_only() {
        let answers = [
            route(AddressFamily::Inet, 0, RouteType::Unicast, 2),
            route(AddressFamily::Inet6, 0, RouteType::Unicast, 3),
            route(AddressFamily::Inet, 24, RouteType::Unicast, 4),
            route(AddressFamily::Inet, 0, RouteType::Local, 5),
            route(AddressFamily::from(128), 0, RouteType::Unicast, 6),
        ];
        assert_eq!(
            default_route_interfaces_in(&answers),
            BTreeSet::from([2, 3]),
            "unicast /0 routes of IPv4 and IPv6; no prefixes, local routes or multicast families"
        );
    }

    #[test]
    fn an_address_is_found_by_its_local_or_its_address() {
        let peer: IpAddr = "10.0.0.2".parse().unwrap();
        let local: IpAddr = "10.0.0.1".parse().unwrap();
        let v6: IpAddr = "fd00::1".parse().unwrap();
        let addresses = [
            NodeAddress {
                index: 7,
                local: Some(local),
                address: Some(peer),
            },
            NodeAddress {
                index: 8,
                local: None,
                address: Some(v6),
            },
        ];
        assert_eq!(addresses[0].own(), Some(local), "IPv4: the local address");
        assert_eq!(addresses[1].own(), Some(v6), "IPv6: the address");
        assert_eq!(interface_with_address(&addresses, local), Some(7));
        assert_eq!(interface_with_address(&addresses, peer), Some(7));
        assert_eq!(interface_with_address(&addresses, v6), Some(8));
        assert_eq!(
            interface_with_address(&addresses, "10.9.9.9".parse().unwrap()),
            None
        );
    }
}
