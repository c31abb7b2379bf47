//! `-i`/`--in-interface` conditions kept by name: the index in a
//! `conditions` entry follows the interface its name names, across an
//! interface deleted and made again (a new index) and one that appears
//! after the ADD, as upstream's `-i NAME` is matched by name when a packet
//! comes.
//!
//! Why it holds: the tc ingress program sees a packet only on an interface
//! it is attached to, and the programs go on an interface they were not on
//! (one created, or re-created under an old name) only in the attach pass
//! of a reconciliation (`verbs::reconcile`), which every ADD, CHECK, DEL
//! and GC makes, and the agent on every rtnetlink link event. [`follow`]
//! runs in each of them before that pass: when a kept name's index is not
//! the one its entries hold, it rewrites them. So an interface carries the
//! programs only once every entry naming it holds its index; and an entry
//! still holding the index of an interface that is gone judges no packet
//! wrongly either, since a new interface given that index (by hand: the
//! kernel hands indexes out in turn) carries no programs until the next
//! pass, which rewrites first.
//!
//! Renames are the exception: renaming needs the interface down, and an
//! interface that carries the programs keeps them under its new name, so
//! from when it is up again until the next reconciliation its packets are
//! judged by its old name (and an interface renamed to a kept name by that
//! name's old index). The agent's pass follows the rename's `RTM_NEWLINK`
//! at once; without the agent, the next plugin run on the node does.
//!
//! State:
//! - each entry keeps its name's id (`Conditions::in_interface_id`, a hash
//!   of the name) beside the index;
//! - the record `{id}.in-interfaces` in the run directory (beside the pin
//!   root's lock): every kept name, one a line, with the index every entry
//!   naming it holds. A name is recorded before the first entry naming it
//!   is written, and its index in the record changes only once every entry
//!   naming it was rewritten (while they are, the record holds an index
//!   no interface has), so a killed run leaves a record that makes the
//!   next pass do its work again, never one that hides a change;
//! - the lock `{id}.in-interfaces-lock`: a name is resolved and an entry
//!   naming one written only under it (a rewrite here, and ADD's claim of
//!   an owner with conditions, see [`hold`]), so no writer puts an older
//!   resolution over a newer one, and a rewrite never puts back an entry
//!   an ADD replaced meanwhile. The innermost lock: nothing is waited for
//!   while it is held.
//!
//! Cost: a pass on a node without `-i` conditions pays one failed open of
//! the record; with them, a read of it and, per kept name, a look-up in
//! the links the pass read anyway (an `if_nametoindex` for a name not
//! among them). The lock and the walk of the conditions map come only when
//! an index changed.
//!
//! An entry naming an id the record does not keep (written by a build
//! before names were kept, or its record removed by hand) cannot be
//! re-resolved: a rewrite makes it admit no new flow (`-i` of no
//! interface), logged with its owner, until that container's next ADD.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs, io,
    path::{Path, PathBuf},
};

use aya::maps::MapError;
use portmap_common::conditions::{CONDITIONS_MAP, ConditionKey, Conditions, interface_id, negated};

use crate::dataplane::pinned::{
    lock::{LockError, lock_at, read_record, write_record},
    maps::{MapsError, is_errno, open_conditions},
    pin::PinLayout,
};
use crate::node::netlink::{self, Link};

/// `BPF_EXIST`: a rewrite never makes an entry a DEL removed meanwhile.
const BPF_EXIST: u64 = 2;

/// The index a name has in the record while its entries are rewritten:
/// none (interface indexes are positive `int`s), so that every pass finds
/// it outdated until the rewrite is done.
const PENDING: u32 = u32::MAX;

#[derive(Debug, thiserror::Error)]
pub enum InterfaceConditionsError {
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error("cannot read or write the record of `-i` interface names {path}")]
    Record {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot open the {CONDITIONS_MAP} map")]
    Open(#[source] Box<MapsError>),
    #[error("{operation} on the {CONDITIONS_MAP} map failed")]
    Map {
        operation: &'static str,
        #[source]
        source: MapError,
    },
    #[error(
        "{condition}: interface {name:?} has the same id as {kept:?}, which a condition on this node names already, so the programs' entries could not tell them apart when either interface changes; give one of them another name"
    )]
    IdCollision {
        condition: String,
        name: String,
        kept: String,
    },
}

/// The record's path (see the module docs).
pub fn record_path(layout: &PinLayout) -> PathBuf {
    layout.lock_file().with_extension("in-interfaces")
}

fn lock_path(layout: &PinLayout) -> PathBuf {
    layout.lock_file().with_extension("in-interfaces-lock")
}

/// The kept names, each with the index every entry naming it holds.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Record {
    pub names: BTreeMap<String, u32>,
}

impl Record {
    /// Lines of `{name} {index}` (names have no white space); a line that
    /// is not one is skipped: it names nothing a rewrite could use.
    pub fn parse(text: &str) -> Record {
        let names = text
            .lines()
            .filter_map(|line| {
                let (name, index) = line.split_once(' ')?;
                Some((name.to_owned(), index.parse().ok()?))
            })
            .collect();
        Record { names }
    }

    pub fn render(&self) -> String {
        self.names
            .iter()
            .map(|(name, index)| format!("{name} {index}\n"))
            .collect()
    }

    /// The record at `path`; empty when there is none.
    fn read(path: &Path) -> Result<Record, InterfaceConditionsError> {
        match read_record(path) {
            Ok(text) => Ok(Record::parse(&text)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Record::default()),
            Err(source) => Err(InterfaceConditionsError::Record {
                path: path.to_path_buf(),
                source,
            }),
        }
    }

    /// Writes it whole, or removes the file when it keeps no name.
    fn write(&self, path: &Path) -> Result<(), InterfaceConditionsError> {
        let written = if self.names.is_empty() {
            match fs::remove_file(path) {
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
                other => other,
            }
        } else {
            write_record(path, &self.render())
        };
        written.map_err(|source| InterfaceConditionsError::Record {
            path: path.to_path_buf(),
            source,
        })
    }

    /// Whether some kept name's interface has another index now than its
    /// entries hold (`now` gives a name's index, 0 for none).
    pub fn outdated(&self, now: impl Fn(&str) -> u32) -> bool {
        self.names.iter().any(|(name, index)| now(name) != *index)
    }

    /// A kept name other than `name` with the same id, if any.
    pub fn collision(&self, name: &str) -> Option<&str> {
        let id = interface_id(name.as_bytes());
        self.names
            .keys()
            .map(String::as_str)
            .find(|kept| *kept != name && interface_id(kept.as_bytes()) == id)
    }
}

/// The index interface `name` has now (0: the node has none by that name).
fn index_now(name: &str) -> u32 {
    netlink::interface_index(name).unwrap_or(0)
}

/// What a rewrite makes of `entry`, given every kept name's index now by
/// its id: `None` when it stays as it is.
pub fn rewritten(entry: &Conditions, now_by_id: &BTreeMap<u32, u32>) -> Option<Conditions> {
    if entry.has_in_interface == 0 {
        return None;
    }
    let mut out = *entry;
    match now_by_id.get(&entry.in_interface_id) {
        Some(&index) => out.in_ifindex = index,
        // No name to resolve: `-i` of no interface admits no flow.
        None => {
            out.in_ifindex = 0;
            out.negated &= !negated::IN_INTERFACE;
        }
    }
    (out != *entry).then_some(out)
}

/// Runs in every reconciliation, before anything is attached (see the
/// module docs): when a kept name's interface has another index now than
/// its entries hold (by the pass's `links`, or asked for a name not among
/// them), rewrites them under the lock.
pub fn follow(layout: &PinLayout, links: &[Link]) -> Result<(), InterfaceConditionsError> {
    let path = record_path(layout);
    let record = Record::read(&path)?;
    let now = |name: &str| match links.iter().find(|l| l.name == name) {
        Some(link) => link.index,
        None => index_now(name),
    };
    if !record.outdated(now) {
        return Ok(());
    }
    let _lock = lock_at(&lock_path(layout))?;
    // Read again under the lock: another run may have done it already.
    let record = Record::read(&path)?;
    settle(layout, &path, &record, &[])?;
    Ok(())
}

/// Under the lock: resolves every kept name and `adding` now; when a kept
/// name's index changed, rewrites every entry that needs it (and drops the
/// names no entry names, but `adding`); writes the record. Returns it.
fn settle(
    layout: &PinLayout,
    path: &Path,
    record: &Record,
    adding: &[&str],
) -> Result<Record, InterfaceConditionsError> {
    let mut now = Record::default();
    for name in record
        .names
        .keys()
        .map(String::as_str)
        .chain(adding.iter().copied())
    {
        now.names.insert(name.to_owned(), index_now(name));
    }
    let changed = record
        .names
        .iter()
        .any(|(name, index)| now.names.get(name) != Some(index));
    if changed {
        // First a record no interface matches: a run killed among the
        // rewrites leaves the next pass all of them to do again, even if
        // the names' indexes are back to what the record said.
        let pending = Record {
            names: now
                .names
                .keys()
                .map(|name| (name.clone(), PENDING))
                .collect(),
        };
        pending.write(path)?;
        let named = rewrite(layout, &now)?;
        now.names
            .retain(|name, _| named.contains(name) || adding.contains(&name.as_str()));
    }
    if now != *record {
        now.write(path)?;
    }
    Ok(now)
}

/// Rewrites every entry whose index is not its name's now (`now`), and
/// every entry whose name is not kept (see the module docs). Returns the
/// names some entry names.
fn rewrite(layout: &PinLayout, now: &Record) -> Result<BTreeSet<String>, InterfaceConditionsError> {
    let mut named = BTreeSet::new();
    let Some(mut map) =
        open_conditions(layout).map_err(|e| InterfaceConditionsError::Open(Box::new(e)))?
    else {
        return Ok(named);
    };
    let by_id: BTreeMap<u32, (&str, u32)> = now
        .names
        .iter()
        .map(|(name, index)| (interface_id(name.as_bytes()), (name.as_str(), *index)))
        .collect();
    let now_by_id: BTreeMap<u32, u32> =
        by_id.iter().map(|(id, (_, index))| (*id, *index)).collect();
    let keys = map
        .keys()
        .collect::<Result<Vec<ConditionKey>, _>>()
        .map_err(|source| InterfaceConditionsError::Map {
            operation: "iterate",
            source,
        })?;
    for key in keys {
        let entry = match map.get(&key, 0) {
            Ok(entry) => entry,
            // Removed meanwhile (DEL, GC).
            Err(e) if is_errno(&e, libc::ENOENT) => continue,
            Err(source) => {
                return Err(InterfaceConditionsError::Map {
                    operation: "lookup",
                    source,
                });
            }
        };
        if entry.has_in_interface == 0 {
            continue;
        }
        let name = by_id.get(&entry.in_interface_id).map(|(name, _)| *name);
        if let Some(name) = name {
            named.insert(name.to_owned());
        }
        let Some(new) = rewritten(&entry, &now_by_id) else {
            continue;
        };
        match name {
            Some(name) => log::info!(
                "-i {name} of owner {:016x} (IPv{}): interface index {} -> {}",
                key.owner_id,
                if key.family == portmap_common::FAMILY_V6 {
                    6
                } else {
                    4
                },
                entry.in_ifindex,
                new.in_ifindex
            ),
            None => log::error!(
                "owner {:016x} (IPv{}) has an -i condition whose interface name is not kept (an entry of an older build, or {} removed): it admits no new flow until that container's next ADD",
                key.owner_id,
                if key.family == portmap_common::FAMILY_V6 {
                    6
                } else {
                    4
                },
                record_path(layout).display()
            ),
        }
        match map.insert(key, new, BPF_EXIST) {
            Ok(()) => {}
            Err(e) if is_errno(&e, libc::ENOENT) => {}
            Err(source) => {
                return Err(InterfaceConditionsError::Map {
                    operation: "update",
                    source,
                });
            }
        }
    }
    Ok(named)
}

/// The lock an ADD of an owner with conditions holds from resolving its
/// `-i` names to the end of its claim, which writes its entries (see the
/// module docs).
pub struct Held {
    _lock: fs::File,
    layout: PinLayout,
}

/// Takes the lock for an ADD (see [`Held`]).
pub fn hold(layout: &PinLayout) -> Result<Held, InterfaceConditionsError> {
    Ok(Held {
        _lock: lock_at(&lock_path(layout))?,
        layout: layout.clone(),
    })
}

impl Held {
    /// The index each of `names` (the `-i` names of `condition`, as the
    /// configuration spells it, for messages) has now, every one kept in
    /// the record from here on; the entries of a kept name whose index
    /// changed are rewritten first. Refuses a name whose id another kept
    /// name has.
    pub fn resolve(
        &self,
        condition: &str,
        names: &[&str],
    ) -> Result<BTreeMap<String, u32>, InterfaceConditionsError> {
        let path = record_path(&self.layout);
        let record = Record::read(&path)?;
        for name in names {
            if let Some(kept) = record.collision(name) {
                return Err(InterfaceConditionsError::IdCollision {
                    condition: condition.to_owned(),
                    name: (*name).to_owned(),
                    kept: kept.to_owned(),
                });
            }
        }
        let now = settle(&self.layout, &path, &record, names)?;
        Ok(names
            .iter()
            .map(|name| {
                let index = now.names.get(*name).copied().unwrap_or(0);
                ((*name).to_owned(), index)
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, index: u32, negate: bool) -> Conditions {
        Conditions {
            has_in_interface: 1,
            in_ifindex: index,
            in_interface_id: interface_id(name.as_bytes()),
            negated: if negate { negated::IN_INTERFACE } else { 0 },
            ..Conditions::default()
        }
    }

    fn now(pairs: &[(&str, u32)]) -> BTreeMap<u32, u32> {
        pairs
            .iter()
            .map(|(name, index)| (interface_id(name.as_bytes()), *index))
            .collect()
    }

    #[test]
    fn the_record_reads_what_it_writes_and_skips_what_it_cannot_read() {
        let record = Record {
            names: BTreeMap::from([("eth1".to_owned(), 7), ("bond0.100".to_owned(), 0)]),
        };
        assert_eq!(record.render(), "bond0.100 0\neth1 7\n");
        assert_eq!(Record::parse(&record.render()), record);
        assert_eq!(
            Record::parse("eth1 7\ngarbage\neth2 x\n\n"),
            Record {
                names: BTreeMap::from([("eth1".to_owned(), 7)])
            }
        );
    }

    #[test]
    fn a_kept_name_is_outdated_when_its_interface_has_another_index_or_none() {
        let record = Record {
            names: BTreeMap::from([("eth1".to_owned(), 7), ("eth2".to_owned(), 0)]),
        };
        let node = |pairs: &'static [(&'static str, u32)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map_or(0, |(_, index)| *index)
            }
        };
        assert!(!record.outdated(node(&[("eth1", 7)])), "as recorded");
        assert!(record.outdated(node(&[("eth1", 9)])), "eth1 re-created");
        assert!(record.outdated(node(&[])), "eth1 deleted");
        assert!(
            record.outdated(node(&[("eth1", 7), ("eth2", 8)])),
            "eth2 created after the ADD"
        );
        assert!(!Record::default().outdated(node(&[])), "nothing kept");
        let pending = Record {
            names: BTreeMap::from([("eth1".to_owned(), PENDING)]),
        };
        assert!(
            pending.outdated(node(&[("eth1", 7)])) && pending.outdated(node(&[])),
            "a rewrite killed half way is done again whatever the node has"
        );
    }

    #[test]
    fn a_rewrite_takes_the_index_of_the_entrys_own_name() {
        let now = now(&[("eth1", 9), ("eth2", 0)]);
        assert_eq!(
            rewritten(&entry("eth1", 7, true), &now),
            Some(entry("eth1", 9, true)),
            "re-created"
        );
        assert_eq!(
            rewritten(&entry("eth2", 5, false), &now),
            Some(entry("eth2", 0, false)),
            "deleted"
        );
        assert_eq!(rewritten(&entry("eth1", 9, true), &now), None, "up to date");
        let other = Conditions {
            source_len: 1,
            ..Conditions::default()
        };
        assert_eq!(rewritten(&other, &now), None, "no -i condition");
    }

    #[test]
    fn an_entry_whose_name_is_not_kept_admits_no_new_flow() {
        let now = now(&[("eth1", 9)]);
        for old in [
            // Written by a build before names were kept.
            Conditions {
                in_interface_id: 0,
                ..entry("eth0", 3, true)
            },
            entry("eth3", 4, false),
        ] {
            let new = rewritten(&old, &now).expect("rewritten");
            assert_eq!((new.in_ifindex, new.negated), (0, 0));
            for ifindex in [0, 3, 4, 9] {
                assert!(
                    !new.admits(6, &[0; 4], &[0; 4], ifindex),
                    "{old:?} admits nothing on {ifindex}"
                );
            }
            assert_eq!(rewritten(&new, &now), None, "once");
        }
    }

    #[test]
    fn a_name_with_a_kept_names_id_is_a_collision() {
        // Found by search: two names of one FNV-1a hash.
        let (a, b) = colliding_names();
        let record = Record {
            names: BTreeMap::from([(a.clone(), 3)]),
        };
        assert_eq!(record.collision(&b), Some(a.as_str()));
        assert_eq!(
            record.collision(&a),
            None,
            "a name is not its own collision"
        );
        assert_eq!(record.collision("eth9"), None);
    }

    /// Two interface names (up to 15 bytes) with one id.
    fn colliding_names() -> (String, String) {
        let mut seen = std::collections::HashMap::new();
        for n in 0u32.. {
            let name = format!("if{n:x}");
            if let Some(first) = seen.insert(interface_id(name.as_bytes()), name.clone()) {
                return (first, name);
            }
        }
        unreachable!("a 32-bit hash collides within 2^32 + 1 names")
    }
}
