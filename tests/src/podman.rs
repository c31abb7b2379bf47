//! Podman (Debian's 4.3, `network_backend = "cni"`) confined to a test's node
//! network namespace, driving a conflist the test writes.
//!
//! What [`Podman::start`] sets up, all of it removed on drop:
//! - a directory `<tmp>/<prefix>-podman-<pid>-<n>` holding podman's own
//!   `containers.conf`, `storage.conf` (vfs: no mounts to leak) and an empty
//!   `registries.conf` (named by `CONTAINERS_CONF`,
//!   `CONTAINERS_STORAGE_CONF` and `CONTAINERS_REGISTRIES_CONF`), its CNI
//!   config directory with the test's conflist, its storage and event log;
//! - a holder process (`sleep`) in the node's network namespace and in a
//!   private mount namespace with its own tmpfs on `/run` and `/dev/shm` and
//!   bind mounts of the test directory over `/var/lib` and `/var/tmp`, where
//!   podman, runc and libcni keep state (`/run/netns`, `/run/runc`,
//!   `/run/libpod`, shm locks, `/var/lib/cni`). Every podman command enters
//!   both namespaces of the holder with `nsenter`, so nothing lands on the
//!   machine's real `/run` or `/var/lib` and the root network namespace is
//!   never touched;
//! - a cgroup parent `/<prefix>-podman-<pid>-<n>` for every container
//!   (`--cgroup-parent`; podman's cgroupfs manager puts conmon in its
//!   `conmon` child), removed from every mounted hierarchy at the end.
//!
//! The runtime is `runc` with the `cgroupfs` manager (`crun` refuses hybrid
//! cgroup hosts), events go to a file (no journald), and the default ulimits
//! are lowered to what this process may set: podman's defaults (1048576)
//! would make runc's `setrlimit` fail without CAP_SYS_RESOURCE.
//!
//! Drop removes every container (`rm --all --force --time 0`, so the CNI DEL
//! runs), kills whatever podman left in the private mount namespace or the
//! cgroup parent, the holder, and the directories. A run killed outright
//! leaves a cgroup parent with a dead creator pid: the next run's
//! [`crate::naming::reap_stale`] kills the processes in it (conmon, the
//! containers) and removes it; the holder dies with its creator thread
//! (`PR_SET_PDEATHSIG`), and its mount namespace with its last process.

use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::cni::Conflist;
use crate::netns::NetNs;
use crate::tmp::TempDir;
use crate::topology::PortMapping;

/// The image [`Podman::import_image`] makes.
pub const IMAGE: &str = "localhost/epm-e2e:latest";
/// Where the image has the test's connection tester.
pub const IMAGE_PROBE: &str = "/usr/local/bin/probe";
/// The busybox every container of the image runs (`httpd`, `sh`).
pub const BUSYBOX: &str = "/bin/busybox";
/// How long one podman command may take before it is killed.
pub const PODMAN_TIMEOUT: Duration = Duration::from_secs(120);
/// The `kind` in the names of the directory and the cgroup parent.
const KIND: &str = "podman";

/// A podman command that failed.
#[derive(Debug, thiserror::Error)]
pub enum PodmanError {
    #[error("could not start `podman {args}`")]
    Spawn {
        args: String,
        #[source]
        source: std::io::Error,
    },
    #[error("`podman {args}` failed ({status}): {stderr}")]
    Failed {
        args: String,
        status: ExitStatus,
        stdout: String,
        stderr: String,
    },
}

/// A podman confined to a node namespace (see the module docs).
#[derive(Debug)]
pub struct Podman {
    holder: Child,
    /// `mnt:[inode]` of the holder's mount namespace: every process podman
    /// starts there (conmon, runc) is ours.
    mount_ns: String,
    cgroup_parent: String,
    network: String,
    dir: TempDir,
}

/// One container as `podman inspect` reports it on the test's network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerInfo {
    pub id: String,
    pub name: String,
    pub running: bool,
    pub ipv4: Option<Ipv4Addr>,
    pub ipv6: Option<Ipv6Addr>,
}

impl Podman {
    /// Writes podman's configuration with `conflist` as its only CNI network
    /// (plugins looked up in `plugin_dir`), and starts the holder inside
    /// `node`. Call it from the test's own thread: the holder is killed when
    /// the thread that started it exits.
    ///
    /// # Panics
    /// If a file cannot be written or the private mount namespace cannot be made.
    pub fn start(node: &NetNs, plugin_dir: &Path, conflist: &Conflist) -> Podman {
        let dir = TempDir::new(KIND);
        let root = dir.path();
        for sub in ["net.d", "storage", "runroot", "var-lib", "var-tmp", "image"] {
            std::fs::create_dir(root.join(sub))
                .unwrap_or_else(|e| panic!("creating {}: {e}", root.join(sub).display()));
        }
        let write = |name: &str, text: &str| {
            let path = root.join(name);
            std::fs::write(&path, text)
                .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        };
        let (nofile, nproc) = default_ulimits();
        write(
            "containers.conf",
            &containers_conf(root, plugin_dir, nofile, nproc),
        );
        write("storage.conf", &storage_conf(root));
        write("registries.conf", "");
        let network = conflist.name().to_owned();
        write(
            &format!("net.d/{network}.conflist"),
            &serde_json::to_string_pretty(conflist.json()).expect("a Value always serialises"),
        );
        // The cgroup parent's name: the directory's own name, so that both
        // carry the creator's pid for the stale sweep.
        let cgroup_parent = root
            .file_name()
            .and_then(|n| n.to_str())
            .expect("a harness temp dir has a UTF-8 name")
            .to_owned();
        debug_assert!(cgroup_parent.contains(&format!("-{KIND}-")));
        let holder = spawn_holder(node, root);
        let mount_ns = std::fs::read_link(format!("/proc/{}/ns/mnt", holder.id()))
            .map(|link| link.to_string_lossy().into_owned())
            .unwrap_or_default();
        let podman = Podman {
            holder,
            mount_ns,
            cgroup_parent,
            network,
            dir,
        };
        assert!(
            !podman.mount_ns.is_empty(),
            "reading the holder's mount namespace"
        );
        podman
    }

    /// The test directory (configuration, storage, event log).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The CNI network every container joins (the conflist's `name`).
    pub fn network(&self) -> &str {
        &self.network
    }

    /// `--cgroup-parent` of every container (`/<name>`).
    pub fn cgroup_parent(&self) -> String {
        format!("/{}", self.cgroup_parent)
    }

    /// `podman args...` in the node's network namespace and the private
    /// mount namespace, with the test's configuration, killed after
    /// [`PODMAN_TIMEOUT`].
    pub fn command(&self, args: &[&str]) -> Command {
        let conf = |name: &str| self.dir.path().join(name);
        let mut command = Command::new("timeout");
        command
            .arg("--kill-after=5")
            .arg(PODMAN_TIMEOUT.as_secs().to_string())
            .arg("nsenter")
            .arg(format!("--target={}", self.holder.id()))
            .args(["--mount", "--net"])
            // nsenter --mount resets the working directory.
            .arg(format!("--wd={}", self.dir.path().display()))
            .arg("podman")
            .args(args)
            .env("CONTAINERS_CONF", conf("containers.conf"))
            .env("CONTAINERS_STORAGE_CONF", conf("storage.conf"))
            .env("CONTAINERS_REGISTRIES_CONF", conf("registries.conf"))
            .stdin(Stdio::null());
        command
    }

    /// Runs `podman args...`; its stdout, trimmed.
    pub fn run(&self, args: &[&str]) -> Result<String, PodmanError> {
        let shown = args.join(" ");
        let out = self
            .command(args)
            .output()
            .map_err(|source| PodmanError::Spawn {
                args: shown.clone(),
                source,
            })?;
        let stdout = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        if out.status.success() {
            Ok(stdout)
        } else {
            Err(PodmanError::Failed {
                args: shown,
                status: out.status,
                stdout,
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
            })
        }
    }

    /// Builds a tiny image with no registry: busybox (`sh`, `httpd`) and the
    /// connection tester `probe` at [`IMAGE_PROBE`], each with the shared
    /// libraries `ldd` names, imported as [`IMAGE`].
    ///
    /// # Panics
    /// If a file cannot be copied, `tar` fails or `podman import` fails.
    pub fn import_image(&self, probe: &Path) {
        let rootfs = self.dir.path().join("image/rootfs");
        install_binary(&rootfs, Path::new(BUSYBOX), Path::new(BUSYBOX));
        for applet in ["sh", "httpd", "mkdir"] {
            let link = rootfs.join("bin").join(applet);
            std::os::unix::fs::symlink("busybox", &link)
                .unwrap_or_else(|e| panic!("linking {}: {e}", link.display()));
        }
        install_binary(&rootfs, probe, Path::new(IMAGE_PROBE));
        let tarball = self.dir.path().join("image/rootfs.tar");
        let out = Command::new("tar")
            .arg("-C")
            .arg(&rootfs)
            .arg("-cf")
            .arg(&tarball)
            .arg(".")
            .output()
            .expect("run tar");
        assert!(
            out.status.success(),
            "tar of the image rootfs: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let tarball = tarball.to_string_lossy().into_owned();
        self.run(&["import", &tarball, IMAGE])
            .unwrap_or_else(|e| panic!("{e}"));
    }

    /// `podman run -d` of [`IMAGE`] on the test's network, publishing
    /// `ports`, serving HTTP on 80 (the body is `name`) and the UDP echo on
    /// 53 (answers are prefixed with `name`). Returns the container ID.
    pub fn run_web(&self, name: &str, ports: &[PortMapping]) -> Result<String, PodmanError> {
        let args = run_web_args(name, &self.network, &self.cgroup_parent(), ports);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.run(&args)
    }

    /// The container `name_or_id` as `podman inspect` reports it.
    ///
    /// # Panics
    /// If podman fails or prints something that is not one container.
    pub fn inspect(&self, name_or_id: &str) -> ContainerInfo {
        let text = self
            .run(&["inspect", "--type", "container", name_or_id])
            .unwrap_or_else(|e| panic!("{e}"));
        let json: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("podman inspect printed no JSON ({e}): {text}"));
        container_info(&json, &self.network)
            .unwrap_or_else(|| panic!("podman inspect {name_or_id}: unexpected shape: {text}"))
    }

    /// Best-effort state for failure messages: containers, the tail of the
    /// event log. Never panics.
    pub fn diagnostics(&self) -> String {
        let mut report = String::new();
        for args in [&["ps", "--all", "--no-trunc"][..], &["network", "ls"]] {
            let _ = writeln!(report, "--- podman {}", args.join(" "));
            match self.run(args) {
                Ok(out) => report.push_str(&out),
                Err(e) => report.push_str(&e.to_string()),
            }
            report.push('\n');
        }
        let events =
            std::fs::read_to_string(self.dir.path().join("events.log")).unwrap_or_default();
        let tail: Vec<&str> = events.lines().rev().take(20).collect();
        let _ = writeln!(
            report,
            "--- podman events (last {}, newest first)",
            tail.len()
        );
        for line in tail {
            report.push_str(line);
            report.push('\n');
        }
        report
    }

    /// Pids of the processes in the holder's mount namespace, holder included.
    fn processes_in_mount_ns(&self) -> Vec<i32> {
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        entries
            .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<i32>().ok())
            .filter(|pid| {
                std::fs::read_link(format!("/proc/{pid}/ns/mnt"))
                    .is_ok_and(|link| link.to_string_lossy() == self.mount_ns)
            })
            .collect()
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        // Removing the containers runs the CNI DEL of each; the test has
        // already checked what it needed, this only must not leak.
        if let Err(e) = self.run(&["rm", "--all", "--force", "--time", "0"]) {
            eprintln!("harness: podman rm --all at teardown: {e}");
        }
        let holder = i32::try_from(self.holder.id()).unwrap_or_default();
        for pid in self.processes_in_mount_ns() {
            if pid != holder {
                eprintln!("harness: killing process {pid} left in podman's mount namespace");
                crate::cgroup::kill(pid);
            }
        }
        let _ = self.holder.kill();
        let _ = self.holder.wait();
        for hierarchy in crate::cgroup::hierarchies() {
            crate::cgroup::remove_tree(&hierarchy.join(&self.cgroup_parent));
        }
    }
}

/// `[containers]`, `[network]` and `[engine]` for a confined root podman.
fn containers_conf(root: &Path, plugin_dir: &Path, nofile: u64, nproc: u64) -> String {
    format!(
        r#"[containers]
default_ulimits = ["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]
log_driver = "k8s-file"

[network]
network_backend = "cni"
cni_plugin_dirs = [{plugins}]
network_config_dir = {net_d}

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = {events}
"#,
        plugins = toml_string(plugin_dir),
        net_d = toml_string(&root.join("net.d")),
        events = toml_string(&root.join("events.log")),
    )
}

fn storage_conf(root: &Path) -> String {
    format!(
        "[storage]\ndriver = \"vfs\"\ngraphroot = {}\nrunroot = {}\n",
        toml_string(&root.join("storage")),
        toml_string(&root.join("runroot")),
    )
}

/// A path as a TOML basic string (harness paths need no escapes; refuse any).
fn toml_string(path: &Path) -> String {
    let text = path
        .to_str()
        .unwrap_or_else(|| panic!("{} is not UTF-8", path.display()));
    assert!(
        !text.contains(['"', '\\']) && !text.chars().any(char::is_control),
        "{text} needs escaping in TOML"
    );
    format!("\"{text}\"")
}

/// `(nofile, nproc)` for every container: at most 1024 and 4096, and never
/// above this process's own soft limits.
fn default_ulimits() -> (u64, u64) {
    let soft = |resource| {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes one rlimit into a valid out pointer.
        let rc = unsafe { libc::getrlimit(resource, &raw mut limit) };
        assert_eq!(rc, 0, "getrlimit: {}", std::io::Error::last_os_error());
        limit.rlim_cur
    };
    (
        soft(libc::RLIMIT_NOFILE).min(1024),
        soft(libc::RLIMIT_NPROC).min(4096),
    )
}

/// The arguments of `podman run -d` for [`Podman::run_web`].
pub fn run_web_args(
    name: &str,
    network: &str,
    cgroup_parent: &str,
    ports: &[PortMapping],
) -> Vec<String> {
    assert!(
        !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'),
        "container name {name:?}: letters, digits and dashes only (it goes into a shell line)"
    );
    let mut args: Vec<String> = [
        "run",
        "--detach",
        "--name",
        name,
        "--network",
        network,
        "--cgroup-parent",
        cgroup_parent,
    ]
    .map(str::to_owned)
    .to_vec();
    for port in ports {
        args.push("--publish".to_owned());
        args.push(publish_spec(port));
    }
    // httpd without -f puts itself in the background; the UDP echo is the
    // container's main process. Neither handles SIGTERM: stop with -t 0.
    args.extend([
        IMAGE.to_owned(),
        "/bin/sh".to_owned(),
        "-c".to_owned(),
        format!(
            "mkdir -p /www && echo {name} > /www/index.html && httpd -p 80 -h /www && exec {IMAGE_PROBE} udp-echo-server 53 {name}"
        ),
    ]);
    args
}

/// `[hostIP:]hostPort:containerPort/protocol`, as `podman run -p` takes it.
pub fn publish_spec(port: &PortMapping) -> String {
    let host_ip = match port.host_ip {
        Some(IpAddr::V4(ip)) => format!("{ip}:"),
        Some(IpAddr::V6(ip)) => format!("[{ip}]:"),
        None => String::new(),
    };
    format!(
        "{host_ip}{}:{}/{}",
        port.host_port, port.container_port, port.protocol
    )
}

/// The container in `podman inspect` output (an array of one) on `network`.
pub fn container_info(json: &Value, network: &str) -> Option<ContainerInfo> {
    let [container] = json.as_array()?.as_slice() else {
        return None;
    };
    let on_network = &container["NetworkSettings"]["Networks"][network];
    let address = |key: &str| on_network[key].as_str().filter(|s| !s.is_empty());
    Some(ContainerInfo {
        id: container["Id"].as_str()?.to_owned(),
        name: container["Name"].as_str()?.to_owned(),
        running: container["State"]["Running"].as_bool()?,
        ipv4: address("IPAddress").and_then(|s| s.parse().ok()),
        ipv6: address("GlobalIPv6Address").and_then(|s| s.parse().ok()),
    })
}

/// Copies `binary` to `rootfs/<at>` and every shared library `ldd` names to
/// the same path inside `rootfs` (the loader included).
pub fn install_binary(rootfs: &Path, binary: &Path, at: &Path) {
    let copy = |from: &Path, to: &Path| {
        let target = rootfs.join(to.strip_prefix("/").unwrap_or(to));
        if target.exists() {
            return;
        }
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)
                .unwrap_or_else(|e| panic!("creating {}: {e}", parent.display()));
        }
        // Symlinked library paths are copied as the files they name.
        std::fs::copy(from, &target)
            .unwrap_or_else(|e| panic!("copying {} to {}: {e}", from.display(), target.display()));
    };
    copy(binary, at);
    let out = Command::new("ldd").arg(binary).output().expect("run ldd");
    // A static binary makes ldd fail ("not a dynamic executable"): nothing to add.
    if out.status.success() {
        for library in parse_ldd(&String::from_utf8_lossy(&out.stdout)) {
            copy(&library, &library);
        }
    }
}

/// The absolute paths in `ldd` output (libraries and the loader).
pub fn parse_ldd(text: &str) -> Vec<PathBuf> {
    text.lines()
        .filter_map(|line| {
            let line = line.trim();
            let path = match line.split_once("=>") {
                Some((_, rest)) => rest.split_whitespace().next()?,
                None => line.split_whitespace().next()?,
            };
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect()
}

/// The shell script the holder runs in its new mount namespace; `cgroup2` is
/// the cgroup2 mount the harness uses.
fn holder_script(root: &Path, cgroup2: &Path) -> String {
    let mut script = String::from("set -e\n");
    script.push_str("mount -t tmpfs -o mode=0755 epm-podman-run /run\n");
    script.push_str("mount -t tmpfs -o mode=1777 epm-podman-shm /dev/shm\n");
    for (source, target) in [("var-lib", "/var/lib"), ("var-tmp", "/var/tmp")] {
        let _ = writeln!(
            script,
            "mount --bind '{}' {target}",
            root.join(source).display()
        );
    }
    // The plugin's socket hooks need the cgroup2 mount the harness uses; if
    // that lives under /run (no cgroup2 mount on the machine), mount the same
    // hierarchy again under the new tmpfs.
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

/// Starts the holder and waits until its mounts are in place.
fn spawn_holder(node: &NetNs, root: &Path) -> Child {
    let text = root.to_string_lossy();
    assert!(!text.contains('\''), "{text} contains a single quote");
    let mut command = node.command("unshare");
    command
        .args(["--mount", "--propagation", "private", "--", "/bin/sh", "-c"])
        .arg(holder_script(root, crate::cgroup::cgroup2_mount()))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: prctl is async-signal-safe and touches no memory of ours.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
    let mut holder = command
        .spawn()
        .unwrap_or_else(|e| panic!("starting unshare in netns {}: {e}", node.name()));
    let mut line = String::new();
    let stdout = holder.stdout.take().expect("stdout is piped");
    let _ = BufReader::new(stdout).read_line(&mut line);
    if line.trim() != "ready" {
        let _ = holder.kill();
        let out = holder.wait_with_output();
        panic!(
            "the private mount namespace for podman could not be set up: {:?}",
            out.map(|o| String::from_utf8_lossy(&o.stderr).into_owned())
        );
    }
    holder
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn publish_specs() {
        assert_eq!(publish_spec(&PortMapping::tcp(8080, 80)), "8080:80/tcp");
        assert_eq!(publish_spec(&PortMapping::udp(8053, 53)), "8053:53/udp");
        assert_eq!(
            publish_spec(&PortMapping::tcp(8080, 80).on("198.18.0.1".parse().unwrap())),
            "198.18.0.1:8080:80/tcp"
        );
        assert_eq!(
            publish_spec(&PortMapping::tcp(8080, 80).on("fd18::1".parse().unwrap())),
            "[fd18::1]:8080:80/tcp"
        );
    }

    #[test]
    fn run_arguments() {
        let args = run_web_args(
            "web",
            "net",
            "/pd-podman-1-2",
            &[PortMapping::tcp(8080, 80)],
        );
        assert_eq!(
            args[..10],
            [
                "run",
                "--detach",
                "--name",
                "web",
                "--network",
                "net",
                "--cgroup-parent",
                "/pd-podman-1-2",
                "--publish",
                "8080:80/tcp"
            ]
        );
        assert_eq!(args[10], IMAGE);
        assert!(args[13].ends_with("udp-echo-server 53 web"), "{}", args[13]);
    }

    #[test]
    #[should_panic(expected = "letters, digits and dashes")]
    fn container_names_never_reach_the_shell_unchecked() {
        run_web_args("a;b", "net", "/x", &[]);
    }

    #[test]
    fn inspect_output() {
        let json = json!([{
            "Id": "abc",
            "Name": "web",
            "State": { "Running": true },
            "NetworkSettings": { "Networks": { "net": {
                "IPAddress": "10.244.0.5",
                "GlobalIPv6Address": "fd44::5"
            }}}
        }]);
        assert_eq!(
            container_info(&json, "net"),
            Some(ContainerInfo {
                id: "abc".into(),
                name: "web".into(),
                running: true,
                ipv4: Some("10.244.0.5".parse().unwrap()),
                ipv6: Some("fd44::5".parse().unwrap()),
            })
        );
        let stopped = json!([{
            "Id": "abc", "Name": "web", "State": { "Running": false },
            "NetworkSettings": { "Networks": { "net": { "IPAddress": "", "GlobalIPv6Address": "" }}}
        }]);
        let info = container_info(&stopped, "net").unwrap();
        assert_eq!((info.running, info.ipv4, info.ipv6), (false, None, None));
        assert_eq!(container_info(&json!([]), "net"), None);
    }

    #[test]
    fn ldd_paths() {
        let text = "\tlinux-vdso.so.1 (0x00007ffd)\n\tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x1)\n\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x2)\n\t/lib64/ld-linux-x86-64.so.2 (0x3)\n";
        assert_eq!(
            parse_ldd(text),
            [
                PathBuf::from("/lib/x86_64-linux-gnu/libgcc_s.so.1"),
                PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"),
                PathBuf::from("/lib64/ld-linux-x86-64.so.2"),
            ]
        );
    }

    #[test]
    fn configuration_files() {
        let conf = containers_conf(Path::new("/tmp/p"), Path::new("/tmp/plugins"), 1024, 4096);
        assert!(conf.contains("network_backend = \"cni\""), "{conf}");
        assert!(
            conf.contains("cni_plugin_dirs = [\"/tmp/plugins\"]"),
            "{conf}"
        );
        assert!(
            conf.contains("network_config_dir = \"/tmp/p/net.d\""),
            "{conf}"
        );
        assert!(conf.contains("runtime = \"runc\""), "{conf}");
        assert!(conf.contains("cgroup_manager = \"cgroupfs\""), "{conf}");
        assert!(
            conf.contains("\"nofile=1024:1024\", \"nproc=4096:4096\""),
            "{conf}"
        );
        let storage = storage_conf(Path::new("/tmp/p"));
        assert!(
            storage.contains("graphroot = \"/tmp/p/storage\""),
            "{storage}"
        );
    }

    #[test]
    fn holder_mounts_private_state_dirs() {
        let script = holder_script(Path::new("/tmp/p"), Path::new("/sys/fs/cgroup"));
        assert!(script.starts_with("set -e\n"));
        assert!(script.contains("mount -t tmpfs -o mode=0755 epm-podman-run /run\n"));
        assert!(script.contains("mount --bind '/tmp/p/var-lib' /var/lib\n"));
        assert!(!script.contains("cgroup2"), "{script}");
        assert!(script.ends_with("echo ready\nexec sleep infinity\n"));
        // The harness's own cgroup2 mount would be hidden by the new /run.
        let script = holder_script(Path::new("/tmp/p"), Path::new("/run/epm-test-cgroup2"));
        assert!(
            script.contains("mount -t cgroup2 none '/run/epm-test-cgroup2'"),
            "{script}"
        );
    }
}
