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

/// `ebpf-portmap migrate --json --results-dir RESULTS EXTRA...`: its exit
/// code and the JSON report it printed.
fn migrate_json(
    world: &World,
    upstream: &Upstream,
    results_dir: &str,
    extra: &[&str],
) -> (Option<i32>, Value) {
    let mut args = vec!["migrate", "--json", "--results-dir", results_dir];
    args.extend_from_slice(extra);
    let out = operator_output(world, upstream, &args);
    let json: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "migrate {extra:?} printed no JSON ({e}): {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code(), json)
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

/// CNI GC with the runtime's keep-list removes upstream's iptables rules
/// of this network's containers it no longer lists (their DEL never came,
/// or came before the switch to a build that knew upstream), and keeps the
/// others'. The nftables backend's rules name no network: a container the
/// keep-list leaves out may be another network's, so GC leaves its rules
/// and says so (`migrate` judges them on the runtime's cache).
#[test]
fn gc_removes_upstreams_rules_of_containers_the_runtime_no_longer_lists() {
    // ebpf-portmap alone at CNI 1.1.0 (GC), on the network upstream's pods use.
    let world = World::plugin_only();
    let upstream = Upstream::iptables(&world);
    gc_of_upstream(&world, &upstream);
}

#[test]
fn gc_leaves_the_nftables_backends_rules_it_cannot_prove_its_networks() {
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
    match upstream.nft {
        None => assert!(
            !upstream.mentions(&left, "gone"),
            "GC removed upstream's rules of the unlisted container:\n{left}\n{}",
            plugin_log(world)
        ),
        Some(_) => {
            assert!(
                upstream.mentions(&left, "gone"),
                "GC leaves nftables rules that name no network:\n{left}\n{}",
                plugin_log(world)
            );
            let log = plugin_log(world);
            assert!(
                log.contains("rules of {\"gone\"} left") && log.contains("name no network"),
                "GC says what it left and why:\n{log}"
            );
        }
    }
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
    let migrate = |extra: &[&str]| migrate_json(&world, &upstream, &results_arg, extra);
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

/// The nftables backend's rules in `nft list ruleset`, counters left out:
/// what another network's upstream holds.
fn nft_state(world: &World, upstream: &Upstream) -> String {
    let state = node_state(world, upstream);
    state
        .split_once("nft list ruleset:")
        .map(|(_, nft)| nft.to_owned())
        .unwrap_or_default()
}

/// Network B beside the world's network A: bridge `epmb0`,
/// 10.250.0.0/24 and fd50::/64, with upstream `portmap` 1.9's nftables
/// backend. Its containers route only the outside client's subnets through
/// it, so one container can sit on both networks.
fn network_b(world: &World) -> Conflist {
    let mut json = bridge_conflist("epm-b", "portmap", None, world.node.data_dir())
        .json()
        .clone();
    json["plugins"][0]["bridge"] = Value::from("epmb0");
    json["plugins"][0]["ipam"]["ranges"] =
        serde_json::json!([[{"subnet": "10.250.0.0/24"}], [{"subnet": "fd50::/64"}]]);
    json["plugins"][0]["ipam"]["routes"] =
        serde_json::json!([{"dst": "198.18.0.0/24"}, {"dst": "fd18::/64"}]);
    json["plugins"][1]["backend"] = Value::from("nftables");
    Conflist::from_json(json).expect("a well-formed conflist")
}

/// Two networks on one node: B keeps upstream `portmap` 1.9 with its
/// nftables backend, A runs ebpf-portmap. Upstream's rules record no
/// network, so nothing A does may take them on a container ID alone: A's
/// DEL of a container that is on B too, A's GC (whose keep-list never
/// names B's containers) and `migrate` leave B's rules, and B's hostPort
/// keeps answering.
#[test]
fn another_networks_nftables_rules_survive_this_networks_del_gc_and_migrate() {
    let mut world = World::plugin_only();
    let Some(upstream) = Upstream::nftables(&mut world) else {
        return;
    };
    let results = world.node.data_dir().join("cni-cache").join("results");
    world.runner = runner(&world, upstream.nft.as_ref()).with_results_dir(&results);
    // A: bridge + host-local + ebpf-portmap at 1.1.0 (GC), on cni0.
    let mut a_json = bridge_conflist(
        world.list.name(),
        "ebpf-portmap",
        Some(world.pins.path()),
        world.node.data_dir(),
    )
    .json()
    .clone();
    a_json["cniVersion"] = Value::from("1.1.0");
    a_json["plugins"][1] = world.list.json()["plugins"][0].clone();
    let network_a = Conflist::from_json(a_json).expect("a well-formed conflist");
    let network_b = network_b(&world);

    let bee = world.node.add_container("bee");
    let _bee_servers = serve(&bee);
    let bee_rt = bee.with_port_mappings(&[PortMapping::tcp(8080, 80), PortMapping::udp(8081, 81)]);
    world
        .runner
        .add(&network_b, &bee_rt)
        .unwrap_or_else(|e| panic!("upstream ADD of bee on B: {e}\n{}", world.dump()));
    assert_answers(&world, "bee", 8080, 8081, "B's pod through upstream");

    // `both` is on A (eth0) and on B (eth1); `ant` on A only.
    let both = world.node.add_container("both");
    let both_a = both.with_port_mappings(&[PortMapping::tcp(8094, 80)]);
    let mut both_b = both.with_port_mappings(&[PortMapping::tcp(8084, 80)]);
    both_b.ifname = "eth1".into();
    let ant = world.node.add_container("ant");
    let ant_rt = ant.with_port_mappings(&[PortMapping::tcp(8090, 80)]);
    for (list, rt, what) in [
        (&network_a, &both_a, "both on A"),
        (&network_b, &both_b, "both on B"),
        (&network_a, &ant_rt, "ant on A"),
    ] {
        world
            .runner
            .add(list, rt)
            .unwrap_or_else(|e| panic!("ADD of {what}: {e}\n{}", plugin_log(&world)));
    }
    let b_rules = nft_state(&world, &upstream);
    for id in ["bee", "both"] {
        assert!(upstream.mentions(&b_rules, id), "{id} on B:\n{b_rules}");
    }

    // A's DELs: `both`'s prevResult on A names its A address, not B's.
    for (rt, what) in [(&both_a, "both"), (&ant_rt, "ant")] {
        world
            .runner
            .del(&network_a, rt)
            .unwrap_or_else(|e| panic!("DEL of {what} on A: {e}"));
        assert_eq!(
            nft_state(&world, &upstream),
            b_rules,
            "A's DEL of {what} leaves B's rules\n{}",
            plugin_log(&world)
        );
    }

    // A's GC: nothing of A is live, and B's containers are not A's to list.
    world
        .runner
        .gc(&network_a, &[])
        .unwrap_or_else(|e| panic!("GC of A: {e}\n{}", plugin_log(&world)));
    assert_eq!(
        nft_state(&world, &upstream),
        b_rules,
        "A's GC leaves B's rules\n{}",
        plugin_log(&world)
    );
    let log = plugin_log(&world);
    assert!(
        log.contains("left: not in this network's keep-list") && log.contains("name no network"),
        "GC says what it left and why:\n{log}"
    );

    // migrate, on the runtime's cache: B's containers are live.
    let results_arg = results.to_str().expect("UTF-8 temp path");
    let (code, report) = migrate_json(&world, &upstream, results_arg, &["--remove"]);
    assert_eq!(code, Some(0), "{report:#}");
    assert_eq!(report["removed"], Value::Array(Vec::new()), "{report:#}");
    assert_eq!(
        nft_state(&world, &upstream),
        b_rules,
        "migrate leaves B's live rules: {report:#}"
    );
    assert_answers(
        &world,
        "bee",
        8080,
        8081,
        "B's pod after A's DELs, GC and migrate",
    );

    for rt in [&both_b, &bee_rt] {
        world
            .runner
            .del(&network_b, rt)
            .unwrap_or_else(|e| panic!("upstream DEL of {} on B: {e}", rt.container_id));
    }
}

/// An upstream ADD that lands between a removal's read and its write keeps
/// its rules: the DEL of upstream's last pod, through ebpf-portmap, is held
/// there (the debug-build knob `EBPF_PORTMAP_TEST_UPSTREAM_PAUSE`) while
/// upstream adds another pod. Its write then fails on what changed, and a
/// fresh read removes only the old pod's rules.
#[test]
fn an_upstream_add_during_our_removal_keeps_its_rules() {
    let world = World::bridge();
    let upstream = Upstream::iptables(&world);
    removal_racing_an_add(world, upstream);
}

#[test]
fn an_upstream_nftables_add_during_our_removal_keeps_its_table() {
    let mut world = World::bridge();
    let Some(upstream) = Upstream::nftables(&mut world) else {
        return;
    };
    removal_racing_an_add(world, upstream);
}

fn removal_racing_an_add(mut world: World, upstream: Upstream) {
    let pause = world.node.data_dir().join("upstream-pause");
    std::fs::create_dir_all(&pause).expect("a pause directory");
    world.runner =
        runner(&world, upstream.nft.as_ref()).with_env("EBPF_PORTMAP_TEST_UPSTREAM_PAUSE", &pause);
    let conflist = &upstream.conflist;
    let old = world.node.add_container("old");
    let old_rt = old.with_port_mappings(&[PortMapping::tcp(8080, 80), PortMapping::udp(8081, 81)]);
    world
        .runner
        .add(conflist, &old_rt)
        .unwrap_or_else(|e| panic!("upstream ADD of old: {e}"));
    let new = world.node.add_container("new");
    let _new_servers = serve(&new);
    let new_rt = new.with_port_mappings(&[PortMapping::tcp(8090, 80), PortMapping::udp(8091, 81)]);

    std::thread::scope(|scope| {
        // old's DEL, through ebpf-portmap: it reads, then waits.
        let del = scope.spawn(|| world.runner.del(&world.list, &old_rt));
        let paused = pause.join("paused");
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while !paused.exists() {
            assert!(
                std::time::Instant::now() < deadline && !del.is_finished(),
                "the DEL never reached the pause between its read and its write\n{}",
                plugin_log(&world)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let added = world.runner.add(conflist, &new_rt);
        std::fs::write(pause.join("resume"), b"").expect("resume the DEL");
        added.unwrap_or_else(|e| panic!("upstream ADD of new during the DEL: {e}"));
        del.join()
            .expect("the DEL thread")
            .unwrap_or_else(|e| panic!("DEL of old through ebpf-portmap: {e}"));
    });

    let left = node_state(&world, &upstream);
    assert!(
        !upstream.mentions(&left, "old"),
        "old's rules removed:\n{left}\n{}",
        plugin_log(&world)
    );
    assert!(
        upstream.mentions(&left, "new"),
        "the ADD made during the removal keeps its rules:\n{left}\n{}",
        plugin_log(&world)
    );
    assert_answers(
        &world,
        "new",
        8090,
        8091,
        "the pod added during the removal",
    );
    let log = plugin_log(&world);
    assert!(
        log.contains("the removal did not apply") && log.contains("reading them again"),
        "the write made on the stale read failed, and a fresh read was used:\n{log}"
    );
    world
        .runner
        .del(conflist, &new_rt)
        .unwrap_or_else(|e| panic!("upstream DEL of new: {e}"));
}

/// A rule in upstream's table that the parser cannot read (here a port set,
/// as a future upstream might write) is still a rule: the DEL of upstream's
/// last pod it can read leaves the table, and that rule, in place.
#[test]
fn a_table_holding_a_rule_the_parser_cannot_read_is_not_deleted() {
    let mut world = World::bridge();
    let Some(upstream) = Upstream::nftables(&mut world) else {
        return;
    };
    let nft = upstream.nft.as_ref().expect("the nftables backend");
    let old = world.node.add_container("old");
    let old_rt = old.with_port_mappings(&[PortMapping::tcp(8080, 80)]);
    world
        .runner
        .add(&upstream.conflist, &old_rt)
        .unwrap_or_else(|e| panic!("upstream ADD of old: {e}"));
    let out = world
        .node
        .ns
        .command(nft.nft())
        .args([
            "add rule ip cni_hostport hostports tcp dport { 9000, 9001 } dnat to 10.244.0.99:80 comment \"future\"",
        ])
        .output()
        .unwrap_or_else(|e| panic!("run nft: {e}"));
    assert!(
        out.status.success(),
        "nft add rule: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    world
        .runner
        .del(&world.list, &old_rt)
        .unwrap_or_else(|e| panic!("DEL of old through ebpf-portmap: {e}"));
    let left = nft_state(&world, &upstream);
    assert!(
        !upstream.mentions(&left, "old"),
        "old's rules removed:\n{left}"
    );
    assert!(
        upstream.mentions(&left, "future") && left.contains("table ip cni_hostport"),
        "the table keeps the rule the parser cannot read:\n{left}\n{}",
        plugin_log(&world)
    );
}

/// A network name over 171 characters: upstream 1.1's iptables comments
/// (`dnat name: "NET" id: "ID"`) pass 255 bytes and upstream cuts them to
/// the first 253 and `...`. `migrate` and GC match them as upstream writes
/// them, so a live container's rules stay; the DEL of that container,
/// through ebpf-portmap, finds and removes them.
#[test]
fn upstreams_cut_comments_keep_a_live_containers_rules_until_its_del() {
    let long = format!("long-{}", "n".repeat(175));
    let world = World::with(|_, pins, data| {
        Conflist::from_json(serde_json::json!({
            "cniVersion": "1.1.0",
            "name": long,
            "plugins": [{
                "type": "ebpf-portmap",
                "capabilities": {"portMappings": true},
                "pinRoot": pins,
                "logFile": data.join(PLUGIN_LOG),
                "cgroupPath": portmap_tests::cgroup::cgroup_for_pin_root(pins),
            }]
        }))
        .expect("a well-formed conflist")
    });
    let results = world.node.data_dir().join("cni-cache").join("results");
    let mut world = world;
    world.runner = runner(&world, None).with_results_dir(&results);
    let upstream = Upstream {
        conflist: bridge_conflist(&long, "portmap", None, world.node.data_dir()),
        backend: "iptables-nft",
        nft: None,
    };
    let before = node_state(&world, &upstream);
    // 64-character IDs, as runtimes make them; upstream keeps 54.
    let id = |name: &str| format!("{name}{}", "0".repeat(64 - name.len()));
    let live = world.node.add_container("live");
    let _live_servers = serve(&live);
    let mut live_rt =
        live.with_port_mappings(&[PortMapping::tcp(8080, 80), PortMapping::udp(8081, 81)]);
    live_rt.container_id = id("live");
    let lost = world.node.add_container("lost");
    let mut lost_rt = lost.with_port_mappings(&[PortMapping::tcp(8082, 80)]);
    lost_rt.container_id = id("lost");
    for rt in [&live_rt, &lost_rt] {
        world
            .runner
            .add(&upstream.conflist, rt)
            .unwrap_or_else(|e| panic!("upstream ADD of {}: {e}", rt.container_id));
    }
    let mapped = node_state(&world, &upstream);
    // Upstream writes 253 bytes and `...`; iptables stores 255 of them.
    let cut = format!("id: \\\"{}..\" ", &id("live")[..54]);
    assert!(
        mapped.contains(&cut),
        "upstream cut the comment to {cut}:\n{mapped}"
    );
    let has = |state: &str, name: &str| state.contains(&format!("id: \\\"{name}"));
    // The runtime lost `lost`.
    assert!(world.runner.forget(&upstream.conflist, &lost_rt));

    let results_arg = results.to_str().expect("UTF-8 temp path");
    let (code, report) = migrate_json(&world, &upstream, results_arg, &["--remove"]);
    assert_eq!(code, Some(0), "{report:#}");
    let left = node_state(&world, &upstream);
    assert!(
        has(&left, "live"),
        "migrate keeps the live container's rules: {report:#}\n{left}"
    );
    assert!(
        !has(&left, "lost"),
        "migrate removes the lost one's: {report:#}\n{left}"
    );
    assert_answers(&world, "live", 8080, 8081, "the live pod after migrate");

    world
        .runner
        .gc(&world.list, &[(&live_rt).into()])
        .unwrap_or_else(|e| panic!("GC: {e}\n{}", plugin_log(&world)));
    let left = node_state(&world, &upstream);
    assert!(
        has(&left, "live"),
        "GC keeps the listed container's rules:\n{left}\n{}",
        plugin_log(&world)
    );
    assert_answers(&world, "live", 8080, 8081, "the live pod after GC");

    // live's DEL comes to ebpf-portmap (with upstream's cached result as
    // prevResult): its cut rules go, and with them upstream's shared chains.
    world
        .runner
        .del(&world.list, &live_rt)
        .unwrap_or_else(|e| panic!("DEL of live through ebpf-portmap: {e}"));
    assert_eq!(
        node_state(&world, &upstream),
        before,
        "live's DEL removes its rules and upstream's chains\n{}",
        plugin_log(&world)
    );
    // bridge and host-local free the addresses (upstream's DEL finds nothing).
    let _ = world.runner.del(&upstream.conflist, &live_rt);
    let _ = world.runner.del(&upstream.conflist, &lost_rt);
}
