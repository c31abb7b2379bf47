//! The hairpin rows (issue 37): a pod dials nodeIP:hostPort, mapped to
//! itself or to another pod, TCP request/response, connect+request+close
//! and UDP request/response, IPv4 and IPv6, ebpf-portmap and iptables
//! portmap interleaved slice by slice.
//!
//! The pods are not in the cgroup the socket hooks are attached to (the
//! harness gives each pin root a `cgroupPath` of its own, which holds no
//! process of the bench), so their traffic takes the packet path: tc on
//! the container side, masqueraded back into the bridge. The
//! connect+request+close rows dial the close-first service, so the server
//! holds every closed tuple in TIME_WAIT, the case where a masquerade that
//! reuses a tuple loses connections.
//!
//! The same rows with `containerSockets` (issue 28) run in a world of their
//! own whose pods the plugin registered: for each of its slices the bench
//! process moves itself into that world's hooked cgroup (and back out
//! after), so the pods' `connect()`/`sendmsg()` are pointed at the
//! container at the socket. The section fails if that world's hooks
//! translated nothing, or masqueraded a flow: then it measured the wrong
//! path.
//!
//! The two worlds are built for this section and removed at its end: the
//! TIME_WAIT sockets a connection loop leaves in a pod's namespace go with
//! it, before any later measurement walks the machine's TCP hash.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

use portmap_tests::Container;
use portmap_tests::netns::NsHandle;
use portmap_tests::topology::{NODE_IP4, NODE_IP6};

use super::load::{self, RunResult, Test};
use super::plan::Plan;
use super::progress::{Progress, short_measurement};
use super::results::hairpin_rows::{Family, Route, TESTS};
use super::results::{HairpinCell, Results};
use super::warm_up::warm_up;
use super::world::{
    BenchWorld, Flavor, HAIRPIN_CLOSE_FIRST_HOST_PORT, PROBE_RR_HOST_PORT, PROBE_UDP_HOST_PORT,
};

/// Where a pod dials `test` through the node: connect+request+close goes
/// to the close-first service.
///
/// # Panics
/// For a test without a hairpin row (see [`TESTS`]).
pub fn target(family: Family, test: Test) -> SocketAddr {
    let port = match test {
        Test::TcpRr => PROBE_RR_HOST_PORT,
        Test::TcpCrr => HAIRPIN_CLOSE_FIRST_HOST_PORT,
        Test::UdpRr => PROBE_UDP_HOST_PORT,
        Test::TcpStream => panic!("no hairpin row measures {}", test.title()),
    };
    SocketAddr::new(node_ip(family), port)
}

/// The node's address in `family`, the one a hairpin pod dials.
fn node_ip(family: Family) -> IpAddr {
    match family {
        Family::V4 => IpAddr::V4(NODE_IP4),
        Family::V6 => IpAddr::V6(NODE_IP6),
    }
}

/// One plugin's hairpin world: the server pod (the world's container,
/// with the mappings) and another pod.
struct HairpinWorld {
    world: BenchWorld,
    other: Container,
    /// `cgroup.procs` of the hooked cgroup the clients run in (the
    /// `containerSockets` world only).
    hooked: Option<PathBuf>,
}

impl HairpinWorld {
    fn new(flavor: Flavor, name: &str, plan: &Plan) -> anyhow::Result<HairpinWorld> {
        let world = BenchWorld::new(flavor, name, plan.cpu);
        let other = world.add_pod("other");
        world
            .port_add("hairpin", &BenchWorld::hairpin_mappings())
            .result
            .map_err(|e| anyhow::anyhow!("hairpin mappings ADD in {}: {e}", flavor.label()))?;
        let hooked = (flavor == Flavor::OursSockets)
            .then(|| world.pins.as_ref().map(|p| p.cgroup().procs_file()))
            .flatten();
        Ok(HairpinWorld {
            world,
            other,
            hooked,
        })
    }

    /// The `status` counters of this world's dataplane (`None` without
    /// pins). `status` exits non-zero when it finds a problem; its JSON is
    /// read all the same.
    fn counters(&self) -> Option<serde_json::Value> {
        Some(self.world.status_json()?["counters"].clone())
    }

    /// The namespace the client of `route` runs in.
    fn client(&self, route: Route) -> NsHandle {
        match route {
            Route::ToItself => self.world.container.ns.handle(),
            Route::ToAnotherPod => self.other.ns.handle(),
        }
    }
}

/// Where the bench process runs its clients: its own cgroup, or a
/// world's hooked one for that world's slices. Back home on drop, so a
/// failed slice never leaves the process in a cgroup its world removes.
struct ClientCgroup {
    /// `cgroup.procs` of the cgroup the bench started in.
    home: PathBuf,
    away: bool,
}

impl ClientCgroup {
    fn new() -> anyhow::Result<ClientCgroup> {
        let own = std::fs::read_to_string("/proc/self/cgroup")?;
        let relative = own
            .lines()
            .find_map(|line| line.strip_prefix("0::"))
            .ok_or_else(|| anyhow::anyhow!("the bench is in no cgroup2 cgroup: {own}"))?;
        let home = portmap_tests::cgroup::cgroup2_mount()
            .join(relative.trim_start_matches('/'))
            .join("cgroup.procs");
        Ok(ClientCgroup { home, away: false })
    }

    /// Moves the whole process (every thread: cgroup v2 moves thread
    /// groups) into the cgroup of `procs`, or home for `None`.
    fn enter(&mut self, procs: Option<&Path>) {
        let target = procs.unwrap_or(&self.home);
        if procs.is_none() && !self.away {
            return;
        }
        if let Err(e) = std::fs::write(target, b"0") {
            panic!("moving the bench into {}: {e}", target.display());
        }
        self.away = procs.is_some();
    }
}

impl Drop for ClientCgroup {
    fn drop(&mut self) {
        if self.away {
            let _ = std::fs::write(&self.home, b"0");
        }
    }
}

/// Builds the worlds (ebpf-portmap on the packet path and with
/// `containerSockets`, iptables portmap and, where it can run, nftables
/// portmap), warms every path up, then measures each (route, family,
/// test) with the plugins interleaved, `plan.reps` times.
pub fn measure(plan: &Plan, progress: &Progress, results: &mut Results) -> anyhow::Result<()> {
    let mut sides = vec![
        HairpinWorld::new(Flavor::Ours, "bench-ebpf-hairpin", plan)?,
        HairpinWorld::new(Flavor::OursSockets, "bench-ebpf-sockets-hairpin", plan)?,
        HairpinWorld::new(Flavor::Upstream, "bench-iptables-hairpin", plan)?,
    ];
    let mut cgroup = ClientCgroup::new()?;
    match crate::nftables::skip_reason() {
        None => sides.push(HairpinWorld::new(
            Flavor::Nftables,
            "bench-nftables-hairpin",
            plan,
        )?),
        Some(reason) => progress.say(&format!("hairpin: {reason}")),
    }
    progress.say(&format!(
        "hairpin: built the worlds of {}",
        sides
            .iter()
            .map(|s| s.world.flavor.label())
            .collect::<Vec<_>>()
            .join(", ")
    ));
    warm_up_every_path(plan, &sides, &mut cgroup)?;
    let sockets = sides
        .iter()
        .find(|s| s.hooked.is_some())
        .expect("the containerSockets world");
    let translated_after_warm_up = check_socket_path(sockets, 0)?;
    for rep in 0..plan.reps {
        let mut line = Vec::new();
        for family in Family::BOTH {
            for route in Route::BOTH {
                for test in TESTS {
                    progress.check()?;
                    let runs = measure_interleaved(plan, &sides, route, family, test, &mut cgroup);
                    line.push(format!(
                        "{} {} {} {}",
                        route.key(),
                        family.key(),
                        test.key(),
                        runs.iter()
                            .map(|(run, refused)| match refused {
                                0 => short_measurement(run),
                                n => format!("{} {n} SYNs refused", short_measurement(run)),
                            })
                            .collect::<Vec<_>>()
                            .join("/")
                    ));
                    for (side, (run, refused)) in sides.iter().zip(runs) {
                        push(
                            results,
                            route,
                            family,
                            test,
                            side.world.flavor,
                            run,
                            refused,
                        );
                    }
                }
            }
        }
        progress.say(&format!(
            "hairpin, rep {}/{} ({}, rate[errors]): {}",
            rep + 1,
            plan.reps,
            sides
                .iter()
                .map(|s| s.world.flavor.label())
                .collect::<Vec<_>>()
                .join("/"),
            line.join(", ")
        ));
    }
    let translated = check_socket_path(sockets, translated_after_warm_up)?;
    progress.say(&format!(
        "hairpin: the containerSockets world's hooks translated {translated} connect()/sendmsg() calls and masqueraded nothing"
    ));
    Ok(())
}

/// Fails unless the `containerSockets` world's hooks translated more than
/// `before` sockets and its programs masqueraded no flow: otherwise its
/// rows measured another path. Returns the translations so far.
fn check_socket_path(sockets: &HairpinWorld, before: u64) -> anyhow::Result<u64> {
    let counters = sockets.counters().ok_or_else(|| {
        anyhow::anyhow!("hairpin: cannot read the containerSockets world's counters")
    })?;
    let count = |reason: &str| counters[reason].as_u64().unwrap_or(0);
    let (translated, masq) = (count("sock_translated"), count("masq"));
    if translated <= before || masq > 0 {
        anyhow::bail!(
            "hairpin: the containerSockets world took the wrong path ({translated} socket translations, {before} before; {masq} masqueraded flows): {counters}"
        );
    }
    Ok(translated)
}

/// Every (route, family, test) of both worlds once for the warm-up time;
/// fails if one gets no answer.
fn warm_up_every_path(
    plan: &Plan,
    sides: &[HairpinWorld],
    cgroup: &mut ClientCgroup,
) -> anyhow::Result<()> {
    for side in sides {
        cgroup.enter(side.hooked.as_deref());
        for route in Route::BOTH {
            for family in Family::BOTH {
                for test in TESTS {
                    let what = format!(
                        "{}, hairpin {} ({})",
                        side.world.flavor.label(),
                        route.title(),
                        family.title()
                    );
                    warm_up(
                        plan,
                        &side.client(route),
                        test,
                        target(family, test),
                        &what,
                        &side.world,
                    )?;
                }
            }
        }
    }
    cgroup.enter(None);
    Ok(())
}

/// One run of `test` on one path in every world, cut into slices that
/// alternate between the worlds; with each run, the SYNs its serving pod's
/// TIME_WAITs refused meanwhile (see [`refused_syns`]; each world's pods
/// see only that world's traffic).
fn measure_interleaved(
    plan: &Plan,
    sides: &[HairpinWorld],
    route: Route,
    family: Family,
    test: Test,
    cgroup: &mut ClientCgroup,
) -> Vec<(RunResult, u64)> {
    let targets: Vec<(NsHandle, SocketAddr)> = sides
        .iter()
        .map(|side| (side.client(route), target(family, test)))
        .collect();
    let servers: Vec<NsHandle> = sides
        .iter()
        .map(|side| side.world.container.ns.handle())
        .collect();
    let before: Vec<u64> = servers.iter().map(|ns| ns.run(refused_syns)).collect();
    let cgroup = std::cell::RefCell::new(cgroup);
    let runs = load::run_interleaved(&targets, test, plan.duration, plan.slices, plan.cpu, |i| {
        cgroup.borrow_mut().enter(sides[i].hooked.as_deref());
    });
    cgroup.borrow_mut().enter(None);
    runs.into_iter()
        .zip(servers.iter().zip(before))
        .map(|(run, (ns, before))| (run, ns.run(refused_syns).saturating_sub(before)))
        .collect()
}

/// SYNs this thread's network namespace refused in TIME_WAIT so far
/// (`TcpExtPAWSTimewait`: timestamps older than the last ones the tuple
/// saw); 0 if the kernel does not count them.
fn refused_syns() -> u64 {
    let text = std::fs::read_to_string("/proc/thread-self/net/netstat").unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines
        .chunks(2)
        .filter(|pair| pair.len() == 2 && pair[0].starts_with("TcpExt:"))
        .find_map(|pair| {
            pair[0]
                .split_whitespace()
                .zip(pair[1].split_whitespace())
                .find(|(name, _)| *name == "PAWSTimewait")
                .and_then(|(_, value)| value.parse().ok())
        })
        .unwrap_or(0)
}

fn push(
    results: &mut Results,
    route: Route,
    family: Family,
    test: Test,
    flavor: Flavor,
    run: RunResult,
    refused_syns: u64,
) {
    match results
        .hairpin
        .iter_mut()
        .find(|c| c.route == route && c.family == family && c.test == test && c.flavor == flavor)
    {
        Some(cell) => {
            cell.reps.push(run);
            cell.refused_syns.push(refused_syns);
        }
        None => results.hairpin.push(HairpinCell {
            route,
            family,
            test,
            flavor,
            reps: vec![run],
            refused_syns: vec![refused_syns],
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_request_close_dials_the_close_first_service_of_each_family() {
        let v4 = target(Family::V4, Test::TcpCrr);
        assert_eq!(v4, SocketAddr::new(IpAddr::V4(NODE_IP4), 7004));
        let v6 = target(Family::V6, Test::TcpCrr);
        assert_eq!(v6, SocketAddr::new(IpAddr::V6(NODE_IP6), 7004));
        assert_eq!(target(Family::V6, Test::UdpRr).port(), PROBE_UDP_HOST_PORT);
        assert_eq!(target(Family::V4, Test::TcpRr).port(), PROBE_RR_HOST_PORT);
    }
}
