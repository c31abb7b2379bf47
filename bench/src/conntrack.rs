//! The memory section's full conntrack table: flows from many client
//! addresses until the table is full, then the maps' memory.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Instant;

use anyhow::bail;
use portmap_tests::PortMapping;
use portmap_tests::topology::{EXT_IP4, NODE_IP4};

use crate::invoke::Timed;
use crate::load;
use crate::memory;
use crate::progress::Progress;
use crate::results::{MemoryRow, Results, size_label};
use crate::scale::maps_dir;
use crate::world::{FILL_CONTAINER_PORT, PROBE_FILL_HOST_PORT, Worlds, world};

/// Extra client addresses for the conntrack fill: 64 511 source ports each.
const FILL_SOURCES: [Ipv4Addr; 3] = [
    Ipv4Addr::new(198, 18, 0, 21),
    Ipv4Addr::new(198, 18, 0, 22),
    Ipv4Addr::new(198, 18, 0, 23),
];

pub fn conntrack_fill(
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
