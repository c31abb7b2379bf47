//! What a test does with any runtime: the [`Driver`] trait (the table of
//! what differs between runtimes), the world a test runs in ([`E2e`]: a
//! driver over the standard node), the checks every runtime's test makes
//! (translations, reachability from outside and from the node, plugin
//! calls), and the scenarios written once and run for each runtime
//! ([`publish_and_reach`], [`fleet_at_once`], [`nothing_translated`]).

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

/// One plugin execution as a runtime's harness recorded it.
pub trait PluginCall: std::fmt::Debug {
    /// The exit code, if the harness records it (`None`: unknown or still
    /// running).
    fn exit_code(&self) -> Option<i32>;
    /// One line for failure messages.
    fn summary(&self) -> String;
}

/// What differs between runtimes. A new runtime is a type implementing
/// this (and a module of `tests/src` that confines it: see
/// [`super::holder`]); every scenario of this module then runs with it.
pub trait Driver: Sync {
    type Workload: Workload;
    type Call: PluginCall;

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
    /// The executions of `plugin` running `command` for the CNI ID `id`,
    /// oldest first.
    fn calls(&self, plugin: PortPlugin, command: &str, id: &str) -> Vec<Self::Call>;
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

    /// The calls of `plugin` running `command` for `workload`.
    pub fn calls(&self, plugin: PortPlugin, command: &str, workload: &D::Workload) -> Vec<D::Call> {
        self.driver.calls(plugin, command, workload.cni_id())
    }

    /// `expected` calls of `plugin` running `command` for `workload`, none
    /// of which failed.
    pub fn assert_calls(
        &self,
        plugin: PortPlugin,
        command: &str,
        workload: &D::Workload,
        expected: usize,
    ) -> Vec<D::Call> {
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
                call.exit_code().is_none_or(|code| code == 0),
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
