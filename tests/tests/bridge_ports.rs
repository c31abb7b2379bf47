//! A pod's hairpin flow on a Kubernetes node: `br_netfilter` passes every
//! frame that enters the bridge from a pod's veth through netfilter's
//! `PREROUTING` before the bridge device's own tc hook runs, and
//! kube-proxy drops what conntrack finds INVALID at `FORWARD`. With the
//! programs on the bridge alone, conntrack recorded a pod's SYN to
//! nodeIP:hostPort untranslated, took the container's SYN-ACK (translated
//! by then) for a new flow, INVALID, and the rule dropped it: every hairpin
//! TCP connection failed. The ingress program now runs on the pod's bridge
//! port too (the host end of its veth, from prevResult), so conntrack sees
//! the flow translated; DEL takes it off, and a node-wide pass (CNI GC)
//! drops the pin of a port that went without a DEL; the ADD that installs
//! the dataplane (and the first run of a new build) gives it to the pods
//! made before. Needs root.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use portmap_tests::cni::result_addresses;
use portmap_tests::plugins::plugin_bin;
use portmap_tests::topology::{NODE_IP4, NODE_IP6};
use portmap_tests::traffic::{tcp_connect_from, tcp_echo_server};
use portmap_tests::world::{World, operator_json, sock};
use portmap_tests::{CniCommand, Container, PortMapping};
use serde_json::Value;

const TIMEOUT: Duration = Duration::from_secs(3);
const HOST_PORT: u16 = 8080;

/// A node as Kubernetes sets it up: bridged traffic through netfilter, and
/// kube-proxy's rule that drops what conntrack finds INVALID.
fn kubernetes_node() -> World {
    let world = World::bridge();
    for key in [
        "net.bridge.bridge-nf-call-iptables",
        "net.bridge.bridge-nf-call-ip6tables",
    ] {
        world.node.ns.sysctl(key, "1");
    }
    world.node.drop_invalid_at_forward();
    world
}

fn unspecified(like: IpAddr) -> SocketAddr {
    let ip = if like.is_ipv4() {
        IpAddr::from([0, 0, 0, 0])
    } else {
        IpAddr::from([0u16; 8])
    };
    SocketAddr::new(ip, 0)
}

/// `status --json`'s bridge ports: (interface, attached), by index.
fn bridge_ports(world: &World) -> Vec<(Option<String>, bool)> {
    let status = operator_json(&world.node.ns, world.pins.path(), "status");
    status["bridgePorts"]
        .as_array()
        .unwrap_or_else(|| panic!("status has bridgePorts: {status:#}"))
        .iter()
        .map(|p| {
            (
                p["interface"].as_str().map(str::to_owned),
                p["attached"] == Value::Bool(true),
            )
        })
        .collect()
}

/// The node-side name of `container`'s veth (its peer's index, in the node).
fn host_veth(world: &World, container: &Container) -> String {
    let link = container
        .ns
        .exec("ip", &["-o", "link", "show", &container.ifname]);
    // "2: eth0@if5: ..." names the peer's index.
    let peer: u32 = link
        .split_once("@if")
        .and_then(|(_, rest)| rest.split(':').next())
        .and_then(|index| index.parse().ok())
        .unwrap_or_else(|| panic!("no peer index in {link:?}"));
    let node = world.node.ns.exec("ip", &["-o", "link", "show"]);
    node.lines()
        .find_map(|line| {
            let (index, rest) = line.split_once(": ")?;
            let name = rest.split(['@', ':']).next()?;
            (index.trim().parse::<u32>().ok()? == peer).then(|| name.to_owned())
        })
        .unwrap_or_else(|| panic!("no interface {peer} in the node:\n{node}"))
}

/// `ebpf-portmap reconcile` (a node-wide pass, as the agent's and CNI
/// GC's) by the world's configuration.
fn reconcile(world: &World) {
    let conf = world.node.data_dir().join("bridge-ports.conflist");
    std::fs::write(&conf, world.list.json().to_string()).expect("write the conflist");
    let out = world
        .node
        .ns
        .command(plugin_bin())
        .arg("reconcile")
        .arg("--cni-conf")
        .arg(&conf)
        .env_remove("CNI_COMMAND")
        .output()
        .expect("run ebpf-portmap reconcile");
    assert!(
        out.status.success(),
        "reconcile: {}{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
}

/// That `pods`' bridge ports, and no other, carry the ingress program.
fn assert_ports_attached(world: &World, pods: &[&Container], what: &str) {
    let mut ports = bridge_ports(world);
    ports.sort();
    let mut expected: Vec<_> = pods
        .iter()
        .map(|pod| (Some(host_veth(world, pod)), true))
        .collect();
    expected.sort();
    assert_eq!(ports, expected, "{what}");
}

/// A TCP request from `client` to nodeIP:hostPort, IPv4 and IPv6, answered
/// by the server `identity`.
fn echo_through_the_node(world: &World, client: &Container, identity: &str) {
    for node in [IpAddr::from(NODE_IP4), IpAddr::from(NODE_IP6)] {
        let what = format!("{} -> {node}:{HOST_PORT}", client.id);
        let mut session = tcp_connect_from(
            &client.ns,
            unspecified(node),
            sock(node, HOST_PORT),
            TIMEOUT,
        )
        .unwrap_or_else(|e| panic!("{what}: {e}\n{}", world.dump()));
        let answer = session
            .request("ping", TIMEOUT)
            .unwrap_or_else(|e| panic!("{what}: {e}\n{}", world.dump()));
        assert_eq!(answer, format!("{identity} ping"), "{what}");
    }
}

#[test]
fn on_a_kubernetes_node_a_pods_hairpin_connection_is_translated_before_the_bridges_netfilter() {
    let world = kubernetes_node();
    let web = world.node.add_container("brp-web");
    let other = world.node.add_container("brp-other");
    let _server = tcp_echo_server(&web.ns, 80, "brp-web");
    let result = world.add(&web, &[PortMapping::tcp(HOST_PORT, 80)]);
    world.add(&other, &[]);
    let web_addrs = result_addresses(&result);

    for client in [&web, &other] {
        echo_through_the_node(&world, client, "brp-web");
    }

    // Netfilter saw each flow as the containers did: to web's port 80,
    // never to the host port it was dialled on.
    for (family, v4) in [("ipv4", true), ("ipv6", false)] {
        let web_addr = web_addrs
            .iter()
            .find(|a| a.is_ipv4() == v4)
            .expect("web has an address of each family");
        let listed = |port: &str| {
            world.node.ns.exec(
                "sh",
                &[
                    "-c",
                    &format!("conntrack -L -f {family} -p tcp --orig-port-dst {port} 2>/dev/null"),
                ],
            )
        };
        let untranslated = listed(&HOST_PORT.to_string());
        assert!(
            untranslated.trim().is_empty(),
            "{family}: conntrack holds untranslated hairpin flows:\n{untranslated}"
        );
        let translated = listed("80");
        assert_eq!(
            translated
                .lines()
                .filter(|l| l.contains(&format!("dst={web_addr} ")))
                .count(),
            2,
            "{family}: one translated flow from each pod:\n{translated}"
        );
    }

    assert_ports_attached(
        &world,
        &[&web, &other],
        "each pod's bridge port runs the ingress program",
    );
}

#[test]
fn del_and_a_node_wide_pass_take_the_program_off_pods_bridge_ports() {
    let world = World::bridge();
    let a = world.node.add_container("brp-a");
    let b = world.node.add_container("brp-b");
    let mappings = [PortMapping::tcp(HOST_PORT, 80)];
    world.add(&a, &mappings);
    world.add(&b, &[]);
    let b_port = host_veth(&world, &b);
    assert_eq!(bridge_ports(&world).len(), 2, "one per pod");

    world.del(&a, &mappings);
    assert_eq!(
        bridge_ports(&world),
        [(Some(b_port.clone()), true)],
        "DEL takes its pod's port off"
    );

    // b's namespace goes without a DEL: its veth with it (the kernel
    // removes it a moment later), its pin stays.
    drop(b);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while world
        .node
        .ns
        .exec("ip", &["-o", "link", "show"])
        .contains(&b_port)
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(bridge_ports(&world), [(None, false)], "a gone port's pin");
    // A node-wide pass (the operator's `reconcile`, as the agent's and CNI
    // GC's) drops the pin of a port that is gone.
    reconcile(&world);
    assert_eq!(bridge_ports(&world), [], "swept by the node-wide pass");
}

#[test]
fn a_node_wide_pass_gives_the_program_to_pods_made_before_it_was_on_their_ports() {
    let world = World::bridge();
    let a = world.node.add_container("brp-old");
    world.add(&a, &[PortMapping::tcp(HOST_PORT, 80)]);
    let a_port = host_veth(&world, &a);
    // As a build before bridge ports left it: the pod's port without a
    // pin of ours (tcx: the link goes with it; clsact: the marker).
    let links = world.pins.path().join("v1/links");
    let index = world.node.ifindex(&a_port);
    let removed = [
        format!("port{index}_ingress"),
        format!("port{index}_ingress_clsact"),
    ]
    .iter()
    .filter(|name| std::fs::remove_file(links.join(name)).is_ok())
    .count();
    assert_eq!(removed, 1, "one pin of the port in {}", links.display());
    assert_eq!(bridge_ports(&world), [], "bare");
    reconcile(&world);
    assert_eq!(
        bridge_ports(&world),
        [(Some(a_port), true)],
        "the node-wide pass finds the bridge's ports"
    );
}

#[test]
fn pods_made_before_the_dataplane_get_the_program_from_the_add_that_installs_it() {
    let world = kubernetes_node();
    // An ADD without mappings on a node with no dataplane installs nothing.
    let early = world.node.add_container("brp-early");
    world.add(&early, &[]);
    let web = world.node.add_container("brp-late");
    let _server = tcp_echo_server(&web.ns, 80, "brp-late");
    world.add(&web, &[PortMapping::tcp(HOST_PORT, 80)]);

    assert_ports_attached(&world, &[&early, &web], "the earlier pod's port too");
    echo_through_the_node(&world, &early, "brp-late");
}

#[test]
fn an_add_that_finds_its_ports_program_linked_by_a_run_beside_it_succeeds() {
    let world = World::bridge();
    let pod = world.node.add_container("brp-shared");
    let result = world.add(&pod, &[PortMapping::tcp(HOST_PORT, 80)]);
    let port = host_veth(&world, &pod);
    let links = world.pins.path().join("v1/links");
    let pin = links.join(format!("port{}_ingress", world.node.ifindex(&port)));
    if !pin.exists() {
        // clsact (before 6.6): a filter, no link to hold elsewhere.
        return;
    }
    // What a run beside this one leaves for an instant: this build's
    // program on the port's hook, by a link not (yet) at our pin. The hook
    // takes a program once: linking it again fails with EEXIST.
    let held = links.join("held-by-another-run");
    std::fs::rename(&pin, &held).expect("move the port's link pin");
    let mut rt = pod.with_port_mappings(&[PortMapping::tcp(9000, 80)]);
    rt.container_id = "brp-shared-2".into();
    let added = world.exec_ours(CniCommand::Add, &rt, Some(&result));
    std::fs::remove_file(&held).expect("let the held link go");
    added.unwrap_or_else(|e| panic!("ADD beside a run that linked the port: {e}"));
}
