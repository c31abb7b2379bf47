//! Which source port a masqueraded hairpin flow gets, and the node's own
//! connections to a container on the same tuple (issue 37). A pod dialling
//! a hostPort through the node's address, with the socket hooks not
//! covering it, is masqueraded to the node's bridge address; its own port
//! is kept when the tuple is free, as netfilter's masquerade keeps it (a
//! container holding the tuple in TIME_WAIT then takes the client's next
//! SYN there, whose timestamps only the same client tuple keeps in order).
//! A kept port may be one the node uses too, talking to the container
//! straight from its bridge address (a kubelet probe does): the node's
//! connection must still reach the node, whichever comes first. A tuple
//! another client tuple had less than a TIME_WAIT ago is not given to a
//! new one, even once our conntrack has forgotten that flow. TCP, v4 and
//! v6. Needs root.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use portmap_tests::cni::result_addresses;
use portmap_tests::topology::{NODE_IP4, NODE_IP6, POD_GATEWAY4, POD_GATEWAY6};
use portmap_tests::traffic::{ServerHandle, TcpSession, tcp_connect_from, tcp_echo_server};
use portmap_tests::world::{World, counter, sock};
use portmap_tests::{Container, PortMapping};

const TIMEOUT: Duration = Duration::from_secs(3);

struct Hairpin {
    world: World,
    web: Container,
    client: Container,
    web_addrs: Vec<IpAddr>,
    server: ServerHandle,
}

/// `web` serves TCP 80 as host port 8080; `client` maps nothing. Every
/// connection of the test is made by the test process itself, outside the
/// hooked cgroup: pods take the packet path.
fn hairpin() -> Hairpin {
    let world = World::bridge();
    let web = world.node.add_container("hpp-web");
    let client = world.node.add_container("hpp-client");
    let server = tcp_echo_server(&web.ns, 80, "hpp-web");
    let result = world.add(&web, &[PortMapping::tcp(8080, 80)]);
    world.add(&client, &[]);
    let web_addrs = result_addresses(&result);
    Hairpin {
        world,
        web,
        client,
        web_addrs,
        server,
    }
}

/// The families: (node address, node's bridge address, web's address).
fn families(h: &Hairpin) -> [(IpAddr, IpAddr, IpAddr); 2] {
    let web = |v4: bool| {
        *h.web_addrs
            .iter()
            .find(|a| a.is_ipv4() == v4)
            .expect("web has an address of each family")
    };
    [
        (NODE_IP4.into(), POD_GATEWAY4.into(), web(true)),
        (NODE_IP6.into(), POD_GATEWAY6.into(), web(false)),
    ]
}

fn unspecified(like: IpAddr) -> IpAddr {
    if like.is_ipv4() {
        IpAddr::from([0, 0, 0, 0])
    } else {
        IpAddr::from([0u16; 8])
    }
}

fn echo(session: &mut TcpSession, what: &str, payload: &str) {
    let answer = session
        .request(payload, TIMEOUT)
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(answer, format!("hpp-web {payload}"), "{what}");
}

/// The client pod's connection from its own `port` to the node's host
/// port 8080.
fn pod_dials(h: &Hairpin, node: IpAddr, port: u16) -> TcpSession {
    tcp_connect_from(
        &h.client.ns,
        SocketAddr::new(unspecified(node), port),
        sock(node, 8080),
        TIMEOUT,
    )
    .unwrap_or_else(|e| panic!("client pod :{port} -> {node}:8080: {e}\n{}", h.world.dump()))
}

/// The node's connection from its bridge address `gateway` and `port`
/// straight to the container (`web`:80).
fn node_dials(h: &Hairpin, gateway: IpAddr, port: u16, web: IpAddr, when: &str) -> TcpSession {
    tcp_connect_from(
        &h.world.node.ns,
        SocketAddr::new(gateway, port),
        sock(web, 80),
        TIMEOUT,
    )
    .unwrap_or_else(|e| {
        panic!(
            "node {gateway}:{port} -> {web}:80 {when}: {e}\n{}",
            h.world.dump()
        )
    })
}

/// Removes every entry of the closed conntrack table, as churn evicts
/// them (the table is a quarter of the open one, a fraction of a second of
/// closed flows at thousands of connections a second).
fn forget_closed_flows(world: &World) {
    let path = world.pins.path().join("v1/maps/conntrack_close");
    for entry in world
        .dump_map("conntrack_close")
        .as_array()
        .into_iter()
        .flatten()
    {
        let key: Vec<String> = entry["key"]
            .as_array()
            .unwrap_or_else(|| panic!("no key bytes in {entry}"))
            .iter()
            .map(|b| b.as_str().expect("key bytes as hex strings").to_owned())
            .collect();
        let out = std::process::Command::new("bpftool")
            .args(["map", "delete", "pinned"])
            .arg(&path)
            .arg("key")
            .arg("hex")
            .args(key.iter().map(|b| b.trim_start_matches("0x")))
            .output()
            .expect("run bpftool");
        assert!(
            out.status.success(),
            "bpftool map delete: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert_eq!(
        world.dump_map("conntrack_close").as_array().map(Vec::len),
        Some(0),
        "the closed flows are forgotten"
    );
}

/// The peer the server saw last.
fn last_peer(server: &ServerHandle) -> SocketAddr {
    *server.peers().last().expect("the server saw a connection")
}

/// A pod's hairpin flow keeps the pod's own port: the container sees the
/// node's bridge address and that port.
#[test]
fn a_hairpin_flow_keeps_the_clients_port_when_it_is_free() {
    let h = hairpin();
    for (i, (node, gateway, _)) in families(&h).into_iter().enumerate() {
        let port = 41000 + i as u16;
        let mut pod = pod_dials(&h, node, port);
        echo(&mut pod, "client pod through the node", "kept");
        assert_eq!(
            last_peer(&h.server),
            SocketAddr::new(gateway, port),
            "the container sees the node's bridge address and the client's own port"
        );
    }
}

/// The node holds a connection to the container from its bridge address
/// and port P; a pod then dials the host port from its own port P: its
/// flow gets another masquerade port, and both connections keep working.
#[test]
fn a_port_a_node_connection_holds_is_not_kept() {
    let h = hairpin();
    let before = h.world.counters();
    for (i, (node, gateway, web)) in families(&h).into_iter().enumerate() {
        let port = 42000 + i as u16;
        let mut direct = node_dials(&h, gateway, port, web, "before the pod dials");
        echo(&mut direct, "the node's own connection", "node");
        let mut pod = pod_dials(&h, node, port);
        echo(&mut pod, "client pod through the node", "pod");
        let seen = last_peer(&h.server);
        assert_eq!(seen.ip(), gateway, "masqueraded to the bridge address");
        assert_ne!(
            seen.port(),
            port,
            "the node's connection holds that tuple: another port"
        );
        echo(
            &mut direct,
            "the node's own connection, after",
            "node again",
        );
        echo(&mut pod, "client pod through the node, after", "pod again");
    }
    let after = h.world.counters();
    assert!(
        counter(&after, "masq_port_node_held") >= counter(&before, "masq_port_node_held") + 2,
        "each pass-over is counted: {after:#}"
    );
}

/// A pod's hairpin flow holds bridge address and port P with the
/// container, open; the node then dials the container straight from that
/// address and port (as a probe may, its port picked by the kernel): the
/// node's connection is remapped and reaches the node, and the pod's flow
/// keeps working.
#[test]
fn a_node_connection_on_an_open_hairpin_tuple_is_remapped() {
    let h = hairpin();
    let before = h.world.counters();
    for (i, (node, gateway, web)) in families(&h).into_iter().enumerate() {
        let port = 43000 + i as u16;
        let mut pod = pod_dials(&h, node, port);
        echo(&mut pod, "client pod through the node", "pod");
        assert_eq!(last_peer(&h.server), SocketAddr::new(gateway, port));
        let mut direct = node_dials(
            &h,
            gateway,
            port,
            web,
            "while a hairpin flow holds the tuple",
        );
        echo(&mut direct, "the node's own connection", "node");
        echo(&mut pod, "client pod through the node, after", "pod again");
    }
    let after = h.world.counters();
    assert!(
        counter(&after, "node_flow_remapped") >= counter(&before, "node_flow_remapped") + 2,
        "each remap is counted: {after:#}"
    );
}

/// A pod's hairpin flow on bridge address and port P closed a moment ago
/// (its entries linger for late packets); the node then dials the
/// container from that address and port: the lingering entries give the
/// tuple up and the node's connection reaches the node.
#[test]
fn a_node_connection_on_a_closed_hairpin_tuple_takes_it_over() {
    let h = hairpin();
    let before = h.world.counters();
    for (i, (node, gateway, web)) in families(&h).into_iter().enumerate() {
        let port = 44000 + i as u16;
        let mut pod = pod_dials(&h, node, port);
        echo(&mut pod, "client pod through the node", "pod");
        // The pod closes first: the TIME_WAIT is the pod's, the container
        // forgets the tuple once the close is done.
        drop(pod);
        std::thread::sleep(Duration::from_millis(300));
        let mut direct = node_dials(&h, gateway, port, web, "after a hairpin flow there closed");
        echo(&mut direct, "the node's own connection", "node");
        assert_eq!(
            last_peer(&h.server),
            SocketAddr::new(gateway, port),
            "the node's connection keeps its own port"
        );
    }
    let after = h.world.counters();
    assert!(
        counter(&after, "masq_tuple_released") >= counter(&before, "masq_tuple_released") + 2,
        "each release is counted: {after:#}"
    );
}

/// The pod serving the port dials itself through the node from port P and
/// closes; its closed flow is then evicted from our conntrack. Another pod
/// dials from its own port P within the container's TIME_WAIT: it gets
/// another port (Linux gives every client tuple its own TCP timestamp
/// offset, so a TIME_WAIT refuses half the SYNs of any other tuple), and
/// gets that same port again on its next flow; the first client tuple's
/// next flow gets P again.
#[test]
fn a_tuple_another_client_had_lately_is_not_given_away() {
    let h = hairpin();
    for (i, (node, gateway, _)) in families(&h).into_iter().enumerate() {
        let port = 45000 + i as u16;
        let itself = |when: &str| {
            let mut session = tcp_connect_from(
                &h.web.ns,
                SocketAddr::new(unspecified(node), port),
                sock(node, 8080),
                TIMEOUT,
            )
            .unwrap_or_else(|e| panic!("web :{port} -> {node}:8080 {when}: {e}"));
            echo(&mut session, "the serving pod through the node", "self");
            assert_eq!(
                last_peer(&h.server),
                SocketAddr::new(gateway, port),
                "the serving pod keeps its own port {when}"
            );
        };
        itself("first");
        std::thread::sleep(Duration::from_millis(300));
        forget_closed_flows(&h.world);
        let mut pod = pod_dials(&h, node, port);
        echo(&mut pod, "client pod through the node", "other");
        let seen = last_peer(&h.server);
        assert_eq!(seen.ip(), gateway, "masqueraded to the bridge address");
        assert_ne!(
            seen.port(),
            port,
            "another client tuple had that tuple a moment ago: another port\n{}",
            h.world.dump()
        );
        drop(pod);
        std::thread::sleep(Duration::from_millis(300));
        forget_closed_flows(&h.world);
        // The pod's next flow from P, its last one forgotten too: the same
        // other port, the one its TIME_WAIT is on.
        let mut pod = pod_dials(&h, node, port);
        echo(
            &mut pod,
            "client pod through the node, again",
            "other again",
        );
        assert_eq!(
            last_peer(&h.server),
            seen,
            "the same client tuple finds its port again"
        );
        drop(pod);
        std::thread::sleep(Duration::from_millis(300));
        forget_closed_flows(&h.world);
        itself("again, after the other pod's flows");
    }
}
