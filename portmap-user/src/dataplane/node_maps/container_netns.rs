//! The network namespaces of this node's containers whose own sockets the
//! socket hooks translate (`containerSockets`).
//!
//! Two maps, written in this order so that no step leaves a registration
//! nobody can find:
//! - `owner_netns` (userspace only, created on the first ADD that needs
//!   it): owner ID -> the cookie and the attachment (network, container
//!   ID, interface). Written first: from then on DEL finds the cookie by
//!   owner (the second DEL has no `CNI_NETNS`, and the namespace may be
//!   gone), and CNI GC finds it by network and container.
//! - `container_netns` (pinned with the programs, read by the hooks):
//!   cookie -> owner ID. The hooks ask only whether a cookie is in it.
//!
//! ADD writes the record, then the registration, then drops the
//! registration of an older namespace of the same owner. DEL removes the
//! registration (only if it still names the owner), then the record. A
//! killed ADD leaves a record with or without its registration; a killed
//! DEL a record without one: CNI GC removes both for containers it does
//! not list, and the node's GC removes registrations that no record names
//! (an older namespace of a re-ADD killed before it dropped it).
//!
//! A namespace cookie is never reused while the kernel runs, so a
//! registration outliving its namespace translates nothing: it only holds
//! a slot until DEL or GC.
//!
//! One namespace registered by two attachments of one container (two
//! interfaces chained with this plugin) is registered by the later ADD;
//! the DEL of that one removes it, and the other's connections take the
//! packet path from then on (served, masqueraded) until its next ADD.

use std::{
    os::fd::AsRawFd,
    path::{Path, PathBuf},
};

use aya::maps::{HashMap, MapData, MapError};
use portmap_common::{
    capacity,
    local::{NetnsRegistration, OWNER_NETNS_MAP, map_names},
};

use crate::dataplane::{
    node_maps::node_state,
    ownership::{owner_id, owner_record, record_strings},
    pinned::maps::{MapsError, OWNER_NETNS, create_user_map, is_errno, open, open_user_map},
    pinned::pin::PinLayout,
};
use crate::model::{Attachment, Owner};

#[derive(Debug, thiserror::Error)]
pub enum RegistrationError {
    #[error("cannot open the container's network namespace {path}")]
    OpenNetns {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot enter the container's network namespace {path}")]
    EnterNetns {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read the cookie of the container's network namespace {path}")]
    Cookie {
        path: PathBuf,
        #[source]
        source: Box<node_state::LocalError>,
    },
    #[error(
        "the pinned {map} map has no room for this container's namespace ({max} registrations): DEL or GC the containers that are gone, or turn containerSockets off"
    )]
    Full { map: &'static str, max: u32 },
    #[error("updating the {map} map failed")]
    Update {
        map: &'static str,
        #[source]
        source: Box<MapError>,
    },
    #[error(transparent)]
    Maps(Box<MapsError>),
}

impl From<MapsError> for RegistrationError {
    fn from(error: MapsError) -> Self {
        Self::Maps(Box::new(error))
    }
}

/// The cookie of the network namespace at `path` (a `CNI_NETNS`), read
/// from a short-lived thread that enters it: `setns` changes the calling
/// thread's namespace only, and the thread ends right after.
pub fn cookie_at(path: &Path) -> Result<u64, RegistrationError> {
    let file = std::fs::File::open(path).map_err(|source| RegistrationError::OpenNetns {
        path: path.to_owned(),
        source,
    })?;
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                // SAFETY: setns(2) on an open namespace file, for this
                // thread only.
                if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                    return Err(RegistrationError::EnterNetns {
                        path: path.to_owned(),
                        source: std::io::Error::last_os_error(),
                    });
                }
                node_state::netns_cookie().map_err(|source| RegistrationError::Cookie {
                    path: path.to_owned(),
                    source: Box::new(source),
                })
            })
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

fn registrations(layout: &PinLayout) -> Result<HashMap<MapData, u64, u64>, MapsError> {
    open(layout, map_names::CONTAINER_NETNS)
}

fn update(map: &'static str) -> impl FnOnce(MapError) -> RegistrationError {
    move |source| {
        if is_errno(&source, libc::E2BIG) {
            RegistrationError::Full {
                map,
                max: capacity::CONTAINER_NETNS,
            }
        } else {
            RegistrationError::Update {
                map,
                source: Box::new(source),
            }
        }
    }
}

/// Registers the namespace with `netns_cookie` as `owner`'s: from now on
/// the socket hooks translate its sockets' `connect()`/`sendmsg()` to a
/// host port on one of the node's addresses. Replaces the owner's earlier
/// registration of another namespace, if any.
pub fn register(
    layout: &PinLayout,
    owner: &Owner,
    netns_cookie: u64,
) -> Result<(), RegistrationError> {
    let id = owner_id(owner);
    let (mut records, _) = create_user_map::<u64, NetnsRegistration>(layout, &OWNER_NETNS)?;
    let mut registered = registrations(layout)?;
    let earlier = records.get(&id, 0).ok().map(|r| r.netns_cookie);
    let record = NetnsRegistration {
        netns_cookie,
        owner: owner_record(owner, 0),
    };
    records
        .insert(id, record, 0)
        .map_err(update(OWNER_NETNS_MAP))?;
    registered
        .insert(netns_cookie, id, 0)
        .map_err(update(map_names::CONTAINER_NETNS))?;
    if let Some(earlier) = earlier.filter(|&cookie| cookie != netns_cookie) {
        remove_if_owned(&mut registered, earlier, id);
    }
    Ok(())
}

/// Removes the registration of `cookie` if it still names owner `id`
/// (a later ADD of another attachment may have taken it over).
fn remove_if_owned(registered: &mut HashMap<MapData, u64, u64>, cookie: u64, id: u64) -> bool {
    if registered.get(&cookie, 0).ok() != Some(id) {
        return false;
    }
    match registered.remove(&cookie) {
        Ok(()) => true,
        Err(error) if is_errno(&error, libc::ENOENT) => false,
        Err(error) => {
            log::warn!("registration of network namespace cookie {cookie} not removed: {error}");
            false
        }
    }
}

/// Forgets owner `id`'s registration, if it has one: its namespace's
/// sockets are left alone from now on. Best effort, like all of DEL: what
/// stays is found again by GC. Whether there was one.
pub fn forget(layout: &PinLayout, id: u64) -> bool {
    let Ok(Some(mut records)) = open_user_map::<u64, NetnsRegistration>(layout, &OWNER_NETNS)
    else {
        return false;
    };
    let Ok(record) = records.get(&id, 0) else {
        return false;
    };
    if let Ok(mut registered) = registrations(layout) {
        remove_if_owned(&mut registered, record.netns_cookie, id);
    }
    match records.remove(&id) {
        Ok(()) => true,
        Err(error) if is_errno(&error, libc::ENOENT) => false,
        Err(error) => {
            log::warn!("registration record of owner {id:016x} not removed: {error}");
            false
        }
    }
}

/// Whether the namespace with `netns_cookie` is registered as `owner`'s
/// (CHECK).
pub fn is_registered(layout: &PinLayout, owner: &Owner, netns_cookie: u64) -> bool {
    registrations(layout).is_ok_and(|map| map.get(&netns_cookie, 0).ok() == Some(owner_id(owner)))
}

/// One registration as `status` and tests see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    pub netns_cookie: u64,
    pub network: String,
    pub container_id: String,
    pub ifname: String,
    /// The hooks' map has the cookie under this owner (false: a record
    /// whose ADD or DEL was cut short).
    pub active: bool,
}

/// Every owner's registration record.
pub fn list(layout: &PinLayout) -> Result<Vec<(u64, Registration)>, MapsError> {
    let Some(records) = open_user_map::<u64, NetnsRegistration>(layout, &OWNER_NETNS)? else {
        return Ok(Vec::new());
    };
    let registered = registrations(layout).ok();
    Ok(records
        .iter()
        .filter_map(Result::ok)
        .map(|(id, record)| {
            let (network, container_id, ifname) = record_strings(&record.owner);
            let active = registered
                .as_ref()
                .is_some_and(|map| map.get(&record.netns_cookie, 0).ok() == Some(id));
            (
                id,
                Registration {
                    netns_cookie: record.netns_cookie,
                    network,
                    container_id,
                    ifname,
                    active,
                },
            )
        })
        .collect())
}

/// CNI GC: forgets the registrations of `network` whose attachment is not
/// in `valid`; how many.
pub fn collect(layout: &PinLayout, network: &str, valid: &[Attachment]) -> usize {
    let Ok(records) = list(layout) else {
        return 0;
    };
    records
        .into_iter()
        .filter(|(_, r)| {
            r.network == network
                && !valid
                    .iter()
                    .any(|a| a.container_id == r.container_id && a.ifname == r.ifname)
        })
        .filter(|(id, _)| forget(layout, *id))
        .count()
}

/// The node's GC: removes registrations that no record names (an earlier
/// namespace of an owner whose re-ADD was cut short, a record removed by
/// hand); how many.
pub fn prune(layout: &PinLayout) -> usize {
    let Ok(mut registered) = registrations(layout) else {
        return 0;
    };
    let records = open_user_map::<u64, NetnsRegistration>(layout, &OWNER_NETNS)
        .ok()
        .flatten();
    let named = |cookie: u64, id: u64| {
        records
            .as_ref()
            .and_then(|r| r.get(&id, 0).ok())
            .is_some_and(|record| record.netns_cookie == cookie)
    };
    let stale: Vec<(u64, u64)> = registered
        .iter()
        .filter_map(Result::ok)
        .filter(|&(cookie, id)| !named(cookie, id))
        .collect();
    stale
        .into_iter()
        .filter(|&(cookie, id)| remove_if_owned(&mut registered, cookie, id))
        .count()
}
