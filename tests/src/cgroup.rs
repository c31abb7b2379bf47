//! A child cgroup (cgroup v2) per test, for the plugin's socket hooks.
//!
//! Hooks attached at the root of the cgroup2 hierarchy would see every
//! process of the machine; tests attach them to a child cgroup of their own
//! and move only their client processes into it. The child is named after
//! the test's pin root, so a conflist built from a pin root alone names the
//! right cgroup ([`cgroup_for_pin_root`]).

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Where the harness mounts cgroup2 when the machine has no cgroup2 mount
/// (the same hierarchy as any other cgroup2 mount: there is only one).
const PRIVATE_MOUNT: &str = "/run/epm-test-cgroup2";

/// The cgroup2 mount to create test cgroups under.
pub fn cgroup2_mount() -> &'static Path {
    static MOUNT: OnceLock<PathBuf> = OnceLock::new();
    MOUNT.get_or_init(|| {
        let mounts = fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        if let Some(path) = mounts.lines().find_map(|line| {
            let mut fields = line.split_whitespace();
            let (_, path, fstype) = (fields.next()?, fields.next()?, fields.next()?);
            (fstype == "cgroup2").then(|| PathBuf::from(path))
        }) {
            return path;
        }
        fs::create_dir_all(PRIVATE_MOUNT).expect("create the cgroup2 mount point");
        let status = std::process::Command::new("mount")
            .args(["-t", "cgroup2", "none", PRIVATE_MOUNT])
            .status()
            .expect("run mount");
        assert!(
            status.success(),
            "mounting cgroup2 at {PRIVATE_MOUNT} failed"
        );
        PathBuf::from(PRIVATE_MOUNT)
    })
}

/// The test cgroup that belongs to the pin root `pin_root`.
pub fn cgroup_for_pin_root(pin_root: &Path) -> PathBuf {
    let name = pin_root
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    cgroup2_mount().join(name)
}

/// Mount points of every cgroup hierarchy: each cgroup v1 controller and
/// cgroup2 (runtimes with the cgroupfs manager create their cgroups in all).
pub fn hierarchies() -> Vec<PathBuf> {
    let mounts = fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let mut hierarchies: Vec<PathBuf> = mounts
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let (_, path, fstype) = (fields.next()?, fields.next()?, fields.next()?);
            matches!(fstype, "cgroup" | "cgroup2").then(|| PathBuf::from(path))
        })
        .collect();
    hierarchies.sort();
    hierarchies.dedup();
    hierarchies
}

/// SIGKILL to one process.
pub fn kill(pid: i32) {
    // SAFETY: signalling one pid; no memory involved.
    unsafe { libc::kill(pid, libc::SIGKILL) };
}

/// Kills the processes in the cgroup `dir` and below, then removes the
/// cgroups, children first. For cgroups the harness (or a runtime it ran)
/// created; never panics, reports what it could not remove.
pub fn remove_tree(dir: &Path) {
    if !dir.is_dir() {
        return;
    }
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                remove_tree(&entry.path());
            }
        }
    }
    for attempt in 0..100 {
        let procs = fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
            if attempt == 0 {
                eprintln!(
                    "harness: killing process {pid} left in cgroup {}",
                    dir.display()
                );
            }
            kill(pid);
        }
        match fs::remove_dir(dir) {
            Ok(()) => return,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(20)),
        }
    }
    eprintln!("harness: could not remove cgroup {}", dir.display());
}

/// A child cgroup, removed on drop (after its processes are gone).
#[derive(Debug)]
pub struct TestCgroup {
    path: PathBuf,
}

impl TestCgroup {
    pub fn create(path: PathBuf) -> TestCgroup {
        fs::create_dir_all(&path)
            .unwrap_or_else(|e| panic!("creating cgroup {}: {e}", path.display()));
        TestCgroup { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Moves process `pid` into this cgroup.
    pub fn add_process(&self, pid: u32) {
        fs::write(self.path.join("cgroup.procs"), pid.to_string())
            .unwrap_or_else(|e| panic!("moving {pid} into {}: {e}", self.path.display()));
    }

    /// The path of `cgroup.procs`, for a child to move itself in from a
    /// `pre_exec` hook before it runs anything.
    pub fn procs_file(&self) -> PathBuf {
        self.path.join("cgroup.procs")
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        // Processes may take a moment to leave after they were killed.
        for _ in 0..50 {
            match fs::remove_dir(&self.path) {
                Ok(()) => return,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(20)),
            }
        }
        eprintln!("harness: could not remove cgroup {}", self.path.display());
    }
}
