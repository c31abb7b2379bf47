//! Traffic that does not come from outside the node: from the node itself to
//! node-IP:hostPort, to localhost (127.0.0.1 and ::1), and hairpin (a
//! container to node-IP:hostPort of itself or of another container), for TCP
//! and UDP over IPv4 and IPv6, with the bridge and the ptp plugin. Needs root.
//!
//! Clients run as their own processes (the `probe` binary) so they can be put
//! in the test's cgroup, where the plugin's socket hooks are attached, or
//! left out of it to exercise the packet-level hairpin.

use std::net::{IpAddr, SocketAddr};
use std::os::unix::process::CommandExt;

use portmap_tests::topology::{NODE_IP4, NODE_IP6};
use portmap_tests::traffic::{echo_reply, tcp_echo_server, udp_echo_server};
use portmap_tests::world::{World, sock};
use portmap_tests::{Container, NetNs, PortMapping};

/// What a probe saw.
#[derive(Debug)]
struct Seen {
    peer: String,
    reply: String,
}

/// Runs the probe client in `ns`; in the test's cgroup when `hooked`.
fn probe(
    world: &World,
    ns: &NetNs,
    hooked: bool,
    mode: &str,
    target: SocketAddr,
    payload: &str,
) -> Result<Seen, String> {
    // The VM tests stage the client elsewhere and say where.
    let probe =
        std::env::var_os("EPM_PROBE_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_probe").into());
    let mut command = ns.command(probe);
    command.args([mode, &target.to_string(), payload, "3000"]);
    if hooked {
        let procs = world.pins.cgroup().procs_file();
        // SAFETY: only async-signal-safe calls between fork and exec: open,
        // write and close through std's file API on a path built before.
        unsafe {
            command.pre_exec(move || std::fs::write(&procs, b"0"));
        }
    }
    let out = command.output().map_err(|e| format!("spawn probe: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let field = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{key}=")))
            .unwrap_or_default()
            .to_owned()
    };
    if !out.status.success() {
        return Err(format!("probe {mode} {target} failed: {}", field("error")));
    }
    Ok(Seen {
        peer: field("peer"),
        reply: field("reply"),
    })
}

fn expect(
    world: &World,
    what: &str,
    seen: Result<Seen, String>,
    target: SocketAddr,
    identity: &str,
    payload: &str,
) {
    let seen = seen.unwrap_or_else(|e| panic!("{what}: {e}\n{}", world.dump()));
    assert_eq!(
        seen.reply,
        echo_reply(identity, payload),
        "{what}: answered by the wrong server"
    );
    assert_eq!(
        seen.peer,
        target.to_string(),
        "{what}: the application must see the address it dialled"
    );
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
