//! What several verbs share: their error and its CNI codes, the
//! privilege check, the pin root a verb acts on, and the owner's traffic
//! counters. Below the verbs (they import it, it imports none of them).

use crate::model::{Owner, PodIdentity};
use crate::{
    cni::CniError,
    cni::error::{code, with_sources},
    dataplane::attach::AttachError,
    dataplane::counters,
    dataplane::interface_conditions::InterfaceConditionsError,
    dataplane::node_state,
    dataplane::ownership::StoreError,
    dataplane::pin::PinLayout,
    dataplane::scope,
    dataplane::{maps::MapsError, ownership::Store},
    node::netlink::NetlinkError,
    node::privilege,
};

#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Attach(#[from] AttachError),
    #[error(transparent)]
    Maps(#[from] MapsError),
    #[error("cannot read the node's interfaces and routes")]
    Netlink(#[from] NetlinkError),
    #[error(
        "no interface of this node matches `interfaces` ({}); this node has {}: list interfaces it has, or patterns such as \"eth*\", or remove the key to attach to every up interface",
        patterns.join(", "),
        available.join(", ")
    )]
    NoMatchingInterfaces {
        patterns: Vec<String>,
        available: Vec<String>,
    },
    #[error("the eBPF programs are not attached to interface index {index}")]
    NotAttached { index: u32 },
    #[error("ebpf-portmap needs {} to load and attach its programs; run it as root", missing.join(" and "))]
    Privilege { missing: Vec<&'static str> },
    #[error(
        "host port {port}/{protocol} is in use on the node by {holders} (socket bound to {addr}); mapping it would take the port from that service. Free the port, pick another hostPort, or set \"hostPortListeners\": \"allow\""
    )]
    HostPortInUse {
        port: u16,
        protocol: &'static str,
        addr: std::net::IpAddr,
        holders: String,
    },
    #[error(
        "host port {key} is still mapped by {holder}: upstream's rules send its traffic there until that container's DEL. Pick another hostPort, or wait until that pod is gone (`ebpf-portmap list` shows upstream's mappings)"
    )]
    UpstreamHeld {
        key: crate::dataplane::ownership::KeyDisplay,
        holder: String,
    },
    #[error(
        "firewalld runs in this node's network namespace, and its FORWARD chain accepts the forwarded flows conntrack holds as DNAT and refuses the rest unless the uplinks and the bridge share a zone that forwards within itself; these mappings' flows would be translated in tc, before netfilter, which never sees them as DNAT, so their clients would be refused (admin-prohibited): {mappings}. Set \"fastPath\": true in this plugin's configuration (translated flows then skip FORWARD, where firewalld's zones, policies and direct rules no longer decide them), or drop these mappings; `ebpf-portmap status` says where this node translates each family and why"
    )]
    FirewalldRefuses { mappings: String },
    #[error("cannot read the node's sockets")]
    Sockets(#[source] std::io::Error),
    #[error(transparent)]
    Local(#[from] node_state::LocalError),
    #[error(transparent)]
    Scope(#[from] scope::ScopeError),
    #[error(transparent)]
    InterfaceConditions(#[from] InterfaceConditionsError),
    #[error("containerSockets: the container's network namespace is not registered")]
    ContainerNetns(#[from] crate::dataplane::container_netns::RegistrationError),
    #[error(
        "containerSockets is on, but the network namespace {} of container {container_id} is not registered for socket translation: its connections take the packet path; ADD it again",
        netns.display()
    )]
    NotRegistered {
        container_id: String,
        netns: std::path::PathBuf,
    },
}

impl PluginError {
    fn code(&self) -> u32 {
        match self {
            PluginError::Store(StoreError::Conflict { .. } | StoreError::Overlap { .. })
            | PluginError::UpstreamHeld { .. } => code::PORT_CONFLICT,
            PluginError::Store(StoreError::Removed { .. }) => code::TRY_AGAIN_LATER,
            PluginError::Store(StoreError::Capacity { .. } | StoreError::TooManySlots { .. }) => {
                code::CAPACITY
            }
            PluginError::Store(StoreError::Missing { .. } | StoreError::NotAdded { .. })
            | PluginError::NotAttached { .. }
            | PluginError::NotRegistered { .. } => code::CHECK_FAILED,
            PluginError::Store(_) | PluginError::Maps(_) | PluginError::Netlink(_) => {
                code::IO_FAILURE
            }
            PluginError::Attach(AttachError::Bpffs(error))
            | PluginError::Scope(scope::ScopeError::Bpffs(error))
                if error.is_configuration() =>
            {
                code::INVALID_NETWORK_CONFIG
            }
            // A maxMappings below the live mappings: the conflist's to fix.
            PluginError::Attach(AttachError::Resize(
                crate::dataplane::resize::ResizeError::TooSmall { .. },
            )) => code::INVALID_NETWORK_CONFIG,
            PluginError::Attach(_) => code::DATAPLANE,
            PluginError::NoMatchingInterfaces { .. } | PluginError::FirewalldRefuses { .. } => {
                code::INVALID_NETWORK_CONFIG
            }
            PluginError::Privilege { .. } => code::PRIVILEGE,
            PluginError::HostPortInUse { .. } => code::HOST_PORT_IN_USE,
            PluginError::Sockets(_) | PluginError::Local(_) => code::IO_FAILURE,
            PluginError::Scope(scope::ScopeError::InUse { .. }) => code::INVALID_NETWORK_CONFIG,
            PluginError::Scope(_) => code::IO_FAILURE,
            PluginError::ContainerNetns(
                crate::dataplane::container_netns::RegistrationError::Full { .. },
            ) => code::CAPACITY,
            PluginError::ContainerNetns(_) => code::IO_FAILURE,
            PluginError::InterfaceConditions(InterfaceConditionsError::IdCollision { .. }) => {
                code::INVALID_NETWORK_CONFIG
            }
            PluginError::InterfaceConditions(_) => code::IO_FAILURE,
        }
    }
}

impl From<PluginError> for CniError {
    fn from(error: PluginError) -> Self {
        // A permission the kernel denied to a run that lacks capabilities is
        // that lack, whichever step met it: one code (104) and one text.
        if !matches!(error, PluginError::Privilege { .. }) && denied(&error) {
            let missing = privilege::missing();
            if !missing.is_empty() {
                let privilege = PluginError::Privilege { missing };
                return CniError::new(
                    privilege.code(),
                    privilege.to_string(),
                    with_sources(&error),
                );
            }
        }
        CniError::from_error(error.code(), &error)
    }
}

/// Whether `error` or one of its sources is a denied permission.
pub(super) fn denied(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(error);
    while let Some(current) = cause {
        if current
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::raw_os_error)
            .is_some_and(|errno| errno == libc::EPERM || errno == libc::EACCES)
        {
            return true;
        }
        cause = current.source();
    }
    false
}

pub(super) fn require_privilege() -> Result<(), PluginError> {
    let missing = privilege::missing();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(PluginError::Privilege { missing })
    }
}

/// How log lines name a container: its ID, and its pod when one is known
/// ("3a1b2c3d4e5f (pod default/web-7f9c)").
pub fn who(owner: &Owner, identity: &PodIdentity) -> String {
    if identity.is_empty() {
        owner.container_id.clone()
    } else {
        format!("{} ({identity})", owner.container_id)
    }
}

/// The state of this network namespace under `root` for DEL and GC, or
/// `None` when another namespace owns an explicit `root`: nothing of ours
/// can be there (our ADD was refused), and a DEL after a refused ADD must
/// succeed, or the runtime retries it for ever.
pub(super) fn own_state(root: &std::path::Path) -> Result<Option<PinLayout>, PluginError> {
    match scope::resolve(root, scope::Access::Read) {
        Ok(layout) => Ok(Some(layout)),
        Err(error @ scope::ScopeError::InUse { .. }) => {
            log::info!("nothing of this node to remove: {error}");
            Ok(None)
        }
        Err(error) => Err(error.into()),
    }
}

/// Drops the traffic counters of a deleted owner. Best effort: a leftover
/// entry costs memory only (a new owner counts under another key), and GC
/// prunes it later.
pub(super) fn forget_counters(
    layout: &PinLayout,
    owner_id: u64,
    keys: &[portmap_common::MappingKey],
) {
    let result = crate::dataplane::maps::counters(layout)
        .map_err(|e| e.to_string())
        .and_then(|mut map| counters::forget(&mut map, owner_id, keys).map_err(|e| e.to_string()));
    if let Err(error) = result {
        log::warn!("traffic counters of owner {owner_id:016x} not removed: {error}");
    }
    // The socket hooks' counters, keyed alike (missing in older pins).
    if let Ok(mut map) = crate::dataplane::maps::sock_counters(layout)
        && let Err(error) = counters::forget(&mut map, owner_id, keys)
    {
        log::warn!("socket-hook counters of owner {owner_id:016x} not removed: {error}");
    }
}

/// Drops the traffic counters of mappings that no longer exist (best effort).
pub(super) fn prune_counters(layout: &PinLayout, maps: &Store) {
    let result = crate::dataplane::maps::counters(layout)
        .map_err(|e| e.to_string())
        .and_then(|mut map| counters::prune(&mut map, &maps.mappings).map_err(|e| e.to_string()));
    match result {
        Ok(pruned) if !pruned.is_empty() => {
            log::info!("GC: stale traffic counters removed: {}", pruned.len());
        }
        Ok(_) => {}
        Err(error) => log::warn!("stale traffic counters not pruned: {error}"),
    }
    if let Ok(mut map) = crate::dataplane::maps::sock_counters(layout)
        && let Err(error) = counters::prune(&mut map, &maps.mappings)
    {
        log::warn!("stale socket-hook counters not pruned: {error}");
    }
}
