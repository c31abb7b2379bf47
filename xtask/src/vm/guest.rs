//! What goes into the guest: the test binaries and `ebpf-portmap` (host
//! builds, debug info stripped), the tools the harness shells out to and the
//! reference CNI plugins (Debian's, with the shared libraries `ldd` names),
//! busybox for the init script, and per kernel its modules and settings.
//!
//! The guest is the host's userland in miniature: the same glibc, so the
//! binaries the host just tested run unchanged.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use super::cpio::Tree;

/// Where the guest finds things.
pub const GUEST_TESTS_DIR: &str = "/tests";
pub const GUEST_PLUGIN_BIN: &str = "/usr/local/bin/ebpf-portmap";
pub const GUEST_CNI_DIR: &str = "/usr/lib/cni";
/// Where the `local` tests find their client (`EPM_PROBE_BIN`).
pub const GUEST_PROBE_BIN: &str = "/usr/local/bin/epm-probe";
pub const GUEST_MODULES_DIR: &str = "/lib/modules/epm";
pub const GUEST_CONFIG_DIR: &str = "/etc/epm-vm";

/// The marker the guest prints last; nothing else counts as a pass (QEMU
/// exits 0 even when the guest panics).
pub const RESULT_MARKER: &str = "EPM-VM-RESULT";
/// One line per test binary: `EPM-VM-TEST <name> PASS|FAIL <seconds>s`.
pub const TEST_MARKER: &str = "EPM-VM-TEST";
/// The guest's progress lines; `EPM-VM: running <name> <args>` starts a
/// test binary (the host times each from it).
pub const RUNNING_MARKER: &str = "EPM-VM:";

/// Tools the harness runs by name (looked up in `PATH`), as host paths.
/// Required ones must exist; optional ones only feed failure diagnostics.
const REQUIRED_TOOLS: &[&str] = &[
    "/usr/sbin/ip",
    "/usr/sbin/bpftool",
    "/usr/sbin/iptables-save",
    "/usr/sbin/ip6tables-save",
    // The fastPath test adds FORWARD rules in its node namespace.
    "/usr/sbin/iptables",
    "/usr/sbin/ip6tables",
    // kube-proxy's IPVS Services (the `local` IPVS test).
    "/usr/sbin/ipvsadm",
];
/// iptables extensions the guest's tests use, from the host's directory.
const XTABLES_DIR: &str = "/usr/lib/x86_64-linux-gnu/xtables";
const XTABLES_EXTENSIONS: &[&str] = &["libxt_standard.so", "libxt_conntrack.so"];
const OPTIONAL_TOOLS: &[&str] = &["/usr/bin/ss", "/usr/sbin/ss", "/usr/sbin/conntrack"];
/// Reference plugins the in-VM tests chain (bridge/ptp delegate to host-local).
const CNI_PLUGINS: &[&str] = &["bridge", "ptp", "host-local", "loopback", "portmap"];
const HOST_CNI_DIR: &str = "/usr/lib/cni";
const BUSYBOX: &str = "/bin/busybox";
/// Applets the init script uses, linked into /bin (the real iproute2 `ip`
/// comes first in PATH).
const BUSYBOX_APPLETS: &[&str] = &[
    "sh", "mount", "mkdir", "insmod", "cat", "echo", "uname", "poweroff", "sleep", "date", "sync",
    "ls", "dmesg", "grep", "tail", "true", "false", "env", "rm",
];

/// One test binary to run in the guest, and which of its tests the guest
/// runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestTest {
    /// The cargo test target (`plugin`, `prog_test_run`, `kernel`).
    pub name: &'static str,
    pub tests: InGuest,
}

/// Which tests of a target run in the guest. The host's `cargo test` runs
/// every test of every target; the guest runs a test only for what it asks
/// of the kernel, so a new test stays on the host until it is named here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InGuest {
    /// Every test of the target.
    All,
    /// These tests, by exact name (a unit test checks that each name is a
    /// test of the target, so a rename cannot drop it unnoticed).
    Only(&'static [&'static str]),
}

impl GuestTest {
    /// The test binary's arguments in the guest: one test at a time (under
    /// TCG the guest has the speed of a slow single core), each with its
    /// time (`--report-time`, a libtest option the guest unlocks with
    /// `RUSTC_BOOTSTRAP=1`, see `guest_env`), so the serial log says what
    /// each kept test costs.
    pub fn args(&self) -> Vec<String> {
        let mut args = vec![
            "--test-threads=1".to_owned(),
            "-Z".to_owned(),
            "unstable-options".to_owned(),
            "--report-time".to_owned(),
        ];
        if let InGuest::Only(tests) = self.tests {
            args.push("--exact".to_owned());
            args.extend(tests.iter().map(|test| (*test).to_owned()));
        }
        args
    }
}

/// The in-VM suite: what depends on the kernel, on each kernel. That is
/// the verifier's verdict on every program and map (every install loads
/// them all; `prog_test_run` runs every packet path through them), the
/// attach modes (tcx or clsact) on every kind of interface and on
/// re-created ones, the helpers the programs call (FIB lookups, redirects,
/// socket lookups, checksums, the LRU maps), the cgroup socket hooks and
/// the namespace beacon. One end-to-end test per such path is kept; the
/// rest of each target (the programs' decisions, which `prog_test_run`
/// checks on each kernel packet by packet, and our user space: claims,
/// records, configuration, clean-up bookkeeping, churn at scale) runs once,
/// in the host's `cargo test`. In the guest every install pays the
/// verifier under emulation (seconds a load: `program_cost`, which loads
/// every program and measures them, took 8 s in the 6.1 guest, quiet),
/// and each plugin run is emulated, so each test kept here is kept for a
/// reason named beside it.
pub const GUEST_TESTS: &[GuestTest] = &[
    // The attach mode the kernel gets, an upgrade swapping programs in
    // place in that mode, and the feature probes `status` reports.
    GuestTest {
        name: "kernel",
        tests: InGuest::All,
    },
    // Every packet path: the programs are verified once per table size,
    // and each test's helpers (checksums, FIB, LRU eviction) are the
    // kernel's.
    GuestTest {
        name: "prog_test_run",
        tests: InGuest::All,
    },
    GuestTest {
        name: "local",
        tests: InGuest::Only(&[
            // The socket hooks (node and localhost) and the hairpin over a
            // bridge, with and without the bridge's hairpin mode (the
            // redirect back out of the port the packet came in on).
            "bridge_node_localhost_and_hairpin_paths",
            "bridge_without_hairpin_mode_node_localhost_and_hairpin_paths",
            // The hairpin over ptp: routed, no bridge.
            "ptp_node_localhost_and_hairpin_paths",
            // The hooks' namespace check (issue 28), with SCTP, which the
            // guest kernels have and this host may not.
            "a_client_namespace_in_the_hooked_cgroup_is_served_by_the_packet_path",
            // Loopback frames from the link (issue 39): AF_PACKET and the
            // kernel's own handling of what the programs let through.
            "crafted_loopback_packets_from_the_link_never_reach_a_container",
            // kube-proxy's IPVS mode (issue 51): a dummy device, a real
            // IPVS virtual service, which this host's kernel lacks.
            "a_real_ipvs_service_is_never_a_host_ports",
        ]),
    },
    // What the socket hooks translate, counted per mapping and traced
    // (issue 38): a per-CPU hash update and a ring-buffer record from a
    // cgroup sock_addr program, which each kernel allows or refuses.
    GuestTest {
        name: "operator_sock",
        tests: InGuest::Only(&[
            "node_connections_translated_by_the_socket_hooks_are_counted_and_traced",
        ]),
    },
    // Containers translated at the socket (`containerSockets`, issue 28):
    // the hooks' lookup of a container's netns cookie in a hash map, which
    // 6.1's verifier must accept within its 512-byte stack, and both paths
    // a container takes to a host port (socket and masqueraded hairpin).
    GuestTest {
        name: "container_sockets",
        tests: InGuest::Only(&[
            "with_container_sockets_containers_are_translated_at_the_socket",
            "without_container_sockets_containers_take_the_masqueraded_packet_path",
        ]),
    },
    // The masquerade against node sockets (issue 37): the kernel's socket
    // lookups and its own port choice.
    GuestTest {
        name: "hairpin_ports",
        tests: InGuest::Only(&[
            "a_port_a_node_connection_holds_is_not_kept",
            "a_node_connection_on_an_open_hairpin_tuple_is_remapped",
        ]),
    },
    // The pods' bridge ports (issue 37): the ingress program alone on a
    // port, taken off by DEL and by a node-wide pass (6.1: a clsact filter
    // deleted by netlink), and given to a pod's port that lacks it.
    GuestTest {
        name: "bridge_ports",
        tests: InGuest::Only(&[
            "del_and_a_node_wide_pass_take_the_program_off_pods_bridge_ports",
            "a_node_wide_pass_gives_the_program_to_pods_made_before_it_was_on_their_ports",
        ]),
    },
    // Flows evicted from the kernel's LRU maps and recovered, and the
    // socket lookup that keeps the node's own flows the node's. Churn at
    // four times a table exercises the same code at length: host only.
    GuestTest {
        name: "churn",
        tests: InGuest::Only(&[
            "evicted_flows_are_recovered_and_the_nodes_own_flows_stay_the_nodes",
        ]),
    },
    // A flood of new flows against idle assured ones (issue 53): the
    // kernel's LRU eviction decides what the flood takes, and 6.1's
    // verifier must accept the tiered lookups and the moves between
    // tables. One family per mode: the other runs on the host.
    GuestTest {
        name: "flood",
        tests: InGuest::Only(&[
            "idle_flows_survive_a_flood_v4",
            "idle_flows_survive_a_flood_on_the_fast_path_v6",
        ]),
    },
    // ICMP errors about translated flows: the programs' checksum
    // helpers on ICMP and ICMPv6, which 6.1's verifier must accept, and
    // each kernel's own handling of the translated error (a refused UDP
    // socket, a lowered path MTU). One direction per family: the other
    // two run on the host.
    GuestTest {
        name: "icmp",
        tests: InGuest::Only(&[
            "a_containers_port_unreachable_refuses_the_client_v4",
            "a_path_mtu_from_beyond_the_node_reaches_the_container_v6",
            // The fast path's hand-over of a container's error (a FIB
            // lookup and a redirect of ICMP), behind kube-proxy's rule.
            "with_the_fast_path_a_containers_port_unreachable_refuses_the_client",
        ]),
    },
    // Translation by netfilter (issue 50) on the kernels nodes run: the
    // NAT kfuncs (`bpf_skb_ct_alloc`, `bpf_ct_insert_entry` in
    // nf_conntrack's module BTF, `bpf_ct_set_nat_info` in nf_nat's),
    // which 6.1's verifier must accept, and the kernel's NAT of the entry
    // they make, decided by a rule on the original destination.
    // (`conntrack -L` fails in the 6.1 guest: the other tests, which read
    // it, run on the host.)
    GuestTest {
        name: "netfilter_nat",
        tests: InGuest::Only(&["a_rule_on_the_original_destination_decides_our_flows"]),
    },
    GuestTest {
        name: "node_shapes",
        tests: InGuest::Only(&[
            // Attaching to every kind of interface the kernel has.
            "every_up_interface_carries_the_programs_but_bridge_ports",
            // A device re-created under an attachment (a tcx link or a
            // clsact filter dies with it).
            "a_recreated_uplink_is_reported_then_attached_by_any_plugin_run",
            // FIB lookups with no default route.
            "a_node_without_a_default_route_maps_host_ports",
            // Programs taken off a port (issue 36): a tcx link goes with
            // its pin, a clsact filter (6.1) is deleted by netlink.
            "a_veth_taken_for_an_uplink_before_it_joined_the_bridge_loses_the_programs",
        ]),
    },
    // The fast path's mode each kernel picks (issues 31 and 50): Debian's
    // kernels have nf_conntrack as a module, so its kfuncs are in the
    // module's BTF, which the tc programs' load passes in its fd_array:
    // the confirmed-flow mode runs there, behind kube-proxy's FORWARD rule.
    // `version` still counts what is hooked at FORWARD, which 6.12 can tell
    // (nfnetlink_hook, staged) and 6.1 cannot. Flows netfilter translates
    // (the kernel's DNAT entry, issue 50) are handed over once confirmed,
    // through 6.1's verifier too.
    GuestTest {
        name: "fast_confirmed",
        tests: InGuest::Only(&[
            "a_forward_rule_decides_new_flows_and_accepted_ones_go_fast",
            "version_counts_what_is_hooked_at_forward",
            "flows_netfilter_translates_leave_it_once_confirmed",
        ]),
    },
    // The namespace beacon: that a socket-lookup link detaches with its
    // namespace is the kernel's.
    GuestTest {
        name: "stale",
        tests: InGuest::Only(&[
            "a_gone_nodes_pins_and_hooks_are_removed_by_another_nodes_next_run",
        ]),
    },
    // A resize killed right after its last rename and midway through its
    // attach pass (issue 52): the next plugin run, and `reconcile`, must
    // move every attachment to the new programs, which each kernel does its
    // own way (6.1: clsact filters replaced by netlink; 6.12: tcx links
    // and cgroup links updated in place), and `status` must read each
    // attached program's maps (`BPF_OBJ_GET_INFO_BY_FD`) to name the split.
    GuestTest {
        name: "crash",
        tests: InGuest::Only(&[
            "a_resize_killed_after_its_last_rename_is_finished_by_the_next_plugin_run",
            "a_resize_killed_after_its_renames_is_finished_by_reconcile",
        ]),
    },
    // The tc paths over bridge and ptp, both families, and the fast path's
    // redirects (`bpf_redirect_peer`, FIB plus redirect).
    GuestTest {
        name: "plugin",
        tests: InGuest::Only(&[
            "bridge_tcp_and_udp_over_ipv4_and_ipv6",
            "ptp_tcp_and_udp_over_ipv4_and_ipv6",
            "fast_path_hands_packets_over_on_a_bridge",
            "fast_path_hands_packets_over_on_ptp",
        ]),
    },
];

/// Host paths of what cargo built.
#[derive(Debug)]
pub struct Artifacts {
    pub plugin: PathBuf,
    /// The `probe` client the `local` tests run as processes of their own.
    pub probe: PathBuf,
    /// (cargo test target name, its arguments, executable), in run order
    pub tests: Vec<(&'static str, Vec<String>, PathBuf)>,
}

/// Builds the test binaries and `ebpf-portmap` (`cargo test --no-run`, which
/// reuses what `cargo test` just built) and reads their paths from cargo's
/// JSON messages.
pub fn build_artifacts(tests: &[&GuestTest]) -> Result<Artifacts> {
    // Every default member's tests, as plain `cargo test` selects them: the
    // same feature resolution, so nothing is built twice.
    let mut command = crate::cmd::cargo_workspace("test");
    command.args(["--no-run", "--message-format=json-render-diagnostics"]);
    println!("+ {}", crate::cmd::show(&command));
    let out = command
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("running cargo test --no-run")?;
    if !out.status.success() {
        bail!("cargo test --no-run failed ({})", out.status);
    }
    let artifacts = artifacts_from_messages(&String::from_utf8_lossy(&out.stdout));
    let plugin = artifacts
        .iter()
        .find(|a| a.kind == "bin" && a.name == "ebpf-portmap" && !a.test)
        .map(|a| a.executable.clone())
        .context("cargo built no ebpf-portmap binary")?;
    let probe = artifacts
        .iter()
        .find(|a| a.kind == "bin" && a.name == "probe" && !a.test)
        .map(|a| a.executable.clone())
        .context("cargo built no probe binary")?;
    let mut found = Vec::new();
    for wanted in tests {
        let executable = artifacts
            .iter()
            .find(|a| a.kind == "test" && a.name == wanted.name)
            .map(|a| a.executable.clone())
            .with_context(|| format!("cargo built no test target {}", wanted.name))?;
        found.push((wanted.name, wanted.args(), executable));
    }
    Ok(Artifacts {
        plugin,
        probe,
        tests: found,
    })
}

#[derive(Debug, PartialEq)]
struct Artifact {
    kind: String,
    name: String,
    test: bool,
    executable: PathBuf,
}

/// The fields of a `cargo --message-format=json` line that name a built
/// binary; other messages lack them and are skipped.
#[derive(Debug, serde::Deserialize)]
struct CargoMessage {
    reason: String,
    target: Option<CargoTarget>,
    profile: Option<CargoProfile>,
    executable: Option<PathBuf>,
}

#[derive(Debug, serde::Deserialize)]
struct CargoTarget {
    kind: Vec<String>,
    name: String,
}

#[derive(Debug, serde::Deserialize)]
struct CargoProfile {
    test: bool,
}

fn artifacts_from_messages(stdout: &str) -> Vec<Artifact> {
    stdout
        .lines()
        .filter_map(|line| serde_json::from_str::<CargoMessage>(line).ok())
        .filter(|m| m.reason == "compiler-artifact")
        .filter_map(|m| {
            let target = m.target?;
            Some(Artifact {
                kind: target.kind.into_iter().next()?,
                name: target.name,
                test: m.profile?.test,
                executable: m.executable?,
            })
        })
        .collect()
}

/// Shared libraries `ldd` says `binary` needs (absolute paths, loader included).
fn shared_libraries(binary: &Path) -> Result<Vec<PathBuf>> {
    let out = Command::new("ldd")
        .arg(binary)
        .output()
        .with_context(|| format!("running ldd {}", binary.display()))?;
    // Static binaries: ldd fails with "not a dynamic executable".
    if !out.status.success() {
        return Ok(Vec::new());
    }
    Ok(parse_ldd(&String::from_utf8_lossy(&out.stdout)))
}

fn parse_ldd(text: &str) -> Vec<PathBuf> {
    text.lines()
        .filter_map(|line| {
            let line = line.trim();
            let path = match line.split_once("=>") {
                Some((_, rest)) => rest.split_whitespace().next()?,
                None => line.split_whitespace().next()?,
            };
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect()
}

fn guest_path(host: &Path) -> Result<String> {
    host.to_str()
        .map(str::to_owned)
        .with_context(|| format!("{} is not UTF-8", host.display()))
}

/// Adds a host ELF at `guest` plus the libraries it needs at their host paths.
fn add_elf(tree: &mut Tree, guest: &str, host: &Path) -> Result<()> {
    tree.host_file(guest, host, 0o755)?;
    for library in shared_libraries(host)? {
        let path = guest_path(&library)?;
        // The loader and libraries are placed at the path ldd printed;
        // symlinked host paths are copied as files.
        let real = std::fs::canonicalize(&library)
            .with_context(|| format!("resolving {}", library.display()))?;
        tree.host_file(&path, &real, 0o755)?;
    }
    Ok(())
}

/// `objcopy --strip-debug` into `stage`: debug builds carry tens of MB of
/// DWARF the guest never reads (panics still name the test and message).
fn stripped(host: &Path, stage: &Path, name: &str) -> Result<PathBuf> {
    let out = stage.join(name);
    crate::cmd::run(
        Command::new("objcopy")
            .arg("--strip-debug")
            .arg(host)
            .arg(&out),
    )?;
    Ok(out)
}

/// Everything that is the same for every kernel.
pub fn common_tree(artifacts: &Artifacts, stage: &Path) -> Result<Tree> {
    std::fs::create_dir_all(stage)?;
    let mut tree = Tree::new();
    for dir in ["/proc", "/sys", "/dev", "/tmp", "/run", "/root", "/mnt"] {
        tree.dir(dir)?;
    }
    // iproute2 keeps named namespaces in /var/run/netns, the harness looks
    // in /run/netns: on Debian one is a link to the other.
    tree.symlink("/var/run", "/run")?;
    tree.char_device("/dev/console", 5, 1, 0o600)?;
    tree.char_device("/dev/null", 1, 3, 0o666)?;

    tree.host_file("/bin/busybox", Path::new(BUSYBOX), 0o755)?;
    for applet in BUSYBOX_APPLETS {
        tree.symlink(&format!("/bin/{applet}"), "busybox")?;
    }
    for tool in REQUIRED_TOOLS {
        let path = Path::new(tool);
        if !path.exists() {
            bail!("{tool} is missing on the host (install it: `cargo xtask setup`)");
        }
        add_elf(&mut tree, tool, &std::fs::canonicalize(path)?)?;
    }
    for tool in OPTIONAL_TOOLS {
        let path = Path::new(tool);
        if path.exists() {
            add_elf(&mut tree, tool, &std::fs::canonicalize(path)?)?;
        }
    }
    // iptables loads its targets (`-j DROP` is libxt_standard) at run time.
    for extension in XTABLES_EXTENSIONS {
        let path = Path::new(XTABLES_DIR).join(extension);
        if !path.exists() {
            bail!("{} is missing on the host (iptables)", path.display());
        }
        add_elf(&mut tree, &guest_path(&path)?, &path)?;
    }
    for plugin in CNI_PLUGINS {
        let host = Path::new(HOST_CNI_DIR).join(plugin);
        if !host.exists() {
            bail!(
                "{} is missing (install containernetworking-plugins: `cargo xtask setup`)",
                host.display()
            );
        }
        add_elf(&mut tree, &format!("{GUEST_CNI_DIR}/{plugin}"), &host)?;
    }
    let plugin_host =
        std::env::var_os("EPM_VM_PLUGIN_BIN").map_or(artifacts.plugin.clone(), PathBuf::from);
    let plugin = stripped(&plugin_host, stage, "ebpf-portmap")?;
    add_elf(&mut tree, GUEST_PLUGIN_BIN, &plugin)?;
    let probe = stripped(&artifacts.probe, stage, "probe")?;
    add_elf(&mut tree, GUEST_PROBE_BIN, &probe)?;
    for (name, _, executable) in &artifacts.tests {
        let binary = stripped(executable, stage, name)?;
        add_elf(&mut tree, &format!("{GUEST_TESTS_DIR}/{name}"), &binary)?;
    }
    // xtables-nft-multi reads these when present.
    for file in ["/etc/protocols", "/etc/services", "/etc/ethertypes"] {
        if Path::new(file).is_file() {
            tree.host_file(file, Path::new(file), 0o644)?;
        }
    }
    tree.bytes("/etc/passwd", "root:x:0:0:root:/root:/bin/sh\n", 0o644)?;
    tree.bytes("/etc/group", "root:x:0:\n", 0o644)?;
    tree.bytes("/init", INIT_SCRIPT, 0o755)?;
    Ok(tree)
}

/// The test binaries this VM runs, in order (every binary is in the
/// common tree; a VM that runs part of a kernel's suite lists its part).
pub fn add_tests(tree: &mut Tree, tests: &[&(&'static str, Vec<String>, PathBuf)]) -> Result<()> {
    let list: String = tests
        .iter()
        .map(|(name, args, _)| format!("{name} {}\n", args.join(" ")))
        .collect();
    tree.bytes(&format!("{GUEST_CONFIG_DIR}/tests"), list, 0o644)
}

/// The parts of a kernel's suite when it is split over `parts` VMs: test
/// binaries dealt in turn, so each part gets a share of the long ones
/// (their order in [`GUEST_TESTS`] keeps the costly ones apart).
pub fn deal<T>(tests: &[T], parts: usize) -> Vec<Vec<&T>> {
    let mut dealt: Vec<Vec<&T>> = (0..parts.max(1)).map(|_| Vec::new()).collect();
    let count = dealt.len();
    for (index, test) in tests.iter().enumerate() {
        dealt[index % count].push(test);
    }
    dealt
}

/// What differs per kernel: its modules (in load order) and its settings.
pub fn add_kernel(
    tree: &mut Tree,
    series: &str,
    release: &str,
    expected_attach_mode: &str,
    modules_stage: &Path,
    modules: &[String],
) -> Result<()> {
    for module in modules {
        tree.host_file(
            &format!("{GUEST_MODULES_DIR}/{module}"),
            &modules_stage.join(module),
            0o644,
        )?;
    }
    tree.bytes(
        &format!("{GUEST_CONFIG_DIR}/modules"),
        modules.iter().map(|m| format!("{m}\n")).collect::<String>(),
        0o644,
    )?;
    let forward_hooks = modules.iter().any(|m| m.ends_with("_nfnetlink_hook.ko"));
    tree.bytes(
        &format!("{GUEST_CONFIG_DIR}/env"),
        guest_env(series, release, expected_attach_mode, forward_hooks),
        0o644,
    )?;
    Ok(())
}

/// `forward_hooks`: nfnetlink_hook is among the staged modules.
fn guest_env(
    series: &str,
    release: &str,
    expected_attach_mode: &str,
    forward_hooks: bool,
) -> String {
    format!(
        "export EPM_KERNEL={series}\n\
         export EPM_KERNEL_RELEASE={release}\n\
         export EPM_EXPECT_ATTACH_MODE={expected_attach_mode}\n\
         export EBPF_PORTMAP_BIN={GUEST_PLUGIN_BIN}\n\
         export EPM_PROBE_BIN={GUEST_PROBE_BIN}\n\
         export EPM_EXPECT_SCTP=1\n\
         export EPM_EXPECT_KFUNCS=1\n\
         export EPM_EXPECT_IPVS=1\n\
         export EPM_EXPECT_FORWARD_HOOKS={}\n\
         export EPM_PLUGIN_TIMEOUT_SECS=300\n\
         export RUST_BACKTRACE=1\n\
         export RUSTC_BOOTSTRAP=1\n",
        u8::from(forward_hooks)
    )
}

/// The guest's PID 1 (busybox sh). Mounts what the tests need, loads the
/// modules, runs each test binary, prints one marker line per binary and
/// the result marker, then powers off (QEMU runs with -no-reboot, so a
/// panic's reboot ends it too).
const INIT_SCRIPT: &str = r#"#!/bin/sh
# PID 1 of the ebpf-portmap VM tests (written by `cargo xtask vm-test`).
export PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run
mount -t bpf bpf /sys/fs/bpf
# cgroup2 where nodes have it (systemd's unified hierarchy).
mount -t cgroup2 cgroup2 /sys/fs/cgroup
. /etc/epm-vm/env
echo "EPM-VM: kernel $(uname -r), expecting attach mode $EPM_EXPECT_ATTACH_MODE"
result=PASS
for module in $(cat /etc/epm-vm/modules); do
    if ! insmod "/lib/modules/epm/$module"; then
        echo "EPM-VM: insmod $module failed"
        result=FAIL
    fi
done
ip link set lo up
while read -r name args; do
    echo "EPM-VM: running $name $args"
    start=$(date +%s)
    if "/tests/$name" $args </dev/null; then status=PASS; else status=FAIL; result=FAIL; fi
    echo "EPM-VM-TEST $name $status $(( $(date +%s) - start ))s"
done < /etc/epm-vm/tests
echo "EPM-VM-RESULT $EPM_KERNEL $result"
sync
poweroff -f
echo o > /proc/sysrq-trigger
sleep 30
"#;

#[cfg(test)]
mod tests {
    use super::*;

    /// A renamed test would silently leave the guest (or a typo run
    /// nothing): each name must be a test of its target.
    #[test]
    fn every_guest_test_exists_in_its_target() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        for guest in GUEST_TESTS {
            let source = ["tests/tests", "portmap-user/tests"]
                .iter()
                .map(|dir| root.join(dir).join(format!("{}.rs", guest.name)))
                .find(|path| path.exists())
                .unwrap_or_else(|| panic!("no source file for test target {}", guest.name));
            let text = std::fs::read_to_string(&source).expect("read the test source");
            if let InGuest::Only(tests) = guest.tests {
                assert!(
                    !tests.is_empty(),
                    "{}: name a test or drop the target",
                    guest.name
                );
                for test in tests {
                    assert!(
                        text.contains(&format!("#[test]\nfn {test}(")),
                        "{} has no test {test}",
                        source.display()
                    );
                }
            }
        }
    }

    #[test]
    fn guest_tests_are_matched_exactly_and_timed() {
        let plugin = GUEST_TESTS.iter().find(|t| t.name == "plugin").unwrap();
        let args = plugin.args();
        assert_eq!(
            args[..5],
            [
                "--test-threads=1",
                "-Z",
                "unstable-options",
                "--report-time",
                "--exact"
            ]
        );
        assert!(args.contains(&"bridge_tcp_and_udp_over_ipv4_and_ipv6".to_owned()));
        let kernel = GUEST_TESTS.iter().find(|t| t.name == "kernel").unwrap();
        assert!(!kernel.args().contains(&"--exact".to_owned()));
        assert!(guest_env("6.1", "6.1.0", "clsact", false).contains("RUSTC_BOOTSTRAP=1"));
    }

    #[test]
    fn a_split_suite_deals_the_binaries_in_turn_and_keeps_each_once() {
        let names: Vec<&str> = GUEST_TESTS.iter().map(|t| t.name).collect();
        let parts = deal(&names, 2);
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0].len() + parts[1].len(), names.len());
        assert_eq!(parts[0].first(), Some(&&"kernel"));
        assert_eq!(parts[1].first(), Some(&&"prog_test_run"));
        let mut all: Vec<&str> = parts.iter().flatten().map(|name| **name).collect();
        all.sort_unstable();
        let mut expected = names.clone();
        expected.sort_unstable();
        assert_eq!(all, expected);
        // One part: the whole suite in its order.
        let whole = deal(&names, 1);
        assert_eq!(whole.len(), 1);
        assert_eq!(
            whole[0].iter().map(|name| **name).collect::<Vec<_>>(),
            names
        );
    }

    #[test]
    fn ldd_output_gives_absolute_paths_only() {
        let text = "\tlinux-vdso.so.1 (0x00007fd4984f8000)\n\
                    \tlibbpf.so.1 => /lib/x86_64-linux-gnu/libbpf.so.1 (0x00007fd498398000)\n\
                    \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007fd49816f000)\n\
                    \t/lib64/ld-linux-x86-64.so.2 (0x00007fd4984fa000)\n";
        assert_eq!(
            parse_ldd(text),
            [
                PathBuf::from("/lib/x86_64-linux-gnu/libbpf.so.1"),
                PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"),
                PathBuf::from("/lib64/ld-linux-x86-64.so.2"),
            ]
        );
    }

    #[test]
    fn artifacts_are_read_from_cargo_messages() {
        let stdout = concat!(
            r#"{"reason":"compiler-artifact","target":{"kind":["bin"],"name":"ebpf-portmap"},"profile":{"test":false},"executable":"/t/debug/ebpf-portmap"}"#,
            "\n",
            r#"{"reason":"compiler-artifact","target":{"kind":["lib"],"name":"portmap_user"},"profile":{"test":false},"executable":null}"#,
            "\n",
            r#"{"reason":"compiler-artifact","target":{"kind":["test"],"name":"plugin"},"profile":{"test":true},"executable":"/t/debug/deps/plugin-1"}"#,
            "\n",
            r#"{"reason":"build-finished","success":true}"#,
            "\n",
        );
        let artifacts = artifacts_from_messages(stdout);
        assert_eq!(artifacts.len(), 2, "{artifacts:?}");
        assert_eq!(artifacts[0].name, "ebpf-portmap");
        assert!(!artifacts[0].test);
        assert_eq!(
            artifacts[1].executable,
            PathBuf::from("/t/debug/deps/plugin-1")
        );
    }

    #[test]
    fn init_prints_the_markers_the_host_reads() {
        assert!(INIT_SCRIPT.contains(&format!("echo \"{RESULT_MARKER} $EPM_KERNEL $result\"")));
        assert!(INIT_SCRIPT.contains(&format!("echo \"{TEST_MARKER} $name $status")));
        assert!(INIT_SCRIPT.contains(&format!("echo \"{RUNNING_MARKER} running $name $args\"")));
        assert!(INIT_SCRIPT.contains(GUEST_CONFIG_DIR));
        assert!(INIT_SCRIPT.contains(GUEST_MODULES_DIR));
        assert!(INIT_SCRIPT.contains(GUEST_TESTS_DIR));
        let env = guest_env("6.1", "6.1.0-57-amd64", "clsact", false);
        assert!(env.contains("export EPM_EXPECT_ATTACH_MODE=clsact\n"));
        assert!(env.contains("export EPM_EXPECT_FORWARD_HOOKS=0\n"));
        assert!(env.contains("export EPM_EXPECT_KFUNCS=1\n"));
        assert!(env.contains("export EPM_PLUGIN_TIMEOUT_SECS=300\n"));
        let env = guest_env("6.12", "6.12.118+deb12-amd64", "tcx", true);
        assert!(env.contains("export EPM_EXPECT_FORWARD_HOOKS=1\n"));
        assert!(env.contains("export EPM_EXPECT_KFUNCS=1\n"));
        assert!(env.contains(&format!("export EBPF_PORTMAP_BIN={GUEST_PLUGIN_BIN}\n")));
    }
}
