//! `ebpf-portmap list`: every mapping with its owner and traffic.

use std::path::PathBuf;

use anyhow::Context;
use portmap_user::{
    config::DEFAULT_PIN_ROOT,
    inspect::{self, MappingRow},
    logging::utc_timestamp,
    scope::{self, Access},
};
use serde_json::{Value, json};

use crate::cli::output::{Colour, Style, Table, age_of, human_bytes, print, short_id};

/// List every port mapping on the node, with its owner and traffic.
///
/// One row per host address, port, protocol and family: where it sends
/// traffic, the container that owns it (short ID, interface, network), its
/// pod (`namespace/name` from the runtime's CNI_ARGS, `nomad:namespace/job/group`
/// for a Nomad allocation, `-` when unknown), how
/// long ago the container was added, the packets and bytes translated in
/// each direction (IN: to the container, OUT: replies), and the live flows.
///
/// Counters are kept per CPU by the eBPF programs as they translate; a
/// mapping with packets IN but none OUT receives traffic that the container
/// does not answer. FLOWS counts the translated connections the dataplane
/// tracks: a closed TCP connection counts until it idles out.
#[derive(clap::Args)]
#[command(after_help = "Examples:
  ebpf-portmap list
  ebpf-portmap list --port 8080
  ebpf-portmap list --container 3f2a --json | jq '.[].activeFlows'")]
pub struct ListArgs {
    /// Pin root the plugin was configured with (`pinRoot`).
    #[arg(long, value_name = "DIR", default_value = DEFAULT_PIN_ROOT)]
    pin_root: PathBuf,
    /// Only mappings of this host port.
    #[arg(long, value_name = "PORT")]
    port: Option<u16>,
    /// Only mappings of containers whose ID starts with this.
    #[arg(long, value_name = "ID")]
    container: Option<String>,
    /// Only mappings of this network (the conflist's `name`).
    #[arg(long, value_name = "NAME")]
    network: Option<String>,
    /// Machine-readable output: a JSON array, one object per mapping.
    #[arg(long)]
    json: bool,
}

fn wanted(args: &ListArgs, row: &MappingRow) -> bool {
    let (network, container_id, _) = row.owner_strings();
    args.port.is_none_or(|port| row.host_port() == port)
        && args
            .container
            .as_deref()
            .is_none_or(|prefix| container_id.starts_with(prefix))
        && args.network.as_deref().is_none_or(|name| network == name)
}

pub fn row_json(row: &MappingRow) -> Value {
    let (network, container_id, ifname) = row.owner_strings();
    let created = row.created();
    let c = &row.counters;
    json!({
        "host": row.host(),
        "hostIP": row.host_ip().map(|ip| ip.to_string()),
        "hostPort": row.host_port(),
        "protocol": row.protocol(),
        "family": row.family(),
        "container": row.container(),
        "containerIP": row.container_ip().to_string(),
        "containerPort": row.container_port(),
        "containerID": container_id,
        "ifname": ifname,
        "network": network,
        // Kubernetes pod (CNI_ARGS K8S_POD_*) and Nomad allocation
        // (NOMAD_*) of the owner; null when the runtime did not say.
        "podNamespace": row.pod.pod_namespace,
        "podName": row.pod.pod_name,
        "nomadAllocID": row.pod.nomad_alloc_id,
        "nomadNamespace": row.pod.nomad_namespace,
        "nomadJob": row.pod.nomad_job,
        "nomadGroup": row.pod.nomad_group,
        "created": created.map(utc_timestamp),
        "ageSeconds": created.and_then(|t| t.elapsed().ok()).map(|d| d.as_secs()),
        "packetsIn": c.packets_in,
        "bytesIn": c.bytes_in,
        "packetsOut": c.packets_out,
        "bytesOut": c.bytes_out,
        "packets": c.packets_in + c.packets_out,
        "bytes": c.bytes_in + c.bytes_out,
        "activeFlows": row.active_flows,
    })
}

fn table(rows: &[&MappingRow]) -> Table {
    let mut table = Table::new(&[
        "HOST",
        "CONTAINER",
        "OWNER",
        "POD",
        "IFNAME",
        "NETWORK",
        "AGE",
        "PACKETS IN/OUT",
        "BYTES IN/OUT",
        "FLOWS",
    ]);
    for row in rows {
        let (network, container_id, ifname) = row.owner_strings();
        let c = &row.counters;
        // Traffic in and no answer out: the first thing to look at.
        let traffic = if c.packets_in > 0 && c.packets_out == 0 {
            Colour::Yellow
        } else {
            Colour::Plain
        };
        table.row(vec![
            (row.host(), Colour::Plain),
            (row.container(), Colour::Plain),
            (short_id(&container_id), Colour::Plain),
            (row.pod.label().unwrap_or_else(|| "-".into()), Colour::Plain),
            (ifname, Colour::Plain),
            (network, Colour::Plain),
            (age_of(row.created()), Colour::Plain),
            (format!("{}/{}", c.packets_in, c.packets_out), traffic),
            (
                format!("{}/{}", human_bytes(c.bytes_in), human_bytes(c.bytes_out)),
                traffic,
            ),
            (
                row.active_flows.to_string(),
                if row.active_flows > 0 {
                    Colour::Green
                } else {
                    Colour::Plain
                },
            ),
        ]);
    }
    table
}

pub fn run(args: &ListArgs) -> anyhow::Result<std::process::ExitCode> {
    let layout = scope::resolve(&args.pin_root, Access::Read)?;
    let rows = inspect::mapping_rows(&layout).context("cannot list the mappings")?;
    let rows: Vec<&MappingRow> = rows.iter().filter(|row| wanted(args, row)).collect();
    if args.json {
        let list: Vec<Value> = rows.iter().map(|row| row_json(row)).collect();
        print(&format!("{}\n", serde_json::to_string_pretty(&list)?));
        return Ok(std::process::ExitCode::SUCCESS);
    }
    let style = Style::detect();
    if rows.is_empty() && style.terminal {
        print("no port mappings\n");
        return Ok(std::process::ExitCode::SUCCESS);
    }
    print(&table(&rows).render(style));
    Ok(std::process::ExitCode::SUCCESS)
}
