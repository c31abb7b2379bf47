//! The scale section's table: one more ADD/DEL on a node that already
//! holds N mappings, against the same on an empty node.

use std::fmt::Write as _;

use super::cells::{PLUGINS, cell, latency_cell, rules_of};
use crate::results::{Results, ScaleCell, Verb, pct_per_rep, size_label};
use crate::stats::Pct;

/// One row per plugin and prefilled size, with how the node was filled.
pub(super) fn scale_section(md: &mut String, results: &Results) {
    let _ = writeln!(md, "## Scale\n");
    let _ = writeln!(
        md,
        "ADD and DEL of the plugin alone for one more container (one TCP mapping) on a node that \
         already holds N port mappings (10 per prefilled container). \"vs empty\" divides by the \
         same operation measured on an empty node in the same repetition.\n"
    );
    let _ = writeln!(
        md,
        "| plugin | existing mappings | ops/rep | ADD p50 | ADD p99 | ADD p50 vs empty | DEL p50 | DEL p99 | DEL p50 vs empty | how the node was filled |"
    );
    let _ = writeln!(
        md,
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    );
    for flavor in PLUGINS {
        for &size in &results.sizes {
            let add = results.scale_cell(flavor, size, Verb::Add);
            let del = results.scale_cell(flavor, size, Verb::Del);
            let prefill = results
                .prefill
                .iter()
                .find(|p| p.flavor == flavor && p.size == size);
            let how = prefill.map_or(String::new(), |p| {
                let rules = p
                    .nat_rules
                    .map_or(String::new(), |r| format!(", {r} {}", rules_of(flavor)));
                match &p.skipped {
                    Some(reason) => format!("skipped: {reason}"),
                    None => format!("{} ({:.1} s{rules})", p.method, p.seconds),
                }
            });
            if let Some(reason) = add.and_then(|c| c.skipped.clone()) {
                let _ = writeln!(
                    md,
                    "| {} | {} | | skipped: {reason} | | | | | | {how} |",
                    flavor.label(),
                    size_label(size)
                );
                continue;
            }
            let col = |c: Option<&ScaleCell>, which: Pct| {
                c.map_or("n/a".into(), |c| latency_cell(&pct_per_rep(&c.reps, which)))
            };
            let ratio = |c: Option<&ScaleCell>| {
                c.map_or("n/a".into(), |c| cell(&c.ratio_to_empty(Pct::P50), 2))
            };
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {how} |",
                flavor.label(),
                size_label(size),
                add.and_then(|c| c.reps.first())
                    .map_or(0, crate::control::Batch::ops),
                col(add, Pct::P50),
                col(add, Pct::P99),
                ratio(add),
                col(del, Pct::P50),
                col(del, Pct::P99),
                ratio(del),
            );
        }
    }
}
