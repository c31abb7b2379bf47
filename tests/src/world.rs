//! A node with ebpf-portmap in its conflist, and the checks most tests of
//! the plugin need: map dumps through bpftool (named fields, from BTF), the
//! operator's `list`, probes that dump the node's state when they fail, and
//! direct invocations of our plugin alone (the way a runtime re-runs one
//! plugin of a chain).

#![allow(
    clippy::result_large_err,
    reason = "CniFailure carries the whole plugin exchange on purpose (see cni.rs)"
)]

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::cni::{CniCommand, CniFailure, PluginOutput, plugin_config};
use crate::traffic::ProbeError;
use crate::{
    CniRunner, Conflist, Container, Node, PinRoot, PluginDirs, PortMapping, RuntimeAttachment,
    bridge_conflist, plugin_bin, ptp_conflist,
};

/// Long enough for a working path, short enough to fail fast.
pub const PROBE: Duration = Duration::from_secs(5);
/// How long to wait for an answer that must not come.
pub const GONE: Duration = Duration::from_millis(700);

/// The maps that hold ownership state, in dump order.
pub const STATE_MAPS: [&str; 3] = ["mappings", "owners", "owner_slots"];

/// Pod identity by owner, made by the first ADD that names a pod.
pub const POD_MAP: &str = "owner_pods";

/// `ebpf-portmap <verb> --json --pin-root <pins>` as an operator runs it
/// in the node namespace `ns`; the verb must succeed and print JSON.
pub fn operator_json(ns: &crate::NetNs, pins: &Path, verb: &str) -> Value {
    let out = ns
        .command(plugin_bin())
        .args([verb, "--json", "--pin-root"])
        .arg(pins)
        .output()
        .unwrap_or_else(|e| panic!("run ebpf-portmap {verb}: {e}"));
    assert!(
        out.status.success(),
        "ebpf-portmap {verb}: {}{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("ebpf-portmap {verb} --json is not JSON: {e}"))
}

pub fn sock(ip: impl Into<IpAddr>, port: u16) -> SocketAddr {
    SocketAddr::new(ip.into(), port)
}

pub struct World {
    pub node: Node,
    pub pins: PinRoot,
    pub plugins: PluginDirs,
    pub runner: CniRunner,
    pub list: Conflist,
}

/// What the `probe` client reported: its `peer=` and `reply=` lines.
#[derive(Debug)]
pub struct Probed {
    pub peer: String,
    pub reply: String,
}

impl World {
    /// [`World::probe`] of `target` in `mode` (`tcp`, `udp`, `sctp`, ...)
    /// with `payload`, answered within 3 s; `Err` names the mode and target.
    pub fn probe_echo(
        &self,
        probe: &str,
        ns: &crate::NetNs,
        hooked: bool,
        mode: &str,
        target: SocketAddr,
        payload: &str,
    ) -> Result<Probed, String> {
        self.probe(
            probe,
            ns,
            hooked,
            &[mode, &target.to_string(), payload, "3000"],
        )
        .map_err(|e| format!("probe {mode} {target} failed: {e}"))
    }

    /// What [`World::probe_echo`] saw must be the echo server `identity`'s
    /// answer to `payload`, and the application must have seen the address
    /// it dialled; else a panic naming `what`, with the world's dump.
    pub fn expect_echo(
        &self,
        what: &str,
        seen: Result<Probed, String>,
        target: SocketAddr,
        identity: &str,
        payload: &str,
    ) {
        let seen = seen.unwrap_or_else(|e| panic!("{what}: {e}\n{}", self.dump()));
        assert_eq!(
            seen.reply,
            crate::traffic::echo_reply(identity, payload),
            "{what}: answered by the wrong server"
        );
        assert_eq!(
            seen.peer,
            target.to_string(),
            "{what}: the application must see the address it dialled"
        );
    }

    /// Runs the `probe` client in `ns` with `args` (`probe` is the binary
    /// cargo built for the calling test; `EPM_PROBE_BIN` overrides it, as
    /// the VM tests stage it elsewhere); in the test's cgroup, where the
    /// socket hooks are attached, when `hooked`. `Err` carries the probe's
    /// `error=` line.
    pub fn probe(
        &self,
        probe: &str,
        ns: &crate::NetNs,
        hooked: bool,
        args: &[&str],
    ) -> Result<Probed, String> {
        use std::os::unix::process::CommandExt;
        let probe = std::env::var_os("EPM_PROBE_BIN").unwrap_or_else(|| probe.into());
        let mut command = ns.command(probe);
        command.args(args);
        if hooked {
            let procs = self.pins.cgroup().procs_file();
            // SAFETY: only async-signal-safe calls between fork and exec:
            // open, write and close through std's file API on a path built
            // before.
            unsafe {
                command.pre_exec(move || std::fs::write(&procs, b"0"));
            }
        }
        let out = command.output().map_err(|e| format!("spawn probe: {e}"))?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let field = |key: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("{key}=")))
                .unwrap_or_default()
                .to_owned()
        };
        if out.status.success() {
            Ok(Probed {
                peer: field("peer"),
                reply: field("reply"),
            })
        } else {
            Err(field("error"))
        }
    }

    /// bridge + host-local + ebpf-portmap.
    pub fn bridge() -> World {
        World::with(|name, pins, data| bridge_conflist(name, "ebpf-portmap", Some(pins), data))
    }

    /// ptp + host-local + ebpf-portmap.
    pub fn ptp() -> World {
        World::with(|name, pins, data| ptp_conflist(name, "ebpf-portmap", Some(pins), data))
    }

    /// Only ebpf-portmap, at CNI 1.1.0 (GC, STATUS), for requests with a
    /// hand-made prevResult.
    pub fn plugin_only() -> World {
        World::with(|name, pins, data| {
            Conflist::from_json(json!({
                "cniVersion": "1.1.0",
                "name": name,
                "plugins": [{
                    "type": "ebpf-portmap",
                    "capabilities": {"portMappings": true},
                    "pinRoot": pins,
                    "logFile": data.join(crate::topology::PLUGIN_LOG),
                    "cgroupPath": crate::cgroup::cgroup_for_pin_root(pins),
                }]
            }))
            .expect("a well-formed conflist")
        })
    }

    pub fn with(list: impl FnOnce(&str, &Path, &Path) -> Conflist) -> World {
        let node = Node::new();
        let pins = PinRoot::new();
        let plugins = PluginDirs::new();
        let runner = CniRunner::new(plugins.paths(), &node.ns);
        let list = list("epm-test", pins.path(), node.data_dir());
        World {
            node,
            pins,
            plugins,
            runner,
            list,
        }
    }

    pub fn add(&self, container: &Container, mappings: &[PortMapping]) -> Value {
        self.runner
            .add(&self.list, &container.with_port_mappings(mappings))
            .unwrap_or_else(|e| panic!("ADD of {} failed: {e}\n{}", container.id, self.dump()))
    }

    /// The program ID each socket hook's link pin runs, by hook
    /// (`connect4`, ...), and the IDs of this build's pinned programs by
    /// the same names, from `status`.
    pub fn hook_programs(&self) -> (BTreeMap<String, u64>, BTreeMap<String, u64>) {
        let status = operator_json(&self.node.ns, self.pins.path(), "status");
        let hooks = status["otherLinks"]
            .as_array()
            .expect("otherLinks")
            .iter()
            .filter_map(|link| {
                let pin = link["pin"].as_str()?;
                let hook = pin.strip_prefix("cg")?.split_once("_portmap_")?.1;
                Some((hook.to_owned(), link["programID"].as_u64()?))
            })
            .collect();
        let current = status["programs"]
            .as_array()
            .expect("programs")
            .iter()
            .filter(|p| p["currentBuild"] == true)
            .filter_map(|p| {
                let hook = p["name"].as_str()?.strip_prefix("portmap_")?;
                Some((hook.to_owned(), p["id"].as_u64()?))
            })
            .collect();
        (hooks, current)
    }

    /// Two containers ADDed (hostPorts 8081 and 8082 to port 80): the first
    /// run attaches the socket hooks, the second finds them in place and
    /// records them, which is asserted. Returned for the test to DEL.
    pub fn add_until_hooks_recorded(&self) -> Vec<(Container, PortMapping)> {
        let added: Vec<(Container, PortMapping)> = [("first", 8081), ("second", 8082)]
            .into_iter()
            .map(|(id, port)| {
                let container = self.node.add_container(id);
                let mapping = PortMapping::tcp(port, 80);
                self.add(&container, std::slice::from_ref(&mapping));
                (container, mapping)
            })
            .collect();
        let record = crate::bpffs::hooks_record(self.pins.path());
        assert!(record.exists(), "{} was not written", record.display());
        added
    }

    /// Asserts that each of the eight hooks' link pins runs this build's
    /// program of its own hook.
    pub fn assert_hooks_of_this_build(&self, when: &str) {
        let (hooks, current) = self.hook_programs();
        assert_eq!(hooks.len(), 8, "{when}: eight hook links: {hooks:?}");
        assert!(
            hooks.iter().all(|(hook, id)| current.get(hook) == Some(id)),
            "{when}: each pin runs this build's program of its hook: {hooks:?}, the programs \
             {current:?}\n{}",
            self.dump()
        );
    }

    pub fn del(&self, container: &Container, mappings: &[PortMapping]) {
        self.runner
            .del(&self.list, &container.with_port_mappings(mappings))
            .unwrap_or_else(|e| panic!("DEL of {} failed: {e}\n{}", container.id, self.dump()));
    }

    /// Our plugin's entry in the conflist.
    pub fn our_plugin(&self) -> &Value {
        self.list
            .plugins()
            .iter()
            .find(|p| p["type"] == "ebpf-portmap")
            .expect("ebpf-portmap in the conflist")
    }

    /// The stdin config of our plugin for `rt`, with `prev` as prevResult.
    pub fn our_config(&self, rt: &RuntimeAttachment, prev: Option<&Value>) -> Value {
        plugin_config(&self.list, self.our_plugin(), &rt.capability_args, prev)
    }

    /// Runs our plugin alone.
    pub fn exec_ours(
        &self,
        command: CniCommand,
        rt: &RuntimeAttachment,
        prev: Option<&Value>,
    ) -> Result<PluginOutput, CniFailure> {
        let config = self.our_config(rt, prev);
        self.runner
            .exec_plugin("ebpf-portmap", command, Some(rt), &config)
    }

    /// The ownership maps as bpftool shows them, entries sorted.
    pub fn maps(&self) -> Vec<(String, Value)> {
        STATE_MAPS
            .iter()
            .map(|name| (name.to_string(), self.dump_map(name)))
            .collect()
    }

    pub fn dump_map(&self, name: &str) -> Value {
        let path = self.map_path(name);
        let out = Command::new("bpftool")
            .args(["--json", "map", "dump", "pinned"])
            .arg(&path)
            .output()
            .expect("run bpftool");
        assert!(
            out.status.success(),
            "bpftool map dump {}: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        let mut entries: Value = serde_json::from_slice(&out.stdout).expect("bpftool JSON");
        if let Value::Array(list) = &mut entries {
            list.sort_by_key(std::string::ToString::to_string);
        }
        entries
    }

    /// The pinned path of map `name` (see [`World::dump_map`]).
    pub fn map_path(&self, name: &str) -> std::path::PathBuf {
        self.pins.path().join("v1/maps").join(name)
    }

    /// Runs `commands` (one bpftool command a line, as `bpftool batch`
    /// reads them) in one `bpftool batch`, fed on stdin: the pin root is a
    /// bpffs, where no file can be written.
    pub fn bpftool_batch(&self, commands: &str) {
        let mut bpftool = Command::new("bpftool")
            .args(["batch", "file", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run bpftool batch");
        bpftool
            .stdin
            .take()
            .expect("bpftool's stdin")
            .write_all(commands.as_bytes())
            .expect("feed bpftool batch");
        let out = bpftool.wait_with_output().expect("bpftool batch");
        assert!(
            out.status.success(),
            "bpftool batch: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    pub fn mapping_count(&self) -> usize {
        self.dump_map("mappings").as_array().map_or(0, Vec::len)
    }

    /// Asserts that no ownership state is left at all.
    pub fn assert_clean(&self, when: &str) {
        for (name, entries) in self.maps() {
            assert_eq!(
                entries.as_array().map(Vec::len),
                Some(0),
                "{when}: {name} is not empty: {entries:#}"
            );
        }
        // The pod map exists once an ADD named a pod (CNI_ARGS).
        if self.pins.path().join("v1/maps").join(POD_MAP).exists() {
            let entries = self.dump_map(POD_MAP);
            assert_eq!(
                entries.as_array().map(Vec::len),
                Some(0),
                "{when}: {POD_MAP} is not empty: {entries:#}"
            );
        }
    }

    /// `ebpf-portmap list --json` as an operator runs it on the node.
    /// `ebpf-portmap <args> --pin-root <pins>` as an operator runs it in the
    /// node namespace (a pin root is the state of one network namespace),
    /// with none of the environment a plugin or another pin root would see.
    pub fn operator(&self, args: &[&str]) -> std::process::Output {
        self.node
            .ns
            .command(plugin_bin())
            .args(args)
            .arg("--pin-root")
            .arg(self.pins.path())
            .env_remove("CNI_COMMAND")
            .env_remove("EPM_PIN_ROOT")
            .env_remove("NO_COLOR")
            .output()
            .unwrap_or_else(|e| panic!("run ebpf-portmap {args:?}: {e}"))
    }

    pub fn list(&self) -> Value {
        operator_json(&self.node.ns, self.pins.path(), "list")
    }

    /// The `host` of every `list --json` row with its container ID.
    pub fn listed_hosts(&self) -> BTreeSet<(String, String)> {
        self.list()
            .as_array()
            .expect("list is an array")
            .iter()
            .map(|r| {
                (
                    r["host"].as_str().expect("host").to_owned(),
                    r["containerID"].as_str().expect("containerID").to_owned(),
                )
            })
            .collect()
    }

    /// `max_entries` of the pinned map `map` as the kernel has it.
    pub fn map_max_entries(&self, map: &str) -> u64 {
        let path = self.pins.path().join("v1/maps").join(map);
        let out = Command::new("bpftool")
            .args(["--json", "map", "show", "pinned"])
            .arg(&path)
            .output()
            .expect("run bpftool");
        let info: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("bpftool map show {}: {e}", path.display()));
        info["max_entries"]
            .as_u64()
            .unwrap_or_else(|| panic!("no max_entries for {}: {info}", path.display()))
    }

    /// `ebpf-portmap trace <args>` in the node namespace, returned once
    /// `status` names it as the tracer; panics if that takes over `bound`.
    pub fn start_trace(&self, args: &[&str], bound: Duration) -> Child {
        let child = self
            .node
            .ns
            .command(plugin_bin())
            .arg("trace")
            .args(args)
            .arg("--pin-root")
            .arg(self.pins.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn trace");
        self.wait_tracing_on(child.id(), bound);
        child
    }

    /// Waits until `status` names `pid` as the tracer, up to `bound`.
    fn wait_tracing_on(&self, pid: u32, bound: Duration) {
        let deadline = Instant::now() + bound;
        loop {
            let status = self.operator(&["status", "--json"]);
            let status: Value = serde_json::from_slice(&status.stdout).expect("status --json");
            if status["tracing"]["pid"] == pid {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "trace did not switch tracing on within {bound:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The dataplane's counters by reason, as `status --json` reports them.
    /// Its exit status is not checked: a problem `status` reports (a
    /// conntrack table filled by churn, say) makes it exit non-zero, and
    /// the counters are still what the test asks for.
    pub fn counters(&self) -> Value {
        self.status()["counters"].clone()
    }

    /// `status --json` as an operator runs it on the node, whatever its
    /// exit status (non-zero when it reports a problem).
    pub fn status(&self) -> Value {
        let out = self.operator(&["status", "--json"]);
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "ebpf-portmap status --json is not JSON ({e}): {}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
    }

    /// Maps, links and the node's network state, for failure messages.
    pub fn dump(&self) -> String {
        let maps = if self.pins.path().join("v1/maps/mappings").exists() {
            let stats: Vec<String> = self
                .dump_map("stats")
                .as_array()
                .map(|entries| {
                    entries
                        .iter()
                        .map(|e| {
                            let total: u64 = e["values"]
                                .as_array()
                                .map(|v| v.iter().map(|c| bpftool_number(&c["value"])).sum())
                                .unwrap_or_default();
                            format!("{}={total}", bpftool_number(&e["key"]))
                        })
                        .collect()
                })
                .unwrap_or_default();
            format!(
                "stats (by reason index): {}\n{:#?}",
                stats.join(" "),
                self.maps()
            )
        } else {
            "(no maps pinned)".to_owned()
        };
        let links = Command::new("bpftool")
            .args(["link", "show"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        format!("maps: {maps}\nlinks:\n{links}\n{}", self.node.diagnostics())
    }

    pub fn expect_answer(
        &self,
        what: &str,
        answer: Result<String, impl std::fmt::Display>,
        expected: &str,
    ) {
        match answer {
            Ok(got) => assert_eq!(got, expected, "{what}: answered by the wrong server"),
            Err(e) => panic!("{what}: {e}\n{}", self.dump()),
        }
    }
}

/// The counter of `reason` in [`World::counters`]' answer.
pub fn counter(counters: &Value, reason: &str) -> u64 {
    counters[reason]
        .as_u64()
        .unwrap_or_else(|| panic!("no counter {reason}: {counters:#}"))
}

/// A number as bpftool prints it: plain with BTF, else little-endian hex bytes.
pub fn bpftool_number(value: &Value) -> u64 {
    if let Some(n) = value.as_u64() {
        return n;
    }
    value.as_array().map_or(0, |bytes| {
        bytes.iter().rev().fold(0, |acc, b| {
            let byte = b
                .as_str()
                .and_then(|s| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok())
                .unwrap_or(0);
            (acc << 8) | byte
        })
    })
}

pub fn expect_unreachable(what: &str, answer: Result<String, ProbeError>) {
    match answer {
        Err(e) if e.is_unreachable() => {}
        other => panic!("{what} must not answer, got {other:?}"),
    }
}

/// A prevResult as an interface plugin would return it, for requests that
/// do not need a real interface (our plugin only reads the addresses).
pub fn fake_prev_result(
    netns: &Path,
    ifname: &str,
    ip4: Option<IpAddr>,
    ip6: Option<IpAddr>,
) -> Value {
    let mut ips = Vec::new();
    if let Some(ip) = ip4 {
        ips.push(json!({"interface": 0, "address": format!("{ip}/24")}));
    }
    if let Some(ip) = ip6 {
        ips.push(json!({"interface": 0, "address": format!("{ip}/64")}));
    }
    json!({
        "cniVersion": "1.1.0",
        "interfaces": [{"name": ifname, "sandbox": netns.display().to_string()}],
        "ips": ips,
    })
}

/// An owner for requests with a hand-made prevResult: `id` with one IPv4
/// and one IPv6 address and `mappings`.
pub struct FakeContainer {
    pub rt: RuntimeAttachment,
    pub prev: Value,
    pub mappings: Vec<PortMapping>,
}

impl FakeContainer {
    pub fn new(world: &World, id: &str, index: u32, mappings: Vec<PortMapping>) -> FakeContainer {
        let ip4 = IpAddr::V4(Ipv4Addr::new(
            10,
            250,
            (index / 250) as u8,
            (index % 250 + 2) as u8,
        ));
        let ip6: IpAddr = format!("fd50::{:x}", index + 2).parse().expect("ipv6");
        // Any existing namespace will do: our plugin never enters it.
        let netns = world.node.ns.path();
        let args =
            json!({"portMappings": mappings.iter().map(PortMapping::to_json).collect::<Vec<_>>()});
        FakeContainer {
            rt: RuntimeAttachment {
                container_id: id.to_owned(),
                netns_path: netns.to_path_buf(),
                ifname: "eth0".to_owned(),
                capability_args: args,
                cni_args: Vec::new(),
            },
            prev: fake_prev_result(netns, "eth0", Some(ip4), Some(ip6)),
            mappings,
        }
    }

    pub fn add(&self, world: &World) -> Result<(), String> {
        world
            .exec_ours(CniCommand::Add, &self.rt, Some(&self.prev))
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    pub fn del(&self, world: &World) -> Result<(), String> {
        world
            .exec_ours(CniCommand::Del, &self.rt, None)
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    pub fn check(&self, world: &World) -> Result<(), String> {
        world
            .exec_ours(CniCommand::Check, &self.rt, Some(&self.prev))
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    /// Starts our plugin for `command` without waiting for it.
    pub fn spawn(&self, world: &World, command: CniCommand) -> std::process::Child {
        let prev = (command == CniCommand::Add).then_some(&self.prev);
        let config = world.our_config(&self.rt, prev);
        let mut child = world
            .node
            .ns
            .command(plugin_bin())
            .env("CNI_COMMAND", command.as_str())
            .env("CNI_CONTAINERID", &self.rt.container_id)
            .env("CNI_NETNS", &self.rt.netns_path)
            .env("CNI_IFNAME", &self.rt.ifname)
            .env("CNI_PATH", "/usr/lib/cni")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn ebpf-portmap");
        let mut stdin = child.stdin.take().expect("stdin");
        let _ = stdin.write_all(config.to_string().as_bytes());
        child
    }

    /// The entries `list --json` shows for this container.
    pub fn expected_hosts(&self) -> BTreeSet<(String, String)> {
        let mut hosts = BTreeSet::new();
        for m in &self.mappings {
            let json = m.to_json();
            let port = json["hostPort"].as_u64().unwrap_or_default();
            let proto = json["protocol"].as_str().unwrap_or("tcp").to_owned();
            hosts.insert((
                format!("0.0.0.0:{port}/{proto}"),
                self.rt.container_id.clone(),
            ));
            hosts.insert((format!("[::]:{port}/{proto}"), self.rt.container_id.clone()));
        }
        hosts
    }
}

/// Waits for `child` up to `bound`; kills it and panics when it does not end.
/// Polls every 5 ms (a `waitpid` each), so a race test that waits for its
/// racers round after round loses no time to the poll.
pub fn wait_bounded(mut child: Child, bound: Duration, what: &str) -> Output {
    let deadline = Instant::now() + bound;
    loop {
        match child.try_wait().expect("try_wait") {
            Some(_) => return child.wait_with_output().expect("collect output"),
            None if Instant::now() > deadline => {
                let _ = child.kill();
                let out = child.wait_with_output().expect("collect output");
                panic!(
                    "{what} did not end within {bound:?}: {}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            None => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

/// The events of `trace --json`'s output, a JSON object a line.
pub fn trace_events(out: &Output) -> Vec<Value> {
    BufReader::new(&out.stdout[..])
        .lines()
        .map(|line| {
            let line = line.expect("trace output line");
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("trace line {line:?}: {e}"))
        })
        .collect()
}

/// The bytes of a `bpftool --json` dump's `key` or `value` (`"0x0a"`
/// each) as `bpftool ... hex` takes them (`0a 00 ...`).
pub fn bpftool_hex(bytes: &Value) -> String {
    bytes
        .as_array()
        .expect("bpftool's byte array")
        .iter()
        .map(|b| {
            b.as_str()
                .expect("a bpftool hex byte")
                .trim_start_matches("0x")
        })
        .collect::<Vec<_>>()
        .join(" ")
}
