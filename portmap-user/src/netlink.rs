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
    ErrorBuffer, NLM_F_DUMP, NLM_F_REQUEST, NLMSG_DONE, NLMSG_ERROR, NetlinkBuffer, NetlinkHeader,
    NetlinkMessage, NetlinkPayload, NlasIterator, parse_ip, parse_u32,
};
use netlink_packet_route::{
    AddressFamily, RouteNetlinkMessage,
    address::{AddressHeader, AddressMessage},
    link::{LinkAttribute, LinkExtentMask, LinkHeader, LinkMessage},
    route::{RouteHeader, RouteMessage, RouteType},
};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};

/// The answers are read straight from the kernel's bytes, and only the
/// attributes asked for are decoded: decoding whole messages (a link's
/// every setting, every route of every table) was most of the cost of
/// these questions.
mod wire {
    pub const RTM_NEWLINK: u16 = 16;
    pub const RTM_NEWADDR: u16 = 20;
    pub const RTM_NEWROUTE: u16 = 24;
    /// `struct ifinfomsg`, `struct ifaddrmsg`, `struct rtmsg`.
    pub const LINK_HEADER_LEN: usize = 16;
    pub const ADDRESS_HEADER_LEN: usize = 8;
    pub const ROUTE_HEADER_LEN: usize = 12;
    pub const IFLA_MASTER: u16 = 10;
    pub const IFA_ADDRESS: u16 = 1;
    pub const IFA_LOCAL: u16 = 2;
    pub const RTA_OIF: u16 = 4;
    pub const RTA_MULTIPATH: u16 = 9;
}

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

    /// Sends `request` and hands every answer of ours to `each` as
    /// (message type, payload): every message of a dump (`dump`), or the
    /// one answer to a plain request.
    fn exchange(
        &mut self,
        request: RouteNetlinkMessage,
        dump: bool,
        mut each: impl FnMut(u16, &[u8]) -> Result<(), NetlinkError>,
    ) -> Result<(), NetlinkError> {
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
                let message = NetlinkBuffer::new_checked(&self.buffer[offset..])
                    .map_err(|_| NetlinkError::Decode)?;
                let length = message.length() as usize;
                // A late answer to an earlier request of ours is not this one's.
                if message.sequence_number() == self.sequence {
                    match message.message_type() {
                        NLMSG_DONE => return Ok(()),
                        NLMSG_ERROR => {
                            let error = ErrorBuffer::new_checked(message.payload())
                                .map_err(|_| NetlinkError::Decode)?;
                            return match error.code() {
                                Some(code) => Err(NetlinkError::Kernel { code: code.get() }),
                                None => Ok(()),
                            };
                        }
                        kind => {
                            each(kind, message.payload())?;
                            if !dump {
                                return Ok(());
                            }
                        }
                    }
                }
                // Messages are 4-byte aligned (NLMSG_ALIGN).
                offset += length.div_ceil(4).max(1) * 4;
            }
        }
    }

    /// Interfaces that carry a default route (IPv4 or IPv6, any table the
    /// kernel dumps), including every next hop of a multipath route.
    pub fn default_route_interfaces(&mut self) -> Result<BTreeSet<u32>, NetlinkError> {
        let mut interfaces = BTreeSet::new();
        // AF_UNSPEC: one dump of every family's routes.
        self.exchange(
            RouteNetlinkMessage::GetRoute(RouteMessage::default()),
            true,
            |kind, payload| {
                if kind == wire::RTM_NEWROUTE {
                    default_route_interfaces_of(payload, &mut interfaces)?;
                }
                Ok(())
            },
        )?;
        Ok(interfaces)
    }

    /// Every address of the node, both families.
    pub fn addresses(&mut self) -> Result<Vec<NodeAddress>, NetlinkError> {
        let mut found = Vec::new();
        self.exchange(
            RouteNetlinkMessage::GetAddress(AddressMessage::default()),
            true,
            |kind, payload| {
                if kind == wire::RTM_NEWADDR {
                    found.push(node_address(payload)?);
                }
                Ok(())
            },
        )?;
        Ok(found)
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
        let mut found = None;
        let outcome = self.exchange(
            RouteNetlinkMessage::GetLink(request),
            false,
            |kind, payload| {
                if kind == wire::RTM_NEWLINK {
                    found = Some(link_facts(payload)?);
                }
                Ok(())
            },
        );
        match outcome {
            Ok(()) => Ok(found),
            Err(NetlinkError::Kernel { code }) if code == -libc::ENODEV => Ok(None),
            Err(error) => Err(error),
        }
    }
}

/// The attributes of a message, after its fixed header of `header_len` bytes.
fn attributes(
    payload: &[u8],
    header_len: usize,
) -> Result<impl Iterator<Item = netlink_packet_core::NlaBuffer<&[u8]>>, NetlinkError> {
    let rest = payload.get(header_len..).ok_or(NetlinkError::Decode)?;
    Ok(NlasIterator::new(rest).map_while(Result::ok))
}

/// Adds the outgoing interfaces of `payload` (an `RTM_NEWROUTE`) if it is a
/// unicast default route of IPv4 or IPv6; other routes are not decoded.
fn default_route_interfaces_of(
    payload: &[u8],
    interfaces: &mut BTreeSet<u32>,
) -> Result<(), NetlinkError> {
    let header = RouteHeader::parse(payload).map_err(|_| NetlinkError::Decode)?;
    // An AF_UNSPEC dump also has the multicast routing families.
    if !matches!(
        header.address_family,
        AddressFamily::Inet | AddressFamily::Inet6
    ) || header.destination_prefix_length != 0
        || header.kind != RouteType::Unicast
    {
        return Ok(());
    }
    for nla in attributes(payload, wire::ROUTE_HEADER_LEN)? {
        match nla.kind() {
            wire::RTA_OIF => {
                interfaces.insert(parse_u32(nla.value()).map_err(|_| NetlinkError::Decode)?);
            }
            wire::RTA_MULTIPATH => interfaces.extend(next_hop_interfaces(nla.value())),
            _ => {}
        }
    }
    Ok(())
}

/// Interface index of every next hop in an `RTA_MULTIPATH` value: a
/// sequence of `struct rtnexthop { u16 rtnh_len; u8 rtnh_flags; u8
/// rtnh_hops; s32 rtnh_ifindex; }`, each followed by its own attributes
/// (which need not be decoded, whatever their encapsulation).
fn next_hop_interfaces(mut value: &[u8]) -> Vec<u32> {
    const RTNH_HEADER_LEN: usize = 8;
    let mut interfaces = Vec::new();
    while value.len() >= RTNH_HEADER_LEN {
        let length = usize::from(u16::from_ne_bytes([value[0], value[1]]));
        let ifindex = u32::from_ne_bytes([value[4], value[5], value[6], value[7]]);
        if length < RTNH_HEADER_LEN {
            break;
        }
        interfaces.push(ifindex);
        // RTNH_ALIGN: 4 bytes.
        value = value.get(length.div_ceil(4) * 4..).unwrap_or_default();
    }
    interfaces
}

/// The interface and addresses of `payload`, an `RTM_NEWADDR`.
fn node_address(payload: &[u8]) -> Result<NodeAddress, NetlinkError> {
    let header = AddressHeader::parse(payload).map_err(|_| NetlinkError::Decode)?;
    let mut found = NodeAddress {
        index: header.index,
        local: None,
        address: None,
    };
    for nla in attributes(payload, wire::ADDRESS_HEADER_LEN)? {
        let slot = match nla.kind() {
            wire::IFA_LOCAL => &mut found.local,
            wire::IFA_ADDRESS => &mut found.address,
            _ => continue,
        };
        *slot = Some(parse_ip(nla.value()).map_err(|_| NetlinkError::Decode)?);
    }
    Ok(found)
}

/// Index and controller of `payload`, an `RTM_NEWLINK`.
fn link_facts(payload: &[u8]) -> Result<LinkFacts, NetlinkError> {
    let header = LinkHeader::parse(payload).map_err(|_| NetlinkError::Decode)?;
    let mut has_controller = false;
    for nla in attributes(payload, wire::LINK_HEADER_LEN)? {
        if nla.kind() == wire::IFLA_MASTER {
            has_controller = parse_u32(nla.value()).map_err(|_| NetlinkError::Decode)? != 0;
        }
    }
    Ok(LinkFacts {
        index: header.index,
        has_controller,
    })
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
    use netlink_packet_core::Emitable;
    use netlink_packet_route::address::AddressAttribute;

    use super::*;

    /// The bytes the kernel would send for `message` (its payload).
    fn wire_bytes(message: &impl Emitable) -> Vec<u8> {
        let mut bytes = vec![0; message.buffer_len()];
        message.emit(&mut bytes);
        bytes
    }

    fn route(family: AddressFamily, prefix: u8, kind: RouteType, oif: u32) -> Vec<u8> {
        let mut route = RouteMessage::default();
        route.header.address_family = family;
        route.header.destination_prefix_length = prefix;
        route.header.kind = kind;
        route
            .attributes
            .push(netlink_packet_route::route::RouteAttribute::Table(254));
        route
            .attributes
            .push(netlink_packet_route::route::RouteAttribute::Oif(oif));
        wire_bytes(&route)
    }

    #[test]
    fn default_routes_of_both_families_only() {
        let mut interfaces = BTreeSet::new();
        for payload in [
            route(AddressFamily::Inet, 0, RouteType::Unicast, 2),
            route(AddressFamily::Inet6, 0, RouteType::Unicast, 3),
            route(AddressFamily::Inet, 24, RouteType::Unicast, 4),
            route(AddressFamily::Inet, 0, RouteType::Local, 5),
            route(AddressFamily::from(128), 0, RouteType::Unicast, 6),
        ] {
            default_route_interfaces_of(&payload, &mut interfaces).unwrap();
        }
        assert_eq!(
            interfaces,
            BTreeSet::from([2, 3]),
            "unicast /0 routes of IPv4 and IPv6; no prefixes, local routes or multicast families"
        );
    }

    #[test]
    fn every_next_hop_of_a_multipath_default_route() {
        use netlink_packet_route::route::{RouteAddress, RouteAttribute, RouteNextHop};
        let hop = |index: u32, gateway: &str| {
            let mut hop = RouteNextHop::default();
            hop.interface_index = index;
            hop.attributes = vec![RouteAttribute::Gateway(RouteAddress::Inet(
                gateway.parse().unwrap(),
            ))];
            hop
        };
        let mut route = RouteMessage::default();
        route.header.address_family = AddressFamily::Inet;
        route.header.kind = RouteType::Unicast;
        route.attributes = vec![RouteAttribute::MultiPath(vec![
            hop(11, "192.0.2.1"),
            hop(12, "198.51.100.1"),
        ])];
        let mut interfaces = BTreeSet::new();
        default_route_interfaces_of(&wire_bytes(&route), &mut interfaces).unwrap();
        assert_eq!(interfaces, BTreeSet::from([11, 12]));
    }

    #[test]
    fn a_link_tells_its_index_and_whether_it_has_a_controller() {
        let mut port = LinkMessage::default();
        port.header.index = 9;
        port.attributes = vec![
            LinkAttribute::IfName("veth0".into()),
            LinkAttribute::Mtu(1500),
            LinkAttribute::Controller(4),
        ];
        assert_eq!(
            link_facts(&wire_bytes(&port)).unwrap(),
            LinkFacts {
                index: 9,
                has_controller: true
            }
        );
        port.attributes.pop();
        assert!(!link_facts(&wire_bytes(&port)).unwrap().has_controller);
    }

    #[test]
    fn an_address_message_gives_local_and_address() {
        let peer: IpAddr = "10.0.0.2".parse().unwrap();
        let local: IpAddr = "10.0.0.1".parse().unwrap();
        let mut message = AddressMessage::default();
        message.header.family = AddressFamily::Inet;
        message.header.index = 7;
        message.attributes = vec![
            AddressAttribute::Address(peer),
            AddressAttribute::Local(local),
            AddressAttribute::Label("eth0".into()),
        ];
        assert_eq!(
            node_address(&wire_bytes(&message)).unwrap(),
            NodeAddress {
                index: 7,
                local: Some(local),
                address: Some(peer)
            }
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
