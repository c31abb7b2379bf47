//! Node shapes the standard world does not have: no default route, a second
//! NIC and a tunnel without one, `interfaces` patterns that match only part of
//! a node, an uplink re-created under a new index, an interface and an
//! address added after the containers, and hostIPs the node cannot or does
//! not yet have. Each test drives the real chain (bridge + host-local +
//! ebpf-portmap) with the minimal plugin entry (no `interfaces` unless the
//! test is about it; `pinRoot`, `cgroupPath` and `logFile` only keep the
//! test to itself) and checks real traffic and `ebpf-portmap status`.
//! Needs root.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use serde_json::{Value, json};

use portmap_tests::cni::{CniCommand, GcAttachment, gc_plugin_config};
use portmap_tests::topology::{
    BRIDGE_NAME, NODE_FAR_IP4, NODE_FAR_IP6, NODE_IP4, NODE_IP6, NODE_UPLINK, PLUGIN_LOG,
};
use portmap_tests::traffic::{echo_reply, tcp_echo_server, tcp_request};
use portmap_tests::world::{GONE, PROBE, World, expect_unreachable, sock};
use portmap_tests::{Conflist, Container, PortMapping, bridge_conflist, plugin_bin};

/// bridge + host-local + ebpf-portmap with `interfaces` set to `patterns`.
fn world_with_interfaces(patterns: &[&str]) -> World {
    World::with(|name, pins, data| {
        with_interfaces(
            bridge_conflist(name, "ebpf-portmap", Some(pins), data),
            patterns,
        )
    })
}

fn with_interfaces(list: Conflist, patterns: &[&str]) -> Conflist {
    let mut json = list.json().clone();
    json["plugins"][1]["interfaces"] = json!(patterns);
    Conflist::from_json(json).expect("a well-formed conflist")
}

/// `ebpf-portmap status --json` in the node: (exit 0, the document).
fn status(world: &World) -> (bool, Value) {
    let out = world
        .node
        .ns
        .command(plugin_bin())
        .args(["status", "--json", "--pin-root"])
        .arg(world.pins.path())
        .output()
        .expect("run ebpf-portmap status");
    let doc = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "status --json is not JSON ({e}): {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.success(), doc)
}

fn texts(doc: &Value, key: &str) -> Vec<String> {
    doc[key]
        .as_array()
        .map(|list| {
            list.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

fn assert_healthy(world: &World, when: &str) {
    let (ok, doc) = status(world);
    assert!(
        ok && doc["healthy"] == true,
        "{when}: status must be healthy: {doc:#}"
    );
}

/// Names of the interfaces `status` shows attached in both directions.
fn attached_interfaces(doc: &Value) -> Vec<String> {
    let list = doc["interfaces"].as_array().cloned().unwrap_or_default();
    let mut names: Vec<String> = list
        .iter()
        .filter(|a| a["attached"] == true && a["direction"] == "ingress")
        .filter_map(|a| a["interface"].as_str().map(str::to_owned))
        .filter(|name| {
            list.iter().any(|b| {
                b["interface"] == name.as_str()
                    && b["direction"] == "egress"
                    && b["attached"] == true
            })
        })
        .collect();
    names.sort();
    names
}

fn plugin_log(world: &World) -> String {
    std::fs::read_to_string(world.node.data_dir().join(PLUGIN_LOG)).unwrap_or_default()
}

fn serving(world: &World, id: &str) -> (Container, portmap_tests::traffic::ServerHandle) {
    let container = world.node.add_container(id);
    let server = tcp_echo_server(&container.ns, 80, id);
    (container, server)
}

fn expect_web(
    world: &World,
    what: &str,
    client: &portmap_tests::NetNs,
    target: SocketAddr,
    id: &str,
) {
    world.expect_answer(
        &format!("{what} ({target})"),
        tcp_request(client, target, what, PROBE),
        &echo_reply(id, what),
    );
}

#[test]
fn a_node_without_a_default_route_maps_host_ports() {
    let world = World::bridge();
    world.node.remove_default_routes();
    let (web, _server) = serving(&world, "noroute");
    let mappings = [PortMapping::tcp(8080, 80)];
    world.add(&web, &mappings);
    for ip in [IpAddr::V4(NODE_IP4), IpAddr::V6(NODE_IP6)] {
        expect_web(
            &world,
            "from ext",
            &world.node.ext,
            sock(ip, 8080),
            "noroute",
        );
    }
    expect_web(
        &world,
        "from far",
        &world.node.far,
        sock(NODE_FAR_IP4, 8080),
        "noroute",
    );
    assert_healthy(&world, "after ADD on a node without default route");
    world.del(&web, &mappings);
}

#[test]
fn every_up_interface_carries_the_programs_but_bridge_ports() {
    let world = World::bridge();
    let tunnel = world
        .node
        .add_far_tunnel(100, "198.21.0.1/24", "198.21.0.2/24");
    let (web, _server) = serving(&world, "uplinks");
    world.add(&web, &[PortMapping::tcp(8080, 80)]);
    // A second NIC and a tunnel, neither with a default route.
    for ip in [IpAddr::V4(NODE_FAR_IP4), IpAddr::V6(NODE_FAR_IP6)] {
        expect_web(
            &world,
            "second NIC",
            &world.node.far,
            sock(ip, 8080),
            "uplinks",
        );
    }
    let tunnel_ip = IpAddr::V4(Ipv4Addr::new(198, 21, 0, 1));
    expect_web(
        &world,
        "tunnel",
        &world.node.far,
        sock(tunnel_ip, 8080),
        "uplinks",
    );
    expect_web(
        &world,
        "uplink",
        &world.node.ext,
        sock(NODE_IP4, 8080),
        "uplinks",
    );

    let (ok, doc) = status(&world);
    assert!(ok, "{doc:#}");
    let attached = attached_interfaces(&doc);
    let mut expected = vec!["cni0".to_owned(), "eth0".into(), "eth1".into(), tunnel];
    expected.sort();
    assert_eq!(
        attached, expected,
        "every up interface but loopback and the bridge's ports: {doc:#}"
    );
    // The pod's port carries the ingress program alone, pinned apart.
    let ports = doc["bridgePorts"].as_array().expect("bridgePorts");
    assert_eq!(ports.len(), 1, "web's port: {doc:#}");
    assert_eq!(ports[0]["attached"], true, "{doc:#}");
}

#[test]
fn interfaces_narrow_the_default() {
    let world = world_with_interfaces(&["eth0"]);
    let (web, _server) = serving(&world, "narrow");
    world.add(&web, &[PortMapping::tcp(8080, 80)]);
    expect_web(
        &world,
        "listed uplink",
        &world.node.ext,
        sock(NODE_IP4, 8080),
        "narrow",
    );
    expect_unreachable(
        "an interface left out of `interfaces`",
        tcp_request(&world.node.far, sock(NODE_FAR_IP4, 8080), "x", GONE),
    );
    let (ok, doc) = status(&world);
    assert!(ok, "an interface left out is no problem: {doc:#}");
    assert_eq!(attached_interfaces(&doc), ["cni0", "eth0"], "{doc:#}");
}

#[test]
fn uninstall_forgets_the_recorded_interfaces() {
    let world = world_with_interfaces(&["eth0"]);
    let (web, _server) = serving(&world, "forget");
    let mappings = [PortMapping::tcp(8080, 80)];
    world.add(&web, &mappings);
    let record = portmap_tests::bpffs::interfaces_record(world.pins.path());
    assert_eq!(
        std::fs::read_to_string(&record).ok().as_deref(),
        Some("eth0"),
        "ADD records the configured interfaces at {}",
        record.display()
    );
    world.del(&web, &mappings);
    let out = world.operator(&["uninstall"]);
    assert!(
        out.status.success(),
        "uninstall: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !record.exists(),
        "uninstall leaves the node as before the first ADD, without {}",
        record.display()
    );
}

#[test]
fn interfaces_take_patterns_and_skip_what_matches_nothing() {
    let world = world_with_interfaces(&["eth*", "bond0.*", "ens9"]);
    let (web, _server) = serving(&world, "patterns");
    world.add(&web, &[PortMapping::tcp(8080, 80)]);
    expect_web(
        &world,
        "eth0 by pattern",
        &world.node.ext,
        sock(NODE_IP4, 8080),
        "patterns",
    );
    expect_web(
        &world,
        "eth1 by pattern",
        &world.node.far,
        sock(NODE_FAR_IP4, 8080),
        "patterns",
    );
    // Each unmatched entry is named with the interfaces the node does
    // have (issue 38 item 15), in the log, in `status` and in the error.
    let has = "(it has cni0, eth0, eth1";
    let log = plugin_log(&world);
    for entry in ["bond0.*", "ens9"] {
        assert!(
            log.contains(&format!(
                "`interfaces` entry {entry:?} matches no interface of this node {has}"
            )),
            "the log warns about {entry}:\n{log}"
        );
    }
    let (ok, doc) = status(&world);
    assert!(ok, "entries for other nodes are no problem: {doc:#}");
    let notes = texts(&doc, "notes").join("\n");
    for entry in ["bond0.*", "ens9"] {
        assert!(
            notes.contains(&format!(
                "{entry:?} matches no interface of this node {has}"
            )),
            "{doc:#}"
        );
    }

    // Nothing at all matching: the configuration is for other nodes.
    let list = with_interfaces(world.list.clone(), &["nic*", "ens9"]);
    let other = world.node.add_container("nomatch");
    let failure = world
        .runner
        .add(
            &list,
            &other.with_port_mappings(&[PortMapping::tcp(9090, 80)]),
        )
        .expect_err("no interface matches");
    assert_eq!(failure.error_code(), Some(7), "{failure}");
    let msg = failure.error_msg().unwrap_or_default();
    assert!(msg.contains("nic*") && msg.contains("ens9"), "{msg}");
    assert!(msg.contains("this node has cni0, eth0, eth1"), "{msg}");
}

#[test]
fn a_recreated_uplink_is_reported_then_attached_by_any_plugin_run() {
    let world = World::bridge();
    let (web, _server) = serving(&world, "recreate");
    let (other, _other_server) = serving(&world, "bystander");
    let mappings = [PortMapping::tcp(8080, 80)];
    world.add(&web, &mappings);
    world.add(&other, &[PortMapping::tcp(9090, 80)]);
    expect_web(
        &world,
        "before",
        &world.node.ext,
        sock(NODE_IP4, 8080),
        "recreate",
    );
    assert_healthy(&world, "before the uplink is re-created");

    let list11 = world.list.clone().with_cni_version("1.1.0");
    // Each verb in turn must bring the new interface into the dataplane.
    type Run<'a> = (&'a str, Box<dyn Fn() + 'a>);
    let runs: [Run; 3] = [
        (
            "CHECK",
            Box::new(|| {
                world
                    .runner
                    .check(&world.list, &web.with_port_mappings(&mappings))
                    .unwrap_or_else(|e| panic!("CHECK: {e}"));
            }),
        ),
        (
            "GC",
            Box::new(|| {
                let valid = [
                    GcAttachment::from(&web.with_port_mappings(&mappings)),
                    GcAttachment::from(&other.with_port_mappings(&[])),
                ];
                let plugin = world.our_plugin();
                let config = gc_plugin_config(&list11, plugin, &valid);
                world
                    .runner
                    .exec_plugin("ebpf-portmap", CniCommand::Gc, None, &config)
                    .unwrap_or_else(|e| panic!("GC: {e}"));
            }),
        ),
        (
            "DEL of another container",
            Box::new(|| world.del(&other, &[])),
        ),
    ];
    for (verb, run) in runs {
        let (old, new) = world.node.recreate_uplink();
        assert_ne!(old, new, "the kernel gives the new eth0 another index");
        let (ok, doc) = status(&world);
        let problems = texts(&doc, "problems").join("\n");
        assert!(
            !ok && problems.contains(&format!(
                "{NODE_UPLINK} (index {new}) does not carry the programs"
            )),
            "before {verb}: status must report the re-created uplink: {doc:#}"
        );
        run();
        expect_web(
            &world,
            &format!("after {verb}"),
            &world.node.ext,
            sock(NODE_IP4, 8080),
            "recreate",
        );
        assert_healthy(&world, &format!("after {verb}"));
    }
}

#[test]
fn an_interface_added_later_is_reported_then_attached_by_any_plugin_run() {
    let world = World::bridge();
    let (web, _server) = serving(&world, "later");
    world.add(&web, &[PortMapping::tcp(8080, 80)]);
    let side = world
        .node
        .add_side_link("eth2", "198.20.0.1/24", "198.20.0.2/24");
    let target = sock(Ipv4Addr::new(198, 20, 0, 1), 8080);
    let (ok, doc) = status(&world);
    let problems = texts(&doc, "problems").join("\n");
    assert!(
        !ok && problems.contains("eth2 (index") && problems.contains("does not carry the programs"),
        "status must report the new interface: {doc:#}"
    );
    // A DEL, even of a container never added, is a plugin run.
    let stranger = world.node.add_container("stranger");
    world.del(&stranger, &[]);
    expect_web(&world, "new interface", &side, target, "later");
    assert_healthy(&world, "after the DEL");
    // It is attached by rule, not by history: a container's DEL leaves it.
    world.del(&web, &[PortMapping::tcp(8080, 80)]);
    let (ok, doc) = status(&world);
    assert!(
        attached_interfaces(&doc).contains(&"eth2".to_owned()),
        "{doc:#}"
    );
    assert!(ok, "{doc:#}");
}

/// The bridge plugin sets a new pod's veth up before it makes it a port of
/// the bridge: an ADD of another pod whose link dump falls in that window
/// takes the veth for an uplink and attaches the programs. The next plugin
/// run takes them off again (a port never carries them, the bridge does):
/// on a busy node they would otherwise pile up, one veth per window hit,
/// each costing every later run a question to the kernel (issue 36).
#[test]
fn a_veth_taken_for_an_uplink_before_it_joined_the_bridge_loses_the_programs() {
    let world = World::bridge();
    let (web, _server) = serving(&world, "window");
    world.add(&web, &[PortMapping::tcp(8080, 80)]);
    // A pod's veth as the bridge plugin leaves it for a moment.
    let pod = world.node.add_container("in-window");
    world.node.ns.add_veth_to("pw0", "eth0", &pod.ns);
    world.node.ns.ip(&["link", "set", "pw0", "up"]);
    let other = world.node.add_container("other");
    world.add(&other, &[PortMapping::tcp(8081, 80)]);
    let (_, doc) = status(&world);
    assert!(
        attached_interfaces(&doc).contains(&"pw0".to_owned()),
        "an up interface without a controller carries the programs: {doc:#}"
    );
    let index = world.node.ns.ip(&["-o", "link", "show", "pw0"]);
    let index = index
        .split(':')
        .next()
        .expect("ip -o prints the index")
        .trim()
        .to_owned();
    // The bridge plugin makes it a port; any plugin run follows.
    world
        .node
        .ns
        .ip(&["link", "set", "pw0", "master", BRIDGE_NAME]);
    world.del(&other, &[PortMapping::tcp(8081, 80)]);
    let (ok, doc) = status(&world);
    assert!(
        !attached_interfaces(&doc).contains(&"pw0".to_owned()),
        "a bridge's port carries no programs after the next run: {doc:#}"
    );
    assert!(ok, "{doc:#}");
    let links = std::fs::read_dir(world.pins.path().join("v1/links"))
        .expect("the links directory")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with(&format!("if{index}_")))
        .collect::<Vec<_>>();
    assert!(links.is_empty(), "pins of the port left: {links:?}");
    expect_web(
        &world,
        "uplink",
        &world.node.ext,
        sock(NODE_IP4, 8080),
        "window",
    );
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
            &["tcp", &target.to_string(), payload, "3000"],
        )
        .map(|seen| seen.reply)
}

#[test]
fn an_address_added_later_is_reported_then_synced_by_any_plugin_run() {
    let world = World::bridge();
    let (web, _server) = serving(&world, "address");
    let mappings = [PortMapping::tcp(8080, 80)];
    world.add(&web, &mappings);
    world.node.add_address(NODE_UPLINK, "198.18.0.77/24");
    let target = sock(Ipv4Addr::new(198, 18, 0, 77), 8080);
    let (ok, doc) = status(&world);
    let problems = texts(&doc, "problems").join("\n");
    assert!(
        !ok && problems.contains("node address 198.18.0.77 is not known to the dataplane"),
        "status must report the unsynced address: {doc:#}"
    );
    world
        .runner
        .check(&world.list, &web.with_port_mappings(&mappings))
        .unwrap_or_else(|e| panic!("CHECK: {e}"));
    match node_probe(&world, target, "node-local") {
        Ok(reply) => assert_eq!(reply, echo_reply("address", "node-local")),
        Err(e) => panic!("node -> {target} after CHECK: {e}\n{}", world.dump()),
    }
    assert_healthy(&world, "after CHECK");
}

#[test]
fn link_local_host_ips_are_refused_and_absent_ones_reported() {
    let world = World::bridge();
    for link_local in ["169.254.10.1", "fe80::1"] {
        let c = world.node.add_container("linklocal");
        let mapping = PortMapping::tcp(8080, 80).on(link_local.parse().unwrap());
        let failure = world
            .runner
            .add(&world.list, &c.with_port_mappings(&[mapping]))
            .expect_err("a link-local hostIP is refused");
        assert_eq!(failure.error_code(), Some(7), "{failure}");
        let msg = failure.error_msg().unwrap_or_default();
        assert!(
            msg.contains("hostIP") && msg.contains(link_local) && msg.contains("link-local"),
            "{msg}"
        );
        let _ = world.runner.del(&world.list, &c.with_port_mappings(&[]));
    }

    // A VIP that is not on this node yet.
    let vip = Ipv4Addr::new(198, 18, 0, 99);
    let (web, _server) = serving(&world, "vip");
    let mappings = [PortMapping::tcp(8080, 80).on(vip.into())];
    world.add(&web, &mappings);
    let log = plugin_log(&world);
    assert!(
        log.contains("hostIP 198.18.0.99 of host port 8080 is not an address of this node (yet)"),
        "ADD's log says the mapping sees no traffic yet:\n{log}"
    );
    let (ok, doc) = status(&world);
    assert!(ok, "an absent VIP is expected, not a problem: {doc:#}");
    assert!(
        texts(&doc, "notes")
            .iter()
            .any(|n| n.starts_with("mapping 198.18.0.99:8080/tcp: its hostIP is not an address")),
        "{doc:#}"
    );
    world.node.add_address(NODE_UPLINK, &format!("{vip}/24"));
    expect_web(
        &world,
        "VIP arrived",
        &world.node.ext,
        sock(vip, 8080),
        "vip",
    );
}
