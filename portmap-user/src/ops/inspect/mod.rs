//! What the operator verbs show, read from the kernel: every mapping with
//! its owner, traffic counters and live flows (`list`), and the state of the
//! dataplane on this node (`status`). Read-only; nothing here changes a map
//! or an attachment.
//!
//! One module per part: `list` (the mapping rows and live flows); for
//! `status`, `fills` (map fills), `attachments` (pinned programs and
//! links), `drift` (the node moving on), `ownership` (indexes against
//! mappings), `status` (what it reports, and the small reads of its own)
//! and `judge` (problems and notes); [`status()`] here reads it all and
//! judges it. `shared` holds the error, the installed check and the flows'
//! clock. None of the parts imports this file.

mod attachments;
mod drift;
mod fills;
mod judge;
mod list;
mod ownership;
mod shared;
mod status;

pub use attachments::{
    OtherLink, PinnedProgram, Split, SplitKind, TcAttachment, attachments, change_unfinished,
    pinned_programs, splits,
};
pub use drift::{NodeDrift, node_drift};
pub use fills::{EvictionReport, FILL_WARNING_PERCENT, MapFill, evictions, map_fills};
pub use judge::{judge, judge_gone_containers};
pub use list::{FlowTarget, MappingRow, live_flows, mapping_rows, mapping_rows_and_flows};
pub use ownership::{Ownership, ownership};
pub use shared::{InspectError, monotonic_ns};
pub use status::{Status, fast_path, hooks_cgroup, kernel_release, stats};

use crate::dataplane::{attach, key_notes, object::build_id, pin::PinLayout, trace};

/// Reads everything `status` shows and judges it.
pub fn status(layout: &PinLayout) -> Status {
    let installed = layout.versioned().exists();
    let (maps, missing_maps) = if installed {
        map_fills(layout)
    } else {
        (Vec::new(), Vec::new())
    };
    let programs = pinned_programs(layout);
    let found = attachments(layout);
    let splits = if installed {
        splits(layout, &found)
    } else {
        Vec::new()
    };
    let change_unfinished = change_unfinished(layout);
    let attachments::Attachments {
        tc,
        bridge_ports,
        other: other_links,
    } = found;
    let drift = if installed {
        node_drift(layout, &tc)
    } else {
        NodeDrift::default()
    };
    let tracing = trace::current_filter(layout).ok();
    let mut status = Status {
        root: layout.root().to_path_buf(),
        installed,
        kernel: kernel_release(),
        build: format!("{:016x}", build_id()),
        mode: attach::attach_mode(layout),
        fast_path: status::fast_path(layout),
        translation: status::translation(layout),
        programs,
        tc,
        bridge_ports,
        drift,
        other_links,
        splits,
        change_unfinished,
        evictions: if installed {
            evictions(layout, &maps)
        } else {
            None
        },
        maps,
        missing_maps,
        stats: stats(layout),
        tracing,
        ownership: if installed {
            ownership(layout).unwrap_or_else(|error| {
                log::warn!("ownership not checked: {error}");
                Ownership::default()
            })
        } else {
            Ownership::default()
        },
        problems: Vec::new(),
        notes: Vec::new(),
        stale_roots: crate::dataplane::stale::find(layout)
            .into_iter()
            .map(|stale| stale.root().to_path_buf())
            .collect(),
        orphan_records: crate::dataplane::stale::orphan_records()
            .into_iter()
            .filter(|orphan| orphan.root != layout.root())
            .collect(),
        misspelt_keys: key_notes::recorded(layout),
        hooks_cgroup: hooks_cgroup(layout),
        firewalld: crate::node::nft_tables::firewalld().ok(),
    };
    judge(&mut status);
    if installed {
        judge_gone_containers(layout, &mut status.problems, &mut status.notes);
    }
    status
}
