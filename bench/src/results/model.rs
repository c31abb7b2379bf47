//! The data of one bench run: one cell type per measurement (control
//! plane, scale, pods, STATUS, dataplane, hairpin, prefills, memory, the
//! programs' cost), and [`Results`], which holds them all. Filled by the
//! sections, read by the comparisons, the judge and the report.

use std::collections::BTreeMap;

use super::hairpin_rows::{Family, Route};
use crate::control::Batch;
use crate::load::{RunResult, Test};
use crate::memory::MapInfo;
use crate::stats::{Pct, paired_ratios};
use crate::world::Flavor;

/// Port-mapping plugin alone, or the whole bridge + host-local + plugin chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Alone,
    Chain,
    /// The plugin alone, sequential, interleaved op by op with the
    /// baseline build (`--baseline-bin`) and nothing else.
    AgainstBaseline,
}

impl Scope {
    pub fn key(self) -> &'static str {
        match self {
            Scope::Alone => "plugin_alone",
            Scope::Chain => "chain",
            Scope::AgainstBaseline => "plugin_alone_vs_baseline",
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            Scope::Alone => "port-mapping plugin alone",
            Scope::Chain => "bridge + host-local + port-mapping plugin",
            Scope::AgainstBaseline => "port-mapping plugin alone, against the baseline build",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    Add,
    Del,
}

impl Verb {
    pub const BOTH: [Verb; 2] = [Verb::Add, Verb::Del];

    pub fn name(self) -> &'static str {
        match self {
            Verb::Add => "ADD",
            Verb::Del => "DEL",
        }
    }
}

/// Repetitions of one control-plane batch shape.
#[derive(Debug, Clone)]
pub struct ControlCell {
    pub scope: Scope,
    pub flavor: Flavor,
    pub verb: Verb,
    pub callers: usize,
    pub reps: Vec<Batch>,
}

/// Per-repetition values of a percentile.
pub fn pct_per_rep(reps: &[Batch], which: Pct) -> Vec<f64> {
    reps.iter()
        .filter_map(|b| b.percentiles().map(|p| p.get(which)))
        .collect()
}

/// Per-repetition median CPU time per operation.
pub fn cpu_per_rep(reps: &[Batch]) -> Vec<f64> {
    reps.iter().filter_map(Batch::cpu_p50).collect()
}

pub fn ops_per_s_per_rep(reps: &[Batch]) -> Vec<f64> {
    reps.iter().map(Batch::ops_per_s).collect()
}

pub fn failures(reps: &[Batch]) -> usize {
    reps.iter().map(|b| b.failures).sum()
}

/// ADD or DEL of one more container on a node holding `size` prefilled
/// mappings, with the same measured on an empty node in the same
/// repetition (`empty_reps`), for a paired ratio.
#[derive(Debug, Clone)]
pub struct ScaleCell {
    pub flavor: Flavor,
    pub size: usize,
    pub verb: Verb,
    pub reps: Vec<Batch>,
    pub empty_reps: Vec<Batch>,
    pub skipped: Option<String>,
}

impl ScaleCell {
    /// Per repetition: p50 here / p50 on the empty node.
    pub fn ratio_to_empty(&self, which: Pct) -> Vec<f64> {
        paired_ratios(
            &pct_per_rep(&self.reps, which),
            &pct_per_rep(&self.empty_reps, which),
        )
    }
}

/// A node of the pods section: `pods` real pods (a namespace each, its veth
/// on the bridge), `mappings_per_pod` host ports each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub pods: usize,
    pub mappings_per_pod: usize,
}

impl Shape {
    pub const fn new(pods: usize, mappings_per_pod: usize) -> Shape {
        Shape {
            pods,
            mappings_per_pod,
        }
    }

    pub fn mappings(self) -> usize {
        self.pods * self.mappings_per_pod
    }

    /// `1000x2`: ids and JSON.
    pub fn key(self) -> String {
        format!("{}x{}", self.pods, self.mappings_per_pod)
    }

    pub fn label(self) -> String {
        format!(
            "{} pods of {} mappings",
            size_label(self.pods),
            self.mappings_per_pod
        )
    }
}

/// The node shapes of the pods section, in the order they are filled (the
/// last one gives the pods of the one before 10 mappings each).
pub const POD_SHAPES: [Shape; 4] = [
    Shape::new(0, 2),
    Shape::new(250, 2),
    Shape::new(1000, 2),
    Shape::new(1000, 10),
];

/// Pods that iptables portmap gets by real ADDs in the pods section; the
/// others get copies of the last one's rules. Here, beside the shapes, for
/// the section that fills by it and the report that states it.
pub const UPSTREAM_REAL_PODS: usize = 10;

/// What one plugin call did, counted on an untimed run of it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CallAccount {
    /// `bpf()` syscalls (strace).
    pub bpf_calls: u64,
    /// Of them `BPF_PROG_LOAD`: programs the call loaded.
    pub program_loads: u64,
    /// The same calls by command, so a growth shows where it is.
    pub bpf_by_command: BTreeMap<String, u64>,
    /// The plugin's own account line: `netlink_reads`, `netlink_bytes`,
    /// `link_records`, `address_records` (empty for STATUS, which logs
    /// none).
    pub netlink: BTreeMap<String, u64>,
}

impl CallAccount {
    fn netlink(&self, key: &str) -> Option<u64> {
        self.netlink.get(key).copied()
    }

    /// Netlink messages received: link and address records.
    pub fn netlink_messages(&self) -> Option<u64> {
        Some(self.netlink("link_records")? + self.netlink("address_records")?)
    }

    pub fn summary(&self) -> String {
        let mut text = format!(
            "{} bpf() calls ({} program loads)",
            self.bpf_calls, self.program_loads
        );
        if !self.netlink.is_empty() {
            let pairs: Vec<String> = self
                .netlink
                .iter()
                .map(|(key, value)| format!("{key}={value}"))
                .collect();
            text.push_str(&format!(", {}", pairs.join(" ")));
        }
        text
    }
}

/// ADD or DEL of the port-mapping plugin alone for one more pod on the node
/// of `shape`, and the same on an empty node in the same repetition
/// (`empty_reps`), op by op; with what one such call of ebpf-portmap did.
#[derive(Debug, Clone)]
pub struct PodCell {
    pub shape: Shape,
    pub flavor: Flavor,
    pub verb: Verb,
    pub reps: Vec<Batch>,
    pub empty_reps: Vec<Batch>,
    /// ebpf-portmap only; `Err` says why it could not be counted.
    pub account: Option<Result<CallAccount, String>>,
}

impl PodCell {
    /// Per repetition: p50 here / p50 on the empty node.
    pub fn ratio_to_empty(&self, which: Pct) -> Vec<f64> {
        paired_ratios(
            &pct_per_rep(&self.reps, which),
            &pct_per_rep(&self.empty_reps, which),
        )
    }

    pub fn counted(&self) -> Option<&CallAccount> {
        self.account.as_ref().and_then(|a| a.as_ref().ok())
    }
}

/// How the pods node reached a shape, for one plugin.
#[derive(Debug, Clone)]
pub struct PodPrefill {
    pub shape: Shape,
    pub flavor: Flavor,
    pub method: String,
    pub seconds: f64,
    pub nat_rules: Option<usize>,
}

/// STATUS calls of ebpf-portmap on one node state.
#[derive(Debug, Clone)]
pub struct StatusRow {
    pub key: String,
    pub state: String,
    /// The timed calls (latency and CPU time each).
    pub calls: Batch,
    /// Summed over `traced_calls` more calls under strace.
    pub account: Result<CallAccount, String>,
    pub traced_calls: usize,
    /// The very first STATUS on a fresh pin root: what it cost and did.
    pub first_call_cpu_ms: Option<f64>,
    pub first_call: Option<Result<CallAccount, String>>,
    /// The ADDs running at the same time, if any.
    pub beside: Option<Batch>,
}

/// Repetitions of one dataplane test over one path at one size.
#[derive(Debug, Clone)]
pub struct DataCell {
    pub size: usize,
    pub test: Test,
    pub path: Flavor,
    pub reps: Vec<RunResult>,
    pub skipped: Option<String>,
}

impl DataCell {
    pub fn rates(&self) -> Vec<f64> {
        self.reps.iter().map(|r| r.rate).collect()
    }

    pub fn errors(&self) -> u64 {
        self.reps.iter().map(|r| r.errors).sum()
    }

    pub fn connect_errors(&self) -> u64 {
        self.reps.iter().map(|r| r.connect_errors).sum()
    }
}

/// Repetitions of one hairpin test (a pod dialing nodeIP:hostPort) with
/// one plugin.
#[derive(Debug, Clone)]
pub struct HairpinCell {
    pub route: Route,
    pub family: Family,
    pub test: Test,
    pub flavor: Flavor,
    pub reps: Vec<RunResult>,
    /// Per repetition, the SYNs a TIME_WAIT of the serving pod refused
    /// (`TcpExtPAWSTimewait` of its namespace: a reused tuple whose last
    /// client's TCP timestamps were newer). Each one costs its client a
    /// RST and the SYN again two jiffies later (8 ms at HZ=250), which no
    /// error count shows.
    pub refused_syns: Vec<u64>,
}

impl HairpinCell {
    pub fn rates(&self) -> Vec<f64> {
        self.reps.iter().map(|r| r.rate).collect()
    }

    /// [`HairpinCell::refused_syns`] over all repetitions.
    pub fn refused_syns_total(&self) -> u64 {
        self.refused_syns.iter().sum()
    }
}

/// Errors over the repetitions of one measurement: `(all, connects)`.
pub fn errors_of(reps: &[RunResult]) -> (u64, u64) {
    (
        reps.iter().map(|r| r.errors).sum(),
        reps.iter().map(|r| r.connect_errors).sum(),
    )
}

/// A measurement's error count as every rate is shown with it: `0 errors`,
/// or how many connects failed and how many requests were lost.
pub fn error_count(errors: u64, connect_errors: u64) -> String {
    let lost = errors.saturating_sub(connect_errors);
    let parts: Vec<String> = [
        (connect_errors, "connects failed", "connect failed"),
        (lost, "requests lost", "request lost"),
    ]
    .iter()
    .filter(|(n, _, _)| *n > 0)
    .map(|&(n, many, one)| format!("{n} {}", if n == 1 { one } else { many }))
    .collect();
    if parts.is_empty() {
        "0 errors".to_owned()
    } else {
        format!(
            "{errors} error{}: {}",
            if errors == 1 { "" } else { "s" },
            parts.join(", ")
        )
    }
}

/// How a size was reached.
#[derive(Debug, Clone)]
pub struct Prefill {
    pub flavor: Flavor,
    pub size: usize,
    pub method: String,
    pub seconds: f64,
    /// Rules in both nat tables (upstream) after the prefill.
    pub nat_rules: Option<usize>,
    pub skipped: Option<String>,
}

/// Our maps in one state of the node.
#[derive(Debug, Clone)]
pub struct MemoryRow {
    pub state: String,
    pub requested_mappings: usize,
    pub maps: BTreeMap<String, MapInfo>,
}

/// Everything one run measured.
#[derive(Debug, Clone, Default)]
pub struct Results {
    pub control: Vec<ControlCell>,
    pub scale: Vec<ScaleCell>,
    pub data: Vec<DataCell>,
    /// Pods dialing nodeIP:hostPort (issue 37).
    pub hairpin: Vec<HairpinCell>,
    pub prefill: Vec<Prefill>,
    /// One more pod on nodes of real pods (issue 36).
    pub pods: Vec<PodCell>,
    pub pod_prefill: Vec<PodPrefill>,
    /// STATUS per node state (issue 33).
    pub status: Vec<StatusRow>,
    /// Live flows and new flows through a flood (issue 53).
    pub flood: Vec<FloodRow>,
    pub memory: Vec<MemoryRow>,
    pub sizes: Vec<usize>,
    /// connect() rate of a node process to an unrelated remote port with
    /// the socket hooks and without, one pair per repetition.
    pub connect: Vec<ConnectRep>,
    /// What each program costs per run (kernel BPF statistics), by load.
    pub program_costs: Vec<ProgramCost>,
    /// Where the programs' time goes under a load, line by line (perf).
    pub profiles: Vec<LoadProfile>,
    /// Steps skipped for lack of time or a failure, with the reason.
    pub skipped: Vec<String>,
    /// Why nftables portmap was not measured at all (no `nft`, no 1.9.x
    /// plugins), if it was not: its rows are SKIP with this reason.
    pub nftables_skipped: Option<String>,
}

/// One flood run (issue 53, see `flood.rs`): one side, one family, one
/// repetition.
#[derive(Debug, Clone)]
pub struct FloodRow {
    pub flavor: Flavor,
    /// `v4` or `v6`.
    pub family: &'static str,
    /// ebpf-portmap's `conntrack_new` size, which the flood is three times
    /// (for every side alike).
    pub table: u64,
    /// Flows of each protocol the flood sent (a SYN and a datagram each),
    /// and over how long.
    pub flows: u64,
    pub flood_s: f64,
    /// TCP connect+request+close from the client to a published port, for
    /// as long as the flood lasts at least: before it, and during it.
    pub crr_before: RunResult,
    pub crr_during: RunResult,
    /// Of [`FloodRow::live`] idle TCP connections and as many idle assured
    /// UDP sessions: how many delivered the container's first message
    /// after the flood within a second, and then the client's.
    pub tcp_container_first: u32,
    pub tcp_client_first: u32,
    pub udp_container_first: u32,
    pub udp_client_first: u32,
    pub live: u32,
    /// ebpf-portmap's own count of what its conntrack tables evicted
    /// over the flood, entries of live (assured) flows and of flows never
    /// assured (`status --json`'s `evictions`, after less before); `None`
    /// for the upstream sides, which have no such tables.
    pub evicted: Option<Evicted>,
}

/// Entries the conntrack tables evicted, by kind of flow.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Evicted {
    pub live: u64,
    pub unreplied: u64,
}

impl FloodRow {
    /// Idle TCP connections alive after the flood: both ways delivered.
    pub fn tcp_alive(&self) -> u32 {
        self.tcp_container_first.min(self.tcp_client_first)
    }

    /// Idle UDP sessions alive after the flood: both ways delivered.
    pub fn udp_alive(&self) -> u32 {
        self.udp_container_first.min(self.udp_client_first)
    }

    /// The new-flow rate during the flood over the rate before it.
    pub fn crr_kept(&self) -> f64 {
        if self.crr_before.rate > 0.0 {
            self.crr_during.rate / self.crr_before.rate
        } else {
            0.0
        }
    }
}

/// One repetition of the connect() rate, calls/s, the two sides
/// interleaved.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ConnectRep {
    /// In the cgroup the socket hooks are attached to.
    pub hooked: f64,
    /// Outside it.
    pub bare: f64,
    /// In a cgroup with a connect4 program that does nothing (the floor);
    /// `None` when it could not be attached.
    pub floor: Option<f64>,
}

/// One program's cost under one load, from `kernel.bpf_stats_enabled`
/// counters (`BPF_ENABLE_STATS`).
#[derive(Debug, Clone, PartialEq)]
pub struct ProgramCost {
    pub load: String,
    pub program: String,
    pub runs: u64,
    pub ns_per_run: f64,
    /// The data-plane load it was measured under, with the transactions
    /// or connections that run completed (`None` for the socket hooks'
    /// connect() load, which has no data cell to compare with).
    pub under: Option<CostLoad>,
}

/// The programs' time under one load by source line and helper, from
/// perf's samples of the load's CPU.
#[derive(Debug, Clone)]
pub struct LoadProfile {
    pub load: String,
    /// Transactions or connections the profiled run completed.
    pub units: f64,
    /// How long the profiled run was.
    pub seconds: f64,
    pub profile: portmap_tests::profile::Profile,
}

impl LoadProfile {
    /// ns per transaction (or connection) that `samples` stand for.
    pub fn ns_per_unit(&self, samples: u64) -> f64 {
        if self.units > 0.0 {
            samples as f64 * self.profile.period_ns as f64 / self.units
        } else {
            0.0
        }
    }
}

/// A data-plane load of [`ProgramCost`]: which cell it belongs to and how
/// much work the measured run did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostLoad {
    pub test: Test,
    pub path: Flavor,
    /// Transactions or connections completed while the statistics ran.
    pub units: f64,
}

/// A label for a prefilled size.
pub fn size_label(size: usize) -> String {
    match size {
        0 => "0".to_owned(),
        n if n % 1000 == 0 => format!("{} 000", n / 1000),
        n => n.to_string(),
    }
}
