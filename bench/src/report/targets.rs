//! The targets as the report shows them: the PASS/MISS table of the
//! Markdown, with the misses spelt out, and the plain-text table printed at
//! the end of a run.

use std::fmt::Write as _;

use crate::results::{REPORTED, Status, TargetRow};

fn target_measured(row: &TargetRow) -> String {
    if row.unit == REPORTED {
        return row.detail.clone();
    }
    match row.summary() {
        None => "not measured".to_owned(),
        Some(s) if row.unit == "x" => format!("{:.2}x (min {:.2}x)", s.median, s.min),
        Some(s) => format!("{} {}", s.median, row.unit),
    }
}

fn target_threshold(row: &TargetRow) -> String {
    if row.unit == REPORTED {
        return "reported".into();
    }
    if row.unit == "x" {
        format!("{} {}x", row.compare.symbol(), row.threshold)
    } else {
        format!("{} {} {}", row.compare.symbol(), row.threshold, row.unit)
    }
}

fn status_cell(row: &TargetRow) -> String {
    match (row.status, row.stretch) {
        (Status::Pass, false) => "**PASS**".into(),
        (Status::Miss, false) => "**MISS**".into(),
        (Status::Skip, _) => "SKIP".into(),
        (status, true) => format!("{} (stretch)", status.name()),
    }
}

/// The plain-text PASS/MISS table printed at the end of a run.
pub fn targets_text(targets: &[TargetRow]) -> String {
    let mut out = String::new();
    for row in targets {
        let status = if row.stretch {
            format!("{} (stretch)", row.status.name())
        } else {
            row.status.name().to_owned()
        };
        let _ = writeln!(
            out,
            "{status:<15} {:<95} {} (target {})",
            row.text,
            target_measured(row),
            target_threshold(row)
        );
    }
    out
}

/// The Markdown's table of targets, then each missed one with how far off
/// it is.
pub(super) fn targets_section(md: &mut String, targets: &[TargetRow]) {
    let _ = writeln!(md, "\n## Targets\n");
    let _ = writeln!(
        md,
        "Each verdict is taken on the median over the repetitions of a ratio whose two sides were \
         measured in the same repetition; the minimum is shown next to it.\n"
    );
    let _ = writeln!(md, "| result | target | measured: median (min) | needed |");
    let _ = writeln!(md, "| --- | --- | --- | --- |");
    for row in targets {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} |",
            status_cell(row),
            row.text,
            target_measured(row),
            target_threshold(row)
        );
    }
    let misses: Vec<&TargetRow> = targets
        .iter()
        .filter(|t| t.status == Status::Miss && !t.stretch)
        .collect();
    if !misses.is_empty() {
        let _ = writeln!(md, "\n**{} target(s) missed:**\n", misses.len());
        for row in misses {
            let by = row.summary().map_or(String::new(), |s| {
                if row.unit == "x" && row.threshold > 0.0 {
                    format!(
                        ": median {:.3}x against {} {}x, off by {:.1}%",
                        s.median,
                        row.compare.symbol(),
                        row.threshold,
                        (s.median / row.threshold - 1.0).abs() * 100.0
                    )
                } else {
                    format!(": {} {}", s.median, row.unit)
                }
            });
            let _ = writeln!(md, "- {}{by} ({})", row.text, row.detail);
        }
    }
}
