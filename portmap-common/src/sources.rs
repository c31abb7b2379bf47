//! A digest of the sources the eBPF object is compiled from, so that a
//! binary can say which sources its embedded programs are, and a check
//! (the bench's) can tell a stale object from a fresh one whatever cargo's
//! cache did. `portmap-user`'s build script embeds it; `ebpf-portmap
//! version` prints it.

extern crate std;

use std::{fs, io, path::Path, path::PathBuf, vec::Vec};

use crate::fnv::Fnv1a64;

/// The crates of the eBPF object, relative to the workspace root: each one's
/// `Cargo.toml` and every `.rs` file under its `src`.
pub const EBPF_CRATES: [&str; 2] = ["portmap-ebpf", "portmap-common"];

/// FNV-1a over every source file of [`EBPF_CRATES`] under `workspace`, in
/// path order, each as its relative path, a NUL, its bytes and a NUL.
pub fn ebpf_sources_digest(workspace: &Path) -> io::Result<u64> {
    let mut files = Vec::new();
    for name in EBPF_CRATES {
        let dir = workspace.join(name);
        files.push(dir.join("Cargo.toml"));
        rust_files(&dir.join("src"), &mut files)?;
    }
    files.sort();
    let mut hash = Fnv1a64::new();
    for file in &files {
        let relative = file.strip_prefix(workspace).unwrap_or(file);
        hash.add(relative.as_os_str().as_encoded_bytes());
        hash.add(&[0]);
        hash.add(&fs::read(file)?);
        hash.add(&[0]);
    }
    Ok(hash.finish())
}

fn rust_files(dir: &Path, files: &mut Vec<PathBuf>) -> io::Result<()> {
    for entry in fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            rust_files(&path, files)?;
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            files.push(path);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(root: &Path, parse: &str) {
        for name in EBPF_CRATES {
            fs::create_dir_all(root.join(name).join("src/nested")).unwrap();
            fs::write(root.join(name).join("Cargo.toml"), name).unwrap();
            fs::write(root.join(name).join("src/lib.rs"), "lib").unwrap();
        }
        fs::write(root.join("portmap-ebpf/src/nested/parse.rs"), parse).unwrap();
        fs::write(root.join("portmap-ebpf/src/notes.txt"), "not a source").unwrap();
    }

    #[test]
    fn a_changed_source_changes_the_digest_and_nothing_else_does() {
        let base = std::env::temp_dir().join(std::format!("epm-sources-{}", std::process::id()));
        let (a, b) = (base.join("a"), base.join("b"));
        tree(&a, "fn parse() {}");
        tree(&b, "fn parse() {}");
        let digest = |root: &Path| ebpf_sources_digest(root).unwrap();
        // Where the checkout is does not matter, only what it holds.
        assert_eq!(digest(&a), digest(&b));
        fs::write(b.join("portmap-ebpf/src/notes.txt"), "edited").unwrap();
        assert_eq!(digest(&a), digest(&b), "a file that is not a source");
        fs::write(b.join("portmap-ebpf/src/nested/parse.rs"), "fn parse() { }").unwrap();
        assert_ne!(digest(&a), digest(&b), "an edited source");
        fs::remove_dir_all(&base).unwrap();
    }
}
