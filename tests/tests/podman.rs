//! End to end with a real container runtime: Debian's podman 4.3 with its CNI
//! backend publishes ports (`podman run -p`) through a bridge conflist whose
//! port-mapping plugin is `ebpf-portmap`, and the same test runs with the
//! upstream `portmap` in its place, so the checks themselves are proven
//! against the reference.
//!
//! podman runs inside the node namespace of the standard test world (see
//! `portmap_tests::topology`) with its own configuration, storage, CNI
//! directory and private mount namespace (see `portmap_tests::podman`). Per
//! plugin, one run of [`podman_publishes_ports_through`]:
//! 1. `podman run -d -p 8080:80 -p 8053:53/udp`: the plugin was called with
//!    the container's ID, the node holds exactly the expected translations
//!    (both families, both protocols), and the container answers from the
//!    external namespace over IPv4 and IPv6, TCP and UDP, and from the node
//!    itself to its own addresses and to localhost;
//! 2. `podman stop`, `podman start`: nothing is left while it is stopped, and
//!    everything works again with the new addresses;
//! 3. `podman network reload`: still exactly one set of translations, working;
//! 4. eight `podman run` at once with distinct ports: all reachable; then
//!    `podman network reload --all`: all still reachable;
//! 5. `podman rm -f`: the container's translations are gone, the others'
//!    untouched, and a new container gets its host port;
//! 6. `podman rm -f` of everything: no translation is left on the node.
//!
//! Both tests are `#[ignore]`d: they need podman, runc, conmon and
//! busybox-static. `cargo xtask e2e-podman` installs those and runs them (and
//! `cargo xtask test` does, unless `--skip-podman` or EPM_SKIP_PODMAN=1).

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;

use portmap_tests::podman::{ContainerInfo, Podman};
use portmap_tests::topology::{NODE_IP4, NODE_IP6, PLUGIN_LOG};
use portmap_tests::traffic::{ProbeError, echo_reply, http_get, udp_request};
use portmap_tests::world::{GONE, PROBE, expect_unreachable, operator_json, sock};
use portmap_tests::{Node, PinRoot, PluginDirs, PortMapping, bridge_conflist, plugin_bin};

/// The podman network (the conflist's name; podman's config is private).
const NETWORK: &str = "epm-e2e";
/// How long a freshly started container may take to answer.
const READY: Duration = Duration::from_secs(20);
/// The fleet started at once.
const PARALLEL: u16 = 8;

/// Where ebpf-portmap's socket hooks go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HooksAt {
    /// The test's own child cgroup (`cgroupPath` set).
    TestCgroup,
    /// `cgroupPath` unset, as the minimal conflist leaves it: the root of
    /// the machine's cgroup2 hierarchy, where every process is.
    Default,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PortPlugin {
    /// ebpf-portmap, with a test-owned pin root, cgroup and log file; with
    /// `fastPath` on or not.
    Ours { fast_path: bool },
    /// The reference plugin from Debian's containernetworking-plugins
    /// (iptables inside the node namespace).
    Upstream,
}

impl PortPlugin {
    fn plugin_type(self) -> &'static str {
        match self {
            PortPlugin::Ours { .. } => "ebpf-portmap",
            PortPlugin::Upstream => "portmap",
        }
    }

    /// Whether the plugin translates `[::1]:hostPort` on the node. The
    /// upstream plugin does not: IPv6 has no `route_localnet`, so a packet
    /// from ::1 can never leave the loopback device after DNAT (its README
    /// says localhost works for IPv4 only; here the connection hangs).
    fn translates_ipv6_loopback(self) -> bool {
        matches!(self, PortPlugin::Ours { .. })
    }
}

/// One DNAT the node holds: protocol and host port to a container address.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Translation {
    protocol: String,
    host_port: u16,
    container: SocketAddr,
}

/// Everything one run needs. Field order is drop order: podman goes first
/// (removing its containers runs the CNI DEL while plugins, pin root and
/// namespaces still exist).
struct E2e {
    podman: Podman,
    plugins: PluginDirs,
    pins: PinRoot,
    node: Node,
    plugin: PortPlugin,
}

impl E2e {
    fn new(plugin: PortPlugin) -> E2e {
        E2e::with_hooks_at(plugin, HooksAt::TestCgroup)
    }

    fn with_hooks_at(plugin: PortPlugin, hooks_at: HooksAt) -> E2e {
        let node = Node::new();
        let pins = PinRoot::new();
        // Shims that log every execution: evidence the plugin really ran
        // (podman drops a network whose plugin it cannot find with only a
        // warning).
        let plugins = PluginDirs::traced();
        let mut conflist = bridge_conflist(
            NETWORK,
            plugin.plugin_type(),
            Some(pins.path()),
            node.data_dir(),
        );
        if plugin == (PortPlugin::Ours { fast_path: true }) {
            let mut json = conflist.json().clone();
            json["plugins"][1]["fastPath"] = Value::Bool(true);
            conflist = portmap_tests::Conflist::from_json(json).expect("conflist");
        }
        if hooks_at == HooksAt::Default {
            let mut json = conflist.json().clone();
            json["plugins"][1]
                .as_object_mut()
                .expect("the plugin's entry")
                .remove("cgroupPath");
            conflist = portmap_tests::Conflist::from_json(json).expect("conflist");
        }
        let podman = Podman::start(&node.ns, plugins.path(), &conflist);
        podman.import_image(Path::new(env!("CARGO_BIN_EXE_probe")));
        E2e {
            podman,
            plugins,
            pins,
            node,
            plugin,
        }
    }

    /// With `fastPath`: the dataplane handed packets over both ways (the
    /// checks above passed through it).
    fn assert_fast_path_taken(&self) {
        let status = operator_json(&self.node.ns, self.pins.path(), "status");
        for reason in ["fast_forward", "fast_reply"] {
            assert!(
                status["counters"][reason].as_u64().is_some_and(|n| n > 0),
                "{reason} not counted: {:#}",
                status["counters"]
            );
        }
    }

    /// `podman args...`, which must succeed.
    fn podman(&self, args: &[&str]) -> String {
        self.podman
            .run(args)
            .unwrap_or_else(|e| panic!("{e}\n{}", self.dump()))
    }

    /// `podman run -d` of the web image; the running container with both addresses.
    fn run(&self, name: &str, ports: &[PortMapping]) -> ContainerInfo {
        let id = self
            .podman
            .run_web(name, ports)
            .unwrap_or_else(|e| panic!("{e}\n{}", self.dump()));
        let info = self.inspect(name);
        assert_eq!(info.id, id, "podman run printed the container's ID");
        info
    }

    /// The running container `name` with an IPv4 and an IPv6 address.
    fn inspect(&self, name: &str) -> ContainerInfo {
        let info = self.podman.inspect(name);
        assert!(
            info.running && info.ipv4.is_some() && info.ipv6.is_some(),
            "{name} must be running with an address of each family on the dual-stack network: {info:?}\n{}",
            self.dump()
        );
        info
    }

    /// How often the port-mapping plugin ran `command` for `container_id`.
    fn calls(&self, command: &str, container_id: &str) -> usize {
        self.plugins
            .trace()
            .iter()
            .filter(|e| {
                e.plugin == self.plugin.plugin_type()
                    && e.command == command
                    && e.container_id == container_id
            })
            .count()
    }

    fn assert_calls(&self, command: &str, container: &ContainerInfo, expected: usize) {
        assert_eq!(
            self.calls(command, &container.id),
            expected,
            "{} {command} calls for {} ({})\n{}",
            self.plugin.plugin_type(),
            container.name,
            container.id,
            self.dump()
        );
    }

    /// Every translation on the node with the container ID that owns it,
    /// as the plugin's own state shows it: `ebpf-portmap list` for ours,
    /// the `CNI-DN-*` chains of iptables and ip6tables for upstream.
    fn all_translations(&self) -> Vec<(String, Translation)> {
        match self.plugin {
            PortPlugin::Ours { .. } => ours_translations(&self.list()),
            PortPlugin::Upstream => upstream_translations(&self.iptables_save("iptables-save"))
                .into_iter()
                .chain(upstream_translations(&self.iptables_save("ip6tables-save")))
                .collect(),
        }
    }

    /// The translations owned by `container_id`, sorted (duplicates kept).
    fn translations(&self, container_id: &str) -> Vec<Translation> {
        let mut found: Vec<Translation> = self
            .all_translations()
            .into_iter()
            .filter(|(owner, _)| owner == container_id)
            .map(|(_, t)| t)
            .collect();
        found.sort();
        found
    }

    fn assert_translations(&self, container: &ContainerInfo, ports: &[PortMapping], when: &str) {
        assert_eq!(
            self.translations(&container.id),
            expected_translations(container, ports),
            "{when}: translations of {}\n{}",
            container.name,
            self.dump()
        );
    }

    fn assert_no_translations(&self, container: &ContainerInfo, when: &str) {
        assert_eq!(
            self.translations(&container.id),
            [],
            "{when}: {} still has translations\n{}",
            container.name,
            self.dump()
        );
    }

    /// `ebpf-portmap list --json` on the node, as an operator runs it.
    fn list(&self) -> Value {
        operator_json(&self.node.ns, self.pins.path(), "list")
    }

    fn iptables_save(&self, tool: &str) -> String {
        self.node.ns.exec(tool, &["-t", "nat"])
    }

    /// Polls from the external namespace until `container` answers HTTP on
    /// `tcp_port` and, if given, the UDP echo on `udp_port` (a container
    /// takes a moment to start its servers; until then the connection is
    /// refused, or hangs on the port podman itself holds).
    fn wait_serving(&self, container: &ContainerInfo, tcp_port: u16, udp_port: Option<u16>) {
        let deadline = Instant::now() + READY;
        let tcp = sock(NODE_IP4, tcp_port);
        loop {
            let last = match http_get(&self.node.ext, tcp, Duration::from_secs(1)) {
                Ok(response) if response.body.trim() == container.name => break,
                Ok(response) => format!("{response:?}"),
                Err(e) => e.to_string(),
            };
            assert!(
                Instant::now() < deadline,
                "{} never answered on {tcp} within {READY:?}: {last}\n{}",
                container.name,
                self.dump()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        if let Some(udp_port) = udp_port {
            let udp = sock(NODE_IP4, udp_port);
            let answer = udp_request(&self.node.ext, udp, "ready", READY);
            self.expect_answer(
                &format!("{} UDP on {udp}", container.name),
                answer,
                &echo_reply(&container.name, "ready"),
            );
        }
    }

    fn expect_answer(&self, what: &str, answer: Result<String, ProbeError>, expected: &str) {
        match answer {
            Ok(got) => assert_eq!(got.trim(), expected, "{what}: answered by the wrong server"),
            Err(e) => panic!("{what}: {e}\n{}", self.dump()),
        }
    }

    fn expect_http(&self, what: &str, target: SocketAddr, container: &ContainerInfo) {
        let body = http_get(&self.node.ext, target, PROBE).map(|r| r.body);
        self.expect_answer(what, body, &container.name);
    }

    /// From the external namespace to both node addresses: HTTP on
    /// `tcp_port`, and the UDP echo on `udp_port` if given.
    fn check_external(&self, container: &ContainerInfo, tcp_port: u16, udp_port: Option<u16>) {
        for node_ip in [IpAddr::V4(NODE_IP4), IpAddr::V6(NODE_IP6)] {
            let tcp = sock(node_ip, tcp_port);
            self.expect_http(&format!("external -> {tcp}"), tcp, container);
            if let Some(udp_port) = udp_port {
                let udp = sock(node_ip, udp_port);
                let payload = format!("ext-{node_ip}");
                self.expect_answer(
                    &format!("external -> {udp}/udp"),
                    udp_request(&self.node.ext, udp, &payload, PROBE),
                    &echo_reply(&container.name, &payload),
                );
            }
        }
    }

    /// From the node's own namespace to its addresses and to localhost, by a
    /// client process in the test's cgroup (where ebpf-portmap's socket hooks
    /// are attached; for upstream the cgroup has no hooks and changes nothing).
    fn check_from_node(&self, container: &ContainerInfo, tcp_port: u16, udp_port: u16) {
        let mut targets = vec![
            IpAddr::V4(NODE_IP4),
            IpAddr::V6(NODE_IP6),
            IpAddr::V4(Ipv4Addr::LOCALHOST),
        ];
        if self.plugin.translates_ipv6_loopback() {
            targets.push(IpAddr::V6(Ipv6Addr::LOCALHOST));
        }
        for ip in targets {
            let tcp = sock(ip, tcp_port);
            let seen = self.node_probe("http", tcp, "-");
            self.expect_seen(&format!("node -> {tcp}"), seen, tcp, &container.name);
            let udp = sock(ip, udp_port);
            let seen = self.node_probe("udp", udp, "node");
            self.expect_seen(
                &format!("node -> {udp}/udp"),
                seen,
                udp,
                &echo_reply(&container.name, "node"),
            );
        }
    }

    /// Runs the `probe` client in the node namespace inside the test's cgroup.
    fn node_probe(&self, mode: &str, target: SocketAddr, payload: &str) -> Result<Seen, String> {
        let mut command = self.node.ns.command(env!("CARGO_BIN_EXE_probe"));
        command.args([mode, &target.to_string(), payload, "3000"]);
        let procs = self.pins.cgroup().procs_file();
        // SAFETY: only async-signal-safe calls between fork and exec: open,
        // write and close through std's file API on a path built before.
        unsafe {
            command.pre_exec(move || std::fs::write(&procs, b"0"));
        }
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

    fn expect_seen(&self, what: &str, seen: Result<Seen, String>, target: SocketAddr, reply: &str) {
        let seen = seen.unwrap_or_else(|e| panic!("{what}: {e}\n{}", self.dump()));
        assert_eq!(seen.reply, reply, "{what}: answered by the wrong server");
        assert_eq!(
            seen.peer,
            target.to_string(),
            "{what}: the client must see the address it dialled"
        );
    }

    /// State for failure messages: podman, the plugin's view, its calls, the node.
    fn dump(&self) -> String {
        let state = match self.plugin {
            PortPlugin::Ours { .. } => {
                let out = self
                    .node
                    .ns
                    .command(plugin_bin())
                    .args(["list", "--pin-root"])
                    .arg(self.pins.path())
                    .output();
                let list = out
                    .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                    .unwrap_or_default();
                let log = std::fs::read_to_string(self.node.data_dir().join(PLUGIN_LOG))
                    .unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(30).collect();
                format!(
                    "--- ebpf-portmap list\n{list}\n--- plugin log (newest first)\n{}",
                    tail.join("\n")
                )
            }
            // The node's diagnostics below include iptables-save.
            PortPlugin::Upstream => String::new(),
        };
        let trace: Vec<String> = self
            .plugins
            .trace()
            .iter()
            .filter(|e| e.command != "VERSION")
            .map(|e| format!("{} {} {}", e.plugin, e.command, e.container_id))
            .collect();
        format!(
            "{}\n{state}\n--- plugin executions\n{}\n{}",
            self.podman.diagnostics(),
            trace.join("\n"),
            self.node.diagnostics()
        )
    }
}

/// What the probe client saw.
#[derive(Debug)]
struct Seen {
    peer: String,
    reply: String,
}

/// Each published port of `container`, to its IPv4 and its IPv6 address.
fn expected_translations(container: &ContainerInfo, ports: &[PortMapping]) -> Vec<Translation> {
    let addresses = [
        IpAddr::V4(container.ipv4.expect("an IPv4 address")),
        IpAddr::V6(container.ipv6.expect("an IPv6 address")),
    ];
    let mut expected: Vec<Translation> = ports
        .iter()
        .flat_map(|port| {
            addresses.map(|ip| Translation {
                protocol: port.protocol.clone(),
                host_port: port.host_port,
                container: SocketAddr::new(ip, port.container_port),
            })
        })
        .collect();
    expected.sort();
    expected
}

/// `(containerID, translation)` for every entry of `ebpf-portmap list --json`.
fn ours_translations(list: &Value) -> Vec<(String, Translation)> {
    list.as_array()
        .unwrap_or_else(|| panic!("list --json is an array: {list}"))
        .iter()
        .map(|entry| {
            let text = |key: &str| {
                entry[key]
                    .as_str()
                    .unwrap_or_else(|| panic!("list entry without {key}: {entry}"))
                    .to_owned()
            };
            let translation = Translation {
                protocol: text("protocol"),
                host_port: entry["hostPort"]
                    .as_u64()
                    .and_then(|p| u16::try_from(p).ok())
                    .unwrap_or_else(|| panic!("list entry without hostPort: {entry}")),
                container: text("container")
                    .parse()
                    .unwrap_or_else(|e| panic!("list entry's container address: {e}: {entry}")),
            };
            (text("containerID"), translation)
        })
        .collect()
}

/// `(containerID, translation)` for every DNAT rule the upstream plugin wrote
/// in `iptables-save -t nat` output: `CNI-HOSTPORT-DNAT` jumps to one
/// `CNI-DN-*` chain per container, commented with the container's ID; that
/// chain's DNAT rules are the translations.
fn upstream_translations(save: &str) -> Vec<(String, Translation)> {
    let mut owner_of_chain = std::collections::BTreeMap::new();
    for line in save
        .lines()
        .filter(|l| l.starts_with("-A CNI-HOSTPORT-DNAT "))
    {
        let id = line
            .split_once("id: \\\"")
            .and_then(|(_, rest)| rest.split_once("\\\""))
            .map(|(id, _)| id.to_owned());
        if let (Some(id), Some(chain)) = (id, option_value(line, "-j")) {
            owner_of_chain.insert(chain.to_owned(), id);
        }
    }
    save.lines()
        .filter(|l| l.starts_with("-A CNI-DN-") && option_value(l, "-j") == Some("DNAT"))
        .map(|line| {
            let chain = line.split_whitespace().nth(1).unwrap_or_default();
            let owner = owner_of_chain
                .get(chain)
                .cloned()
                .unwrap_or_else(|| format!("(no CNI-HOSTPORT-DNAT jump to {chain})"));
            let parse = |option: &str| {
                option_value(line, option)
                    .unwrap_or_else(|| panic!("DNAT rule without {option}: {line}"))
            };
            let translation = Translation {
                protocol: parse("-p").to_owned(),
                host_port: parse("--dport")
                    .parse()
                    .unwrap_or_else(|e| panic!("--dport of {line}: {e}")),
                container: parse("--to-destination")
                    .parse()
                    .unwrap_or_else(|e| panic!("--to-destination of {line}: {e}")),
            };
            (owner, translation)
        })
        .collect()
}

/// The word after `option` in an iptables-save rule.
fn option_value<'a>(line: &'a str, option: &str) -> Option<&'a str> {
    let mut words = line.split_whitespace();
    words.find(|w| *w == option)?;
    words.next()
}

fn podman_publishes_ports_through(plugin: PortPlugin) {
    let started = Instant::now();
    let t = E2e::new(plugin);
    let ready_at = started.elapsed();

    // 1. One container, TCP and UDP, both families, from outside and inside.
    let web_ports = [PortMapping::tcp(8080, 80), PortMapping::udp(8053, 53)];
    let web = t.run("web", &web_ports);
    t.assert_calls("ADD", &web, 1);
    t.assert_translations(&web, &web_ports, "after podman run");
    t.wait_serving(&web, 8080, Some(8053));
    t.check_external(&web, 8080, Some(8053));
    t.check_from_node(&web, 8080, 8053);
    if plugin == (PortPlugin::Ours { fast_path: true }) {
        t.assert_fast_path_taken();
    }

    // 2. Stop: the network is torn down and nothing is left. Start: a new
    // network namespace (and maybe new addresses), translated again.
    t.podman(&["stop", "--time", "0", "web"]);
    t.assert_calls("DEL", &web, 1);
    t.assert_no_translations(&web, "after podman stop");
    expect_unreachable(
        "a stopped container's host port",
        http_get(&t.node.ext, sock(NODE_IP4, 8080), GONE).map(|r| r.body),
    );
    t.podman(&["start", "web"]);
    let web = t.inspect("web");
    t.assert_calls("ADD", &web, 2);
    t.assert_translations(&web, &web_ports, "after podman start");
    t.wait_serving(&web, 8080, Some(8053));
    t.check_external(&web, 8080, Some(8053));
    t.check_from_node(&web, 8080, 8053);

    // 3. Network reload (podman re-runs DEL and ADD in the same namespace).
    t.podman(&["network", "reload", "web"]);
    let web = t.inspect("web");
    t.assert_calls("DEL", &web, 2);
    t.assert_calls("ADD", &web, 3);
    t.assert_translations(&web, &web_ports, "after podman network reload");
    t.wait_serving(&web, 8080, Some(8053));
    t.check_external(&web, 8080, Some(8053));

    // 4. A fleet started at once, each with its own TCP and UDP port.
    let fleet_ports = |i: u16| {
        [
            PortMapping::tcp(8100 + i, 80),
            PortMapping::udp(8200 + i, 53),
        ]
    };
    let fleet_started = Instant::now();
    let fleet: Vec<ContainerInfo> = std::thread::scope(|scope| {
        let runs: Vec<_> = (0..PARALLEL)
            .map(|i| {
                let podman = &t.podman;
                scope.spawn(move || podman.run_web(&format!("par{i}"), &fleet_ports(i)))
            })
            .collect();
        runs.into_iter()
            .map(|run| run.join().expect("a podman run thread"))
            .collect::<Vec<_>>()
    })
    .into_iter()
    .enumerate()
    .map(|(i, id)| {
        let id = id.unwrap_or_else(|e| panic!("parallel podman run {i}: {e}\n{}", t.dump()));
        let info = t.inspect(&format!("par{i}"));
        assert_eq!(info.id, id);
        info
    })
    .collect();
    let fleet_took = fleet_started.elapsed();
    let fleet_ips: BTreeSet<_> = fleet.iter().map(|c| c.ipv4).collect();
    assert_eq!(
        fleet_ips.len(),
        fleet.len(),
        "distinct addresses: {fleet:?}"
    );
    // Each container again as podman sees it now (a reload may readdress it).
    let check_fleet = |when: &str, adds: usize| -> Vec<ContainerInfo> {
        (0..PARALLEL)
            .zip(&fleet)
            .map(|(i, before)| {
                let container = t.inspect(&before.name);
                assert_eq!(container.id, before.id, "{when}: same container");
                t.assert_calls("ADD", &container, adds);
                t.assert_translations(&container, &fleet_ports(i), when);
                t.wait_serving(&container, 8100 + i, Some(8200 + i));
                t.check_external(&container, 8100 + i, Some(8200 + i));
                container
            })
            .collect()
    };
    check_fleet("after parallel podman run", 1);
    t.podman(&["network", "reload", "--all"]);
    let fleet = check_fleet("after podman network reload --all", 2);
    let web = t.inspect("web");
    t.assert_calls("DEL", &web, 3);
    t.assert_calls("ADD", &web, 4);
    t.assert_translations(&web, &web_ports, "after podman network reload --all");
    t.wait_serving(&web, 8080, Some(8053));
    t.check_external(&web, 8080, Some(8053));

    // 5. rm -f: this container's translations go, nobody else's; its host
    // port is free for the next container.
    t.podman(&["rm", "--force", "--time", "0", "web"]);
    t.assert_calls("DEL", &web, 4);
    t.assert_no_translations(&web, "after podman rm -f");
    expect_unreachable(
        "a removed container's host port",
        http_get(&t.node.ext, sock(NODE_IP4, 8080), GONE).map(|r| r.body),
    );
    for (i, container) in (0..PARALLEL).zip(&fleet) {
        t.assert_translations(container, &fleet_ports(i), "after another container's rm");
    }
    t.expect_http(
        "the fleet after another container's rm",
        sock(NODE_IP4, 8100),
        &fleet[0],
    );
    let again_ports = [PortMapping::tcp(8080, 80)];
    let again = t.run("again", &again_ports);
    t.assert_translations(&again, &again_ports, "a new container on a freed host port");
    t.wait_serving(&again, 8080, None);
    t.check_external(&again, 8080, None);

    // 6. Remove everything: nothing is left on the node.
    let mut names: Vec<String> = (0..PARALLEL).map(|i| format!("par{i}")).collect();
    names.push("again".to_owned());
    let mut rm = vec!["rm", "--force", "--time", "0"];
    rm.extend(names.iter().map(String::as_str));
    t.podman(&rm);
    for container in &fleet {
        t.assert_calls("DEL", container, 2);
    }
    t.assert_calls("DEL", &again, 1);
    assert_eq!(
        t.all_translations(),
        [],
        "translations left after every container was removed\n{}",
        t.dump()
    );
    if plugin == PortPlugin::Upstream {
        for tool in ["iptables-save", "ip6tables-save"] {
            let save = t.iptables_save(tool);
            assert!(
                !save.contains(":CNI-DN-") && !save.contains("DNAT --to-destination"),
                "{tool} still has per-container chains or DNAT rules:\n{save}"
            );
        }
    }
    eprintln!(
        "podman e2e with {}: setup {:.1}s, {PARALLEL} parallel runs {:.1}s, total {:.1}s",
        plugin.plugin_type(),
        ready_at.as_secs_f64(),
        fleet_took.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
}

#[test]
#[ignore = "needs podman, runc and busybox-static: run by `cargo xtask e2e-podman`"]
fn podman_with_ebpf_portmap() {
    podman_publishes_ports_through(PortPlugin::Ours { fast_path: false });
}

#[test]
#[ignore = "needs podman, runc and busybox-static: run by `cargo xtask e2e-podman`"]
fn podman_with_ebpf_portmap_fast_path() {
    podman_publishes_ports_through(PortPlugin::Ours { fast_path: true });
}

#[test]
#[ignore = "needs podman, runc and busybox-static: run by `cargo xtask e2e-podman`"]
fn podman_with_upstream_portmap() {
    podman_publishes_ports_through(PortPlugin::Upstream);
}

/// Takes ebpf-portmap off the node when dropped (also when a check
/// failed): with `cgroupPath` unset its hooks are on the machine's cgroup2
/// root, and must not outlive the test.
struct UninstallOnDrop<'a>(&'a E2e);

impl Drop for UninstallOnDrop<'_> {
    fn drop(&mut self) {
        let t = self.0;
        let out = t
            .node
            .ns
            .command(plugin_bin())
            .args(["uninstall", "--force", "--pin-root"])
            .arg(t.pins.path())
            .env_remove("CNI_COMMAND")
            .output();
        match out {
            Ok(out) if out.status.success() => {}
            Ok(out) => eprintln!(
                "uninstall after the test: {}",
                String::from_utf8_lossy(&out.stderr)
            ),
            Err(e) => eprintln!("uninstall after the test: {e}"),
        }
    }
}

/// Our programs attached anywhere in the machine's cgroup tree, as
/// `bpftool cgroup tree` lists them.
fn our_cgroup_programs() -> Vec<String> {
    let out = std::process::Command::new("bpftool")
        .args(["cgroup", "tree"])
        .output()
        .expect("run bpftool cgroup tree");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|line| line.contains("portmap_"))
        .map(str::to_owned)
        .collect()
}

/// Issue #28, as a new user met it: podman with the minimal conflist (no
/// `cgroupPath`: the socket hooks on the machine's cgroup2 root, where the
/// test's own client threads are too) and an external client that is
/// another network namespace joined to the node by a veth, with no route
/// beyond the shared subnet. Every published port answers it; the hooks
/// rewrite none of its sockets. At the end nothing of ours is left in the
/// cgroup tree.
fn podman_serves_a_client_namespace_with_the_default_cgroup() {
    let t = E2e::with_hooks_at(PortPlugin::Ours { fast_path: false }, HooksAt::Default);
    let uninstall = UninstallOnDrop(&t);
    let client = t
        .node
        .add_side_link("side0", "198.51.100.1/24", "198.51.100.2/24");
    let side = IpAddr::V4(Ipv4Addr::new(198, 51, 100, 1));
    let ports = [PortMapping::tcp(8080, 80), PortMapping::udp(8053, 53)];
    let web = t.run("web", &ports);
    t.wait_serving(&web, 8080, Some(8053));
    // The external client of the other tests (routed to the pods too).
    t.check_external(&web, 8080, Some(8053));
    let tcp = sock(side, 8080);
    let body = http_get(&client, tcp, PROBE).map(|r| r.body);
    t.expect_answer(&format!("client namespace -> {tcp}"), body, &web.name);
    let udp = sock(side, 8053);
    t.expect_answer(
        &format!("client namespace -> {udp}/udp"),
        udp_request(&client, udp, "side", PROBE),
        &echo_reply(&web.name, "side"),
    );
    let status = operator_json(&t.node.ns, t.pins.path(), "status");
    assert_eq!(
        status["counters"]["sock_translated"], 0,
        "no socket of another namespace may be rewritten: {:#}",
        status["counters"]
    );
    t.podman(&["rm", "--force", "--time", "0", "web"]);
    drop(uninstall);
    assert_eq!(
        our_cgroup_programs(),
        Vec::<String>::new(),
        "bpftool cgroup tree still lists programs of ours"
    );
}

#[test]
#[ignore = "needs podman, runc and busybox-static: run by `cargo xtask e2e-podman`"]
fn podman_with_ebpf_portmap_default_cgroup_and_a_client_namespace() {
    podman_serves_a_client_namespace_with_the_default_cgroup();
}

#[test]
fn upstream_rules_parse_into_translations() {
    // As the upstream plugin wrote them for `podman run -p 8080:80 -p 8053:53/udp`.
    let save = r#"*nat
:CNI-DN-0794e4ed92904a55f2da5 - [0:0]
:CNI-HOSTPORT-DNAT - [0:0]
-A PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT
-A CNI-DN-0794e4ed92904a55f2da5 -s 10.244.0.0/24 -p tcp -m tcp --dport 8080 -j CNI-HOSTPORT-SETMARK
-A CNI-DN-0794e4ed92904a55f2da5 -p tcp -m tcp --dport 8080 -j DNAT --to-destination 10.244.0.7:80
-A CNI-DN-0794e4ed92904a55f2da5 -p udp -m udp --dport 8053 -j DNAT --to-destination [fd44::7]:53
-A CNI-HOSTPORT-DNAT -p tcp -m comment --comment "dnat name: \"epm-e2e\" id: \"f1cf1a39\"" -m multiport --dports 8080 -j CNI-DN-0794e4ed92904a55f2da5
-A CNI-DN-ffff -p tcp -m tcp --dport 9 -j DNAT --to-destination 10.244.0.9:9
COMMIT
"#;
    let found = upstream_translations(save);
    assert_eq!(
        found,
        [
            (
                "f1cf1a39".to_owned(),
                Translation {
                    protocol: "tcp".into(),
                    host_port: 8080,
                    container: "10.244.0.7:80".parse().unwrap(),
                }
            ),
            (
                "f1cf1a39".to_owned(),
                Translation {
                    protocol: "udp".into(),
                    host_port: 8053,
                    container: "[fd44::7]:53".parse().unwrap(),
                }
            ),
            (
                "(no CNI-HOSTPORT-DNAT jump to CNI-DN-ffff)".to_owned(),
                Translation {
                    protocol: "tcp".into(),
                    host_port: 9,
                    container: "10.244.0.9:9".parse().unwrap(),
                }
            ),
        ]
    );
}

#[test]
fn list_entries_parse_into_translations() {
    let list = serde_json::json!([
        { "containerID": "abc", "protocol": "udp", "hostPort": 8053, "container": "[fd44::5]:53" },
        { "containerID": "abc", "protocol": "tcp", "hostPort": 8080, "container": "10.244.0.5:80" },
    ]);
    assert_eq!(
        ours_translations(&list),
        [
            (
                "abc".to_owned(),
                Translation {
                    protocol: "udp".into(),
                    host_port: 8053,
                    container: "[fd44::5]:53".parse().unwrap(),
                }
            ),
            (
                "abc".to_owned(),
                Translation {
                    protocol: "tcp".into(),
                    host_port: 8080,
                    container: "10.244.0.5:80".parse().unwrap(),
                }
            ),
        ]
    );
}

#[test]
fn expected_translations_cover_both_families() {
    let container = ContainerInfo {
        id: "abc".into(),
        name: "web".into(),
        running: true,
        ipv4: Some("10.244.0.5".parse().unwrap()),
        ipv6: Some("fd44::5".parse().unwrap()),
    };
    let expected = expected_translations(
        &container,
        &[PortMapping::tcp(8080, 80), PortMapping::udp(8053, 53)],
    );
    let shown: Vec<String> = expected
        .iter()
        .map(|t| format!("{}/{}->{}", t.host_port, t.protocol, t.container))
        .collect();
    assert_eq!(
        shown,
        [
            "8080/tcp->10.244.0.5:80",
            "8080/tcp->[fd44::5]:80",
            "8053/udp->10.244.0.5:53",
            "8053/udp->[fd44::5]:53",
        ]
    );
}
