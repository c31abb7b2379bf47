//! The image every runtime's workloads run, built here without a
//! registry: a root filesystem of Debian's static busybox (`sh`, `httpd`,
//! `mkdir`) and the tests' connection tester `probe` (with the shared
//! libraries `ldd` names), as a plain tarball (`podman import`) or as an
//! OCI image-layout archive with one uncompressed layer (`ctr images
//! import`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{Value, json};

/// Where the image has the test's connection tester.
pub const IMAGE_PROBE: &str = "/usr/local/bin/probe";
/// The busybox every workload runs (`httpd`, `sh`).
pub const BUSYBOX: &str = "/bin/busybox";

/// Fills `rootfs` with busybox and its applets `sh`, `httpd`, `mkdir`, and
/// `probe` at [`IMAGE_PROBE`].
///
/// # Panics
/// If a file cannot be copied or linked.
pub fn build_rootfs(rootfs: &Path, probe: &Path) {
    install_binary(rootfs, Path::new(BUSYBOX), Path::new(BUSYBOX));
    for applet in ["sh", "httpd", "mkdir"] {
        let link = rootfs.join("bin").join(applet);
        std::os::unix::fs::symlink("busybox", &link)
            .unwrap_or_else(|e| panic!("linking {}: {e}", link.display()));
    }
    install_binary(rootfs, probe, Path::new(IMAGE_PROBE));
}

/// `tar -cf archive .` of `dir`, numeric owners.
pub fn tar_dir(dir: &Path, archive: &Path) {
    run_tool(
        Command::new("tar")
            .arg("-C")
            .arg(dir)
            .args(["--numeric-owner", "-cf"])
            .arg(archive)
            .arg("."),
    );
}

/// Makes `rootfs` into an OCI image-layout archive named `name` under
/// `work` (one uncompressed layer, `entrypoint` as its entrypoint); the
/// archive's path.
pub fn oci_archive(work: &Path, rootfs: &Path, name: &str, entrypoint: &str) -> PathBuf {
    let layout = work.join("layout");
    let blobs = layout.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).unwrap_or_else(|e| panic!("creating {}: {e}", blobs.display()));
    let layer = work.join("layer.tar");
    tar_dir(rootfs, &layer);
    let layer_digest = sha256_file(&layer);
    let layer_size = file_size(&layer);
    std::fs::rename(&layer, blobs.join(&layer_digest)).expect("moving the layer blob");
    let config = image_config(&layer_digest, entrypoint);
    let (config_digest, config_size) = add_blob(&blobs, &config);
    let manifest = image_manifest(&config_digest, config_size, &layer_digest, layer_size);
    let (manifest_digest, manifest_size) = add_blob(&blobs, &manifest);
    write_file(
        &layout.join("index.json"),
        &image_index(name, &manifest_digest, manifest_size).to_string(),
    );
    write_file(
        &layout.join("oci-layout"),
        r#"{"imageLayoutVersion":"1.0.0"}"#,
    );
    let archive = work.join("image.tar");
    run_tool(
        Command::new("tar")
            .arg("-C")
            .arg(&layout)
            .arg("-cf")
            .arg(&archive)
            .args(["oci-layout", "index.json", "blobs"]),
    );
    archive
}

/// Copies `binary` to `rootfs/<at>` and every shared library `ldd` names to
/// the same path inside `rootfs` (the loader included).
pub fn install_binary(rootfs: &Path, binary: &Path, at: &Path) {
    let copy = |from: &Path, to: &Path| {
        let target = rootfs.join(to.strip_prefix("/").unwrap_or(to));
        if target.exists() {
            return;
        }
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)
                .unwrap_or_else(|e| panic!("creating {}: {e}", parent.display()));
        }
        // Symlinked library paths are copied as the files they name.
        std::fs::copy(from, &target)
            .unwrap_or_else(|e| panic!("copying {} to {}: {e}", from.display(), target.display()));
    };
    copy(binary, at);
    let out = Command::new("ldd").arg(binary).output().expect("run ldd");
    // A static binary makes ldd fail ("not a dynamic executable"): nothing to add.
    if out.status.success() {
        for library in parse_ldd(&String::from_utf8_lossy(&out.stdout)) {
            copy(&library, &library);
        }
    }
}

/// The absolute paths in `ldd` output (libraries and the loader).
pub fn parse_ldd(text: &str) -> Vec<PathBuf> {
    text.lines()
        .filter_map(|line| {
            let line = line.trim();
            let path = match line.split_once("=>") {
                Some((_, rest)) => rest.split_whitespace().next()?,
                None => line.split_whitespace().next()?,
            };
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect()
}

/// The image's config: amd64/arm64 Linux, `entrypoint` as the entrypoint.
fn image_config(layer_digest: &str, entrypoint: &str) -> Value {
    json!({
        "architecture": oci_architecture(),
        "os": "linux",
        "config": { "Entrypoint": [entrypoint], "WorkingDir": "/" },
        "rootfs": { "type": "layers", "diff_ids": [format!("sha256:{layer_digest}")] },
    })
}

fn image_manifest(
    config_digest: &str,
    config_size: u64,
    layer_digest: &str,
    layer_size: u64,
) -> Value {
    json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": format!("sha256:{config_digest}"),
            "size": config_size,
        },
        "layers": [{
            "mediaType": "application/vnd.oci.image.layer.v1.tar",
            "digest": format!("sha256:{layer_digest}"),
            "size": layer_size,
        }],
    })
}

/// `index.json`: the manifest, named `name` for containerd's import.
fn image_index(name: &str, manifest_digest: &str, manifest_size: u64) -> Value {
    let tag = name.rsplit_once(':').map_or("latest", |(_, tag)| tag);
    json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": format!("sha256:{manifest_digest}"),
            "size": manifest_size,
            "annotations": {
                "io.containerd.image.name": name,
                "org.opencontainers.image.ref.name": tag,
            },
            "platform": { "architecture": oci_architecture(), "os": "linux" },
        }],
    })
}

/// The OCI name of this machine's architecture.
fn oci_architecture() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// Runs a tool that must succeed; its stdout.
pub fn run_tool(command: &mut Command) -> String {
    let shown = format!("{command:?}");
    let out = command
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("starting {shown}: {e}"));
    assert!(
        out.status.success(),
        "{shown} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The hex SHA-256 of a file (`sha256sum`, coreutils).
fn sha256_file(path: &Path) -> String {
    let out = run_tool(Command::new("sha256sum").arg(path));
    let digest = out.split_whitespace().next().unwrap_or_default().to_owned();
    assert!(
        digest.len() == 64 && digest.bytes().all(|b| b.is_ascii_hexdigit()),
        "sha256sum printed {out:?}"
    );
    digest
}

/// Writes `value` as a blob: its digest and size.
fn add_blob(blobs: &Path, value: &Value) -> (String, u64) {
    let staged = blobs.join("staged");
    write_file(&staged, &value.to_string());
    let digest = sha256_file(&staged);
    let size = file_size(&staged);
    std::fs::rename(&staged, blobs.join(&digest)).expect("naming a blob by its digest");
    (digest, size)
}

fn write_file(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
}

fn file_size(path: &Path) -> u64 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("stat {}: {e}", path.display()))
        .len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_paths() {
        let text = "\tlinux-vdso.so.1 (0x00007ffd)\n\tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x1)\n\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x2)\n\t/lib64/ld-linux-x86-64.so.2 (0x3)\n";
        assert_eq!(
            parse_ldd(text),
            [
                PathBuf::from("/lib/x86_64-linux-gnu/libgcc_s.so.1"),
                PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"),
                PathBuf::from("/lib64/ld-linux-x86-64.so.2"),
            ]
        );
    }

    #[test]
    fn image_documents_reference_each_other() {
        let index = image_index("localhost/epm-ctrd:1", "ab", 12);
        assert_eq!(
            index["manifests"][0]["annotations"]["io.containerd.image.name"],
            "localhost/epm-ctrd:1"
        );
        assert_eq!(
            index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"],
            "1"
        );
        assert_eq!(index["manifests"][0]["digest"], "sha256:ab");
        let manifest = image_manifest("cd", 3, "ef", 4);
        assert_eq!(manifest["config"]["digest"], "sha256:cd");
        assert_eq!(manifest["layers"][0]["digest"], "sha256:ef");
        assert_eq!(manifest["layers"][0]["size"], 4);
        let config = image_config("ef", "/pause");
        assert_eq!(config["rootfs"]["diff_ids"][0], "sha256:ef");
        assert_eq!(config["config"]["Entrypoint"][0], "/pause");
    }
}
