//! In-place upgrade from the previous release: a node whose pins were made
//! by the old binary gets the new binary in its CNI bin directory (the way
//! an operator upgrades: the file is replaced, nothing is uninstalled), and
//! everything the old one set up keeps working under the new one.
//!
//! The previous release is built by `cargo xtask test` (xtask/src/previous.rs,
//! beside the other steps) and named by `EPM_PREVIOUS_BIN`; the tests are
//! `#[ignore]`d in plain `cargo test`, and `cargo xtask test` runs them with
//! `--ignored` once that build is done. Run by hand with `--ignored` but
//! without the binary, a test is skipped with a message; under `cargo xtask
//! test` (`EPM_REQUIRE_PREVIOUS_BIN` set) a missing binary fails it. Needs
//! root. `an_upgrade_killed_after_any_step_is_finished_by_the_next_run`
//! kills the new binary after each step of the upgrade (issue 52).

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use portmap_tests::topology::{NODE_IP4, NODE_IP6};
use portmap_tests::traffic::{
    echo_reply, tcp_connect, tcp_echo_server, tcp_request, udp_echo_server, udp_request,
};
use portmap_tests::world::{GONE, PROBE, World, expect_unreachable, sock};
use portmap_tests::{PortMapping, plugin_bin};
use serde_json::{Value, json};

const PREVIOUS_BIN_ENV: &str = "EPM_PREVIOUS_BIN";
const REQUIRED_ENV: &str = "EPM_REQUIRE_PREVIOUS_BIN";

/// The previous release's binary, or `None` (test skipped) when run by hand
/// without it.
fn previous_bin() -> Option<PathBuf> {
    match std::env::var_os(PREVIOUS_BIN_ENV) {
        Some(path) if !path.is_empty() => {
            let path = PathBuf::from(path);
            assert!(
                path.is_file(),
                "{PREVIOUS_BIN_ENV}={} does not exist",
                path.display()
            );
            Some(path)
        }
        _ if std::env::var_os(REQUIRED_ENV).is_some() => panic!(
            "{PREVIOUS_BIN_ENV} is not set, but {REQUIRED_ENV} says this run must test the upgrade"
        ),
        _ => {
            eprintln!(
                "upgrade test skipped: {PREVIOUS_BIN_ENV} is not set (cargo xtask test builds the \
                 previous release and sets it)"
            );
            None
        }
    }
}

/// Puts `binary` in place as the world's `ebpf-portmap`, atomically (a
/// rename over the old entry), as a package upgrade replaces the file.
fn install(world: &World, binary: &Path) {
    let entry = world.plugins.path().join("ebpf-portmap");
    let staged = world.plugins.path().join(".ebpf-portmap.new");
    let _ = std::fs::remove_file(&staged);
    std::os::unix::fs::symlink(binary, &staged)
        .unwrap_or_else(|e| panic!("linking {}: {e}", staged.display()));
    std::fs::rename(&staged, &entry)
        .unwrap_or_else(|e| panic!("installing {}: {e}", binary.display()));
}

fn row<'a>(list: &'a Value, host: &str) -> &'a Value {
    list.as_array()
        .expect("list is an array")
        .iter()
        .find(|r| r["host"] == host)
        .unwrap_or_else(|| panic!("no row {host} in {list:#}"))
}

#[test]
#[ignore = "needs the previous release's build (cargo xtask test runs it)"]
fn mappings_of_the_previous_release_keep_working_after_an_in_place_upgrade() {
    let Some(previous) = previous_bin() else {
        return;
    };
    let world = World::bridge();

    // The old binary sets up a container (podman's spelling: the old one
    // knows no other).
    install(&world, &previous);
    let old = world.node.add_container("old");
    let _old_tcp = tcp_echo_server(&old.ns, 80, "old");
    let _old_udp = udp_echo_server(&old.ns, 53, "old");
    let old_mappings = [PortMapping::tcp(8080, 80), PortMapping::udp(5353, 53)];
    world.add(&old, &old_mappings);
    let pods_map = world.pins.path().join("v1/maps/owner_pods");
    assert!(
        !pods_map.exists(),
        "the previous release has no pod map: is {PREVIOUS_BIN_ENV} really the old binary?"
    );
    let mut established = tcp_connect(&world.node.ext, sock(NODE_IP4, 8080), PROBE)
        .unwrap_or_else(|e| panic!("connect before the upgrade: {e}"));
    assert_eq!(
        established
            .request("before", PROBE)
            .expect("request before the upgrade"),
        echo_reply("old", "before")
    );
    // A UDP flow in the previous release's single conntrack table.
    world.expect_answer(
        "old container, UDP before the upgrade",
        udp_request(&world.node.ext, sock(NODE_IP4, 5353), "early", PROBE),
        &echo_reply("old", "early"),
    );

    // The upgrade; then a containerd pod ADDed by the new binary.
    install(&world, &plugin_bin());

    // The old build recorded no owner namespace for its pins, but its node
    // map names this node's: another node namespace pointed at the same
    // pinRoot (two kind nodes on one bpffs) is refused before it touches
    // them, and changes nothing.
    let intruder_world = World::with(|name, _pins, data| {
        portmap_tests::bridge_conflist(name, "ebpf-portmap", Some(world.pins.path()), data)
    });
    let intruder = intruder_world.node.add_container("intruder");
    let refused = intruder_world.runner.add(
        &intruder_world.list,
        &intruder.with_port_mappings(&[PortMapping::tcp(19090, 80)]),
    );
    let message = match &refused {
        Err(failure) if failure.error_code() == Some(7) => {
            failure.error_msg().unwrap_or_default().to_owned()
        }
        other => panic!(
            "an ADD from another namespace on the old pins must be refused with code 7: {other:?}"
        ),
    };
    assert!(
        message.contains("holds the state of another network namespace"),
        "{message}"
    );
    intruder_world.del(&intruder, &[PortMapping::tcp(19090, 80)]);
    assert_eq!(
        established
            .request("between", PROBE)
            .unwrap_or_else(|e| panic!("the refused intruder broke the flow: {e}")),
        echo_reply("old", "between")
    );
    let new = world.node.add_container("new");
    let _new_tcp = tcp_echo_server(&new.ns, 80, "new");
    let mut new_rt = new.attachment(json!({"portMappings": [
        {"HostPort": 18080, "ContainerPort": 80, "Protocol": "tcp", "HostIP": ""}
    ]}));
    new_rt.cni_args = vec![
        ("IgnoreUnknown".into(), "1".into()),
        ("K8S_POD_NAMESPACE".into(), "default".into()),
        ("K8S_POD_NAME".into(), "web-7f9c".into()),
    ];
    world
        .runner
        .add(&world.list, &new_rt)
        .unwrap_or_else(|e| panic!("ADD by the new binary on old pins: {e}\n{}", world.dump()));
    assert!(
        pods_map.exists(),
        "the new binary's ADD created the pod map"
    );
    assert!(
        world.pins.path().join("v1/maps/netns_owner").exists(),
        "the new binary's ADD kept the old pins as this namespace's (and recorded it)"
    );
    // The conntrack split: the UDP flow of the single table was carried
    // over into the table of other protocols (the TCP entries stay where
    // they are, the connection below shows it).
    let other = world.dump_map("conntrack_other");
    assert!(
        other.as_array().is_some_and(|entries| entries.len() >= 2),
        "the previous release's UDP flow (two entries) was copied: {other:#}"
    );

    // Traffic to both: the connection opened before the upgrade, and new ones.
    assert_eq!(
        established
            .request("after", PROBE)
            .unwrap_or_else(|e| panic!("the established connection broke: {e}\n{}", world.dump())),
        echo_reply("old", "after")
    );
    for ip in [IpAddr::V4(NODE_IP4), IpAddr::V6(NODE_IP6)] {
        world.expect_answer(
            &format!("old container, TCP via {ip}:8080"),
            tcp_request(&world.node.ext, sock(ip, 8080), "hi", PROBE),
            &echo_reply("old", "hi"),
        );
        world.expect_answer(
            &format!("old container, UDP via {ip}:5353"),
            udp_request(&world.node.ext, sock(ip, 5353), "q", PROBE),
            &echo_reply("old", "q"),
        );
        world.expect_answer(
            &format!("new container, TCP via {ip}:18080"),
            tcp_request(&world.node.ext, sock(ip, 18080), "hi", PROBE),
            &echo_reply("new", "hi"),
        );
    }

    // The counters grew to this build's reasons: the closed connections
    // above were counted (a `stats` map of the previous length would have
    // no slot for them).
    let status = portmap_tests::world::operator_json(&world.node.ns, world.pins.path(), "status");
    assert!(
        status["counters"]["ct_closed"]
            .as_u64()
            .is_some_and(|n| n > 0),
        "closes counted after the upgrade: {status:#}"
    );

    // The new binary shows the old owner (no pod known) and the new pod.
    let list = world.list();
    let old_row = row(&list, "0.0.0.0:8080/tcp");
    assert_eq!(old_row["containerID"], "old", "{old_row:#}");
    assert_eq!(old_row["podName"], Value::Null, "{old_row:#}");
    let new_row = row(&list, "[::]:18080/tcp");
    assert_eq!(new_row["containerID"], "new", "{new_row:#}");
    assert_eq!(
        (&new_row["podNamespace"], &new_row["podName"]),
        (&json!("default"), &json!("web-7f9c")),
        "{new_row:#}"
    );

    // DEL by the new binary of the container the old one added.
    world.del(&old, &old_mappings);
    drop(established);
    for ip in [IpAddr::V4(NODE_IP4), IpAddr::V6(NODE_IP6)] {
        expect_unreachable(
            "old container after its DEL",
            tcp_request(&world.node.ext, sock(ip, 8080), "late", GONE),
        );
        world.expect_answer(
            &format!("new container after the old one's DEL, via {ip}"),
            tcp_request(&world.node.ext, sock(ip, 18080), "still", PROBE),
            &echo_reply("new", "still"),
        );
    }
    let list = world.list();
    let owners: Vec<&str> = list
        .as_array()
        .expect("list is an array")
        .iter()
        .map(|r| r["containerID"].as_str().expect("containerID"))
        .collect();
    assert_eq!(
        owners,
        ["new", "new"],
        "only the new pod's mappings: {list:#}"
    );

    world
        .runner
        .del(&world.list, &new_rt)
        .unwrap_or_else(|e| panic!("DEL of the new pod: {e}"));
    world.assert_clean("after both DELs");
}

/// A node taken back to the previous release and forward again (a rollout
/// undone, then redone): the previous build's ADD puts its own socket
/// hooks in the pins, and the next ADD of this build must put this build's
/// back, though a run of this build recorded its hooks as in place before.
#[test]
#[ignore = "needs the previous release's build (cargo xtask test runs it)"]
fn after_a_downgrade_and_an_upgrade_again_this_builds_socket_hooks_run() {
    let Some(previous) = previous_bin() else {
        return;
    };
    let world = World::bridge();
    let mut added = world.add_until_hooks_recorded();
    world.assert_hooks_of_this_build("before the downgrade");

    install(&world, &previous);
    let third = world.node.add_container("third");
    world.add(&third, &[PortMapping::tcp(8083, 80)]);
    let (hooks, current) = world.hook_programs();
    assert_eq!(hooks.len(), 8, "eight hook links: {hooks:?}");
    assert!(
        hooks.iter().all(|(hook, id)| current.get(hook) != Some(id)),
        "the previous release's ADD attached its own hooks: {hooks:?}, this build's programs {current:?}"
    );

    install(&world, &plugin_bin());
    let fourth = world.node.add_container("fourth");
    world.add(&fourth, &[PortMapping::tcp(8084, 80)]);
    world.assert_hooks_of_this_build("after the upgrade again");

    added.push((third, PortMapping::tcp(8083, 80)));
    added.push((fourth, PortMapping::tcp(8084, 80)));
    for (container, mapping) in &added {
        world.del(container, std::slice::from_ref(mapping));
    }
    world.assert_clean("after the DELs");
}

/// `status --json`, healthy or not.
fn status_of(world: &World) -> Value {
    let out = world.operator(&["status", "--json"]);
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("status JSON: {e}: {}", String::from_utf8_lossy(&out.stderr)))
}

/// The steps of an upgrade in place, in the order the new build's first
/// run takes them (`attach.rs`: the load, then the attach pass), after
/// each of which the test kills it (the test-only `EPM_TEST_CRASH_AFTER`,
/// see `portmap-user/src/dataplane/crash.rs` and `tests/tests/crash.rs`).
/// (The previous release put nothing on the pods' bridge ports, so there
/// is no `attach-port` here; `crash.rs` kills a resize there.)
const UPGRADE_STEPS: [&str; 8] = [
    "load-prepared",
    "load-pinned-one",
    "load-pinned",
    "attach-required",
    "attach-uplink",
    "hook-updated",
    "attach-hooks",
    "attach-recorded",
];

/// An upgrade from the previous release killed after each of its steps
/// (issue 52): right after the kill `status` (this build's) says the
/// change is unfinished, naming `reconcile`; the established connection
/// keeps going; and the next run of the new binary finishes the move: a
/// container DELeted then has its port dead, one ADDed then is reachable
/// from outside, every socket hook runs this build's program and
/// `status` is healthy.
#[test]
#[ignore = "needs the previous release's build (cargo xtask test runs it)"]
fn an_upgrade_killed_after_any_step_is_finished_by_the_next_run() {
    use std::os::unix::process::ExitStatusExt;
    let Some(previous) = previous_bin() else {
        return;
    };
    let only = std::env::var("EPM_CRASH_STEPS").ok();
    for step in UPGRADE_STEPS.into_iter().filter(|step| {
        only.as_deref()
            .is_none_or(|only| only.split(',').any(|s| s == *step))
    }) {
        eprintln!("upgrade killed after {step}");
        let world = World::bridge();
        install(&world, &previous);
        let web = world.node.add_container("web");
        let _web = tcp_echo_server(&web.ns, 80, "web");
        world.add(&web, &[PortMapping::tcp(8080, 80)]);
        let old = world.node.add_container("old");
        let _old = tcp_echo_server(&old.ns, 80, "old");
        let old_mappings = [PortMapping::tcp(8090, 80)];
        world.add(&old, &old_mappings);
        let mut established = tcp_connect(&world.node.ext, sock(NODE_IP4, 8080), PROBE)
            .unwrap_or_else(|e| panic!("{step}: connect before the upgrade: {e}"));
        assert_eq!(
            established
                .request("before", PROBE)
                .expect("request before"),
            echo_reply("web", "before")
        );

        install(&world, &plugin_bin());
        let crashing = portmap_tests::cni::CniRunner::new(world.plugins.paths(), &world.node.ns)
            .with_env("EPM_TEST_CRASH_AFTER", step);
        let crashed = world.node.add_container("crashed");
        let crashed_rt = crashed.with_port_mappings(&[PortMapping::tcp(8099, 80)]);
        let failure = crashing
            .add(&world.list, &crashed_rt)
            .map(|_| ())
            .expect_err("the ADD that was to be killed succeeded");
        assert_eq!(
            failure.exit_status.and_then(|status| status.signal()),
            Some(libc::SIGKILL),
            "{step}: the new binary was not killed after the step: {failure}"
        );
        let status = status_of(&world);
        if step != "attach-recorded" {
            assert_eq!(status["healthy"], false, "{step}: {status:#}");
            let problems = status["problems"].to_string();
            assert!(
                problems.contains("reconcile") && status["changeUnfinished"] != false,
                "{step}: status does not say the upgrade is unfinished: {status:#}"
            );
        }
        assert_eq!(
            established
                .request("after the kill", PROBE)
                .unwrap_or_else(|e| panic!("{step}: the established connection broke: {e}")),
            echo_reply("web", "after the kill")
        );

        world
            .runner
            .del(&world.list, &crashed_rt)
            .unwrap_or_else(|e| panic!("{step}: DEL of the killed ADD's container: {e}"));
        world.del(&old, &old_mappings);
        let late = world.node.add_container("late");
        let _late = tcp_echo_server(&late.ns, 80, "late");
        world.add(&late, &[PortMapping::tcp(8091, 80)]);
        for ip in [IpAddr::V4(NODE_IP4), IpAddr::V6(NODE_IP6)] {
            expect_unreachable(
                &format!("{step}: old after its DEL, via {ip}"),
                tcp_request(&world.node.ext, sock(ip, 8090), "late", GONE),
            );
            world.expect_answer(
                &format!("{step}: late via {ip}"),
                tcp_request(&world.node.ext, sock(ip, 8091), "hi", PROBE),
                &echo_reply("late", "hi"),
            );
            world.expect_answer(
                &format!("{step}: web via {ip}"),
                tcp_request(&world.node.ext, sock(ip, 8080), "hi", PROBE),
                &echo_reply("web", "hi"),
            );
        }
        assert_eq!(
            established
                .request("after the repair", PROBE)
                .unwrap_or_else(|e| panic!("{step}: the established connection broke: {e}")),
            echo_reply("web", "after the repair")
        );
        world.assert_hooks_of_this_build(&format!("{step}: after the next run"));
        let status = status_of(&world);
        assert_eq!(
            status["healthy"], true,
            "{step}: after the next run: {status:#}"
        );
        let builds: std::collections::BTreeSet<&str> = status["programs"]
            .as_array()
            .expect("programs")
            .iter()
            .filter_map(|p| p["build"].as_str())
            .collect();
        assert_eq!(
            builds.len(),
            1,
            "{step}: the previous release's programs are unpinned once nothing runs them: {builds:?}"
        );
    }
}
