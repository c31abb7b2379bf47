//! The pinned programs and every link we pinned (tc attachments, socket
//! hooks), as `status` shows them.

use std::{fs, time::SystemTime};

use aya::programs::{
    ProgramInfo,
    links::{FdLink, PinnedLink},
};

use crate::dataplane::{
    attach,
    features::AttachMode,
    object::build_id,
    pin::{Direction, PinLayout, parse_link_name, parse_port_link_name},
};
use crate::node::netlink;

/// A pinned program.
#[derive(Debug, Clone)]
pub struct PinnedProgram {
    pub name: String,
    /// Build ID (hash of the object) the pin name carries.
    pub build: String,
    pub id: Option<u32>,
    pub loaded_at: Option<SystemTime>,
    /// Whether it is the build embedded in this binary.
    pub current: bool,
}

pub fn pinned_programs(layout: &PinLayout) -> Vec<PinnedProgram> {
    let current = format!("{:016x}", build_id());
    let mut programs = Vec::new();
    let Ok(entries) = fs::read_dir(layout.progs_dir()) else {
        return programs;
    };
    for entry in entries.flatten() {
        let file = entry.file_name().to_string_lossy().into_owned();
        let (build, name) = file.split_once('_').unwrap_or(("?", file.as_str()));
        let info = ProgramInfo::from_pin(entry.path()).ok();
        programs.push(PinnedProgram {
            name: name.to_owned(),
            build: build.to_owned(),
            id: info.as_ref().map(ProgramInfo::id),
            loaded_at: info.as_ref().and_then(ProgramInfo::loaded_at),
            current: build == current,
        });
    }
    programs.sort_by(|a, b| (&a.build, &a.name).cmp(&(&b.build, &b.name)));
    programs
}

/// One tc attachment we made (a `links/` pin).
#[derive(Debug, Clone)]
pub struct TcAttachment {
    pub ifindex: u32,
    /// `None` when the interface is gone.
    pub interface: Option<String>,
    pub direction: Direction,
    pub mode: AttachMode,
    pub link_id: Option<u32>,
    pub program_id: Option<u32>,
    /// Whether the kernel runs the program on the interface: for tcx, the
    /// interface's tcx program list has it; for clsact, our marker pin is
    /// there and the interface exists.
    pub attached: bool,
}

/// Any other link we pinned (cgroup socket hooks, ...).
#[derive(Debug, Clone)]
pub struct OtherLink {
    pub pin: String,
    pub link_type: String,
    pub link_id: Option<u32>,
    pub program_id: Option<u32>,
}

/// Every pin under links/: the interfaces' tc attachments, the bridge
/// ports' ingress attachments (pods' veths, see
/// `verbs::interfaces::bridge_ports`) and the other links.
pub struct Attachments {
    pub tc: Vec<TcAttachment>,
    pub bridge_ports: Vec<TcAttachment>,
    pub other: Vec<OtherLink>,
}

pub fn attachments(layout: &PinLayout) -> Attachments {
    let mut found = Attachments {
        tc: Vec::new(),
        bridge_ports: Vec::new(),
        other: Vec::new(),
    };
    let Ok(entries) = fs::read_dir(layout.links_dir()) else {
        return found;
    };
    for entry in entries.flatten() {
        let file = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        let (parsed, list) = match parse_port_link_name(&file) {
            Some((ifindex, clsact)) => (
                Some((ifindex, Direction::Ingress, clsact)),
                &mut found.bridge_ports,
            ),
            None => (parse_link_name(&file), &mut found.tc),
        };
        match parsed {
            Some((ifindex, direction, clsact)) => {
                let interface = netlink::interface_name(ifindex);
                let (mode, link_id, program_id) = if clsact {
                    let id = ProgramInfo::from_pin(&path).ok().map(|info| info.id());
                    (AttachMode::Clsact, None, id)
                } else {
                    let info = PinnedLink::from_pin(&path)
                        .ok()
                        .and_then(|link| FdLink::from(link).info().ok());
                    (
                        AttachMode::Tcx,
                        info.as_ref().map(aya::programs::links::LinkInfo::id),
                        info.as_ref()
                            .map(aya::programs::links::LinkInfo::program_id),
                    )
                };
                let attached = match (&interface, program_id, mode) {
                    // By ID only: opening the programs (aya's query_tcx)
                    // needs CAP_SYS_ADMIN, which the agent lacks.
                    (Some(_), Some(id), AttachMode::Tcx) => {
                        attach::tcx_program_ids(ifindex, direction)
                            .is_ok_and(|ids| ids.contains(&id))
                    }
                    (Some(_), Some(_), AttachMode::Clsact) => true,
                    _ => false,
                };
                list.push(TcAttachment {
                    ifindex,
                    interface,
                    direction,
                    mode,
                    link_id,
                    program_id,
                    attached,
                });
            }
            None => {
                let info = PinnedLink::from_pin(&path)
                    .ok()
                    .and_then(|link| FdLink::from(link).info().ok());
                found.other.push(OtherLink {
                    pin: file,
                    link_type: info
                        .as_ref()
                        .and_then(|i| i.link_type().ok())
                        .map_or_else(|| "unknown".into(), |t| format!("{t:?}").to_lowercase()),
                    link_id: info.as_ref().map(aya::programs::links::LinkInfo::id),
                    program_id: info
                        .as_ref()
                        .map(aya::programs::links::LinkInfo::program_id),
                });
            }
        }
    }
    found
        .tc
        .sort_by_key(|a| (a.ifindex, a.direction == Direction::Egress));
    found.bridge_ports.sort_by_key(|a| a.ifindex);
    found.other.sort_by(|a, b| a.pin.cmp(&b.pin));
    found
}
