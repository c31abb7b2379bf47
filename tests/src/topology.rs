//! The standard test world and the conflists that run in it.
//!
//! ```text
//!   ext (client)                 node                          far
//!   eth0 198.18.0.2/24  <-veth-> eth0 198.18.0.1/24            eth0 198.19.0.2/24
//!        fd18::2/64                   198.18.0.11/24 (2nd)          fd19::2/64
//!   default via node                  fd18::1/64, fd18::11/64  default via node
//!                                eth1 198.19.0.1/24  <-veth->
//!                                     fd19::1/64
//!                                cni0 (made by the bridge plugin) 10.244.0.1/24, fd44::1/64
//!                                default via 198.18.0.2 / fd18::2 (eth0 is the uplink)
//! ```
//!
//! The node forwards (IPv4 and IPv6); duplicate address detection is off in
//! every namespace so addresses work at once. Containers are bare namespaces:
//! the interface plugins (bridge, ptp) create their veths.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::Path;

use serde_json::{Value, json};

use crate::cni::{Conflist, RuntimeAttachment};
use crate::netns::NetNs;
use crate::tmp::TempDir;

/// The node's address on its uplink (`eth0`).
pub const NODE_IP4: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
/// A second address on the node's uplink (for hostIP-specific mappings).
pub const NODE_IP4_SECONDARY: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 11);
pub const NODE_IP6: Ipv6Addr = Ipv6Addr::new(0xfd18, 0, 0, 0, 0, 0, 0, 1);
pub const NODE_IP6_SECONDARY: Ipv6Addr = Ipv6Addr::new(0xfd18, 0, 0, 0, 0, 0, 0, 0x11);
/// The external client.
pub const EXT_IP4: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
pub const EXT_IP6: Ipv6Addr = Ipv6Addr::new(0xfd18, 0, 0, 0, 0, 0, 0, 2);
/// The node's address towards `far` (`eth1`).
pub const NODE_FAR_IP4: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 1);
pub const NODE_FAR_IP6: Ipv6Addr = Ipv6Addr::new(0xfd19, 0, 0, 0, 0, 0, 0, 1);
/// The host behind the node (transit traffic: ext → far through the node).
pub const FAR_IP4: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 2);
pub const FAR_IP6: Ipv6Addr = Ipv6Addr::new(0xfd19, 0, 0, 0, 0, 0, 0, 2);

/// Node interface towards `ext`, carrying the node's default routes.
pub const NODE_UPLINK: &str = "eth0";
/// Node interface towards `far`.
pub const NODE_FAR_LINK: &str = "eth1";
/// Interface name inside containers.
pub const CONTAINER_IFNAME: &str = "eth0";
/// The bridge [`bridge_conflist`] asks for.
pub const BRIDGE_NAME: &str = "cni0";
/// Pod ranges handed out by host-local.
pub const POD_SUBNET4: &str = "10.244.0.0/24";
pub const POD_SUBNET6: &str = "fd44::/64";
/// The pod gateway (on `cni0` for bridge).
pub const POD_GATEWAY4: Ipv4Addr = Ipv4Addr::new(10, 244, 0, 1);
pub const POD_GATEWAY6: Ipv6Addr = Ipv6Addr::new(0xfd44, 0, 0, 0, 0, 0, 0, 1);

/// The node, its client `ext`, the host `far`, and a scratch directory for
/// plugin state (host-local's `dataDir`). Everything is removed on drop.
#[derive(Debug)]
pub struct Node {
    /// The node's network namespace (where plugins run, the "host").
    pub ns: NetNs,
    /// The external client.
    pub ext: NetNs,
    /// A host routed through the node.
    pub far: NetNs,
    data_dir: TempDir,
}

impl Node {
    /// Builds the world described in the module docs.
    ///
    /// # Panics
    /// If any step fails; whatever was already created is removed.
    pub fn new() -> Node {
        let ns = NetNs::new("node");
        let ext = NetNs::new("ext");
        let far = NetNs::new("far");
        let data_dir = TempDir::new("data");

        for each in [&ns, &ext, &far] {
            disable_dad(each);
        }
        ns.sysctl("net.ipv4.ip_forward", "1");
        ns.sysctl("net.ipv6.conf.all.forwarding", "1");

        ns.add_veth_to(NODE_UPLINK, "eth0", &ext);
        ns.add_veth_to(NODE_FAR_LINK, "eth0", &far);

        add_addr(&ns, NODE_UPLINK, &format!("{NODE_IP4}/24"));
        add_addr(&ns, NODE_UPLINK, &format!("{NODE_IP4_SECONDARY}/24"));
        add_addr(&ns, NODE_UPLINK, &format!("{NODE_IP6}/64"));
        add_addr(&ns, NODE_UPLINK, &format!("{NODE_IP6_SECONDARY}/64"));
        add_addr(&ns, NODE_FAR_LINK, &format!("{NODE_FAR_IP4}/24"));
        add_addr(&ns, NODE_FAR_LINK, &format!("{NODE_FAR_IP6}/64"));
        add_addr(&ext, "eth0", &format!("{EXT_IP4}/24"));
        add_addr(&ext, "eth0", &format!("{EXT_IP6}/64"));
        add_addr(&far, "eth0", &format!("{FAR_IP4}/24"));
        add_addr(&far, "eth0", &format!("{FAR_IP6}/64"));
        ns.ip(&["link", "set", NODE_UPLINK, "up"]);
        ns.ip(&["link", "set", NODE_FAR_LINK, "up"]);
        ext.ip(&["link", "set", "eth0", "up"]);
        far.ip(&["link", "set", "eth0", "up"]);

        ns.ip(&[
            "route",
            "add",
            "default",
            "via",
            &EXT_IP4.to_string(),
            "dev",
            NODE_UPLINK,
        ]);
        ns.ip(&[
            "-6",
            "route",
            "add",
            "default",
            "via",
            &EXT_IP6.to_string(),
            "dev",
            NODE_UPLINK,
        ]);
        ext.ip(&["route", "add", "default", "via", &NODE_IP4.to_string()]);
        ext.ip(&[
            "-6",
            "route",
            "add",
            "default",
            "via",
            &NODE_IP6.to_string(),
        ]);
        far.ip(&["route", "add", "default", "via", &NODE_FAR_IP4.to_string()]);
        far.ip(&[
            "-6",
            "route",
            "add",
            "default",
            "via",
            &NODE_FAR_IP6.to_string(),
        ]);

        Node {
            ns,
            ext,
            far,
            data_dir,
        }
    }

    /// Removes the node's default routes (IPv4 and IPv6), leaving only its
    /// connected routes: a lab or air-gapped node, or one whose routes live
    /// in another table. `ext` and `far` still reach it on their subnets.
    pub fn remove_default_routes(&self) {
        self.ns.ip(&["route", "del", "default"]);
        self.ns.ip(&["-6", "route", "del", "default"]);
    }

    /// Deletes the uplink `eth0` and makes it again under the same name
    /// (a NIC reset, a bond rebuilt, a VLAN re-created): same addresses and
    /// routes, a new interface index. Returns the old and the new index.
    pub fn recreate_uplink(&self) -> (u32, u32) {
        let before = self.ifindex(NODE_UPLINK);
        // The peer in `ext` goes with it.
        self.ns.ip(&["link", "del", NODE_UPLINK]);
        self.ns.add_veth_to(NODE_UPLINK, "eth0", &self.ext);
        for cidr in [
            format!("{NODE_IP4}/24"),
            format!("{NODE_IP4_SECONDARY}/24"),
            format!("{NODE_IP6}/64"),
            format!("{NODE_IP6_SECONDARY}/64"),
        ] {
            add_addr(&self.ns, NODE_UPLINK, &cidr);
        }
        add_addr(&self.ext, "eth0", &format!("{EXT_IP4}/24"));
        add_addr(&self.ext, "eth0", &format!("{EXT_IP6}/64"));
        self.ns.ip(&["link", "set", NODE_UPLINK, "up"]);
        self.ext.ip(&["link", "set", "eth0", "up"]);
        let v4 = EXT_IP4.to_string();
        let v6 = EXT_IP6.to_string();
        self.ns
            .ip(&["route", "add", "default", "via", &v4, "dev", NODE_UPLINK]);
        self.ns.ip(&[
            "-6",
            "route",
            "add",
            "default",
            "via",
            &v6,
            "dev",
            NODE_UPLINK,
        ]);
        let node4 = NODE_IP4.to_string();
        let node6 = NODE_IP6.to_string();
        self.ext.ip(&["route", "add", "default", "via", &node4]);
        self.ext
            .ip(&["-6", "route", "add", "default", "via", &node6]);
        (before, self.ifindex(NODE_UPLINK))
    }

    /// A new client namespace behind a new node interface `ifname` (a veth,
    /// added after the node was built: a second NIC plugged in later),
    /// `node_cidr` on the node's side and `peer_cidr` on the client's, no
    /// route beyond the shared subnet. Removed on drop.
    pub fn add_side_link(&self, ifname: &str, node_cidr: &str, peer_cidr: &str) -> NetNs {
        let side = NetNs::new("side");
        disable_dad(&side);
        self.ns.add_veth_to(ifname, "eth0", &side);
        add_addr(&self.ns, ifname, node_cidr);
        add_addr(&side, "eth0", peer_cidr);
        self.ns.ip(&["link", "set", ifname, "up"]);
        side.ip(&["link", "set", "eth0", "up"]);
        side
    }

    /// A VXLAN tunnel `vxlan{id}` between the node and `far` over `eth1`,
    /// with `node_cidr` and `far_cidr` inside: a tunnel interface without a
    /// default route (VXLAN rather than a VLAN: it needs no kernel module
    /// beyond what every test kernel has). Returns the node side's name.
    pub fn add_far_tunnel(&self, id: u32, node_cidr: &str, far_cidr: &str) -> String {
        let name = format!("vxlan{id}");
        let id = id.to_string();
        for (ns, local, remote, dev) in [
            (&self.ns, NODE_FAR_IP4, FAR_IP4, NODE_FAR_LINK),
            (&self.far, FAR_IP4, NODE_FAR_IP4, "eth0"),
        ] {
            ns.ip(&[
                "link",
                "add",
                &name,
                "type",
                "vxlan",
                "id",
                &id,
                "local",
                &local.to_string(),
                "remote",
                &remote.to_string(),
                "dstport",
                "4789",
                "dev",
                dev,
            ]);
        }
        add_addr(&self.ns, &name, node_cidr);
        add_addr(&self.far, &name, far_cidr);
        self.ns.ip(&["link", "set", &name, "up"]);
        self.far.ip(&["link", "set", &name, "up"]);
        name
    }

    /// Adds `cidr` to the node's interface `dev` (a VIP arriving, an
    /// address assigned after the containers started).
    pub fn add_address(&self, dev: &str, cidr: &str) {
        add_addr(&self.ns, dev, cidr);
    }

    /// Index of the node's interface `name`.
    pub fn ifindex(&self, name: &str) -> u32 {
        // Not /sys/class/net: sysfs shows the namespace that mounted it.
        let shown: Value = serde_json::from_str(&self.ns.ip(&["-j", "link", "show", name]))
            .unwrap_or_else(|e| panic!("ip -j link show {name}: {e}"));
        shown[0]["ifindex"]
            .as_u64()
            .and_then(|index| u32::try_from(index).ok())
            .unwrap_or_else(|| panic!("no ifindex for {name}: {shown}"))
    }

    /// A per-world directory for plugin state (host-local's `dataDir`), so
    /// nothing lands in /var/lib/cni.
    pub fn data_dir(&self) -> &Path {
        self.data_dir.path()
    }

    /// The firewall rule kube-proxy puts on every Kubernetes node: packets
    /// conntrack finds INVALID are dropped at FORWARD, both families. It
    /// also makes this node's namespace track connections.
    pub fn drop_invalid_at_forward(&self) {
        for tool in ["iptables", "ip6tables"] {
            self.ns.exec(
                tool,
                &[
                    "-A",
                    "FORWARD",
                    "-m",
                    "conntrack",
                    "--ctstate",
                    "INVALID",
                    "-j",
                    "DROP",
                ],
            );
        }
    }

    /// kube-proxy's `KUBE-SERVICES` chain in iptables' nat table (empty:
    /// no Service), jumped to from `PREROUTING` and `OUTPUT`, both
    /// families: netfilter's NAT is hooked in the node's namespace from then
    /// on. With a rule that uses conntrack (kube-proxy's, see
    /// [`Node::drop_invalid_at_forward`]) netfilter applies a conntrack
    /// entry's NAT, as on every node that runs kube-proxy, firewalld,
    /// podman or Docker.
    pub fn hook_nat(&self) {
        for tool in ["iptables", "ip6tables"] {
            self.ns.exec(tool, &["-t", "nat", "-N", "KUBE-SERVICES"]);
            for chain in ["PREROUTING", "OUTPUT"] {
                self.ns
                    .exec(tool, &["-t", "nat", "-A", chain, "-j", "KUBE-SERVICES"]);
            }
        }
    }

    /// A new, empty container namespace (loopback up, DAD off). The interface
    /// plugin creates its `eth0` on ADD.
    pub fn add_container(&self, id: &str) -> Container {
        let ns = NetNs::new(&format!("c-{id}"));
        disable_dad(&ns);
        Container {
            id: id.to_owned(),
            ns,
            ifname: CONTAINER_IFNAME.to_owned(),
        }
    }

    /// The node's uplink addresses: primary IPv4 and IPv6.
    pub fn host_ips(&self) -> [IpAddr; 2] {
        [IpAddr::V4(NODE_IP4), IpAddr::V6(NODE_IP6)]
    }

    /// Best-effort state dump of the node for failure messages: links,
    /// addresses, routes, sockets, iptables/ip6tables rules, conntrack.
    pub fn diagnostics(&self) -> String {
        let mut report = self.ns.diagnostics();
        report.push_str(&self.ns.handle().diagnostics(&[
            &["iptables-save"],
            &["ip6tables-save"],
            &["conntrack", "-L"],
            &["conntrack", "-L", "-f", "ipv6"],
        ]));
        report
    }
}

impl Default for Node {
    fn default() -> Self {
        Node::new()
    }
}

fn disable_dad(ns: &NetNs) {
    ns.sysctl("net.ipv6.conf.all.accept_dad", "0");
    ns.sysctl("net.ipv6.conf.default.accept_dad", "0");
}

fn add_addr(ns: &NetNs, dev: &str, cidr: &str) {
    if cidr.contains(':') {
        ns.ip(&["-6", "addr", "add", cidr, "dev", dev, "nodad"]);
    } else {
        ns.ip(&["addr", "add", cidr, "dev", dev]);
    }
}

/// A container: its namespace and the interface name plugins will create.
/// The namespace is deleted on drop.
#[derive(Debug)]
pub struct Container {
    pub id: String,
    pub ns: NetNs,
    pub ifname: String,
}

impl Container {
    /// The runtime's view of this container for the CNI runner.
    pub fn attachment(&self, capability_args: Value) -> RuntimeAttachment {
        RuntimeAttachment {
            container_id: self.id.clone(),
            netns_path: self.ns.path().to_path_buf(),
            ifname: self.ifname.clone(),
            capability_args,
            cni_args: Vec::new(),
        }
    }

    /// [`Container::attachment`] with `{"portMappings": [...]}`.
    pub fn with_port_mappings(&self, mappings: &[PortMapping]) -> RuntimeAttachment {
        self.attachment(port_mappings_args(mappings))
    }
}

/// One entry of the `portMappings` capability (the shape Kubernetes sends).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortMapping {
    pub host_port: u16,
    pub container_port: u16,
    /// `"tcp"`, `"udp"` or `"sctp"`.
    pub protocol: String,
    pub host_ip: Option<IpAddr>,
}

impl PortMapping {
    pub fn tcp(host_port: u16, container_port: u16) -> PortMapping {
        PortMapping {
            host_port,
            container_port,
            protocol: "tcp".to_owned(),
            host_ip: None,
        }
    }

    pub fn udp(host_port: u16, container_port: u16) -> PortMapping {
        PortMapping {
            host_port,
            container_port,
            protocol: "udp".to_owned(),
            host_ip: None,
        }
    }

    pub fn sctp(host_port: u16, container_port: u16) -> PortMapping {
        PortMapping {
            host_port,
            container_port,
            protocol: "sctp".to_owned(),
            host_ip: None,
        }
    }

    /// Restricts the mapping to one node address (`hostIP`).
    pub fn on(mut self, host_ip: IpAddr) -> PortMapping {
        self.host_ip = Some(host_ip);
        self
    }

    pub fn to_json(&self) -> Value {
        let mut mapping = json!({
            "hostPort": self.host_port,
            "containerPort": self.container_port,
            "protocol": self.protocol,
        });
        if let Some(ip) = self.host_ip {
            mapping["hostIP"] = Value::from(ip.to_string());
        }
        mapping
    }
}

/// `{"portMappings": [...]}` capability args.
pub fn port_mappings_args(mappings: &[PortMapping]) -> Value {
    json!({ "portMappings": mappings.iter().map(PortMapping::to_json).collect::<Vec<_>>() })
}

fn host_local_ipam(data_dir: &Path) -> Value {
    json!({
        "type": "host-local",
        "dataDir": data_dir,
        "ranges": [[{ "subnet": POD_SUBNET4 }], [{ "subnet": POD_SUBNET6 }]],
        "routes": [{ "dst": "0.0.0.0/0" }, { "dst": "::/0" }],
    })
}

/// The port-mapping entry: `{"type": t, "capabilities": {"portMappings": true}}`
/// plus `pinRoot` for our plugin (nothing extra for the upstream `portmap`).
fn port_plugin(port_plugin_type: &str, pin_root: Option<&Path>) -> Value {
    let mut plugin = json!({ "type": port_plugin_type, "capabilities": { "portMappings": true } });
    if let Some(pin_root) = pin_root
        && port_plugin_type != "portmap"
    {
        plugin["pinRoot"] = Value::from(pin_root.to_string_lossy().into_owned());
        // The socket hooks go to the test's own child cgroup, never the
        // root of the hierarchy (which would see every process).
        let cgroup = crate::cgroup::cgroup_for_pin_root(pin_root);
        plugin["cgroupPath"] = Value::from(cgroup.to_string_lossy().into_owned());
        if fast_path_everywhere() {
            plugin["fastPath"] = Value::Bool(true);
        }
    }
    plugin
}

/// `EPM_TEST_FAST_PATH=1`: every conflist of ours turns `fastPath` on, so
/// the whole suite can be run again over the fast path (`cargo xtask test`
/// does, for the suites that carry traffic).
pub fn fast_path_everywhere() -> bool {
    std::env::var("EPM_TEST_FAST_PATH").is_ok_and(|v| v == "1")
}

/// File name of ebpf-portmap's log (`logFile`) in a world's data directory:
/// tests never write to the default `/var/log/ebpf-portmap.log`.
pub const PLUGIN_LOG: &str = "ebpf-portmap.log";

/// Our plugin logs into `data_dir` (the upstream plugin has no such key).
fn log_in(mut plugin: Value, data_dir: &Path) -> Value {
    if plugin["type"] != "portmap" {
        plugin["logFile"] = Value::from(data_dir.join(PLUGIN_LOG).to_string_lossy().into_owned());
    }
    plugin
}

/// bridge (`cni0`, isGateway, no masquerade, hairpin) + host-local
/// (10.244.0.0/24 and fd44::/64, state in `data_dir`) + the port-mapping
/// plugin `port_plugin_type`, at cniVersion 1.0.0 (the newest version the
/// Debian reference plugins speak).
pub fn bridge_conflist(
    name: &str,
    port_plugin_type: &str,
    pin_root: Option<&Path>,
    data_dir: &Path,
) -> Conflist {
    Conflist::from_json(json!({
        "cniVersion": "1.0.0",
        "name": name,
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE_NAME,
                "isGateway": true,
                "ipMasq": false,
                "hairpinMode": true,
                "ipam": host_local_ipam(data_dir),
            },
            log_in(port_plugin(port_plugin_type, pin_root), data_dir),
        ]
    }))
    .expect("a well-formed conflist")
}

/// ptp (a veth per container, host side routed, no masquerade) + host-local
/// (same ranges as [`bridge_conflist`]) + the port-mapping plugin.
pub fn ptp_conflist(
    name: &str,
    port_plugin_type: &str,
    pin_root: Option<&Path>,
    data_dir: &Path,
) -> Conflist {
    Conflist::from_json(json!({
        "cniVersion": "1.0.0",
        "name": name,
        "plugins": [
            { "type": "ptp", "ipMasq": false, "ipam": host_local_ipam(data_dir) },
            log_in(port_plugin(port_plugin_type, pin_root), data_dir),
        ]
    }))
    .expect("a well-formed conflist")
}

/// The IPs host-local has handed out for `network` (files named after an IP
/// in `<data_dir>/<network>/`): evidence that host-local really ran.
pub fn host_local_allocations(data_dir: &Path, network: &str) -> Vec<IpAddr> {
    let Ok(entries) = std::fs::read_dir(data_dir.join(network)) else {
        return Vec::new();
    };
    let mut ips: Vec<IpAddr> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    ips.sort();
    ips
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bridge_conflist_shape() {
        let list = bridge_conflist(
            "net",
            "ebpf-portmap",
            Some(Path::new("/sys/fs/bpf/x")),
            Path::new("/tmp/d"),
        );
        assert_eq!(list.plugin_types(), ["bridge", "ebpf-portmap"]);
        let bridge = &list.plugins()[0];
        assert_eq!(bridge["bridge"], "cni0");
        assert_eq!(bridge["isGateway"], true);
        assert_eq!(bridge["ipMasq"], false);
        assert_eq!(bridge["hairpinMode"], true);
        assert_eq!(bridge["ipam"]["dataDir"], "/tmp/d");
        assert_eq!(bridge["ipam"]["ranges"][1][0]["subnet"], "fd44::/64");
        let port = &list.plugins()[1];
        assert_eq!(port["capabilities"]["portMappings"], true);
        assert_eq!(port["pinRoot"], "/sys/fs/bpf/x");
        assert_eq!(port["logFile"], "/tmp/d/ebpf-portmap.log");
    }

    #[test]
    fn upstream_portmap_gets_nothing_extra() {
        let list = ptp_conflist(
            "net",
            "portmap",
            Some(Path::new("/sys/fs/bpf/x")),
            Path::new("/tmp/d"),
        );
        assert_eq!(list.plugin_types(), ["ptp", "portmap"]);
        assert_eq!(
            list.plugins()[1],
            json!({ "type": "portmap", "capabilities": { "portMappings": true } })
        );
    }

    #[test]
    fn port_mapping_json() {
        let args = port_mappings_args(&[
            PortMapping::tcp(8080, 80),
            PortMapping::udp(5353, 53).on(IpAddr::V4(NODE_IP4_SECONDARY)),
        ]);
        assert_eq!(
            args,
            json!({ "portMappings": [
                { "hostPort": 8080, "containerPort": 80, "protocol": "tcp" },
                { "hostPort": 5353, "containerPort": 53, "protocol": "udp", "hostIP": "198.18.0.11" },
            ]})
        );
    }
}

/// An IP family of the node's world, with the addresses a test reaches
/// it by: the node's and the external client's on their link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub const BOTH: [Family; 2] = [Family::V4, Family::V6];

    /// `v4` or `v6`.
    pub fn key(self) -> &'static str {
        match self {
            Family::V4 => "v4",
            Family::V6 => "v6",
        }
    }

    pub fn is_v4(self) -> bool {
        self == Family::V4
    }

    /// The node's address on the client's link.
    pub fn node(self) -> IpAddr {
        match self {
            Family::V4 => NODE_IP4.into(),
            Family::V6 => NODE_IP6.into(),
        }
    }

    /// The external client's address.
    pub fn client(self) -> IpAddr {
        match self {
            Family::V4 => EXT_IP4.into(),
            Family::V6 => EXT_IP6.into(),
        }
    }

    /// The unspecified address (a socket bound to every address).
    pub fn any(self) -> IpAddr {
        match self {
            Family::V4 => Ipv4Addr::UNSPECIFIED.into(),
            Family::V6 => Ipv6Addr::UNSPECIFIED.into(),
        }
    }

    /// The iptables command of the family.
    pub fn tables(self) -> &'static str {
        match self {
            Family::V4 => "iptables",
            Family::V6 => "ip6tables",
        }
    }
}
