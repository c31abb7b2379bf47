//! Crash safety of every multi-step change of the pinned state (issue 52):
//! a resize (`maxMappings` and `conntrackSize` together, so every table
//! of both is renamed, but `owner_slots` and `conntrack_close`, which keep
//! their floors), the load of a new set of programs and the attach pass that
//! moves every attachment to them, and the first install. The plugin is
//! killed with SIGKILL right after each step in turn (the test-only
//! `EPM_TEST_CRASH_AFTER`, see `portmap-user/src/dataplane/crash.rs`);
//! then
//! - `status` tells the truth: a change left midway is a problem naming
//!   `reconcile`, and an attached program that reads tables no longer
//!   pinned (a split dataplane) is named as such;
//! - the established flow keeps going;
//! - the next plugin run finishes the change: a container DELeted then has
//!   its port dead from outside, one ADDed then is reachable from outside,
//!   and `status` is healthy;
//! - the agent's pass, and `ebpf-portmap reconcile`, finish it as well.
//!
//! Real traffic from the external client through the reference bridge
//! chain. Needs root.

use std::net::IpAddr;
use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

use portmap_tests::cni::CniRunner;
use portmap_tests::topology::{NODE_IP4, NODE_IP6, PLUGIN_LOG};
use portmap_tests::traffic::{TcpSession, echo_reply, tcp_connect, tcp_echo_server, tcp_request};
use portmap_tests::world::{GONE, PROBE, World, expect_unreachable, sock};
use portmap_tests::{Conflist, PortMapping, plugin_bin};
use serde_json::Value;

/// The variable `dataplane::crash` reads (test-only).
const CRASH_ENV: &str = "EPM_TEST_CRASH_AFTER";

/// The steps of a resize of every table, in the order a run takes them
/// (`resize.rs`, then `attach.rs`'s load and attach pass).
const RESIZE_STEPS: [&str; 14] = [
    "resize-begun",
    "load-pinned-one",
    "load-pinned",
    "resize-copied",
    "resize-renamed-mappings",
    "resize-renamed-counters",
    "resize-renamed-conntrack",
    "resize-renamed-conntrack_other",
    "attach-required",
    "attach-uplink",
    "attach-port",
    "hook-updated",
    "attach-hooks",
    "attach-recorded",
];

/// The steps after which the old programs still run somewhere while a
/// table they read is no longer pinned: `status` must name the split.
const SPLIT_STEPS: [&str; 5] = [
    "resize-renamed-mappings",
    "resize-renamed-counters",
    "resize-renamed-conntrack",
    "resize-renamed-conntrack_other",
    "attach-required",
];

/// The steps of the first install (nothing pinned before).
const INSTALL_STEPS: [&str; 6] = [
    "load-pinned-one",
    "load-pinned",
    "attach-required",
    "attach-uplink",
    "attach-hooks",
    "attach-recorded",
];

/// `steps`, or those of them named in `EPM_CRASH_STEPS` (comma-separated),
/// to run a few by hand.
fn chosen<'a>(steps: &[&'a str]) -> Vec<&'a str> {
    let Ok(only) = std::env::var("EPM_CRASH_STEPS") else {
        return steps.to_vec();
    };
    let only: Vec<&str> = only.split(',').collect();
    steps.iter().copied().filter(|s| only.contains(s)).collect()
}

/// `list` with `maxMappings` and `conntrackSize` set to `size`.
fn sized(list: &Conflist, size: u64) -> Conflist {
    let mut json = list.json().clone();
    json["plugins"][1]["maxMappings"] = Value::from(size);
    json["plugins"][1]["conntrackSize"] = Value::from(size);
    Conflist::from_json(json).expect("conflist")
}

/// The reference chain of each kind of network.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Network {
    /// bridge: the pods' veths are bridge ports.
    Bridge,
    /// ptp, `interfaces: ["eth0"]`: each pod's veth carries the programs
    /// itself.
    Routed,
}

fn world_of(network: Network) -> World {
    World::with(|name, pins, data| {
        let list = match network {
            Network::Bridge => {
                portmap_tests::bridge_conflist(name, "ebpf-portmap", Some(pins), data)
            }
            Network::Routed => {
                // The uplink named, as on a Kubernetes node: the other
                // pods' veths are then attachments of earlier runs, which
                // the pass moves after the uplinks (`attach-pinned`).
                let mut json = portmap_tests::ptp_conflist(name, "ebpf-portmap", Some(pins), data)
                    .json()
                    .clone();
                json["plugins"][1]["interfaces"] = serde_json::json!(["eth0"]);
                Conflist::from_json(json).expect("conflist")
            }
        };
        sized(&list, 1024)
    })
}

fn world() -> World {
    world_of(Network::Bridge)
}

/// A runner of the world's plugins that dies after `step`.
fn crashing_runner(world: &World, step: &str) -> CniRunner {
    CniRunner::new(world.plugins.paths(), &world.node.ns).with_env(CRASH_ENV, step)
}

/// ADD of container `id` mapping `host_port` by `runner` with `list`,
/// which must be killed by SIGKILL after `step`.
fn add_killed(world: &World, runner: &CniRunner, list: &Conflist, id: &str, step: &str) {
    let container = world.node.add_container(id);
    let failure = runner
        .add(
            list,
            &container.with_port_mappings(&[PortMapping::tcp(8099, 80)]),
        )
        .map(|_| ())
        .expect_err("the ADD that was to be killed succeeded");
    let signal = failure.exit_status.and_then(|status| status.signal());
    assert_eq!(
        signal,
        Some(libc::SIGKILL),
        "{step}: the plugin was not killed after the step (is the step reached?): {failure}\n{}",
        plugin_log(world)
    );
    let log = plugin_log(world);
    assert!(
        log.contains(&format!("{CRASH_ENV}={step}: killing")),
        "{step}: no kill of that step in the log:\n{log}"
    );
}

fn plugin_log(world: &World) -> String {
    std::fs::read_to_string(world.node.data_dir().join(PLUGIN_LOG)).unwrap_or_default()
}

fn status(world: &World) -> Value {
    let out = world.operator(&["status", "--json"]);
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "status JSON: {e}\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// `status` right after the kill at `step`: unhealthy with the repair
/// named until the pass record is written, and naming the split where
/// the old programs read tables no longer pinned.
fn assert_status_after_kill(world: &World, step: &str, split_expected: bool) {
    let status = status(world);
    let problems: Vec<&str> = status["problems"]
        .as_array()
        .expect("problems")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    if step == "attach-recorded" {
        // The change was done: what is left is the ADD's own part.
        assert_eq!(status["changeUnfinished"], false, "{step}: {status:#}");
        assert_eq!(
            status["splitAttachments"],
            Value::Array(Vec::new()),
            "{step}"
        );
        return;
    }
    assert_eq!(
        status["healthy"], false,
        "{step}: status says healthy after a kill midway: {status:#}"
    );
    assert!(
        problems.iter().any(|p| p.contains("reconcile")),
        "{step}: no problem names the repair: {problems:#?}"
    );
    let splits = status["splitAttachments"]
        .as_array()
        .expect("splitAttachments");
    if split_expected {
        assert!(
            !splits.is_empty()
                && problems.iter().any(|p| p.contains("the dataplane is split")
                    || p.contains("none of the pinned programs")),
            "{step}: the old programs read tables no longer pinned, status does not say so: {status:#}"
        );
    }
}

/// The flow opened before the kill answers.
fn assert_flow(world: &World, session: &mut TcpSession, when: &str) {
    match session.request(when, PROBE) {
        Ok(answer) => assert_eq!(answer, echo_reply("web", when), "{when}"),
        Err(e) => panic!(
            "{when}: the established flow was lost: {e}\ncounters: {:#}\n{}",
            world.counters(),
            world.dump()
        ),
    }
}

/// New connections to `port` on both families answer from `identity`.
fn assert_reachable(world: &World, port: u16, identity: &str, when: &str) {
    for node in [IpAddr::V4(NODE_IP4), IpAddr::V6(NODE_IP6)] {
        world.expect_answer(
            &format!("{when}: {identity} via {node}:{port}"),
            tcp_request(&world.node.ext, sock(node, port), "hi", PROBE),
            &echo_reply(identity, "hi"),
        );
    }
}

fn assert_dead(port: u16, when: &str, world: &World) {
    for node in [IpAddr::V4(NODE_IP4), IpAddr::V6(NODE_IP6)] {
        expect_unreachable(
            &format!("{when}: DELeted container via {node}:{port}"),
            tcp_request(&world.node.ext, sock(node, port), "late", GONE),
        );
    }
}

/// How the change left midway is finished.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Finisher {
    /// The next CNI calls: a DEL, then an ADD.
    Plugin,
    /// The node agent's pass.
    Agent,
    /// `ebpf-portmap reconcile`.
    Reconcile,
}

/// One kill of a resize at `step`, then its repair by `finisher`, checked
/// end to end.
fn resize_killed_at(step: &str, finisher: Finisher) {
    resize_killed_on(Network::Bridge, step, finisher);
}

fn resize_killed_on(network: Network, step: &str, finisher: Finisher) {
    let world = world_of(network);
    let web = world.node.add_container("web");
    let _web_server = tcp_echo_server(&web.ns, 80, "web");
    world.add(&web, &[PortMapping::tcp(8080, 80)]);
    let old = world.node.add_container("old");
    let _old_server = tcp_echo_server(&old.ns, 80, "old");
    let old_mappings = [PortMapping::tcp(8090, 80)];
    world.add(&old, &old_mappings);
    let mut flow = tcp_connect(&world.node.ext, sock(NODE_IP4, 8080), PROBE)
        .unwrap_or_else(|e| panic!("connect: {e}\n{}", world.dump()));
    assert_flow(&world, &mut flow, "before the kill");
    assert_reachable(&world, 8090, "old", "before the kill");

    let grown = sized(&world.list, 2048);
    let crashing = crashing_runner(&world, step);
    add_killed(&world, &crashing, &grown, "crashed", step);
    assert_status_after_kill(&world, step, SPLIT_STEPS.contains(&step));
    assert_flow(&world, &mut flow, &format!("{step}: after the kill"));

    match finisher {
        Finisher::Plugin => {}
        Finisher::Agent => {
            let conf = world.node.data_dir().join("crash-agent.conflist");
            std::fs::write(&conf, grown.json().to_string()).expect("write the conflist");
            let agent = portmap_tests::agent::Agent::start_with_conf(&world, &conf, &[]);
            agent.wait_ready(Duration::from_secs(20), &format!("{step}: after the kill"));
            let status = status(&world);
            assert_eq!(
                status["healthy"],
                true,
                "{step}: the agent is ready but status is not healthy: {status:#}\n{}",
                agent.log_text()
            );
        }
        Finisher::Reconcile => {
            let conf = world.node.data_dir().join("crash.conflist");
            std::fs::write(&conf, grown.json().to_string()).expect("write the conflist");
            let out = world
                .node
                .ns
                .command(plugin_bin())
                .arg("reconcile")
                .arg("--cni-conf")
                .arg(&conf)
                .env_remove("CNI_COMMAND")
                .output()
                .expect("run ebpf-portmap reconcile");
            assert!(
                out.status.success(),
                "{step}: reconcile: {}{}",
                String::from_utf8_lossy(&out.stderr),
                String::from_utf8_lossy(&out.stdout)
            );
            let status = status(&world);
            assert_eq!(
                status["healthy"], true,
                "{step}: reconcile did not repair: {status:#}"
            );
        }
    }

    // The runtime's DEL of the container whose ADD was killed, and of
    // `old`: its port is dead, whatever programs ran before.
    let crashed = world.node.add_container("crashed");
    world
        .runner
        .del(
            &grown,
            &crashed.with_port_mappings(&[PortMapping::tcp(8099, 80)]),
        )
        .unwrap_or_else(|e| panic!("{step}: DEL of the killed ADD's container: {e}"));
    world
        .runner
        .del(&grown, &old.with_port_mappings(&old_mappings))
        .unwrap_or_else(|e| panic!("{step}: DEL of old: {e}\n{}", world.dump()));
    assert_dead(8090, &format!("{step}: after the DEL"), &world);

    let late = world.node.add_container("late");
    let _late_server = tcp_echo_server(&late.ns, 80, "late");
    world
        .runner
        .add(
            &grown,
            &late.with_port_mappings(&[PortMapping::tcp(8091, 80)]),
        )
        .unwrap_or_else(|e| panic!("{step}: ADD after the kill: {e}\n{}", world.dump()));
    assert_reachable(&world, 8091, "late", &format!("{step}: after the kill"));
    assert_reachable(&world, 8080, "web", &format!("{step}: after the kill"));
    assert_dead(8090, &format!("{step}: after the ADD"), &world);
    assert_flow(&world, &mut flow, &format!("{step}: after the repair"));
    let status = status(&world);
    assert_eq!(
        status["healthy"], true,
        "{step}: after the repair: {status:#}"
    );
    for (table, size) in [("mappings", 2048), ("conntrack", 2048)] {
        let open = status["maps"]
            .as_array()
            .and_then(|maps| maps.iter().find(|m| m["name"] == table))
            .map(|m| m["maxEntries"].clone());
        assert_eq!(
            open,
            Some(Value::from(size)),
            "{step}: {table} resized by the end: {:#}",
            status["maps"]
        );
    }
}

#[test]
fn a_resize_killed_after_any_step_is_finished_by_the_next_plugin_run() {
    for step in chosen(&RESIZE_STEPS) {
        eprintln!("resize killed after {step}");
        resize_killed_at(step, Finisher::Plugin);
    }
}

/// The steps that split the dataplane before issue 52, alone: what the
/// VM guests run (under TCG every step pays the verifier three times).
#[test]
fn a_resize_killed_after_its_last_rename_is_finished_by_the_next_plugin_run() {
    for step in chosen(&["resize-renamed-conntrack_other", "attach-uplink"]) {
        eprintln!("resize killed after {step}");
        resize_killed_at(step, Finisher::Plugin);
    }
}

/// On a routed network every pod's veth carries the programs: the pass
/// moves the other pods' attachments too (`attach-pinned`), and a run
/// killed before it leaves them on tables no longer pinned.
#[test]
fn a_resize_on_a_routed_network_killed_midway_is_finished_by_the_next_plugin_run() {
    for step in chosen(&[
        "resize-renamed-conntrack_other",
        "attach-required",
        "attach-uplink",
        "attach-pinned",
        "attach-recorded",
    ]) {
        eprintln!("resize on ptp killed after {step}");
        resize_killed_on(Network::Routed, step, Finisher::Plugin);
    }
}

#[test]
fn a_resize_killed_after_its_renames_is_finished_by_the_agent() {
    for step in chosen(&["resize-renamed-conntrack_other", "attach-uplink"]) {
        eprintln!("resize killed after {step}, agent");
        resize_killed_at(step, Finisher::Agent);
    }
}

#[test]
fn a_resize_killed_after_its_renames_is_finished_by_reconcile() {
    for step in chosen(&["resize-renamed-conntrack_other", "attach-required"]) {
        eprintln!("resize killed after {step}, reconcile");
        resize_killed_at(step, Finisher::Reconcile);
    }
}

/// The first ADD of a node, killed after each step of the install: the
/// next ADD finishes it, and both containers are reachable.
#[test]
fn an_install_killed_after_any_step_is_finished_by_the_next_add() {
    for step in chosen(&INSTALL_STEPS) {
        eprintln!("install killed after {step}");
        let world = world();
        let crashing = crashing_runner(&world, step);
        add_killed(&world, &crashing, &world.list, "crashed", step);
        assert_status_after_kill(&world, step, false);
        let crashed = world.node.add_container("crashed");
        world
            .runner
            .del(
                &world.list,
                &crashed.with_port_mappings(&[PortMapping::tcp(8099, 80)]),
            )
            .unwrap_or_else(|e| panic!("{step}: DEL of the killed ADD's container: {e}"));
        let web = world.node.add_container("web");
        let _server = tcp_echo_server(&web.ns, 80, "web");
        world.add(&web, &[PortMapping::tcp(8080, 80)]);
        assert_reachable(&world, 8080, "web", &format!("{step}: after the next ADD"));
        assert_dead(8099, &format!("{step}: the killed ADD's port"), &world);
        let status = status(&world);
        assert_eq!(
            status["healthy"], true,
            "{step}: after the next ADD: {status:#}"
        );
    }
}
