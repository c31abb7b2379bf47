//! How a measured number becomes a Markdown table cell, shared by every
//! section of the report.

use crate::load::{RunResult, Test};
use crate::results::{Results, error_count, errors_of};
use crate::stats::MinMedian;
use crate::world::Flavor;

/// The plugins compared, in table order.
pub(super) const PLUGINS: [Flavor; 3] = [Flavor::Ours, Flavor::Upstream, Flavor::Nftables];

/// What a peer's rule count counts.
pub(super) fn rules_of(flavor: Flavor) -> &'static str {
    match flavor {
        Flavor::Nftables => "nftables rules",
        _ => "nat rules",
    }
}

/// The paired ratio `numerator` / `denominator` of one dataplane cell,
/// as a table cell.
pub(super) fn ratio_cell(
    results: &Results,
    size: usize,
    test: Test,
    numerator: Flavor,
    denominator: Flavor,
) -> String {
    cell(&results.data_ratio(size, test, numerator, denominator), 3)
}

/// `median (min)` of per-repetition values with `digits` decimals.
pub(super) fn cell(values: &[f64], digits: usize) -> String {
    match MinMedian::of(values) {
        Some(s) => format!("{:.digits$} ({:.digits$})", s.median, s.min),
        None => "n/a".to_owned(),
    }
}

/// A latency cell: median over repetitions, worst repetition in brackets.
pub(super) fn latency_cell(values: &[f64]) -> String {
    match MinMedian::of(values) {
        Some(s) => format!("{} ({})", fmt_ms(s.median), fmt_ms(s.max)),
        None => "n/a".to_owned(),
    }
}

pub(super) fn fmt_ms(value: f64) -> String {
    if value >= 100.0 {
        format!("{value:.0}")
    } else if value >= 10.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.2}")
    }
}

/// A measurement as a table cell: median rate (min), and always its
/// error count, so that no rate stands alone.
pub(super) fn rate_cell(test: Test, reps: &[RunResult]) -> String {
    let rates: Vec<f64> = reps.iter().map(|r| r.rate).collect();
    let (errors, connect) = errors_of(reps);
    match MinMedian::of(&rates) {
        Some(s) => format!(
            "{} ({}), {}",
            fmt_rate(test, s.median),
            fmt_rate(test, s.min),
            error_count(errors, connect)
        ),
        None => "n/a".into(),
    }
}

pub(super) fn fmt_rate(test: Test, value: f64) -> String {
    match test {
        Test::TcpStream => format!("{value:.2}"),
        _ => format!("{value:.0}"),
    }
}

/// A table cell's text: its pipes escaped, backticks kept.
pub(super) fn md_escape(text: &str) -> String {
    text.replace('|', "\\|")
}

/// The median of per-repetition values, for a plot's bar.
pub(super) fn median_of(values: &[f64]) -> Option<f64> {
    MinMedian::of(values).map(|s| s.median)
}
