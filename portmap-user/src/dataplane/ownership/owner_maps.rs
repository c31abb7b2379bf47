//! The maps keyed by owner ID beside `owners`: the pod identity
//! (`owner_pods`) and the sandbox (`owner_sandboxes`) that label an owner,
//! and the owner's conditions (`conditions`) that its mappings point to.

use portmap_common::{
    FAMILY_V4, FAMILY_V6, PodRecord,
    conditions::{CONDITIONS_MAP, ConditionKey, Conditions},
};

use super::error::{StoreError, map_error};
use super::index::{BPF_ANY, BPF_EXIST};
use super::records::{owner_id, pod_identity, pod_record, sandbox_of_record, sandbox_record};
use super::store::Store;
use crate::dataplane::pinned::maps::is_errno;
use crate::model::{Owner, PodIdentity, Sandbox};

pub(super) fn condition_key(owner_id: u64, family: u8) -> ConditionKey {
    ConditionKey {
        owner_id,
        family,
        _pad0: [0; 7],
    }
}

impl Store {
    /// Records `identity` for owner `id` (an empty one leaves what an earlier
    /// ADD recorded). Best effort: it only labels the owner in `list`, logs
    /// and conflict messages, so a failure is logged and the ADD goes on.
    pub(super) fn record_pod(&mut self, id: u64, identity: &PodIdentity) {
        // The pod UID alone is kept in the sandbox record.
        if pod_record(identity) == PodRecord::default() {
            return;
        }
        let Some(pods) = self.pods.as_mut() else {
            log::warn!("pod identity of owner {id:016x} not recorded: the pod map is missing");
            return;
        };
        if let Err(error) = pods.insert(id, pod_record(identity), BPF_ANY) {
            log::warn!("pod identity of owner {id:016x} not recorded: {error}");
        }
    }

    /// The pod identity recorded for owner `id` (empty when none is), with
    /// the pod UID of its sandbox record.
    pub fn pod_of(&self, id: u64) -> PodIdentity {
        let mut identity = self
            .pods
            .as_ref()
            .and_then(|pods| pods.get(&id, 0).ok())
            .map(|record| pod_identity(&record))
            .unwrap_or_default();
        identity.pod_uid = self.sandbox_of(id).and_then(|sandbox| sandbox.pod_uid);
        identity
    }

    /// Records what proves owner `id`'s container alive, and its pod UID.
    /// Call once the claim holds (the owner record is this owner's). Best
    /// effort, like the pod record: without it the owner is never judged
    /// gone, which is the safe side.
    pub fn record_sandbox(&mut self, owner: &Owner, sandbox: &Sandbox) {
        let id = owner_id(owner);
        let Some(map) = self.sandboxes.as_mut() else {
            log::warn!(
                "sandbox of {} not recorded: the sandbox map is missing",
                owner.container_id
            );
            return;
        };
        if let Err(error) = map.insert(id, sandbox_record(sandbox), BPF_ANY) {
            log::warn!("sandbox of {} not recorded: {error}", owner.container_id);
        }
    }

    /// The sandbox recorded for owner `id`, if any.
    pub fn sandbox_of(&self, id: u64) -> Option<Sandbox> {
        let record = self.sandboxes.as_ref()?.get(&id, 0).ok()?;
        Some(sandbox_of_record(&record))
    }

    /// Rewrites an existing sandbox record (`gone_since`); an owner removed
    /// meanwhile has none to rewrite.
    pub(super) fn update_sandbox(&mut self, id: u64, sandbox: &Sandbox) {
        if let Some(map) = self.sandboxes.as_mut()
            && let Err(error) = map.insert(id, sandbox_record(sandbox), BPF_EXIST)
            && !is_errno(&error, libc::ENOENT)
        {
            log::warn!("sandbox record of owner {id:016x} not updated: {error}");
        }
    }

    /// Writes the owner's conditions (whole entries: the programs read
    /// either the old or the new one). Refuses when the map is missing: a
    /// configuration with conditions must never be served without them.
    pub(super) fn write_conditions(
        &mut self,
        id: u64,
        conditions: &[(u8, Conditions)],
    ) -> Result<(), StoreError> {
        if conditions.is_empty() {
            return Ok(());
        }
        let Some(map) = self.conditions.as_mut() else {
            return Err(StoreError::NoConditionsMap);
        };
        for (family, entry) in conditions {
            map.insert(condition_key(id, *family), *entry, BPF_ANY)
                .map_err(map_error(CONDITIONS_MAP, "update"))?;
        }
        Ok(())
    }

    /// Removes the owner's conditions of `family`, if any.
    pub(super) fn remove_conditions(&mut self, id: u64, family: u8) -> Result<(), StoreError> {
        let Some(map) = self.conditions.as_mut() else {
            return Ok(());
        };
        match map.remove(&condition_key(id, family)) {
            Ok(()) => Ok(()),
            Err(e) if is_errno(&e, libc::ENOENT) => Ok(()),
            Err(e) => Err(map_error(CONDITIONS_MAP, "delete")(e)),
        }
    }

    pub(super) fn remove_all_conditions(&mut self, id: u64) -> Result<(), StoreError> {
        self.remove_conditions(id, FAMILY_V4)?;
        self.remove_conditions(id, FAMILY_V6)
    }

    /// The owner's conditions of `family`, if any (for `list` and tests).
    pub fn conditions_of(&self, id: u64, family: u8) -> Option<Conditions> {
        self.conditions
            .as_ref()?
            .get(&condition_key(id, family), 0)
            .ok()
    }
}
