//! The machine-readable record of a run: every repetition of every cell,
//! the targets and the run's metadata.

use serde_json::{Value, json};

use super::cost::gap_rows;
use crate::control::Batch;
use crate::load::{RunResult, Test};
use crate::memory;
use crate::results::{
    Results, TargetRow, cpu_per_rep, errors_of, failures, ops_per_s_per_rep, pct_per_rep,
};
use crate::stats::{MinMedian, Pct};
use crate::world::Flavor;

fn mm_json(values: &[f64]) -> Value {
    match MinMedian::of(values) {
        Some(s) => json!({ "min": s.min, "median": s.median, "max": s.max, "n": s.n }),
        None => Value::Null,
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
        Flavor::OursSockets => "ebpf-portmap-container-sockets",
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
                "reps": batches_json(&c.reps),
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
                "reps": batches_json(&c.reps),
                "empty_node_reps": batches_json(&c.empty_reps),
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
                "refused_syns": c.refused_syns,
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
        "flood": results.flood.iter().map(|r| json!({
            "plugin": flavor_key(r.flavor),
            "family": r.family,
            "conntrack_new_entries": r.table,
            "flood_flows_per_protocol": r.flows,
            "flood_seconds": r.flood_s,
            "live_flows_per_protocol": r.live,
            "tcp_container_first": r.tcp_container_first,
            "tcp_client_first": r.tcp_client_first,
            "udp_container_first": r.udp_container_first,
            "udp_client_first": r.udp_client_first,
            "new_flows_before_conn_per_s": r.crr_before.rate,
            "new_flows_during_conn_per_s": r.crr_during.rate,
            "new_flow_errors_before": errors_of(std::slice::from_ref(&r.crr_before)).0,
            "new_flow_errors_during": errors_of(std::slice::from_ref(&r.crr_during)).0,
            "evicted_live_entries": r.evicted.map(|e| e.live),
            "evicted_unreplied_entries": r.evicted.map(|e| e.unreplied),
        })).collect::<Vec<_>>(),
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
            "reps": batches_json(&c.reps),
            "empty_node_reps": batches_json(&c.empty_reps),
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
            "beside": r.beside.as_ref().map(Batch::to_json),
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

/// Control-plane repetitions as JSON, one batch each.
fn batches_json(reps: &[Batch]) -> Vec<Value> {
    reps.iter().map(Batch::to_json).collect()
}

/// Repetitions as JSON, each with its errors.
fn reps_json(reps: &[RunResult]) -> Vec<Value> {
    reps.iter()
        .map(|r| {
            json!({"rate": r.rate, "errors": r.errors, "connect_errors": r.connect_errors, "seconds": r.seconds})
        })
        .collect()
}
