//! Tiny load generators and the servers they talk to.
//!
//! Servers run in the container namespace (blocking sockets, one thread per
//! service, connections served inline so a connection-rate loop measures the
//! path and not thread creation):
//! - request/response on [`SERVICE_RR_PORT`]: every [`MESSAGE`]-byte request
//!   gets a [`MESSAGE`]-byte answer, until the client closes;
//! - sink on [`SERVICE_STREAM_PORT`]: reads until EOF, then closes;
//! - UDP echo on [`SERVICE_UDP_PORT`];
//! - one request/response, then the server closes first, on
//!   [`SERVICE_CLOSE_FIRST_PORT`]: the server holds every closed tuple in
//!   TIME_WAIT, as netperf's TCP_CRR server does (what the hairpin
//!   masquerade must let through, issue 37).
//!
//! The services a pod dials through the node (request/response, UDP echo,
//! close-first) listen on IPv6 too, on sockets of their own (the IPv4 ones
//! stay plain IPv4 sockets, as the external rows have always measured).
//!
//! Clients run in the client namespace, each for a fixed duration, and
//! return a rate. Every socket operation has a timeout, every loop ends at
//! its deadline.

use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use portmap_tests::netns::{NetNs, NsHandle};
use socket2::{Domain, Protocol, Socket, Type};

pub const SERVICE_RR_PORT: u16 = 5001;
/// The request/response service again, on a port no mapping uses: what
/// direct pod traffic on a node with ebpf-portmap loaded is measured with
/// (most pods' ports are not hostPorts).
pub const SERVICE_DIRECT_RR_PORT: u16 = 5004;
pub const SERVICE_STREAM_PORT: u16 = 5002;
pub const SERVICE_UDP_PORT: u16 = 5003;
/// One request/response per connection, the server closing first.
pub const SERVICE_CLOSE_FIRST_PORT: u16 = 5005;

/// Request and response size of the request/response tests (netperf's
/// default is 1 byte; 64 is closer to a small RPC and still latency-bound).
pub const MESSAGE: usize = 64;
/// Write size of the throughput test.
const STREAM_CHUNK: usize = 128 * 1024;
/// How long a blocked operation may wait before the loop gives up on it.
const IO_TIMEOUT: Duration = Duration::from_secs(1);
/// How often blocked server threads look at their stop flag.
const TICK: Duration = Duration::from_millis(100);

/// Pins the calling thread to `cpu` (no-op for `None`). Client, servers and,
/// through them, the veth softirq work of a test then share one core, so a
/// rate measures the CPU cost of the path instead of cross-CPU wake-up
/// latency, which on a shared 2-core VM varies by 5x from run to run.
pub fn pin_to(cpu: Option<usize>) {
    let Some(cpu) = cpu else {
        return;
    };
    // SAFETY: a zeroed cpu_set_t is valid; CPU_SET writes inside it; the
    // call only changes this thread's affinity.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &raw const set);
    }
}

/// The servers of one container; stopped and joined on drop.
pub struct Servers {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Servers {
    /// Binds the services inside `ns` (see the module docs for which
    /// listen on IPv6 too) and starts one thread per socket.
    ///
    /// # Panics
    /// If a port cannot be bound.
    pub fn start(ns: &NetNs, cpu: Option<usize>) -> Servers {
        let sockets = ns
            .run(bind_services)
            .unwrap_or_else(|e| panic!("binding bench servers in {}: {e}", ns.name()));
        let stop = Arc::new(AtomicBool::new(false));
        let threads = sockets
            .into_iter()
            .map(|(name, service)| {
                let stop = Arc::clone(&stop);
                std::thread::Builder::new()
                    .name(name.into())
                    .spawn(move || {
                        pin_to(cpu);
                        service.serve(&stop);
                    })
                    .expect("spawning a server thread")
            })
            .collect();
        Servers { stop, threads }
    }
}

/// One bound server socket and how it serves.
enum Service {
    Tcp(TcpListener, fn(TcpStream, &AtomicBool)),
    Udp(UdpSocket),
}

impl Service {
    fn serve(&self, stop: &AtomicBool) {
        match self {
            Service::Tcp(listener, serve) => accept_loop(listener, stop, *serve),
            Service::Udp(socket) => udp_echo(socket, stop),
        }
    }
}

/// Every server socket of a container, named for its thread.
fn bind_services() -> io::Result<Vec<(&'static str, Service)>> {
    let v4 = IpAddr::V4(Ipv4Addr::UNSPECIFIED);
    let v6 = IpAddr::V6(Ipv6Addr::UNSPECIFIED);
    let tcp = |ip, port, serve| -> io::Result<Service> {
        Ok(Service::Tcp(listener(SocketAddr::new(ip, port))?, serve))
    };
    let udp = |ip, port| -> io::Result<Service> {
        Ok(Service::Udp(udp_socket(SocketAddr::new(ip, port))?))
    };
    Ok(vec![
        ("bench-rr", tcp(v4, SERVICE_RR_PORT, serve_rr)?),
        ("bench-rr6", tcp(v6, SERVICE_RR_PORT, serve_rr)?),
        (
            "bench-rr-direct",
            tcp(v4, SERVICE_DIRECT_RR_PORT, serve_rr)?,
        ),
        ("bench-sink", tcp(v4, SERVICE_STREAM_PORT, serve_sink)?),
        ("bench-udp", udp(v4, SERVICE_UDP_PORT)?),
        ("bench-udp6", udp(v6, SERVICE_UDP_PORT)?),
        (
            "bench-close",
            tcp(v4, SERVICE_CLOSE_FIRST_PORT, serve_once)?,
        ),
        (
            "bench-close6",
            tcp(v6, SERVICE_CLOSE_FIRST_PORT, serve_once)?,
        ),
    ])
}

impl Drop for Servers {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// A listener on `addr`; an IPv6 one takes IPv6 only, beside its IPv4 twin.
fn listener(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    Ok(socket.into())
}

fn udp_socket(addr: SocketAddr) -> io::Result<UdpSocket> {
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    socket.bind(&addr.into())?;
    Ok(socket.into())
}

/// Whether `fd` became readable within [`TICK`].
fn readable(fd: i32) -> bool {
    let mut pollfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&raw mut pollfd, 1, TICK.as_millis() as i32) > 0 }
}

fn accept_loop(listener: &TcpListener, stop: &AtomicBool, serve: fn(TcpStream, &AtomicBool)) {
    while !stop.load(Ordering::SeqCst) {
        if !readable(listener.as_raw_fd()) {
            continue;
        }
        if let Ok((stream, _)) = listener.accept() {
            let _ = stream.set_read_timeout(Some(IO_TIMEOUT));
            let _ = stream.set_write_timeout(Some(IO_TIMEOUT));
            serve(stream, stop);
        }
    }
}

fn serve_rr(mut stream: TcpStream, stop: &AtomicBool) {
    let _ = stream.set_nodelay(true);
    let mut request = [0u8; MESSAGE];
    let response = [b'r'; MESSAGE];
    while !stop.load(Ordering::Relaxed) {
        if stream.read_exact(&mut request).is_err() || stream.write_all(&response).is_err() {
            return;
        }
    }
}

/// One request, one response, then the server's close comes first.
fn serve_once(mut stream: TcpStream, _stop: &AtomicBool) {
    let _ = stream.set_nodelay(true);
    let mut request = [0u8; MESSAGE];
    if stream.read_exact(&mut request).is_ok() {
        let _ = stream.write_all(&[b'r'; MESSAGE]);
    }
}

fn serve_sink(mut stream: TcpStream, stop: &AtomicBool) {
    let mut buf = vec![0u8; STREAM_CHUNK];
    while !stop.load(Ordering::Relaxed) {
        match stream.read(&mut buf) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

fn udp_echo(socket: &UdpSocket, stop: &AtomicBool) {
    let _ = socket.set_read_timeout(Some(TICK));
    let mut buf = [0u8; 2048];
    while !stop.load(Ordering::Relaxed) {
        if let Ok((n, peer)) = socket.recv_from(&mut buf) {
            let _ = socket.send_to(&buf[..n], peer);
        }
    }
}

/// A dataplane test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Test {
    /// Request/response over one TCP connection (transactions/s).
    TcpRr,
    /// Connect, one request/response, close (connections/s).
    TcpCrr,
    /// Bulk TCP from client to server (Gbit/s).
    TcpStream,
    /// UDP request/response (transactions/s).
    UdpRr,
}

impl Test {
    pub const ALL: [Test; 4] = [Test::TcpRr, Test::TcpCrr, Test::TcpStream, Test::UdpRr];

    pub fn key(self) -> &'static str {
        match self {
            Test::TcpRr => "tcp_rr",
            Test::TcpCrr => "tcp_crr",
            Test::TcpStream => "tcp_stream",
            Test::UdpRr => "udp_rr",
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            Test::TcpRr => "TCP request/response",
            Test::TcpCrr => "TCP connect+request+close",
            Test::TcpStream => "TCP throughput",
            Test::UdpRr => "UDP request/response",
        }
    }

    pub fn unit(self) -> &'static str {
        match self {
            Test::TcpRr | Test::UdpRr => "trans/s",
            Test::TcpCrr => "conn/s",
            Test::TcpStream => "Gbit/s",
        }
    }
}

/// What one timed run measured.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunResult {
    /// In the test's unit.
    pub rate: f64,
    /// Transactions/connections that failed (timeouts, resets, refusals,
    /// UDP requests without an answer), connect failures included.
    pub errors: u64,
    /// Of `errors`, the connects that failed (timed out, refused).
    pub connect_errors: u64,
    /// Work done in the test's unit times seconds (transactions,
    /// connections, Gbit), and the time it took: slices add up exactly.
    pub amount: f64,
    pub seconds: f64,
}

impl RunResult {
    fn new(amount: f64, errors: Errors, seconds: f64) -> RunResult {
        RunResult {
            rate: if seconds > 0.0 { amount / seconds } else { 0.0 },
            errors: errors.all,
            connect_errors: errors.connect,
            amount,
            seconds,
        }
    }

    /// The slices of one run taken together.
    pub fn sum(slices: &[RunResult]) -> RunResult {
        RunResult::new(
            slices.iter().map(|s| s.amount).sum(),
            Errors {
                all: slices.iter().map(|s| s.errors).sum(),
                connect: slices.iter().map(|s| s.connect_errors).sum(),
            },
            slices.iter().map(|s| s.seconds).sum(),
        )
    }
}

/// What failed in a loop: everything, and of it the connects.
#[derive(Debug, Clone, Copy, Default)]
struct Errors {
    all: u64,
    connect: u64,
}

impl Errors {
    fn other(&mut self) {
        self.all += 1;
    }

    fn connect(&mut self) {
        self.all += 1;
        self.connect += 1;
    }
}

/// Runs `test` from inside `client` against `addr` for `duration`, on `cpu`.
pub fn run(
    client: &NsHandle,
    test: Test,
    addr: SocketAddr,
    duration: Duration,
    cpu: Option<usize>,
) -> RunResult {
    client.run(|| {
        pin_to(cpu);
        match test {
            Test::TcpRr => tcp_rr(addr, duration),
            Test::TcpCrr => tcp_crr(addr, duration),
            Test::TcpStream => tcp_stream(addr, duration),
            Test::UdpRr => udp_rr(addr, duration),
        }
    })
}

fn connect(addr: SocketAddr) -> io::Result<TcpStream> {
    let stream = TcpStream::connect_timeout(&addr, IO_TIMEOUT)?;
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

fn tcp_rr(addr: SocketAddr, duration: Duration) -> RunResult {
    let request = [b'q'; MESSAGE];
    let mut response = [0u8; MESSAGE];
    let mut done = 0u64;
    let mut errors = Errors::default();
    let started = Instant::now();
    let deadline = started + duration;
    'outer: while Instant::now() < deadline {
        let Ok(mut stream) = connect(addr) else {
            errors.connect();
            continue;
        };
        while Instant::now() < deadline {
            if stream.write_all(&request).is_err() || stream.read_exact(&mut response).is_err() {
                errors.other();
                continue 'outer;
            }
            done += 1;
        }
    }
    RunResult::new(done as f64, errors, started.elapsed().as_secs_f64())
}

fn tcp_crr(addr: SocketAddr, duration: Duration) -> RunResult {
    let request = [b'q'; MESSAGE];
    let mut response = [0u8; MESSAGE];
    let mut done = 0u64;
    let mut errors = Errors::default();
    let started = Instant::now();
    let deadline = started + duration;
    while Instant::now() < deadline {
        let Ok(mut stream) = connect(addr) else {
            errors.connect();
            continue;
        };
        match stream
            .write_all(&request)
            .and_then(|()| stream.read_exact(&mut response))
        {
            Ok(()) => done += 1,
            Err(_) => errors.other(),
        }
    }
    RunResult::new(done as f64, errors, started.elapsed().as_secs_f64())
}

fn tcp_stream(addr: SocketAddr, duration: Duration) -> RunResult {
    let chunk = vec![b's'; STREAM_CHUNK];
    let mut sent = 0u64;
    let started = Instant::now();
    let deadline = started + duration;
    let mut errors = Errors::default();
    let Ok(mut stream) = connect(addr) else {
        errors.connect();
        return RunResult::new(0.0, errors, started.elapsed().as_secs_f64());
    };
    while Instant::now() < deadline {
        match stream.write(&chunk) {
            Ok(n) => sent += n as u64,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => {
                errors.other();
                break;
            }
        }
    }
    // Count the time until the server has read everything: close our side
    // and wait for its close.
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let mut rest = [0u8; 64];
    let _ = stream.read(&mut rest);
    RunResult::new(
        sent as f64 * 8.0 / 1e9,
        errors,
        started.elapsed().as_secs_f64(),
    )
}

/// The unspecified address of `addr`'s family, port 0: where a client
/// socket binds.
fn any_of(addr: SocketAddr) -> SocketAddr {
    let ip = match addr {
        SocketAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        SocketAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    };
    SocketAddr::new(ip, 0)
}

fn udp_rr(addr: SocketAddr, duration: Duration) -> RunResult {
    let mut errors = Errors::default();
    let Ok(socket) = UdpSocket::bind(any_of(addr)).and_then(|s| {
        s.connect(addr)?;
        s.set_read_timeout(Some(Duration::from_millis(200)))?;
        Ok(s)
    }) else {
        errors.connect();
        return RunResult::new(0.0, errors, duration.as_secs_f64());
    };
    let request = [b'u'; MESSAGE];
    let mut response = [0u8; 2048];
    let mut done = 0u64;
    let started = Instant::now();
    let deadline = started + duration;
    while Instant::now() < deadline {
        if socket.send(&request).is_err() {
            errors.other();
            continue;
        }
        match socket.recv(&mut response) {
            Ok(n) if n == MESSAGE => done += 1,
            _ => errors.other(),
        }
    }
    RunResult::new(done as f64, errors, started.elapsed().as_secs_f64())
}

/// Runs `test` against every `(client, address)` target in turn, `slices`
/// times, each slice `duration / slices` long, and adds up each target's
/// slices: the targets share every phase of the machine's load.
/// Calls `before(i)` before each slice of target `i`, to put a world shared
/// by two targets in the state the target measures.
pub fn run_interleaved(
    targets: &[(NsHandle, SocketAddr)],
    test: Test,
    duration: Duration,
    slices: u32,
    cpu: Option<usize>,
    before: impl Fn(usize),
) -> Vec<RunResult> {
    let slices = slices.max(1);
    let slice = duration / slices;
    let mut parts: Vec<Vec<RunResult>> = vec![Vec::new(); targets.len()];
    for _ in 0..slices {
        for (i, ((client, addr), parts)) in targets.iter().zip(parts.iter_mut()).enumerate() {
            before(i);
            parts.push(run(client, test, *addr, slice, cpu));
        }
    }
    parts.iter().map(|p| RunResult::sum(p)).collect()
}

/// Sends one UDP datagram to `addr` from each of `count` distinct source
/// ports of every address in `sources` (bounded: `count` per address), from
/// inside `client`. Every datagram that reaches a port mapping opens a new
/// flow; returns how many were sent.
pub fn udp_flows(
    client: &NsHandle,
    sources: &[std::net::Ipv4Addr],
    count: u16,
    addr: SocketAddr,
) -> u64 {
    client.run(|| {
        let mut sent = 0u64;
        for &source in sources {
            for offset in 0..count {
                let port = 1024u16.saturating_add(offset);
                let Ok(socket) = UdpSocket::bind((source, port)) else {
                    continue;
                };
                if socket.send_to(b"f", addr).is_ok() {
                    sent += 1;
                }
            }
        }
        sent
    })
}
