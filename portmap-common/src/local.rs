//! Schema of the state for traffic that does not come from outside the
//! node: connections the node itself (or a container, to the node's
//! address) opens to a host port, seen by the cgroup socket hooks, and the
//! packet-level hairpin on container-facing interfaces.

/// The names of the node-local maps in [`crate::maps`], under the path
/// portmap-user reads them from.
pub mod map_names {
    pub use crate::maps::{
        CONTAINER_NETNS, IFACES, LOCAL_ADDRS, MASQ_OWNERS, NODE, PEERS, PINNED_LOCAL as ALL,
        SOCK_COUNTERS, SOCK_ORIGIN,
    };
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
    /// node's routing, netfilter and bridge, for every translated flow
    /// (`fastPath: true`).
    pub const FAST_PATH: u32 = 4;
    /// The same hand-over, only for flows the kernel's conntrack holds as
    /// confirmed: their first packets take the normal path through
    /// netfilter, so the node's firewall decides each new flow (`fastPath`
    /// unset, on a kernel with the conntrack kfuncs). Ignored when
    /// [`FAST_PATH`] is set; neither: the normal path (`fastPath: false`).
    pub const FAST_CONFIRMED: u32 = 8;
    /// `fastPath: false` was asked: the programs ignore it (neither bit
    /// above is set); `status` reads it to tell why.
    pub const FAST_PATH_OFF: u32 = 16;
    /// With [`FAST_PATH`]: set by the fallback of the default on a kernel
    /// without the conntrack kfuncs, because nothing was hooked at FORWARD
    /// (userspace only, for `status`).
    pub const FAST_UNHOOKED: u32 = 32;
    /// The default on a kernel without the conntrack kfuncs, with
    /// something hooked at FORWARD: the normal path (userspace only, for
    /// `status`).
    pub const FAST_FORWARD_HOOKED: u32 = 64;
    /// New TCP and UDP flows of IPv4 from outside are translated by the
    /// node's netfilter (see `knat`): the kfuncs that make a kernel
    /// conntrack entry with its NAT are linked, and netfilter's NAT hooks
    /// of IPv4 are registered in the node's namespace (without them the
    /// kernel applies no entry's NAT). Unset: translated in tc.
    pub const KERNEL_NAT4: u32 = 128;
    /// The same for IPv6.
    pub const KERNEL_NAT6: u32 = 256;
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
    /// A bridge port (a pod's veth) carrying the ingress program: a packet
    /// it handled is marked, and the bridge's own ingress leaves it alone.
    /// Its bridge's index is kept in the upper bits ([`with_bridge`]).
    pub const BRIDGE_PORT: u32 = 2;
    const BRIDGE_SHIFT: u32 = 8;

    /// A bridge port's flags naming its bridge, whose index a flow's
    /// conditions are judged by on the port (as netfilter's `-i` names the
    /// bridge for a frame `br_netfilter` passes up); an index too large to
    /// keep (2^24 and over) is kept as 0, which no condition names.
    pub const fn with_bridge(bridge: u32) -> u32 {
        let kept = if bridge < 1 << (32 - BRIDGE_SHIFT) {
            bridge
        } else {
            0
        };
        BRIDGE_PORT | kept << BRIDGE_SHIFT
    }

    /// The bridge a port's flags name (see [`with_bridge`]).
    pub const fn bridge_of(flags: u32) -> u32 {
        flags >> BRIDGE_SHIFT
    }
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

/// What the socket hooks translated for one mapping (key:
/// [`crate::CounterKey`], as the packet counters): the node's own
/// connections never cross a tc hook, so without these they would show in
/// no per-mapping number. Per CPU (the hooks add to their CPU's copy;
/// readers sum them).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SockCounters {
    /// connect() calls pointed at the container (TCP, SCTP, connected UDP).
    pub connects: u64,
    /// sendmsg() calls with a destination pointed at the container
    /// (unconnected UDP: one per datagram).
    pub sendmsgs: u64,
}

/// Name of the userspace twin of [`crate::maps::CONTAINER_NETNS`]: owner
/// ID -> [`NetnsRegistration`]. The programs never read it; userspace
/// creates it on the first ADD with `containerSockets` (like
/// [`crate::OWNER_PODS_MAP`]). ADD writes it before the registration, so
/// a registration always has a record that names its container: DEL finds
/// the cookie by owner (the second DEL has no `CNI_NETNS`), CNI GC by
/// network and container.
pub const OWNER_NETNS_MAP: &str = "owner_netns";

/// What an owner registered in [`crate::maps::CONTAINER_NETNS`]: the
/// cookie, and whose it is.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NetnsRegistration {
    /// The container's network namespace cookie (`SO_NETNS_COOKIE`).
    pub netns_cookie: u64,
    /// The attachment (network, container ID, interface), as in `owners`.
    pub owner: crate::OwnerRecord,
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
/// tuple's own port from its last flow, if any, then random ones. All but
/// the last pass over a port another client had less than a TIME_WAIT ago
/// (see [`MasqOwner`]).
pub const MASQ_PORT_TRIES: u32 = 16;
/// The longest a container may hold a closed tuple in TIME_WAIT: Linux
/// arms a 60 s timer (`TCP_TIMEWAIT_LEN`), and its timer wheel fires a
/// timer that far out up to one bucket late, never early: 512 jiffies at
/// HZ 100 to 300 (5.12 s at HZ=100, 2.05 s at HZ=250), 4096 jiffies at
/// HZ=1000 (4.1 s); 66 s covers them all. A container refuses a SYN there
/// whose TCP timestamps are older than the last ones it saw (every client
/// tuple has its own timestamp offset), with an ACK that costs the client
/// a round trip, a RST and a second SYN two jiffies later. Measured: a
/// second pod dialling from the first one's ports 59.5-60.5 s after it,
/// with 60 s here, had 59 of 868 SYNs refused (`TcpExtPAWSTimewait`).
///
/// Also how long after another client's masqueraded flow closed (FIN
/// both ways) its port is passed over by the first half of the tries.
pub const MASQ_PORT_TIME_WAIT_NS: u64 = 66_000_000_000;
/// How long after another client's masqueraded flow was reset its port is
/// never given to a new flow: the reset is usually the client's answer to
/// such an ACK, and its second SYN, two jiffies later (at most 20 ms), needs
/// the same tuple (the reset ended the TIME_WAIT there). Short, so that
/// the ports held are few even when many flows are reset.
pub const MASQ_PORT_RESET_HOLD_NS: u64 = 100_000_000;

/// The last client of a masquerade tuple (a slot of `masq_owners`): a
/// container holds the tuples it closed in TIME_WAIT for 60 s and takes a
/// new SYN there only with TCP timestamps newer than the last it saw (or a
/// later sequence). Linux (6.18) derives a connection's timestamp offset
/// from its whole 4-tuple, ports included, so only the client tuple that
/// had a masquerade tuple last is sure to bring newer ones; any other is
/// refused half the time (an ACK, the client's RST, its SYN again two
/// jiffies later: 8 ms at HZ=250), until the TIME_WAIT is over.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MasqOwner {
    /// [`masq_client_tag`] of the client tuple; 0: never used.
    pub client: u32,
    /// When the tuple was given to it: the coarse clock in units of 2^30 ns
    /// (about 1.07 s), wrapping.
    pub since: u32,
}

/// [`MasqOwner::since`] of the clock `now_ns`.
#[inline(always)]
pub const fn masq_owner_time(now_ns: u64) -> u32 {
    (now_ns >> 30) as u32
}

/// How long, in [`MasqOwner::since`] units, a tuple stays its last client's
/// after it was given: at least a whole [`MASQ_PORT_TIME_WAIT_NS`]. `since`
/// is the clock rounded down, so a claim made just before a unit ends has
/// held for a unit less than it counts: hence one unit more than the
/// TIME_WAIT rounded up.
pub const MASQ_OWNER_HOLD: u32 = masq_owner_time(MASQ_PORT_TIME_WAIT_NS) + 2;

/// A nonzero tag of the client end (`addr_be`, `port_be`) of `family`.
#[inline(always)]
pub fn masq_client_tag(family: u8, addr_be: &[u32; 4], port_be: u16) -> u32 {
    let mut h = (u32::from(family) << 16 | u32::from(port_be)).wrapping_mul(0x9e37_79b1);
    let mut i = 0;
    while i < 4 {
        h = (h ^ addr_be[i]).wrapping_mul(0x85eb_ca6b);
        h ^= h >> 15;
        i += 1;
    }
    h | 1
}

/// Ports a TCP client tuple is moved to when its own is another's
/// (host order): below Linux's default ephemeral range and above it, so
/// that moved tuples leave the clients' own ports to their owners.
pub const MASQ_PROBE_LOW: (u16, u16) = (1024, 32768 - 1024);
pub const MASQ_PROBE_HIGH: (u16, u16) = (MASQ_PORT_MIN, MASQ_PORT_COUNT);

/// The `attempt`th port (host order) a TCP client tuple tagged `client`
/// tries when its own is taken: a sequence fixed per client tuple, so that
/// its next flow finds the port it had (owned by it, see [`MasqOwner`])
/// again without any memory of its own, as open addressing does.
#[inline(always)]
pub fn masq_probe_port(client: u32, attempt: u32) -> u16 {
    let mut h = (client ^ attempt.wrapping_mul(0x27d4_eb2f)).wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^= h >> 16;
    let low = u32::from(MASQ_PROBE_LOW.1);
    let x = h % (low + u32::from(MASQ_PROBE_HIGH.1));
    if x < low {
        MASQ_PROBE_LOW.0 + x as u16
    } else {
        MASQ_PROBE_HIGH.0 + (x - low) as u16
    }
}

/// The `masq_owners` slot of the masquerade tuple (node address, `port`)
/// -> (`container_be`, `container_port_be`): the container end picks a
/// window of 65 536 slots, the port its place in it, so the tuples of one
/// container port never share a slot; windows of different container
/// ports overlap (a lost owner costs at most one refused SYN).
#[inline(always)]
pub fn masq_owner_slot(
    family: u8,
    container_be: &[u32; 4],
    container_port_be: u16,
    port: u16,
) -> u32 {
    let window = masq_client_tag(family, container_be, container_port_be);
    let window = window.wrapping_mul(0x9e37_79b1) >> 14;
    (window.wrapping_add(u32::from(port))) & (crate::capacity::MASQ_OWNERS - 1)
}

const _: () = {
    assert!(core::mem::size_of::<NodeConfig>() == 16);
    assert!(core::mem::size_of::<MasqOwner>() == 8);
    assert!(crate::capacity::MASQ_OWNERS.is_power_of_two());
    assert!(MASQ_PROBE_LOW.0 as u32 + MASQ_PROBE_LOW.1 as u32 == 32768);
    assert!(core::mem::size_of::<LocalAddrKey>() == 20);
    assert!(core::mem::size_of::<IfaceConfig>() == 24);
    assert!(core::mem::size_of::<SockOrigin>() == 40);
    assert!(core::mem::size_of::<SockCounters>() == 16);
    assert!(core::mem::size_of::<Peer>() == 24);
    assert!(
        core::mem::size_of::<NetnsRegistration>() == 8 + core::mem::size_of::<crate::OwnerRecord>()
    );
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

    pod!(
        NodeConfig,
        LocalAddrKey,
        IfaceConfig,
        SockOrigin,
        SockCounters,
        Peer,
        MasqOwner,
        NetnsRegistration,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ports_of_one_container_port_never_share_a_slot() {
        let container = [0x0a58_0002u32.to_be(), 0, 0, 0];
        let mut seen = [0u64; crate::capacity::MASQ_OWNERS as usize / 64];
        for port in 0..=u16::MAX {
            let slot = masq_owner_slot(crate::FAMILY_V4, &container, 80u16.to_be(), port);
            assert!(
                slot < crate::capacity::MASQ_OWNERS,
                "slot {slot} out of the map"
            );
            let (word, bit) = (slot as usize / 64, 1u64 << (slot % 64));
            assert!(seen[word] & bit == 0, "port {port} shares slot {slot}");
            seen[word] |= bit;
        }
    }

    #[test]
    fn client_tags_are_nonzero_and_tell_addresses_apart() {
        let addr = [0x0a58_0002u32.to_be(), 0, 0, 0];
        let a = masq_client_tag(crate::FAMILY_V4, &addr, 40000u16.to_be());
        let b = masq_client_tag(
            crate::FAMILY_V4,
            &[0x0a58_0003u32.to_be(), 0, 0, 0],
            40000u16.to_be(),
        );
        let c = masq_client_tag(crate::FAMILY_V6, &addr, 40000u16.to_be());
        let d = masq_client_tag(crate::FAMILY_V4, &addr, 40001u16.to_be());
        assert!(a != 0 && b != 0 && c != 0 && d != 0);
        assert!(a != b && a != c && a != d, "{a:#x} {b:#x} {c:#x} {d:#x}");
    }

    #[test]
    fn probe_ports_stay_out_of_the_ephemeral_range_and_spread() {
        let mut low = 0;
        let mut seen = [0u64; 1024];
        for client in 0..64u32 {
            for attempt in 0..16 {
                let port = masq_probe_port(client.wrapping_mul(0x9e37_79b1) | 1, attempt);
                assert!(
                    (1024..32768).contains(&port) || port >= MASQ_PORT_MIN,
                    "port {port} of client {client}, attempt {attempt}"
                );
                low += u32::from(port < 32768);
                seen[port as usize / 64] |= 1 << (port % 64);
            }
        }
        // 1024 draws: about 7/8 below the ephemeral range, and few repeats.
        assert!((800..990).contains(&low), "{low} of 1024 below 32768");
        let distinct: u32 = seen.iter().map(|w| w.count_ones()).sum();
        assert!(distinct > 1000, "{distinct} distinct ports of 1024 draws");
    }

    #[test]
    fn an_owner_holds_a_tuple_for_a_whole_time_wait() {
        // A claim at the end of a unit and the check at the start of the
        // unit HOLD later: the shortest hold. It must outlast the longest
        // TIME_WAIT (60 s and the timer wheel's slack, 5.12 s at HZ=100).
        let shortest_ns = u64::from(MASQ_OWNER_HOLD - 1) << 30;
        assert!(shortest_ns >= 65_120_000_000, "{shortest_ns}");
        assert!(shortest_ns >= MASQ_PORT_TIME_WAIT_NS, "{shortest_ns}");
        // And by the clock's own reading (claim and check at exact times).
        for claimed_ns in (0..4u64).map(|i| (1 << 30) * 1000 + i * (1 << 28) + (1 << 28) - 1) {
            let since = masq_owner_time(claimed_ns);
            let mut now_ns = claimed_ns;
            while masq_owner_time(now_ns).wrapping_sub(since) < MASQ_OWNER_HOLD {
                now_ns += 1_000_000;
            }
            let held_ns = now_ns - claimed_ns;
            assert!(
                held_ns >= MASQ_PORT_TIME_WAIT_NS,
                "claimed at {claimed_ns}: held {held_ns} ns"
            );
            assert!(
                held_ns < MASQ_PORT_TIME_WAIT_NS + 3_000_000_000,
                "claimed at {claimed_ns}: held {held_ns} ns, ports stay taken longer than needed"
            );
        }
    }
}
