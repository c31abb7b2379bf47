//! `ebpf-portmap list`: every mapping, with its owner.

use std::path::PathBuf;

use anyhow::Context;
use portmap_user::{
    config::DEFAULT_PIN_ROOT,
    maps::Maps,
    pin::PinLayout,
    store::{KeyDisplay, addr_from_words, record_strings},
};
use serde_json::json;

#[derive(clap::Args)]
pub struct ListArgs {
    /// Pin root the plugin was configured with (`pinRoot`).
    #[arg(long, default_value = DEFAULT_PIN_ROOT)]
    pin_root: PathBuf,
    /// Machine-readable output.
    #[arg(long)]
    json: bool,
}

struct Row {
    host: String,
    container: String,
    container_id: String,
    ifname: String,
    network: String,
}

pub fn run(args: &ListArgs) -> anyhow::Result<()> {
    let layout = PinLayout::new(&args.pin_root);
    let maps = Maps::open(&layout).with_context(|| {
        format!(
            "no ebpf-portmap state under {} (no ADD has run yet?)",
            args.pin_root.display()
        )
    })?;
    let mut rows = Vec::new();
    for entry in maps.mappings.iter() {
        let (key, value) = entry.context("reading the mappings map")?;
        let owner = maps.owners.get(&value.owner_id, 0).ok();
        let (network, container_id, ifname) = owner
            .as_ref()
            .map(record_strings)
            .unwrap_or_else(|| ("?".into(), format!("{:016x}", value.owner_id), "?".into()));
        let container = match addr_from_words(key.family, &value.container_addr_be) {
            std::net::IpAddr::V4(a) => format!("{a}:{}", u16::from_be(value.container_port_be)),
            std::net::IpAddr::V6(a) => format!("[{a}]:{}", u16::from_be(value.container_port_be)),
        };
        rows.push((
            (
                key.host_port_be.swap_bytes(),
                key.proto,
                key.family,
                key.host_addr_be,
            ),
            Row {
                host: KeyDisplay(key).to_string(),
                container,
                container_id,
                ifname,
                network,
            },
        ));
    }
    rows.sort_by_key(|row| row.0);
    if args.json {
        let list: Vec<_> = rows
            .iter()
            .map(|(_, r)| {
                json!({"host": r.host, "container": r.container, "containerID": r.container_id,
                       "ifname": r.ifname, "network": r.network})
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&list)?);
        return Ok(());
    }
    println!(
        "{:<28} {:<30} {:<14} {:<8} NETWORK",
        "HOST", "CONTAINER", "OWNER", "IFNAME"
    );
    for (_, r) in &rows {
        let short: String = r.container_id.chars().take(12).collect();
        println!(
            "{:<28} {:<30} {:<14} {:<8} {}",
            r.host, r.container, short, r.ifname, r.network
        );
    }
    Ok(())
}
