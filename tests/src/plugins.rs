//! Where the plugins under test come from.
//!
//! [`plugin_dirs`] makes one private plugin directory holding every reference
//! plugin of `/usr/lib/cni` plus `ebpf-portmap`, so a conflist can name either
//! the upstream `portmap` or ours by `type`. [`PluginDirs::traced`] makes the
//! same directory out of the runtime harness's recording shims
//! ([`crate::runtime::recorder`]), which also catch delegated plugins (bridge
//! runs host-local itself, the runner never sees it).

use std::path::{Path, PathBuf};

use crate::runtime::recorder::{CniCall, Recorder};
use crate::tmp::TempDir;

/// Where Debian's containernetworking-plugins installs the reference plugins.
pub const UPSTREAM_PLUGIN_DIR: &str = "/usr/lib/cni";

/// Names the root of the newer upstream release `cargo xtask setup` unpacks
/// from Debian's unstable suite: containerd 2.x (`usr/bin/containerd`) and
/// the plugins 1.9 (`usr/lib/cni/bridge`, `portmap`, ...). The containerd
/// driver runs that containerd, and upstream nftables portmap is taken
/// from there.
pub const RUNTIME_ROOT_ENV: &str = "EPM_CONTAINERD_ROOT";

/// The `type` of our plugin.
pub const PLUGIN_TYPE: &str = "ebpf-portmap";

/// Environment variable naming the built plugin binary.
pub const PLUGIN_BIN_ENV: &str = "EBPF_PORTMAP_BIN";

/// The workspace root (parent of this crate).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// The `ebpf-portmap` binary under test: `$EBPF_PORTMAP_BIN`, else
/// `<workspace>/target/debug/ebpf-portmap`. It may not exist yet.
pub fn plugin_bin() -> PathBuf {
    match std::env::var_os(PLUGIN_BIN_ENV) {
        Some(path) if !path.is_empty() => PathBuf::from(path),
        _ => workspace_root().join("target/debug").join(PLUGIN_TYPE),
    }
}

/// A private plugin directory (see the module docs), removed on drop.
#[derive(Debug)]
pub struct PluginDirs {
    /// The plugins: `dir` itself, or the recorder's `bin/` in it.
    path: PathBuf,
    recorder: Option<Recorder>,
    /// Held for its drop, which removes the directory.
    _dir: TempDir,
}

/// Symlinks to every file in `/usr/lib/cni` plus `ebpf-portmap` → [`plugin_bin`].
pub fn plugin_dirs() -> PluginDirs {
    PluginDirs::new()
}

impl PluginDirs {
    /// Symlinks to every file in `/usr/lib/cni` plus `ebpf-portmap` → [`plugin_bin`].
    ///
    /// # Panics
    /// If `/usr/lib/cni` cannot be read or a link cannot be made.
    pub fn new() -> PluginDirs {
        PluginDirs::with_plugin_bin(&plugin_bin())
    }

    /// Like [`PluginDirs::new`], with `ebpf-portmap` → `bin` (another build
    /// of the plugin, e.g. the baseline a benchmark compares with).
    ///
    /// # Panics
    /// As [`PluginDirs::new`].
    pub fn with_plugin_bin(bin: &Path) -> PluginDirs {
        PluginDirs::linked(bin, false)
    }

    /// Like [`PluginDirs::with_plugin_bin`], but `ebpf-portmap` is a copy of
    /// `bin` written into the directory (the reference plugins stay links).
    ///
    /// For benchmarks that compare two builds: how an executable file was
    /// written changes what each exec of it costs (the same bytes measured
    /// about 10% dearer per ADD when run from the file the linker wrote than
    /// from a fresh copy), so both sides of a comparison run copies made the
    /// same way, in the same file system.
    ///
    /// # Panics
    /// As [`PluginDirs::new`], or if `bin` cannot be copied.
    pub fn with_plugin_copy(bin: &Path) -> PluginDirs {
        PluginDirs::linked(bin, true)
    }

    fn linked(bin: &Path, copy_ours: bool) -> PluginDirs {
        let dir = TempDir::new("plugins");
        for (name, target) in plugin_targets(bin) {
            let link = dir.path().join(&name);
            if copy_ours && name == PLUGIN_TYPE {
                std::fs::copy(&target, &link).unwrap_or_else(|e| {
                    panic!("copying {} to {}: {e}", target.display(), link.display())
                });
                continue;
            }
            std::os::unix::fs::symlink(&target, &link).unwrap_or_else(|e| {
                panic!("linking {} -> {}: {e}", link.display(), target.display())
            });
        }
        PluginDirs {
            path: dir.path().to_path_buf(),
            recorder: None,
            _dir: dir,
        }
    }

    /// Like [`PluginDirs::new`], but every entry is a recording shim
    /// ([`crate::runtime::recorder`]) in front of the real binary: each
    /// execution is recorded with its environment, stdin, answer and exit
    /// code.
    pub fn traced() -> PluginDirs {
        let dir = TempDir::new("plugins");
        let targets = plugin_targets(&plugin_bin());
        let recorder = Recorder::install(
            dir.path(),
            targets
                .iter()
                .map(|(name, target)| (name.as_str(), target.as_path())),
        );
        PluginDirs {
            path: recorder.bin_dir().to_path_buf(),
            recorder: Some(recorder),
            _dir: dir,
        }
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The directory as a `CNI_PATH`-style list for [`crate::CniRunner::new`].
    pub fn paths(&self) -> Vec<PathBuf> {
        vec![self.path.clone()]
    }

    /// The recorder of a traced directory.
    pub fn recorder(&self) -> Option<&Recorder> {
        self.recorder.as_ref()
    }

    /// Every execution recorded so far by a traced directory, oldest first.
    ///
    /// # Panics
    /// If the directory was made by [`PluginDirs::new`] (not traced).
    pub fn trace(&self) -> Vec<CniCall> {
        self.recorder
            .as_ref()
            .expect("PluginDirs::trace needs PluginDirs::traced()")
            .calls()
    }
}

impl Default for PluginDirs {
    fn default() -> Self {
        PluginDirs::new()
    }
}

/// (name, real binary) for every plugin the directory offers, ours being
/// `ours`.
fn plugin_targets(ours: &Path) -> Vec<(String, PathBuf)> {
    let entries = std::fs::read_dir(UPSTREAM_PLUGIN_DIR).unwrap_or_else(|e| {
        panic!("reading {UPSTREAM_PLUGIN_DIR}: {e} (install containernetworking-plugins: `cargo xtask setup`)")
    });
    let mut targets: Vec<(String, PathBuf)> = entries
        .filter_map(Result::ok)
        .filter(|entry| entry.path().is_file())
        .filter_map(|entry| Some((entry.file_name().into_string().ok()?, entry.path())))
        .filter(|(name, _)| name != PLUGIN_TYPE)
        .collect();
    targets.push((PLUGIN_TYPE.to_owned(), ours.to_path_buf()));
    targets.sort();
    targets
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plugin_bin_defaults_into_the_workspace_target_dir() {
        if std::env::var_os(PLUGIN_BIN_ENV).is_none() {
            assert!(plugin_bin().ends_with("target/debug/ebpf-portmap"));
        }
    }
}
