//! `ebpf-portmap status`: is the dataplane on this node whole and healthy?

use std::process::ExitCode;

use portmap_common::{
    LAYOUT_VERSION,
    reason::{self, Kind},
};
use portmap_user::{
    logging::utc_timestamp,
    ops::inspect::{self, Status},
    ops::pin::PinLayout,
    ops::sizing::{self, InForce, Source},
};
use serde_json::{Value, json};

use crate::cli::{
    PinRootArg, installed, layout,
    output::{Colour, OutputArgs, Style, Table, print, print_json},
};

/// Show the state of the dataplane on this node; exit 1 if anything is
/// missing or degraded.
///
/// Reports the version of this binary and the kernel, how the programs are
/// attached (tcx or clsact) and their program IDs per interface and
/// direction, other attachments (cgroup hooks), every pinned map's fill
/// level against its capacity, and the dataplane's counters by reason since
/// the maps were created (translations, and why packets were skipped or
/// dropped). Then the problems: a missing map or program, an interface with
/// a direction not attached, a pinned attachment the kernel no longer runs,
/// an interface that should carry the programs and does not (added or
/// re-created since the last plugin run), a node address the socket hooks
/// do not know yet, a map 90% full, tracing left on by a dead `trace`.
#[derive(clap::Args)]
#[command(after_help = "Examples:
  ebpf-portmap status
  ebpf-portmap status -o json | jq '.interfaces'
  ebpf-portmap status >/dev/null || echo degraded

Exit status: 0 healthy, 1 missing or degraded (the problems are listed), 3 cannot inspect.")]
pub struct StatusArgs {
    #[command(flatten)]
    pin: PinRootArg,
}

/// The sizes in force, why, and the pinned maps' kernel memory, as JSON
/// (`status` and `version` both show them).
pub fn sizes_json(sizes: &InForce) -> Value {
    let recorded = sizes.recorded.as_ref();
    json!({
        "bytesMemlock": sizes.memory_bytes(),
        "mapsBytesMemlock": sizes.memory.iter().map(|(name, bytes)| (name.clone(), json!(bytes))).collect::<serde_json::Map<_, _>>(),
        "conntrack": {
            "open": sizes.conntrack,
            "other": sizes.conntrack_other,
            "new": sizes.conntrack_new,
            "closed": sizes.conntrack_closed,
            "source": recorded.and_then(|r| r.conntrack_source).map(source_name),
            "why": sizing::conntrack_reason(recorded),
        },
        "mappings": {
            "max": sizes.mappings,
            "source": recorded.and_then(|r| r.mappings_source).map(source_name),
            "why": sizing::mappings_reason(recorded),
        },
    })
}

fn source_name(source: Source) -> &'static str {
    match source {
        Source::Default => "formula",
        Source::Conflist => "conflist",
    }
}

/// The sizes in force, why, and the pinned maps' kernel memory, as lines.
pub fn sizes_text(sizes: &InForce) -> String {
    let recorded = sizes.recorded.as_ref();
    let mib = |bytes: u64| bytes as f64 / (1024.0 * 1024.0);
    format!(
        "BPF map memory: {:.1} MiB (bytes_memlock of the pinned maps)\n\
         conntrack: {} open TCP, {} other, {} new, {} closed entries ({})\n\
         mappings: {} at most ({})\n",
        mib(sizes.memory_bytes()),
        opt(sizes.conntrack),
        opt(sizes.conntrack_other),
        opt(sizes.conntrack_new),
        opt(sizes.conntrack_closed),
        sizing::conntrack_reason(recorded),
        opt(sizes.mappings),
        sizing::mappings_reason(recorded),
    )
}

pub fn status_json(status: &Status) -> Value {
    json!({
        "healthy": status.problems.is_empty(),
        "problems": status.problems,
        "notes": status.notes,
        "staleRoots": status.stale_roots,
        "orphanRecords": status.orphan_records.iter().map(|orphan| json!({
            "pinRoot": orphan.root,
            "records": orphan.records,
        })).collect::<Vec<_>>(),
        "hooksCgroup": status.hooks_cgroup,
        "firewalld": status.firewalld,
        "misspeltKeys": status.misspelt_keys.iter().map(|note| json!({
            "network": note.network,
            "key": note.key,
            "didYouMean": note.meant,
        })).collect::<Vec<_>>(),
        "version": env!("CARGO_PKG_VERSION"),
        "build": status.build,
        "kernel": status.kernel,
        "pinRoot": status.root,
        "layoutVersion": LAYOUT_VERSION,
        "installed": status.installed,
        "attachMode": status.mode.map(portmap_user::ops::features::AttachMode::as_str),
        "fastPath": status.fast_path.as_ref().map(|report| json!({
            "mode": report.mode.as_str(),
            "why": report.why,
        })),
        "translation": status.translation.as_ref().map(|report| json!({
            "ipv4": report.place(0),
            "ipv6": report.place(1),
            "why": report.why,
        })),
        "interfaces": status.tc.iter().map(|a| json!({
            "ifindex": a.ifindex,
            "interface": a.interface,
            "direction": a.direction.as_str(),
            "mode": a.mode.as_str(),
            "linkID": a.link_id,
            "programID": a.program_id,
            "attached": a.attached,
        })).collect::<Vec<_>>(),
        "bridgePorts": status.bridge_ports.iter().map(|a| json!({
            "ifindex": a.ifindex,
            "interface": a.interface,
            "mode": a.mode.as_str(),
            "linkID": a.link_id,
            "programID": a.program_id,
            "attached": a.attached,
        })).collect::<Vec<_>>(),
        "drift": json!({
            "unattachedInterfaces": status.drift.unattached.iter().map(|(name, index)| json!({
                "interface": name,
                "ifindex": index,
            })).collect::<Vec<_>>(),
            "unmatchedInterfaces": status.drift.unmatched,
            "unsyncedAddresses": status.drift.unsynced,
            "staleAddresses": status.drift.stale,
            "absentHostIPs": status.drift.absent_host_ips,
        }),
        "hostAddresses": json!({
            "answeredOn": status.drift.covered,
            "excluded": status.drift.vip_excluded.iter().map(|(addr, interface)| json!({
                "address": addr,
                "interface": interface,
                "why": "serviceVipDevice",
            })).collect::<Vec<_>>(),
        }),
        "splitAttachments": status.splits.iter().map(|split| json!({
            "at": split.at,
            "programID": split.program_id,
            "staleMaps": match &split.kind {
                portmap_user::ops::inspect::SplitKind::StaleMaps(maps) => maps.iter().map(|(name, id, pinned)| json!({
                    "map": name,
                    "id": id,
                    "pinnedID": pinned,
                })).collect::<Vec<_>>(),
                portmap_user::ops::inspect::SplitKind::Unpinned => Vec::new(),
            },
            "pinned": !matches!(split.kind, portmap_user::ops::inspect::SplitKind::Unpinned),
        })).collect::<Vec<_>>(),
        "changeUnfinished": status.change_unfinished,
        "otherLinks": status.other_links.iter().map(|l| json!({
            "pin": l.pin,
            "type": l.link_type,
            "linkID": l.link_id,
            "programID": l.program_id,
        })).collect::<Vec<_>>(),
        "programs": status.programs.iter().map(|p| json!({
            "name": p.name,
            "id": p.id,
            "build": p.build,
            "currentBuild": p.current,
            "loaded": p.loaded_at.map(utc_timestamp),
        })).collect::<Vec<_>>(),
        "maps": status.maps.iter().map(|m| json!({
            "name": m.name,
            "id": m.id,
            "type": m.map_type,
            "entries": m.entries,
            "maxEntries": m.max_entries,
            "fillPercent": m.percent(),
        })).collect::<Vec<_>>(),
        "evictions": status.evictions.map(|report| json!({
            "live": report.counts.live,
            "unreplied": report.counts.unreplied,
            "liveQuietSeconds": report.live_quiet_for.map(|quiet| quiet.as_secs()),
        })),
        "missingMaps": status.missing_maps,
        "sizes": sizes_json(&InForce::read(&status_layout(status))),
        "counters": status.stats.iter().map(|(name, value)| (name.to_string(), json!(value))).collect::<serde_json::Map<_, _>>(),
        "tracing": status.tracing.filter(|f| f.enabled != 0).map(|f| json!({
            "pid": f.tracer_pid,
            "port": (f.port_be != 0).then(|| u16::from_be(f.port_be)),
            "protocol": (f.proto != 0).then_some(f.proto),
        })),
    })
}

/// The pin layout `status` looked at.
fn status_layout(status: &Status) -> PinLayout {
    PinLayout::new(&status.root)
}

/// One line for the pods' bridge ports (one per pod: a count, not rows).
fn bridge_ports_line(ports: &[portmap_user::ops::inspect::TcAttachment]) -> String {
    let attached = ports.iter().filter(|a| a.attached).count();
    let gone = ports.iter().filter(|a| a.interface.is_none()).count();
    let detached = ports.len() - attached - gone;
    let mut line = format!(
        "ingress on {attached} pod bridge port(s) (hairpin flows are translated there, before the bridge's netfilter hooks)"
    );
    if gone > 0 {
        line.push_str(&format!(
            "; {gone} pin(s) of gone ports, removed by the next node-wide pass"
        ));
    }
    if detached > 0 {
        line.push_str(&format!("; {detached} port(s) not attached"));
    }
    line.push('\n');
    line
}

/// Which addresses a wildcard host port answers on, which of the node's it
/// leaves alone and why.
pub fn host_addresses_text(drift: &portmap_user::ops::inspect::NodeDrift) -> String {
    let list = |addrs: &mut dyn Iterator<Item = String>| addrs.collect::<Vec<_>>().join(", ");
    let mut out = String::new();
    if !drift.covered.is_empty() {
        out.push_str(&format!(
            "host ports answer on: {} (a hostIP among them, or a wildcard on all)\n",
            list(&mut drift.covered.iter().map(ToString::to_string))
        ));
    }
    if !drift.vip_excluded.is_empty() {
        out.push_str(&format!(
            "not on the node's Service VIPs: {} (serviceVipDevices; the kernel delivers them to the Services)\n",
            list(
                &mut drift
                    .vip_excluded
                    .iter()
                    .map(|(addr, interface)| format!("{addr} on {interface}"))
            )
        ));
    }
    out.push_str(
        "never on: broadcast or multicast destinations, addresses the node does not hold\n",
    );
    out
}

fn opt<T: ToString>(value: Option<T>) -> String {
    value.map_or_else(|| "-".into(), |v| v.to_string())
}

fn render(status: &Status, style: Style) -> String {
    let mut out = String::new();
    let section = |title: &str| format!("\n{}\n", style.paint(Colour::Bold, title));
    out.push_str(&format!(
        "ebpf-portmap {} (build {}), kernel {}\n",
        env!("CARGO_PKG_VERSION"),
        status.build,
        status.kernel
    ));
    out.push_str(&format!(
        "pin root: {} (layout v{LAYOUT_VERSION})\nattach mode: {}\n",
        status.root.display(),
        status.mode.map_or("none", |m| m.as_str())
    ));
    out.push_str(&match &status.fast_path {
        Some(report) => format!("fast path: {} ({})\n", report.mode.as_str(), report.why),
        None => "fast path: not set yet (the first ADD sets it)\n".to_owned(),
    });

    // The verdict and what to do first (as `cilium-dbg status` does), the
    // detail after.
    out.push_str(&verdict(status, style));
    if !status.installed {
        return out;
    }
    // Where new flows are translated: detail, after the verdict.
    if let Some(report) = &status.translation {
        out.push_str(&format!(
            "translation: IPv4 by {}, IPv6 by {} ({})\n",
            report.place(0),
            report.place(1),
            report.why
        ));
    }

    out.push_str(&section("Interfaces"));
    if status.tc.is_empty() && status.drift.unattached.is_empty() {
        out.push_str("none\n");
    } else {
        let mut table = Table::new(&["INTERFACE", "DIRECTION", "MODE", "LINK", "PROGRAM", "STATE"]);
        for a in &status.tc {
            let (state, colour) = match (&a.interface, a.attached) {
                (None, _) => ("interface gone", Colour::Yellow),
                (_, true) => ("attached", Colour::Green),
                (_, false) => ("not attached", Colour::Red),
            };
            table.row(vec![
                (
                    a.interface
                        .clone()
                        .unwrap_or_else(|| format!("if{}", a.ifindex)),
                    Colour::Plain,
                ),
                (a.direction.as_str().into(), Colour::Plain),
                (a.mode.as_str().into(), Colour::Plain),
                (opt(a.link_id), Colour::Plain),
                (opt(a.program_id), Colour::Plain),
                (state.into(), colour),
            ]);
        }
        // An interface that should carry the programs and has none is a
        // row too: it is where host ports get no traffic.
        for (name, _) in &status.drift.unattached {
            table.row(vec![
                (name.clone(), Colour::Plain),
                ("-".into(), Colour::Dim),
                ("-".into(), Colour::Dim),
                ("-".into(), Colour::Dim),
                ("-".into(), Colour::Dim),
                ("no programs".into(), Colour::Red),
            ]);
        }
        out.push_str(&table.render(style));
    }
    if !status.bridge_ports.is_empty() {
        out.push_str(&bridge_ports_line(&status.bridge_ports));
    }
    out.push_str(&host_addresses_text(&status.drift));
    out.push_str(&section("Cgroup and other attachments"));
    match &status.hooks_cgroup {
        Some(cgroup) => out.push_str(&format!(
            "socket hooks on cgroup {} (processes in it and below reach host ports at the socket)\n",
            cgroup.display()
        )),
        None => out.push_str("socket hooks: no run recorded their cgroup yet\n"),
    }
    if status.other_links.is_empty() {
        out.push_str("none\n");
    } else {
        let mut table = Table::new(&["PIN", "TYPE", "LINK", "PROGRAM"]);
        for l in &status.other_links {
            table.row(vec![
                (l.pin.clone(), Colour::Plain),
                (l.link_type.clone(), Colour::Plain),
                (opt(l.link_id), Colour::Plain),
                (opt(l.program_id), Colour::Plain),
            ]);
        }
        out.push_str(&table.render(style));
    }

    out.push_str(&section("Programs"));
    if status.programs.is_empty() {
        out.push_str("none\n");
    } else {
        let mut table = Table::new(&["PROGRAM", "ID", "BUILD", "LOADED"]);
        for p in &status.programs {
            let build = if p.current {
                format!("{} (this binary)", p.build)
            } else {
                p.build.clone()
            };
            table.row(vec![
                (p.name.clone(), Colour::Plain),
                (opt(p.id), Colour::Plain),
                (build, Colour::Plain),
                (opt(p.loaded_at.map(utc_timestamp)), Colour::Plain),
            ]);
        }
        out.push_str(&table.render(style));
    }

    out.push_str(&section("Maps"));
    if status.maps.is_empty() {
        out.push_str("none\n");
    } else {
        let mut table = Table::new(&["MAP", "TYPE", "ENTRIES", "MAX", "FILL"]);
        for m in &status.maps {
            let (fill, colour) = match m.percent() {
                Some(p) if p >= inspect::FILL_WARNING_PERCENT => (format!("{p:.1}%"), Colour::Red),
                Some(p) => (format!("{p:.1}%"), Colour::Plain),
                None => ("-".into(), Colour::Dim),
            };
            table.row(vec![
                (m.name.clone(), Colour::Plain),
                (m.map_type.clone(), Colour::Plain),
                (opt(m.entries), Colour::Plain),
                (m.max_entries.to_string(), Colour::Plain),
                (fill, colour),
            ]);
        }
        out.push_str(&table.render(style));
    }

    if let Some(report) = &status.evictions {
        let live = report.counts.live;
        out.push_str(&format!(
            "evicted since the tables were made: {} entries of live (assured) flows, {} of flows never assured (conntrack_new)\n",
            style.paint(if live > 0 { Colour::Red } else { Colour::Plain }, &live.to_string()),
            report.counts.unreplied
        ));
    }

    out.push_str(&section("Sizes and memory"));
    out.push_str(&sizes_text(&InForce::read(&status_layout(status))));

    out.push_str(&section("Counters since the maps were created"));
    // The counter name (also the metric's `reason` label) beside what
    // `trace` calls the same decision: one vocabulary, both spellings.
    let mut table = Table::new(&["REASON", "IN TRACE", "PACKETS"]);
    for (name, value) in &status.stats {
        let found = reason::by_name(name);
        let colour = match (found.map(|r| r.kind), *value) {
            (_, 0) => Colour::Dim,
            (Some(Kind::Problem), _) => Colour::Red,
            _ => Colour::Plain,
        };
        table.row(vec![
            ((*name).into(), colour),
            (found.map_or("-", |r| r.label).into(), colour),
            (value.to_string(), colour),
        ]);
    }
    out.push_str(&table.render(style));

    out.push_str(&section("Tracing"));
    match status.tracing.filter(|f| f.enabled != 0) {
        None => out.push_str("off\n"),
        Some(f) => out.push_str(&format!(
            "on (pid {}{})\n",
            f.tracer_pid,
            if f.port_be != 0 {
                format!(", port {}", u16::from_be(f.port_be))
            } else {
                String::new()
            }
        )),
    }

    out.push('\n');
    out.push_str(&if status.problems.is_empty() {
        format!("{}\n", style.paint(Colour::Green, "healthy"))
    } else {
        format!(
            "{} (the problems are listed at the top)\n",
            style.paint(
                Colour::Red,
                &format!("degraded: {}", count_problems(status.problems.len()))
            )
        )
    });
    out
}

fn count_problems(n: usize) -> String {
    if n == 1 {
        "1 problem".into()
    } else {
        format!("{n} problems")
    }
}

/// The summary `status` opens with: healthy or degraded, then each problem
/// and note.
fn verdict(status: &Status, style: Style) -> String {
    let mut out = String::new();
    if status.problems.is_empty() {
        out.push_str(&format!("{}\n", style.paint(Colour::Green, "healthy")));
    } else {
        out.push_str(&format!(
            "{}\n",
            style.paint(
                Colour::Red,
                &format!("degraded: {}", count_problems(status.problems.len()))
            )
        ));
    }
    for problem in &status.problems {
        out.push_str(&format!(
            "{} {problem}\n",
            style.paint(Colour::Red, "problem:")
        ));
    }
    for note in &status.notes {
        out.push_str(&format!(
            "{} {note}\n",
            style.paint(Colour::Yellow, "note:")
        ));
    }
    out
}

pub fn run(args: &StatusArgs, out: &OutputArgs) -> anyhow::Result<ExitCode> {
    // Only to tell "cannot look" (exit 3) from "not installed" (a problem).
    installed(&args.pin.pin_root)?;
    let status = inspect::status(&layout(&args.pin.pin_root)?);
    if out.json() {
        print_json(&status_json(&status));
    } else {
        print(&render(&status, out.style()));
    }
    Ok(if status.problems.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
