//! Where the owners' indexes and the mappings map disagree: what `status`
//! reports as lost or stuck.

use std::collections::HashMap as StdHashMap;

use portmap_common::{MappingKey, OwnerRecord};

use super::shared::{InspectError, read_error, require_installed};
use crate::dataplane::{
    ownership::{Store, record_strings},
    pin::PinLayout,
};

/// What differs between the owners' indexes (`owner_slots`) and the
/// mappings map: what `status` reports as lost or stuck.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ownership {
    /// Mappings whose owner record is gone, by owner ID: nobody's DEL
    /// removes them, and ADDs of their ports fail.
    pub orphans: Vec<(u64, Vec<MappingKey>)>,
    /// Mappings an owner's index names that the mappings map lacks (deleted
    /// behind the plugin's back) or that another owner holds: (owner, key,
    /// holder).
    pub missing: Vec<(String, MappingKey, Option<String>)>,
    /// Mappings of an owner that its index does not name, so its DEL would
    /// leave them behind: (owner, key).
    pub unindexed: Vec<(String, MappingKey)>,
}

impl Ownership {
    pub fn is_consistent(&self) -> bool {
        self.orphans.is_empty() && self.missing.is_empty() && self.unindexed.is_empty()
    }
}

/// `container/ifname (network N)` of an owner record.
fn owner_label(record: &OwnerRecord) -> String {
    let (network, container_id, ifname) = record_strings(record);
    format!("{container_id}/{ifname} (network {network})")
}

/// Compares every owner's index with the mappings map: one walk of each
/// owner's slots and one of the mappings. Read-only. An ADD or DEL running
/// meanwhile can show up for a moment (a slot is written just before its
/// mapping, and removed just after).
pub fn ownership(layout: &PinLayout) -> Result<Ownership, InspectError> {
    require_installed(layout)?;
    let maps = Store::open(layout)?;
    let store_error = |source| InspectError::Store(Box::new(source));
    let mut report = Ownership {
        orphans: maps.orphans().map_err(store_error)?.into_iter().collect(),
        ..Ownership::default()
    };
    let owners = maps.owners().map_err(store_error)?;
    let labels: StdHashMap<u64, String> = owners
        .iter()
        .map(|(id, record)| (*id, owner_label(record)))
        .collect();
    let mut indexed = std::collections::HashSet::new();
    for (id, _) in &owners {
        for key in maps.owner_index(*id).map_err(store_error)? {
            indexed.insert((*id, key));
            match maps.mappings.get(&key, 0) {
                Ok(value) if value.owner_id == *id => {}
                Ok(value) => report.missing.push((
                    labels[id].clone(),
                    key,
                    Some(
                        labels
                            .get(&value.owner_id)
                            .cloned()
                            .unwrap_or_else(|| format!("owner {:016x}", value.owner_id)),
                    ),
                )),
                Err(_) => report.missing.push((labels[id].clone(), key, None)),
            }
        }
    }
    for entry in &maps.mappings {
        let (key, value) = entry.map_err(read_error("mappings"))?;
        if let Some(label) = labels.get(&value.owner_id)
            && !indexed.contains(&(value.owner_id, key))
        {
            report.unindexed.push((label.clone(), key));
        }
    }
    report
        .missing
        .sort_by_key(|(owner, key, _)| (owner.clone(), *key));
    report.unindexed.sort();
    Ok(report)
}
