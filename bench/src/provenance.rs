//! Which checkout the eBPF object inside a plugin binary was compiled
//! in, for the report: the object's BTF line info names every source file
//! by its absolute path. (Whether the object is of the checkout's sources
//! as they are now is the digest's question, `check_ebpf_source`.)

use std::collections::BTreeSet;
use std::path::PathBuf;

/// The eBPF crate's directory as its source paths end in.
const CRATE_DIR: &[u8] = b"/portmap-ebpf";
/// What follows the crate's directory in the path of one of its sources.
const SOURCES: &[u8] = b"/portmap-ebpf/src/";

/// The distinct `.../portmap-ebpf` directories named by the source paths
/// in `bytes` (a plugin binary, or an object): an absolute path ends at
/// the byte before it that cannot be part of one (BTF strings are NUL
/// separated).
pub fn ebpf_crate_dirs(bytes: &[u8]) -> BTreeSet<PathBuf> {
    let mut dirs = BTreeSet::new();
    let mut from = 0;
    while let Some(at) = find(&bytes[from..], SOURCES).map(|i| from + i) {
        let start = bytes[..at]
            .iter()
            .rposition(|&b| !is_path_byte(b))
            .map_or(0, |i| i + 1);
        let path = &bytes[start..at + CRATE_DIR.len()];
        if path.first() == Some(&b'/')
            && let Ok(path) = std::str::from_utf8(path)
        {
            dirs.insert(PathBuf::from(path));
        }
        from = at + SOURCES.len();
    }
    dirs
}

fn is_path_byte(b: u8) -> bool {
    b.is_ascii_graphic()
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_each_crate_directory_once() {
        let bytes = b"\x7fELF\0\0/work/main/portmap-ebpf/src/parse.rs\0x\0\
            /work/main/portmap-ebpf/src/ct.rs\0\x01/work/wt-lead/portmap-ebpf/src/nat.rs\0";
        let dirs: Vec<PathBuf> = ebpf_crate_dirs(bytes).into_iter().collect();
        assert_eq!(
            dirs,
            [
                PathBuf::from("/work/main/portmap-ebpf"),
                PathBuf::from("/work/wt-lead/portmap-ebpf")
            ]
        );
    }

    #[test]
    fn a_relative_or_absent_path_names_no_directory() {
        assert!(ebpf_crate_dirs(b"\0portmap-ebpf/src/parse.rs\0").is_empty());
        assert!(ebpf_crate_dirs(b"no sources here").is_empty());
        assert!(
            ebpf_crate_dirs(b"/portmap-ebpf/src/").contains(std::path::Path::new("/portmap-ebpf"))
        );
    }
}
