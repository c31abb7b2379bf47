//! HostPort flows are real DNAT to the node's netfilter (issue 50), as
//! upstream portmap's: on a node where netfilter's NAT is hooked (a nat
//! chain of the family exists, as kube-proxy, firewalld, podman and Docker
//! make one) and the kernel has the NAT kfuncs, a new TCP or UDP flow
//! from outside gets the kernel's conntrack entry with its DNAT, and
//! netfilter's NAT translates it. Side by side with upstream portmap in
//! the same world, over IPv4 and IPv6:
//!
//! - `conntrack -L` shows the host port (original `client -> node:hostPort`,
//!   reply from `pod:port`), and a UDP flow's answers count as replies;
//! - a rule on the original destination (`--ctorigdst`, `--ctorigdstport`)
//!   decides the flow;
//! - `conntrack -D` does to a live flow what it does under upstream;
//! - without any nat chain, translation stays in tc, and `status` says
//!   why; a nat chain made later counts from the next ADD.
//!
//! Needs root.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use portmap_tests::cni::result_addresses;
use portmap_tests::topology::{Container, Family};
use portmap_tests::traffic::{
    ServerHandle, tcp_connect, tcp_echo_server, tcp_request, udp_echo_server, udp_request,
};
use portmap_tests::world::{World, counter, operator_json};
use portmap_tests::{PortMapping, bridge_conflist};
use serde_json::Value;

const TCP_HOST_PORT: u16 = 8099;
const UDP_HOST_PORT: u16 = 5399;
const TCP_PORT: u16 = 80;
const UDP_PORT: u16 = 53;
const PATIENCE: Duration = Duration::from_secs(3);
/// How long a refused flow is given before it counts as stopped.
const STOPPED: Duration = Duration::from_secs(2);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Plugin {
    Ours,
    Upstream,
}

/// The world of `plugin` (default settings) on a node with kube-proxy's
/// rules (its nat chains and its FORWARD rule, which uses conntrack) made
/// before the first ADD.
fn world(plugin: Plugin) -> World {
    let world = match plugin {
        Plugin::Ours => World::bridge(),
        Plugin::Upstream => {
            World::with(|name, _pins, data| bridge_conflist(name, "portmap", None, data))
        }
    };
    world.node.hook_nat();
    world.node.drop_invalid_at_forward();
    world
}

/// A container echoing TCP on [`TCP_PORT`] and UDP on [`UDP_PORT`],
/// published on the host ports; its addresses.
struct Served {
    pods: Vec<IpAddr>,
    _tcp: ServerHandle,
    _udp: ServerHandle,
    _container: Container,
}

impl Served {
    fn pod(&self, family: Family) -> IpAddr {
        *self
            .pods
            .iter()
            .find(|ip| ip.is_ipv4() == family.is_v4())
            .expect("the container has an address of each family")
    }
}

fn serve(world: &World, id: &str) -> Served {
    let web = world.node.add_container(id);
    let tcp = tcp_echo_server(&web.ns, TCP_PORT, id);
    let udp = udp_echo_server(&web.ns, UDP_PORT, id);
    let result = world.add(
        &web,
        &[
            PortMapping::tcp(TCP_HOST_PORT, TCP_PORT),
            PortMapping::udp(UDP_HOST_PORT, UDP_PORT),
        ],
    );
    Served {
        pods: result_addresses(&result),
        _tcp: tcp,
        _udp: udp,
        _container: web,
    }
}

/// `conntrack -L` in the node, of `proto` flows whose original destination
/// port is `port`.
fn kernel_entries(world: &World, family: Family, proto: &str, port: u16) -> String {
    let port = port.to_string();
    let family = if family.is_v4() { "ipv4" } else { "ipv6" };
    world.node.ns.exec(
        "conntrack",
        &["-L", "-f", family, "-p", proto, "--orig-port-dst", &port],
    )
}

/// A flow through a host port as `conntrack -L` should show it: original
/// `client -> node:hostPort`, reply from `pod:port`.
#[derive(Clone, Copy)]
struct HostPortFlow {
    proto: &'static str,
    host_port: u16,
    port: u16,
}

/// What `conntrack -L` listed for a [`HostPortFlow`].
struct KernelEntry {
    /// The first entry whose original is the client to the node's host
    /// port.
    line: Option<String>,
    /// Whether that entry's reply comes from the pod's port.
    answered_from_pod: bool,
    wanted: String,
    entries: String,
}

impl std::fmt::Display for KernelEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "wanted {}, got:\n{}", self.wanted, self.entries)
    }
}

impl HostPortFlow {
    const BOTH: [HostPortFlow; 2] = [
        HostPortFlow {
            proto: "tcp",
            host_port: TCP_HOST_PORT,
            port: TCP_PORT,
        },
        HostPortFlow {
            proto: "udp",
            host_port: UDP_HOST_PORT,
            port: UDP_PORT,
        },
    ];

    /// The kernel's entry of this flow from the external client of
    /// `family` to the container at `pod`.
    fn entry(self, world: &World, family: Family, pod: IpAddr) -> KernelEntry {
        let entries = kernel_entries(world, family, self.proto, self.host_port);
        let original = format!("src={} dst={} ", family.client(), family.node());
        let dport = format!("dport={} ", self.host_port);
        let reply = format!("src={pod} dst={} sport={} ", family.client(), self.port);
        let line = entries
            .lines()
            .find(|line| line.contains(&original) && line.contains(&dport))
            .map(str::to_owned);
        KernelEntry {
            answered_from_pod: line.as_ref().is_some_and(|line| line.contains(&reply)),
            line,
            wanted: format!(
                "a {} entry `{original}... {dport}` answered from `{reply}`",
                self.proto
            ),
            entries,
        }
    }
}

fn dump(plugin: Plugin, world: &World) -> String {
    match plugin {
        Plugin::Ours => format!("counters: {:#}\n{}", world.counters(), world.dump()),
        Plugin::Upstream => world.node.diagnostics(),
    }
}

/// The kernel's entry of a TCP and of a UDP flow through the host ports
/// holds the host port in its original direction and the pod in its
/// reply, as upstream's DNAT makes it; the UDP flow's answer counts as a
/// reply (no `[UNREPLIED]`).
fn conntrack_shows_the_host_port(plugin: Plugin) {
    let world = world(plugin);
    let served = serve(&world, "web");
    for family in Family::BOTH {
        let node = family.node();
        let pod = served.pod(family);
        let answer = tcp_request(
            &world.node.ext,
            SocketAddr::new(node, TCP_HOST_PORT),
            "hello",
            PATIENCE,
        );
        assert!(
            answer.is_ok(),
            "{plugin:?} {family:?}: TCP: {answer:?}\n{}",
            dump(plugin, &world)
        );
        let answer = udp_request(
            &world.node.ext,
            SocketAddr::new(node, UDP_HOST_PORT),
            "hello",
            PATIENCE,
        );
        assert!(
            answer.is_ok(),
            "{plugin:?} {family:?}: UDP: {answer:?}\n{}",
            dump(plugin, &world)
        );
        for flow in HostPortFlow::BOTH {
            let found = flow.entry(&world, family, pod);
            assert!(
                found.answered_from_pod
                    && found
                        .line
                        .as_ref()
                        .is_some_and(|line| !line.contains("UNREPLIED")),
                "{plugin:?} {family:?}: {found}\n{}",
                dump(plugin, &world)
            );
        }
    }
    if plugin == Plugin::Ours {
        assert!(
            counter(&world.counters(), "knat_new") >= 4,
            "{}",
            dump(plugin, &world)
        );
    }
}

#[test]
fn conntrack_shows_the_host_port_of_our_flows() {
    conntrack_shows_the_host_port(Plugin::Ours);
}

#[test]
fn conntrack_shows_the_host_port_of_upstreams_flows() {
    conntrack_shows_the_host_port(Plugin::Upstream);
}

/// A DROP at FORWARD on the flow's original destination (the node's
/// address and the host port, `-m conntrack --ctorigdst --ctorigdstport`)
/// stops new TCP and UDP flows; without it they pass again.
fn a_rule_on_the_original_destination_decides(plugin: Plugin) {
    let world = world(plugin);
    let _served = serve(&world, "web");
    for family in Family::BOTH {
        let node = family.node().to_string();
        for (proto, host_port) in [("tcp", TCP_HOST_PORT), ("udp", UDP_HOST_PORT)] {
            let port = host_port.to_string();
            let rule = [
                "FORWARD",
                "-p",
                proto,
                "-m",
                "conntrack",
                "--ctorigdst",
                &node,
                "--ctorigdstport",
                &port,
                "-j",
                "DROP",
            ];
            let with = |verb: &str| {
                let mut args = vec![verb];
                args.extend(rule);
                world.node.ns.exec(family.tables(), &args);
            };
            let answer = |timeout| {
                let to = SocketAddr::new(family.node(), host_port);
                if proto == "tcp" {
                    tcp_request(&world.node.ext, to, "hello", timeout)
                } else {
                    udp_request(&world.node.ext, to, "hello", timeout)
                }
            };
            with("-I");
            let stopped = answer(STOPPED);
            assert!(
                stopped.is_err(),
                "{plugin:?} {family:?} {proto}: answered past the rule: {stopped:?}\n{}",
                dump(plugin, &world)
            );
            with("-D");
            let passed = answer(PATIENCE);
            assert!(
                passed.is_ok(),
                "{plugin:?} {family:?} {proto}: without the rule: {passed:?}\n{}",
                dump(plugin, &world)
            );
        }
    }
}

#[test]
fn a_rule_on_the_original_destination_decides_our_flows() {
    a_rule_on_the_original_destination_decides(Plugin::Ours);
}

#[test]
fn a_rule_on_the_original_destination_decides_upstreams_flows() {
    a_rule_on_the_original_destination_decides(Plugin::Upstream);
}

/// What `conntrack -D` of a live TCP connection's entry does to its next
/// exchange, and to a UDP flow's next datagram: whether each is answered.
fn after_conntrack_delete(plugin: Plugin, family: Family) -> (bool, bool) {
    let world = world(plugin);
    let _served = serve(&world, "web");
    let node = family.node();
    let mut session = tcp_connect(
        &world.node.ext,
        SocketAddr::new(node, TCP_HOST_PORT),
        PATIENCE,
    )
    .expect("connected through the host port");
    session
        .request("before", PATIENCE)
        .expect("answered before");
    let udp_to = SocketAddr::new(node, UDP_HOST_PORT);
    udp_request(&world.node.ext, udp_to, "before", PATIENCE).expect("UDP answered before");
    let flavour = if family.is_v4() { "ipv4" } else { "ipv6" };
    for (proto, port) in [("tcp", TCP_HOST_PORT), ("udp", UDP_HOST_PORT)] {
        let port = port.to_string();
        let out = world
            .node
            .ns
            .command("conntrack")
            .args(["-D", "-f", flavour, "-p", proto, "--orig-port-dst", &port])
            .output()
            .expect("conntrack -D runs");
        assert!(
            out.status.success(),
            "{plugin:?} {family:?}: conntrack -D {proto} deleted nothing: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // Past the confirmed-flow fast path's next question (5.4 s): a flow
    // handed over keeps going there until it finds its kernel entry gone,
    // then takes the normal path, where the entry is made again, and must
    // go on through it (netfilter never saw the data that went by).
    let (mut tcp, mut udp) = (true, true);
    let until = std::time::Instant::now() + AFTER_DELETE;
    while tcp && std::time::Instant::now() < until {
        tcp = session.request("after", PATIENCE).is_ok();
        udp &= udp_request(&world.node.ext, udp_to, "after", PATIENCE).is_ok();
        std::thread::sleep(Duration::from_millis(200));
    }
    if plugin == Plugin::Ours && tcp {
        assert!(
            counter(&world.counters(), "knat_remade") >= 1,
            "the TCP flow's kernel entry was made again\n{}",
            dump(plugin, &world)
        );
        let entries = kernel_entries(&world, family, "tcp", TCP_HOST_PORT);
        assert!(
            entries.contains("ESTABLISHED"),
            "the TCP flow's kernel entry is back: {entries}\n{}",
            dump(plugin, &world)
        );
    }
    (tcp, udp)
}

/// How long a flow goes on after `conntrack -D` (see after_conntrack_delete).
const AFTER_DELETE: Duration = Duration::from_millis(6500);

#[test]
fn conntrack_delete_does_to_our_flows_what_it_does_to_upstreams() {
    for family in Family::BOTH {
        let upstream = after_conntrack_delete(Plugin::Upstream, family);
        let ours = after_conntrack_delete(Plugin::Ours, family);
        eprintln!(
            "{family:?}: (TCP, UDP) answered after conntrack -D: upstream {upstream:?}, ours {ours:?}"
        );
        assert_eq!(
            ours, upstream,
            "{family:?}: (TCP answered, UDP answered) after conntrack -D: ours {ours:?}, upstream {upstream:?}"
        );
    }
}

/// Without any nat chain netfilter applies no entry's NAT: flows are
/// translated in tc (the kernel's entry names the pod, not the host port)
/// and `status` says why; once a nat chain exists, the next ADD hands new
/// flows to netfilter. (kube-proxy's FORWARD rule throughout: with no
/// rule at all the namespace tracks nothing.)
#[test]
fn without_a_nat_chain_translation_stays_in_tc_until_one_exists() {
    let world = World::bridge();
    // Conntrack tracks the namespace once a rule asks for it.
    world.node.drop_invalid_at_forward();
    let served = serve(&world, "web");
    let family = Family::V4;
    let to = SocketAddr::new(family.node(), TCP_HOST_PORT);
    tcp_request(&world.node.ext, to, "hello", PATIENCE).expect("answered, translated in tc");
    let entries = kernel_entries(&world, family, "tcp", TCP_PORT);
    assert!(
        entries.contains(&format!("dst={} ", served.pod(family))),
        "without a nat chain the kernel sees the flow already translated:\n{entries}"
    );
    assert!(
        kernel_entries(&world, family, "tcp", TCP_HOST_PORT)
            .trim()
            .is_empty(),
        "no entry holds the host port without a nat chain"
    );
    let status = operator_json(&world.node.ns, world.pins.path(), "status");
    assert_eq!(
        status["translation"]["ipv4"],
        Value::from("tc"),
        "{status:#}"
    );
    let why = status["translation"]["why"].as_str().unwrap_or_default();
    assert!(why.contains("no nat chain"), "status says why: {why}");
    assert_eq!(counter(&world.counters(), "knat_new"), 0);

    world.node.hook_nat();
    let _second = serve_more(&world);
    let status = operator_json(&world.node.ns, world.pins.path(), "status");
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
    tcp_request(&world.node.ext, to, "again", PATIENCE).expect("answered, translated by netfilter");
    let entries = kernel_entries(&world, family, "tcp", TCP_HOST_PORT);
    assert!(
        entries.contains(&format!(
            "src={} dst={} sport={TCP_PORT} ",
            served.pod(family),
            family.client()
        )),
        "after the next ADD the kernel's entry holds the host port:\n{entries}"
    );
    assert!(counter(&world.counters(), "knat_new") >= 1);
}

/// Another container and ADD (the run that reads the node's NAT hooks
/// again).
fn serve_more(world: &World) -> (Container, ServerHandle) {
    let other = world.node.add_container("other");
    let server = tcp_echo_server(&other.ns, TCP_PORT, "other");
    world.add(&other, &[PortMapping::tcp(8100, TCP_PORT)]);
    (other, server)
}

/// A hairpin flow (a pod of the node to a host port) is masqueraded, which
/// is tc's: on a node where netfilter translates flows from outside, it
/// is still translated in tc, and answers, both families.
#[test]
fn hairpin_flows_stay_in_tc_where_netfilter_translates_the_rest() {
    let world = world(Plugin::Ours);
    let _served = serve(&world, "web");
    let client = world.node.add_container("client");
    world.add(&client, &[]);
    let before = world.counters();
    for family in Family::BOTH {
        let to = SocketAddr::new(family.node(), TCP_HOST_PORT);
        let answer = tcp_request(&client.ns, to, "hairpin", PATIENCE);
        assert!(
            answer.is_ok(),
            "{family:?}: hairpin TCP: {answer:?}\n{}",
            dump(Plugin::Ours, &world)
        );
    }
    let after = world.counters();
    let grew = |name: &str| counter(&after, name) - counter(&before, name);
    assert!(grew("masq") >= 2, "masqueraded in tc: {after:#}");
    assert_eq!(grew("knat_new"), 0, "none handed to netfilter: {after:#}");
}

/// A TCP flow netfilter translates closes in our tables as a tc flow
/// does: its FINs both ways (the container's seen on the container's
/// side, where tc sees it before netfilter translates it back) move its
/// entries out of the live table. Before, the answer's FIN was never
/// followed: every such connection held two entries among the live flows
/// for the 6 h of an established one (filling the table that a flood must
/// not touch with dead flows), and a later flow on the same tuple
/// translated in tc (`fastPath: true`, or after the nat chain went) found
/// the dead flow's answer entry first and left untranslated.
#[test]
fn closed_flows_netfilter_translates_leave_the_live_table() {
    const CONNECTIONS: u64 = 20;
    let world = world(Plugin::Ours);
    let _served = serve(&world, "web");
    let before = world.counters();
    for family in Family::BOTH {
        for _ in 0..CONNECTIONS / 2 {
            let answer = tcp_request(
                &world.node.ext,
                SocketAddr::new(family.node(), TCP_HOST_PORT),
                "hello",
                PATIENCE,
            );
            assert!(answer.is_ok(), "{family:?}: {answer:?}");
        }
    }
    // The last FIN and ACK may still be on their way.
    let deadline = std::time::Instant::now() + PATIENCE;
    let closed = loop {
        let after = world.counters();
        let closed = counter(&after, "ct_closed") - counter(&before, "ct_closed");
        if closed >= CONNECTIONS || std::time::Instant::now() > deadline {
            break closed;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let after = world.counters();
    assert_eq!(
        counter(&after, "knat_new") - counter(&before, "knat_new"),
        CONNECTIONS,
        "every connection netfilter's: {after:#}"
    );
    assert_eq!(closed, CONNECTIONS, "each connection closed: {after:#}");
    let live = world.dump_map("conntrack");
    assert_eq!(
        live.as_array().map_or(0, Vec::len),
        0,
        "no closed flow left among the live ones: {live:#}"
    );
}

/// With `fastPath: true` every flow from outside skips netfilter from its
/// first packet, translated in tc, and still gets the kernel's DNAT entry
/// (issue 50): `conntrack -L` shows the host port of a TCP and a UDP flow,
/// both families, while a `FORWARD` rule dropping the client stops none
/// of them.
#[test]
fn with_fast_path_flows_skip_netfilter_and_still_show_the_host_port() {
    let world = World::with(|name, pins, data| {
        let list = bridge_conflist(name, "ebpf-portmap", Some(pins), data);
        let mut json = list.json().clone();
        json["plugins"][1]["fastPath"] = Value::Bool(true);
        portmap_tests::Conflist::from_json(json).expect("conflist")
    });
    world.node.hook_nat();
    world.node.drop_invalid_at_forward();
    let served = serve(&world, "web");
    for family in Family::BOTH {
        let client = family.client().to_string();
        world.node.ns.exec(
            family.tables(),
            &["-I", "FORWARD", "-s", &client, "-j", "DROP"],
        );
    }
    for family in Family::BOTH {
        let node = family.node();
        let pod = served.pod(family);
        let tcp = tcp_request(
            &world.node.ext,
            SocketAddr::new(node, TCP_HOST_PORT),
            "hello",
            PATIENCE,
        );
        let udp = udp_request(
            &world.node.ext,
            SocketAddr::new(node, UDP_HOST_PORT),
            "hello",
            PATIENCE,
        );
        assert!(
            tcp.is_ok() && udp.is_ok(),
            "{family:?}: past the FORWARD drop: TCP {tcp:?}, UDP {udp:?}\n{}",
            dump(Plugin::Ours, &world)
        );
        for flow in HostPortFlow::BOTH {
            let found = flow.entry(&world, family, pod);
            assert!(
                found.answered_from_pod,
                "{family:?}: {found}\n{}",
                dump(Plugin::Ours, &world)
            );
        }
    }
    let counters = world.counters();
    assert!(
        counter(&counters, "knat_new") >= 4 && counter(&counters, "fast_forward") >= 4,
        "every flow's first packet made the kernel's entry and was handed over: {counters:#}"
    );
}
