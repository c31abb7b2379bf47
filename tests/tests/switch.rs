//! A live node switched from upstream `portmap` to ebpf-portmap: the pods
//! upstream set up keep their ports, a new pod cannot take them, and their
//! DEL, which now comes to ebpf-portmap, leaves none of upstream's rules.
//! Debian's upstream `portmap` (iptables-nft) and the reference `bridge` and
//! `host-local` run in the test's own node namespace; every iptables rule
//! lives there. Needs root.

use std::collections::BTreeSet;
use std::time::Duration;

use portmap_tests::topology::{NODE_IP4, NODE_IP6, PLUGIN_LOG};
use portmap_tests::traffic::{
    ServerHandle, echo_reply, tcp_echo_server, tcp_request, udp_echo_server, udp_request,
};
use portmap_tests::world::{GONE, World, sock};
use portmap_tests::{Container, PortMapping, bridge_conflist};

const PROBE: Duration = Duration::from_secs(5);

/// The node's nat rules and user chains, IPv4 and IPv6, as iptables
/// (Debian's default, iptables-nft) prints them, without counters and
/// without the built-in chains an empty nat table has.
fn nat_rules(world: &World) -> BTreeSet<String> {
    let mut rules = BTreeSet::new();
    for tool in ["iptables-save", "ip6tables-save"] {
        let out = world
            .node
            .ns
            .command(tool)
            .args(["-t", "nat"])
            .output()
            .unwrap_or_else(|e| panic!("run {tool}: {e}"));
        assert!(
            out.status.success(),
            "{tool}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let builtin = ["PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"]
                .iter()
                .any(|chain| line.starts_with(&format!(":{chain} ")));
            if line.starts_with("-A ") {
                rules.insert(format!("{tool}: {line}"));
            } else if line.starts_with(':') && !builtin {
                // `:CHAIN POLICY [packets:bytes]`: the counters change.
                let chain = line.split(" [").next().unwrap_or(line);
                rules.insert(format!("{tool}: {chain}"));
            }
        }
    }
    rules
}

/// Each of the four ways into `name`'s two ports answers from outside.
fn assert_answers(world: &World, name: &str, tcp: u16, udp: u16, when: &str) {
    for addr in [sock(NODE_IP4, tcp), sock(NODE_IP6, tcp)] {
        world.expect_answer(
            &format!("{when}: TCP {addr}"),
            tcp_request(&world.node.ext, addr, "ping", PROBE),
            &echo_reply(name, "ping"),
        );
    }
    for addr in [sock(NODE_IP4, udp), sock(NODE_IP6, udp)] {
        world.expect_answer(
            &format!("{when}: UDP {addr}"),
            udp_request(&world.node.ext, addr, "dgram", PROBE),
            &echo_reply(name, "dgram"),
        );
    }
}

/// The entries `list -o json` shows for upstream's mappings.
fn upstream_listed(world: &World) -> Vec<String> {
    world
        .list()
        .as_array()
        .expect("list is an array")
        .iter()
        .filter(|entry| entry["upstream"] == "iptables-nft")
        .map(|entry| {
            format!(
                "{} -> {} ({})",
                entry["host"].as_str().unwrap_or("?"),
                entry["containerID"].as_str().unwrap_or("?"),
                entry["network"].as_str().unwrap_or("?")
            )
        })
        .collect()
}

fn plugin_log(world: &World) -> String {
    let path = world.node.data_dir().join(PLUGIN_LOG);
    format!(
        "ebpf-portmap log:\n{}",
        std::fs::read_to_string(&path).unwrap_or_default()
    )
}

fn serve(container: &Container) -> (ServerHandle, ServerHandle) {
    (
        tcp_echo_server(&container.ns, 80, &container.id),
        udp_echo_server(&container.ns, 81, &container.id),
    )
}

#[test]
fn switching_in_keeps_upstreams_pods_and_their_del_leaves_no_upstream_rule() {
    let world = World::bridge();
    // The node before upstream's first ADD (bridge has ipMasq off: no nat).
    let before = nat_rules(&world);
    let upstream = bridge_conflist(world.list.name(), "portmap", None, world.node.data_dir());

    let old = world.node.add_container("old");
    let _old_servers = serve(&old);
    let old_ports = [PortMapping::tcp(8080, 80), PortMapping::udp(8081, 81)];
    world
        .runner
        .add(&upstream, &old.with_port_mappings(&old_ports))
        .unwrap_or_else(|e| panic!("upstream ADD of old: {e}\n{}", world.dump()));
    assert_answers(&world, "old", 8080, 8081, "through upstream");
    assert_ne!(nat_rules(&world), before, "upstream's ADD wrote its rules");

    // The conflist now names ebpf-portmap: a new pod brings our programs.
    let fresh = world.node.add_container("fresh");
    let _fresh_servers = serve(&fresh);
    world.add(
        &fresh,
        &[PortMapping::tcp(8090, 80), PortMapping::udp(8091, 81)],
    );
    assert_answers(&world, "fresh", 8090, 8091, "through ebpf-portmap");
    assert_answers(&world, "old", 8080, 8081, "upstream's pod after the switch");

    // A pod asking for a port upstream still maps is refused, naming it.
    for (port, mapping) in [
        (8080, PortMapping::tcp(8080, 80)),
        (8081, PortMapping::udp(8081, 81)),
    ] {
        let thief = world.node.add_container(&format!("thief{port}"));
        let rt = thief.with_port_mappings(std::slice::from_ref(&mapping));
        let Err(failure) = world.runner.add(&world.list, &rt) else {
            panic!(
                "ADD of host port {port}, which upstream maps for old, was accepted\n{}",
                world.dump()
            );
        };
        assert_eq!(failure.plugin, "ebpf-portmap", "{failure}");
        assert_eq!(failure.error_code(), Some(100), "{failure}");
        let msg = failure.error_msg().unwrap_or_default();
        assert!(
            msg.contains("container old") && msg.contains("upstream portmap"),
            "the refusal names upstream's holder: {msg}"
        );
        // The runtime cleans up a failed ADD with DEL: that DEL is not old's.
        world
            .runner
            .del(&world.list, &rt)
            .unwrap_or_else(|e| panic!("DEL after the refused ADD: {e}"));
    }
    assert_answers(
        &world,
        "old",
        8080,
        8081,
        "after the refused ADDs and their DELs",
    );
    let mut listed = upstream_listed(&world);
    listed.sort();
    assert_eq!(
        listed,
        [
            "0.0.0.0:8080/tcp -> old (epm-test)",
            "0.0.0.0:8081/udp -> old (epm-test)",
            "[::]:8080/tcp -> old (epm-test)",
            "[::]:8081/udp -> old (epm-test)",
        ],
        "list shows upstream's mappings in their own entries"
    );

    // old goes away; its DEL goes to the chain the conflist names now.
    world
        .runner
        .del(&world.list, &old.with_port_mappings(&old_ports))
        .unwrap_or_else(|e| panic!("DEL of old through ebpf-portmap: {e}"));
    assert_eq!(
        nat_rules(&world),
        before,
        "the DEL of upstream's last pod through ebpf-portmap leaves the nat table as before upstream's first ADD\n{}",
        plugin_log(&world)
    );
    match tcp_request(&world.node.ext, sock(NODE_IP4, 8080), "late", GONE) {
        Err(e) if e.is_unreachable() => {}
        other => panic!("8080 still answers after old's DEL: {other:?}"),
    }
    assert_eq!(
        upstream_listed(&world),
        Vec::<String>::new(),
        "list after old's DEL"
    );
    // A second DEL (runtimes retry) finds nothing and succeeds.
    world
        .runner
        .del(&world.list, &old.with_port_mappings(&old_ports))
        .unwrap_or_else(|e| panic!("second DEL of old: {e}"));

    // The port is free for ebpf-portmap now.
    let heir = world.node.add_container("heir");
    let _heir_servers = serve(&heir);
    world.add(&heir, &old_ports);
    assert_answers(
        &world,
        "heir",
        8080,
        8081,
        "the freed ports through ebpf-portmap",
    );

    world.del(&heir, &old_ports);
    world.del(
        &fresh,
        &[PortMapping::tcp(8090, 80), PortMapping::udp(8091, 81)],
    );
    world.assert_clean("after every DEL");
    assert_eq!(nat_rules(&world), before, "nothing of upstream came back");
}

/// CNI GC with the runtime's keep-list removes upstream's rules of this
/// network's containers it no longer lists (their DEL never came, or came
/// before the switch to a build that knew upstream), and keeps the others'.
#[test]
fn gc_removes_upstreams_rules_of_containers_the_runtime_no_longer_lists() {
    // ebpf-portmap alone at CNI 1.1.0 (GC), on the network upstream's pods use.
    let world = World::plugin_only();
    let before = nat_rules(&world);
    let upstream = bridge_conflist(world.list.name(), "portmap", None, world.node.data_dir());
    let kept = world.node.add_container("kept");
    let _kept_servers = serve(&kept);
    let gone = world.node.add_container("gone");
    let kept_rt =
        kept.with_port_mappings(&[PortMapping::tcp(8080, 80), PortMapping::udp(8081, 81)]);
    let gone_rt = gone.with_port_mappings(&[PortMapping::tcp(8082, 80)]);
    for rt in [&kept_rt, &gone_rt] {
        world
            .runner
            .add(&upstream, rt)
            .unwrap_or_else(|e| panic!("upstream ADD of {}: {e}", rt.container_id));
    }
    // The runtime lost `gone` (its DEL never comes): only GC can clean up.
    assert!(world.runner.forget(&upstream, &gone_rt));
    world
        .runner
        .gc(&world.list, &[(&kept_rt).into()])
        .unwrap_or_else(|e| panic!("GC: {e}\n{}", plugin_log(&world)));
    let left = nat_rules(&world);
    assert!(
        !left.iter().any(|rule| rule.contains("id: \\\"gone\\\"")),
        "GC removed upstream's rules of the unlisted container: {left:#?}\n{}",
        plugin_log(&world)
    );
    assert!(
        left.iter().any(|rule| rule.contains("id: \\\"kept\\\"")),
        "GC kept upstream's rules of the listed container: {left:#?}"
    );
    assert_answers(&world, "kept", 8080, 8081, "the kept pod after GC");

    // Cleanup through upstream's own chain; bridge and host-local free
    // `gone`'s address (upstream's DEL of it finds nothing, as ours would).
    for rt in [&kept_rt, &gone_rt] {
        world
            .runner
            .del(&upstream, rt)
            .unwrap_or_else(|e| panic!("upstream DEL of {}: {e}", rt.container_id));
    }
    // Upstream's own DEL leaves its shared chains: a GC after that removes them.
    world
        .runner
        .gc(&world.list, &[])
        .unwrap_or_else(|e| panic!("GC: {e}"));
    assert_eq!(nat_rules(&world), before, "nothing of upstream is left");
}
