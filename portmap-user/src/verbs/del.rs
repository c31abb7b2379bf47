//! DEL: release what the container owns (found by owner, so it works
//! without prevResult), idempotently, and never fail.
//!
//! Runtimes run a chain's DEL in reverse order, so ours runs before the
//! interface and IPAM plugins; an error of ours ends the chain there, the
//! main plugin's DEL never runs and the pod's address leaks (containerd
//! #12130). So every DEL ends in success:
//! - what cannot hold anything of the container is nothing to remove: no
//!   pin root, no bpffs under it, a root of another network namespace, an
//!   owner never added;
//! - a mount namespace that is not the node's and has no bpffs (see
//!   `bpffs`) cannot see what the node holds: that is logged, and left to
//!   a GC that can;
//! - maps of another layout are opened no further: this build wrote
//!   nothing there (`ebpf-portmap uninstall` removes them);
//! - what it cannot remove (no privilege, a map that cannot be opened or
//!   updated) is logged with the container and left for GC: the runtime's
//!   next GC no longer lists the container, and the agent's pass reclaims
//!   mappings whose owner record is gone;
//! - the pin root's lock guards only the reconciliation after the release
//!   (the mappings go without it): DEL waits for it [`LOCK_WAIT`] at most,
//!   then leaves that work to the next run.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::Duration;

use super::interfaces::{Pass, forget_bridge_ports, reconcile_after};
use super::shared::PluginError;
use super::shared::forget_counters;
use super::shared::own_state;
use super::shared::require_privilege;
use super::shared::who;
use crate::cni::Request;
use crate::cni::error::with_sources;
use crate::dataplane::bpffs;
use crate::dataplane::container_netns;
use crate::dataplane::lock;
use crate::dataplane::ownership::{self, Store};
use crate::dataplane::peers;
use crate::upstream;

/// How long DEL waits for the pin root's lock: longer than a first ADD
/// holds it to load and attach (about 0.3 s of CPU, a few seconds on a
/// loaded node), far shorter than a runtime's patience.
pub const LOCK_WAIT: Duration = Duration::from_secs(2);

/// DEL: always a success for the runtime; see the module docs.
pub(super) fn del(req: &Request) {
    lock::limit_waits(LOCK_WAIT);
    release_upstream(req);
    if let Err(error) = release(req) {
        log::warn!(
            "DEL {}: {}; what it holds stays until GC removes it (the runtime's GC, which no longer lists it, or `ebpf-portmap gc`)",
            who(&req.owner, &req.identity),
            with_sources(&error)
        );
    }
}

/// Removes what upstream `portmap` set up for this container, when the
/// node switched to us while it ran: its DEL now comes here, and nobody
/// else would ever remove those rules. Independent of our own state (a
/// node may have none yet). Failures are logged, like every DEL failure.
fn release_upstream(req: &Request) {
    let sources = upstream::sources();
    if sources.is_empty() {
        return;
    }
    // The nftables backend records no network: the container's addresses
    // on this network (prevResult's) tell its rules from another
    // network's of the same container.
    let select = upstream::Attachment {
        network: req.conf.name.as_str(),
        container_id: req.owner.container_id.as_str(),
        addrs: [
            req.container.v4.map(IpAddr::V4),
            req.container.v6.map(IpAddr::V6),
        ]
        .into_iter()
        .flatten()
        .collect(),
    };
    let report = upstream::remove(&sources, &select);
    for done in report.removed {
        if !done.containers.is_empty() {
            log::info!(
                "DEL {}: upstream portmap's {} {} rules of this container removed{}",
                who(&req.owner, &req.identity),
                done.source.backend,
                done.source.family,
                if done.shared {
                    ", and its shared chains, now empty"
                } else {
                    ""
                }
            );
        } else if done.shared {
            log::info!(
                "DEL {}: upstream portmap's empty {} {} chains removed",
                who(&req.owner, &req.identity),
                done.source.backend,
                done.source.family
            );
        }
    }
    for left in report.left {
        log::warn!(
            "DEL {}: upstream portmap's {} {} rules of this container ID left: {}; `ebpf-portmap migrate --remove` removes them once the container is gone",
            who(&req.owner, &req.identity),
            left.source.backend,
            left.source.family,
            if select.addrs.is_empty() {
                "they name no network, and this DEL has no prevResult address to match them by"
            } else {
                "nothing shows they are this network's (their container address cannot be read, or upstream cut their comment)"
            }
        );
    }
    for error in report.errors {
        log::warn!(
            "DEL {}: upstream portmap's rules of this container not removed: {}",
            who(&req.owner, &req.identity),
            with_sources(&error)
        );
    }
}

fn release(req: &Request) -> Result<(), PluginError> {
    require_privilege()?;
    if let Some(error) = bpffs::unreachable_node_bpffs(&req.conf.pin_root) {
        // The node's dataplane may hold this container's mappings; this
        // run cannot see it. Said, and left to a GC that can.
        log::warn!(
            "DEL {}: nothing removed: {}; this container's mappings, if any, stay in the node's dataplane until a GC run where the node's bpffs is visible removes them (the agent's pass, or `ebpf-portmap gc` on the node)",
            who(&req.owner, &req.identity),
            with_sources(&error)
        );
        return Ok(());
    }
    let Some(layout) = own_state(&req.conf.pin_root)? else {
        return Ok(());
    };
    let mut maps = match Store::open_existing(&layout) {
        Ok(Some(maps)) => maps,
        // Nothing was ever added under this root: nothing to delete.
        Ok(None) => return Ok(()),
        Err(error) => match Store::open_for_release(&layout) {
            // A map DEL can do without (pod labels, the port filter) is
            // of another layout or broken: release through the others.
            Ok(maps) => {
                log::warn!(
                    "DEL {}: {}; releasing without it",
                    who(&req.owner, &req.identity),
                    with_sources(&error)
                );
                maps
            }
            Err(ownership) => {
                // The ownership maps themselves are not this build's:
                // nothing in them was written by it.
                log::warn!(
                    "DEL {}: nothing removed: {}; maps made by another build are removed by `ebpf-portmap uninstall`",
                    who(&req.owner, &req.identity),
                    with_sources(&ownership)
                );
                return Ok(());
            }
        },
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
    // By owner: the second DEL has no CNI_NETNS, the namespace may be gone.
    if container_netns::forget(&layout, owner_id) {
        log::info!(
            "DEL {}: its network namespace is no longer translated at the socket",
            who(&req.owner, identity)
        );
    }
    let removed = maps.release(&req.owner)?;
    peers::forget(&layout, owner_id, &container_addrs);
    log::info!(
        "DEL {}: {removed} mapping(s) removed",
        who(&req.owner, identity)
    );
    forget_counters(&layout, ownership::owner_id(&req.owner), &owned);
    // Its bridge port's program goes before its veth does.
    forget_bridge_ports(&layout, &req.interfaces);
    // Earlier containers' veths are gone by now (this one's goes after
    // us, in the interface plugin's DEL): their dead link pins go too.
    reconcile_after("DEL", &layout, &req.conf, Pass::Call);
    Ok(())
}
