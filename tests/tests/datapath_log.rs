//! The programs' rare events, logged through aya-log and drained by the
//! node agent into its own log (issue 32): a packet the programs cannot
//! rewrite, sent for real from the node's link, comes out as one line of
//! the agent's log naming the reason, the interface and the packet, while
//! ordinary translated traffic logs nothing. The agent runs with the
//! DaemonSet's capabilities (no CAP_SYS_ADMIN): it reads the pinned ring
//! buffer, not programs by ID.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use portmap_tests::PortMapping;
use portmap_tests::agent::Agent;
use portmap_tests::crafted::{self, Crafted, Transport};
use portmap_tests::topology::{EXT_IP4, NODE_IP4, NODE_UPLINK};
use portmap_tests::traffic::{echo_reply, tcp_echo_server, tcp_request};
use portmap_tests::world::{World, counter, sock};

/// The agent drains the ring buffer once a second.
const DRAINED_WITHIN: Duration = Duration::from_secs(5);

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
    let world = World::bridge();
    let web = world.node.add_container("log-web");
    let _server = tcp_echo_server(&web.ns, 80, "log-web");
    world.add(&web, &[PortMapping::tcp(8080, 80)]);
    // The DaemonSet's capabilities but the one for proving namespaces gone.
    let agent = Agent::start_confined(&world, "bpf,net_admin,perfmon");
    agent.wait_ready(Duration::from_secs(20), "after the ADD");

    // Ordinary traffic: translated both ways, and nothing to log.
    for n in 0..5 {
        let payload = format!("ordinary {n}");
        let reply = tcp_request(
            &world.node.ext,
            sock(NODE_IP4, 8080),
            &payload,
            Duration::from_secs(2),
        )
        .unwrap_or_else(|e| panic!("request {n} through 8080: {e}\n{}", world.dump()));
        assert_eq!(reply, echo_reply("log-web", &payload));
    }
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
