//! The cgroup socket hooks: which cgroup they go to, and attaching them
//! there once per build, through pinned bpf links.
//!
//! Link pins are `{pinRoot}/v1/links/cg{hash}_{program}`, `hash` being the
//! FNV-1a of the cgroup's path: the same cgroup always maps to the same pins.

use std::{
    ffi::OsString,
    fs, io,
    path::{Path, PathBuf},
};

use aya::programs::{
    CgroupAttachMode, CgroupSockAddr, ProgramError,
    cgroup_sock_addr::CgroupSockAddrAttachType,
    links::{FdLink, PinnedLink},
};
use portmap_common::local::program_names;

use crate::{dataplane::pinned::hash::fnv1a64, dataplane::pinned::pin::PinLayout};

/// Where the plugin mounts cgroup2 on a node that has none (cgroup v1 only).
pub const PRIVATE_MOUNT: &str = "/run/ebpf-portmap/cgroup2";

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("cannot open cgroup {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot mount cgroup2 at {PRIVATE_MOUNT}")]
    Mount(#[source] io::Error),
    #[error("cannot attach {program} to cgroup {path}")]
    Attach {
        program: &'static str,
        path: PathBuf,
        #[source]
        source: Box<ProgramError>,
    },
    #[error("cannot pin {path}")]
    Pin {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// The kernel's attach point of each socket program.
pub fn attach_type(program: &str) -> Option<CgroupSockAddrAttachType> {
    use CgroupSockAddrAttachType as T;
    Some(match program {
        program_names::CONNECT4 => T::Connect4,
        program_names::CONNECT6 => T::Connect6,
        program_names::SENDMSG4 => T::UDPSendMsg4,
        program_names::SENDMSG6 => T::UDPSendMsg6,
        program_names::RECVMSG4 => T::UDPRecvMsg4,
        program_names::RECVMSG6 => T::UDPRecvMsg6,
        program_names::GETPEERNAME4 => T::GetPeerName4,
        program_names::GETPEERNAME6 => T::GetPeerName6,
        _ => return None,
    })
}

/// The first cgroup2 mount in `mounts` (the text of /proc/self/mounts).
pub fn cgroup2_mount_in(mounts: &str) -> Option<PathBuf> {
    mounts.lines().find_map(|line| {
        let mut fields = line.split_whitespace();
        let (_, path, fstype) = (fields.next()?, fields.next()?, fields.next()?);
        (fstype == "cgroup2").then(|| PathBuf::from(path))
    })
}

/// The cgroup the hooks go to: `configured`, or the root of the node's
/// cgroup2 hierarchy, mounted under our run directory if the node has
/// cgroup v1 only.
pub fn target(configured: Option<&Path>) -> Result<PathBuf, CgroupError> {
    if let Some(path) = configured {
        return Ok(path.to_path_buf());
    }
    let mounts = fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    if let Some(path) = cgroup2_mount_in(&mounts) {
        return Ok(path);
    }
    // Private like the rest of the run directory: a parent made here with
    // the runtime's umask (002, say) would be refused by every later run.
    crate::dataplane::pinned::bpffs::create_private_dir(Path::new(PRIVATE_MOUNT))
        .map_err(|error| CgroupError::Mount(io::Error::other(error)))?;
    crate::dataplane::pinned::bpffs::mount_fs("cgroup2", Path::new(PRIVATE_MOUNT))
        .map_err(CgroupError::Mount)?;
    Ok(PathBuf::from(PRIVATE_MOUNT))
}

pub fn link_pin(layout: &PinLayout, cgroup: &Path, program: &str) -> PathBuf {
    let hash = fnv1a64(cgroup.as_os_str().as_encoded_bytes());
    layout.links_dir().join(format!("cg{hash:016x}_{program}"))
}

/// Where a run records the hooks' link pins it found attached with this
/// build's programs (see [`hooks_recorded`]). Beside the lock, outside
/// bpffs, which holds no files.
pub fn hooks_record(layout: &PinLayout) -> PathBuf {
    layout.lock_file().with_extension("hooks")
}

/// The link pins of `cgroup`'s hooks, each with its inode number, found
/// in `listed` (the links directory's entries and inodes, as one read gave
/// them); `None` if one of them is missing.
pub fn hook_pins(
    layout: &PinLayout,
    cgroup: &Path,
    listed: &[(OsString, u64)],
) -> Option<Vec<(String, u64)>> {
    program_names::ALL
        .iter()
        .map(|program| {
            let pin = link_pin(layout, cgroup, program);
            let name = pin.file_name()?;
            let (_, inode) = listed.iter().find(|(listed, _)| listed == name)?;
            Some((name.to_string_lossy().into_owned(), *inode))
        })
        .collect()
}

fn hooks_record_text(build: u64, cgroup: &Path, pins: &[(String, u64)]) -> String {
    let mut text = format!("build {build:016x}\ncgroup {}\n", cgroup.display());
    for (name, inode) in pins {
        text.push_str(&format!("{inode} {name}\n"));
    }
    text
}

/// Whether a run of build `build` found exactly these pins attached with
/// its programs: the same names with the same inodes. A link pinned again
/// since (by another build, or by hand) is a new inode: bpffs numbers its
/// inodes from the kernel's global counter. So every run but the first
/// knows the hooks are in place from the links directory it lists anyway,
/// without opening the eight links and the eight programs (ADD and DEL
/// took about 10% less time without those 48 syscalls).
pub fn hooks_recorded(
    layout: &PinLayout,
    cgroup: &Path,
    build: u64,
    pins: &[(String, u64)],
) -> bool {
    fs::read_to_string(hooks_record(layout))
        .is_ok_and(|text| text == hooks_record_text(build, cgroup, pins))
}

/// Records that `pins` were found attached with build `build`'s programs.
/// `pins` must have been listed before the links were checked: a link
/// pinned again between the two then differs from the record, which costs
/// the next run a full check, never a wrong answer. Best effort, atomic (a
/// whole file renamed over the old one).
pub fn record_hooks(layout: &PinLayout, cgroup: &Path, build: u64, pins: &[(String, u64)]) {
    let _ = crate::dataplane::pinned::lock::write_record(
        &hooks_record(layout),
        &hooks_record_text(build, cgroup, pins),
    );
}

/// Whether `program` (ID `want`) is attached to `cgroup` through our link.
pub fn attached(layout: &PinLayout, cgroup: &Path, program: &str, want: u32) -> bool {
    PinnedLink::from_pin(link_pin(layout, cgroup, program))
        .ok()
        .map(FdLink::from)
        .and_then(|link| link.info().ok())
        .is_some_and(|info| info.program_id() == want)
}

/// Attaches `program` (pinned at `program_pin`) to `cgroup`, replacing the
/// link of an older build if there is one.
pub fn attach(
    layout: &PinLayout,
    cgroup: &Path,
    program: &'static str,
    program_pin: &Path,
) -> Result<(), CgroupError> {
    let fail = |source: ProgramError| CgroupError::Attach {
        program,
        path: cgroup.to_path_buf(),
        source: Box::new(source),
    };
    let kind = attach_type(program).ok_or_else(|| fail(ProgramError::NotLoaded))?;
    // Our link is there, running another program (an older build's, or
    // this build's before a resize): the program is swapped inside it,
    // atomically, so no connect() goes untranslated, nor translated twice,
    // whenever this run is killed.
    let pin = link_pin(layout, cgroup, program);
    if pin.exists() {
        match crate::dataplane::attach::tcx::update_pinned(&pin, program_pin) {
            Ok(()) => {
                crate::dataplane::attach::crash::point("hook-updated");
                return Ok(());
            }
            Err(error) => log::debug!("{}: link not updated ({error})", pin.display()),
        }
    }
    let mut hook = CgroupSockAddr::from_pin(program_pin, kind).map_err(fail)?;
    let file = fs::File::open(cgroup).map_err(|source| CgroupError::Open {
        path: cgroup.to_path_buf(),
        source,
    })?;
    // A bpf link (what aya creates on 5.7+) always shares the cgroup with
    // other programs, ours of an older build included; the kernel refuses
    // any flag on link creation, so the mode must be the zero one.
    let link_id = hook.attach(&file, CgroupAttachMode::Single).map_err(fail)?;
    let link = hook.take_link(link_id).map_err(fail)?;
    let link = FdLink::try_from(link)
        .map_err(|e| fail(ProgramError::IOError(io::Error::other(e.to_string()))))?;
    // The old link goes when its pin does (nothing else holds it).
    let _ = fs::remove_file(&pin);
    link.pin(&pin).map_err(|e| CgroupError::Pin {
        path: pin.clone(),
        source: io::Error::other(e.to_string()),
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_cgroup2_mount_of_a_hybrid_host() {
        let mounts = "sysfs /sys sysfs rw 0 0\n\
                      tmpfs /sys/fs/cgroup tmpfs ro 0 0\n\
                      cgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n\
                      cgroup /sys/fs/cgroup/cpu cgroup rw,cpu 0 0\n";
        assert_eq!(
            cgroup2_mount_in(mounts),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        assert_eq!(
            cgroup2_mount_in("cgroup /sys/fs/cgroup/cpu cgroup rw 0 0\n"),
            None
        );
    }

    #[test]
    fn the_hooks_record_names_the_build_the_cgroup_and_each_pins_inode() {
        let pins = vec![("cg1_a".to_owned(), 10), ("cg1_b".to_owned(), 11)];
        let text = hooks_record_text(7, Path::new("/sys/fs/cgroup"), &pins);
        assert_eq!(
            text,
            "build 0000000000000007\ncgroup /sys/fs/cgroup\n10 cg1_a\n11 cg1_b\n"
        );
        let swapped = vec![("cg1_a".to_owned(), 11), ("cg1_b".to_owned(), 10)];
        assert_ne!(
            text,
            hooks_record_text(7, Path::new("/sys/fs/cgroup"), &swapped)
        );
        assert_ne!(
            text,
            hooks_record_text(8, Path::new("/sys/fs/cgroup"), &pins)
        );
        assert_ne!(
            text,
            hooks_record_text(7, Path::new("/sys/fs/cgroup/x"), &pins)
        );
    }

    #[test]
    fn every_socket_program_has_an_attach_type_and_a_dot_free_pin() {
        let layout = PinLayout::new("/sys/fs/bpf/x");
        for program in program_names::ALL {
            assert!(attach_type(program).is_some(), "{program}");
            let pin = link_pin(&layout, Path::new("/sys/fs/cgroup/a.b"), program);
            assert!(!pin.file_name().unwrap().to_string_lossy().contains('.'));
        }
    }
}
