//! What the programs cost traffic they do not translate: the floor of
//! empty programs, the node's connect() with the socket hooks, each
//! program's run time, the gap account and the line profiles.

use std::fmt::Write as _;

use super::cells::{cell, md_escape, ratio_cell};
use crate::load::Test;
use crate::results::{LoadProfile, Results, size_label};
use crate::world::{Flavor, UNRELATED_REMOTE as UNRELATED};

/// The section: the floor, connect(), per-program cost and the gap account, then the line profiles.
pub(super) fn cost_section(md: &mut String, results: &Results) {
    let _ = writeln!(
        md,
        "## What the programs cost traffic they do not translate
"
    );
    let _ = writeln!(
        md,
        "`direct, ebpf-portmap loaded` above: the client reaches the container IP on a port no mapping \
         uses, in the ebpf-portmap world (its programs on the uplink and the bridge), against the world \
         without a port-mapping plugin.\n"
    );
    floor_table(md, results);
    if results.connect.is_empty() {
        let _ = writeln!(md, "connect() rate: not measured in this run.\n");
    } else {
        let _ = writeln!(
            md,
            "UDP connect() calls/s of a node process to an unrelated remote port (`{UNRELATED}`), in the cgroup \
             the socket hooks are attached to, outside it, and in a cgroup with a connect4 program that does \
             nothing (the floor: what any program at that hook costs), interleaved:\n"
        );
        let _ = writeln!(
            md,
            "| repetition | with the socket hooks | without | with an empty program | hooks / without | empty / without | hooks / empty |"
        );
        let _ = writeln!(md, "| --- | --- | --- | --- | --- | --- | --- |");
        for (i, rep) in results.connect.iter().enumerate() {
            let ratio =
                |n: f64, d: Option<f64>| d.map_or("n/a".into(), |d| format!("{:.3}", n / d));
            let _ = writeln!(
                md,
                "| {} | {:.0} | {:.0} | {} | {:.3} | {} | {} |",
                i + 1,
                rep.hooked,
                rep.bare,
                rep.floor.map_or("n/a".into(), |f| format!("{f:.0}")),
                rep.hooked / rep.bare,
                rep.floor
                    .map_or("n/a".into(), |f| format!("{:.3}", f / rep.bare)),
                ratio(rep.hooked, rep.floor),
            );
        }
        let _ = writeln!(
            md,
            "| median | | | | {} | {} | {} |\n",
            cell(&results.connect_ratio(), 3),
            cell(&results.connect_floor_ratio(), 3),
            cell(&results.connect_over_floor_ratio(), 3)
        );
    }
    if results.program_costs.is_empty() {
        let _ = writeln!(md, "Per-program cost: not measured in this run.\n");
    } else {
        let _ = writeln!(
            md,
            "Per-program cost from the kernel's BPF statistics (`BPF_ENABLE_STATS`, as \
             `kernel.bpf_stats_enabled`), one run of each load at {} mappings with fastPath off; a \
             program's runs on every interface it is attached to (uplink and bridge) are summed:\n",
            size_label(results.sizes.iter().copied().min().unwrap_or(0))
        );
        let _ = writeln!(md, "| load | program | runs | ns/run |");
        let _ = writeln!(md, "| --- | --- | --- | --- |");
        for cost in &results.program_costs {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {:.1} |",
                cost.load, cost.program, cost.runs, cost.ns_per_run
            );
        }
        let _ = writeln!(md);
        gap_account(md, results);
    }
    line_profiles(md, results);
}

/// Direct pod traffic (no translation) on the node without a
/// port-mapping plugin, with programs that do nothing at ebpf-portmap's tc
/// hooks, and with ebpf-portmap loaded: the floor any program there costs,
/// and what ebpf-portmap's own code costs beyond it.
fn floor_table(md: &mut String, results: &Results) {
    let rows: Vec<(usize, Test)> = results
        .sizes
        .iter()
        .flat_map(|&size| [Test::TcpRr, Test::TcpCrr].map(|test| (size, test)))
        .filter(|&(size, test)| results.data_cell(size, test, Flavor::PlainFloor).is_some())
        .collect();
    if rows.is_empty() {
        let _ = writeln!(
            md,
            "The floor (empty programs at the same hooks): not measured in this run.\n"
        );
        return;
    }
    let _ = writeln!(
        md,
        "The floor: programs that do nothing (`bench/floor`) attached at the tc hooks where ebpf-portmap \
         has its programs (found by querying its world), in the world without a port-mapping plugin, \
         interleaved with the other paths. Ratios paired by repetition, median (min):\n"
    );
    let _ = writeln!(
        md,
        "| test | existing mappings | empty programs / none | ebpf-portmap loaded / none | ebpf-portmap loaded / empty programs |"
    );
    let _ = writeln!(md, "| --- | --- | --- | --- | --- |");
    for (size, test) in rows {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} |",
            test.title(),
            size_label(size),
            ratio_cell(results, size, test, Flavor::PlainFloor, Flavor::Plain),
            ratio_cell(results, size, test, Flavor::OursDirect, Flavor::Plain),
            ratio_cell(results, size, test, Flavor::OursDirect, Flavor::PlainFloor),
        );
    }
    let _ = writeln!(md);
}

/// One load of the gap account: what the programs cost per transaction
/// (or connection) against how much longer one takes than on the direct
/// path.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct GapRow {
    pub(super) load: String,
    /// All programs' time per unit: the sum of runs x ns/run over the
    /// units the measured run completed.
    pub(super) program_ns: f64,
    /// Program runs per unit.
    pub(super) runs: f64,
    /// 1/rate of the path minus 1/rate of the direct path (median rates
    /// of the dataplane section at the same size), in ns; `None` without
    /// both cells.
    pub(super) gap_ns: Option<f64>,
}

pub(super) fn gap_rows(results: &Results) -> Vec<GapRow> {
    let size = results.sizes.iter().copied().min().unwrap_or(0);
    let median_rate = |test, path| {
        results
            .data_cell(size, test, path)
            .and_then(|cell| crate::stats::median(&cell.rates()))
            .filter(|rate| *rate > 0.0)
    };
    let mut rows: Vec<GapRow> = Vec::new();
    for cost in &results.program_costs {
        let Some(under) = cost.under.filter(|u| u.units > 0.0) else {
            continue;
        };
        let row = if let Some(row) = rows.iter_mut().find(|r| r.load == cost.load) {
            row
        } else {
            let gap_ns = median_rate(under.test, under.path)
                .zip(median_rate(under.test, Flavor::Plain))
                .map(|(path, direct)| 1e9 / path - 1e9 / direct);
            rows.push(GapRow {
                load: cost.load.clone(),
                program_ns: 0.0,
                runs: 0.0,
                gap_ns,
            });
            rows.last_mut().expect("just pushed")
        };
        #[allow(clippy::cast_precision_loss)] // run counts stay far below 2^52
        let runs = cost.runs as f64;
        row.program_ns += runs * cost.ns_per_run / under.units;
        row.runs += runs / under.units;
    }
    rows
}

/// Places of a line profile shown in the report; the JSON has them all.
const PROFILE_LINES: usize = 20;

/// Where the programs' time goes under each profiled load: by helper, then
/// the busiest source lines, in ns per transaction or connection.
fn line_profiles(md: &mut String, results: &Results) {
    if results.profiles.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "## Where the programs' time goes, line by line\n\n\
         `perf record -e cpu-clock -g`, one sample per {} us of CPU time, on the CPU the load is pinned \
         to (client, servers and their softirq work), while each load runs, \
         without the BPF statistics. A sample with a frame in ebpf-portmap's tc programs counts for \
         that frame's JIT-ed function (a program, or a subprogram the compiler kept) and source line \
         (the kernel's JIT line table and the programs' BTF), and for the kernel function it called \
         if the sample was below it: a helper, or the map code a lookup is inlined to. The function \
         tells the call sites of one helper apart, whose inlined wrapper is one line of aya. \
         Samples in code that runs with interrupts off (a map's bucket or LRU lock) are taken when \
         they come back on, so they land on the instruction after the unlock. Nanoseconds per transaction (or connection) are samples x period / units the \
         run completed; the per-line figures are a few samples each, so read them as a ranking. \
         `portmap-user/tests/program_profile.rs` gives the same account for single packets in a \
         `BPF_PROG_TEST_RUN` loop.\n",
        results.profiles[0].profile.period_ns / 1000
    );
    for load in &results.profiles {
        let _ = writeln!(
            md,
            "### {}\n\n{} samples of the CPU in a run of {:.1} s, {} in the programs: {:.0} ns per unit of {:.0} units.\n",
            load.load,
            load.profile.samples,
            load.seconds,
            load.profile.in_programs(),
            load.ns_per_unit(load.profile.in_programs()),
            load.units
        );
        let by_callee = load.profile.by_callee();
        profile_table(md, load, "called from the programs", by_callee);
        let mut by_function = load.profile.by_function();
        by_function.truncate(PROFILE_LINES);
        profile_table(md, load, "JIT-ed function (-> what it called)", by_function);
        let by_line = load
            .profile
            .ranked()
            .into_iter()
            .take(PROFILE_LINES)
            .map(|(place, samples)| (format!("{}: {place}", place.function), samples))
            .collect();
        profile_table(
            md,
            load,
            "function: source line (-> what it called)",
            by_line,
        );
    }
}

/// One table of a line profile: `rows` of (what, samples), with the
/// samples in ns per unit of `load`, and a blank line after it.
fn profile_table(md: &mut String, load: &LoadProfile, heading: &str, rows: Vec<(String, u64)>) {
    let _ = writeln!(md, "| {heading} | ns per unit | samples |");
    let _ = writeln!(md, "| --- | --- | --- |");
    for (what, samples) in rows {
        let _ = writeln!(
            md,
            "| {} | {:.0} | {samples} |",
            md_escape(&what),
            load.ns_per_unit(samples)
        );
    }
    let _ = writeln!(md);
}

/// The gap account: how much of the gap to the direct path the programs'
/// own run time explains, per transaction or connection.
fn gap_account(md: &mut String, results: &Results) {
    let rows = gap_rows(results);
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "Where the gap to the direct path goes, per transaction (or connection): the programs' run \
         time (runs x ns/run above, over what the measured run completed) against how much longer a \
         transaction takes than on the direct path (1/rate of each path, median rates of the \
         dataplane section at the same size). The statistics add their own clock reads to every \
         run, so the programs' share is an upper bound; what the programs do not explain is the \
         path itself (a translated packet is delivered to a node address, then routed to the \
         container; the direct one is routed only). A negative gap is a path faster than direct.\n"
    );
    let _ = writeln!(
        md,
        "| load | program runs per unit | programs, ns per unit | gap to direct, ns per unit | programs' share of the gap |"
    );
    let _ = writeln!(md, "| --- | --- | --- | --- | --- |");
    for row in rows {
        let (gap, share) = match row.gap_ns {
            Some(gap) if gap > 0.0 => (
                format!("{gap:.0}"),
                format!("{:.0}%", 100.0 * row.program_ns / gap),
            ),
            Some(gap) => (format!("{gap:.0}"), "n/a".to_owned()),
            None => ("n/a".to_owned(), "n/a".to_owned()),
        };
        let _ = writeln!(
            md,
            "| {} | {:.1} | {:.0} | {gap} | {share} |",
            row.load, row.runs, row.program_ns
        );
    }
    let _ = writeln!(md);
}
