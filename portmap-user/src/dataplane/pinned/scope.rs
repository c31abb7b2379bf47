//! Which pin directory holds the state of the network namespace we run in.
//!
//! Several node namespaces can share one bpffs on one kernel (kind and k3d
//! nodes with /sys/fs/bpf bind-mounted, a host podman beside them). Their
//! state must never mix: the attachment pins are named by ifindex, which
//! each namespace numbers on its own, and the mappings of one node are no
//! business of another. So every pin root belongs to one network
//! namespace, recorded in the `netns_owner` map pinned under it:
//! - identity: the namespace cookie (`SO_NETNS_COOKIE`, Linux 5.14, which
//!   the node-local socket hooks need anyway). Unlike the nsfs inode, a
//!   cookie is never reused while the kernel runs, so the pins a deleted
//!   node left behind are never taken for a new node's. Pins do not
//!   outlive a reboot, nor do cookies, so nothing needs more.
//! - claim: the first ADD under a root pins the map with its cookie inside,
//!   created full and pinned in one step (pinning is an atomic create), so
//!   of two namespaces racing for a fresh root exactly one wins.
//! - roots made by builds before the marker: their `node` map holds the
//!   cookie of the namespace whose ADD last synced it, which is the owner
//!   on any node where one namespace used the root; that namespace adopts
//!   it on its next ADD and its mappings keep forwarding.
//! - the default root (`pinRoot` unset, or set to the default): the first
//!   namespace to claim it uses it as is (a single node keeps the paths of
//!   before); every other namespace gets `{root}/netns/{cookie}`, and keeps
//!   it even once the root is nobody's again (its owner gone and its state
//!   removed, see `stale.rs`).
//! - an explicit `pinRoot` owned by another namespace is refused: two
//!   nodes pointed at one directory on purpose are a mistake to report,
//!   not to paper over.
//!
//! The operator verbs resolve the root the same way, so `status`, `list`,
//! `gc` and `uninstall` find the state of the namespace they run in.

use std::{
    io,
    path::{Path, PathBuf},
};

use aya::maps::{Array, Map, MapData};
use portmap_common::{NETNS_OWNER_MAP, local::NodeConfig};

use crate::model::DEFAULT_PIN_ROOT;
use crate::{dataplane::node_maps::node_state, dataplane::pinned::pin::PinLayout};

#[derive(Debug, thiserror::Error)]
pub enum ScopeError {
    #[error(
        "pinRoot {root} holds the state of another network namespace (cookie {owner:#x}, this one is {ours:#x}): nodes sharing one bpffs need a pinRoot each; set another pinRoot for this node, or leave pinRoot unset and every namespace gets its own directory under {DEFAULT_PIN_ROOT}; if that node is gone, `rm -r {root}` removes what it left"
    )]
    InUse {
        root: PathBuf,
        owner: u64,
        ours: u64,
    },
    #[error(transparent)]
    Bpffs(#[from] crate::dataplane::pinned::bpffs::BpffsError),
    #[error("cannot record this network namespace as the owner of {path}")]
    Claim {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// What the caller does with the state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Reads or removes what is there (DEL, CHECK, GC, STATUS, the
    /// operator verbs): nothing is claimed.
    Read,
    /// Creates state (ADD): an unowned root becomes this namespace's.
    Claim,
}

/// The layout of the state of this network namespace under `root`.
///
/// On a kernel without `SO_NETNS_COOKIE` the root is used as is, as
/// before namespaces were told apart (ADD fails there anyway, on the
/// node-local hooks' need of the cookie).
pub fn resolve(root: &Path, access: Access) -> Result<PinLayout, ScopeError> {
    let Ok(ours) = node_state::netns_cookie() else {
        return Ok(PinLayout::new(root));
    };
    let layout = resolve_for(root, ours, access)?;
    *LAST_RESOLVED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(layout.clone());
    Ok(layout)
}

/// What the last [`resolve`] of this process returned, and for which root.
static LAST_RESOLVED: std::sync::Mutex<Option<PinLayout>> = std::sync::Mutex::new(None);

/// What the last [`resolve`] of this process returned: what a CNI run's
/// bookkeeping after its verb uses (the verb resolved it first thing; a
/// run resolves one root, the configuration's), instead of resolving again
/// (a socket and the owner record, about 7000 instructions of a run).
pub fn last_resolved() -> Option<PinLayout> {
    LAST_RESOLVED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone()
}

fn resolve_for(root: &Path, ours: u64, access: Access) -> Result<PinLayout, ScopeError> {
    let shared = root == Path::new(DEFAULT_PIN_ROOT);
    // Our own directory under the shared root stays ours, whoever owns the
    // root now: when the root's owner went away and its state was removed
    // (see `stale.rs`), the root is nobody's, and taking it would leave our
    // mappings behind.
    if shared {
        let own = PinLayout::new(crate::dataplane::pinned::pin::netns_root(root, ours));
        if own.versioned().exists() {
            return Ok(own);
        }
    }
    // Twice at most: once more when another namespace claimed the root
    // between our look and our claim.
    for _ in 0..2 {
        let base = PinLayout::new(root);
        let marker = marker(&base);
        let owner = marker.or_else(|| recorded_by_node_map(&base));
        let layout = match place(owner, ours, shared) {
            Place::Root => base,
            Place::OwnDirectory => {
                PinLayout::new(crate::dataplane::pinned::pin::netns_root(root, ours))
            }
            Place::Refused => {
                return Err(ScopeError::InUse {
                    root: root.to_path_buf(),
                    owner: owner.unwrap_or_default(),
                    ours,
                });
            }
        };
        // Read, or the root is ours already (its marker, just read, names
        // us; a root an older build's `node` map names us for is adopted
        // by pinning the marker below): nothing to claim.
        if access == Access::Read || marker == Some(ours) {
            return Ok(layout);
        }
        match claim(&layout, ours)? {
            Some(owner) if owner != ours && layout.root() == root && shared => continue,
            Some(owner) if owner != ours => {
                return Err(ScopeError::InUse {
                    root: layout.root().to_path_buf(),
                    owner,
                    ours,
                });
            }
            _ => return Ok(layout),
        }
    }
    Ok(PinLayout::new(crate::dataplane::pinned::pin::netns_root(
        root, ours,
    )))
}

/// Where the state of namespace `ours` goes, given the owner of the root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// The root itself: ours, or nobody's yet.
    Root,
    /// `{root}/netns/{ours}`: the shared default root is another's.
    OwnDirectory,
    /// An explicit root of another namespace.
    Refused,
}

fn place(owner: Option<u64>, ours: u64, shared: bool) -> Place {
    match owner {
        None => Place::Root,
        Some(owner) if owner == ours => Place::Root,
        Some(_) if shared => Place::OwnDirectory,
        Some(_) => Place::Refused,
    }
}

/// The namespace that owns the state under `layout`: its marker, else the
/// cookie the `node` map of an older build recorded; `None` for a root
/// nobody claimed yet.
pub fn owner(layout: &PinLayout) -> Option<u64> {
    marker(layout).or_else(|| recorded_by_node_map(layout))
}

/// The namespace the `netns_owner` marker under `layout` names.
fn marker(layout: &PinLayout) -> Option<u64> {
    let data = MapData::from_pin(layout.map(NETNS_OWNER_MAP)).ok()?;
    let map = Array::<_, u64>::try_from(Map::Array(data)).ok()?;
    map.get(&0, 0).ok().filter(|&cookie| cookie != 0)
}

/// The namespace whose ADD last synced the `node` map of a build before
/// the marker.
fn recorded_by_node_map(layout: &PinLayout) -> Option<u64> {
    let data = MapData::from_pin(layout.map(portmap_common::local::map_names::NODE)).ok()?;
    let node = Array::<_, NodeConfig>::try_from(Map::Array(data)).ok()?;
    let config = node.get(&0, 0).ok()?;
    (config.netns_cookie != 0).then_some(config.netns_cookie)
}

/// Pins the marker of `ours` under `layout` unless one is there; returns
/// the owner the marker names afterwards (`None` only when it cannot be
/// read back, which the next call retries).
fn claim(layout: &PinLayout, ours: u64) -> Result<Option<u64>, ScopeError> {
    let path = layout.map(NETNS_OWNER_MAP);
    if path.exists() {
        return Ok(owner(layout));
    }
    let fail = |source: io::Error| ScopeError::Claim {
        path: path.clone(),
        source,
    };
    // Before anything is made: a node without bpffs at /sys/fs/bpf gets it
    // mounted (as ADD always did), and the directory made private.
    crate::dataplane::pinned::bpffs::mount_bpffs_if_missing(layout.root())
        .and_then(|()| crate::dataplane::pinned::bpffs::create_private_dir(&layout.maps_dir()))
        .map_err(ScopeError::Bpffs)?;
    // An array: `status` judges hash maps by fill, and this one is full by
    // design.
    let definition = crate::dataplane::pinned::maps::user_map_definition(
        aya_obj::generated::bpf_map_type::BPF_MAP_TYPE_ARRAY,
        (size_of::<u32>() as u32, size_of::<u64>() as u32),
        1,
        0,
    );
    let other = |error: String| fail(io::Error::other(error));
    let data =
        MapData::create(definition, NETNS_OWNER_MAP, None).map_err(|e| other(e.to_string()))?;
    let mut map = Array::<_, u64>::try_from(Map::Array(data)).map_err(|e| other(e.to_string()))?;
    // Filled before it is pinned: whoever sees the pin sees the owner.
    map.set(0, ours, 0).map_err(|e| other(e.to_string()))?;
    match map.pin(&path) {
        Ok(()) => Ok(Some(ours)),
        Err(aya::pin::PinError::SyscallError(error))
            if error.io_error.raw_os_error() == Some(libc::EEXIST) =>
        {
            Ok(owner(layout))
        }
        Err(error) => Err(other(error.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_root_is_its_owners_and_the_default_one_is_shared_out() {
        assert_eq!(place(None, 7, false), Place::Root, "nobody's yet");
        assert_eq!(place(None, 7, true), Place::Root);
        assert_eq!(place(Some(7), 7, false), Place::Root, "ours");
        assert_eq!(place(Some(7), 7, true), Place::Root);
        assert_eq!(
            place(Some(9), 7, true),
            Place::OwnDirectory,
            "the default root of another namespace: our own directory under it"
        );
        assert_eq!(
            place(Some(9), 7, false),
            Place::Refused,
            "an explicit root of another namespace"
        );
    }

    #[test]
    fn the_refusal_names_the_root_and_the_way_out() {
        let error = ScopeError::InUse {
            root: "/sys/fs/bpf/kind".into(),
            owner: 0x10,
            ours: 0x20,
        };
        let text = error.to_string();
        assert!(
            text.starts_with(
                "pinRoot /sys/fs/bpf/kind holds the state of another network namespace (cookie 0x10, this one is 0x20)"
            ),
            "{text}"
        );
        assert!(text.contains("leave pinRoot unset"), "{text}");
        assert!(text.contains("`rm -r /sys/fs/bpf/kind`"), "{text}");
    }
}
