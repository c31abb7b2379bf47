//! Claims on host ports and the garbage they can leave: a wildcard and a
//! specific hostIP on one port exclude each other (as for bind()), GC
//! racing ADD leaves no port stuck, orphaned mappings are reported and
//! reclaimed, large requests (Podman's port ranges) are accepted, a re-ADD
//! only needs room for its new set, and `status` compares the owners'
//! indexes with the mappings. Real chains, real traffic where it matters,
//! the kernel's maps read through bpftool. Needs root.

#![allow(
    clippy::result_large_err,
    reason = "CniFailure carries the whole plugin exchange on purpose (see cni.rs)"
)]

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use portmap_tests::cni::{CniCommand, gc_plugin_config};
use portmap_tests::topology::{NODE_IP4, NODE_IP6};
use portmap_tests::traffic::{echo_reply, tcp_connect, tcp_echo_server, tcp_request};
use portmap_tests::world::{FakeContainer, PROBE, World, bpftool_number, sock, wait_bounded};
use portmap_tests::{Conflist, PortMapping, plugin_bin};
use serde_json::{Value, json};

/// Upper bound for a plugin process to end; never a timing assertion.
const BOUND: Duration = Duration::from_secs(60);

/// Runs `ebpf-portmap <args> --pin-root <root>` in the node namespace.
fn op(world: &World, args: &[&str]) -> Output {
    world.operator(args)
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `status --json`: exit status and the problems it lists.
fn status_problems(world: &World) -> (bool, Vec<String>) {
    let out = op(world, &["status", "--json"]);
    let status: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("status --json is not JSON ({e}): {}", text(&out)));
    let problems = status["problems"]
        .as_array()
        .unwrap_or_else(|| panic!("no problems list in {status:#}"))
        .iter()
        .map(|p| p.as_str().expect("problem text").to_owned())
        .collect();
    (out.status.success(), problems)
}

/// Deletes one entry of a pinned map behind the plugin's back.
fn bpftool_delete(world: &World, map: &str, key: &[u8]) {
    let path = world.pins.path().join("v1/maps").join(map);
    let out = Command::new("bpftool")
        .args(["map", "delete", "pinned"])
        .arg(&path)
        .arg("key")
        .args(key.iter().map(std::string::ToString::to_string))
        .output()
        .expect("run bpftool");
    assert!(
        out.status.success(),
        "bpftool map delete {}: {}",
        path.display(),
        text(&out)
    );
}

/// The key bytes of an IPv4 wildcard mapping (`MappingKey`: 16 address
/// bytes, port in network order, protocol, family).
fn wildcard_v4_key(port: u16, proto: u8) -> Vec<u8> {
    let mut key = vec![0u8; 16];
    key.extend_from_slice(&port.to_be_bytes());
    key.extend_from_slice(&[proto, 4]);
    key
}

fn entries(world: &World, map: &str) -> Vec<Value> {
    world.dump_map(map).as_array().cloned().unwrap_or_default()
}

fn code_of(result: &Result<Value, portmap_tests::CniFailure>) -> Option<u64> {
    result
        .as_ref()
        .err()
        .and_then(portmap_tests::CniFailure::error_code)
}

// --- item 8: a wildcard and a specific hostIP overlap ---

#[test]
fn a_wildcard_and_a_specific_host_ip_on_one_port_exclude_each_other() {
    let world = World::bridge();
    let c = world.node.add_container("c");
    let d = world.node.add_container("d");
    let _c_tcp = tcp_echo_server(&c.ns, 80, "c");
    let _d_tcp = tcp_echo_server(&d.ns, 80, "d");
    let wildcard = [PortMapping::tcp(8083, 80).on(IpAddr::V4(Ipv4Addr::UNSPECIFIED))];
    let specific = [PortMapping::tcp(8083, 80).on(IpAddr::V4(NODE_IP4))];

    // Wildcard first: the specific address is part of it.
    world.add(&c, &wildcard);
    let refused = world
        .runner
        .add(&world.list, &d.with_port_mappings(&specific));
    assert_eq!(
        code_of(&refused),
        Some(100),
        "a specific hostIP inside a held wildcard must conflict: {refused:?}"
    );
    let message = refused
        .as_ref()
        .unwrap_err()
        .error_msg()
        .unwrap_or_default();
    assert!(
        message.contains("198.18.0.1:8083/tcp") && message.contains("container c"),
        "the conflict names the port and the holder: {message}"
    );
    world.expect_answer(
        "the wildcard's holder keeps the address",
        tcp_request(&world.node.ext, sock(NODE_IP4, 8083), "x", PROBE),
        &echo_reply("c", "x"),
    );
    // What the runtime does after a failed ADD.
    world.del(&d, &specific);
    // Another protocol, or the other family, does not overlap.
    let other_protocol = [PortMapping::udp(8083, 80).on(IpAddr::V4(NODE_IP4))];
    world.add(&d, &other_protocol);
    world.del(&d, &other_protocol);
    let other_family = [PortMapping::tcp(8083, 80).on(IpAddr::V6(NODE_IP6))];
    world.add(&d, &other_family);
    world.expect_answer(
        "the IPv6 address, outside the IPv4 wildcard",
        tcp_request(&world.node.ext, sock(NODE_IP6, 8083), "y", PROBE),
        &echo_reply("d", "y"),
    );
    world.del(&d, &other_family);
    world.del(&c, &wildcard);

    // Specific first: a wildcard would take its address.
    world.add(&d, &specific);
    let refused = world
        .runner
        .add(&world.list, &c.with_port_mappings(&wildcard));
    assert_eq!(
        code_of(&refused),
        Some(100),
        "a wildcard over a held specific hostIP must conflict: {refused:?}"
    );
    let message = refused
        .as_ref()
        .unwrap_err()
        .error_msg()
        .unwrap_or_default();
    assert!(
        message.contains("0.0.0.0:8083/tcp") && message.contains("container d"),
        "the conflict names the port and the holder: {message}"
    );
    world.expect_answer(
        "the specific holder keeps its address",
        tcp_request(&world.node.ext, sock(NODE_IP4, 8083), "z", PROBE),
        &echo_reply("d", "z"),
    );
    world.del(&c, &wildcard);
    assert_eq!(
        world.listed_hosts(),
        BTreeSet::from([("198.18.0.1:8083/tcp".to_owned(), "d".to_owned())]),
        "the refused wildcard left nothing behind"
    );
    world.del(&d, &specific);

    // Inside one request: refused as invalid, naming both entries.
    let both = [
        wildcard[0].clone(),
        PortMapping::tcp(8083, 81).on(IpAddr::V4(NODE_IP4)),
    ];
    let refused = world.runner.add(&world.list, &c.with_port_mappings(&both));
    assert_eq!(code_of(&refused), Some(7), "{refused:?}");
    let message = refused
        .as_ref()
        .unwrap_err()
        .error_msg()
        .unwrap_or_default();
    assert!(
        message.contains("portMappings[1] overlaps runtimeConfig.portMappings[0]"),
        "{message}"
    );
    world.del(&c, &both);
    world.assert_clean("after the refused requests");
}

#[test]
fn racing_wildcard_and_specific_claims_never_both_win() {
    let world = World::plugin_only();
    // Programs loaded once, so every round races on the maps only.
    let warm = FakeContainer::new(&world, "warm", 0, vec![PortMapping::tcp(7000, 80)]);
    warm.add(&world).expect("warm-up ADD");
    warm.del(&world).expect("warm-up DEL");
    let specific_ip: IpAddr = "10.78.0.1".parse().expect("address");
    for round in 0..12u16 {
        let port = 8100 + round;
        let wild = FakeContainer::new(
            &world,
            &format!("wild{round}"),
            1,
            vec![PortMapping::tcp(port, 80).on(IpAddr::V4(Ipv4Addr::UNSPECIFIED))],
        );
        let spec = FakeContainer::new(
            &world,
            &format!("spec{round}"),
            2,
            vec![PortMapping::tcp(port, 80).on(specific_ip)],
        );
        // Alternate who starts first.
        let (first, second) = if round % 2 == 0 {
            (&wild, &spec)
        } else {
            (&spec, &wild)
        };
        let a = first.spawn(&world, CniCommand::Add);
        let b = second.spawn(&world, CniCommand::Add);
        let a = wait_bounded(a, BOUND, "first ADD");
        let b = wait_bounded(b, BOUND, "second ADD");
        let hosts: BTreeSet<String> = entries(&world, "mappings")
            .iter()
            .map(std::string::ToString::to_string)
            .collect();
        assert!(
            hosts.len() <= 1,
            "round {round}: a wildcard and a specific mapping of port {port} both exist (ADDs exited {:?} and {:?}): {:#?}",
            a.status,
            b.status,
            world.maps()
        );
        assert!(
            !(a.status.success() && b.status.success()),
            "round {round}: both overlapping ADDs succeeded"
        );
        for container in [&wild, &spec] {
            container.del(&world).expect("DEL");
        }
        world.assert_clean(&format!("round {round}"));
    }
}

// --- item 9: GC racing ADD, orphans ---

/// Starts our plugin's CNI GC keeping nothing of the network.
fn spawn_gc(world: &World) -> std::process::Child {
    let config = gc_plugin_config(&world.list, world.our_plugin(), &[]);
    let mut child = world
        .node
        .ns
        .command(plugin_bin())
        .env("CNI_COMMAND", "GC")
        .env("CNI_PATH", "/usr/lib/cni")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ebpf-portmap GC");
    let mut stdin = child.stdin.take().expect("stdin");
    std::io::Write::write_all(&mut stdin, config.to_string().as_bytes()).expect("write config");
    child
}

#[test]
fn gc_racing_add_never_leaves_a_port_stuck() {
    let world = World::plugin_only();
    let mappings: Vec<PortMapping> = (0..600).map(|i| PortMapping::tcp(20000 + i, 80)).collect();
    // One ADD alone first: loads the programs, and tells how long an ADD
    // takes here, so the GCs below start across the whole of one.
    let solo = FakeContainer::new(&world, "solo", 0, mappings.clone());
    let started = Instant::now();
    solo.add(&world).expect("ADD alone");
    let add_time = started.elapsed();
    solo.del(&world).expect("DEL alone");
    world.assert_clean("after the solo ADD and DEL");

    let rounds = 40u32;
    let mut outcomes = BTreeSet::new();
    for round in 0..rounds {
        let racer = FakeContainer::new(&world, &format!("racer{round}"), 1, mappings.clone());
        let add = racer.spawn(&world, CniCommand::Add);
        std::thread::sleep(add_time * round / rounds);
        let gc = spawn_gc(&world);
        let add = wait_bounded(add, BOUND, "ADD");
        let gc = wait_bounded(gc, BOUND, "GC");
        assert!(
            gc.status.success(),
            "round {round}: GC failed: {}",
            text(&gc)
        );
        // Exactly one of two states: the container's full set with its
        // owner and index (the ADD finished before the GC looked), or
        // nothing at all. Never mappings without an owner.
        let mapped = entries(&world, "mappings").len();
        let owners = entries(&world, "owners");
        let slots = entries(&world, "owner_slots").len();
        let full = mapped == 2 * mappings.len() && owners.len() == 1 && slots == mapped;
        let empty = mapped == 0 && owners.is_empty() && slots == 0;
        assert!(
            full || empty,
            "round {round}: ADD exited {:?}, GC {:?}; {mapped} mapping(s), {} owner(s), {slots} slot(s):\n{:#?}",
            add.status,
            gc.status,
            owners.len(),
            owners
        );
        assert!(
            add.status.success() || !full,
            "round {round}: a failed ADD left its mappings"
        );
        outcomes.insert((add.status.success(), full));
        // What the runtime does next: DEL the container it believes gone
        // (or failed), after which the ports must be free for anyone.
        racer.del(&world).expect("DEL after the race");
        world.assert_clean(&format!("round {round}, after DEL"));
    }
    let next = FakeContainer::new(&world, "next", 2, mappings.clone());
    next.add(&world)
        .unwrap_or_else(|e| panic!("the raced ports are stuck: {e}"));
    next.del(&world).expect("DEL");
    eprintln!("outcomes (ADD succeeded, mappings kept): {outcomes:?}");
}

#[test]
fn mappings_without_an_owner_are_reported_and_reclaimed() {
    let world = World::bridge();
    let lost = world.node.add_container("lost");
    let heir = world.node.add_container("heir");
    let _heir_tcp = tcp_echo_server(&heir.ns, 80, "heir");
    let mappings = [PortMapping::tcp(8090, 80)];
    world.add(&lost, &mappings);
    // The owner record vanishes, as it did when a GC raced the ADD.
    let owners = entries(&world, "owners");
    assert_eq!(owners.len(), 1, "{owners:#?}");
    let id = bpftool_number(&owners[0]["key"]);
    bpftool_delete(&world, "owners", &id.to_le_bytes());

    let (healthy, problems) = status_problems(&world);
    assert!(
        !healthy,
        "status must fail with orphaned mappings: {problems:#?}"
    );
    let orphan = format!("2 mapping(s) of owner {id:016x}");
    assert!(
        problems
            .iter()
            .any(|p| p.contains(&orphan) && p.contains("gc --orphans")),
        "status names the orphans and the fix: {problems:#?}"
    );
    let stuck = world
        .runner
        .add(&world.list, &heir.with_port_mappings(&mappings));
    assert_eq!(code_of(&stuck), Some(100), "{stuck:?}");
    world.del(&heir, &mappings);

    // CNI GC (the runtime still lists the container) sees them first: it
    // records them and waits out its grace period.
    let keep = [portmap_tests::GcAttachment::from(
        &lost.with_port_mappings(&mappings),
    )];
    world.runner.gc(&world.list, &keep).expect("CNI GC");
    assert_eq!(world.mapping_count(), 2, "inside the grace period");
    // The operator reclaims them at once.
    let out = op(&world, &["gc", "--orphans", "--min-age", "0"]);
    assert!(out.status.success(), "gc --orphans: {}", text(&out));
    assert!(
        text(&out).contains(&format!("removed 2 mappings of owner {id:016x}")),
        "{}",
        text(&out)
    );
    assert_eq!(world.mapping_count(), 0);
    let (healthy, problems) = status_problems(&world);
    assert!(healthy, "nothing left to report: {problems:#?}");

    world.add(&heir, &mappings);
    world.expect_answer(
        "the reclaimed port serves its new owner",
        tcp_request(&world.node.ext, sock(NODE_IP4, 8090), "hi", PROBE),
        &echo_reply("heir", "hi"),
    );
    world.del(&heir, &mappings);
    world.del(&lost, &mappings);
    world.assert_clean("after both DELs");
}

// --- item 10: request size, re-ADD with a changed set ---

#[test]
fn a_port_range_of_2001_mappings_is_accepted_and_forwards() {
    let world = World::bridge();
    let web = world.node.add_container("web");
    let _tcp = tcp_echo_server(&web.ns, 11000, "web");
    // What `podman run -p 10000-12000:10000-12000` sends.
    let mappings: Vec<PortMapping> = (10000..=12000).map(|p| PortMapping::tcp(p, p)).collect();
    world.add(&web, &mappings);
    assert_eq!(
        world.mapping_count(),
        2 * 2001,
        "both families of every port"
    );
    world.expect_answer(
        "a port inside the range",
        tcp_request(&world.node.ext, sock(NODE_IP4, 11000), "r", PROBE),
        &echo_reply("web", "r"),
    );
    world.del(&web, &mappings);
    world.assert_clean("after DEL");
}

/// ebpf-portmap alone, with a mappings map of 16 entries.
fn small_world() -> World {
    World::with(|name, pins, data| {
        Conflist::from_json(json!({
            "cniVersion": "1.1.0",
            "name": name,
            "plugins": [{
                "type": "ebpf-portmap",
                "capabilities": {"portMappings": true},
                "pinRoot": pins,
                "logFile": data.join(portmap_tests::topology::PLUGIN_LOG),
                "cgroupPath": portmap_tests::cgroup::cgroup_for_pin_root(pins),
                "maxMappings": 16,
            }]
        }))
        .expect("a well-formed conflist")
    })
}

#[test]
fn a_re_add_with_a_changed_set_only_needs_room_for_the_new_set() {
    let world = small_world();
    let old: Vec<PortMapping> = (0..6).map(|i| PortMapping::tcp(9000 + i, 80)).collect();
    let new: Vec<PortMapping> = (0..6).map(|i| PortMapping::tcp(9100 + i, 80)).collect();
    let first = FakeContainer::new(&world, "web", 1, old);
    first.add(&world).expect("ADD of 12 entries into 16");
    // The same container again with another set: 12 old and 12 new entries
    // never fit together, the new ones alone do.
    let again = FakeContainer::new(&world, "web", 1, new);
    again
        .add(&world)
        .unwrap_or_else(|e| panic!("re-ADD with a changed set: {e}\n{}", world.dump()));
    assert_eq!(
        world.listed_hosts(),
        again.expected_hosts(),
        "exactly the new set"
    );
    again.check(&world).expect("CHECK of the new set");
    assert_eq!(
        entries(&world, "owner_slots").len(),
        12,
        "the index holds the new set only"
    );
    let (healthy, problems) = status_problems(&world);
    assert!(healthy, "{problems:#?}");
    // More entries than the map holds are refused up front, naming the key.
    let huge = FakeContainer::new(
        &world,
        "huge",
        2,
        (0..17).map(|i| PortMapping::tcp(9200 + i, 80)).collect(),
    );
    let refused = huge
        .add(&world)
        .expect_err("17 entries into maxMappings 16");
    assert!(refused.contains("maxMappings 16"), "{refused}");
    again.del(&world).expect("DEL");
    world.assert_clean("after DEL");
}

// --- item 11: status compares the index with the mappings ---

#[test]
fn status_reports_a_mapping_deleted_behind_its_back() {
    let world = World::bridge();
    let web = world.node.add_container("web");
    let _tcp = tcp_echo_server(&web.ns, 80, "web");
    let mappings = [PortMapping::tcp(8085, 80)];
    let result = world.add(&web, &mappings);
    let (healthy, problems) = status_problems(&world);
    assert!(healthy, "{problems:#?}");
    let session = tcp_connect(&world.node.ext, sock(NODE_IP4, 8085), PROBE)
        .unwrap_or_else(|e| panic!("connect: {e}"));
    drop(session);

    bpftool_delete(&world, "mappings", &wildcard_v4_key(8085, 6));
    let (healthy, problems) = status_problems(&world);
    assert!(!healthy, "status must fail: {problems:#?}");
    assert!(
        problems.iter().any(|p| p.starts_with(
            "mapping 0.0.0.0:8085/tcp of web/eth0 (network epm-test) is missing from the mappings map"
        )),
        "status names the lost mapping and its owner: {problems:#?}"
    );
    let check = world
        .runner
        .check(&world.list, &web.with_port_mappings(&mappings));
    assert!(check.is_err(), "CHECK agrees");

    // ADD again (of our plugin, as a runtime re-runs one plugin) restores
    // it, and status is content again.
    let rt = web.with_port_mappings(&mappings);
    world
        .exec_ours(CniCommand::Add, &rt, Some(&result))
        .unwrap_or_else(|e| panic!("re-ADD: {e}"));
    let (healthy, problems) = status_problems(&world);
    assert!(healthy, "{problems:#?}");
    world.expect_answer(
        "restored",
        tcp_request(&world.node.ext, sock(NODE_IP4, 8085), "back", PROBE),
        &echo_reply("web", "back"),
    );
    world.del(&web, &mappings);
    world.assert_clean("after DEL");
}

// --- item 7: one node per network namespace ---

/// bridge + host-local + ebpf-portmap without `pinRoot`: the default root,
/// shared by every node namespace on the kernel (the socket hooks still go
/// to the test's own cgroup).
fn default_root_world() -> World {
    World::with(|name, pins, data| {
        let list = portmap_tests::bridge_conflist(name, "ebpf-portmap", Some(pins), data);
        let mut json = list.json().clone();
        for plugin in json["plugins"].as_array_mut().expect("plugins") {
            if plugin["type"] == "ebpf-portmap" {
                plugin
                    .as_object_mut()
                    .expect("plugin object")
                    .remove("pinRoot");
            }
        }
        Conflist::from_json(json).expect("a well-formed conflist")
    })
}

/// Removes the state a [`default_root_world`] made under the default root,
/// also when the test fails.
struct UninstallDefault<'a>(&'a World);

impl Drop for UninstallDefault<'_> {
    fn drop(&mut self) {
        let out = self
            .0
            .node
            .ns
            .command(plugin_bin())
            .args(["uninstall", "--force"])
            .output();
        if let Ok(out) = out
            && !out.status.success()
        {
            eprintln!("uninstall under the default root: {}", text(&out));
        }
    }
}

/// `list --json` with the default root, in `world`'s node namespace.
fn listed_default(world: &World) -> BTreeSet<(String, String)> {
    let out = world
        .node
        .ns
        .command(plugin_bin())
        .args(["list", "--json"])
        .output()
        .expect("run list");
    assert!(out.status.success(), "list: {}", text(&out));
    let list: Value = serde_json::from_slice(&out.stdout).expect("list JSON");
    list.as_array()
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

#[test]
fn two_node_namespaces_on_one_bpffs_keep_their_own_state() {
    let a = default_root_world();
    let b = default_root_world();
    let _uninstall_b = UninstallDefault(&b);
    let _uninstall_a = UninstallDefault(&a);
    let web_a = a.node.add_container("web-a");
    let web_b = b.node.add_container("web-b");
    let _a_tcp = tcp_echo_server(&web_a.ns, 80, "web-a");
    let _b_tcp = tcp_echo_server(&web_b.ns, 80, "web-b");
    let mappings = [PortMapping::tcp(8080, 80)];
    a.add(&web_a, &mappings);
    // The same host port on another node: no conflict.
    b.add(&web_b, &mappings);
    for (world, who) in [(&a, "web-a"), (&b, "web-b")] {
        world.expect_answer(
            &format!("{who} on its own node"),
            tcp_request(&world.node.ext, sock(NODE_IP4, 8080), "hi", PROBE),
            &echo_reply(who, "hi"),
        );
    }
    // ADDs on one node leave the other's attachments alone.
    let more_a = a.node.add_container("more-a");
    a.add(&more_a, &[PortMapping::tcp(8081, 80)]);
    let more_b = b.node.add_container("more-b");
    b.add(&more_b, &[PortMapping::tcp(8082, 80)]);
    for (world, who) in [(&a, "web-a"), (&b, "web-b")] {
        world.expect_answer(
            &format!("{who} after ADDs on both nodes"),
            tcp_request(&world.node.ext, sock(NODE_IP4, 8080), "again", PROBE),
            &echo_reply(who, "again"),
        );
    }
    // The operator verbs see the state of the namespace they run in.
    let own = |id: &str, port: u16| {
        BTreeSet::from([
            ("0.0.0.0:8080/tcp".to_owned(), id.to_owned()),
            ("[::]:8080/tcp".to_owned(), id.to_owned()),
            (format!("0.0.0.0:{port}/tcp"), format!("more-{}", &id[4..])),
            (format!("[::]:{port}/tcp"), format!("more-{}", &id[4..])),
        ])
    };
    assert_eq!(listed_default(&a), own("web-a", 8081));
    assert_eq!(listed_default(&b), own("web-b", 8082));

    // Uninstalling one node's state leaves the other's running.
    for (world, container, mappings) in [
        (&b, &web_b, &mappings[..]),
        (&b, &more_b, &[PortMapping::tcp(8082, 80)][..]),
    ] {
        world.del(container, mappings);
    }
    let out = b
        .node
        .ns
        .command(plugin_bin())
        .args(["uninstall"])
        .output()
        .expect("run uninstall");
    assert!(out.status.success(), "uninstall on b: {}", text(&out));
    a.expect_answer(
        "web-a after b's uninstall",
        tcp_request(&a.node.ext, sock(NODE_IP4, 8080), "still", PROBE),
        &echo_reply("web-a", "still"),
    );
    a.del(&web_a, &mappings);
    a.del(&more_a, &[PortMapping::tcp(8081, 80)]);
}

#[test]
fn an_explicit_pin_root_of_another_namespace_is_refused() {
    let first = World::bridge();
    let second = World::with(|name, _pins, data| {
        portmap_tests::bridge_conflist(name, "ebpf-portmap", Some(first.pins.path()), data)
    });
    let web = first.node.add_container("web");
    let _tcp = tcp_echo_server(&web.ns, 80, "web");
    let mappings = [PortMapping::tcp(8080, 80)];
    first.add(&web, &mappings);
    let other = second.node.add_container("other");
    let refused = second.runner.add(
        &second.list,
        &other.with_port_mappings(&[PortMapping::tcp(9090, 80)]),
    );
    assert_eq!(code_of(&refused), Some(7), "{refused:?}");
    let message = refused
        .as_ref()
        .unwrap_err()
        .error_msg()
        .unwrap_or_default();
    assert!(
        message.contains("holds the state of another network namespace")
            && message.contains(&first.pins.path().display().to_string()),
        "the error names the pinRoot and why: {message}"
    );
    second.del(&other, &[PortMapping::tcp(9090, 80)]);
    assert_eq!(
        first.listed_hosts(),
        BTreeSet::from([
            ("0.0.0.0:8080/tcp".to_owned(), "web".to_owned()),
            ("[::]:8080/tcp".to_owned(), "web".to_owned()),
        ]),
        "the refused ADD and its DEL changed nothing"
    );
    first.expect_answer(
        "the owner's mapping",
        tcp_request(&first.node.ext, sock(NODE_IP4, 8080), "x", PROBE),
        &echo_reply("web", "x"),
    );
    first.del(&web, &mappings);
}
