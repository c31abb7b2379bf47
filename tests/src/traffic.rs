//! Servers and clients for real traffic, with hard timeouts everywhere: every
//! probe returns within its timeout (plus scheduling slack), none can hang.
//!
//! Servers bind the unspecified address of both families on one port
//! (`0.0.0.0` and `[::]` with `IPV6_V6ONLY`), inside the namespace given, and
//! answer with a server identity so a test can tell which container answered:
//! - TCP echo: every line `L` gets `"<identity> L\n"` (a connection may carry
//!   many lines, for tests that keep a flow open across changes); SCTP echo
//!   the same over a one-to-one association;
//! - UDP echo: every datagram `D` gets `"<identity> D"`;
//! - HTTP/1.0: any request gets `200 OK` with a fixed body.
//!
//! Servers stop, and their threads are joined, when the [`ServerHandle`] drops.

use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, Socket, Type};

use crate::netns::NetNs;

/// How often blocked server threads look at their stop flag.
const SERVER_TICK: Duration = Duration::from_millis(50);
/// How long a server waits for the rest of a request before giving up on
/// it. A connection between requests waits as long as its client (or the
/// server's stop) says: tests keep idle connections open through minutes of
/// churn on a loaded machine.
const SERVER_IDLE_LIMIT: Duration = Duration::from_secs(30);
/// Largest request a server buffers.
const MAX_REQUEST: usize = 64 * 1024;

/// The TCP/UDP echo answer for `payload` from a server called `identity`.
pub fn echo_reply(identity: &str, payload: &str) -> String {
    format!("{identity} {payload}")
}

/// Why a probe got no (good) answer.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("{addr} refused the connection (RST or ICMP port unreachable)")]
    Refused { addr: SocketAddr },
    #[error("no answer from {addr} within {timeout:?}")]
    TimedOut { addr: SocketAddr, timeout: Duration },
    #[error("{addr} is unreachable (no route or neighbour)")]
    Unreachable {
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
    #[error("{stage} with {addr}")]
    Io {
        stage: &'static str,
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
    #[error("{addr} answered something unexpected: {answer:?}")]
    BadAnswer { addr: SocketAddr, answer: String },
}

impl ProbeError {
    /// Refused, timed out or unreachable: the outcome expected once a mapping is gone.
    pub fn is_unreachable(&self) -> bool {
        matches!(
            self,
            ProbeError::Refused { .. }
                | ProbeError::TimedOut { .. }
                | ProbeError::Unreachable { .. }
        )
    }

    fn from_io(
        stage: &'static str,
        addr: SocketAddr,
        timeout: Duration,
        source: io::Error,
    ) -> ProbeError {
        match source.kind() {
            io::ErrorKind::ConnectionRefused => ProbeError::Refused { addr },
            io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => {
                ProbeError::TimedOut { addr, timeout }
            }
            io::ErrorKind::HostUnreachable | io::ErrorKind::NetworkUnreachable => {
                ProbeError::Unreachable { addr, source }
            }
            _ => ProbeError::Io {
                stage,
                addr,
                source,
            },
        }
    }
}

/// A running server; stops and joins its threads on drop.
#[derive(Debug)]
pub struct ServerHandle {
    port: u16,
    identity: String,
    stop: Arc<AtomicBool>,
    peers: Arc<Mutex<Vec<SocketAddr>>>,
    threads: Vec<JoinHandle<()>>,
}

impl ServerHandle {
    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// The source address of every connection (TCP, HTTP) or datagram (UDP)
    /// received so far: shows whether the client address was preserved or
    /// masqueraded on the way in.
    pub fn peers(&self) -> Vec<SocketAddr> {
        self.peers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// Both families' unspecified address.
fn unspecified() -> [IpAddr; 2] {
    [
        IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    ]
}

fn bound_socket(ip: IpAddr, port: u16, kind: Type, protocol: Protocol) -> io::Result<Socket> {
    let socket = Socket::new(
        Domain::for_address(SocketAddr::new(ip, port)),
        kind,
        Some(protocol),
    )?;
    if ip.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    socket.set_reuse_address(true)?;
    socket.bind(&SocketAddr::new(ip, port).into())?;
    Ok(socket)
}

/// SCTP's protocol number, for one-to-one style (`SOCK_STREAM`) sockets.
pub const IPPROTO_SCTP: i32 = 132;

/// Whether `ns`'s kernel offers SCTP sockets. Kernels without SCTP (built
/// without it, or the module not loaded) refuse the socket with
/// `EPROTONOSUPPORT`; the test runner says where SCTP must be there
/// (`EPM_EXPECT_SCTP=1`, set by the VM tests, whose kernels load `sctp`),
/// and there its absence fails the test instead of skipping its SCTP part.
///
/// # Panics
/// If SCTP is missing where `EPM_EXPECT_SCTP=1` says it must be there.
pub fn sctp_available(ns: &NetNs) -> bool {
    let made = ns.run(|| {
        Socket::new(
            Domain::IPV4,
            Type::STREAM,
            Some(Protocol::from(IPPROTO_SCTP)),
        )
    });
    match made {
        Ok(_) => true,
        Err(e) if std::env::var_os("EPM_EXPECT_SCTP").is_some_and(|v| v == "1") => {
            panic!("EPM_EXPECT_SCTP=1 but this kernel has no SCTP sockets: {e}")
        }
        Err(e) => {
            eprintln!("SCTP part skipped: this kernel has no SCTP sockets ({e})");
            false
        }
    }
}

/// Listening stream sockets of `protocol` (TCP, or SCTP one-to-one style)
/// on `port` of both families. An SCTP one-to-one socket takes the same
/// `accept`, `recv` and `send` calls as TCP, so std's TCP types drive it.
fn stream_listeners(ns: &NetNs, port: u16, protocol: Protocol) -> Vec<TcpListener> {
    ns.run(|| {
        unspecified()
            .into_iter()
            .map(|ip| {
                let socket = bound_socket(ip, port, Type::STREAM, protocol)?;
                socket.listen(128)?;
                socket.set_nonblocking(true)?;
                Ok(TcpListener::from(socket))
            })
            .collect::<io::Result<Vec<_>>>()
    })
    .unwrap_or_else(|e| {
        panic!(
            "binding {protocol:?} stream port {port} in netns {}: {e}",
            ns.name()
        )
    })
}

fn udp_sockets(ns: &NetNs, port: u16) -> Vec<UdpSocket> {
    ns.run(|| {
        unspecified()
            .into_iter()
            .map(|ip| {
                let socket = bound_socket(ip, port, Type::DGRAM, Protocol::UDP)?;
                socket.set_nonblocking(true)?;
                Ok(UdpSocket::from(socket))
            })
            .collect::<io::Result<Vec<_>>>()
    })
    .unwrap_or_else(|e| panic!("binding UDP port {port} in netns {}: {e}", ns.name()))
}

/// Waits until one of `fds` is readable or [`SERVER_TICK`] passes.
fn wait_readable(fds: &[i32]) -> Vec<bool> {
    let mut pollfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    // SAFETY: pollfds is a valid array of pollfd of the given length.
    let rc = unsafe {
        libc::poll(
            pollfds.as_mut_ptr(),
            pollfds.len() as libc::nfds_t,
            SERVER_TICK.as_millis() as i32,
        )
    };
    if rc <= 0 {
        return vec![false; fds.len()];
    }
    pollfds.iter().map(|p| p.revents != 0).collect()
}

/// What a TCP server does with one accepted connection.
#[derive(Clone)]
enum TcpBehaviour {
    Echo { identity: String },
    Http { body: String },
}

fn spawn_tcp_server(
    ns: &NetNs,
    port: u16,
    identity: &str,
    behaviour: TcpBehaviour,
) -> ServerHandle {
    spawn_stream_server(ns, port, identity, behaviour, Protocol::TCP)
}

fn spawn_stream_server(
    ns: &NetNs,
    port: u16,
    identity: &str,
    behaviour: TcpBehaviour,
    protocol: Protocol,
) -> ServerHandle {
    let listeners = stream_listeners(ns, port, protocol);
    let stop = Arc::new(AtomicBool::new(false));
    let peers = Arc::new(Mutex::new(Vec::new()));
    let accept_thread = {
        let stop = Arc::clone(&stop);
        let peers = Arc::clone(&peers);
        std::thread::Builder::new()
            .name(format!("tcp-{port}"))
            .spawn(move || {
                let fds: Vec<i32> = listeners.iter().map(AsRawFd::as_raw_fd).collect();
                let mut connections: Vec<JoinHandle<()>> = Vec::new();
                while !stop.load(Ordering::SeqCst) {
                    for (listener, ready) in listeners.iter().zip(wait_readable(&fds)) {
                        if !ready {
                            continue;
                        }
                        while let Ok((stream, peer)) = listener.accept() {
                            peers
                                .lock()
                                .unwrap_or_else(std::sync::PoisonError::into_inner)
                                .push(peer);
                            let stop = Arc::clone(&stop);
                            let behaviour = behaviour.clone();
                            connections.push(std::thread::spawn(move || {
                                let _ = serve_connection(stream, &behaviour, &stop);
                            }));
                        }
                    }
                    connections.retain(|c| !c.is_finished());
                }
                for connection in connections {
                    let _ = connection.join();
                }
            })
            .expect("spawning a server thread")
    };
    ServerHandle {
        port,
        identity: identity.to_owned(),
        stop,
        peers,
        threads: vec![accept_thread],
    }
}

fn serve_connection(
    mut stream: TcpStream,
    behaviour: &TcpBehaviour,
    stop: &AtomicBool,
) -> io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(SERVER_TICK))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    let mut pending: Vec<u8> = Vec::new();
    let mut chunk = [0u8; 4096];
    let mut idle_since = Instant::now();
    loop {
        if stop.load(Ordering::SeqCst)
            || (!pending.is_empty() && idle_since.elapsed() > SERVER_IDLE_LIMIT)
            || pending.len() > MAX_REQUEST
        {
            return Ok(());
        }
        match stream.read(&mut chunk) {
            Ok(0) => return Ok(()),
            Ok(n) => {
                pending.extend_from_slice(&chunk[..n]);
                idle_since = Instant::now();
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                continue;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
        match behaviour {
            TcpBehaviour::Echo { identity } => {
                while let Some(end) = pending.iter().position(|&b| b == b'\n') {
                    let line: Vec<u8> = pending.drain(..=end).collect();
                    let text = String::from_utf8_lossy(&line[..line.len() - 1]);
                    let text = text.strip_suffix('\r').unwrap_or(&text);
                    stream.write_all(format!("{}\n", echo_reply(identity, text)).as_bytes())?;
                }
            }
            TcpBehaviour::Http { body } => {
                if pending.windows(4).any(|w| w == b"\r\n\r\n")
                    || pending.windows(2).any(|w| w == b"\n\n")
                {
                    let response = format!(
                        "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    stream.write_all(response.as_bytes())?;
                    return Ok(());
                }
            }
        }
    }
}

/// A TCP echo server on `port` (both families) inside `ns`.
///
/// # Panics
/// If the port cannot be bound.
pub fn tcp_echo_server(ns: &NetNs, port: u16, identity: &str) -> ServerHandle {
    spawn_tcp_server(
        ns,
        port,
        identity,
        TcpBehaviour::Echo {
            identity: identity.to_owned(),
        },
    )
}

/// An SCTP echo server on `port` (both families) inside `ns`, one-to-one
/// style, with the TCP echo server's protocol (see [`sctp_available`]).
///
/// # Panics
/// If the port cannot be bound (also on a kernel without SCTP).
pub fn sctp_echo_server(ns: &NetNs, port: u16, identity: &str) -> ServerHandle {
    spawn_stream_server(
        ns,
        port,
        identity,
        TcpBehaviour::Echo {
            identity: identity.to_owned(),
        },
        Protocol::from(IPPROTO_SCTP),
    )
}

/// A tiny HTTP/1.0 server on `port` (both families) inside `ns` that answers
/// every request with `200 OK` and `body`.
///
/// # Panics
/// If the port cannot be bound.
pub fn http_server(ns: &NetNs, port: u16, body: &str) -> ServerHandle {
    spawn_tcp_server(
        ns,
        port,
        body,
        TcpBehaviour::Http {
            body: body.to_owned(),
        },
    )
}

/// A UDP echo server on `port` (both families) inside `ns`.
///
/// # Panics
/// If the port cannot be bound.
pub fn udp_echo_server(ns: &NetNs, port: u16, identity: &str) -> ServerHandle {
    let sockets = udp_sockets(ns, port);
    let stop = Arc::new(AtomicBool::new(false));
    let peers = Arc::new(Mutex::new(Vec::new()));
    let thread = {
        let stop = Arc::clone(&stop);
        let peers = Arc::clone(&peers);
        let identity = identity.to_owned();
        std::thread::Builder::new()
            .name(format!("udp-{port}"))
            .spawn(move || {
                let fds: Vec<i32> = sockets.iter().map(AsRawFd::as_raw_fd).collect();
                let mut buf = [0u8; 65536];
                while !stop.load(Ordering::SeqCst) {
                    for (socket, ready) in sockets.iter().zip(wait_readable(&fds)) {
                        if !ready {
                            continue;
                        }
                        while let Ok((n, peer)) = socket.recv_from(&mut buf) {
                            peers
                                .lock()
                                .unwrap_or_else(std::sync::PoisonError::into_inner)
                                .push(peer);
                            let reply = echo_reply(&identity, &String::from_utf8_lossy(&buf[..n]));
                            let _ = socket.send_to(reply.as_bytes(), peer);
                        }
                    }
                }
            })
            .expect("spawning a server thread")
    };
    ServerHandle {
        port,
        identity: identity.to_owned(),
        stop,
        peers,
        threads: vec![thread],
    }
}

/// Time left until `deadline`, at least 1 ms (a zero socket timeout means "forever").
fn remaining(deadline: Instant) -> Option<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    (!left.is_zero()).then(|| left.max(Duration::from_millis(1)))
}

/// An open TCP connection made from inside a namespace, for tests that keep a
/// flow alive across changes. Every operation honours a deadline.
#[derive(Debug)]
pub struct TcpSession {
    stream: TcpStream,
    addr: SocketAddr,
    pending: Vec<u8>,
}

/// Connects from inside `ns` to `addr` within `timeout`.
pub fn tcp_connect(
    ns: &NetNs,
    addr: SocketAddr,
    timeout: Duration,
) -> Result<TcpSession, ProbeError> {
    let stream = ns
        .run(|| TcpStream::connect_timeout(&addr, timeout))
        .map_err(|e| ProbeError::from_io("connecting", addr, timeout, e))?;
    Ok(TcpSession {
        stream,
        addr,
        pending: Vec::new(),
    })
}

/// [`tcp_connect`] from a given local address and port (`local`, bound
/// first, with `SO_REUSEADDR`), for tests that need a known client tuple.
pub fn tcp_connect_from(
    ns: &NetNs,
    local: SocketAddr,
    addr: SocketAddr,
    timeout: Duration,
) -> Result<TcpSession, ProbeError> {
    let stream = ns
        .run(|| -> io::Result<TcpStream> {
            let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
            socket.set_reuse_address(true)?;
            socket.bind(&local.into())?;
            socket.connect_timeout(&addr.into(), timeout)?;
            Ok(socket.into())
        })
        .map_err(|e| ProbeError::from_io("connecting", addr, timeout, e))?;
    Ok(TcpSession {
        stream,
        addr,
        pending: Vec::new(),
    })
}

impl TcpSession {
    /// Sends `payload` plus a newline and returns the next line of answer
    /// (without the newline), all within `timeout`.
    pub fn request(&mut self, payload: &str, timeout: Duration) -> Result<String, ProbeError> {
        let addr = self.addr;
        let deadline = Instant::now() + timeout;
        let io_error = |stage, e| ProbeError::from_io(stage, addr, timeout, e);
        self.stream
            .set_write_timeout(Some(timeout))
            .map_err(|e| io_error("setting a timeout", e))?;
        self.stream
            .write_all(format!("{payload}\n").as_bytes())
            .map_err(|e| io_error("sending", e))?;
        let mut chunk = [0u8; 4096];
        loop {
            if let Some(end) = self.pending.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.pending.drain(..=end).collect();
                return Ok(String::from_utf8_lossy(&line[..line.len() - 1]).into_owned());
            }
            let left = remaining(deadline).ok_or(ProbeError::TimedOut { addr, timeout })?;
            self.stream
                .set_read_timeout(Some(left))
                .map_err(|e| io_error("setting a timeout", e))?;
            match self.stream.read(&mut chunk) {
                Ok(0) => {
                    return Err(ProbeError::BadAnswer {
                        addr,
                        answer: format!(
                            "connection closed after {:?}",
                            String::from_utf8_lossy(&self.pending)
                        ),
                    });
                }
                Ok(n) => self.pending.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(io_error("receiving", e)),
            }
        }
    }

    /// The local (client) address of the connection.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.stream.local_addr().ok()
    }
}

/// One TCP line request from inside `ns` to `addr`: connect, send
/// `payload\n`, return the answer line; all within `timeout`.
pub fn tcp_request(
    ns: &NetNs,
    addr: SocketAddr,
    payload: &str,
    timeout: Duration,
) -> Result<String, ProbeError> {
    let started = Instant::now();
    let mut session = tcp_connect(ns, addr, timeout)?;
    let left = timeout
        .saturating_sub(started.elapsed())
        .max(Duration::from_millis(1));
    session.request(payload, left)
}

/// One UDP request from inside `ns` to `addr`: sends `payload` and returns the
/// first answer, within `timeout`. The datagram is re-sent (same socket, same
/// flow) every 250 ms while no answer came, so a single drop during neighbour
/// resolution does not fail the probe. The socket is connected, so an ICMP
/// port-unreachable comes back as [`ProbeError::Refused`].
pub fn udp_request(
    ns: &NetNs,
    addr: SocketAddr,
    payload: &str,
    timeout: Duration,
) -> Result<String, ProbeError> {
    let io_error = |stage, e| ProbeError::from_io(stage, addr, timeout, e);
    let bind_ip = if addr.is_ipv4() {
        IpAddr::V4(Ipv4Addr::UNSPECIFIED)
    } else {
        IpAddr::V6(Ipv6Addr::UNSPECIFIED)
    };
    let socket = ns
        .run(|| {
            let socket = UdpSocket::bind(SocketAddr::new(bind_ip, 0))?;
            socket.connect(addr)?;
            Ok::<_, io::Error>(socket)
        })
        .map_err(|e| io_error("opening a socket", e))?;
    let deadline = Instant::now() + timeout;
    let resend_every = Duration::from_millis(250);
    let mut buf = [0u8; 65536];
    loop {
        let Some(left) = remaining(deadline) else {
            return Err(ProbeError::TimedOut { addr, timeout });
        };
        socket
            .send(payload.as_bytes())
            .map_err(|e| io_error("sending", e))?;
        socket
            .set_read_timeout(Some(left.min(resend_every)))
            .map_err(|e| io_error("setting a timeout", e))?;
        match socket.recv(&mut buf) {
            Ok(n) => return Ok(String::from_utf8_lossy(&buf[..n]).into_owned()),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                continue;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(io_error("receiving", e)),
        }
    }
}

/// A parsed HTTP response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpResponse {
    pub status: u16,
    pub body: String,
}

/// `GET /` over HTTP/1.0 from inside `ns` to `addr`, within `timeout`.
pub fn http_get(
    ns: &NetNs,
    addr: SocketAddr,
    timeout: Duration,
) -> Result<HttpResponse, ProbeError> {
    let started = Instant::now();
    let io_error = |stage, e| ProbeError::from_io(stage, addr, timeout, e);
    let mut stream = ns
        .run(|| TcpStream::connect_timeout(&addr, timeout))
        .map_err(|e| io_error("connecting", e))?;
    let deadline = started + timeout;
    stream
        .set_write_timeout(Some(timeout))
        .map_err(|e| io_error("setting a timeout", e))?;
    stream
        .write_all(
            format!("GET / HTTP/1.0\r\nHost: {addr}\r\nUser-Agent: epm-harness\r\n\r\n").as_bytes(),
        )
        .map_err(|e| io_error("sending", e))?;
    let mut raw = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let left = remaining(deadline).ok_or(ProbeError::TimedOut { addr, timeout })?;
        stream
            .set_read_timeout(Some(left))
            .map_err(|e| io_error("setting a timeout", e))?;
        match stream.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => raw.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(io_error("receiving", e)),
        }
    }
    let text = String::from_utf8_lossy(&raw).into_owned();
    parse_http_response(&text).ok_or(ProbeError::BadAnswer { addr, answer: text })
}

/// Splits an HTTP/1.x response into status and body.
pub fn parse_http_response(text: &str) -> Option<HttpResponse> {
    let (head, body) = text
        .split_once("\r\n\r\n")
        .or_else(|| text.split_once("\n\n"))?;
    let status_line = head.lines().next()?;
    let mut parts = status_line.split_whitespace();
    if !parts.next()?.starts_with("HTTP/") {
        return None;
    }
    let status = parts.next()?.parse().ok()?;
    Some(HttpResponse {
        status,
        body: body.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_responses_parse() {
        let response =
            parse_http_response("HTTP/1.0 200 OK\r\nContent-Length: 5\r\n\r\nhello").unwrap();
        assert_eq!(
            response,
            HttpResponse {
                status: 200,
                body: "hello".into()
            }
        );
        assert_eq!(
            parse_http_response("HTTP/1.1 404 Not Found\n\n")
                .unwrap()
                .status,
            404
        );
        assert!(parse_http_response("garbage").is_none());
        assert!(parse_http_response("SSH-2.0\r\n\r\n").is_none());
    }

    #[test]
    fn unreachable_classification() {
        let addr: SocketAddr = "198.18.0.1:80".parse().unwrap();
        let t = Duration::from_secs(1);
        assert!(
            ProbeError::from_io("x", addr, t, io::ErrorKind::ConnectionRefused.into())
                .is_unreachable()
        );
        assert!(
            ProbeError::from_io("x", addr, t, io::ErrorKind::WouldBlock.into()).is_unreachable()
        );
        assert!(
            ProbeError::from_io("x", addr, t, io::ErrorKind::HostUnreachable.into())
                .is_unreachable()
        );
        assert!(
            !ProbeError::from_io("x", addr, t, io::ErrorKind::ConnectionReset.into())
                .is_unreachable()
        );
    }

    #[test]
    fn echo_reply_format() {
        assert_eq!(echo_reply("c1", "ping"), "c1 ping");
    }
}
