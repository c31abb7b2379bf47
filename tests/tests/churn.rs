//! Conntrack under churn (issue #16): with a small `conntrackSize`, and
//! with the default size the node formula gives (issue #30), flows that
//! come and go must not push out the idle ones that stay, and a live flow
//! whose entries were pushed out anyway is recovered, never reset, while
//! the node's own flows from a mapped port stay the node's. Real traffic
//! from the external client, through the reference bridge chain. Needs
//! root.

use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};

use portmap_tests::PortMapping;
use portmap_tests::topology::{EXT_IP4, NODE_IP4};
use portmap_tests::traffic::{
    TcpSession, echo_reply, tcp_connect, tcp_echo_server, tcp_request, udp_echo_server,
};
use portmap_tests::world::{PROBE, World, bpftool_hex, counter, sock};
use serde_json::Value;

/// The smallest table the plugin accepts: churn of a few thousand flows is
/// four times it.
const TABLE: u64 = 1024;

/// A bridge world whose ebpf-portmap entry has `conntrackSize` [`TABLE`].
fn small_table_world() -> World {
    World::with(|name, pins, data| {
        let list = portmap_tests::bridge_conflist(name, "ebpf-portmap", Some(pins), data);
        let mut json = list.json().clone();
        json["plugins"][1]["conntrackSize"] = Value::from(TABLE);
        portmap_tests::Conflist::from_json(json).expect("conflist")
    })
}

/// The table a world's conflist gives: [`TABLE`], or the default size
/// (no `conntrackSize`), which the node formula sets and the kernel reports.
#[derive(Clone, Copy)]
enum Size {
    Small,
    Default,
}

/// The world for `size`, its web container served, and the open table's
/// entries.
fn churn_world(size: Size) -> (World, Web, u64) {
    let world = match size {
        Size::Small => small_table_world(),
        Size::Default => World::bridge(),
    };
    let web = serve_web(&world);
    let table = world.map_max_entries("conntrack");
    if let Size::Small = size {
        assert_eq!(table, TABLE, "conntrackSize sets the open table");
    }
    // Tens of thousands of short connections: the client keeps no
    // TIME_WAIT sockets, or its ephemeral ports run out.
    world.node.ext.sysctl("net.ipv4.tcp_max_tw_buckets", "0");
    (world, web, table)
}

/// A container `web` with a TCP echo server on 80 and a UDP one on 53,
/// mapped from the node's 8080/TCP and 5353/UDP.
struct Web {
    _tcp: portmap_tests::traffic::ServerHandle,
    _udp: portmap_tests::traffic::ServerHandle,
}

fn serve_web(world: &World) -> Web {
    let web = world.node.add_container("web");
    let servers = Web {
        _tcp: tcp_echo_server(&web.ns, 80, "web"),
        _udp: udp_echo_server(&web.ns, 53, "web"),
    };
    world.add(
        &web,
        &[PortMapping::tcp(8080, 80), PortMapping::udp(5353, 53)],
    );
    servers
}

/// An idle connection from the external client, after one exchange.
fn idle_session(world: &World) -> TcpSession {
    let mut session = tcp_connect(&world.node.ext, sock(NODE_IP4, 8080), PROBE)
        .unwrap_or_else(|e| panic!("connect: {e}\n{}", world.dump()));
    assert_eq!(
        session.request("before", PROBE).expect("first request"),
        echo_reply("web", "before")
    );
    session
}

/// `n` short TCP connections from the external client, one after another,
/// each a full exchange and close; every one must be answered.
fn tcp_churn(world: &World, n: u64) {
    for i in 0..n {
        let answer = tcp_request(&world.node.ext, sock(NODE_IP4, 8080), "churn", PROBE)
            .unwrap_or_else(|e| panic!("short connection {i} of {n}: {e}\n{}", world.dump()));
        assert_eq!(answer, echo_reply("web", "churn"), "short connection {i}");
    }
}

fn assert_still_answers(world: &World, session: &mut TcpSession, when: &str) {
    match session.request("after", PROBE) {
        Ok(answer) => assert_eq!(answer, echo_reply("web", "after"), "{when}"),
        Err(e) => panic!(
            "{when}: the idle connection was lost: {e} ({e:?})\ncounters: {:#}\n{}",
            world.counters(),
            world.dump()
        ),
    }
}

fn idle_connection_survives_tcp_churn(size: Size) {
    let (world, _web, table) = churn_world(size);
    let churn = 4 * table;
    let mut idle = idle_session(&world);
    tcp_churn(&world, churn);
    assert_still_answers(&world, &mut idle, "after TCP churn");
    let counters = world.counters();
    assert!(
        counter(&counters, "ct_closed") >= churn,
        "every short connection closed and left the open table: {counters:#}"
    );
    // Nothing live was pushed out: no packet went without its flow.
    assert_eq!(counter(&counters, "skip_not_syn"), 0, "{counters:#}");
    let evictions = world.status()["evictions"].clone();
    assert_eq!(evictions["live"], 0, "{evictions:#}");
    assert_eq!(counter(&counters, "ct_recovered"), 0, "{counters:#}");
    assert!(counter(&counters, "dnat_new") > churn, "{counters:#}");
}

#[test]
fn an_idle_connection_survives_tcp_churn_of_four_times_the_table() {
    idle_connection_survives_tcp_churn(Size::Small);
}

#[test]
fn an_idle_connection_survives_tcp_churn_of_four_times_the_default_table() {
    idle_connection_survives_tcp_churn(Size::Default);
}

/// Extra addresses of the external client, for UDP churn larger than one
/// address's ports: 198.18.0.40 and up.
fn client_addresses(world: &World, needed: usize) -> Vec<Ipv4Addr> {
    let mut addresses = vec![EXT_IP4];
    for i in 1..needed {
        let extra = Ipv4Addr::new(198, 18, 0, 39 + i as u8);
        world
            .node
            .ext
            .ip(&["addr", "add", &format!("{extra}/24"), "dev", "eth0"]);
        addresses.push(extra);
    }
    addresses
}

/// A datagram to the web's UDP port from `source`, answered within [`PROBE`].
fn udp_from(world: &World, source: SocketAddr) -> std::io::Result<String> {
    world.node.ext.run(|| {
        let socket = std::net::UdpSocket::bind(source)?;
        socket.connect(sock(NODE_IP4, 5353))?;
        socket.set_read_timeout(Some(PROBE))?;
        socket.send(b"churn")?;
        let mut buf = [0u8; 512];
        let n = socket.recv(&mut buf)?;
        Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
    })
}

/// Source ports the UDP churn uses on each client address.
const UDP_PORTS: std::ops::Range<u16> = 10_000..60_000;

fn idle_connection_survives_udp_churn(size: Size) {
    let (world, _web, table) = churn_world(size);
    let churn = 4 * table;
    let per_address = UDP_PORTS.len() as u64;
    let addresses = client_addresses(&world, churn.div_ceil(per_address) as usize);
    let mut idle = idle_session(&world);
    // Each datagram from a source address and port of its own: a new flow
    // each.
    for i in 0..churn {
        let address = addresses[(i / per_address) as usize];
        let port = UDP_PORTS.start + (i % per_address) as u16;
        let answer = udp_from(&world, SocketAddr::from((address, port)))
            .unwrap_or_else(|e| panic!("datagram {i} of {churn}: {e}\n{}", world.dump()));
        assert_eq!(answer, echo_reply("web", "churn"), "datagram {i}");
    }
    assert_still_answers(&world, &mut idle, "after UDP churn");
    let counters = world.counters();
    assert!(
        counter(&counters, "dnat_new") >= churn,
        "every datagram was a new flow through the table: {counters:#}"
    );
    assert_eq!(counter(&counters, "skip_not_syn"), 0, "{counters:#}");
    assert_eq!(counter(&counters, "ct_recovered"), 0, "{counters:#}");
}

#[test]
fn an_idle_connection_survives_udp_churn_of_four_times_the_table() {
    idle_connection_survives_udp_churn(Size::Small);
}

#[test]
fn an_idle_connection_survives_udp_churn_of_four_times_the_default_table() {
    idle_connection_survives_udp_churn(Size::Default);
}

/// A connection the node opens from the mapped port 8080 to a listener of
/// the external client on 9000: (the node's end, the client's end).
fn node_flow_from_mapped_port(world: &World) -> (TcpStream, TcpStream) {
    let listener = world
        .node
        .ext
        .run(|| std::net::TcpListener::bind((EXT_IP4, 9000)))
        .unwrap_or_else(|e| panic!("listen on the external client's 9000: {e}"));
    let node_end = world.node.ns.run(|| {
        let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
        socket.bind(&SocketAddr::from((NODE_IP4, 8080)).into())?;
        socket.connect_timeout(&SocketAddr::from((EXT_IP4, 9000)).into(), PROBE)?;
        Ok::<TcpStream, std::io::Error>(socket.into())
    });
    let node_end = node_end.unwrap_or_else(|e| panic!("the node connects from 8080: {e}"));
    let (ext_end, _) = listener.accept().expect("accept the node's connection");
    (node_end, ext_end)
}

/// Sends `line` on `from` and reads it on `to`.
fn pass_line(from: &mut TcpStream, to: &TcpStream, line: &str) -> String {
    to.set_read_timeout(Some(PROBE)).expect("timeout");
    from.write_all(format!("{line}\n").as_bytes())
        .unwrap_or_else(|e| panic!("sending {line:?}: {e}"));
    let mut got = String::new();
    BufReader::new(to)
        .read_line(&mut got)
        .unwrap_or_else(|e| panic!("receiving {line:?}: {e}"));
    got.trim_end_matches('\n').to_owned()
}

/// Room for `n` more open files: the held connections have both ends in
/// this process (a VM's init leaves the limit at 1024).
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

/// At [`TABLE`] only: holding as many connections as a default table has
/// entries would take more ephemeral ports than one client has.
/// More flows open at once than the table holds: the LRU must push out
/// live entries, the idle connection's and the node's among them. The
/// idle connection is recovered by its mapping (its tuple is no node
/// socket's); the node's connection from the mapped port, when the far
/// end speaks first, is left to the node (its socket owns its tuple),
/// never handed to the container.
#[test]
fn evicted_flows_are_recovered_and_the_nodes_own_flows_stay_the_nodes() {
    allow_open_files(4 * TABLE + 1024);
    let world = small_table_world();
    let web = serve_web(&world);
    let mut idle = idle_session(&world);
    let (mut node_end, mut ext_end) = node_flow_from_mapped_port(&world);
    assert_eq!(pass_line(&mut node_end, &ext_end, "hello"), "hello");
    assert_eq!(pass_line(&mut ext_end, &node_end, "welcome"), "welcome");
    // Two entries per flow: as many open flows as the table has entries
    // fill it twice over. Each new flow evicts entries of live ones, and
    // the kernel's LRU is approximate: the entry a flow made last may be
    // among them, its answer entry, before the container answers (the
    // answer then leaves untranslated: issue 53 item 3). Seen once: one
    // held request of 1 024 timed out, in the 6.12 guest under CI load. At
    // most 1 in 64 may fail; the held connections are here to fill the
    // table, what follows is the test.
    let mut held: Vec<TcpSession> = Vec::new();
    let mut failed = Vec::new();
    for i in 0..TABLE {
        let mut session = tcp_connect(&world.node.ext, sock(NODE_IP4, 8080), PROBE)
            .unwrap_or_else(|e| panic!("held connection {i}: {e}\n{}", world.dump()));
        match session.request("held", PROBE) {
            Ok(answer) => {
                assert_eq!(answer, echo_reply("web", "held"));
                held.push(session);
            }
            Err(e) => failed.push(format!("held connection {i}: {e}")),
        }
    }
    assert!(
        failed.len() as u64 <= TABLE / 64,
        "{} of {TABLE} held requests failed:\n{}\ncounters: {:#}",
        failed.len(),
        failed.join("\n"),
        world.counters()
    );
    if !failed.is_empty() {
        eprintln!(
            "held requests that failed (at most 1 in 64 may):\n{}",
            failed.join("\n")
        );
    }
    // The far end speaks first: its segment arrives with no entry left.
    assert_eq!(
        pass_line(&mut ext_end, &node_end, "pushed"),
        "pushed",
        "the node's own connection from the mapped port must stay the node's"
    );
    assert_still_answers(&world, &mut idle, "after its entries were pushed out");
    let counters = world.counters();
    assert!(
        counter(&counters, "ct_recovered") >= 1,
        "the idle connection came back by recovery: {counters:#}"
    );
    assert!(
        counter(&counters, "skip_node_socket") >= 1,
        "the node's connection was recognised by its socket: {counters:#}"
    );
    // The ledger counts what the table evicted of live flows, and status
    // makes it a problem (issue 53 item 4).
    let status = world.status();
    let live = status["evictions"]["live"].as_u64().unwrap_or(0);
    assert!(
        live >= TABLE,
        "{TABLE} held connections (two entries each) in a table of {TABLE}: at least {TABLE} live entries evicted, counted {live}: {:#}",
        status["evictions"]
    );
    assert!(
        has_problem(&status, "entries of live (assured) flows evicted"),
        "a node evicting live flows is a problem: {:#}",
        status["problems"]
    );
    // Without the agent, `gc --expired-flows` notes when the count last
    // grew (just now: still a problem, for the next hour).
    assert!(
        status["evictions"]["liveQuietSeconds"].is_null(),
        "nothing noted it yet: {:#}",
        status["evictions"]
    );
    let out = world.operator(&["gc", "--expired-flows"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status = world.status();
    assert!(
        status["evictions"]["liveQuietSeconds"]
            .as_u64()
            .is_some_and(|quiet| quiet < 60),
        "noted as grown just now: {:#}",
        status["evictions"]
    );
    assert!(
        has_problem(&status, "entries of live (assured) flows evicted"),
        "{:#}",
        status["problems"]
    );
    // New connections keep working with the table full of live flows.
    tcp_churn(&world, 16);
    drop(held);
    let peers: Vec<IpAddr> = web._tcp.peers().iter().map(SocketAddr::ip).collect();
    assert!(
        peers.iter().all(|ip| *ip == IpAddr::V4(EXT_IP4)),
        "only the external client reached the container: {peers:?}"
    );
}

/// A TCP connection and a UDP exchange from `from`'s port 8080 (the mapped
/// host port) to `to`, each answered by the external client's echo servers
/// on 9000.
fn exchange_from_mapped_port(from: &portmap_tests::NetNs, bind: IpAddr, to: IpAddr) {
    let tcp = from.run(|| {
        let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
        socket.set_reuse_address(true)?;
        socket.bind(&SocketAddr::new(bind, 8080).into())?;
        socket.connect_timeout(&SocketAddr::new(to, 9000).into(), PROBE)?;
        Ok::<TcpStream, std::io::Error>(socket.into())
    });
    let mut tcp = tcp.unwrap_or_else(|e| panic!("connect from {bind}:8080 to {to}:9000: {e}"));
    tcp.set_read_timeout(Some(PROBE)).expect("timeout");
    tcp.write_all(b"from-8080\n").expect("send over TCP");
    let mut line = String::new();
    BufReader::new(&tcp)
        .read_line(&mut line)
        .unwrap_or_else(|e| panic!("TCP answer from {to}:9000: {e}"));
    assert_eq!(line.trim_end(), echo_reply("ext", "from-8080"));
    let udp = from
        .run(|| {
            let socket = std::net::UdpSocket::bind(SocketAddr::new(bind, 8080))?;
            socket.connect(SocketAddr::new(to, 9000))?;
            socket.set_read_timeout(Some(PROBE))?;
            socket.send(b"from-8080")?;
            let mut buf = [0u8; 512];
            let n = socket.recv(&mut buf)?;
            Ok::<String, std::io::Error>(String::from_utf8_lossy(&buf[..n]).into_owned())
        })
        .unwrap_or_else(|e| panic!("UDP from {bind}:8080 to {to}:9000: {e}"));
    assert_eq!(udp, echo_reply("ext", "from-8080"));
}

/// The node's own flows from a mapped port are recorded (their answers are
/// the node's); a flow the node only routes, from a client whose source
/// port happens to be a mapped host port, is not the node's and leaves
/// conntrack alone (it would otherwise take a table entry per flow).
#[test]
fn only_the_nodes_own_flows_from_a_mapped_port_are_recorded() {
    let world = World::bridge();
    let web = world.node.add_container("web");
    let _web = tcp_echo_server(&web.ns, 80, "web");
    let mappings = [PortMapping::tcp(8080, 80), PortMapping::udp(8080, 80)];
    world.add(&web, &mappings);
    let _ext_tcp = tcp_echo_server(&world.node.ext, 9000, "ext");
    let _ext_udp = udp_echo_server(&world.node.ext, 9000, "ext");
    let ext = IpAddr::V4(EXT_IP4);

    // The far host behind the node talks to the client: the node routes it
    // out of the uplink, where egress sees a mapped source port.
    let before = counter(&world.counters(), "pass_recorded");
    exchange_from_mapped_port(
        &world.node.far,
        IpAddr::V4(portmap_tests::topology::FAR_IP4),
        ext,
    );
    let counters_after = world.counters();
    assert_eq!(
        counter(&counters_after, "pass_recorded"),
        before,
        "routed flows from the far host's port 8080 were recorded as the node's: {counters_after:#}"
    );

    exchange_from_mapped_port(&world.node.ns, IpAddr::V4(NODE_IP4), ext);
    let counters_after = world.counters();
    assert_eq!(
        counter(&counters_after, "pass_recorded"),
        before + 2,
        "the node's own TCP and UDP flows from 8080 are recorded: {counters_after:#}"
    );
    world.del(&web, &mappings);
}

/// Whether `status --json` lists a problem containing `needle`.
fn has_problem(status: &Value, needle: &str) -> bool {
    status["problems"].as_array().is_some_and(|problems| {
        problems
            .iter()
            .any(|p| p.as_str().is_some_and(|p| p.contains(needle)))
    })
}

/// `n` connections from the external client, each after one exchange,
/// held open (idle) by the caller.
fn hold_connections(world: &World, n: u64) -> Vec<TcpSession> {
    (0..n)
        .map(|i| {
            let mut session = tcp_connect(&world.node.ext, sock(NODE_IP4, 8080), PROBE)
                .unwrap_or_else(|e| panic!("held connection {i}: {e}\n{}", world.dump()));
            assert_eq!(
                session.request("held", PROBE).expect("held request"),
                echo_reply("web", "held")
            );
            session
        })
        .collect()
}

/// Makes every entry of the pinned `conntrack` table look idle since the
/// clock's start, as a flow whose client vanished without a FIN looks
/// after its timeout: its `last_seen_ns` (the entry's last 8 bytes) set to
/// 0 in place, in one `bpftool batch`. Returns how many were aged.
fn age_open_flows(world: &World) -> usize {
    let path = world.map_path("conntrack");
    let entries = world.dump_map("conntrack");
    let mut batch = String::new();
    let entries = entries.as_array().expect("entries");
    for entry in entries {
        let value = bpftool_hex(&entry["value"]);
        let mut value: Vec<&str> = value.split(' ').collect();
        let len = value.len();
        // The last 8 bytes, `last_seen_ns`, to 0.
        for byte in &mut value[len - 8..] {
            *byte = "00";
        }
        batch.push_str(&format!(
            "map update pinned {} key hex {} value hex {}\n",
            path.display(),
            bpftool_hex(&entry["key"]),
            value.join(" ")
        ));
    }
    world.bpftool_batch(&batch);
    entries.len()
}

/// Flows that idled out stay in an LRU table until it evicts them: the
/// sweep (`gc --expired-flows`, the agent's GC) removes them and books
/// them, so that the assured flows that take their room later evict
/// nothing live, and the ledger says so. Without the sweep, the same new
/// flows evict the idled-out entries and `status` counts them as live
/// flows lost (issue 53 item 4).
#[test]
fn flows_that_idled_out_are_swept_and_never_counted_as_live_flows_evicted() {
    allow_open_files(4 * TABLE + 1024);
    let world = small_table_world();
    let _web = serve_web(&world);
    // Two entries per connection: 600 of the 1 024 entries.
    let first = hold_connections(&world, 300);
    let aged = age_open_flows(&world);
    assert!(aged >= 600, "the held connections' entries: {aged}");
    let out = world.operator(&["gc", "--expired-flows", "--json"]);
    assert!(
        out.status.success(),
        "gc --expired-flows: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let gc: Value = serde_json::from_slice(&out.stdout).expect("gc --json");
    assert_eq!(
        gc["expiredFlows"]["live"].as_u64(),
        Some(aged as u64),
        "every idled-out entry swept: {gc:#}"
    );
    assert!(
        world
            .dump_map("conntrack")
            .as_array()
            .is_some_and(Vec::is_empty),
        "nothing idled out is left"
    );
    // As many new assured flows again: with the idled-out entries still
    // there, the table would have to evict 176 or more of them.
    let second = hold_connections(&world, 300);
    let status = world.status();
    assert_eq!(
        status["evictions"]["live"], 0,
        "no live flow lost its entries: {:#}",
        status["evictions"]
    );
    assert!(!has_problem(&status, "evicted"), "{:#}", status["problems"]);
    drop((first, second));
}

/// A TCP flow netfilter translates (kube-proxy's nat chains: the kernel's
/// DNAT entry, issue 50), handed to the fast path after a few exchanges,
/// whose entries are then evicted by more live connections than the table
/// holds, comes back at its next segment and is handed over again. Its
/// data went past netfilter, whose entry then lagged the flow's sequence
/// numbers: the recovered segment, sent through netfilter with that
/// entry, was INVALID to it, left untranslated, and the node itself
/// answered with a RST. The recovery makes the kernel's entry anew.
#[test]
fn a_flow_netfilter_translates_comes_back_after_its_entries_were_evicted() {
    allow_open_files(2 * TABLE + 1024);
    let world = small_table_world();
    world.node.hook_nat();
    world.node.drop_invalid_at_forward();
    let _web = serve_web(&world);
    let mut idle = idle_session(&world);
    for round in 0..4 {
        let payload = format!("fast {round}");
        assert_eq!(
            idle.request(&payload, PROBE).expect("answered"),
            echo_reply("web", &payload)
        );
    }
    let before = world.counters();
    assert!(
        counter(&before, "fast_forward") >= 3 && counter(&before, "knat_new") == 1,
        "the flow is netfilter's, on the fast path: {before:#}"
    );
    // Held, so that they stay live: each evicts entries of the others, and
    // the idle flow's among them.
    let mut held: Vec<TcpSession> = Vec::new();
    for i in 0..TABLE {
        let mut session = tcp_connect(&world.node.ext, sock(NODE_IP4, 8080), PROBE)
            .unwrap_or_else(|e| panic!("held connection {i}: {e}\n{}", world.dump()));
        if session.request("held", PROBE).is_ok() {
            held.push(session);
        }
    }
    // The recovered flow is handed over again at once (its entries ask
    // the kernel afresh): a few rounds, each over the fast path.
    let fast_before = counter(&world.counters(), "fast_forward");
    for round in 0..4 {
        assert_still_answers(&world, &mut idle, &format!("round {round} after eviction"));
    }
    let after = world.counters();
    assert_eq!(
        counter(&after, "knat_new") - counter(&before, "knat_new"),
        held.len() as u64 + 1,
        "the held connections and the recovered one made their kernel entries: {after:#}"
    );
    assert!(
        counter(&after, "fast_forward") - fast_before >= 3,
        "the recovered flow is handed over again: {after:#}"
    );
}
