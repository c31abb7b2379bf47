//! What tracing costs the dataplane, measured with `BPF_PROG_TEST_RUN`:
//! prints nanoseconds per packet with tracing off, on for another port, and
//! on for the packet's port. Not a pass/fail test (timings depend on the
//! machine): run it by hand, as root,
//!
//! ```sh
//! cargo test -p portmap-user --test trace_overhead -- --ignored --nocapture
//! ```
//!
//! It uses only the map and program names, so the same file measures an
//! object built without tracing, for comparison.

use std::{net::Ipv4Addr, process::Command, time::Duration};

use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, HashMap, MapData, RingBuf},
    programs::{SchedClassifier, TestRun, TestRunOptions},
};
use portmap_common::{MappingKey, MappingValue, map_names, program_names};
use portmap_user::dataplane::{maps::MappedPorts, object::OBJECT, ownership::words_from_addr};

const NODE: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
const CLIENT: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
const CONTAINER: Ipv4Addr = Ipv4Addr::new(10, 244, 0, 2);

fn in_namespace<T: Send + 'static>(f: impl FnOnce(u32) -> T + Send + 'static) -> T {
    std::thread::spawn(move || {
        // SAFETY: affects only this thread.
        assert_eq!(
            // SAFETY: unshare takes no pointers; the test thread gets its own netns.
            unsafe { libc::unshare(libc::CLONE_NEWNET) },
            0,
            "needs root"
        );
        std::fs::write("/proc/sys/net/ipv4/ip_forward", "1").expect("ip_forward");
        for args in [
            "link set lo up",
            "link add node0 type veth peer name peer0",
            "link set peer0 up",
            "addr add 198.18.0.1/24 dev node0",
            "link set node0 up",
        ] {
            let ok = Command::new("ip")
                .args(args.split(' '))
                .status()
                .expect("ip")
                .success();
            assert!(ok, "ip {args}");
        }
        f(portmap_user::node::netlink::interface_index("node0").expect("node0"))
    })
    .join()
    .unwrap_or_else(|p| std::panic::resume_unwind(p))
}

/// An IPv4/TCP frame (checksums are not checked by the programs).
fn tcp_frame(src: Ipv4Addr, sport: u16, dst: Ipv4Addr, dport: u16, flags: u8) -> Vec<u8> {
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

fn load(ifindex: u32) -> Ebpf {
    let mut ebpf = EbpfLoader::new().load(OBJECT).expect("load object");
    for name in [program_names::TC_INGRESS, program_names::TC_EGRESS] {
        let program: &mut SchedClassifier = ebpf
            .program_mut(name)
            .expect("program")
            .try_into()
            .expect("tc");
        program.load().expect("verifier");
    }
    let _ = ifindex;
    let mut mappings: HashMap<&mut MapData, MappingKey, MappingValue> =
        HashMap::try_from(ebpf.map_mut(map_names::MAPPINGS).expect("mappings")).expect("typed");
    let key = MappingKey {
        host_addr_be: [0; 4],
        host_port_be: 8080u16.to_be(),
        proto: 6,
        family: 4,
    };
    let value = MappingValue {
        container_addr_be: words_from_addr(CONTAINER.into()),
        container_port_be: 80u16.to_be(),
        owner_id: 1,
        ..MappingValue::default()
    };
    mappings.insert(key, value, 0).expect("insert mapping");
    // As ADD does (the programs leave packets of unmarked ports alone).
    let Some(aya::maps::Map::Array(ports)) = ebpf.map(map_names::MAPPED_PORTS) else {
        panic!("no mapped_ports array in the object");
    };
    MappedPorts::of(ports)
        .expect("map mapped_ports")
        .mark(&key, &value);
    ebpf
}

/// Sets the trace filter (enabled, port) if the object has one; raw bytes so
/// this file also builds against the schema of an object without tracing.
fn set_trace(ebpf: &mut Ebpf, enabled: bool, port: u16) -> bool {
    let Some(map) = ebpf.map_mut("trace_filter") else {
        return false;
    };
    let mut filter: Array<&mut MapData, [u8; 16]> = Array::try_from(map).expect("filter");
    let mut value = [0u8; 16];
    if enabled {
        value[0] = 1;
        value[4..8].copy_from_slice(&std::process::id().to_ne_bytes());
        value[8..10].copy_from_slice(&port.to_be().to_ne_bytes());
    }
    filter.set(0, value, 0).expect("set filter");
    true
}

/// Reads (and drops) whatever the programs emitted, as a tracer would.
fn drain(ring: &mut Option<RingBuf<MapData>>) -> usize {
    let Some(ring) = ring else {
        return 0;
    };
    let mut n = 0;
    while ring.next().is_some() {
        n += 1;
    }
    n
}

fn run(ebpf: &Ebpf, ifindex: u32, packet: &[u8], repeat: u32) -> Duration {
    run_out(ebpf, ifindex, packet, repeat).0
}

fn run_out(ebpf: &Ebpf, ifindex: u32, packet: &[u8], repeat: u32) -> (Duration, Vec<u8>) {
    let program: &SchedClassifier = ebpf
        .program(program_names::TC_INGRESS)
        .expect("program")
        .try_into()
        .expect("tc");
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

#[test]
#[ignore = "a measurement, not a check: run by hand with --ignored --nocapture"]
fn trace_overhead() {
    in_namespace(|ifindex| {
        let mut ebpf = load(ifindex);
        // 1. The common packet: for the node but no mapped port. Nothing is
        //    rewritten, so one syscall can run it a million times.
        let unmapped = tcp_frame(CLIENT, 40000, NODE, 22, 0x10);
        // 2. A packet of a translated flow: each run rewrites the packet,
        //    so one run per syscall (the kernel times the run alone).
        let syn = tcp_frame(CLIENT, 40001, NODE, 8080, 0x02);
        let ack = tcp_frame(CLIENT, 40001, NODE, 8080, 0x10);
        let (_, out) = run_out(&ebpf, ifindex, &syn, 1);
        assert_eq!(out[30..34], CONTAINER.octets(), "the SYN is translated");
        let (_, out) = run_out(&ebpf, ifindex, &ack, 1);
        assert_eq!(out[30..34], CONTAINER.octets(), "the ACK is translated");

        let has_trace = set_trace(&mut ebpf, false, 0);
        // Mapped once, like a tracer: mapping it per read would evict the
        // caches the next run then misses.
        let mut ring = ebpf
            .take_map("trace_events")
            .map(|map| RingBuf::try_from(map).expect("ring"));
        let mut report = Vec::new();
        // (label, tracing on, filter port for the unmapped packet, for the translated one)
        let modes: &[(&str, bool, u16, u16)] = if has_trace {
            &[
                ("tracing off", false, 0, 0),
                ("tracing on, another port", true, 9999, 9999),
                ("tracing on, this port", true, 22, 8080),
            ]
        } else {
            &[("no tracing in this build", false, 0, 0)]
        };
        for &(label, enabled, idle_port, flow_port) in modes {
            // Batches of 1000 with the ring buffer drained in between, so
            // every traced packet really emits its event.
            set_trace(&mut ebpf, enabled, idle_port);
            let mut idle = Vec::new();
            for _ in 0..301 {
                idle.push(run(&ebpf, ifindex, &unmapped, 1000).as_nanos() as f64);
                drain(&mut ring);
            }
            idle.sort_by(f64::total_cmp);
            set_trace(&mut ebpf, enabled, flow_port);
            let mut translated = Vec::new();
            for _ in 0..20_000 {
                translated.push(run(&ebpf, ifindex, &ack, 1).as_nanos() as f64);
                drain(&mut ring);
            }
            translated.sort_by(f64::total_cmp);
            report.push(format!(
                "{label:<26} unmapped packet {:6.1} ns   translated packet {:6.0} ns",
                idle[idle.len() / 2],
                translated[translated.len() / 2]
            ));
        }
        set_trace(&mut ebpf, false, 0);
        for line in report {
            println!("{line}");
        }
    });
}
