//! The node of real pods: its reference chain (bridge + host-local over a
//! /20) and port-mapping plugins, its probe pod, the prefilled pods and
//! their host ports, and the one more pod whose ADD and DEL the rows time.
//! Filling it is `fill`'s; what is measured on it, the siblings'.

use std::path::{Path, PathBuf};

use anyhow::anyhow;
use portmap_tests::cni::CniCommand;
use portmap_tests::tmp::TempDir;
use portmap_tests::topology::{PLUGIN_LOG, port_mappings_args};
use portmap_tests::{
    Conflist, Container, Node, PinRoot, PluginDirs, PortMapping, RuntimeAttachment,
    bridge_conflist, plugin_bin,
};
use serde_json::{Value, json};

use crate::invoke::{Invoker, Timed};
use crate::nftables;
use crate::world::{Flavor, OP_PORT_BASE};

/// The pods' IPv4 range: room for 4 000 pods (the harness's /24 holds 253).
const POD_RANGE4: &str = "10.244.0.0/20";
/// Host ports of the prefilled pods: pod `i` has `POD_PORT_BASE + 10 i ..`.
pub(super) const POD_PORT_BASE: u16 = 30_000;

/// Mappings of prefilled pod `index`: TCP and UDP alternating, from its
/// own block of 10 host ports.
pub(super) fn pod_mappings(index: usize, count: usize) -> Vec<PortMapping> {
    (0..count)
        .map(|k| {
            let port = u16::try_from(POD_PORT_BASE as usize + index * 10 + k)
                .expect("pod ports stay below 65536");
            if k % 2 == 0 {
                PortMapping::tcp(port, 80)
            } else {
                PortMapping::udp(port, 53)
            }
        })
        .collect()
}

/// The one more pod's mappings of operation `i`: one TCP, one UDP.
pub(super) fn one_more_mappings(i: usize) -> Vec<PortMapping> {
    let port = OP_PORT_BASE + u16::try_from(i % 5_000).expect("small") * 2;
    vec![PortMapping::tcp(port, 80), PortMapping::udp(port + 1, 53)]
}

pub(super) fn pod_id(index: usize) -> String {
    format!("pod{index}")
}

/// A prefilled pod: its namespace and what bridge + host-local answered
/// (the `prevResult` of its port-mapping plugin calls).
pub(super) struct Pod {
    pub(super) container: Container,
    pub(super) prev_result: Value,
    pub(super) mappings: usize,
}

/// A node with the reference chain and both port-mapping plugins, its pods
/// and a probe pod (attached by bridge + host-local only) whose namespace
/// the one-more-pod operations use.
pub(super) struct PodNode {
    pub(super) node: Node,
    pub(super) _pins: PinRoot,
    pub(super) invoker: Invoker,
    pub(super) ours: Conflist,
    pub(super) upstream: Conflist,
    pub(super) probe: Container,
    pub(super) probe_prev: Value,
    pub(super) pods: Vec<Pod>,
    /// Pods whose iptables portmap rules are in place, of them real ADDs.
    pub(super) upstream_pods: usize,
    pub(super) upstream_real: usize,
    pub(super) upstream_mappings: usize,
    /// Copies made so far (their chains are numbered by it).
    pub(super) upstream_copies: usize,
    /// nftables portmap (1.9.x), when it can run here.
    pub(super) nftables: Option<Conflist>,
    /// Pods whose nftables portmap rules are in place (all real ADDs), and
    /// with how many mappings each.
    pub(super) nftables_pods: usize,
    pub(super) nftables_mappings: usize,
    pub(super) trace_dir: TempDir,
    pub(super) _plugins: PluginDirs,
}

/// `bridge` (cni0) + `host-local` over [`POD_RANGE4`] + `kind`.
fn pod_conflist(name: &str, kind: &str, pins: Option<&Path>, node: &Node) -> Conflist {
    let mut json = bridge_conflist(name, kind, pins, node.data_dir())
        .json()
        .clone();
    json["plugins"][0]["ipam"]["ranges"][0] = json!([{ "subnet": POD_RANGE4 }]);
    Conflist::from_json(json).expect("a valid conflist")
}

impl PodNode {
    pub(super) fn new(name: &str) -> anyhow::Result<PodNode> {
        let node = Node::new();
        let pins = PinRoot::new();
        let plugins = PluginDirs::with_plugin_copy(&plugin_bin());
        // The PATH holding `nft` (nftables portmap's), harmless to the others.
        let invoker = Invoker::new(plugins.path().to_path_buf(), node.ns.handle())
            .with_env(nftables::plugin_env());
        let ours = pod_conflist(name, "ebpf-portmap", Some(pins.path()), &node);
        let upstream = pod_conflist(name, "portmap", None, &node);
        let nftables = nftables::peer().is_ok().then(|| {
            nftables::link_into(plugins.path());
            let mut json = upstream.json().clone();
            let plugins = json["plugins"].as_array_mut().expect("plugins array");
            nftables::configure(plugins.last_mut().expect("the port plugin"));
            Conflist::from_json(json).expect("a valid conflist")
        });
        let mut bridge_only = ours.json().clone();
        bridge_only["plugins"]
            .as_array_mut()
            .expect("plugins array")
            .truncate(1);
        let bridge_only = Conflist::from_json(bridge_only).expect("a valid conflist");
        let probe = node.add_container("probe");
        let probe_prev = invoker
            .chain_add(&bridge_only, &probe.with_port_mappings(&[]))
            .result
            .map_err(|e| anyhow!("{name}: ADD of the probe pod: {e}"))?;
        Ok(PodNode {
            node,
            _pins: pins,
            invoker,
            ours,
            upstream,
            probe,
            probe_prev,
            pods: Vec::new(),
            upstream_pods: 0,
            upstream_real: 0,
            upstream_mappings: 0,
            upstream_copies: 0,
            nftables,
            nftables_pods: 0,
            nftables_mappings: 0,
            trace_dir: TempDir::new("bench-trace"),
            _plugins: plugins,
        })
    }

    pub(super) fn list(&self, flavor: Flavor) -> &Conflist {
        match flavor {
            Flavor::Upstream => &self.upstream,
            Flavor::Nftables => self
                .nftables
                .as_ref()
                .expect("nftables portmap is only run where it can run"),
            _ => &self.ours,
        }
    }

    /// The one more pod of operation `id`: the probe's namespace and
    /// interfaces, a container ID of its own.
    pub(super) fn one_more(&self, id: &str, mappings: &[PortMapping]) -> RuntimeAttachment {
        let mut rt = self.probe.attachment(port_mappings_args(mappings));
        rt.container_id = id.to_owned();
        rt
    }

    /// The port-mapping plugin `flavor` alone for the one more pod `id`.
    pub(super) fn one_more_op(
        &self,
        flavor: Flavor,
        command: CniCommand,
        id: &str,
        mappings: &[PortMapping],
    ) -> Timed {
        self.invoker.port_plugin(
            self.list(flavor),
            command,
            &self.one_more(id, mappings),
            &self.probe_prev,
        )
    }

    /// The plugin's log (its debug account lines).
    pub(super) fn log(&self) -> PathBuf {
        self.node.data_dir().join(PLUGIN_LOG)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pods_have_ports_of_their_own_tcp_and_udp() {
        let two = pod_mappings(3, 2);
        assert_eq!(
            two,
            [PortMapping::tcp(30_030, 80), PortMapping::udp(30_031, 53)]
        );
        let ten = pod_mappings(999, 10);
        assert_eq!(ten.len(), 10);
        assert_eq!(ten[9], PortMapping::udp(39_999, 53));
        let more = one_more_mappings(4);
        assert_eq!(
            more,
            [PortMapping::tcp(20_008, 80), PortMapping::udp(20_009, 53)]
        );
    }
}
