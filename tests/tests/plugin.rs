//! ebpf-portmap in a real chain: Debian's `bridge`/`ptp` + `host-local`,
//! driven the way libcni drives it, with real TCP and UDP traffic over IPv4
//! and IPv6 from an external client namespace. Needs root.
//!
//! Every test has its own node, client and container namespaces and its own
//! bpffs pin root, so the tests run in parallel and clean up on drop.

use std::net::IpAddr;

use portmap_tests::cni::CniCommand;
use portmap_tests::topology::{
    EXT_IP4, FAR_IP4, NODE_IP4, NODE_IP4_SECONDARY, NODE_IP6, NODE_IP6_SECONDARY,
};
use portmap_tests::traffic::{
    echo_reply, tcp_connect, tcp_echo_server, tcp_request, udp_echo_server, udp_request,
};
use portmap_tests::world::{GONE, PROBE, World, expect_unreachable, sock};
use portmap_tests::{Container, Node, PortMapping};

fn reachable_over_both_families(world: World) {
    let web = world.node.add_container("web");
    let _tcp = tcp_echo_server(&web.ns, 80, "web");
    let _udp = udp_echo_server(&web.ns, 53, "web");
    let mappings = [PortMapping::tcp(8080, 80), PortMapping::udp(5353, 53)];
    let result = world.add(&web, &mappings);
    assert!(
        result.get("ips").is_some(),
        "ADD must echo the previous result: {result}"
    );

    for ip in [IpAddr::V4(NODE_IP4), IpAddr::V6(NODE_IP6)] {
        world.expect_answer(
            &format!("TCP via {ip}:8080"),
            tcp_request(&world.node.ext, sock(ip, 8080), "hello", PROBE),
            &echo_reply("web", "hello"),
        );
        world.expect_answer(
            &format!("UDP via {ip}:5353"),
            udp_request(&world.node.ext, sock(ip, 5353), "query", PROBE),
            &echo_reply("web", "query"),
        );
    }
    // A long-lived connection keeps working across many requests.
    let mut session = tcp_connect(&world.node.ext, sock(NODE_IP4, 8080), PROBE)
        .unwrap_or_else(|e| panic!("connect: {e}"));
    for i in 0..20 {
        let payload = format!("request {i}");
        assert_eq!(
            session
                .request(&payload, PROBE)
                .expect("request on open connection"),
            echo_reply("web", &payload)
        );
    }
    drop(session);

    world
        .runner
        .check(&world.list, &web.with_port_mappings(&mappings))
        .unwrap_or_else(|e| panic!("CHECK of a live container failed: {e}"));
    let listed = world.list();
    assert_eq!(
        listed.as_array().map(Vec::len),
        Some(4),
        "two mappings, two families each: {listed:#}"
    );

    world.del(&web, &mappings);
    for ip in [IpAddr::V4(NODE_IP4), IpAddr::V6(NODE_IP6)] {
        expect_unreachable(
            "TCP after DEL",
            tcp_request(&world.node.ext, sock(ip, 8080), "late", GONE),
        );
        expect_unreachable(
            "UDP after DEL",
            udp_request(&world.node.ext, sock(ip, 5353), "late", GONE),
        );
    }
    assert_eq!(
        world.mapping_count(),
        0,
        "DEL left mappings: {}",
        world.dump()
    );
    assert!(
        world
            .runner
            .check(&world.list, &web.with_port_mappings(&mappings))
            .is_err(),
        "CHECK after DEL must fail"
    );
    assert_no_nat_rules(&world.node);
}

/// No iptables or nftables NAT rule exists in the node: everything is eBPF.
fn assert_no_nat_rules(node: &Node) {
    for tool in ["iptables-save", "ip6tables-save"] {
        let out = node.ns.command(tool).output().expect("iptables-save");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            !text.contains("DNAT") && !text.contains("CNI-HOSTPORT"),
            "{tool} shows port-mapping rules:\n{text}"
        );
    }
}

#[test]
fn bridge_tcp_and_udp_over_ipv4_and_ipv6() {
    reachable_over_both_families(World::bridge());
}

#[test]
fn ptp_tcp_and_udp_over_ipv4_and_ipv6() {
    reachable_over_both_families(World::ptp());
}

#[test]
fn host_ip_mapping_answers_only_on_its_address() {
    let world = World::bridge();
    let web = world.node.add_container("hostip");
    let _tcp = tcp_echo_server(&web.ns, 80, "hostip");
    let mappings = [
        PortMapping::tcp(8080, 80).on(NODE_IP4_SECONDARY.into()),
        PortMapping::tcp(8080, 80).on(NODE_IP6_SECONDARY.into()),
    ];
    world.add(&web, &mappings);
    for ip in [
        IpAddr::V4(NODE_IP4_SECONDARY),
        IpAddr::V6(NODE_IP6_SECONDARY),
    ] {
        world.expect_answer(
            &format!("TCP via hostIP {ip}"),
            tcp_request(&world.node.ext, sock(ip, 8080), "on-host-ip", PROBE),
            &echo_reply("hostip", "on-host-ip"),
        );
    }
    for ip in [IpAddr::V4(NODE_IP4), IpAddr::V6(NODE_IP6)] {
        expect_unreachable(
            "another node address",
            tcp_request(&world.node.ext, sock(ip, 8080), "elsewhere", GONE),
        );
    }
    world.del(&web, &mappings);
}

#[test]
fn transit_traffic_to_a_mapped_port_is_not_captured() {
    let world = World::bridge();
    let web = world.node.add_container("transit");
    let _container = tcp_echo_server(&web.ns, 80, "container");
    let _far = tcp_echo_server(&world.node.far, 8080, "far-host");
    let _far_udp = udp_echo_server(&world.node.far, 8080, "far-host");
    let mappings = [PortMapping::tcp(8080, 80), PortMapping::udp(8080, 80)];
    world.add(&web, &mappings);
    // The client talks to a host behind the node on the mapped port: the node
    // routes it; the container must not get it.
    world.expect_answer(
        "TCP to 198.19.0.2:8080 through the node",
        tcp_request(&world.node.ext, sock(FAR_IP4, 8080), "transit", PROBE),
        &echo_reply("far-host", "transit"),
    );
    world.expect_answer(
        "UDP to 198.19.0.2:8080 through the node",
        udp_request(&world.node.ext, sock(FAR_IP4, 8080), "transit", PROBE),
        &echo_reply("far-host", "transit"),
    );
    world.del(&web, &mappings);
}

#[test]
fn a_second_container_cannot_take_a_held_port() {
    let world = World::bridge();
    let first = world.node.add_container("first");
    let second = world.node.add_container("second");
    let _a = tcp_echo_server(&first.ns, 80, "first");
    let _b = tcp_echo_server(&second.ns, 80, "second");
    let first_mappings = [PortMapping::tcp(8080, 80)];
    world.add(&first, &first_mappings);
    let before = world.maps();

    // 9090 is free, 8080 is not: nothing of the request may stay behind.
    let second_mappings = [PortMapping::tcp(9090, 80), PortMapping::tcp(8080, 80)];
    let error = world
        .runner
        .add(&world.list, &second.with_port_mappings(&second_mappings))
        .expect_err("a conflicting ADD must fail");
    assert_eq!(error.plugin, "ebpf-portmap", "our plugin refuses: {error}");
    assert_eq!(error.error_code(), Some(100), "port conflict code: {error}");
    let msg = error.error_msg().unwrap_or_default().to_owned();
    assert!(
        msg.contains("8080/tcp") && msg.contains("first"),
        "the error names the port and the holder: {msg}"
    );
    assert_eq!(
        world.maps(),
        before,
        "a failed ADD leaves the maps as they were"
    );
    expect_unreachable(
        "the half-requested 9090",
        tcp_request(&world.node.ext, sock(NODE_IP4, 9090), "x", GONE),
    );
    world.expect_answer(
        "the holder keeps its port",
        tcp_request(&world.node.ext, sock(NODE_IP4, 8080), "still", PROBE),
        &echo_reply("first", "still"),
    );
    // The runtime cleans up the failed container; that must not touch the holder.
    world.del(&second, &second_mappings);
    world.expect_answer(
        "the holder after the loser's DEL",
        tcp_request(&world.node.ext, sock(NODE_IP4, 8080), "again", PROBE),
        &echo_reply("first", "again"),
    );

    // Same port with another protocol, or on a distinct hostIP, is no conflict.
    let third = world.node.add_container("third");
    let _c = udp_echo_server(&third.ns, 80, "third");
    world.add(&third, &[PortMapping::udp(8080, 80)]);
    world.expect_answer(
        "UDP 8080 next to TCP 8080",
        udp_request(&world.node.ext, sock(NODE_IP4, 8080), "udp", PROBE),
        &echo_reply("third", "udp"),
    );
    world.del(&third, &[PortMapping::udp(8080, 80)]);
    world.del(&first, &first_mappings);
}

#[test]
fn del_restores_the_maps_exactly_and_is_idempotent() {
    let world = World::bridge();
    let keeper = world.node.add_container("keeper");
    world.add(&keeper, &[PortMapping::tcp(7000, 80)]);
    let before = world.maps();

    let web = world.node.add_container("web");
    let mappings = [PortMapping::tcp(8080, 80), PortMapping::udp(8081, 81)];
    let result = world.add(&web, &mappings);
    let after_add = world.maps();
    assert_ne!(after_add, before, "ADD changed the maps");
    // Re-ADD by the same owner is idempotent (run our plugin alone: the
    // bridge plugin refuses a second ADD of the same interface).
    let rt = web.with_port_mappings(&mappings);
    world
        .exec_ours(CniCommand::Add, &rt, Some(&result))
        .unwrap_or_else(|e| panic!("re-ADD by the same owner failed: {e}"));
    assert_eq!(world.maps(), after_add, "re-ADD changes nothing");

    // DEL without runtimeConfig (upstream leaks here), twice.
    for _ in 0..2 {
        world
            .runner
            .del(&world.list, &web.attachment(serde_json::json!({})))
            .unwrap_or_else(|e| panic!("DEL failed: {e}"));
    }
    assert_eq!(
        world.maps(),
        before,
        "DEL leaves the maps exactly as before ADD"
    );
    assert!(world.runner.invoked("ebpf-portmap", CniCommand::Del));
    world.del(&keeper, &[PortMapping::tcp(7000, 80)]);
    assert_eq!(world.mapping_count(), 0);
}

#[test]
fn add_del_add_cycles_of_100_containers_leave_nothing_behind() {
    let world = World::bridge();
    let containers: Vec<Container> = (0..100)
        .map(|i| world.node.add_container(&format!("cyc{i}")))
        .collect();
    let mappings = |i: usize| {
        [
            PortMapping::tcp(20000 + i as u16, 80),
            PortMapping::udp(20000 + i as u16, 53),
        ]
    };
    for round in 0..2 {
        for (i, container) in containers.iter().enumerate() {
            world.add(container, &mappings(i));
        }
        assert_eq!(
            world.mapping_count(),
            100 * 2 * 2,
            "round {round}: every container holds 2 mappings x 2 families"
        );
        for (i, container) in containers.iter().enumerate() {
            world.del(container, &mappings(i));
        }
        world.assert_clean(&format!("round {round}, after DEL of all"));
    }
    // The last container's port still works after all that churn.
    let last = &containers[99];
    let _tcp = tcp_echo_server(&last.ns, 80, "last");
    world.add(last, &mappings(99));
    world.expect_answer(
        "TCP after 200 cycles",
        tcp_request(&world.node.ext, sock(NODE_IP4, 20099), "alive", PROBE),
        &echo_reply("last", "alive"),
    );
    world.del(last, &mappings(99));
}

#[test]
fn the_container_sees_the_real_client_address() {
    let world = World::bridge();
    let web = world.node.add_container("peer");
    let tcp = tcp_echo_server(&web.ns, 80, "peer");
    world.add(&web, &[PortMapping::tcp(8080, 80)]);
    world.expect_answer(
        "TCP",
        tcp_request(&world.node.ext, sock(NODE_IP4, 8080), "who", PROBE),
        &echo_reply("peer", "who"),
    );
    assert!(
        tcp.peers().iter().any(|p| p.ip() == IpAddr::V4(EXT_IP4)),
        "no masquerade for external clients: the container sees the client, saw {:?}",
        tcp.peers()
    );
    world.del(&web, &[PortMapping::tcp(8080, 80)]);
}

/// A world whose ebpf-portmap entry has `fastPath` set to `on`.
fn fast_path_world(ptp: bool, on: bool) -> World {
    World::with(move |name, pins, data| {
        let list = if ptp {
            portmap_tests::topology::ptp_conflist(name, "ebpf-portmap", Some(pins), data)
        } else {
            portmap_tests::bridge_conflist(name, "ebpf-portmap", Some(pins), data)
        };
        let mut json = list.json().clone();
        json["plugins"][1]["fastPath"] = serde_json::Value::Bool(on);
        portmap_tests::Conflist::from_json(json).expect("conflist")
    })
}

/// The dataplane's counters by reason, as `status --json` reports them.
fn reason_counters(world: &World) -> serde_json::Value {
    portmap_tests::world::operator_json(&world.node.ns, world.pins.path(), "status")["counters"]
        .clone()
}

/// Runs `tool args` in the node namespace (the test's own), asserting success.
fn in_node(world: &World, tool: &str, args: &str) {
    let out = world
        .node
        .ns
        .command(tool)
        .args(args.split(' '))
        .output()
        .expect(tool);
    assert!(
        out.status.success(),
        "{tool} {args}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// fastPath: packets from outside are handed straight to the container's
/// veth and the answers straight to the client's interface, in both
/// families and both protocols; egress still translates the answers back.
/// What proves the node's stack is skipped: a FORWARD rule dropping the
/// container's traffic in the node no longer sees it. The same rule does
/// block the normal path (so this test can tell the two apart).
fn fast_path_hands_packets_over(ptp: bool) {
    let world = fast_path_world(ptp, true);
    let web = world.node.add_container("web");
    let tcp = tcp_echo_server(&web.ns, 80, "web");
    let _udp = udp_echo_server(&web.ns, 53, "web");
    let mappings = [PortMapping::tcp(8080, 80), PortMapping::udp(5353, 53)];
    let result = world.add(&web, &mappings);
    let container_ips = portmap_tests::cni::result_addresses(&result);
    let exchange = |world: &World, when: &str| {
        for ip in [IpAddr::V4(NODE_IP4), IpAddr::V6(NODE_IP6)] {
            world.expect_answer(
                &format!("{when}: TCP via {ip}:8080"),
                tcp_request(&world.node.ext, sock(ip, 8080), "hello", PROBE),
                &echo_reply("web", "hello"),
            );
            world.expect_answer(
                &format!("{when}: UDP via {ip}:5353"),
                udp_request(&world.node.ext, sock(ip, 5353), "query", PROBE),
                &echo_reply("web", "query"),
            );
        }
    };
    exchange(&world, "fast path");
    let counters = reason_counters(&world);
    for reason in ["fast_forward", "fast_reply", "reply"] {
        assert!(
            counters[reason].as_u64().is_some_and(|n| n > 0),
            "{reason} not counted: {counters:#}\n{}",
            world.dump()
        );
    }
    assert!(
        tcp.peers().iter().any(|p| p.ip() == IpAddr::V4(EXT_IP4)),
        "the container sees the real client, saw {:?}",
        tcp.peers()
    );

    for ip in &container_ips {
        let tool = if ip.is_ipv4() {
            "iptables"
        } else {
            "ip6tables"
        };
        in_node(&world, tool, &format!("-I FORWARD -d {ip} -j DROP"));
        in_node(&world, tool, &format!("-I FORWARD -s {ip} -j DROP"));
    }
    exchange(
        &world,
        "fast path, FORWARD dropping the container's traffic",
    );

    // The same node with fastPath off: the rule holds.
    let slow = fast_path_world(ptp, false);
    let web = slow.node.add_container("web");
    let _tcp = tcp_echo_server(&web.ns, 80, "web");
    let result = slow.add(&web, &[PortMapping::tcp(8080, 80)]);
    let ip4 = portmap_tests::cni::result_addresses(&result)
        .into_iter()
        .find(IpAddr::is_ipv4)
        .expect("an IPv4 address");
    slow.expect_answer(
        "normal path",
        tcp_request(&slow.node.ext, sock(NODE_IP4, 8080), "hello", PROBE),
        &echo_reply("web", "hello"),
    );
    in_node(&slow, "iptables", &format!("-I FORWARD -d {ip4} -j DROP"));
    expect_unreachable(
        "normal path, FORWARD dropping the container's traffic",
        tcp_request(&slow.node.ext, sock(NODE_IP4, 8080), "late", GONE),
    );
    let counters = reason_counters(&slow);
    assert_eq!(counters["fast_forward"], 0, "{counters:#}");
    assert_eq!(counters["fast_reply"], 0, "{counters:#}");
}

#[test]
fn fast_path_hands_packets_over_on_a_bridge() {
    fast_path_hands_packets_over(false);
}

#[test]
fn fast_path_hands_packets_over_on_ptp() {
    fast_path_hands_packets_over(true);
}
