//! The bpffs the pins live on: checking a pin root is on one, mounting it
//! where a node has none, and the private (0700) directories under it. Also
//! mount(2) of the other pseudo filesystem we may need (cgroup2).

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
}

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
pub fn check_bpffs(root: &Path) -> Result<(), BpffsError> {
    const BPF_FS_MAGIC: i64 = 0xcafe4a11;
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
    if ok && stat.f_type as i64 == BPF_FS_MAGIC {
        Ok(())
    } else {
        Err(BpffsError::NoBpffs { path: probe })
    }
}

/// A node without bpffs at /sys/fs/bpf gets it mounted, as the kernel docs
/// and every eBPF dataplane expect; other roots must be on a bpffs already.
pub fn mount_bpffs_if_missing(root: &Path) -> Result<(), BpffsError> {
    const DEFAULT_MOUNT: &str = "/sys/fs/bpf";
    if check_bpffs(root).is_ok() || !root.starts_with(DEFAULT_MOUNT) {
        return check_bpffs(root);
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
