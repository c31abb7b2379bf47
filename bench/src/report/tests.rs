use serde_json::json;

use super::cells::{PLUGINS, cell, latency_cell};
use super::{date_of, markdown, plots, to_json};
use crate::load::Test;
use crate::results::hairpin_rows::{self as hairpin, Family, Route};
use crate::results::{
    ConnectRep, CostLoad, LoadProfile, ProgramCost, Results, Scope, Status, Verb,
};
use crate::world::Flavor;
use portmap_tests::profile::Place;

#[test]
fn dates() {
    assert_eq!(date_of(0), "1970-01-01");
    assert_eq!(date_of(951_782_400), "2000-02-29");
    assert_eq!(date_of(1_700_000_000), "2023-11-14");
    assert_eq!(date_of(4_102_444_800), "2100-01-01");
}

#[test]
fn cells() {
    assert_eq!(cell(&[1.0, 3.0, 2.0], 1), "2.0 (1.0)");
    assert_eq!(cell(&[], 1), "n/a");
    assert_eq!(latency_cell(&[2.0, 2.5, 150.0]), "2.50 (150)");
}

/// Every row of every Markdown table has as many cells as its header.
fn assert_tables_are_rectangular(md: &str) {
    let mut columns: Option<usize> = None;
    for line in md.lines() {
        if line.starts_with('|') {
            // An escaped pipe is text in a cell.
            let cells = line.matches('|').count() - line.matches("\\|").count();
            match columns {
                None => columns = Some(cells),
                Some(expected) => assert_eq!(cells, expected, "row {line:?}"),
            }
        } else {
            columns = None;
        }
    }
}

#[test]
fn filled_results_render_rectangular_tables() {
    use std::collections::BTreeMap;
    use std::time::Duration;

    use crate::control::Batch;
    use crate::load::RunResult;
    use crate::memory::MapInfo;
    use crate::results::{ControlCell, DataCell, MemoryRow, Prefill, ScaleCell};

    let batch = Batch {
        callers: 1,
        latencies_ms: vec![1.0, 2.0],
        cpu_ms: vec![0.5, 0.5],
        wall: Duration::from_millis(3),
        ..Batch::default()
    };
    let mut results = Results {
        sizes: vec![0, 1000],
        ..Results::default()
    };
    for flavor in PLUGINS {
        for scope in [Scope::Alone, Scope::Chain] {
            for verb in Verb::BOTH {
                results.control.push(ControlCell {
                    scope,
                    flavor,
                    verb,
                    callers: 1,
                    reps: vec![batch.clone(); 3],
                });
            }
        }
        for size in [0, 1000] {
            for verb in Verb::BOTH {
                results.scale.push(ScaleCell {
                    flavor,
                    size,
                    verb,
                    reps: vec![batch.clone(); 3],
                    empty_reps: vec![batch.clone(); 3],
                    skipped: (size == 1000 && flavor == Flavor::Upstream)
                        .then(|| "too slow".to_owned()),
                });
            }
            results.prefill.push(Prefill {
                flavor,
                size,
                method: "real ADDs".into(),
                seconds: 1.0,
                nat_rules: Some(3),
                skipped: None,
            });
        }
    }
    for path in [
        Flavor::Ours,
        Flavor::OursFast,
        Flavor::Upstream,
        Flavor::Nftables,
        Flavor::Plain,
        Flavor::OursDirect,
        Flavor::PlainFloor,
    ] {
        for test in Test::ALL {
            results.data.push(DataCell {
                size: 0,
                test,
                path,
                reps: vec![
                    RunResult {
                        rate: 10.0,
                        errors: 0,
                        connect_errors: 0,
                        amount: 10.0,
                        seconds: 1.0,
                    };
                    3
                ],
                skipped: None,
            });
        }
    }
    for route in Route::BOTH {
        for family in Family::BOTH {
            for test in hairpin::TESTS {
                for flavor in PLUGINS.into_iter().chain([Flavor::OursSockets]) {
                    results.hairpin.push(crate::results::HairpinCell {
                        route,
                        family,
                        test,
                        flavor,
                        reps: vec![
                            RunResult {
                                rate: 10.0,
                                errors: 1,
                                connect_errors: 1,
                                amount: 10.0,
                                seconds: 1.0,
                            };
                            3
                        ],
                        refused_syns: vec![0, 2, 0],
                    });
                }
            }
        }
    }
    let map = |name: &str| MapInfo {
        name: name.into(),
        kind: "hash".into(),
        max_entries: 10,
        bytes_memlock: 1 << 20,
        entries: Some(1),
    };
    results.memory.push(MemoryRow {
        state: "0 mappings".into(),
        requested_mappings: 0,
        maps: BTreeMap::from([
            ("mappings".to_owned(), map("mappings")),
            ("conntrack".to_owned(), map("conntrack")),
        ]),
    });
    results.connect = vec![
        ConnectRep {
            hooked: 99.0,
            bare: 100.0,
            floor: Some(99.5),
        };
        3
    ];
    results.program_costs.push(ProgramCost {
        load: "TCP request/response, ebpf-portmap".into(),
        program: "portmap_ingress".into(),
        runs: 1000,
        ns_per_run: 42.0,
        under: Some(CostLoad {
            test: Test::TcpRr,
            path: Flavor::Ours,
            units: 500.0,
        }),
    });
    results.profiles.push(LoadProfile {
        load: "TCP request/response, ebpf-portmap".into(),
        units: 1000.0,
        seconds: 8.0,
        profile: portmap_tests::profile::Profile {
            period_ns: 1_000_000,
            samples: 50,
            places: BTreeMap::from([
                (
                    Place {
                        line: "nat.rs:9 `x | y`".to_owned(),
                        callee: Some("bpf_l4_csum_replace".to_owned()),
                        function: "existing_flow".to_owned(),
                    },
                    3,
                ),
                (
                    Place {
                        line: "tc.rs:1 `a`".to_owned(),
                        callee: None,
                        function: "portmap_ingress".to_owned(),
                    },
                    1,
                ),
            ]),
        },
    });
    let targets = crate::results::judge(&results);
    let meta = json!({ "date": "2026-01-02", "total_seconds": 12.5 });
    let md = markdown(&results, &targets, &meta, &plots(&results, "x"), &[]);
    assert_tables_are_rectangular(&md);
    // Every rate stands with its error count, in the dataplane table
    // and the hairpin table alike.
    assert!(
        md.contains("| 10 (10), 0 errors | 10 (10), 0 errors |"),
        "{md}"
    );
    assert!(
        md.contains(
            "| pod -> nodeIP:hostPort of another pod | IPv6 | TCP connect+request+close | conn/s | 10 (10), 3 errors: 3 connects failed, 2 SYNs refused | 10 (10), 3 errors: 3 connects failed, 2 SYNs refused | 10 (10), 3 errors: 3 connects failed, 2 SYNs refused | 10 (10), 3 errors: 3 connects failed, 2 SYNs refused | 1.000 (1.000) | 1.000 (1.000) | 1.000 (1.000) |"
        ),
        "{md}"
    );
    // UDP has no TIME_WAIT to refuse anything.
    assert!(
        md.contains(
            "| pod -> nodeIP:hostPort of another pod | IPv6 | UDP request/response | trans/s | 10 (10), 3 errors: 3 connects failed | "
        ),
        "{md}"
    );
    let json = to_json(&results, &targets, &meta);
    // Three routes' worth of cells for each of the four hairpin worlds.
    assert_eq!(json["hairpin"].as_array().map(Vec::len), Some(48));
    assert_eq!(json["hairpin"][0]["connect_errors"], 3);
    assert_eq!(
        json["hairpin"][0]["refused_syns"],
        serde_json::json!([0, 2, 0])
    );
    // 3 samples of 1 ms over 1000 transactions; a pipe in the source
    // text does not split the cell.
    assert!(md.contains("| bpf_l4_csum_replace | 3000 | 3 |"), "{md}");
    assert!(
        md.contains("| existing_flow: nat.rs:9 `x \\| y` -> bpf_l4_csum_replace | 3000 | 3 |"),
        "{md}"
    );
    assert!(
        md.contains("| existing_flow -> bpf_l4_csum_replace | 3000 | 3 |"),
        "{md}"
    );
    assert!(
        md.contains("| portmap_ingress (own code) | 1000 | 1 |"),
        "{md}"
    );
    assert!(md.contains("| the programs' own code | 1000 | 1 |"), "{md}");
    assert!(
        md.contains("| 1 | 99 | 100 | 100 | 0.990 | 0.995 | 0.995 |"),
        "{md}"
    );
    assert!(md.contains("| portmap_ingress | 1000 | 42.0 |"), "{md}");
    // The floor's table: one row per size and test it was measured with.
    assert!(
        md.contains("| TCP request/response | 0 | 1.000 (1.000) | 1.000 (1.000) | 1.000 (1.000) |"),
        "{md}"
    );
    // 1000 runs x 42 ns over 500 transactions.
    assert!(
        md.contains("| TCP request/response, ebpf-portmap | 2.0 | 84 |"),
        "{md}"
    );
    assert!(
        targets
            .iter()
            .any(|t| t.id == "connect-hooks" && t.status == Status::Pass),
        "0.99x passes the connect() target"
    );
    assert!(md.contains("skipped: too slow"), "{md}");
    assert!(
        md.contains("| total bench time (s) | 12 |")
            || md.contains("| total bench time (s) | 13 |")
    );
}

#[test]
fn empty_results_render() {
    let results = Results {
        sizes: vec![0],
        ..Results::default()
    };
    let targets = crate::results::judge(&results);
    let meta = json!({ "date": "2026-01-02" });
    let plots = plots(&results, "2026-01-02");
    let md = markdown(&results, &targets, &meta, &plots, &["a note".into()]);
    assert_tables_are_rectangular(&md);
    assert!(md.starts_with("# ebpf-portmap benchmark, 2026-01-02"));
    assert!(md.contains("| SKIP |"));
    assert!(md.contains("![BPF map memory](2026-01-02-memory.svg)"));
    let json = to_json(&results, &targets, &meta);
    assert_eq!(json["meta"]["date"], "2026-01-02");
    assert!(json["targets"].as_array().is_some_and(|t| !t.is_empty()));
}
