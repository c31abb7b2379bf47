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
//! The two worlds are built for this section and removed at its end: the
//! TIME_WAIT sockets a connection loop leaves in a pod's namespace go with
//! it, before any later measurement walks the machine's TCP hash.

use std::net::{IpAddr, SocketAddr};

use portmap_tests::Container;
use portmap_tests::netns::NsHandle;
use portmap_tests::topology::{NODE_IP4, NODE_IP6};

use super::load::{self, RunResult, Test};
use super::results::{HairpinCell, Results};
use super::world::{
    BenchWorld, Flavor, HAIRPIN_CLOSE_FIRST_HOST_PORT, PROBE_RR_HOST_PORT, PROBE_UDP_HOST_PORT,
};
use super::{Plan, Progress, report, warm_up};

/// Whose hostPort a pod dials through the node's address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// The pod that serves the port.
    ToItself,
    /// Another pod on the same bridge.
    ToAnotherPod,
}

impl Route {
    pub const BOTH: [Route; 2] = [Route::ToItself, Route::ToAnotherPod];

    pub fn key(self) -> &'static str {
        match self {
            Route::ToItself => "itself",
            Route::ToAnotherPod => "other-pod",
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            Route::ToItself => "pod -> nodeIP:hostPort mapped to itself",
            Route::ToAnotherPod => "pod -> nodeIP:hostPort of another pod",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub const BOTH: [Family; 2] = [Family::V4, Family::V6];

    pub fn key(self) -> &'static str {
        match self {
            Family::V4 => "v4",
            Family::V6 => "v6",
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        }
    }

    fn node_ip(self) -> IpAddr {
        match self {
            Family::V4 => IpAddr::V4(NODE_IP4),
            Family::V6 => IpAddr::V6(NODE_IP6),
        }
    }
}

/// The tests of the hairpin rows (throughput has no hairpin target).
pub const TESTS: [Test; 3] = [Test::TcpRr, Test::TcpCrr, Test::UdpRr];

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
    SocketAddr::new(family.node_ip(), port)
}

/// The id of a hairpin target row, e.g. `hairpin-itself-v4-tcp_crr`.
pub fn row_id(route: Route, family: Family, test: Test) -> String {
    format!("hairpin-{}-{}-{}", route.key(), family.key(), test.key())
}

/// One plugin's hairpin world: the server pod (the world's container,
/// with the mappings) and another pod.
struct HairpinWorld {
    world: BenchWorld,
    other: Container,
}

impl HairpinWorld {
    fn new(flavor: Flavor, name: &str, plan: &Plan) -> anyhow::Result<HairpinWorld> {
        let world = BenchWorld::new(flavor, name, plan.cpu);
        let other = world.add_pod("other");
        world
            .port_add("hairpin", &BenchWorld::hairpin_mappings())
            .result
            .map_err(|e| anyhow::anyhow!("hairpin mappings ADD in {}: {e}", flavor.label()))?;
        Ok(HairpinWorld { world, other })
    }

    /// The namespace the client of `route` runs in.
    fn client(&self, route: Route) -> NsHandle {
        match route {
            Route::ToItself => self.world.container.ns.handle(),
            Route::ToAnotherPod => self.other.ns.handle(),
        }
    }
}

/// Builds the worlds (ebpf-portmap, iptables portmap and, where it can
/// run, nftables portmap), warms every path up, then measures each
/// (route, family, test) with the plugins interleaved, `plan.reps` times.
pub fn measure(plan: &Plan, progress: &Progress, results: &mut Results) -> anyhow::Result<()> {
    let mut sides = vec![
        HairpinWorld::new(Flavor::Ours, "bench-ebpf-hairpin", plan)?,
        HairpinWorld::new(Flavor::Upstream, "bench-iptables-hairpin", plan)?,
    ];
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
    warm_up_every_path(plan, &sides)?;
    for rep in 0..plan.reps {
        let mut line = Vec::new();
        for family in Family::BOTH {
            for route in Route::BOTH {
                for test in TESTS {
                    progress.check()?;
                    let runs = measure_interleaved(plan, &sides, route, family, test);
                    line.push(format!(
                        "{} {} {} {}",
                        route.key(),
                        family.key(),
                        test.key(),
                        runs.iter()
                            .map(report::short_measurement)
                            .collect::<Vec<_>>()
                            .join("/")
                    ));
                    for (side, run) in sides.iter().zip(runs) {
                        push(results, route, family, test, side.world.flavor, run);
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
    Ok(())
}

/// Every (route, family, test) of both worlds once for the warm-up time;
/// fails if one gets no answer.
fn warm_up_every_path(plan: &Plan, sides: &[HairpinWorld]) -> anyhow::Result<()> {
    for side in sides {
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
    Ok(())
}

/// One run of `test` on one path in every world, cut into slices that
/// alternate between the worlds.
fn measure_interleaved(
    plan: &Plan,
    sides: &[HairpinWorld],
    route: Route,
    family: Family,
    test: Test,
) -> Vec<RunResult> {
    let targets: Vec<(NsHandle, SocketAddr)> = sides
        .iter()
        .map(|side| (side.client(route), target(family, test)))
        .collect();
    load::run_interleaved(&targets, test, plan.duration, plan.slices, plan.cpu, |_| {})
}

fn push(
    results: &mut Results,
    route: Route,
    family: Family,
    test: Test,
    flavor: Flavor,
    run: RunResult,
) {
    match results
        .hairpin
        .iter_mut()
        .find(|c| c.route == route && c.family == family && c.test == test && c.flavor == flavor)
    {
        Some(cell) => cell.reps.push(run),
        None => results.hairpin.push(HairpinCell {
            route,
            family,
            test,
            flavor,
            reps: vec![run],
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_ids_name_route_family_and_test() {
        assert_eq!(
            row_id(Route::ToItself, Family::V4, Test::TcpCrr),
            "hairpin-itself-v4-tcp_crr"
        );
        assert_eq!(
            row_id(Route::ToAnotherPod, Family::V6, Test::UdpRr),
            "hairpin-other-pod-v6-udp_rr"
        );
    }

    #[test]
    fn row_ids_are_unique() {
        let mut ids: Vec<String> = Route::BOTH
            .iter()
            .flat_map(|&r| {
                Family::BOTH
                    .iter()
                    .flat_map(move |&f| TESTS.iter().map(move |&t| row_id(r, f, t)))
            })
            .collect();
        let all = ids.len();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), all, "two hairpin rows share an id: {ids:?}");
    }

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
