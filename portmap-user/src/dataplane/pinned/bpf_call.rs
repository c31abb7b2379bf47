//! The raw `bpf()` calls that aya 0.14 does not offer, shared by the rooms
//! that need them (`attach::tcx`'s links, `load::program`'s own program
//! load): the call itself, pinning an fd and opening a pin by path, an
//! object's info, and an fd by ID.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// `BPF_NOEXIST` (include/uapi/linux/bpf.h): an update that never
/// overwrites an entry (a resize's copy into the new table, the sweep's
/// put-back of an entry a packet refreshed).
pub const BPF_NOEXIST: u64 = 1;

const BPF_OBJ_PIN: libc::c_long = 6;
const BPF_OBJ_GET: libc::c_long = 7;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;

/// `bpf(cmd, attr, sizeof attr)`: the command's result, or its errno.
pub fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<libc::c_long> {
    // SAFETY: `attr` is a fully initialised bpf_attr prefix of the size
    // passed; the kernel reads no further, and the pointers in it point at
    // live buffers of the lengths given alongside them.
    let rc = unsafe { libc::syscall(libc::SYS_bpf, cmd, std::ptr::from_mut(attr), size_of::<T>()) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// `union bpf_attr` as the element commands read it.
#[repr(C)]
struct ElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    /// The value (lookup, update) or the next key (get-next-key).
    value: u64,
    flags: u64,
}

/// One element command (`BPF_MAP_GET_NEXT_KEY`,
/// `BPF_MAP_LOOKUP_AND_DELETE_ELEM`, ...) on the map `fd`, flags 0: `key`
/// null for none (the first key of get-next-key); `value` the value's
/// buffer, or the next key's.
///
/// # Safety
/// `key` is null or points at the map's key size of readable bytes, and
/// `value` at as many writable (or readable, for an update) bytes as the
/// command uses, both live across the call.
pub unsafe fn map_elem(
    cmd: libc::c_long,
    fd: std::os::fd::BorrowedFd<'_>,
    key: *const u8,
    value: *mut u8,
) -> io::Result<()> {
    let mut attr = ElemAttr {
        map_fd: fd.as_raw_fd() as u32,
        _pad: 0,
        key: key as u64,
        value: value as u64,
        flags: 0,
    };
    bpf(cmd, &mut attr).map(drop)
}

/// [`bpf`] for a command that returns a new fd.
pub fn bpf_fd<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<OwnedFd> {
    let fd = bpf(cmd, attr)?;
    // SAFETY: the command returned a new fd, ours to own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL in the path"))
}

/// `union bpf_attr` as `BPF_OBJ_PIN` and `BPF_OBJ_GET` read it.
#[repr(C)]
struct ObjAttr {
    pathname: u64,
    bpf_fd: u32,
    file_flags: u32,
}

/// Opens the bpf object pinned at `path` (`BPF_OBJ_GET`, read-write: the
/// kernel refuses other flags for links).
pub fn open_pin(path: &Path) -> io::Result<OwnedFd> {
    let path = c_path(path)?;
    let mut get = ObjAttr {
        pathname: path.as_ptr() as u64,
        bpf_fd: 0,
        file_flags: 0,
    };
    bpf_fd(BPF_OBJ_GET, &mut get)
}

/// Pins the bpf object `fd` at `path` (`BPF_OBJ_PIN`).
pub fn pin(fd: &OwnedFd, path: &Path) -> io::Result<()> {
    let path = c_path(path)?;
    let mut pin = ObjAttr {
        pathname: path.as_ptr() as u64,
        bpf_fd: fd.as_raw_fd() as u32,
        file_flags: 0,
    };
    bpf(BPF_OBJ_PIN, &mut pin).map(drop)
}

/// `union bpf_attr` as `BPF_OBJ_GET_INFO_BY_FD` reads it.
#[repr(C)]
struct InfoAttr {
    bpf_fd: u32,
    info_len: u32,
    info: u64,
}

/// Fills `info` (a `struct bpf_*_info`, or its head: the kernel writes as
/// much as its size says) for the object `fd` (`BPF_OBJ_GET_INFO_BY_FD`).
pub fn object_info<T>(fd: &OwnedFd, info: &mut T) -> io::Result<()> {
    let mut attr = InfoAttr {
        bpf_fd: fd.as_raw_fd() as u32,
        info_len: size_of::<T>() as u32,
        info: std::ptr::from_mut(info) as u64,
    };
    bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr).map(drop)
}

/// `union bpf_attr` as the ID commands read it (`start_id`/`prog_id`/
/// `btf_id`, `next_id`, `open_flags`).
#[repr(C)]
#[derive(Default)]
pub struct IdAttr {
    pub id: u32,
    pub next_id: u32,
    pub open_flags: u32,
}

/// Opens the object with ID `id` by `cmd` (`BPF_PROG_GET_FD_BY_ID`,
/// `BPF_BTF_GET_FD_BY_ID`, ...).
pub fn fd_by_id(cmd: libc::c_long, id: u32) -> io::Result<OwnedFd> {
    bpf_fd(
        cmd,
        &mut IdAttr {
            id,
            ..IdAttr::default()
        },
    )
}
