//! BPF map memory and entry counts of our pinned maps.
//!
//! Memory is what the kernel charges each map (`bytes_memlock` in
//! `bpftool --json map show`, i.e. the map's `memlock` in fdinfo, which
//! kernels >= 6.4 compute from the map's real usage: it grows with the
//! entries of a non-preallocated hash and is fixed for a preallocated LRU).
//! Entries are counted by walking the keys with `BPF_MAP_GET_NEXT_KEY`
//! (`bpftool map dump` of a full 262 144-entry conntrack would print ~100 MB).

use std::collections::BTreeMap;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::Command;

use serde_json::{Value, json};

/// One map as the kernel reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct MapInfo {
    pub name: String,
    pub kind: String,
    pub max_entries: u64,
    pub bytes_memlock: u64,
    pub entries: Option<u64>,
}

/// The three conntrack tables (open TCP flows, closed TCP flows, every
/// other protocol; portmap_common::maps).
pub const CONNTRACK_TABLES: [&str; 3] = [
    portmap_common::maps::CONNTRACK,
    portmap_common::maps::CONNTRACK_CLOSED,
    portmap_common::maps::CONNTRACK_OTHER,
];

/// Every map pinned in `maps_dir`, by pin name.
pub fn maps_in(maps_dir: &Path) -> BTreeMap<String, MapInfo> {
    let mut maps = BTreeMap::new();
    let Ok(dir) = std::fs::read_dir(maps_dir) else {
        return maps;
    };
    for entry in dir.flatten() {
        let path = entry.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()).map(str::to_owned) else {
            continue;
        };
        let Ok(out) = Command::new("bpftool")
            .args(["--json", "map", "show", "pinned"])
            .arg(&path)
            .output()
        else {
            continue;
        };
        let Ok(info) = serde_json::from_slice::<Value>(&out.stdout) else {
            continue;
        };
        let key_size = info["bytes_key"].as_u64().unwrap_or(0) as usize;
        maps.insert(
            name.clone(),
            MapInfo {
                name,
                kind: info["type"].as_str().unwrap_or("?").to_owned(),
                max_entries: info["max_entries"].as_u64().unwrap_or(0),
                bytes_memlock: info["bytes_memlock"].as_u64().unwrap_or(0),
                entries: count_entries(&path, key_size).ok(),
            },
        );
    }
    maps
}

/// Issue 30's target: the idle footprint of the default configuration
/// (no `conntrackSize`, so the tables the node formula gives) after the
/// first ADD, at most this many MiB.
pub const IDLE_TARGET_MIB: f64 = 24.0;

/// The idle-footprint target, judged on the memory row of the smallest
/// prefill (0 mappings: only the bench's probe ADDs were made).
pub fn idle_target(rows: &[crate::results::MemoryRow]) -> crate::results::TargetRow {
    use crate::results::{Compare, Status, TargetRow};
    let idle = rows
        .iter()
        .filter(|row| !row.maps.is_empty())
        .min_by_key(|row| row.requested_mappings);
    let values: Vec<f64> = idle
        .map(|row| total_memlock(&row.maps) as f64 / (1024.0 * 1024.0))
        .into_iter()
        .collect();
    let status = match values.first() {
        None => Status::Skip,
        Some(&mib) if mib <= IDLE_TARGET_MIB => Status::Pass,
        Some(_) => Status::Miss,
    };
    TargetRow {
        id: "memory-idle".into(),
        text: format!(
            "BPF map memory of the default configuration at its fewest mappings <= {IDLE_TARGET_MIB} MiB"
        ),
        compare: Compare::AtMost,
        threshold: IDLE_TARGET_MIB,
        values,
        unit: "MiB",
        status,
        stretch: false,
        detail: match idle {
            None => "not measured in this run".into(),
            Some(row) => {
                let tables: Vec<String> = CONNTRACK_TABLES
                    .iter()
                    .filter_map(|name| row.maps.get(*name))
                    .map(|m| format!("{} {}", m.name, m.max_entries))
                    .collect();
                format!(
                    "sum of bytes_memlock over the pinned maps, row \"{}\"; conntrack sizes from the node formula: {}",
                    row.state,
                    tables.join(", ")
                )
            }
        },
    }
}

pub fn total_memlock(maps: &BTreeMap<String, MapInfo>) -> u64 {
    maps.values().map(|m| m.bytes_memlock).sum()
}

pub fn to_json(maps: &BTreeMap<String, MapInfo>) -> Value {
    Value::Object(
        maps.iter()
            .map(|(name, m)| {
                (
                    name.clone(),
                    json!({
                        "type": m.kind,
                        "max_entries": m.max_entries,
                        "bytes_memlock": m.bytes_memlock,
                        "entries": m.entries,
                    }),
                )
            })
            .collect(),
    )
}

const BPF_MAP_GET_NEXT_KEY: libc::c_long = 4;
const BPF_OBJ_GET: libc::c_long = 7;
/// Enough for every `bpf_attr` variant used here.
const ATTR_SIZE: usize = 128;

fn bpf(cmd: libc::c_long, attr: &mut [u64; ATTR_SIZE / 8]) -> io::Result<i64> {
    // SAFETY: attr is a zero-padded bpf_attr of ATTR_SIZE bytes; the kernel
    // reads at most that many and only writes into buffers we pointed it to.
    let rc = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), ATTR_SIZE) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc as i64)
    }
}

/// Number of keys in the pinned map at `path` (a key walk; an entry that
/// is deleted mid-walk may restart it, so this is exact only for a quiet map).
pub fn count_entries(path: &Path, key_size: usize) -> io::Result<u64> {
    let c_path = CString::new(path.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let mut attr = [0u64; ATTR_SIZE / 8];
    attr[0] = c_path.as_ptr() as u64;
    let fd = bpf(BPF_OBJ_GET, &mut attr)?;
    // SAFETY: BPF_OBJ_GET returned a new fd that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    let mut key = vec![0u8; key_size.max(1)];
    let mut next = vec![0u8; key_size.max(1)];
    let mut count = 0u64;
    let mut first = true;
    // Bounded: a map never holds more than u32::MAX entries.
    for _ in 0..=u64::from(u32::MAX) {
        let mut attr = [0u64; ATTR_SIZE / 8];
        attr[0] = fd.as_raw_fd() as u64;
        attr[1] = if first { 0 } else { key.as_ptr() as u64 };
        attr[2] = next.as_mut_ptr() as u64;
        match bpf(BPF_MAP_GET_NEXT_KEY, &mut attr) {
            Ok(_) => {
                count += 1;
                first = false;
                std::mem::swap(&mut key, &mut next);
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => break,
            Err(e) => return Err(e),
        }
    }
    Ok(count)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::{MemoryRow, Status};

    fn row(mappings: usize, conntrack_bytes: u64) -> MemoryRow {
        let map = |name: &str, bytes| {
            (
                name.to_owned(),
                MapInfo {
                    name: name.to_owned(),
                    kind: "lru_hash".into(),
                    max_entries: 16384,
                    bytes_memlock: bytes,
                    entries: Some(0),
                },
            )
        };
        MemoryRow {
            state: format!("{mappings} mappings"),
            requested_mappings: mappings,
            maps: [map("conntrack", conntrack_bytes), map("mappings", 1 << 20)]
                .into_iter()
                .collect(),
        }
    }

    #[test]
    fn the_idle_target_is_judged_on_the_fewest_mappings() {
        let lean = idle_target(&[row(10_000, 200 << 20), row(0, 17 << 20)]);
        assert_eq!(lean.status, Status::Pass, "{lean:?}");
        assert_eq!(lean.values, vec![18.0]);
        assert!(lean.detail.contains("conntrack 16384"), "{}", lean.detail);
        let fat = idle_target(&[row(0, 101 << 20)]);
        assert_eq!(fat.status, Status::Miss, "{fat:?}");
        assert_eq!(idle_target(&[]).status, Status::Skip);
    }
}
