//! The pinned programs and every link we pinned (tc attachments, socket
//! hooks), as `status` shows them, and whether each attached program reads
//! the pinned maps ([`splits`]).

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
    tcx,
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

/// An attached program of ours that does not read the pinned maps: the
/// dataplane is split (a resize or an upgrade killed, or failed, between
/// its renames and the end of its attach pass), and the traffic there sees
/// other mappings and flows than every other interface, and than what the
/// plugin's runs write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Split {
    /// Where it runs: `eth0 ingress`, `bridge port veth1`, a link's pin.
    pub at: String,
    pub program_id: u32,
    pub kind: SplitKind,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SplitKind {
    /// Maps it reads in place of the pinned ones of the same name: (name,
    /// the ID it reads, the pinned one's ID).
    StaleMaps(Vec<(String, u32, u32)>),
    /// None of the pinned programs, and its maps cannot be read (opening a
    /// program by ID needs CAP_SYS_ADMIN): a program a change of programs
    /// or tables did not replace.
    Unpinned,
}

/// The pinned maps (the `maps/` pins, staging pins of a resize included):
/// kernel name by ID.
fn pinned_maps(layout: &PinLayout) -> std::collections::HashMap<u32, String> {
    let Ok(entries) = fs::read_dir(layout.maps_dir()) else {
        return Default::default();
    };
    entries
        .flatten()
        .filter_map(|entry| aya::maps::MapInfo::from_pin(entry.path()).ok())
        .map(|info| (info.id(), info.name_as_str().unwrap_or_default().to_owned()))
        .collect()
}

/// Every pinned program (this build's and others', and the clsact
/// markers), by ID: the way to a program's fd that needs no CAP_SYS_ADMIN.
fn pinned_program_paths(layout: &PinLayout) -> std::collections::HashMap<u32, std::path::PathBuf> {
    let mut paths = std::collections::HashMap::new();
    for dir in [layout.progs_dir(), layout.links_dir()] {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            // Under links/ only the clsact markers are programs: a link's
            // info read as a program's would give its link ID, which may
            // equal a program's.
            let name = entry.file_name().to_string_lossy().into_owned();
            let marker = parse_link_name(&name).is_some_and(|(_, _, clsact)| clsact)
                || parse_port_link_name(&name).is_some_and(|(_, clsact)| clsact);
            if dir == layout.links_dir() && !marker {
                continue;
            }
            if let Ok(info) = ProgramInfo::from_pin(entry.path()) {
                paths.insert(info.id(), entry.path());
            }
        }
    }
    paths
}

/// Every attached program of ours (on an interface that exists, or a
/// socket hook) whose maps are not the pinned ones (see [`Split`]). A few
/// `bpf()` calls per distinct program; maps that are not pinned and carry
/// no pinned map's name (the object's `.rodata` and the like) are its own.
pub fn splits(layout: &PinLayout, found: &Attachments) -> Vec<Split> {
    let pinned = pinned_maps(layout);
    if pinned.is_empty() {
        return Vec::new();
    }
    let pinned_by_name: std::collections::HashMap<&str, u32> = pinned
        .iter()
        .map(|(id, name)| (name.as_str(), *id))
        .collect();
    let programs = pinned_program_paths(layout);
    let mut judged: std::collections::HashMap<u32, Option<SplitKind>> = Default::default();
    let mut judge = |id: u32| -> Option<SplitKind> {
        judged
            .entry(id)
            .or_insert_with(|| {
                let fd = programs
                    .get(&id)
                    .and_then(|path| tcx::open_program_pin(path).ok())
                    // The pin must still be that program.
                    .filter(|fd| tcx::program_id(fd).is_ok_and(|found| found == id))
                    .map_or_else(|| tcx::open_program_id(id), Ok);
                let Ok(fd) = fd else {
                    return Some(SplitKind::Unpinned);
                };
                let map_ids = match tcx::program_map_ids(&fd) {
                    Ok(ids) => ids,
                    Err(error) => {
                        log::warn!("the maps of program {id} cannot be read: {error}");
                        return None;
                    }
                };
                let stale: Vec<(String, u32, u32)> = map_ids
                    .into_iter()
                    .filter(|map_id| !pinned.contains_key(map_id))
                    .filter_map(|map_id| {
                        let info = aya::maps::MapInfo::from_id(map_id).ok()?;
                        let name = info.name_as_str()?.to_owned();
                        let pinned_id = *pinned_by_name.get(name.as_str())?;
                        Some((name, map_id, pinned_id))
                    })
                    .collect();
                (!stale.is_empty()).then_some(SplitKind::StaleMaps(stale))
            })
            .clone()
    };
    let mut splits = Vec::new();
    for a in &found.tc {
        if let (Some(interface), Some(id), true) = (&a.interface, a.program_id, a.attached)
            && let Some(kind) = judge(id)
        {
            splits.push(Split {
                at: format!("{interface} {}", a.direction.as_str()),
                program_id: id,
                kind,
            });
        }
    }
    for a in &found.bridge_ports {
        if let (Some(interface), Some(id), true) = (&a.interface, a.program_id, a.attached)
            && let Some(kind) = judge(id)
        {
            splits.push(Split {
                at: format!("bridge port {interface}"),
                program_id: id,
                kind,
            });
        }
    }
    for link in &found.other {
        if let Some(id) = link.program_id
            && let Some(kind) = judge(id)
        {
            splits.push(Split {
                at: format!("link {}", link.pin),
                program_id: id,
                kind,
            });
        }
    }
    splits
}

/// Whether the last change of programs or tables (an install, an upgrade,
/// a resize) has not finished its attach pass: the record of the pass says
/// it is pending (see `attach::invalidate_pass`). `None` when there is no
/// record (nothing installed, or pins of a build before the record).
pub fn change_unfinished(layout: &PinLayout) -> Option<bool> {
    match attach::recorded_pass(layout) {
        attach::Recorded::Nothing => None,
        attach::Recorded::Pending => Some(true),
        attach::Recorded::Done(_) => Some(false),
    }
}
