//! rtnetlink events: the kernel's multicast groups for links and IPv4/IPv6
//! addresses, so a link created, deleted or re-created and an address added
//! or removed wake the worker at once (no polling). The messages only say
//! "look again": the pass reads the node afresh, so an event lost to a full
//! socket buffer (`ENOBUFS`) costs nothing but is followed by a pass too.

use std::{io, sync::Arc, sync::atomic::Ordering, sync::mpsc::SyncSender};

use netlink_packet_core::NetlinkBuffer;
use netlink_sys::{AsyncSocket, AsyncSocketExt, SocketAddr, TokioSocket, protocols::NETLINK_ROUTE};

use super::worker::Shared;

/// `RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR`.
const GROUPS: u32 = 0x1 | 0x10 | 0x100;

/// `RTM_NEWLINK`, `RTM_DELLINK`, `RTM_NEWADDR`, `RTM_DELADDR`.
const WATCHED: [u16; 4] = [16, 17, 20, 21];

/// A socket big enough for a burst of veth churn (each pod start is a few
/// link and address messages).
const RECEIVE_BUFFER: usize = 4 << 20;

/// The subscribed socket; made before the first pass, so nothing that
/// happens after that pass's dumps goes unseen.
pub fn subscribe() -> io::Result<TokioSocket> {
    let mut socket = TokioSocket::new(NETLINK_ROUTE)?;
    socket.socket_mut().bind(&SocketAddr::new(0, GROUPS))?;
    if let Err(error) = socket.socket_ref().set_rx_buf_sz(RECEIVE_BUFFER) {
        log::debug!("rtnetlink receive buffer left at its default: {error}");
    }
    Ok(socket)
}

/// How many watched messages a datagram holds.
fn watched_messages(datagram: &[u8]) -> u64 {
    let mut offset = 0;
    let mut count = 0;
    while offset < datagram.len() {
        let Ok(message) = NetlinkBuffer::new_checked(&datagram[offset..]) else {
            break;
        };
        let length = message.length() as usize;
        if WATCHED.contains(&message.message_type()) {
            count += 1;
        }
        if length == 0 {
            break;
        }
        // Messages are 4-byte aligned.
        offset += (length + 3) & !3;
    }
    count
}

/// Reads events until the socket fails for good; each datagram with a
/// watched message wakes the worker.
pub async fn watch(socket: TokioSocket, shared: Arc<Shared>, wake: SyncSender<()>) {
    loop {
        match socket.recv_from_full().await {
            Ok((datagram, _)) => {
                let count = watched_messages(&datagram);
                if count > 0 {
                    shared.netlink_events.fetch_add(count, Ordering::Relaxed);
                    // A full queue already holds a wake-up: nothing lost.
                    let _ = wake.try_send(());
                }
            }
            Err(error) if error.raw_os_error() == Some(libc::ENOBUFS) => {
                shared.netlink_overruns.fetch_add(1, Ordering::Relaxed);
                log::debug!("rtnetlink events overflowed the socket; reading the node afresh");
                let _ = wake.try_send(());
            }
            Err(error) => {
                log::warn!("reading rtnetlink events failed: {error}; retrying in a second");
                let _ = wake.try_send(());
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(kind: u16, payload: usize) -> Vec<u8> {
        let length = 16 + payload;
        let mut bytes = vec![0u8; (length + 3) & !3];
        bytes[0..4].copy_from_slice(&(length as u32).to_ne_bytes());
        bytes[4..6].copy_from_slice(&kind.to_ne_bytes());
        bytes
    }

    #[test]
    fn every_watched_message_of_a_datagram_is_counted() {
        let mut datagram = message(16, 21);
        datagram.extend(message(24, 8)); // RTM_NEWROUTE: not watched
        datagram.extend(message(21, 8));
        assert_eq!(watched_messages(&datagram), 2);
        assert_eq!(watched_messages(&message(24, 0)), 0);
        assert_eq!(watched_messages(&[1, 2, 3]), 0, "a runt is no message");
    }
}
