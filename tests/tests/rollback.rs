//! A node rolled back from ebpf-portmap to upstream `portmap` (issue 29,
//! item 4, second case): a pod that ebpf-portmap set up is deleted through
//! the chain the conflist names now, upstream's, which knows nothing of
//! it, and its namespace goes. No DEL ever reaches ebpf-portmap; the
//! agent's GC finds the namespace gone and removes the mappings within its
//! GC period, so a new pod that upstream maps on the same ports gets its
//! traffic (tc ingress runs before upstream's PREROUTING rules: a mapping
//! left behind would send the port to the dead pod's address for good).
//! Debian's upstream `portmap` and the reference `bridge` and `host-local`
//! run in the test's own node namespace. Needs root.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use portmap_tests::agent::Agent;
use portmap_tests::topology::{NODE_IP4, NODE_IP6};
use portmap_tests::traffic::{
    ServerHandle, echo_reply, tcp_echo_server, tcp_request, udp_echo_server, udp_request,
};
use portmap_tests::world::{World, sock};
use portmap_tests::{Container, PortMapping, bridge_conflist};

const PROBE: Duration = Duration::from_secs(5);
const TCP_PORT: u16 = 18580;
const UDP_PORT: u16 = 18581;
/// The agent's GC timer and grace period for a namespace that is gone.
const GC_INTERVAL_SECS: u64 = 1;
const GRACE_SECS: u64 = 2;

fn serve(container: &Container) -> (ServerHandle, ServerHandle) {
    (
        tcp_echo_server(&container.ns, 80, &container.id),
        udp_echo_server(&container.ns, 81, &container.id),
    )
}

/// TCP and UDP, IPv4 and IPv6, from the external client: each answers as `name`.
fn assert_answers(world: &World, name: &str, when: &str) {
    for addr in [sock(NODE_IP4, TCP_PORT), sock(NODE_IP6, TCP_PORT)] {
        world.expect_answer(
            &format!("{when}: TCP {addr}"),
            tcp_request(&world.node.ext, addr, "ping", PROBE),
            &echo_reply(name, "ping"),
        );
    }
    for addr in [sock(NODE_IP4, UDP_PORT), sock(NODE_IP6, UDP_PORT)] {
        world.expect_answer(
            &format!("{when}: UDP {addr}"),
            udp_request(&world.node.ext, addr, "ping", PROBE),
            &echo_reply(name, "ping"),
        );
    }
}

fn our_hosts(world: &World) -> BTreeSet<String> {
    world
        .list()
        .as_array()
        .expect("list --json is an array")
        .iter()
        .filter(|row| row["upstream"].is_null())
        .filter_map(|row| row["host"].as_str().map(str::to_owned))
        .collect()
}

#[test]
fn after_a_rollback_the_agent_frees_the_ports_of_pods_deleted_through_upstream() {
    let world = World::bridge();
    let upstream = bridge_conflist(world.list.name(), "portmap", None, world.node.data_dir());
    let ports = [
        PortMapping::tcp(TCP_PORT, 80),
        PortMapping::udp(UDP_PORT, 81),
    ];

    let live = world.node.add_container("live");
    let servers = serve(&live);
    world.add(&live, &ports);
    assert_answers(&world, "live", "through ebpf-portmap");
    assert_eq!(our_hosts(&world).len(), 4, "two ports, two families");
    let agent = Agent::start_with(
        &world,
        &[
            "--gc-interval",
            &GC_INTERVAL_SECS.to_string(),
            "--gone-grace",
            &GRACE_SECS.to_string(),
        ],
    );

    // Rolled back: the conflist names upstream `portmap`. The pod is
    // deleted: its DEL goes through upstream's chain (bridge removes the
    // veth, upstream portmap has nothing of it), then its namespace goes.
    world
        .runner
        .del(&upstream, &live.with_port_mappings(&ports))
        .unwrap_or_else(|e| panic!("DEL of live through upstream's chain: {e}"));
    drop(servers);
    let deleted = Instant::now();
    drop(live);

    let within = Duration::from_secs(GRACE_SECS + 2 * GC_INTERVAL_SECS + 8);
    loop {
        let left = our_hosts(&world);
        if left.is_empty() {
            break;
        }
        assert!(
            deleted.elapsed() < within,
            "the agent left {left:?} of the deleted pod for {within:?}\n{}\n{}",
            agent.log_text(),
            world.dump()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!(
        "rollback: our mappings of the deleted pod removed {:?} after its namespace went (grace {GRACE_SECS}s, GC every {GC_INTERVAL_SECS}s)",
        deleted.elapsed()
    );

    // A new pod that upstream maps on the same ports gets their traffic.
    let heir = world.node.add_container("heir");
    let _heir_servers = serve(&heir);
    world
        .runner
        .add(&upstream, &heir.with_port_mappings(&ports))
        .unwrap_or_else(|e| panic!("upstream ADD of heir: {e}\n{}", world.dump()));
    assert_answers(&world, "heir", "upstream's new pod on the freed ports");
    world
        .runner
        .del(&upstream, &heir.with_port_mappings(&ports))
        .unwrap_or_else(|e| panic!("upstream DEL of heir: {e}"));
}
