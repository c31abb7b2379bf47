//! Where loaded programs spend their time, line by line: `perf record -e
//! cpu-clock -g` samples a CPU while a load runs, and every sample whose
//! call chain has a frame in a JIT-ed program is mapped back to that
//! frame's source line (the kernel's JIT line table and the program's
//! BTF), with the kernel function it called if the sample was below it (a
//! helper, or the map code a lookup is inlined to). A sample stands for
//! one sampling period of CPU time.
//!
//! Used by `cargo xtask bench` on real traffic and by
//! `portmap-user/tests/program_profile.rs` on `BPF_PROG_TEST_RUN` loops.
//! Reads programs through the bpf syscall (`BPF_OBJ_GET_INFO_BY_FD`,
//! `BPF_BTF_GET_FD_BY_ID`), no library: aya's `ProgramInfo` has no line
//! tables.

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

/// The sampling period, ns of CPU time per sample. A sample costs the
/// sampled CPU several microseconds in a VM (its timer interrupt) and
/// disturbs its caches: at one per 50 us the programs measured 858 ns per
/// run where the kernel times 441; at one per millisecond, within noise.
pub const DEFAULT_PERIOD_NS: u64 = 1_000_000;

const BPF_OBJ_GET: libc::c_long = 7;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_BTF_GET_FD_BY_ID: libc::c_long = 19;

/// `bpf(cmd, attr)`: the return value, or the error.
fn bpf(cmd: libc::c_long, attr: &mut [u64]) -> std::io::Result<i64> {
    // SAFETY: `attr` is a zero-padded bpf_attr of the size passed, whose
    // pointers (if any) the caller set to live buffers.
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

/// `BPF_OBJ_GET_INFO_BY_FD` into `info` (zeroed but for the pointer and
/// count fields the caller set).
fn object_info(fd: i32, info: &mut [u64]) -> std::io::Result<()> {
    let mut attr = [0u64; 2];
    attr[0] = u64::from(fd as u32) | ((std::mem::size_of_val(info) as u64) << 32);
    attr[1] = info.as_mut_ptr() as u64;
    bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr).map(|_| ())
}

fn get32(words: &[u64], byte: usize) -> u32 {
    let word = words[byte / 8];
    (if byte.is_multiple_of(8) {
        word
    } else {
        word >> 32
    }) as u32
}

fn set32(words: &mut [u64], byte: usize, value: u32) {
    let word = &mut words[byte / 8];
    if byte.is_multiple_of(8) {
        *word = (*word & !0xffff_ffff) | u64::from(value);
    } else {
        *word = (*word & 0xffff_ffff) | (u64::from(value) << 32);
    }
}

/// One JIT-ed function (a program or one of its subprograms): its kernel
/// address range, and where each source line's code starts in it.
struct Function {
    start: u64,
    end: u64,
    /// (JIT address, source location), ascending.
    lines: Vec<(u64, String)>,
}

/// The JIT images of a set of loaded programs, with their line tables.
pub struct JitMap {
    functions: Vec<Function>,
}

impl JitMap {
    /// The programs of these file descriptors.
    pub fn of_fds(fds: &[i32]) -> std::io::Result<JitMap> {
        let mut functions = Vec::new();
        for &fd in fds {
            functions.extend(functions_of(fd)?);
        }
        Ok(JitMap { functions })
    }

    /// The programs pinned at these paths.
    pub fn of_pins(pins: &[&Path]) -> std::io::Result<JitMap> {
        let mut fds = Vec::new();
        for pin in pins {
            fds.push(open_pin(pin)?);
        }
        let raw: Vec<i32> = fds.iter().map(AsRawFd::as_raw_fd).collect();
        JitMap::of_fds(&raw)
    }

    /// The source line of the code at `ip`, if it is in one of the programs.
    fn locate(&self, ip: u64) -> Option<&str> {
        let function = self
            .functions
            .iter()
            .find(|f| (f.start..f.end).contains(&ip))?;
        let at = function
            .lines
            .partition_point(|(address, _)| *address <= ip);
        Some(
            at.checked_sub(1)
                .map_or("(prologue)", |i| &function.lines[i].1),
        )
    }

    /// Where a sample's time goes: the source line of the innermost JIT-ed
    /// frame, with the kernel function that frame called if the sample was
    /// below it; `None` for a sample with no frame of these programs.
    fn place_of(&self, chain: &[(u64, String)]) -> Option<Place> {
        let ours = chain
            .iter()
            .position(|(ip, _)| self.locate(*ip).is_some())?;
        let (ip, symbol) = &chain[ours];
        let function = function_name(symbol).to_owned();
        if ours == 0 {
            return self.locate(*ip).map(|line| Place {
                function,
                line: line.to_owned(),
                callee: None,
            });
        }
        // A return address: the call is the instruction before it.
        let line = self.locate(ip - 1).unwrap_or("?").to_owned();
        let (_, called) = &chain[ours - 1];
        Some(Place {
            function,
            line,
            callee: Some(called.clone()),
        })
    }
}

fn open_pin(path: &Path) -> std::io::Result<OwnedFd> {
    let name = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    // union bpf_attr { struct { __aligned_u64 pathname; __u32 bpf_fd;
    // __u32 file_flags; ... } }.
    let mut attr = [0u64; 3];
    attr[0] = name.as_ptr() as u64;
    let fd = bpf(BPF_OBJ_GET, &mut attr)?;
    // SAFETY: a new descriptor the kernel handed us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// What the kernel says of a loaded program's JIT image.
fn functions_of(program_fd: i32) -> std::io::Result<Vec<Function>> {
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
    object_info(program_fd, &mut info)?;
    let nr_ksyms = get32(&info, NR_JITED_KSYMS);
    let nr_lens = get32(&info, NR_JITED_FUNC_LENS);
    let nr_lines = get32(&info, NR_LINE_INFO);
    let nr_jited_lines = get32(&info, NR_JITED_LINE_INFO);
    let btf_id = get32(&info, BTF_ID);
    if nr_lines != nr_jited_lines {
        return Err(std::io::Error::other(
            "the program has no JIT address for each line record",
        ));
    }
    let mut ksyms = vec![0u64; nr_ksyms as usize];
    let mut lens = vec![0u32; nr_lens as usize];
    // struct bpf_line_info { insn_off, file_name_off, line_off, line_col }.
    let mut lines = vec![[0u32; 4]; nr_lines as usize];
    let mut jited_lines = vec![0u64; nr_jited_lines as usize];
    let mut info = vec![0u64; 32];
    set32(&mut info, NR_JITED_KSYMS, nr_ksyms);
    set32(&mut info, NR_JITED_FUNC_LENS, nr_lens);
    info[JITED_KSYMS / 8] = ksyms.as_mut_ptr() as u64;
    info[JITED_FUNC_LENS / 8] = lens.as_mut_ptr() as u64;
    set32(&mut info, NR_LINE_INFO, nr_lines);
    info[LINE_INFO / 8] = lines.as_mut_ptr() as u64;
    info[JITED_LINE_INFO / 8] = jited_lines.as_mut_ptr() as u64;
    set32(&mut info, NR_JITED_LINE_INFO, nr_jited_lines);
    set32(&mut info, LINE_INFO_REC_SIZE, 16);
    set32(&mut info, JITED_LINE_INFO_REC_SIZE, 8);
    object_info(program_fd, &mut info)?;
    let strings = btf_strings(btf_id)?;
    let string_at = |offset: u32| -> String {
        let tail = strings.get(offset as usize..).unwrap_or_default();
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
        let location = format!("{file}:{} `{}`", line_col >> 10, string_at(line_off).trim());
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
    Ok(functions)
}

/// The string section of BTF object `id`.
fn btf_strings(id: u32) -> std::io::Result<Vec<u8>> {
    let mut attr = [0u64; 2];
    attr[0] = u64::from(id);
    let fd = bpf(BPF_BTF_GET_FD_BY_ID, &mut attr)?;
    // SAFETY: a new descriptor the kernel handed us.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    // struct bpf_btf_info { __u64 btf; __u32 btf_size; __u32 id; ... }.
    let mut info = vec![0u64; 4];
    object_info(fd.as_raw_fd(), &mut info)?;
    let size = get32(&info, 8) as usize;
    let mut raw = vec![0u8; size];
    let mut info = vec![0u64; 4];
    info[0] = raw.as_mut_ptr() as u64;
    info[1] = size as u64;
    object_info(fd.as_raw_fd(), &mut info)?;
    // struct btf_header { magic u16, version u8, flags u8, hdr_len u32,
    // type_off, type_len, str_off, str_len: u32 }.
    let word = |at: usize| -> usize {
        raw.get(at..at + 4)
            .map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
    };
    let (hdr_len, str_off, str_len) = (word(4), word(16), word(20));
    raw.get(hdr_len + str_off..hdr_len + str_off + str_len)
        .map(<[u8]>::to_vec)
        .ok_or_else(|| std::io::Error::other("BTF string section out of bounds"))
}

/// The name of a JIT-ed function as the kernel's symbol for it spells it,
/// `bpf_prog_<tag>_<name>`: the program's or subprogram's name (which the
/// kernel cuts to 15 characters). Another symbol is returned whole.
fn function_name(symbol: &str) -> &str {
    symbol
        .strip_prefix("bpf_prog_")
        .and_then(|rest| rest.split_once('_'))
        .map_or(symbol, |(_tag, name)| name)
}

/// A place of a profile: a source line of the programs, the JIT-ed
/// function (program or subprogram) it was compiled into, and the kernel
/// function it called when the time was spent below it. The function tells
/// apart the call sites that the source line cannot: every map update of
/// the programs is the same line of aya's inlined helper wrapper.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Place {
    pub line: String,
    pub callee: Option<String>,
    pub function: String,
}

impl std::fmt::Display for Place {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.callee {
            Some(callee) => write!(f, "{} -> {callee}", self.line),
            None => f.write_str(&self.line),
        }
    }
}

/// A profile: CPU time by place, in samples of `period_ns`.
#[derive(Debug, Clone, Default)]
pub struct Profile {
    pub period_ns: u64,
    /// Samples of the CPU (or thread) while the work ran.
    pub samples: u64,
    /// Samples with a frame in the programs, by place.
    pub places: BTreeMap<Place, u64>,
}

impl Profile {
    /// Samples in the programs and what they called.
    pub fn in_programs(&self) -> u64 {
        self.places.values().sum()
    }

    /// The places, most samples first.
    pub fn ranked(&self) -> Vec<(&Place, u64)> {
        let mut places: Vec<(&Place, u64)> = self.places.iter().map(|(p, &n)| (p, n)).collect();
        places.sort_by_key(|&(_, n)| std::cmp::Reverse(n));
        places
    }

    /// The samples summed by JIT-ed function and what it called: the
    /// function's own code, and each helper or map function it called.
    /// Most samples first.
    pub fn by_function(&self) -> Vec<(String, u64)> {
        let mut sums: BTreeMap<String, u64> = BTreeMap::new();
        for (place, &n) in &self.places {
            let key = match &place.callee {
                Some(callee) => format!("{} -> {callee}", place.function),
                None => format!("{} (own code)", place.function),
            };
            *sums.entry(key).or_default() += n;
        }
        let mut sums: Vec<(String, u64)> = sums.into_iter().collect();
        sums.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
        sums
    }

    /// The samples of one kind of place summed: the helpers and map
    /// functions by name, the programs' own code as one.
    pub fn by_callee(&self) -> Vec<(String, u64)> {
        let mut sums: BTreeMap<String, u64> = BTreeMap::new();
        for (place, &n) in &self.places {
            let callee = place
                .callee
                .clone()
                .unwrap_or_else(|| "the programs' own code".to_owned());
            *sums.entry(callee).or_default() += n;
        }
        let mut sums: Vec<(String, u64)> = sums.into_iter().collect();
        sums.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
        sums
    }
}

/// Samples `cpu` (and, with `tid`, that thread only) every `period_ns` of
/// CPU time while `work` runs, and maps them with `map`. `Err` when perf
/// cannot be run.
pub fn sample(
    map: &JitMap,
    cpu: usize,
    tid: Option<i32>,
    period_ns: u64,
    work: impl FnOnce(),
) -> Result<Profile, String> {
    let data = std::env::temp_dir().join(format!("epm-profile-{}-{cpu}.data", std::process::id()));
    let mut perf = Command::new("perf")
        .args(["record", "-q", "-g", "-e", "cpu-clock", "-c"])
        .arg(period_ns.to_string())
        .args(["-C", &cpu.to_string(), "-o"])
        .arg(&data)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("perf record: {e} (is perf installed?)"))?;
    // perf needs a moment before it samples.
    std::thread::sleep(Duration::from_millis(500));
    work();
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(perf.id() as i32, libc::SIGINT) };
    let status = perf.wait().map_err(|e| format!("perf record: {e}"))?;
    let script = Command::new("perf")
        .args(["script", "-F", "tid,ip,sym", "-i"])
        .arg(&data)
        .output()
        .map_err(|e| format!("perf script: {e}"));
    let _ = std::fs::remove_file(&data);
    let script = script?;
    if !script.status.success() {
        return Err(format!(
            "perf record ({status}) / perf script: {}",
            String::from_utf8_lossy(&script.stderr).trim()
        ));
    }
    let mut profile = Profile {
        period_ns,
        ..Profile::default()
    };
    for (sample_tid, chain) in chains(&String::from_utf8_lossy(&script.stdout)) {
        if tid.is_some_and(|t| t != sample_tid) {
            continue;
        }
        profile.samples += 1;
        if let Some(place) = map.place_of(&chain) {
            *profile.places.entry(place).or_default() += 1;
        }
    }
    Ok(profile)
}

/// `perf script -F tid,ip,sym` with call chains: a line with the thread
/// id, one line per frame (address, symbol), an empty line.
fn chains(script: &str) -> Vec<(i32, Vec<(u64, String)>)> {
    let mut chains = Vec::new();
    let mut current: Option<(i32, Vec<(u64, String)>)> = None;
    for line in script.lines() {
        if line.trim().is_empty() {
            chains.extend(current.take());
        } else if !line.starts_with(char::is_whitespace) || current.is_none() {
            chains.extend(current.take());
            current = line
                .split_whitespace()
                .next()
                .and_then(|t| t.parse().ok())
                .map(|t| (t, Vec::new()));
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
    chains.extend(current);
    chains
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chains_are_split_by_sample_and_keep_their_frames_in_order() {
        let script = "  101 \n\tffffffffc0001010 bpf_prog_abc_portmap_ingress\n\tffffffff81000000 __netif_receive_skb\n\n\
                      202 \n\tffffffff81000100 htab_map_hash\n\tffffffffc0001020 bpf_prog_abc_portmap_ingress\n";
        let chains = chains(script);
        assert_eq!(chains.len(), 2, "{chains:?}");
        assert_eq!(chains[0].0, 101);
        assert_eq!(
            chains[0].1[0],
            (0xffff_ffff_c000_1010, "bpf_prog_abc_portmap_ingress".into())
        );
        assert_eq!(chains[1].1.len(), 2);
        assert_eq!(chains[1].1[0].1, "htab_map_hash");
    }

    #[test]
    fn samples_are_placed_by_the_innermost_frame_of_the_programs() {
        let map = JitMap {
            functions: vec![Function {
                start: 0x1000,
                end: 0x1100,
                lines: vec![
                    (0x1000, "tc.rs:1 `a`".into()),
                    (0x1040, "nat.rs:9 `b`".into()),
                ],
            }],
        };
        let own = vec![(0x1044, "bpf_prog_0123456789abcdef_existing_flow".to_owned())];
        let text = |chain: &[(u64, String)]| map.place_of(chain).map(|p| p.to_string());
        assert_eq!(text(&own).as_deref(), Some("nat.rs:9 `b`"));
        // In a helper, called by the last instruction of line 1: the
        // return address is the first of line 9.
        let helper = vec![
            (0xffff_0000, "bpf_l4_csum_replace".to_owned()),
            (0x1040, "bpf_prog_0123456789abcdef_existing_flow".to_owned()),
        ];
        assert_eq!(
            text(&helper).as_deref(),
            Some("tc.rs:1 `a` -> bpf_l4_csum_replace")
        );
        // Deeper in the kernel: the callee is the function the program
        // called, the function is the JIT-ed one that called it.
        let deeper = vec![
            (0xffff_0100, "bpf_lru_pop_free".to_owned()),
            (0xffff_0000, "htab_lru_map_update_elem".to_owned()),
            (0x1040, "bpf_prog_0123456789abcdef_track_noted".to_owned()),
        ];
        let place = map.place_of(&deeper).expect("a frame in the programs");
        assert_eq!(place.function, "track_noted");
        assert_eq!(place.callee.as_deref(), Some("htab_lru_map_update_elem"));
        let profile = Profile {
            period_ns: 1,
            samples: 6,
            places: BTreeMap::from([
                (place, 3),
                (map.place_of(&own).expect("own code"), 2),
                (map.place_of(&helper).expect("a helper"), 1),
            ]),
        };
        assert_eq!(
            profile.by_function(),
            [
                ("track_noted -> htab_lru_map_update_elem".to_owned(), 3),
                ("existing_flow (own code)".to_owned(), 2),
                ("existing_flow -> bpf_l4_csum_replace".to_owned(), 1),
            ]
        );
        assert_eq!(
            function_name("bpf_prog_0123456789abcdef_portmap_ingress"),
            "portmap_ingress"
        );
        assert_eq!(function_name("htab_map_hash"), "htab_map_hash");
        let elsewhere = vec![(0xffff_0000, "sk_alloc".to_owned())];
        assert_eq!(text(&elsewhere), None);
    }
}
