//! The targets of issue 37: hairpin rates against each peer, and no
//! connect error in any hostPort measurement of ebpf-portmap.

use super::compare::{PEERS, peer_id};
use super::hairpin_rows::{self as hairpin, Family, Route};
use super::model::{Results, error_count, errors_of};
use super::verdict::{Compare, Status, TargetRow, ratio_target};
use crate::load::Test;
use crate::world::Flavor;

/// Issue 37: hairpin connect+request+close at least even with iptables
/// portmap on the same path, request/response within 5%; the detail
/// carries both sides' error counts, so no ratio stands without them.
pub(super) fn hairpin_targets(results: &Results) -> Vec<TargetRow> {
    let mut rows = Vec::new();
    for peer in PEERS {
        for route in Route::BOTH {
            for family in Family::BOTH {
                for test in hairpin::TESTS {
                    let threshold = if test == Test::TcpCrr { 1.0 } else { 0.95 };
                    let errors = |flavor: Flavor| {
                        results.hairpin_cell(route, family, test, flavor).map_or(
                            "not measured".into(),
                            |c| {
                                let (all, connect) = errors_of(&c.reps);
                                error_count(all, connect)
                            },
                        )
                    };
                    let values = results.hairpin_ratio(peer, route, family, test);
                    let detail = results.peer_detail(
                    peer,
                    &values,
                    format!(
                        "ebpf-portmap rate / {peer} rate, pods outside the hooks' cgroup, interleaved, paired by repetition; ebpf-portmap {}, {peer} {}",
                        errors(Flavor::Ours),
                        errors(peer),
                        peer = peer.label(),
                    ),
                );
                    rows.push(ratio_target(
                        &peer_id(peer, &hairpin::row_id(route, family, test)),
                        format!(
                            "hairpin {} ({}): {} >= {threshold}x {}",
                            route.title(),
                            family.title(),
                            test.title(),
                            peer.label()
                        ),
                        values,
                        Compare::AtLeast,
                        threshold,
                        false,
                        detail,
                    ));
                }
            }
        }
    }
    rows
}

/// Issue 37: no connect of ebpf-portmap's hostPort paths (external, with
/// and without fastPath, and hairpin) may fail. Lost requests and
/// iptables portmap's errors are named in the detail.
pub(super) fn connect_errors_target(results: &Results) -> TargetRow {
    let ours = results.measurements_of(&[Flavor::Ours, Flavor::OursFast]);
    let connect: u64 = ours.iter().map(|(_, reps)| errors_of(reps).1).sum();
    let with_errors: Vec<String> = ours
        .iter()
        .filter_map(|(name, reps)| {
            let (all, connect) = errors_of(reps);
            (all > 0).then(|| format!("{name}: {}", error_count(all, connect)))
        })
        .collect();
    let peer_errors = |peer: Flavor| {
        let (all, connect) =
            results
                .measurements_of(&[peer])
                .iter()
                .fold((0, 0), |(a, c), (_, reps)| {
                    let (all, connect) = errors_of(reps);
                    (a + all, c + connect)
                });
        error_count(all, connect)
    };
    let status = if ours.is_empty() {
        Status::Skip
    } else if connect == 0 {
        Status::Pass
    } else {
        Status::Miss
    };
    TargetRow {
        id: "connect-errors".into(),
        text: "0 connect errors in every hairpin and external measurement of ebpf-portmap".into(),
        compare: Compare::AtMost,
        threshold: 0.0,
        values: if ours.is_empty() {
            Vec::new()
        } else {
            vec![connect as f64]
        },
        unit: "connect errors",
        status,
        stretch: false,
        detail: format!(
            "over {} measurements, all repetitions; {}; iptables portmap: {}; nftables portmap: {}",
            ours.len(),
            if with_errors.is_empty() {
                "none had an error".to_owned()
            } else {
                format!("with errors: {}", with_errors.join("; "))
            },
            peer_errors(Flavor::Upstream),
            peer_errors(Flavor::Nftables)
        ),
    }
}
