//! The CNI verbs on the real dataplane: what `cni::run` calls.

use std::collections::BTreeSet;

use crate::model::{HostIp, Owner, PodIdentity, PrevInterface};
use crate::{
    cni::netconf::{ListenerPolicy, NetConf},
    cni::{CniError, GcRequest, Plugin, Request},
    dataplane::attach::{self, AttachError, Capacities, Targets},
    dataplane::cgroup,
    dataplane::counters,
    dataplane::maps::{Maps, MapsError},
    dataplane::node_state,
    dataplane::ownership::{self, StoreError, Translation},
    dataplane::peers,
    dataplane::pin::PinLayout,
    dataplane::scope,
    node::listeners,
    node::netlink::{self, Link, NetlinkError, NodeAddress, Rtnl},
    node::privilege,
};

/// Plugin-specific CNI error codes (the spec leaves 100 and up to plugins).
pub mod code {
    /// I/O failure (spec code).
    pub const IO: u32 = 5;
    /// A concurrent DEL or GC removed the owner while ADD ran (spec code).
    pub const TRY_AGAIN_LATER: u32 = 11;
    /// Invalid network configuration (spec code).
    pub const INVALID_CONFIG: u32 = 7;
    /// The plugin cannot serve ADD requests (spec code, STATUS).
    pub const NOT_AVAILABLE: u32 = 50;
    /// Another owner holds the requested host port.
    pub const PORT_CONFLICT: u32 = 100;
    /// A map is full.
    pub const CAPACITY: u32 = 101;
    /// The eBPF programs could not be loaded or attached.
    pub const DATAPLANE: u32 = 102;
    /// CHECK found an entry missing or different.
    pub const CHECK_FAILED: u32 = 103;
    /// The plugin lacks the capabilities it needs.
    pub const PRIVILEGE: u32 = 104;
    /// A node process already listens on the requested host port.
    pub const HOST_PORT_IN_USE: u32 = 105;
}

#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Attach(#[from] AttachError),
    #[error(transparent)]
    Maps(#[from] MapsError),
    #[error("cannot read the node's interfaces and routes")]
    Netlink(#[from] NetlinkError),
    #[error(
        "no interface of this node matches `interfaces` ({}); list interfaces it has, or patterns such as \"eth*\", or remove the key to attach to every up interface",
        patterns.join(", ")
    )]
    NoMatchingInterfaces { patterns: Vec<String> },
    #[error("the eBPF programs are not attached to interface index {index}")]
    NotAttached { index: u32 },
    #[error("ebpf-portmap needs {} to load and attach its programs; run it as root", missing.join(" and "))]
    Privilege { missing: Vec<&'static str> },
    #[error(
        "host port {port}/{protocol} is in use on the node by {holders} (socket bound to {addr}); mapping it would take the port from that service. Free the port, pick another hostPort, or set \"hostPortListeners\": \"allow\""
    )]
    HostPortInUse {
        port: u16,
        protocol: &'static str,
        addr: std::net::IpAddr,
        holders: String,
    },
    #[error("cannot read the node's sockets")]
    Sockets(#[source] std::io::Error),
    #[error(transparent)]
    Local(#[from] node_state::LocalError),
    #[error(transparent)]
    Scope(#[from] scope::ScopeError),
}

impl PluginError {
    fn code(&self) -> u32 {
        match self {
            PluginError::Store(StoreError::Conflict { .. } | StoreError::Overlap { .. }) => {
                code::PORT_CONFLICT
            }
            PluginError::Store(StoreError::Removed { .. }) => code::TRY_AGAIN_LATER,
            PluginError::Store(StoreError::Capacity { .. } | StoreError::TooManySlots { .. }) => {
                code::CAPACITY
            }
            PluginError::Store(StoreError::Missing { .. }) | PluginError::NotAttached { .. } => {
                code::CHECK_FAILED
            }
            PluginError::Store(_) | PluginError::Maps(_) | PluginError::Netlink(_) => code::IO,
            PluginError::Attach(_) => code::DATAPLANE,
            PluginError::NoMatchingInterfaces { .. } => code::INVALID_CONFIG,
            PluginError::Privilege { .. } => code::PRIVILEGE,
            PluginError::HostPortInUse { .. } => code::HOST_PORT_IN_USE,
            PluginError::Sockets(_) | PluginError::Local(_) => code::IO,
            PluginError::Scope(scope::ScopeError::InUse { .. }) => code::INVALID_CONFIG,
            PluginError::Scope(_) => code::IO,
        }
    }
}

impl From<PluginError> for CniError {
    fn from(error: PluginError) -> Self {
        CniError::from_error(error.code(), &error)
    }
}

/// What one run sees of the node: its interfaces and addresses, and which
/// interfaces should carry the programs.
pub struct NodeView {
    pub links: Vec<Link>,
    pub addresses: Vec<NodeAddress>,
    /// Where traffic from outside arrives ([`netlink::select_uplinks`]).
    pub uplinks: BTreeSet<u32>,
    /// This request's container-facing interfaces (prevResult).
    pub container_side: BTreeSet<u32>,
}

impl NodeView {
    /// One link dump and one address dump. `interfaces` entries that match
    /// nothing are skipped with a warning; none matching at all is an error
    /// (the configuration names another node's interfaces).
    pub fn read(
        rtnl: &mut Rtnl,
        conf: &NetConf,
        interfaces: &[PrevInterface],
    ) -> Result<NodeView, PluginError> {
        let links = rtnl.links()?;
        let addresses = rtnl.addresses()?;
        let selection = netlink::select_uplinks(&links, conf.interfaces.as_deref());
        if let Some(patterns) = &conf.interfaces
            && selection.uplinks.is_empty()
        {
            return Err(PluginError::NoMatchingInterfaces {
                patterns: patterns.clone(),
            });
        }
        for entry in &selection.unmatched {
            log::warn!("`interfaces` entry {entry:?} matches no interface of this node; skipped");
        }
        let container_side = container_side_interfaces(&links, interfaces);
        Ok(NodeView {
            links,
            addresses,
            uplinks: selection.uplinks,
            container_side,
        })
    }

    /// Every interface that should carry the programs.
    pub fn targets(&self) -> BTreeSet<u32> {
        self.uplinks.union(&self.container_side).copied().collect()
    }
}

/// Brings the attachments and the node state (addresses, interface
/// settings) in line with the node as `node` saw it: every plugin run does
/// it, so an interface added or re-created and an address added since the
/// last run are taken up by whatever CNI call comes next.
fn reconcile(layout: &PinLayout, conf: &NetConf, node: &NodeView) -> Result<(), PluginError> {
    let capacities = Capacities {
        mappings: conf.max_mappings,
        conntrack: conf.conntrack_size,
    };
    let cgroup = cgroup::target(conf.cgroup_path.as_deref()).map_err(AttachError::from)?;
    let live: BTreeSet<u32> = node.links.iter().map(|l| l.index).collect();
    attach::ensure(
        layout,
        Targets {
            required: &node.container_side,
            uplinks: &node.uplinks,
            live: &live,
        },
        &cgroup,
        capacities,
    )?;
    node_state::sync(
        layout,
        &node_state::NodeState {
            snat: conf.snat,
            masq_all: conf.masq_all,
            fast_path: conf.fast_path,
            addresses: node.addresses.clone(),
            container_side: node.container_side.clone(),
            attached: node.targets(),
            live,
            interfaces: conf.interfaces.clone(),
        },
    )?;
    Ok(())
}

/// The reconciliation of a run that is not an ADD (DEL, GC): its failure
/// is logged, never the verb's, which has done its own work already.
fn reconcile_after(verb: &str, layout: &PinLayout, conf: &NetConf) {
    let outcome = Rtnl::open()
        .map_err(PluginError::from)
        // The interfaces of the container going away need nothing.
        .and_then(|mut rtnl| NodeView::read(&mut rtnl, conf, &[]))
        .and_then(|node| reconcile(layout, conf, &node));
    if let Err(error) = outcome {
        log::warn!(
            "{verb}: the attachments and node addresses were not brought up to date: {error}"
        );
    }
}

/// Logs the mappings whose hostIP the node does not have (yet): accepted,
/// since such addresses appear later (a VIP moving to this node), but they
/// see no traffic until then.
fn warn_absent_host_ips(conf: &NetConf, addresses: &[NodeAddress]) {
    for mapping in &conf.port_mappings {
        if let HostIp::Addr(addr) = mapping.host_ip
            && netlink::interface_with_address(addresses, addr).is_none()
        {
            log::warn!(
                "hostIP {addr} of host port {} is not an address of this node (yet): the mapping sees no traffic until the address exists here",
                mapping.host_port
            );
        }
    }
}

fn require_privilege() -> Result<(), PluginError> {
    let missing = privilege::missing();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(PluginError::Privilege { missing })
    }
}

/// Refuses (or, by policy, warns about) host ports that a node process
/// already listens on. Ports the owner holds already are its own business.
fn check_node_listeners(
    maps: &Maps,
    owner: &Owner,
    translations: &[Translation],
    policy: ListenerPolicy,
) -> Result<(), PluginError> {
    let own = ownership::owner_id(owner);
    let mut seen = BTreeSet::new();
    // Each socket table is read once per ADD, whatever the number of mappings.
    let mut tables: std::collections::BTreeMap<u8, Vec<listeners::Listener>> = Default::default();
    for translation in translations {
        let key = translation.key;
        if maps.mappings.get(&key, 0).is_ok_and(|v| v.owner_id == own) {
            continue;
        }
        let port = u16::from_be(key.host_port_be);
        if !seen.insert((key.proto, port, key.family, key.host_addr_be)) {
            continue;
        }
        let host = (key.host_addr_be != [0; 4])
            .then(|| ownership::addr_from_words(key.family, &key.host_addr_be));
        let v6 = key.family == portmap_common::FAMILY_V6;
        let table = match tables.entry(key.proto) {
            std::collections::btree_map::Entry::Occupied(table) => table.into_mut(),
            std::collections::btree_map::Entry::Vacant(slot) => {
                slot.insert(listeners::all(key.proto).map_err(PluginError::Sockets)?)
            }
        };
        for listener in table.iter() {
            if listener.port != port || !listeners::overlaps(&listener.addr, host, v6) {
                continue;
            }
            let holders = listeners::socket_holders(listener.inode);
            if !holders.is_empty()
                && holders
                    .iter()
                    .all(|h| listeners::RESERVATION_HOLDERS.contains(&h.as_str()))
            {
                continue;
            }
            let holders = if holders.is_empty() {
                "a socket of no visible process".to_owned()
            } else {
                holders.join(", ")
            };
            let error = PluginError::HostPortInUse {
                port,
                protocol: ownership::protocol_name(key.proto),
                addr: listener.addr,
                holders,
            };
            match policy {
                ListenerPolicy::Refuse => return Err(error),
                ListenerPolicy::Allow => log::warn!("{error}"),
            }
        }
    }
    Ok(())
}

/// The node-side interfaces of the container's network, as the interface
/// plugin reported them in prevResult (entries without a sandbox: the
/// bridge and the host end of the veth), found in the node's `links`: the
/// hairpin path starts there. These are the container-facing interfaces;
/// their settings record it, so later runs keep treating them so.
pub fn container_side_interfaces(links: &[Link], interfaces: &[PrevInterface]) -> BTreeSet<u32> {
    interfaces
        .iter()
        .filter(|i| !i.in_sandbox())
        .filter_map(|i| i.name.as_deref())
        .filter_map(|name| links.iter().find(|l| l.name == name))
        // A bridge's ports are left out: everything between the containers
        // and the node crosses the bridge device's own hooks, and running
        // the programs twice per packet only costs.
        .filter(|l| !l.has_controller)
        .map(|l| l.index)
        .collect()
}

/// How log lines name a container: its ID, and its pod when one is known
/// ("3a1b2c3d4e5f (pod default/web-7f9c)").
pub fn who(owner: &Owner, identity: &PodIdentity) -> String {
    if identity.is_empty() {
        owner.container_id.clone()
    } else {
        format!("{} ({identity})", owner.container_id)
    }
}

/// The state of this network namespace under `root` for DEL and GC, or
/// `None` when another namespace owns an explicit `root`: nothing of ours
/// can be there (our ADD was refused), and a DEL after a refused ADD must
/// succeed, or the runtime retries it for ever.
fn own_state(root: &std::path::Path) -> Result<Option<PinLayout>, PluginError> {
    match scope::resolve(root, scope::Access::Read) {
        Ok(layout) => Ok(Some(layout)),
        Err(error @ scope::ScopeError::InUse { .. }) => {
            log::info!("nothing of this node to remove: {error}");
            Ok(None)
        }
        Err(error) => Err(error.into()),
    }
}

/// The plugin as the binary runs it.
#[derive(Debug, Default)]
pub struct Dataplane;

impl Dataplane {
    fn add(&self, req: &Request) -> Result<(), PluginError> {
        let translations = ownership::plan(&req.conf.port_mappings, &req.container);
        let layout = scope::resolve(&req.conf.pin_root, scope::Access::Read)?;
        // A container without mappings still needs the programs on its
        // host-side interface once the node has a dataplane: that is where
        // its hairpin connections to other containers' host ports start.
        if translations.is_empty() && !layout.map(portmap_common::map_names::OWNERS).exists() {
            log::info!("ADD {}: no port mappings", who(&req.owner, &req.identity));
            return Ok(());
        }
        // The root becomes this network namespace's before anything is made.
        let layout = scope::resolve(&req.conf.pin_root, scope::Access::Claim)?;
        require_privilege()?;
        // One rtnetlink socket, one link and one address dump serve every
        // question below.
        let mut rtnl = Rtnl::open()?;
        let node = NodeView::read(&mut rtnl, &req.conf, &req.interfaces)?;
        warn_absent_host_ips(&req.conf, &node.addresses);
        reconcile(&layout, &req.conf, &node)?;
        let mut maps = Maps::open(&layout)?;
        if translations.is_empty() {
            return Ok(());
        }
        check_node_listeners(&maps, &req.owner, &translations, req.conf.listener_policy)?;
        if !req.identity.is_empty() && maps.pods.is_none() {
            maps.pods = Some(crate::dataplane::maps::create_pods(&layout)?);
        }
        maps.prepare_claim(&layout)?;
        maps.claim(&req.owner, &req.identity, &translations)?;
        // Recorded whether or not `fastPath` is on now: it is a node-wide
        // switch, and containers added before it was turned on use it too.
        match peers::handover(&req.interfaces, &req.owner.ifname, |name| {
            node.links
                .iter()
                .find(|l| l.name == name)
                .map(|l| (l.index, l.has_controller))
        }) {
            Some(handover) => peers::record(
                &layout,
                ownership::owner_id(&req.owner),
                &req.container,
                &handover,
            )?,
            None => log::info!(
                "ADD {}: no veth to hand packets to; the fast path does not apply",
                who(&req.owner, &req.identity)
            ),
        }
        log::info!(
            "ADD {}: {} mapping(s) claimed",
            who(&req.owner, &req.identity),
            translations.len()
        );
        Ok(())
    }

    fn del(&self, req: &Request) -> Result<(), PluginError> {
        require_privilege()?;
        let Some(layout) = own_state(&req.conf.pin_root)? else {
            return Ok(());
        };
        let Some(mut maps) = Maps::open_existing(&layout)? else {
            // Nothing was ever added under this root: nothing to delete.
            return Ok(());
        };
        // Read before release empties the index: the counters to drop, and
        // the container addresses whose fast-path entries go too.
        let owned = maps.owned_keys(&req.owner).unwrap_or_default();
        let owner_id = ownership::owner_id(&req.owner);
        // What ADD recorded; CNI_ARGS for owners it has none for (Nomad
        // sends none on DEL, containerd sends the same as on ADD).
        let recorded = maps.pod_of(owner_id);
        let identity = if recorded.is_empty() {
            &req.identity
        } else {
            &recorded
        };
        let container_addrs: BTreeSet<(u8, [u32; 4])> = owned
            .iter()
            .filter_map(|key| Some((key.family, maps.mappings.get(key, 0).ok()?)))
            .filter(|(_, value)| value.owner_id == owner_id)
            .map(|(family, value)| (family, value.container_addr_be))
            .collect();
        let removed = maps.release(&req.owner)?;
        peers::forget(&layout, owner_id, &container_addrs);
        log::info!(
            "DEL {}: {removed} mapping(s) removed",
            who(&req.owner, identity)
        );
        forget_counters(&layout, ownership::owner_id(&req.owner), &owned);
        // Earlier containers' veths are gone by now (this one's goes after
        // us, in the interface plugin's DEL): their dead link pins go too.
        reconcile_after("DEL", &layout, &req.conf);
        Ok(())
    }

    fn check(&self, req: &Request) -> Result<(), PluginError> {
        let translations = ownership::plan(&req.conf.port_mappings, &req.container);
        let layout = scope::resolve(&req.conf.pin_root, scope::Access::Read)?;
        let installed = layout.map(portmap_common::map_names::OWNERS).exists();
        if translations.is_empty() && !installed {
            return Ok(());
        }
        require_privilege()?;
        let mut rtnl = Rtnl::open()?;
        let node = NodeView::read(&mut rtnl, &req.conf, &req.interfaces)?;
        if installed && let Err(error) = reconcile(&layout, &req.conf, &node) {
            // What it could not attach is reported below.
            log::warn!("CHECK: the attachments were not brought up to date: {error}");
        }
        if translations.is_empty() {
            return Ok(());
        }
        if let Some(index) = node
            .targets()
            .into_iter()
            .find(|&index| !attach::is_attached(&layout, index))
        {
            return Err(PluginError::NotAttached { index });
        }
        let maps = Maps::open(&layout)?;
        maps.verify(&req.owner, &translations)?;
        Ok(())
    }

    fn gc(&self, req: &GcRequest) -> Result<(), PluginError> {
        require_privilege()?;
        let Some(layout) = own_state(&req.conf.pin_root)? else {
            return Ok(());
        };
        let Some(mut maps) = Maps::open_existing(&layout)? else {
            return Ok(());
        };
        let removed = maps.collect_garbage(&req.conf.name, &req.valid)?;
        log::info!("GC {}: removed {removed:?}", req.conf.name);
        // Mappings of any network whose owner record is gone: no DEL will
        // ever remove them, so GC does after a grace period.
        let orphans =
            maps.reclaim_orphans(&layout, ownership::ORPHAN_GRACE_SECS, ownership::now_unix())?;
        for (id, count) in &orphans.reclaimed {
            log::warn!(
                "GC: reclaimed {count} mapping(s) of owner {id:016x}, whose record was gone"
            );
        }
        for (id, first_seen) in &orphans.waiting {
            log::warn!(
                "GC: owner {id:016x} has mappings but no record (first seen at {first_seen}); reclaimed {}s after that",
                ownership::ORPHAN_GRACE_SECS
            );
        }
        prune_counters(&layout, &maps);
        match maps.prune_pods() {
            Ok(0) => {}
            Ok(pruned) => log::info!("GC: {pruned} pod record(s) without an owner removed"),
            Err(error) => log::warn!("GC: pod records not pruned: {error}"),
        }
        let pruned = peers::prune(&layout, |owner| maps.owners.get(&owner, 0).is_ok());
        if pruned > 0 {
            log::info!("GC: {pruned} stale fast-path entr(y/ies) removed");
        }
        reconcile_after("GC", &layout, &req.conf);
        Ok(())
    }
}

/// Drops the traffic counters of a deleted owner. Best effort: a leftover
/// entry costs memory only (a new owner counts under another key), and GC
/// prunes it later.
fn forget_counters(layout: &PinLayout, owner_id: u64, keys: &[portmap_common::MappingKey]) {
    let result = crate::dataplane::maps::counters(layout)
        .map_err(|e| e.to_string())
        .and_then(|mut map| counters::forget(&mut map, owner_id, keys).map_err(|e| e.to_string()));
    if let Err(error) = result {
        log::warn!("traffic counters of owner {owner_id:016x} not removed: {error}");
    }
}

/// Drops the traffic counters of mappings that no longer exist (best effort).
fn prune_counters(layout: &PinLayout, maps: &Maps) {
    let result = crate::dataplane::maps::counters(layout)
        .map_err(|e| e.to_string())
        .and_then(|mut map| counters::prune(&mut map, &maps.mappings).map_err(|e| e.to_string()));
    match result {
        Ok(pruned) if !pruned.is_empty() => {
            log::info!("GC: {} stale counter entr(y/ies) removed", pruned.len())
        }
        Ok(_) => {}
        Err(error) => log::warn!("stale traffic counters not pruned: {error}"),
    }
}

impl Plugin for Dataplane {
    fn add(&mut self, req: &Request) -> Result<(), CniError> {
        Dataplane::add(self, req).map_err(CniError::from)
    }

    fn del(&mut self, req: &Request) -> Result<(), CniError> {
        Dataplane::del(self, req).map_err(CniError::from)
    }

    fn check(&mut self, req: &Request) -> Result<(), CniError> {
        Dataplane::check(self, req).map_err(CniError::from)
    }

    fn gc(&mut self, req: &GcRequest) -> Result<(), CniError> {
        Dataplane::gc(self, req).map_err(CniError::from)
    }

    fn status(&mut self, conf: &NetConf) -> Result<(), CniError> {
        let layout = scope::resolve(&conf.pin_root, scope::Access::Read)
            .map_err(|error| CniError::from_error(code::INVALID_CONFIG, &error))?;
        attach::probe(&layout).map_err(|error| CniError::from_error(code::NOT_AVAILABLE, &error))
    }
}
