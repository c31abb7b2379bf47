//! Upstream portmap's `conditionsV4`/`conditionsV6`, honoured: a client the
//! conditions do not admit reaches the host port as if no mapping existed,
//! one they admit is translated; unsupported conditions are refused with
//! code 7 and change nothing. Real chains (bridge + host-local +
//! ebpf-portmap), real traffic from `ext` (198.18.0.2, fd18::2, arriving on
//! the node's `eth0`) and `far` (198.19.0.2, fd19::2, arriving on `eth1`).
//! Needs root.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use portmap_tests::cni::CniCommand;
use portmap_tests::topology::{NODE_IP4, NODE_IP6};
use portmap_tests::traffic::{
    echo_reply, tcp_connect, tcp_echo_server, tcp_request, udp_echo_server, udp_request,
};
use portmap_tests::world::{GONE, PROBE, World, counter, expect_unreachable, sock};
use portmap_tests::{Container, NetNs, PortMapping};
use serde_json::{Value, json};

/// bridge + host-local + ebpf-portmap, with `conditions` (an object of
/// `conditionsV4`/`conditionsV6`) in ebpf-portmap's entry.
fn world_with(conditions: Value) -> World {
    World::with(move |name, pins, data| {
        let list = portmap_tests::bridge_conflist(name, "ebpf-portmap", Some(pins), data);
        let mut json = list.json().clone();
        let ours = json["plugins"][1]
            .as_object_mut()
            .expect("ebpf-portmap's entry");
        assert_eq!(ours["type"], "ebpf-portmap", "second plugin of the chain");
        ours.extend(conditions.as_object().expect("an object").clone());
        portmap_tests::Conflist::from_json(json).expect("conflist")
    })
}

/// A container serving TCP 80 and UDP 53 as `name`, mapped from 8080 and 5353.
fn serve(world: &World, name: &str) -> (Container, Vec<portmap_tests::traffic::ServerHandle>) {
    let web = world.node.add_container(name);
    let servers = vec![
        tcp_echo_server(&web.ns, 80, name),
        udp_echo_server(&web.ns, 53, name),
    ];
    world.add(&web, &mappings());
    (web, servers)
}

fn mappings() -> [PortMapping; 2] {
    [PortMapping::tcp(8080, 80), PortMapping::udp(5353, 53)]
}

fn node_ips() -> [IpAddr; 2] {
    [IpAddr::V4(NODE_IP4), IpAddr::V6(NODE_IP6)]
}

/// `client` reaches `name` by TCP (and UDP when `udp`) on every node address.
fn reaches(world: &World, client: &NetNs, who: &str, name: &str, udp: bool) {
    for ip in node_ips() {
        world.expect_answer(
            &format!("TCP from {who} via {ip}:8080"),
            tcp_request(client, sock(ip, 8080), "hello", PROBE),
            &echo_reply(name, "hello"),
        );
        if udp {
            world.expect_answer(
                &format!("UDP from {who} via {ip}:5353"),
                udp_request(client, sock(ip, 5353), "query", PROBE),
                &echo_reply(name, "query"),
            );
        }
    }
}

/// `client` does not reach the container by TCP (and UDP when `udp`).
fn refused(client: &NetNs, who: &str, udp: bool) {
    for ip in node_ips() {
        expect_unreachable(
            &format!("TCP from {who} via {ip}:8080 (outside the conditions)"),
            tcp_request(client, sock(ip, 8080), "denied", GONE),
        );
        if udp {
            expect_unreachable(
                &format!("UDP from {who} via {ip}:5353 (outside the conditions)"),
                udp_request(client, sock(ip, 5353), "denied", GONE),
            );
        }
    }
}

/// Entries of the pinned conditions map.
fn condition_entries(world: &World) -> usize {
    world.dump_map("conditions").as_array().map_or(0, Vec::len)
}

#[test]
fn a_source_outside_the_conditions_cannot_connect_one_inside_can() {
    let world = world_with(json!({
        "conditionsV4": ["-s", "198.18.0.0/24"],
        "conditionsV6": ["-s", "fd18::/64"],
    }));
    let (web, _servers) = serve(&world, "web");
    let before = counter(&world.counters(), "skip_conditions");
    reaches(&world, &world.node.ext, "ext", "web", true);
    refused(&world.node.far, "far", true);
    let after = counter(&world.counters(), "skip_conditions");
    assert!(
        after >= before + 4,
        "every refused new flow is counted as skip_conditions ({before} -> {after}):\n{}",
        world.dump()
    );
    // An established flow keeps working whatever a new flow is judged by.
    let mut session = tcp_connect(&world.node.ext, sock(NODE_IP4, 8080), PROBE)
        .unwrap_or_else(|e| panic!("connect: {e}"));
    assert_eq!(
        session.request("again", PROBE).expect("established flow"),
        echo_reply("web", "again")
    );
    assert_eq!(condition_entries(&world), 2, "one entry per family");
    world
        .runner
        .check(&world.list, &web.with_port_mappings(&mappings()))
        .unwrap_or_else(|e| panic!("CHECK of a container with conditions failed: {e}"));
    drop(session);
    world.del(&web, &mappings());
    assert_eq!(condition_entries(&world), 0, "DEL removes the conditions");
    world.assert_clean("after DEL");
}

#[test]
fn negated_sources_refuse_only_the_sources_they_name() {
    let world = world_with(json!({
        "conditionsV4": ["!", "-s", "198.19.0.0/24"],
        "conditionsV6": ["!", "--source", "fd19::2"],
    }));
    let (web, _servers) = serve(&world, "web");
    reaches(&world, &world.node.ext, "ext", "web", true);
    refused(&world.node.far, "far", true);
    world.del(&web, &mappings());
}

#[test]
fn only_ipv4_conditions_leave_ipv6_open() {
    let world = world_with(json!({"conditionsV4": ["-s", "198.18.0.0/24"]}));
    let (web, _servers) = serve(&world, "web");
    expect_unreachable(
        "TCP from far via IPv4 (outside conditionsV4)",
        tcp_request(&world.node.far, sock(NODE_IP4, 8080), "denied", GONE),
    );
    world.expect_answer(
        "TCP from far via IPv6 (no conditionsV6)",
        tcp_request(&world.node.far, sock(NODE_IP6, 8080), "open", PROBE),
        &echo_reply("web", "open"),
    );
    assert_eq!(condition_entries(&world), 1, "IPv4 only");
    world.del(&web, &mappings());
}

#[test]
fn protocol_and_in_interface_conditions() {
    let world = world_with(json!({
        "conditionsV4": ["-p", "tcp", "-i", "eth0"],
        "conditionsV6": ["-p", "tcp", "-i", "eth0"],
    }));
    let (web, _servers) = serve(&world, "web");
    // ext arrives on eth0: TCP passes, UDP is not tcp.
    reaches(&world, &world.node.ext, "ext", "web", false);
    for ip in node_ips() {
        expect_unreachable(
            &format!("UDP from ext via {ip} (-p tcp)"),
            udp_request(&world.node.ext, sock(ip, 5353), "denied", GONE),
        );
    }
    // far arrives on eth1.
    refused(&world.node.far, "far (arrives on eth1)", false);
    world.del(&web, &mappings());

    let world = world_with(json!({
        "conditionsV4": ["!", "-i", "eth0", "!", "-p", "udp"],
        "conditionsV6": ["!", "--in-interface", "eth0"],
    }));
    let (web, _servers) = serve(&world, "web");
    reaches(&world, &world.node.far, "far", "web", false);
    expect_unreachable(
        "UDP from far via IPv4 (! -p udp)",
        udp_request(&world.node.far, sock(NODE_IP4, 5353), "denied", GONE),
    );
    refused(&world.node.ext, "ext (arrives on eth0)", true);
    world.del(&web, &mappings());
}

#[test]
fn containers_of_one_configuration_keep_their_own_conditions() {
    let world = world_with(json!({
        "conditionsV4": ["-s", "198.18.0.2"],
        "conditionsV6": ["-s", "fd18::2"],
    }));
    let first = world.node.add_container("first");
    let second = world.node.add_container("second");
    let _servers = [
        tcp_echo_server(&first.ns, 80, "first"),
        tcp_echo_server(&second.ns, 80, "second"),
    ];
    let first_mappings = [PortMapping::tcp(8080, 80)];
    let second_mappings = [PortMapping::tcp(8081, 80)];
    world.add(&first, &first_mappings);
    world.add(&second, &second_mappings);
    assert_eq!(condition_entries(&world), 4, "two owners, two families");
    world.del(&first, &first_mappings);
    assert_eq!(
        condition_entries(&world),
        2,
        "DEL of one container leaves the other's conditions"
    );
    for ip in node_ips() {
        world.expect_answer(
            &format!("TCP from ext via {ip}:8081 after the first container's DEL"),
            tcp_request(&world.node.ext, sock(ip, 8081), "still", PROBE),
            &echo_reply("second", "still"),
        );
        expect_unreachable(
            &format!("TCP from far via {ip}:8081: still enforced"),
            tcp_request(&world.node.far, sock(ip, 8081), "denied", GONE),
        );
    }
    world.del(&second, &second_mappings);
    assert_eq!(condition_entries(&world), 0);
    world.assert_clean("after both DELs");
}

#[test]
fn a_re_add_without_conditions_opens_the_port_to_everyone() {
    let world = world_with(json!({"conditionsV4": ["-s", "198.18.0.0/24"]}));
    let web = world.node.add_container("web");
    let _server = tcp_echo_server(&web.ns, 80, "web");
    let rt = web.with_port_mappings(&mappings());
    let result = world
        .runner
        .add(&world.list, &rt)
        .unwrap_or_else(|e| panic!("ADD: {e}"));
    expect_unreachable(
        "TCP from far under conditions",
        tcp_request(&world.node.far, sock(NODE_IP4, 8080), "denied", GONE),
    );
    // Our plugin alone, ADD again with the same container and prevResult,
    // from a configuration without the conditions.
    let mut config = world.our_config(&rt, Some(&result));
    config
        .as_object_mut()
        .expect("an object")
        .remove("conditionsV4");
    world
        .runner
        .exec_plugin("ebpf-portmap", CniCommand::Add, Some(&rt), &config)
        .unwrap_or_else(|e| panic!("re-ADD without conditions: {e}"));
    assert_eq!(condition_entries(&world), 0, "the re-ADD removed them");
    world.expect_answer(
        "TCP from far once the conditions are gone",
        tcp_request(&world.node.far, sock(NODE_IP4, 8080), "open", PROBE),
        &echo_reply("web", "open"),
    );
    world.del(&web, &mappings());
}

#[test]
fn unsupported_conditions_are_refused_with_code_7_and_change_nothing() {
    for (conditions, names) in [
        (
            json!({"conditionsV4": ["-m", "comment", "--comment", "x"]}),
            "conditionsV4[0]",
        ),
        (
            json!({"conditionsV4": ["-s", "10.0.0.0/8", "-o", "eth0"]}),
            "conditionsV4[2]",
        ),
        (
            json!({"conditionsV6": ["-s", "10.0.0.0/8"]}),
            "conditionsV6[1]",
        ),
        (
            json!({"conditionsV4": ["-s", "10.0.0.0/40"]}),
            "conditionsV4[1]",
        ),
        (json!({"conditionsV4": ["-p", "icmp"]}), "conditionsV4[1]"),
    ] {
        let world = world_with(conditions.clone());
        // A container of another configuration holds state already.
        let web = world.node.add_container("web");
        let error = world
            .runner
            .add(&world.list, &web.with_port_mappings(&mappings()))
            .expect_err(&format!("{conditions} must be refused"));
        let object = error
            .error_json
            .clone()
            .unwrap_or_else(|| panic!("no CNI error object: {error}"));
        assert_eq!(object["code"], 7, "{conditions}: {object}");
        let message = object["msg"].as_str().unwrap_or_default();
        assert!(
            message.starts_with(&format!("{names}: ")) && message.contains("supported are"),
            "{conditions}: the message names {names} and what is supported: {message}"
        );
        assert!(
            !world.pins.path().join("v1/maps/mappings").exists() || world.mapping_count() == 0,
            "a refusal changes nothing: {}",
            world.dump()
        );
        // The runtime's DEL after a failed ADD succeeds.
        world.del(&web, &mappings());
    }
}

/// Runs the probe client (`tcp` mode) from the node, in the test's cgroup
/// where the socket hooks are attached; `Ok(reply)` or the probe's error.
fn node_probe(
    world: &World,
    target: std::net::SocketAddr,
    payload: &str,
) -> Result<String, String> {
    world
        .probe(
            env!("CARGO_BIN_EXE_probe"),
            &world.node.ns,
            true,
            &["tcp", &target.to_string(), payload, "2000"],
        )
        .map(|seen| seen.reply)
}

/// The node's own connections (socket hooks) and a container's hairpin
/// (tc on the bridge) are judged as upstream's OUTPUT and PREROUTING rules
/// judge them: the node dialling its own address has that address as
/// source; 127.0.0.1 has 127.0.0.1; a container has its own.
#[test]
fn the_nodes_own_connections_and_hairpin_are_judged_like_upstream() {
    let world = world_with(json!({
        "conditionsV4": ["-s", "198.18.0.0/24"],
        "conditionsV6": ["-s", "fd18::/64"],
    }));
    let (web, _servers) = serve(&world, "web");
    let other = world.node.add_container("other");
    world.add(&other, &[]);
    for ip in node_ips() {
        let target = sock(ip, 8080);
        assert_eq!(
            node_probe(&world, target, "mine").unwrap_or_else(|e| panic!(
                "the node dialling {target} (source {ip}, inside): {e}\n{}",
                world.dump()
            )),
            echo_reply("web", "mine")
        );
        expect_unreachable(
            &format!("container `other` dialling {target} (its source is outside)"),
            tcp_request(&other.ns, target, "hairpin", GONE),
        );
    }
    for loopback in ["127.0.0.1", "::1"] {
        let target = sock(loopback.parse::<IpAddr>().expect("address"), 8080);
        let seen = node_probe(&world, target, "loopback");
        assert!(
            seen.is_err(),
            "the node dialling {target} has a loopback source, outside the conditions: {seen:?}"
        );
    }
    world.del(&other, &[]);
    world.del(&web, &mappings());
}

/// A plugin run on the node that concerns no container of the test: the
/// DEL of a container never added (every run reconciles the node).
fn another_plugin_run(world: &World) {
    let stranger = world.node.add_container("stranger");
    world.del(&stranger, &[]);
}

/// Interface conditions name an interface, as upstream's `-i` does when a
/// packet comes: eth0 deleted and made again after the ADD (a new index)
/// is still the eth0 that `! -i eth0` refuses, once a plugin run has put
/// the programs on it; before that run the new eth0 carries no programs,
/// so nothing arriving on it is translated at all. Without names kept,
/// the entry held the old eth0's index, and `! -i eth0` admitted the new
/// eth0's traffic.
#[test]
fn a_negated_in_interface_refuses_its_interface_re_created_after_the_add() {
    let world = world_with(json!({
        "conditionsV4": ["!", "-i", "eth0"],
        "conditionsV6": ["!", "--in-interface", "eth0"],
    }));
    let (web, _servers) = serve(&world, "web");
    refused(&world.node.ext, "ext (arrives on eth0)", true);
    reaches(&world, &world.node.far, "far", "web", true);
    let (old, new) = world.node.recreate_uplink();
    assert_ne!(old, new, "the kernel gives the new eth0 another index");
    refused(
        &world.node.ext,
        "ext on the new eth0, no plugin run since",
        true,
    );
    another_plugin_run(&world);
    refused(&world.node.ext, "ext on the re-created eth0", true);
    reaches(&world, &world.node.far, "far", "web", true);
    world.del(&web, &mappings());
    world.assert_clean("after the DEL");
}

/// As above for `-i eth0`: the re-created eth0's traffic is admitted, and
/// what arrives elsewhere still is not. Without names kept, the entry held
/// the old eth0's index and refused the new eth0's traffic for ever.
#[test]
fn an_in_interface_admits_its_interface_re_created_after_the_add() {
    let world = world_with(json!({
        "conditionsV4": ["-i", "eth0"],
        "conditionsV6": ["-i", "eth0"],
    }));
    let (web, _servers) = serve(&world, "web");
    reaches(&world, &world.node.ext, "ext", "web", true);
    let (old, new) = world.node.recreate_uplink();
    assert_ne!(old, new, "the kernel gives the new eth0 another index");
    another_plugin_run(&world);
    reaches(
        &world,
        &world.node.ext,
        "ext on the re-created eth0",
        "web",
        true,
    );
    refused(&world.node.far, "far (arrives on eth1)", true);
    world.del(&web, &mappings());
    world.assert_clean("after the DEL");
}

/// The node's address on `eth2`, the interface `Node::add_side_link`
/// plugs in after the ADD.
const SIDE_NODE: std::net::Ipv4Addr = std::net::Ipv4Addr::new(198, 20, 0, 1);

/// `eth2` plugged in after the ADD (a second NIC, a VLAN made after the
/// pods), with a client `side` behind it.
fn plug_in_eth2(world: &World) -> NetNs {
    world
        .node
        .add_side_link("eth2", "198.20.0.1/24", "198.20.0.2/24")
}

/// An interface missing at ADD and plugged in later is the interface the
/// condition names from the first plugin run that puts the programs on
/// it: `! -i eth2` refuses what arrives on it and nothing else. Without
/// names kept, the entry held index 0, matching no interface for ever, and
/// `! -i eth2` admitted eth2's traffic.
#[test]
fn a_negated_in_interface_refuses_its_interface_made_after_the_add() {
    let world = world_with(json!({"conditionsV4": ["!", "-i", "eth2"]}));
    let (web, _servers) = serve(&world, "web");
    let side = plug_in_eth2(&world);
    another_plugin_run(&world);
    expect_unreachable(
        "TCP from side via 198.20.0.1:8080 (arrives on eth2, ! -i eth2)",
        tcp_request(&side, sock(SIDE_NODE, 8080), "denied", GONE),
    );
    for (client, who) in [(&world.node.ext, "ext"), (&world.node.far, "far")] {
        world.expect_answer(
            &format!("TCP from {who} via {NODE_IP4}:8080 (not eth2)"),
            tcp_request(client, sock(NODE_IP4, 8080), "hello", PROBE),
            &echo_reply("web", "hello"),
        );
    }
    world.del(&web, &mappings());
    world.assert_clean("after the DEL");
}

/// As above for `-i eth2`: nothing is admitted while no eth2 exists, and
/// once it is plugged in and a plugin run has passed, what arrives on it
/// alone. Without names kept, eth2's traffic was refused for ever.
#[test]
fn an_in_interface_admits_its_interface_made_after_the_add() {
    let world = world_with(json!({"conditionsV4": ["-i", "eth2"]}));
    let (web, _servers) = serve(&world, "web");
    expect_unreachable(
        "TCP from ext while no eth2 exists (-i eth2)",
        tcp_request(&world.node.ext, sock(NODE_IP4, 8080), "denied", GONE),
    );
    let side = plug_in_eth2(&world);
    another_plugin_run(&world);
    world.expect_answer(
        "TCP from side via 198.20.0.1:8080 (arrives on eth2, -i eth2)",
        tcp_request(&side, sock(SIDE_NODE, 8080), "hello", PROBE),
        &echo_reply("web", "hello"),
    );
    for (client, who) in [(&world.node.ext, "ext"), (&world.node.far, "far")] {
        expect_unreachable(
            &format!("TCP from {who} via {NODE_IP4}:8080 (not eth2)"),
            tcp_request(client, sock(NODE_IP4, 8080), "denied", GONE),
        );
    }
    world.del(&web, &mappings());
    world.assert_clean("after the DEL");
}

/// With the node agent, no plugin run is needed: its pass on the new
/// interface's link events writes eth2's index into the entry before it
/// puts the programs on eth2. Without names kept, the entry held index 0
/// and eth2's traffic was refused for ever.
#[test]
fn the_agents_pass_follows_an_interface_made_after_the_add() {
    let world = world_with(json!({"conditionsV4": ["-i", "eth2"]}));
    let (web, _servers) = serve(&world, "web");
    let agent = portmap_tests::agent::Agent::start(&world);
    agent.wait_ready(Duration::from_secs(10), "at start");
    let side = plug_in_eth2(&world);
    let target = sock(SIDE_NODE, 8080);
    // The new veth's carrier, then the agent's pass: within seconds.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match tcp_request(&side, target, "hello", Duration::from_millis(300)) {
            Ok(reply) if reply == echo_reply("web", "hello") => break,
            other => assert!(
                Instant::now() < deadline,
                "TCP from side via {target} (-i eth2) never answered after the agent's pass: {other:?}\n{}\n{}",
                world.dump(),
                agent.log_text()
            ),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    expect_unreachable(
        "TCP from ext (not eth2)",
        tcp_request(&world.node.ext, sock(NODE_IP4, 8080), "denied", GONE),
    );
    drop(agent);
    world.del(&web, &mappings());
}

/// Two interface names (valid, up to 15 bytes) with one id.
fn interface_names_of_one_id() -> (String, String) {
    let mut seen = std::collections::HashMap::new();
    for n in 0u32.. {
        let name = format!("if{n:x}");
        let id = portmap_common::conditions::interface_id(name.as_bytes());
        if let Some(first) = seen.insert(id, name.clone()) {
            return (first, name);
        }
    }
    unreachable!("a 32-bit id repeats within 2^32 + 1 names")
}

/// An entry keeps its `-i` name as a 32-bit id: a second name with the id
/// of one the node keeps could not be told apart from it when either
/// interface changes, so its ADD is refused with code 7 naming the
/// condition and both names, and changes nothing.
#[test]
fn an_in_interface_name_with_the_id_of_a_kept_one_is_refused() {
    let (kept, other) = interface_names_of_one_id();
    let world = world_with(json!({"conditionsV4": ["-i", kept]}));
    let (web, _servers) = serve(&world, "web");
    let second = world.node.add_container("second");
    let second_mappings = [PortMapping::tcp(8081, 80)];
    let rt = second.with_port_mappings(&second_mappings);
    let result = world
        .runner
        .add(&world.list, &rt)
        .unwrap_or_else(|e| panic!("ADD of the second container: {e}"));
    let before = world.dump_map("conditions");
    let mut config = world.our_config(&rt, Some(&result));
    config["conditionsV4"] = json!(["-i", other]);
    let error = world
        .runner
        .exec_plugin("ebpf-portmap", CniCommand::Add, Some(&rt), &config)
        .expect_err("a name with a kept name's id must be refused");
    let object = error
        .error_json
        .clone()
        .unwrap_or_else(|| panic!("no CNI error object: {error}"));
    assert_eq!(object["code"], 7, "{object}");
    let message = object["msg"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("conditionsV4: ")
            && message.contains(&kept)
            && message.contains(&other),
        "the message names the condition and both names: {message}"
    );
    assert_eq!(
        world.dump_map("conditions"),
        before,
        "a refusal changes nothing"
    );
    world.del(&second, &second_mappings);
    world.del(&web, &mappings());
    world.assert_clean("after both DELs");
}
