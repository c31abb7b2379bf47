//! Which network namespace a namespace cookie names, so that an operator
//! who runs a verb in the wrong namespace is told where to run it: a name
//! under /run/netns (what `ip netns` and CNI runtimes make), else a process
//! in it (`/proc/PID/ns/net`), both paths `nsenter --net=` takes.
//!
//! A cookie can only be read from a socket inside the namespace, so each
//! candidate is entered by a short-lived thread (`setns` changes the
//! calling thread's network namespace only); candidates are deduplicated
//! by the namespace's inode first. This walks every process: an error
//! path's cost, never a verb's.

use std::{
    collections::BTreeSet,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use crate::dataplane::container_netns;

/// Where `nsenter --net=` finds the namespace with `cookie`, if any name or
/// process is still in it.
pub fn find(cookie: u64) -> Option<PathBuf> {
    let mut seen = BTreeSet::new();
    candidates()
        .into_iter()
        .filter(|path| {
            std::fs::metadata(path).is_ok_and(|meta| seen.insert((meta.dev(), meta.ino())))
        })
        .find(|path| cookie_of(path) == Some(cookie))
}

/// /run/netns names first (what an operator knows namespaces by), then
/// every process's namespace in PID order.
fn candidates() -> Vec<PathBuf> {
    let mut named: Vec<PathBuf> = std::fs::read_dir("/run/netns")
        .map(|entries| entries.flatten().map(|entry| entry.path()).collect())
        .unwrap_or_default();
    named.sort();
    let mut pids: Vec<u32> = std::fs::read_dir("/proc")
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|entry| entry.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    pids.sort_unstable();
    named.extend(
        pids.into_iter()
            .map(|pid| PathBuf::from(format!("/proc/{pid}/ns/net"))),
    );
    named
}

/// The cookie of the namespace at `path`, read from a thread that enters it.
fn cookie_of(path: &Path) -> Option<u64> {
    container_netns::cookie_at(path).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_come_before_processes() {
        let candidates = candidates();
        let first_process = candidates
            .iter()
            .position(|p| p.starts_with("/proc"))
            .expect("this process is a candidate");
        assert!(
            candidates[first_process..]
                .iter()
                .all(|p| p.starts_with("/proc")),
            "{candidates:?}"
        );
    }
}
