//! The programs' rare events, logged through aya-log and drained by the
//! node agent into its own log (issue 32): a packet the programs cannot
//! rewrite, sent for real from the node's link, comes out as one line of
//! the agent's log naming the reason, the interface and the packet, while
//! ordinary translated traffic logs nothing. The agent runs with the
//! DaemonSet's capabilities (no CAP_SYS_ADMIN): it reads the pinned ring
//! buffer, not programs by ID.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use portmap_tests::agent::Agent;
use portmap_tests::cni::Conflist;
use portmap_tests::crafted::{self, Crafted, Transport};
use portmap_tests::topology::{EXT_IP4, NODE_IP4, NODE_UPLINK};
use portmap_tests::traffic::{ServerHandle, echo_reply, tcp_echo_server, tcp_request};
use portmap_tests::world::{World, counter, sock};
use portmap_tests::{Container, PortMapping, bridge_conflist};
use serde_json::Value;

/// The agent drains the ring buffer once a second.
const DRAINED_WITHIN: Duration = Duration::from_secs(5);

/// A bridge world with `fastPath` as asked, whatever `EPM_TEST_FAST_PATH`
/// says: the fast path's first hand-over is an event of its own.
fn world(fast_path: bool) -> World {
    World::with(|name, pins, data| {
        let mut json = bridge_conflist(name, "ebpf-portmap", Some(pins), data)
            .json()
            .clone();
        for plugin in json["plugins"].as_array_mut().expect("plugins") {
            if plugin["type"] == "ebpf-portmap" {
                plugin["fastPath"] = Value::Bool(fast_path);
            }
        }
        Conflist::from_json(json).expect("a well-formed conflist")
    })
}

/// The CPUs a per-CPU map has an entry for (`0-1` is two).
fn possible_cpus() -> usize {
    let list = std::fs::read_to_string("/sys/devices/system/cpu/possible").expect("possible CPUs");
    let count = portmap_common::cpus::count_cpu_list(&list)
        .unwrap_or_else(|| panic!("a CPU list: {list:?}"));
    usize::try_from(count).expect("a CPU count")
}

/// A container `name` with an echo server on 80, mapped from 8080/tcp,
/// and the agent, ready, with the DaemonSet's capabilities but the one for
/// proving namespaces gone.
fn web_and_agent(world: &World, name: &str) -> (Container, ServerHandle, Agent) {
    let web = world.node.add_container(name);
    let server = tcp_echo_server(&web.ns, 80, name);
    world.add(&web, &[PortMapping::tcp(8080, 80)]);
    let agent = Agent::start_confined(world, "bpf,net_admin,perfmon");
    agent.wait_ready(Duration::from_secs(20), "after the ADD");
    (web, server, agent)
}

/// `count` requests from outside through 8080, each answered by `name`.
fn requests_through_8080(world: &World, name: &str, label: &str, count: u64) {
    for n in 0..count {
        let payload = format!("{label} {n}");
        let reply = tcp_request(
            &world.node.ext,
            sock(NODE_IP4, 8080),
            &payload,
            Duration::from_secs(2),
        )
        .unwrap_or_else(|e| panic!("request {n} through 8080: {e}\n{}", world.dump()));
        assert_eq!(reply, echo_reply(name, &payload));
    }
}

/// The agent's lines about the datapath (each drained event is one).
fn datapath_lines(agent: &Agent) -> Vec<String> {
    agent
        .log_text()
        .lines()
        .filter(|line| line.contains("datapath event: "))
        .map(str::to_owned)
        .collect()
}

#[test]
fn a_packet_that_cannot_be_rewritten_is_logged_by_the_agent_and_ordinary_traffic_is_not() {
    let world = world(false);
    let (_web, _server, agent) = web_and_agent(&world, "log-web");

    // Ordinary traffic: translated both ways, and nothing to log.
    requests_through_8080(&world, "log-web", "ordinary", 5);
    // Two drains of the agent's loop.
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(
        datapath_lines(&agent),
        Vec::<String>::new(),
        "ordinary traffic logged datapath events:\n{}",
        agent.log_text()
    );

    // A SYN for the host port cut short before its checksum field: the
    // programs find its mapping and record its flow, and the rewrite
    // fails. Sent from the node's link to the uplink's MAC.
    let before = counter(&world.counters(), "rewrite_failed");
    let node_mac = crafted::mac_of(&world.node.ns, NODE_UPLINK);
    let cut = Crafted {
        transport: Transport::TcpSynCut,
        src: IpAddr::V4(EXT_IP4),
        dst: IpAddr::V4(NODE_IP4),
        sport: 40123,
        dport: 8080,
    };
    crafted::send_frame(&world.node.ext, "eth0", node_mac, &cut);

    let expected = format!("datapath event: rewrite-failed on {NODE_UPLINK} (if ");
    let tuple = format!("TCP {EXT_IP4}:40123 > {NODE_IP4}:8080");
    let deadline = Instant::now() + DRAINED_WITHIN;
    let line = loop {
        if let Some(line) = datapath_lines(&agent)
            .into_iter()
            .find(|line| line.contains(&expected))
        {
            break line;
        }
        assert!(
            Instant::now() < deadline,
            "no rewrite-failed line in the agent's log within {DRAINED_WITHIN:?} (rewrite_failed counted {} before, {} now):\n{}",
            before,
            counter(&world.counters(), "rewrite_failed"),
            agent.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        line.contains(&tuple),
        "the line names the packet ({tuple}): {line}"
    );
    assert!(
        line.contains("the packet could not be rewritten"),
        "the line says what the reason means: {line}"
    );
    assert!(line.contains("WARN"), "a problem is a warning: {line}");
    assert_eq!(
        counter(&world.counters(), "rewrite_failed"),
        before + 1,
        "the programs counted it once"
    );
    // The one event, once: the ordinary traffic around it added nothing.
    assert_eq!(
        datapath_lines(&agent).len(),
        1,
        "one line for one event:\n{}",
        agent.log_text()
    );
}

#[test]
fn the_fast_paths_first_hand_over_is_logged_once_per_cpu() {
    let world = world(true);
    let (_web, _server, agent) = web_and_agent(&world, "fast-web");
    let requests = 20;
    requests_through_8080(&world, "fast-web", "fast", requests);
    let forwarded = counter(&world.counters(), "fast_forward");
    assert!(
        forwarded >= requests,
        "the fast path handed over {forwarded} packets for {requests} requests:\n{}",
        world.dump()
    );
    let expected = format!("datapath event: fast-forward on {NODE_UPLINK} (if ");
    let deadline = Instant::now() + DRAINED_WITHIN;
    let lines = loop {
        let lines: Vec<String> = datapath_lines(&agent)
            .into_iter()
            .filter(|line| line.contains(&expected))
            .collect();
        if !lines.is_empty() {
            // One more drain, for a CPU whose line came last.
            std::thread::sleep(Duration::from_millis(1500));
            break datapath_lines(&agent)
                .into_iter()
                .filter(|line| line.contains(&expected))
                .collect::<Vec<String>>();
        }
        assert!(
            Instant::now() < deadline,
            "no fast-forward line in the agent's log within {DRAINED_WITHIN:?}:\n{}",
            agent.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let cpus = possible_cpus();
    assert!(
        lines.len() <= cpus,
        "at most one line per CPU for {forwarded} hand-overs, {} on {cpus} CPUs:\n{}",
        lines.len(),
        lines.join("\n")
    );
    for line in &lines {
        assert!(
            line.contains(" INFO ") && line.ends_with("(the first on this CPU)"),
            "information, once: {line}"
        );
        assert!(
            line.contains(&format!("TCP {EXT_IP4}:"))
                && line.contains(&format!("> {NODE_IP4}:8080")),
            "the line names the packet: {line}"
        );
    }
    assert!(
        datapath_lines(&agent)
            .iter()
            .all(|line| line.contains("(the first on this CPU)")),
        "no other event:\n{}",
        agent.log_text()
    );
}
