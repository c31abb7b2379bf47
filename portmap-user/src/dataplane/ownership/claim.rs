//! The claim protocol of ADD, DEL and CHECK (the module doc of
//! `ownership` gives its steps): claim a set of translations all or
//! nothing, release an owner, verify what it holds.

use portmap_common::{
    FAMILY_V4, FAMILY_V6, MAX_SLOTS_PER_OWNER, MappingKey, MappingValue, OWNER_SANDBOXES_MAP,
    OwnerRecord, PortKey, SPECIFIC_PORTS_MAP, conditions::Conditions, owner_flags,
};

use super::error::{HolderDisplay, StoreError, map_error};
use super::index::{BPF_ANY, BPF_EXIST, BPF_NOEXIST, slot_key};
use super::records::{now_unix, owner_id, owner_record, record_is, record_strings, same_identity};
use super::store::Store;
use super::translation::{KeyDisplay, Translation};
use crate::dataplane::pinned::maps::is_errno;
use crate::dataplane::pinned::pin::PinLayout;
use crate::model::{Owner, PodIdentity};

impl Store {
    /// Claims every translation for `owner`, all or nothing. Re-ADD by the
    /// same owner is idempotent; a changed set replaces the old one (what
    /// the old set held and the new one does not is released first, so the
    /// new set only has to fit on its own).
    ///
    /// `conditions` holds the owner's conditions by family (see
    /// `portmap_common::conditions`): written before any mapping that
    /// names them, and those of the other family removed once the claim
    /// holds (a re-ADD whose configuration dropped them).
    pub fn claim(
        &mut self,
        owner: &Owner,
        identity: &PodIdentity,
        translations: &[Translation],
        conditions: &[(u8, Conditions)],
    ) -> Result<(), StoreError> {
        let id = owner_id(owner);
        let (new_owner, ours) = self.claim_owner(owner, id)?;
        self.record_pod(id, identity);
        if let Err(error) = self.write_conditions(id, conditions) {
            if new_owner && let Err(rollback) = self.release_id(id) {
                log::error!(
                    "rollback after failed ADD of {} left entries behind: {rollback}",
                    owner.container_id
                );
            }
            return Err(error);
        }

        let existing = self.slots(id)?;
        let kept: Vec<MappingKey> = existing
            .iter()
            .copied()
            .filter(|key| translations.iter().any(|t| t.key == *key))
            .collect();
        if kept.len() != existing.len() {
            for key in existing.iter().filter(|key| !kept.contains(key)) {
                self.remove_mapping_if_owned(key, id)?;
            }
            self.compact_slots(id, &existing, &kept)?;
        }

        let mut claimed = Vec::new();
        let mut slots = kept.len() as u32;
        let result = self
            .mark_specific_ports(translations)
            .map(|()| self.mark_mapped_ports(id, translations))
            .and_then(|()| self.claim_all(owner, id, translations, &kept, &mut claimed, &mut slots))
            .and_then(|()| self.check_overlaps(id, translations))
            .and_then(|()| self.still_owner(owner, id, &ours));
        let Err(error) = result else {
            // Conditions of a family this configuration no longer has: no
            // mapping names them any more.
            for family in [FAMILY_V4, FAMILY_V6] {
                if !conditions.iter().any(|(with, _)| *with == family) {
                    self.remove_conditions(id, family)?;
                }
            }
            return Ok(());
        };
        // Roll back: a new owner leaves nothing behind at all; an existing
        // one loses only what this call added; an owner that a DEL or GC
        // removed meanwhile loses everything this call wrote, found by what
        // it wrote (the remover may have read the index before we did).
        let rollback = match error {
            StoreError::Removed { .. } => self.forget_written(id, translations, slots),
            _ if new_owner => self.release_id(id).map(|_| ()),
            _ => claimed
                .iter()
                .try_for_each(|key| self.remove_mapping_if_owned(key, id).map(|_| ()))
                .and_then(|()| {
                    let index = self.slots(id)?;
                    let mut held = Vec::with_capacity(index.len());
                    for key in &index {
                        if self.owned_by(key, id)? {
                            held.push(*key);
                        }
                    }
                    self.compact_slots(id, &index, &held)
                }),
        };
        if let Err(rollback_error) = rollback {
            log::error!(
                "rollback after failed ADD of {} left entries behind: {rollback_error}",
                owner.container_id
            );
        }
        Err(error)
    }

    /// Creates the owner record, or finds this owner's. Returns whether it
    /// is new and the record as it is now (for [`Self::still_owner`]).
    fn claim_owner(&mut self, owner: &Owner, id: u64) -> Result<(bool, OwnerRecord), StoreError> {
        let record = owner_record(owner, now_unix());
        // Twice at most: once more after finishing a removal that a killed
        // DEL or GC left half done.
        for _ in 0..2 {
            match self.owners.insert(id, record, BPF_NOEXIST) {
                Ok(()) => return Ok((true, record)),
                Err(e) if is_errno(&e, libc::EEXIST) => {}
                Err(e) => return Err(map_error("owners", "insert")(e)),
            }
            let existing = match self.owners.get(&id, 0) {
                Ok(existing) => existing,
                Err(e) if is_errno(&e, libc::ENOENT) => continue,
                Err(e) => return Err(map_error("owners", "lookup")(e)),
            };
            if !same_identity(&existing, &record) {
                let (network, container_id, ifname) = record_strings(&existing);
                return Err(StoreError::OwnerCollision {
                    owner_id: id,
                    owner: format!("{}/{}/{}", owner.network, owner.container_id, owner.ifname),
                    existing: format!("{network}/{container_id}/{ifname}"),
                });
            }
            if existing.flags & owner_flags::DYING == 0 {
                return Ok((false, existing));
            }
            // A DEL or GC of this very owner is running or was killed: finish
            // it (idempotent) and start afresh. Should it still be running,
            // it may delete our new record, which `still_owner` then sees.
            self.release_id(id)?;
        }
        Err(StoreError::Removed {
            container_id: owner.container_id.clone(),
        })
    }

    /// The last step of a claim: the owner record must still be the one the
    /// claim started with. A DEL or GC marks a record dying before it reads
    /// the index; so either it read our complete index (we got here first),
    /// or we see the mark or the missing record here and undo our writes.
    fn still_owner(&self, owner: &Owner, id: u64, ours: &OwnerRecord) -> Result<(), StoreError> {
        match self.owners.get(&id, 0) {
            Ok(record) if record == *ours => Ok(()),
            Ok(_) => Err(StoreError::Removed {
                container_id: owner.container_id.clone(),
            }),
            Err(e) if is_errno(&e, libc::ENOENT) => Err(StoreError::Removed {
                container_id: owner.container_id.clone(),
            }),
            Err(e) => Err(map_error("owners", "lookup")(e)),
        }
    }

    /// Undoes a claim whose owner was removed while it ran: every mapping
    /// of `translations` still naming the owner, and index slots 0 to
    /// `slots` (the remover deleted the others, maybe not these).
    fn forget_written(
        &mut self,
        id: u64,
        translations: &[Translation],
        slots: u32,
    ) -> Result<(), StoreError> {
        for translation in translations {
            self.remove_mapping_if_owned(&translation.key, id)?;
        }
        self.remove_all_conditions(id)?;
        for slot in (0..slots).rev() {
            match self.owner_slots.remove(&slot_key(id, slot)) {
                Ok(()) => {}
                Err(e) if is_errno(&e, libc::ENOENT) => {}
                Err(e) => return Err(map_error("owner_slots", "delete")(e)),
            }
        }
        Ok(())
    }

    fn claim_all(
        &mut self,
        owner: &Owner,
        id: u64,
        translations: &[Translation],
        kept: &[MappingKey],
        claimed: &mut Vec<MappingKey>,
        next_slot: &mut u32,
    ) -> Result<(), StoreError> {
        for translation in translations {
            let value = translation.value(id);
            if !kept.contains(&translation.key) {
                if *next_slot >= MAX_SLOTS_PER_OWNER {
                    let error = StoreError::TooManySlots {
                        container_id: owner.container_id.clone(),
                        max: MAX_SLOTS_PER_OWNER,
                    };
                    return Err(error);
                }
                // The slot first: a mapping must never exist that its owner
                // cannot find again after a crash.
                if let Err(e) =
                    self.owner_slots
                        .insert(slot_key(id, *next_slot), translation.key, BPF_ANY)
                {
                    return Err(map_error("owner_slots", "insert")(e));
                }
                *next_slot += 1;
            }
            match self.claim_one(translation.key, value) {
                Ok(true) => claimed.push(translation.key),
                Ok(false) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Claims one key; `Ok(true)` when this call created the entry.
    fn claim_one(&mut self, key: MappingKey, value: MappingValue) -> Result<bool, StoreError> {
        // A holder may vanish between our insert and our lookup: retry a few times.
        for _ in 0..3 {
            match self.mappings.insert(key, value, BPF_NOEXIST) {
                Ok(()) => return Ok(true),
                Err(e) if is_errno(&e, libc::EEXIST) => {}
                Err(e) => return Err(map_error("mappings", "insert")(e)),
            }
            let current = match self.mappings.get(&key, 0) {
                Ok(current) => current,
                Err(e) if is_errno(&e, libc::ENOENT) => continue,
                Err(e) => return Err(map_error("mappings", "lookup")(e)),
            };
            if current.owner_id != value.owner_id {
                let record = self.owners.get(&current.owner_id, 0).ok().map(Box::new);
                return Err(StoreError::Conflict {
                    key: KeyDisplay(key),
                    holder: Box::new(HolderDisplay {
                        record,
                        pod: self.pod_of(current.owner_id),
                    }),
                });
            }
            if current == value {
                return Ok(false);
            }
            // Our own entry, pointing elsewhere (e.g. the container got a new
            // address): re-point it in place.
            match self.mappings.insert(key, value, BPF_EXIST) {
                Ok(()) => {
                    self.epoch.raise();
                    return Ok(false);
                }
                Err(e) if is_errno(&e, libc::ENOENT) => continue,
                Err(e) => return Err(map_error("mappings", "update")(e)),
            }
        }
        Err(StoreError::Conflict {
            key: KeyDisplay(key),
            holder: Box::new(HolderDisplay {
                record: None,
                pod: PodIdentity::default(),
            }),
        })
    }

    /// Removes everything `owner` holds. Idempotent; returns how many
    /// mappings it removed.
    pub fn release(&mut self, owner: &Owner) -> Result<usize, StoreError> {
        let id = owner_id(owner);
        // The record under this ID is another owner's (IDs are hashes, and
        // ADD refuses a colliding owner): nothing here is the caller's.
        if let Ok(record) = self.owners.get(&id, 0)
            && !record_is(id, &record, owner)
        {
            let (network, container_id, ifname) = record_strings(&record);
            log::warn!(
                "owner ID {id:016x} of container {} is held by container {container_id} (network {network}, interface {ifname}): not removed",
                owner.container_id
            );
            return Ok(0);
        }
        self.release_id(id)
    }

    pub(super) fn release_id(&mut self, id: u64) -> Result<usize, StoreError> {
        self.mark_dying(id)?;
        let keys = self.slots(id)?;
        let mut removed = 0;
        for (slot, key) in keys.iter().enumerate().rev() {
            if self.remove_mapping_if_owned(key, id)? {
                removed += 1;
            }
            match self.owner_slots.remove(&slot_key(id, slot as u32)) {
                Ok(()) => {}
                Err(e) if is_errno(&e, libc::ENOENT) => {}
                Err(e) => return Err(map_error("owner_slots", "delete")(e)),
            }
        }
        // The conditions after the mappings that name them.
        self.remove_all_conditions(id)?;
        // The pod record before the owner record: a DEL interrupted here
        // leaves an owner without a label, never a label without an owner.
        if let Some(pods) = self.pods.as_mut() {
            match pods.remove(&id) {
                Ok(()) => {}
                Err(e) if is_errno(&e, libc::ENOENT) => {}
                Err(e) => return Err(map_error("owner_pods", "delete")(e)),
            }
        }
        if let Some(sandboxes) = self.sandboxes.as_mut() {
            match sandboxes.remove(&id) {
                Ok(()) => {}
                Err(e) if is_errno(&e, libc::ENOENT) => {}
                Err(e) => return Err(map_error(OWNER_SANDBOXES_MAP, "delete")(e)),
            }
        }
        match self.owners.remove(&id) {
            Ok(()) => {}
            Err(e) if is_errno(&e, libc::ENOENT) => {}
            Err(e) => return Err(map_error("owners", "delete")(e)),
        }
        Ok(removed)
    }

    /// Marks owner `id` dying (one atomic update) before its index is read,
    /// so a concurrent ADD of it undoes its own writes (see `still_owner`).
    fn mark_dying(&mut self, id: u64) -> Result<(), StoreError> {
        let mut record = match self.owners.get(&id, 0) {
            Ok(record) => record,
            Err(e) if is_errno(&e, libc::ENOENT) => return Ok(()),
            Err(e) => return Err(map_error("owners", "lookup")(e)),
        };
        if record.flags & owner_flags::DYING != 0 {
            return Ok(());
        }
        record.flags |= owner_flags::DYING;
        match self.owners.insert(id, record, BPF_EXIST) {
            Ok(()) => Ok(()),
            // Removed meanwhile: nothing left to mark.
            Err(e) if is_errno(&e, libc::ENOENT) => Ok(()),
            Err(e) => Err(map_error("owners", "update")(e)),
        }
    }

    /// Opens the map of ports with specific claims, creating it on the first
    /// ADD of this build. The build that creates it fills it from the
    /// mappings already there (made by an older build), so no specific
    /// mapping escapes a later wildcard's check.
    fn specific_ports(&mut self, layout: &PinLayout) -> Result<(), StoreError> {
        if self.specific_ports.is_some() {
            return Ok(());
        }
        let (mut map, created) = crate::dataplane::pinned::maps::create_user_map::<PortKey, u32>(
            layout,
            &crate::dataplane::pinned::maps::SPECIFIC_PORTS,
        )
        .map_err(|source| StoreError::UserMap {
            map: SPECIFIC_PORTS_MAP,
            source: Box::new(source),
        })?;
        if created {
            for entry in &self.mappings {
                let (key, _) = entry.map_err(map_error("mappings", "iterate"))?;
                if key.host_addr_be != [0; 4] {
                    map.insert(PortKey::of(&key), 1, BPF_ANY)
                        .map_err(map_error(SPECIFIC_PORTS_MAP, "insert"))?;
                }
            }
        }
        self.specific_ports = Some(map);
        Ok(())
    }

    /// Prepares a claim: opens (or creates) the maps it needs beyond the
    /// ones the eBPF object pins.
    pub fn prepare_claim(&mut self, layout: &PinLayout) -> Result<(), StoreError> {
        self.specific_ports(layout)
    }

    /// Records the port of every specific translation in `specific_ports`,
    /// before any is claimed (the first half of the overlap handshake, see
    /// [`Self::check_overlaps`]).
    fn mark_specific_ports(&mut self, translations: &[Translation]) -> Result<(), StoreError> {
        let Some(map) = self.specific_ports.as_mut() else {
            return Ok(());
        };
        for translation in translations {
            if translation.key.host_addr_be != [0; 4] {
                map.insert(PortKey::of(&translation.key), 1, BPF_ANY)
                    .map_err(map_error(SPECIFIC_PORTS_MAP, "insert"))?;
            }
        }
        Ok(())
    }

    /// Marks the ports of every translation in the programs' port filter,
    /// before any is claimed (see `maps::MappedPorts`).
    fn mark_mapped_ports(&self, id: u64, translations: &[Translation]) {
        if let Some(ports) = self.mapped_ports.as_ref() {
            for translation in translations {
                ports.mark(&translation.key, &translation.value(id));
            }
        }
    }

    /// A wildcard and a specific address on the same port, protocol and
    /// family exclude each other, as bind() and kube-scheduler's NodePorts
    /// filter treat them. Run after this claim's mappings are in the map:
    /// each side writes first and looks for the other second, so of two
    /// racing claims at least one sees the other (and rolls back; both may,
    /// never neither). A specific claim looks up the family's wildcard key;
    /// a wildcard claim walks the mappings map once, and only when a
    /// specific address was ever claimed on one of its ports.
    fn check_overlaps(&self, id: u64, translations: &[Translation]) -> Result<(), StoreError> {
        let mut wildcard_ports = std::collections::BTreeMap::new();
        for translation in translations {
            let key = translation.key;
            if key.host_addr_be == [0; 4] {
                wildcard_ports.insert(PortKey::of(&key), key);
                continue;
            }
            let wildcard = MappingKey {
                host_addr_be: [0; 4],
                ..key
            };
            match self.mappings.get(&wildcard, 0) {
                Ok(value) if value.owner_id != id => {
                    return Err(self.overlap(key, wildcard, value.owner_id));
                }
                Ok(_) => {}
                Err(e) if is_errno(&e, libc::ENOENT) => {}
                Err(e) => return Err(map_error("mappings", "lookup")(e)),
            }
        }
        let marked = |port: &PortKey| match &self.specific_ports {
            Some(map) => map.get(port, 0).is_ok(),
            // No map (it could not be created): look everywhere.
            None => true,
        };
        wildcard_ports.retain(|port, _| marked(port));
        if wildcard_ports.is_empty() {
            return Ok(());
        }
        for entry in &self.mappings {
            let (key, value) = entry.map_err(map_error("mappings", "iterate"))?;
            if key.host_addr_be == [0; 4] || value.owner_id == id {
                continue;
            }
            if let Some(wildcard) = wildcard_ports.get(&PortKey::of(&key)) {
                return Err(self.overlap(*wildcard, key, value.owner_id));
            }
        }
        Ok(())
    }

    fn overlap(&self, key: MappingKey, held: MappingKey, holder: u64) -> StoreError {
        StoreError::Overlap {
            key: KeyDisplay(key),
            held: KeyDisplay(held),
            holder: Box::new(HolderDisplay {
                record: self.owners.get(&holder, 0).ok().map(Box::new),
                pod: self.pod_of(holder),
            }),
        }
    }

    /// Checks that `owner` holds exactly the entries `translations` describe.
    pub fn verify(&self, owner: &Owner, translations: &[Translation]) -> Result<(), StoreError> {
        let id = owner_id(owner);
        for translation in translations {
            let ok = match self.mappings.get(&translation.key, 0) {
                Ok(value) => value == translation.value(id),
                Err(e) if is_errno(&e, libc::ENOENT) => false,
                Err(e) => return Err(map_error("mappings", "lookup")(e)),
            };
            if !ok {
                return Err(StoreError::Missing {
                    key: KeyDisplay(translation.key),
                    container_id: owner.container_id.clone(),
                });
            }
        }
        Ok(())
    }
}
