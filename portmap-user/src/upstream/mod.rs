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
//! What is removed follows upstream's own DEL (its rules for that
//! container, idempotently), plus what upstream leaves for good: its
//! shared chains (and the jumps to them) or its table once no container
//! mapping is left, so the node ends as it was before upstream's first ADD.

pub mod iptables;
pub mod nft;
mod probe;

use std::collections::BTreeSet;
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
    /// nftables backend records the container ID alone).
    pub network: Option<String>,
    /// `None` for a container chain no jump names any more.
    pub container_id: Option<String>,
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

fn find_tool(names: &[&'static str]) -> Option<(PathBuf, &'static str)> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let dirs: Vec<PathBuf> = std::env::split_paths(&path)
        .chain(SBIN.iter().map(PathBuf::from))
        .collect();
    for name in names {
        for dir in &dirs {
            let candidate = dir.join(name);
            if candidate.is_file() {
                return Some((candidate, name));
            }
        }
    }
    None
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
        Backend::Nftables => {
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
            Ok(Read::Nft(nft::parse_table(&json)))
        }
        _ => {
            let text = run(tool(source, "save")?, &["-t", "nat"], None)?;
            Ok(Read::Iptables(iptables::parse_save(&text)))
        }
    }
}

fn mappings_of(source: Source, read: &Read) -> Vec<Mapping> {
    match read {
        Read::Iptables(table) => table
            .mappings()
            .into_iter()
            .map(|m| Mapping {
                source,
                network: m.network,
                container_id: m.container_id,
                port: m.port,
            })
            .collect(),
        Read::Nft(table) => table
            .rules
            .iter()
            .filter_map(|rule| {
                Some(Mapping {
                    source,
                    network: None,
                    container_id: Some(rule.container_id.clone()),
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

/// Which containers' state a removal takes: by (network, container ID).
/// The nftables backend records no network, so there the container ID
/// alone decides.
pub trait Selector {
    fn selects(&self, network: Option<&str>, container_id: &str) -> bool;
}

impl<F: Fn(Option<&str>, &str) -> bool> Selector for F {
    fn selects(&self, network: Option<&str>, container_id: &str) -> bool {
        self(network, container_id)
    }
}

/// What a removal did in one source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Removed {
    pub source: Source,
    /// The containers whose rules went.
    pub containers: BTreeSet<String>,
    /// Whether upstream's shared chains (or its table) went too.
    pub shared: bool,
}

/// Removes upstream's rules of the containers `select` picks, in every
/// source, and its shared chains (its table) where no container is left.
/// Idempotent: what is gone is not looked for again. Keeps going after a
/// source fails and reports every failure.
pub fn remove(sources: &[Source], select: &dyn Selector) -> (Vec<Removed>, Vec<UpstreamError>) {
    let mut removed = Vec::new();
    let mut errors = Vec::new();
    for source in sources {
        match remove_in(*source, select) {
            Ok(Some(done)) => removed.push(done),
            Ok(None) => {}
            Err(error) => errors.push(error),
        }
    }
    (removed, errors)
}

fn remove_in(source: Source, select: &dyn Selector) -> Result<Option<Removed>, UpstreamError> {
    match read_source(source)? {
        Read::Iptables(table) => {
            let owners = table.owners();
            let mut chains = BTreeSet::new();
            let mut containers = BTreeSet::new();
            for (chain, (network, id)) in &owners {
                if select.selects(Some(network), id) {
                    chains.insert(chain.clone());
                    containers.insert(id.clone());
                }
            }
            // Shared chains with no container chain left at all go even
            // when this container had none here (upstream never removes them).
            let Some(batch) = table.removal_batch(&chains) else {
                return Ok(None);
            };
            let shared = batch.contains(&format!("-X {}", iptables::TOP_DNAT_CHAIN));
            run(tool(source, "restore")?, &["--noflush"], Some(&batch))?;
            Ok(Some(Removed {
                source,
                containers,
                shared,
            }))
        }
        Read::Nft(table) => {
            let Some(script) = table.removal_script(|id| select.selects(None, id)) else {
                return Ok(None);
            };
            let containers = table
                .rules
                .iter()
                .filter(|r| select.selects(None, &r.container_id))
                .map(|r| r.container_id.clone())
                .collect();
            run(tool(source, "nft")?, &["-f", "-"], Some(&script))?;
            Ok(Some(Removed {
                source,
                shared: script.starts_with("delete table"),
                containers,
            }))
        }
    }
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
}
