//! The targets of the pods section: one more pod on nodes of real pods
//! against an empty node and against each peer (issue 36), what one ADD
//! does, and STATUS on every node state (issue 33).

use super::compare::PEERS;
use super::model::{CallAccount, POD_SHAPES, PodCell, Results, StatusRow, Verb, size_label};
use super::verdict::{Compare, Status, TargetRow, ratio_target};
use crate::stats::Pct;
use crate::world::Flavor;

/// Issue 36 on nodes of real pods, and issue 33's STATUS at 1 000 pods.
pub(super) fn pod_targets(results: &Results) -> Vec<TargetRow> {
    let mut rows = Vec::new();
    for shape in POD_SHAPES.into_iter().filter(|s| s.pods > 0) {
        let threshold = if shape.pods >= 1000 { 1.2 } else { 1.1 };
        for verb in Verb::BOTH {
            rows.push(ratio_target(
                &format!("pods-{}-{}", verb.name().to_lowercase(), shape.key()),
                format!(
                    "{} p50 of the plugin alone on a node of {} ({} mappings) <= {threshold}x an empty node",
                    verb.name(),
                    shape.label(),
                    size_label(shape.mappings())
                ),
                results
                    .pod_cell(Flavor::Ours, shape, verb)
                    .map(|c| c.ratio_to_empty(Pct::P50))
                    .unwrap_or_default(),
                Compare::AtMost,
                threshold,
                false,
                "ebpf-portmap p50 for one more pod on the full node / on an empty node, op by op, paired by repetition"
                    .into(),
            ));
        }
    }
    for peer in PEERS {
        for shape in POD_SHAPES {
            for verb in Verb::BOTH {
                let values = results.pod_speedup(peer, shape, verb);
                let id = match peer {
                    Flavor::Nftables => "nftables",
                    _ => "iptables",
                };
                let detail = results.peer_detail(
                    peer,
                    &values,
                    format!(
                        "{} p50 / ebpf-portmap p50 for one more pod on the node of the same pods, each with only its own rules for them, paired by repetition",
                        peer.label()
                    ),
                );
                rows.push(ratio_target(
                    &format!(
                        "pods-{}-vs-{id}-{}",
                        verb.name().to_lowercase(),
                        shape.key()
                    ),
                    format!(
                        "{} of the plugin alone >= 20x faster than {} on a node of {}",
                        verb.name(),
                        peer.label(),
                        shape.label()
                    ),
                    values,
                    Compare::AtLeast,
                    20.0,
                    false,
                    detail,
                ));
            }
        }
    }
    let (empty, full) = (POD_SHAPES[0], POD_SHAPES[2]);
    let counted = |shape| {
        results
            .pod_cell(Flavor::Ours, shape, Verb::Add)
            .and_then(PodCell::counted)
    };
    let flat = |id: &str, what: &str, count: &dyn Fn(&CallAccount) -> Option<u64>| {
        let pair = counted(empty)
            .and_then(count)
            .zip(counted(full).and_then(count));
        let values = pair.map_or_else(Vec::new, |(at_0, at_full)| {
            vec![at_full.abs_diff(at_0) as f64]
        });
        TargetRow {
            id: id.into(),
            text: format!(
                "{what} per ADD the same on an empty node and with {} (within 5)",
                full.label()
            ),
            compare: Compare::AtMost,
            threshold: 5.0,
            status: match values.first() {
                None => Status::Skip,
                Some(&d) if d <= 5.0 => Status::Pass,
                Some(_) => Status::Miss,
            },
            values,
            unit: "apart",
            stretch: false,
            detail: pair.map_or("not counted in this run".into(), |(a, b)| {
                format!("{a} with 0 pods, {b} with {}", full.label())
            }),
        }
    };
    rows.push(flat("pods-add-bpf-calls", "bpf() calls", &|a| {
        Some(a.bpf_calls)
    }));
    rows.push(flat(
        "pods-add-netlink-messages",
        "netlink messages (link and address records)",
        &CallAccount::netlink_messages,
    ));
    let status = results
        .status
        .iter()
        .find(|r| r.key == format!("installed-{}", full.key()));
    rows.push(status_cpu_target(
        "status-cpu-1000-pods",
        &format!("a node of {}", full.label()),
        status,
    ));
    // The same 5 ms on the other node states: nothing installed (the
    // calls after the first, which probes), and beside 32 parallel ADDs;
    // and no STATUS call may fail on any of them.
    for (id, key, what) in [
        (
            "status-cpu-empty",
            "empty".to_owned(),
            "a node where nothing is installed (after the first call)".to_owned(),
        ),
        (
            "status-cpu-beside-adds",
            format!("beside-adds-{}", full.key()),
            format!("a node of {} while 32 callers ADD at once", full.label()),
        ),
    ] {
        rows.push(status_cpu_target(
            id,
            &what,
            results.status.iter().find(|r| r.key == key),
        ));
    }
    let status_failures: usize = results.status.iter().map(|r| r.calls.failures).sum();
    let status_calls: usize = results.status.iter().map(|r| r.calls.ops()).sum();
    rows.push(TargetRow {
        id: "status-failures".into(),
        text: "No STATUS call fails, on any node state (also beside 32 parallel ADDs)".into(),
        compare: Compare::AtMost,
        threshold: 0.0,
        values: if results.status.is_empty() {
            Vec::new()
        } else {
            vec![status_failures as f64]
        },
        unit: "failures",
        status: match (results.status.is_empty(), status_failures) {
            (true, _) => Status::Skip,
            (false, 0) => Status::Pass,
            (false, _) => Status::Miss,
        },
        stretch: false,
        detail: format!(
            "over {status_calls} timed STATUS calls on {} node states",
            results.status.len()
        ),
    });
    let loads = status
        .and_then(|r| r.account.as_ref().ok())
        .map(|a| a.program_loads);
    rows.push(TargetRow {
        id: "status-loads-1000-pods".into(),
        text: format!("STATUS loads no program on a node of {}", full.label()),
        compare: Compare::AtMost,
        threshold: 0.0,
        values: loads.map_or_else(Vec::new, |n| vec![n as f64]),
        unit: "programs loaded",
        status: match loads {
            None => Status::Skip,
            Some(0) => Status::Pass,
            Some(_) => Status::Miss,
        },
        stretch: false,
        detail: status.map_or("not measured in this run".into(), |r| {
            format!(
                "BPF_PROG_LOAD calls over {} STATUS calls under strace",
                r.traced_calls
            )
        }),
    });
    rows
}

/// STATUS CPU time per call on `what` (the node state of `row`) within
/// 5 ms; SKIP when that state was not measured.
fn status_cpu_target(id: &str, what: &str, row: Option<&StatusRow>) -> TargetRow {
    let cpu = row.and_then(|r| r.calls.cpu_p50());
    TargetRow {
        id: id.into(),
        text: format!("STATUS CPU time per call on {what} <= 5 ms"),
        compare: Compare::AtMost,
        threshold: 5.0,
        values: cpu.map_or_else(Vec::new, |v| vec![(v * 100.0).round() / 100.0]),
        unit: "ms",
        status: match cpu {
            None => Status::Skip,
            Some(v) if v <= 5.0 => Status::Pass,
            Some(_) => Status::Miss,
        },
        stretch: false,
        detail: "median user+system CPU time of the plugin process (wait4) over the timed calls"
            .into(),
    }
}
