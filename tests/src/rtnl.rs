//! The `ip` commands the harness runs most, done in the process over
//! rtnetlink instead of by starting `ip`.
//!
//! A world is built from a few dozen `ip` runs (namespaces, veths,
//! addresses, routes). Under the VM tests' emulation each run of `ip`
//! costs about 37 ms (measured in the 6.12 guest: most of it the dynamic
//! loader, `/bin/true` takes 4 ms), a thread entering a namespace 0.5 ms;
//! the guests made some two thousand of them per kernel. [`NsHandle::ip`]
//! hands the forms below to [`run`]; any other form, and every form when
//! the arguments do not parse exactly, goes to `ip` as before.
//!
//! | form | request |
//! | --- | --- |
//! | `link set DEV up` / `down` | `RTM_NEWLINK`, `IFF_UP` in the change mask |
//! | `[-6] addr add CIDR dev DEV [nodad]` | `RTM_NEWADDR`, `IFA_LOCAL` and `IFA_ADDRESS` |
//! | `[-6] route add default\|CIDR via GW [dev DEV]` | `RTM_NEWROUTE`, table main, proto boot |
//! | `link add NAME type veth peer name PEER [netns NS]` | `RTM_NEWLINK` with the peer's `IFLA_NET_NS_FD` |
//!
//! Each is what iproute2 sends for that form (its `ipaddr_modify`,
//! `iproute_modify`, `iplink_modify`), with `NLM_F_ACK`, and the kernel's
//! answer is the result: an error is the errno `ip` would print.
//!
//! [`NsHandle::ip`]: crate::netns::NsHandle::ip

use std::fs::File;
use std::io;
use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::path::Path;

use netlink_packet_core::{
    ErrorBuffer, NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST, NLMSG_ERROR, NetlinkBuffer,
    NetlinkHeader, NetlinkMessage, NetlinkPayload,
};
use netlink_packet_route::address::{
    AddressAttribute, AddressHeaderFlags, AddressMessage, AddressScope,
};
use netlink_packet_route::link::{
    InfoData, InfoKind, InfoVeth, LinkAttribute, LinkFlags, LinkInfo, LinkMessage,
};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteProtocol, RouteScope, RouteType,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};

use crate::naming::NETNS_RUN_DIR;

/// One `ip` command the harness runs in the process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    LinkUp {
        dev: String,
        up: bool,
    },
    AddAddress {
        dev: String,
        address: IpAddr,
        prefix: u8,
        nodad: bool,
    },
    AddRoute {
        destination: Option<(IpAddr, u8)>,
        gateway: IpAddr,
        dev: Option<String>,
    },
    AddVeth {
        name: String,
        peer: String,
        peer_netns: Option<String>,
    },
}

impl Request {
    /// The request `ip args` makes, or `None` for a form this module does
    /// not take (left to `ip`).
    pub fn parse(args: &[&str]) -> Option<Request> {
        let (six, args) = match args.split_first() {
            Some((&"-6", rest)) => (true, rest),
            _ => (false, args),
        };
        let family_fits = |address: &IpAddr| !six || address.is_ipv6();
        match args {
            ["link", "set", dev, state @ ("up" | "down")] if !six => Some(Request::LinkUp {
                dev: (*dev).to_owned(),
                up: *state == "up",
            }),
            ["addr", "add", cidr, "dev", dev, rest @ ..] => {
                let nodad = match rest {
                    [] => false,
                    ["nodad"] => true,
                    _ => return None,
                };
                let (address, prefix) = cidr_of(cidr)?;
                family_fits(&address).then(|| Request::AddAddress {
                    dev: (*dev).to_owned(),
                    address,
                    prefix,
                    nodad,
                })
            }
            ["route", "add", destination, "via", gateway, rest @ ..] => {
                let dev = match rest {
                    [] => None,
                    ["dev", dev] => Some((*dev).to_owned()),
                    _ => return None,
                };
                let gateway: IpAddr = gateway.parse().ok()?;
                let destination = match *destination {
                    "default" => None,
                    cidr => {
                        let (address, prefix) = cidr_of(cidr)?;
                        if address.is_ipv4() != gateway.is_ipv4() {
                            return None;
                        }
                        Some((address, prefix))
                    }
                };
                family_fits(&gateway).then_some(Request::AddRoute {
                    destination,
                    gateway,
                    dev,
                })
            }
            [
                "link",
                "add",
                name,
                "type",
                "veth",
                "peer",
                "name",
                peer,
                rest @ ..,
            ] if !six => {
                let peer_netns = match rest {
                    [] => None,
                    ["netns", netns] => Some((*netns).to_owned()),
                    _ => return None,
                };
                Some(Request::AddVeth {
                    name: (*name).to_owned(),
                    peer: (*peer).to_owned(),
                    peer_netns,
                })
            }
            _ => None,
        }
    }

    /// Sends the request from the calling thread's network namespace.
    pub fn send(&self) -> io::Result<()> {
        let mut socket = Socket::new(NETLINK_ROUTE)?;
        socket.bind_auto()?;
        socket.connect(&SocketAddr::new(0, 0))?;
        match self {
            Request::LinkUp { dev, up } => {
                let mut message = LinkMessage::default();
                message.header.index = index_of(dev)?;
                message.header.flags = if *up {
                    LinkFlags::Up
                } else {
                    LinkFlags::empty()
                };
                message.header.change_mask = LinkFlags::Up;
                exchange(&socket, RouteNetlinkMessage::NewLink(message), 0)
            }
            Request::AddAddress {
                dev,
                address,
                prefix,
                nodad,
            } => {
                let mut message = AddressMessage::default();
                message.header.family = family(address);
                message.header.prefix_len = *prefix;
                message.header.scope = AddressScope::Universe;
                message.header.index = index_of(dev)?;
                if *nodad {
                    message.header.flags = AddressHeaderFlags::Nodad;
                }
                message.attributes = vec![
                    AddressAttribute::Local(*address),
                    AddressAttribute::Address(*address),
                ];
                exchange(
                    &socket,
                    RouteNetlinkMessage::NewAddress(message),
                    NLM_F_CREATE | NLM_F_EXCL,
                )
            }
            Request::AddRoute {
                destination,
                gateway,
                dev,
            } => {
                let mut message = RouteMessage::default();
                message.header.address_family = family(gateway);
                message.header.table = RouteHeader::RT_TABLE_MAIN;
                message.header.protocol = RouteProtocol::Boot;
                message.header.scope = RouteScope::Universe;
                message.header.kind = RouteType::Unicast;
                if let Some((address, prefix)) = destination {
                    message.header.destination_prefix_length = *prefix;
                    message
                        .attributes
                        .push(RouteAttribute::Destination(route_address(address)));
                }
                message
                    .attributes
                    .push(RouteAttribute::Gateway(route_address(gateway)));
                if let Some(dev) = dev {
                    message.attributes.push(RouteAttribute::Oif(index_of(dev)?));
                }
                exchange(
                    &socket,
                    RouteNetlinkMessage::NewRoute(message),
                    NLM_F_CREATE | NLM_F_EXCL,
                )
            }
            Request::AddVeth {
                name,
                peer,
                peer_netns,
            } => {
                // Open while the request is sent: the kernel takes the peer's
                // namespace from this descriptor.
                let netns = peer_netns
                    .as_deref()
                    .map(|netns| File::open(Path::new(NETNS_RUN_DIR).join(netns)))
                    .transpose()?;
                let mut peer_message = LinkMessage::default();
                peer_message
                    .attributes
                    .push(LinkAttribute::IfName(peer.clone()));
                if let Some(netns) = &netns {
                    peer_message
                        .attributes
                        .push(LinkAttribute::NetNsFd(netns.as_raw_fd()));
                }
                let mut message = LinkMessage::default();
                message.attributes = vec![
                    LinkAttribute::IfName(name.clone()),
                    LinkAttribute::LinkInfo(vec![
                        LinkInfo::Kind(InfoKind::Veth),
                        LinkInfo::Data(InfoData::Veth(InfoVeth::Peer(peer_message))),
                    ]),
                ];
                exchange(
                    &socket,
                    RouteNetlinkMessage::NewLink(message),
                    NLM_F_CREATE | NLM_F_EXCL,
                )
            }
        }
    }
}

/// `ip args...` in the calling thread's network namespace, which `place`
/// names in a failure: over rtnetlink for the forms [`Request`] takes
/// (they print nothing), else by running `ip` (a child started from this
/// thread is in its namespace). Returns what `ip` printed.
///
/// # Panics
/// If the request fails or `ip` exits non-zero, naming the command, the
/// place and, for `ip`, what it printed.
pub fn ip_here(args: &[&str], place: &str) -> String {
    let shown = args.join(" ");
    if let Some(request) = Request::parse(args) {
        request.send().unwrap_or_else(|e| {
            panic!("ip {shown} {place} (over rtnetlink, in the process) failed: {e}")
        });
        return String::new();
    }
    let out = std::process::Command::new("ip")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("could not run ip {shown} {place}: {e}"));
    assert!(
        out.status.success(),
        "ip {shown} {place} failed ({}):\nstderr: {}\nstdout: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim(),
        String::from_utf8_lossy(&out.stdout).trim()
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `198.18.0.1/24`, `fd18::1/64`; a bare address is a host route's /32 or
/// /128, as `ip` takes it.
fn cidr_of(text: &str) -> Option<(IpAddr, u8)> {
    let (address, prefix) = match text.split_once('/') {
        Some((address, prefix)) => (address.parse::<IpAddr>().ok()?, prefix.parse().ok()?),
        None => {
            let address: IpAddr = text.parse().ok()?;
            let full = if address.is_ipv4() { 32 } else { 128 };
            (address, full)
        }
    };
    let limit = if address.is_ipv4() { 32 } else { 128 };
    (prefix <= limit).then_some((address, prefix))
}

fn family(address: &IpAddr) -> AddressFamily {
    if address.is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    }
}

fn route_address(address: &IpAddr) -> RouteAddress {
    match address {
        IpAddr::V4(v4) => RouteAddress::Inet(*v4),
        IpAddr::V6(v6) => RouteAddress::Inet6(*v6),
    }
}

/// The index of `dev` in the calling thread's namespace (`ENODEV` when
/// there is none, as `ip` reports it: "Cannot find device").
fn index_of(dev: &str) -> io::Result<u32> {
    let name = std::ffi::CString::new(dev)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL in a device name"))?;
    // SAFETY: `name` is a NUL-terminated string that outlives the call.
    match unsafe { libc::if_nametoindex(name.as_ptr()) } {
        0 => Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("Cannot find device \"{dev}\""),
        )),
        index => Ok(index),
    }
}

/// Sends `request` with `NLM_F_REQUEST | NLM_F_ACK | flags` and waits for
/// the kernel's acknowledgement of it.
fn exchange(socket: &Socket, request: RouteNetlinkMessage, flags: u16) -> io::Result<()> {
    const SEQUENCE: u32 = 1;
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | NLM_F_ACK | flags;
    header.sequence_number = SEQUENCE;
    let mut message = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(request));
    message.finalize();
    let mut bytes = vec![0; message.buffer_len()];
    message.serialize(&mut bytes);
    socket.send(&bytes, 0)?;
    let mut buffer = Vec::with_capacity(8192);
    loop {
        buffer.clear();
        socket.recv(&mut buffer, 0)?;
        let mut offset = 0;
        while offset < buffer.len() {
            let answer = NetlinkBuffer::new_checked(&buffer[offset..])
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
            if answer.sequence_number() == SEQUENCE && answer.message_type() == NLMSG_ERROR {
                let error = ErrorBuffer::new_checked(answer.payload())
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
                return match error.code() {
                    Some(code) => Err(io::Error::from_raw_os_error(-code.get())),
                    None => Ok(()),
                };
            }
            offset += (answer.length() as usize).div_ceil(4).max(1) * 4;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_forms_the_harness_runs_parse_and_others_are_left_to_ip() {
        assert_eq!(
            Request::parse(&["link", "set", "eth0", "up"]),
            Some(Request::LinkUp {
                dev: "eth0".into(),
                up: true
            })
        );
        assert_eq!(
            Request::parse(&["-6", "addr", "add", "fd18::1/64", "dev", "node0", "nodad"]),
            Some(Request::AddAddress {
                dev: "node0".into(),
                address: "fd18::1".parse().unwrap(),
                prefix: 64,
                nodad: true
            })
        );
        assert_eq!(
            Request::parse(&[
                "route",
                "add",
                "198.19.0.0/24",
                "via",
                "198.18.0.2",
                "dev",
                "n0"
            ]),
            Some(Request::AddRoute {
                destination: Some(("198.19.0.0".parse().unwrap(), 24)),
                gateway: "198.18.0.2".parse().unwrap(),
                dev: Some("n0".into())
            })
        );
        assert_eq!(
            Request::parse(&["-6", "route", "add", "default", "via", "fd18::1"]),
            Some(Request::AddRoute {
                destination: None,
                gateway: "fd18::1".parse().unwrap(),
                dev: None
            })
        );
        assert_eq!(
            Request::parse(&[
                "link", "add", "eth1", "type", "veth", "peer", "name", "eth0", "netns", "x"
            ]),
            Some(Request::AddVeth {
                name: "eth1".into(),
                peer: "eth0".into(),
                peer_netns: Some("x".into())
            })
        );
        for left in [
            &["link", "set", "eth0", "master", "br0"][..],
            &["-o", "link", "show", "dev", "eth0"],
            &["addr", "add", "10.0.0.1/24", "dev", "eth0", "noprefixroute"],
            &["-6", "addr", "add", "10.0.0.1/24", "dev", "eth0"],
            &["route", "add", "10.0.0.0/8", "via", "fd00::1"],
            &["route", "add", "10.0.0.0/33", "via", "10.0.0.1"],
            &["route", "add", "default", "dev", "eth0"],
            &["link", "add", "d0", "type", "dummy"],
        ] {
            assert_eq!(Request::parse(left), None, "{left:?}");
        }
    }
}
