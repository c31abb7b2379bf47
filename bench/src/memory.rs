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

/// The four conntrack tables (assured TCP flows, closed TCP flows,
/// assured flows of every other protocol, flows not yet assured;
/// portmap_common::maps).
pub const CONNTRACK_TABLES: [&str; 4] = [
    portmap_common::maps::CONNTRACK,
    portmap_common::maps::CONNTRACK_CLOSED,
    portmap_common::maps::CONNTRACK_OTHER,
    portmap_common::maps::CONNTRACK_NEW,
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
