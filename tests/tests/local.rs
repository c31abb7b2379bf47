//! Traffic that does not come from outside the node: from the node itself to
//! node-IP:hostPort, to localhost (127.0.0.1 and ::1), and hairpin (a
//! container to node-IP:hostPort of itself or of another container), for TCP
//! and UDP over IPv4 and IPv6, with the bridge and the ptp plugin. Needs root.
//!
//! Clients run as their own processes (the `probe` binary) so they can be put
//! in the test's cgroup, where the plugin's socket hooks are attached, or
//! left out of it to exercise the packet-level hairpin.

use std::net::{IpAddr, SocketAddr};

use portmap_tests::crafted::{self, Crafted, Transport};
use portmap_tests::topology::{
    EXT_IP4, EXT_IP6, FAR_IP4, NODE_FAR_LINK, NODE_IP4, NODE_IP6, NODE_UPLINK, POD_GATEWAY4,
    POD_GATEWAY6,
};
use portmap_tests::traffic::{
    echo_reply, sctp_available, sctp_echo_server, tcp_echo_server, udp_echo_server,
};
use portmap_tests::world::{Probed, World, counter, sock};
use portmap_tests::{Container, NetNs, PortMapping};

/// Runs the probe client in `ns`; in the test's cgroup when `hooked`.
fn probe(
    world: &World,
    ns: &NetNs,
    hooked: bool,
    mode: &str,
    target: SocketAddr,
    payload: &str,
) -> Result<Probed, String> {
    world.probe_echo(
        env!("CARGO_BIN_EXE_probe"),
        ns,
        hooked,
        mode,
        target,
        payload,
    )
}

fn expect(
    world: &World,
    what: &str,
    seen: Result<Probed, String>,
    target: SocketAddr,
    identity: &str,
    payload: &str,
) {
    world.expect_echo(what, seen, target, identity, payload);
}

fn route_localnet(ns: &NetNs) -> String {
    ns.read_sysctl("net.ipv4.conf.all.route_localnet")
}

struct Setup {
    world: World,
    web: Container,
    other: Container,
    _servers: Vec<portmap_tests::traffic::ServerHandle>,
}

/// Two containers: `web` maps 8080/tcp and 5353/udp; `other` maps nothing.
fn setup(world: World) -> Setup {
    let web = world.node.add_container("web");
    let other = world.node.add_container("other");
    let servers = vec![
        tcp_echo_server(&web.ns, 80, "web"),
        udp_echo_server(&web.ns, 53, "web"),
    ];
    world.add(
        &web,
        &[PortMapping::tcp(8080, 80), PortMapping::udp(5353, 53)],
    );
    world.add(&other, &[]);
    Setup {
        world,
        web,
        other,
        _servers: servers,
    }
}

fn families() -> [(IpAddr, IpAddr); 2] {
    [
        (IpAddr::V4(NODE_IP4), "127.0.0.1".parse().unwrap()),
        (IpAddr::V6(NODE_IP6), "::1".parse().unwrap()),
    ]
}

fn every_local_path(world: World) {
    let localnet_before = route_localnet(&world.node.ns);
    let s = setup(world);
    let w = &s.world;
    for (node_ip, loopback) in families() {
        // 1. From the node itself to node-IP:hostPort.
        let tcp = sock(node_ip, 8080);
        let udp = sock(node_ip, 5353);
        expect(
            w,
            &format!("node -> {tcp}"),
            probe(w, &w.node.ns, true, "tcp", tcp, "n1"),
            tcp,
            "web",
            "n1",
        );
        expect(
            w,
            &format!("node -> {udp}"),
            probe(w, &w.node.ns, true, "udp", udp, "n2"),
            udp,
            "web",
            "n2",
        );
        expect(
            w,
            &format!("node -> {udp} unconnected"),
            probe(w, &w.node.ns, true, "udp-unconnected", udp, "n3"),
            udp,
            "web",
            "n3",
        );
        // 2. localhost, only from the node's own namespace.
        let tcp_lo = sock(loopback, 8080);
        let udp_lo = sock(loopback, 5353);
        expect(
            w,
            &format!("node -> {tcp_lo}"),
            probe(w, &w.node.ns, true, "tcp", tcp_lo, "l1"),
            tcp_lo,
            "web",
            "l1",
        );
        expect(
            w,
            &format!("node -> {udp_lo}"),
            probe(w, &w.node.ns, true, "udp", udp_lo, "l2"),
            udp_lo,
            "web",
            "l2",
        );
        assert!(
            probe(w, &s.other.ns, true, "tcp", tcp_lo, "x").is_err(),
            "a container's own {tcp_lo} must not be translated"
        );
        // 3. Hairpin through the socket hooks: a hooked process in a container.
        for (client, label) in [(&s.web, "itself"), (&s.other, "another container")] {
            expect(
                w,
                &format!("{label} -> {tcp} (hooked)"),
                probe(w, &client.ns, true, "tcp", tcp, "h1"),
                tcp,
                "web",
                "h1",
            );
            expect(
                w,
                &format!("{label} -> {udp} (hooked)"),
                probe(w, &client.ns, true, "udp", udp, "h2"),
                udp,
                "web",
                "h2",
            );
            // 3b. Packet-level hairpin: no hook saw this process.
            expect(
                w,
                &format!("{label} -> {tcp} (packet hairpin)"),
                probe(w, &client.ns, false, "tcp", tcp, "p1"),
                tcp,
                "web",
                "p1",
            );
            expect(
                w,
                &format!("{label} -> {udp} (packet hairpin)"),
                probe(w, &client.ns, false, "udp", udp, "p2"),
                udp,
                "web",
                "p2",
            );
        }
    }
    assert_eq!(
        route_localnet(&w.node.ns),
        localnet_before,
        "route_localnet is never changed"
    );
    w.del(
        &s.web,
        &[PortMapping::tcp(8080, 80), PortMapping::udp(5353, 53)],
    );
    w.del(&s.other, &[]);
    assert_no_nat_rules(&w.node.ns);
}

fn assert_no_nat_rules(node: &NetNs) {
    for tool in ["iptables-save", "ip6tables-save"] {
        let out = node.command(tool).output().expect("iptables-save");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            !text.contains("DNAT")
                && !text.contains("MASQUERADE")
                && !text.contains("CNI-HOSTPORT"),
            "{tool} shows NAT rules:\n{text}"
        );
    }
}

#[test]
fn bridge_node_localhost_and_hairpin_paths() {
    every_local_path(World::bridge());
}

#[test]
fn ptp_node_localhost_and_hairpin_paths() {
    every_local_path(World::ptp());
}

#[test]
fn a_node_connection_to_a_remote_host_on_a_mapped_port_is_left_alone() {
    let s = setup(World::bridge());
    let w = &s.world;
    // The far host serves the same port the container maps.
    let _far = tcp_echo_server(&w.node.far, 8080, "far-host");
    let far = sock("198.19.0.2".parse::<IpAddr>().unwrap(), 8080);
    expect(
        w,
        "node -> far host",
        probe(w, &w.node.ns, true, "tcp", far, "r"),
        far,
        "far-host",
        "r",
    );
}

/// A mapping whose exact `hostIP` is another host's address (here the far
/// host's) sees none of the node's own traffic to that host, as README and
/// the ADD log promise and as upstream's `--dst-type LOCAL` does: the
/// node's TCP connections and its connected and unconnected UDP datagrams
/// reach the far host. Once the address is the node's, from the next
/// plugin run on, the mapping takes them; once it is gone again, they
/// reach the far host again.
#[test]
fn an_exact_host_ip_that_is_not_the_nodes_never_takes_the_nodes_traffic() {
    let w = World::bridge();
    let web = w.node.add_container("web");
    let _web_tcp = tcp_echo_server(&web.ns, 80, "web");
    let _web_udp = udp_echo_server(&web.ns, 53, "web");
    let _far_tcp = tcp_echo_server(&w.node.far, 8080, "far-host");
    let _far_udp = udp_echo_server(&w.node.far, 5353, "far-host");
    let far = IpAddr::V4(FAR_IP4);
    let mappings = [
        PortMapping::tcp(8080, 80).on(far),
        PortMapping::udp(5353, 53).on(far),
    ];
    let prev = w.add(&web, &mappings);
    let answers = |when: &str, identity: &str| {
        for (mode, port) in [("tcp", 8080), ("udp", 5353), ("udp-unconnected", 5353)] {
            let target = sock(far, port);
            expect(
                &w,
                &format!("node -> {target} over {mode}, {when}"),
                probe(&w, &w.node.ns, true, mode, target, mode),
                target,
                identity,
                mode,
            );
        }
    };
    answers("while it is the far host's address", "far-host");
    // The node takes the address (the far host keeps it, so the node's own
    // traffic to it now stays on the node); the next plugin run sees it.
    let on_node = format!("{far}/32");
    w.node
        .ns
        .ip(&["addr", "add", &on_node, "dev", NODE_FAR_LINK]);
    let readd = || {
        w.exec_ours(
            portmap_tests::cni::CniCommand::Add,
            &web.with_port_mappings(&mappings),
            Some(&prev),
        )
        .unwrap_or_else(|e| panic!("re-ADD of web: {e}\n{}", w.dump()));
    };
    readd();
    answers("once it is the node's", "web");
    w.node
        .ns
        .ip(&["addr", "del", &on_node, "dev", NODE_FAR_LINK]);
    readd();
    answers("once it is gone from the node again", "far-host");
}

/// Issue #51: kube-proxy's IPVS mode holds every Service ClusterIP on the
/// device `kube-ipvs0` (a dummy it leaves down), so each is an address of
/// the node. A wildcard hostPort 443 (an ingress controller's) must not
/// take the Services' traffic, from pods or from node processes, also for
/// a Service made after the last CNI call; the node's own addresses stay
/// the ingress pod's. The Service's backends are stood in for by the node's
/// own listener on 443: what the node delivers locally to a ClusterIP
/// (IPVS takes it from there on a real node; the VM guests test a real
/// IPVS). This kernel has no dummy device: a veth left down, under the
/// name that counts.
#[test]
fn a_wildcard_host_port_never_takes_a_service_vip() {
    let w = World::bridge();
    let ingress = w.node.add_container("ingress");
    let client = w.node.add_container("client");
    let _ingress_servers = [
        tcp_echo_server(&ingress.ns, 8443, "ingress"),
        udp_echo_server(&ingress.ns, 8443, "ingress"),
    ];
    w.node.ns.ip(&[
        "link",
        "add",
        "kube-ipvs0",
        "type",
        "veth",
        "peer",
        "name",
        "ipvs-peer",
    ]);
    w.node
        .ns
        .ip(&["addr", "add", "10.96.0.1/32", "dev", "kube-ipvs0"]);
    w.node
        .ns
        .ip(&["addr", "add", "fd96::1/128", "dev", "kube-ipvs0", "nodad"]);
    let mappings = [PortMapping::tcp(443, 8443), PortMapping::udp(443, 8443)];
    w.add(&ingress, &mappings);
    w.add(&client, &[]);
    // After the ADDs: `hostPortListeners` refuses a host port the node
    // listens on.
    let _service = [
        tcp_echo_server(&w.node.ns, 443, "service"),
        udp_echo_server(&w.node.ns, 443, "service"),
    ];
    // A Service made since the last CNI call.
    w.node
        .ns
        .ip(&["addr", "add", "10.96.0.2/32", "dev", "kube-ipvs0"]);
    let skipped_before = counter(&w.counters(), "skip_not_node_address");
    for vip in ["10.96.0.1", "fd96::1", "10.96.0.2"] {
        let target = sock(vip.parse::<IpAddr>().unwrap(), 443);
        // TCP only from the pod: the stand-in's wildcard UDP socket answers
        // a pod from the bridge's address, which the pod's socket refuses
        // (IPVS answers from the VIP; the guests' real-IPVS test covers UDP).
        expect(
            &w,
            &format!("pod -> Service {target} over tcp"),
            probe(&w, &client.ns, false, "tcp", target, "svc"),
            target,
            "service",
            "svc",
        );
        for mode in ["tcp", "udp"] {
            expect(
                &w,
                &format!("node process -> Service {target} over {mode}"),
                probe(&w, &w.node.ns, true, mode, target, "svc"),
                target,
                "service",
                "svc",
            );
        }
    }
    assert!(
        counter(&w.counters(), "skip_not_node_address") >= skipped_before + 3,
        "each pod flow to a Service VIP is counted as skip_not_node_address\n{}",
        w.dump()
    );
    for node_ip in [IpAddr::V4(NODE_IP4), IpAddr::V6(NODE_IP6)] {
        let target = sock(node_ip, 443);
        for mode in ["tcp", "udp"] {
            for (who, ns, hooked) in [
                ("external client", &w.node.ext, false),
                ("pod", &client.ns, false),
                ("node process", &w.node.ns, true),
            ] {
                expect(
                    &w,
                    &format!("{who} -> {target} over {mode}"),
                    probe(&w, ns, hooked, mode, target, "ing"),
                    target,
                    "ingress",
                    "ing",
                );
            }
        }
    }
    let status = w.operator(&["status", "--json"]);
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).expect("status JSON");
    let excluded: Vec<&str> = status["hostAddresses"]["excluded"]
        .as_array()
        .expect("hostAddresses.excluded")
        .iter()
        .filter_map(|e| e["address"].as_str())
        .collect();
    assert_eq!(
        excluded,
        ["10.96.0.1", "10.96.0.2", "fd96::1"],
        "status names the Service VIPs a hostPort leaves alone"
    );
    let covered = status["hostAddresses"]["answeredOn"].to_string();
    assert!(
        covered.contains(&NODE_IP4.to_string()) && !covered.contains("10.96.0.1"),
        "status lists the addresses host ports answer on: {covered}"
    );
    let list = String::from_utf8_lossy(&w.operator(&["list"]).stdout).into_owned();
    assert!(
        list.contains("10.96.0.1 on kube-ipvs0") && list.contains("host ports answer on: "),
        "list says where its wildcard rows answer:\n{list}"
    );
    w.del(&ingress, &mappings);
}

/// Runs `ipvsadm` in `ns`; its error output on failure.
fn ipvsadm(ns: &NetNs, args: &[&str]) -> Result<(), String> {
    let out = ns
        .command("ipvsadm")
        .args(args)
        .output()
        .map_err(|e| format!("run ipvsadm: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// Issue #51, with a real IPVS (the VM guests' Debian kernels have `dummy`
/// and `ip_vs`; this host's kernel has neither, and the test says it
/// skips unless `EPM_EXPECT_IPVS=1`, which the guests set). kube-proxy's
/// layout: the ClusterIPs on the dummy `kube-ipvs0`, left down, and a
/// masquerading virtual service per port to a backend (the far host). A
/// wildcard hostPort 443 is published. Pods and node processes reach the
/// backend through each ClusterIP, also one made after the last CNI call;
/// the uplink's 443 reaches the ingress pod from outside and from a pod.
/// Then again with kube-proxy's guard in front (its `KUBE-CLUSTER-IP`
/// ipset `ACCEPT` first in nat `PREROUTING` and `OUTPUT`, here as one
/// rule for the Service range), which upstream portmap needs and ours
/// does not: the same answers.
#[test]
fn a_real_ipvs_service_is_never_a_host_ports() {
    let w = World::bridge();
    let expected = std::env::var_os("EPM_EXPECT_IPVS").is_some_and(|v| v == "1");
    let made = w
        .node
        .ns
        .command("ip")
        .args(["link", "add", "kube-ipvs0", "type", "dummy"])
        .output()
        .map(|out| out.status.success());
    if made.as_ref().map_or(true, |ok| !ok) || ipvsadm(&w.node.ns, &["-L", "-n"]).is_err() {
        assert!(
            !expected,
            "EPM_EXPECT_IPVS=1 but this kernel has no dummy device or no IPVS ({made:?})"
        );
        eprintln!("skipped: this kernel has no dummy device or no IPVS (the VM guests run it)");
        return;
    }
    let ingress = w.node.add_container("ingress");
    let client = w.node.add_container("client");
    let _ingress_servers = [
        tcp_echo_server(&ingress.ns, 8443, "ingress"),
        udp_echo_server(&ingress.ns, 8443, "ingress"),
    ];
    let _backend = [
        tcp_echo_server(&w.node.far, 443, "backend"),
        udp_echo_server(&w.node.far, 443, "backend"),
    ];
    let service = |vip: &str| {
        w.node
            .ns
            .ip(&["addr", "add", &format!("{vip}/32"), "dev", "kube-ipvs0"]);
        let backend = format!("{FAR_IP4}:443");
        for kind in ["-t", "-u"] {
            let virtual_service = format!("{vip}:443");
            for args in [
                vec!["-A", kind, virtual_service.as_str(), "-s", "rr"],
                vec![
                    "-a",
                    kind,
                    virtual_service.as_str(),
                    "-r",
                    backend.as_str(),
                    "-m",
                ],
            ] {
                ipvsadm(&w.node.ns, &args)
                    .unwrap_or_else(|e| panic!("ipvsadm {args:?}: {e}\n{}", w.dump()));
            }
        }
    };
    service("10.96.0.1");
    let mappings = [PortMapping::tcp(443, 8443), PortMapping::udp(443, 8443)];
    w.add(&ingress, &mappings);
    w.add(&client, &[]);
    // A Service made since the last CNI call.
    service("10.96.0.2");
    let answers = |when: &str| {
        for vip in ["10.96.0.1", "10.96.0.2"] {
            let target = sock(vip.parse::<IpAddr>().unwrap(), 443);
            for mode in ["tcp", "udp"] {
                expect(
                    &w,
                    &format!("pod -> Service {target} over {mode}, {when}"),
                    probe(&w, &client.ns, false, mode, target, "svc"),
                    target,
                    "backend",
                    "svc",
                );
                expect(
                    &w,
                    &format!("node process -> Service {target} over {mode}, {when}"),
                    probe(&w, &w.node.ns, true, mode, target, "svc"),
                    target,
                    "backend",
                    "svc",
                );
            }
        }
        let target = sock(IpAddr::V4(NODE_IP4), 443);
        for mode in ["tcp", "udp"] {
            for (who, ns) in [("external client", &w.node.ext), ("pod", &client.ns)] {
                expect(
                    &w,
                    &format!("{who} -> {target} over {mode}, {when}"),
                    probe(&w, ns, false, mode, target, "ing"),
                    target,
                    "ingress",
                    "ing",
                );
            }
        }
    };
    answers("without kube-proxy's guard");
    for chain in ["PREROUTING", "OUTPUT"] {
        w.node.ns.exec(
            "iptables",
            &[
                "-t",
                "nat",
                "-I",
                chain,
                "1",
                "-d",
                "10.96.0.0/24",
                "-j",
                "ACCEPT",
            ],
        );
    }
    answers("with kube-proxy's guard");
    w.del(&ingress, &mappings);
}

/// Issue #51: datagrams from the link that the node would deliver locally
/// but to none of its addresses (a subnet or limited broadcast, multicast,
/// an address it has no route to) are the node's, never a wildcard UDP
/// hostPort's: in the default mode and with `fastPath: true`, none reaches
/// the container, and the node's own socket on the port gets the
/// broadcasts as it would without the plugin. The same crafting to the
/// node's address reaches the container (the control).
fn datagrams_the_node_would_not_deliver_to_an_address(world: World) {
    let web = world.node.add_container("bcast");
    let _server = udp_echo_server(&web.ns, 53, "bcast");
    world.add(&web, &[PortMapping::udp(5399, 53)]);
    // After the ADD, which refuses a port the node listens on.
    let node_socket = udp_echo_server(&world.node.ns, 5399, "node");
    let node_mac = crafted::mac_of(&world.node.ns, NODE_UPLINK);
    let send = |dst: &str, mac: [u8; 6], sport: u16| {
        let dst: IpAddr = dst.parse().unwrap();
        let src: IpAddr = if dst.is_ipv4() {
            EXT_IP4.into()
        } else {
            EXT_IP6.into()
        };
        let packet = Crafted {
            transport: Transport::Udp,
            src,
            dst,
            sport,
            dport: 5399,
        };
        let before = crafted::transport_received(&web.ns);
        crafted::send_frame(&world.node.ext, "eth0", mac, &packet);
        std::thread::sleep(std::time::Duration::from_millis(150));
        (packet, crafted::transport_received(&web.ns) - before)
    };
    for (dst, sport) in [(NODE_IP4.to_string(), 42001), (NODE_IP6.to_string(), 42002)] {
        let (packet, reached) = send(&dst, node_mac, sport);
        assert!(
            reached >= 1,
            "{packet:?}: the control must reach the container, or this test proves nothing\n{}",
            world.dump()
        );
    }
    let broadcast_mac = [0xff; 6];
    let mut sport = 42100;
    let mut node_got = 0;
    for (dst, mac, node_receives) in [
        ("198.18.0.255", broadcast_mac, true),
        ("255.255.255.255", broadcast_mac, true),
        // A broadcast sent to the node's MAC, as a router would pass it on.
        ("198.18.0.255", node_mac, true),
        ("224.0.0.251", [0x01, 0x00, 0x5e, 0x00, 0x00, 0xfb], false),
        // All-nodes: every IPv6 interface is in the group.
        ("ff02::1", [0x33, 0x33, 0x00, 0x00, 0x00, 0x01], true),
    ] {
        sport += 1;
        let (packet, reached) = send(dst, mac, sport);
        assert_eq!(
            reached,
            0,
            "{packet:?} from the link reached the container\n{}",
            world.dump()
        );
        if node_receives {
            node_got += 1;
        }
    }
    let wait = std::time::Instant::now();
    while node_socket.peers().len() < node_got && wait.elapsed().as_secs() < 2 {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(
        node_socket.peers().len(),
        node_got,
        "the node's own socket on the port gets every broadcast\n{}",
        world.dump()
    );
    // Without a route: nothing forwards it and it is none of the node's.
    world.node.remove_default_routes();
    for (dst, sport) in [("203.0.113.7", 42201), ("2001:db8::7", 42202)] {
        let (packet, reached) = send(dst, node_mac, sport);
        assert_eq!(
            reached,
            0,
            "{packet:?} (no route) reached the container\n{}",
            world.dump()
        );
    }
    world.del(&web, &[PortMapping::udp(5399, 53)]);
}

#[test]
fn datagrams_the_node_would_not_deliver_to_an_address_stay_the_nodes() {
    datagrams_the_node_would_not_deliver_to_an_address(World::bridge());
}

#[test]
fn with_the_fast_path_datagrams_the_node_would_not_deliver_to_an_address_stay_the_nodes() {
    datagrams_the_node_would_not_deliver_to_an_address(bridge_world_with(
        "/plugins/1/fastPath",
        true,
    ));
}

/// The standard bridge world with one conflist key (a JSON pointer) set.
fn bridge_world_with(pointer: &'static str, value: bool) -> World {
    World::with(move |name, pins, data| {
        let mut json = portmap_tests::bridge_conflist(name, "ebpf-portmap", Some(pins), data)
            .json()
            .clone();
        let (parent, key) = pointer.rsplit_once('/').expect("pointer");
        json.pointer_mut(parent)
            .and_then(serde_json::Value::as_object_mut)
            .expect("parent object")
            .insert(key.to_owned(), serde_json::Value::Bool(value));
        portmap_tests::Conflist::from_json(json).expect("conflist")
    })
}

/// The bridge with hairpin mode off: the hairpin path goes through the
/// node's stack, not back out of the bridge port, so it works the same.
#[test]
fn bridge_without_hairpin_mode_node_localhost_and_hairpin_paths() {
    every_local_path(bridge_world_with("/plugins/0/hairpinMode", false));
}

/// masqAll: every translated flow is masqueraded, so the container sees
/// the node's address on its network, not the external client.
#[test]
fn masq_all_hides_the_client_behind_the_node() {
    let world = bridge_world_with("/plugins/1/masqAll", true);
    let web = world.node.add_container("masq");
    let server = tcp_echo_server(&web.ns, 80, "masq");
    world.add(&web, &[PortMapping::tcp(8080, 80)]);
    let target = sock(NODE_IP4, 8080);
    world.expect_answer(
        "external client with masqAll",
        portmap_tests::traffic::tcp_request(
            &world.node.ext,
            target,
            "m",
            portmap_tests::world::PROBE,
        ),
        &echo_reply("masq", "m"),
    );
    let peers = server.peers();
    assert!(
        !peers.is_empty()
            && peers
                .iter()
                .all(|p| p.ip() == IpAddr::V4(portmap_tests::topology::POD_GATEWAY4)),
        "the container sees the node's bridge address as the client: {peers:?}"
    );
    world.del(&web, &[PortMapping::tcp(8080, 80)]);
}

/// The node's addresses are synced into the plugin's maps by every ADD that
/// sees them changed (an unchanged node is not rewritten): an address added
/// after the first ADD is the node's for the socket hooks from the next ADD
/// on, also when nothing else about the node changed (the plugin alone
/// re-run for the same container, as a runtime retrying an ADD).
#[test]
fn an_address_added_to_the_node_is_local_from_the_next_add_on() {
    let world = World::bridge();
    let web = world.node.add_container("web");
    let _server = tcp_echo_server(&web.ns, 80, "web");
    let mappings = [PortMapping::tcp(8080, 80)];
    let prev = world.add(&web, &mappings);
    let added: IpAddr = "198.18.0.77".parse().unwrap();
    world.node.ns.ip(&[
        "addr",
        "add",
        &format!("{added}/24"),
        "dev",
        portmap_tests::topology::NODE_UPLINK,
    ]);
    let target = sock(added, 8080);
    assert!(
        probe(&world, &world.node.ns, true, "tcp", target, "before").is_err(),
        "before any ADD saw it, {added} is not a node address to the hooks: nothing listens on 8080"
    );
    world
        .exec_ours(
            portmap_tests::cni::CniCommand::Add,
            &web.with_port_mappings(&mappings),
            Some(&prev),
        )
        .unwrap_or_else(|e| panic!("re-ADD of web: {e}\n{}", world.dump()));
    expect(
        &world,
        "node -> added address after a re-ADD",
        probe(&world, &world.node.ns, true, "tcp", target, "after"),
        target,
        "web",
        "after",
    );
}

/// Sends one crafted packet from `ext` to the node's uplink MAC and returns
/// how many segments or datagrams the container's transport layer took in
/// because of it (the namespaces are otherwise quiet).
fn crafted_reaches(w: &World, container: &Container, packet: Crafted) -> u64 {
    let node_mac = crafted::mac_of(&w.node.ns, NODE_UPLINK);
    let before = crafted::transport_received(&container.ns);
    crafted::send_frame(&w.node.ext, "eth0", node_mac, &packet);
    // Time for the frame to cross two veths, or be dropped on the way.
    std::thread::sleep(std::time::Duration::from_millis(150));
    crafted::transport_received(&container.ns) - before
}

/// Issue #39: a neighbour on the node's link crafts packets (destination
/// MAC: the node's uplink) to loopback addresses, or from them, for a
/// loopback-bound and a wildcard host port. None is translated or reaches
/// the container; each is dropped and counted. The same packets to the
/// node's real address do reach it (so the crafting is sound), and the
/// node's own connections to its loopback-bound ports still work.
#[test]
fn crafted_loopback_packets_from_the_link_never_reach_a_container() {
    let world = World::bridge();
    let web = world.node.add_container("lo-web");
    let _servers = [
        tcp_echo_server(&web.ns, 80, "lo-web"),
        udp_echo_server(&web.ns, 53, "lo-web"),
    ];
    let lo4: IpAddr = "127.0.0.1".parse().unwrap();
    let lo6: IpAddr = "::1".parse().unwrap();
    world.add(
        &web,
        &[
            PortMapping::tcp(8097, 80).on(lo4),
            PortMapping::udp(8097, 53).on(lo4),
            PortMapping::tcp(8096, 80).on(lo6),
            PortMapping::udp(8096, 53).on(lo6),
            PortMapping::tcp(8098, 80),
            PortMapping::udp(8098, 53),
        ],
    );
    let ext4: IpAddr = EXT_IP4.into();
    let ext6: IpAddr = EXT_IP6.into();
    let node4: IpAddr = NODE_IP4.into();
    let node6: IpAddr = NODE_IP6.into();
    let crafted_cases: [(IpAddr, IpAddr, u16); 8] = [
        (ext4, lo4, 8097),
        (ext4, lo4, 8098),
        (ext4, "127.1.2.3".parse().unwrap(), 8098),
        (ext6, lo6, 8096),
        (ext6, lo6, 8098),
        (ext6, "::ffff:127.0.0.1".parse().unwrap(), 8098),
        // A loopback source to the node's real address.
        (lo4, node4, 8098),
        (lo6, node6, 8098),
    ];
    let mut sport = 41000;
    let mut sent = 0;
    let drops_before = counter(&world.counters(), "drop_loopback");
    for transport in [Transport::TcpSyn, Transport::Udp] {
        // The control: the same crafting to the node's address arrives.
        for (src, dst) in [(ext4, node4), (ext6, node6)] {
            sport += 1;
            let packet = Crafted {
                transport,
                src,
                dst,
                sport,
                dport: 8098,
            };
            assert!(
                crafted_reaches(&world, &web, packet) >= 1,
                "{packet:?}: a crafted packet to the node's address must reach the \
                 container, or this test proves nothing\n{}",
                world.dump()
            );
        }
        for (src, dst, dport) in crafted_cases {
            sport += 1;
            let packet = Crafted {
                transport,
                src,
                dst,
                sport,
                dport,
            };
            let reached = crafted_reaches(&world, &web, packet);
            sent += 1;
            assert_eq!(
                reached,
                0,
                "{packet:?} from the link reached the container\n{}",
                world.dump()
            );
        }
    }
    assert_eq!(
        counter(&world.counters(), "drop_loopback") - drops_before,
        sent,
        "every crafted loopback packet is dropped and counted as drop_loopback\n{}",
        world.dump()
    );
    // The node's own processes still reach the loopback-bound ports.
    for (target, mode) in [
        (sock(lo4, 8097), "tcp"),
        (sock(lo4, 8097), "udp"),
        (sock(lo6, 8096), "tcp"),
        (sock(lo6, 8096), "udp"),
    ] {
        expect(
            &world,
            &format!("node -> {target} {mode}"),
            probe(&world, &world.node.ns, true, mode, target, "own"),
            target,
            "lo-web",
            "own",
        );
    }
    world.del(&web, &[]);
}

/// Issue #28: a process in the hooked cgroup but in another network
/// namespace (a client joined to the node by a veth, with no route beyond
/// their shared subnet, as a nested lab's "outside" is) dials host ports on
/// the node's address: the hooks leave its sockets alone (rewritten to the
/// container's address, its connect() would fail with ENETUNREACH) and it
/// is served by the packet path, on a specific hostIP and a wildcard one,
/// TCP, UDP and SCTP (where the kernel has SCTP: the VM kernels must), v4
/// and v6.
#[test]
fn a_client_namespace_in_the_hooked_cgroup_is_served_by_the_packet_path() {
    let world = World::bridge();
    let side = world
        .node
        .add_side_link("side0", "198.51.100.1/24", "198.51.100.2/24");
    world.node.add_address("side0", "fd51::1/64");
    side.ip(&["addr", "add", "fd51::2/64", "dev", "eth0", "nodad"]);
    let side4: IpAddr = "198.51.100.1".parse().unwrap();
    let side6: IpAddr = "fd51::1".parse().unwrap();
    let web = world.node.add_container("side-web");
    let sctp = sctp_available(&web.ns);
    let mut servers = vec![
        tcp_echo_server(&web.ns, 80, "side-web"),
        udp_echo_server(&web.ns, 53, "side-web"),
    ];
    let mut mappings = vec![
        PortMapping::tcp(8080, 80),
        PortMapping::udp(5353, 53),
        PortMapping::tcp(8081, 80).on(side4),
        PortMapping::udp(5354, 53).on(side4),
        PortMapping::tcp(8082, 80).on(side6),
        PortMapping::udp(5355, 53).on(side6),
    ];
    let mut targets = vec![
        (sock(side4, 8080), "tcp"),
        (sock(side4, 5353), "udp"),
        (sock(side4, 8081), "tcp"),
        (sock(side4, 5354), "udp"),
        (sock(side6, 8080), "tcp"),
        (sock(side6, 5353), "udp"),
        (sock(side6, 8082), "tcp"),
        (sock(side6, 5355), "udp"),
    ];
    if sctp {
        servers.push(sctp_echo_server(&web.ns, 9899, "side-web"));
        mappings.extend([
            PortMapping::sctp(9900, 9899),
            PortMapping::sctp(9901, 9899).on(side4),
            PortMapping::sctp(9902, 9899).on(side6),
        ]);
        targets.extend([
            (sock(side4, 9900), "sctp"),
            (sock(side4, 9901), "sctp"),
            (sock(side6, 9900), "sctp"),
            (sock(side6, 9902), "sctp"),
        ]);
    }
    world.add(&web, &mappings);
    let before = world.counters();
    for &(target, mode) in &targets {
        expect(
            &world,
            &format!("hooked client namespace -> {target} {mode}"),
            probe(&world, &side, true, mode, target, "s"),
            target,
            "side-web",
            "s",
        );
    }
    let after = world.counters();
    assert_eq!(
        counter(&after, "sock_translated"),
        counter(&before, "sock_translated"),
        "no socket of the client namespace may be rewritten"
    );
    assert!(
        counter(&after, "sock_other_netns") >= counter(&before, "sock_other_netns") + 8,
        "each dial is counted as another namespace's: {after:#}"
    );
    drop(servers);
}

/// Issue #28: a hooked process in a container dialling a host port through
/// the node's address takes the hairpin path the README documents: the
/// answering container sees the node's address on the bridge (masqueraded
/// with `snat`), not the client pod, for its own port and another
/// container's; the hooks rewrite nothing. The node's own processes are
/// still translated at the socket.
#[test]
fn hooked_containers_take_the_masqueraded_hairpin_path() {
    let world = World::bridge();
    let web = world.node.add_container("hp-web");
    let other = world.node.add_container("hp-other");
    let tcp_server = tcp_echo_server(&web.ns, 80, "hp-web");
    let udp_server = udp_echo_server(&web.ns, 53, "hp-web");
    world.add(
        &web,
        &[PortMapping::tcp(8080, 80), PortMapping::udp(5353, 53)],
    );
    world.add(&other, &[]);
    let before = world.counters();
    for client in [&web, &other] {
        for (node_ip, gateway) in [
            (IpAddr::V4(NODE_IP4), IpAddr::V4(POD_GATEWAY4)),
            (IpAddr::V6(NODE_IP6), IpAddr::V6(POD_GATEWAY6)),
        ] {
            for (target, mode, server) in [
                (sock(node_ip, 8080), "tcp", &tcp_server),
                (sock(node_ip, 5353), "udp", &udp_server),
            ] {
                let seen_before = server.peers().len();
                expect(
                    &world,
                    &format!("{} (hooked) -> {target} {mode}", client.id),
                    probe(&world, &client.ns, true, mode, target, "hp"),
                    target,
                    "hp-web",
                    "hp",
                );
                let peers = server.peers();
                assert!(
                    peers.len() > seen_before
                        && peers[seen_before..].iter().all(|p| p.ip() == gateway),
                    "{} -> {target} {mode}: the container must see the node's bridge \
                     address {gateway}, saw {:?}",
                    client.id,
                    &peers[seen_before..]
                );
            }
        }
    }
    let after = world.counters();
    assert_eq!(
        counter(&after, "sock_translated"),
        counter(&before, "sock_translated"),
        "no container socket may be rewritten"
    );
    assert!(
        counter(&after, "masq") >= counter(&before, "masq") + 8,
        "every hairpin flow is masqueraded: {after:#}"
    );
    // The node's own process: translated at the socket.
    let target = sock(NODE_IP4, 8080);
    expect(
        &world,
        "node (hooked) -> node address",
        probe(&world, &world.node.ns, true, "tcp", target, "n"),
        target,
        "hp-web",
        "n",
    );
    assert!(
        counter(&world.counters(), "sock_translated") > counter(&after, "sock_translated"),
        "the node's own connection is translated at the socket"
    );
}
