//! The ingress program on bridge ports (a pod's veth on a bridge), pinned
//! apart from the interfaces' own attachments.

use std::{collections::BTreeSet, fs};

use aya::programs::ProgramError;

use crate::{
    dataplane::attach::error::AttachError,
    dataplane::attach::hook::{
        HookPins, attach_at, attached_at, detach_clsact, listed_links, pinned_id, program_name,
        tcx_program_ids,
    },
    dataplane::attach::tcx,
    dataplane::load::features::AttachMode,
    dataplane::load::object::build_id,
    dataplane::pinned::pin::{Direction, PinLayout},
    node::netlink,
};

/// Puts the ingress program on the request's bridge ports (see
/// [`Targets::bridge_ports`](super::Targets::bridge_ports)), each checked
/// in the kernel: a pod's own, so no other run races for it but a
/// node-wide pass, and without the load lock (the slow path would raise
/// the mappings' epoch on every ADD).
pub(super) fn attach_bridge_ports(
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

/// Every bridge port with a pin of ours (see
/// [`Targets::bridge_ports`](super::Targets::bridge_ports)): one read of
/// the links directory. Only a node-wide pass, an upgrade and
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
