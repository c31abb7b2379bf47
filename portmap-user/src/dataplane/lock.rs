//! The pin root's lock: one `flock` per pin root serialises loads,
//! attachments and node-state writes, across processes.
//!
//! A run may bound how long it waits for the lock ([`limit_waits`]): DEL
//! must never hang behind a stuck holder (it runs first in the runtime's
//! DEL chain, and a DEL that never ends keeps the main plugin from freeing
//! the pod's address). Past the limit, [`lock`] fails with
//! [`LockError::TimedOut`] and the caller skips what needed the lock.
//!
//! Beside each lock, in the same run directory, live the pin root's
//! records (its hooks, its registration, STATUS's probe): [`write_record`]
//! writes any of them.

use std::{
    fs, io,
    os::fd::AsRawFd,
    path::{Path, PathBuf},
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, Instant},
};

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
    #[error(
        "{path} stayed locked for {} ms, longer than this run waits; another run of the plugin (or `flock` by hand) holds it",
        waited.as_millis()
    )]
    TimedOut { path: PathBuf, waited: Duration },
}

/// How long this process waits for a lock, in milliseconds; 0 is for as
/// long as it takes. Process-wide because the plugin runs one verb per
/// process, and the verb decides, not each of the places that lock.
static WAIT_LIMIT_MS: AtomicU64 = AtomicU64::new(0);

/// Makes every later [`lock`] of this process give up after `limit`.
pub fn limit_waits(limit: Duration) {
    let millis = u64::try_from(limit.as_millis()).unwrap_or(u64::MAX).max(1);
    WAIT_LIMIT_MS.store(millis, Ordering::Relaxed);
}

fn wait_limit() -> Option<Duration> {
    match WAIT_LIMIT_MS.load(Ordering::Relaxed) {
        0 => None,
        millis => Some(Duration::from_millis(millis)),
    }
}

/// Takes the pin root's lock (an `flock`, waiting for it, within the limit
/// set by [`limit_waits`] if any), which serialises loads, attachments and
/// node-state writes; released when the returned file is dropped, or by
/// the kernel if the holder dies.
pub fn lock(layout: &PinLayout) -> Result<fs::File, LockError> {
    // The stale sweep removes the lock file of a root that is gone, under
    // that lock (`stale::remove_orphan`): a run that opened the old file
    // and got its lock after that holds a lock nobody else can see, so it
    // opens the file again. Twice is enough: the sweep removes a lock file
    // only while the root does not exist, which the run that held the
    // lock is about to change.
    for _ in 0..2 {
        let lock = lock_once(layout)?;
        if same_file(&lock, &layout.lock_file()) {
            register_root(layout);
            return Ok(lock);
        }
    }
    lock_once(layout)
}

/// Whether `file` is (still) the file at `path`.
fn same_file(file: &fs::File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (file.metadata(), fs::metadata(path)) {
        (Ok(held), Ok(named)) => held.dev() == named.dev() && held.ino() == named.ino(),
        _ => false,
    }
}

/// Names the pin root in the run directory (see [`register`]), so
/// that an operator, `status` and the stale sweep can tell whose records
/// these are; only for a root that exists.
fn register_root(layout: &PinLayout) {
    if layout.root().exists() {
        register(layout);
    }
}

/// The record that registers `layout`'s root on this machine.
pub fn root_record(layout: &PinLayout) -> PathBuf {
    layout.lock_file().with_extension("root")
}

/// Records `layout`'s root in the machine's run directory (best effort:
/// roots under the default one are found without it): in `{id}.root`,
/// and as the text of its lock file when that is empty (which outlives a
/// `.root` record an older build's sweep removed, and names the lock for
/// an operator).
pub fn register(layout: &PinLayout) {
    let path = root_record(layout);
    let text = format!("{}\n", layout.root().display());
    if let Ok(lock) = fs::OpenOptions::new().write(true).open(layout.lock_file())
        && lock.metadata().is_ok_and(|m| m.len() == 0)
    {
        use std::os::unix::fs::FileExt;
        // Every writer writes the same text at the same place.
        let _ = lock.write_all_at(text.as_bytes(), 0);
    }
    if fs::read_to_string(&path).is_ok_and(|old| old == text) {
        return;
    }
    let _ = write_record(&path, &text);
}

fn lock_once(layout: &PinLayout) -> Result<fs::File, LockError> {
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
    let Some(limit) = wait_limit() else {
        // SAFETY: flock on an fd we own; released when `lock` is closed.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(LockError::Lock {
                path: lock_path,
                source: io::Error::last_os_error(),
            });
        }
        return Ok(lock);
    };
    flock_within(&lock, &lock_path, limit)?;
    Ok(lock)
}

/// Takes `file`'s `flock` (the lock file at `path`), giving up after
/// `limit` with [`LockError::TimedOut`].
pub fn flock_within(file: &fs::File, path: &Path, limit: Duration) -> Result<(), LockError> {
    flock_kind_within(file, path, libc::LOCK_EX, limit)
}

/// [`flock_within`] for a lock of kind `operation` (`LOCK_EX`, `LOCK_SH`).
fn flock_kind_within(
    file: &fs::File,
    path: &Path,
    operation: libc::c_int,
    limit: Duration,
) -> Result<(), LockError> {
    // flock has no timeout: try without blocking, a few times a tick.
    let start = Instant::now();
    let mut pause = Duration::from_millis(2);
    loop {
        // SAFETY: flock on an fd the caller owns; released when it is closed.
        if unsafe { libc::flock(file.as_raw_fd(), operation | libc::LOCK_NB) } == 0 {
            return Ok(());
        }
        let error = io::Error::last_os_error();
        if error.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(LockError::Lock {
                path: path.to_path_buf(),
                source: error,
            });
        }
        let waited = start.elapsed();
        if waited >= limit {
            return Err(LockError::TimedOut {
                path: path.to_path_buf(),
                waited,
            });
        }
        std::thread::sleep(pause.min(limit - waited));
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

// ---- the ownership maps' writers --------------------------------------------

/// Beside the pin root's lock, a second one guards the maps the ownership
/// protocol writes (`mappings`, `owner_slots`) against a resize that
/// replaces them (see `resize.rs`): every process that opens them takes it
/// shared for as long as it holds them (`Maps`), so plugin runs never wait
/// for each other; a resize takes it exclusive, so no run writes a map
/// that is being copied and replaced. Released by the kernel if the holder
/// dies, like the pin root's lock.
pub fn writers_lock_file(layout: &PinLayout) -> PathBuf {
    layout.lock_file().with_extension("writers")
}

/// Shared locks of the writers' lock this process holds (any pin root):
/// a run holding one must not wait for the exclusive lock, which its own
/// shared one would keep from it for ever.
static SHARED_HELD: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The writers' lock, held shared (see [`writers_lock_file`]).
#[derive(Debug)]
pub struct WritersLock {
    _file: fs::File,
}

impl Drop for WritersLock {
    fn drop(&mut self) {
        SHARED_HELD.fetch_sub(1, Ordering::SeqCst);
    }
}

fn open_lock_file(path: &Path) -> Result<fs::File, LockError> {
    if let Some(dir) = path.parent() {
        create_private_dir(dir)?;
    }
    fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|source| LockError::Lock {
            path: path.to_path_buf(),
            source,
        })
}

/// Takes the writers' lock shared, waiting while a resize holds it (within
/// the limit set by [`limit_waits`], if any).
pub fn writers_shared(layout: &PinLayout) -> Result<WritersLock, LockError> {
    let path = writers_lock_file(layout);
    let file = open_lock_file(&path)?;
    match wait_limit() {
        Some(limit) => flock_kind_within(&file, &path, libc::LOCK_SH, limit)?,
        // SAFETY: flock on an fd we own; released when `file` is closed.
        None if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_SH) } != 0 => {
            return Err(LockError::Lock {
                path,
                source: io::Error::last_os_error(),
            });
        }
        None => {}
    }
    SHARED_HELD.fetch_add(1, Ordering::SeqCst);
    Ok(WritersLock { _file: file })
}

/// Whether this process holds the writers' lock shared (of any pin root).
pub fn holds_writers_shared() -> bool {
    SHARED_HELD.load(Ordering::SeqCst) > 0
}

/// Takes the writers' lock exclusive, waiting at most `limit`: the caller
/// holds the pin root's lock, which a writer may be waiting for while it
/// holds the shared one (a DEL reconciles with its maps open), so an
/// unbounded wait could never end.
pub fn writers_exclusive(layout: &PinLayout, limit: Duration) -> Result<fs::File, LockError> {
    let path = writers_lock_file(layout);
    let file = open_lock_file(&path)?;
    flock_kind_within(&file, &path, libc::LOCK_EX, limit)?;
    Ok(file)
}

/// Writes the record `path` (a file beside the pin roots' locks) as a whole
/// file renamed over the old one, so a reader sees the old record or the
/// new, never half of one; creates the run directory if it is missing.
pub fn write_record(path: &Path, text: &str) -> io::Result<()> {
    if let Some(dir) = path.parent() {
        create_private_dir(dir).map_err(io::Error::other)?;
    }
    let extension = path
        .extension()
        .map(|e| e.to_string_lossy().into_owned())
        .unwrap_or_default();
    let temporary = path.with_extension(format!("{extension}-{}", std::process::id()));
    let written = fs::write(&temporary, text).and_then(|()| fs::rename(&temporary, path));
    if written.is_err() {
        let _ = fs::remove_file(&temporary);
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The writers' lock keeps a resize out while any run holds its maps
    /// open, and the runs out while a resize holds it. Writes a lock file
    /// under /run/ebpf-portmap (root, as the plugin).
    #[test]
    fn a_resize_waits_for_the_writers_and_the_writers_for_a_resize() {
        // SAFETY: a plain syscall without arguments.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: needs root to write under /run/ebpf-portmap");
            return;
        }
        let layout = PinLayout::new(format!(
            "/sys/fs/bpf/writers-lock-test-{}",
            std::process::id()
        ));
        let path = writers_lock_file(&layout);
        // Removed also when an assertion fails.
        struct Remove(PathBuf);
        impl Drop for Remove {
            fn drop(&mut self) {
                let _ = fs::remove_file(&self.0);
            }
        }
        let _remove = Remove(path.clone());
        let wait = Duration::from_millis(50);
        let reader = writers_shared(&layout).expect("shared");
        let other = writers_shared(&layout).expect("two runs hold it at once");
        assert!(holds_writers_shared());
        assert!(
            matches!(
                writers_exclusive(&layout, wait),
                Err(LockError::TimedOut { .. })
            ),
            "a resize took the lock while runs held their maps open"
        );
        drop((reader, other));
        let resize = writers_exclusive(&layout, wait).expect("free once the runs are done");
        let file = open_lock_file(&path).expect("open");
        assert!(
            matches!(
                flock_kind_within(&file, &path, libc::LOCK_SH, wait),
                Err(LockError::TimedOut { .. })
            ),
            "a run opened its maps while a resize held the lock"
        );
        drop(resize);
        flock_kind_within(&file, &path, libc::LOCK_SH, wait).expect("free after the resize");
    }
}
