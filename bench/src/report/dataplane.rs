//! The dataplane section's tables: the rate of every test through every
//! path, and their paired ratios, per prefilled size.

use std::fmt::Write as _;

use super::cells::{rate_cell, ratio_cell};
use crate::load::Test;
use crate::results::{Results, size_label};
use crate::world::Flavor;

/// One table per prefilled size.
pub(super) fn dataplane_section(md: &mut String, results: &Results) {
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
}
