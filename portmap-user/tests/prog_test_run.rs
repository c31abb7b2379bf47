//! Packet-level tests of the tc programs through `BPF_PROG_TEST_RUN`: build
//! a packet, run the program, assert every rewritten field and checksum.
//!
//! Each test runs on a thread of its own inside a fresh network namespace
//! (`unshare(CLONE_NEWNET)`), where a veth holds the "node"
//! addresses; the FIB lookup that decides "is this for the node?" sees only
//! that namespace. Needs root.
//!
//! The object is loaded (and the programs verified) once per table size
//! and shared: the tests take turns on it, each starting with every map
//! emptied, as a fresh load has them. Verifying the two programs is most of
//! a load, and under the VM tests' emulation it took 10-15 s per test.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    os::fd::{AsFd, AsRawFd},
    process::Command,
    sync::{Mutex, MutexGuard, OnceLock, PoisonError},
};

use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, HashMap, Map, MapData, PerCpuArray},
    programs::{SchedClassifier, TestRun, TestRunOptions},
};
use portmap_common::{
    CtEntry, CtKey, MappingKey, MappingValue,
    conditions::{self, Cidr, ConditionKey, Conditions},
    ct_ledger,
    local::{self, NodeConfig, Peer, PeerKey},
    map_names, program_names, stat,
};
use portmap_user::dataplane::{
    bpf_call,
    kfunc::Groups,
    load::program,
    maps::{MappedPorts, MappingsEpoch},
    object,
    ownership::words_from_addr,
};

const NODE_V4: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
const NODE_V6: Ipv6Addr = Ipv6Addr::new(0xfd18, 0, 0, 0, 0, 0, 0, 1);
const CLIENT_V4: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
const CLIENT_V6: Ipv6Addr = Ipv6Addr::new(0xfd18, 0, 0, 0, 0, 0, 0, 2);
const CONTAINER_V4: Ipv4Addr = Ipv4Addr::new(10, 244, 0, 2);
const CONTAINER_V6: Ipv6Addr = Ipv6Addr::new(0xfd44, 0, 0, 0, 0, 0, 0, 2);
/// Reachable through the node but not its own: transit traffic.
const FAR_V4: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 2);

const CONTAINER_MAC: [u8; 6] = [0x0a, 0x58, 0x0a, 0xf4, 0x00, 0x02];
const GATEWAY_MAC: [u8; 6] = [0x0a, 0x58, 0x0a, 0xf4, 0x00, 0x01];
/// TC_ACT_REDIRECT: the fast path took the packet.
const REDIRECT: u32 = 7;

const TCP: u8 = 6;
const UDP: u8 = 17;
const SCTP: u8 = 132;
const FIN: u8 = 0x01;
const SYN: u8 = 0x02;
const RST: u8 = 0x04;
const ACK: u8 = 0x10;

/// Runs `test` on a new thread in a new network namespace with a "node"
/// interface; the namespace disappears with the thread.
fn in_node_namespace<T: Send + 'static>(test: impl FnOnce(u32) -> T + Send + 'static) -> T {
    std::thread::spawn(move || {
        // SAFETY: affects only this thread.
        assert_eq!(
            // SAFETY: unshare takes no pointers; the test thread gets its own netns.
            unsafe { libc::unshare(libc::CLONE_NEWNET) },
            0,
            "unshare(CLONE_NEWNET) needs root: {}",
            std::io::Error::last_os_error()
        );
        for (path, value) in [
            ("/proc/sys/net/ipv4/ip_forward", "1"),
            ("/proc/sys/net/ipv6/conf/all/forwarding", "1"),
            ("/proc/sys/net/ipv6/conf/default/forwarding", "1"),
        ] {
            std::fs::write(path, value).unwrap_or_else(|e| panic!("writing {path}: {e}"));
        }
        for args in [
            "link set lo up",
            "link add node0 type veth peer name peer0",
            "link set peer0 up",
            "addr add 198.18.0.1/24 dev node0",
            "addr add fd18::1/64 dev node0 nodad",
            "link set node0 up",
            "route add 198.19.0.0/24 via 198.18.0.2 dev node0",
        ] {
            portmap_tests::rtnl::ip_here(
                &args.split(' ').collect::<Vec<_>>(),
                "in the test's namespace",
            );
        }
        let ifindex = portmap_user::node::netlink::interface_index("node0").expect("node0 exists");
        test(ifindex)
    })
    .join()
    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

struct Dataplane {
    ebpf: MutexGuard<'static, Loaded>,
    ifindex: u32,
}

/// The object as aya loaded it (maps, socket programs), and its two tc
/// programs as the plugin loads them (`dataplane::load::program`, with
/// the kfunc modules' BTF in their fd_array).
struct Loaded {
    ebpf: Ebpf,
    tc: Vec<(&'static str, SchedClassifier)>,
}

impl std::ops::Deref for Loaded {
    type Target = Ebpf;
    fn deref(&self) -> &Ebpf {
        &self.ebpf
    }
}

impl std::ops::DerefMut for Loaded {
    fn deref_mut(&mut self) -> &mut Ebpf {
        &mut self.ebpf
    }
}

/// The conntrack size of the one test that fills the tables.
const SMALL_CONNTRACK: u32 = 1024;

impl Dataplane {
    /// The object with its default table sizes, emptied for this test.
    fn load(ifindex: u32) -> Self {
        static LOADED: OnceLock<Mutex<Loaded>> = OnceLock::new();
        Self::take_turn(&LOADED, None, ifindex)
    }

    /// The object with conntrack tables of [`SMALL_CONNTRACK`] entries.
    fn load_small_conntrack(ifindex: u32) -> Self {
        static LOADED: OnceLock<Mutex<Loaded>> = OnceLock::new();
        Self::take_turn(&LOADED, Some(SMALL_CONNTRACK), ifindex)
    }

    fn take_turn(
        loaded: &'static OnceLock<Mutex<Loaded>>,
        conntrack_size: Option<u32>,
        ifindex: u32,
    ) -> Self {
        let shared = loaded.get_or_init(|| Mutex::new(Self::load_object(conntrack_size)));
        // A test that failed while holding it leaves nothing the emptying
        // below does not remove.
        let mut ebpf = shared.lock().unwrap_or_else(PoisonError::into_inner);
        empty_maps(&mut ebpf);
        let mut dp = Self { ebpf, ifindex };
        // As every plugin run syncs them: the node's addresses.
        dp.add_local_addr(NODE_V4.into());
        dp.add_local_addr(NODE_V6.into());
        dp
    }

    /// Makes `addr` one of the node's addresses in `local_addrs`.
    fn add_local_addr(&mut self, addr: IpAddr) {
        let mut local: HashMap<&mut MapData, local::LocalAddrKey, u8> = HashMap::try_from(
            self.ebpf
                .map_mut(local::map_names::LOCAL_ADDRS)
                .expect("local_addrs in the object"),
        )
        .expect("local_addrs is a hash map");
        let key = local::LocalAddrKey {
            addr_be: words_from_addr(addr),
            family: if addr.is_ipv4() { 4 } else { 6 },
            _pad0: [0; 3],
        };
        local.insert(key, 1, 0).expect("insert a local address");
    }

    fn load_object(conntrack_size: Option<u32>) -> Loaded {
        // Unpinned maps: nothing leaks out of the test binary.
        let mut loader = EbpfLoader::new();
        if let Some(size) = conntrack_size {
            loader.map_max_entries(map_names::CONNTRACK, size);
            loader.map_max_entries(map_names::CONNTRACK_OTHER, size);
            loader.map_max_entries(map_names::CONNTRACK_NEW, size);
            loader.map_max_entries(
                map_names::CONNTRACK_CLOSED,
                portmap_common::capacity::conntrack_closed(size),
            );
        }
        // Its kfunc calls linked for this kernel, as the plugin loads it.
        let mut linked = object::linked_for_this_kernel(true, Groups::All)
            .expect("link the object's kfunc calls");
        let module_fds = program::module_btf_fds(&linked.modules).expect("the kfunc modules' BTF");
        let mut ebpf = loader.load(linked.bytes()).expect("load the eBPF object");
        // As the plugin does: a verifier that refuses the kfunc calls gets
        // the programs without them; where they must pass
        // (`EPM_EXPECT_KFUNCS=1`, the VM guests), that fails.
        if let Err(refusal) = program::load_tc(
            &ebpf,
            linked.bytes(),
            program_names::TC_INGRESS,
            &module_fds,
        ) {
            assert_ne!(
                std::env::var("EPM_EXPECT_KFUNCS").as_deref(),
                Ok("1"),
                "the kfunc calls must pass this kernel's verifier: {refusal}"
            );
            eprintln!("loading without the kfunc calls: {refusal}");
            linked = object::linked_for_this_kernel(true, Groups::None).expect("relink");
            ebpf = loader.load(linked.bytes()).expect("load the eBPF object");
        }
        let module_fds = program::module_btf_fds(&linked.modules).expect("the kfunc modules' BTF");
        let mut tc = Vec::new();
        for name in [program_names::TC_INGRESS, program_names::TC_EGRESS] {
            let fd = program::load_tc(&ebpf, linked.bytes(), name, &module_fds)
                .unwrap_or_else(|e| panic!("verifier rejected {name}: {e}"));
            // aya opens a program by its pin: pinned for a moment only.
            let pin = std::path::Path::new("/sys/fs/bpf")
                .join(format!("epm-prog-test-run-{}-{name}", std::process::id()));
            program::pin(&fd, &pin, name).expect("pin the program");
            let opened = SchedClassifier::from_pin(&pin);
            std::fs::remove_file(&pin).expect("unpin the program");
            tc.push((name, opened.expect("open the pinned program")));
        }
        Loaded { ebpf, tc }
    }

    fn map(
        &mut self,
        host: Option<IpAddr>,
        family_v6: bool,
        host_port: u16,
        proto: u8,
        container: IpAddr,
        container_port: u16,
    ) {
        let key = MappingKey {
            host_addr_be: host.map_or([0; 4], words_from_addr),
            host_port_be: host_port.to_be(),
            proto,
            family: if family_v6 { 6 } else { 4 },
        };
        let value = MappingValue {
            container_addr_be: words_from_addr(container),
            container_port_be: container_port.to_be(),
            owner_id: 42,
            ..MappingValue::default()
        };
        // As ADD does: the ports first (the programs leave packets of
        // unmarked ports alone).
        let Some(aya::maps::Map::Array(ports)) = self.ebpf.map(map_names::MAPPED_PORTS) else {
            panic!("no mapped_ports array in the object");
        };
        MappedPorts::of(ports)
            .expect("map mapped_ports")
            .mark(&key, &value);
        let mut mappings: HashMap<&mut MapData, MappingKey, MappingValue> = HashMap::try_from(
            self.ebpf
                .map_mut(map_names::MAPPINGS)
                .expect("mappings map"),
        )
        .expect("typed mappings map");
        let replaced = mappings.get(&key, 0).is_ok();
        mappings.insert(key, value, 0).expect("insert mapping");
        if replaced {
            // As ADD does when it re-points a mapping.
            self.raise_epoch();
        }
    }

    fn unmap_all(&mut self) {
        let mut mappings: HashMap<&mut MapData, MappingKey, MappingValue> = HashMap::try_from(
            self.ebpf
                .map_mut(map_names::MAPPINGS)
                .expect("mappings map"),
        )
        .expect("typed mappings map");
        let keys: Vec<_> = mappings.keys().map(|k| k.expect("key")).collect();
        for key in keys {
            mappings.remove(&key).expect("remove mapping");
        }
        // As DEL does, once the mappings are gone.
        self.raise_epoch();
    }

    /// Raises the mappings epoch, as ADD (re-pointing a mapping) and DEL do.
    fn raise_epoch(&self) {
        let Some(aya::maps::Map::Array(epoch)) = self.ebpf.map(map_names::MAPPINGS_EPOCH) else {
            panic!("no mappings_epoch array in the object");
        };
        MappingsEpoch::raise_mapped(&MappingsEpoch::map(epoch).expect("map mappings_epoch"));
    }

    /// Every entry of the conntrack table `name`.
    fn conntrack(&self, name: &str) -> Vec<(CtKey, CtEntry)> {
        let table: HashMap<&MapData, CtKey, CtEntry> =
            HashMap::try_from(self.ebpf.map(name).expect("conntrack table"))
                .expect("typed conntrack table");
        table.iter().map(|entry| entry.expect("entry")).collect()
    }

    fn stat(&self, reason: u32) -> u64 {
        let stats: PerCpuArray<&MapData, u64> =
            PerCpuArray::try_from(self.ebpf.map(map_names::STATS).expect("stats map"))
                .expect("typed stats");
        stats.get(&reason, 0).expect("stat").iter().sum()
    }

    /// Runs `program` on `packet`; returns the packet as the program left it.
    fn run(&self, program: &str, packet: &[u8]) -> Vec<u8> {
        let (action, out) = self.run_for_action(program, packet);
        assert_eq!(action, 0, "the program must return TC_ACT_OK");
        out
    }

    /// Runs `program` on `packet`; returns its tc action and the packet.
    fn run_for_action(&self, program: &str, packet: &[u8]) -> (u32, Vec<u8>) {
        let program: &SchedClassifier = self
            .ebpf
            .tc
            .iter()
            .find(|(name, _)| *name == program)
            .map(|(_, loaded)| loaded)
            .expect("a tc program");
        // __sk_buff up to `ifindex`: ingress_ifindex at 36, ifindex at 40.
        let mut ctx = [0u8; 44];
        ctx[36..40].copy_from_slice(&self.ifindex.to_ne_bytes());
        ctx[40..44].copy_from_slice(&self.ifindex.to_ne_bytes());
        let mut out = vec![0u8; packet.len() + 256];
        let mut opts = TestRunOptions::new();
        opts.data_in = Some(packet);
        opts.data_out = Some(&mut out);
        opts.ctx_in = Some(&ctx);
        let result = program.test_run(opts).expect("BPF_PROG_TEST_RUN");
        out.truncate(result.data_size_out as usize);
        (result.return_value, out)
    }

    /// Turns `fastPath` on (node flags) and records the hand-over of
    /// `container` for `owner_id`.
    fn fast_path(&mut self, container: IpAddr, owner_id: u64, ifindex: u32) {
        self.fast_path_with(local::node_flags::FAST_PATH, container, owner_id, ifindex);
    }

    /// [`Self::fast_path`] in the mode `flags` says (`node_flags`).
    fn fast_path_with(&mut self, flags: u32, container: IpAddr, owner_id: u64, ifindex: u32) {
        let mut node: Array<&mut MapData, NodeConfig> =
            Array::try_from(self.ebpf.map_mut(local::map_names::NODE).expect("node map"))
                .expect("typed node map");
        let config = NodeConfig {
            flags,
            ..NodeConfig::default()
        };
        node.set(0, config, 0).expect("node flags");
        let mut peers: HashMap<&mut MapData, PeerKey, Peer> = HashMap::try_from(
            self.ebpf
                .map_mut(local::map_names::PEERS)
                .expect("peers map"),
        )
        .expect("typed peers map");
        let key = PeerKey {
            addr_be: words_from_addr(container),
            family: if container.is_ipv4() { 4 } else { 6 },
            _pad0: [0; 3],
        };
        let peer = Peer {
            owner_id,
            ifindex,
            container_mac: CONTAINER_MAC,
            gateway_mac: GATEWAY_MAC,
        };
        peers.insert(key, peer, 0).expect("insert peer");
    }

    fn ingress(&self, packet: &[u8]) -> Vec<u8> {
        self.run(program_names::TC_INGRESS, packet)
    }

    fn egress(&self, packet: &[u8]) -> Vec<u8> {
        self.run(program_names::TC_EGRESS, packet)
    }
}

/// Empties every map of `ebpf` to what a fresh load holds: hash-type maps
/// lose every key, arrays hold zeroes. The frozen `.rodata` and the trace
/// ring buffer (which no test reads) are left as they are, and so is
/// socket storage.
fn empty_maps(ebpf: &mut Ebpf) {
    for (name, map) in ebpf.maps() {
        if name.starts_with('.') {
            continue;
        }
        let (data, per_cpu) = match map {
            Map::HashMap(data)
            | Map::LruHashMap(data)
            | Map::PerCpuHashMap(data)
            | Map::PerCpuLruHashMap(data)
            | Map::LpmTrie(data) => {
                delete_every_key(name, data);
                continue;
            }
            Map::Array(data) => (data, false),
            Map::PerCpuArray(data) => (data, true),
            // Entries of socket storage live and die with their sockets;
            // the tc programs under test own no socket.
            Map::RingBuf(_) | Map::SkStorage(_) => continue,
            _ => panic!("map {name}: this test does not know how to empty its type"),
        };
        let info = data.info().expect("map info");
        // Per-CPU values are handed over 8-byte aligned, one per possible CPU.
        let value_len = if per_cpu {
            let cpus = aya::util::nr_cpus().expect("possible CPUs");
            (info.value_size() as usize).next_multiple_of(8) * cpus
        } else {
            info.value_size() as usize
        };
        // One batched update for the whole array: element by element, the
        // masquerade owners' 2^18 slots cost a guest under emulation 1.5 s
        // of system calls for every test.
        let count = info.max_entries();
        let keys: Vec<u8> = (0..count).flat_map(u32::to_ne_bytes).collect();
        let zeroes = vec![0u8; value_len * count as usize];
        update_batch(data, &keys, &zeroes, count)
            .unwrap_or_else(|e| panic!("zeroing the {count} entries of {name}: {e}"));
    }
}

fn delete_every_key(name: &str, data: &MapData) {
    let info = data.info().expect("map info");
    let mut key = vec![0u8; info.key_size() as usize];
    // The first key, asked anew after each delete, until there is none.
    while map_elem(BPF_MAP_GET_NEXT_KEY, data, &[], key.as_mut_ptr()).is_ok() {
        map_elem(BPF_MAP_DELETE_ELEM, data, &key, std::ptr::null())
            .unwrap_or_else(|e| panic!("deleting a key of {name}: {e}"));
    }
}

const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
const BPF_MAP_GET_NEXT_KEY: libc::c_long = 4;
const BPF_MAP_UPDATE_BATCH: libc::c_long = 26;

/// The batch commands' part of `union bpf_attr` (Linux 5.6).
#[repr(C)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    /// In: how many elements; out: how many were done.
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// Writes `count` elements in one call: `keys` and `values` hold them back
/// to back, each of the map's key and value size.
fn update_batch(data: &MapData, keys: &[u8], values: &[u8], count: u32) -> std::io::Result<()> {
    let mut attr = BatchAttr {
        in_batch: 0,
        out_batch: 0,
        keys: keys.as_ptr() as u64,
        values: values.as_ptr() as u64,
        count,
        map_fd: data.fd().as_fd().as_raw_fd() as u32,
        elem_flags: 0,
        flags: 0,
    };
    // SAFETY: attr points at a live, correctly laid out attribute whose key
    // and value buffers hold `count` elements of the map's sizes and
    // outlive the call.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_MAP_UPDATE_BATCH,
            &raw mut attr,
            std::mem::size_of::<BatchAttr>(),
        )
    };
    if ret < 0 {
        return Err(std::io::Error::last_os_error());
    }
    if attr.count != count {
        return Err(std::io::Error::other(format!(
            "the kernel wrote {} of {count} elements",
            attr.count
        )));
    }
    Ok(())
}

/// One element command on `data`; an empty `key` is NULL (the first key).
fn map_elem(
    cmd: libc::c_long,
    data: &MapData,
    key: &[u8],
    value: *const u8,
) -> std::io::Result<()> {
    let key = if key.is_empty() {
        std::ptr::null()
    } else {
        key.as_ptr()
    };
    // SAFETY: the key and value buffers have the map's key and value sizes
    // and outlive the call (the callers' contract).
    unsafe { bpf_call::map_elem(cmd, data.fd().as_fd(), key, value.cast_mut()) }
}

// ---- packet building and checking -------------------------------------------------

#[derive(Clone, Copy, Debug)]
struct Flow {
    src: IpAddr,
    dst: IpAddr,
    sport: u16,
    dport: u16,
    proto: u8,
    /// TCP flags, or the SCTP chunk type.
    flags: u8,
}

fn fold(mut sum: u32) -> u16 {
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

fn sum16(data: &[u8]) -> u32 {
    data.chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum()
}

fn pseudo_header(src: IpAddr, dst: IpAddr, proto: u8, len: usize) -> Vec<u8> {
    let mut p = Vec::new();
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            p.extend_from_slice(&s.octets());
            p.extend_from_slice(&d.octets());
            p.extend_from_slice(&[0, proto]);
            p.extend_from_slice(&(len as u16).to_be_bytes());
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            p.extend_from_slice(&s.octets());
            p.extend_from_slice(&d.octets());
            p.extend_from_slice(&(len as u32).to_be_bytes());
            p.extend_from_slice(&[0, 0, 0, proto]);
        }
        _ => unreachable!("mixed families"),
    }
    p
}

fn crc32c_full(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in data {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

fn l4_segment(flow: &Flow, payload: &[u8], zero_udp_csum: bool) -> Vec<u8> {
    let mut l4 = Vec::new();
    l4.extend_from_slice(&flow.sport.to_be_bytes());
    l4.extend_from_slice(&flow.dport.to_be_bytes());
    match flow.proto {
        TCP => {
            l4.extend_from_slice(&1000u32.to_be_bytes());
            l4.extend_from_slice(&0u32.to_be_bytes());
            l4.extend_from_slice(&[0x50, flow.flags, 0xff, 0xff, 0, 0, 0, 0]);
        }
        UDP => {
            l4.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
            l4.extend_from_slice(&[0, 0]);
        }
        SCTP => {
            l4.extend_from_slice(&0x1234_5678u32.to_be_bytes()); // verification tag
            l4.extend_from_slice(&[0, 0, 0, 0]); // checksum
            let chunk_len = 4 + payload.len();
            l4.extend_from_slice(&[flow.flags, 0]);
            l4.extend_from_slice(&(chunk_len as u16).to_be_bytes());
        }
        _ => unreachable!(),
    }
    l4.extend_from_slice(payload);
    match flow.proto {
        TCP | UDP => {
            let off = if flow.proto == TCP { 16 } else { 6 };
            if !(flow.proto == UDP && zero_udp_csum) {
                let mut sum = sum16(&pseudo_header(flow.src, flow.dst, flow.proto, l4.len()));
                sum += sum16(&l4);
                let csum = !fold(sum);
                let csum = if csum == 0 && flow.proto == UDP {
                    0xffff
                } else {
                    csum
                };
                l4[off..off + 2].copy_from_slice(&csum.to_be_bytes());
            }
        }
        SCTP => {
            let crc = crc32c_full(&l4);
            l4[8..12].copy_from_slice(&crc.to_le_bytes());
        }
        _ => {}
    }
    l4
}

fn packet(flow: &Flow, payload: &[u8]) -> Vec<u8> {
    build(flow, payload, false)
}

fn build(flow: &Flow, payload: &[u8], zero_udp_csum: bool) -> Vec<u8> {
    frame(
        flow.src,
        flow.dst,
        flow.proto,
        &l4_segment(flow, payload, zero_udp_csum),
    )
}

/// An Ethernet frame holding an IP packet of `proto` from `src` to `dst`
/// carrying `l4` (the IPv4 header's checksum filled in).
fn frame(src: IpAddr, dst: IpAddr, proto: u8, l4: &[u8]) -> Vec<u8> {
    let mut p = vec![0x02, 0, 0, 0, 0, 1, 0x02, 0, 0, 0, 0, 2];
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            p.extend_from_slice(&[0x08, 0x00]);
            let mut ip = vec![0x45, 0];
            ip.extend_from_slice(&((20 + l4.len()) as u16).to_be_bytes());
            ip.extend_from_slice(&[0, 1, 0x40, 0, 64, proto, 0, 0]);
            ip.extend_from_slice(&s.octets());
            ip.extend_from_slice(&d.octets());
            let csum = !fold(sum16(&ip));
            ip[10..12].copy_from_slice(&csum.to_be_bytes());
            p.extend_from_slice(&ip);
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            p.extend_from_slice(&[0x86, 0xdd]);
            p.extend_from_slice(&[0x60, 0, 0, 0]);
            p.extend_from_slice(&(l4.len() as u16).to_be_bytes());
            p.extend_from_slice(&[proto, 64]);
            p.extend_from_slice(&s.octets());
            p.extend_from_slice(&d.octets());
        }
        _ => unreachable!("mixed families"),
    }
    p.extend_from_slice(l4);
    p
}

/// What a packet says about itself, with every checksum verified.
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    src: IpAddr,
    dst: IpAddr,
    sport: u16,
    dport: u16,
}

fn inspect(p: &[u8]) -> Seen {
    let ethertype = u16::from_be_bytes([p[12], p[13]]);
    let (src, dst, proto, l4) = if ethertype == 0x0800 {
        let ip = &p[14..34];
        assert_eq!(
            fold(sum16(ip)),
            0xffff,
            "IPv4 header checksum is wrong: {ip:02x?}"
        );
        let src = IpAddr::V4(Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]));
        let dst = IpAddr::V4(Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]));
        (src, dst, ip[9], &p[34..])
    } else {
        let ip = &p[14..54];
        let src = IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(&ip[8..24]).unwrap()));
        let dst = IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(&ip[24..40]).unwrap()));
        (src, dst, ip[6], &p[54..])
    };
    match proto {
        TCP | UDP => {
            let csum_off = if proto == TCP { 16 } else { 6 };
            let stored = u16::from_be_bytes([l4[csum_off], l4[csum_off + 1]]);
            if !(proto == UDP && stored == 0) {
                let sum = sum16(&pseudo_header(src, dst, proto, l4.len())) + sum16(l4);
                assert_eq!(fold(sum), 0xffff, "L4 checksum of {proto} packet is wrong");
            }
        }
        SCTP => {
            let stored = u32::from_le_bytes([l4[8], l4[9], l4[10], l4[11]]);
            let mut zeroed = l4.to_vec();
            zeroed[8..12].fill(0);
            assert_eq!(stored, crc32c_full(&zeroed), "SCTP CRC32c is wrong");
        }
        _ => panic!("unexpected protocol {proto}"),
    }
    Seen {
        src,
        dst,
        sport: u16::from_be_bytes([l4[0], l4[1]]),
        dport: u16::from_be_bytes([l4[2], l4[3]]),
    }
}

fn seen(src: IpAddr, sport: u16, dst: IpAddr, dport: u16) -> Seen {
    Seen {
        src,
        dst,
        sport,
        dport,
    }
}

/// A full exchange: the client's packet is translated to the container on
/// ingress and the container's answer back to the node address on egress.
fn round_trip(proto: u8, node: IpAddr, client: IpAddr, container: IpAddr) {
    in_node_namespace(move |ifindex| {
        let mut dp = Dataplane::load(ifindex);
        dp.map(None, node.is_ipv6(), 8080, proto, container, 80);
        let opening = if proto == TCP {
            SYN
        } else if proto == SCTP {
            1
        } else {
            0
        };
        let request = Flow {
            src: client,
            dst: node,
            sport: 40000,
            dport: 8080,
            proto,
            flags: opening,
        };
        let translated = dp.ingress(&packet(&request, b"hello"));
        assert_eq!(
            inspect(&translated),
            seen(client, 40000, container, 80),
            "request must be sent to the container"
        );
        assert_eq!(dp.stat(stat::DNAT_NEW), 1, "one new flow counted");

        let answer = Flow {
            src: container,
            dst: client,
            sport: 80,
            dport: 40000,
            proto,
            flags: if proto == TCP {
                SYN | ACK
            } else if proto == SCTP {
                2
            } else {
                0
            },
        };
        let restored = dp.egress(&packet(&answer, b"world!"));
        assert_eq!(
            inspect(&restored),
            seen(node, 8080, client, 40000),
            "answer must come from the address and port the client dialled"
        );
        assert_eq!(dp.stat(stat::REPLY), 1);

        // The rest of the flow follows conntrack.
        let next = Flow {
            flags: if proto == TCP { ACK } else { 0 },
            ..request
        };
        let translated = dp.ingress(&packet(&next, b"more data"));
        assert_eq!(inspect(&translated), seen(client, 40000, container, 80));
    });
}

/// An ICMP (IPv4) or ICMPv6 error from `src` to `dst` quoting `quoted`
/// (an IP packet, no Ethernet header): destination unreachable / port
/// unreachable, or, with `too_big`, fragmentation needed / packet too big
/// with an MTU of 1280. Every checksum right.
fn icmp_error(src: IpAddr, dst: IpAddr, quoted: &[u8], too_big: bool) -> Vec<u8> {
    let v4 = src.is_ipv4();
    let mut icmp = match (v4, too_big) {
        (true, false) => vec![3, 3, 0, 0, 0, 0, 0, 0],
        (true, true) => vec![3, 4, 0, 0, 0, 0, 0x05, 0x00],
        (false, false) => vec![1, 4, 0, 0, 0, 0, 0, 0],
        (false, true) => vec![2, 0, 0, 0, 0, 0, 0x05, 0x00],
    };
    icmp.extend_from_slice(quoted);
    let sum = if v4 {
        sum16(&icmp)
    } else {
        sum16(&pseudo_header(src, dst, 58, icmp.len())) + sum16(&icmp)
    };
    let csum = !fold(sum);
    icmp[2..4].copy_from_slice(&csum.to_be_bytes());
    frame(src, dst, if v4 { 1 } else { 58 }, &icmp)
}

/// What an ICMP error says: its own ends and the ends of the packet it
/// quotes, with its checksum, its IPv4 header's and a quoted IPv4
/// header's verified.
fn inspect_error(p: &[u8]) -> (Seen, Seen) {
    let v4 = u16::from_be_bytes([p[12], p[13]]) == 0x0800;
    let (outer_src, outer_dst, icmp) = if v4 {
        let ip = &p[14..34];
        assert_eq!(
            fold(sum16(ip)),
            0xffff,
            "outer IPv4 header checksum: {ip:02x?}"
        );
        (
            IpAddr::V4(Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15])),
            IpAddr::V4(Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19])),
            &p[34..],
        )
    } else {
        let ip = &p[14..54];
        (
            IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(&ip[8..24]).unwrap())),
            IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(&ip[24..40]).unwrap())),
            &p[54..],
        )
    };
    let sum = if v4 {
        sum16(icmp)
    } else {
        sum16(&pseudo_header(outer_src, outer_dst, 58, icmp.len())) + sum16(icmp)
    };
    assert_eq!(fold(sum), 0xffff, "ICMP checksum of {icmp:02x?}");
    let quoted = &icmp[8..];
    let (src, dst, l4) = if v4 {
        assert_eq!(
            fold(sum16(&quoted[..20])),
            0xffff,
            "quoted IPv4 header checksum: {:02x?}",
            &quoted[..20]
        );
        (
            IpAddr::V4(Ipv4Addr::new(
                quoted[12], quoted[13], quoted[14], quoted[15],
            )),
            IpAddr::V4(Ipv4Addr::new(
                quoted[16], quoted[17], quoted[18], quoted[19],
            )),
            &quoted[20..],
        )
    } else {
        (
            IpAddr::V6(Ipv6Addr::from(
                <[u8; 16]>::try_from(&quoted[8..24]).unwrap(),
            )),
            IpAddr::V6(Ipv6Addr::from(
                <[u8; 16]>::try_from(&quoted[24..40]).unwrap(),
            )),
            &quoted[40..],
        )
    };
    (
        seen(outer_src, 0, outer_dst, 0),
        seen(
            src,
            u16::from_be_bytes([l4[0], l4[1]]),
            dst,
            u16::from_be_bytes([l4[2], l4[3]]),
        ),
    )
}

/// The errors of a translated flow: the container's "port unreachable"
/// leaves (egress) from the host address, quoting the client's packet as
/// the client sent it; a router's "too big" about the container's answer
/// arrives (ingress) and goes on to the container, quoting the answer as
/// the container sent it. Errors about a port no mapping uses, and an
/// error towards the client met at ingress, pass untouched.
fn icmp_errors_follow_their_flow(proto: u8, node: IpAddr, client: IpAddr, container: IpAddr) {
    in_node_namespace(move |ifindex| {
        let mut dp = Dataplane::load(ifindex);
        dp.map(None, node.is_ipv6(), 8080, proto, container, 80);
        let request = Flow {
            src: client,
            dst: node,
            sport: 40000,
            dport: 8080,
            proto,
            flags: if proto == TCP { SYN } else { 0 },
        };
        let translated = dp.ingress(&packet(&request, b"hello"));
        assert_eq!(inspect(&translated), seen(client, 40000, container, 80));

        let unreachable = icmp_error(container, client, &translated[14..], false);
        // Met at the container's side first: left to egress.
        assert_eq!(dp.ingress(&unreachable), unreachable, "ingress leaves it");
        let out = dp.egress(&unreachable);
        assert_eq!(
            inspect_error(&out),
            (seen(node, 0, client, 0), seen(client, 40000, node, 8080)),
            "the container's error, as the client must see it"
        );
        assert_eq!(dp.stat(stat::ICMP_REPLY), 1);

        let answer = Flow {
            src: container,
            dst: client,
            sport: 80,
            dport: 40000,
            proto,
            flags: if proto == TCP { SYN | ACK } else { 0 },
        };
        let restored = dp.egress(&packet(&answer, b"world"));
        assert_eq!(inspect(&restored), seen(node, 8080, client, 40000));
        let too_big = icmp_error(client, node, &restored[14..], true);
        let out = dp.ingress(&too_big);
        assert_eq!(
            inspect_error(&out),
            (
                seen(client, 0, container, 0),
                seen(container, 80, client, 40000)
            ),
            "the router's error, as the container must see it"
        );
        assert_eq!(dp.stat(stat::ICMP_DNAT), 1);

        let unmapped = Flow {
            dport: 9999,
            ..request
        };
        let stray = icmp_error(container, client, &packet(&unmapped, b"x")[14..], false);
        assert_eq!(dp.egress(&stray), stray, "no mapping, no change");
        assert_eq!(dp.stat(stat::ICMP_REPLY), 1);
    });
}

#[test]
fn icmp_errors_of_a_tcp_ipv4_flow_are_translated_with_it() {
    icmp_errors_follow_their_flow(TCP, NODE_V4.into(), CLIENT_V4.into(), CONTAINER_V4.into());
}

#[test]
fn icmp_errors_of_a_udp_ipv6_flow_are_translated_with_it() {
    icmp_errors_follow_their_flow(UDP, NODE_V6.into(), CLIENT_V6.into(), CONTAINER_V6.into());
}

#[test]
fn tcp_ipv4_round_trip() {
    round_trip(TCP, NODE_V4.into(), CLIENT_V4.into(), CONTAINER_V4.into());
}

#[test]
fn tcp_ipv6_round_trip() {
    round_trip(TCP, NODE_V6.into(), CLIENT_V6.into(), CONTAINER_V6.into());
}

#[test]
fn udp_ipv4_round_trip() {
    round_trip(UDP, NODE_V4.into(), CLIENT_V4.into(), CONTAINER_V4.into());
}

#[test]
fn udp_ipv6_round_trip() {
    round_trip(UDP, NODE_V6.into(), CLIENT_V6.into(), CONTAINER_V6.into());
}

#[test]
fn sctp_ipv4_round_trip_keeps_crc32c_valid() {
    round_trip(SCTP, NODE_V4.into(), CLIENT_V4.into(), CONTAINER_V4.into());
}

#[test]
fn sctp_ipv6_round_trip_keeps_crc32c_valid() {
    round_trip(SCTP, NODE_V6.into(), CLIENT_V6.into(), CONTAINER_V6.into());
}

#[test]
fn udp_without_checksum_keeps_it_zero() {
    in_node_namespace(|ifindex| {
        let mut dp = Dataplane::load(ifindex);
        dp.map(None, false, 5353, UDP, CONTAINER_V4.into(), 53);
        let flow = Flow {
            src: CLIENT_V4.into(),
            dst: NODE_V4.into(),
            sport: 1111,
            dport: 5353,
            proto: UDP,
            flags: 0,
        };
        let out = dp.ingress(&build(&flow, b"q", true));
        assert_eq!(
            inspect(&out),
            seen(CLIENT_V4.into(), 1111, CONTAINER_V4.into(), 53)
        );
        assert_eq!(
            &out[34 + 6..34 + 8],
            &[0, 0],
            "a zero UDP checksum means none and must stay zero"
        );
    });
}

#[test]
fn transit_traffic_is_never_translated() {
    in_node_namespace(|ifindex| {
        let mut dp = Dataplane::load(ifindex);
        dp.map(None, false, 8080, TCP, CONTAINER_V4.into(), 80);
        let flow = Flow {
            src: CLIENT_V4.into(),
            dst: FAR_V4.into(),
            sport: 40000,
            dport: 8080,
            proto: TCP,
            flags: SYN,
        };
        let input = packet(&flow, b"");
        assert_eq!(
            dp.ingress(&input),
            input,
            "a packet routed through the node must pass untouched"
        );
        assert_eq!(dp.stat(stat::SKIP_NOT_LOCAL), 1, "counted as not local");
        assert_eq!(dp.stat(stat::DNAT_NEW), 0);
    });
}

/// Issue #51: the FIB answers "not forwarded" for the node's addresses
/// and as well for broadcast, multicast and unroutable destinations; only
/// the node's addresses (`local_addrs`) are a wildcard hostPort's. The
/// rest pass untouched and are counted.
#[test]
fn only_the_nodes_addresses_are_a_wildcard_host_ports() {
    in_node_namespace(|ifindex| {
        let mut dp = Dataplane::load(ifindex);
        dp.map(None, false, 5399, UDP, CONTAINER_V4.into(), 53);
        dp.map(None, true, 5399, UDP, CONTAINER_V6.into(), 53);
        let skipped: [IpAddr; 6] = [
            Ipv4Addr::new(198, 18, 0, 255).into(),
            Ipv4Addr::BROADCAST.into(),
            Ipv4Addr::new(224, 0, 0, 251).into(),
            // No route: the namespace has none beyond its subnets.
            Ipv4Addr::new(203, 0, 113, 7).into(),
            "ff02::1".parse().unwrap(),
            "2001:db8::7".parse().unwrap(),
        ];
        for (n, dst) in skipped.into_iter().enumerate() {
            let src: IpAddr = if dst.is_ipv4() {
                CLIENT_V4.into()
            } else {
                CLIENT_V6.into()
            };
            let input = packet(
                &Flow {
                    src,
                    dst,
                    sport: 40000 + n as u16,
                    dport: 5399,
                    proto: UDP,
                    flags: 0,
                },
                b"x",
            );
            assert_eq!(
                dp.ingress(&input),
                input,
                "a datagram to {dst} passes untouched"
            );
        }
        assert_eq!(
            dp.stat(stat::SKIP_NOT_NODE_ADDRESS),
            skipped.len() as u64,
            "each counted"
        );
        assert_eq!(dp.stat(stat::DNAT_NEW), 0);
        // A node address not synced yet is none of a hostPort's either, and
        // is from the sync on.
        let added: IpAddr = Ipv4Addr::new(198, 18, 0, 9).into();
        let ip = |args: &str| {
            let out = Command::new("ip")
                .args(args.split(' '))
                .output()
                .expect("run ip");
            assert!(out.status.success(), "ip {args}");
        };
        ip("addr add 198.18.0.9/24 dev node0");
        let to_added = packet(
            &Flow {
                src: CLIENT_V4.into(),
                dst: added,
                sport: 41000,
                dport: 5399,
                proto: UDP,
                flags: 0,
            },
            b"x",
        );
        assert_eq!(dp.ingress(&to_added), to_added, "not synced yet");
        dp.add_local_addr(added);
        assert_ne!(dp.ingress(&to_added), to_added, "translated once synced");
        assert_eq!(dp.stat(stat::DNAT_NEW), 1);
        // A specific hostIP is local as soon as the node has it (a VIP
        // keepalived moves here), synced or not.
        let vip = Ipv4Addr::new(198, 18, 0, 10);
        dp.map(Some(vip.into()), false, 5400, UDP, CONTAINER_V4.into(), 53);
        let to_vip = |sport| {
            packet(
                &Flow {
                    src: CLIENT_V4.into(),
                    dst: vip.into(),
                    sport,
                    dport: 5400,
                    proto: UDP,
                    flags: 0,
                },
                b"x",
            )
        };
        assert_eq!(
            dp.ingress(&to_vip(42000)),
            to_vip(42000),
            "not the node's yet"
        );
        ip("addr add 198.18.0.10/24 dev node0");
        assert_ne!(
            dp.ingress(&to_vip(42001)),
            to_vip(42001),
            "the node's, not synced"
        );
        assert_eq!(dp.stat(stat::DNAT_NEW), 2);
    });
}

/// TC_ACT_SHOT: the packet is dropped.
const SHOT: u32 = 2;

/// Issue #39: a packet from a link with a loopback destination or source,
/// for a loopback-bound or a wildcard host port, is dropped and counted,
/// never translated.
#[test]
fn loopback_addresses_from_a_link_are_dropped_not_translated() {
    in_node_namespace(|ifindex| {
        let mut dp = Dataplane::load(ifindex);
        let lo4: IpAddr = "127.0.0.1".parse().unwrap();
        let lo6: IpAddr = "::1".parse().unwrap();
        dp.map(Some(lo4), false, 8097, TCP, CONTAINER_V4.into(), 80);
        dp.map(Some(lo6), true, 8096, UDP, CONTAINER_V6.into(), 53);
        dp.map(None, false, 8098, TCP, CONTAINER_V4.into(), 80);
        dp.map(None, true, 8098, UDP, CONTAINER_V6.into(), 53);
        let cases: [(IpAddr, IpAddr, u16, u8); 7] = [
            (CLIENT_V4.into(), lo4, 8097, TCP),
            (CLIENT_V4.into(), "127.9.9.9".parse().unwrap(), 8098, TCP),
            (CLIENT_V6.into(), lo6, 8096, UDP),
            (CLIENT_V6.into(), lo6, 8098, UDP),
            (
                CLIENT_V6.into(),
                "::ffff:127.0.0.1".parse().unwrap(),
                8098,
                UDP,
            ),
            (lo4, NODE_V4.into(), 8098, TCP),
            (lo6, NODE_V6.into(), 8098, UDP),
        ];
        for (n, (src, dst, dport, proto)) in cases.into_iter().enumerate() {
            let flow = Flow {
                src,
                dst,
                sport: 40000,
                dport,
                proto,
                flags: if proto == TCP { SYN } else { 0 },
            };
            let (action, _) = dp.run_for_action(program_names::TC_INGRESS, &packet(&flow, b"x"));
            assert_eq!(action, SHOT, "{flow:?} must be dropped");
            assert_eq!(
                dp.stat(stat::DROP_LOOPBACK),
                n as u64 + 1,
                "{flow:?} counted"
            );
        }
        assert_eq!(dp.stat(stat::DNAT_NEW), 0, "nothing was translated");
        // The node's real address still is.
        let to_node = Flow {
            src: CLIENT_V4.into(),
            dst: NODE_V4.into(),
            sport: 40001,
            dport: 8098,
            proto: TCP,
            flags: SYN,
        };
        assert_eq!(
            inspect(&dp.ingress(&packet(&to_node, b""))),
            seen(CLIENT_V4.into(), 40001, CONTAINER_V4.into(), 80)
        );
    });
}

#[test]
fn host_ip_mapping_only_matches_its_address() {
    in_node_namespace(|ifindex| {
        let mut dp = Dataplane::load(ifindex);
        let other: IpAddr = "198.18.0.11".parse().unwrap();
        Command::new("ip")
            .args(["addr", "add", "198.18.0.11/24", "dev", "node0"])
            .status()
            .expect("ip");
        dp.map(
            Some(NODE_V4.into()),
            false,
            8080,
            TCP,
            CONTAINER_V4.into(),
            80,
        );
        let to_other = Flow {
            src: CLIENT_V4.into(),
            dst: other,
            sport: 40000,
            dport: 8080,
            proto: TCP,
            flags: SYN,
        };
        let input = packet(&to_other, b"");
        assert_eq!(
            dp.ingress(&input),
            input,
            "another node address is not mapped"
        );
        let to_mapped = Flow {
            dst: NODE_V4.into(),
            ..to_other
        };
        assert_eq!(
            inspect(&dp.ingress(&packet(&to_mapped, b""))),
            seen(CLIENT_V4.into(), 40000, CONTAINER_V4.into(), 80)
        );
    });
}

#[test]
fn replies_to_flows_the_node_opened_are_not_hijacked() {
    in_node_namespace(|ifindex| {
        let mut dp = Dataplane::load(ifindex);
        dp.map(None, false, 8080, UDP, CONTAINER_V4.into(), 80);
        // The node itself sends from port 8080 to a remote DNS server...
        let outbound = Flow {
            src: NODE_V4.into(),
            dst: CLIENT_V4.into(),
            sport: 8080,
            dport: 53,
            proto: UDP,
            flags: 0,
        };
        let input = packet(&outbound, b"query");
        assert_eq!(
            dp.egress(&input),
            input,
            "the node's own traffic leaves untouched"
        );
        assert_eq!(dp.stat(stat::PASS_RECORDED), 1);
        // ...and its answer must reach the node, not the container.
        let answer = Flow {
            src: CLIENT_V4.into(),
            dst: NODE_V4.into(),
            sport: 53,
            dport: 8080,
            proto: UDP,
            flags: 0,
        };
        let input = packet(&answer, b"response");
        assert_eq!(
            dp.ingress(&input),
            input,
            "the answer is the node's, not the container's"
        );
        assert_eq!(dp.stat(stat::SKIP_LOCAL_ORIGIN), 1);

        // TCP: only a SYN opens a translated flow; a stray ACK to a mapped port passes.
        dp.map(None, false, 9090, TCP, CONTAINER_V4.into(), 90);
        let stray = Flow {
            src: CLIENT_V4.into(),
            dst: NODE_V4.into(),
            sport: 443,
            dport: 9090,
            proto: TCP,
            flags: SYN | ACK,
        };
        let input = packet(&stray, b"");
        assert_eq!(
            dp.ingress(&input),
            input,
            "a SYN-ACK answers a connection the node opened"
        );
        assert_eq!(dp.stat(stat::SKIP_NOT_SYN), 1);
    });
}

/// A UDP flow from the client to node port 5000, mapped to the container's
/// port 50: opened by a first datagram and followed by a second, whose
/// re-check of the mapping is the one a per-CPU cache answers from then on.
fn established_udp_flow(dp: &mut Dataplane) -> Flow {
    dp.map(None, false, 5000, UDP, CONTAINER_V4.into(), 50);
    let flow = Flow {
        src: CLIENT_V4.into(),
        dst: NODE_V4.into(),
        sport: 7000,
        dport: 5000,
        proto: UDP,
        flags: 0,
    };
    for payload in [b"1", b"2"] {
        assert_eq!(
            inspect(&dp.ingress(&packet(&flow, payload))),
            seen(CLIENT_V4.into(), 7000, CONTAINER_V4.into(), 50)
        );
    }
    flow
}

#[test]
fn deleted_mapping_stops_forwarding_established_udp_flows() {
    in_node_namespace(|ifindex| {
        let mut dp = Dataplane::load(ifindex);
        let flow = established_udp_flow(&mut dp);
        // The container goes away; its address is given to another container
        // that now owns the mapping with a different port.
        dp.unmap_all();
        let input = packet(&flow, b"3");
        assert_eq!(
            dp.ingress(&input),
            input,
            "no mapping, no translation, even for a known flow"
        );
        let replacement: IpAddr = "10.244.0.9".parse().unwrap();
        dp.map(None, false, 5000, UDP, replacement, 51);
        assert_eq!(
            inspect(&dp.ingress(&packet(&flow, b"4"))),
            seen(CLIENT_V4.into(), 7000, replacement, 51),
            "the next datagram goes to the mapping's new owner"
        );
    });
}

#[test]
fn a_re_pointed_mapping_takes_the_next_packet_of_an_established_flow() {
    in_node_namespace(|ifindex| {
        let mut dp = Dataplane::load(ifindex);
        let flow = established_udp_flow(&mut dp);
        // The same owner's mapping, re-pointed in place (its container got a
        // new address), as ADD does it.
        let moved: IpAddr = "10.244.0.9".parse().unwrap();
        dp.map(None, false, 5000, UDP, moved, 50);
        assert_eq!(
            inspect(&dp.ingress(&packet(&flow, b"3"))),
            seen(CLIENT_V4.into(), 7000, moved, 50),
            "the next datagram follows the mapping, not the cached copy"
        );
        assert_eq!(dp.stat(stat::STALE_FLOW), 1, "the old flow was found stale");
    });
}

#[test]
fn fragments_and_other_protocols_pass_untouched() {
    in_node_namespace(|ifindex| {
        let mut dp = Dataplane::load(ifindex);
        dp.map(None, false, 8080, TCP, CONTAINER_V4.into(), 80);
        let flow = Flow {
            src: CLIENT_V4.into(),
            dst: NODE_V4.into(),
            sport: 40000,
            dport: 8080,
            proto: TCP,
            flags: SYN,
        };
        let mut fragment = packet(&flow, b"abc");
        fragment[14 + 6] = 0x20; // more fragments
        let ip = &mut fragment[14..34];
        ip[10..12].fill(0);
        let csum = !fold(sum16(ip));
        ip[10..12].copy_from_slice(&csum.to_be_bytes());
        assert_eq!(
            dp.ingress(&fragment),
            fragment,
            "fragments carry no reliable ports"
        );
        assert_eq!(dp.stat(stat::SKIP_FRAGMENT), 1);
        let mut arp = vec![0xff; 12];
        arp.extend_from_slice(&[0x08, 0x06]);
        arp.extend_from_slice(&[0; 28]);
        assert_eq!(dp.ingress(&arp), arp, "ARP passes");
    });
}

#[test]
fn a_full_conntrack_table_evicts_old_flows_and_keeps_translating_new_ones() {
    in_node_namespace(|ifindex| {
        let mut dp = Dataplane::load_small_conntrack(ifindex);
        dp.map(None, false, 8080, TCP, CONTAINER_V4.into(), 80);
        let flows = 5000u16;
        for n in 0..flows {
            let syn = Flow {
                src: CLIENT_V4.into(),
                dst: NODE_V4.into(),
                sport: 10000 + n,
                dport: 8080,
                proto: TCP,
                flags: SYN,
            };
            assert_eq!(
                inspect(&dp.ingress(&packet(&syn, b""))),
                seen(CLIENT_V4.into(), 10000 + n, CONTAINER_V4.into(), 80),
                "new flow {n} of {flows} must be translated with a full table"
            );
        }
        assert_eq!(
            dp.stat(stat::CT_INSERT_FAILED),
            0,
            "the LRU makes room instead of failing"
        );
        // The newest flows are still tracked: their next packets follow them.
        for n in flows - 20..flows {
            let ack = Flow {
                src: CLIENT_V4.into(),
                dst: NODE_V4.into(),
                sport: 10000 + n,
                dport: 8080,
                proto: TCP,
                flags: ACK,
            };
            assert_eq!(
                inspect(&dp.ingress(&packet(&ack, b"data"))),
                seen(CLIENT_V4.into(), 10000 + n, CONTAINER_V4.into(), 80),
                "recent flow {n} lost its translation"
            );
        }
    });
}

/// The conntrack ledger (`portmap_common::ct_ledger`): every entry the
/// programs write to a table group or take from it is counted, so that
/// written less taken is what the group holds until the LRU evicts, and
/// what it evicted is the difference. A flood of SYNs through a small
/// table evicts only `conntrack_new`'s entries; the assured flow's stay.
#[test]
fn the_ledger_accounts_for_every_entry_and_names_what_the_table_evicted() {
    in_node_namespace(|ifindex| {
        let mut dp = Dataplane::load_small_conntrack(ifindex);
        dp.map(None, false, 8080, TCP, CONTAINER_V4.into(), 80);
        let held = |dp: &Dataplane, tables: &[&str]| -> u64 {
            tables.iter().map(|t| dp.conntrack(t).len() as u64).sum()
        };
        let new_tables = [map_names::CONNTRACK_NEW];
        let live_tables = [map_names::CONNTRACK, map_names::CONNTRACK_OTHER];
        let new_evicted = |dp: &Dataplane| {
            ct_ledger::evicted(
                dp.stat(stat::CT_NEW_IN),
                dp.stat(stat::CT_NEW_OUT),
                held(dp, &new_tables),
                0,
            )
        };
        let live_evicted = |dp: &Dataplane| {
            ct_ledger::evicted(
                dp.stat(stat::CT_LIVE_IN),
                dp.stat(stat::CT_LIVE_OUT),
                held(dp, &live_tables),
                0,
            )
        };
        // A new flow: two entries written to conntrack_new.
        dp.ingress(&packet(&client_flow(SYN), b""));
        dp.egress(&packet(&container_flow(SYN | ACK), b""));
        assert_eq!(
            (dp.stat(stat::CT_NEW_IN), dp.stat(stat::CT_NEW_OUT)),
            (2, 0)
        );
        // Assured: both move to the live table.
        dp.ingress(&packet(&client_flow(ACK), b"request"));
        assert_eq!(
            (dp.stat(stat::CT_NEW_OUT), dp.stat(stat::CT_LIVE_IN)),
            (2, 2)
        );
        assert_eq!(held(&dp, &live_tables), 2);
        // Closed: both leave the live table (for the closed one).
        dp.ingress(&packet(&client_flow(FIN | ACK), b""));
        dp.egress(&packet(&container_flow(FIN | ACK), b""));
        assert_eq!(dp.stat(stat::CT_LIVE_OUT), 2);
        assert_eq!((new_evicted(&dp), live_evicted(&dp)), (0, 0));

        // One assured flow held open, then a flood of SYNs from other
        // ports, five times the table.
        let held_open = |flags| Flow {
            sport: 39000,
            ..client_flow(flags)
        };
        let answer = |flags| Flow {
            dport: 39000,
            ..container_flow(flags)
        };
        dp.ingress(&packet(&held_open(SYN), b""));
        dp.egress(&packet(&answer(SYN | ACK), b""));
        dp.ingress(&packet(&held_open(ACK), b""));
        let flood = 5 * SMALL_CONNTRACK;
        for n in 0..flood {
            let syn = Flow {
                sport: 10000 + n as u16,
                ..client_flow(SYN)
            };
            dp.ingress(&packet(&syn, b""));
        }
        let written = dp.stat(stat::CT_NEW_IN);
        assert_eq!(written, 2 * (2 + u64::from(flood)));
        let evicted = new_evicted(&dp);
        assert!(
            evicted > 0 && evicted == written - dp.stat(stat::CT_NEW_OUT) - held(&dp, &new_tables),
            "the flood's entries evicted from conntrack_new: {evicted} (written {written}, taken {}, held {})",
            dp.stat(stat::CT_NEW_OUT),
            held(&dp, &new_tables)
        );
        assert_eq!(
            live_evicted(&dp),
            0,
            "no live flow's entry was evicted, and the ledger says so"
        );
        assert_eq!(
            inspect(&dp.egress(&packet(&answer(ACK), b"push"))),
            seen(NODE_V4.into(), 8080, CLIENT_V4.into(), 39000),
            "the held flow's container still speaks through the host port"
        );
    });
}

/// `conntrack -I ARGS` in the test's namespace (the calling thread's):
/// whether the entry was made. It must be on the host; the VM guests'
/// conntrack tool cannot (Debian 12's 1.4.7 in the 6.1 guest answers
/// "invalid parameters", as its `conntrack -L` fails), so there the
/// caller skips what needs the entries, the programs' load on that
/// kernel having been checked already.
fn conntrack_insert(args: &[&str]) -> bool {
    let out = std::process::Command::new("conntrack")
        .arg("-I")
        .args(args)
        .output()
        .expect("run conntrack");
    let in_guest = std::env::var("EPM_EXPECT_KFUNCS").as_deref() == Ok("1");
    if !out.status.success() && in_guest {
        eprintln!(
            "skipped: conntrack -I {args:?} fails in this guest: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        return false;
    }
    assert!(
        out.status.success(),
        "conntrack -I {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    true
}

/// Where netfilter translates the family, an answer leaving from a
/// mapped host port with no flow of ours is netfilter's translated answer
/// of a flow that came in (whose entries a flood evicted): the kernel
/// holds the reversed tuple as an entry's original. It gets no pass
/// entry, which thousands of such answers made among the assured flows.
/// The node's own flow from the port (the kernel holds the reversed tuple
/// as its reply) still gets one, and so does everything where tc
/// translates, as before.
#[test]
fn answers_of_flows_that_came_in_are_never_taken_for_the_nodes_own() {
    in_node_namespace(|ifindex| {
        let mut dp = Dataplane::load(ifindex);
        dp.map(None, false, 8080, UDP, CONTAINER_V4.into(), 80);
        let (client, node, container) = (
            CLIENT_V4.to_string(),
            NODE_V4.to_string(),
            CONTAINER_V4.to_string(),
        );
        // A UDP flow from the client's `port` that netfilter DNATs to the
        // container.
        let inbound = |port: &str| {
            conntrack_insert(&[
                "-p",
                "udp",
                "-s",
                &client,
                "-d",
                &node,
                "--sport",
                port,
                "--dport",
                "8080",
                "-r",
                &container,
                "-q",
                &client,
                "--reply-port-src",
                "80",
                "--reply-port-dst",
                port,
                "-t",
                "60",
            ])
        };
        if !inbound("40300") {
            return;
        }
        // And one the node opened from the mapped port.
        assert!(conntrack_insert(&[
            "-p",
            "udp",
            "-s",
            &node,
            "-d",
            &client,
            "--sport",
            "8080",
            "--dport",
            "53",
            "-r",
            &client,
            "-q",
            &node,
            "--reply-port-src",
            "53",
            "--reply-port-dst",
            "8080",
            "-t",
            "60",
        ]));
        let from_port = |dport| Flow {
            src: NODE_V4.into(),
            dst: CLIENT_V4.into(),
            sport: 8080,
            dport,
            proto: UDP,
            flags: 0,
        };
        dp.fast_path_with(
            local::node_flags::KERNEL_NAT4,
            CONTAINER_V4.into(),
            42,
            ifindex,
        );
        let answer = packet(&from_port(40300), b"answer");
        assert_eq!(dp.egress(&answer), answer, "left as it is");
        assert_eq!(
            dp.stat(stat::PASS_RECORDED),
            0,
            "netfilter's answer of a flow that came in is no flow of the node's"
        );
        dp.egress(&packet(&from_port(53), b"query"));
        assert_eq!(
            dp.stat(stat::PASS_RECORDED),
            1,
            "the node's own flow from the mapped port keeps its pass entry"
        );
        // Where tc translates the family, the same answer is taken for the
        // node's, as before (the kernel's entry is not asked).
        assert!(inbound("40301"));
        dp.fast_path_with(0, CONTAINER_V4.into(), 42, ifindex);
        dp.egress(&packet(&from_port(40301), b"answer"));
        assert_eq!(dp.stat(stat::PASS_RECORDED), 2, "tc translates: as before");
    });
}

/// fastPath: a translated packet from outside is handed to the container
/// (REDIRECT, framed to the container's MAC from the gateway's), but only
/// through the hand-over entry of the mapping's own owner: an entry left by
/// another owner (a container gone without DEL, its address reused) is
/// never followed. Without the flag nothing is redirected.
#[test]
fn fast_path_follows_only_the_mapping_owners_handover() {
    in_node_namespace(|ifindex| {
        let mut dp = Dataplane::load(ifindex);
        let container = IpAddr::V4(CONTAINER_V4);
        dp.map(None, false, 8080, TCP, container, 80);
        let syn = |sport| Flow {
            src: CLIENT_V4.into(),
            dst: NODE_V4.into(),
            sport,
            dport: 8080,
            proto: TCP,
            flags: SYN,
        };

        // Flag off: translated, not redirected.
        let (action, out) = dp.run_for_action(program_names::TC_INGRESS, &packet(&syn(40000), b""));
        assert_eq!(action, 0);
        assert_eq!(inspect(&out), seen(CLIENT_V4.into(), 40000, container, 80));

        // Another owner's entry (the mapping's owner is 42).
        dp.fast_path(container, 43, ifindex);
        let (action, out) = dp.run_for_action(program_names::TC_INGRESS, &packet(&syn(40001), b""));
        assert_eq!(action, 0, "another owner's hand-over must not be followed");
        assert_ne!(out[0..6], CONTAINER_MAC);
        assert_eq!(dp.stat(stat::FAST_FORWARD), 0);

        // The owner's own entry: handed over, new flow and the rest of it.
        dp.fast_path(container, 42, ifindex);
        for (sport, flags) in [(40002, SYN), (40002, ACK)] {
            let flow = Flow {
                flags,
                ..syn(sport)
            };
            let (action, out) = dp.run_for_action(program_names::TC_INGRESS, &packet(&flow, b"x"));
            assert_eq!(action, REDIRECT, "flags {flags:#x}");
            assert_eq!(out[0..6], CONTAINER_MAC, "to the container's MAC");
            assert_eq!(out[6..12], GATEWAY_MAC, "from the gateway's");
            assert_eq!(inspect(&out), seen(CLIENT_V4.into(), 40002, container, 80));
        }
        assert_eq!(dp.stat(stat::FAST_FORWARD), 2);
    });
}

/// The default fast path (confirmed flows only): a flow's handshake is
/// never handed over, and a packet past it asks the kernel's conntrack
/// once; BPF_PROG_TEST_RUN's packet is in no kernel conntrack entry, so
/// the answer is "not confirmed" (on a kernel without the kfuncs, the
/// replaced call answers the same): translated, not redirected, and the
/// answer kept, so the next packets of the flow do not ask again.
#[test]
fn the_confirmed_mode_asks_the_kernel_once_and_keeps_the_answer() {
    in_node_namespace(|ifindex| {
        let mut dp = Dataplane::load(ifindex);
        let container = IpAddr::V4(CONTAINER_V4);
        dp.map(None, false, 8080, TCP, container, 80);
        dp.fast_path_with(local::node_flags::FAST_CONFIRMED, container, 42, ifindex);
        let flow = |flags| Flow {
            src: CLIENT_V4.into(),
            dst: NODE_V4.into(),
            sport: 40100,
            dport: 8080,
            proto: TCP,
            flags,
        };
        for (what, flags) in [("SYN", SYN), ("the handshake's ACK", ACK)] {
            let (action, out) =
                dp.run_for_action(program_names::TC_INGRESS, &packet(&flow(flags), b""));
            assert_eq!(action, 0, "{what}: the normal path");
            assert_eq!(
                inspect(&out),
                seen(CLIENT_V4.into(), 40100, container, 80),
                "{what}"
            );
        }
        assert_eq!(
            dp.stat(stat::CT_UNCONFIRMED) + dp.stat(stat::CT_CONFIRMED),
            0,
            "the handshake asks nothing"
        );
        for round in 0..5 {
            let (action, out) =
                dp.run_for_action(program_names::TC_INGRESS, &packet(&flow(ACK), b"data"));
            assert_eq!(action, 0, "round {round}: not confirmed, the normal path");
            assert_eq!(
                inspect(&out),
                seen(CLIENT_V4.into(), 40100, container, 80),
                "round {round}"
            );
        }
        assert_eq!(
            dp.stat(stat::CT_UNCONFIRMED),
            1,
            "asked once, the answer kept"
        );
        assert_eq!(dp.stat(stat::CT_CONFIRMED), 0);
        assert_eq!(dp.stat(stat::FAST_FORWARD), 0);
    });
}

// ---- TCP state: closing, recovery ----------------------------------------------

/// The client's flow to the node's 8080, mapped to the container's 80.
fn client_flow(flags: u8) -> Flow {
    Flow {
        src: CLIENT_V4.into(),
        dst: NODE_V4.into(),
        sport: 40000,
        dport: 8080,
        proto: TCP,
        flags,
    }
}

/// The container's answer to [`client_flow`], as it leaves towards egress.
fn container_flow(flags: u8) -> Flow {
    Flow {
        src: CONTAINER_V4.into(),
        dst: CLIENT_V4.into(),
        sport: 80,
        dport: 40000,
        proto: TCP,
        flags,
    }
}

fn translated_in() -> Seen {
    seen(CLIENT_V4.into(), 40000, CONTAINER_V4.into(), 80)
}

fn translated_out() -> Seen {
    seen(NODE_V4.into(), 8080, CLIENT_V4.into(), 40000)
}

/// The TCP states of the open flows' entries, assured or not.
fn tcp_states(dp: &Dataplane) -> Vec<u8> {
    let mut states: Vec<(u8, u8)> = dp
        .conntrack(map_names::CONNTRACK)
        .into_iter()
        .chain(dp.conntrack(map_names::CONNTRACK_NEW))
        .map(|(_, entry)| (entry.kind, entry.tcp_state))
        .collect();
    states.sort();
    states.into_iter().map(|(_, state)| state).collect()
}

#[test]
fn a_new_flow_is_syn_only_until_the_handshake_completes() {
    in_node_namespace(|ifindex| {
        let mut dp = Dataplane::load(ifindex);
        dp.map(None, false, 8080, TCP, CONTAINER_V4.into(), 80);
        dp.map(None, false, 5353, UDP, CONTAINER_V4.into(), 53);
        assert_eq!(
            inspect(&dp.ingress(&packet(&client_flow(SYN), b""))),
            translated_in()
        );
        let syn_only = portmap_common::tcp_state::SYN_ONLY;
        assert_eq!(
            tcp_states(&dp),
            vec![syn_only, syn_only],
            "both entries of a flow with only its SYN (DNAT, REPLY)"
        );
        assert_eq!(
            dp.conntrack(map_names::CONNTRACK),
            vec![],
            "a flow not yet assured waits in conntrack_new"
        );
        assert_eq!(
            inspect(&dp.egress(&packet(&container_flow(SYN | ACK), b""))),
            translated_out()
        );
        assert_eq!(
            tcp_states(&dp),
            vec![syn_only, syn_only],
            "a SYN-ACK is not the end of the handshake"
        );
        assert_eq!(
            inspect(&dp.ingress(&packet(&client_flow(ACK), b""))),
            translated_in()
        );
        assert_eq!(
            tcp_states(&dp),
            vec![0, 0],
            "the client's ACK establishes both directions"
        );
        assert_eq!(
            dp.conntrack(map_names::CONNTRACK).len(),
            2,
            "an established flow is assured: both entries moved to conntrack"
        );
        assert_eq!(dp.conntrack(map_names::CONNTRACK_NEW), vec![]);
        assert_eq!(dp.stat(stat::CT_ASSURED), 1, "one flow assured");
        // UDP lives in its own tables: its churn cannot evict TCP flows.
        let datagram = Flow {
            dport: 5353,
            proto: UDP,
            flags: 0,
            ..client_flow(0)
        };
        dp.ingress(&packet(&datagram, b"q"));
        assert_eq!(dp.conntrack(map_names::CONNTRACK).len(), 2, "TCP only");
        // Not assured before an answer and two seconds.
        let other = dp.conntrack(map_names::CONNTRACK_NEW);
        assert_eq!(other.len(), 2, "the UDP flow's two entries: {other:?}");
        assert!(other.iter().all(|(key, _)| key.proto == UDP));
    });
}

#[test]
fn fin_both_ways_moves_the_flow_to_the_closed_table_and_its_last_ack_still_passes() {
    in_node_namespace(|ifindex| {
        let mut dp = Dataplane::load(ifindex);
        dp.map(None, false, 8080, TCP, CONTAINER_V4.into(), 80);
        dp.ingress(&packet(&client_flow(SYN), b""));
        dp.egress(&packet(&container_flow(SYN | ACK), b""));
        dp.ingress(&packet(&client_flow(ACK), b"request"));
        // The client closes first; one FIN is a half-close, the flow lives.
        assert_eq!(
            inspect(&dp.ingress(&packet(&client_flow(FIN | ACK), b""))),
            translated_in()
        );
        assert_eq!(
            dp.conntrack(map_names::CONNTRACK).len(),
            2,
            "half-closed is open"
        );
        assert_eq!(dp.stat(stat::CT_CLOSED), 0);
        assert_eq!(
            inspect(&dp.egress(&packet(&container_flow(ACK), b"late answer"))),
            translated_out(),
            "a half-closed flow still answers"
        );
        // The container's FIN closes it: both entries move.
        assert_eq!(
            inspect(&dp.egress(&packet(&container_flow(FIN | ACK), b""))),
            translated_out()
        );
        assert_eq!(dp.stat(stat::CT_CLOSED), 1);
        assert_eq!(
            dp.conntrack(map_names::CONNTRACK),
            vec![],
            "a closed flow holds no place among the open ones"
        );
        let closed = dp.conntrack(map_names::CONNTRACK_CLOSED);
        assert_eq!(closed.len(), 2, "both directions linger: {closed:?}");
        // The last ACK and a retransmitted FIN follow the closed flow.
        assert_eq!(
            inspect(&dp.ingress(&packet(&client_flow(ACK), b""))),
            translated_in()
        );
        assert_eq!(
            inspect(&dp.egress(&packet(&container_flow(FIN | ACK), b""))),
            translated_out()
        );
        assert_eq!(dp.stat(stat::CT_RECOVERED), 0, "followed, not recovered");
        // The client's port reused: a new flow, open again (not yet
        // assured).
        dp.ingress(&packet(&client_flow(SYN), b""));
        assert_eq!(dp.conntrack(map_names::CONNTRACK_NEW).len(), 2);
        assert_eq!(dp.stat(stat::DNAT_NEW), 2);
    });
}

#[test]
fn a_rst_from_either_end_closes_the_flow() {
    in_node_namespace(|ifindex| {
        let mut dp = Dataplane::load(ifindex);
        dp.map(None, false, 8080, TCP, CONTAINER_V4.into(), 80);
        // The container refuses (RST to the SYN).
        dp.ingress(&packet(&client_flow(SYN), b""));
        assert_eq!(
            inspect(&dp.egress(&packet(&container_flow(RST | ACK), b""))),
            translated_out(),
            "the RST reaches the client translated"
        );
        assert_eq!(dp.stat(stat::CT_CLOSED), 1);
        assert_eq!(dp.conntrack(map_names::CONNTRACK), vec![]);
        assert_eq!(dp.conntrack(map_names::CONNTRACK_CLOSED).len(), 2);
        // The client resets an established flow.
        let other_port = |flow: Flow| Flow {
            sport: 40001,
            ..flow
        };
        let reply = |flow: Flow| Flow {
            dport: 40001,
            ..flow
        };
        dp.ingress(&packet(&other_port(client_flow(SYN)), b""));
        dp.egress(&packet(&reply(container_flow(SYN | ACK)), b""));
        dp.ingress(&packet(&other_port(client_flow(ACK)), b""));
        assert_eq!(dp.conntrack(map_names::CONNTRACK).len(), 2);
        dp.ingress(&packet(&other_port(client_flow(RST)), b""));
        assert_eq!(dp.stat(stat::CT_CLOSED), 2);
        assert_eq!(dp.conntrack(map_names::CONNTRACK), vec![]);
        assert_eq!(dp.conntrack(map_names::CONNTRACK_CLOSED).len(), 4);
    });
}

#[test]
fn a_mid_flow_packet_of_a_lost_flow_is_translated_again_by_its_mapping() {
    in_node_namespace(|ifindex| {
        let mut dp = Dataplane::load(ifindex);
        dp.map(None, false, 8080, TCP, CONTAINER_V4.into(), 80);
        // No entry at all (as after an eviction): the client's next segment.
        assert_eq!(
            inspect(&dp.ingress(&packet(&client_flow(ACK), b"after eviction"))),
            translated_in(),
            "no node socket owns the tuple: recovered"
        );
        assert_eq!(dp.stat(stat::CT_RECOVERED), 1);
        assert_eq!(dp.stat(stat::DNAT_NEW), 0, "recovered, not new");
        assert_eq!(dp.stat(stat::SKIP_NOT_SYN), 0);
        assert_eq!(tcp_states(&dp), vec![0, 0], "recorded again, established");
        assert_eq!(
            dp.conntrack(map_names::CONNTRACK),
            vec![],
            "not assured before its container answers"
        );
        assert_eq!(
            inspect(&dp.egress(&packet(&container_flow(ACK), b"answer"))),
            translated_out(),
            "and its answers are translated back"
        );
        assert_eq!(
            dp.conntrack(map_names::CONNTRACK).len(),
            2,
            "the container's answer assures the recovered flow"
        );
        // Neither a SYN-ACK (the node's own SYN answered) nor a RST is
        // taken for the rest of a lost flow.
        let fresh = |flags| Flow {
            sport: 40002,
            ..client_flow(flags)
        };
        for flags in [SYN | ACK, RST, RST | ACK] {
            let input = packet(&fresh(flags), b"");
            assert_eq!(dp.ingress(&input), input, "flags {flags:#x} pass untouched");
        }
        assert_eq!(dp.stat(stat::SKIP_NOT_SYN), 3);
        assert_eq!(dp.stat(stat::CT_RECOVERED), 1);
    });
}

#[test]
fn a_mid_flow_packet_a_node_socket_owns_is_never_recovered() {
    in_node_namespace(|ifindex| {
        let mut dp = Dataplane::load(ifindex);
        dp.map(None, false, 9090, TCP, CONTAINER_V4.into(), 90);
        // A connection of the node's on the mapped port 9090 (from a client
        // of its own: the namespace has no other host). Its segments to
        // 9090 are that socket's.
        let listener = std::net::TcpListener::bind((NODE_V4, 9090)).expect("listen on 9090");
        let peer = std::net::TcpStream::connect((NODE_V4, 9090)).expect("connect");
        let _accepted = listener.accept().expect("accept");
        let peer_port = peer.local_addr().expect("local address").port();
        let node_flow = Flow {
            src: NODE_V4.into(),
            dst: NODE_V4.into(),
            sport: peer_port,
            dport: 9090,
            proto: TCP,
            flags: ACK,
        };
        let input = packet(&node_flow, b"the node's");
        assert_eq!(dp.ingress(&input), input, "the node's flow is left alone");
        assert_eq!(dp.stat(stat::SKIP_NODE_SOCKET), 1);
        assert_eq!(dp.stat(stat::CT_RECOVERED), 0);
        assert_eq!(
            dp.conntrack(map_names::CONNTRACK),
            vec![],
            "nothing recorded"
        );
        // The listener on the mapped port (as a runtime's port holder) owns
        // no tuple: a client's lost flow to the same port is recovered.
        let client = Flow {
            dport: 9090,
            ..client_flow(ACK)
        };
        assert_eq!(
            inspect(&dp.ingress(&packet(&client, b"lost flow"))),
            seen(CLIENT_V4.into(), 40000, CONTAINER_V4.into(), 90),
            "a listener does not own the client's tuple"
        );
        assert_eq!(dp.stat(stat::CT_RECOVERED), 1);
        assert_eq!(dp.stat(stat::SKIP_NODE_SOCKET), 1);
    });
}

// ---- conditionsV4/conditionsV6 (portmap_common::conditions) --------------------

impl Dataplane {
    /// Sets the `conditions` flag of every mapping, as ADD does for a
    /// configuration with conditions for the mapping's family.
    fn flag_conditions(&mut self) {
        let mut mappings: HashMap<&mut MapData, MappingKey, MappingValue> = HashMap::try_from(
            self.ebpf
                .map_mut(map_names::MAPPINGS)
                .expect("mappings map"),
        )
        .expect("typed mappings map");
        let entries: Vec<_> = mappings.iter().map(|e| e.expect("entry")).collect();
        for (key, mut value) in entries {
            value.conditions = conditions::HAS_CONDITIONS;
            mappings.insert(key, value, 0).expect("flag mapping");
        }
    }

    /// Writes the conditions of owner 42 (every mapping's, see `map`) for
    /// `family`.
    fn set_conditions(&mut self, family: u8, entry: Conditions) {
        let mut table: HashMap<&mut MapData, ConditionKey, Conditions> = HashMap::try_from(
            self.ebpf
                .map_mut(conditions::CONDITIONS_MAP)
                .expect("conditions map"),
        )
        .expect("typed conditions map");
        let key = ConditionKey {
            owner_id: 42,
            family,
            _pad0: [0; 7],
        };
        table.insert(key, entry, 0).expect("insert conditions");
    }
}

/// Conditions whose only condition is `-s` (or `! -s`) `net`/`prefix`.
fn source_condition(net: IpAddr, prefix: u32, negate: bool) -> Conditions {
    let mut words = words_from_addr(net);
    let mut mask = [0u32; 4];
    let mut left = prefix;
    for (word, mask) in words.iter_mut().zip(&mut mask) {
        let bits = left.min(32);
        *mask = u32::MAX.checked_shl(32 - bits).unwrap_or(0).to_be();
        *word &= *mask;
        left -= bits;
    }
    let mut entry = Conditions {
        source_len: 1,
        negated: if negate {
            conditions::negated::SOURCE
        } else {
            0
        },
        ..Conditions::default()
    };
    entry.source[0] = Cidr {
        net_be: words,
        mask_be: mask,
    };
    entry
}

/// A SYN from `src` to the node's 8080 (mapped to the container's 80).
fn syn_from(src: IpAddr, sport: u16) -> Flow {
    Flow {
        src,
        dst: if src.is_ipv4() {
            NODE_V4.into()
        } else {
            NODE_V6.into()
        },
        sport,
        dport: 8080,
        proto: TCP,
        flags: SYN,
    }
}

#[test]
fn conditions_admit_only_their_sources_and_spare_established_flows() {
    in_node_namespace(|ifindex| {
        let mut dp = Dataplane::load(ifindex);
        dp.map(None, false, 8080, TCP, CONTAINER_V4.into(), 80);
        dp.map(None, true, 8080, TCP, CONTAINER_V6.into(), 80);
        dp.flag_conditions();
        dp.set_conditions(4, source_condition(CLIENT_V4.into(), 30, false));
        dp.set_conditions(6, source_condition(CLIENT_V6.into(), 124, false));
        let outsider_v4: IpAddr = "198.18.0.99".parse().unwrap();
        let outsider_v6: IpAddr = "fd18::99".parse().unwrap();
        for outsider in [outsider_v4, outsider_v6] {
            let input = packet(&syn_from(outsider, 40000), b"");
            assert_eq!(
                dp.ingress(&input),
                input,
                "a SYN from {outsider}, outside the conditions, passes untouched"
            );
        }
        assert_eq!(dp.stat(stat::SKIP_CONDITIONS), 2, "both refusals counted");
        assert_eq!(dp.stat(stat::DNAT_NEW), 0);
        assert!(
            dp.conntrack(map_names::CONNTRACK).is_empty(),
            "a refused packet records no flow"
        );
        for (client, container) in [
            (IpAddr::from(CLIENT_V4), IpAddr::from(CONTAINER_V4)),
            (CLIENT_V6.into(), CONTAINER_V6.into()),
        ] {
            assert_eq!(
                inspect(&dp.ingress(&packet(&syn_from(client, 40000), b""))),
                seen(client, 40000, container, 80),
                "a SYN from {client}, inside the conditions, is translated"
            );
        }
        assert_eq!(dp.stat(stat::DNAT_NEW), 2);
        // The conditions change to exclude the client: its established
        // flow goes on, a new flow of it does not.
        dp.set_conditions(4, source_condition(CLIENT_V4.into(), 32, true));
        let established = Flow {
            flags: ACK,
            ..syn_from(CLIENT_V4.into(), 40000)
        };
        assert_eq!(
            inspect(&dp.ingress(&packet(&established, b"data"))),
            seen(CLIENT_V4.into(), 40000, CONTAINER_V4.into(), 80),
            "an established flow is never judged again"
        );
        let input = packet(&syn_from(CLIENT_V4.into(), 40001), b"");
        assert_eq!(dp.ingress(&input), input, "a new flow is");
        assert_eq!(dp.stat(stat::SKIP_CONDITIONS), 3);
        // The negated form admits the former outsider.
        assert_eq!(
            inspect(&dp.ingress(&packet(&syn_from(outsider_v4, 40002), b""))),
            seen(outsider_v4, 40002, CONTAINER_V4.into(), 80)
        );
    });
}

#[test]
fn a_flagged_mapping_without_its_conditions_admits_nothing() {
    in_node_namespace(|ifindex| {
        let mut dp = Dataplane::load(ifindex);
        dp.map(None, false, 8080, TCP, CONTAINER_V4.into(), 80);
        dp.flag_conditions();
        let input = packet(&syn_from(CLIENT_V4.into(), 40000), b"");
        assert_eq!(dp.ingress(&input), input, "fails closed");
        assert_eq!(dp.stat(stat::SKIP_CONDITIONS), 1);
    });
}

#[test]
fn a_mapping_without_the_flag_never_reads_the_conditions() {
    in_node_namespace(|ifindex| {
        let mut dp = Dataplane::load(ifindex);
        dp.map(None, false, 8080, TCP, CONTAINER_V4.into(), 80);
        // An entry that would refuse everyone, for the same owner.
        dp.set_conditions(4, source_condition(CLIENT_V4.into(), 0, true));
        assert_eq!(
            inspect(&dp.ingress(&packet(&syn_from(CLIENT_V4.into(), 40000), b""))),
            translated_in()
        );
        assert_eq!(dp.stat(stat::SKIP_CONDITIONS), 0);
    });
}

#[test]
fn protocol_and_in_interface_conditions_are_checked_per_packet() {
    in_node_namespace(|ifindex| {
        let mut dp = Dataplane::load(ifindex);
        dp.map(None, false, 8080, TCP, CONTAINER_V4.into(), 80);
        dp.map(None, false, 8080, UDP, CONTAINER_V4.into(), 80);
        dp.flag_conditions();
        // -p tcp -i <the node's interface>
        dp.set_conditions(
            4,
            Conditions {
                protocols: conditions::protocol_bits::TCP,
                has_in_interface: 1,
                in_ifindex: ifindex,
                ..Conditions::default()
            },
        );
        assert_eq!(
            inspect(&dp.ingress(&packet(&syn_from(CLIENT_V4.into(), 40000), b""))),
            translated_in(),
            "TCP arriving on the named interface"
        );
        let udp = Flow {
            proto: UDP,
            flags: 0,
            ..syn_from(CLIENT_V4.into(), 40001)
        };
        let input = packet(&udp, b"q");
        assert_eq!(dp.ingress(&input), input, "-p tcp refuses UDP");
        // ! -i <the node's interface>
        dp.set_conditions(
            4,
            Conditions {
                has_in_interface: 1,
                in_ifindex: ifindex,
                negated: conditions::negated::IN_INTERFACE,
                ..Conditions::default()
            },
        );
        let input = packet(&syn_from(CLIENT_V4.into(), 40002), b"");
        assert_eq!(
            dp.ingress(&input),
            input,
            "! -i refuses the named interface"
        );
        assert_eq!(dp.stat(stat::SKIP_CONDITIONS), 2);
    });
}
