//! The map schema shared by the eBPF programs and userspace.
//!
//! Every struct that crosses the kernel boundary is defined here exactly once:
//! `#[repr(C)]`, explicit padding, and a compile-time size check, so the two
//! sides can never disagree on a layout. Network-order fields end in `_be`.
//! Addresses are always four `u32` words in network order; an IPv4 address
//! uses the first word and leaves the rest zero.
#![no_std]

pub mod conditions;
pub mod cpus;
pub mod crc32c;
pub mod fnv;
pub mod local;
pub mod maps;
pub mod reason;
// Host code (std): not a feature, so that every selection of the
// workspace's packages resolves portmap-common alike and cargo builds each
// dependency once.
#[cfg(not(target_arch = "bpf"))]
pub mod sources;

pub use reason::stat;

/// Version of the pinned layout. A change to any struct or map below bumps it,
/// so a new build never reads maps written with an old layout (they live under
/// a different `v{N}` directory).
pub const LAYOUT_VERSION: u32 = 1;

/// The names of [`maps`] under the path portmap-user reads them from.
pub mod map_names {
    pub use crate::maps::{
        CONNTRACK, CONNTRACK_CLOSED, CONNTRACK_NEW, CONNTRACK_OTHER, COUNTERS, CT_LEDGER,
        MAPPED_PORTS, MAPPINGS, MAPPINGS_EPOCH, OWNER_SLOTS, OWNERS, PINNED as ALL, STATS,
        TRACE_EVENTS, TRACE_FILTER,
    };
}

/// Names of the programs in the object.
pub mod program_names {
    pub const TC_INGRESS: &str = "portmap_ingress";
    pub const TC_EGRESS: &str = "portmap_egress";
    /// The socket-lookup program whose link on the node's network namespace
    /// tells whether that namespace still exists (see `stale` in
    /// portmap-user's dataplane).
    pub const NETNS_BEACON: &str = "portmap_netns_beacon";
}

pub use maps::capacity;

pub const FAMILY_V4: u8 = 4;
pub const FAMILY_V6: u8 = 6;

pub const PROTO_TCP: u8 = 6;
pub const PROTO_UDP: u8 = 17;
pub const PROTO_SCTP: u8 = 132;

/// Key of a port mapping: which traffic arriving at the node it captures.
/// `host_addr_be` all zero is the wildcard of `family` (every local address).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MappingKey {
    pub host_addr_be: [u32; 4],
    pub host_port_be: u16,
    pub proto: u8,
    pub family: u8,
}

/// Where a mapping sends traffic, and who owns it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MappingValue {
    pub container_addr_be: [u32; 4],
    pub container_port_be: u16,
    /// [`conditions::HAS_CONDITIONS`] when a new flow must meet its owner's
    /// conditions for this family first; 0 for none. Was padding (always 0)
    /// in builds before the conditions, whose mappings read as "none".
    pub conditions: u16,
    pub _pad1: u32,
    /// Hash of the owner identity; the full identity is in `owners`.
    pub owner_id: u64,
}

/// Longest network name and container ID kept verbatim in an owner record.
/// ADD refuses longer ones; builds before that stored them cut, which the
/// owner ID (a hash of the full strings) still tells apart.
pub const OWNER_NAME_LEN: usize = 128;
pub const OWNER_IFNAME_LEN: usize = 16;

/// The identity behind an `owner_id`, for collision checks, GC and display.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OwnerRecord {
    pub network: [u8; OWNER_NAME_LEN],
    pub container_id: [u8; OWNER_NAME_LEN],
    pub ifname: [u8; OWNER_IFNAME_LEN],
    pub network_len: u16,
    pub container_id_len: u16,
    pub ifname_len: u16,
    /// [`owner_flags`]. Was padding (always 0) in builds before the flags, so
    /// their records read as "no flag set".
    pub flags: u16,
    /// Wall-clock seconds since the Unix epoch of the first ADD.
    pub created_unix: u64,
}

/// Bits of [`OwnerRecord::flags`].
pub mod owner_flags {
    /// A DEL or GC is removing this owner: set (one atomic update) before it
    /// reads the owner's index, so an ADD of the same owner still running
    /// sees it at its final check and removes what it wrote itself, instead
    /// of leaving mappings that nobody owns (portmap-user's store.rs).
    pub const DYING: u16 = 1;
}

impl Default for OwnerRecord {
    fn default() -> Self {
        Self {
            network: [0; OWNER_NAME_LEN],
            container_id: [0; OWNER_NAME_LEN],
            ifname: [0; OWNER_IFNAME_LEN],
            network_len: 0,
            container_id_len: 0,
            ifname_len: 0,
            flags: 0,
            created_unix: 0,
        }
    }
}

/// Name of the map holding each owner's [`PodRecord`] (key: the owner ID).
/// Not in [`map_names::ALL`]: the eBPF object does not declare it, userspace
/// creates it on the first ADD that needs it, so that pins made by a build
/// without it (whose `owners` map has the same layout) keep working as they
/// are; see portmap-user's store.rs.
pub const OWNER_PODS_MAP: &str = "owner_pods";

/// Longest pod namespace kept (Kubernetes allows 63 bytes).
pub const POD_NAMESPACE_LEN: usize = 64;
/// Longest pod name kept (Kubernetes allows 253 bytes).
pub const POD_NAME_LEN: usize = 256;
/// Longest Nomad allocation ID, namespace, job ID or group name kept.
pub const NOMAD_FIELD_LEN: usize = 128;

/// Who an owner is to the orchestrator, from CNI_ARGS: a Kubernetes pod
/// (`K8S_POD_NAMESPACE`, `K8S_POD_NAME`) or a Nomad allocation
/// (`NOMAD_ALLOC_ID`, `NOMAD_NAMESPACE`, `NOMAD_JOB_ID`, `NOMAD_GROUP_NAME`).
/// Userspace only, for display. A length of 0 means not given.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PodRecord {
    pub pod_namespace: [u8; POD_NAMESPACE_LEN],
    pub pod_name: [u8; POD_NAME_LEN],
    pub nomad_alloc_id: [u8; NOMAD_FIELD_LEN],
    pub nomad_namespace: [u8; NOMAD_FIELD_LEN],
    pub nomad_job: [u8; NOMAD_FIELD_LEN],
    pub nomad_group: [u8; NOMAD_FIELD_LEN],
    pub pod_namespace_len: u16,
    pub pod_name_len: u16,
    pub nomad_alloc_id_len: u16,
    pub nomad_namespace_len: u16,
    pub nomad_job_len: u16,
    pub nomad_group_len: u16,
    pub _pad0: u32,
}

impl Default for PodRecord {
    fn default() -> Self {
        Self {
            pod_namespace: [0; POD_NAMESPACE_LEN],
            pod_name: [0; POD_NAME_LEN],
            nomad_alloc_id: [0; NOMAD_FIELD_LEN],
            nomad_namespace: [0; NOMAD_FIELD_LEN],
            nomad_job: [0; NOMAD_FIELD_LEN],
            nomad_group: [0; NOMAD_FIELD_LEN],
            pod_namespace_len: 0,
            pod_name_len: 0,
            nomad_alloc_id_len: 0,
            nomad_namespace_len: 0,
            nomad_job_len: 0,
            nomad_group_len: 0,
            _pad0: 0,
        }
    }
}

/// Name of the map holding each owner's [`SandboxRecord`] (key: the owner
/// ID): what proves its container alive, and the pod UID. Userspace only,
/// created like [`OWNER_PODS_MAP`] by the first ADD of a build that records
/// it; owners added by an older build have none (no proof either way).
pub const OWNER_SANDBOXES_MAP: &str = "owner_sandboxes";

/// Longest `CNI_NETNS` path kept (a longer one is not recorded: no proof).
pub const NETNS_PATH_LEN: usize = 256;
/// Longest `K8S_POD_UID` kept (a Kubernetes UID is 36 bytes).
pub const POD_UID_LEN: usize = 64;

/// An owner's sandbox as ADD saw it: the network namespace path the runtime
/// gave (`CNI_NETNS`), the identity (device, inode) of the nsfs file at that
/// path, the identity of the mount namespace the path was resolved in, and
/// the pod's `K8S_POD_UID`. `gone_since` is the Unix time a GC (agent or
/// `ebpf-portmap gc`) first found the namespace gone, 0 while it was not.
/// Userspace only. A length or identity of 0 means not known.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SandboxRecord {
    pub netns_path: [u8; NETNS_PATH_LEN],
    pub pod_uid: [u8; POD_UID_LEN],
    pub netns_dev: u64,
    pub netns_ino: u64,
    pub mntns_dev: u64,
    pub mntns_ino: u64,
    pub gone_since: u64,
    pub netns_path_len: u16,
    pub pod_uid_len: u16,
    pub _pad0: u32,
}

impl Default for SandboxRecord {
    fn default() -> Self {
        Self {
            netns_path: [0; NETNS_PATH_LEN],
            pod_uid: [0; POD_UID_LEN],
            netns_dev: 0,
            netns_ino: 0,
            mntns_dev: 0,
            mntns_ino: 0,
            gone_since: 0,
            netns_path_len: 0,
            pod_uid_len: 0,
            _pad0: 0,
        }
    }
}

/// Index entry: slot `slot` of owner `owner_id` names one mapping the owner
/// claimed. Slots are written before the mapping they name, contiguously from
/// 0, so a crash never leaves a mapping that its owner cannot find again.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct OwnerSlotKey {
    pub owner_id: u64,
    pub slot: u32,
    pub _pad0: u32,
}

/// Most index slots one owner may use: as many mappings as the largest
/// mappings map holds (`maxMappings` at most 1048576), since one owner can
/// never hold more. A re-ADD that changes the set compacts the index first,
/// so slots count what the owner holds, never its history.
pub const MAX_SLOTS_PER_OWNER: u32 = 1 << 20;

/// Name of the map of (port, protocol, family) keys that a mapping with a
/// specific host address was ever claimed on (key [`PortKey`], value a
/// `u32` that is always 1). A wildcard claim looks for specific holders of
/// its port only where this map has the port, so an ADD of wildcard
/// mappings does not walk the mappings map. Userspace only, created like
/// [`OWNER_PODS_MAP`]; entries are never removed (see store.rs for why).
pub const SPECIFIC_PORTS_MAP: &str = "specific_ports";

/// Most entries of [`SPECIFIC_PORTS_MAP`]: every port of every protocol and
/// family.
pub const SPECIFIC_PORTS_CAPACITY: u32 = 65536 * 3 * 2;

/// Name of the map of owner IDs that `mappings` holds entries of although
/// their owner record is gone (key the owner ID, value the Unix time a GC
/// first saw them so). GC reclaims them after a grace period. Userspace
/// only, created like [`OWNER_PODS_MAP`].
pub const ORPHANS_MAP: &str = "orphans_seen";

/// Name of the map recording which network namespace owns a pin root (an
/// array of one `u64`: the namespace cookie). Userspace only; pinned by the first ADD
/// under the root, full, so whoever sees it sees the owner (portmap-user's
/// scope.rs).
pub const NETNS_OWNER_MAP: &str = "netns_owner";

/// A host port of one protocol and family, whatever the address.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PortKey {
    pub host_port_be: u16,
    pub proto: u8,
    pub family: u8,
}

impl PortKey {
    pub fn of(key: &MappingKey) -> Self {
        Self {
            host_port_be: key.host_port_be,
            proto: key.proto,
            family: key.family,
        }
    }
}

/// What a port is to a mapping, in `mapped_ports`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum PortRole {
    /// The host port: what a client dials.
    Host = 0,
    /// The container port: what the container answers from.
    Container = 1,
}

/// Word and bit of port `port_be` of IP protocol `proto` in `role` in the
/// `mapped_ports` bit array; `None` for a protocol no mapping has. By the
/// port's value as it is in memory (network order): any one-to-one index
/// serves, and this one needs no byte swap in the programs.
#[inline(always)]
pub const fn mapped_port_bit(role: PortRole, proto: u8, port_be: u16) -> Option<(u32, u64)> {
    let slot = match proto {
        PROTO_TCP => 0,
        PROTO_UDP => 1,
        PROTO_SCTP => 2,
        _ => return None,
    };
    let row = role as u32 * 3 + slot;
    let port = port_be as u32;
    Some(((row << 10) | (port >> 6), 1 << (port & 63)))
}

/// Conntrack key: the tuple of a packet as it is seen on the wire at the hook.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CtKey {
    pub src_addr_be: [u32; 4],
    pub dst_addr_be: [u32; 4],
    pub src_port_be: u16,
    pub dst_port_be: u16,
    pub proto: u8,
    pub family: u8,
    pub _pad0: u16,
}

/// What a conntrack entry does to the packets that match its key.
pub mod ct_kind {
    /// Inbound packet of a translated flow: destination becomes `nat_addr:nat_port`.
    pub const DNAT: u8 = 1;
    /// Reply of a translated flow: source becomes `nat_addr:nat_port` again.
    pub const REPLY: u8 = 2;
    /// Reply of a flow the node or a container opened from a mapped port:
    /// never translate it.
    pub const PASS: u8 = 3;
    /// Masqueraded flow towards the container: source becomes
    /// `nat_addr:nat_port` (the node's address on that network).
    pub const SNAT: u8 = 4;
    /// Answer to a masqueraded flow: destination becomes the client's
    /// `nat_addr:nat_port` again.
    pub const UNMASQ: u8 = 5;
    /// Added to [`DNAT`] and [`REPLY`]: the flow is translated by the
    /// node's netfilter (the kernel's conntrack entry holds its DNAT, see
    /// `knat` in the eBPF crate), and tc leaves its packets as they are
    /// both ways; `nat_addr:nat_port` still say where it goes. A flow
    /// keeps the translation it started with across a change of the
    /// node's settings. Code that follows a flow whatever translates it
    /// reads the kind under [`BASE`].
    pub const NETFILTER: u8 = 0x10;
    /// The bits of a kind without [`NETFILTER`].
    pub const BASE: u8 = 0x0f;
    /// [`DNAT`] of a flow netfilter translates.
    pub const NETFILTER_DNAT: u8 = DNAT | NETFILTER;
    /// [`REPLY`] of a flow netfilter translates.
    pub const NETFILTER_REPLY: u8 = REPLY | NETFILTER;
}

/// What a TCP conntrack entry has seen of its flow ([`CtEntry::tcp_state`]),
/// one bit each. Zero is an established flow: entries written by builds
/// that did not track TCP state (this byte was padding, always zero) read
/// as established, so an upgrade keeps their flows as they were.
pub mod tcp_state {
    /// Only the SYN so far: the client has not completed the handshake.
    /// Written on both entries of a new flow; the client's first packet
    /// without SYN clears it on both.
    pub const SYN_ONLY: u8 = 1;
    /// This entry's direction sent a FIN. When the other direction's
    /// entry has it too, the flow is closed.
    pub const FIN: u8 = 2;
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtEntry {
    pub nat_addr_be: [u32; 4],
    pub nat_port_be: u16,
    pub kind: u8,
    /// [`tcp_state`] bits (TCP entries of the `conntrack` map only).
    pub tcp_state: u8,
    /// [`ct_flags`] bits (DNAT entries). Was padding (always 0) in builds
    /// before the flags, whose entries read as "not known".
    pub flags: u32,
    /// The mapping this flow was translated by, re-checked on every packet so
    /// a deleted or re-pointed mapping never forwards stale traffic.
    pub mapping: MappingKey,
    /// When this direction last asked the kernel's conntrack whether it
    /// holds the flow as confirmed (the confirmed-flow fast path, see
    /// [`ct_flags::CONFIRMED`]): `ct::now()` in [`ct_timeout::VERDICT_UNIT_SHIFT`]
    /// units (about seconds); 0 never. Was padding (always 0) in earlier
    /// builds, whose entries read as "never asked".
    pub verdict_at: u32,
    /// CLOCK_MONOTONIC at tick resolution (the eBPF crate's `ct::now`) of
    /// the last packet, refreshed at most once a second.
    pub last_seen_ns: u64,
}

/// What a DNAT entry knows of its flow ([`CtEntry::flags`]), set when the
/// flow is translated. An entry with neither bit (written by an earlier
/// build) is judged by the node's settings as they are now.
pub mod ct_flags {
    /// Not masqueraded: egress has nothing to do with the flow's packets
    /// towards the container, and the next egress hook skips them.
    pub const DIRECT: u32 = 1;
    /// Masqueraded: egress rewrites the source of its packets towards the
    /// container.
    pub const MASQUERADED: u32 = 2;
    /// The kernel's conntrack held this direction's flow as confirmed (its
    /// first packet passed every netfilter hook) when last asked, at
    /// [`CtEntry::verdict_at`](super::CtEntry::verdict_at): the
    /// confirmed-flow fast path may hand its packets over. Kept on entries
    /// of both directions (DNAT and REPLY), each asking for itself.
    pub const CONFIRMED: u32 = 4;
    /// A UDP or SCTP flow in `conntrack_new` had an answer (set on the
    /// entries of both directions when the answer's entry is found): with
    /// packets [`ct_timeout::UDP_STREAM`](super::ct_timeout::UDP_STREAM)
    /// after its first, the flow is assured and leaves `conntrack_new`.
    pub const REPLIED: u32 = 8;
}

/// The kernel functions (kfuncs) the programs call, and how they are
/// linked. aya 0.14 cannot relocate kfunc calls, so the eBPF code emits
/// each call as a raw instruction (`BPF_CALL` with `src_reg` =
/// `BPF_PSEUDO_KFUNC_CALL`) whose immediate is a [`Kfunc::marker`]; before
/// loading, userspace writes the kfunc's BTF ID from the running kernel's
/// vmlinux BTF in place of each marker, or, on a kernel whose vmlinux
/// lacks one of them, replaces every marked call with `r0 = 0` (a lookup
/// that finds nothing): the same object then loads without them.
pub mod kfunc {
    /// One kernel function the programs call.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct Kfunc {
        /// Its name in the kernel's BTF.
        pub name: &'static str,
        /// The immediate the object carries in its place.
        pub marker: u32,
        /// The module that defines it where it is not built in (its BTF,
        /// `/sys/kernel/btf/{module}`, holds it then).
        pub module: &'static str,
    }

    /// `struct nf_conn *bpf_skb_ct_lookup(struct __sk_buff *, struct
    /// bpf_sock_tuple *, u32, struct bpf_ct_opts *, u32)` (Linux 5.18,
    /// with nf_conntrack).
    pub const CT_LOOKUP: Kfunc = Kfunc {
        name: "bpf_skb_ct_lookup",
        marker: 0x7ead_0001,
        module: "nf_conntrack",
    };
    /// `void bpf_ct_release(struct nf_conn *)` (Linux 5.18).
    pub const CT_RELEASE: Kfunc = Kfunc {
        name: "bpf_ct_release",
        marker: 0x7ead_0002,
        module: "nf_conntrack",
    };
    /// `int bpf_ct_change_timeout(struct nf_conn *, u32 timeout_ms)`
    /// (Linux 6.0).
    pub const CT_CHANGE_TIMEOUT: Kfunc = Kfunc {
        name: "bpf_ct_change_timeout",
        marker: 0x7ead_0003,
        module: "nf_conntrack",
    };
    /// `struct nf_conn___init *bpf_skb_ct_alloc(struct __sk_buff *, struct
    /// bpf_sock_tuple *, u32, struct bpf_ct_opts *, u32)` (Linux 6.0):
    /// a new entry, not yet in the table, for TCP and UDP.
    pub const CT_ALLOC: Kfunc = Kfunc {
        name: "bpf_skb_ct_alloc",
        marker: 0x7ead_0004,
        module: "nf_conntrack",
    };
    /// `struct nf_conn *bpf_ct_insert_entry(struct nf_conn___init *)`
    /// (Linux 6.0): inserts an allocated entry, which it consumes; a
    /// reference to the inserted one, or null.
    pub const CT_INSERT: Kfunc = Kfunc {
        name: "bpf_ct_insert_entry",
        marker: 0x7ead_0005,
        module: "nf_conntrack",
    };
    /// `int bpf_ct_set_nat_info(struct nf_conn___init *, union
    /// nf_inet_addr *, int port, enum nf_nat_manip_type)` (Linux 6.1, in
    /// nf_nat).
    pub const CT_SET_NAT: Kfunc = Kfunc {
        name: "bpf_ct_set_nat_info",
        marker: 0x7ead_0006,
        module: "nf_nat",
    };
    /// The kfuncs of the confirmed-flow fast path: all resolved, or all
    /// replaced, and then [`NAT`]'s too (they need the lookup and release).
    pub const CONFIRM: [Kfunc; 3] = [CT_LOOKUP, CT_RELEASE, CT_CHANGE_TIMEOUT];
    /// The kfuncs that make a flow's kernel entry with its NAT, for
    /// translation by netfilter: all resolved, or all replaced (alone:
    /// [`CONFIRM`]'s stay linked).
    pub const NAT: [Kfunc; 3] = [CT_ALLOC, CT_INSERT, CT_SET_NAT];
    /// Every kfunc the object calls, [`CONFIRM`]'s first.
    pub const ALL: [Kfunc; 6] = [
        CT_LOOKUP,
        CT_RELEASE,
        CT_CHANGE_TIMEOUT,
        CT_ALLOC,
        CT_INSERT,
        CT_SET_NAT,
    ];

    /// The call instruction as the object carries it (little-endian
    /// `struct bpf_insn`: opcode 0x85 `BPF_JMP | BPF_CALL`, `dst_reg` 0,
    /// `src_reg` 2 `BPF_PSEUDO_KFUNC_CALL`, `off` 0 (vmlinux BTF), `imm` the
    /// marker).
    pub const fn call_insn(marker: u32) -> u64 {
        ((marker as u64) << 32) | 0x2085
    }

    /// A linked call: `imm` the kfunc's BTF ID, `off` 0 for vmlinux BTF or
    /// the index of its module's BTF fd in the load's `fd_array` (from 1).
    pub const fn linked_call_insn(btf_id: u32, fd_index: u16) -> u64 {
        ((btf_id as u64) << 32) | ((fd_index as u64) << 16) | 0x2085
    }

    /// `r0 = 0` (`BPF_ALU64 | BPF_MOV | BPF_K`, imm 0): what a call is
    /// replaced with on a kernel without the kfuncs.
    pub const MOV_R0_0: u64 = 0xb7;

    /// `sizeof(struct bpf_ct_opts)` as Linux 5.18 defined it (netns_id,
    /// error, l4proto, dir, 2 reserved bytes); later kernels accept it too.
    pub const CT_OPTS_LEN: u32 = 12;
}

/// How many entries the conntrack tables evicted, by table group: what
/// `status`, the agent's metrics and `trace` report. An LRU map tells
/// nobody what it evicts, so the count is a ledger: the programs count the
/// entries they write to a group and those they move or remove from it
/// (`stat::CT_NEW_IN` ... `stat::CT_LIVE_OUT`, per CPU); userspace adds
/// what it takes out or puts in itself (an expired entry swept, a table
/// made anew by a resize) to the group's [`NEW_ADJUST`] or
/// [`LIVE_ADJUST`] in the `ct_ledger` map; and what is neither there nor
/// accounted for was evicted:
///
/// `evicted = in - out - present + adjust`
///
/// The groups: `conntrack_new` (flows not yet assured: a flood's, scans,
/// one-shot datagrams) and the assured tables `conntrack` and
/// `conntrack_other` (live flows). `conntrack_close` holds dead flows
/// only and is not counted.
pub mod ct_ledger {
    /// Userspace's part of `conntrack_new`'s ledger (a wrapping `u64`
    /// read as `i64`).
    pub const NEW_ADJUST: u32 = 0;
    /// Userspace's part of the assured tables' ledger.
    pub const LIVE_ADJUST: u32 = 1;
    /// The live evictions the agent last saw ...
    pub const LIVE_SEEN: u32 = 2;
    /// ... and when that count last grew (`CLOCK_MONOTONIC` ns; 0 never).
    pub const LIVE_GREW_AT: u32 = 3;
    /// Values of the map.
    pub const LEN: u32 = 4;

    /// What a group's ledger says it evicted: `written` less `left` less
    /// `present`, plus userspace's `adjust`. Never below zero: the
    /// counters and the entries present are read at different moments,
    /// so a busy table can briefly show more present than written.
    pub const fn evicted(written: u64, left: u64, present: u64, adjust: u64) -> u64 {
        let value = written
            .wrapping_sub(left)
            .wrapping_sub(present)
            .wrapping_add(adjust) as i64;
        if value < 0 { 0 } else { value as u64 }
    }

    #[cfg(test)]
    mod tests {
        use super::evicted;

        #[test]
        fn what_is_neither_there_nor_accounted_for_was_evicted() {
            // 10 written, 2 moved out, 5 there: 3 evicted.
            assert_eq!(evicted(10, 2, 5, 0), 3);
            // 2 of the missing swept by userspace (adjust -2).
            assert_eq!(evicted(10, 2, 5, 2u64.wrapping_neg()), 1);
            // Entries userspace put in (a rebase of copied tables).
            assert_eq!(evicted(10, 2, 12, 4), 0);
            // Read at different moments: never below zero.
            assert_eq!(evicted(10, 2, 9, 0), 0);
            // A written count that wrapped past u64::MAX, 5 ahead of the
            // taken one, still subtracts.
            assert_eq!(evicted(2, u64::MAX - 2, 1, 0), 4);
        }
    }
}

/// Idle timeouts of conntrack entries, in nanoseconds.
pub mod ct_timeout {
    const SEC: u64 = 1_000_000_000;
    /// An established TCP flow.
    pub const TCP: u64 = 6 * 3600 * SEC;
    /// A TCP flow that has seen only its SYN (a scan, a flood, a backend
    /// that never answers): as long as nf_conntrack's SYN_SENT and
    /// Cilium's SYN timeout allow, not hours.
    pub const TCP_SYN_ONLY: u64 = 60 * SEC;
    /// A closed TCP flow (FIN both ways, or RST) in `conntrack_closed`:
    /// long enough for the last ACK and retransmitted FINs (Cilium uses
    /// 10 s, nf_conntrack 10 s for CLOSE).
    pub const TCP_CLOSED: u64 = 10 * SEC;
    pub const SCTP: u64 = 6 * 3600 * SEC;
    pub const UDP: u64 = 120 * SEC;
    /// How stale `last_seen_ns` may get before a packet refreshes it.
    pub const REFRESH: u64 = SEC;
    /// How long after its first packet a UDP or SCTP flow that had an
    /// answer must still have packets to be assured (nf_conntrack's UDP
    /// stream rule: "still active after two seconds"). Entries in
    /// `conntrack_new` are never refreshed, so their `last_seen_ns` is the
    /// flow's first packet, and their timeouts count from it.
    pub const UDP_STREAM: u64 = 2 * SEC;
    /// [`CtEntry::verdict_at`](super::CtEntry::verdict_at) is `ct::now()`
    /// shifted right by this many bits: units of 2^30 ns (1.07 s).
    pub const VERDICT_UNIT_SHIFT: u32 = 30;
    /// How many of those units a kernel conntrack verdict holds: a flow on
    /// the confirmed-flow fast path asks the kernel again (and refreshes
    /// the kernel's entry) at least this often per direction, and a flow
    /// found unconfirmed stays on the normal path at least this long
    /// before it is asked about again. 5 units: 5.4 s.
    pub const VERDICT_UNITS: u32 = 5;

    /// The timeout, in milliseconds, a refresh gives the kernel's conntrack
    /// entry of a flow on the confirmed-flow fast path: as long as our own
    /// entry of the flow lives without packets ([`for_entry`]), so the
    /// kernel's entry never expires under a live flow, and goes about when
    /// ours does once the flow is idle; [`TCP_CLOSED`] once a FIN or RST
    /// went by (netfilter sees no packet of the flow's close).
    #[inline(always)]
    pub const fn kernel_refresh_ms(proto: u8, tcp_state: u8, closing: bool) -> u32 {
        let ns = if closing {
            TCP_CLOSED
        } else {
            for_entry(proto, tcp_state)
        };
        (ns / 1_000_000) as u32
    }

    /// How long an entry of IP protocol `proto` with `tcp_state` may idle
    /// before the programs no longer use it: [`TCP_CLOSED`] in the closed
    /// table (`closed`), counted from the close, else [`for_entry`]. What
    /// the programs' lookup judges and the sweep of expired entries
    /// removes.
    #[inline(always)]
    pub const fn for_table(proto: u8, tcp_state: u8, closed: bool) -> u64 {
        if closed {
            TCP_CLOSED
        } else {
            for_entry(proto, tcp_state)
        }
    }

    /// How long a flow of IP protocol `proto` whose entry is in the
    /// `conntrack` or `conntrack_other` map, with `tcp_state`, may idle
    /// before its entries no longer count: what the programs enforce and
    /// `list` reports.
    #[inline(always)]
    pub const fn for_entry(proto: u8, tcp_state: u8) -> u64 {
        match proto {
            super::PROTO_UDP => UDP,
            super::PROTO_SCTP => SCTP,
            _ if tcp_state & super::tcp_state::SYN_ONLY != 0 => TCP_SYN_ONLY,
            _ => TCP,
        }
    }
}

/// Key of the per-mapping traffic counters. The owner is part of the key so
/// a host port handed to another container starts from zero.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CounterKey {
    pub mapping: MappingKey,
    pub _pad0: u32,
    pub owner_id: u64,
}

/// Traffic a mapping translated, per CPU (the programs add to their CPU's
/// copy without atomics; readers sum them). Bytes are skb lengths as seen at
/// the tc hook (L2 frame, headers included).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MappingCounters {
    /// Packets translated towards the container (DNAT, new and existing flows).
    pub packets_in: u64,
    pub bytes_in: u64,
    /// Replies translated back to the host address and port.
    pub packets_out: u64,
    pub bytes_out: u64,
}

/// What `ebpf-portmap trace` wants to see; entry 0 of the `trace_filter`
/// array. All zero (the initial state) means nobody traces and the programs
/// do nothing but read `enabled`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TraceFilter {
    /// Non-zero while a tracer runs.
    pub enabled: u32,
    /// Process ID of the tracer, so a new one can tell a stale filter (its
    /// tracer was killed) from a live one.
    pub tracer_pid: u32,
    /// Only packets with this port (either end, before or after translation);
    /// 0 for any.
    pub port_be: u16,
    /// Only this IP protocol; 0 for any.
    pub proto: u8,
    pub _pad0: u8,
    pub _pad1: u32,
}

/// Where a traced packet was seen.
pub mod trace_direction {
    pub const INGRESS: u8 = 0;
    pub const EGRESS: u8 = 1;
    /// Not a packet: a socket hook pointed a node process's connect() at
    /// a container (no interface, no source address yet, length 0).
    pub const SOCK_CONNECT: u8 = 2;
    /// Likewise for a sendmsg() with a destination (unconnected UDP).
    pub const SOCK_SENDMSG: u8 = 3;
}

/// One traced packet: the packet as it arrived, as it left, and what the
/// dataplane decided (the `stat` reasons it counted).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TraceEvent {
    /// `bpf_ktime_get_ns` (CLOCK_MONOTONIC).
    pub ts_ns: u64,
    /// Bit `1 << reason` for every `stat` reason counted for this packet;
    /// 0 when nothing was (an ingress packet for a port with no mapping).
    /// 64 bits: the reasons outgrew 32 with `ct_assured`.
    pub decisions: u64,
    pub src_addr_be: [u32; 4],
    pub dst_addr_be: [u32; 4],
    /// The addresses after the program ran (equal to the above when it did
    /// not rewrite the packet).
    pub new_src_addr_be: [u32; 4],
    pub new_dst_addr_be: [u32; 4],
    pub sport_be: u16,
    pub dport_be: u16,
    pub new_sport_be: u16,
    pub new_dport_be: u16,
    pub ifindex: u32,
    /// skb length at the hook.
    pub len: u32,
    /// `trace_direction`.
    pub direction: u8,
    pub family: u8,
    pub proto: u8,
    /// TCP flags (SCTP: first chunk type; UDP: 0).
    pub flags: u8,
    pub _pad0: [u8; 4],
}

const _: () = {
    assert!(core::mem::size_of::<MappingKey>() == 20);
    assert!(core::mem::size_of::<MappingValue>() == 32);
    assert!(core::mem::size_of::<OwnerRecord>() == 2 * OWNER_NAME_LEN + OWNER_IFNAME_LEN + 16);
    assert!(
        core::mem::size_of::<PodRecord>()
            == POD_NAMESPACE_LEN + POD_NAME_LEN + 4 * NOMAD_FIELD_LEN + 6 * 2 + 4
    );
    assert!(core::mem::size_of::<SandboxRecord>() == NETNS_PATH_LEN + POD_UID_LEN + 5 * 8 + 8);
    assert!(core::mem::size_of::<OwnerSlotKey>() == 16);
    assert!(core::mem::size_of::<PortKey>() == 4);
    assert!(core::mem::size_of::<CtKey>() == 40);
    assert!(core::mem::size_of::<CtEntry>() == 56);
    assert!(core::mem::size_of::<CounterKey>() == 32);
    assert!(core::mem::size_of::<MappingCounters>() == 32);
    assert!(core::mem::size_of::<TraceFilter>() == 16);
    assert!(core::mem::size_of::<TraceEvent>() == 104);
    // Every reason must have a bit in `TraceEvent::decisions`.
    assert!(stat::COUNT <= 64);
};

// ---- Node agent (issue #17): kept apart from the schema above. ----

/// Trace events the programs could not emit because the ring buffer was
/// full (the tracer reads too slowly): a pinned per-CPU array of one `u64`,
/// declared in the object next to `trace_events` (portmap-ebpf's trace.rs)
/// and kept out of [`maps::PINNED`], so `status` does not call pins of a
/// build without it incomplete. `trace` reports it as lost events, the
/// agent exports it.
pub const TRACE_LOST_MAP: &str = "trace_lost";

/// The programs' rare events (a failed rewrite or conntrack insert, no
/// masquerade port or address, a CPU's first fast-path hand-over), logged
/// through aya-log by the tc programs and drained by the node agent into
/// its own log. Kept out of [`maps::PINNED`] like [`TRACE_LOST_MAP`].
pub mod datapath_log {
    /// aya-log's ring buffer: its name in the object (aya-log's, which its
    /// reader looks for) and its pin name under the maps directory, so that
    /// every build's programs and the agent share one.
    pub const MAP: &str = "AYA_LOGS";
    /// Its size in bytes (aya-log-ebpf's): a few hundred events.
    pub const BYTES: u32 = 1 << 17;
    /// Per-CPU, not pinned: the event noted for the packet being handled,
    /// and when each reason was last logged on the CPU.
    pub const PENDING_MAP: &str = "log_pending";
    /// At most one line per reason per CPU in this time; the counters
    /// count every event.
    pub const INTERVAL_NS: u64 = 1_000_000_000;
    /// What every record's message starts with, followed by the reason ID
    /// (see [`crate::reason`]): the agent puts the reason's label and
    /// meaning in its place.
    pub const PREFIX: &str = "reason ";
}

/// What the short-lived plugin records about its own runs, for the node
/// agent to export: outcome counts and latency histograms of each CNI verb.
/// Userspace only (the programs never see it): an `BPF_F_MMAPABLE` array of
/// [`verb_stats::SLOTS`] `u64` slots, created by the first run that finds the
/// dataplane installed, and updated with atomic adds on the mapping, so
/// concurrent plugin runs never lose an increment (a map update from
/// userspace would be a read-modify-write of the whole value).
pub mod verb_stats {
    /// Pin name, under the maps directory.
    pub const MAP: &str = "verb_stats";
    /// The verbs, in slot order.
    pub const VERBS: [&str; 5] = ["ADD", "DEL", "CHECK", "GC", "STATUS"];
    /// CNI result codes counted on their own (0: success); any other code
    /// is counted in the slot after these.
    pub const CODES: [u32; 17] = [
        0, 1, 2, 3, 4, 5, 6, 7, 11, 50, 100, 101, 102, 103, 104, 105, 999,
    ];
    /// Upper bounds of the latency buckets, in microseconds; a last bucket
    /// takes what is slower.
    pub const BUCKETS_US: [u64; 12] = [
        1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000,
        2_500_000, 5_000_000,
    ];
    /// Slots of one verb: a count per code and one for other codes, a count
    /// per bucket and one for slower runs, and the sum of durations in
    /// nanoseconds.
    pub const PER_VERB: usize = CODES.len() + 1 + BUCKETS_US.len() + 1 + 1;
    /// Every slot of the map.
    pub const SLOTS: usize = VERBS.len() * PER_VERB;

    /// Slot of the count of `verb` ending with `code`.
    pub const fn code_slot(verb: usize, code: u32) -> usize {
        let mut index = 0;
        while index < CODES.len() {
            if CODES[index] == code {
                return verb * PER_VERB + index;
            }
            index += 1;
        }
        verb * PER_VERB + CODES.len()
    }

    /// Slot of the latency bucket a run of `verb` that took `micros` falls in.
    pub const fn bucket_slot(verb: usize, micros: u64) -> usize {
        let mut index = 0;
        while index < BUCKETS_US.len() && micros > BUCKETS_US[index] {
            index += 1;
        }
        verb * PER_VERB + CODES.len() + 1 + index
    }

    /// Slot of the sum of durations of `verb`, in nanoseconds.
    pub const fn sum_slot(verb: usize) -> usize {
        verb * PER_VERB + PER_VERB - 1
    }
}

#[cfg(feature = "user")]
mod pod {
    use super::*;

    macro_rules! pod {
        ($($ty:ty),* $(,)?) => {$(
            // SAFETY: all of these are repr(C), made of integers and integer arrays,
            // with every padding byte an explicit field.
            unsafe impl aya::Pod for $ty {}
        )*};
    }

    pod!(
        MappingKey,
        MappingValue,
        OwnerRecord,
        PodRecord,
        SandboxRecord,
        OwnerSlotKey,
        PortKey,
        CtKey,
        CtEntry,
        CounterKey,
        MappingCounters,
        TraceFilter,
        TraceEvent,
    );
}
