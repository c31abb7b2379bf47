//! `ebpf-portmap list`: every mapping with its owner and traffic.

use std::{process::ExitCode, time::Duration};

use anyhow::Context;
use portmap_user::{
    logging::utc_timestamp,
    model::Liveness,
    ops::inspect::{self, MappingRow},
    ops::upstream,
};
use serde_json::{Value, json};

use crate::cli::{
    PinRootArg, installed,
    output::{Colour, OutputArgs, Style, Table, age_of, human_bytes, print, short_id},
};

/// List every port mapping on the node, with its owner and traffic.
///
/// One row per host address, port, protocol and family: where it sends
/// traffic, the container that owns it (short ID, interface, network), its
/// pod (`namespace/name` from the runtime's CNI_ARGS, `nomad:namespace/job/group`
/// for a Nomad allocation, `-` when unknown), how
/// long ago the container was added, the packets and bytes translated in
/// each direction (IN: to the container, OUT: replies), the connections of
/// node processes the socket hooks translated (SOCK CONNECT/SENDMSG), and
/// the live flows.
///
/// Counters are kept per CPU by the eBPF programs as they translate; a
/// mapping with packets IN but none OUT receives traffic that the container
/// does not answer. A node process (in the hooked cgroup, the node's own
/// network namespace) dialling node-IP:hostPort or localhost is pointed at
/// the container in connect() or sendmsg(): its packets go straight to the
/// container, cross no translating tc hook, and count under SOCK only (one
/// per connect(), one per unconnected sendmsg()), not under PACKETS. FLOWS counts the translated connections the dataplane
/// tracks: a closed TCP connection counts until it idles out.
#[derive(clap::Args)]
#[command(after_help = "Examples:
  ebpf-portmap list
  ebpf-portmap list --port 8080
  ebpf-portmap list -o wide
  ebpf-portmap list --container 3f2a -o json | jq '.[].activeFlows'
  ebpf-portmap list --watch 1 --port 8080       counters refreshed every second

On a node where nothing is installed the list is empty (`[]` in JSON), exit 0.
Mappings that upstream `portmap` still holds on this node (its iptables or
nftables rules, from before a switch to ebpf-portmap) follow in a section
of their own (in JSON: entries with `upstream` naming its backend).")]
pub struct ListArgs {
    #[command(flatten)]
    pin: PinRootArg,
    /// Only mappings of this host port.
    #[arg(long, value_name = "PORT")]
    port: Option<u16>,
    /// Only mappings of containers whose ID starts with this.
    #[arg(long, value_name = "ID")]
    container: Option<String>,
    /// Only mappings of this network (the conflist's `name`).
    #[arg(long, value_name = "NAME")]
    network: Option<String>,
    /// Show the list again every SECONDS (default 2): redrawn in place on a
    /// terminal, one JSON document per line otherwise. Ctrl-C stops.
    #[arg(long, value_name = "SECONDS", num_args = 0..=1, default_missing_value = "2")]
    watch: Option<u64>,
    /// With --watch: stop after this many refreshes.
    #[arg(long, value_name = "N", requires = "watch")]
    count: Option<u64>,
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
        "podUID": row.pod.pod_uid,
        // The container's network namespace as ADD recorded it, and
        // whether it is still there: "alive", "gone" (GC removes the
        // mappings after its grace period) or "unknown" (nothing proves
        // it either way; `containerNote` says why).
        "netns": row.sandbox.as_ref().and_then(|s| s.netns.as_ref()).map(|p| p.display().to_string()),
        "containerState": match &row.liveness {
            Liveness::Alive => "alive",
            Liveness::Gone => "gone",
            Liveness::Unknown(_) => "unknown",
        },
        "containerNote": match &row.liveness {
            Liveness::Unknown(why) => Some(why.clone()),
            _ => row.gone_marker(),
        },
        "containerGoneSince": row
            .sandbox
            .as_ref()
            .and_then(|s| s.gone_since)
            .filter(|_| row.liveness == Liveness::Gone)
            .map(|since| utc_timestamp(std::time::UNIX_EPOCH + Duration::from_secs(since))),
        "created": created.map(utc_timestamp),
        "ageSeconds": created.and_then(|t| t.elapsed().ok()).map(|d| d.as_secs()),
        "packetsIn": c.packets_in,
        "bytesIn": c.bytes_in,
        "packetsOut": c.packets_out,
        "bytesOut": c.bytes_out,
        "packets": c.packets_in + c.packets_out,
        "bytes": c.bytes_in + c.bytes_out,
        // Node processes' connect() and sendmsg() the socket hooks pointed
        // at the container (their packets are not in `packets`).
        "sockConnects": row.sock.connects,
        "sockSendmsgs": row.sock.sendmsgs,
        "sockTranslations": row.sock.connects + row.sock.sendmsgs,
        "activeFlows": row.active_flows,
    })
}

fn wanted_upstream(args: &ListArgs, mapping: &upstream::Mapping) -> bool {
    args.port.is_none_or(|port| mapping.port.host_port == port)
        && args.container.as_deref().is_none_or(|prefix| {
            mapping
                .container_id
                .as_deref()
                .is_some_and(|id| id.starts_with(prefix))
        })
        && args
            .network
            .as_deref()
            .is_none_or(|name| mapping.network.as_deref() == Some(name))
}

/// What upstream `portmap` still maps here; nothing (and no process run)
/// on a node without its state. What cannot be read is said on stderr.
fn upstream_rows(args: &ListArgs) -> Vec<upstream::Mapping> {
    let sources = upstream::sources();
    if sources.is_empty() {
        return Vec::new();
    }
    let (mut mappings, errors) = upstream::mappings(&sources);
    for error in errors {
        eprintln!(
            "upstream portmap's mappings not read: {}",
            portmap_user::cni::error::with_sources(&error)
        );
    }
    mappings.retain(|m| wanted_upstream(args, m));
    mappings
}

fn upstream_json(mapping: &upstream::Mapping) -> Value {
    json!({
        "upstream": mapping.source.backend.to_string(),
        "host": mapping.host(),
        "hostIP": mapping.port.host_addr.map(|ip| ip.to_string()),
        "hostPort": mapping.port.host_port,
        "protocol": mapping.port.protocol.as_str(),
        "family": match mapping.source.family {
            upstream::Family::V4 => "ipv4",
            upstream::Family::V6 => "ipv6",
        },
        "containerIP": mapping.port.container_addr.to_string(),
        "containerPort": mapping.port.container_port,
        "containerID": mapping.container_id,
        "network": mapping.network,
    })
}

fn upstream_table(mappings: &[upstream::Mapping]) -> Table {
    let mut table = Table::new(&["HOST", "CONTAINER", "OWNER", "NETWORK", "BACKEND"]);
    for m in mappings {
        let container = match m.port.container_addr {
            std::net::IpAddr::V4(a) => format!("{a}:{}", m.port.container_port),
            std::net::IpAddr::V6(a) => format!("[{a}]:{}", m.port.container_port),
        };
        table.row(vec![
            (m.host(), Colour::Plain),
            (container, Colour::Plain),
            (
                m.container_id
                    .as_deref()
                    .map_or_else(|| "-".into(), short_id),
                Colour::Plain,
            ),
            (
                m.network.clone().unwrap_or_else(|| "-".into()),
                Colour::Plain,
            ),
            (m.source.backend.to_string(), Colour::Plain),
        ]);
    }
    table
}

fn table(rows: &[&MappingRow], wide: bool) -> Table {
    let mut header = vec![
        "HOST",
        "CONTAINER",
        "OWNER",
        "POD",
        "IFNAME",
        "NETWORK",
        "AGE",
        "PACKETS IN/OUT",
        "SOCK CONNECT/SENDMSG",
        "BYTES IN/OUT",
        "FLOWS",
    ];
    if wide {
        header.extend(["CONTAINER ID", "CREATED", "POD UID"]);
    }
    let mut table = Table::new(&header);
    for row in rows {
        let (network, container_id, ifname) = row.owner_strings();
        let c = &row.counters;
        // Traffic in and no answer out: the first thing to look at.
        let traffic = if c.packets_in > 0 && c.packets_out == 0 {
            Colour::Yellow
        } else {
            Colour::Plain
        };
        let mut cells = vec![
            (row.host(), Colour::Plain),
            (row.container(), Colour::Plain),
            (short_id(&container_id), Colour::Plain),
            (row.pod.label().unwrap_or_else(|| "-".into()), Colour::Plain),
            (ifname, Colour::Plain),
            (network, Colour::Plain),
            (age_of(row.created()), Colour::Plain),
            (format!("{}/{}", c.packets_in, c.packets_out), traffic),
            (
                format!("{}/{}", row.sock.connects, row.sock.sendmsgs),
                Colour::Plain,
            ),
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
        ];
        if wide {
            cells.push((container_id.clone(), Colour::Plain));
            cells.push((
                row.created().map_or_else(|| "-".into(), utc_timestamp),
                Colour::Plain,
            ));
            cells.push((
                row.pod.pod_uid.clone().unwrap_or_else(|| "-".into()),
                Colour::Plain,
            ));
        }
        table.row(cells);
    }
    table
}

/// The rows asked for; none when nothing is installed.
fn rows(args: &ListArgs) -> anyhow::Result<Vec<MappingRow>> {
    let Some(layout) = installed(&args.pin.pin_root)? else {
        return Ok(Vec::new());
    };
    let mut rows = inspect::mapping_rows(&layout).context("cannot list the mappings")?;
    rows.retain(|row| wanted(args, row));
    Ok(rows)
}

fn render(args: &ListArgs, out: &OutputArgs, rows: &[MappingRow], style: Style) -> String {
    let rows: Vec<&MappingRow> = rows.iter().collect();
    let upstream = upstream_rows(args);
    if out.json() {
        let mut list: Vec<Value> = rows.iter().map(|row| row_json(row)).collect();
        list.extend(upstream.iter().map(upstream_json));
        // One document per line while watching, so a reader can split them.
        let text = if args.watch.is_some() {
            serde_json::to_string(&list)
        } else {
            serde_json::to_string_pretty(&list)
        };
        return format!("{}\n", text.expect("JSON serialises"));
    }
    let mut text = if rows.is_empty() && style.terminal {
        "no port mappings\n".into()
    } else {
        table(&rows, out.wide()).render(style)
    };
    // Containers that are gone, once each: their mappings send traffic
    // nowhere until their DEL, or GC after its grace period, removes them.
    let mut gone: Vec<(String, String)> = Vec::new();
    for row in &rows {
        if let Some(marker) = row.gone_marker() {
            let (_, container_id, _) = row.owner_strings();
            let pod = match (row.pod.label(), &row.pod.pod_uid) {
                (Some(label), Some(uid)) => format!(", pod {label} (UID {uid})"),
                (Some(label), None) => format!(", pod {label}"),
                (None, Some(uid)) => format!(", pod UID {uid}"),
                (None, None) => String::new(),
            };
            let line = format!("container {}{pod}: {marker}", short_id(&container_id));
            if !gone.iter().any(|(id, _)| *id == container_id) {
                gone.push((container_id, line));
            }
        }
    }
    if !gone.is_empty() {
        text.push('\n');
        for (_, line) in gone {
            text.push_str(&format!(
                "{line}; its mappings go when GC (the agent, `ebpf-portmap gc --gone`) finds it gone past the grace period\n"
            ));
        }
    }
    // Where the wildcard rows answer: the node's addresses less its
    // Service VIPs, as the last plugin run recorded them.
    if rows.iter().any(|row| row.key.host_addr_be == [0; 4])
        && let Ok(Some(layout)) = installed(&args.pin.pin_root)
    {
        text.push('\n');
        text.push_str(&crate::cli::status::host_addresses_text(
            &inspect::node_drift(&layout, &[]),
        ));
    }
    if !upstream.is_empty() {
        text.push_str(
            "\nstill mapped by upstream portmap (its DEL through ebpf-portmap removes them):\n",
        );
        text.push_str(&upstream_table(&upstream).render(style));
    }
    text
}

pub fn run(args: &ListArgs, out: &OutputArgs) -> anyhow::Result<ExitCode> {
    let style = out.style();
    let Some(interval) = args.watch else {
        print(&render(args, out, &rows(args)?, style));
        return Ok(ExitCode::SUCCESS);
    };
    // Into a pipe or a file a redrawn table makes no sense: JSON lines.
    let json_lines = out.json() || !style.terminal;
    let out = if json_lines && !out.json() {
        &OutputArgs::json_only()
    } else {
        out
    };
    let mut refreshes = 0u64;
    loop {
        let text = render(args, out, &rows(args)?, style);
        if json_lines {
            print(&text);
        } else {
            // Home, clear the screen, then the table: redrawn in place.
            print(&format!("\x1b[H\x1b[2J{text}"));
        }
        refreshes += 1;
        if args.count.is_some_and(|count| refreshes >= count) {
            return Ok(ExitCode::SUCCESS);
        }
        std::thread::sleep(Duration::from_secs(interval.max(1)));
    }
}
