//! One run's attach pass: making sure this build's programs are loaded
//! and attached where the run needs them.
//!
//! The first ADD on a node loads the object, pins maps and programs and
//! attaches the tc programs; later ADDs find everything in place with a few
//! read-only syscalls and never take the lock. Loads and attachments are
//! serialised by an `flock` per pin root (released by the kernel if the
//! holder dies), so any number of concurrent first ADDs end with exactly one
//! set of programs. A newer build of the plugin replaces the programs inside
//! the existing tcx links (`BPF_LINK_UPDATE`), atomically: traffic and the
//! pinned maps (conntrack included) carry on untouched.

use std::{collections::BTreeSet, ffi::OsString, path::Path};

use aya::programs::ProgramError;
use portmap_common::{local, map_names, program_names};

use crate::{
    dataplane::attach::beacon::{attach_beacon_if_missing, has_beacon},
    dataplane::attach::cgroup,
    dataplane::attach::crash,
    dataplane::attach::error::{AttachError, explain_load_failure},
    dataplane::attach::hook::{
        HookPins, attach_at, attach_mode, attach_one, attached, attached_at, detach_port,
        forget_interfaces_not_in, is_gone, listed_links, pinned_id, pinned_program, program_name,
        recorded_attachments, tc_attachments,
    },
    dataplane::attach::pass::PassRecord,
    dataplane::attach::ports::{attach_bridge_ports, port_pins},
    dataplane::attach::upgrade::{load_and_pin, remove_other_builds},
    dataplane::load::features::{self, AttachMode},
    dataplane::load::object::build_id,
    dataplane::pinned::bpffs::{create_private_dir, mount_bpffs_if_missing},
    dataplane::pinned::lock::lock,
    dataplane::pinned::pin::{Direction, PinLayout},
    dataplane::pinned::resize,
    dataplane::pinned::sizing::Capacities,
    node::netlink,
};

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
    if let Some((kfuncs, nat)) = kfuncs {
        features::record_kfuncs(layout, kfuncs, nat)?;
        log::info!("kernel conntrack kfuncs: {kfuncs:?}; their NAT kfuncs: {nat:?}");
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
/// whole attach pass whatever the records say
/// ([`invalidate_pass`](super::invalidate_pass)): a split left by anything
/// (a build without the records, a hand-made change) is repaired there. A
/// few `bpf()` calls per attachment.
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
