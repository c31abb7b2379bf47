//! `cargo xtask dist`: the release tarball.
//!
//! `target/dist/ebpf-portmap-<version>-<arch>-linux.tar.gz` unpacks into one
//! folder of the same name:
//!
//! ```text
//! ebpf-portmap                 the static (musl) binary, profile `dist`
//! ebpf-portmap-agent           the node agent, likewise
//! completions/ebpf-portmap.bash, _ebpf-portmap (zsh), ebpf-portmap.fish
//! man/man1/ebpf-portmap.1, ebpf-portmap-<verb>.1
//! deploy/                      daemonset.yaml (image tag = the version), install.sh, Dockerfile,
//!                              metrics-proxy.yaml and metrics-proxy-patch.yaml (Prometheus through kube-rbac-proxy)
//! README.md, LICENSE
//! SHA256SUMS                   of every other file, for `sha256sum -c`
//! ```
//!
//! Completions and man pages come from the binary itself (its `completions`
//! and `man` verbs), so they describe exactly the CLI that ships. The archive
//! is reproducible: sorted names, owner 0, every mtime the last commit's time,
//! gzip without a timestamp. Only x86_64 is built: the eBPF object is the same
//! bpfel on every architecture, but an aarch64 build needs a cross linker
//! and an aarch64 C toolchain for the musl target, which this toolchain has not.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::cmd::{capture, run};
use crate::plugin::{PLUGIN_BIN, PLUGIN_TARGET, plugin_target, shipped_plugin_bin};

/// The image the manifest names in the repository; the tarball's copy names
/// the version instead.
pub const DEV_IMAGE: &str = "ebpf-portmap:dev";
/// The shells `completions` generates for, and the file each is installed as.
const COMPLETIONS: &[(&str, &str)] = &[
    ("bash", "ebpf-portmap.bash"),
    ("zsh", "_ebpf-portmap"),
    ("fish", "ebpf-portmap.fish"),
];
/// The node agent's binary (deploy/daemonset.yaml's `agent` container).
pub const AGENT_BIN: &str = "ebpf-portmap-agent";
const DEPLOY_FILES: &[&str] = &[
    "daemonset.yaml",
    "install.sh",
    "Dockerfile",
    "metrics-proxy.yaml",
    "metrics-proxy-patch.yaml",
];
/// Environment variable through which `cargo xtask test` hands the tarball
/// to `tests/tests/dist.rs`.
pub const TARBALL_ENV: &str = "EPM_DIST_TARBALL";

/// The tarball's folder name: `ebpf-portmap-<version>-x86_64-linux`.
pub fn release_name() -> String {
    format!(
        "{PLUGIN_BIN}-{}-{}-linux",
        env!("CARGO_PKG_VERSION"),
        std::env::consts::ARCH
    )
}

/// Where [`build`] writes the tarball.
pub fn tarball_path() -> PathBuf {
    crate::cmd::target_dir()
        .join("dist")
        .join(format!("{}.tar.gz", release_name()))
}

/// Stages the release folder from the shipped binary (already built) and
/// packs it. Returns the tarball's path.
pub fn build() -> Result<PathBuf> {
    if plugin_target() != Some(PLUGIN_TARGET) {
        bail!(
            "the release binary must be static: install the {PLUGIN_TARGET} target (`cargo xtask setup` does)"
        );
    }
    let dist = crate::cmd::target_dir().join("dist");
    let name = release_name();
    let stage = dist.join(&name);
    if stage.exists() {
        fs::remove_dir_all(&stage).with_context(|| format!("removing {}", stage.display()))?;
    }
    fs::create_dir_all(&stage).with_context(|| format!("creating {}", stage.display()))?;

    let binary = stage.join(PLUGIN_BIN);
    copy(&shipped_plugin_bin(), &binary)?;
    // The node agent, built with the plugin (same package and profile).
    copy(
        &shipped_plugin_bin().with_file_name(AGENT_BIN),
        &stage.join(AGENT_BIN),
    )?;

    let completions = stage.join("completions");
    fs::create_dir_all(&completions)?;
    for (shell, file) in COMPLETIONS {
        let script = capture(Command::new(&binary).args(["completions", shell]))?;
        write(&completions.join(file), script.as_bytes())?;
    }
    let man = stage.join("man/man1");
    fs::create_dir_all(&man)?;
    run(Command::new(&binary)
        .args(["man", "--out-dir"])
        .arg(&man)
        .stdout(std::process::Stdio::null()))?;

    let root = crate::cmd::workspace_root();
    let deploy = stage.join("deploy");
    fs::create_dir_all(&deploy)?;
    for file in DEPLOY_FILES {
        copy(&root.join("deploy").join(file), &deploy.join(file))?;
    }
    let manifest_path = deploy.join("daemonset.yaml");
    let manifest = fs::read_to_string(&manifest_path)?;
    write(
        &manifest_path,
        versioned_manifest(&manifest, env!("CARGO_PKG_VERSION"))?.as_bytes(),
    )?;
    for file in ["README.md", "LICENSE"] {
        copy(&root.join(file), &stage.join(file))?;
    }

    let files = relative_files(&stage)?;
    let mut sums = String::new();
    for file in &files {
        let line = capture(Command::new("sha256sum").arg(file).current_dir(&stage))?;
        sums.push_str(&line);
    }
    write(&stage.join("SHA256SUMS"), sums.as_bytes())?;

    let tarball = tarball_path();
    let mtime = capture(
        Command::new("git")
            .args(["log", "-1", "--format=%ct"])
            .current_dir(&root),
    )
    .map_or_else(|_| "0".to_owned(), |time| time.trim().to_owned());
    run(Command::new("tar")
        .args(["--sort=name", "--owner=0", "--group=0", "--numeric-owner"])
        .arg(format!("--mtime=@{mtime}"))
        .args(["--use-compress-program", "gzip -n -9"])
        .arg("-cf")
        .arg(&tarball)
        .arg("-C")
        .arg(&dist)
        .arg(&name))?;
    let digest = capture(
        Command::new("sha256sum")
            .arg(tarball.file_name().expect("a file name"))
            .current_dir(&dist),
    )?;
    write(
        &dist.join(format!("{name}.tar.gz.sha256")),
        digest.as_bytes(),
    )?;
    println!(
        "dist: wrote {} ({} files)",
        tarball.display(),
        files.len() + 1
    );
    Ok(tarball)
}

/// `manifest` with the development image replaced by `ebpf-portmap:<version>`
/// in every container (the installer and the agent share the image). An
/// error if the manifest names no image, or any other image than the
/// development one (a renamed image would otherwise ship unversioned).
pub fn versioned_manifest(manifest: &str, version: &str) -> Result<String> {
    let wanted = format!("image: {DEV_IMAGE}");
    let images: Vec<&str> = manifest
        .lines()
        .map(str::trim)
        .filter(|line| line.starts_with("image:"))
        .collect();
    if images.is_empty() || images.iter().any(|line| *line != wanted) {
        bail!(
            "every image of deploy/daemonset.yaml must be `{wanted}` (found {})",
            if images.is_empty() {
                "none".to_owned()
            } else {
                images.join(", ")
            }
        );
    }
    Ok(manifest.replace(&wanted, &format!("image: {PLUGIN_BIN}:{version}")))
}

/// Every file below `dir`, relative to it, sorted.
fn relative_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(current) = pending.pop() {
        for entry in fs::read_dir(&current)? {
            let path = entry?.path();
            if path.is_dir() {
                pending.push(path);
            } else {
                files.push(path.strip_prefix(dir)?.to_path_buf());
            }
        }
    }
    files.sort();
    Ok(files)
}

fn copy(from: &Path, to: &Path) -> Result<()> {
    fs::copy(from, to)
        .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
    Ok(())
}

fn write(path: &Path, contents: &[u8]) -> Result<()> {
    fs::write(path, contents).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_manifest_names_the_version() {
        let manifest = "spec:\n  containers:\n    - name: install\n      image: ebpf-portmap:dev\n";
        let versioned = versioned_manifest(manifest, "1.2.3").expect("one image line");
        assert!(
            versioned.contains("image: ebpf-portmap:1.2.3"),
            "{versioned}"
        );
        assert!(!versioned.contains(":dev"), "{versioned}");
    }

    #[test]
    fn a_manifest_without_the_dev_image_is_refused() {
        let error =
            versioned_manifest("image: other:latest\n", "1.2.3").expect_err("nothing to version");
        assert!(error.to_string().contains("other:latest"), "{error}");
        let mixed = "image: ebpf-portmap:dev\nimage: other:latest\n";
        assert!(versioned_manifest(mixed, "1.2.3").is_err());
        assert!(versioned_manifest("kind: DaemonSet\n", "1.2.3").is_err());
        let both = "image: ebpf-portmap:dev\n  image: ebpf-portmap:dev\n";
        let versioned = versioned_manifest(both, "1.2.3").expect("both containers");
        assert_eq!(versioned.matches("image: ebpf-portmap:1.2.3").count(), 2);
    }

    #[test]
    fn the_release_is_named_by_version_and_arch() {
        let name = release_name();
        assert!(
            name.starts_with(&format!("ebpf-portmap-{}-", env!("CARGO_PKG_VERSION"))),
            "{name}"
        );
        assert!(name.ends_with("-linux"), "{name}");
    }
}
