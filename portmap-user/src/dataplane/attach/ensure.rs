//! Loading, pinning and attaching the eBPF programs.
//!
//! The first ADD on a node loads the object, pins maps and programs and
//! attaches the tc programs; later ADDs find everything in place with a few
//! read-only syscalls and never take the lock. Loads and attachments are
//! serialised by an `flock` per pin root (released by the kernel if the
//! holder dies), so any number of concurrent first ADDs end with exactly one
//! set of programs. A newer build of the plugin replaces the programs inside
//! the existing tcx links (`BPF_LINK_UPDATE`), atomically: traffic and the
//! pinned maps (conntrack included) carry on untouched.

use std::{
    collections::BTreeSet,
    ffi::OsString,
    fs, io,
    path::{Path, PathBuf},
};

use aya::{
    Ebpf, EbpfError, EbpfLoader,
    programs::{
        LinkOrder, ProgramError, SchedClassifier, TcAttachType,
        links::{FdLink, PinnedLink},
        tc::{self, NlOptions, SchedClassifierLink, TcAttachOptions, TcHandle},
    },
};
use portmap_common::{local, map_names, program_names};

use crate::{
    dataplane::attach::cgroup,
    dataplane::attach::crash,
    dataplane::attach::pass::PassRecord,
    dataplane::attach::stale,
    dataplane::attach::tcx,
    dataplane::load::features::{self, AttachMode},
    dataplane::load::kfunc::Kfuncs,
    dataplane::load::object::build_id,
    dataplane::pinned::bpffs::{
        BpffsError, check_bpffs, create_private_dir, mount_bpffs_if_missing,
    },
    dataplane::pinned::lock::{LockError, lock},
    dataplane::pinned::pin::{Direction, PinLayout},
    dataplane::pinned::resize,
    dataplane::pinned::sizing::Capacities,
    node::netlink,
};

pub use crate::dataplane::attach::pass::{
    PortsRecord, Recorded, invalidate_pass, pass_record, recorded_pass,
};

/// Priority and handle of our filters when attached through clsact
/// (kernels without tcx): fixed, so a new build replaces them in place.
const CLSACT_PRIORITY: u16 = 0xc0de;
const CLSACT_HANDLE: TcHandle = TcHandle::new(0, 0xbeef);

#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    #[error(transparent)]
    Feature(#[from] crate::dataplane::load::features::FeatureError),
    #[error(transparent)]
    Cgroup(#[from] cgroup::CgroupError),
    #[error(transparent)]
    Bpffs(#[from] BpffsError),
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error(
        "this kernel lacks {feature}, which ebpf-portmap needs (Linux {since} or later has it)"
    )]
    MissingFeature {
        feature: &'static str,
        since: &'static str,
        /// The load failure that sent us looking.
        #[source]
        cause: Box<AttachError>,
    },
    #[error("cannot load the eBPF object")]
    Load(#[source] Box<EbpfError>),
    #[error("cannot load program {program}")]
    Program {
        program: &'static str,
        #[source]
        source: Box<ProgramError>,
    },
    #[error("cannot attach {program} to interface {interface} ({direction})")]
    Attach {
        program: &'static str,
        interface: String,
        direction: &'static str,
        #[source]
        source: Box<ProgramError>,
    },
    #[error("cannot pin {path}")]
    Pin {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "pinned map {path} has key size {key_size} and value size {value_size}, this build expects {expected_key} and {expected_value}: it was made by an incompatible build; remove it with `ebpf-portmap uninstall` or use another pinRoot"
    )]
    IncompatibleMap {
        path: PathBuf,
        key_size: u32,
        value_size: u32,
        expected_key: u32,
        expected_value: u32,
    },
    #[error("interface index {index} does not exist")]
    NoInterface { index: u32 },
    #[error(transparent)]
    Resize(#[from] crate::dataplane::pinned::resize::ResizeError),
    #[error("cannot link the eBPF object's kfunc calls")]
    Kfunc(#[from] crate::dataplane::load::kfunc::KfuncError),
    #[error(transparent)]
    Pass(#[from] crate::dataplane::attach::pass::PassError),
}

/// A load failure, explained by the missing feature when the kernel lacks
/// one; any other error is returned as it is.
fn explain_load_failure(error: AttachError) -> AttachError {
    if !matches!(error, AttachError::Load(_) | AttachError::Program { .. }) {
        return error;
    }
    match features::first_missing(features::supported) {
        Some(feature) => AttachError::MissingFeature {
            feature: feature.name,
            since: feature.since,
            cause: Box::new(error),
        },
        None => error,
    }
}

fn program_name(direction: Direction) -> &'static str {
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
fn pinned_program(layout: &PinLayout, direction: Direction) -> Option<SchedClassifier> {
    SchedClassifier::from_pin(layout.program(build_id(), program_name(direction))).ok()
}

fn program_id(program: &SchedClassifier) -> Option<u32> {
    program.info().ok().map(|info| info.id())
}

/// Whether the current build's program (ID `want`) is attached to
/// `ifindex` in `direction`: the interface's tcx hook runs it (only our
/// pinned link puts it there), or it is our clsact filter.
fn attached(layout: &PinLayout, ifindex: u32, direction: Direction, want: u32) -> bool {
    attached_at(
        &HookPins::of(layout, ifindex, direction),
        ifindex,
        direction,
        want,
    )
}

/// [`attached`] for the hook whose pins are `pins`.
fn attached_at(pins: &HookPins, ifindex: u32, direction: Direction, want: u32) -> bool {
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
struct HookPins {
    tcx: PathBuf,
    clsact: PathBuf,
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

    /// The ingress attachment of a bridge port (see [`Targets::bridge_ports`]).
    fn port(layout: &PinLayout, ifindex: u32) -> HookPins {
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

/// The interfaces one run wants to carry the programs, and the node's
/// interfaces as the run's link dump saw them.
#[derive(Debug, Clone, Copy)]
pub struct Targets<'a> {
    /// Checked in the kernel on every run, and failing to attach fails the
    /// run: the request's own container-facing interfaces.
    pub required: &'a BTreeSet<u32>,
    /// Checked by their pins only (one directory read for all of them),
    /// attached when a pin is missing; a failure is logged, not fatal (an
    /// interface may vanish between the dump and the attach): the uplinks.
    pub uplinks: &'a BTreeSet<u32>,
    /// Index of every interface the run's link dump saw (those without a
    /// controller and the request's own, or all), and of every interface
    /// with pins the run asked the kernel about: a pin of any other index
    /// is of an interface that is gone (deleted, or re-created under a new
    /// index) unless asking the kernel for its name says otherwise.
    pub live: &'a BTreeSet<u32>,
    /// Interfaces with pins that are now ports of a bridge or bond, where
    /// no run puts the programs (see [`LinkPins::interfaces`]): detached.
    pub ports: &'a BTreeSet<u32>,
    /// The request's own bridge ports (its pod's veth; every pod's in a
    /// node-wide pass): the ingress program goes there too, checked in the
    /// kernel like `required` (see `verbs::interfaces::bridge_ports`).
    /// Their pins are named apart ([`PinLayout::port_link`]), so no other
    /// run reads them.
    pub bridge_ports: &'a BTreeSet<u32>,
}

/// The links directory as one run read it: the run sorts the interfaces
/// that carry programs of ours from it ([`LinkPins::interfaces`]), and
/// [`ensure`] starts from the same read.
pub struct LinkPins(Vec<(OsString, u64)>);

impl LinkPins {
    pub fn read(layout: &PinLayout) -> Self {
        Self(listed_links(layout))
    }

    /// Every interface with a tc attachment of ours.
    ///
    /// A run may find one that is a bridge's port: the bridge plugin sets a
    /// new pod's veth up before it makes it a port, and an ADD of another
    /// pod whose link dump fell in that window took the veth, up and
    /// without a controller, for an uplink. Left there, the uplink programs
    /// run on every packet of that pod, and every later run asks the kernel
    /// about the interface: on a node of 1 000 pods made 4 at a time, 34
    /// veths had programs, and an ADD cost 1.25x the empty node's instead
    /// of 1.06x.
    pub fn interfaces(&self) -> BTreeSet<u32> {
        tc_attachments(&self.0)
            .into_iter()
            .map(|(ifindex, _)| ifindex)
            .collect()
    }
}

/// Makes sure this build's programs are loaded and attached to every
/// interface of `targets`, both directions, and drops the pins of
/// interfaces that are gone. Cheap when all is in place: a few read-only
/// syscalls and the run's read of the links directory (`pins`), no lock.
pub fn ensure(
    layout: &PinLayout,
    pins: LinkPins,
    targets: Targets<'_>,
    cgroup: &Path,
    capacities: Capacities,
) -> Result<(), AttachError> {
    // Pins of interfaces gone (a removed container's veth, typically) are
    // dropped on their own: that needs the lock, not the whole slow path.
    let mut listed = pins.0;
    if tc_attachments(&listed)
        .iter()
        .any(|&(ifindex, _)| is_gone(targets.live, ifindex))
    {
        let _lock = lock(layout)?;
        forget_interfaces_not_in(layout, targets.live);
        listed = listed_links(layout);
    }
    if !targets.ports.is_empty() {
        let _lock = lock(layout)?;
        for &ifindex in targets.ports {
            detach_port(layout, ifindex);
        }
        listed = listed_links(layout);
    }
    // A changed conntrackSize (or node) is taken up by the slow path.
    let resize_wanted = |layout: &PinLayout| resize::needed(layout, capacities).is_some();
    if is_ready(layout, targets, &listed, cgroup) && !resize_wanted(layout) {
        if !has_beacon(&listed) {
            let _lock = lock(layout)?;
            attach_beacon_if_missing(layout);
        }
        if let Some(mode) = attach_mode(layout) {
            return attach_bridge_ports(layout, targets.bridge_ports, mode);
        }
    }
    mount_bpffs_if_missing(layout.root())?;
    let lock = lock(layout)?;
    // Someone may have finished the job while we waited.
    if is_ready(layout, targets, &listed_links(layout), cgroup) && !resize_wanted(layout) {
        attach_beacon_if_missing(layout);
        if let Some(mode) = attach_mode(layout) {
            return attach_bridge_ports(layout, targets.bridge_ports, mode);
        }
    }
    for dir in [layout.maps_dir(), layout.progs_dir(), layout.links_dir()] {
        create_private_dir(&dir)?;
    }
    let resize = resize::Resize::begin(layout, capacities)?;
    let kfuncs = load_and_pin(layout, capacities, resize.as_ref()).map_err(explain_load_failure)?;
    let loaded = kfuncs.is_some();
    if let Some(resize) = &resize {
        resize.copy_and_swap(layout)?;
    }
    // Probed once per pin root (then read from the record): tcx or clsact.
    let mode = match pinned_program(layout, Direction::Ingress) {
        Some(program) => features::attach_mode(layout, &program)?,
        None => {
            return Err(AttachError::Program {
                program: program_names::TC_INGRESS,
                source: Box::new(ProgramError::NotLoaded),
            });
        }
    };
    // What the fast-path mode follows (see `features::fast_path_flags`):
    // recorded by the load that pinned the programs.
    if let Some(kfuncs) = kfuncs {
        features::record_kfuncs(layout, kfuncs)?;
        log::info!("kernel conntrack kfuncs: {kfuncs:?}");
    }
    // An interface that is gone takes its pins with it; its index is never
    // handed out again soon (the kernel allocates them cyclically).
    forget_interfaces_not_in(layout, targets.live);
    // Every attachment is looked at (a few `bpf()` calls each, one per pod
    // on a routed network) only when the programs may have changed under
    // it: this run loaded them (an upgrade), a resize, or no run has
    // finished that pass for this build since the last change (the record
    // says `pending` from a change's first step, see [`invalidate_pass`]).
    // Otherwise an interface with its pins is attached already, as
    // `is_ready` trusts, and a run costs the same on a node of 3 pods and
    // of 1 000 (issue 36).
    let upgrade_pass = loaded || resize.is_some() || !PassRecord::is_current(layout);
    let full_pass = upgrade_pass || mode == AttachMode::Clsact;
    let pinned: std::collections::HashSet<(u32, Direction)> =
        recorded_attachments(layout).into_iter().collect();
    let has_pins = |ifindex: u32| {
        Direction::BOTH
            .iter()
            .all(|&direction| pinned.contains(&(ifindex, direction)))
    };
    // A failure of the request's own attachment fails the run, but only
    // once the pass is over: after a resize or an upgrade every other
    // attachment must still get the new programs (a pod torn down during
    // its ADD must not leave the uplinks on tables no longer pinned).
    let mut failed: Option<AttachError> = None;
    // Any other attachment that could not be moved: the pass is not done.
    let mut incomplete = false;
    for &ifindex in targets.required {
        for direction in Direction::BOTH {
            if let Err(error) = attach_one(layout, ifindex, direction, mode) {
                failed.get_or_insert(error);
            }
        }
    }
    crash::point("attach-required");
    if let Err(error) = attach_bridge_ports(layout, targets.bridge_ports, mode) {
        failed.get_or_insert(error);
    }
    for &ifindex in targets.uplinks.difference(targets.required) {
        if !full_pass && has_pins(ifindex) {
            continue;
        }
        for direction in Direction::BOTH {
            match attach_one(layout, ifindex, direction, mode) {
                // Gone since the run's dump: nothing runs there.
                Ok(()) | Err(AttachError::NoInterface { .. }) => {}
                Err(error) => {
                    log::warn!("attaching to interface {ifindex}: {error}");
                    incomplete = true;
                }
            }
        }
        crash::point("attach-uplink");
    }
    // Interfaces attached by earlier runs (other containers' veths, after
    // an upgrade): this build's programs go there too, or the old ones keep
    // running.
    for &(ifindex, direction) in pinned.iter().filter(|_| full_pass) {
        if targets.required.contains(&ifindex) || targets.uplinks.contains(&ifindex) {
            continue;
        }
        match attach_one(layout, ifindex, direction, mode) {
            Ok(()) | Err(AttachError::NoInterface { .. }) => {}
            Err(error) => {
                log::warn!("updating the programs on interface {ifindex}: {error}");
                incomplete = true;
            }
        }
        crash::point("attach-pinned");
    }
    // Other pods' bridge ports (one pin each, read only here): their
    // program changes with an upgrade only, whatever the mode.
    for ifindex in port_pins(layout).into_iter().filter(|_| upgrade_pass) {
        if targets.bridge_ports.contains(&ifindex) {
            continue;
        }
        let pins = HookPins::port(layout, ifindex);
        match attach_at(layout, &pins, ifindex, Direction::Ingress, mode) {
            Ok(()) | Err(AttachError::NoInterface { .. }) => {}
            Err(error) => {
                log::warn!("updating the program on bridge port {ifindex}: {error}");
                incomplete = true;
            }
        }
        crash::point("attach-port");
    }
    for program in local::program_names::ALL {
        if !hook_attached(layout, cgroup, program)
            && let Err(error) = cgroup::attach(
                layout,
                cgroup,
                program,
                &layout.program(build_id(), program),
            )
        {
            failed.get_or_insert(error.into());
        }
    }
    crash::point("attach-hooks");
    attach_beacon_if_missing(layout);
    // Programs of this build that ran before another build took over (a
    // downgrade and an upgrade again) may hold mappings in their cache that
    // the other build deleted without raising the epoch.
    crate::dataplane::pinned::maps::MappingsEpoch::at(layout.map(map_names::MAPPINGS_EPOCH))
        .raise();
    if let Some(resize) = resize {
        resize.finish(layout);
    }
    // The record is the last step, and only of a pass that put this
    // build's programs everywhere and then found them there: until it is
    // written, every run (and the agent's pass) does the whole pass again.
    if full_pass && failed.is_none() && !incomplete {
        let unverified = unverified_attachments(layout, cgroup);
        if unverified.is_empty() {
            // The older builds' programs run nowhere any more.
            remove_other_builds(layout);
            PassRecord::write(layout);
            crash::point("attach-recorded");
        } else {
            log::warn!(
                "after the attach pass, {} do not run this build's programs; the next run tries again",
                unverified.join(", ")
            );
        }
    }
    drop(lock);
    failed.map_or(Ok(()), Err)
}

/// Whether every attachment recorded under links/ and every socket hook
/// runs this build's pinned programs. A node-wide pass (the agent's,
/// `reconcile`, GC) asks before it reconciles, and a no makes it redo the
/// whole attach pass whatever the records say ([`invalidate_pass`]): a
/// split left by anything (a build without the records, a hand-made
/// change) is repaired there. A few `bpf()` calls per attachment.
pub fn attachments_current(layout: &PinLayout, cgroup: &Path) -> bool {
    unverified_attachments(layout, cgroup).is_empty()
}

/// Every attachment recorded under links/ (of an interface that exists)
/// and every socket hook that does not run this build's pinned program,
/// described: empty when the attach pass is done. A few `bpf()` calls per
/// attachment; full passes only.
fn unverified_attachments(layout: &PinLayout, cgroup: &Path) -> Vec<String> {
    let mut unverified = Vec::new();
    for direction in Direction::BOTH {
        let Some(want) = pinned_id(&layout.program(build_id(), program_name(direction))) else {
            unverified.push(format!("the pinned {} program", direction.as_str()));
            continue;
        };
        for (ifindex, _) in recorded_attachments(layout)
            .into_iter()
            .filter(|&(_, d)| d == direction)
        {
            if !attached(layout, ifindex, direction, want)
                && netlink::interface_name(ifindex).is_some()
            {
                unverified.push(format!("interface {ifindex} ({})", direction.as_str()));
            }
        }
        if direction == Direction::Ingress {
            for ifindex in port_pins(layout) {
                let pins = HookPins::port(layout, ifindex);
                if !attached_at(&pins, ifindex, direction, want)
                    && netlink::interface_name(ifindex).is_some()
                {
                    unverified.push(format!("bridge port {ifindex}"));
                }
            }
        }
    }
    for program in local::program_names::ALL {
        if !hook_attached(layout, cgroup, program) {
            unverified.push(format!("socket hook {program}"));
        }
    }
    unverified
}

/// Whether the namespace beacon's link is among `listed` (see
/// `stale.rs`).
fn has_beacon(listed: &[(OsString, u64)]) -> bool {
    listed.iter().any(|(name, _)| name == stale::BEACON_LINK)
}

/// Attaches the namespace beacon unless its link is pinned with this
/// build's program (an upgrade replaces it, like every other link); under
/// the root's lock. A failure only costs the root its stale-state detection
/// (it is logged, and tried again by the next run): ADD goes on.
fn attach_beacon_if_missing(layout: &PinLayout) {
    let program = layout.program(build_id(), program_names::NETNS_BEACON);
    let current = pinned_id(&program);
    if let Ok(info) = stale::beacon(layout)
        && Some(info.program_id) == current
    {
        crate::dataplane::pinned::lock::register(layout);
        return;
    }
    if let Err(error) = stale::attach_beacon(layout, &program) {
        log::warn!(
            "this node's state will not be removed automatically if its network namespace goes away: {error}"
        );
    }
}

/// Whether everything of `targets` is in place; `listed` is what
/// [`listed_links`] says now.
fn is_ready(
    layout: &PinLayout,
    targets: Targets<'_>,
    listed: &[(OsString, u64)],
    cgroup: &Path,
) -> bool {
    // A change of programs or tables whose attach pass has not finished:
    // the pins below say nothing of which programs run (issue 52).
    if !PassRecord::is_current(layout) {
        return false;
    }
    // The socket hooks: known to be in place if a run of this build
    // recorded these very link pins; otherwise each link's program is
    // compared with this build's, and what passes is recorded. The pins
    // are listed before the check (see `cgroup::record_hooks`).
    let hooks_ready = match cgroup::hook_pins(layout, cgroup, listed) {
        None => false,
        Some(pins) if cgroup::hooks_recorded(layout, cgroup, build_id(), &pins) => true,
        Some(pins) => {
            let attached = local::program_names::ALL
                .iter()
                .all(|&program| hook_attached(layout, cgroup, program));
            if attached {
                cgroup::record_hooks(layout, cgroup, build_id(), &pins);
            }
            attached
        }
    };
    if !hooks_ready {
        return false;
    }
    let required_ready = Direction::BOTH.iter().all(|&direction| {
        // The ID only: opening the program as a SchedClassifier would
        // make aya probe the kernel's features (a dozen BPF loads).
        let Some(id) = pinned_id(&layout.program(build_id(), program_name(direction))) else {
            return false;
        };
        targets
            .required
            .iter()
            .all(|&ifindex| attached(layout, ifindex, direction, id))
    });
    if !required_ready {
        return false;
    }
    // The uplinks by their pins: an interface added or re-created since the
    // last run has none.
    let pinned: std::collections::HashSet<(u32, Direction)> =
        tc_attachments(listed).into_iter().collect();
    targets.uplinks.iter().all(|&ifindex| {
        Direction::BOTH
            .iter()
            .all(|&direction| pinned.contains(&(ifindex, direction)))
    })
}

/// Whether `program` is attached to `cgroup` through our link, as this
/// build's pinned program of that name.
fn hook_attached(layout: &PinLayout, cgroup: &Path, program: &str) -> bool {
    pinned_id(&layout.program(build_id(), program))
        .is_some_and(|id| cgroup::attached(layout, cgroup, program, id))
}

/// ID of the program pinned at `path`, whatever its type.
fn pinned_id(path: &Path) -> Option<u32> {
    aya::programs::ProgramInfo::from_pin(path)
        .ok()
        .map(|info| info.id())
}

/// Loads the object (reusing pinned maps) and pins this build's programs,
/// unless they are pinned already; what linking its kfunc calls found if
/// it loaded them.
fn load_and_pin(
    layout: &PinLayout,
    capacities: Capacities,
    resize: Option<&resize::Resize>,
) -> Result<Option<Kfuncs>, AttachError> {
    if all_programs()
        .iter()
        .all(|name| layout.program(build_id(), name).exists())
    {
        return Ok(None);
    }
    let linked = crate::dataplane::load::object::linked_for_this_kernel()?;
    check_pinned_layouts(layout)?;
    // New programs (an upgrade, a resize, pins removed by hand): the pass
    // that puts them everywhere must finish, whoever is killed when.
    invalidate_pass(layout)?;
    let migration = Migration::prepare(layout);
    crash::point("load-prepared");
    let conntrack_was_pinned = layout.map(map_names::CONNTRACK).exists();
    let map_paths: Vec<(&str, PathBuf)> = map_names::ALL
        .iter()
        .chain(local::map_names::ALL.iter())
        .chain([portmap_common::TRACE_LOST_MAP].iter())
        .chain([portmap_common::conditions::CONDITIONS_MAP].iter())
        // Pinned so that the agent finds the rare events of every build's
        // programs in one place, and a later load writes to the same one.
        .chain([portmap_common::datapath_log::MAP].iter())
        .map(|&name| (name, layout.map(name)))
        .collect();
    let staged = resize.map(|r| r.staged(layout)).unwrap_or_default();
    let mut loader = EbpfLoader::new();
    for (name, path) in &map_paths {
        loader.map_pin_path(name, path.as_path());
    }
    // Tables being resized are made anew at their staging pins.
    for (name, path) in &staged {
        loader.map_pin_path(name, path.as_path());
    }
    // The sizes apply to the maps this load creates; pinned ones keep
    // theirs until a resize (see `resize`).
    let sizes = resize.map_or_else(
        || {
            crate::dataplane::pinned::sizing::Sizes::resolve(
                capacities,
                crate::dataplane::pinned::sizing::NodeShape::this(),
            )
        },
        |r| *r.sizes(),
    );
    sizes.apply(&mut loader);
    let mut ebpf: Ebpf = loader
        .load(linked.bytes())
        .map_err(|e| AttachError::Load(Box::new(e)))?;
    migration.finish(&mut ebpf);
    if !conntrack_was_pinned
        && let Err(error) = crate::dataplane::pinned::sizing::record(layout, &sizes)
    {
        log::warn!("{error}");
    }
    for name in all_programs() {
        let fail = |source: ProgramError| AttachError::Program {
            program: name,
            source: Box::new(source),
        };
        let program = ebpf
            .program_mut(name)
            .ok_or_else(|| fail(ProgramError::NotLoaded))?;
        match program {
            aya::programs::Program::SchedClassifier(p) => p.load().map_err(fail)?,
            aya::programs::Program::CgroupSockAddr(p) => p.load().map_err(fail)?,
            aya::programs::Program::SkLookup(p) => p.load().map_err(fail)?,
            _ => return Err(fail(ProgramError::NotLoaded)),
        }
        let path = layout.program(build_id(), name);
        if path.exists() {
            // Pinned by an earlier run that died before pinning the rest.
            continue;
        }
        program.pin(&path).map_err(|e| AttachError::Pin {
            path: path.clone(),
            source: io::Error::other(e.to_string()),
        })?;
        crash::point("load-pinned-one");
    }
    crash::point("load-pinned");
    Ok(Some(linked.kfuncs))
}

/// What a load carries over from pins made by an earlier build, so that an
/// upgrade in place keeps its flows and counters:
/// - builds before the split conntrack kept every protocol in `conntrack`;
///   its TCP entries stay there (same layout: the TCP state byte was
///   padding, zero, which reads as established), the UDP and SCTP entries
///   are copied to `conntrack_other` when that map is created. The old
///   programs run on until their links are updated, reading `conntrack`;
///   the copies left there idle out.
/// - a `stats` map with fewer counters than this build has reasons is
///   replaced (the programs would not count the new ones), its values
///   copied over. The old programs keep the old map until replaced.
/// - builds before the port filter have no `mapped_ports`: when the load
///   creates it, the ports of every mapping already there are marked,
///   before this build's programs (which leave packets of unmarked ports
///   alone) are attached anywhere.
///
/// Best effort: what cannot be carried over is logged, and the load goes
/// on (a UDP datagram without its flow is translated anew by its mapping).
struct Migration {
    split_conntrack: bool,
    fill_mapped_ports: bool,
    stats: Option<Vec<aya::maps::PerCpuValues<u64>>>,
}

impl Migration {
    fn prepare(layout: &PinLayout) -> Migration {
        let split_conntrack = layout.map(map_names::CONNTRACK).exists()
            && !layout.map(map_names::CONNTRACK_OTHER).exists();
        let stats = Self::take_short_stats(layout);
        Migration {
            split_conntrack,
            fill_mapped_ports: !layout.map(map_names::MAPPED_PORTS).exists(),
            stats,
        }
    }

    /// The values of a pinned `stats` map that is too short, whose pin is
    /// removed so the load creates a full one.
    fn take_short_stats(layout: &PinLayout) -> Option<Vec<aya::maps::PerCpuValues<u64>>> {
        let path = layout.map(map_names::STATS);
        let info = aya::maps::MapInfo::from_pin(&path).ok()?;
        if info.max_entries() >= portmap_common::stat::COUNT {
            return None;
        }
        let values = match crate::dataplane::pinned::maps::stats(layout) {
            Ok(stats) => (0..info.max_entries())
                .filter_map(|reason| stats.get(&reason, 0).ok())
                .collect(),
            Err(error) => {
                log::warn!("reading the counters of {}: {error}", path.display());
                Vec::new()
            }
        };
        if let Err(error) = fs::remove_file(&path) {
            log::warn!("replacing {}: {error}", path.display());
            return None;
        }
        log::info!(
            "{} had {} counters, this build counts {}: replaced",
            path.display(),
            info.max_entries(),
            portmap_common::stat::COUNT
        );
        Some(values)
    }

    fn finish(self, ebpf: &mut Ebpf) {
        if self.split_conntrack {
            Self::copy_other_protocols(ebpf);
        }
        if self.fill_mapped_ports {
            Self::mark_ports_of_mappings(ebpf);
        }
        if let Some(values) = self.stats {
            let stats = ebpf
                .map_mut(map_names::STATS)
                .and_then(|map| aya::maps::PerCpuArray::<_, u64>::try_from(map).ok());
            if let Some(mut stats) = stats {
                for (reason, value) in values.into_iter().enumerate() {
                    if let Err(error) = stats.set(reason as u32, value, 0) {
                        log::warn!("carrying over counter {reason}: {error}");
                    }
                }
            }
        }
    }

    fn mark_ports_of_mappings(ebpf: &mut Ebpf) {
        use portmap_common::{MappingKey, MappingValue};
        let mappings: Vec<(MappingKey, MappingValue)> = match ebpf
            .map(map_names::MAPPINGS)
            .map(aya::maps::HashMap::<_, MappingKey, MappingValue>::try_from)
        {
            Some(Ok(mappings)) => mappings.iter().filter_map(Result::ok).collect(),
            _ => return,
        };
        let ports = match ebpf.map(map_names::MAPPED_PORTS) {
            Some(aya::maps::Map::Array(data)) => {
                crate::dataplane::pinned::maps::MappedPorts::of(data)
            }
            _ => return,
        };
        match ports {
            Ok(ports) => {
                for (key, value) in &mappings {
                    ports.mark(key, value);
                }
                log::info!(
                    "mapped_ports created: the ports of {} mappings marked",
                    mappings.len()
                );
            }
            Err(error) => log::warn!("marking the ports of the mappings: {error}"),
        }
    }

    fn copy_other_protocols(ebpf: &mut Ebpf) {
        use portmap_common::{CtEntry, CtKey, PROTO_TCP};
        let entries: Vec<(CtKey, CtEntry)> = match ebpf
            .map(map_names::CONNTRACK)
            .map(aya::maps::HashMap::<_, CtKey, CtEntry>::try_from)
        {
            Some(Ok(conntrack)) => conntrack
                .iter()
                .filter_map(Result::ok)
                .filter(|(key, _)| key.proto != PROTO_TCP)
                .collect(),
            _ => return,
        };
        let Some(Ok(mut other)) = ebpf
            .map_mut(map_names::CONNTRACK_OTHER)
            .map(aya::maps::HashMap::<_, CtKey, CtEntry>::try_from)
        else {
            return;
        };
        let mut copied = 0usize;
        for (key, entry) in &entries {
            match other.insert(key, entry, 0) {
                Ok(()) => copied += 1,
                Err(error) => log::warn!("copying a conntrack entry: {error}"),
            }
        }
        log::info!("conntrack split: {copied} UDP/SCTP entries copied to conntrack_other");
    }
}

/// Unpins the attachments of interfaces that no longer exist (the host end
/// of a removed container's veth, an uplink re-created under a new index):
/// their links are defunct. `live` is every interface index the node had
/// at this run's link dump; an index missing there is asked about again,
/// since a run with a newer dump may have attached an interface made since.
fn forget_interfaces_not_in(layout: &PinLayout, live: &BTreeSet<u32>) {
    for (ifindex, direction) in recorded_attachments(layout) {
        if is_gone(live, ifindex) {
            let _ = fs::remove_file(layout.tcx_link(ifindex, direction));
            let _ = fs::remove_file(layout.clsact_marker(ifindex, direction));
        }
    }
}

/// Takes the programs off `ifindex`, a port of a bridge or a bond (see
/// [`LinkPins::interfaces`]): a tcx link goes with its pin, a clsact filter
/// is deleted. A failure is logged; the next run tries again.
fn detach_port(layout: &PinLayout, ifindex: u32) {
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

/// Puts the ingress program on the request's bridge ports (see
/// [`Targets::bridge_ports`]), each checked in the kernel: a pod's own, so
/// no other run races for it but a node-wide pass, and without the load
/// lock (the slow path would raise the mappings' epoch on every ADD).
fn attach_bridge_ports(
    layout: &PinLayout,
    ports: &BTreeSet<u32>,
    mode: AttachMode,
) -> Result<(), AttachError> {
    for &ifindex in ports {
        let attached = match mode {
            AttachMode::Tcx => attach_port_tcx(layout, ifindex),
            AttachMode::Clsact => attach_at(
                layout,
                &HookPins::port(layout, ifindex),
                ifindex,
                Direction::Ingress,
                mode,
            ),
        };
        match attached {
            // A pod's veth that went since the run's dump (a node-wide pass
            // finds every pod's): its pin goes with the next such pass.
            Err(AttachError::NoInterface { .. }) => {}
            other => other?,
        }
    }
    Ok(())
}

/// The ingress program on bridge port `ifindex` under tcx, without opening
/// the program in aya (see `dataplane::attach::tcx`): its ID from the pin, the
/// hook asked, and, if this build's program is not there, a new link. A
/// pin of ours that runs another program (a reused index, or a build that
/// an upgrade pass has not reached) is replaced. Concurrent runs for the
/// same port (a node-wide pass beside the pod's ADD) end with one link:
/// the hook refuses a program it runs already (`EEXIST`), and a link that
/// loses the race for the pin goes with its fd.
fn attach_port_tcx(layout: &PinLayout, ifindex: u32) -> Result<(), AttachError> {
    let name = program_name(Direction::Ingress);
    let program = layout.program(build_id(), name);
    let not_loaded = || AttachError::Program {
        program: name,
        source: Box::new(ProgramError::NotLoaded),
    };
    let id = pinned_id(&program).ok_or_else(not_loaded)?;
    let pins = HookPins::port(layout, ifindex);
    if attached_at(&pins, ifindex, Direction::Ingress, id) {
        return Ok(());
    }
    // Our link, running another program (an upgrade, a resize): swapped in
    // place, so no packet of the port goes without a program, whenever
    // this run is killed. A defunct link (its index reused) goes.
    if pins.tcx.exists() {
        match tcx::update_pinned(&pins.tcx, &program) {
            Ok(()) if attached_at(&pins, ifindex, Direction::Ingress, id) => return Ok(()),
            Ok(()) => {}
            Err(error) => log::debug!("bridge port {ifindex}: link not updated ({error})"),
        }
        let _ = fs::remove_file(&pins.tcx);
    }
    match tcx::link_pinned(&program, ifindex, Direction::Ingress, &pins.tcx) {
        Ok(()) => Ok(()),
        Err(error) if error.raw_os_error() == Some(libc::ENODEV) => {
            Err(AttachError::NoInterface { index: ifindex })
        }
        // The hook runs this very program already (a hook takes a program
        // once: the link of a run beside this one, pinned or about to be).
        Err(error)
            if error.raw_os_error() == Some(libc::EEXIST)
                && tcx_program_ids(ifindex, Direction::Ingress)
                    .is_ok_and(|ids| ids.contains(&id)) =>
        {
            Ok(())
        }
        Err(error) => Err(AttachError::Attach {
            program: name,
            interface: netlink::interface_name(ifindex)
                .unwrap_or_else(|| format!("interface index {ifindex}")),
            direction: Direction::Ingress.as_str(),
            source: Box::new(ProgramError::IOError(error)),
        }),
    }
}

/// Every bridge port with a pin of ours (see [`Targets::bridge_ports`]):
/// one read of the links directory. Only a node-wide pass, an upgrade and
/// the operator's commands read them; a run of one pod never does.
pub fn port_pins(layout: &PinLayout) -> BTreeSet<u32> {
    listed_links(layout)
        .iter()
        .filter_map(|(name, _)| {
            crate::dataplane::pinned::pin::parse_port_link_name(&name.to_string_lossy())
        })
        .map(|(ifindex, _)| ifindex)
        .collect()
}

/// Takes the ingress program off bridge port `ifindex` (a pod's veth going
/// away, or one that is gone or no port any more): the tcx link goes with
/// its pin; a clsact filter is deleted if the interface is still there.
pub fn forget_port(layout: &PinLayout, ifindex: u32) {
    let pins = HookPins::port(layout, ifindex);
    if pins.clsact.exists() {
        if let Some(interface) = netlink::interface_name(ifindex)
            && let Err(error) = detach_clsact(&interface, Direction::Ingress)
        {
            log::warn!("taking the program off bridge port {interface}: {error}");
            return;
        }
        let _ = fs::remove_file(&pins.clsact);
    }
    // The pin holds the link's last reference: removing it detaches.
    let _ = fs::remove_file(&pins.tcx);
}

/// Whether interface `ifindex` is gone: not among `live` (what the run's
/// dump saw) nor known to the kernel now (the dump may have left it out,
/// or a newer run attached an interface made since).
fn is_gone(live: &BTreeSet<u32>, ifindex: u32) -> bool {
    !live.contains(&ifindex) && netlink::interface_name(ifindex).is_none()
}

/// Every pin under links/ with its inode number, from one read of the
/// directory: the tc attachments and the socket hooks' links are both
/// judged by it.
fn listed_links(layout: &PinLayout) -> Vec<(OsString, u64)> {
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
fn tc_attachments(listed: &[(OsString, u64)]) -> Vec<(u32, Direction)> {
    listed
        .iter()
        .filter_map(|(name, _)| {
            crate::dataplane::pinned::pin::parse_link_name(&name.to_string_lossy())
        })
        .map(|(ifindex, direction, _)| (ifindex, direction))
        .collect()
}

/// (ifindex, direction) of every tc attachment recorded under links/.
fn recorded_attachments(layout: &PinLayout) -> Vec<(u32, Direction)> {
    tc_attachments(&listed_links(layout))
}

/// Every program of the object: the tc pair and the socket hooks.
fn all_programs() -> Vec<&'static str> {
    let mut names = vec![program_names::TC_INGRESS, program_names::TC_EGRESS];
    names.extend(local::program_names::ALL);
    names.push(program_names::NETNS_BEACON);
    names
}

/// Key and value sizes this build's maps have, by name.
fn expected_layout(name: &str) -> Option<(u32, u32)> {
    use portmap_common::{CtEntry, CtKey, MappingKey, MappingValue, OwnerRecord, OwnerSlotKey};
    let size = |n: usize| n as u32;
    Some(match name {
        map_names::MAPPINGS => (
            size(size_of::<MappingKey>()),
            size(size_of::<MappingValue>()),
        ),
        map_names::OWNERS => (8, size(size_of::<OwnerRecord>())),
        map_names::OWNER_SLOTS => (
            size(size_of::<OwnerSlotKey>()),
            size(size_of::<MappingKey>()),
        ),
        map_names::CONNTRACK | map_names::CONNTRACK_CLOSED | map_names::CONNTRACK_OTHER => {
            (size(size_of::<CtKey>()), size(size_of::<CtEntry>()))
        }
        map_names::STATS | portmap_common::TRACE_LOST_MAP => (4, 8),
        map_names::MAPPED_PORTS | map_names::MAPPINGS_EPOCH => (4, 8),
        local::map_names::NODE => (4, size(size_of::<local::NodeConfig>())),
        local::map_names::LOCAL_ADDRS => (size(size_of::<local::LocalAddrKey>()), 1),
        local::map_names::IFACES => (4, size(size_of::<local::IfaceConfig>())),
        local::map_names::SOCK_ORIGIN => (4, size(size_of::<local::SockOrigin>())),
        local::map_names::PEERS => (
            size(size_of::<local::PeerKey>()),
            size(size_of::<local::Peer>()),
        ),
        local::map_names::CONTAINER_NETNS => (8, 8),
        map_names::COUNTERS => (
            size(size_of::<portmap_common::CounterKey>()),
            size(size_of::<portmap_common::MappingCounters>()),
        ),
        local::map_names::SOCK_COUNTERS => (
            size(size_of::<portmap_common::CounterKey>()),
            size(size_of::<local::SockCounters>()),
        ),
        map_names::TRACE_FILTER => (4, size(size_of::<portmap_common::TraceFilter>())),
        portmap_common::conditions::CONDITIONS_MAP => (
            size(size_of::<portmap_common::conditions::ConditionKey>()),
            size(size_of::<portmap_common::conditions::Conditions>()),
        ),
        _ => return None,
    })
}

/// A pinned map is reused as it is (aya does no layout check), so one left
/// by a build with another layout must be refused, never misread.
pub fn check_pinned_layouts(layout: &PinLayout) -> Result<(), AttachError> {
    for name in map_names::ALL
        .into_iter()
        .chain(local::map_names::ALL)
        .chain([portmap_common::TRACE_LOST_MAP])
        .chain([portmap_common::conditions::CONDITIONS_MAP])
    {
        let path = layout.map(name);
        let Ok(info) = aya::maps::MapInfo::from_pin(&path) else {
            continue;
        };
        if let Some((expected_key, expected_value)) = expected_layout(name)
            && (info.key_size() != expected_key || info.value_size() != expected_value)
        {
            return Err(AttachError::IncompatibleMap {
                path,
                key_size: info.key_size(),
                value_size: info.value_size(),
                expected_key,
                expected_value,
            });
        }
    }
    Ok(())
}

fn attach_one(
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
fn attach_at(
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

/// Unpins programs of older builds; attachments hold them while in use.
fn remove_other_builds(layout: &PinLayout) {
    let current = format!("{:016x}_", build_id());
    if let Ok(entries) = fs::read_dir(layout.progs_dir()) {
        for entry in entries.flatten() {
            if !entry.file_name().to_string_lossy().starts_with(&current) {
                let _ = fs::remove_file(entry.path());
            }
        }
    }
}

/// Whether this build's programs are attached to `ifindex`, both directions.
pub fn is_attached(layout: &PinLayout, ifindex: u32) -> bool {
    Direction::BOTH.iter().all(|&direction| {
        pinned_id(&layout.program(build_id(), program_name(direction)))
            .is_some_and(|id| attached(layout, ifindex, direction, id))
    })
}

/// STATUS: can this node serve ADD? bpffs must be mounted, and the programs
/// must be loaded already or load now (verified, then dropped).
pub fn probe(layout: &PinLayout) -> Result<(), AttachError> {
    probe_load(layout).map_err(explain_load_failure)
}

fn probe_load(layout: &PinLayout) -> Result<(), AttachError> {
    check_bpffs(layout.root())?;
    check_pinned_layouts(layout)?;
    // By ID: opening them as SchedClassifiers makes aya probe the kernel's
    // features (a dozen BPF loads).
    if Direction::BOTH
        .iter()
        .all(|&d| pinned_id(&layout.program(build_id(), program_name(d))).is_some())
    {
        return Ok(());
    }
    let linked = crate::dataplane::load::object::linked_for_this_kernel()?;
    let mut ebpf = EbpfLoader::new()
        .load(linked.bytes())
        .map_err(|e| AttachError::Load(Box::new(e)))?;
    for direction in Direction::BOTH {
        let name = program_name(direction);
        let program: &mut SchedClassifier = ebpf
            .program_mut(name)
            .ok_or(AttachError::Program {
                program: name,
                source: Box::new(ProgramError::NotLoaded),
            })?
            .try_into()
            .map_err(|source| AttachError::Program {
                program: name,
                source: Box::new(source),
            })?;
        program.load().map_err(|source| AttachError::Program {
            program: name,
            source: Box::new(source),
        })?;
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_missing_feature_message_names_feature_and_kernel() {
        let fib = features::ESSENTIAL
            .iter()
            .find(|f| f.name.contains("bpf_fib_lookup"))
            .unwrap();
        let error = AttachError::MissingFeature {
            feature: fib.name,
            since: fib.since,
            cause: Box::new(AttachError::NoInterface { index: 1 }),
        };
        let text = error.to_string();
        assert!(
            text.contains("bpf_fib_lookup") && text.contains("Linux 4.18 or later"),
            "{text}"
        );
    }

    #[test]
    fn build_id_is_the_hash_of_the_embedded_object() {
        assert_eq!(
            build_id(),
            crate::dataplane::pinned::hash::fnv1a64(crate::dataplane::load::object::OBJECT)
        );
    }
}
