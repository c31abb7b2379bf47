//! ICMP errors about hostPort flows reach the socket they are about, with
//! the addresses that socket knows, as netfilter's NAT has them for
//! upstream's DNAT: a container's "port unreachable" reaches the client
//! from the host port (never from the pod's address), the node's reject
//! at FORWARD fails the client's connect at once, and a "fragmentation
//! needed" / "packet too big" from beyond the node about a container's
//! answer lowers the container's path MTU. IPv4 and IPv6; the first two
//! also with upstream portmap in the same world, which gets them from
//! netfilter's NAT. Needs root.

use std::io::ErrorKind;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use portmap_tests::cni::result_addresses;
use portmap_tests::crafted::checksum;
use portmap_tests::topology::{EXT_IP4, EXT_IP6, Family, NODE_IP4, NODE_IP6};
use portmap_tests::world::{World, counter};
use portmap_tests::{PortMapping, bridge_conflist};

const TCP_HOST_PORT: u16 = 8099;
const UDP_HOST_PORT: u16 = 5399;
const TCP_PORT: u16 = 80;
const UDP_PORT: u16 = 53;
/// What the tests wait for an error that upstream's client gets at once.
const AT_ONCE: Duration = Duration::from_secs(2);
/// The path MTU the crafted errors announce.
const SMALLER_MTU: u16 = 1280;

/// Which port-mapping plugin the node runs: ours (by default, or with
/// `fastPath: true` on a node with kube-proxy's `ct state invalid drop`),
/// or upstream portmap (iptables) in the same world, whose errors
/// netfilter's NAT translates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Plugin {
    Ours,
    OursFast,
    Upstream,
}

impl Plugin {
    fn world(self) -> World {
        match self {
            Plugin::Ours => World::bridge(),
            Plugin::OursFast => {
                let world = World::with(|name, pins, data| {
                    let list = bridge_conflist(name, "ebpf-portmap", Some(pins), data);
                    let mut json = list.json().clone();
                    json["plugins"][1]
                        .as_object_mut()
                        .expect("the plugin entry")
                        .insert("fastPath".into(), serde_json::Value::Bool(true));
                    portmap_tests::Conflist::from_json(json).expect("conflist")
                });
                world.node.drop_invalid_at_forward();
                world
            }
            Plugin::Upstream => {
                World::with(|name, _pins, data| bridge_conflist(name, "portmap", None, data))
            }
        }
    }

    /// Our counter `reason` grew (upstream has none to read).
    fn counted(self, world: &World, reason: &str) {
        if self != Plugin::Upstream {
            assert!(counter(&world.counters(), reason) >= 1, "{reason} counted");
        }
    }

    fn dump(self, world: &World) -> String {
        match self {
            Plugin::Ours | Plugin::OursFast => {
                format!("counters: {:#}\n{}", world.counters(), world.dump())
            }
            Plugin::Upstream => world.node.ns.exec("iptables-save", &["-t", "nat"]),
        }
    }
}

/// The container's address of `family` in an ADD's result.
fn pod_address(family: Family, result: &serde_json::Value) -> IpAddr {
    result_addresses(result)
        .into_iter()
        .find(|ip| ip.is_ipv4() == family.is_v4())
        .unwrap_or_else(|| panic!("the container has an address of {family:?}: {result:#}"))
}

/// Counts, in the client's namespace before anything else sees them, the
/// packets from `pod` (rule 1 of raw PREROUTING).
fn count_pod_source(world: &World, family: Family, pod: IpAddr) {
    world.node.ext.exec(
        family.tables(),
        &["-t", "raw", "-I", "PREROUTING", "1", "-s", &pod.to_string()],
    );
}

fn pod_source_packets(world: &World, family: Family) -> u64 {
    let line = world.node.ext.exec(
        family.tables(),
        &["-t", "raw", "-L", "PREROUTING", "1", "-v", "-x", "-n"],
    );
    line.split_whitespace()
        .next()
        .and_then(|packets| packets.parse().ok())
        .unwrap_or_else(|| panic!("no packet count in {line:?}"))
}

/// A container's "port unreachable" for a UDP port nothing listens on:
/// the client's connected socket is refused, as under upstream, and no
/// packet from the pod's address reaches it.
fn port_unreachable_reaches_the_client(plugin: Plugin, family: Family) {
    let world = plugin.world();
    let web = world.node.add_container("web");
    let result = world.add(&web, &[PortMapping::udp(UDP_HOST_PORT, UDP_PORT)]);
    let pod = pod_address(family, &result);
    count_pod_source(&world, family, pod);
    let node = family.node();
    let refused = world.node.ext.run(|| {
        let socket = UdpSocket::bind(SocketAddr::new(family.client(), 0))?;
        socket.connect(SocketAddr::new(node, UDP_HOST_PORT))?;
        socket.set_read_timeout(Some(AT_ONCE))?;
        socket.send(b"anyone?")?;
        let mut buf = [0u8; 64];
        Ok::<_, std::io::Error>(socket.recv(&mut buf).map(|_| ()))
    });
    let answer = refused.expect("the client's UDP socket");
    let from_pod = pod_source_packets(&world, family);
    assert!(
        matches!(&answer, Err(e) if e.kind() == ErrorKind::ConnectionRefused),
        "{plugin:?} {family:?}: the client's datagram to {node}:{UDP_HOST_PORT}, no listener in the container: wanted ECONNREFUSED, got {answer:?} ({from_pod} packets from the pod's address {pod} reached the client)\n{}",
        plugin.dump(&world)
    );
    assert_eq!(
        from_pod, 0,
        "{plugin:?} {family:?}: packets from the pod's address {pod} reached the client"
    );
    plugin.counted(&world, "icmp_reply");
}

#[test]
fn a_containers_port_unreachable_refuses_the_client_v4() {
    port_unreachable_reaches_the_client(Plugin::Ours, Family::V4);
}

#[test]
fn a_containers_port_unreachable_refuses_the_client_v6() {
    port_unreachable_reaches_the_client(Plugin::Ours, Family::V6);
}

/// With `fastPath: true` the client's datagram skipped netfilter, so the
/// kernel's conntrack has no entry the container's error is related to,
/// and kube-proxy's `ct state invalid drop` at FORWARD would drop it: it
/// takes the fast path too.
#[test]
fn with_the_fast_path_a_containers_port_unreachable_refuses_the_client() {
    port_unreachable_reaches_the_client(Plugin::OursFast, Family::V4);
    port_unreachable_reaches_the_client(Plugin::OursFast, Family::V6);
}

#[test]
fn upstream_in_the_same_world_refuses_the_client_too() {
    port_unreachable_reaches_the_client(Plugin::Upstream, Family::V4);
    port_unreachable_reaches_the_client(Plugin::Upstream, Family::V6);
}

/// A REJECT at the node's FORWARD for the container's port: the client's
/// connect to the host port fails at once, as under upstream, instead of
/// waiting for its timeout.
fn a_reject_at_forward_fails_the_connect_at_once(plugin: Plugin, family: Family) {
    let world = plugin.world();
    let web = world.node.add_container("web");
    let _listener = web
        .ns
        .run(|| std::net::TcpListener::bind(SocketAddr::new(family.any(), TCP_PORT)))
        .expect("listen in the container");
    let result = world.add(&web, &[PortMapping::tcp(TCP_HOST_PORT, TCP_PORT)]);
    let pod = pod_address(family, &result).to_string();
    let port = TCP_PORT.to_string();
    let reject_with = match family {
        Family::V4 => "icmp-admin-prohibited",
        Family::V6 => "icmp6-adm-prohibited",
    };
    world.node.ns.exec(
        family.tables(),
        &[
            "-A",
            "FORWARD",
            "-p",
            "tcp",
            "-d",
            &pod,
            "--dport",
            &port,
            "-j",
            "REJECT",
            "--reject-with",
            reject_with,
        ],
    );
    let node = family.node();
    let start = Instant::now();
    let outcome = world
        .node
        .ext
        .run(|| TcpStream::connect_timeout(&SocketAddr::new(node, TCP_HOST_PORT), AT_ONCE));
    let took = start.elapsed();
    match outcome {
        Err(e) if e.kind() != ErrorKind::TimedOut && took < AT_ONCE => {
            eprintln!("{plugin:?} {family:?}: refused after {took:?}: {e}");
        }
        other => panic!(
            "{plugin:?} {family:?}: connect to {node}:{TCP_HOST_PORT} behind a REJECT at FORWARD: wanted an error at once, got {other:?} after {took:?}\n{}",
            plugin.dump(&world)
        ),
    }
    plugin.counted(&world, "icmp_reply");
}

#[test]
fn a_reject_at_forward_fails_the_clients_connect_at_once_v4() {
    a_reject_at_forward_fails_the_connect_at_once(Plugin::Ours, Family::V4);
}

#[test]
fn a_reject_at_forward_fails_the_clients_connect_at_once_v6() {
    a_reject_at_forward_fails_the_connect_at_once(Plugin::Ours, Family::V6);
}

#[test]
fn upstream_in_the_same_world_fails_the_connect_at_once_too() {
    a_reject_at_forward_fails_the_connect_at_once(Plugin::Upstream, Family::V4);
    a_reject_at_forward_fails_the_connect_at_once(Plugin::Upstream, Family::V6);
}

/// An IPv4 header (checksum filled in) of `proto` for `payload_len` bytes.
fn ipv4_header(src: Ipv4Addr, dst: Ipv4Addr, proto: u8, payload_len: usize) -> Vec<u8> {
    let total = (20 + payload_len) as u16;
    let mut header = vec![0x45, 0];
    header.extend_from_slice(&total.to_be_bytes());
    header.extend_from_slice(&[0, 0, 0x40, 0, 64, proto, 0, 0]);
    header.extend_from_slice(&src.octets());
    header.extend_from_slice(&dst.octets());
    let sum = checksum(&[&header]);
    header[10..12].copy_from_slice(&sum.to_be_bytes());
    header
}

/// An IPv6 header of `proto` for `payload_len` bytes.
fn ipv6_header(src: Ipv6Addr, dst: Ipv6Addr, proto: u8, payload_len: usize) -> Vec<u8> {
    let mut header = vec![0x60, 0, 0, 0];
    header.extend_from_slice(&(payload_len as u16).to_be_bytes());
    header.extend_from_slice(&[proto, 64]);
    header.extend_from_slice(&src.octets());
    header.extend_from_slice(&dst.octets());
    header
}

/// What a router between the node and the client sends about a datagram
/// from the host port to the client (`quoted_sport` .. `client_port`)
/// that is too big for the next hop: a whole IP packet, from the client's
/// address (as a router next to it) to the node's.
fn too_big(family: Family, client_port: u16) -> Vec<u8> {
    let mut udp = Vec::new();
    udp.extend_from_slice(&UDP_HOST_PORT.to_be_bytes());
    udp.extend_from_slice(&client_port.to_be_bytes());
    udp.extend_from_slice(&1400u16.to_be_bytes());
    udp.extend_from_slice(&[0, 0]);
    match family {
        Family::V4 => {
            let mut quote = ipv4_header(NODE_IP4, EXT_IP4, 17, 1400);
            quote.extend_from_slice(&udp);
            // Destination unreachable, fragmentation needed, next-hop MTU.
            let mut icmp = vec![3, 4, 0, 0, 0, 0];
            icmp.extend_from_slice(&SMALLER_MTU.to_be_bytes());
            icmp.extend_from_slice(&quote);
            let sum = checksum(&[&icmp]);
            icmp[2..4].copy_from_slice(&sum.to_be_bytes());
            let mut packet = ipv4_header(EXT_IP4, NODE_IP4, 1, icmp.len());
            packet.extend_from_slice(&icmp);
            packet
        }
        Family::V6 => {
            let mut quote = ipv6_header(NODE_IP6, EXT_IP6, 17, 1400);
            quote.extend_from_slice(&udp);
            // Packet too big, the MTU as 32 bits.
            let mut icmp = vec![2, 0, 0, 0];
            icmp.extend_from_slice(&u32::from(SMALLER_MTU).to_be_bytes());
            icmp.extend_from_slice(&quote);
            let mut pseudo = Vec::new();
            pseudo.extend_from_slice(&EXT_IP6.octets());
            pseudo.extend_from_slice(&NODE_IP6.octets());
            pseudo.extend_from_slice(&(icmp.len() as u32).to_be_bytes());
            pseudo.extend_from_slice(&[0, 0, 0, 58]);
            let sum = checksum(&[&pseudo, &icmp]);
            icmp[2..4].copy_from_slice(&sum.to_be_bytes());
            let mut packet = ipv6_header(EXT_IP6, NODE_IP6, 58, icmp.len());
            packet.extend_from_slice(&icmp);
            packet
        }
    }
}

/// The MTU `ip route get` gives for the client from the container's
/// namespace, if the route has one of its own (a learned path MTU).
fn learned_mtu(ns: &portmap_tests::NetNs, family: Family) -> Option<u16> {
    let route = ns.ip(&["route", "get", &family.client().to_string()]);
    let mut words = route.split_whitespace();
    while let Some(word) = words.next() {
        if word == "mtu" {
            return words.next().and_then(|mtu| mtu.parse().ok());
        }
    }
    None
}

/// A "fragmentation needed" / "packet too big" from beyond the node about
/// a container's answer (which left from the host port): the container's
/// path MTU to the client comes down, as under upstream.
fn a_path_mtu_reaches_the_container(family: Family) {
    let world = World::bridge();
    let web = world.node.add_container("web");
    let server = web
        .ns
        .run(|| UdpSocket::bind(SocketAddr::new(family.any(), UDP_PORT)))
        .expect("a UDP socket in the container");
    server
        .set_read_timeout(Some(AT_ONCE))
        .expect("read timeout");
    world.add(&web, &[PortMapping::udp(UDP_HOST_PORT, UDP_PORT)]);
    let node = family.node();
    let client = world
        .node
        .ext
        .run(|| {
            let socket = UdpSocket::bind(SocketAddr::new(family.client(), 0))?;
            socket.connect(SocketAddr::new(node, UDP_HOST_PORT))?;
            socket.set_read_timeout(Some(AT_ONCE))?;
            Ok::<_, std::io::Error>(socket)
        })
        .expect("the client's UDP socket");
    client.send(b"hello").expect("send");
    let mut buf = [0u8; 64];
    let (_, peer) = server.recv_from(&mut buf).expect("the client's datagram");
    server.send_to(b"welcome", peer).expect("answer");
    client.recv(&mut buf).expect("the answer");
    assert_eq!(
        learned_mtu(&web.ns, family),
        None,
        "no path MTU is known before the error"
    );
    let client_port = client.local_addr().expect("client address").port();
    let packet = too_big(family, client_port);
    let (domain, to) = match family {
        Family::V4 => (socket2::Domain::IPV4, SocketAddr::new(node, 0)),
        Family::V6 => (socket2::Domain::IPV6, SocketAddr::new(node, 0)),
    };
    world
        .node
        .ext
        .run(|| {
            let raw = socket2::Socket::new(
                domain,
                socket2::Type::RAW,
                Some(socket2::Protocol::from(libc::IPPROTO_RAW)),
            )?;
            raw.send_to(&packet, &socket2::SockAddr::from(to))
        })
        .expect("send the error from the client's side");
    let deadline = Instant::now() + AT_ONCE;
    let mut mtu = learned_mtu(&web.ns, family);
    while mtu.is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        mtu = learned_mtu(&web.ns, family);
    }
    assert_eq!(
        mtu,
        Some(SMALLER_MTU),
        "{family:?}: the container's route to the client after a too-big error about its answer\ncounters: {:#}\n{}",
        world.counters(),
        world.dump()
    );
    assert!(counter(&world.counters(), "icmp_dnat") >= 1);
}

#[test]
fn a_path_mtu_from_beyond_the_node_reaches_the_container_v4() {
    a_path_mtu_reaches_the_container(Family::V4);
}

#[test]
fn a_path_mtu_from_beyond_the_node_reaches_the_container_v6() {
    a_path_mtu_reaches_the_container(Family::V6);
}
