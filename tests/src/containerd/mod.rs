//! A containerd confined to a test's node network namespace, driven
//! through the CRI like a kubelet drives it. Which one is the driver's
//! parameter, [`Runtime`]: Debian 12's containerd 1.6 with its reference
//! plugins 1.1 (the default), or, with `EPM_CONTAINERD_ROOT` naming the
//! directory `cargo xtask setup` unpacks Debian unstable's packages into,
//! containerd 2.x with the plugins 1.9 and `cniVersion` 1.1.0 (STATUS).
//!
//! What [`Containerd::start`] sets up, all of it removed on drop:
//! - a directory `<tmp>/<prefix>-ctrd-<pid>-<n>` holding containerd's
//!   `config.toml`, its root, state, `opt` and runc root, its gRPC socket,
//!   the CNI config directory with the one conflist, the CNI bin directory,
//!   the image and the pods' logs;
//! - in that bin directory, one shell shim per plugin (`bridge`,
//!   `host-local`, `loopback`, `portmap`, `ebpf-portmap`) that records what
//!   containerd sent (the `CNI_*` environment, stdin) and how the plugin
//!   answered (exit code, stdout, stderr) under `calls/`, then returns
//!   exactly that answer. The real binaries are copies in `real/`, so
//!   nothing can ever write through to `/usr/lib/cni`;
//! - the runtime harness's holder ([`crate::runtime::holder`]; propagation
//!   `slave`: mounts of the machine still reach it, none of its own leave
//!   it) with bind mounts of the test directory over `/var/lib`
//!   (containerd, runc, libcni's cache, host-local's leases) and `/var/log`
//!   (ebpf-portmap's default log), and a private bpffs on `/sys/fs/bpf`
//!   (ebpf-portmap's default pin root). containerd runs in both namespaces
//!   of the holder (`nsenter`, a [`crate::runtime::daemon::Daemon`]), so
//!   the conflist needs no key but the ones a user writes, and nothing
//!   lands on the machine;
//! - a cgroup `/<prefix>-ctrd-<pid>-<n>` in every hierarchy: the pods'
//!   `cgroup_parent`; in cgroup2 also its children `containerd` (the daemon
//!   and its shims) and `hooks` (ebpf-portmap's `cgroupPath`, where the
//!   tests' node-side clients run: socket hooks at the root of the hierarchy
//!   would see every process of the machine).
//!
//! Drop stops and removes every pod through the CRI (so the CNI DELs run),
//! uninstalls ebpf-portmap from the private pin root, stops containerd
//! (SIGTERM, then SIGKILL), kills whatever is left in the private mount
//! namespace (found by comparing `/proc/<pid>/ns/mnt`, never by name), the
//! holder, and removes the cgroups and the directory. A run killed outright
//! leaves the cgroup with a dead creator pid: the next run's
//! [`crate::naming::reap_stale`] kills what is in it (the daemon, its shims,
//! the pods) and removes it; the holder and containerd get SIGKILL when
//! their creator thread dies (`PR_SET_PDEATHSIG`).
//!
//! [`Containerd`] is the CRI's [`crate::runtime::Driver`]: the shared
//! end-to-end scenarios run through it.

use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Output};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::cri::{CriClient, CriError, RuntimeCondition};
use crate::netns::NetNs;
use crate::plugins::{PLUGIN_TYPE, plugin_bin};
use crate::runtime::conf_dir::CniConfDir;
use crate::runtime::daemon::Daemon;
use crate::runtime::e2e::operator_output;
use crate::runtime::holder::{HolderSpec, MountNsHolder};
use crate::runtime::recorder::{CniCall, Recorder};
use crate::runtime::rootfs::{build_rootfs, oci_archive, run_tool};
use crate::runtime::{Capability, Driver, Workload};
use crate::tmp::TempDir;
use crate::topology::PortMapping;

mod config;
mod cri_spec;
mod version;

pub use crate::runtime::recorder::short;
pub use config::{
    CONFLIST_FILE, IMAGE, NETWORK, POD_NAMESPACE, config_toml, conflist, loaded_plugin_types,
};
pub use cri_spec::{app_config, cri_port_mapping, pod_ips, sandbox_config};
pub use version::{RUNTIME_ROOT_ENV, Runtime};

/// The upstream plugin's `type`.
pub const UPSTREAM_TYPE: &str = "portmap";
/// The plugins the bin directory offers: the chain, and `loopback`, which
/// the CRI plugin runs for every pod's `lo`.
const REFERENCE_PLUGINS: [&str; 4] = ["bridge", "host-local", "loopback", UPSTREAM_TYPE];
/// How long containerd may take to serve the CRI, or to load a new conflist.
const READY: Duration = Duration::from_secs(30);
/// The `kind` in the names of the directory and the cgroup.
const KIND: &str = "ctrd";
/// The cgroup2 children of the test cgroup (see the module docs).
const DAEMON_CGROUP: &str = "containerd";
const HOOKS_CGROUP: &str = "hooks";
/// containerd's private mount namespace.
const HOLDER: HolderSpec = HolderSpec {
    tag: "epm-ctrd",
    propagation: "slave",
    binds: &[("var-lib", "/var/lib"), ("var-log", "/var/log")],
    private_bpffs: true,
};
/// A 10-line `pause` for the sandbox: sleeps until a signal, exits on TERM/INT.
const PAUSE_C: &str = include_str!("pause.c");

/// A pod the test started: its sandbox, its app container, its addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pod {
    pub name: String,
    /// The pod's UID (`K8S_POD_UID` in `CNI_ARGS`).
    pub uid: String,
    pub sandbox_id: String,
    pub container_id: String,
    pub ipv4: Ipv4Addr,
    pub ipv6: Ipv6Addr,
}

/// A containerd confined to a node namespace (see the module docs).
#[derive(Debug)]
pub struct Containerd {
    client: Option<CriClient>,
    daemon: Option<Daemon>,
    holder: MountNsHolder,
    conf: CniConfDir,
    /// The CNI bin directory (`bin/`): every plugin call is recorded.
    recorder: Recorder,
    /// The directory's name: also the name of the test cgroup.
    name: String,
    runtime: Runtime,
    /// What the CRI's `Version` says (`1.6.20~ds1`, `v2.1.9+unknown`).
    runtime_version: String,
    /// What a fresh bpffs holds before anything is pinned (the kernel's
    /// `maps.debug` and `progs.debug` where bpf_preload is built in).
    fresh_bpffs: Vec<PathBuf>,
    dir: TempDir,
}

impl Containerd {
    /// Sets everything up (see the module docs) with a conflist whose
    /// port-mapping plugin is `port_plugin_type` (`ebpf-portmap` or
    /// `portmap`), starts containerd inside `node` and imports the image
    /// (with `probe`, the test's connection tester, in it). Call it from the
    /// test's own thread: the holder and the daemon are killed when the
    /// thread that started them exits.
    ///
    /// # Panics
    /// If any step fails; whatever was already set up is removed.
    pub fn start(
        node: &NetNs,
        runtime: &Runtime,
        port_plugin_type: &str,
        probe: &Path,
    ) -> Containerd {
        let dir = TempDir::new(KIND);
        let root = dir.path().to_path_buf();
        let name = root
            .file_name()
            .and_then(|n| n.to_str())
            .expect("a harness temp dir has a UTF-8 name")
            .to_owned();
        for sub in [
            "real", "root", "state", "opt", "runc", "var-lib", "var-log", "logs", "image",
        ] {
            create_dir(&root.join(sub));
        }
        let recorder = install_plugins(&root, runtime);
        let holder = MountNsHolder::spawn(node, &root, &HOLDER);
        let mut containerd = Containerd {
            client: None,
            daemon: None,
            holder,
            conf: CniConfDir::new(root.join("net.d"), CONFLIST_FILE),
            recorder,
            name,
            runtime: runtime.clone(),
            runtime_version: String::new(),
            fresh_bpffs: Vec::new(),
            dir,
        };
        containerd.fresh_bpffs = containerd.bpffs_files();
        // From here on, drop removes the cgroups (and what runs in them).
        let cgroup2 = crate::cgroup::cgroup2_mount().join(&containerd.name);
        create_dir(&cgroup2.join(DAEMON_CGROUP));
        create_dir(&cgroup2.join(HOOKS_CGROUP));
        containerd.write_conflist(port_plugin_type);
        write_file(&root.join("config.toml"), &config_toml(&root));
        let image = containerd.build_image(probe);
        containerd.start_daemon();
        containerd.import_image(&image);
        containerd.wait_network_ready();
        containerd
    }

    /// The test directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The containerd and plugins under test.
    pub fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    /// containerd's version as its CRI reports it.
    pub fn runtime_version(&self) -> &str {
        &self.runtime_version
    }

    /// The CRI client.
    pub fn cri(&self) -> &CriClient {
        self.client
            .as_ref()
            .expect("the CRI client lives until teardown")
    }

    /// The cgroup2 directory ebpf-portmap's socket hooks attach to
    /// (`cgroupPath`): node-side clients must run in it.
    pub fn hooks_cgroup(&self) -> PathBuf {
        crate::cgroup::cgroup2_mount()
            .join(&self.name)
            .join(HOOKS_CGROUP)
    }

    /// `cgroup_parent` of every pod.
    pub fn cgroup_parent(&self) -> String {
        format!("/{}", self.name)
    }

    /// The conflist for `port_plugin_type` (see [`conflist`]).
    pub fn conflist(&self, port_plugin_type: &str) -> Value {
        conflist(
            port_plugin_type,
            &self.hooks_cgroup(),
            self.runtime.cni_version,
        )
    }

    /// Replaces the conflist on disk (atomically, as a config manager
    /// would) with one whose port-mapping plugin is `port_plugin_type`, and
    /// waits until containerd has loaded it: every CNI call from then on,
    /// DEL of older pods included, goes to that plugin.
    ///
    /// # Panics
    /// If containerd does not load it within 30 s.
    pub fn switch_port_plugin(&self, port_plugin_type: &str) {
        self.write_conflist(port_plugin_type);
        let deadline = Instant::now() + READY;
        loop {
            let loaded = self.loaded_plugin_types();
            if loaded
                .as_ref()
                .is_ok_and(|types| types.iter().any(|t| t == port_plugin_type))
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "containerd did not load the conflist with {port_plugin_type} within {READY:?}: loaded {loaded:?}\n{}",
                self.diagnostics()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Replaces the conflist with ours carrying `keys` (merged into the
    /// port-mapping plugin's entry, e.g. upstream's `conditionsV4`), and
    /// waits until containerd has loaded it (its verbose `Status` shows
    /// every key).
    ///
    /// # Panics
    /// If containerd does not load it within 30 s.
    pub fn set_port_plugin_keys(&self, keys: &Value) {
        let mut conflist = self.conflist(PLUGIN_TYPE);
        let plugins = conflist["plugins"]
            .as_array_mut()
            .expect("the conflist has plugins");
        let port_plugin = plugins.last_mut().expect("the port plugin is last");
        for (key, value) in keys.as_object().expect("keys is an object") {
            port_plugin[key] = value.clone();
        }
        self.write_conflist_value(&conflist);
        let deadline = Instant::now() + READY;
        loop {
            let loaded = self.cri().status(true).map(|status| {
                status.info.get("cniconfig").is_some_and(|text| {
                    keys.as_object()
                        .into_iter()
                        .flatten()
                        .all(|(key, _)| text.contains(key.as_str()))
                })
            });
            if loaded.as_ref().is_ok_and(|done| *done) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "containerd did not load the conflist with {keys} within {READY:?}: {loaded:?}\n{}",
                self.diagnostics()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The plugin types of the networks containerd has loaded, as its
    /// verbose CRI `Status` reports them (`cniconfig`).
    pub fn loaded_plugin_types(&self) -> Result<Vec<String>, String> {
        let status = self.cri().status(true).map_err(|e| e.to_string())?;
        let text = status
            .info
            .get("cniconfig")
            .ok_or_else(|| format!("no cniconfig in {:?}", status.info.keys()))?;
        let config: Value = serde_json::from_str(text).map_err(|e| format!("{e}: {text}"))?;
        Ok(loaded_plugin_types(&config))
    }

    /// Runs a pod the way the kubelet does: RunPodSandbox with `ports` as
    /// its port mappings (containerd runs the CNI ADD), then CreateContainer
    /// and StartContainer of an app serving HTTP on 80 (the body is `name`)
    /// and the UDP echo on 53 (answers are prefixed with `name`).
    pub fn run_pod(&self, name: &str, ports: &[PortMapping]) -> Result<Pod, CriError> {
        static UID: AtomicU64 = AtomicU64::new(0);
        let uid = format!("{name}-uid-{}", UID.fetch_add(1, Ordering::Relaxed));
        self.run_pod_as(name, &uid, ports)
    }

    /// [`Containerd::run_pod`] with the pod's UID given: a pod recreated
    /// under the same name (a StatefulSet's, a static pod) has a new UID,
    /// and a kubelet retrying a failed RunPodSandbox sends the same one.
    pub fn run_pod_as(
        &self,
        name: &str,
        uid: &str,
        ports: &[PortMapping],
    ) -> Result<Pod, CriError> {
        let sandbox = sandbox_config(
            name,
            uid,
            &self.dir.path().join("logs").join(uid),
            &self.cgroup_parent(),
            ports,
        );
        let sandbox_id = self.cri().run_pod_sandbox(sandbox.clone())?;
        let container_id =
            self.cri()
                .create_container(&sandbox_id, app_config(name), sandbox.clone())?;
        self.cri().start_container(&container_id)?;
        let status = self.cri().pod_sandbox_status(&sandbox_id)?;
        let ips = pod_ips(&status);
        let ipv4 = ips.iter().find_map(|ip| match ip {
            IpAddr::V4(ip) => Some(*ip),
            IpAddr::V6(_) => None,
        });
        let ipv6 = ips.iter().find_map(|ip| match ip {
            IpAddr::V6(ip) => Some(*ip),
            IpAddr::V4(_) => None,
        });
        let (Some(ipv4), Some(ipv6)) = (ipv4, ipv6) else {
            panic!(
                "pod {name} ({sandbox_id}) must have an address of each family on the dual-stack network: {status:?}\n{}",
                self.diagnostics()
            );
        };
        Ok(Pod {
            name: name.to_owned(),
            uid: uid.to_owned(),
            sandbox_id,
            container_id,
            ipv4,
            ipv6,
        })
    }

    /// RunPodSandbox alone (no app container): the sandbox's ID once its
    /// network is set up.
    pub fn run_sandbox(&self, name: &str, ports: &[PortMapping]) -> Result<String, CriError> {
        let uid = format!("{name}-uid");
        let sandbox = sandbox_config(
            name,
            &uid,
            &self.dir.path().join("logs").join(&uid),
            &self.cgroup_parent(),
            ports,
        );
        self.cri().run_pod_sandbox(sandbox)
    }

    /// Every plugin execution recorded so far, oldest first.
    pub fn calls(&self) -> Vec<CniCall> {
        self.recorder.calls()
    }

    /// The executions of `plugin` running `command` for `sandbox_id`.
    pub fn calls_of(&self, plugin: &str, command: &str, sandbox_id: &str) -> Vec<CniCall> {
        self.calls()
            .into_iter()
            .filter(|c| c.plugin == plugin && c.command == command && c.container_id == sandbox_id)
            .collect()
    }

    /// A command run in the node's network namespace and the private mount
    /// namespace (where containerd runs and ebpf-portmap's pins live).
    pub fn node_command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        self.holder.command(program)
    }

    /// `ebpf-portmap args...` on the node, as an operator runs it there.
    pub fn operator(&self, args: &[&str]) -> Output {
        self.node_command(plugin_bin())
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("running ebpf-portmap {}: {e}", args.join(" ")))
    }

    /// `ebpf-portmap <verb> --json` on the node; the verb must succeed.
    pub fn operator_json(&self, verb: &str) -> Value {
        operator_output(verb, &self.operator(&[verb, "--json"])).unwrap_or_else(|e| panic!("{e}"))
    }

    /// `<path>` as the node's mount namespace sees it (through the holder's
    /// `/proc/<pid>/root`).
    pub fn node_path(&self, path: &str) -> PathBuf {
        self.holder.node_path(path)
    }

    /// Every pin on the node's private bpffs, relative to it, sorted: the
    /// files that were not there when it was mounted.
    pub fn pins(&self) -> Vec<PathBuf> {
        let mut pins = self.bpffs_files();
        pins.retain(|file| !self.fresh_bpffs.contains(file));
        pins
    }

    fn bpffs_files(&self) -> Vec<PathBuf> {
        let root = self.node_path(crate::bpffs::BPFFS_MOUNT);
        let mut files = Vec::new();
        walk_files(&root, &root, &mut files);
        files.sort();
        files
    }

    /// Whether ebpf-portmap has pinned its maps on the node (its first ADD
    /// with host ports does).
    pub fn ours_installed(&self) -> bool {
        self.node_path(&format!(
            "{}/ebpf-portmap/v1/maps",
            crate::bpffs::BPFFS_MOUNT
        ))
        .exists()
    }

    /// ebpf-portmap's log (its default `logFile`, in the private `/var/log`).
    pub fn plugin_log(&self) -> String {
        std::fs::read_to_string(self.node_path("/var/log/ebpf-portmap.log")).unwrap_or_default()
    }

    /// Processes in the private mount namespace other than the holder:
    /// `(pid, comm)`.
    pub fn processes(&self) -> Vec<(i32, String)> {
        self.holder.processes()
    }

    /// Cgroups of pods still under the test cgroup, in any hierarchy.
    pub fn pod_cgroups(&self) -> Vec<PathBuf> {
        let mut left = Vec::new();
        for hierarchy in crate::cgroup::hierarchies() {
            let Ok(entries) = std::fs::read_dir(hierarchy.join(&self.name)) else {
                continue;
            };
            left.extend(
                entries
                    .flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .filter(|e| e.file_name() != DAEMON_CGROUP && e.file_name() != HOOKS_CGROUP)
                    .map(|e| e.path()),
            );
        }
        left.sort();
        left
    }

    /// Stops containerd: SIGTERM, then SIGKILL after 10 s. Its exit status
    /// (`None` if it was stopped before).
    pub fn stop_daemon(&mut self) -> Option<ExitStatus> {
        self.client = None;
        self.daemon.take()?.stop(Duration::from_secs(10))
    }

    /// Best-effort state for failure messages: sandboxes, the calls, the
    /// tails of containerd's and ebpf-portmap's logs. Never panics.
    pub fn diagnostics(&self) -> String {
        let mut report = String::from("--- CRI sandboxes\n");
        match self.client.as_ref().map(CriClient::list_pod_sandboxes) {
            Some(Ok(pods)) => {
                for pod in pods {
                    let name = pod.metadata.map(|m| m.name).unwrap_or_default();
                    let _ = writeln!(report, "{} {name} state={}", pod.id, pod.state);
                }
            }
            Some(Err(e)) => {
                let _ = writeln!(report, "{e}");
            }
            None => report.push_str("(containerd stopped)\n"),
        }
        report.push_str("--- CNI calls (oldest first)\n");
        for call in self.calls() {
            let _ = writeln!(report, "{}", call.summary());
        }
        for (title, text) in [
            (
                "containerd log",
                std::fs::read_to_string(self.dir.path().join("containerd.log")).unwrap_or_default(),
            ),
            ("ebpf-portmap log", self.plugin_log()),
        ] {
            let lines: Vec<&str> = text.lines().collect();
            let tail = &lines[lines.len().saturating_sub(25)..];
            let _ = writeln!(report, "--- {title} (last {})", tail.len());
            for line in tail {
                report.push_str(line);
                report.push('\n');
            }
        }
        report
    }

    // ---- setup --------------------------------------------------------------

    fn write_conflist(&self, port_plugin_type: &str) {
        self.write_conflist_value(&self.conflist(port_plugin_type));
    }

    fn write_conflist_value(&self, conflist: &Value) {
        self.conf.write(conflist);
    }

    /// Builds the image as an OCI image-layout archive (one uncompressed
    /// layer: a static `pause` compiled here, busybox, `probe` with its
    /// shared libraries); returns the archive's path.
    fn build_image(&self, probe: &Path) -> PathBuf {
        let image = self.dir.path().join("image");
        let rootfs = image.join("rootfs");
        build_rootfs(&rootfs, probe);
        let source = image.join("pause.c");
        write_file(&source, PAUSE_C);
        run_tool(
            Command::new("gcc")
                .args(["-static", "-Os", "-o"])
                .arg(rootfs.join("pause"))
                .arg(&source),
        );
        oci_archive(&image, &rootfs, IMAGE, "/pause")
    }

    /// Starts containerd in the holder's namespaces and waits until it
    /// serves the CRI.
    fn start_daemon(&mut self) {
        let root = self.dir.path().to_path_buf();
        let mut command = self.node_command(self.runtime.bin_dir.join("containerd"));
        // containerd finds its shim (`containerd-shim-runc-v2`) on PATH.
        let path = std::env::join_paths(std::iter::once(self.runtime.bin_dir.clone()).chain(
            std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
        ))
        .expect("PATH entries without ':'");
        command
            .env("PATH", path)
            .arg("--config")
            .arg(root.join("config.toml"));
        let procs = crate::cgroup::cgroup2_mount()
            .join(&self.name)
            .join(DAEMON_CGROUP)
            .join("cgroup.procs");
        self.daemon = Some(Daemon::spawn(
            "containerd",
            command,
            &root.join("containerd.log"),
            procs,
        ));
        let socket = root.join("containerd.sock");
        let deadline = Instant::now() + READY;
        let mut last = String::from("no socket yet");
        while Instant::now() < deadline {
            if let Some(status) = self.daemon.as_mut().and_then(Daemon::exited) {
                panic!(
                    "containerd exited at start ({status})\n{}",
                    self.diagnostics()
                );
            }
            if socket.exists() {
                match CriClient::connect(&socket).and_then(|c| c.version().map(|v| (c, v))) {
                    Ok((client, version)) => {
                        eprintln!(
                            "harness: {} {} serves CRI {} at {}",
                            version.runtime_name,
                            version.runtime_version,
                            version.runtime_api_version,
                            socket.display()
                        );
                        self.runtime_version = version.runtime_version;
                        self.client = Some(client);
                        return;
                    }
                    Err(e) => last = e.to_string(),
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "containerd did not serve the CRI within {READY:?}: {last}\n{}",
            self.diagnostics()
        );
    }

    fn import_image(&self, archive: &Path) {
        let socket = self.dir.path().join("containerd.sock");
        run_tool(
            Command::new(self.runtime.bin_dir.join("ctr"))
                .arg("--address")
                .arg(&socket)
                .args(["--namespace", "k8s.io", "images", "import"])
                .arg(archive),
        );
    }

    /// The `NetworkReady` condition of a CRI `Status` (one request: with a
    /// `cniVersion` 1.1.0 list, containerd 2.x asks every plugin for STATUS
    /// to answer it).
    pub fn network_condition(&self) -> Result<RuntimeCondition, String> {
        let status = self.cri().status(false).map_err(|e| e.to_string())?;
        status
            .status
            .iter()
            .flat_map(|s| &s.conditions)
            .find(|c| c.r#type == "NetworkReady")
            .cloned()
            .ok_or_else(|| format!("no NetworkReady condition in {status:?}"))
    }

    /// Polls [`Containerd::network_condition`] until its status is `ready`;
    /// the condition then.
    ///
    /// # Panics
    /// If it is not within 30 s.
    pub fn wait_network_ready_is(&self, ready: bool) -> RuntimeCondition {
        let deadline = Instant::now() + READY;
        loop {
            let condition = self.network_condition();
            if let Ok(condition) = &condition
                && condition.status == ready
            {
                return condition.clone();
            }
            assert!(
                Instant::now() < deadline,
                "NetworkReady is not {ready} after {READY:?}: {condition:?}\n{}",
                self.diagnostics()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until the CRI reports `NetworkReady` (the conflist is loaded).
    fn wait_network_ready(&self) {
        let deadline = Instant::now() + READY;
        loop {
            let status = self.cri().status(false);
            let ready = status.as_ref().is_ok_and(|s| {
                s.status.as_ref().is_some_and(|s| {
                    s.conditions
                        .iter()
                        .any(|c| c.r#type == "NetworkReady" && c.status)
                })
            });
            if ready {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "containerd's network is not ready after {READY:?}: {status:?}\n{}",
                self.diagnostics()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Workload for Pod {
    fn name(&self) -> &str {
        &self.name
    }

    /// The sandbox: what containerd runs the CNI plugins for.
    fn cni_id(&self) -> &str {
        &self.sandbox_id
    }

    fn ipv4(&self) -> Ipv4Addr {
        self.ipv4
    }

    fn ipv6(&self) -> Ipv6Addr {
        self.ipv6
    }
}

impl Driver for Containerd {
    type Workload = Pod;

    fn describe(&self) -> String {
        format!("containerd {}", self.runtime_version)
    }

    fn start(&self, name: &str, ports: &[PortMapping]) -> Result<Pod, String> {
        self.run_pod(name, ports).map_err(|e| e.to_string())
    }

    /// StopPodSandbox, then RemovePodSandbox: a DEL each.
    fn remove(&self, pod: &Pod) -> Result<(), String> {
        let cri = self.cri();
        cri.stop_pod_sandbox(&pod.sandbox_id)
            .and_then(|()| cri.remove_pod_sandbox(&pod.sandbox_id))
            .map_err(|e| e.to_string())
    }

    fn dels_per_remove(&self) -> usize {
        2
    }

    fn recorder(&self) -> &Recorder {
        &self.recorder
    }

    fn supports(&self, capability: Capability) -> bool {
        match capability {
            Capability::CniStatus => self.runtime.sends_status(),
        }
    }

    fn set_port_plugin_keys(&self, keys: &Value) -> Result<(), String> {
        Containerd::set_port_plugin_keys(self, keys);
        Ok(())
    }

    fn operator_json(&self, verb: &str) -> Result<Option<Value>, String> {
        // Nothing is pinned before the first ADD of ours.
        if !self.ours_installed() {
            return Ok(None);
        }
        operator_output(verb, &self.operator(&[verb, "--json"])).map(Some)
    }

    fn hooks_procs(&self) -> PathBuf {
        self.hooks_cgroup().join("cgroup.procs")
    }

    fn diagnostics(&self) -> String {
        Containerd::diagnostics(self)
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        // Removing the pods runs their CNI DELs while plugins, pins and
        // namespaces still exist; the test has checked what it needed.
        if let Some(client) = &self.client {
            match client.list_pod_sandboxes() {
                Ok(pods) => {
                    for pod in pods {
                        let outcome = client
                            .stop_pod_sandbox(&pod.id)
                            .and_then(|()| client.remove_pod_sandbox(&pod.id));
                        if let Err(e) = outcome {
                            eprintln!("harness: removing pod {} at teardown: {e}", pod.id);
                        }
                    }
                }
                Err(e) => eprintln!("harness: listing pods at teardown: {e}"),
            }
        }
        if self
            .node_path(&format!("{}/ebpf-portmap", crate::bpffs::BPFFS_MOUNT))
            .exists()
        {
            let out = self.operator(&["uninstall", "--force"]);
            if !out.status.success() {
                eprintln!(
                    "harness: ebpf-portmap uninstall at teardown ({}): {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            }
        }
        self.stop_daemon();
        self.holder.kill_leftovers("containerd");
        for hierarchy in crate::cgroup::hierarchies() {
            crate::cgroup::remove_tree(&hierarchy.join(&self.name));
        }
    }
}

/// Copies the real plugins into `root/real/` (nothing can then write
/// through to the machine's) and puts a recording shim for each into
/// `root/bin/`, containerd's CNI bin directory.
fn install_plugins(root: &Path, runtime: &Runtime) -> Recorder {
    let mut plugins: Vec<(String, PathBuf)> = REFERENCE_PLUGINS
        .iter()
        .map(|name| (name.to_string(), runtime.plugin_dir.join(name)))
        .collect();
    plugins.push((PLUGIN_TYPE.to_owned(), plugin_bin()));
    let mut copies = Vec::new();
    for (name, source) in plugins {
        let real = root.join("real").join(&name);
        std::fs::copy(&source, &real).unwrap_or_else(|e| {
            panic!(
                "copying {} to {}: {e} (`cargo xtask e2e-containerd` installs and builds what is missing)",
                source.display(),
                real.display()
            )
        });
        copies.push((name, real));
    }
    Recorder::install(
        root,
        copies
            .iter()
            .map(|(name, real)| (name.as_str(), real.as_path())),
    )
}

fn walk_files(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            walk_files(root, &path, out);
        } else if let Ok(relative) = path.strip_prefix(root) {
            out.push(relative.to_path_buf());
        }
    }
}

fn create_dir(path: &Path) {
    std::fs::create_dir_all(path).unwrap_or_else(|e| panic!("creating {}: {e}", path.display()));
}

fn write_file(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
}
