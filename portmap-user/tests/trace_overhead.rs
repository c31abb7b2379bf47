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

mod common;

use std::time::Duration;

use aya::{
    Ebpf,
    maps::{Array, MapData, RingBuf},
};
use common::{CLIENT, CONTAINER, NODE, in_namespace, tcp_frame};
use portmap_common::program_names;
use portmap_user::dataplane::object::OBJECT;

fn load() -> Ebpf {
    let (ebpf, marked) = common::load(OBJECT);
    assert!(marked, "no mapped_ports array in the object");
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
    common::run(ebpf, program_names::TC_INGRESS, ifindex, packet, repeat)
}

#[test]
#[ignore = "a measurement, not a check: run by hand with --ignored --nocapture"]
fn trace_overhead() {
    in_namespace(&[], |ifindex| {
        let mut ebpf = load();
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
