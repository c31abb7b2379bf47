//! The tc hooks: whether this build's program runs on an interface's
//! hook, putting it there (a tcx link, or a clsact filter on kernels
//! without tcx) and taking it off, and which interfaces carry pins of ours.

use std::{
    collections::BTreeSet,
    ffi::OsString,
    fs, io,
    path::{Path, PathBuf},
};

use aya::programs::{
    LinkOrder, ProgramError, SchedClassifier, TcAttachType,
    links::{FdLink, PinnedLink},
    tc::{self, NlOptions, SchedClassifierLink, TcAttachOptions, TcHandle},
};
use portmap_common::program_names;

use crate::{
    dataplane::attach::error::AttachError,
    dataplane::load::features::{self, AttachMode},
    dataplane::load::object::build_id,
    dataplane::pinned::pin::{Direction, PinLayout},
    node::netlink,
};

/// Priority and handle of our filters when attached through clsact
/// (kernels without tcx): fixed, so a new build replaces them in place.
const CLSACT_PRIORITY: u16 = 0xc0de;
const CLSACT_HANDLE: TcHandle = TcHandle::new(0, 0xbeef);

pub(super) fn program_name(direction: Direction) -> &'static str {
    match direction {
        Direction::Ingress => program_names::TC_INGRESS,
        Direction::Egress => program_names::TC_EGRESS,
    }
}

fn attach_type(direction: Direction) -> TcAttachType {
    match direction {
        Direction::Ingress => TcAttachType::Ingress,
        Direction::Egress => TcAttachType::Egress,
    }
}

/// The program pinned for this build, if it is.
pub(super) fn pinned_program(layout: &PinLayout, direction: Direction) -> Option<SchedClassifier> {
    SchedClassifier::from_pin(layout.program(build_id(), program_name(direction))).ok()
}

fn program_id(program: &SchedClassifier) -> Option<u32> {
    program.info().ok().map(|info| info.id())
}

/// Whether the current build's program (ID `want`) is attached to
/// `ifindex` in `direction`: the interface's tcx hook runs it (only our
/// pinned link puts it there), or it is our clsact filter.
pub(super) fn attached(layout: &PinLayout, ifindex: u32, direction: Direction, want: u32) -> bool {
    attached_at(
        &HookPins::of(layout, ifindex, direction),
        ifindex,
        direction,
        want,
    )
}

/// [`attached`] for the hook whose pins are `pins`.
pub(super) fn attached_at(pins: &HookPins, ifindex: u32, direction: Direction, want: u32) -> bool {
    // The hook is asked, not the link: both questions take the RTNL, which
    // namespace and interface churn elsewhere on the node can hold for
    // milliseconds.
    if pins.tcx.exists() {
        return tcx_program_ids(ifindex, direction).is_ok_and(|ids| ids.contains(&want));
    }
    // clsact: the marker is the program we attached; it must be this build's.
    pinned_id(&pins.clsact) == Some(want) && netlink::interface_name(ifindex).is_some()
}

/// Where one tc attachment of ours is pinned: the tcx link, or under
/// clsact the marker (the program the filter runs).
pub(super) struct HookPins {
    pub(super) tcx: PathBuf,
    pub(super) clsact: PathBuf,
}

impl HookPins {
    /// An interface's own attachment (an uplink, the bridge, a routed
    /// pod's veth).
    fn of(layout: &PinLayout, ifindex: u32, direction: Direction) -> HookPins {
        HookPins {
            tcx: layout.tcx_link(ifindex, direction),
            clsact: layout.clsact_marker(ifindex, direction),
        }
    }

    /// The ingress attachment of a bridge port (see
    /// [`Targets::bridge_ports`](super::Targets::bridge_ports)).
    pub(super) fn port(layout: &PinLayout, ifindex: u32) -> HookPins {
        HookPins {
            tcx: layout.port_link(ifindex),
            clsact: layout.port_clsact_marker(ifindex),
        }
    }
}

/// IDs of the programs on the tcx hook of `ifindex` in `direction`, in this
/// network namespace: one `BPF_PROG_QUERY` by interface index. (aya's
/// `query_tcx` wants the interface's name and opens every program it
/// finds: two name lookups and three syscalls per program, on every ADD,
/// and opening a program by ID needs CAP_SYS_ADMIN, which the node agent
/// does without.)
pub fn tcx_program_ids(ifindex: u32, direction: Direction) -> io::Result<Vec<u32>> {
    /// `union bpf_attr` as `BPF_PROG_QUERY` reads it (include/uapi/linux/bpf.h).
    #[repr(C)]
    struct ProgQuery {
        target_ifindex: u32,
        attach_type: u32,
        query_flags: u32,
        attach_flags: u32,
        prog_ids: u64,
        prog_cnt: u32,
        _pad: u32,
        prog_attach_flags: u64,
        link_ids: u64,
        link_attach_flags: u64,
        revision: u64,
    }
    const BPF_PROG_QUERY: libc::c_long = 16;
    const BPF_TCX_INGRESS: u32 = 46;
    const BPF_TCX_EGRESS: u32 = 47;
    // Far more than anyone attaches to one hook; ENOSPC says otherwise.
    let mut ids = [0u32; 64];
    let mut attr = ProgQuery {
        target_ifindex: ifindex,
        attach_type: match direction {
            Direction::Ingress => BPF_TCX_INGRESS,
            Direction::Egress => BPF_TCX_EGRESS,
        },
        query_flags: 0,
        attach_flags: 0,
        prog_ids: ids.as_mut_ptr() as u64,
        prog_cnt: ids.len() as u32,
        _pad: 0,
        prog_attach_flags: 0,
        link_ids: 0,
        link_attach_flags: 0,
        revision: 0,
    };
    // SAFETY: a valid, fully initialised attr of the size passed; the
    // kernel writes at most `prog_cnt` IDs into `ids`, which outlives the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_QUERY,
            &raw mut attr,
            std::mem::size_of::<ProgQuery>(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let count = (attr.prog_cnt as usize).min(ids.len());
    Ok(ids[..count].to_vec())
}

/// ID of the program pinned at `path`, whatever its type.
pub(super) fn pinned_id(path: &Path) -> Option<u32> {
    aya::programs::ProgramInfo::from_pin(path)
        .ok()
        .map(|info| info.id())
}

/// Unpins the attachments of interfaces that no longer exist (the host end
/// of a removed container's veth, an uplink re-created under a new index):
/// their links are defunct. `live` is every interface index the node had
/// at this run's link dump; an index missing there is asked about again,
/// since a run with a newer dump may have attached an interface made since.
pub(super) fn forget_interfaces_not_in(layout: &PinLayout, live: &BTreeSet<u32>) {
    for (ifindex, direction) in recorded_attachments(layout) {
        if is_gone(live, ifindex) {
            let _ = fs::remove_file(layout.tcx_link(ifindex, direction));
            let _ = fs::remove_file(layout.clsact_marker(ifindex, direction));
        }
    }
}

/// Takes the programs off `ifindex`, a port of a bridge or a bond (see
/// [`LinkPins::interfaces`](super::LinkPins::interfaces)): a tcx link goes
/// with its pin, a clsact filter is deleted. A failure is logged; the next
/// run tries again.
pub(super) fn detach_port(layout: &PinLayout, ifindex: u32) {
    for direction in Direction::BOTH {
        let marker = layout.clsact_marker(ifindex, direction);
        if marker.exists() {
            let detached = match netlink::interface_name(ifindex) {
                Some(interface) => detach_clsact(&interface, direction),
                // Gone with its filters since the run's dump.
                None => Ok(()),
            };
            match detached {
                Ok(()) => {
                    let _ = fs::remove_file(&marker);
                }
                Err(error) => {
                    log::warn!("taking the programs off interface {ifindex}, a port: {error}");
                }
            }
        }
        // The pin holds the link's last reference: removing it detaches.
        let _ = fs::remove_file(layout.tcx_link(ifindex, direction));
    }
    log::info!("interface {ifindex} is a port of a bridge or bond now: its programs are off");
}

/// Whether interface `ifindex` is gone: not among `live` (what the run's
/// dump saw) nor known to the kernel now (the dump may have left it out,
/// or a newer run attached an interface made since).
pub(super) fn is_gone(live: &BTreeSet<u32>, ifindex: u32) -> bool {
    !live.contains(&ifindex) && netlink::interface_name(ifindex).is_none()
}

/// Every pin under links/ with its inode number, from one read of the
/// directory: the tc attachments and the socket hooks' links are both
/// judged by it.
pub(super) fn listed_links(layout: &PinLayout) -> Vec<(OsString, u64)> {
    use std::os::unix::fs::DirEntryExt;
    let Ok(entries) = fs::read_dir(layout.links_dir()) else {
        return Vec::new();
    };
    entries
        .flatten()
        .map(|entry| (entry.file_name(), entry.ino()))
        .collect()
}

/// (ifindex, direction) of every tc attachment among `listed`.
pub(super) fn tc_attachments(listed: &[(OsString, u64)]) -> Vec<(u32, Direction)> {
    listed
        .iter()
        .filter_map(|(name, _)| {
            crate::dataplane::pinned::pin::parse_link_name(&name.to_string_lossy())
        })
        .map(|(ifindex, direction, _)| (ifindex, direction))
        .collect()
}

/// (ifindex, direction) of every tc attachment recorded under links/.
pub(super) fn recorded_attachments(layout: &PinLayout) -> Vec<(u32, Direction)> {
    tc_attachments(&listed_links(layout))
}

pub(super) fn attach_one(
    layout: &PinLayout,
    ifindex: u32,
    direction: Direction,
    mode: AttachMode,
) -> Result<(), AttachError> {
    attach_at(
        layout,
        &HookPins::of(layout, ifindex, direction),
        ifindex,
        direction,
        mode,
    )
}

/// [`attach_one`] for the hook whose pins are `pins`.
pub(super) fn attach_at(
    layout: &PinLayout,
    pins: &HookPins,
    ifindex: u32,
    direction: Direction,
    mode: AttachMode,
) -> Result<(), AttachError> {
    let name = program_name(direction);
    let mut program = pinned_program(layout, direction).ok_or(AttachError::Program {
        program: name,
        source: Box::new(ProgramError::NotLoaded),
    })?;
    let Some(id) = program_id(&program) else {
        return Err(AttachError::Program {
            program: name,
            source: Box::new(ProgramError::NotLoaded),
        });
    };
    if attached_at(pins, ifindex, direction, id) {
        return Ok(());
    }
    let interface =
        netlink::interface_name(ifindex).ok_or(AttachError::NoInterface { index: ifindex })?;
    let attach_error = |source| AttachError::Attach {
        program: name,
        interface: interface.clone(),
        direction: direction.as_str(),
        source: Box::new(source),
    };
    if mode == AttachMode::Clsact {
        features::ensure_clsact(&interface)?;
        return attach_clsact(&pins.clsact, &mut program, &interface, direction)
            .map_err(attach_error);
    }
    let link_path = pins.tcx.clone();

    // An existing link of ours that still sits on this interface: swap the
    // program inside it, atomically.
    if let Ok(pinned) = PinnedLink::from_pin(&link_path) {
        let link = FdLink::from(pinned);
        let alive = link.info().is_ok_and(|info| {
            SchedClassifier::query_tcx(&interface, attach_type(direction))
                .is_ok_and(|(_, programs)| programs.iter().any(|p| p.id() == info.program_id()))
        });
        if alive {
            let link = SchedClassifierLink::try_from(link).map_err(|e| {
                attach_error(ProgramError::IOError(io::Error::other(e.to_string())))
            })?;
            let link_id = program.attach_to_link(link).map_err(attach_error)?;
            // The pin keeps the link; dropping our handle only closes an fd.
            let _ = program.take_link(link_id).map_err(attach_error)?;
            return Ok(());
        }
        // A link left from an interface that is gone (its index reused).
        let _ = fs::remove_file(&link_path);
    }

    match program.attach_with_options(
        &interface,
        attach_type(direction),
        TcAttachOptions::TcxOrder(LinkOrder::default()),
    ) {
        Ok(link_id) => {
            let link = program.take_link(link_id).map_err(attach_error)?;
            let link = FdLink::try_from(link).map_err(|e| AttachError::Pin {
                path: link_path.clone(),
                source: io::Error::other(e.to_string()),
            })?;
            link.pin(&link_path).map_err(|e| AttachError::Pin {
                path: link_path.clone(),
                source: io::Error::other(e.to_string()),
            })?;
            Ok(())
        }
        Err(error) => Err(attach_error(error)),
    }
}

fn attach_clsact(
    marker: &Path,
    program: &mut SchedClassifier,
    interface: &str,
    direction: Direction,
) -> Result<(), ProgramError> {
    // EEXIST: the qdisc is there already.
    if let Err(error) = tc::qdisc_add_clsact(interface) {
        log::debug!("clsact qdisc on {interface}: {error}");
    }
    let options = NlOptions {
        priority: CLSACT_PRIORITY,
        handle: CLSACT_HANDLE,
        classid: None,
    };
    let link_id = match SchedClassifierLink::attached(
        interface,
        attach_type(direction),
        CLSACT_PRIORITY,
        CLSACT_HANDLE,
        None,
    ) {
        // Replace our filter if it is there, else create it.
        Ok(existing) => program.attach_to_link(existing).or_else(|_| {
            program.attach_with_options(
                interface,
                attach_type(direction),
                TcAttachOptions::Netlink(options),
            )
        })?,
        Err(_) => program.attach_with_options(
            interface,
            attach_type(direction),
            TcAttachOptions::Netlink(options),
        )?,
    };
    // The filter holds the program; our handle must not detach it on drop.
    let link = program.take_link(link_id)?;
    std::mem::forget(link);
    let _ = fs::remove_file(marker);
    program
        .pin(marker)
        .map_err(|e| ProgramError::IOError(io::Error::other(e.to_string())))?;
    Ok(())
}

/// Whether this build's programs are attached to `ifindex`, both directions.
pub fn is_attached(layout: &PinLayout, ifindex: u32) -> bool {
    Direction::BOTH.iter().all(|&direction| {
        pinned_id(&layout.program(build_id(), program_name(direction)))
            .is_some_and(|id| attached(layout, ifindex, direction, id))
    })
}

/// Which mode the attachments of `layout` use, if any exist.
pub fn attach_mode(layout: &PinLayout) -> Option<AttachMode> {
    if let Some(mode) = features::recorded_attach_mode(layout) {
        return Some(mode);
    }
    let entries = fs::read_dir(layout.links_dir()).ok()?;
    let mut mode = None;
    for entry in entries.flatten() {
        if let Some((_, _, clsact)) =
            crate::dataplane::pinned::pin::parse_link_name(&entry.file_name().to_string_lossy())
        {
            mode = Some(if clsact {
                AttachMode::Clsact
            } else {
                AttachMode::Tcx
            });
        }
    }
    mode
}

/// Removes our clsact filter from `interface` (`uninstall`); the clsact
/// qdisc stays, other filters may use it.
pub fn detach_clsact(interface: &str, direction: Direction) -> Result<(), ProgramError> {
    use aya::programs::links::Link as _;
    let link = SchedClassifierLink::attached(
        interface,
        attach_type(direction),
        CLSACT_PRIORITY,
        CLSACT_HANDLE,
        None,
    )
    .map_err(ProgramError::IOError)?;
    link.detach()
}
