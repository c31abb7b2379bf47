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
//!
//! # The run directory
//! `/run/ebpf-portmap` is root's alone: created 0700, and refused when found
//! group- or world-writable, owned by another user or a symbolic link (see
//! `bpffs::create_private_dir`), since whoever can write there can plant a
//! file or a link where a lock or record goes. Every file is opened
//! without following a symbolic link (`O_NOFOLLOW`) and must be a regular
//! file; a record is written to a new temporary file of an unpredictable
//! name (`O_EXCL`, mode 0600) and renamed over the old one.

use std::{
    fs, io,
    io::{Read, Write},
    os::{fd::AsRawFd, unix::fs::OpenOptionsExt},
    path::{Path, PathBuf},
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, Instant},
};

use crate::dataplane::pinned::{
    bpffs::{BpffsError, create_private_dir},
    pin::PinLayout,
};

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error(transparent)]
    Bpffs(#[from] BpffsError),
    #[error(
        "{path} is not a regular file (a symbolic link, a directory or a device put there by hand?); remove it, the next run creates it"
    )]
    NotAFile { path: PathBuf },
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

/// Takes the `flock` of the lock file `path` in the run directory, for a
/// kind of state that has a lock of its own beside the pin root's (its
/// module says what it guards): exclusive, waiting for it within the limit
/// set by [`limit_waits`] if any.
pub fn lock_at(path: &Path) -> Result<fs::File, LockError> {
    let file = open_lock_file(path)?;
    match wait_limit() {
        Some(limit) => flock_within(&file, path, limit)?,
        // SAFETY: flock on an fd we own; released when `file` is closed.
        None if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 => {
            return Err(LockError::Lock {
                path: path.to_path_buf(),
                source: io::Error::last_os_error(),
            });
        }
        None => {}
    }
    Ok(file)
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
    if let Ok(lock) = fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(layout.lock_file())
        && lock.metadata().is_ok_and(|m| m.is_file() && m.len() == 0)
    {
        use std::os::unix::fs::FileExt;
        // Every writer writes the same text at the same place.
        let _ = lock.write_all_at(text.as_bytes(), 0);
    }
    if read_record(&path).is_ok_and(|old| old == text) {
        return;
    }
    let _ = write_record(&path, &text);
}

fn lock_once(layout: &PinLayout) -> Result<fs::File, LockError> {
    lock_at(&layout.lock_file())
}

/// Opens (creating it if missing) the lock file `path` in the run
/// directory, which is checked first (see the module docs). A symbolic
/// link there is not followed (`O_NOFOLLOW`: the open fails with ELOOP),
/// and only a regular file is a lock: a FIFO would block the open, a
/// device would be written.
fn open_lock_file(path: &Path) -> Result<fs::File, LockError> {
    if let Some(dir) = path.parent() {
        create_private_dir(dir)?;
    }
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        // NONBLOCK: a FIFO without a reader fails at once instead of
        // blocking; a regular file ignores it (flock is asked separately).
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|source| match source.raw_os_error() {
            Some(libc::ELOOP | libc::ENXIO) => LockError::NotAFile {
                path: path.to_path_buf(),
            },
            _ => LockError::Lock {
                path: path.to_path_buf(),
                source,
            },
        })?;
    match file.metadata() {
        Ok(metadata) if metadata.is_file() => Ok(file),
        Ok(_) => Err(LockError::NotAFile {
            path: path.to_path_buf(),
        }),
        Err(source) => Err(LockError::Lock {
            path: path.to_path_buf(),
            source,
        }),
    }
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
/// shared for as long as it holds them (`ownership::Store`), so plugin runs never wait
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
/// new, never half of one; creates the run directory if it is missing, and
/// refuses one that is not root's alone (see the module docs). The
/// temporary file has a name nobody can guess beforehand and is created
/// new (`O_EXCL`, which also refuses a symbolic link), so nothing planted
/// in the directory is written through.
pub fn write_record(path: &Path, text: &str) -> io::Result<()> {
    if let Some(dir) = path.parent() {
        create_private_dir(dir).map_err(io::Error::other)?;
    }
    let (temporary, mut file) = create_temporary(path)?;
    let written = file
        .write_all(text.as_bytes())
        .and_then(|()| fs::rename(&temporary, path));
    if written.is_err() {
        let _ = fs::remove_file(&temporary);
    }
    written
}

/// Creates a new file beside `path` for [`write_record`]: `{stem}.{ext}-tmp-{16
/// random hex digits}`, mode 0600, `O_EXCL | O_NOFOLLOW`; a name that
/// exists already (never, short of a broken random source) is tried again.
fn create_temporary(path: &Path) -> io::Result<(PathBuf, fs::File)> {
    let extension = path
        .extension()
        .map(|e| e.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut last_error = None;
    for _ in 0..4 {
        // Same stem: the stale sweep finds what a killed writer left
        // (`stale::records_of`).
        let temporary = path.with_extension(format!("{extension}-tmp-{:016x}", random_u64()?));
        match fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&temporary)
        {
            Ok(file) => return Ok((temporary, file)),
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists => last_error = Some(error),
            Err(error) => return Err(error),
        }
    }
    Err(last_error.unwrap_or_else(|| io::Error::other("no temporary name was free")))
}

/// 64 bits from the kernel's random source (getrandom(2)).
fn random_u64() -> io::Result<u64> {
    let mut bytes = [0u8; 8];
    // SAFETY: getrandom writes at most `bytes.len()` bytes into the buffer.
    let got = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    if got != bytes.len() as isize {
        return Err(io::Error::last_os_error());
    }
    Ok(u64::from_ne_bytes(bytes))
}

/// Reads the record `path` without following a symbolic link put in its
/// place; only a regular file is a record.
pub fn read_record(path: &Path) -> io::Result<String> {
    let mut file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} is not a regular file", path.display()),
        ));
    }
    let mut text = String::new();
    file.read_to_string(&mut text)?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A private run directory of the test's own (0700), removed on drop,
    /// with a victim file outside it that nothing may write through a link.
    struct RunDir {
        base: PathBuf,
    }

    impl RunDir {
        fn new(name: &str) -> RunDir {
            let base = std::env::temp_dir().join(format!(
                "epm-lock-{name}-{}-{:?}",
                std::process::id(),
                std::thread::current().id()
            ));
            let _ = fs::remove_dir_all(&base);
            create_private_dir(&base.join("run")).expect("the run directory");
            fs::write(base.join("victim"), "untouched\n").expect("the victim");
            RunDir { base }
        }

        fn run(&self) -> PathBuf {
            self.base.join("run")
        }

        fn victim(&self) -> PathBuf {
            self.base.join("victim")
        }

        fn victim_text(&self) -> String {
            fs::read_to_string(self.victim()).expect("the victim is still there")
        }
    }

    impl Drop for RunDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.base);
        }
    }

    /// The temporary names an older build used (`{stem}.{ext}-{pid}`) and
    /// the ones a guess of a random one could hit: links planted at all of
    /// them are never written through.
    #[test]
    fn a_record_is_never_written_through_a_planted_link() {
        let dir = RunDir::new("record");
        let record = dir.run().join("0123456789abcdef.root");
        let predictable = record.with_extension(format!("root-{}", std::process::id()));
        std::os::unix::fs::symlink(dir.victim(), &predictable).expect("plant a link");
        write_record(&record, "/sys/fs/bpf/x\n").expect("written");
        assert_eq!(dir.victim_text(), "untouched\n", "written through the link");
        assert_eq!(read_record(&record).expect("read"), "/sys/fs/bpf/x\n");
        let left: Vec<_> = fs::read_dir(dir.run())
            .expect("list")
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(
            left.len(),
            2,
            "the record and the planted link only: {left:?}"
        );

        // The record itself replaced by a link: renamed over, not followed.
        fs::remove_file(&record).expect("rm");
        std::os::unix::fs::symlink(dir.victim(), &record).expect("plant a link");
        assert!(read_record(&record).is_err(), "a link is not a record");
        write_record(&record, "new\n").expect("written");
        assert_eq!(dir.victim_text(), "untouched\n", "written through the link");
        assert_eq!(read_record(&record).expect("read"), "new\n");
    }

    #[test]
    fn temporary_names_are_unpredictable_and_keep_the_stem() {
        let dir = RunDir::new("names");
        let record = dir.run().join("0123456789abcdef.agent");
        let (a, _) = create_temporary(&record).expect("one");
        let (b, _) = create_temporary(&record).expect("two");
        assert_ne!(a, b, "two temporaries of one record share a name");
        for temporary in [&a, &b] {
            assert_eq!(temporary.file_stem(), record.file_stem(), "{temporary:?}");
            let name = temporary
                .file_name()
                .and_then(|n| n.to_str())
                .expect("name");
            assert!(
                !name.ends_with(&format!("-{}", std::process::id())),
                "named by the PID: {name}"
            );
        }
    }

    /// A link planted at a lock's path is not followed: the lock fails
    /// naming the path, and the file it points at is not touched.
    #[test]
    fn a_lock_is_never_opened_through_a_planted_link() {
        let dir = RunDir::new("lockfile");
        let lock = dir.run().join("0123456789abcdef.writers");
        std::os::unix::fs::symlink(dir.victim(), &lock).expect("plant a link");
        let error = open_lock_file(&lock).expect_err("a link is not a lock");
        assert!(matches!(error, LockError::NotAFile { .. }), "{error:?}");
        assert!(
            error.to_string().contains(&lock.display().to_string()),
            "{error}"
        );
        assert_eq!(dir.victim_text(), "untouched\n");
        fs::remove_file(&lock).expect("rm");
        let fifo = std::ffi::CString::new(lock.as_os_str().as_encoded_bytes()).expect("path");
        // SAFETY: mkfifo with a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0, "mkfifo");
        let error = open_lock_file(&lock).expect_err("a FIFO is not a lock, nor does it block");
        assert!(matches!(error, LockError::NotAFile { .. }), "{error:?}");
    }

    #[test]
    fn records_go_nowhere_in_a_writable_run_directory() {
        use std::os::unix::fs::PermissionsExt;
        let dir = RunDir::new("writable");
        fs::set_permissions(dir.run(), fs::Permissions::from_mode(0o775)).expect("chmod");
        let record = dir.run().join("0123456789abcdef.root");
        let error = write_record(&record, "x\n").expect_err("refused");
        assert!(
            error.to_string().contains("group- or world-writable"),
            "{error}"
        );
        assert!(!record.exists(), "nothing written");
        let error = open_lock_file(&record.with_extension("lock")).expect_err("refused");
        assert!(
            matches!(error, LockError::Bpffs(BpffsError::UnsafeDir { .. })),
            "{error:?}"
        );
    }

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
