//! A live node switched from upstream `portmap` to ebpf-portmap: the pods
//! upstream set up keep their ports, a new pod cannot take them, and their
//! DEL, which now comes to ebpf-portmap, leaves none of upstream's rules;
//! GC and `ebpf-portmap migrate` remove those of containers that are gone.
//! Each scenario runs twice: with Debian's upstream `portmap` 1.1
//! (iptables-nft) and the reference `bridge` and `host-local`, and with
//! upstream `portmap` 1.9 and `"backend": "nftables"` (its own
//! `cni_hostport` tables, through the `nft` `cargo xtask setup` unpacks;
//! skipped with the reason when setup could not fetch it). Everything runs
//! in the test's own node namespace; every rule lives there. Needs root.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::time::Duration;

use portmap_tests::cni::{CniRunner, Conflist};
use portmap_tests::plugins::plugin_bin;
use portmap_tests::topology::{NODE_IP4, NODE_IP6, PLUGIN_LOG};
use portmap_tests::traffic::{
    ServerHandle, echo_reply, tcp_echo_server, tcp_request, udp_echo_server, udp_request,
};
use portmap_tests::upstream_nft::UpstreamNft;
use portmap_tests::world::{GONE, World, sock};
use portmap_tests::{Container, PortMapping, bridge_conflist};
use serde_json::Value;

const PROBE: Duration = Duration::from_secs(5);

/// The upstream `portmap` a scenario switches from.
struct Upstream {
    /// `bridge` + `host-local` + upstream `portmap`, on the world's network.
    conflist: Conflist,
    /// How `list` and a refusal name its backend.
    backend: &'static str,
    /// The upstream 1.9 plugins and their `nft` (the nftables backend).
    nft: Option<UpstreamNft>,
}

impl Upstream {
    /// Debian's `portmap` 1.1 (iptables; the machine's iptables-nft).
    fn iptables(world: &World) -> Upstream {
        Upstream {
            conflist: bridge_conflist(world.list.name(), "portmap", None, world.node.data_dir()),
            backend: "iptables-nft",
            nft: None,
        }
    }

    /// Upstream `portmap` 1.9 with `"backend": "nftables"` (and its
    /// `bridge`, `ipMasq` off as everywhere here). The world's runner then
    /// finds the 1.9 plugins first and hands every plugin, ours too, a
    /// `PATH` with `nft`, as a node with the nftables backend has. `None`
    /// (printed: a skip) when setup could not unpack them.
    fn nftables(world: &mut World) -> Option<Upstream> {
        let found = match UpstreamNft::find() {
            Ok(found) => found,
            Err(why) => {
                eprintln!("SKIP: upstream portmap's nftables backend: {why}");
                return None;
            }
        };
        world.runner = runner(world, Some(&found));
        let mut json = bridge_conflist(world.list.name(), "portmap", None, world.node.data_dir())
            .json()
            .clone();
        json["plugins"][1]["backend"] = Value::from("nftables");
        Some(Upstream {
            conflist: Conflist::from_json(json).expect("a well-formed conflist"),
            backend: "nftables",
            nft: Some(found),
        })
    }

    /// The `PATH` our operator verbs run with (`nft` first, if any).
    fn path_env(&self) -> Option<OsString> {
        self.nft.as_ref().map(UpstreamNft::path_env)
    }

    /// Whether `state` (a [`node_state`]) holds a rule of container `id`.
    fn mentions(&self, state: &str, id: &str) -> bool {
        match self.nft {
            None => state.contains(&format!("id: \\\"{id}\\\"")),
            Some(_) => state.contains(&format!("comment \"{id}\"")),
        }
    }
}

/// A runner over the world's plugins; with `nft`, the upstream 1.9 plugins
/// first and a `PATH` with `nft` for every plugin.
fn runner(world: &World, nft: Option<&UpstreamNft>) -> CniRunner {
    match nft {
        None => CniRunner::new(world.plugins.paths(), &world.node.ns),
        Some(found) => CniRunner::new(
            vec![found.plugin_dir.clone(), world.plugins.path().to_path_buf()],
            &world.node.ns,
        )
        .with_env("PATH", found.path_env()),
    }
}

/// The node's nat rules and user chains, IPv4 and IPv6, as iptables
/// (Debian's default, iptables-nft) prints them, without counters and
/// without the built-in chains an empty nat table has; with the nftables
/// backend, then the whole `nft list ruleset`, counters left out.
fn node_state(world: &World, upstream: &Upstream) -> String {
    let mut state: Vec<String> = nat_rules(world).into_iter().collect();
    if let Some(nft) = &upstream.nft {
        let out = world
            .node
            .ns
            .command(nft.nft())
            .args(["list", "ruleset"])
            .output()
            .unwrap_or_else(|e| panic!("run nft: {e}"));
        assert!(
            out.status.success(),
            "nft list ruleset: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        state.push("nft list ruleset:".to_owned());
        state.extend(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .map(without_counters),
        );
    }
    state.join("\n")
}

/// `... counter packets 3 bytes 180 ...` without the numbers, which traffic changes.
fn without_counters(line: &str) -> String {
    let words: Vec<&str> = line.split(' ').collect();
    let mut kept = Vec::new();
    let mut i = 0;
    while i < words.len() {
        if words[i] == "packets" || words[i] == "bytes" {
            i += 2;
            continue;
        }
        kept.push(words[i]);
        i += 1;
    }
    kept.join(" ")
}

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

/// `ebpf-portmap <args> --pin-root <pins>` in the node namespace, with
/// upstream's `PATH` (as an operator on that node has it); must succeed.
/// ([`operator_output`] runs `ebpf-portmap <args>` alone.)
fn operator(world: &World, upstream: &Upstream, args: &[&str]) -> String {
    let pins = world.pins.path().to_str().expect("UTF-8 pin root");
    let args = [args, &["--pin-root", pins]].concat();
    let out = operator_output(world, upstream, &args);
    assert!(
        out.status.success(),
        "ebpf-portmap {args:?}: {}{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn operator_output(world: &World, upstream: &Upstream, args: &[&str]) -> std::process::Output {
    let mut command = world.node.ns.command(plugin_bin());
    command.args(args).env_remove("CNI_COMMAND");
    if let Some(path) = upstream.path_env() {
        command.env("PATH", path);
    }
    command
        .output()
        .unwrap_or_else(|e| panic!("run ebpf-portmap {args:?}: {e}"))
}

/// The entries `list --json` shows for upstream's mappings:
/// `host -> container` and ` (network)` where the backend records one.
fn upstream_listed(world: &World, upstream: &Upstream) -> Vec<String> {
    let listed: Value = serde_json::from_str(&operator(world, upstream, &["list", "--json"]))
        .expect("list --json prints JSON");
    let mut entries: Vec<String> = listed
        .as_array()
        .expect("list is an array")
        .iter()
        .filter(|entry| entry["upstream"] == upstream.backend)
        .map(|entry| {
            let mut text = format!(
                "{} -> {}",
                entry["host"].as_str().unwrap_or("?"),
                entry["containerID"].as_str().unwrap_or("?"),
            );
            if let Some(network) = entry["network"].as_str() {
                text.push_str(&format!(" ({network})"));
            }
            text
        })
        .collect();
    entries.sort();
    entries
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
    let upstream = Upstream::iptables(&world);
    switch_in(&world, &upstream);
}

#[test]
fn switching_in_from_the_nftables_backend_keeps_its_pods_and_their_del_leaves_no_rule() {
    let mut world = World::bridge();
    let Some(upstream) = Upstream::nftables(&mut world) else {
        return;
    };
    switch_in(&world, &upstream);
}

fn switch_in(world: &World, upstream: &Upstream) {
    // The node before upstream's first ADD (bridge has ipMasq off: no nat).
    let before = node_state(world, upstream);
    let conflist = &upstream.conflist;

    let old = world.node.add_container("old");
    let _old_servers = serve(&old);
    let old_ports = [PortMapping::tcp(8080, 80), PortMapping::udp(8081, 81)];
    world
        .runner
        .add(conflist, &old.with_port_mappings(&old_ports))
        .unwrap_or_else(|e| panic!("upstream ADD of old: {e}\n{}", world.dump()));
    assert_answers(world, "old", 8080, 8081, "through upstream");
    assert_ne!(
        node_state(world, upstream),
        before,
        "upstream's ADD wrote its rules"
    );

    // The conflist now names ebpf-portmap: a new pod brings our programs.
    let fresh = world.node.add_container("fresh");
    let _fresh_servers = serve(&fresh);
    world.add(
        &fresh,
        &[PortMapping::tcp(8090, 80), PortMapping::udp(8091, 81)],
    );
    assert_answers(world, "fresh", 8090, 8091, "through ebpf-portmap");
    assert_answers(world, "old", 8080, 8081, "upstream's pod after the switch");

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
            msg.contains("container old")
                && msg.contains("upstream portmap")
                && msg.contains(upstream.backend),
            "the refusal names upstream's holder: {msg}"
        );
        // The runtime cleans up a failed ADD with DEL: that DEL is not old's.
        world
            .runner
            .del(&world.list, &rt)
            .unwrap_or_else(|e| panic!("DEL after the refused ADD: {e}"));
    }
    assert_answers(
        world,
        "old",
        8080,
        8081,
        "after the refused ADDs and their DELs",
    );
    // The iptables backend records the network; the nftables one does not.
    let network = match upstream.nft {
        None => format!(" ({})", world.list.name()),
        Some(_) => String::new(),
    };
    assert_eq!(
        upstream_listed(world, upstream),
        [
            "0.0.0.0:8080/tcp -> old",
            "0.0.0.0:8081/udp -> old",
            "[::]:8080/tcp -> old",
            "[::]:8081/udp -> old",
        ]
        .map(|entry| format!("{entry}{network}")),
        "list shows upstream's mappings in their own entries"
    );

    // old goes away; its DEL goes to the chain the conflist names now.
    world
        .runner
        .del(&world.list, &old.with_port_mappings(&old_ports))
        .unwrap_or_else(|e| panic!("DEL of old through ebpf-portmap: {e}"));
    assert_eq!(
        node_state(world, upstream),
        before,
        "the DEL of upstream's last pod through ebpf-portmap leaves the node's rules as before upstream's first ADD\n{}",
        plugin_log(world)
    );
    match tcp_request(&world.node.ext, sock(NODE_IP4, 8080), "late", GONE) {
        Err(e) if e.is_unreachable() => {}
        other => panic!("8080 still answers after old's DEL: {other:?}"),
    }
    assert_eq!(
        upstream_listed(world, upstream),
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
        world,
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
    assert_eq!(
        node_state(world, upstream),
        before,
        "nothing of upstream came back"
    );
}

/// CNI GC with the runtime's keep-list removes upstream's rules of this
/// network's containers it no longer lists (their DEL never came, or came
/// before the switch to a build that knew upstream), and keeps the others'.
#[test]
fn gc_removes_upstreams_rules_of_containers_the_runtime_no_longer_lists() {
    // ebpf-portmap alone at CNI 1.1.0 (GC), on the network upstream's pods use.
    let world = World::plugin_only();
    let upstream = Upstream::iptables(&world);
    gc_of_upstream(&world, &upstream);
}

#[test]
fn gc_removes_the_nftables_backends_rules_of_containers_the_runtime_no_longer_lists() {
    let mut world = World::plugin_only();
    let Some(upstream) = Upstream::nftables(&mut world) else {
        return;
    };
    gc_of_upstream(&world, &upstream);
}

fn gc_of_upstream(world: &World, upstream: &Upstream) {
    let before = node_state(world, upstream);
    let conflist = &upstream.conflist;
    let kept = world.node.add_container("kept");
    let _kept_servers = serve(&kept);
    let gone = world.node.add_container("gone");
    let kept_rt =
        kept.with_port_mappings(&[PortMapping::tcp(8080, 80), PortMapping::udp(8081, 81)]);
    let gone_rt = gone.with_port_mappings(&[PortMapping::tcp(8082, 80)]);
    for rt in [&kept_rt, &gone_rt] {
        world
            .runner
            .add(conflist, rt)
            .unwrap_or_else(|e| panic!("upstream ADD of {}: {e}", rt.container_id));
    }
    // The runtime lost `gone` (its DEL never comes): only GC can clean up.
    assert!(world.runner.forget(conflist, &gone_rt));
    world
        .runner
        .gc(&world.list, &[(&kept_rt).into()])
        .unwrap_or_else(|e| panic!("GC: {e}\n{}", plugin_log(world)));
    let left = node_state(world, upstream);
    assert!(
        !upstream.mentions(&left, "gone"),
        "GC removed upstream's rules of the unlisted container:\n{left}\n{}",
        plugin_log(world)
    );
    assert!(
        upstream.mentions(&left, "kept"),
        "GC kept upstream's rules of the listed container:\n{left}"
    );
    assert_answers(world, "kept", 8080, 8081, "the kept pod after GC");

    // Cleanup through upstream's own chain; bridge and host-local free
    // `gone`'s address (upstream's DEL of it finds nothing, as ours would).
    for rt in [&kept_rt, &gone_rt] {
        world
            .runner
            .del(conflist, rt)
            .unwrap_or_else(|e| panic!("upstream DEL of {}: {e}", rt.container_id));
    }
    // Upstream's own DEL leaves its shared chains: a GC after that removes them.
    world
        .runner
        .gc(&world.list, &[])
        .unwrap_or_else(|e| panic!("GC: {e}"));
    assert_eq!(
        node_state(world, upstream),
        before,
        "nothing of upstream is left\n{}",
        plugin_log(world)
    );
}

/// `migrate` judges each container upstream still maps on the runtime's
/// result cache: a live one is kept; one the runtime lost (no cache entry)
/// and one whose network namespace is gone (the entry outlived it) are
/// reported, then removed with `--remove`, and a second run finds nothing.
/// Without a cache it refuses, changing nothing.
#[test]
fn migrate_removes_upstreams_rules_of_gone_containers_only() {
    let world = World::bridge();
    let upstream = Upstream::iptables(&world);
    migrate_leftovers(world, upstream);
}

#[test]
fn migrate_removes_the_nftables_backends_rules_of_gone_containers_only() {
    let mut world = World::bridge();
    let Some(upstream) = Upstream::nftables(&mut world) else {
        return;
    };
    migrate_leftovers(world, upstream);
}

fn migrate_leftovers(mut world: World, upstream: Upstream) {
    let results = world.node.data_dir().join("cni-cache").join("results");
    world.runner = runner(&world, upstream.nft.as_ref()).with_results_dir(&results);
    let results_arg = results.to_str().expect("UTF-8 temp path").to_owned();
    let migrate = |extra: &[&str]| {
        let mut args = vec!["migrate", "--json", "--results-dir", &results_arg];
        args.extend_from_slice(extra);
        let out = operator_output(&world, &upstream, &args);
        let json: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "migrate {extra:?} printed no JSON ({e}): {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        });
        (out.status.code(), json)
    };
    let states = |json: &Value| -> Vec<String> {
        let mut states: Vec<String> = json["leftovers"]
            .as_array()
            .expect("leftovers is an array")
            .iter()
            .map(|l| {
                format!(
                    "{} {}",
                    l["containerID"].as_str().unwrap_or("-"),
                    l["state"].as_str().unwrap_or("?")
                )
            })
            .collect();
        states.dedup();
        states
    };
    let before = node_state(&world, &upstream);
    let conflist = &upstream.conflist;
    let alive = world.node.add_container("alive");
    let _alive_servers = serve(&alive);
    let alive_rt =
        alive.with_port_mappings(&[PortMapping::tcp(8080, 80), PortMapping::udp(8081, 81)]);
    let lost = world.node.add_container("lost");
    let lost_rt = lost.with_port_mappings(&[PortMapping::tcp(8082, 80)]);
    let crashed = world.node.add_container("crashed");
    let crashed_rt = crashed.with_port_mappings(&[PortMapping::tcp(8083, 80)]);
    for rt in [&alive_rt, &lost_rt, &crashed_rt] {
        world
            .runner
            .add(conflist, rt)
            .unwrap_or_else(|e| panic!("upstream ADD of {}: {e}", rt.container_id));
    }
    // The runtime lost `lost`; `crashed`'s namespace went without a DEL.
    assert!(world.runner.forget(conflist, &lost_rt));
    drop(crashed);
    let mapped = node_state(&world, &upstream);

    let (code, report) = migrate(&[]);
    assert_eq!(
        states(&report),
        ["alive live", "crashed gone", "lost gone"],
        "the verdicts: {report:#}"
    );
    assert_eq!(code, Some(1), "gone containers' rules are left: {report:#}");
    assert_eq!(
        node_state(&world, &upstream),
        mapped,
        "a report changes nothing"
    );

    // No cache: no evidence, a refusal naming the option, nothing changed.
    let out = operator_output(
        &world,
        &upstream,
        &[
            "migrate",
            "--remove",
            "--results-dir",
            "/nonexistent/cni/results",
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--results-dir"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        node_state(&world, &upstream),
        mapped,
        "a refusal changes nothing"
    );

    let (code, report) = migrate(&["--remove"]);
    assert_eq!(code, Some(0), "{report:#}");
    let left = node_state(&world, &upstream);
    for id in ["lost", "crashed"] {
        assert!(
            !upstream.mentions(&left, id),
            "{id}'s rules removed:\n{left}"
        );
    }
    assert!(
        upstream.mentions(&left, "alive"),
        "alive's rules kept:\n{left}"
    );
    assert_answers(
        &world,
        "alive",
        8080,
        8081,
        "the live pod after migrate --remove",
    );

    // Idempotent: nothing more to find or remove.
    let (code, report) = migrate(&["--remove"]);
    assert_eq!(code, Some(0), "{report:#}");
    assert_eq!(states(&report), ["alive live"], "{report:#}");
    assert_eq!(report["removed"], Value::Array(Vec::new()), "{report:#}");
    assert_eq!(
        node_state(&world, &upstream),
        left,
        "a second run changes nothing"
    );

    // alive's own DEL through upstream, then migrate takes what upstream leaves.
    world
        .runner
        .del(conflist, &alive_rt)
        .unwrap_or_else(|e| panic!("upstream DEL of alive: {e}"));
    for rt in [&lost_rt, &crashed_rt] {
        // bridge and host-local free their addresses.
        let _ = world.runner.del(conflist, rt);
    }
    // What upstream's DEL leaves (shared chains, an emptied table) maps no
    // container: removing it needs no evidence, so no cache either.
    let out = operator_output(
        &world,
        &upstream,
        &[
            "migrate",
            "--remove",
            "--results-dir",
            "/nonexistent/cni/results",
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        node_state(&world, &upstream),
        before,
        "nothing of upstream is left: {}",
        String::from_utf8_lossy(&out.stdout)
    );
}
