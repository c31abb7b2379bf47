//! Node traffic the socket hooks translate, as the operator sees it (issue
//! #38, item 7): a node process dialling node-IP:hostPort or localhost is
//! pointed at the container in connect() or sendmsg(), so its packets cross
//! no translating tc hook. `list` must still count it for its mapping (and
//! for no other), `trace` must show it as a `sock` line, and the agent
//! must export it. Needs root; each test has its own namespaces, pin root
//! and cgroup.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use portmap_tests::agent::{Agent, sample};
use portmap_tests::topology::NODE_IP4;
use portmap_tests::traffic::{ServerHandle, echo_reply, tcp_echo_server, udp_echo_server};
use portmap_tests::world::{Probed, World, sock, trace_events, wait_bounded};
use portmap_tests::{Container, NetNs, PortMapping};
use serde_json::Value;

/// Upper bound for anything that has to happen; never a timing assertion.
const BOUND: Duration = Duration::from_secs(20);

/// The probe client in `ns`, in the test's cgroup (where the hooks are).
fn probe_hooked(world: &World, ns: &NetNs, mode: &str, target: SocketAddr, payload: &str) {
    let seen: Probed = world
        .probe(
            env!("CARGO_BIN_EXE_probe"),
            ns,
            true,
            &[mode, &target.to_string(), payload, "3000"],
        )
        .unwrap_or_else(|e| panic!("probe {mode} {target}: {e}\n{}", world.dump()));
    assert_eq!(
        seen.reply,
        echo_reply("web", payload),
        "{mode} {target}: answered by the wrong server"
    );
}

fn json_of(world: &World, args: &[&str]) -> Value {
    let out = world.operator(args);
    assert!(
        out.status.success(),
        "ebpf-portmap {args:?} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("ebpf-portmap {args:?} is not JSON: {e}"))
}

fn row<'a>(list: &'a Value, host: &str) -> &'a Value {
    list.as_array()
        .expect("list is an array")
        .iter()
        .find(|r| r["host"] == host)
        .unwrap_or_else(|| panic!("no row {host} in {list:#}"))
}

fn num(value: &Value, key: &str) -> u64 {
    value[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} is not a number in {value:#}"))
}

/// A bridge node with `web` (8080/tcp to 80, 5353/udp to 53) and `api`
/// (9090/tcp to 80), each with its echo servers.
fn web_and_api() -> (World, Container, Container, Vec<ServerHandle>) {
    let world = World::bridge();
    let web = world.node.add_container("web");
    let api = world.node.add_container("api");
    let servers = vec![
        tcp_echo_server(&web.ns, 80, "web"),
        udp_echo_server(&web.ns, 53, "web"),
        tcp_echo_server(&api.ns, 80, "api"),
    ];
    world.add(
        &web,
        &[PortMapping::tcp(8080, 80), PortMapping::udp(5353, 53)],
    );
    world.add(&api, &[PortMapping::tcp(9090, 80)]);
    (world, web, api, servers)
}

#[test]
fn node_connections_translated_by_the_socket_hooks_are_counted_and_traced() {
    let (world, web, _api, _servers) = web_and_api();
    let list = json_of(&world, &["list", "--json"]);
    let web_ip = row(&list, "0.0.0.0:8080/tcp")["containerIP"]
        .as_str()
        .expect("containerIP")
        .to_owned();
    for r in list.as_array().expect("array") {
        assert_eq!(num(r, "sockTranslations"), 0, "nothing dialled yet: {r:#}");
    }

    // One TCP connection from the node to node-IP:hostPort, traced.
    let trace = world.start_trace(&["--json", "--port", "8080", "--count", "1"], BOUND);
    probe_hooked(&world, &world.node.ns, "tcp", sock(NODE_IP4, 8080), "n1");
    let out = wait_bounded(trace, BOUND, "trace --port 8080 --count 1");
    let events = trace_events(&out);
    assert_eq!(events.len(), 1, "{events:#?}");
    let event = &events[0];
    assert_eq!(event["interface"], "sock", "{event:#}");
    assert_eq!(event["direction"], "connect", "{event:#}");
    assert_eq!(event["protocol"], "tcp", "{event:#}");
    assert_eq!(event["from"], "node", "{event:#}");
    assert_eq!(event["to"], format!("{NODE_IP4}:8080"), "{event:#}");
    assert_eq!(event["newTo"], format!("{web_ip}:80"), "{event:#}");
    assert_eq!(
        event["decisions"],
        serde_json::json!(["socket-translated"]),
        "{event:#}"
    );

    // UDP: an unconnected datagram (sendmsg) to the node's address, a
    // connected socket (connect) to localhost.
    probe_hooked(
        &world,
        &world.node.ns,
        "udp-unconnected",
        sock(NODE_IP4, 5353),
        "n2",
    );
    probe_hooked(
        &world,
        &world.node.ns,
        "udp",
        SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 5353),
        "n3",
    );

    let list = json_of(&world, &["list", "--json"]);
    let tcp = row(&list, "0.0.0.0:8080/tcp");
    assert_eq!(num(tcp, "sockConnects"), 1, "one connect(): {tcp:#}");
    assert_eq!(num(tcp, "sockSendmsgs"), 0, "{tcp:#}");
    let udp = row(&list, "0.0.0.0:5353/udp");
    assert_eq!(num(udp, "sockConnects"), 1, "the connected socket: {udp:#}");
    assert_eq!(
        num(udp, "sockSendmsgs"),
        1,
        "the unconnected datagram: {udp:#}"
    );
    assert_eq!(num(udp, "sockTranslations"), 2, "{udp:#}");
    for host in [
        "[::]:8080/tcp",
        "[::]:5353/udp",
        "0.0.0.0:9090/tcp",
        "[::]:9090/tcp",
    ] {
        assert_eq!(
            num(row(&list, host), "sockTranslations"),
            0,
            "{host}: nothing dialled it: {list:#}"
        );
    }

    // The table has the column next to the packets.
    let out = world.operator(&["list", "--port", "8080"]);
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    let header: Vec<&str> = lines[0].split('\t').collect();
    let column = header
        .iter()
        .position(|h| *h == "SOCK CONNECT/SENDMSG")
        .unwrap_or_else(|| panic!("no SOCK column: {text}"));
    assert_eq!(header[column - 1], "PACKETS IN/OUT", "{text}");
    let cells: Vec<&str> = lines
        .iter()
        .find(|l| l.starts_with("0.0.0.0:8080/tcp\t"))
        .unwrap_or_else(|| panic!("no 8080 line: {text}"))
        .split('\t')
        .collect();
    assert_eq!(cells[column], "1/0", "{text}");

    // DEL drops the owner's socket-hook counters with its mappings.
    world.del(
        &web,
        &[PortMapping::tcp(8080, 80), PortMapping::udp(5353, 53)],
    );
    assert_eq!(
        world.dump_map("sock_counters"),
        Value::Array(Vec::new()),
        "web's socket-hook counters are gone with it"
    );
}

/// The agent's `mapping_socket_translations_total`, labelled as
/// `mapping_packets_total` is, plus the hook.
#[test]
fn the_agent_exports_the_socket_translations_per_mapping() {
    let (world, _web, _api, _servers) = web_and_api();
    probe_hooked(&world, &world.node.ns, "tcp", sock(NODE_IP4, 8080), "m1");
    probe_hooked(&world, &world.node.ns, "tcp", sock(NODE_IP4, 8080), "m2");
    probe_hooked(
        &world,
        &world.node.ns,
        "udp-unconnected",
        sock(NODE_IP4, 5353),
        "m3",
    );

    // Series per mapping are off unless asked for.
    let agent = Agent::start_with(&world, &["--metrics-per-mapping"]);
    let exposition = agent.metrics();
    let name = "ebpf_portmap_mapping_socket_translations_total";
    let value = |port: &str, protocol: &str, hook: &str| {
        sample(
            &exposition,
            name,
            &[
                ("host_ip", "0.0.0.0"),
                ("host_port", port),
                ("protocol", protocol),
                ("hook", hook),
            ],
        )
        .unwrap_or_else(|| panic!("no {name} for {port}/{protocol} {hook}:\n{exposition}"))
    };
    assert_eq!(value("8080", "tcp", "connect"), 2.0, "{exposition}");
    assert_eq!(value("8080", "tcp", "sendmsg"), 0.0, "{exposition}");
    assert_eq!(value("5353", "udp", "sendmsg"), 1.0, "{exposition}");
    assert_eq!(value("5353", "udp", "connect"), 0.0, "{exposition}");
    assert_eq!(value("9090", "tcp", "connect"), 0.0, "nothing dialled 9090");
}
