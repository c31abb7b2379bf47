//! Podman (Debian's 4.3, `network_backend = "cni"`) confined to a test's node
//! network namespace, driving a conflist the test writes.
//!
//! What [`Podman::start`] sets up, all of it removed on drop:
//! - a directory `<tmp>/<prefix>-podman-<pid>-<n>` holding podman's own
//!   `containers.conf`, `storage.conf` (vfs: no mounts to leak) and an empty
//!   `registries.conf` (named by `CONTAINERS_CONF`,
//!   `CONTAINERS_STORAGE_CONF` and `CONTAINERS_REGISTRIES_CONF`), its CNI
//!   config directory with the test's conflist, its storage and event log;
//! - the runtime harness's holder ([`crate::runtime::holder`]) with bind
//!   mounts of the test directory over `/var/lib` and `/var/tmp`, where
//!   podman, runc and libcni keep state (`/run/netns`, `/run/runc`,
//!   `/run/libpod`, shm locks, `/var/lib/cni`). Every podman command enters
//!   both namespaces of the holder with `nsenter`;
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
//!
//! [`PodmanDriver`] is podman's [`crate::runtime::Driver`]: the shared
//! end-to-end scenarios run through it.

use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::cni::Conflist;
use crate::netns::{NetNs, NsHandle};
use crate::pin_root::PinRoot;
use crate::plugins::{PluginDirs, plugin_bin};
use crate::runtime::conf_dir::{CniConfDir, toml_string};
use crate::runtime::e2e::operator_output;
use crate::runtime::holder::{HolderSpec, MountNsHolder};
use crate::runtime::recorder::{CniCall, Recorder};
use crate::runtime::rootfs::{IMAGE_PROBE, build_rootfs, tar_dir};
use crate::runtime::{Capability, Driver, PortPlugin, Workload};
use crate::tmp::TempDir;
use crate::topology::{Node, PortMapping, bridge_conflist};

/// The image [`Podman::import_image`] makes.
pub const IMAGE: &str = "localhost/epm-e2e:latest";
/// How long one podman command may take before it is killed.
pub const PODMAN_TIMEOUT: Duration = Duration::from_secs(120);
/// The `kind` in the names of the directory and the cgroup parent.
const KIND: &str = "podman";
/// podman's private mount namespace.
const HOLDER: HolderSpec = HolderSpec {
    tag: "epm-podman",
    propagation: "private",
    binds: &[("var-lib", "/var/lib"), ("var-tmp", "/var/tmp")],
    private_bpffs: false,
};

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
    /// Every process podman starts in its mount namespace (conmon, runc)
    /// is ours.
    holder: MountNsHolder,
    cgroup_parent: String,
    network: String,
    /// The CNI config directory with the one conflist.
    conf: CniConfDir,
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
        for sub in ["storage", "runroot", "var-lib", "var-tmp", "image"] {
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
        let conf = CniConfDir::new(root.join("net.d"), &format!("{network}.conflist"));
        conf.write(conflist.json());
        // The cgroup parent's name: the directory's own name, so that both
        // carry the creator's pid for the stale sweep.
        let cgroup_parent = root
            .file_name()
            .and_then(|n| n.to_str())
            .expect("a harness temp dir has a UTF-8 name")
            .to_owned();
        debug_assert!(cgroup_parent.contains(&format!("-{KIND}-")));
        let holder = MountNsHolder::spawn(node, root, &HOLDER);
        Podman {
            holder,
            cgroup_parent,
            network,
            conf,
            dir,
        }
    }

    /// The test directory (configuration, storage, event log).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Replaces the conflist (atomically). Every podman command reads it
    /// anew: the next `podman run` uses it.
    pub fn write_conflist(&self, conflist: &Conflist) {
        self.conf.write(conflist.json());
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
            .args(self.holder.nsenter_args())
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
        build_rootfs(&rootfs, probe);
        let tarball = self.dir.path().join("image/rootfs.tar");
        tar_dir(&rootfs, &tarball);
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
}

impl Drop for Podman {
    fn drop(&mut self) {
        // Removing the containers runs the CNI DEL of each; the test has
        // already checked what it needed, this only must not leak.
        if let Err(e) = self.run(&["rm", "--all", "--force", "--time", "0"]) {
            eprintln!("harness: podman rm --all at teardown: {e}");
        }
        self.holder.kill_leftovers("podman");
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
    // httpd without -f puts itself in the background (on 80, and on TCP 53
    // beside the UDP echo: one port for both protocols, as a DNS server's;
    // `/` and `/hostname` answer the name); the UDP echo is the container's
    // main process. Neither handles SIGTERM: stop with -t 0.
    args.extend([
        IMAGE.to_owned(),
        "/bin/sh".to_owned(),
        "-c".to_owned(),
        format!(
            "mkdir -p /www && echo {name} > /www/index.html && echo {name} > /www/hostname && httpd -p 80 -h /www && httpd -p 53 -h /www && exec {IMAGE_PROBE} udp-echo-server 53 {name}"
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

/// podman's [`Driver`]: a [`Podman`] on the node with the bridge conflist
/// whose port-mapping plugin is `plugin`, traced plugin shims (evidence the
/// plugin really ran: podman drops a network whose plugin it cannot find
/// with only a warning) and ebpf-portmap's own pin root, cgroup and log.
/// Field order is drop order: podman first (removing its containers runs
/// the CNI DELs while the plugins and the pin root still exist).
#[derive(Debug)]
pub struct PodmanDriver {
    pub podman: Podman,
    pub plugins: PluginDirs,
    pub pins: PinRoot,
    pub plugin: PortPlugin,
    /// The conflist podman was started with.
    conflist: Conflist,
    node: NsHandle,
    data_dir: PathBuf,
}

impl PodmanDriver {
    /// The conflist's network (podman's config is private).
    pub const NETWORK: &str = "epm-e2e";

    /// Starts podman in `node` with `plugin` in the conflist, its entry
    /// changed by `edit` (e.g. `fastPath`), and imports the image with
    /// `probe` in it.
    pub fn start(
        node: &Node,
        plugin: PortPlugin,
        edit: impl FnOnce(&mut serde_json::Map<String, Value>),
        probe: &Path,
    ) -> PodmanDriver {
        let pins = PinRoot::new();
        let plugins = PluginDirs::traced();
        let conflist = bridge_conflist(
            Self::NETWORK,
            plugin.plugin_type(),
            Some(pins.path()),
            node.data_dir(),
        );
        let mut json = conflist.json().clone();
        edit(
            json["plugins"][1]
                .as_object_mut()
                .expect("the plugin's entry"),
        );
        let conflist = Conflist::from_json(json).expect("conflist");
        let podman = Podman::start(&node.ns, plugins.path(), &conflist);
        podman.import_image(probe);
        PodmanDriver {
            podman,
            plugins,
            pins,
            plugin,
            conflist,
            node: node.ns.handle(),
            data_dir: node.data_dir().to_path_buf(),
        }
    }

    /// `podman args...`, which must succeed.
    pub fn podman(&self, args: &[&str]) -> String {
        self.podman
            .run(args)
            .unwrap_or_else(|e| panic!("{e}\n{}", self.diagnostics()))
    }

    /// The running container `name` with an IPv4 and an IPv6 address.
    pub fn inspect(&self, name: &str) -> Result<ContainerInfo, String> {
        let info = self.podman.inspect(name);
        if info.running && info.ipv4.is_some() && info.ipv6.is_some() {
            Ok(info)
        } else {
            Err(format!(
                "{name} must be running with an address of each family on the dual-stack network: {info:?}"
            ))
        }
    }
}

impl Workload for ContainerInfo {
    fn name(&self) -> &str {
        &self.name
    }

    fn cni_id(&self) -> &str {
        &self.id
    }

    fn ipv4(&self) -> Ipv4Addr {
        self.ipv4
            .expect("a running container on the dual-stack network has an IPv4 address")
    }

    fn ipv6(&self) -> Ipv6Addr {
        self.ipv6
            .expect("a running container on the dual-stack network has an IPv6 address")
    }
}

impl Driver for PodmanDriver {
    type Workload = ContainerInfo;

    fn describe(&self) -> String {
        "podman".to_owned()
    }

    fn start(&self, name: &str, ports: &[PortMapping]) -> Result<ContainerInfo, String> {
        let id = self
            .podman
            .run_web(name, ports)
            .map_err(|e| e.to_string())?;
        let info = self.inspect(name)?;
        if info.id != id {
            return Err(format!("podman run printed {id}, inspect shows {info:?}"));
        }
        Ok(info)
    }

    fn remove(&self, container: &ContainerInfo) -> Result<(), String> {
        self.podman
            .run(&["rm", "--force", "--time", "0", &container.name])
            .map(drop)
            .map_err(|e| e.to_string())
    }

    fn dels_per_remove(&self) -> usize {
        1
    }

    fn recorder(&self) -> &Recorder {
        self.plugins
            .recorder()
            .expect("the driver's plugin directory is traced")
    }

    fn supports(&self, capability: Capability) -> bool {
        match capability {
            // podman 4.3's CNI backend runs libcni with the conflist's
            // `cniVersion` and never asks for STATUS.
            Capability::CniStatus => false,
        }
    }

    fn set_port_plugin_keys(&self, keys: &Value) -> Result<(), String> {
        let mut json = self.conflist.json().clone();
        let entry = json["plugins"]
            .as_array_mut()
            .and_then(|plugins| plugins.last_mut())
            .and_then(Value::as_object_mut)
            .ok_or_else(|| format!("no port-mapping plugin in {}", self.conflist.json()))?;
        let keys = keys
            .as_object()
            .ok_or_else(|| format!("conflist keys must be an object: {keys}"))?;
        for (key, value) in keys {
            entry.insert(key.clone(), value.clone());
        }
        let conflist = Conflist::from_json(json).map_err(|e| e.to_string())?;
        self.podman.write_conflist(&conflist);
        Ok(())
    }

    fn operator_json(&self, verb: &str) -> Result<Option<Value>, String> {
        // Nothing is pinned before the first ADD of ours.
        if !self.pins.path().join("v1/maps").exists() {
            return Ok(None);
        }
        let out = self
            .node
            .command(plugin_bin())
            .args([verb, "--json", "--pin-root"])
            .arg(self.pins.path())
            .output()
            .map_err(|e| format!("running ebpf-portmap {verb}: {e}"))?;
        operator_output(verb, &out).map(Some)
    }

    fn hooks_procs(&self) -> PathBuf {
        self.pins.cgroup().procs_file()
    }

    fn diagnostics(&self) -> String {
        let log = std::fs::read_to_string(self.data_dir.join(crate::topology::PLUGIN_LOG))
            .unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(30).collect();
        let trace: Vec<String> = self
            .plugins
            .trace()
            .iter()
            .filter(|e| e.command != "VERSION")
            .map(CniCall::summary)
            .collect();
        format!(
            "{}--- plugin log (newest first)\n{}\n--- plugin executions\n{}\n",
            self.podman.diagnostics(),
            tail.join("\n"),
            trace.join("\n"),
        )
    }
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
}
