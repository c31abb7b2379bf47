//! The pods section's tables: one more pod on nodes of real pods, what one
//! call does, and STATUS on every node state.

use std::fmt::Write as _;

use super::cells::{PLUGINS, cell, fmt_ms, latency_cell, rules_of};
use crate::results::{
    CallAccount, POD_SHAPES, Results, UPSTREAM_REAL_PODS, Verb, cpu_per_rep, pct_per_rep,
};
use crate::stats::Pct;
use crate::world::Flavor;

/// Nodes of real pods (issue 36) and STATUS (issue 33).
pub(super) fn pods_table(md: &mut String, results: &Results) {
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
         portmap on the same pods with their rules for them: iptables portmap's are real ADDs for the first {UPSTREAM_REAL_PODS}, \
         copies of the last one's rules beyond; nftables portmap's (upstream 1.9.x, `backend: nftables`) all its \
         own real ADDs. Both are removed again before the next shape. \
         Latency: median over the repetitions of each repetition's p50 (worst in brackets); CPU: median CPU \
         time of the plugin process (and, for iptables portmap, the `iptables` it runs). What one ADD or DEL of \
         ebpf-portmap does is counted on an untimed run: `bpf()` calls with strace, netlink reads, bytes and \
         records from the plugin's own debug account (`EPM_LOG_LEVEL=debug`).\n"
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
                    c.reps.first().map_or(0, crate::control::Batch::ops),
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
