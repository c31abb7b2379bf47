//! The release tarball of `cargo xtask dist`, as an operator gets it:
//! unpacked into an empty folder, its checksums verified, and the unpacked
//! binary driven (`--version`, `completions`, `man`, and the demo's ADD,
//! traffic and DEL through a real CNI chain).
//!
//! The tests are `#[ignore]`d for a plain `cargo test`, which has no
//! tarball; `cargo xtask test` writes one and runs them with `--ignored`,
//! passing its path in `EPM_DIST_TARBALL` (without it they fail). Needs root
//! for the demo.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use portmap_tests::release::Release;

const SHELLS: &[(&str, &str)] = &[
    ("bash", "completions/ebpf-portmap.bash"),
    ("zsh", "completions/_ebpf-portmap"),
    ("fish", "completions/ebpf-portmap.fish"),
];
/// Every verb gets a page; `help` does not.
const VERBS: &[&str] = &[
    "list",
    "status",
    "trace",
    "gc",
    "uninstall",
    "reconcile",
    "migrate",
    "chain",
    "version",
    "completions",
    "man",
];

/// What the tests do with an unpacked release.
trait Unpacked {
    fn binary(&self) -> PathBuf;
    fn run(&self, args: &[&str]) -> Output;
    fn read(&self, relative: &str) -> Vec<u8>;
}

impl Unpacked for Release {
    fn binary(&self) -> PathBuf {
        self.root.join("ebpf-portmap")
    }

    fn run(&self, args: &[&str]) -> Output {
        let output = Command::new(self.binary())
            .args(args)
            .env_remove("CNI_COMMAND")
            .output()
            .unwrap_or_else(|e| panic!("running the unpacked binary with {args:?}: {e}"));
        assert!(
            output.status.success(),
            "`ebpf-portmap {}` failed ({}): {}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        output
    }

    fn read(&self, relative: &str) -> Vec<u8> {
        std::fs::read(self.root.join(relative))
            .unwrap_or_else(|e| panic!("the tarball has no {relative}: {e}"))
    }
}

fn stdout(output: &Output) -> String {
    String::from_utf8(output.stdout.clone()).expect("UTF-8 output")
}

#[test]
#[ignore = "needs the release tarball: cargo xtask test runs it"]
fn the_checksums_cover_every_file_and_match() {
    let release = Release::from_env();
    let check = Command::new("sha256sum")
        .args(["--check", "--strict", "SHA256SUMS"])
        .current_dir(&release.root)
        .output()
        .expect("running sha256sum");
    assert!(
        check.status.success(),
        "sha256sum --check failed: {}{}",
        stdout(&check),
        String::from_utf8_lossy(&check.stderr)
    );
    let listed: Vec<String> = String::from_utf8(release.read("SHA256SUMS"))
        .expect("UTF-8")
        .lines()
        .map(|line| {
            line.split_once("  ")
                .unwrap_or_else(|| panic!("not a sha256sum line: {line}"))
                .1
                .to_owned()
        })
        .collect();
    let mut on_disk = files_below(&release.root, &release.root);
    on_disk.retain(|f| f != "SHA256SUMS");
    on_disk.sort();
    assert_eq!(listed, on_disk, "SHA256SUMS must list every other file");
    for required in [
        "ebpf-portmap",
        "ebpf-portmap-agent",
        "LICENSE",
        "README.md",
        "deploy/daemonset.yaml",
        "deploy/install.sh",
        "deploy/Dockerfile",
        "deploy/metrics-proxy.yaml",
        "deploy/metrics-proxy-patch.yaml",
    ] {
        assert!(
            listed.iter().any(|f| f == required),
            "the tarball has no {required}"
        );
    }
}

fn files_below(root: &Path, dir: &Path) -> Vec<String> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).expect("reading a folder") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            files.extend(files_below(root, &path));
        } else {
            let relative = path.strip_prefix(root).expect("below the root");
            files.push(relative.to_string_lossy().into_owned());
        }
    }
    files
}

#[test]
#[ignore = "needs the release tarball: cargo xtask test runs it"]
fn the_binary_is_static_and_says_its_version() {
    let release = Release::from_env();
    let headers = Command::new("readelf")
        .args(["--program-headers", "--wide"])
        .arg(release.binary())
        .output()
        .expect("running readelf");
    assert!(headers.status.success(), "readelf failed");
    assert!(
        !stdout(&headers).contains("INTERP"),
        "the shipped binary must be static (no program interpreter)"
    );
    let version = stdout(&release.run(&["--version"]));
    assert_eq!(
        version.trim(),
        format!("ebpf-portmap {}", release.version),
        "--version names the tarball's version"
    );
    let report = stdout(&release.run(&["version", "--json"]));
    let report: serde_json::Value = serde_json::from_str(&report).expect("version --json");
    assert_eq!(report["version"], release.version.as_str());
    let build = report["build"].as_str().expect("a build id");
    assert!(
        build.len() == 16 && build.bytes().all(|b| b.is_ascii_hexdigit()),
        "the build id is 16 hex digits: {build}"
    );
}

#[test]
#[ignore = "needs the release tarball: cargo xtask test runs it"]
fn completions_are_shipped_and_match_the_binary() {
    let release = Release::from_env();
    for (shell, file) in SHELLS {
        let generated = release.run(&["completions", shell]).stdout;
        assert_eq!(
            generated,
            release.read(file),
            "{file} must be what `completions {shell}` prints"
        );
        let script = String::from_utf8(generated).expect("UTF-8");
        for verb in VERBS {
            assert!(
                script.contains(verb),
                "the {shell} completion misses {verb}"
            );
        }
    }
    let syntax = Command::new("bash")
        .arg("-n")
        .arg(release.root.join("completions/ebpf-portmap.bash"))
        .status()
        .expect("running bash -n");
    assert!(syntax.success(), "the bash completion does not parse");
}

#[test]
#[ignore = "needs the release tarball: cargo xtask test runs it"]
fn man_pages_are_shipped_for_the_binary_and_every_verb() {
    let release = Release::from_env();
    let main = release.run(&["man"]).stdout;
    assert_eq!(main, release.read("man/man1/ebpf-portmap.1"));
    let text = String::from_utf8(main).expect("UTF-8");
    assert!(
        text.contains(".TH ebpf-portmap 1") && text.contains(&release.version),
        "the main page has a title with the version: {text}"
    );
    for verb in VERBS {
        let page = release.run(&["man", verb]).stdout;
        assert_eq!(
            page,
            release.read(&format!("man/man1/ebpf-portmap-{verb}.1")),
            "the page of {verb}"
        );
    }
}

#[test]
#[ignore = "needs the release tarball: cargo xtask test runs it"]
fn the_manifest_names_the_released_image() {
    let release = Release::from_env();
    let manifest = String::from_utf8(release.read("deploy/daemonset.yaml")).expect("UTF-8");
    let image = format!("image: ebpf-portmap:{}", release.version);
    assert!(
        manifest.contains(&image),
        "the manifest must name `{image}`"
    );
    assert!(
        !manifest.contains("ebpf-portmap:dev"),
        "the released manifest still names the development image"
    );
}

#[test]
#[ignore = "needs the release tarball: cargo xtask test runs it"]
fn the_unpacked_binary_publishes_a_port_end_to_end() {
    let release = Release::from_env();
    // The demo: bridge + host-local + the plugin, ADD, TCP and UDP from an
    // external namespace over IPv4 and IPv6, DEL, nothing left.
    let demo = Command::new(env!("CARGO_BIN_EXE_demo"))
        .env("EBPF_PORTMAP_BIN", release.binary())
        .output()
        .expect("running the demo");
    let text = stdout(&demo);
    assert!(
        demo.status.success(),
        "the demo through the unpacked binary failed ({}):\n{text}\n{}",
        demo.status,
        String::from_utf8_lossy(&demo.stderr)
    );
    assert!(
        text.contains(&format!("plugin binary {}", release.binary().display())),
        "the demo must have run the unpacked binary:\n{text}"
    );
    assert!(text.contains(" 0 failed"), "{text}");
}
