//! cgroup socket hooks: hostPort translation at the socket for connections
//! that start on the node (processes of the hooked cgroup in the node's own
//! network namespace) and so never cross a tc hook on the way in, and,
//! with `containerSockets`, for the node's containers dialling one of the
//! node's addresses (their namespaces registered by ADD in
//! `container_netns`). No packet is rewritten: connect()
//! and sendmsg() are pointed at the container, getpeername() and recvmsg()
//! show the application the address it dialled.
//!
//! The hooks fail open: whatever they cannot decide, they leave alone, and
//! every skip is counted.

use aya_ebpf::{
    helpers::bpf_get_netns_cookie, macros::cgroup_sock_addr, programs::SockAddrContext,
};
use portmap_common::{
    FAMILY_V4, FAMILY_V6, MappingKey, MappingValue, PROTO_SCTP, PROTO_TCP, PROTO_UDP, PortRole,
    local::SockOrigin, stat, trace_direction,
};

use crate::{
    counters::{self, Hook},
    maps, parse, trace,
};

/// Allow the operation (the only verdict these hooks give).
const ALLOW: i32 = 1;
const SOCK_STREAM: u32 = 1;
const SOCK_DGRAM: u32 = 2;

#[cgroup_sock_addr(connect4)]
pub fn portmap_connect4(ctx: SockAddrContext) -> i32 {
    translate(&ctx, FAMILY_V4, Hook::Connect);
    ALLOW
}

#[cgroup_sock_addr(connect6)]
pub fn portmap_connect6(ctx: SockAddrContext) -> i32 {
    translate(&ctx, FAMILY_V6, Hook::Connect);
    ALLOW
}

#[cgroup_sock_addr(sendmsg4)]
pub fn portmap_sendmsg4(ctx: SockAddrContext) -> i32 {
    translate(&ctx, FAMILY_V4, Hook::Sendmsg);
    ALLOW
}

#[cgroup_sock_addr(sendmsg6)]
pub fn portmap_sendmsg6(ctx: SockAddrContext) -> i32 {
    translate(&ctx, FAMILY_V6, Hook::Sendmsg);
    ALLOW
}

#[cgroup_sock_addr(recvmsg4)]
pub fn portmap_recvmsg4(ctx: SockAddrContext) -> i32 {
    restore(&ctx, FAMILY_V4);
    ALLOW
}

#[cgroup_sock_addr(recvmsg6)]
pub fn portmap_recvmsg6(ctx: SockAddrContext) -> i32 {
    restore(&ctx, FAMILY_V6);
    ALLOW
}

#[cgroup_sock_addr(getpeername4)]
pub fn portmap_getpeername4(ctx: SockAddrContext) -> i32 {
    restore(&ctx, FAMILY_V4);
    ALLOW
}

#[cgroup_sock_addr(getpeername6)]
pub fn portmap_getpeername6(ctx: SockAddrContext) -> i32 {
    restore(&ctx, FAMILY_V6);
    ALLOW
}

/// An address as the hook sees it: IPv4 (also an IPv4-mapped IPv6 address
/// on a dual-stack socket) or IPv6, in our four-word form.
#[derive(Clone, Copy)]
struct Endpoint {
    family: u8,
    addr_be: [u32; 4],
    port_be: u16,
    /// The socket is IPv6 but the address is IPv4-mapped (::ffff:a.b.c.d).
    mapped: bool,
}

const V4_MAPPED_PREFIX_BE: u32 = u32::from_be_bytes([0, 0, 0xff, 0xff]);

#[inline(always)]
fn read_endpoint(ctx: &SockAddrContext, socket_family: u8) -> Endpoint {
    let sa = ctx.sock_addr;
    // SAFETY: the kernel hands a valid context; 4-byte volatile reads are
    // what the verifier accepts for these fields.
    unsafe {
        let port_be = core::ptr::read_volatile(&raw const (*sa).user_port) as u16;
        if socket_family == FAMILY_V4 {
            let ip = core::ptr::read_volatile(&raw const (*sa).user_ip4);
            return Endpoint {
                family: FAMILY_V4,
                addr_be: [ip, 0, 0, 0],
                port_be,
                mapped: false,
            };
        }
        let w0 = core::ptr::read_volatile(&raw const (*sa).user_ip6[0]);
        let w1 = core::ptr::read_volatile(&raw const (*sa).user_ip6[1]);
        let w2 = core::ptr::read_volatile(&raw const (*sa).user_ip6[2]);
        let w3 = core::ptr::read_volatile(&raw const (*sa).user_ip6[3]);
        if w0 == 0 && w1 == 0 && w2 == V4_MAPPED_PREFIX_BE {
            Endpoint {
                family: FAMILY_V4,
                addr_be: [w3, 0, 0, 0],
                port_be,
                mapped: true,
            }
        } else {
            Endpoint {
                family: FAMILY_V6,
                addr_be: [w0, w1, w2, w3],
                port_be,
                mapped: false,
            }
        }
    }
}

/// The destination port the socket dials (network order).
#[inline(always)]
fn read_port(ctx: &SockAddrContext) -> u16 {
    // SAFETY: as in read_endpoint.
    unsafe { core::ptr::read_volatile(&raw const (*ctx.sock_addr).user_port) as u16 }
}

#[inline(always)]
fn write_endpoint(ctx: &SockAddrContext, socket_family: u8, endpoint: &Endpoint) {
    // Read afresh (volatile): otherwise LLVM keeps `&user_port` from
    // read_endpoint in a register across the calls in between, and the
    // verifier refuses a context pointer with an offset ("dereference of
    // modified ctx ptr").
    // SAFETY: reading a field of a reference.
    let sa = unsafe { core::ptr::read_volatile(&raw const ctx.sock_addr) };
    // SAFETY: as in read_endpoint; these fields are writable in these hooks.
    unsafe {
        core::ptr::write_volatile(&raw mut (*sa).user_port, u32::from(endpoint.port_be));
        if socket_family == FAMILY_V4 {
            core::ptr::write_volatile(&raw mut (*sa).user_ip4, endpoint.addr_be[0]);
        } else if endpoint.mapped {
            core::ptr::write_volatile(&raw mut (*sa).user_ip6[0], 0);
            core::ptr::write_volatile(&raw mut (*sa).user_ip6[1], 0);
            core::ptr::write_volatile(&raw mut (*sa).user_ip6[2], V4_MAPPED_PREFIX_BE);
            core::ptr::write_volatile(&raw mut (*sa).user_ip6[3], endpoint.addr_be[0]);
        } else {
            core::ptr::write_volatile(&raw mut (*sa).user_ip6[0], endpoint.addr_be[0]);
            core::ptr::write_volatile(&raw mut (*sa).user_ip6[1], endpoint.addr_be[1]);
            core::ptr::write_volatile(&raw mut (*sa).user_ip6[2], endpoint.addr_be[2]);
            core::ptr::write_volatile(&raw mut (*sa).user_ip6[3], endpoint.addr_be[3]);
        }
    }
}

#[inline(always)]
fn protocol(ctx: &SockAddrContext) -> Option<u8> {
    // SAFETY: reading fields of the context the program was handed.
    let (protocol, kind) = unsafe { ((*ctx.sock_addr).protocol, (*ctx.sock_addr).type_) };
    match protocol as u8 {
        PROTO_TCP | PROTO_UDP | PROTO_SCTP => Some(protocol as u8),
        0 if kind == SOCK_STREAM => Some(PROTO_TCP),
        0 if kind == SOCK_DGRAM => Some(PROTO_UDP),
        _ => None,
    }
}

/// Whose socket the hooks translate.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Dialler {
    /// A socket of the node's own network namespace.
    Node,
    /// A socket of a container's namespace that this node registered
    /// (`containerSockets`, the `container_netns` map).
    Container,
}

/// The mapping a socket dialling `endpoint` means, if any, and whose
/// socket it is.
///
/// Only for sockets of the node's own network namespace, and of the
/// containers' namespaces this node registered (`containerSockets`),
/// whatever the destination. The hooked cgroup (the cgroup2 root when
/// `cgroupPath` is unset) also holds processes of other namespaces:
/// containers without the option, and other nodes sharing the kernel
/// (kind, nested labs, a client namespace joined by a veth). Pointed at a
/// container's address, their sockets would dial what their own namespace
/// may not route to; left alone, they reach a host port as any client
/// does, by the packet path (tc on the interface they arrive on; a
/// container's, masqueraded with `snat`).
///
/// The node's namespace is checked first, so its `connect()` pays no
/// lookup more than before; only other namespaces look in
/// `container_netns`.
#[inline(always)]
fn mapping_for(
    ctx: &SockAddrContext,
    endpoint: &Endpoint,
    proto: u8,
) -> Option<(MappingKey, MappingValue, Dialler)> {
    let node = maps::node_config()?;
    // SAFETY: the helper only reads the context.
    let cookie = unsafe { bpf_get_netns_cookie(ctx.sock_addr.cast()) };
    let dialler = if node.netns_cookie != 0 && cookie == node.netns_cookie {
        Dialler::Node
    } else if maps::is_container_netns(cookie) {
        Dialler::Container
    } else {
        maps::count(stat::SOCK_OTHER_NETNS);
        return None;
    };
    let loopback = parse::is_loopback(endpoint.family, &endpoint.addr_be);
    // A container's loopback is its own, never the node's: not even a
    // mapping with hostIP 127.0.0.1 is reached through it.
    if loopback && dialler == Dialler::Container {
        maps::count(stat::SOCK_NOT_LOCAL);
        return None;
    }
    let (key, value) =
        maps::find_mapping(endpoint.family, proto, &endpoint.addr_be, endpoint.port_be)?;
    // Only the node's own addresses, as upstream's OUTPUT DNAT requires
    // `--dst-type LOCAL` (loopback is the node's here: a container's was
    // left above): a wildcard covers them, and an exact hostIP only while
    // it is one, as on the packet path. An exact hostIP that is another
    // host's address would otherwise take the node's connections and
    // datagrams to that host (its DNS, a probe of another pod's port).
    if loopback || maps::is_local_addr(endpoint.family, &endpoint.addr_be) {
        Some((key, value, dialler))
    } else {
        maps::count(stat::SOCK_NOT_LOCAL);
        None
    }
}

/// Whether the node's own connection to `dialled` meets the conditions of
/// the mapping's owner (see `portmap_common::conditions`), judged as
/// upstream's `OUTPUT` rule judges it: no input interface, the dialled
/// address as destination, and as source the address the kernel gives an
/// unbound socket towards a node address (that address itself; 127.0.0.1
/// for the rest of 127.0.0.0/8). A socket bound to another source is judged
/// as unbound: the hook runs before the kernel picks a source, and a
/// client that binds one towards its own node is rare. A missing entry
/// admits nothing; a connection not admitted is left alone, and with no
/// listener of the node behind the dialled port it is refused, as by a
/// node without the mapping.
#[inline(always)]
fn meets_conditions(dialled: &Endpoint, proto: u8, owner_id: u64) -> bool {
    let Some(conditions) = maps::conditions_of(owner_id, dialled.family) else {
        return false;
    };
    let source = if dialled.family == FAMILY_V4 && parse::is_loopback(FAMILY_V4, &dialled.addr_be) {
        [u32::from_ne_bytes([127, 0, 0, 1]), 0, 0, 0]
    } else {
        dialled.addr_be
    };
    conditions.admits(proto, &source, &dialled.addr_be, 0)
}

#[inline(always)]
fn translate(ctx: &SockAddrContext, socket_family: u8, hook: Hook) {
    let Some(proto) = protocol(ctx) else {
        return;
    };
    // A port no mapping has: the socket is left alone after one array
    // load, before the namespace check and the mapping lookups (every
    // connect() and sendmsg() of the hooked cgroup comes here). The
    // address is read only after it: nothing lives across the filter's
    // lookup but the context, so that exit spills nothing to the stack.
    if !maps::port_is(PortRole::Host, proto, read_port(ctx)) {
        return;
    }
    let dialled = read_endpoint(ctx, socket_family);
    let Some((key, mapping, dialler)) = mapping_for(ctx, &dialled, proto) else {
        return;
    };
    // A container's connection meets upstream's conditions in PREROUTING,
    // from its own address and interface, which the socket does not know
    // yet: the packet path judges it there.
    if mapping.conditions != 0 && dialler == Dialler::Container {
        maps::count(stat::SOCK_OTHER_NETNS);
        return;
    }
    if mapping.conditions != 0 && !meets_conditions(&dialled, proto, mapping.owner_id) {
        maps::count(stat::SKIP_CONDITIONS);
        return;
    }
    let backend = Endpoint {
        family: dialled.family,
        addr_be: mapping.container_addr_be,
        port_be: mapping.container_port_be,
        mapped: dialled.mapped,
    };
    let origin = SockOrigin {
        dialled_addr_be: dialled.addr_be,
        backend_addr_be: backend.addr_be,
        dialled_port_be: dialled.port_be,
        backend_port_be: backend.port_be,
        family: dialled.family,
        _pad0: [0; 3],
    };
    // Remember first, so getpeername/recvmsg can always undo what we do.
    if !maps::remember_origin(ctx, &origin) {
        maps::count(stat::SOCK_NO_STORAGE);
        return;
    }
    write_endpoint(ctx, socket_family, &backend);
    maps::count(stat::SOCK_TRANSLATED);
    // Per mapping, and for `trace`: the node's own connections cross no tc
    // hook, so this is where `list` and `trace` learn of them.
    counters::record_sock(&key, mapping.owner_id, hook);
    let direction = match hook {
        Hook::Connect => trace_direction::SOCK_CONNECT,
        Hook::Sendmsg => trace_direction::SOCK_SENDMSG,
    };
    trace::sock_translated(direction, proto, &origin);
}

#[inline(always)]
fn restore(ctx: &SockAddrContext, socket_family: u8) {
    let Some(origin) = maps::origin(ctx) else {
        return;
    };
    let seen = read_endpoint(ctx, socket_family);
    if seen.family != origin.family
        || seen.addr_be != origin.backend_addr_be
        || seen.port_be != origin.backend_port_be
    {
        return;
    }
    let dialled = Endpoint {
        family: origin.family,
        addr_be: origin.dialled_addr_be,
        port_be: origin.dialled_port_be,
        mapped: seen.mapped,
    };
    write_endpoint(ctx, socket_family, &dialled);
}
