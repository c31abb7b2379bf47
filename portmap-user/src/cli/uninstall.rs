//! `ebpf-portmap uninstall`: takes the dataplane off the node.

use std::process::ExitCode;

use anyhow::Context;
use portmap_user::{ops::stale, ops::uninstall};
use serde_json::json;

use crate::cli::{
    PinRootArg, installed,
    output::{OutputArgs, print, print_json},
};

/// Detach the programs and remove every pin, leaving the node as before the
/// first ADD.
///
/// Detaches every tc attachment (tcx links, clsact filters) and other link
/// the plugin made, unpins its programs and maps and removes the pin
/// directories. Refuses while containers still have port mappings, unless
/// --force, and while the node agent runs for this pin root (it would
/// re-create everything within a second), unless --stop-agent. The next
/// ADD installs everything again.
///
/// With --stale, leaves this node alone and removes instead the state of
/// every node on this machine whose network namespace is gone (the pin
/// roots `status` lists as stale): their pins, their socket hooks on the
/// shared cgroup, their records; and the records in /run/ebpf-portmap of
/// pin roots removed without `uninstall` (`status` lists them too). Plugin
/// runs and the agent do the same on their own; this does it now.
#[derive(clap::Args)]
#[command(after_help = "Examples:
  ebpf-portmap uninstall
  ebpf-portmap uninstall --pin-root /sys/fs/bpf/ebpf-portmap --force
  ebpf-portmap uninstall --stale")]
pub struct UninstallArgs {
    #[command(flatten)]
    pin: PinRootArg,
    /// Uninstall even though containers still have mappings (their host
    /// ports stop working at once).
    #[arg(long, conflicts_with = "stale")]
    force: bool,
    /// Remove the state of nodes whose network namespace is gone, not this
    /// node's.
    #[arg(long)]
    stale: bool,
    /// Stop the node agent that keeps this dataplane (SIGTERM, waiting for
    /// it to exit) instead of refusing. A supervisor (systemd with
    /// Restart=, a DaemonSet) starts it again: stop it there instead.
    #[arg(long, conflicts_with = "stale")]
    stop_agent: bool,
}

fn remove_stale(root: &std::path::Path, out: &OutputArgs) -> ExitCode {
    use portmap_user::ops::{pin::PinLayout, scope};
    let ours = scope::resolve(root, scope::Access::Read).unwrap_or_else(|_| PinLayout::new(root));
    let mut removed = Vec::new();
    let mut failures = Vec::new();
    for layout in stale::find(&ours) {
        if let Some(removal) = stale::remove(&layout) {
            removed.push(layout.root().display().to_string());
            failures.extend(removal.failures);
        }
    }
    // Records of roots removed without `uninstall` (never ours).
    let mut records = Vec::new();
    for orphan in stale::orphan_records() {
        if orphan.root == ours.root() {
            continue;
        }
        if let Some(removal) = stale::remove_orphan(&orphan) {
            records.push(orphan.root.display().to_string());
            failures.extend(removal.failures);
        }
    }
    if out.json() {
        print_json(
            &json!({"removedRoots": removed, "removedRecordsOf": records, "failures": failures}),
        );
    } else if removed.is_empty() && records.is_empty() && failures.is_empty() {
        print("no state of a gone node on this machine\n");
    } else {
        for root in &removed {
            print(&format!(
                "removed {root}: its node's network namespace is gone (its socket hooks are detached)\n"
            ));
        }
        for root in &records {
            print(&format!(
                "removed the records of {root} in /run/ebpf-portmap: that pin root no longer exists\n"
            ));
        }
        for failure in &failures {
            eprintln!("ebpf-portmap: {failure}");
        }
    }
    if failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

pub fn run(args: &UninstallArgs, out: &OutputArgs) -> anyhow::Result<ExitCode> {
    let root = &args.pin.pin_root;
    if args.stale {
        return Ok(remove_stale(root, out));
    }
    let Some(layout) = installed(root)? else {
        if out.json() {
            print_json(
                &json!({"installed": false, "pinRoot": root, "detached": [], "removed": 0, "failures": []}),
            );
        } else {
            print(&format!("nothing installed under {}\n", root.display()));
        }
        return Ok(ExitCode::SUCCESS);
    };
    // A running agent re-creates everything within a second: refused, or
    // stopped with --stop-agent, before anything is removed.
    let stopped =
        uninstall::stop_agent_first(&layout, args.stop_agent).context("cannot uninstall")?;
    if let Some(pid) = stopped
        && !out.json()
    {
        print(&format!("stopped the node agent (pid {pid})\n"));
    }
    let report = uninstall::uninstall(&layout, args.force).context("cannot uninstall")?;
    let failures: Vec<String> = report.failures.iter().map(ToString::to_string).collect();
    if out.json() {
        let detached: Vec<String> = report.detached.iter().map(ToString::to_string).collect();
        print_json(&json!({
            "installed": true,
            "pinRoot": root,
            "detached": detached,
            "removed": report.removed.len(),
            "failures": failures,
        }));
    } else {
        for what in &report.detached {
            print(&format!("detached {what}\n"));
        }
        print(&format!(
            "removed {} pin(s) and directories\n",
            report.removed.len()
        ));
        for failure in &failures {
            eprintln!("ebpf-portmap: {failure}");
        }
    }
    Ok(if failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
