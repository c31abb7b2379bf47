//! `cargo xtask image`: the node installer's image, built with podman from
//! the release tarball (`dist.rs`) on a busybox base made here, no registry,
//! saved as `target/dist/ebpf-portmap-<version>-image.tar` (an OCI archive:
//! `podman load -i`, `docker load -i`, `kind load image-archive`). The build
//! itself is `tests/src/image.rs`, run by the `image` binary of the test
//! crate in a confined podman; `tests/tests/image.rs` runs the same build and
//! then the image, which `cargo xtask test` does.

use std::path::{Path, PathBuf};

use anyhow::Result;

use crate::{cmd::cargo_workspace, cmd::run, dist, runtimes};

/// Where [`build`] writes the archive.
pub fn archive_path() -> PathBuf {
    crate::cmd::target_dir().join("dist").join(format!(
        "ebpf-portmap-{}-image.tar",
        env!("CARGO_PKG_VERSION")
    ))
}

/// Installs podman if missing, then builds the image from `tarball`.
pub fn build(tarball: &Path) -> Result<PathBuf> {
    runtimes::ensure_podman()?;
    let archive = archive_path();
    run(cargo_workspace("run")
        .args(["--quiet", "--bin", "image", "--"])
        .arg("--tarball")
        .arg(tarball)
        .arg("--out")
        .arg(&archive))?;
    Ok(archive)
}

/// The image test of `cargo xtask test`: `tests/tests/image.rs` on the
/// release tarball.
pub fn test(tarball: &Path) -> Result<()> {
    runtimes::ensure_podman()?;
    run(cargo_workspace("test")
        .args(["--test", "image", "--", "--ignored"])
        .env(dist::TARBALL_ENV, tarball))
}
