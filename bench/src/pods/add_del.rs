//! One more pod's ADD and DEL on the node of real pods (issue 36):
//! ebpf-portmap's, with what one call does, then iptables and nftables
//! portmap's on the same pods, each timed op by op against the empty twin.

use portmap_tests::PortMapping;
use portmap_tests::cni::CniCommand;

use super::node::{PodNode, one_more_mappings};
use crate::control::{Batch, run_interleaved};
use crate::plan::Plan;
use crate::progress::Progress;
use crate::results::{CallAccount, PodCell, Results, Shape, Verb, pct_per_rep};
use crate::stats::{Pct, median};
use crate::world::Flavor;

/// ebpf-portmap's rows of `shape`: one more pod's ADD and DEL on the full
/// node and its twin, then one counted ADD and DEL.
pub(super) fn ours(
    plan: &Plan,
    full: &PodNode,
    empty: &PodNode,
    shape: Shape,
    results: &mut Results,
) {
    let ours = one_more_pod(plan, full, empty, shape, Flavor::Ours, plan.scale_ops.0);
    let counted_mappings = one_more_mappings(9_999);
    let add_account = full.counted(Some("ADD"), |wrapper| {
        full.invoker.port_plugin_wrapped(
            &full.ours,
            CniCommand::Add,
            &full.one_more("counted", &counted_mappings),
            &full.probe_prev,
            wrapper,
        )
    });
    let del_account = full.counted(Some("DEL"), |wrapper| {
        full.invoker.port_plugin_wrapped(
            &full.ours,
            CniCommand::Del,
            &full.one_more("counted", &counted_mappings),
            &full.probe_prev,
            wrapper,
        )
    });
    for ((verb, reps, empty_reps), account) in ours.into_iter().zip([add_account, del_account]) {
        results.pods.push(PodCell {
            shape,
            flavor: Flavor::Ours,
            verb,
            reps,
            empty_reps,
            account: Some(account),
        });
    }
}

/// iptables and nftables portmap's rows of `shape` (nftables portmap's
/// only when `nftables_here`); returns the ops per repetition each got.
pub(super) fn peers(
    plan: &Plan,
    progress: &Progress,
    full: &PodNode,
    empty: &PodNode,
    shape: Shape,
    nftables_here: bool,
    results: &mut Results,
) -> Vec<String> {
    // iptables and nftables portmap on the node of the same pods:
    // batches sized by one untimed ADD + DEL so a slow table stays
    // within the allowance.
    let mut peer_ops = Vec::new();
    for peer in [Flavor::Upstream, Flavor::Nftables] {
        if peer == Flavor::Nftables && !nftables_here {
            continue;
        }
        let warm = one_more_mappings(9_998);
        let pair = full
            .one_more_op(peer, CniCommand::Add, "uwarm", &warm)
            .elapsed
            + full
                .one_more_op(peer, CniCommand::Del, "uwarm", &warm)
                .elapsed;
        let fit = (plan
            .upstream_scale_allowance
            .min(progress.left() / 8)
            .as_secs_f64()
            / (pair.as_secs_f64() * 2.0 * plan.reps as f64)) as usize;
        let ops = fit.clamp(1, plan.scale_ops.1);
        peer_ops.push(format!("{} {ops}", peer.label()));
        for (verb, reps, empty_reps) in one_more_pod(plan, full, empty, shape, peer, ops) {
            results.pods.push(PodCell {
                shape,
                flavor: peer,
                verb,
                reps,
                empty_reps,
                account: None,
            });
        }
    }
    peer_ops
}

/// The progress line of `shape`'s rows: every plugin's p50 and ratio to
/// the empty twin, the ops each peer got, ebpf-portmap's ADD account.
pub(super) fn shape_line(results: &Results, shape: Shape, peer_ops: &[String]) -> String {
    let cells = |flavor, verb| {
        results
            .pod_cell(flavor, shape, verb)
            .map_or("n/a".into(), |c| {
                format!(
                    "{} ({}x empty)",
                    p50(&c.reps),
                    median(&c.ratio_to_empty(Pct::P50)).map_or("n/a".into(), |r| format!("{r:.2}"))
                )
            })
    };
    format!(
        "pods: {}: ebpf-portmap ADD {}, DEL {}; iptables portmap ADD {}, DEL {}; nftables portmap ADD {}, DEL {} (ops/rep: {}); ADD account: {}",
        shape.label(),
        cells(Flavor::Ours, Verb::Add),
        cells(Flavor::Ours, Verb::Del),
        cells(Flavor::Upstream, Verb::Add),
        cells(Flavor::Upstream, Verb::Del),
        cells(Flavor::Nftables, Verb::Add),
        cells(Flavor::Nftables, Verb::Del),
        peer_ops.join(", "),
        results
            .pod_cell(Flavor::Ours, shape, Verb::Add)
            .and_then(|c| c.account.as_ref())
            .map_or("n/a".into(), |a| a
                .as_ref()
                .map_or_else(Clone::clone, CallAccount::summary))
    )
}

/// One more pod's ADD and DEL with `flavor` on the full node and on the
/// empty twin, op by op, `ops` of each per repetition.
fn one_more_pod(
    plan: &Plan,
    full: &PodNode,
    empty: &PodNode,
    shape: Shape,
    flavor: Flavor,
    ops: usize,
) -> [(Verb, Vec<Batch>, Vec<Batch>); 2] {
    let nodes = [full, empty];
    let mut add = (Vec::new(), Vec::new());
    let mut del = (Vec::new(), Vec::new());
    let tag = match flavor {
        Flavor::Upstream => "u",
        Flavor::Nftables => "n",
        _ => "e",
    };
    for rep in 0..plan.reps {
        let items: Vec<(String, Vec<PortMapping>)> = (0..ops)
            .map(|i| {
                (
                    format!("m{tag}{}r{rep}-{i}", shape.key()),
                    one_more_mappings(i),
                )
            })
            .collect();
        let sides = [items.as_slice(), items.as_slice()];
        let mut adds = run_interleaved(&sides, |side, (id, mappings)| {
            nodes[side].one_more_op(flavor, CniCommand::Add, id, mappings)
        })
        .into_iter();
        let mut dels = run_interleaved(&sides, |side, (id, mappings)| {
            nodes[side].one_more_op(flavor, CniCommand::Del, id, mappings)
        })
        .into_iter();
        add.0.push(adds.next().expect("two sides"));
        add.1.push(adds.next().expect("two sides"));
        del.0.push(dels.next().expect("two sides"));
        del.1.push(dels.next().expect("two sides"));
    }
    [(Verb::Add, add.0, add.1), (Verb::Del, del.0, del.1)]
}

/// Median over the repetitions of each repetition's p50, in ms.
fn p50(batches: &[Batch]) -> String {
    median(&pct_per_rep(batches, Pct::P50)).map_or("n/a".into(), |v| format!("{v:.1} ms"))
}
