//! Per-mapping traffic counters (`counters` map) and socket-hook counters
//! (`sock_counters`, same key): reading them for `list`, and removing the
//! entries of owners that are gone.
//!
//! The programs create an entry on the first packet a mapping translates
//! (the socket hooks: on its first connect() or sendmsg() from the node),
//! keyed by (mapping, owner), and add to their CPU's copy. Userspace never
//! creates entries; it removes those of a deleted owner (DEL) and any whose
//! mapping no longer exists or belongs to another owner (GC, `ebpf-portmap
//! gc`). Removal is best effort: a stale entry costs memory, never
//! correctness, because a new owner of the same host port has another key.

use aya::{
    Pod,
    maps::{HashMap, MapData, MapError, PerCpuHashMap, PerCpuValues},
};
use portmap_common::{CounterKey, MappingCounters, MappingKey, MappingValue, local::SockCounters};

use crate::dataplane::pinned::maps::is_errno;

pub type CountersMap = PerCpuHashMap<MapData, CounterKey, MappingCounters>;
pub type SockCountersMap = PerCpuHashMap<MapData, CounterKey, SockCounters>;

#[derive(Debug, thiserror::Error)]
pub enum CountersError {
    #[error("{operation} on the counters map failed")]
    Map {
        operation: &'static str,
        #[source]
        source: MapError,
    },
}

fn map_error(operation: &'static str) -> impl FnOnce(MapError) -> CountersError {
    move |source| CountersError::Map { operation, source }
}

/// The counter key of `mapping` held by `owner_id`.
pub fn key(mapping: &MappingKey, owner_id: u64) -> CounterKey {
    CounterKey {
        mapping: *mapping,
        _pad0: 0,
        owner_id,
    }
}

/// The per-CPU copies added up.
pub fn sum<'a>(values: impl IntoIterator<Item = &'a MappingCounters>) -> MappingCounters {
    values
        .into_iter()
        .fold(MappingCounters::default(), |total, cpu| MappingCounters {
            packets_in: total.packets_in.wrapping_add(cpu.packets_in),
            bytes_in: total.bytes_in.wrapping_add(cpu.bytes_in),
            packets_out: total.packets_out.wrapping_add(cpu.packets_out),
            bytes_out: total.bytes_out.wrapping_add(cpu.bytes_out),
        })
}

fn total(values: &PerCpuValues<MappingCounters>) -> MappingCounters {
    sum(values.iter())
}

/// What `mapping` held by `owner_id` translated so far (zero when it has
/// seen no traffic yet).
pub fn read(
    map: &CountersMap,
    mapping: &MappingKey,
    owner_id: u64,
) -> Result<MappingCounters, CountersError> {
    match map.get(&key(mapping, owner_id), 0) {
        Ok(values) => Ok(total(&values)),
        Err(e) if is_errno(&e, libc::ENOENT) => Ok(MappingCounters::default()),
        Err(e) => Err(map_error("lookup")(e)),
    }
}

/// The socket hooks' per-CPU copies added up.
pub fn sum_sock<'a>(values: impl IntoIterator<Item = &'a SockCounters>) -> SockCounters {
    values
        .into_iter()
        .fold(SockCounters::default(), |total, cpu| SockCounters {
            connects: total.connects.wrapping_add(cpu.connects),
            sendmsgs: total.sendmsgs.wrapping_add(cpu.sendmsgs),
        })
}

/// What the socket hooks translated for `mapping` held by `owner_id` (zero
/// when no node process dialled it yet).
pub fn read_sock(
    map: &SockCountersMap,
    mapping: &MappingKey,
    owner_id: u64,
) -> Result<SockCounters, CountersError> {
    match map.get(&key(mapping, owner_id), 0) {
        Ok(values) => Ok(sum_sock(values.iter())),
        Err(e) if is_errno(&e, libc::ENOENT) => Ok(SockCounters::default()),
        Err(e) => Err(map_error("lookup")(e)),
    }
}

/// Every entry, summed over CPUs.
pub fn all(map: &CountersMap) -> Result<Vec<(CounterKey, MappingCounters)>, CountersError> {
    map.iter()
        .map(|entry| entry.map(|(key, values)| (key, total(&values))))
        .collect::<Result<_, _>>()
        .map_err(map_error("iterate"))
}

/// Removes the counters of `owner_id` for `mappings` (from either map);
/// returns how many there were.
pub fn forget<V: Pod>(
    map: &mut PerCpuHashMap<MapData, CounterKey, V>,
    owner_id: u64,
    mappings: &[MappingKey],
) -> Result<usize, CountersError> {
    let mut removed = 0;
    for mapping in mappings {
        match map.remove(&key(mapping, owner_id)) {
            Ok(()) => removed += 1,
            Err(e) if is_errno(&e, libc::ENOENT) => {}
            Err(e) => return Err(map_error("delete")(e)),
        }
    }
    Ok(removed)
}

/// Whether a counter entry belongs to nobody any more: its mapping is gone
/// or now held by another owner.
pub fn is_stale(key: &CounterKey, current: Option<&MappingValue>) -> bool {
    current.is_none_or(|value| value.owner_id != key.owner_id)
}

/// Every stale entry (see [`is_stale`]), removing nothing: what
/// [`prune`] would remove (`gc --dry-run`).
pub fn stale_keys<V: Pod>(
    map: &PerCpuHashMap<MapData, CounterKey, V>,
    mappings: &HashMap<MapData, MappingKey, MappingValue>,
) -> Result<Vec<CounterKey>, CountersError> {
    let mut stale = Vec::new();
    for key in map.keys() {
        let key = key.map_err(map_error("iterate"))?;
        let current = match mappings.get(&key.mapping, 0) {
            Ok(value) => Some(value),
            Err(e) if is_errno(&e, libc::ENOENT) => None,
            Err(e) => return Err(map_error("mapping lookup")(e)),
        };
        if is_stale(&key, current.as_ref()) {
            stale.push(key);
        }
    }
    Ok(stale)
}

/// Removes every stale entry (see [`is_stale`]) of either map; returns
/// their keys.
pub fn prune<V: Pod>(
    map: &mut PerCpuHashMap<MapData, CounterKey, V>,
    mappings: &HashMap<MapData, MappingKey, MappingValue>,
) -> Result<Vec<CounterKey>, CountersError> {
    // Keys first: deleting while walking with get_next_key restarts the walk.
    let keys: Vec<CounterKey> = map
        .keys()
        .collect::<Result<_, _>>()
        .map_err(map_error("iterate"))?;
    let mut removed = Vec::new();
    for key in keys {
        let current = match mappings.get(&key.mapping, 0) {
            Ok(value) => Some(value),
            Err(e) if is_errno(&e, libc::ENOENT) => None,
            Err(e) => return Err(map_error("mapping lookup")(e)),
        };
        if is_stale(&key, current.as_ref()) {
            match map.remove(&key) {
                Ok(()) => removed.push(key),
                Err(e) if is_errno(&e, libc::ENOENT) => {}
                Err(e) => return Err(map_error("delete")(e)),
            }
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_every_cpu() {
        let cpus = [
            MappingCounters {
                packets_in: 1,
                bytes_in: 100,
                packets_out: 2,
                bytes_out: 50,
            },
            MappingCounters::default(),
            MappingCounters {
                packets_in: 3,
                bytes_in: 300,
                packets_out: 0,
                bytes_out: 0,
            },
        ];
        assert_eq!(
            sum(&cpus),
            MappingCounters {
                packets_in: 4,
                bytes_in: 400,
                packets_out: 2,
                bytes_out: 50,
            }
        );
        assert_eq!(sum(&[]), MappingCounters::default(), "no CPUs, no traffic");
    }

    #[test]
    fn stale_means_gone_or_taken_over() {
        let mapping = MappingKey {
            host_port_be: 8080u16.to_be(),
            proto: 6,
            family: 4,
            ..MappingKey::default()
        };
        let counter = key(&mapping, 7);
        let held_by = |owner_id| MappingValue {
            owner_id,
            ..MappingValue::default()
        };
        assert!(is_stale(&counter, None), "mapping deleted");
        assert!(is_stale(&counter, Some(&held_by(8))), "port taken over");
        assert!(!is_stale(&counter, Some(&held_by(7))), "still its owner's");
    }
}
