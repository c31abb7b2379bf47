//! GC: remove what no attachment in the runtime's keep-list owns, and
//! orphans past their grace period.

use super::interfaces::{Pass, reconcile_after};
use super::shared::PluginError;
use super::shared::own_state;
use super::shared::prune_counters;
use super::shared::require_privilege;
use crate::cni::GcRequest;
use crate::dataplane::container_netns;
use crate::dataplane::ownership;
use crate::dataplane::ownership::Store;
use crate::dataplane::peers;
use crate::dataplane::pin::PinLayout;
use crate::upstream;

pub(super) fn gc(req: &GcRequest) -> Result<(), PluginError> {
    require_privilege()?;
    collect_upstream_garbage(req);
    if let Some(error) = crate::dataplane::bpffs::unreachable_node_bpffs(&req.conf.pin_root) {
        // Like DEL: said, and left to a run that sees the node's state.
        log::warn!(
            "GC {}: nothing collected: {}; the node's mappings are collected by a GC run where the node's bpffs is visible (the agent's pass, or `ebpf-portmap gc` on the node)",
            req.conf.name,
            crate::cni::error::with_sources(&error)
        );
        return Ok(());
    }
    let Some(layout) = own_state(&req.conf.pin_root)? else {
        return Ok(());
    };
    let Some(mut maps) = Store::open_existing(&layout)? else {
        return Ok(());
    };
    let removed = maps.collect_garbage(&req.conf.name, &req.valid)?;
    log::info!("GC {}: removed {removed:?}", req.conf.name);
    let forgotten = container_netns::collect(&layout, &req.conf.name, &req.valid);
    if forgotten > 0 {
        log::info!(
            "GC {}: {forgotten} container namespace registration(s) (containerSockets) of containers no longer listed removed",
            req.conf.name
        );
    }
    collect_node_garbage("GC", &layout, &mut maps)?;
    reconcile_after("GC", &layout, &req.conf, Pass::Node);
    Ok(())
}

/// Removes upstream `portmap`'s rules of this network's containers that
/// the runtime's keep-list no longer names (their DEL may have come to us
/// before this build, or never). Only the iptables backend records the
/// network; the nftables backend's rules of containers not kept may be
/// another network's, and are left (and said so): `ebpf-portmap migrate`
/// judges those on the runtime's cache. Nothing is lost by that in
/// libcni's GC, which first runs the DEL of every cached attachment the
/// keep-list leaves out, with its cached result as prevResult: those DELs
/// take their nftables rules by address.
fn collect_upstream_garbage(req: &GcRequest) {
    let sources = upstream::sources();
    if sources.is_empty() {
        return;
    }
    let network = req.conf.name.as_str();
    let keep: std::collections::BTreeSet<String> =
        req.valid.iter().map(|a| a.container_id.clone()).collect();
    let select = upstream::Collect {
        network,
        keep: &keep,
    };
    let report = upstream::remove(&sources, &select);
    for done in report.removed {
        log::info!(
            "GC {network}: upstream portmap's {} {} rules of {:?} removed{}",
            done.source.backend,
            done.source.family,
            done.containers,
            if done.shared {
                ", and its shared chains, now empty"
            } else {
                ""
            }
        );
    }
    for left in report.left {
        log::info!(
            "GC {network}: upstream portmap's {} {} rules of {:?} left: not in this network's keep-list, but nothing shows they are this network's ({}); `ebpf-portmap migrate --remove` removes those of containers that are gone",
            left.source.backend,
            left.source.family,
            left.containers,
            match left.source.backend {
                upstream::Backend::Nftables => "its rules name no network",
                _ => "upstream cut the network name from their comment",
            }
        );
    }
    for error in report.errors {
        log::warn!(
            "GC {network}: upstream portmap's rules not removed: {}",
            crate::cni::error::with_sources(&error)
        );
    }
}

/// The part of GC that needs no word from the runtime: mappings whose owner
/// record is gone (after their grace period), port-filter bits missing,
/// counters of mappings gone, pod records without an owner, stale fast-path
/// entries. GC runs it, and
/// the node agent on its timer; `verb` names the caller in log lines.
pub fn collect_node_garbage(
    verb: &str,
    layout: &PinLayout,
    maps: &mut Store,
) -> Result<(), PluginError> {
    // Mappings of any network whose owner record is gone: no DEL will
    // ever remove them, so GC does after a grace period.
    let orphans =
        maps.reclaim_orphans(layout, ownership::ORPHAN_GRACE_SECS, ownership::now_unix())?;
    for (id, count) in &orphans.reclaimed {
        log::warn!(
            "{verb}: reclaimed {count} mapping(s) of owner {id:016x}, whose record was gone"
        );
    }
    for (id, first_seen) in &orphans.waiting {
        log::warn!(
            "{verb}: owner {id:016x} has mappings but no record (first seen at {first_seen}); reclaimed {}s after that",
            ownership::ORPHAN_GRACE_SECS
        );
    }
    let unfiltered = maps.mark_every_mapping();
    if unfiltered > 0 {
        log::warn!(
            "{verb}: {unfiltered} mapping(s) had their ports missing from the port filter (written by an older build during an upgrade?); marked"
        );
    }
    prune_counters(layout, maps);
    match maps.prune_pods() {
        Ok(0) => {}
        Ok(pruned) => log::info!("{verb}: {pruned} pod record(s) without an owner removed"),
        Err(error) => log::warn!("{verb}: pod records not pruned: {error}"),
    }
    match maps.prune_sandboxes() {
        Ok(0) => {}
        Ok(pruned) => log::info!("{verb}: {pruned} sandbox record(s) without an owner removed"),
        Err(error) => log::warn!("{verb}: sandbox records not pruned: {error}"),
    }
    match maps.prune_conditions() {
        Ok(0) => {}
        Ok(pruned) => {
            log::info!("{verb}: {pruned} conditions entr(y/ies) without an owner removed");
        }
        Err(error) => log::warn!("{verb}: conditions not pruned: {error}"),
    }
    let unnamed = container_netns::prune(layout);
    if unnamed > 0 {
        log::info!(
            "{verb}: {unnamed} container namespace registration(s) that no record names removed"
        );
    }
    let pruned = peers::prune(layout, |owner| maps.owners.get(&owner, 0).is_ok());
    if pruned > 0 {
        log::info!("{verb}: {pruned} stale fast-path entr(y/ies) removed");
    }
    Ok(())
}

/// "pod default/web (UID 5c9e…)", "pod UID 5c9e…", "no known pod".
pub fn pod_words(pod: &crate::model::PodIdentity) -> String {
    let mut named = pod.clone();
    let uid = named.pod_uid.take();
    match (named.is_empty(), uid) {
        (false, Some(uid)) => format!("{named} (UID {uid})"),
        (false, None) => named.to_string(),
        (true, Some(uid)) => format!("pod UID {uid}"),
        (true, None) => "no known pod".into(),
    }
}

/// Removes the mappings of containers whose network namespace is gone
/// (see [`ownership::Store::reclaim_gone`]) once `grace` seconds have passed
/// since a GC first saw it so, and logs each removal and each wait. The
/// node agent runs it on its timer and `ebpf-portmap gc --gone` on demand;
/// CNI GC does not (the runtime's keep-list is its word, and its mount
/// namespace may not be the one the paths were given in).
pub fn reclaim_gone_containers(
    verb: &str,
    maps: &mut Store,
    grace: u64,
) -> Result<ownership::GoneReclaim, PluginError> {
    let mut judge = crate::node::sandbox::Judge::new();
    let outcome =
        maps.reclaim_gone(grace, ownership::now_unix(), |sandbox| judge.judge(sandbox))?;
    for gone in &outcome.removed {
        log::warn!(
            "{verb}: removed {} mapping(s) of container {} ({}; network {}, interface {}): its network namespace {} has been gone since {} (unix), more than {grace}s",
            gone.mappings,
            gone.container_id,
            pod_words(&gone.pod),
            gone.network,
            gone.ifname,
            gone.netns
                .as_deref()
                .map_or_else(|| "?".into(), |p| p.display().to_string()),
            gone.gone_since,
        );
    }
    for gone in &outcome.waiting {
        log::info!(
            "{verb}: container {} ({}) has lost its network namespace {} (first seen at {} unix); its mappings go {grace}s after that unless its DEL comes first",
            gone.container_id,
            pod_words(&gone.pod),
            gone.netns
                .as_deref()
                .map_or_else(|| "?".into(), |p| p.display().to_string()),
            gone.gone_since,
        );
    }
    for (container_id, why) in &outcome.unproven {
        log::debug!("{verb}: container {container_id} left alone, nothing proves it gone: {why}");
    }
    Ok(outcome)
}
