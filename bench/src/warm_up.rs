//! The warm-up before a measured path: neighbours resolved and the first
//! flows through the path, so the first slice measures a path in use.

use std::net::SocketAddr;

use anyhow::bail;

use crate::load::{self, Test};
use crate::plan::Plan;
use crate::world::BenchWorld;

/// Runs `test` from `client` to `addr` for the warm-up time (neighbours
/// resolved, the first flows through the path); fails with `world`'s
/// diagnostics if nothing answers.
pub fn warm_up(
    plan: &Plan,
    client: &portmap_tests::netns::NsHandle,
    test: Test,
    addr: SocketAddr,
    what: &str,
    world: &BenchWorld,
) -> anyhow::Result<()> {
    let warm = load::run(client, test, addr, plan.warmup, plan.cpu);
    if warm.rate == 0.0 {
        bail!(
            "{what}: {} through {addr} gets no answer ({} errors)\n{}",
            test.title(),
            warm.errors,
            world.node.diagnostics()
        );
    }
    Ok(())
}
