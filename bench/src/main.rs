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
//! The flood section measures what a flood of spoofed new flows costs idle
//! live flows and the new-flow rate (issue 53), ebpf-portmap (default and
//! fastPath) against iptables and nftables portmap.
//!
//! `--only control` (or any of control, scale, dataplane, memory, hairpin,
//! pods, flood, comma separated) runs part of it, e.g. to measure ADD/DEL latency in a minute
//! or two; the targets of the sections left out are SKIP.

// The parts: the plan of a run and its progress lines, timed plugin runs,
// control-plane batches, load generators and their warm-up, the measured
// worlds, map memory, upstream's iptables state, the programs' cost to
// traffic they do not translate, statistics, the targets and the report;
// and the sections, one module each: control_plane, scale (with the
// prefilled nodes), dataplane, conntrack (the memory section's full
// table), hairpin and pods. None of them imports this file, which only
// runs the sections in order and writes the results. Imports point down:
// sections and report over results, results over the parts (the layers
// are spelled out in bench/README.md).
mod conntrack;
mod control;
mod control_plane;
mod dataplane;
mod flood;
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
mod scale;
mod stats;
mod svg;
mod warm_up;
mod world;

use std::path::Path;
use std::process::{Command, ExitCode};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::plan::{Args, MAPPINGS_PER_PREFILL, Plan, Section};
use crate::progress::{Progress, install_signal_handlers};
use anyhow::{Context, bail};

use crate::conntrack::conntrack_fill;
use crate::control_plane::control_plane;
use crate::dataplane::connect_loop_main;
use crate::results::{Results, Status, judge};
use crate::scale::scale_and_dataplane;
use crate::world::{Flavor, Worlds};
use clap::Parser;
use portmap_tests::plugin_bin;
use portmap_tests::plugins::workspace_root;
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
    if plan.runs(Section::Flood) {
        flood::measure(plan, progress, &mut results)?;
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
        "Every world's node has the FORWARD rule kube-proxy puts on every Kubernetes node \
         (`-m conntrack --ctstate INVALID -j DROP`, both families), so every node tracks connections as a real one \
         does: ebpf-portmap's default hands a flow to its fast path once the kernel's conntrack holds it as \
         confirmed, which needs conntrack in use. Results before 2026-12-05 (dataplane) had no such rule, and their \
         direct path no conntrack at all."
            .into(),
        "Direct path: the same client reaches the container IP, routed by a node whose chain has no \
         port-mapping plugin at all (no eBPF programs, no nat rules; the FORWARD rule above): the baseline."
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
