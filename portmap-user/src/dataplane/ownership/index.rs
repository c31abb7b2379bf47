//! Who holds what: the owner records (`owners`), each owner's index of
//! its mappings (`owner_slots`) and the mappings that name an owner, with
//! the map update flags every step of the protocol uses.

use portmap_common::{MAX_SLOTS_PER_OWNER, MappingKey, OwnerRecord, OwnerSlotKey};

use super::error::{StoreError, map_error};
use super::records::{owner_id, record_is};
use super::store::Store;
use crate::dataplane::pinned::maps::is_errno;
use crate::model::{MAX_MAPPINGS_MAX, Owner};

// One owner may hold every entry of the largest mappings map.
const _: () = assert!(MAX_MAPPINGS_MAX <= MAX_SLOTS_PER_OWNER);

// The flags of bpf_map_update_elem, which aya takes as a plain u64.
pub(super) const BPF_ANY: u64 = 0;
pub(super) const BPF_NOEXIST: u64 = 1;
pub(super) const BPF_EXIST: u64 = 2;

pub(super) fn slot_key(owner_id: u64, slot: u32) -> OwnerSlotKey {
    OwnerSlotKey {
        owner_id,
        slot,
        _pad0: 0,
    }
}

/// One step of rewriting an owner's index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlotStep {
    Write(u32, MappingKey),
    Delete(u32),
}

/// The steps that turn index `index` (slot 0 first) into `keep`, an ordered
/// subsequence of it, in order: see [`Store::compact_slots`] for why every
/// prefix of them leaves each kept key in a contiguous run of slots.
fn compaction(index: &[MappingKey], keep: &[MappingKey]) -> Vec<SlotStep> {
    let mut steps = Vec::new();
    for (slot, key) in keep.iter().enumerate() {
        if index.get(slot) != Some(key) {
            steps.push(SlotStep::Write(slot as u32, *key));
        }
    }
    for slot in (keep.len()..index.len()).rev() {
        steps.push(SlotStep::Delete(slot as u32));
    }
    steps
}

impl Store {
    /// The mapping keys in an owner's index, slot 0 first.
    pub(super) fn slots(&self, owner_id: u64) -> Result<Vec<MappingKey>, StoreError> {
        let mut keys = Vec::new();
        for slot in 0..MAX_SLOTS_PER_OWNER {
            match self.owner_slots.get(&slot_key(owner_id, slot), 0) {
                Ok(key) => keys.push(key),
                Err(e) if is_errno(&e, libc::ENOENT) => break,
                Err(e) => return Err(map_error("owner_slots", "lookup")(e)),
            }
        }
        Ok(keys)
    }

    pub(super) fn owned_by(&self, key: &MappingKey, owner_id: u64) -> Result<bool, StoreError> {
        match self.mappings.get(key, 0) {
            Ok(value) => Ok(value.owner_id == owner_id),
            Err(e) if is_errno(&e, libc::ENOENT) => Ok(false),
            Err(e) => Err(map_error("mappings", "lookup")(e)),
        }
    }

    /// Deletes `key` if `owner_id` holds it, and raises the mappings epoch
    /// when it did (the programs' cached copies of it go stale). Returns
    /// whether this call deleted it.
    pub(super) fn remove_mapping_if_owned(
        &mut self,
        key: &MappingKey,
        owner_id: u64,
    ) -> Result<bool, StoreError> {
        if !self.owned_by(key, owner_id)? {
            return Ok(false);
        }
        match self.mappings.remove(key) {
            Ok(()) => {
                self.epoch.raise();
                Ok(true)
            }
            Err(e) if is_errno(&e, libc::ENOENT) => Ok(false),
            Err(e) => Err(map_error("mappings", "delete")(e)),
        }
    }

    /// Rewrites the index of `id` from `index` (what it holds now, slot 0
    /// first) to `keep`, an ordered subsequence of it. Ascending: slot `i`
    /// gets `keep[i]`, which sits at a slot `>= i` not yet overwritten, so
    /// a crash at any point leaves every held mapping in a contiguous
    /// prefix of slots (some maybe twice, which DEL tolerates). The tail is
    /// deleted from the last slot down, keeping the prefix contiguous.
    pub(super) fn compact_slots(
        &mut self,
        id: u64,
        index: &[MappingKey],
        keep: &[MappingKey],
    ) -> Result<(), StoreError> {
        for step in compaction(index, keep) {
            match step {
                SlotStep::Write(slot, key) => self
                    .owner_slots
                    .insert(slot_key(id, slot), key, BPF_ANY)
                    .map_err(map_error("owner_slots", "update"))?,
                SlotStep::Delete(slot) => match self.owner_slots.remove(&slot_key(id, slot)) {
                    Ok(()) => {}
                    Err(e) if is_errno(&e, libc::ENOENT) => {}
                    Err(e) => return Err(map_error("owner_slots", "delete")(e)),
                },
            }
        }
        Ok(())
    }

    /// Every owner with its record.
    pub fn owners(&self) -> Result<Vec<(u64, OwnerRecord)>, StoreError> {
        self.owners
            .iter()
            .collect::<Result<Vec<_>, _>>()
            .map_err(map_error("owners", "iterate"))
    }

    /// Whether `owner` has an owner record (exactly its own, see
    /// [`record_is`]). Read-only.
    pub fn has_owner(&self, owner: &Owner) -> Result<bool, StoreError> {
        let id = owner_id(owner);
        match self.owners.get(&id, 0) {
            Ok(record) => Ok(record_is(id, &record, owner)),
            Err(e) if is_errno(&e, libc::ENOENT) => Ok(false),
            Err(e) => Err(map_error("owners", "lookup")(e)),
        }
    }

    /// The mapping keys `owner` has claimed (from its index; some may since
    /// have been released). Read-only.
    pub fn owned_keys(&self, owner: &Owner) -> Result<Vec<MappingKey>, StoreError> {
        self.slots(owner_id(owner))
    }

    /// The index of owner `id`: the mapping keys of its slots, slot 0 first.
    /// Read-only.
    pub fn owner_index(&self, id: u64) -> Result<Vec<MappingKey>, StoreError> {
        self.slots(id)
    }

    /// Owner IDs that hold at least one mapping. Read-only; one walk of the
    /// mappings map.
    pub fn owners_with_mappings(&self) -> Result<std::collections::HashSet<u64>, StoreError> {
        let mut held = std::collections::HashSet::new();
        for entry in &self.mappings {
            let (_, value) = entry.map_err(map_error("mappings", "iterate"))?;
            held.insert(value.owner_id);
        }
        Ok(held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use portmap_common::{FAMILY_V4, PROTO_TCP};

    fn port(port: u16) -> MappingKey {
        MappingKey {
            host_port_be: port.to_be(),
            proto: PROTO_TCP,
            family: FAMILY_V4,
            ..MappingKey::default()
        }
    }

    #[test]
    fn compaction_never_loses_a_kept_key_at_any_step() {
        let index: Vec<MappingKey> = (1..=8).map(port).collect();
        // Every subsequence of the index (as kept by a re-ADD or a rollback).
        for mask in 0u32..(1 << index.len()) {
            let keep: Vec<MappingKey> = index
                .iter()
                .enumerate()
                .filter(|(i, _)| mask & (1 << i) != 0)
                .map(|(_, k)| *k)
                .collect();
            let steps = compaction(&index, &keep);
            let mut slots: Vec<Option<MappingKey>> = index.iter().copied().map(Some).collect();
            for (done, step) in steps.iter().enumerate() {
                match *step {
                    SlotStep::Write(slot, key) => slots[slot as usize] = Some(key),
                    SlotStep::Delete(slot) => slots[slot as usize] = None,
                }
                // What DEL finds after a crash here: the contiguous prefix.
                let found: Vec<MappingKey> = slots.iter().map_while(|s| *s).collect();
                for key in &keep {
                    assert!(
                        found.contains(key),
                        "keep {keep:?}: {key:?} unreachable after {} step(s)",
                        done + 1
                    );
                }
            }
            let found: Vec<MappingKey> = slots.iter().map_while(|s| *s).collect();
            assert_eq!(found, keep, "the index ends as exactly the kept keys");
            assert!(slots[keep.len()..].iter().all(Option::is_none));
        }
    }
}
