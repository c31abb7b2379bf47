//! The bpffs the pins live on: checking a pin root is on one, mounting it
//! where a node has none, the private (0700) directories under it, and
//! taking a pin root's emptied directories away again. Also
//! mount(2) of the other pseudo filesystem we may need (cgroup2).

use crate::model::DEFAULT_PIN_ROOT;
use std::{
    fs, io,
    os::unix::fs::DirBuilderExt,
    path::{Path, PathBuf},
};

#[derive(Debug, thiserror::Error)]
pub enum BpffsError {
    #[error("cannot create {path}")]
    CreateDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("bpffs is not mounted at {path}; mount it with `mount -t bpf bpf /sys/fs/bpf`")]
    NoBpffs { path: PathBuf },
    #[error(
        "pinRoot {root} is not on a bpffs ({found} is on {filesystem}), so nothing can be pinned there; set pinRoot to a directory on a bpffs mount (the default {DEFAULT_PIN_ROOT} is one; `findmnt -t bpf` lists them)"
    )]
    PinRootNotBpffs {
        root: PathBuf,
        /// The nearest existing directory of the root, which was looked at.
        found: PathBuf,
        filesystem: String,
    },
}

impl BpffsError {
    /// Whether this is a mistake of the configuration (its `pinRoot`)
    /// rather than of the node.
    pub fn is_configuration(&self) -> bool {
        matches!(self, BpffsError::PinRootNotBpffs { .. })
    }
}

/// Where ADD mounts a bpffs when the node has none.
const DEFAULT_MOUNT: &str = "/sys/fs/bpf";

/// Creates `path` and its parents, readable by root only.
pub fn create_private_dir(path: &Path) -> Result<(), BpffsError> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .map_err(|source| BpffsError::CreateDir {
            path: path.to_owned(),
            source,
        })
}

/// Whether `path` is on a bpffs (or below a directory that will be on one).
/// Removes the directory of `root` (a pin root whose state is gone) if
/// nothing else lives there; for a namespace's own root under the shared
/// default one (`{root}/netns/{cookie}`), `netns/` and the shared root go
/// too once nobody else's state is in them. `remove_dir` removes one
/// directory and reports it as its caller reports (uninstall, the removal
/// of a gone node's state).
pub fn remove_root_if_empty(root: &Path, remove_dir: &mut dyn FnMut(&Path)) {
    if !fs::read_dir(root).is_ok_and(|mut d| d.next().is_none()) {
        return;
    }
    remove_dir(root);
    if let Some(netns_dir) = root.parent()
        && netns_dir.file_name().is_some_and(|name| name == "netns")
        && fs::remove_dir(netns_dir).is_ok()
        && let Some(shared) = netns_dir.parent()
        && fs::read_dir(shared).is_ok_and(|mut d| d.next().is_none())
    {
        remove_dir(shared);
    }
}

const BPF_FS_MAGIC: i64 = 0xcafe4a11;

/// The nearest existing directory of `root` (itself, or a parent) and the
/// type of the filesystem it is on (`None` when statfs fails).
fn filesystem_of(root: &Path) -> (PathBuf, Option<i64>) {
    let mut probe = root.to_path_buf();
    while !probe.exists() {
        if !probe.pop() {
            break;
        }
    }
    let c_path = std::ffi::CString::new(probe.as_os_str().as_encoded_bytes()).unwrap_or_default();
    // SAFETY: statfs is plain old data; all zeroes is a valid value.
    let mut stat: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: statfs with a valid NUL-terminated path and an out struct.
    let ok = unsafe { libc::statfs(c_path.as_ptr(), &raw mut stat) } == 0;
    (probe, ok.then_some(stat.f_type as i64))
}

/// A filesystem type as `mount` names it, for messages.
fn filesystem_name(magic: Option<i64>) -> String {
    let name = match magic {
        None => return "a filesystem that cannot be read (statfs failed)".into(),
        Some(0x0102_1994) => "tmpfs",
        Some(0xef53) => "ext4",
        Some(0x5846_5342) => "xfs",
        Some(0x9123_683e) => "btrfs",
        Some(0x794c_7630) => "overlay",
        Some(0x6265_6572) => "sysfs",
        Some(0x9fa0) => "proc",
        Some(0x6969) => "nfs",
        Some(magic) => return format!("a filesystem of type {magic:#x}"),
    };
    name.into()
}

pub fn check_bpffs(root: &Path) -> Result<(), BpffsError> {
    match filesystem_of(root) {
        (_, Some(BPF_FS_MAGIC)) => Ok(()),
        (probe, _) => Err(BpffsError::NoBpffs { path: probe }),
    }
}

/// Whether `root` can hold pins, as ADD sees it: a root outside
/// /sys/fs/bpf must be on a bpffs already, and one that is not is a
/// mistake of `pinRoot`, named as such; under /sys/fs/bpf, the node's
/// bpffs must be mounted there.
pub fn check_pin_root(root: &Path) -> Result<(), BpffsError> {
    if root.starts_with(DEFAULT_MOUNT) {
        return check_bpffs(root);
    }
    match filesystem_of(root) {
        (_, Some(BPF_FS_MAGIC)) => Ok(()),
        (found, magic) => Err(BpffsError::PinRootNotBpffs {
            root: root.to_path_buf(),
            found,
            filesystem: filesystem_name(magic),
        }),
    }
}

/// A node without bpffs at /sys/fs/bpf gets it mounted, as the kernel docs
/// and every eBPF dataplane expect; other roots must be on a bpffs already
/// ([`check_pin_root`]).
pub fn mount_bpffs_if_missing(root: &Path) -> Result<(), BpffsError> {
    if check_pin_root(root).is_ok() || !root.starts_with(DEFAULT_MOUNT) {
        return check_pin_root(root);
    }
    if let Err(error) = mount_fs("bpf", Path::new(DEFAULT_MOUNT)) {
        log::warn!("mounting bpffs at {DEFAULT_MOUNT}: {error}");
    }
    check_bpffs(root)
}

/// mount(2) of a pseudo filesystem (`fstype`, no device, no options).
pub fn mount_fs(fstype: &str, target: &Path) -> io::Result<()> {
    let c = |s: &[u8]| std::ffi::CString::new(s).unwrap_or_default();
    let (fstype, target) = (
        c(fstype.as_bytes()),
        c(target.as_os_str().as_encoded_bytes()),
    );
    // SAFETY: valid NUL-terminated strings, no data argument.
    let rc = unsafe {
        libc::mount(
            fstype.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
