//! What an operator is told must be true (issue #38): every exit of the
//! plugin is counted with its code, a misspelt key is named with the key
//! meant, a wrong `pinRoot` or namespace is named as what it is, and each
//! message names the fix. Needs root; every test has its own namespaces,
//! pin root and log file.

#![allow(
    clippy::result_large_err,
    reason = "CniFailure carries the whole plugin exchange on purpose (see cni.rs)"
)]

use portmap_tests::agent::Agent;
use portmap_tests::cni::{CniCommand, inject_identity};
use portmap_tests::tmp::TempDir;
use portmap_tests::topology::PLUGIN_LOG;
use portmap_tests::world::World;
use portmap_tests::{Conflist, PortMapping, RuntimeAttachment};
use serde_json::{Value, json};

/// The value of the sample `series` (name and labels exactly as served) in
/// a Prometheus exposition; 0 when it is absent (a code never seen).
fn sample(exposition: &str, series: &str) -> f64 {
    exposition
        .lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .map_or(0.0, |value| {
            value
                .trim()
                .parse()
                .unwrap_or_else(|e| panic!("{series}: {value:?} is not a number: {e}"))
        })
}

/// Runs our plugin alone with `config` on stdin; the CNI code it failed
/// with (the test wants a failure).
fn failing_code(world: &World, command: CniCommand, rt: &RuntimeAttachment, config: &Value) -> u64 {
    match world
        .runner
        .exec_plugin("ebpf-portmap", command, Some(rt), config)
    {
        Ok(out) => panic!("{command:?} with {config:#} succeeded: {}", out.stdout),
        Err(failure) => failure
            .error_code()
            .unwrap_or_else(|| panic!("{command:?} failed without an error code: {failure}")),
    }
}

/// A broken conflist rollout (the most common failure) must show in
/// `cni_requests_total`, which the README's `EbpfPortmapCniFailures` alert
/// watches: requests refused for their configuration (codes 1 and 7) or
/// environment (4) are counted with their code, for every verb.
#[test]
fn configuration_failures_are_counted_with_their_code() {
    let world = World::bridge();
    let web = world.node.add_container("web");
    let rt = web.with_port_mappings(&[PortMapping::tcp(8080, 80)]);
    let prev = world.add(&web, &[PortMapping::tcp(8080, 80)]);
    let good = world.our_config(&rt, Some(&prev));

    let with = |key: &str, value: Value| {
        let mut config = good.clone();
        config[key] = value;
        config
    };
    let bad_id = RuntimeAttachment {
        container_id: "not a container id!".into(),
        ..rt.clone()
    };
    // (verb, code, attachment, stdin)
    let failures = [
        ("ADD", 1, &rt, with("cniVersion", "9.9.9".into())),
        ("ADD", 7, &rt, with("maxMappings", 0.into())),
        ("ADD", 7, &rt, with("hostPortListeners", "maybe".into())),
        ("ADD", 4, &bad_id, good.clone()),
        ("DEL", 7, &rt, with("name", "not a name!".into())),
        ("CHECK", 7, &rt, with("maxMappings", 0.into())),
    ];
    for (verb, code, rt, config) in &failures {
        let command = match *verb {
            "ADD" => CniCommand::Add,
            "DEL" => CniCommand::Del,
            _ => CniCommand::Check,
        };
        assert_eq!(
            failing_code(&world, command, rt, config),
            *code,
            "{verb} with {config:#}"
        );
    }

    let agent = Agent::start(&world);
    let exposition = agent.metrics();
    for (verb, code) in [("ADD", 1), ("ADD", 7), ("ADD", 4), ("DEL", 7), ("CHECK", 7)] {
        let expected = failures
            .iter()
            .filter(|(v, c, _, _)| *v == verb && *c == code)
            .count() as f64;
        let series = format!(r#"ebpf_portmap_cni_requests_total{{verb="{verb}",code="{code}"}}"#);
        assert_eq!(
            sample(&exposition, &series),
            expected,
            "{series}: each refused {verb} counted once; the agent serves:\n{exposition}"
        );
    }
    assert_eq!(
        sample(
            &exposition,
            r#"ebpf_portmap_cni_requests_total{verb="ADD",code="0"}"#
        ),
        1.0,
        "the one good ADD:\n{exposition}"
    );
}

/// The conflist of `world` with `edit` applied to ebpf-portmap's entry.
fn edited_list(world: &World, edit: impl FnOnce(&mut Value)) -> Conflist {
    let mut json = world.list.json().clone();
    let plugin = json["plugins"]
        .as_array_mut()
        .expect("plugins")
        .iter_mut()
        .find(|p| p["type"] == "ebpf-portmap")
        .expect("ebpf-portmap in the conflist");
    edit(plugin);
    Conflist::from_json(json).expect("a well-formed conflist")
}

fn plugin_log(world: &World) -> String {
    std::fs::read_to_string(world.node.data_dir().join(PLUGIN_LOG)).unwrap_or_default()
}

/// `status --json`, whatever its exit status.
fn status_json(world: &World) -> Value {
    let out = world.operator(&["status", "--json"]);
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "status --json is not JSON ({e}): {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn notes(status: &Value) -> Vec<String> {
    status["notes"]
        .as_array()
        .expect("notes")
        .iter()
        .map(|n| n.as_str().expect("a note").to_owned())
        .collect()
}

/// A misspelt key (`"interfcaes"`, `"hostPortListener"`) was ignored
/// without a word: the ADD's log and `status` name it with the key meant,
/// and a fixed conflist's next ADD clears the note.
#[test]
fn misspelt_keys_are_named_with_the_key_meant() {
    let mut world = World::bridge();
    world.list = edited_list(&world, |plugin| {
        plugin["interfcaes"] = json!(["nothing*"]);
        plugin["hostPortListener"] = json!("allow");
    });
    let web = world.node.add_container("web");
    world.add(&web, &[PortMapping::tcp(8080, 80)]);

    let log = plugin_log(&world);
    for (key, meant) in [
        ("interfcaes", "interfaces"),
        ("hostPortListener", "hostPortListeners"),
    ] {
        let said = format!(
            r#"key "{key}" is not one ebpf-portmap knows and is ignored; did you mean "{meant}"?"#
        );
        assert!(log.contains(&said), "the ADD's log says {said:?}:\n{log}");
    }
    let status = status_json(&world);
    let found = notes(&status);
    for (key, meant) in [
        ("interfcaes", "interfaces"),
        ("hostPortListener", "hostPortListeners"),
    ] {
        assert!(
            found.iter().any(|n| n.contains(&format!("{key:?}"))
                && n.contains(&format!("did you mean {meant:?}"))
                && n.contains(world.list.name())),
            "status names {key} and {meant} for network {}: {found:#?}",
            world.list.name()
        );
    }
    let mut recorded: Vec<Value> = status["misspeltKeys"]
        .as_array()
        .expect("misspeltKeys")
        .clone();
    recorded.sort_by_key(|note| note["key"].to_string());
    assert_eq!(
        recorded,
        [
            json!({"network": world.list.name(), "key": "hostPortListener", "didYouMean": "hostPortListeners"}),
            json!({"network": world.list.name(), "key": "interfcaes", "didYouMean": "interfaces"}),
        ],
        "{status:#}"
    );

    // Fixed: the next ADD clears the note.
    world.list = edited_list(&world, |plugin| {
        let plugin = plugin.as_object_mut().expect("an object");
        plugin.remove("interfcaes");
        plugin.remove("hostPortListener");
    });
    let api = world.node.add_container("api");
    world.add(&api, &[PortMapping::tcp(9090, 80)]);
    let status = status_json(&world);
    assert_eq!(status["misspeltKeys"], json!([]), "{status:#}");
    assert!(
        !notes(&status).iter().any(|n| n.contains("did you mean")),
        "{:#?}",
        notes(&status)
    );
}

/// A `pinRoot` on a directory that is not bpffs is the configuration's
/// mistake: ADD and STATUS answer code 7 naming `pinRoot` and the fix, not
/// code 5 with "mount -t bpf bpf /sys/fs/bpf" (which changes nothing), and
/// nothing is made there.
#[test]
fn a_pin_root_off_bpffs_is_a_configuration_error_naming_pin_root() {
    let mut world = World::bridge();
    let off_bpffs = world.node.data_dir().join("not-bpffs").join("pins");
    world.list = edited_list(&world, |plugin| {
        plugin["pinRoot"] = json!(off_bpffs);
    });
    let web = world.node.add_container("web");
    let add = world
        .runner
        .add(
            &world.list,
            &web.with_port_mappings(&[PortMapping::tcp(8080, 80)]),
        )
        .expect_err("ADD with a pinRoot off bpffs");
    assert_eq!(add.plugin, "ebpf-portmap", "{add}");
    let list = world.list.clone().with_cni_version("1.1.0");
    let status = world
        .runner
        .exec_plugin(
            "ebpf-portmap",
            CniCommand::Status,
            None,
            &inject_identity(&list, world.our_plugin()),
        )
        .expect_err("STATUS with a pinRoot off bpffs");
    // ADD: the configuration's mistake. STATUS: the spec's "not
    // available" (its codes are 50 and 51), with the same message.
    for (verb, failure, code) in [("ADD", &add, 7), ("STATUS", &status, 50)] {
        assert_eq!(failure.error_code(), Some(code), "{verb}: {failure}");
        let msg = failure.error_msg().unwrap_or_default();
        for part in [
            "pinRoot",
            off_bpffs.to_str().expect("UTF-8"),
            "not on a bpffs",
            "/sys/fs/bpf/ebpf-portmap",
        ] {
            assert!(msg.contains(part), "{verb}'s message names {part:?}: {msg}");
        }
        assert!(
            !msg.contains("mount -t bpf bpf /sys/fs/bpf"),
            "{verb} gives advice that changes nothing: {msg}"
        );
    }
    assert!(
        !off_bpffs.exists(),
        "a refused ADD makes nothing at {}",
        off_bpffs.display()
    );
}

/// `gc` with nothing to do is a usage error (exit 2, as clap's own), and
/// `gc --dry-run` reports each class it looked at, in words ("no stale
/// traffic counter", never "entr(y/ies)").
#[test]
fn gc_says_what_it_looked_at_and_refuses_an_empty_command_as_usage() {
    let world = World::bridge();
    let web = world.node.add_container("web");
    world.add(&web, &[PortMapping::tcp(8080, 80)]);

    let nothing = world.operator(&["gc"]);
    assert_eq!(
        nothing.status.code(),
        Some(2),
        "gc without a class: {}",
        String::from_utf8_lossy(&nothing.stderr)
    );
    let said = String::from_utf8_lossy(&nothing.stderr);
    for option in ["--network", "--empty-owners", "--orphans", "--stale-links"] {
        assert!(said.contains(option), "names {option}: {said}");
    }

    let network = world.list.name().to_owned();
    for dry_run in [true, false] {
        let mut args = vec![
            "gc",
            "--network",
            &network,
            "--keep",
            "web/eth0",
            "--empty-owners",
            "--orphans",
            "--stale-links",
        ];
        if dry_run {
            args.push("--dry-run");
        }
        let out = world.operator(&args);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{args:?}: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        for line in [
            "no owner to remove",
            "no mapping without an owner",
            "no stale traffic counter",
            "no stale attachment pin",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "{args:?} reports {line:?}:\n{text}"
            );
        }
        assert!(
            !text.contains("(s)") && !text.contains("(y/ies)"),
            "{args:?} counts in words:\n{text}"
        );
    }
    assert_eq!(world.mapping_count(), 2, "the kept container's mappings");
}

/// Runs our plugin as the unprivileged user `nobody` (no capabilities), in
/// the node namespace, with `config` on stdin: (exit status, stdout).
fn plugin_as_nobody(
    world: &World,
    command: &str,
    rt: Option<&RuntimeAttachment>,
    config: &Value,
) -> (std::process::ExitStatus, String) {
    use std::io::Write;
    let mut child = world
        .node
        .ns
        .command("/usr/bin/setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(portmap_tests::plugin_bin())
        .env("CNI_COMMAND", command)
        .env(
            "CNI_CONTAINERID",
            rt.map_or(String::new(), |rt| rt.container_id.clone()),
        )
        .env(
            "CNI_NETNS",
            rt.map_or(std::path::PathBuf::new(), |rt| rt.netns_path.clone()),
        )
        .env(
            "CNI_IFNAME",
            rt.map_or(String::new(), |rt| rt.ifname.clone()),
        )
        .env("CNI_PATH", "/nonexistent")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn the plugin through setpriv");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(config.to_string().as_bytes())
        .expect("write stdin");
    let out = child.wait_with_output().expect("the plugin's output");
    (
        out.status,
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// A plugin run without the privilege it needs answers one code, 104, and
/// one text naming what is missing and "run it as root", whatever the
/// verb and however far it got (ADD said 5 before); `version` says why
/// the kernel's features read "unknown".
#[test]
fn a_run_without_privilege_says_so_with_one_code_and_one_text() {
    let world = World::bridge();
    let web = world.node.add_container("web");
    let rt = web.with_port_mappings(&[PortMapping::tcp(8080, 80)]);
    let prev = world.add(&web, &[PortMapping::tcp(8080, 80)]);
    let config = world.our_config(&rt, Some(&prev));
    let fresh = world.node.add_container("fresh");
    let fresh_rt = fresh.with_port_mappings(&[PortMapping::tcp(9090, 80)]);
    for (verb, rt) in [("ADD", &fresh_rt), ("CHECK", &rt)] {
        let (status, stdout) = plugin_as_nobody(&world, verb, Some(rt), &config);
        assert_eq!(status.code(), Some(1), "{verb} as nobody: {stdout}");
        let error: Value = serde_json::from_str(&stdout)
            .unwrap_or_else(|e| panic!("{verb}: not an error document ({e}): {stdout}"));
        assert_eq!(error["code"], 104, "{verb} as nobody: {error:#}");
        let msg = error["msg"].as_str().unwrap_or_default();
        assert!(
            msg.contains("CAP_BPF") && msg.contains("run it as root"),
            "{verb} names what is missing and the fix: {msg}"
        );
    }

    let out = world
        .node
        .ns
        .command("/usr/bin/setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(portmap_tests::plugin_bin())
        .args(["version", "-o", "json"])
        .env_remove("CNI_COMMAND")
        .output()
        .expect("version as nobody");
    let version: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "version -o json ({e}): {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let features = version["features"].as_array().expect("features");
    assert!(
        features.iter().all(|f| f["supported"] == "unknown"),
        "nobody cannot ask the kernel: {version:#}"
    );
    let why = version["featuresUnknownBecause"]
        .as_str()
        .unwrap_or_default();
    assert!(
        why.contains("CAP_BPF") && why.contains("root"),
        "version says why the features are unknown: {version:#}"
    );
}

/// An operator verb run in another network namespace than the node's got
/// the ADD's advice ("set another pinRoot ... `rm -r` removes what it
/// left": deleting a live dataplane), a bare cookie and exit 1. It names
/// the node's namespace and `nsenter --net=`, and exits 3 (cannot inspect).
#[test]
fn a_verb_in_the_wrong_namespace_names_the_nodes_and_nsenter() {
    let world = World::bridge();
    let web = world.node.add_container("web");
    world.add(&web, &[PortMapping::tcp(8080, 80)]);
    let node_netns = world.node.ns.path().display().to_string();
    for verb in [&["status"][..], &["list"], &["gc", "--stale-links"]] {
        let out = world
            .node
            .ext
            .command(portmap_tests::plugin_bin())
            .args(verb)
            .arg("--pin-root")
            .arg(world.pins.path())
            .env_remove("CNI_COMMAND")
            .env_remove("EPM_PIN_ROOT")
            .output()
            .expect("run ebpf-portmap");
        let said = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{verb:?} elsewhere: {said}");
        assert!(
            said.contains(&format!("nsenter --net={node_netns}")),
            "{verb:?} names the node's namespace {node_netns} and nsenter: {said}"
        );
        assert!(
            !said.contains("rm -r"),
            "{verb:?} never advises removing a live dataplane: {said}"
        );
    }
}

/// `uninstall` while the node agent runs was undone within a second (the
/// agent re-creates everything): it refuses, naming the agent and how to
/// stop it, and changes nothing; with `--stop-agent` it stops the agent
/// first and the dataplane stays gone.
#[test]
fn uninstall_refuses_while_the_agent_runs_or_stops_it() {
    let world = World::bridge();
    let web = world.node.add_container("web");
    world.add(&web, &[PortMapping::tcp(8080, 80)]);
    let agent = Agent::start(&world);
    let record = portmap_tests::bpffs::agent_record(world.pins.path());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !record.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the agent recorded itself at {} within 20 s:\n{}",
            record.display(),
            agent.log_text()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }

    let refused = world.operator(&["uninstall", "--force"]);
    let said = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "refused: {said}");
    for part in [
        &format!("pid {}", agent.pid())[..],
        "systemctl stop ebpf-portmap-agent",
        "--stop-agent",
    ] {
        assert!(said.contains(part), "names {part:?}: {said}");
    }
    assert_eq!(
        world.mapping_count(),
        2,
        "a refused uninstall changes nothing"
    );

    let stopped = world.operator(&["uninstall", "--force", "--stop-agent"]);
    let text = String::from_utf8_lossy(&stopped.stdout);
    assert!(
        stopped.status.success(),
        "uninstall --stop-agent: {text}{}",
        String::from_utf8_lossy(&stopped.stderr)
    );
    assert!(
        text.contains(&format!("stopped the node agent (pid {})", agent.pid())),
        "{text}"
    );
    // The agent exited (a zombie until the test reaps it on drop), so
    // nothing re-creates the pins.
    let exited = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| {
            stat.rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !exited(agent.pid()) {
        assert!(
            std::time::Instant::now() < deadline,
            "the agent did not exit:\n{}",
            agent.log_text()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(
        !world.pins.path().join("v1").exists(),
        "the dataplane stays uninstalled:\n{}",
        agent.log_text()
    );
    assert!(!record.exists(), "the agent's record is gone");
}

/// `chain install` in place of an upstream `portmap` entry turned
/// `snat: false` into the default true and dropped `conditionsV4` and
/// `markMasqBit` without a word. Keys with an equivalent are carried over
/// (conditions are enforced by ebpf-portmap itself), every other key is
/// named as left out with why, and chaining again changes nothing.
#[test]
fn chain_install_carries_snat_and_conditions_over_and_names_what_it_leaves() {
    let dir = portmap_tests::tmp::TempDir::new("chain");
    let file = dir.path().join("10-net.conflist");
    std::fs::write(
        &file,
        json!({
            "cniVersion": "1.0.0",
            "name": "net",
            "plugins": [
                {"type": "bridge", "bridge": "cni0"},
                {
                    "type": "portmap",
                    "capabilities": {"portMappings": true},
                    "snat": false,
                    "conditionsV4": ["-s", "198.18.0.0/16"],
                    "conditionsV6": ["!", "-s", "fd18::/64"],
                    "markMasqBit": 13,
                },
            ],
        })
        .to_string(),
    )
    .expect("write the conflist");
    let chain = |args: &[&str]| {
        std::process::Command::new(portmap_tests::plugin_bin())
            .arg("chain")
            .args(args)
            .env_remove("CNI_COMMAND")
            .output()
            .expect("run ebpf-portmap chain")
    };
    let path = file.to_str().expect("UTF-8");
    let out = chain(&["install", "--file", path]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let list: Value =
        serde_json::from_slice(&std::fs::read(&file).expect("read")).expect("the chained JSON");
    let ours = &list["plugins"][1];
    assert_eq!(ours["type"], "ebpf-portmap", "{list:#}");
    assert_eq!(ours["snat"], false, "snat carried over: {ours:#}");
    assert_eq!(
        ours["conditionsV4"],
        json!(["-s", "198.18.0.0/16"]),
        "{ours:#}"
    );
    assert_eq!(
        ours["conditionsV6"],
        json!(["!", "-s", "fd18::/64"]),
        "{ours:#}"
    );
    assert_eq!(ours.get("markMasqBit"), None, "{ours:#}");
    assert!(
        ["snat", "conditionsV4", "conditionsV6"].iter().all(|k| said
            .lines()
            .any(|l| l.contains("carried over") && l.contains(k))),
        "says what it carried over: {said}"
    );
    assert!(
        said.lines()
            .any(|l| l.contains("left out markMasqBit") && l.contains("marks no packets")),
        "names the key it left out and why: {said}"
    );

    let again = chain(&["install", "--file", path]);
    assert!(again.status.success());
    let after: Value = serde_json::from_slice(&std::fs::read(&file).expect("read")).expect("JSON");
    assert_eq!(after, list, "chaining again keeps what was carried over");
}

/// `status` opened with ~90 lines of tables and gave its verdict last. It
/// opens with the verdict and the problems, shows an interface that lacks
/// the programs as a row of the interface table, and names the cgroup the
/// socket hooks are on.
#[test]
fn status_opens_with_its_verdict_and_shows_what_lacks_the_programs() {
    let world = World::bridge();
    let added = world.add_until_hooks_recorded();
    let _side = world
        .node
        .add_side_link("eth2", "198.20.0.1/24", "198.20.0.2/24");
    let out = world.operator(&["status"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(1), "degraded:\n{text}");
    let lines: Vec<&str> = text.lines().collect();
    let at = |what: &str| {
        lines
            .iter()
            .position(|l| l.contains(what))
            .unwrap_or_else(|| panic!("no line with {what:?}:\n{text}"))
    };
    assert!(at("degraded: ") < 5, "the verdict comes first:\n{text}");
    assert!(
        at("problem: eth2 (index") < at("Interfaces"),
        "the problems come before the tables:\n{text}"
    );
    let row = lines[at("Interfaces")..]
        .iter()
        .find(|l| l.starts_with("eth2"))
        .unwrap_or_else(|| panic!("eth2 is a row of the interface table:\n{text}"));
    assert!(row.contains("no programs"), "{row}");
    let cgroup = portmap_tests::cgroup::cgroup_for_pin_root(world.pins.path());
    assert!(
        text.contains(&format!("socket hooks on cgroup {}", cgroup.display())),
        "names the hooks' cgroup {}:\n{text}",
        cgroup.display()
    );
    // One vocabulary: each counter beside what `trace` calls it.
    for (counter, in_trace) in [
        ("dnat_new", "translated-new"),
        ("fwd_disabled", "forwarding-disabled"),
        ("stale_flow", "no-backend"),
    ] {
        let row = lines[at("Counters since")..]
            .iter()
            .find(|l| l.split_whitespace().next() == Some(counter))
            .unwrap_or_else(|| panic!("no counter row {counter}:\n{text}"));
        assert_eq!(
            row.split_whitespace().nth(1),
            Some(in_trace),
            "{counter} shown beside {in_trace}: {row}"
        );
    }
    for (container, mapping) in &added {
        world.del(container, std::slice::from_ref(mapping));
    }
}

/// A world whose `ebpf-portmap` is a wrapper that, while `private` exists
/// in `dir`, runs the plugin as a runtime in a container or a unit with
/// `PrivateMounts` would: in a mount namespace of its own with private
/// propagation (`unshare --mount`), where /sys/fs/bpf is not mounted. The
/// namespace dies with the run; nothing of it reaches the test's.
fn private_mount_world(dir: &TempDir) -> World {
    let wrapper = dir.path().join("ebpf-portmap-private");
    let script = format!(
        "#!/bin/sh\n\
         if [ -e '{dir}/private' ]; then\n\
         exec unshare --mount --propagation private -- sh -c '\
         while grep -q \" /sys/fs/bpf \" /proc/self/mounts; do umount -l /sys/fs/bpf || exit 97; done; \
         exec \"$0\" \"$@\"' '{bin}' \"$@\"\n\
         fi\n\
         exec '{bin}' \"$@\"\n",
        dir = dir.path().display(),
        bin = portmap_tests::plugin_bin().display(),
    );
    std::fs::write(&wrapper, script).expect("write the wrapper");
    std::fs::set_permissions(
        &wrapper,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod the wrapper");
    let node = portmap_tests::Node::new();
    let pins = portmap_tests::PinRoot::new();
    let plugins = portmap_tests::PluginDirs::with_plugin_bin(&wrapper);
    let runner = portmap_tests::CniRunner::new(plugins.paths(), &node.ns);
    let list = portmap_tests::bridge_conflist(
        "epm-test",
        "ebpf-portmap",
        Some(pins.path()),
        node.data_dir(),
    );
    World {
        node,
        pins,
        plugins,
        runner,
        list,
    }
}

/// The container IDs of the `list --json` rows (one row per family).
fn listed_containers(world: &World) -> Vec<String> {
    world
        .list()
        .as_array()
        .expect("list is an array")
        .iter()
        .map(|r| r["containerID"].as_str().expect("containerID").to_owned())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect()
}

/// Issue #38 item 1: a plugin that does not see the node's bpffs (a
/// private mount namespace without /sys/fs/bpf, no propagation) must not
/// mount a private one and report success. ADD fails naming the fix
/// (bind-mount /sys/fs/bpf into the runtime's namespace), STATUS says the
/// same, DEL and GC exit 0 and log what they could not reach, and a GC
/// that sees the node's bpffs removes what that DEL left.
#[test]
fn a_plugin_without_the_nodes_bpffs_refuses_add_and_says_what_del_left() {
    let dir = TempDir::new("privmnt");
    let world = private_mount_world(&dir);
    let web = world.node.add_container("web");
    let web_rt = web.with_port_mappings(&[PortMapping::tcp(8080, 80)]);
    world.add(&web, &[PortMapping::tcp(8080, 80)]);
    assert_eq!(
        listed_containers(&world),
        std::slice::from_ref(&web_rt.container_id)
    );

    std::fs::write(dir.path().join("private"), b"").expect("write the marker");
    // STATUS and GC exist from CNI 1.1.0; the reference bridge speaks 1.0.0.
    let list_1_1 = world.list.clone().with_cni_version("1.1.0");
    let status = world
        .runner
        .exec_plugin(
            "ebpf-portmap",
            CniCommand::Status,
            None,
            &inject_identity(&list_1_1, world.our_plugin()),
        )
        .expect_err("STATUS without the node's bpffs");
    let db = world.node.add_container("db");
    let add = world
        .runner
        .add(
            &world.list,
            &db.with_port_mappings(&[PortMapping::tcp(8081, 80)]),
        )
        .map(|_| plugin_log(&world))
        .expect_err("ADD without the node's bpffs must fail, not mount a private bpffs");
    assert_eq!(add.plugin, "ebpf-portmap", "{add}");
    assert_eq!(status.error_code(), Some(50), "STATUS: {status}");
    let status_msg = status.error_msg().unwrap_or_default().to_owned();
    let add_msg = add.error_msg().unwrap_or_default().to_owned();
    for (verb, msg) in [("STATUS", &status_msg), ("ADD", &add_msg)] {
        for part in [
            "not the node's",
            "Bind-mount the node's /sys/fs/bpf",
            "mount namespace",
        ] {
            assert!(msg.contains(part), "{verb}'s message names {part:?}: {msg}");
        }
        assert!(
            !msg.contains("mount -t bpf"),
            "{verb} gives advice that changes nothing here: {msg}"
        );
    }
    assert_eq!(status_msg, add_msg, "STATUS and ADD agree");

    // DEL of the container the node's dataplane serves: exit 0 (the
    // runtime's chain goes on), and the log says what was left.
    world
        .runner
        .del(&world.list, &web_rt)
        .unwrap_or_else(|e| panic!("DEL must exit 0 without the node's bpffs: {e}"));
    let log = plugin_log(&world);
    let said = log
        .lines()
        .find(|l| {
            l.contains("DEL") && l.contains(&web_rt.container_id) && l.contains("nothing removed")
        })
        .unwrap_or_else(|| panic!("DEL logs what it could not reach:\n{log}"));
    assert!(said.contains("Bind-mount") && said.contains("GC"), "{said}");
    let gc = portmap_tests::cni::gc_plugin_config(&list_1_1, world.our_plugin(), &[]);
    world
        .runner
        .exec_plugin("ebpf-portmap", CniCommand::Gc, None, &gc)
        .unwrap_or_else(|e| panic!("GC without the node's bpffs exits 0: {e}"));
    let log = plugin_log(&world);
    assert!(
        log.lines().any(|l| l.contains("GC")
            && l.contains("nothing collected")
            && l.contains("Bind-mount")),
        "GC logs what it could not reach:\n{log}"
    );
    assert_eq!(
        listed_containers(&world),
        std::slice::from_ref(&web_rt.container_id),
        "the node's mapping of web is still there, and nothing of db's"
    );

    // Where the node's bpffs is visible, GC removes what DEL left.
    std::fs::remove_file(dir.path().join("private")).expect("remove the marker");
    world
        .runner
        .exec_plugin("ebpf-portmap", CniCommand::Gc, None, &gc)
        .unwrap_or_else(|e| panic!("GC on the node: {e}"));
    assert_eq!(
        listed_containers(&world),
        Vec::<String>::new(),
        "GC removed web's mapping"
    );
}
