//! Garbage collection: owners the runtime no longer lists (CNI GC),
//! owners whose container's network namespace is gone, mappings whose
//! owner record is gone (orphans), and labels left without an owner.

use std::collections::BTreeMap;

use portmap_common::{
    MappingKey, OWNER_SANDBOXES_MAP,
    conditions::{CONDITIONS_MAP, ConditionKey},
    owner_flags,
};

use super::error::{StoreError, map_error};
use super::index::{BPF_NOEXIST, slot_key};
use super::records::{record_is, record_network_is, record_strings};
use super::store::Store;
use crate::dataplane::pinned::maps::is_errno;
use crate::dataplane::pinned::pin::PinLayout;
use crate::model::{Attachment, Liveness, Owner, PodIdentity, Sandbox};

/// What [`Store::reclaim_orphans`] did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct OrphanReclaim {
    /// (owner ID, mappings removed).
    pub reclaimed: Vec<(u64, usize)>,
    /// (owner ID, Unix time first seen) of orphans still in their grace period.
    pub waiting: Vec<(u64, u64)>,
}

/// Seconds CNI GC leaves an orphaned mapping alone after first seeing it.
/// An orphan is legitimately there for the milliseconds an ADD needs to
/// undo its writes after a concurrent GC removed its owner; a minute is
/// far beyond that and still frees a stuck port soon.
pub const ORPHAN_GRACE_SECS: u64 = 60;

/// Seconds GC leaves the mappings of a container whose network namespace
/// is gone before it removes them (the agent's `--gone-grace` and
/// `ebpf-portmap gc --gone-grace` change it). A runtime's own DEL, which
/// follows the namespace's removal within moments, comes first; a minute
/// still frees the port soon after a DEL that never comes.
pub const GONE_GRACE_SECS: u64 = 60;

/// One owner whose container's network namespace is gone (see
/// [`Store::reclaim_gone`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GoneOwner {
    pub id: u64,
    pub network: String,
    pub container_id: String,
    pub ifname: String,
    pub pod: PodIdentity,
    pub netns: Option<std::path::PathBuf>,
    /// Unix time a GC first found the namespace gone.
    pub gone_since: u64,
    /// Mappings removed (0 while waiting).
    pub mappings: usize,
}

/// What [`Store::reclaim_gone`] found and did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct GoneReclaim {
    /// Removed: the namespace was gone for at least the grace period.
    pub removed: Vec<GoneOwner>,
    /// Gone, still within the grace period.
    pub waiting: Vec<GoneOwner>,
    /// (container ID, why) of owners holding mappings that nothing proves
    /// alive or dead: left alone.
    pub unproven: Vec<(String, String)>,
}

/// Whether an orphan first seen at `first_seen` may be reclaimed at `now`.
pub fn orphan_due(first_seen: u64, now: u64, grace: u64) -> bool {
    now.saturating_sub(first_seen) >= grace
}

impl Store {
    /// Removes sandbox records whose owner is gone (DEL leaves them, see
    /// the module doc of `ownership`). Returns how many it removed.
    pub fn prune_sandboxes(&mut self) -> Result<usize, StoreError> {
        let Some(map) = self.sandboxes.as_ref() else {
            return Ok(0);
        };
        let ids = map
            .keys()
            .collect::<Result<Vec<u64>, _>>()
            .map_err(map_error(OWNER_SANDBOXES_MAP, "iterate"))?;
        let mut removed = 0;
        for id in ids {
            if self.owners.get(&id, 0).is_err() {
                let map = self.sandboxes.as_mut().expect("checked above");
                match map.remove(&id) {
                    Ok(()) => removed += 1,
                    Err(e) if is_errno(&e, libc::ENOENT) => {}
                    Err(e) => return Err(map_error(OWNER_SANDBOXES_MAP, "delete")(e)),
                }
            }
        }
        Ok(removed)
    }

    /// Removes every owner that holds mappings and whose container's
    /// network namespace `judge` finds gone for at least `grace` seconds
    /// before `now`; records the first sighting of the others
    /// (`gone_since`) and forgets it when a namespace is back. Owners that
    /// nothing proves dead (no record, no `CNI_NETNS`, a mount namespace
    /// the caller cannot see) are left and reported.
    pub fn reclaim_gone(
        &mut self,
        grace: u64,
        now: u64,
        mut judge: impl FnMut(&Sandbox) -> Liveness,
    ) -> Result<GoneReclaim, StoreError> {
        let mut outcome = GoneReclaim::default();
        let held = self.owners_with_mappings()?;
        for (id, record) in self.owners()? {
            if !held.contains(&id) || record.flags & owner_flags::DYING != 0 {
                continue;
            }
            let (network, container_id, ifname) = record_strings(&record);
            let Some(mut sandbox) = self.sandbox_of(id) else {
                outcome.unproven.push((
                    container_id,
                    "no sandbox recorded (added by an older build)".into(),
                ));
                continue;
            };
            let gone_since = match judge(&sandbox) {
                Liveness::Unknown(why) => {
                    outcome.unproven.push((container_id, why));
                    continue;
                }
                Liveness::Alive => {
                    if sandbox.gone_since.is_some() {
                        sandbox.gone_since = None;
                        self.update_sandbox(id, &sandbox);
                    }
                    continue;
                }
                Liveness::Gone => match sandbox.gone_since {
                    Some(since) => since,
                    None => {
                        sandbox.gone_since = Some(now);
                        self.update_sandbox(id, &sandbox);
                        now
                    }
                },
            };
            let mut gone = GoneOwner {
                id,
                network,
                container_id,
                ifname,
                pod: self.pod_of(id),
                netns: sandbox.netns.clone(),
                gone_since,
                mappings: 0,
            };
            if !orphan_due(gone_since, now, grace) {
                outcome.waiting.push(gone);
                continue;
            }
            // The owner may have been removed and added again meanwhile (a
            // new sandbox of the same container ID and ifname): only the
            // record judged goes.
            match self.owners.get(&id, 0) {
                Ok(current) if current.created_unix == record.created_unix => {}
                _ => continue,
            }
            gone.mappings = self.release_id(id)?;
            outcome.removed.push(gone);
        }
        Ok(outcome)
    }

    /// Removes conditions whose owner is gone (an ADD that raced with the
    /// DEL of the same owner, a killed DEL). Returns how many it removed.
    pub fn prune_conditions(&mut self) -> Result<usize, StoreError> {
        let Some(map) = self.conditions.as_mut() else {
            return Ok(0);
        };
        let keys = map
            .keys()
            .collect::<Result<Vec<ConditionKey>, _>>()
            .map_err(map_error(CONDITIONS_MAP, "iterate"))?;
        let mut removed = 0;
        for key in keys {
            if self.owners.get(&key.owner_id, 0).is_err() {
                let map = self.conditions.as_mut().expect("checked above");
                match map.remove(&key) {
                    Ok(()) => removed += 1,
                    Err(e) if is_errno(&e, libc::ENOENT) => {}
                    Err(e) => return Err(map_error(CONDITIONS_MAP, "delete")(e)),
                }
            }
        }
        Ok(removed)
    }

    /// Removes pod records whose owner is gone (left by an ADD that raced
    /// with the DEL of the same owner). Returns how many it removed.
    pub fn prune_pods(&mut self) -> Result<usize, StoreError> {
        let Some(pods) = self.pods.as_mut() else {
            return Ok(0);
        };
        let ids = pods
            .keys()
            .collect::<Result<Vec<u64>, _>>()
            .map_err(map_error("owner_pods", "iterate"))?;
        let mut removed = 0;
        for id in ids {
            if self.owners.get(&id, 0).is_err() {
                let pods = self.pods.as_mut().expect("checked above");
                match pods.remove(&id) {
                    Ok(()) => removed += 1,
                    Err(e) if is_errno(&e, libc::ENOENT) => {}
                    Err(e) => return Err(map_error("owner_pods", "delete")(e)),
                }
            }
        }
        Ok(removed)
    }

    /// Removes everything owner `id` holds, like DEL of that owner (for the
    /// operator's `gc`, which knows owners by ID). Returns how many mappings
    /// it removed.
    pub fn remove_owner(&mut self, id: u64) -> Result<usize, StoreError> {
        self.release_id(id)
    }

    /// Mappings whose owner record is gone, by owner ID: nobody's DEL will
    /// ever remove them, and every ADD of their ports fails. One walk of
    /// the mappings map. Read-only.
    pub fn orphans(&self) -> Result<BTreeMap<u64, Vec<MappingKey>>, StoreError> {
        let mut known = std::collections::HashMap::new();
        let mut orphans: BTreeMap<u64, Vec<MappingKey>> = BTreeMap::new();
        for entry in &self.mappings {
            let (key, value) = entry.map_err(map_error("mappings", "iterate"))?;
            let has_record = match known.get(&value.owner_id) {
                Some(has) => *has,
                None => {
                    let has = match self.owners.get(&value.owner_id, 0) {
                        Ok(_) => true,
                        Err(e) if is_errno(&e, libc::ENOENT) => false,
                        Err(e) => return Err(map_error("owners", "lookup")(e)),
                    };
                    known.insert(value.owner_id, has);
                    has
                }
            };
            if !has_record {
                orphans.entry(value.owner_id).or_default().push(key);
            }
        }
        Ok(orphans)
    }

    /// Reclaims orphaned mappings (see [`Self::orphans`]) first seen at
    /// least `grace` seconds before `now`; records when the others were
    /// first seen, in `orphans_seen`, for a later GC. The grace covers the
    /// moments an orphan is legitimately there: an ADD undoing its writes
    /// after a concurrent GC removed its owner. Returns what it reclaimed
    /// (owner ID, mappings) and what it still waits for (owner ID, first
    /// seen).
    pub fn reclaim_orphans(
        &mut self,
        layout: &PinLayout,
        grace: u64,
        now: u64,
    ) -> Result<OrphanReclaim, StoreError> {
        let orphans = self.orphans()?;
        let mut outcome = OrphanReclaim::default();
        if orphans.is_empty() && self.orphans.is_none() {
            return Ok(outcome);
        }
        if self.orphans.is_none() {
            let (map, _) = crate::dataplane::pinned::maps::create_user_map::<u64, u64>(
                layout,
                &crate::dataplane::pinned::maps::ORPHANS,
            )
            .map_err(|source| StoreError::UserMap {
                map: portmap_common::ORPHANS_MAP,
                source: Box::new(source),
            })?;
            self.orphans = Some(map);
        }
        let seen_map = self.orphans.as_mut().expect("created above");
        // Sightings of owners that are no longer orphaned: forget them.
        let stale: Vec<u64> = seen_map
            .keys()
            .filter_map(Result::ok)
            .filter(|id| !orphans.contains_key(id))
            .collect();
        for id in stale {
            let _ = seen_map.remove(&id);
        }
        for (id, keys) in orphans {
            let seen_map = self.orphans.as_mut().expect("created above");
            let first_seen = match seen_map.get(&id, 0) {
                Ok(first_seen) => first_seen,
                Err(_) => {
                    // BPF_NOEXIST: of two GCs seeing it first, the earlier time stays.
                    let _ = seen_map.insert(id, now, BPF_NOEXIST);
                    seen_map.get(&id, 0).unwrap_or(now)
                }
            };
            if !orphan_due(first_seen, now, grace) {
                outcome.waiting.push((id, first_seen));
                continue;
            }
            let mut removed = 0;
            for key in &keys {
                // The record may be back (the container was added again):
                // then these are its mappings, not orphans.
                if self.owners.get(&id, 0).is_ok() {
                    break;
                }
                if self.remove_mapping_if_owned(key, id)? {
                    removed += 1;
                }
            }
            if self.owners.get(&id, 0).is_err() {
                // Whatever index and label the lost owner left go too.
                let slots = self.slots(id)?.len() as u32;
                for slot in (0..slots).rev() {
                    let _ = self.owner_slots.remove(&slot_key(id, slot));
                }
                if let Some(pods) = self.pods.as_mut() {
                    let _ = pods.remove(&id);
                }
                if let Some(sandboxes) = self.sandboxes.as_mut() {
                    let _ = sandboxes.remove(&id);
                }
                let _ = self.remove_all_conditions(id);
            }
            if let Some(seen_map) = self.orphans.as_mut() {
                let _ = seen_map.remove(&id);
            }
            outcome.reclaimed.push((id, removed));
        }
        Ok(outcome)
    }

    /// GC (CNI 1.1): removes every owner of `network` that is not in `valid`.
    /// Returns the container IDs it removed. Owners are matched whole (see
    /// [`record_is`]), also those an older build recorded with a cut name;
    /// one whose record cannot say whether it is of `network` (both names
    /// cut) is left alone unless listed: removing another network's owner
    /// is worse than keeping one.
    pub fn collect_garbage(
        &mut self,
        network: &str,
        valid: &[Attachment],
    ) -> Result<Vec<String>, StoreError> {
        let mut removed = Vec::new();
        for (id, record) in self.owners()? {
            let ours = record_network_is(id, &record, network);
            if ours == Some(false) {
                continue;
            }
            let keep = valid.iter().any(|a| {
                let listed = Owner {
                    network: network.to_owned(),
                    container_id: a.container_id.clone(),
                    ifname: a.ifname.clone(),
                };
                record_is(id, &record, &listed)
            });
            let (_, container_id, _) = record_strings(&record);
            if keep {
                continue;
            }
            if ours.is_none() {
                log::warn!(
                    "GC of network {network} leaves owner {id:016x} (container {container_id}…) alone: an older build recorded both its names cut, so it may be another network's; a DEL with its full container ID removes it"
                );
                continue;
            }
            self.release_id(id)?;
            removed.push(container_id);
        }
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orphans_wait_out_the_grace_period() {
        assert!(!orphan_due(100, 100, ORPHAN_GRACE_SECS), "just seen");
        assert!(!orphan_due(
            100,
            100 + ORPHAN_GRACE_SECS - 1,
            ORPHAN_GRACE_SECS
        ));
        assert!(orphan_due(100, 100 + ORPHAN_GRACE_SECS, ORPHAN_GRACE_SECS));
        assert!(orphan_due(100, 100, 0), "--min-age 0 reclaims at once");
        assert!(!orphan_due(200, 100, 10), "a clock that went back waits");
    }
}
