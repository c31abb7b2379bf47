//! bpffs as the tests meet it: where it is mounted (and mounting it when
//! nothing is), removing a tree of pins, and the plugin's records beside a
//! pin root. The per-test pin root itself is [`crate::pin_root`].

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Where bpffs is expected.
pub const BPFFS_MOUNT: &str = "/sys/fs/bpf";

/// `statfs.f_type` of bpffs (`BPF_FS_MAGIC` in linux/magic.h).
const BPF_FS_MAGIC: u32 = 0xcafe_4a11;

#[derive(Debug, thiserror::Error)]
pub enum BpffsError {
    #[error("mounting bpffs at {path}")]
    Mount {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path} is still not bpffs after mounting it")]
    NotBpffs { path: PathBuf },
}

/// Where the plugin keeps what a pin root needs outside bpffs (which holds
/// no plain files): its load lock, the record of its `interfaces` and that
/// of its socket hooks.
pub const RUN_DIR: &str = "/run/ebpf-portmap";

/// The load lock the plugin's verbs (and the agent) take for `pin_root`.
pub fn lock_file(pin_root: &Path) -> PathBuf {
    // The plugin's own hash (`portmap_common::fnv`) names those files.
    let id = portmap_common::fnv::fnv1a64(pin_root.as_os_str().as_encoded_bytes());
    Path::new(RUN_DIR).join(format!("{id:016x}.lock"))
}

/// Where the plugin records the `interfaces` of the last sync of
/// `pin_root` (present only while `interfaces` is set).
pub fn interfaces_record(pin_root: &Path) -> PathBuf {
    lock_file(pin_root).with_extension("interfaces")
}

/// Where the plugin records the socket hooks' link pins it found in place
/// for `pin_root`.
pub fn hooks_record(pin_root: &Path) -> PathBuf {
    lock_file(pin_root).with_extension("hooks")
}

/// Where the plugin registers `pin_root` on the machine, so that other
/// nodes' runs find it once its node is gone.
pub fn root_record(pin_root: &Path) -> PathBuf {
    lock_file(pin_root).with_extension("root")
}

/// Where the plugin records that the kernel loaded this build's programs
/// for `pin_root` (STATUS's probe record).
pub fn status_record(pin_root: &Path) -> PathBuf {
    lock_file(pin_root).with_extension("status")
}

/// Where the plugin records the local addresses the last sync wrote for
/// `pin_root` (with the inode of the map's pin).
pub fn local_addrs_record(pin_root: &Path) -> PathBuf {
    lock_file(pin_root).with_extension("local-addrs")
}

/// Where the plugin notes the keys the last ADD of each network took for
/// typos, for `status`.
pub fn key_notes_record(pin_root: &Path) -> PathBuf {
    lock_file(pin_root).with_extension("keys")
}

/// Where the node agent records its PID for `pin_root` (`uninstall`
/// refuses while it runs).
pub fn agent_record(pin_root: &Path) -> PathBuf {
    lock_file(pin_root).with_extension("agent")
}

/// Whether `path` is on a bpffs mount.
pub fn is_bpffs(path: &Path) -> bool {
    let Ok(c_path) = CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: an all-zero statfs is a valid value; statfs writes it.
    let mut stat: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: c_path is NUL-terminated and stat is a valid out pointer.
    let rc = unsafe { libc::statfs(c_path.as_ptr(), &raw mut stat) };
    rc == 0 && stat.f_type as u32 == BPF_FS_MAGIC
}

/// Mounts bpffs at [`BPFFS_MOUNT`] unless it is already there.
pub fn ensure_bpffs() -> Result<(), BpffsError> {
    static LOCK: Mutex<()> = Mutex::new(());
    let _guard = LOCK
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let path = Path::new(BPFFS_MOUNT);
    if is_bpffs(path) {
        return Ok(());
    }
    let mount_error = |source| BpffsError::Mount {
        path: path.to_path_buf(),
        source,
    };
    let target = CString::new(BPFFS_MOUNT).expect("no NUL in a constant");
    // SAFETY: all pointers are NUL-terminated strings or null for `data`.
    let rc = unsafe {
        libc::mount(
            c"bpf".as_ptr(),
            target.as_ptr(),
            c"bpf".as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(mount_error(io::Error::last_os_error()));
    }
    if is_bpffs(path) {
        Ok(())
    } else {
        Err(BpffsError::NotBpffs {
            path: path.to_path_buf(),
        })
    }
}

/// Removes `path` and everything below it, children before parents (bpffs
/// has no recursive removal: pins are unlinked, directories rmdir'ed).
pub fn remove_tree(path: &Path) -> io::Result<()> {
    let meta = std::fs::symlink_metadata(path)?;
    if meta.is_dir() {
        for entry in std::fs::read_dir(path)? {
            remove_tree(&entry?.path())?;
        }
        std::fs::remove_dir(path)
    } else {
        std::fs::remove_file(path)
    }
}
