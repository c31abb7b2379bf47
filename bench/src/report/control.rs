//! The control-plane section's tables: ADD/DEL latency, CPU time and
//! throughput per plugin, alone and in the chain, by number of callers.

use std::fmt::Write as _;

use super::cells::{PLUGINS, cell, latency_cell};
use crate::results::{Results, Scope, Verb, cpu_per_rep, failures, ops_per_s_per_rep, pct_per_rep};
use crate::stats::Pct;
use crate::world::Flavor;

/// Latency, CPU time and throughput of every control-plane cell, by scope.
pub(super) fn control_section(md: &mut String, results: &Results) {
    let _ = writeln!(md, "\n## Control plane\n");
    let _ = writeln!(
        md,
        "Latency in ms per operation: median over the repetitions of each repetition's percentile, \
         the worst repetition in brackets. ops/s = operations / wall time of the batch (median, min in brackets). \
         CPU ms/op: median user+system CPU time of the plugin process and the processes it waited for \
         (upstream runs `iptables`), i.e. its cost without the time spent queueing for a CPU. \
         With N callers, N threads run their share of the batch at the same time.\n"
    );
    for scope in [Scope::Alone, Scope::Chain, Scope::AgainstBaseline] {
        // The comparison with a baseline build only when there is one.
        if !results.control.iter().any(|c| c.scope == scope) {
            continue;
        }
        let _ = writeln!(md, "### {}\n", scope.title());
        let _ = writeln!(
            md,
            "| plugin | verb | callers | ops/rep | p50 | p90 | p99 | CPU ms/op | ops/s | failures |"
        );
        let _ = writeln!(
            md,
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
        );
        for verb in Verb::BOTH {
            for callers in [1, 16, 32] {
                // The baseline build (`--baseline-bin`) has sequential
                // rows only, and only when given.
                for flavor in PLUGINS.into_iter().chain([Flavor::Baseline]) {
                    let Some(c) = results.control_cell(scope, flavor, verb, callers) else {
                        continue;
                    };
                    let ops = c.reps.first().map_or(0, crate::control::Batch::ops);
                    let _ = writeln!(
                        md,
                        "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                        flavor.label(),
                        verb.name(),
                        callers,
                        ops,
                        latency_cell(&pct_per_rep(&c.reps, Pct::P50)),
                        latency_cell(&pct_per_rep(&c.reps, Pct::P90)),
                        latency_cell(&pct_per_rep(&c.reps, Pct::P99)),
                        latency_cell(&cpu_per_rep(&c.reps)),
                        cell(&ops_per_s_per_rep(&c.reps), 0),
                        failures(&c.reps)
                    );
                }
            }
        }
        let samples: Vec<String> = results
            .control
            .iter()
            .filter(|c| c.scope == scope)
            .flat_map(|c| {
                c.reps.iter().flat_map(move |b| {
                    b.failure_samples
                        .iter()
                        .map(move |s| format!("{} x{}: {s}", c.flavor.label(), c.callers))
                })
            })
            .take(6)
            .collect();
        if !samples.is_empty() {
            let _ = writeln!(md, "\nFailure samples:\n");
            for sample in samples {
                let _ = writeln!(md, "- `{}`", sample.replace('`', "'"));
            }
        }
        let _ = writeln!(md);
    }
}
