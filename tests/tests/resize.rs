//! Resizing the conntrack tables in place (issue 30): a changed
//! `conntrackSize` takes effect at the next ADD, and the established TCP
//! and UDP flows of both families carry on through a grow and a shrink
//! with their entries (no recovery, no new flow); a shrink below the live
//! entries keeps the newest flows and says how many it dropped. A changed
//! `maxMappings` resizes the mappings in place too, at the next ADD and at
//! the agent's next pass, with every mapping and flow carried over; one
//! below the live mappings is refused, changing nothing. Real traffic from
//! the external client through the reference bridge chain. Needs root.

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::time::Duration;

use portmap_tests::topology::{EXT_IP4, EXT_IP6, NODE_IP4, NODE_IP6, PLUGIN_LOG};
use portmap_tests::traffic::{
    ServerHandle, TcpSession, echo_reply, tcp_connect, tcp_echo_server, udp_echo_server,
};
use portmap_tests::world::{PROBE, World, counter, sock};
use portmap_tests::{Conflist, PortMapping};
use serde_json::Value;

/// The world's conflist with `conntrackSize` `size`.
fn list_with(world_list: &Conflist, size: u64) -> Conflist {
    let mut json = world_list.json().clone();
    json["plugins"][1]["conntrackSize"] = Value::from(size);
    Conflist::from_json(json).expect("conflist")
}

fn world_with(size: u64) -> World {
    World::with(|name, pins, data| {
        let list = portmap_tests::bridge_conflist(name, "ebpf-portmap", Some(pins), data);
        list_with(&list, size)
    })
}

/// A container `web` with TCP and UDP echo servers on 80 and 53, mapped
/// from 8080/TCP and 5353/UDP.
fn serve_web(world: &World) -> (ServerHandle, ServerHandle) {
    let web = world.node.add_container("web");
    let servers = (
        tcp_echo_server(&web.ns, 80, "web"),
        udp_echo_server(&web.ns, 53, "web"),
    );
    world.add(
        &web,
        &[PortMapping::tcp(8080, 80), PortMapping::udp(5353, 53)],
    );
    servers
}

/// Established flows from the external client: TCP and UDP, IPv4 and IPv6.
struct Flows {
    tcp: Vec<TcpSession>,
    udp: Vec<UdpSocket>,
}

fn open_flows(world: &World) -> Flows {
    let nodes = [IpAddr::V4(NODE_IP4), IpAddr::V6(NODE_IP6)];
    let tcp = nodes
        .iter()
        .map(|&node| {
            tcp_connect(&world.node.ext, sock(node, 8080), PROBE)
                .unwrap_or_else(|e| panic!("connect to {node}:8080: {e}\n{}", world.dump()))
        })
        .collect();
    let udp = [
        (IpAddr::V4(EXT_IP4), nodes[0]),
        (IpAddr::V6(EXT_IP6), nodes[1]),
    ]
    .iter()
    .map(|&(client, node)| {
        world
            .node
            .ext
            .run(|| {
                let socket = UdpSocket::bind(SocketAddr::new(client, 0))?;
                socket.connect(sock(node, 5353))?;
                socket.set_read_timeout(Some(PROBE))?;
                Ok::<_, std::io::Error>(socket)
            })
            .unwrap_or_else(|e| panic!("UDP socket towards {node}:5353: {e}"))
    })
    .collect();
    let mut flows = Flows { tcp, udp };
    exchange(world, &mut flows, "when opened");
    flows
}

/// One request and answer on every flow.
fn exchange(world: &World, flows: &mut Flows, when: &str) {
    for session in &mut flows.tcp {
        match session.request(when, PROBE) {
            Ok(answer) => assert_eq!(answer, echo_reply("web", when), "{when}"),
            Err(e) => panic!(
                "{when}: an established TCP flow was lost: {e}\ncounters: {:#}\n{}",
                world.counters(),
                world.dump()
            ),
        }
    }
    for socket in &flows.udp {
        let answer = socket.send(when.as_bytes()).and_then(|_| {
            let mut buf = [0u8; 512];
            let n = socket.recv(&mut buf)?;
            Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
        });
        match answer {
            Ok(answer) => assert_eq!(answer, echo_reply("web", when), "{when}"),
            Err(e) => panic!(
                "{when}: an established UDP flow was lost: {e}\ncounters: {:#}\n{}",
                world.counters(),
                world.dump()
            ),
        }
    }
}

/// An ADD of a new container `id` with `conntrackSize` `size` in the
/// conflist: the run that takes the change up.
fn add_with_size(world: &World, id: &str, host_port: u16, size: u64) {
    let list = list_with(&world.list, size);
    let container = world.node.add_container(id);
    world
        .runner
        .add(
            &list,
            &container.with_port_mappings(&[PortMapping::tcp(host_port, 80)]),
        )
        .unwrap_or_else(|e| {
            panic!(
                "ADD of {id} with conntrackSize {size}: {e}\n{}",
                world.dump()
            )
        });
}

/// The flows answer after a resize with the entries they had: no packet
/// was recovered or refused for want of its flow, and none of their
/// packets made a new one.
fn assert_carried_over(world: &World, flows: &mut Flows, when: &str) {
    let before = world.counters();
    exchange(world, flows, when);
    let after = world.counters();
    assert_eq!(
        counter(&after, "dnat_new"),
        counter(&before, "dnat_new"),
        "{when}: a packet of an established flow made a new flow: {after:#}"
    );
    assert_eq!(counter(&after, "ct_recovered"), 0, "{when}: {after:#}");
    assert_eq!(counter(&after, "skip_not_syn"), 0, "{when}: {after:#}");
}

#[test]
fn established_flows_survive_a_grow_and_a_shrink() {
    let world = world_with(1024);
    let _servers = serve_web(&world);
    let mut flows = open_flows(&world);
    assert_eq!(world.map_max_entries("conntrack"), 1024);

    add_with_size(&world, "grow", 8081, 4096);
    assert_eq!(world.map_max_entries("conntrack"), 4096, "grown");
    assert_eq!(world.map_max_entries("conntrack_other"), 4096, "grown");
    assert_eq!(world.map_max_entries("conntrack_close"), 1024);
    assert_carried_over(&world, &mut flows, "after the grow");

    add_with_size(&world, "shrink", 8082, 2048);
    assert_eq!(world.map_max_entries("conntrack"), 2048, "shrunk");
    assert_eq!(world.map_max_entries("conntrack_other"), 2048, "shrunk");
    assert_carried_over(&world, &mut flows, "after the shrink");

    // `status` says where the size comes from.
    let out = world.operator(&["status", "--json"]);
    let status: Value = serde_json::from_slice(&out.stdout).expect("status JSON");
    assert_eq!(
        status["sizes"]["conntrack"]["source"], "conflist",
        "{:#}",
        status["sizes"]
    );
    assert_eq!(status["sizes"]["conntrack"]["open"], 2048);
}

/// Room for `n` more open files: the held connections have both ends in
/// this process.
fn allow_open_files(n: u64) {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain syscalls on a struct we own.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut limit), 0);
        if limit.rlim_cur >= n {
            return;
        }
        limit.rlim_cur = n;
        limit.rlim_max = limit.rlim_max.max(n);
        assert_eq!(
            libc::setrlimit(libc::RLIMIT_NOFILE, &raw const limit),
            0,
            "raising the open-file limit to {n}: {}",
            std::io::Error::last_os_error()
        );
    }
}

#[test]
fn a_shrink_below_the_live_flows_keeps_the_newest_and_says_how_many_it_dropped() {
    const HELD: usize = 1500;
    allow_open_files(2 * HELD as u64 + 1024);
    let world = world_with(4096);
    let _servers = serve_web(&world);
    let mut flows = open_flows(&world);
    // Two entries each in the open TCP table: 3 000 live entries.
    let _held: Vec<TcpSession> = (0..HELD)
        .map(|i| {
            let mut session = tcp_connect(&world.node.ext, sock(NODE_IP4, 8080), PROBE)
                .unwrap_or_else(|e| panic!("held connection {i}: {e}\n{}", world.dump()));
            session.request("held", PROBE).expect("held request");
            session
        })
        .collect();
    // The flows' entries refresh their age at most once a second: after a
    // second, this exchange makes them the newest.
    std::thread::sleep(Duration::from_millis(1100));
    exchange(&world, &mut flows, "before the shrink");

    add_with_size(&world, "shrink", 8081, 1024);
    assert_eq!(world.map_max_entries("conntrack"), 1024, "shrunk");
    assert_carried_over(&world, &mut flows, "after the shrink");
    let log = std::fs::read_to_string(world.node.data_dir().join(PLUGIN_LOG))
        .expect("read the plugin log");
    let line = log
        .lines()
        .find(|line| line.contains("resizing conntrack:") && line.contains("dropped"))
        .unwrap_or_else(|| panic!("no line about dropped entries in the log:\n{log}"));
    let dropped: u64 = line
        .split("resizing conntrack: ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count in {line:?}"));
    assert!(
        dropped >= 2 * HELD as u64 + 4 - 1024,
        "{dropped} dropped of at least {} live entries: {line}",
        2 * HELD + 4
    );
}

/// The world's conflist with `maxMappings` `max` (and `conntrackSize`
/// 1024, as the other tests here).
fn list_with_max_mappings(world_list: &Conflist, max: u64) -> Conflist {
    let mut json = world_list.json().clone();
    json["plugins"][1]["maxMappings"] = Value::from(max);
    Conflist::from_json(json).expect("conflist")
}

/// An ADD of a new container `id` mapping `host_port` with `maxMappings`
/// `max` in the conflist: the run that takes the change up.
fn add_with_max_mappings(world: &World, id: &str, host_port: u16, max: u64) {
    let list = list_with_max_mappings(&world.list, max);
    let container = world.node.add_container(id);
    world
        .runner
        .add(
            &list,
            &container.with_port_mappings(&[PortMapping::tcp(host_port, 80)]),
        )
        .unwrap_or_else(|e| panic!("ADD of {id} with maxMappings {max}: {e}\n{}", world.dump()));
}

/// A new TCP connection to `port` on both families answers from `web`.
fn assert_new_connections(world: &World, port: u16, when: &str) {
    for node in [IpAddr::V4(NODE_IP4), IpAddr::V6(NODE_IP6)] {
        let mut session = tcp_connect(&world.node.ext, sock(node, port), PROBE)
            .unwrap_or_else(|e| panic!("{when}: connect to {node}:{port}: {e}\n{}", world.dump()));
        let answer = session
            .request(when, PROBE)
            .unwrap_or_else(|e| panic!("{when}: request to {node}:{port}: {e}\n{}", world.dump()));
        assert_eq!(answer, echo_reply("web", when), "{when}");
    }
}

/// A changed `maxMappings` resizes `mappings` and `counters` in place at
/// the next ADD: the established TCP and UDP flows of both families carry
/// on with their entries through a grow and a shrink (still above the
/// live mappings), every mapping is still there and reachable, and the
/// owners' index came along (DEL of the first container removes exactly
/// its mappings).
#[test]
fn established_flows_survive_a_max_mappings_grow_and_shrink() {
    let world = World::with(|name, pins, data| {
        let list = portmap_tests::bridge_conflist(name, "ebpf-portmap", Some(pins), data);
        list_with_max_mappings(&list_with(&list, 1024), 1024)
    });
    let _servers = serve_web(&world);
    let mut flows = open_flows(&world);
    assert_eq!(world.map_max_entries("mappings"), 1024);
    assert_eq!(world.map_max_entries("counters"), 1024);

    add_with_max_mappings(&world, "grow", 8081, 4096);
    assert_eq!(world.map_max_entries("mappings"), 4096, "grown");
    assert_eq!(world.map_max_entries("counters"), 4096, "grown");
    assert_carried_over(&world, &mut flows, "after the maxMappings grow");
    assert_new_connections(&world, 8080, "after the maxMappings grow");
    // web's 4, and grow's 2.
    assert_eq!(world.mapping_count(), 6, "{:#}", world.list());

    add_with_max_mappings(&world, "shrink", 8082, 512);
    assert_eq!(world.map_max_entries("mappings"), 512, "shrunk");
    assert_eq!(world.map_max_entries("counters"), 512, "shrunk");
    assert_carried_over(&world, &mut flows, "after the maxMappings shrink");
    assert_new_connections(&world, 8080, "after the maxMappings shrink");
    assert_eq!(world.mapping_count(), 8, "{:#}", world.list());

    // The index was carried over: DEL finds grow's mappings through it.
    let grow = world.node.add_container("grow");
    world
        .runner
        .del(
            &list_with_max_mappings(&world.list, 512),
            &grow.with_port_mappings(&[PortMapping::tcp(8081, 80)]),
        )
        .unwrap_or_else(|e| panic!("DEL of grow: {e}\n{}", world.dump()));
    assert_eq!(world.mapping_count(), 6, "{:#}", world.list());
    assert_carried_over(&world, &mut flows, "after a DEL");

    let out = world.operator(&["status", "--json"]);
    let status: Value = serde_json::from_slice(&out.stdout).expect("status JSON");
    assert_eq!(
        status["sizes"]["mappings"]["source"], "conflist",
        "{:#}",
        status["sizes"]
    );
}

/// A `maxMappings` below the live mappings is refused: the ADD fails with
/// an error that names the key and the live count, and nothing changes
/// (the maps keep their size and entries, the flows carry on, and the
/// conntrack tables, whose size the same conflist changes, are not
/// resized either).
#[test]
fn a_max_mappings_below_the_live_mappings_is_refused_and_changes_nothing() {
    let world = world_with(1024);
    let _servers = serve_web(&world);
    let mut flows = open_flows(&world);
    // 8 ports of both families and web's 4: 20 live mappings.
    let many = world.node.add_container("many");
    let ports: Vec<PortMapping> = (0..8).map(|i| PortMapping::tcp(9000 + i, 80)).collect();
    world.add(&many, &ports);
    assert_eq!(world.mapping_count(), 20);
    let before = world.dump_map("mappings");

    let mut json = list_with_max_mappings(&world.list, 16).json().clone();
    json["plugins"][1]["conntrackSize"] = Value::from(2048);
    let list = Conflist::from_json(json).expect("conflist");
    let refused = world.node.add_container("refused");
    let error = world
        .runner
        .add(
            &list,
            &refused.with_port_mappings(&[PortMapping::tcp(8081, 80)]),
        )
        .map(|_| ())
        .expect_err("an ADD with maxMappings 16 below 20 live mappings succeeded");
    assert_eq!(error.error_code(), Some(7), "{error}");
    let error = error.to_string();
    assert!(
        error.contains("maxMappings 16 is too small")
            && error.contains("holds 20 live entries")
            && error.contains("at least 20"),
        "the error does not name maxMappings and the live count: {error}"
    );
    assert_eq!(world.map_max_entries("mappings"), 65536, "not resized");
    assert_eq!(world.map_max_entries("conntrack"), 1024, "not resized");
    assert_eq!(world.dump_map("mappings"), before, "the mappings changed");
    assert_carried_over(&world, &mut flows, "after the refusal");
}

/// The agent's pass takes a changed `maxMappings` up too, with no CNI
/// call: its conflist rewritten and any link event later, the maps have
/// the new size and the established flows carry on.
#[test]
fn the_agent_resizes_the_mappings_on_its_next_pass() {
    let world = World::with(|name, pins, data| {
        let list = portmap_tests::bridge_conflist(name, "ebpf-portmap", Some(pins), data);
        list_with_max_mappings(&list_with(&list, 1024), 1024)
    });
    let _servers = serve_web(&world);
    let mut flows = open_flows(&world);
    let agent = portmap_tests::agent::Agent::start(&world);
    agent.wait_ready(Duration::from_secs(10), "at start");
    assert_eq!(world.map_max_entries("mappings"), 1024);

    let list = list_with_max_mappings(&world.list, 2048);
    std::fs::write(&agent.conf, list.json().to_string()).expect("rewrite the agent's conflist");
    // A link event wakes the agent for a pass.
    world.node.ns.ip(&[
        "link", "add", "epmwake", "type", "veth", "peer", "name", "epmwake1",
    ]);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while world.map_max_entries("mappings") != 2048 {
        assert!(
            std::time::Instant::now() < deadline,
            "the agent did not resize the mappings within 10 s:\n{}",
            agent.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_carried_over(&world, &mut flows, "after the agent's resize");
    assert_new_connections(&world, 8080, "after the agent's resize");
    assert_eq!(world.mapping_count(), 4, "{:#}", world.list());
}
