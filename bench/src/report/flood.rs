//! The flood section's table: idle live flows and the new-flow rate
//! through a flood of spoofed new flows (issue 53).

use std::fmt::Write as _;

use crate::results::{FloodRow, Results};
use crate::stats;
use crate::world::Flavor;

/// One row per side and family: the idle flows alive after the flood
/// (worst repetition), the new-flow rate before and during it (medians),
/// and what the flood was.
pub(super) fn flood_table(md: &mut String, results: &Results) {
    let _ = writeln!(md, "## Flood\n");
    let Some(first) = results.flood.first() else {
        let _ = writeln!(md, "Not measured in this run.\n");
        return;
    };
    let _ = writeln!(
        md,
        "A node with kube-proxy's `ct state invalid drop` at FORWARD publishes a TCP and a UDP port of a \
         container; the client holds {live} idle TCP connections and {live} idle assured UDP sessions \
         (answered, and talking again 2.1 s after their first datagram). A neighbour then sends spoofed SYNs \
         and datagrams to the same two ports from every CPU, each pair a new flow: at least {flows} of each \
         (three times ebpf-portmap's `conntrack_new` of {table} entries; iptables and nftables portmap have \
         the kernel's conntrack table instead, the same flood for every side), new flows all the way for at \
         least 2 s; the container answers the flood's datagrams. Alive: the container's first message after \
         the flood, then the client's, each within a second (the worst repetition). New flows: TCP \
         connect+request+close from the client to a third published port for as long as the flood lasts, \
         during it and for the same time before it (median of the repetitions, connections/s). Evicted: what \
         ebpf-portmap's conntrack tables evicted over the flood by its own count (`status`'s `evictions`), \
         entries of live (assured) flows and of flows never assured, the most of any repetition.\n",
        live = first.live,
        flows = first.flows.min(3 * first.table),
        table = first.table,
    );
    let _ = writeln!(
        md,
        "| side | family | idle TCP alive | idle UDP alive | new flows before (conn/s) | during (conn/s) | during/before | flood (flows, s) | evicted: live, unreplied (entries) |"
    );
    let _ = writeln!(
        md,
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    );
    for family in ["v4", "v6"] {
        for flavor in [
            Flavor::Ours,
            Flavor::OursFast,
            Flavor::Upstream,
            Flavor::Nftables,
        ] {
            let rows: Vec<&FloodRow> = results
                .flood
                .iter()
                .filter(|r| r.flavor == flavor && r.family == family)
                .collect();
            let Some(row) = rows.first() else {
                continue;
            };
            let worst =
                |alive: fn(&FloodRow) -> u32| rows.iter().map(|r| alive(r)).min().unwrap_or(0);
            let median = |values: Vec<f64>| stats::median(&values).unwrap_or(0.0);
            let evicted = if rows.iter().any(|r| r.evicted.is_some()) {
                let most = |of: fn(&crate::results::Evicted) -> u64| {
                    rows.iter()
                        .filter_map(|r| r.evicted.as_ref().map(of))
                        .max()
                        .unwrap_or(0)
                };
                format!("{}, {}", most(|e| e.live), most(|e| e.unreplied))
            } else {
                "n/a".to_owned()
            };
            let _ = writeln!(
                md,
                "| {} | {family} | {}/{} | {}/{} | {:.0} | {:.0} | {:.2} | {:.0}, {:.2} | {evicted} |",
                flavor.label(),
                worst(FloodRow::tcp_alive),
                row.live,
                worst(FloodRow::udp_alive),
                row.live,
                median(rows.iter().map(|r| r.crr_before.rate).collect()),
                median(rows.iter().map(|r| r.crr_during.rate).collect()),
                median(rows.iter().map(|r| r.crr_kept()).collect()),
                median(rows.iter().map(|r| r.flows as f64).collect()),
                median(rows.iter().map(|r| r.flood_s).collect()),
            );
        }
    }
    let _ = writeln!(md);
}
