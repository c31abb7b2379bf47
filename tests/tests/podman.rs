//! End to end with a real container runtime: Debian's podman 4.3 with its CNI
//! backend publishes ports (`podman run -p`) through a bridge conflist whose
//! port-mapping plugin is `ebpf-portmap`, and the same test runs with the
//! upstream `portmap` in its place, so the checks themselves are proven
//! against the reference.
//!
//! podman runs inside the node namespace of the standard test world (see
//! `portmap_tests::topology`) with its own configuration, storage, CNI
//! directory and private mount namespace (see `portmap_tests::podman`),
//! driven through the runtime harness (`portmap_tests::runtime`), whose
//! scenarios the containerd tests run too. Per plugin, one run of
//! [`podman_publishes_ports_through`]:
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
//! The field's cases (issue 33), the runtime harness's scenarios that the
//! containerd tests run too: TCP and UDP 53 on one host port, Kubernetes'
//! hostPort conformance case and its scheduler twin (ours refuses the
//! overlap: the refused ADD is found in the recorder by `K8S_POD_NAME`,
//! which podman sets to the container's name), and `conditionsV4`/`V6`.
//!
//! Both tests are `#[ignore]`d: they need podman, runc, conmon and
//! busybox-static. `cargo xtask e2e-podman` installs those and runs them (and
//! `cargo xtask test` does, unless `--skip podman` or EPM_SKIP_PODMAN=1).

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::time::Instant;

use portmap_tests::plugin_bin;
use portmap_tests::podman::{ContainerInfo, PodmanDriver};
use portmap_tests::runtime::PortPlugin;
use portmap_tests::runtime::e2e::{
    PARALLEL, check_fleet_member, conditions_restrict_who_reaches_a_host_port, fleet_at_once,
    hostport_conformance, nothing_translated, publish_and_reach, tcp_and_udp_share_a_host_port,
    web_ports, wildcard_then_node_ip_is_refused,
};
use portmap_tests::topology::{NODE_IP4, NODE_IP6};
use portmap_tests::traffic::{echo_reply, http_get, udp_request};
use portmap_tests::world::{GONE, PROBE, expect_unreachable, operator_json, sock};
use portmap_tests::{Node, PortMapping};

/// One test's world: podman on the standard node.
type E2e = portmap_tests::runtime::E2e<PodmanDriver>;

/// Where ebpf-portmap's socket hooks go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HooksAt {
    /// The test's own child cgroup (`cgroupPath` set).
    TestCgroup,
    /// `cgroupPath` unset, as the minimal conflist leaves it: the root of
    /// the machine's cgroup2 hierarchy, where every process is.
    Default,
}

/// podman with `plugin` (and ebpf-portmap's `fastPath` on if `fast_path`).
fn e2e(plugin: PortPlugin, fast_path: bool, hooks_at: HooksAt) -> E2e {
    let node = Node::new();
    let probe = Path::new(env!("CARGO_BIN_EXE_probe"));
    let driver = PodmanDriver::start(
        &node,
        plugin,
        |entry| {
            if fast_path {
                entry.insert("fastPath".to_owned(), true.into());
            }
            if hooks_at == HooksAt::Default {
                entry.remove("cgroupPath");
            }
        },
        probe,
    );
    E2e {
        driver,
        node,
        probe: probe.to_path_buf(),
    }
}

/// With `fastPath`: the dataplane handed packets over both ways (the
/// checks before passed through it).
fn assert_fast_path_taken(t: &E2e) {
    let status = operator_json(&t.node.ns, t.driver.pins.path(), "status");
    for reason in ["fast_forward", "fast_reply"] {
        assert!(
            status["counters"][reason].as_u64().is_some_and(|n| n > 0),
            "{reason} not counted: {:#}",
            status["counters"]
        );
    }
}

/// The running container `name` as podman sees it now.
fn inspect(t: &E2e, name: &str) -> ContainerInfo {
    t.driver
        .inspect(name)
        .unwrap_or_else(|e| panic!("{e}\n{}", t.dump()))
}

fn podman_publishes_ports_through(plugin: PortPlugin, fast_path: bool) {
    let started = Instant::now();
    let t = e2e(plugin, fast_path, HooksAt::TestCgroup);
    let ready_at = started.elapsed();
    let node_ip = IpAddr::V4(NODE_IP4);
    let both = [node_ip, IpAddr::V6(NODE_IP6)];
    let web_ports = web_ports();

    // 1. One container, TCP and UDP, both families, from outside and inside.
    let web = publish_and_reach(&t, plugin, "web");
    if fast_path {
        assert_fast_path_taken(&t);
    }

    // 2. Stop: the network is torn down and nothing is left. Start: a new
    // network namespace (and maybe new addresses), translated again.
    t.driver.podman(&["stop", "--time", "0", "web"]);
    t.assert_calls(plugin, "DEL", &web, 1);
    t.assert_no_translations(plugin, &web, "after podman stop");
    expect_unreachable(
        "a stopped container's host port",
        http_get(&t.node.ext, sock(NODE_IP4, 8080), GONE).map(|r| r.body),
    );
    t.driver.podman(&["start", "web"]);
    let web = inspect(&t, "web");
    t.assert_calls(plugin, "ADD", &web, 2);
    t.assert_translations(plugin, &web, &web_ports, "after podman start");
    portmap_tests::runtime::e2e::reachable(&t, plugin, &web);

    // 3. Network reload (podman re-runs DEL and ADD in the same namespace).
    t.driver.podman(&["network", "reload", "web"]);
    let web = inspect(&t, "web");
    t.assert_calls(plugin, "DEL", &web, 2);
    t.assert_calls(plugin, "ADD", &web, 3);
    t.assert_translations(plugin, &web, &web_ports, "after podman network reload");
    t.wait_serving(&web, node_ip, 8080, Some(8053));
    t.check_external(&web, &both, 8080, Some(8053));

    // 4. A fleet started at once, each with its own TCP and UDP port; then
    // `network reload --all`: each again as podman sees it now (a reload
    // may readdress it), all still reachable.
    let fleet_started = Instant::now();
    let fleet = fleet_at_once(&t, plugin);
    let fleet_took = fleet_started.elapsed();
    t.driver.podman(&["network", "reload", "--all"]);
    let fleet: Vec<ContainerInfo> = (0..PARALLEL)
        .zip(&fleet)
        .map(|(i, before)| {
            let container = inspect(&t, &before.name);
            assert_eq!(
                container.id, before.id,
                "the same container after the reload"
            );
            t.assert_calls(plugin, "ADD", &container, 2);
            check_fleet_member(
                &t,
                plugin,
                i,
                &container,
                "after podman network reload --all",
            );
            container
        })
        .collect();
    let web = inspect(&t, "web");
    t.assert_calls(plugin, "DEL", &web, 3);
    t.assert_calls(plugin, "ADD", &web, 4);
    t.assert_translations(
        plugin,
        &web,
        &web_ports,
        "after podman network reload --all",
    );
    t.wait_serving(&web, node_ip, 8080, Some(8053));
    t.check_external(&web, &both, 8080, Some(8053));

    // 5. rm -f: this container's translations go, nobody else's; its host
    // port is free for the next container.
    t.remove_workload(&web);
    t.assert_calls(plugin, "DEL", &web, 4);
    t.assert_no_translations(plugin, &web, "after podman rm -f");
    expect_unreachable(
        "a removed container's host port",
        http_get(&t.node.ext, sock(NODE_IP4, 8080), GONE).map(|r| r.body),
    );
    for (i, container) in (0..PARALLEL).zip(&fleet) {
        t.assert_translations(
            plugin,
            container,
            &portmap_tests::runtime::e2e::fleet_ports(i),
            "after another container's rm",
        );
    }
    t.expect_answer(
        "the fleet after another container's rm",
        http_get(&t.node.ext, sock(NODE_IP4, 8100), PROBE).map(|r| r.body),
        &fleet[0].name,
    );
    let again_ports = [PortMapping::tcp(8080, 80)];
    let again = t.run("again", &again_ports);
    t.assert_translations(
        plugin,
        &again,
        &again_ports,
        "a new container on a freed host port",
    );
    t.wait_serving(&again, node_ip, 8080, None);
    t.check_external(&again, &[node_ip, IpAddr::V6(NODE_IP6)], 8080, None);

    // 6. Remove everything with one `podman rm`: nothing is left on the node.
    let mut rm = vec!["rm", "--force", "--time", "0", "again"];
    rm.extend(fleet.iter().map(|c| c.name.as_str()));
    t.driver.podman(&rm);
    for container in &fleet {
        t.assert_calls(plugin, "DEL", container, 2);
    }
    t.assert_calls(plugin, "DEL", &again, 1);
    nothing_translated(&t, plugin, &[]);
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
    podman_publishes_ports_through(PortPlugin::Ours, false);
}

#[test]
#[ignore = "needs podman, runc and busybox-static: run by `cargo xtask e2e-podman`"]
fn podman_with_ebpf_portmap_fast_path() {
    podman_publishes_ports_through(PortPlugin::Ours, true);
}

#[test]
#[ignore = "needs podman, runc and busybox-static: run by `cargo xtask e2e-podman`"]
fn podman_with_upstream_portmap() {
    podman_publishes_ports_through(PortPlugin::Upstream, false);
}

// ---- the field's cases (issue 33), shared with containerd -------------------

/// [`tcp_and_udp_share_a_host_port`] on podman, then nothing is translated.
fn podman_tcp_and_udp(plugin: PortPlugin) {
    let t = e2e(plugin, false, HooksAt::TestCgroup);
    tcp_and_udp_share_a_host_port(&t, plugin);
    nothing_translated(&t, plugin, &[]);
}

#[test]
#[ignore = "needs podman, runc and busybox-static: run by `cargo xtask e2e-podman`"]
fn podman_tcp_and_udp_on_one_host_port_with_ebpf_portmap() {
    podman_tcp_and_udp(PortPlugin::Ours);
}

#[test]
#[ignore = "needs podman, runc and busybox-static: run by `cargo xtask e2e-podman`"]
fn podman_tcp_and_udp_on_one_host_port_with_upstream_portmap() {
    podman_tcp_and_udp(PortPlugin::Upstream);
}

/// [`hostport_conformance`], then (ours only)
/// [`wildcard_then_node_ip_is_refused`], then nothing is translated.
fn podman_conformance(plugin: PortPlugin) {
    let t = e2e(plugin, false, HooksAt::TestCgroup);
    for container in hostport_conformance(&t, plugin) {
        t.remove_workload(&container);
    }
    if plugin == PortPlugin::Ours {
        // Upstream does not detect conflicts (it relies on the scheduler).
        wildcard_then_node_ip_is_refused(&t);
    }
    nothing_translated(&t, plugin, &[]);
}

#[test]
#[ignore = "needs podman, runc, busybox-static and curl: run by `cargo xtask e2e-podman`"]
fn podman_hostport_conformance_with_ebpf_portmap() {
    podman_conformance(PortPlugin::Ours);
}

#[test]
#[ignore = "needs podman, runc, busybox-static and curl: run by `cargo xtask e2e-podman`"]
fn podman_hostport_conformance_with_upstream_portmap() {
    podman_conformance(PortPlugin::Upstream);
}

/// [`conditions_restrict_who_reaches_a_host_port`] on podman (the conflist
/// it reads carries `conditionsV4`/`conditionsV6`), then nothing is
/// translated.
#[test]
#[ignore = "needs podman, runc and busybox-static: run by `cargo xtask e2e-podman`"]
fn podman_conditions_restrict_who_reaches_a_host_port() {
    let t = e2e(PortPlugin::Ours, false, HooksAt::TestCgroup);
    conditions_restrict_who_reaches_a_host_port(&t);
    nothing_translated(&t, PortPlugin::Ours, &[]);
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
            .arg(t.driver.pins.path())
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

/// Our programs attached to the root of the cgroup2 hierarchy (where the
/// hooks go without `cgroupPath`), as `bpftool cgroup tree` lists them.
/// Programs in child cgroups are other tests' (each hooks its own cgroup),
/// possibly running at the same time.
fn root_cgroup_programs() -> Vec<String> {
    let out = std::process::Command::new("bpftool")
        .args(["cgroup", "tree"])
        .output()
        .expect("run bpftool cgroup tree");
    let root = portmap_tests::cgroup::cgroup2_mount();
    let mut in_root = false;
    let mut found = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        if line.starts_with('/') {
            in_root = Path::new(line.trim()) == root;
        } else if in_root && line.contains("portmap_") {
            found.push(line.to_owned());
        }
    }
    found
}

/// Issue #28, as a new user met it: podman with the minimal conflist (no
/// `cgroupPath`: the socket hooks on the machine's cgroup2 root, where the
/// test's own client threads are too) and an external client that is
/// another network namespace joined to the node by a veth, with no route
/// beyond the shared subnet. Every published port answers it; the hooks
/// rewrite none of its sockets. At the end nothing of ours is left on the
/// cgroup2 root.
fn podman_serves_a_client_namespace_with_the_default_cgroup() {
    let t = e2e(PortPlugin::Ours, false, HooksAt::Default);
    let uninstall = UninstallOnDrop(&t);
    let client = t
        .node
        .add_side_link("side0", "198.51.100.1/24", "198.51.100.2/24");
    let side = IpAddr::V4(Ipv4Addr::new(198, 51, 100, 1));
    let web = t.run("web", &web_ports());
    t.wait_serving(&web, IpAddr::V4(NODE_IP4), 8080, Some(8053));
    // The external client of the other tests (routed to the pods too).
    t.check_external(
        &web,
        &[IpAddr::V4(NODE_IP4), IpAddr::V6(NODE_IP6)],
        8080,
        Some(8053),
    );
    let tcp = sock(side, 8080);
    let body = http_get(&client, tcp, PROBE).map(|r| r.body);
    t.expect_answer(&format!("client namespace -> {tcp}"), body, &web.name);
    let udp = sock(side, 8053);
    t.expect_answer(
        &format!("client namespace -> {udp}/udp"),
        udp_request(&client, udp, "side", PROBE),
        &echo_reply(&web.name, "side"),
    );
    let status = operator_json(&t.node.ns, t.driver.pins.path(), "status");
    assert_eq!(
        status["counters"]["sock_translated"], 0,
        "no socket of another namespace may be rewritten: {:#}",
        status["counters"]
    );
    assert!(
        !root_cgroup_programs().is_empty(),
        "bpftool cgroup tree lists our hooks on the cgroup2 root {} while the container runs",
        portmap_tests::cgroup::cgroup2_mount().display()
    );
    t.remove_workload(&web);
    drop(uninstall);
    assert_eq!(
        root_cgroup_programs(),
        Vec::<String>::new(),
        "bpftool cgroup tree still lists programs of ours on the cgroup2 root"
    );
}

#[test]
#[ignore = "needs podman, runc and busybox-static: run by `cargo xtask e2e-podman`"]
fn podman_with_ebpf_portmap_default_cgroup_and_a_client_namespace() {
    podman_serves_a_client_namespace_with_the_default_cgroup();
}
