//! What the measurements through `BPF_PROG_TEST_RUN` (`program_cost.rs`,
//! `trace_overhead.rs`) share: a private network namespace with a node
//! interface, the object loaded with one mapping, TCP frames, and one run.
//! Each test file compiles this module on its own, so not every item is
//! used by each.
#![allow(dead_code, reason = "each test crate uses its own part of the helpers")]

use std::{net::Ipv4Addr, time::Duration};

use aya::{
    Ebpf, EbpfLoader,
    maps::{HashMap, MapData},
    programs::{SchedClassifier, TestRun, TestRunOptions},
};
use portmap_common::{MappingKey, MappingValue, map_names, program_names};
use portmap_user::dataplane::{maps::MappedPorts, ownership::words_from_addr};

pub const NODE: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
pub const CLIENT: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
pub const CONTAINER: Ipv4Addr = Ipv4Addr::new(10, 244, 0, 2);
pub const HOST_PORT: u16 = 8080;
pub const CONTAINER_PORT: u16 = 80;
pub const SYN: u8 = 0x02;
pub const ACK: u8 = 0x10;

/// Runs `f` on a thread of its own in a new network namespace holding a
/// veth `node0` (198.18.0.1/24, up, forwarding on), after the `ip`
/// commands of `extra`; `f` gets `node0`'s ifindex.
pub fn in_namespace<T: Send + 'static>(
    extra: &'static [&'static str],
    f: impl FnOnce(u32) -> T + Send + 'static,
) -> T {
    std::thread::spawn(move || {
        // SAFETY: unshare takes no pointers; it affects only this thread,
        // which gets its own network namespace.
        let unshared = unsafe { libc::unshare(libc::CLONE_NEWNET) };
        assert_eq!(unshared, 0, "needs root");
        std::fs::write("/proc/sys/net/ipv4/ip_forward", "1").expect("ip_forward");
        let base = [
            "link set lo up",
            "link add node0 type veth peer name peer0",
            "link set peer0 up",
            "addr add 198.18.0.1/24 dev node0",
            "link set node0 up",
        ];
        for args in base.iter().chain(extra) {
            portmap_tests::rtnl::ip_here(
                &args.split(' ').collect::<Vec<_>>(),
                "in the test's namespace",
            );
        }
        f(portmap_user::node::netlink::interface_index("node0").expect("node0"))
    })
    .join()
    .unwrap_or_else(|p| std::panic::resume_unwind(p))
}

/// An IPv4/TCP frame (the programs do not check checksums).
pub fn tcp_frame(src: Ipv4Addr, sport: u16, dst: Ipv4Addr, dport: u16, flags: u8) -> Vec<u8> {
    let mut p = vec![0u8; 14 + 20 + 20];
    p[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    p[14] = 0x45;
    p[16..18].copy_from_slice(&40u16.to_be_bytes());
    p[22] = 64;
    p[23] = 6;
    p[26..30].copy_from_slice(&src.octets());
    p[30..34].copy_from_slice(&dst.octets());
    p[34..36].copy_from_slice(&sport.to_be_bytes());
    p[36..38].copy_from_slice(&dport.to_be_bytes());
    p[46] = 0x50;
    p[47] = flags;
    p
}

/// The packets of one flow through the mapping of [`load`], client port
/// 40001: its SYN and an ACK as they arrive at the node, and the
/// container's answer.
pub struct Flow {
    pub syn: Vec<u8>,
    pub ack: Vec<u8>,
    pub answer: Vec<u8>,
}

impl Flow {
    pub fn new() -> Flow {
        Flow {
            syn: tcp_frame(CLIENT, 40001, NODE, HOST_PORT, SYN),
            ack: tcp_frame(CLIENT, 40001, NODE, HOST_PORT, ACK),
            answer: tcp_frame(CONTAINER, CONTAINER_PORT, CLIENT, 40001, ACK),
        }
    }

    /// Establishes the flow in `ebpf`: the SYN, then the handshake's ACK
    /// (which clears the SYN-only state), each checked translated on
    /// ingress. The next ACKs are packets of an established flow.
    pub fn open(&self, ebpf: &Ebpf, ifindex: u32) {
        for packet in [&self.syn, &self.ack] {
            let (_, out) = run(ebpf, program_names::TC_INGRESS, ifindex, packet, 1);
            assert_eq!(out[30..34], CONTAINER.octets(), "translated on ingress");
        }
    }
}

/// The object `object` with its tc programs loaded and one mapping, the
/// TCP wildcard `HOST_PORT` -> `CONTAINER:CONTAINER_PORT` of owner 1,
/// written as ADD writes it (ports marked first). Also returns whether the
/// object has the port filter to mark (objects from before it do not).
pub fn load(object: &[u8]) -> (Ebpf, bool) {
    // Its kfunc calls linked for this kernel's vmlinux BTF, loaded by aya:
    // objects of other builds are compared here, on the host, whose
    // nf_conntrack is built in (a module's kfuncs would need
    // `dataplane::load::program`).
    let btf = std::fs::read("/sys/kernel/btf/vmlinux").ok();
    let linked = portmap_user::dataplane::kfunc::link_for_kernel(
        object,
        btf.as_deref(),
        &|_| None,
        portmap_user::dataplane::kfunc::Groups::All,
    )
    .expect("link the object's kfunc calls");
    let mut ebpf = EbpfLoader::new().load(linked.bytes()).expect("load object");
    for name in [program_names::TC_INGRESS, program_names::TC_EGRESS] {
        let program: &mut SchedClassifier = ebpf
            .program_mut(name)
            .expect("program")
            .try_into()
            .expect("tc");
        program.load().expect("verifier");
    }
    let key = MappingKey {
        host_addr_be: [0; 4],
        host_port_be: HOST_PORT.to_be(),
        proto: 6,
        family: 4,
    };
    let value = MappingValue {
        container_addr_be: words_from_addr(CONTAINER.into()),
        container_port_be: CONTAINER_PORT.to_be(),
        owner_id: 1,
        ..MappingValue::default()
    };
    // As ADD does: the programs leave packets of unmarked ports alone.
    let marked = if let Some(aya::maps::Map::Array(ports)) = ebpf.map(map_names::MAPPED_PORTS) {
        MappedPorts::of(ports)
            .expect("map mapped_ports")
            .mark(&key, &value);
        true
    } else {
        false
    };
    let mut mappings: HashMap<&mut MapData, MappingKey, MappingValue> =
        HashMap::try_from(ebpf.map_mut(map_names::MAPPINGS).expect("mappings")).expect("typed");
    mappings.insert(key, value, 0).expect("insert mapping");
    // As every plugin run syncs it: the node's address, where a wildcard
    // mapping answers (an object from before the list has none).
    if let Some(map) = ebpf.map_mut(portmap_common::local::map_names::LOCAL_ADDRS) {
        let mut local: HashMap<&mut MapData, portmap_common::local::LocalAddrKey, u8> =
            HashMap::try_from(map).expect("local_addrs is a hash map");
        let node = portmap_common::local::LocalAddrKey {
            addr_be: words_from_addr(NODE.into()),
            family: 4,
            _pad0: [0; 3],
        };
        local.insert(node, 1, 0).expect("insert the node's address");
    }
    (ebpf, marked)
}

/// Runs tc program `program` `repeat` times on `packet`, arriving on
/// `ifindex`: the kernel's time per run (its average over the repeats),
/// and the packet as the (last) run left it.
pub fn run(
    ebpf: &Ebpf,
    program: &str,
    ifindex: u32,
    packet: &[u8],
    repeat: u32,
) -> (Duration, Vec<u8>) {
    let program: &SchedClassifier = ebpf
        .program(program)
        .expect("program")
        .try_into()
        .expect("tc");
    // __sk_buff up to `ifindex`: ingress_ifindex at 36, ifindex at 40.
    let mut ctx = [0u8; 44];
    ctx[36..40].copy_from_slice(&ifindex.to_ne_bytes());
    ctx[40..44].copy_from_slice(&ifindex.to_ne_bytes());
    let mut out = vec![0u8; packet.len() + 256];
    let mut opts = TestRunOptions::new();
    opts.data_in = Some(packet);
    opts.data_out = Some(&mut out);
    opts.ctx_in = Some(&ctx);
    opts.repeat = repeat;
    let duration = program.test_run(opts).expect("test run").duration;
    (duration, out)
}
