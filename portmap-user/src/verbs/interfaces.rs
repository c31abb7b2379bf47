//! Which interfaces of the node carry the programs (uplinks and the
//! container-facing side from prevResult), and the reconciliation every
//! run does against them.

use super::shared::PluginError;
use crate::cni::netconf::NetConf;
use crate::dataplane::attach;
use crate::dataplane::attach::AttachError;
use crate::dataplane::attach::LinkPins;
use crate::dataplane::attach::Targets;
use crate::dataplane::cgroup;
use crate::dataplane::node_state;
use crate::dataplane::pin::PinLayout;
use crate::dataplane::sizing::Capacities;
use crate::dataplane::stale;
use crate::model::PrevInterface;
use crate::node::netlink;
use crate::node::netlink::Link;
use crate::node::netlink::NodeAddress;
use crate::node::netlink::Rtnl;
use std::collections::BTreeMap;
use std::collections::BTreeSet;

/// What one run sees of the node: the interfaces it needs and the node's
/// addresses, and which interfaces should carry the programs.
pub struct NodeView {
    /// Every interface without a controller (where uplinks are) and the
    /// request's own host-side interfaces; every interface of the node
    /// when `interfaces` is set (a pattern may name a port) or the kernel
    /// cannot filter the dump. A bridge's ports (the pods' veths) are
    /// otherwise left out: no run needs them, and there is one per pod.
    pub links: Vec<Link>,
    /// The addresses of the interfaces in `links` when the link dump was
    /// filtered (a request per interface, see [`Rtnl::addresses_of`]);
    /// every address of the node otherwise. Either way, everything
    /// [`recorded_addresses`] keeps of the interfaces in `links`.
    pub addresses: Vec<NodeAddress>,
    /// Where traffic from outside arrives ([`netlink::select_uplinks`]).
    pub uplinks: BTreeSet<u32>,
    /// This request's container-facing interfaces (prevResult).
    pub container_side: BTreeSet<u32>,
    /// This request's bridge ports (prevResult's host end of the veth, a
    /// port of a bridge in `container_side`), each with its bridge: they
    /// carry the ingress program too ([`bridge_ports`]).
    pub ports: BTreeMap<u32, u32>,
}

impl NodeView {
    /// One link dump (filtered, see [`NodeView::links`]), a request per
    /// host-side interface of the request the dump left out, and an
    /// address dump per interface found (one dump of all when the links
    /// are all of the node's, or the kernel cannot filter addresses). `interfaces` entries that match nothing are skipped
    /// with a warning; none matching at all is an error (the configuration
    /// names another node's interfaces).
    pub fn read(
        rtnl: &mut Rtnl,
        conf: &NetConf,
        interfaces: &[PrevInterface],
    ) -> Result<NodeView, PluginError> {
        let (links, filtered) = needed_links(rtnl, conf, interfaces)?;
        let indexes: BTreeSet<u32> = links.iter().map(|l| l.index).collect();
        let addresses = match filtered {
            true => rtnl.addresses_of(&indexes)?,
            false => None,
        };
        let addresses = match addresses {
            Some(addresses) => addresses,
            None => rtnl.addresses()?,
        };
        let selection = netlink::select_uplinks(&links, conf.interfaces.as_deref());
        if let Some(patterns) = &conf.interfaces
            && selection.uplinks.is_empty()
        {
            return Err(PluginError::NoMatchingInterfaces {
                patterns: patterns.clone(),
                available: netlink::interface_names(&links),
            });
        }
        if !selection.unmatched.is_empty() {
            let available = netlink::interface_names(&links).join(", ");
            for entry in &selection.unmatched {
                log::warn!(
                    "`interfaces` entry {entry:?} matches no interface of this node (it has {available}); skipped"
                );
            }
        }
        let container_side = container_side_interfaces(&links, interfaces);
        let mut ports = bridge_ports(&links, interfaces, &container_side);
        ports.retain(|port, _| !selection.uplinks.contains(port));
        Ok(NodeView {
            links,
            addresses,
            uplinks: selection.uplinks,
            container_side,
            ports,
        })
    }

    /// Every interface that should carry the programs.
    pub fn targets(&self) -> BTreeSet<u32> {
        self.uplinks.union(&self.container_side).copied().collect()
    }
}

/// The links a run needs ([`NodeView::links`]), and whether the kernel
/// filtered them (`false`: they are every interface of the node).
fn needed_links(
    rtnl: &mut Rtnl,
    conf: &NetConf,
    interfaces: &[PrevInterface],
) -> Result<(Vec<Link>, bool), netlink::NetlinkError> {
    // `interfaces` may name any interface, ports included: matching it
    // needs every name.
    if conf.interfaces.is_some() {
        return Ok((rtnl.links()?, false));
    }
    let Some(mut links) = rtnl.links_without_controller()? else {
        return Ok((rtnl.links()?, false));
    };
    for name in host_side_names(interfaces) {
        if !links.iter().any(|l| l.name == name)
            && let Some(link) = rtnl.link_named(name)?
        {
            links.push(link);
        }
    }
    Ok((links, true))
}

/// The addresses the node state records, the ones a hostPort answers on
/// (on both paths: the socket hooks and tc): every routable one, and the
/// link-local ones of the loopback and of interfaces carrying the
/// programs; never those of a Service VIP device (`serviceVipDevices`),
/// which are the node's only so that the kernel delivers them to IPVS. The
/// link-local addresses of other interfaces (an IPv6 one on every pod's
/// veth) are nobody's destination for a host port, and recording them
/// would make the node state change with every pod.
fn recorded_addresses(node: &NodeView, vip_devices: &[String]) -> Vec<NodeAddress> {
    let targets = node.targets();
    let vip: BTreeSet<u32> = node
        .links
        .iter()
        .filter(|l| netlink::name_matches(vip_devices, &l.name))
        .map(|l| l.index)
        .collect();
    let loopback: BTreeSet<u32> = node
        .links
        .iter()
        .filter(|l| l.loopback)
        .map(|l| l.index)
        .collect();
    node.addresses
        .iter()
        .filter(|a| {
            let routable = match a.own() {
                Some(std::net::IpAddr::V4(v4)) => !v4.is_link_local(),
                Some(std::net::IpAddr::V6(v6)) => !v6.is_unicast_link_local(),
                None => false,
            };
            (routable || targets.contains(&a.index) || loopback.contains(&a.index))
                && !vip.contains(&a.index)
        })
        .copied()
        .collect()
}

/// How much of the node a reconciliation sweeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pass {
    /// One CNI call (ADD, CHECK, DEL): work in proportion to the call, so
    /// its cost does not grow with the pods on the node.
    Call,
    /// A node-wide pass (the agent's, GC): also sweeps the settings of
    /// every interface that is gone.
    Node,
}

/// Brings the attachments and the node state (addresses, interface
/// settings) in line with the node as `node` saw it: every plugin run does
/// it, so an interface added or re-created and an address added since the
/// last run are taken up by whatever CNI call comes next.
pub fn reconcile(
    rtnl: &mut Rtnl,
    layout: &PinLayout,
    conf: &NetConf,
    node: &NodeView,
    pass: Pass,
) -> Result<(), PluginError> {
    let capacities = Capacities {
        mappings: conf.max_mappings,
        conntrack: conf.conntrack_size,
    };
    let cgroup = cgroup::target(conf.cgroup_path.as_deref()).map_err(AttachError::from)?;
    // A node-wide pass looks at every attachment: one that runs another
    // program than this build's pinned one (a change of programs or tables
    // that did not finish, however it came about) sends it through the
    // whole attach pass.
    if pass == Pass::Node
        && layout.progs_dir().exists()
        && !attach::attachments_current(layout, &cgroup)
    {
        attach::invalidate_pass(layout).map_err(AttachError::from)?;
    }
    let pins = LinkPins::read(layout);
    let Attached { mut live, ports } = attached(rtnl, &pins, conf, node)?;
    let mut port_bridges = node.ports.clone();
    // Every pod's port: node-wide passes, and once per build (the pods
    // made before the dataplane existed, or before an upgrade).
    let every_port = conf.interfaces.is_none()
        && (pass == Pass::Node || !attach::PortsRecord::is_current(layout));
    if every_port {
        port_bridges.extend(node_bridge_ports(rtnl, layout, &node.container_side)?);
        live.extend(port_bridges.keys());
    }
    let bridge_ports: BTreeSet<u32> = port_bridges.keys().copied().collect();
    // `-i` conditions follow their interface by name: their entries are
    // rewritten before the programs can go on an interface made since.
    crate::dataplane::interface_conditions::follow(layout, &node.links)?;
    attach::ensure(
        layout,
        pins,
        Targets {
            required: &node.container_side,
            uplinks: &node.uplinks,
            live: &live,
            ports: &ports,
            bridge_ports: &bridge_ports,
        },
        &cgroup,
        capacities,
    )?;
    // The fast path's mode: the kfuncs the load found, and, where they are
    // missing, whether anything is hooked at FORWARD (asked every run, so
    // a firewall set up since counts from the next one).
    let kfuncs = crate::dataplane::features::recorded_kfuncs(layout);
    let forward_hooked = crate::dataplane::features::needs_forward_probe(conf.fast_path, kfuncs)
        .then(|| match crate::node::forward_hooks::count() {
            Ok(hooks) => Some(hooks > 0),
            Err(error) => {
                log::info!("cannot tell what is hooked at FORWARD (nfnetlink_hook): {error}");
                None
            }
        })
        .flatten();
    // Translation by netfilter: the NAT kfuncs the load found, and per
    // family whether netfilter's NAT is hooked (asked every run too: a
    // nat chain made since counts from the next one).
    let nat_kfuncs = crate::dataplane::features::recorded_nat_kfuncs(layout);
    let nat_hooked = crate::dataplane::features::needs_nat_probe(conf.fast_path, nat_kfuncs)
        .then(|| match crate::node::nft_tables::nat_hooked() {
            Ok(hooked) => Some(hooked),
            Err(error) => {
                log::info!("cannot tell whether netfilter's NAT is hooked (nf_tables): {error}");
                None
            }
        })
        .flatten();
    let kernel_nat = crate::dataplane::features::kernel_nat(conf.fast_path, nat_kfuncs, nat_hooked);
    node_state::sync(
        layout,
        &node_state::NodeState {
            snat: conf.snat,
            masq_all: conf.masq_all,
            fast_path: conf.fast_path,
            kfuncs,
            forward_hooked,
            kernel_nat,
            addresses: recorded_addresses(node, &conf.service_vip_devices),
            service_vip_devices: conf.service_vip_devices.clone(),
            container_side: node.container_side.clone(),
            bridge_ports: port_bridges,
            attached: node.targets(),
            live,
            interfaces: conf.interfaces.clone(),
            sweep_interfaces: pass == Pass::Node,
        },
    )?;
    if every_port {
        attach::PortsRecord::write(layout);
    }
    // Nodes sharing this machine whose network namespace went away leave
    // their state, and their socket hooks on a shared cgroup, behind: any
    // node's run takes them off (see `dataplane::stale`).
    stale::sweep(layout);
    Ok(())
}

/// A node-wide pass over the pods' bridge ports (see [`bridge_ports`]):
/// every port of a bridge recorded as container-facing (or the request's),
/// whether or not a
/// run put the program there (pods made before an upgrade to a build that
/// does get it now), each with its bridge; and a pin of a port that is
/// gone, or no such port any more, is dropped (a pod whose DEL never came,
/// or came without prevResult). One dump of every link: node-wide passes
/// only.
fn node_bridge_ports(
    rtnl: &mut Rtnl,
    layout: &PinLayout,
    container_side: &BTreeSet<u32>,
) -> Result<BTreeMap<u32, u32>, PluginError> {
    // The pins first: one a run makes after the dump is then not taken
    // for a gone port's.
    let pinned = attach::port_pins(layout);
    let mut bridges = node_state::container_side_indexes(layout);
    bridges.extend(container_side);
    let ports: BTreeMap<u32, u32> = rtnl
        .links()?
        .iter()
        .filter(|l| bridges.contains(&l.controller))
        .map(|l| (l.index, l.controller))
        .collect();
    for ifindex in pinned {
        if !ports.contains_key(&ifindex) {
            attach::forget_port(layout, ifindex);
        }
    }
    Ok(ports)
}

/// Takes the ingress program off the request's bridge ports (DEL: the pod's
/// veth goes next, in the interface plugin's DEL), so that its pin does
/// not outlive it. A port the plugin does not find is left to the next
/// node-wide pass.
pub(super) fn forget_bridge_ports(layout: &PinLayout, interfaces: &[PrevInterface]) {
    for name in host_side_names(interfaces) {
        if let Some(ifindex) = netlink::interface_index(name) {
            attach::forget_port(layout, ifindex);
        }
    }
}

/// What a run knows of the interfaces that carry programs of ours.
struct Attached {
    /// Every interface the run's dump saw, and every one with pins that
    /// the kernel still has and that is no port.
    live: BTreeSet<u32>,
    /// Interfaces with pins that are ports of a bridge or a bond now.
    ports: BTreeSet<u32>,
}

/// Sorts the interfaces that carry programs of ours: those the run's dump
/// left out are asked about one by one (normally none: on a bridge
/// network only the uplinks and the bridge carry them, and on a routed
/// one every pod's veth is in the dump). Without `interfaces`, a port of
/// a bridge or bond never carries the programs (the bridge does), so pins
/// found there are a mistake to undo ([`LinkPins::interfaces`]);
/// `interfaces` may name ports on purpose.
fn attached(
    rtnl: &mut Rtnl,
    pins: &LinkPins,
    conf: &NetConf,
    node: &NodeView,
) -> Result<Attached, PluginError> {
    // One pin per pod on a routed network: looked up, not searched for.
    let seen: BTreeMap<u32, bool> = node
        .links
        .iter()
        .map(|l| (l.index, l.has_controller))
        .collect();
    let mut live: BTreeSet<u32> = seen.keys().copied().collect();
    let mut ports = BTreeSet::new();
    for ifindex in pins.interfaces() {
        let has_controller = match seen.get(&ifindex) {
            Some(&has_controller) => has_controller,
            None => match rtnl.link_at(ifindex)? {
                Some(link) => link.has_controller,
                // Gone: its pins are dropped by `attach::ensure`.
                None => continue,
            },
        };
        live.insert(ifindex);
        if has_controller && conf.interfaces.is_none() {
            ports.insert(ifindex);
        }
    }
    Ok(Attached { live, ports })
}

/// The reconciliation of a run that is not an ADD (DEL, GC): its failure
/// is logged, never the verb's, which has done its own work already.
pub(super) fn reconcile_after(verb: &str, layout: &PinLayout, conf: &NetConf, pass: Pass) {
    let outcome = Rtnl::open()
        .map_err(PluginError::from)
        .and_then(|mut rtnl| {
            // The interfaces of the container going away need nothing.
            let node = NodeView::read(&mut rtnl, conf, &[])?;
            reconcile(&mut rtnl, layout, conf, &node, pass)
        });
    log::debug!("{verb} account: {}", netlink::account());
    if let Err(error) = outcome {
        log::warn!(
            "{verb}: the attachments and node addresses were not brought up to date: {error}"
        );
    }
}

/// The names of the node-side interfaces prevResult reports (entries
/// without a sandbox: the bridge and the host end of the veth).
fn host_side_names(interfaces: &[PrevInterface]) -> impl Iterator<Item = &str> {
    interfaces
        .iter()
        .filter(|i| !i.in_sandbox())
        .filter_map(|i| i.name.as_deref())
}

/// [`host_side_names`] found in the node's `links`.
fn host_side_links<'a>(
    links: &'a [Link],
    interfaces: &'a [PrevInterface],
) -> impl Iterator<Item = &'a Link> {
    host_side_names(interfaces).filter_map(|name| links.iter().find(|l| l.name == name))
}

/// The node-side interfaces of the container's network, as the interface
/// plugin reported them in prevResult (entries without a sandbox: the
/// bridge and the host end of the veth), found in the node's `links`: the
/// hairpin path starts there. These are the container-facing interfaces;
/// their settings record it, so later runs keep treating them so.
pub fn container_side_interfaces(links: &[Link], interfaces: &[PrevInterface]) -> BTreeSet<u32> {
    host_side_links(links, interfaces)
        // A bridge's ports are left out: they carry the ingress program
        // only, under pins of their own ([`bridge_ports`]); everything
        // else between the containers and the node crosses the bridge
        // device's own hooks.
        .filter(|l| !l.has_controller)
        .map(|l| l.index)
        .collect()
}

/// The request's bridge ports (the host end of the pod's veth), each with
/// its bridge, one of `container_side`: the ingress program goes there too.
///
/// A frame entering a bridge from a port meets the bridge's netfilter
/// hooks (`br_netfilter`, on when `bridge-nf-call-iptables` is 1, as on
/// every Kubernetes node) before the bridge device's own tc hook: without
/// a program on the port, conntrack records a pod's hairpin SYN to
/// nodeIP:hostPort untranslated, then takes the answer, translated by
/// then, for a new flow (a SYN-ACK: INVALID), which kube-proxy's
/// `--ctstate INVALID -j DROP` at FORWARD drops: every hairpin TCP
/// connection failed. On the port the program translates first, so
/// conntrack sees the flow as the containers do. Only ingress: the
/// bridge's egress hook runs before the bridge's hooks on the way out.
pub fn bridge_ports(
    links: &[Link],
    interfaces: &[PrevInterface],
    container_side: &BTreeSet<u32>,
) -> BTreeMap<u32, u32> {
    host_side_links(links, interfaces)
        .filter(|l| container_side.contains(&l.controller))
        .map(|l| (l.index, l.controller))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(index: u32, name: &str, has_controller: bool) -> Link {
        Link {
            index,
            name: name.into(),
            up: true,
            loopback: name == "lo",
            has_controller,
            controller: if has_controller { 4 } else { 0 },
        }
    }

    fn address(index: u32, ip: &str) -> NodeAddress {
        NodeAddress {
            index,
            local: None,
            address: Some(ip.parse().unwrap()),
        }
    }

    #[test]
    fn the_node_state_records_no_link_local_address_of_a_pods_veth() {
        let node = NodeView {
            links: vec![link(1, "lo", false), link(2, "eth0", false)],
            addresses: vec![
                address(1, "127.0.0.1"),
                address(1, "::1"),
                address(2, "198.18.0.1"),
                address(2, "fe80::2"),
                address(4, "10.244.0.1"),
                address(4, "fe80::4"),
                // A pod's veth, a port of the bridge (index 4).
                address(9, "fe80::9"),
                address(9, "169.254.0.9"),
                // A routable address on an interface no run attaches to.
                address(10, "fd00::10"),
            ],
            uplinks: BTreeSet::from([2]),
            container_side: BTreeSet::from([4]),
            ports: BTreeMap::new(),
        };
        let recorded: Vec<String> = recorded_addresses(&node, &[])
            .iter()
            .filter_map(|a| a.own().map(|ip| ip.to_string()))
            .collect();
        assert_eq!(
            recorded,
            [
                "127.0.0.1",
                "::1",
                "198.18.0.1",
                "fe80::2",
                "10.244.0.1",
                "fe80::4",
                "fd00::10"
            ]
        );
    }

    #[test]
    fn the_addresses_of_a_service_vip_device_are_no_hostports() {
        let node = NodeView {
            links: vec![
                link(1, "lo", false),
                link(2, "eth0", false),
                link(3, "kube-ipvs0", false),
                link(5, "vip-extra", false),
            ],
            addresses: vec![
                address(2, "198.18.0.1"),
                // Keepalived-style: a VIP on an uplink stays the node's.
                address(2, "198.18.0.100"),
                address(3, "10.96.0.1"),
                address(3, "fd96::1"),
                address(5, "10.97.0.1"),
            ],
            uplinks: BTreeSet::from([2]),
            container_side: BTreeSet::new(),
            ports: BTreeMap::new(),
        };
        let recorded = |devices: &[&str]| -> Vec<String> {
            let devices: Vec<String> = devices.iter().map(|d| (*d).to_owned()).collect();
            recorded_addresses(&node, &devices)
                .iter()
                .filter_map(|a| a.own().map(|ip| ip.to_string()))
                .collect()
        };
        assert_eq!(
            recorded(&["kube-ipvs0"]),
            ["198.18.0.1", "198.18.0.100", "10.97.0.1"]
        );
        assert_eq!(
            recorded(&["kube-ipvs0", "vip-*"]),
            ["198.18.0.1", "198.18.0.100"]
        );
        assert_eq!(
            recorded(&[]),
            [
                "198.18.0.1",
                "198.18.0.100",
                "10.96.0.1",
                "fd96::1",
                "10.97.0.1"
            ]
        );
    }
}
