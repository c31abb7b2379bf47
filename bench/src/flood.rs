//! The flood rows (issue 53): what a flood of new flows costs live flows,
//! ebpf-portmap (default and `fastPath`) against iptables and nftables
//! portmap.
//!
//! Each run builds a world of its own (kube-proxy's `ct state invalid
//! drop` at FORWARD, as every bench world has), publishes a TCP and a UDP
//! port of the container, and holds [`LIVE`] idle TCP connections and as
//! many idle, assured UDP sessions (answered, and talking again 2.1 s
//! after their first datagram) from the client's namespace. A neighbour
//! then floods the same two ports from every CPU with spoofed SYNs and
//! datagrams, new flows all the way, three times ebpf-portmap's table of
//! unassured flows (`conntrack_new`) and for at least [`FLOOD_AT_LEAST`];
//! the container answers the flood's datagrams. Meanwhile the client runs
//! TCP connect+request+close to a third published port: the new-flow rate
//! during the flood, against the same loop for the same time before it.
//! After the flood, each idle flow's container speaks first, then its
//! client: a flow is alive if both messages arrive within a second. Every
//! side gets the same flood (the number of flows is ebpf-portmap's table,
//! which iptables and nftables portmap do not have: the kernel's conntrack
//! table of this machine is theirs).

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use portmap_tests::crafted;
use portmap_tests::topology::{Family, PortMapping};

use super::load::{self, Test};
use super::plan::Plan;
use super::progress::{Progress, short_measurement};
use super::results::{Evicted, FloodRow, Results};
use super::world::{BenchWorld, Flavor, PROBE_RR_HOST_PORT};
use crate::load::SERVICE_RR_PORT;

/// Idle flows of each protocol held through the flood.
pub const LIVE: usize = 32;
/// The flood goes on at least this long (the new-flow rate is measured
/// over it).
pub const FLOOD_AT_LEAST: Duration = Duration::from_secs(2);
/// How long a message of an idle flow may take after the flood.
const ARRIVES: Duration = Duration::from_secs(1);
/// nf_conntrack's UDP stream rule (and ours): answered, and still talking
/// this long after the first datagram.
const UDP_STREAM: Duration = Duration::from_millis(2100);
const TCP_HOST_PORT: u16 = 7011;
const UDP_HOST_PORT: u16 = 7012;
const TCP_PORT: u16 = 5011;
const UDP_PORT: u16 = 5012;

/// The sides, in the order each repetition runs them; nftables portmap
/// where it can run.
fn sides() -> Vec<Flavor> {
    let mut sides = vec![Flavor::Ours, Flavor::OursFast, Flavor::Upstream];
    if crate::nftables::skip_reason().is_none() {
        sides.push(Flavor::Nftables);
    }
    sides
}

/// Runs every side, family and repetition (see the module docs).
pub fn measure(plan: &Plan, progress: &Progress, results: &mut Results) -> anyhow::Result<()> {
    if let Some(reason) = crate::nftables::skip_reason() {
        progress.say(&format!("flood: {reason}"));
    }
    let table = ours_table(plan)?;
    let flows = 3 * table;
    progress.say(&format!(
        "flood: {flows} spoofed SYNs and {flows} datagrams (3 x ebpf-portmap's conntrack_new of {table}) for at least {FLOOD_AT_LEAST:?}, {LIVE} idle TCP and {LIVE} idle UDP flows"
    ));
    for rep in 0..plan.reps {
        let mut line = Vec::new();
        for family in Family::BOTH {
            for flavor in sides() {
                progress.check()?;
                let row = run_one(plan, flavor, family, table, flows)?;
                line.push(format!(
                    "{} {}: live {}/{} tcp {}/{} udp, crr {} -> {}",
                    flavor.label(),
                    family.key(),
                    row.tcp_alive(),
                    row.live,
                    row.udp_alive(),
                    row.live,
                    short_measurement(&row.crr_before),
                    short_measurement(&row.crr_during),
                ));
                results.flood.push(row);
            }
        }
        progress.say(&format!(
            "flood, rep {}/{}: {}",
            rep + 1,
            plan.reps,
            line.join("; ")
        ));
    }
    Ok(())
}

/// `conntrack_new`'s size in an ebpf-portmap world as the bench builds it
/// (the node's default sizing).
fn ours_table(plan: &Plan) -> anyhow::Result<u64> {
    let world = BenchWorld::new(Flavor::Ours, "bench-ebpf-flood-size", plan.cpu);
    world
        .port_add("flood", &mappings())
        .result
        .map_err(|e| anyhow::anyhow!("flood mappings ADD: {e}"))?;
    let status = world
        .status_json()
        .ok_or_else(|| anyhow::anyhow!("no status --json in the flood's ebpf-portmap world"))?;
    status["maps"]
        .as_array()
        .and_then(|maps| {
            maps.iter()
                .find(|m| m["name"] == portmap_common::map_names::CONNTRACK_NEW)
        })
        .and_then(|m| m["maxEntries"].as_u64())
        .ok_or_else(|| anyhow::anyhow!("no conntrack_new size in status: {status}"))
}

fn mappings() -> [PortMapping; 3] {
    [
        PortMapping::tcp(PROBE_RR_HOST_PORT, SERVICE_RR_PORT),
        PortMapping::tcp(TCP_HOST_PORT, TCP_PORT),
        PortMapping::udp(UDP_HOST_PORT, UDP_PORT),
    ]
}

/// The container's UDP socket, read by a thread that answers every
/// datagram (the flood's too, as a DNS server would) and hands the idle
/// sessions' own to the run.
struct UdpServer {
    socket: UdpSocket,
    heard: mpsc::Receiver<(Vec<u8>, SocketAddr)>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl UdpServer {
    fn start(socket: UdpSocket) -> std::io::Result<UdpServer> {
        let (tx, heard) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let reader = socket.try_clone()?;
        reader.set_read_timeout(Some(Duration::from_millis(50)))?;
        let stopped = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut buf = [0u8; 512];
            while !stopped.load(Ordering::Relaxed) {
                let Ok((n, from)) = reader.recv_from(&mut buf) else {
                    continue;
                };
                let _ = reader.send_to(&buf[..n], from);
                if !buf[..n].starts_with(crafted::UDP_PAYLOAD) {
                    let _ = tx.send((buf[..n].to_vec(), from));
                }
            }
        });
        Ok(UdpServer {
            socket,
            heard,
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for UdpServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The idle flows a run holds through the flood.
struct Live {
    tcp: Vec<(TcpStream, TcpStream)>,
    udp_clients: Vec<UdpSocket>,
    udp_peers: Vec<SocketAddr>,
}

fn run_one(
    plan: &Plan,
    flavor: Flavor,
    family: Family,
    table: u64,
    flows: u64,
) -> anyhow::Result<FloodRow> {
    let world_flavor = if flavor == Flavor::OursFast {
        Flavor::Ours
    } else {
        flavor
    };
    let name = format!("bench-{}-flood", flavor.label().replace(' ', "-"));
    let world = BenchWorld::new(world_flavor, &name, plan.cpu);
    let listener = world
        .container
        .ns
        .run(|| TcpListener::bind(SocketAddr::new(family.any(), TCP_PORT)))?;
    let udp = UdpServer::start(
        world
            .container
            .ns
            .run(|| UdpSocket::bind(SocketAddr::new(family.any(), UDP_PORT)))?,
    )?;
    world
        .port_add("flood", &mappings())
        .result
        .map_err(|e| anyhow::anyhow!("{}: flood mappings ADD: {e}", flavor.label()))?;
    // The node's flag, once the first mapping made the node.
    if flavor == Flavor::OursFast {
        world.set_fast_path(true);
    }
    // The flood's answers go back to the client's namespace, which drops
    // them (not its addresses).
    world.node.ns.ip(&[
        "route",
        "add",
        crafted::spoofed_net(family.is_v4()),
        "via",
        &family.client().to_string(),
    ]);
    let live = hold_live_flows(&world, family, &listener, &udp)?;
    let evicted_before = evictions(&world);
    let ext = world.node.ext.handle();
    let crr_target = SocketAddr::new(family.node(), PROBE_RR_HOST_PORT);
    let crr_before = load::run(&ext, Test::TcpCrr, crr_target, FLOOD_AT_LEAST, plan.cpu);
    // The flood from this thread (its senders pinned to every CPU), the
    // connection loop beside it for as long as it lasts.
    let (flooded, crr_during) = std::thread::scope(|scope| {
        let ext = &ext;
        let during =
            scope.spawn(move || load::run(ext, Test::TcpCrr, crr_target, FLOOD_AT_LEAST, plan.cpu));
        let flooded = crafted::flood(
            &world.node.ext,
            family.node(),
            (TCP_HOST_PORT, UDP_HOST_PORT),
            flows,
            FLOOD_AT_LEAST,
        );
        (flooded, during.join().expect("the connection loop"))
    });
    // The last packets through the stack before the idle flows speak.
    std::thread::sleep(Duration::from_millis(200));
    let (tcp_container_first, tcp_client_first) = tcp_alive(&live.tcp);
    let (udp_container_first, udp_client_first) = udp_alive(&live, &udp);
    let evicted = evicted_before
        .zip(evictions(&world))
        .map(|(before, after)| Evicted {
            live: after.live.saturating_sub(before.live),
            unreplied: after.unreplied.saturating_sub(before.unreplied),
        });
    drop(listener);
    Ok(FloodRow {
        flavor,
        family: family.key(),
        table,
        flows: flooded.flows,
        flood_s: flooded.took.as_secs_f64(),
        crr_before,
        crr_during,
        tcp_container_first,
        tcp_client_first,
        udp_container_first,
        udp_client_first,
        live: LIVE as u32,
        evicted,
    })
}

/// What ebpf-portmap's conntrack tables evicted so far, as `status --json`
/// counts it; `None` in an upstream world (no pin root).
fn evictions(world: &BenchWorld) -> Option<Evicted> {
    let status = world.status_json()?;
    let evictions = &status["evictions"];
    Some(Evicted {
        live: evictions["live"].as_u64()?,
        unreplied: evictions["unreplied"].as_u64()?,
    })
}

/// [`LIVE`] TCP connections (one exchange each way) and as many assured
/// UDP sessions, from the client's namespace to the published ports.
fn hold_live_flows(
    world: &BenchWorld,
    family: Family,
    listener: &TcpListener,
    udp: &UdpServer,
) -> anyhow::Result<Live> {
    let node = family.node();
    let mut tcp = Vec::with_capacity(LIVE);
    for _ in 0..LIVE {
        let mut client = world
            .node
            .ext
            .run(|| TcpStream::connect_timeout(&SocketAddr::new(node, TCP_HOST_PORT), ARRIVES))?;
        let (mut server, _) = listener.accept()?;
        client.write_all(b"hello")?;
        server.set_read_timeout(Some(ARRIVES))?;
        client.set_read_timeout(Some(ARRIVES))?;
        let mut buf = [0u8; 5];
        server.read_exact(&mut buf)?;
        server.write_all(b"hello")?;
        client.read_exact(&mut buf)?;
        tcp.push((client, server));
    }
    let udp_clients: Vec<UdpSocket> = (0..LIVE)
        .map(|_| {
            world.node.ext.run(|| {
                let socket = UdpSocket::bind(SocketAddr::new(family.client(), 0))?;
                socket.connect(SocketAddr::new(node, UDP_HOST_PORT))?;
                socket.set_read_timeout(Some(ARRIVES))?;
                Ok::<_, std::io::Error>(socket)
            })
        })
        .collect::<Result<_, _>>()?;
    let mut udp_peers = Vec::with_capacity(LIVE);
    for round in ["hello-1", "hello-2"] {
        for client in &udp_clients {
            client.send(round.as_bytes())?;
            let mut buf = [0u8; 64];
            client.recv(&mut buf)?;
            let (_, from) = udp.heard.recv_timeout(ARRIVES)?;
            if round == "hello-1" {
                udp_peers.push(from);
            }
        }
        if round == "hello-1" {
            std::thread::sleep(UDP_STREAM);
        }
    }
    Ok(Live {
        tcp,
        udp_clients,
        udp_peers,
    })
}

/// Of the idle TCP connections: how many delivered the container's first
/// message after the flood within [`ARRIVES`], and then the client's.
fn tcp_alive(tcp: &[(TcpStream, TcpStream)]) -> (u32, u32) {
    let pushed = tcp
        .iter()
        .map(|(_, server)| (&*server).write_all(b"push").is_ok())
        .collect::<Vec<_>>();
    let container_first = arrivals(tcp.iter().map(|(client, _)| client), &pushed);
    let pinged = tcp
        .iter()
        .map(|(client, _)| (&*client).write_all(b"ping").is_ok())
        .collect::<Vec<_>>();
    let client_first = arrivals(tcp.iter().map(|(_, server)| server), &pinged);
    (container_first, client_first)
}

/// How many of `readers` (whose `sent` says their peer sent 4 bytes) read
/// them within [`ARRIVES`], all waited on at once.
fn arrivals<'a>(readers: impl Iterator<Item = &'a TcpStream>, sent: &[bool]) -> u32 {
    let readers: Vec<&TcpStream> = readers.collect();
    for reader in &readers {
        let _ = reader.set_nonblocking(true);
    }
    let mut got = vec![false; readers.len()];
    let deadline = Instant::now() + ARRIVES;
    while Instant::now() < deadline && got.iter().zip(sent).any(|(g, s)| *s && !*g) {
        for (i, mut reader) in readers.iter().copied().enumerate() {
            if got[i] || !sent[i] {
                continue;
            }
            let mut buf = [0u8; 4];
            match reader.read(&mut buf) {
                Ok(n) if n > 0 => got[i] = true,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                _ => {}
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    got.iter().filter(|g| **g).count() as u32
}

/// Of the idle UDP sessions: how many got the container's first datagram
/// after the flood within [`ARRIVES`], and then how many the container
/// heard from first.
fn udp_alive(live: &Live, udp: &UdpServer) -> (u32, u32) {
    for peer in &live.udp_peers {
        let _ = udp.socket.send_to(b"push", peer);
    }
    for client in &live.udp_clients {
        let _ = client.set_nonblocking(true);
    }
    let mut got = vec![false; live.udp_clients.len()];
    let deadline = Instant::now() + ARRIVES;
    while Instant::now() < deadline && got.iter().any(|g| !*g) {
        for (i, client) in live.udp_clients.iter().enumerate() {
            let mut buf = [0u8; 64];
            if !got[i] && matches!(client.recv(&mut buf), Ok(4) if &buf[..4] == b"push") {
                got[i] = true;
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let container_first = got.iter().filter(|g| **g).count() as u32;
    while udp.heard.try_recv().is_ok() {}
    for client in &live.udp_clients {
        let _ = client.send(b"ping");
    }
    let mut heard = std::collections::BTreeSet::new();
    let deadline = Instant::now() + ARRIVES;
    while heard.len() < live.udp_peers.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        match udp.heard.recv_timeout(left) {
            Ok((said, from)) if said == b"ping" && live.udp_peers.contains(&from) => {
                heard.insert(from);
            }
            Ok(_) => {}
            Err(_) => break,
        }
    }
    (container_first, heard.len() as u32)
}
