//! Where a program's time goes, line by line: the packets of
//! `program_cost.rs` run through `BPF_PROG_TEST_RUN` in a loop on one CPU
//! while perf samples that thread (`portmap_tests::profile`: every sample
//! in the JIT-ed programs is mapped back to its source line, or to the
//! helper or map function the innermost JIT-ed frame called). A sample
//! stands for one sampling period of CPU time, so each line and helper
//! gets nanoseconds per run. Not a pass/fail test: run it by hand, as
//! root, with perf installed,
//!
//! ```sh
//! cargo test --release -p portmap-user --test program_profile -- --ignored --nocapture
//! ```
//!
//! `EPM_PROFILE_RUNS` sets the runs per case (default 2 000 000; fifty times
//! that for a packet the program leaves as it is, run a thousand times per
//! syscall). `cargo xtask bench` profiles the same programs on real
//! traffic.

mod common;

use std::os::fd::{AsFd, AsRawFd};
use std::time::Instant;

use aya::Ebpf;
use common::{ACK, CLIENT, Flow, NODE, in_namespace, tcp_frame};
use portmap_common::program_names;
use portmap_tests::profile::{self, DEFAULT_PERIOD_NS, JitMap};
use portmap_user::dataplane::object::OBJECT;

fn this_cpu() -> usize {
    // SAFETY: no arguments.
    let cpu = unsafe { libc::sched_getcpu() };
    usize::try_from(cpu).expect("sched_getcpu")
}

fn pin_to(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t with one bit set, for this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        let ok = libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &raw const set);
        assert_eq!(ok, 0, "sched_setaffinity");
    }
}

/// Runs `program` `runs` times on `packet`, one run per syscall when it
/// rewrites the packet (the next run must see the packet as sent), else
/// a thousand per syscall.
fn run_loop(ebpf: &Ebpf, program: &str, ifindex: u32, packet: &[u8], runs: u64, rewritten: bool) {
    let (syscalls, repeat) = if rewritten {
        (runs, 1)
    } else {
        (runs / 1000, 1000)
    };
    for _ in 0..syscalls {
        common::run(ebpf, program, ifindex, packet, repeat);
    }
}

#[test]
#[ignore = "a measurement, not a check: run by hand with --ignored --nocapture"]
fn program_profile() {
    let runs: u64 = std::env::var("EPM_PROFILE_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000_000);
    in_namespace(&[], move |ifindex| {
        let cpu = this_cpu();
        pin_to(cpu);
        // SAFETY: no arguments.
        let tid = unsafe { libc::gettid() };
        let (ebpf, _) = common::load(OBJECT);
        let fds: Vec<i32> = [program_names::TC_INGRESS, program_names::TC_EGRESS]
            .into_iter()
            .map(|name| {
                let program = ebpf.program(name).expect("program");
                program.fd().expect("fd").as_fd().as_raw_fd()
            })
            .collect();
        let map = JitMap::of_fds(&fds).expect("the programs' JIT line tables");
        let flow = Flow::new();
        flow.open(&ebpf, ifindex);
        let Flow { syn, ack, answer } = &flow;
        let unrelated_in = tcp_frame(CLIENT, 40002, NODE, 22, ACK);
        // A SYN always starts its flow over from the mappings, so the same
        // SYN again is a new flow's first packet each time (its entries
        // are written anew).
        let cases: [(&str, &str, &[u8], bool); 4] = [
            (
                "uplink ingress, a new flow's SYN",
                program_names::TC_INGRESS,
                syn,
                true,
            ),
            (
                "uplink ingress, established",
                program_names::TC_INGRESS,
                ack,
                true,
            ),
            (
                "uplink egress, its answer",
                program_names::TC_EGRESS,
                answer,
                true,
            ),
            (
                "ingress, unrelated",
                program_names::TC_INGRESS,
                &unrelated_in,
                false,
            ),
        ];
        for (label, program, packet, rewritten) in cases {
            let runs = if rewritten { runs } else { runs * 50 };
            let mut elapsed = 0.0;
            let profile = profile::sample(&map, cpu, Some(tid), DEFAULT_PERIOD_NS, || {
                let started = Instant::now();
                run_loop(&ebpf, program, ifindex, packet, runs, rewritten);
                elapsed = started.elapsed().as_secs_f64();
            })
            .expect("perf");
            let per_run = |count: u64| count as f64 * DEFAULT_PERIOD_NS as f64 / runs as f64;
            println!(
                "\n{label}: {runs} runs in {elapsed:.2} s on CPU {cpu}, {} samples of this thread \
                 (one per {DEFAULT_PERIOD_NS} ns of its CPU time): {:.1} ns/run in all (test-run \
                 loop and syscall included), {:.1} ns/run in the programs and what they call",
                profile.samples,
                per_run(profile.samples),
                per_run(profile.in_programs()),
            );
            for (callee, count) in profile.by_callee() {
                println!("{:8.1} ns/run  {callee}", per_run(count));
            }
            for (function, count) in profile.by_function() {
                println!("{:8.1} ns/run  {function}", per_run(count));
            }
            for (place, count) in profile.ranked() {
                println!(
                    "{:8.1} ns/run {count:6} samples  {}: {place}",
                    per_run(count),
                    place.function
                );
            }
        }
    });
}
