//! Issue #28, the container path, both ways: containers on the node's
//! bridge dialling a host port through one of the node's addresses.
//!
//! - `containerSockets` off (the default): the packet path. The hooks
//!   leave a container's sockets alone; the flow hairpins through tc on
//!   the container's interface, masqueraded with `snat`, so the answering
//!   container sees the node's address on the bridge as the client.
//! - `containerSockets` on: ADD registers the container's network
//!   namespace and the hooks point its `connect()`/`sendmsg()` at the
//!   container that answers, which sees the dialling pod's own address;
//!   `list` counts each translation for its mapping. Never for the
//!   container's own loopback, never after its DEL (even the second DEL,
//!   without `CNI_NETNS` or prevResult) or its GC, never for a namespace
//!   the node did not set up.
//!
//! Every client is a `probe` process in the test's cgroup, where the
//! hooks are attached (the cgroup2 root of a real node holds every
//! container's processes). Needs root.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use portmap_tests::cni::{CniCommand, GcAttachment, gc_plugin_config};
use portmap_tests::topology::{NODE_IP4, NODE_IP6, POD_GATEWAY4, POD_GATEWAY6};
use portmap_tests::traffic::{ServerHandle, tcp_echo_server, udp_echo_server};
use portmap_tests::world::{Probed, World, counter, sock};
use portmap_tests::{Container, NetNs, PortMapping};
use serde_json::Value;

const WEB_MAPPINGS: [(u16, u16, &str); 2] = [(8080, 80, "tcp"), (5353, 53, "udp")];

fn web_mappings() -> Vec<PortMapping> {
    WEB_MAPPINGS
        .iter()
        .map(|&(host, container, protocol)| match protocol {
            "tcp" => PortMapping::tcp(host, container),
            _ => PortMapping::udp(host, container),
        })
        .collect()
}

/// The bridge world, with `containerSockets` set as given (absent: `None`).
fn world(container_sockets: Option<bool>) -> World {
    World::with(move |name, pins, data| {
        let mut json = portmap_tests::bridge_conflist(name, "ebpf-portmap", Some(pins), data)
            .json()
            .clone();
        if let Some(on) = container_sockets {
            json.pointer_mut("/plugins/1")
                .and_then(Value::as_object_mut)
                .expect("ebpf-portmap is the second plugin")
                .insert("containerSockets".into(), Value::Bool(on));
        }
        portmap_tests::Conflist::from_json(json).expect("conflist")
    })
}

/// Runs the probe client in `ns`, in the hooked cgroup.
fn probe(world: &World, ns: &NetNs, mode: &str, target: SocketAddr) -> Result<Probed, String> {
    world.probe_echo(env!("CARGO_BIN_EXE_probe"), ns, true, mode, target, "cs")
}

/// `probe` must be answered by `identity`, and the application must see
/// the address it dialled.
fn expect(
    world: &World,
    what: &str,
    seen: Result<Probed, String>,
    target: SocketAddr,
    identity: &str,
) {
    world.expect_echo(what, seen, target, identity, "cs");
}

/// The container's addresses (IPv4, IPv6) from its ADD result.
fn pod_addrs(result: &Value) -> (IpAddr, IpAddr) {
    let addrs: Vec<IpAddr> = result["ips"]
        .as_array()
        .unwrap_or_else(|| panic!("no ips in the ADD result {result:#}"))
        .iter()
        .filter_map(|ip| ip["address"].as_str()?.split('/').next()?.parse().ok())
        .collect();
    let v4 = addrs.iter().copied().find(IpAddr::is_ipv4);
    let v6 = addrs.iter().copied().find(IpAddr::is_ipv6);
    match (v4, v6) {
        (Some(v4), Some(v6)) => (v4, v6),
        _ => panic!("a dual-stack result was expected: {result:#}"),
    }
}

/// `list` as JSON, and one mapping's row in it.
fn list_row(world: &World, host: &str) -> Value {
    let list = world.list();
    list.as_array()
        .expect("list is an array")
        .iter()
        .find(|r| r["host"] == host)
        .cloned()
        .unwrap_or_else(|| panic!("no row {host} in {list:#}"))
}

fn num(row: &Value, key: &str) -> u64 {
    row[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} is not a number in {row:#}"))
}

/// The socket translations `list` counts, per row of web's mappings.
fn sock_counts(world: &World) -> Vec<(String, u64, u64)> {
    [
        "0.0.0.0:8080/tcp",
        "[::]:8080/tcp",
        "0.0.0.0:5353/udp",
        "[::]:5353/udp",
    ]
    .into_iter()
    .map(|host| {
        let row = list_row(world, host);
        (
            host.to_owned(),
            num(&row, "sockConnects"),
            num(&row, "sockSendmsgs"),
        )
    })
    .collect()
}

struct Setup {
    world: World,
    web: Container,
    other: Container,
    /// Pod addresses (v4, v6) by container.
    web_addrs: (IpAddr, IpAddr),
    other_addrs: (IpAddr, IpAddr),
    tcp: ServerHandle,
    udp: ServerHandle,
}

/// `web` maps 8080/tcp -> 80 and 5353/udp -> 53 and serves both; `other`
/// maps nothing.
fn node(container_sockets: Option<bool>) -> Setup {
    let world = world(container_sockets);
    let web = world.node.add_container("cs-web");
    let other = world.node.add_container("cs-other");
    let tcp = tcp_echo_server(&web.ns, 80, "cs-web");
    let udp = udp_echo_server(&web.ns, 53, "cs-web");
    let web_addrs = pod_addrs(&world.add(&web, &web_mappings()));
    let other_addrs = pod_addrs(&world.add(&other, &[]));
    Setup {
        world,
        web,
        other,
        web_addrs,
        other_addrs,
        tcp,
        udp,
    }
}

/// Each container dials web's host ports on the node's uplink addresses,
/// TCP and unconnected UDP, both families; the answering container must
/// see, per dial, the source `seen_as(client, family)` gives.
fn dial_everything(n: &Setup, seen_as: impl Fn(&Container, bool) -> IpAddr) -> usize {
    let mut dials = 0;
    for client in [&n.web, &n.other] {
        for (node_ip, v6) in [(IpAddr::V4(NODE_IP4), false), (IpAddr::V6(NODE_IP6), true)] {
            for (target, mode, server) in [
                (sock(node_ip, 8080), "tcp", &n.tcp),
                (sock(node_ip, 5353), "udp-unconnected", &n.udp),
            ] {
                let what = format!("{} -> {target} {mode}", client.id);
                let seen_before = server.peers().len();
                expect(
                    &n.world,
                    &what,
                    probe(&n.world, &client.ns, mode, target),
                    target,
                    "cs-web",
                );
                let expected = seen_as(client, v6);
                let peers = server.peers();
                assert!(
                    peers.len() > seen_before
                        && peers[seen_before..].iter().all(|p| p.ip() == expected),
                    "{what}: the answering container must see {expected}, saw {:?}\n{}",
                    &peers[seen_before..],
                    n.world.dump()
                );
                dials += 1;
            }
        }
    }
    dials
}

fn masquerade(v6: bool) -> IpAddr {
    if v6 {
        IpAddr::V6(POD_GATEWAY6)
    } else {
        IpAddr::V4(POD_GATEWAY4)
    }
}

/// Default and explicit `false`: the packet path, masqueraded; the socket
/// counters do not move.
#[test]
fn without_container_sockets_containers_take_the_masqueraded_packet_path() {
    for setting in [None, Some(false)] {
        let n = node(setting);
        let before = n.world.counters();
        let dials = dial_everything(&n, |_, v6| masquerade(v6));
        let after = n.world.counters();
        assert_eq!(
            counter(&after, "sock_translated"),
            counter(&before, "sock_translated"),
            "containerSockets {setting:?}: no container socket may be rewritten"
        );
        assert!(
            counter(&after, "sock_other_netns")
                >= counter(&before, "sock_other_netns") + dials as u64,
            "containerSockets {setting:?}: each dial is left alone as another namespace's: {after:#}"
        );
        assert!(
            counter(&after, "masq") >= counter(&before, "masq") + dials as u64,
            "containerSockets {setting:?}: every hairpin flow is masqueraded: {after:#}"
        );
        for (host, connects, sendmsgs) in sock_counts(&n.world) {
            assert_eq!(
                (connects, sendmsgs),
                (0, 0),
                "containerSockets {setting:?}: {host}: no socket translation counted"
            );
        }
    }
}

/// `containerSockets: true`: the same dials are translated at the socket;
/// the answering container sees the dialling pod; `list` counts each; the
/// container's own loopback stays its own.
#[test]
fn with_container_sockets_containers_are_translated_at_the_socket() {
    let n = node(Some(true));
    // A service of `other` on its own loopback, on web's host port.
    let own = tcp_echo_server(&n.other.ns, 8080, "cs-own");
    let before = n.world.counters();
    let masq_before = counter(&before, "masq");
    let addr_of = |client: &Container, v6: bool| {
        let (v4, v6addr) = if client.id == n.web.id {
            n.web_addrs
        } else {
            n.other_addrs
        };
        if v6 { v6addr } else { v4 }
    };
    let dials = dial_everything(&n, addr_of);
    let after = n.world.counters();
    assert_eq!(
        counter(&after, "sock_translated"),
        counter(&before, "sock_translated") + dials as u64,
        "every container dial is translated at the socket: {after:#}"
    );
    assert_eq!(
        counter(&after, "masq"),
        masq_before,
        "nothing is masqueraded on the socket path: {after:#}"
    );
    // Two clients per row: web and other, one dial each.
    for (host, connects, sendmsgs) in sock_counts(&n.world) {
        let expected = if host.ends_with("/tcp") {
            (2, 0)
        } else {
            (0, 2)
        };
        assert_eq!(
            (connects, sendmsgs),
            expected,
            "{host}: sockConnects/sockSendmsgs count the containers' translations"
        );
    }
    // The container's own loopback: its own service answers, untranslated,
    // TCP and UDP, both families.
    let _own_udp = udp_echo_server(&n.other.ns, 5353, "cs-own");
    let translated = counter(&n.world.counters(), "sock_translated");
    for loopback in ["127.0.0.1", "::1"] {
        let loopback: IpAddr = loopback.parse().unwrap();
        for (target, mode) in [(sock(loopback, 8080), "tcp"), (sock(loopback, 5353), "udp")] {
            expect(
                &n.world,
                &format!("other -> its own {target} {mode}"),
                probe(&n.world, &n.other.ns, mode, target),
                target,
                "cs-own",
            );
        }
    }
    assert_eq!(
        counter(&n.world.counters(), "sock_translated"),
        translated,
        "a container's own loopback is never translated"
    );
    drop(own);
}

/// After the dialling container's DEL (the second DEL's form: no
/// `CNI_NETNS`, no prevResult; our plugin alone, so its veth stays and the
/// namespace is still on the bridge), its sockets are left alone and it is
/// served by the packet path. GC forgets a container it does not list.
#[test]
fn del_and_gc_forget_a_container_namespace() {
    let n = node(Some(true));
    let target = sock(NODE_IP4, 8080);
    let seen = |n: &Setup| n.tcp.peers().last().map(SocketAddr::ip);

    // Registered: translated, the pod is the source.
    let before = counter(&n.world.counters(), "sock_translated");
    expect(
        &n.world,
        "other -> node (registered)",
        probe(&n.world, &n.other.ns, "tcp", target),
        target,
        "cs-web",
    );
    assert_eq!(
        seen(&n),
        Some(n.other_addrs.0),
        "registered: the pod is the source"
    );
    assert_eq!(counter(&n.world.counters(), "sock_translated"), before + 1);

    // CHECK sees the registration.
    let other_rt = n.other.with_port_mappings(&[]);
    n.world
        .runner
        .check(&n.world.list, &other_rt)
        .unwrap_or_else(|e| panic!("CHECK of a registered container: {e}"));

    // DEL with an empty CNI_NETNS and no prevResult.
    let mut gone = n.other.with_port_mappings(&[]);
    gone.netns_path = PathBuf::new();
    n.world
        .exec_ours(CniCommand::Del, &gone, None)
        .unwrap_or_else(|e| panic!("DEL without CNI_NETNS: {e}"));
    let before = n.world.counters();
    expect(
        &n.world,
        "other -> node (after DEL)",
        probe(&n.world, &n.other.ns, "tcp", target),
        target,
        "cs-web",
    );
    assert_eq!(
        seen(&n),
        Some(IpAddr::V4(POD_GATEWAY4)),
        "after DEL: the packet path, masqueraded"
    );
    let after = n.world.counters();
    assert_eq!(
        counter(&after, "sock_translated"),
        counter(&before, "sock_translated"),
        "after DEL the namespace is no longer translated"
    );
    assert!(counter(&after, "sock_other_netns") > counter(&before, "sock_other_netns"));
    // CHECK now says what is missing (the bridge's own CHECK still passes:
    // the veth is there).
    let failure = n
        .world
        .runner
        .check(&n.world.list, &other_rt)
        .expect_err("CHECK of a container whose registration is gone must fail");
    let error = failure.error_json.clone().unwrap_or_default();
    assert_eq!(error["code"], 103, "CHECK failed code: {failure}");
    assert!(
        error["msg"]
            .as_str()
            .is_some_and(|m| m.contains("containerSockets") && m.contains("cs-other")),
        "CHECK says which container is not registered: {error}"
    );

    // A third container, registered, then collected by a GC that lists
    // only web.
    let third = n.world.node.add_container("cs-third");
    let third_addrs = pod_addrs(&n.world.add(&third, &[]));
    expect(
        &n.world,
        "third -> node (registered)",
        probe(&n.world, &third.ns, "tcp", target),
        target,
        "cs-web",
    );
    assert_eq!(
        seen(&n),
        Some(third_addrs.0),
        "registered: the pod is the source"
    );
    let mut gc = gc_plugin_config(
        &n.world.list,
        n.world.our_plugin(),
        &[GcAttachment::from(
            &n.web.with_port_mappings(&web_mappings()),
        )],
    );
    gc["cniVersion"] = Value::from("1.1.0");
    n.world
        .runner
        .exec_plugin("ebpf-portmap", CniCommand::Gc, None, &gc)
        .unwrap_or_else(|e| panic!("GC: {e}"));
    let before = counter(&n.world.counters(), "sock_translated");
    expect(
        &n.world,
        "third -> node (after GC)",
        probe(&n.world, &third.ns, "tcp", target),
        target,
        "cs-web",
    );
    assert_eq!(
        seen(&n),
        Some(IpAddr::V4(POD_GATEWAY4)),
        "after GC: the packet path, masqueraded"
    );
    assert_eq!(
        counter(&n.world.counters(), "sock_translated"),
        before,
        "after GC the namespace is no longer translated"
    );
    // web is still listed: still registered.
    expect(
        &n.world,
        "web -> node (kept by GC)",
        probe(&n.world, &n.web.ns, "tcp", target),
        target,
        "cs-web",
    );
    assert_eq!(seen(&n), Some(n.web_addrs.0), "GC keeps what it lists");
}

/// A namespace the node never set up (a client joined by a veth), in the
/// hooked cgroup, with `containerSockets` on: never translated, served by
/// the packet path.
#[test]
fn with_container_sockets_a_namespace_the_node_never_set_up_is_not_translated() {
    let n = node(Some(true));
    let side = n
        .world
        .node
        .add_side_link("side0", "198.51.100.1/24", "198.51.100.2/24");
    let side4: IpAddr = "198.51.100.1".parse().unwrap();
    // The next ADD attaches the programs to the new link.
    let late = n.world.node.add_container("cs-late");
    n.world.add(&late, &[]);
    let before = n.world.counters();
    for (target, mode) in [(sock(side4, 8080), "tcp"), (sock(side4, 5353), "udp")] {
        expect(
            &n.world,
            &format!("side namespace -> {target} {mode}"),
            probe(&n.world, &side, mode, target),
            target,
            "cs-web",
        );
    }
    let after = n.world.counters();
    assert_eq!(
        counter(&after, "sock_translated"),
        counter(&before, "sock_translated"),
        "no socket of an unknown namespace may be rewritten"
    );
    assert!(
        counter(&after, "sock_other_netns") >= counter(&before, "sock_other_netns") + 2,
        "each dial is counted as another namespace's: {after:#}"
    );
}
