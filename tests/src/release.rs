//! A release tarball (`cargo xtask dist`) unpacked into an empty folder, as
//! an operator gets it: used by the tarball's own tests, the image's test
//! and the `image` binary.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::tmp::TempDir;

/// Where `cargo xtask test` names the tarball for the tests.
pub const TARBALL_ENV: &str = "EPM_DIST_TARBALL";

/// An unpacked release, removed on drop.
#[derive(Debug)]
pub struct Release {
    _dir: TempDir,
    /// The tarball's one top folder, `ebpf-portmap-<version>-<arch>-linux`.
    pub root: PathBuf,
    /// `<version>`, from the tarball's name.
    pub version: String,
}

impl Release {
    /// Unpacks `tarball` into a fresh temp folder.
    ///
    /// # Panics
    /// If the name is not `ebpf-portmap-<version>-<arch>-linux.tar.gz`,
    /// `tar` fails, or the tarball does not unpack into exactly one folder
    /// named like itself.
    pub fn unpack(tarball: &Path) -> Release {
        let file_name = tarball
            .file_name()
            .and_then(|n| n.to_str())
            .expect("a tarball file name");
        let top = file_name
            .strip_suffix(".tar.gz")
            .unwrap_or_else(|| panic!("{file_name} does not end in .tar.gz"));
        let version = top
            .strip_prefix("ebpf-portmap-")
            .and_then(|rest| rest.split('-').next())
            .unwrap_or_else(|| panic!("{top} is not ebpf-portmap-<version>-<arch>-linux"))
            .to_owned();
        let dir = TempDir::new("release");
        let status = Command::new("tar")
            .arg("-xzf")
            .arg(tarball)
            .arg("-C")
            .arg(dir.path())
            .status()
            .expect("running tar");
        assert!(
            status.success(),
            "unpacking {}: {status}",
            tarball.display()
        );
        let entries: Vec<String> = std::fs::read_dir(dir.path())
            .expect("reading the unpack folder")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            entries,
            [top],
            "the tarball must unpack into one folder named like itself"
        );
        let root = dir.path().join(top);
        Release {
            _dir: dir,
            root,
            version,
        }
    }

    /// The tarball [`TARBALL_ENV`] names, unpacked.
    ///
    /// # Panics
    /// If the variable is not set (the tests that need it are `#[ignore]`d
    /// and run by `cargo xtask test`, which sets it).
    pub fn from_env() -> Release {
        let tarball = std::env::var_os(TARBALL_ENV)
            .filter(|t| !t.is_empty())
            .unwrap_or_else(|| {
                panic!("{TARBALL_ENV} is not set: run `cargo xtask dist`, then these tests with it naming the tarball")
            });
        Release::unpack(Path::new(&tarball))
    }
}
