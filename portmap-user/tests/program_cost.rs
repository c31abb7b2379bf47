//! What each program costs, measured on this kernel: its size (xlated and
//! JIT-ed bytes, instructions the verifier processed) and nanoseconds per
//! run through `BPF_PROG_TEST_RUN` for the packets that matter to the
//! default path (issue 16): a packet of an established translated flow on
//! the uplink and its answer, the two bridge-side runs of that flow, a
//! packet for the node that no mapping wants, and routed pod traffic. Not a
//! pass/fail test (timings depend on the machine): run it by hand, as root,
//!
//! ```sh
//! cargo test -p portmap-user --test program_cost -- --ignored --nocapture
//! ```
//!
//! A packet that a run rewrites is run once per syscall (the kernel times
//! the run alone, and the median of many is printed); one left as it is,
//! a thousand times per syscall.
//!
//! With `EPM_COMPARE_OBJECT=path/to/other/object` (e.g. the build before a
//! change: `target/bpfel-unknown-none/release/portmap` of that tree; several
//! paths separated by `:`), every object is measured, their runs
//! interleaved round by round so that the load of a shared machine falls on
//! all alike, side by side.

mod common;

use std::net::Ipv4Addr;

use aya::{
    Ebpf,
    programs::{CgroupSockAddr, ProgramInfo},
};
use common::{
    ACK, CLIENT, CONTAINER, CONTAINER_PORT, Flow, HOST_PORT, NODE, SYN, in_namespace, tcp_frame,
};
use portmap_common::{local, program_names};
use portmap_user::dataplane::object::OBJECT;

const POD: Ipv4Addr = Ipv4Addr::new(10, 244, 0, 5);
const FAR: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 2);

/// The object loaded as `common::load` does, with its socket programs too
/// (for their sizes).
fn load(object: &[u8]) -> Ebpf {
    let (mut ebpf, _) = common::load(object);
    for name in local::program_names::ALL {
        let program: &mut CgroupSockAddr = ebpf
            .program_mut(name)
            .expect("program")
            .try_into()
            .expect("sock_addr");
        program.load().expect("verifier");
    }
    ebpf
}

/// Runs `program` `repeat` times on `packet`: nanoseconds per run (the
/// kernel's average over the repeats), and the packet as the (last) run
/// left it.
fn run(ebpf: &Ebpf, program: &str, ifindex: u32, packet: &[u8], repeat: u32) -> (f64, Vec<u8>) {
    let (duration, out) = common::run(ebpf, program, ifindex, packet, repeat);
    (duration.as_nanos() as f64, out)
}

/// Median nanoseconds per run of each object: of 20 000 single runs, or of
/// 301 batches of 1000 runs when the program leaves the packet as it is;
/// the objects take turns run by run.
fn median_ns(
    objects: &[Ebpf],
    program: &str,
    ifindex: u32,
    packet: &[u8],
    rewritten: bool,
) -> Vec<f64> {
    let (rounds, repeat) = if rewritten { (20_000, 1) } else { (301, 1000) };
    let mut samples: Vec<Vec<f64>> = vec![Vec::with_capacity(rounds); objects.len()];
    for _ in 0..rounds {
        for (ebpf, samples) in objects.iter().zip(&mut samples) {
            samples.push(run(ebpf, program, ifindex, packet, repeat).0);
        }
    }
    samples
        .into_iter()
        .map(|mut samples| {
            samples.sort_by(f64::total_cmp);
            samples[samples.len() / 2]
        })
        .collect()
}

/// An object file's bytes at an 8-byte boundary, as the ELF parser wants
/// them (`include_bytes_aligned!` does this for the embedded one).
struct Aligned {
    words: Vec<u64>,
    len: usize,
}

impl Aligned {
    fn copy_of(bytes: &[u8]) -> Aligned {
        let mut words = vec![0u64; bytes.len().div_ceil(8)];
        for (word, chunk) in words.iter_mut().zip(bytes.chunks(8)) {
            let mut buf = [0u8; 8];
            buf[..chunk.len()].copy_from_slice(chunk);
            *word = u64::from_ne_bytes(buf);
        }
        Aligned {
            words,
            len: bytes.len(),
        }
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: `words` holds at least `len` initialised bytes.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr().cast::<u8>(), self.len) }
    }
}

fn size_line(name: &str, info: &ProgramInfo) -> String {
    format!(
        "{name:<22} xlated {:>6} B  jited {:>6} B  verifier-processed {:>7} insns",
        info.size_translated().unwrap_or(0),
        info.size_jitted(),
        info.verified_instruction_count().unwrap_or(0),
    )
}

#[test]
#[ignore = "a measurement, not a check: run by hand with --ignored --nocapture"]
fn program_cost() {
    // Paths separated by ':', each measured beside this build.
    let others: Vec<(String, Vec<u8>)> = std::env::var("EPM_COMPARE_OBJECT")
        .unwrap_or_default()
        .split(':')
        .filter(|path| !path.is_empty())
        .map(|path| {
            let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
            (path.to_owned(), bytes)
        })
        .collect();
    in_namespace(
        &["route add 198.19.0.0/24 via 198.18.0.2 dev node0"],
        move |ifindex| {
            let others: Vec<(String, Aligned)> = others
                .into_iter()
                .map(|(path, bytes)| (path, Aligned::copy_of(&bytes)))
                .collect();
            let mut objects = vec![load(OBJECT)];
            let mut labels = vec!["this build"];
            for (path, other) in &others {
                objects.push(load(other.bytes()));
                labels.push(path);
            }
            let mut lines = Vec::new();
            for (ebpf, label) in objects.iter().zip(&labels) {
                lines.push(format!("sizes, {label}:"));
                for name in [program_names::TC_INGRESS, program_names::TC_EGRESS]
                    .into_iter()
                    .chain(local::program_names::ALL)
                {
                    let info = ebpf.program(name).expect("program").info().expect("info");
                    lines.push(size_line(name, &info));
                }
            }
            lines.push(format!("ns/run (median): {}", labels.join(" | ")));
            // An established flow; its next ACKs are what is timed.
            let flow = Flow::new();
            for ebpf in &objects {
                flow.open(ebpf, ifindex);
            }
            let (ack, answer) = (&flow.ack, &flow.answer);
            // The packet as ingress left it, on its way into the bridge.
            // Unmarked: BPF_PROG_TEST_RUN refuses a context with `tc_index`
            // set, so this is the full egress path (the lookups, missing),
            // which a marked packet skips before parsing.
            let dnated = tcp_frame(CLIENT, 40001, CONTAINER, CONTAINER_PORT, ACK);
            // The container's answer, as it enters the bridge and leaves the
            // uplink.
            for ebpf in &objects {
                let (_, out) = run(ebpf, program_names::TC_EGRESS, ifindex, answer, 1);
                assert_eq!(out[26..30], NODE.octets(), "answer translated on egress");
            }
            // For the node, no mapping: an SSH session.
            let unrelated_in = tcp_frame(CLIENT, 40002, NODE, 22, ACK);
            let unrelated_out = tcp_frame(NODE, 22, CLIENT, 40002, ACK);
            // A pod talking to a far host through the node, and the answer.
            // Port 80 is also the mapping's container port, so the answer
            // passes the port filter and pays the lookups; from 443 it
            // leaves at the filter.
            let pod_out = tcp_frame(POD, 40003, FAR, 80, ACK);
            let pod_back = tcp_frame(FAR, 80, POD, 40003, ACK);
            let pod_back_unmapped = tcp_frame(FAR, 443, POD, 40004, ACK);
            // A new flow's SYN: every run takes the mapping lookup and the
            // new-flow path again (a SYN always starts over from the
            // mappings), where a mapping's conditions would be checked.
            let syn = tcp_frame(CLIENT, 40005, NODE, HOST_PORT, SYN);
            let cases: [(&str, &str, &[u8], bool); 11] = [
                // What a single timed run costs beyond the program: the floor
                // under the cases timed one run per syscall.
                (
                    "ingress, unrelated, single runs",
                    program_names::TC_INGRESS,
                    &unrelated_in,
                    true,
                ),
                (
                    "uplink ingress, established",
                    program_names::TC_INGRESS,
                    ack,
                    true,
                ),
                (
                    "uplink ingress, new flow (SYN)",
                    program_names::TC_INGRESS,
                    &syn,
                    true,
                ),
                (
                    "uplink egress, its answer",
                    program_names::TC_EGRESS,
                    answer,
                    true,
                ),
                (
                    "bridge egress, DNATed packet",
                    program_names::TC_EGRESS,
                    &dnated,
                    false,
                ),
                (
                    "bridge ingress, answer",
                    program_names::TC_INGRESS,
                    answer,
                    false,
                ),
                (
                    "ingress, unrelated",
                    program_names::TC_INGRESS,
                    &unrelated_in,
                    false,
                ),
                (
                    "egress, unrelated",
                    program_names::TC_EGRESS,
                    &unrelated_out,
                    false,
                ),
                (
                    "bridge ingress, pod out",
                    program_names::TC_INGRESS,
                    &pod_out,
                    false,
                ),
                (
                    "bridge egress, pod back",
                    program_names::TC_EGRESS,
                    &pod_back,
                    false,
                ),
                (
                    "bridge egress, pod back from 443",
                    program_names::TC_EGRESS,
                    &pod_back_unmapped,
                    false,
                ),
            ];
            for (label, program, packet, rewritten) in cases {
                let ns: Vec<String> = median_ns(&objects, program, ifindex, packet, rewritten)
                    .iter()
                    .map(|ns| format!("{ns:7.1}"))
                    .collect();
                lines.push(format!("{label:<32} {} ns/run", ns.join(" | ")));
            }
            for line in lines {
                println!("{line}");
            }
        },
    );
}
