//! The control-plane section: ADD/DEL of the plugin alone (sequential,
//! interleaved with a baseline build, 16 and 32 callers) and of the whole
//! bridge + host-local + plugin chain, against iptables and nftables
//! portmap, on empty nodes.

use std::collections::HashMap;
use std::sync::Mutex;

use portmap_tests::{Container, PortMapping};
use serde_json::Value;

use crate::control::{Batch, deal, run_batch, run_interleaved};
use crate::plan::Plan;
use crate::progress::Progress;
use crate::results::{ControlCell, Results, Scope, Verb};
use crate::world::{BenchWorld, Flavor, OP_PORT_BASE, Worlds, world};

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
pub fn alone_items(prefix: &str, count: usize) -> Vec<(String, PortMapping)> {
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
pub fn alone_add_del_interleaved(
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

pub fn control_plane(
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
