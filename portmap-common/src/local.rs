//! Schema of the state for traffic that does not come from outside the
//! node: connections the node itself (or a container, to the node's
//! address) opens to a host port, seen by the cgroup socket hooks, and the
//! packet-level hairpin on container-facing interfaces.

/// The names of the node-local maps in [`crate::maps`], under the path
/// portmap-user reads them from.
pub mod map_names {
    pub use crate::maps::{IFACES, LOCAL_ADDRS, NODE, PEERS, PINNED_LOCAL as ALL, SOCK_ORIGIN};
}

/// Names of the cgroup socket programs.
pub mod program_names {
    pub const CONNECT4: &str = "portmap_connect4";
    pub const CONNECT6: &str = "portmap_connect6";
    pub const SENDMSG4: &str = "portmap_sendmsg4";
    pub const SENDMSG6: &str = "portmap_sendmsg6";
    pub const RECVMSG4: &str = "portmap_recvmsg4";
    pub const RECVMSG6: &str = "portmap_recvmsg6";
    pub const GETPEERNAME4: &str = "portmap_getpeername4";
    pub const GETPEERNAME6: &str = "portmap_getpeername6";
    pub const ALL: [&str; 8] = [
        CONNECT4,
        CONNECT6,
        SENDMSG4,
        SENDMSG6,
        RECVMSG4,
        RECVMSG6,
        GETPEERNAME4,
        GETPEERNAME6,
    ];
}

/// Node-wide settings, written by every ADD.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeConfig {
    /// Network namespace cookie of the node: loopback destinations
    /// (127.0.0.0/8, ::1) are translated only for sockets of this namespace,
    /// never on a container's own loopback.
    pub netns_cookie: u64,
    /// `node_flags`.
    pub flags: u32,
    /// Userspace's record of the state its last sync wrote (a hash of this
    /// config, the local addresses and the interface settings); 0 before
    /// the first. The programs ignore it.
    pub sync_hash: u32,
}

pub mod node_flags {
    /// Masquerade hairpin flows (`snat`, default on).
    pub const SNAT: u32 = 1;
    /// Masquerade every translated flow (`masqAll`).
    pub const MASQ_ALL: u32 = 2;
    /// Hand translated packets straight to the container's interface, and
    /// answers straight to the interface towards the client, skipping the
    /// node's routing, netfilter and bridge (`fastPath`).
    pub const FAST_PATH: u32 = 4;
}

/// One of the node's addresses. A wildcard mapping captures connections to
/// these only: a node process dialling a remote host on a mapped port keeps
/// its connection.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LocalAddrKey {
    pub addr_be: [u32; 4],
    pub family: u8,
    pub _pad0: [u8; 3],
}

/// Settings of one interface the tc programs are attached to.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IfaceConfig {
    /// The node's IPv4 address on this interface (network order), the
    /// masquerade source of hairpin flows that leave through it; 0 if none.
    pub addr4_be: u32,
    /// `iface_flags`.
    pub flags: u32,
    /// Likewise for IPv6; all zero if none.
    pub addr6_be: [u32; 4],
}

pub mod iface_flags {
    /// Containers are behind this interface (bridge, host side of a veth).
    pub const CONTAINER_SIDE: u32 = 1;
}

/// What a socket hook translated for a socket: getpeername and recvmsg show
/// the application the address it dialled, not the container's.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SockOrigin {
    pub dialled_addr_be: [u32; 4],
    pub backend_addr_be: [u32; 4],
    pub dialled_port_be: u16,
    pub backend_port_be: u16,
    pub family: u8,
    pub _pad0: [u8; 3],
}

/// A container address, the key of [`Peer`].
pub type PeerKey = LocalAddrKey;

/// How to hand a packet to a container directly: `bpf_redirect_peer` to
/// the host end of its veth, with the frame addressed as the node's side
/// of the link would address it. Written by ADD from prevResult; used only
/// while `owner_id` is the owner of the mapping that translated the flow,
/// so an entry left behind by a container that is gone is never followed.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Peer {
    pub owner_id: u64,
    /// The host end of the container's veth.
    pub ifindex: u32,
    /// The container interface's MAC (destination of the frame).
    pub container_mac: [u8; 6],
    /// The MAC of the node's side of the link: the bridge, or the host end
    /// of a point-to-point veth (source of the frame).
    pub gateway_mac: [u8; 6],
}

/// Source ports for masqueraded flows: above Linux's default ephemeral range
/// (32768-60999), so they do not collide with the node's own connections.
pub const MASQ_PORT_MIN: u16 = 61000;
pub const MASQ_PORT_COUNT: u16 = 4536;
/// Tries to find a free masquerade port before giving up: the client
/// tuple's own port from its last flow, if any, then random ones.
pub const MASQ_PORT_TRIES: u32 = 8;
/// How long after another client's masqueraded flow closed (FIN both ways)
/// its port is passed over by the first half of the tries: the container may hold
/// the tuple in TIME_WAIT (60 s on Linux), and refuses a SYN whose TCP
/// timestamps are older than the last ones it saw there (every client
/// tuple has its own timestamp offset), with an ACK that costs the client
/// a round trip, a RST and a second SYN.
pub const MASQ_PORT_TIME_WAIT_NS: u64 = 60_000_000_000;
/// How long after another client's masqueraded flow was reset its port is
/// never given to a new flow: the reset is usually the client's answer to
/// such an ACK, and its second SYN, two jiffies later (at most 20 ms), needs
/// the same tuple (the reset ended the TIME_WAIT there). Short, so that
/// the ports held are few even when many flows are reset.
pub const MASQ_PORT_RESET_HOLD_NS: u64 = 100_000_000;

const _: () = {
    assert!(core::mem::size_of::<NodeConfig>() == 16);
    assert!(core::mem::size_of::<LocalAddrKey>() == 20);
    assert!(core::mem::size_of::<IfaceConfig>() == 24);
    assert!(core::mem::size_of::<SockOrigin>() == 40);
    assert!(core::mem::size_of::<Peer>() == 24);
    assert!(MASQ_PORT_MIN as u32 + MASQ_PORT_COUNT as u32 - 1 == 65535);
};

#[cfg(feature = "user")]
mod pod {
    use super::*;

    macro_rules! pod {
        ($($ty:ty),* $(,)?) => {$(
            // SAFETY: repr(C) integers and arrays with explicit padding fields.
            unsafe impl aya::Pod for $ty {}
        )*};
    }

    pod!(NodeConfig, LocalAddrKey, IfaceConfig, SockOrigin, Peer,);
}
