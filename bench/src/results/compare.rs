//! Finding a run's cells and pairing them: the per-repetition ratios
//! every target and plot is taken from (ebpf-portmap against each peer,
//! against the direct path, against an empty node or a baseline build).

use super::hairpin_rows::{Family, Route};
use super::model::{
    ControlCell, DataCell, HairpinCell, PodCell, Results, ScaleCell, Scope, Shape, Verb,
    pct_per_rep, size_label,
};
use crate::load::{RunResult, Test};
use crate::stats::{Pct, paired_ratios};
use crate::world::Flavor;

/// The upstream plugins ebpf-portmap is measured against: Debian's
/// iptables portmap 1.1.1 and portmap 1.9.x with its nftables backend.
pub const PEERS: [Flavor; 2] = [Flavor::Upstream, Flavor::Nftables];

/// How a peer's target ids differ from iptables portmap's.
pub fn peer_id(peer: Flavor, iptables_id: &str) -> String {
    match peer {
        Flavor::Nftables => format!("{iptables_id}-vs-nftables"),
        _ => iptables_id.to_owned(),
    }
}

impl Results {
    /// `detail`, or why `peer` was not measured at all.
    pub(super) fn peer_detail(&self, peer: Flavor, values: &[f64], detail: String) -> String {
        match (&self.nftables_skipped, peer, values.is_empty()) {
            (Some(reason), Flavor::Nftables, true) => format!("SKIP: {reason}"),
            _ => detail,
        }
    }
}

impl Results {
    pub fn control_cell(
        &self,
        scope: Scope,
        flavor: Flavor,
        verb: Verb,
        callers: usize,
    ) -> Option<&ControlCell> {
        self.control.iter().find(|c| {
            c.scope == scope && c.flavor == flavor && c.verb == verb && c.callers == callers
        })
    }

    pub fn scale_cell(&self, flavor: Flavor, size: usize, verb: Verb) -> Option<&ScaleCell> {
        self.scale
            .iter()
            .find(|c| c.flavor == flavor && c.size == size && c.verb == verb)
    }

    pub fn pod_cell(&self, flavor: Flavor, shape: Shape, verb: Verb) -> Option<&PodCell> {
        self.pods
            .iter()
            .find(|c| c.flavor == flavor && c.shape == shape && c.verb == verb)
    }

    /// Per repetition: `peer`'s p50 (iptables or nftables portmap) /
    /// ebpf-portmap p50 for one more pod on the node of `shape`'s pods, each
    /// plugin with its own rules for them only (see the pods module).
    pub fn pod_speedup(&self, peer: Flavor, shape: Shape, verb: Verb) -> Vec<f64> {
        match (
            self.pod_cell(peer, shape, verb),
            self.pod_cell(Flavor::Ours, shape, verb),
        ) {
            (Some(up), Some(ours)) => paired_ratios(
                &pct_per_rep(&up.reps, Pct::P50),
                &pct_per_rep(&ours.reps, Pct::P50),
            ),
            _ => Vec::new(),
        }
    }

    pub fn data_cell(&self, size: usize, test: Test, path: Flavor) -> Option<&DataCell> {
        self.data
            .iter()
            .find(|c| c.size == size && c.test == test && c.path == path && c.skipped.is_none())
    }

    /// Per repetition: rate over `numerator` / rate over `denominator`.
    pub fn data_ratio(
        &self,
        size: usize,
        test: Test,
        numerator: Flavor,
        denominator: Flavor,
    ) -> Vec<f64> {
        match (
            self.data_cell(size, test, numerator),
            self.data_cell(size, test, denominator),
        ) {
            (Some(n), Some(d)) => paired_ratios(&n.rates(), &d.rates()),
            _ => Vec::new(),
        }
    }

    pub fn hairpin_cell(
        &self,
        route: Route,
        family: Family,
        test: Test,
        flavor: Flavor,
    ) -> Option<&HairpinCell> {
        self.hairpin.iter().find(|c| {
            c.route == route && c.family == family && c.test == test && c.flavor == flavor
        })
    }

    /// Per repetition: ebpf-portmap's hairpin rate / `peer`'s (iptables or
    /// nftables portmap) on the same path (interleaved in each repetition).
    pub fn hairpin_ratio(
        &self,
        peer: Flavor,
        route: Route,
        family: Family,
        test: Test,
    ) -> Vec<f64> {
        self.hairpin_ratio_of(Flavor::Ours, peer, route, family, test)
    }

    /// Per repetition: `flavor`'s hairpin rate / `peer`'s on the same path
    /// (e.g. ebpf-portmap with `containerSockets` against its packet path).
    pub fn hairpin_ratio_of(
        &self,
        flavor: Flavor,
        peer: Flavor,
        route: Route,
        family: Family,
        test: Test,
    ) -> Vec<f64> {
        match (
            self.hairpin_cell(route, family, test, flavor),
            self.hairpin_cell(route, family, test, peer),
        ) {
            (Some(n), Some(d)) => paired_ratios(&n.rates(), &d.rates()),
            _ => Vec::new(),
        }
    }

    /// Every measurement of `flavor`'s hostPort paths, external and
    /// hairpin, named, with its repetitions.
    pub(super) fn measurements_of(&self, flavors: &[Flavor]) -> Vec<(String, &[RunResult])> {
        let external = self
            .data
            .iter()
            .filter(|c| flavors.contains(&c.path) && c.skipped.is_none())
            .map(|c| {
                (
                    format!(
                        "{}, external, {}, {} mappings",
                        c.path.label(),
                        c.test.title(),
                        size_label(c.size)
                    ),
                    c.reps.as_slice(),
                )
            });
        let hairpin = self
            .hairpin
            .iter()
            .filter(|c| flavors.contains(&c.flavor))
            .map(|c| {
                (
                    format!(
                        "{}, hairpin {} ({}), {}",
                        c.flavor.label(),
                        c.route.title(),
                        c.family.title(),
                        c.test.title()
                    ),
                    c.reps.as_slice(),
                )
            });
        external.chain(hairpin).collect()
    }

    /// Per repetition: connect() rate with the socket hooks / without.
    pub fn connect_ratio(&self) -> Vec<f64> {
        self.connect.iter().map(|r| r.hooked / r.bare).collect()
    }

    /// Per repetition: connect() rate with the empty connect4 program /
    /// without any.
    pub fn connect_floor_ratio(&self) -> Vec<f64> {
        self.connect
            .iter()
            .filter_map(|r| r.floor.map(|f| f / r.bare))
            .collect()
    }

    /// Per repetition: connect() rate with the socket hooks / with the
    /// empty connect4 program: what ebpf-portmap's own code costs.
    pub fn connect_over_floor_ratio(&self) -> Vec<f64> {
        self.connect
            .iter()
            .filter_map(|r| r.floor.map(|f| r.hooked / f))
            .collect()
    }

    /// Per repetition: upstream / ours for a sequential plugin-alone percentile.
    /// ebpf-portmap latency / the baseline build's, sequential, paired by
    /// repetition (both sides of a repetition interleaved op by op); empty
    /// without `--baseline-bin`.
    pub fn against_baseline(&self, verb: Verb, which: Pct) -> Vec<f64> {
        match (
            self.control_cell(Scope::AgainstBaseline, Flavor::Ours, verb, 1),
            self.control_cell(Scope::AgainstBaseline, Flavor::Baseline, verb, 1),
        ) {
            (Some(ours), Some(base)) => paired_ratios(
                &pct_per_rep(&ours.reps, which),
                &pct_per_rep(&base.reps, which),
            ),
            _ => Vec::new(),
        }
    }

    pub fn speedup(&self, peer: Flavor, verb: Verb, which: Pct) -> Vec<f64> {
        match (
            self.control_cell(Scope::Alone, peer, verb, 1),
            self.control_cell(Scope::Alone, Flavor::Ours, verb, 1),
        ) {
            (Some(up), Some(ours)) => paired_ratios(
                &pct_per_rep(&up.reps, which),
                &pct_per_rep(&ours.reps, which),
            ),
            _ => Vec::new(),
        }
    }
}
