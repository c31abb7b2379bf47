//! A one-shot client for tests that must run as their own process (to be in
//! a given cgroup and network namespace): sends one payload over TCP or UDP
//! and prints what the socket API reports, one `key=value` per line:
//!
//! ```text
//! probe tcp|udp|udp-unconnected ADDR:PORT PAYLOAD [TIMEOUT_MS]
//! peer=<getpeername or recvfrom source>
//! reply=<the answer>
//! ```
//! Exits 1 with `error=...` when anything fails.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::process::ExitCode;
use std::time::Duration;

fn run(args: &[String]) -> Result<(String, String), String> {
    let [mode, addr, payload, rest @ ..] = args else {
        return Err("usage: probe tcp|udp|udp-unconnected ADDR:PORT PAYLOAD [TIMEOUT_MS]".into());
    };
    let addr: SocketAddr = addr.parse().map_err(|e| format!("address {addr}: {e}"))?;
    let timeout = Duration::from_millis(rest.first().and_then(|t| t.parse().ok()).unwrap_or(3000));
    let bind = if addr.is_ipv4() {
        "0.0.0.0:0"
    } else {
        "[::]:0"
    };
    match mode.as_str() {
        "tcp" => {
            let mut stream =
                TcpStream::connect_timeout(&addr, timeout).map_err(|e| format!("connect: {e}"))?;
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
        other => Err(format!("unknown mode {other}")),
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
