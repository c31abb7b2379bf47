//! A tcx link made from a pinned program in three `bpf()` calls, for the
//! attachment every ADD on a bridge network makes (its pod's port, see
//! `attach::attach_bridge_ports`). aya attaches a program it has opened,
//! and opening a pinned program makes it probe the kernel's features
//! first (a dozen BTF and program loads per process): on the bench's
//! plugin-alone loop that doubled an ADD (1.63 to 3.70 ms at p50).
//! [`open_pin`] also serves `dataplane::attach::stale`'s read of the beacon link.
//!
//! Also the other raw `bpf()` calls of the attachments: [`update_pinned`]
//! swaps the program inside a pinned link (any link type), and
//! [`program_map_ids`] reads which maps a program uses, for `status`'s
//! check that every attached program reads the pinned maps.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

pub(super) use crate::dataplane::pinned::bpf_call::open_pin;
use crate::dataplane::pinned::bpf_call::{bpf, bpf_fd, fd_by_id, object_info, pin};
use crate::dataplane::pinned::pin::Direction;

const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_LINK_UPDATE: libc::c_long = 29;
const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
const BPF_TCX_INGRESS: u32 = 46;
const BPF_TCX_EGRESS: u32 = 47;

/// `union bpf_attr` as `BPF_LINK_CREATE` reads it for tcx: appended last,
/// no relative program (`relative_fd` 0), any revision.
#[repr(C)]
struct LinkCreateAttr {
    prog_fd: u32,
    target_ifindex: u32,
    attach_type: u32,
    flags: u32,
    relative_fd: u32,
    _pad: u32,
    expected_revision: u64,
}

/// Attaches the program pinned at `program` to the tcx hook of `ifindex`
/// (this network namespace) in `direction` through a new link, pinned at
/// `link`. `EEXIST`: another run pinned one there first (this link goes
/// when its fd closes, on return); `ENODEV`: no such interface.
pub fn link_pinned(
    program: &Path,
    ifindex: u32,
    direction: Direction,
    link: &Path,
) -> io::Result<()> {
    let prog = open_pin(program)?;
    let mut create = LinkCreateAttr {
        prog_fd: prog.as_raw_fd() as u32,
        target_ifindex: ifindex,
        attach_type: match direction {
            Direction::Ingress => BPF_TCX_INGRESS,
            Direction::Egress => BPF_TCX_EGRESS,
        },
        flags: 0,
        relative_fd: 0,
        _pad: 0,
        expected_revision: 0,
    };
    let created = bpf_fd(BPF_LINK_CREATE, &mut create)?;
    pin(&created, link)
}

/// `union bpf_attr` as `BPF_LINK_UPDATE` reads it: no old program named
/// (`flags` 0), so whatever the link runs is replaced.
#[repr(C)]
struct LinkUpdateAttr {
    link_fd: u32,
    new_prog_fd: u32,
    flags: u32,
    old_prog_fd: u32,
}

/// Replaces the program inside the link pinned at `link` with the one
/// pinned at `program`, atomically (`BPF_LINK_UPDATE`): every packet, or
/// `connect()`, runs one or the other, never both nor neither, and a
/// process killed at any point leaves one of them attached. `ENOLINK`:
/// the link is defunct (its interface gone).
pub fn update_pinned(link: &Path, program: &Path) -> io::Result<()> {
    let link = open_pin(link)?;
    let prog = open_pin(program)?;
    let mut update = LinkUpdateAttr {
        link_fd: link.as_raw_fd() as u32,
        new_prog_fd: prog.as_raw_fd() as u32,
        flags: 0,
        old_prog_fd: 0,
    };
    bpf(BPF_LINK_UPDATE, &mut update)?;
    Ok(())
}

/// The head of `struct bpf_prog_info` (include/uapi/linux/bpf.h), up to
/// `map_ids`: the kernel fills as much as `info_len` says.
#[repr(C)]
#[derive(Default)]
struct ProgInfoHead {
    prog_type: u32,
    id: u32,
    tag: [u8; 8],
    jited_prog_len: u32,
    xlated_prog_len: u32,
    jited_prog_insns: u64,
    xlated_prog_insns: u64,
    load_time: u64,
    created_by_uid: u32,
    nr_map_ids: u32,
    map_ids: u64,
}

// `map_ids` is at offset 56 of `struct bpf_prog_info`; the head ends there.
const _: () = assert!(size_of::<ProgInfoHead>() == 64);
const _: () = assert!(std::mem::offset_of!(ProgInfoHead, map_ids) == 56);

fn prog_info(fd: &OwnedFd, map_ids: &mut [u32]) -> io::Result<ProgInfoHead> {
    let mut info = ProgInfoHead {
        nr_map_ids: map_ids.len() as u32,
        map_ids: map_ids.as_mut_ptr() as u64,
        ..ProgInfoHead::default()
    };
    object_info(fd, &mut info)?;
    Ok(info)
}

/// The IDs of the maps the program `fd` uses (`map_ids` of its info):
/// needs only the fd, which a pin gives without CAP_SYS_ADMIN.
pub fn program_map_ids(fd: &OwnedFd) -> io::Result<Vec<u32>> {
    let count = prog_info(fd, &mut [])?.nr_map_ids as usize;
    let mut ids = vec![0u32; count];
    let filled = prog_info(fd, &mut ids)?.nr_map_ids as usize;
    // Maps are fixed at load: the count cannot grow between the calls.
    ids.truncate(filled.min(count));
    Ok(ids)
}

/// The ID of the program `fd`.
pub fn program_id(fd: &OwnedFd) -> io::Result<u32> {
    Ok(prog_info(fd, &mut [])?.id)
}

/// Opens the program pinned at `path`.
pub fn open_program_pin(path: &Path) -> io::Result<OwnedFd> {
    open_pin(path)
}

/// Opens the program with ID `id` (`BPF_PROG_GET_FD_BY_ID`: the kernel
/// wants CAP_SYS_ADMIN, which `status` run as root has and the node agent
/// has not: `EPERM` then).
pub fn open_program_id(id: u32) -> io::Result<OwnedFd> {
    fd_by_id(BPF_PROG_GET_FD_BY_ID, id)
}
