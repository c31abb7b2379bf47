//! Issue #28: a node whose network namespace goes away leaves nothing
//! acting behind. Its pin root and the socket hooks it attached to its
//! cgroup are found and removed by the next plugin run of any other node on
//! the machine; until then `status` lists them; a live node is never
//! touched. Needs root.

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use portmap_tests::agent::Agent;
use portmap_tests::bpffs::{lock_file, root_record};
use portmap_tests::topology::NODE_IP4;
use portmap_tests::traffic::{echo_reply, tcp_echo_server, tcp_request};
use portmap_tests::world::{PROBE, World, fake_prev_result, sock};
use portmap_tests::{NetNs, PinRoot, PortMapping, plugin_bin};
use serde_json::{Value, json};

/// How many programs `bpftool` lists as attached to `cgroup` (itself, not
/// its parents).
fn programs_on(cgroup: &Path) -> usize {
    let out = Command::new("bpftool")
        .args(["-j", "cgroup", "show"])
        .arg(cgroup)
        .output()
        .expect("run bpftool");
    assert!(
        out.status.success(),
        "bpftool cgroup show {}: {}",
        cgroup.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    if text.trim().is_empty() {
        return 0;
    }
    serde_json::from_str::<Value>(&text)
        .expect("bpftool -j is JSON")
        .as_array()
        .map_or(0, Vec::len)
}

fn status(world: &World) -> Value {
    let out = world.operator(&["status", "--json"]);
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "status --json is not JSON ({e}): {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn stale_roots(world: &World) -> Vec<PathBuf> {
    status(world)["staleRoots"]
        .as_array()
        .expect("status lists staleRoots")
        .iter()
        .map(|root| PathBuf::from(root.as_str().expect("a path")))
        .collect()
}

/// A node that lives in a network namespace of a thread of this test: its
/// plugin ADD runs as a child of that thread (so in its namespace), and the
/// namespace goes away when the thread ends, as a deleted kind node's does.
struct VanishingNode {
    end: mpsc::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl VanishingNode {
    /// Starts the node and runs one ADD there, mapping `host_port` under
    /// `pins` with the hooks on `pins`' cgroup.
    fn start(pins: &PinRoot, container_netns: &Path, host_port: u16) -> VanishingNode {
        VanishingNode::start_under(Some(pins.path()), pins, container_netns, host_port)
    }

    /// As [`VanishingNode::start`], under `pin_root` (`None`: the default
    /// root), with the hooks on `pins`' cgroup.
    fn start_under(
        pin_root: Option<&Path>,
        pins: &PinRoot,
        container_netns: &Path,
        host_port: u16,
    ) -> VanishingNode {
        let mut config = json!({
            "cniVersion": "1.1.0",
            "name": "vanishing",
            "type": "ebpf-portmap",
            "cgroupPath": pins.cgroup().path(),
            "capabilities": {"portMappings": true},
            "runtimeConfig": {"portMappings": [
                {"hostPort": host_port, "containerPort": 80, "protocol": "tcp"}
            ]},
            "prevResult": fake_prev_result(
                container_netns,
                "eth0",
                Some(IpAddr::V4(Ipv4Addr::new(10, 251, 0, 2))),
                None,
            ),
        });
        if let Some(root) = pin_root {
            config["pinRoot"] = Value::from(root.to_string_lossy().into_owned());
        }
        let netns = container_netns.to_path_buf();
        let (added_tx, added_rx) = mpsc::channel();
        let (end, end_rx) = mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            // SAFETY: unshare takes no pointers; only this thread moves.
            assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0, "unshare");
            for args in [
                &["link", "set", "lo", "up"][..],
                &[
                    "link", "add", "uplink0", "type", "veth", "peer", "name", "uplink1",
                ],
                &["link", "set", "uplink1", "up"],
                &["addr", "add", "192.0.2.1/24", "dev", "uplink0"],
                &["link", "set", "uplink0", "up"],
            ] {
                let status = Command::new("ip").args(args).status().expect("run ip");
                assert!(status.success(), "ip {args:?}");
            }
            let mut child = Command::new(plugin_bin())
                .env("CNI_COMMAND", "ADD")
                .env("CNI_CONTAINERID", "vanishing-1")
                .env("CNI_NETNS", &netns)
                .env("CNI_IFNAME", "eth0")
                .env("CNI_PATH", "/usr/lib/cni")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn ebpf-portmap");
            child
                .stdin
                .take()
                .expect("stdin")
                .write_all(config.to_string().as_bytes())
                .expect("write the config");
            let out = child.wait_with_output().expect("wait for ebpf-portmap");
            added_tx
                .send(if out.status.success() {
                    Ok(())
                } else {
                    Err(format!(
                        "ADD on the vanishing node: {}{}",
                        String::from_utf8_lossy(&out.stdout),
                        String::from_utf8_lossy(&out.stderr)
                    ))
                })
                .expect("report the ADD");
            // Lives until told to go; then the namespace goes with it.
            let _ = end_rx.recv();
        });
        added_rx
            .recv()
            .expect("the vanishing node reports its ADD")
            .unwrap_or_else(|e| panic!("{e}"));
        VanishingNode { end, thread }
    }

    fn vanish(self) {
        let _ = self.end.send(());
        self.thread.join().expect("the vanishing node's thread");
    }
}

/// The tests of this file one at a time: any node's run removes every gone
/// node's state, so one test's run would take the other's gone node away
/// before it looks.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[test]
fn a_gone_nodes_pins_and_hooks_are_removed_by_another_nodes_next_run() {
    let _serial = one_at_a_time();
    let live = World::bridge();
    let web = live.node.add_container("stale-web");
    let _server = tcp_echo_server(&web.ns, 80, "stale-web");
    live.add(&web, &[PortMapping::tcp(8080, 80)]);
    let live_hooks = programs_on(live.pins.cgroup().path());

    let gone_pins = PinRoot::new();
    let gone_root = gone_pins.path().to_path_buf();
    let gone_cgroup = gone_pins.cgroup().path().to_path_buf();
    // Any existing namespace stands for the container: the plugin never
    // enters it.
    let container = NetNs::new("stale-ctr");
    let node = VanishingNode::start(&gone_pins, container.path(), 8080);
    assert!(
        gone_root.join("v1/links/netns_beacon").exists(),
        "the install pins its namespace beacon: {:?}",
        gone_pins.pins()
    );
    assert_eq!(
        programs_on(&gone_cgroup),
        8,
        "the vanishing node's eight socket hooks are on its cgroup"
    );
    assert!(
        root_record(&gone_root).exists(),
        "the install registers its root"
    );
    // Alive: another node's runs leave it alone.
    let second = live.node.add_container("stale-second");
    live.add(&second, &[PortMapping::tcp(8081, 80)]);
    assert!(
        gone_root.join("v1/maps/mappings").exists() && programs_on(&gone_cgroup) == 8,
        "a live node's state is never touched"
    );
    assert!(
        !stale_roots(&live).contains(&gone_root),
        "a live node is not stale"
    );

    node.vanish();
    // The kernel tears a namespace down in the background.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !stale_roots(&live).contains(&gone_root) {
        assert!(
            Instant::now() < deadline,
            "status never listed {} as stale: {:#}",
            gone_root.display(),
            status(&live)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // Until removed, the hooks are still there (status said why).
    assert_eq!(programs_on(&gone_cgroup), 8);

    // The live node's next run removes it.
    let third = live.node.add_container("stale-third");
    live.add(&third, &[PortMapping::tcp(8082, 80)]);
    assert_eq!(
        programs_on(&gone_cgroup),
        0,
        "no hook of the gone node is left on its cgroup"
    );
    assert!(
        !gone_root.join("v1").exists(),
        "the gone node's pins are removed: {:?}",
        gone_pins.pins()
    );
    assert!(
        !root_record(&gone_root).exists() && !lock_file(&gone_root).exists(),
        "the gone node's records are removed"
    );
    assert!(!stale_roots(&live).contains(&gone_root));

    // The live node is whole.
    assert_eq!(programs_on(live.pins.cgroup().path()), live_hooks);
    live.expect_answer(
        "the live node's host port",
        tcp_request(&live.node.ext, sock(NODE_IP4, 8080), "hi", PROBE),
        &echo_reply("stale-web", "hi"),
    );
    for (container, port) in [(&web, 8080), (&second, 8081), (&third, 8082)] {
        live.del(container, &[PortMapping::tcp(port, 80)]);
    }
}

/// `uninstall --stale` removes a gone node's state on request, and touches
/// nothing else.
#[test]
fn uninstall_stale_removes_a_gone_nodes_state_on_request() {
    let _serial = one_at_a_time();
    let live = World::bridge();
    let web = live.node.add_container("stale-u-web");
    live.add(&web, &[PortMapping::tcp(8080, 80)]);
    let gone_pins = PinRoot::new();
    let gone_root = gone_pins.path().to_path_buf();
    let container = NetNs::new("stale-u-ctr");
    VanishingNode::start(&gone_pins, container.path(), 9090).vanish();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !stale_roots(&live).contains(&gone_root) {
        assert!(Instant::now() < deadline, "never listed as stale");
        std::thread::sleep(Duration::from_millis(200));
    }
    let out = live.operator(&["uninstall", "--stale", "-o", "json"]);
    assert!(
        out.status.success(),
        "uninstall --stale: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    assert!(
        report["removedRoots"]
            .as_array()
            .expect("removedRoots")
            .iter()
            .any(|root| root.as_str() == gone_root.to_str()),
        "{report:#}"
    );
    assert_eq!(programs_on(gone_pins.cgroup().path()), 0);
    assert!(!gone_root.join("v1").exists());
    assert!(
        live.pins.path().join("v1/maps/mappings").exists(),
        "the live node keeps its state"
    );
    live.del(&web, &[PortMapping::tcp(8080, 80)]);
}

/// bridge + host-local + ebpf-portmap without `pinRoot` (the shared default
/// root); the hooks still go to the test's own cgroup.
fn default_root_world() -> World {
    World::with(|name, pins, data| {
        let list = portmap_tests::bridge_conflist(name, "ebpf-portmap", Some(pins), data);
        let mut json = list.json().clone();
        json["plugins"][1]
            .as_object_mut()
            .expect("the plugin's entry")
            .remove("pinRoot");
        portmap_tests::Conflist::from_json(json).expect("a well-formed conflist")
    })
}

/// Removes what a [`default_root_world`] made under the default root, also
/// when the test fails.
struct UninstallDefault<'a>(&'a World);

impl Drop for UninstallDefault<'_> {
    fn drop(&mut self) {
        let _ = self
            .0
            .node
            .ns
            .command(plugin_bin())
            .args(["uninstall", "--force"])
            .env_remove("CNI_COMMAND")
            .output();
    }
}

/// The shared default root's owner goes away while another node keeps its
/// state in `{root}/netns/{cookie}`: the owner's state is removed, and the
/// live node keeps its own directory (the root is nobody's now, but taking
/// it would leave the live node's mappings behind).
#[test]
fn a_live_node_under_the_default_root_keeps_its_state_when_the_roots_owner_goes() {
    let _serial = one_at_a_time();
    let default_root = Path::new("/sys/fs/bpf/ebpf-portmap");
    if default_root.join("v1").exists() {
        eprintln!("skipped: the default root is in use on this machine");
        return;
    }
    let gone_pins = PinRoot::new();
    let container = NetNs::new("stale-d-ctr");
    let node = VanishingNode::start_under(None, &gone_pins, container.path(), 8080);
    assert!(
        default_root.join("v1/links/netns_beacon").exists(),
        "the vanishing node owns the default root"
    );
    let live = default_root_world();
    let _uninstall = UninstallDefault(&live);
    let web = live.node.add_container("stale-d-web");
    let _server = tcp_echo_server(&web.ns, 80, "stale-d-web");
    live.add(&web, &[PortMapping::tcp(8080, 80)]);
    let before = live
        .node
        .ns
        .command(plugin_bin())
        .args(["list", "--json"])
        .output();
    let listed = |out: std::io::Result<std::process::Output>| -> usize {
        let out = out.expect("run list");
        serde_json::from_slice::<Value>(&out.stdout)
            .expect("list JSON")
            .as_array()
            .map_or(0, Vec::len)
    };
    assert_eq!(listed(before), 2, "the live node's mapping, v4 and v6");

    node.vanish();
    let deadline = Instant::now() + Duration::from_secs(20);
    while default_root.join("v1").exists() {
        let out = live
            .node
            .ns
            .command(plugin_bin())
            .args(["uninstall", "--stale"])
            .env_remove("CNI_COMMAND")
            .output()
            .expect("run uninstall --stale");
        assert!(out.status.success(), "uninstall --stale");
        assert!(
            Instant::now() < deadline,
            "the gone owner's state under the default root was never removed"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // The live node's next ADD keeps to its own directory.
    let second = live.node.add_container("stale-d-second");
    live.add(&second, &[PortMapping::tcp(8081, 80)]);
    let after = live
        .node
        .ns
        .command(plugin_bin())
        .args(["list", "--json"])
        .output();
    assert_eq!(
        listed(after),
        4,
        "both of the live node's mappings are in its state"
    );
    assert!(
        !default_root.join("v1").exists(),
        "the live node did not take the default root over"
    );
    live.expect_answer(
        "the live node's first host port",
        tcp_request(&live.node.ext, sock(NODE_IP4, 8080), "hi", PROBE),
        &echo_reply("stale-d-web", "hi"),
    );
    live.del(&web, &[PortMapping::tcp(8080, 80)]);
    live.del(&second, &[PortMapping::tcp(8081, 80)]);
}

/// The node agent's GC pass removes a gone node's state with no CNI call:
/// a node namespace going away sends the other nodes' agents no event.
#[test]
fn the_agents_gc_pass_removes_a_gone_nodes_state() {
    let _serial = one_at_a_time();
    let live = World::bridge();
    let web = live.node.add_container("stale-a-web");
    live.add(&web, &[PortMapping::tcp(8080, 80)]);
    let agent = Agent::start_with(&live, &["--gc-interval", "1"]);
    agent.wait_ready(Duration::from_secs(20), "at start");
    let gone_pins = PinRoot::new();
    let gone_root = gone_pins.path().to_path_buf();
    let container = NetNs::new("stale-a-ctr");
    VanishingNode::start(&gone_pins, container.path(), 8080).vanish();
    // No CNI call from here on: only the agent can remove it.
    let deadline = Instant::now() + Duration::from_secs(30);
    while gone_root.join("v1").exists() || programs_on(gone_pins.cgroup().path()) > 0 {
        assert!(
            Instant::now() < deadline,
            "the agent never removed the gone node's state: {:?}",
            gone_pins.pins()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    assert!(
        live.pins.path().join("v1/maps/mappings").exists(),
        "the agent's own node keeps its state"
    );
    drop(agent);
    live.del(&web, &[PortMapping::tcp(8080, 80)]);
}

/// Every file in the run directory beside `pin_root`'s lock (`{hash}.*`).
fn records_of(pin_root: &Path) -> Vec<PathBuf> {
    let lock = lock_file(pin_root);
    let stem = lock.file_stem().expect("a lock file name").to_owned();
    let mut records: Vec<PathBuf> = std::fs::read_dir(lock.parent().expect("the run directory"))
        .expect("read the run directory")
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| path.file_stem() == Some(stem.as_os_str()))
        .collect();
    records.sort();
    records
}

/// Issue #38 item 14: the records in /run/ebpf-portmap of a pin root that
/// was removed without `uninstall` (`rm -r`) name that root, `status`
/// lists them, and another node's next run removes them all (the lock,
/// hooks, probe and agent records included); a live root's records are
/// never touched.
#[test]
fn records_of_a_pin_root_removed_by_hand_are_listed_and_removed() {
    let _serial = one_at_a_time();
    let live = World::bridge();
    let web = live.node.add_container("orphan-web");
    live.add(&web, &[PortMapping::tcp(8080, 80)]);
    let gone = World::bridge();
    let db = gone.node.add_container("orphan-db");
    gone.add(&db, &[PortMapping::tcp(8080, 80)]);
    let gone_root = gone.pins.path().to_path_buf();
    // The agent's record, as a node agent leaves it when killed.
    std::fs::write(lock_file(&gone_root).with_extension("agent"), "1\n")
        .expect("write an agent record");
    let left = records_of(&gone_root);
    let names: Vec<String> = left
        .iter()
        .map(|p| {
            p.extension()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    for kind in ["root", "lock", "writers", "agent"] {
        assert!(
            names.iter().any(|n| n == kind),
            "a .{kind} record: {left:?}"
        );
    }
    assert_eq!(
        std::fs::read_to_string(root_record(&gone_root)).expect("the root record"),
        format!("{}\n", gone_root.display()),
        "the records name their pin root"
    );
    assert_eq!(
        std::fs::read_to_string(lock_file(&gone_root)).expect("the lock file"),
        format!("{}\n", gone_root.display()),
        "its lock file names it too (which outlives the .root record)"
    );
    let live_records = records_of(live.pins.path());

    // Removed by hand, as an operator does when a node is torn down.
    let rm = Command::new("rm")
        .arg("-r")
        .arg(&gone_root)
        .status()
        .expect("run rm");
    assert!(rm.success(), "rm -r {}", gone_root.display());

    let listed = status(&live)["orphanRecords"].clone();
    let entry = listed
        .as_array()
        .expect("status lists orphanRecords")
        .iter()
        .find(|o| o["pinRoot"].as_str() == gone_root.to_str())
        .unwrap_or_else(|| panic!("status lists {}: {listed:#}", gone_root.display()))
        .clone();
    let listed_records: Vec<PathBuf> = entry["records"]
        .as_array()
        .expect("records")
        .iter()
        .map(|r| PathBuf::from(r.as_str().expect("a path")))
        .collect();
    assert_eq!(listed_records, left, "status lists every record of it");
    assert!(
        !listed
            .as_array()
            .expect("orphanRecords")
            .iter()
            .any(|o| o["pinRoot"].as_str() == live.pins.path().to_str()),
        "a live root is not listed: {listed:#}"
    );

    // Another node's next run removes them, and nothing of its own.
    let second = live.node.add_container("orphan-second");
    live.add(&second, &[PortMapping::tcp(8081, 80)]);
    let still: Vec<&PathBuf> = left.iter().filter(|p| p.exists()).collect();
    assert!(
        still.is_empty(),
        "records of the removed root left: {still:?}"
    );
    for record in &live_records {
        assert!(
            record.exists(),
            "the live root's {} is kept",
            record.display()
        );
    }
    for (container, port) in [(&web, 8080), (&second, 8081)] {
        live.del(container, &[PortMapping::tcp(port, 80)]);
    }
}
