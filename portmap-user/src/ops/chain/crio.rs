//! Whether CRI-O runs the node, so that `chain install` can say that
//! chaining ebpf-portmap there achieves nothing.
//!
//! CRI-O maps host ports itself (its `internal/hostport` package, iptables
//! or nftables) and never hands a pod's port mappings to the CNI chain: with
//! or without `disable_hostport_mapping`, the `portMappings` capability
//! arrives empty (cri-o/cri-o#7217, closed unfixed). A plugin chained there
//! is run for every pod and asked to map nothing. The node is recognised by
//! what a CRI-O install leaves on it: its configuration and its socket.

use std::path::{Path, PathBuf};

/// What a CRI-O node has, relative to its root: the configuration file, its
/// drop-in directory, and the socket at its default path (`/var/run` is a
/// link to `/run` on current distributions; both are listed for the nodes
/// where it is not, and for a host root mounted without that link).
pub const CRIO_MARKERS: [&str; 4] = [
    "etc/crio/crio.conf",
    "etc/crio/crio.conf.d",
    "var/run/crio/crio.sock",
    "run/crio/crio.sock",
];

/// The CRI-O markers present under `host_root` (the node's `/`, or where it
/// is mounted), as full paths; empty when the node shows no sign of CRI-O.
/// A marker that cannot be examined (permission) counts as absent.
pub fn crio_markers(host_root: &Path) -> Vec<PathBuf> {
    CRIO_MARKERS
        .iter()
        .map(|marker| host_root.join(marker))
        .filter(|path| path.symlink_metadata().is_ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_are_found_under_the_host_root_only() {
        let root = std::env::temp_dir().join(format!("epm-crio-unit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).expect("temp root");
        assert_eq!(crio_markers(&root), Vec::<PathBuf>::new(), "an empty root");
        std::fs::create_dir_all(root.join("etc/crio/crio.conf.d")).expect("drop-in dir");
        std::fs::create_dir_all(root.join("run/crio")).expect("socket dir");
        std::fs::write(root.join("run/crio/crio.sock"), b"").expect("socket stand-in");
        assert_eq!(
            crio_markers(&root),
            [
                root.join("etc/crio/crio.conf.d"),
                root.join("run/crio/crio.sock")
            ],
            "the drop-in directory and the socket"
        );
        std::fs::remove_dir_all(&root).expect("cleanup");
    }
}
