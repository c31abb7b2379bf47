//! What `status` reports, in one [`Status`] (read and judged by
//! `inspect::status`), and the small reads of its own: the reasons'
//! counters, the hooks' cgroup, the kernel release.

use std::path::PathBuf;

use portmap_common::{TraceFilter, stat};

use super::attachments::{OtherLink, PinnedProgram, Split, TcAttachment};
use super::drift::NodeDrift;
use super::fills::{EvictionReport, MapFill};
use super::ownership::Ownership;
use crate::dataplane::{
    features::{self, AttachMode, FastPathReport, TranslationReport},
    key_notes::KeyNote,
    maps, node_state,
    pin::PinLayout,
};

/// The fast-path mode the node's settings hold, and why.
pub fn fast_path(layout: &PinLayout) -> Option<FastPathReport> {
    let flags = node_state::recorded_flags(layout)?;
    Some(features::fast_path_report(
        flags,
        features::recorded_kfuncs(layout),
    ))
}

/// Where the node's settings have new flows translated, and why.
pub fn translation(layout: &PinLayout) -> Option<TranslationReport> {
    let flags = node_state::recorded_flags(layout)?;
    let hooked = crate::node::nft_tables::nat_hooked().ok();
    Some(features::translation_report(
        flags,
        features::recorded_nat_kfuncs(layout),
        hooked,
    ))
}

/// The `stats` counters summed over CPUs, by reason (all zero when the map
/// is missing).
pub fn stats(layout: &PinLayout) -> Vec<(&'static str, u64)> {
    let map = maps::stats(layout).ok();
    (0..stat::COUNT)
        .map(|reason| {
            let value = map
                .as_ref()
                .and_then(|m| m.get(&reason, 0).ok())
                .map_or(0, |values| values.iter().sum());
            (stat::NAMES[reason as usize], value)
        })
        .collect()
}

/// The state `status` reports.
#[derive(Debug, Clone)]
pub struct Status {
    pub root: PathBuf,
    pub installed: bool,
    pub kernel: String,
    pub build: String,
    pub mode: Option<AttachMode>,
    /// Which flows take the fast path, and why (`None` before the first
    /// ADD set the node's settings).
    pub fast_path: Option<FastPathReport>,
    /// Where new flows are translated (netfilter or tc), per family, and
    /// why (`None` before the first ADD set the node's settings).
    pub translation: Option<TranslationReport>,
    pub programs: Vec<PinnedProgram>,
    pub tc: Vec<TcAttachment>,
    /// The pods' bridge ports carrying the ingress program (hairpin flows
    /// are translated there, before the bridge's netfilter hooks).
    pub bridge_ports: Vec<TcAttachment>,
    /// How the node differs from what the plugin's runs set up.
    pub drift: NodeDrift,
    pub other_links: Vec<OtherLink>,
    /// Attached programs that do not read the pinned maps (see
    /// `attachments::splits`).
    pub splits: Vec<Split>,
    /// Whether the last change of programs or tables has not finished its
    /// attach pass (`None`: no programs pinned).
    pub change_unfinished: Option<bool>,
    pub maps: Vec<MapFill>,
    /// What the conntrack tables evicted, live flows' and unreplied ones'
    /// apart (`None`: nothing installed, or pins of a build before the
    /// ledger).
    pub evictions: Option<EvictionReport>,
    pub missing_maps: Vec<&'static str>,
    pub stats: Vec<(&'static str, u64)>,
    pub tracing: Option<TraceFilter>,
    /// Where the owners' indexes and the mappings disagree (empty when
    /// nothing is installed or the maps cannot be read).
    pub ownership: Ownership,
    /// What is missing or degraded; `status` exits non-zero when not empty.
    pub problems: Vec<String>,
    /// Worth knowing, not a failure.
    pub notes: Vec<String>,
    /// Pin roots on this machine whose node's network namespace is gone
    /// (see `dataplane::stale`): left until a plugin run, the agent or
    /// `uninstall --stale` removes them.
    pub stale_roots: Vec<PathBuf>,
    /// Records in /run/ebpf-portmap of pin roots that no longer exist
    /// (removed without `uninstall`; see `dataplane::stale`): left until a
    /// plugin run, the agent or `uninstall --stale` removes them.
    pub orphan_records: Vec<crate::dataplane::stale::OrphanRecords>,
    /// Keys of a network's configuration that its last ADD took for typos
    /// of ours, and ignored.
    pub misspelt_keys: Vec<KeyNote>,
    /// The cgroup the socket hooks are attached to, as the last run that
    /// found them in place recorded it.
    pub hooks_cgroup: Option<PathBuf>,
    /// Whether firewalld keeps its ruleset in this network namespace (its
    /// nftables table; `None`: nf_tables could not be asked).
    pub firewalld: Option<bool>,
}

/// The cgroup named in the hooks record of `layout` (its `cgroup PATH`
/// line), if a run recorded one.
pub fn hooks_cgroup(layout: &PinLayout) -> Option<PathBuf> {
    let text = std::fs::read_to_string(crate::dataplane::cgroup::hooks_record(layout)).ok()?;
    text.lines()
        .find_map(|line| line.strip_prefix("cgroup "))
        .map(PathBuf::from)
}

/// `uname -r`.
pub fn kernel_release() -> String {
    // SAFETY: an all-zero utsname is valid; uname fills it.
    let mut uts: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: valid out pointer.
    if unsafe { libc::uname(&raw mut uts) } != 0 {
        return "unknown".into();
    }
    // SAFETY: uname NUL-terminates the field.
    unsafe { std::ffi::CStr::from_ptr(uts.release.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}
