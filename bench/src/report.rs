//! Renders a run: the JSON with every repetition, the Markdown summary with
//! the PASS/MISS table, and the SVG plots it links.

use std::fmt::Write;

use serde_json::{Value, json};

use super::hairpin::rows::{self as hairpin, Family, Route};
use super::load::{RunResult, Test};
use super::memory::{self, MapInfo};
use super::results::{
    CallAccount, LoadProfile, POD_SHAPES, REPORTED, Results, Scope, Status, TargetRow, Verb,
    cpu_per_rep, error_count, errors_of, failures, ops_per_s_per_rep, pct_per_rep, size_label,
};
use super::stats::{MinMedian, Pct};
use super::svg::BarChart;
use super::world::{Flavor, UNRELATED_REMOTE as UNRELATED};

/// The plugins compared, in table order.
const PLUGINS: [Flavor; 3] = [Flavor::Ours, Flavor::Upstream, Flavor::Nftables];

/// A plot file and how the Markdown introduces it.
pub struct Plot {
    pub file_name: String,
    pub title: String,
    pub svg: String,
}

fn mm_json(values: &[f64]) -> Value {
    match MinMedian::of(values) {
        Some(s) => json!({ "min": s.min, "median": s.median, "max": s.max, "n": s.n }),
        None => Value::Null,
    }
}

/// What a peer's rule count counts.
fn rules_of(flavor: Flavor) -> &'static str {
    match flavor {
        Flavor::Nftables => "nftables rules",
        _ => "nat rules",
    }
}

fn flavor_key(flavor: Flavor) -> &'static str {
    match flavor {
        Flavor::Ours => "ebpf-portmap",
        Flavor::OursFast => "ebpf-portmap-fastpath",
        Flavor::Upstream => "portmap",
        Flavor::Nftables => "portmap-nftables",
        Flavor::Plain => "direct",
        Flavor::OursDirect => "direct-ebpf-portmap-loaded",
        Flavor::PlainFloor => "direct-empty-programs",
        Flavor::Baseline => "ebpf-portmap-baseline",
    }
}

/// The complete machine-readable record of the run.
pub fn to_json(results: &Results, targets: &[TargetRow], meta: &Value) -> Value {
    let control: Vec<Value> = results
        .control
        .iter()
        .map(|c| {
            json!({
                "scope": c.scope.key(),
                "plugin": flavor_key(c.flavor),
                "verb": c.verb.name(),
                "callers": c.callers,
                "summary": {
                    "p50_ms": mm_json(&pct_per_rep(&c.reps, Pct::P50)),
                    "p90_ms": mm_json(&pct_per_rep(&c.reps, Pct::P90)),
                    "p99_ms": mm_json(&pct_per_rep(&c.reps, Pct::P99)),
                    "ops_per_s": mm_json(&ops_per_s_per_rep(&c.reps)),
                    "cpu_p50_ms": mm_json(&cpu_per_rep(&c.reps)),
                    "failures": failures(&c.reps),
                },
                "reps": c.reps.iter().map(super::control::Batch::to_json).collect::<Vec<_>>(),
            })
        })
        .collect();
    let scale: Vec<Value> = results
        .scale
        .iter()
        .map(|c| {
            json!({
                "plugin": flavor_key(c.flavor),
                "existing_mappings": c.size,
                "verb": c.verb.name(),
                "skipped": c.skipped,
                "summary": {
                    "p50_ms": mm_json(&pct_per_rep(&c.reps, Pct::P50)),
                    "p99_ms": mm_json(&pct_per_rep(&c.reps, Pct::P99)),
                    "empty_node_p50_ms": mm_json(&pct_per_rep(&c.empty_reps, Pct::P50)),
                    "p50_ratio_to_empty_node": mm_json(&c.ratio_to_empty(Pct::P50)),
                    "p99_ratio_to_empty_node": mm_json(&c.ratio_to_empty(Pct::P99)),
                    "failures": failures(&c.reps),
                },
                "reps": c.reps.iter().map(super::control::Batch::to_json).collect::<Vec<_>>(),
                "empty_node_reps": c.empty_reps.iter().map(super::control::Batch::to_json).collect::<Vec<_>>(),
            })
        })
        .collect();
    let data: Vec<Value> = results
        .data
        .iter()
        .map(|c| {
            json!({
                "existing_mappings": c.size,
                "test": c.test.key(),
                "unit": c.test.unit(),
                "path": flavor_key(c.path),
                "skipped": c.skipped,
                "summary": mm_json(&c.rates()),
                "errors": c.errors(),
                "connect_errors": c.connect_errors(),
                "reps": reps_json(&c.reps),
            })
        })
        .collect();
    let hairpin: Vec<Value> = results
        .hairpin
        .iter()
        .map(|c| {
            let (errors, connect_errors) = errors_of(&c.reps);
            json!({
                "route": c.route.key(),
                "family": c.family.key(),
                "test": c.test.key(),
                "unit": c.test.unit(),
                "path": flavor_key(c.flavor),
                "summary": mm_json(&c.rates()),
                "errors": errors,
                "connect_errors": connect_errors,
                "reps": reps_json(&c.reps),
            })
        })
        .collect();
    let mut ratios = Vec::new();
    for &size in &results.sizes {
        for test in Test::ALL {
            for (numerator, denominator) in [
                (Flavor::Ours, Flavor::Plain),
                (Flavor::OursFast, Flavor::Plain),
                (Flavor::Upstream, Flavor::Plain),
                (Flavor::Ours, Flavor::Upstream),
                (Flavor::OursFast, Flavor::Upstream),
                (Flavor::Nftables, Flavor::Plain),
                (Flavor::Ours, Flavor::Nftables),
                (Flavor::OursFast, Flavor::Nftables),
                (Flavor::OursDirect, Flavor::Plain),
                (Flavor::PlainFloor, Flavor::Plain),
                (Flavor::OursDirect, Flavor::PlainFloor),
            ] {
                ratios.push(json!({
                    "existing_mappings": size,
                    "test": test.key(),
                    "ratio": format!("{}/{}", flavor_key(numerator), flavor_key(denominator)),
                    "per_rep": results.data_ratio(size, test, numerator, denominator),
                    "summary": mm_json(&results.data_ratio(size, test, numerator, denominator)),
                }));
            }
        }
    }
    json!({
        "meta": meta,
        "targets": targets.iter().map(|t| json!({
            "id": t.id,
            "target": t.text,
            "compare": t.compare.symbol(),
            "threshold": t.threshold,
            "unit": t.unit,
            "values_per_rep": t.values,
            "summary": mm_json(&t.values),
            "status": t.status.name(),
            "stretch": t.stretch,
            "detail": t.detail,
        })).collect::<Vec<_>>(),
        "control_plane": control,
        "scale": scale,
        "prefill": results.prefill.iter().map(|p| json!({
            "plugin": flavor_key(p.flavor),
            "mappings": p.size,
            "method": p.method,
            "seconds": p.seconds,
            "nat_rules": p.nat_rules,
            "skipped": p.skipped,
        })).collect::<Vec<_>>(),
        "dataplane": data,
        "hairpin": hairpin,
        "pods": results.pods.iter().map(|c| json!({
            "pods": c.shape.pods,
            "mappings_per_pod": c.shape.mappings_per_pod,
            "plugin": flavor_key(c.flavor),
            "verb": c.verb.name(),
            "summary": {
                "p50_ms": mm_json(&pct_per_rep(&c.reps, Pct::P50)),
                "empty_node_p50_ms": mm_json(&pct_per_rep(&c.empty_reps, Pct::P50)),
                "p50_ratio_to_empty_node": mm_json(&c.ratio_to_empty(Pct::P50)),
                "cpu_p50_ms": mm_json(&cpu_per_rep(&c.reps)),
                "failures": failures(&c.reps),
            },
            "account": c.account.as_ref().map(|a| match a {
                Ok(a) => json!({"bpf_calls": a.bpf_calls, "program_loads": a.program_loads, "bpf_by_command": a.bpf_by_command, "netlink": a.netlink}),
                Err(e) => json!({"error": e}),
            }),
            "reps": c.reps.iter().map(super::control::Batch::to_json).collect::<Vec<_>>(),
            "empty_node_reps": c.empty_reps.iter().map(super::control::Batch::to_json).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "pods_prefill": results.pod_prefill.iter().map(|p| json!({
            "pods": p.shape.pods,
            "mappings_per_pod": p.shape.mappings_per_pod,
            "plugin": flavor_key(p.flavor),
            "method": p.method,
            "seconds": p.seconds,
            "nat_rules": p.nat_rules,
        })).collect::<Vec<_>>(),
        "status": results.status.iter().map(|r| json!({
            "key": r.key,
            "state": r.state,
            "calls": r.calls.to_json(),
            "cpu_ms": r.calls.cpu_ms,
            "traced_calls": r.traced_calls,
            "traced": match &r.account {
                Ok(a) => json!({"bpf_calls": a.bpf_calls, "program_loads": a.program_loads, "bpf_by_command": a.bpf_by_command}),
                Err(e) => json!({"error": e}),
            },
            "first_call_cpu_ms": r.first_call_cpu_ms,
            "first_call": r.first_call.as_ref().map(|a| match a {
                Ok(a) => json!({"bpf_calls": a.bpf_calls, "program_loads": a.program_loads}),
                Err(e) => json!({"error": e}),
            }),
            "beside": r.beside.as_ref().map(super::control::Batch::to_json),
        })).collect::<Vec<_>>(),
        "dataplane_ratios": ratios,
        "memory": results.memory.iter().map(|m| json!({
            "state": m.state,
            "requested_mappings": m.requested_mappings,
            "total_bytes_memlock": memory::total_memlock(&m.maps),
            "maps": memory::to_json(&m.maps),
        })).collect::<Vec<_>>(),
        "connect": {
            "what": "UDP connect() calls/s of a node process to an unrelated remote port",
            "reps": results.connect.iter().map(|r| json!({"hooked": r.hooked, "bare": r.bare, "empty_program": r.floor})).collect::<Vec<_>>(),
            "hooked_over_bare": mm_json(&results.connect_ratio()),
            "empty_program_over_bare": mm_json(&results.connect_floor_ratio()),
            "hooked_over_empty_program": mm_json(&results.connect_over_floor_ratio()),
        },
        "program_costs": results.program_costs.iter().map(|c| json!({
            "load": c.load,
            "program": c.program,
            "runs": c.runs,
            "ns_per_run": c.ns_per_run,
            "units": c.under.map(|u| u.units),
        })).collect::<Vec<_>>(),
        "line_profiles": results.profiles.iter().map(|p| json!({
            "load": p.load,
            "units": p.units,
            "seconds": p.seconds,
            "period_ns": p.profile.period_ns,
            "samples": p.profile.samples,
            "in_programs": p.profile.in_programs(),
            "places": p.profile.ranked().into_iter().map(|(place, samples)| json!({
                "place": place.to_string(),
                "function": place.function,
                "samples": samples,
                "ns_per_unit": p.ns_per_unit(samples),
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "gap_account": gap_rows(results).iter().map(|row| json!({
            "load": row.load,
            "program_ns_per_unit": row.program_ns,
            "runs_per_unit": row.runs,
            "gap_ns_per_unit": row.gap_ns,
        })).collect::<Vec<_>>(),
        "skipped": results.skipped,
    })
}

/// `median (min)` of per-repetition values with `digits` decimals.
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

/// The hairpin rows: a pod dials nodeIP:hostPort, ebpf-portmap and
/// iptables portmap side by side, every rate with its error count.
fn hairpin_table(md: &mut String, results: &Results) {
    let _ = writeln!(md, "## Hairpin\n");
    if results.hairpin.is_empty() {
        let _ = writeln!(md, "Not measured in this run.\n");
        return;
    }
    let _ = writeln!(
        md,
        "A pod dials the node's address and a hostPort mapped to itself or to another pod on the same bridge; \
         the pods are outside the cgroup the socket hooks are attached to, so their traffic takes the packet \
         path (masqueraded back into the bridge). Connect+request+close dials a server that closes first, so \
         the server holds every closed tuple in TIME_WAIT. The plugins are interleaved slice by slice. \
         Each cell: median rate over the repetitions (min in brackets), and the errors over all repetitions.\n"
    );
    let _ = writeln!(
        md,
        "| path | family | test | unit | ebpf-portmap | iptables portmap | nftables portmap | ebpf/iptables | ebpf/nftables |"
    );
    let _ = writeln!(
        md,
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    );
    for route in Route::BOTH {
        for family in Family::BOTH {
            for test in hairpin::TESTS {
                let rate = |flavor| {
                    results
                        .hairpin_cell(route, family, test, flavor)
                        .map_or("n/a".into(), |c| rate_cell(test, &c.reps))
                };
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                    route.title(),
                    family.title(),
                    test.title(),
                    test.unit(),
                    rate(Flavor::Ours),
                    rate(Flavor::Upstream),
                    rate(Flavor::Nftables),
                    cell(
                        &results.hairpin_ratio(Flavor::Upstream, route, family, test),
                        3
                    ),
                    cell(
                        &results.hairpin_ratio(Flavor::Nftables, route, family, test),
                        3
                    ),
                );
            }
        }
    }
    let _ = writeln!(md);
}

/// Nodes of real pods (issue 36) and STATUS (issue 33).
fn pods_table(md: &mut String, results: &Results) {
    let _ = writeln!(
        md,
        "## Nodes of real pods
"
    );
    if results.pods.is_empty() && results.status.is_empty() {
        let _ = writeln!(
            md,
            "Not measured in this run (`--only pods` measures it alone).\n"
        );
        return;
    }
    let _ = writeln!(
        md,
        "Every pod is a network namespace whose `eth0` is a veth on the node's bridge, attached by the \
         reference `bridge` + `host-local` and ebpf-portmap (one TCP and one UDP mapping), as a runtime runs the \
         chain; the 10-mapping row gives each of those pods 10 mappings (ebpf-portmap alone: DEL, then ADD with \
         the pod's own prevResult). One more pod: a real pod attached by bridge + host-local, then the \
         port-mapping plugin alone with a new container ID per operation and one TCP and one UDP mapping, \
         ADD then DEL, op by op against an empty node (\"vs empty\"). Each plugin is timed on the node in its own \
         steady state: ebpf-portmap while no rule of upstream portmap exists on either node (its ADD and DEL read \
         upstream's whole state when there is any, as on a node switching from it); then iptables and nftables \
         portmap on the same pods with their rules for them: iptables portmap's are real ADDs for the first {}, \
         copies of the last one's rules beyond; nftables portmap's (upstream 1.9.x, `backend: nftables`) all its \
         own real ADDs. Both are removed again before the next shape. \
         Latency: median over the repetitions of each repetition's p50 (worst in brackets); CPU: median CPU \
         time of the plugin process (and, for iptables portmap, the `iptables` it runs). What one ADD or DEL of \
         ebpf-portmap does is counted on an untimed run: `bpf()` calls with strace, netlink reads, bytes and \
         records from the plugin's own debug account (`EPM_LOG_LEVEL=debug`).\n",
        super::pods::UPSTREAM_REAL_PODS
    );
    let _ = writeln!(
        md,
        "| node | plugin | verb | ops/rep | p50 | vs empty | CPU ms/op | bpf() calls | netlink reads / bytes | link / address records | peer / ebpf |"
    );
    let _ = writeln!(
        md,
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    );
    for shape in POD_SHAPES {
        for flavor in PLUGINS {
            for verb in Verb::BOTH {
                let Some(c) = results.pod_cell(flavor, shape, verb) else {
                    continue;
                };
                let count = |f: &dyn Fn(&CallAccount) -> String| match &c.account {
                    None => String::new(),
                    Some(Ok(a)) => f(a),
                    Some(Err(e)) => format!("not counted: {}", e.replace('|', "/")),
                };
                let key =
                    |a: &CallAccount, k: &str| a.netlink.get(k).map_or("?".into(), u64::to_string);
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                    shape.label(),
                    flavor.label(),
                    verb.name(),
                    c.reps.first().map_or(0, super::control::Batch::ops),
                    latency_cell(&pct_per_rep(&c.reps, Pct::P50)),
                    cell(&c.ratio_to_empty(Pct::P50), 2),
                    latency_cell(&cpu_per_rep(&c.reps)),
                    count(&|a| a.bpf_calls.to_string()),
                    count(&|a| format!(
                        "{} / {}",
                        key(a, "netlink_reads"),
                        key(a, "netlink_bytes")
                    )),
                    count(&|a| format!(
                        "{} / {}",
                        key(a, "link_records"),
                        key(a, "address_records")
                    )),
                    if matches!(flavor, Flavor::Upstream | Flavor::Nftables) {
                        cell(&results.pod_speedup(flavor, shape, verb), 1)
                    } else {
                        String::new()
                    },
                );
            }
        }
    }
    let _ = writeln!(
        md,
        "\nebpf-portmap's `bpf()` calls by command (one counted call each):\n"
    );
    for c in results.pods.iter().filter(|c| c.flavor == Flavor::Ours) {
        if let Some(a) = c.counted() {
            let by: Vec<String> = a
                .bpf_by_command
                .iter()
                .map(|(command, calls)| format!("{command} {calls}"))
                .collect();
            let _ = writeln!(
                md,
                "- {}, {}: {}",
                c.shape.label(),
                c.verb.name(),
                by.join(", ")
            );
        }
    }
    let _ = writeln!(md, "\nHow each node was reached:\n");
    for p in &results.pod_prefill {
        let _ = writeln!(
            md,
            "- {}, {}: {} ({:.1} s{})",
            p.shape.label(),
            p.flavor.label(),
            p.method,
            p.seconds,
            p.nat_rules
                .map_or(String::new(), |n| format!(", {n} {}", rules_of(p.flavor)))
        );
    }
    let _ = writeln!(md, "\n### STATUS\n");
    let _ = writeln!(
        md,
        "ebpf-portmap's STATUS (cniVersion 1.1.0) as containerd 2.x sends it about every 5 s: CPU time per call \
         (user + system of the plugin process, wait4), latency, and what more calls do under strace (`bpf()` \
         calls, of them `BPF_PROG_LOAD`: programs loaded).\n"
    );
    let _ = writeln!(
        md,
        "| node | calls | CPU ms/call p50 (max) | latency p50 | failed | traced calls: bpf() / programs loaded |"
    );
    let _ = writeln!(md, "| --- | --- | --- | --- | --- | --- |");
    for row in &results.status {
        let max = row.calls.cpu_ms.iter().copied().fold(f64::NAN, f64::max);
        let _ = writeln!(
            md,
            "| {} | {} | {} ({}) | {} | {} | {} |",
            row.state,
            row.calls.ops(),
            row.calls.cpu_p50().map_or("n/a".into(), fmt_ms),
            fmt_ms(max),
            row.calls
                .percentiles()
                .map_or("n/a".into(), |p| fmt_ms(p.p50)),
            row.calls.failures,
            match &row.account {
                Ok(a) => format!(
                    "{}: {} / {}",
                    row.traced_calls, a.bpf_calls, a.program_loads
                ),
                Err(e) => format!("not counted: {}", e.replace('|', "/")),
            }
        );
        if let (Some(cpu), Some(first)) = (row.first_call_cpu_ms, &row.first_call) {
            let _ = writeln!(
                md,
                "| {}: the first call after the probe record was written | 1 | {} | | | {} |",
                row.state,
                fmt_ms(cpu),
                match first {
                    Ok(a) => format!("the very first call: {} / {}", a.bpf_calls, a.program_loads),
                    Err(e) => format!("not counted: {}", e.replace('|', "/")),
                }
            );
        }
    }
    let _ = writeln!(md);
}

/// The paired ratio `numerator` / `denominator` of one dataplane cell,
/// as a table cell.
fn ratio_cell(
    results: &Results,
    size: usize,
    test: Test,
    numerator: Flavor,
    denominator: Flavor,
) -> String {
    cell(&results.data_ratio(size, test, numerator, denominator), 3)
}

fn cell(values: &[f64], digits: usize) -> String {
    match MinMedian::of(values) {
        Some(s) => format!("{:.digits$} ({:.digits$})", s.median, s.min),
        None => "n/a".to_owned(),
    }
}

/// A latency cell: median over repetitions, worst repetition in brackets.
fn latency_cell(values: &[f64]) -> String {
    match MinMedian::of(values) {
        Some(s) => format!("{} ({})", fmt_ms(s.median), fmt_ms(s.max)),
        None => "n/a".to_owned(),
    }
}

fn fmt_ms(value: f64) -> String {
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
fn rate_cell(test: Test, reps: &[RunResult]) -> String {
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

/// Repetitions as JSON, each with its errors.
fn reps_json(reps: &[RunResult]) -> Vec<Value> {
    reps.iter()
        .map(|r| {
            json!({"rate": r.rate, "errors": r.errors, "connect_errors": r.connect_errors, "seconds": r.seconds})
        })
        .collect()
}

fn fmt_rate(test: Test, value: f64) -> String {
    match test {
        Test::TcpStream => format!("{value:.2}"),
        _ => format!("{value:.0}"),
    }
}

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

fn total_entries(maps: &std::collections::BTreeMap<String, MapInfo>, name: &str) -> String {
    maps.get(name)
        .and_then(|m| m.entries)
        .map_or("n/a".into(), |e| e.to_string())
}

/// Entries of the three conntrack tables together (open TCP, closed TCP,
/// every other protocol), `n/a` when none is pinned.
fn conntrack_entries(maps: &std::collections::BTreeMap<String, MapInfo>) -> String {
    let counts: Vec<u64> = memory::CONNTRACK_TABLES
        .iter()
        .filter_map(|name| maps.get(*name).and_then(|m| m.entries))
        .collect();
    if counts.is_empty() {
        "n/a".into()
    } else {
        counts.iter().sum::<u64>().to_string()
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.2} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// The Markdown summary. `plots` are linked by file name (same directory).
pub fn markdown(
    results: &Results,
    targets: &[TargetRow],
    meta: &Value,
    plots: &[Plot],
    notes: &[String],
) -> String {
    let mut md = String::new();
    let date = meta["date"].as_str().unwrap_or("?");
    let _ = writeln!(md, "# ebpf-portmap benchmark, {date}\n");
    let _ = writeln!(
        md,
        "Generated by `cargo xtask bench`; every number below was measured in this one run on this machine. \
         The full record, every repetition included, is `{date}.json`.\n"
    );
    let _ = writeln!(md, "| | |\n| --- | --- |");
    for (key, label) in [
        ("kernel", "kernel"),
        ("cpus", "CPUs"),
        ("reference_plugin", "reference plugin"),
        ("iptables", "iptables"),
        ("ebpf_portmap_bin", "ebpf-portmap binary"),
        ("source", "ebpf-portmap built from"),
        ("ebpf_sources", "its eBPF object compiled from"),
        ("ebpf_sources_digest", "digest of its eBPF sources"),
        ("baseline_bin", "baseline build (control plane)"),
        ("baseline_source", "baseline built from"),
        (
            "baseline_ebpf_sources",
            "the baseline's eBPF object compiled from",
        ),
        ("sections", "sections run"),
        ("method", "method"),
        ("total_seconds", "total bench time (s)"),
        ("loadavg_before", "load average before (1/5/15 min)"),
        ("loadavg_after", "load average after"),
    ] {
        if let Some(value) = meta.get(key).filter(|value| !value.is_null()) {
            let text = match value {
                Value::String(s) => s.clone(),
                Value::Number(n) => n.as_f64().map_or(n.to_string(), |f| format!("{f:.0}")),
                Value::Array(items) if items.is_empty() => continue,
                Value::Array(items) => items
                    .iter()
                    .map(|item| {
                        item.as_str()
                            .map_or_else(|| item.to_string(), str::to_owned)
                    })
                    .collect::<Vec<_>>()
                    .join(", "),
                other => other.to_string(),
            };
            let _ = writeln!(md, "| {label} | {text} |");
        }
    }

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
                    let ops = c.reps.first().map_or(0, super::control::Batch::ops);
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
            let col = |c: Option<&super::results::ScaleCell>, which: Pct| {
                c.map_or("n/a".into(), |c| latency_cell(&pct_per_rep(&c.reps, which)))
            };
            let ratio = |c: Option<&super::results::ScaleCell>| {
                c.map_or("n/a".into(), |c| cell(&c.ratio_to_empty(Pct::P50), 2))
            };
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {how} |",
                flavor.label(),
                size_label(size),
                add.and_then(|c| c.reps.first())
                    .map_or(0, super::control::Batch::ops),
                col(add, Pct::P50),
                col(add, Pct::P99),
                ratio(add),
                col(del, Pct::P50),
                col(del, Pct::P99),
                ratio(del),
            );
        }
    }

    let _ = writeln!(md, "\n## Dataplane\n");
    let _ = writeln!(
        md,
        "Client namespace -> node IP:hostPort -> container, for ebpf-portmap, iptables portmap and nftables portmap; \
         client -> container IP (routed by the node, no translation, no port-mapping plugin) for direct. \
         \"fast\" is ebpf-portmap with `fastPath` on (translated packets handed straight to the container's veth, \
         answers straight to the client's interface), measured in the same world with the node's flag switched per slice. \
         Each cell: median rate over the repetitions (min in brackets). Ratios are paired by repetition.\n"
    );
    for &size in &results.sizes {
        let _ = writeln!(md, "### {} existing mappings\n", size_label(size));
        let _ = writeln!(
            md,
            "| test | unit | ebpf-portmap | ebpf-portmap fast | iptables portmap | nftables portmap | direct | direct, ebpf-portmap loaded | ebpf/direct | fast/direct | iptables/direct | nftables/direct | ebpf/iptables | fast/iptables | ebpf/nftables | fast/nftables | loaded/direct |"
        );
        let _ = writeln!(
            md,
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
        );
        for test in Test::ALL {
            let rate = |path: Flavor| match results.data_cell(size, test, path) {
                Some(c) => rate_cell(test, &c.reps),
                None => results
                    .data
                    .iter()
                    .find(|c| c.size == size && c.test == test && c.path == path)
                    .and_then(|c| c.skipped.clone())
                    .map_or("n/a".into(), |r| format!("skipped: {r}")),
            };
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                test.title(),
                test.unit(),
                rate(Flavor::Ours),
                rate(Flavor::OursFast),
                rate(Flavor::Upstream),
                rate(Flavor::Nftables),
                rate(Flavor::Plain),
                rate(Flavor::OursDirect),
                ratio_cell(results, size, test, Flavor::Ours, Flavor::Plain),
                ratio_cell(results, size, test, Flavor::OursFast, Flavor::Plain),
                ratio_cell(results, size, test, Flavor::Upstream, Flavor::Plain),
                ratio_cell(results, size, test, Flavor::Nftables, Flavor::Plain),
                ratio_cell(results, size, test, Flavor::Ours, Flavor::Upstream),
                ratio_cell(results, size, test, Flavor::OursFast, Flavor::Upstream),
                ratio_cell(results, size, test, Flavor::Ours, Flavor::Nftables),
                ratio_cell(results, size, test, Flavor::OursFast, Flavor::Nftables),
                ratio_cell(results, size, test, Flavor::OursDirect, Flavor::Plain),
            );
        }
        let _ = writeln!(md);
    }

    hairpin_table(&mut md, results);
    pods_table(&mut md, results);

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
    floor_table(&mut md, results);
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
        gap_account(&mut md, results);
    }
    line_profiles(&mut md, results);

    let _ = writeln!(md, "## Memory\n");
    let _ = writeln!(
        md,
        "Kernel-charged memory (`bytes_memlock`) of ebpf-portmap's pinned maps, and their entry counts. \
         Mappings are stored once per address family (the container is dual-stack), so N requested \
         mappings are 2N `mappings` entries.\n"
    );
    let names: Vec<String> = results
        .memory
        .iter()
        .flat_map(|m| m.maps.keys().cloned())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let _ = write!(
        md,
        "| state | requested mappings | mappings entries | conntrack entries |"
    );
    for name in &names {
        let _ = write!(md, " {name} |");
    }
    let _ = writeln!(md, " total |");
    let _ = write!(md, "| --- | --- | --- | --- |");
    for _ in &names {
        let _ = write!(md, " --- |");
    }
    let _ = writeln!(md, " --- |");
    for row in &results.memory {
        let _ = write!(
            md,
            "| {} | {} | {} | {} |",
            row.state,
            row.requested_mappings,
            total_entries(&row.maps, "mappings"),
            conntrack_entries(&row.maps)
        );
        for name in &names {
            let _ = write!(
                md,
                " {} |",
                row.maps
                    .get(name)
                    .map_or("n/a".into(), |m| mib(m.bytes_memlock))
            );
        }
        let _ = writeln!(md, " {} |", mib(memory::total_memlock(&row.maps)));
    }

    let _ = writeln!(md, "\n## Plots\n");
    for plot in plots {
        let _ = writeln!(md, "![{}]({})\n", plot.title, plot.file_name);
    }
    let _ = writeln!(md, "## Method and notes\n");
    for note in notes {
        let _ = writeln!(md, "- {note}");
    }
    if !results.skipped.is_empty() {
        let _ = writeln!(md, "\nSkipped steps:\n");
        for skipped in &results.skipped {
            let _ = writeln!(md, "- {skipped}");
        }
    }
    md
}

fn median_of(values: &[f64]) -> Option<f64> {
    MinMedian::of(values).map(|s| s.median)
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
    plots.push(Plot {
        file_name: format!("{stem}-control-parallel.svg"),
        title: "Control-plane operations per second by number of parallel callers".into(),
        svg: BarChart {
            title:
                "ADD/DEL operations per second with 1, 16, 32 callers (log scale; higher is better)"
                    .into(),
            y_label: "ops/s".into(),
            series: PLUGINS.iter().map(|f| f.label().to_owned()).collect(),
            groups,
            log: true,
            reference_lines: Vec::new(),
        }
        .render(),
    });

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
    plots.push(Plot {
        file_name: format!("{stem}-scale.svg"),
        title: "ADD/DEL p50 latency by number of existing mappings".into(),
        svg: BarChart {
            title: "ADD/DEL of one more container, p50 by existing mappings (ms, log scale)".into(),
            y_label: "ms".into(),
            series: PLUGINS.iter().map(|f| f.label().to_owned()).collect(),
            groups,
            log: true,
            reference_lines: Vec::new(),
        }
        .render(),
    });

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
                (1.0, "direct = 1".into()),
                (0.99, "0.99 (not translated)".into()),
                (0.95, "0.95 (RR)".into()),
                (0.88, "0.88 (CRR)".into()),
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

/// One load of the gap account: what the programs cost per transaction
/// (or connection) against how much longer one takes than on the direct
/// path.
#[derive(Debug, Clone, PartialEq)]
struct GapRow {
    load: String,
    /// All programs' time per unit: the sum of runs x ns/run over the
    /// units the measured run completed.
    program_ns: f64,
    /// Program runs per unit.
    runs: f64,
    /// 1/rate of the path minus 1/rate of the direct path (median rates
    /// of the dataplane section at the same size), in ns; `None` without
    /// both cells.
    gap_ns: Option<f64>,
}

fn gap_rows(results: &Results) -> Vec<GapRow> {
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

/// A table cell's text: its pipes escaped, backticks kept.
fn md_escape(text: &str) -> String {
    text.replace('|', "\\|")
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::{ConnectRep, CostLoad, LoadProfile, ProgramCost};
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

        use super::super::control::Batch;
        use super::super::load::RunResult;
        use super::super::memory::MapInfo;
        use super::super::results::{ControlCell, DataCell, MemoryRow, Prefill, ScaleCell};

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
                    for flavor in PLUGINS {
                        results.hairpin.push(super::super::results::HairpinCell {
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
        let targets = super::super::results::judge(&results);
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
                "| pod -> nodeIP:hostPort of another pod | IPv6 | TCP connect+request+close | conn/s | 10 (10), 3 errors: 3 connects failed | 10 (10), 3 errors: 3 connects failed | 10 (10), 3 errors: 3 connects failed | 1.000 (1.000) | 1.000 (1.000) |"
            ),
            "{md}"
        );
        let json = to_json(&results, &targets, &meta);
        assert_eq!(json["hairpin"].as_array().map(Vec::len), Some(36));
        assert_eq!(json["hairpin"][0]["connect_errors"], 3);
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
            md.contains(
                "| TCP request/response | 0 | 1.000 (1.000) | 1.000 (1.000) | 1.000 (1.000) |"
            ),
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
        let targets = super::super::results::judge(&results);
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
}
