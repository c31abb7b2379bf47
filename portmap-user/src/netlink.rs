//! The few facts about the node's network the plugin needs, read over
//! rtnetlink in the namespace the plugin runs in: which interfaces carry the
//! default routes, and which interface holds a given address.

use std::{collections::BTreeSet, io, net::IpAddr};

use netlink_packet_core::{
    NLM_F_DUMP, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload,
};
use netlink_packet_route::{
    AddressFamily, RouteNetlinkMessage,
    address::{AddressAttribute, AddressMessage},
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
}

fn dump(request: RouteNetlinkMessage) -> Result<Vec<RouteNetlinkMessage>, NetlinkError> {
    let io = |call| move |source| NetlinkError::Io { call, source };
    let mut socket = Socket::new(NETLINK_ROUTE).map_err(io("socket"))?;
    socket.bind_auto().map_err(io("bind"))?;
    socket
        .connect(&SocketAddr::new(0, 0))
        .map_err(io("connect"))?;
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    header.sequence_number = 1;
    let mut message = NetlinkMessage::new(header, NetlinkPayload::from(request));
    message.finalize();
    let mut buffer = vec![0; message.buffer_len()];
    message.serialize(&mut buffer);
    socket.send(&buffer, 0).map_err(io("send"))?;

    let mut answers = Vec::new();
    loop {
        let (data, _) = socket.recv_from_full().map_err(io("recv"))?;
        let mut offset = 0;
        while offset < data.len() {
            let message = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&data[offset..])
                .map_err(|_| NetlinkError::Decode)?;
            let length = message.header.length as usize;
            match message.payload {
                NetlinkPayload::Done(_) => return Ok(answers),
                NetlinkPayload::Error(error) => {
                    return Err(NetlinkError::Kernel {
                        code: error.code.map_or(0, |code| code.get()),
                    });
                }
                NetlinkPayload::InnerMessage(inner) => answers.push(inner),
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
pub fn default_route_interfaces() -> Result<BTreeSet<u32>, NetlinkError> {
    let mut interfaces = BTreeSet::new();
    for family in [AddressFamily::Inet, AddressFamily::Inet6] {
        let mut request = RouteMessage::default();
        request.header.address_family = family;
        for answer in dump(RouteNetlinkMessage::GetRoute(request))? {
            let RouteNetlinkMessage::NewRoute(route) = answer else {
                continue;
            };
            if route.header.destination_prefix_length != 0
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
    }
    Ok(interfaces)
}

/// Index of the interface that holds `address`, if any does.
pub fn interface_with_address(address: IpAddr) -> Result<Option<u32>, NetlinkError> {
    let mut request = AddressMessage::default();
    request.header.family = match address {
        IpAddr::V4(_) => AddressFamily::Inet,
        IpAddr::V6(_) => AddressFamily::Inet6,
    };
    for answer in dump(RouteNetlinkMessage::GetAddress(request))? {
        let RouteNetlinkMessage::NewAddress(message) = answer else {
            continue;
        };
        let holds = message.attributes.iter().any(|attribute| {
            matches!(attribute, AddressAttribute::Address(a) | AddressAttribute::Local(a) if *a == address)
        });
        if holds {
            return Ok(Some(message.header.index));
        }
    }
    Ok(None)
}

/// Every address of the node with the index of the interface holding it.
pub fn addresses() -> Result<Vec<(u32, IpAddr)>, NetlinkError> {
    let mut found = Vec::new();
    for family in [AddressFamily::Inet, AddressFamily::Inet6] {
        let mut request = AddressMessage::default();
        request.header.family = family;
        for answer in dump(RouteNetlinkMessage::GetAddress(request))? {
            let RouteNetlinkMessage::NewAddress(message) = answer else {
                continue;
            };
            // IPv4 reports the local address as Local (Address is the peer
            // on point-to-point links); IPv6 only has Address.
            let local = message.attributes.iter().find_map(|a| match a {
                AddressAttribute::Local(ip) => Some(*ip),
                _ => None,
            });
            let address = local.or_else(|| {
                message.attributes.iter().find_map(|a| match a {
                    AddressAttribute::Address(ip) => Some(*ip),
                    _ => None,
                })
            });
            if let Some(address) = address {
                found.push((message.header.index, address));
            }
        }
    }
    Ok(found)
}

/// Indexes of interfaces enslaved to a bridge (or another controller):
/// traffic through them also crosses the controller's own hooks.
pub fn controlled_interfaces() -> Result<BTreeSet<u32>, NetlinkError> {
    use netlink_packet_route::link::{LinkAttribute, LinkMessage};
    let mut ports = BTreeSet::new();
    for answer in dump(RouteNetlinkMessage::GetLink(LinkMessage::default()))? {
        let RouteNetlinkMessage::NewLink(link) = answer else {
            continue;
        };
        if link
            .attributes
            .iter()
            .any(|a| matches!(a, LinkAttribute::Controller(index) if *index != 0))
        {
            ports.insert(link.header.index);
        }
    }
    Ok(ports)
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
