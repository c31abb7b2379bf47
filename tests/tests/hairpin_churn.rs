//! Hairpin under connection churn (issue 37): pods that dial a hostPort
//! through the node's address, with the socket hooks not covering them (the
//! test's cgroup holds no pod process), take the packet path: tc on the
//! container side, masqueraded with `snat`. Connect + request + close in a
//! loop, the server closing first so that it holds every closed tuple in
//! TIME_WAIT (as netperf's TCP_CRR server does), from the pod that serves
//! the port and from a second pod at once, IPv4 and IPv6: every connection
//! must complete, and with one client per pod, at most 1 in 50 000 (at
//! least 3) needs its SYN sent again (refused by a container's TIME_WAIT,
//! or lost). A SYN refused there costs its client one round trip: its RST
//! ends the TIME_WAIT and its second SYN, on the same masquerade tuple,
//! gets through. And a second pod dialling
//! from the first one's ports just past 60 s later, while the container
//! may still hold their tuples in TIME_WAIT: it gets other ports, and no
//! SYN of it is refused. The node has kube-proxy's rule dropping what
//! conntrack finds INVALID at FORWARD, as a Kubernetes node does. Counts,
//! not timings, are asserted. Needs root.

use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use portmap_tests::netns::NsHandle;
use portmap_tests::topology::{NODE_IP4, NODE_IP6};
use portmap_tests::world::{World, sock};
use portmap_tests::{Container, NetNs, PortMapping};
use serde_json::Value;
use socket2::{Domain, Protocol, Socket, Type};

const HOST_PORT: u16 = 8080;
const SERVER_PORT: u16 = 80;

/// How long each family is churned (issue 37 asks for 60 s in all: two
/// families of 15 s each, in each of the two tests). Before the fix
/// every client lost a connection within its first two seconds, about one
/// a second after that. `EPM_HAIRPIN_CHURN_SECS` overrides it (a longer
/// soak, or a quick look).
fn churn_time() -> Duration {
    let secs = std::env::var("EPM_HAIRPIN_CHURN_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(15);
    Duration::from_secs(secs)
}

/// What a client waits for an answer, and the server for a request: a lost
/// data segment is sent again after TCP's 200 ms minimum timeout.
const IO_TIMEOUT: Duration = Duration::from_millis(900);

/// What a client waits for its connection: long enough for the kernel to
/// send a SYN again twice (after 1 s and 3 s), so that a SYN refused or
/// lost once shows as a retransmission, counted per connection (see
/// `Connection`), and not as a lost connection. A slow machine (the CI's
/// guests and builds beside the tests) then fails nothing by its speed:
/// what is asserted is counted, not timed.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(3500);

/// A TCP server that answers each request line with `ok` and closes first,
/// so the closed tuples stay in TIME_WAIT on its side; `workers` threads
/// accept and serve connections on each family's listener.
struct CloseFirstServer {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl CloseFirstServer {
    fn start(ns: &NetNs, port: u16, workers: usize) -> CloseFirstServer {
        let listeners = ns
            .run(|| -> io::Result<Vec<TcpListener>> {
                Ok(vec![
                    listener(SocketAddr::from(([0, 0, 0, 0], port)))?,
                    listener(SocketAddr::from((Ipv6Addr::UNSPECIFIED, port)))?,
                ])
            })
            .unwrap_or_else(|e| panic!("binding the server in {}: {e}", ns.name()));
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        for listener in listeners {
            let listener = Arc::new(listener);
            for _ in 0..workers {
                let listener = Arc::clone(&listener);
                let stop = Arc::clone(&stop);
                threads.push(std::thread::spawn(move || serve(&listener, &stop)));
            }
        }
        CloseFirstServer { stop, threads }
    }
}

impl Drop for CloseFirstServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

fn listener(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    socket.set_nonblocking(true)?;
    Ok(socket.into())
}

fn serve(listener: &TcpListener, stop: &AtomicBool) {
    let mut pollfd = libc::pollfd {
        fd: listener.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    while !stop.load(Ordering::Relaxed) {
        // SAFETY: one valid pollfd, 100 ms at most.
        if unsafe { libc::poll(&raw mut pollfd, 1, 100) } <= 0 {
            continue;
        }
        // Several workers wake for one connection: the losers see WouldBlock.
        let Ok((stream, peer)) = listener.accept() else {
            continue;
        };
        let _ = answer_and_close(stream, peer);
    }
}

/// Answers `ok` and the peer it saw (the masqueraded source), then closes.
fn answer_and_close(mut stream: TcpStream, peer: SocketAddr) -> io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    let mut request = Vec::new();
    let mut buf = [0u8; 64];
    while !request.ends_with(b"\n") {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        request.extend_from_slice(&buf[..n]);
    }
    stream.write_all(format!("ok {peer}\n").as_bytes())
    // Dropped here: the server's close comes first.
}

/// The serving pod `web`, its hostPort mapped and `workers` server threads
/// per family, and a second pod `other`, added to `world`'s node.
fn add_pods(world: &World, workers: usize) -> (Container, Container, CloseFirstServer) {
    let web = world.node.add_container("web");
    let other = world.node.add_container("other");
    let server = CloseFirstServer::start(&web.ns, SERVER_PORT, workers);
    world.add(&web, &[PortMapping::tcp(HOST_PORT, SERVER_PORT)]);
    world.add(&other, &[]);
    (web, other, server)
}

/// DEL of what [`add_pods`] added.
fn del_pods(world: &World, web: &Container, other: &Container) {
    world.del(web, &[PortMapping::tcp(HOST_PORT, SERVER_PORT)]);
    world.del(other, &[]);
}

/// What one client loop saw.
#[derive(Debug, Default)]
struct Tally {
    attempted: u64,
    completed: u64,
    /// Completed connections whose SYN was sent more than once.
    retried: u64,
    /// The first few failures: when (from the start), the local port, why.
    failures: Vec<String>,
    /// The first few retried connections: when, the local port, how often
    /// the SYN was sent again, how long the connection took.
    retries: Vec<String>,
}

impl Tally {
    fn add(&mut self, other: &Tally) {
        self.attempted += other.attempted;
        self.completed += other.completed;
        self.retried += other.retried;
        self.failures.extend(other.failures.iter().cloned());
        self.retries.extend(other.retries.iter().cloned());
    }
}

/// A completed connection.
#[derive(Debug)]
struct Connection {
    /// The source the server saw (the masquerade tuple).
    seen: SocketAddr,
    /// How many times the kernel sent the SYN again: a SYN a container's
    /// TIME_WAIT refused (the client's RST, then its SYN two jiffies
    /// later), or one lost with its SYN-ACK.
    syn_retransmits: u32,
}

/// Segments `socket` sent again (`tcpi_total_retrans`); before any data,
/// its SYNs.
fn retransmits(socket: &Socket) -> u32 {
    // SAFETY: tcp_info is plain data; getsockopt writes at most `len`
    // bytes of it into this one.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: a live socket, a buffer of `len` bytes.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&raw mut info).cast(),
            &raw mut len,
        )
    };
    assert_eq!(rc, 0, "TCP_INFO: {}", io::Error::last_os_error());
    info.tcpi_total_retrans
}

/// One connection from `port` (0: one the kernel picks): connect, send a
/// line, read the answer up to the server's close, close. On failure, the
/// local port it used (bound before the connect, so known also when the
/// connect times out), to find the flow in a trace.
fn one_connection(target: SocketAddr, port: u16) -> Result<Connection, (u16, String)> {
    let socket = Socket::new(
        Domain::for_address(target),
        Type::STREAM,
        Some(Protocol::TCP),
    )
    .map_err(|e| (0, format!("socket: {e}")))?;
    let any = if target.is_ipv4() {
        SocketAddr::from(([0, 0, 0, 0], port))
    } else {
        SocketAddr::from((Ipv6Addr::UNSPECIFIED, port))
    };
    socket
        .bind(&any.into())
        .map_err(|e| (port, format!("bind: {e}")))?;
    let port = socket
        .local_addr()
        .ok()
        .and_then(|a| a.as_socket())
        .map_or(0, |a| a.port());
    let fail = |what: &str, e: io::Error| (port, format!("{what}: {e}"));
    if let Err(e) = socket.connect_timeout(&target.into(), CONNECT_TIMEOUT) {
        let resent = retransmits(&socket);
        return Err(fail(&format!("connect (SYN sent again {resent} times)"), e));
    }
    let syn_retransmits = retransmits(&socket);
    let mut stream = TcpStream::from(socket);
    stream
        .set_read_timeout(Some(IO_TIMEOUT))
        .map_err(|e| fail("timeout", e))?;
    stream.write_all(b"q\n").map_err(|e| fail("send", e))?;
    let mut answer = Vec::new();
    stream
        .read_to_end(&mut answer)
        .map_err(|e| fail("recv", e))?;
    let seen = String::from_utf8_lossy(&answer)
        .strip_prefix("ok ")
        .and_then(|peer| peer.trim_end().parse().ok())
        .ok_or_else(|| (port, format!("answer {answer:?}")))?;
    Ok(Connection {
        seen,
        syn_retransmits,
    })
}

/// Connect + request + close against `target` from inside `client` until
/// `deadline`.
fn churn(client: &NsHandle, target: SocketAddr, started: Instant, deadline: Instant) -> Tally {
    client.run(|| {
        let mut tally = Tally::default();
        while Instant::now() < deadline {
            tally.attempted += 1;
            let began = Instant::now();
            match one_connection(target, 0) {
                Ok(connection) => {
                    tally.completed += 1;
                    if connection.syn_retransmits > 0 {
                        tally.retried += 1;
                        if tally.retries.len() < 5 {
                            tally.retries.push(format!(
                                "at {:.3}s, seen as {}: SYN sent again {} times, {} ms",
                                began.duration_since(started).as_secs_f64(),
                                connection.seen,
                                connection.syn_retransmits,
                                began.elapsed().as_millis()
                            ));
                        }
                    }
                }
                Err((port, why)) => {
                    let failure = format!(
                        "at {:.3}s, local port {port}: {why}",
                        started.elapsed().as_secs_f64()
                    );
                    // At once, for whoever watches the maps and sockets.
                    eprintln!("lost connection to {target}: {failure}");
                    if tally.failures.len() < 5 {
                        tally.failures.push(failure);
                    }
                }
            }
        }
        tally
    })
}

/// The dataplane's counters by reason (`status --json`), for the failure
/// message.
fn counters(world: &World) -> Value {
    let out = world.operator(&["status", "--json"]);
    serde_json::from_slice::<Value>(&out.stdout)
        .map_or(Value::Null, |status| status["counters"].clone())
}

/// `parallel` clients in each of the two pods (the server's own and
/// another), at once, per family, against nodeIP:hostPort.
fn every_hairpin_connection_completes(parallel: usize) {
    let world = World::bridge();
    // A Kubernetes node's: kube-proxy drops what conntrack finds INVALID
    // (with br_netfilter, every hairpin connection failed here before the
    // pods' bridge ports carried the ingress program; see bridge_ports.rs).
    world.node.drop_invalid_at_forward();
    let (web, other, _server) = add_pods(&world, 2 * parallel);
    let clients = [
        ("itself", web.ns.handle()),
        ("another pod", other.ns.handle()),
    ];
    let mut report = Vec::new();
    let mut lost = false;
    // Connections each pod attempted, and those of them whose SYN was sent
    // again, both families.
    let mut attempted = [0u64; 2];
    let mut retried = [0u64; 2];
    for node_ip in [IpAddr::V4(NODE_IP4), IpAddr::V6(NODE_IP6)] {
        let target = sock(node_ip, HOST_PORT);
        let started = Instant::now();
        let deadline = started + churn_time();
        let tallies: Vec<(&str, Tally)> = std::thread::scope(|scope| {
            let running: Vec<_> = clients
                .iter()
                .flat_map(|(label, ns)| {
                    (0..parallel).map(move |_| {
                        (
                            *label,
                            scope.spawn(move || churn(ns, target, started, deadline)),
                        )
                    })
                })
                .collect();
            running
                .into_iter()
                .map(|(label, thread)| (label, thread.join().expect("client thread")))
                .collect()
        });
        for (pod, (label, _)) in clients.iter().enumerate() {
            let mut total = Tally::default();
            for (_, tally) in tallies.iter().filter(|(l, _)| l == label) {
                total.add(tally);
            }
            attempted[pod] += total.attempted;
            retried[pod] += total.retried;
            lost |= total.completed != total.attempted;
            let mut line = format!(
                "{label} -> {target}: {} of {} connections completed, {} with a SYN sent again",
                total.completed, total.attempted, total.retried
            );
            for (what, list) in [("failures", &total.failures), ("retried", &total.retries)] {
                if !list.is_empty() {
                    line.push_str(&format!("; first {what}:\n    {}", list.join("\n    ")));
                }
            }
            report.push(line);
        }
    }
    let report = report.join("\n");
    println!("{report}");
    assert!(
        !lost,
        "every hairpin connection must complete under churn:\n{report}\ncounters: {:#}",
        counters(&world)
    );
    // One client tuple per pod at a time: each gets a masquerade tuple no
    // other client tuple had within the container's TIME_WAIT (see
    // `MasqOwner` in portmap-common), so a SYN refused there is rare: when
    // all of a tuple's choosy tries are another's, its last try takes one
    // anyway (`MASQ_PORT_TRIES`), and the client's second SYN gets through
    // (see `a_refused_syn_costs_its_client_one_round_trip`). Seen: 1 in a
    // pod's 282 000 connections of one run, 1 in 1.5 million with the
    // build before the hairpin fast path; one connection lost in a CI run's
    // 123 000 (its connect waited 0.9 s then, one SYN sent again in the
    // pod). Before `MasqOwner`, about 1 in 200 (32 in one 1 s bench
    // section); before the pods' bridge ports carried the ingress program,
    // a lost connection every second. The bound is 1 per 50 000 of each
    // pod's connections, at least 3.
    if parallel == 1 {
        let bound = |attempted: u64| (attempted / 50_000).max(3);
        assert!(
            retried
                .iter()
                .zip(attempted)
                .all(|(&n, attempted)| n <= bound(attempted)),
            "hairpin clients' SYNs were sent again ({retried:?} connections, at most {:?}):\n{report}\ncounters: {:#}",
            attempted.map(bound),
            counters(&world)
        );
    }
    del_pods(&world, &web, &other);
}

#[test]
fn hairpin_churn_every_connection_completes() {
    every_hairpin_connection_completes(1);
}

#[test]
fn hairpin_churn_with_parallel_clients_every_connection_completes() {
    every_hairpin_connection_completes(4);
}

/// Ports each family's two clients dial from in
/// `a_tuple_stays_its_clients_until_the_containers_time_wait_is_surely_over`.
const SHARED_PORTS: u16 = 24;

/// How long after the serving pod's flows the other pod dials from the
/// same ports: past a TIME_WAIT's 60 s, within its longest (the timer
/// wheel fires a 60 s timer up to 2 s late at HZ=250, 5 s at HZ=100).
const SECOND_CLIENT_AFTER: Duration = Duration::from_secs(61);

/// The serving pod dials its own hostPort from fixed ports (each
/// masqueraded to the bridge address and that port, the server closing
/// first: the container holds each tuple in TIME_WAIT); 61 s later the
/// other pod dials from the same ports. The container may still hold
/// those tuples (60 s and the timer wheel's slack), and a SYN of another
/// client tuple there is refused half the time (its TCP timestamps are
/// its own): the other pod must get other ports, and no SYN of it be
/// refused. v4 and v6 share the wait. Takes a minute.
#[test]
fn a_tuple_stays_its_clients_until_the_containers_time_wait_is_surely_over() {
    let world = World::bridge();
    let (web, other, _server) = add_pods(&world, 1);
    let targets = [
        (sock(IpAddr::V4(NODE_IP4), HOST_PORT), 46000),
        (sock(IpAddr::V6(NODE_IP6), HOST_PORT), 47000),
    ];
    let dial_all = |client: &NsHandle, who: &str| -> Vec<(u16, Connection)> {
        client.run(|| {
            targets
                .iter()
                .flat_map(|&(target, base)| {
                    (base..base + SHARED_PORTS).map(move |port| {
                        let connection = one_connection(target, port)
                            .unwrap_or_else(|(_, why)| panic!("{who} :{port} -> {target}: {why}"));
                        (port, connection)
                    })
                })
                .collect()
        })
    };
    let started = std::time::Instant::now();
    let first = dial_all(&web.ns.handle(), "the serving pod");
    for (port, connection) in &first {
        assert_eq!(
            connection.seen.port(),
            *port,
            "the serving pod's flow keeps its own port (the tuple is free): {first:?}"
        );
    }
    std::thread::sleep(SECOND_CLIENT_AFTER.saturating_sub(started.elapsed()));
    let second = dial_all(&other.ns.handle(), "the other pod");
    let refused: u32 = second.iter().map(|(_, c)| c.syn_retransmits).sum();
    let kept: Vec<&(u16, Connection)> = second
        .iter()
        .filter(|(port, connection)| connection.seen.port() == *port)
        .collect();
    assert!(
        kept.is_empty(),
        "{} s after the serving pod's flows, the container may hold their tuples in TIME_WAIT: \
         the other pod's flows must get other ports, {} of {} kept theirs ({refused} SYNs \
         refused): {kept:?}\ncounters: {:#}",
        SECOND_CLIENT_AFTER.as_secs(),
        kept.len(),
        second.len(),
        counters(&world)
    );
    assert_eq!(
        refused,
        0,
        "the container's TIME_WAIT refused SYNs of the other pod (each one retransmitted)\ncounters: {:#}",
        counters(&world)
    );
    del_pods(&world, &web, &other);
}

/// The source ports a pod at `addr` dials from in
/// `a_refused_syn_costs_its_client_one_round_trip`, each with the
/// masquerade ports its flow from there tries, in order: its own, then its
/// probe sequence (`masq_probe_port`).
fn masquerade_tries(addr: IpAddr, ports: std::ops::Range<u16>) -> Vec<(u16, Vec<u16>)> {
    use portmap_common::local::{MASQ_PORT_TRIES, masq_client_tag, masq_probe_port};
    use portmap_common::{FAMILY_V4, FAMILY_V6};
    let (family, addr_be) = match addr {
        IpAddr::V4(a) => (FAMILY_V4, [u32::from_ne_bytes(a.octets()), 0, 0, 0]),
        IpAddr::V6(a) => {
            let o = a.octets();
            let word = |i: usize| u32::from_ne_bytes([o[i], o[i + 1], o[i + 2], o[i + 3]]);
            (FAMILY_V6, [word(0), word(4), word(8), word(12)])
        }
    };
    ports
        .map(|port| {
            let client = masq_client_tag(family, &addr_be, port.to_be());
            let mut tries = vec![port];
            tries.extend((1..MASQ_PORT_TRIES).map(|attempt| masq_probe_port(client, attempt)));
            (port, tries)
        })
        .collect()
}

/// A pod's source address towards `target` (the node's address).
fn source_towards(ns: &NetNs, target: SocketAddr) -> IpAddr {
    ns.run(|| {
        let any = if target.is_ipv4() {
            SocketAddr::from(([0, 0, 0, 0], 0))
        } else {
            SocketAddr::from((Ipv6Addr::UNSPECIFIED, 0))
        };
        let socket = std::net::UdpSocket::bind(any)?;
        socket.connect(target)?;
        Ok::<IpAddr, io::Error>(socket.local_addr()?.ip())
    })
    .unwrap_or_else(|e| panic!("the source address of {} towards {target}: {e}", ns.name()))
}

/// A tuple every one of whose masquerade tries another client just closed
/// (the container holds them all in TIME_WAIT, with that client's TCP
/// clocks): the last try takes one anyway, and the container refuses about
/// half of such SYNs. The client answers the container's ACK with a RST,
/// which ends the TIME_WAIT, and sends its SYN again two jiffies later on
/// the same tuple (see `earlier_port` in masq.rs), where it gets through:
/// each refused connection completes with its SYN sent once more (a SYN
/// refused again is sent next after the retransmission timeout, 1 s, and
/// counted). On a Kubernetes node (conntrack
/// INVALID dropped at FORWARD), both families, the other pod as the
/// client. Measured: 27 to 32 of 60 refused per family, each such
/// connection done in 9-16 ms.
#[test]
fn a_refused_syn_costs_its_client_one_round_trip() {
    let world = World::bridge();
    world.node.drop_invalid_at_forward();
    let (web, other, _server) = add_pods(&world, 2);
    for (node_ip, base) in [(IpAddr::V4(NODE_IP4), 40000), (IpAddr::V6(NODE_IP6), 41000)] {
        let target = sock(node_ip, HOST_PORT);
        let client = source_towards(&other.ns, target);
        let mut refused = 0;
        let mut slow = Vec::new();
        for (port, tries) in masquerade_tries(client, base..base + 60) {
            // The serving pod closes a flow on each of the tuples first:
            // each keeps its own port (unless an earlier client of it is
            // still its owner), the container's TIME_WAIT its clock.
            web.ns.handle().run(|| {
                for &try_port in &tries {
                    one_connection(target, try_port)
                        .unwrap_or_else(|(_, why)| panic!("the serving pod :{try_port}: {why}"));
                }
            });
            let began = Instant::now();
            let connection = other
                .ns
                .handle()
                .run(|| one_connection(target, port))
                .unwrap_or_else(|(_, why)| {
                    panic!(
                        "the other pod :{port} -> {target}: {why}\ncounters: {:#}",
                        counters(&world)
                    )
                });
            let took = began.elapsed();
            refused += u32::from(connection.syn_retransmits > 0);
            // A SYN refused again would be sent next after the
            // retransmission timeout, counted here: the times are for the
            // report only.
            if connection.syn_retransmits > 1 {
                slow.push((port, connection.syn_retransmits, took));
            }
        }
        assert!(
            refused > 0,
            "no SYN of the other pod met a TIME_WAIT to {target}: the test sets nothing up"
        );
        assert!(
            slow.is_empty(),
            "{refused} SYNs to {target} refused; these connections sent theirs more than once \
             (port, SYNs sent again, time): {slow:?}\ncounters: {:#}",
            counters(&world)
        );
    }
    del_pods(&world, &web, &other);
}
