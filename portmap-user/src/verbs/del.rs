//! DEL: release what the container owns (found by owner, so it works
//! without prevResult), idempotently.

use super::PluginError;
use super::forget_counters;
use super::interfaces::reconcile_after;
use super::own_state;
use super::require_privilege;
use super::who;
use crate::cni::Request;
use crate::dataplane::maps::Maps;
use crate::dataplane::ownership;
use crate::dataplane::peers;
use std::collections::BTreeSet;

pub(super) fn del(req: &Request) -> Result<(), PluginError> {
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
