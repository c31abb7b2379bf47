//! What a test does with any runtime: the [`Driver`] trait (the table of
//! what differs between runtimes), the world a test runs in ([`E2e`]: a
//! driver over the standard node), the checks every runtime's test makes
//! (translations, reachability from outside and from the node, plugin
//! calls), and the scenarios written once and run for each runtime
//! ([`publish_and_reach`], [`fleet_at_once`], [`nothing_translated`], and
//! the field's cases: [`tcp_and_udp_share_a_host_port`],
//! [`hostport_conformance`], [`wildcard_then_node_ip_is_refused`],
//! [`conditions_restrict_who_reaches_a_host_port`]).

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::firewall::{
    Translation, expected_translations, ours_translations, upstream_leftovers,
    upstream_translations_in,
};
use super::recorder::{CniCall, Recorder, short};
use crate::topology::{NODE_IP4, NODE_IP6, Node, PortMapping};
use crate::traffic::{ProbeError, echo_reply, http_get, udp_request};
use crate::world::{PROBE, sock};

/// How long a freshly started workload may take to answer.
pub const READY: Duration = Duration::from_secs(20);
/// Workloads [`fleet_at_once`] starts at once.
pub const PARALLEL: u16 = 8;

/// The port-mapping plugin a conflist names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortPlugin {
    /// ebpf-portmap.
    Ours,
    /// The reference plugin from the runtime's containernetworking-plugins
    /// (iptables inside the node namespace).
    Upstream,
}

impl PortPlugin {
    /// The plugin's `type` (and file name).
    pub fn plugin_type(self) -> &'static str {
        match self {
            PortPlugin::Ours => crate::plugins::PLUGIN_TYPE,
            PortPlugin::Upstream => "portmap",
        }
    }

    /// Whether the plugin translates `[::1]:hostPort` on the node. Upstream
    /// does not: IPv6 has no `route_localnet`, so a packet from ::1 can
    /// never leave the loopback device after DNAT (its README says
    /// localhost works for IPv4 only).
    pub fn translates_ipv6_loopback(self) -> bool {
        self == PortPlugin::Ours
    }
}

/// A workload a runtime started (a podman container, a CRI pod).
pub trait Workload: Clone + std::fmt::Debug + Send + Sync {
    /// Its name; the HTTP body and the UDP echo's prefix it answers with.
    fn name(&self) -> &str;
    /// The ID the runtime gives the CNI plugins (`CNI_CONTAINERID`).
    fn cni_id(&self) -> &str;
    fn ipv4(&self) -> Ipv4Addr;
    fn ipv6(&self) -> Ipv6Addr;
}

/// What a runtime can or cannot do, for the scenarios that need it: a
/// scenario asks [`Driver::supports`] and skips with a printed reason
/// where the runtime cannot (see [`E2e::supports`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Capability {
    /// The runtime asks the plugins for CNI STATUS (`cniVersion` 1.1.0)
    /// and reports the answer (containerd 2.x: the CRI's `NetworkReady`).
    CniStatus,
}

impl Capability {
    /// What the runtime cannot do when it lacks this, for the skip message.
    pub fn lacking(self) -> &'static str {
        match self {
            Capability::CniStatus => "asks the plugins for no CNI STATUS",
        }
    }
}

/// What differs between runtimes. A new runtime is a type implementing
/// this (and a module of `tests/src` that confines it: see
/// [`super::holder`]); every scenario of this module then runs with it.
pub trait Driver: Sync {
    type Workload: Workload;

    /// The runtime and its version, for messages.
    fn describe(&self) -> String;
    /// Starts a workload publishing `ports` that serves HTTP on 80 (the
    /// body is `name`) and the UDP echo on 53 (answers prefixed with
    /// `name`), on the test's CNI network with both families.
    fn start(&self, name: &str, ports: &[PortMapping]) -> Result<Self::Workload, String>;
    /// Removes the workload (stops it first): the runtime runs every CNI
    /// DEL it sends for that.
    fn remove(&self, workload: &Self::Workload) -> Result<(), String>;
    /// How many DELs the port-mapping plugin gets for one [`Driver::remove`]
    /// of a running workload.
    fn dels_per_remove(&self) -> usize;
    /// The recorder of the runtime's CNI bin directory: every plugin
    /// execution, delegated ones too.
    fn recorder(&self) -> &Recorder;
    /// Whether the runtime can do what `capability` names.
    fn supports(&self, capability: Capability) -> bool;
    /// Replaces the conflist with one whose port-mapping plugin (ours)
    /// carries `keys` too (e.g. upstream's `conditionsV4`), and returns
    /// once the runtime uses it for new workloads.
    fn set_port_plugin_keys(&self, keys: &Value) -> Result<(), String>;
    /// `ebpf-portmap <verb> --json` on the node, as an operator runs it
    /// there; `None` while ebpf-portmap is not installed on the node.
    fn operator_json(&self, verb: &str) -> Result<Option<Value>, String>;
    /// The `cgroup.procs` of the cgroup ebpf-portmap's socket hooks are
    /// attached to (`cgroupPath`): node-side clients run in it.
    fn hooks_procs(&self) -> PathBuf;
    /// Best-effort state for failure messages. Never panics.
    fn diagnostics(&self) -> String;
}

/// What `ebpf-portmap <verb> --json` printed, for [`Driver::operator_json`]:
/// the verb must have succeeded and printed JSON.
pub fn operator_output(verb: &str, out: &std::process::Output) -> Result<Value, String> {
    if !out.status.success() {
        return Err(format!(
            "ebpf-portmap {verb} --json ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        ));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| {
        format!(
            "ebpf-portmap {verb} --json printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// One test's world. Field order is drop order: the runtime goes first
/// (removing its workloads runs the CNI DELs while the namespaces exist).
pub struct E2e<D> {
    pub driver: D,
    pub node: Node,
    /// The tests' connection tester (`env!("CARGO_BIN_EXE_probe")` of the
    /// calling test).
    pub probe: PathBuf,
}

/// What the probe client saw.
#[derive(Debug)]
pub struct Seen {
    pub peer: String,
    pub reply: String,
}

impl<D: Driver> E2e<D> {
    /// Starts a workload, which must succeed.
    pub fn run(&self, name: &str, ports: &[PortMapping]) -> D::Workload {
        self.driver
            .start(name, ports)
            .unwrap_or_else(|e| panic!("starting {name}: {e}\n{}", self.dump()))
    }

    /// Removes a workload, which must succeed.
    pub fn remove_workload(&self, workload: &D::Workload) {
        self.driver
            .remove(workload)
            .unwrap_or_else(|e| panic!("removing {}: {e}\n{}", workload.name(), self.dump()));
    }

    /// The calls of `plugin` running `command` for `workload`, oldest first.
    pub fn calls(&self, plugin: PortPlugin, command: &str, workload: &D::Workload) -> Vec<CniCall> {
        self.driver
            .recorder()
            .calls_of(plugin.plugin_type(), command, workload.cni_id())
    }

    /// Whether the runtime can do what `capability` names; if not, prints
    /// why the calling scenario (`what`) skips it.
    pub fn supports(&self, capability: Capability, what: &str) -> bool {
        let supported = self.driver.supports(capability);
        if !supported {
            eprintln!(
                "skipped: {what}: {} {}",
                self.driver.describe(),
                capability.lacking()
            );
        }
        supported
    }

    /// `expected` calls of `plugin` running `command` for `workload`, none
    /// of which failed.
    pub fn assert_calls(
        &self,
        plugin: PortPlugin,
        command: &str,
        workload: &D::Workload,
        expected: usize,
    ) -> Vec<CniCall> {
        let calls = self.calls(plugin, command, workload);
        assert_eq!(
            calls.len(),
            expected,
            "{} {command} calls for {} ({})\n{}",
            plugin.plugin_type(),
            workload.name(),
            workload.cni_id(),
            self.dump()
        );
        for call in &calls {
            assert!(
                call.exit_code.is_none_or(|code| code == 0),
                "{} {command} of {} failed: {}\n{}",
                plugin.plugin_type(),
                workload.name(),
                call.summary(),
                self.dump()
            );
        }
        calls
    }

    /// Every translation `plugin` holds on the node with its owner (the
    /// CNI ID), sorted: `ebpf-portmap list --json` for ours, the `CNI-DN-*`
    /// chains of iptables and ip6tables for upstream.
    pub fn translations_of(&self, plugin: PortPlugin) -> Vec<(String, Translation)> {
        let mut found = match plugin {
            PortPlugin::Ours => match self.driver.operator_json("list") {
                Ok(Some(list)) => ours_translations(&list),
                Ok(None) => Vec::new(),
                Err(e) => panic!("{e}\n{}", self.dump()),
            },
            PortPlugin::Upstream => upstream_translations_in(&self.node.ns),
        };
        found.sort();
        found
    }

    /// The translations owned by `workload`, sorted.
    pub fn translations(&self, plugin: PortPlugin, workload: &D::Workload) -> Vec<Translation> {
        self.translations_of(plugin)
            .into_iter()
            .filter(|(owner, _)| owner == workload.cni_id())
            .map(|(_, t)| t)
            .collect()
    }

    pub fn assert_translations(
        &self,
        plugin: PortPlugin,
        workload: &D::Workload,
        ports: &[PortMapping],
        when: &str,
    ) {
        assert_eq!(
            self.translations(plugin, workload),
            expected_translations(workload.ipv4(), workload.ipv6(), ports),
            "{when}: translations of {}\n{}",
            workload.name(),
            self.dump()
        );
    }

    pub fn assert_no_translations(&self, plugin: PortPlugin, workload: &D::Workload, when: &str) {
        assert_eq!(
            self.translations(plugin, workload),
            [],
            "{when}: {} still has translations\n{}",
            workload.name(),
            self.dump()
        );
    }

    /// Polls from the external namespace until `workload` answers HTTP on
    /// `host_ip:tcp_port` and, if given, the UDP echo on `udp_port` (a
    /// workload takes a moment to start its servers).
    pub fn wait_serving(
        &self,
        workload: &D::Workload,
        host_ip: IpAddr,
        tcp_port: u16,
        udp_port: Option<u16>,
    ) {
        let deadline = Instant::now() + READY;
        let tcp = sock(host_ip, tcp_port);
        loop {
            let last = match http_get(&self.node.ext, tcp, Duration::from_secs(1)) {
                Ok(response) if response.body.trim() == workload.name() => break,
                Ok(response) => format!("{response:?}"),
                Err(e) => e.to_string(),
            };
            assert!(
                Instant::now() < deadline,
                "{} never answered on {tcp} within {READY:?}: {last}\n{}",
                workload.name(),
                self.dump()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        // The workload starts its UDP echo after its HTTP servers: until it
        // binds, the pod answers ICMP port unreachable, which is a refusal
        // here like a closed TCP port is above.
        if let Some(udp_port) = udp_port {
            let udp = sock(host_ip, udp_port);
            let what = format!("{} UDP on {udp}", workload.name());
            let deadline = Instant::now() + READY;
            loop {
                match udp_request(&self.node.ext, udp, "ready", Duration::from_secs(1)) {
                    Err(e) if e.is_unreachable() && Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(100));
                    }
                    answer => {
                        self.expect_answer(&what, answer, &echo_reply(workload.name(), "ready"));
                        break;
                    }
                }
            }
        }
    }

    pub fn expect_answer(&self, what: &str, answer: Result<String, ProbeError>, expected: &str) {
        match answer {
            Ok(got) => assert_eq!(got.trim(), expected, "{what}: answered by the wrong server"),
            Err(e) => panic!("{what}: {e}\n{}", self.dump()),
        }
    }

    /// From the external namespace to `host_ips`: HTTP on `tcp_port`, the
    /// UDP echo on `udp_port` if given.
    pub fn check_external(
        &self,
        workload: &D::Workload,
        host_ips: &[IpAddr],
        tcp_port: u16,
        udp_port: Option<u16>,
    ) {
        for &host_ip in host_ips {
            let tcp = sock(host_ip, tcp_port);
            self.expect_answer(
                &format!("external -> {tcp}"),
                http_get(&self.node.ext, tcp, PROBE).map(|r| r.body),
                workload.name(),
            );
            if let Some(udp_port) = udp_port {
                let udp = sock(host_ip, udp_port);
                let payload = format!("ext-{host_ip}");
                self.expect_answer(
                    &format!("external -> {udp}/udp"),
                    udp_request(&self.node.ext, udp, &payload, PROBE),
                    &echo_reply(workload.name(), &payload),
                );
            }
        }
    }

    /// From the node's own namespace to its addresses and to localhost, by
    /// a client in the hooks cgroup (for upstream the cgroup has no hooks
    /// and changes nothing).
    pub fn check_from_node(
        &self,
        plugin: PortPlugin,
        workload: &D::Workload,
        tcp_port: u16,
        udp_port: u16,
    ) {
        let mut targets = vec![
            IpAddr::V4(NODE_IP4),
            IpAddr::V6(NODE_IP6),
            IpAddr::V4(Ipv4Addr::LOCALHOST),
        ];
        if plugin.translates_ipv6_loopback() {
            targets.push(IpAddr::V6(Ipv6Addr::LOCALHOST));
        }
        for ip in targets {
            let tcp = sock(ip, tcp_port);
            let seen = self.node_probe("http", tcp, "-");
            self.expect_seen(&format!("node -> {tcp}"), seen, tcp, workload.name());
            let udp = sock(ip, udp_port);
            let seen = self.node_probe("udp", udp, "node");
            self.expect_seen(
                &format!("node -> {udp}/udp"),
                seen,
                udp,
                &echo_reply(workload.name(), "node"),
            );
        }
    }

    /// `program` to run in the node namespace inside the hooks cgroup (a
    /// process of the node, as the socket hooks see it).
    pub fn node_client(&self, program: &str) -> std::process::Command {
        let mut command = self.node.ns.command(program);
        let procs = self.driver.hooks_procs();
        // SAFETY: only async-signal-safe calls between fork and exec: open,
        // write and close through std's file API on a path built before.
        unsafe {
            command.pre_exec(move || std::fs::write(&procs, b"0"));
        }
        command
    }

    /// Runs the `probe` client in the node namespace inside the hooks cgroup.
    pub fn node_probe(
        &self,
        mode: &str,
        target: SocketAddr,
        payload: &str,
    ) -> Result<Seen, String> {
        let mut command = self.node_client(&self.probe.to_string_lossy());
        command.args([mode, &target.to_string(), payload, "3000"]);
        let out = command.output().map_err(|e| format!("spawn probe: {e}"))?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let field = |key: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("{key}=")))
                .unwrap_or_default()
                .to_owned()
        };
        if !out.status.success() {
            return Err(format!("probe {mode} {target}: {}", field("error")));
        }
        Ok(Seen {
            peer: field("peer"),
            reply: field("reply"),
        })
    }

    pub fn expect_seen(
        &self,
        what: &str,
        seen: Result<Seen, String>,
        target: SocketAddr,
        reply: &str,
    ) {
        let seen = seen.unwrap_or_else(|e| panic!("{what}: {e}\n{}", self.dump()));
        assert_eq!(seen.reply, reply, "{what}: answered by the wrong server");
        assert_eq!(
            seen.peer,
            target.to_string(),
            "{what}: the client must see the address it dialled"
        );
    }

    /// State for failure messages: the runtime, ebpf-portmap's view, the node.
    pub fn dump(&self) -> String {
        let list = match self.driver.operator_json("list") {
            Ok(Some(list)) => format!("{list:#}"),
            Ok(None) => "(ebpf-portmap not installed)".to_owned(),
            Err(e) => e,
        };
        format!(
            "{}--- ebpf-portmap list --json\n{list}\n{}",
            self.driver.diagnostics(),
            self.node.diagnostics()
        )
    }
}

// ---- scenarios run for every runtime ----------------------------------------

/// A workload publishing TCP 8080 and UDP 8053: `plugin` ran one ADD for
/// it, the node holds exactly its translations (both families, both
/// protocols), and it answers from the external namespace over IPv4 and
/// IPv6, TCP and UDP, and from the node itself to its own addresses and to
/// localhost.
pub fn publish_and_reach<D: Driver>(t: &E2e<D>, plugin: PortPlugin, name: &str) -> D::Workload {
    let ports = web_ports();
    let web = t.run(name, &ports);
    t.assert_calls(plugin, "ADD", &web, 1);
    t.assert_translations(plugin, &web, &ports, "after it started");
    reachable(t, plugin, &web);
    web
}

/// The ports of [`publish_and_reach`].
pub fn web_ports() -> [PortMapping; 2] {
    [PortMapping::tcp(8080, 80), PortMapping::udp(8053, 53)]
}

/// `web` answers on the ports of [`publish_and_reach`] from outside (both
/// families) and from the node.
pub fn reachable<D: Driver>(t: &E2e<D>, plugin: PortPlugin, web: &D::Workload) {
    let both = [IpAddr::V4(NODE_IP4), IpAddr::V6(NODE_IP6)];
    t.wait_serving(web, both[0], 8080, Some(8053));
    t.check_external(web, &both, 8080, Some(8053));
    t.check_from_node(plugin, web, 8080, 8053);
}

/// The ports of workload `i` of [`fleet_at_once`].
pub fn fleet_ports(i: u16) -> [PortMapping; 2] {
    [
        PortMapping::tcp(8100 + i, 80),
        PortMapping::udp(8200 + i, 53),
    ]
}

/// [`PARALLEL`] workloads started at once (`fleet-<i>`), each with its own
/// TCP and UDP port: distinct addresses, one ADD each, their translations,
/// all reachable from outside on both families. Prints how long they took.
pub fn fleet_at_once<D: Driver>(t: &E2e<D>, plugin: PortPlugin) -> Vec<D::Workload> {
    let started = Instant::now();
    let fleet: Vec<D::Workload> = std::thread::scope(|scope| {
        let runs: Vec<_> = (0..PARALLEL)
            .map(|i| {
                let driver = &t.driver;
                scope.spawn(move || driver.start(&format!("fleet-{i}"), &fleet_ports(i)))
            })
            .collect();
        runs.into_iter()
            .map(|run| run.join().expect("a start thread"))
            .collect::<Vec<_>>()
    })
    .into_iter()
    .enumerate()
    .map(|(i, w)| w.unwrap_or_else(|e| panic!("parallel start {i}: {e}\n{}", t.dump())))
    .collect();
    let took = started.elapsed();
    let addresses: BTreeSet<Ipv4Addr> = fleet.iter().map(Workload::ipv4).collect();
    assert_eq!(
        addresses.len(),
        fleet.len(),
        "distinct addresses: {fleet:?}"
    );
    for (i, workload) in (0..PARALLEL).zip(&fleet) {
        t.assert_calls(plugin, "ADD", workload, 1);
        check_fleet_member(t, plugin, i, workload, "after the parallel start");
    }
    eprintln!(
        "{PARALLEL} at once on {} with {}: running in {:.1}s",
        t.driver.describe(),
        plugin.plugin_type(),
        took.as_secs_f64()
    );
    fleet
}

/// Workload `i` of the fleet holds its translations and answers on both
/// families.
pub fn check_fleet_member<D: Driver>(
    t: &E2e<D>,
    plugin: PortPlugin,
    i: u16,
    workload: &D::Workload,
    when: &str,
) {
    let both = [IpAddr::V4(NODE_IP4), IpAddr::V6(NODE_IP6)];
    t.assert_translations(plugin, workload, &fleet_ports(i), when);
    t.wait_serving(workload, both[0], 8100 + i, Some(8200 + i));
    t.check_external(workload, &both, 8100 + i, Some(8200 + i));
}

/// Removes `workloads` at once: every removal succeeds, each gets
/// `dels` DELs in all, none of its translations is left.
pub fn remove_at_once<D: Driver>(
    t: &E2e<D>,
    plugin: PortPlugin,
    workloads: &[D::Workload],
    dels: usize,
) {
    let outcomes: Vec<Result<(), String>> = std::thread::scope(|scope| {
        let ends: Vec<_> = workloads
            .iter()
            .map(|w| scope.spawn(move || t.driver.remove(w)))
            .collect();
        ends.into_iter()
            .map(|e| e.join().expect("a remove thread"))
            .collect()
    });
    for (workload, outcome) in workloads.iter().zip(outcomes) {
        if let Err(e) = outcome {
            panic!(
                "removing {} in parallel: {e}\n{}",
                workload.name(),
                t.dump()
            );
        }
        t.assert_calls(plugin, "DEL", workload, dels);
        t.assert_no_translations(plugin, workload, "after the parallel removal");
    }
}

/// No translation of `plugin` is left on the node but those owned by
/// `leaked` (already recorded as failures); for upstream with nothing
/// leaked, no per-container chain or DNAT rule either.
pub fn nothing_translated<D: Driver>(t: &E2e<D>, plugin: PortPlugin, leaked: &[String]) {
    let mut left = t.translations_of(plugin);
    left.retain(|(owner, _)| !leaked.contains(owner));
    assert!(
        left.is_empty(),
        "{} translations left: {left:?}\n{}",
        plugin.plugin_type(),
        t.dump()
    );
    if plugin == PortPlugin::Upstream
        && leaked.is_empty()
        && let Some((tool, save)) = upstream_leftovers(&t.node.ns)
    {
        panic!("{tool} still has per-container chains or DNAT rules:\n{save}");
    }
}

// ---- the field's cases (issue 33), run for every runtime ---------------------

/// One workload publishing TCP 53 and UDP 53 on the same host port, as a
/// DNS server does (Cilium's hostPort served only one of them,
/// cilium#41426): both answer over IPv4 and IPv6, from outside and from
/// the node; removing it runs its DELs and leaves none of its translations.
pub fn tcp_and_udp_share_a_host_port<D: Driver>(t: &E2e<D>, plugin: PortPlugin) {
    let ports = [PortMapping::tcp(53, 53), PortMapping::udp(53, 53)];
    let dns = t.run("dns", &ports);
    t.assert_calls(plugin, "ADD", &dns, 1);
    t.assert_translations(plugin, &dns, &ports, "TCP and UDP on host port 53");
    let both = [IpAddr::V4(NODE_IP4), IpAddr::V6(NODE_IP6)];
    t.wait_serving(&dns, both[0], 53, Some(53));
    t.wait_serving(&dns, both[1], 53, Some(53));
    t.check_external(&dns, &both, 53, Some(53));
    t.check_from_node(plugin, &dns, 53, 53);
    t.remove_workload(&dns);
    t.assert_calls(plugin, "DEL", &dns, t.driver.dels_per_remove());
    t.assert_no_translations(plugin, &dns, "after its removal");
}

/// The host port of [`hostport_conformance`].
pub const CONFORMANCE_PORT: u16 = 54323;

/// Kubernetes' conformance test "validates that there is no conflict
/// between pods with same hostPort but different hostIP and protocol"
/// (test/e2e/network/hostport.go), its three checks run from the node as it
/// runs them: `curl --interface <nodeIP> http://localhost:54323/hostname`,
/// `curl http://<nodeIP>:54323/hostname` and a UDP `hostname` to
/// `<nodeIP>:54323` (`nc -u` there; the probe here: busybox's nc has no
/// UDP) each reach a different workload. Returns the three, running.
pub fn hostport_conformance<D: Driver>(t: &E2e<D>, plugin: PortPlugin) -> Vec<D::Workload> {
    const PORT: u16 = CONFORMANCE_PORT;
    let node_ip = IpAddr::V4(NODE_IP4);
    let localhost = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let specs = [
        ("pod1", PortMapping::tcp(PORT, 80).on(localhost)),
        ("pod2", PortMapping::tcp(PORT, 80).on(node_ip)),
        ("pod3", PortMapping::udp(PORT, 53).on(node_ip)),
    ];
    let workloads: Vec<D::Workload> = specs
        .iter()
        .map(|(name, port)| {
            let workload = t.run(name, std::slice::from_ref(port));
            t.assert_calls(plugin, "ADD", &workload, 1);
            t.assert_translations(plugin, &workload, std::slice::from_ref(port), "conformance");
            workload
        })
        .collect();
    let node_ip_text = node_ip.to_string();
    let curl = |args: &[&str]| -> Result<String, String> {
        let out = t
            .node_client("curl")
            .args([
                "-g",
                "-sS",
                "--fail",
                "--connect-timeout",
                "5",
                "--max-time",
                "10",
            ])
            .args(args)
            .output()
            .map_err(|e| format!("spawn curl: {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
        } else {
            Err(format!(
                "curl {args:?}: {} {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    };
    let deadline = Instant::now() + READY;
    let localhost_url = format!("http://localhost:{PORT}/hostname");
    let node_url = format!("http://{}/hostname", sock(node_ip, PORT));
    let checks: [(&str, Vec<&str>, &D::Workload); 2] = [
        (
            "pod1 via localhost",
            vec!["--interface", &node_ip_text, &localhost_url],
            &workloads[0],
        ),
        ("pod2 via the node IP", vec![&node_url], &workloads[1]),
    ];
    for (what, args, workload) in checks {
        loop {
            let last = match curl(&args) {
                Ok(body) if body == workload.name() => break,
                Ok(body) => format!("answered {body:?}"),
                Err(e) => e,
            };
            assert!(
                Instant::now() < deadline,
                "{plugin:?} conformance {what}: {last}\n{}",
                t.dump()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    let pod3 = &workloads[2];
    let udp = sock(node_ip, PORT);
    let seen = t.node_probe("udp", udp, "hostname");
    t.expect_seen(
        "conformance pod3 via UDP to the node IP",
        seen,
        udp,
        &echo_reply(pod3.name(), "hostname"),
    );
    workloads
}

/// The host port of [`wildcard_then_node_ip_is_refused`].
pub const WILDCARD_PORT: u16 = 54322;

/// The scheduler's twin (hostport.go's "validates that there exists
/// conflict between pods with same hostPort and protocol, but one using
/// 0.0.0.0 hostIP"): a wildcard TCP 54322 then TCP 54322 on the node IP.
/// The scheduler keeps such workloads apart; a node that gets both anyway
/// (a static pod, a kubelet without the scheduler's view, two `podman run`)
/// must refuse the second with code 100 naming the first, and keep serving
/// the first. Ours only: upstream does not detect conflicts (it relies on
/// the scheduler).
pub fn wildcard_then_node_ip_is_refused<D: Driver>(t: &E2e<D>) {
    const PORT: u16 = WILDCARD_PORT;
    let node_ip = IpAddr::V4(NODE_IP4);
    let first = t.run("wild", &[PortMapping::tcp(PORT, 80)]);
    t.wait_serving(&first, node_ip, PORT, None);
    let refused = t
        .driver
        .start("specific", &[PortMapping::tcp(PORT, 80).on(node_ip)]);
    let error = match refused {
        Ok(workload) => panic!(
            "TCP {PORT} on {node_ip} was granted to {} while {} holds TCP {PORT} on every address\n{}",
            workload.name(),
            first.name(),
            t.dump()
        ),
        Err(e) => e,
    };
    let add = refused_add(t, "the node-IP workload after a wildcard one", |call| {
        call.cni_arg("K8S_POD_NAME") == Some("specific")
    });
    assert!(
        add.error_message().contains(short(first.cni_id())),
        "the refusal names the holder {}: {}",
        short(first.cni_id()),
        add.summary()
    );
    eprintln!("the node-IP workload after a wildcard one: {error}");
    t.expect_answer(
        "the wildcard workload after the refused one",
        http_get(&t.node.ext, sock(node_ip, PORT), PROBE).map(|r| r.body),
        first.name(),
    );
    t.remove_workload(&first);
    t.assert_no_translations(PortPlugin::Ours, &first, "after its removal");
}

/// The one ADD of ours that `which` selects (by its `CNI_ARGS`: the CNI ID
/// of a refused workload is not known to the test); it must have failed
/// with code 100.
pub fn refused_add<D: Driver>(t: &E2e<D>, what: &str, which: impl Fn(&CniCall) -> bool) -> CniCall {
    let adds: Vec<CniCall> = t
        .driver
        .recorder()
        .calls()
        .into_iter()
        .filter(|c| c.plugin == PortPlugin::Ours.plugin_type() && c.command == "ADD" && which(c))
        .collect();
    let [add] = adds.as_slice() else {
        panic!("one ADD for {what}, found {}\n{}", adds.len(), t.dump());
    };
    assert_eq!(
        (add.exit_code, add.error_code()),
        (Some(1), Some(100)),
        "the ADD for {what} fails with code 100: {}",
        add.summary()
    );
    add.clone()
}

/// Issue 33: upstream's `conditionsV4`/`conditionsV6` in the conflist the
/// runtime loads restrict who opens a flow to a host port (ours only):
/// `far` (198.19.0.2, fd19::2, inside the conditions) reaches the workload
/// through the node's address, `ext` (198.18.0.2, fd18::2, outside) gets
/// the node's own answer (nothing listens there: refused), v4 and v6.
pub fn conditions_restrict_who_reaches_a_host_port<D: Driver>(t: &E2e<D>) {
    let plugin = PortPlugin::Ours;
    t.driver
        .set_port_plugin_keys(&serde_json::json!({
            "conditionsV4": ["-s", "198.19.0.0/24"],
            "conditionsV6": ["-s", "fd19::/64"],
        }))
        .unwrap_or_else(|e| panic!("conditions in the conflist: {e}\n{}", t.dump()));
    let ports = [PortMapping::tcp(8400, 80)];
    let web = t.run("cond", &ports);
    t.assert_calls(plugin, "ADD", &web, 1);
    for node_ip in [IpAddr::V4(NODE_IP4), IpAddr::V6(NODE_IP6)] {
        let target = sock(node_ip, 8400);
        let deadline = Instant::now() + READY;
        loop {
            let last = match http_get(&t.node.far, target, Duration::from_secs(1)) {
                Ok(response) if response.body.trim() == web.name() => break,
                Ok(response) => format!("{response:?}"),
                Err(e) => e.to_string(),
            };
            assert!(
                Instant::now() < deadline,
                "far (inside conditionsV4/V6) never reached {} on {target}: {last}\n{}",
                web.name(),
                t.dump()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let outside = http_get(&t.node.ext, target, Duration::from_secs(2));
        assert!(
            outside.is_err(),
            "ext is outside conditionsV4/V6 and must not reach {} on {target}: {outside:?}\n{}",
            web.name(),
            t.dump()
        );
    }
    t.remove_workload(&web);
    t.assert_calls(plugin, "DEL", &web, t.driver.dels_per_remove());
    t.assert_no_translations(plugin, &web, "after its removal");
}
