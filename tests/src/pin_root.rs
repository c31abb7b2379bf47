//! Per-test pin roots on bpffs.
//!
//! A [`PinRoot`] is a fresh directory `/sys/fs/bpf/<prefix>-test-<pid>-<n>` to
//! pass as the plugin's `pinRoot`; it and every pin below it are removed on
//! drop. bpffs is mounted at `/sys/fs/bpf` first if nothing is mounted there.

use std::io;
use std::path::{Path, PathBuf};

use crate::bpffs::{BPFFS_MOUNT, RUN_DIR, ensure_bpffs, lock_file, remove_tree};

/// A private directory on bpffs, removed with all its pins on drop.
/// Also owns the test's child cgroup for the socket hooks (see
/// [`crate::cgroup`]); both go away on drop.
#[derive(Debug)]
pub struct PinRoot {
    path: PathBuf,
    cgroup: Option<crate::cgroup::TestCgroup>,
}

impl PinRoot {
    /// Creates `/sys/fs/bpf/<prefix>-test-<pid>-<n>`, mounting bpffs if needed.
    ///
    /// # Panics
    /// If bpffs cannot be mounted or the directory cannot be created.
    pub fn new() -> PinRoot {
        crate::naming::reap_stale();
        ensure_bpffs().unwrap_or_else(|e| panic!("{e}: {:?}", std::error::Error::source(&e)));
        let path = Path::new(BPFFS_MOUNT).join(crate::naming::unique_name("test"));
        std::fs::create_dir(&path)
            .unwrap_or_else(|e| panic!("creating pin root {}: {e}", path.display()));
        let cgroup = crate::cgroup::TestCgroup::create(crate::cgroup::cgroup_for_pin_root(&path));
        PinRoot {
            path,
            cgroup: Some(cgroup),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The child cgroup the plugin's socket hooks attach to in this test.
    pub fn cgroup(&self) -> &crate::cgroup::TestCgroup {
        self.cgroup
            .as_ref()
            .expect("the cgroup lives as long as the pin root")
    }

    /// Every file (pin) below the root, relative to it, sorted: for asserting
    /// what a plugin pinned or left behind.
    pub fn pins(&self) -> Vec<PathBuf> {
        fn walk(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
            let Ok(entries) = std::fs::read_dir(dir) else {
                return;
            };
            for entry in entries.flatten() {
                let path = entry.path();
                if path.is_dir() {
                    walk(root, &path, out);
                } else if let Ok(relative) = path.strip_prefix(root) {
                    out.push(relative.to_path_buf());
                }
            }
        }
        let mut pins = Vec::new();
        walk(&self.path, &self.path, &mut pins);
        pins.sort();
        pins
    }
}

impl Default for PinRoot {
    fn default() -> Self {
        PinRoot::new()
    }
}

impl Drop for PinRoot {
    fn drop(&mut self) {
        // Unpinning the links detaches the hooks; then the cgroup can go.
        let cgroup = self.cgroup.take();
        if let Err(e) = remove_tree(&self.path)
            && e.kind() != io::ErrorKind::NotFound
        {
            eprintln!(
                "harness: could not remove pin root {}: {e}",
                self.path.display()
            );
        }
        drop(cgroup);
        // The plugin leaves its lock file on purpose (removing a lock
        // someone may wait on would let two loaders in); this root is done
        // with, so the test takes it and every record beside it away: the
        // files of the run directory named after the lock (`{hash}.*`).
        let lock = lock_file(&self.path);
        let stem = lock.file_stem().map(ToOwned::to_owned);
        let records = std::fs::read_dir(RUN_DIR)
            .into_iter()
            .flatten()
            .flatten()
            .map(|entry| entry.path())
            .filter(|path| path.file_stem().map(ToOwned::to_owned) == stem);
        for record in records {
            let _ = std::fs::remove_file(record);
        }
    }
}
