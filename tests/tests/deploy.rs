//! The Kubernetes deployment in `deploy/`.
//!
//! - `install.sh` against a fake node root in a temp dir, under both shells
//!   it meets: Debian's `/bin/sh` (dash) and busybox, the image's shell, with
//!   nothing but busybox applets on PATH;
//! - the conflist it chains, run for real (ADD, traffic, DEL) with the
//!   binary it installed (needs root, like the other integration tests);
//! - the manifest checked against the Dockerfile and the script: the paths
//!   and names that must agree across the three. (The manifest's schema is
//!   checked by `cargo xtask test`'s manifest step.)

#[path = "deploy/manifest.rs"]
mod manifest;
#[path = "deploy/node.rs"]
mod node;

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use portmap_tests::agent::Agent;
use portmap_tests::cgroup::cgroup_for_pin_root;
use portmap_tests::topology::{NODE_IP4, PLUGIN_LOG};
use portmap_tests::traffic::{echo_reply, tcp_echo_server, tcp_request};
use portmap_tests::world::{GONE, PROBE, World, expect_unreachable, sock};
use portmap_tests::{
    CniRunner, Conflist, Node, PinRoot, PluginDirs, PortMapping, bridge_conflist, plugin_bin,
};
use serde_json::{Value, json};

use manifest::{at, dockerfile_copies, manifest, read, script_default};
use node::{
    BIN_DIR, BOUND, FakeNode, KINDNET, PIN_ROOT, SETPRIV, SHELLS, Shell, Watch, bridge_list,
    identity, our_default_entry, pretty, script,
};

#[test]
fn appends_after_a_bridge_and_installs_the_binary() {
    for shell in SHELLS {
        let node = FakeNode::new();
        let original = pretty(&bridge_list());
        node.write_config("10-bridge.conflist", &original);

        node.run(shell, "install", &[])
            .ok()
            .says("ebpf-portmap: installed")
            .says("chained ebpf-portmap as plugin 2 of 2, appended")
            .says("original kept as 10-bridge.conflist.ebpf-portmap.bak");

        let installed = fs::read(node.plugin()).expect("the binary is on the node");
        assert!(
            installed == fs::read(plugin_bin()).expect("the built binary"),
            "{shell:?}: the node's binary differs from the one installed"
        );
        let mode = fs::metadata(node.plugin())
            .expect("stat")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o755, "{shell:?}: binary mode {mode:o}");
        assert_eq!(
            fs::read_to_string(node.config("10-bridge.conflist.ebpf-portmap.bak"))
                .expect("the backup"),
            original,
            "{shell:?}: the backup is the original, byte for byte"
        );

        let chained = node.read_json("10-bridge.conflist");
        let mut expected = bridge_list();
        expected["plugins"]
            .as_array_mut()
            .expect("plugins")
            .push(our_default_entry());
        assert_eq!(chained, expected, "{shell:?}");

        let leftovers: Vec<_> = node
            .snapshot()
            .into_keys()
            .filter(|path| path.to_string_lossy().contains(".tmp"))
            .collect();
        assert!(
            leftovers.is_empty(),
            "{shell:?}: temp files left: {leftovers:?}"
        );

        // The runtime executes the copy on the node: it must be the plugin.
        let mut version = Command::new(node.plugin())
            .env("CNI_COMMAND", "VERSION")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("running the installed plugin");
        std::io::Write::write_all(
            &mut version.stdin.take().expect("stdin"),
            br#"{"cniVersion":"1.0.0"}"#,
        )
        .expect("writing VERSION's stdin");
        let out = version.wait_with_output().expect("VERSION output");
        assert!(out.status.success(), "VERSION failed: {out:?}");
        let answer: Value = serde_json::from_slice(&out.stdout).expect("VERSION's JSON");
        assert!(
            answer["supportedVersions"]
                .as_array()
                .is_some_and(|versions| versions.contains(&chained["cniVersion"])),
            "the plugin does not speak the list's version: {answer}"
        );
    }
}

#[test]
fn upstream_portmap_is_replaced_in_place() {
    for shell in SHELLS {
        let node = FakeNode::new();
        let with_bandwidth = KINDNET.replace(
            "\t\t}\n\t}\n\t]",
            "\t\t}\n\t},\n\t{ \"type\": \"bandwidth\", \"capabilities\": { \"bandwidth\": true } }\n\t]",
        );
        let with_annotations = with_bandwidth.replace(
            "\"portMappings\": true",
            "\"portMappings\": true, \"io.kubernetes.cri.pod-annotations\": true",
        );
        node.write_config("10-kindnet.conflist", &with_annotations);

        node.run(
            shell,
            "install",
            &[("EPM_PLUGIN_CONF", r#"{"hostPortListeners":"allow"}"#)],
        )
        .ok()
        .says("chained ebpf-portmap as plugin 2 of 3, in place of portmap");

        let chained = node.read_json("10-kindnet.conflist");
        let original: Value = serde_json::from_str(&with_annotations).expect("JSON");
        let types: Vec<&str> = chained["plugins"]
            .as_array()
            .expect("plugins")
            .iter()
            .map(|p| p["type"].as_str().expect("type"))
            .collect();
        assert_eq!(types, ["ptp", "ebpf-portmap", "bandwidth"], "{shell:?}");
        assert_eq!(chained["plugins"][0], original["plugins"][0]);
        assert_eq!(chained["plugins"][2], original["plugins"][2]);
        assert_eq!(
            chained["plugins"][1],
            json!({"type": "ebpf-portmap",
                   "capabilities": {"portMappings": true, "io.kubernetes.cri.pod-annotations": true},
                   "hostPortListeners": "allow"}),
            "{shell:?}: our entry, the operator's keys, portmap's capabilities"
        );
        // The keys keep kindnet's order (only the layout changes).
        let text = fs::read_to_string(node.config("10-kindnet.conflist")).expect("read");
        let at = |key: &str| text.find(key).unwrap_or_else(|| panic!("{key} in {text}"));
        assert!(at("\"cniVersion\"") < at("\"name\"") && at("\"ipMasq\"") < at("\"mtu\""));
    }
}

#[test]
fn a_single_plugin_conf_becomes_a_conflist_and_comes_back() {
    for shell in SHELLS {
        let node = FakeNode::new();
        let single = json!({
            "cniVersion": "0.4.0",
            "name": "bridge-net",
            "type": "bridge",
            "bridge": "cni0",
            "ipam": {"type": "host-local", "subnet": "10.22.0.0/16"}
        });
        node.write_config("10-bridge.conf", &pretty(&single));
        let before = node.net_snapshot();

        node.run(shell, "install", &[])
            .ok()
            .says("10-bridge.conflist: chained ebpf-portmap as plugin 2 of 2, appended")
            .says("converted from 10-bridge.conf");
        assert!(
            !node.config("10-bridge.conf").exists(),
            "{shell:?}: the .conf must go, or the runtime keeps using it"
        );
        assert_eq!(
            node.read_json("10-bridge.conflist"),
            json!({"cniVersion": "0.4.0", "name": "bridge-net",
                   "plugins": [single, our_default_entry()]}),
            "{shell:?}"
        );
        node.run(shell, "install", &[]).ok().says("already chained");

        node.run(shell, "uninstall", &[])
            .ok()
            .says("10-bridge.conf: restored, 10-bridge.conflist removed")
            .says("ebpf-portmap: removed");
        assert_eq!(
            node.net_snapshot(),
            before,
            "{shell:?}: not restored exactly"
        );
    }
}

#[test]
fn a_second_run_changes_nothing() {
    for shell in SHELLS {
        let node = FakeNode::new();
        node.write_config("10-kindnet.conflist", KINDNET);
        node.run(shell, "install", &[]).ok();
        let after_first = node.snapshot();
        let conflist = identity(&node.config("10-kindnet.conflist"));
        let binary = identity(&node.plugin());

        let second = node.run(shell, "install", &[]);
        second
            .ok()
            .says("10-kindnet.conflist: ebpf-portmap already chained");
        assert!(!second.stdout.contains("installed"), "{}", second.stdout);
        assert_eq!(
            node.snapshot(),
            after_first,
            "{shell:?}: the second run changed files"
        );
        assert_eq!(
            identity(&node.config("10-kindnet.conflist")),
            conflist,
            "{shell:?}: the conflist was rewritten"
        );
        assert_eq!(
            identity(&node.plugin()),
            binary,
            "{shell:?}: the binary was rewritten"
        );
    }
}

#[test]
fn uninstall_restores_the_node_exactly() {
    for shell in SHELLS {
        let node = FakeNode::new();
        node.write_config("10-kindnet.conflist", KINDNET);
        fs::set_permissions(
            node.config("10-kindnet.conflist"),
            fs::Permissions::from_mode(0o600),
        )
        .expect("chmod");
        node.write_config(
            "99-loopback.conf",
            r#"{"cniVersion":"1.0.0","name":"lo","type":"loopback"}"#,
        );
        fs::write(node.config("calico-kubeconfig"), "apiVersion: v1\n").expect("write");
        fs::write(node.path(BIN_DIR).join("ptp"), "not really ptp").expect("write");
        let before = node.snapshot();

        node.run(shell, "install", &[]).ok();
        assert_eq!(
            fs::metadata(node.config("10-kindnet.conflist"))
                .expect("stat")
                .permissions()
                .mode()
                & 0o777,
            0o600,
            "{shell:?}: the chained file keeps the original's mode"
        );
        node.run(shell, "uninstall", &[])
            .ok()
            .says("10-kindnet.conflist: restored")
            .says("ebpf-portmap: removed");
        assert_eq!(
            node.snapshot(),
            before,
            "{shell:?}: uninstall did not restore the node"
        );

        node.run(shell, "uninstall", &[])
            .ok()
            .says("nothing to restore")
            .says("ebpf-portmap: not installed");
        assert_eq!(
            node.snapshot(),
            before,
            "{shell:?}: a second uninstall changed files"
        );
    }
}

#[test]
fn the_lexically_first_config_is_chained() {
    for shell in SHELLS {
        let node = FakeNode::new();
        let second = pretty(&bridge_list()).replace("mynet", "second");
        node.write_config("20-second.conflist", &second);
        node.write_config("10-kindnet.conflist", KINDNET);
        node.write_config(
            "99-loopback.conf",
            r#"{"cniVersion":"1.0.0","name":"lo","type":"loopback"}"#,
        );
        // Neither is a configuration the runtime loads.
        fs::create_dir(node.config("00-dir.conflist")).expect("mkdir");
        fs::write(node.config("00-notes.txt"), "{").expect("write");

        node.run(shell, "install", &[])
            .ok()
            .says("10-kindnet.conflist: chained");
        assert_eq!(
            fs::read_to_string(node.config("20-second.conflist")).expect("read"),
            second,
            "{shell:?}: only the first configuration is chained"
        );
        let names: Vec<_> = node.net_snapshot().into_keys().collect();
        assert_eq!(
            names,
            [
                "00-dir.conflist",
                "00-notes.txt",
                "10-kindnet.conflist",
                "10-kindnet.conflist.ebpf-portmap.bak",
                "20-second.conflist",
                "99-loopback.conf"
            ]
            .map(PathBuf::from),
            "{shell:?}"
        );
    }
}

#[test]
fn epm_cni_network_chains_the_named_network_and_uninstall_restores_it() {
    for shell in SHELLS {
        let node = FakeNode::new();
        let second = pretty(&bridge_list()).replace("mynet", "second");
        node.write_config("10-kindnet.conflist", KINDNET);
        node.write_config("20-second.conflist", &second);
        let env = [("EPM_CNI_NETWORK", "second")];

        node.run(shell, "install", &env)
            .ok()
            .says("20-second.conflist: chained");
        assert_eq!(
            fs::read_to_string(node.config("10-kindnet.conflist")).expect("read"),
            KINDNET,
            "{shell:?}: the lexically first configuration is not the one asked for"
        );
        let chained: Value = serde_json::from_str(
            &fs::read_to_string(node.config("20-second.conflist")).expect("read"),
        )
        .expect("JSON");
        assert!(
            chained["plugins"]
                .as_array()
                .expect("plugins")
                .iter()
                .any(|p| p["type"] == "ebpf-portmap"),
            "{shell:?}: {chained}"
        );
        node.run(shell, "ready", &env).ok();
        node.run(shell, "uninstall", &env).ok();
        assert_eq!(
            fs::read_to_string(node.config("20-second.conflist")).expect("read"),
            second,
            "{shell:?}: restored byte for byte"
        );
    }
}

#[test]
fn unusable_configurations_are_refused_and_left_alone() {
    let cases = [
        // Half a file, as a crashed writer leaves it.
        (
            "10-broken.conflist",
            &KINDNET[..KINDNET.len() / 2],
            "not valid JSON",
        ),
        (
            "10-noplugins.conflist",
            r#"{"cniVersion":"1.0.0","name":"n"}"#,
            "\"plugins\" must be a non-empty array",
        ),
        // Our plugin does not speak 0.2.0: every ADD would fail.
        (
            "10-old.conflist",
            &KINDNET.replace("0.3.1", "0.2.0"),
            "the plugin would refuse the entry",
        ),
        (
            "10-notype.conf",
            r#"{"cniVersion":"1.0.0","name":"n"}"#,
            "needs a string \"type\"",
        ),
    ];
    for shell in SHELLS {
        for (name, text, reason) in &cases {
            let node = FakeNode::new();
            node.write_config(name, text);
            node.write_config("20-good.conflist", KINDNET);
            let before = node.net_snapshot();
            node.run(shell, "install", &[])
                .expect_code(1)
                .says(name)
                .says(reason);
            assert_eq!(
                node.net_snapshot(),
                before,
                "{shell:?} {name}: files changed"
            );
            node.run(shell, "ready", &[]).expect_code(1);
        }
    }
}

#[test]
fn missing_directories_fail_without_creating_anything() {
    for shell in SHELLS {
        let node = FakeNode::bare();
        fs::create_dir_all(node.path(BIN_DIR)).expect("mkdir");
        node.run(shell, "install", &[])
            .expect_code(1)
            .says("etc/cni/net.d: no such directory");
        assert_eq!(
            node.snapshot().into_keys().collect::<Vec<_>>(),
            ["opt", "opt/cni", "opt/cni/bin"].map(PathBuf::from),
            "{shell:?}: something was created"
        );
    }
}

#[test]
fn ready_tells_whether_the_node_is_as_the_action_leaves_it() {
    for shell in SHELLS {
        let node = FakeNode::new();
        node.run(shell, "ready", &[]).expect_code(1);
        node.write_config("10-kindnet.conflist", KINDNET);
        node.run(shell, "ready", &[]).expect_code(1);
        node.run(shell, "install", &[]).ok();
        node.run(shell, "ready", &[])
            .ok()
            .says("ebpf-portmap chained");
        // Another entry than the one asked for is not ready.
        node.run(shell, "ready", &[("EPM_PLUGIN_CONF", r#"{"snat":false}"#)])
            .expect_code(1);
        // The main plugin wrote its file again.
        node.write_config("10-kindnet.conflist", KINDNET);
        node.run(shell, "ready", &[]).expect_code(1);

        // Removal: ready once nothing is chained, even while the binary
        // waits for the dataplane to go (a rollout must not stop there).
        let cleanup = [("EPM_ACTION", "cleanup")];
        node.run(shell, "install", &[]).ok();
        node.run(shell, "ready", &cleanup).expect_code(1);
        fs::create_dir_all(node.path(PIN_ROOT).join("v1")).expect("mkdir");
        node.run(shell, "uninstall", &[]).expect_code(3);
        assert!(node.plugin().exists());
        node.run(shell, "ready", &cleanup).ok();
    }
}

#[test]
fn uninstall_keeps_the_binary_while_the_dataplane_is_pinned() {
    for shell in SHELLS {
        let node = FakeNode::new();
        node.write_config("10-kindnet.conflist", KINDNET);
        node.run(shell, "install", &[]).ok();
        fs::create_dir_all(node.path(PIN_ROOT).join("v1/maps")).expect("mkdir");

        node.run(shell, "uninstall", &[])
            .expect_code(3)
            .says("10-kindnet.conflist: restored")
            .says("still pinned under /sys/fs/bpf/ebpf-portmap")
            .says("'ebpf-portmap uninstall'");
        assert!(node.plugin().exists(), "{shell:?}: the binary was removed");
        assert_eq!(
            fs::read_to_string(node.config("10-kindnet.conflist")).expect("read"),
            KINDNET
        );

        // `ebpf-portmap uninstall` removes the pins (and the root if empty).
        fs::remove_dir_all(node.path(PIN_ROOT)).expect("rm");
        node.run(shell, "uninstall", &[])
            .ok()
            .says("ebpf-portmap: removed");
        assert!(!node.plugin().exists());
    }
}

/// A configuration chained by hand (no backup) that the runtime uses: the
/// binary must stay, or every pod on the node fails to start.
#[test]
fn uninstall_keeps_the_binary_while_a_hand_chained_config_names_it() {
    for shell in SHELLS {
        let node = FakeNode::new();
        node.write_config("10-kindnet.conflist", KINDNET);
        node.run(shell, "install", &[]).ok();
        fs::remove_file(node.config("10-kindnet.conflist.ebpf-portmap.bak")).expect("rm");
        let before = node.snapshot();
        node.run(shell, "uninstall", &[])
            .expect_code(1)
            .says("still names ebpf-portmap and has no backup");
        assert_eq!(
            node.snapshot(),
            before,
            "{shell:?}: uninstall changed the node"
        );
    }
}

/// POSIX sh, as shellcheck reads it: also what neither dash nor busybox
/// would catch (bashisms both happen to accept, quoting mistakes).
#[test]
fn install_sh_passes_shellcheck() {
    let out = Command::new("shellcheck")
        .args(["--shell=sh", "--severity=style"])
        .arg(script())
        .output()
        .expect("shellcheck is missing: `cargo xtask setup` installs it");
    assert!(
        out.status.success(),
        "shellcheck:\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn unknown_actions_are_refused() {
    for shell in SHELLS {
        let node = FakeNode::new();
        node.run(shell, "instal", &[])
            .expect_code(2)
            .says("unknown action 'instal'");
        assert_eq!(
            node.snapshot().len(),
            FakeNode::new().snapshot().len(),
            "{shell:?}: nothing written"
        );
    }
}

/// The manifest drops every capability and runs as root: the script must
/// do its whole job like that.
#[test]
fn installs_and_uninstalls_with_no_capabilities() {
    let node = FakeNode::new();
    node.write_config("10-kindnet.conflist", KINDNET);
    let before = node.snapshot();
    let no_caps = |action: &str| {
        let inner = node.command(Shell::Busybox, action, &[]);
        let mut command = Command::new(SETPRIV);
        command
            .args([
                "--bounding-set=-all",
                "--inh-caps=-all",
                "--no-new-privs",
                "--",
            ])
            .arg(inner.get_program())
            .args(inner.get_args())
            .env_clear()
            .envs(
                inner
                    .get_envs()
                    .filter_map(|(key, value)| Some((key, value?))),
            );
        command
    };
    let status = Command::new(SETPRIV)
        .args([
            "--bounding-set=-all",
            "--inh-caps=-all",
            "--no-new-privs",
            "--",
        ])
        .args(["/bin/sh", "-c", "grep CapEff /proc/self/status"])
        .output()
        .expect("setpriv");
    assert_eq!(
        String::from_utf8_lossy(&status.stdout)
            .split_whitespace()
            .nth(1),
        Some("0000000000000000"),
        "setpriv did not drop the capabilities: {status:?}"
    );
    for (action, expected) in [("install", "chained"), ("uninstall", "restored")] {
        let out = no_caps(action).output().expect("setpriv");
        assert!(
            out.status.success() && String::from_utf8_lossy(&out.stdout).contains(expected),
            "install.sh {action} without capabilities: {out:?}"
        );
    }
    assert_eq!(
        node.snapshot(),
        before,
        "install + uninstall left the node changed"
    );
}

/// The DaemonSet's mode: waits for the main plugin's configuration, chains
/// it, chains it again after the main plugin rewrites it, logs only what
/// changed, and stops at once on SIGTERM (it runs as PID 1).
#[test]
fn watch_waits_chains_again_and_stops_on_sigterm() {
    for shell in SHELLS {
        let node = FakeNode::new();
        let log = node.path("watch.log");
        let log_file = fs::File::create(&log).expect("log file");
        let child = node
            .command(shell, "watch", &[("EPM_INTERVAL", "1")])
            .stdout(log_file.try_clone().expect("dup"))
            .stderr(log_file)
            .spawn()
            .expect("starting watch");
        let mut watch = Watch { child, log };

        watch.wait_for(shell, "no network configuration", || true);
        // Several rounds without a configuration.
        std::thread::sleep(Duration::from_millis(2500));
        node.write_config("10-kindnet.conflist", KINDNET);
        watch.wait_for(shell, "10-kindnet.conflist: chained", || {
            node.read_json("10-kindnet.conflist")["plugins"][1]["type"] == "ebpf-portmap"
        });

        // kindnet restarts with a new MTU and writes its file again.
        let rewritten = KINDNET.replace("1500", "1450");
        node.write_config("10-kindnet.conflist", &rewritten);
        watch.wait_for(shell, "chained", || {
            let chained = node.read_json("10-kindnet.conflist");
            chained["plugins"][0]["mtu"] == 1450 && chained["plugins"][1]["type"] == "ebpf-portmap"
        });
        assert_eq!(
            fs::read_to_string(node.config("10-kindnet.conflist.ebpf-portmap.bak"))
                .expect("backup"),
            rewritten,
            "{shell:?}: the backup is the main plugin's latest file"
        );

        let text = watch.log_text();
        assert_eq!(
            text.matches("no network configuration").count(),
            1,
            "{shell:?}: an unchanged state is logged once:\n{text}"
        );

        let started = Instant::now();
        // SAFETY: kill(2) on our own child's PID.
        unsafe { libc::kill(watch.child.id() as i32, libc::SIGTERM) };
        let status = loop {
            if let Some(status) = watch.child.try_wait().expect("wait") {
                break status;
            }
            assert!(
                started.elapsed() < BOUND,
                "{shell:?}: watch ignores SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(status.success(), "{shell:?}: watch exited {status}");
    }
}

/// What the DaemonSet does on a kind node, end to end: install.sh chains
/// the binary it copied into the node's bridge conflist in place of
/// portmap, and that conflist, run the way the runtime runs it, publishes a
/// container port to an external client. Needs root.
#[test]
fn the_chained_conflist_publishes_a_port_with_the_installed_binary() {
    let node = Node::new();
    let pins = PinRoot::new();
    let plugins = PluginDirs::new();
    let fake = FakeNode::new();
    let upstream = bridge_conflist("epm-test", "portmap", None, node.data_dir());
    fake.write_config("10-bridge.conflist", &pretty(upstream.json()));
    // The test's own pin root, cgroup and log (the defaults are the node's).
    let entry = json!({
        "pinRoot": pins.path(),
        "cgroupPath": cgroup_for_pin_root(pins.path()),
        "logFile": node.data_dir().join(PLUGIN_LOG),
    })
    .to_string();
    fake.run(Shell::Busybox, "install", &[("EPM_PLUGIN_CONF", &entry)])
        .ok()
        .says("in place of portmap");

    let list = Conflist::from_json(fake.read_json("10-bridge.conflist")).expect("a conflist");
    assert_eq!(list.plugin_types(), ["bridge", "ebpf-portmap"]);
    // The node's plugin directory first, as the runtime's CNI bin dir: our
    // plugin is the copy install.sh made, the others the reference ones.
    let mut dirs = vec![fake.path(BIN_DIR)];
    dirs.extend(plugins.paths());
    let runner = CniRunner::new(dirs, &node.ns);
    assert_eq!(runner.find_plugin("ebpf-portmap"), Some(fake.plugin()));
    let world = World {
        node,
        pins,
        plugins,
        runner,
        list,
    };

    let web = world.node.add_container("web");
    let _server = tcp_echo_server(&web.ns, 80, "web");
    let mappings = [PortMapping::tcp(8080, 80)];
    world.add(&web, &mappings);
    world.expect_answer(
        "TCP via the node's 8080",
        tcp_request(&world.node.ext, sock(NODE_IP4, 8080), "hello", PROBE),
        &echo_reply("web", "hello"),
    );
    assert!(
        world.mapping_count() > 0,
        "the mapping is in ebpf-portmap's maps, not upstream portmap's rules"
    );
    world.del(&web, &mappings);
    expect_unreachable(
        "TCP after DEL",
        tcp_request(&world.node.ext, sock(NODE_IP4, 8080), "late", GONE),
    );
}

/// The DaemonSet's removal mode finishes without a person: install.sh
/// `cleanup` restores the node's configuration, then keeps the binary
/// while a pod set up through ebpf-portmap still runs; the agent in
/// cleanup mode waits for it. The pod goes (its DEL through the restored
/// chain never reaches us; its namespace is deleted): the agent removes its
/// mappings, uninstalls the dataplane, and install.sh removes the binary.
/// Needs root.
#[test]
fn cleanup_finishes_once_the_last_pod_is_gone() {
    let node = Node::new();
    let pins = PinRoot::new();
    let plugins = PluginDirs::new();
    let fake = FakeNode::new();
    let upstream = bridge_conflist("epm-test", "portmap", None, node.data_dir());
    fake.write_config("10-bridge.conflist", &pretty(upstream.json()));
    let entry = json!({
        "pinRoot": pins.path(),
        "cgroupPath": cgroup_for_pin_root(pins.path()),
        "logFile": node.data_dir().join(PLUGIN_LOG),
    })
    .to_string();
    fake.run(Shell::Busybox, "install", &[("EPM_PLUGIN_CONF", &entry)])
        .ok();
    let list = Conflist::from_json(fake.read_json("10-bridge.conflist")).expect("a conflist");
    let mut dirs = vec![fake.path(BIN_DIR)];
    dirs.extend(plugins.paths());
    let runner = CniRunner::new(dirs, &node.ns);
    let world = World {
        node,
        pins,
        plugins,
        runner,
        list,
    };
    let pod = world.node.add_container("pod");
    let mappings = [PortMapping::tcp(8080, 80)];
    world.add(&pod, &mappings);

    // install.sh sees the node's pin root through its own mount of the
    // node's root: here a link to the test's pin root.
    std::os::unix::fs::symlink(world.pins.path(), fake.path("pins")).expect("link the pin root");
    let agent = Agent::start_with_conf(
        &world,
        &fake.config("10-bridge.conflist"),
        &[
            "--action",
            "cleanup",
            "--gc-interval",
            "1",
            "--gone-grace",
            "1",
        ],
    );
    let log = fake.path("cleanup.log");
    let log_file = fs::File::create(&log).expect("log file");
    let child = fake
        .command(
            Shell::Busybox,
            "cleanup",
            &[("EPM_INTERVAL", "1"), ("EPM_PIN_ROOT", "/pins")],
        )
        .stdout(log_file.try_clone().expect("dup"))
        .stderr(log_file)
        .spawn()
        .expect("starting cleanup");
    let mut cleanup = Watch { child, log };
    cleanup.wait_for(
        Shell::Busybox,
        "kept while the dataplane is still pinned",
        || fake.read_json("10-bridge.conflist")["plugins"][1]["type"] == "portmap",
    );
    // The agent's cleanup rounds while the pod runs: everything of it stays.
    let started = Instant::now();
    while !agent
        .log_text()
        .contains("cleanup: waiting for 1 container(s)")
    {
        assert!(
            started.elapsed() < BOUND,
            "the agent does not say what it waits for:\n{}",
            agent.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Another round of both at least.
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        fake.plugin().exists(),
        "the binary goes only after the dataplane"
    );
    assert!(
        world.mapping_count() > 0,
        "the running pod keeps its mapping\n{}",
        agent.log_text()
    );

    // The pod goes: DEL through the restored chain (upstream portmap knows
    // nothing of it), then its namespace.
    world
        .runner
        .del(&upstream, &pod.with_port_mappings(&mappings))
        .unwrap_or_else(|e| panic!("DEL through the restored chain: {e}"));
    drop(pod);
    let started = Instant::now();
    while !cleanup.log_text().contains("uninstalled; idle") || fake.plugin().exists() {
        assert!(
            started.elapsed() < BOUND,
            "cleanup did not finish within {BOUND:?} of the pod's end:\n{}\n{}",
            cleanup.log_text(),
            agent.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let agent_log = agent.log_text();
    assert!(
        agent_log.contains("mapping(s) of container pod")
            && agent_log.contains("uninstalled the dataplane"),
        "the agent removed the pod's mapping and the dataplane:\n{agent_log}"
    );
    assert!(
        !world.pins.path().join("v1").exists(),
        "nothing is pinned any more:\n{agent_log}"
    );
    assert_eq!(
        fs::read_to_string(fake.config("10-bridge.conflist")).expect("read"),
        pretty(upstream.json()),
        "the node's configuration is as before the install"
    );
}

// ---- the manifest, the Dockerfile and the script agree ---------------------

#[test]
fn manifest_dockerfile_and_script_agree() {
    let documents = manifest();
    let kinds: Vec<&str> = documents
        .iter()
        .map(|d| d["kind"].as_str().expect("kind"))
        .collect();
    assert_eq!(kinds, ["ServiceAccount", "DaemonSet"]);
    for document in &documents {
        assert_eq!(document["metadata"]["namespace"], "kube-system");
    }
    let daemonset = &documents[1];
    let pod = at(daemonset, "/spec/template/spec");
    assert_eq!(pod["serviceAccountName"], documents[0]["metadata"]["name"]);
    assert_eq!(
        pod["hostNetwork"], true,
        "the pod must not need the pod network"
    );
    assert_eq!(pod["priorityClassName"], "system-node-critical");
    assert!(
        pod["tolerations"]
            .as_array()
            .is_some_and(|t| t.contains(&json!({"operator": "Exists"}))),
        "every taint tolerated"
    );
    assert_eq!(at(daemonset, "/spec/updateStrategy/type"), "RollingUpdate");
    let selector = at(daemonset, "/spec/selector/matchLabels");
    assert_eq!(at(daemonset, "/spec/template/metadata/labels"), selector);

    let containers = pod["containers"].as_array().expect("containers");
    let names: Vec<&str> = containers
        .iter()
        .map(|c| c["name"].as_str().expect("name"))
        .collect();
    assert_eq!(names, ["install", "agent"]);
    let container = &containers[0];
    let env: BTreeMap<&str, &str> = container["env"]
        .as_array()
        .expect("env")
        .iter()
        .map(|e| {
            (
                e["name"].as_str().expect("name"),
                e["value"].as_str().expect("value"),
            )
        })
        .collect();

    // The image holds install.sh and the binary where the manifest and the
    // script look for them.
    let copies = dockerfile_copies();
    let destination = |source: &str| {
        copies.iter().find(|(from, _)| from == source).map_or_else(
            || panic!("the Dockerfile does not COPY {source}"),
            |(_, to)| to.clone(),
        )
    };
    let script_in_image = destination("deploy/install.sh");
    // The binary as it ships (profile `dist`), as the README says.
    let binary_source = "target/x86_64-unknown-linux-musl/dist/ebpf-portmap";
    assert_eq!(destination(binary_source), script_default("EPM_BINARY"));
    assert_eq!(container["command"], json!([script_in_image]));
    assert_eq!(
        at(container, "/readinessProbe/exec/command"),
        &json!([script_in_image, "ready"])
    );
    assert_eq!(container["args"], json!(["$(EPM_ACTION)"]));
    assert_eq!(env.get("EPM_ACTION"), Some(&"watch"));
    assert_eq!(
        env.get("EPM_PIN_ROOT").copied(),
        Some(script_default("EPM_PIN_ROOT").as_str())
    );
    let dockerignore = read(".dockerignore");
    for source in ["deploy/install.sh", binary_source] {
        assert!(
            dockerignore
                .lines()
                .any(|line| line == format!("!{source}")),
            ".dockerignore must let {source} into the build context"
        );
    }

    // Every node directory is mounted at HOST_ROOT + its path, so the
    // script's paths are the node's.
    let host_root = env.get("HOST_ROOT").expect("HOST_ROOT is set");
    let volumes: BTreeMap<&str, &str> = pod["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .map(|v| {
            (
                v["name"].as_str().expect("name"),
                at(v, "/hostPath/path").as_str().expect("hostPath"),
            )
        })
        .collect();
    let mut mounted = Vec::new();
    for mount in container["volumeMounts"].as_array().expect("mounts") {
        let host_path = volumes[mount["name"].as_str().expect("name")];
        assert_eq!(
            mount["mountPath"].as_str(),
            Some(format!("{host_root}{host_path}").as_str()),
            "{host_path} must be mounted under HOST_ROOT"
        );
        mounted.push((host_path, mount["readOnly"] == true));
    }
    for (dir, written) in [
        (script_default("CNI_BIN_DIR"), true),
        (script_default("CNI_NET_DIR"), true),
        (script_default("EPM_PIN_ROOT"), false),
    ] {
        assert!(
            mounted.iter().any(|(path, read_only)| {
                Path::new(&dir).starts_with(path) && !(written && *read_only)
            }),
            "{dir} is not mounted{}",
            if written { " writable" } else { "" }
        );
    }

    // What installs_and_uninstalls_with_no_capabilities proves enough.
    let security = &container["securityContext"];
    assert_eq!(security["capabilities"], json!({"drop": ["ALL"]}));
    assert_eq!(security["privileged"], false);
    assert_eq!(security["readOnlyRootFilesystem"], true);
    assert_eq!(security["runAsUser"], 0);
    for key in ["/resources/requests/memory", "/resources/limits/memory"] {
        at(container, key);
    }

    check_agent_container(daemonset, pod, &containers[1], container, &copies);

    // The README's steps load and use the manifest's image.
    let image = container["image"].as_str().expect("image");
    let readme = read("README.md");
    for step in [
        format!("docker build -f deploy/Dockerfile -t {image} ."),
        format!("kind load docker-image {image}"),
    ] {
        assert!(readme.contains(&step), "the README has no `{step}`");
    }
}

/// deploy/metrics-proxy-patch.yaml: the kube-rbac-proxy that Prometheus
/// scrapes forwards to where the agent listens (`listen`), on a port of
/// its own that its annotations name, and deploy/metrics-proxy.yaml binds
/// the reviews it makes to the DaemonSet's service account.
fn check_metrics_proxy(listen: &str, agent_port: u64) {
    let patch: Value = serde_yaml_ng::from_str(&read("deploy/metrics-proxy-patch.yaml"))
        .expect("the patch is YAML");
    let proxy = &at(&patch, "/spec/template/spec/containers")[0];
    let args: Vec<&str> = proxy["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("an argument"))
        .collect();
    assert!(
        args.contains(&format!("--upstream=http://{listen}/").as_str()),
        "the proxy must forward to the agent at {listen}: {args:?}"
    );
    let port = at(proxy, "/ports/0/containerPort").as_u64().expect("port");
    assert_ne!(
        port, agent_port,
        "hostNetwork: the proxy's port is the node's, beside the agent's"
    );
    assert!(
        args.contains(&format!("--secure-listen-address=$(POD_IP):{port}").as_str()),
        "the proxy must listen on its port {port}: {args:?}"
    );
    let annotations = at(&patch, "/spec/template/metadata/annotations");
    assert_eq!(annotations["prometheus.io/port"], port.to_string());
    assert_eq!(annotations["prometheus.io/scheme"], "https");
    let rbac: Vec<Value> =
        serde_yaml_ng::Deserializer::from_str(&read("deploy/metrics-proxy.yaml"))
            .map(|document| {
                <Value as serde::Deserialize>::deserialize(document).expect("a YAML document")
            })
            .collect();
    let service_account = &manifest()[0]["metadata"];
    assert!(
        rbac.iter().any(|d| d["kind"] == "ClusterRoleBinding"
            && d["subjects"][0]["name"] == service_account["name"]
            && d["subjects"][0]["namespace"] == service_account["namespace"]),
        "the proxy's reviews must be bound to the DaemonSet's service account"
    );
}

/// The agent container: its binary in the image, the named metrics port its
/// `--listen` serves, probes on it, the capabilities it needs and no more,
/// and the node's paths for pins, the lock and the cgroup root.
fn check_agent_container(
    daemonset: &Value,
    pod: &Value,
    agent: &Value,
    install: &Value,
    copies: &[(String, String)],
) {
    assert_eq!(agent["image"], install["image"], "one image for both");
    let agent_binary = "target/x86_64-unknown-linux-musl/dist/ebpf-portmap-agent";
    let in_image = copies
        .iter()
        .find(|(from, _)| from == agent_binary)
        .map_or_else(
            || panic!("the Dockerfile does not COPY {agent_binary}"),
            |(_, to)| to.clone(),
        );
    assert_eq!(agent["command"], json!([in_image]));
    assert!(
        read(".dockerignore")
            .lines()
            .any(|line| line == format!("!{agent_binary}")),
        ".dockerignore must let the agent into the build context"
    );
    let ports = agent["ports"].as_array().expect("ports");
    assert_eq!(ports.len(), 1);
    assert_eq!(ports[0]["name"], "metrics");
    let port = ports[0]["containerPort"].as_u64().expect("containerPort");
    let args: Vec<&str> = agent["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("an argument"))
        .collect();
    // The node's loopback (hostNetwork): the kubelet's probes reach it,
    // pods do not.
    let listen = format!("127.0.0.1:{port}");
    assert!(
        args.contains(&format!("--listen={listen}").as_str()),
        "--listen must serve the metrics port {port} on the loopback: {args:?}"
    );
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        assert_eq!(at(agent, &format!("/{probe}/httpGet/path")), path);
        assert_eq!(at(agent, &format!("/{probe}/httpGet/port")), "metrics");
        assert_eq!(
            at(agent, &format!("/{probe}/httpGet/host")),
            "127.0.0.1",
            "the {probe} must go where the agent listens"
        );
    }
    assert!(
        daemonset
            .pointer("/spec/template/metadata/annotations/prometheus.io~1scrape")
            .is_none(),
        "no scrape annotation for an endpoint only the node reaches"
    );
    check_metrics_proxy(&listen, port);
    let security = &agent["securityContext"];
    assert_eq!(
        security["capabilities"],
        json!({"drop": ["ALL"], "add": ["BPF", "NET_ADMIN", "PERFMON", "SYS_PTRACE"]})
    );
    // The node's PID namespace: a pod's CNI_NETNS is a path of the node's
    // mount namespace (read through /proc/1/root), and a namespace whose
    // path is gone may still be held by a node process.
    assert_eq!(
        pod["hostPID"], true,
        "the agent must see the node's processes"
    );
    let agent_env: BTreeMap<&str, &str> = agent["env"]
        .as_array()
        .expect("env")
        .iter()
        .filter_map(|e| Some((e["name"].as_str()?, e["value"].as_str()?)))
        .collect();
    let install_env: BTreeMap<&str, &str> = install["env"]
        .as_array()
        .expect("env")
        .iter()
        .filter_map(|e| Some((e["name"].as_str()?, e["value"].as_str()?)))
        .collect();
    assert_eq!(
        agent_env.get("EPM_ACTION"),
        install_env.get("EPM_ACTION"),
        "the agent and the installer run the same action (cleanup needs both)"
    );
    assert_eq!(security["privileged"], false);
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(security["readOnlyRootFilesystem"], true);
    // The node's own paths: pin paths and lock names derive from them.
    let volumes: BTreeMap<&str, &str> = pod["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .map(|v| {
            (
                v["name"].as_str().expect("name"),
                at(v, "/hostPath/path").as_str().expect("hostPath"),
            )
        })
        .collect();
    let mounts: BTreeMap<&str, (&str, bool)> = agent["volumeMounts"]
        .as_array()
        .expect("mounts")
        .iter()
        .map(|m| {
            let host = volumes[m["name"].as_str().expect("name")];
            (
                host,
                (
                    m["mountPath"].as_str().expect("path"),
                    m["readOnly"] == true,
                ),
            )
        })
        .collect();
    for (node_path, writable) in [
        (script_default("EPM_PIN_ROOT"), true),
        ("/run/ebpf-portmap".to_owned(), true),
        ("/sys/fs/cgroup".to_owned(), false),
    ] {
        let (host, (path, read_only)) = mounts
            .iter()
            .find(|(host, _)| Path::new(&node_path).starts_with(host))
            .unwrap_or_else(|| panic!("the agent does not mount {node_path}"));
        assert_eq!(path, host, "{node_path} must be at the node's path");
        assert!(!(writable && *read_only), "{node_path} must be writable");
    }
}
