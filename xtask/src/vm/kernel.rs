//! Debian kernels for the VM tests: which package a series (`6.1`, `6.12`)
//! means, downloading it with `apt-get download` (cached), extracting it,
//! and the modules the tests need in load order (from `depmod`'s
//! `modules.dep`), decompressed for busybox `insmod`.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

/// Modules the tests need that Debian builds as modules: veth pairs for
/// every namespace link, the bridge plugin's bridge, clsact (in
/// `sch_ingress`) and `cls_bpf` for the clsact attachment, `nf_tables` so
/// `iptables-save` (nft backend) can show that no NAT rule exists, `vxlan`
/// for the tunnel uplink of the `node_shapes` tests, `sctp` for the SCTP
/// traffic the host's kernel may lack (the guest says so with
/// `EPM_EXPECT_SCTP=1`, so a missing `sctp` fails instead of skipping),
/// `nf_conntrack`, whose BTF holds the conntrack kfuncs the programs link
/// from a module there (loaded on a node by anything that tracks flows:
/// kube-proxy, a firewall, a masquerade), and `nft_compat` with
/// `xt_conntrack` for kube-proxy's `-m conntrack --ctstate INVALID -j DROP`
/// at FORWARD, as iptables-nft adds it (the guest says so with
/// `EPM_EXPECT_KFUNCS=1`, so kfuncs that do not link fail instead of
/// skipping), and `dummy`, `ip_vs` with its round-robin scheduler and
/// `nft_chain_nat` for kube-proxy's IPVS mode: ClusterIPs on a dummy
/// device, virtual services, its guard in the nat table
/// (`EPM_EXPECT_IPVS=1`); the same nat chains hook netfilter's NAT, which
/// translation by netfilter needs.
pub const WANTED_MODULES: &[&str] = &[
    "veth",
    "bridge",
    "sch_ingress",
    "cls_bpf",
    "nf_tables",
    "vxlan",
    "sctp",
    "nf_conntrack",
    "nft_compat",
    "xt_conntrack",
    "dummy",
    "ip_vs",
    "ip_vs_rr",
    "nft_chain_nat",
];

/// Modules staged where the kernel has them, left out where it has not:
/// `nfnetlink_hook`, which the fast path's fallback asks what is hooked at
/// FORWARD (Debian's 6.12 has it as a module, its 6.1 not at all). The
/// guest is told which it got (`EPM_EXPECT_FORWARD_HOOKS=1`), so a staged
/// one that does not answer fails instead of skipping.
pub const OPTIONAL_MODULES: &[&str] = &["nfnetlink_hook"];

/// A kernel series the VM tests run, e.g. `6.1`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Series {
    pub major: u32,
    pub minor: u32,
}

impl Series {
    pub fn parse(text: &str) -> Result<Series> {
        let parsed = text
            .split_once('.')
            .and_then(|(major, minor)| Some((major.parse().ok()?, minor.parse().ok()?)));
        let Some((major, minor)) = parsed else {
            bail!("kernel series must look like 6.1 or 6.12, got {text:?}");
        };
        Ok(Series { major, minor })
    }

    /// tcx (`BPF_TCX_INGRESS/EGRESS` links) arrived in 6.6; older kernels
    /// must be served through a clsact qdisc. This is the VM harness's
    /// expectation, stated by version; the plugin itself probes.
    pub fn expected_attach_mode(&self) -> &'static str {
        if (self.major, self.minor) >= (6, 6) {
            "tcx"
        } else {
            "clsact"
        }
    }

    /// Whether `package` is the plain amd64 image of this series
    /// (`linux-image-6.1.0-57-amd64`, `linux-image-6.12.117+deb12-amd64`),
    /// not a meta, cloud, rt, dbg or unsigned package.
    pub fn matches_package(&self, package: &str) -> bool {
        let prefix = format!("linux-image-{}.{}.", self.major, self.minor);
        let Some(rest) = package
            .strip_prefix(&prefix)
            .and_then(|r| r.strip_suffix("-amd64"))
        else {
            return false;
        };
        // `0-57` or `117+deb12`: a patch level, then an ABI or a suffix.
        rest.starts_with(|c: char| c.is_ascii_digit())
            && !rest.contains("-cloud")
            && !rest.contains("-rt")
            && rest
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '+')
    }
}

impl std::fmt::Display for Series {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// Compares `6.1.0-9` and `6.1.0-57` (and `6.12.99+deb12` and `6.12.117+deb12`)
/// number by number.
pub fn natural_cmp(a: &str, b: &str) -> Ordering {
    fn chunks(s: &str) -> Vec<(bool, &str)> {
        let mut out = Vec::new();
        let mut start = 0;
        let bytes = s.as_bytes();
        for i in 1..=bytes.len() {
            if i == bytes.len() || bytes[i].is_ascii_digit() != bytes[start].is_ascii_digit() {
                out.push((bytes[start].is_ascii_digit(), &s[start..i]));
                start = i;
            }
        }
        out
    }
    for (x, y) in chunks(a).into_iter().zip(chunks(b)) {
        let order = match (x, y) {
            ((true, x), (true, y)) => x
                .trim_start_matches('0')
                .len()
                .cmp(&y.trim_start_matches('0').len())
                .then_with(|| x.trim_start_matches('0').cmp(y.trim_start_matches('0'))),
            ((_, x), (_, y)) => x.cmp(y),
        };
        if order != Ordering::Equal {
            return order;
        }
    }
    a.len().cmp(&b.len())
}

/// The newest plain amd64 image package of `series` that apt knows.
/// Runs `apt-get update` once if the package lists know none.
pub fn resolve_package(series: &Series) -> Result<String> {
    let search = || -> Result<Vec<String>> {
        let pattern = format!("^linux-image-{}\\.{}\\.", series.major, series.minor);
        let out = crate::cmd::capture(Command::new("apt-cache").args([
            "search",
            "--names-only",
            &pattern,
        ]))?;
        let mut found: Vec<String> = out
            .lines()
            .filter_map(|line| line.split_whitespace().next())
            .filter(|name| series.matches_package(name))
            .map(str::to_owned)
            .collect();
        found.sort_by(|a, b| natural_cmp(a, b));
        Ok(found)
    };
    let mut found = search()?;
    if found.is_empty() {
        println!("vm: apt knows no linux-image-{series}.* package; running apt-get update ...");
        crate::cmd::run(crate::setup::apt_get().arg("update"))?;
        found = search()?;
    }
    match found.pop() {
        Some(package) => Ok(package),
        None => bail!(
            "no Debian package linux-image-{series}.*-amd64 in the apt sources (see `apt-cache search --names-only ^linux-image-`); Debian 12 has 6.1 in bookworm and 6.12 in bookworm-security"
        ),
    }
}

/// An extracted kernel package.
#[derive(Debug)]
pub struct Kernel {
    /// `uname -r`, e.g. `6.1.0-57-amd64`.
    pub release: String,
    pub vmlinuz: PathBuf,
    pub modules_dir: PathBuf,
}

/// Downloads (once) and extracts (once) `package` under `cache`, runs
/// depmod on it.
pub fn fetch(package: &str, cache: &Path) -> Result<Kernel> {
    let debs = cache.join("debs");
    std::fs::create_dir_all(&debs).with_context(|| format!("creating {}", debs.display()))?;
    let deb = match find_deb(&debs, package)? {
        Some(deb) => {
            println!("vm: {package}: cached {}", deb.display());
            deb
        }
        None => {
            println!("vm: {package}: apt-get download ...");
            crate::cmd::run(
                crate::setup::apt_get()
                    .current_dir(&debs)
                    .args(["download", package]),
            )?;
            find_deb(&debs, package)?
                .with_context(|| format!("apt-get download left no {package}_*.deb"))?
        }
    };
    let root = cache.join("kernels").join(package);
    let stamp = root.join(".extracted");
    if !stamp.exists() {
        println!("vm: {package}: extracting {} ...", deb.display());
        if root.exists() {
            std::fs::remove_dir_all(&root)
                .with_context(|| format!("removing {}", root.display()))?;
        }
        std::fs::create_dir_all(&root)?;
        crate::cmd::run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root))?;
        let release = only_entry(&root.join("lib/modules"))?;
        crate::cmd::run(Command::new("depmod").arg("-b").arg(&root).arg(&release))?;
        std::fs::write(&stamp, b"")?;
    }
    let release = only_entry(&root.join("lib/modules"))?;
    let vmlinuz = root.join("boot").join(format!("vmlinuz-{release}"));
    if !vmlinuz.is_file() {
        bail!("{package} has no {}", vmlinuz.display());
    }
    Ok(Kernel {
        modules_dir: root.join("lib/modules").join(&release),
        release,
        vmlinuz,
    })
}

fn find_deb(dir: &Path, package: &str) -> Result<Option<PathBuf>> {
    let prefix = format!("{package}_");
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let name = entry?.file_name();
        let name = name.to_string_lossy();
        if name.starts_with(&prefix) && name.ends_with("_amd64.deb") {
            return Ok(Some(dir.join(name.as_ref())));
        }
    }
    Ok(None)
}

fn only_entry(dir: &Path) -> Result<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    if names.len() != 1 {
        bail!(
            "expected one kernel release in {}, found {names:?}",
            dir.display()
        );
    }
    Ok(names.remove(0))
}

/// `modules.dep` as (module name → (path, dependency paths)).
fn parse_modules_dep(text: &str) -> BTreeMap<String, (String, Vec<String>)> {
    text.lines()
        .filter_map(|line| {
            let (path, deps) = line.split_once(':')?;
            let name = module_name(path);
            let deps = deps.split_whitespace().map(str::to_owned).collect();
            Some((name, (path.to_owned(), deps)))
        })
        .collect()
}

/// `kernel/net/bridge/bridge.ko.xz` → `bridge` (depmod's name: `-` is `_`).
pub fn module_name(path: &str) -> String {
    let file = path.rsplit('/').next().unwrap_or(path);
    let stem = file.split(".ko").next().unwrap_or(file);
    stem.replace('-', "_")
}

/// What depmod wrote about a kernel's modules.
#[derive(Debug, Default)]
pub struct ModuleIndex {
    /// module name → (path relative to the modules dir, dependency paths)
    deps: BTreeMap<String, (String, Vec<String>)>,
    /// module name → names it wants loaded first (`softdep X pre: ...`),
    /// which may be aliases (`crc32c`).
    soft_pre: BTreeMap<String, Vec<String>>,
    /// alias → module names, in file order
    aliases: BTreeMap<String, Vec<String>>,
}

impl ModuleIndex {
    /// From `modules.dep`, `modules.softdep` and `modules.alias`.
    pub fn parse(modules_dep: &str, softdep: &str, alias: &str) -> ModuleIndex {
        let mut soft_pre = BTreeMap::new();
        for line in softdep.lines() {
            let mut words = line.split_whitespace();
            if words.next() != Some("softdep") {
                continue;
            }
            let Some(module) = words.next() else { continue };
            let mut pre = Vec::new();
            let mut in_pre = false;
            for word in words {
                match word {
                    "pre:" => in_pre = true,
                    "post:" => in_pre = false,
                    name if in_pre => pre.push(name.replace('-', "_")),
                    _ => {}
                }
            }
            soft_pre.insert(module.replace('-', "_"), pre);
        }
        let mut aliases: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for line in alias.lines() {
            let mut words = line.split_whitespace();
            if let (Some("alias"), Some(name), Some(module)) =
                (words.next(), words.next(), words.next())
            {
                aliases
                    .entry(name.replace('-', "_"))
                    .or_default()
                    .push(module.replace('-', "_"));
            }
        }
        ModuleIndex {
            deps: parse_modules_dep(modules_dep),
            soft_pre,
            aliases,
        }
    }

    /// A module name, or an alias resolved to a module that exists as a
    /// file; the generic C implementation is preferred over CPU-specific
    /// ones (`crc32c_generic` over `crc32c_intel`), which need CPU features
    /// TCG may not offer. `None` if built in or unknown.
    fn resolve(&self, name: &str) -> Option<&str> {
        if let Some((name, _)) = self.deps.get_key_value(name) {
            return Some(name);
        }
        let candidates = self.aliases.get(name)?;
        candidates
            .iter()
            .filter(|m| self.deps.contains_key(*m))
            .min_by_key(|m| !m.ends_with("_generic"))
            .map(String::as_str)
    }

    /// Paths (relative to the modules dir) of `wanted` and everything they
    /// need (hard dependencies and `pre:` soft dependencies), each after
    /// what it needs: the order to insmod them in.
    /// Whether this kernel has module `name` (`-` or `_`, as depmod).
    pub fn has(&self, name: &str) -> bool {
        self.deps.contains_key(&name.replace('-', "_"))
    }

    pub fn load_order(&self, wanted: &[&str]) -> Result<Vec<String>> {
        let mut order = Vec::new();
        for name in wanted {
            let name = name.replace('-', "_");
            if !self.deps.contains_key(&name) {
                bail!(
                    "module {name} is not in modules.dep (built in, or missing from this kernel?)"
                );
            }
            self.visit(&name, &mut order, 0)?;
        }
        Ok(order)
    }

    fn visit(&self, name: &str, order: &mut Vec<String>, depth: usize) -> Result<()> {
        if depth > 64 {
            bail!("module dependencies loop at {name}");
        }
        let (path, deps) = self
            .deps
            .get(name)
            .with_context(|| format!("{name} is not in modules.dep"))?;
        if order.iter().any(|p| p == path) {
            return Ok(());
        }
        for soft in self.soft_pre.get(name).into_iter().flatten() {
            if let Some(module) = self.resolve(soft) {
                self.visit(module, order, depth + 1)?;
            }
        }
        for dep in deps {
            self.visit(&module_name(dep), order, depth + 1)?;
        }
        order.push(path.clone());
        Ok(())
    }
}

impl Kernel {
    /// Names of modules that are built into this kernel (no insmod needed).
    fn builtin(&self) -> Vec<String> {
        std::fs::read_to_string(self.modules_dir.join("modules.builtin"))
            .unwrap_or_default()
            .lines()
            .map(module_name)
            .collect()
    }

    /// The wanted modules that are not built in, with their dependencies,
    /// decompressed into `out` as `NN_name.ko`; returns the file names in
    /// load order.
    pub fn stage_modules(&self, out: &Path) -> Result<Vec<String>> {
        let builtin = self.builtin();
        let wanted: Vec<&str> = WANTED_MODULES
            .iter()
            .copied()
            .filter(|name| !builtin.iter().any(|b| b == name))
            .collect();
        let read = |name: &str| {
            let path = self.modules_dir.join(name);
            std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))
        };
        let index = ModuleIndex::parse(
            &read("modules.dep")?,
            &read("modules.softdep")?,
            &read("modules.alias")?,
        );
        let wanted: Vec<&str> = wanted
            .into_iter()
            .chain(
                OPTIONAL_MODULES
                    .iter()
                    .copied()
                    .filter(|name| !builtin.iter().any(|b| b == name) && index.has(name)),
            )
            .collect();
        let order = index.load_order(&wanted)?;
        if out.exists() {
            std::fs::remove_dir_all(out)?;
        }
        std::fs::create_dir_all(out)?;
        let mut files = Vec::new();
        for (index, relative) in order.iter().enumerate() {
            let source = self.modules_dir.join(relative);
            let file = format!("{index:02}_{}.ko", module_name(relative));
            let target = out.join(&file);
            decompress(&source, &target)?;
            files.push(file);
        }
        Ok(files)
    }
}

/// Copies a module, decompressing `.ko.xz` / `.ko.zst` (busybox insmod
/// takes plain ELF only).
fn decompress(source: &Path, target: &Path) -> Result<()> {
    let name = source.to_string_lossy();
    let tool = if name.ends_with(".ko.xz") {
        Some("xz")
    } else if name.ends_with(".ko.zst") {
        Some("zstd")
    } else {
        None
    };
    match tool {
        None => {
            std::fs::copy(source, target)
                .with_context(|| format!("copying {}", source.display()))?;
        }
        Some(tool) => {
            let out = Command::new(tool)
                .arg("-dc")
                .arg(source)
                .output()
                .with_context(|| format!("running {tool} -dc {}", source.display()))?;
            if !out.status.success() {
                bail!(
                    "{tool} -dc {} failed: {}",
                    source.display(),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            std::fs::write(target, out.stdout)
                .with_context(|| format!("writing {}", target.display()))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_parse_and_expected_mode() {
        assert_eq!(Series::parse("6.1").unwrap(), Series { major: 6, minor: 1 });
        assert_eq!(
            Series::parse("6.1").unwrap().expected_attach_mode(),
            "clsact"
        );
        assert_eq!(
            Series::parse("6.5").unwrap().expected_attach_mode(),
            "clsact"
        );
        assert_eq!(Series::parse("6.6").unwrap().expected_attach_mode(), "tcx");
        assert_eq!(Series::parse("6.12").unwrap().expected_attach_mode(), "tcx");
        assert_eq!(Series::parse("6.12").unwrap().to_string(), "6.12");
        for bad in ["6", "6.x", "", "6.1.0"] {
            assert!(Series::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn only_plain_amd64_images_of_the_series_match() {
        let six_one = Series::parse("6.1").unwrap();
        let six_twelve = Series::parse("6.12").unwrap();
        assert!(six_one.matches_package("linux-image-6.1.0-57-amd64"));
        assert!(six_twelve.matches_package("linux-image-6.12.117+deb12-amd64"));
        for other in [
            "linux-image-6.12.117+deb12-amd64",
            "linux-image-6.1.0-51-cloud-amd64",
            "linux-image-6.1.0-53-rt-amd64",
            "linux-image-6.1.0-57-amd64-dbg",
            "linux-image-6.1.0-57-amd64-unsigned",
            "linux-image-amd64",
        ] {
            assert!(!six_one.matches_package(other), "{other}");
        }
        for other in [
            "linux-image-6.12-amd64",
            "linux-image-6.12.117+deb12-cloud-amd64",
            "linux-image-6.12.117+deb12-rt-amd64",
            "linux-image-6.1.0-57-amd64",
        ] {
            assert!(!six_twelve.matches_package(other), "{other}");
        }
    }

    #[test]
    fn newest_package_sorts_last() {
        let mut names = [
            "linux-image-6.1.0-57-amd64",
            "linux-image-6.1.0-9-amd64",
            "linux-image-6.1.0-10-amd64",
        ];
        names.sort_by(|a, b| natural_cmp(a, b));
        assert_eq!(names.last(), Some(&"linux-image-6.1.0-57-amd64"));
        let mut names = [
            "linux-image-6.12.117+deb12-amd64",
            "linux-image-6.12.99+deb12-amd64",
        ];
        names.sort_by(|a, b| natural_cmp(a, b));
        assert_eq!(names.last(), Some(&"linux-image-6.12.117+deb12-amd64"));
    }

    #[test]
    fn modules_load_after_their_dependencies() {
        let dep = "kernel/drivers/net/veth.ko.xz:\n\
                   kernel/net/bridge/bridge.ko.xz: kernel/net/802/stp.ko.xz kernel/net/llc/llc.ko.xz\n\
                   kernel/net/802/stp.ko.xz: kernel/net/llc/llc.ko.xz\n\
                   kernel/net/llc/llc.ko.xz:\n\
                   kernel/net/sched/sch_ingress.ko.xz:\n\
                   kernel/net/netfilter/nf_tables.ko: kernel/net/netfilter/nfnetlink.ko kernel/lib/libcrc32c.ko\n\
                   kernel/net/netfilter/nfnetlink.ko:\n\
                   kernel/lib/libcrc32c.ko:\n\
                   kernel/arch/x86/crypto/crc32c-intel.ko:\n\
                   kernel/crypto/crc32c_generic.ko:\n";
        let softdep = "# Soft dependencies extracted from modules themselves.\n\
                       softdep libcrc32c pre: crc32c\n";
        let alias = "alias crypto-crc32c crc32c_intel\n\
                     alias crc32c crc32c_intel\n\
                     alias crc32c crc32c_generic\n";
        let index = ModuleIndex::parse(dep, softdep, alias);
        assert_eq!(
            index
                .load_order(&["veth", "bridge", "sch_ingress", "nf_tables"])
                .unwrap(),
            [
                "kernel/drivers/net/veth.ko.xz",
                "kernel/net/llc/llc.ko.xz",
                "kernel/net/802/stp.ko.xz",
                "kernel/net/bridge/bridge.ko.xz",
                "kernel/net/sched/sch_ingress.ko.xz",
                "kernel/net/netfilter/nfnetlink.ko",
                "kernel/crypto/crc32c_generic.ko",
                "kernel/lib/libcrc32c.ko",
                "kernel/net/netfilter/nf_tables.ko",
            ]
        );
        assert!(index.load_order(&["cls_bpf"]).is_err());
        assert!(index.has("sch-ingress") && !index.has("nfnetlink_hook"));
        assert_eq!(
            module_name("kernel/net/sched/sch-ingress.ko"),
            "sch_ingress"
        );
        assert_eq!(
            module_name("kernel/arch/x86/crypto/crc32c-intel.ko"),
            "crc32c_intel"
        );
    }
}
