//! A real firewalld (Debian's, nftables backend, stock zones) in the test
//! node's network namespace, never the root namespace's (see
//! `portmap_tests::firewalld`), in the zone layouts operators use: nothing
//! bound (firewalld's default), the uplink in `public`, the bridge in
//! `trusted`, the pod subnets as sources of `trusted`, and the bridge in
//! `public` with the uplink. TCP and UDP, IPv4 and IPv6.
//!
//! Its FORWARD chain accepts what conntrack holds as DNAT and judges the
//! rest by its zones. Side by side with upstream portmap in the same
//! world: upstream's DNAT flows are accepted; ours in the default mode are
//! DNAT to netfilter too (firewalld's nat chains hook netfilter's NAT, and
//! new flows get the kernel's DNAT entry: issue 50), and are accepted in
//! every layout; ours with `fastPath: true` skip FORWARD and answer;
//! `status` says firewalld is there and where flows are translated. Needs
//! root.

use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use portmap_tests::firewalld::Firewalld;
use portmap_tests::topology::{
    BRIDGE_NAME, NODE_IP4, NODE_IP6, NODE_UPLINK, POD_SUBNET4, POD_SUBNET6,
};
use portmap_tests::world::{FakeContainer, World, operator_json};
use portmap_tests::{PortMapping, bridge_conflist};
use serde_json::Value;

const HOST_PORT: u16 = 8099;
const PORT: u16 = 80;
const UDP_HOST_PORT: u16 = 5399;
const UDP_PORT: u16 = 53;
/// What a client waits for an answer or a refusal.
const PATIENCE: Duration = Duration::from_secs(3);

/// ebpf-portmap with `fastPath` as given, or upstream portmap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    OursDefault,
    OursFast,
    /// The default mode with `masqAll: true`.
    OursMasqAll,
    Upstream,
}

fn world(side: Side) -> World {
    World::with(|name, pins, data| match side {
        Side::Upstream => bridge_conflist(name, "portmap", None, data),
        Side::OursDefault | Side::OursFast | Side::OursMasqAll => {
            let list = bridge_conflist(name, "ebpf-portmap", Some(pins), data);
            let mut json = list.json().clone();
            let plugin = json["plugins"][1]
                .as_object_mut()
                .expect("the plugin entry");
            if side == Side::OursFast {
                plugin.insert("fastPath".into(), Value::Bool(true));
            } else {
                plugin.remove("fastPath");
            }
            if side == Side::OursMasqAll {
                plugin.insert("masqAll".into(), Value::Bool(true));
            }
            portmap_tests::Conflist::from_json(json).expect("conflist")
        }
    })
}

/// A container listening on TCP [`PORT`] and echoing UDP on [`UDP_PORT`]
/// (both families), published on [`HOST_PORT`] and [`UDP_HOST_PORT`].
struct Served {
    _listener: TcpListener,
    _echo: std::thread::JoinHandle<()>,
}

fn serve(world: &World) -> Served {
    let web = world.node.add_container("web");
    let any = SocketAddr::new(IpAddr::from([0u16; 8]), PORT);
    let listener = web
        .ns
        .run(|| TcpListener::bind(any))
        .expect("listen in the container");
    let udp = web
        .ns
        .run(|| UdpSocket::bind(SocketAddr::new(any.ip(), UDP_PORT)))
        .expect("a UDP socket in the container");
    let echo = std::thread::spawn(move || {
        let mut buf = [0u8; 64];
        while let Ok((n, from)) = udp.recv_from(&mut buf) {
            let _ = udp.send_to(&buf[..n], from);
        }
    });
    world.add(
        &web,
        &[
            PortMapping::tcp(HOST_PORT, PORT),
            PortMapping::udp(UDP_HOST_PORT, UDP_PORT),
        ],
    );
    Served {
        _listener: listener,
        _echo: echo,
    }
}

/// The client's connect to the host port at `node`: `Ok` if it connected,
/// else the error and how long it took to come.
fn connect(world: &World, node: IpAddr) -> Result<(), (std::io::Error, Duration)> {
    let start = Instant::now();
    world
        .node
        .ext
        .run(|| TcpStream::connect_timeout(&SocketAddr::new(node, HOST_PORT), PATIENCE))
        .map(drop)
        .map_err(|e| (e, start.elapsed()))
}

fn nodes() -> [IpAddr; 2] {
    [NODE_IP4.into(), NODE_IP6.into()]
}

/// A datagram from the client to the UDP host port at `node`, and whether
/// its echo came back within [`PATIENCE`].
fn udp_answered(world: &World, node: IpAddr) -> bool {
    world.node.ext.run(|| {
        let any = if node.is_ipv4() {
            IpAddr::from([0u8; 4])
        } else {
            IpAddr::from([0u16; 8])
        };
        let Ok(socket) = UdpSocket::bind(SocketAddr::new(any, 0)) else {
            return false;
        };
        let mut buf = [0u8; 64];
        socket.connect(SocketAddr::new(node, UDP_HOST_PORT)).is_ok()
            && socket.set_read_timeout(Some(PATIENCE)).is_ok()
            && socket.send(b"hello").is_ok()
            && socket.recv(&mut buf).is_ok_and(|n| &buf[..n] == b"hello")
    })
}

/// The zone layouts of the module docs: what each one binds, by
/// `firewall-cmd` arguments (runtime configuration).
fn layouts() -> Vec<(&'static str, Vec<Vec<String>>)> {
    let args = |zone: &str, what: &[(&str, &str)]| -> Vec<String> {
        let mut args = vec![format!("--zone={zone}")];
        args.extend(what.iter().map(|(k, v)| format!("--{k}={v}")));
        args
    };
    vec![
        ("nothing bound", vec![]),
        (
            "uplink in public",
            vec![args("public", &[("add-interface", NODE_UPLINK)])],
        ),
        (
            "bridge in trusted",
            vec![args("trusted", &[("add-interface", BRIDGE_NAME)])],
        ),
        (
            "pod subnets as sources of trusted",
            vec![args(
                "trusted",
                &[("add-source", POD_SUBNET4), ("add-source", POD_SUBNET6)],
            )],
        ),
        (
            "bridge in public with the uplink",
            vec![args(
                "public",
                &[
                    ("add-interface", NODE_UPLINK),
                    ("add-interface", BRIDGE_NAME),
                ],
            )],
        ),
    ]
}

/// Every layout answers TCP and UDP over both families: upstream portmap
/// (a world per layout: firewalld set up before the pod, as on a node
/// that boots; a `--reload` after upstream's ADD left its host ports
/// refused, "No route to host", seen and not pursued), and ours with
/// `fastPath: true` (one world, the layouts one after another with a
/// `--reload` between them, which our maps do not mind).
#[test]
fn behind_firewalld_upstreams_and_our_fast_path_flows_answer_in_every_layout() {
    for (layout, commands) in layouts() {
        let world = world(Side::Upstream);
        let firewalld = Firewalld::start(&world.node.ns);
        apply(&firewalld, &world, &commands);
        let _served = serve(&world);
        expect_answers(&world, &firewalld, Side::Upstream, layout);
    }
    let world = world(Side::OursFast);
    let firewalld = Firewalld::start(&world.node.ns);
    let _served = serve(&world);
    for (layout, commands) in layouts() {
        apply(&firewalld, &world, &commands);
        expect_answers(&world, &firewalld, Side::OursFast, layout);
    }
}

fn expect_answers(world: &World, firewalld: &Firewalld, side: Side, layout: &str) {
    for node in nodes() {
        if let Err((e, took)) = connect(world, node) {
            panic!(
                "{side:?}, {layout}: TCP to {node}:{HOST_PORT} behind firewalld: {e} after {took:?}\nzones: {}",
                firewalld.cmd(&world.node.ns, &["--get-active-zones"])
            );
        }
        assert!(
            udp_answered(world, node),
            "{side:?}, {layout}: UDP to {node}:{UDP_HOST_PORT} behind firewalld got no answer"
        );
    }
}

/// Puts firewalld's runtime configuration back to its permanent one
/// (nothing bound), then binds what `commands` say.
fn apply(firewalld: &Firewalld, world: &World, commands: &[Vec<String>]) {
    firewalld.cmd(&world.node.ns, &["--reload"]);
    for command in commands {
        let args: Vec<&str> = command.iter().map(String::as_str).collect();
        firewalld.cmd(&world.node.ns, &args);
    }
}

/// The default mode answers in every layout too: on a node with the NAT
/// kfuncs, firewalld's nat chains hook netfilter's NAT, so new flows get
/// the kernel's DNAT entry (issue 50), which firewalld's FORWARD accepts
/// (`ct status dnat`), as upstream's. Before that, only the layout whose
/// zone forwards within itself answered, and the rest were refused.
#[test]
fn behind_firewalld_our_default_flows_answer_in_every_layout() {
    let world = world(Side::OursDefault);
    let firewalld = Firewalld::start(&world.node.ns);
    let _served = serve(&world);
    for (layout, commands) in layouts() {
        apply(&firewalld, &world, &commands);
        expect_answers(&world, &firewalld, Side::OursDefault, layout);
    }
}

/// `status` says firewalld runs, and that new flows are translated by
/// netfilter (so no note about firewalld refusing them); with
/// `fastPath: true` it names what the fast path skips.
#[test]
fn status_says_firewalld_runs_and_where_flows_are_translated() {
    let world = world(Side::OursDefault);
    let firewalld = Firewalld::start(&world.node.ns);
    let _served = serve(&world);
    let status = operator_json(&world.node.ns, world.pins.path(), "status");
    assert_eq!(status["firewalld"], Value::Bool(true), "{status:#}");
    assert_eq!(
        status["translation"]["ipv4"],
        Value::from("netfilter"),
        "{status:#}"
    );
    assert_eq!(
        status["translation"]["ipv6"],
        Value::from("netfilter"),
        "{status:#}"
    );
    let notes = status["notes"].to_string();
    assert!(
        !notes.contains("firewalld runs in this network namespace"),
        "no firewalld note where netfilter translates: {notes}"
    );
    drop(firewalld);
    let after = operator_json(&world.node.ns, world.pins.path(), "status");
    assert_eq!(
        after["firewalld"],
        Value::Bool(false),
        "firewalld's table is gone with it: {after:#}"
    );
    let fast = self::world(Side::OursFast);
    let firewalld = Firewalld::start(&fast.node.ns);
    let _served = serve(&fast);
    let status = operator_json(&fast.node.ns, fast.pins.path(), "status");
    assert_eq!(
        status["translation"]["ipv4"],
        Value::from("tc"),
        "{status:#}"
    );
    let notes = status["notes"].to_string();
    assert!(
        notes.contains("firewalld runs in this network namespace")
            && notes.contains("skip FORWARD"),
        "status names what fastPath: true skips: {notes}"
    );
    drop(firewalld);
}

/// ADD refuses, with firewalld's name and the fix, a mapping whose flows
/// would be translated in tc (issue 50): SCTP here, which the kernel
/// gives no conntrack entry with NAT, so firewalld's FORWARD would refuse
/// its clients in every layout but one. Nothing of the container is
/// written: none of its mappings (its TCP one included), no row in
/// `list`, and its DEL succeeds. Without firewalld, and with
/// `fastPath: true` (whose flows skip FORWARD), the same ADD succeeds.
/// Our plugin alone: a hand-made prevResult, no SCTP traffic (this host's
/// kernel has no SCTP).
#[test]
fn behind_firewalld_add_refuses_mappings_it_would_translate_in_tc() {
    let mappings = vec![
        PortMapping::sctp(9099, 99),
        PortMapping::tcp(HOST_PORT + 1, PORT),
    ];
    let world = world(Side::OursDefault);
    let firewalld = Firewalld::start(&world.node.ns);
    // A container whose TCP and UDP flows netfilter translates is added.
    let _served = serve(&world);
    let before = world.mapping_count();
    let pod = FakeContainer::new(&world, "sctp-pod", 1, mappings.clone());
    let refused = pod
        .add(&world)
        .expect_err("ADD of an SCTP mapping behind firewalld");
    for needle in ["firewalld", ":9099/sctp", "\"fastPath\": true"] {
        assert!(
            refused.contains(needle),
            "{needle:?} in the error: {refused}"
        );
    }
    assert!(
        !refused.contains(&format!(":{}/tcp", HOST_PORT + 1)),
        "the TCP mapping is netfilter's, not named: {refused}"
    );
    assert_eq!(
        world.mapping_count(),
        before,
        "nothing claimed: {}",
        world.dump()
    );
    assert!(
        !world.list().to_string().contains("sctp-pod"),
        "no row of the refused container: {:#}",
        world.list()
    );
    pod.del(&world).expect("DEL after the refused ADD");
    // firewalld gone (its table with it): the same ADD publishes.
    drop(firewalld);
    pod.add(&world).expect("ADD without firewalld");
    // Each mapping once per family of the prevResult.
    assert_eq!(world.mapping_count(), before + 4, "{}", world.dump());
    pod.del(&world).expect("DEL");

    let fast = self::world(Side::OursFast);
    let firewalld = Firewalld::start(&fast.node.ns);
    let pod = FakeContainer::new(&fast, "sctp-pod", 1, mappings);
    pod.add(&fast)
        .expect("ADD behind firewalld with fastPath: true");
    pod.del(&fast).expect("DEL");
    drop(firewalld);
}

/// `masqAll: true` masquerades every flow from outside in tc and never
/// hands one past FORWARD, so firewalld judges them by its zones: refused
/// (admin-prohibited, "No route to host") where nothing is bound, answered
/// where the uplink and the bridge share a forwarding zone. ADD does not
/// refuse them (`fastPath` is no fix for them, and such a layout serves
/// them); `status` says they are translated in tc and notes firewalld.
#[test]
fn behind_firewalld_masq_all_flows_answer_only_where_zones_forward() {
    let world = world(Side::OursMasqAll);
    let firewalld = Firewalld::start(&world.node.ns);
    let _served = serve(&world);
    let status = operator_json(&world.node.ns, world.pins.path(), "status");
    for family in ["ipv4", "ipv6"] {
        assert_eq!(
            status["translation"][family],
            Value::from("tc"),
            "{status:#}"
        );
    }
    let notes = status["notes"].to_string();
    assert!(
        notes.contains("firewalld runs in this network namespace") && notes.contains("masqAll"),
        "status notes firewalld and masqAll: {notes}"
    );
    let mut layouts = layouts();
    let (name, commands) = layouts.first().expect("the unbound layout");
    apply(&firewalld, &world, commands);
    for node in nodes() {
        let refused = connect(&world, node);
        assert!(
            refused.as_ref().is_err_and(|(_, took)| *took < PATIENCE),
            "masqAll, {name}: TCP to {node} refused at once: {refused:?}"
        );
    }
    let (name, commands) = layouts.pop().expect("the shared-zone layout");
    apply(&firewalld, &world, &commands);
    expect_answers(&world, &firewalld, Side::OursMasqAll, name);
}
