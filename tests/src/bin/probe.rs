//! The test-only connection tester, for tests that must run a client or a
//! server as a process of its own (in a given cgroup and network namespace,
//! or inside a container image).
//!
//! As a one-shot client it sends one payload over TCP, SCTP (one-to-one
//! style, the TCP echo protocol) or UDP, or one HTTP
//! `GET /`, and prints what the socket API reports, one `key=value` per line:
//!
//! ```text
//! probe tcp|sctp|udp|udp-unconnected|http ADDR:PORT PAYLOAD [TIMEOUT_MS]
//! peer=<getpeername or recvfrom source>
//! reply=<the answer; for http the response body, trimmed>
//! ```
//! Exits 1 with `error=...` when anything fails (for http also on a status
//! other than 200). `PAYLOAD` is ignored by `http`.
//!
//! As a server it answers UDP on both families forever, each datagram `D`
//! with `IDENTITY D` (the harness's echo protocol), until it is killed:
//!
//! ```text
//! probe udp-echo-server PORT IDENTITY
//! ```

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::process::ExitCode;
use std::time::Duration;

use socket2::{Domain, Protocol, Socket, Type};

/// SCTP's protocol number.
const IPPROTO_SCTP: i32 = 132;

fn run(args: &[String]) -> Result<(String, String), String> {
    let [mode, addr, payload, rest @ ..] = args else {
        return Err(
            "usage: probe tcp|sctp|udp|udp-unconnected|http ADDR:PORT PAYLOAD [TIMEOUT_MS] | probe udp-echo-server PORT IDENTITY"
                .into(),
        );
    };
    if mode == "udp-echo-server" {
        return Err(udp_echo_server(addr, payload));
    }
    let addr: SocketAddr = addr.parse().map_err(|e| format!("address {addr}: {e}"))?;
    let timeout = Duration::from_millis(rest.first().and_then(|t| t.parse().ok()).unwrap_or(3000));
    let bind = if addr.is_ipv4() {
        "0.0.0.0:0"
    } else {
        "[::]:0"
    };
    match mode.as_str() {
        "tcp" => stream_echo(
            TcpStream::connect_timeout(&addr, timeout).map_err(|e| format!("connect: {e}"))?,
            payload,
            timeout,
        ),
        "sctp" => {
            let socket = Socket::new(
                Domain::for_address(addr),
                Type::STREAM,
                Some(Protocol::from(IPPROTO_SCTP)),
            )
            .map_err(|e| format!("socket: {e}"))?;
            socket
                .connect_timeout(&addr.into(), timeout)
                .map_err(|e| format!("connect: {e}"))?;
            // A one-to-one SCTP socket takes TCP's recv and send calls.
            stream_echo(TcpStream::from(socket), payload, timeout)
        }
        "udp" => {
            let socket = UdpSocket::bind(bind).map_err(|e| format!("bind: {e}"))?;
            socket
                .set_read_timeout(Some(timeout))
                .map_err(|e| e.to_string())?;
            socket.connect(addr).map_err(|e| format!("connect: {e}"))?;
            let peer = socket
                .peer_addr()
                .map_err(|e| format!("getpeername: {e}"))?;
            socket
                .send(payload.as_bytes())
                .map_err(|e| format!("send: {e}"))?;
            let mut buf = [0u8; 512];
            let n = socket.recv(&mut buf).map_err(|e| format!("recv: {e}"))?;
            Ok((
                peer.to_string(),
                String::from_utf8_lossy(&buf[..n]).trim().to_owned(),
            ))
        }
        "udp-unconnected" => {
            let socket = UdpSocket::bind(bind).map_err(|e| format!("bind: {e}"))?;
            socket
                .set_read_timeout(Some(timeout))
                .map_err(|e| e.to_string())?;
            socket
                .send_to(payload.as_bytes(), addr)
                .map_err(|e| format!("sendto: {e}"))?;
            let mut buf = [0u8; 512];
            let (n, from) = socket
                .recv_from(&mut buf)
                .map_err(|e| format!("recvfrom: {e}"))?;
            Ok((
                from.to_string(),
                String::from_utf8_lossy(&buf[..n]).trim().to_owned(),
            ))
        }
        "http" => {
            let mut stream =
                TcpStream::connect_timeout(&addr, timeout).map_err(|e| format!("connect: {e}"))?;
            stream
                .set_read_timeout(Some(timeout))
                .map_err(|e| e.to_string())?;
            let peer = stream
                .peer_addr()
                .map_err(|e| format!("getpeername: {e}"))?;
            stream
                .write_all(format!("GET / HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
                .map_err(|e| format!("send: {e}"))?;
            let mut response = Vec::new();
            stream
                .read_to_end(&mut response)
                .map_err(|e| format!("recv: {e}"))?;
            let response = String::from_utf8_lossy(&response);
            let (head, body) = response
                .split_once("\r\n\r\n")
                .ok_or_else(|| format!("not an HTTP response: {response:?}"))?;
            let status = head.lines().next().unwrap_or_default();
            if status.split_whitespace().nth(1) != Some("200") {
                return Err(format!("HTTP status {status:?}"));
            }
            Ok((peer.to_string(), body.trim().to_owned()))
        }
        other => Err(format!("unknown mode {other}")),
    }
}

/// One line of the echo protocol over a connected stream socket: the
/// peer's address as the socket reports it and the answer.
fn stream_echo(
    mut stream: TcpStream,
    payload: &str,
    timeout: Duration,
) -> Result<(String, String), String> {
    stream
        .set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    let peer = stream
        .peer_addr()
        .map_err(|e| format!("getpeername: {e}"))?;
    stream
        .write_all(format!("{payload}\n").as_bytes())
        .map_err(|e| format!("send: {e}"))?;
    let mut reply = Vec::new();
    let mut buf = [0u8; 512];
    loop {
        let n = stream.read(&mut buf).map_err(|e| format!("recv: {e}"))?;
        if n == 0 {
            break;
        }
        reply.extend_from_slice(&buf[..n]);
        if reply.ends_with(b"\n") {
            break;
        }
    }
    Ok((
        peer.to_string(),
        String::from_utf8_lossy(&reply).trim().to_owned(),
    ))
}

/// Serves until killed; returns only the reason it could not.
fn udp_echo_server(port: &str, identity: &str) -> String {
    let port: u16 = match port.parse() {
        Ok(port) => port,
        Err(e) => return format!("port {port}: {e}"),
    };
    // One socket for both families: [::] with IPV6_V6ONLY off also receives
    // IPv4 (as v4-mapped addresses) and replies to it.
    let bind = || -> std::io::Result<UdpSocket> {
        let socket = Socket::new(Domain::IPV6, Type::DGRAM, Some(Protocol::UDP))?;
        socket.set_only_v6(false)?;
        socket.bind(&SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, port)).into())?;
        Ok(socket.into())
    };
    let socket = match bind() {
        Ok(socket) => socket,
        Err(e) => return format!("bind [::]:{port}: {e}"),
    };
    let mut buf = [0u8; 2048];
    loop {
        let (n, peer) = match socket.recv_from(&mut buf) {
            Ok(received) => received,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return format!("recvfrom: {e}"),
        };
        let reply = format!("{identity} {}", String::from_utf8_lossy(&buf[..n]));
        // A peer that went away is not the server's problem.
        let _ = socket.send_to(reply.as_bytes(), peer);
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok((peer, reply)) => {
            println!("peer={peer}");
            println!("reply={reply}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            println!("error={error}");
            ExitCode::FAILURE
        }
    }
}
