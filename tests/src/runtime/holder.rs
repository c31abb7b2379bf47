//! The node's mount-namespace holder: a `sleep` in the test's node network
//! namespace and in a private mount namespace with its own tmpfs on `/run`
//! and `/dev/shm` and bind mounts of the test directory over the places a
//! runtime keeps state. Every runtime process enters both namespaces of the
//! holder (`nsenter`), so nothing lands on the machine's real `/run` or
//! `/var/lib` and the root network namespace is never touched.
//!
//! The holder dies with its creator thread (`PR_SET_PDEATHSIG`); its mount
//! namespace goes with its last process. Processes a runtime leaves in that
//! mount namespace are found by comparing `/proc/<pid>/ns/mnt`, never by
//! name.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::netns::NetNs;

/// What differs between the runtimes' private mount namespaces.
#[derive(Debug, Clone, Copy)]
pub struct HolderSpec {
    /// The tmpfs source names (`<tag>-run`, `<tag>-shm`, `<tag>-bpf`):
    /// what `findmnt` shows for them.
    pub tag: &'static str,
    /// `unshare --propagation`: `private`, or `slave` where mounts of the
    /// machine must still reach the runtime (containerd's overlay snapshots).
    pub propagation: &'static str,
    /// `(directory under the test directory, where it is bound)`.
    pub binds: &'static [(&'static str, &'static str)],
    /// Whether to mount a private bpffs on `/sys/fs/bpf` (ebpf-portmap's
    /// default pin root).
    pub private_bpffs: bool,
}

/// A running holder (see the module docs); killed on drop.
#[derive(Debug)]
pub struct MountNsHolder {
    child: Child,
    /// `mnt:[inode]` of the holder's mount namespace.
    mount_ns: String,
    /// The test directory: every command's working directory.
    dir: PathBuf,
}

impl MountNsHolder {
    /// Starts the holder inside `node` with the mounts of `spec` (bind
    /// sources under `dir`), and waits until they are in place. Call it
    /// from the test's own thread.
    ///
    /// # Panics
    /// If the private mount namespace cannot be set up.
    pub fn spawn(node: &NetNs, dir: &Path, spec: &HolderSpec) -> MountNsHolder {
        let text = dir.to_string_lossy();
        assert!(!text.contains('\''), "{text} contains a single quote");
        let mut command = node.command("unshare");
        command
            .args([
                "--mount",
                "--propagation",
                spec.propagation,
                "--",
                "/bin/sh",
                "-c",
            ])
            .arg(holder_script(spec, dir, crate::cgroup::cgroup2_mount()))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // SAFETY: prctl is async-signal-safe and touches no memory of ours.
        unsafe {
            command.pre_exec(die_with_parent);
        }
        let mut child = command
            .spawn()
            .unwrap_or_else(|e| panic!("starting unshare in netns {}: {e}", node.name()));
        let mut line = String::new();
        let stdout = child.stdout.take().expect("stdout is piped");
        let _ = BufReader::new(stdout).read_line(&mut line);
        if line.trim() != "ready" {
            let _ = child.kill();
            let out = child.wait_with_output();
            panic!(
                "the private mount namespace ({}) could not be set up: {:?}",
                spec.tag,
                out.map(|o| String::from_utf8_lossy(&o.stderr).into_owned())
            );
        }
        let mount_ns = std::fs::read_link(format!("/proc/{}/ns/mnt", child.id()))
            .map(|link| link.to_string_lossy().into_owned())
            .unwrap_or_default();
        let holder = MountNsHolder {
            child,
            mount_ns,
            dir: dir.to_path_buf(),
        };
        assert!(
            !holder.mount_ns.is_empty(),
            "reading the holder's mount namespace"
        );
        holder
    }

    /// The holder's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `nsenter` arguments entering both namespaces of the holder, in the
    /// test directory (`--mount` resets the working directory), ending
    /// with `--`: the program and its arguments follow.
    pub fn nsenter_args(&self) -> Vec<OsString> {
        vec![
            format!("--target={}", self.pid()).into(),
            "--mount".into(),
            "--net".into(),
            format!("--wd={}", self.dir.display()).into(),
            "--".into(),
        ]
    }

    /// `program` run in the node's network namespace and the private mount
    /// namespace, stdin closed.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new("nsenter");
        command
            .args(self.nsenter_args())
            .arg(program)
            .stdin(Stdio::null());
        command
    }

    /// `<path>` as the node's mount namespace sees it (through the holder's
    /// `/proc/<pid>/root`).
    pub fn node_path(&self, path: &str) -> PathBuf {
        Path::new(&format!("/proc/{}/root", self.pid())).join(path.trim_start_matches('/'))
    }

    /// Processes in the private mount namespace other than the holder:
    /// `(pid, comm)`.
    pub fn processes(&self) -> Vec<(i32, String)> {
        let holder = i32::try_from(self.pid()).unwrap_or_default();
        processes_in_mount_ns(&self.mount_ns)
            .into_iter()
            .filter(|pid| *pid != holder)
            .map(|pid| {
                let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
                (pid, comm.trim().to_owned())
            })
            .collect()
    }

    /// Kills every process a runtime left in the mount namespace (for a
    /// teardown), saying which.
    pub fn kill_leftovers(&self, runtime: &str) {
        for (pid, comm) in self.processes() {
            eprintln!(
                "harness: killing process {pid} ({comm}) left in {runtime}'s mount namespace"
            );
            crate::cgroup::kill(pid);
        }
    }
}

impl Drop for MountNsHolder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `PR_SET_PDEATHSIG(SIGKILL)`, for a `pre_exec` hook: the process dies
/// with the thread that started it.
pub fn die_with_parent() -> std::io::Result<()> {
    // SAFETY: prctl is async-signal-safe and touches no memory of ours.
    if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Pids of the processes in the mount namespace `mount_ns` (`mnt:[inode]`).
fn processes_in_mount_ns(mount_ns: &str) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/ns/mnt"))
                .is_ok_and(|link| link.to_string_lossy() == mount_ns)
        })
        .collect()
}

/// The script the holder runs in its new mount namespace; `cgroup2` is the
/// cgroup2 mount the harness uses.
pub fn holder_script(spec: &HolderSpec, root: &Path, cgroup2: &Path) -> String {
    let tag = spec.tag;
    let mut script = String::from("set -e\n");
    let _ = writeln!(script, "mount -t tmpfs -o mode=0755 {tag}-run /run");
    let _ = writeln!(script, "mount -t tmpfs -o mode=1777 {tag}-shm /dev/shm");
    for (source, target) in spec.binds {
        let _ = writeln!(
            script,
            "mount --bind '{}' {target}",
            root.join(source).display()
        );
    }
    if spec.private_bpffs {
        let _ = writeln!(
            script,
            "mount -t bpf {tag}-bpf {}",
            crate::bpffs::BPFFS_MOUNT
        );
    }
    // The harness's cgroup2 mount, if it lives under /run (a machine without
    // one), would be hidden by the new tmpfs: mount the hierarchy again (the
    // plugin's socket hooks need it).
    if cgroup2.starts_with("/run") {
        let _ = writeln!(
            script,
            "mkdir -p '{0}' && mount -t cgroup2 none '{0}'",
            cgroup2.display()
        );
    }
    script.push_str("echo ready\nexec sleep infinity\n");
    script
}

#[cfg(test)]
mod tests {
    use super::*;

    const PODMAN_LIKE: HolderSpec = HolderSpec {
        tag: "epm-podman",
        propagation: "private",
        binds: &[("var-lib", "/var/lib"), ("var-tmp", "/var/tmp")],
        private_bpffs: false,
    };

    #[test]
    fn holder_mounts_private_state_dirs() {
        let script = holder_script(
            &PODMAN_LIKE,
            Path::new("/tmp/p"),
            Path::new("/sys/fs/cgroup"),
        );
        assert!(script.starts_with("set -e\n"));
        assert!(script.contains("mount -t tmpfs -o mode=0755 epm-podman-run /run\n"));
        assert!(script.contains("mount --bind '/tmp/p/var-lib' /var/lib\n"));
        assert!(!script.contains("cgroup2"), "{script}");
        assert!(!script.contains("-t bpf"), "{script}");
        assert!(script.ends_with("echo ready\nexec sleep infinity\n"));
        // The harness's own cgroup2 mount would be hidden by the new /run.
        let script = holder_script(
            &PODMAN_LIKE,
            Path::new("/tmp/p"),
            Path::new("/run/epm-test-cgroup2"),
        );
        assert!(
            script.contains("mount -t cgroup2 none '/run/epm-test-cgroup2'"),
            "{script}"
        );
    }

    #[test]
    fn holder_mounts_private_state_and_bpffs() {
        let spec = HolderSpec {
            tag: "epm-ctrd",
            propagation: "slave",
            binds: &[("var-lib", "/var/lib"), ("var-log", "/var/log")],
            private_bpffs: true,
        };
        let script = holder_script(
            &spec,
            Path::new("/tmp/c"),
            Path::new("/sys/fs/cgroup/unified"),
        );
        assert!(script.contains("mount -t tmpfs -o mode=0755 epm-ctrd-run /run\n"));
        assert!(script.contains("mount --bind '/tmp/c/var-lib' /var/lib\n"));
        assert!(script.contains("mount --bind '/tmp/c/var-log' /var/log\n"));
        assert!(script.contains("mount -t bpf epm-ctrd-bpf /sys/fs/bpf\n"));
        assert!(!script.contains("cgroup2"), "{script}");
        assert!(script.ends_with("echo ready\nexec sleep infinity\n"));
    }
}
