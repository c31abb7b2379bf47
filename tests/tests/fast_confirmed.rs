//! The confirmed-flow fast path, the default (`fastPath` unset): the first
//! packets of a translated flow take the normal path, so the node's
//! FORWARD rules decide each new flow as they do with upstream portmap;
//! once the kernel's conntrack holds the flow as confirmed, both ways go
//! over the fast path, and the kernel's entry is kept alive under it.
//!
//! Every rule and sysctl here is set inside the test's own node namespace.
//! Each test runs where the kernel links the conntrack kfuncs (vmlinux
//! BTF with nf_conntrack built in) and skips with a reason elsewhere.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use portmap_tests::topology::{EXT_IP4, EXT_IP6, NODE_FAR_IP4, NODE_FAR_IP6, NODE_IP4, NODE_IP6};
use portmap_tests::traffic::{
    echo_reply, tcp_connect, tcp_echo_server, tcp_request, udp_echo_server, udp_request,
};
use portmap_tests::world::{GONE, PROBE, World, counter, expect_unreachable, sock};
use portmap_tests::{NetNs, PortMapping};
use serde_json::Value;

/// A bridge world in the default configuration: no `fastPath` key, even
/// when `EPM_TEST_FAST_PATH` asks every conflist for it.
fn default_world() -> World {
    World::with(|name, pins, data| {
        let list = portmap_tests::bridge_conflist(name, "ebpf-portmap", Some(pins), data);
        let mut json = list.json().clone();
        json["plugins"][1]
            .as_object_mut()
            .expect("the plugin entry")
            .remove("fastPath");
        portmap_tests::Conflist::from_json(json).expect("conflist")
    })
}

/// iptables or ip6tables, for `ip`'s family.
fn tables(ip: IpAddr) -> &'static str {
    if ip.is_ipv4() {
        "iptables"
    } else {
        "ip6tables"
    }
}

/// The node's fast-path mode as `status --json` reports it, with why.
fn fast_path_status(world: &World) -> (String, String) {
    let status = portmap_tests::world::operator_json(&world.node.ns, world.pins.path(), "status");
    (
        status["fastPath"]["mode"].as_str().unwrap_or("").to_owned(),
        status["fastPath"]["why"].as_str().unwrap_or("").to_owned(),
    )
}

/// Skips (with the reason printed) unless the node runs the confirmed-flow
/// mode, which needs the kernel's conntrack kfuncs; fails instead where
/// they must link (`EPM_EXPECT_KFUNCS=1`: the VM guests, which load
/// nf_conntrack as a module).
fn runs_confirmed(world: &World) -> bool {
    let (mode, why) = fast_path_status(world);
    if mode == "confirmed" {
        return true;
    }
    assert!(
        std::env::var("EPM_EXPECT_KFUNCS").as_deref() != Ok("1"),
        "EPM_EXPECT_KFUNCS=1: the conntrack kfuncs must link (from vmlinux or nf_conntrack's BTF), yet: {mode}: {why}\n{}",
        world.dump()
    );
    assert!(
        mode == "never" && (why.contains("vmlinux BTF") || why.contains("verifier refused")),
        "the default configuration runs the confirmed-flow mode, or says why the kernel cannot: {mode}: {why}"
    );
    eprintln!("skipped: this kernel cannot run the confirmed-flow mode ({why})");
    false
}

/// Inserts a FORWARD rule without a target, first in the chain: it only
/// counts the packets netfilter forwards that match `rule`.
fn count_forward(world: &World, ip: IpAddr, rule: &[&str]) {
    let mut args = vec!["-I", "FORWARD", "1"];
    args.extend_from_slice(rule);
    world.node.ns.exec(tables(ip), &args);
}

/// Packets the first FORWARD rule of `ip`'s family has counted (see
/// [`count_forward`]).
fn forwarded(world: &World, ip: IpAddr) -> u64 {
    let line = world
        .node
        .ns
        .exec(tables(ip), &["-L", "FORWARD", "1", "-v", "-x", "-n"]);
    line.split_whitespace()
        .next()
        .and_then(|packets| packets.parse().ok())
        .unwrap_or_else(|| panic!("no packet count in {line:?}"))
}

/// A UDP socket in `ns` connected to `addr`: one flow for many datagrams.
fn udp_flow(ns: &NetNs, addr: SocketAddr) -> UdpSocket {
    let any = if addr.is_ipv4() {
        IpAddr::V4(Ipv4Addr::UNSPECIFIED)
    } else {
        IpAddr::V6(Ipv6Addr::UNSPECIFIED)
    };
    ns.run(|| {
        let socket = UdpSocket::bind(SocketAddr::new(any, 0))?;
        socket.connect(addr)?;
        socket.set_read_timeout(Some(Duration::from_millis(500)))?;
        Ok::<_, std::io::Error>(socket)
    })
    .expect("a UDP socket in the client namespace")
}

/// Sends `payload` on `socket` and waits for the answer, re-sending every
/// 500 ms until `timeout`.
fn udp_exchange(socket: &UdpSocket, payload: &str, timeout: Duration) -> Result<String, String> {
    let deadline = Instant::now() + timeout;
    let mut buf = [0u8; 2048];
    while Instant::now() < deadline {
        socket.send(payload.as_bytes()).map_err(|e| e.to_string())?;
        if let Ok(n) = socket.recv(&mut buf) {
            return Ok(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
    }
    Err(format!("no answer to {payload:?} within {timeout:?}"))
}

/// The counters `status --json` reports, by reason.
fn counters(world: &World) -> Value {
    world.counters()
}

/// With the default configuration a FORWARD rule dropping one source stops
/// that source's new connections to a hostPort while another source
/// connects, and connects again once the rule is gone; the flows it lets
/// through are handed to the fast path after their first packets. Both
/// families, TCP and UDP.
#[test]
fn a_forward_rule_decides_new_flows_and_accepted_ones_go_fast() {
    let world = default_world();
    let web = world.node.add_container("web");
    let _tcp = tcp_echo_server(&web.ns, 80, "web");
    let _udp = udp_echo_server(&web.ns, 53, "web");
    world.add(
        &web,
        &[PortMapping::tcp(8080, 80), PortMapping::udp(5353, 53)],
    );
    if !runs_confirmed(&world) {
        return;
    }
    world.node.drop_invalid_at_forward();
    for (ext_ip, node_ip, far_node_ip) in [
        (
            IpAddr::V4(EXT_IP4),
            IpAddr::V4(NODE_IP4),
            IpAddr::V4(NODE_FAR_IP4),
        ),
        (
            IpAddr::V6(EXT_IP6),
            IpAddr::V6(NODE_IP6),
            IpAddr::V6(NODE_FAR_IP6),
        ),
    ] {
        let rule = ["-s", &*ext_ip.to_string(), "-j", "DROP"].map(str::to_owned);
        let rule: Vec<&str> = rule.iter().map(String::as_str).collect();
        let mut insert = vec!["-I", "FORWARD"];
        insert.extend(&rule);
        world.node.ns.exec(tables(ext_ip), &insert);
        expect_unreachable(
            &format!("TCP from {ext_ip}, dropped at FORWARD"),
            tcp_request(&world.node.ext, sock(node_ip, 8080), "blocked", GONE),
        );
        expect_unreachable(
            &format!("UDP from {ext_ip}, dropped at FORWARD"),
            udp_request(&world.node.ext, sock(node_ip, 5353), "blocked", GONE),
        );
        let before = counters(&world);
        // Another source meanwhile: through the firewall, then fast.
        let mut session = tcp_connect(&world.node.far, sock(far_node_ip, 8080), PROBE)
            .unwrap_or_else(|e| panic!("TCP from far via {far_node_ip}: {e}\n{}", world.dump()));
        let udp = udp_flow(&world.node.far, sock(far_node_ip, 5353));
        for round in 0..10 {
            let payload = format!("far-{round}");
            world.expect_answer(
                &format!("TCP from far via {far_node_ip}, round {round}"),
                session.request(&payload, PROBE),
                &echo_reply("web", &payload),
            );
            world.expect_answer(
                &format!("UDP from far via {far_node_ip}, round {round}"),
                udp_exchange(&udp, &payload, PROBE),
                &echo_reply("web", &payload),
            );
        }
        let after = counters(&world);
        for reason in ["fast_forward", "fast_reply", "ct_confirmed"] {
            assert!(
                counter(&after, reason) > counter(&before, reason),
                "{reason} did not grow for the accepted source ({far_node_ip}): before {before:#}\nafter {after:#}\n{}",
                world.dump()
            );
        }
        let mut delete = vec!["-D", "FORWARD"];
        delete.extend(&rule);
        world.node.ns.exec(tables(ext_ip), &delete);
        world.expect_answer(
            &format!("TCP from {ext_ip} once the rule is gone"),
            tcp_request(&world.node.ext, sock(node_ip, 8080), "again", PROBE),
            &echo_reply("web", "again"),
        );
        world.expect_answer(
            &format!("UDP from {ext_ip} once the rule is gone"),
            udp_request(&world.node.ext, sock(node_ip, 5353), "again", PROBE),
            &echo_reply("web", "again"),
        );
    }
}

/// The addresses ADD gave the container, one per family.
fn container_ips(result: &Value) -> (IpAddr, IpAddr) {
    let ips = portmap_tests::cni::result_addresses(result);
    let v4 = *ips.iter().find(|ip| ip.is_ipv4()).expect("an IPv4 address");
    let v6 = *ips.iter().find(|ip| ip.is_ipv6()).expect("an IPv6 address");
    (v4, v6)
}

/// An established TCP flow and a UDP flow take the fast path both ways
/// once the kernel confirmed them: netfilter forwards the handshake (and a
/// UDP flow's first datagram) and then none of the flow's packets, and
/// the kernel is asked once per flow and direction, not per packet. Both
/// families.
#[test]
fn established_flows_leave_netfilter_after_their_first_packets() {
    flows_from_outside_leave_netfilter(Translation::Tc);
}

/// The same on a node where netfilter translates the flows (kube-proxy's
/// nat chains, made before the ADD): the kernel's own DNAT entry is made
/// for each flow (issue 50), netfilter translates and forwards the
/// handshake (a UDP flow's first datagram and first answer), and then the
/// flow is handed over, translated in tc, both ways; the kernel's entry
/// still shows the host port, established (TCP) or replied (UDP), kept
/// alive by the questions. Both families.
#[test]
fn flows_netfilter_translates_leave_it_once_confirmed() {
    flows_from_outside_leave_netfilter(Translation::Netfilter);
}

/// A container serving TCP 80 and UDP 53 through host ports 8080 and
/// 5353, and [`flows_leave_netfilter`] from the external client over both
/// families, with kube-proxy's FORWARD rule; where `translation` is
/// netfilter's, with its nat chains too, both made before the ADD (which
/// reads them).
fn flows_from_outside_leave_netfilter(translation: Translation) {
    let world = default_world();
    if translation == Translation::Netfilter {
        world.node.hook_nat();
        world.node.drop_invalid_at_forward();
    }
    let web = world.node.add_container("web");
    let _tcp = tcp_echo_server(&web.ns, 80, "web");
    let _udp = udp_echo_server(&web.ns, 53, "web");
    let result = world.add(
        &web,
        &[PortMapping::tcp(8080, 80), PortMapping::udp(5353, 53)],
    );
    if !runs_confirmed(&world) {
        return;
    }
    if translation == Translation::Tc {
        world.node.drop_invalid_at_forward();
    }
    let (web4, web6) = container_ips(&result);
    for (container, node_ip, client) in [
        (web4, IpAddr::V4(NODE_IP4), IpAddr::V4(EXT_IP4)),
        (web6, IpAddr::V6(NODE_IP6), IpAddr::V6(EXT_IP6)),
    ] {
        flows_leave_netfilter(
            &world,
            (&world.node.ext, client),
            container,
            node_ip,
            translation,
        );
    }
}

/// Where a flow of [`flows_leave_netfilter`] is translated on its first
/// packets.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Translation {
    /// In tc (no nat chain on the node; a hairpin flow, masqueraded).
    Tc,
    /// By netfilter, with the kernel's DNAT entry the programs make.
    Netfilter,
}

/// Hairpin flows (a pod dialling a hostPort through the node's address,
/// masqueraded with `snat`, its traffic not covered by the socket hooks)
/// take the fast path as flows from outside do: netfilter forwards the
/// handshake (a UDP flow's first datagram), then none of the flow's
/// packets, both from the pod that serves the port and from another pod
/// on the bridge, behind kube-proxy's INVALID drop at FORWARD (and the
/// bridge's netfilter on this machine). Both families.
#[test]
fn hairpin_flows_leave_netfilter_after_their_first_packets() {
    let world = default_world();
    let web = world.node.add_container("web");
    let other = world.node.add_container("other");
    let _tcp = tcp_echo_server(&web.ns, 80, "web");
    let _udp = udp_echo_server(&web.ns, 53, "web");
    let served = world.add(
        &web,
        &[PortMapping::tcp(8080, 80), PortMapping::udp(5353, 53)],
    );
    let dialling = world.add(&other, &[]);
    if !runs_confirmed(&world) {
        return;
    }
    world.node.drop_invalid_at_forward();
    let (web4, web6) = container_ips(&served);
    let (other4, other6) = container_ips(&dialling);
    for (client, client4, client6) in [(&web, web4, web6), (&other, other4, other6)] {
        for (container, node_ip, client_ip) in [
            (web4, IpAddr::V4(NODE_IP4), client4),
            (web6, IpAddr::V6(NODE_IP6), client6),
        ] {
            flows_leave_netfilter(
                &world,
                (&client.ns, client_ip),
                container,
                node_ip,
                Translation::Tc,
            );
        }
    }
}

/// One TCP flow and one UDP flow from `client` (its namespace and
/// address) through `node_ip` to `container`'s mapped ports (8080 to 80,
/// 5353 to 53), [`ROUNDS`] exchanges each, with FORWARD rules counting
/// what netfilter still forwards of them: the handshake only (a UDP flow's
/// first datagram), the rest over the fast path, the kernel asked once per
/// direction.
fn flows_leave_netfilter(
    world: &World,
    (client_ns, client): (&NetNs, IpAddr),
    container: IpAddr,
    node_ip: IpAddr,
    translation: Translation,
) {
    let (container_s, client_s) = (container.to_string(), client.to_string());
    for (proto, port) in [("tcp", "80"), ("udp", "53")] {
        // One rule per direction; the later insert is rule 1. No port
        // match: the flow is the only one of its protocol between the two
        // ends, and the guests' iptables has no `--dport` (no xt_tcpudp).
        let towards = ["-s", &*client_s, "-d", &*container_s, "-p", proto];
        let back = ["-s", &*container_s, "-d", &*client_s, "-p", proto];
        let before = counters(world);
        count_forward(world, client, &towards);
        let exchange = |round: u64| format!("{proto}-{client}-{round}");
        let mut tcp_session = None;
        let mut udp_socket = None;
        for round in 0..ROUNDS {
            let payload = exchange(round);
            let answer = if proto == "tcp" {
                tcp_session
                    .get_or_insert_with(|| {
                        tcp_connect(client_ns, sock(node_ip, 8080), PROBE).unwrap_or_else(|e| {
                            panic!("TCP from {client} via {node_ip}: {e}\n{}", world.dump())
                        })
                    })
                    .request(&payload, PROBE)
                    .map_err(|e| e.to_string())
            } else {
                udp_exchange(
                    udp_socket.get_or_insert_with(|| udp_flow(client_ns, sock(node_ip, 5353))),
                    &payload,
                    PROBE,
                )
            };
            world.expect_answer(
                &format!("{proto} from {client} via {node_ip}, round {round}"),
                answer,
                &echo_reply("web", &payload),
            );
            if round == 0 {
                // The answers' rule now: it sees from the first answer on
                // (TCP's SYN-ACK came before it, and is left out).
                count_forward(world, client, &back);
            }
        }
        // The kernel's entry: to the container where tc translated the
        // first packet, to the host port where netfilter did.
        let entries = match translation {
            _ if !conntrack_lists(world) => None,
            Translation::Tc => Some(kernel_entries(world, proto, client, container, Some(port))),
            Translation::Netfilter => {
                let host_port = if proto == "tcp" { "8080" } else { "5353" };
                Some(kernel_entries(
                    world,
                    proto,
                    client,
                    node_ip,
                    Some(host_port),
                ))
            }
        };
        if let Some(entries) = entries {
            kernel_entry_as_expected(world, &entries, (proto, client, node_ip), translation);
        }
        let answers_forwarded = forwarded(world, client);
        world.node.ns.exec(tables(client), &["-D", "FORWARD", "1"]);
        let requests_forwarded = forwarded(world, client);
        world.node.ns.exec(tables(client), &["-D", "FORWARD", "1"]);
        // TCP: SYN and the handshake's ACK; UDP: the first datagram
        // (a re-sent one at most once more).
        let first = if proto == "tcp" { 2 } else { 1 };
        assert!(
            (first..=first + 1).contains(&requests_forwarded),
            "{proto} from {client} via {node_ip}: netfilter forwarded {requests_forwarded} packets towards the container in {ROUNDS} rounds; only the first {first} belong there\n{}",
            world.dump()
        );
        // TCP: the SYN-ACK is before the rule; its answers all go fast.
        // UDP: the first answer is handed over too (the first datagram
        // confirmed the flow), or, where netfilter translates, went
        // through netfilter before the rule.
        assert!(
            answers_forwarded <= 1,
            "{proto} from {client} via {node_ip}: netfilter forwarded {answers_forwarded} answers; after the handshake none belong there\n{}",
            world.dump()
        );
        let after = counters(world);
        let grew = |reason: &str| counter(&after, reason) - counter(&before, reason);
        let by_netfilter = grew("knat_new") == 1;
        assert_eq!(
            by_netfilter,
            translation == Translation::Netfilter,
            "{proto} from {client} via {node_ip}: the flow's first packet translated by netfilter\n{after:#}"
        );
        assert!(
            grew("fast_forward") >= ROUNDS - 1 && grew("fast_reply") >= ROUNDS - 1,
            "{proto} from {client} via {node_ip}: fast_forward grew by {}, fast_reply by {}, in {ROUNDS} rounds\n{after:#}",
            grew("fast_forward"),
            grew("fast_reply")
        );
        // Asked once per direction (a refresh falls due every 5.4 s).
        assert!(
            (2..=4).contains(&grew("ct_confirmed")),
            "{proto} from {client} via {node_ip}: the kernel was asked {} times for one flow of {ROUNDS} rounds\n{after:#}",
            grew("ct_confirmed")
        );
    }
}

/// Checks the kernel's entry of a flow of [`flows_leave_netfilter`]
/// (`entries`, as `conntrack -L` lists it) after its rounds.
fn kernel_entry_as_expected(
    world: &World,
    entries: &str,
    (proto, client, node_ip): (&str, IpAddr, IpAddr),
    translation: Translation,
) {
    if proto == "tcp" {
        // Netfilter saw the whole handshake, SYN-ACK included: its entry
        // is established, not stuck in SYN_SENT under a flow it was left
        // out of (the client's ACK would have been INVALID to it).
        assert!(
            entries.contains("ESTABLISHED") && entries.contains("[ASSURED]"),
            "tcp from {client} via {node_ip}: the kernel's entry of the flow after {ROUNDS} rounds: {entries:?}\n{}",
            world.dump()
        );
    } else if translation == Translation::Netfilter {
        // Its first answer went through netfilter: a reply.
        assert!(
            !entries.is_empty() && !entries.contains("UNREPLIED"),
            "udp from {client} via {node_ip}: the kernel's entry of the flow after {ROUNDS} rounds: {entries:?}\n{}",
            world.dump()
        );
    }
}

/// `conntrack -L` in the node of the kernel's `proto` entries from
/// `client` to `container` (to its `port`, if given).
fn kernel_entries(
    world: &World,
    proto: &str,
    client: IpAddr,
    container: IpAddr,
    port: Option<&str>,
) -> String {
    let family = if client.is_ipv4() { "ipv4" } else { "ipv6" };
    let (client, container) = (client.to_string(), container.to_string());
    let mut args = vec![
        "-L", "-f", family, "-p", proto, "-s", &client, "-d", &container,
    ];
    if let Some(port) = port {
        args.extend(["--dport", port]);
    }
    world.node.ns.exec("conntrack", &args)
}

/// Whether the conntrack tool lists the node's entries here: Debian 12's
/// 1.4.7 in the 6.1 guest answers "invalid parameters" to every `-L`
/// (the other checks of a test still run there; the host and the 6.12
/// guest read the entries).
fn conntrack_lists(world: &World) -> bool {
    let out = world
        .node
        .ns
        .command("conntrack")
        .args(["-L", "-f", "ipv4"])
        .output()
        .expect("conntrack runs");
    if !out.status.success() {
        eprintln!(
            "not reading the kernel's entries: conntrack -L fails here: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    out.status.success()
}

/// Exchanges per flow in [`flows_leave_netfilter`].
const ROUNDS: u64 = 20;

/// A UDP flow on the fast path outlives a shortened
/// `nf_conntrack_udp_timeout_stream` behind `ct state invalid drop` and a
/// stateful FORWARD policy (new flows only towards the container): its
/// kernel entry is refreshed, so the answers are never taken for new flows
/// from the container, and netfilter forwards none of its packets after
/// the first. Both families.
#[test]
fn a_fast_udp_flow_keeps_its_kernel_entry_past_the_udp_timeouts() {
    let world = default_world();
    let web = world.node.add_container("web");
    let _udp = udp_echo_server(&web.ns, 53, "web");
    let result = world.add(&web, &[PortMapping::udp(5353, 53)]);
    if !runs_confirmed(&world) {
        return;
    }
    let (web4, web6) = container_ips(&result);
    // Per network namespace: the test's node only.
    world
        .node
        .ns
        .sysctl("net.netfilter.nf_conntrack_udp_timeout", "2");
    world
        .node
        .ns
        .sysctl("net.netfilter.nf_conntrack_udp_timeout_stream", "3");
    stateful_firewall(&world, "udp", "53", [web4, web6]);
    for (container, node_ip, client) in [
        (web4, IpAddr::V4(NODE_IP4), IpAddr::V4(EXT_IP4)),
        (web6, IpAddr::V6(NODE_IP6), IpAddr::V6(EXT_IP6)),
    ] {
        let (container_s, client_s) = (container.to_string(), client.to_string());
        count_forward(
            &world,
            client,
            &["-s", &*client_s, "-d", &*container_s, "-p", "udp"],
        );
        count_forward(
            &world,
            client,
            &["-s", &*container_s, "-d", &*client_s, "-p", "udp"],
        );
        let socket = udp_flow(&world.node.ext, sock(node_ip, 5353));
        let started = Instant::now();
        let mut round = 0;
        // Past both timeouts three times over, and past two refreshes.
        while started.elapsed() < Duration::from_secs(12) {
            let payload = format!("{node_ip}-{round}");
            world.expect_answer(
                &format!("UDP via {node_ip} after {:?}", started.elapsed()),
                udp_exchange(&socket, &payload, Duration::from_secs(2)),
                &echo_reply("web", &payload),
            );
            round += 1;
            std::thread::sleep(Duration::from_millis(500));
        }
        let answers = forwarded(&world, client);
        world.node.ns.exec(tables(client), &["-D", "FORWARD", "1"]);
        let requests = forwarded(&world, client);
        world.node.ns.exec(tables(client), &["-D", "FORWARD", "1"]);
        assert!(
            requests <= 2 && answers <= 1,
            "UDP via {node_ip}: netfilter forwarded {requests} datagrams towards the container and {answers} answers in {round} rounds over 12 s: the flow left the fast path (its kernel entry expired?)\n{}",
            world.dump()
        );
        let entries = kernel_entries(&world, "udp", client, container, None);
        let timeout: u64 = entries
            .lines()
            .find_map(|line| line.split_whitespace().nth(2)?.parse().ok())
            .unwrap_or_else(|| panic!("UDP via {node_ip}: the kernel holds no entry for the flow after 12 s: {entries:?}"));
        assert!(
            timeout > 3,
            "UDP via {node_ip}: the kernel's entry has {timeout} s left, no more than nf_conntrack_udp_timeout_stream: not refreshed ({entries})"
        );
    }
}

/// The node's FORWARD as a stateful firewall has it: `ct state invalid
/// drop`, established flows accepted, new ones only towards `containers`'
/// `proto` `port`, everything else dropped. And br_netfilter told not to
/// call iptables for bridged frames: with it, conntrack also sees the
/// container's answers as they cross the bridge (before cni0's tc ingress
/// hands them over) and refreshes the entry with its own timeouts; off,
/// only the dataplane's refresh keeps the entry, as for a flow whose
/// answers never come.
fn stateful_firewall(world: &World, proto: &str, port: &str, containers: [IpAddr; 2]) {
    let br_netfilter = world
        .node
        .ns
        .run(|| std::path::Path::new("/proc/sys/net/bridge/bridge-nf-call-iptables").exists());
    if br_netfilter {
        world
            .node
            .ns
            .sysctl("net.bridge.bridge-nf-call-iptables", "0");
        world
            .node
            .ns
            .sysctl("net.bridge.bridge-nf-call-ip6tables", "0");
    }
    world.node.drop_invalid_at_forward();
    for container in containers {
        let tool = tables(container);
        let container = container.to_string();
        let established = [
            "-A",
            "FORWARD",
            "-m",
            "conntrack",
            "--ctstate",
            "ESTABLISHED,RELATED",
            "-j",
            "ACCEPT",
        ];
        let new = [
            "-A",
            "FORWARD",
            "-d",
            &*container,
            "-p",
            proto,
            "--dport",
            port,
            "-m",
            "conntrack",
            "--ctstate",
            "NEW",
            "-j",
            "ACCEPT",
        ];
        for rule in [&established[..], &new[..], &["-P", "FORWARD", "DROP"][..]] {
            world.node.ns.exec(tool, rule);
        }
    }
}

/// A TCP flow on the fast path that idles past the UDP timeouts and past
/// a shortened `nf_conntrack_tcp_timeout_established`, behind the same
/// stateful firewall and with `nf_conntrack_tcp_loose` off (a segment
/// without an entry is INVALID, and dropped): it carries on, on the fast
/// path, because its kernel entry was given the dataplane's own timeout.
/// Both families.
#[test]
fn an_idle_tcp_flow_keeps_its_kernel_entry() {
    let world = default_world();
    let web = world.node.add_container("web");
    let _tcp = tcp_echo_server(&web.ns, 80, "web");
    let result = world.add(&web, &[PortMapping::tcp(8080, 80)]);
    if !runs_confirmed(&world) {
        return;
    }
    let (web4, web6) = container_ips(&result);
    for (key, value) in [
        ("net.netfilter.nf_conntrack_udp_timeout", "2"),
        ("net.netfilter.nf_conntrack_udp_timeout_stream", "3"),
        ("net.netfilter.nf_conntrack_tcp_timeout_established", "3"),
        ("net.netfilter.nf_conntrack_tcp_loose", "0"),
    ] {
        world.node.ns.sysctl(key, value);
    }
    stateful_firewall(&world, "tcp", "80", [web4, web6]);
    for (container, node_ip, client) in [
        (web4, IpAddr::V4(NODE_IP4), IpAddr::V4(EXT_IP4)),
        (web6, IpAddr::V6(NODE_IP6), IpAddr::V6(EXT_IP6)),
    ] {
        let (container_s, client_s) = (container.to_string(), client.to_string());
        count_forward(
            &world,
            client,
            &["-s", &*client_s, "-d", &*container_s, "-p", "tcp"],
        );
        let mut session = tcp_connect(&world.node.ext, sock(node_ip, 8080), PROBE)
            .unwrap_or_else(|e| panic!("TCP via {node_ip}: {e}\n{}", world.dump()));
        for round in 0..3 {
            let payload = format!("{node_ip}-{round}");
            world.expect_answer(
                &format!("TCP via {node_ip}, round {round}"),
                session.request(&payload, PROBE),
                &echo_reply("web", &payload),
            );
            // Idle past every shortened timeout and past a verdict.
            std::thread::sleep(Duration::from_secs(7));
        }
        let requests = forwarded(&world, client);
        world.node.ns.exec(tables(client), &["-D", "FORWARD", "1"]);
        assert!(
            requests <= 3,
            "TCP via {node_ip}: netfilter forwarded {requests} segments towards the container; the handshake's two (a retransmission at most) belong there\n{}",
            world.dump()
        );
    }
}

/// The fallback's question, asked of the running kernel: `version` counts
/// what is hooked at FORWARD in the node namespace (nfnetlink_hook), none
/// in a fresh one, and a FORWARD rule of each family adds to it. Skips
/// where the kernel lacks nfnetlink_hook (`CONFIG_NETFILTER_NETLINK_HOOK`,
/// not set on Debian's 6.1 nor on this host's kernel), unless the VM tests
/// loaded it (`EPM_EXPECT_FORWARD_HOOKS=1`, Debian's 6.12).
#[test]
fn version_counts_what_is_hooked_at_forward() {
    let world = default_world();
    let hooks = |world: &World| -> Result<u64, String> {
        let out = world.operator(&["version", "--json"]);
        let version: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "version --json is not JSON ({e}): {}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
        version["forwardHooks"]
            .as_u64()
            .ok_or_else(|| version["forwardHooksUnknownBecause"].to_string())
    };
    let none = match hooks(&world) {
        Ok(none) => none,
        Err(why) => {
            assert!(
                !std::env::var("EPM_EXPECT_FORWARD_HOOKS").is_ok_and(|v| v == "1"),
                "EPM_EXPECT_FORWARD_HOOKS=1 (nfnetlink_hook loaded), yet version cannot count the FORWARD hooks: {why}"
            );
            eprintln!(
                "skipped: this kernel has no nfnetlink_hook to ask what is hooked at FORWARD ({why})"
            );
            return;
        }
    };
    assert_eq!(
        none, 0,
        "nothing is hooked at FORWARD in a fresh node namespace"
    );
    world.node.ns.exec(
        "iptables",
        &["-A", "FORWARD", "-s", "192.0.2.1", "-j", "DROP"],
    );
    let v4 = hooks(&world).expect("asked once, asked again");
    assert!(v4 >= 1, "an IPv4 FORWARD rule is a hook there: {v4}");
    world.node.ns.exec(
        "ip6tables",
        &["-A", "FORWARD", "-s", "2001:db8::1", "-j", "DROP"],
    );
    let both = hooks(&world).expect("asked again");
    assert!(
        both > v4,
        "an IPv6 FORWARD rule adds its own: {both} after {v4}"
    );
}

/// TCP rounds from the external namespace to `node_ip:port` on one
/// connection; the growth of `fast_forward` and `fast_reply` meanwhile.
fn fast_growth(world: &World, node_ip: IpAddr, port: u16) -> (u64, u64) {
    let before = counters(world);
    let addr = sock(node_ip, port);
    let mut session = tcp_connect(&world.node.ext, addr, PROBE)
        .unwrap_or_else(|e| panic!("TCP to {addr}: {e}\n{}", world.dump()));
    for round in 0..10 {
        let payload = format!("round-{round}");
        world.expect_answer(
            &format!("TCP to {addr}, round {round}"),
            session.request(&payload, PROBE),
            &echo_reply("web", &payload),
        );
    }
    let after = counters(world);
    let growth = |reason| counter(&after, reason) - counter(&before, reason);
    (growth("fast_forward"), growth("fast_reply"))
}

/// Where the kernel has no conntrack kfuncs to link (nf_conntrack a module,
/// as in Debian's kernels, which the VM tests run), the default decides by
/// what is hooked at FORWARD: with nothing there, skipping FORWARD skips no
/// rule and every translated flow takes the fast path; once a FORWARD rule
/// exists, the next ADD puts the node on the normal path; where
/// nfnetlink_hook cannot tell (Debian's 6.1), the normal path. Skips where
/// the kfuncs link (the confirmed mode runs there: the tests above).
#[test]
fn without_the_kfuncs_the_fast_path_follows_what_is_hooked_at_forward() {
    let world = default_world();
    let web = world.node.add_container("web");
    let _tcp = tcp_echo_server(&web.ns, 80, "web");
    world.add(&web, &[PortMapping::tcp(8080, 80)]);
    let (mode, why) = fast_path_status(&world);
    if mode == "confirmed" {
        eprintln!("skipped: this kernel links the conntrack kfuncs, so no fallback runs ({why})");
        return;
    }
    let node_ip = IpAddr::V4(NODE_IP4);
    let hooks_expected = std::env::var("EPM_EXPECT_FORWARD_HOOKS").is_ok_and(|v| v == "1");
    if why.contains("cannot be told") {
        assert!(
            !hooks_expected,
            "EPM_EXPECT_FORWARD_HOOKS=1 (nfnetlink_hook loaded), yet: {mode}: {why}"
        );
        assert_eq!(mode, "never", "{why}");
        let (forward, reply) = fast_growth(&world, node_ip, 8080);
        assert_eq!(
            (forward, reply),
            (0, 0),
            "FORWARD cannot be read, so no flow may skip it\n{}",
            world.dump()
        );
        return;
    }
    assert_eq!(mode, "always", "nothing is hooked at FORWARD yet: {why}");
    assert!(why.contains("nothing is hooked at FORWARD"), "{why}");
    let (forward, reply) = fast_growth(&world, node_ip, 8080);
    assert!(
        forward > 0 && reply > 0,
        "nothing at FORWARD: the flow goes fast both ways (fast_forward +{forward}, fast_reply +{reply})\n{}",
        world.dump()
    );

    // A FORWARD rule for a source that is not ours; the next ADD reads it.
    world.node.ns.exec(
        "iptables",
        &["-A", "FORWARD", "-s", "192.0.2.1", "-j", "DROP"],
    );
    let other = world.node.add_container("other");
    world.add(&other, &[PortMapping::tcp(8081, 80)]);
    let (mode, why) = fast_path_status(&world);
    assert_eq!(mode, "never", "a FORWARD rule exists: {why}");
    assert!(why.contains("something is hooked at FORWARD"), "{why}");
    let (forward, reply) = fast_growth(&world, node_ip, 8080);
    assert_eq!(
        (forward, reply),
        (0, 0),
        "a FORWARD rule exists, so every packet goes through it\n{}",
        world.dump()
    );
}
