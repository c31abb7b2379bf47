//! A tcx link made from a pinned program in three `bpf()` calls, for the
//! attachment every ADD on a bridge network makes (its pod's port, see
//! `attach::attach_bridge_ports`). aya attaches a program it has opened,
//! and opening a pinned program makes it probe the kernel's features
//! first (a dozen BTF and program loads per process): on the bench's
//! plugin-alone loop that doubled an ADD (1.63 to 3.70 ms at p50).
//! [`open_pin`] also serves `dataplane::stale`'s read of the beacon link.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use super::pin::Direction;

const BPF_OBJ_PIN: libc::c_long = 6;
const BPF_OBJ_GET: libc::c_long = 7;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_TCX_INGRESS: u32 = 46;
const BPF_TCX_EGRESS: u32 = 47;

/// `union bpf_attr` as `BPF_OBJ_PIN` and `BPF_OBJ_GET` read it.
#[repr(C)]
struct ObjAttr {
    pathname: u64,
    bpf_fd: u32,
    file_flags: u32,
}

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

fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<libc::c_long> {
    // SAFETY: `attr` is a fully initialised bpf_attr prefix of the size
    // passed; the kernel reads no further.
    let rc = unsafe { libc::syscall(libc::SYS_bpf, cmd, std::ptr::from_mut(attr), size_of::<T>()) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

fn c_path(path: &Path) -> io::Result<std::ffi::CString> {
    std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL in the path"))
}

/// Opens the bpf object pinned at `path` (`BPF_OBJ_GET`, read-write: the
/// kernel refuses other flags for links).
pub(super) fn open_pin(path: &Path) -> io::Result<OwnedFd> {
    let path = c_path(path)?;
    let mut get = ObjAttr {
        pathname: path.as_ptr() as u64,
        bpf_fd: 0,
        file_flags: 0,
    };
    // SAFETY: BPF_OBJ_GET returns a new fd, ours to own.
    Ok(unsafe { OwnedFd::from_raw_fd(bpf(BPF_OBJ_GET, &mut get)? as i32) })
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
    // SAFETY: BPF_LINK_CREATE returns a new fd, ours to own.
    let created = unsafe { OwnedFd::from_raw_fd(bpf(BPF_LINK_CREATE, &mut create)? as i32) };
    let link = c_path(link)?;
    let mut pin = ObjAttr {
        pathname: link.as_ptr() as u64,
        bpf_fd: created.as_raw_fd() as u32,
        file_flags: 0,
    };
    bpf(BPF_OBJ_PIN, &mut pin)?;
    Ok(())
}
