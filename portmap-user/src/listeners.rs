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

/// Every listener for `proto` in the caller's network namespace.
pub fn all(proto: u8) -> io::Result<Vec<Listener>> {
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
