//! Renders a run: the JSON with every repetition, the Markdown summary with
//! the PASS/MISS table, and the SVG plots it links.
//!
//! One module per part: `cells` (how a number becomes a table cell),
//! `json` (the full record), `markdown` (the summary, which calls one
//! module per bench section: `control`, `scale`, `dataplane`, `hairpin`,
//! `pods`, `flood`, `cost`, `memory`), `targets` (the PASS/MISS tables) and `plots`.
//! None of them imports this file.

mod cells;
mod control;
mod cost;
mod dataplane;
mod flood;
mod hairpin;
mod json;
mod markdown;
mod memory;
mod plots;
mod pods;
mod scale;
mod targets;
#[cfg(test)]
mod tests;

pub use json::to_json;
pub use markdown::markdown;
pub use plots::plots;
pub use targets::targets_text;

/// `YYYY-MM-DD` of a Unix time (UTC), by Howard Hinnant's civil-from-days.
pub fn date_of(unix_secs: u64) -> String {
    let days = (unix_secs / 86_400) as i64;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!("{y:04}-{m:02}-{d:02}")
}
