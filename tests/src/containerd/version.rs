//! Which containerd the driver runs: Debian 12's 1.6 with the plugins 1.1
//! (the machine's), or an unpacked 2.x with the plugins 1.9 (named by
//! `EPM_CONTAINERD_ROOT`).

use std::path::{Path, PathBuf};

pub use crate::plugins::RUNTIME_ROOT_ENV;
use crate::plugins::UPSTREAM_PLUGIN_DIR;

/// The containerd under test and the reference plugins that go with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Runtime {
    /// Where `containerd`, `ctr` and `containerd-shim-runc-v2` are.
    pub bin_dir: PathBuf,
    /// Where `bridge`, `host-local`, `loopback` and `portmap` are.
    pub plugin_dir: PathBuf,
    /// The conflist's `cniVersion`: 1.1.0 only where containerd and the
    /// plugins speak it (containerd 1.6's libcni and the plugins 1.1
    /// refuse it).
    pub cni_version: &'static str,
}

impl Runtime {
    /// The machine's containerd (Debian 12: 1.6) and plugins (1.1).
    pub fn system() -> Runtime {
        Runtime {
            bin_dir: PathBuf::from("/usr/bin"),
            plugin_dir: PathBuf::from(UPSTREAM_PLUGIN_DIR),
            cni_version: "1.0.0",
        }
    }

    /// An unpacked containerd 2.x and plugins 1.9 under `root`.
    pub fn unpacked(root: &Path) -> Runtime {
        Runtime {
            bin_dir: root.join("usr/bin"),
            plugin_dir: root.join("usr/lib/cni"),
            cni_version: "1.1.0",
        }
    }

    /// [`Runtime::unpacked`] under `EPM_CONTAINERD_ROOT` if it is set,
    /// else [`Runtime::system`].
    pub fn from_env() -> Runtime {
        match std::env::var_os(RUNTIME_ROOT_ENV) {
            Some(root) if !root.is_empty() => Runtime::unpacked(Path::new(&root)),
            _ => Runtime::system(),
        }
    }

    /// Whether containerd asks the plugins for STATUS (CNI 1.1.0; containerd
    /// 2.x does on every CRI `Status`).
    pub fn sends_status(&self) -> bool {
        self.cni_version == "1.1.0"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runtime_is_the_machines_unless_a_root_is_named() {
        let unpacked = Runtime::unpacked(Path::new("/t/debian-unstable/root"));
        assert_eq!(
            (unpacked.bin_dir.as_path(), unpacked.plugin_dir.as_path()),
            (
                Path::new("/t/debian-unstable/root/usr/bin"),
                Path::new("/t/debian-unstable/root/usr/lib/cni")
            )
        );
        assert!(unpacked.sends_status());
        let system = Runtime::system();
        assert_eq!(system.plugin_dir, Path::new("/usr/lib/cni"));
        assert!(!system.sends_status(), "Debian 12's plugins refuse 1.1.0");
    }
}
