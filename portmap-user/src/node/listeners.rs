//! Who already listens on a host port in the node's network namespace.
//!
//! A mapping captures every packet for its port before the node's sockets
//! see it, so mapping a port a node service listens on (sshd, the API
//! server) would silently take it from that service. ADD looks for such
//! listeners in `/proc/net/{tcp,tcp6,udp,udp6}` (which show the namespace of
//! the reading thread) and, by default, refuses. Container runtimes that
//! reserve mapped ports by holding them open themselves (podman's conmon,
//! docker-proxy, ...) are recognised by the owning process and do not count.

use std::{
    fs, io,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use portmap_common::{PROTO_TCP, PROTO_UDP};

/// Processes that hold a mapped host port open only to reserve it for the
/// container they publish it for.
pub const RESERVATION_HOLDERS: &[&str] = &[
    "conmon",
    "podman",
    "rootlessport",
    "rootlessport-ch",
    "docker-proxy",
    "slirp4netns",
    "pasta",
];

/// A socket bound to a local port that takes new traffic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listener {
    pub proto: u8,
    pub addr: IpAddr,
    pub port: u16,
    pub inode: u64,
}

const TCP_LISTEN: u8 = 0x0a;
const TCP_CLOSE: u8 = 0x07;

fn parse_addr(hex: &str) -> Option<IpAddr> {
    // Each 32-bit word is printed as the native-endian value of the
    // network-order address word.
    let word = |i: usize| -> Option<[u8; 4]> {
        let value = u32::from_str_radix(hex.get(i * 8..i * 8 + 8)?, 16).ok()?;
        Some(value.to_ne_bytes())
    };
    match hex.len() {
        8 => Some(IpAddr::V4(Ipv4Addr::from(word(0)?))),
        32 => {
            let mut octets = [0u8; 16];
            for i in 0..4 {
                octets[i * 4..i * 4 + 4].copy_from_slice(&word(i)?);
            }
            Some(IpAddr::V6(Ipv6Addr::from(octets)))
        }
        _ => None,
    }
}

/// Listeners in one `/proc/net/{tcp,udp}{,6}` table: TCP sockets in LISTEN,
/// UDP sockets not connected to a peer.
pub fn parse_proc_net(text: &str, proto: u8) -> Vec<Listener> {
    let mut listeners = Vec::new();
    for line in text.lines().skip(1) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (Some(local), Some(remote), Some(state), Some(inode)) =
            (fields.get(1), fields.get(2), fields.get(3), fields.get(9))
        else {
            continue;
        };
        let Some((addr, port)) = local.split_once(':') else {
            continue;
        };
        let (Some(addr), Ok(port), Ok(state), Ok(inode)) = (
            parse_addr(addr),
            u16::from_str_radix(port, 16),
            u8::from_str_radix(state, 16),
            inode.parse::<u64>(),
        ) else {
            continue;
        };
        let takes_new_traffic = match proto {
            PROTO_TCP => state == TCP_LISTEN,
            _ => state == TCP_CLOSE && remote.split_once(':').is_some_and(|(_, p)| p == "0000"),
        };
        if takes_new_traffic {
            listeners.push(Listener {
                proto,
                addr,
                port,
                inode,
            });
        }
    }
    listeners
}

/// Every listener for `proto` in the caller's network namespace, asked of
/// the kernel through sock_diag with a state filter: for TCP it walks only
/// the listening sockets, so the cost does not grow with the node's
/// connections (reading /proc/net/tcp walks them all). Falls back to the
/// /proc tables where sock_diag is not available.
pub fn all(proto: u8) -> io::Result<Vec<Listener>> {
    match sock_diag(proto) {
        Ok(found) => Ok(found),
        Err(error) => {
            log::debug!("sock_diag: {error}; reading /proc/net instead");
            from_proc(proto)
        }
    }
}

fn sock_diag(proto: u8) -> io::Result<Vec<Listener>> {
    use netlink_packet_core::{
        NLM_F_DUMP, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload,
    };
    use netlink_packet_sock_diag::{
        SockDiagMessage,
        constants::{AF_INET, AF_INET6},
        inet::{ExtensionFlags, InetRequest, SocketId, StateFlags},
    };
    use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_SOCK_DIAG};

    let states = match proto {
        PROTO_TCP => StateFlags::LISTEN,
        PROTO_UDP => StateFlags::CLOSE,
        _ => return Ok(Vec::new()),
    };
    let mut socket = Socket::new(NETLINK_SOCK_DIAG)?;
    socket.bind_auto()?;
    socket.connect(&SocketAddr::new(0, 0))?;
    let mut found = Vec::new();
    for (family, socket_id) in [
        (AF_INET, SocketId::new_v4()),
        (AF_INET6, SocketId::new_v6()),
    ] {
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | NLM_F_DUMP;
        let mut request = NetlinkMessage::new(
            header,
            SockDiagMessage::InetRequest(InetRequest {
                family,
                protocol: proto,
                extensions: ExtensionFlags::empty(),
                states: states.clone(),
                socket_id,
            })
            .into(),
        );
        request.finalize();
        let mut buffer = vec![0; request.buffer_len()];
        request.serialize(&mut buffer);
        socket.send(&buffer, 0)?;
        'dump: loop {
            let (data, _) = socket.recv_from_full()?;
            let mut offset = 0;
            while offset < data.len() {
                let message = NetlinkMessage::<SockDiagMessage>::deserialize(&data[offset..])
                    .map_err(|e| io::Error::other(e.to_string()))?;
                let length = message.header.length as usize;
                match message.payload {
                    NetlinkPayload::Done(_) => break 'dump,
                    NetlinkPayload::Error(error) => {
                        return Err(io::Error::other(format!("sock_diag error {error:?}")));
                    }
                    NetlinkPayload::InnerMessage(SockDiagMessage::InetResponse(response)) => {
                        let id = &response.header.socket_id;
                        // A connected UDP socket is in CLOSE too; it takes
                        // nothing new.
                        if proto == PROTO_TCP || id.destination_port == 0 {
                            found.push(Listener {
                                proto,
                                addr: id.source_address,
                                port: id.source_port,
                                inode: u64::from(response.header.inode),
                            });
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
    Ok(found)
}

fn from_proc(proto: u8) -> io::Result<Vec<Listener>> {
    let tables: &[&str] = match proto {
        PROTO_TCP => &["/proc/net/tcp", "/proc/net/tcp6"],
        PROTO_UDP => &["/proc/net/udp", "/proc/net/udp6"],
        // SCTP endpoints are not in these tables; nothing to compare with.
        _ => &[],
    };
    let mut found = Vec::new();
    for table in tables {
        match fs::read_to_string(table) {
            Ok(text) => found.extend(parse_proc_net(&text, proto)),
            // No IPv6 on this node.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(found)
}

/// Names (`comm`) of the processes that hold socket `inode` open.
pub fn socket_holders(inode: u64) -> Vec<String> {
    let target = format!("socket:[{inode}]");
    let mut holders = Vec::new();
    let Ok(processes) = fs::read_dir("/proc") else {
        return holders;
    };
    for process in processes.flatten() {
        let pid = process.file_name();
        if !pid.to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(fds) = fs::read_dir(process.path().join("fd")) else {
            continue;
        };
        let holds = fds.flatten().any(|fd| {
            fs::read_link(fd.path()).is_ok_and(|link| link.as_os_str() == target.as_str())
        });
        if holds && let Ok(comm) = fs::read_to_string(process.path().join("comm")) {
            holders.push(comm.trim().to_owned());
        }
    }
    holders
}

/// Whether a listener bound to `listener` would receive traffic for a
/// mapping of `host` (`None`: every address of `v6`'s family).
pub fn overlaps(listener: &IpAddr, host: Option<IpAddr>, v6: bool) -> bool {
    let wildcard = listener.is_unspecified();
    // An IPv6 wildcard socket takes IPv4 too unless it is V6ONLY, which
    // /proc does not show: assume it does.
    let dual_stack = wildcard && listener.is_ipv6();
    match host {
        Some(host) => {
            *listener == host
                || (wildcard && host.is_ipv6() == listener.is_ipv6())
                || (dual_stack && host.is_ipv4())
        }
        None => listener.is_ipv6() == v6 || dual_stack,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TCP4: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 12345 1 0000000000000000 100 0 0 10 0
   1: 0100007F:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 222 1 0000000000000000 100 0 0 10 0
   2: 0100A8C0:C350 0200A8C0:0050 01 00000000:00000000 00:00000000 00000000     0        0 333 1 0000000000000000 100 0 0 10 0
";

    #[test]
    fn tcp_listeners_are_parsed_with_addresses_and_ports() {
        let listeners = parse_proc_net(TCP4, PROTO_TCP);
        assert_eq!(
            listeners,
            vec![
                Listener {
                    proto: PROTO_TCP,
                    addr: "0.0.0.0".parse().unwrap(),
                    port: 8080,
                    inode: 12345
                },
                Listener {
                    proto: PROTO_TCP,
                    addr: "127.0.0.1".parse().unwrap(),
                    port: 22,
                    inode: 222
                },
            ],
            "established connections are not listeners"
        );
    }

    #[test]
    fn ipv6_addresses_are_parsed() {
        let text = "header\n   0: 00000000000000000000000001000000:0050 00000000000000000000000000000000:0000 0A 0:0 0:0 0 0 0 77 1\n";
        let listeners = parse_proc_net(text, PROTO_TCP);
        assert_eq!(listeners[0].addr, "::1".parse::<IpAddr>().unwrap());
        assert_eq!(listeners[0].port, 80);
        assert_eq!(listeners[0].inode, 77);
    }

    #[test]
    fn only_unconnected_udp_sockets_take_new_datagrams() {
        let text = "header
   1: 00000000:14E9 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 10 2 0000000000000000 0
   2: 00000000:14EA 0200A8C0:0035 01 00000000:00000000 00:00000000 00000000     0        0 11 2 0000000000000000 0
";
        let listeners = parse_proc_net(text, PROTO_UDP);
        assert_eq!(listeners.len(), 1);
        assert_eq!(listeners[0].port, 5353);
    }

    #[test]
    fn sock_diag_sees_a_listener_and_not_a_connection() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let _client = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let found = sock_diag(PROTO_TCP).expect("sock_diag answers");
        let on_port: Vec<_> = found.iter().filter(|l| l.port == port).collect();
        assert_eq!(
            on_port.len(),
            1,
            "one listener, no connections: {on_port:?}"
        );
        assert_eq!(on_port[0].addr, "127.0.0.1".parse::<IpAddr>().unwrap());
        assert_ne!(on_port[0].inode, 0);

        let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let udp_port = udp.local_addr().unwrap().port();
        let found = sock_diag(PROTO_UDP).expect("sock_diag answers");
        assert!(
            found.iter().any(|l| l.port == udp_port),
            "an unconnected UDP socket listens"
        );
    }

    #[test]
    fn overlap_follows_socket_address_semantics() {
        let any4: IpAddr = "0.0.0.0".parse().unwrap();
        let any6: IpAddr = "::".parse().unwrap();
        let node: IpAddr = "198.18.0.1".parse().unwrap();
        let other: IpAddr = "198.18.0.11".parse().unwrap();
        assert!(
            overlaps(&any4, None, false),
            "0.0.0.0 listener vs IPv4 wildcard mapping"
        );
        assert!(
            !overlaps(&any4, None, true),
            "0.0.0.0 listener vs IPv6 wildcard mapping"
        );
        assert!(
            overlaps(&any6, None, false),
            "a dual-stack :: listener takes IPv4 too"
        );
        assert!(overlaps(&node, Some(node), false));
        assert!(
            !overlaps(&other, Some(node), false),
            "another address is another socket"
        );
        assert!(overlaps(&any4, Some(node), false));
        assert!(
            overlaps(&node, None, false),
            "a wildcard mapping covers every address"
        );
    }
}
