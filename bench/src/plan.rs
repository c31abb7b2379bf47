//! What one run does: the command line ([`Args`]), the sections it can
//! pick ([`Section`]) and the counts, durations and budget they come to
//! ([`Plan`]), which every section reads.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Parser;
use serde_json::{Value, json};

use crate::nftables;

/// The default time budget per repetition: 3 repetitions (the default)
/// took 6-9 min on 2 cores, 5 took 843 s.
const BUDGET_SECS_PER_REP: u64 = 240;

/// What the pods section adds to the default budget: it took 276-458 s
/// with 3 repetitions on 2 shared cores.
const POD_SECTION_BUDGET_SECS: u64 = 480;

/// What the flood section adds to the default budget: 8 runs of about
/// 10 s per repetition, each in a world of its own.
const FLOOD_SECTION_BUDGET_SECS: u64 = 120;

/// What nftables portmap, when it can run, adds to the default budget: its
/// prefills are all real ADDs (1 000 to reach 10 000 mappings, 2 000 in the
/// pods section, 0.1-0.4 s each in the smoke runs of 2026-12-03 on a
/// loaded machine) besides its share of every section.
const NFTABLES_BUDGET_SECS: u64 = 600;

/// Mappings per prefilled container (a pod publishing 10 ports).
pub const MAPPINGS_PER_PREFILL: usize = 10;

#[derive(Debug, Parser)]
#[command(
    about = "Benchmark ebpf-portmap against iptables portmap, nftables portmap and the direct path"
)]
pub struct Args {
    /// Repetitions of every measurement (at least 3 for the report).
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// Duration of one dataplane run, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub duration_ms: u64,
    /// CPU that load generators and servers are pinned to, or `none`.
    #[arg(long, default_value = "1")]
    pub cpu: String,
    /// Prefilled mapping counts of the scale measurements.
    #[arg(long, value_delimiter = ',', default_value = "0,1000,10000")]
    pub sizes: Vec<usize>,
    /// Largest size that upstream portmap is prefilled to by real ADDs;
    /// larger sizes copy its rules with iptables-restore.
    #[arg(long, default_value_t = 1000)]
    pub upstream_real_prefill: usize,
    /// Total time budget in seconds; steps that would exceed it are skipped
    /// with the reason in the report. Default: 240 per repetition (a full
    /// run of 5 repetitions took 843 s on 2 cores), plus 480 with the pods
    /// section, 120 per repetition with the flood section and 600 when
    /// nftables portmap can run.
    #[arg(long)]
    pub budget_secs: Option<u64>,
    /// Fewer operations per batch and shorter runs, for trying the bench out
    /// (the results are still written).
    #[arg(long)]
    pub quick: bool,
    /// Where the results go (default: <workspace>/bench/results).
    #[arg(long)]
    pub out_dir: Option<PathBuf>,
    /// Exit 1 when a (non-stretch) target is missed.
    #[arg(long)]
    pub fail_on_miss: bool,
    /// Where the ebpf-portmap binary was built from, for the report
    /// (default: this checkout's commit and whether it has changes).
    #[arg(long)]
    pub plugin_source: Option<String>,
    /// Another build of ebpf-portmap to compare the plugin under test with
    /// (e.g. the build before a change): the sequential plugin-alone ADDs
    /// and DELs alternate between the two, each in a world of its own, and
    /// the report judges that ADD p50 did not get slower.
    #[arg(long)]
    pub baseline_bin: Option<PathBuf>,
    /// Where the baseline was built from, for the report.
    #[arg(long)]
    pub baseline_source: Option<String>,
    /// Run only these sections (comma-separated), e.g. `--only control`
    /// for the ADD/DEL latencies in a minute or two; default: all of them.
    /// Targets of the sections left out are reported as SKIP.
    #[arg(long, alias = "sections", value_delimiter = ',', value_enum)]
    pub only: Vec<Section>,
}

/// The parts of the bench that `--only` can pick.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Section {
    /// ADD/DEL of the plugin alone (sequential, 16 and 32 callers) and of
    /// the whole chain, against iptables portmap.
    Control,
    /// One more ADD/DEL on a node prefilled to each size.
    Scale,
    /// Traffic through hostPort, iptables DNAT and the direct path at each size.
    Dataplane,
    /// BPF map memory at each size and with a full conntrack table.
    Memory,
    /// Pods dialing nodeIP:hostPort (to itself, to another pod), v4 and
    /// v6, ebpf-portmap against iptables portmap, in worlds of their own.
    Hairpin,
    /// One more pod's ADD/DEL and STATUS on nodes of 0, 250 and 1 000 real
    /// pods (their own veths on the bridge), against iptables portmap on
    /// the same nodes, with what each call does (issues 36 and 33).
    Pods,
    /// Idle live flows and the new-flow rate through a flood of spoofed
    /// new flows (issue 53), ebpf-portmap (default and fastPath) against
    /// iptables and nftables portmap.
    Flood,
}

impl Section {
    pub const ALL: [Section; 7] = [
        Section::Control,
        Section::Scale,
        Section::Dataplane,
        Section::Memory,
        Section::Hairpin,
        Section::Pods,
        Section::Flood,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Section::Control => "control",
            Section::Scale => "scale",
            Section::Dataplane => "dataplane",
            Section::Memory => "memory",
            Section::Hairpin => "hairpin",
            Section::Pods => "pods",
            Section::Flood => "flood",
        }
    }
}

/// Operation counts and durations of one run.
#[derive(Debug, Clone)]
pub struct Plan {
    pub reps: usize,
    pub duration: Duration,
    pub warmup: Duration,
    /// Slices each dataplane run is cut into, interleaved across the paths.
    pub slices: u32,
    pub cpu: Option<usize>,
    pub sizes: Vec<usize>,
    pub upstream_real_prefill: usize,
    pub budget: Duration,
    /// The sections to run, in order, without duplicates.
    pub sections: Vec<Section>,
    /// Plugin-alone sequential operations per repetition: (ours, upstream).
    pub alone_sequential: (usize, usize),
    /// Plugin-alone operations per parallel batch.
    pub alone_parallel: usize,
    /// Chain operations per repetition, sequential and parallel.
    pub chain_sequential: usize,
    pub chain_parallel: usize,
    /// One-more-container operations per repetition at each size: (ours, upstream).
    pub scale_ops: (usize, usize),
    /// Most time the upstream scale operations may take at one size.
    pub upstream_scale_allowance: Duration,
    /// Most time upstream's real prefill may take.
    pub upstream_prefill_allowance: Duration,
    /// Most time nftables portmap's prefill (real ADDs only) may take.
    pub nftables_prefill_allowance: Duration,
}

impl Plan {
    pub fn new(args: &Args) -> anyhow::Result<Plan> {
        let cpu = match args.cpu.as_str() {
            "none" => None,
            n => Some(n.parse().context("--cpu takes a CPU number or `none`")?),
        };
        if let Some(cpu) = cpu {
            let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
            if cpu >= cpus {
                bail!("--cpu {cpu}: this machine has {cpus} CPUs");
            }
        }
        if args.sizes.is_empty() {
            bail!("--sizes needs at least one size");
        }
        let mut sizes = args.sizes.clone();
        sizes.sort_unstable();
        sizes.dedup();
        if sizes.iter().any(|s| s % MAPPINGS_PER_PREFILL != 0) {
            bail!("--sizes must be multiples of {MAPPINGS_PER_PREFILL}");
        }
        let quick = args.quick;
        let sections = if args.only.is_empty() {
            Section::ALL.to_vec()
        } else {
            let mut only = args.only.clone();
            only.sort_unstable();
            only.dedup();
            only
        };
        Ok(Plan {
            reps: args.reps.max(1),
            duration: Duration::from_millis(if quick {
                args.duration_ms.min(300)
            } else {
                args.duration_ms
            }),
            warmup: Duration::from_millis(200),
            slices: 5,
            cpu,
            sizes,
            upstream_real_prefill: args.upstream_real_prefill,
            budget: Duration::from_secs(args.budget_secs.unwrap_or(
                BUDGET_SECS_PER_REP * args.reps.max(1) as u64
                    + if sections.contains(&Section::Pods) {
                        POD_SECTION_BUDGET_SECS
                    } else {
                        0
                    }
                    + if sections.contains(&Section::Flood) {
                        FLOOD_SECTION_BUDGET_SECS * args.reps.max(1) as u64
                    } else {
                        0
                    }
                    + if nftables::peer().is_ok() {
                        NFTABLES_BUDGET_SECS
                    } else {
                        0
                    },
            )),
            sections,
            alone_sequential: if quick { (30, 8) } else { (100, 30) },
            alone_parallel: if quick { 32 } else { 64 },
            chain_sequential: if quick { 4 } else { 10 },
            chain_parallel: 32,
            scale_ops: if quick { (10, 3) } else { (30, 10) },
            upstream_scale_allowance: Duration::from_secs(if quick { 20 } else { 60 }),
            upstream_prefill_allowance: Duration::from_secs(if quick { 60 } else { 150 }),
            nftables_prefill_allowance: Duration::from_secs(if quick { 120 } else { 400 }),
        })
    }

    pub fn runs(&self, section: Section) -> bool {
        self.sections.contains(&section)
    }

    /// Whether nodes are prefilled to each size (scale, dataplane and
    /// memory are all measured on them).
    pub fn fills(&self) -> bool {
        self.runs(Section::Scale) || self.runs(Section::Dataplane) || self.runs(Section::Memory)
    }

    /// Whether iptables portmap is prefilled too (memory is ours only).
    pub fn fills_upstream(&self) -> bool {
        self.runs(Section::Scale) || self.runs(Section::Dataplane)
    }

    pub fn to_json(&self) -> Value {
        json!({
            "reps": self.reps,
            "dataplane_run_s": self.duration.as_secs_f64(),
            "dataplane_warmup_s": self.warmup.as_secs_f64(),
            "dataplane_slices": self.slices,
            "load_cpu": self.cpu,
            "sizes": self.sizes,
            "upstream_real_prefill_max": self.upstream_real_prefill,
            "budget_s": self.budget.as_secs(),
            "sections": self.sections.iter().map(|s| s.name()).collect::<Vec<_>>(),
            "alone_sequential_ops": { "ebpf-portmap": self.alone_sequential.0, "portmap": self.alone_sequential.1 },
            "alone_parallel_ops": self.alone_parallel,
            "chain_sequential_ops": self.chain_sequential,
            "chain_parallel_ops": self.chain_parallel,
            "scale_ops": { "ebpf-portmap": self.scale_ops.0, "portmap": self.scale_ops.1 },
            "mappings_per_prefilled_container": MAPPINGS_PER_PREFILL,
        })
    }
}
