//! The plugin's record of its own runs (outcome and duration of each CNI
//! verb), for the node agent to export as metrics: no IPC, no daemon the
//! plugin depends on. [`crate::verbs::recorded`] records each run.
//!
//! The record is the pinned `verb_stats` map (layout in
//! [`portmap_common::verb_stats`]): a `BPF_F_MMAPABLE` array of `u64` slots.
//! A run maps it and adds to three slots with atomic instructions, so 32
//! concurrent runs lose nothing; a map update through the bpf syscall would
//! read, modify and write the whole value, and two concurrent runs would lose
//! one's increments (a per-CPU map has the same problem: two processes on one
//! CPU still interleave, and the value is per CPU, not per writer).
//!
//! Cost to a run: `BPF_OBJ_GET` and `BPF_OBJ_GET_INFO_BY_FD` (aya's open of
//! a pin), `mmap`, three atomic adds, `munmap` and `close`.

use std::{path::Path, sync::atomic::Ordering, time::Duration};

use aya::maps::{Array, Map, MapData, MapError};
use portmap_common::verb_stats::{self, SLOTS, VERBS};

use crate::dataplane::pinned::{maps::MappedArray, pin::PinLayout};

#[derive(Debug, thiserror::Error)]
pub enum VerbStatsError {
    #[error("cannot create the {} map", verb_stats::MAP)]
    Create(#[source] MapError),
    #[error("cannot pin {path}")]
    Pin {
        path: std::path::PathBuf,
        #[source]
        source: aya::pin::PinError,
    },
    #[error("cannot open {path}")]
    Open {
        path: std::path::PathBuf,
        #[source]
        source: MapError,
    },
    #[error("{path} has {found} slots, this build expects {SLOTS}")]
    Layout {
        path: std::path::PathBuf,
        found: u32,
    },
    #[error("cannot map {path} into memory")]
    Mmap {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// `BPF_F_MMAPABLE`: the array's values can be mapped into memory.
const BPF_F_MMAPABLE: u32 = 1 << 10;

fn definition() -> aya_obj::Map {
    crate::dataplane::pinned::maps::user_map_definition(
        aya_obj::generated::bpf_map_type::BPF_MAP_TYPE_ARRAY,
        (4, 8),
        SLOTS as u32,
        BPF_F_MMAPABLE,
    )
}

/// The slots of the pinned map, mapped into this process.
pub struct VerbStats(MappedArray);

impl VerbStats {
    /// The map under `layout`, or `None` when no run has made it yet.
    pub fn open(layout: &PinLayout) -> Result<Option<VerbStats>, VerbStatsError> {
        let path = layout.map(verb_stats::MAP);
        match MapData::from_pin(&path) {
            Ok(data) => Self::map(&path, data).map(Some),
            Err(MapError::SyscallError(error))
                if error.io_error.raw_os_error() == Some(libc::ENOENT) =>
            {
                Ok(None)
            }
            Err(source) => Err(VerbStatsError::Open { path, source }),
        }
    }

    /// The map under `layout`, created and pinned if missing. Safe against
    /// concurrent runs: pinning is an atomic create, and the loser opens the
    /// winner's map.
    pub fn open_or_create(layout: &PinLayout) -> Result<VerbStats, VerbStatsError> {
        if let Some(stats) = Self::open(layout)? {
            return Ok(stats);
        }
        let path = layout.map(verb_stats::MAP);
        let data =
            MapData::create(definition(), verb_stats::MAP, None).map_err(VerbStatsError::Create)?;
        match data.pin(&path) {
            Ok(()) => Self::map(&path, data),
            Err(aya::pin::PinError::SyscallError(error))
                if error.io_error.raw_os_error() == Some(libc::EEXIST) =>
            {
                let data = MapData::from_pin(&path).map_err(|source| VerbStatsError::Open {
                    path: path.clone(),
                    source,
                })?;
                Self::map(&path, data)
            }
            Err(source) => Err(VerbStatsError::Pin { path, source }),
        }
    }

    /// Checks the layout from what the open already read (map type, value
    /// size, entries: no syscall of its own) and maps the slots.
    fn map(path: &Path, data: MapData) -> Result<VerbStats, VerbStatsError> {
        let open = |source| VerbStatsError::Open {
            path: path.to_path_buf(),
            source,
        };
        let array = Map::from_map_data(data)
            .and_then(Array::<MapData, u64>::try_from)
            .map_err(open)?;
        if array.len() as usize != SLOTS {
            return Err(VerbStatsError::Layout {
                path: path.to_path_buf(),
                found: array.len(),
            });
        }
        let data = aya::maps::IterableMap::map(&array);
        MappedArray::of(data, SLOTS)
            .map(VerbStats)
            .map_err(|source| VerbStatsError::Mmap {
                path: path.to_path_buf(),
                source,
            })
    }

    /// Records one run of `verb` (index into [`VERBS`]).
    pub fn record(&self, verb: usize, code: u32, took: Duration) {
        let micros = took.as_micros().min(u128::from(u64::MAX)) as u64;
        let nanos = took.as_nanos().min(u128::from(u64::MAX)) as u64;
        self.0
            .word(verb_stats::code_slot(verb, code))
            .fetch_add(1, Ordering::Relaxed);
        self.0
            .word(verb_stats::bucket_slot(verb, micros))
            .fetch_add(1, Ordering::Relaxed);
        self.0
            .word(verb_stats::sum_slot(verb))
            .fetch_add(nanos, Ordering::Relaxed);
    }

    /// Every slot as it is now.
    pub fn snapshot(&self) -> Vec<u64> {
        (0..SLOTS)
            .map(|index| self.0.word(index).load(Ordering::Relaxed))
            .collect()
    }
}

/// One verb's record, read back: what the agent exports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerbRecord {
    pub verb: &'static str,
    /// Runs by CNI result code (`None`: a code not in
    /// [`verb_stats::CODES`]); codes never seen are left out.
    pub codes: Vec<(Option<u32>, u64)>,
    /// Runs by latency bucket (upper bound in microseconds, `None` for the
    /// last), not cumulative.
    pub buckets: Vec<(Option<u64>, u64)>,
    pub sum_ns: u64,
}

impl VerbRecord {
    pub fn count(&self) -> u64 {
        self.codes.iter().map(|(_, n)| n).sum()
    }
}

/// The slots of [`VerbStats::snapshot`] by verb.
pub fn records(slots: &[u64]) -> Vec<VerbRecord> {
    VERBS
        .iter()
        .enumerate()
        .map(|(verb, &name)| {
            let mut codes: Vec<(Option<u32>, u64)> = verb_stats::CODES
                .iter()
                .map(|&code| (Some(code), slots[verb_stats::code_slot(verb, code)]))
                .collect();
            codes.push((None, slots[verb_stats::code_slot(verb, u32::MAX)]));
            codes.retain(|(_, n)| *n > 0);
            let first = verb_stats::bucket_slot(verb, 0);
            let buckets = (0..=verb_stats::BUCKETS_US.len())
                .map(|index| {
                    (
                        verb_stats::BUCKETS_US.get(index).copied(),
                        slots[first + index],
                    )
                })
                .collect();
            VerbRecord {
                verb: name,
                codes,
                buckets,
                sum_ns: slots[verb_stats::sum_slot(verb)],
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_of_each_verb_are_its_own() {
        let mut seen = std::collections::BTreeSet::new();
        for verb in 0..VERBS.len() {
            for &code in &verb_stats::CODES {
                assert!(seen.insert(verb_stats::code_slot(verb, code)));
            }
            assert!(
                seen.insert(verb_stats::code_slot(verb, 12345)),
                "other codes"
            );
            for micros in verb_stats::BUCKETS_US.iter().copied().chain([u64::MAX]) {
                assert!(seen.insert(verb_stats::bucket_slot(verb, micros)));
            }
            assert!(seen.insert(verb_stats::sum_slot(verb)));
        }
        assert_eq!(seen.len(), SLOTS, "every slot used once");
        assert_eq!(*seen.last().unwrap(), SLOTS - 1);
    }

    #[test]
    fn durations_fall_in_the_first_bucket_that_holds_them() {
        assert_eq!(
            verb_stats::bucket_slot(0, 0),
            verb_stats::bucket_slot(0, 1_000)
        );
        assert_eq!(
            verb_stats::bucket_slot(0, 1_001),
            verb_stats::bucket_slot(0, 2_500)
        );
        assert_eq!(
            verb_stats::bucket_slot(1, 10_000_000) - verb_stats::bucket_slot(1, 0),
            verb_stats::BUCKETS_US.len(),
            "slower than the last bound: the last bucket"
        );
    }

    #[test]
    fn records_read_back_what_was_counted() {
        let mut slots = vec![0u64; SLOTS];
        slots[verb_stats::code_slot(1, 0)] = 3;
        slots[verb_stats::code_slot(1, 100)] = 1;
        slots[verb_stats::code_slot(1, 4242)] = 2;
        slots[verb_stats::bucket_slot(1, 2_000)] = 6;
        slots[verb_stats::sum_slot(1)] = 9_000_000;
        let del = &records(&slots)[1];
        assert_eq!(del.verb, "DEL");
        assert_eq!(del.codes, vec![(Some(0), 3), (Some(100), 1), (None, 2)]);
        assert_eq!(del.count(), 6);
        assert_eq!(del.buckets[1], (Some(2_500), 6));
        assert_eq!(del.buckets.len(), verb_stats::BUCKETS_US.len() + 1);
        assert_eq!(del.sum_ns, 9_000_000);
        assert_eq!(records(&slots)[0].count(), 0);
    }
}
