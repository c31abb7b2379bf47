//! `ebpf-portmap chain` as an operator runs it: which configuration it
//! edits (`--network NAME`, `--file PATH`, or the lexically first), and that
//! a wrong choice is refused with a message naming the fix and nothing
//! written. The file edits themselves are unit-tested in `chain.rs`; the
//! installer's use of the verb in `deploy.rs`. Needs no root.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use portmap_tests::plugin_bin;
use portmap_tests::tmp::TempDir;
use serde_json::{Value, json};

fn list(name: &str, main: &str) -> String {
    serde_json::to_string_pretty(&json!({
        "cniVersion": "1.0.0",
        "name": name,
        "plugins": [{"type": main}],
    }))
    .expect("JSON")
}

fn chain(args: &[&str]) -> Output {
    Command::new(plugin_bin())
        .arg("chain")
        .args(args)
        .env_remove("CNI_COMMAND")
        .output()
        .expect("running ebpf-portmap chain")
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    fs::read_dir(dir)
        .expect("listing")
        .map(|e| {
            let path = e.expect("entry").path();
            let bytes = fs::read(&path).expect("reading");
            (path, bytes)
        })
        .collect()
}

fn types(path: &Path) -> Vec<String> {
    let list: Value = serde_json::from_slice(&fs::read(path).expect("reading")).expect("JSON");
    list["plugins"]
        .as_array()
        .expect("plugins")
        .iter()
        .map(|p| p["type"].as_str().expect("type").to_owned())
        .collect()
}

/// kindnet sorts first; CRI-O with `cni_default_network = "crio"` and podman
/// use the other two by name.
struct NetDir {
    dir: TempDir,
}

impl NetDir {
    fn new() -> NetDir {
        let dir = TempDir::new("chain");
        fs::write(
            dir.path().join("10-kindnet.conflist"),
            list("kindnet", "ptp"),
        )
        .expect("write");
        fs::write(dir.path().join("20-crio.conflist"), list("crio", "bridge")).expect("write");
        fs::write(
            dir.path().join("87-podman.conflist"),
            list("podman", "bridge"),
        )
        .expect("write");
        NetDir { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn net_dir(&self) -> &str {
        self.dir.path().to_str().expect("UTF-8 path")
    }
}

#[test]
fn network_chains_the_named_network_and_check_and_remove_follow_it() {
    let node = NetDir::new();
    let by_name = ["--net-dir", node.net_dir(), "--network", "crio"];
    let check = |args: &[&str]| chain(&[&["check"], args].concat());

    let out = check(&by_name);
    assert_eq!(
        out.status.code(),
        Some(1),
        "not chained yet: {}",
        text(&out)
    );
    let out = chain(&[&["install"], &by_name[..]].concat());
    assert!(out.status.success(), "install --network: {}", text(&out));
    assert!(
        text(&out).contains("20-crio.conflist: chained"),
        "{}",
        text(&out)
    );
    assert_eq!(
        types(&node.path("20-crio.conflist")),
        ["bridge", "ebpf-portmap"]
    );
    assert_eq!(
        types(&node.path("10-kindnet.conflist")),
        ["ptp"],
        "the first file is untouched"
    );
    assert_eq!(types(&node.path("87-podman.conflist")), ["bridge"]);
    assert!(
        check(&by_name).status.success(),
        "check --network sees it chained"
    );
    let out = check(&["--net-dir", node.net_dir()]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "the default (first file) is still not chained: {}",
        text(&out)
    );

    let out = chain(&[&["remove"], &by_name[..]].concat());
    assert!(out.status.success(), "remove --network: {}", text(&out));
    assert_eq!(
        fs::read_to_string(node.path("20-crio.conflist")).expect("read"),
        list("crio", "bridge"),
        "restored byte for byte"
    );
}

#[test]
fn file_chains_exactly_that_file() {
    let node = NetDir::new();
    let file = node.path("87-podman.conflist");
    let file = file.to_str().expect("UTF-8");
    let out = chain(&["install", "--file", file]);
    assert!(out.status.success(), "install --file: {}", text(&out));
    assert_eq!(
        types(&node.path("87-podman.conflist")),
        ["bridge", "ebpf-portmap"]
    );
    assert_eq!(types(&node.path("10-kindnet.conflist")), ["ptp"]);
    assert_eq!(types(&node.path("20-crio.conflist")), ["bridge"]);
    assert!(chain(&["check", "--file", file]).status.success());
}

#[test]
fn a_wrong_choice_is_refused_naming_the_fix_and_writes_nothing() {
    let node = NetDir::new();
    let before = snapshot(node.dir.path());

    let out = chain(&["install", "--net-dir", node.net_dir(), "--network", "cbr0"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let message = text(&out);
    for needed in ["\"cbr0\"", "\"kindnet\"", "\"crio\"", "\"podman\""] {
        assert!(
            message.contains(needed),
            "the refusal names {needed} (what is there): {message}"
        );
    }

    let notes = node.path("notes.txt");
    fs::write(&notes, "{}").expect("write");
    let out = chain(&["install", "--file", notes.to_str().expect("UTF-8")]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains(".conf, .conflist or .json"),
        "{}",
        text(&out)
    );
    fs::remove_file(&notes).expect("remove");

    // Contradictory flags are a usage error (exit 2), caught before any file is read.
    let file = node.path("20-crio.conflist");
    let file = file.to_str().expect("UTF-8");
    for args in [
        &["install", "--network", "crio", "--file", file][..],
        &["install", "--net-dir", node.net_dir(), "--file", file][..],
    ] {
        let out = chain(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
    }
    assert_eq!(snapshot(node.dir.path()), before, "nothing was written");
}
