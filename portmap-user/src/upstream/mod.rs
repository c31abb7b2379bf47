//! Upstream `portmap`'s live state on this node, for a node switching from
//! it to ebpf-portmap (or back): what it still maps, so an ADD never takes
//! a port one of its pods holds, and its rules for a container, removed
//! when that container's DEL (or GC) comes to us instead of to it.
//!
//! Upstream keeps its state in the kernel only: iptables `nat` chains
//! (iptables-nft or legacy, [`iptables`]) or, from plugins 1.5 with
//! `"backend": "nftables"`, its own nftables table ([`nft`]). ADD and DEL
//! first ask [`probe::sources`], which runs no process; only a namespace
//! that has upstream's chains or table pays for the tools
//! (`iptables-save`, `iptables-restore`, `nft`), which are upstream's own
//! prerequisites.
//!
//! What is removed is only what is shown to be the caller's ([`Selector`]):
//! upstream's rules of that container on that network, idempotently, plus
//! what upstream leaves for good: its shared chains (and the jumps to
//! them) or its table once nothing but upstream's own skeleton is left in
//! them, so the node ends as it was before upstream's first ADD. The
//! nftables backend records no network: there a rule is one attachment's
//! only when its container address is that attachment's (DEL's
//! prevResult), or when its container is gone from the node (`migrate`,
//! on the runtime's cache); everything else is left and reported as such.
//!
//! Each removal reads, decides, and writes exactly what it read in one
//! transaction that fails if the state changed in between (rules deleted
//! by their exact text or handle, chains and tables only where that fails
//! on a rule added since); a failed write is tried again from a fresh read.

pub mod iptables;
pub mod nft;
mod probe;

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::fmt;
use std::io::Write;
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use crate::model::Protocol;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    V4,
    V6,
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        })
    }
}

/// Where upstream keeps a family's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Backend {
    /// iptables over nf_tables (`iptables-nft`, Debian's and most
    /// distributions' default `iptables`).
    IptablesNft,
    /// The legacy x_tables `iptables`.
    IptablesLegacy,
    /// Upstream's own `cni_hostport` table (plugins 1.5+).
    Nftables,
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Backend::IptablesNft => "iptables-nft",
            Backend::IptablesLegacy => "iptables-legacy",
            Backend::Nftables => "nftables",
        })
    }
}

/// One place upstream has state: a backend and a family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Source {
    pub backend: Backend,
    pub family: Family,
}

/// One translation upstream writes, as either backend's rule says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Port {
    pub protocol: Protocol,
    pub host_port: u16,
    /// `None`: every address of the family.
    pub host_addr: Option<IpAddr>,
    pub container_addr: IpAddr,
    pub container_port: u16,
}

/// One port upstream maps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    pub source: Source,
    /// The network of the configuration that made it (iptables only: the
    /// nftables backend records the container ID alone); one upstream cut
    /// ends in `...`.
    pub network: Option<String>,
    /// `None` for a container chain no jump names any more; one upstream
    /// cut ends in `...`.
    pub container_id: Option<String>,
    /// The comment that names the owner, as upstream wrote it (iptables:
    /// `dnat name: "NET" id: "ID"`, maybe cut; nftables: the container ID).
    pub comment: Option<String>,
    pub port: Port,
}

impl Mapping {
    /// How a conflict or `list` names the holder.
    pub fn holder(&self) -> String {
        let id = self.container_id.as_deref().unwrap_or("(unknown)");
        match &self.network {
            Some(network) => format!(
                "container {id} (network {network}, set up by upstream portmap, {})",
                self.source.backend
            ),
            None => format!(
                "container {id} (set up by upstream portmap, {})",
                self.source.backend
            ),
        }
    }

    /// `198.18.0.1:8080/tcp`, `0.0.0.0:8080/udp`, `[::]:80/tcp`.
    pub fn host(&self) -> String {
        let port = &self.port;
        let addr = port.host_addr.unwrap_or(match self.source.family {
            Family::V4 => IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
            Family::V6 => IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
        });
        match addr {
            IpAddr::V4(a) => format!("{a}:{}/{}", port.host_port, port.protocol),
            IpAddr::V6(a) => format!("[{a}]:{}/{}", port.host_port, port.protocol),
        }
    }

    /// Whether a mapping of ours on (`family`, `protocol`, `port`,
    /// `addr`, `None` for every address) would take traffic upstream
    /// sends here: the same port of the same family and protocol, on an
    /// address both cover.
    pub fn overlaps(
        &self,
        family: Family,
        protocol: Protocol,
        port: u16,
        addr: Option<IpAddr>,
    ) -> bool {
        self.source.family == family
            && self.port.protocol == protocol
            && self.port.host_port == port
            && match (self.port.host_addr, addr) {
                (Some(held), Some(asked)) => held == asked,
                _ => true,
            }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("upstream portmap has {backend} {family} state here, but {tool} is not installed")]
    NoTool {
        tool: &'static str,
        backend: Backend,
        family: Family,
    },
    #[error("cannot run {tool}")]
    Spawn {
        tool: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{tool} failed ({status}): {stderr}")]
    Failed {
        tool: String,
        status: std::process::ExitStatus,
        stderr: String,
    },
    #[error("{tool} printed what is not JSON")]
    Json {
        tool: String,
        #[source]
        source: serde_json::Error,
    },
}

/// Where upstream may have state in this namespace (no process run); empty
/// on a node without any.
pub fn sources() -> Vec<Source> {
    probe::sources()
}

/// Directories a runtime's PATH may lack but the tools live in.
const SBIN: [&str; 4] = ["/usr/sbin", "/sbin", "/usr/local/sbin", "/usr/bin"];

/// Where to look for the tools: the absolute entries of `path`, then
/// [`SBIN`]. An empty or relative entry would resolve against the working
/// directory the runtime happened to start us in, and the tools run as
/// root: such entries are skipped.
fn tool_dirs(path: &OsStr) -> Vec<PathBuf> {
    std::env::split_paths(path)
        .filter(|dir| dir.is_absolute())
        .chain(SBIN.iter().map(PathBuf::from))
        .collect()
}

fn find_tool_in(dirs: &[PathBuf], names: &[&'static str]) -> Option<(PathBuf, &'static str)> {
    for name in names {
        for dir in dirs {
            let candidate = dir.join(name);
            if candidate.is_file() {
                return Some((candidate, name));
            }
        }
    }
    None
}

fn find_tool(names: &[&'static str]) -> Option<(PathBuf, &'static str)> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    find_tool_in(&tool_dirs(&path), names)
}

/// The tool of `source`'s backend for `verb` (`save`, `restore` or `nft`).
fn tool(source: Source, verb: &str) -> Result<(PathBuf, &'static str), UpstreamError> {
    let names: &[&'static str] = match (source.backend, source.family, verb) {
        (Backend::IptablesNft, Family::V4, "save") => &["iptables-nft-save", "iptables-save"],
        (Backend::IptablesNft, Family::V6, "save") => &["ip6tables-nft-save", "ip6tables-save"],
        (Backend::IptablesNft, Family::V4, _) => &["iptables-nft-restore", "iptables-restore"],
        (Backend::IptablesNft, Family::V6, _) => &["ip6tables-nft-restore", "ip6tables-restore"],
        (Backend::IptablesLegacy, Family::V4, "save") => &["iptables-legacy-save", "iptables-save"],
        (Backend::IptablesLegacy, Family::V6, "save") => {
            &["ip6tables-legacy-save", "ip6tables-save"]
        }
        (Backend::IptablesLegacy, Family::V4, _) => {
            &["iptables-legacy-restore", "iptables-restore"]
        }
        (Backend::IptablesLegacy, Family::V6, _) => {
            &["ip6tables-legacy-restore", "ip6tables-restore"]
        }
        (Backend::Nftables, _, _) => &["nft"],
    };
    find_tool(names).ok_or(UpstreamError::NoTool {
        tool: names[0],
        backend: source.backend,
        family: source.family,
    })
}

fn run(
    (path, name): (PathBuf, &'static str),
    args: &[&str],
    stdin: Option<&str>,
) -> Result<String, UpstreamError> {
    let mut child = Command::new(&path)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| UpstreamError::Spawn {
            tool: name.to_owned(),
            source,
        })?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(text.as_bytes())
            .map_err(|source| UpstreamError::Spawn {
                tool: name.to_owned(),
                source,
            })?;
    }
    let out = child
        .wait_with_output()
        .map_err(|source| UpstreamError::Spawn {
            tool: name.to_owned(),
            source,
        })?;
    if !out.status.success() {
        return Err(UpstreamError::Failed {
            tool: format!("{name} {}", args.join(" ")),
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// What one source holds, parsed.
enum Read {
    Iptables(iptables::NatTable),
    Nft(nft::Table),
}

fn family_name(family: Family) -> &'static str {
    match family {
        Family::V4 => "ip",
        Family::V6 => "ip6",
    }
}

fn read_source(source: Source) -> Result<Read, UpstreamError> {
    match source.backend {
        Backend::Nftables => read_nftables(source).map(Read::Nft),
        _ => read_iptables(source).map(Read::Iptables),
    }
}

fn read_nftables(source: Source) -> Result<nft::Table, UpstreamError> {
    let tool = tool(source, "nft")?;
    let name = tool.1;
    let text = run(
        tool,
        &[
            "-j",
            "list",
            "table",
            family_name(source.family),
            nft::TABLE,
        ],
        None,
    )?;
    let json = serde_json::from_str(&text).map_err(|source| UpstreamError::Json {
        tool: name.to_owned(),
        source,
    })?;
    Ok(nft::parse_table(&json))
}

fn read_iptables(source: Source) -> Result<iptables::NatTable, UpstreamError> {
    let text = run(tool(source, "save")?, &["-t", "nat"], None)?;
    Ok(iptables::parse_save(&text))
}

fn mappings_of(source: Source, read: &Read) -> Vec<Mapping> {
    match read {
        Read::Iptables(table) => table
            .mappings()
            .into_iter()
            .map(|m| {
                let owner = m.comment.as_deref().and_then(iptables::parse_owner_comment);
                Mapping {
                    source,
                    network: owner.as_ref().map(iptables::OwnerComment::network_shown),
                    container_id: owner.as_ref().map(iptables::OwnerComment::id_shown),
                    comment: m.comment,
                    port: m.port,
                }
            })
            .collect(),
        Read::Nft(table) => table
            .rules
            .iter()
            .filter_map(|rule| {
                let id = rule.owner()?;
                Some(Mapping {
                    source,
                    network: None,
                    container_id: Some(id.to_owned()),
                    comment: Some(id.to_owned()),
                    port: rule.mapping?,
                })
            })
            .collect(),
    }
}

/// Every mapping upstream holds in `sources`. A source that cannot be read
/// is reported and the others are read all the same.
pub fn mappings(sources: &[Source]) -> (Vec<Mapping>, Vec<UpstreamError>) {
    let mut mappings = Vec::new();
    let mut errors = Vec::new();
    for source in sources {
        match read_source(*source) {
            Ok(read) => mappings.extend(mappings_of(*source, &read)),
            Err(error) => errors.push(error),
        }
    }
    (mappings, errors)
}

/// What a [`Selector`] says of one container's rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pick {
    /// Shown to be the caller's: removed.
    Take,
    /// Shown to be someone else's: left.
    Leave,
    /// Possibly the caller's, but nothing shows it: left, and reported.
    Unproven,
}

/// Which of upstream's rules a removal takes, on what each says of its
/// owner.
pub trait Selector {
    /// A container chain: the owner comment of its jumps as written (maybe
    /// cut), and the addresses its DNAT rules send to.
    fn iptables(&self, comment: &str, destinations: &[IpAddr]) -> Pick;
    /// An nftables rule: its comment (the container ID) and its container
    /// address, when read.
    fn nftables(&self, container_id: &str, container_addr: Option<IpAddr>) -> Pick;
}

/// DEL: one attachment, with the addresses prevResult gave it.
pub struct Attachment<'a> {
    pub network: &'a str,
    pub container_id: &'a str,
    pub addrs: Vec<IpAddr>,
}

impl Selector for Attachment<'_> {
    fn iptables(&self, comment: &str, destinations: &[IpAddr]) -> Pick {
        if comment != iptables::owner_comment(self.network, self.container_id) {
            return Pick::Leave;
        }
        if !iptables::is_cut(comment) {
            return Pick::Take;
        }
        // A cut comment may name another container of this network too:
        // where the chain sends traffic decides.
        if self.addrs.is_empty() || destinations.is_empty() {
            Pick::Unproven
        } else if destinations.iter().all(|d| self.addrs.contains(d)) {
            Pick::Take
        } else {
            Pick::Leave
        }
    }

    fn nftables(&self, container_id: &str, container_addr: Option<IpAddr>) -> Pick {
        if container_id != self.container_id {
            return Pick::Leave;
        }
        match container_addr {
            _ if self.addrs.is_empty() => Pick::Unproven,
            Some(addr) if self.addrs.contains(&addr) => Pick::Take,
            // The same container on another network.
            Some(_) => Pick::Leave,
            None => Pick::Unproven,
        }
    }
}

/// GC of a network: its containers the runtime's keep-list does not name.
pub struct Collect<'a> {
    pub network: &'a str,
    pub keep: &'a BTreeSet<String>,
}

impl Selector for Collect<'_> {
    fn iptables(&self, comment: &str, _: &[IpAddr]) -> Pick {
        let Some(owner) = iptables::parse_owner_comment(comment) else {
            return Pick::Leave;
        };
        let written = |id: &str| iptables::owner_comment(self.network, id) == comment;
        if owner.network_cut {
            // Which network, and which of its containers, is cut away.
            return if written("") {
                Pick::Unproven
            } else {
                Pick::Leave
            };
        }
        if owner.network != self.network || self.keep.iter().any(|id| written(id)) {
            return Pick::Leave;
        }
        Pick::Take
    }

    fn nftables(&self, container_id: &str, _: Option<IpAddr>) -> Pick {
        // No network recorded, and the keep-list names only the live: a
        // container missing from it may well be another network's.
        if self.keep.contains(container_id) {
            Pick::Leave
        } else {
            Pick::Unproven
        }
    }
}

/// `migrate`: the owners judged gone from the node, by their comment as
/// written (iptables) and by container ID (nftables).
pub struct Gone<'a> {
    pub iptables_comments: &'a BTreeSet<String>,
    pub nftables_ids: &'a BTreeSet<String>,
}

impl Selector for Gone<'_> {
    fn iptables(&self, comment: &str, _: &[IpAddr]) -> Pick {
        if self.iptables_comments.contains(comment) {
            Pick::Take
        } else {
            Pick::Leave
        }
    }

    fn nftables(&self, container_id: &str, _: Option<IpAddr>) -> Pick {
        if self.nftables_ids.contains(container_id) {
            Pick::Take
        } else {
            Pick::Leave
        }
    }
}

/// What a removal did in one source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Removed {
    pub source: Source,
    /// The containers whose rules went (as their comments name them).
    pub containers: BTreeSet<String>,
    /// Whether upstream's shared chains (or its table) went too.
    pub shared: bool,
}

/// Containers whose rules in one source were left because nothing showed
/// them to be the caller's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Left {
    pub source: Source,
    pub containers: BTreeSet<String>,
}

/// What [`remove`] did, left, and failed at.
#[derive(Debug, Default)]
pub struct Removal {
    pub removed: Vec<Removed>,
    pub left: Vec<Left>,
    pub errors: Vec<UpstreamError>,
}

/// How many times a removal reads and writes before it gives up: a write
/// fails when the state changed since the read (an ADD or DEL of
/// upstream's in between), and the next read sees the change.
const ATTEMPTS: usize = 3;

/// Removes upstream's rules that `select` takes, in every source, and its
/// shared chains (its table) where nothing but its own skeleton is left.
/// Idempotent: what is gone is not looked for again. Keeps going after a
/// source fails and reports every failure.
pub fn remove(sources: &[Source], select: &dyn Selector) -> Removal {
    let mut report = Removal::default();
    for source in sources {
        let outcome = match source.backend {
            Backend::Nftables => remove_nftables(*source, select),
            _ => remove_iptables(*source, select),
        };
        match outcome {
            Ok((removed, left)) => {
                report.removed.extend(removed);
                if !left.is_empty() {
                    report.left.push(Left {
                        source: *source,
                        containers: left,
                    });
                }
            }
            Err(error) => report.errors.push(error),
        }
    }
    report
}

type Outcome = Result<(Option<Removed>, BTreeSet<String>), UpstreamError>;

fn remove_iptables(source: Source, select: &dyn Selector) -> Outcome {
    let mut failed = None;
    for _ in 0..ATTEMPTS {
        let table = read_iptables(source)?;
        let (chains, containers, left) = pick_chains(&table, select);
        let Some(removal) = table.removal(&chains) else {
            return Ok((None, left));
        };
        test_knob::pause_between_read_and_write();
        match run(
            tool(source, "restore")?,
            &["--noflush"],
            Some(&removal.batch),
        ) {
            Ok(_) => {
                let done = Removed {
                    source,
                    containers,
                    shared: removal.shared,
                };
                return Ok((Some(done), left));
            }
            Err(error) => {
                log::info!(
                    "upstream portmap's {} {} rules: the removal did not apply ({}); reading them again, in case they changed since the read",
                    source.backend,
                    source.family,
                    crate::cni::error::with_sources(&error)
                );
                failed = Some(error);
            }
        }
    }
    // The same failure from fresh reads: not a race. Some iptables-nft
    // builds refuse to delete a chain in the transaction that deletes the
    // last jump to it; the container chains then go in two transactions,
    // and upstream's shared chains stay (as its own DEL leaves them).
    let table = read_iptables(source)?;
    let (chains, containers, left) = pick_chains(&table, select);
    let Some(split) = table.removal(&chains).and_then(|r| r.split) else {
        return Err(failed.expect("a removal was tried"));
    };
    run(tool(source, "restore")?, &["--noflush"], Some(&split))?;
    let done = Removed {
        source,
        containers,
        shared: false,
    };
    Ok((Some(done), left))
}

/// The container chains `select` takes, the owners they name, and the
/// owners of those it could not decide on.
fn pick_chains(
    table: &iptables::NatTable,
    select: &dyn Selector,
) -> (BTreeSet<String>, BTreeSet<String>, BTreeSet<String>) {
    let mut chains = BTreeSet::new();
    let mut taken = BTreeSet::new();
    let mut left = BTreeSet::new();
    for (chain, comment) in table.owners() {
        let shown = iptables::parse_owner_comment(&comment)
            .map_or_else(|| comment.clone(), |o| o.id_shown());
        match select.iptables(&comment, &table.destinations(&chain)) {
            Pick::Take => {
                chains.insert(chain);
                taken.insert(shown);
            }
            Pick::Unproven => {
                left.insert(shown);
            }
            Pick::Leave => {}
        }
    }
    (chains, taken, left)
}

fn remove_nftables(source: Source, select: &dyn Selector) -> Outcome {
    let mut failed = None;
    for _ in 0..ATTEMPTS {
        let table = read_nftables(source)?;
        let mut taken = BTreeSet::new();
        let mut left = BTreeSet::new();
        for rule in &table.rules {
            let Some(id) = rule.owner() else {
                continue;
            };
            match select.nftables(id, rule.container_addr) {
                Pick::Take => taken.insert(id.to_owned()),
                Pick::Unproven => left.insert(id.to_owned()),
                Pick::Leave => false,
            };
        }
        let removal = table.removal(|rule| {
            rule.owner()
                .is_some_and(|id| select.nftables(id, rule.container_addr) == Pick::Take)
        });
        let Some(removal) = removal else {
            return Ok((None, left));
        };
        test_knob::pause_between_read_and_write();
        match run(tool(source, "nft")?, &["-f", "-"], Some(&removal.script)) {
            Ok(_) => {
                let done = Removed {
                    source,
                    containers: taken,
                    shared: removal.table,
                };
                return Ok((Some(done), left));
            }
            Err(error) => {
                log::info!(
                    "upstream portmap's {} {} rules: the removal did not apply ({}); reading them again, in case they changed since the read",
                    source.backend,
                    source.family,
                    crate::cni::error::with_sources(&error)
                );
                failed = Some(error);
            }
        }
    }
    Err(failed.expect("a removal was tried"))
}

/// Tests put an upstream ADD between a removal's read and its write.
mod test_knob {
    /// Debug builds only: with `EBPF_PORTMAP_TEST_UPSTREAM_PAUSE=DIR`, a
    /// removal creates `DIR/paused` after its read and waits (a minute at
    /// most) for `DIR/resume` before it writes.
    #[cfg(debug_assertions)]
    pub fn pause_between_read_and_write() {
        let Some(dir) =
            std::env::var_os("EBPF_PORTMAP_TEST_UPSTREAM_PAUSE").map(std::path::PathBuf::from)
        else {
            return;
        };
        let resume = dir.join("resume");
        if resume.exists() {
            return;
        }
        let _ = std::fs::write(dir.join("paused"), b"");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while !resume.exists() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    #[cfg(not(debug_assertions))]
    pub fn pause_between_read_and_write() {}
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapping(family: Family, port: u16, addr: Option<&str>) -> Mapping {
        Mapping {
            source: Source {
                backend: Backend::IptablesNft,
                family,
            },
            network: Some("net".into()),
            container_id: Some("c1".into()),
            comment: Some(r#"dnat name: "net" id: "c1""#.into()),
            port: Port {
                protocol: Protocol::Tcp,
                host_port: port,
                host_addr: addr.map(|a| a.parse().unwrap()),
                container_addr: "10.244.0.5".parse().unwrap(),
                container_port: 80,
            },
        }
    }

    #[test]
    fn a_port_overlaps_on_the_same_family_protocol_and_address() {
        let any = mapping(Family::V4, 8080, None);
        let one = mapping(Family::V4, 8080, Some("198.18.0.1"));
        let addr = Some("198.18.0.1".parse().unwrap());
        let other = Some("198.18.0.9".parse().unwrap());
        assert!(any.overlaps(Family::V4, Protocol::Tcp, 8080, None));
        assert!(any.overlaps(Family::V4, Protocol::Tcp, 8080, addr));
        assert!(one.overlaps(Family::V4, Protocol::Tcp, 8080, None));
        assert!(one.overlaps(Family::V4, Protocol::Tcp, 8080, addr));
        assert!(!one.overlaps(Family::V4, Protocol::Tcp, 8080, other));
        assert!(!any.overlaps(Family::V6, Protocol::Tcp, 8080, None));
        assert!(!any.overlaps(Family::V4, Protocol::Udp, 8080, None));
        assert!(!any.overlaps(Family::V4, Protocol::Tcp, 8081, None));
    }

    #[test]
    fn the_holder_is_named_with_its_network_and_backend() {
        assert_eq!(
            mapping(Family::V4, 8080, None).holder(),
            "container c1 (network net, set up by upstream portmap, iptables-nft)"
        );
        assert_eq!(mapping(Family::V6, 80, None).host(), "[::]:80/tcp");
        assert_eq!(
            mapping(Family::V4, 80, Some("198.18.0.1")).host(),
            "198.18.0.1:80/tcp"
        );
    }

    #[test]
    fn empty_and_relative_path_entries_are_never_searched() {
        // ":" and "" are the working directory to a shell; "bin" is
        // relative to it. The tools run as root: only absolute entries.
        let dirs = tool_dirs(OsStr::new(":/opt/x/bin::bin:./sbin:"));
        assert_eq!(
            dirs,
            [
                "/opt/x/bin",
                "/usr/sbin",
                "/sbin",
                "/usr/local/sbin",
                "/usr/bin"
            ]
            .map(PathBuf::from)
        );
        assert_eq!(tool_dirs(OsStr::new("")), SBIN.map(PathBuf::from));
        // A tool planted in the working directory is not found through an
        // empty entry (though it is through that directory named in full).
        let cwd = std::env::current_dir().unwrap();
        let name = "epm-test-planted-tool";
        let planted = cwd.join(name);
        std::fs::write(&planted, b"").unwrap();
        let through_empty = find_tool_in(&tool_dirs(OsStr::new("::")), &[name]);
        let through_cwd = find_tool_in(std::slice::from_ref(&cwd), &[name]);
        std::fs::remove_file(&planted).unwrap();
        assert_eq!(through_empty, None);
        assert_eq!(through_cwd, Some((planted, name)));
    }

    fn v4(addr: &str) -> IpAddr {
        addr.parse().unwrap()
    }

    #[test]
    fn a_del_takes_only_its_own_attachments_rules() {
        let del = Attachment {
            network: "a",
            container_id: "c1",
            addrs: vec![v4("10.1.0.5")],
        };
        // iptables: the comment upstream writes for this network and container.
        let comment = iptables::owner_comment("a", "c1");
        assert_eq!(del.iptables(&comment, &[v4("10.1.0.5")]), Pick::Take);
        let other_network = iptables::owner_comment("b", "c1");
        assert_eq!(del.iptables(&other_network, &[]), Pick::Leave);
        // nftables: the container ID and its address on this network.
        assert_eq!(del.nftables("c1", Some(v4("10.1.0.5"))), Pick::Take);
        assert_eq!(
            del.nftables("c1", Some(v4("10.2.0.5"))),
            Pick::Leave,
            "the same container on another network"
        );
        assert_eq!(del.nftables("c1", None), Pick::Unproven);
        assert_eq!(del.nftables("c2", Some(v4("10.1.0.5"))), Pick::Leave);
        let without_prev_result = Attachment {
            addrs: Vec::new(),
            ..del
        };
        assert_eq!(
            without_prev_result.nftables("c1", Some(v4("10.1.0.5"))),
            Pick::Unproven
        );
    }

    #[test]
    fn a_del_takes_a_cut_comment_on_its_addresses() {
        let network = "n".repeat(200);
        let id = "f".repeat(64);
        let comment = iptables::owner_comment(&network, &id);
        assert!(iptables::is_cut(&comment));
        let del = Attachment {
            network: &network,
            container_id: &id,
            addrs: vec![v4("10.1.0.5")],
        };
        assert_eq!(del.iptables(&comment, &[v4("10.1.0.5")]), Pick::Take);
        assert_eq!(del.iptables(&comment, &[v4("10.1.0.6")]), Pick::Leave);
        let blind = Attachment {
            addrs: Vec::new(),
            ..del
        };
        assert_eq!(blind.iptables(&comment, &[v4("10.1.0.5")]), Pick::Unproven);
    }

    #[test]
    fn gc_takes_its_networks_iptables_rules_and_leaves_nftables_ones() {
        let network = "n".repeat(200);
        let live = format!("{}{}", "a".repeat(60), "live");
        let lost = format!("{}{}", "b".repeat(60), "lost");
        let keep = BTreeSet::from([live.clone()]);
        let gc = Collect {
            network: &network,
            keep: &keep,
        };
        assert_eq!(
            gc.iptables(&iptables::owner_comment(&network, &live), &[]),
            Pick::Leave
        );
        assert_eq!(
            gc.iptables(&iptables::owner_comment(&network, &lost), &[]),
            Pick::Take
        );
        assert_eq!(
            gc.iptables(&iptables::owner_comment("other", &lost), &[]),
            Pick::Leave
        );
        // A network cut away: nothing tells which network or container.
        let long = "m".repeat(250);
        let nameless = iptables::owner_comment(&long, &lost);
        let gc_long = Collect {
            network: &long,
            keep: &keep,
        };
        assert_eq!(gc_long.iptables(&nameless, &[]), Pick::Unproven);
        // nftables rules name no network: never taken by GC.
        assert_eq!(gc.nftables(&lost, Some(v4("10.1.0.5"))), Pick::Unproven);
        assert_eq!(gc.nftables(&live, Some(v4("10.1.0.5"))), Pick::Leave);
    }
}
