//! `cargo xtask setup`: every tool the build and the tests need, installed
//! idempotently (one line per step says what it found or did).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::cmd::{capture, cargo_home, path_with_first, run, target_dir};
use crate::plugin::{PLUGIN_BIN, PLUGIN_TARGET, plugin_target_installed};
use crate::step::Step;
use anyhow::{Context, Result, bail};

/// Debian packages the build and the tests need: LLVM 22 for bpf-linker
/// (and the libraries it links), the reference CNI plugins, and the tools the
/// harness and the iptables-based reference plugin call.
pub(crate) const APT_PACKAGES: &[&str] = &[
    "llvm-22-dev",
    "libpolly-22-dev",
    "libzstd-dev",
    "zlib1g-dev",
    "libxml2-dev",
    "containernetworking-plugins",
    "iproute2",
    "iptables",
    "conntrack",
    "bpftool",
    // The security tests stand in for a runtime's port holder with socat and
    // drop capabilities with setpriv (util-linux).
    "socat",
    "util-linux",
    // The deploy tests run install.sh under busybox (the image's shell) and
    // lint it with shellcheck.
    "busybox-static",
    "shellcheck",
    // The agent test scrapes the node agent with a real Prometheus (its own
    // process and config, not the package's service) and checks the
    // exposition with promtool.
    "prometheus",
    // tests/tests/firewalld.rs runs a real firewalld (with its own D-Bus
    // system bus) in a test node's network namespace. Installing starts
    // nothing: these machines have no service manager.
    "firewalld",
    "dbus-daemon",
    // `cargo xtask bench` and portmap-user/tests/program_profile.rs sample
    // the programs with perf to say where their time goes, line by line.
    "linux-perf",
    // tests/tests/pod_scale.rs counts a plugin run's bpf() calls with
    // `strace -c` (aya's calls are not the plugin's to count).
    "strace",
];

/// bpf-linker must match rustc's LLVM major (22). Pinned: 0.13 is the
/// release known to build with `--features llvm-22` on this toolchain.
pub(crate) const BPF_LINKER_VERSION: &str = "0.13.0";

pub(crate) const LLVM_BIN_DIR: &str = "/usr/lib/llvm-22/bin";

pub(crate) const BPFFS_MOUNT: &str = "/sys/fs/bpf";

/// kubernetes-validate (PyPI) bundles the Kubernetes OpenAPI schemas, so it
/// validates offline. Installed into a venv under the target directory.
pub(crate) const KUBERNETES_VALIDATE: &str = "kubernetes-validate";

pub(crate) const KUBERNETES_VALIDATE_VERSION: &str = "1.37.0";

pub(crate) fn setup_steps() -> Vec<Step<'static>> {
    vec![
        Step::new("Debian packages", ensure_apt_packages),
        Step::new("nightly toolchain", ensure_nightly),
        Step::new("rust-src for nightly", ensure_rust_src),
        Step::new("clippy and rustfmt", ensure_lint_components),
        Step::new("bpf-linker", ensure_bpf_linker),
        Step::new("musl target for the plugin", ensure_plugin_target),
        Step::new("bpffs mount", ensure_bpffs),
        Step::new("kubernetes-validate", ensure_kubernetes_validate),
        Step::new(
            "containerd 2.x and the CNI plugins 1.9 from Debian unstable",
            ensure_unstable_runtime,
        ),
        Step::new(
            "nft for upstream portmap's nftables backend",
            ensure_private_nft,
        ),
    ]
}

/// Every setup step; each prints its own one-line outcome.
pub(crate) fn setup() -> Result<()> {
    for step in setup_steps() {
        (step.run)().with_context(|| format!("setup: {}", step.name))?;
    }
    Ok(())
}

/// `setup` as one step of another verb.
pub(crate) fn setup_step() -> Step<'static> {
    Step::new("setup", setup)
}

pub(crate) fn ensure_apt_packages() -> Result<()> {
    ensure_packages("setup", APT_PACKAGES)
}

/// Installs whichever of `packages` dpkg does not list as installed
/// (`apt-get update` first), one line when there is nothing to do; `label`
/// starts each line.
pub(crate) fn ensure_packages(label: &str, packages: &[&str]) -> Result<()> {
    let missing: Vec<&str> = packages
        .iter()
        .copied()
        .filter(|p| !dpkg_installed(p))
        .collect();
    if missing.is_empty() {
        println!(
            "{label}: Debian packages present ({}), skipping",
            packages.join(" ")
        );
        return Ok(());
    }
    println!(
        "{label}: apt-get update (missing: {}) ...",
        missing.join(" ")
    );
    run(apt_get().arg("update"))?;
    println!("{label}: installing {} ...", missing.join(" "));
    run(apt_get()
        .args(["install", "-y", "--no-install-recommends"])
        .args(&missing))?;
    let still_missing: Vec<&str> = missing.into_iter().filter(|p| !dpkg_installed(p)).collect();
    if !still_missing.is_empty() {
        bail!(
            "apt-get install did not install {}",
            still_missing.join(" ")
        );
    }
    Ok(())
}

pub(crate) fn apt_get() -> Command {
    let mut command = Command::new("apt-get");
    command.env("DEBIAN_FRONTEND", "noninteractive");
    command
}

pub(crate) fn dpkg_installed(package: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", package])
        .stderr(Stdio::null())
        .output()
        .is_ok_and(|out| {
            out.status.success()
                && String::from_utf8_lossy(&out.stdout).trim() == "install ok installed"
        })
}

pub(crate) fn ensure_nightly() -> Result<()> {
    let installed = capture(Command::new("rustup").args(["toolchain", "list"]))?;
    if installed
        .lines()
        .any(|line| line.starts_with("nightly-") || line.starts_with("nightly "))
    {
        println!("setup: nightly toolchain present, skipping");
        return Ok(());
    }
    println!("setup: installing the nightly toolchain (rustup, minimal profile) ...");
    run(Command::new("rustup").args(["toolchain", "install", "nightly", "--profile", "minimal"]))
}

pub(crate) fn ensure_rust_src() -> Result<()> {
    ensure_component(
        "nightly",
        "rust-src",
        "the eBPF build uses -Z build-std=core",
    )
}

/// The lint steps of `test`: clippy and rustfmt on the default toolchain,
/// clippy on nightly for the eBPF crate (a minimal nightly has none).
pub(crate) fn ensure_lint_components() -> Result<()> {
    let default = capture(Command::new("rustup").args(["show", "active-toolchain"]))?;
    let default = default
        .split_whitespace()
        .next()
        .unwrap_or("stable")
        .to_owned();
    ensure_component(&default, "clippy", "the lint step")?;
    ensure_component(&default, "rustfmt", "the format check")?;
    ensure_component("nightly", "clippy", "the eBPF crate's lint step")
}

/// `rustup component add COMPONENT --toolchain TOOLCHAIN` unless installed.
pub(crate) fn ensure_component(toolchain: &str, component: &str, why: &str) -> Result<()> {
    let installed = capture(Command::new("rustup").args([
        "component",
        "list",
        "--toolchain",
        toolchain,
        "--installed",
    ]))?;
    if installed
        .lines()
        .any(|line| line.trim() == component || line.starts_with(&format!("{component}-")))
    {
        println!("setup: {component} for {toolchain} present, skipping");
        return Ok(());
    }
    println!("setup: adding {component} to {toolchain} ({why}) ...");
    run(Command::new("rustup").args(["component", "add", component, "--toolchain", toolchain]))
}

pub(crate) fn ensure_bpf_linker() -> Result<()> {
    for candidate in [
        PathBuf::from("bpf-linker"),
        cargo_home().join("bin/bpf-linker"),
    ] {
        if let Ok(version) = capture(Command::new(&candidate).arg("--version")) {
            println!("setup: bpf-linker present ({}), skipping", version.trim());
            return Ok(());
        }
    }
    println!(
        "setup: installing bpf-linker {BPF_LINKER_VERSION} for LLVM 22 (cargo install, takes 1-3 min; {LLVM_BIN_DIR} first on PATH) ..."
    );
    run(Command::new("cargo")
        .args([
            "install",
            "bpf-linker",
            "--locked",
            "--version",
            BPF_LINKER_VERSION,
        ])
        .args(["--no-default-features", "--features", "llvm-22"])
        .env("PATH", path_with_first(Path::new(LLVM_BIN_DIR))?))
}

pub(crate) fn ensure_plugin_target() -> Result<()> {
    if plugin_target_installed() {
        println!("setup: Rust target {PLUGIN_TARGET} present, skipping");
        return Ok(());
    }
    println!("setup: adding the Rust target {PLUGIN_TARGET} (the plugin ships static) ...");
    if let Err(error) = run(Command::new("rustup").args(["target", "add", PLUGIN_TARGET])) {
        // Not fatal: the plugin then builds for the host, and only its
        // start-up is slower.
        println!(
            "setup: WARNING: {error:#}; {PLUGIN_BIN} is built for the host instead (dynamic glibc, about 0.9 ms slower per run)"
        );
    }
    Ok(())
}

pub(crate) fn ensure_bpffs() -> Result<()> {
    let mounts =
        std::fs::read_to_string("/proc/self/mounts").context("reading /proc/self/mounts")?;
    let mounted = mounts.lines().any(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        fields.get(1) == Some(&BPFFS_MOUNT) && fields.get(2) == Some(&"bpf")
    });
    if mounted {
        println!("setup: bpffs mounted at {BPFFS_MOUNT}, skipping");
        return Ok(());
    }
    println!("setup: mounting bpffs at {BPFFS_MOUNT} ...");
    run(Command::new("mount").args(["-t", "bpf", "bpf", BPFFS_MOUNT]))
}

pub(crate) fn validator_venv() -> PathBuf {
    target_dir().join("tools").join(KUBERNETES_VALIDATE)
}

pub(crate) fn validator_bin() -> PathBuf {
    validator_venv().join("bin").join(KUBERNETES_VALIDATE)
}

pub(crate) fn ensure_kubernetes_validate() -> Result<()> {
    let venv = validator_venv();
    if let Ok(version) = capture(Command::new(validator_bin()).arg("--version"))
        && version.trim() == KUBERNETES_VALIDATE_VERSION
    {
        println!(
            "setup: {KUBERNETES_VALIDATE} {KUBERNETES_VALIDATE_VERSION} present ({}), skipping",
            venv.display()
        );
        return Ok(());
    }
    println!(
        "setup: installing {KUBERNETES_VALIDATE} {KUBERNETES_VALIDATE_VERSION} into a venv at {} (pip) ...",
        venv.display()
    );
    let python = venv.join("bin/python");
    if !python.exists() {
        let create = || run(Command::new("python3").args(["-m", "venv"]).arg(&venv));
        if create().is_err() {
            // Debian's python3 makes venvs only with python3-venv.
            println!("setup: python3 -m venv failed; installing python3-venv ...");
            let _ = std::fs::remove_dir_all(&venv);
            run(apt_get().arg("update"))?;
            run(apt_get().args(["install", "-y", "--no-install-recommends", "python3-venv"]))?;
            create()?;
        }
    }
    run(Command::new(&python)
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
        ])
        .arg(format!(
            "{KUBERNETES_VALIDATE}=={KUBERNETES_VALIDATE_VERSION}"
        )))
}

// ---- containerd 2.x and the reference plugins 1.9 from Debian unstable ----

/// What the second containerd pass of the CRI suite needs and Debian 12 does
/// not carry: `(package, lowest version, first version refused)`. containerd
/// 2.x is what Kubernetes nodes run today (two DELs per pod, STATUS); the
/// plugins 1.9 speak `cniVersion` 1.1.0, which STATUS needs (Debian 12's
/// 1.1.1 refuse it). A 3.x or 2.x would change the runtime under test, so it
/// is a fallback, not an upgrade.
pub(crate) const UNSTABLE_PACKAGES: &[(&str, &str, &str)] = &[
    ("containerd", "2.1.9", "3"),
    ("containernetworking-plugins", "1.9.1", "2"),
];

/// The Debian suite they come from.
pub(crate) const UNSTABLE_SUITE: &str = "sid";

/// Where `apt-get download` and `dpkg-deb -x` work: `apt/` (the private
/// configuration, lists and cache), `debs/`, and `root/`, the unpacked
/// packages (`root/usr/bin/containerd`, `root/usr/lib/cni/portmap`, ...).
pub(crate) fn unstable_dir() -> PathBuf {
    target_dir().join("tools").join("debian-unstable")
}

/// The unpacked packages (see [`unstable_dir`]).
pub(crate) fn unstable_root() -> PathBuf {
    unstable_dir().join("root")
}

/// Written last into [`unstable_root`]: one `package version` line per
/// package. Its presence means the root is complete.
const UNSTABLE_STAMP: &str = ".packages";

/// Fetches [`UNSTABLE_PACKAGES`] with a private apt configuration (its own
/// sources list naming [`UNSTABLE_SUITE`] on this machine's Debian mirror,
/// its own lists and cache; nothing under `/etc/apt` changes and nothing is
/// installed), verified by apt against the signed index, and unpacks them
/// into [`unstable_root`]. Debian 12's `runc` stays in use: the unstable
/// one needs glibc 2.38. When the suite no longer carries a usable version,
/// or the binaries do not run here, it says so and goes on: the CRI suite
/// then runs on containerd 1.6 only, and its step says why.
pub(crate) fn ensure_unstable_runtime() -> Result<()> {
    let root = unstable_root();
    if let Some(found) = unstable_root_ready(&root) {
        println!("setup: {found} present in {}, skipping", root.display());
        return Ok(());
    }
    let started = std::time::Instant::now();
    match fetch_unstable_runtime(&root) {
        Ok(found) => {
            println!(
                "setup: {found} from Debian {UNSTABLE_SUITE} unpacked into {} in {:.1}s",
                root.display(),
                started.elapsed().as_secs_f64()
            );
        }
        Err(error) => {
            let _ = std::fs::remove_dir_all(&root);
            println!(
                "setup: WARNING: no usable containerd 2.x from Debian {UNSTABLE_SUITE}: {error:#}. \
                 The CRI suite runs on containerd 1.6 only. Wanted: {} \
                 (UNSTABLE_PACKAGES in xtask/src/setup.rs; move its bounds once a newer release passes the suite).",
                UNSTABLE_PACKAGES
                    .iter()
                    .map(|(p, low, high)| format!("{p} >= {low} and < {high}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    Ok(())
}

/// `containerd 2.1.9+ds1-5, containernetworking-plugins 1.9.1+ds1-1` if
/// `root` holds a complete unpack whose containerd runs, else `None`.
pub(crate) fn unstable_root_ready(root: &Path) -> Option<String> {
    let stamp = std::fs::read_to_string(root.join(UNSTABLE_STAMP)).ok()?;
    let containerd = root.join("usr/bin/containerd");
    capture(Command::new(&containerd).arg("--version")).ok()?;
    let versions: Vec<&str> = stamp.lines().filter(|l| !l.trim().is_empty()).collect();
    (versions.len() == UNSTABLE_PACKAGES.len()).then(|| versions.join(", "))
}

fn fetch_unstable_runtime(root: &Path) -> Result<String> {
    let dir = unstable_dir();
    let apt_dir = dir.join("apt");
    let debs = dir.join("debs");
    let _ = std::fs::remove_dir_all(root);
    let _ = std::fs::remove_dir_all(&debs);
    for sub in [
        apt_dir.join("lists/partial"),
        apt_dir.join("cache/archives/partial"),
        apt_dir.join("etc/sources.list.d"),
        apt_dir.join("etc/preferences.d"),
        apt_dir.join("state"),
        debs.clone(),
        root.to_path_buf(),
    ] {
        std::fs::create_dir_all(&sub).with_context(|| format!("creating {}", sub.display()))?;
    }
    let mirror = debian_mirror();
    std::fs::write(
        apt_dir.join("etc/sources.list"),
        unstable_sources_list(&mirror),
    )
    .context("writing the private sources.list")?;
    let config = apt_dir.join("apt.conf");
    std::fs::write(&config, private_apt_config(&apt_dir)?)
        .context("writing the private apt.conf")?;
    // The machine's apt.conf.d, read after APT_CONFIG, may turn the
    // binary cache off (Debian's container images do): without it every
    // apt call parses the whole unstable index again. Options on the
    // command line come last.
    let cache = apt_dir.join("cache");
    let private_apt = |program: &str| {
        let mut command = Command::new(program);
        command
            .env("APT_CONFIG", &config)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .arg("-q")
            .arg("-o")
            .arg(format!(
                "Dir::Cache::pkgcache={}",
                cache.join("pkgcache.bin").display()
            ))
            .arg("-o")
            .arg(format!(
                "Dir::Cache::srcpkgcache={}",
                cache.join("srcpkgcache.bin").display()
            ));
        command
    };
    println!("setup: apt-get update of Debian {UNSTABLE_SUITE} from {mirror} (private lists) ...");
    run(private_apt("apt-get")
        .arg("update")
        .args([
            "-o",
            "Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false",
        ])
        .args([
            "-o",
            "Acquire::IndexTargets::deb::DEP-11-icons::DefaultEnabled=false",
        ])
        .args([
            "-o",
            "Acquire::IndexTargets::deb::DEP-11-icons-small::DefaultEnabled=false",
        ]))?;
    // The candidates (the suite's versions), checked before unpacking.
    run(private_apt("apt-get")
        .current_dir(&debs)
        .arg("download")
        .args(UNSTABLE_PACKAGES.iter().map(|(package, _, _)| package)))?;
    let mut found = Vec::new();
    for (package, lowest, refused) in UNSTABLE_PACKAGES {
        let deb = std::fs::read_dir(&debs)
            .context("listing the downloaded packages")?
            .flatten()
            .map(|entry| entry.path())
            .find(|path| {
                path.file_name()
                    .and_then(|name| name.to_str())
                    .is_some_and(|name| name.starts_with(&format!("{package}_")))
            })
            .with_context(|| format!("apt-get download left no {package}_*.deb"))?;
        let version = capture(
            Command::new("dpkg-deb")
                .args(["-f"])
                .arg(&deb)
                .arg("Version"),
        )?
        .trim()
        .to_owned();
        let usable = version_at_least(&version, lowest)? && !version_at_least(&version, refused)?;
        if !usable {
            bail!(
                "Debian {UNSTABLE_SUITE} carries {package} {version}, not >= {lowest} and < {refused}"
            );
        }
        run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(root))?;
        found.push(format!("{package} {version}"));
    }
    // They need glibc >= 2.34: say so here if this machine's is older.
    let version = capture(Command::new(root.join("usr/bin/containerd")).arg("--version"))
        .context("the unpacked containerd does not run on this machine")?;
    capture(
        Command::new(root.join("usr/lib/cni/portmap"))
            .env("CNI_COMMAND", "VERSION")
            .stdin(Stdio::null()),
    )
    .context("the unpacked portmap plugin does not run on this machine")?;
    println!("setup: unpacked {}", version.trim());
    let stamp: String = found.iter().map(|f| format!("{f}\n")).collect();
    std::fs::write(root.join(UNSTABLE_STAMP), &stamp).context("writing the stamp")?;
    Ok(stamp.trim().replace('\n', ", "))
}

/// The URI of this machine's Debian archive (the repository apt uses for
/// its own release), or deb.debian.org.
fn debian_mirror() -> String {
    let codename = std::fs::read_to_string("/etc/os-release")
        .ok()
        .and_then(|text| os_release_value(&text, "VERSION_CODENAME"));
    let targets = capture(Command::new("apt-get").args([
        "indextargets",
        "--format",
        "$(REPO_URI) $(RELEASE)",
        "Identifier: Packages",
    ]))
    .unwrap_or_default();
    codename
        .and_then(|codename| mirror_of_release(&targets, &codename))
        .unwrap_or_else(|| "http://deb.debian.org/debian/".to_owned())
}

/// `KEY=value` (or `KEY="value"`) from `/etc/os-release`.
fn os_release_value(text: &str, key: &str) -> Option<String> {
    text.lines()
        .find_map(|line| line.strip_prefix(key)?.strip_prefix('='))
        .map(|value| value.trim().trim_matches('"').to_owned())
        .filter(|value| !value.is_empty())
}

/// From `apt-get indextargets --format '$(REPO_URI) $(RELEASE)'`: the URI
/// serving `codename` itself (not `-updates` or `-security`).
fn mirror_of_release(targets: &str, codename: &str) -> Option<String> {
    targets.lines().find_map(|line| {
        let (uri, release) = line.trim().split_once(' ')?;
        (release == codename).then(|| uri.to_owned())
    })
}

fn unstable_sources_list(mirror: &str) -> String {
    format!(
        "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] {mirror} {UNSTABLE_SUITE} main\n"
    )
}

/// The private configuration: every list, cache and state file under
/// `apt_dir`, no sources or pins of the machine's. The machine's
/// `apt.conf.d` still applies (its proxy, its checks).
fn private_apt_config(apt_dir: &Path) -> Result<String> {
    let text = apt_dir
        .to_str()
        .context("the target directory is not UTF-8")?;
    if text.contains(['"', '\\', '{', '}', ';']) || text.chars().any(char::is_control) {
        bail!("{text} cannot be written into an apt configuration");
    }
    Ok(format!(
        r#"Dir::Etc::SourceList "{text}/etc/sources.list";
Dir::Etc::SourceParts "{text}/etc/sources.list.d";
Dir::Etc::Preferences "{text}/etc/preferences";
Dir::Etc::PreferencesParts "{text}/etc/preferences.d";
Dir::State "{text}/state";
Dir::State::Lists "{text}/lists";
Dir::Cache "{text}/cache";
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
APT::Sandbox::User "root";
Acquire::Languages "none";
"#
    ))
}

// ---- nft for upstream portmap's nftables backend ----

/// Upstream portmap 1.9 with `"backend": "nftables"` execs `nft` (knftables).
/// Debian 12's, fetched as packages and never installed: the `nftables`
/// package's service would load `/etc/nftables.conf`, whose first line
/// flushes the root namespace's ruleset.
pub(crate) const NFT_PACKAGES: &[&str] = &["nftables", "libnftables1"];

/// What `libnftables1` links besides glibc; fetched too when the machine
/// lacks one (iptables and LLVM bring them all on Debian 12).
const NFT_LIBRARY_DEPENDS: &[&str] = &[
    "libedit2",
    "libgmp10",
    "libjansson4",
    "libmnl0",
    "libnftnl11",
    "libxtables12",
];

/// `target/tools/nftables`: `debs/`, `root/` (the unpacked packages) and
/// `bin/nft`, a wrapper that runs `root/usr/sbin/nft` with the unpacked
/// library. Tests and the bench put `bin/` first on upstream portmap's
/// `PATH` (`portmap_tests::upstream_nft`, which must agree on this layout).
pub(crate) fn nft_tools_dir() -> PathBuf {
    target_dir().join("tools").join("nftables")
}

/// Fetches [`NFT_PACKAGES`] with `apt-get download` (checked by apt against
/// the machine's signed index), unpacks them into [`nft_tools_dir`] and
/// writes the wrapper. When that fails it says so and goes on: the tests of
/// upstream's nftables backend then skip, naming this step.
pub(crate) fn ensure_private_nft() -> Result<()> {
    let dir = nft_tools_dir();
    if let Ok(version) = capture(Command::new(dir.join("bin/nft")).arg("--version")) {
        println!(
            "setup: {} present in {}, skipping",
            version.trim(),
            dir.display()
        );
        return Ok(());
    }
    let started = std::time::Instant::now();
    match fetch_private_nft(&dir) {
        Ok(version) => println!(
            "setup: {version} (Debian's {}) unpacked into {} in {:.1}s",
            NFT_PACKAGES.join(", "),
            dir.display(),
            started.elapsed().as_secs_f64()
        ),
        Err(error) => {
            let _ = std::fs::remove_dir_all(&dir);
            println!(
                "setup: WARNING: no private nft: {error:#}. The tests of upstream portmap's \
                 nftables backend will skip (NFT_PACKAGES in xtask/src/setup.rs)."
            );
        }
    }
    Ok(())
}

fn fetch_private_nft(dir: &Path) -> Result<String> {
    let debs = dir.join("debs");
    let root = dir.join("root");
    let bin = dir.join("bin");
    let _ = std::fs::remove_dir_all(dir);
    for sub in [&debs, &root, &bin] {
        std::fs::create_dir_all(sub).with_context(|| format!("creating {}", sub.display()))?;
    }
    let mut packages: Vec<&str> = NFT_PACKAGES.to_vec();
    packages.extend(
        NFT_LIBRARY_DEPENDS
            .iter()
            .filter(|package| !dpkg_installed(package)),
    );
    let download = || {
        capture(
            Command::new("apt-get")
                .current_dir(&debs)
                .args(["-q", "download"])
                .args(&packages),
        )
    };
    if download().is_err() {
        // A fresh machine may have no package lists yet.
        run(apt_get().arg("update"))?;
        download()?;
    }
    for entry in std::fs::read_dir(&debs).context("listing the downloaded packages")? {
        let deb = entry?.path();
        run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root))?;
    }
    let library = find_file(&root.join("usr/lib"), "libnftables.so.1")
        .context("the unpacked libnftables1 holds no libnftables.so.1")?;
    let library_dir = library.parent().context("library path has a parent")?;
    let wrapper = bin.join("nft");
    std::fs::write(
        &wrapper,
        nft_wrapper(&root.join("usr/sbin/nft"), library_dir)?,
    )
    .context("writing the nft wrapper")?;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755))
        .context("making the nft wrapper executable")?;
    let version = capture(Command::new(&wrapper).arg("--version"))
        .context("the unpacked nft does not run on this machine")?;
    Ok(version.trim().to_owned())
}

/// The first file called `name` under `dir`, depth first.
fn find_file(dir: &Path, name: &str) -> Option<PathBuf> {
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let path = entry.path();
        if path.file_name().is_some_and(|n| n == name) {
            return Some(path);
        }
        if path.is_dir()
            && let Some(found) = find_file(&path, name)
        {
            return Some(found);
        }
    }
    None
}

/// A `/bin/sh` script running `nft` with its library directory first.
fn nft_wrapper(nft: &Path, library_dir: &Path) -> Result<String> {
    let quote = |path: &Path| -> Result<String> {
        let text = path.to_str().context("the target directory is not UTF-8")?;
        if text.contains('\'') {
            bail!("{text} cannot be quoted for /bin/sh");
        }
        Ok(format!("'{text}'"))
    };
    Ok(format!(
        "#!/bin/sh\n\
         # Debian 12's nft, unpacked by `cargo xtask setup` (never installed).\n\
         LD_LIBRARY_PATH={}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}} exec {} \"$@\"\n",
        quote(library_dir)?,
        quote(nft)?
    ))
}

/// `dpkg --compare-versions VERSION ge LOWEST`.
fn version_at_least(version: &str, lowest: &str) -> Result<bool> {
    let status = Command::new("dpkg")
        .args(["--compare-versions", version, "ge", lowest])
        .status()
        .context("running dpkg --compare-versions")?;
    Ok(status.success())
}

#[cfg(test)]
mod unstable_tests {
    use super::*;

    #[test]
    fn the_mirror_is_the_one_serving_this_release() {
        let targets = "http://deb.debian.org/debian-security/ bookworm-security\n\
                       http://mirror.example/debian/ bookworm-updates\n\
                       http://mirror.example/debian/ bookworm\n";
        assert_eq!(
            mirror_of_release(targets, "bookworm").as_deref(),
            Some("http://mirror.example/debian/")
        );
        assert_eq!(mirror_of_release(targets, "trixie"), None);
        assert_eq!(
            os_release_value(
                "NAME=\"Debian\"\nVERSION_CODENAME=bookworm\n",
                "VERSION_CODENAME"
            )
            .as_deref(),
            Some("bookworm")
        );
        assert_eq!(
            os_release_value("VERSION_CODENAME=\n", "VERSION_CODENAME"),
            None
        );
    }

    #[test]
    fn the_private_configuration_stays_under_its_directory() {
        let config = private_apt_config(Path::new("/w/target/tools/debian-unstable/apt")).unwrap();
        for line in config.lines() {
            if line.starts_with("Dir::") && !line.contains("cache \"\"") {
                assert!(
                    line.contains("\"/w/target/tools/debian-unstable/apt/"),
                    "{line}"
                );
            }
        }
        assert!(config.contains("Dir::Etc::SourceList "), "{config}");
        assert!(private_apt_config(Path::new("/w/a\"b")).is_err());
        assert_eq!(
            unstable_sources_list("http://deb.debian.org/debian/"),
            "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian/ sid main\n"
        );
    }

    #[test]
    fn the_nft_wrapper_runs_the_unpacked_binary_with_its_library() {
        assert_eq!(
            nft_wrapper(
                Path::new("/t/nftables/root/usr/sbin/nft"),
                Path::new("/t/nftables/root/usr/lib/x86_64-linux-gnu")
            )
            .unwrap(),
            "#!/bin/sh\n\
             # Debian 12's nft, unpacked by `cargo xtask setup` (never installed).\n\
             LD_LIBRARY_PATH='/t/nftables/root/usr/lib/x86_64-linux-gnu'${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
             exec '/t/nftables/root/usr/sbin/nft' \"$@\"\n"
        );
        assert!(nft_wrapper(Path::new("/t/it's"), Path::new("/t")).is_err());
    }

    #[test]
    fn versions_are_read_and_compared_as_dpkg_does() {
        assert!(version_at_least("2.1.9+ds1-5", "2.1.9").unwrap());
        assert!(version_at_least("2.10.0", "2.1.9").unwrap());
        assert!(!version_at_least("2.1.9~rc1", "2.1.9").unwrap());
        assert!(!version_at_least("1.9.1+ds1-1", "2").unwrap());
    }
}
