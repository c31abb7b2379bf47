//! `cargo xtask bench`: ebpf-portmap against Debian's iptables `portmap`
//! and the untranslated direct path, side by side, in one run on one machine.
//!
//! Measures the control plane (ADD/DEL of the plugin alone and of the whole
//! bridge + host-local + plugin chain, sequential and with 16/32 parallel
//! callers), scale (one more ADD/DEL and the dataplane with 0, 1 000 and
//! 10 000 mappings already installed), the dataplane (TCP request/response,
//! connect+request+close, throughput, UDP request/response through hostPort
//! and direct) and BPF map memory; judges the targets of issue 8; writes
//! `bench/results/<date>.json`, `<date>.md` and `<date>-*.svg`.
//!
//! Every figure that a target judges is a ratio of two sides measured in
//! the same repetition, repeated (3 times by default); the verdict uses the
//! median and the minimum is reported. Every world is a set of harness
//! namespaces, removed on exit, also on failure or Ctrl-C. Needs root.
//!
//! The hairpin section measures pods that dial a hostPort through the
//! node's address (issue 37), ebpf-portmap against iptables portmap.
//!
//! The pods section measures one more pod's ADD/DEL and STATUS on nodes of
//! 0, 250 and 1 000 real pods (issues 36 and 33), ebpf-portmap against
//! iptables portmap on the same nodes.
//!
//! `--only control` (or any of control, scale, dataplane, memory, hairpin,
//! pods, comma separated) runs part of it, e.g. to measure ADD/DEL latency in a minute
//! or two; the targets of the sections left out are SKIP.

// The parts: the plan of a run and its progress lines, timed plugin runs,
// control-plane batches, load generators and their warm-up, the measured
// worlds, map memory, upstream's iptables state, the programs' cost to
// traffic they do not translate, the hairpin and pods sections,
// statistics, the targets and the report. None of them imports this file.
mod control;
mod floor;
mod hairpin;
mod hooks;
mod invoke;
mod iptables;
mod load;
mod memory;
mod nftables;
mod plan;
mod pods;
mod progress;
mod provenance;
mod report;
mod results;
mod stats;
mod svg;
mod warm_up;
mod world;

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::control::{Batch, deal, run_batch, run_interleaved};
use crate::invoke::Timed;
use crate::load::Test;
use crate::plan::{Args, MAPPINGS_PER_PREFILL, Plan, Section};
use crate::progress::{Progress, install_signal_handlers, short_measurement};
use crate::warm_up::warm_up;
use anyhow::{Context, bail};

use crate::results::{
    ConnectRep, ControlCell, CostLoad, DataCell, LoadProfile, MemoryRow, Prefill, ProgramCost,
    Results, ScaleCell, Scope, Status, Verb, judge, size_label,
};
use crate::world::{
    BenchWorld, FILL_CONTAINER_PORT, Flavor, OP_PORT_BASE, PREFILL_PORT_BASE, PROBE_FILL_HOST_PORT,
    UNRELATED_REMOTE,
};
use clap::Parser;
use portmap_tests::plugins::workspace_root;
use portmap_tests::topology::{EXT_IP4, NODE_IP4};
use portmap_tests::{Container, PortMapping, plugin_bin};
use serde_json::{Value, json};

fn main() -> ExitCode {
    // The bench runs itself as the connect() loop of the socket-hook
    // measurement (in a cgroup and namespace the parent chose).
    let raw: Vec<String> = std::env::args().collect();
    if raw.get(1).map(String::as_str) == Some(hooks::CONNECT_LOOP_ARG) {
        return connect_loop_main(&raw[2..]);
    }
    install_signal_handlers();
    let args = Args::parse();
    let plan = match Plan::new(&args) {
        Ok(plan) => plan,
        Err(e) => {
            eprintln!("bench: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    let progress = Progress {
        started: Instant::now(),
        budget: plan.budget,
    };
    let out_dir = args
        .out_dir
        .clone()
        .unwrap_or_else(|| workspace_root().join("bench/results"));
    println!(
        "bench: ebpf-portmap ({}) vs iptables portmap (/usr/lib/cni/portmap) vs nftables portmap ({}) vs direct path",
        plugin_bin().display(),
        nftables::peer().map_or_else(
            |e| format!("SKIP: {e}"),
            |p| format!("{}, {}", p.plugin.display(), p.version)
        )
    );
    println!(
        "bench: time budget {} s (a full run of 3 repetitions takes 13-20 min on 2 cores, 1.5 of them the hairpin rows, 5-8 the pods rows); {} repetitions; dataplane runs of {} ms; load pinned to CPU {}",
        plan.budget.as_secs(),
        plan.reps,
        plan.duration.as_millis(),
        plan.cpu.map_or("(none)".into(), |c| c.to_string())
    );
    if let Err(e) = preflight() {
        eprintln!("bench: {e:#}");
        return ExitCode::FAILURE;
    }
    let ebpf = EbpfSources::of(&plugin_bin());
    if let Err(e) = check_ebpf_source(&ebpf, args.plugin_source.is_some()) {
        eprintln!("bench: {e:#}");
        return ExitCode::FAILURE;
    }
    if let Some(bin) = &args.baseline_bin {
        if !bin.is_file() {
            eprintln!(
                "bench: --baseline-bin {} does not exist: pass the path of another ebpf-portmap build",
                bin.display()
            );
            return ExitCode::FAILURE;
        }
        let _ = world::BASELINE_BIN.set(bin.clone());
        println!(
            "bench: control plane also against the baseline build {}",
            bin.display()
        );
    }
    let source = args.plugin_source.clone().unwrap_or_else(source_tree);
    let baseline_source = args.baseline_source.clone();
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        run(
            &plan,
            &progress,
            &out_dir,
            &source,
            &ebpf,
            baseline_source.as_deref(),
        )
    }));
    match outcome {
        Ok(Ok(missed)) => {
            println!(
                "bench: done in {:.0} s; namespaces, pins and temp dirs removed",
                progress.started.elapsed().as_secs_f64()
            );
            if missed > 0 && args.fail_on_miss {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            }
        }
        Ok(Err(e)) => {
            eprintln!("bench: stopped: {e:#}");
            ExitCode::FAILURE
        }
        Err(_) => {
            eprintln!("bench: stopped: a step panicked (message above)");
            ExitCode::FAILURE
        }
    }
}

fn preflight() -> anyhow::Result<()> {
    let bin = plugin_bin();
    if !bin.is_file() {
        bail!(
            "{} does not exist: run `cargo xtask bench`, which builds the plugin as it ships and points EBPF_PORTMAP_BIN at it",
            bin.display()
        );
    }
    for tool in ["/usr/lib/cni/portmap", "/usr/lib/cni/bridge"] {
        if !std::path::Path::new(tool).is_file() {
            bail!("{tool} is missing: run `cargo xtask setup`");
        }
    }
    for tool in ["bpftool", "iptables-restore", "ip6tables-restore"] {
        Command::new(tool)
            .arg("--version")
            .output()
            .with_context(|| format!("{tool} is missing: run `cargo xtask setup`"))?;
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the bench creates network namespaces and loads eBPF: run it as root");
    }
    Ok(())
}

/// The five worlds the bench measures in; each is built only when a
/// section that is run needs it.
struct Worlds {
    /// Filled up to each size; carries the dataplane probe mappings.
    ours: Option<BenchWorld>,
    upstream: Option<BenchWorld>,
    /// Kept empty: the control-plane runs and the "empty node" side of the
    /// scale ratios.
    ours_empty: Option<BenchWorld>,
    upstream_empty: Option<BenchWorld>,
    /// nftables portmap's, as iptables portmap's; `None` when the peer
    /// cannot run here ([`nftables::skip_reason`] says why).
    nftables: Option<BenchWorld>,
    nftables_empty: Option<BenchWorld>,
    plain: Option<BenchWorld>,
    /// Kept empty, with `--baseline-bin`: the other side of the
    /// control-plane comparison with another build.
    baseline_empty: Option<BenchWorld>,
}

impl Worlds {
    fn new(plan: &Plan) -> Worlds {
        let build =
            |needed: bool, flavor, name| needed.then(|| BenchWorld::new(flavor, name, plan.cpu));
        let empty = plan.runs(Section::Control) || plan.runs(Section::Scale);
        let nft = nftables::peer().is_ok();
        Worlds {
            ours: build(plan.fills(), Flavor::Ours, "bench-ebpf"),
            upstream: build(plan.fills_upstream(), Flavor::Upstream, "bench-iptables"),
            ours_empty: build(empty, Flavor::Ours, "bench-ebpf-empty"),
            upstream_empty: build(empty, Flavor::Upstream, "bench-iptables-empty"),
            nftables: build(
                nft && plan.fills_upstream(),
                Flavor::Nftables,
                "bench-nftables",
            ),
            nftables_empty: build(nft && empty, Flavor::Nftables, "bench-nftables-empty"),
            plain: build(plan.runs(Section::Dataplane), Flavor::Plain, "bench-direct"),
            baseline_empty: build(
                plan.runs(Section::Control) && world::BASELINE_BIN.get().is_some(),
                Flavor::Baseline,
                "bench-ebpf-baseline",
            ),
        }
    }

    fn count(&self) -> usize {
        [
            &self.ours,
            &self.upstream,
            &self.ours_empty,
            &self.upstream_empty,
            &self.nftables,
            &self.nftables_empty,
            &self.plain,
            &self.baseline_empty,
        ]
        .iter()
        .filter(|w| w.is_some())
        .count()
    }

    /// The port plugin's configuration of `flavor`, from whichever world has it.
    fn port_plugin_config(&self, flavor: Flavor) -> Value {
        let (filled, empty) = match flavor {
            Flavor::Ours => (&self.ours, &self.ours_empty),
            Flavor::Nftables => (&self.nftables, &self.nftables_empty),
            _ => (&self.upstream, &self.upstream_empty),
        };
        filled
            .as_ref()
            .or(empty.as_ref())
            .map_or(Value::Null, BenchWorld::port_plugin_config)
    }
}

/// A world that the sections being run need: built by [`Worlds::new`].
fn world(world: &Option<BenchWorld>) -> &BenchWorld {
    world
        .as_ref()
        .expect("Worlds::new builds every world the selected sections use")
}

/// Runs everything and writes the results; returns the number of missed
/// (non-stretch) targets.
fn run(
    plan: &Plan,
    progress: &Progress,
    out_dir: &std::path::Path,
    source: &str,
    ebpf: &EbpfSources,
    baseline_source: Option<&str>,
) -> anyhow::Result<usize> {
    let started_unix = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let load_before = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let mut results = Results {
        // Sizes only matter to the sections measured on prefilled nodes.
        sizes: if plan.fills() {
            plan.sizes.clone()
        } else {
            Vec::new()
        },
        nftables_skipped: nftables::skip_reason(),
        ..Results::default()
    };
    let left_out: Vec<&str> = Section::ALL
        .iter()
        .filter(|s| !plan.runs(**s))
        .map(|s| s.name())
        .collect();
    if let Some(reason) = &results.nftables_skipped {
        results
            .skipped
            .push(format!("every nftables portmap row: {reason}"));
    }
    if !left_out.is_empty() {
        results.skipped.push(format!(
            "sections not run (--only {}): {}",
            plan.sections
                .iter()
                .map(|s| s.name())
                .collect::<Vec<_>>()
                .join(","),
            left_out.join(", ")
        ));
    }
    progress.say(&format!(
        "building the worlds of sections {} (namespaces only; the root namespace is not touched)",
        plan.sections
            .iter()
            .map(|s| s.name())
            .collect::<Vec<_>>()
            .join(", ")
    ));
    let worlds = Worlds::new(plan);
    progress.say(&format!("built {} worlds", worlds.count()));
    progress.check()?;
    if plan.runs(Section::Control) {
        control_plane(plan, progress, &worlds, &mut results)?;
    }
    if plan.fills() {
        scale_and_dataplane(plan, progress, &worlds, &mut results)?;
    }
    if plan.runs(Section::Memory) {
        conntrack_fill(progress, &worlds, &mut results)?;
    }
    if plan.runs(Section::Hairpin) {
        hairpin::measure(plan, progress, &mut results)?;
    }
    if plan.runs(Section::Pods) {
        pods::measure(plan, progress, &mut results)?;
    }

    let targets = judge(&results);
    let date = report::date_of(started_unix);
    let meta = json!({
        "date": date,
        "started_unix": started_unix,
        "total_seconds": progress.started.elapsed().as_secs_f64(),
        "kernel": std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim(),
        "cpus": std::thread::available_parallelism().map_or(0, std::num::NonZero::get),
        "loadavg_before": load_before.trim(),
        "loadavg_after": std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim(),
        "reference_plugin": package_version("containernetworking-plugins").map_or_else(|| "/usr/lib/cni/portmap".into(), |v| format!("Debian containernetworking-plugins {v}, /usr/lib/cni/portmap")),
        "iptables": first_line("iptables", &["--version"]),
        "ebpf_portmap_bin": plugin_bin().display().to_string(),
        "source": source,
        "ebpf_sources": ebpf.dirs,
        "ebpf_sources_digest": ebpf.digest,
        "baseline_bin": world::BASELINE_BIN.get().map(|bin| bin.display().to_string()),
        "baseline_ebpf_sources": world::BASELINE_BIN.get().map(|bin| EbpfSources::of(bin).dirs),
        "baseline_source": baseline_source,
        "sections": plan.sections.iter().map(|s| s.name()).collect::<Vec<_>>().join(", "),
        "method": format!(
            "{} repetitions, interleaved; dataplane runs of {} ms pinned to CPU {}",
            plan.reps,
            plan.duration.as_millis(),
            plan.cpu.map_or("(none)".into(), |c| c.to_string())
        ),
        "plan": plan.to_json(),
        "port_plugin_configs": {
            "ebpf-portmap": worlds.port_plugin_config(Flavor::Ours),
            "portmap": worlds.port_plugin_config(Flavor::Upstream),
            nftables::PLUGIN_TYPE: worlds.port_plugin_config(Flavor::Nftables),
        },
        "nftables_peer": nftables::peer().map_or_else(
            |e| format!("not measured: {e}"),
            |p| format!("{}, {}", p.version, p.plugin.display())
        ),
    });
    drop(worlds);

    std::fs::create_dir_all(out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    let mut plots = report::plots(&results, &date);
    // Plots are named `<date>-<section>[-<what>].svg`; those of sections
    // left out would be empty.
    plots.retain(|plot| {
        plan.sections.iter().any(|section| {
            plot.file_name
                .strip_prefix(date.as_str())
                .is_some_and(|rest| rest.starts_with(&format!("-{}", section.name())))
        })
    });
    let md = report::markdown(&results, &targets, &meta, &plots, &notes(plan));
    let json = report::to_json(&results, &targets, &meta);
    let mut written = Vec::new();
    for plot in &plots {
        let path = out_dir.join(&plot.file_name);
        std::fs::write(&path, &plot.svg).with_context(|| format!("writing {}", path.display()))?;
        written.push(path);
    }
    let md_path = out_dir.join(format!("{date}.md"));
    std::fs::write(&md_path, md).with_context(|| format!("writing {}", md_path.display()))?;
    let json_path = out_dir.join(format!("{date}.json"));
    std::fs::write(
        &json_path,
        serde_json::to_string_pretty(&json).expect("a Value serialises"),
    )
    .with_context(|| format!("writing {}", json_path.display()))?;
    written.push(md_path);
    written.push(json_path);

    println!("\nbench: targets (median over repetitions, min in brackets):");
    print!("{}", report::targets_text(&targets));
    let count = |stretch: bool, status: Status| {
        targets
            .iter()
            .filter(|t| t.stretch == stretch && t.status == status)
            .count()
    };
    let missed = count(false, Status::Miss);
    println!(
        "bench: targets: {} passed, {missed} missed, {} skipped; stretch targets: {} passed, {} missed",
        count(false, Status::Pass),
        count(false, Status::Skip),
        count(true, Status::Pass),
        count(true, Status::Miss),
    );
    for path in written {
        println!("bench: wrote {}", path.display());
    }
    Ok(missed)
}

fn package_version(package: &str) -> Option<String> {
    let out = Command::new("dpkg-query")
        .args(["-W", "-f=${Version}", package])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// What a plugin binary says of the sources of its eBPF object.
struct EbpfSources {
    /// The digest of the sources that `bin version` reports, if it reports
    /// one (`ebpfSources`).
    digest: Option<String>,
    /// The `portmap-ebpf` directories the object was compiled in, as its
    /// line info names them (empty when it has none, or `bin` cannot be
    /// read).
    dirs: Vec<String>,
}

impl EbpfSources {
    fn of(bin: &Path) -> EbpfSources {
        let digest = Command::new(bin)
            .args(["version", "-o", "json"])
            .output()
            .ok()
            .and_then(|out| serde_json::from_slice::<Value>(&out.stdout).ok())
            .and_then(|document| document["ebpfSources"].as_str().map(str::to_owned));
        let dirs = std::fs::read(bin)
            .map(|bytes| provenance::ebpf_crate_dirs(&bytes))
            .unwrap_or_default()
            .iter()
            .map(|dir| dir.display().to_string())
            .collect();
        EbpfSources { digest, dirs }
    }
}

/// Refuses a plugin binary whose eBPF object was not compiled from this
/// checkout's sources as they are now, unless `--plugin-source` says where
/// the binary comes from (a build measured on purpose): the dataplane
/// figures would be of code the report does not name. The binary says
/// which sources its object is (`version`'s `ebpfSources`, a digest of
/// portmap-ebpf and portmap-common); the same digest of this checkout must
/// match. Cargo's cache once handed the bench an object older than the
/// sources, whose line info named this checkout all the same.
fn check_ebpf_source(ebpf: &EbpfSources, source_given: bool) -> anyhow::Result<()> {
    let bin = plugin_bin();
    let root = workspace_root();
    let here = portmap_common::sources::ebpf_sources_digest(&root)
        .with_context(|| format!("reading the eBPF sources under {}", root.display()))?;
    let here = format!("{here:016x}");
    match &ebpf.digest {
        Some(theirs) if *theirs == here => Ok(()),
        Some(theirs) if !source_given => bail!(
            "{} carries an eBPF object of other sources (digest {theirs}, compiled from {}) than \
             this checkout's ({here}): cargo reused an object built before the last change or \
             elsewhere. Remove target/*/*/build/portmap-user-* and rebuild, or pass --plugin-source \
             to measure that build on purpose",
            bin.display(),
            ebpf.dirs.join(", ")
        ),
        Some(theirs) => {
            println!(
                "bench: {} carries eBPF sources {theirs}, this checkout {here}: measured as --plugin-source says",
                bin.display()
            );
            Ok(())
        }
        None => {
            println!(
                "bench: {} does not say which sources its eBPF object is (a build before `version` printed them)",
                bin.display()
            );
            Ok(())
        }
    }
}

/// The commit the bench was built from, and whether the tree had changes.
fn source_tree() -> String {
    let root = workspace_root();
    let git = |args: &[&str]| {
        Command::new("git")
            .arg("-C")
            .arg(&root)
            .args(args)
            .output()
            .ok()
            .filter(|out| out.status.success())
            .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned())
    };
    match git(&["rev-parse", "--short", "HEAD"]) {
        Some(commit) => {
            let changed = git(&["status", "--porcelain", "--untracked-files=no"])
                .map_or(0, |s| s.lines().count());
            if changed == 0 {
                format!("commit {commit}")
            } else {
                format!("commit {commit} with {changed} uncommitted changed file(s)")
            }
        }
        None => "unknown (not a git checkout)".into(),
    }
}

fn first_line(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .output()
        .map(|out| {
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .next()
                .unwrap_or_default()
                .to_owned()
        })
        .unwrap_or_default()
}

fn notes(plan: &Plan) -> Vec<String> {
    vec![
        format!(
            "Repetitions: {}. In each repetition both sides of every ratio are measured interleaved \
             (sequential control-plane operations alternate between the two plugins, or between the full \
             and the empty node; dataplane runs alternate between the paths in slices), so slow phases of \
             this shared machine hit both sides alike.",
            plan.reps
        ),
        "Control-plane latency is the time from spawning the plugin process to reaping it, taken with a \
         blocking wait (the harness's CniRunner polls with up to 20 ms sleeps, too coarse for 2 ms runs). \
         Configs are built with the harness's libcni-faithful `plugin_config`."
            .into(),
        format!(
            "Plugin alone: the port-mapping plugin binary run by itself with the real prevResult of one real \
             container (bridge + host-local result), one TCP mapping per operation, a new container ID and \
             host port each time; a batch runs all ADDs, then all DELs. Sequential batches: {} ADDs for \
             ebpf-portmap, {} each for iptables and nftables portmap; parallel batches: {} operations over 16 \
             or 32 callers.",
            plan.alone_sequential.0, plan.alone_sequential.1, plan.alone_parallel
        ),
        format!(
            "Whole chain: bridge + host-local + the plugin, run the way libcni runs a conflist, each operation \
             on a fresh container namespace ({} per sequential batch, {} per parallel batch).",
            plan.chain_sequential, plan.chain_parallel
        ),
        format!(
            "Scale: nodes are prefilled with containers of {MAPPINGS_PER_PREFILL} TCP mappings each. ebpf-portmap \
             is prefilled by real ADDs; iptables portmap by real ADDs up to {} mappings, beyond that by copying \
             the rules its own ADD wrote for a 10-mapping container (new chain name, container ID and ports) \
             with one iptables-restore per family, because ~1 000 real ADDs would not fit the time budget. \
             nftables portmap (upstream 1.9.x, `backend: nftables`) is prefilled by its own real ADDs to every \
             size (within {} s). The ADDs and DELs measured on top are real plugin runs. The dataplane probe container (TCP RR, TCP \
             stream, UDP and a conntrack-fill mapping) is added after the prefill, so it is the last-added one.",
            plan.upstream_real_prefill,
            plan.nftables_prefill_allowance.as_secs()
        ),
        format!(
            "Dataplane: client in the `ext` namespace, servers in a real container attached by the real bridge \
             plugin. TCP RR: 64-byte request/response on one connection; TCP CRR: connect, one 64-byte \
             request/response, client closes; TCP stream: 128 KiB writes from client to server, counted until \
             the server has read everything; UDP RR: 64-byte ping-pong, a reply missing after 200 ms counts as \
             an error. The client keeps no TIME_WAIT sockets (tcp_max_tw_buckets=0 in its namespace), so \
             the connection loops leave nothing behind in the kernel's machine-wide TCP hash. Each run lasts {} ms, cut into {} slices that alternate between the paths \
             (ebpf-portmap, iptables portmap, nftables portmap, direct, ebpf-portmap, ...), after a {} ms warm-up per path and \
             size. Client, servers and hence the veth softirq work are pinned to one CPU ({}), so a rate is the \
             CPU cost of the path and not cross-CPU wake-up latency (unpinned, the same run varies by 5x on \
             this 2-core VM).",
            plan.duration.as_millis(),
            plan.slices,
            plan.warmup.as_millis(),
            plan.cpu.map_or("none".into(), |c| c.to_string())
        ),
        "Direct path: the same client reaches the container IP, routed by a node whose chain has no \
         port-mapping plugin at all (no eBPF programs, no nat rules, no conntrack hooks): the physical baseline."
            .into(),
        "Memory: `bytes_memlock` of every pinned map as `bpftool --json map show` reports it (the kernel's own \
         accounting), entries counted with BPF_MAP_GET_NEXT_KEY. The three conntrack tables are preallocated \
         LRUs (`conntrack` and `conntrack_other` of the size the node formula gives without conntrackSize, \
         `conntrack_close` a quarter of it; see README, Configuration): their memory is fixed from the first ADD on. \
         Target (issue 30): at most 24 MiB at the fewest mappings. \"full conntrack_other\" is after sending one UDP \
         datagram from each of enough distinct source address:port pairs to a UDP hostPort to open 1.1 x \
         its entries/2 flows (UDP flows go to `conntrack_other`)."
            .into(),
        "Not translated: `direct, ebpf-portmap loaded` reaches the container IP on a port no mapping uses in the \
         ebpf-portmap world, against the direct path of the world without a port-mapping plugin; the connect() \
         rate is a child process of the bench looping connect() on one UDP socket to an unrelated remote port, \
         in the cgroup the socket hooks are attached to and outside it, interleaved; per-program costs are the \
         kernel's run-time statistics over one run of each load, enabled with BPF_ENABLE_STATS only for those \
         runs (not for the rate pairs, where they would tax one side)."
            .into(),
        "This machine is shared: other test runs may use the CPUs at the same time (see loadavg in the JSON). \
         Ratios are paired per repetition for that reason; absolute numbers are only indicative."
            .into(),
    ]
}

// ---- control plane ---------------------------------------------------------

fn push_control(
    results: &mut Results,
    scope: Scope,
    flavor: Flavor,
    verb: Verb,
    callers: usize,
    batch: Batch,
) {
    if let Some(cell) = results
        .control
        .iter_mut()
        .find(|c| c.scope == scope && c.flavor == flavor && c.verb == verb && c.callers == callers)
    {
        cell.reps.push(batch);
    } else {
        results.control.push(ControlCell {
            scope,
            flavor,
            verb,
            callers,
            reps: vec![batch],
        });
    }
}

/// `(container ID, its one mapping)` for `count` fake containers.
fn alone_items(prefix: &str, count: usize) -> Vec<(String, PortMapping)> {
    (0..count)
        .map(|i| {
            let port = OP_PORT_BASE + (i % 10_000) as u16;
            (format!("{prefix}-{i}"), PortMapping::tcp(port, 80))
        })
        .collect()
}

/// ADD batch then DEL batch of the plugin alone; DELs that failed are
/// retried once, untimed, so the next batch starts from the same state.
fn alone_add_del(
    world: &BenchWorld,
    items: &[(String, PortMapping)],
    callers: usize,
) -> (Batch, Batch) {
    let work = deal(items, callers);
    let add = run_batch(&work, |(id, mapping)| {
        world.port_add(id, std::slice::from_ref(mapping))
    });
    let failed_dels: Mutex<Vec<(String, PortMapping)>> = Mutex::new(Vec::new());
    let del = run_batch(&work, |(id, mapping)| {
        let timed = world.port_del(id, std::slice::from_ref(mapping));
        if !timed.ok() {
            failed_dels
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push((id.clone(), mapping.clone()));
        }
        timed
    });
    for (id, mapping) in failed_dels.into_inner().unwrap_or_default() {
        let _ = world.port_del(&id, std::slice::from_ref(&mapping));
    }
    (add, del)
}

/// Sequential ADD batches of several worlds interleaved operation by
/// operation, then their DEL batches likewise (see `run_interleaved`).
/// Returns `(add, del)` per world; failed DELs are retried once, untimed.
fn alone_add_del_interleaved(
    sides: &[(&BenchWorld, &[(String, PortMapping)])],
) -> Vec<(Batch, Batch)> {
    let items: Vec<&[(String, PortMapping)]> = sides.iter().map(|(_, items)| *items).collect();
    let adds = run_interleaved(&items, |side, (id, mapping)| {
        sides[side].0.port_add(id, std::slice::from_ref(mapping))
    });
    let failed_dels: Mutex<Vec<(usize, String, PortMapping)>> = Mutex::new(Vec::new());
    let dels = run_interleaved(&items, |side, (id, mapping)| {
        let timed = sides[side].0.port_del(id, std::slice::from_ref(mapping));
        if !timed.ok() {
            failed_dels
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push((side, id.clone(), mapping.clone()));
        }
        timed
    });
    for (side, id, mapping) in failed_dels.into_inner().unwrap_or_default() {
        let _ = sides[side].0.port_del(&id, std::slice::from_ref(&mapping));
    }
    adds.into_iter().zip(dels).collect()
}

/// ADD batch then DEL batch of the whole chain, one fresh container
/// namespace per operation (created before, removed after, untimed).
fn chain_add_del(world: &BenchWorld, prefix: &str, count: usize, callers: usize) -> (Batch, Batch) {
    let containers: Vec<Container> = (0..count)
        .map(|i| world.node.add_container(&format!("{prefix}-{i}")))
        .collect();
    let items: Vec<(usize, portmap_tests::RuntimeAttachment)> = containers
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let port = OP_PORT_BASE + (i % 10_000) as u16;
            (i, c.with_port_mappings(&[PortMapping::tcp(port, 80)]))
        })
        .collect();
    let work = deal(&items, callers);
    let cached: Mutex<HashMap<usize, Value>> = Mutex::new(HashMap::new());
    let add = run_batch(&work, |(i, rt)| {
        let timed = world.invoker.chain_add(&world.list, rt);
        if let Ok(result) = &timed.result {
            cached
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .insert(*i, result.clone());
        }
        timed
    });
    let cached = cached.into_inner().unwrap_or_default();
    let failed: Mutex<Vec<usize>> = Mutex::new(Vec::new());
    let del = run_batch(&work, |(i, rt)| {
        let timed = world.invoker.chain_del(&world.list, rt, cached.get(i));
        if !timed.ok() {
            failed
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(*i);
        }
        timed
    });
    for i in failed.into_inner().unwrap_or_default() {
        let _ = world
            .invoker
            .chain_del(&world.list, &items[i].1, cached.get(&i));
    }
    drop(containers);
    (add, del)
}

fn batch_line(flavor: Flavor, add: &Batch, del: &Batch) -> String {
    let p50 = |b: &Batch| b.percentiles().map_or(f64::NAN, |p| p.p50);
    let fails = add.failures + del.failures;
    format!(
        "{}: ADD p50 {:.1} ms, DEL p50 {:.1} ms, {:.0}/{:.0} ops/s{}",
        flavor.label(),
        p50(add),
        p50(del),
        add.ops_per_s(),
        del.ops_per_s(),
        if fails > 0 {
            format!(", {fails} FAILURES")
        } else {
            String::new()
        }
    )
}

fn control_plane(
    plan: &Plan,
    progress: &Progress,
    worlds: &Worlds,
    results: &mut Results,
) -> anyhow::Result<()> {
    let mut pair = vec![
        (world(&worlds.ours_empty), plan.alone_sequential.0),
        (world(&worlds.upstream_empty), plan.alone_sequential.1),
    ];
    if let Some(nftables) = &worlds.nftables_empty {
        pair.push((nftables, plan.alone_sequential.1));
    }
    for rep in 0..plan.reps {
        progress.check()?;
        let items: Vec<Vec<(String, PortMapping)>> = pair
            .iter()
            .map(|(_, ops)| alone_items(&format!("seq{rep}"), *ops))
            .collect();
        let sides: Vec<(&BenchWorld, &[(String, PortMapping)])> = pair
            .iter()
            .zip(&items)
            .map(|((world, _), items)| (*world, items.as_slice()))
            .collect();
        for ((world, _), (add, del)) in pair.iter().zip(alone_add_del_interleaved(&sides)) {
            progress.say(&format!(
                "control plane, plugin alone, sequential, rep {}/{}: {}",
                rep + 1,
                plan.reps,
                batch_line(world.flavor, &add, &del)
            ));
            push_control(results, Scope::Alone, world.flavor, Verb::Add, 1, add);
            push_control(results, Scope::Alone, world.flavor, Verb::Del, 1, del);
        }
    }
    // With a baseline build: ours and it alone, op by op, so that neither
    // side runs after iptables more often (the op after a slow iptables
    // run is slower); who goes first alternates by repetition.
    if let Some(base) = worlds.baseline_empty.as_ref() {
        let ours = world(&worlds.ours_empty);
        // Untimed: the baseline's first ADD loads its programs, as ours
        // did before the loop above.
        let warm = alone_items("vs-warm", 1);
        let _ = alone_add_del_interleaved(&[(base, warm.as_slice())]);
        for rep in 0..plan.reps {
            progress.check()?;
            let items = alone_items(&format!("vs{rep}"), plan.alone_sequential.0);
            let order = if rep % 2 == 0 {
                [ours, base]
            } else {
                [base, ours]
            };
            let sides: Vec<(&BenchWorld, &[(String, PortMapping)])> =
                order.iter().map(|w| (*w, items.as_slice())).collect();
            for (world, (add, del)) in order.iter().zip(alone_add_del_interleaved(&sides)) {
                progress.say(&format!(
                    "control plane, plugin alone against the baseline build, rep {}/{}: {}",
                    rep + 1,
                    plan.reps,
                    batch_line(world.flavor, &add, &del)
                ));
                push_control(
                    results,
                    Scope::AgainstBaseline,
                    world.flavor,
                    Verb::Add,
                    1,
                    add,
                );
                push_control(
                    results,
                    Scope::AgainstBaseline,
                    world.flavor,
                    Verb::Del,
                    1,
                    del,
                );
            }
        }
    }
    for callers in [16, 32] {
        for rep in 0..plan.reps {
            progress.check()?;
            for &(world, _) in &pair {
                let items = alone_items(&format!("par{callers}r{rep}"), plan.alone_parallel);
                let (add, del) = alone_add_del(world, &items, callers);
                progress.say(&format!(
                    "control plane, plugin alone, {callers} callers, rep {}/{}: {}",
                    rep + 1,
                    plan.reps,
                    batch_line(world.flavor, &add, &del)
                ));
                push_control(results, Scope::Alone, world.flavor, Verb::Add, callers, add);
                push_control(results, Scope::Alone, world.flavor, Verb::Del, callers, del);
            }
        }
    }
    for (callers, ops) in [
        (1, plan.chain_sequential),
        (16, plan.chain_parallel),
        (32, plan.chain_parallel),
    ] {
        for rep in 0..plan.reps {
            progress.check()?;
            for &(world, _) in &pair {
                let (add, del) = chain_add_del(world, &format!("ch{callers}r{rep}"), ops, callers);
                progress.say(&format!(
                    "control plane, whole chain, {callers} caller(s), rep {}/{}: {}",
                    rep + 1,
                    plan.reps,
                    batch_line(world.flavor, &add, &del)
                ));
                push_control(results, Scope::Chain, world.flavor, Verb::Add, callers, add);
                push_control(results, Scope::Chain, world.flavor, Verb::Del, callers, del);
            }
        }
    }
    Ok(())
}

// ---- scale and dataplane ---------------------------------------------------

/// The 10 mappings of prefilled container `index`.
fn prefill_mappings(index: usize) -> Vec<PortMapping> {
    (0..MAPPINGS_PER_PREFILL)
        .map(|i| {
            let port = PREFILL_PORT_BASE as usize + index * MAPPINGS_PER_PREFILL + i;
            PortMapping::tcp(
                u16::try_from(port).expect("prefill ports stay below 65536"),
                load::SERVICE_RR_PORT,
            )
        })
        .collect()
}

fn prefill_id(index: usize) -> String {
    format!("pf-{index}")
}

/// How far a world has been filled.
#[derive(Debug, Default)]
struct Fill {
    containers: usize,
    /// Set once a size could not be reached; later sizes are skipped.
    failed: Option<String>,
}

/// Real ADDs of prefill containers until `world` holds `size` mappings.
fn prefill_real(
    world: &BenchWorld,
    fill: &mut Fill,
    size: usize,
    allowance: Duration,
) -> Result<(), String> {
    let started = Instant::now();
    let target = size / MAPPINGS_PER_PREFILL;
    while fill.containers < target {
        if started.elapsed() > allowance {
            return Err(format!(
                "real ADDs reached only {} of {size} mappings within {} s",
                fill.containers * MAPPINGS_PER_PREFILL,
                allowance.as_secs()
            ));
        }
        let index = fill.containers;
        let timed = world.port_add(&prefill_id(index), &prefill_mappings(index));
        if let Err(e) = timed.result {
            return Err(format!("prefill ADD {index} failed: {e}"));
        }
        fill.containers += 1;
    }
    Ok(())
}

/// Copies the last real prefill container's iptables rules until the
/// upstream world holds `size` mappings.
fn prefill_synthetic(world: &BenchWorld, fill: &mut Fill, size: usize) -> Result<(), String> {
    let target = size / MAPPINGS_PER_PREFILL;
    if fill.containers == 0 {
        return Err("no real prefill container to copy".into());
    }
    let template = fill.containers - 1;
    let first = fill.containers;
    let count = target.saturating_sub(first);
    let template_base = PREFILL_PORT_BASE as usize + template * MAPPINGS_PER_PREFILL;
    let port = move |k: usize, p: u16| -> u16 {
        let offset = (p as usize).wrapping_sub(template_base);
        let new = PREFILL_PORT_BASE as usize + (first + k) * MAPPINGS_PER_PREFILL + offset;
        u16::try_from(new).unwrap_or(p)
    };
    iptables::synthesize(
        &world.node.ns,
        &prefill_id(template),
        &format!("pf-copy{first}-"),
        0..count,
        port,
    )?;
    fill.containers = target;
    Ok(())
}

/// One more container's ADD and DEL on the filled world and on its empty
/// twin, interleaved operation by operation, `ops` of each per repetition.
fn scale_reps(
    plan: &Plan,
    filled: &BenchWorld,
    empty: &BenchWorld,
    size: usize,
    ops: usize,
) -> [(Verb, Vec<Batch>, Vec<Batch>); 2] {
    let mut add = (Vec::new(), Vec::new());
    let mut del = (Vec::new(), Vec::new());
    for rep in 0..plan.reps {
        let items = alone_items(&format!("s{size}r{rep}"), ops);
        let mut batches =
            alone_add_del_interleaved(&[(filled, items.as_slice()), (empty, items.as_slice())])
                .into_iter();
        let (filled_add, filled_del) = batches.next().expect("two sides");
        let (empty_add, empty_del) = batches.next().expect("two sides");
        add.0.push(filled_add);
        del.0.push(filled_del);
        add.1.push(empty_add);
        del.1.push(empty_del);
    }
    [(Verb::Add, add.0, add.1), (Verb::Del, del.0, del.1)]
}

fn probe_add(world: &BenchWorld, size: usize) -> anyhow::Result<()> {
    let timed = world.port_add(&format!("probe-{size}"), &BenchWorld::probe_mappings());
    timed
        .result
        .map(|_| ())
        .map_err(|e| anyhow::anyhow!("probe ADD in {}: {e}", world.flavor.label()))
}

fn probe_del(world: &BenchWorld, size: usize) {
    let _ = world.port_del(&format!("probe-{size}"), &BenchWorld::probe_mappings());
}

/// `bench --connect-loop ADDR MILLIS`: prints how many connect() calls it
/// made (see [`hooks::connect_loop`]).
fn connect_loop_main(args: &[String]) -> ExitCode {
    let parsed = match args {
        [target, millis] => target
            .parse::<SocketAddr>()
            .ok()
            .zip(millis.parse::<u64>().ok()),
        _ => None,
    };
    let Some((target, millis)) = parsed else {
        eprintln!("usage: bench {} ADDR:PORT MILLIS", hooks::CONNECT_LOOP_ARG);
        return ExitCode::FAILURE;
    };
    match hooks::connect_loop(target, Duration::from_millis(millis)) {
        Ok(calls) => {
            println!("{calls}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("connect to {target}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// What the programs cost beyond the rates, in the ebpf-portmap world with
/// the probe mappings in place: the connect() rate of a node process with
/// the socket hooks and without (in a sibling cgroup; interleaved, `reps`
/// pairs), then, with the
/// kernel's BPF statistics on, each program's ns/run under one run of each
/// load (statistics are off for the rate pairs: they would tax the hooked
/// side only).
fn node_costs(
    plan: &Plan,
    progress: &Progress,
    world: &BenchWorld,
    plain: &BenchWorld,
    results: &mut Results,
) {
    let Some(pins) = world.pins.as_ref() else {
        return;
    };
    let cgroup = portmap_tests::cgroup::cgroup_for_pin_root(pins.path());
    // The other sides in sibling cgroups of the hooked one: the same
    // parent, so the same CPU weight and limits.
    let sibling = |suffix: &str| {
        portmap_tests::cgroup::TestCgroup::create(cgroup.with_file_name(format!(
            "{}-{suffix}",
            cgroup
                .file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
        )))
    };
    // Without hooks.
    let bare = sibling("bare");
    let node = world.node.ns.handle();
    // The floor: a connect4 program that does nothing, in the mode
    // ebpf-portmap attaches its own.
    let floor_cgroup = sibling("floor");
    let floor = match floor::CgroupFloor::attach(floor_cgroup.path()) {
        Ok(floor) => Some(floor),
        Err(e) => {
            results
                .skipped
                .push(format!("connect() rate, the floor: {e}"));
            None
        }
    };
    if cgroup.join("cgroup.procs").exists() {
        let sides: Vec<&Path> = [cgroup.as_path(), bare.path()]
            .into_iter()
            .chain(floor.is_some().then(|| floor_cgroup.path()))
            .collect();
        for rep in 0..plan.reps {
            if progress.check().is_err() {
                break;
            }
            let mut rates = vec![0.0f64; sides.len()];
            // Rotate which side goes first.
            let mut failed = None;
            for turn in 0..sides.len() {
                let side = (turn + rep) % sides.len();
                match hooks::connect_rate(
                    &node,
                    sides[side],
                    UNRELATED_REMOTE,
                    plan.duration,
                    plan.cpu,
                ) {
                    Ok(rate) => rates[side] = rate,
                    Err(e) => failed = Some(e),
                }
            }
            if let Some(e) = failed {
                results.skipped.push(format!("connect() rate: {e}"));
                break;
            }
            let rep_result = ConnectRep {
                hooked: rates[0],
                bare: rates[1],
                floor: rates.get(2).copied(),
            };
            results.connect.push(rep_result);
            progress.say(&format!(
                "connect() to an unrelated remote port, rep {}/{}: {:.0}/s with the socket hooks, {:.0}/s without, {}/s with an empty connect4 program",
                rep + 1,
                plan.reps,
                rep_result.hooked,
                rep_result.bare,
                rep_result.floor.map_or("-".into(), |f| format!("{f:.0}"))
            ));
        }
    } else {
        results.skipped.push(format!(
            "connect() rate: the hooked cgroup {} does not exist",
            cgroup.display()
        ));
    }
    let stats = match hooks::BpfStats::enable() {
        Ok(stats) => stats,
        Err(e) => {
            results.skipped.push(format!("per-program cost: {e}"));
            return;
        }
    };
    let progs = pins.path().join("v1/progs");
    let client = world.node.ext.handle();
    let loads = [
        (Flavor::Ours, Test::TcpRr),
        (Flavor::Ours, Test::TcpCrr),
        (Flavor::Ours, Test::UdpRr),
        (Flavor::OursDirect, Test::TcpRr),
    ];
    // The floor tc program under the same direct load, in the world
    // without a port-mapping plugin: what the statistics charge a
    // program that does nothing at the same hooks.
    plain.set_floor(true);
    if let Some(id) = plain.floor_program_id() {
        let before = hooks::run_time_of(id);
        let run = load::run(
            &plain.node.ext.handle(),
            Test::TcpRr,
            target_of(Flavor::PlainFloor, plain, Test::TcpRr),
            plan.duration,
            plan.cpu,
        );
        let after = hooks::run_time_of(id);
        push_floor_cost(
            results,
            &format!("{}, {}", Test::TcpRr.title(), Flavor::PlainFloor.label()),
            "floor_tc",
            before.zip(after),
            Some(CostLoad {
                test: Test::TcpRr,
                path: Flavor::PlainFloor,
                units: run.amount,
            }),
        );
    }
    plain.set_floor(false);
    for (path, test) in loads {
        enter(path, world);
        let before = hooks::run_times(&progs);
        let run = load::run(
            &client,
            test,
            target_of(path, world, test),
            plan.duration,
            plan.cpu,
        );
        let after = hooks::run_times(&progs);
        let name = format!("{}, {}", test.title(), path.label());
        let under = CostLoad {
            test,
            path,
            units: run.amount,
        };
        for (program, runs, ns_per_run) in hooks::per_run(&before, &after) {
            results.program_costs.push(ProgramCost {
                load: name.clone(),
                program,
                runs,
                ns_per_run,
                under: Some(under),
            });
        }
    }
    let before = hooks::run_times(&progs);
    if let Err(e) = hooks::connect_rate(
        &node,
        cgroup.as_path(),
        UNRELATED_REMOTE,
        plan.duration,
        plan.cpu,
    ) {
        results.skipped.push(format!("connect4 cost: {e}"));
    }
    let after = hooks::run_times(&progs);
    for (program, runs, ns_per_run) in hooks::per_run(&before, &after) {
        results.program_costs.push(ProgramCost {
            load: "connect() to an unrelated remote port, socket hooks".into(),
            program,
            runs,
            ns_per_run,
            under: None,
        });
    }
    if let Some(id) = floor.as_ref().and_then(floor::CgroupFloor::program_id) {
        let before = hooks::run_time_of(id);
        if let Err(e) = hooks::connect_rate(
            &node,
            floor_cgroup.path(),
            UNRELATED_REMOTE,
            plan.duration,
            plan.cpu,
        ) {
            results
                .skipped
                .push(format!("the floor's connect4 cost: {e}"));
        }
        let after = hooks::run_time_of(id);
        push_floor_cost(
            results,
            "connect() to an unrelated remote port, an empty connect4 program",
            "floor_connect4",
            before.zip(after),
            None,
        );
    }
    drop(stats);
    drop(floor);
    profile_loads(plan, progress, world, &progs, results);
    let summary: Vec<String> = results
        .program_costs
        .iter()
        .map(|c| format!("{} under {}: {:.0} ns/run", c.program, c.load, c.ns_per_run))
        .collect();
    progress.say(&format!("per-program cost: {}", summary.join("; ")));
}

/// How long each profiled load runs: long enough for a few thousand samples
/// at perf's period (the programs take 5-10% of the CPU).
const PROFILE_RUNS: u32 = 8;

/// Where the programs' time goes under the loads of the cost account, line
/// by line: perf samples the load's CPU (client, servers and their softirq
/// work are all pinned to it) while each load runs, without the BPF
/// statistics. Only with a pinned load.
fn profile_loads(
    plan: &Plan,
    progress: &Progress,
    world: &BenchWorld,
    progs: &Path,
    results: &mut Results,
) {
    let Some(cpu) = plan.cpu else {
        results
            .skipped
            .push("line profile: the load is not pinned to a CPU".into());
        return;
    };
    let pins: Vec<PathBuf> = std::fs::read_dir(progs)
        .map(|dir| {
            dir.flatten()
                .map(|entry| entry.path())
                .filter(|path| {
                    path.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                        n.ends_with(portmap_common::program_names::TC_INGRESS)
                            || n.ends_with(portmap_common::program_names::TC_EGRESS)
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    let pins: Vec<&Path> = pins.iter().map(PathBuf::as_path).collect();
    let map = match portmap_tests::profile::JitMap::of_pins(&pins) {
        Ok(map) => map,
        Err(e) => {
            results
                .skipped
                .push(format!("line profile: the programs' line tables: {e}"));
            return;
        }
    };
    let client = world.node.ext.handle();
    for (path, test) in [
        (Flavor::Ours, Test::TcpRr),
        (Flavor::Ours, Test::UdpRr),
        (Flavor::Ours, Test::TcpCrr),
        (Flavor::OursDirect, Test::TcpRr),
    ] {
        if progress.check().is_err() {
            break;
        }
        enter(path, world);
        let duration = plan.duration * PROFILE_RUNS;
        let mut units = 0.0;
        let sampled = portmap_tests::profile::sample(
            &map,
            cpu,
            None,
            portmap_tests::profile::DEFAULT_PERIOD_NS,
            || {
                let run = load::run(
                    &client,
                    test,
                    target_of(path, world, test),
                    duration,
                    plan.cpu,
                );
                units = run.amount;
            },
        );
        match sampled {
            Ok(profile) => {
                let load = format!("{}, {}", test.title(), path.label());
                progress.say(&format!(
                    "line profile of {load}: {} samples, {} in the programs",
                    profile.samples,
                    profile.in_programs()
                ));
                results.profiles.push(LoadProfile {
                    load,
                    units,
                    seconds: duration.as_secs_f64(),
                    profile,
                });
            }
            Err(e) => {
                results.skipped.push(format!("line profile: {e}"));
                break;
            }
        }
    }
}

/// Records a floor program's cost between two readings of its counters.
fn push_floor_cost(
    results: &mut Results,
    load: &str,
    program: &str,
    readings: Option<(hooks::RunTime, hooks::RunTime)>,
    under: Option<CostLoad>,
) {
    let Some((before, after)) = readings else {
        results.skipped.push(format!(
            "{program} cost: its run counters could not be read"
        ));
        return;
    };
    let Some((runs, ns_per_run)) = after.since(before) else {
        results
            .skipped
            .push(format!("{program} cost: it did not run under {load}"));
        return;
    };
    results.program_costs.push(ProgramCost {
        load: load.into(),
        program: program.into(),
        runs,
        ns_per_run,
        under,
    });
}

fn maps_dir(world: &BenchWorld) -> Option<PathBuf> {
    // The plugin's pin layout: {pinRoot}/v1/maps/{name} (portmap-user/src/pin.rs).
    world.pins.as_ref().map(|p| p.path().join("v1/maps"))
}

/// Prefills the nodes to each size and measures there what the sections
/// being run ask for: one more ADD/DEL (scale), traffic (dataplane), map
/// memory (memory).
fn scale_and_dataplane(
    plan: &Plan,
    progress: &Progress,
    worlds: &Worlds,
    results: &mut Results,
) -> anyhow::Result<()> {
    let ours = world(&worlds.ours);
    let mut ours_fill = Fill::default();
    let mut upstream_fill = Fill::default();
    let mut nftables_fill = Fill::default();
    for &size in &plan.sizes {
        progress.check()?;
        let label = size_label(size);

        // Prefill.
        let started = Instant::now();
        if let Err(e) = prefill_real(ours, &mut ours_fill, size, plan.budget) {
            bail!("ebpf-portmap prefill to {label}: {e}");
        }
        results.prefill.push(Prefill {
            flavor: Flavor::Ours,
            size,
            method: "real ADDs".into(),
            seconds: started.elapsed().as_secs_f64(),
            nat_rules: None,
            skipped: None,
        });
        let upstream_outcome = worlds
            .upstream
            .as_ref()
            .map(|upstream| prefill_upstream(plan, upstream, &mut upstream_fill, size, results));
        let upstream_here = matches!(upstream_outcome, Some(Ok(())));
        let nftables_outcome = worlds
            .nftables
            .as_ref()
            .map(|nftables| prefill_nftables(plan, nftables, &mut nftables_fill, size, results));
        let nftables_here = matches!(nftables_outcome, Some(Ok(())));
        let rules_of = |flavor: Flavor| {
            results
                .prefill
                .iter()
                .rev()
                .find(|p| p.flavor == flavor && p.size == size)
                .and_then(|p| p.nat_rules)
                .unwrap_or(0)
        };
        progress.say(&format!(
            "scale {label}: prefilled (ebpf-portmap {} mappings; iptables portmap {})",
            ours_fill.containers * MAPPINGS_PER_PREFILL,
            match &upstream_outcome {
                None => "not needed by these sections".to_owned(),
                Some(Ok(())) => format!(
                    "{} mappings, {} nat rules",
                    upstream_fill.containers * MAPPINGS_PER_PREFILL,
                    rules_of(Flavor::Upstream)
                ),
                Some(Err(e)) => format!("skipped: {e}"),
            }
        ));
        progress.say(&format!(
            "scale {label}: nftables portmap {}",
            match &nftables_outcome {
                None => nftables::skip_reason().unwrap_or_else(|| "not needed by these sections".into()),
                Some(Ok(())) => format!(
                    "{} mappings, {} nftables rules",
                    nftables_fill.containers * MAPPINGS_PER_PREFILL,
                    rules_of(Flavor::Nftables)
                ),
                Some(Err(e)) => format!("skipped: {e}"),
            }
        ));

        if plan.runs(Section::Scale) {
            progress.check()?;
            one_more_container(
                plan,
                progress,
                worlds,
                size,
                [
                    (Flavor::Upstream, upstream_here, &upstream_fill),
                    (Flavor::Nftables, nftables_here, &nftables_fill),
                ],
                results,
            );
        }

        // Dataplane through the last-added mappings.
        if plan.runs(Section::Dataplane) {
            progress.check()?;
            let upstream = world(&worlds.upstream);
            probe_add(ours, size)?;
            // ebpf-portmap twice: the default, and with fastPath switched on
            // in the same world before each of its slices.
            // And direct traffic in the same world, to a port no mapping
            // uses, against the node without the plugin.
            let mut paths: Vec<(Flavor, &BenchWorld)> = vec![
                (Flavor::Ours, ours),
                (Flavor::OursFast, ours),
                (Flavor::OursDirect, ours),
            ];
            if upstream_here {
                probe_add(upstream, size)?;
                paths.push((Flavor::Upstream, upstream));
            }
            if nftables_here {
                let nftables = world(&worlds.nftables);
                probe_add(nftables, size)?;
                paths.push((Flavor::Nftables, nftables));
            }
            let plain = world(&worlds.plain);
            paths.push((Flavor::Plain, plain));
            // The floor: the plain world with programs that do nothing
            // where ours are (found anew at every size: an interface the
            // plugin attached to since is included).
            match floor::hooks_of_ebpf_portmap(&ours.node.ns.handle()) {
                Ok(hooks) if !hooks.is_empty() => {
                    plain.set_floor_hooks(hooks);
                    paths.push((Flavor::PlainFloor, plain));
                }
                Ok(_) => results
                    .skipped
                    .push("the floor: no tc hook of ebpf-portmap's found".into()),
                Err(e) => results.skipped.push(format!("the floor: {e}")),
            }
            let mut missing = Vec::new();
            if !upstream_here {
                missing.push((
                    Flavor::Upstream,
                    "iptables portmap could not be prefilled to this size".to_owned(),
                ));
            }
            if !nftables_here {
                missing.push((
                    Flavor::Nftables,
                    match &nftables_outcome {
                        Some(Err(e)) => {
                            format!("nftables portmap could not be prefilled to this size: {e}")
                        }
                        _ => nftables::skip_reason().unwrap_or_default(),
                    },
                ));
            }
            let measured = dataplane(plan, progress, &paths, size, &missing, results);
            plain.set_floor(false);
            measured?;
            if size == plan.sizes.iter().copied().min().unwrap_or(0) {
                node_costs(plan, progress, ours, plain, results);
            }
            probe_del(ours, size);
            if upstream_here {
                probe_del(upstream, size);
            }
            if nftables_here {
                probe_del(world(&worlds.nftables), size);
            }
        }

        if plan.runs(Section::Memory)
            && let Some(dir) = maps_dir(ours)
        {
            results.memory.push(MemoryRow {
                state: format!("{label} mappings"),
                requested_mappings: size,
                maps: memory::maps_in(&dir),
            });
        }
        if progress.left().is_zero() {
            results
                .skipped
                .push(format!("sizes after {label}: time budget used up"));
            break;
        }
    }
    Ok(())
}

/// Fills iptables portmap to `size` (real ADDs, then copies of its rules)
/// and records how, or why it could not.
fn prefill_upstream(
    plan: &Plan,
    upstream: &BenchWorld,
    fill: &mut Fill,
    size: usize,
    results: &mut Results,
) -> Result<(), String> {
    let started = Instant::now();
    let method;
    let outcome = if let Some(reason) = &fill.failed {
        method = String::new();
        Err(reason.clone())
    } else if size <= plan.upstream_real_prefill {
        method = "real ADDs".to_owned();
        prefill_real(upstream, fill, size, plan.upstream_prefill_allowance)
    } else {
        method = format!(
            "real ADDs to {}, then copies of the plugin's rules (iptables-restore)",
            size_label(plan.upstream_real_prefill)
        );
        prefill_real(
            upstream,
            fill,
            plan.upstream_real_prefill.min(size),
            plan.upstream_prefill_allowance,
        )
        .and_then(|()| prefill_synthetic(upstream, fill, size))
    };
    if let Err(reason) = &outcome {
        fill.failed.get_or_insert(reason.clone());
    }
    results.prefill.push(Prefill {
        flavor: Flavor::Upstream,
        size,
        method,
        seconds: started.elapsed().as_secs_f64(),
        nat_rules: Some(iptables::nat_rule_count(&upstream.node.ns)),
        skipped: outcome.as_ref().err().cloned(),
    });
    outcome
}

/// Fills nftables portmap to `size` with its own real ADDs and records
/// how, or why it could not.
fn prefill_nftables(
    plan: &Plan,
    nftables: &BenchWorld,
    fill: &mut Fill,
    size: usize,
    results: &mut Results,
) -> Result<(), String> {
    let started = Instant::now();
    let outcome = match &fill.failed {
        Some(reason) => Err(reason.clone()),
        None => prefill_real(nftables, fill, size, plan.nftables_prefill_allowance),
    };
    if let Err(reason) = &outcome {
        fill.failed.get_or_insert(reason.clone());
    }
    results.prefill.push(Prefill {
        flavor: Flavor::Nftables,
        size,
        method: "real ADDs".into(),
        seconds: started.elapsed().as_secs_f64(),
        nat_rules: Some(nftables::rule_count(&nftables.node.ns)),
        skipped: outcome.as_ref().err().cloned(),
    });
    outcome
}

/// One more container's ADD and DEL on the filled nodes, each paired with
/// its empty twin; each upstream peer `(flavor, prefilled to size, fill)`.
fn one_more_container(
    plan: &Plan,
    progress: &Progress,
    worlds: &Worlds,
    size: usize,
    peers: [(Flavor, bool, &Fill); 2],
    results: &mut Results,
) {
    let ours_scale = scale_reps(
        plan,
        world(&worlds.ours),
        world(&worlds.ours_empty),
        size,
        plan.scale_ops.0,
    );
    for (verb, reps, empty_reps) in ours_scale {
        results.scale.push(ScaleCell {
            flavor: Flavor::Ours,
            size,
            verb,
            reps,
            empty_reps,
            skipped: None,
        });
    }
    let mut said = Vec::new();
    for (flavor, here, fill) in peers {
        let (filled, empty) = match flavor {
            Flavor::Nftables => (&worlds.nftables, &worlds.nftables_empty),
            _ => (&worlds.upstream, &worlds.upstream_empty),
        };
        let ops = match (here, filled, empty) {
            (true, Some(filled), Some(_)) => {
                // Size the upstream batches from one untimed ADD+DEL, so
                // slow large tables stay inside the allowance.
                let warm = [PortMapping::tcp(OP_PORT_BASE, 80)];
                let add = filled.port_add("warm", &warm);
                let del = filled.port_del("warm", &warm);
                let pair = (add.elapsed + del.elapsed).as_secs_f64() * 2.0; // filled + empty
                let fit = (plan
                    .upstream_scale_allowance
                    .min(progress.left() / 4)
                    .as_secs_f64()
                    / (pair * plan.reps as f64)) as usize;
                Some(fit.clamp(1, plan.scale_ops.1))
            }
            _ => None,
        };
        match (ops, filled, empty) {
            (Some(ops), Some(filled), Some(empty)) => {
                for (verb, reps, empty_reps) in scale_reps(plan, filled, empty, size, ops) {
                    results.scale.push(ScaleCell {
                        flavor,
                        size,
                        verb,
                        reps,
                        empty_reps,
                        skipped: None,
                    });
                }
                said.push(format!(
                    "{} {} ms ({}x empty node, {ops} ops/rep)",
                    flavor.label(),
                    scale_p50(results, flavor, size),
                    scale_ratio(results, flavor, size),
                ));
            }
            _ => {
                let reason = fill.failed.clone().or_else(|| match flavor {
                    Flavor::Nftables => nftables::skip_reason(),
                    _ => None,
                });
                for verb in Verb::BOTH {
                    results.scale.push(ScaleCell {
                        flavor,
                        size,
                        verb,
                        reps: Vec::new(),
                        empty_reps: Vec::new(),
                        skipped: reason.clone(),
                    });
                }
                said.push(format!("{} skipped", flavor.label()));
            }
        }
    }
    progress.say(&format!(
        "scale {}: one more ADD p50: ebpf-portmap {} ms ({}x empty node), {}",
        size_label(size),
        scale_p50(results, Flavor::Ours, size),
        scale_ratio(results, Flavor::Ours, size),
        said.join(", ")
    ));
}

fn scale_p50(results: &Results, flavor: Flavor, size: usize) -> String {
    results
        .scale_cell(flavor, size, Verb::Add)
        .and_then(|c| stats::median(&results::pct_per_rep(&c.reps, stats::Pct::P50)))
        .map_or("n/a".into(), |v| format!("{v:.2}"))
}

fn scale_ratio(results: &Results, flavor: Flavor, size: usize) -> String {
    results
        .scale_cell(flavor, size, Verb::Add)
        .and_then(|c| stats::median(&c.ratio_to_empty(stats::Pct::P50)))
        .map_or("n/a".into(), |v| format!("{v:.2}"))
}

fn target_of(path: Flavor, world: &BenchWorld, test: Test) -> SocketAddr {
    if path == Flavor::OursDirect {
        return world.direct_rr();
    }
    let targets = world.targets();
    match test {
        Test::TcpRr | Test::TcpCrr => targets.rr,
        Test::TcpStream => targets.stream,
        Test::UdpRr => targets.udp,
    }
}

/// Whether `path` is measured with `test`: direct traffic on the node with
/// ebpf-portmap loaded, and with the floor programs, only with
/// request/response and new connections (what the per-packet and per-flow
/// cost of the programs shows in).
fn measures(path: Flavor, test: Test) -> bool {
    !matches!(path, Flavor::OursDirect | Flavor::PlainFloor)
        || matches!(test, Test::TcpRr | Test::TcpCrr)
}

/// Puts `world` in the state `path` is measured in (fastPath on or off).
fn enter(path: Flavor, world: &BenchWorld) {
    match path {
        Flavor::Ours | Flavor::OursDirect => world.set_fast_path(false),
        Flavor::OursFast => world.set_fast_path(true),
        Flavor::Plain => world.set_floor(false),
        Flavor::PlainFloor => world.set_floor(true),
        Flavor::Upstream | Flavor::Nftables | Flavor::Baseline => {}
    }
}

fn dataplane(
    plan: &Plan,
    progress: &Progress,
    paths: &[(Flavor, &BenchWorld)],
    size: usize,
    missing: &[(Flavor, String)],
    results: &mut Results,
) -> anyhow::Result<()> {
    // Warm-up: neighbours resolved, first flows through every path.
    for &(path, world) in paths {
        enter(path, world);
        for test in Test::ALL.into_iter().filter(|&t| measures(path, t)) {
            let what = format!("{} at {} mappings", path.label(), size_label(size));
            warm_up(
                plan,
                &world.node.ext.handle(),
                test,
                target_of(path, world, test),
                &what,
                world,
            )?;
        }
    }
    let mut cells: Vec<DataCell> = Vec::new();
    for rep in 0..plan.reps {
        progress.check()?;
        for test in Test::ALL {
            let here: Vec<(Flavor, &BenchWorld)> = paths
                .iter()
                .copied()
                .filter(|&(path, _)| measures(path, test))
                .collect();
            let targets: Vec<_> = here
                .iter()
                .map(|&(path, world)| (world.node.ext.handle(), target_of(path, world, test)))
                .collect();
            let rates =
                load::run_interleaved(&targets, test, plan.duration, plan.slices, plan.cpu, |i| {
                    enter(here[i].0, here[i].1);
                });
            for (&(path, _), result) in here.iter().zip(rates) {
                match cells.iter_mut().find(|c| c.test == test && c.path == path) {
                    Some(cell) => cell.reps.push(result),
                    None => cells.push(DataCell {
                        size,
                        test,
                        path,
                        reps: vec![result],
                        skipped: None,
                    }),
                }
            }
        }
        let line: Vec<String> = Test::ALL
            .iter()
            .map(|&test| {
                let rate = |flavor| {
                    cells
                        .iter()
                        .find(|c| c.test == test && c.path == flavor)
                        .and_then(|c| c.reps.last())
                        .map_or("-".into(), short_measurement)
                };
                format!(
                    "{} {}/{}/{}/{}/{}/{}/{}",
                    test.key(),
                    rate(Flavor::Ours),
                    rate(Flavor::OursFast),
                    rate(Flavor::Upstream),
                    rate(Flavor::Nftables),
                    rate(Flavor::Plain),
                    rate(Flavor::OursDirect),
                    rate(Flavor::PlainFloor)
                )
            })
            .collect();
        progress.say(&format!(
            "dataplane {} mappings, rep {}/{} (ebpf/ebpf fastPath/iptables/nftables/direct/direct with ebpf loaded/direct with empty programs, rate[errors]): {}",
            size_label(size),
            rep + 1,
            plan.reps,
            line.join(", ")
        ));
    }
    for (path, reason) in missing {
        for test in Test::ALL {
            cells.push(DataCell {
                size,
                test,
                path: *path,
                reps: Vec::new(),
                skipped: Some(reason.clone()),
            });
        }
    }
    results.data.extend(cells);
    Ok(())
}

// ---- conntrack -------------------------------------------------------------

/// Extra client addresses for the conntrack fill: 64 511 source ports each.
const FILL_SOURCES: [Ipv4Addr; 3] = [
    Ipv4Addr::new(198, 18, 0, 21),
    Ipv4Addr::new(198, 18, 0, 22),
    Ipv4Addr::new(198, 18, 0, 23),
];

fn conntrack_fill(
    progress: &Progress,
    worlds: &Worlds,
    results: &mut Results,
) -> anyhow::Result<()> {
    progress.check()?;
    let world = world(&worlds.ours);
    let Some(dir) = maps_dir(world) else {
        return Ok(());
    };
    // UDP flows: their table is `conntrack_other` (TCP has its own two).
    let table = portmap_common::maps::CONNTRACK_OTHER;
    let Some(capacity) = memory::maps_in(&dir).get(table).map(|m| m.max_entries) else {
        results
            .skipped
            .push(format!("conntrack fill: no {table} map pinned"));
        return Ok(());
    };
    let fill_mapping = [PortMapping::udp(PROBE_FILL_HOST_PORT, FILL_CONTAINER_PORT)];
    let timed: Timed = world.port_add("ct-fill", &fill_mapping);
    if let Err(e) = timed.result {
        bail!("conntrack fill ADD: {e}");
    }
    let mut sources = vec![EXT_IP4];
    for source in FILL_SOURCES {
        world
            .node
            .ext
            .ip(&["addr", "add", &format!("{source}/24"), "dev", "eth0"]);
        sources.push(source);
    }
    // Each new flow takes two entries; 10% more flows than fit make it full.
    let flows = capacity as usize / 2 * 11 / 10;
    let per_source = u16::try_from(flows.div_ceil(sources.len()).min(64_000)).unwrap_or(64_000);
    let started = Instant::now();
    let sent = load::udp_flows(
        &world.node.ext.handle(),
        &sources,
        per_source,
        SocketAddr::new(NODE_IP4.into(), PROBE_FILL_HOST_PORT),
    );
    let maps = memory::maps_in(&dir);
    let entries = maps.get(table).and_then(|m| m.entries).unwrap_or(0);
    progress.say(&format!(
        "memory: sent {sent} new UDP flows in {:.1} s; {table} holds {entries} of {capacity} entries",
        started.elapsed().as_secs_f64()
    ));
    let largest = results.sizes.iter().copied().max().unwrap_or(0);
    results.memory.push(MemoryRow {
        state: format!("{} mappings, full {table}", size_label(largest)),
        requested_mappings: largest,
        maps,
    });
    let _ = world.port_del("ct-fill", &fill_mapping);
    Ok(())
}
