//! Pin roots whose node is gone, and taking them off the machine.
//!
//! A node's network namespace can go away with its state in place (a kind
//! node deleted, a test bed torn down, a lab VM's namespace removed): its
//! pins stay on the shared bpffs, and its socket hooks stay attached to the
//! shared cgroup, where every `connect()` and `sendmsg()` of the machine
//! runs them, until someone removes them. Nobody would: the pins are named
//! by a cookie, and the namespace that could run `uninstall` is gone.
//!
//! How a node is known to be gone: every install attaches the `beacon`
//! program (a socket-lookup program that passes every lookup) to the node's
//! network namespace through a bpf link pinned at
//! `{pinRoot}/v1/links/netns_beacon`. The kernel detaches a network
//! namespace's links when the namespace is destroyed, and the link's info
//! then names no namespace (inode 0). That is exact: a live namespace's
//! link always names it, and a namespace never comes back. A root without
//! the beacon (made by a build before it, or whose beacon could not be
//! attached) is never judged gone.
//!
//! Which roots are looked at: the shared default root and the
//! per-namespace roots under it (`{root}/netns/{cookie}`), and every root
//! registered in `/run/ebpf-portmap/{id}.root` (each install registers
//! its root there, so explicit `pinRoot`s on one machine find each other).
//! Looking costs two directory reads and, per other root, three syscalls
//! (open the pin, read the link's info, close): nothing that grows with
//! the pods of a node.
//!
//! Records of a root that is gone without `uninstall` (`rm -r`, or its
//! namespace deleted with it): every root names itself in
//! `/run/ebpf-portmap/{id}.root` (written by its lock's holders), so the
//! files beside it (`.hooks`, `.lock`, `.status`, `.keys`, ...) whose root
//! no longer exists are found ([`orphan_records`]), listed by `status`
//! and removed by the same sweep, never those of a root that exists.
//!
//! Removing one: under that root's lock (skipped if someone holds it), all
//! its pins are unlinked (a link whose last reference goes is detached, so
//! the socket hooks leave the cgroup; the tc links and clsact filters died
//! with the namespace's interfaces), then its directories and its records
//! in `/run/ebpf-portmap`. No netlink call is made: interface indexes of a
//! dead namespace mean nothing in the caller's.

use std::{
    fs, io,
    os::fd::{AsFd, AsRawFd},
    path::{Path, PathBuf},
};

use aya::programs::{SkLookup, links::FdLink};
use portmap_common::program_names;

use crate::dataplane::pinned::{lock, pin::PinLayout};

/// File name of the beacon's link pin in `links/`.
pub const BEACON_LINK: &str = "netns_beacon";

/// Where the records of this machine's plugin runs live (beside the locks).
const RUN_DIR: &str = "/run/ebpf-portmap";

#[derive(Debug, thiserror::Error)]
pub enum BeaconError {
    #[error("cannot open this network namespace")]
    Netns(#[source] io::Error),
    #[error("cannot attach the namespace beacon {program}")]
    Attach {
        program: &'static str,
        #[source]
        source: Box<aya::programs::ProgramError>,
    },
    #[error("cannot pin the namespace beacon at {path}")]
    Pin {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// The beacon's link pin of `layout`.
pub fn beacon_pin(layout: &PinLayout) -> PathBuf {
    layout.links_dir().join(BEACON_LINK)
}

/// Attaches the beacon (pinned at `program_pin`) to the network namespace
/// this process runs in, pins its link (in place of an older build's, which
/// is released), and registers the root. Called under the root's lock, by
/// the run that installs or upgrades the dataplane.
pub fn attach_beacon(layout: &PinLayout, program_pin: &Path) -> Result<(), BeaconError> {
    let fail = |source: aya::programs::ProgramError| BeaconError::Attach {
        program: program_names::NETNS_BEACON,
        source: Box::new(source),
    };
    let netns = fs::File::open("/proc/thread-self/ns/net").map_err(BeaconError::Netns)?;
    let mut program = SkLookup::from_pin(program_pin).map_err(fail)?;
    let link_id = program.attach(netns.as_fd()).map_err(fail)?;
    let link = FdLink::from(program.take_link(link_id).map_err(fail)?);
    let pin = beacon_pin(layout);
    let _ = fs::remove_file(&pin);
    link.pin(&pin).map_err(|e| BeaconError::Pin {
        path: pin.clone(),
        source: io::Error::other(e.to_string()),
    })?;
    lock::register(layout);
    Ok(())
}

/// What the beacon says of a root's node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    /// Its network namespace exists (the inode number the link names).
    Alive(u32),
    /// Its network namespace is gone.
    Gone,
    /// No beacon (an older build's root, or none could be attached).
    Unknown,
}

/// The liveness of `layout`'s node, from its beacon.
pub fn liveness(layout: &PinLayout) -> Liveness {
    match beacon(layout) {
        Ok(info) if info.netns_inode == 0 => Liveness::Gone,
        Ok(info) => Liveness::Alive(info.netns_inode),
        Err(error) => {
            if error.kind() != io::ErrorKind::NotFound {
                log::debug!("reading the beacon of {}: {error}", layout.root().display());
            }
            Liveness::Unknown
        }
    }
}

/// What the beacon's link says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BeaconInfo {
    /// The program the link runs.
    pub program_id: u32,
    /// The inode of the network namespace it is attached to; 0 once that
    /// namespace is gone.
    pub netns_inode: u32,
}

/// Reads `layout`'s beacon link.
pub fn beacon(layout: &PinLayout) -> io::Result<BeaconInfo> {
    let link = super::tcx::open_pin(&beacon_pin(layout))?;
    netns_link_info(link.as_raw_fd())
}

/// The program and the network namespace inode of a netns link
/// (`BPF_LINK_TYPE_NETNS`): the inode is 0 once its namespace is gone
/// (`BPF_OBJ_GET_INFO_BY_FD`).
fn netns_link_info(link_fd: i32) -> io::Result<BeaconInfo> {
    /// `union bpf_attr` as `BPF_OBJ_GET_INFO_BY_FD` reads it.
    #[repr(C)]
    struct InfoByFd {
        bpf_fd: u32,
        info_len: u32,
        info: u64,
    }
    /// The head of `struct bpf_link_info` with its `netns` member: type,
    /// id, prog_id, then the union at offset 16.
    #[repr(C)]
    #[derive(Default)]
    struct NetnsLinkInfo {
        link_type: u32,
        id: u32,
        prog_id: u32,
        _pad: u32,
        netns_ino: u32,
        attach_type: u32,
    }
    const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
    const BPF_LINK_TYPE_NETNS: u32 = 5;
    let mut info = NetnsLinkInfo::default();
    let mut attr = InfoByFd {
        bpf_fd: link_fd as u32,
        info_len: std::mem::size_of::<NetnsLinkInfo>() as u32,
        info: (&raw mut info) as u64,
    };
    // SAFETY: a valid attr of the size passed; the kernel writes at most
    // `info_len` bytes into `info`, which outlives the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_OBJ_GET_INFO_BY_FD,
            &raw mut attr,
            std::mem::size_of::<InfoByFd>(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    if info.link_type != BPF_LINK_TYPE_NETNS {
        return Err(io::Error::other(format!(
            "link {} is of type {}, not a network namespace's",
            info.id, info.link_type
        )));
    }
    Ok(BeaconInfo {
        program_id: info.prog_id,
        netns_inode: info.netns_ino,
    })
}

/// Every other root this machine's runs can know of, besides `ours`: the
/// default root, the namespace roots under it, and the registered ones.
pub fn candidates(ours: &PinLayout) -> Vec<PinLayout> {
    let default = Path::new(crate::model::DEFAULT_PIN_ROOT);
    let mut roots = vec![default.to_path_buf()];
    if let Ok(entries) = fs::read_dir(default.join("netns")) {
        roots.extend(entries.flatten().map(|entry| entry.path()));
    }
    if let Ok(entries) = fs::read_dir(RUN_DIR) {
        for record in entries
            .flatten()
            .map(|entry| entry.path())
            .filter(|path| path.extension().is_some_and(|e| e == "root"))
        {
            let Ok(text) = fs::read_to_string(&record) else {
                continue;
            };
            let root = PathBuf::from(text.trim_end());
            // A root removed by hand (`rm -r`): its records are orphans,
            // which `orphan_records` finds by this record.
            if root.exists() {
                roots.push(root);
            }
        }
    }
    roots.sort();
    roots.dedup();
    roots
        .into_iter()
        .filter(|root| root != ours.root())
        .map(PinLayout::new)
        .collect()
}

/// The roots among [`candidates`] whose node is gone.
pub fn find(ours: &PinLayout) -> Vec<PinLayout> {
    candidates(ours)
        .into_iter()
        .filter(|layout| liveness(layout) == Liveness::Gone)
        .collect()
}

/// What removing a gone node's root did.
#[derive(Debug, Default)]
pub struct Removal {
    pub removed: Vec<PathBuf>,
    pub failures: Vec<String>,
}

/// Takes `layout` off the machine if its node is (still) gone; see the
/// module docs. `None` if its node is not gone (any more: another run
/// removed it while this one waited for its lock), or another process
/// holds its lock for over a second.
pub fn remove(layout: &PinLayout) -> Option<Removal> {
    let lock_path = layout.lock_file();
    let lock = match fs::OpenOptions::new().write(true).open(&lock_path) {
        Ok(file) => Some(file),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(_) => return None,
    };
    // The holder of a gone node's lock is another run removing it (done in
    // milliseconds), and a plugin run must not hang on someone else's state.
    if let Some(file) = &lock
        && lock::flock_within(file, &lock_path, std::time::Duration::from_secs(1)).is_err()
    {
        return None;
    }
    // Judged again under the lock: never remove what a live node uses.
    if liveness(layout) != Liveness::Gone {
        return None;
    }
    let mut removal = Removal::default();
    remove_tree(&layout.versioned(), &mut removal);
    // The root itself only once nothing else lives there (the default
    // root holds other namespaces' roots under `netns/`).
    crate::dataplane::pinned::bpffs::remove_root_if_empty(layout.root(), &mut |dir| {
        remove_entry(dir, true, &mut removal);
    });
    // Every record of the root (hooks, interfaces, addresses, probe, key
    // notes, agent, writers, its name), the lock last.
    for record in records_of(layout) {
        if record != lock_path {
            remove_entry(&record, false, &mut removal);
        }
    }
    remove_entry(&lock_path, false, &mut removal);
    drop(lock);
    Some(removal)
}

/// Every record of `layout` in the run directory: the files named
/// `{hash}.*` beside its lock (the lock itself included, and a temporary
/// file a killed writer left).
pub fn records_of(layout: &PinLayout) -> Vec<PathBuf> {
    let lock = layout.lock_file();
    let Some(stem) = lock.file_stem() else {
        return Vec::new();
    };
    let mut records: Vec<PathBuf> = fs::read_dir(RUN_DIR)
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| path.file_stem() == Some(stem))
        .collect();
    records.sort();
    records
}

/// The records of a pin root that no longer exists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrphanRecords {
    /// The root its `.root` record names.
    pub root: PathBuf,
    /// Every record of that root, its name included.
    pub records: Vec<PathBuf>,
}

/// The record sets in the run directory whose pin root is gone: removed
/// without `uninstall` (`rm -r`, or its node's namespace deleted and the
/// root with it), so nothing would ever remove them. Judged only where the
/// root's bpffs is visible (the nearest existing directory of the root is
/// on a bpffs): a run that cannot see the node's bpffs (a private mount
/// namespace) sees no root and must not take the live ones' records for
/// orphans. A set that names no root (a build before roots were named)
/// is never judged.
pub fn orphan_records() -> Vec<OrphanRecords> {
    let Ok(entries) = fs::read_dir(RUN_DIR) else {
        return Vec::new();
    };
    let mut roots = std::collections::BTreeSet::new();
    // Named by the `.root` record, or by the lock file's text (which an
    // older build's sweep, removing `.root` records, leaves).
    for record in entries
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|e| e == "root" || e == "lock"))
    {
        let Ok(text) = fs::read_to_string(&record) else {
            continue;
        };
        let root = PathBuf::from(text.trim_end());
        let layout = PinLayout::new(&root);
        // The record must name the root it is filed under.
        if !root.is_absolute() || layout.lock_file().file_stem() != record.file_stem() {
            continue;
        }
        if root.exists() || crate::dataplane::pinned::bpffs::check_bpffs(&root).is_err() {
            continue;
        }
        roots.insert(root);
    }
    roots
        .into_iter()
        .map(|root| OrphanRecords {
            records: records_of(&PinLayout::new(&root)),
            root,
        })
        .collect()
}

/// Removes the records of `orphan`, under its lock and its writers' lock
/// (taken at once or not at all: a holder is a run about to make the root
/// again), once its root is still gone under them. `None` when skipped.
pub fn remove_orphan(orphan: &OrphanRecords) -> Option<Removal> {
    let layout = PinLayout::new(&orphan.root);
    let mut held = Vec::new();
    for path in [layout.lock_file(), lock::writers_lock_file(&layout)] {
        match fs::OpenOptions::new().write(true).open(&path) {
            Ok(file) => {
                // SAFETY: flock on an fd we own; released when it closes.
                if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
                    return None;
                }
                held.push(file);
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(_) => return None,
        }
    }
    if orphan.root.exists() {
        return None;
    }
    let mut removal = Removal::default();
    let lock = layout.lock_file();
    for record in records_of(&layout) {
        if record != lock {
            remove_entry(&record, false, &mut removal);
        }
    }
    remove_entry(&lock, false, &mut removal);
    drop(held);
    Some(removal)
}

/// Removes every orphan record set but `ours`' (see [`orphan_records`]),
/// logging each; returns the roots whose records went.
pub fn sweep_orphans(ours: &PinLayout) -> Vec<PathBuf> {
    let mut swept = Vec::new();
    for orphan in orphan_records() {
        if orphan.root == ours.root() {
            continue;
        }
        let Some(removal) = remove_orphan(&orphan) else {
            continue;
        };
        for failure in &removal.failures {
            log::warn!("removing the records of a removed pin root: {failure}");
        }
        log::info!(
            "removed the records of pin root {}, which no longer exists ({} records in {RUN_DIR})",
            orphan.root.display(),
            removal.removed.len()
        );
        swept.push(orphan.root);
    }
    swept
}

/// Unlinks every pin under `dir`, depth first, then the directories.
fn remove_tree(dir: &Path, removal: &mut Removal) {
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.flatten() {
            let path = entry.path();
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                remove_tree(&path, removal);
            } else {
                remove_entry(&path, false, removal);
            }
        }
    }
    remove_entry(dir, true, removal);
}

fn remove_entry(path: &Path, dir: bool, removal: &mut Removal) {
    let outcome = if dir {
        fs::remove_dir(path)
    } else {
        fs::remove_file(path)
    };
    match outcome {
        Ok(()) => removal.removed.push(path.to_path_buf()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => removal
            .failures
            .push(format!("removing {}: {e}", path.display())),
    }
}

/// Finds the roots of gone nodes and removes them, logging each (what a
/// plugin run and the agent's pass do, best effort). Returns the roots
/// removed.
pub fn sweep(ours: &PinLayout) -> Vec<PathBuf> {
    let mut swept = Vec::new();
    for layout in find(ours) {
        let Some(removal) = remove(&layout) else {
            continue;
        };
        for failure in &removal.failures {
            log::warn!("removing the state of a gone node: {failure}");
        }
        log::info!(
            "removed the state of a node whose network namespace is gone: {} ({} pins and records; its socket hooks are detached)",
            layout.root().display(),
            removal.removed.len()
        );
        swept.push(layout.root().to_path_buf());
    }
    swept.extend(sweep_orphans(ours));
    swept
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_beacon_pin_has_no_dot_and_is_no_tc_attachment() {
        let layout = PinLayout::new("/sys/fs/bpf/x");
        let pin = beacon_pin(&layout);
        assert_eq!(pin, Path::new("/sys/fs/bpf/x/v1/links/netns_beacon"));
        assert!(crate::dataplane::pinned::pin::parse_link_name(BEACON_LINK).is_none());
    }

    #[test]
    fn the_root_record_sits_beside_the_lock() {
        let layout = PinLayout::new("/sys/fs/bpf/x");
        assert_eq!(
            lock::root_record(&layout),
            layout.lock_file().with_extension("root")
        );
    }

    #[test]
    fn our_own_root_is_never_a_candidate() {
        let ours = PinLayout::new(crate::model::DEFAULT_PIN_ROOT);
        assert!(
            candidates(&ours)
                .iter()
                .all(|layout| layout.root() != ours.root())
        );
    }
}
