//! The cgroup socket hooks: which cgroup they go to, and attaching them
//! there once per build, through pinned bpf links.
//!
//! Link pins are `{pinRoot}/v1/links/cg{hash}_{program}`, `hash` being the
//! FNV-1a of the cgroup's path: the same cgroup always maps to the same pins.

use std::{
    fs, io,
    path::{Path, PathBuf},
};

use aya::programs::{
    CgroupAttachMode, CgroupSockAddr, ProgramError,
    cgroup_sock_addr::CgroupSockAddrAttachType,
    links::{FdLink, PinnedLink},
};
use portmap_common::local::program_names;

use crate::{dataplane::hash::fnv1a64, dataplane::pin::PinLayout};

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
    fs::create_dir_all(PRIVATE_MOUNT).map_err(CgroupError::Mount)?;
    crate::dataplane::bpffs::mount_fs("cgroup2", Path::new(PRIVATE_MOUNT))
        .map_err(CgroupError::Mount)?;
    Ok(PathBuf::from(PRIVATE_MOUNT))
}

pub fn link_pin(layout: &PinLayout, cgroup: &Path, program: &str) -> PathBuf {
    let hash = fnv1a64(cgroup.as_os_str().as_encoded_bytes());
    layout.links_dir().join(format!("cg{hash:016x}_{program}"))
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
    let pin = link_pin(layout, cgroup, program);
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
    fn every_socket_program_has_an_attach_type_and_a_dot_free_pin() {
        let layout = PinLayout::new("/sys/fs/bpf/x");
        for program in program_names::ALL {
            assert!(attach_type(program).is_some(), "{program}");
            let pin = link_pin(&layout, Path::new("/sys/fs/cgroup/a.b"), program);
            assert!(!pin.file_name().unwrap().to_string_lossy().contains('.'));
        }
    }
}
