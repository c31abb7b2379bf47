use std::collections::BTreeMap;
use std::time::Duration;

use super::hairpin_rows::{Family, Route};
use super::judge::idle_target;
use super::*;
use crate::control::Batch;
use crate::load::{RunResult, Test};
use crate::memory::MapInfo;
use crate::stats::Pct;
use crate::world::Flavor;

fn batch(latencies: &[f64], failures: usize, samples: &[&str]) -> Batch {
    let mut by_plugin = BTreeMap::new();
    for sample in samples {
        let plugin = sample.split_whitespace().next().unwrap().to_owned();
        *by_plugin.entry(plugin).or_default() += 1;
    }
    Batch {
        callers: 1,
        latencies_ms: latencies.to_vec(),
        failures,
        failures_by_plugin: by_plugin,
        cpu_ms: latencies.to_vec(),
        failure_samples: samples
            .iter()
            .map(std::string::ToString::to_string)
            .collect(),
        wall: Duration::from_secs(1),
    }
}

/// One repetition per latency, each a batch of one operation that took it.
fn reps_of(latencies_ms: &[f64]) -> Vec<Batch> {
    latencies_ms
        .iter()
        .map(|&latency| batch(&[latency], 0, &[]))
        .collect()
}

fn cell(scope: Scope, flavor: Flavor, verb: Verb, callers: usize, reps: Vec<Batch>) -> ControlCell {
    ControlCell {
        scope,
        flavor,
        verb,
        callers,
        reps,
    }
}

fn find<'a>(rows: &'a [TargetRow], id: &str) -> &'a TargetRow {
    rows.iter()
        .find(|r| r.id == id)
        .unwrap_or_else(|| panic!("no row {id}"))
}

#[test]
fn speedup_is_paired_and_judged_on_the_median() {
    let mut results = Results {
        sizes: vec![0],
        ..Results::default()
    };
    results.control.push(cell(
        Scope::Alone,
        Flavor::Upstream,
        Verb::Add,
        1,
        reps_of(&[50.0, 60.0, 30.0]),
    ));
    results.control.push(cell(
        Scope::Alone,
        Flavor::Ours,
        Verb::Add,
        1,
        reps_of(&[2.0, 2.0, 2.0]),
    ));
    assert_eq!(
        results.speedup(Flavor::Upstream, Verb::Add, Pct::P50),
        [25.0, 30.0, 15.0]
    );
    let rows = judge(&results);
    let add = find(&rows, "cp-add-p50");
    assert_eq!(
        add.status,
        Status::Pass,
        "median 25 >= 20 although the minimum is 15"
    );
    assert_eq!(add.summary().unwrap().min, 15.0);
    assert_eq!(find(&rows, "cp-del-p50").status, Status::Skip);
}

#[test]
fn nftables_portmap_gets_the_same_targets_as_rows_of_its_own() {
    let mut results = Results {
        sizes: vec![0],
        ..Results::default()
    };
    let reps = |ms: f64| reps_of(&[ms, ms]);
    results.control.push(cell(
        Scope::Alone,
        Flavor::Upstream,
        Verb::Add,
        1,
        reps(100.0),
    ));
    results.control.push(cell(
        Scope::Alone,
        Flavor::Nftables,
        Verb::Add,
        1,
        reps(30.0),
    ));
    results
        .control
        .push(cell(Scope::Alone, Flavor::Ours, Verb::Add, 1, reps(2.0)));
    let rows = judge(&results);
    let iptables = find(&rows, "cp-add-p50");
    assert_eq!(iptables.values, [50.0, 50.0]);
    assert_eq!(iptables.status, Status::Pass);
    let nftables = find(&rows, "cp-add-p50-vs-nftables");
    assert_eq!(
        nftables.values,
        [15.0, 15.0],
        "judged on nftables portmap's own cell"
    );
    assert_eq!(
        nftables.status,
        Status::Miss,
        "a miss is reported, not hidden"
    );
    assert!(
        nftables.text.contains("nftables portmap"),
        "{}",
        nftables.text
    );
    for id in [
        "crr-vs-nftables-0",
        "pods-add-vs-nftables-1000x10",
        "pods-del-vs-nftables-0x2",
    ] {
        assert_eq!(
            find(&rows, id).status,
            Status::Skip,
            "{id}: nothing measured"
        );
    }
    assert!(
        rows.iter()
            .any(|r| r.id.starts_with("hairpin-") && r.id.ends_with("-vs-nftables")),
        "hairpin rows against nftables portmap"
    );
}

#[test]
fn status_rows_are_judged_on_every_node_state() {
    let row = |key: &str, cpu_ms: f64, failures: usize| StatusRow {
        key: key.into(),
        state: key.into(),
        calls: Batch {
            latencies_ms: vec![1.0; 4],
            cpu_ms: vec![cpu_ms; 4],
            failures,
            ..Batch::default()
        },
        account: Err("not traced".into()),
        traced_calls: 0,
        first_call_cpu_ms: None,
        first_call: None,
        beside: None,
    };
    let mut results = Results::default();
    assert_eq!(
        find(&judge(&results), "status-failures").status,
        Status::Skip
    );
    results.status = vec![
        row("empty", 1.5, 0),
        row("installed-1000x2", 2.0, 0),
        row("beside-adds-1000x2", 7.0, 1),
    ];
    let rows = judge(&results);
    assert_eq!(find(&rows, "status-cpu-empty").status, Status::Pass);
    assert_eq!(find(&rows, "status-cpu-1000-pods").status, Status::Pass);
    let beside = find(&rows, "status-cpu-beside-adds");
    assert_eq!(
        (beside.status, beside.values.as_slice()),
        (Status::Miss, &[7.0][..])
    );
    let failures = find(&rows, "status-failures");
    assert_eq!(
        (failures.status, failures.values.as_slice()),
        (Status::Miss, &[1.0][..])
    );
}

#[test]
fn without_the_nftables_peer_its_rows_skip_with_the_reason() {
    let results = Results {
        sizes: vec![0],
        nftables_skipped: Some("nftables portmap not measured: no runnable `nft`".into()),
        ..Results::default()
    };
    let rows = judge(&results);
    let row = find(&rows, "cp-del-p99-vs-nftables");
    assert_eq!(row.status, Status::Skip);
    assert!(row.detail.contains("no runnable `nft`"), "{}", row.detail);
    assert!(
        !find(&rows, "cp-del-p99").detail.contains("nft"),
        "iptables portmap's rows keep their own detail"
    );
}

#[test]
fn the_baseline_rows_exist_only_with_a_baseline_and_pair_its_repetitions() {
    let mut results = Results {
        sizes: vec![0],
        ..Results::default()
    };
    results.control.push(cell(
        Scope::AgainstBaseline,
        Flavor::Ours,
        Verb::Add,
        1,
        reps_of(&[2.0, 2.2, 1.8]),
    ));
    assert!(
        judge(&results)
            .iter()
            .all(|row| !row.id.ends_with("-vs-baseline")),
        "no --baseline-bin, no row"
    );
    results.control.push(cell(
        Scope::AgainstBaseline,
        Flavor::Baseline,
        Verb::Add,
        1,
        reps_of(&[2.0, 2.0, 2.0]),
    ));
    assert_eq!(
        results.against_baseline(Verb::Add, Pct::P50),
        [1.0, 1.1, 0.9]
    );
    let rows = judge(&results);
    let add = find(&rows, "cp-add-p50-vs-baseline");
    assert_eq!(add.status, Status::Pass, "median 1.0 is not above 1.0");
    assert!(
        rows.iter().all(|row| row.id != "cp-del-p50-vs-baseline"),
        "DEL has no baseline cell"
    );
    results.control[0].reps[0] = batch(&[2.4], 0, &[]);
    assert_eq!(
        find(&judge(&results), "cp-add-p50-vs-baseline").status,
        Status::Miss,
        "median 1.1: slower than the baseline"
    );
}

#[test]
fn parallel_failures_count_only_ours() {
    let mut results = Results::default();
    results.control.push(cell(
        Scope::Chain,
        Flavor::Ours,
        Verb::Add,
        32,
        vec![batch(
            &[1.0, 1.0],
            2,
            &["bridge ADD failed", "ebpf-portmap ADD failed"],
        )],
    ));
    let rows = judge(&results);
    let row = find(&rows, "parallel-32");
    assert_eq!(row.values, [1.0]);
    assert_eq!(row.status, Status::Miss);
    assert!(
        row.detail.ends_with("other plugins in the chain: 1"),
        "{}",
        row.detail
    );

    let mut clean = Results::default();
    clean.control.push(cell(
        Scope::Alone,
        Flavor::Ours,
        Verb::Add,
        32,
        vec![batch(&[1.0], 0, &[])],
    ));
    assert_eq!(find(&judge(&clean), "parallel-32").status, Status::Pass);
}

#[test]
fn dataplane_ratios_pair_repetitions() {
    let mut results = Results {
        sizes: vec![0],
        ..Results::default()
    };
    let rr = |rates: &[f64]| {
        rates
            .iter()
            .map(|&rate| RunResult {
                rate,
                errors: 0,
                connect_errors: 0,
                amount: rate,
                seconds: 1.0,
            })
            .collect()
    };
    for (path, rates) in [
        (Flavor::Ours, [90.0, 96.0, 99.0]),
        (Flavor::OursFast, [95.0, 99.0, 101.0]),
        (Flavor::Plain, [100.0; 3]),
    ] {
        results.data.push(DataCell {
            size: 0,
            test: Test::TcpRr,
            path,
            reps: rr(&rates),
            skipped: None,
        });
    }
    let rows = judge(&results);
    // The default's target is issue 31's, at least even with direct:
    // median 0.96 misses it; fastPath's is issue 16's 0.95.
    let row = find(&rows, "tcp_rr-vs-direct-0");
    assert_eq!(row.values, [0.9, 0.96, 0.99]);
    assert_eq!(row.threshold, 1.0);
    assert_eq!(row.status, Status::Miss);
    let fast = find(&rows, "tcp_rr-vs-direct-0-fast");
    assert_eq!(fast.threshold, 0.95);
    assert_eq!(fast.values, [0.95, 0.99, 1.01]);
    assert_eq!(fast.status, Status::Pass);
    // The stretch target is fastPath's: median 0.99, not above 1.
    assert_eq!(find(&rows, "stretch-tcp_rr").values, [0.95, 0.99, 1.01]);
    assert_eq!(find(&rows, "stretch-tcp_rr").status, Status::Miss);
    assert!(find(&rows, "stretch-tcp_rr").stretch);
}

fn run(rate: f64, errors: u64, connect_errors: u64) -> RunResult {
    RunResult {
        rate,
        errors,
        connect_errors,
        amount: rate,
        seconds: 1.0,
    }
}

fn hairpin_cell(flavor: Flavor, test: Test, reps: Vec<RunResult>) -> HairpinCell {
    HairpinCell {
        route: Route::ToItself,
        family: Family::V6,
        test,
        flavor,
        reps,
        refused_syns: Vec::new(),
    }
}

#[test]
fn error_counts_say_what_failed() {
    assert_eq!(error_count(0, 0), "0 errors");
    assert_eq!(error_count(1, 1), "1 error: 1 connect failed");
    assert_eq!(error_count(3, 3), "3 errors: 3 connects failed");
    assert_eq!(error_count(2, 0), "2 errors: 2 requests lost");
    assert_eq!(
        error_count(5, 3),
        "5 errors: 3 connects failed, 2 requests lost"
    );
}

#[test]
fn errors_of_adds_up_repetitions() {
    assert_eq!(errors_of(&[run(1.0, 2, 1), run(1.0, 3, 0)]), (5, 1));
    assert_eq!(errors_of(&[]), (0, 0));
}

#[test]
fn hairpin_ratios_pair_repetitions_and_name_both_sides_errors() {
    let mut results = Results::default();
    results.hairpin.push(hairpin_cell(
        Flavor::Ours,
        Test::TcpCrr,
        vec![run(99.0, 0, 0), run(110.0, 0, 0), run(120.0, 0, 0)],
    ));
    results.hairpin.push(hairpin_cell(
        Flavor::Upstream,
        Test::TcpCrr,
        vec![run(100.0, 1, 1), run(100.0, 0, 0), run(100.0, 0, 0)],
    ));
    let rows = judge(&results);
    let row = find(&rows, "hairpin-itself-v6-tcp_crr");
    assert_eq!(row.values, [0.99, 1.1, 1.2]);
    assert_eq!(row.threshold, 1.0);
    assert_eq!(row.status, Status::Pass);
    assert!(
        row.detail
            .ends_with("ebpf-portmap 0 errors, iptables portmap 1 error: 1 connect failed"),
        "{}",
        row.detail
    );
    // Request/response is judged at 0.95x; an unmeasured row is SKIP.
    let rr = find(&rows, "hairpin-itself-v6-tcp_rr");
    assert_eq!(rr.threshold, 0.95);
    assert_eq!(rr.status, Status::Skip);
    assert!(
        rr.detail
            .ends_with("ebpf-portmap not measured, iptables portmap not measured")
    );
}

#[test]
fn one_connect_error_anywhere_misses_and_is_named() {
    let mut results = Results {
        sizes: vec![0],
        ..Results::default()
    };
    assert_eq!(
        find(&judge(&results), "connect-errors").status,
        Status::Skip
    );
    results.data.push(DataCell {
        size: 0,
        test: Test::UdpRr,
        path: Flavor::Ours,
        reps: vec![run(100.0, 2, 0)],
        skipped: None,
    });
    results.data.push(DataCell {
        size: 0,
        test: Test::TcpCrr,
        path: Flavor::Upstream,
        reps: vec![run(100.0, 4, 4)],
        skipped: None,
    });
    // Lost UDP requests are shown, but are no connect errors; iptables
    // portmap's errors are not ebpf-portmap's.
    let row = find(&judge(&results), "connect-errors").clone();
    assert_eq!(row.values, [0.0]);
    assert_eq!(row.status, Status::Pass);
    assert!(row.detail.contains("2 requests lost"), "{}", row.detail);
    assert!(
        row.detail
            .contains("iptables portmap: 4 errors: 4 connects failed;"),
        "{}",
        row.detail
    );

    results.hairpin.push(hairpin_cell(
        Flavor::Ours,
        Test::TcpCrr,
        vec![run(100.0, 0, 0), run(100.0, 3, 3)],
    ));
    let row = find(&judge(&results), "connect-errors").clone();
    assert_eq!(row.values, [3.0]);
    assert_eq!(row.status, Status::Miss);
    assert!(
        row.detail.contains(
            "hairpin pod -> nodeIP:hostPort mapped to itself (IPv6), TCP connect+request+close: 3 errors: 3 connects failed"
        ),
        "{}",
        row.detail
    );
}

fn pod_cell(flavor: Flavor, shape: Shape, verb: Verb, full: &[f64], empty: &[f64]) -> PodCell {
    PodCell {
        shape,
        flavor,
        verb,
        reps: reps_of(full),
        empty_reps: reps_of(empty),
        account: None,
    }
}

fn counted(bpf_calls: u64, address_records: u64) -> Option<Result<CallAccount, String>> {
    Some(Ok(CallAccount {
        bpf_calls,
        program_loads: 0,
        bpf_by_command: BTreeMap::new(),
        netlink: [
            ("link_records".to_owned(), 5),
            ("address_records".to_owned(), address_records),
        ]
        .into(),
    }))
}

#[test]
fn pod_rows_judge_the_full_node_against_its_twin_and_upstream_on_the_same_node() {
    let mut results = Results::default();
    let (empty, quarter, full) = (POD_SHAPES[0], POD_SHAPES[1], POD_SHAPES[2]);
    results.pods.push(pod_cell(
        Flavor::Ours,
        quarter,
        Verb::Add,
        &[2.2, 2.1, 2.4],
        &[2.0; 3],
    ));
    results.pods.push(pod_cell(
        Flavor::Upstream,
        quarter,
        Verb::Add,
        &[40.0, 42.0, 60.0],
        &[10.0; 3],
    ));
    let mut at_0 = pod_cell(Flavor::Ours, empty, Verb::Add, &[2.0], &[2.0]);
    at_0.account = counted(94, 14);
    let mut at_full = pod_cell(Flavor::Ours, full, Verb::Add, &[2.0], &[2.0]);
    at_full.account = counted(97, 1014);
    results.pods.extend([at_0, at_full]);
    let rows = judge(&results);
    let ratio = find(&rows, "pods-add-250x2");
    assert_eq!(ratio.values, [1.1, 1.05, 1.2]);
    assert_eq!(ratio.threshold, 1.1);
    assert_eq!(ratio.status, Status::Pass, "median 1.1 is within 1.1x");
    assert_eq!(find(&rows, "pods-del-250x2").status, Status::Skip);
    let speedup = find(&rows, "pods-add-vs-iptables-250x2");
    assert_eq!(speedup.values, [40.0 / 2.2, 20.0, 25.0]);
    assert_eq!(speedup.status, Status::Pass);
    assert_eq!(find(&rows, "pods-add-1000x2").threshold, 1.2);
    let bpf = find(&rows, "pods-add-bpf-calls");
    assert_eq!(
        (bpf.values.as_slice(), bpf.status),
        (&[3.0][..], Status::Pass)
    );
    let netlink = find(&rows, "pods-add-netlink-messages");
    assert_eq!(netlink.values, [1000.0]);
    assert_eq!(netlink.status, Status::Miss, "{}", netlink.detail);
    assert_eq!(find(&rows, "status-cpu-1000-pods").status, Status::Skip);
    assert_eq!(find(&rows, "status-loads-1000-pods").status, Status::Skip);
}

#[test]
fn size_labels() {
    assert_eq!(size_label(0), "0");
    assert_eq!(size_label(10_000), "10 000");
    assert_eq!(size_label(1_500), "1500");
}

fn memory_row(mappings: usize, conntrack_bytes: u64) -> MemoryRow {
    let map = |name: &str, bytes| {
        (
            name.to_owned(),
            MapInfo {
                name: name.to_owned(),
                kind: "lru_hash".into(),
                max_entries: 16384,
                bytes_memlock: bytes,
                entries: Some(0),
            },
        )
    };
    MemoryRow {
        state: format!("{mappings} mappings"),
        requested_mappings: mappings,
        maps: [map("conntrack", conntrack_bytes), map("mappings", 1 << 20)]
            .into_iter()
            .collect(),
    }
}

#[test]
fn the_idle_target_is_judged_on_the_fewest_mappings() {
    let lean = idle_target(&[memory_row(10_000, 200 << 20), memory_row(0, 17 << 20)]);
    assert_eq!(lean.status, Status::Pass, "{lean:?}");
    assert_eq!(lean.values, vec![18.0]);
    assert!(lean.detail.contains("conntrack 16384"), "{}", lean.detail);
    let fat = idle_target(&[memory_row(0, 101 << 20)]);
    assert_eq!(fat.status, Status::Miss, "{fat:?}");
    assert_eq!(idle_target(&[]).status, Status::Skip);
}
