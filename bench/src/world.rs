//! The worlds the bench measures in: one standard [`Node`] per flavour, each
//! with one real container attached through the real bridge + host-local
//! chain, running the bench servers.
//!
//! - `Ours`: bridge + host-local + `ebpf-portmap` (own pin root);
//! - `Upstream`: bridge + host-local + Debian's iptables `portmap`;
//! - `Plain`: bridge + host-local only: the physical baseline, reached at the
//!   container IP (no translation, no port-mapping plugin at all).
//!
//! The external client `ext` already routes everything through the node
//! (default via 198.18.0.1), so the direct path to 10.244.0.0/24 needs no
//! extra route. The client namespace keeps no TIME_WAIT sockets and has a
//! wide local port range, so connection-rate loops neither run out of ports
//! nor leave sockets behind; nothing outside the world's namespaces is
//! changed.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Mutex;

use portmap_tests::cni::{CniCommand, result_addresses};
use portmap_tests::topology::{EXT_IP4, NODE_IP4, PortMapping, port_mappings_args};
use portmap_tests::{Conflist, Container, Node, PinRoot, PluginDirs, bridge_conflist};
use serde_json::{Value, json};

use super::floor::{Hook, TcFloor};
use super::invoke::{Invoker, Timed};
use super::load::{
    SERVICE_CLOSE_FIRST_PORT, SERVICE_DIRECT_RR_PORT, SERVICE_RR_PORT, SERVICE_STREAM_PORT,
    SERVICE_UDP_PORT, Servers,
};
use super::nftables;
use super::plan::{Plan, Section};

/// Which port-mapping plugin a world runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    Ours,
    /// ebpf-portmap with `fastPath` on: a dataplane path only, measured in
    /// the `Ours` world with the node's fast-path flag switched on.
    OursFast,
    Upstream,
    /// Upstream portmap 1.9.x with its nftables backend (see
    /// [`crate::nftables`]).
    Nftables,
    Plain,
    /// Direct traffic to the container (no hostPort, a port no mapping
    /// uses) in the `Ours` world: what ebpf-portmap's programs cost the
    /// pod traffic they do not translate, against `Plain`.
    OursDirect,
    /// Direct traffic to the container in the `Plain` world with programs
    /// that do nothing (bench/floor) at the tc hooks where ebpf-portmap has
    /// its programs: what any program there costs, against `Plain`, and
    /// what ebpf-portmap's own code costs beyond it (`OursDirect` against
    /// this).
    PlainFloor,
    /// Another build of ebpf-portmap (`--baseline-bin`, e.g. the commit
    /// before a change) in a world of its own: the control-plane runs
    /// compare the plugin under test with it.
    Baseline,
    /// ebpf-portmap with `containerSockets` on, in a world of its own (the
    /// hairpin section): its pods' clients run in the hooked cgroup, so a
    /// pod's connection to a host port is pointed at the container at the
    /// socket instead of taking the packet hairpin.
    OursSockets,
}

/// The binary of [`Flavor::Baseline`], set once from `--baseline-bin`.
pub static BASELINE_BIN: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();

impl Flavor {
    pub fn plugin_type(self) -> Option<&'static str> {
        match self {
            Flavor::Ours
            | Flavor::OursFast
            | Flavor::OursDirect
            | Flavor::Baseline
            | Flavor::OursSockets => Some("ebpf-portmap"),
            Flavor::Upstream => Some("portmap"),
            Flavor::Nftables => Some(crate::nftables::PLUGIN_TYPE),
            Flavor::Plain | Flavor::PlainFloor => None,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Flavor::Ours => "ebpf-portmap",
            Flavor::OursFast => "ebpf-portmap fastPath",
            Flavor::Upstream => "iptables portmap",
            Flavor::Nftables => "nftables portmap",
            Flavor::Plain => "direct (no translation)",
            Flavor::OursDirect => "direct, ebpf-portmap loaded",
            Flavor::PlainFloor => "direct, empty programs at ebpf-portmap's hooks",
            Flavor::Baseline => "ebpf-portmap baseline build",
            Flavor::OursSockets => "ebpf-portmap containerSockets",
        }
    }
}

/// Host ports of the probe mappings (the last-added ones at every size).
pub const PROBE_RR_HOST_PORT: u16 = 7001;
pub const PROBE_STREAM_HOST_PORT: u16 = 7002;
pub const PROBE_UDP_HOST_PORT: u16 = 7003;
/// A UDP mapping to a container port nobody listens on: flows to it only
/// fill conntrack.
pub const PROBE_FILL_HOST_PORT: u16 = 7009;
pub const FILL_CONTAINER_PORT: u16 = 9;
/// The close-first service (one request, the server closes first) of the
/// hairpin worlds.
pub const HAIRPIN_CLOSE_FIRST_HOST_PORT: u16 = 7004;
/// Host ports handed to single-mapping containers of the control-plane runs
/// start here (one distinct port per container).
pub const OP_PORT_BASE: u16 = 20000;
/// Host ports of prefilled mappings start here.
pub const PREFILL_PORT_BASE: u16 = 30000;
/// An unrelated remote port for the connect() loop: the client host's
/// discard port (UDP connect() sends nothing, so nobody need listen).
pub const UNRELATED_REMOTE: SocketAddr = SocketAddr::new(IpAddr::V4(EXT_IP4), 9);

/// One flavour's world: node, servers, conflist, invoker.
pub struct BenchWorld {
    pub flavor: Flavor,
    pub node: Node,
    pub list: Conflist,
    pub invoker: Invoker,
    /// The real container with the servers.
    pub container: Container,
    pub container_ip: Ipv4Addr,
    /// The chain's result for the real container: the fixed `prevResult` of
    /// every port-plugin-alone call (same netns, IPs and interfaces).
    pub prev_result: Value,
    pub pins: Option<PinRoot>,
    /// The floor programs of [`Flavor::PlainFloor`] (the `Plain` world only).
    floor: Mutex<FloorState>,
    _plugins: PluginDirs,
    _servers: Servers,
}

impl BenchWorld {
    /// Builds the world and attaches its container (bridge + host-local
    /// [+ port plugin], no port mappings yet).
    ///
    /// # Panics
    /// If any step fails (the guards remove what was created).
    pub fn new(flavor: Flavor, name: &str, cpu: Option<usize>) -> BenchWorld {
        let node = Node::new();
        // Connection-rate loops open ~25 000 connections a second. The
        // client keeps no TIME_WAIT sockets: they would pile up by the
        // hundred thousand in the kernel's machine-wide TCP hash, which
        // anything walking /proc/net/tcp (the plugin's listener check, in
        // any namespace) then pays for in later measurements.
        for (key, value) in [
            ("net.ipv4.tcp_max_tw_buckets", "0"),
            ("net.ipv4.tcp_tw_reuse", "1"),
            ("net.ipv4.ip_local_port_range", "1024 65535"),
        ] {
            node.ext.sysctl(key, value);
        }
        // The firewall every Kubernetes node has (kube-proxy's KUBE-FORWARD
        // chain), which also makes the node track connections, as every
        // real node does. Every world has it, the direct path's too, so no
        // side is measured with conntrack and the other without.
        node.drop_invalid_at_forward();
        // And kube-proxy's nat chains (empty here): netfilter's NAT hooked,
        // so that ebpf-portmap's default mode has its new flows translated
        // by netfilter, with the kernel's DNAT entry (issue 50), as on a
        // Kubernetes node. Every world has them, for the same reason.
        node.hook_nat();
        let pins = matches!(
            flavor,
            Flavor::Ours | Flavor::Baseline | Flavor::OursSockets
        )
        .then(PinRoot::new);
        // Every world that runs ebpf-portmap runs a copy written into its
        // own plugin directory, the baseline build's the same way as ours:
        // an exec's cost depends on how the file was written (see
        // `PluginDirs::with_plugin_copy`).
        let plugins = match (flavor, BASELINE_BIN.get()) {
            (Flavor::Baseline, Some(bin)) => PluginDirs::with_plugin_copy(bin),
            (Flavor::Baseline, None) => panic!("a baseline world needs --baseline-bin"),
            (Flavor::Ours | Flavor::OursFast | Flavor::OursDirect | Flavor::OursSockets, _) => {
                PluginDirs::with_plugin_copy(&portmap_tests::plugin_bin())
            }
            (Flavor::Upstream | Flavor::Nftables | Flavor::Plain | Flavor::PlainFloor, _) => {
                PluginDirs::new()
            }
        };
        let mut invoker = Invoker::new(plugins.path().to_path_buf(), node.ns.handle());
        let full = bridge_conflist(
            name,
            match flavor {
                Flavor::Nftables => "portmap",
                _ => flavor.plugin_type().unwrap_or("portmap"),
            },
            pins.as_ref().map(PinRoot::path),
            node.data_dir(),
        );
        let list = match flavor {
            Flavor::Nftables => {
                crate::nftables::link_into(plugins.path());
                invoker = invoker.with_env(crate::nftables::plugin_env());
                let mut json = full.json().clone();
                let plugins = json["plugins"].as_array_mut().expect("plugins array");
                crate::nftables::configure(plugins.last_mut().expect("the port plugin"));
                Conflist::from_json(json).expect("a valid conflist")
            }
            Flavor::OursSockets => {
                let mut json = full.json().clone();
                json["plugins"]
                    .as_array_mut()
                    .and_then(|plugins| plugins.last_mut())
                    .and_then(Value::as_object_mut)
                    .expect("the port plugin")
                    .insert("containerSockets".into(), Value::Bool(true));
                Conflist::from_json(json).expect("a valid conflist")
            }
            Flavor::Plain => {
                let mut json = full.json().clone();
                json["plugins"]
                    .as_array_mut()
                    .expect("plugins array")
                    .truncate(1);
                Conflist::from_json(json).expect("a valid conflist")
            }
            _ => full,
        };
        let container = node.add_container("srv");
        let servers = Servers::start(&container.ns, cpu);
        let rt = container.with_port_mappings(&[]);
        let added = invoker.chain_add(&list, &rt);
        let prev_result = added
            .result
            .unwrap_or_else(|e| panic!("{name}: ADD of the server container failed: {e}"));
        let container_ip = result_addresses(&prev_result)
            .into_iter()
            .find_map(|ip| match ip {
                IpAddr::V4(v4) => Some(v4),
                IpAddr::V6(_) => None,
            })
            .unwrap_or_else(|| panic!("{name}: no IPv4 address in {prev_result}"));
        BenchWorld {
            flavor,
            node,
            list,
            invoker,
            container,
            container_ip,
            prev_result,
            pins,
            floor: Mutex::default(),
            _plugins: plugins,
            _servers: servers,
        }
    }

    /// A fake container of the port-plugin-alone runs: its own ID, the real
    /// container's netns and interface.
    pub fn fake(&self, id: &str, mappings: &[PortMapping]) -> portmap_tests::RuntimeAttachment {
        let mut rt = self.container.attachment(port_mappings_args(mappings));
        rt.container_id = id.to_owned();
        rt
    }

    /// ADD of the port-mapping plugin alone for `id`.
    pub fn port_add(&self, id: &str, mappings: &[PortMapping]) -> Timed {
        let rt = self.fake(id, mappings);
        self.invoker
            .port_plugin(&self.list, CniCommand::Add, &rt, &self.prev_result)
    }

    /// DEL of the port-mapping plugin alone for `id` (with the same
    /// `runtimeConfig` and `prevResult` a runtime would send).
    pub fn port_del(&self, id: &str, mappings: &[PortMapping]) -> Timed {
        let rt = self.fake(id, mappings);
        self.invoker
            .port_plugin(&self.list, CniCommand::Del, &rt, &self.prev_result)
    }

    /// The probe mappings: RR/CRR, stream and UDP services, plus the UDP
    /// conntrack-fill port.
    pub fn probe_mappings() -> [PortMapping; 4] {
        [
            PortMapping::tcp(PROBE_RR_HOST_PORT, SERVICE_RR_PORT),
            PortMapping::tcp(PROBE_STREAM_HOST_PORT, SERVICE_STREAM_PORT),
            PortMapping::udp(PROBE_UDP_HOST_PORT, SERVICE_UDP_PORT),
            PortMapping::udp(PROBE_FILL_HOST_PORT, FILL_CONTAINER_PORT),
        ]
    }

    /// The hairpin worlds' mappings: request/response, UDP echo and the
    /// close-first service (what their connect+request+close dials).
    pub fn hairpin_mappings() -> [PortMapping; 3] {
        [
            PortMapping::tcp(PROBE_RR_HOST_PORT, SERVICE_RR_PORT),
            PortMapping::udp(PROBE_UDP_HOST_PORT, SERVICE_UDP_PORT),
            PortMapping::tcp(HAIRPIN_CLOSE_FIRST_HOST_PORT, SERVICE_CLOSE_FIRST_PORT),
        ]
    }

    /// Another pod on the node: attached by the whole chain without
    /// mappings, no servers.
    ///
    /// # Panics
    /// If its ADD fails.
    pub fn add_pod(&self, name: &str) -> Container {
        let pod = self.node.add_container(name);
        let added = self
            .invoker
            .chain_add(&self.list, &pod.with_port_mappings(&[]));
        if let Err(e) = added.result {
            panic!("{}: ADD of pod {name} failed: {e}", self.flavor.label());
        }
        pod
    }

    /// Where the client reaches each service in this world: the node's
    /// hostPorts, or the container IP directly for `Plain`.
    pub fn targets(&self) -> Targets {
        match self.flavor {
            Flavor::Plain => Targets::at(IpAddr::V4(self.container_ip), false),
            _ => Targets::at(IpAddr::V4(NODE_IP4), true),
        }
    }

    /// The request/response service on the container IP, on a port no
    /// mapping uses (see [`Flavor::OursDirect`]).
    pub fn direct_rr(&self) -> SocketAddr {
        SocketAddr::new(IpAddr::V4(self.container_ip), SERVICE_DIRECT_RR_PORT)
    }

    /// Where [`BenchWorld::set_floor`] attaches the floor programs: the
    /// hooks of ebpf-portmap's programs in its world (the worlds are built
    /// alike, so the interfaces have the same names).
    pub fn set_floor_hooks(&self, hooks: Vec<Hook>) {
        self.floor.lock().expect("floor state").hooks = hooks;
    }

    /// Attaches the floor programs at their hooks (`on`) or detaches them.
    ///
    /// # Panics
    /// If attaching fails.
    pub fn set_floor(&self, on: bool) {
        let mut floor = self.floor.lock().expect("floor state");
        if !on {
            floor.attached = None;
        } else if floor.attached.is_none() {
            let attached = TcFloor::attach(&self.node.ns.handle(), &floor.hooks)
                .unwrap_or_else(|e| panic!("the floor programs: {e}"));
            floor.attached = Some(attached);
        }
    }

    /// The kernel's id of the attached floor tc program.
    pub fn floor_program_id(&self) -> Option<u32> {
        self.floor
            .lock()
            .expect("floor state")
            .attached
            .as_ref()
            .and_then(TcFloor::program_id)
    }

    /// `ebpf-portmap status --json` of this world's pin root; `None` in an
    /// upstream world (no pin root) or when it prints no JSON. `status`
    /// exits non-zero when it finds a problem; its JSON is read all the
    /// same.
    pub fn status_json(&self) -> Option<serde_json::Value> {
        let pins = self.pins.as_ref()?;
        let out = self
            .node
            .ns
            .command(portmap_tests::plugin_bin())
            .args(["status", "--json", "--pin-root"])
            .arg(pins.path())
            .output()
            .ok()?;
        serde_json::from_slice(&out.stdout).ok()
    }

    /// Switches `fastPath` on or off for the whole node, as an ADD with
    /// that setting would (the flag lives in the pinned `node` map), so the
    /// fast and the normal path are measured on the same world.
    ///
    /// # Panics
    /// If the world is not ebpf-portmap's or bpftool fails.
    pub fn set_fast_path(&self, on: bool) {
        let pins = self.pins.as_ref().expect("an ebpf-portmap world");
        let map = pins.path().join("v1/maps/node");
        let bpftool = |args: &[&str]| {
            let out = std::process::Command::new("bpftool")
                .args(args)
                .output()
                .expect("run bpftool");
            assert!(
                out.status.success(),
                "bpftool {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            out.stdout
        };
        let path = map.to_str().expect("a UTF-8 pin path");
        let key = ["key", "0", "0", "0", "0"];
        let mut lookup = vec!["--json", "map", "lookup", "pinned", path];
        lookup.extend(key);
        let shown: Value = serde_json::from_slice(&bpftool(&lookup)).expect("bpftool JSON");
        // NodeConfig: netns cookie (8 bytes), flags (4), padding (4).
        let mut bytes: Vec<u8> = shown["value"]
            .as_array()
            .expect("raw value bytes")
            .iter()
            .map(|b| {
                u8::from_str_radix(b.as_str().unwrap_or("").trim_start_matches("0x"), 16)
                    .expect("a hex byte")
            })
            .collect();
        use portmap_common::local::node_flags::FAST_PATH;
        let mut flags = u32::from_ne_bytes(bytes[8..12].try_into().expect("4 flag bytes"));
        // The kernel-NAT bits stay as the ADD set them: an ADD with
        // `fastPath: true` sets them too (its flows get the kernel's DNAT
        // entry, translated in tc all the same).
        if on {
            flags |= FAST_PATH;
        } else {
            flags &= !FAST_PATH;
        }
        bytes[8..12].copy_from_slice(&flags.to_ne_bytes());
        let hex: Vec<String> = bytes.iter().map(|b| format!("{b:02x}")).collect();
        let mut update = vec!["map", "update", "pinned", path];
        update.extend(key);
        update.extend(["value", "hex"]);
        update.extend(hex.iter().map(String::as_str));
        bpftool(&update);
    }

    /// The plugin's config for notes in the report.
    pub fn port_plugin_config(&self) -> Value {
        self.list.plugins().last().cloned().unwrap_or(json!(null))
    }
}

/// Where the floor programs go and whether they are attached.
#[derive(Default)]
struct FloorState {
    hooks: Vec<Hook>,
    attached: Option<TcFloor>,
}

/// Client-side addresses of the four services.
#[derive(Debug, Clone, Copy)]
pub struct Targets {
    pub rr: SocketAddr,
    pub stream: SocketAddr,
    pub udp: SocketAddr,
}

impl Targets {
    fn at(ip: IpAddr, host_ports: bool) -> Targets {
        let port = |host: u16, container: u16| if host_ports { host } else { container };
        Targets {
            rr: SocketAddr::new(ip, port(PROBE_RR_HOST_PORT, SERVICE_RR_PORT)),
            stream: SocketAddr::new(ip, port(PROBE_STREAM_HOST_PORT, SERVICE_STREAM_PORT)),
            udp: SocketAddr::new(ip, port(PROBE_UDP_HOST_PORT, SERVICE_UDP_PORT)),
        }
    }
}

/// The five worlds the bench measures in; each is built only when a
/// section that is run needs it.
pub struct Worlds {
    /// Filled up to each size; carries the dataplane probe mappings.
    pub ours: Option<BenchWorld>,
    pub upstream: Option<BenchWorld>,
    /// Kept empty: the control-plane runs and the "empty node" side of the
    /// scale ratios.
    pub ours_empty: Option<BenchWorld>,
    pub upstream_empty: Option<BenchWorld>,
    /// nftables portmap's, as iptables portmap's; `None` when the peer
    /// cannot run here ([`nftables::skip_reason`] says why).
    pub nftables: Option<BenchWorld>,
    pub nftables_empty: Option<BenchWorld>,
    pub plain: Option<BenchWorld>,
    /// Kept empty, with `--baseline-bin`: the other side of the
    /// control-plane comparison with another build.
    pub baseline_empty: Option<BenchWorld>,
}

impl Worlds {
    pub fn new(plan: &Plan) -> Worlds {
        let build =
            |needed: bool, flavor, name| needed.then(|| BenchWorld::new(flavor, name, plan.cpu));
        let empty = plan.runs(Section::Control) || plan.runs(Section::Scale);
        let nft = nftables::peer().is_ok();
        Worlds {
            ours: build(plan.fills(), Flavor::Ours, "bench-ebpf"),
            upstream: build(plan.fills_upstream(), Flavor::Upstream, "bench-iptables"),
            ours_empty: build(empty, Flavor::Ours, "bench-ebpf-empty"),
            upstream_empty: build(empty, Flavor::Upstream, "bench-iptables-empty"),
            nftables: build(
                nft && plan.fills_upstream(),
                Flavor::Nftables,
                "bench-nftables",
            ),
            nftables_empty: build(nft && empty, Flavor::Nftables, "bench-nftables-empty"),
            plain: build(plan.runs(Section::Dataplane), Flavor::Plain, "bench-direct"),
            baseline_empty: build(
                plan.runs(Section::Control) && BASELINE_BIN.get().is_some(),
                Flavor::Baseline,
                "bench-ebpf-baseline",
            ),
        }
    }

    pub fn count(&self) -> usize {
        [
            &self.ours,
            &self.upstream,
            &self.ours_empty,
            &self.upstream_empty,
            &self.nftables,
            &self.nftables_empty,
            &self.plain,
            &self.baseline_empty,
        ]
        .iter()
        .filter(|w| w.is_some())
        .count()
    }

    /// The port plugin's configuration of `flavor`, from whichever world has it.
    pub fn port_plugin_config(&self, flavor: Flavor) -> Value {
        let (filled, empty) = match flavor {
            Flavor::Ours => (&self.ours, &self.ours_empty),
            Flavor::Nftables => (&self.nftables, &self.nftables_empty),
            _ => (&self.upstream, &self.upstream_empty),
        };
        filled
            .as_ref()
            .or(empty.as_ref())
            .map_or(Value::Null, BenchWorld::port_plugin_config)
    }
}

/// A world that the sections being run need: built by [`Worlds::new`].
pub fn world(world: &Option<BenchWorld>) -> &BenchWorld {
    world
        .as_ref()
        .expect("Worlds::new builds every world the selected sections use")
}
