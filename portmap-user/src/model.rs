//! The domain types every layer shares: what a port mapping is, who owns it,
//! the container's addresses, and the bounds of the dataplane's maps. Pure:
//! no I/O, no JSON; `cni` builds these from a request, `dataplane` stores them.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Where maps and links are pinned when the config has no `pinRoot`.
pub const DEFAULT_PIN_ROOT: &str = "/sys/fs/bpf/ebpf-portmap";

/// Accepted range of `maxMappings` (capacity of the mappings map).
pub const MAX_MAPPINGS_MIN: u32 = 16;
pub const MAX_MAPPINGS_MAX: u32 = 1 << 20;

/// Smallest accepted `conntrackSize` (entries in the conntrack map).
pub const CONNTRACK_SIZE_MIN: u32 = 1024;
/// Largest accepted `conntrackSize`; beyond this the map's memory cost is
/// almost certainly a typo.
pub const CONNTRACK_SIZE_MAX: u32 = 16 * 1024 * 1024;

/// `serviceVipDevices` when the config has none: kube-proxy's IPVS device,
/// which holds every Service ClusterIP.
pub const DEFAULT_SERVICE_VIP_DEVICES: [&str; 1] = ["kube-ipvs0"];

/// Which translated flows the network's configuration hands to the fast
/// path (`fastPath`, node-wide: the last ADD's setting holds).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FastPathSetting {
    /// `fastPath` unset: flows the kernel's conntrack holds as confirmed,
    /// i.e. that the node's firewall let through (where the kernel cannot
    /// say, see `dataplane::features::fast_path_flags`).
    #[default]
    Confirmed,
    /// `fastPath: true`: every translated flow (hairpin from its second packet), FORWARD or not.
    Always,
    /// `fastPath: false`: none; every packet through netfilter.
    Never,
}

/// Transport protocol of a port mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    /// IANA protocol number, as found in the IP header (`IPPROTO_*`).
    pub fn number(self) -> u8 {
        match self {
            Protocol::Tcp => 6,
            Protocol::Udp => 17,
            Protocol::Sctp => 132,
        }
    }

    /// Lower-case name, as written in CNI `portMappings`.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }

    /// Parses a protocol name case-insensitively (runtimes send "tcp" as well
    /// as Kubernetes' "TCP").
    pub fn from_name(name: &str) -> Option<Protocol> {
        [Protocol::Tcp, Protocol::Udp, Protocol::Sctp]
            .into_iter()
            .find(|protocol| protocol.as_str().eq_ignore_ascii_case(name))
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// hostIP as the user gave it. Absent = every local address of both families;
/// 0.0.0.0 = every local IPv4 address only; :: = every local IPv6 address only
/// (upstream portmap semantics); anything else = exactly that address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HostIp {
    Any,
    AnyV4,
    AnyV6,
    Addr(IpAddr),
}

impl HostIp {
    /// Whether traffic to an IPv4 host address can match this mapping.
    pub fn allows_v4(&self) -> bool {
        matches!(
            self,
            HostIp::Any | HostIp::AnyV4 | HostIp::Addr(IpAddr::V4(_))
        )
    }

    /// Whether traffic to an IPv6 host address can match this mapping.
    pub fn allows_v6(&self) -> bool {
        matches!(
            self,
            HostIp::Any | HostIp::AnyV6 | HostIp::Addr(IpAddr::V6(_))
        )
    }

    /// The one address this mapping is limited to, if it is not a wildcard.
    pub fn specific(&self) -> Option<IpAddr> {
        match self {
            HostIp::Addr(addr) => Some(*addr),
            HostIp::Any | HostIp::AnyV4 | HostIp::AnyV6 => None,
        }
    }

    /// The (family wildcard or exact address) slots this hostIP occupies; two
    /// mappings with the same port and protocol collide when they share one.
    pub(crate) fn claims(&self) -> [Option<HostClaim>; 2] {
        match self {
            HostIp::Any => [Some(HostClaim::EveryV4), Some(HostClaim::EveryV6)],
            HostIp::AnyV4 => [Some(HostClaim::EveryV4), None],
            HostIp::AnyV6 => [Some(HostClaim::EveryV6), None],
            HostIp::Addr(addr) => [Some(HostClaim::Exact(*addr)), None],
        }
    }
}

impl fmt::Display for HostIp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostIp::Any => f.write_str("every local address"),
            HostIp::AnyV4 => f.write_str("0.0.0.0"),
            HostIp::AnyV6 => f.write_str("::"),
            HostIp::Addr(addr) => write!(f, "{addr}"),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum HostClaim {
    EveryV4,
    EveryV6,
    Exact(IpAddr),
}

impl fmt::Display for HostClaim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostClaim::EveryV4 => f.write_str("every local IPv4 address"),
            HostClaim::EveryV6 => f.write_str("every local IPv6 address"),
            HostClaim::Exact(addr) => write!(f, "{addr}"),
        }
    }
}

/// One validated `runtimeConfig.portMappings` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortMapping {
    pub host_ip: HostIp,
    pub host_port: u16,
    pub container_port: u16,
    pub protocol: Protocol,
}

/// The container's addresses on the attached interface, from `prevResult`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerAddrs {
    pub v4: Option<Ipv4Addr>,
    pub v6: Option<Ipv6Addr>,
}

/// One entry of prevResult's `interfaces`, read leniently: what is missing or
/// of the wrong type is `None` (`cni::prev_result` checks what must be right
/// on the way to the container's addresses).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PrevInterface {
    pub name: Option<String>,
    pub mac: Option<String>,
    pub sandbox: Option<String>,
}

impl PrevInterface {
    /// Whether this is the container's side (a non-empty `sandbox`).
    pub fn in_sandbox(&self) -> bool {
        self.sandbox
            .as_ref()
            .is_some_and(|sandbox| !sandbox.is_empty())
    }
}

/// Identity that owns map entries. All three parts are needed: "ADD A, ADD B,
/// DEL A" must never remove B's entries.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Owner {
    pub network: String,
    pub container_id: String,
    pub ifname: String,
}

/// Who a container is to its orchestrator, from `CNI_ARGS`: a Kubernetes
/// pod (containerd, CRI-O) or a Nomad allocation. Every part is optional:
/// podman and plain CNI tools send none of it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodIdentity {
    /// `K8S_POD_NAMESPACE`.
    pub pod_namespace: Option<String>,
    /// `K8S_POD_NAME`.
    pub pod_name: Option<String>,
    /// `NOMAD_ALLOC_ID`.
    pub nomad_alloc_id: Option<String>,
    /// `NOMAD_NAMESPACE`.
    pub nomad_namespace: Option<String>,
    /// `NOMAD_JOB_ID`.
    pub nomad_job: Option<String>,
    /// `NOMAD_GROUP_NAME`.
    pub nomad_group: Option<String>,
    /// `K8S_POD_UID` (containerd, CRI-O): tells two pods of one name apart.
    pub pod_uid: Option<String>,
}

impl PodIdentity {
    pub fn is_empty(&self) -> bool {
        *self == PodIdentity::default()
    }

    /// `namespace/name` of a Kubernetes pod, or `nomad:namespace/job/group`
    /// of a Nomad allocation (parts it lacks are `-`); `None` when nothing
    /// is known.
    pub fn label(&self) -> Option<String> {
        let part = |value: &Option<String>| value.clone().unwrap_or_else(|| "-".into());
        if self.pod_namespace.is_some() || self.pod_name.is_some() {
            Some(format!(
                "{}/{}",
                part(&self.pod_namespace),
                part(&self.pod_name)
            ))
        } else if self.nomad_alloc_id.is_some()
            || self.nomad_job.is_some()
            || self.nomad_group.is_some()
        {
            Some(format!(
                "nomad:{}/{}/{}",
                part(&self.nomad_namespace),
                part(&self.nomad_job),
                part(&self.nomad_group)
            ))
        } else {
            None
        }
    }
}

/// A namespace file's identity: the (device, inode) of its nsfs file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NsId {
    pub dev: u64,
    pub ino: u64,
}

/// What ADD records of a container's sandbox, to tell later whether the
/// container is still there when no DEL comes (a rollback to a plugin that
/// does not know us, a runtime bug, a crashed node).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sandbox {
    /// `CNI_NETNS` as the runtime gave it; `None` when it gave none.
    pub netns: Option<std::path::PathBuf>,
    /// The namespace at that path when ADD ran.
    pub netns_id: Option<NsId>,
    /// The mount namespace the path was resolved in (a path means
    /// something only there).
    pub mntns_id: Option<NsId>,
    /// `K8S_POD_UID`.
    pub pod_uid: Option<String>,
    /// Unix time a GC first found the namespace gone.
    pub gone_since: Option<u64>,
}

/// Whether an owner's container is still there, as far as can be proven.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Liveness {
    /// Its network namespace is there (at its path, or held elsewhere).
    Alive,
    /// Its network namespace is gone: the path is missing or holds
    /// another namespace, and no process, mount or open file holds it.
    Gone,
    /// Nothing proves it either way; the reason says why.
    Unknown(String),
}

impl fmt::Display for PodIdentity {
    /// "pod default/web-7f9c", "Nomad allocation 5e0c… (job default/web, group api)".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return f.write_str("no known pod");
        }
        if self.pod_namespace.is_some() || self.pod_name.is_some() {
            return write!(f, "pod {}", self.label().unwrap_or_default());
        }
        let part = |value: &Option<String>| value.clone().unwrap_or_else(|| "-".into());
        match &self.nomad_alloc_id {
            Some(alloc) => write!(f, "Nomad allocation {alloc}")?,
            None => f.write_str("Nomad allocation")?,
        }
        write!(
            f,
            " (job {}/{}, group {})",
            part(&self.nomad_namespace),
            part(&self.nomad_job),
            part(&self.nomad_group)
        )
    }
}

/// One entry of the GC keep-list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attachment {
    pub container_id: String,
    pub ifname: String,
}
