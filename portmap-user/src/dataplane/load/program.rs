//! Loads the tc programs, whose kfunc calls may name a module's BTF (see
//! [`kfunc`](crate::dataplane::load::kfunc)): the kernel finds such a
//! kfunc through the module's BTF fd in the load's `fd_array`, which aya
//! 0.14 cannot pass. They are loaded here on every kernel, module or not,
//! so that the one path that must work on distro kernels is the one every
//! test runs. Everything else stays aya's: its loader creates or
//! opens the maps and relocates the object's own copy; this module
//! relocates a second parse of the same object against those very maps
//! (`aya_obj`, the crate aya relocates with), asks `BPF_PROG_LOAD` itself
//! with the `fd_array`, and pins the program where aya would, so that
//! every later step opens it as any other pinned program.
//!
//! The program is loaded without its BTF (`func_info`, `line_info`): the
//! verifier then checks every subprogram in the context of its caller, as
//! it does static functions; `bpftool prog dump` shows no source lines.
//!
//! # Minimum kernel version
//! Module kfuncs in tc programs: Linux 5.18 (`fd_array` itself: 5.14).

use std::{
    collections::HashSet,
    ffi::CString,
    io,
    os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd},
    path::Path,
};

use aya::{Ebpf, maps::Map};

use crate::dataplane::pinned::bpf_call::{IdAttr, bpf, bpf_fd, fd_by_id, object_info};

/// `BPF_PROG_LOAD`, `BPF_BTF_GET_FD_BY_ID`, `BPF_BTF_GET_NEXT_ID`
/// (`enum bpf_cmd`).
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_BTF_GET_FD_BY_ID: libc::c_long = 19;
const BPF_BTF_GET_NEXT_ID: libc::c_long = 23;
/// `BPF_PROG_TYPE_SCHED_CLS`.
const SCHED_CLS: u32 = 3;

#[derive(Debug, thiserror::Error)]
pub enum ProgramLoadError {
    #[error("the kernel holds no BTF for module {module} (is it loaded?)")]
    NoModuleBtf { module: &'static str },
    #[error("could not read the kernel's BTF objects ({call})")]
    Btf {
        call: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("could not parse the eBPF object for program {program}")]
    Parse {
        program: &'static str,
        #[source]
        source: Box<aya_obj::ParseError>,
    },
    #[error("could not relocate program {program}")]
    Relocate {
        program: &'static str,
        #[source]
        source: Box<aya_obj::relocation::EbpfRelocationError>,
    },
    #[error("the eBPF object has no program {program}")]
    NoProgram { program: &'static str },
    #[error("the kernel refused program {program}: {log}")]
    Verifier {
        program: &'static str,
        log: String,
        #[source]
        source: io::Error,
    },
    #[error("could not pin program {program} at {path}")]
    Pin {
        program: &'static str,
        path: std::path::PathBuf,
        #[source]
        source: io::Error,
    },
}

/// `union bpf_attr` as `BPF_PROG_LOAD` reads it, up to `fd_array`.
#[repr(C)]
#[derive(Default)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
    prog_btf_fd: u32,
    func_info_rec_size: u32,
    func_info: u64,
    func_info_cnt: u32,
    line_info_rec_size: u32,
    line_info: u64,
    line_info_cnt: u32,
    attach_btf_id: u32,
    attach_prog_fd: u32,
    core_relo_cnt: u32,
    fd_array: u64,
}
const _: () = assert!(std::mem::size_of::<ProgLoadAttr>() == 128);

/// `struct bpf_btf_info` (Linux 5.11: name and kernel_btf).
#[repr(C)]
#[derive(Default)]
struct BtfInfo {
    btf: u64,
    btf_size: u32,
    id: u32,
    name: u64,
    name_len: u32,
    kernel_btf: u32,
}

/// The BTF fd of each module in `modules` (the `fd_array` the calls were
/// linked for, see [`Linked::modules`](crate::dataplane::load::kfunc::Linked)),
/// found by walking the kernel's BTF objects for a kernel BTF of that name;
/// none for none.
pub fn module_btf_fds(modules: &[&'static str]) -> Result<Vec<OwnedFd>, ProgramLoadError> {
    let mut found: Vec<Option<OwnedFd>> = modules.iter().map(|_| None).collect();
    let mut id = 0u32;
    while found.iter().any(Option::is_none) {
        let mut next = IdAttr {
            id,
            ..IdAttr::default()
        };
        match bpf(BPF_BTF_GET_NEXT_ID, &mut next) {
            Ok(_) => id = next.next_id,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => break,
            Err(source) => {
                return Err(ProgramLoadError::Btf {
                    call: "BPF_BTF_GET_NEXT_ID",
                    source,
                });
            }
        }
        let fd = match fd_by_id(BPF_BTF_GET_FD_BY_ID, id) {
            Ok(fd) => fd,
            // Gone between the two calls (a module unloaded).
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
            Err(source) => {
                return Err(ProgramLoadError::Btf {
                    call: "BPF_BTF_GET_FD_BY_ID",
                    source,
                });
            }
        };
        let mut name = [0u8; 64];
        let mut info = BtfInfo {
            name: name.as_mut_ptr() as u64,
            name_len: name.len() as u32,
            ..BtfInfo::default()
        };
        object_info(&fd, &mut info).map_err(|source| ProgramLoadError::Btf {
            call: "BPF_OBJ_GET_INFO_BY_FD",
            source,
        })?;
        if info.kernel_btf == 0 {
            continue;
        }
        let len = name.iter().position(|&b| b == 0).unwrap_or(name.len());
        if let Some(at) = modules.iter().position(|m| m.as_bytes() == &name[..len])
            && found[at].is_none()
        {
            found[at] = Some(fd);
        }
    }
    modules
        .iter()
        .zip(found)
        .map(|(&module, fd)| fd.ok_or(ProgramLoadError::NoModuleBtf { module }))
        .collect()
}

/// The fd of the map aya's loader made or opened for `map`.
fn map_fd(map: &Map) -> BorrowedFd<'_> {
    let data = match map {
        Map::Array(d)
        | Map::ArrayOfMaps(d)
        | Map::BloomFilter(d)
        | Map::CgroupArray(d)
        | Map::CgroupStorage(d)
        | Map::CgrpStorage(d)
        | Map::CpuMap(d)
        | Map::DevMap(d)
        | Map::DevMapHash(d)
        | Map::HashMap(d)
        | Map::HashOfMaps(d)
        | Map::InodeStorage(d)
        | Map::LpmTrie(d)
        | Map::LruHashMap(d)
        | Map::PerCpuArray(d)
        | Map::PerCpuCgroupStorage(d)
        | Map::PerCpuHashMap(d)
        | Map::PerCpuLruHashMap(d)
        | Map::PerfEventArray(d)
        | Map::ProgramArray(d)
        | Map::Queue(d)
        | Map::ReusePortSockArray(d)
        | Map::RingBuf(d)
        | Map::SockHash(d)
        | Map::SockMap(d)
        | Map::SkStorage(d)
        | Map::Stack(d)
        | Map::StackTraceMap(d)
        | Map::Unsupported(d)
        | Map::XskMap(d) => d,
    };
    data.fd().as_fd()
}

/// Loads the tc program `name` of `object` (linked, see
/// [`kfunc::link`](crate::dataplane::load::kfunc::link)) with the maps of
/// `ebpf` (aya's load of the same object) and `module_fds` as its
/// `fd_array` from index 1.
pub fn load_tc(
    ebpf: &Ebpf,
    object: &[u8],
    name: &'static str,
    module_fds: &[OwnedFd],
) -> Result<OwnedFd, ProgramLoadError> {
    let mut obj = aya_obj::Object::parse(object).map_err(|source| ProgramLoadError::Parse {
        program: name,
        source: Box::new(source),
    })?;
    let text_sections: HashSet<usize> = obj.functions.keys().map(|(section, _)| *section).collect();
    let maps: Vec<(String, i32, aya_obj::Map)> = obj
        .maps
        .iter()
        .filter_map(|(map_name, def)| {
            let map = ebpf.map(map_name)?;
            Some((map_name.clone(), map_fd(map).as_raw_fd(), def.clone()))
        })
        .collect();
    let relocate = |source| ProgramLoadError::Relocate {
        program: name,
        source: Box::new(source),
    };
    obj.relocate_maps(
        maps.iter().map(|(n, fd, def)| (n.as_str(), *fd, def)),
        &text_sections,
    )
    .map_err(relocate)?;
    obj.relocate_calls(&text_sections).map_err(relocate)?;
    let program = obj
        .programs
        .get(name)
        .ok_or(ProgramLoadError::NoProgram { program: name })?;
    let function = obj
        .functions
        .get(&program.function_key())
        .ok_or(ProgramLoadError::NoProgram { program: name })?;
    // fd_array[0] is never read (`off` 0 is vmlinux): the first module's
    // fd stands there too. No module: no fd_array.
    let mut fd_array: Vec<i32> = module_fds.iter().map(AsRawFd::as_raw_fd).collect();
    if let Some(&first) = fd_array.first() {
        fd_array.insert(0, first);
    }
    let license = CString::new(obj.license.as_bytes()).unwrap_or_else(|_| c"GPL".to_owned());
    let mut prog_name = [0u8; 16];
    let len = name.len().min(15);
    prog_name[..len].copy_from_slice(&name.as_bytes()[..len]);
    let attr = |log: &mut Vec<u8>| ProgLoadAttr {
        prog_type: SCHED_CLS,
        insn_cnt: function.instructions.len() as u32,
        insns: function.instructions.as_ptr() as u64,
        license: license.as_ptr() as u64,
        // BPF_LOG_STATS only: the verifier's error and its counts, not
        // every state (which overflows any buffer on a kernel before 6.4,
        // whose log keeps the head and fails the load with ENOSPC).
        log_level: if log.is_empty() { 0 } else { 4 },
        log_size: log.len() as u32,
        log_buf: if log.is_empty() {
            0
        } else {
            log.as_mut_ptr() as u64
        },
        kern_version: obj.kernel_version.unwrap_or(0),
        prog_name,
        fd_array: if fd_array.is_empty() {
            0
        } else {
            fd_array.as_ptr() as u64
        },
        ..ProgLoadAttr::default()
    };
    let mut no_log = Vec::new();
    match bpf_fd(BPF_PROG_LOAD, &mut attr(&mut no_log)) {
        Ok(fd) => Ok(fd),
        Err(_) => {
            // Again with the verifier's log, for the error.
            let mut log = vec![0u8; 1 << 16];
            let source = match bpf_fd(BPF_PROG_LOAD, &mut attr(&mut log)) {
                Ok(fd) => return Ok(fd),
                Err(source) => source,
            };
            Err(ProgramLoadError::Verifier {
                program: name,
                log: log_tail(&log),
                source,
            })
        }
    }
}

/// The last lines of a verifier log (where it says why), at most 4 KiB.
fn log_tail(log: &[u8]) -> String {
    let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
    let text = String::from_utf8_lossy(&log[..end]);
    let text = text.trim_end();
    let start = text.char_indices().rev().nth(4096).map_or(0, |(at, _)| at);
    text[start..].to_owned()
}

/// Pins the program `fd` at `path` (`BPF_OBJ_PIN`).
pub fn pin(fd: &OwnedFd, path: &Path, program: &'static str) -> Result<(), ProgramLoadError> {
    crate::dataplane::pinned::bpf_call::pin(fd, path).map_err(|source| ProgramLoadError::Pin {
        program,
        path: path.to_owned(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_tail_keeps_the_end_where_the_verifier_says_why() {
        let mut log = b"0: r1 = r2\n".repeat(1000);
        log.extend_from_slice(b"R1 invalid mem access 'scalar'\n\0\0\0");
        let tail = log_tail(&log);
        assert!(tail.ends_with("R1 invalid mem access 'scalar'"), "{tail}");
        assert!(tail.len() <= 4100, "{}", tail.len());
    }
}
