//! What depends on the kernel: the attach mode the plugin chose by probing
//! (tcx from Linux 6.6, a clsact qdisc before), the record of that choice
//! in its pinned state, and the upgrade path of each mode. Needs root.
//!
//! `cargo xtask vm-test` runs these on Debian's 6.1 and 6.12 kernels and
//! sets `EPM_EXPECT_ATTACH_MODE` (clsact on 6.1, tcx on 6.12). Elsewhere
//! that expectation is skipped with a printed reason; everything else is
//! still checked against whichever mode the plugin chose.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;
use std::process::Command;

use portmap_tests::topology::{NODE_IP4, NODE_IP6, NODE_UPLINK};
use portmap_tests::traffic::{
    echo_reply, tcp_connect, tcp_echo_server, tcp_request, udp_echo_server, udp_request,
};
use portmap_tests::world::{GONE, PROBE, World, expect_unreachable, sock};
use portmap_tests::{NetNs, PortMapping};
use serde_json::Value;

const EXPECT_ENV: &str = "EPM_EXPECT_ATTACH_MODE";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Tcx,
    Clsact,
}

impl Mode {
    fn parse(text: &str) -> Option<Mode> {
        match text {
            "tcx" => Some(Mode::Tcx),
            "clsact" => Some(Mode::Clsact),
            _ => None,
        }
    }
}

/// The mode the VM harness says this kernel must get, if it says one.
fn expected_mode() -> Option<Mode> {
    let value = std::env::var(EXPECT_ENV).ok()?;
    Some(
        Mode::parse(value.trim())
            .unwrap_or_else(|| panic!("{EXPECT_ENV}={value:?}: expected tcx or clsact")),
    )
}

fn run_json(command: &mut Command) -> Value {
    let out = command.output().expect("run bpftool");
    assert!(
        out.status.success(),
        "{command:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{command:?}: JSON: {e}"))
}

fn ifindex(ns: &NetNs, name: &str) -> u64 {
    let links = run_json(ns.command("ip").args(["-j", "link", "show", "dev", name]));
    links[0]["ifindex"].as_u64().expect("ifindex")
}

/// The pins under `links/`: file name → mode (clsact attachments are
/// recorded as `if{N}_{dir}_clsact` program pins, tcx ones are link pins).
fn link_pins(world: &World) -> BTreeMap<String, Mode> {
    let dir = world.pins.path().join("v1/links");
    std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|entry| {
            let name = entry
                .expect("entry")
                .file_name()
                .to_string_lossy()
                .into_owned();
            let mode = if name.ends_with("_clsact") {
                Mode::Clsact
            } else {
                Mode::Tcx
            };
            (name, mode)
        })
        .collect()
}

/// The program ids this build pinned, by direction (`ingress`/`egress`).
fn pinned_program_ids(pins: &Path) -> BTreeMap<String, u64> {
    let dir = pins.join("v1/progs");
    std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|entry| entry.expect("entry"))
        // The tc pair only; the socket hooks are not on interfaces.
        .filter(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            name.ends_with("_portmap_ingress") || name.ends_with("_portmap_egress")
        })
        .map(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            let info = run_json(
                Command::new("bpftool")
                    .args(["--json", "prog", "show", "pinned"])
                    .arg(entry.path()),
            );
            let direction = if name.ends_with("ingress") {
                "ingress"
            } else {
                "egress"
            };
            (direction.to_owned(), info["id"].as_u64().expect("prog id"))
        })
        .collect()
}

/// The programs really attached to the node's uplink, by direction, seen
/// the way the mode is seen: the pinned tcx link's program, or the clsact
/// filter as `bpftool net` lists it in the node's namespace.
fn attached_program_ids(world: &World, mode: Mode) -> BTreeMap<String, u64> {
    let index = ifindex(&world.node.ns, NODE_UPLINK);
    let mut ids = BTreeMap::new();
    match mode {
        Mode::Tcx => {
            for direction in ["ingress", "egress"] {
                let link = world
                    .pins
                    .path()
                    .join(format!("v1/links/if{index}_{direction}"));
                let info = run_json(
                    Command::new("bpftool")
                        .args(["--json", "link", "show", "pinned"])
                        .arg(&link),
                );
                ids.insert(
                    direction.to_owned(),
                    info["prog_id"].as_u64().expect("prog_id"),
                );
            }
        }
        Mode::Clsact => {
            let net = run_json(world.node.ns.command("bpftool").args([
                "--json",
                "net",
                "show",
                "dev",
                NODE_UPLINK,
            ]));
            for filter in net[0]["tc"].as_array().expect("tc filters") {
                let direction = match filter["kind"].as_str() {
                    Some("clsact/ingress") => "ingress",
                    Some("clsact/egress") => "egress",
                    _ => continue,
                };
                let id = filter["id"].as_u64().expect("filter prog id");
                assert!(
                    ids.insert(direction.to_owned(), id).is_none(),
                    "one filter per direction on {NODE_UPLINK}: {net:#}"
                );
            }
        }
    }
    ids
}

/// The attach mode the plugin used, checked for consistency: exactly the
/// uplink's two attachments, both of one mode, running this build's
/// programs, as the probe recorded; and, when the VM harness says which,
/// the expected mode.
fn check_attachments(world: &World) -> Mode {
    let index = ifindex(&world.node.ns, NODE_UPLINK);
    // The uplink's attachments; container-side interfaces and the cgroup
    // hooks have pins of their own there too.
    let uplink = format!("if{index}_");
    let pins: BTreeMap<String, Mode> = link_pins(world)
        .into_iter()
        .filter(|(name, _)| name.starts_with(&uplink))
        .collect();
    let mode = *pins
        .values()
        .next()
        .expect("an attachment is recorded under links/");
    let suffix = if mode == Mode::Clsact { "_clsact" } else { "" };
    let expected_names: Vec<String> = ["egress", "ingress"]
        .iter()
        .map(|d| format!("if{index}_{d}{suffix}"))
        .collect();
    assert_eq!(
        pins.keys().cloned().collect::<Vec<_>>(),
        expected_names,
        "both directions of {NODE_UPLINK}, one mode: {pins:?}"
    );
    assert_eq!(
        recorded_mode(world),
        mode,
        "the probe's recorded verdict is the mode in use"
    );
    match expected_mode() {
        Some(expected) => assert_eq!(
            mode,
            expected,
            "attach mode on kernel {}: links/ holds {pins:?}",
            kernel_release()
        ),
        None => println!(
            "{EXPECT_ENV} is not set (only `cargo xtask vm-test` sets it): not asserting which mode kernel {} must get; it got {mode:?}",
            kernel_release()
        ),
    }
    assert_eq!(
        attached_program_ids(world, mode),
        pinned_program_ids(world.pins.path()),
        "the attached programs are this build's ({mode:?})\n{}",
        world.dump()
    );
    mode
}

/// The verdict the plugin recorded when it probed the kernel:
/// `{pinRoot}/v1/maps/features`, a `u32` array whose entry 0 is the attach
/// mode (1 tcx, 2 clsact).
fn recorded_mode(world: &World) -> Mode {
    let path = world.pins.path().join("v1/maps/features");
    let dump = run_json(
        Command::new("bpftool")
            .args(["--json", "map", "dump", "pinned"])
            .arg(&path),
    );
    let bytes = |field: &Value| -> Vec<u8> {
        field
            .as_array()
            .expect("hex bytes")
            .iter()
            .map(|b| {
                let text = b.as_str().expect("hex byte");
                u8::from_str_radix(text.trim_start_matches("0x"), 16).expect("hex byte")
            })
            .collect()
    };
    let entry = dump
        .as_array()
        .expect("entries")
        .iter()
        .find(|e| bytes(&e["key"]) == [0, 0, 0, 0])
        .unwrap_or_else(|| panic!("no attach-mode entry in {}: {dump:#}", path.display()));
    let value = bytes(&entry["value"]);
    match u32::from_le_bytes(value[..4].try_into().expect("u32")) {
        1 => Mode::Tcx,
        2 => Mode::Clsact,
        other => panic!("recorded attach mode {other} in {}", path.display()),
    }
}

fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map_or_else(|_| "?".to_owned(), |s| s.trim().to_owned())
}

#[test]
fn the_attach_mode_fits_the_kernel_and_carries_traffic() {
    let world = World::bridge();
    let web = world.node.add_container("mode");
    let _tcp = tcp_echo_server(&web.ns, 80, "mode");
    let _udp = udp_echo_server(&web.ns, 53, "mode");
    let mappings = [PortMapping::tcp(8080, 80), PortMapping::udp(5353, 53)];
    world.add(&web, &mappings);
    let mode = check_attachments(&world);
    println!("kernel {}: attach mode {mode:?}", kernel_release());
    for ip in [IpAddr::V4(NODE_IP4), IpAddr::V6(NODE_IP6)] {
        world.expect_answer(
            &format!("TCP via {ip}:8080 ({mode:?})"),
            tcp_request(&world.node.ext, sock(ip, 8080), "hello", PROBE),
            &echo_reply("mode", "hello"),
        );
        world.expect_answer(
            &format!("UDP via {ip}:5353 ({mode:?})"),
            udp_request(&world.node.ext, sock(ip, 5353), "query", PROBE),
            &echo_reply("mode", "query"),
        );
    }
    world.del(&web, &mappings);
    expect_unreachable(
        "TCP after DEL",
        tcp_request(&world.node.ext, sock(NODE_IP4, 8080), "late", GONE),
    );
    // The attachments stay for the next ADD; the mode does not change.
    assert_eq!(check_attachments(&world), mode);
}

#[test]
fn an_upgrade_swaps_the_programs_in_place_in_either_mode() {
    let world = World::bridge();
    let web = world.node.add_container("upgrade");
    let _server = tcp_echo_server(&web.ns, 80, "upgrade");
    world.add(&web, &[PortMapping::tcp(8080, 80)]);
    let mode = check_attachments(&world);
    let mut session = tcp_connect(&world.node.ext, sock(NODE_IP4, 8080), PROBE).expect("connect");
    assert_eq!(
        session.request("before", PROBE).expect("request"),
        echo_reply("upgrade", "before")
    );
    let before = attached_program_ids(&world, mode);

    // Make the running programs look like an older build's: the next ADD
    // loads "its" programs and swaps them in (tcx: BPF_LINK_UPDATE inside
    // the pinned links; clsact: replacing our filter by priority/handle).
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
    let other = world.node.add_container("after-upgrade");
    let _other_server = tcp_echo_server(&other.ns, 80, "after-upgrade");
    world.add(&other, &[PortMapping::tcp(8081, 80)]);

    assert_eq!(
        check_attachments(&world),
        mode,
        "the mode survives an upgrade"
    );
    let after = attached_program_ids(&world, mode);
    for (direction, old) in &before {
        assert_ne!(
            after[direction], *old,
            "{direction} still runs the old program ({mode:?})"
        );
    }
    let leftovers: Vec<String> = std::fs::read_dir(&progs)
        .expect("progs")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("00000000000000aa_"))
        .collect();
    assert!(
        leftovers.is_empty(),
        "the old build's pins are gone: {leftovers:?}"
    );
    assert_eq!(
        session
            .request("after", PROBE)
            .expect("the established connection survives the upgrade"),
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
fn status_finds_nothing_missing_on_this_kernel() {
    let world = World::plugin_only();
    world
        .runner
        .status(&world.list)
        .unwrap_or_else(|e| panic!("STATUS on kernel {}: {e}", kernel_release()));
}
