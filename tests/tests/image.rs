//! The installer image as a node runs it: built from the release tarball
//! (`tests/src/image.rs`, the same code as `cargo xtask image`), then run by
//! podman the way the DaemonSet runs it, with every capability dropped and a
//! read-only root, against a fake node root: `install` puts the binary and
//! the chained conflist there, `ready` agrees, `uninstall` restores the node
//! byte for byte.
//!
//! `#[ignore]`d in a plain `cargo test` (it needs podman and the tarball);
//! `cargo xtask test` runs it with `--ignored` and `EPM_DIST_TARBALL` set,
//! after installing podman. Needs root.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use portmap_tests::cni::Conflist;
use portmap_tests::podman::Podman;
use portmap_tests::release::Release;
use portmap_tests::tmp::TempDir;
use portmap_tests::{NetNs, image};
use serde_json::{Value, json};

/// Where the DaemonSet mounts the node (`HOST_ROOT` in the manifest).
const HOST_ROOT: &str = "/host";
const BRIDGE: &str = r#"{
  "cniVersion": "1.0.0",
  "name": "k8s-pod-network",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "ipam": {"type": "host-local", "subnet": "10.244.0.0/24"}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
"#;

/// Every file below `dir` with its bytes, by path relative to `dir`.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut files = BTreeMap::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(current) = pending.pop() {
        for entry in std::fs::read_dir(&current).expect("reading the fake node") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                pending.push(path);
            } else {
                let bytes = std::fs::read(&path).expect("reading a file");
                files.insert(path.strip_prefix(dir).expect("below").to_path_buf(), bytes);
            }
        }
    }
    files
}

#[test]
#[ignore = "needs podman and the release tarball: cargo xtask test runs it"]
fn the_image_installs_and_uninstalls_with_no_capabilities_and_a_read_only_root() {
    let release = Release::from_env();
    let node = NetNs::new("image");
    let conflist = Conflist::from_json(json!({
        "cniVersion": "1.0.0",
        "name": "epm-image",
        "plugins": [{"type": "loopback"}],
    }))
    .expect("a conflist");
    let plugins = TempDir::new("image-plugins");
    let podman = Podman::start(&node, plugins.path(), &conflist);
    let tag = image::build(&podman, &release.root, &release.version);

    let inspected: Value = serde_json::from_str(
        &podman
            .run(&["image", "inspect", &tag])
            .unwrap_or_else(|e| panic!("{e}")),
    )
    .expect("image inspect is JSON");
    let config = &inspected[0]["Config"];
    assert_eq!(
        config["Entrypoint"],
        json!(["/usr/local/bin/install.sh"]),
        "{config}"
    );
    assert_eq!(config["Cmd"], json!(["watch"]), "{config}");

    let fake = TempDir::new("image-node");
    let net_dir = fake.path().join("etc/cni/net.d");
    std::fs::create_dir_all(&net_dir).expect("mkdir");
    std::fs::create_dir_all(fake.path().join("opt/cni/bin")).expect("mkdir");
    std::fs::write(net_dir.join("10-bridge.conflist"), BRIDGE).expect("write");
    let before = snapshot(fake.path());

    let cgroup_parent = podman.cgroup_parent();
    let volume = format!("{}:{HOST_ROOT}", fake.path().display());
    let host_root = format!("HOST_ROOT={HOST_ROOT}");
    let run = |action: &str| {
        podman.run(&[
            "run",
            "--rm",
            "--network",
            "none",
            "--cap-drop",
            "ALL",
            "--read-only",
            "--cgroup-parent",
            &cgroup_parent,
            "--volume",
            &volume,
            "--env",
            &host_root,
            &tag,
            action,
        ])
    };

    let said = run("install").unwrap_or_else(|e| panic!("install in the image: {e}"));
    assert!(said.contains("chained"), "install says what it did: {said}");
    let installed = std::fs::read(fake.path().join("opt/cni/bin/ebpf-portmap"))
        .expect("the binary was installed on the node");
    assert_eq!(
        installed,
        std::fs::read(release.root.join("ebpf-portmap")).expect("the release binary"),
        "the node got the tarball's binary"
    );
    let chained: Value = serde_json::from_slice(
        &std::fs::read(net_dir.join("10-bridge.conflist")).expect("the chained conflist"),
    )
    .expect("JSON");
    assert_eq!(
        chained["plugins"][1]["type"], "ebpf-portmap",
        "upstream portmap replaced in place: {chained}"
    );
    run("ready").unwrap_or_else(|e| panic!("ready after install: {e}"));

    run("uninstall").unwrap_or_else(|e| panic!("uninstall in the image: {e}"));
    assert_eq!(
        snapshot(fake.path()),
        before,
        "uninstall leaves the node as it was"
    );
}
