//! `ebpf-portmap migrate`: upstream `portmap`'s leftovers of containers
//! that no longer exist, reported and, on request, removed.

use std::{path::PathBuf, process::ExitCode};

use portmap_user::{
    cni::error::with_sources,
    ops::migrate::{self, DEFAULT_RESULTS_DIR, Leftover, Verdict},
    ops::upstream::{Mapping, Removed},
};
use serde_json::{Value, json};

use crate::cli::{
    exit,
    output::{Colour, OutputArgs, Table, print, print_json, short_id},
};

/// Report (and with --remove, remove) upstream portmap's rules of
/// containers that no longer exist.
///
/// A node switched from upstream `portmap` keeps its iptables chains or
/// nftables table for every pod it set up; each pod's DEL through
/// ebpf-portmap removes them, but a pod whose DEL never comes (the runtime
/// lost it, the node rebooted, the switch back and forth dropped it) keeps
/// them for good. This verb finds those, in the network namespace it runs
/// in (the node's).
///
/// A container is gone when the runtime's CNI result cache (libcni's
/// `results` directory, --results-dir) has no entry naming it (iptables:
/// its network and container ID, as upstream's comment names them, cut
/// past 255 bytes; nftables: its container ID, on any network), or when
/// every entry naming it
/// records a network namespace that no longer exists. An entry without a
/// namespace (libcni before 1.1), or with one that exists, keeps it: a
/// live container's rules are never removed. Rules whose chain no jump
/// names any more belong to no container and are only reported.
///
/// With --remove, the rules of gone containers are removed as their DEL
/// would remove them, and upstream's shared chains (its table) once no
/// mapping is left; a second run finds nothing. Exit 1 when gone
/// containers' rules are left (without --remove) or could not be removed.
#[derive(clap::Args)]
#[command(after_help = "Examples:
  ebpf-portmap migrate                     what upstream still maps, and for whom
  ebpf-portmap migrate --remove            remove the rules of containers that are gone
  ebpf-portmap migrate --results-dir /var/lib/cni/results -o json")]
pub struct MigrateArgs {
    /// The runtime's CNI result cache (libcni's `<cacheDir>/results`).
    #[arg(long, value_name = "DIR", default_value = DEFAULT_RESULTS_DIR)]
    results_dir: PathBuf,
    /// Remove the rules of containers judged gone.
    #[arg(long)]
    remove: bool,
}

fn verdict_text(verdict: &Verdict) -> (&'static str, String) {
    match verdict {
        Verdict::Live(why) => ("live", why.clone()),
        Verdict::Gone(why) => ("gone", why.clone()),
        Verdict::Unowned => (
            "unowned",
            "no jump names its chain: no container to ask about, left alone".into(),
        ),
    }
}

fn leftover_json(leftover: &Leftover) -> Value {
    let (state, why) = verdict_text(&leftover.verdict);
    json!({
        "containerID": leftover.container_id,
        "network": leftover.network,
        "state": state,
        "evidence": why,
        "mappings": leftover.mappings.iter().map(|m| json!({
            "upstream": m.source.backend.to_string(),
            "host": m.host(),
            "containerIP": m.port.container_addr.to_string(),
            "containerPort": m.port.container_port,
        })).collect::<Vec<_>>(),
    })
}

fn removed_json(removed: &Removed) -> Value {
    json!({
        "upstream": removed.source.backend.to_string(),
        "family": removed.source.family.to_string(),
        "containers": removed.containers,
        "sharedRemoved": removed.shared,
    })
}

pub fn run(args: &MigrateArgs, out: &OutputArgs) -> anyhow::Result<ExitCode> {
    let survey = migrate::survey(&args.results_dir)?;
    let mut problems: Vec<String> = survey.errors.iter().map(|e| with_sources(e)).collect();
    let gone = &survey.gone;
    let report = if args.remove {
        migrate::remove_gone(&survey)
    } else {
        Default::default()
    };
    let removed = &report.removed;
    problems.extend(report.errors.iter().map(|e| with_sources(e)));
    let left_gone = !args.remove && !gone.is_empty();

    if out.json() {
        print_json(&json!({
            "upstreamState": !survey.sources.is_empty(),
            "leftovers": survey.leftovers.iter().map(leftover_json).collect::<Vec<_>>(),
            "removed": removed.iter().map(removed_json).collect::<Vec<_>>(),
            "errors": problems,
        }));
    } else {
        let mut text = String::new();
        if survey.sources.is_empty() {
            text.push_str("upstream portmap has no state in this network namespace\n");
        } else if survey.leftovers.is_empty() {
            text.push_str("upstream portmap maps no port here\n");
        } else {
            let mut table = Table::new(&["OWNER", "NETWORK", "STATE", "PORTS", "EVIDENCE"]);
            for leftover in &survey.leftovers {
                let (state, why) = verdict_text(&leftover.verdict);
                let colour = match leftover.verdict {
                    Verdict::Live(_) => Colour::Green,
                    _ => Colour::Yellow,
                };
                let ports: Vec<String> = leftover.mappings.iter().map(Mapping::host).collect();
                table.row(vec![
                    (
                        leftover
                            .container_id
                            .as_deref()
                            .map_or_else(|| "-".into(), short_id),
                        Colour::Plain,
                    ),
                    (
                        leftover.network.clone().unwrap_or_else(|| "-".into()),
                        Colour::Plain,
                    ),
                    (state.to_owned(), colour),
                    (ports.join(" "), Colour::Plain),
                    (why, Colour::Plain),
                ]);
            }
            text.push_str(&table.render(out.style()));
        }
        for done in removed {
            let containers: Vec<&str> = done.containers.iter().map(String::as_str).collect();
            text.push_str(&format!(
                "removed upstream portmap's {} {} rules of {}{}\n",
                done.source.backend,
                done.source.family,
                if containers.is_empty() {
                    "no container".to_owned()
                } else {
                    containers.join(", ")
                },
                if done.shared {
                    " and its shared chains (no mapping left)"
                } else {
                    ""
                }
            ));
        }
        if left_gone {
            text.push_str(&format!(
                "{} gone container(s) still mapped by upstream: `ebpf-portmap migrate --remove` removes them\n",
                gone.len()
            ));
        }
        print(&text);
    }
    for problem in &problems {
        eprintln!("ebpf-portmap: {problem}");
    }
    Ok(if left_gone || !problems.is_empty() {
        exit::code(exit::PROBLEM)
    } else {
        ExitCode::SUCCESS
    })
}
