//! A tree of files for an initramfs and its `newc` cpio writer (the format
//! the kernel unpacks, `Documentation/driver-api/early-userspace/buffer-format.rst`).
//! Uncompressed on purpose: under TCG the guest would spend longer inflating
//! it than QEMU spends reading it.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

const S_IFDIR: u32 = 0o040000;
const S_IFREG: u32 = 0o100000;
const S_IFLNK: u32 = 0o120000;
const S_IFCHR: u32 = 0o020000;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Node {
    Dir,
    /// Contents read from a host file when the archive is written.
    HostFile {
        source: PathBuf,
        mode: u32,
    },
    Bytes {
        data: Vec<u8>,
        mode: u32,
    },
    Symlink {
        target: String,
    },
    CharDevice {
        major: u32,
        minor: u32,
        mode: u32,
    },
}

/// Paths are absolute in the guest (`/usr/sbin/ip`); parent directories are
/// created implicitly; adding the same path twice with the same content is
/// fine, with different content an error.
#[derive(Debug, Clone, Default)]
pub struct Tree {
    nodes: BTreeMap<String, Node>,
}

impl Tree {
    pub fn new() -> Tree {
        Tree::default()
    }

    fn insert(&mut self, path: &str, node: Node) -> Result<()> {
        let path = normalize(path)?;
        let mut parent = String::new();
        let components: Vec<&str> = path.split('/').collect();
        for component in &components[..components.len() - 1] {
            if !parent.is_empty() {
                parent.push('/');
            }
            parent.push_str(component);
            match self.nodes.get(&parent) {
                None => {
                    self.nodes.insert(parent.clone(), Node::Dir);
                }
                Some(Node::Dir) => {}
                Some(other) => bail!("/{parent} is {other:?}, not a directory, in the initramfs"),
            }
        }
        match self.nodes.get(&path) {
            Some(existing) if *existing != node => {
                bail!("/{path} added twice to the initramfs: {existing:?} and {node:?}")
            }
            _ => {
                self.nodes.insert(path, node);
            }
        }
        Ok(())
    }

    pub fn dir(&mut self, path: &str) -> Result<()> {
        self.insert(path, Node::Dir)
    }

    pub fn host_file(&mut self, path: &str, source: &Path, mode: u32) -> Result<()> {
        self.insert(
            path,
            Node::HostFile {
                source: source.to_path_buf(),
                mode,
            },
        )
    }

    pub fn bytes(&mut self, path: &str, data: impl Into<Vec<u8>>, mode: u32) -> Result<()> {
        self.insert(
            path,
            Node::Bytes {
                data: data.into(),
                mode,
            },
        )
    }

    pub fn symlink(&mut self, path: &str, target: &str) -> Result<()> {
        self.insert(
            path,
            Node::Symlink {
                target: target.to_owned(),
            },
        )
    }

    pub fn char_device(&mut self, path: &str, major: u32, minor: u32, mode: u32) -> Result<()> {
        self.insert(path, Node::CharDevice { major, minor, mode })
    }

    #[cfg(test)]
    pub fn contains(&self, path: &str) -> bool {
        normalize(path).is_ok_and(|p| self.nodes.contains_key(&p))
    }

    /// Writes the archive. Sorted order puts every directory before its
    /// contents, which the kernel's unpacker needs.
    pub fn write(&self, out: &Path) -> Result<()> {
        let file = File::create(out).with_context(|| format!("creating {}", out.display()))?;
        let mut writer = Writer::new(BufWriter::new(file));
        for (path, node) in &self.nodes {
            match node {
                Node::Dir => writer.entry(path, S_IFDIR | 0o755, (0, 0), &mut io::empty(), 0)?,
                Node::Bytes { data, mode } => writer.entry(
                    path,
                    S_IFREG | mode,
                    (0, 0),
                    &mut data.as_slice(),
                    data.len() as u64,
                )?,
                Node::HostFile { source, mode } => {
                    let mut file = File::open(source)
                        .with_context(|| format!("opening {}", source.display()))?;
                    let size = file.metadata()?.len();
                    writer.entry(path, S_IFREG | mode, (0, 0), &mut file, size)?;
                }
                Node::Symlink { target } => writer.entry(
                    path,
                    S_IFLNK | 0o777,
                    (0, 0),
                    &mut target.as_bytes(),
                    target.len() as u64,
                )?,
                Node::CharDevice { major, minor, mode } => {
                    writer.entry(path, S_IFCHR | mode, (*major, *minor), &mut io::empty(), 0)?;
                }
            }
        }
        writer
            .finish()?
            .flush()
            .with_context(|| format!("writing {}", out.display()))
    }
}

/// `/a/b` → `a/b`; refuses empty, `.` and `..` components.
fn normalize(path: &str) -> Result<String> {
    let trimmed = path.trim_start_matches('/').trim_end_matches('/');
    if trimmed.is_empty()
        || trimmed
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == "..")
    {
        bail!("bad initramfs path {path:?}");
    }
    Ok(trimmed.to_owned())
}

struct Writer<W: Write> {
    out: W,
    written: u64,
    next_inode: u32,
}

impl<W: Write> Writer<W> {
    fn new(out: W) -> Self {
        Writer {
            out,
            written: 0,
            next_inode: 1,
        }
    }

    fn put(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.out.write_all(bytes)?;
        self.written += bytes.len() as u64;
        Ok(())
    }

    fn pad4(&mut self) -> io::Result<()> {
        let pad = (4 - self.written % 4) % 4;
        self.put(&[0; 3][..pad as usize])
    }

    fn entry(
        &mut self,
        name: &str,
        mode: u32,
        rdev: (u32, u32),
        data: &mut dyn Read,
        size: u64,
    ) -> Result<()> {
        let Ok(size32) = u32::try_from(size) else {
            bail!("{name} is too large for cpio newc ({size} bytes)");
        };
        let inode = self.next_inode;
        self.next_inode += 1;
        let nlink = if mode & S_IFDIR == S_IFDIR { 2 } else { 1 };
        let header = newc_header(inode, mode, nlink, size32, rdev, name.len() as u32 + 1);
        self.put(header.as_bytes())?;
        self.put(name.as_bytes())?;
        self.put(&[0])?;
        self.pad4()?;
        let copied = io::copy(data, &mut self.out)?;
        if copied != size {
            bail!("{name}: expected {size} bytes, read {copied}");
        }
        self.written += copied;
        self.pad4()?;
        Ok(())
    }

    fn finish(mut self) -> Result<W> {
        self.entry("TRAILER!!!", 0, (0, 0), &mut io::empty(), 0)?;
        Ok(self.out)
    }
}

/// The 110-byte ASCII header: magic and 13 eight-digit hex fields.
fn newc_header(
    inode: u32,
    mode: u32,
    nlink: u32,
    size: u32,
    (rdev_major, rdev_minor): (u32, u32),
    name_size: u32,
) -> String {
    let fields = [
        inode, mode, 0, 0, nlink, 0, size, 0, 0, rdev_major, rdev_minor, name_size, 0,
    ];
    let mut header = String::from("070701");
    for field in fields {
        header.push_str(&format!("{field:08x}"));
    }
    header
}

#[cfg(test)]
mod tests {
    use super::*;

    fn archive(tree: &Tree) -> Vec<u8> {
        let dir = std::env::temp_dir().join(format!("xtask-cpio-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join(format!("{tree:p}.cpio"));
        tree.write(&out).unwrap();
        let bytes = std::fs::read(&out).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        bytes
    }

    /// (name, mode, rdev major, data) of every entry, parsed back.
    fn entries(mut bytes: &[u8]) -> Vec<(String, u32, u32, Vec<u8>)> {
        let field = |header: &[u8], i: usize| {
            u32::from_str_radix(
                std::str::from_utf8(&header[6 + 8 * i..14 + 8 * i]).unwrap(),
                16,
            )
            .unwrap()
        };
        let mut out = Vec::new();
        let mut offset = 0usize;
        loop {
            let header = &bytes[..110];
            assert_eq!(&header[..6], b"070701", "magic at offset {offset}");
            let (mode, size, major, name_size) = (
                field(header, 1),
                field(header, 6),
                field(header, 9),
                field(header, 11),
            );
            let name_end = 110 + name_size as usize;
            let name = std::str::from_utf8(&bytes[110..name_end - 1])
                .unwrap()
                .to_owned();
            assert_eq!(bytes[name_end - 1], 0, "name is NUL-terminated");
            let data_start = name_end.next_multiple_of(4);
            let data_end = data_start + size as usize;
            let data = bytes[data_start..data_end].to_vec();
            let next = data_end.next_multiple_of(4);
            offset += next;
            bytes = &bytes[next..];
            if name == "TRAILER!!!" {
                assert!(bytes.is_empty(), "nothing after the trailer");
                return out;
            }
            out.push((name, mode, major, data));
        }
    }

    #[test]
    fn archive_round_trips_with_parents_first_and_alignment() {
        let mut tree = Tree::new();
        tree.bytes("/etc/epm/env", "A=1\n", 0o644).unwrap();
        tree.symlink("/bin/sh", "busybox").unwrap();
        tree.char_device("/dev/console", 5, 1, 0o600).unwrap();
        tree.dir("/proc").unwrap();
        tree.bytes("/init", "#!/bin/sh\n", 0o755).unwrap();
        let parsed = entries(&archive(&tree));
        let names: Vec<&str> = parsed.iter().map(|e| e.0.as_str()).collect();
        assert_eq!(
            names,
            [
                "bin",
                "bin/sh",
                "dev",
                "dev/console",
                "etc",
                "etc/epm",
                "etc/epm/env",
                "init",
                "proc"
            ]
        );
        let find = |name: &str| parsed.iter().find(|e| e.0 == name).unwrap();
        assert_eq!(find("etc/epm/env").1, S_IFREG | 0o644);
        assert_eq!(find("etc/epm/env").3, b"A=1\n");
        assert_eq!(find("bin/sh").1, S_IFLNK | 0o777);
        assert_eq!(find("bin/sh").3, b"busybox");
        assert_eq!(
            (find("dev/console").1, find("dev/console").2),
            (S_IFCHR | 0o600, 5)
        );
        assert_eq!(find("etc").1, S_IFDIR | 0o755);
    }

    #[test]
    fn conflicting_or_bad_paths_are_refused() {
        let mut tree = Tree::new();
        tree.bytes("/a/b", "x", 0o644).unwrap();
        tree.bytes("/a/b", "x", 0o644).unwrap();
        assert!(tree.bytes("/a/b", "y", 0o644).is_err());
        assert!(tree.bytes("/a/b/c", "y", 0o644).is_err(), "b is a file");
        for bad in ["", "/", "/a/../b", "/a//b", "/./a"] {
            assert!(tree.dir(bad).is_err(), "{bad:?}");
        }
        assert!(tree.contains("/a") && tree.contains("a/b") && !tree.contains("/c"));
    }

    #[test]
    fn header_is_110_ascii_bytes() {
        let header = newc_header(1, S_IFREG | 0o755, 1, 4096, (0, 0), 5);
        assert_eq!(header.len(), 110);
        assert!(header.starts_with("07070100000001000081ed"));
    }
}
