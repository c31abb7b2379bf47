//! Where the plugins under test come from.
//!
//! [`plugin_dirs`] makes one private plugin directory holding every reference
//! plugin of `/usr/lib/cni` plus `ebpf-portmap`, so a conflist can name either
//! the upstream `portmap` or ours by `type`. [`PluginDirs::traced`] makes the
//! same directory out of small shell shims that log each execution, which also
//! catches delegated plugins (bridge runs host-local itself, the runner never
//! sees it).

use std::path::{Path, PathBuf};

use crate::tmp::TempDir;

/// Where Debian's containernetworking-plugins installs the reference plugins.
pub const UPSTREAM_PLUGIN_DIR: &str = "/usr/lib/cni";

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
    dir: TempDir,
    trace_log: Option<PathBuf>,
}

/// One execution seen by a traced plugin directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TracedExec {
    pub plugin: String,
    /// `CNI_COMMAND` as the plugin saw it.
    pub command: String,
    pub container_id: String,
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
            dir,
            trace_log: None,
        }
    }

    /// Like [`PluginDirs::new`], but every entry is a `/bin/sh` shim that appends
    /// `<plugin> <CNI_COMMAND> <CNI_CONTAINERID>` to a log, then execs the real
    /// binary with the same stdin, stdout, stderr and arguments.
    pub fn traced() -> PluginDirs {
        let dir = TempDir::new("plugins");
        let trace_log = dir.path().join(".trace.log");
        std::fs::write(&trace_log, b"")
            .unwrap_or_else(|e| panic!("creating {}: {e}", trace_log.display()));
        for (name, target) in plugin_targets(&plugin_bin()) {
            let shim = dir.path().join(&name);
            std::fs::write(&shim, shim_script(&name, &target, &trace_log))
                .unwrap_or_else(|e| panic!("writing shim {}: {e}", shim.display()));
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&shim, std::fs::Permissions::from_mode(0o755))
                .unwrap_or_else(|e| panic!("chmod {}: {e}", shim.display()));
        }
        PluginDirs {
            dir,
            trace_log: Some(trace_log),
        }
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The directory as a `CNI_PATH`-style list for [`crate::CniRunner::new`].
    pub fn paths(&self) -> Vec<PathBuf> {
        vec![self.dir.path().to_path_buf()]
    }

    /// Every execution logged so far by a traced directory, in order.
    ///
    /// # Panics
    /// If the directory was made by [`PluginDirs::new`] (not traced).
    pub fn trace(&self) -> Vec<TracedExec> {
        let log = self
            .trace_log
            .as_ref()
            .expect("PluginDirs::trace needs PluginDirs::traced()");
        let text = std::fs::read_to_string(log)
            .unwrap_or_else(|e| panic!("reading {}: {e}", log.display()));
        parse_trace(&text)
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

fn shell_quote(path: &Path) -> String {
    let text = path
        .to_str()
        .unwrap_or_else(|| panic!("{} is not UTF-8", path.display()));
    assert!(!text.contains('\''), "{text} contains a single quote");
    format!("'{text}'")
}

fn shim_script(name: &str, target: &Path, trace_log: &Path) -> String {
    assert!(
        !name.contains('\''),
        "plugin name {name} contains a single quote"
    );
    format!(
        "#!/bin/sh\nprintf '%s %s %s\\n' '{name}' \"${{CNI_COMMAND:--}}\" \"${{CNI_CONTAINERID:--}}\" >> {log}\nexec {target} \"$@\"\n",
        log = shell_quote(trace_log),
        target = shell_quote(target),
    )
}

/// Parses the shim log: one `<plugin> <command> <container>` line per exec
/// (`-` stands for an empty value).
pub fn parse_trace(text: &str) -> Vec<TracedExec> {
    let dash_is_empty = |s: &str| {
        if s == "-" {
            String::new()
        } else {
            s.to_owned()
        }
    };
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split(' ');
            Some(TracedExec {
                plugin: fields.next()?.to_owned(),
                command: dash_is_empty(fields.next()?),
                container_id: dash_is_empty(fields.next().unwrap_or("-")),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_lines_parse() {
        let trace = parse_trace("bridge ADD c1\nhost-local ADD c1\nportmap VERSION -\n");
        assert_eq!(trace.len(), 3);
        assert_eq!(
            trace[1],
            TracedExec {
                plugin: "host-local".into(),
                command: "ADD".into(),
                container_id: "c1".into()
            }
        );
        assert_eq!(trace[2].container_id, "");
    }

    #[test]
    fn shim_execs_the_target_and_logs() {
        let script = shim_script(
            "bridge",
            Path::new("/usr/lib/cni/bridge"),
            Path::new("/tmp/x/.trace.log"),
        );
        assert!(script.starts_with("#!/bin/sh\n"));
        assert!(script.contains(">> '/tmp/x/.trace.log'"), "{script}");
        assert!(
            script.contains("exec '/usr/lib/cni/bridge' \"$@\""),
            "{script}"
        );
    }

    #[test]
    fn plugin_bin_defaults_into_the_workspace_target_dir() {
        if std::env::var_os(PLUGIN_BIN_ENV).is_none() {
            assert!(plugin_bin().ends_with("target/debug/ebpf-portmap"));
        }
    }
}
