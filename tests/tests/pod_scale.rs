//! Issue #36: what one ADD, one DEL and one STATUS cost does not grow with
//! the pods on the node. A node with 3 real pods (bridge + host-local + ebpf-portmap)
//! and the same node with about 300 (each a network namespace with its veth
//! on the bridge, as the bridge plugin leaves it, made with `ip -batch` to
//! keep the test short, and two host ports claimed by a plugin ADD) must
//! see the same number of `bpf()` calls and of netlink link and address
//! records per ADD, per DEL and per STATUS, within a small constant.
//!
//! A second node, on a routed network (ptp: every pod's host end of its
//! veth carries the programs and has an address of the node), must see
//! the same number of `bpf()` calls per ADD and per DEL with 3 and 60 pods.
//!
//! Counts, not times: the plugin writes its own account of netlink reads
//! and records at the end of each run into its log (`EPM_LOG_LEVEL=debug`),
//! and `strace -c` counts its `bpf()` calls (the plugin cannot count the
//! calls aya makes for it). Needs root, strace, and a kernel that filters
//! link dumps by "no controller" (the 6.18 this suite runs on; an older
//! one gets the full dump, whose link records grow with the pods).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use portmap_tests::tmp::TempDir;
use portmap_tests::topology::{BRIDGE_NAME, PLUGIN_LOG};
use portmap_tests::world::{FakeContainer, World};
use portmap_tests::{
    CniRunner, Conflist, Container, PinRoot, PluginDirs, PortMapping, bridge_conflist, ptp_conflist,
};

/// Pods on the small node, and on the large one.
const FEW: usize = 3;
const MANY: usize = 300;
/// Pods on the large routed node (each a real ADD through ptp).
const ROUTED_MANY: usize = 60;
/// How far the counts of the two nodes may differ.
const SLACK: u64 = 6;

/// A world whose `ebpf-portmap` is a wrapper that, while `measure` exists
/// in `dir`, runs the plugin under `strace -c` with its debug log on; its
/// pods on the bridge.
fn counted_world(dir: &TempDir) -> World {
    counted_world_of(dir, bridge_conflist)
}

/// [`counted_world`] with the network `conflist` makes.
fn counted_world_of(
    dir: &TempDir,
    conflist: fn(&str, &str, Option<&Path>, &Path) -> Conflist,
) -> World {
    let wrapper = dir.path().join("ebpf-portmap-counted");
    let script = format!(
        "#!/bin/sh\n\
         if [ -e '{dir}/measure' ]; then\n\
         EPM_LOG_LEVEL=debug exec strace -f -qq -c -o '{dir}/strace.out' -- '{bin}' \"$@\"\n\
         fi\n\
         exec '{bin}' \"$@\"\n",
        dir = dir.path().display(),
        bin = portmap_tests::plugin_bin().display(),
    );
    std::fs::write(&wrapper, script).expect("write the wrapper");
    let status = Command::new("chmod").arg("+x").arg(&wrapper).status();
    assert!(status.is_ok_and(|s| s.success()), "chmod the wrapper");
    let node = portmap_tests::Node::new();
    let pins = PinRoot::new();
    let plugins = PluginDirs::with_plugin_bin(&wrapper);
    let runner = CniRunner::new(plugins.paths(), &node.ns);
    let list = conflist(
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

/// What one plugin run cost.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Cost {
    /// `strace -c`'s calls by syscall name.
    syscalls: BTreeMap<String, u64>,
    /// The plugin's own account line (`key=value` pairs).
    account: BTreeMap<String, u64>,
}

impl Cost {
    fn bpf(&self) -> u64 {
        self.syscalls.get("bpf").copied().unwrap_or(0)
    }

    fn account(&self, key: &str) -> u64 {
        *self
            .account
            .get(key)
            .unwrap_or_else(|| panic!("the plugin's account has no {key}: {:?}", self.account))
    }
}

/// `strace -c`'s table: calls by syscall.
fn strace_calls(path: &Path) -> BTreeMap<String, u64> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("strace wrote no summary at {}: {e}", path.display()));
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // % time, seconds, usecs/call, calls, [errors,] syscall
            if fields.len() < 5 || fields[0].starts_with('%') || fields[0].starts_with('-') {
                return None;
            }
            let calls = fields[3].parse().ok()?;
            Some((fields.last()?.to_string(), calls))
        })
        .filter(|(name, _)| name != "total")
        .collect()
}

/// The last `{verb} account:` line of the plugin's log.
fn account(log: &Path, verb: &str) -> BTreeMap<String, u64> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let marker = format!("{verb} account:");
    let Some(line) = text.lines().rev().find(|l| l.contains(&marker)) else {
        return BTreeMap::new();
    };
    line.split_once(&marker)
        .map(|(_, rest)| rest)
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|pair| {
            let (key, value) = pair.split_once('=')?;
            Some((key.to_owned(), value.parse().ok()?))
        })
        .collect()
}

/// Runs `run` (one plugin call) under the counting wrapper.
fn measured(world: &World, dir: &TempDir, verb: &str, run: impl FnOnce()) -> Cost {
    let marker = dir.path().join("measure");
    let out: PathBuf = dir.path().join("strace.out");
    let _ = std::fs::remove_file(&out);
    std::fs::write(&marker, b"").expect("write the marker");
    run();
    std::fs::remove_file(&marker).expect("remove the marker");
    Cost {
        syscalls: strace_calls(&out),
        account: account(&world.node.data_dir().join(PLUGIN_LOG), verb),
    }
}

/// One STATUS of our plugin, as libcni sends it (cniVersion 1.1.0, the
/// first with STATUS), run through the counting wrapper in the node
/// namespace; panics unless it succeeds. Returns its CPU time (user +
/// system, from `wait4`), for the log only: the test asserts counts.
#[allow(
    clippy::zombie_processes,
    reason = "reaped by wait4, which std does not offer, for its CPU time"
)]
fn status(world: &World, dir: &TempDir) -> std::time::Duration {
    let mut config = portmap_tests::cni::inject_identity(&world.list, world.our_plugin());
    config["cniVersion"] = "1.1.0".into();
    let mut child = world
        .node
        .ns
        .command(dir.path().join("ebpf-portmap-counted"))
        .env("CNI_COMMAND", "STATUS")
        .env("CNI_PATH", "/usr/lib/cni")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn STATUS");
    let mut stdin = child.stdin.take().expect("stdin");
    let _ = stdin.write_all(config.to_string().as_bytes());
    drop(stdin);
    let mut stdout = String::new();
    let _ = std::io::Read::read_to_string(&mut child.stdout.take().expect("stdout"), &mut stdout);
    let mut raw_status = 0;
    // SAFETY: an all-zero rusage is a valid value; wait4 fills it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waits for our own child, with valid out pointers; the `Child`
    // is never waited for after this (dropping it does not wait).
    let pid = unsafe { libc::wait4(child.id() as i32, &raw mut raw_status, 0, &raw mut usage) };
    assert_eq!(
        pid,
        child.id() as i32,
        "wait4: {}",
        std::io::Error::last_os_error()
    );
    assert_eq!(
        raw_status, 0,
        "STATUS failed (wait status {raw_status:#x}): {stdout}"
    );
    let time = |t: libc::timeval| {
        std::time::Duration::from_secs(t.tv_sec as u64)
            + std::time::Duration::from_micros(t.tv_usec as u64)
    };
    time(usage.ru_utime) + time(usage.ru_stime)
}

/// The median CPU time of `calls` uncounted STATUS calls (for the log).
fn status_cpu(world: &World, dir: &TempDir, calls: usize) -> std::time::Duration {
    let mut times: Vec<_> = (0..calls).map(|_| status(world, dir)).collect();
    times.sort();
    times[calls / 2]
}

/// ADD then DEL of one more real pod, each counted.
fn add_and_del(world: &World, dir: &TempDir, id: &str) -> (Cost, Cost) {
    let pod = world.node.add_container(id);
    let mappings = [PortMapping::tcp(18080, 80), PortMapping::udp(18053, 53)];
    let add = measured(world, dir, "ADD", || {
        world.add(&pod, &mappings);
    });
    let del = measured(world, dir, "DEL", || world.del(&pod, &mappings));
    (add, del)
}

/// `count` pods as the bridge plugin leaves them, without the plugins: a
/// namespace each, its `eth0` the peer of a veth on the bridge, up.
fn bridge_pods(world: &World, count: usize) -> Vec<Container> {
    let pods: Vec<Container> = (0..count)
        .map(|i| world.node.add_container(&format!("bulk{i}")))
        .collect();
    let mut batch = String::new();
    for (i, pod) in pods.iter().enumerate() {
        batch.push_str(&format!(
            "link add pv{i} type veth peer name eth0 netns {}\n\
             link set pv{i} master {BRIDGE_NAME}\n\
             link set pv{i} up\n",
            pod.ns.name()
        ));
    }
    let mut child = world
        .node
        .ns
        .command("ip")
        .args(["-batch", "-"])
        .stdin(Stdio::piped())
        .spawn()
        .expect("spawn ip -batch");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(batch.as_bytes())
        .expect("feed ip -batch");
    let status = child.wait().expect("wait for ip -batch");
    assert!(status.success(), "ip -batch failed making {count} pods");
    // Up on both ends, as the bridge plugin leaves a pod: the node's end
    // then has its carrier and its IPv6 link-local address.
    for pod in &pods {
        pod.ns.ip(&["link", "set", "eth0", "up"]);
    }
    // Two host ports each, claimed by the plugin, as a real pod's are.
    for i in 0..count {
        let port = 30000 + 2 * u16::try_from(i).expect("a few hundred pods");
        let owner = FakeContainer::new(
            world,
            &format!("bulk{i}"),
            u32::try_from(i).expect("a few hundred pods"),
            vec![PortMapping::tcp(port, 80), PortMapping::udp(port + 1, 53)],
        );
        owner
            .add(world)
            .unwrap_or_else(|e| panic!("ADD of the ports of pod {i}: {e}"));
    }
    pods
}

/// Whether strace is missing (the test is then skipped, with a line
/// saying so). `cargo xtask setup` installs it: under CI its absence is a
/// failure, not a skip that would pass without measuring anything.
fn strace_missing() -> bool {
    if Command::new("strace").arg("-V").output().is_ok() {
        return false;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "strace is not installed: `cargo xtask setup` installs it"
    );
    eprintln!("skipped: strace is not installed (apt-get install strace)");
    true
}

fn assert_close(what: &str, few: u64, many: u64) {
    assert!(
        many <= few + SLACK && few <= many + SLACK,
        "{what}: {few} with {FEW} pods, {many} with about {MANY}: the cost grows with the pods"
    );
}

#[test]
fn add_del_and_status_cost_the_same_with_3_and_300_pods() {
    if strace_missing() {
        return;
    }
    let dir = TempDir::new("count");
    let world = counted_world(&dir);
    let mut pods = Vec::new();
    for i in 0..FEW {
        let pod = world.node.add_container(&format!("few{i}"));
        world.add(&pod, &[PortMapping::tcp(20000 + i as u16, 80)]);
        pods.push(pod);
    }
    // The first ADD of a node attaches the dataplane; measure a steady one.
    let (add_few, del_few) = add_and_del(&world, &dir, "probe-few");
    // The first STATUS of a boot probes the kernel; measure a steady one.
    status(&world, &dir);
    let status_few = measured(&world, &dir, "STATUS", || {
        status(&world, &dir);
    });
    let status_cpu_few = status_cpu(&world, &dir, 9);
    let bulk = bridge_pods(&world, MANY - FEW);
    let (add_many, del_many) = add_and_del(&world, &dir, "probe-many");
    let status_many = measured(&world, &dir, "STATUS", || {
        status(&world, &dir);
    });
    let status_cpu_many = status_cpu(&world, &dir, 9);
    eprintln!(
        "STATUS bpf {} -> {}, CPU p50 {status_cpu_few:?} -> {status_cpu_many:?}\nSTATUS {:?} -> {:?}\naccounts: STATUS {:?} -> {:?}",
        status_few.bpf(),
        status_many.bpf(),
        status_few.syscalls,
        status_many.syscalls,
        status_few.account,
        status_many.account,
    );
    eprintln!(
        "ADD bpf {} -> {}, DEL bpf {} -> {}\nADD {:?} -> {:?}\nDEL {:?} -> {:?}",
        add_few.bpf(),
        add_many.bpf(),
        del_few.bpf(),
        del_many.bpf(),
        add_few.syscalls,
        add_many.syscalls,
        del_few.syscalls,
        del_many.syscalls,
    );
    eprintln!(
        "accounts: ADD {:?} -> {:?}; DEL {:?} -> {:?}",
        add_few.account, add_many.account, del_few.account, del_many.account
    );
    assert_close("bpf() calls per ADD", add_few.bpf(), add_many.bpf());
    assert_close("bpf() calls per DEL", del_few.bpf(), del_many.bpf());
    assert_close(
        "address records per ADD",
        add_few.account("address_records"),
        add_many.account("address_records"),
    );
    assert_close(
        "address records per DEL",
        del_few.account("address_records"),
        del_many.account("address_records"),
    );
    assert_close(
        "link records per ADD",
        add_few.account("link_records"),
        add_many.account("link_records"),
    );
    assert_close(
        "link records per DEL",
        del_few.account("link_records"),
        del_many.account("link_records"),
    );
    assert_close(
        "bpf() calls per STATUS",
        status_few.bpf(),
        status_many.bpf(),
    );
    for record in ["link_records", "address_records", "netlink_reads"] {
        assert_close(
            &format!("netlink {record} per STATUS"),
            status_few.account(record),
            status_many.account(record),
        );
    }
    drop(bulk);
    drop(pods);
}

/// On a routed network (ptp) every pod's host end of its veth carries the
/// programs, and its settings are an entry of the node's interface map: an
/// ADD or DEL that walked that map (to sweep the settings of gone
/// interfaces) cost a `bpf()` call per pod. The sweep is the agent's and
/// GC's; one CNI call's `bpf()` calls stay the same with 3 and 60 pods.
#[test]
fn on_a_routed_network_add_and_del_cost_the_same_with_3_and_60_pods() {
    if strace_missing() {
        return;
    }
    let dir = TempDir::new("count-ptp");
    let world = counted_world_of(&dir, ptp_conflist);
    let mut pods = Vec::new();
    let add_pods = |from: usize, to: usize, pods: &mut Vec<Container>| {
        for i in from..to {
            let pod = world.node.add_container(&format!("ptp{i}"));
            let port = 20000 + u16::try_from(i).expect("a few pods");
            world.add(&pod, &[PortMapping::tcp(port, 80)]);
            pods.push(pod);
        }
    };
    add_pods(0, FEW, &mut pods);
    let (add_few, del_few) = add_and_del(&world, &dir, "probe-few");
    add_pods(FEW, ROUTED_MANY, &mut pods);
    let (add_many, del_many) = add_and_del(&world, &dir, "probe-many");
    eprintln!(
        "ptp: ADD bpf {} -> {}, DEL bpf {} -> {}",
        add_few.bpf(),
        add_many.bpf(),
        del_few.bpf(),
        del_many.bpf()
    );
    assert_close("bpf() calls per ADD on ptp", add_few.bpf(), add_many.bpf());
    assert_close("bpf() calls per DEL on ptp", del_few.bpf(), del_many.bpf());
    drop(pods);
}
