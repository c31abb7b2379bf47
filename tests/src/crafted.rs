//! Crafted packets put straight onto a link, as a neighbour on the node's
//! L2 segment can: raw Ethernet frames through an `AF_PACKET` socket, with
//! any addresses at all (a loopback destination, a loopback source) that no
//! socket of a well-behaved stack would send. And the receiving side's
//! count of what its transport layer took in, read from the kernel's MIB
//! counters of a network namespace: what reached a container, whatever
//! answered or not.

use std::net::IpAddr;

use crate::NetNs;

const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86dd;
const PROTO_TCP: u8 = 6;
const PROTO_UDP: u8 = 17;
const TCP_SYN: u8 = 0x02;

/// The transport protocol of a crafted packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// A TCP SYN (no options, window 64240).
    TcpSyn,
    /// The same SYN cut short after its flags byte (14 bytes): its ports
    /// and flags can be read, but it has no checksum field, so no rewrite
    /// of it can succeed.
    TcpSynCut,
    /// A UDP datagram with a short payload.
    Udp,
}

/// What a crafted UDP datagram carries (a [`flood`]'s among them).
pub const UDP_PAYLOAD: &[u8] = b"crafted";

/// One crafted IP packet: `src:sport -> dst:dport`. Both addresses are of
/// one family.
#[derive(Debug, Clone, Copy)]
pub struct Crafted {
    pub transport: Transport,
    pub src: IpAddr,
    pub dst: IpAddr,
    pub sport: u16,
    pub dport: u16,
}

impl Crafted {
    /// The IP packet (header, transport header, payload) with every
    /// checksum right, so the receiver takes it in on its merits.
    ///
    /// # Panics
    /// If the two addresses are of different families.
    pub fn ip_packet(&self) -> Vec<u8> {
        let transport = self.transport_segment();
        let proto = match self.transport {
            Transport::TcpSyn | Transport::TcpSynCut => PROTO_TCP,
            Transport::Udp => PROTO_UDP,
        };
        let mut packet = Vec::with_capacity(40 + transport.len());
        match (self.src, self.dst) {
            (IpAddr::V4(src), IpAddr::V4(dst)) => {
                let total = (20 + transport.len()) as u16;
                packet.extend_from_slice(&[0x45, 0]);
                packet.extend_from_slice(&total.to_be_bytes());
                // Identification, don't fragment, TTL 64.
                packet.extend_from_slice(&[0x12, 0x34, 0x40, 0, 64, proto, 0, 0]);
                packet.extend_from_slice(&src.octets());
                packet.extend_from_slice(&dst.octets());
                let sum = checksum(&[&packet]);
                packet[10..12].copy_from_slice(&sum.to_be_bytes());
            }
            (IpAddr::V6(src), IpAddr::V6(dst)) => {
                packet.extend_from_slice(&[0x60, 0, 0, 0]);
                packet.extend_from_slice(&(transport.len() as u16).to_be_bytes());
                packet.extend_from_slice(&[proto, 64]);
                packet.extend_from_slice(&src.octets());
                packet.extend_from_slice(&dst.octets());
            }
            _ => panic!("crafted packet {self:?} mixes address families"),
        }
        packet.extend_from_slice(&transport);
        packet
    }

    fn transport_segment(&self) -> Vec<u8> {
        let mut segment = Vec::new();
        segment.extend_from_slice(&self.sport.to_be_bytes());
        segment.extend_from_slice(&self.dport.to_be_bytes());
        let (proto, checksum_at) = match self.transport {
            Transport::TcpSyn | Transport::TcpSynCut => {
                // Sequence number, no acknowledgment, data offset 5 words,
                // SYN, window, checksum (below), no urgent pointer.
                segment.extend_from_slice(&0x5eed_0001u32.to_be_bytes());
                segment.extend_from_slice(&0u32.to_be_bytes());
                segment.extend_from_slice(&[0x50, TCP_SYN]);
                segment.extend_from_slice(&64240u16.to_be_bytes());
                segment.extend_from_slice(&[0, 0, 0, 0]);
                (PROTO_TCP, 16)
            }
            Transport::Udp => {
                let payload = UDP_PAYLOAD;
                segment.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
                segment.extend_from_slice(&[0, 0]);
                segment.extend_from_slice(payload);
                (PROTO_UDP, 6)
            }
        };
        if self.transport == Transport::TcpSynCut {
            segment.truncate(14);
            return segment;
        }
        let mut pseudo = Vec::new();
        match (self.src, self.dst) {
            (IpAddr::V4(src), IpAddr::V4(dst)) => {
                pseudo.extend_from_slice(&src.octets());
                pseudo.extend_from_slice(&dst.octets());
                pseudo.extend_from_slice(&[0, proto]);
                pseudo.extend_from_slice(&(segment.len() as u16).to_be_bytes());
            }
            (IpAddr::V6(src), IpAddr::V6(dst)) => {
                pseudo.extend_from_slice(&src.octets());
                pseudo.extend_from_slice(&dst.octets());
                pseudo.extend_from_slice(&(segment.len() as u32).to_be_bytes());
                pseudo.extend_from_slice(&[0, 0, 0, proto]);
            }
            _ => panic!("crafted packet {self:?} mixes address families"),
        }
        let mut sum = checksum(&[&pseudo, &segment]);
        // UDP sends a computed 0 as all ones (0 means "no checksum").
        if proto == PROTO_UDP && sum == 0 {
            sum = 0xffff;
        }
        segment[checksum_at..checksum_at + 2].copy_from_slice(&sum.to_be_bytes());
        segment
    }
}

/// The Internet checksum (RFC 1071) over the parts, as one byte string.
pub fn checksum(parts: &[&[u8]]) -> u16 {
    let bytes: Vec<u8> = parts.iter().flat_map(|p| p.iter().copied()).collect();
    let mut sum: u32 = bytes
        .chunks(2)
        .map(|pair| u32::from(u16::from_be_bytes([pair[0], *pair.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// The MAC address of `ifname` in `ns`, as `ip` shows it.
///
/// # Panics
/// If the interface has no Ethernet address.
pub fn mac_of(ns: &NetNs, ifname: &str) -> [u8; 6] {
    let shown = ns.ip(&["-o", "link", "show", "dev", ifname]);
    let text = shown
        .split_whitespace()
        .skip_while(|word| *word != "link/ether")
        .nth(1)
        .unwrap_or_else(|| panic!("{ifname} in {} has no MAC: {shown}", ns.name()));
    let mut mac = [0u8; 6];
    for (byte, hex) in mac.iter_mut().zip(text.split(':')) {
        *byte = u8::from_str_radix(hex, 16).unwrap_or_else(|e| panic!("MAC {text}: {e}"));
    }
    mac
}

/// Sends `packet` from `ns` out of `ifname` as one Ethernet frame to
/// `dst_mac`, past the namespace's routing and its own checks (it is the
/// neighbour's kernel that would refuse to send a loopback address).
///
/// # Panics
/// If the socket cannot be made or the frame not sent.
pub fn send_frame(ns: &NetNs, ifname: &str, dst_mac: [u8; 6], packet: &Crafted) {
    let src_mac = mac_of(ns, ifname);
    let ether_type = if packet.src.is_ipv4() {
        ETH_P_IP
    } else {
        ETH_P_IPV6
    };
    let mut frame = Vec::new();
    frame.extend_from_slice(&dst_mac);
    frame.extend_from_slice(&src_mac);
    frame.extend_from_slice(&ether_type.to_be_bytes());
    frame.extend_from_slice(&packet.ip_packet());
    let ifname = std::ffi::CString::new(ifname).expect("interface name");
    let sent = ns.run(move || -> std::io::Result<()> {
        // SAFETY: plain libc calls on values this closure owns; the socket
        // is closed on every path.
        unsafe {
            let index = libc::if_nametoindex(ifname.as_ptr());
            if index == 0 {
                return Err(std::io::Error::last_os_error());
            }
            let fd = libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0);
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let mut address: libc::sockaddr_ll = std::mem::zeroed();
            address.sll_family = libc::AF_PACKET as u16;
            address.sll_protocol = ether_type.to_be();
            address.sll_ifindex = index as i32;
            address.sll_halen = 6;
            address.sll_addr[..6].copy_from_slice(&dst_mac);
            let n = libc::sendto(
                fd,
                frame.as_ptr().cast(),
                frame.len(),
                0,
                (&raw const address).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            );
            let result = if n == frame.len() as isize {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            };
            libc::close(fd);
            result
        }
    });
    sent.unwrap_or_else(|e| panic!("sending {packet:?} from {}: {e}", ns.name()));
}

/// How many TCP segments and UDP datagrams (IPv4 and IPv6, delivered or
/// refused for want of a socket) the transport layer of `ns` has taken in:
/// anything that reached the namespace and was not dropped on the way.
pub fn transport_received(ns: &NetNs) -> u64 {
    ns.run(|| {
        let snmp = std::fs::read_to_string("/proc/thread-self/net/snmp").expect("read snmp");
        let snmp6 = std::fs::read_to_string("/proc/thread-self/net/snmp6").expect("read snmp6");
        mib(&snmp, "Tcp", "InSegs")
            + mib(&snmp, "Tcp", "InErrs")
            + mib(&snmp, "Udp", "InDatagrams")
            + mib(&snmp, "Udp", "NoPorts")
            + mib(&snmp, "Udp", "InErrors")
            + mib6(&snmp6, "Udp6InDatagrams")
            + mib6(&snmp6, "Udp6NoPorts")
            + mib6(&snmp6, "Udp6InErrors")
    })
}

/// A counter of /proc/net/snmp: a header line of names and a line of
/// values, both led by `group:`.
fn mib(text: &str, group: &str, name: &str) -> u64 {
    let prefix = format!("{group}:");
    let mut lines = text.lines().filter(|l| l.starts_with(&prefix));
    let (names, values) = (lines.next(), lines.next());
    let (Some(names), Some(values)) = (names, values) else {
        panic!("no {group} counters in snmp:\n{text}");
    };
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(n, _)| *n == name)
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or_else(|| panic!("no {group} {name} in snmp:\n{text}"))
}

/// A counter of /proc/net/snmp6: one `name value` per line.
fn mib6(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| {
            let mut words = l.split_whitespace();
            (words.next() == Some(name)).then(|| words.next()?.parse().ok())?
        })
        .unwrap_or_else(|| panic!("no {name} in snmp6:\n{text}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksums_verify_to_zero() {
        for (src, dst) in [
            ("198.18.0.2", "127.0.0.1"),
            ("fd18::2", "::1"),
            ("fd18::2", "::ffff:127.0.0.1"),
        ] {
            for transport in [Transport::TcpSyn, Transport::Udp] {
                let crafted = Crafted {
                    transport,
                    src: src.parse().unwrap(),
                    dst: dst.parse().unwrap(),
                    sport: 40000,
                    dport: 8097,
                };
                let packet = crafted.ip_packet();
                let (header_len, pseudo) = if crafted.src.is_ipv4() {
                    assert_eq!(checksum(&[&packet[..20]]), 0, "IPv4 header of {crafted:?}");
                    let mut pseudo = packet[12..20].to_vec();
                    pseudo.extend_from_slice(&[0, packet[9]]);
                    pseudo.extend_from_slice(&((packet.len() - 20) as u16).to_be_bytes());
                    (20, pseudo)
                } else {
                    let mut pseudo = packet[8..40].to_vec();
                    pseudo.extend_from_slice(&((packet.len() - 40) as u32).to_be_bytes());
                    pseudo.extend_from_slice(&[0, 0, 0, packet[6]]);
                    (40, pseudo)
                };
                assert_eq!(
                    checksum(&[&pseudo, &packet[header_len..]]),
                    0,
                    "transport checksum of {crafted:?}"
                );
            }
        }
    }

    #[test]
    fn mib_counters_are_read_by_name() {
        let snmp = "Tcp: RtoAlgorithm InSegs\nTcp: 1 42\nUdp: InDatagrams NoPorts\nUdp: 3 4\n";
        assert_eq!(mib(snmp, "Tcp", "InSegs"), 42);
        assert_eq!(mib(snmp, "Udp", "NoPorts"), 4);
        assert_eq!(
            mib6("Udp6InDatagrams  7\nUdp6NoPorts 9\n", "Udp6NoPorts"),
            9
        );
    }
}

/// The network the spoofed sources of [`flood`] come from, per family:
/// routed back to the flooding namespace by the caller, which drops what
/// comes back (they are not its addresses).
pub fn spoofed_net(v4: bool) -> &'static str {
    if v4 {
        "203.0.113.0/24"
    } else {
        "fd18:f100::/64"
    }
}

/// Spoofed source `i` of [`flood`]: one of 250 addresses of
/// [`spoofed_net`].
pub fn spoofed(v4: bool, i: u64) -> IpAddr {
    let host = (i % 250) as u8 + 1;
    if v4 {
        std::net::Ipv4Addr::new(203, 0, 113, host).into()
    } else {
        std::net::Ipv6Addr::new(0xfd18, 0xf100, 0, 0, 0, 0, 0, u16::from(host)).into()
    }
}

/// The CPUs this process may run on.
///
/// # Panics
/// If the kernel does not say.
pub fn cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is an empty set; the call fills it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: our own set, of its own size.
    let rc = unsafe { libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &raw mut set) };
    assert_eq!(
        rc,
        0,
        "sched_getaffinity: {}",
        std::io::Error::last_os_error()
    );
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: a CPU number below CPU_SETSIZE.
        .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
        .collect()
}

/// Pins the calling thread to `cpu`.
///
/// # Panics
/// If the kernel refuses.
pub fn pin_to(cpu: usize) {
    // SAFETY: as in `cpus`.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: a CPU number below CPU_SETSIZE, our own set.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: the calling thread (0), our own set.
    let rc = unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &raw const set) };
    assert_eq!(
        rc,
        0,
        "pin to CPU {cpu}: {}",
        std::io::Error::last_os_error()
    );
}

/// What [`flood`] sent.
#[derive(Debug, Clone, Copy)]
pub struct Flooded {
    /// Flows of each protocol: one SYN and one datagram each.
    pub flows: u64,
    pub took: std::time::Duration,
}

/// A flood of new flows at `to`, from `ns` (the client's namespace): at
/// least `flows` spoofed TCP SYNs to `tcp_port` and as many UDP datagrams
/// to `udp_port`, each pair from a source address and port of its own, and
/// on for `at_least` if that is longer (new flows all the way). One
/// sender thread per CPU, pinned there, as a NIC spreads its queues (the
/// kernel's LRU maps keep per-CPU free lists).
///
/// # Panics
/// If a raw socket cannot be made or a packet not sent.
pub fn flood(
    ns: &NetNs,
    to: IpAddr,
    (tcp_port, udp_port): (u16, u16),
    flows: u64,
    at_least: std::time::Duration,
) -> Flooded {
    let cpus = cpus();
    let domain = if to.is_ipv4() {
        socket2::Domain::IPV4
    } else {
        socket2::Domain::IPV6
    };
    // Made in the client's namespace: a socket stays in the one it was
    // made in, whichever thread sends on it.
    let sockets: Vec<socket2::Socket> = cpus
        .iter()
        .map(|_| {
            ns.run(|| {
                socket2::Socket::new(
                    domain,
                    socket2::Type::RAW,
                    Some(socket2::Protocol::from(libc::IPPROTO_RAW)),
                )
            })
            .expect("a raw socket in the flooding namespace")
        })
        .collect();
    let start = std::time::Instant::now();
    let step = cpus.len() as u64;
    let sent: u64 = std::thread::scope(|scope| {
        let senders: Vec<_> = cpus
            .iter()
            .zip(&sockets)
            .enumerate()
            .map(|(n, (cpu, socket))| {
                scope.spawn(move || {
                    pin_to(*cpu);
                    let dest = socket2::SockAddr::from(std::net::SocketAddr::new(to, 0));
                    let mut i = n as u64;
                    let mut sent = 0;
                    while i < flows || start.elapsed() < at_least {
                        let src = spoofed(to.is_ipv4(), i);
                        // 250 sources, then the next port: a new tuple for
                        // each of 16 million flows.
                        let sport = 1024 + ((i / 250) % 64_000) as u16;
                        for (transport, dport) in
                            [(Transport::TcpSyn, tcp_port), (Transport::Udp, udp_port)]
                        {
                            let packet = Crafted {
                                transport,
                                src,
                                dst: to,
                                sport,
                                dport,
                            };
                            socket
                                .send_to(&packet.ip_packet(), &dest)
                                .unwrap_or_else(|e| panic!("flood packet {i} from CPU {cpu}: {e}"));
                        }
                        sent += 1;
                        i += step;
                    }
                    sent
                })
            })
            .collect();
        senders
            .into_iter()
            .map(|sender| sender.join().expect("a flood sender"))
            .sum()
    });
    Flooded {
        flows: sent,
        took: start.elapsed(),
    }
}
