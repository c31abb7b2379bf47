//! The hairpin section's table: a pod dials nodeIP:hostPort.

use std::fmt::Write as _;

use super::cells::{cell, rate_cell};
use crate::load::Test;
use crate::results::Results;
use crate::results::hairpin_rows::{self as hairpin, Family, Route};
use crate::world::Flavor;

/// The hairpin rows: a pod dials nodeIP:hostPort, ebpf-portmap and
/// iptables portmap side by side, every rate with its error count.
pub(super) fn hairpin_table(md: &mut String, results: &Results) {
    let _ = writeln!(md, "## Hairpin\n");
    if results.hairpin.is_empty() {
        let _ = writeln!(md, "Not measured in this run.\n");
        return;
    }
    let _ = writeln!(
        md,
        "A pod dials the node's address and a hostPort mapped to itself or to another pod on the same bridge; \
         the pods are outside the cgroup the socket hooks are attached to, so their traffic takes the packet \
         path (masqueraded back into the bridge). The containerSockets column is ebpf-portmap with \
         `containerSockets` on in a world of its own, whose pods' clients run in its hooked cgroup: their \
         connections are pointed at the container at the socket (no masquerade; the answering pod sees the \
         client pod), and sockets/packet is its rate over ebpf-portmap's packet path. Connect+request+close \
         dials a server that closes first, so the server holds every closed tuple in TIME_WAIT. The plugins \
         are interleaved slice by slice. Each cell: median rate over the repetitions (min in brackets), \
         the errors over all repetitions, and for TCP the SYNs a TIME_WAIT of the serving pod refused over \
         all repetitions (`TcpExtPAWSTimewait` of its namespace: a masquerade tuple given to a client other \
         than its last, whose TCP timestamps the container takes for old; each one costs its client a RST \
         and the SYN again two jiffies later, and no error count shows it).\n"
    );
    let _ = writeln!(
        md,
        "| path | family | test | unit | ebpf-portmap | ebpf-portmap containerSockets | iptables portmap | nftables portmap | ebpf/iptables | ebpf/nftables | sockets/packet |"
    );
    let _ = writeln!(
        md,
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    );
    for route in Route::BOTH {
        for family in Family::BOTH {
            for test in hairpin::TESTS {
                let rate = |flavor| {
                    results
                        .hairpin_cell(route, family, test, flavor)
                        .map_or("n/a".into(), |c| {
                            let rate = rate_cell(test, &c.reps);
                            match test {
                                Test::UdpRr => rate,
                                _ => format!("{rate}, {}", refused_syns(c.refused_syns_total())),
                            }
                        })
                };
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                    route.title(),
                    family.title(),
                    test.title(),
                    test.unit(),
                    rate(Flavor::Ours),
                    rate(Flavor::OursSockets),
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
                    cell(
                        &results.hairpin_ratio_of(
                            Flavor::OursSockets,
                            Flavor::Ours,
                            route,
                            family,
                            test
                        ),
                        3
                    ),
                );
            }
        }
    }
    let _ = writeln!(md);
}

/// `n` SYNs refused by a TIME_WAIT, in words.
fn refused_syns(n: u64) -> String {
    match n {
        1 => "1 SYN refused".into(),
        n => format!("{n} SYNs refused"),
    }
}
