//! Where a program's time goes, line by line: the packets of
//! `program_cost.rs` run through `BPF_PROG_TEST_RUN` in a loop on one CPU
//! while `perf record -e cpu-clock` samples that CPU; every sample inside
//! the JIT-ed programs is mapped back to the source line it came from
//! (the kernel's JIT line table and the program's BTF), every other one
//! is named by its kernel symbol (the helpers, the map code, the test-run
//! loop itself). A sample stands for 1/frequency of CPU time, so each line
//! and helper gets nanoseconds per run. Not a pass/fail test: run it by
//! hand, as root, with perf installed,
//!
//! ```sh
//! cargo test --release -p portmap-user --test program_profile -- --ignored --nocapture
//! ```
//!
//! `EPM_PROFILE_RUNS` sets the runs per case (default 2 000 000; fifty times
//! that for a packet the program leaves as it is, run a thousand times per
//! syscall).

mod common;

use std::collections::BTreeMap;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::process::{Command, Stdio};
use std::time::Instant;

use aya::Ebpf;
use common::{ACK, CLIENT, CONTAINER, HOST_PORT, NODE, SYN, in_namespace, tcp_frame};
use portmap_common::program_names;
use portmap_user::dataplane::object::OBJECT;

/// perf's sampling period: one sample per this many ns of CPU time. A
/// sample costs the sampled thread several microseconds here (a VM's
/// timer interrupt), and the caches it disturbs make the code after it
/// slower: at one per 50 us the programs measured 858 ns per run of what
/// the kernel times at 441. At one per millisecond that is down to noise.
const PERIOD_NS: u64 = 1_000_000;

const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_BTF_GET_FD_BY_ID: libc::c_long = 19;

/// `bpf(cmd, attr)`: the return value, or the error.
fn bpf(cmd: libc::c_long, attr: &mut [u64]) -> std::io::Result<i64> {
    // SAFETY: `attr` is a zero-padded bpf_attr of the size passed.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr.as_mut_ptr(),
            std::mem::size_of_val(attr) as libc::c_uint,
        )
    };
    if ret < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// `BPF_OBJ_GET_INFO_BY_FD` into `info` (a zeroed, 8-byte aligned buffer
/// whose pointer fields the caller filled).
fn object_info(fd: i32, info: &mut [u64]) {
    let mut attr = [0u64; 2];
    attr[0] = u64::from(fd as u32) | ((std::mem::size_of_val(info) as u64) << 32);
    attr[1] = info.as_mut_ptr() as u64;
    bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr).expect("BPF_OBJ_GET_INFO_BY_FD");
}

fn u32_at(words: &[u64], byte: usize) -> u32 {
    let word = words[byte / 8];
    (if byte.is_multiple_of(8) {
        word
    } else {
        word >> 32
    }) as u32
}

/// One JIT-ed function (the program or one of its subprograms): its kernel
/// address range, and where each source line's code starts in it.
struct Function {
    start: u64,
    end: u64,
    /// (JIT address, source location), ascending.
    lines: Vec<(u64, String)>,
}

/// What the kernel says of a loaded program's JIT image: its functions,
/// each with its lines.
fn jit_map(program_fd: i32) -> Vec<Function> {
    // struct bpf_prog_info, by byte offset (include/uapi/linux/bpf.h).
    const NR_JITED_KSYMS: usize = 104;
    const NR_JITED_FUNC_LENS: usize = 108;
    const JITED_KSYMS: usize = 112;
    const JITED_FUNC_LENS: usize = 120;
    const BTF_ID: usize = 128;
    const NR_LINE_INFO: usize = 148;
    const LINE_INFO: usize = 152;
    const JITED_LINE_INFO: usize = 160;
    const NR_JITED_LINE_INFO: usize = 168;
    const LINE_INFO_REC_SIZE: usize = 172;
    const JITED_LINE_INFO_REC_SIZE: usize = 176;
    let mut info = vec![0u64; 32];
    object_info(program_fd, &mut info);
    let nr_ksyms = u32_at(&info, NR_JITED_KSYMS) as usize;
    let nr_lens = u32_at(&info, NR_JITED_FUNC_LENS) as usize;
    let nr_lines = u32_at(&info, NR_LINE_INFO) as usize;
    let nr_jited_lines = u32_at(&info, NR_JITED_LINE_INFO) as usize;
    let btf_id = u32_at(&info, BTF_ID);
    assert_eq!(nr_lines, nr_jited_lines, "one JIT address per line record");
    let mut ksyms = vec![0u64; nr_ksyms];
    let mut lens = vec![0u32; nr_lens];
    let mut lines = vec![[0u32; 4]; nr_lines];
    let mut jited_lines = vec![0u64; nr_jited_lines];
    let mut info = vec![0u64; 32];
    let set = |info: &mut Vec<u64>, byte: usize, value: u64| info[byte / 8] = value;
    let set32 = |info: &mut Vec<u64>, byte: usize, value: u32| {
        let word = &mut info[byte / 8];
        if byte.is_multiple_of(8) {
            *word = (*word & !0xffff_ffff) | u64::from(value);
        } else {
            *word = (*word & 0xffff_ffff) | (u64::from(value) << 32);
        }
    };
    set32(&mut info, NR_JITED_KSYMS, nr_ksyms as u32);
    set32(&mut info, NR_JITED_FUNC_LENS, nr_lens as u32);
    set(&mut info, JITED_KSYMS, ksyms.as_mut_ptr() as u64);
    set(&mut info, JITED_FUNC_LENS, lens.as_mut_ptr() as u64);
    set32(&mut info, NR_LINE_INFO, nr_lines as u32);
    set(&mut info, LINE_INFO, lines.as_mut_ptr() as u64);
    set(&mut info, JITED_LINE_INFO, jited_lines.as_mut_ptr() as u64);
    set32(&mut info, NR_JITED_LINE_INFO, nr_jited_lines as u32);
    set32(&mut info, LINE_INFO_REC_SIZE, 16);
    set32(&mut info, JITED_LINE_INFO_REC_SIZE, 8);
    object_info(program_fd, &mut info);
    let strings = btf_strings(btf_id);
    let string_at = |offset: u32| -> String {
        let tail = &strings[offset as usize..];
        let end = tail.iter().position(|&b| b == 0).unwrap_or(tail.len());
        String::from_utf8_lossy(&tail[..end]).into_owned()
    };
    let mut functions: Vec<Function> = ksyms
        .iter()
        .zip(&lens)
        .map(|(&start, &len)| Function {
            start,
            end: start + u64::from(len),
            lines: Vec::new(),
        })
        .collect();
    for (record, &address) in lines.iter().zip(&jited_lines) {
        let [_insn_off, file_off, line_off, line_col] = *record;
        let file = string_at(file_off);
        let file = file.rsplit('/').next().unwrap_or(&file).to_owned();
        let text = string_at(line_off);
        let location = format!("{file}:{} `{}`", line_col >> 10, text.trim());
        if let Some(function) = functions
            .iter_mut()
            .find(|f| (f.start..f.end).contains(&address))
        {
            function.lines.push((address, location));
        }
    }
    for function in &mut functions {
        function.lines.sort_by_key(|(address, _)| *address);
    }
    functions
}

/// The string section of BTF object `id`.
fn btf_strings(id: u32) -> Vec<u8> {
    let mut attr = [0u64; 2];
    attr[0] = u64::from(id);
    let fd = bpf(BPF_BTF_GET_FD_BY_ID, &mut attr).expect("BPF_BTF_GET_FD_BY_ID");
    // SAFETY: a new descriptor the kernel handed us.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    // struct bpf_btf_info { __u64 btf; __u32 btf_size; __u32 id; ... }.
    let mut info = vec![0u64; 4];
    object_info(fd.as_raw_fd(), &mut info);
    let size = u32_at(&info, 8) as usize;
    let mut raw = vec![0u8; size];
    let mut info = vec![0u64; 4];
    info[0] = raw.as_mut_ptr() as u64;
    info[1] = size as u64;
    object_info(fd.as_raw_fd(), &mut info);
    // struct btf_header { magic u16, version u8, flags u8, hdr_len u32,
    // type_off, type_len, str_off, str_len: u32 }.
    let word =
        |at: usize| u32::from_le_bytes(raw[at..at + 4].try_into().expect("4 bytes")) as usize;
    let (hdr_len, str_off, str_len) = (word(4), word(16), word(20));
    raw[hdr_len + str_off..hdr_len + str_off + str_len].to_vec()
}

/// Where a sampled address is: a source line of one of `functions`, or
/// `None`.
fn locate(functions: &[Function], ip: u64) -> Option<&str> {
    let function = functions.iter().find(|f| (f.start..f.end).contains(&ip))?;
    let at = function
        .lines
        .partition_point(|(address, _)| *address <= ip);
    Some(
        at.checked_sub(1)
            .map_or("(prologue)", |i| &function.lines[i].1),
    )
}

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

/// One sample's call chain, innermost first: (address, symbol).
type Chain = Vec<(u64, String)>;

/// Samples of `cpu` while `work` runs, with their call chains, `tid`'s
/// only.
fn sampled(cpu: usize, tid: i32, work: impl FnOnce()) -> Vec<Chain> {
    let data = std::env::temp_dir().join(format!("epm-profile-{}.data", std::process::id()));
    let mut perf = Command::new("perf")
        .args(["record", "-q", "-g", "-e", "cpu-clock", "-c"])
        .arg(PERIOD_NS.to_string())
        .args(["-C", &cpu.to_string(), "-o"])
        .arg(&data)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("perf record (is perf installed?)");
    // perf needs a moment before it samples.
    std::thread::sleep(std::time::Duration::from_millis(500));
    work();
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(perf.id() as i32, libc::SIGINT) };
    perf.wait().expect("perf record");
    let script = Command::new("perf")
        .args(["script", "-F", "tid,ip,sym", "-i"])
        .arg(&data)
        .output()
        .expect("perf script");
    let _ = std::fs::remove_file(&data);
    // A sample is a line with its thread id, then one line per frame
    // (address, symbol), then an empty line.
    let mut chains = Vec::new();
    let mut current: Option<(i32, Chain)> = None;
    for line in String::from_utf8_lossy(&script.stdout).lines() {
        if line.trim().is_empty() {
            if let Some((sample_tid, chain)) = current.take()
                && sample_tid == tid
            {
                chains.push(chain);
            }
        } else if !line.starts_with(char::is_whitespace) || current.is_none() {
            let sample_tid = line.split_whitespace().next().and_then(|t| t.parse().ok());
            current = sample_tid.map(|t| (t, Vec::new()));
        } else if let Some((_, chain)) = current.as_mut() {
            let mut fields = line.split_whitespace();
            if let Some(ip) = fields
                .next()
                .and_then(|ip| u64::from_str_radix(ip, 16).ok())
            {
                chain.push((ip, fields.next().unwrap_or("[unknown]").to_owned()));
            }
        }
    }
    if let Some((sample_tid, chain)) = current
        && sample_tid == tid
    {
        chains.push(chain);
    }
    chains
}

/// Where a sample's time goes: the source line of the innermost JIT-ed
/// frame, and the kernel function that frame called if the sample was in
/// the kernel below it (a helper, or the map code a lookup is inlined
/// to); `None` for a sample with no frame of ours (the test-run loop, the
/// syscall).
fn place_of(functions: &[Function], chain: &Chain) -> Option<String> {
    let ours = chain
        .iter()
        .position(|(ip, _)| locate(functions, *ip).is_some())?;
    let (ip, _) = &chain[ours];
    if ours == 0 {
        return locate(functions, *ip).map(str::to_owned);
    }
    // A return address: the call is the instruction before it.
    let line = locate(functions, ip - 1).unwrap_or("?");
    let (_, called) = &chain[ours - 1];
    Some(format!("{line} -> {called}"))
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
        let functions: Vec<Function> = [program_names::TC_INGRESS, program_names::TC_EGRESS]
            .into_iter()
            .flat_map(|name| {
                let program = ebpf.program(name).expect("program");
                jit_map(program.fd().expect("fd").as_fd().as_raw_fd())
            })
            .collect();
        let syn = tcp_frame(CLIENT, 40001, NODE, HOST_PORT, SYN);
        let ack = tcp_frame(CLIENT, 40001, NODE, HOST_PORT, ACK);
        for packet in [&syn, &ack] {
            let (_, out) = common::run(&ebpf, program_names::TC_INGRESS, ifindex, packet, 1);
            assert_eq!(out[30..34], CONTAINER.octets(), "translated on ingress");
        }
        let answer = tcp_frame(CONTAINER, common::CONTAINER_PORT, CLIENT, 40001, ACK);
        let unrelated_in = tcp_frame(CLIENT, 40002, NODE, 22, ACK);
        // A SYN always starts its flow over from the mappings, so the same
        // SYN again is a new flow's first packet each time (its entries
        // are written anew).
        let cases: [(&str, &str, &[u8], bool); 4] = [
            (
                "uplink ingress, a new flow's SYN",
                program_names::TC_INGRESS,
                &syn,
                true,
            ),
            (
                "uplink ingress, established",
                program_names::TC_INGRESS,
                &ack,
                true,
            ),
            (
                "uplink egress, its answer",
                program_names::TC_EGRESS,
                &answer,
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
            let samples = sampled(cpu, tid, || {
                let started = Instant::now();
                run_loop(&ebpf, program, ifindex, packet, runs, rewritten);
                elapsed = started.elapsed().as_secs_f64();
            });
            let mut by_place: BTreeMap<String, u64> = BTreeMap::new();
            let mut ours = 0u64;
            for chain in &samples {
                if let Some(place) = place_of(&functions, chain) {
                    ours += 1;
                    *by_place.entry(place).or_default() += 1;
                }
            }
            let per_run = |count: u64| count as f64 * PERIOD_NS as f64 / runs as f64;
            println!(
                "\n{label}: {runs} runs in {elapsed:.2} s on CPU {cpu}, {} samples of this thread \
                 (one per {PERIOD_NS} ns of its CPU time): {:.1} ns/run in all (test-run loop and \
                 syscall included), {:.1} ns/run in the programs and what they call",
                samples.len(),
                per_run(samples.len() as u64),
                per_run(ours),
            );
            let mut places: Vec<(String, u64)> = by_place.into_iter().collect();
            places.sort_by_key(|place| std::cmp::Reverse(place.1));
            for (place, count) in &places {
                println!(
                    "{:8.1} ns/run {:6} samples  {place}",
                    per_run(*count),
                    count
                );
            }
        }
    });
}
