//! The few facts about the node's network the plugin needs, read over
//! rtnetlink in the namespace the plugin runs in: the node's interfaces
//! (name, index, up, loopback, bridge or bond port) and its addresses.
//!
//! One [`Rtnl`] socket answers every question of a request: a CNI run asks
//! one link dump and one address dump (both families each), instead of a
//! socket and a dump per question and family.

use std::{
    collections::BTreeSet,
    io,
    net::IpAddr,
    sync::atomic::{AtomicU64, Ordering},
};

use netlink_packet_core::{
    ErrorBuffer, NLM_F_DUMP, NLM_F_REQUEST, NLMSG_DONE, NLMSG_ERROR, NetlinkBuffer, NetlinkHeader,
    NetlinkMessage, NetlinkPayload, NetlinkSerializable, NlasIterator, parse_ip, parse_u32,
};
use netlink_packet_route::{
    RouteNetlinkMessage,
    address::{AddressHeader, AddressMessage},
    link::{LinkAttribute, LinkExtentMask, LinkHeader, LinkMessage},
};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};

/// The answers are read straight from the kernel's bytes, and only the
/// attributes asked for are decoded: decoding whole messages (a link's
/// every setting, every route of every table) was most of the cost of
/// these questions.
mod wire {
    pub const RTM_NEWLINK: u16 = 16;
    pub const RTM_NEWADDR: u16 = 20;
    /// `struct ifinfomsg`, `struct ifaddrmsg`.
    pub const LINK_HEADER_LEN: usize = 16;
    pub const ADDRESS_HEADER_LEN: usize = 8;
    pub const IFLA_IFNAME: u16 = 3;
    pub const IFLA_MASTER: u16 = 10;
    /// Offset of `ifi_flags` in `struct ifinfomsg`.
    pub const LINK_FLAGS_OFFSET: usize = 8;
    pub const IFA_ADDRESS: u16 = 1;
    pub const IFA_LOCAL: u16 = 2;
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

/// What this process read over rtnetlink so far: datagrams, their bytes,
/// and the link and address records in them (every [`Rtnl`] counts into
/// it). A plugin run logs it at debug level, so a cost that grows with the
/// node shows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Account {
    pub reads: u64,
    pub bytes: u64,
    pub link_records: u64,
    pub address_records: u64,
}

impl std::fmt::Display for Account {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "netlink_reads={} netlink_bytes={} link_records={} address_records={}",
            self.reads, self.bytes, self.link_records, self.address_records
        )
    }
}

static READS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);
static LINK_RECORDS: AtomicU64 = AtomicU64::new(0);
static ADDRESS_RECORDS: AtomicU64 = AtomicU64::new(0);

/// The account of this process so far.
pub fn account() -> Account {
    Account {
        reads: READS.load(Ordering::Relaxed),
        bytes: BYTES.load(Ordering::Relaxed),
        link_records: LINK_RECORDS.load(Ordering::Relaxed),
        address_records: ADDRESS_RECORDS.load(Ordering::Relaxed),
    }
}

/// A netlink socket of one protocol, kept for every question one request
/// asks, and the dump-and-answer loop every question shares.
pub struct Netlink {
    socket: Socket,
    sequence: u32,
    buffer: Vec<u8>,
}

/// An rtnetlink socket, kept for every question one request asks.
pub struct Rtnl {
    netlink: Netlink,
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
    /// The controller's index (`IFLA_MASTER`), 0 for none.
    pub controller: u32,
}

/// One interface of the node as a link dump reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    pub index: u32,
    pub name: String,
    /// Administratively up (`IFF_UP`).
    pub up: bool,
    /// `IFF_LOOPBACK`.
    pub loopback: bool,
    /// Enslaved to a bridge, a bond or another controller.
    pub has_controller: bool,
    /// The controller's index, 0 for none.
    pub controller: u32,
}

impl Netlink {
    /// A socket of netlink `protocol` (`NETLINK_ROUTE`, `NETLINK_NETFILTER`, ...).
    pub fn open(protocol: isize) -> Result<Netlink, NetlinkError> {
        let io = |call| move |source| NetlinkError::Io { call, source };
        let mut socket = Socket::new(protocol).map_err(io("socket"))?;
        socket.bind_auto().map_err(io("bind"))?;
        socket
            .connect(&SocketAddr::new(0, 0))
            .map_err(io("connect"))?;
        Ok(Netlink {
            socket,
            sequence: 0,
            buffer: Vec::with_capacity(RECEIVE_BUFFER),
        })
    }

    /// Sends `request` and hands every answer of ours to `each` as
    /// (message type, payload): every message of a dump (`dump`), or the
    /// one answer to a plain request.
    pub fn exchange<T: NetlinkSerializable>(
        &mut self,
        request: T,
        dump: bool,
        mut each: impl FnMut(u16, &[u8]) -> Result<(), NetlinkError>,
    ) -> Result<(), NetlinkError> {
        let io = |call| move |source| NetlinkError::Io { call, source };
        self.sequence += 1;
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | if dump { NLM_F_DUMP } else { 0 };
        header.sequence_number = self.sequence;
        let mut message = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(request));
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
            READS.fetch_add(1, Ordering::Relaxed);
            BYTES.fetch_add(length as u64, Ordering::Relaxed);
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
                            match kind {
                                wire::RTM_NEWLINK => LINK_RECORDS.fetch_add(1, Ordering::Relaxed),
                                wire::RTM_NEWADDR => {
                                    ADDRESS_RECORDS.fetch_add(1, Ordering::Relaxed)
                                }
                                _ => 0,
                            };
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
}

impl Rtnl {
    pub fn open() -> Result<Rtnl, NetlinkError> {
        Ok(Rtnl {
            netlink: Netlink::open(NETLINK_ROUTE)?,
        })
    }

    fn exchange(
        &mut self,
        request: RouteNetlinkMessage,
        dump: bool,
        each: impl FnMut(u16, &[u8]) -> Result<(), NetlinkError>,
    ) -> Result<(), NetlinkError> {
        self.netlink.exchange(request, dump, each)
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

    /// The addresses of the interfaces `indexes`, in a dump per interface
    /// that the kernel filters by `ifa_index` (strict checking,
    /// `NETLINK_GET_STRICT_CHK`, Linux 4.20 and later): what a run reads
    /// then grows with the interfaces it asks about, not with the pods'
    /// veths, each of which has an IPv6 link-local address. An interface
    /// gone meanwhile has none. `None` when the kernel cannot filter (no
    /// strict checking, or it refuses the request): the caller then takes
    /// the full dump ([`Rtnl::addresses`]).
    pub fn addresses_of(
        &mut self,
        indexes: &BTreeSet<u32>,
    ) -> Result<Option<Vec<NodeAddress>>, NetlinkError> {
        if self
            .netlink
            .socket
            .set_netlink_get_strict_chk(true)
            .is_err()
        {
            return Ok(None);
        }
        let outcome = self.filtered_addresses(indexes);
        // Link requests stay as they always were.
        let _ = self.netlink.socket.set_netlink_get_strict_chk(false);
        match outcome {
            Ok(found) => Ok(Some(found)),
            Err(NetlinkError::Kernel { .. }) => Ok(None),
            Err(error) => Err(error),
        }
    }

    fn filtered_addresses(
        &mut self,
        indexes: &BTreeSet<u32>,
    ) -> Result<Vec<NodeAddress>, NetlinkError> {
        let mut found = Vec::new();
        for &index in indexes {
            let mut request = AddressMessage::default();
            request.header.index = index;
            let outcome = self.exchange(
                RouteNetlinkMessage::GetAddress(request),
                true,
                |kind, payload| {
                    if kind == wire::RTM_NEWADDR {
                        let address = node_address(payload)?;
                        // A kernel that ignored the filter answered with
                        // every address: keep the asked ones only.
                        if address.index == index {
                            found.push(address);
                        }
                    }
                    Ok(())
                },
            );
            match outcome {
                Ok(()) => {}
                // Gone since the link dump: it has no address.
                Err(NetlinkError::Kernel { code }) if code == -libc::ENODEV => {}
                Err(error) => return Err(error),
            }
        }
        Ok(found)
    }

    /// Every interface of the node, in one dump (statistics left out: they
    /// are most of a link message).
    pub fn links(&mut self) -> Result<Vec<Link>, NetlinkError> {
        let mut request = LinkMessage::default();
        request.attributes = vec![LinkAttribute::ExtMask(vec![LinkExtentMask::SkipStats])];
        self.link_dump(request)
    }

    /// The interfaces without a controller (no bridge or bond port): where
    /// the uplinks are, in a dump the kernel filters (`IFLA_MASTER` -1, "no
    /// controller"), so the veths of a bridge's pods never cross the
    /// socket. `None` when the kernel does not know that filter: it then
    /// filters out every interface, and loopback, which always exists and
    /// has no controller, is missing from the answer (a kernel refusing
    /// the request is taken the same way).
    ///
    /// The request carries no `IFLA_EXT_MASK`: with one, the kernel sizes
    /// every interface of the node before the dump starts (`rtnl_calcit`:
    /// 15% of an ADD's and a DEL's CPU on a node of 1 000 bridge pods,
    /// under `perf`, nothing with 3); without it, it starts from a
    /// page-sized buffer, and the few interfaces the filter lets through
    /// come with their statistics.
    pub fn links_without_controller(&mut self) -> Result<Option<Vec<Link>>, NetlinkError> {
        match self.link_dump(uplink_candidates_request()) {
            Ok(found) => Ok(found.iter().any(|l| l.loopback).then_some(found)),
            Err(NetlinkError::Kernel { .. }) => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// Interface `name` as a dump would report it; `None` if there is no
    /// such interface. One request, whatever the node has.
    pub fn link_named(&mut self, name: &str) -> Result<Option<Link>, NetlinkError> {
        self.get_link(name, link)
    }

    fn link_dump(&mut self, request: LinkMessage) -> Result<Vec<Link>, NetlinkError> {
        let mut found = Vec::new();
        self.exchange(
            RouteNetlinkMessage::GetLink(request),
            true,
            |kind, payload| {
                if kind == wire::RTM_NEWLINK {
                    found.push(link(payload)?);
                }
                Ok(())
            },
        )?;
        Ok(found)
    }

    /// Index of interface `name` and whether it is a bridge port; `None`
    /// if there is no such interface.
    pub fn link(&mut self, name: &str) -> Result<Option<LinkFacts>, NetlinkError> {
        self.get_link(name, link_facts)
    }

    /// Interface `index` as a dump would report it; `None` if there is no
    /// such interface. One request, whatever the node has.
    pub fn link_at(&mut self, index: u32) -> Result<Option<Link>, NetlinkError> {
        let mut request = LinkMessage::default();
        request.header.index = index;
        self.get_link_by(request, link)
    }

    /// Interface `name`, read by `parse` from the kernel's one answer;
    /// `None` if there is no such interface.
    fn get_link<T>(
        &mut self,
        name: &str,
        parse: fn(&[u8]) -> Result<T, NetlinkError>,
    ) -> Result<Option<T>, NetlinkError> {
        let mut request = LinkMessage::default();
        request.attributes = vec![LinkAttribute::IfName(name.to_owned())];
        self.get_link_by(request, parse)
    }

    /// The interface `request` names (by index or by name), read by `parse`
    /// from the kernel's one answer; `None` if there is no such interface.
    fn get_link_by<T>(
        &mut self,
        mut request: LinkMessage,
        parse: fn(&[u8]) -> Result<T, NetlinkError>,
    ) -> Result<Option<T>, NetlinkError> {
        // The counters are most of a link message, and none of our business.
        request
            .attributes
            .push(LinkAttribute::ExtMask(vec![LinkExtentMask::SkipStats]));
        let mut found = None;
        let outcome = self.exchange(
            RouteNetlinkMessage::GetLink(request),
            false,
            |kind, payload| {
                if kind == wire::RTM_NEWLINK {
                    found = Some(parse(payload)?);
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

/// The dump request of [`Rtnl::links_without_controller`]: only the
/// interfaces without a controller (`IFLA_MASTER` -1), and no extension
/// mask (see there).
fn uplink_candidates_request() -> LinkMessage {
    let mut request = LinkMessage::default();
    request.attributes = vec![LinkAttribute::Controller(u32::MAX)];
    request
}

/// The attributes of a message, after its fixed header of `header_len` bytes.
fn attributes(
    payload: &[u8],
    header_len: usize,
) -> Result<impl Iterator<Item = netlink_packet_core::NlaBuffer<&[u8]>>, NetlinkError> {
    let rest = payload.get(header_len..).ok_or(NetlinkError::Decode)?;
    Ok(NlasIterator::new(rest).map_while(Result::ok))
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
    let mut controller = 0;
    for nla in attributes(payload, wire::LINK_HEADER_LEN)? {
        if nla.kind() == wire::IFLA_MASTER {
            controller = parse_u32(nla.value()).map_err(|_| NetlinkError::Decode)?;
        }
    }
    Ok(LinkFacts {
        index: header.index,
        has_controller: controller != 0,
        controller,
    })
}

/// Name, index, flags and controller of `payload`, an `RTM_NEWLINK`.
fn link(payload: &[u8]) -> Result<Link, NetlinkError> {
    let facts = link_facts(payload)?;
    let flags = payload
        .get(wire::LINK_FLAGS_OFFSET..wire::LINK_FLAGS_OFFSET + 4)
        .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
        .ok_or(NetlinkError::Decode)?;
    let mut name = String::new();
    for nla in attributes(payload, wire::LINK_HEADER_LEN)? {
        if nla.kind() == wire::IFLA_IFNAME {
            let value = nla.value();
            let end = value.iter().position(|&b| b == 0).unwrap_or(value.len());
            name = String::from_utf8_lossy(&value[..end]).into_owned();
        }
    }
    Ok(Link {
        index: facts.index,
        name,
        up: flags & libc::IFF_UP as u32 != 0,
        loopback: flags & libc::IFF_LOOPBACK as u32 != 0,
        has_controller: facts.has_controller,
        controller: facts.controller,
    })
}

/// The interfaces where traffic to the node can arrive from outside, and
/// the `interfaces` entries that matched nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selection {
    pub uplinks: BTreeSet<u32>,
    pub unmatched: Vec<String>,
}

/// Chooses the uplinks among `links`. By default every interface that is
/// up, not loopback and not a port of a bridge or bond (its controller's
/// own hooks see the traffic, and running the programs twice per packet only
/// costs), whether or not it carries a default route: uplinks, bonds, VLANs,
/// second NICs, tunnels. With `patterns` (the `interfaces` key: names or
/// shell-style patterns), every interface whose name matches one of them,
/// in whatever state, ports included: the operator asked for it by name.
/// Container-facing interfaces are not told apart here: they carry the
/// programs too (the hairpin), and are added from prevResult in any case.
pub fn select_uplinks(links: &[Link], patterns: Option<&[String]>) -> Selection {
    let Some(patterns) = patterns else {
        return Selection {
            uplinks: links
                .iter()
                .filter(|l| l.up && !l.loopback && !l.has_controller)
                .map(|l| l.index)
                .collect(),
            unmatched: Vec::new(),
        };
    };
    let mut selection = Selection::default();
    for text in patterns {
        let matches = name_matcher(text);
        let mut any = false;
        for link in links.iter().filter(|l| matches(&l.name)) {
            any = true;
            selection.uplinks.insert(link.index);
        }
        if !any {
            selection.unmatched.push(text.clone());
        }
    }
    selection
}

/// Whether interface `name` matches one of `patterns` (names or shell-style
/// patterns, validated when the configuration was parsed; a literal
/// otherwise).
pub fn name_matches(patterns: &[String], name: &str) -> bool {
    patterns.iter().any(|text| name_matcher(text)(name))
}

/// Whether a name matches `text`, an interface name or shell-style
/// pattern (validated when the configuration was parsed; a literal
/// otherwise).
fn name_matcher(text: &str) -> impl Fn(&str) -> bool + '_ {
    let pattern = glob::Pattern::new(text).ok();
    move |name| match &pattern {
        Some(pattern) => pattern.matches(name),
        None => name == text,
    }
}

/// The names of the node's interfaces but loopback, sorted: what an
/// operator may name in `interfaces`, shown when an entry matches nothing.
pub fn interface_names(links: &[Link]) -> Vec<String> {
    let mut names: Vec<String> = links
        .iter()
        .filter(|l| !l.loopback)
        .map(|l| l.name.clone())
        .collect();
    names.sort();
    names
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
    use netlink_packet_route::{AddressFamily, address::AddressAttribute};

    use super::*;

    /// The bytes the kernel would send for `message` (its payload).
    fn wire_bytes(message: &impl Emitable) -> Vec<u8> {
        let mut bytes = vec![0; message.buffer_len()];
        message.emit(&mut bytes);
        bytes
    }

    #[test]
    fn the_dump_of_uplink_candidates_asks_the_kernel_to_size_no_interface() {
        // An `IFLA_EXT_MASK` makes the kernel size every interface of the
        // node before it dumps the few the filter lets through (issue 36).
        let request = uplink_candidates_request();
        assert!(
            !request
                .attributes
                .iter()
                .any(|a| matches!(a, LinkAttribute::ExtMask(_))),
            "{request:?}"
        );
        assert!(
            request
                .attributes
                .contains(&LinkAttribute::Controller(u32::MAX))
        );
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
                has_controller: true,
                controller: 4,
            }
        );
        port.attributes.pop();
        assert!(!link_facts(&wire_bytes(&port)).unwrap().has_controller);
    }

    #[test]
    fn a_dumped_link_tells_name_flags_and_controller() {
        use netlink_packet_route::link::LinkFlags;
        let mut message = LinkMessage::default();
        message.header.index = 3;
        message.header.flags = LinkFlags::Up | LinkFlags::Running;
        message.attributes = vec![
            LinkAttribute::IfName("bond0.100".into()),
            LinkAttribute::Controller(2),
        ];
        assert_eq!(
            link(&wire_bytes(&message)).unwrap(),
            Link {
                index: 3,
                name: "bond0.100".into(),
                up: true,
                loopback: false,
                has_controller: true,
                controller: 2,
            }
        );
        message.header.flags = LinkFlags::Loopback;
        message.attributes = vec![LinkAttribute::IfName("lo".into())];
        let lo = link(&wire_bytes(&message)).unwrap();
        assert!(lo.loopback && !lo.up && !lo.has_controller, "{lo:?}");
    }

    fn test_link(index: u32, name: &str, up: bool) -> Link {
        Link {
            index,
            name: name.into(),
            up,
            loopback: name == "lo",
            has_controller: name.starts_with("veth"),
            controller: if name.starts_with("veth") { 4 } else { 0 },
        }
    }

    fn node_links() -> Vec<Link> {
        vec![
            test_link(1, "lo", true),
            test_link(2, "eth0", true),
            test_link(3, "eth1", true),
            test_link(4, "bond0", true),
            test_link(5, "bond0.100", true),
            test_link(6, "eth2", false),
            test_link(7, "cni0", true),
            test_link(8, "veth1234", true),
            test_link(9, "wg0", true),
        ]
    }

    #[test]
    fn by_default_every_up_interface_but_loopback_and_ports() {
        let selection = select_uplinks(&node_links(), None);
        assert_eq!(selection.uplinks, BTreeSet::from([2, 3, 4, 5, 7, 9]));
        assert!(selection.unmatched.is_empty());
    }

    #[test]
    fn patterns_narrow_and_unmatched_ones_are_reported() {
        let patterns: Vec<String> = ["eth*", "bond0.*", "ens5", "veth1234", "team[0-9]"]
            .map(String::from)
            .into();
        let selection = select_uplinks(&node_links(), Some(&patterns));
        assert_eq!(
            selection.uplinks,
            BTreeSet::from([2, 3, 5, 6, 8]),
            "matches by name whatever the state, a port named explicitly included"
        );
        assert_eq!(selection.unmatched, ["ens5", "team[0-9]"]);
        let none: Vec<String> = vec!["nic*".into()];
        let selection = select_uplinks(&node_links(), Some(&none));
        assert!(selection.uplinks.is_empty());
        assert_eq!(selection.unmatched, ["nic*"]);
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
