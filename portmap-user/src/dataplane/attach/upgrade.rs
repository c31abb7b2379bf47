//! Loading this build's programs beside the pinned maps: maps of another
//! layout refused, what an older build's pins hold carried over, and the
//! older builds' programs unpinned once nothing runs them.

use std::{fs, io, os::fd::OwnedFd, path::PathBuf};

use aya::{Ebpf, EbpfLoader, programs::ProgramError};
use portmap_common::{local, map_names, program_names};

use crate::dataplane::{
    attach::crash,
    attach::error::{AttachError, explain_load_failure},
    attach::hook::{pinned_id, program_name},
    attach::pass::invalidate_pass,
    load::kfunc::Linked,
    load::kfunc::{Groups, Kfuncs},
    load::object::build_id,
    load::program::{ProgramLoadError, load_tc, module_btf_fds, pin},
    pinned::bpffs::check_bpffs,
    pinned::pin::{Direction, PinLayout},
    pinned::resize,
    pinned::sizing::Capacities,
};

/// Loads the object (reusing pinned maps) and pins this build's programs,
/// unless they are pinned already; what linking its kfunc calls found if
/// it loaded them.
pub(super) fn load_and_pin(
    layout: &PinLayout,
    capacities: Capacities,
    resize: Option<&resize::Resize>,
) -> Result<Option<(Kfuncs, Kfuncs)>, AttachError> {
    if all_programs()
        .iter()
        .all(|name| layout.program(build_id(), name).exists())
    {
        return Ok(None);
    }
    let mut linked = crate::dataplane::load::object::linked_for_this_kernel(true, Groups::All)?;
    check_pinned_layouts(layout)?;
    // New programs (an upgrade, a resize, pins removed by hand): the pass
    // that puts them everywhere must finish, whoever is killed when.
    invalidate_pass(layout)?;
    let migration = Migration::prepare(layout);
    crash::point("load-prepared");
    let conntrack_was_pinned = layout.map(map_names::CONNTRACK).exists();
    let ledger_was_pinned = layout.map(map_names::CT_LEDGER).exists();
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
    if !ledger_was_pinned {
        // The tables (new, or an earlier build's) start their ledger as
        // they are: what was evicted before is not known.
        crate::dataplane::pinned::ledger::rebase(layout);
    }
    if !conntrack_was_pinned
        && let Err(error) = crate::dataplane::pinned::sizing::record(layout, &sizes)
    {
        log::warn!("{error}");
    }
    // The tc programs call the kfuncs, which may be a module's: they are
    // loaded with its BTF in their fd_array (see `load::program`), on every
    // kernel, so that one path loads them everywhere.
    // A verifier that refuses the kfunc calls (Debian's 6.1 did, until
    // `confirm::refresh_and_release`) gets the programs without them, as a
    // kernel that lacks them: first without the NAT group's, then without
    // any.
    let mut tc = load_both_tc(&ebpf, &linked);
    while let Err(refusal @ ProgramLoadError::Verifier { .. }) = &tc {
        let Some(fewer) = fewer_groups(&linked) else {
            break;
        };
        log::warn!(
            "loading the programs without some kernel conntrack kfuncs ({fewer:?}): {refusal}"
        );
        linked = crate::dataplane::load::object::linked_for_this_kernel(true, fewer)?;
        ebpf = loader
            .load(linked.bytes())
            .map_err(|e| AttachError::Load(Box::new(e)))?;
        tc = load_both_tc(&ebpf, &linked);
    }
    let mut tc = tc?;
    for name in all_programs() {
        let fail = |source: ProgramError| AttachError::Program {
            program: name,
            source: Box::new(source),
        };
        if let Some(at) = tc.iter().position(|(tc_name, _)| *tc_name == name) {
            let (_, fd) = tc.swap_remove(at);
            let path = layout.program(build_id(), name);
            if !path.exists() {
                pin(&fd, &path, name)?;
                crash::point("load-pinned-one");
            }
            continue;
        }
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
    Ok(Some((linked.kfuncs, linked.nat)))
}

/// Both tc programs of `linked`, loaded against `ebpf`'s maps (see
/// `load::program`).
fn load_both_tc(
    ebpf: &Ebpf,
    linked: &Linked,
) -> Result<Vec<(&'static str, OwnedFd)>, ProgramLoadError> {
    let module_fds = module_btf_fds(&linked.modules)?;
    Direction::BOTH
        .iter()
        .map(|&direction| {
            let name = program_name(direction);
            Ok((name, load_tc(ebpf, linked.bytes(), name, &module_fds)?))
        })
        .collect()
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
        map_names::CONNTRACK
        | map_names::CONNTRACK_CLOSED
        | map_names::CONNTRACK_OTHER
        | map_names::CONNTRACK_NEW => (size(size_of::<CtKey>()), size(size_of::<CtEntry>())),
        map_names::STATS | portmap_common::TRACE_LOST_MAP => (4, 8),
        map_names::MAPPED_PORTS | map_names::MAPPINGS_EPOCH | map_names::CT_LEDGER => (4, 8),
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

/// Unpins programs of older builds; attachments hold them while in use.
pub(super) fn remove_other_builds(layout: &PinLayout) {
    let current = format!("{:016x}_", build_id());
    if let Ok(entries) = fs::read_dir(layout.progs_dir()) {
        for entry in entries.flatten() {
            if !entry.file_name().to_string_lossy().starts_with(&current) {
                let _ = fs::remove_file(entry.path());
            }
        }
    }
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
    let linked = crate::dataplane::load::object::linked_for_this_kernel(true, Groups::All)?;
    let ebpf = EbpfLoader::new()
        .load(linked.bytes())
        .map_err(|e| AttachError::Load(Box::new(e)))?;
    // As `load_and_pin` does: without the calls the verifier refused.
    let mut linked = linked;
    let mut ebpf = ebpf;
    let mut tc = load_both_tc(&ebpf, &linked).map(drop);
    while let Err(ProgramLoadError::Verifier { .. }) = &tc {
        let Some(fewer) = fewer_groups(&linked) else {
            break;
        };
        linked = crate::dataplane::load::object::linked_for_this_kernel(true, fewer)?;
        ebpf = EbpfLoader::new()
            .load(linked.bytes())
            .map_err(|e| AttachError::Load(Box::new(e)))?;
        tc = load_both_tc(&ebpf, &linked).map(drop);
    }
    tc?;
    Ok(())
}

/// The kfunc groups to link after the verifier refused `linked`'s calls:
/// the NAT group's dropped first, then every one; `None` when none is
/// left to drop.
fn fewer_groups(linked: &Linked) -> Option<Groups> {
    if linked.nat == Kfuncs::Linked {
        Some(Groups::WithoutNat)
    } else if linked.kfuncs == Kfuncs::Linked {
        Some(Groups::None)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_id_is_the_hash_of_the_embedded_object() {
        assert_eq!(
            build_id(),
            crate::dataplane::pinned::hash::fnv1a64(crate::dataplane::load::object::OBJECT)
        );
    }
}
