//! Concurrency, crash safety and lifecycle: the races that break the
//! iptables plugin, as tests. Needs root; every test has its own namespaces
//! and pin root.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, UdpSocket};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use portmap_tests::cni::{CniCommand, GcAttachment};
use portmap_tests::topology::NODE_IP4;
use portmap_tests::traffic::{
    echo_reply, tcp_connect, tcp_echo_server, tcp_request, udp_echo_server,
};
use portmap_tests::world::{
    FakeContainer, GONE, PROBE, World, expect_unreachable, fake_prev_result, sock,
};
use portmap_tests::{Container, PortMapping};
use serde_json::{Value, json};

/// Programs one build pins: tc ingress and egress, eight socket hooks and
/// the namespace beacon.
const PROGRAMS_PER_BUILD: usize = 11;

/// A small deterministic PRNG (xorshift64*), seeded per test and printed,
/// so a failing interleaving can be replayed.
struct Rng(u64);

impl Rng {
    fn seeded(test: &str) -> Rng {
        let seed = std::env::var("EPM_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(1, |d| d.as_nanos() as u64)
                    | 1
            });
        println!("{test}: EPM_SEED={seed}");
        Rng(seed)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn listed_hosts(world: &World) -> BTreeSet<(String, String)> {
    world
        .list()
        .as_array()
        .expect("list is an array")
        .iter()
        .map(|e| {
            (
                e["host"].as_str().unwrap_or_default().to_owned(),
                e["containerID"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

#[test]
fn parallel_dels_of_the_same_container_never_fail() {
    let world = World::plugin_only();
    let container = FakeContainer::new(
        &world,
        "dup",
        1,
        vec![PortMapping::tcp(8080, 80), PortMapping::udp(8080, 80)],
    );
    for round in 0..10 {
        container
            .add(&world)
            .unwrap_or_else(|e| panic!("round {round}: ADD: {e}"));
        assert_eq!(
            world.mapping_count(),
            4,
            "round {round}: ADD installed both families"
        );
        let errors: Vec<String> = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..8)
                .map(|_| scope.spawn(|| container.del(&world).err()))
                .collect();
            let mut errors: Vec<String> = workers
                .into_iter()
                .filter_map(|w| w.join().expect("worker"))
                .collect();
            // Ten DELs in all, eight at once first.
            errors.extend(container.del(&world).err());
            errors.extend(container.del(&world).err());
            errors
        });
        assert!(errors.is_empty(), "round {round}: DEL failed: {errors:#?}");
        world.assert_clean(&format!("round {round}, after 10 parallel DELs"));
    }
}

#[test]
fn parallel_adds_on_a_fresh_node_all_succeed() {
    let world = World::bridge();
    assert!(
        !world.pins.path().join("v1").exists(),
        "the node starts with nothing loaded"
    );
    let containers: Vec<Container> = (0..32)
        .map(|i| world.node.add_container(&format!("par{i}")))
        .collect();
    let _servers: Vec<_> = containers
        .iter()
        .map(|c| tcp_echo_server(&c.ns, 80, &c.id))
        .collect();
    let failures: Vec<String> = std::thread::scope(|scope| {
        let workers: Vec<_> = containers
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let world = &world;
                scope.spawn(move || {
                    // Each names its pod, as containerd does: the first ADDs
                    // race to create the pod map too.
                    let mut rt = c.with_port_mappings(&[PortMapping::tcp(9000 + i as u16, 80)]);
                    rt.cni_args = vec![
                        ("IgnoreUnknown".into(), "1".into()),
                        ("K8S_POD_NAME".into(), format!("pod-{i}")),
                        ("K8S_POD_NAMESPACE".into(), "par".into()),
                    ];
                    world
                        .runner
                        .add(&world.list, &rt)
                        .err()
                        .map(|e| format!("{}: {e}", c.id))
                })
            })
            .collect();
        workers
            .into_iter()
            .filter_map(|w| w.join().expect("worker"))
            .collect()
    });
    assert!(failures.is_empty(), "parallel ADDs failed: {failures:#?}");
    for (i, c) in containers.iter().enumerate() {
        world.expect_answer(
            &format!("{} via hostPort {}", c.id, 9000 + i),
            tcp_request(
                &world.node.ext,
                sock(NODE_IP4, 9000 + i as u16),
                "hi",
                PROBE,
            ),
            &echo_reply(&c.id, "hi"),
        );
    }
    let programs = std::fs::read_dir(world.pins.path().join("v1/progs"))
        .expect("progs dir")
        .count();
    assert_eq!(
        programs, PROGRAMS_PER_BUILD,
        "exactly one set of programs was loaded"
    );
    let list = world.list();
    for (i, c) in containers.iter().enumerate() {
        let pods: BTreeSet<String> = list
            .as_array()
            .expect("list is an array")
            .iter()
            .filter(|r| r["containerID"] == c.id.as_str())
            .map(|r| {
                format!(
                    "{}/{}",
                    r["podNamespace"].as_str().unwrap_or("?"),
                    r["podName"].as_str().unwrap_or("?")
                )
            })
            .collect();
        assert_eq!(
            pods,
            BTreeSet::from([format!("par/pod-{i}")]),
            "{}: every racing ADD recorded its pod",
            c.id
        );
    }
    for (i, c) in containers.iter().enumerate() {
        world.del(c, &[PortMapping::tcp(9000 + i as u16, 80)]);
    }
    world.assert_clean("after DEL of all 32");
}

#[test]
fn a_storm_of_adds_dels_and_checks_converges_to_the_last_successful_adds() {
    let world = World::plugin_only();
    let containers: Vec<FakeContainer> = (0..300)
        .map(|i| {
            let port = 30000 + i as u16;
            FakeContainer::new(
                &world,
                &format!("storm{i}"),
                i,
                vec![PortMapping::tcp(port, 80), PortMapping::udp(port, 53)],
            )
        })
        .collect();
    // A runtime serialises the operations of one container; different
    // containers run at once. `live[i]` is whether container i's last
    // operation was a successful ADD.
    let slots: Vec<Mutex<bool>> = (0..containers.len()).map(|_| Mutex::new(false)).collect();
    let failures = Arc::new(Mutex::new(Vec::<String>::new()));
    let budget = Duration::from_secs(8);
    let started = Instant::now();
    let mut seeder = Rng::seeded("storm");
    std::thread::scope(|scope| {
        for worker in 0..32 {
            let mut rng = Rng(seeder.next() | 1);
            let (world, containers, slots, failures) = (&world, &containers, &slots, &failures);
            scope.spawn(move || {
                let mut ops = 0;
                while started.elapsed() < budget && ops < 200 {
                    ops += 1;
                    let i = rng.below(containers.len() as u64) as usize;
                    let mut live = slots[i].lock().expect("slot");
                    let container = &containers[i];
                    match rng.below(3) {
                        0 => match container.add(world) {
                            Ok(()) => *live = true,
                            Err(e) => failures
                                .lock()
                                .unwrap()
                                .push(format!("w{worker} ADD {i}: {e}")),
                        },
                        1 => match container.del(world) {
                            Ok(()) => *live = false,
                            Err(e) => failures
                                .lock()
                                .unwrap()
                                .push(format!("w{worker} DEL {i}: {e}")),
                        },
                        _ => match (container.check(world), *live) {
                            (Err(e), true) => failures
                                .lock()
                                .unwrap()
                                .push(format!("w{worker} CHECK of live {i} failed: {e}")),
                            (Ok(()), false) => failures
                                .lock()
                                .unwrap()
                                .push(format!("w{worker} CHECK of deleted {i} passed")),
                            _ => {}
                        },
                    }
                }
            });
        }
    });
    let failures = failures.lock().unwrap();
    assert!(failures.is_empty(), "storm failures: {failures:#?}");
    let mut expected = BTreeSet::new();
    let mut live_count = 0;
    for (i, slot) in slots.iter().enumerate() {
        if *slot.lock().unwrap() {
            live_count += 1;
            expected.extend(containers[i].expected_hosts());
        }
    }
    assert_eq!(
        listed_hosts(&world),
        expected,
        "after the storm the maps hold exactly the {live_count} live containers"
    );
    let owners = world.dump_map("owners").as_array().map_or(0, Vec::len);
    assert_eq!(owners, live_count, "one owner record per live container");
    for container in &containers {
        container.del(&world).expect("final DEL");
    }
    world.assert_clean("after the storm and a DEL of everyone");
}

#[test]
fn killed_adds_and_dels_are_cleaned_by_the_next_del() {
    let world = World::plugin_only();
    // A real container whose address the killed requests point at; later it
    // stands for "the container the address was given to next".
    let bridge_world = World::bridge();
    let reuser = bridge_world.node.add_container("reuser");
    let result = bridge_world.add(&reuser, &[]);
    let reused_ip: IpAddr = result["ips"][0]["address"]
        .as_str()
        .and_then(|a| a.split('/').next())
        .and_then(|a| a.parse().ok())
        .expect("the container's IPv4 address");
    let _server = tcp_echo_server(&reuser.ns, 80, "reuser");

    let mut rng = Rng::seeded("crash");
    let victims: Vec<FakeContainer> = (0..8)
        .map(|v| {
            let mappings = (0..64)
                .map(|k| PortMapping::tcp(40000 + v * 64 + k, 80))
                .collect();
            let mut c = FakeContainer::new(&world, &format!("victim{v}"), u32::from(v), mappings);
            c.prev = fake_prev_result(world.node.ns.path(), "eth0", Some(reused_ip), None);
            c
        })
        .collect();
    // The first ADD loads the programs; then time a plain one, as spawned
    // below, to spread the kills over a plugin's whole life. Timed again
    // every 100 cases: on a loaded machine one ADD can take ten times
    // another, and a stale estimate puts most kills after the plugin ended.
    victims[0].add(&world).expect("warm-up ADD");
    victims[0].del(&world).expect("warm-up DEL");
    let time_one_add = || {
        let probe = Instant::now();
        let status = victims[0]
            .spawn(&world, CniCommand::Add)
            .wait()
            .expect("timed ADD");
        assert!(status.success(), "timed ADD failed");
        let full = probe.elapsed().as_micros() as u64;
        victims[0].del(&world).expect("DEL after the timed ADD");
        full
    };
    let mut full = time_one_add();
    println!("one ADD of 64 mappings takes {full} us here");

    // At least 200 plugins killed while running (not after they finished).
    let mut killed_mid_flight = 0;
    let mut case = 0;
    while killed_mid_flight < 200 && case < 2000 {
        case += 1;
        let victim = &victims[rng.below(victims.len() as u64) as usize];
        let command = if rng.below(2) == 0 {
            CniCommand::Add
        } else {
            CniCommand::Del
        };
        let mut child = victim.spawn(&world, command);
        std::thread::sleep(Duration::from_micros(rng.below(full + 1)));
        if matches!(child.try_wait(), Ok(None)) {
            killed_mid_flight += 1;
        }
        let _ = child.kill();
        let _ = child.wait();
        if case % 100 == 0 {
            for victim in &victims {
                victim
                    .del(&world)
                    .unwrap_or_else(|e| panic!("case {case}: DEL after kills: {e}"));
            }
            world.assert_clean(&format!("case {case}: after DEL of every victim"));
            full = time_one_add();
        }
    }
    for victim in &victims {
        victim
            .del(&world)
            .unwrap_or_else(|e| panic!("final DEL after kills: {e}"));
    }
    world.assert_clean("after the last kill and a DEL of every victim");
    println!("{killed_mid_flight} of {case} plugin runs were killed while still running");
    assert!(
        killed_mid_flight >= 200,
        "the kills must land inside running plugins, only {killed_mid_flight} of {case} did"
    );
    // The victims' ports pointed at the address the real container now has:
    // after the cleanup none of them may reach it.
    for v in 0..victims.len() as u16 {
        expect_unreachable(
            "a killed request's port after cleanup",
            tcp_request(
                &world.node.ext,
                sock(NODE_IP4, 40000 + v * 64),
                "stale?",
                GONE,
            ),
        );
    }
    bridge_world.del(&reuser, &[]);
}

#[test]
fn gc_removes_exactly_the_owners_not_listed() {
    let world = World::plugin_only();
    let containers: Vec<FakeContainer> = ["keep1", "stale", "keep2"]
        .iter()
        .enumerate()
        .map(|(i, id)| {
            FakeContainer::new(
                &world,
                id,
                i as u32,
                vec![PortMapping::tcp(7000 + i as u16, 80)],
            )
        })
        .collect();
    for c in &containers {
        c.add(&world).expect("ADD");
    }
    let valid: Vec<GcAttachment> = [&containers[0], &containers[2]]
        .iter()
        .map(|c| GcAttachment::from(&c.rt))
        .collect();
    world
        .runner
        .gc(&world.list, &valid)
        .unwrap_or_else(|e| panic!("GC failed: {e}"));
    let mut expected = containers[0].expected_hosts();
    expected.extend(containers[2].expected_hosts());
    assert_eq!(
        listed_hosts(&world),
        expected,
        "GC kept the listed owners only"
    );
    // GC is safe at any time: again, and with an empty list.
    world.runner.gc(&world.list, &valid).expect("second GC");
    assert_eq!(listed_hosts(&world), expected);
    world.runner.gc(&world.list, &[]).expect("GC of everything");
    world.assert_clean("after GC with no valid attachments");
}

#[test]
fn status_reports_whether_the_dataplane_can_serve() {
    let world = World::plugin_only();
    world
        .runner
        .status(&world.list)
        .unwrap_or_else(|e| panic!("STATUS on a healthy node: {e}"));

    let not_bpffs = std::env::temp_dir().join(format!("epm-not-bpffs-{}", std::process::id()));
    std::fs::create_dir_all(&not_bpffs).expect("temp dir");
    let broken = World::with(|name, _, data| {
        portmap_tests::Conflist::from_json(json!({
            "cniVersion": "1.1.0",
            "name": name,
            "plugins": [{
                "type": "ebpf-portmap",
                "pinRoot": not_bpffs,
                "logFile": data.join(portmap_tests::topology::PLUGIN_LOG),
            }]
        }))
        .expect("conflist")
    });
    let error = broken
        .runner
        .status(&broken.list)
        .expect_err("STATUS without bpffs must fail");
    assert_eq!(error.error_code(), Some(50), "not available: {error}");
    assert!(
        error.error_msg().unwrap_or_default().contains("bpffs"),
        "the message names what is missing: {error}"
    );
    let _ = std::fs::remove_dir_all(&not_bpffs);
}

#[test]
fn a_replaced_udp_backend_gets_the_next_datagram() {
    let world = World::bridge();
    let first = world.node.add_container("udp-a");
    let second = world.node.add_container("udp-b");
    let _a = udp_echo_server(&first.ns, 53, "a");
    let _b = udp_echo_server(&second.ns, 53, "b");
    let mappings = [PortMapping::udp(5353, 53)];
    // One client socket, one source port, for the whole test: the flow a
    // stale translation would keep pointing at the old container.
    let client: UdpSocket = world
        .node
        .ext
        .run(|| UdpSocket::bind("0.0.0.0:0"))
        .expect("client socket");
    client.set_read_timeout(Some(PROBE)).expect("timeout");
    client.connect(sock(NODE_IP4, 5353)).expect("connect");
    let ask = |payload: &str| -> String {
        client.send(payload.as_bytes()).expect("send");
        let mut buf = [0u8; 512];
        let n = client
            .recv(&mut buf)
            .unwrap_or_else(|e| panic!("no answer to {payload}: {e}"));
        String::from_utf8_lossy(&buf[..n]).into_owned()
    };

    world.add(&first, &mappings);
    assert_eq!(ask("one"), echo_reply("a", "one"));
    world.del(&first, &mappings);
    world.add(&second, &mappings);
    assert_eq!(
        ask("two"),
        echo_reply("b", "two"),
        "the next datagram reaches the replacement"
    );
    world.del(&second, &mappings);
    world.add(&first, &mappings);
    assert_eq!(ask("three"), echo_reply("a", "three"), "and back again");
    world.del(&first, &mappings);
}

#[test]
fn an_upgrade_replaces_the_programs_without_dropping_connections() {
    let world = World::bridge();
    let web = world.node.add_container("upgrade");
    let _server = tcp_echo_server(&web.ns, 80, "upgrade");
    world.add(&web, &[PortMapping::tcp(8080, 80)]);
    let mut session = tcp_connect(&world.node.ext, sock(NODE_IP4, 8080), PROBE).expect("connect");
    assert_eq!(
        session.request("before", PROBE).expect("request"),
        echo_reply("upgrade", "before")
    );

    // Make the running programs look like an older build's: the next ADD
    // then loads "its" programs and swaps them into the existing links.
    let progs = world.pins.path().join("v1/progs");
    for entry in std::fs::read_dir(&progs).expect("progs") {
        let entry = entry.expect("entry");
        let name = entry.file_name().to_string_lossy().into_owned();
        let (_, program) = name.split_once('_').expect("build_program");
        std::fs::rename(
            entry.path(),
            progs.join(format!("00000000000000aa_{program}")),
        )
        .expect("rename pin");
    }
    let link = world.pins.path().join("v1/links");
    let link_program = |name: &str| -> u64 {
        let out = Command::new("bpftool")
            .args(["--json", "link", "show", "pinned"])
            .arg(link.join(name))
            .output()
            .expect("bpftool link show");
        let info: Value = serde_json::from_slice(&out.stdout).expect("link JSON");
        info["prog_id"].as_u64().expect("prog_id")
    };
    let links: Vec<String> = std::fs::read_dir(&link)
        .expect("links")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert!(!links.is_empty(), "tcx links are pinned");
    let before: BTreeMap<String, u64> =
        links.iter().map(|l| (l.clone(), link_program(l))).collect();

    let other = world.node.add_container("after-upgrade");
    let _other_server = tcp_echo_server(&other.ns, 80, "after-upgrade");
    world.add(&other, &[PortMapping::tcp(8081, 80)]);

    let after: BTreeMap<String, u64> = links.iter().map(|l| (l.clone(), link_program(l))).collect();
    for (name, old) in &before {
        assert_ne!(after[name], *old, "link {name} still runs the old program");
    }
    let remaining: Vec<String> = std::fs::read_dir(&progs)
        .expect("progs")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        remaining
            .iter()
            .all(|n| !n.starts_with("00000000000000aa_")),
        "the old build's pins are gone: {remaining:?}"
    );
    assert_eq!(
        session
            .request("after", PROBE)
            .expect("the established connection survives"),
        echo_reply("upgrade", "after")
    );
    world.expect_answer(
        "a new connection after the upgrade",
        tcp_request(&world.node.ext, sock(NODE_IP4, 8081), "new", PROBE),
        &echo_reply("after-upgrade", "new"),
    );
    drop(session);
    world.del(&other, &[PortMapping::tcp(8081, 80)]);
    world.del(&web, &[PortMapping::tcp(8080, 80)]);
}

#[test]
fn a_pinned_map_of_another_layout_is_refused_not_misread() {
    let world = World::plugin_only();
    let maps = world.pins.path().join("v1/maps");
    std::fs::create_dir_all(&maps).expect("maps dir");
    let status = Command::new("bpftool")
        .args(["map", "create"])
        .arg(maps.join("mappings"))
        .args([
            "type", "hash", "key", "8", "value", "8", "entries", "16", "name", "mappings",
        ])
        .status()
        .expect("bpftool map create");
    assert!(status.success(), "bpftool map create");
    let container = FakeContainer::new(&world, "layout", 1, vec![PortMapping::tcp(8080, 80)]);
    let error = world
        .exec_ours(CniCommand::Add, &container.rt, Some(&container.prev))
        .expect_err("ADD over an incompatible map must fail");
    let text = error.to_string();
    assert!(
        text.contains("incompatible") && text.contains("mappings"),
        "the error says which map is incompatible: {text}"
    );
    let status = world
        .runner
        .status(&world.list)
        .expect_err("STATUS must fail too");
    assert!(status.to_string().contains("incompatible"), "{status}");
}

#[test]
fn a_bootstrap_killed_midway_is_finished_by_the_next_add() {
    let world = World::plugin_only();
    let container = FakeContainer::new(&world, "boot", 1, vec![PortMapping::tcp(8080, 80)]);
    let mut rng = Rng::seeded("bootstrap");
    // Time one full bootstrap (load, verify, pin, attach) on a scratch root.
    let scratch = World::plugin_only();
    let timed = FakeContainer::new(&scratch, "timed", 1, vec![PortMapping::tcp(8080, 80)]);
    let probe = Instant::now();
    assert!(
        timed
            .spawn(&scratch, CniCommand::Add)
            .wait()
            .expect("wait")
            .success()
    );
    let full = probe.elapsed().as_micros() as u64;
    drop(scratch);

    for _ in 0..20 {
        let mut child = container.spawn(&world, CniCommand::Add);
        std::thread::sleep(Duration::from_micros(rng.below(full + 1)));
        let _ = child.kill();
        let _ = child.wait();
    }
    container
        .add(&world)
        .unwrap_or_else(|e| panic!("ADD after killed bootstraps: {e}\n{}", world.dump()));
    container.check(&world).expect("CHECK after recovery");
    world
        .runner
        .status(&world.list)
        .expect("STATUS after recovery");
    let programs = std::fs::read_dir(world.pins.path().join("v1/progs"))
        .expect("progs")
        .count();
    assert_eq!(
        programs, PROGRAMS_PER_BUILD,
        "one set of programs, whatever the kills left"
    );
    container.del(&world).expect("DEL");
    world.assert_clean("after recovery and DEL");
}

/// Zeroes, behind the plugin's back, the words of the programs' port filter
/// that hold a TCP mapping's host and container port: what a mapping
/// written by a build older than the filter looks like.
fn clear_port_filter_bits(world: &World, host_port: u16, container_port: u16) {
    use portmap_common::{PROTO_TCP, PortRole, mapped_port_bit};
    let path = world.pins.path().join("v1/maps/mapped_ports");
    for (role, port) in [
        (PortRole::Host, host_port),
        (PortRole::Container, container_port),
    ] {
        let (word, _) = mapped_port_bit(role, PROTO_TCP, port.to_be()).expect("TCP has a row");
        let out = Command::new("bpftool")
            .args(["map", "update", "pinned"])
            .arg(&path)
            .arg("key")
            .args(word.to_le_bytes().iter().map(u8::to_string))
            .arg("value")
            .args(["0"; 8])
            .output()
            .expect("run bpftool");
        assert!(
            out.status.success(),
            "bpftool map update {}: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn gc_restores_the_port_filter_bits_a_mapping_lacks() {
    let world = World::bridge();
    let web = world.node.add_container("filtered");
    let _server = tcp_echo_server(&web.ns, 80, "web");
    let mappings = [PortMapping::tcp(8086, 80)];
    world.add(&web, &mappings);
    let ask = |what: &str| tcp_request(&world.node.ext, sock(NODE_IP4, 8086), what, PROBE);
    assert_eq!(
        ask("before").expect("the mapping answers"),
        echo_reply("web", "before")
    );

    clear_port_filter_bits(&world, 8086, 80);
    expect_unreachable(
        "a mapping whose ports are not in the filter (the programs leave it alone)",
        ask("cleared"),
    );

    // GC is CNI 1.1.0 and Debian's bridge speaks 1.0.0: the GC goes to a
    // list of our plugin alone, of the same network.
    let gc_list = portmap_tests::Conflist::from_json(json!({
        "cniVersion": "1.1.0",
        "name": world.list.name(),
        "plugins": [world.our_plugin().clone()],
    }))
    .expect("conflist");
    let keep = [GcAttachment::from(&web.with_port_mappings(&mappings))];
    world
        .runner
        .gc(&gc_list, &keep)
        .unwrap_or_else(|e| panic!("GC failed: {e}\n{}", world.dump()));
    assert_eq!(
        ask("after GC")
            .unwrap_or_else(|e| panic!("GC restored the filter bits: {e}\n{}", world.dump())),
        echo_reply("web", "after GC")
    );
    world.del(&web, &mappings);
}

/// A hook's link pin that is not the one a run recorded as in place (two
/// pins swapped by hand here, so each names the other hook's link) is
/// checked again by the next ADD and put right: each pin then holds the
/// link of its own hook's program.
#[test]
fn hook_link_pins_changed_since_the_record_are_checked_again() {
    let world = World::bridge();
    let mut added = world.add_until_hooks_recorded();

    let links = world.pins.path().join("v1/links");
    let pin_of = |hook: &str| {
        std::fs::read_dir(&links)
            .expect("links/")
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().ends_with(&format!("_portmap_{hook}")))
            })
            .unwrap_or_else(|| panic!("no link pin of {hook} under {}", links.display()))
    };
    let (connect4, connect6) = (pin_of("connect4"), pin_of("connect6"));
    let parked = links.join("parked");
    for (from, to) in [
        (&connect4, &parked),
        (&connect6, &connect4),
        (&parked, &connect6),
    ] {
        std::fs::rename(from, to)
            .unwrap_or_else(|e| panic!("renaming {} to {}: {e}", from.display(), to.display()));
    }
    let (hooks, current) = world.hook_programs();
    assert_eq!(
        (hooks.get("connect4"), hooks.get("connect6")),
        (current.get("connect6"), current.get("connect4")),
        "swapped: {hooks:?}, the programs {current:?}"
    );

    let third = world.node.add_container("third");
    world.add(&third, &[PortMapping::tcp(8083, 80)]);
    world.assert_hooks_of_this_build("after the ADD that followed the swap");

    added.push((third, PortMapping::tcp(8083, 80)));
    for (container, mapping) in &added {
        world.del(container, std::slice::from_ref(mapping));
    }
    world.assert_clean("after the DELs");
}

/// The pin root's files in the run directory (`{id}.lock`, `{id}.root`,
/// ...): what /run (a tmpfs) loses at a reboot, with the pins.
fn run_dir_records(world: &World) -> Vec<std::path::PathBuf> {
    let lock = portmap_tests::bpffs::lock_file(world.pins.path());
    let stem = lock.file_stem().expect("a stem").to_owned();
    std::fs::read_dir(portmap_tests::bpffs::RUN_DIR)
        .expect("the run directory")
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| path.file_stem() == Some(&stem))
        .collect()
}

/// Nomad (1.9+) restores an allocation after a client restart with CHECK,
/// and re-creates its network when CHECK fails. So CHECK passes after a
/// restart (the same pins, a new plugin process, a new agent), and fails,
/// saying why, after a reboot (bpffs and /run are emptied: the pin root and
/// its run-directory records are gone); the DEL and ADD that follow
/// restore everything.
#[test]
fn check_passes_after_a_restart_and_fails_clearly_after_a_reboot() {
    let world = World::plugin_only();
    let container = FakeContainer::new(&world, "nomad-alloc", 1, vec![PortMapping::tcp(8090, 80)]);
    let mut agent = portmap_tests::agent::Agent::start(&world);
    container.add(&world).expect("ADD");
    container.check(&world).expect("CHECK after ADD");
    // Restart: the agent and the plugin are new processes, the pins stay.
    agent.signal(libc::SIGKILL);
    let agent = portmap_tests::agent::Agent::start(&world);
    agent.wait_ready(Duration::from_secs(30), "after its restart");
    container
        .check(&world)
        .unwrap_or_else(|e| panic!("CHECK after a restart: {e}\n{}", world.dump()));
    drop(agent);
    container
        .check(&world)
        .unwrap_or_else(|e| panic!("CHECK with the agent stopped: {e}\n{}", world.dump()));

    // Reboot: every pin under the root and every record in /run are gone.
    let records = run_dir_records(&world);
    assert!(
        !records.is_empty(),
        "the ADD left no record in the run directory"
    );
    portmap_tests::bpffs::remove_tree(world.pins.path()).expect("remove the pin root");
    for record in records {
        // Another test's run may sweep them first: the root is gone.
        match std::fs::remove_file(&record) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                panic!("removing {}: {e}", record.display())
            }
            _ => {}
        }
    }
    let expect_not_added = |when: &str, cause: &str| {
        let failure = world
            .exec_ours(CniCommand::Check, &container.rt, Some(&container.prev))
            .expect_err(&format!(
                "CHECK passed {when}, although the node rebooted and the mappings are gone"
            ));
        let msg = failure.error_msg().unwrap_or_default();
        for part in [
            container.rt.container_id.as_str(),
            &world.pins.path().display().to_string(),
            cause,
            "ADD it again",
        ] {
            assert!(
                msg.contains(part),
                "{when}: the failure names {part:?}: {failure}"
            );
        }
        assert_eq!(
            failure.error_code(),
            Some(CHECK_FAILED),
            "{when}: {failure}"
        );
    };
    expect_not_added("with the pins gone", "no ebpf-portmap dataplane is there");
    // The agent, started at boot, sets the dataplane up again, without
    // the container's mappings.
    std::fs::create_dir_all(world.pins.path()).expect("the pin root again");
    let agent = portmap_tests::agent::Agent::start(&world);
    agent.wait_ready(Duration::from_secs(30), "after the reboot");
    expect_not_added("with the agent's new dataplane", "lost with a reboot");
    drop(agent);

    // What Nomad does next: DEL, then ADD; CHECK passes again.
    container.del(&world).expect("DEL after the reboot");
    container.add(&world).expect("ADD after the reboot");
    container.check(&world).expect("CHECK after the re-ADD");
    container.del(&world).expect("DEL");
    world.assert_clean("after the last DEL");
}

/// The CNI error code of a failed CHECK.
const CHECK_FAILED: u64 = 103;
