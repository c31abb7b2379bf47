//! The node installer's image, built from the release tarball the way an
//! operator builds it, with podman and no registry: a base made here from
//! Debian's busybox-static (the applets `install.sh` runs), then
//! `deploy/Dockerfile` with the tarball's binary. Used by `cargo xtask image`
//! (through the `image` binary) and by `tests/tests/image.rs`.

use std::path::Path;
use std::process::Command;

use crate::podman::Podman;

/// The base the Dockerfile's `BASE_IMAGE` names here: busybox and the
/// applets install.sh uses, nothing else.
pub const BASE_IMAGE: &str = "localhost/ebpf-portmap-base:busybox";
/// The applets install.sh may run (the deploy tests hold it to these).
pub const APPLETS: [&str; 8] = ["sh", "cp", "cmp", "mv", "chmod", "rm", "ls", "sleep"];
/// Debian's static busybox.
const BUSYBOX: &str = "/bin/busybox";

/// The image tag of a release: `localhost/ebpf-portmap:<version>`, the name
/// the tarball's manifest gives it (`ebpf-portmap:<version>`) in podman's
/// local namespace.
pub fn tag(version: &str) -> String {
    format!("localhost/ebpf-portmap:{version}")
}

/// Builds [`tag`] of `version` from `release`, an unpacked release tarball
/// (its top folder), and returns the tag.
///
/// # Panics
/// If the base rootfs cannot be written or a podman command fails.
pub fn build(podman: &Podman, release: &Path, version: &str) -> String {
    let rootfs = podman.dir().join("image/base-rootfs");
    let bin = rootfs.join("bin");
    std::fs::create_dir_all(&bin).unwrap_or_else(|e| panic!("creating {}: {e}", bin.display()));
    std::fs::copy(BUSYBOX, bin.join("busybox")).unwrap_or_else(|e| {
        panic!("copying {BUSYBOX}: {e} (`cargo xtask setup` installs busybox-static)")
    });
    for applet in APPLETS {
        std::os::unix::fs::symlink("busybox", bin.join(applet))
            .unwrap_or_else(|e| panic!("linking {applet}: {e}"));
    }
    for dir in ["tmp", "usr/local/bin"] {
        std::fs::create_dir_all(rootfs.join(dir)).expect("creating a base directory");
    }
    let base_tar = podman.dir().join("image/base.tar");
    let status = Command::new("tar")
        .arg("-C")
        .arg(&rootfs)
        .arg("-cf")
        .arg(&base_tar)
        .arg(".")
        .status()
        .expect("running tar");
    assert!(status.success(), "tar of the base rootfs: {status}");
    podman
        .run(&["import", &base_tar.to_string_lossy(), BASE_IMAGE])
        .unwrap_or_else(|e| panic!("{e}"));
    let tag = tag(version);
    let dockerfile = release.join("deploy/Dockerfile");
    podman
        .run(&[
            "build",
            "--network",
            "none",
            "--file",
            &dockerfile.to_string_lossy(),
            "--build-arg",
            &format!("BASE_IMAGE={BASE_IMAGE}"),
            "--build-arg",
            "BINARY=ebpf-portmap",
            "--build-arg",
            "AGENT_BINARY=ebpf-portmap-agent",
            "--tag",
            &tag,
            &release.to_string_lossy(),
        ])
        .unwrap_or_else(|e| panic!("{e}"));
    tag
}
