//! The pin root's lock: one `flock` per pin root serialises loads,
//! attachments and node-state writes, across processes.

use std::{fs, io, os::fd::AsRawFd, path::PathBuf};

use crate::dataplane::{
    bpffs::{BpffsError, create_private_dir},
    pin::PinLayout,
};

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error(transparent)]
    Bpffs(#[from] BpffsError),
    #[error("cannot lock {path}")]
    Lock {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Takes the pin root's lock (an `flock`, waiting for it), which serialises
/// loads, attachments and node-state writes; released when the returned
/// file is dropped, or by the kernel if the holder dies.
pub fn lock(layout: &PinLayout) -> Result<fs::File, LockError> {
    let lock_path = layout.lock_file();
    if let Some(dir) = lock_path.parent() {
        create_private_dir(dir)?;
    }
    let lock = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|source| LockError::Lock {
            path: lock_path.clone(),
            source,
        })?;
    // SAFETY: flock on an fd we own; released when `lock` is closed.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(LockError::Lock {
            path: lock_path,
            source: io::Error::last_os_error(),
        });
    }
    Ok(lock)
}
