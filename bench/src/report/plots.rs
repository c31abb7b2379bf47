//! The SVG plots of a run.

use super::cells::{PLUGINS, median_of};
use crate::load::Test;
use crate::memory;
use crate::results::{Results, Scope, Verb, ops_per_s_per_rep, pct_per_rep, size_label};
use crate::stats::Pct;
use crate::svg::BarChart;
use crate::world::Flavor;

/// A plot file and how the Markdown introduces it.
pub struct Plot {
    pub file_name: String,
    pub title: String,
    pub svg: String,
}

/// The SVG plots of a run, named `<stem>-<what>.svg`.
pub fn plots(results: &Results, stem: &str) -> Vec<Plot> {
    let mut plots = Vec::new();

    // Sequential control-plane latency, log scale.
    let mut groups = Vec::new();
    for scope in [Scope::Alone, Scope::Chain] {
        for verb in Verb::BOTH {
            let mut values = Vec::new();
            for flavor in PLUGINS {
                for which in [Pct::P50, Pct::P99] {
                    values.push(
                        results
                            .control_cell(scope, flavor, verb, 1)
                            .and_then(|c| median_of(&pct_per_rep(&c.reps, which))),
                    );
                }
            }
            let label = match scope {
                Scope::Alone => format!("{} plugin alone", verb.name()),
                Scope::Chain => format!("{} whole chain", verb.name()),
                // Not in this loop: its plugins are ours and the baseline.
                Scope::AgainstBaseline => continue,
            };
            groups.push((label, values));
        }
    }
    plots.push(Plot {
        file_name: format!("{stem}-control-latency.svg"),
        title: "Control-plane latency, sequential".into(),
        svg: BarChart {
            title: "ADD/DEL latency, sequential (ms, log scale; lower is better)".into(),
            y_label: "ms".into(),
            series: PLUGINS
                .iter()
                .flat_map(|f| [format!("{} p50", f.label()), format!("{} p99", f.label())])
                .collect(),
            groups,
            log: true,
            reference_lines: Vec::new(),
        }
        .render(),
    });

    // Throughput under parallel callers.
    let mut groups = Vec::new();
    for scope in [Scope::Alone, Scope::Chain] {
        for verb in Verb::BOTH {
            for callers in [1, 16, 32] {
                let values = PLUGINS
                    .iter()
                    .map(|&flavor| {
                        results
                            .control_cell(scope, flavor, verb, callers)
                            .and_then(|c| median_of(&ops_per_s_per_rep(&c.reps)))
                    })
                    .collect();
                let what = if scope == Scope::Alone {
                    "alone"
                } else {
                    "chain"
                };
                groups.push((format!("{} {what}\nx{callers}", verb.name()), values));
            }
        }
    }
    plots.push(per_plugin_log_scale(
        format!("{stem}-control-parallel.svg"),
        "Control-plane operations per second by number of parallel callers",
        "ADD/DEL operations per second with 1, 16, 32 callers (log scale; higher is better)",
        "ops/s",
        groups,
    ));

    // Scale.
    let mut groups = Vec::new();
    for verb in Verb::BOTH {
        for &size in &results.sizes {
            let values = PLUGINS
                .iter()
                .map(|&flavor| {
                    results
                        .scale_cell(flavor, size, verb)
                        .and_then(|c| median_of(&pct_per_rep(&c.reps, Pct::P50)))
                })
                .collect();
            groups.push((
                format!("{} at\n{} mappings", verb.name(), size_label(size)),
                values,
            ));
        }
    }
    plots.push(per_plugin_log_scale(
        format!("{stem}-scale.svg"),
        "ADD/DEL p50 latency by number of existing mappings",
        "ADD/DEL of one more container, p50 by existing mappings (ms, log scale)",
        "ms",
        groups,
    ));

    // Dataplane ratios to the direct path.
    let mut groups = Vec::new();
    for test in Test::ALL {
        for &size in &results.sizes {
            let values = [
                Flavor::Ours,
                Flavor::OursFast,
                Flavor::Upstream,
                Flavor::Nftables,
                Flavor::OursDirect,
                Flavor::PlainFloor,
            ]
            .iter()
            .map(|&path| median_of(&results.data_ratio(size, test, path, Flavor::Plain)))
            .collect();
            let short_name = match test {
                Test::TcpRr => "TCP RR",
                Test::TcpCrr => "TCP CRR",
                Test::TcpStream => "stream",
                Test::UdpRr => "UDP RR",
            };
            groups.push((format!("{short_name}\n{}", size_label(size)), values));
        }
    }
    // The node's own connect() with the socket hooks / without, in the
    // series of traffic the plugin does not translate.
    groups.push((
        "connect()\nnode, hooks".into(),
        vec![
            None,
            None,
            None,
            None,
            median_of(&results.connect_ratio()),
            median_of(&results.connect_floor_ratio()),
        ],
    ));
    plots.push(Plot {
        file_name: format!("{stem}-dataplane.svg"),
        title: "Dataplane rate through hostPort relative to the direct path".into(),
        svg: BarChart {
            title: "Rate through hostPort / direct path, by test and existing mappings (higher is better)"
                .into(),
            y_label: "ratio to direct".into(),
            series: vec![
                "ebpf-portmap".into(),
                "ebpf-portmap fastPath".into(),
                "iptables portmap".into(),
                "nftables portmap".into(),
                "not translated, ebpf-portmap loaded".into(),
                "not translated, empty programs at its hooks".into(),
            ],
            groups,
            log: false,
            reference_lines: vec![
                (1.0, "direct = 1 (RR, stream: default)".into()),
                (0.99, "0.99 (not translated)".into()),
                (0.92, "0.92 (CRR: default)".into()),
            ],
        }
        .render(),
    });

    // Memory.
    let groups = results
        .memory
        .iter()
        .map(|row| {
            let total = memory::total_memlock(&row.maps) as f64 / (1024.0 * 1024.0);
            let conntrack = row
                .maps
                .get("conntrack")
                .map(|m| m.bytes_memlock as f64 / (1024.0 * 1024.0));
            let rest = conntrack.map(|c| total - c);
            (
                row.state.replace(", ", "\n"),
                vec![Some(total), conntrack, rest],
            )
        })
        .collect();
    plots.push(Plot {
        file_name: format!("{stem}-memory.svg"),
        title: "BPF map memory".into(),
        svg: BarChart {
            title: "BPF map memory of ebpf-portmap (MiB)".into(),
            y_label: "MiB".into(),
            series: vec![
                "all maps".into(),
                "conntrack (preallocated LRU)".into(),
                "mappings + owners + other".into(),
            ],
            groups,
            log: false,
            reference_lines: Vec::new(),
        }
        .render(),
    });
    plots
}

/// A plot of one bar per plugin in each group, on a log scale.
fn per_plugin_log_scale(
    file_name: String,
    title: &str,
    chart_title: &str,
    y_label: &str,
    groups: Vec<(String, Vec<Option<f64>>)>,
) -> Plot {
    Plot {
        file_name,
        title: title.into(),
        svg: BarChart {
            title: chart_title.into(),
            y_label: y_label.into(),
            series: PLUGINS.iter().map(|f| f.label().to_owned()).collect(),
            groups,
            log: true,
            reference_lines: Vec::new(),
        }
        .render(),
    }
}
