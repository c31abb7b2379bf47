//! The nodes prefilled to each size and the sections measured on them:
//! scale (one more ADD/DEL) here, the dataplane (`dataplane`) and the BPF
//! map memory at each size.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::bail;
use portmap_tests::PortMapping;

use crate::control::Batch;
use crate::control_plane::{alone_add_del_interleaved, alone_items};
use crate::dataplane::{dataplane, node_costs};
use crate::load;
use crate::plan::{MAPPINGS_PER_PREFILL, Plan, Section};
use crate::progress::Progress;
use crate::results::{MemoryRow, Prefill, Results, ScaleCell, Verb, size_label};
use crate::world::{BenchWorld, Flavor, OP_PORT_BASE, PREFILL_PORT_BASE, Worlds, world};
use crate::{floor, iptables, memory, nftables, results, stats};

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

pub fn maps_dir(world: &BenchWorld) -> Option<PathBuf> {
    // The plugin's pin layout: {pinRoot}/v1/maps/{name} (portmap-user/src/pin.rs).
    world.pins.as_ref().map(|p| p.path().join("v1/maps"))
}

/// Prefills the nodes to each size and measures there what the sections
/// being run ask for: one more ADD/DEL (scale), traffic (dataplane), map
/// memory (memory).
pub fn scale_and_dataplane(
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
