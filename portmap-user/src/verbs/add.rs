//! ADD: claim the container's host ports, atomically, after bringing the
//! programs and the node state in line with the node.

use super::interfaces::NodeView;
use super::interfaces::{Pass, reconcile};
use super::shared::PluginError;
use super::shared::require_privilege;
use super::shared::who;
use crate::cni::Request;
use crate::cni::error::with_sources;
use crate::cni::netconf::ListenerPolicy;
use crate::cni::netconf::NetConf;
use crate::dataplane::container_netns;
use crate::dataplane::interface_conditions;
use crate::dataplane::ownership;
use crate::dataplane::ownership::Store;
use crate::dataplane::ownership::Translation;
use crate::dataplane::peers;
use crate::dataplane::scope;
use crate::model::FastPathSetting;
use crate::model::HostIp;
use crate::model::Owner;
use crate::model::Protocol;
use crate::node::listeners;
use crate::node::netlink;
use crate::node::netlink::NodeAddress;
use crate::node::netlink::Rtnl;
use crate::upstream;
use portmap_common::conditions::Conditions;
use portmap_common::{FAMILY_V4, FAMILY_V6};
use std::collections::BTreeSet;

/// The mappings a request asks for, flagged where its configuration has
/// conditions for their family (ADD writes them, CHECK expects them).
pub(super) fn planned(req: &Request) -> Vec<Translation> {
    let families: Vec<u8> = [FAMILY_V4, FAMILY_V6]
        .into_iter()
        .filter(|family| req.conf.conditions(*family).is_some())
        .collect();
    ownership::with_conditions(
        ownership::plan(&req.conf.port_mappings, &req.container),
        &families,
    )
}

/// The conditions map entries of the request, by family: `-i` names
/// resolved to the index the interface has now in the node's namespace,
/// under `held`, which keeps them so that every later reconciliation
/// follows them (see `dataplane::interface_conditions`).
fn condition_entries(
    conf: &NetConf,
    held: &interface_conditions::Held,
) -> Result<Vec<(u8, Conditions)>, PluginError> {
    let mut entries = Vec::new();
    for family in [FAMILY_V4, FAMILY_V6] {
        let Some(set) = conf.conditions(family) else {
            continue;
        };
        let names: Vec<&str> = set
            .in_interface
            .iter()
            .map(|(_, name)| name.as_str())
            .collect();
        let indexes = held.resolve(&set.key, &names)?;
        let entry = set.to_map_value(|name| {
            let index = indexes.get(name).copied().unwrap_or(0);
            if index == 0 {
                log::warn!(
                    "{set}: the node has no interface {name:?} now: no packet arrives on it until one of that name exists, from the next plugin run or agent pass after it appears"
                );
            }
            index
        });
        log::info!("{set}: enforced on every new flow of this configuration's mappings");
        entries.push((family, entry));
    }
    Ok(entries)
}

pub(super) fn add(req: &Request) -> Result<(), PluginError> {
    // First: a run without the privilege fails here, with the one code and
    // text for it, not at whichever step the kernel refused first.
    require_privilege()?;
    let translations = planned(req);
    // A container without mappings still needs the programs on its
    // host-side interface once the node has a dataplane: that is where
    // its hairpin connections to other containers' host ports start.
    // With `containerSockets` it needs the dataplane in any case: its
    // namespace is registered in the programs' map.
    if translations.is_empty() && !req.conf.container_sockets {
        let layout = scope::resolve(&req.conf.pin_root, scope::Access::Read)?;
        if !layout.map(portmap_common::map_names::OWNERS).exists() {
            log::info!("ADD {}: no port mappings", who(&req.owner, &req.identity));
            return Ok(());
        }
    }
    // The root becomes this network namespace's before anything is made.
    let layout = scope::resolve(&req.conf.pin_root, scope::Access::Claim)?;
    check_upstream(req, &translations)?;
    // One rtnetlink socket, one link and one address dump serve every
    // question below.
    let mut rtnl = Rtnl::open()?;
    let node = NodeView::read(&mut rtnl, &req.conf, &req.interfaces)?;
    warn_absent_host_ips(&req.conf, &node.addresses);
    reconcile(&mut rtnl, &layout, &req.conf, &node, Pass::Call)?;
    log::debug!("ADD account: {}", netlink::account());
    // After the reconciliation, which records where this node translates
    // each family, and before anything of the container is written.
    check_firewall(&req.conf, &layout, &translations)?;
    let mut maps = Store::open(&layout)?;
    container_sockets(req, &layout)?;
    if translations.is_empty() {
        return Ok(());
    }
    check_node_listeners(&maps, &req.owner, &translations, req.conf.listener_policy)?;
    if !req.identity.is_empty() && maps.pods.is_none() {
        maps.pods = Some(crate::dataplane::maps::create_pods(&layout)?);
    }
    if maps.sandboxes.is_none() {
        maps.sandboxes = Some(crate::dataplane::maps::create_sandboxes(&layout)?);
    }
    maps.prepare_claim(&layout)?;
    // Conditions are resolved and written under their lock, held to the
    // end of the claim: a reconciliation rewriting `-i` indexes meanwhile
    // neither misses this owner's entry nor puts an older one back.
    let held = [FAMILY_V4, FAMILY_V6]
        .into_iter()
        .any(|family| req.conf.conditions(family).is_some())
        .then(|| interface_conditions::hold(&layout))
        .transpose()?;
    let conditions = match held.as_ref() {
        Some(held) => condition_entries(&req.conf, held)?,
        None => Vec::new(),
    };
    maps.claim(&req.owner, &req.identity, &translations, &conditions)?;
    drop(held);
    // What tells GC later that the container is gone when no DEL comes.
    maps.record_sandbox(
        &req.owner,
        &crate::node::sandbox::observe(req.netns.as_deref(), req.identity.pod_uid.as_deref()),
    );
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

/// `containerSockets`: registers the container's network namespace, so
/// that the socket hooks translate its own connections to a host port on
/// the node's addresses; off, forgets a registration an earlier ADD of
/// this attachment made with it on. Before the claim: a claim that fails
/// fails the ADD, and its DEL forgets the registration too.
fn container_sockets(
    req: &Request,
    layout: &crate::dataplane::pin::PinLayout,
) -> Result<(), PluginError> {
    let id = ownership::owner_id(&req.owner);
    if !req.conf.container_sockets {
        if container_netns::forget(layout, id) {
            log::info!(
                "ADD {}: containerSockets is off: its namespace's sockets are no longer translated",
                who(&req.owner, &req.identity)
            );
        }
        return Ok(());
    }
    let Some(netns) = req.netns.as_deref() else {
        // cni::env requires CNI_NETNS for ADD; kept total all the same.
        log::warn!(
            "ADD {}: no CNI_NETNS: containerSockets does not apply; its connections take the packet path",
            who(&req.owner, &req.identity)
        );
        return Ok(());
    };
    let cookie = container_netns::cookie_at(netns)?;
    container_netns::register(layout, &req.owner, cookie)?;
    log::info!(
        "ADD {}: network namespace {} (cookie {cookie}) registered: its connections to host ports on the node's addresses are translated at the socket",
        who(&req.owner, &req.identity),
        netns.display()
    );
    Ok(())
}

/// Refuses a host port that upstream `portmap` still maps for another
/// container (a node switching from it): tc ingress runs before its
/// PREROUTING rules, so our mapping would silently take that pod's traffic.
/// A node without upstream's state pays for one nfnetlink probe, no process.
fn check_upstream(req: &Request, translations: &[Translation]) -> Result<(), PluginError> {
    if translations.is_empty() {
        return Ok(());
    }
    let started = std::time::Instant::now();
    let sources = upstream::sources();
    log::debug!(
        "ADD: upstream portmap probe took {} µs, found {sources:?}",
        started.elapsed().as_micros()
    );
    if sources.is_empty() {
        return Ok(());
    }
    let (held, errors) = upstream::mappings(&sources);
    for error in &errors {
        log::warn!(
            "ADD {}: upstream portmap's state not read: {}; its ports are not checked",
            who(&req.owner, &req.identity),
            with_sources(error)
        );
    }
    for translation in translations {
        let key = translation.key;
        let family = if key.family == FAMILY_V6 {
            upstream::Family::V6
        } else {
            upstream::Family::V4
        };
        let Some(protocol) = protocol_of(key.proto) else {
            continue;
        };
        let addr = (key.host_addr_be != [0; 4])
            .then(|| ownership::addr_from_words(key.family, &key.host_addr_be));
        let port = u16::from_be(key.host_port_be);
        if let Some(holder) = held.iter().find(|m| {
            m.container_id.as_deref() != Some(req.owner.container_id.as_str())
                && m.overlaps(family, protocol, port, addr)
        }) {
            return Err(PluginError::UpstreamHeld {
                key: ownership::KeyDisplay(key),
                holder: holder.holder(),
            });
        }
    }
    Ok(())
}

/// Refuses mappings whose flows firewalld would refuse (issue 50): on a
/// node where firewalld keeps its ruleset, its FORWARD chain accepts the
/// forwarded flows conntrack holds as DNAT and judges the rest by its
/// zones, which refuse forwarding from the uplinks' zone to the pods' in
/// every layout but one (uplinks and bridge in one zone that forwards
/// within itself). A flow translated in tc, before netfilter, is no DNAT
/// to it: the port would be published and never answer. Which flows are
/// translated in tc unless `fastPath: true` hands them past FORWARD: SCTP
/// (the kernel allocates no SCTP entry for the programs), and every flow
/// of a family netfilter does not translate on this node (no NAT kfuncs
/// when the programs were loaded, no nat chain). `masqAll`'s flows are
/// masqueraded in tc too, but are never handed over, so `fastPath` is no
/// fix for them; `status` notes them instead. A node without firewalld,
/// and one where nf_tables cannot be asked, pays one table dump at most,
/// and only for such mappings.
fn check_firewall(
    conf: &NetConf,
    layout: &crate::dataplane::pin::PinLayout,
    translations: &[Translation],
) -> Result<(), PluginError> {
    if conf.fast_path == FastPathSetting::Always || conf.masq_all {
        return Ok(());
    }
    let netfilter = crate::dataplane::features::netfilter_translates(
        crate::dataplane::node_state::recorded_flags(layout).unwrap_or(0),
    );
    let refused: Vec<String> = translations
        .iter()
        .filter_map(|translation| {
            let key = translation.key;
            let why = tc_translated(key.proto, key.family, netfilter)?;
            Some(format!("{} ({why})", ownership::KeyDisplay(key)))
        })
        .collect();
    if refused.is_empty() {
        return Ok(());
    }
    match crate::node::nft_tables::firewalld() {
        Ok(true) => Err(PluginError::FirewalldRefuses {
            mappings: refused.join(", "),
        }),
        Ok(false) => Ok(()),
        Err(error) => {
            log::info!(
                "cannot tell whether firewalld runs here (nf_tables): {error}; mappings translated in tc are not checked against it"
            );
            Ok(())
        }
    }
}

/// Why new flows of a mapping of `proto` and `family` are translated in tc
/// where netfilter translates the families `netfilter` says (IPv4, IPv6),
/// or `None` where netfilter translates them.
fn tc_translated(proto: u8, family: u8, netfilter: [bool; 2]) -> Option<&'static str> {
    if proto == portmap_common::PROTO_SCTP {
        Some("SCTP: the kernel makes no conntrack entry with NAT for it")
    } else if !netfilter[usize::from(family == FAMILY_V6)] {
        Some(if family == FAMILY_V6 {
            "netfilter does not translate IPv6 on this node"
        } else {
            "netfilter does not translate IPv4 on this node"
        })
    } else {
        None
    }
}

fn protocol_of(number: u8) -> Option<Protocol> {
    [Protocol::Tcp, Protocol::Udp, Protocol::Sctp]
        .into_iter()
        .find(|p| p.number() == number)
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

/// Refuses (or, by policy, warns about) host ports that a node process
/// already listens on. Ports the owner holds already are its own business.
fn check_node_listeners(
    maps: &Store,
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
