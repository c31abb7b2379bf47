//! The dataplane section: traffic through hostPort (ebpf-portmap with and
//! without its fast path, iptables and nftables portmap), DNAT and the
//! direct path, interleaved slice by slice at each size, and what the
//! programs cost to traffic they do not translate (the socket hooks'
//! connect() loop, each program's ns/run under load).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use crate::load::{self, Test};
use crate::plan::Plan;
use crate::progress::{Progress, short_measurement};
use crate::results::{
    ConnectRep, CostLoad, DataCell, LoadProfile, ProgramCost, Results, size_label,
};
use crate::warm_up::warm_up;
use crate::world::{BenchWorld, Flavor, UNRELATED_REMOTE};
use crate::{floor, hooks};

/// `bench --connect-loop ADDR MILLIS`: prints how many connect() calls it
/// made (see [`hooks::connect_loop`]).
pub fn connect_loop_main(args: &[String]) -> ExitCode {
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
pub fn node_costs(
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
        Flavor::Upstream | Flavor::Nftables | Flavor::Baseline | Flavor::OursSockets => {}
    }
}

pub fn dataplane(
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
